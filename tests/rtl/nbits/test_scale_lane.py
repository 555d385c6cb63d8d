# amaranth: UnusedElaboratable=no
"""The v2 engine's scale lane (qaccel.rtl.nbits.scale_lane) against a NumPy model of the int8-path
contract (docs/matmul_nbits_v2.md, section 1), bit for bit.

On Verilator (qaccel.sim.streamsim): tens of thousands of random realistic block terms in rows
interleaved over many accumulators, edge values (zero terms, -0, subnormal products, overflow
to inf, NaN scales and biases, |d| >= 2**24 and its rounding, zp = 255 with asum at its
limits), few addresses back to back (forced stalls) under random idle cycles and
back-pressure; every output checked, counted (nothing lost or duplicated) and in order; the
transfer and result cycles equal those of a cycle model of the feeder's holding register and
the admission's scoreboard (tests/rtl/admitted_lane.py, as the engine feeds a lane; so
the recurrence and the sustained rate are as stated) and, without pauses, every result is
offered exactly ``latency`` cycles after its input; the same with 128 accumulators in block
RAM (a longer read, more forwarding). On Amaranth's simulator: the latency of one beat, a stall
of ``recurrence - distance`` cycles, the output credit under a long back-pressure, and a
reset that drops everything in flight. Marked ``slow``: half a million terms. Synthesis (marked
``synth``) reports the ECP5 figures.

NaN results compare by NaN-ness and sign only: the float units give the canonical quiet NaN
(0x7FC00000 / 0xFFC00000), NumPy keeps a NaN operand's payload.
"""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.hdl import ClockDomain, Module
from amaranth.lib import wiring
from amaranth.sim import Simulator

from qaccel.rtl.arith.fp32_add import Fp32Add
from qaccel.rtl.arith.fp32_mul import Fp32Mul
from qaccel.rtl.nbits.scale_lane import LUT_RAM_DEPTH, MAX_DEPTH, ScaleLane
from qaccel.sim.runner import missing_simulator
from qaccel.sim.streamsim import StreamSim
from qaccel.sim.vectors import join_fields, split_fields

from ..admitted_lane import AdmittedLane

F32 = np.float32
DEPTH, IW, AW = 32, 26, 17
_NEEDS_VERILATOR = pytest.mark.skipif(missing_simulator("verilator") is not None,
                                      reason=missing_simulator("verilator") or "")

_SIM: dict[int, tuple[AdmittedLane, StreamSim]] = {}


def lane_sim(depth: int = DEPTH) -> tuple[AdmittedLane, StreamSim]:
    """The lane (26/17-bit sums; depth 32: LUT RAM, 128: block RAM with a read latency of 2)
    behind its admission, and its Verilator build, once per session."""
    if depth not in _SIM:
        lane = AdmittedLane(ScaleLane(depth=depth, isum_width=IW, asum_width=AW))
        _SIM[depth] = lane, StreamSim(lane, name=f"scale_lane_d{depth}")
    return _SIM[depth]


# -- the contract in NumPy ------------------------------------------------------------------------

def reference(b: dict) -> tuple[np.ndarray, np.ndarray]:
    """(y bit patterns, addr) of every ``last`` beat of ``b``, in input order.

    ``d`` exact (int64), ``f32(d)`` through float64 (exact there, then one rounding),
    ``t = (sa * sb) * f`` and ``acc + t`` in NumPy float32 arithmetic."""
    d = (b["isum"].astype(np.int64) + 16 * b["isum_hi"].astype(np.int64)
         - b["zp"].astype(np.int64) * b["asum"].astype(np.int64))
    f = d.astype(np.float64).astype(F32)
    sa, sb = b["sa"].astype(np.uint32).view(F32), b["sb"].astype(np.uint32).view(F32)
    bias = b["bias"].astype(np.uint32).view(F32)
    with np.errstate(all="ignore"):
        t = (sa * sb) * f
        acc = np.zeros(MAX_DEPTH, F32)
        ys, addrs = [], []
        for k in range(d.size):
            a = int(b["addr"][k])
            base = bias[k:k + 1] if b["first"][k] else acc[a:a + 1]
            s = base + t[k:k + 1]
            if b["last"][k]:
                ys.append(s[0])
                addrs.append(a)
            else:
                acc[a] = s[0]
    return np.array(ys, F32).view(np.uint32), np.array(addrs, np.int64)


