"""cocotb testbench for the Quantize and Dequantize units (:class:`qaccel.rtl.elementwise.unit.
Elementwise`); run it with :func:`qaccel.sim.elementwise_sim.run_elementwise`.

Parameters (``qaccel.sim.tbconfig.params()``): ``jobs_file`` (JSON list of
:class:`qaccel.sim.jobs.Job` dicts), ``latency`` (the unit's stated latency), ``idle`` and
``backpressure`` (pause probabilities per cycle), ``max_burst``, ``watchdog`` (stall timeout in
cycles), ``seed``, ``reset_after`` (beats into the first job at which test_reset_mid_stream
resets), ``fifo_depth`` (the unit's :attr:`~qaccel.rtl.elementwise.unit.Elementwise.fifo_depth`:
test_credit_limit is skipped without it). Every output beat is checked in order against the
job's expected beats (the golden model's answer); each test records its beats, cycles and
seconds.

test_credit_limit runs the :data:`FILL_JOBS` longest jobs under stall patterns computed from
``fifo_depth`` and ``latency``: ``y.ready`` low for ``fifo_depth + latency +``
:data:`STALL_MARGIN` cycles in a row (then a random run of mostly-ready cycles), the same
stall at each job's start and after its last ``x`` beat is taken (the job's tail, ``last``
included, waits in the FIFO), and ``x.valid`` low for ``latency +`` :data:`STALL_MARGIN` cycles
between runs of beats (input starvation: the pipeline and the FIFO run empty). Beats taken on
``x`` minus beats delivered on ``y`` must stay within ``fifo_depth`` (the credit counts the
beats in the pipeline and in the FIFO), and the output FIFO's writes minus its reads (its
ports peeked at ``dut.fifo`` where the simulator exposes them: a write into the full FIFO
takes it past the depth) within ``fifo_depth``, checked every cycle; both must reach
``fifo_depth`` (the pattern really runs the credit out). ``busy`` must be high in every cycle
with beats inside. The longest job must have more than
``fifo_depth`` beats (:func:`qaccel.sim.matrix.fill_job` makes one).

Capture mode (``test_jobs`` with ``capture_file`` set; :func:`qaccel.sim.elementwise_sim.
capture_elementwise`): a job whose expected beats are absent (``y == []``) is run without a
check, one ``y`` beat expected per ``x`` beat, and the received ``y`` beats of every job (with
``last``) and its cycle counts go to ``capture_file`` as JSON ``{"beats": [[int, ...], ...],
"stats": [{"beats", "cycles", "load_cycles", "min_latency", "max_latency"}, ...]}``.
``progress_file`` (optional) is rewritten with ``{"jobs": done, "beats": done}`` every
:data:`PROGRESS_BEATS` output beats and after each job.
"""

from __future__ import annotations

import json
import logging
import random
import time

import cocotb
from cocotb.triggers import FallingEdge, RisingEdge

from qaccel.sim import tbconfig
from qaccel.sim.scoreboard import InOrderChecker
from qaccel.sim.streams import (
    CycleLoop,
    OccupancyMonitor,
    StallError,
    StreamDriver,
    StreamMonitor,
    StreamPort,
    StreamSink,
    Watchdog,
    burst_pauses,
    cycle_pauses,
    no_pauses,
    random_pauses,
)
from qaccel.sim.tb import reset, start_clock

log = logging.getLogger("cocotb.qaccel.tb_elementwise")

DEFAULTS = {"idle": 0.3, "backpressure": 0.3, "max_burst": 4, "watchdog": 2000, "seed": None,
            "reset_after": 20, "capture_file": None, "progress_file": None}
#: Output beats between two updates of ``progress_file``.
PROGRESS_BEATS = 2048
#: Cycles a long stall lasts beyond what fills the unit (``fifo_depth + latency`` on ``y``,
#: ``latency`` on ``x``).
STALL_MARGIN = 8
#: Jobs test_credit_limit runs back to back (the longest ones).
FILL_JOBS = 3


