"""Run jobs (:mod:`qaccel.sim.jobs`) on a Quantize or Dequantize unit through cocotb.

:func:`run_elementwise` writes the jobs to a JSON file next to the build, runs the testbench
:mod:`qaccel.sim.tb_elementwise` on Verilator or Icarus and returns the
:class:`~qaccel.sim.runner.SimResult` (its ``records`` hold each test's measurements).

:func:`capture_elementwise` runs jobs without checking them and returns the ``y`` beats the
unit produced, with cycle counts: the engine behind :class:`qaccel.engine.RTL`. Its build is
found without emitting Verilog when one exists (:func:`elementwise_build`), so a call costs the
simulation only.
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

from qaccel.rtl.elementwise import Elementwise
from qaccel.sim import tbconfig
from qaccel.sim.jobs import Job
from qaccel.sim.runner import (
    BUILD_ARGS,
    MAKE_VARIABLES,
    TIMESCALE,
    Build,
    SimResult,
    SimulationError,
    SimulationFailed,
    build,
    build_root,
    digest,
    log_tail,
    mark_elaborated,
    run_cocotb,
    sources_digest,
)

__all__ = ["Capture", "capture_elementwise", "elementwise_build", "run_elementwise",
           "table_fields"]

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
    """A hash of everything ``unit``'s Verilog depends on (its class, its configuration, the
    rtl and model sources, the tool versions): builds are found by it without emitting."""
    return digest({"unit": f"{type(unit).__module__}.{type(unit).__qualname__}",
                   "config": unit.config.to_dict(), "sources": sources_digest()})


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
        if (found.build_dir / "build.json").is_file() and _artefact(found).exists():
            b = Build(simulator, name, found.build_dir, found.verilog, False,
                      time.perf_counter() - start)
            mark_elaborated(unit)
    if b is None:
        b = build(unit, name=name, simulator=simulator)
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
    _run_testbench(b, run_dir, config, "test_jobs", progress_file if progress else None,
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


def _run_testbench(b: Build, run_dir: Path, config: dict, testcase: str,
                   progress_file: Path | None, progress, *,
                   test_module: str = "qaccel.sim.tb_elementwise") -> None:
    """Run ``test_module`` (default ``tb_elementwise``) on the finished build ``b`` in
    ``run_dir`` (what :func:`~qaccel.sim.runner.run_cocotb` does after its build step); raise
    if a test fails."""
    from cocotb_tools.check_results import get_results
    from cocotb_tools.runner import get_runner

    from qaccel.sim.runner import _environment, _parse_results

    results, records = run_dir / "results.xml", run_dir / "records.json"
    log_file = run_dir / "sim.log"
    failure: list[str] = []

    def simulate():
        try:
            with _environment(b.simulator):
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
        lines = [f"  {n}: {msg or 'failed'}" for n, st, msg in _parse_results(results)
                 if st == "failed"]
        raise SimulationFailed(f"the capture run failed on {b.simulator} ({b.toplevel}, run dir "
                               f"{run_dir}):\n" + "\n".join(lines) + log_tail(log_file))
