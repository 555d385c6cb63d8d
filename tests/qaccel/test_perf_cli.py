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


def test_perf_prints_the_whole_call(capsys):
    from qaccel.model.config import AccelConfig
    from qaccel.model.perf import nbits_call

    assert cli.main(["perf", "--bits", "8", "--block-size", "64", "--K", "1000", "--N", "13",
                     "--M", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "(3 x 1000 by 1000 x 13: fill, passes, drain)" in lines[0]
    call = nbits_call(AccelConfig(), M=3, N=13, K=1000, bits=8, block_size=64)
    row = lines[2].split()
    assert row[7:9] == [str(call.cycles), f"{call.macs_per_cycle:.2f}"]
    assert call.passes == 3 * 4 and call.cycles > call.passes * call.per_pass.cycles


def test_perf_float_path_with_bias(capsys):
    assert cli.main(["perf", "--bits", "4", "--block-size", "32", "--level", "0",
                     "--bias"]) == 0
    row = capsys.readouterr().out.splitlines()[2].split()
    assert row[2:4] == ["float", "128.0"]


@pytest.mark.parametrize(("argv", "match"), [
    (["--bits", "9"], "bits must be one of"),
    (["--block-size", "24"], "block_size must be a power of two"),
    (["--K", "0"], "K must be in"),
    (["--N", "0"], "N must be in"),
    (["--M", "-1"], "M must be in"),
])
def test_perf_bad_input_is_named(argv, match):
    with pytest.raises(SystemExit, match=match):
        cli.main(["perf", *argv])


def test_perf_bad_list_is_named(capsys):
    with pytest.raises(SystemExit):
        cli.main(["perf", "--bits", "x"])
    assert "expected integers like 2..8" in capsys.readouterr().err
