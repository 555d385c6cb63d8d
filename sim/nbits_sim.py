"""Run MatMulNBits engine jobs (:class:`~qaccel.sim.nbits_jobs.NBitsJobV2`) on the engine
(:class:`~qaccel.rtl.nbits.matmul_nbits_v2.MatMulNBitsV2`) through the cocotb testbench
:mod:`qaccel.sim.tb_matmul_nbits`, on Verilator or Icarus.

:func:`nbits_build` finds or makes the engine's build (through :func:`qaccel.sim.
elementwise_sim.elementwise_build`: remembered per engine object and, across processes, by
the engine's design key, so the Verilog is emitted only when no build of it exists).
:func:`run_nbits_cocotb` runs jobs back to back in one simulation with random idle cycles on
every input stream and back-pressure on ``y``, checks every ``y`` beat against the job's
expected ``y`` (unless ``check=False``) and returns the beats and per-job cycle counts.
:func:`run_nbits_stream` runs jobs through the C++ stream loop of :class:`~qaccel.sim.
streamsim.StreamSim` instead (no cocotb; pauses, long stall / starvation bursts) and
:func:`check_nbits_stream` compares a job's result with its expected ``y`` words.

What the testbench needs to know of the engine (its registers and input streams) comes from
:func:`engine_ports`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from amaranth.lib import wiring

from qaccel.rtl.nbits.matmul_nbits_v2 import MatMulNBitsV2
from qaccel.sim.elementwise_sim import (
    capture_dir,
    design_key,
    elementwise_build,
    read_capture,
    run_testbench,
)
from qaccel.sim.nbits_jobs import NBitsJobV2
from qaccel.sim.runner import Build
from qaccel.sim.streamsim import Segment, StreamResult, StreamSim

__all__ = ["NBITS_NAME", "EnginePorts", "NBitsRun", "check_nbits_stream", "engine_ports",
           "job_dict", "nbits_build", "nbits_stream_sim", "run_nbits_cocotb", "run_nbits_stream"]

TEST_MODULE = "qaccel.sim.tb_matmul_nbits"
#: The engine's default Verilog module name (builds of different configurations are told
#: apart by their design key).
NBITS_NAME = "matmul_nbits_v2"


@dataclass(frozen=True)
class EnginePorts:
    """What the testbench needs to know of the engine: ``registers`` (the job register ports,
    in signature order, ``start`` excluded) and ``inputs`` (the input stream names)."""

    registers: tuple[str, ...]
    inputs: tuple[str, ...]


def engine_ports(engine: wiring.Component) -> EnginePorts:
    """Read :class:`EnginePorts` off ``engine``'s signature (its 8 registers and streams a,
    w, b, s). Raises ValueError unless ``y`` carries a float32 word with ``last`` above it."""
    members = engine.signature.members
    registers = tuple(n for n, m in members.items()
                      if m.is_port and m.flow == wiring.In and n != "start")
    inputs = tuple(n for n, m in members.items() if m.is_signature and m.flow == wiring.In)
    layout = members["y"].signature.members["payload"].shape
    y, last = layout["y"], layout["last"]
    if y.offset != 0 or y.width != 32 or last.offset != 32:
        raise ValueError(f"y payload {layout} is not a float32 word with last above it")
    return EnginePorts(registers, inputs)


def nbits_build(engine: MatMulNBitsV2, *, name: str | None = None,
                simulator: str = "verilator") -> Build:
    """Return a finished build of ``engine`` as module ``name`` (default :data:`NBITS_NAME`),
    emitting its Verilog only when no build of it is known. Raises
    :exc:`~qaccel.sim.runner.SimulatorNotFoundError` or :exc:`~qaccel.sim.runner.BuildError`.
    """
    return elementwise_build(engine, name=name or NBITS_NAME, simulator=simulator)


def _payload_ints(beats: np.ndarray) -> list[int]:
    """StreamSim payload words (``(n,)`` or ``(n, words)`` uint64, LS word first) -> ints."""
    beats = np.asarray(beats, np.uint64)
    if beats.ndim == 1:
        return [int(v) for v in beats]
    return [sum(int(w) << (64 * i) for i, w in enumerate(row)) for row in beats]


def job_dict(job: NBitsJobV2, *, label: str | None = None, check: bool = True,
             reset_after: int | None = None) -> dict:
    """The testbench's form of ``job``: registers, payload ints per input stream, the number
    of ``y`` beats (one word each) and per beat the expected float32 bit pattern, ``None``
    where it is not compared (a word past N, not ``job.real``); ``y`` is None with
    ``check=False``. Each beat is tagged with its (row, column) for error messages.
    ``reset_after``: the testbench asserts ``rst`` that many cycles after the job's
    ``start`` (at least 2), abandoning it.
    """
    y = None
    if check:
        y = [int(w) if r else None
             for w, r in zip(np.asarray(job.y, np.uint32), job.real, strict=True)]
    out = {"label": label or job.meta.get("label", ""),
           "regs": {k: int(v) for k, v in job.regs.items()},
           "inputs": {name: _payload_ints(v) for name, v in job.inputs.items()},
           "beats": len(job.y), "y": y,
           "tags": [f"beat {p} (row {r}, column {c})"
                    for p, (r, c) in enumerate(np.asarray(job.order).tolist())]}
    if reset_after is not None:
        out["reset_after"] = int(reset_after)
    return out


def _watchdog(jobs: Sequence[dict], chunks: Sequence[int]) -> int:
    """A stall timeout: generous against the most input beats the engine may take between
    two ``y`` beats under pauses (``chunks[j]``: the parts of job ``j`` whose inputs all go
    in before its next ``y`` beat, its row tiles)."""
    per_chunk = max(sum(len(v) for v in j["inputs"].values()) / c
                    for j, c in zip(jobs, chunks, strict=True))
    return int(2000 + 20 * per_chunk)


@dataclass(frozen=True)
class NBitsRun:
    """What :func:`run_nbits_cocotb` saw.

    ``beats[j]`` are the ``y`` payloads of job ``j`` in order (a float32 word, ``last``
    above it); ``y[j]`` the words as uint32 codes, ``(beats,)`` like ``job.y`` (what
    :func:`~qaccel.sim.nbits_jobs.unpack_y_v2` takes); ``cycles[j]`` the clock edges
    from the one taking ``start`` to the one taking the job's last ``y`` beat. ``checked``:
    every beat was compared with the job's ``y``. ``aborted[j]``: None, or for a job reset
    before its end (``reset_after``) ``{"cycle": cycles after start, "taken": input beats
    taken per stream, "y": y beats received}`` (its ``cycles[j]`` is None and its ``beats``
    those received before the reset). ``built``: this call compiled the design;
    ``build_seconds`` the time to find or make the build, ``sim_seconds`` the simulator run,
    ``seconds`` the whole call.
    """

    simulator: str
    beats: list[list[int]]
    y: list[np.ndarray]
    cycles: list[int | None]
    checked: bool
    built: bool
    build_seconds: float
    sim_seconds: float
    seconds: float
    records: dict
    aborted: list[dict | None]


def run_nbits_cocotb(engine: MatMulNBitsV2, jobs: Sequence[NBitsJobV2], *,
                     name: str | None = None, simulator: str = "verilator", idle: float = 0.0,
                     backpressure: float = 0.0, seed: int = 1, max_burst: int = 4,
                     watchdog: int | None = None, check: bool = True,
                     reset_after: Mapping[int, int] | None = None, stall: int = 0,
                     starve: int = 0, fifos: Sequence[tuple[str, int, bool]] = ()) -> NBitsRun:
    """Run ``jobs`` back to back on ``engine`` (module ``name``) in one cocotb simulation.

    ``idle`` is the probability per cycle that an input stream (each of the engine's, ``a``,
    ``w``, ``b``, ``s``, with its own generator) starts a pause of 1..``max_burst`` cycles
    between beats; ``backpressure`` the same for withholding ``y.ready``; both seeded by
    ``seed``. With ``check`` every ``y`` beat is compared with the job's ``y`` (words where
    ``job.real``; NaN equal to NaN), ``last`` and the beat count too; the first mismatch
    fails the run, naming the job's index and label (``job.meta["label"]``). ``watchdog``:
    cycles without progress on a stream with beats outstanding before the run fails (default
    from the jobs' sizes). ``reset_after`` maps a job's index to the cycles after its
    ``start`` at which ``rst`` is asserted (see :func:`job_dict`); the engine must be idle
    right after the reset and the next job must come out exact. ``stall`` / ``starve``: the
    testbench's long ``y.ready``-low and input ``valid``-low bursts (cycles; 0: none) and
    ``fifos`` the (hierarchy path, depth, margin-credited) of the FIFOs whose occupancy it
    checks every cycle (see :mod:`qaccel.sim.tb_matmul_nbits`).

    Raises ValueError for jobs that are empty or do not fit the engine (other registers or
    streams), :exc:`~qaccel.sim.runner.SimulatorNotFoundError`,
    :exc:`~qaccel.sim.runner.BuildError`, :exc:`~qaccel.sim.runner.SimulationFailed` (a
    check, a protocol assertion or the watchdog failed) or
    :exc:`~qaccel.sim.runner.SimulationError`.
    """
    if not jobs:
        raise ValueError("jobs must hold at least one NBitsJobV2")
    start = time.perf_counter()
    ports = engine_ports(engine)
    resets = dict(reset_after or {})
    if not set(resets) <= set(range(len(jobs))):
        raise ValueError(f"reset_after names jobs {sorted(set(resets) - set(range(len(jobs))))}"
                         f" of {len(jobs)}")
    dicts = [job_dict(j, label=j.meta.get("label") or f"job {k}", check=check,
                      reset_after=resets.get(k))
             for k, j in enumerate(jobs)]
    for d in dicts:
        if set(d["regs"]) != set(ports.registers) or not set(d["inputs"]) <= set(ports.inputs):
            raise ValueError(f"job {d['label']!r} (registers {sorted(d['regs'])}, streams "
                             f"{sorted(d['inputs'])}) does not fit the engine (registers "
                             f"{list(ports.registers)}, streams {list(ports.inputs)})")
        if d["beats"] < 1 or d["regs"]["k"] < 1:
            raise ValueError(f"job {d['label']!r} is empty (k or y beats 0): it gives no beats")
    b = nbits_build(engine, name=name, simulator=simulator)
    build_seconds = time.perf_counter() - start
    run_dir = capture_dir(b.toplevel, simulator)
    jobs_file, capture_file = run_dir / "jobs.json", run_dir / "capture.json"
    jobs_file.write_text(json.dumps(dicts))
    m_tile = engine.config.m_tile
    chunks = [-(-d["regs"]["m"] // m_tile) for d in dicts]
    config = {"jobs_file": str(jobs_file), "capture_file": str(capture_file),
              "registers": list(ports.registers), "inputs": list(ports.inputs), "idle": idle,
              "backpressure": backpressure, "seed": seed, "max_burst": max_burst,
              "watchdog": watchdog or _watchdog(dicts, chunks),
              "busy_lag": engine.timing["done"],       # busy low this soon after the last y
              "stall": stall, "starve": starve, "fifos": [list(f) for f in fifos]}
    t0 = time.perf_counter()
    run_testbench(b, run_dir, config, "test_jobs", None, None, test_module=TEST_MODULE)
    sim_seconds = time.perf_counter() - t0
    files = read_capture(run_dir, simulator, ("capture", "records"))
    data, records = files["capture"], files["records"]
    beats = data["beats"]
    y = [np.array([b & 0xFFFFFFFF for b in bs], np.uint32) for bs in beats]
    return NBitsRun(simulator=simulator, beats=beats, y=y, cycles=data["cycles"],
                    checked=check, built=b.built, build_seconds=build_seconds,
                    sim_seconds=sim_seconds, seconds=time.perf_counter() - start,
                    records=records, aborted=data["aborted"])


_STREAM_SIMS: dict = {}


def nbits_stream_sim(engine: MatMulNBitsV2, *, name: str | None = None) -> StreamSim:
    """The :class:`~qaccel.sim.streamsim.StreamSim` of ``engine`` (module ``name``, default
    :data:`NBITS_NAME`), built or found once per process and configuration."""
    if not isinstance(engine, MatMulNBitsV2):
        raise TypeError(f"engine must be a MatMulNBitsV2, not {engine!r}")
    key = (engine.config, name or NBITS_NAME)
    if key not in _STREAM_SIMS:
        _STREAM_SIMS[key] = StreamSim(engine, name=key[1], design_key=design_key(engine))
    return _STREAM_SIMS[key]


def run_nbits_stream(engine: MatMulNBitsV2, jobs: Sequence[NBitsJobV2], *,
                     name: str | None = None, idle: float = 0.0, backpressure: float = 0.0,
                     seed: int = 1, watchdog: int = 100_000,
                     stall_burst: tuple[float, int, int] | None = None,
                     starve_burst: tuple[float, int, int] | None = None) -> list[StreamResult]:
    """Run ``jobs`` back to back on ``engine`` through the C++ stream loop (one segment per
    job: ``start`` pulsed, then every input stream concurrently, ``y`` received until
    ``len(job.y)`` beats arrived); return each job's
    :class:`~qaccel.sim.streamsim.StreamResult` (``blocked`` per input stream). Pauses and
    bursts as :meth:`~qaccel.sim.streamsim.StreamSim.run_segments`; nothing is compared (see
    :func:`check_nbits_stream`)."""
    if isinstance(jobs, NBitsJobV2) or not isinstance(jobs, Sequence) or not jobs:
        raise ValueError(f"jobs must be a non-empty sequence of NBitsJobV2, not {jobs!r}")
    segments = [Segment(j.inputs, j.regs, phases=[["start"], list(j.inputs)],
                        expect={"y": len(j.y)}) for j in jobs]
    return nbits_stream_sim(engine, name=name).run_segments(
        segments, idle=idle, backpressure=backpressure, seed=seed, watchdog=watchdog,
        stall_burst=stall_burst, starve_burst=starve_burst)


def check_nbits_stream(job: NBitsJobV2, result: StreamResult) -> None:
    """Raise :exc:`AssertionError` unless ``result`` holds exactly ``len(job.y)`` ``y`` beats,
    each word bit-exact where ``job.real`` (NaN codes too) and ``last`` on the last only."""
    label = job.meta.get("label", "")
    beats = np.asarray(result.outputs["y"], dtype=np.uint64).reshape(-1)
    if len(beats) != len(job.y):
        raise AssertionError(f"{label}: {len(beats)} y beats, expected {len(job.y)}")
    got = (beats & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    bad = np.flatnonzero((got != job.y) & job.real)
    if bad.size:
        raise AssertionError(f"{label}: y differs at (row, column) "
                             f"{job.order[bad[:4]].tolist()}: {[hex(v) for v in got[bad[:4]]]}"
                             f" vs {[hex(v) for v in job.y[bad[:4]]]}")
    last = ((beats >> np.uint64(32)) & np.uint64(1)).tolist()
    if last != [0] * (len(job.y) - 1) + [1]:
        raise AssertionError(f"{label}: last flags {last}")
