"""Run jobs (:mod:`qaccel.sim.jobs`) on a Quantize or Dequantize unit through cocotb.

:func:`run_elementwise` writes the jobs to a JSON file next to the build, runs the testbench
:mod:`qaccel.sim.tb_elementwise` on Verilator or Icarus and returns the
:class:`~qaccel.sim.runner.SimResult` (its ``records`` hold each test's measurements).

:func:`capture_elementwise` runs jobs without checking them and returns the ``y`` beats the
unit produced, with cycle counts: the engine behind :class:`qaccel.engine.RTL`. Its build is
found without emitting Verilog when one exists (:func:`elementwise_build`), so a call costs the
simulation only.

:func:`run_elementwise_fast` runs jobs through the C++ stream loop of
:class:`~qaccel.sim.streamsim.StreamSim` instead (one segment per job, all jobs in one process,
no cocotb; :func:`elementwise_sim` keeps one simulator per unit class and configuration) and
returns a :class:`JobResult` per job; :func:`check_jobs` compares those with the jobs'
expected beats.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from qaccel.rtl.elementwise.unit import Elementwise
from qaccel.rtl.verilog import TIMESCALE
from qaccel.sim import tbconfig
from qaccel.sim.jobs import Job
from qaccel.sim.runner import (
    BUILD_ARGS,
    MAKE_VARIABLES,
    Build,
    SimResult,
    SimulationError,
    SimulationFailed,
    build,
    build_root,
    check_build,
    digest,
    log_tail,
    mark_elaborated,
    root_writable,
    run_cocotb,
    scratch_dir,
    sources_digest,
)
from qaccel.sim.streamsim import MAX_MISMATCHES, WATCHDOG, CheckedRun, Segment, StreamSim

__all__ = ["Capture", "JobResult", "capture_elementwise", "check_jobs", "design_key",
           "elementwise_build", "elementwise_sim", "run_elementwise", "run_elementwise_checked",
           "run_elementwise_fast", "run_testbench", "table_fields"]

#: Seconds between two looks at the testbench's progress file.
PROGRESS_POLL = 0.25


def table_fields(unit: Elementwise) -> list[tuple[str, int, int]]:
    """``(name, offset, width)`` of the table payload's fields, in Job.table order."""
    layout = unit.signature.members["table"].signature.members["payload"].shape
    return [(name, layout[name].offset, layout[name].width)
            for name in ("addr", "scale", "zero_point")]


def run_elementwise(unit: Elementwise, jobs: Sequence[Job], *, name: str,
                    simulator: str = "verilator", testcase: str | Sequence[str] | None = None,
                    **params: Any) -> SimResult:
    """Run ``jobs`` on ``unit`` (built as module ``name``); raise if any check fails.

    ``params`` override the testbench defaults (``idle``, ``backpressure``, ``max_burst``,
    ``watchdog``, ``seed``, ``reset_after``).
    """
    if not jobs:
        raise ValueError("jobs must hold at least one Job")
    text = json.dumps([j.to_dict() for j in jobs])
    path = build_root() / "jobs" / f"{digest(text)[:16]}.json"
    if not path.exists():
        if not root_writable():
            path = scratch_dir("jobs") / path.name
        tbconfig.write_atomic(path, text)
    config = {"jobs_file": str(path), "latency": unit.latency,
              "table_fields": table_fields(unit), "seed": 1, **params}
    return run_cocotb(unit, name=name, test_module="tb_elementwise", simulator=simulator,
                      config=config, testcase=testcase)


# ---------------------------------------------------------------------------------------------
# Builds without Verilog emission


_builds: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_builds_lock = threading.Lock()


def _artefact(b: Build) -> Path:
    return b.build_dir / (b.toplevel if b.simulator == "verilator" else "sim.vvp")


def design_key(unit: Elementwise) -> str:
    """A hash of everything ``unit``'s Verilog depends on (its class, its part of the
    configuration (``unit.config_part``: a Quantize unit's build does not change with the
    MatMulNBits engine's fields, nor the engine's with the elementwise ones), the rtl and model
    sources, the tool versions): builds are found by it without emitting."""
    return digest({"unit": f"{type(unit).__module__}.{type(unit).__qualname__}",
                   "config": unit.config.to_dict(unit.config_part),
                   "sources": sources_digest()})


