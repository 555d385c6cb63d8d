"""The MatMulNBits engine (qaccel.rtl.matmul_nbits) on Verilator through StreamSim: every
``y`` beat bit-exact with qaccel.model.nbits_hw.matmul_nbits_hw, under random idle cycles
and back-pressure on every stream, and its throughput without pauses."""

from __future__ import annotations

import itertools
import zlib

import numpy as np
import pytest

from qaccel.model.config import AccelConfig
from qaccel.model.nbits import quantize_weights_nbits
from qaccel.model.perf import nbits_call, nbits_pass
from qaccel.rtl.matmul_nbits import MatMulNBits
from qaccel.sim.elementwise_sim import design_key
from qaccel.sim.nbits_jobs import NBitsJob, nbits_job, same_y, y_words
from qaccel.sim.streamsim import Segment, StreamSim

#: Engine shapes under test. ``p2s4``: pe 2 x simd 4, both paths, bus bound above 4 bits
#: (16 bits per column and cycle). ``p4s2``: pe 4 x simd 2, int8 path only, 3 partial sums,
#: a bus wide enough for 8 bits.
SHAPES = {"p2s4": AccelConfig(pe=2, simd=4, weight_bus_width=32, float_path=True),
          "p4s2": AccelConfig(pe=4, simd=2, weight_bus_width=64, partial_sums=3,
                              float_path=False)}
#: A second shape with the float path, for the slow matrix: pe 1 x simd 8, 3 partial sums.
FLOAT_SLOW_SHAPE = AccelConfig(pe=1, simd=8, weight_bus_width=64, partial_sums=3,
                               float_path=True)
#: The slow performance sweep's shapes: the above, pe 1 x simd 16 with 2 partial sums (the
#: accumulators bound blocks of one and two beats, the weight bus everything above 2 bits),
#: and the former default instance (pe 4 x simd 8, weight bus bound above 4 bits).
PERF_SHAPES = {**SHAPES, "p1s8": FLOAT_SLOW_SHAPE,
               "p1s16": AccelConfig(pe=1, simd=16, weight_bus_width=32, partial_sums=2,
                                    float_path=False),
               "p4s8": AccelConfig(pe=4, simd=8, weight_bus_width=128, float_path=True,
                                   m_tile=1, dsp_pairs=None)}

_SIMS: dict[AccelConfig, StreamSim] = {}


def engine(config: AccelConfig) -> StreamSim:
    """The engine's stream harness, the build qaccel.RTL uses too (same name and key)."""
    if config not in _SIMS:
        unit = MatMulNBits(config)
        _SIMS[config] = StreamSim(unit, name="matmul_nbits", design_key=design_key(unit))
    return _SIMS[config]


def operands(bits, block_size, K, N, zp_kind, bias, M, seed):
    """Weights quantised by qaccel's (ORT-exact) quantiser, activations and bias; float zero
    points random in [0, 2**bits - 1]."""
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((K, N)).astype(np.float32)
    B, S, Z = quantize_weights_nbits(W, bits=bits, block_size=block_size,
                                     symmetric=zp_kind == "none")
    if zp_kind == "float":
        Z = (rng.random(S.shape) * (2**bits - 1)).astype(np.float32)
    A = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32) if bias else None
    return dict(A=A, B=B, scales=S, zero_points=None if zp_kind == "none" else Z, bias=b)


def make_job(config, bits, block_size, K, N, zp_kind, bias, M, level=4, seed=None):
    key = (bits, block_size, K, N, zp_kind, bias, M)
    ops = operands(*key, seed=zlib.crc32(repr(key).encode()) if seed is None else seed)
    job = nbits_job(**ops, K=K, N=N, bits=bits, block_size=block_size, accuracy_level=level,
                    config=config)
    job.meta["label"] = f"bits {bits} block {block_size} K {K} N {N} M {M} zp {zp_kind}" \
                        f"{' bias' if bias else ''} level {level}"
    return job


def segment(job: NBitsJob) -> Segment:
    return Segment(job.inputs, job.regs, phases=[["start"], list(job.inputs)],
                   expect={"y": job.passes})


def check(job: NBitsJob, r, pe: int):
    """Every y beat bit-exact (NaN == NaN), in order, exactly once; ``last`` on the last."""
    label = job.meta["label"]
    beats = r.outputs["y"]
    assert len(beats) == job.passes, f"{label}: {len(beats)} y beats, expected {job.passes}"
    got = y_words(beats, pe)
    same = same_y(job, got)
    bad = np.argwhere(~same)
    assert not bad.size, f"{label}: y differs at (pass, column) {bad[:4].tolist()}: " \
                         f"{[hex(v) for v in got[~same][:4]]} vs " \
                         f"{[hex(v) for v in job.y[~same][:4]]}"
    last = [(int(b[-1]) if np.ndim(b) else int(b)) >> (32 * pe % 64) & 1 for b in beats]
    assert last == [0] * (job.passes - 1) + [1], f"{label}: last flags {last}"


