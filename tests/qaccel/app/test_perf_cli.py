"""``qaccel perf``: the v2 engine's table (cycles, MAC/cycle, bound, bytes, time and tokens/s
on chip and memory bound) on either path, and the errors; ``--config`` / ``--preset`` on
every command that takes a configuration."""

from __future__ import annotations

import pytest

from qaccel.app import cli
from qaccel.explore.perf import nbits_v2_call
from qaccel.model.config import AccelConfig
from qaccel.model.presets import preset

#: A v2 engine with the float path, for the float-path rows.
FLOAT = AccelConfig(pe=8, simd=1, m_tile=8, max_k=4096, float_path=True)


def _rows(out: str) -> list[list[str]]:
    """The table rows of ``qaccel perf``'s v2 output, split into fields."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("bits")) + 1
    end = next(i for i, line in enumerate(lines) if line.startswith("steady:"))
    return [line.split() for line in lines[start:end]]


def _expected(call, fmax, gbps) -> list[str]:
    """The first 11 fields of a row, from the model."""
    t, tm = call.seconds(fmax), call.seconds(fmax, gbps)
    return [str(call.bits), str(call.block_size), str(call.cycles),
            f"{call.macs_per_cycle:.2f}", f"{call.steady_utilisation:.1%}",
            f"{call.macs_per_cycle * fmax * 1e-3:.3f}", str(sum(call.bytes.values())),
            f"{t * 1e6:.1f}", f"{call.M / t:.1f}", f"{tm * 1e6:.1f}", f"{call.M / tm:.1f}"]


def _config_file(tmp_path, config):
    path = tmp_path / "cfg.json"
    path.write_text(config.to_json())
    return str(path)


# ---------------------------------------------------------------------------------------------
# the v2 table


def test_perf_v2_rows_are_the_model(capsys):
    """One row per setting; M = 1: tokens/s = 1 / seconds, on chip and memory bound."""
    config = preset("ecp5-25k")
    assert cli.main(["perf", "--preset", "ecp5-25k", "--bits", "2..4,8",
                     "--block-size", "16,256"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith(
        "MatMulNBits on the v2 engine, accuracy_level 4 (int8 path), packed zero points: a call "
        "of 1 x 1024 by 1024 x 1024 (M x K by K x N) at 100 MHz with 1.6 GB/s of memory "
        "(16-bit DDR3-800 as on common ECP5 boards)")
    rows = _rows(out)
    assert [(r[0], r[1]) for r in rows] == [(b, s) for b in ("2", "3", "4", "8")
                                            for s in ("16", "256")]
    for row in rows:
        call = nbits_v2_call(config, M=1, N=1024, K=1024, bits=int(row[0]),
                             block_size=int(row[1]))
        assert row[:11] == _expected(call, 100.0, 1.6)
        assert row[11] == call.bound + ("," if call.seconds(100, 1.6) > call.seconds(100)
                                        else "")
        assert float(row[8]) == pytest.approx(1 / call.seconds(100), rel=1e-4)
    # 2..4 bits at the full 32 MACs a step, 8 bits at half (two nibbles a column)
    assert rows[0][4] == rows[-1][4] == "100.0%"
    assert float(rows[-1][3]) < 16 < float(rows[0][3]) < 32


def test_perf_memory_bound_is_bytes_over_bandwidth(capsys):
    """The 85F engine at 100 MHz outruns 1.6 GB/s: the call takes bytes / bandwidth; with
    enough bandwidth the chip binds again."""
    call = nbits_v2_call(preset("ecp5-85k"), M=1, N=4096, K=4096, bits=4, block_size=32)
    memory = sum(call.bytes.values()) / 1.6e9
    assert memory > 2 * call.seconds(100)
    argv = ["perf", "--preset", "ecp5-85k", "--K", "4096", "--N", "4096", "--bits", "4",
            "--block-size", "32"]
    assert cli.main(argv) == 0
    (row,) = _rows(capsys.readouterr().out)
    assert row[9:] == [f"{memory * 1e6:.1f}", f"{1 / memory:.1f}", "compute,", "memory"]
    assert row[6] == str(sum(call.bytes.values())) == "11042816"
    assert cli.main([*argv, "--memory-gbps", "100", "--fmax", "50"]) == 0
    out = capsys.readouterr().out
    (row,) = _rows(out)
    assert row[:11] == _expected(call, 50.0, 100.0)
    assert row[7] == row[9] and row[8] == row[10] and row[11:] == ["compute"]
    assert "at 50 MHz with 100 GB/s of memory" in out.splitlines()[0]


def test_perf_tokens_are_rows_of_the_call(capsys):
    """tokens/s = M / seconds; a call of 16 rows walks 4 row tiles."""
    config = preset("ecp5-85k")
    assert cli.main(["perf", "--preset", "ecp5-85k", "--M", "16", "--bits", "4",
                     "--block-size", "32"]) == 0
    out = capsys.readouterr().out
    assert "a call of 16 x 1024 by 1024 x 1024" in out
    assert "engine v2 pe 128 x simd 1, 4 clusters, m_tile 4" in out
    (row,) = _rows(out)
    call = nbits_v2_call(config, M=16, N=1024, K=1024, bits=4, block_size=32)
    assert call.tiles == 4 and row[:11] == _expected(call, 100.0, 1.6)
    assert float(row[8]) == pytest.approx(16 / (call.cycles / 100e6), rel=1e-4)


def test_memory_default_is_the_reports():
    from qaccel.eda import hwreport

    assert cli.MEMORY_GBPS == hwreport.MEMORY_GBPS == 1.6


def test_perf_config_file_equals_preset(tmp_path, capsys):
    argv = ["perf", "--bits", "4", "--block-size", "64", "--M", "3", "--bias"]
    assert cli.main([*argv, "--preset", "ecp5-85k"]) == 0
    by_preset = capsys.readouterr().out
    assert cli.main([*argv, "--config", _config_file(tmp_path, preset("ecp5-85k"))]) == 0
    assert capsys.readouterr().out == by_preset
    call = nbits_v2_call(preset("ecp5-85k"), M=3, N=1024, K=1024, bits=4, block_size=64,
                         bias=True)
    assert _rows(by_preset)[0][:11] == _expected(call, 100.0, 1.6) and call.bytes["b"] > 0


# ---------------------------------------------------------------------------------------------
# the float path: the v2 engine's, or a clear refusal


@pytest.mark.parametrize(("argv", "fzp"), [(["--level", "0"], False),
                                           (["--zero-points", "float"], True)])
def test_perf_float_path(tmp_path, capsys, argv, fzp):
    assert cli.main(["perf", "--bits", "4", "--block-size", "32", "--bias", *argv,
                     "--config", _config_file(tmp_path, FLOAT)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith(
        "MatMulNBits on the v2 engine, accuracy_level " + ("4" if fzp else "0")
        + " (float path: four int8 digit rows per row of A"
        + (", two terms per digit)" if fzp else ")"))
    call = nbits_v2_call(FLOAT, M=1, N=1024, K=1024, bits=4, block_size=32, bias=True,
                         float_path=True, float_zero_points=fzp)
    assert _rows(out)[0][:11] == _expected(call, 100.0, 1.6)


def test_float_zero_points_take_two_terms_per_digit():
    """Float zero points: twice the s beats, two lane terms per digit and column (the lanes'
    or their accumulators' bound where the int8 digits were compute bound)."""
    kw = dict(M=2, N=64, K=1024, bits=4, block_size=16, float_path=True)
    one, two = nbits_v2_call(FLOAT, **kw), nbits_v2_call(FLOAT, **kw, float_zero_points=True)
    assert two.bytes["s"] == 2 * one.bytes["s"] and two.bytes["w"] == one.bytes["w"]
    assert (one.bound, two.bound) == ("compute", "accumulator")
    assert two.cycles > one.cycles and two.block_cycles > one.block_cycles
    with pytest.raises(ValueError, match="float_zero_points calls take the float path"):
        nbits_v2_call(FLOAT, **{**kw, "float_path": False}, float_zero_points=True)


@pytest.mark.parametrize("argv", [["--level", "0"], ["--level", "3"],
                                  ["--zero-points", "float"]])
def test_perf_float_path_without_it_is_refused(argv):
    with pytest.raises(SystemExit, match="takes the float path, which this configuration "
                                         "leaves out"):
        cli.main(["perf", "--preset", "ecp5-25k", *argv])


# ---------------------------------------------------------------------------------------------
# errors


@pytest.mark.parametrize(("argv", "message"), [
    (["--bits", "9"], "argument --bits: weight bits are 2..8, not 9 (in '9')"),
    (["--bits", "1..4"], "argument --bits: weight bits are 2..8, not 1"),
    (["--bits", "x"], "argument --bits: expected integers like 2..8"),
    (["--block-size", "24"], "argument --block-size: block sizes are powers of two from 16, "
                             "not 24"),
    (["--block-size", "8,16"], "block sizes are powers of two from 16, not 8"),
    (["--K", "0"], "argument --K: expected an integer >= 1, not '0'"),
    (["--N", "two"], "argument --N: expected an integer >= 1, not 'two'"),
    (["--M", "-1"], "argument --M: expected an integer >= 1, not '-1'"),
    (["--fmax", "0"], "argument --fmax: expected a number > 0, not '0'"),
    (["--fmax", "inf"], "argument --fmax: expected a number > 0, not 'inf'"),
    (["--memory-gbps", "-1.6"], "argument --memory-gbps: expected a number > 0, not '-1.6'"),
    (["--memory-gbps", "nan"], "argument --memory-gbps: expected a number > 0, not 'nan'"),
    (["--preset", "ecp5-12k"], "argument --preset: preset must be one of ecp5-25k, ecp5-85k, "
                               "ecp5-85k-float, qdq-int8, qdq-int8-x8, qdq-mx, not 'ecp5-12k'"),
    (["--preset", "ecp5-25k", "--config", "c.json"],
     "argument --config: not allowed with argument --preset"),
])
def test_perf_bad_option_is_an_argparse_error(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["perf", *argv])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "match"), [
    (["--block-size", "512"], "qaccel perf: --block-size 512 is above the engine's "
                              "max_block_size 256"),
    (["--K", "8192"], r"qaccel perf: K must be in \[1, 4096\], not 8192"),
])
def test_perf_setting_beyond_the_engine_is_named(argv, match):
    with pytest.raises(SystemExit, match=match):
        cli.main(["perf", "--preset", "ecp5-25k", *argv])


