"""qaccel.explore.plots and ``qaccel report``: the figures draw the sweep's rows of the v2 engine
(not something else) with the sweep's memory at the target's clock, every point lies under its
engine's roofline, and the PNG files are written. (tests/test_readme.py checks that the
README's sweep example reads well.)"""

from __future__ import annotations

import json

import pytest

from qaccel.app import cli
from qaccel.eda.synth import SynthResult
from qaccel.explore import plots, sweep
from qaccel.explore.perf import V2_BOUNDS

#: K 1000 is not a multiple of 64: padding to whole blocks shows in the figures. The base is
#: the 25F preset (m_tile 4, a budget of 12 DSP pairs).
GRID = {"pe": [8, 16], "simd": [1, 2], "bits": list(range(2, 9)), "block_sizes": [16, 64],
        "layer": (1000, 256), "progress": False}
PNG = b"\x89PNG\r\n\x1a\n"
TITLES = ["pe 8 x simd 1, m_tile 4,\nall 4 MAC pairs on DSPs",
          "pe 8 x simd 2, m_tile 4,\nall 8 MAC pairs on DSPs",
          "pe 16 x simd 1, m_tile 4,\nall 8 MAC pairs on DSPs",
          "pe 16 x simd 2, m_tile 4,\n12 of 16 MAC pairs on DSPs"]


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    return sweep.run_sweep(tmp_path_factory.mktemp("sweep"), **GRID).rows


def _panel(fig, title):
    (ax,) = [ax for ax in fig.axes if ax.get_title().startswith(title)]
    return ax


def _line(ax, gid):
    (line,) = [line for line in ax.get_lines() if line.get_gid() == gid]
    return line


def test_throughput_figure_draws_the_rows(rows):
    fig = plots.throughput_figure(rows)
    assert [ax.get_title() for ax in fig.axes if ax.get_title()] == TITLES
    for row_pe, row_simd in ((8, 1), (16, 2)):
        ax = _panel(fig, next(t for t in TITLES if t.startswith(f"pe {row_pe} x simd "
                                                                  f"{row_simd},")))
        for bs in (16, 64):
            want = [r for r in rows if (r["pe"], r["simd"], r["block_size"]) ==
                    (row_pe, row_simd, bs)]
            line = _line(ax, f"block {bs}")
            # GMAC/s at the ECP5's 100 MHz, or the memory's rate when it is slower
            assert list(line.get_ydata()) == [plots.delivered(r, 100.0)[0] for r in want]
            assert [round(x) for x in line.get_xdata()] == list(range(2, 9))
            assert ax.get_ylabel() == "GMAC/s at 100 MHz"
    # the peak of each width (pe * simd, half at 5..8 bits), and the bounds drawn as markers
    peak = _line(_panel(fig, TITLES[-1]), "peak")
    assert list(peak.get_xdata()) == list(range(2, 9))
    assert list(peak.get_ydata()) == pytest.approx([3.2] * 3 + [1.6] * 4)
    assert {r["bound"] for r in rows} == {"compute", "accumulator"}
    assert set(plots.BOUND_MARKERS) == {*V2_BOUNDS, "memory"}
    # 1.6 GB/s feed pe 16 x simd 2 (3.2 GMAC/s) too slowly: int4 in blocks of 16 takes at
    # least 0.5 + 5 / 16 bytes a MAC (weights, scales and zero points; a and y besides)
    r = next(r for r in rows if (r["pe"], r["simd"], r["bits"], r["block_size"]) ==
             (16, 2, 4, 16))
    assert r["bytes"] > 1000 * 256 * (0.5 + 5 / 16)
    assert plots.delivered(r, 100.0) == (pytest.approx(1.6 * 1000 * 256 / r["bytes"]),
                                         "memory")
    assert plots.delivered(r, 1.0) == (pytest.approx(r["per_cycle"] / 1e3), r["bound"])