def run_jobs(config, jobs, *, idle=0.0, backpressure=0.0, seed=1):
    results = engine(config).run_segments([segment(j) for j in jobs], idle=idle,
                                          backpressure=backpressure, seed=seed)
    for job, r in zip(jobs, results, strict=True):
        check(job, r, config.pe)
    return results


# -- int8 path (accuracy_level 4) -------------------------------------------------------------

INT8_CASES = [
    # bits, block_size, K, N, zp_kind, bias, M
    (4, 32, 100, 5, "packed", True, 3),
    (4, 16, 64, 8, "none", False, 1),
    (2, 64, 200, 3, "packed", False, 2),
    (3, 16, 50, 4, "packed", True, 2),
    (5, 32, 96, 6, "none", True, 1),
    (6, 128, 300, 2, "packed", False, 1),
    (7, 16, 33, 5, "packed", True, 2),
    (8, 256, 256, 4, "packed", True, 2),
    (8, 16, 17, 1, "none", False, 4),
]


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_int8_path_bit_exact_under_pauses(shape):
    """A representative subset: every bits, block sizes 16..256, zero points none/packed,
    bias or not, M 1..4, K and N not multiples of block_size / pe; random idle cycles and
    back-pressure (0.3 / 0.3) on every stream; the jobs back to back in one run."""
    config = SHAPES[shape]
    jobs = [make_job(config, *c) for c in INT8_CASES]
    run_jobs(config, jobs, idle=0.3, backpressure=0.3, seed=7)


def test_int8_path_no_pauses_and_heavy_pauses():
    config = SHAPES["p2s4"]
    jobs = [make_job(config, *c) for c in INT8_CASES[:4]]
    run_jobs(config, jobs)
    run_jobs(config, jobs, idle=0.8, backpressure=0.8, seed=3)


@pytest.mark.slow
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_int8_path_matrix(shape):
    """The full int8 matrix: bits 2..8 x block_size 16..256 x zero points none/packed x bias
    x M in {1, 3}, K not a multiple of block_size, N not a multiple of pe."""
    config = SHAPES[shape]
    jobs = [make_job(config, bits, bs, bs * 2 + 7, 2 * config.pe + 1, zp, bias, M)
            for bits, bs, zp, bias, M in itertools.product(
                range(2, 9), (16, 32, 64, 128, 256), ("none", "packed"), (False, True), (1, 3))]
    run_jobs(config, jobs, idle=0.2, backpressure=0.2, seed=11)
    print(f"\nint8 matrix {shape}: {len(jobs)} jobs passed")


def test_illegal_shapes_are_rejected():
    with pytest.raises(ValueError, match=r"weight_bus_width / pe must be one of"):
        MatMulNBits(AccelConfig(pe=3, weight_bus_width=64))
    with pytest.raises(TypeError, match="config must be an AccelConfig"):
        MatMulNBits("p2s4")
    config = SHAPES["p4s2"]
    with pytest.raises(ValueError, match="no float path"):
        make_job(config, 4, 32, 64, 2, "packed", False, 1, level=0)
    with pytest.raises(ValueError, match="block_size must be in"):
        make_job(AccelConfig(max_block_size=64), 4, 128, 128, 2, "packed", False, 1)


# -- float path (accuracy levels 0..3, and level 4 with float zero points) -----------------------

FLOAT_CASES = [
    # bits, block_size, K, N, zp_kind, bias, M, level
    (4, 32, 100, 5, "packed", True, 3, 0),
    (4, 16, 64, 4, "float", False, 2, 4),
    (2, 64, 200, 3, "none", True, 1, 1),
    (3, 16, 50, 4, "float", True, 2, 0),
    (5, 32, 96, 6, "packed", False, 1, 2),
    (6, 128, 300, 2, "none", True, 1, 3),
    (7, 16, 33, 5, "float", True, 2, 4),
    (8, 256, 256, 4, "packed", True, 2, 0),
    (8, 16, 17, 1, "none", False, 4, 0),
]


def test_float_path_bit_exact_under_pauses():
    """Both paths on one engine, jobs interleaved back to back, 0.3 / 0.3 pauses."""
    config = SHAPES["p2s4"]
    jobs = [make_job(config, *c) for c in FLOAT_CASES]
    jobs = [x for pair in zip(jobs, (make_job(config, *c) for c in INT8_CASES), strict=False)
            for x in pair]
    run_jobs(config, jobs, idle=0.3, backpressure=0.3, seed=5)


