"""cocotb testbench for the MatMulNBits engine
(:class:`qaccel.rtl.nbits.matmul_nbits_v2.MatMulNBitsV2`);
run it with :func:`qaccel.sim.nbits_sim.run_nbits_cocotb`.

The engine's ports come from the parameters: ``registers`` (the job register ports, set from
each job's ``regs``) and ``inputs`` (the input stream names); ``y`` carries one float32 code
with ``last`` above it.

Parameters (``qaccel.sim.tbconfig.params()``): ``jobs_file`` (JSON list of job dicts, see
:func:`qaccel.sim.nbits_sim.job_dict`: ``label``, ``regs``, ``inputs`` (payload ints per input
stream; a stream missing or empty gets no beats in that job), ``beats`` (the job's ``y``
beats), ``y`` (per beat the expected code, ``null`` for a word not compared; ``y`` itself
``null``: capture only), ``tags`` (per beat a text naming it in error messages) and
optionally ``reset_after`` (cycles after the job's ``start`` at which ``rst`` is asserted,
abandoning the job)), ``registers``, ``inputs``, ``idle`` and ``backpressure`` (pause
probabilities per cycle, each input stream and ``y.ready`` with its own seeded generator),
``max_burst`` (longest pause), ``watchdog`` (stall timeout in cycles), ``seed``,
``reset_cycles`` (cycles ``rst`` is held), ``settle`` (cycles after a reset during which no
``y`` beat may appear), ``busy_lag`` (the cycle after the last ``y`` beat by which ``busy``
must be low: 1 is the very next), ``capture_file`` (where to write the received beats and
cycle counts), and for long stalls (0: none) ``stall`` (``y.ready`` held low that many cycles
in a row, then a random run of up to ``stall`` cycles of 30 % pauses, repeating; held low from
each job's start until the engine is backed up to its inputs, i.e. until for ``stall`` cycles
an input beat is offered and none is taken (or every input beat is in), and held low
``stall`` cycles again once the job's last input beat is taken, so its tail waits in the
engine), ``starve`` (each input stream's ``valid`` low that many cycles in a
row between runs of beats) and ``fifos`` (``[path, depth, fill]`` triples: a FIFO instance
reached through the hierarchy, ``"cluster0.y_fifo"``, its depth, and whether the run must
fill it). Each FIFO's writes minus reads (:class:`~qaccel.sim.streams.OccupancyMonitor`) must
stay within its depth every cycle (a write into a full FIFO is a beat lost: a credit let one
too many through); those with ``fill`` must reach it. The highs are recorded.

The jobs run back to back in one simulation: the registers are set and ``start`` pulsed one
cycle after ``busy`` is seen low, the input streams the job has beats for are fed from the
next cycle on. Every ``y`` beat goes through an in-order scoreboard: each compared word
bit-exact (NaN equals NaN only when both are NaN), ``last`` on the job's last beat only,
exactly ``beats`` beats per job. ``y`` must also keep ``valid`` and its payload while it is
held back, every input beat of a job must be taken by its last ``y`` beat (and no more than
the job's beats), and ``busy`` must be high from the cycle after ``start`` to the last ``y``
beat and low ``busy_lag`` cycles after it. A job's cycle count is the number of clock edges
from the one taking ``start`` to the one taking its last ``y`` beat.

A job with ``reset_after`` is abandoned that many cycles after its ``start``: every input
stream drops its beats and ``valid``, ``y.ready`` is held low, ``rst`` is held high for
``reset_cycles`` edges; on the first cycle after it ``busy`` and ``y.valid`` must be low, and
for ``settle`` more cycles no ``y`` beat may appear. The ``y`` beats it gave before the reset
are checked as a prefix of its expected beats; the next job then runs from a clean engine.
"""

from __future__ import annotations

import json
import logging
import random
import struct
import time
from dataclasses import dataclass

import cocotb

from qaccel.sim import tbconfig
from qaccel.sim.nbits_jobs import is_nan_code
from qaccel.sim.scoreboard import InOrderChecker
from qaccel.sim.streams import (
    CycleLoop,
    OccupancyMonitor,
    StreamDriver,
    StreamMonitor,
    StreamPort,
    StreamSink,
    Watchdog,
    burst_pauses,
    no_pauses,
    random_pauses,
)
from qaccel.sim.tb import reset, start_clock

