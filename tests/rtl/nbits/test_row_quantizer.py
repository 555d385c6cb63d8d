# amaranth: UnusedElaboratable=no
"""The v2 row quantiser (qaccel.rtl.nbits.row_quantizer) on Amaranth's simulator: random jobs
(several
k, block sizes 16..256, k not a multiple of the block, several rows per job) and special blocks
(zeros, -0, subnormal and tiny amax where 127 / amax overflows, inf, NaN, ties of a * inv,
exactly representable amax) under random idle on ``a`` and back-pressure on ``q`` and ``blk``,
bit-exact against quantize_a, every beat counted; the steady-state rate per block and the
latency without pauses; empty jobs, a start while busy, reset; argument errors; synthesis.

The block-floating-point mode (``bfp=True``, ``fmode`` jobs) the same way against the golden
model's float_operands (docs/matmul_nbits_v2.md, section 2): random and edge blocks (zeros,
-0, subnormals, the E_MIN = -97 clamp, FLT_MAX, inf / NaN, digits -128 and +-64, powers of
two), int8 and bfp jobs mixed on one unit, rate, latency and job_cycles measured, reset."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.hdl import ResetInserter, Signal
from amaranth.sim import Simulator

from qaccel.model import nbits
from qaccel.model.nbits_hw import E_MIN, float_operands
from qaccel.model.nbits_kernels import quantize_a
from qaccel.rtl.nbits.row_quantizer import RowQuantizer

from ..ecp5_models import DP16KD_MODEL, mult18x18d_model, needs_icarus, run_icarus

F32 = np.float32
FLT_MAX = F32(np.finfo(F32).max)
NAN_BITS = (0x7FC00000, 0xFFC00000, 0x7FA00001, 0xFF812345, 0x7FFFFFFF)
NON_FINITE_BITS = (0x7F800000, 0xFF800000, *NAN_BITS)


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
    """quantize_a's results as the unit's beats: q (qa, block_last, row_last, digit 0) per
    padded element, blk (sa code, asum) per block."""
    rows, k = A.shape
    kb = -(-k // block_size)
    with np.errstate(all="ignore"):
        qa, sa, _ = quantize_a(np.ascontiguousarray(A), block_size)
    pad = np.zeros((rows, kb * block_size), np.int64)
    pad[:, :k] = qa.astype(np.int64)
    n = rows * kb * block_size
    i = np.arange(n)
    q = np.stack([pad.reshape(-1), (i % block_size == block_size - 1),
                  (i % (kb * block_size) == kb * block_size - 1), np.zeros(n, np.int64)],
                 axis=1).astype(np.int64)
    blk = np.stack([sa.view(np.uint32).reshape(-1).astype(np.int64),
                    pad.reshape(rows * kb, block_size).sum(axis=1)], axis=1)
    return q, blk


def bfp_operands(A: np.ndarray, block_size: int):
    """The golden model's block floating point of ``A`` (rows, k): ``float_operands`` of a
    MatMulNBits op of K = k (one column, 4-bit zero codes: only its A side is used);
    ``(e (rows, kb), sa (rows, kb, 4) float32, x (rows, kb, 4, block_size) int8)``."""
    rows, k = A.shape
    kb = -(-k // block_size)
    op = nbits.NBitsArgs(np.zeros((1, kb, block_size // 2), np.uint8), np.ones((1, kb), F32), None,
                   None, K=k, N=1, bits=4, block_size=block_size, dtype=np.dtype(F32))
    fo = float_operands(np.ascontiguousarray(A), op)
    return fo.e, fo.sa, fo.x


def expected_bfp(A: np.ndarray, block_size: int):
    """float_operands' results as the unit's beats in bfp mode: per row, block and digit
    ``i``, ``block_size`` q beats (x_i, block_last, row_last on the row's last block's digit
    3, i) and one blk beat (sa_i code, sum of x_i)."""
    if not A.size:
        return np.zeros((0, 4), np.int64), np.zeros((0, 2), np.int64)
    _, sa, x = bfp_operands(A, block_size)
    rows, kb = sa.shape[:2]
    bs = block_size
    j = np.broadcast_to(np.arange(bs), x.shape)
    i = np.broadcast_to(np.arange(4)[:, None], x.shape)
    b = np.broadcast_to(np.arange(kb)[:, None, None], x.shape)
    q = np.stack([x.astype(np.int64), j == bs - 1, (j == bs - 1) & (i == 3) & (b == kb - 1),
                  i], axis=-1).reshape(-1, 4).astype(np.int64)
    blk = np.stack([sa.view(np.uint32).astype(np.int64),
                    x.astype(np.int64).sum(axis=3)], axis=-1).reshape(-1, 2)
    return q, blk


# -- simulation --------------------------------------------------------------------------------


class Run:
    """What a simulation recorded: per job the q and blk beats and their cycles, the a
    transfer cycles, the cycles from ``start`` to ``busy`` low; the total cycles."""

    def __init__(self):
        self.q, self.blk, self.a_cycles, self.q_cycles, self.blk_cycles = [], [], [], [], []
        self.q_offered = []                                      # cycles q.valid was high
        self.busy_cycles = []
        self.job_cycles = []


def simulate(unit: RowQuantizer, jobs, *, idle=0.0, backpressure=0.0, seed=0,
             start_while_busy=False, reset_at=None, max_cycles=400_000, modes=None) -> Run:
    """Run ``jobs`` (``(A, block_size)`` pairs, or ``(A, block_size, register)`` to set the
    register to another value) back to back; ``a`` idles with probability ``idle`` per beat,
    ``q`` and ``blk`` withhold ready with probability ``backpressure`` per cycle. ``modes``:
    per job whether it is a block-floating-point job (``fmode``; default all int8)."""
    rng = np.random.default_rng(seed)
    run = Run()
    modes = [False] * len(jobs) if modes is None else modes

    async def tb(ctx):
        cycle = 0
        for job, bfp in zip(jobs, modes, strict=True):
            A, bs = job[0], job[1]
            reg = job[2] if len(job) > 2 else bs
            rows, k = A.shape
            words = A.view(np.uint32).reshape(-1)
            n_q = unit.q_beats(k, rows, bs, bfp=bfp)
            n_blk = unit.blk_beats(k, rows, bs, bfp=bfp)
            q, blk, ac, qc, bc, qo = [], [], [], [], [], []
            ctx.set(unit.block_size, reg)
            ctx.set(unit.k, k)
            ctx.set(unit.rows, rows)
            if unit.bfp:
                ctx.set(unit.fmode, bfp)
            ctx.set(unit.start, 1)
            t0 = cycle
            await ctx.tick()
            cycle += 1
            ctx.set(unit.start, 0)
            if start_while_busy and n_q:                         # ignored: busy is high
                assert ctx.get(unit.busy)
                ctx.set(unit.k, 1)
                if unit.bfp:
                    ctx.set(unit.fmode, not bfp)
                ctx.set(unit.start, 1)
                await ctx.tick()
                cycle += 1
                ctx.set(unit.start, 0)
                ctx.set(unit.k, k)
                if unit.bfp:
                    ctx.set(unit.fmode, bfp)
            sent = 0
            a_on = False
            while len(q) < n_q or len(blk) < n_blk or ctx.get(unit.busy):
                if reset_at is not None and cycle == reset_at:
                    run.q.append(np.array(q, np.int64).reshape(-1, 4))
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
                        q.append((int(p.qa), int(p.block_last), int(p.row_last),
                                  int(p.digit)))
                        qc.append(cycle)
                if ctx.get(unit.blk.valid) and b_rdy:
                    p = ctx.get(unit.blk.payload)
                    blk.append((int(p.sa), int(p.asum)))
                    bc.append(cycle)
                await ctx.tick()
                cycle += 1
                assert cycle < max_cycles, "stalled"
            run.job_cycles.append(cycle - t0)
            ctx.set(unit.a.valid, 0)
            assert sent == len(words), f"{sent} of {len(words)} a beats taken"
            for _ in range(4):                                   # nothing late
                ctx.set(unit.q.ready, 1)
                ctx.set(unit.blk.ready, 1)
                assert not ctx.get(unit.q.valid) and not ctx.get(unit.blk.valid)
                await ctx.tick()
                cycle += 1
            run.q.append(np.array(q, np.int64).reshape(-1, 4))
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


def check(run: Run, jobs, modes=None):
    """Every beat of every job bit-exact and counted (``modes``: as :func:`simulate`)."""
    modes = [False] * len(jobs) if modes is None else modes
    for j, (job, bfp) in enumerate(zip(jobs, modes, strict=True)):
        A, bs = job[0], job[1]
        eq, eb = expected_bfp(A, bs) if bfp else expected(A, bs)
        what = f"job {j}: {'bfp' if bfp else 'int8'} block {bs} k {A.shape[1]} rows {A.shape[0]}"
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
UNIT_BFP = RowQuantizer(max_block=256, bfp=True)


# -- block floating point data -------------------------------------------------------------------


def digit_block(rng, n: int) -> np.ndarray:
    """A block of exponent ``e`` (random, -97 .. 127; one element +-2**e or +-(2 - ulp) 2**e,
    giving X = +-2**29 or +-(2**30 - 64), x3 = +-64) whose other elements are exact
    ``X * 2**(e - 29)`` with bytes 0x80, 0x7F, 0x00, 0x81, 0xFF or random in X (digits -128,
    127, ...), shifted by 0..6 bits."""
    e = int(rng.choice([E_MIN, E_MIN + 1, 127, int(rng.integers(E_MIN, 128))]))
    byte = rng.choice([0x80, 0x7F, 0x00, 0x81, 0xFF, -1], (n, 3))
    byte = np.where(byte < 0, rng.integers(0, 256, (n, 3)), byte)
    v = byte[:, 0] | (byte[:, 1] << 8) | (byte[:, 2] << 16)
    X = (v << rng.integers(0, 7, n)) * rng.choice([-1, 1], n)
    a = (X * 2.0 ** (e - 29)).astype(F32)
    top = rng.choice([1.0, 2 - 2.0 ** -23]) * 2.0 ** e * rng.choice([-1, 1])
    a[int(rng.integers(n))] = F32(top)
    return a


def tiny_block(rng, n: int) -> np.ndarray:
    """Blocks around the E_MIN clamp: largest biased exponent 28 .. 32 (e = -99 .. -95),
    values near 2**-126, subnormals, or subnormals only."""
    kind = int(rng.integers(0, 3))
    if kind == 0:                                                # amax near 2**-97
        hi = int(rng.integers(28, 33))
        exp = rng.integers(0, hi + 1, n)
        exp[int(rng.integers(n))] = hi
    elif kind == 1:                                              # near 2**-126
        exp = rng.integers(0, 4, n)
    else:                                                        # subnormals only
        exp = np.zeros(n, np.int64)
    bits = (exp << 23) | rng.integers(0, 1 << 23, n) | (rng.integers(0, 2, n) << 31)
    return bits.astype(np.uint32).view(F32).copy()


def special_bfp_block(rng, n: int) -> np.ndarray:
    """Zeros and -0, inf / -inf / NaN mixed in, non-finite values among zeros only, FLT_MAX,
    exact powers of two over the whole range (subnormal ones too)."""
    kind = int(rng.integers(0, 5))
    v = F32(rng.standard_normal(n) * 10.0 ** rng.uniform(-30, 30))
    if kind == 0:                                                # zeros, some -0
        v[:] = 0
        v[rng.random(n) < 0.5] = F32(-0.0)
    elif kind == 1:                                              # inf, -inf, NaNs mixed in
        for _ in range(int(rng.integers(1, 4))):
            v.view(np.uint32)[int(rng.integers(n))] = rng.choice(NON_FINITE_BITS)
    elif kind == 2:                                              # non-finite among zeros
        v[:] = 0
        v.view(np.uint32)[int(rng.integers(n))] = rng.choice(NON_FINITE_BITS)
        if rng.random() < 0.5:
            v.view(np.uint32)[int(rng.integers(n))] = 1         # the smallest subnormal
    elif kind == 3:                                              # FLT_MAX and huge values
        v = F32(F32(rng.uniform(-1, 1, n)) * FLT_MAX)
        v[int(rng.integers(n))] = FLT_MAX * rng.choice([-1, 1])
    else:                                                        # powers of two
        v = F32(np.ldexp(rng.choice([-1.0, 1.0], n), rng.integers(-149, 128, n)))
    return v


def random_bfp_block(rng, n: int) -> np.ndarray:
    """One block of ``n`` float32 for the block-floating-point mode, of one of several
    kinds."""
    kind = int(rng.integers(0, 7))
    if kind == 0:
        return digit_block(rng, n)
    if kind == 1:
        return tiny_block(rng, n)
    if kind == 2:
        return special_bfp_block(rng, n)
    if kind == 3:                                                # random bit patterns
        return rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32).view(F32).copy()
    if kind == 4:                                                # few non-zeros
        v = np.zeros(n, F32)
        idx = rng.integers(0, n, max(1, n // 8))
        v[idx] = F32(rng.standard_normal(idx.size) * 10.0 ** rng.integers(-30, 30))
        return v
    return F32(rng.standard_normal(n) * 10.0 ** rng.uniform(-36, 37))


def random_bfp_rows(rng, rows: int, k: int, block_size: int) -> np.ndarray:
    """``(rows, k)`` float32 made of :func:`random_bfp_block` blocks."""
    kb = -(-k // block_size)
    A = np.empty((rows, kb * block_size), F32)
    for r in range(rows):
        for b in range(kb):
            A[r, b * block_size:(b + 1) * block_size] = random_bfp_block(rng, block_size)
    return np.ascontiguousarray(A[:, :k])


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


def reset_mid_job(unit: RowQuantizer, jobs, cut: int, modes):
    """Run ``jobs[0]`` (``(A, block_size)``), reset the unit ``cut`` cycles after its start,
    then run the others to the end; check that the first one had given beats and that the
    others are exact (``modes``: as :func:`simulate`)."""
    got = []

    async def tb(ctx):
        for j, ((job, bs), bfp) in enumerate(zip(jobs, modes, strict=True)):
            rows, k = job.shape
            ctx.set(unit.block_size, bs)
            ctx.set(unit.k, k)
            ctx.set(unit.rows, rows)
            if unit.bfp:
                ctx.set(unit.fmode, bfp)
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
                    qs.append((int(p.qa), int(p.block_last), int(p.row_last), int(p.digit)))
                if ctx.get(unit.blk.valid):
                    p = ctx.get(unit.blk.payload)
                    bl.append((int(p.sa), int(p.asum)))
                await ctx.tick()
                cycle += 1
                if j == 0 and cycle == cut:
                    ctx.set(unit.a.valid, 0)
                    ctx.set(rst, 1)
                    await ctx.tick()
                    ctx.set(rst, 0)
                    assert not ctx.get(unit.busy)
                    assert not ctx.get(unit.q.valid) and not ctx.get(unit.blk.valid)
                    break
            got.append((np.array(qs).reshape(-1, 4), np.array(bl).reshape(-1, 2)))

    rst = Signal()
    sim = Simulator(ResetInserter(rst)(unit))
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    assert len(got[0][0]) > 0                                    # the cut was mid-job
    run = Run()
    run.q, run.blk = [g[0] for g in got[1:]], [g[1] for g in got[1:]]
    check(run, jobs[1:], modes[1:])


def test_reset_mid_job():
    """A reset in the middle of a job drops everything: the next job is exact."""
    rng = np.random.default_rng(8)
    A = random_rows(rng, 2, 100, 32)
    rng2 = np.random.default_rng(9)
    B = random_rows(rng2, 2, 70, 16)
    reset_mid_job(RowQuantizer(max_block=64), [(A, 32), (B, 16)], 120, [False, False])


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


# -- block floating point -------------------------------------------------------------------------


def test_bfp_reference():
    """The reference the bfp tests use: float_operands' e, sa and x as the contract states
    them, recomputed here in NumPy (frexp-free: from the bit patterns) on the edge blocks."""
    rng = np.random.default_rng(40)
    bs = 16
    A = np.concatenate([f(rng, bs) for f in (digit_block, tiny_block, special_bfp_block)
                        for _ in range(30)]).reshape(6, -1)[:, :-3]
    e, sa, x = bfp_operands(A, bs)
    rows, k = A.shape
    a = np.zeros((rows, e.shape[1] * bs), F32)
    a[:, :k] = A
    a = a.reshape(rows, -1, bs)
    bits = a.view(np.uint32)
    exp = (bits >> 23) & 0xFF
    finite = exp != 0xFF
    want_e = np.maximum(np.where(finite, exp, 0).max(axis=2).astype(np.int64), 30) - 127
    np.testing.assert_array_equal(e, want_e)
    a64 = np.where(finite, a, 0).astype(np.float64)
    X = np.trunc(a64 * np.ldexp(1.0, 29 - want_e)[..., None]).astype(np.int64)
    for i in range(3):
        xi = ((X + 128) % 256) - 128
        np.testing.assert_array_equal(x[:, :, i], xi)
        X = (X - xi) // 256
    np.testing.assert_array_equal(x[:, :, 3], X)
    codes = ((want_e[..., None] + 127 - 29 + 8 * np.arange(4)) << 23).astype(np.uint32)
    codes[~finite.all(axis=2)] = 0x7FC00000
    np.testing.assert_array_equal(sa.view(np.uint32), codes)
    # the edge cases are there: digits -128 and +-64, the clamp, NaN scales, e up to 127
    assert (x[:, :, :3] == -128).any() and (x[:, :, 3] == 64).any() and (x[:, :, 3] == -64).any()
    assert (e == E_MIN).any() and (e == 127).any() and (codes == 0x7FC00000).any()


def test_bfp_random_jobs():
    """Block sizes 16..256, k a multiple or not of the block, 1-3 rows, bfp and int8 jobs in
    random order on one ``bfp=True`` unit, idle and back-pressure 0.3: every q and blk beat
    bit-exact against float_operands (bfp) or quantize_a (int8, digit 0), none lost or
    duplicated, in order."""
    rng = np.random.default_rng(41)
    jobs, modes = [], []
    for bs in (16, 32, 64, 128, 256):
        for k in (sorted({1, 17, bs - 1, 2 * bs}) if bs <= 64 else [bs + 5 if bs < 256
                                                                       else bs // 2 + 3]):
            bfp = bool(rng.random() < 0.75)
            rows = int(rng.integers(1, 4 if bs <= 64 else 3))
            jobs.append(((random_bfp_rows if bfp else random_rows)(rng, rows, k, bs), bs))
            modes.append(bfp)
    order = rng.permutation(len(jobs))
    jobs, modes = [jobs[i] for i in order], [modes[i] for i in order]
    check(simulate(UNIT_BFP, jobs, idle=0.3, backpressure=0.3, seed=41, modes=modes), jobs,
          modes)


def test_bfp_edge_blocks():
    """Only edge blocks (digits -128 / +-64, the E_MIN clamp and 2**-126, subnormals, zeros
    and -0, inf / NaN mixed in, FLT_MAX, powers of two), blocks 16 and 32 (k not a multiple:
    the last block padded), under idle and back-pressure."""
    rng = np.random.default_rng(42)
    blocks = [f(rng, 16) for f in (digit_block, tiny_block, special_bfp_block)
              for _ in range(20)]
    A = np.concatenate(blocks).reshape(4, -1)
    e, sa, x = bfp_operands(A, 16)
    assert (x[:, :, :3] == -128).any() and (x[:, :, 3] == 64).any() and (x[:, :, 3] == -64).any()
    assert (e == E_MIN).any() and (e == 127).any() and np.isnan(sa).any()
    jobs = [(A, 16), (A[:2, :-5], 32)]
    check(simulate(UNIT_BFP, jobs, idle=0.2, backpressure=0.2, seed=42, modes=[True, True]),
          jobs, [True, True])


def test_bfp_heavy_pauses():
    """A starved input, a slow consumer, both (bfp jobs)."""
    rng = np.random.default_rng(43)
    for seed, (idle, bp) in enumerate([(0.8, 0.0), (0.0, 0.8), (0.6, 0.6)]):
        jobs = [(random_bfp_rows(rng, 2, 40, 16), 16), (random_bfp_rows(rng, 1, 40, 32), 32)]
        check(simulate(UNIT_BFP, jobs, idle=idle, backpressure=bp, seed=50 + seed,
                       modes=[True, True]), jobs, [True, True])


def test_bfp_rate_and_latency():
    """Without pauses: one q beat per cycle from the first, 4 * block_size cycles per block
    (cycles_per_block), the blk beat of each pass in the cycle after its last q beat, the
    first q beat bfp_latency (18) cycles after the a transfer completing the block."""
    rng = np.random.default_rng(44)
    for bs in (16, 64, 256):
        A = random_bfp_rows(rng, 1, (6 if bs < 256 else 3) * bs, bs)
        run = simulate(UNIT_BFP, [(A, bs)], seed=44, modes=[True])
        check(run, [(A, bs)], [True])
        qc, bc, ac = (np.array(c[0]) for c in (run.q_cycles, run.blk_cycles, run.a_cycles))
        assert qc[0] - ac[bs - 1] == UNIT_BFP.bfp_latency, (bs, qc[0] - ac[bs - 1])
        assert run.q_offered[0][0] == qc[0]
        assert np.all(np.diff(qc) == 1), "q paused"
        ends = qc[bs - 1::bs]                                    # each pass's last beat
        assert np.all(bc == ends + 1)                            # blk after its last q
        assert np.all(np.diff(ends[3::4]) == UNIT_BFP.cycles_per_block(bs, bfp=True))
        if bs == 256:                                            # the ring holds two
            assert np.diff(ac).max() > 1                         # blocks: a waits
        assert run.job_cycles[0] == UNIT_BFP.job_cycles(A.shape[1], 1, bs, bfp=True)


@pytest.mark.parametrize(("bfp", "shapes"), [
    (True, [(16, 1, 16), (5, 3, 16), (40, 2, 16), (100, 2, 32), (64, 1, 64), (300, 1, 256)]),
    (False, [(16, 1, 16), (40, 2, 16), (64, 3, 32), (256, 2, 256)]),
])
def test_job_cycles(bfp, shapes):
    """job_cycles equals the measured cycles from start to busy low (nothing waits), bfp jobs
    (k below, at and not a multiple of the block, several rows) and int8 jobs (k a multiple
    of the block) on the bfp=True unit, and the int8 ones on the bfp=False unit too."""
    rng = np.random.default_rng(45)
    jobs = [((random_bfp_rows if bfp else random_rows)(rng, rows, k, bs), bs)
            for k, rows, bs in shapes]
    units = [UNIT_BFP] if bfp else [UNIT_BFP, UNIT]
    for unit in units:
        run = simulate(unit, jobs, seed=45, modes=[bfp] * len(jobs))
        check(run, jobs, [bfp] * len(jobs))
        want = [unit.job_cycles(k, rows, bs, bfp=bfp) for k, rows, bs in shapes]
        assert run.job_cycles == want, (unit.bfp, run.job_cycles, want)


def test_bfp_control():
    """On a bfp=True unit: empty bfp jobs (no beat), an int8 job with an illegal block_size
    register (acts as max_block), bfp and int8 jobs back to back, a start while busy (with
    the other mode: ignored)."""
    rng = np.random.default_rng(46)
    A = random_rows(rng, 2, 300, 256)
    B = random_bfp_rows(rng, 2, 50, 16)
    C = random_rows(rng, 1, 40, 16)
    D = random_bfp_rows(rng, 1, 300, 256)
    jobs = [(np.zeros((0, 5), F32), 16), (np.zeros((3, 0), F32), 16), (A, 256, 100), (B, 16),
            (C, 16), (D, 256, 48)]
    modes = [True, True, False, True, False, True]
    run = simulate(UNIT_BFP, jobs, start_while_busy=True, seed=46, modes=modes)
    assert len(run.q[0]) == len(run.q[1]) == 0
    check(run, jobs, modes)


def test_bfp_reset_mid_job():
    """A reset in the middle of a bfp job (during the passes over a block) drops
    everything: the next bfp and int8 jobs are exact."""
    rng = np.random.default_rng(47)
    A = random_bfp_rows(rng, 2, 100, 32)
    B = random_bfp_rows(rng, 2, 70, 16)
    C = random_rows(rng, 1, 40, 16)
    reset_mid_job(RowQuantizer(max_block=64, bfp=True), [(A, 32), (B, 16), (C, 16)], 150,
                  [True, True, False])


def test_bfp_contract():
    """The bfp figures and argument checks; bfp=False has no fmode and no bfp logic."""
    from amaranth.back import rtlil
    u = UNIT_BFP
    assert u.bfp and not UNIT.bfp
    assert u.bfp_latency == 18 and u.latency == UNIT.latency == 32
    assert u.cycles_per_block(16, bfp=True) == 64 and u.cycles_per_block(16) == 16
    assert u.q_beats(300, 2, 256, bfp=True) == 4096 and u.blk_beats(300, 2, 256, bfp=True) == 16
    assert u.q_beats(300, 2, 256) == 1024 and u.blk_beats(300, 2, 256) == 4
    assert u.job_cycles(300, 2, 256, bfp=True) == 256 + 18 + 4096 + 1
    assert u.job_cycles(300, 2, 256) == UNIT.job_cycles(300, 2, 256) == 1024 + 32 + 256 + 1
    assert u.asum_width == UNIT.asum_width
    assert hasattr(u, "fmode") and not hasattr(UNIT, "fmode")
    assert "digit" in u.q.payload.shape().members and "digit" in UNIT.q.payload.shape().members
    with pytest.raises(TypeError, match="bfp must be a bool, not 1"):
        RowQuantizer(bfp=1)
    with pytest.raises(ValueError, match="bfp=True needs a unit built with bfp=True"):
        UNIT.job_cycles(16, 1, 16, bfp=True)
    with pytest.raises(ValueError, match="bfp=True needs a unit built with bfp=True"):
        UNIT.cycles_per_block(16, bfp=True)
    with pytest.raises(TypeError, match="bfp must be a bool, not 'yes'"):
        u.q_beats(16, 1, 16, bfp="yes")
    with pytest.raises(ValueError, match="block_size"):
        u.cycles_per_block(24, bfp=True)
    with pytest.raises(ValueError, match="k"):
        u.job_cycles(-1, 1, 16, bfp=True)
    small = rtlil.convert(RowQuantizer(max_block=16), name="rq", emit_src=False)
    assert "r_dig" not in small and "b4_x" not in small
    assert "r_dig" in rtlil.convert(RowQuantizer(max_block=16, bfp=True), name="rq",
                                    emit_src=False)


@pytest.mark.slow
def test_bfp_random_jobs_large():
    """More of the same: block sizes up to 512, longer rows, more rows, bfp and int8 jobs
    mixed, idle and back-pressure 0.25."""
    rng = np.random.default_rng(48)
    unit = RowQuantizer(max_block=512, bfp=True)
    jobs, modes = [], []
    for bs in (16, 32, 64, 128, 256, 512):
        for k in sorted({3, bs - 1, 2 * bs + 7, 5 * bs}):
            bfp = bool(rng.random() < 0.75)
            rows = int(rng.integers(1, 5))
            jobs.append(((random_bfp_rows if bfp else random_rows)(rng, rows, k, bs), bs))
            modes.append(bfp)
    check(simulate(unit, jobs, idle=0.25, backpressure=0.25, seed=48, modes=modes,
                   max_cycles=2_000_000), jobs, modes)


@pytest.mark.synth
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_synthesis(seed):
    """LFE5U-25F speed 6 after place and route, max_block 256, ``ecp5=True`` (the ring as a
    DP16KD instance, the product's three MULT18X18D instances with their registers).
    Measured (seeds 1, 2, 3): 1881 LUT4, 1448 FF, 3 DSP, 1 BRAM, 137.5 / 133.0 / 129.2 MHz;
    the ring's read (the DP16KD's clock-to-out, 5.6-5.8 ns in nextpnr's model, then the
    x0r register) is the critical path. Before (the DP16KD only, four inferred
    MULT18X18D): 1807 LUT4, 4 DSP, 132.4 MHz; ``ecp5=False``: 1973 LUT4, 119.2 MHz (the
    collision bypass Yosys adds after an inferred block RAM). Again with Yosys 0.70: the
    same build 2027 LUT4, 1476 FF, 137.3 / 135.4 / 129.2 MHz; with the q payload's
    ``digit`` field (two constant bits, the logic otherwise the same) 2064 LUT4, 1488 FF,
    128.6 / 136.8 / 141.6 MHz (seeds 4-6: 132.0 / 124.5 / 133.6), the ring's read or the
    writer's running maximum critical."""
    from qaccel.eda.synth import missing_tools, synthesize
    if missing_tools("ecp5-25k"):
        pytest.skip("YoWASP tools missing")
    r = synthesize(RowQuantizer(max_block=256, ecp5=True), target="ecp5-25k",
                   freq_mhz=150, seed=seed)
    print(r.summary())
    print(r.critical_path)
    assert r.dsp == 3 and r.bram == 1
    assert r.lut <= 2100
    assert r.fmax_mhz >= 125


