"""cocotb testbench for the MatMulNBits engine (:class:`qaccel.rtl.matmul_nbits.MatMulNBits`);
run it with :func:`qaccel.sim.nbits_sim.run_nbits_cocotb`.

Parameters (``qaccel.sim.tbconfig.params()``): ``jobs_file`` (JSON list of job dicts, see
:func:`qaccel.sim.nbits_sim.job_dict`: ``label``, ``regs``, ``inputs`` (payload ints per input
stream), ``passes`` and ``y`` (per pass ``pe`` expected float32 bit patterns, ``null`` for a
column not compared; ``y`` itself ``null``: capture only)), ``pe``, ``idle`` and
``backpressure`` (pause probabilities per cycle, each input stream and ``y.ready`` with its own
seeded generator), ``max_burst`` (longest pause), ``watchdog`` (stall timeout in cycles),
``seed``, ``capture_file`` (where to write the received beats and cycle counts).

The jobs run back to back in one simulation: the registers are set and ``start`` pulsed one
cycle after ``busy`` is seen low, the four input streams (``z`` only when the job has beats
for it) are fed from the next cycle on. Every ``y`` beat goes through an in-order scoreboard:
each compared column bit-exact (NaN equals NaN only when both are NaN), ``last`` on the job's
last beat only, exactly ``passes`` beats per job. ``y`` must also keep ``valid`` and its
payload while it is held back, every input beat of a job must be taken by its last ``y`` beat,
and ``busy`` must be high from the cycle after ``start`` to the last ``y`` beat. A job's cycle
count is the number of clock edges from the one taking ``start`` to the one taking its last
``y`` beat.
"""

from __future__ import annotations

import json
import logging
import random
import struct
import time
from dataclasses import dataclass

import cocotb

from qaccel.rtl.matmul_nbits import REGISTERS
from qaccel.sim import tbconfig
from qaccel.sim.nbits_jobs import is_nan_code
from qaccel.sim.scoreboard import InOrderChecker
from qaccel.sim.streams import (
    CycleLoop,
    StreamDriver,
    StreamMonitor,
    StreamPort,
    StreamSink,
    Watchdog,
    no_pauses,
    random_pauses,
)
from qaccel.sim.tb import reset, start_clock

log = logging.getLogger("cocotb.qaccel.tb_matmul_nbits")

DEFAULTS = {"idle": 0.3, "backpressure": 0.3, "max_burst": 4, "watchdog": 2000, "seed": None,
            "capture_file": None}
#: The engine's input streams and registers, as the Verilog names them.
INPUTS = ("a", "w", "s", "z")


def _f32(word: int) -> float:
    return struct.unpack("<f", struct.pack("<I", word))[0]


