"""The engine-order MatMulNBits model (model/nbits_hw.py): its order checked against plain
Python loops, and its results against the golden model and ONNX Runtime within
``1e-6 * sum_k |a_k w_k|`` (float32)."""

from __future__ import annotations

import numpy as np
import pytest

from qaccel.model import nbits, nbits_hw
from qaccel.model import nbits_kernels as kernels
from qaccel.model.config import AccelConfig
from qaccel.model.nbits_hw import int8_path, matmul_nbits_hw

from .test_nbits import operands

F32 = np.float32


def tolerance(A, w):
    """1e-6 * sum_k |a_k w_k| per output (M, N)."""
    return 1e-6 * (np.abs(A.astype(np.float64)) @ np.abs(w.astype(np.float64)).T)


def loop_float_path(A, w, simd, lat):
    """The float path's order, one float32 operation at a time."""
    M, K = A.shape
    out = np.zeros((M, w.shape[0]), F32)
    for m in range(M):
        for n in range(w.shape[0]):
            part = [[F32(0)] * lat for _ in range(simd)]
            for k in range(K):
                j, r = k % simd, (k // simd) % lat
                part[j][r] = F32(part[j][r] + F32(A[m, k] * w[n, k]))
            lanes = []
            for j in range(simd):
                t = part[j][0]
                for r in range(1, lat):
                    t = F32(t + part[j][r])
                lanes.append(t)
            while len(lanes) > 1:
                lanes = [F32(lanes[i] + lanes[i + 1]) for i in range(0, len(lanes), 2)]
            out[m, n] = lanes[0]
    return out


def int8_loop_operands(A, op):
    """(qa, sa, q, zp) of the int8 paths' loop twins: A quantised per block as ORT does, the
    raw codes (N, k_blocks * block_size) and the integer zero points (N, k_blocks)."""
    M, K = A.shape
    bs, kb = op.block_size, op.kb
    padded = np.zeros((M, kb * bs), F32)
    padded[:, :K] = A
    qa, sa, _ = kernels.quantize_a(padded, bs)
    q = nbits.unpack_nbits(op.Bw.view(np.uint8), op.bits, bs).reshape(op.N, kb * bs)
    zp = (nbits.unpack_zero_points(op.zpk, op.bits, kb) if op.zmode == kernels.ZP_PACKED
          else np.full((op.N, kb), 1 << (op.bits - 1)))
    return qa, sa, q, zp


def loop_int8_path(A, op, lat):
    """The int8 path's order, one operation at a time."""
    M, K = A.shape
    bs, kb = op.block_size, op.kb
    qa, sa, q, zp = int8_loop_operands(A, op)
    out = np.zeros((M, op.N), F32)
    for m in range(M):
        for n in range(op.N):
            part = [F32(0)] * lat
            for b in range(kb):
                ks = range(b * bs, min(K, (b + 1) * bs))
                isum = sum(int(qa[m, k]) * int(q[n, k]) for k in ks)
                asum = sum(int(qa[m, k]) for k in ks)
                s = op.scales[n, b]
                t1 = F32(F32(sa[m, b] * s) * F32(isum))
                t2 = F32(F32(sa[m, b] * F32(asum)) * F32(-s * F32(zp[n, b])))
                part[b % lat] = F32(part[b % lat] + F32(t1 + t2))
            t = part[0]
            for r in range(1, lat):
                t = F32(t + part[r])
            out[m, n] = t
    return out


@pytest.mark.parametrize(("simd", "lat"), [(1, 1), (4, 3), (8, 8), (16, 7)])
@pytest.mark.parametrize("zp_kind", ["none", "packed", "float"])
def test_float_path_order_is_the_documented_one(simd, lat, zp_kind):
    K, N, bs = 70, 5, 16
    ops = operands(4, bs, K, N, zp_kind, seed=simd + lat)
    A = np.random.default_rng(1).standard_normal((3, K)).astype(F32)
    config = AccelConfig(simd=simd, partial_sums=lat)
    got = matmul_nbits_hw(A, **{k: v for k, v in ops.items() if k != "bias"}, K=K, N=N,
                          bits=4, block_size=bs, accuracy_level=0, config=config)
    w = nbits.dequantize_nbits(ops["B"], ops["scales"], ops["zero_points"], K=K, N=N, bits=4,
                               block_size=bs)
    np.testing.assert_array_equal(got, loop_float_path(A, w, simd, lat))


@pytest.mark.parametrize("lat", [1, 3, 8])
@pytest.mark.parametrize(("bits", "zp_kind"), [(4, "none"), (4, "packed"), (3, "packed"),
                                               (8, "none"), (2, "packed")])
def test_int8_path_order_is_the_documented_one(lat, bits, zp_kind):
    K, N, bs = 100, 4, 32
    ops = operands(bits, bs, K, N, zp_kind, seed=bits * 10 + lat)
    A = np.random.default_rng(2).standard_normal((2, K)).astype(F32)
    got = matmul_nbits_hw(A, ops["B"], ops["scales"], ops["zero_points"], K=K, N=N, bits=bits,
                          block_size=bs, accuracy_level=4,
                          config=AccelConfig(partial_sums=lat))
    op = nbits._Op(ops["B"], ops["scales"], ops["zero_points"], None, K=K, N=N, bits=bits,
                   block_size=bs, dtype=np.dtype(F32))
    np.testing.assert_array_equal(got, loop_int8_path(A, op, lat))


CASES = [  # bits, block_size, K, zero points, g_idx, bias
    (4, 32, 256, "packed", False, True),
    (4, 32, 200, "none", False, False),
    (2, 16, 96, "packed", False, True),
    (8, 64, 300, "none", False, True),
    (3, 32, 128, "packed", False, False),
    (5, 16, 80, "none", False, True),
    (6, 128, 256, "packed", False, False),
    (7, 256, 256, "none", False, True),
    (4, 32, 128, "float", False, True),
    (4, 16, 64, "packed", True, False),
]


@pytest.mark.parametrize("level", [0, 4])
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("simd", [1, 8, 16])
def test_hw_order_within_tolerance_of_golden(case, level, simd):
    bits, bs, K, zp_kind, g_idx, bias = case
    N = 12
    ops = operands(bits, bs, K, N, zp_kind, g_idx=g_idx, bias=bias, seed=K + bits)
    A = np.random.default_rng(K).standard_normal((2, 3, K)).astype(F32)   # rank 3
    kw = dict(K=K, N=N, bits=bits, block_size=bs, accuracy_level=level)
    got = matmul_nbits_hw(A, **ops, **kw, config=AccelConfig(simd=simd))
    want = nbits.matmul_nbits(A, **ops, **kw)
    assert got.shape == want.shape == (2, 3, N) and got.dtype == F32
    w = nbits.dequantize_nbits(ops["B"], ops["scales"], ops["zero_points"], ops["g_idx"],
                               K=K, N=N, bits=bits, block_size=bs)
    tol = tolerance(A.reshape(-1, K), w).reshape(got.shape)
    assert np.all(np.abs(got.astype(np.float64) - want) <= tol)


def test_hw_order_against_onnx_runtime():
    """Both paths of ORT (float32 at level 0, CompInt8 at level 4) on ORT-quantised weights."""
    from .test_nbits_ort import N as ORT_N
    from .test_nbits_ort import activations, case, session

    for level in (0, 4):
        for key in ((4, 32, 256, "packed"), (4, 64, 200, "none"), (8, 32, 128, "none"),
                    (2, 32, 128, "packed")):
            bits, bs, K, zp_kind = key
            ops = case(bits, bs, K, zp_kind)
            A = activations(5, K)
            (want,) = session(level, *key).run(None, {"A": A})
            got = matmul_nbits_hw(A, ops["B"], ops["scales"], ops["zero_points"], K=K, N=ORT_N,
                                  bits=bits, block_size=bs, accuracy_level=level)
            w = nbits.dequantize_nbits(ops["B"], ops["scales"], ops["zero_points"], K=K,
                                       N=ORT_N, bits=bits, block_size=bs)
            assert np.all(np.abs(got.astype(np.float64) - want) <= tolerance(A, w)), key


def test_float16_activations_round_at_the_end():
    K, N = 64, 6
    ops = operands(4, 32, K, N, "packed", bias=True, dtype=np.float16, seed=3)
    A = np.random.default_rng(3).standard_normal((2, K)).astype(np.float16)
    got = matmul_nbits_hw(A, **ops, K=K, N=N, bits=4, block_size=32)
    wide = {k: (v.astype(F32) if v is not None and v.dtype == np.float16 else v)
            for k, v in ops.items()}
    want = matmul_nbits_hw(A.astype(F32), **wide, K=K, N=N, bits=4, block_size=32)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, want.astype(np.float16))


