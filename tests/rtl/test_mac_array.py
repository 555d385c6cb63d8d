# amaranth: UnusedElaboratable=no
"""The MatMulNBits int8 x intN MAC array (qaccel.rtl.mac_array) on Verilator (qaccel.sim.streamsim):
thousands of random blocks of 1, 2 and many beats (padding lanes, extreme codes) under random
idle cycles and back-pressure against NumPy's exact sums, blocks at max_block of extreme codes
(the accumulator widths), throughput and latency without pauses; on Amaranth's simulator the
joint handshake and ``busy``; the widths; argument errors."""

from __future__ import annotations

import time

import numpy as np
import pytest
from amaranth.sim import Simulator

from qaccel.rtl.mac_array import MacArray, signed_width
from qaccel.sim.runner import missing_simulator
from qaccel.sim.streamsim import Segment, StreamSim

pytestmark = [
    pytest.mark.sim,
    pytest.mark.skipif(missing_simulator("verilator") is not None,
                       reason=missing_simulator("verilator") or ""),
]

#: (pe, simd, max_block) of the default suite: one column and one element per beat, an odd
#: column count with the smallest blocks, the widest accumulators (32 / 24 bits), a wide array.
SHAPES = [(1, 1, 256), (3, 2, 16), (4, 8, 65536), (8, 16, 256)]

_SIMS: dict[tuple[int, int, int], tuple[MacArray, StreamSim]] = {}


def mac(pe: int, simd: int, max_block: int) -> tuple[MacArray, StreamSim]:
    """Return the unit and its Verilator build for a shape (built once per session)."""
    key = (pe, simd, max_block)
    if key not in _SIMS:
        unit = MacArray(pe=pe, simd=simd, max_block=max_block)
        _SIMS[key] = unit, StreamSim(unit, name=f"mac_array_p{pe}_s{simd}_b{max_block}")
    return _SIMS[key]


# -- beats -------------------------------------------------------------------------------------