def test_float_path_special_values():
    """Zero, negative, huge and subnormal scales; activations that overflow to inf and NaN."""
    config = SHAPES["p2s4"]
    job_args = (4, 32, 96, 4, "float", True, 2)
    key = zlib.crc32(b"special")
    ops = operands(*job_args, seed=key)
    ops["scales"][0, 0] = 0.0
    ops["scales"][1, :] *= -1
    ops["scales"][2, 1] = 1e30
    ops["scales"][3, 2] = 1e-40
    ops["A"][0, 5] = 3e38
    ops["A"][1, 70] = np.nan
    job = nbits_job(**ops, K=96, N=4, bits=4, block_size=32, accuracy_level=0, config=config)
    job.meta["label"] = "special values"
    run_jobs(config, [job], idle=0.2, backpressure=0.2, seed=9)


@pytest.mark.parametrize("zp_kind", ["none", "packed", "float"])
def test_g_idx_jobs(zp_kind):
    """g_idx (a permutation of equal groups, and unequal random groups with an empty one):
    the host lays K out group by group (qaccel.model.nbits_hw.gidx_operands), the float path
    runs it; bit-exact with the engine-order model and within tolerance of the golden one."""
    config = SHAPES["p2s4"]
    rng = np.random.default_rng(21)
    jobs = []
    for K, bs, level in ((96, 32, 4), (100, 16, 0)):
        ops = operands(4, bs, K, 3, zp_kind, True, 2, seed=K)
        kb = -(-K // bs)
        for g in (rng.permutation(np.arange(K, dtype=np.int32) // bs),
                  rng.integers(1, kb, K).astype(np.int32)):            # group 0 empty
            job = nbits_job(**ops, g_idx=g, K=K, N=3, bits=4, block_size=bs,
                            accuracy_level=level, config=config)
            job.meta["label"] = f"g_idx K {K} block {bs} zp {zp_kind} level {level}"
            jobs.append(job)
    run_jobs(config, jobs, idle=0.3, backpressure=0.3, seed=17)


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["p2s4", "p1s8"])
def test_float_path_matrix(shape):
    """bits 2..8 x block_size 16..256 x zero points none/packed/float x bias x M in {1, 3}
    at levels 0 and 4 (level 4 with float zero points takes the float path)."""
    config = SHAPES.get(shape, FLOAT_SLOW_SHAPE)
    jobs = [make_job(config, bits, bs, bs * 2 + 7, 5, zp, bias, M, level=0 if zp != "float"
                     else 4)
            for bits, bs, zp, bias, M in itertools.product(
                range(2, 9), (16, 32, 64, 128, 256), ("none", "packed", "float"),
                (False, True), (1, 3))]
    run_jobs(config, jobs, idle=0.2, backpressure=0.2, seed=13)
    print(f"\nfloat matrix {shape}: {len(jobs)} jobs passed")


# -- throughput ---------------------------------------------------------------------------------


def measure(config, bits, block_size, K=1024, M=2, N=None, level=4, bias=False):
    """Run a job without pauses; return (cycles per pass in the steady state, beats per
    pass) from the spacing of the y beats."""
    N = 4 * config.pe if N is None else N
    job = make_job(config, bits, block_size, K, N, "packed", bias, M, level=level)
    r = run_jobs(config, [job])[0]
    gaps = np.diff(np.asarray(r.output_cycles["y"]))
    return int(np.median(gaps)), -(-K // block_size) * block_size // config.simd


@pytest.mark.parametrize(("shape", "level"), [("p2s4", 4), ("p2s4", 0), ("p4s2", 4)])
def test_utilisation(shape, level):
    """Steady-state MAC utilisation for every bits / block_size pair, input streams never
    stalled (K = 1024): 100% of pe x simd where the weight bus carries simd codes per column
    and cycle, else exactly the bus bound (bus / pe / bits codes per column and cycle); equal
    to the performance model (qaccel.model.perf.nbits_pass)."""
    config = SHAPES[shape]
    lane_bus = config.weight_bus_width // config.pe
    rows = []
    for bits, bs in itertools.product(range(2, 9), (16, 32, 64, 128, 256)):
        per_pass, beats = measure(config, bits, bs, level=level)
        rows.append(f"{bits}/{bs}:{per_pass}")
        peak = min(1.0, lane_bus / bits / config.simd)
        util = beats / per_pass
        assert util >= 0.95 * peak, f"bits {bits} block {bs}: {util:.3f} of peak {peak:.3f}"
        assert per_pass == -(-beats * config.simd * bits // lane_bus) or peak == 1.0
        assert per_pass == nbits_pass(config, K=1024, bits=bits, block_size=bs,
                                      accuracy_level=level).cycles, (bits, bs)
    print(f"\n{shape} level {level}, K 1024 ({beats} beats per pass), cycles per pass by "
          f"bits/block_size: {' '.join(rows)}")


@pytest.mark.parametrize("level", [4, 0])
def test_bias_costs_no_cycle(level):
    """A bias beat on ``s`` per pass costs no cycle on either path: ``s`` is split into a bias
    FIFO and a block-parameter FIFO, so the next pass's bias is taken while the current pass
    still computes. The model says the same."""
    config = SHAPES["p2s4"]
    per_pass, beats = measure(config, 4, 32, bias=True, level=level)
    assert per_pass == beats
    assert per_pass == nbits_pass(config, K=1024, bits=4, block_size=32, accuracy_level=level,
                                  bias=True).cycles


@pytest.mark.parametrize(("shape", "level"), [("p2s4", 4), ("p2s4", 0), ("p4s2", 4)])
def test_short_rows_wait_for_the_fold(shape, level):
    """A pass shorter than the previous row's fold (8 x partial_sums cycles) takes the fold's
    time: 64 cycles with 8 partial sums; with 3 (p4s2, fold 24) rows of 32+ beats do not
    wait. The model says the same."""
    config = SHAPES[shape]
    for K in (64, 128, 200):
        per_pass, beats = measure(config, 4, 16, K=K, M=6, level=level)
        model = nbits_pass(config, K=K, bits=4, block_size=16, accuracy_level=level)
        assert per_pass == model.cycles == max(beats, 8 * config.partial_sums), K
        assert model.bound == ("fold" if beats < 8 * config.partial_sums else "compute")


def whole_calls(config, points, level):
    """Run, without pauses, three calls per (bits, block_size) point: K 1024 over 2 x 2 column
    groups, K 1000 with a bias and no zero points in one pass, and K 200 over 3 x 3 groups
    (fold bound with 8 partial sums); return rows (point, call, RTL cycles, model cycles)."""
    calls = [(1024, 2 * config.pe, 2, "packed", False), (1000, config.pe, 1, "none", True),
             (200, 2 * config.pe + 1, 3, "packed", False)]
    keys = [(bits, bs, *c) for bits, bs in points for c in calls]
    jobs = [make_job(config, bits, bs, K, N, zp, bias, M, level=level)
            for bits, bs, K, N, M, zp, bias in keys]
    results = run_jobs(config, jobs)
    rows = []
    for (bits, bs, K, N, M, zp, bias), r in zip(keys, results, strict=True):
        model = nbits_call(config, M=M, N=N, K=K, bits=bits, block_size=bs, zero_points=zp,
                           accuracy_level=level, bias=bias)
        rows.append(((bits, bs), (K, N, M), r.cycles, model.cycles, model.bound))
    return rows


def report(shape, level, rows):
    worst = max(abs(m - c) / c for *_, c, m, _b in rows)
    exact = sum(m == c for *_, c, m, _b in rows)
    print(f"\n{shape} level {level}: {exact}/{len(rows)} calls exact, worst |model - RTL| / RTL "
          f"{worst:.4%}; " + " ".join(f"{b}/{bs} K{k}:{c}" + ("" if m == c else f"(model {m})")
                                      for (b, bs), (k, _n, _m), c, m, _b in rows))
    return worst


@pytest.mark.parametrize(("shape", "level"), [("p2s4", 4), ("p2s4", 0), ("p4s2", 4)])
def test_whole_call_cycles(shape, level):
    """The performance model's whole-call cycles (qaccel.model.perf.nbits_call: start, passes,
    pipeline latency) equal the RTL's on a representative subset: every bound the shape has
    (compute, weight bus, fold), short and long blocks, one pass and many."""
    config = SHAPES[shape]
    rows = whole_calls(config, [(2, 16), (4, 64), (5, 32), (8, 256), (7, 128)], level)
    report(shape, level, rows)
    assert [m for *_, m, _b in rows] == [c for *_, c, _m, _b in rows]


@pytest.mark.slow
@pytest.mark.parametrize(("shape", "level"), [("p2s4", 4), ("p2s4", 0), ("p4s2", 4),
                                              ("p1s16", 4), ("p1s8", 0), ("p1s8", 4),
                                              ("p4s8", 4), ("p4s8", 0)])
def test_whole_call_cycles_sweep(shape, level):
    """Every bits 2..8 x block_size 16..256 point, three calls each, on five shapes and both
    paths: the model's cycles equal the RTL's (the table is printed with -s)."""
    config = PERF_SHAPES[shape]
    rows = whole_calls(config, itertools.product(range(2, 9), (16, 32, 64, 128, 256)), level)
    report(shape, level, rows)
    assert [m for *_, m, _b in rows] == [c for *_, c, _m, _b in rows]
