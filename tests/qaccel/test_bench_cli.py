"""The benchmark and the command line, on small sizes (timings are not asserted)."""

import re

import pytest

from qaccel import bench, cli
from qaccel.sim.runner import missing_simulator


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
    # level 4 on the default (v2) engine, its cycles the performance model's; level 0 refused
    assert out.count("RTL: bit-exact with the engine's model "
                     "(qaccel.model.nbits_hw.matmul_nbits_v2)") == 1
    assert re.search(r"cycles: RTL [\d,]+, model \(nbits_v2_call\) [\d,]+: equal", out)
    assert "MAC utilisation" in out and "accuracy_level 0 (float path): refused" in out


@pytest.mark.sim
@pytest.mark.skipif(missing_simulator("verilator") is not None,
                    reason=missing_simulator("verilator") or "")
def test_verify_throughput_small_run():
    """One short run on Verilator's stream harness: beats, cycles and a bit-exact check."""
    from qaccel.bench_rtl import format_verify_table, verify_throughput

    rows = verify_throughput((("verilator", "stream", 2000),))
    (row,) = rows
    assert row.verdict == "bit-exact" and row.beats >= 2000
    assert row.cycles >= row.beats and row.beats_per_second > 0
    assert "beats/s" in format_verify_table(rows)
    with pytest.raises(ValueError, match="scale must be > 0, not 0"):
        verify_throughput(scale=0)
