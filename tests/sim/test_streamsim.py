# amaranth: UnusedElaboratable=no
"""The Verilator stream loop (qaccel.sim.streamsim): a two-channel "+ amount" stream block under
random idle cycles and back-pressure, throughput and latency, pulses, phases and segments, a
component that breaks the stream rules, a stalled sink, argument errors; then the Quantize unit
on jobs from qaccel.sim.matrix plus a 200k-element per-axis job, checked with check_jobs."""

from __future__ import annotations

import resource
import time

import numpy as np
import pytest
from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from qaccel.model.config import AccelConfig
from qaccel.rtl.elementwise.quantize import Quantize
from qaccel.sim.elementwise_sim import (
    JobResult,
    check_jobs,
    elementwise_sim,
    run_elementwise_fast,
)
from qaccel.sim.jobs import quantize_job
from qaccel.sim.matrix import quantize_matrix, random_float, random_scale
from qaccel.sim.runner import missing_simulator
from qaccel.sim.streamsim import Segment, StreamProtocolError, StreamSim, StreamStallError

pytestmark = [
    pytest.mark.sim,
    pytest.mark.skipif(missing_simulator("verilator") is not None,
                       reason=missing_simulator("verilator") or ""),
]

WIDE = 100
#: Cycles from an input transfer to its output transfer in PlusN, without pauses.
PLUS_LATENCY = 3


