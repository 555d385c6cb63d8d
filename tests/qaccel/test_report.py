"""qaccel.plots and ``qaccel report``: the figures draw the sweep's rows (not something
else), every point lies under its engine's roofline, and the PNG files are written."""

from __future__ import annotations

import json

import pytest

from qaccel import cli, plots, sweep
from qaccel.synth import SynthResult

#: K 1000 is not a multiple of 64: padding to whole blocks shows in the figures.
GRID = {"pe": [1, 2], "simd": [4, 8], "bits": list(range(2, 9)), "block_sizes": [16, 64],
        "layer": (1000, 256), "progress": False}
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    from qaccel.model.config import AccelConfig

    base = AccelConfig(pe=1, simd=4, weight_bus_width=32, float_path=True, m_tile=1,
                       dsp_pairs=None)                  # v1 engines, both paths
    return sweep.run_sweep(tmp_path_factory.mktemp("sweep"), base=base, **GRID).rows


def _panel(fig, title):
    (ax,) = [ax for ax in fig.axes if ax.get_title() == title]
    return ax


def _line(ax, gid):
    (line,) = [line for line in ax.get_lines() if line.get_gid() == gid]
    return line


def test_throughput_figure_draws_the_rows(rows):
    fig = plots.throughput_figure(rows)
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == ["pe 1 x simd 4, bus 32", "pe 1 x simd 8, bus 32", "pe 2 x simd 4, bus 32",
                      "pe 2 x simd 8, bus 32"]
    for row_pe, row_simd in ((1, 4), (2, 8)):
        ax = _panel(fig, f"pe {row_pe} x simd {row_simd}, bus 32")
        for bs in (16, 64):
            want = [r for r in rows if (r["pe"], r["simd"], r["block_size"]) ==
                    (row_pe, row_simd, bs)]
            line = _line(ax, f"block {bs}")
            assert list(line.get_ydata()) == [r["per_cycle"] for r in want]
            assert [round(x) for x in line.get_xdata()] == list(range(2, 9))
    # the peak of each panel, and the bounds drawn as markers
    assert _panel(fig, "pe 2 x simd 8, bus 32").get_lines()[-1].get_ydata()[0] == 16
    assert {r["bound"] for r in rows} == {"compute", "weight bus"}


