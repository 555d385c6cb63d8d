"""DequantizeLinear: bit-exact against onnx.reference, the naive twin and ONNX Runtime."""

from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np
import pytest

from qaccel.model.quant import dequantize_linear

from . import naive_quant as naive
from .quant_helpers import (
    BF16,
    F16,
    F32,
    FLOAT4,
    FLOAT8,
    I32,
    INT_TYPES,
    assert_bitexact,
    backend_cases,
    dq_opset,
    dtype_of,
    ort_run,
    reference,
    tid,
)
from .test_quantize import GRANULARITIES

DQ_INPUTS = INT_TYPES + (I32,) + FLOAT8 + (FLOAT4,)
SCALE_TYPES = (F32, F16, BF16)
# scale values cycled over the scale: ordinary, negative, zero, tiny (subnormal products),
# large (products overflow float16, or float32 for large codes), infinite and NaN
SCALES = [0.37, 2.0, -1.25, 0.0, -0.0, 1e-3, 7.0, 3e-39, 1e30, 0.1, 300.0, -np.inf, np.nan]


def _codes(x_dtype, n, rng):
    """Every code of small types (NaN and infinities included), extremes and random ones."""
    x_dtype = np.dtype(x_dtype)
    if x_dtype.itemsize == 1:
        width = 16 if x_dtype in (FLOAT4,) or "4" in x_dtype.name else 256
        width = 4 if "int2" in x_dtype.name else width
        codes = np.resize(np.arange(width, dtype=np.uint8), n)
        rng.shuffle(codes)
        return codes.view(x_dtype)  # ml_dtypes keeps sub-byte codes in the low bits
    info = np.iinfo(x_dtype)
    extremes = [info.min, info.max, 0, 1, info.max // 2 + 1]
    if x_dtype == I32:
        extremes += [2**24 + 1, -(2**24) - 3, 2**30 + 65, 123456789]
    values = rng.integers(info.min, info.max, n, endpoint=True)
    values[: len(extremes)] = extremes[:n]
    return values.astype(x_dtype)


def make_case(x_dtype, s_dtype, gran, out=None, seed=0):
    """Return dequantize_linear's arguments for one matrix cell."""
    x_shape, s_shape, axis, block, with_zp = GRANULARITIES[gran]
    key = f"{np.dtype(x_dtype)}/{np.dtype(s_dtype)}/{gran}/{out}".encode()
    rng = np.random.default_rng([seed, zlib.crc32(key)])
    n = int(np.prod(x_shape))
    x = _codes(x_dtype, n, rng).reshape(x_shape)
    start = rng.integers(len(SCALES))
    with np.errstate(over="ignore"):
        scale = np.resize(np.roll(SCALES, -start), int(np.prod(s_shape))).astype(s_dtype)
    zero_point = None
    if with_zp:
        if np.dtype(x_dtype) in FLOAT8:
            zero_point = rng.choice([0.0, -0.0], s_shape).astype(x_dtype)
        elif np.dtype(x_dtype) == FLOAT4:
            zero_point = rng.choice([-2.0, 0.5, 6.0], s_shape).astype(x_dtype)  # ignored
        else:
            zero_point = _codes(x_dtype, int(np.prod(s_shape)), rng).reshape(s_shape)
    return {
        "x": x,
        "x_scale": scale.reshape(s_shape),
        "x_zero_point": zero_point,
        "axis": axis,
        "block_size": block,
        "output_dtype": out,
    }


def run_reference(case):
    attrs = {"axis": case["axis"]}
    if case["block_size"]:
        attrs["block_size"] = case["block_size"]
    if case["output_dtype"] is not None:
        attrs["output_dtype"] = case["output_dtype"]
    x, scale = case["x"], case["x_scale"]
    opset = dq_opset(x.dtype, case["output_dtype"], blocked=bool(case["block_size"]))
    opset = max(opset, 21 if scale.ndim > 1 else 0)  # opset 19 wants a scale of rank <= 1
    y_dtype = scale.dtype if case["output_dtype"] is None else case["output_dtype"]
    return reference(
        "DequantizeLinear", [x, scale, case["x_zero_point"]], opset=opset, y_dtype=y_dtype, **attrs
    )


@pytest.mark.parametrize("gran", GRANULARITIES)
@pytest.mark.parametrize("out", [None, F32, F16, BF16], ids=tid)
@pytest.mark.parametrize("s_dtype", SCALE_TYPES, ids=tid)
@pytest.mark.parametrize("x_dtype", DQ_INPUTS, ids=tid)
def test_matches_reference(x_dtype, s_dtype, out, gran):
    case = make_case(x_dtype, s_dtype, gran, out)
    got = dequantize_linear(**case)
    assert_bitexact(got, run_reference(case))
    assert_bitexact(got, naive.dequantize(**case), context="naive twin: ")


@pytest.mark.parametrize(
    "name,inputs,attrs,expected",
    backend_cases("DequantizeLinear"),
    ids=[c[0] for c in backend_cases("DequantizeLinear")],
)
def test_onnx_backend_node_cases(name, inputs, attrs, expected):
    kwargs = {k: v for k, v in attrs.items() if k in ("axis", "block_size")}
    if "output_dtype" in attrs:
        kwargs["output_dtype"] = dtype_of(attrs["output_dtype"])
    assert_bitexact(dequantize_linear(*inputs, **kwargs), expected)


def test_int32_with_zero_point_is_computed_in_float64():
    x = np.array([2**31 - 1, 16777217, -(2**31)], np.int32)
    zp = np.array(-5, np.int32)
    got = dequantize_linear(x, np.float32(1), zp)
    # float64: float32(x) - zp is exact, then one rounding to float32
    assert_bitexact(got, np.float32([2**31 + 5, 16777216 + 5, -(2**31) + 5]))
    no_zp = dequantize_linear(x, np.float32(1))
    assert_bitexact(no_zp, x.astype(np.float32))


@pytest.mark.parametrize("zp", [0.0, -0.0, 0.5, -0.75], ids=str)
def test_float8_zero_point_below_one_is_accepted_and_ignored(zp):
    x = np.array([1.0, -2.0, 448.0], ml_dtypes.float8_e4m3fn)
    zero_point = np.array(zp, ml_dtypes.float8_e4m3fn)
    expected = reference("DequantizeLinear", [x, np.float32(2), zero_point], opset=19, y_dtype=F32)
    assert_bitexact(dequantize_linear(x, np.float32(2), zero_point), expected)


def test_float4_zero_point_is_ignored():
    x = np.array([1.0, -2.0, 6.0], ml_dtypes.float4_e2m1fn)
    zero_point = np.array(3.0, ml_dtypes.float4_e2m1fn)
    got = dequantize_linear(x, np.float32(2), zero_point)
    assert_bitexact(got, np.float32([2.0, -4.0, 12.0]))


def test_float16_output_from_float32_scale_rounds_twice():
    """x * scale is rounded to float32, then to float16, as in the reference."""
    # 5 * scale lies just above the float16 tie 1 + 2**-11 and rounds to it in float32:
    # rounding twice gives 1.0 (ties to even), rounding once would give 1 + 2**-10
    scale = np.array(1045227111, np.uint32).view(np.float32)
    assert 5 * float(scale) > 1 + 2**-11 == np.float32(5) * scale
    got = dequantize_linear(np.array([5], np.int8), scale, output_dtype=np.float16)
    assert got[0] == 1.0 and np.float16(5 * float(scale)) == 1 + 2**-10


# --- ONNX Runtime ---------------------------------------------------------------------------

ORT_INPUTS = [np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16)] + list(FLOAT8)
ORT_GRANULARITIES = [g for g in GRANULARITIES if g != "tensor11-noz"]