def same_result(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Per element: equal bit patterns, or both NaN with the same sign."""
    got, want = got.astype(np.uint32), want.astype(np.uint32)
    gn, wn = np.isnan(got.view(F32)), np.isnan(want.view(F32))
    return np.where(wn, gn & ((got >> 31) == (want >> 31)), got == want)


# -- beats ----------------------------------------------------------------------------------------

def schedule(rng, n_addr: int, rows: int, kmax: int, *, round_robin: bool = False):
    """``first``, ``last`` and ``addr`` of ``rows`` rows of 1..kmax blocks over ``n_addr``
    accumulators. Random: each step takes the next block of a random unfinished row (one open
    row per address). Round robin: the addresses in turn, every row ``kmax`` blocks."""
    if round_robin:
        per = rows // n_addr
        addr = np.tile(np.arange(n_addr), per * kmax)
        pos = np.repeat(np.arange(per * kmax), n_addr) % kmax
        return pos == 0, pos == kmax - 1, addr
    lengths = rng.integers(1, kmax + 1, rows)
    queue = [list(lengths[a::n_addr]) for a in range(n_addr)]
    left = [0] * n_addr                           # blocks left in the open row of each addr
    first, last, addr = [], [], []
    active = [a for a in range(n_addr) if queue[a]]
    while active:
        j = int(rng.integers(len(active)))
        a = active[j]
        if left[a] == 0:
            left[a] = int(queue[a].pop(0))
            first.append(True)
        else:
            first.append(False)
        left[a] -= 1
        last.append(left[a] == 0)
        addr.append(a)
        if left[a] == 0 and not queue[a]:
            active.pop(j)
    return np.array(first), np.array(last), np.array(addr)


def operands(rng, n: int, *, edge: float = 0.0) -> dict:
    """Realistic operands (sa ~ amax / 127, sb ~ weight scales, sums of blocks of 16..512),
    with a fraction ``edge`` of each field replaced by edge values."""
    block = rng.choice([16, 32, 64, 128, 256, 512], n)
    qa = rng.integers(-128, 128, n)                       # a typical activation per element
    asum = np.clip((qa * np.sqrt(block)).astype(np.int64), -(1 << (AW - 1)), (1 << (AW - 1)) - 1)
    zp = rng.choice([8, 128, *range(256)], n)
    isum = zp * asum + rng.integers(-128 * 8, 128 * 8, n) * np.sqrt(block).astype(np.int64) * 16
    isum = np.clip(isum, -(1 << (IW - 1)), (1 << (IW - 1)) - 1)
    sa = (rng.random(n) * 4.0 / 127).astype(F32)
    sb = (rng.standard_normal(n) * 0.02).astype(F32)
    bias = (rng.standard_normal(n) * 0.5).astype(F32)
    if edge:
        lo_i, hi_i = -(1 << (IW - 1)), (1 << (IW - 1)) - 1
        lo_a, hi_a = -(1 << (AW - 1)), (1 << (AW - 1)) - 1
        fspec = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45, 1e-38,
                          3.4e38, -3.4e38, 1e-30, 1e30, 1.0, -1.0], F32)

        def hit():
            return rng.random(n) < edge
        for arr, spec in ((sa, fspec), (sb, fspec), (bias, fspec)):
            h = hit()
            arr[h] = rng.choice(spec, h.sum())
        h = hit()                                           # big d: rounding to 24 bits
        isum[h] = rng.choice([lo_i, hi_i, hi_i - 1, (1 << 24) + 1, -(1 << 24) - 3,
                              (1 << 25) - 3, (1 << 24) + 7, -0x1FFFFFE], h.sum())
        h = hit()
        asum[h] = rng.choice([lo_a, hi_a, 0, -1, 1], h.sum())
        h = hit()
        zp[h] = rng.choice([0, 255], h.sum())
        h = hit()                                           # zero terms
        isum[h], asum[h] = 0, 0
        h = hit()                                           # d = 0 with non-zero sums
        isum[h] = zp[h] * asum[h]
        h = hit()                                           # random bit patterns
        sa[h] = rng.integers(0, 1 << 32, h.sum(), dtype=np.uint64).astype(np.uint32).view(F32)
        h = hit()
        sb[h] = rng.integers(0, 1 << 32, h.sum(), dtype=np.uint64).astype(np.uint32).view(F32)
    # the high-nibble sum of 5..8-bit codes: zero for most terms (codes of 2..4 bits)
    isum_hi = np.where(rng.random(n) < 0.3, rng.integers(-128 * 15 * 8, 127 * 15 * 8, n)
                       * np.sqrt(block).astype(np.int64), 0)
    if edge:
        h = rng.random(n) < edge
        isum_hi[h] = rng.choice([-(1 << (IW - 1)), (1 << (IW - 1)) - 1, -1, 1], h.sum())
    return {"isum": isum.astype(np.int64), "isum_hi": isum_hi.astype(np.int64),
            "asum": asum.astype(np.int64),
            "zp": zp.astype(np.int64), "sa": sa.view(np.uint32).astype(np.int64),
            "sb": sb.view(np.uint32).astype(np.int64),
            "bias": bias.view(np.uint32).astype(np.int64)}


def beats(rng, sched, *, edge: float = 0.0) -> dict:
    first, last, addr = sched
    b = operands(rng, first.size, edge=edge)
    return b | {"first": first.astype(np.int64), "last": last.astype(np.int64),
                "addr": addr.astype(np.int64)}


def admission(lane: AdmittedLane, b: dict) -> tuple[np.ndarray, np.ndarray]:
    """Transfer and admission cycles without pauses or back-pressure. A beat is admitted one
    cycle after its transfer at the earliest, after the beat before it, and, if it reads
    (``first`` clear), no sooner than ``recurrence`` cycles after the last admitted beat that
    writes its address (``last`` clear). It is transferred while the holding register is
    free: in the cycle the beat before it is admitted at the latest."""
    n = b["addr"].size
    xfer, adm = np.zeros(n, np.int64), np.zeros(n, np.int64)
    write_at: dict[int, int] = {}
    for k in range(n):
        xfer[k] = max(xfer[k - 1] + 1, adm[k - 1]) if k else 0
        a = int(b["addr"][k])
        t = max(xfer[k] + 1, adm[k - 1] + 1 if k else 0)
        if not b["first"][k] and a in write_at:
            t = max(t, write_at[a] + lane.recurrence)
        adm[k] = t
        if not b["last"][k]:
            write_at[a] = t
    return xfer, adm


def run(lane: AdmittedLane, sim: StreamSim, b: dict, **kw):
    """Run ``b`` through the lane; check every result, their count and order; return the
    StreamResult."""
    for name, lo, hi in (("isum", -(1 << (IW - 1)), 1 << (IW - 1)),
                         ("isum_hi", -(1 << (IW - 1)), 1 << (IW - 1)),
                         ("asum", -(1 << (AW - 1)), 1 << (AW - 1)), ("zp", 0, 256),
                         ("addr", 0, lane.depth)):
        assert lo <= b[name].min() and b[name].max() < hi, name
    words = join_fields(b, lane.i.payload.shape())
    n_out = int(b["last"].sum())
    r = sim.run({"i": words}, expect={"o": n_out}, until_idle=None, **kw)
    out = split_fields(r.outputs["o"], lane.o.payload.shape())
    want_y, want_addr = reference(b)
    assert out["y"].size == n_out                        # none lost, none duplicated (drain)
    np.testing.assert_array_equal(out["addr"].astype(np.int64), want_addr)
    ok = same_result(out["y"], want_y)
    bad = np.flatnonzero(~ok)
    assert not bad.size, (f"{bad.size} of {n_out} wrong; first: " + "; ".join(
        f"#{k} addr {want_addr[k]}: {int(out['y'][k]):#010x}, want {int(want_y[k]):#010x}"
        for k in bad[:4]))
    assert r.accepted["i"].size == b["addr"].size
    return r


# -- Verilator ------------------------------------------------------------------------------------

@pytest.mark.sim
@_NEEDS_VERILATOR
def test_realistic_round_robin_full_rate_and_latency():
    """32 accumulators in turn (as the engine feeds a lane), 30k realistic terms: one beat per
    cycle, every result offered exactly ``latency`` cycles after its last term."""
    lane, sim = lane_sim()
    rng = np.random.default_rng(1)
    b = beats(rng, schedule(rng, DEPTH, 32 * 60, 16, round_robin=True))
    r = run(lane, sim, b)
    acc = r.accepted["i"]
    np.testing.assert_array_equal(acc, acc[0] + np.arange(acc.size))
    np.testing.assert_array_equal(r.output_cycles["o"], acc[b["last"] == 1] + lane.latency)


@pytest.mark.sim
@_NEEDS_VERILATOR
@pytest.mark.parametrize("n_addr", [1, 2, 3, 5, 7, 8, 9, 32])
def test_admission_follows_the_recurrence(n_addr):
    """Rows over ``n_addr`` accumulators in turn and in random order, without pauses: the
    admission cycles are those of the scoreboard's rule (no stall at a distance of
    ``recurrence``, ``recurrence - distance`` cycles below), and results are exact."""
    lane, sim = lane_sim()
    rng = np.random.default_rng(100 + n_addr)
    for rr, sched in ((True, schedule(rng, n_addr, 4 * n_addr, 6, round_robin=True)),
                      (False, schedule(rng, n_addr, 600, 9))):
        b = beats(rng, sched, edge=0.02)
        r = run(lane, sim, b)
        acc = r.accepted["i"]
        xfer, adm = admission(lane, b)
        np.testing.assert_array_equal(acc - acc[0], xfer - xfer[0])
        np.testing.assert_array_equal(r.output_cycles["o"] - acc[0],
                                      adm[b["last"] == 1] - xfer[0] + lane.latency - 1)
        if rr:
            # in turn: a row's next block comes n_addr beats later, so it waits for
            # recurrence - n_addr cycles when that is positive, never otherwise
            gap = np.diff(adm.reshape(-1, n_addr)[:, 0])
            blocks = b["first"].reshape(-1, n_addr)[1:, 0] == 0
            np.testing.assert_array_equal(gap[blocks], max(n_addr, lane.recurrence))


@pytest.mark.sim
@_NEEDS_VERILATOR
@pytest.mark.parametrize(("n_addr", "kmax", "edge", "idle", "backpressure", "seed"), [
    (32, 12, 0.05, 0.0, 0.0, 1),
    (32, 12, 0.05, 0.3, 0.3, 2),
    (3, 5, 0.05, 0.2, 0.5, 3),
    (1, 4, 0.1, 0.0, 0.8, 4),
    (12, 1, 0.05, 0.1, 0.3, 5),         # one-block rows only: first and last together
    (32, 40, 0.02, 0.05, 0.1, 6),
])
def test_random_rows_edges_pauses(n_addr, kmax, edge, idle, backpressure, seed):
    """Random interleavings of rows with edge values under random idle cycles and
    back-pressure: every result exact, once, in order."""
    lane, sim = lane_sim()
    rng = np.random.default_rng(seed)
    rows = 2000 if n_addr > 1 else 300
    b = beats(rng, schedule(rng, n_addr, rows, kmax), edge=edge)
    run(lane, sim, b, idle=idle, backpressure=backpressure, seed=seed)


@pytest.mark.sim
@_NEEDS_VERILATOR
@pytest.mark.parametrize("n_addr", [1, 3, 8, 9, 100])
def test_block_ram_accumulators(n_addr):
    """Depth 128 (block RAM, a read latency of 2, so three write-backs are forwarded): the
    same admission cycles and exact results, addresses spread over the memory, then random
    rows under pauses."""
    lane, sim = lane_sim(128)
    assert lane.read_latency == 2 and lane.depth > LUT_RAM_DEPTH
    rng = np.random.default_rng(200 + n_addr)
    where = rng.permutation(lane.depth)[:n_addr]
    for sched in (schedule(rng, n_addr, 4 * n_addr, 6, round_robin=True),
                  schedule(rng, n_addr, 400, 9)):
        b = beats(rng, (sched[0], sched[1], where[sched[2]]), edge=0.02)
        r = run(lane, sim, b)
        xfer, adm = admission(lane, b)
        np.testing.assert_array_equal(r.accepted["i"] - r.accepted["i"][0], xfer - xfer[0])
        np.testing.assert_array_equal(r.output_cycles["o"] - r.accepted["i"][0],
                                      adm[b["last"] == 1] - xfer[0] + lane.latency - 1)
    b = beats(rng, (sched[0], sched[1], where[sched[2]]), edge=0.05)
    run(lane, sim, b, idle=0.2, backpressure=0.4, seed=n_addr)


@pytest.mark.sim
@pytest.mark.slow
@_NEEDS_VERILATOR
def test_many_random_rows():
    """Half a million terms, random rows over 32 and over 4 accumulators, edge values, random
    pauses (slow: some ten seconds, mostly the Python reference)."""
    lane, sim = lane_sim()
    rng = np.random.default_rng(77)
    for n_addr, rows, kmax in ((32, 40_000, 12), (4, 20_000, 6)):
        b = beats(rng, schedule(rng, n_addr, rows, kmax), edge=0.03)
        run(lane, sim, b, idle=0.1, backpressure=0.2, seed=n_addr)


@pytest.mark.sim
@_NEEDS_VERILATOR
def test_edge_values_exhaustive_mix():
    """One-block rows (``y = f32(bias + t)``) of every pairing of special sa, sb and bias with
    d at the rounding boundaries, and two-block rows that overflow and cancel."""
    lane, sim = lane_sim()
    spec = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, 1.5e-39, 1e-30,
                     1e30, 3.4e38, 0.03, -7.5], F32).view(np.uint32).astype(np.int64)
    ds = [0, 1, -1, (1 << 24) - 1, 1 << 24, (1 << 24) + 1, (1 << 24) + 2, (1 << 24) + 3,
          -((1 << 25) - 2), -((1 << 25) - 3), -(1 << 25), (1 << 25) - 5, (1 << (IW - 1)) - 1]
    sa, sb, bias, d = (g.ravel() for g in np.meshgrid(spec, spec, spec[[0, 1, 2, 4, 6, 11]],
                                                      np.array(ds), indexing="ij"))
    n = sa.size
    one = {"isum": d, "isum_hi": np.zeros(n, np.int64), "asum": np.zeros(n, np.int64),
           "zp": np.zeros(n, np.int64),
           "sa": sa, "sb": sb, "bias": bias, "first": np.ones(n, np.int64),
           "last": np.ones(n, np.int64), "addr": np.arange(n) % DEPTH}
    # zp = 255 with asum at its limits, isum and isum_hi at theirs: the widest d
    lim = [(-(1 << (IW - 1)), (1 << (AW - 1)) - 1), ((1 << (IW - 1)) - 1, -(1 << (AW - 1))),
           (0, -(1 << (AW - 1))), (0, (1 << (AW - 1)) - 1)]
    m = 4 * len(lim)
    wide = {"isum": np.array([i for i, _ in lim] * 4),
            "isum_hi": np.array([i for i, _ in lim] * 2 + [0] * (2 * len(lim))),
            "asum": np.array([a for _, a in lim] * 4),
            "zp": np.full(m, 255), "sa": np.full(m, F32(1.0).view(np.uint32), np.int64),
            "sb": np.full(m, F32(1.0).view(np.uint32), np.int64),
            "bias": np.zeros(m, np.int64), "first": np.ones(m, np.int64),
            "last": np.ones(m, np.int64), "addr": np.arange(m) % DEPTH}
    # two-block rows: huge then opposite (cancellation to +0), max + max (overflow)
    big = F32(3.0e38).view(np.uint32)
    pairs = {"isum": np.array([1, -1, 1, 1, 3, 0]), "isum_hi": np.zeros(6, np.int64),
             "asum": np.zeros(6, np.int64),
             "zp": np.zeros(6, np.int64),
             "sa": np.array([big, big, big, big, F32(1e-45).view(np.uint32),
                             F32(-0.0).view(np.uint32)], np.int64),
             "sb": np.full(6, F32(1.0).view(np.uint32), np.int64),
             "bias": np.array([0, 0, big, 0, F32(-0.0).view(np.uint32), 0], np.int64),
             "first": np.array([1, 0, 1, 0, 1, 0]), "last": np.array([0, 1, 0, 1, 0, 1]),
             "addr": np.array([5, 5, 6, 6, 7, 7])}
    b = {k: np.concatenate([one[k], wide[k], pairs[k]]).astype(np.int64) for k in one}
    want, _ = reference(b)
    assert np.isinf(want.view(F32)).any() and np.isnan(want.view(F32)).any()
    run(lane, sim, b, backpressure=0.2)


# -- Amaranth's simulator -------------------------------------------------------------------------

class _Resettable(wiring.Component):
    """The lane with its ``sync`` domain's reset as a port."""

    def __init__(self, lane: AdmittedLane):
        self.lane = lane
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.domains.sync = self.cd = ClockDomain("sync")
        m.submodules.lane = self.lane
        return m


