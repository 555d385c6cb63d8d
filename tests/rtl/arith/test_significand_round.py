# amaranth: UnusedElaboratable=no
"""SignificandRound through Verilator against an integer model: random significands with every
kind of tail (exact ties of both parities, ties with a sticky bit, round-ups that carry into a
power of two), the specials, for float32 / float16 / bfloat16 / float64 widths selected per
value; then the parameter errors."""

from __future__ import annotations

import numpy as np
import pytest

from qaccel.rtl.arith.float_unpack import FloatClass
from qaccel.rtl.arith.significand_round import SignificandRound
from qaccel.sim.runner import missing_simulator
from qaccel.sim.vectors import VectorSim, join_fields, split_fields

requires_verilator = pytest.mark.skipif(missing_simulator("verilator") is not None,
                                        reason=missing_simulator("verilator") or "")

FORMATS = ("float16", "bfloat16", "float32")
P = {"float16": 11, "bfloat16": 8, "float32": 24}
W, E = 26, 11


def model(sig, sticky, exp, p: int) -> tuple[int, int]:
    """Round a W-bit normalised significand (plus a sticky bit) to p bits, ties to even;
    return the 24-bit result (top-aligned) and the exponent."""
    cut = W - p
    kept, rem, half = sig >> cut, sig & ((1 << cut) - 1), 1 << (cut - 1)
    up = rem > half or (rem == half and (sticky or kept & 1))
    kept += up
    if kept >> p:
        return 1 << 23, exp + 1
    return kept << (24 - p), exp


@pytest.mark.sim
@requires_verilator
def test_significand_round_random():
    unit = SignificandRound(FORMATS, sig_width=W, exp_width=E)
    rng = np.random.default_rng(1)
    n = 60_000
    fmt = rng.integers(0, len(FORMATS), n)
    sig = rng.integers(1 << (W - 1), 1 << W, n, dtype=np.uint64)
    cut = np.array([W - P[FORMATS[f]] for f in fmt], dtype=np.uint64)
    kind = rng.integers(0, 5, n)
    mask = (np.uint64(1) << cut) - np.uint64(1)
    half = np.uint64(1) << (cut - np.uint64(1))
    sig = np.where(kind == 0, (sig & ~mask) | half, sig)                  # an exact tie
    sig = np.where(kind == 1, sig | mask, sig)                            # carries up
    sig = np.where(kind == 2, (sig | ~mask) & np.uint64((1 << W) - 1), sig)  # all ones
    sticky = rng.integers(0, 2, n, dtype=np.uint64)
    exp = rng.integers(-(1 << (E - 1)) + 1, (1 << (E - 1)) - 1, n)
    cls = rng.choice([FloatClass.NORMAL.value, FloatClass.SUBNORMAL.value, FloatClass.ZERO.value,
                      FloatClass.INF.value, FloatClass.NAN.value], n, p=[.5, .3, .1, .05, .05])
    sign = rng.integers(0, 2, n, dtype=np.uint64)
    i = join_fields({"sign": sign, "exp": exp, "sig": sig, "sticky": sticky, "cls": cls},
                    unit.i.shape())
    out = VectorSim(unit, name="significand_round").run(
        {"i": i, "fmt": fmt}, latency=unit.latency, outputs=["o"])["o"]
    o = split_fields(out, unit.o.shape())
    for k in range(n):
        c = int(cls[k])
        finite = c in (FloatClass.NORMAL.value, FloatClass.SUBNORMAL.value)
        want_sig, want_exp = (model(int(sig[k]), int(sticky[k]), int(exp[k]),
                                    P[FORMATS[fmt[k]]]) if finite else (0, 0))
        want_cls = FloatClass.NORMAL.value if finite else c
        got = (int(o["sig"][k]), int(o["exp"][k]), int(o["cls"][k]), int(o["sign"][k]),
               int(o["sticky"][k]))
        assert got == (want_sig, want_exp, want_cls, int(sign[k]), 0), (
            f"vector {k}: sig {int(sig[k]):#x} sticky {int(sticky[k])} exp {int(exp[k])} "
            f"cls {c} to {FORMATS[fmt[k]]}: got {got}, want "
            f"{(want_sig, want_exp, want_cls, int(sign[k]), 0)}")


def test_significand_round_parameters():
    with pytest.raises(ValueError, match="sig_width"):
        SignificandRound(("float32",), sig_width=24, exp_width=10)
    with pytest.raises(ValueError, match="formats"):
        SignificandRound((), sig_width=26, exp_width=10)
    assert SignificandRound(("float16", "float32"), sig_width=26, exp_width=10).o.sig.shape(
        ).width == 24