class PlusN(wiring.Component):
    """Two independent channels, ``a`` (16 bits) to ``p`` and ``w`` (100 bits) to ``q``: each
    adds ``amount`` (wrapping) in a register stage followed by a 4-beat FIFO. ``start`` loads
    ``amount`` from ``inc`` (0 after reset). ``busy``: a beat in a register or a FIFO."""

    def __init__(self):
        super().__init__({
            "a": In(stream.Signature(16)), "p": Out(stream.Signature(16)),
            "w": In(stream.Signature(WIDE)), "q": Out(stream.Signature(WIDE)),
            "inc": In(8), "start": In(1), "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        amount = Signal(8)
        with m.If(self.start):
            m.d.sync += amount.eq(self.inc)
        busy = []
        for k, (i, o) in enumerate(((self.a, self.p), (self.w, self.q))):
            width = len(i.payload)
            m.submodules[f"fifo{k}"] = f = SyncFIFOBuffered(width=width, depth=4)
            r_valid, r_data = Signal(), Signal(width)
            m.d.comb += i.ready.eq(~r_valid | f.w_rdy)
            with m.If(i.ready):
                m.d.sync += [r_valid.eq(i.valid), r_data.eq(i.payload + amount)]
            m.d.comb += [f.w_en.eq(r_valid), f.w_data.eq(r_data), o.payload.eq(f.r_data),
                         o.valid.eq(f.r_rdy), f.r_en.eq(o.ready)]
            busy += [r_valid, f.level != 0]
        m.d.comb += self.busy.eq(busy[0] | busy[1] | busy[2] | busy[3])
        return m


class Broken(wiring.Component):
    """An output stream that breaks the rules: ``mode`` 0 raises ``valid`` every other cycle
    whatever ``ready`` is (payload 0x5A); ``mode`` 1 holds ``valid`` high with a cycle counter
    as the payload (it changes while the sink waits)."""

    def __init__(self):
        super().__init__({"mode": In(1), "o": Out(stream.Signature(8))})

    def elaborate(self, platform):
        m = Module()
        cnt = Signal(8)
        m.d.sync += cnt.eq(cnt + 1)
        m.d.comb += [self.o.payload.eq(Mux(self.mode, cnt, 0x5A)),
                     self.o.valid.eq(self.mode | cnt[0])]
        return m


@pytest.fixture(scope="module")
def plus() -> StreamSim:
    return StreamSim(PlusN(), name="streamsim_plus")


@pytest.fixture(scope="module")
def broken() -> StreamSim:
    return StreamSim(Broken(), name="streamsim_broken")


def child_cpu() -> float:
    """CPU seconds used by finished child processes (the loop), robust to a busy machine."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime


def wide_beats(rng, n: int) -> list[int]:
    hi = rng.integers(0, 1 << 36, n, dtype=np.uint64).tolist()
    lo = rng.integers(0, 1 << 64, n, dtype=np.uint64).tolist()
    return [(h << 64) | v for h, v in zip(hi, lo, strict=True)]


def as_ints(words: np.ndarray) -> list[int]:
    return [int(r[0]) | (int(r[1]) << 64) for r in words]


def test_ports(plus):
    assert plus.input_streams == ("a", "w")
    assert plus.output_streams == ("p", "q")
    assert set(plus.statics) == {"inc", "start"}
    assert plus.flags == ("busy",)


def test_random_pauses_every_beat_once_in_order(plus):
    """200k + 20k beats with idle 0.3 / back-pressure 0.3: each arrives once, in order, + inc."""
    rng = np.random.default_rng(5)
    a = rng.integers(0, 1 << 16, 200_000, dtype=np.uint16)
    w = wide_beats(rng, 20_000)
    kw = dict(phases=[["start"], ["a", "w"]], idle=0.3, backpressure=0.3, seed=7)
    t0, c0 = time.perf_counter(), child_cpu()
    r = plus.run({"a": a, "w": w}, {"inc": 5}, **kw)
    wall, cpu = time.perf_counter() - t0, child_cpu() - c0
    np.testing.assert_array_equal(r.outputs["p"], (a.astype(np.int64) + 5) & 0xFFFF)
    assert r.outputs["p"].dtype == np.uint16
    assert r.outputs["q"].shape == (len(w), 2)
    assert as_ints(r.outputs["q"]) == [(v + 5) % (1 << WIDE) for v in w]
    for name, n in (("a", len(a)), ("w", len(w))):
        assert len(r.accepted[name]) == n
        assert np.all(np.diff(r.accepted[name]) >= 1)
    for name in ("p", "q"):
        assert np.all(np.diff(r.output_cycles[name]) >= 1)
    # The phase order: start in cycle 0, the streams from cycle 1 on.
    assert r.accepted["a"][0] >= 1 and r.accepted["w"][0] >= 1
    # Pauses really happened: about 0.7 beats per cycle on a.
    rate = len(a) / (r.accepted["a"][-1] - r.accepted["a"][0] + 1)
    assert 0.45 < rate < 0.8, rate
    assert r.cycles > r.output_cycles["p"][-1]
    beats = len(a) + len(w)
    print(f"\n{beats} beats with pauses in {r.cycles} cycles: {beats / wall / 1e6:.2f}M beats/s "
          f"(run {wall:.2f} s, loop {plus.last_run.sim:.2f} s, loop CPU {cpu:.2f} s)")
    # Reproducible from the seed.
    r2 = plus.run({"a": a[:1000], "w": w[:100]}, {"inc": 5}, **kw)
    r3 = plus.run({"a": a[:1000], "w": w[:100]}, {"inc": 5}, **kw)
    np.testing.assert_array_equal(r2.accepted["a"], r3.accepted["a"])
    np.testing.assert_array_equal(r2.output_cycles["q"], r3.output_cycles["q"])


def test_throughput_and_latency(plus):
    """No pauses: one beat per cycle in and out, every beat after the same latency."""
    n = 300_000
    a = np.arange(n, dtype=np.uint64) & 0xFFFF
    t0, c0 = time.perf_counter(), child_cpu()
    r = plus.run({"a": a}, until_idle="busy")
    wall, cpu = time.perf_counter() - t0, child_cpu() - c0
    np.testing.assert_array_equal(r.accepted["a"], np.arange(n))
    np.testing.assert_array_equal(r.output_cycles["p"], np.arange(n) + PLUS_LATENCY)
    np.testing.assert_array_equal(r.outputs["p"], a)
    assert r.outputs["q"].shape == (0, 2)
    print(f"\n{n} beats at 1 beat/cycle: {n / wall / 1e6:.2f}M beats/s "
          f"(loop {n / plus.last_run.sim / 1e6:.2f}M cycles/s, {n / cpu / 1e6:.2f}M per CPU s)")


def test_pulse_cycle_and_expect(plus):
    """A pulse at cycle 10 of a concurrent stream: beats accepted up to cycle 10 get +0, later
    ones + inc; the run ends on ``expect`` alone (no idle flag)."""
    n = 40
    r = plus.run({"a": np.zeros(n, np.uint16)}, {"inc": 9}, pulses={"start": 10},
                 expect={"p": n}, until_idle=None, drain=0)
    np.testing.assert_array_equal(r.accepted["a"], np.arange(n))
    np.testing.assert_array_equal(r.outputs["p"], np.where(np.arange(n) <= 10, 0, 9))
    assert r.cycles == n + PLUS_LATENCY and r.drain == 0


def test_segments(plus):
    """Segments back to back, each with its own static value, phases and cycle origin."""
    rng = np.random.default_rng(3)
    segs = [Segment({"a": np.full(50, 100 * k, np.uint16), "w": [k] * 30}, {"inc": k + 1},
                    phases=[["start"], ["a"], ["w"]]) for k in range(5)]
    results = plus.run_segments(segs, idle=0.2, backpressure=0.4, seed=int(rng.integers(99)))
    assert len(results) == 5
    for k, r in enumerate(results):
        np.testing.assert_array_equal(r.outputs["p"], np.full(50, 100 * k + k + 1))
        assert as_ints(r.outputs["q"]) == [2 * k + 1] * 30
        # w is fed after the last beat of a (phases); cycles count from the segment start
        assert r.accepted["w"][0] > r.accepted["a"][-1] >= r.accepted["a"][0] >= 1
        assert r.cycles > max(r.output_cycles["p"][-1], r.output_cycles["q"][-1])


def test_negative_and_wide_values(plus):
    """Negative Python ints are two's complement; wide payloads also as (n, 2) word arrays."""
    w = np.array([[2**64 - 1, 2**36 - 1], [5, 1]], np.uint64)
    r = plus.run({"a": [-1, -2, 3, 65535], "w": w})
    np.testing.assert_array_equal(r.outputs["p"], [0xFFFF, 0xFFFE, 3, 0xFFFF])
    np.testing.assert_array_equal(r.outputs["q"], w)
    r = plus.run({"w": [-1, 1 << 99]})
    assert as_ints(r.outputs["q"]) == [(1 << WIDE) - 1, 1 << 99]


@pytest.mark.parametrize("mode, message", [
    (0, "valid fell without a transfer"),
    (1, "the payload changed from 0x"),
])
def test_protocol_violation(broken, mode, message):
    with pytest.raises(StreamProtocolError) as info:
        broken.run({}, {"mode": mode}, expect={"o": 1000}, until_idle=None, backpressure=0.5)
    text = str(info.value)
    assert "protocol violation on output stream 'o' at cycle" in text and message in text, text


def test_watchdog_names_stalled_sink(plus):
    """A sink that is never ready: the watchdog names 'p' with valid=1 ready=0."""
    with pytest.raises(StreamStallError) as info:
        plus.run({"a": np.arange(100)}, backpressure=1.0, watchdog=300)
    text = str(info.value)
    assert "output stream 'p' stalled for 300 cycles (valid=1 ready=0" in text, text
    assert "input 'a' valid=1 ready=0" in text, text


def test_max_cycles(plus):
    with pytest.raises(StreamStallError, match=r"max_cycles \(50\) reached .*input 'a' valid="):
        plus.run({"a": np.arange(100)}, max_cycles=50)


@pytest.mark.parametrize("call, exc, message", [
    (lambda s: s.run({"x": [1]}), ValueError, "no input stream 'x'; its input streams are: a, w"),
    (lambda s: s.run({"a": [1]}, {"a": 1}), ValueError, "has no plain input 'a'"),
    (lambda s: s.run({"a": [1 << 16]}), ValueError, "outside"),
    (lambda s: s.run({"a": [1.5]}), TypeError, "must hold integers (bit patterns), not 1.5"),
    (lambda s: s.run({"a": np.array([1.5])}), TypeError, "integer array"),
    (lambda s: s.run({"a": [-1, -(1 << 15) - 1]}), ValueError, "outside [-32768, 65535]"),
    (lambda s: s.run({"w": np.ones(3, np.uint64)}), ValueError, "shape (n, 2)"),
    (lambda s: s.run({"w": [1 << WIDE]}), ValueError, "outside"),
    (lambda s: s.run({"a": 3}), TypeError, "array of beats"),
    (lambda s: s.run({"a": [1]}, {"inc": 256}), ValueError, "cannot hold 256"),
    (lambda s: s.run({"a": [1]}, idle=1.5), ValueError, "idle must be in [0, 1], not 1.5"),
    (lambda s: s.run({"a": [1]}, backpressure="x"), TypeError, "backpressure must be"),
    (lambda s: s.run({"a": [1]}, pulses={"inc": 0}), ValueError, "only 1-bit ports"),
    (lambda s: s.run({"a": [1]}, {"start": 1}, pulses={"start": 0}), ValueError,
     "both static and pulsed"),
    (lambda s: s.run({"a": [1], "w": [1]}, phases=[["a"]]), ValueError, "missing ['w']"),
    (lambda s: s.run({"a": [1]}, phases=[["a"], ["q"]]), ValueError, "phases name 'q'"),
    (lambda s: s.run({"a": [1]}, until_idle="nope"), ValueError, "no 1-bit plain output 'nope'"),
    (lambda s: s.run({"a": [1]}, expect={"p": -1}), ValueError, "expect['p'] must be in"),
    (lambda s: s.run({"a": [1]}, seed=-1), ValueError, "seed must be in"),
    (lambda s: s.run({"a": [1]}, watchdog=0), ValueError, "watchdog must be in"),
    (lambda s: s.run_segments([]), ValueError, "at least one Segment"),
    (lambda s: s.run_segments([{"a": [1]}]), TypeError, "segments[0]: must be a Segment"),
    (lambda s: s.run_segments([Segment({"a": [1]}), Segment({"p": [1]})]), ValueError,
     "segments[1]: streamsim_plus has no input stream 'p'"),
])
def test_argument_errors(plus, call, exc, message):
    with pytest.raises(exc) as info:
        call(plus)
    assert message in str(info.value), str(info.value)


def test_not_a_component():
    with pytest.raises(TypeError, match="wiring.Component"):
        StreamSim(object())
    with pytest.raises(ValueError, match="Verilog identifier"):
        StreamSim(PlusN(), name="no good")


def test_design_key_reuses_the_build_without_emitting(plus, monkeypatch):
    """A build found under its design key is reused without emitting the Verilog again (the
    first construction emits it, finds the ``plus`` fixture's build and indexes it)."""
    import qaccel.sim.vectors as vectors

    StreamSim(PlusN(), name="streamsim_plus", design_key="test-plus-v1")

    def refuse(*args, **kwargs):
        raise AssertionError("emitted the Verilog of a design whose build is known")

    monkeypatch.setattr(vectors, "clean_verilog", refuse)
    again = StreamSim(PlusN(), name="streamsim_plus", design_key="test-plus-v1")
    assert not again.built
    a = np.arange(100, dtype=np.uint16)
    r = again.run({"a": a, "w": [1, 2]}, {"inc": 3}, phases=[["start"], ["a", "w"]])
    np.testing.assert_array_equal(r.outputs["p"], a + 3)
    with pytest.raises(AssertionError, match="emitted the Verilog"):   # another design
        StreamSim(PlusN(), name="streamsim_plus", design_key="test-plus-v2")


# ---------------------------------------------------------------------------------------------
# The Quantize unit


SMALL_Q = dict(lanes=2, q_inputs=("float32",), scales=("float32",), q_outputs=("int8", "uint4"))
BIG = (250, 800)     # 200k elements, per-axis along the last axis


@pytest.fixture(scope="module")
def quantize():
    unit = Quantize(AccelConfig(**SMALL_Q))
    rng = np.random.default_rng(61)
    jobs = quantize_matrix(unit, rng)
    x = random_float("float32", BIG, rng)
    scale = random_scale("float32", (BIG[1],), rng)
    zp = rng.integers(-20, 20, BIG[1]).astype(np.int8)
    with np.errstate(all="ignore"):
        jobs.append(quantize_job(unit, x, scale, zp, axis=-1, label="Q float32 -> int8 200k"))
    return unit, jobs, elementwise_sim(unit, name="streamsim_quantize")


def test_quantize_paused(quantize):
    unit, jobs, sim = quantize
    c0 = child_cpu()
    results = run_elementwise_fast(unit, jobs, idle=0.3, backpressure=0.3, seed=3)
    cpu = child_cpu() - c0
    check_jobs(jobs, results)
    beats = sum(r.beats for r in results)
    assert beats == sum(len(j.y) for j in jobs) > 100_000
    big = results[-1]
    assert 0.4 < big.beats_per_cycle < 0.8, big.beats_per_cycle
    print(f"\nQuantize, idle/back-pressure 0.3: {len(jobs)} jobs, {beats} beats checked at "
          f"{beats / sim.last_run.wall / 1e6:.2f}M beats/s ({sim.last_run.cycles} cycles, "
          f"loop {sim.last_run.cycles / sim.last_run.sim / 1e6:.2f}M cycles/s, "
          f"{sim.last_run.cycles / cpu / 1e6:.2f}M per CPU s)")


def test_quantize_throughput(quantize):
    unit, jobs, sim = quantize
    c0 = child_cpu()
    results = run_elementwise_fast(unit, jobs)
    cpu = child_cpu() - c0
    check_jobs(jobs, results)
    for job, r in zip(jobs, results, strict=True):
        assert r.latency == unit.latency, (job.label, r.latency)
        assert r.beats_per_cycle == 1.0 and r.x_beats_per_cycle == 1.0, job.label
    big = results[-1]
    assert big.beats >= 100_000 and big.beats_per_cycle >= 0.99
    # One simulator per (unit class, configuration, name): no second Verilog emission.
    assert elementwise_sim(Quantize(AccelConfig(**SMALL_Q)), name="streamsim_quantize") is sim
    assert big.cycles < big.beats + len(jobs[-1].table) + 100
    beats = sum(r.beats for r in results)
    print(f"\nQuantize, no pauses: {beats} beats at {beats / sim.last_run.wall / 1e6:.2f}M "
          f"beats/s ({beats / cpu / 1e6:.2f}M per CPU s), latency {unit.latency}, "
          f"{big.beats_per_cycle:.4f} beats/cycle")


def test_check_jobs_names_job_and_beat(quantize):
    unit, jobs, _ = quantize
    job = jobs[1]
    good = JobResult(job.label, list(job.y), np.arange(len(job.y)), np.arange(len(job.x)), 99)
    check_jobs([job], [good])
    # lanes past the element count in the last beat are not compared
    width = unit.signature.members["y"].signature.members["payload"].shape.size
    tail = list(job.y)
    tail[-1] ^= ~job.ymask & ((1 << width) - 1)
    assert tail[-1] != job.y[-1]
    check_jobs([job], [JobResult(job.label, tail, good.y_cycles, good.x_cycles, 99)])
    bad = list(job.y)
    bad[7] ^= 0x10
    pattern = (rf"job 0 \('{job.label}'\): y beat 7 of {len(job.y)} is 0x[0-9a-f]+, "
               rf"expected 0x[0-9a-f]+ \(bits 0x10 differ; cycle 7\)")
    with pytest.raises(AssertionError, match=pattern):
        check_jobs([job], [JobResult(job.label, bad, good.y_cycles, good.x_cycles, 99)])
    with pytest.raises(AssertionError, match="3 y beats received, "):
        check_jobs([job], [JobResult(job.label, bad[:3], good.y_cycles, good.x_cycles, 99)])
