# amaranth: UnusedElaboratable=no
"""The MatMulNBits engine v2 through cocotb (sim/tb_matmul_nbits.py, sim/nbits_sim.py): jobs
back to back under random idle cycles and back-pressure, every ``y`` word bit-exact with
qaccel.model.nbits_hw.matmul_nbits_v2 where ``job.real``, ``last`` on each job's last beat
only, on Verilator and on Icarus; a reset in the middle of a job leaves the engine idle and
the next job exact; a hung engine fails on the watchdog; a corrupted expected word is caught
and named.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import shutil
import time

import numpy as np
import pytest
from amaranth.hdl import Value

from qaccel.model.config import AccelConfig
from qaccel.rtl.nbits import matmul_nbits_v2, nbits_cluster
from qaccel.rtl.nbits.matmul_nbits_v2 import REGISTERS, MatMulNBitsV2
from qaccel.sim.nbits_sim import NBITS_NAME, engine_ports, job_dict, run_nbits_cocotb
from qaccel.sim.runner import SimulationFailed, missing_simulator
from tests.rtl.nbits.test_matmul_nbits_v2 import FLOAT_SHAPES, make_job

pytestmark = pytest.mark.sim

#: pe 4 x simd 2, row tiles of 3: two scale lanes of 2 columns; 5..8-bit groups of 2 columns.
CONFIG = AccelConfig(pe=4, simd=2, m_tile=3, max_k=1024, max_block_size=256,
                     float_path=False)

#: bits, block_size, K, N, zero points, bias, M: bits 2, 4, 8, blocks 16 and 64, M 1 and
#: M > m_tile (partial row tiles), K not a multiple of the block, N not one of the group.
CASES = [
    (4, 16, 64, 8, "packed", True, 4),
    (2, 64, 130, 5, "none", False, 1),
    (8, 16, 40, 3, "packed", False, 5),
    (2, 16, 50, 6, "packed", True, 3),
    (8, 64, 100, 4, "none", True, 1),
    (4, 64, 64, 3, "none", False, 2),
]
#: Icarus runs ~1k cycles/s through cocotb: three small jobs (K <= 64, N <= 8).
ICARUS_CASES = [
    (4, 16, 48, 5, "packed", True, 4),
    (8, 64, 64, 3, "none", False, 1),
    (2, 16, 32, 8, "none", True, 1),
]
#: The reset test: the same small shape four times (other data each time), reset early in
#: the first job (while ``a`` is loading) and late in the third (with ``w``, ``s`` and ``y``
#: each part way through: 38 of 96 weight words, 12 of 32 ``y`` beats at seed 5).
RESET_CASE = (4, 16, 48, 5, "packed", True, 4)
#: The float path (block floating point) on the engine with it (pe 4 x simd 2, tiles of one
#: row of four digit rows): bits, block_size, K, N, zero points, bias, M, accuracy_level,
#: g_idx. Icarus takes the first three (float zero points the third).
FLOAT_CONFIG = FLOAT_SHAPES["p4s2t4f"]
FLOAT_CASES = [
    (4, 16, 48, 5, "packed", True, 2, 0, False),
    (4, 32, 70, 3, "none", False, 1, 4, True),
    (4, 16, 40, 5, "float", True, 1, 4, False),       # float zero points: two terms a digit
    (8, 32, 70, 3, "float", False, 2, 0, True),
    (8, 16, 40, 4, "packed", True, 2, 2, False),
    (2, 64, 100, 5, "none", True, 1, 0, True),
    (4, 16, 48, 5, "packed", False, 2, 4, False),     # an int8-path job on the same engine
]
EARLY, LATE = 40, 560


def needs(simulator: str):
    reason = missing_simulator(simulator)
    return pytest.mark.skipif(reason is not None, reason=reason or "")


_ENGINES: dict[AccelConfig, MatMulNBitsV2] = {}


def engine(config: AccelConfig = CONFIG) -> MatMulNBitsV2:
    """One engine object per configuration, so its build is found once per session."""
    if config not in _ENGINES:
        _ENGINES[config] = MatMulNBitsV2(config)
    return _ENGINES[config]


def report(run, jobs, seconds):
    print(f"\n{run.simulator}: {len(jobs)} v2 jobs, {sum(len(b) for b in run.beats)} y beats "
          f"checked, cycles {run.cycles}; build {run.build_seconds:.1f} s "
          f"({'compiled' if run.built else 'cached'}), simulation {run.sim_seconds:.1f} s, "
          f"wall {seconds:.1f} s")


def check_run(run, jobs):
    """The run's words against ``job.y`` once more, outside the testbench: every real word
    bit-exact, nothing lost or duplicated, ``last`` on each job's last beat only."""
    assert run.checked
    for job, y, beats, cycles, aborted in zip(jobs, run.y, run.beats, run.cycles, run.aborted,
                                              strict=True):
        label = job.meta["label"]
        n = len(job.y) if aborted is None else aborted["y"]
        assert len(beats) == len(y) == n, f"{label}: {len(beats)} y beats, expected {n}"
        real = job.real[:n]
        assert np.array_equal(y[real], job.y[:n][real]), label
        last = [(b >> 32) & 1 for b in beats]
        assert last == [0] * (n - 1) + [int(aborted is None)] * (n > 0), f"{label}: last flags"
        assert (cycles is None) == (aborted is not None)
        assert cycles is None or cycles > 0


