"""Property-based fuzzing of the golden MatMulNBits (``qaccel.model.nbits``) against ONNX
Runtime 1.31.1's MatMulNBits (CPU), where ORT runs it: bits 2, 4 and 8, block sizes 16..256,
no / packed / float zero points (not float with 8 bits), accuracy_level 0 and 4, float32 and
float16 A, with or without bias, M, N and K drawn with their edges (M = 1, N = 1, K below,
at and off a multiple of the block size).

Criterion (tests/model/test_nbits_ort.py's, justified there): ``|y - y_ort| <= 1e-6 *
sum_k |a_k w_k|`` (w the dequantised weight), the bias counted as one more term of the sum,
plus one float16 ulp of the larger result for float16; on the int8 path the magnitude of its
separate zero-point term is added to the sum (:func:`zero_point_term`: a finding of this
fuzzing, pinned by :func:`test_level4_bound_includes_the_zero_point_term`). Where ORT takes
its float32 path at accuracy_level 4 and qaccel its int8 one
(:func:`~tests.model.test_nbits_ort.ort_level4_path`: 2-bit at block 16 / 256, documented),
ORT's result is compared with qaccel's float path.

The block quantiser: :func:`qaccel.model.nbits.quantize_weights_nbits` equals ORT's
``quantize_matmul_{2,4,8}bits`` byte for byte on drawn weights (ties, zeros, huge, tiny).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import strategies as st

from qaccel.model import nbits
from tests.model import naive_nbits

from .strategies import BUDGETS, run

ort = pytest.importorskip("onnxruntime")
from tests.model.test_nbits_ort import (  # noqa: E402
    assert_same_quantisation,
    make_model,
    ort_level4_path,
)

BLOCK_SIZES = (16, 32, 64, 128, 256)


@st.composite
def nbits_cases(draw):
    """One MatMulNBits call ORT runs: the attributes, operands from a drawn seed."""
    bits = draw(st.sampled_from([2, 4, 8]))
    block_size = draw(st.sampled_from(BLOCK_SIZES))
    zp_kind = draw(st.sampled_from(["none", "packed"] + (["float"] if bits != 8 else [])))
    level = draw(st.sampled_from([0, 4]))
    dtype = np.dtype(draw(st.sampled_from([np.float32, np.float16])))
    K = draw(st.one_of(st.integers(1, 3 * block_size + 7),
                       st.sampled_from([block_size - 1, block_size, block_size + 1,
                                        2 * block_size]).filter(lambda k: k >= 1)))
    M = draw(st.integers(1, 6))
    N = draw(st.integers(1, 12))
    # float16: magnitudes that keep every sum finite
    a_mag = draw(st.sampled_from([1.0, 1e-2] + ([30.0, 1e-20] if dtype == np.float32 else [])))
    s_mag = draw(st.sampled_from([0.1, 1e-3] + ([1.0, 1e5] if dtype == np.float32 else [])))
    zero_blocks = draw(st.sampled_from([0.0, 0.3]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))

    kb = -(-K // block_size)
    B = rng.integers(0, 256, (N, kb, block_size * bits // 8), dtype=np.uint8)
    scales = (rng.standard_normal((N, kb)) * s_mag).astype(dtype)
    zp = None
    if zp_kind == "packed":
        zp = rng.integers(0, 256, (N, -(-kb * bits // 8)), dtype=np.uint8)
    elif zp_kind == "float":
        zp = (rng.random((N, kb)) * (2**bits - 1)).astype(dtype)
    A = rng.standard_normal((M, kb * block_size)) * a_mag
    A *= np.repeat(rng.random((M, kb)) >= zero_blocks, block_size, axis=1)  # amax = 0 blocks
    A = A[:, :K].astype(dtype)
    bias = (rng.standard_normal(N) * a_mag).astype(dtype) if draw(st.booleans()) else None
    return {"A": A, "B": B, "scales": scales, "zero_points": zp, "bias": bias, "K": K, "N": N,
            "bits": bits, "block_size": block_size, "accuracy_level": level, "zp": zp_kind}


def _ulp16(y: np.ndarray) -> np.ndarray:
    """One ulp of a float16 or bfloat16 result, as float64."""
    if y.dtype == np.float16:
        return np.spacing(np.abs(y)).astype(np.float64)
    return np.spacing(np.abs(y.astype(np.float32))).astype(np.float64) * 2.0**16  # 8-bit sig.


def zero_point_term(c) -> np.ndarray:
    """``sum_blocks |f32(sa * sum(qa)) * f32(-s * zp)|`` per output element: the block-sum
    term the int8 path (accuracy_level 4, ORT's CompInt8 and qaccel's emulation of it)
    computes apart from ``sa * s * sum(qa * q)``, in float32 (zp the integer zero point, by
    default ``2**(bits-1)``). The two cancel where ``q == zp``, leaving their rounding errors,
    which the documented bound (``sum_k |a_k w_k|``, w = (q - zp) s) does not cover: see
    :func:`test_level4_bound_includes_the_zero_point_term`."""
    K, N, bits, bs = c["K"], c["N"], c["bits"], c["block_size"]
    kb = -(-K // bs)
    a = np.asarray(c["A"], np.float32).reshape(-1, K)
    qa, sa = naive_nbits.quantize_a(a, bs)
    if c["zero_points"] is None:
        z = np.full((N, kb), 2 ** (bits - 1), np.float64)
    else:
        z = nbits.unpack_zero_points(c["zero_points"], bits, kb).astype(np.float64)
    s = np.asarray(c["scales"], np.float32).reshape(N, kb).astype(np.float64)
    pad = np.zeros((qa.shape[0], kb * bs - K), np.float32)
    asum = np.concatenate([qa, pad], axis=1).reshape(-1, kb, bs).sum(axis=2)
    term = np.abs(sa.astype(np.float64) * asum) @ np.abs(s * z).T
    return term.reshape(*np.shape(c["A"])[:-1], N)


def close_enough(y, y_ref, c) -> None:
    """Assert tests/model/test_nbits_ort.py's criterion: same dtype and shape, ``|y - y_ref|
    <= 1e-6 * (sum_k |a_k w_k| + |bias|)`` plus one ulp of the larger for 16-bit results;
    on the int8 path (accuracy_level 4, no float zero points) the zero-point term
    (:func:`zero_point_term`) is added to the sum."""
    assert y.dtype == y_ref.dtype and y.shape == y_ref.shape
    scale = nbits.error_bound(c["A"], c["B"], c["scales"], c["zero_points"], None, K=c["K"],
                              N=c["N"], bits=c["bits"], block_size=c["block_size"])
    if c["bias"] is not None:
        scale = scale + np.abs(c["bias"].astype(np.float64))
    zp = c["zero_points"]
    if c["accuracy_level"] == 4 and (zp is None or zp.dtype == np.uint8):
        scale = scale + zero_point_term(c)
    bound = 1e-6 * scale
    if y.dtype != np.float32:
        bound = bound + np.maximum(_ulp16(y), _ulp16(y_ref))
    err = np.abs(y.astype(np.float64) - y_ref.astype(np.float64))
    bad = ~(err <= bound)
    assert not bad.any(), (
        f"{int(bad.sum())} of {bad.size} outside the bound; max err / bound "
        f"{np.max(err / bound):.3g}; first at {np.argwhere(bad)[0].tolist()}: "
        f"{y[bad][0]!r} vs {y_ref[bad][0]!r}")


def check_matmul_vs_ort(case):
    """qaccel's MatMulNBits is within the bound of ORT's (ORT's float32 fallback against
    qaccel's float path where the level-4 paths differ)."""
    c = {k: v for k, v in case.items() if k != "zp"}
    inits = {"B": c["B"], "S": c["scales"], "Z": c["zero_points"], "G": None}
    model = make_model(c["K"], c["N"], c["bits"], c["block_size"], c["accuracy_level"],
                       c["A"].dtype, inits, c["bias"])
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    y_ort = sess.run(None, {"A": c["A"]})[0]
    level = c["accuracy_level"]
    ort_path = "fp32" if level == 0 else ort_level4_path(c["bits"], c["block_size"],
                                                         case["zp"], False)
    ours = "int8" if level == 4 and case["zp"] != "float" else "fp32"
    if ort_path != ours:
        c["accuracy_level"] = 0
    close_enough(nbits.matmul_nbits(**c), y_ort, c)


_W_KINDS = {
    "normal": lambda rng, shape: rng.standard_normal(shape),
    "ties": lambda rng, shape: rng.integers(-8, 9, shape) * 0.25,
    "positive": lambda rng, shape: np.abs(rng.standard_normal(shape)) + 0.5,
    "tiny": lambda rng, shape: -np.abs(rng.standard_normal(shape)) * 1e-30,
    "huge": lambda rng, shape: rng.standard_normal(shape) * 1e30,
    "sparse": lambda rng, shape: (rng.random(shape) < 0.05) * 1.5,
}


@st.composite
def quantiser_cases(draw):
    bits = draw(st.sampled_from([2, 4, 8]))
    block_size = draw(st.sampled_from(BLOCK_SIZES))
    dtype = draw(st.sampled_from(["float32", "float16"]))
    kind = draw(st.sampled_from(sorted(_W_KINDS)))
    K = draw(st.integers(1, 3 * block_size + 7))
    n = draw(st.integers(1, 9))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    with np.errstate(over="ignore"):
        W = _W_KINDS[kind](rng, (K, n)).astype(dtype)
    if dtype == "float16":
        W[~np.isfinite(W)] = 0.0  # ORT's float16 scales overflow alike: not compared
    if draw(st.booleans()):
        W[: min(K, block_size), 0] = 0.0  # an all-zero block
    return W, bits, block_size, draw(st.booleans())


def check_quantiser(case):
    """quantize_weights_nbits equals ORT's quantiser byte for byte."""
    assert_same_quantisation(*case)


@pytest.mark.parametrize("budget", BUDGETS)
def test_matmul_nbits_matches_ort(budget):
    run(budget, nbits_cases(), check_matmul_vs_ort)


@pytest.mark.parametrize("budget", BUDGETS)
def test_quantiser_matches_ort(budget):
    run(budget, quantiser_cases(), check_quantiser)


def test_level4_bound_includes_the_zero_point_term():
    """Minimal example found by test_matmul_nbits_matches_ort[fuzz] (K = 1, 2-bit, packed
    zero points whose codes equal the weights' codes: every w is 0). ORT's int8 kernels leave
    such a residue too, or give 0, depending on the kernel its CPU dispatch picks."""
    c = {"A": np.float32([[0.36159506]]),
         "B": np.array([[[95, 130, 194, 217, 207, 235, 15, 163]],
                        [[33, 215, 217, 130, 248, 189, 16, 69]]], np.uint8),
         "scales": np.float32([[0.06404226], [0.01049001]]),
         "zero_points": np.array([[59], [81]], np.uint8), "bias": None,
         "K": 1, "N": 2, "bits": 2, "block_size": 32, "accuracy_level": 4}
    w = nbits.dequantize_nbits(c["B"], c["scales"], c["zero_points"], K=1, N=2, bits=2,
                               block_size=32)
    assert not w.any()
    model = make_model(1, 2, 2, 32, 4, np.float32, {"B": c["B"], "S": c["scales"],
                                                   "Z": c["zero_points"], "G": None})
    y_ort = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(
        None, {"A": c["A"]})[0]
    y = nbits.matmul_nbits(**c)
    bound = 1e-6 * nbits.error_bound(c["A"], c["B"], c["scales"], c["zero_points"], K=1, N=2,
                                     bits=2, block_size=32)
    # outside sum_k |a_k w_k| (which is 0 here), inside the bound with the zero-point term
    # (docs/semantics.md, MatMulNBits)
    assert not np.all(np.abs(y.astype(np.float64)) <= bound), y
    close_enough(y, y_ort, c)
