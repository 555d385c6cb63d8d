# amaranth: UnusedElaboratable=no
"""Runner plumbing that needs no simulator run: discovery, errors, config channel."""

from __future__ import annotations

import json

import pytest

from qaccel.rtl.arith.saturate import Saturate
from qaccel.sim import runner, tbconfig
from qaccel.sim.scoreboard import InOrderChecker, Scoreboard


def test_missing_icarus_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    reason = runner.missing_simulator("icarus")
    assert reason is not None and "Icarus Verilog" in reason and "iverilog" in reason
    with pytest.raises(runner.SimulatorNotFoundError, match=r"Icarus Verilog is not installed"):
        runner.run_cocotb(Saturate(8, bits=4), name="saturate", test_module="tb_saturate",
                          simulator="icarus")


def test_missing_verilator_is_named(monkeypatch):
    monkeypatch.setattr(runner, "verilator_bin_dir", lambda: None)
    with pytest.raises(runner.SimulatorNotFoundError, match=r"Verilator is not available"):
        runner.require_simulator("verilator")


def test_unknown_simulator():
    with pytest.raises(ValueError, match=r"simulator must be one of verilator, icarus, not 'xsim'"):
        runner.missing_simulator("xsim")


def test_build_root(monkeypatch, tmp_path):
    monkeypatch.setenv(runner.BUILD_DIR_ENV, str(tmp_path))
    assert runner.build_root() == tmp_path.resolve()
    monkeypatch.delenv(runner.BUILD_DIR_ENV)
    assert runner.build_root().name == "sim_build"


def test_tbconfig_roundtrip(monkeypatch, tmp_path):
    records = tmp_path / "records.json"
    monkeypatch.setenv(tbconfig.ENV_VAR, tbconfig.encode({"bits": 4}, records))
    assert tbconfig.params() == {"bits": 4}
    tbconfig.record("t1", beats=3)
    tbconfig.record("t1", cycles=5)
    tbconfig.record("t2", ok=True)
    assert json.loads(records.read_text()) == {"t1": {"beats": 3, "cycles": 5}, "t2": {"ok": True}}
    with pytest.raises(TypeError, match=r"config must be JSON-serialisable"):
        tbconfig.encode({"x": object()}, records)
    monkeypatch.delenv(tbconfig.ENV_VAR)
    with pytest.raises(RuntimeError, match=tbconfig.ENV_VAR):
        tbconfig.params()


def test_in_order_checker():
    board = Scoreboard(lambda x: min(max(x, -2), 1), name="o")
    for cycle, x in enumerate([-5, 0, 7]):
        board.add_input(x, cycle)
    board.add_output(-2, 1)
    with pytest.raises(AssertionError, match=r"o: beat 1 at cycle 2 is 1, expected 0 for input 0"):
        board.add_output(1, 2)
    checker = InOrderChecker("o")
    with pytest.raises(AssertionError, match=r"unexpected beat 3 .*duplicated or spurious"):
        checker.add_actual(3, 0)
    checker.add_expected(4, 0, tag=9)
    with pytest.raises(AssertionError, match=r"1 expected beats never arrived"):
        checker.check_done()