@pytest.mark.synth
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_synthesis_bfp(seed):
    """As :func:`test_synthesis` with the block-floating-point mode (``bfp=True``).
    Measured (Yosys 0.70, seeds 1, 2, 3): 2337 LUT4, 1663 FF, 3 DSP, 1 BRAM, 119.4 / 137.1 /
    133.7 MHz (seeds 4-6: 134.4 / 139.7 / 128.0), i.e. 273 LUT4 and 175 FF over
    ``bfp=False`` at the same Fmax spread; critical: the ring's read, the writer's running
    maximum (shared with int8; seed 1) or a DSP operand. Before the product served as the
    shifter (a two-stage 30-bit barrel shifter, the scale entry muxed at its register):
    2425 LUT4, 1682 FF, 129.0 MHz (seed 1)."""
    from qaccel.eda.synth import missing_tools, synthesize
    if missing_tools("ecp5-25k"):
        pytest.skip("YoWASP tools missing")
    r = synthesize(RowQuantizer(max_block=256, bfp=True, ecp5=True), target="ecp5-25k",
                   freq_mhz=150, seed=seed)
    print(r.summary())
    print(r.critical_path)
    assert r.dsp == 3 and r.bram == 1
    assert r.lut <= 2400
    assert r.fmax_mhz >= 115