log = logging.getLogger("cocotb.qaccel.tb_matmul_nbits")

DEFAULTS = {"idle": 0.3, "backpressure": 0.3, "max_burst": 4, "watchdog": 2000, "seed": None,
            "capture_file": None, "reset_cycles": 2, "settle": 4, "busy_lag": 1, "stall": 0,
            "starve": 0, "fifos": []}


def _f32(word: int) -> float:
    return struct.unpack("<f", struct.pack("<I", word))[0]


@dataclass(frozen=True, eq=False)
class YBeat:
    """One ``y`` beat: a code of format ``out_fmt`` (None: not compared) and ``last``.

    Two beats are equal when ``last`` agrees and, unless either word is None, the words are
    the same bit pattern or NaN in both."""

    y: int | None
    last: int
    out_fmt: int = 0

    @classmethod
    def from_payload(cls, payload: int, out_fmt: int = 0) -> YBeat:
        return cls(payload & 0xFFFFFFFF, (payload >> 32) & 1, out_fmt)

    def __eq__(self, other) -> bool:
        if not isinstance(other, YBeat):
            return NotImplemented
        a, b = self.y, other.y
        return self.last == other.last and (
            a is None or b is None or a == b
            or bool(is_nan_code(a, self.out_fmt) and is_nan_code(b, other.out_fmt)))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        word = "-" if self.y is None else f"{self.y:#010x} ({_f32(self.y):.9g})"
        return f"y={word} last={self.last}"


class HoldChecker:
    """Stream rule on an output: once ``valid`` is up it stays up, with the same payload,
    until the beat is taken. Not checked while ``paused()`` (a reset)."""

    def __init__(self, port: StreamPort, paused=lambda: False):
        self.port = port
        self.paused = paused
        self.held: int | None = None

    def sample(self, cycle: int) -> None:
        if self.paused():
            self.held = None
            return
        valid = self.port.is_valid()
        if self.held is not None:
            assert valid, f"{self.port.name}: valid dropped at cycle {cycle} before its beat " \
                          f"{self.held:#x} was taken"
            payload = self.port.read_payload()
            assert payload == self.held, f"{self.port.name}: payload changed at cycle {cycle} " \
                                         f"from {self.held:#x} to {payload:#x} while held back"
        self.held = self.port.read_payload() if valid and not self.port.is_ready() else None


class GatedSink(StreamSink):
    """A :class:`StreamSink` that holds ``ready`` low while ``paused()`` (a reset)."""

    def __init__(self, port: StreamPort, *, pauses, paused):
        super().__init__(port, pauses=pauses)
        self.paused = paused

    def drive(self, cycle: int) -> None:
        if self.paused():
            if self._ready_out is not False:
                self.port.ready.value = 0
                self._ready_out = False
            return
        super().drive(cycle)


