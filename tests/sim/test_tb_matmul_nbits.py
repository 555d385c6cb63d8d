# amaranth: UnusedElaboratable=no
"""The MatMulNBits engine through cocotb (sim/tb_matmul_nbits.py, sim/nbits_sim.py): jobs back
to back, random idle cycles on every input stream and back-pressure on ``y``, every ``y``
beat compared bit-exactly with qaccel.model.nbits_hw on Verilator and on Icarus; a corrupted
expected value is caught and named; columns past N are not compared; a reset in the middle of
a job leaves the engine idle and the next job exact. The v2 engine through the same testbench:
tests/sim/test_tb_matmul_nbits_v2.py.
"""

from __future__ import annotations

import dataclasses
import re
import shutil

import numpy as np
import pytest

from qaccel.model.config import AccelConfig
from qaccel.rtl.matmul_nbits import MatMulNBits
from qaccel.sim.nbits_sim import job_dict, run_nbits_cocotb
from qaccel.sim.runner import SimulationFailed, missing_simulator
from tests.rtl.test_matmul_nbits import make_job

pytestmark = pytest.mark.sim

CONFIG = AccelConfig(pe=2, simd=4, weight_bus_width=32, float_path=False)

#: bits, block_size, K, N, zero points, bias, M: int8 path (accuracy_level 4), K not a
#: multiple of block_size, N not a multiple of pe.
CASES = [
    (4, 32, 100, 5, "packed", True, 2),
    (3, 16, 50, 3, "none", False, 2),
    (8, 16, 40, 3, "packed", True, 2),
    (4, 64, 130, 3, "none", True, 2),
    (3, 32, 70, 5, "packed", False, 2),
    (8, 32, 45, 1, "none", True, 2),
]
#: Icarus runs ~1000x slower: two small jobs, K <= 64.
ICARUS_CASES = [
    (3, 16, 50, 3, "packed", True, 2),
    (8, 16, 40, 3, "none", False, 2),
]


def needs(simulator: str):
    reason = missing_simulator(simulator)
    return pytest.mark.skipif(reason is not None, reason=reason or "")


_ENGINES: dict[AccelConfig, MatMulNBits] = {}


def engine(config: AccelConfig = CONFIG) -> MatMulNBits:
    """One engine object per configuration, so its build is found once per session."""
    if config not in _ENGINES:
        _ENGINES[config] = MatMulNBits(config)
    return _ENGINES[config]


def report(run, jobs):
    print(f"\n{run.simulator}: {len(jobs)} jobs, {sum(len(b) for b in run.beats)} y beats "
          f"checked, cycles {run.cycles}; build {run.build_seconds:.1f} s "
          f"({'compiled' if run.built else 'cached'}), simulation {run.sim_seconds:.1f} s")


def check_run(run, jobs):
    assert run.checked
    assert [len(b) for b in run.beats] == [j.passes for j in jobs]
    for job, y in zip(jobs, run.y, strict=True):
        real = np.asarray(job_dict(job, CONFIG.pe)["y"], dtype=object) != None  # noqa: E711
        assert np.array_equal(y[real], job.y[real]), job.meta["label"]
    assert all(c > 0 for c in run.cycles)


@needs("verilator")
def test_verilator_jobs_under_pauses():
    jobs = [make_job(CONFIG, *c) for c in CASES]
    run = run_nbits_cocotb(engine(), jobs, simulator="verilator", idle=0.3, backpressure=0.3,
                           seed=7)
    check_run(run, jobs)
    report(run, jobs)


@needs("verilator")
def test_verilator_no_pauses_is_faster():
    """Without pauses the same jobs take fewer cycles (the cycle counts are measured)."""
    jobs = [make_job(CONFIG, *c) for c in CASES[:2]]
    fast = run_nbits_cocotb(engine(), jobs, simulator="verilator", seed=1)
    slow = run_nbits_cocotb(engine(), jobs, simulator="verilator", idle=0.5, backpressure=0.5,
                            seed=2)
    check_run(fast, jobs)
    assert all(f < s for f, s in zip(fast.cycles, slow.cycles, strict=True)), \
        (fast.cycles, slow.cycles)