_TB = """
`timescale 1ns/1ps
module tb;
  reg clk = 0, rst = 1, start = 0, a_valid = 0, q_ready = 0, blk_ready = 0, took = 0;
  reg [31:0] a_payload = 0;
  wire a_ready, q_valid, blk_valid, busy;
  wire [11:0] q_payload;
  wire [BW:0] blk_payload;
  reg [31:0] words [0:N - 1];
  integer sent = 0, cycle = 0, fq, fb;
  reg [31:0] lfsr = 32'h1234567;
  rq dut(.clk(clk), .rst(rst), .k(22'dK), .rows(22'dROWS), .block_size(16'dBS),FMODE
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
      if (q_valid && q_ready) $fwrite(fq, "%0d %0d %0d %0d\\n", $signed(q_payload[7:0]),
                                      q_payload[8], q_payload[9], q_payload[11:10]);
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
@pytest.mark.parametrize("bfp", [False, True])
def test_ecp5_icarus(tmp_path, bfp):
    """``ecp5=True`` (the ring as a DP16KD instance, the product's MULT18X18D instances) on
    Icarus with models of the cells: a random job under idle and back-pressure, bit-exact;
    with ``bfp`` a block-floating-point job on a ``bfp=True`` unit."""
    from amaranth.back import verilog
    rng = np.random.default_rng(30)
    A = random_bfp_rows(rng, 2, 150, 64) if bfp else random_rows(rng, 3, 200, 64)
    unit = RowQuantizer(max_block=256, ecp5=True, bfp=bfp)
    rq = verilog.convert(unit, name="rq", emit_src=False)
    assert rq.count("MULT18X18D") == 3 and rq.count("DP16KD") == 1
    words = A.view(np.uint32).reshape(-1)
    (tmp_path / "a.hex").write_text("".join(f"{w:08x}\n" for w in words))
    tb = (_TB.replace("FMODE", "\n         .fmode(1'b1)," if bfp else "")
          .replace("BW", str(31 + unit.asum_width)).replace("ROWS", str(A.shape[0]))
          .replace("N", str(len(words))).replace("K", str(A.shape[1]))
          .replace("BS", "64"))
    run_icarus(tmp_path, {"tb.v": tb, "rq.v": rq, "dp16kd.v": DP16KD_MODEL,
                          "mult.v": mult18x18d_model()})
    run = Run()
    run.q = [np.loadtxt(tmp_path / "q.txt", dtype=np.int64, ndmin=2).reshape(-1, 4)]
    run.blk = [np.loadtxt(tmp_path / "blk.txt", dtype=np.int64, ndmin=2).reshape(-1, 2)]
    check(run, [(A, 64)], [bfp])
