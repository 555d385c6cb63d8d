"""Verification throughput: output beats simulated and checked against the golden model per
second of wall time, for each simulator and harness, on one long random stream.

``python -m qaccel bench verify`` runs a QuantizeLinear call (float32 -> int8, blocked 32, with
random idle cycles on ``x`` and back-pressure on ``y``) through :class:`qaccel.RTL` with
``check=True``: the simulated unit's every output beat is decoded and compared with the golden
model.  The build is compiled (or reused) by an untimed warm-up call first, so the figures are
steady-state simulation plus checking, which is what a long test run costs.

The ``stream-c++`` rows check inside the C++ stream loop instead (:func:`qaccel.sim.
elementwise_sim.run_regression`): random Quantize jobs of the default configuration (every
float input and every output type, per-tensor / per-axis / blocked, idle 0.2 and
back-pressure 0.2), their expected beats streamed to the loop in chunks, sharded over local
processes or a Dask cluster; the rate is per second of the shards' steady state (the
simulators found or built; job generation, golden model and checked simulation included).
A beat is one output transfer on ``y`` (one element per lane: the default unit has 1 lane).
:func:`add_verify_arguments` / :func:`run_verify` are the ``qaccel bench verify`` command.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

__all__ = ["CHECKED_BEATS", "VERIFY_RUNS", "VerifyRow", "add_verify_arguments",
           "checked_throughput", "format_verify_table", "run_verify", "verify_throughput"]

#: Output beats of a ``stream-c++`` (checked in the loop, sharded) round.
CHECKED_BEATS = 8_000_000
#: Target of the ``stream-c++`` harness on a 2-core machine (issue 19, point 6).
TARGET_BEATS_PER_SECOND = 1_000_000

#: (simulator, harness, output beats of the long run) measured by default.
VERIFY_RUNS = (
    ("verilator", "stream", 1_000_000),
    ("verilator", "cocotb", 40_000),
    ("icarus", "cocotb", 10_000),
)


@dataclass(frozen=True)
class VerifyRow:
    """One long run: what was simulated, how long it took, and whether it matched."""

    simulator: str
    harness: str
    beats: int
    cycles: int
    wall_time: float
    verdict: str

    @property
    def beats_per_second(self) -> float:
        return self.beats / self.wall_time

    @property
    def cycles_per_second(self) -> float:
        return self.cycles / self.wall_time


def verify_throughput(runs=VERIFY_RUNS, *, config=None, scale: float = 1.0, idle: float = 0.2,
                      backpressure: float = 0.2, seed: int = 0, progress=None) -> list[VerifyRow]:
    """Time one long checked Quantize run per ``(simulator, harness, beats)`` of ``runs``
    (``beats`` multiplied by ``scale``); runs whose simulator is missing are left out."""
    from qaccel.engine import RTL, RTLMismatchError, example_call
    from qaccel.model.config import AccelConfig
    from qaccel.sim.runner import missing_simulator

    config = AccelConfig() if config is None else config
    if not scale > 0:
        raise ValueError(f"scale must be > 0, not {scale!r}")
    rows = []
    for simulator, harness, beats in runs:
        if missing_simulator(simulator) is not None:
            continue
        rtl = RTL(config, simulator, check=True, harness=harness, idle=idle,
                  backpressure=backpressure, seed=seed)
        warm, kw = example_call("quantize", (4, 64), axis=1, block_size=32, seed=seed)
        rtl.quantize_linear(*warm, **kw)               # compiles or reuses the build
        cols = 512
        rows_of_x = max(1, round(beats * scale * config.lanes / cols))
        call, kw = example_call("quantize", (rows_of_x, cols), axis=1, block_size=32,
                                seed=seed + 1)
        t0 = time.perf_counter()
        try:
            rtl.quantize_linear(*call, **kw)
            verdict = "bit-exact"
        except RTLMismatchError as e:
            verdict = f"DIFFERENT: {e}"
        wall = time.perf_counter() - t0
        run = rtl.last_run
        rows.append(VerifyRow(simulator, run.harness, run.beats, run.cycles, wall, verdict))
        if progress is not None:
            progress(rows[-1])
    return rows


def format_verify_table(rows: list[VerifyRow]) -> str:
    """Render rows as a fixed-width table."""
    lines = [f"{'simulator':<10} {'harness':<13} {'beats':>10} {'cycles':>11} {'wall s':>8} "
             f"{'beats/s':>10} {'cycles/s':>11}  check"]
    for r in rows:
        lines.append(f"{r.simulator:<10} {r.harness:<13} {r.beats:>10,} {r.cycles:>11,} "
                     f"{r.wall_time:>8.2f} {r.beats_per_second:>10,.0f} "
                     f"{r.cycles_per_second:>11,.0f}  {r.verdict}")
    return "\n".join(lines)


def checked_throughput(beats: int = CHECKED_BEATS, *, shards: int | None = None,
                       scheduler: str | None = None, config=None, idle: float = 0.2,
                       backpressure: float = 0.2, seed: int = 0) -> VerifyRow:
    """One sharded run checked in the C++ loop (:func:`~qaccel.sim.elementwise_sim.
    run_regression`, Quantize) as a :class:`VerifyRow` whose ``wall_time`` is the shards'
    steady state (see the module notes)."""
    from qaccel.sim.elementwise_sim import run_regression

    reg = run_regression(beats, config=config, shards=shards, scheduler=scheduler, seed=seed,
                         idle=idle, backpressure=backpressure)
    verdict = "bit-exact" if reg.ok else \
        f"DIFFERENT: {reg.mismatch_count} beats, first {reg.mismatches[0][-1]}"
    return VerifyRow("verilator", f"stream-c++ x{reg.shards}", reg.beats, reg.cycles,
                     reg.steady_time, verdict)


#: The largest value of each ``qaccel bench verify`` count (the least is 1).
VERIFY_LIMITS = {"shards": 256, "checked_beats": 10**10, "rounds": 1000}


def add_verify_arguments(parser) -> None:
    """Add the options of ``qaccel bench verify`` to ``parser`` (besides ``--quick`` and
    ``--seed``, which the bench command has): ``--shards``, ``--scheduler``,
    ``--checked-beats``, ``--rounds``."""
    from qaccel.app.cli import number_type

    def count(name):
        most = VERIFY_LIMITS[name]
        return number_type(int, lambda v: 1 <= v <= most, f"an integer in [1, {most:,}]")

    parser.add_argument("--shards", type=count("shards"), default=None, metavar="N",
                        help="processes (or Dask tasks) the C++-checked run is split over "
                             "(default: the CPU count)")
    parser.add_argument("--scheduler", default=None, metavar="ADDRESS",
                        help="run the C++-checked shards on this dask.distributed scheduler "
                             "instead of local processes")
    parser.add_argument("--checked-beats", type=count("checked_beats"), default=CHECKED_BEATS,
                        metavar="N",
                        help=f"output beats of a C++-checked round (default {CHECKED_BEATS:,})")
    parser.add_argument("--rounds", type=count("rounds"), default=3, metavar="N",
                        help="rounds per harness; the table shows the median (default 3)")


def run_verify(args) -> int:
    """``qaccel bench verify``: print the CPU and ISA tier, then the median checked beats per
    second of each harness over ``args.rounds`` rounds; return 0 if every run was bit-exact
    (1 otherwise). ``args``: the options of :func:`add_verify_arguments`, ``quick`` and
    ``seed`` (both optional)."""
    from qaccel.app.bench import cpu_info, kernel_tier

    quick, seed = getattr(args, "quick", False), getattr(args, "seed", 0) or 0
    for name, most in VERIFY_LIMITS.items():
        value = getattr(args, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 1 <= value <= most):
            raise ValueError(f"--{name.replace('_', '-')} must be an integer in [1, {most:,}], "
                             f"not {value!r}")
    if args.scheduler is not None and not args.scheduler.strip():
        raise ValueError(f"--scheduler must be a scheduler address, not {args.scheduler!r}")
    cpu, tier = cpu_info()
    shards = args.shards or os.cpu_count() or 1
    print(f"CPU: {cpu}, {os.cpu_count()} logical cores, ISA tier {tier}; golden-model kernels "
          f"compiled for {kernel_tier()}", flush=True)
    print(f"checked output beats (a beat: one transfer on y) per second, Quantize unit of the "
          f"default configuration, idle 0.2, back-pressure 0.2; median of {args.rounds} "
          f"rounds; stream-c++: checked in the C++ loop over {shards} "
          f"{'Dask tasks' if args.scheduler else 'processes'}, random jobs; the others: one "
          "long call through qaccel.RTL, checked in Python", flush=True)
    scale = 0.01 if quick else 1.0
    per: dict[tuple[str, str], list[VerifyRow]] = {}
    for r in range(args.rounds):
        rows = [checked_throughput(max(1, round(args.checked_beats * scale)), shards=shards,
                                   scheduler=args.scheduler, seed=seed + r)]
        rows += verify_throughput(scale=scale, seed=seed + r)
        for row in rows:
            per.setdefault((row.simulator, row.harness), []).append(row)
        print(f"  round {r + 1} of {args.rounds}: "
              + ", ".join(f"{row.harness} ({row.simulator}) {row.beats_per_second:,.0f}/s"
                          for row in rows), flush=True)
    medians = []
    for rows in per.values():
        rates = sorted(rows, key=lambda row: row.beats_per_second)
        best = rates[(len(rates) - 1) // 2]
        bad = [row.verdict for row in rows if row.verdict != "bit-exact"]
        medians.append(best if not bad else VerifyRow(best.simulator, best.harness, best.beats,
                                                      best.cycles, best.wall_time, bad[0]))
    print(format_verify_table(medians))
    fast = medians[0].beats_per_second
    print(f"stream-c++ target {TARGET_BEATS_PER_SECOND:,} beats/s: "
          f"{'met' if fast >= TARGET_BEATS_PER_SECOND else 'NOT met'} ({fast:,.0f}/s)")
    return 0 if all(row.verdict == "bit-exact" for row in medians) else 1
