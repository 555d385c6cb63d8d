# amaranth: UnusedElaboratable=no
"""The v2 packed MAC array (qaccel.rtl.nbits.packed_mac_array) against a NumPy model of its
contract.

On Verilator (qaccel.sim.streamsim), per shape (pe, simd, rows, dsp_pairs): every (qa, n0, n1)
through every multiplier slot (all 2^16 split cases, DSP and LUT slots; both columns of a pair
together: every byte code ``n0 + 16 n1``) as one-step blocks at one beat per cycle with the
exact latency; random row interleavings (one-step to max_block blocks, engine-order tiles)
under random idle cycles and back-pressure; max_block blocks of extreme values under heavy
back-pressure. On Amaranth's simulator: random blocks of a small shape, the latency and the
held output, the credit stall, a reset in mid-stream; the widths; argument errors. Synthesis
(marked ``synth``): DSP counts and Fmax."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.hdl import ClockDomain, Module, signed, unsigned
from amaranth.lib import data
from amaranth.sim import Simulator

from qaccel.rtl.arith.pipeline import signed_width
from qaccel.rtl.nbits.packed_mac_array import PackedMacArray
from qaccel.sim.runner import missing_simulator
from qaccel.sim.streamsim import Segment, StreamSim

from ..ecp5_models import DP16KD_MODEL, mult18x18d_model, needs_icarus, run_twins

needs_verilator = pytest.mark.skipif(missing_simulator("verilator") is not None,
                                     reason=missing_simulator("verilator") or "")

#: (pe, simd, rows, dsp_pairs, max_block) of the Verilator runs: the smallest unit (all on
#: DSPs, registers for the accumulators); a pair split across DSP and LUT slots with rows 4;
#: all LUT multipliers with simd 16 (four tree stages) and 3 rows; 16 rows, odd pair count,
#: the widest accumulators; 96 columns, whose 12 accumulator groups use every variant of
#: the address copies (rows 5) and of the ``first`` copies (rows 1).
SHAPES = [(2, 1, 1, None, 16), (8, 4, 4, 6, 256), (4, 16, 3, 0, 64), (6, 2, 16, 4, 1024),
          (96, 1, 5, 30, 32), (96, 1, 1, 40, 16)]


# -- beats and the model -----------------------------------------------------------------------

class Beats:
    """Input beats (``qa`` (n, simd), ``w`` (n, pe, simd) nibbles, ``row``, ``first``,
    ``last``) and the model's outputs."""

    def __init__(self, unit: PackedMacArray):
        self.unit = unit
        self.qa: list[np.ndarray] = []
        self.w: list[np.ndarray] = []
        self.row: list[int] = []
        self.first: list[int] = []
        self.last: list[int] = []

    def beat(self, qa, w, row: int, first: bool, last: bool) -> None:
        self.qa.append(np.asarray(qa, np.int64))
        self.w.append(np.asarray(w, np.int64))
        self.row.append(int(row))
        self.first.append(int(first))
        self.last.append(int(last))

    def __len__(self) -> int:
        return len(self.qa)

    @property
    def blocks(self) -> int:
        return sum(self.last)

    def arrays(self):
        u = self.unit
        qa = np.array(self.qa, np.int64).reshape(-1, u.simd)
        w = np.array(self.w, np.int64).reshape(-1, u.pe, u.simd)
        return qa, w, np.array(self.row), np.array(self.first), np.array(self.last)

    def expected(self) -> tuple[np.ndarray, np.ndarray]:
        """``isum`` (blocks, pe), each column's exact block sum of ``qa * nibble``, and ``row``
        (blocks,), in the order of the last beats."""
        u = self.unit
        qa, w, row, first, last = self.arrays()
        step = np.einsum("ns,nps->np", qa, w)
        acc = np.zeros((u.rows, u.pe), np.int64)
        out, rows = [], []
        for k in range(len(qa)):
            r = row[k]
            acc[r] = step[k] if first[k] else acc[r] + step[k]
            if last[k]:
                out.append(acc[r].copy())
                rows.append(r)
        return np.array(out, np.int64).reshape(-1, u.pe), np.array(rows, np.int64)

    def last_beats(self) -> np.ndarray:
        return np.flatnonzero(np.array(self.last))

    def payloads(self) -> list[dict]:
        """The beats as Amaranth payload values."""
        return [{"qa": qa.tolist(), "w": w.tolist(), "row": r, "first": f, "last": la}
                for qa, w, r, f, la in zip(self.qa, self.w, self.row, self.first, self.last,
                                           strict=True)]


