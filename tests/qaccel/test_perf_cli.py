"""``qaccel perf``: the MatMulNBits performance model's table, and its errors."""

from __future__ import annotations

import pytest

from qaccel import cli


def test_perf_prints_one_row_per_setting(capsys):
    assert cli.main(["perf", "--bits", "2..4,8", "--block-size", "16,256"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines[2:]]
    assert [(r[0], r[1]) for r in rows] == [(b, s) for b in ("2", "3", "4", "8")
                                            for s in ("16", "256")]
    # default engine: 32 bits of bus per column -> compute bound to 4 bits, 8 bits at 50%
    assert rows[0][3:6] == ["128.0", "32.00", "100.0%"] and rows[0][-1] == "compute"
    assert rows[-1][3:6] == ["256.0", "16.00", "50.0%"] and rows[-1][-2:] == ["weight", "bus"]


def test_perf_float_path_with_bias(capsys):
    assert cli.main(["perf", "--bits", "4", "--block-size", "32", "--level", "0",
                     "--bias"]) == 0
    row = capsys.readouterr().out.splitlines()[2].split()
    assert row[2:4] == ["float", "128.0"]


@pytest.mark.parametrize(("argv", "match"), [
    (["--bits", "9"], "bits must be one of"),
    (["--block-size", "24"], "block_size must be a power of two"),
    (["--K", "0"], "K must be in"),
])
def test_perf_bad_input_is_named(argv, match):
    with pytest.raises(SystemExit, match=match):
        cli.main(["perf", *argv])


def test_perf_bad_list_is_named(capsys):
    with pytest.raises(SystemExit):
        cli.main(["perf", "--bits", "x"])
    assert "expected integers like 2..8" in capsys.readouterr().err
