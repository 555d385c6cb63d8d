"""BlockScale (the int8 path's per-column block term) against the formula of
model/nbits_hw.py in NumPy float32 arithmetic, on Verilator: 300k random blocks for two
columns (realistic and extreme scales, sums at their limits, zero and non-finite scales)."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from qaccel.rtl.block_scale import BlockScale
from qaccel.sim.runner import missing_simulator
from qaccel.sim.vectors import VectorSim

pytestmark = [pytest.mark.sim,
              pytest.mark.skipif(missing_simulator("verilator") is not None,
                                 reason=missing_simulator("verilator") or "")]

F32 = np.float32
PE, IW, AW = 2, 26, 17


class Flat(wiring.Component):
    """BlockScale with one plain port per column operand (what VectorSim drives)."""

    def __init__(self):
        self.unit = BlockScale(pe=PE, isum_width=IW, asum_width=AW)
        ports = {"valid": In(1), "asum": In(AW), "sa": In(32), "o_valid": Out(1)}
        for p in range(PE):
            ports |= {f"isum{p}": In(IW), f"sb{p}": In(32), f"zp{p}": In(8), f"t{p}": Out(32)}
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        m.submodules.unit = u = self.unit
        m.d.comb += [u.valid.eq(self.valid), u.asum.eq(self.asum), u.sa.eq(self.sa),
                     self.o_valid.eq(u.o_valid)]
        for p in range(PE):
            m.d.comb += [u.isum[p].eq(getattr(self, f"isum{p}")),
                         u.sb[p].eq(getattr(self, f"sb{p}")), u.zp[p].eq(getattr(self, f"zp{p}")),
                         getattr(self, f"t{p}").eq(u.t[p])]
        return m


@pytest.fixture(scope="module")
def sim():
    flat = Flat()
    return VectorSim(flat, name="block_scale_pe2"), flat.unit


def reference(isum, asum, sa, sb, zp):
    """t = f32(f32(f32(sa*sb) * f32(isum)) + f32(f32(sa*f32(asum)) * f32(-sb*f32(zp))))."""
    with np.errstate(all="ignore"):
        t1 = (sa * sb) * isum.astype(F32)
        t2 = (sa * asum.astype(F32)) * (-sb * zp.astype(F32))
        return t1 + t2


def operands(rng, n):
    sa = (rng.random(n) * 2.0 ** rng.integers(-20, 5, n)).astype(F32)
    sb = ((rng.random(n) - 0.3) * 2.0 ** rng.integers(-20, 5, n)).astype(F32)
    isum = rng.integers(-(1 << (IW - 1)), 1 << (IW - 1), n)
    small = rng.random(n) < 0.5                       # typical magnitudes, exact in float32
    isum[small] = rng.integers(-(1 << 20), 1 << 20, small.sum())
    asum = rng.integers(-(1 << (AW - 1)), 1 << (AW - 1), n)
    zp = rng.integers(0, 256, n)
    edge = rng.random(n) < 0.05
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, 3.4e38], F32)
    sa[edge] = rng.choice(specials[[0, 2, 4, 5, 6]], edge.sum())      # sa = amax/127 >= 0
    edge = rng.random(n) < 0.05
    sb[edge] = rng.choice(specials, edge.sum())
    isum[rng.random(n) < 0.02] = 0
    asum[rng.random(n) < 0.02] = 0
    zp[rng.random(n) < 0.05] = 0
    return isum, asum, sa, sb, zp


def test_block_scale_matches_the_formula(sim):
    vs, unit = sim
    rng = np.random.default_rng(11)
    n = 300_000
    inputs = {"valid": np.ones(n, np.int64)}
    ops = [operands(rng, n) for _ in range(PE)]
    asum, sa = ops[0][1], ops[0][2]                   # shared by the columns
    inputs |= {"asum": asum, "sa": sa.view(np.uint32)}
    for p, (isum, _, _, sb, zp) in enumerate(ops):
        inputs |= {f"isum{p}": isum, f"sb{p}": sb.view(np.uint32), f"zp{p}": zp}
    out = vs.run(inputs, latency=unit.latency)
    assert np.all(out["o_valid"] == 1)
    for p, (isum, _, _, sb, zp) in enumerate(ops):
        got = out[f"t{p}"].astype(np.uint32).view(F32)
        want = reference(isum, asum, sa, sb, zp)
        nan = np.isnan(want)
        assert np.array_equal(np.isnan(got), nan)
        bad = np.flatnonzero(got[~nan].view(np.uint32) != want[~nan].view(np.uint32))
        assert bad.size == 0, (p, bad.size, got[~nan][bad[:3]], want[~nan][bad[:3]])


def test_valid_travels_with_the_data(sim):
    vs, unit = sim
    valid = np.array([1, 0, 0, 1, 1, 0, 1] + [0] * 5)
    zeros = np.zeros(valid.size, np.int64)
    inputs = {"valid": valid, "asum": zeros, "sa": zeros}
    for p in range(PE):
        inputs |= {f"isum{p}": zeros, f"sb{p}": zeros, f"zp{p}": zeros}
    out = vs.run(inputs, latency=unit.latency)
    np.testing.assert_array_equal(out["o_valid"], valid)
    assert unit.latency == 23


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"pe": 0, "isum_width": 26, "asum_width": 17}, "pe must be in"),
    ({"pe": 2, "isum_width": 41, "asum_width": 17}, "isum_width must be in"),
    ({"pe": 2, "isum_width": 26, "asum_width": 1}, "asum_width must be in"),
])
def test_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BlockScale(**kwargs)