def test_engine_paths():
    assert int8_path(4, float_zero_points=False, g_idx=False)
    assert not int8_path(4, float_zero_points=True, g_idx=False)
    assert not int8_path(4, float_zero_points=False, g_idx=True)
    assert not int8_path(3, float_zero_points=False, g_idx=False)


def test_errors_name_the_parameter():
    ops = operands(4, 16, 32, 2, "none")
    kw = dict(K=32, N=2, bits=4, block_size=16)
    A = np.ones((1, 32), F32)
    with pytest.raises(TypeError, match="config must be an AccelConfig"):
        matmul_nbits_hw(A, **ops, **kw, config={"simd": 4})
    with pytest.raises(ValueError, match=r"bits 4 is not carried by this engine"):
        matmul_nbits_hw(A, **ops, **kw, config=AccelConfig(nbits=(2, 8)))
    with pytest.raises(ValueError, match="A's last dimension must be K=32"):
        matmul_nbits_hw(np.ones((1, 31), F32), **ops, **kw)
    with pytest.raises(ValueError, match="accuracy_level must be in"):
        matmul_nbits_hw(A, **ops, **kw, accuracy_level=5)
    with pytest.raises(ValueError, match="bias must have shape"):
        matmul_nbits_hw(A, ops["B"], ops["scales"], bias=np.ones(3, F32), **kw)