def _write_json(path: str, value) -> None:
    tbconfig.write_atomic(path, json.dumps(value))


class ElementwiseTB:
    """Clock, reset, table loader, x driver, y sink, monitors, checker and watchdog."""

    def __init__(self, dut, params: dict, *, idle=None, backpressure=None, watchdog=None):
        self.dut = dut
        self.params = params
        self.x = StreamPort(dut, "x")
        self.y = StreamPort(dut, "y")
        self.driver = StreamDriver(self.x, pauses=idle)
        self.sink = StreamSink(self.y, pauses=backpressure)
        self.checker = InOrderChecker("y")
        self.expected: list[int] | None = []   # the current job's output beats (None: capture)
        self.masks: list[int] = []
        self.sent = 0
        self.received: list[int] = []           # the current job's y beats, as received
        self.x_cycles: list[int] = []           # capture: the cycle of each x transfer
        self.latency: list[int] = []            # capture: [min, max] x -> y cycles
        self.jobs_done = 0
        self.x_mon = StreamMonitor(self.x, self._on_x)
        self.y_mon = StreamMonitor(self.y, self._on_y)
        self.watchdog = Watchdog(watchdog or params["watchdog"],
                                 (self.y_mon, self._y_pending),
                                 (self.x_mon, lambda: self.driver.pending))
        self.loop = CycleLoop(dut.clk, self.driver, self.sink, self.x_mon, self.y_mon,
                              self.watchdog)
        self._job_base = 0                 # y beats of earlier jobs

    def _y_pending(self) -> int:
        if self.expected is None:
            return self.sent - len(self.received)
        return self.checker.pending

    def _on_x(self, payload: int, cycle: int) -> None:
        k = self.sent
        self.sent += 1
        if self.expected is None:
            self.x_cycles.append(cycle)
        else:
            self.checker.add_expected(self.expected[k], cycle, tag=f"x beat {k} = {payload:#x}")

    def _on_y(self, payload: int, cycle: int) -> None:
        self.received.append(payload)
        if self.expected is None:
            k = len(self.received) - 1
            assert k < len(self.x_cycles), (
                f"y: beat {k} at cycle {cycle} before its x beat (spurious or duplicated beat)")
            lat = cycle - self.x_cycles[k]
            self.latency = [min(self.latency[0], lat), max(self.latency[1], lat)] \
                if self.latency else [lat, lat]
        else:
            k = self.checker.matched - self._job_base
            self.checker.add_actual(payload & self.masks[k], cycle)
        if self.params["progress_file"] and self.y_mon.count % PROGRESS_BEATS == 0:
            self.write_progress()

    def write_progress(self) -> None:
        """Rewrite ``progress_file`` with the jobs and output beats done so far."""
        _write_json(self.params["progress_file"], {"jobs": self.jobs_done,
                                                   "beats": self.y_mon.count})

    async def start(self) -> None:
        dut = self.dut
        for name in ("x__valid", "table__valid", "start", "y__ready"):
            getattr(dut, name).value = 0
        dut.x__payload.value = 0
        dut.table__payload.value = 0
        dut.regs.value = 0
        start_clock(dut)
        await reset(dut)

    async def load(self, job: dict) -> int:
        """Set the registers, write the table (each entry held until ``table.ready``), pulse
        start (inputs change after falling edges); return the cycles taken, start included.
        The registers come first: a unit that prepares its entries as they are written reads
        the scale format from them."""
        dut = self.dut
        layout = self.params["table_fields"]       # [(name, offset, width)]
        await FallingEdge(dut.clk)                  # (a CycleLoop run ends in ReadOnly)
        dut.regs.value = job["regs"]
        cycles = 1
        for entry in job["table"]:
            word = 0
            for (name, offset, width), value in zip(layout, entry, strict=True):
                assert value >> width == 0, f"table {name} {value:#x} exceeds {width} bits"
                word |= value << offset
            dut.table__payload.value = word
            dut.table__valid.value = 1
            while True:                             # ready depends on registers only
                ready = int(dut.table__ready.value)
                await FallingEdge(dut.clk)
                cycles += 1
                if ready:
                    break
        dut.table__valid.value = 0
        dut.start.value = 1
        await FallingEdge(dut.clk)
        dut.start.value = 0
        return cycles

    async def run_job(self, job: dict, *, capture: bool = False, edge_stall: int = 0) -> dict:
        """Run one job to completion, then wait until idle: every y beat checked against
        ``job["y"]``, or with ``capture`` and no expected beats, one y beat received per x
        beat (``received``, ``min_latency`` and ``max_latency`` in the result). ``cycles``
        counts from the cycle after ``start`` to the first with ``busy`` low, inclusive;
        ``load_cycles`` the table writes and ``start`` before it. ``edge_stall``: hold
        ``y.ready`` low for that many cycles from the job's start and again once its last
        ``x`` beat is taken."""
        load_cycles = await self.load(job)
        self.expected = None if capture and not job["y"] else job["y"]
        n = len(job["x"]) if self.expected is None else len(job["y"])
        self.masks = [(1 << len(self.y.payload)) - 1] * (n - 1) + [job["ymask"]] if n else []
        self._job_base = self.checker.matched
        self.sent = 0
        self.received, self.x_cycles, self.latency = [], [], []
        self.driver.send(job["x"])
        t0 = time.perf_counter()
        # 1 + : the cycle after ``start``, before the loop's first falling edge
        cycles = 1
        bound = 200 * (n + 200) + 4 * edge_stall
        if edge_stall:
            self.sink.stall(edge_stall)
            cycles += await self.loop.run(until=lambda: self.driver.pending == 0,
                                          max_cycles=bound)
            self.sink.stall(edge_stall)
        cycles += await self.loop.run(until=lambda: len(self.received) >= n
                                      and self.driver.pending == 0, max_cycles=bound)
        cycles += await self.loop.run(until=lambda: not int(self.dut.busy.value),
                                      max_cycles=1000)
        self.checker.check_done()
        assert self.sent == len(job["x"]), f"{self.sent} x beats accepted, sent {len(job['x'])}"
        assert len(self.received) == n, f"{len(self.received)} y beats received, expected {n}"
        self.jobs_done += 1
        result = {"beats": n, "cycles": cycles, "load_cycles": load_cycles,
                  "seconds": time.perf_counter() - t0, "received": self.received}
        if self.expected is None:
            result["min_latency"], result["max_latency"] = self.latency
        return result