def test_engine_ports_and_job_dicts():
    """What the testbench reads off the engine, the build name, the job dict, and jobs that
    do not fit refused before any build."""
    v2 = engine()
    assert dataclasses.astuple(engine_ports(v2)) == (REGISTERS, ("a", "w", "b", "s"))
    assert NBITS_NAME == "matmul_nbits_v2"

    job = make_job(CONFIG, 4, 16, 40, 5, "none", True, 2)      # 2 groups of 4: 3 pad per row
    d = job_dict(job, reset_after=50)
    assert d["beats"] == len(d["y"]) == len(job.y) == 16 and d["reset_after"] == 50
    assert set(d["regs"]) == set(REGISTERS) and set(d["inputs"]) == {"a", "w", "b", "s"}
    assert [w is None for w in d["y"]] == (~job.real).tolist() and (~job.real).sum() == 6
    assert d["tags"][5] == "beat 5 (row 1, column 1)"
    assert "b" not in job_dict(make_job(CONFIG, 4, 16, 40, 5, "none", False, 1))["inputs"]
    assert job_dict(job, check=False)["y"] is None

    with pytest.raises(ValueError, match="reset_after names jobs"):
        run_nbits_cocotb(v2, [job], reset_after={1: 30})
    other = dataclasses.replace(job, regs={**job.regs, "passes": 1})
    with pytest.raises(ValueError, match="does not fit the engine"):
        run_nbits_cocotb(v2, [other])
    with pytest.raises(ValueError, match="at least one NBitsJobV2"):
        run_nbits_cocotb(v2, [])


def run(jobs, simulator, config=CONFIG, **kw):
    t0 = time.perf_counter()
    r = run_nbits_cocotb(engine(config), jobs, simulator=simulator, idle=0.3, backpressure=0.3,
                         **kw)
    seconds = time.perf_counter() - t0
    check_run(r, jobs)
    report(r, jobs, seconds)
    return r


@needs("verilator")
def test_verilator_jobs_under_pauses():
    jobs = [make_job(CONFIG, *c) for c in CASES]
    run(jobs, "verilator", seed=7)


@needs("verilator")
def test_verilator_no_pauses_is_faster():
    """Without pauses the same jobs take fewer cycles (the cycle counts are measured)."""
    jobs = [make_job(CONFIG, *c) for c in CASES[:2]]
    fast = run_nbits_cocotb(engine(), jobs, simulator="verilator", seed=1)
    slow = run_nbits_cocotb(engine(), jobs, simulator="verilator", idle=0.5, backpressure=0.5,
                            seed=2)
    check_run(fast, jobs)
    check_run(slow, jobs)
    assert all(f < s for f, s in zip(fast.cycles, slow.cycles, strict=True)), \
        (fast.cycles, slow.cycles)