class JobControl:
    """Sets the registers, pulses ``start`` and queues the input beats, one job at a time;
    asserts ``rst`` in a job with ``reset_after``.

    States: idle -> pulse -> running -> idle, or running -> reset -> settle -> idle."""

    def __init__(self, tb: NBitsTB, jobs: list[dict]):
        self.tb = tb
        self.jobs = jobs
        self.next = 0                  # the next job to start
        self.state = "idle"
        self.busy = True               # busy as last sampled
        self.after_start = False       # the sample phase right after a start
        self.busy_check = 0            # sample phases left until busy must be low
        self.after_reset = False       # the sample phase right after a reset
        self.reset_at: int | None = None
        self.until = 0                 # the cycle ending the reset / settle state

    @property
    def done(self) -> bool:
        return (self.next == len(self.jobs) and self.state == "idle" and not self.busy_check
                and not self.after_reset)

    @property
    def resetting(self) -> bool:
        return self.state == "reset"

    def drive(self, cycle: int) -> None:
        dut, tb = self.tb.dut, self.tb
        if self.state == "pulse":
            dut.start.value = 0
            job = self.jobs[self.next - 1]
            for name, driver in tb.drivers.items():
                driver.send(job["inputs"].get(name, []))
            self.state = "running"
            self.after_start = True
        elif self.state == "running" and self.reset_at is not None and cycle >= self.reset_at:
            tb.abort_job(cycle)
            dut.rst.value = 1
            self.state, self.until, self.reset_at = "reset", cycle + tb.params["reset_cycles"], None
            self.busy_check = 0
        elif self.state == "reset" and cycle >= self.until:
            dut.rst.value = 0
            self.state, self.until = "settle", cycle + tb.params["settle"]
            self.after_reset = True
        elif self.state == "settle" and cycle >= self.until:
            self.state = "idle"
        elif self.state == "idle" and not self.busy and self.next < len(self.jobs):
            job = self.jobs[self.next]
            for reg in tb.registers:
                getattr(dut, reg).value = int(job["regs"][reg])
            dut.start.value = 1
            tb.begin_job(self.next, cycle)
            after = job.get("reset_after")
            self.reset_at = None if after is None else cycle + max(2, int(after))
            self.next += 1
            self.state = "pulse"

    def sample(self, cycle: int) -> None:
        self.busy = bool(int(self.tb.dut.busy.value))
        if self.after_start:
            self.after_start = False
            assert self.busy, f"busy low the cycle after start ({self.tb.job_name()})"
        elif self.after_reset:
            self.after_reset = False
            y_valid = self.tb.y.is_valid()
            assert not self.busy and not y_valid, (
                f"the engine is not idle after a {self.tb.params['reset_cycles']}-cycle reset "
                f"in {self.tb.job_name()}: busy={int(self.busy)} y.valid={int(y_valid)} at "
                f"cycle {cycle}")
        elif self.busy_check:
            self.busy_check -= 1
            if not self.busy:
                self.busy_check = 0
            elif not self.busy_check:
                raise AssertionError(f"busy still high {self.tb.params['busy_lag']} cycle(s) "
                                     f"after the last y beat ({self.tb.job_name()})")