def test_every_point_lies_under_its_roofline(rows):
    fig = plots.roofline_figure(rows)
    for r in rows:
        # the engine's own: its weight stream's bytes per cycle never hold the MACs back
        roof = min(r["peak_per_cycle"], r["bus_bytes_per_cycle"] * r["macs_per_bus_byte"])
        assert r["per_cycle"] <= roof * (1 + 1e-12)
        # MACs per byte of w: a nibble per MAC, two 2-bit codes, two nibbles per 5..8-bit
        # code; K padded to whole blocks
        k_pad = -(-r["K"] // r["block_size"]) * r["block_size"]
        per_nibble = {2: 2, 3: 1, 4: 1}.get(r["bits"], 0.5)
        assert r["macs_per_bus_byte"] == pytest.approx(2 * per_nibble * r["K"] / k_pad,
                                                       rel=1e-12)
        assert r["bus_bytes_per_cycle"] == r["pe"] * r["simd"] / 2
        assert r["peak_per_cycle"] == r["pe"] * r["simd"] // (2 if r["bits"] > 4 else 1)
        if r["bound"] == "compute":          # the call's fill and drain only: near the roof
            assert r["per_cycle"] > 0.8 * roof
        # the figure's: 1.6 GB/s of memory and the peak at 100 MHz
        gmacs, _ = plots.delivered(r, 100.0)
        assert gmacs <= min(1.6 * plots.intensity(r), r["peak_per_cycle"] / 10) * (1 + 1e-12)
    ax = _panel(fig, TITLES[2])              # pe 16 x simd 1: 1.6 GMAC/s over 1.6 GB/s
    x, y = _line(ax, "roof 16").get_data()
    assert (x[1], y[1], y[2]) == pytest.approx((1.0, 1.6, 1.6))      # the ridge
    assert y[0] == pytest.approx(1.6 * x[0])                          # the memory roof
    assert list(_line(ax, "roof 8").get_ydata())[1:] == pytest.approx([0.8, 0.8])  # 5..8 bits
    r = next(r for r in rows if (r["pe"], r["simd"], r["bits"], r["block_size"]) ==
             (16, 1, 4, 16))
    assert r["macs_per_bus_byte"] == pytest.approx(2 * 1000 / 1008)
    (points,) = [c for c in ax.collections if c.get_gid() == "block 16"]
    assert [plots.intensity(r), plots.delivered(r, 100.0)[0]] in points.get_offsets().tolist()
    assert [t.get_text() for t in ax.texts] == ["ridge 1 MAC/B"]
    assert ax.get_xscale() == ax.get_yscale() == "log"


def test_area_figure_draws_the_synthesised_rows(tmp_path, monkeypatch):
    def fake(component, *, target, name, seed, freq_mhz, router, floorplan=()):
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
                  key=lambda r: (r["lut"], r["per_second"]))
    assert list(line.get_xdata()) == [r["lut"] for r in want] == [40000, 80000, 80000, 160000]
    assert list(line.get_ydata()) == [r["per_second"] / 1e9 for r in want]
    assert list(_line(ax_dsp, "ecp5-25k int8").get_xdata()) == [18, 26, 26, 42]
    assert sorted(t.get_text() for t in ax_lut.texts) == [         # each engine once
        "pe 16 x 1, tile 4\nall 8 DSP pairs, 44 MHz", "pe 16 x 2, tile 4\n12/16 DSP pairs, 28 MHz",
        "pe 8 x 1, tile 4\nall 4 DSP pairs, 52 MHz", "pe 8 x 2, tile 4\nall 8 DSP pairs, 44 MHz"]
    assert fig.get_suptitle().endswith("MatMulNBits v2, block 64, M 1")
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
    for field in ("peak_per_cycle", "m_tile"):        # v1 rows lack m_tile
        old = [{k: v for k, v in r.items() if k != field} for r in rows]
        with pytest.raises(ValueError, match="an older qaccel sweep made them"):
            plots.roofline_figure(old)
    with pytest.raises(ValueError, match="no matmul_nbits rows"):
        plots.throughput_figure([])
    with pytest.raises(ValueError, match="no synthesised rows"):
        plots.area_figure(rows)