@needs("icarus")
def test_icarus_jobs_under_pauses():
    jobs = [make_job(CONFIG, *c) for c in ICARUS_CASES]
    run(jobs, "icarus", seed=7)


@pytest.mark.parametrize("simulator", ["verilator", "icarus"])
def test_float_path_jobs_under_pauses(simulator):
    """Float-path jobs (levels 0 and 2, g_idx, float zero points) and an int8-path job back
    to back on the engine with the float path, every word bit-exact with matmul_nbits_v2."""
    if missing_simulator(simulator):
        pytest.skip(missing_simulator(simulator))
    cases = FLOAT_CASES if simulator == "verilator" else FLOAT_CASES[:3]
    jobs = [make_job(FLOAT_CONFIG, *c[:7], level=c[7], gidx=c[8]) for c in cases]
    fzp = [c[4] == "float" for c in cases]
    assert [j.regs["fmode"] for j in jobs] == [int(c[7] < 4 or c[8] or z) | 2 * z
                                               for c, z in zip(cases, fzp, strict=True)]
    run(jobs, simulator, config=FLOAT_CONFIG, seed=9)


@pytest.mark.parametrize("simulator", ["verilator", "icarus"])
def test_reset_mid_job(simulator):
    """``rst`` while beats are in flight, early (``a`` part loaded) and late (``w`` and ``s``
    part taken, some ``y`` beats out, others computed and waiting): ``busy`` and ``y.valid``
    low right after it, no ``y`` beat for the settle cycles, the beats before it a correct
    prefix, and the fresh job after each reset bit-exact."""
    if missing_simulator(simulator):
        pytest.skip(missing_simulator(simulator))
    jobs = [make_job(CONFIG, *RESET_CASE, seed=s) for s in range(4)]
    for k, job in enumerate(jobs):
        job.meta["label"] += f" seed {k}"
    r = run(jobs, simulator, seed=5, reset_after={0: EARLY, 2: LATE})
    assert r.records["test_jobs"]["resets"] == 2
    early, late = r.aborted[0], r.aborted[2]
    a_beats = len(jobs[0].inputs["a"])
    assert early is not None and 0 < early["taken"]["a"] < a_beats and early["y"] == 0, early
    assert late is not None and 0 < late["y"] < len(jobs[2].y), late
    assert 0 < late["taken"]["w"] < len(jobs[2].inputs["w"]), late
    assert 0 < late["taken"]["s"] < len(jobs[2].inputs["s"]), late
    assert r.aborted[1] is None and r.aborted[3] is None
    print(f"resets: early {early}, late {late}")


#: Two clusters (pe 8 x simd 4 cut into two slices of 4 columns and one lane, the float path):
#: the split of w, s and b and the merge of y under pauses and a reset.
CLUSTER_CONFIG = FLOAT_SHAPES["p8s4t4fc2"]
CLUSTER_CASES = [
    (4, 16, 48, 13, "packed", True, 2, 4, False),     # int8 path, two groups (N 13 of 8)
    (2, 32, 70, 9, "none", False, 1, 0, True),        # float path, g_idx, 2-bit words
    (6, 16, 40, 5, "float", True, 1, 2, False),       # 5..8 bits, float zero points
    (4, 16, 48, 13, "packed", True, 2, 4, False),
]


@pytest.mark.parametrize("simulator", ["verilator", "icarus"])
def test_clusters_under_pauses_and_reset(simulator):
    """The engine in two clusters (config.clusters = 2): int8- and float-path jobs under
    random idle cycles and back-pressure, every word bit-exact and in order, with a reset in
    the middle of the third job (the beats before it a correct prefix, the next job exact)."""
    if missing_simulator(simulator):
        pytest.skip(missing_simulator(simulator))
    cases = CLUSTER_CASES if simulator == "verilator" else CLUSTER_CASES[1:]
    jobs = [make_job(CLUSTER_CONFIG, *c[:7], level=c[7], gidx=c[8], seed=k)
            for k, c in enumerate(cases)]
    late = len(cases) - 2
    r = run(jobs, simulator, config=CLUSTER_CONFIG, seed=4, reset_after={late: 300})
    assert r.records["test_jobs"]["resets"] == 1
    assert r.aborted[late] is not None and r.aborted[late]["y"] < len(jobs[late].y)
    assert all(a is None for k, a in enumerate(r.aborted) if k != late)


