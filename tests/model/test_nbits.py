"""MatMulNBits golden model and block quantiser: kernels vs their NumPy twins, packing, errors.

The comparisons with ONNX Runtime are in test_nbits_ort.py.
"""

from __future__ import annotations

import ml_dtypes
import numba
import numpy as np
import pytest

from qaccel.model import nbits
from qaccel.model import nbits_kernels as kernels

from . import naive_nbits as naive
from .quant_helpers import assert_bitexact

BF16 = np.dtype(ml_dtypes.bfloat16)


def operands(bits, block_size, K, N, zp_kind, *, g_idx=False, bias=False, dtype=np.float32, seed=0):
    """Random MatMulNBits operands (B from the qaccel quantiser, so realistic scales)."""
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((K, N)).astype(np.float32)
    B, S, Z = nbits.quantize_weights_nbits(
        W, bits=bits, block_size=block_size, symmetric=zp_kind == "none"
    )
    kb = S.shape[1]
    if zp_kind == "float":
        Z = (rng.random((N, kb)) * (2**bits - 1)).astype(dtype)
    return dict(
        B=B,
        scales=S.astype(dtype),
        zero_points=None if zp_kind == "none" else Z,
        g_idx=rng.integers(0, kb, K).astype(np.int32) if g_idx else None,
        bias=rng.standard_normal(N).astype(dtype) if bias else None,
    )


# --------------------------------------------------------------------------- bit streams


def test_pack_layout_examples():
    # 4 bits: element 0 in the low nibble
    np.testing.assert_array_equal(nbits.pack_nbits([1, 2, 3], 4), [0x21, 0x03])
    # 2 bits: element 0 in bits 1:0
    np.testing.assert_array_equal(nbits.pack_nbits([1, 2, 3, 0, 3], 2), [0x39, 0x03])
    # 3 bits cross bytes: 0b111 at bits [6, 9)
    np.testing.assert_array_equal(nbits.pack_nbits([0, 0, 7], 3), [0xC0, 0x01])
    # 5 bits: 0b10101 at bits [5, 10)
    np.testing.assert_array_equal(nbits.pack_nbits([0, 0b10101], 5), [0xA0, 0x02])