class NBitsTB:
    """Clock, reset, job control, input drivers, y sink, monitors, scoreboard and watchdog."""

    def __init__(self, dut, params: dict, jobs: list[dict]):
        self.dut = dut
        self.params = params
        self.jobs = jobs
        self.registers = tuple(params["registers"])
        self.inputs = tuple(params["inputs"])
        for j, job in enumerate(jobs):
            extra = set(job["inputs"]) - set(self.inputs)
            assert not extra, f"job {j} '{job['label']}' feeds streams {sorted(extra)} the " \
                              f"engine does not have (its inputs: {self.inputs})"
        seed = params["seed"]
        self.stall, starve = int(params["stall"]), int(params["starve"])
        self.ports = {name: StreamPort(dut, name) for name in self.inputs}
        self.drivers = {name: StreamDriver(port, pauses=(
            _pauses(params["idle"], params, seed, k) if not starve else
            burst_pauses(starve, rng=random.Random(seed * 1000 + k), run=(starve, 4 * starve),
                         probability=params["idle"])))
                        for k, (name, port) in enumerate(self.ports.items())}
        self.control = JobControl(self, jobs)
        self.y = StreamPort(dut, "y")
        n = len(self.inputs)
        self.sink = GatedSink(self.y, pauses=(
            _pauses(params["backpressure"], params, seed, n) if not self.stall else
            burst_pauses(self.stall, rng=random.Random(seed * 1000 + n), run=(1, self.stall),
                         probability=0.3)),
                              paused=lambda: self.control.resetting)
        self.tail_stalled = True            # the running job's tail stall is placed
        self.holding = False                # y held from the job's start until backed up
        self.blocked = 0                    # cycles an input beat waited, none taken
        self.taken_seen = 0
        self.hold_cycles: list[int] = []    # per job, the cycles y was held from its start
        self.checker = InOrderChecker("y")
        self.in_mons = {name: StreamMonitor(port) for name, port in self.ports.items()}
        self.y_mon = StreamMonitor(self.y, self._on_y)
        self.hold = HoldChecker(self.y, paused=lambda: self.control.resetting)
        self.watchdog = Watchdog(
            params["watchdog"], (self.y_mon, self._y_pending),
            *((mon, lambda d=self.drivers[n]: d.pending) for n, mon in self.in_mons.items()))
        self.fifo_fill = [path for path, _, fill in params["fifos"] if fill]
        self.occupancy = OccupancyMonitor(
            fifos={path: (_instance(dut, path), int(depth))
                   for path, depth, _ in params["fifos"]},
            reset=lambda: bool(int(dut.rst.value))) if params["fifos"] else None
        self.loop = CycleLoop(dut.clk, self.control, *self.drivers.values(), self,
                              self.sink, *self.in_mons.values(), self.y_mon, self.hold,
                              self.watchdog, *((self.occupancy,) if self.occupancy else ()))
        self.current = -1               # index of the running job
        self.received: list[list[int]] = []
        self.start_cycles: list[int] = []
        self.cycles: list[int | None] = []
        self.sent: list[dict[str, int]] = []
        self.taken: list[dict[str, int]] = []
        self.aborted: list[dict | None] = []

    def drive(self, cycle: int) -> None:
        """With ``stall``: hold ``y`` from the job's start until the engine is backed up to
        its inputs (or they are all in); once the input beats are all taken, stall ``y``."""
        if not self.stall or self.control.state != "running":
            return
        pending = any(d.pending for d in self.drivers.values())
        if self.holding:
            taken = sum(mon.count for mon in self.in_mons.values())
            if taken != self.taken_seen:
                self.taken_seen, self.blocked = taken, 0
            elif any(d.offering for d in self.drivers.values()):
                self.blocked += 1
            if self.blocked >= self.stall or not pending:
                self.holding = False
                self.sink.stall(0)
                self.hold_cycles.append(cycle - self.start_cycles[self.current])
        if not self.holding and not self.tail_stalled and not pending:
            self.tail_stalled = True
            self.sink.stall(self.stall)

    def job_name(self, index: int | None = None) -> str:
        j = self.current if index is None else index
        return f"job {j} of {len(self.jobs)} '{self.jobs[j]['label']}'"

    def _y_pending(self) -> int:
        if self.control.state not in ("pulse", "running") or self.current < 0:
            return 0
        return self.jobs[self.current]["beats"] - len(self.received[self.current])

    def _taken(self) -> dict[str, int]:
        return {n: mon.count - self.sent[self.current][n] for n, mon in self.in_mons.items()}

    def begin_job(self, index: int, cycle: int) -> None:
        """``start`` is taken at ``cycle``: expect the job's beats."""
        job = self.jobs[index]
        self.current = index
        self.received.append([])
        self.start_cycles.append(cycle)
        self.sent.append({n: mon.count for n, mon in self.in_mons.items()})
        self.aborted.append(None)
        if self.stall:
            self.sink.stall(1 << 62)            # until drive() sees the engine backed up
            self.holding, self.tail_stalled, self.blocked = True, False, 0
            self.taken_seen = sum(mon.count for mon in self.in_mons.values())
        beats = job["beats"]
        if job["y"] is not None:
            assert len(job["y"]) == beats, f"{self.job_name()}: {len(job['y'])} expected " \
                                           f"beats for {beats} y beats"
            for p, (word, tag) in enumerate(zip(job["y"], job["tags"], strict=True)):
                self.checker.add_expected(YBeat(word, int(p == beats - 1),
                                                job["regs"]["out_fmt"]), cycle,
                                          tag=f"{self.job_name()} {tag}")

    def abort_job(self, cycle: int) -> None:
        """The running job is abandoned by a reset at ``cycle``: drop its input beats and its
        expected ``y`` beats not yet seen."""
        j = self.current
        taken = self._taken()
        self.taken.append(taken)
        self.cycles.append(None)
        self.aborted[j] = {"cycle": cycle - self.start_cycles[j], "taken": taken,
                           "y": len(self.received[j])}
        log.info(f"reset in {self.job_name()} {cycle - self.start_cycles[j]} cycles after "
                 f"start: input beats taken {taken}, {len(self.received[j])} of "
                 f"{self.jobs[j]['beats']} y beats received")
        for driver in self.drivers.values():
            driver.reset()
        self.checker.expected.clear()
        if self.holding:                    # (the sink is gated during the reset)
            self.holding = False
            self.sink.stall(0)

    def _on_y(self, payload: int, cycle: int) -> None:
        j = self.current
        job = self.jobs[j] if 0 <= j < len(self.jobs) else None
        assert job is not None and self.control.state in ("pulse", "running"), (
            f"y: beat {payload:#x} at cycle {cycle} while no job is running "
            f"(after {self.job_name(j) if j >= 0 else 'reset'}"
            f"{', which was reset' if j >= 0 and self.aborted[j] else ''})")
        got = self.received[j]
        got.append(payload)
        beat = YBeat.from_payload(payload, job["regs"]["out_fmt"])
        if job["y"] is not None:
            self.checker.add_actual(beat, cycle)
        else:
            last = int(len(got) == job["beats"])
            assert beat.last == last, f"y: beat {len(got) - 1} of {self.job_name()} at cycle " \
                                      f"{cycle} has last={beat.last}, expected {last}"
        if len(got) == job["beats"]:
            for name, driver in self.drivers.items():
                assert driver.pending == 0, (
                    f"{self.job_name()}: its last y beat at cycle {cycle} with "
                    f"{driver.pending} of {len(job['inputs'].get(name, []))} '{name}' beats "
                    f"not taken")
            taken = self._taken()
            want = {n: len(job["inputs"].get(n, [])) for n in self.inputs}
            assert taken == want, f"{self.job_name()}: input beats taken {taken}, sent {want}"
            self.taken.append(taken)
            self.cycles.append(cycle - self.start_cycles[j])
            self.control.state = "idle"
            self.control.reset_at = None
            self.control.busy_check = int(self.params["busy_lag"])

    async def start(self) -> None:
        dut = self.dut
        for name in (*(f"{n}__valid" for n in self.inputs), "start", "y__ready",
                     *self.registers, *(f"{n}__payload" for n in self.inputs)):
            getattr(dut, name).value = 0
        start_clock(dut)
        await reset(dut)

    async def run(self) -> None:
        """Run every job; raise on the first check that fails."""
        beats = sum(j["beats"] + sum(len(v) for v in j["inputs"].values()) for j in self.jobs)
        await self.loop.run(until=lambda: self.control.done,
                            max_cycles=200 * beats + 1000 * len(self.jobs) + 10000)
        self.checker.check_done()