@needs("verilator")
def test_watchdog_fails_a_hung_engine():
    """A job short of its last weight word never finishes: the watchdog fails the run
    naming a stalled stream (``y`` or ``s``, both wait on the missing word) and the job,
    instead of hanging."""
    good = make_job(CONFIG, *ICARUS_CASES[1])
    job = dataclasses.replace(good, inputs={**good.inputs, "w": good.inputs["w"][:-1]},
                              meta={"label": "short of one w word"})
    t0 = time.perf_counter()
    with pytest.raises(SimulationFailed) as info:
        run_nbits_cocotb(engine(), [good, job], simulator="verilator", idle=0.3,
                         backpressure=0.3, seed=3, watchdog=1000)
    message = str(info.value)
    _drop_run_dir(message)
    assert re.search(r"stream '[yabsw]' stalled for 1000 cycles", message), message
    assert "job 1 of 2 'short of one w word'" in message, message
    print(f"\nwatchdog fired; {time.perf_counter() - t0:.1f} s")


@needs("verilator")
def test_scoreboard_catches_a_corrupted_word():
    """One bit flipped in one real expected word fails the run, naming the job, the beat and
    its (row, column); the same flip in a padding word (not compared) does not."""
    jobs = [make_job(CONFIG, *c) for c in ICARUS_CASES[:2]]
    job = jobs[0]                             # N 5 in groups of 4: words 4k+1..3 of group 1
    pad = int(np.flatnonzero(~job.real)[0])
    real = pad - 1
    bad = job.y.copy()
    bad[real] ^= 1
    with pytest.raises(SimulationFailed) as info:
        run_nbits_cocotb(engine(), [jobs[1], dataclasses.replace(job, y=bad)],
                         simulator="verilator", idle=0.3, backpressure=0.3, seed=3)
    message = str(info.value)
    _drop_run_dir(message)
    row, col = job.order[real]
    assert f"job 1 of 2 '{job.meta['label']}' beat {real} (row {row}, column {col})" \
        in message, message
    padding = job.y.copy()
    padding[pad] ^= 0x5A5A
    r = run_nbits_cocotb(engine(), [dataclasses.replace(job, y=padding)],
                         simulator="verilator", idle=0.3, backpressure=0.3, seed=3)
    assert r.y[0][pad] != padding[pad]


def _drop_run_dir(message: str) -> None:
    kept = re.search(r"run dir (\S+)\)", message)             # a failed run keeps its folder
    if kept and "capture" in kept[1]:
        shutil.rmtree(kept[1], ignore_errors=True)