def _small():
    lane = AdmittedLane(ScaleLane(depth=4, isum_width=IW, asum_width=AW))
    top = _Resettable(lane)
    return lane, top


def _beat(addr, first, last, isum=3, sa=1.0, sb=0.5, bias=0.25):
    return {"isum": isum, "isum_hi": 0, "asum": 0, "zp": 0, "sa": int(F32(sa).view(np.uint32)),
            "sb": int(F32(sb).view(np.uint32)), "bias": int(F32(bias).view(np.uint32)),
            "first": first, "last": last, "addr": addr}


def _simulate(top, bench):
    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


def test_latency_and_recurrence_on_amaranth():
    """One one-block row: ``y`` offered exactly ``latency`` cycles after the transfer. Two
    beats of one address at distances 1 .. recurrence: the second's result comes
    ``recurrence - distance`` cycles late (its stall), never earlier, and the sum is right; a
    ``first`` beat right behind a write of its address is not held; ``i.ready`` stays high
    while the holding register's beat enters the lane."""
    lane, top = _small()
    got = {}

    async def wait_result(ctx):
        n = 0
        while not ctx.get(lane.o.valid):
            await ctx.tick()
            n += 1
        y = ctx.get(lane.o.payload.y)
        await ctx.tick()
        return n, y

    async def bench(ctx):
        i, o = lane.i, lane.o
        ctx.set(o.ready, 1)
        ctx.set(i.payload, _beat(1, 1, 1, isum=3))          # 0.25 + 1.5
        ctx.set(i.valid, 1)
        assert ctx.get(i.ready)
        await ctx.tick()
        ctx.set(i.valid, 0)
        n, got["y0"] = await wait_result(ctx)
        got["latency"] = n + 1
        stalls = {}
        for dist in range(1, lane.recurrence + 2):
            ctx.set(i.payload, _beat(2, 1, 0, isum=4))          # 0.25 + 2
            ctx.set(i.valid, 1)
            await ctx.tick()
            ctx.set(i.valid, 0)
            for _ in range(dist - 1):
                await ctx.tick()
            ctx.set(i.payload, _beat(2, 0, 1, isum=-2, sb=0.75))    # + (-1.5)
            ctx.set(i.valid, 1)
            assert ctx.get(i.ready)                      # the held beat enters the lane
            await ctx.tick()
            ctx.set(i.valid, 0)
            n, got[f"y{dist}"] = await wait_result(ctx)
            stalls[dist] = n + 1 - lane.latency
        got["stalls"] = stalls
        # a write to addr 3 in flight does not hold a first beat of addr 3 (nor another
        # address): three beats back to back, each result ``latency`` after its transfer
        ctx.set(i.valid, 1)
        for beat in (_beat(3, 1, 0), _beat(3, 1, 1), _beat(0, 1, 1)):
            ctx.set(i.payload, beat)
            assert ctx.get(i.ready)
            await ctx.tick()
        ctx.set(i.valid, 0)
        n, _ = await wait_result(ctx)
        got["first_behind_write"] = n + 2      # from its transfer
        n, _ = await wait_result(ctx)
        got["other_addr"] = n

    _simulate(top, bench)
    assert got["latency"] == lane.latency
    if isinstance(lane._adder, Fp32Add) and isinstance(lane._mul1, Fp32Mul):
        assert (lane.lane.latency, lane.recurrence) == (28, 9)   # the docstring's figures
    assert got["y0"] == F32(1.75).view(np.uint32)
    assert got["stalls"] == {d: max(0, lane.recurrence - d) for d in got["stalls"]}
    for dist in got["stalls"]:
        assert got[f"y{dist}"] == F32(0.75).view(np.uint32), dist
    # the second beat's result offered `latency` after its transfer, the third's in the next
    # cycle: no stall
    assert (got["first_behind_write"], got["other_addr"]) == (lane.latency, 0)


