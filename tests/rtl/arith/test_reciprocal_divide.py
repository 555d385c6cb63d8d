# amaranth: UnusedElaboratable=no
"""Reciprocal and ReciprocalDivide: the algorithm's integer model (tests/rtl/reciprocal_np.py)
against exact ``divmod``, exhaustively for 8- and 11-bit significands and on random and edge
24-bit pairs; both units through Verilator (qaccel.sim.vectors), ReciprocalDivide field by
field against FloatDivide's reference model (tests/rtl/arith/test_float_divide.py), Reciprocal
against ``floor((2**K - 1) / d)``; the handshake and the latencies in Amaranth's simulator;
parameter errors; and (opt-in, ``-m synth``) their size and Fmax alone on an LFE5U-25F.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from amaranth.hdl import ClockDomain, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from qaccel.eda import synth
from qaccel.rtl.arith.float_divide import FloatDivide
from qaccel.rtl.arith.reciprocal import Reciprocal
from qaccel.rtl.arith.reciprocal_divide import ReciprocalDivide, _ProductSlice
from qaccel.rtl.arith.wide_float import wide_float_layout
from qaccel.sim.vectors import ComponentBank, VectorSim, join_fields, split_fields

from ..reciprocal_np import divide_exact, divide_sig, reciprocal, reciprocal_steps, split
from ..wide_np import INF, NAN, NORM, SUB, ZERO, concat, describe, specials
from .test_float_divide import (
    FIELDS,
    UNITS,
    expected_quotient,
    f32_pairs,
    requires_verilator,
    wide_operands,
)

#: ReciprocalDivide instances of the shared build: the Quantize lane's float32 divider, then
#: FloatDivide's test units (float16, bfloat16, int32 / float64 and mixed widths).
LANE = dict(a_width=24, b_width=24, q_width=26, exp_width=10)
#: ... also within DSP budgets: three MULT18X18D (the qdq-int8-x8 preset's), none.
DIVIDERS = {"lane": LANE, "lane_dsp3": LANE | {"max_dsps": 3},
            "lane_dsp0": LANE | {"max_dsps": 0}} | {
    key: {k: v for k, v in params.items() if k != "bits_per_stage"}
    for key, (params, _) in UNITS.items()}

#: Reciprocal instances: key -> (d_width, r_width, bits_per_cycle). Widths of the float32,
#: float16 and bfloat16 dividers, some with digits per cycle that do not divide r_width
#: (extra leading digits) or exceed d_width (9, 11); narrow ones whose extra digits reach
#: above the dividend's top bit (cycles * bits_per_cycle > d_width + r_width - 1: leading
#: zero digits).
RECIPROCALS = {f"r{d}_{r}_{bpc}": (d, r, bpc) for d, r, bpcs in (
    (24, 27, (1, 2, 3, 4)), (11, 13, (1, 2, 4, 13)), (8, 11, (1, 9, 11)), (1, 2, (1, 2)),
    (1, 4, (3,)), (2, 5, (4,)), (3, 9, (4,))) for bpc in bpcs}


# ---------------------------------------------------------------------------------------------
# The integer model against divmod (no simulator)


def check_model(a, d, aw: int, bw: int, qw: int) -> int:
    """The model's quotient digits and sticky bit equal divmod's; ``q1`` is ``Q`` or ``Q + 1``,
    and ``Q`` whenever ``a' * 2**s / d`` is exact, which is when ``z = 0``."""
    r = reciprocal(d, bw, qw + 1)
    assert np.all(r >> qw == 1)
    got, want = divide_sig(a, d, r, aw, bw, qw), divide_exact(a, d, aw, bw, qw)
    bad = np.flatnonzero((got["quo"] != want["quo"]) | (got["sticky"] != want["sticky"]))
    assert not bad.size, (f"{bad.size} wrong, first a={int(a[bad[0]]):#x} "
                          f"d={int(d[bad[0]]):#x}")
    high = got["q1"] - want["quo"]
    assert np.all((high == 0) | (high == 1))
    n, t = split(aw, bw, qw)[:2]
    exact = ~divide_exact(a >> np.uint64(t), d, n, bw, qw)["sticky"]
    assert np.all(high[exact] == 0) and np.all((got["z"] == 0) == exact)
    return a.size