def _words(raw: np.ndarray) -> np.ndarray:
    """``(n, bytes)`` uint8, least significant byte first, as StreamSim beats: 1-D uint64 up
    to 8 bytes, else ``(n, words)`` uint64."""
    n, nbytes = raw.shape
    words = -(-nbytes // 8)
    buf = np.zeros((n, 8 * words), np.uint8)
    buf[:, :nbytes] = raw
    out = buf.view("<u8").astype(np.uint64)
    return out[:, 0] if words == 1 else out


def encode_a(qa: np.ndarray, block_last: np.ndarray, last: np.ndarray) -> np.ndarray:
    """``a`` beats: ``qa`` (n, simd) int, then the ``block_last`` and ``last`` bits."""
    flags = (block_last.astype(np.uint8) | (last.astype(np.uint8) << 1))[:, None]
    return _words(np.concatenate([qa.astype(np.int8).view(np.uint8), flags], axis=1))


def encode_w(q: np.ndarray) -> np.ndarray:
    """``w`` beats: ``q`` (n, pe, simd) codes, column-major by ``pe`` then lane."""
    return _words(q.astype(np.uint8).reshape(len(q), -1))


def decode_o(out: np.ndarray, unit: MacArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return ``isum`` (n, pe), ``asum`` (n,) and ``last`` (n,) of StreamSim's ``o`` beats."""
    a = np.asarray(out)
    if a.ndim == 1:
        a = a.astype(np.uint64)[:, None]
    raw = np.ascontiguousarray(a.astype("<u8")).view(np.uint8).reshape(len(a), -1)
    bits = np.unpackbits(raw, axis=1, bitorder="little").astype(np.int64)

    def field(lo: int, width: int) -> np.ndarray:
        v = bits[:, lo:lo + width] @ (np.int64(1) << np.arange(width, dtype=np.int64))
        return np.where(v >= 1 << (width - 1), v - (1 << width), v)

    iw, aw, pe = unit.isum_width, unit.asum_width, unit.pe
    isum = np.stack([field(p * iw, iw) for p in range(pe)], axis=1).reshape(len(a), pe)
    asum = field(pe * iw, aw)
    return isum, asum, bits[:, pe * iw + aw]


class Blocks:
    """A list of blocks as beats, with the expected sums."""

    def __init__(self, unit: MacArray):
        self.unit = unit
        self.qa: list[np.ndarray] = []          # (beats, simd)
        self.q: list[np.ndarray] = []           # (beats, pe, simd)
        self.last: list[int] = []

    def add(self, qa: np.ndarray, q: np.ndarray, last: int) -> None:
        self.qa.append(np.asarray(qa, np.int64))
        self.q.append(np.asarray(q, np.int64))
        self.last.append(int(last))

    def __len__(self) -> int:
        return len(self.qa)

    @property
    def beats(self) -> int:
        return sum(len(x) for x in self.qa)

    def segment(self) -> Segment:
        qa, q = np.concatenate(self.qa), np.concatenate(self.q)
        ends = np.cumsum([len(x) for x in self.qa]) - 1
        block_last = np.zeros(len(qa), np.uint8)
        block_last[ends] = 1
        last = np.zeros(len(qa), np.uint8)
        last[ends] = self.last
        return Segment({"a": encode_a(qa, block_last, last), "w": encode_w(q)},
                       expect={"o": len(self)})

    def block_last_beats(self) -> np.ndarray:
        """Index of each block's last beat among the segment's beats."""
        return np.cumsum([len(x) for x in self.qa]) - 1

    def expected(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        isum = np.array([np.einsum("tj,tpj->p", a, w) for a, w in zip(self.qa, self.q,
                                                                       strict=True)])
        asum = np.array([a.sum() for a in self.qa])
        return isum.reshape(len(self), self.unit.pe), asum, np.array(self.last)


def random_codes(rng, shape, lo: int, hi: int) -> np.ndarray:
    """Uniform codes in ``[lo, hi]`` with about 10% ``lo`` and 10% ``hi``."""
    v = rng.integers(lo, hi + 1, shape)
    pick = rng.random(shape)
    return np.where(pick < 0.1, lo, np.where(pick < 0.2, hi, v))


def random_block(blocks: Blocks, rng, beats: int) -> None:
    """A random block of ``beats`` beats: qa in [-127, 127] with extremes and -128, q in
    [0, 255] with extremes; the last beat has random padding lanes (qa 0, q random)."""
    u = blocks.unit
    qa = random_codes(rng, (beats, u.simd), -127, 127)
    qa = np.where(rng.random(qa.shape) < 0.03, -128, qa)
    q = random_codes(rng, (beats, u.pe, u.simd), 0, 255)
    pad = int(rng.integers(0, u.simd))
    if pad and rng.random() < 0.5:
        qa[-1, u.simd - pad:] = 0
    blocks.add(qa, q, rng.random() < 0.25)


def random_beats(rng, max_beats: int) -> int:
    """1 (30%), 2 (20%), up to 40 (47%) or ``min(max_beats, 256)`` (3%) beats."""
    max_beats = min(max_beats, 256)
    r = rng.random()
    if r < 0.3:
        return 1
    if r < 0.5:
        return min(2, max_beats)
    if r < 0.97:
        return int(rng.integers(1, min(max_beats, 40) + 1))
    return max_beats


def extreme_blocks(blocks: Blocks, rng) -> None:
    """Blocks of ``max_block`` elements of one extreme (qa, q) pair each (the ends of the isum
    and asum ranges), and mixed extremes, each followed by a one-beat block."""
    u = blocks.unit
    n = u.max_block // u.simd
    pairs = [(-128, 255), (127, 255), (-128, 0), (127, 0), (-127, 255), (0, 255)]
    for qa_v, q_v in pairs:
        q = np.full((n, u.pe, u.simd), q_v)
        q[:, ::2] = 255 - q_v                  # even columns get the other extreme
        blocks.add(np.full((n, u.simd), qa_v), q, 1)
        random_block(blocks, rng, 1)
    qa = rng.choice([-128, 127], (n, u.simd))
    blocks.add(qa, np.where(qa[:, None, :] < 0, 255, 0) + np.zeros((1, u.pe, 1), int), 0)
    blocks.add(qa, np.full((n, u.pe, u.simd), 255), 1)


def check(r, blocks: Blocks, what: str) -> None:
    """Every block's sums equal NumPy's, in order, once; ``last`` copied; a and w taken
    together, each beat once."""
    unit = blocks.unit
    isum, asum, last = decode_o(r.outputs["o"], unit)
    e_isum, e_asum, e_last = blocks.expected()
    assert len(isum) == len(blocks), f"{what}: {len(isum)} blocks out, expected {len(blocks)}"
    bad = np.flatnonzero((isum != e_isum).any(axis=1) | (asum != e_asum))
    assert not bad.size, (f"{what}: block {bad[0]} ({len(blocks.qa[bad[0]])} beats) gives "
                          f"isum {isum[bad[0]]} asum {asum[bad[0]]}, expected {e_isum[bad[0]]} "
                          f"{e_asum[bad[0]]} ({bad.size} differ)")
    np.testing.assert_array_equal(last, e_last, err_msg=f"{what}: last")
    np.testing.assert_array_equal(r.accepted["a"], r.accepted["w"], err_msg=what)
    assert len(r.accepted["a"]) == blocks.beats, what


# -- Verilator ---------------------------------------------------------------------------------

def run_random(pe: int, simd: int, max_block: int, seed: int):
    unit, sim = mac(pe, simd, max_block)
    rng = np.random.default_rng(seed)
    max_beats = max_block // simd
    segs = []
    for k in range(3):
        blocks = Blocks(unit)
        if k == 1:
            extreme_blocks(blocks, rng)
        for _ in range(1500):
            random_block(blocks, rng, random_beats(rng, max_beats))
        segs.append(blocks)
    t0 = time.perf_counter()
    # (the watchdog covers a max_block block: no o beat for ~1.5 cycles per beat)
    results = sim.run_segments([b.segment() for b in segs], idle=0.3, backpressure=0.3,
                               seed=seed, watchdog=10_000 + 4 * max_beats)
    wall = time.perf_counter() - t0
    for k, (blocks, r) in enumerate(zip(segs, results, strict=True)):
        check(r, blocks, f"segment {k}")
    # the pauses happened: fewer beats than cycles from the first beat to the last
    acc = results[0].accepted["a"]
    assert acc[-1] - acc[0] + 1 > 1.2 * len(acc), (acc[-1] - acc[0] + 1, len(acc))
    print(f"\nMacArray pe={pe} simd={simd} max_block={max_block}: "
          f"{sum(len(b) for b in segs)} blocks, {sum(b.beats for b in segs)} beats with "
          f"pauses in {wall:.2f} s")


@pytest.mark.parametrize("pe, simd, max_block", SHAPES)
def test_random_blocks(pe, simd, max_block):
    """4500 blocks of 1, 2, up to 40 and up to 256 beats plus the extreme blocks, idle
    0.3 on a and w (drawn separately) and back-pressure 0.3 on o, three segments."""
    run_random(pe, simd, max_block, seed=pe * 1000 + simd)


@pytest.mark.parametrize("pe, simd, max_block", SHAPES)
def test_heavy_backpressure(pe, simd, max_block):
    """Back-pressure 0.8 and no idle: the FIFO fills and the credit stalls the inputs again
    and again (mostly one-beat blocks); nothing is lost or duplicated."""
    unit, sim = mac(pe, simd, max_block)
    rng = np.random.default_rng(pe + simd)
    blocks = Blocks(unit)
    for _ in range(3000):
        random_block(blocks, rng, 1 if rng.random() < 0.7 else random_beats(rng, 8))
    r = sim.run_segments([blocks.segment()], backpressure=0.8, seed=pe * simd)[0]
    check(r, blocks, "back-pressure 0.8")
    out = r.output_cycles["o"]
    assert out[-1] - out[0] + 1 > 3 * len(out), (out[-1] - out[0] + 1, len(out))


def run_throughput(pe: int, simd: int, max_block: int) -> float:
    """No pauses: 2000 one-beat blocks then mixed ones; one beat pair every cycle, every block
    offered ``latency`` cycles after its last beat."""
    unit, sim = mac(pe, simd, max_block)
    rng = np.random.default_rng(5)
    blocks = Blocks(unit)
    for _ in range(2000):
        random_block(blocks, rng, 1)
    for _ in range(1000):
        random_block(blocks, rng, random_beats(rng, max_block // simd))
    r = sim.run_segments([blocks.segment()])[0]
    check(r, blocks, "no pauses")
    acc, out = r.accepted["a"], r.output_cycles["o"]
    np.testing.assert_array_equal(acc, acc[0] + np.arange(len(acc)))
    np.testing.assert_array_equal(out, acc[blocks.block_last_beats()] + unit.latency)
    rate = len(acc) / (acc[-1] - acc[0] + 1)
    assert rate >= 0.99, rate
    ones = 2000 / (acc[1999] - acc[0] + 1)                  # the one-beat blocks alone
    assert ones >= 0.99, ones
    return rate


@pytest.mark.parametrize("pe, simd, max_block", SHAPES)
def test_throughput_and_latency(pe, simd, max_block):
    rate = run_throughput(pe, simd, max_block)
    unit = mac(pe, simd, max_block)[0]
    print(f"\nMacArray pe={pe} simd={simd}: {rate:.4f} beats/cycle, latency {unit.latency}")


# -- Amaranth's simulator ----------------------------------------------------------------------

def test_joint_handshake_and_busy_amaranth_sim():
    """``a`` valid alone or ``w`` valid alone is not taken (ready low); both valid are taken
    in the same cycle; ``busy`` is high from a block's first beat until its ``o`` beat is
    transferred, and the held ``o`` beat stalls nothing it should not."""
    dut = MacArray(pe=2, simd=2, max_block=16)

    async def testbench(ctx):
        beat = {"qa": [3, -4], "block_last": 0, "last": 0}
        ctx.set(dut.a.payload, beat)
        ctx.set(dut.w.payload, [[1, 2], [255, 7]])
        assert not ctx.get(dut.busy)
        ctx.set(dut.a.valid, 1)
        for _ in range(3):                                  # a alone: not taken
            assert not ctx.get(dut.a.ready) and not ctx.get(dut.w.ready)
            await ctx.tick()
        assert not ctx.get(dut.busy)
        ctx.set(dut.a.valid, 0)
        ctx.set(dut.w.valid, 1)
        for _ in range(3):                                  # w alone: not taken
            assert not ctx.get(dut.a.ready) and not ctx.get(dut.w.ready)
            await ctx.tick()
        ctx.set(dut.a.valid, 1)
        assert ctx.get(dut.a.ready) and ctx.get(dut.w.ready)
        await ctx.tick()                                    # first beat taken
        assert ctx.get(dut.busy)
        ctx.set(dut.a.valid, 0)
        ctx.set(dut.w.valid, 0)
        for _ in range(10):                                 # block open: busy, no output
            assert ctx.get(dut.busy) and not ctx.get(dut.o.valid)
            await ctx.tick()
        ctx.set(dut.a.payload, {"qa": [-128, 127], "block_last": 1, "last": 1})
        ctx.set(dut.w.payload, [[255, 255], [0, 1]])
        ctx.set(dut.a.valid, 1)
        ctx.set(dut.w.valid, 1)
        await ctx.tick()
        ctx.set(dut.a.valid, 0)
        ctx.set(dut.w.valid, 0)
        for _ in range(dut.latency - 1):                    # offered latency cycles after
            assert ctx.get(dut.busy) and not ctx.get(dut.o.valid)
            await ctx.tick()
        for _ in range(5):                                  # held until o.ready
            assert ctx.get(dut.o.valid) and ctx.get(dut.busy)
            await ctx.tick()
        out = ctx.get(dut.o.payload)
        assert [int(x) for x in out.isum] == [3 - 8 - 128 * 255 + 127 * 255,
                                              3 * 255 - 28 + 127]
        assert int(out.asum) == 3 - 4 - 128 + 127 and int(out.last) == 1
        ctx.set(dut.o.ready, 1)
        await ctx.tick()
        assert not ctx.get(dut.o.valid) and not ctx.get(dut.busy)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()


def test_credit_stalls_inputs_amaranth_sim():
    """With ``o.ready`` low, one-beat blocks are taken until ``fifo_depth`` blocks are owed,
    then the inputs stall; releasing ``o`` yields every block once, in order."""
    dut = MacArray(pe=1, simd=1, max_block=16)
    n = dut.fifo_depth + 5
    got = []

    async def testbench(ctx):
        ctx.set(dut.a.valid, 1)
        ctx.set(dut.w.valid, 1)
        ctx.set(dut.w.payload, [[1]])
        taken = 0
        for _ in range(3 * n):
            ctx.set(dut.a.payload, {"qa": [taken], "block_last": 1, "last": 0})
            if ctx.get(dut.a.ready):
                taken += 1
            await ctx.tick()
        assert taken == dut.fifo_depth
        ctx.set(dut.o.ready, 1)
        for _ in range(6 * n):
            ctx.set(dut.a.valid, taken < n)
            ctx.set(dut.w.valid, taken < n)
            ctx.set(dut.a.payload, {"qa": [taken], "block_last": 1, "last": 0})
            if taken < n and ctx.get(dut.a.ready):
                taken += 1
            if ctx.get(dut.o.valid):
                got.append(int(ctx.get(dut.o.payload).isum[0]))
            await ctx.tick()
        assert not ctx.get(dut.busy)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    assert got == list(range(n))


# -- contract and arguments --------------------------------------------------------------------

def test_widths_and_contract_numbers():
    for mb in (16, 256, 4096, 65536):
        u = MacArray(pe=1, simd=1, max_block=mb)
        m = mb.bit_length() - 1
        assert u.isum_width == m + 16 == signed_width(-128 * 255 * mb, 127 * 255 * mb)
        assert u.asum_width == m + 8 == signed_width(-128 * mb, 127 * mb)
        # minimal: one bit fewer misses the most negative sum
        assert -128 * 255 * mb < -(1 << (u.isum_width - 2))
        assert -128 * mb < -(1 << (u.asum_width - 2))
    u = MacArray(pe=8, simd=16)
    assert (u.isum_width, u.asum_width, u.max_block) == (24, 16, 256)
    assert [MacArray(pe=1, simd=s).tree_stages for s in (1, 2, 4, 8, 16)] == [0, 1, 1, 2, 2]
    assert [MacArray(pe=1, simd=s).latency for s in (1, 2, 4, 8, 16)] == [3, 4, 4, 5, 5]
    assert u.fifo_depth > u.latency + 1
    members = u.signature.members
    assert members["w"].signature.members["payload"].shape.size == 8 * 16 * 8
    assert members["a"].signature.members["payload"].shape.size == 16 * 8 + 2
    assert members["o"].signature.members["payload"].shape.size == 8 * 24 + 16 + 1
    assert signed_width(0, 0) == 1 and signed_width(-1, 0) == 1 and signed_width(-2, 1) == 2


@pytest.mark.parametrize("kwargs, exc, name", [
    (dict(pe=0, simd=4), ValueError, "pe"),
    (dict(pe=65, simd=4), ValueError, "pe"),
    (dict(pe=2.0, simd=4), TypeError, "pe"),
    (dict(pe=True, simd=4), TypeError, "pe"),
    (dict(pe=2, simd=3), ValueError, "simd"),
    (dict(pe=2, simd=32), ValueError, "simd"),
    (dict(pe=2, simd=0), ValueError, "simd"),
    (dict(pe=2, simd="4"), TypeError, "simd"),
    (dict(pe=2, simd=4, max_block=8), ValueError, "max_block"),
    (dict(pe=2, simd=4, max_block=131072), ValueError, "max_block"),
    (dict(pe=2, simd=4, max_block=48), ValueError, "max_block"),
    (dict(pe=2, simd=4, max_block=256.0), TypeError, "max_block"),
])
def test_argument_errors(kwargs, exc, name):
    with pytest.raises(exc, match=name) as info:
        MacArray(**kwargs)
    bad = kwargs[name]
    assert repr(bad) in str(info.value) or str(bad) in str(info.value)
