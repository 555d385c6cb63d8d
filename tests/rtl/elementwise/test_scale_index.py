# amaranth: UnusedElaboratable=no
"""ScaleIndex against model.indexing.run_indices: hundreds of layouts through Verilator
(qaccel.sim.vectors, one build with lanes 1, 2, 4, 8), and register values beyond those of
index_registers (size 1 dimensions anywhere, blocks as long as or longer than their
dimension, blocks in several dimensions, dimensions shorter than a beat, sizes and blocks
around the generator's internal thresholds, indices that wrap) against a direct model;
back-pressure, restarts and latency in Amaranth's simulator; the register helper and
parameter errors.

Both simulators produce a per-cycle trace (start, ready, valid, payload, busy) that one
checker splits into jobs: the beats transferred after a ``start`` (up to and including the
cycle of the next one) must be the job's reference indices, in order, none lost or repeated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import pytest
from amaranth.hdl import Fragment, Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from qaccel.model.indexing import ScaleLayout, broadcast_layout, run_indices, scale_layout
from qaccel.rtl.elementwise.scale_index import ScaleIndex, index_registers
from qaccel.sim.runner import missing_simulator
from qaccel.sim.vectors import ComponentBank, VectorSim, join_fields, split_fields

requires_verilator = pytest.mark.skipif(missing_simulator("verilator") is not None,
                                        reason=missing_simulator("verilator") or "")

LANES = (1, 2, 4, 8)
CONFIG = ("size", "stride", "block")


# ---------------------------------------------------------------------------------------------
# Layouts


def blocked(shape, axis, block):
    scale = list(shape)
    scale[axis] = -(-shape[axis] // block)
    return scale_layout(shape, tuple(scale), axis, block)


def random_layout(rng: np.random.Generator):
    """A random per-tensor, per-axis, blocked or broadcast layout of rank 1..4, <= 4000
    elements."""
    while True:
        rank = int(rng.integers(1, 5))
        shape = tuple(int(n) for n in rng.choice([1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 16, 23, 40],
                                                 rank))
        if math.prod(shape) <= 4000:
            break
    kind = int(rng.integers(4))
    axis = int(rng.integers(-rank, rank))
    if kind == 0:
        return scale_layout(shape, (1,) * int(rng.integers(0, 2)), axis, 0)
    if kind == 1:
        return scale_layout(shape, (shape[axis],), axis, 0)
    if kind == 2:
        return blocked(shape, axis, int(rng.choice([1, 2, 3, 4, 5, 7, 8, 9, 16, 32])))
    keep = rng.random(rank) < 0.5
    return broadcast_layout(shape, tuple(n if k else 1 for n, k in zip(shape, keep,
                                                                        strict=True)))


def vector_layouts() -> list:
    """Per-tensor, per-axis on every axis, blocked (block 1..9, 16, 32, 128, partial last
    blocks), DirectML broadcast (every pattern), empty, and random layouts of ranks 1..4."""
    out = [scale_layout(s, (), 0, 0) for s in
           [(1,), (7,), (64,), (3, 4), (2, 3, 4), (2, 3, 4, 5), (1, 1, 1, 1), (5, 1, 7)]]
    out.append(scale_layout((5, 0, 3), (5,), 0, 0))
    for shape in [(9,), (3, 5), (1000, 3), (4, 3, 5), (2, 3, 4, 5), (3, 1, 6), (5, 2, 1, 3),
                  (13, 17), (1, 9, 2, 7)]:
        for axis in range(-len(shape), len(shape)):
            out.append(scale_layout(shape, (shape[axis],), axis, 0))
    for block in (*range(1, 10), 16, 32, 128):
        for shape, axis in [((50,), 0), ((3, 37), 1), ((37, 3), 0), ((2, 45, 3), 1),
                            ((2, 3, 4, 29), -1), ((4, 20, 2, 3), 1), ((2, 300), 1),
                            ((260, 2), -2), ((3, 2, 17, 2), 2)]:
            out.append(blocked(shape, axis, block))
    for shape in [(5,), (3, 4), (2, 3, 5), (2, 3, 4, 5), (3, 1, 4, 2), (7, 2, 9, 3), (5, 3, 9, 2),
                  (2, 9, 3, 11), (4, 8, 2, 16)]:
        for mask in range(1 << len(shape)):
            out.append(broadcast_layout(shape, tuple(1 if mask >> d & 1 else n
                                                     for d, n in enumerate(shape))))
    rng = np.random.default_rng(7)
    out += [random_layout(rng) for _ in range(120)]
    return out


@dataclass(frozen=True)
class RawJob:
    """A job given by its register values (``sizes``, ``strides``, ``blocks`` innermost first,
    ``max_dims`` of each, and ``count``): any configuration the contract allows, not only
    those :func:`index_registers` makes. :meth:`indices` is a direct model of the contract."""

    sizes: tuple
    strides: tuple
    blocks: tuple
    count: int
    index_width: int = 20

    @property
    def size(self) -> int:
        """Elements of the job (as ScaleLayout.size)."""
        return self.count

    def registers(self) -> dict:
        return {"size": self.sizes, "stride": self.strides, "block": self.blocks,
                "count": self.count}

    @cached_property
    def indices(self) -> np.ndarray:
        """``sum_d stride[d] * (i_d // block[d]) mod 2**index_width``, element by element;
        the outermost dimension does not wrap."""
        rest, total = np.arange(self.count, dtype=np.int64), 0
        for d, (n, st, b) in enumerate(zip(self.sizes, self.strides, self.blocks, strict=True)):
            i = rest if d == len(self.sizes) - 1 else rest % n
            rest = rest // max(n, 1)
            total = total + st * (i // b)
        return np.asarray(total, np.int64) % (1 << self.index_width)


def job_registers(dut: ScaleIndex, job) -> dict:
    return dut.registers(job) if isinstance(job, ScaleLayout) else job.registers()


def job_indices(job) -> np.ndarray:
    return run_indices(job).ravel() if isinstance(job, ScaleLayout) else job.indices


def describe(job) -> str:
    if isinstance(job, ScaleLayout):
        return f"{job.kind} {job.x_shape}, collapsed {job.sizes_c} / {job.strides_c} / " \
               f"{job.blocks_c}"
    return f"registers {job.sizes} / {job.strides} / {job.blocks}, count {job.count}"


#: Register values index_registers does not make, for 4 dimensions and 20-bit indices (the
#: outermost size is not used).
RAW_JOBS = [
    RawJob((1, 1, 1, 0), (5, 7, 11, 1), (1, 1, 1, 3), 40),        # every dimension wraps,
    RawJob((1, 6, 1, 0), (3, 1, 9, 10), (1, 4, 1, 2), 50),        # from the first element on
    RawJob((1, 1, 1, 0), (1, 1, 1, 1), (1, 1, 1, 1), 1),
    RawJob((2, 1, 3, 0), (1, 0, 2, 6), (1, 1, 3, 1), 97),
    RawJob((6, 4, 3, 0), (1, 2, 3, 5), (6, 4, 3, 7), 300),        # block = size
    RawJob((5, 4, 3, 0), (2, 3, 4, 5), (7, 9, 100, 1), 120),      # block > size
    RawJob((7, 5, 3, 0), (1, 4, 9, 20), (2, 3, 2, 4), 315),       # blocks in every dimension
    RawJob((3, 2, 2, 0), (1, 3, 7, 13), (2, 1, 2, 3), 200),       # dimensions shorter than
    RawJob((2, 3, 2, 0), (5, 1, 2, 3), (2, 2, 1, 2), 150),        # a beat
    RawJob((3, 4, 2, 0), (1, 3, 12, 24), (1, 1, 1, 7), 1000),     # count past the tensor
    RawJob((9, 7, 1, 0), (1 << 19, 3 << 18, 12345, 999), (2, 3, 1, 5), 500),  # wrapping sums
    RawJob((31, 32, 33, 0), (1, 2, 3, 4), (16, 17, 8, 9), 3000),  # around 2**k thresholds
    RawJob((8, 16, 15, 0), (3, 1, 2, 5), (8, 3, 16, 32), 2000),
    RawJob((4, 8, 32, 0), (1, 1, 1, 1), (4, 9, 33, 2), 1100),
    RawJob((65535, 2, 2, 0), (1, 2, 3, 4), (65535, 1, 2, 1), 300),  # widest size and block
    RawJob((65535, 2, 2, 0), (1, 2, 3, 4), (65534, 1, 2, 65535), 200),
    RawJob((5, 3, 2, 0), (1, 5, 15, 30), (1, 1, 1, 1), 0),        # nothing
]


def random_raw_job(rng: np.random.Generator) -> RawJob:
    """Sizes and blocks around the thresholds of 1, 2, 4 and 8 lanes, random strides."""
    sizes = [int(rng.choice([1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33])) for _ in range(3)]
    blocks = [int(rng.choice([1, 2, 3, 4, 7, 8, 9, 16, 33, n, n + 1])) for n in sizes]
    blocks.append(int(rng.choice([1, 2, 3, 5, 8, 17])))
    strides = [int(x) for x in rng.integers(0, 1 << 20, 4)]
    return RawJob((*sizes, 0), tuple(strides), tuple(blocks), int(rng.integers(0, 1500)))


# ---------------------------------------------------------------------------------------------
# Traces and the checker


def expected_latency(lanes: int, max_dims: int) -> int:
    """The documented latency: 3 for one lane, else ``2 * lanes + max_dims + 6``."""
    return 3 if lanes == 1 else 2 * lanes + max_dims + 6


def job_cycles(count: int, dut: ScaleIndex) -> int:
    """Cycles of a job with ``o.ready`` high: start and latency, beats, one idle cycle."""
    return dut.latency + -(-count // dut.lanes) + 1


def check_trace(trace: dict, jobs: list, dut: ScaleIndex) -> int:
    """Check a per-cycle trace of ``dut`` against ``jobs`` (``(layout, complete)`` per
    ``start``, in order); return the number of indices compared.

    ``trace`` holds equal-length arrays: ``start``, ``ready``, ``valid``, ``last``, ``busy``
    (1-D) and ``index`` (cycles x lanes). A job owns the transfers after its ``start`` up to
    the cycle of the next one. Checks the indices of every transferred beat (elements below
    the count), ``last``, the beat count of a complete job, the first beat
    ``dut.latency`` cycles after ``start``, the stream rule (an offered beat stays,
    unchanged, until taken, unless a ``start`` withdraws it) and ``busy`` (from the cycle
    after ``start`` to the last transfer of a complete job).
    """
    lanes, latency = dut.lanes, dut.latency
    start = np.asarray(trace["start"], bool)
    ready = np.asarray(trace["ready"], bool)
    valid = np.asarray(trace["valid"], bool)
    last = np.asarray(trace["last"], bool)
    busy = np.asarray(trace["busy"], bool)
    index = np.asarray(trace["index"], np.int64).reshape(len(start), lanes)
    n = len(start)
    starts = np.flatnonzero(start)
    assert len(starts) == len(jobs), f"{len(starts)} starts for {len(jobs)} jobs"
    # Stream rule: a beat offered and not taken is offered again, unchanged.
    held = valid[:-1] & ~ready[:-1] & ~start[:-1]
    bad = np.flatnonzero(held & ~valid[1:])
    assert not bad.size, f"o.valid dropped at cycle {bad[0] + 1} before its beat was taken"
    same = (index[:-1] == index[1:]).all(axis=1) & (last[:-1] == last[1:])
    bad = np.flatnonzero(held & ~same)
    assert not bad.size, f"o.payload changed at cycle {bad[0] + 1} while stalled"
    assert not (valid[:starts[0] + 1] if len(starts) else valid).any(), "beat before start"
    transfer = valid & ready
    compared = 0
    for j, (layout, complete) in enumerate(jobs):
        s = starts[j]
        e = starts[j + 1] + 1 if j + 1 < len(jobs) else n
        cyc = s + 1 + np.flatnonzero(transfer[s + 1:e])
        want = job_indices(layout)
        count = want.size
        beats = -(-count // lanes)
        what = f"job {j} (start at cycle {s}, {describe(layout)}, lanes {lanes})"
        assert len(cyc) <= beats, f"{what}: {len(cyc)} beats, expected {beats}"
        if complete:
            assert len(cyc) == beats, f"{what}: {len(cyc)} beats, expected {beats}"
        elements = min(len(cyc) * lanes, count)
        got = index[cyc].ravel()[:elements]
        bad = np.flatnonzero(got != want[:elements])
        assert not bad.size, (f"{what}: {bad.size} wrong indices, first at element "
                              f"{bad[0]}: {got[bad[0]]}, expected {want[bad[0]]}; got "
                              f"{got[:24].tolist()}, expected {want[:24].tolist()}")
        want_last = np.arange(len(cyc)) == beats - 1
        assert (last[cyc] == want_last).all(), f"{what}: last flags {last[cyc].astype(int)}"
        if len(cyc):
            assert valid[s + latency] and not valid[s + 1:s + latency].any(), \
                f"{what}: valid {valid[s:s + latency + 1].astype(int)} from start on"
        if complete:
            end = cyc[-1] if len(cyc) else s + 1
            assert busy[s + 1:end + 1].all() and not busy[end + 1:e - 1].any(), \
                f"{what}: busy {busy[s:e].astype(int)}"
        compared += elements
    return compared


# ---------------------------------------------------------------------------------------------
# Verilator: a test-only wrapper with o.ready tied high, one build for every lane count


class ReadyHarness(wiring.Component):
    """ScaleIndex with ``o.ready`` high and the stream as plain ports (``valid``, ``index``,
    ``last``), for ComponentBank and VectorSim."""

    def __init__(self, dut: ScaleIndex):
        self.dut = dut
        members = dut.signature.members
        super().__init__({
            **{name: In(members[name].shape) for name in (*CONFIG, "count", "start")},
            "valid": Out(1),
            "index": Out(dut.payload_layout["index"].shape),
            "last": Out(1),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = dut = self.dut
        m.d.comb += [getattr(dut, name).eq(getattr(self, name))
                     for name in (*CONFIG, "count", "start")]
        m.d.comb += [dut.o.ready.eq(1), self.valid.eq(dut.o.valid),
                     self.index.eq(dut.o.payload.index), self.last.eq(dut.o.payload.last),
                     self.busy.eq(dut.busy)]
        return m


@pytest.fixture(scope="module")
def bank() -> tuple[VectorSim, dict[int, ScaleIndex]]:
    units = {lanes: ScaleIndex(lanes=lanes, max_dims=4) for lanes in LANES}
    harness = ComponentBank({f"l{lanes}": ReadyHarness(unit) for lanes, unit in units.items()})
    return VectorSim(harness, name="scale_index_bank"), units


def run_bank(bank, schedule: dict[int, list]) -> dict[int, dict]:
    """Run one job list per lane count (``(layout, cycles)``: a ``start`` with the layout's
    registers, held for ``cycles``) in one VectorSim run; return a trace per lane count."""
    sim, units = bank
    n = max(sum(c for _, c in jobs) for jobs in schedule.values())
    inputs, outputs = {}, []
    for lanes, jobs in schedule.items():
        dut, key = units[lanes], f"l{lanes}"
        lengths = [c for _, c in jobs]
        pad = n - sum(lengths)
        regs = [job_registers(dut, layout) for layout, _ in jobs]
        for name in CONFIG:
            layout = dut.signature.members[name].shape
            bits = join_fields({d: np.array([r[name][d] for r in regs], np.uint64)
                                for d in range(dut.max_dims)}, layout)
            bits = np.repeat(bits, lengths, axis=0)
            inputs[f"{name}_{key}"] = np.concatenate([bits, np.repeat(bits[-1:], pad, 0)])
        count = np.repeat(np.array([r["count"] for r in regs], np.uint64), lengths)
        inputs[f"count_{key}"] = np.concatenate([count, np.repeat(count[-1:], pad)])
        start = np.zeros(n, np.uint8)
        start[np.cumsum([0, *lengths[:-1]])] = 1
        inputs[f"start_{key}"] = start
        outputs += [f"{name}_{key}" for name in ("valid", "index", "last", "busy")]
    out = sim.run(inputs, latency=0, outputs=outputs)
    traces = {}
    for lanes in schedule:
        key = f"l{lanes}"
        layout = units[lanes].payload_layout["index"].shape
        lane = split_fields(out[f"index_{key}"], layout)
        traces[lanes] = {
            "start": inputs[f"start_{key}"], "ready": np.ones(n, bool),
            "valid": out[f"valid_{key}"], "last": out[f"last_{key}"],
            "busy": out[f"busy_{key}"],
            "index": np.stack([lane[k] for k in range(lanes)], axis=1),
        }
    return traces


@pytest.mark.sim
@requires_verilator
def test_scale_index_layouts(bank):
    """Every layout of :func:`vector_layouts` (about 400) on lanes 1, 2, 4, 8, back to back
    in one run: the index sequence is run_indices(layout).ravel(), the first beat
    ``latency`` cycles after start, one beat per cycle, ``last`` on the final beat,
    ``busy`` until it."""
    layouts = vector_layouts()
    assert len(layouts) >= 300
    assert {lay.kind for lay in layouts} == {"per-tensor", "per-axis", "blocked", "broadcast"}
    assert max(len(lay.sizes_c) for lay in layouts) == 4
    units = bank[1]
    schedule = {lanes: [(lay, job_cycles(lay.size, unit)) for lay in layouts]
                for lanes, unit in units.items()}
    traces = run_bank(bank, schedule)
    total = 0
    for lanes, trace in traces.items():
        lat = units[lanes].latency
        assert lat == expected_latency(lanes, 4)
        total += check_trace(trace, [(lay, True) for lay in layouts], units[lanes])
        # One beat per cycle: each job's beats fill the cycles from start + latency on.
        valid = np.asarray(trace["valid"], bool)
        t = 0
        for lay, cycles in schedule[lanes]:
            beats = -(-lay.size // lanes)
            assert valid[t + lat:t + lat + beats].all()
            assert not valid[t + lat + beats:t + cycles].any()
            t += cycles
    assert total == 4 * sum(lay.size for lay in layouts)


@pytest.mark.sim
@requires_verilator
def test_scale_index_abort(bank):
    """A start while a job runs (in its set-up, staging or streaming cycles) aborts it: the
    beats up to the new start are a prefix of the old job's, the new job starts over."""
    rng = np.random.default_rng(11)
    layouts = [random_layout(rng) for _ in range(60)]
    schedule, jobs = {}, {}
    for lanes in LANES:
        schedule[lanes], jobs[lanes] = [], []
        for k, lay in enumerate(layouts):
            full = job_cycles(lay.size, bank[1][lanes])
            cut = int(rng.integers(1, full)) if k % 3 else full
            schedule[lanes].append((lay, cut))
            jobs[lanes].append((lay, cut == full))
    for lanes, trace in run_bank(bank, schedule).items():
        assert check_trace(trace, jobs[lanes], bank[1][lanes]) > 0


@pytest.mark.sim
@requires_verilator
def test_scale_index_long_outer_dimension(bank):
    """The outermost dimension's size is not a register: layouts whose outermost collapsed
    dimension is longer than size_width (16 bits) allows, blocked 1-D, (2, 33000) blocked by
    5 (which collapses to one dimension) and (65537, 2) blocked by 1000 along axis 0."""
    layouts = [blocked((65_540,), 0, 32), blocked((2, 33_000), 1, 5),
               blocked((65_537, 2), 0, 1000)]
    assert all(lay.sizes_c[0] >= 1 << 16 for lay in layouts)
    units = bank[1]
    schedule = {lanes: [(lay, job_cycles(lay.size, unit)) for lay in layouts]
                for lanes, unit in units.items()}
    for lanes, trace in run_bank(bank, schedule).items():
        assert check_trace(trace, [(lay, True) for lay in layouts], units[lanes]) == \
            sum(lay.size for lay in layouts)


def test_raw_model_matches_run_indices():
    """The direct model of :class:`RawJob` agrees with run_indices on the registers of
    every layout of :func:`vector_layouts`."""
    for lay in vector_layouts():
        regs = index_registers(lay, max_dims=4)
        job = RawJob(regs["size"], regs["stride"], regs["block"], regs["count"])
        assert np.array_equal(job.indices, run_indices(lay).ravel()), describe(lay)


@pytest.mark.sim
@requires_verilator
def test_scale_index_raw_registers(bank):
    """Register values index_registers does not make (:data:`RAW_JOBS` and 80 random ones),
    against the contract's formula: size 1 dimensions anywhere (every dimension wrapping
    from the first element on), blocks as long as or longer than their dimension and in
    several dimensions, dimensions shorter than a beat, sizes and blocks around 8, 16, 32,
    the widest size and block, a count past the tensor, sums that wrap, count 0."""
    rng = np.random.default_rng(3)
    jobs = RAW_JOBS + [random_raw_job(rng) for _ in range(80)]
    units = bank[1]
    schedule = {lanes: [(job, job_cycles(job.count, unit)) for job in jobs]
                for lanes, unit in units.items()}
    for lanes, trace in run_bank(bank, schedule).items():
        assert check_trace(trace, [(job, True) for job in jobs], units[lanes]) == \
            sum(job.count for job in jobs)


# ---------------------------------------------------------------------------------------------
# Amaranth simulator: latency, back-pressure, restarts (one simulation per lane count)


def simulate(dut: ScaleIndex, starts: dict[int, object], ready: list[bool]) -> dict:
    """Run ``len(ready)`` cycles: a ``start`` with layout ``starts[c]``'s registers in cycle
    ``c``, ``o.ready = ready[c]``; return the per-cycle trace."""
    trace = {key: [] for key in ("start", "ready", "valid", "last", "busy", "index")}

    async def testbench(ctx):
        for c, rdy in enumerate(ready):
            if c in starts:
                regs = job_registers(dut, starts[c])
                for name in CONFIG:
                    for d in range(dut.max_dims):
                        ctx.set(getattr(dut, name)[d], regs[name][d])
                ctx.set(dut.count, regs["count"])
            ctx.set(dut.start, c in starts)
            ctx.set(dut.o.ready, rdy)
            payload = ctx.get(dut.o.payload)
            trace["start"].append(c in starts)
            trace["ready"].append(rdy)
            trace["valid"].append(ctx.get(dut.o.valid))
            trace["last"].append(payload.last)
            trace["busy"].append(ctx.get(dut.busy))
            trace["index"].append([payload.index[k] for k in range(dut.lanes)])
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    return trace


SMALL_LAYOUTS = [
    blocked((4, 10), 1, 4),                      # partial last block
    scale_layout((5, 3), (3,), 1, 0),            # rows shorter than 4 and 8 lanes
    broadcast_layout((2, 3, 4), (2, 1, 4)),
    blocked((2, 9, 5), 1, 2),
    scale_layout((13,), (), 0, 0),
    blocked((12, 4), 0, 4),                      # blocked outermost dimension
    broadcast_layout((3, 1, 2, 5), (3, 1, 1, 5)),
    RAW_JOBS[1],                                 # size 1 dimensions, several blocks
    RAW_JOBS[7],                                 # dimensions shorter than a beat
]
#: Layouts of the restart phase: a is cut while streaming, again while its beat is stalled
#: (by b), b in its set-up cycle (by c); c runs to the end.
RESTART = (blocked((4, 10), 1, 3), broadcast_layout((6, 7), (6, 1)), blocked((3, 17), 1, 5))


@dataclass
class Phase:
    """Cycles ``[first, end)`` of a simulation and the jobs started in them."""

    first: int
    end: int
    jobs: list
    ends: list = field(default_factory=list)      # last transfer of each complete job


@dataclass
class Run:
    dut: ScaleIndex
    trace: dict
    phases: dict[str, Phase]

    def phase(self, name: str) -> tuple[dict, Phase]:
        """The trace of phase ``name`` (cycles renumbered from 0) and its jobs."""
        p = self.phases[name]
        trace = {k: v[p.first:p.end] for k, v in self.trace.items()}
        return trace, Phase(0, p.end - p.first, p.jobs, [e - p.first for e in p.ends])


def amaranth_schedule(dut: ScaleIndex, seed: int) -> tuple[dict, list[bool], dict]:
    """Starts, ready pattern and phases of the Amaranth simulation (see the tests below)."""
    rng = np.random.default_rng(seed)
    starts, ready, phases = {}, [], {}
    lanes, lat = dut.lanes, dut.latency
    # latency: a job with ready high, then an empty one.
    a, empty = SMALL_LAYOUTS[0], scale_layout((5, 0, 3), (5,), 0, 0)
    beats = -(-a.size // lanes)
    starts[2], starts[3 + lat + beats] = a, empty
    ready += [True] * (6 + 2 * lat + beats)
    phases["latency"] = Phase(0, len(ready), [(a, True), (empty, True)], [1 + lat + beats])
    # back-pressure: random ready, the next job starts 2 cycles after the last transfer.
    first, jobs, ends = len(ready), [], []
    for lay in SMALL_LAYOUTS:
        t = len(ready)
        starts[t] = lay
        p = rng.choice([0.25, 0.5, 0.9])
        r = (rng.random(40 * -(-lay.size // lanes) + 40) < p).tolist()
        r[:lat] = [False] * lat
        end = t + int(np.flatnonzero(r)[-(-lay.size // lanes) - 1])    # last transfer
        ready += r[:end - t + 3]                # two idle cycles
        jobs.append((lay, True))
        ends.append(end)
    phases["backpressure"] = Phase(first, len(ready), jobs, ends)
    # restart
    t0 = len(ready)
    a, b, c = RESTART
    t1 = t0 + lat + min(2, -(-a.size // lanes) - 1)
    t2 = t1 + lat + 3
    t3 = t2 + 1
    starts.update({t0: a, t1: a, t2: b, t3: c})
    n = t3 + lat + -(-c.size // lanes) + 3
    ready += [not t1 + lat + 1 <= cyc <= t2 for cyc in range(t0, n)]
    phases["restart"] = Phase(t0, n, [(a, False), (a, False), (b, False), (c, True)],
                              [n - 4])
    return starts, ready, phases


@pytest.fixture(scope="module", params=LANES, ids=lambda lanes: f"lanes{lanes}")
def run(request) -> Run:
    dut = ScaleIndex(lanes=request.param, max_dims=4)
    starts, ready, phases = amaranth_schedule(dut, seed=request.param)
    return Run(dut, simulate(dut, starts, ready), phases)


def test_scale_index_latency(run):
    """The first beat comes ``latency`` cycles after start (as documented), then one per
    cycle; busy from the cycle after start to the last beat; count 0 emits nothing."""
    trace, phase = run.phase("latency")
    dut, lat = run.dut, run.dut.latency
    assert lat == expected_latency(dut.lanes, 4)
    assert check_trace(trace, phase.jobs, dut) == phase.jobs[0][0].size
    beats = -(-phase.jobs[0][0].size // dut.lanes)
    assert np.flatnonzero(trace["valid"]).tolist() == list(range(2 + lat, 2 + lat + beats))
    empty_start = 3 + lat + beats
    assert np.flatnonzero(trace["start"]).tolist() == [2, empty_start]
    assert np.flatnonzero(trace["busy"]).tolist() == [*range(3, 2 + lat + beats),
                                                      empty_start + 1]


def test_scale_index_backpressure(run):
    """Random ready (probability 0.25, 0.5 or 0.9 per job): every index once and in order,
    an offered beat held unchanged until taken, and no bubble: a beat is offered in every
    cycle from start + latency to the job's last transfer."""
    trace, phase = run.phase("backpressure")
    lat = run.dut.latency
    assert check_trace(trace, phase.jobs, run.dut) == sum(lay.size for lay, _ in phase.jobs)
    valid = np.asarray(trace["valid"], bool)
    streaming = np.zeros(len(valid), bool)     # cycles with a beat to offer (ready random)
    for s, end in zip(np.flatnonzero(trace["start"]), phase.ends, strict=True):
        assert valid[s + lat:end + 1].all() and not valid[end + 1:end + 3].any()
        streaming[s + lat:end + 1] = True
    assert 0.3 < np.mean(np.asarray(trace["ready"], bool)[streaming]) < 0.9


def test_scale_index_restart(run):
    """start mid-stream: while streaming, while a beat is stalled (which it withdraws), in
    the set-up cycle; the new job starts from element 0 with its configuration."""
    trace, phase = run.phase("restart")
    check_trace(trace, phase.jobs, run.dut)
    t0, t1, t2, t3 = np.flatnonzero(trace["start"])
    lat = run.dut.latency
    valid, ready = np.asarray(trace["valid"], bool), np.asarray(trace["ready"], bool)
    assert valid[t1] and ready[t1]                     # transferred: the first job's
    assert valid[t2] and not ready[t2]                 # withdrawn
    assert not valid[t2 + 1:t3 + lat].any() and valid[t3 + lat]


@pytest.mark.parametrize(("lanes", "max_dims"), [(4, 1), (2, 2)])
def test_scale_index_few_dims(lanes, max_dims):
    """Units with one and two dimensions (no padding, or the top dimension alone)."""
    dut = ScaleIndex(lanes=lanes, max_dims=max_dims, size_width=8, index_width=10,
                     count_width=12)
    layouts = [scale_layout((301,), (), 0, 0), blocked((301,), 0, 3), blocked((7, 11), 0, 2),
               broadcast_layout((9, 5), (9, 1))][:2 * max_dims]
    starts, t = {}, 1
    for lay in layouts:
        starts[t] = lay
        t += job_cycles(lay.size, dut)
    trace = simulate(dut, starts, [True] * t)
    assert dut.latency == expected_latency(lanes, max_dims)
    assert check_trace(trace, [(lay, True) for lay in layouts], dut) == \
        sum(lay.size for lay in layouts)


def test_check_trace_catches_errors(run):
    """The checker is not vacuous: a wrong index, a lost or a repeated beat, a misplaced
    ``last``, a late first beat and a wrong ``busy`` each fail it."""
    trace, phase = run.phase("backpressure")
    lanes = run.dut.lanes
    valid, ready = np.array(trace["valid"], bool), np.array(trace["ready"], bool)
    taken, stalled = np.flatnonzero(valid & ready), np.flatnonzero(valid & ~ready)
    last_taken = phase.ends[0]

    def mutated(key, cycle, value):
        t = {k: list(v) for k, v in trace.items()}
        t[key][cycle] = value
        return t

    index = [list(row) for row in trace["index"]]
    index[taken[1]][lanes - 1] += 1
    bad = [{**trace, "index": index},                                  # wrong index
           mutated("ready", taken[2], False),                          # lost beat
           mutated("ready", stalled[1], True),                         # repeated beat
           mutated("last", last_taken, 0),                             # no last
           mutated("last", taken[0], 1),                               # early last
           mutated("busy", last_taken, 0),                             # busy too short
           mutated("busy", last_taken + 1, 1),                         # busy too long
           {k: [v[0], *v[:-1]] if k != "start" else v for k, v in trace.items()}]  # late
    for k, t in enumerate(bad):
        with pytest.raises(AssertionError):
            check_trace(t, phase.jobs, run.dut)
            pytest.fail(f"mutation {k} passed")


# ---------------------------------------------------------------------------------------------
# Members and the register helper


@pytest.mark.parametrize(("lanes", "kwargs"), [
    *((lanes, {"max_dims": 1, "size_width": 4, "index_width": 1, "count_width": 1})
      for lanes in LANES),
    (2, {"max_dims": 8, "size_width": 32, "index_width": 64, "count_width": 64}),
])
def test_scale_index_elaborates_extremes(lanes, kwargs):
    """The narrowest parameters (size_width may equal the carry width) and the widest
    elaborate."""
    Fragment.get(ScaleIndex(lanes=lanes, **kwargs), None)


def test_scale_index_members():
    dut = ScaleIndex(lanes=4, max_dims=3, size_width=12, index_width=24, count_width=20)
    members = dut.signature.members
    assert members["size"].shape.length == 3 and members["size"].shape.elem_shape.width == 12
    assert members["block"].shape == members["size"].shape
    assert members["stride"].shape.elem_shape.width == 24
    assert members["count"].shape.width == 20
    assert members["start"].shape == 1 and members["busy"].shape == 1
    payload = dut.payload_layout
    assert payload["index"].shape.length == 4 and payload["index"].shape.elem_shape.width == 24
    assert payload["last"].shape.width == 1
    assert (dut.lanes, dut.max_dims, dut.size_width, dut.index_width, dut.count_width) == \
        (4, 3, 12, 24, 20)
    assert dut.latency == expected_latency(4, 3)
    with pytest.raises(AttributeError):
        dut.latency = 2


def test_registers_innermost_first():
    """Collapsed dimensions reversed, outermost in the top slot with size 0 (unused),
    padding in between; a dimension inside one block becomes stride 0, block 1."""
    lay = blocked((4, 10), 1, 4)                                    # (4, 10) (3, 1) (1, 4)
    assert index_registers(lay, max_dims=4) == {
        "size": (10, 1, 1, 0), "stride": (1, 0, 0, 3), "block": (4, 1, 1, 1), "count": 40}
    lay = scale_layout((2, 3, 4, 5), (4,), 2, 0)                    # (6, 4, 5) (0, 1, 0)
    assert ScaleIndex(lanes=2, max_dims=3).registers(lay) == {
        "size": (5, 4, 0), "stride": (0, 1, 0), "block": (1, 1, 1), "count": 120}
    lay = blocked((2, 9, 1), 1, 16)                                 # (2, 9) (1, 1) (1, 16)
    assert index_registers(lay, max_dims=2) == {
        "size": (9, 0), "stride": (0, 1), "block": (1, 1), "count": 18}
    assert index_registers(scale_layout((7,), (), 0, 0), max_dims=1) == {
        "size": (0,), "stride": (0,), "block": (1,), "count": 7}
    assert index_registers(scale_layout((5, 0, 3), (5,), 0, 0), max_dims=2) == {
        "size": (1, 0), "stride": (0, 0), "block": (1, 1), "count": 0}


def test_registers_max_dims_error():
    lay = broadcast_layout((2, 3, 4, 5), (2, 1, 4, 1))              # 4 collapsed dimensions
    with pytest.raises(ValueError, match=r"max_dims must be at least 4 for this layout "
                                         r"\(collapsed sizes \(2, 3, 4, 5\)\), not 3"):
        index_registers(lay, max_dims=3)


def test_registers_size_width_error():
    lay = scale_layout((3, 70_001), (3,), 0, 0)                    # inner size 70001
    with pytest.raises(ValueError, match=r"size_width must be at least 17 for this layout "
                                         r"\(dimension size 70001\), not 16"):
        ScaleIndex(lanes=1, max_dims=2).registers(lay)


def test_registers_block_width_error():
    lay = blocked((70_000,), 0, 66_000)                            # top dimension's block
    with pytest.raises(ValueError, match=r"size_width must be at least 17 for this layout "
                                         r"\(block size 66000\), not 16"):
        index_registers(lay, max_dims=2)


def test_registers_index_width_error():
    lay = blocked((40, 3001), 1, 2)                                # 40 x 1501 scales
    with pytest.raises(ValueError, match=r"index_width must be at least 16 for this layout "
                                         r"\(largest scale index 60039\), not 12"):
        index_registers(lay, max_dims=2, index_width=12)
    with pytest.raises(ValueError, match=r"index_width must be at least 11 for this layout "
                                         r"\(stride 1501\), not 10"):
        index_registers(lay, max_dims=2, index_width=10)


def test_registers_count_width_error():
    with pytest.raises(ValueError, match=r"count_width must be at least 17 for this layout "
                                         r"\(element count 70000\), not 16"):
        index_registers(scale_layout((7, 10_000), (), 0, 0), max_dims=2, count_width=16)


def test_registers_layout_type_error():
    with pytest.raises(TypeError, match=r"layout must be a ScaleLayout, not \(4, 10\)"):
        index_registers((4, 10), max_dims=2)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"lanes": 3}, ValueError, r"lanes must be one of 1, 2, 4, 8, not 3"),
        ({"lanes": 16}, ValueError, r"lanes must be one of 1, 2, 4, 8, not 16"),
        ({"lanes": 2.0}, TypeError, r"lanes must be an integer, not 2\.0"),
        ({"max_dims": 0}, ValueError, r"max_dims must be in \[1, 8\], not 0"),
        ({"max_dims": 9}, ValueError, r"max_dims must be in \[1, 8\], not 9"),
        ({"max_dims": None}, TypeError, r"max_dims must be an integer, not None"),
        ({"size_width": 3}, ValueError, r"size_width must be in \[4, 32\], not 3"),
        ({"size_width": 33}, ValueError, r"size_width must be in \[4, 32\], not 33"),
        ({"index_width": 0}, ValueError, r"index_width must be in \[1, 64\], not 0"),
        ({"index_width": "20"}, TypeError, r"index_width must be an integer, not '20'"),
        ({"count_width": 65}, ValueError, r"count_width must be in \[1, 64\], not 65"),
        ({"count_width": True}, TypeError, r"count_width must be an integer, not True"),
    ],
)
def test_scale_index_parameter_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        ScaleIndex(**{"lanes": 4, "max_dims": 4, **kwargs})
    if "lanes" not in kwargs:
        with pytest.raises(error, match=match):
            index_registers(blocked((4, 10), 1, 4), **{"max_dims": 4, **kwargs})
