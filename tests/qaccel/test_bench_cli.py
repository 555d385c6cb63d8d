"""The benchmark and the command line, on small sizes (timings are not asserted)."""

import re

import pytest

from qaccel import bench, cli


def test_bench_golden_quick_cases_agree_with_ort():
    rows = bench.run_cases(bench.golden_cases(quick=True), repeat=1)
    names = [r.name for r in rows]
    assert len(rows) == 14 and len(set(names)) == 14
    for row in rows:
        assert row.qaccel_ms > 0 and row.ort_ms > 0
        if row.name.startswith(("Quantize", "Dequantize")):
            assert row.agreement == "bit-exact", row
        else:
            err = float(re.search(r"([0-9.e+-]+)$", row.agreement).group(1))
            assert err < 1e-5, row
    table = bench.format_table(rows).splitlines()
    assert len(table) == 15 and "ratio" in table[0]


def test_cli_bench_prints_table(capsys):
    assert cli.main(["bench", "golden", "--quick", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "MatMulNBits int4 bs32 K=N=256 M=16 level 4 per call" in out
    assert "MatMulNBits int4 bs32 K=N=256 M=16 level 4 prepared" in out
    assert "QuantizeLinear f32->int8 blocked 32" in out


def test_cli_rejects_unknown_command(capsys):
    with pytest.raises(SystemExit):
        cli.main(["frobnicate"])
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.sim
def test_demo_quick_passes(capsys):
    """The README's main job, on a smaller layer: every check in it passes."""
    assert cli.main(["demo", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "bit-exact" in out and "demo: all checks passed" in out
