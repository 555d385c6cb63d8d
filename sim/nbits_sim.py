"""Run MatMulNBits engine jobs (:mod:`qaccel.sim.nbits_jobs`) through the cocotb testbench
:mod:`qaccel.sim.tb_matmul_nbits`, on Verilator or Icarus.

:func:`nbits_build` finds or makes the engine's build (through :func:`qaccel.sim.
elementwise_sim.elementwise_build`: remembered per engine object and, across processes, by
the engine's design key, so the Verilog is emitted only when no build of it exists).
:func:`run_nbits_cocotb` runs jobs back to back in one simulation with random idle cycles on
every input stream and back-pressure on ``y``, checks every ``y`` beat against the job's
expected ``y`` (unless ``check=False``) and returns the beats and per-job cycle counts.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from qaccel.rtl.matmul_nbits import MatMulNBits
from qaccel.sim.elementwise_sim import (
    _run_testbench,
    capture_dir,
    elementwise_build,
    read_capture,
)
from qaccel.sim.nbits_jobs import NBitsJob, y_words
from qaccel.sim.runner import Build

__all__ = ["NBitsRun", "job_dict", "nbits_build", "nbits_name", "run_nbits_cocotb"]

TEST_MODULE = "qaccel.sim.tb_matmul_nbits"


def nbits_name(engine: MatMulNBits) -> str:
    """The default Verilog module name of ``engine``: ``matmul_nbits`` (builds of different
    configurations are told apart by their design key), as :class:`qaccel.RTL` names it."""
    del engine
    return "matmul_nbits"


def nbits_build(engine: MatMulNBits, *, name: str | None = None,
                simulator: str = "verilator") -> Build:
    """Return a finished build of ``engine`` as module ``name`` (default :func:`nbits_name`),
    emitting its Verilog only when no build of it is known. Raises
    :exc:`~qaccel.sim.runner.SimulatorNotFoundError` or :exc:`~qaccel.sim.runner.BuildError`.

    Icarus builds take :func:`~qaccel.sim.runner.icarus_time0_fix` with ``live_drivers``:
    without it the sign of ActivationQuant's absolute maximum (a bare ``always @*`` copy of a
    bit that is 0 from time 0 on) stays X, and so does every ``y`` beat.
    """
    return elementwise_build(engine, name=name or nbits_name(engine), simulator=simulator,
                             icarus_live_drivers=True)


def _payload_ints(beats: np.ndarray) -> list[int]:
    """StreamSim payload words (``(n,)`` or ``(n, words)`` uint64, LS word first) -> ints."""
    beats = np.asarray(beats, np.uint64)
    if beats.ndim == 1:
        return [int(v) for v in beats]
    return [sum(int(w) << (64 * i) for i, w in enumerate(row)) for row in beats]


def job_dict(job: NBitsJob, pe: int, *, label: str | None = None, check: bool = True) -> dict:
    """The testbench's form of ``job``: registers, payload ints per input stream, and per pass
    the expected ``pe`` float32 bit patterns, ``None`` for columns past N (not compared);
    ``y`` is None with ``check=False``."""
    passes = job.passes
    y = None
    if check:
        expected = np.asarray(job.y, np.uint32).reshape(passes, pe)
        group = np.arange(passes) // job.M
        real = group[:, None] * pe + np.arange(pe)[None, :] < job.N
        y = [[int(w) if r else None for w, r in zip(row, rrow, strict=True)]
             for row, rrow in zip(expected, real, strict=True)]
    return {"label": label or job.meta.get("label", ""),
            "regs": {k: int(v) for k, v in job.regs.items()},
            "inputs": {name: _payload_ints(v) for name, v in job.inputs.items()},
            "passes": passes, "y": y}


def _watchdog(jobs: Sequence[dict]) -> int:
    """A stall timeout: generous against the longest pass (its input beats) under pauses."""
    per_pass = max(sum(len(v) for v in j["inputs"].values()) / j["passes"] for j in jobs)
    return int(2000 + 20 * per_pass)


@dataclass(frozen=True)
class NBitsRun:
    """What :func:`run_nbits_cocotb` saw.

    ``beats[j]`` are the ``y`` payloads of job ``j`` in order (``pe`` float32 words, ``last``
    above them); ``y[j]`` the same as ``(passes, pe)`` uint32 bit patterns (what ``job.y``
    holds and :func:`~qaccel.sim.nbits_jobs.unpack_y` takes); ``cycles[j]`` the clock edges
    from the one taking ``start`` to the one taking the job's last ``y`` beat. ``checked``:
    every beat was compared with the job's ``y``. ``built``: this call compiled the design;
    ``build_seconds`` the time to find or make the build, ``sim_seconds`` the simulator run,
    ``seconds`` the whole call.
    """

    simulator: str
    beats: list[list[int]]
    y: list[np.ndarray]
    cycles: list[int]
    checked: bool
    built: bool
    build_seconds: float
    sim_seconds: float
    seconds: float
    records: dict


def run_nbits_cocotb(engine: MatMulNBits, jobs: Sequence[NBitsJob], *, name: str | None = None,
                     simulator: str = "verilator", idle: float = 0.0,
                     backpressure: float = 0.0, seed: int = 1, max_burst: int = 4,
                     watchdog: int | None = None, check: bool = True) -> NBitsRun:
    """Run ``jobs`` back to back on ``engine`` (module ``name``) in one cocotb simulation.

    ``idle`` is the probability per cycle that an input stream (``a``, ``w``, ``s``, ``z``,
    each with its own generator) starts a pause of 1..``max_burst`` cycles between beats;
    ``backpressure`` the same for withholding ``y.ready``; both seeded by ``seed``. With
    ``check`` every ``y`` beat is compared with the job's ``y`` (columns past N skipped, NaN
    equal to NaN), ``last`` and the beat count too; the first mismatch fails the run, naming
    the job's index and label (``job.meta["label"]``). ``watchdog``: cycles without progress
    on a stream with beats outstanding before the run fails (default from the jobs' sizes).

    Raises :exc:`~qaccel.sim.runner.SimulatorNotFoundError`, :exc:`~qaccel.sim.runner.
    BuildError`, :exc:`~qaccel.sim.runner.SimulationFailed` (a check, a protocol assertion or
    the watchdog failed) or :exc:`~qaccel.sim.runner.SimulationError`.
    """
    if not jobs:
        raise ValueError("jobs must hold at least one NBitsJob")
    start = time.perf_counter()
    pe = engine.config.pe
    dicts = [job_dict(j, pe, label=j.meta.get("label") or f"job {k}", check=check)
             for k, j in enumerate(jobs)]
    for d in dicts:
        if d["passes"] < 1 or d["regs"]["k"] < 1:
            raise ValueError(f"job {d['label']!r} is empty (k or passes 0): it gives no beats")
    b = nbits_build(engine, name=name, simulator=simulator)
    build_seconds = time.perf_counter() - start
    run_dir = capture_dir(b.toplevel, simulator)
    jobs_file, capture_file = run_dir / "jobs.json", run_dir / "capture.json"
    jobs_file.write_text(json.dumps(dicts))
    config = {"jobs_file": str(jobs_file), "capture_file": str(capture_file), "pe": pe,
              "idle": idle, "backpressure": backpressure, "seed": seed, "max_burst": max_burst,
              "watchdog": watchdog or _watchdog(dicts)}
    t0 = time.perf_counter()
    _run_testbench(b, run_dir, config, "test_jobs", None, None, test_module=TEST_MODULE)
    sim_seconds = time.perf_counter() - t0
    files = read_capture(run_dir, simulator, ("capture", "records"))
    data, records = files["capture"], files["records"]
    beats = data["beats"]
    return NBitsRun(simulator=simulator, beats=beats,
                    y=[y_words(bs, pe) if bs else np.zeros((0, pe), np.uint32) for bs in beats],
                    cycles=data["cycles"], checked=check, built=b.built,
                    build_seconds=build_seconds, sim_seconds=sim_seconds,
                    seconds=time.perf_counter() - start, records=records)