def random_values(rng, shape, lo: int, hi: int) -> np.ndarray:
    """Uniform in ``[lo, hi]`` with about 10% ``lo`` and 10% ``hi``."""
    v = rng.integers(lo, hi + 1, shape)
    pick = rng.random(shape)
    return np.where(pick < 0.1, lo, np.where(pick < 0.2, hi, v))


def random_step(rng, unit: PackedMacArray, pad: bool):
    """One step's ``qa`` and nibbles; with ``pad`` a random number of trailing lanes get
    ``qa = 0`` (lanes past the block's end)."""
    qa = random_values(rng, unit.simd, -128, 127)
    w = random_values(rng, (unit.pe, unit.simd), 0, 15)
    if pad:
        n = int(rng.integers(0, unit.simd))
        if n:
            qa[unit.simd - n:] = 0
    return qa, w


def random_steps(rng, max_steps: int) -> int:
    """1 (35%), 2 (15%), up to 24 (47%) or ``max_steps`` (3%) steps."""
    r = rng.random()
    if r < 0.35:
        return 1
    if r < 0.5:
        return min(2, max_steps)
    if r < 0.97:
        return int(rng.integers(1, min(max_steps, 24) + 1))
    return max_steps


def interleaved(unit: PackedMacArray, rng, n_blocks: int) -> Beats:
    """``n_blocks`` random blocks on random rows, the rows' beats interleaved at random
    (each row's beats in order)."""
    beats = Beats(unit)
    max_steps = unit.max_block // unit.simd
    queues: list[list[int]] = [[] for _ in range(unit.rows)]
    for _ in range(n_blocks):
        queues[int(rng.integers(unit.rows))].append(random_steps(rng, max_steps))
    pos = [0] * unit.rows                      # step within the current block of each row
    while any(queues):
        live = [r for r in range(unit.rows) if queues[r]]
        r = live[int(rng.integers(len(live)))]
        steps = queues[r][0]
        last = pos[r] == steps - 1
        qa, w = random_step(rng, unit, last)
        beats.beat(qa, w, r, pos[r] == 0, last)
        pos[r] += 1
        if last:
            queues[r].pop(0)
            pos[r] = 0
    return beats


def tiles(unit: PackedMacArray, rng, n_tiles: int, beats: Beats | None = None) -> Beats:
    """Engine order: per tile, a height, a block length and a block count; for each K step
    the tile's rows in turn with the step's nibbles held."""
    beats = Beats(unit) if beats is None else beats
    max_steps = unit.max_block // unit.simd
    for _ in range(n_tiles):
        h = int(rng.integers(1, unit.rows + 1))
        steps = random_steps(rng, max_steps)
        for _ in range(int(rng.integers(1, 4))):
            for k in range(steps):
                _, w = random_step(rng, unit, False)
                for r in range(h):
                    qa, _ = random_step(rng, unit, k == steps - 1)
                    beats.beat(qa, w, r, k == 0, k == steps - 1)
    return beats


def extremes(unit: PackedMacArray, rng) -> Beats:
    """Blocks of ``max_block`` elements of one extreme value pair on every row, the rows
    interleaved step by step (the ends of every column's range), each pattern followed by
    one-step blocks; even columns get the other nibble extreme, except column 0, which gets
    column 1's (pair 0's packed operand at its extreme ``15 + 15 * 2 ** 12``)."""
    beats = Beats(unit)
    n = unit.max_block // unit.simd
    for qa_v, w_v in [(-128, 15), (127, 15), (-128, 0), (-127, 15), (127, 0)]:
        w = np.full((unit.pe, unit.simd), w_v)
        w[0::2] = 15 - w_v
        w[:2] = w_v                            # columns 0 and 1 (pair 0): both w_v
        for k in range(n):
            for r in range(unit.rows):
                beats.beat(np.full(unit.simd, qa_v), w, r, k == 0, k == n - 1)
        for r in range(unit.rows):
            qa, w1 = random_step(rng, unit, False)
            beats.beat(qa, w1, r, True, True)
    return beats


# -- Verilator ---------------------------------------------------------------------------------

_SIMS: dict[tuple, tuple[PackedMacArray, StreamSim]] = {}


def unit_sim(pe, simd, rows, dsp_pairs, max_block) -> tuple[PackedMacArray, StreamSim]:
    """The unit and its Verilator build for a shape (built once per session)."""
    key = (pe, simd, rows, dsp_pairs, max_block)
    if key not in _SIMS:
        unit = PackedMacArray(pe=pe, simd=simd, rows=rows, dsp_pairs=dsp_pairs,
                              max_block=max_block)
        name = f"packed_mac_p{pe}_s{simd}_r{rows}_d{dsp_pairs}_b{max_block}"
        _SIMS[key] = unit, StreamSim(unit, name=name)
    return _SIMS[key]