@needs("verilator")
def test_scoreboard_catches_a_corrupted_expected_value():
    """One bit flipped in one expected column of the second job fails the run, naming the
    job's index and label; the same flip in a column past N (not compared) does not."""
    jobs = [make_job(CONFIG, *c) for c in CASES[:2]]
    job = jobs[1]                                     # N 3, pe 2: column 1 of group 1 is past N
    bad = job.y.copy()
    bad[job.M + 1, 0] ^= 1                            # group 1, row 1, column 2 (real)
    corrupted = dataclasses.replace(job, y=bad, meta=dict(job.meta))
    with pytest.raises(SimulationFailed) as info:
        run_nbits_cocotb(engine(), [jobs[0], corrupted], simulator="verilator", idle=0.3,
                         backpressure=0.3, seed=3)
    message = str(info.value)
    kept = re.search(r"run dir (\S+)\)", message)             # a failed run keeps its folder
    if kept and "capture" in kept[1]:
        shutil.rmtree(kept[1], ignore_errors=True)
    assert "job 1 of 2" in message and job.meta["label"] in message, message
    assert "pass 3" in message, message

    padding = job.y.copy()
    padding[job.M, 1] ^= 0x5A5A                       # group 1, row 0, column 3 (past N)
    run = run_nbits_cocotb(engine(), [dataclasses.replace(job, y=padding)],
                           simulator="verilator", idle=0.3, backpressure=0.3, seed=3)
    assert run.y[0][job.M, 1] != padding[job.M, 1]


#: Both paths (the engine of tests/rtl/test_matmul_nbits.py "p2s4"): float-path jobs.
FLOAT_CONFIG = AccelConfig(pe=2, simd=4, weight_bus_width=32, float_path=True)
FLOAT_CASES = [  # bits, block_size, K, N, zero points, bias, M, level
    (4, 32, 100, 5, "packed", True, 2, 0),
    (3, 16, 50, 3, "float", False, 2, 4),
    (8, 16, 40, 3, "none", True, 2, 2),
]


@pytest.mark.slow
@pytest.mark.parametrize("simulator", ["verilator", "icarus"])
def test_float_path_jobs_under_pauses(simulator):
    """The float path through the cocotb testbench (with int8 jobs between), both
    simulators; slow: these builds carry the float path (minutes to compile)."""
    if missing_simulator(simulator):
        pytest.skip(missing_simulator(simulator))
    cases = FLOAT_CASES if simulator == "verilator" else FLOAT_CASES[1:]
    jobs = [make_job(FLOAT_CONFIG, *c) for c in cases]
    jobs.insert(1, make_job(FLOAT_CONFIG, *CASES[1]))
    run = run_nbits_cocotb(engine(FLOAT_CONFIG), jobs, simulator=simulator, idle=0.3,
                           backpressure=0.3, seed=5)
    check_run(run, jobs)
    report(run, jobs)


@needs("icarus")
def test_icarus_jobs_under_pauses():
    jobs = [make_job(CONFIG, *c) for c in ICARUS_CASES]
    run = run_nbits_cocotb(engine(), jobs, simulator="icarus", idle=0.3, backpressure=0.3,
                           seed=7)
    check_run(run, jobs)
    report(run, jobs)


def test_icarus_live_drivers_fix():
    """The Icarus fix nbits_build asks for: a bare one-statement ``always @*`` also gets an
    ``initial`` copy (its source may never change after time 0); the default is unchanged."""
    from qaccel.sim.runner import icarus_time0_fix

    live = "  always @*\n    res[0] = i[31];\n  always @*\n    \\o$3  = 4'h9;\n"
    assert icarus_time0_fix(live) == "  always @*\n    res[0] = i[31];\n  initial \\o$3 = 4'h9;\n"
    assert icarus_time0_fix(live, live_drivers=True) == (
        "  always @*\n    res[0] = i[31];\n  initial res[0] = i[31];\n"
        "  initial \\o$3 = 4'h9;\n")
    block = "  always @* begin\n    x = y;\n  end\n"
    assert icarus_time0_fix(block, live_drivers=True) == block


@needs("verilator")
def test_verilator_reset_mid_job():
    """The testbench's generic reset on v1: ``rst`` after some ``y`` beats of a job (others
    and input beats still in flight) leaves ``busy`` and ``y.valid`` low, and the next job
    (same shape, other data) is bit-exact."""
    case = CASES[0]
    jobs = [make_job(CONFIG, *case, seed=s) for s in range(2)]
    run = run_nbits_cocotb(engine(), jobs, simulator="verilator", idle=0.3, backpressure=0.3,
                           seed=5, reset_after={0: 400})
    aborted = run.aborted[0]
    assert aborted is not None and 0 < aborted["y"] < jobs[0].passes, aborted
    assert 0 < aborted["taken"]["w"] < len(jobs[0].inputs["w"]), aborted
    assert run.cycles[0] is None and run.aborted[1] is None and run.cycles[1] > 0
    assert [len(b) for b in run.beats] == [aborted["y"], jobs[1].passes]
    for job, y in zip(jobs, run.y, strict=True):                # the prefix before the reset
        real = (np.asarray(job_dict(job, CONFIG.pe)["y"], dtype=object)
                != None)[: len(y)]  # noqa: E711
        assert np.array_equal(y[real], job.y[: len(y)][real]), job.meta["label"]
    report(run, jobs)