def _instance(dut, path: str):
    """The instance at dotted ``path`` under ``dut`` (AssertionError naming it if absent)."""
    handle = dut
    for part in path.split("."):
        try:
            handle = getattr(handle, part)
        except AttributeError:
            raise AssertionError(f"FIFO {path!r}: no {part!r} in the hierarchy (fifos "
                                 f"parameter)") from None
    return handle


def _pauses(probability: float, params: dict, seed: int, stream: int):
    if not probability:
        return no_pauses()
    return random_pauses(probability, rng=random.Random(seed * 1000 + stream),
                         max_burst=params["max_burst"])


@cocotb.test()
async def test_jobs(dut):
    """Every job back to back, random idle cycles on each input stream and back-pressure on
    y, resets where a job asks for one; every y beat through the scoreboard; the received
    beats and cycle counts recorded."""
    params = {**DEFAULTS, **tbconfig.params()}
    if params["seed"] is None:
        params["seed"] = cocotb.RANDOM_SEED
    with open(params["jobs_file"]) as f:
        jobs = json.load(f)
    tb = NBitsTB(dut, params, jobs)
    await tb.start()
    t0 = time.perf_counter()
    try:
        await tb.run()
    except Exception:
        if tb.current >= 0:
            dut._log.error(f"failed in {tb.job_name()}")
        raise
    seconds = time.perf_counter() - t0
    beats = sum(len(r) for r in tb.received)
    want = sum(j["beats"] if a is None else a["y"] for j, a in zip(jobs, tb.aborted,
                                                                  strict=True))
    assert tb.y_mon.count == beats == want, (
        f"{tb.y_mon.count} y beats seen, {beats} received, {want} expected")
    for name, mon in tb.in_mons.items():
        taken = sum(t[name] for t in tb.taken)
        assert mon.count == taken, f"{mon.count} '{name}' beats taken, {taken} by the jobs"
    if tb.occupancy is not None:
        tb.occupancy.check_reached(tb.fifo_fill)
    if params["capture_file"]:
        tbconfig.write_atomic(params["capture_file"], json.dumps(
            {"beats": tb.received, "cycles": tb.cycles, "start_cycles": tb.start_cycles,
             "aborted": tb.aborted}))
    tbconfig.record("test_jobs", jobs=len(jobs), beats=beats, cycles=tb.cycles,
                    total_cycles=tb.loop.cycle, seconds=round(seconds, 4),
                    checked=sum(j["y"] is not None for j in jobs), seed=params["seed"],
                    resets=sum(a is not None for a in tb.aborted),
                    occupancy=tb.occupancy.summary() if tb.occupancy else None,
                    stall=tb.stall, starve=int(params["starve"]), hold_cycles=tb.hold_cycles)
