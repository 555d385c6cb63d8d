"""Every x86 tier this machine can run gives the golden model's results bit for bit.

The kernels choose their instructions when Numba compiles them for a target CPU (AVX-512 VNNI's
``vpdpbusd``, AVX-512BW's or AVX2's ``pmaddubsw`` / ``pmaddwd``, 512- or 256-bit transposes and
register blocking), so the tiers below the host's are exercised by compiling for an older CPU
in a subprocess (``NUMBA_CPU_NAME``, with ``NUMBA_CPU_FEATURES`` empty: that CPU's own
features) and comparing every result of tests/model/isa_probe.py, byte for byte, with this
process's (the host's tier). A tier the
host cannot execute is skipped, naming it. Each target compiles once (about 15 s), then Numba's
cache keeps it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from llvmlite import binding as llvm

from . import isa_probe

ROOT = Path(__file__).resolve().parents[2]

#: Target CPU -> (tier, host features it needs to run).
TARGETS = {
    "haswell": ("AVX2", {"avx2", "fma", "bmi2"}),
    "skylake-avx512": ("AVX-512 without VNNI", {"avx512f", "avx512bw", "avx512dq", "avx512vl"}),
}


@pytest.fixture(scope="module")
def host_results():
    return isa_probe.results()


@pytest.mark.parametrize("cpu", sorted(TARGETS))
def test_tier_matches_host_bit_for_bit(cpu, host_results, tmp_path):
    tier, needs = TARGETS[cpu]
    host = {name for name, on in llvm.get_host_cpu_features().items() if on}
    if not needs <= host:
        pytest.skip(f"this CPU cannot run {tier} code (lacks {sorted(needs - host)})")
    out = tmp_path / f"{cpu}.npz"
    env = dict(os.environ, NUMBA_CPU_NAME=cpu, NUMBA_CPU_FEATURES="")
    run = subprocess.run([sys.executable, "-m", "tests.model.isa_probe", str(out)], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    got = np.load(out)
    assert set(got.files) == set(host_results)
    differ = [name for name, want in host_results.items()
              if got[name].shape != want.shape
              or got[name].tobytes() != np.ascontiguousarray(want).tobytes()]
    assert not differ, f"{tier} ({cpu}) differs from the host in {differ}"


def test_each_target_takes_its_own_dot_product_tier():
    """The dispatch (``dot_tier``) reads the compile target off the code LLVM generates for it,
    so a target given by name only (``NUMBA_CPU_FEATURES`` empty) gets its tier: AVX2's
    pmaddubsw / pmaddwd for haswell, AVX-512BW's for skylake-avx512, vpdpbusd for a VNNI
    CPU, plain IR for a CPU without AVX2; and the host build takes the host's tier."""
    from numba.core.registry import cpu_target

    from qaccel.model import nbits_kernels

    code = ("from numba.core.registry import cpu_target; "
            "from qaccel.model.nbits_kernels import dot_tier; "
            "print(dot_tier(cpu_target.target_context))")
    expected = {"haswell": "avx2", "skylake-avx512": "avx512bw", "cascadelake": "vnni",
                "znver4": "vnni", "sandybridge": "plain"}
    for cpu, tier in expected.items():
        env = dict(os.environ, NUMBA_CPU_NAME=cpu, NUMBA_CPU_FEATURES="")
        run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout.strip() == tier, (cpu, run.stdout)
    host = {name for name, on in llvm.get_host_cpu_features().items() if on}
    want = ("vnni" if "avx512vnni" in host else "avx512bw" if "avx512bw" in host
            else "avx2" if "avx2" in host else "plain")
    assert nbits_kernels.dot_tier(cpu_target.target_context) == want
