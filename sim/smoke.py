"""Toolchain smoke test: Amaranth -> Verilog -> cocotb on Verilator or Icarus.

:func:`run_smoke` runs the :class:`~qaccel.rtl.arith.saturate.Saturate` testbench
(:mod:`qaccel.sim.tb_saturate`) through :func:`qaccel.sim.runner.run_cocotb` and returns a
summary dict; it prints nothing.
"""

from __future__ import annotations

from typing import Any

from qaccel.rtl.arith.saturate import Saturate
from qaccel.sim.runner import SimResult, run_cocotb

__all__ = ["DEFAULT_BEATS", "run_saturate", "run_smoke", "saturate_config"]

#: (random-stream beats, throughput beats) per simulator; Icarus is slower per cycle.
DEFAULT_BEATS = {"verilator": (3000, 2000), "icarus": (1500, 1000)}


def saturate_config(dut: Saturate, simulator: str, **overrides: Any) -> dict[str, Any]:
    """Return the ``tb_saturate`` parameters for ``dut`` (see that module for the keys)."""
    beats, throughput_beats = DEFAULT_BEATS.get(simulator, DEFAULT_BEATS["icarus"])
    config = {
        "in_width": dut.in_width,
        "bits": dut.bits,
        "signed": dut.signed,
        "latency": dut.latency,
        "beats": beats,
        "throughput_beats": throughput_beats,
        "seed": 1,
    }
    config.update(overrides)
    return config


def run_saturate(dut: Saturate, simulator: str = "verilator", **overrides: Any) -> SimResult:
    """Run every ``tb_saturate`` test on ``dut``; raise if any fails (see ``run_cocotb``)."""
    return run_cocotb(
        dut,
        name="saturate",
        test_module="tb_saturate",
        simulator=simulator,
        config=saturate_config(dut, simulator, **overrides),
    )


def run_smoke(simulator: str = "verilator", *, beats: int | None = None,
              seed: int = 1) -> dict[str, Any]:
    """Run the saturate testbench on an ``int8`` clamp of 12-bit inputs; return a summary.

    Keys: ``simulator``, ``passed`` (always True: failures raise), ``tests``,
    ``beats_checked`` (over all tests), ``cycles``, ``beats_per_cycle`` and ``latency``
    (no idle cycles, no back-pressure), ``beats_per_second`` (checked beats over simulation
    time), ``wall_time_s`` (including Verilog emission and any build), ``build_reused``.
    Raises :exc:`qaccel.sim.runner.SimulatorNotFoundError` when the simulator is missing.
    """
    dut = Saturate(12, bits=8, signed=True)
    overrides: dict[str, Any] = {"seed": seed}
    if beats is not None:
        overrides.update(beats=beats, throughput_beats=beats)
    res = run_saturate(dut, simulator, **overrides)
    stream, thru = res.records["test_random_stream"], res.records["test_throughput"]
    beats_checked = stream["beats"] + thru["beats"]
    sim_seconds = stream["seconds"] + thru["seconds"]
    return {
        "simulator": simulator,
        "passed": res.ok,
        "tests": res.tests,
        "beats_checked": beats_checked,
        "cycles": stream["cycles"] + thru["cycles"],
        "beats_per_cycle": thru["beats_per_cycle"],
        "latency": thru["latency"],
        "stated_latency": dut.latency,
        "beats_per_second": round(beats_checked / sim_seconds, 1),
        "wall_time_s": round(res.wall_time, 3),
        "build_reused": not res.built,
    }
