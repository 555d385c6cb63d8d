"""The MatMulNBits engine v2 (qaccel.rtl.nbits.matmul_nbits_v2) on Verilator through StreamSim:
every
``y`` word bit-exact with qaccel.model.nbits_hw.matmul_nbits_v2, in the engine's order, under
random idle cycles and back-pressure on every stream, and its cycles without pauses."""

from __future__ import annotations

import itertools
import zlib

import numpy as np
import pytest

from qaccel.explore.perf import nbits_v2_call
from qaccel.model.config import AccelConfig
from qaccel.model.nbits import quantize_weights_nbits
from qaccel.rtl.nbits.matmul_nbits_v2 import MatMulNBitsV2, lane_column, wide_columns
from qaccel.sim.elementwise_sim import design_key
from qaccel.sim.nbits_jobs import NBitsJobV2, nbits_job_v2
from qaccel.sim.streamsim import Segment, StreamSim

#: Engine shapes under test: pe 4 x simd 2 with row tiles of 3 (two lanes of 2 columns: the
#: lanes stall on their accumulators at one row), pe 8 x simd 1 with tiles of 2 (one lane of
#: 8 columns), pe 8 x simd 4 in two clusters (each 4 columns and one lane; their streams
#: split and merged), pe 2 x simd 16 (one term per result: the hand-off reads its block
#: entry in the same cycle rather than ahead).
SHAPES = {"p4s2t3": AccelConfig(pe=4, simd=2, m_tile=3, max_k=1024, max_block_size=256,
                                float_path=False),
          "p8s1t2": AccelConfig(pe=8, simd=1, m_tile=2, max_k=512, max_block_size=256,
                                float_path=False),
          "p8s4t2c2": AccelConfig(pe=8, simd=4, m_tile=2, max_k=512, max_block_size=256,
                                  float_path=False, clusters=2),
          "p2s16t2": AccelConfig(pe=2, simd=16, m_tile=2, max_k=512, max_block_size=256,
                                 float_path=False)}

#: Engines with the float path (four digit rows per row of A): pe 4 x simd 2, tiles of one
#: row (two lanes of 2 columns: digit rows stall on the shared accumulators); pe 8 x simd 1,
#: tiles of two rows; pe 8 x simd 4 in two clusters, tiles of one row; pe 16 x simd 1 (one
#: lane of J = 16 columns: its block-sum chains under two sequencer replicas, as the presets').
FLOAT_SHAPES = {"p4s2t4f": AccelConfig(pe=4, simd=2, m_tile=4, max_k=1024, max_block_size=256,
                                       float_path=True),
                "p8s1t8f": AccelConfig(pe=8, simd=1, m_tile=8, max_k=512, max_block_size=256,
                                       float_path=True),
                "p8s4t4fc2": AccelConfig(pe=8, simd=4, m_tile=4, max_k=512, max_block_size=256,
                                         float_path=True, clusters=2),
                "p16s1t4f": AccelConfig(pe=16, simd=1, m_tile=4, max_k=512, max_block_size=256,
                                        float_path=True)}

_SIMS: dict[AccelConfig, StreamSim] = {}


def engine(config: AccelConfig) -> StreamSim:
    if config not in _SIMS:
        unit = MatMulNBitsV2(config)
        _SIMS[config] = StreamSim(unit, name="matmul_nbits_v2", design_key=design_key(unit))
    return _SIMS[config]


