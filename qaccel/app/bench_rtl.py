"""Verification throughput: output beats simulated and checked against the golden model per
second of wall time, for each simulator and harness, on one long random stream.

``python -m qaccel bench verify`` runs a QuantizeLinear call (float32 -> int8, blocked 32, with
random idle cycles on ``x`` and back-pressure on ``y``) through :class:`qaccel.RTL` with
``check=True``: the simulated unit's every output beat is decoded and compared with the golden
model.  The build is compiled (or reused) by an untimed warm-up call first, so the figures are
steady-state simulation plus checking, which is what a long test run costs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

__all__ = ["VERIFY_RUNS", "VerifyRow", "format_verify_table", "verify_throughput"]

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
    lines = [f"{'simulator':<10} {'harness':<8} {'beats':>10} {'cycles':>10} {'wall s':>8} "
             f"{'beats/s':>10} {'cycles/s':>11}  check"]
    for r in rows:
        lines.append(f"{r.simulator:<10} {r.harness:<8} {r.beats:>10,} {r.cycles:>10,} "
                     f"{r.wall_time:>8.2f} {r.beats_per_second:>10,.0f} "
                     f"{r.cycles_per_second:>11,.0f}  {r.verdict}")
    return "\n".join(lines)
