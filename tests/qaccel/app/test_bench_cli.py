"""The benchmark and the command line, on small sizes (timings are not asserted)."""

import re
import time

import numpy as np
import pytest

from qaccel.app import bench, cli
from qaccel.sim.runner import missing_simulator


def test_bench_golden_quick_cases_agree_with_ort():
    rows = bench.run_cases(bench.golden_cases(quick=True), repeat=3)
    names = [r.name for r in rows]
    assert len(rows) == 14 and len(set(names)) == 14
    for row in rows:
        assert row.qaccel_ms > 0 and row.ort_ms > 0 and len(row.ratios) == 3
        assert row.ratio == sorted(row.ratios)[1]          # the median per-round ratio
        assert row.target == (1.0 if row.name.startswith(("Quantize", "Dequantize")) else 1.5)
        if row.name.startswith(("Quantize", "Dequantize")):
            assert row.agreement == "bit-exact", row
        else:
            err = float(re.search(r"([0-9.e+-]+)$", row.agreement).group(1))
            assert err < 1e-5, row
    table = bench.format_table(rows).splitlines()
    assert len(table) == 16 and table[0].startswith("default threads") and "ratio" in table[1]


def test_bench_threads_and_repeat():
    """One thread each: qaccel's kernels on one Numba thread during the rounds, ORT's sessions
    built with one intra-op thread; the setting is restored afterwards."""
    import numba

    before = numba.get_num_threads()
    seen = []
    case = bench.BenchCase("probe", lambda: seen.append(numba.get_num_threads()) or np.zeros(1),
                           lambda: np.zeros(1), 1.0, lambda a, b: "ok")
    (row,) = bench.run_cases([case], repeat=2, threads=1, settle=False)
    assert set(seen) == {1} and row.threads == 1 and numba.get_num_threads() == before
    assert bench.format_table([row]).startswith("one thread each:")
    with pytest.raises(ValueError, match=r"repeat must be in \[1, inf\], not 0"):
        bench.run_cases([case], repeat=0)
    with pytest.raises(ValueError, match=r"threads must be in \[0, inf\], not -1"):
        bench.run_cases([case], threads=-1)


def test_time_call_is_the_median_of_single_calls():
    """time_call: one warm-up call, then per round an untimed and a timed call (settled) or
    just the timed one; the median of the timed ones."""
    calls = []
    durations = iter([0.0, 0.004, 0.001, 0.003])

    def fn():
        calls.append(1)
        if len(calls) > 1:
            time.sleep(next(durations))

    t = bench.time_call(fn, repeat=4, settle=False)
    assert len(calls) == 5 and 0.0015 < t < 0.0035 + 0.002
    calls.clear()
    durations = iter([0.0] * 6)
    assert bench.time_call(fn, repeat=3) < 0.002 and len(calls) == 7
    with pytest.raises(ValueError, match="repeat must be in"):
        bench.time_call(fn, repeat=0)


def test_cpu_info_names_a_tier():
    name, tier = bench.cpu_info()
    assert name and tier.split(",")[0] in ("AVX-512 VNNI", "AVX-512", "AVX2", "AVX2 + AVX-VNNI",
                                           "below AVX2", "unknown (no /proc/cpuinfo flags)")


def test_cli_bench_prints_table(capsys):
    assert cli.main(["bench", "golden", "--quick", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("CPU: ") and "ISA tier" in out.splitlines()[0]
    assert "qaccel's kernels compiled for " in out.splitlines()[0]
    assert "one thread each:" in out and "default threads" in out
    assert out.count("MatMulNBits int4 bs32 K=N=256 M=16 level 4 per call") == 2
    assert "MatMulNBits int4 bs32 K=N=256 M=16 level 4 prepared" in out
    assert "QuantizeLinear f32->int8 blocked 32" in out


def test_cli_bench_rejects_repeat_0(capsys):
    with pytest.raises(SystemExit):
        cli.main(["bench", "golden", "--repeat", "0"])
    assert "expected an integer >= 1, not '0'" in capsys.readouterr().err


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
    from qaccel.app.bench_rtl import format_verify_table, verify_throughput

    rows = verify_throughput((("verilator", "stream", 2000),))
    (row,) = rows
    assert row.verdict == "bit-exact" and row.beats >= 2000
    assert row.cycles >= row.beats and row.beats_per_second > 0
    assert "beats/s" in format_verify_table(rows)
    with pytest.raises(ValueError, match="scale must be > 0, not 0"):
        verify_throughput(scale=0)


def test_bench_threads_quick(capsys):
    """One thread against the default threads, qaccel alone: a row per case with both times
    and the median ratio."""
    rows = bench.thread_scaling(quick=True, repeat=1)
    assert len(rows) == 8 + 6 and all(one > 0 and default > 0 and ratio > 0
                                      for _, one, default, ratio in rows)
    assert "MatMulNBits int4 K=N=256 M=16 level 4 prepared" in bench.format_scaling(rows)
    with pytest.raises(ValueError, match=r"repeat must be in \[1, inf\], not 0"):
        bench.thread_scaling(quick=True, repeat=0)
    assert cli.main(["bench", "threads", "--quick", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("CPU: ") and "Q per-tensor 65536 elements" in out