def make_job(config, bits, block_size, K, N, zp_kind, bias, M, seed=None, *, level=4,
             gidx=False) -> NBitsJobV2:
    """One random call; ``level`` < 4 or ``gidx`` (a random group of every K element) take
    the float path."""
    key = (bits, block_size, K, N, zp_kind, bias, M) + ((level, gidx) if level < 4 or gidx
                                                         else ())
    rng = np.random.default_rng(zlib.crc32(repr(key).encode()) if seed is None else seed)
    W = rng.standard_normal((K, N)).astype(np.float32)
    B, S, Z = quantize_weights_nbits(W, bits=bits, block_size=block_size,
                                     symmetric=zp_kind == "none")
    if zp_kind == "float":             # float zero points: anywhere in the codes' range
        Z = rng.uniform(0, (1 << bits) - 1, S.shape).astype(np.float32)
    A = rng.standard_normal((M, K)).astype(np.float32)
    A[:, : min(K, block_size)] *= 1e-3                 # a block of another scale
    b = rng.standard_normal(N).astype(np.float32) if bias else None
    g = None
    if gidx:
        g = rng.integers(0, -(-K // block_size), K).astype(np.int32)
        g[: min(K, 3)] = 0                                 # a fuller group and an empty one
        g[g == 1] = 0
    job = nbits_job_v2(A, B, S, None if zp_kind == "none" else Z, g, b, K=K, N=N,
                       bits=bits, block_size=block_size, accuracy_level=level, config=config)
    job.meta["label"] = f"bits {bits} block {block_size} K {K} N {N} M {M} zp {zp_kind}" \
                        f"{' bias' if bias else ''} level {level}{' g_idx' if gidx else ''}"
    job.meta["cycles"] = nbits_v2_call(config, M=M, N=N, K=job.regs["k"], bits=bits,
                                       block_size=block_size,
                                       float_path=bool(job.regs["fmode"] & 1),
                                       float_zero_points=bool(job.regs["fmode"] & 2)).cycles
    return job


def segment(job: NBitsJobV2) -> Segment:
    return Segment(job.inputs, job.regs, phases=[["start"], list(job.inputs)],
                   expect={"y": len(job.y)})


def check(job: NBitsJobV2, r):
    """Every y word bit-exact (NaN codes too), in order, exactly once; ``last`` on the
    last."""
    label = job.meta["label"]
    beats = np.asarray(r.outputs["y"], dtype=np.uint64).reshape(-1)
    assert len(beats) == len(job.y), f"{label}: {len(beats)} y beats, expected {len(job.y)}"
    got = (beats & 0xFFFFFFFF).astype(np.uint32)
    same = (got == job.y) | ~job.real
    bad = np.flatnonzero(~same)
    assert not bad.size, f"{label}: y differs at (row, column) " \
                         f"{job.order[bad[:4]].tolist()}: {[hex(v) for v in got[bad[:4]]]} " \
                         f"vs {[hex(v) for v in job.y[bad[:4]]]}"
    last = (beats >> np.uint64(32)) & np.uint64(1)
    assert last.tolist() == [0] * (len(job.y) - 1) + [1], f"{label}: last flags"


def run_jobs(config, jobs, *, idle=0.0, backpressure=0.0, seed=1):
    # a stream may wait a whole row tile (the next tile's rows wait for every column group)
    watchdog = 10_000 + 4 * max(j.meta["cycles"] for j in jobs)
    results = engine(config).run_segments([segment(j) for j in jobs], idle=idle,
                                          backpressure=backpressure, seed=seed,
                                          watchdog=watchdog)
    for job, r in zip(jobs, results, strict=True):
        check(job, r)
    return results


CASES = [
    # bits, block_size, K, N, zp_kind, bias, M
    (4, 32, 100, 5, "packed", True, 3),
    (4, 16, 64, 8, "none", False, 1),
    (2, 64, 200, 3, "packed", False, 2),
    (3, 16, 50, 4, "packed", True, 4),
    (5, 32, 96, 6, "none", True, 1),
    (6, 128, 300, 2, "packed", False, 1),
    (7, 16, 33, 5, "packed", True, 2),
    (8, 256, 256, 4, "packed", True, 5),
    (2, 16, 17, 9, "none", False, 4),
]


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_bit_exact_under_pauses(shape):
    """Every width, block sizes 16..256, zero points none/packed, bias or not, M 1..5 (whole
    and partial row tiles), K and N not multiples of block_size / the group; random idle
    cycles and back-pressure (0.3 / 0.3) on every stream; the jobs back to back in one run."""
    config = SHAPES[shape]
    run_jobs(config, [make_job(config, *c) for c in CASES], idle=0.3, backpressure=0.3,
             seed=7)


def test_no_pauses_and_heavy_pauses():
    config = SHAPES["p8s1t2"]
    jobs = [make_job(config, *c) for c in CASES[:4]]
    run_jobs(config, jobs)
    run_jobs(config, jobs, idle=0.8, backpressure=0.8, seed=3)


@pytest.mark.slow
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_matrix(shape):
    """bits 2..8 x block_size 16..256 x zero points none/packed x bias x M in {1, 3}."""
    config = SHAPES[shape]
    jobs = [make_job(config, bits, bs, min(2 * bs, config.max_k - bs) + 7, 2 * config.pe + 1,
                     zp, bias, M)
            for bits, bs, zp, bias, M in itertools.product(
                range(2, 9), (16, 32, 64, 128, 256), ("none", "packed"), (False, True), (1, 3))]
    run_jobs(config, jobs, idle=0.2, backpressure=0.2, seed=11)
    print(f"\nv2 matrix {shape}: {len(jobs)} jobs passed")


def test_illegal_shapes_are_rejected():
    with pytest.raises(ValueError, match="pe must be even"):
        MatMulNBitsV2(AccelConfig(pe=3))
    with pytest.raises(TypeError, match="config must be an AccelConfig"):
        MatMulNBitsV2("p4s2")
    with pytest.raises(ValueError, match="K must be at most config.max_k"):
        make_job(SHAPES["p8s1t2"], 4, 32, 600, 2, "none", False, 1)
    # an engine without the float path takes int8-path calls only; the float path needs
    # m_tile a multiple of 4
    W = np.random.default_rng(0).standard_normal((64, 16)).astype(np.float32)
    B, S, Z = quantize_weights_nbits(W, bits=4, block_size=32, symmetric=False)
    A = np.ones((1, 64), np.float32)
    for level, zp in ((0, Z), (3, None), (4, S.astype(np.float32))):
        with pytest.raises(ValueError, match="int8 path only"):
            nbits_job_v2(A, B, S, zp, K=64, N=16, bits=4, block_size=32,
                         accuracy_level=level, config=SHAPES["p8s1t2"])
    with pytest.raises(ValueError, match="m_tile must be a multiple of 4 .* not 6"):
        MatMulNBitsV2(AccelConfig(pe=8, m_tile=6, float_path=True))
    with pytest.raises(ValueError, match=r"pe / clusters must be even .* not 12 / 4"):
        MatMulNBitsV2(AccelConfig(pe=12, simd=16, clusters=4))
    with pytest.raises(ValueError, match=r"clusters \(2\) need at least two MAC columns per "
                                         r"float lane \(pe / scale_lanes = 4 / 4\)"):
        MatMulNBitsV2(AccelConfig(pe=4, simd=16, clusters=2))


@pytest.mark.parametrize(("pe", "lanes"), [(32, 2), (128, 8), (8, 1), (4, 4), (16, 8)])
def test_lane_columns(pe, lanes):
    """Every output column is one lane's term exactly once; a lane's MAC columns are a
    contiguous run of J, and at 5..8 bits both MAC columns of its output columns are its own
    (or, one MAC column per lane, the column and its partner pe / 2 further on)."""
    J = pe // lanes
    for wide, cols in ((False, pe), (True, pe // 2)):
        got = [lane_column(pe, lanes, f, j, wide) for f in range(lanes) for j in range(J)]
        # lane by lane, each lane's run in order: the y stream's column order
        assert [c for c in got if c is not None] == list(range(cols))
    pairs = wide_columns(pe, lanes)
    for f in range(lanes):
        own = set(range(f * J, f * J + J))
        assert {lane_column(pe, lanes, f, j, False) for j in range(J)} == own
        for j in range(J):
            c = lane_column(pe, lanes, f, j, True)
            if c is not None:
                assert set(pairs[c]) <= own if J > 1 else pairs[c] == (c, c + pe // 2)
    with pytest.raises(ValueError, match=r"pe / scale_lanes .* must be 1 or even.* 6 / 2"):
        MatMulNBitsV2(AccelConfig(pe=6, simd=4))


#: Calls whose cycles the performance model must give exactly: bits, block_size, K, N, M
#: (one and several row tiles, a partial last tile, K not a multiple of the block, 2-bit
#: words of two steps, 5..8-bit half-width groups).
CYCLE_POINTS = [(4, 16, 64, 8, 1), (4, 32, 64, 16, 1), (4, 16, 128, 8, 2), (8, 16, 64, 8, 1),
                (2, 16, 64, 8, 1), (4, 64, 200, 8, 1), (4, 16, 64, 8, 5), (3, 16, 300, 9, 4),
                (8, 128, 256, 5, 2), (2, 32, 100, 17, 3), (6, 16, 48, 3, 7)]


def call_cycles(config, points):
    """Run ``points`` without pauses; return (point..., rtl cycles, model cycles, bound)."""
    jobs = [make_job(config, b, bs, K, N, "packed", False, M) for b, bs, K, N, M in points]
    rows = []
    for (b, bs, K, N, M), r in zip(points, run_jobs(config, jobs), strict=True):
        model = nbits_v2_call(config, M=M, N=N, K=K, bits=b, block_size=bs)
        rows.append((b, bs, K, N, M, r.cycles, model.cycles, model.bound))
    return rows


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_call_cycles(shape, capsys):
    """qaccel.explore.perf.nbits_v2_call equals the RTL's cycles, start to busy low."""
    rows = call_cycles(SHAPES[shape], CYCLE_POINTS)
    with capsys.disabled():
        print(f"\n{shape}: bits block K N M  rtl model bound")
        for row in rows:
            print("  ", *row)
    assert all(rtl == model for *_, rtl, model, _ in rows)


@pytest.mark.slow
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_call_cycles_sweep(shape, capsys):
    """Every bits 2..8 x block_size 16..256 point, M = 1, m_tile and m_tile + 1: the model
    exact (the steady-state utilisation it implies is printed)."""
    config = SHAPES[shape]
    points = [(b, bs, min(3 * bs, config.max_k - bs) + 5, 3 * config.pe, M) for b in range(2, 9)
              for bs in (16, 32, 64, 128, 256) for M in (1, config.m_tile, config.m_tile + 1)]
    rows = call_cycles(config, points)
    bad = [r for r in rows if r[5] != r[6]]
    util = [nbits_v2_call(config, M=M, N=N, K=K, bits=b, block_size=bs).steady_utilisation
            for b, bs, K, N, M in points]
    with capsys.disabled():
        print(f"\n{shape}: {len(rows) - len(bad)} of {len(rows)} calls exact; steady-state "
              f"utilisation {min(util):.3f} .. {max(util):.3f}")
    assert not bad, bad[:5]


# -- the float path (block floating point: four int8 digit rows per row of A) ----------------------

#: bits, block_size, K, N, zp_kind, bias, M, accuracy_level, g_idx
FLOAT_CASES = [
    (4, 32, 100, 5, "packed", True, 3, 0, False),
    (4, 16, 64, 8, "none", False, 1, 1, False),
    (2, 64, 200, 3, "packed", False, 2, 3, False),
    (8, 16, 50, 4, "packed", True, 2, 0, False),
    (5, 32, 96, 6, "none", True, 1, 2, False),
    (4, 32, 150, 7, "packed", True, 2, 4, True),      # g_idx: the host's group layout
    (3, 16, 70, 4, "none", False, 3, 0, True),
    (4, 16, 64, 8, "packed", True, 2, 4, False),      # an int8-path call on the same engine
    (4, 32, 100, 5, "float", True, 3, 4, False),      # float zero points: two terms a digit
    (2, 16, 40, 9, "float", False, 1, 0, False),
    (7, 64, 130, 3, "float", True, 2, 1, False),
    (4, 16, 70, 4, "float", True, 2, 4, True),        # and g_idx
]


@pytest.mark.parametrize("shape", sorted(FLOAT_SHAPES))
def test_float_path_bit_exact_under_pauses(shape):
    """The float path (levels 0..3, g_idx, float zero points) and the int8 path on one
    engine: every y word bit-exact with matmul_nbits_v2 under random idle cycles and
    back-pressure (0.3 / 0.3), the jobs back to back in one run; then without pauses, each
    call's cycles those of nbits_v2_call(float_path=..., float_zero_points=...)."""
    config = FLOAT_SHAPES[shape]
    jobs = [make_job(config, *c[:7], level=c[7], gidx=c[8]) for c in FLOAT_CASES]
    run_jobs(config, jobs, idle=0.3, backpressure=0.3, seed=5)
    results = run_jobs(config, jobs)
    got = [(j.meta["label"], r.cycles, j.meta["cycles"]) for j, r in zip(jobs, results,
                                                                         strict=True)]
    assert all(rtl == model for _, rtl, model in got), got