@pytest.mark.parametrize("bits", range(2, 9))
def test_pack_unpack_vs_naive(bits):
    rng = np.random.default_rng(bits)
    for count in (1, 5, 16, 37, 256):
        v = rng.integers(0, 2**bits, (3, 4, count))
        packed = nbits.pack_nbits(v, bits)
        np.testing.assert_array_equal(packed, naive.pack_bits(v, bits))
        assert packed.shape == (3, 4, -(-count * bits // 8))
        np.testing.assert_array_equal(nbits.unpack_nbits(packed, bits, count), v)
        np.testing.assert_array_equal(naive.unpack_bits(packed, bits, count), v)


@pytest.mark.parametrize("bits", range(2, 9))
def test_pack_zero_points(bits):
    z = np.random.default_rng(bits).integers(0, 2**bits, (5, 7))
    packed = nbits.pack_zero_points(z, bits)
    assert packed.shape == (5, -(-7 * bits // 8))
    np.testing.assert_array_equal(nbits.unpack_zero_points(packed, bits, 7), z)
    slots = 8 * packed.shape[1] // bits
    np.testing.assert_array_equal(nbits.unpack_nbits(packed, bits, slots)[:, 7:], 2 ** (bits - 1))


# --------------------------------------------------------------------------- quantiser


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("bits", range(2, 9))
def test_quantizer_vs_naive(bits, symmetric, dtype):
    rng = np.random.default_rng(bits)
    half = dtype == np.float16
    for block_size, K in ((16, 40), (32, 96), (64, 64), (512, 700)):
        W = rng.standard_normal((K, 9)).astype(dtype)
        W[:, 1] = rng.integers(-4, 5, K) * 0.5  # ties
        W[:block_size, 2] = 0.0
        W32 = W.astype(np.float32)
        q, s, z = kernels.quantize_blockwise(W32, bits, block_size, symmetric, half)
        q_ref, s_ref, z_ref = naive.quantize_blockwise(W32, bits, block_size, symmetric, half)
        np.testing.assert_array_equal(q, q_ref)
        np.testing.assert_array_equal(s.view(np.uint32), s_ref.view(np.uint32))
        np.testing.assert_array_equal(z, z_ref)
        B, S, Z = nbits.quantize_weights_nbits(
            W, bits=bits, block_size=block_size, symmetric=symmetric
        )
        kb = -(-K // block_size)
        np.testing.assert_array_equal(B, naive.pack_bits(q.reshape(9, kb, block_size), bits))
        np.testing.assert_array_equal(S, s.astype(dtype))
        assert S.dtype == dtype and (Z is None) == symmetric


def test_quantizer_conventions():
    W = np.array([[2.0, 0.0, 1.0], [-4.0, 0.0, 3.0], [1.0, 0.0, 0.5], [3.0, 0.0, 1.0]], np.float32)
    W = np.tile(W, (4, 1))  # K = 16, one block per column
    B, S, Z = nbits.quantize_weights_nbits(W, bits=4, block_size=16, symmetric=True)
    # m = -4: s = -4/-8 = 0.5; all-zero column: s = -0.0; m = 3: s = -0.375 (negative)
    assert_bitexact(S[:, 0], np.float32([0.5, -0.0, -0.375]))
    q = nbits.unpack_nbits(B, 4, 16)[:, 0]
    np.testing.assert_array_equal(q[1], 8)  # 1/s taken as 0: q = zp
    assert q[0, 0] == 12 and q[0, 1] == 0  # 2/0.5 + 8, -4/0.5 + 8
    B, S, Z = nbits.quantize_weights_nbits(W, bits=4, block_size=16, symmetric=False)
    zp = nbits.unpack_zero_points(Z, 4, 1)[:, 0]
    np.testing.assert_array_equal(zp, [round(4 / (7 / 15)), 0, 0])
    assert S[1, 0] == 0.0
    # s = 3/15, 1/s = 5: roundf rounds 0.5 * 5 = 2.5 away from zero, to 3
    q = nbits.unpack_nbits(B, 4, 16)[2, 0]
    np.testing.assert_array_equal(q[:4], [5, 15, 3, 5])


# --------------------------------------------------------------------------- MatMulNBits


CONFIGS = [
    # bits, block_size, K, zp_kind, g_idx
    (2, 16, 70, "packed", False),
    (3, 32, 96, "packed", False),
    (3, 16, 61, "float", True),
    (4, 32, 256, "none", False),
    (4, 64, 200, "packed", True),
    (5, 16, 100, "none", True),
    (6, 64, 130, "packed", False),
    (7, 128, 300, "float", False),
    (8, 16, 48, "packed", True),
    (8, 512, 600, "none", False),
    (2, 256, 300, "float", False),
    (5, 1024, 1100, "packed", False),  # a block sum of 1024 products: exact in chunks
]


@pytest.mark.parametrize("level", [0, 4])
@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_matmul_vs_naive(config, level):
    """Bit-exact with the twin: same dequantisation and the same defined accumulation order."""
    bits, block_size, K, zp_kind, g_idx = config
    ops = operands(bits, block_size, K, 19, zp_kind, g_idx=g_idx, bias=True, seed=K)
    for M in (1, 3, 8):
        A = np.random.default_rng(M).standard_normal((M, K)).astype(np.float32)
        y = nbits.matmul_nbits(
            A, **ops, K=K, N=19, bits=bits, block_size=block_size, accuracy_level=level
        )
        y_ref = naive.matmul_nbits(
            A, **ops, K=K, N=19, bits=bits, block_size=block_size, accuracy_level=level
        )
        assert y.dtype == np.float32 and y.shape == (M, 19)
        assert_bitexact(y, y_ref)


@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("level", [0, 4])
def test_matmul_low_precision_vs_naive(dtype, level):
    for zp_kind in ("none", "packed", "float"):
        ops = operands(4, 32, 80, 10, zp_kind, bias=True, dtype=dtype)
        A = np.random.default_rng(1).standard_normal((2, 3, 80)).astype(dtype)
        y = nbits.matmul_nbits(A, **ops, K=80, N=10, bits=4, block_size=32, accuracy_level=level)
        assert y.dtype == dtype and y.shape == (2, 3, 10)
        assert_bitexact(
            y, naive.matmul_nbits(A, **ops, K=80, N=10, bits=4, block_size=32, accuracy_level=level)
        )


def test_accuracy_levels_1_to_3_are_level_0():
    ops = operands(4, 32, 64, 8, "packed")
    A = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    ys = [
        nbits.matmul_nbits(A, **ops, K=64, N=8, bits=4, block_size=32, accuracy_level=lv)
        for lv in range(5)
    ]
    for y in ys[1:4]:
        assert_bitexact(y, ys[0])
    assert not np.array_equal(ys[4], ys[0])


def test_flattened_scales_and_zero_points():
    """ORT also accepts scales and zero points flattened to 1-D."""
    ops = operands(4, 16, 64, 8, "packed")
    A = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
    y = nbits.matmul_nbits(A, **ops, K=64, N=8, bits=4, block_size=16)
    flat = dict(ops, scales=ops["scales"].ravel(), zero_points=ops["zero_points"].ravel())
    assert_bitexact(
        y, nbits.matmul_nbits(A, **flat, K=64, N=8, bits=4, block_size=16)
    )


def test_order_independent_of_tiling_and_threads():
    bits, block_size, K, N = 4, 32, 256, 300
    ops = operands(bits, block_size, K, N, "packed", bias=True)
    A = np.random.default_rng(0).standard_normal((5, K)).astype(np.float32)
    ref = nbits.matmul_nbits(A, **ops, K=K, N=N, bits=bits, block_size=block_size)
    op = nbits.NBitsArgs(
        ops["B"],
        ops["scales"],
        ops["zero_points"],
        None,
        K=K,
        N=N,
        bits=bits,
        block_size=block_size,
        dtype=np.dtype(np.float32),
    )
    dummy = np.zeros((1, 1), np.float32)
    for tile in (16, 48, 512):
        out = np.empty((5, N), np.float32)
        kernels.matmul(A, dummy, dummy, *op.kernel_args(), False, tile, out)
        assert_bitexact(out + ops["bias"], ref)
    threads = numba.get_num_threads()
    for level in (0, 4):
        try:
            numba.set_num_threads(1)
            y1 = nbits.matmul_nbits(
                A, **ops, K=K, N=N, bits=bits, block_size=block_size, accuracy_level=level
            )
        finally:
            numba.set_num_threads(threads)
        y2 = nbits.matmul_nbits(
            A, **ops, K=K, N=N, bits=bits, block_size=block_size, accuracy_level=level
        )
        assert_bitexact(y1, y2)


def test_activation_quantizer_vs_naive():
    A = np.random.default_rng(0).standard_normal((4, 100)).astype(np.float32)
    A[1, :32] = 0.0  # amax = 0: inv = 0, qa = 0
    A[2, 40] = 1e-40  # subnormal
    qa, sa, absum = kernels.quantize_a(A, 32)
    qa_ref, sa_ref = naive.quantize_a(A, 32)
    np.testing.assert_array_equal(qa, qa_ref)
    assert_bitexact(sa, sa_ref)
    sums = np.add.reduceat(qa_ref, np.arange(0, 100, 32), axis=1)
    assert_bitexact(absum, (sa_ref * sums).astype(np.float32))
    assert np.abs(qa).max() <= 127


def test_numeric_edge_cases_are_not_errors():
    """Zero and negative scales, NaN and inf inputs compute without raising."""
    ops = operands(4, 16, 48, 6, "packed")
    ops["scales"][0] = 0.0
    ops["scales"][1] = -ops["scales"][1]
    A = np.random.default_rng(0).standard_normal((3, 48)).astype(np.float32)
    A[1, 5] = np.nan
    A[2, 20] = np.inf
    for level in (0, 4):
        y = nbits.matmul_nbits(A, **ops, K=48, N=6, bits=4, block_size=16, accuracy_level=level)
        assert np.all(y[0, 0] == 0.0) and np.isfinite(y[0]).all()
        assert np.isnan(y[1]).all() and not np.isfinite(y[2]).any()
        assert_bitexact(
            y[0],
            naive.matmul_nbits(
                A[:1], **ops, K=48, N=6, bits=4, block_size=16, accuracy_level=level
            )[0],
        )


def test_dequantize_vs_naive():
    for bits, block_size, K, zp_kind, g_idx in CONFIGS:
        ops = operands(bits, block_size, K, 7, zp_kind, g_idx=g_idx)
        args = (ops["B"], ops["scales"], ops["zero_points"], ops["g_idx"])
        assert_bitexact(
            nbits.dequantize_nbits(*args, K=K, N=7, bits=bits, block_size=block_size),
            naive.dequantize(*args, K, 7, bits, block_size),
        )


def test_error_bound_and_relative_error():
    """error_bound is sum_k |a w| per output (float64, floored), shaped as Y for any batch
    rank; max_relative_error divides by it and keeps NaN."""
    for bits, block_size, K, zp_kind, g_idx in CONFIGS:
        ops = operands(bits, block_size, K, 7, zp_kind, g_idx=g_idx)
        args = (ops["B"], ops["scales"], ops["zero_points"], ops["g_idx"])
        kw = dict(K=K, N=7, bits=bits, block_size=block_size)
        A = np.random.default_rng(K).standard_normal((2, 3, K)).astype(np.float32)
        A[0, 0] = 0.0  # a zero row: the floor keeps the bound positive
        W = naive.dequantize(*args, K, 7, bits, block_size).astype(np.float64)
        want = np.abs(A.astype(np.float64)) @ np.abs(W.T)
        bound = nbits.error_bound(A, *args, **kw)
        assert bound.shape == (2, 3, 7) and bound.dtype == np.float64
        np.testing.assert_allclose(bound, want + nbits.BOUND_FLOOR, rtol=1e-12)
        y = nbits.matmul_nbits(A, *args, **kw)
        assert nbits.max_relative_error(y, y, bound) == 0.0
        off = y.astype(np.float64).copy()
        off[1, 2, 3] += 1e-3 * bound[1, 2, 3]
        assert nbits.max_relative_error(off, y, bound) == pytest.approx(1e-3)
        off[0, 1, 0] = np.nan
        assert np.isnan(nbits.max_relative_error(off, y, bound))


def test_empty_batch():
    ops = operands(4, 16, 32, 5, "none")
    y = nbits.matmul_nbits(np.zeros((0, 32), np.float32), **ops, K=32, N=5, bits=4, block_size=16)
    assert y.shape == (0, 5)


# --------------------------------------------------------------------------- errors


def _call(**change):
    """matmul_nbits on valid 4-bit operands (K=64, N=8, block 32) with ``change`` applied."""
    ops = operands(4, 32, 64, 8, "packed", bias=True)
    args = dict(
        A=np.ones((2, 64), np.float32), **ops, K=64, N=8, bits=4, block_size=32, accuracy_level=0
    )
    args.update(change)
    return nbits.matmul_nbits(**args)


F32 = np.float32
ERRORS = {
    "bits low": (dict(bits=1), ValueError, r"bits must be in \[2, 8\], not 1"),
    "bits high": (dict(bits=9), ValueError, r"bits must be in \[2, 8\], not 9"),
    "bits float": (dict(bits=4.0), TypeError, r"bits must be an integer, not 4.0"),
    "block_size not power of two": (
        dict(block_size=48),
        ValueError,
        r"block_size must be a power of two >= 16, not 48",
    ),
    "block_size < 16": (dict(block_size=8), ValueError, r"block_size .* not 8"),
    "K zero": (dict(K=0), ValueError, r"K must be in \[1, inf\], not 0"),
    "K str": (dict(K="64"), TypeError, r"K must be an integer, not '64'"),
    "N negative": (dict(N=-8), ValueError, r"N must be in \[1, inf\], not -8"),
    "accuracy_level": (
        dict(accuracy_level=5),
        ValueError,
        r"accuracy_level must be in \[0, 4\], not 5",
    ),
    "A last dim": (
        dict(A=np.ones((2, 65), F32)),
        ValueError,
        r"A's last dimension must be K=64, not 65",
    ),
    "A rank 1": (dict(A=np.ones(64, F32)), ValueError, r"A must have rank >= 2.*not rank 1"),
    "A dtype": (dict(A=np.ones((2, 64))), TypeError, r"A must be float32.*not float64"),
    "A not array": (dict(A="x"), TypeError, r"A must be a numpy array, not str"),
    "B dtype": (
        dict(B=np.zeros((8, 2, 16), np.int8)),
        TypeError,
        r"B must be a uint8 array, not int8",
    ),
    "B shape": (
        dict(B=np.zeros((8, 2, 8), np.uint8)),
        ValueError,
        r"B must have shape \(8, 2, 16\).*not \(8, 2, 8\)",
    ),
    "scales dtype": (
        dict(scales=np.ones((8, 2), np.float16)),
        TypeError,
        r"scales must be float32 like A, not float16",
    ),
    "scales shape": (
        dict(scales=np.ones((8, 3), F32)),
        ValueError,
        r"scales must have shape \(8, 2\).*not \(8, 3\)",
    ),
    "packed zero_points shape": (
        dict(zero_points=np.zeros((8, 2), np.uint8)),
        ValueError,
        r"zero_points \(packed uint8\) must have shape \(8, 1\).*"
        r"not \(8, 2\)",
    ),
    "float zero_points dtype": (
        dict(zero_points=np.ones((8, 2))),
        TypeError,
        r"zero_points must be uint8 \(packed\) or float32.*float64",
    ),
    "float zero_points shape": (
        dict(zero_points=np.ones((8, 1), F32)),
        ValueError,
        r"zero_points must have shape \(8, 2\).*not \(8, 1\)",
    ),
    "g_idx dtype": (
        dict(g_idx=np.zeros(64, np.int64)),
        TypeError,
        r"g_idx must be an int32 array, not int64",
    ),
    "g_idx shape": (
        dict(g_idx=np.zeros(63, np.int32)),
        ValueError,
        r"g_idx must have shape \(64,\).*not \(63,\)",
    ),
    "g_idx value": (
        dict(g_idx=np.full(64, 2, np.int32)),
        ValueError,
        r"g_idx values must be in \[0, 1\], not 2",
    ),
    "bias dtype": (
        dict(bias=np.ones(8, np.float16)),
        TypeError,
        r"bias must be float32 like A, not float16",
    ),
    "bias shape": (dict(bias=np.ones(9, F32)), ValueError, r"bias must have shape \(8,\)"),
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_matmul_errors(name):
    change, exc, match = ERRORS[name]
    with pytest.raises(exc, match=match):
        _call(**change)


def _quantize(**change):
    args = dict(W=np.ones((64, 8), np.float32), bits=4, block_size=32, symmetric=False)
    args.update(change)
    return nbits.quantize_weights_nbits(**args)


QUANT_ERRORS = {
    "W rank": (dict(W=np.ones(64, F32)), ValueError, r"W must be a non-empty 2-D.*\(64,\)"),
    "W empty": (dict(W=np.ones((0, 8), F32)), ValueError, r"W must be a non-empty 2-D"),
    "W dtype": (dict(W=np.ones((64, 8))), TypeError,
                r"W must be a float32 or float16 array, not float64"),
    "W int": (dict(W=np.ones((64, 8), np.int32)), TypeError, r"W must be a float32.*int32"),
    "bits": (dict(bits=10), ValueError, r"bits must be in \[2, 8\], not 10"),
    "block_size": (dict(block_size=100), ValueError, r"block_size .* not 100"),
    "symmetric": (dict(symmetric=1), TypeError, r"symmetric must be a bool, not 1"),
}


@pytest.mark.parametrize("name", sorted(QUANT_ERRORS))
def test_quantizer_errors(name):
    change, exc, match = QUANT_ERRORS[name]
    with pytest.raises(exc, match=match):
        _quantize(**change)


PACK_ERRORS = {
    "value too large": (
        lambda: nbits.pack_nbits([1, 16], 4),
        ValueError,
        r"values must be in \[0, 15\] for 4 bits, not 16",
    ),
    "negative value": (lambda: nbits.pack_nbits([-1], 3), ValueError, r"not -1"),
    "float values": (
        lambda: nbits.pack_nbits([1.0], 3),
        TypeError,
        r"values must be an integer array, not float64",
    ),
    "unpack count": (
        lambda: nbits.unpack_nbits(np.zeros(2, np.uint8), 3, 6),
        ValueError,
        r"count must be <= 5 .* not 6",
    ),
    "unpack dtype": (
        lambda: nbits.unpack_nbits(np.zeros(2, np.int8), 3, 1),
        TypeError,
        r"packed must be a uint8 array, not int8",
    ),
    "zero_points rank": (
        lambda: nbits.pack_zero_points(np.zeros(3, np.uint8), 4),
        ValueError,
        r"zero_points must be 2-D",
    ),
}


@pytest.mark.parametrize("name", sorted(PACK_ERRORS))
def test_pack_errors(name):
    fn, exc, match = PACK_ERRORS[name]
    with pytest.raises(exc, match=match):
        fn()


# --------------------------------------------------------------------------- prepared weights

PREPARED_CONFIGS = [
    # bits, block_size, K, zero points, g_idx, A's dtype
    (4, 32, 96, "packed", False, np.float32),
    (4, 32, 100, "packed", False, np.float32),  # K not a multiple of block_size
    (4, 16, 64, "none", False, np.float32),
    (2, 16, 70, "packed", False, np.float32),
    (8, 64, 130, "none", False, np.float32),
    (3, 32, 100, "packed", False, np.float32),
    (5, 64, 150, "none", False, np.float32),
    (7, 128, 300, "packed", False, np.float32),
    (6, 32, 64, "float", False, np.float32),
    (4, 32, 100, "float", False, np.float32),
    (4, 32, 96, "packed", True, np.float32),
    (3, 16, 50, "float", True, np.float32),
    (5, 1024, 1100, "packed", False, np.float32),
    (4, 32, 80, "packed", False, np.float16),
    (4, 32, 80, "none", False, BF16),
    (7, 16, 40, "float", False, np.float16),
]


@pytest.mark.parametrize("level", [0, 4])
@pytest.mark.parametrize("config", PREPARED_CONFIGS, ids=str)
def test_prepared_matches_unprepared(config, level):
    """prepare_nbits(...).matmul gives the very bits of matmul_nbits (which tiles per call)."""
    bits, bs, K, zp_kind, g_idx, dtype = config
    N = 70  # two tiles of prepared columns, the second partial
    ops = operands(bits, bs, K, N, zp_kind, g_idx=g_idx, bias=True, dtype=dtype, seed=K)
    bias = ops.pop("bias")
    kw = dict(K=K, N=N, bits=bits, block_size=bs)
    w = nbits.prepare_nbits(**ops, **kw)
    assert (w.K, w.N, w.bits, w.block_size, w.dtype) == (K, N, bits, bs, np.dtype(dtype))
    rng = np.random.default_rng(level)
    for shape in ((1, K), (3, K), (8, K), (2, 3, K), (0, K)):
        A = (rng.standard_normal(shape) * 4).astype(dtype)
        for b in (None, bias):
            y = w.matmul(A, b, accuracy_level=level)
            ref = nbits.matmul_nbits(A, **ops, bias=b, **kw, accuracy_level=level)
            assert y.dtype == ref.dtype and y.shape == ref.shape == (*shape[:-1], N)
            assert_bitexact(y, ref)


@pytest.mark.parametrize("level", [0, 4])
def test_prepared_non_finite_A(level):
    """NaN and infinity in A (the int8 path falls back to the per-call kernels)."""
    ops = operands(4, 32, 96, 40, "packed")
    del ops["bias"]
    kw = dict(K=96, N=40, bits=4, block_size=32)
    w = nbits.prepare_nbits(**ops, **kw)
    A = np.random.default_rng(0).standard_normal((3, 96)).astype(np.float32)
    A[0, 5], A[1, 40], A[2, 90] = np.nan, np.inf, -np.inf
    with np.errstate(all="ignore"):
        y = w.matmul(A, accuracy_level=level)
        ref = nbits.matmul_nbits(A, **ops, **kw, accuracy_level=level)
    assert_bitexact(y, ref)


def test_prepared_is_an_immutable_copy():
    ops = operands(4, 32, 64, 8, "packed")
    del ops["bias"]
    kw = dict(K=64, N=8, bits=4, block_size=32)
    A = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
    w = nbits.prepare_nbits(**ops, **kw)
    ref = w.matmul(A)
    assert ops["B"].flags.writeable and ops["scales"].flags.writeable
    ops["B"][:] = 0
    ops["scales"][:] = 1
    assert_bitexact(w.matmul(A), ref)
    with pytest.raises(AttributeError):
        w.K = 3
    assert "K=64, N=8, bits=4, block_size=32, dtype=float32" in repr(w)


def _prepared_call(**change):
    """_call's arguments through prepare_nbits(...).matmul(A, bias, accuracy_level=...)."""
    ops = operands(4, 32, 64, 8, "packed", bias=True)
    args = dict(
        A=np.ones((2, 64), np.float32), **ops, K=64, N=8, bits=4, block_size=32, accuracy_level=0
    )
    args.update(change)
    A, bias, level = args.pop("A"), args.pop("bias"), args.pop("accuracy_level")
    return nbits.prepare_nbits(**args).matmul(A, bias, accuracy_level=level)


#: Prepared weights fix the type: there A (not the scales) is what has the wrong one.
PREPARED_MATCH = {
    "scales dtype": r"A must be float16, the type of the prepared weights' scales, not "
                    r"float32: convert it: A.astype\(np.float16\)",
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_prepared_errors(name):
    """The same errors with the same messages as matmul_nbits (weights: from prepare_nbits),
    except where the prepared weights' type makes A the one to blame."""
    change, exc, match = ERRORS[name]
    match = PREPARED_MATCH.get(name, match)
    with pytest.raises(exc, match=match):
        _prepared_call(**change)


def test_prepare_scales_type_error():
    ops = operands(4, 32, 64, 8, "packed")
    del ops["bias"]
    ops["scales"] = ops["scales"].astype(np.float64)
    match = r"scales must be float32, float16 or bfloat16, not float64"
    with pytest.raises(TypeError, match=match):
        nbits.prepare_nbits(**ops, K=64, N=8, bits=4, block_size=32)
