# amaranth: UnusedElaboratable=no
"""Pow2Divide (the float8e8m0 scale's exact division) through Verilator at latency 1 and 2
against a direct model: random dividends of every class over a power-of-two divisor of every
class, with the quotient class, sign, exponent and significand FloatDivide would give; then the
parameter errors."""

from __future__ import annotations

import numpy as np
import pytest

from qaccel.rtl.arith.float_unpack import FloatClass
from qaccel.rtl.arith.pow2_divide import Pow2Divide
from qaccel.sim.runner import missing_simulator
from qaccel.sim.vectors import VectorSim, join_fields, split_fields

requires_verilator = pytest.mark.skipif(missing_simulator("verilator") is not None,
                                        reason=missing_simulator("verilator") or "")

A_W, B_W, Q_W, E_W = 24, 24, 26, 10
CLASSES = [FloatClass.ZERO, FloatClass.SUBNORMAL, FloatClass.NORMAL, FloatClass.INF,
           FloatClass.NAN]
FINITE = (FloatClass.SUBNORMAL, FloatClass.NORMAL)


def model(a_cls, a_sign, a_exp, a_sig, b_cls, b_sign, b_exp) -> tuple[int, int, int, int]:
    """(cls, sign, exp, sig) of a / b for a power-of-two b, as FloatDivide states them."""
    a_cls, b_cls = FloatClass(a_cls), FloatClass(b_cls)
    sign = a_sign ^ b_sign
    if a_cls == FloatClass.NAN:                 # a NaN keeps its sign, a's first
        return FloatClass.NAN.value, a_sign, 0, 0
    if b_cls == FloatClass.NAN:
        return FloatClass.NAN.value, b_sign, 0, 0
    if a_cls == b_cls and a_cls in (FloatClass.ZERO, FloatClass.INF):
        return FloatClass.NAN.value, 1, 0, 0    # x86's default NaN
    if a_cls == FloatClass.INF or b_cls == FloatClass.ZERO:
        return FloatClass.INF.value, sign, 0, 0
    if a_cls == FloatClass.ZERO or b_cls == FloatClass.INF:
        return FloatClass.ZERO.value, sign, 0, 0
    return FloatClass.NORMAL.value, sign, a_exp - b_exp, a_sig << (Q_W - A_W)


@pytest.mark.sim
@requires_verilator
@pytest.mark.parametrize("latency", [1, 2])
def test_pow2_divide_random(latency):
    unit = Pow2Divide(a_width=A_W, b_width=B_W, q_width=Q_W, exp_width=E_W, latency=latency)
    assert unit.latency == latency
    rng = np.random.default_rng(latency)
    n = 20_000
    lim = 1 << (E_W - 1)
    a = {"cls": rng.choice([c.value for c in CLASSES], n, p=[.1, .2, .5, .1, .1]),
         "sign": rng.integers(0, 2, n, dtype=np.uint64),
         "exp": rng.integers(-lim, lim, n),
         "sig": rng.integers(1 << (A_W - 1), 1 << A_W, n, dtype=np.uint64),
         "sticky": np.zeros(n, np.uint64)}
    b = {"cls": rng.choice([c.value for c in CLASSES], n, p=[.1, .1, .6, .1, .1]),
         "sign": rng.integers(0, 2, n, dtype=np.uint64),
         "exp": rng.integers(-lim, lim, n),
         "sig": np.full(n, 1 << (B_W - 1), np.uint64),
         "sticky": np.zeros(n, np.uint64)}
    out = VectorSim(unit, name=f"pow2_divide_{latency}").run(
        {"a": join_fields(a, unit.a.shape()), "b": join_fields(b, unit.b.shape())},
        latency=unit.latency, outputs=["q"])["q"]
    q = split_fields(out, unit.q.shape())
    for k in range(n):
        want = model(int(a["cls"][k]), int(a["sign"][k]), int(a["exp"][k]), int(a["sig"][k]),
                     int(b["cls"][k]), int(b["sign"][k]), int(b["exp"][k]))
        got = (int(q["cls"][k]), int(q["sign"][k]), int(q["exp"][k]), int(q["sig"][k]))
        assert got == want and int(q["sticky"][k]) == 0, (k, got, want)


def test_pow2_divide_latency_value():
    with pytest.raises(ValueError, match=r"latency must be in \[1, 2\], not 3"):
        Pow2Divide(a_width=24, b_width=24, q_width=26, exp_width=10, latency=3)
    with pytest.raises(TypeError, match=r"latency must be an integer, not 1.0"):
        Pow2Divide(a_width=24, b_width=24, q_width=26, exp_width=10, latency=1.0)
