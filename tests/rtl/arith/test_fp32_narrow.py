"""Fp32Narrow (float32 to float16 / bfloat16, round to nearest even) against NumPy's
``astype(np.float16)`` and ml_dtypes' ``astype(bfloat16)`` on this x86-64 machine, on one
Verilator build: every sign and exponent with mantissas at and around each format's rounding
boundaries (ties, one below, one above, all ones, zero, random) and two million random codes,
in both formats; the latency exactly as declared. The ``synth`` test places and routes the
unit alone on an LFE5U-25F speed 6. NaN results compare by NaN-ness and sign (the unit gives
the quiet NaN, NumPy keeps a payload)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from qaccel.eda import synth
from qaccel.rtl.arith.fp32_narrow import FORMATS, LATENCY, Fp32Narrow
from qaccel.sim.runner import missing_simulator
from qaccel.sim.vectors import VectorSim

pytestmark = [pytest.mark.sim,
              pytest.mark.skipif(missing_simulator("verilator") is not None,
                                 reason=missing_simulator("verilator") or "")]
TYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


@pytest.fixture(scope="module")
def sim():
    return VectorSim(Fp32Narrow(), name="fp32_narrow")


def codes(rng) -> np.ndarray:
    """Every sign and exponent x mantissas around both formats' boundaries (the dropped 13
    and 16 bits at 0, one below half, half, one above, all ones; each with the kept bits
    even and odd), the subnormal float16 shifts' boundaries, then random codes."""
    low = []
    for drop in (13, 16):
        half = 1 << (drop - 1)
        low += [0, half - 1, half, half + 1, (1 << drop) - 1, 1]
    low = np.array(low, np.uint32)
    kept = rng.integers(0, 1 << 10, 64).astype(np.uint32)
    kept = np.concatenate([kept, [0, 1, (1 << 10) - 1, (1 << 10) - 2]]).astype(np.uint32)
    frac = ((kept[:, None] << 13) | low[None, :]) & ((1 << 23) - 1)
    # subnormal float16 results: every shift (exponents 102..113) with a tie at that shift
    ties = np.array([(1 << s) for s in range(23)] + [(1 << s) - 1 for s in range(1, 24)]
                    + [3 << s for s in range(21)], np.uint32) & ((1 << 23) - 1)
    frac = np.unique(np.concatenate([frac.ravel(), ties, rng.integers(0, 1 << 23, 200)]))
    se = np.arange(512, dtype=np.uint32)
    grid = ((se[:, None] << 23) | frac[None, :].astype(np.uint32)).ravel()
    rand = rng.integers(0, 1 << 32, 2_000_000, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([grid, rand])


def want(a: np.ndarray, fmt: str) -> np.ndarray:
    with np.errstate(all="ignore"):
        return a.view(np.float32).astype(TYPES[fmt]).view(np.uint16)


def check(a: np.ndarray, got: np.ndarray, fmt: str) -> int:
    ref = want(a, fmt)
    got = got.astype(np.uint16)
    nan = np.isnan(a.view(np.float32))
    gnan = np.isnan(got.view(TYPES[fmt]))
    ok = np.where(nan, gnan & ((got >> 15) == (ref >> 15)), got == ref)
    bad = np.flatnonzero(~ok)
    assert not bad.size, f"{bad.size} differ from NumPy ({fmt}); first: " + ", ".join(
        f"{a[k]:#010x} -> {got[k]:#06x}, want {ref[k]:#06x}" for k in bad[:5])
    return int(a.size)


@pytest.mark.parametrize("fmt", FORMATS)
def test_against_numpy(sim, fmt):
    a = codes(np.random.default_rng(16))
    assert a.size > 2_200_000
    out = sim.run({"a": a, "fmt": np.full(a.size, FORMATS.index(fmt), np.uint32)},
                  latency=LATENCY, outputs=["y"])["y"]
    assert check(a, out, fmt) == a.size


def test_latency_and_mixed_formats(sim):
    """The format may change every cycle; results line up at ``latency`` and not at one
    cycle more or less."""
    rng = np.random.default_rng(3)
    a = rng.integers(0, 1 << 32, 4000, dtype=np.uint64).astype(np.uint32)
    fmt = rng.integers(0, 2, a.size).astype(np.uint32)
    assert Fp32Narrow().latency == LATENCY

    def result(latency):
        return sim.run({"a": a, "fmt": fmt}, latency=latency, outputs=["y"])["y"]

    def agrees(out):
        finite = ~np.isnan(a.view(np.float32))
        for f, name in enumerate(FORMATS):
            sel = (fmt == f) & finite
            if not np.array_equal(out[sel].astype(np.uint16), want(a[sel], name)):
                return False
        return True

    assert agrees(result(LATENCY))
    assert not agrees(result(LATENCY - 1)) and not agrees(result(LATENCY + 1))


@pytest.mark.synth
def test_synth():
    """Alone on an LFE5U-25F speed 6: small and fast beside the engine's 100 MHz clock (the
    generic Decode + FloatRound it replaces took about 675 LUT4)."""
    reason = synth.missing_tools("ecp5-25k")
    if reason is not None:
        pytest.skip(reason)
    r = synth.synthesize(Fp32Narrow(), target="ecp5-25k", name="fp32_narrow")
    print()
    print(r.summary())
    print(r.critical_path)
    assert r.fmax_mhz >= 150 and r.dsp == 0 and r.bram == 0
    assert r.lut < 300
