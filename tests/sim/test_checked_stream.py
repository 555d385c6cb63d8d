"""Checking inside the C++ stream harness (StreamSim.run_checked), long stall / starvation
bursts, and sharded checked regressions (qaccel.sim.elementwise_sim.run_regression)."""

import numpy as np
import pytest

from qaccel.model.config import AccelConfig
from qaccel.rtl.elementwise.dequantize import Dequantize
from qaccel.rtl.elementwise.quantize import Quantize
from qaccel.sim.elementwise_sim import (
    check_jobs,
    elementwise_sim,
    run_elementwise_checked,
    run_elementwise_fast,
    run_regression,
)
from qaccel.sim.jobs import quantize_job, random_jobs

UNITS = {"quantize": Quantize, "dequantize": Dequantize}


def _unit(op):
    return UNITS[op](AccelConfig())


def _bursts(unit):
    """y stalls three times as long as the output FIFO plus the pipeline, input starvation
    bursts as long as the FIFO."""
    n = unit.fifo_depth + unit.latency
    return (0.01, 3 * n, 4 * n), (0.01, unit.fifo_depth, 2 * unit.fifo_depth)


@pytest.mark.parametrize("op", UNITS)
def test_checked_run_catches_one_wrong_expected_beat(op):
    unit = _unit(op)
    jobs = random_jobs(unit, np.random.default_rng(7), 6000, max_elements=1024)
    n = sum(len(j.y) for j in jobs)
    run = run_elementwise_checked(unit, jobs, idle=0.2, backpressure=0.2, seed=3)
    assert run.ok and run.mismatches == ()
    assert (run.segments, run.beats) == (len(jobs), n)
    assert run.cycles >= n
    # one expected beat wrong -> reported with its job, index, cycle and both payloads
    k, b = len(jobs) // 2, len(jobs[len(jobs) // 2].y) // 3
    good = int(jobs[k].y[b])
    jobs[k].y[b] ^= np.uint64(0b110)
    run = run_elementwise_checked(unit, jobs, idle=0.2, backpressure=0.2, seed=3)
    assert run.mismatch_count == 1 and run.beats == n
    (m,) = run.mismatches
    assert (m.segment, m.stream, m.beat, m.got, m.expected) == (k, "y", b, good, good ^ 0b110)
    assert 0 < m.cycle < run.cycles
    assert f"segment {k}, output 'y' beat {b}" in str(m)


def test_checked_run_masks_the_last_beat_and_stops_at_max_mismatches():
    unit = _unit("quantize")
    # 3 elements on 1 lane: every bit of the last beat is specified; flip its last flag
    jobs = [quantize_job(unit, np.linspace(-1, 1, 3 + k, dtype=np.float32), np.float32(0.01),
                         np.int8(k), words=True) for k in range(4)]
    for j in jobs:
        j.y[0] ^= np.uint64(1)        # the first beat of every job is wrong
    run = run_elementwise_checked(unit, jobs, max_mismatches=2)
    assert run.mismatch_count == 2 and run.segments == 2      # stopped in job 1
    assert [(m.segment, m.beat) for m in run.mismatches] == [(0, 0), (1, 0)]
    # bits of the last beat outside ymask are not compared, those inside are
    job = jobs[3]
    job.y[0] ^= np.uint64(1)
    job.y[-1] ^= np.uint64(1)
    assert run_elementwise_checked(unit, [job]).mismatch_count == 1
    job.ymask &= ~1
    assert run_elementwise_checked(unit, [job]).ok


@pytest.mark.parametrize("bad, error", [
    ({"stall_burst": (0.1, 0, 4)}, ValueError),
    ({"stall_burst": (0.1, 5, 4)}, ValueError),
    ({"starve_burst": (1.5, 1, 4)}, ValueError),
    ({"starve_burst": 0.1}, TypeError),
    ({"max_mismatches": 0}, ValueError),
])
def test_checked_run_arguments(bad, error):
    unit = _unit("quantize")
    job = quantize_job(unit, np.ones(4, np.float32), np.float32(0.5), words=True)
    with pytest.raises(error, match=next(iter(bad))):
        run_elementwise_checked(unit, [job], **bad)


