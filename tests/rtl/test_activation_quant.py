# amaranth: UnusedElaboratable=no
"""The CompInt8 activation quantiser (qaccel.rtl.activation_quant) on Verilator
(qaccel.sim.streamsim): random jobs (ties, zeros, subnormals, huge values, garbage past k)
for every block size under idle cycles and back-pressure, bit-exact against the golden model's
quantize_a; non-finite blocks; empty jobs and illegal block sizes; throughput and latency
without pauses; on Amaranth's simulator a start while busy; argument errors."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.sim import Simulator

from qaccel.model.nbits_kernels import quantize_a
from qaccel.rtl.activation_quant import ActivationQuant
from qaccel.sim.runner import missing_simulator
from qaccel.sim.streamsim import Segment, StreamSim

pytestmark = [
    pytest.mark.sim,
    pytest.mark.skipif(missing_simulator("verilator") is not None,
                       reason=missing_simulator("verilator") or ""),
]

F32 = np.float32
FLT_MAX = F32(np.finfo(F32).max)


def _tiny() -> np.float32:
    """The smallest float32 amax whose inverse f32(127 / amax) is finite (about 3.7e-37)."""
    with np.errstate(over="ignore"):
        x = F32(127 / float(FLT_MAX))
        while np.isfinite(F32(127) / x):
            x = np.nextafter(x, F32(0))
        while not np.isfinite(F32(127) / x):
            x = np.nextafter(x, F32(1))
    return x


#: Below this amax (and above 0), 127 / amax overflows: quantize_a's qa is then +-inf or NaN.
TINY = _tiny()
BLOCKS = (16, 32, 64, 128, 256)
KS = (16, 40, 100, 256, 300)
NAN_BITS = np.array([0x7FC00000, 0xFFC00000, 0x7FA00001, 0xFF812345, 0x7FFFFFFF], np.uint32)

_SIMS: dict[tuple[int, int], tuple[ActivationQuant, StreamSim]] = {}


def quantiser(simd: int, max_block: int = 256) -> tuple[ActivationQuant, StreamSim]:
    """Return the unit and its Verilator build (built once per session, cached on disk)."""
    key = (simd, max_block)
    if key not in _SIMS:
        unit = ActivationQuant(simd=simd, max_block=max_block)
        _SIMS[key] = unit, StreamSim(unit, name=f"activation_quant_s{simd}_b{max_block}")
    return _SIMS[key]


# -- data -----------------------------------------------------------------------------------


def tie_block(rng, n: int) -> np.ndarray:
    """A block whose products a * inv include exact ties n + 1/2 (RNE decides): amax = 127 *
    2**e (inv = 2**-e exactly) with a = (j + 1/2) * 2**e, and, for a random amax, values a
    chosen so that f32(a * inv) rounds to j + 1/2 although the product is inexact."""
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
    for _ in range(50 * n):
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


def random_block(rng, n: int) -> np.ndarray:
    """One block of ``n`` float32: one of several kinds (ties, zeros, subnormals, huge...)."""
    kind = rng.integers(0, 9)
    if kind == 0:
        v = tie_block(rng, n)
    elif kind == 1:
        v = np.zeros(n, F32) * rng.choice([-1, 1])               # all zero (+0 or -0)
    elif kind == 2:                                              # subnormals
        v = (rng.integers(-(1 << 23), 1 << 23, n).astype(np.int64)
             .astype(np.uint32) & 0x807FFFFF).view(F32).copy()
        v[int(rng.integers(n))] = TINY * F32(rng.uniform(1, 3))  # amax just above the limit
    elif kind == 3:                                              # huge, up to FLT_MAX
        v = F32(rng.standard_normal(n) * 1e37)
        v[int(rng.integers(n))] = FLT_MAX * rng.choice([-1, 1])
    elif kind == 4:                                              # few non-zeros
        v = np.zeros(n, F32)
        idx = rng.integers(0, n, max(1, n // 8))
        v[idx] = F32(rng.standard_normal(idx.size) * 10.0 ** rng.integers(-20, 20))
    elif kind == 5:                                              # random bit patterns, finite
        bits = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
        bits[(bits & 0x7F800000) == 0x7F800000] &= 0xBFFFFFFF
        v = bits.view(F32).copy()
    elif kind == 6:                                              # small integers (ties at 127)
        v = F32(rng.integers(-20, 21, n))
    else:
        v = F32(rng.standard_normal(n) * 10.0 ** rng.uniform(-35, 35))
    return v


def random_rows(rng, rows: int, k: int, block_size: int) -> np.ndarray:
    """``(rows, k)`` float32, each block drawn by :func:`random_block`; a block of ``k`` may
    also be finite-invalid (amax below the limit, or all subnormal) when ``tiny``."""
    A = np.empty((rows, -(-k // block_size) * block_size), F32)
    for r in range(rows):
        for b in range(A.shape[1] // block_size):
            A[r, b * block_size:(b + 1) * block_size] = random_block(rng, block_size)
    return np.ascontiguousarray(A[:, :k])


def a_beats(A: np.ndarray, simd: int, rng) -> np.ndarray:
    """``A`` as StreamSim beats of ``simd`` float32 lanes: each row ``ceil(k / simd)`` beats,
    the lanes past k filled with garbage (NaN, inf, huge) that the unit must ignore."""
    rows, k = A.shape
    n = -(-k // simd)
    bits = np.empty((rows, n * simd), np.uint32)
    bits[:, :k] = A.view(np.uint32)
    pad = n * simd - k
    if pad:
        bits[:, k:] = rng.choice([0x7FC00000, 0xFF800000, 0x7F7FFFFF, 0x7FA00001],
                                 (rows, pad)).astype(np.uint32)
    bits = bits.reshape(rows * n, simd)
    if simd == 1:
        return bits[:, 0].astype(np.uint64)
    words = np.ascontiguousarray(bits).view("<u8")               # two lanes per word
    return words if simd > 2 else words[:, 0].copy()


def decode_q(out, simd: int) -> dict[str, np.ndarray]:
    """Split StreamSim's ``q`` beats into qa (beats, simd) int8, sa uint32 and the flags."""
    a = np.asarray(out)
    if a.ndim == 1:
        a = a.astype(np.uint64)[:, None]
    raw = np.ascontiguousarray(a.astype("<u8")).view(np.uint8).reshape(len(a), 8 * a.shape[1])
    flags = raw[:, simd + 4]
    return {"qa": raw[:, :simd].view(np.int8), "sa": np.ascontiguousarray(
        raw[:, simd:simd + 4]).view("<u4")[:, 0], "invalid": flags & 1,
        "block_last": (flags >> 1) & 1, "row_last": (flags >> 2) & 1, "last": (flags >> 3) & 1}