@dataclass(frozen=True, eq=False)
class YBeat:
    """One ``y`` beat: ``pe`` codes of format ``out_fmt`` (None: a column not compared) and
    ``last``.

    Two beats are equal when ``last`` agrees and every column compared by both is the same
    bit pattern, or NaN in both."""

    y: tuple[int | None, ...]
    last: int
    out_fmt: int = 0

    @classmethod
    def from_payload(cls, payload: int, pe: int, out_fmt: int = 0) -> YBeat:
        return cls(tuple((payload >> (32 * p)) & 0xFFFFFFFF for p in range(pe)),
                   (payload >> (32 * pe)) & 1, out_fmt)

    def differing(self, other: YBeat) -> list[int]:
        """The columns where ``self`` and ``other`` disagree."""
        return [p for p, (a, b) in enumerate(zip(self.y, other.y, strict=True))
                if a is not None and b is not None and a != b
                and not (is_nan_code(a, self.out_fmt) and is_nan_code(b, other.out_fmt))]

    def __eq__(self, other) -> bool:
        if not isinstance(other, YBeat):
            return NotImplemented
        return (self.last == other.last and len(self.y) == len(other.y)
                and not self.differing(other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        cols = ", ".join("-" if w is None else f"{w:#010x} ({_f32(w):.9g})" for w in self.y)
        return f"y=[{cols}] last={self.last}"


class HoldChecker:
    """Stream rule on an output: once ``valid`` is up it stays up, with the same payload,
    until the beat is taken."""

    def __init__(self, port: StreamPort):
        self.port = port
        self.held: int | None = None

    def sample(self, cycle: int) -> None:
        valid = self.port.is_valid()
        if self.held is not None:
            assert valid, f"{self.port.name}: valid dropped at cycle {cycle} before its beat " \
                          f"{self.held:#x} was taken"
            payload = self.port.read_payload()
            assert payload == self.held, f"{self.port.name}: payload changed at cycle {cycle} " \
                                         f"from {self.held:#x} to {payload:#x} while held back"
        self.held = self.port.read_payload() if valid and not self.port.is_ready() else None


class JobControl:
    """Sets the registers, pulses ``start`` and queues the input beats, one job at a time."""

    def __init__(self, tb: NBitsTB, jobs: list[dict]):
        self.tb = tb
        self.jobs = jobs
        self.next = 0                  # the next job to start
        self.state = "idle"            # idle -> pulse -> running -> idle
        self.busy = True               # busy as last sampled
        self.after_start = False       # the sample phase right after a start
        self.after_end = False         # the sample phase right after a job's last y beat

    @property
    def done(self) -> bool:
        return self.next == len(self.jobs) and self.state == "idle" and not self.after_end

    def drive(self, cycle: int) -> None:
        dut, tb = self.tb.dut, self.tb
        if self.state == "pulse":
            dut.start.value = 0
            job = self.jobs[self.next - 1]
            for name, driver in tb.drivers.items():
                driver.send(job["inputs"].get(name, []))
            self.state = "running"
            self.after_start = True
        elif self.state == "idle" and not self.busy and self.next < len(self.jobs):
            job = self.jobs[self.next]
            for reg in REGISTERS:
                getattr(dut, reg).value = int(job["regs"][reg])
            dut.start.value = 1
            tb.begin_job(self.next, cycle)
            self.next += 1
            self.state = "pulse"

    def sample(self, cycle: int) -> None:
        self.busy = bool(int(self.tb.dut.busy.value))
        if self.after_start:
            self.after_start = False
            assert self.busy, f"busy low the cycle after start ({self.tb.job_name()})"
        elif self.after_end:
            self.after_end = False
            assert not self.busy, f"busy still high the cycle after the last y beat " \
                                  f"({self.tb.job_name()})"


class NBitsTB:
    """Clock, reset, job control, input drivers, y sink, monitors, scoreboard and watchdog."""

    def __init__(self, dut, params: dict, jobs: list[dict]):
        self.dut = dut
        self.params = params
        self.jobs = jobs
        self.pe = params["pe"]
        seed = params["seed"]
        self.ports = {name: StreamPort(dut, name) for name in INPUTS}
        self.drivers = {name: StreamDriver(port, pauses=_pauses(params["idle"], params,
                                                                 seed, k))
                        for k, (name, port) in enumerate(self.ports.items())}
        self.y = StreamPort(dut, "y")
        self.sink = StreamSink(self.y, pauses=_pauses(params["backpressure"], params, seed,
                                                      len(INPUTS)))
        self.checker = InOrderChecker("y")
        self.in_mons = {name: StreamMonitor(port) for name, port in self.ports.items()}
        self.y_mon = StreamMonitor(self.y, self._on_y)
        self.hold = HoldChecker(self.y)
        self.control = JobControl(self, jobs)
        self.watchdog = Watchdog(
            params["watchdog"], (self.y_mon, self._y_pending),
            *((mon, lambda d=self.drivers[n]: d.pending) for n, mon in self.in_mons.items()))
        self.loop = CycleLoop(dut.clk, self.control, *self.drivers.values(), self.sink,
                              *self.in_mons.values(), self.y_mon, self.hold, self.watchdog)
        self.current = -1               # index of the running job
        self.received: list[list[int]] = []
        self.start_cycles: list[int] = []
        self.cycles: list[int] = []
        self.sent: list[dict[str, int]] = []

    def job_name(self, index: int | None = None) -> str:
        j = self.current if index is None else index
        return f"job {j} of {len(self.jobs)} '{self.jobs[j]['label']}'"

    def _y_pending(self) -> int:
        if self.control.state == "idle" or self.current < 0:
            return 0
        return self.jobs[self.current]["passes"] - len(self.received[self.current])

    def begin_job(self, index: int, cycle: int) -> None:
        """``start`` is taken at ``cycle``: expect the job's beats."""
        job = self.jobs[index]
        self.current = index
        self.received.append([])
        self.start_cycles.append(cycle)
        self.sent.append({n: mon.count for n, mon in self.in_mons.items()})
        passes = job["passes"]
        if job["y"] is not None:
            assert len(job["y"]) == passes, f"{self.job_name()}: {len(job['y'])} expected " \
                                            f"beats for {passes} passes"
            for p, row in enumerate(job["y"]):
                self.checker.add_expected(YBeat(tuple(row), int(p == passes - 1),
                                                job["regs"]["out_fmt"]), cycle,
                                          tag=f"{self.job_name()} pass {p}")

    def _on_y(self, payload: int, cycle: int) -> None:
        j = self.current
        job = self.jobs[j] if 0 <= j < len(self.jobs) else None
        assert job is not None and self.control.state != "idle", (
            f"y: beat {payload:#x} at cycle {cycle} while no job is running "
            f"(after {self.job_name(j) if j >= 0 else 'reset'})")
        got = self.received[j]
        got.append(payload)
        beat = YBeat.from_payload(payload, self.pe, job["regs"]["out_fmt"])
        if job["y"] is not None:
            self.checker.add_actual(beat, cycle)
        else:
            last = int(len(got) == job["passes"])
            assert beat.last == last, f"y: beat {len(got) - 1} of {self.job_name()} at cycle " \
                                      f"{cycle} has last={beat.last}, expected {last}"
        if len(got) == job["passes"]:
            for name, driver in self.drivers.items():
                assert driver.pending == 0, (
                    f"{self.job_name()}: its last y beat at cycle {cycle} with "
                    f"{driver.pending} of {len(job['inputs'].get(name, []))} '{name}' beats "
                    f"not taken")
            self.cycles.append(cycle - self.start_cycles[j])
            self.control.state = "idle"
            self.control.after_end = True

    async def start(self) -> None:
        dut = self.dut
        for name in (*(f"{n}__valid" for n in INPUTS), "start", "y__ready", *REGISTERS,
                     *(f"{n}__payload" for n in INPUTS)):
            getattr(dut, name).value = 0
        start_clock(dut)
        await reset(dut)

    async def run(self) -> None:
        """Run every job; raise on the first check that fails."""
        beats = sum(j["passes"] + sum(len(v) for v in j["inputs"].values()) for j in self.jobs)
        await self.loop.run(until=lambda: self.control.done,
                            max_cycles=200 * beats + 1000 * len(self.jobs) + 10000)
        self.checker.check_done()


def _pauses(probability: float, params: dict, seed: int, stream: int):
    if not probability:
        return no_pauses()
    return random_pauses(probability, rng=random.Random(seed * 1000 + stream),
                         max_burst=params["max_burst"])


@cocotb.test()
async def test_jobs(dut):
    """Every job back to back, random idle cycles on a, w, s, z and back-pressure on y; every
    y beat through the scoreboard; the received beats and cycle counts recorded."""
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
    assert tb.y_mon.count == beats == sum(j["passes"] for j in jobs), (
        f"{tb.y_mon.count} y beats seen, {beats} received, "
        f"{sum(j['passes'] for j in jobs)} expected")
    for name, mon in tb.in_mons.items():
        want = sum(len(j["inputs"].get(name, [])) for j in jobs)
        assert mon.count == want, f"{mon.count} '{name}' beats taken, {want} sent"
    if params["capture_file"]:
        tbconfig.write_atomic(params["capture_file"], json.dumps(
            {"beats": tb.received, "cycles": tb.cycles, "start_cycles": tb.start_cycles}))
    tbconfig.record("test_jobs", jobs=len(jobs), beats=beats, cycles=tb.cycles,
                    total_cycles=tb.loop.cycle, seconds=round(seconds, 4),
                    checked=sum(j["y"] is not None for j in jobs), seed=params["seed"])
