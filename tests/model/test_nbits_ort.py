"""MatMulNBits and the block quantiser against ONNX Runtime 1.31.1 (CPU).

B, scales, zero points, g_idx and bias are initializers of a one-node model, as in real
models: only then does ORT prepack B and use CompInt8 at accuracy_level 4 (with B as a graph
input it always takes its unpacked float32 path).

Criterion: |y - y_ort| <= 1e-6 * sum_k |a_k w_k| for float32 outputs (w the dequantised
weight: the float32 accumulation bound), plus one float16 ulp of the larger for float16 outputs
(each side rounded once to float16), independent of the kernel ORT picks for the CPU. Where
ORT takes another path than qaccel (the table ``ort_level4_path``, measured on x86-64 with
AVX512-VNNI), the test pins ORT's choice and compares ORT with the matching qaccel path
instead.
"""

from __future__ import annotations

import functools
import zlib

import ml_dtypes
import numpy as np
import pytest

from qaccel.model import nbits

from . import naive_nbits as naive
from .quant_helpers import assert_bitexact

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnxruntime.capi import _pybind_state as ort_c  # noqa: E402

ort.set_default_logger_severity(4)

N = 24
ORT_QUANTIZERS = {
    2: ort_c.quantize_matmul_2bits,
    4: ort_c.quantize_matmul_4bits,
    8: ort_c.quantize_matmul_8bits,
}
ONNX_TYPES = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(ml_dtypes.bfloat16): TensorProto.BFLOAT16,
}


# --------------------------------------------------------------------------- helpers