@pytest.mark.parametrize(("aw", "bw", "qw"), [
    (11, 11, 12), (11, 11, 13), (8, 8, 9), (8, 8, 10), (11, 8, 10), (8, 11, 13), (11, 11, 1),
    (11, 11, 40), (11, 4, 5), (11, 8, 1)])
def test_model_exhaustive(aw, bw, qw):
    """Every normalised significand pair of 11 (float16) and 8 bits (bfloat16), the quotient
    widths FloatDivide's tests and the Quantize lane use (``p + 1``, ``p + 2``), mixed widths,
    a 1-bit quotient, a 40-bit one (whose products no longer fit 64 bits), and dividends
    wider than ``q_width + b_width`` (dropped bits)."""
    a = np.arange(1 << (aw - 1), 1 << aw, dtype=np.uint64)
    d = np.arange(1 << (bw - 1), 1 << bw, dtype=np.uint64)
    assert check_model(np.tile(a, d.size), np.repeat(d, a.size), aw, bw, qw) == a.size * d.size


def edge_pairs(aw: int, bw: int, rng, n: int = 20_000) -> tuple[np.ndarray, np.ndarray]:
    """Significand pairs at the ends of both ranges; ``a = d``; exact quotients (``a`` an odd
    ``d``'s odd part times 1 or a random ``k``, normalised) and ``a`` one above and below."""
    def ends(w):
        lo, hi = 1 << (w - 1), (1 << w) - 1
        return [lo, lo + 1, lo + 2, hi, hi - 1, (lo + hi) // 2, lo | (lo >> 1)]

    def norm(x, w):
        return x << (w - x.bit_length())

    pairs = [(x, y) for x in ends(aw) for y in ends(bw)]
    for odd, k in zip((2 * rng.integers(0, 1 << (min(12, bw) - 1), n) + 1).tolist(),
                      rng.integers(1, 1 << 11, n).tolist(), strict=True):
        d = norm(odd, bw)
        pairs.append((norm(d, aw) if aw >= bw else d >> (bw - aw), d))
        for m in (odd, odd * k):
            if m.bit_length() <= aw:
                pairs += [(norm(m, aw) + da, d) for da in (0, 1, -1)
                          if (norm(m, aw) + da) >> (aw - 1) == 1]
    a, d = zip(*pairs, strict=True)
    return np.array(a, np.uint64), np.array(d, np.uint64)


def test_model_float32():
    """1M random 24-bit pairs and the edge pairs, the lane's 26-bit quotient and 25 and 27
    bits; for 26 bits also 24-bit dividends by 11- and 8-bit divisors and the reverse."""
    rng = np.random.default_rng(7)
    n = 1_000_000
    a = rng.integers(1 << 23, 1 << 24, n, dtype=np.uint64)
    d = rng.integers(1 << 23, 1 << 24, n, dtype=np.uint64)
    ea, ed = edge_pairs(24, 24, rng)
    a, d = np.concatenate([a, ea]), np.concatenate([d, ed])
    assert np.sum(divide_exact(a, d, 24, 24, 26)["sticky"] == 0) > 20_000
    assert check_model(a, d, 24, 24, 26) > n
    for qw in (25, 27):
        check_model(a[:200_000], d[:200_000], 24, 24, qw)
    for aw, bw in ((24, 11), (24, 8), (11, 24), (8, 24)):
        ea, ed = edge_pairs(aw, bw, rng)
        a = np.concatenate([rng.integers(1 << (aw - 1), 1 << aw, 200_000, dtype=np.uint64), ea])
        d = np.concatenate([rng.integers(1 << (bw - 1), 1 << bw, 200_000, dtype=np.uint64), ed])
        check_model(a, d, aw, bw, 26)


def test_model_reciprocal_steps():
    """Reciprocal's digit iteration (every bits_per_cycle of RECIPROCALS and a few more) equals
    ``floor((2**K - 1) / d)``: every 11- and 8-bit ``d``, 100k random 24-bit ones;
    ``r * d = 2**K - 1 - rho`` with ``0 <= rho < d``, and ``r`` has its top bit set."""
    rng = np.random.default_rng(8)
    for dw, rw, bpc in [*RECIPROCALS.values(), (24, 27, 27), (24, 27, 5), (11, 13, 12)]:
        d = (np.arange(1 << (dw - 1), 1 << dw, dtype=np.uint64) if dw <= 11
             else rng.integers(1 << (dw - 1), 1 << dw, 100_000, dtype=np.uint64))
        r = reciprocal(d, dw, rw)
        np.testing.assert_array_equal(reciprocal_steps(d, dw, rw, bpc), r)
        k = dw + rw - 1
        rho = np.uint64((1 << k) - 1) - r * d
        assert np.all(rho < d) and np.all(r >> np.uint64(rw - 1) == 1)


# ---------------------------------------------------------------------------------------------
# ReciprocalDivide through Verilator


@pytest.fixture(scope="module")
def divider_bank() -> tuple[VectorSim, dict[str, ReciprocalDivide]]:
    units = {key: ReciprocalDivide(**params) for key, params in DIVIDERS.items()}
    return VectorSim(ComponentBank(units), name="reciprocal_divide_bank"), units


def r_for(wa: dict, wb: dict, unit: ReciprocalDivide, seed: int) -> np.ndarray:
    """``r`` for each vector: the reciprocal of ``b.sig`` where both operands are finite and
    non-zero, random junk elsewhere (which the unit must ignore)."""
    finite = np.isin(wa["cls"], [NORM, SUB]) & np.isin(wb["cls"], [NORM, SUB])
    top = np.uint64(1 << (unit.b_width - 1))
    d = np.where(finite, wb["sig"], top)
    r = reciprocal(d, unit.b_width, unit.r_width)
    junk = np.random.default_rng(seed).integers(0, 1 << unit.r_width, d.size, dtype=np.uint64)
    return np.where(finite, r, junk).astype(np.uint64)


def run_dividers(bank, jobs: dict) -> dict[str, float]:
    """Run the units named by ``jobs`` (key -> (wa, wb)) side by side and compare every field
    of ``q`` with FloatDivide's reference (:func:`expected_quotient`). Units of a shorter
    latency get that many idle vectors first, so that every output is sampled at its own
    latency. Returns the run's wall time per key."""
    sim, units = bank
    latency = max(u.latency for u in units.values())
    n = max(len(wa["sig"]) + latency - units[key].latency for key, (wa, _) in jobs.items())
    inputs = {}
    for key, (wa, wb) in jobs.items():
        u = units[key]
        skip = latency - u.latency
        ports = {"a": join_fields(wa, u.a.shape()), "b": join_fields(wb, u.b.shape()),
                 "r": r_for(wa, wb, u, len(key))}
        for port, v in ports.items():
            col = np.zeros((n, *v.shape[1:]), v.dtype)
            col[skip:skip + len(v)] = v
            inputs[f"{port}_{key}"] = col
    out = sim.run(inputs, latency=latency, outputs=[f"q_{key}" for key in jobs])
    for key, (wa, wb) in jobs.items():
        u, size = units[key], len(wa["sig"])
        q = split_fields(out[f"q_{key}"][:size], u.q.shape())
        ref = expected_quotient(wa, wb, u.a_width, u.b_width, u.q_width)
        for name in FIELDS:
            bad = np.flatnonzero(q[name].astype(np.int64) != ref[name].astype(np.int64))
            assert not bad.size, f"{key}: {bad.size} of {size} wrong q.{name}, first: " + \
                "; ".join(f"({describe(wa, k)}) / ({describe(wb, k)}): {int(q[name][k])}, "
                          f"want {int(ref[name][k])}" for k in bad[:3])
    return {key: sim.last_run.wall for key in jobs}


def finite_wide(sig, exp_width: int, rng) -> dict:
    """Finite wide floats with the given significands: random signs, NORMAL or SUBNORMAL,
    exponents over the whole field."""
    n, half = sig.size, 1 << (exp_width - 1)
    return {"sign": rng.integers(0, 2, n, dtype=np.uint64),
            "exp": rng.integers(-half, half, n),
            "sig": np.asarray(sig, np.uint64), "sticky": np.zeros(n, np.uint64),
            "cls": rng.choice(np.array([NORM, SUB], np.uint64), n)}


def with_specials(wa: dict, wb: dict, width_a: int, width_b: int, exp_width: int,
                  seed: int) -> tuple[dict, dict]:
    """``wa``, ``wb`` plus every pair of :func:`~.wide_np.specials` (zeros, infinities and NaNs
    with junk fields, both signs, finite values at the ends of the exponent field)."""
    sa, sb = specials(width_a, exp_width, 8, seed), specials(width_b, exp_width, 8, seed + 1)
    na, nb = sa["sig"].size, sb["sig"].size
    pa = {k: np.repeat(v, nb) for k, v in sa.items()}
    pb = {k: np.tile(v, na) for k, v in sb.items()}
    for p in (pa, pb):
        p["sticky"] = np.zeros_like(p["sticky"])          # operands are exact
    pa["sig"] &= np.uint64((1 << width_a) - 1)
    pb["sig"] &= np.uint64((1 << width_b) - 1)
    return concat(wa, pa), concat(wb, pb)


@pytest.mark.sim
@requires_verilator
def test_divide_significands_exhaustive(divider_bank):
    """Every pair of normalised 11-bit significands (the float16 unit, 1M pairs) and of 8-bit
    ones (bfloat16) with random signs and exponents over the whole field, plus every pair of
    specials and extreme exponents; the two units side by side."""
    units, jobs = divider_bank[1], {}
    for key, seed in (("f16", 1), ("bf16", 2)):
        u, rng = units[key], np.random.default_rng(seed)
        a = np.arange(1 << (u.a_width - 1), 1 << u.a_width, dtype=np.uint64)
        d = np.arange(1 << (u.b_width - 1), 1 << u.b_width, dtype=np.uint64)
        wa = finite_wide(np.tile(a, d.size), u.exp_width, rng)
        wb = finite_wide(np.repeat(d, a.size), u.exp_width, rng)
        jobs[key] = with_specials(wa, wb, u.a_width, u.b_width, u.exp_width, seed)
    assert jobs["f16"][0]["sig"].size > 1 << 20
    wall = run_dividers(divider_bank, jobs)
    print(f"\n{jobs['f16'][0]['sig'].size} + {jobs['bf16'][0]['sig'].size} vectors, "
          f"{wall['f16']:.1f} s")


@pytest.mark.sim
@requires_verilator
def test_divide_float32(divider_bank):
    """The Quantize lane's divider (24 / 24 bits, 26-bit quotient, 10-bit exponents; with 4, 3
    and no MULT18X18D): FloatDivide's
    >= 1M float32 pairs (overflow, underflow, subnormal operands, exact and half-integer
    quotients, specials of both signs), 200k random significand pairs with exponents over the
    whole field, edge significand pairs, every pair of specials."""
    u, rng = divider_bank[1]["lane"], np.random.default_rng(3)
    xs, ss = f32_pairs(rng)
    e = u.exp_width
    wa = wide_operands(xs.view(np.float32), 24, e, 4, 2.0 ** -126)
    wb = wide_operands(ss.view(np.float32), 24, e, 5, 2.0 ** -126)
    ea, ed = edge_pairs(24, 24, rng)
    sa = np.concatenate([rng.integers(1 << 23, 1 << 24, 200_000, dtype=np.uint64), ea])
    sb = np.concatenate([rng.integers(1 << 23, 1 << 24, 200_000, dtype=np.uint64), ed])
    wa, wb = concat(wa, finite_wide(sa, e, rng)), concat(wb, finite_wide(sb, e, rng))
    wa, wb = with_specials(wa, wb, 24, 24, e, 9)
    assert wa["sig"].size >= 1_200_000
    kinds = [np.isin(w["cls"], [c]).sum() for w in (wa, wb) for c in (ZERO, INF, NAN, SUB)]
    assert min(kinds) > 1000
    wall = run_dividers(divider_bank, {"lane": (wa, wb), "lane_dsp3": (wa, wb),
                                       "lane_dsp0": (wa, wb)})
    print(f"\n{wa['sig'].size} vectors, {wall['lane']:.1f} s")
    assert [divider_bank[1][k].dsps for k in ("lane", "lane_dsp3", "lane_dsp0")] == [4, 3, 0]


@pytest.mark.sim
@requires_verilator
@pytest.mark.parametrize("key", ["ab", "ba", "i32", "f32"])
def test_divide_other_widths(divider_bank, key):
    """FloatDivide's other test units: 24-bit dividends by 11-bit divisors to a 12-bit quotient
    (a dropped dividend bit, and ``a' * 2**s`` with bits below the remainder's), 8 by 24
    bits, 32 by 32 bits to 55 (nine MULT18X18D tiles), 24 by 24 to 26 with 9-bit exponents:
    random significands and exponents, edge pairs, specials."""
    u, rng = divider_bank[1][key], np.random.default_rng(len(key))
    n = 100_000 if key == "i32" else 300_000
    ea, ed = edge_pairs(u.a_width, u.b_width, rng)
    sa = np.concatenate([rng.integers(1 << (u.a_width - 1), 1 << u.a_width, n,
                                      dtype=np.uint64), ea])
    sb = np.concatenate([rng.integers(1 << (u.b_width - 1), 1 << u.b_width, n,
                                      dtype=np.uint64), ed])
    wa, wb = finite_wide(sa, u.exp_width, rng), finite_wide(sb, u.exp_width, rng)
    run_dividers(divider_bank, {key: with_specials(wa, wb, u.a_width, u.b_width, u.exp_width,
                                                   11)})


# ---------------------------------------------------------------------------------------------
# Reciprocal through Verilator


@pytest.mark.sim
@requires_verilator
def test_reciprocal_vectors():
    """Every 11- and 8-bit ``d`` (each bits_per_cycle; twice over), 100k random 24-bit ones (a
    new ``start`` in every ``done`` cycle, random junk on ``d`` between starts): ``done``
    exactly ``latency`` cycles after each start, ``busy`` exactly in between, ``r`` right."""
    units = {key: Reciprocal(d_width=dw, r_width=rw, bits_per_cycle=bpc)
             for key, (dw, rw, bpc) in RECIPROCALS.items()}
    sim = VectorSim(ComponentBank(units), name="reciprocal_bank")
    rng = np.random.default_rng(12)
    ds, inputs = {}, {}
    for key, u in units.items():
        lo, hi = 1 << (u.d_width - 1), 1 << u.d_width
        ds[key] = (rng.integers(lo, hi, 100_000, dtype=np.uint64) if u.d_width > 11
                   else np.tile(np.arange(lo, hi, dtype=np.uint64), 2))
    n = max(ds[key].size * u.latency for key, u in units.items()) + 40
    for key, u in units.items():
        starts = np.arange(ds[key].size) * u.latency
        start = np.zeros(n, np.uint8)
        start[starts] = 1
        d = rng.integers(0, 1 << u.d_width, n, dtype=np.uint64)
        d[starts] = ds[key]
        inputs |= {f"start_{key}": start, f"d_{key}": d}
    out = sim.run(inputs, latency=0)
    for key, u in units.items():
        done = np.flatnonzero(out[f"done_{key}"])
        want_done = np.arange(ds[key].size) * u.latency + u.latency
        np.testing.assert_array_equal(done, want_done, err_msg=key)
        busy = np.zeros(n, bool)
        busy[1:want_done[-1]] = True
        busy[want_done[:-1]] = False
        np.testing.assert_array_equal(out[f"busy_{key}"].astype(bool), busy, err_msg=key)
        want = reciprocal(ds[key], u.d_width, u.r_width).astype(np.uint64)
        np.testing.assert_array_equal(out[f"r_{key}"][done].astype(np.uint64), want,
                                      err_msg=key)
    print(f"\n{n} cycles, {sim.last_run.wall:.1f} s")


# ---------------------------------------------------------------------------------------------
# Amaranth simulator: handshake and latency


class _Resettable(wiring.Component):
    """A unit in a ``sync`` domain whose reset the testbench drives."""

    def __init__(self, unit):
        self.unit = unit
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.domains.sync = self.cd = ClockDomain("sync")
        m.submodules.unit = self.unit
        return m


def test_reciprocal_handshake():
    """Cycle by cycle: ``busy`` from the cycle after ``start`` for :attr:`cycles` cycles,
    ``done`` alone in the cycle :attr:`latency` after it, ``r`` held until the next start and
    through idle cycles; a start while busy restarts (no ``done`` for the abandoned one, here
    due in the next cycle); a start in the ``done`` cycle; a reset while busy."""
    top = _Resettable(Reciprocal(d_width=5, r_width=7, bits_per_cycle=2))
    u = top.unit
    assert (u.cycles, u.latency) == (4, 5)
    starts = {0: 19, 8: 31, 12: 16, 17: 23, 24: 17}        # cycle -> d (12 restarts 8's)
    reset = 26
    trace = []

    async def bench(ctx):
        for cycle in range(34):
            ctx.set(u.start, cycle in starts)
            ctx.set(u.d, starts.get(cycle, 0b10101))
            ctx.set(top.cd.rst, cycle == reset)
            trace.append((ctx.get(u.busy), ctx.get(u.done), ctx.get(u.r)))
            await ctx.tick()

    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    busy = [t[0] for t in trace]
    done = [c for c, t in enumerate(trace) if t[1]]
    assert done == [5, 17, 22]
    assert busy == [int(c in (*range(1, 5), *range(9, 17), *range(18, 22), 25, 26))
                    for c in range(34)]
    r = {c: t[2] for c, t in enumerate(trace)}
    rec = {d: int(reciprocal(np.array([d]), 5, 7)[0]) for d in starts.values()}
    assert all(r[c] == rec[19] for c in range(5, 10))      # held through idle cycles
    assert r[17] == rec[16] and all(r[c] == rec[23] for c in range(22, 26))


@pytest.mark.parametrize(("aw", "bw", "qw"), [
    (1, 1, 1), (3, 2, 1), (2, 5, 3), (4, 4, 5), (5, 1, 2), (6, 3, 1), (3, 3, 11), (5, 4, 4)])
def test_divide_latency_small(aw, bw, qw):
    """Latency exactly :attr:`latency`, one division per cycle, at the smallest widths (a
    1-bit quotient, 1-bit significands, dropped dividend bits): every significand pair, random
    classes, signs and exponents over the whole field (quotient exponents down to
    ``-2**exp_width``), against FloatDivide's reference."""
    dut = ReciprocalDivide(a_width=aw, b_width=bw, q_width=qw, exp_width=4)
    rng = np.random.default_rng(aw * 100 + bw * 10 + qw)
    sa = np.arange(1 << (aw - 1), 1 << aw, dtype=np.uint64)
    sb = np.arange(1 << (bw - 1), 1 << bw, dtype=np.uint64)
    wa = finite_wide(np.tile(np.tile(sa, sb.size), 3), 4, rng)
    wb = finite_wide(np.tile(np.repeat(sb, sa.size), 3), 4, rng)
    n = wa["sig"].size
    for w in (wa, wb):
        w["cls"][5::5] = rng.choice(np.array([ZERO, INF, NAN], np.uint64),
                                    w["cls"][5::5].size)
    wa["exp"][1], wb["exp"][1] = -8, 7
    want = join_fields(expected_quotient(wa, wb, aw, bw, qw), dut.q.shape()).tolist()
    a, b = join_fields(wa, dut.a.shape()), join_fields(wb, dut.b.shape())
    r = r_for(wa, wb, dut, 1)
    seen = []

    async def bench(ctx):
        for k in range(n + dut.latency):
            j = min(k, n - 1)
            ctx.set(dut.a.as_value(), int(a[j]))
            ctx.set(dut.b.as_value(), int(b[j]))
            ctx.set(dut.r, int(r[j]))
            seen.append(ctx.get(dut.q.as_value()))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert seen[dut.latency:] == want and seen[dut.latency - 1] != want[0]


class _Slice(wiring.Component):
    """ReciprocalDivide's product-slice builder alone, for :func:`test_product_slice`."""

    def __init__(self, plan, widths):
        self.plan = plan
        super().__init__({"x": In(widths[0]), "y": In(widths[1]), "e": In(max(1, widths[2])),
                          "p": Out(plan.hi - plan.lo)})

    def elaborate(self, platform):
        m = Module()
        p = Signal(self.plan.hi - self.plan.lo)
        m.d.comb += p.eq(self.plan.build(m, self.x, self.y, self.e, "s"))
        m.d.sync += self.p.eq(p)
        return m


def slice_shape(seed: int) -> tuple[int, ...]:
    """A random ``(x_width, y_width, lo, hi, extra_width, const)``."""
    rng = random.Random(seed)
    xw, yw = rng.randint(1, 40), rng.randint(1, 40)
    lo = rng.randrange(xw + yw)
    hi = rng.randint(lo + 1, xw + yw + 2)
    return (xw, yw, lo, hi, rng.choice([0, rng.randint(1, hi)]),
            rng.choice([0, 1 << rng.randrange(hi), rng.randrange(1, 1 << hi)]))


@pytest.mark.parametrize("shape", [slice_shape(seed) for seed in range(40)] + [
    (2, 4, 10, 16, 0, 3 << 10), (20, 2, 25, 34, 0, 5 << 25), (2, 2, 4, 8, 0, 3 << 4)])
def test_product_slice(shape):
    """The generic tiled product behind both products, on random shapes (DSP and LUT tiles,
    tiles cut at ``hi``, bits dropped below ``lo``, an extra term, a constant) and shapes whose
    lowest tile is dropped whole below a constant: ``floor((x * y + e + c) / 2**lo) mod
    2**(hi - lo)`` exactly, :attr:`cycle` + 1 cycles after the operands."""
    xw, yw, lo, hi, ew, const = shape
    rng = random.Random(repr(shape))
    plan = _ProductSlice(xw, yw, lo, hi, ew, const)
    dut = _Slice(plan, (xw, yw, ew))
    n = 60
    xs = [(1 << xw) - 1] * 2 + [rng.randrange(1 << xw) for _ in range(n - 2)]
    ys = [(1 << yw) - 1] * 2 + [rng.randrange(1 << yw) for _ in range(n - 2)]
    es = [rng.randrange(1 << ew) if ew else 0 for _ in range(n)]
    want = [((x * y + e + const) >> lo) % (1 << (hi - lo)) for x, y, e in zip(xs, ys, es,
                                                                            strict=True)]
    latency, seen = plan.cycle + 1, []

    async def bench(ctx):
        for k in range(n + latency):
            j = min(k, n - 1)
            ctx.set(dut.x, xs[j])
            ctx.set(dut.y, ys[j])
            ctx.set(dut.e, es[j])
            seen.append(ctx.get(dut.p))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert seen[latency:] == want, (shape, plan.tiles)


def test_members_and_plan():
    """Ports, widths and the plan of the lane's divider: four MULT18X18D, latency 11."""
    dut = ReciprocalDivide(a_width=24, b_width=24, q_width=26, exp_width=10)
    members = dut.signature.members
    assert members["a"].shape == wide_float_layout(24, 10)
    assert members["b"].shape == wide_float_layout(24, 10)
    assert members["r"].shape.width == 27 and dut.r_width == 27
    assert members["q"].shape == wide_float_layout(26, 12)
    assert (dut.a_width, dut.b_width, dut.q_width, dut.exp_width) == (24, 24, 26, 10)
    assert (dut.dsps, dut.latency) == (4, 11)
    assert FloatDivide(a_width=24, b_width=24, q_width=26, exp_width=10).latency == 28
    assert split(24, 24, 26) == (24, 0, 26, 25)
    with pytest.raises(AttributeError):
        dut.latency = 3
    rec = Reciprocal(d_width=24, r_width=27, bits_per_cycle=4)
    assert (rec.d_width, rec.r_width, rec.bits_per_cycle, rec.cycles, rec.latency) == \
        (24, 27, 4, 7, 8)
    assert Reciprocal(d_width=24, r_width=27).latency == 28


# ---------------------------------------------------------------------------------------------
# Parameter errors


def divider(**kw) -> ReciprocalDivide:
    return ReciprocalDivide(**(dict(a_width=24, b_width=24, q_width=26, exp_width=10) | kw))


@pytest.mark.parametrize("name", ["a_width", "b_width", "q_width"])
def test_divide_sig_widths(name):
    with pytest.raises(ValueError, match=rf"{name} must be in \[1, 256\], not 0"):
        divider(**{name: 0})
    with pytest.raises(ValueError, match=rf"{name} must be in \[1, 256\], not 257"):
        divider(**{name: 257})
    with pytest.raises(TypeError, match=rf"{name} must be an integer, not 24.0"):
        divider(**{name: 24.0})


def test_divide_exp_width():
    with pytest.raises(ValueError, match=r"exp_width must be in \[2, 30\], not 31"):
        divider(exp_width=31)
    with pytest.raises(TypeError, match=r"exp_width must be an integer, not '9'"):
        divider(exp_width="9")
    with pytest.raises(TypeError):
        ReciprocalDivide(24, 24, 26, 10)
    with pytest.raises(TypeError):
        divider(bits_per_stage=1)


def test_reciprocal_params():
    def make(**kw):
        return Reciprocal(**(dict(d_width=24, r_width=27) | kw))

    with pytest.raises(ValueError, match=r"d_width must be in \[1, 256\], not 0"):
        make(d_width=0)
    with pytest.raises(ValueError, match=r"r_width must be in \[1, 257\], not 258"):
        make(r_width=258)
    with pytest.raises(TypeError, match=r"r_width must be an integer, not True"):
        make(r_width=True)
    with pytest.raises(ValueError, match=r"bits_per_cycle must be in \[1, 27\], not 28"):
        make(bits_per_cycle=28)
    with pytest.raises(ValueError, match=r"bits_per_cycle must be in \[1, 27\], not 0"):
        make(bits_per_cycle=0)
    with pytest.raises(TypeError, match=r"bits_per_cycle must be an integer, not 2.0"):
        make(bits_per_cycle=2.0)
    with pytest.raises(TypeError):
        Reciprocal(24, 27)


# ---------------------------------------------------------------------------------------------
# Synthesis (opt-in: -m synth)


def _synth(unit, name):
    reason = synth.missing_tools("ecp5-25k")
    if reason is not None:
        pytest.skip(reason)
    r = synth.synthesize(unit, target="ecp5-25k", name=name, freq_mhz=125)
    print(f"\n{r.summary()}\n{r.critical_path}")
    return r


@pytest.mark.synth
def test_synth_reciprocal_divide():
    """Alone on an LFE5U-25F speed 6 (through qaccel.eda.synth's timing wrapper): 125 MHz (139-140
    MHz measured, seeds 1-3), the four MULT18X18D of the plan, about 400 LUT4 (FloatDivide
    with one digit per stage: 1441 LUT4, 0 DSP, 181-183 MHz)."""
    r = _synth(divider(), "reciprocal_divide")
    assert r.fmax_mhz >= 125 and r.dsp == 4 and r.bram == 0
    assert r.lut < 450


@pytest.mark.synth
@pytest.mark.parametrize(("bpc", "fmax"), [(1, 125), (2, 100), (4, 50)])
def test_synth_reciprocal(bpc, fmax):
    """Alone on an LFE5U-25F speed 6: no DSP, about one 26-bit subtractor and a multiplexer
    per digit (81 / 129 / 227 LUT4 measured); 125 MHz only with one digit per cycle
    (213-227, 111-117 and 59-60 MHz measured, seeds 1-3)."""
    r = _synth(Reciprocal(d_width=24, r_width=27, bits_per_cycle=bpc), f"reciprocal_{bpc}")
    assert r.fmax_mhz >= fmax and r.dsp == 0 and r.bram == 0
    assert r.lut < 40 + 50 * bpc