def _params() -> tuple[dict, random.Random, list[dict]]:
    params = {**DEFAULTS, **tbconfig.params()}
    seed = params["seed"] if params["seed"] is not None else cocotb.RANDOM_SEED
    params["seed"] = seed
    with open(params["jobs_file"]) as f:
        jobs = json.load(f)
    return params, random.Random(seed), jobs


class BusyCheck:
    """Fail the cycle ``busy`` is low while ``inside()`` beats are in the unit."""

    def __init__(self, dut, inside):
        self.dut = dut
        self.inside = inside
        self.before = 0             # beats inside during this cycle (after the last edge)

    def sample(self, cycle: int) -> None:
        if self.before and not int(self.dut.busy.value):
            raise AssertionError(f"busy low at cycle {cycle} with {self.before} beats inside")
        self.before = self.inside()         # (the monitors have counted this edge's beats)


def _fifo(dut):
    """The output FIFO instance through the hierarchy, or None where it is not visible."""
    try:
        fifo = dut.fifo
        for port in ("w_en", "r_en", "r_rdy"):
            getattr(fifo, port)
    except AttributeError:
        return None
    return fifo


def _can_fill() -> bool:
    """Whether the run's parameters name the FIFO depth (test_credit_limit needs it)."""
    try:
        return "fifo_depth" in tbconfig.params()
    except RuntimeError:                # imported outside a simulation
        return False