def test_output_credit_and_reset_on_amaranth():
    """With ``o.ready`` low, exactly ``fifo_depth`` last beats are admitted and one more
    waits in the holding register (then ``i.ready`` is low); all come out, once, in order. A
    reset with beats held, in flight and in the FIFO drops them all."""
    lane, top = _small()
    got = {"ys": [], "after_reset": []}
    D = lane.fifo_depth

    async def bench(ctx):
        i, o = lane.i, lane.o
        ctx.set(o.ready, 0)
        taken = 0
        ctx.set(i.valid, 1)
        for k in range(D + 8 + lane.latency):
            ctx.set(i.payload, _beat(k % 4, 1, 1, isum=taken))
            if ctx.get(i.ready):
                taken += 1
            await ctx.tick()
        got["taken"] = taken
        ctx.set(i.payload, _beat(0, 1, 0))
        got["non_last_ready"] = ctx.get(i.ready)
        ctx.set(i.valid, 0)
        ctx.set(o.ready, 1)
        for _ in range(D + lane.latency + 8):
            if ctx.get(o.valid):
                got["ys"].append(ctx.get(o.payload.y))
            await ctx.tick()
        # reset with a beat held and beats in the pipeline and the FIFO
        ctx.set(o.ready, 0)
        ctx.set(i.valid, 1)
        for k in range(lane.latency + 5):
            ctx.set(i.payload, _beat(k % 4, 1, 1, isum=100 + k))
            await ctx.tick()
        ctx.set(i.valid, 0)
        ctx.set(top.cd.rst, 1)
        await ctx.tick()
        ctx.set(top.cd.rst, 0)
        ctx.set(o.ready, 1)
        ctx.set(i.payload, _beat(2, 1, 1, isum=7))
        ctx.set(i.valid, 1)
        assert ctx.get(i.ready)
        await ctx.tick()
        ctx.set(i.valid, 0)
        for _ in range(lane.latency + 8):
            if ctx.get(o.valid):
                got["after_reset"].append(ctx.get(o.payload.y))
            await ctx.tick()

    _simulate(top, bench)
    assert got["taken"] == D + 1
    assert not got["non_last_ready"]
    want = [F32(F32(0.25) + F32(0.5) * F32(k)).view(np.uint32) for k in range(D + 1)]
    assert got["ys"] == want
    assert got["after_reset"] == [F32(0.25 + 3.5).view(np.uint32)]


