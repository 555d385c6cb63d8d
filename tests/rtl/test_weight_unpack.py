# amaranth: UnusedElaboratable=no
"""The MatMulNBits weight unpacker (qaccel.rtl.weight_unpack) on Verilator (qaccel.sim.streamsim):
random streams for every bits in 2..8 under idle cycles and back-pressure against the golden
model's unpack_bits, throughput and latency without pauses, count 0 and out-of-range bits, an
abort between segments; on Amaranth's simulator an abort while a beat is held and words are
offered; argument errors."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.sim import Simulator

from qaccel.model.nbits_kernels import pack_bits, unpack_bits
from qaccel.rtl.weight_unpack import WeightUnpack
from qaccel.sim.runner import missing_simulator
from qaccel.sim.streamsim import Segment, StreamSim

pytestmark = [
    pytest.mark.sim,
    pytest.mark.skipif(missing_simulator("verilator") is not None,
                       reason=missing_simulator("verilator") or ""),
]

#: (simd, bus_width) shapes of the default suite: output bound up to bits 4 and input bound
#: from bits 5 (16 x 64, 8 x 32), one element per cycle (1 x 8), input bound at every bits.
SHAPES = [(16, 64), (8, 32), (1, 8), (4, 8)]
#: More shapes, run with ``-m slow``: the widest, a narrow bus, a wide bus and few lanes.
SLOW_SHAPES = [(64, 256), (32, 16), (2, 128)]

_SIMS: dict[tuple[int, int], tuple[WeightUnpack, StreamSim]] = {}


def unpacker(simd: int, bus_width: int) -> tuple[WeightUnpack, StreamSim]:
    """Return the unit and its Verilator build for a shape (built once per session)."""
    key = (simd, bus_width)
    if key not in _SIMS:
        unit = WeightUnpack(simd=simd, bus_width=bus_width)
        _SIMS[key] = unit, StreamSim(unit, name=f"weight_unpack_s{simd}_w{bus_width}")
    return _SIMS[key]


def make_stream(rng, bits: int, count: int, bus_width: int):
    """Return (elements, packed bytes, words) of a random ``bits``-bit stream: the words as
    StreamSim beats (1-D for ``bus_width <= 64``, else ``(n, bus_width // 64)`` uint64)."""
    values = rng.integers(0, 1 << bits, count).astype(np.uint8)
    n_words = -(-count * bits // bus_width)
    packed = pack_bits(values[None, :], bits, n_words * bus_width // 8)[0]
    if bus_width <= 64:
        words = packed.view(f"<u{bus_width // 8}").astype(np.uint64)
    else:
        words = packed.view("<u8").reshape(n_words, bus_width // 64)
    return values, packed, words


def decode(out: np.ndarray, simd: int) -> tuple[np.ndarray, np.ndarray]:
    """Return the ``(beats, simd)`` lanes and the ``last`` flags of StreamSim's ``o`` beats."""
    a = np.asarray(out)
    if a.ndim == 1:
        a = a.astype(np.uint64)[:, None]
    raw = np.ascontiguousarray(a.astype("<u8")).view(np.uint8).reshape(len(a), 8 * a.shape[1])
    return raw[:, :simd], raw[:, simd] & 1


def check_stream(r, unit: WeightUnpack, bits: int, count: int, packed, words, what: str):
    """Every element equals the reference, in order, once; ``last`` on the final beat only;
    every word accepted once."""
    simd = unit.simd
    q, last = decode(r.outputs["o"], simd)
    n_beats = -(-count // simd)
    assert len(q) == n_beats, f"{what}: {len(q)} beats, expected {n_beats}"
    expected = unpack_bits(np.ascontiguousarray(packed[None, :]), bits, count)[0]
    got = q.reshape(-1)[:count]
    bad = np.flatnonzero(got != expected)
    assert not bad.size, (f"{what}: element {bad[0]} is {got[bad[0]]}, expected "
                          f"{expected[bad[0]]} ({bad.size} differ)")
    np.testing.assert_array_equal(last, (np.arange(n_beats) == n_beats - 1).astype(np.uint8),
                                  err_msg=what)
    assert len(r.accepted["i"]) == len(words) == unit.words(bits, count), what


def counts_for(simd: int, bus_width: int, bits: int, rng) -> list[int]:
    """1, simd - 1, simd, a few hundred, a count filling whole words, one ending an element past
    a word boundary (mid-word unless bits == bus_width), random ones, a long one."""
    per = bus_width // int(np.gcd(bus_width, bits))  # elements in a whole number of words
    counts = {1, max(1, simd - 1), simd, 2 * simd + 1, 300, per * (1 + 200 // per),
              per * 3 + 1, int(rng.integers(150, 450)), int(rng.integers(450, 700)),
              int(rng.integers(3000, 6000))}
    return sorted(counts)


def random_segments(unit: WeightUnpack, rng, bits_values):
    """One segment per ``(bits, register)`` and count: a ``bits``-bit stream with the ``bits``
    register set to ``register``. Returns the segments and (bits, count, packed, words) each."""
    segs, cases = [], []
    for bits, reg in bits_values:
        for count in counts_for(unit.simd, unit.bus_width, bits, rng):
            _, packed, words = make_stream(rng, bits, count, unit.bus_width)
            segs.append(Segment({"i": words}, {"bits": reg, "count": count},
                                phases=[["start"], ["i"]], expect={"o": -(-count // unit.simd)}))
            cases.append((bits, count, packed, words))
    return segs, cases


def run_random(simd: int, bus_width: int, seed: int):
    unit, sim = unpacker(simd, bus_width)
    rng = np.random.default_rng(seed)
    segs, cases = random_segments(unit, rng, [(b, b) for b in range(2, 9)])
    # count 0 between streams: no word, no beat (the drain cycles would catch a late one)
    segs.insert(3, Segment({}, {"bits": 4, "count": 0}, phases=[["start"]], expect={"o": 0}))
    cases.insert(3, (4, 0, np.zeros(0, np.uint8), np.zeros(0, np.uint64)))
    results = sim.run_segments(segs, idle=0.3, backpressure=0.3, seed=seed)
    for (bits, count, packed, words), r in zip(cases, results, strict=True):
        check_stream(r, unit, bits, count, packed, words, f"bits {bits} count {count}")
    # the pauses happened: fewer words than cycles from each stream's first word to its last
    spans = [(r.accepted["i"][-1] - r.accepted["i"][0] + 1, len(r.accepted["i"]))
             for r in results if len(r.accepted["i"])]
    span, n_words = np.sum(spans, axis=0)
    assert span > 1.2 * n_words, (span, n_words)


@pytest.mark.parametrize("simd, bus_width", SHAPES)
def test_random_streams(simd, bus_width):
    """Every bits in 2..8, counts 1 .. 6000, idle 0.3 and back-pressure 0.3, one process."""
    run_random(simd, bus_width, seed=simd * 1000 + bus_width)


@pytest.mark.slow
@pytest.mark.parametrize("simd, bus_width", SLOW_SHAPES)
def test_random_streams_more_shapes(simd, bus_width):
    run_random(simd, bus_width, seed=simd * 1000 + bus_width)


def run_throughput(simd: int, bus_width: int, report: list | None = None):
    """No pauses, a long stream per bits: first word in the cycle after start, first beat
    ``latency`` cycles after the word completing it, then ``elements_per_cycle(bits)``."""
    unit, sim = unpacker(simd, bus_width)
    rng = np.random.default_rng(11)
    count = max(2000, 256 * simd) + 3
    segs, cases = [], []
    for bits in range(2, 9):
        _, packed, words = make_stream(rng, bits, count, bus_width)
        segs.append(Segment({"i": words}, {"bits": bits, "count": count},
                            phases=[["start"], ["i"]], expect={"o": -(-count // simd)}))
        cases.append((bits, packed, words))
    results = sim.run_segments(segs)
    for (bits, packed, words), r in zip(cases, results, strict=True):
        check_stream(r, unit, bits, count, packed, words, f"bits {bits}")
        acc, out = r.accepted["i"], r.output_cycles["o"]
        assert acc[0] == 1, (bits, acc[:3])                 # start in cycle 0
        first_words = -(-min(simd, count) * bits // bus_width)
        assert out[0] == acc[first_words - 1] + unit.latency, (bits, out[0], acc[:4])
        epc = unit.elements_per_cycle(bits)
        if simd * bits <= bus_width:                         # one beat every cycle
            np.testing.assert_array_equal(out, out[0] + np.arange(len(out)))
        else:                                                # one word every cycle
            np.testing.assert_array_equal(acc, acc[0] + np.arange(len(acc)))
        cycles = out[-1] - acc[0] + 1 - unit.latency         # first word to last beat
        assert abs(cycles - count / epc) <= 2, (bits, cycles, count / epc)
        measured = count / cycles
        if report is not None:
            report.append(f"bits {bits}: {measured:.3f} el/cycle (contract {epc:.3f})")


@pytest.mark.parametrize("simd, bus_width", SHAPES)
def test_throughput_and_latency(simd, bus_width):
    report: list[str] = []
    run_throughput(simd, bus_width, report)
    print(f"\nWeightUnpack simd={simd} bus_width={bus_width}: " + "; ".join(report))


@pytest.mark.slow
@pytest.mark.parametrize("simd, bus_width", SLOW_SHAPES)
def test_throughput_and_latency_more_shapes(simd, bus_width):
    run_throughput(simd, bus_width)


def test_bits_out_of_range_act_as_8():
    """``bits`` 0, 1, 9 and 15 unpack bytes (ceil(count * 8 / bus_width) words), with pauses."""
    unit, sim = unpacker(16, 64)
    rng = np.random.default_rng(4)
    segs, cases = random_segments(unit, rng, [(8, reg) for reg in (0, 1, 9, 15)])
    results = sim.run_segments(segs, idle=0.3, backpressure=0.3, seed=2)
    for seg, (bits, count, packed, words), r in zip(segs, cases, results, strict=True):
        check_stream(r, unit, bits, count, packed, words,
                     f"bits register {seg.static['bits']} count {count}")


@pytest.mark.parametrize("simd, bus_width", [(16, 64), (8, 32)])
def test_start_aborts_between_segments(simd, bus_width):
    """A stream cut off after some words (its whole beats taken, the rest of the words never
    sent) is aborted by the next ``start``; the next stream comes out right."""
    unit, sim = unpacker(simd, bus_width)
    rng = np.random.default_rng(8)
    segs, cases = [], []
    for k, (b1, b2) in enumerate([(3, 5), (7, 2), (8, 6), (5, 4), (2, 7)]):
        count = 400 + 37 * k
        _, packed, words = make_stream(rng, b1, count, bus_width)
        sent = 3 + int(rng.integers(0, len(words) - 6))
        beats = sent * bus_width // (simd * b1)              # whole beats in the words sent
        segs.append(Segment({"i": words[:sent]}, {"bits": b1, "count": count},
                            phases=[["start"], ["i"]], expect={"o": beats}))
        cases.append((b1, count, packed, beats))
        count = 300 + 11 * k
        _, packed, words = make_stream(rng, b2, count, bus_width)
        segs.append(Segment({"i": words}, {"bits": b2, "count": count},
                            phases=[["start"], ["i"]], expect={"o": -(-count // simd)}))
        cases.append((b2, count, packed, words))
    results = sim.run_segments(segs, idle=0.3, backpressure=0.3, seed=9, until_idle=None)
    for (bits, count, packed, words), r in zip(cases, results, strict=True):
        if isinstance(words, int):                           # the aborted stream: its beats
            q, last = decode(r.outputs["o"], simd)
            assert len(q) == words and not last.any(), (bits, count, len(q), words)
            np.testing.assert_array_equal(q.reshape(-1), unpack_bits(
                np.ascontiguousarray(packed[None, :]), bits, words * simd)[0])
        else:
            check_stream(r, unit, bits, count, packed, words, f"after abort: bits {bits}")


def test_start_aborts_held_beat_amaranth_sim():
    """Amaranth's simulator: ``start`` while a beat is held on ``o`` and a word is offered on
    ``i``: ``i.ready`` is low in that cycle, the beat is withdrawn, the word is not taken (it
    is the next stream's first word), and the next stream comes out right; ``busy`` falls
    after its last beat."""
    simd, bus_width = 8, 32
    dut = WeightUnpack(simd=simd, bus_width=bus_width)
    rng = np.random.default_rng(21)
    _, _, old = make_stream(rng, 5, 200, bus_width)
    count = 77
    values, packed, new = make_stream(rng, 3, count, bus_width)
    got, lasts = [], []

    async def testbench(ctx):
        ctx.set(dut.bits, 5)
        ctx.set(dut.count, 200)
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)
        ctx.set(dut.i.valid, 1)
        for w in old[:4]:                       # four words in, nothing taken out
            ctx.set(dut.i.payload, int(w))
            while not ctx.get(dut.i.ready):
                await ctx.tick()
            await ctx.tick()
        assert ctx.get(dut.o.valid) and ctx.get(dut.busy) and ctx.get(dut.i.ready)
        ctx.set(dut.i.payload, int(new[0]))     # the next stream's first word, offered
        ctx.set(dut.bits, 3)
        ctx.set(dut.count, count)
        ctx.set(dut.start, 1)
        assert not ctx.get(dut.i.ready)
        await ctx.tick()
        ctx.set(dut.start, 0)
        assert not ctx.get(dut.o.valid)
        k = 0
        for _ in range(1000):
            ctx.set(dut.i.valid, k < len(new))
            if k < len(new):
                ctx.set(dut.i.payload, int(new[k]))
            ready = bool(rng.random() < 0.6)
            ctx.set(dut.o.ready, ready)
            if ctx.get(dut.i.valid) and ctx.get(dut.i.ready):
                k += 1
            if ready and ctx.get(dut.o.valid):
                beat = ctx.get(dut.o.payload)
                got.extend(int(x) for x in beat.q)
                lasts.append(int(beat.last))
            await ctx.tick()
            if lasts and lasts[-1]:
                break
        assert k == len(new)
        assert not ctx.get(dut.busy) and not ctx.get(dut.o.valid)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    n = -(-count // simd)
    assert lasts == [0] * (n - 1) + [1]
    np.testing.assert_array_equal(np.array(got[:count], np.uint8),
                                  unpack_bits(packed[None, :], 3, count)[0])
    np.testing.assert_array_equal(np.array(got[:count], np.uint8), values)


def test_contract_numbers():
    u = WeightUnpack(simd=16, bus_width=64)
    assert u.latency == 2 and u.buffer_width == 64 + 128 + 64 and u.count_width == 24
    assert [u.elements_per_cycle(b) for b in (2, 4)] == [16.0, 16.0]
    assert u.elements_per_cycle(8) == 8.0 and u.elements_per_cycle(5) == 12.8
    assert u.words(3, 100) == 5 and u.words(8, 0) == 0
    sig = u.signature.members
    assert sig["o"].signature.members["payload"].shape.size == 16 * 8 + 1
    assert sig["count"].shape.width == 24


@pytest.mark.parametrize("kwargs, exc, name", [
    (dict(simd=3, bus_width=64), ValueError, "simd"),
    (dict(simd=128, bus_width=64), ValueError, "simd"),
    (dict(simd=16.0, bus_width=64), TypeError, "simd"),
    (dict(simd=16, bus_width=48), ValueError, "bus_width"),
    (dict(simd=16, bus_width=512), ValueError, "bus_width"),
    (dict(simd=16, bus_width="64"), TypeError, "bus_width"),
    (dict(simd=16, bus_width=64, count_width=0), ValueError, "count_width"),
    (dict(simd=16, bus_width=64, count_width=True), TypeError, "count_width"),
])
def test_argument_errors(kwargs, exc, name):
    with pytest.raises(exc, match=name) as info:
        WeightUnpack(**kwargs)
    bad = next(v for k, v in kwargs.items() if k == name)
    assert repr(bad) in str(info.value) or str(bad) in str(info.value)


@pytest.mark.parametrize("call, exc, name", [
    (lambda u: u.elements_per_cycle(1), ValueError, "bits"),
    (lambda u: u.elements_per_cycle(9), ValueError, "bits"),
    (lambda u: u.words(4, -1), ValueError, "count"),
    (lambda u: u.words(4, 1 << 24), ValueError, "count"),
    (lambda u: u.words(None, 1), TypeError, "bits"),
])
def test_method_argument_errors(call, exc, name):
    with pytest.raises(exc, match=name):
        call(WeightUnpack(simd=4, bus_width=32))