def pack(fields: list[tuple[np.ndarray, int]], n: int) -> np.ndarray:
    """Pack ``(values, width)`` fields, first field at bit 0, into StreamSim beats: 1-D
    uint64 up to 64 bits, else ``(n, words)`` uint64, least significant word first."""
    total = sum(w for _, w in fields)
    words = -(-total // 64)
    out = np.zeros((n, words), np.uint64)
    lo = 0
    for values, width in fields:
        v = (np.asarray(values, np.int64) & ((1 << width) - 1)).astype(np.uint64)
        k, sh = divmod(lo, 64)
        out[:, k] |= v << np.uint64(sh)
        if sh + width > 64:
            out[:, k + 1] |= v >> np.uint64(64 - sh)
        lo += width
    return out[:, 0] if words == 1 else out


def field(words: np.ndarray, lo: int, width: int, is_signed: bool) -> np.ndarray:
    """Bits ``lo .. lo + width - 1`` of StreamSim beats as int64."""
    k, sh = divmod(lo, 64)
    v = words[:, k] >> np.uint64(sh)
    if sh + width > 64:
        v = v | (words[:, k + 1] << np.uint64(64 - sh))
    v = (v & np.uint64((1 << width) - 1)).astype(np.int64)
    if is_signed:
        v = np.where(v >= 1 << (width - 1), v - (1 << width), v)
    return v


def encode(beats: Beats) -> np.ndarray:
    u = beats.unit
    qa, w, row, first, last = beats.arrays()
    fields = [(qa[:, s], 8) for s in range(u.simd)]
    fields += [(w[:, p, s], 4) for p in range(u.pe) for s in range(u.simd)]
    fields += [(row, u.row_width), (first, 1), (last, 1)]
    return pack(fields, len(qa))


def decode(out: np.ndarray, unit: PackedMacArray) -> tuple[np.ndarray, np.ndarray]:
    """``isum`` (n, pe) and ``row`` (n,) of StreamSim's ``o`` beats."""
    a = np.asarray(out).astype(np.uint64)
    if a.ndim == 1:
        a = a[:, None]
    iw = unit.acc_width
    isum = np.stack([field(a, p * iw, iw, True) for p in range(unit.pe)], axis=1)
    return isum.reshape(len(a), unit.pe), field(a, unit.pe * iw, unit.row_width, False)


def segment(beats: Beats) -> Segment:
    return Segment({"i": encode(beats)}, expect={"o": beats.blocks})


def check(r, beats: Beats, what: str) -> None:
    """Every block's sums and row equal the model's, in order, each once; each beat taken
    once."""
    unit = beats.unit
    isum, row = decode(r.outputs["o"], unit)
    e_isum, e_row = beats.expected()
    assert len(isum) == len(e_isum), f"{what}: {len(isum)} blocks out, expected {len(e_isum)}"
    bad = np.flatnonzero((isum != e_isum).any(axis=1) | (row != e_row))
    assert not bad.size, (f"{what}: block {bad[0]} gives row {row[bad[0]]} isum "
                          f"{isum[bad[0]]}, expected row {e_row[bad[0]]} {e_isum[bad[0]]} "
                          f"({bad.size} differ)")
    assert len(r.accepted["i"]) == len(beats), what


def all_products(unit: PackedMacArray, n: int = 1 << 16) -> Beats:
    """``n`` one-step blocks: in beat ``b`` lane ``s`` carries ``qa = (b + 37 s) % 256 - 128``
    and slot ``(j, s)`` the nibbles ``c = (b // 256 + 16 j + 91 s) % 256``, ``n0 = c % 16``,
    ``n1 = c // 16``, so with ``n = 2 ** 16`` every slot sees every (qa, n0, n1) once; rows in
    turn."""
    u = unit
    b = np.arange(n)
    s = np.arange(u.simd)
    j = np.arange(u.pe // 2)
    qa = (b[:, None] + 37 * s[None, :]) % 256 - 128
    c = (b[:, None, None] // 256 + 16 * j[None, :, None] + 91 * s[None, None, :]) % 256
    w = np.empty((len(b), u.pe, u.simd), np.int64)
    w[:, 0::2] = c % 16
    w[:, 1::2] = c // 16
    beats = Beats(u)
    beats.qa, beats.w = list(qa), list(w)
    beats.row = list(b % u.rows)
    beats.first = [1] * len(b)
    beats.last = [1] * len(b)
    return beats


@needs_verilator
@pytest.mark.parametrize("pe, simd, rows, dsp_pairs, max_block", SHAPES)
def test_every_product_throughput_latency(pe, simd, rows, dsp_pairs, max_block):
    """Every (qa, n0, n1) through every slot, both columns of each pair exact (so every
    slot pair carries all 256 byte codes ``n0 + 16 n1`` with every qa, and the downstream
    combine ``lo + 16 * hi`` of its two columns is the byte code's product; the 96-column
    shapes, which are there for their accumulator groups, take every qa with 64 nibble pairs
    per slot); without pauses one beat is taken per cycle and every block is offered exactly
    ``latency`` cycles after its last beat."""
    unit, sim = unit_sim(pe, simd, rows, dsp_pairs, max_block)
    n = 1 << 16 if pe <= 16 else 1 << 14
    beats = all_products(unit, n)
    qa, w, _, _, _ = beats.arrays()
    code = w[:, 0::2] + 16 * w[:, 1::2]                 # (n, pe / 2, simd) byte codes
    seen = (qa[:, None, :] + 128) * 256 + code          # every (qa, code) once per slot
    assert all(np.unique(seen[:, j, s]).size == n
               for j in range(pe // 2) for s in range(simd))
    (r,) = sim.run_segments([segment(beats)])
    check(r, beats, "all products")
    isum, _ = decode(r.outputs["o"], unit)
    np.testing.assert_array_equal(isum[:, 0::2] + 16 * isum[:, 1::2],
                                  (qa[:, None, :] * code).sum(axis=2))
    acc, out = r.accepted["i"], r.output_cycles["o"]
    np.testing.assert_array_equal(acc, acc[0] + np.arange(len(acc)))
    np.testing.assert_array_equal(out, acc + unit.latency)


@needs_verilator
@pytest.mark.parametrize("pe, simd, rows, dsp_pairs, max_block", SHAPES)
def test_random_blocks(pe, simd, rows, dsp_pairs, max_block):
    """Random interleavings of the rows (blocks of 1 step to max_block) and engine-order
    tiles (two segments of each), with idle 0.3 on ``i`` and back-pressure 0.3 on ``o``;
    then the interleavings again without pauses at one beat per cycle."""
    unit, sim = unit_sim(pe, simd, rows, dsp_pairs, max_block)
    rng = np.random.default_rng(pe * 100 + simd * 10 + rows)
    segs = [interleaved(unit, rng, 1500), interleaved(unit, rng, 1500),
            tiles(unit, rng, 60), tiles(unit, rng, 60)]
    max_steps = max_block // simd
    results = sim.run_segments([segment(b) for b in segs], idle=0.3,
                               backpressure=0.3, seed=rows + simd,
                               watchdog=10_000 + 4 * rows * max_steps)
    for k, (beats, r) in enumerate(zip(segs, results, strict=True)):
        check(r, beats, f"segment {k}")
    acc = results[0].accepted["i"]
    assert acc[-1] - acc[0] + 1 > 1.2 * len(acc)          # the pauses happened
    results = sim.run_segments([segment(b) for b in segs[:2]])
    for k, (beats, r) in enumerate(zip(segs[:2], results, strict=True)):
        check(r, beats, f"no pauses, segment {k}")
        acc = r.accepted["i"]
        np.testing.assert_array_equal(acc, acc[0] + np.arange(len(acc)))
        np.testing.assert_array_equal(r.output_cycles["o"],
                                      acc[beats.last_beats()] + unit.latency)


@needs_verilator
@pytest.mark.parametrize("pe, simd, rows, dsp_pairs, max_block", SHAPES)
def test_extremes_heavy_backpressure(pe, simd, rows, dsp_pairs, max_block):
    """max_block blocks of qa = -128 / 127 with nibbles 15 / 0 (every column at both ends
    of its range, ``[-128, 127] * 15 * max_block``) on every row, then many one-step blocks,
    with back-pressure 0.8: the credit stalls the input again and again, nothing is lost or
    duplicated."""
    unit, sim = unit_sim(pe, simd, rows, dsp_pairs, max_block)
    rng = np.random.default_rng(7)
    ext = extremes(unit, rng)
    ones = interleaved(unit, rng, 0)
    for _ in range(1500):
        qa, w = random_step(rng, unit, True)
        ones.beat(qa, w, int(rng.integers(rows)), True, True)
    segs = [ext, ones]
    results = sim.run_segments([segment(b) for b in segs], backpressure=0.8,
                               seed=3, watchdog=10_000 + 8 * rows * max_block)
    for k, (beats, r) in enumerate(zip(segs, results, strict=True)):
        check(r, beats, f"segment {k}")
    e = ext.expected()[0]                                  # every column at both ends
    assert (e.min(axis=0) == -128 * 15 * max_block).all()
    assert (e.max(axis=0) == 127 * 15 * max_block).all()
    out = results[1].output_cycles["o"]
    assert out[-1] - out[0] + 1 > 3 * len(out)


# -- Amaranth's simulator ----------------------------------------------------------------------

def amaranth_run(dut: PackedMacArray, beats: Beats, *, idle: float = 0.0,
                 backpressure: float = 0.0, seed: int = 1, max_cycles: int = 20_000):
    """Drive ``beats`` into ``dut`` with random idle cycles and back-pressure; return the
    ``o`` beats (isum rows, rows) and the accept and output cycles."""
    rng = np.random.default_rng(seed)
    payloads = beats.payloads()
    got, rows, acc, out = [], [], [], []

    async def testbench(ctx):
        k = 0
        for cycle in range(max_cycles):
            offer = k < len(payloads) and rng.random() >= idle
            if offer:
                ctx.set(dut.i.payload, payloads[k])
            ctx.set(dut.i.valid, offer)
            ctx.set(dut.o.ready, rng.random() >= backpressure)
            if offer and ctx.get(dut.i.ready):
                acc.append(cycle)
                k += 1
            if ctx.get(dut.o.valid) and ctx.get(dut.o.ready):
                o = ctx.get(dut.o.payload)
                got.append([int(x) for x in o.isum])
                rows.append(int(o.row))
                out.append(cycle)
            await ctx.tick()
            if k == len(payloads) and len(got) == beats.blocks and not ctx.get(dut.busy):
                break
        for _ in range(dut.latency + 4):                    # nothing more comes out
            ctx.set(dut.o.ready, 1)
            assert not ctx.get(dut.o.valid)
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    return (np.array(got, np.int64).reshape(-1, dut.pe), np.array(rows), np.array(acc),
            np.array(out))


@pytest.mark.parametrize("seed", [0, 1])
def test_random_blocks_amaranth_sim(seed):
    """A small mixed unit (a pair split across a DSP and a LUT slot, 3 rows) on Amaranth's
    simulator: interleaved rows and tiles with idle cycles and back-pressure."""
    dut = PackedMacArray(pe=4, simd=2, rows=3, dsp_pairs=3, max_block=16)
    rng = np.random.default_rng(11 + seed)
    beats = tiles(dut, rng, 4, interleaved(dut, rng, 30))
    isum, rows, _, _ = amaranth_run(dut, beats, idle=0.3, backpressure=0.3, seed=seed)
    e_isum, e_rows = beats.expected()
    np.testing.assert_array_equal(rows, e_rows)
    np.testing.assert_array_equal(isum, e_isum)


def test_latency_hold_and_busy_amaranth_sim():
    """The ``o`` beat is offered exactly ``latency`` cycles after the block's last beat and
    held (stable) under back-pressure; ``busy`` covers an open block and a held result; the
    extreme products (qa -128, nibbles 15) of both slot kinds."""
    dut = PackedMacArray(pe=2, simd=2, rows=2, dsp_pairs=1, max_block=16)
    assert dut.latency == 3 + 1 + 3

    async def testbench(ctx):
        assert not ctx.get(dut.busy) and ctx.get(dut.i.ready)
        ctx.set(dut.i.payload, {"qa": [-128, 3], "w": [[15, 1], [15, 2]], "row": 1,
                                "first": 1, "last": 0})
        ctx.set(dut.i.valid, 1)
        await ctx.tick()
        ctx.set(dut.i.valid, 0)
        for _ in range(12):                                 # open block: busy, no output
            assert ctx.get(dut.busy) and not ctx.get(dut.o.valid)
            await ctx.tick()
        ctx.set(dut.i.payload, {"qa": [-128, -128], "w": [[15, 15], [15, 15]], "row": 1,
                                "first": 0, "last": 1})
        ctx.set(dut.i.valid, 1)
        assert ctx.get(dut.i.ready)
        await ctx.tick()
        ctx.set(dut.i.valid, 0)
        for _ in range(dut.latency - 1):
            assert ctx.get(dut.busy) and not ctx.get(dut.o.valid)
            await ctx.tick()
        first = None
        for _ in range(5):                                  # held until o.ready
            assert ctx.get(dut.o.valid) and ctx.get(dut.busy)
            o = ctx.get(dut.o.payload)
            now = ([int(x) for x in o.isum], int(o.row))
            first = first or now
            assert now == first
            await ctx.tick()
        assert first == ([-128 * 15 + 3 - 128 * 30, -128 * 15 + 6 - 128 * 30], 1)
        ctx.set(dut.o.ready, 1)
        await ctx.tick()
        assert not ctx.get(dut.o.valid) and not ctx.get(dut.busy)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()


def test_credit_stalls_input_amaranth_sim():
    """With ``o.ready`` low, one-step blocks are taken until ``fifo_depth`` results are owed,
    then ``i`` stalls; releasing ``o`` yields every block once, in order."""
    dut = PackedMacArray(pe=2, simd=1, rows=1, max_block=16)
    n = dut.fifo_depth + 6
    got = []

    async def testbench(ctx):
        ctx.set(dut.i.valid, 1)
        taken = 0
        for _ in range(3 * n):
            ctx.set(dut.i.payload, {"qa": [taken], "w": [[1], [2]], "row": 0, "first": 1,
                                    "last": 1})
            if ctx.get(dut.i.ready):
                taken += 1
            await ctx.tick()
        assert taken == dut.fifo_depth
        ctx.set(dut.o.ready, 1)
        for _ in range(6 * n):
            ctx.set(dut.i.valid, taken < n)
            ctx.set(dut.i.payload, {"qa": [taken], "w": [[1], [2]], "row": 0, "first": 1,
                                    "last": 1})
            if taken < n and ctx.get(dut.i.ready):
                taken += 1
            if ctx.get(dut.o.valid):
                got.append([int(x) for x in ctx.get(dut.o.payload).isum])
            await ctx.tick()
        assert not ctx.get(dut.busy)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    assert got == [[k, 2 * k] for k in range(n)]


def test_reset_mid_stream_amaranth_sim():
    """A synchronous reset with an open block, blocks in the pipeline and results held in
    the FIFO drops them all (busy low, full credit); the blocks after it come out exactly."""
    dut = PackedMacArray(pe=4, simd=2, rows=2, dsp_pairs=2, max_block=16)
    top = Module()
    top.domains.sync = cd = ClockDomain()
    top.submodules.dut = dut
    rng = np.random.default_rng(5)
    before = interleaved(dut, rng, 12).payloads()
    after = interleaved(dut, rng, 20)
    after_payloads = after.payloads()
    got = []

    async def testbench(ctx):
        ctx.set(dut.i.valid, 1)
        for p in before[:-1]:                               # o.ready low: results pile up
            ctx.set(dut.i.payload, p)
            assert ctx.get(dut.i.ready)
            await ctx.tick()
        ctx.set(dut.i.payload, {**before[-1], "last": 0, "first": 1})
        await ctx.tick()                                    # and one block left open
        ctx.set(dut.i.valid, 0)
        assert ctx.get(dut.busy)
        ctx.set(cd.rst, 1)
        await ctx.tick()
        ctx.set(cd.rst, 0)
        assert not ctx.get(dut.busy) and not ctx.get(dut.o.valid)
        ctx.set(dut.o.ready, 1)
        for _ in range(2 * dut.latency):                    # nothing from before
            assert not ctx.get(dut.o.valid)
            await ctx.tick()
        k = 0
        for _ in range(20 * len(after)):
            ctx.set(dut.i.valid, k < len(after))
            if k < len(after):
                ctx.set(dut.i.payload, after_payloads[k])
                if ctx.get(dut.i.ready):
                    k += 1
            if ctx.get(dut.o.valid):
                got.append([int(x) for x in ctx.get(dut.o.payload).isum])
            await ctx.tick()
            if k == len(after) and not ctx.get(dut.busy):
                break

    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    np.testing.assert_array_equal(np.array(got).reshape(-1, 4), after.expected()[0])


def test_bad_row_keeps_the_zero_word_amaranth_sim():
    """A beat whose row is not below ``rows`` (3 of 3) updates no accumulator: it cannot
    overwrite the zero word that ``first`` beats read, so the next blocks stay exact."""
    dut = PackedMacArray(pe=2, simd=1, rows=3, max_block=16)
    beats = [{"qa": [100], "w": [[15], [15]], "row": 3, "first": 1, "last": 0},
             {"qa": [-7], "w": [[3], [5]], "row": 0, "first": 1, "last": 1},
             {"qa": [9], "w": [[2], [1]], "row": 2, "first": 1, "last": 1}]
    got = []

    async def testbench(ctx):
        ctx.set(dut.o.ready, 1)
        ctx.set(dut.i.valid, 1)
        for b in beats:
            ctx.set(dut.i.payload, b)
            assert ctx.get(dut.i.ready)
            await ctx.tick()
        ctx.set(dut.i.valid, 0)
        for _ in range(3 * dut.latency):
            if ctx.get(dut.o.valid):
                o = ctx.get(dut.o.payload)
                got.append(([int(x) for x in o.isum], int(o.row)))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    assert got == [([-21, -35], 0), ([18, 9], 2)]


# -- the MULT18X18D instances (ecp5) on Icarus --------------------------------------------

@needs_icarus
@pytest.mark.parametrize("pe, simd, rows, dsp_pairs", [(8, 4, 4, 6), (2, 1, 1, None)])
def test_ecp5_instances_match_behaviour_icarus(tmp_path, pe, simd, rows, dsp_pairs):
    """With the MULT18X18D and DP16KD instances (and models of the cells) the unit behaves like
    the behavioural description, cycle by cycle, under random beats, valid and ready."""
    kw = dict(pe=pe, simd=simd, rows=rows, dsp_pairs=dsp_pairs, max_block=64)
    beh, prim = PackedMacArray(**kw), PackedMacArray(**kw, ecp5=True)
    assert prim.latency == beh.latency
    width = beh.signature.members["i"].signature.members["payload"].shape.size
    owidth = beh.signature.members["o"].signature.members["payload"].shape.size
    words = -(-width // 32)
    tb = f"""
module tb;
  reg clk = 0, rst = 1, valid = 0, ready = 0;
  reg [{32 * words - 1}:0] payload = 0;
  wire [{owidth - 1}:0] op_b, op_p;
  wire ir_b, ir_p, ov_b, ov_p, busy_b, busy_p;
  beh b(.clk(clk), .rst(rst), .i__payload(payload[{width - 1}:0]), .i__valid(valid),
        .i__ready(ir_b), .o__payload(op_b), .o__valid(ov_b), .o__ready(ready),
        .busy(busy_b));
  prim p(.clk(clk), .rst(rst), .i__payload(payload[{width - 1}:0]), .i__valid(valid),
         .i__ready(ir_p), .o__payload(op_p), .o__valid(ov_p), .o__ready(ready),
         .busy(busy_p));
  always #5 clk = ~clk;
  integer k, errors = 0, outs = 0;
  initial begin
    repeat (3) @(negedge clk);
    rst = 0;
    for (k = 0; k < 3000; k = k + 1) begin
      @(negedge clk);
      if (!valid || ir_b) begin
        payload = {{{", ".join(["$random"] * words)}}};
        valid = ($random & 3) != 0;
      end
      ready = ($random & 3) != 0;
      #1;
      if (ir_b !== ir_p || ov_b !== ov_p || busy_b !== busy_p || (ov_b && op_b !== op_p))
        errors = errors + 1;
      if (ov_b && ready) outs = outs + 1;
    end
    $display("RESULT %0d %0d", errors, outs);
    $finish;
  end
endmodule
"""
    errors, outs = run_twins(tmp_path, beh, prim, mult18x18d_model() + DP16KD_MODEL, tb)
    assert errors == 0 and outs > 250, (errors, outs)


# -- contract and arguments --------------------------------------------------------------------

def test_widths_and_contract_numbers():
    for mb in (16, 256, 1024):
        u = PackedMacArray(pe=2, simd=1, max_block=mb)
        m = mb.bit_length() - 1
        assert u.acc_width == m + 12 == signed_width(-128 * 15 * mb, 127 * 15 * mb)
        assert -128 * 15 * mb < -(1 << (u.acc_width - 2))            # minimal
    assert signed_width(0, 0) == 1 and signed_width(-1, 0) == 1 and signed_width(-2, 1) == 2
    u = PackedMacArray(pe=8, simd=4, rows=4)
    assert (u.acc_width, u.row_width, u.dsp_pairs, u.lut_pairs) == (20, 2, 16, 0)
    assert not hasattr(u, "isum_width")
    assert [PackedMacArray(pe=2, simd=s).tree_stages for s in (1, 2, 4, 8, 16)] == [
        0, 1, 2, 3, 4]
    assert [PackedMacArray(pe=2, simd=s).latency for s in (1, 2, 4, 8, 16)] == [
        5, 6, 7, 8, 9]
    assert [PackedMacArray(pe=2, simd=s, dsp_pairs=0).latency for s in (1, 2, 4, 8, 16)] == [
        6, 7, 8, 9, 10]
    assert (u.pre_stages, PackedMacArray(pe=8, simd=4, dsp_pairs=15).pre_stages) == (2, 3)
    assert (u.latency, PackedMacArray(pe=32, simd=1, dsp_pairs=12).latency) == (7, 6)
    assert PackedMacArray(pe=2, simd=1, rows=1).row_width == 1
    assert PackedMacArray(pe=2, simd=1, rows=16).row_width == 4
    for simd in (1, 2, 4, 8, 16):                       # least power of two > latency + 1
        for dsp in (None, 0):
            d = PackedMacArray(pe=2, simd=simd, dsp_pairs=dsp).fifo_depth
            lat = PackedMacArray(pe=2, simd=simd, dsp_pairs=dsp).latency
            assert d & (d - 1) == 0 and d // 2 <= lat + 1 < d
    members = u.signature.members
    assert set(members) == {"i", "o", "busy"}
    assert members["i"].signature.members["payload"].shape.size == 4 * 8 + 8 * 4 * 4 + 2 + 2
    o_layout = members["o"].signature.members["payload"].shape
    assert o_layout == data.StructLayout({"isum": data.ArrayLayout(signed(20), 8),
                                          "row": unsigned(2)})
    assert o_layout.size == 8 * 20 + 2
    # the packed product: the low product exact in 12 bits, the operand 16 bits
    assert 15 + 15 * (1 << 12) < 1 << 16 and -2048 <= -128 * 15 and 127 * 15 < 2048


@pytest.mark.parametrize("kwargs, exc, name", [
    (dict(pe=0, simd=4), ValueError, "pe"),
    (dict(pe=3, simd=4), ValueError, "pe"),
    (dict(pe=130, simd=4), ValueError, "pe"),
    (dict(pe=2.0, simd=4), TypeError, "pe"),
    (dict(pe=True, simd=4), TypeError, "pe"),
    (dict(pe=2, simd=3), ValueError, "simd"),
    (dict(pe=2, simd=32), ValueError, "simd"),
    (dict(pe=2, simd="4"), TypeError, "simd"),
    (dict(pe=2, simd=4, rows=0), ValueError, "rows"),
    (dict(pe=2, simd=4, rows=17), ValueError, "rows"),
    (dict(pe=2, simd=4, rows=2.5), TypeError, "rows"),
    (dict(pe=2, simd=4, max_block=8), ValueError, "max_block"),
    (dict(pe=2, simd=4, max_block=2048), ValueError, "max_block"),
    (dict(pe=2, simd=4, max_block=48), ValueError, "max_block"),
    (dict(pe=2, simd=4, max_block=256.0), TypeError, "max_block"),
    (dict(pe=2, simd=4, dsp_pairs=-1), ValueError, "dsp_pairs"),
    (dict(pe=2, simd=4, dsp_pairs=5), ValueError, "dsp_pairs"),
    (dict(pe=2, simd=4, dsp_pairs=1.0), TypeError, "dsp_pairs"),
    (dict(pe=2, simd=4, ecp5=1), TypeError, "ecp5"),
])
def test_argument_errors(kwargs, exc, name):
    with pytest.raises(exc, match=name) as info:
        PackedMacArray(**kwargs)
    bad = kwargs[name]
    assert repr(bad) in str(info.value) or str(bad) in str(info.value)


# -- synthesis -----------------------------------------------------------------------------------

def _synth(**kwargs):
    from qaccel.eda.synth import missing_tools, synthesize
    reason = missing_tools("ecp5-25k")
    if reason:
        pytest.skip(reason)
    unit = PackedMacArray(**kwargs)
    r = synthesize(unit, target="ecp5-25k", freq_mhz=150)
    macs = unit.pe * unit.simd
    print(f"\n{kwargs}: {r.summary()}\n  {r.lut / macs:.1f} LUT4/MAC, {r.dsp / macs:.2f} "
          f"DSP/MAC\n{r.critical_path}")
    return r


@pytest.mark.synth
@pytest.mark.parametrize("ecp5", [False, True])
def test_synth_all_on_dsp(ecp5):
    """pe 8, simd 4, rows 4: one MULT18X18D per slot (Yosys maps each packed product to
    exactly one; the instances likewise). With the instances (registered in and out) the
    unit closes 150 MHz (171 MHz measured); Yosys's own mapping leaves the multiplier
    unregistered, and it is then the critical path."""
    r = _synth(pe=8, simd=4, rows=4, ecp5=ecp5)
    assert r.dsp == 16
    assert r.bram == 0
    if ecp5:
        assert r.fmax_mhz >= 150, r.critical_path
    else:                       # the unregistered multiplier limits it (111-130 MHz seen)
        assert "MULT18X18D" in r.critical_path, r.critical_path


@pytest.mark.synth
@pytest.mark.parametrize("ecp5", [False, True])
def test_synth_mixed_dsp_pairs(ecp5):
    """8 of the 16 slots on DSPs: exactly 8 MULT18X18D (the LUT multipliers stay in LUTs;
    173 MHz measured with the instances: not asserted)."""
    r = _synth(pe=8, simd=4, rows=4, dsp_pairs=8, ecp5=ecp5)
    assert r.dsp == 8