# -- parameters and synthesis ---------------------------------------------------------------------

@pytest.mark.parametrize(("kwargs", "exc", "match"), [
    ({"depth": 0, "isum_width": 26, "asum_width": 17}, ValueError, "depth must be in"),
    ({"depth": 1025, "isum_width": 26, "asum_width": 17}, ValueError, "depth must be in"),
    ({"depth": 32, "isum_width": 41, "asum_width": 17}, ValueError, "isum_width must be in"),
    ({"depth": 32, "isum_width": 26, "asum_width": 1}, ValueError, "asum_width must be in"),
    ({"depth": 3.0, "isum_width": 26, "asum_width": 17}, TypeError, "depth must be an integer"),
    ({"depth": 32, "isum_width": "26", "asum_width": 17}, TypeError, "isum_width must be an"),
    ({"depth": 32, "isum_width": 26, "asum_width": 17, "ecp5": 1}, TypeError,
     "ecp5 must be a bool, not 1"),
])
def test_errors(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        ScaleLane(**kwargs)


def test_ports_and_derived_figures():
    lane = ScaleLane(depth=1, isum_width=2, asum_width=2)
    assert lane.addr_width == 1
    lay = ScaleLane(depth=1024, isum_width=40, asum_width=32)
    assert lay.i.payload.shape().size == 2 * 40 + 32 + 8 + 96 + 2 + 10
    assert lay.o.payload.shape().size == 32 + 10
    for u in (lane, lay, ScaleLane(depth=32, isum_width=IW, asum_width=AW)):
        assert u.recurrence == u._adder.latency + 1
        assert u.latency == u.adder_cycle + u._adder.latency + 2
        assert u.adder_cycle == max(1 + u._mul1.latency, 1 + u.convert_latency) \
            + u._mul2.latency
        assert u.fifo_depth > u.latency
    # the float units: Fp32Add, Fp32Mul on MULT18X18Ds, instances with ecp5 (same latency)
    lane = ScaleLane(depth=32, isum_width=IW, asum_width=AW)
    prim = ScaleLane(depth=32, isum_width=IW, asum_width=AW, ecp5=True)
    assert (lane.ecp5, prim.ecp5) == (False, True)
    for u, ecp5 in ((lane, False), (prim, True)):
        assert isinstance(u._adder, Fp32Add)
        for mul in (u._mul1, u._mul2):
            assert isinstance(mul, Fp32Mul) and mul.dsp and mul.ecp5 == ecp5
    assert (prim.latency, prim.recurrence, prim.adder_cycle) == (
        lane.latency, lane.recurrence, lane.adder_cycle)


def test_ecp5_instances_in_the_verilog():
    """``ecp5=True`` builds each float32 multiplier's three MULT18X18Ds as instances (their
    wiring against the behavioural twin is tested on Fp32Mul, tests/rtl/arith/test_fp32_units.py);
    the default has none."""
    from qaccel.rtl.verilog import emit_verilog
    prim = emit_verilog(ScaleLane(depth=64, isum_width=24, asum_width=17, ecp5=True), "lane",
                        emit_src=False)
    beh = emit_verilog(ScaleLane(depth=64, isum_width=24, asum_width=17), "lane",
                       emit_src=False)
    assert prim.count("MULT18X18D ") == 6 and "MULT18X18D" not in beh


@pytest.mark.synth
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_synthesis_ecp5(seed):
    """The engine's lane shape (64 LUT-RAM accumulators, 24/17-bit sums) with the
    MULT18X18D instances, at 150 MHz. Measured (seeds 1, 2, 3): 3150 LUT4, 2478 FF, 6
    MULT18X18D, no block RAM, 151.2 / 162.8 / 159.5 MHz (Fp32Add's first stage, the
    exponent difference from the multiplier's output register, and Fp32Mul's rounding
    critical; with Binary32 units the lane was 54-58 MHz)."""
    from qaccel.eda.synth import missing_tools, synthesize
    if missing_tools("ecp5-25k"):
        pytest.skip(str(missing_tools("ecp5-25k")))
    r = synthesize(ScaleLane(depth=64, isum_width=24, asum_width=17, ecp5=True),
                   target="ecp5-25k", seed=seed, freq_mhz=150)
    print(f"\nScaleLane(64, 24, 17, ecp5=True) ecp5-25k seed {seed}: LUT4 {r.lut}, FF {r.ff}, "
          f"MULT18X18D {r.dsp}, DP16KD {r.bram}, Fmax {r.fmax_mhz:.1f} MHz; {r.critical_path}")
    assert r.bram == 0 and r.dsp == 6        # three per float32 multiply; zp * asum in LUTs
    assert r.lut < 3400
    assert r.fmax_mhz >= 150