@pytest.mark.parametrize("op", UNITS)
def test_long_bursts_fill_the_fifo_and_stay_exact(op):
    unit = _unit(op)
    stall, starve = _bursts(unit)
    # checked in the loop
    jobs = random_jobs(unit, np.random.default_rng(11), 8000, max_elements=2048)
    run = run_elementwise_checked(unit, jobs, idle=0.05, backpressure=0.1, seed=5,
                                  stall_burst=stall, starve_burst=starve)
    assert run.ok and run.beats == sum(len(j.y) for j in jobs)
    # x waited for ready through most of a y stall: the FIFO and the pipeline were full
    assert run.blocked["x"] >= stall[1] - unit.fifo_depth - unit.latency
    # recorded and compared in Python: every beat, in order
    jobs = random_jobs(unit, np.random.default_rng(12), 3000, max_elements=1024)
    for j in jobs:
        j.x, j.y = [int(v) for v in j.x], [int(v) for v in j.y]
    results = run_elementwise_fast(unit, jobs, idle=0.05, backpressure=0.1, seed=6,
                                   stall_burst=stall, starve_burst=starve)
    check_jobs(jobs, results)
    assert max(r.x_blocked for r in results) >= stall[1] - unit.fifo_depth - unit.latency
    assert elementwise_sim(unit).last_run.vectors == sum(len(j.y) for j in jobs)


def test_nbits_engine_long_bursts():
    from qaccel.model.nbits import quantize_weights_nbits
    from qaccel.rtl.nbits.matmul_nbits_v2 import MatMulNBitsV2
    from qaccel.sim.nbits_jobs import nbits_job_v2
    from qaccel.sim.nbits_sim import check_nbits_stream, run_nbits_stream

    config = AccelConfig(pe=8, simd=1, m_tile=2, max_k=512, max_block_size=256,
                         float_path=False)
    rng = np.random.default_rng(3)
    jobs = []
    for bits, block, K, N, M in [(4, 32, 128, 24, 4), (3, 16, 64, 17, 3), (8, 64, 96, 9, 2)]:
        W = rng.standard_normal((K, N)).astype(np.float32)
        B, S, Z = quantize_weights_nbits(W, bits=bits, block_size=block, symmetric=False)
        A = rng.standard_normal((M, K)).astype(np.float32)
        jobs.append(nbits_job_v2(A, B, S, Z, K=K, N=N, bits=bits, block_size=block,
                                 config=config))
    stall = (0.02, 60, 120)                 # the y FIFOs hold 8 to 24 words
    results = run_nbits_stream(MatMulNBitsV2(config), jobs, idle=0.05, backpressure=0.1,
                               stall_burst=stall, starve_burst=(0.02, 10, 40))
    for job, r in zip(jobs, results, strict=True):
        check_nbits_stream(job, r)
    # some input stream waited on ready for most of a y stall
    assert max(v for r in results for v in r.blocked.values()) >= stall[1] // 2


def test_sharded_regression_merges_shards():
    reg = run_regression(4000, shards=2, seed=1, chunk_beats=1500)
    assert reg.ok and reg.shards == 2 and reg.beats >= 4000
    assert reg.cycles > reg.beats and reg.jobs >= 2
    assert 0 < reg.steady_time <= reg.wall_time and reg.beats_per_second > 0


@pytest.mark.parametrize("argv, error", [
    (["--rounds", "0"], "--rounds"),
    (["--checked-beats", "-5"], "--checked-beats"),
    (["--shards", "0"], "--shards"),
])
def test_verify_arguments(argv, error):
    import argparse

    from qaccel.app.bench_rtl import add_verify_arguments, run_verify

    parser = argparse.ArgumentParser()
    add_verify_arguments(parser)
    with pytest.raises(SystemExit):                 # the argument type refuses it
        parser.parse_args(argv)
    args = parser.parse_args([])
    assert args.scheduler is None
    setattr(args, argv[0][2:].replace("-", "_"), int(argv[1]))
    with pytest.raises(ValueError, match=error):    # and so does run_verify, called directly
        run_verify(args)