@pytest.mark.parametrize("gran", ORT_GRANULARITIES)
@pytest.mark.parametrize("s_dtype", [F32, F16], ids=tid)
@pytest.mark.parametrize("x_dtype", ORT_INPUTS + [I32], ids=tid)
def test_matches_onnxruntime(x_dtype, s_dtype, gran):
    case = make_case(x_dtype, s_dtype, gran)
    if x_dtype == I32:
        case["x_zero_point"] = None  # with a zero point ORT differs: see below
    if x_dtype in FLOAT8 and case["x_zero_point"] is not None:
        case["x_zero_point"] = np.zeros_like(case["x_zero_point"])  # ORT wants exact zeros
    attrs = {"axis": case["axis"]}
    if case["block_size"]:
        attrs["block_size"] = case["block_size"]
    opset = 21 if case["block_size"] or x_dtype.itemsize == 2 else 19
    inputs = [case["x"], case["x_scale"], case["x_zero_point"]]
    expected = ort_run("DequantizeLinear", inputs, opset=opset, y_dtype=s_dtype, **attrs)
    assert_bitexact(dequantize_linear(**case), expected)


def test_ort_subtracts_int32_zero_point_in_int32():
    x = np.array([2**31 - 1, 16777217], np.int32)
    zp = np.array(-5, np.int32)
    ort = ort_run("DequantizeLinear", [x, np.float32(1), zp], opset=19, y_dtype=F32)
    ref = reference("DequantizeLinear", [x, np.float32(1), zp], opset=19, y_dtype=F32)
    got = dequantize_linear(x, np.float32(1), zp)
    assert_bitexact(got, ref)
    assert ort[0] < 0 < got[0]  # ORT's int32 subtraction wrapped around
    assert ort[1] == np.float32(16777222) != got[1]  # and rounded x - zp once, not twice


