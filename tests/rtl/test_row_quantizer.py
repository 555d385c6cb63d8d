# amaranth: UnusedElaboratable=no
"""The v2 row quantiser (qaccel.rtl.row_quantizer) on Amaranth's simulator: random jobs (several
k, block sizes 16..256, k not a multiple of the block, several rows per job) and special blocks
(zeros, -0, subnormal and tiny amax where 127 / amax overflows, inf, NaN, ties of a * inv,
exactly representable amax) under random idle on ``a`` and back-pressure on ``q`` and ``blk``,
bit-exact against quantize_a, every beat counted; the steady-state rate per block and the
latency without pauses; empty jobs, a start while busy, reset; argument errors; synthesis."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.hdl import ResetInserter, Signal
from amaranth.sim import Simulator

from qaccel.model.nbits_kernels import quantize_a
from qaccel.rtl.row_quantizer import RowQuantizer

from .ecp5_models import DP16KD_MODEL, mult18x18d_model, needs_icarus, run_icarus

F32 = np.float32
FLT_MAX = F32(np.finfo(F32).max)
NAN_BITS = (0x7FC00000, 0xFFC00000, 0x7FA00001, 0xFF812345, 0x7FFFFFFF)


def _tiny() -> np.float32:
    """The smallest float32 amax whose inverse f32(127 / amax) is finite (about 3.7e-37)."""
    with np.errstate(over="ignore"):
        x = F32(127 / float(FLT_MAX))
        while np.isfinite(F32(127) / x):
            x = np.nextafter(x, F32(0))
        while not np.isfinite(F32(127) / x):
            x = np.nextafter(x, F32(1))
    return x


TINY = _tiny()


# -- data ------------------------------------------------------------------------------------


def tie_block(rng, n: int) -> np.ndarray:
    """Products a * inv that are exact ties j + 1/2 (amax = 127 * 2**e, inv = 2**-e), or that
    round to j + 1/2 in float32 although inexact (double rounding decides)."""
    v = np.zeros(n, F32)
    if rng.random() < 0.5:
        e = int(rng.integers(-100, 100))
        v[:] = F32((rng.integers(-127, 127, n) + 0.5) * 2.0 ** e)
        v[int(rng.integers(n))] = F32(127 * 2.0 ** e) * rng.choice([-1, 1])
        return v
    amax = F32(rng.uniform(0.5, 4) * 10.0 ** rng.integers(-30, 30))
    inv = F32(127) / amax
    v[0] = amax * rng.choice([-1, 1])
    got = 1
    for _ in range(20 * n):
        if got == n:
            break
        t = F32(rng.integers(-126, 126) + 0.5)
        a = F32(t / inv)
        for cand in (a, np.nextafter(a, F32(np.inf)), np.nextafter(a, F32(-np.inf))):
            if abs(cand) <= amax and F32(cand * inv) == t:
                v[got] = cand
                got += 1
                break
    return v


def special_block(rng, n: int) -> np.ndarray:
    """A block with a non-finite or degenerate amax."""
    kind = int(rng.integers(0, 9))
    v = F32(rng.standard_normal(n))
    if kind == 0:
        v[:] = 0
        v[rng.random(n) < 0.5] = F32(-0.0)                      # zeros, some -0
    elif kind == 1:                                              # an infinity
        v[int(rng.integers(n))] = F32(np.inf) * rng.choice([-1, 1])
    elif kind == 2:                                              # NaNs (+inf), last one wins
        for _ in range(int(rng.integers(1, 4))):
            v[int(rng.integers(n))] = np.uint32(rng.choice(NAN_BITS)).view(F32)
        if rng.random() < 0.5:
            v[int(rng.integers(n))] = F32(np.inf)
    elif kind == 3:                                              # all subnormal
        v = (rng.integers(0, 1 << 23, n).astype(np.uint32)
             | (rng.integers(0, 2, n).astype(np.uint32) << 31)).view(F32).copy()
    elif kind == 4:                                              # amax just below the limit
        v = v * F32(TINY / 8)
        v[int(rng.integers(n))] = np.nextafter(TINY, F32(0)) * rng.choice([-1, 1])
    elif kind == 5:                                              # amax at/above the limit
        v = (rng.integers(0, 1 << 23, n).astype(np.uint32)).view(F32).copy()
        v[int(rng.integers(n))] = TINY * F32(rng.choice([1, 1.0000001, 2, 3]))
        v[int(rng.integers(n))] = np.uint32(rng.integers(0x00500000, 0x00800000)).view(F32)
    elif kind == 6:                                              # amax = FLT_MAX
        v = F32(v * 1e37)
        v[int(rng.integers(n))] = FLT_MAX * rng.choice([-1, 1])
    elif kind == 7:                                              # representable amax
        v = F32(rng.integers(-127, 128, n)) * F32(2.0 ** rng.integers(-60, 60))
        v[int(rng.integers(n))] = F32(127 * 2.0 ** rng.integers(-60, 60))
    else:                                                        # tiny sa (subnormal)
        v = v * F32(2.0 ** rng.integers(-140, -110))
    return v


def random_block(rng, n: int) -> np.ndarray:
    """One block of ``n`` float32 of one of several kinds."""
    kind = int(rng.integers(0, 8))
    if kind == 0:
        return tie_block(rng, n)
    if kind in (1, 2):
        return special_block(rng, n)
    if kind == 3:                                                # random finite bit patterns
        bits = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
        bits[(bits & 0x7F800000) == 0x7F800000] &= 0xBFFFFFFF
        return bits.view(F32).copy()
    if kind == 4:                                                # small integers
        return F32(rng.integers(-20, 21, n))
    if kind == 5:                                                # few non-zeros
        v = np.zeros(n, F32)
        idx = rng.integers(0, n, max(1, n // 8))
        v[idx] = F32(rng.standard_normal(idx.size) * 10.0 ** rng.integers(-20, 20))
        return v
    return F32(rng.standard_normal(n) * 10.0 ** rng.uniform(-36, 37))


def random_rows(rng, rows: int, k: int, block_size: int) -> np.ndarray:
    """``(rows, k)`` float32 made of :func:`random_block` blocks."""
    kb = -(-k // block_size)
    A = np.empty((rows, kb * block_size), F32)
    for r in range(rows):
        for b in range(kb):
            A[r, b * block_size:(b + 1) * block_size] = random_block(rng, block_size)
    return np.ascontiguousarray(A[:, :k])


def expected(A: np.ndarray, block_size: int):
    """quantize_a's results as the unit's beats: q (qa, block_last, row_last) per padded
    element, blk (sa code, asum) per block."""
    rows, k = A.shape
    kb = -(-k // block_size)
    with np.errstate(all="ignore"):
        qa, sa, _ = quantize_a(np.ascontiguousarray(A), block_size)
    pad = np.zeros((rows, kb * block_size), np.int64)
    pad[:, :k] = qa.astype(np.int64)
    n = rows * kb * block_size
    i = np.arange(n)
    q = np.stack([pad.reshape(-1), (i % block_size == block_size - 1),
                  (i % (kb * block_size) == kb * block_size - 1)], axis=1).astype(np.int64)
    blk = np.stack([sa.view(np.uint32).reshape(-1).astype(np.int64),
                    pad.reshape(rows * kb, block_size).sum(axis=1)], axis=1)
    return q, blk


# -- simulation --------------------------------------------------------------------------------


class Run:
    """What a simulation recorded: per job the q and blk beats and their cycles, the a
    transfer cycles; the total cycles."""

    def __init__(self):
        self.q, self.blk, self.a_cycles, self.q_cycles, self.blk_cycles = [], [], [], [], []
        self.q_offered = []                                      # cycles q.valid was high
        self.busy_cycles = []


def simulate(unit: RowQuantizer, jobs, *, idle=0.0, backpressure=0.0, seed=0,
             start_while_busy=False, reset_at=None, max_cycles=400_000) -> Run:
    """Run ``jobs`` (``(A, block_size)`` pairs, or ``(A, block_size, register)`` to set the
    register to another value) back to back; ``a`` idles with probability ``idle`` per beat,
    ``q`` and ``blk`` withhold ready with probability ``backpressure`` per cycle."""
    rng = np.random.default_rng(seed)
    run = Run()

    async def tb(ctx):
        cycle = 0
        for job in jobs:
            A, bs = job[0], job[1]
            reg = job[2] if len(job) > 2 else bs
            rows, k = A.shape
            words = A.view(np.uint32).reshape(-1)
            n_q, n_blk = unit.q_beats(k, rows, bs), unit.blk_beats(k, rows, bs)
            q, blk, ac, qc, bc, qo = [], [], [], [], [], []
            ctx.set(unit.block_size, reg)
            ctx.set(unit.k, k)
            ctx.set(unit.rows, rows)
            ctx.set(unit.start, 1)
            await ctx.tick()
            cycle += 1
            ctx.set(unit.start, 0)
            if start_while_busy and n_q:                         # ignored: busy is high
                assert ctx.get(unit.busy)
                ctx.set(unit.k, 1)
                ctx.set(unit.start, 1)
                await ctx.tick()
                cycle += 1
                ctx.set(unit.start, 0)
                ctx.set(unit.k, k)
            sent = 0
            a_on = False
            while len(q) < n_q or len(blk) < n_blk or ctx.get(unit.busy):
                if reset_at is not None and cycle == reset_at:
                    run.q.append(np.array(q, np.int64).reshape(-1, 3))
                    run.blk.append(np.array(blk, np.int64).reshape(-1, 2))
                    return
                if not a_on and sent < len(words) and rng.random() >= idle:
                    a_on = True
                    ctx.set(unit.a.payload, int(words[sent]))
                ctx.set(unit.a.valid, a_on)
                q_rdy = rng.random() >= backpressure
                b_rdy = rng.random() >= backpressure
                ctx.set(unit.q.ready, q_rdy)
                ctx.set(unit.blk.ready, b_rdy)
                if a_on and ctx.get(unit.a.ready):
                    ac.append(cycle)
                    sent += 1
                    a_on = False
                if ctx.get(unit.q.valid):
                    qo.append(cycle)
                    if q_rdy:
                        p = ctx.get(unit.q.payload)
                        q.append((int(p.qa), int(p.block_last), int(p.row_last)))
                        qc.append(cycle)
                if ctx.get(unit.blk.valid) and b_rdy:
                    p = ctx.get(unit.blk.payload)
                    blk.append((int(p.sa), int(p.asum)))
                    bc.append(cycle)
                await ctx.tick()
                cycle += 1
                assert cycle < max_cycles, "stalled"
            ctx.set(unit.a.valid, 0)
            assert sent == len(words), f"{sent} of {len(words)} a beats taken"
            for _ in range(4):                                   # nothing late
                ctx.set(unit.q.ready, 1)
                ctx.set(unit.blk.ready, 1)
                assert not ctx.get(unit.q.valid) and not ctx.get(unit.blk.valid)
                await ctx.tick()
                cycle += 1
            run.q.append(np.array(q, np.int64).reshape(-1, 3))
            run.blk.append(np.array(blk, np.int64).reshape(-1, 2))
            run.a_cycles.append(ac)
            run.q_cycles.append(qc)
            run.blk_cycles.append(bc)
            run.q_offered.append(qo)
        run.cycles = cycle

    sim = Simulator(unit)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    return run


def check(run: Run, jobs):
    """Every beat of every job bit-exact and counted."""
    for j, job in enumerate(jobs):
        A, bs = job[0], job[1]
        eq, eb = expected(A, bs)
        what = f"job {j}: block {bs} k {A.shape[1]} rows {A.shape[0]}"
        gq, gb = run.q[j], run.blk[j]
        assert gq.shape == eq.shape, f"{what}: {len(gq)} q beats, expected {len(eq)}"
        assert gb.shape == eb.shape, f"{what}: {len(gb)} blk beats, expected {len(eb)}"
        bad = np.flatnonzero((gq != eq).any(axis=1))
        assert not bad.size, (f"{what}: q beat {bad[0]} is {gq[bad[0]]}, expected "
                              f"{eq[bad[0]]} ({bad.size} differ)")
        bad = np.flatnonzero((gb != eb).any(axis=1))
        assert not bad.size, (f"{what}: blk beat {bad[0]} is {gb[bad[0]][0]:#010x} "
                              f"{gb[bad[0]][1]}, expected {eb[bad[0]][0]:#010x} "
                              f"{eb[bad[0]][1]} ({bad.size} differ)")


def random_jobs(rng, blocks, ks, rows_max=3):
    jobs = []
    for bs in blocks:
        for k in ks(bs):
            jobs.append((random_rows(rng, int(rng.integers(1, rows_max + 1)), k, bs), bs))
    rng.shuffle(jobs)
    return jobs


UNIT = RowQuantizer(max_block=256)


# -- tests --------------------------------------------------------------------------------------


def test_random_jobs():
    """Block sizes 16..256, k a multiple or not of the block (1 .. 2 blocks + 1), 1-3 rows,
    idle and back-pressure 0.3: every q and blk beat bit-exact, none lost or duplicated."""
    rng = np.random.default_rng(1)
    jobs = random_jobs(rng, (16, 32, 64, 128, 256),
                       lambda bs: sorted({1, 17, bs - 1, bs + 1, 2 * bs} if bs <= 64
                                         else {bs // 2 + 3, bs + 5}))
    check(simulate(UNIT, jobs, idle=0.3, backpressure=0.3, seed=1), jobs)


def test_special_blocks():
    """Only special blocks (zeros, -0, inf, NaN payloads, subnormals, tiny amax on both sides
    of 127 / FLT_MAX, FLT_MAX, representable amax, subnormal sa) and ties, block 16."""
    rng = np.random.default_rng(2)
    blocks = [special_block(rng, 16) for _ in range(60)] + [tie_block(rng, 16)
                                                             for _ in range(20)]
    A = np.concatenate(blocks).reshape(4, -1)
    jobs = [(A, 16), (A[:, :-5], 32)]
    check(simulate(UNIT, jobs, idle=0.2, backpressure=0.2, seed=2), jobs)


def test_scale_edges():
    """amax over the exponent range (subnormal sa, exponents 1..8 where sa becomes normal),
    the significands 1 and 2 - ulp, with a few multiples: sa and inv rounding corners."""
    rng = np.random.default_rng(3)
    blocks = []
    for e in list(range(0, 12)) + [100, 126, 127, 128, 200, 253, 254]:
        for mant in (0, 1, 0x7FFFFF, 0x7E0000, 0x7F0000, int(rng.integers(0, 1 << 23))):
            amax = np.uint32((e << 23) | mant).view(F32)
            v = F32(rng.uniform(-1, 1, 16)) * amax
            v[int(rng.integers(16))] = -amax
            blocks.append(v)
    A = np.concatenate(blocks).reshape(len(blocks) // 6, 96)
    jobs = [(A, 16)]
    check(simulate(UNIT, jobs, seed=3), jobs)


def test_heavy_pauses():
    """A starved input, a slow consumer, both."""
    rng = np.random.default_rng(4)
    for seed, (idle, bp) in enumerate([(0.8, 0.0), (0.0, 0.8), (0.6, 0.6)]):
        jobs = [(random_rows(rng, 2, 40, 16), 16), (random_rows(rng, 1, 70, 32), 32)]
        check(simulate(UNIT, jobs, idle=idle, backpressure=bp, seed=10 + seed), jobs)


def test_rate_and_latency():
    """Without pauses: one q beat per cycle and cycles_per_block per block in the steady
    state for block sizes 16, 32, 64, 256; the latency of the first block as documented."""
    rng = np.random.default_rng(5)
    for bs in (16, 32, 64, 256):
        blocks = 12 if bs < 256 else 4
        A = random_rows(rng, 1, blocks * bs, bs)
        run = simulate(UNIT, [(A, bs)], seed=5)
        check(run, [(A, bs)])
        qc = np.array(run.q_cycles[0])
        bc = np.array(run.blk_cycles[0])
        ac = np.array(run.a_cycles[0])
        assert np.all(np.diff(ac) == 1), "a waited"
        # the first block's first q beat, counted from the a transfer completing the block
        assert qc[0] - ac[bs - 1] == UNIT.latency, (bs, qc[0] - ac[bs - 1])
        assert run.q_offered[0][0] == qc[0]
        ends = qc[bs - 1::bs]
        per = np.diff(ends[2:])
        assert np.all(per == UNIT.cycles_per_block(bs)), (bs, per)
        assert np.all(np.diff(qc) == 1), "q paused"
        assert np.all(bc == ends + 1)                            # blk after its last q


def test_short_rows_rate():
    """k below the block: the q side (block_size beats per row) sets the pace."""
    rng = np.random.default_rng(6)
    A = random_rows(rng, 12, 5, 16)
    run = simulate(UNIT, [(A, 16)], seed=6)
    check(run, [(A, 16)])
    qc = np.array(run.q_cycles[0])
    assert np.all(np.diff(qc[16:]) == 1)


def test_control():
    """Empty jobs (k or rows 0: no beat, not busy), an illegal block_size register (acts as
    max_block), a start while busy (ignored), back to back with a normal job."""
    rng = np.random.default_rng(7)
    A = random_rows(rng, 2, 300, 256)
    B = random_rows(rng, 2, 50, 16)
    jobs = [(np.zeros((0, 5), F32), 16), (np.zeros((3, 0), F32), 16), (A, 256, 100), (B, 16)]
    run = simulate(UNIT, jobs, start_while_busy=True, seed=7)
    assert len(run.q[0]) == len(run.q[1]) == 0
    check(run, jobs)


def test_reset_mid_job():
    """A reset in the middle of a job drops everything: the next job is exact."""
    rng = np.random.default_rng(8)
    A = random_rows(rng, 2, 100, 32)
    unit = RowQuantizer(max_block=64)
    rng2 = np.random.default_rng(9)
    B = random_rows(rng2, 2, 70, 16)
    got = []

    async def tb(ctx):
        for job, cut in ((A, 120), (B, None)):
            rows, k = job.shape
            bs = 32 if job is A else 16
            ctx.set(unit.block_size, bs)
            ctx.set(unit.k, k)
            ctx.set(unit.rows, rows)
            ctx.set(unit.start, 1)
            await ctx.tick()
            ctx.set(unit.start, 0)
            words = job.view(np.uint32).reshape(-1)
            sent, qs, bl, cycle = 0, [], [], 0
            ctx.set(unit.q.ready, 1)
            ctx.set(unit.blk.ready, 1)
            while ctx.get(unit.busy):
                ctx.set(unit.a.valid, sent < len(words))
                if sent < len(words):
                    ctx.set(unit.a.payload, int(words[sent]))
                    if ctx.get(unit.a.ready):
                        sent += 1
                if ctx.get(unit.q.valid):
                    p = ctx.get(unit.q.payload)
                    qs.append((int(p.qa), int(p.block_last), int(p.row_last)))
                if ctx.get(unit.blk.valid):
                    p = ctx.get(unit.blk.payload)
                    bl.append((int(p.sa), int(p.asum)))
                await ctx.tick()
                cycle += 1
                if cut is not None and cycle == cut:
                    ctx.set(unit.a.valid, 0)
                    ctx.set(rst, 1)
                    await ctx.tick()
                    ctx.set(rst, 0)
                    assert not ctx.get(unit.busy)
                    assert not ctx.get(unit.q.valid) and not ctx.get(unit.blk.valid)
                    break
            got.append((np.array(qs).reshape(-1, 3), np.array(bl).reshape(-1, 2)))

    rst = Signal()
    sim = Simulator(ResetInserter(rst)(unit))
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    assert len(got[0][0]) > 0                                    # the cut was mid-job
    run = Run()
    run.q, run.blk = [got[1][0]], [got[1][1]]
    check(run, [(B, 16)])


@pytest.mark.slow
def test_random_jobs_large():
    """More of the same: block sizes up to 512, longer rows, more rows."""
    rng = np.random.default_rng(20)
    unit = RowQuantizer(max_block=512)
    jobs = random_jobs(rng, (16, 32, 64, 128, 256, 512),
                       lambda bs: sorted({3, bs - 1, 2 * bs + 7, 5 * bs}), rows_max=4)
    check(simulate(unit, jobs, idle=0.25, backpressure=0.25, seed=20), jobs)


def test_contract():
    """The documented numbers and the argument checks."""
    assert UNIT.cycles_per_block(16) == 16 and UNIT.cycles_per_block(256) == 256
    assert UNIT.latency == 32
    assert UNIT.asum_width == 17
    assert UNIT.q_beats(300, 2, 256) == 1024 and UNIT.blk_beats(300, 2, 256) == 4
    for mb in (16, 1024):
        RowQuantizer(max_block=mb)
    with pytest.raises(ValueError, match="max_block"):
        RowQuantizer(max_block=48)
    with pytest.raises(ValueError, match="max_block"):
        RowQuantizer(max_block=2048)
    with pytest.raises(TypeError, match="max_block"):
        RowQuantizer(max_block=256.0)
    with pytest.raises(TypeError, match="ecp5 must be a bool, not 1"):
        RowQuantizer(max_block=256, ecp5=1)
    with pytest.raises(ValueError, match="ecp5 needs max_block <= 256"):
        RowQuantizer(max_block=512, ecp5=True)
    prim = RowQuantizer(max_block=256, ecp5=True)
    assert (UNIT.ecp5, prim.ecp5) == (False, True)
    assert (prim.latency, prim.lane_latency, prim.asum_width) == (
        UNIT.latency, UNIT.lane_latency, UNIT.asum_width)
    with pytest.raises(ValueError, match="block_size"):
        UNIT.cycles_per_block(24)
    with pytest.raises(ValueError, match="block_size"):
        UNIT.cycles_per_block(512)


@pytest.mark.synth
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_synthesis(seed):
    """LFE5U-25F speed 6 after place and route, max_block 256, ``ecp5=True`` (the ring as a
    DP16KD instance, the product's three MULT18X18D instances with their registers).
    Measured (seeds 1, 2, 3): 1881 LUT4, 1448 FF, 3 DSP, 1 BRAM, 137.5 / 133.0 / 129.2 MHz;
    the ring's read (the DP16KD's clock-to-out, 5.6-5.8 ns in nextpnr's model, then the
    x0r register) is the critical path. Before (the DP16KD only, four inferred
    MULT18X18D): 1807 LUT4, 4 DSP, 132.4 MHz; ``ecp5=False``: 1973 LUT4, 119.2 MHz (the
    collision bypass Yosys adds after an inferred block RAM)."""
    from qaccel.synth import missing_tools, synthesize
    if missing_tools("ecp5-25k"):
        pytest.skip("YoWASP tools missing")
    r = synthesize(RowQuantizer(max_block=256, ecp5=True), target="ecp5-25k",
                   freq_mhz=150, seed=seed)
    print(r.summary())
    print(r.critical_path)
    assert r.dsp == 3 and r.bram == 1
    assert r.lut <= 2000
    assert r.fmax_mhz >= 125


_TB = """
`timescale 1ns/1ps
module tb;
  reg clk = 0, rst = 1, start = 0, a_valid = 0, q_ready = 0, blk_ready = 0, took = 0;
  reg [31:0] a_payload = 0;
  wire a_ready, q_valid, blk_valid, busy;
  wire [9:0] q_payload;
  wire [BW:0] blk_payload;
  reg [31:0] words [0:N - 1];
  integer sent = 0, cycle = 0, fq, fb;
  reg [31:0] lfsr = 32'h1234567;
  rq dut(.clk(clk), .rst(rst), .k(22'dK), .rows(22'dROWS), .block_size(16'dBS),
         .start(start), .a__payload(a_payload), .a__valid(a_valid), .a__ready(a_ready),
         .q__payload(q_payload), .q__valid(q_valid), .q__ready(q_ready),
         .blk__payload(blk_payload), .blk__valid(blk_valid), .blk__ready(blk_ready),
         .busy(busy));
  always #5 clk = ~clk;
  initial begin
    $readmemh("a.hex", words);
    fq = $fopen("q.txt", "w");
    fb = $fopen("blk.txt", "w");
    repeat (3) @(posedge clk);
    #1 rst = 0; start = 1;
    @(posedge clk);
    #1 start = 0;
    while ((busy || cycle < 4) && cycle < 400000) begin
      lfsr = {lfsr[30:0], lfsr[31] ^ lfsr[21] ^ lfsr[1] ^ lfsr[0]};
      if (!a_valid && sent < N && lfsr[3:2] != 0) begin
        a_valid = 1; a_payload = words[sent];
      end
      q_ready = lfsr[7:5] != 0;
      blk_ready = lfsr[11:10] != 0;
      #1;
      if (q_valid && q_ready) $fwrite(fq, "%0d %0d %0d\\n", $signed(q_payload[7:0]),
                                      q_payload[8], q_payload[9]);
      if (blk_valid && blk_ready) $fwrite(fb, "%0d %0d\\n", blk_payload[31:0],
                                          $signed(blk_payload[BW:32]));
      took = a_valid && a_ready;
      @(posedge clk);
      #1;
      if (took) begin
        sent = sent + 1; a_valid = 0;
      end
      cycle = cycle + 1;
    end
    $fclose(fq); $fclose(fb);
    $finish;
  end
endmodule
"""


@pytest.mark.sim
@needs_icarus
def test_ecp5_icarus(tmp_path):
    """``ecp5=True`` (the ring as a DP16KD instance, the product's MULT18X18D instances) on
    Icarus with models of the cells: a random job under idle and back-pressure, bit-exact."""
    from amaranth.back import verilog
    rng = np.random.default_rng(30)
    A = random_rows(rng, 3, 200, 64)
    unit = RowQuantizer(max_block=256, ecp5=True)
    rq = verilog.convert(unit, name="rq", emit_src=False)
    assert rq.count("MULT18X18D") == 3 and rq.count("DP16KD") == 1
    words = A.view(np.uint32).reshape(-1)
    (tmp_path / "a.hex").write_text("".join(f"{w:08x}\n" for w in words))
    tb = (_TB.replace("BW", str(31 + unit.asum_width)).replace("ROWS", str(A.shape[0]))
          .replace("N", str(len(words))).replace("K", str(A.shape[1]))
          .replace("BS", "64"))
    run_icarus(tmp_path, {"tb.v": tb, "rq.v": rq, "dp16kd.v": DP16KD_MODEL,
                          "mult.v": mult18x18d_model()})
    run = Run()
    run.q = [np.loadtxt(tmp_path / "q.txt", dtype=np.int64, ndmin=2).reshape(-1, 3)]
    run.blk = [np.loadtxt(tmp_path / "blk.txt", dtype=np.int64, ndmin=2).reshape(-1, 2)]
    check(run, [(A, 64)])