def engine_fifos(v2: MatMulNBitsV2) -> list[list]:
    """``[path, depth, fill]`` of the engine's FIFOs: per cluster its credit-counted ``y``
    FIFO, its MAC array's and its scale lanes' output FIFOs (credits: to be filled); with
    several clusters the split FIFOs of ``w``, ``s``, ``b`` and the merge and output FIFOs of
    ``y`` (credits by level margin: checked, their room threshold asserted by the test); the
    row quantizer's ``q`` FIFO (checked, not filled: the engine takes ``q`` every cycle; its
    credit is run out in tests/rtl/test_flow_control.py). Depths from the units; the clusters
    and the private depth constants are read directly (no public accessor)."""
    n = v2.config.clusters
    fifos = []
    for e, cl in enumerate(v2._clusters):
        fifos += [[f"cluster{e}.y_fifo", nbits_cluster._Y_FIFO, True],
                  [f"cluster{e}.mac.fifo", cl.mac.fifo_depth, True],
                  *[[f"cluster{e}.lane{f}.fifo", cl.lane.fifo_depth, True]
                    for f in range(v2.lanes // n)]]
    if n > 1:
        fifos += [[f"y_fifo{e}", matmul_nbits_v2._MERGE_FIFO, False] for e in range(n)]
        fifos.append(["y_fifo", matmul_nbits_v2._OUT_FIFO, False])
        for port in ("w", "s", "b"):
            width = len(Value.cast(getattr(v2, port).payload)) // n
            chunks = -(-width // matmul_nbits_v2._SPLIT_CHUNK)
            fifos += [[f"{port}_fifo{e}_{c}", matmul_nbits_v2._SPLIT_FIFO, False]
                      for e in range(n) for c in range(chunks)]
    fifos.append(["rq.out", v2.row_quantizer.out_depth, False])
    return fifos


def room_threshold(path: str) -> int | None:
    """The level a margin-credited FIFO of a several-cluster engine reaches when its consumer
    stalls (its room register's threshold), None for the others."""
    m = matmul_nbits_v2
    if path.startswith(("w_fifo", "s_fifo", "b_fifo")):
        return m._SPLIT_FIFO - m._SPLIT_MARGIN
    if path.startswith("y_fifo"):
        return (m._OUT_FIFO - 3) if path == "y_fifo" else m._MERGE_FIFO - m._MERGE_MARGIN
    return None


def long_stall(v2: MatMulNBitsV2, fifos) -> int:
    """``y`` stall cycles that back the engine up to its first FIFO: every FIFO's depth plus
    the latencies between them (row quantizer, MAC array, scale lane, cluster output), plus
    a margin of 8."""
    t = v2.timing
    return sum(d for _, d, _ in fifos) + t["quantizer"] + t["mac"] + t["lane"] + t["out"] + 8


def run_long_stalls(v2, jobs, *, stall, starve, fifos, seed, simulator="verilator",
                    name=None):
    """:func:`run_nbits_cocotb` with the testbench's long stalls (``stall``, ``starve``) and
    occupancy checks (``fifos``); every ``y`` beat is checked in the testbench and again here.
    Returns the testbench's records and the simulation's seconds."""
    run = run_nbits_cocotb(v2, jobs, name=name, simulator=simulator, idle=0.1,
                           backpressure=0.3, seed=seed, max_burst=4,
                           watchdog=20000 + 4 * stall, stall=stall, starve=starve, fifos=fifos)
    for job, y in zip(jobs, run.y, strict=True):
        assert len(y) == len(job.y), job.meta["label"]
        assert np.array_equal(y[job.real], job.y[job.real]), job.meta["label"]
    return run.records["test_jobs"], run.sim_seconds


#: Jobs long enough to back the engine up under a long ``y`` stall (many columns: more
#: results than the FIFOs and banks hold), per configuration: make_job's arguments.
FILL_CASES = {
    "one_cluster": (CONFIG, [(4, 16, 128, 48, "packed", True, 3),
                             (2, 16, 96, 40, "none", False, 4),
                             (8, 16, 64, 24, "packed", True, 3)]),
    "two_clusters": (CLUSTER_CONFIG, [(4, 16, 128, 64, "packed", True, 4, 4, False)]),
}


def fill_jobs(which: str):
    config, cases = FILL_CASES[which]
    return config, [make_job(config, *c[:7], seed=k, **(dict(level=c[7], gidx=c[8])
                                                        if len(c) > 7 else {}))
                    for k, c in enumerate(cases)]


@needs("verilator")
@pytest.mark.parametrize("which", list(FILL_CASES))
def test_long_stalls_fill_every_fifo(which):
    """Long stalls: ``y.ready`` low longer than the engine's FIFOs and latencies together (at
    job boundaries: until the engine is backed up to its inputs), long ``valid``-low gaps on
    every input stream: every word bit-exact, every cluster's credit-counted FIFOs filled to
    their depth, the several-cluster engine's margin-credited FIFOs to their room threshold,
    none past its depth (a write into a full FIFO fails the run the cycle it happens)."""
    config, jobs = fill_jobs(which)
    v2 = engine(config)
    fifos = engine_fifos(v2)
    stall = long_stall(v2, fifos)
    starve = v2.timing["quantizer"] + 8
    rec, seconds = run_long_stalls(v2, jobs, stall=stall, starve=starve, fifos=fifos, seed=3)
    assert rec["stall"] == stall and rec["starve"] == starve
    for path, depth, fill in fifos:
        occ = rec["occupancy"][path]
        assert occ["limit"] == depth and occ["high"] <= depth, (path, occ)
        assert not fill or (occ["high"] == depth and occ["full_cycles"] > 0), (path, occ)
        room = room_threshold(path)
        assert room is None or occ["high"] >= room, (path, room, occ)
    print(f"\nstall {stall}, starve {starve}: {rec['occupancy']}; y held from job start "
          f"{rec['hold_cycles']} cycles; cycles {rec['cycles']}, {seconds:.1f} s")


#: Mutants of the engine's credits: (module, class name, old, new) for tests.rtl.mutants.
ENGINE_MUTANTS = {
    "cluster_y_off_by_one": (nbits_cluster, "NBitsCluster", "(reserved < _Y_FIFO)",
                             "(reserved <= _Y_FIFO)"),
    "cluster_y_ignored": (nbits_cluster, "NBitsCluster", "(reserved < _Y_FIFO)", "1"),
    "mac_off_by_one": (nbits_cluster, "PackedMacArray", "i.ready.eq(reserved < depth)",
                       "i.ready.eq(reserved <= depth)"),
    "admission_off_by_one": (nbits_cluster, "LaneAdmission", "room.eq(held_next < C)",
                             "room.eq(held_next <= C)"),
}


@pytest.mark.slow
@needs("verilator")
@pytest.mark.parametrize("kind", list(ENGINE_MUTANTS))
def test_long_stalls_kill_engine_mutants(kind):
    """test_long_stalls_fill_every_fifo's run fails on each credit mutant of the engine (its
    own Verilator build each: ``-m slow``), on the FIFO the credit guards being written while
    full (or a word lost, caught by the scoreboard)."""
    from unittest import mock

    from tests.rtl.mutants import mutant

    module, cls_name, old, new = ENGINE_MUTANTS[kind]
    cls = mutant(getattr(module, cls_name), old, new, name=f"{cls_name}_{kind}")
    target = matmul_nbits_v2 if cls_name == "NBitsCluster" else module
    with mock.patch.object(target, cls_name, cls):
        v2 = MatMulNBitsV2(CONFIG)
        fifos = engine_fifos(v2)
        jobs = fill_jobs("one_cluster")[1]
        with pytest.raises(SimulationFailed) as info:
            run_long_stalls(v2, jobs, stall=long_stall(v2, fifos),
                            starve=v2.timing["quantizer"] + 8, fifos=fifos, seed=3,
                            name=f"nbits_{kind}")
    message = str(info.value)
    _drop_run_dir(message)
    assert "outside 0.." in message or "expected" in message, message
    print(f"\n{kind}: {[ln for ln in message.splitlines() if 'test_jobs' in ln][:1]}")


@pytest.mark.slow
def test_verilator_matrix():
    """bits 2..8 x block_size 16, 64, 256 x zero points none/packed, bias and M in {1, 4}
    taking turns, K = 2 block_size + 7, N = 2 pe + 1; back to back under pauses, with two
    resets (one early, one late) among them."""
    combos = itertools.product(range(2, 9), (16, 64, 256), ("none", "packed"))
    jobs = [make_job(CONFIG, bits, bs, 2 * bs + 7, 2 * CONFIG.pe + 1, zp, bool(i % 2),
                     (1, 4)[i // 2 % 2])
            for i, (bits, bs, zp) in enumerate(combos)]
    r = run(jobs, "verilator", seed=11, reset_after={3: 100, 22: 5000})
    assert r.aborted[3] is not None and r.aborted[22] is not None, r.aborted


@pytest.mark.slow
def test_icarus_larger_jobs():
    """Bigger jobs on Icarus (K up to 300, all widths 2..8, tiles of 3 + 2 rows)."""
    jobs = [make_job(CONFIG, bits, bs, K, 9, zp, bias, M)
            for bits, bs, K, zp, bias, M in [(2, 64, 300, "packed", True, 5),
                                             (3, 32, 200, "none", False, 2),
                                             (5, 16, 100, "packed", True, 4),
                                             (6, 128, 256, "none", True, 1),
                                             (7, 16, 60, "packed", False, 3)]]
    run(jobs, "icarus", seed=13)
