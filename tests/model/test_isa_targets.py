"""Every x86 tier this machine can run gives the golden model's results bit for bit.

The kernels choose their instructions when Numba compiles them for a target CPU (AVX-512 VNNI's
``vpdpbusd`` or its plain-IR twin, 512- or 256-bit vectors), so the tiers below the host's are
exercised by compiling for an older CPU in a subprocess (``NUMBA_CPU_NAME``, with
``NUMBA_CPU_FEATURES`` empty: that CPU's own features) and comparing every result of
tests/model/isa_probe.py, byte for byte, with this process's (the host's tier). A tier the
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


def test_targets_take_the_plain_dot_product_and_the_host_vnni():
    """The dot-product dispatch (``_target_has``) reads the compile target's features: the
    older targets above take the plain-IR ``vpdpbusd`` twin, the host build the AVX-512 VNNI
    instruction when the CPU has it, so a VNNI machine runs both codegens."""
    from numba.core.registry import cpu_target

    from qaccel.model import nbits_kernels

    code = ("from numba.core.registry import cpu_target; "
            "from qaccel.model.nbits_kernels import _target_has; "
            "print(_target_has(cpu_target.target_context, 'avx512vnni'))")
    for cpu in TARGETS:
        env = dict(os.environ, NUMBA_CPU_NAME=cpu, NUMBA_CPU_FEATURES="")
        run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout.strip() == "False", (cpu, run.stdout)
    host_vnni = bool(llvm.get_host_cpu_features().get("avx512vnni"))
    assert nbits_kernels._target_has(cpu_target.target_context, "avx512vnni") == host_vnni