def elementwise_build(unit: Elementwise, *, name: str, simulator: str = "verilator") -> Build:
    """Return a finished build of ``unit`` as module ``name`` (see :func:`~qaccel.sim.runner.
    build`), emitting its Verilog only when no build of it is known.

    Emitting the Verilog of a Quantize unit takes 10-20 s, so builds are remembered per unit
    object and, across processes, in ``<build root>/index/`` under a hash of the unit's class
    and configuration, the rtl and model sources and the tool versions. The returned
    :class:`~qaccel.sim.runner.Build` has ``built`` true only if this call compiled it.
    """
    key = digest({"design": design_key(unit), "name": name, "simulator": simulator,
                  "build_args": BUILD_ARGS.get(simulator),
                  "make_variables": MAKE_VARIABLES.get(simulator)})
    with _builds_lock:
        known = _builds.get(unit, {}).get(key)
    if known is not None and _artefact(known).exists():
        mark_elaborated(unit)
        return Build(simulator, name, known.build_dir, known.verilog, False, 0.0)
    index = build_root() / "index" / f"{name}-{simulator}-{key[:16]}.json"
    start = time.perf_counter()
    b = None
    with contextlib.suppress(OSError, ValueError, KeyError):
        entry = json.loads(index.read_text())
        found = Build(simulator, name, Path(entry["build_dir"]), Path(entry["verilog"]), False,
                      0.0)
        if check_build(found.build_dir, simulator, name) is None:
            b = Build(simulator, name, found.build_dir, found.verilog, False,
                      time.perf_counter() - start)
            mark_elaborated(unit)
    if b is None:
        b = build(unit, name=name, simulator=simulator)
        if root_writable():
            tbconfig.write_atomic(index, json.dumps({"build_dir": str(b.build_dir),
                                                      "verilog": str(b.verilog)}))
    with _builds_lock:
        _builds.setdefault(unit, {})[key] = b
    return b


# ---------------------------------------------------------------------------------------------
# Capture


@dataclass(frozen=True)
class Capture:
    """What :func:`capture_elementwise` saw.

    ``beats[j]`` are the ``y`` payloads of job ``j`` in order (data with ``last`` above it);
    ``cycles[j]`` the cycles from ``start`` until the unit is idle again, ``load_cycles[j]``
    those spent writing its table and pulsing ``start`` (one per table entry, plus one);
    ``latency`` the smallest and largest ``x`` to ``y`` cycles over all beats. ``built`` is
    true if the call compiled the design; ``seconds`` is its wall time, ``sim_seconds`` that
    of the simulator run alone.
    """

    simulator: str
    beats: list[list[int]]
    cycles: list[int]
    load_cycles: list[int]
    latency: tuple[int, int] | None
    built: bool
    seconds: float
    sim_seconds: float


def capture_elementwise(unit: Elementwise, jobs: Sequence[Job], *, name: str,
                        simulator: str = "verilator", idle: float = 0.0,
                        backpressure: float = 0.0, seed: int = 1,
                        progress: Callable[[int, int], None] | None = None) -> Capture:
    """Run ``jobs`` back to back on ``unit`` (module ``name``) and return the ``y`` beats.

    Jobs with expected beats (``job.y``) are also checked, as in :func:`run_elementwise`;
    jobs with ``y == []`` are only captured, one ``y`` beat per ``x`` beat. ``idle`` and
    ``backpressure`` are pause probabilities per cycle on ``x`` and ``y`` (0: full speed).
    ``progress(jobs_done, beats_done)`` is called from this thread while the simulator runs.

    Raises :exc:`~qaccel.sim.runner.SimulatorNotFoundError`, :exc:`~qaccel.sim.runner.
    BuildError`, :exc:`~qaccel.sim.runner.SimulationFailed` (a check, a protocol assertion or
    the watchdog failed) or :exc:`~qaccel.sim.runner.SimulationError`.
    """
    if not jobs:
        raise ValueError("jobs must hold at least one Job")
    start = time.perf_counter()
    b = elementwise_build(unit, name=name, simulator=simulator)
    run_dir = capture_dir(name, simulator)
    jobs_file, capture_file = run_dir / "jobs.json", run_dir / "capture.json"
    progress_file = run_dir / "progress.json"
    jobs_file.write_text(json.dumps([j.to_dict() for j in jobs]))
    config = {"jobs_file": str(jobs_file), "latency": unit.latency,
              "table_fields": table_fields(unit), "seed": seed, "idle": idle,
              "backpressure": backpressure, "capture_file": str(capture_file),
              "progress_file": str(progress_file) if progress else None}
    t0 = time.perf_counter()
    run_testbench(b, run_dir, config, "test_jobs", progress_file if progress else None,
                  progress)
    sim_seconds = time.perf_counter() - t0
    data = read_capture(run_dir, simulator)["capture"]
    stats = data["stats"]
    lats = [(s["min_latency"], s["max_latency"]) for s in stats if s["min_latency"] is not None]
    return Capture(
        simulator=simulator, beats=data["beats"], cycles=[s["cycles"] for s in stats],
        load_cycles=[s["load_cycles"] for s in stats],
        latency=(min(lo for lo, _ in lats), max(hi for _, hi in lats)) if lats else None,
        built=b.built, seconds=time.perf_counter() - start, sim_seconds=sim_seconds)


