"""Clock and reset for cocotb testbenches of Amaranth designs (``clk`` / ``rst`` ports).

Amaranth's ``sync`` domain has an active-high synchronous reset. Both helpers keep the
falling-edge discipline of :mod:`qaccel.sim.streams`: inputs change only after falling edges.
"""

from __future__ import annotations

from cocotb.clock import Clock
from cocotb.triggers import FallingEdge, RisingEdge

__all__ = ["CLOCK_PERIOD_NS", "reset", "start_clock"]

#: Clock period used by every testbench, in ns (the runner's timescale is 1ns/1ps).
CLOCK_PERIOD_NS = 10


def start_clock(dut, *, period_ns: int = CLOCK_PERIOD_NS) -> Clock:
    """Start a free-running clock on ``dut.clk`` (GPI implementation: fast on both simulators)."""
    clock = Clock(dut.clk, period_ns, unit="ns", impl="gpi")
    clock.start(start_high=False)
    return clock


async def reset(dut, *, cycles: int = 2) -> None:
    """Hold ``dut.rst`` high for ``cycles`` rising edges; return just after a falling edge."""
    await FallingEdge(dut.clk)
    dut.rst.value = 1
    for _ in range(cycles):
        await RisingEdge(dut.clk)
    await FallingEdge(dut.clk)
    dut.rst.value = 0