def ort_quantize(W, bits, block_size, symmetric):
    """ORT's pybind quantiser, called as onnxruntime's MatMulNBitsQuantizer calls it."""
    K, n = W.shape
    kb = -(-K // block_size)
    Wp = np.pad(W, ((0, kb * block_size - K), (0, 0)))
    B = np.zeros((n, kb, block_size * bits // 8), np.uint8)
    S = np.zeros((n, kb), W.dtype)
    Z = np.zeros((n, -(-kb * bits // 8)), np.uint8)
    ORT_QUANTIZERS[bits](B, Wp, S, Z, block_size, n, K, symmetric)
    return B, S, None if symmetric else Z


def ort_level4_path(bits, block_size, zp_kind, has_g_idx):
    """What ORT 1.31.1 computes at accuracy_level 4 (measured, see module docstring)."""
    if zp_kind == "float" or has_g_idx:
        return "fp32"
    if bits == 2 and block_size in (16, 256):
        return "fp32"
    return "int8"


def make_model(K, n, bits, block_size, level, dtype, inits, bias=None):
    """One MatMulNBits node; ``inits`` maps input slot (B, S, Z, G) to arrays or None."""
    names = ["A"]
    initializers = []
    for slot, arr in list(inits.items()) + [("bias", bias)]:
        if arr is None:
            names.append("")
            continue
        names.append(slot)
        initializers.append(numpy_helper.from_array(arr, slot))
    while names[-1] == "":
        names.pop()
    node = helper.make_node(
        "MatMulNBits",
        names,
        ["Y"],
        domain="com.microsoft",
        K=K,
        N=n,
        bits=bits,
        block_size=block_size,
        accuracy_level=level,
    )
    t = ONNX_TYPES[np.dtype(dtype)]
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("A", t, ["M", K])],
        [helper.make_tensor_value_info("Y", t, ["M", n])],
        initializer=initializers,
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString()


@functools.cache
def case(bits, block_size, K, zp_kind, g_idx=False, bias=False, dtype="float32", source="ort"):
    """Deterministic operands of one configuration (weights from ``source``'s quantiser)."""
    dt = np.dtype(dtype) if dtype != "bfloat16" else np.dtype(ml_dtypes.bfloat16)
    seed = zlib.crc32(repr((bits, block_size, K, zp_kind, g_idx, bias, dtype, source)).encode())
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((K, N)).astype(np.float32)
    quant = ort_quantize if source == "ort" else _ours
    B, S, Z = quant(W, bits, block_size, zp_kind == "none")
    kb = S.shape[1]
    if zp_kind == "float":
        Z = (rng.random((N, kb)) * (2**bits - 1)).astype(np.float32)
    zp = None if zp_kind == "none" else Z.astype(dt) if zp_kind == "float" else Z
    g = rng.permutation(np.arange(K, dtype=np.int32) // block_size) if g_idx else None
    b = rng.standard_normal(N).astype(dt) if bias else None
    return dict(B=B, scales=S.astype(dt), zero_points=zp, g_idx=g, bias=b)


def _ours(W, bits, block_size, symmetric):
    return nbits.quantize_weights_nbits(W, bits=bits, block_size=block_size, symmetric=symmetric)


@functools.cache
def session(level, *key):
    bits, block_size, K = key[:3]
    c = case(*key)
    inits = {"B": c["B"], "S": c["scales"], "Z": c["zero_points"], "G": c["g_idx"]}
    model = make_model(K, N, bits, block_size, level, c["scales"].dtype, inits, c["bias"])
    return ort.InferenceSession(model, providers=["CPUExecutionProvider"])


def activations(M, K, dtype="float32", seed=0):
    dt = np.dtype(dtype) if dtype != "bfloat16" else np.dtype(ml_dtypes.bfloat16)
    return np.random.default_rng(seed + 1000 * M + K).standard_normal((M, K)).astype(dt)


def run_both(level, key, A):
    """(y_ort, y_qaccel) for one configuration key."""
    bits, block_size, K = key[:3]
    c = case(*key)
    y_ort = session(level, *key).run(None, {"A": A})[0]
    y = nbits.matmul_nbits(A, **c, K=K, N=N, bits=bits, block_size=block_size, accuracy_level=level)
    return y_ort, y


def assert_close(y, y_ref, A, key):
    """The module's criterion, with w the dequantised weights of ``key``: the float32
    accumulation bound ``1e-6 * sum_k |a_k w_k|``, and for float16 outputs one rounding of
    each side to float16 on top (half an ulp each: one float16 ulp of the larger), whatever
    kernel ORT's CPU dispatch picked."""
    bits, block_size, K = key[:3]
    c = case(*key)
    assert y.dtype == y_ref.dtype and y.shape == y_ref.shape
    scale = nbits.error_bound(A, c["B"], c["scales"], c["zero_points"], c["g_idx"], K=K, N=N,
                              bits=bits, block_size=block_size)
    err = np.abs(y.astype(np.float64) - y_ref.astype(np.float64))
    bound = 1e-6 * scale
    if y.dtype == np.float16:
        bound += np.spacing(np.maximum(np.abs(y), np.abs(y_ref))).astype(np.float64)
    assert np.all(err <= bound), f"max err / bound {np.max(err / bound):.3g}"


# --------------------------------------------------------------------------- quantiser


QUANT_DATA = {
    "normal": lambda rng, K: rng.standard_normal((K, N)),
    "ties": lambda rng, K: rng.integers(-8, 9, (K, N)) * 0.25,
    "positive": lambda rng, K: np.abs(rng.standard_normal((K, N))) + 0.5,
    "negative": lambda rng, K: -np.abs(rng.standard_normal((K, N))) * 1e-30,
    "huge": lambda rng, K: rng.standard_normal((K, N)) * 1e30,
    "sparse": lambda rng, K: (rng.random((K, N)) < 0.05) * 1.5,
}


def assert_same_quantisation(W, bits, block_size, symmetric):
    """qaccel's quantiser equals ORT's byte for byte: B (padding included), scales (bits:
    -0.0 too; W's dtype), zero points (unused slots 2**(bits-1) as ORT)."""
    B_ort, S_ort, Z_ort = ort_quantize(W, bits, block_size, symmetric)
    B, S, Z = _ours(W, bits, block_size, symmetric)
    assert B.dtype == np.uint8 and S.dtype == W.dtype
    np.testing.assert_array_equal(B, B_ort)
    np.testing.assert_array_equal(S.view(np.uint8), S_ort.view(np.uint8))
    if symmetric:
        assert Z is None
    else:
        np.testing.assert_array_equal(Z, Z_ort)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("kind", sorted(QUANT_DATA))
@pytest.mark.parametrize("block_size", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_quantizer_bit_exact_with_ort(bits, block_size, kind, symmetric, dtype):
    """K a multiple of the block and not (3 blocks + 5 rows: a byte split at 2 and 4 bits)."""
    rng = np.random.default_rng(bits * 1000 + block_size)
    for K in (2 * block_size, 3 * block_size + 5):
        with np.errstate(over="ignore"):            # "huge" overflows float16 to inf
            W = QUANT_DATA[kind](rng, K).astype(dtype)
        W[:block_size, 0] = 0.0  # an all-zero block
        if dtype == "float16" and kind == "huge":
            W[~np.isfinite(W)] = 0.0                # ORT's float16 scales overflow alike
        assert_same_quantisation(W, bits, block_size, symmetric)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_quantizer_tail_padding(bits, dtype):
    """Every K from 1 to 4 blocks + 7 (block 16): ORT leaves whole bytes past K at 0 and fills
    the slots past K of a split byte with the codes of the same slots one pack earlier, or 0
    when that pack starts its thread block (``block_size * pack`` rows); qaccel the same."""
    rng = np.random.default_rng(bits)
    for K in range(1, 4 * 16 + 8):
        W = (rng.standard_normal((K, N)) * 3).astype(dtype)
        for symmetric in (False, True):
            assert_same_quantisation(W, bits, 16, symmetric)
    # K = 39 at 4 bits: byte 3 of the last block holds row 38 and the stale code of row 37
    W = rng.standard_normal((39, N)).astype(np.float32)
    B, _, _ = _ours(W, 4, 16, False)
    q = nbits.unpack_nbits(B, 4, 16).reshape(N, -1)
    np.testing.assert_array_equal(q[:, 39], q[:, 37])
    assert not B[:, 2, 4:].any()


# --------------------------------------------------------------------------- MatMulNBits


# (bits, zero-point kind) pairs ORT accepts: not float zero points with 8 bits
BITS_ZP = [(b, z) for b in (2, 4, 8) for z in ("none", "packed", "float") if (b, z) != (8, "float")]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("block_size", [16, 32, 64, 128, 256])
@pytest.mark.parametrize(("bits", "zp_kind"), BITS_ZP)
@pytest.mark.parametrize("level", [0, 4])
@pytest.mark.parametrize("K", [256, 200])
def test_matmul_vs_ort(K, level, bits, zp_kind, block_size, bias):
    # weights from ORT's quantiser and from qaccel's (bit-identical, tested above)
    key = (bits, block_size, K, zp_kind, False, bias, "float32", "ort" if K == 256 else "qaccel")
    path = "fp32" if level == 0 else ort_level4_path(bits, block_size, zp_kind, False)
    ours = "int8" if level == 4 and zp_kind != "float" else "fp32"
    for M in (1, 7):
        A = activations(M, K)
        y_ort, y = run_both(level, key, A)
        if path == ours:
            assert_close(y, y_ort, A, key)
            continue
        # ORT falls back to float32 here, qaccel keeps the int8 path
        y_ort0, y0 = run_both(0, key, A)
        assert_bitexact(y_ort, y_ort0)  # pin ORT's fallback
        assert_close(y0, y_ort, A, key)
        c = case(*key)
        assert_bitexact(
            y,
            naive.matmul_nbits(
                A, **c, K=K, N=N, bits=bits, block_size=block_size, accuracy_level=4
            ),
        )


@pytest.mark.parametrize(("bits", "zp_kind"), BITS_ZP)
@pytest.mark.parametrize("level", [0, 4])
def test_matmul_vs_ort_float16(level, bits, zp_kind):
    for block_size, K in ((32, 256), (128, 200)):
        key = (bits, block_size, K, zp_kind, False, True, "float16", "ort")
        for M in (1, 7):
            A = activations(M, K, "float16")
            y_ort, y = run_both(level, key, A)
            if level == 4 and ort_level4_path(bits, block_size, zp_kind, False) == "int8":
                assert_close(y, y_ort, A, key)
            else:
                assert_close(
                    nbits.matmul_nbits(A, **case(*key), K=K, N=N, bits=bits, block_size=block_size),
                    y_ort,
                    A,
                    key,
                )


def test_matmul_vs_ort_rank3():
    key = (4, 32, 200, "packed", False, True, "float32", "ort")
    A3 = activations(6, 200).reshape(2, 3, 200)
    for level in (0, 4):
        y_ort = session(level, *key).run(None, {"A": A3.reshape(6, 200)})[0]
        y = nbits.matmul_nbits(
            A3, **case(*key), K=200, N=N, bits=4, block_size=32, accuracy_level=level
        )
        assert y.shape == (2, 3, N)
        assert_close(y.reshape(6, N), y_ort, A3.reshape(6, 200), key)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize(("bits", "zp_kind"), BITS_ZP)
def test_dequantised_weights_bit_exact(bits, zp_kind, dtype):
    """A = identity: ORT's output is its dequantised W^T, which qaccel reproduces bit for bit."""
    for block_size in (16, 32, 64, 128, 256):
        K = block_size + 40
        key = (bits, block_size, K, zp_kind, False, False, dtype, "ort")
        eye = np.eye(K, dtype=np.dtype(dtype))
        y_ort, y = run_both(0, key, eye)
        c = case(*key)
        Wt = nbits.dequantize_nbits(
            c["B"], c["scales"], c["zero_points"], K=K, N=N, bits=bits, block_size=block_size
        )
        # by value: a -0.0 weight comes out of the sum over A's row (1 * -0.0 + 0 * w) as +0.0
        np.testing.assert_array_equal(y_ort, Wt.T.astype(dtype))
        assert_bitexact(y, y_ort)


# --------------------------------------------------------------------------- level-4 edges


@pytest.mark.parametrize("M", [1, 5])
@pytest.mark.parametrize(("bits", "zp_kind"), [(4, "none"), (4, "packed"), (8, "packed")])
def test_level4_tiny_and_nonfinite_blocks_vs_ort(bits, zp_kind, M):
    """Blocks where ``127 / amax`` overflows (0 < amax < 127 / FLT_MAX: tiny normals, all
    subnormals) quantise to qa = 0 and add exactly 0, as in ORT; a block holding inf or NaN
    makes the row NaN (ORT's M > 1 kernel drops a NaN from its max-abs and gives a finite
    row: there qaccel follows its M = 1 kernel). Other blocks of a row are unaffected."""
    key = (bits, 32, 200, zp_kind, False, False, "float32", "ort")
    A = activations(M, 200)
    A[:, 0:32] *= np.float32(1e-37)                  # amax ~ 3e-37: 127/amax overflows
    A[:, 64:96] *= np.float32(1e-41)                 # all subnormal
    y_ort, y = run_both(4, key, A)
    assert np.isfinite(y).all()
    assert_close(y, y_ort, A, key)
    plain = A.copy()
    plain[:, 0:32] = 0
    plain[:, 64:96] = 0
    assert_bitexact(y, run_both(4, key, plain)[1])
    A[0, 40] = np.inf
    A[-1, 100] = np.nan
    y_ort, y = run_both(4, key, A)
    assert np.isnan(y_ort[0]).all() and np.isnan(y[0]).all()
    assert np.isnan(y[-1]).all()
    assert np.isnan(y_ort[-1]).all() == (M == 1)


# --------------------------------------------------------------------------- g_idx


@pytest.mark.parametrize("level", [0, 4])
@pytest.mark.parametrize("zp_kind", ["none", "float"])
def test_g_idx_vs_ort(zp_kind, level):
    """4-bit g_idx without or with float zero points: ORT is right (float path at level 4)."""
    for block_size, K in ((16, 200), (64, 256)):
        key = (4, block_size, K, zp_kind, True, True, "float32", "ort")
        for M in (1, 7):
            A = activations(M, K)
            y_ort, y = run_both(level, key, A)
            assert_close(y, y_ort, A, key)


def test_g_idx_ort_ignores_packed_zero_points():
    """ORT bug: with g_idx, packed zero points are ignored and 2**(bits-1) is used."""
    key = (4, 32, 256, "packed", True, False, "float32", "ort")
    c = case(*key)
    A = activations(7, 256)
    y_ort, y = run_both(0, key, A)
    y_default = nbits.matmul_nbits(
        A, c["B"], c["scales"], None, c["g_idx"], K=256, N=N, bits=4, block_size=32
    )
    assert_close(y_default, y_ort, A, key)
    assert not np.allclose(y, y_ort, rtol=1e-3, atol=1e-3)
    assert_bitexact(y, naive.matmul_nbits(A, **c, K=256, N=N, bits=4, block_size=32))


# --------------------------------------------------------------------------- rejections

REJECTED = {
    # name: (bits, block_size, zp_kind, g_idx, dtype)
    "3 bits": (3, 32, "packed", False, "float32"),
    "5 bits": (5, 64, "none", False, "float32"),
    "6 bits": (6, 16, "float", False, "float32"),
    "7 bits": (7, 128, "packed", False, "float32"),
    "block_size 512": (4, 512, "packed", False, "float32"),
    "block_size 1024": (8, 1024, "none", False, "float32"),
    "8 bits, float zero points": (8, 32, "float", False, "float32"),
    "8 bits, g_idx": (8, 32, "none", True, "float32"),
    "2 bits, g_idx, float zero points": (2, 32, "float", True, "float32"),
    "bfloat16 A": (4, 32, "float", False, "bfloat16"),
}


@pytest.mark.parametrize("level", [0, 4])
@pytest.mark.parametrize("name", sorted(REJECTED))
def test_ort_rejects(name, level):
    """ORT 1.31.1 rejects each of these (at session creation or at run); qaccel handles them."""
    bits, block_size, zp_kind, g_idx, dtype = REJECTED[name]
    K = 2 * block_size + 8
    key = (bits, block_size, K, zp_kind, g_idx, True, dtype, "qaccel")
    A = activations(3, K, dtype)
    with pytest.raises(Exception, match="(?i)support|implement"):
        session(level, *key).run(None, {"A": A})
    y = nbits.matmul_nbits(
        A, **case(*key), K=K, N=N, bits=bits, block_size=block_size, accuracy_level=level
    )
    y_ref = naive.matmul_nbits(
        A, **case(*key), K=K, N=N, bits=bits, block_size=block_size, accuracy_level=level
    )
    assert_bitexact(y, y_ref)
