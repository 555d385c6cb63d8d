# amaranth: UnusedElaboratable=no
"""Saturate on generated Verilog: cocotb on Verilator and Icarus, through qaccel.sim.runner."""

from __future__ import annotations

import pytest

from qaccel.rtl.arith.saturate import Saturate
from qaccel.sim.runner import SimulationFailed, missing_simulator
from qaccel.sim.smoke import run_saturate, run_smoke

pytestmark = pytest.mark.sim


def simulator_param(name: str):
    reason = missing_simulator(name)
    return pytest.param(name, id=name,
                        marks=pytest.mark.skipif(reason is not None, reason=reason or ""))


SIMULATORS = [simulator_param("verilator"), simulator_param("icarus")]

#: (in_width, bits, signed): int8 from 12-bit inputs, uint4 from 6-bit inputs (the input
#: extremes are hit often), int16 from 20-bit inputs.
TARGETS = [(12, 8, True), (6, 4, False), (20, 16, True)]


@pytest.mark.parametrize("simulator", SIMULATORS)
@pytest.mark.parametrize(("in_width", "bits", "signed"), TARGETS,
                         ids=[f"s{w}-{'int' if s else 'uint'}{b}" for w, b, s in TARGETS])
def test_saturate_sim(simulator, in_width, bits, signed):
    dut = Saturate(in_width, bits=bits, signed=signed)
    res = run_saturate(dut, simulator)
    assert res.ok and res.passed == res.tests == 3
    stream, thru = res.records["test_random_stream"], res.records["test_throughput"]
    assert stream["beats"] >= 1000 and stream["clamped_low"] > 0 and stream["passed_through"] > 0
    assert thru["beats_per_cycle"] >= 0.99
    assert thru["latency"] == dut.latency
    assert "stream 'o' stalled" in res.records["test_watchdog_names_stalled_stream"]["message"]


@pytest.mark.parametrize("simulator", SIMULATORS)
def test_smoke(simulator):
    summary = run_smoke(simulator, beats=300)
    assert summary["passed"] and summary["simulator"] == simulator
    assert summary["beats_checked"] >= 600
    assert summary["beats_per_cycle"] >= 0.99
    assert summary["latency"] == summary["stated_latency"] == 1


def test_runner_reuses_build_and_reports_failures():
    """A repeat run skips the build; the C++ was compiled with MAKE_VARIABLES' -O0; a failing
    cocotb test raises SimulationFailed."""
    if missing_simulator("verilator"):
        pytest.skip(missing_simulator("verilator"))
    dut = Saturate(12, bits=8, signed=True)
    run_saturate(dut, "verilator", beats=50, throughput_beats=50)
    again = run_saturate(dut, "verilator", beats=50, throughput_beats=50)
    assert not again.built
    log = (again.build_dir / "build.log").read_text()
    compiles = [line for line in log.splitlines() if " -c -o " in line]
    assert compiles and all("-O0" in line and "-Os" not in line for line in compiles)
    # Claim a latency of 2: the throughput test must fail and name itself.
    with pytest.raises(SimulationFailed, match=r"failed on verilator(.|\n)*test_throughput"):
        run_saturate(dut, "verilator", beats=50, throughput_beats=50, latency=2)