def test_perf_bits_the_engine_lacks_is_named(tmp_path):
    path = _config_file(tmp_path, preset("ecp5-25k").replace(nbits=(4, 8)))
    with pytest.raises(SystemExit, match=r"qaccel perf: --bits 3 is not among the engine's "
                                         r"widths 4, 8 \(nbits\)"):
        cli.main(["perf", "--config", path, "--bits", "3,4"])


def test_perf_odd_pe_is_named(tmp_path):
    path = _config_file(tmp_path, FLOAT.replace(pe=3))
    with pytest.raises(SystemExit, match="qaccel perf: pe must be even for the v2 engine"):
        cli.main(["perf", "--config", path, "--bits", "4", "--block-size", "32"])


# ---------------------------------------------------------------------------------------------
# --config / --preset on every command


@pytest.mark.parametrize("command", [["sim", "quantize"], ["perf"], ["synth"],
                                     ["sweep", "-o", "out"], ["verilog", "-o", "out"]])
def test_config_and_preset_are_exclusive(command, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([*command, "--config", "c.json", "--preset", "ecp5-25k"])
    assert e.value.code == 2
    assert "argument --preset: not allowed with argument --config" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["sim", "quantize"], ["perf"], ["synth"],
                                     ["sweep", "-o", "out"], ["verilog", "-o", "out"]])