# --------------------------------------------------------------------------- v2 engine


def loop_int8_v2(A, op, bias):
    """The v2 int8 path (docs/matmul_nbits_v2.md, section 1), one operation at a time."""
    M, K = A.shape
    bs, kb = op.block_size, op.kb
    qa, sa, q, zp = int8_loop_operands(A, op)
    out = np.zeros((M, op.N), F32)
    for m in range(M):
        for n in range(op.N):
            acc = F32(0) if bias is None else F32(bias[n])
            for b in range(kb):
                ks = range(b * bs, min(K, (b + 1) * bs))
                d = sum(int(qa[m, k]) * (int(q[n, k]) - int(zp[n, b])) for k in ks)
                acc = F32(acc + F32(F32(sa[m, b] * op.scales[n, b]) * F32(d)))
            out[m, n] = acc
    return out


def v2_exact(A, op, bias):
    """The v2 int8 path's math in float64 (a' = qa * sa, w = (q - zp) * sb) and its scale
    ``sum_k |a'_k w_k| + |bias|``, both (M, N)."""
    qa, q, sa, zp = nbits_hw._int8_operands(A, op)
    a1 = qa * sa.astype(np.float64)[:, :, None]                         # (M, kb, bs)
    w = (q - zp[:, :, None]) * op.scales.astype(np.float64)[:, :, None]  # (N, kb, bs)
    b = np.zeros(op.N) if bias is None else bias.astype(np.float64)
    exact = np.einsum("mbk,nbk->mn", a1, w) + b
    scale = np.einsum("mbk,nbk->mn", np.abs(a1), np.abs(w)) + np.abs(b)
    return exact, scale


@pytest.mark.parametrize(("bits", "zp_kind", "K", "bs", "bias"), [
    (4, "packed", 100, 32, True), (4, "none", 64, 16, False), (2, "packed", 70, 16, True),
    (3, "packed", 96, 32, False), (8, "none", 130, 64, True), (5, "packed", 48, 16, True)])
def test_v2_order_is_the_documented_one(bits, zp_kind, K, bs, bias):
    N = 5
    ops = operands(bits, bs, K, N, zp_kind, bias=bias, seed=bits * 7 + K)
    A = np.random.default_rng(K).standard_normal((3, K)).astype(F32)
    A[1, :bs] *= 1e-3                                          # blocks of different scales
    got = nbits_hw.matmul_nbits_v2(A, **ops, K=K, N=N, bits=bits, block_size=bs,
                                   accuracy_level=4)
    op = nbits._Op(ops["B"], ops["scales"], ops["zero_points"], None, K=K, N=N, bits=bits,
                   block_size=bs, dtype=np.dtype(F32))
    np.testing.assert_array_equal(got, loop_int8_v2(A, op, ops["bias"]))


