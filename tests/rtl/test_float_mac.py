"""FloatMac (the engine's float path MAC) on Verilator, bit-exact against
qaccel.model.nbits_hw.matmul_nbits_hw (accuracy_level 0): real MatMulNBits operands (2, 4 and
8 bits; integer, float and absent zero points; scales with negative, zero, huge and subnormal
values; bias present or absent; K not a multiple of block_size nor of simd), driven as the
engine will (per row k_blocks * block_size / simd beats, A zero-padded with its mask bits off
past K); idle cycles and back-pressure with exact beat counts; throughput and latency."""

from __future__ import annotations

import numpy as np
import pytest

from qaccel.model.config import AccelConfig
from qaccel.model.nbits import pack_zero_points, unpack_nbits, unpack_zero_points
from qaccel.model.nbits_hw import matmul_nbits_hw
from qaccel.rtl.float_mac import FloatMac
from qaccel.sim.runner import missing_simulator
from qaccel.sim.streamsim import Segment, StreamSim

pytestmark = [pytest.mark.sim,
              pytest.mark.skipif(missing_simulator("verilator") is not None,
                                 reason=missing_simulator("verilator") or "")]

F32 = np.float32
_SIMS: dict[tuple[int, int, int], tuple[FloatMac, StreamSim]] = {}


def mac(pe: int, simd: int, sums: int):
    key = (pe, simd, sums)
    if key not in _SIMS:
        unit = FloatMac(pe=pe, simd=simd, partial_sums=sums)
        _SIMS[key] = unit, StreamSim(unit, name=f"float_mac_pe{pe}_s{simd}_l{sums}")
    return _SIMS[key]


def f32(rng, shape, spread=8):
    return (rng.standard_normal(shape) * 2.0 ** rng.integers(-spread, spread, shape)).astype(F32)