def expected_q(A: np.ndarray, block_size: int, simd: int) -> dict[str, np.ndarray]:
    """The beats quantize_a implies: qa padded to whole blocks (0 in the blocks where
    ``f32(a * inv)`` is not finite, flagged invalid: amax inf, NaN, or so small that
    ``127 / amax`` overflows); sa per beat; the flags."""
    rows, k = A.shape
    kb = -(-k // block_size)
    qa, sa, _ = quantize_a(np.ascontiguousarray(A), block_size)
    pad = np.zeros((rows, kb * block_size), F32)
    pad[:, :k] = qa
    blocks = pad.reshape(rows, kb, block_size)
    apad = np.zeros((rows, kb * block_size), F32)
    apad[:, :k] = A
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        amax = np.abs(apad.reshape(rows, kb, block_size)).max(axis=2)
        invalid = ~np.isfinite(amax) | ((amax != 0) & np.isinf(F32(127) / amax))
    assert not blocks[invalid].any()
    assert np.abs(blocks).max(initial=0) <= 127
    per = block_size // simd                                     # beats per block
    n = rows * kb * per
    beat = np.arange(n)
    return {
        "qa": blocks.reshape(n, simd).astype(np.int8),
        "sa": np.repeat(sa.view(np.uint32).reshape(-1), per),
        "invalid": np.repeat(invalid.reshape(-1), per).astype(np.uint8),
        "block_last": (beat % per == per - 1).astype(np.uint8),
        "row_last": (beat % (kb * per) == kb * per - 1).astype(np.uint8),
        "last": (beat == n - 1).astype(np.uint8),
    }


def check_job(r, A: np.ndarray, block_size: int, simd: int, what: str):
    """Every q beat bit-exact with quantize_a, in order, once; every a beat taken once."""
    got = decode_q(r.outputs["q"], simd)
    exp = expected_q(A, block_size, simd)
    assert len(got["qa"]) == len(exp["qa"]), f"{what}: {len(got['qa'])} beats, " \
        f"expected {len(exp['qa'])}"
    for key in ("qa", "sa", "invalid", "block_last", "row_last", "last"):
        g, e = got[key], exp[key]
        bad = np.flatnonzero((g != e).reshape(len(g), -1).any(axis=1))
        assert not bad.size, (f"{what}: {key} of beat {bad[0]} is {g[bad[0]]}, expected "
                              f"{e[bad[0]]} ({bad.size} beats differ)")
    rows, k = A.shape
    assert len(r.accepted["a"]) == rows * -(-k // simd), what


def job(unit: ActivationQuant, A: np.ndarray, block_size: int, rng,
        register: int | None = None) -> Segment:
    """A segment running ``A`` with ``block_size`` (the register set to ``register``)."""
    rows, k = A.shape
    return Segment({"a": a_beats(A, unit.simd, rng)},
                   {"block_size": block_size if register is None else register, "k": k,
                    "rows": rows},
                   phases=[["start"], ["a"]],
                   expect={"q": unit.q_beats(k, rows, block_size)})


# -- random jobs -----------------------------------------------------------------------------


def run_random(simd: int, max_block: int, seed: int, blocks=BLOCKS, ks=KS,
               pauses=(0.3, 0.3)):
    unit, sim = quantiser(simd, max_block)
    rng = np.random.default_rng(seed)
    cases = []
    sizes = sorted(b for b in {*blocks, simd, 8, max_block} if simd <= b <= max_block)
    for bs in sizes:
        for k in sorted({*ks, bs, 2 * bs, bs + 1, 3 * bs - simd, 1, max(1, simd - 1)}):
            rows = int(rng.integers(1, 4))
            cases.append((bs, random_rows(rng, rows, k, bs)))
    rng.shuffle(cases)
    segs = [job(unit, A, bs, rng) for bs, A in cases]
    results = sim.run_segments(segs, idle=pauses[0], backpressure=pauses[1], seed=seed)
    for (bs, A), r in zip(cases, results, strict=True):
        check_job(r, A, bs, simd, f"simd {simd} block {bs} k {A.shape[1]} rows {A.shape[0]}")
    for stream, times in (("a", [r.accepted["a"] for r in results]),
                          ("q", [r.output_cycles["q"] for r in results])):
        span, n = np.sum([(t[-1] - t[0] + 1, len(t)) for t in times if len(t) > 1], axis=0)
        assert span > 1.2 * n, (stream, span, n)                 # the pauses happened


@pytest.mark.parametrize("simd", [1, 4, 16])
def test_random_jobs(simd):
    """Block sizes simd, 8, 16 .. 256, k of 1 .. 768, 1-3 rows, idle and back-pressure
    0.3: every qa, sa and flag bit-exact."""
    run_random(simd, 256, seed=100 + simd)


@pytest.mark.parametrize("idle, backpressure", [(0.8, 0.0), (0.0, 0.8), (0.7, 0.7)])
def test_heavy_pauses(idle, backpressure):
    """A starved input, a slow consumer (the output FIFO and the ring fill), both."""
    run_random(4, 256, seed=int(10 * idle + backpressure), blocks=(4, 16, 256),
               ks=(40, 300), pauses=(idle, backpressure))


@pytest.mark.slow
def test_random_jobs_max_block_1024():
    """max_block 1024: block sizes 512 and 1024 besides the usual ones."""
    run_random(4, 1024, seed=1024, blocks=(16, 64, 256, 512, 1024), ks=(40, 300, 1500))


# -- non-finite blocks -----------------------------------------------------------------------


def test_non_finite_blocks():
    """NaN (payloads, signs, signalling, the last one wins), +-inf, inf with NaN, amax below
    127 / FLT_MAX (subnormal blocks, and just below the limit): qa 0, invalid, sa as
    quantize_a; the neighbouring blocks unaffected; garbage past k still ignored."""
    simd, bs = 4, 16
    unit, sim = quantiser(simd)
    rng = np.random.default_rng(5)
    A = random_rows(rng, 12, 4 * bs, bs)
    bits = A.view(np.uint32)
    bits[0, 3] = NAN_BITS[2]                                     # one NaN
    bits[1, 2], bits[1, 9] = NAN_BITS[3], NAN_BITS[4]            # two: the last wins
    bits[2, 20], bits[2, 25], bits[2, 30] = NAN_BITS[4], 0x7F800000, NAN_BITS[1]
    A[3, 5] = np.inf                                             # +inf
    A[4, 17], A[4, 18] = -np.inf, F32(3)                         # -inf with finite values
    A[5, :bs] = 0
    A[5, 7] = np.nextafter(TINY, F32(0))                         # just below the limit
    A[5, bs:2 * bs] = 0
    A[5, bs + 3] = TINY                                          # at the limit: valid
    A[6, :bs] = np.arange(1, bs + 1, dtype=np.uint32).view(F32)  # subnormals only
    A[7, 2 * bs:3 * bs] = np.inf                                 # every element inf
    A[8, :] = np.nan
    A[9, 3 * bs + 1] = -np.inf
    A[9, 3 * bs + 2] = np.nan
    A[10:12] = 0
    bits[10, bs + 4] = 0x00000001                                # smallest subnormal alone
    bits[11, 0] = 0x80000001
    segs = [job(unit, A, bs, rng), job(unit, A[:, :45], bs, rng)]
    results = sim.run_segments(segs, idle=0.3, backpressure=0.3, seed=3)
    for Aj, r in zip((A, A[:, :45]), results, strict=True):
        check_job(r, Aj, bs, simd, f"non-finite k {Aj.shape[1]}")
        inv = decode_q(r.outputs["q"], simd)["invalid"].reshape(12, -1, bs // simd)[:, :, 0]
        assert inv[:, 0].tolist() == [1, 1, 0, 1, 0, 1, 1, 0, 1, 0, 0, 1]
    sa = decode_q(results[0].outputs["q"], simd)["sa"].reshape(12, 4, bs // simd)[:, :, 0]
    assert sa[0, 0] == 0x7FE00001 and sa[1, 0] == 0x7FFFFFFF and sa[2, 1] == 0x7FC00000
    assert sa[3, 0] == 0x7F800000 and sa[7, 2] == 0x7F800000 and sa[8, 3] == 0x7FC00000
    assert sa[10, 1] == 0 and sa[5, 1] != 0


# -- registers --------------------------------------------------------------------------------


def test_empty_jobs_and_illegal_block_sizes():
    """k 0 or rows 0: nothing taken or given, not busy; block_size registers that are not a
    power of two in [simd, max_block] act as max_block."""
    simd = 4
    unit, sim = quantiser(simd)
    rng = np.random.default_rng(9)
    segs, cases = [], []
    for k, rows in ((0, 3), (5, 0), (0, 0)):
        segs.append(Segment({}, {"block_size": 32, "k": k, "rows": rows}, phases=[["start"]],
                            expect={"q": 0}))
        cases.append(None)
    for reg in (0, 2, 24, 100, 512, 1 << 15, 0xFFFF):
        A = random_rows(rng, 2, 300, 256)
        segs.append(job(unit, A, 256, rng, register=reg))
        cases.append(A)
    results = sim.run_segments(segs, idle=0.2, backpressure=0.2, seed=4)
    for A, r, seg in zip(cases, results, segs, strict=True):
        if A is None:
            assert len(r.outputs["q"]) == 0 and r.cycles <= 3, seg.static
        else:
            check_job(r, A, 256, simd, f"block_size register {seg.static['block_size']}")


# -- throughput and latency -------------------------------------------------------------------


def run_throughput(simd: int, report: list):
    """No pauses: ``a`` taken every cycle, ``q`` given every cycle, each block's first beat
    ``latency`` cycles after the ``a`` transfer completing it (k a multiple of block_size, so
    ``q`` never falls behind); with padding, ``q`` every cycle once started."""
    unit, sim = quantiser(simd)
    rng = np.random.default_rng(12)
    cases = []
    for bs in sorted({max(16, simd), 256}):
        A = random_rows(rng, max(4, 4096 // (bs * 4)), 4 * bs, bs)
        cases.append((bs, A))
    A = random_rows(rng, 20, 300, 64)                           # 5 blocks of 64, 20 padded
    cases.append((64, A))
    results = sim.run_segments([job(unit, A, bs, rng) for bs, A in cases])
    for (bs, A), r in zip(cases, results, strict=True):
        check_job(r, A, bs, simd, f"throughput block {bs}")
        acc, out = r.accepted["a"], r.output_cycles["q"]
        rows, k = A.shape
        assert out[-1] - out[0] + 1 == len(out), (bs, "q not every cycle")
        if k % bs == 0:
            np.testing.assert_array_equal(acc, acc[0] + np.arange(len(acc)))
            per = bs // simd
            completing = acc[per - 1::per]
            first = out[::per]
            np.testing.assert_array_equal(first - completing, unit.latency)
            rate = len(acc) / (acc[-1] - acc[0] + 1)
        else:
            rate = len(out) / (out[-1] - out[0] + 1)
        assert rate >= 0.99
        report.append(f"block {bs} k {k}: {rate:.3f} beats/cycle")


@pytest.mark.parametrize("simd", [1, 4, 16])
def test_throughput_and_latency(simd):
    report: list[str] = []
    run_throughput(simd, report)
    print(f"\nActivationQuant simd={simd}: latency {quantiser(simd)[0].latency}; "
          + "; ".join(report))


# -- start while busy (Amaranth's simulator) ---------------------------------------------------


@pytest.mark.parametrize("simd, k", [(2, 20), (16, 40)])
def test_start_while_busy_is_ignored_amaranth_sim(simd, k):
    """A ``start`` with other registers in the middle of a job changes nothing; ``busy``
    falls after the last beat. ``max_block = 16``: with ``simd = 16`` a block is one beat
    (a one-entry block counter)."""
    bs = 16
    dut = ActivationQuant(simd=simd, max_block=16, count_width=8)
    rng = np.random.default_rng(2)
    A = random_rows(rng, 2, k, bs)
    beats = np.asarray(a_beats(A, simd, rng), np.uint64).reshape(len(A) * -(-k // simd), -1)
    lanes = beats.view("<u4").astype(np.int64)                  # (beats, simd)
    got = []

    async def testbench(ctx):
        ctx.set(dut.block_size, bs)
        ctx.set(dut.k, k)
        ctx.set(dut.rows, 2)
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)
        ctx.set(dut.q.ready, 1)
        i = 0
        for cycle in range(400):
            if cycle == 5:                       # mid-job: start, another row count
                ctx.set(dut.start, 1)
                ctx.set(dut.rows, 1)
            elif cycle == 6:
                ctx.set(dut.start, 0)
                ctx.set(dut.rows, 2)
            ctx.set(dut.a.valid, i < len(beats))
            if i < len(beats):
                ctx.set(dut.a.payload, [int(x) for x in lanes[i]])
            if ctx.get(dut.a.valid) and ctx.get(dut.a.ready):
                i += 1
            if ctx.get(dut.q.valid):
                p = ctx.get(dut.q.payload)
                got.append(([int(x) for x in p.qa], int(p.sa), int(p.invalid),
                            int(p.block_last), int(p.row_last), int(p.last)))
            await ctx.tick()
            if got and got[-1][-1]:
                break
        await ctx.tick()
        assert not ctx.get(dut.busy)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    exp = expected_q(A, bs, simd)
    assert len(got) == len(exp["qa"])
    np.testing.assert_array_equal(np.array([g[0] for g in got]), exp["qa"])
    for j, key in enumerate(("sa", "invalid", "block_last", "row_last", "last"), 1):
        np.testing.assert_array_equal([g[j] for g in got], exp[key], err_msg=key)


# -- contract and argument errors -------------------------------------------------------------


def test_contract_numbers():
    u = ActivationQuant(simd=4)
    assert (u.simd, u.max_block, u.count_width) == (4, 256, 16)
    assert [ActivationQuant(simd=s).latency for s in (1, 2, 4, 8, 16)] == [35, 36, 36, 37, 37]
    assert u.ring_depth >= 256 // 4 + u.latency - 12
    assert u.q_beats(300, 2, 64) == 2 * 5 * 16 and u.a_beats(300, 2) == 2 * 75
    sig = u.signature.members
    assert sig["q"].signature.members["payload"].shape.size == 4 * 8 + 32 + 4
    assert sig["a"].signature.members["payload"].shape.size == 4 * 32
    assert sig["k"].shape.width == 16 and sig["rows"].shape.width == 16


@pytest.mark.parametrize("kwargs, exc, name", [
    (dict(simd=3), ValueError, "simd"),
    (dict(simd=32), ValueError, "simd"),
    (dict(simd=4.0), TypeError, "simd"),
    (dict(simd=4, max_block=8), ValueError, "max_block"),
    (dict(simd=4, max_block=2048), ValueError, "max_block"),
    (dict(simd=4, max_block=100), ValueError, "max_block"),
    (dict(simd=4, max_block="256"), TypeError, "max_block"),
    (dict(simd=4, count_width=0), ValueError, "count_width"),
    (dict(simd=4, count_width=33), ValueError, "count_width"),
    (dict(simd=4, count_width=True), TypeError, "count_width"),
])
def test_argument_errors(kwargs, exc, name):
    with pytest.raises(exc, match=name) as info:
        ActivationQuant(**kwargs)
    bad = kwargs[name]
    assert repr(bad) in str(info.value) or str(bad) in str(info.value)


@pytest.mark.parametrize("call, exc, name", [
    (lambda u: u.q_beats(10, 1, 24), ValueError, "block_size"),
    (lambda u: u.q_beats(10, 1, 2), ValueError, "block_size"),
    (lambda u: u.q_beats(-1, 1, 16), ValueError, "k"),
    (lambda u: u.q_beats(10, 1 << 16, 16), ValueError, "rows"),
    (lambda u: u.a_beats(None, 1), TypeError, "k"),
])
def test_method_argument_errors(call, exc, name):
    with pytest.raises(exc, match=name):
        call(ActivationQuant(simd=4))