def capture_dir(toplevel: str, simulator: str) -> Path:
    """A new folder for one testbench run (under the build root's ``capture/``)."""
    root = build_root() / "capture"
    if not root_writable(build_root()):
        root = scratch_dir("capture")
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{toplevel}-{simulator}-", dir=root))


def read_capture(run_dir: Path, simulator: str, names=("capture",)) -> dict:
    """Read the JSON files ``<name>.json`` a testbench run left in ``run_dir``, then remove
    the folder; SimulationError (with the log's tail) if one is missing or broken."""
    try:
        out = {n: json.loads((run_dir / f"{n}.json").read_text()) for n in names}
    except (OSError, ValueError) as e:
        raise SimulationError(f"{simulator} wrote no capture file ({e}); run dir {run_dir}"
                              f"{log_tail(run_dir / 'sim.log')}") from None
    shutil.rmtree(run_dir, ignore_errors=True)
    return out


def run_testbench(b: Build, run_dir: Path, config: dict, testcase: str,
                  progress_file: Path | None, progress, *,
                  test_module: str = "qaccel.sim.tb_elementwise") -> None:
    """Run ``test_module`` (default ``tb_elementwise``) on the finished build ``b`` in
    ``run_dir`` (what :func:`~qaccel.sim.runner.run_cocotb` does after its build step); raise
    if a test fails."""
    from cocotb_tools.check_results import get_results
    from cocotb_tools.runner import get_runner

    from qaccel.sim.runner import cocotb_environment, parse_results

    results, records = run_dir / "results.xml", run_dir / "records.json"
    log_file = run_dir / "sim.log"
    failure: list[str] = []

    def simulate():
        try:
            with cocotb_environment(b.simulator):
                get_runner(b.simulator).test(
                    test_module=test_module, hdl_toplevel=b.toplevel,
                    hdl_toplevel_lang="verilog", testcase=testcase,
                    extra_env={tbconfig.ENV_VAR: tbconfig.encode(config, records),
                               "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
                    build_dir=b.build_dir, test_dir=run_dir, results_xml=str(results),
                    timescale=TIMESCALE, log_file=log_file)
        except SystemExit as e:  # under pytest, failing tests exit; so does a crash
            failure.append(f"exit status {e.code}")
        except RuntimeError as e:  # a simulator returning non-zero
            failure.append(str(e))

    if progress is None:
        simulate()
    else:
        thread = threading.Thread(target=simulate, daemon=True)
        thread.start()
        seen = None
        while thread.is_alive():
            thread.join(PROGRESS_POLL)
            with contextlib.suppress(OSError, ValueError):
                done = json.loads(progress_file.read_text())
                if done != seen:
                    seen = done
                    progress(done["jobs"], done["beats"])
    try:
        tests, failed = get_results(results)
    except RuntimeError as e:
        raise SimulationError(f"{b.simulator} ended without a complete results file "
                              f"({failure[0] if failure else e}); run dir {run_dir}"
                              f"{log_tail(log_file)}") from None
    if failed or not tests:
        lines = [f"  {n}: {msg or 'failed'}" for n, st, msg in parse_results(results)
                 if st == "failed"]
        raise SimulationFailed(f"the capture run failed on {b.simulator} ({b.toplevel}, run dir "
                               f"{run_dir}):\n" + "\n".join(lines) + log_tail(log_file))


# ---------------------------------------------------------------------------------------------
# Jobs through the C++ stream loop (qaccel.sim.streamsim)


@dataclass(frozen=True)
class JobResult:
    """What the RTL produced for one :class:`~qaccel.sim.jobs.Job`, with cycle counts.

    ``y`` holds the received ``y`` beats as Python ints (as ``Job.y``). Cycles count from the
    job's first cycle (its first table write): ``y_cycles`` of each ``y`` beat, ``x_cycles``
    of each accepted ``x`` beat; ``cycles`` runs to the cycle ``busy`` was seen low.
    ``x_blocked`` is the longest stretch of cycles in which an offered ``x`` beat waited
    for ``ready`` (the unit's buffers full).
    """

    label: str
    y: list[int]
    y_cycles: np.ndarray
    x_cycles: np.ndarray
    cycles: int
    x_blocked: int = 0

    @property
    def beats(self) -> int:
        """Number of ``y`` beats received."""
        return len(self.y)

    @property
    def first_cycle(self) -> int | None:
        """Cycle of the first ``y`` beat (None without beats)."""
        return int(self.y_cycles[0]) if len(self.y_cycles) else None

    @property
    def last_cycle(self) -> int | None:
        """Cycle of the last ``y`` beat (None without beats)."""
        return int(self.y_cycles[-1]) if len(self.y_cycles) else None

    @property
    def latency(self) -> int | None:
        """Cycles from the first ``x`` transfer to the first ``y`` transfer."""
        if not len(self.y_cycles) or not len(self.x_cycles):
            return None
        return int(self.y_cycles[0] - self.x_cycles[0])

    @property
    def beats_per_cycle(self) -> float:
        """``y`` beats over the span from the first to the last, inclusive (0 if none)."""
        if not len(self.y_cycles):
            return 0.0
        return self.beats / (self.last_cycle - self.first_cycle + 1)

    @property
    def x_beats_per_cycle(self) -> float:
        """Accepted ``x`` beats over their span, inclusive (0 if none)."""
        if not len(self.x_cycles):
            return 0.0
        return len(self.x_cycles) / int(self.x_cycles[-1] - self.x_cycles[0] + 1)


_SIMS: dict[tuple, StreamSim] = {}


def elementwise_sim(unit: Elementwise, *, name: str | None = None) -> StreamSim:
    """Return the :class:`StreamSim` of ``unit``, built (or reused from disk) once per process
    for each unit class and configuration, which determine the hardware. ``name`` (the Verilog
    module name) None takes the cached simulator whatever its name."""
    if not isinstance(unit, Elementwise):
        raise TypeError(f"unit must be a Quantize or Dequantize unit, not {unit!r}")
    key = (type(unit), unit.config)
    sim = _SIMS.get(key)
    if sim is None or (name is not None and sim.name != name):
        sim = _SIMS[key] = StreamSim(unit, name=name, design_key=design_key(unit))
    return sim


def _job_segment(job: Job, fields: list[tuple[str, int, int]], check: bool = False) -> Segment:
    table = []
    for entry in job.table:
        word = 0
        for (name, offset, width), value in zip(fields, entry, strict=True):
            if not 0 <= value < 1 << width:
                raise ValueError(f"job {job.label!r}: table {name} {value:#x} does not fit "
                                 f"{width} bits")
            word |= value << offset
        table.append(word)
    if check and len(job.y):
        return Segment(inputs={"table": table, "x": job.x}, static={"regs": job.regs},
                       phases=[["table"], ["start"], ["x"]], check={"y": job.y},
                       check_mask={"y": job.ymask})
    return Segment(inputs={"table": table, "x": job.x}, static={"regs": job.regs},
                   phases=[["table"], ["start"], ["x"]])


def _ints(words: np.ndarray) -> list[int]:
    """Return ``(n, words)`` uint64 payloads as Python ints."""
    if words.shape[1] == 1:
        return words[:, 0].tolist()
    return [int.from_bytes(row.tobytes(), "little") for row in words]


def _job_segments(unit: Elementwise, jobs: Sequence[Job], *, check: bool = False) -> list:
    """``jobs`` as the stream loop's segments (see :func:`_job_segment`), each checked there
    with ``check``; TypeError / ValueError for what is not a non-empty sequence of Job."""
    if isinstance(jobs, Job) or not isinstance(jobs, Sequence):
        raise TypeError(f"jobs must be a sequence of Job, not {jobs!r}")
    if not jobs:
        raise ValueError("jobs must hold at least one Job")
    fields = table_fields(unit)
    segments = []
    for k, job in enumerate(jobs):
        if not isinstance(job, Job):
            raise TypeError(f"jobs[{k}] must be a Job, not {job!r}")
        segments.append(_job_segment(job, fields, check=check))
    return segments


def run_elementwise_fast(unit: Elementwise, jobs: Sequence[Job], *, idle: float = 0.0,
                         backpressure: float = 0.0, seed: int = 1, name: str | None = None,
                         watchdog: int = WATCHDOG,
                         stall_burst: tuple[float, int, int] | None = None,
                         starve_burst: tuple[float, int, int] | None = None) -> list[JobResult]:
    """Run ``jobs`` on a Quantize or Dequantize ``unit`` in one Verilator process; return what
    the RTL produced for each (nothing is compared: see :func:`check_jobs`).

    Each job is a :class:`~qaccel.sim.streamsim.Segment`: the table writes on ``table``, then
    a ``start`` pulse, then the ``x`` beats, with ``regs`` held throughout and ``y`` received;
    it ends when every ``x`` beat was accepted and ``busy`` is low (plus
    :data:`~qaccel.sim.streamsim.DRAIN` cycles), and the next job begins. ``idle`` /
    ``backpressure`` pause ``table`` and ``x`` / ``y``; ``stall_burst`` / ``starve_burst``
    add long ``y.ready`` / input ``valid`` low bursts (see :meth:`~qaccel.sim.streamsim.
    StreamSim.run_segments`). The simulator is cached per unit class and configuration
    (:func:`elementwise_sim`; its ``last_run`` has the timing).

    Raises :exc:`~qaccel.sim.streamsim.StreamStallError` (a hang: the message names the stream
    and its valid/ready), :exc:`~qaccel.sim.streamsim.StreamProtocolError` (``y`` broke the
    stream rules), and :exc:`ValueError` / :exc:`TypeError` for bad arguments.
    """
    sim = elementwise_sim(unit, name=name)
    results = sim.run_segments(_job_segments(unit, jobs), idle=idle, backpressure=backpressure,
                               seed=seed, until_idle="busy", watchdog=watchdog,
                               stall_burst=stall_burst, starve_burst=starve_burst)
    out = []
    for job, r in zip(jobs, results, strict=True):
        beats = r.outputs["y"]        # (n, words) uint64 for payloads above 64 bits, else 1-D
        words = beats if beats.ndim == 2 else beats.astype(np.uint64)[:, None]
        out.append(JobResult(job.label, _ints(words), r.output_cycles["y"], r.accepted["x"],
                             r.cycles, r.blocked["x"]))
    return out


def run_elementwise_checked(unit: Elementwise, jobs: Sequence[Job], *, idle: float = 0.0,
                            backpressure: float = 0.0, seed: int = 1, name: str | None = None,
                            watchdog: int = WATCHDOG,
                            stall_burst: tuple[float, int, int] | None = None,
                            starve_burst: tuple[float, int, int] | None = None,
                            max_mismatches: int = MAX_MISMATCHES) -> CheckedRun:
    """Run ``jobs`` as :func:`run_elementwise_fast` does, but check in the C++ loop: every
    ``y`` beat is compared with the job's expected beats (the last through ``Job.ymask``) as
    it arrives and only counts and the first ``max_mismatches`` differences come back (a
    :class:`~qaccel.sim.streamsim.CheckedRun`; ``Mismatch.segment`` is the job's index).
    Jobs without expected beats are run unchecked. Exceptions as :func:`run_elementwise_fast`.
    """
    sim = elementwise_sim(unit, name=name)
    return sim.run_checked(_job_segments(unit, jobs, check=True), idle=idle,
                           backpressure=backpressure, seed=seed, until_idle="busy",
                           watchdog=watchdog, stall_burst=stall_burst,
                           starve_burst=starve_burst, max_mismatches=max_mismatches)


def check_jobs(jobs: Sequence[Job], results: Sequence[JobResult]) -> None:
    """Compare each job's received ``y`` beats with its expected ones (the last beat through
    ``Job.ymask``); raise :exc:`AssertionError` naming the first wrong job and beat."""
    if len(jobs) != len(results):
        raise AssertionError(f"{len(results)} results for {len(jobs)} jobs")
    for k, (job, res) in enumerate(zip(jobs, results, strict=True)):
        what = f"job {k} ({job.label!r})"
        got, want = res.y, job.y
        if len(got) != len(want):
            raise AssertionError(f"{what}: {len(got)} y beats received, {len(want)} expected")
        if not want:
            continue
        n = len(want)
        if got[:-1] != want[:-1] or (got[-1] ^ want[-1]) & job.ymask:
            for b in range(n):
                mask = job.ymask if b == n - 1 else -1
                diff = (got[b] ^ want[b]) & mask
                if diff:
                    raise AssertionError(
                        f"{what}: y beat {b} of {n} is {got[b] & mask:#x}, expected "
                        f"{want[b] & mask:#x} (bits {diff:#x} differ; cycle "
                        f"{int(res.y_cycles[b])})")


# ---------------------------------------------------------------------------------------------
# Long checked regressions, sharded over processes or a Dask cluster

#: Output beats per loop run of a regression shard (its jobs, inputs and expected beats are in
#: memory only for one chunk: about 40 bytes per beat).
CHUNK_BEATS = 1 << 21


@dataclass(frozen=True)
class Regression:
    """The merged result of :func:`run_regression`.

    ``beats`` output beats were received and checked in ``cycles`` cycles over ``jobs`` jobs;
    ``mismatch_count`` differed, the first of them listed in ``mismatches`` as ``(shard, chunk,
    job label, Mismatch)``. ``wall_time`` is the whole call (process start-up and the build
    look-up included), ``steady_time`` the longest shard's time after its simulator was ready
    (job generation and checked simulation), ``gen_time`` / ``sim_time`` the shards' summed
    golden-model-and-encoding and loop seconds. Rates are per second of ``steady_time``.
    """

    op: str
    shards: int
    beats: int
    cycles: int
    jobs: int
    mismatch_count: int
    mismatches: tuple
    wall_time: float
    steady_time: float
    gen_time: float
    sim_time: float

    @property
    def beats_per_second(self) -> float:
        """Checked output beats per second of the steady state, all shards together."""
        return self.beats / self.steady_time if self.steady_time > 0 else 0.0

    @property
    def ok(self) -> bool:
        """True if every beat matched."""
        return self.mismatch_count == 0


def _unit(config, op: str) -> Elementwise:
    from qaccel.rtl.elementwise.dequantize import Dequantize
    from qaccel.rtl.elementwise.quantize import Quantize

    return (Quantize if op == "quantize" else Dequantize)(config)


def regression_shard(config, op: str, beats: int, seed: int, *, chunk_beats: int = CHUNK_BEATS,
                     idle: float = 0.2, backpressure: float = 0.2,
                     stall_burst: tuple[float, int, int] | None = None,
                     starve_burst: tuple[float, int, int] | None = None,
                     max_mismatches: int = MAX_MISMATCHES) -> dict[str, Any]:
    """Run one shard of :func:`run_regression` in this process: random jobs
    (:func:`~qaccel.sim.jobs.random_jobs`, generator seeded with ``seed``) of about ``beats``
    output beats in chunks of ``chunk_beats``, each chunk one checked loop run (pause seed
    ``seed`` and the chunk index); stops early at ``max_mismatches`` differences. Returns a
    dict of plain values (beats, cycles, jobs, mismatch_count, mismatches, ready, gen_time,
    sim_time, steady_time) for merging."""
    from qaccel.sim.jobs import random_jobs

    t0 = time.perf_counter()
    unit = _unit(config, op)
    elementwise_sim(unit, name=op)
    ready = time.perf_counter() - t0
    rng = np.random.default_rng(seed)
    out = {"beats": 0, "cycles": 0, "jobs": 0, "mismatch_count": 0, "mismatches": [],
           "ready": ready, "gen_time": 0.0, "sim_time": 0.0}
    t1 = time.perf_counter()
    chunk = 0
    while out["beats"] < beats and out["mismatch_count"] < max_mismatches:
        tg = time.perf_counter()
        jobs = random_jobs(unit, rng, min(chunk_beats, beats - out["beats"]))
        out["gen_time"] += time.perf_counter() - tg
        run = run_elementwise_checked(
            unit, jobs, idle=idle, backpressure=backpressure, seed=(seed << 20) + chunk,
            name=op, stall_burst=stall_burst, starve_burst=starve_burst,
            max_mismatches=max_mismatches - out["mismatch_count"])
        out["sim_time"] += run.sim_time
        out["beats"] += run.beats
        out["cycles"] += run.cycles
        out["jobs"] += run.segments
        out["mismatch_count"] += run.mismatch_count
        out["mismatches"] += [(chunk, jobs[m.segment].label, m) for m in run.mismatches]
        chunk += 1
    out["steady_time"] = time.perf_counter() - t1
    return out


def run_regression(beats: int, *, config=None, op: str = "quantize", shards: int | None = None,
                   scheduler: str | None = None, seed: int = 0, chunk_beats: int = CHUNK_BEATS,
                   idle: float = 0.2, backpressure: float = 0.2,
                   stall_burst: tuple[float, int, int] | None = None,
                   starve_burst: tuple[float, int, int] | None = None,
                   max_mismatches: int = MAX_MISMATCHES) -> Regression:
    """Check about ``beats`` output beats of random jobs on the ``op`` (``"quantize"`` or
    ``"dequantize"``) unit of ``config`` (default ``AccelConfig()``), split over ``shards``
    shards (default: the CPU count), each with its own seed (``seed`` and the shard index) and
    job stream (:func:`regression_shard`); merge their counts and mismatches.

    Shards run on local processes, or with ``scheduler`` (a ``dask.distributed`` scheduler
    address, as ``qaccel sweep`` takes) as Dask tasks; the build is made (or found) in this
    process first, so shards only look it up. Pauses: ``idle`` / ``backpressure`` and the
    bursts as in :func:`run_elementwise_checked`.
    """
    import concurrent.futures
    import os

    from qaccel.model.config import AccelConfig
    from qaccel.model.validate import check_int

    beats = check_int("beats", beats, 1)
    if op not in ("quantize", "dequantize"):
        raise ValueError(f"op must be 'quantize' or 'dequantize', not {op!r}")
    shards = (os.cpu_count() or 1) if shards is None else check_int("shards", shards, 1, 4096)
    max_mismatches = check_int("max_mismatches", max_mismatches, 1)
    chunk_beats = check_int("chunk_beats", chunk_beats, 1)
    if scheduler is not None and not isinstance(scheduler, str):
        raise TypeError(f"scheduler must be an address string, not {scheduler!r}")
    config = AccelConfig() if config is None else config
    start = time.perf_counter()
    unit = _unit(config, op)
    elementwise_sim(unit, name=op)          # build once, before the shards
    if scheduler is None:
        # compile (or load) the golden model's kernels once, before the processes fork
        from qaccel.sim.jobs import random_jobs

        random_jobs(unit, np.random.default_rng(seed), 200_000, max_elements=256)
    kw = dict(chunk_beats=chunk_beats, idle=idle, backpressure=backpressure,
              stall_burst=stall_burst, starve_burst=starve_burst, max_mismatches=max_mismatches)
    sizes = [beats // shards + (k < beats % shards) for k in range(shards)]
    args = [(config, op, n, seed * 4096 + k) for k, n in enumerate(sizes) if n]
    if scheduler is None:
        with concurrent.futures.ProcessPoolExecutor(max_workers=len(args)) as pool:
            parts = list(pool.map(_shard_call, [(a, kw) for a in args]))
    else:
        from dask.distributed import Client

        with Client(scheduler) as client:
            futures = [client.submit(regression_shard, *a, **kw, pure=False) for a in args]
            parts = client.gather(futures)
    mism = [(k, *m) for k, p in enumerate(parts) for m in p["mismatches"]]
    return Regression(op, len(parts), sum(p["beats"] for p in parts),
                      sum(p["cycles"] for p in parts), sum(p["jobs"] for p in parts),
                      sum(p["mismatch_count"] for p in parts), tuple(mism[:max_mismatches]),
                      time.perf_counter() - start, max(p["steady_time"] for p in parts),
                      sum(p["gen_time"] for p in parts), sum(p["sim_time"] for p in parts))


def _shard_call(item):
    args, kw = item
    return regression_shard(*args, **kw)
