"""The engine-order MatMulNBits model (model/nbits_hw.py, the v2 engine's contract): its order
checked against plain Python loops, and its results against an exact float64 evaluation and
ONNX Runtime within ``1e-6 * sum_k |a_k w_k|`` (float32)."""

from __future__ import annotations

import math
import re
import time

import ml_dtypes
import numpy as np
import pytest

from qaccel.model import nbits, nbits_hw
from qaccel.model import nbits_kernels as kernels
from qaccel.model.nbits_hw import int8_path

from .quant_helpers import assert_bitexact
from .test_nbits import operands

F32 = np.float32


def int8_loop_operands(A, op):
    """(qa, sa, q, zp) of the int8 path's loop twin: A quantised per block as ORT does, the
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


def test_float16_activations_round_at_the_end():
    """float16 A (and scales, bias) give the float32 result of the widened operands, rounded
    once at the end, on both paths."""
    K, N = 64, 6
    ops = operands(4, 32, K, N, "packed", bias=True, dtype=np.float16, seed=3)
    A = np.random.default_rng(3).standard_normal((2, K)).astype(np.float16)
    wide = {k: (v.astype(F32) if v is not None and v.dtype == np.float16 else v)
            for k, v in ops.items()}
    for level in (0, 4):
        kw = dict(K=K, N=N, bits=4, block_size=32, accuracy_level=level)
        got = nbits_hw.matmul_nbits_v2(A, **ops, **kw)
        want = nbits_hw.matmul_nbits_v2(A.astype(F32), **wide, **kw)
        assert got.dtype == np.float16
        assert_bitexact(got, want.astype(np.float16))


def test_engine_paths():
    assert int8_path(4, float_zero_points=False, g_idx=False)
    assert not int8_path(4, float_zero_points=True, g_idx=False)
    assert not int8_path(4, float_zero_points=False, g_idx=True)
    assert not int8_path(3, float_zero_points=False, g_idx=False)


# --------------------------------------------------------------------------- int8 path


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
    op = nbits.NBitsArgs(ops["B"], ops["scales"], ops["zero_points"], None, K=K, N=N, bits=bits,
                   block_size=bs, dtype=np.dtype(F32))
    assert_bitexact(got, loop_int8_v2(A, op, ops["bias"]))


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
                op = nbits.NBitsArgs(ops["B"], ops["scales"], ops["zero_points"], None, K=K, N=N,
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
                        op = nbits.NBitsArgs(c["B"], c["scales"], c["zero_points"], None, K=K,
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


# -------------------------------------------------------------------------- float path


def float_layout(op):
    """The float path's blocks as (group, [k, ...]) in the engine's order: K stably sorted by
    group (g_idx[k], or k // block_size), each group cut into blocks of block_size."""
    K, bs = op.K, op.block_size
    g = [k // bs for k in range(K)] if op.gidx is None else [int(v) for v in op.gidx]
    order = sorted(range(K), key=lambda k: g[k])              # stable: ascending k per group
    blocks = []
    for grp in range(op.kb):
        ks = [k for k in order if g[k] == grp]
        blocks += [(grp, ks[j:j + bs]) for j in range(0, len(ks), bs)]
    return blocks


def digits(X):
    """Four balanced base-256 digits of the Python int X (low first)."""
    out = []
    for _ in range(3):
        x = (X + 128) % 256 - 128
        out.append(x)
        X = (X - x) // 256
    return out + [X]


def loop_float_v2(A, op, bias):
    """The v2 float path (docs/matmul_nbits_v2.md, section 2), one operation at a time, with
    Python integers: A (M, K) of any float type, bias (N,) or None -> (M, N) of A's type."""
    M, K = A.shape
    N, bits, bs = op.N, op.bits, op.block_size
    q = nbits.unpack_nbits(op.Bw.view(np.uint8), bits, bs).reshape(N, -1)
    codes = (nbits.unpack_zero_points(op.zpk, bits, op.kb) if op.zmode == kernels.ZP_PACKED
             else np.full((N, op.kb), 1 << (bits - 1)))
    blocks = float_layout(op)
    out = np.zeros((M, N), F32)
    for m in range(M):
        row = [float(v) for v in A[m]]                       # exact (f16 / bf16 / f32)
        if not all(math.isfinite(v) for v in row):
            out[m] = np.nan
            continue
        xs, es = [], []
        for _, ks in blocks:
            amax = max((abs(row[k]) for k in ks), default=0.0)
            e = max(math.frexp(amax)[1] - 1, -97) if amax else -97
            es.append(e)
            xs.append([digits(math.trunc(row[k] * 2.0 ** (29 - e))) for k in ks])
        for n in range(N):
            acc = F32(0) if bias is None else F32(bias[n])
            for (grp, ks), e, xk in zip(blocks, es, xs, strict=True):
                s = F32(op.scales[n, grp])
                for i in range(4):
                    sa = F32(2.0 ** (e - 29 + 8 * i))
                    if op.zmode == kernels.ZP_FLOAT:
                        z = F32(-s * F32(op.zpf[n, grp]))
                        S = sum(x[i] * int(q[n, k]) for x, k in zip(xk, ks, strict=True))
                        acc = F32(acc + F32(F32(sa * s) * F32(S)))
                        acc = F32(acc + F32(F32(sa * z) * F32(sum(x[i] for x in xk))))
                    else:
                        zp = int(codes[n, grp])
                        d = sum(x[i] * (int(q[n, k]) - zp) for x, k in zip(xk, ks, strict=True))
                        acc = F32(acc + F32(F32(sa * s) * F32(d)))
            out[m, n] = acc
    return out.astype(A.dtype)


def v2_op(ops, K, N, bits, bs, dtype=F32):
    return nbits.NBitsArgs(ops["B"], ops["scales"], ops["zero_points"], ops["g_idx"], K=K, N=N,
                     bits=bits, block_size=bs, dtype=np.dtype(dtype))


def float_exact(A, ops, K, N, bits, bs):
    """``sum_k a_k w_k + bias`` in float64 (w the golden model's float32 weights) and its scale
    ``sum_k |a_k w_k| + |bias|``, both (M, N)."""
    w = nbits.dequantize_nbits(ops["B"], ops["scales"], ops["zero_points"], ops["g_idx"], K=K,
                               N=N, bits=bits, block_size=bs).astype(np.float64)
    a = A.reshape(-1, K).astype(np.float64)
    b = np.zeros(N) if ops["bias"] is None else ops["bias"].astype(np.float64)
    return a @ w.T + b, np.abs(a) @ np.abs(w).T + np.abs(b)


def special_rows(A, bs, rng):
    """A (M >= 6, K) with rows of special blocks: all zero, tiny (subnormal and below
    2**-96), huge, one large element among small ones, and NaN / inf rows."""
    M, K = A.shape
    A[0, :bs] = 0                                              # an all-zero block
    A[1] *= F32(1e-33)                                         # max|a| < 2**-96: e clamped
    A[1, :bs] = rng.standard_normal(bs).astype(F32) * F32(1e-42)   # subnormals only
    A[2] *= F32(1e30)                                          # huge
    A[3, ::bs] = F32(1e4)                                      # one large a per block
    A[3, 1::bs] = F32(3e-5)
    A[4, K // 2] = np.nan
    A[5, K - 1] = -np.inf
    return A


V2_FLOAT_CASES = [  # bits, block_size, K, zero points, zero-point type, g_idx, bias, A type
    (4, 16, 70, "none", F32, False, True, F32),
    (4, 32, 100, "packed", F32, False, False, F32),
    (4, 16, 90, "float", F32, False, True, F32),
    (2, 16, 64, "float", np.float16, False, True, np.float16),
    (2, 32, 80, "packed", F32, False, True, F32),
    (3, 16, 50, "packed", F32, False, False, F32),
    (5, 16, 48, "none", F32, False, True, F32),
    (8, 64, 130, "packed", F32, False, True, F32),
    (8, 16, 40, "float", F32, False, False, F32),
    (4, 16, 75, "none", F32, True, True, F32),
    (4, 16, 64, "packed", F32, True, False, F32),
    (4, 32, 100, "float", F32, True, True, F32),
    (6, 16, 60, "float", np.float16, True, True, np.float16),
    (4, 32, 96, "packed", F32, False, True, np.float16),
    (4, 32, 64, "float", ml_dtypes.bfloat16, True, True, ml_dtypes.bfloat16),
]


@pytest.mark.parametrize("case", V2_FLOAT_CASES, ids=str)
@pytest.mark.parametrize("level", [0, 4])
def test_v2_float_path_is_the_documented_one(case, level):
    bits, bs, K, zp_kind, zdt, g_idx, bias, adt = case
    if level == 4 and zp_kind != "float" and not g_idx:
        level = 2                                             # level 4 is the int8 path
    N = 5
    seed = bits * 100 + bs + K
    ops = operands(bits, bs, K, N, zp_kind, g_idx=g_idx, bias=bias, dtype=zdt, seed=seed)
    if adt != zdt:                                            # f16 A, packed zero points
        ops = {k: (v.astype(adt) if v is not None and v.dtype == zdt else v)
               for k, v in ops.items()}
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore"):                          # float16 A: huge is inf
        A = special_rows(rng.standard_normal((8, K)).astype(F32), bs, rng).astype(adt)
    got = nbits_hw.matmul_nbits_v2(A, **ops, K=K, N=N, bits=bits, block_size=bs,
                                   accuracy_level=level)
    want = loop_float_v2(A, v2_op(ops, K, N, bits, bs, adt), ops["bias"])
    assert got.dtype == adt and got.shape == (8, N)
    assert_bitexact(got, want)
    assert np.isnan(got[4:6]).all() and np.isfinite(got[[0, 3, 6, 7]]).all()


def test_v2_float_path_max_at_a_zero_weight():
    """Blocks whose largest |a| meets a zero weight (q = zp): the small elements keep only
    the bits above 2**(e - 29), exactly as documented; also -0.0, a bias, M = 1."""
    K, N, bits, bs = 64, 4, 4, 16
    rng = np.random.default_rng(7)
    q = rng.integers(0, 16, (N, K // bs, bs))
    zp = rng.integers(0, 16, (N, K // bs))
    q[:, :, 3] = zp                                            # w = 0 at slot 3 of each block
    ops = dict(B=nbits.pack_nbits(q, bits), scales=rng.random((N, K // bs)).astype(F32),
               zero_points=nbits.pack_zero_points(zp, bits), g_idx=None,
               bias=rng.standard_normal(N).astype(F32))
    A = (rng.standard_normal((3, K)) * 1e-3).astype(F32)
    A[:, 3::bs] = F32(2.0 ** 20)
    A[2, 5] = F32(-0.0)
    for rows in (A, A[:1]):
        got = nbits_hw.matmul_nbits_v2(rows, **ops, K=K, N=N, bits=bits, block_size=bs,
                                       accuracy_level=0)
        assert_bitexact(got, loop_float_v2(rows, v2_op(ops, K, N, bits, bs), ops["bias"]))


@pytest.mark.parametrize("zp_kind", ["packed", "float"])
def test_v2_float_path_g_idx_uneven_groups(zp_kind):
    """g_idx with empty groups, a group of several blocks and groups out of order in K."""
    K, N, bits, bs = 80, 3, 4, 16
    ops = operands(bits, bs, K, N, zp_kind, bias=True, seed=5)
    rng = np.random.default_rng(5)
    ops["g_idx"] = np.where(rng.random(K) < 0.4, 0, 3).astype(np.int32)
    ops["g_idx"][[7, 70]] = 4
    A = rng.standard_normal((3, K)).astype(F32)
    op = v2_op(ops, K, N, bits, bs)
    assert [g for g, _ in float_layout(op)] == [0, 0, 3, 3, 3, 4]
    got = nbits_hw.matmul_nbits_v2(A, **ops, K=K, N=N, bits=bits, block_size=bs,
                                   accuracy_level=4)
    assert_bitexact(got, loop_float_v2(A, op, ops["bias"]))


def test_v2_float_operands():
    """The row quantiser's block floating point: digits in range, X = trunc(a * 2**(29 - e))
    recovered, every digit scale a normal float32 power of two, e clamped at -97; g_idx
    laid out group by group."""
    K, N, bs = 96, 3, 16
    ops = operands(4, bs, K, N, "packed", g_idx=True, seed=11)
    op = v2_op(ops, K, N, 4, bs)
    rng = np.random.default_rng(11)
    tiny = np.float32(np.finfo(F32).smallest_subnormal)
    A = (rng.standard_normal((5, K)) * np.logspace(-40, 38, K)).astype(F32)
    A[1] = rng.choice([tiny, -tiny, F32(0), np.finfo(F32).max, -np.finfo(F32).max], K)
    A[2] = 0
    A[3] *= F32(1e-30)
    A[4, 7] = np.inf
    fo = nbits_hw.float_operands(A, op)
    kb = len(float_layout(op))
    assert fo.x.shape == (5, kb, 4, bs) and fo.q.shape == (N, kb, bs)
    assert [list(fo.slots[b][fo.slots[b] >= 0]) for b in range(kb)] == \
        [ks for _, ks in float_layout(op)]
    assert list(fo.group) == [g for g, _ in float_layout(op)]
    x = fo.x.astype(np.int64)
    assert x[:, :, :3].min() >= -128 and x[:, :, :3].max() <= 127
    assert x[:, :, 3].min() >= -64 and x[:, :, 3].max() <= 64
    X = x[:, :, 0] + 256 * x[:, :, 1] + 65536 * x[:, :, 2] + (1 << 24) * x[:, :, 3]
    a = np.where(fo.slots >= 0, A[:, np.maximum(fo.slots, 0)], 0).astype(np.float64)
    a[~np.isfinite(a)] = 0
    want = np.trunc(a * np.ldexp(1.0, 29 - fo.e)[:, :, None])
    np.testing.assert_array_equal(X, want)
    assert np.abs(X).max() < 2**30
    assert fo.e.min() >= -97 and (fo.e[2] == -97).all()
    good = np.isfinite(fo.sa)
    assert (fo.sa[good] >= np.finfo(F32).smallest_normal).all()
    np.testing.assert_array_equal(fo.sa[good], np.ldexp(F32(1), np.frexp(fo.sa[good])[1] - 1))
    assert np.isnan(fo.sa[4]).any() and not np.isnan(fo.sa[:4]).any()


@pytest.mark.parametrize(("bad", "exc"), [
    (dict(g_idx=np.zeros(32, np.int64)), TypeError),
    (dict(g_idx=np.full(32, 2, np.int32)), ValueError),
    (dict(zero_points=np.ones((2, 2), np.float16)), TypeError),
    (dict(zero_points=np.ones((2, 3), F32)), ValueError),
    (dict(scales=np.ones((2, 2), np.float16)), TypeError),
    (dict(bias=np.ones(2, np.float16)), TypeError),
    (dict(bias=np.ones(3, F32)), ValueError),
    (dict(B=np.zeros((2, 2, 7), np.uint8)), ValueError),
    (dict(A=np.ones((1, 31), F32)), ValueError),
    (dict(A=np.ones((1, 32), np.float64)), TypeError),
    (dict(bits=9), ValueError),
    (dict(block_size=24), ValueError),
    (dict(accuracy_level=-1), ValueError),
])
def test_v2_float_path_errors_as_the_golden_model(bad, exc):
    ops = operands(4, 16, 32, 2, "float")
    call = dict(A=np.ones((1, 32), F32), **ops, K=32, N=2, bits=4, block_size=16,
                accuracy_level=0)
    call.update(bad)
    with pytest.raises(exc) as golden:
        nbits.matmul_nbits(**call)
    with pytest.raises(exc, match="^" + re.escape(str(golden.value)) + "$"):
        nbits_hw.matmul_nbits_v2(**call)


def test_v2_float_path_speed():
    """K = N = 4096, M = 1 (the decode GEMV) in well under a few seconds, integer and float
    zero points, once compiled."""
    K = N = 4096
    bs = 32
    rng = np.random.default_rng(0)
    A = rng.standard_normal((1, K)).astype(F32)
    B = rng.integers(0, 256, (N, K // bs, bs // 2), dtype=np.uint8)
    S = rng.random((N, K // bs)).astype(F32)
    for Z in (rng.integers(0, 256, (N, K // bs // 2), dtype=np.uint8), S * F32(7.5)):
        seconds = []
        for _ in range(2):                  # the first compiles or loads the kernel
            t0 = time.perf_counter()
            nbits_hw.matmul_nbits_v2(A, B, S, Z, K=K, N=N, bits=4, block_size=bs,
                                     accuracy_level=0)
            seconds.append(time.perf_counter() - t0)
        assert seconds[1] < 2.0, (Z.dtype, seconds)


def float_points(family, block_sizes, Ks):
    """(bits, block_size, K, zero points, g_idx, bias) of one family of the float64 sweep:
    ``bits b`` (packed zero points and a bias at the first K, none at the others), ``g_idx``
    (4 bits, every kind of zero point), ``float zp`` (2 and 4 bits)."""
    pts = []
    for j, K in enumerate(Ks):
        for bs in block_sizes:
            if family.startswith("bits"):
                pts.append((int(family[4:]), bs, K, "packed" if j == 0 else "none", False,
                            j == 0))
            elif family == "g_idx":
                pts += [(4, bs, K, z, True, j == 0) for z in ("none", "packed", "float")]
            else:
                pts += [(2, bs, K, "float", False, j == 0), (4, bs, K, "float", False, j != 0)]
    return pts


FAMILIES = [f"bits{b}" for b in range(2, 9)] + ["g_idx", "float zp"]


def float_sweep(family, block_sizes, Ks, M, N, dists):
    """Worst |y - y64| / (sum_k |a_k w_k| + |bias|) over a family's points and the
    activation distributions, and where."""
    worst, where = 0.0, None
    points = float_points(family, block_sizes, Ks)
    for bits, bs, K, zp_kind, g_idx, bias in points:
        seed = bits * 1000 + bs + K + 7 * g_idx
        ops = operands(bits, bs, K, N, zp_kind, g_idx=g_idx, bias=bias, seed=seed)
        for name, dist in dists.items():
            A = dist(np.random.default_rng(seed), (M, K)).astype(F32)
            y = nbits_hw.matmul_nbits_v2(A, **ops, K=K, N=N, bits=bits, block_size=bs,
                                         accuracy_level=0)
            exact, scale = float_exact(A, ops, K, N, bits, bs)
            ratio = float((np.abs(y.astype(np.float64) - exact) / scale).max())
            if ratio > worst:
                worst, where = ratio, (bits, bs, K, zp_kind, name)
    return worst, where, len(points) * len(dists)


DISTS = {"normal": lambda rng, shape: rng.standard_normal(shape)}
SLOW_DISTS = {
    **DISTS,
    "uniform": lambda rng, shape: rng.random(shape) - 0.5,
    "heavy": lambda rng, shape: rng.standard_t(2, shape),
    "outliers": lambda rng, shape: rng.standard_normal(shape) * np.where(
        rng.random(shape) < 0.01, 100.0, 1.0),
}
BLOCK_SIZES = (16, 32, 64, 128, 256)


def _check_float64(family, capsys, label, block_sizes, ks, M, N, dists):
    worst, where, count = float_sweep(family, block_sizes, ks, M=M, N=N, dists=dists)
    with capsys.disabled():
        print(f"\nv2 float path vs float64, {label}{family} ({count} calls): worst "
              f"|y - y64| / (sum|aw| + |bias|) = {worst:.3g} at {where}")
    assert worst <= 1e-6


@pytest.mark.parametrize("family", FAMILIES)
def test_v2_float_path_within_bound_of_float64(family, capsys):
    """|y - y64| <= 1e-6 * (sum_k |a_k w_k| + |bias|), y64 the exact sum in float64 of A and
    the golden model's weights, every block size at K 4096 and 1000."""
    _check_float64(family, capsys, "", BLOCK_SIZES, (4096, 1000), 2, 6, DISTS)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_v2_float_path_within_bound_of_float64_sweep(family, capsys):
    _check_float64(family, capsys, "slow sweep, ", (*BLOCK_SIZES, 512), (4096, 1000, 11008),
                   8, 32, SLOW_DISTS)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_v2_float_path_bias_dominated(family, capsys):
    """Small activations (ReLU outputs times 1e-3) under an O(1) bias: the lane starts at the
    bias, so each of the ``4 k_blocks`` (``8 k_blocks``) additions rounds at the bias's
    magnitude. Without a bias the 1e-6 bound holds; with one the error stays within
    ``1e-6 (sum|aw| + |bias|) + n_terms 2**-24 |bias|`` (the bias-first order's own bound)
    and goes past 1e-6 (sum|aw| + |bias|) (measured, printed)."""
    relu = {"relu": lambda rng, shape: np.maximum(rng.standard_normal(shape), 0) * 1e-3}
    worst, worst_bias, where, count = 0.0, 0.0, None, 0
    for bits, bs, K, zp_kind, g_idx, _ in float_points(family, BLOCK_SIZES, (4096, 1000)):
        N, seed = 32, bits * 1000 + bs + K + 7 * g_idx
        ops = operands(bits, bs, K, N, zp_kind, g_idx=g_idx, bias=True, seed=seed)
        A = relu["relu"](np.random.default_rng(seed), (8, K)).astype(F32)
        kw = dict(K=K, N=N, bits=bits, block_size=bs, accuracy_level=0)
        n_terms = nbits_hw.float_operands(A, v2_op(ops, K, N, bits, bs)).x.shape[1] * (
            8 if zp_kind == "float" else 4)
        for bias in (None, ops["bias"]):
            y = nbits_hw.matmul_nbits_v2(A, **{**ops, "bias": bias}, **kw)
            exact, scale = float_exact(A, {**ops, "bias": bias}, K, N, bits, bs)
            err = np.abs(y.astype(np.float64) - exact)
            ratio = float((err / scale).max())
            if bias is None:
                worst = max(worst, ratio)
                continue
            assert np.all(err <= 1e-6 * scale + n_terms * 2.0**-24 * np.abs(bias))
            if ratio > worst_bias:
                worst_bias, where = ratio, (bits, bs, K, zp_kind)
            count += 1
    with capsys.disabled():
        print(f"\nv2 float path, ReLU * 1e-3 activations, {family} ({count} x 2 calls): worst "
              f"|y - y64| / (sum|aw| + |bias|) = {worst:.3g} without a bias, "
              f"{worst_bias:.3g} with an N(0, 1) bias (at {where})")
    assert worst <= 1e-6


def ort_float_keys(family):
    """(level, key) of one family of the ORT matrix (``bits b zp`` or ``g_idx``) where ORT
    takes its float32 path and is right: level 0, and level 4 with float zero points or
    g_idx; g_idx at 4 bits without packed zero points (with g_idx ORT ignores them, misreads
    2-bit B and rejects 8 bits)."""
    keys = []
    if family == "g_idx":
        for zp_kind in ("none", "float"):
            for bs, K in ((16, 200), (64, 256)):
                for level in (0, 4):
                    keys.append((level, (4, bs, K, zp_kind, True, True, "float32", "ort")))
        return keys
    bits, zp_kind = int(family[4]), family.split()[1]
    for bs in BLOCK_SIZES:
        for K in (256, 200):
            for bias in (False, True):
                key = (bits, bs, K, zp_kind, False, bias, "float32",
                       "ort" if K == 256 else "qaccel")
                keys += [(0, key)] + ([(4, key)] if zp_kind == "float" else [])
    for bs, K in ((32, 256), (128, 200)):
        keys.append((0, (bits, bs, K, zp_kind, False, True, "float16", "ort")))
    return keys


def ort_families():
    from .test_nbits_ort import BITS_ZP

    return [f"bits{b} {z}" for b, z in BITS_ZP] + ["g_idx"]


def ort_distance(family, capsys):
    """ORT's float32 path on a family of the ORT matrix: |y - y_ort| <= 1e-6 * (sum_k
    |a_k w_k| + |bias|) (the float32 accumulation bound) for float32 A; for float16 A that
    plus one float16 ulp of the larger (each side rounded once to float16), whatever kernel
    ORT's CPU dispatch picked."""
    from .test_nbits_ort import N as ORT_N
    from .test_nbits_ort import activations, case, session

    worst, worst16, count = 0.0, 0.0, 0
    for level, key in ort_float_keys(family):
        bits, bs, K = key[:3]
        c = case(*key)
        for M in (1, 7):
            A = activations(M, K, key[6])
            (y_ort,) = session(level, *key).run(None, {"A": A})
            y = nbits_hw.matmul_nbits_v2(A, **c, K=K, N=ORT_N, bits=bits, block_size=bs,
                                         accuracy_level=level)
            err = np.abs(y.astype(np.float64) - y_ort.astype(np.float64))
            _, scale = float_exact(A, c, K, ORT_N, bits, bs)
            if y.dtype == np.float16:
                ulp = np.spacing(np.maximum(np.abs(y), np.abs(y_ort))).astype(np.float64)
                worst16 = max(worst16, float((err / (1e-6 * scale + ulp)).max()))
            else:
                worst = max(worst, float((err / scale).max()))
            count += 1
    with capsys.disabled():
        print(f"\nv2 float path vs ONNX Runtime's float32 path, {family} ({count} calls): "
              f"worst |y - y_ort| / (sum|aw| + |bias|) = {worst:.3g}"
              + (f"; float16 A: {worst16:.3g} of the bound" if family != "g_idx" else ""))
    assert worst <= 1e-6 and worst16 <= 1


@pytest.mark.parametrize("family", ort_families())
def test_v2_float_path_distance_to_onnx_runtime(family, capsys):
    ort_distance(family, capsys)