def _pauses(params, rng, key):
    p = params[key]
    return random_pauses(p, rng=rng, max_burst=params["max_burst"]) if p else no_pauses()


@cocotb.test()
async def test_jobs(dut):
    """Every job back to back, random idle cycles on x and back-pressure on y (capture mode
    with ``capture_file``: see the module notes)."""
    params, rng, jobs = _params()
    tb = ElementwiseTB(dut, params, idle=_pauses(params, rng, "idle"),
                       backpressure=_pauses(params, rng, "backpressure"))
    await tb.start()
    capture = bool(params["capture_file"])
    beats = cycles = 0
    seconds = 0.0
    per_job, captured, stats = [], [], []
    for k, job in enumerate(jobs):
        try:
            r = await tb.run_job(job, capture=capture)
        except Exception:
            dut._log.error(f"job {k} of {len(jobs)} failed: {job['label']}")
            raise
        beats += r["beats"]
        cycles += r["cycles"]
        seconds += r["seconds"]
        per_job.append([job["label"], r["beats"]])
        if capture:
            captured.append(r["received"])
            stats.append({k: r.get(k) for k in ("beats", "cycles", "load_cycles",
                                                "min_latency", "max_latency")})
        if params["progress_file"]:
            tb.write_progress()
    if capture:
        _write_json(params["capture_file"], {"beats": captured, "stats": stats})
    assert tb.x_mon.count == sum(len(j["x"]) for j in jobs)
    assert tb.y_mon.count == beats, f"{tb.y_mon.count} y beats seen, {beats} expected"
    tbconfig.record("test_jobs", jobs=len(jobs), beats=beats, cycles=cycles,
                    seconds=round(seconds, 4),
                    beats_per_second=round(beats / seconds, 1) if seconds else 0.0,
                    min_latency=tb.checker.min_latency, max_latency=tb.checker.max_latency,
                    seed=params["seed"])


@cocotb.test()
async def test_throughput(dut):
    """No pauses: >= 0.99 beats per cycle on x and y, latency exactly as stated."""
    params, rng, jobs = _params()
    job = max(jobs, key=lambda j: len(j["x"]))
    tb = ElementwiseTB(dut, params, idle=no_pauses(), backpressure=no_pauses())
    await tb.start()
    r = await tb.run_job(job)
    rate = min(tb.x_mon.beats_per_cycle(), tb.y_mon.beats_per_cycle())
    assert rate >= 0.99 or r["beats"] < 100, f"{rate:.4f} beats per cycle ({r['beats']} beats)"
    lat = (tb.checker.min_latency, tb.checker.max_latency)
    assert lat == (params["latency"], params["latency"]), (
        f"latency {lat[0]}..{lat[1]} cycles, stated {params['latency']}")
    tbconfig.record("test_throughput", beats=r["beats"], beats_per_cycle=round(rate, 5),
                    latency=lat[0], cycles=r["cycles"])


@cocotb.test()
async def test_reset_mid_stream(dut):
    """A reset in the middle of a job, then the job again from the start: every beat right."""
    params, rng, jobs = _params()
    job = max(jobs, key=lambda j: len(j["x"]))
    tb = ElementwiseTB(dut, params, idle=_pauses(params, rng, "idle"),
                       backpressure=_pauses(params, rng, "backpressure"))
    await tb.start()
    await tb.load(job)
    tb.expected = job["y"]
    tb.masks = [(1 << len(tb.y.payload)) - 1] * (len(job["y"]) - 1) + [job["ymask"]]
    tb.driver.send(job["x"])
    stop = min(params["reset_after"], len(job["x"]) - 1)
    await tb.loop.run(until=lambda: tb.x_mon.count >= stop, max_cycles=100 * (stop + 100))
    # reset: abandon the beats in flight, start over
    await FallingEdge(dut.clk)
    tb.driver.reset()
    await reset(dut)
    for _ in range(3):
        await RisingEdge(dut.clk)
    await FallingEdge(dut.clk)
    assert not int(dut.busy.value), "busy after reset"
    assert not int(dut.y__valid.value), "y valid after reset"
    tb.checker = InOrderChecker("y")
    r = await tb.run_job(job)
    tbconfig.record("test_reset_mid_stream", beats=r["beats"], reset_after=stop)