def test_ort_rejects_float8_zero_point_below_one():
    x = np.array([1.0, 2.0], ml_dtypes.float8_e4m3fn)
    zp = np.array(0.5, ml_dtypes.float8_e4m3fn)
    with pytest.raises(Exception, match="zero points should be 0"):
        ort_run("DequantizeLinear", [x, np.float32(1), zp], opset=19, y_dtype=F32)
    assert_bitexact(dequantize_linear(x, np.float32(1), zp), np.float32([1.0, 2.0]))


def test_ort_rejects_a_rank2_one_element_scale():
    x = np.arange(12, dtype=np.int8).reshape(3, 4)
    s, zp = np.full((1, 1), 0.5, np.float32), np.zeros((1, 1), np.int8)
    with pytest.raises(Exception, match="per axis quantization"):
        ort_run("DequantizeLinear", [x, s, zp], opset=21, y_dtype=F32)
    expected = reference("DequantizeLinear", [x, s, zp], opset=21, y_dtype=F32)
    assert_bitexact(dequantize_linear(x, s, zp), expected)


@pytest.mark.parametrize(
    "inputs",
    [
        [np.ones(3, np.int8), np.ones((), ml_dtypes.bfloat16), np.zeros((), np.int8)],
        [np.ones(3, FLOAT4), np.ones((), np.float32)],
    ],
    ids=["bfloat16-scale", "float4-x"],
)
def test_ort_has_no_kernel_where_qaccel_has_the_reference(inputs):
    opset = dq_opset(inputs[0].dtype)
    y_dtype = inputs[1].dtype
    with pytest.raises(Exception, match="NOT_IMPLEMENTED"):
        ort_run("DequantizeLinear", inputs, opset=opset, y_dtype=y_dtype)
    expected = reference("DequantizeLinear", inputs, opset=opset, y_dtype=y_dtype)
    assert_bitexact(dequantize_linear(*inputs), expected)


# --- kernels against the naive twin on random data, large enough to use every thread --------


@pytest.mark.parametrize(
    "x_dtype,s_dtype,out,shape,scale_shape,axis,block",
    [
        (np.int8, F32, None, (256, 1200), (), 1, 0),
        (np.uint8, F32, F16, (300, 1024), (1024,), 1, 0),
        (np.int16, BF16, None, (600, 512), (600,), 0, 0),
        (ml_dtypes.int4, F32, BF16, (512, 640), (512, 20), 1, 32),
        (ml_dtypes.uint2, F16, None, (40, 96, 80), (40, 3, 80), 1, 40),
        (FLOAT8[2], F32, None, (300, 1000), (300, 34), -1, 30),
        (I32, F32, F16, (1000, 300), (300,), -1, 0),
        (FLOAT4, BF16, F32, (300, 1000), (1,), 0, 0),
    ],
    ids=tid,
)
def test_kernels_match_naive_twin_on_random_data(
    x_dtype, s_dtype, out, shape, scale_shape, axis, block
):
    rng = np.random.default_rng(11)
    x = _codes(x_dtype, int(np.prod(shape)), rng).reshape(shape)
    scale = (rng.uniform(0.05, 4, scale_shape) * rng.choice([-1, 1], scale_shape)).astype(s_dtype)
    zp = None
    if np.dtype(x_dtype) in INT_TYPES + (I32,):
        zp = _codes(x_dtype, int(np.prod(scale_shape)), rng).reshape(scale_shape)
    kwargs = {"axis": axis, "block_size": block, "output_dtype": out}
    assert_bitexact(
        dequantize_linear(x, scale, zp, **kwargs), naive.dequantize(x, scale, zp, **kwargs)
    )


def test_scalar_empty_and_strided_inputs():
    assert_bitexact(dequantize_linear(np.int8(-3), np.float32(0.5)), np.array(-1.5, np.float32))
    empty = dequantize_linear(np.zeros((4, 0), np.uint8), np.ones(4, np.float32), axis=0)
    assert empty.shape == (4, 0) and empty.dtype == np.float32
    xt = np.arange(24, dtype=np.int8).reshape(4, 6).T
    scale = np.arange(8, dtype=np.float32)[1::2]
    expected = reference("DequantizeLinear", [xt.copy(), scale.copy()], opset=19, y_dtype=F32)
    assert_bitexact(dequantize_linear(xt, scale, axis=1), expected)