def test_unknown_preset_lists_the_presets(command, capsys):
    with pytest.raises(SystemExit):
        cli.main([*command, "--preset", "ice40"])
    assert ("argument --preset: preset must be one of ecp5-25k, ecp5-85k, ecp5-85k-float, "
            "qdq-int8, qdq-int8-x8, qdq-mx, not 'ice40'" in capsys.readouterr().err)


@pytest.mark.parametrize(("text", "why"), [
    (None, "No such file or directory"),
    ("{", "not JSON (Expecting property name enclosed in double quotes"),
    ('{"pe": 0}', "pe must be in"),
    ('{"lanes": 1, "colour": 2}', "unknown config field(s) colour"),
    ("[1]", "config must be a JSON object, not list"),
])
@pytest.mark.parametrize("command", [["sim", "quantize"], ["sim", "matmul-nbits"], ["perf"],
                                     ["synth"], ["synth", "--unit", "quantize"],
                                     ["sweep", "-o", "out"], ["verilog", "-o", "out"]])
def test_bad_config_file_is_one_line(command, text, why, tmp_path):
    path = tmp_path / "cfg.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(SystemExit) as e:
        cli.main([*command, "--config", str(path)])
    prefix = " ".join(command[:2]) if command[0] == "sim" else command[0]
    assert str(e.value).startswith(f"qaccel {prefix}: --config {path}: {why}")


@pytest.mark.parametrize("op", [["quantize"], ["matmul-nbits", "--K", "32", "--N", "4"]])
def test_sim_takes_the_preset(op, monkeypatch):
    import qaccel.engine

    def fake_rtl(config, *args, **kwargs):
        raise ValueError(f"built pe {config.pe} x simd {config.simd}")

    monkeypatch.setattr(qaccel.engine, "RTL", fake_rtl)
    with pytest.raises(SystemExit, match=f"qaccel sim {op[0]}: built pe 128 x simd 1"):
        cli.main(["sim", *op, "--preset", "ecp5-85k"])


def test_verilog_takes_the_preset(monkeypatch, tmp_path, capsys):
    import qaccel.eda.emit

    seen = []

    def fake_write(config, output, ops, progress=None):
        seen.append((config, output, ops))
        return [f"{output}/qaccel_{op}.v" for op in ops]

    monkeypatch.setattr(qaccel.eda.emit, "write_verilog", fake_write)
    assert cli.main(["verilog", "--preset", "ecp5-85k", "-o", str(tmp_path), "--ops",
                     "matmul_nbits"]) == 0
    assert seen == [(preset("ecp5-85k"), str(tmp_path), ["matmul_nbits"])]
    assert capsys.readouterr().out == f"{tmp_path}/qaccel_matmul_nbits.v\n"