@cocotb.test()
async def test_watchdog_names_stalled_stream(dut):
    """A sink that never becomes ready: the watchdog fails naming stream 'y'."""
    params, rng, jobs = _params()
    job = max(jobs, key=lambda j: len(j["x"]))
    timeout = 300
    tb = ElementwiseTB(dut, params, backpressure=cycle_pauses((1,)), watchdog=timeout)
    await tb.start()
    await tb.load(job)
    tb.expected = job["y"]
    tb.masks = [(1 << len(tb.y.payload)) - 1] * len(job["y"])
    tb.driver.send(job["x"])
    try:
        await tb.loop.run(until=lambda: False, max_cycles=20 * timeout)
    except StallError as e:
        message = str(e)
    else:
        raise AssertionError("the watchdog did not fire on a stalled output stream")
    assert "stream 'y' stalled" in message and "valid=1 ready=0" in message, message
    tbconfig.record("test_watchdog_names_stalled_stream", message=message)


@cocotb.test(skip=not _can_fill())
async def test_credit_limit(dut):
    """Long stalls on ``y`` (at job boundaries too) and long input gaps on ``x``: every beat
    checked, the beats inside and the FIFO level within ``fifo_depth`` every cycle, and both
    reaching it (see the module notes)."""
    params, rng, jobs = _params()
    depth, latency = int(params["fifo_depth"]), int(params["latency"])
    stall, starve = depth + latency + STALL_MARGIN, latency + STALL_MARGIN
    longest = sorted(range(len(jobs)), key=lambda k: -len(jobs[k]["x"]))[:FILL_JOBS]
    chosen = [jobs[k] for k in sorted(longest)]
    most = len(jobs[longest[0]]["x"])
    assert most > depth, (f"the longest job has {most} x beats: test_credit_limit needs one of "
                          f"more than fifo_depth = {depth} (qaccel.sim.matrix.fill_job)")
    tb = ElementwiseTB(dut, params,
                       idle=burst_pauses(starve, rng=rng, run=(depth, 3 * depth),
                                         probability=0.1),
                       backpressure=burst_pauses(stall, rng=rng, run=(1, 2 * depth),
                                                 probability=0.3),
                       watchdog=max(params["watchdog"], 4 * stall))
    fifo = _fifo(dut)
    occupancy = OccupancyMonitor(inside=lambda: tb.x_mon.count - tb.y_mon.count, limit=depth,
                                 fifos=None if fifo is None else {"fifo": (fifo, depth)})
    tb.loop.add(occupancy, BusyCheck(dut, lambda: tb.x_mon.count - tb.y_mon.count))
    await tb.start()
    beats = cycles = 0
    for job in chosen:
        try:
            r = await tb.run_job(job, edge_stall=stall)
        except Exception:
            dut._log.error(f"test_credit_limit failed in job '{job['label']}' "
                           f"({len(job['x'])} x beats); occupancy {occupancy.summary()}")
            raise
        beats += r["beats"]
        cycles += r["cycles"]
    assert tb.y_mon.count == beats, f"{tb.y_mon.count} y beats seen, {beats} expected"
    occupancy.check_reached()
    tbconfig.record("test_credit_limit", jobs=len(chosen), beats=beats, cycles=cycles,
                    fifo_depth=depth, latency=latency, stall=stall, starve=starve,
                    fifo_peeked=fifo is not None, occupancy=occupancy.summary())