def test_v2_within_bound_of_float64(capsys):
    """|y - y64| <= 1e-6 * (sum_k |a'_k w_k| + |bias|) against an exact evaluation of the same
    math, over every width, block size and long rows (up to 256 blocks of 16)."""
    worst = 0.0
    for bits in range(2, 9):
        for bs in (16, 32, 64, 128, 256):
            for K, zp_kind, bias in ((4096, "packed", True), (1000, "none", False)):
                N = 6
                ops = operands(bits, bs, K, N, zp_kind, bias=bias, seed=bits + bs + K)
                A = np.random.default_rng(bits * bs).standard_normal((2, K)).astype(F32)
                y = nbits_hw.matmul_nbits_v2(A, **ops, K=K, N=N, bits=bits, block_size=bs,
                                             accuracy_level=4)
                op = nbits._Op(ops["B"], ops["scales"], ops["zero_points"], None, K=K, N=N,
                               bits=bits, block_size=bs, dtype=np.dtype(F32))
                exact, scale = v2_exact(A, op, ops["bias"])
                ratio = np.abs(y.astype(np.float64) - exact) / scale
                worst = max(worst, float(ratio.max()))
    with capsys.disabled():
        print(f"\nv2 int8 path vs float64: worst |y - y64| / (sum|a'w| + |bias|) = {worst:.3g}")
    assert worst <= 1e-6


def test_v2_distance_to_onnx_runtime(capsys):
    """The existing ORT matrix wherever ORT takes its int8 path (level 4): the distance is
    reported and bounded by 1e-6 * (sum_k |a'_k w_k| + |bias|) (a' ORT's quantised A)."""
    from .test_nbits_ort import N as ORT_N
    from .test_nbits_ort import activations, case, ort_level4_path, session

    worst, count = 0.0, 0
    for bits in (2, 4, 8):
        for zp_kind in ("none", "packed"):
            for bs in (16, 32, 64, 128, 256):
                if ort_level4_path(bits, bs, zp_kind, False) != "int8":
                    continue
                for K, bias in ((256, True), (200, False)):
                    key = (bits, bs, K, zp_kind, False, bias, "float32", "ort")
                    c = case(*key)
                    for M in (1, 7):
                        A = activations(M, K)
                        (y_ort,) = session(4, *key).run(None, {"A": A})
                        y = nbits_hw.matmul_nbits_v2(A, **c, K=K, N=ORT_N, bits=bits,
                                                     block_size=bs, accuracy_level=4)
                        op = nbits._Op(c["B"], c["scales"], c["zero_points"], None, K=K,
                                       N=ORT_N, bits=bits, block_size=bs,
                                       dtype=np.dtype(F32))
                        _, scale = v2_exact(A, op, c["bias"])
                        err = np.abs(y.astype(np.float64) - y_ort.astype(np.float64))
                        worst = max(worst, float((err / scale).max()))
                        count += 1
    with capsys.disabled():
        print(f"\nv2 int8 path vs ONNX Runtime (level 4, {count} calls): worst "
              f"|y - y_ort| / (sum|a'w| + |bias|) = {worst:.3g}")
    assert count >= 40 and worst <= 1e-6


def test_v2_refuses_the_float_path():
    ops = operands(4, 16, 32, 2, "float")
    with pytest.raises(ValueError, match="float path is not built yet: accuracy_level 4, "
                                         "zero points float"):
        nbits_hw.matmul_nbits_v2(np.ones((1, 32), F32), **ops, K=32, N=2, bits=4,
                                 block_size=16, accuracy_level=4)
    with pytest.raises(ValueError, match="accuracy_level 0"):
        nbits_hw.matmul_nbits_v2(np.ones((1, 32), F32), **operands(4, 16, 32, 2, "none"),
                                 K=32, N=2, bits=4, block_size=16, accuracy_level=0)