def test_every_point_lies_under_its_roofline(rows):
    fig = plots.roofline_figure(rows)
    for r in rows:
        roof = min(r["peak_per_cycle"], r["bus_bytes_per_cycle"] * r["macs_per_bus_byte"])
        assert r["per_cycle"] <= roof * (1 + 1e-12)
        k_pad = -(-r["K"] // r["block_size"]) * r["block_size"]
        if r["bound"] == "weight bus":           # on the slanted roof
            assert r["per_cycle"] == pytest.approx(roof, rel=1e-12)
        else:                                    # the flat roof, less K's padding
            assert r["per_cycle"] == pytest.approx(r["peak_per_cycle"] * r["K"] / k_pad,
                                                   rel=1e-12)
    ax = _panel(fig, "pe 1 x simd 8, bus 32")
    x, y = _line(ax, "roof").get_data()
    assert (x[1], y[1], y[2]) == (2.0, 8, 8)                 # ridge: 8 MAC over 4 bytes
    r = next(r for r in rows if (r["pe"], r["simd"], r["bits"], r["block_size"]) ==
             (1, 8, 4, 16))
    assert r["macs_per_bus_byte"] == pytest.approx(8 / 4 * 1000 / 1008)
    points = _line(ax, "block 16")
    assert r["per_cycle"] in list(points.get_ydata())


def test_area_figure_draws_the_synthesised_rows(tmp_path, monkeypatch):
    def fake(component, *, target, name, seed, freq_mhz):
        size = component.config.pe * component.config.simd
        return SynthResult(name=name, target=target, part="p", lut=5000 * size, ff=100,
                           dsp=10 + size, bram=2, fmax_mhz=60.0 - size, freq_mhz=100.0,
                           seed=seed, wrapper_ff=60, tools={}, yosys_time=1.0,
                           nextpnr_time=1.0, wall_time=2.0, critical_path="x")

    monkeypatch.setattr(sweep, "synthesize", fake)
    synth_rows = sweep.run_sweep(tmp_path, synth=True, **{**GRID, "bits": [4, 8]}).rows
    fig = plots.area_figure(synth_rows, block_size=64)
    ax_lut, ax_dsp = fig.axes[:2]
    line = _line(ax_lut, "ecp5-25k int4")
    want = sorted((r for r in synth_rows if r["bits"] == 4 and r["block_size"] == 64),
                  key=lambda r: r["lut"])
    assert list(line.get_xdata()) == [r["lut"] for r in want] == [20000, 40000, 40000, 80000]
    assert list(line.get_ydata()) == [r["per_second"] / 1e9 for r in want]
    assert list(_line(ax_dsp, "ecp5-25k int8").get_xdata()) == [14, 18, 18, 26]
    assert sorted(t.get_text() for t in ax_lut.texts) == [     # each engine labelled once
        "pe 1 x simd 4\n56 MHz", "pe 1 x simd 8\n52 MHz", "pe 2 x simd 4\n52 MHz",
        "pe 2 x simd 8\n44 MHz"]
    with pytest.raises(ValueError, match="block_size must be one of the sweep's"):
        plots.area_figure(synth_rows, block_size=32)
    written = plots.write_report(synth_rows, tmp_path / "png")
    assert sorted(written) == ["roofline", "throughput_vs_area", "throughput_vs_bits"]
    assert all((tmp_path / "png" / f"{name}.png").read_bytes()[:8] == PNG for name in written)


def test_report_cli_writes_pngs(tmp_path, rows, capsys):
    (tmp_path / "results.json").write_text(json.dumps(rows))
    assert cli.main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == [str(tmp_path / "plots" / "throughput_vs_bits.png"),
                       str(tmp_path / "plots" / "roofline.png")]
    assert out[2].startswith("throughput_vs_area: not drawn, rows hold no synthesised rows")
    for name in ("throughput_vs_bits", "roofline"):
        png = (tmp_path / "plots" / f"{name}.png").read_bytes()
        assert png[:8] == PNG and len(png) > 20_000
    assert cli.main(["report", str(tmp_path), "-o", str(tmp_path / "elsewhere")]) == 0
    assert (tmp_path / "elsewhere" / "roofline.png").is_file()


def test_report_of_an_elementwise_model_sweep_draws_nothing(tmp_path, capsys):
    sweep.run_sweep(tmp_path, unit="quantize", lanes=[1, 2], progress=False)
    assert cli.main(["report", str(tmp_path)]) == 1
    assert "roofline: not drawn, rows hold no matmul_nbits rows" in capsys.readouterr().out


def test_bad_input(tmp_path, rows):
    with pytest.raises(SystemExit, match="holds no sweep results .no results.json"):
        cli.main(["report", str(tmp_path / "missing")])
    (tmp_path / "results.json").write_text("{not json")
    with pytest.raises(ValueError, match="is not a sweep's results"):
        plots.load_rows(tmp_path)
    (tmp_path / "results.json").write_text(json.dumps([{"a": 1}]))
    with pytest.raises(ValueError, match="not a list of rows with a status"):
        plots.load_rows(tmp_path)
    old = [{k: v for k, v in r.items() if k != "peak_per_cycle"} for r in rows]
    with pytest.raises(ValueError, match="an older qaccel sweep made them"):
        plots.roofline_figure(old)
    with pytest.raises(ValueError, match="no matmul_nbits rows"):
        plots.throughput_figure([])
    with pytest.raises(ValueError, match="no synthesised rows"):
        plots.area_figure(rows)