def operands(rng, *, pe, M, K, bits, block_size, zp, bias, specials=True, overflow=False):
    """A MatMulNBits problem: A (M, K), B, scales, zero points ("int", "float", None), bias.
    ``specials``: zeros in A, scales +0, -0, huge (1e30, finite products) and subnormal;
    ``overflow``: also scales of 3e37 (products overflow: inf, and NaN where they meet)."""
    kb = -(-K // block_size)
    A = f32(rng, (M, K), 6)
    B = rng.integers(0, 256, (pe, kb, block_size * bits // 8), dtype=np.uint8)
    scales = f32(rng, (pe, kb), 6)
    if specials:
        A[rng.random((M, K)) < 0.02] = 0.0
        A[rng.random((M, K)) < 0.01] = -0.0
        r = rng.random((pe, kb))
        scales[r < 0.08] = 0.0
        scales[(r >= 0.08) & (r < 0.12)] = F32(-0.0)
        scales[(r >= 0.12) & (r < 0.16)] = F32(1e30)         # huge, products finite
        scales[(r >= 0.16) & (r < 0.2)] = F32(2e-40)         # subnormal scale
        if overflow:                                        # products overflow to inf
            scales[0, 0] = F32(3e37)
            scales[-1, 0], scales[-1, -1] = F32(-3e37), F32(3e37)   # and +inf + -inf = NaN
    if zp == "int":
        zero_points = pack_zero_points(rng.integers(0, 1 << bits, (pe, kb)), bits)
    elif zp == "float":
        zero_points = f32(rng, (pe, kb), 3)
        if specials:
            zero_points[rng.random((pe, kb)) < 0.1] = 0.0
    else:
        zero_points = None
    b = f32(rng, (pe,), 4) if bias else None
    return dict(A=A, B=B, scales=scales, zero_points=zero_points, bias=b, K=K, N=pe,
                bits=bits, block_size=block_size)


def model(op, simd, sums):
    cfg = AccelConfig(pe=op["N"], simd=simd, partial_sums=sums, weight_bus_width=128)
    with np.errstate(all="ignore"):
        return matmul_nbits_hw(op["A"], op["B"], op["scales"], op["zero_points"], bias=op["bias"],
                               K=op["K"], N=op["N"], bits=op["bits"],
                               block_size=op["block_size"], accuracy_level=0, config=cfg)


def _u32(x) -> np.ndarray:
    return np.ascontiguousarray(x, F32).view(np.uint32).astype(object)


def beats(unit: FloatMac, op) -> tuple[list[int], int]:
    """The engine's beats for ``op`` (payload integers) and the zp_float register value."""
    pe, S = unit.pe, unit.simd
    lay = unit.i.payload.shape()
    off = {name: lay[name].offset for name in ("a", "mask", "q", "scale", "zero", "bias",
                                               "row_last")}
    K, bs, bits = op["K"], op["block_size"], op["bits"]
    kb = -(-K // bs)
    codes = unpack_nbits(op["B"], bits, bs).reshape(pe, kb * bs).astype(object)
    scale = _u32(op["scales"])                                         # (pe, kb)
    zp = op["zero_points"]
    if zp is None:
        zero, zp_float = np.full((pe, kb), 1 << (bits - 1), object), 0
    elif zp.dtype == np.uint8:
        zero, zp_float = unpack_zero_points(zp, bits, kb).astype(object), 0
    else:
        zero, zp_float = _u32(zp), 1
    bias = _u32(op["bias"]) if op["bias"] is not None else np.zeros(pe, object)
    A = op["A"]
    n = kb * bs // S
    out = []
    for row in A:
        a = np.zeros(kb * bs, F32)
        a[:K] = row
        a = _u32(a)
        for t in range(n):
            k0, b = t * S, (t * S) // bs
            v = 0
            for j in range(S):
                k = k0 + j
                v |= a[k] << (off["a"] + 32 * j)
                v |= int(k < K) << (off["mask"] + j)
                for p in range(pe):
                    v |= codes[p, k] << (off["q"] + 8 * (p * S + j))
            for p in range(pe):
                v |= scale[p, b] << (off["scale"] + 32 * p)
                v |= zero[p, b] << (off["zero"] + 32 * p)
                if t == n - 1:
                    v |= bias[p] << (off["bias"] + 32 * p)
            v |= int(t == n - 1) << off["row_last"]
            out.append(v)
    return out, zp_float


def outputs(unit: FloatMac, y) -> np.ndarray:
    y = np.asarray(y)
    ints = ([int(v) for v in y] if y.ndim == 1
            else [int.from_bytes(r.astype(np.uint64).tobytes(), "little") for r in y])
    return np.array([[(v >> (32 * p)) & 0xFFFFFFFF for p in range(unit.pe)] for v in ints],
                    np.uint32).view(F32)


def assert_same(got, want):
    assert got.shape == want.shape, (got.shape, want.shape)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def cases(rng, pe, simd):
    """(op) for a spread of bits, zero points, bias, K and block sizes."""
    out = []
    for bits, zp, bias, K, bs, M, over in [
        (4, "int", True, 202, 32, 3, False),
        (4, "float", True, 77, 16, 3, False),
        (2, None, False, 130, 64, 2, False),
        (8, "int", False, 45, 16, 3, False),
        (8, "float", True, 301, 128, 2, False),
        (2, "float", False, 19, 16, 4, True),
        (8, "int", True, 150, 32, 3, True),
        (4, None, True, 1, 16, 2, False),
    ]:
        out.append(operands(rng, pe=pe, M=M, K=K, bits=bits, block_size=bs, zp=zp, bias=bias,
                            overflow=over))
    return out


def run_cases(unit, sim, ops, *, idle=0.0, backpressure=0.0, seed=1):
    segs, wants = [], []
    for op in ops:
        words, zpf = beats(unit, op)
        segs.append(Segment(inputs={"i": words}, static={"zp_float": zpf},
                            expect={"o": op["A"].shape[0]}))
        wants.append(model(op, unit.simd, unit.partial_sums))
    results = sim.run_segments(segs, idle=idle, backpressure=backpressure, seed=seed)
    for res, want, seg in zip(results, wants, segs, strict=True):
        assert len(res.accepted["i"]) == len(seg.inputs["i"])
        assert_same(outputs(unit, res.outputs["o"]), want)
    return results


SHAPES = [(2, 4, 8), (1, 8, 3)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("idle", "backpressure"), [(0.0, 0.0), (0.3, 0.3)])
def test_matches_the_model(shape, idle, backpressure):
    unit, sim = mac(*shape)
    rng = np.random.default_rng(sum(shape))
    run_cases(unit, sim, cases(rng, unit.pe, unit.simd), idle=idle, backpressure=backpressure,
              seed=7)


def test_heavy_back_pressure_fills_the_row_credit():
    """Many short rows against a mostly stalled o: i stops at 16 rows in flight; every row
    comes out once, in order."""
    unit, sim = mac(2, 4, 8)
    rng = np.random.default_rng(11)
    ops = [operands(rng, pe=2, M=40, K=13, bits=4, block_size=16, zp="int", bias=True),
           operands(rng, pe=2, M=30, K=40, bits=2, block_size=16, zp="float", bias=False)]
    run_cases(unit, sim, ops, idle=0.1, backpressure=0.95, seed=3)


@pytest.mark.parametrize("shape", SHAPES)
def test_throughput_and_latency(shape):
    unit, sim = mac(*shape)
    pe, simd, sums = shape
    rng = np.random.default_rng(5)
    # a row of 16 / simd <= partial_sums beats: the accumulators do not wait
    one = operands(rng, pe=pe, M=1, K=13, bits=4, block_size=16, zp="int", bias=True)
    (res,) = run_cases(unit, sim, [one])
    assert res.output_cycles["o"][0] - res.accepted["i"][-1] == unit.latency
    # rows of 8 * partial_sums beats or more (here 96 and 72 beats per row)
    K = 96 * simd if sums >= 8 else 72 * simd
    rows = operands(rng, pe=pe, M=4, K=K - 5, bits=4, block_size=32, zp="float", bias=True)
    (res,) = run_cases(unit, sim, [rows])
    acc = np.asarray(res.accepted["i"])
    n = K // simd
    assert len(acc) == 4 * n
    if sums >= 8:
        assert acc[-1] - acc[0] + 1 == len(acc)                      # 1.0 beat per cycle
    else:
        # the accumulators take partial_sums beats per 8 cycles within a row and a row's
        # first beat in the cycle after the previous row's last; i follows them once the
        # beat credit (fifo_depth) is used up
        ra, t = [], 0
        for _ in range(4):
            for b in range(n):
                ra.append(t + 8 * (b // sums) + b % sums)
            t = ra[-1] + 1
        D = unit.fifo_depth
        assert acc[D - 1] - acc[0] == D - 1
        np.testing.assert_array_equal(np.diff(acc)[D:], np.diff(ra)[: len(acc) - D - 1])


@pytest.mark.slow
@pytest.mark.parametrize(("idle", "backpressure"), [(0.0, 0.0), (0.3, 0.3)])
def test_pe4_simd8_matches_the_model(idle, backpressure):
    unit, sim = mac(4, 8, 8)
    rng = np.random.default_rng(48)
    run_cases(unit, sim, cases(rng, 4, 8), idle=idle, backpressure=backpressure, seed=9)


@pytest.mark.slow
def test_pe4_simd8_throughput():
    unit, sim = mac(4, 8, 8)
    rng = np.random.default_rng(49)
    rows = operands(rng, pe=4, M=3, K=8 * 80 - 3, bits=8, block_size=64, zp="int", bias=True)
    (res,) = run_cases(unit, sim, [rows])
    acc = np.asarray(res.accepted["i"])
    assert len(acc) == 3 * 80 and acc[-1] - acc[0] + 1 == len(acc)


@pytest.mark.parametrize(("kwargs", "exc", "match"), [
    ({"pe": 0, "simd": 4, "partial_sums": 8}, ValueError, "pe must be in"),
    ({"pe": 65, "simd": 4, "partial_sums": 8}, ValueError, "pe must be in"),
    ({"pe": "2", "simd": 4, "partial_sums": 8}, TypeError, "pe must be an integer"),
    ({"pe": 2, "simd": 3, "partial_sums": 8}, ValueError, "simd must be one of"),
    ({"pe": 2, "simd": 32, "partial_sums": 8}, ValueError, "simd must be one of"),
    ({"pe": 2, "simd": 4.0, "partial_sums": 8}, TypeError, "simd must be an integer"),
    ({"pe": 2, "simd": 4, "partial_sums": 0}, ValueError, "partial_sums must be in"),
    ({"pe": 2, "simd": 4, "partial_sums": 17}, ValueError, "partial_sums must be in"),
    ({"pe": 2, "simd": 4, "partial_sums": True}, TypeError, "partial_sums must be an integer"),
])
def test_errors(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        FloatMac(**kwargs)
