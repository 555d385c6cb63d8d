"""QuantizeLinear: bit-exact against onnx.reference, the naive twin and ONNX Runtime."""

from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np
import pytest

from qaccel.model.quant import division_dtype, quantize_linear

from . import naive_quant as naive
from .quant_helpers import (
    BF16,
    F16,
    F32,
    FLOAT4,
    FLOAT8,
    I32,
    INT_TYPES,
    Q_OUTPUTS,
    assert_bitexact,
    backend_cases,
    bits,
    dtype_of,
    ort_run,
    q_opset,
    reference,
    tid,
)

# (x dtype, scale dtype): the opset-19/21 pairs (one type T1) and opset-23 mixes
XS_PAIRS = [
    (F32, F32),
    (F16, F16),
    (BF16, BF16),
    (I32, I32),
    (F32, F16),
    (F16, F32),
    (BF16, F32),
    (F16, BF16),
    (I32, F32),
    (F32, I32),
]

PAIR_ID = "{0[0]}/{0[1]}".format

# name: (x shape, scale shape, axis, block_size, with a zero point)
GRANULARITIES = {
    "tensor": ((3, 4, 10), (), 1, 0, True),
    "tensor11-noz": ((3, 4, 10), (1, 1), -1, 0, False),
    "axis0": ((5, 2, 12), (5,), 0, 0, True),
    "axis-1-noz": ((2, 3, 20), (20,), -1, 0, False),
    "blocked": ((4, 12, 5), (4, 3, 5), 1, 4, True),
    "blocked-partial-noz": ((3, 4, 10), (3, 4, 3), -1, 4, False),
}

# scale values cycled over multi-element scales: ordinary, powers of two (exact ties),
# negative, zero, tiny (float16 subnormal, quotients overflow), large
SCALES = [0.37, 2.0, -1.25, 0.5, 0.0, 3e-3, 7.0, -0.0, 1e3, 0.1, 6e-8, 0.25, -3.0, 1.5]
INT_SCALES = [3, 2, -2, 1, 0, 7, -1, 100]


def _qrange(out):
    out = np.dtype(out)
    if naive.is_int(out):
        info = ml_dtypes.iinfo(out)
        return float(info.min), float(info.max)
    fmax = float(ml_dtypes.finfo(out).max)
    return -fmax, fmax


def _special_quotients(out):
    """Quotients that probe rounding and saturation for output type ``out``."""
    lo, hi = _qrange(out)
    ties = [k + 0.5 for k in range(-4, 4)]
    limits = [hi + d for d in (-0.5, 0.0, 0.5, 1.0, 1.5)] + [lo + d for d in (0.5, 0.0, -0.5, -1.0)]
    if not naive.is_int(out):  # float8 / float4: around max, halfway to the next binade
        limits += [hi * f for f in (1.03125, 1.0625, 1.07, 1.125, 1.5, 2.0, -1.0625, -1.5)]
    huge = [2.0**31, -(2.0**31), 3e9, -3e9, 1e10, -1e10, 2.0**31 - 64]
    return np.array(ties + limits + huge)


def _absolute_specials(x_dtype):
    if x_dtype == I32:
        return np.array([0, 1, -1, 2**31 - 1, -(2**31), 2**24 + 1, -(2**24) - 3, 65519, 65520])
    tiny = float(ml_dtypes.finfo(x_dtype).smallest_subnormal)
    big = float(ml_dtypes.finfo(x_dtype).max)
    return np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, tiny, -tiny, big, -big, 1e-40, 6e-8])


def _cast(values, dtype):
    with np.errstate(all="ignore"):
        if dtype == I32:
            return np.clip(np.nan_to_num(np.rint(values)), -(2**31), 2**31 - 1).astype(I32)
        return values.astype(dtype)


def _rounded_ties(x, s_elem, division):
    """Nudge x (floats) by a few ulps so that x / s rounded to ``division`` is a .5 tie."""
    if x.dtype == I32 or x.size == 0:
        return x
    steps = np.concatenate([-np.arange(1, 9), np.arange(1, 9)]).astype(np.int64)
    raw = bits(x).astype(np.int64)[:, None] + steps
    cand = raw.astype(bits(x).dtype).view(x.dtype)
    with np.errstate(all="ignore"):
        q = cand.astype(division) / s_elem.astype(division)[:, None]
        exact = cand.astype(np.float64) / s_elem.astype(division).astype(np.float64)[:, None]
        qf = q.astype(np.float64)
        good = (np.abs(qf - np.floor(qf) - 0.5) == 0) & (exact != qf) & np.isfinite(qf)
    pick = good.argmax(axis=1)
    found = good.any(axis=1)
    out = x.copy()
    out[found] = cand[found, pick[found]]
    return out


def _random_zero_point(out, s_shape, rng):
    """A zero point of type ``out`` and shape ``s_shape``: the range's ends first for integer
    types, a few small values (signed zeros among them) for float4e2m1 / float8."""
    if naive.is_int(out):
        lo, hi = _qrange(out)
        zp = rng.integers(int(lo), int(hi) + 1, s_shape)
        zp.flat[: min(2, zp.size)] = [hi, lo][: min(2, zp.size)]
        return zp.astype(out)
    return rng.choice([-3.0, -1.0, -0.0, 0.0, 0.5, 2.0, 6.0], s_shape).astype(out)


def make_case(x_dtype, s_dtype, out, gran, precision=None, seed=0):
    """Return quantize_linear's arguments probing ties, limits and special values."""
    x_shape, s_shape, axis, block, with_zp = GRANULARITIES[gran]
    key = f"{x_dtype}/{s_dtype}/{np.dtype(out)}/{gran}/{precision}".encode()
    rng = np.random.default_rng([seed, zlib.crc32(key)])
    n_scales = int(np.prod(s_shape))
    table = INT_SCALES if s_dtype == I32 else SCALES
    start = rng.integers(len(table))
    scale = _cast(np.resize(np.roll(table, -start), n_scales).reshape(s_shape), s_dtype)
    s_elem = naive.expand(scale, x_shape, axis, block).reshape(-1)
    division = precision if precision is not None else division_dtype(x_dtype, s_dtype)
    s_div = s_elem.astype(division)

    lo, hi = _qrange(out)
    n = int(np.prod(x_shape))
    u = rng.uniform(1.6 * lo - 2, 1.6 * hi + 2, n)
    special_q = _special_quotients(out)
    absolute = _absolute_specials(x_dtype)
    u[: special_q.size] = special_q
    with np.errstate(all="ignore"):
        x = _cast(u * s_div.astype(np.float64), x_dtype)
    tie_at = slice(special_q.size, special_q.size + 12)
    if precision is None:
        x[tie_at] = _rounded_ties(x[tie_at], s_elem[tie_at], division)
    x[n - absolute.size :] = _cast(absolute, x_dtype)
    x = x.reshape(x_shape)

    zero_point = _random_zero_point(out, s_shape, rng) if with_zp else None
    return {
        "x": x,
        "y_scale": scale,
        "y_zero_point": zero_point,
        "axis": axis,
        "block_size": block,
        "output_dtype": None if with_zp else out,
        "precision": precision,
    }


def run_reference(case, out, saturate=True):
    attrs = {"axis": case["axis"]}
    names = {"block_size": case["block_size"], "precision": case["precision"]}
    attrs.update({k: v for k, v in names.items() if v})
    if case["y_zero_point"] is None and np.dtype(out) != np.uint8:
        attrs["output_dtype"] = out
    if not saturate:
        attrs["saturate"] = 0
    x, scale = case["x"], case["y_scale"]
    opset = q_opset(
        x.dtype, scale.dtype, out, blocked=bool(case["block_size"]),
        precision=case["precision"], attrs=attrs,
    )  # fmt: skip
    opset = max(opset, 21 if scale.ndim > 1 else 0)  # opset 19 wants a scale of rank <= 1
    return reference(
        "QuantizeLinear", [x, scale, case["y_zero_point"]], opset=opset, y_dtype=out, **attrs
    )


def check_against_reference(case, out, saturate=True):
    got = quantize_linear(**case, saturate=saturate)
    expected = run_reference(case, out, saturate)
    twin = naive.quantize(**case, saturate=saturate)
    assert_bitexact(got, twin, context="naive twin: ")
    if not naive.is_int(out):
        assert_bitexact(got, expected)
        return
    # everywhere but the documented deviation, where the reference's int32 arithmetic wraps
    wraps, wrapped = naive.reference_wraps(**{**case, "output_dtype": out})
    assert_bitexact(got, expected, mask=~wraps)
    assert_bitexact(expected[wraps], wrapped[wraps].astype(out), context="reference wraps: ")


@pytest.mark.parametrize("gran", GRANULARITIES)
@pytest.mark.parametrize("out", Q_OUTPUTS, ids=tid)
@pytest.mark.parametrize("xs", XS_PAIRS, ids=PAIR_ID)
def test_matches_reference(xs, out, gran):
    check_against_reference(make_case(*xs, out, gran), out)


PRECISION_PAIRS = [(F32, F32), (F16, F16), (BF16, F32), (I32, F32)]
PRECISION_OUTPUTS = [np.dtype(t) for t in (np.int8, np.uint16, ml_dtypes.int4)] + [
    FLOAT8[0],
    FLOAT8[3],
    FLOAT4,
]


@pytest.mark.parametrize("gran", ["axis0", "blocked-partial-noz"])
@pytest.mark.parametrize("out", PRECISION_OUTPUTS, ids=tid)
@pytest.mark.parametrize("precision", [F32, F16, BF16], ids=tid)
@pytest.mark.parametrize("xs", PRECISION_PAIRS, ids=PAIR_ID)
def test_precision_matches_reference(xs, precision, out, gran):
    check_against_reference(make_case(*xs, out, gran, precision=precision), out)


@pytest.mark.parametrize("gran", ["tensor", "axis-1-noz", "blocked"])
@pytest.mark.parametrize("out", FLOAT8, ids=tid)
@pytest.mark.parametrize("xs", [(F32, F32), (F16, F16), (BF16, BF16), (I32, I32)], ids=PAIR_ID)
def test_float8_no_saturation_matches_reference(xs, out, gran):
    check_against_reference(make_case(*xs, out, gran), out, saturate=False)


@pytest.mark.parametrize(
    "name,inputs,attrs,expected",
    backend_cases("QuantizeLinear"),
    ids=[c[0] for c in backend_cases("QuantizeLinear")],
)
def test_onnx_backend_node_cases(name, inputs, attrs, expected):
    kwargs = {k: v for k, v in attrs.items() if k in ("axis", "block_size", "saturate")}
    if "output_dtype" in attrs:
        kwargs["output_dtype"] = dtype_of(attrs["output_dtype"])
    if "precision" in attrs:
        kwargs["precision"] = dtype_of(attrs["precision"])
    assert_bitexact(quantize_linear(*inputs, **kwargs), expected)


def test_division_dtype_is_numpys():
    types = (F32, F16, BF16, I32)
    for a in types:
        for b in types:
            numpy_result = (np.ones(1, a) / np.ones(1, b)).dtype
            assert division_dtype(a, b) == numpy_result, (a, b)


# x / s = 80.514..., but the float16 (bfloat16) quotient is the tie 80.5 (48.5)
F16_TIE = np.array([171.25], np.float16), np.array(2.126953125, np.float16), 80
BF16_TIE = (
    np.array([119.0], ml_dtypes.bfloat16), np.array(2.453125, ml_dtypes.bfloat16), 48,
)  # fmt: skip


@pytest.mark.parametrize("x,s,even", [F16_TIE, BF16_TIE], ids=["float16", "bfloat16"])
def test_16bit_quotient_rounding_creates_ties(x, s, even):
    assert float(x[0] / s) == even + 0.5 and float(x[0]) / float(s) != even + 0.5
    assert quantize_linear(x, s, output_dtype=np.int8)[0] == even
    assert quantize_linear(x, s, output_dtype=np.int8, precision=np.float32)[0] == even + 1
    x32, s32 = x.astype(np.float32), s.astype(np.float32)
    assert quantize_linear(x32, s32, output_dtype=np.int8)[0] == even + 1


# --- the documented deviation: saturation where the reference wraps through int32 -----------


SATURATION_X = np.array([1e10, -1e10, np.inf, -np.inf, np.nan, 3e9, 1e6, -1e6], np.float32)


@pytest.mark.parametrize("out", INT_TYPES, ids=tid)
def test_huge_and_infinite_quotients_saturate(out):
    lo, hi = _qrange(out)
    got = quantize_linear(SATURATION_X, np.float32(1), output_dtype=out)
    assert_bitexact(got, np.array([hi, lo, hi, lo, lo, hi, hi, lo]).astype(out))
    ref = run_reference(
        {"x": SATURATION_X, "y_scale": np.float32(1), "y_zero_point": None, "axis": 1,
         "block_size": 0, "precision": None}, out,
    )  # fmt: skip
    # the reference: huge, +-inf and NaN all become qmin
    assert_bitexact(ref, np.array([lo, lo, lo, lo, lo, lo, hi, lo]).astype(out))


def test_zero_point_sum_overflowing_int32_saturates():
    x = np.array([2.0**31 - 128], np.float32)  # rint(q) fits int32, rint(q) + 200 does not
    zp = np.array(200, np.uint8)
    assert quantize_linear(x, np.float32(1), zp)[0] == 255
    assert reference("QuantizeLinear", [x, np.float32(1), zp], opset=13, y_dtype=np.uint8)[0] == 0


@pytest.mark.parametrize("out", [np.int8, np.uint8, np.int16, np.uint16], ids=tid)
def test_ort_saturates_like_qaccel(out):
    x = SATURATION_X
    got = quantize_linear(x, np.float32(1), np.zeros((), out))
    opset = 13 if np.dtype(out).itemsize == 1 else 21
    inputs = [x, np.float32(1), np.zeros((), out)]
    assert_bitexact(got, ort_run("QuantizeLinear", inputs, opset=opset, y_dtype=out))


# --- ONNX Runtime ---------------------------------------------------------------------------

ORT_OUTPUTS = [np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16)]
ORT_GRANULARITIES = [g for g in GRANULARITIES if g != "tensor11-noz"]


@pytest.mark.parametrize("gran", ORT_GRANULARITIES)
@pytest.mark.parametrize("out", ORT_OUTPUTS, ids=tid)
def test_matches_onnxruntime(out, gran):
    """Bit-exact with ORT, except where the reference's int32 arithmetic wraps.

    There ORT saturates as qaccel does, except its kernel for blocks along an axis other
    than the last, which wraps as the reference does.
    """
    case = make_case(F32, F32, out, gran)
    if case["y_zero_point"] is None:
        case["y_zero_point"] = np.zeros(case["y_scale"].shape, out)
    attrs = {"axis": case["axis"]}
    if case["block_size"]:
        attrs["block_size"] = case["block_size"]
    opset = 21 if case["block_size"] or out.itemsize == 2 else 13
    inputs = [case["x"], case["y_scale"], case["y_zero_point"]]
    expected = ort_run("QuantizeLinear", inputs, opset=opset, y_dtype=out, **attrs)
    got = quantize_linear(**{**case, "output_dtype": None})
    wraps, wrapped = naive.reference_wraps(**case)
    assert_bitexact(got, expected, mask=~wraps)
    if case["block_size"] and case["axis"] % case["x"].ndim != case["x"].ndim - 1:
        assert_bitexact(expected[wraps], wrapped[wraps].astype(out))
    else:
        assert_bitexact(got[wraps], expected[wraps])


def test_ort_rejects_a_rank2_one_element_scale():
    """ORT takes a (1, 1) scale for a per-axis one; the reference and qaccel: per-tensor."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    s, zp = np.full((1, 1), 0.5, np.float32), np.zeros((1, 1), np.int8)
    with pytest.raises(Exception, match="per axis quantization"):
        ort_run("QuantizeLinear", [x, s, zp], opset=21, y_dtype=np.int8)
    expected = reference("QuantizeLinear", [x, s, zp], opset=21, y_dtype=np.int8)
    assert_bitexact(quantize_linear(x, s, zp), expected)


def test_ort_divides_float16_in_float32():
    """ORT widens float16 to float32 before dividing; qaccel rounds the quotient (reference)."""
    x, s, even = F16_TIE
    zp = np.array(0, np.int8)
    ort = ort_run("QuantizeLinear", [x, s, zp], opset=19, y_dtype=np.int8)
    ref = reference("QuantizeLinear", [x, s, zp], opset=19, y_dtype=np.int8)
    got = quantize_linear(x, s, zp)
    assert_bitexact(got, ref)
    assert ort[0] == even + 1 and got[0] == even


def test_ort_ignores_precision():
    x, s, even = F16_TIE[0].astype(np.float32), F16_TIE[1].astype(np.float32), F16_TIE[2]
    zp = np.array(0, np.int8)
    attrs = {"precision": np.float16}
    ort = ort_run("QuantizeLinear", [x, s, zp], opset=23, y_dtype=np.int8, **attrs)
    ref = reference("QuantizeLinear", [x, s, zp], opset=23, y_dtype=np.int8, **attrs)
    got = quantize_linear(x, s, zp, precision=np.float16)
    assert_bitexact(got, ref)
    assert ort[0] == even + 1 and got[0] == even


def test_ort_float16_input_wraps_infinity():
    """ORT's float16 path turns +inf into qmin, as the reference does; qaccel saturates."""
    x = np.array([0x7C00, 0x7BFF], np.uint16).view(np.float16)  # +inf, 65504
    zp = np.array(0, np.int8)
    ort = ort_run("QuantizeLinear", [x, np.float16(1), zp], opset=19, y_dtype=np.int8)
    assert list(ort) == [-128, 127]
    assert list(quantize_linear(x, np.float16(1), zp)) == [127, 127]


def test_ort_non_saturating_float8_differs_near_max():
    """SEMANTICS 5: with saturate=0 ORT gives 448 for e4m3fn 480 and 481 (reference: NaN) and
    NaN for e5m2 +-61440 (reference: +-inf).  qaccel is the reference."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    cases = [
        (FLOAT8[0], np.array([480.0, 481.0, 448.0], np.float32), [448.0, 448.0, 448.0]),
        (FLOAT8[2], np.array([61440.0, -61440.0, 57344.0], np.float32), [np.nan, np.nan, 57344]),
    ]
    for out, x, ort_expected in cases:
        y_type = helper.np_dtype_to_tensor_dtype(out)
        nodes = [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], saturate=0),
            helper.make_node("Cast", ["q"], ["y"], to=TensorProto.FLOAT),
        ]
        graph = helper.make_graph(
            nodes, "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, None),
             helper.make_tensor_value_info("s", TensorProto.FLOAT, None),
             helper.make_tensor_value_info("z", y_type, None)],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        )  # fmt: skip
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
        model.ir_version = 10
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        zp = np.zeros((), out)
        feeds = {
            "x": ort.OrtValue.ortvalue_from_numpy(x),
            "s": ort.OrtValue.ortvalue_from_numpy(np.array(1, np.float32)),
            "z": ort.OrtValue.ortvalue_from_numpy_with_onnx_type(zp.view(np.uint8), y_type),
        }
        got_ort = sess.run_with_ort_values(None, feeds)[0].numpy()
        np.testing.assert_array_equal(got_ort, ort_expected)
        ref = reference("QuantizeLinear", [x, np.float32(1), zp], opset=19, y_dtype=out, saturate=0)
        got = quantize_linear(x, np.float32(1), zp, saturate=False)
        assert_bitexact(got, ref)
        assert not np.array_equal(got.astype(np.float32), got_ort, equal_nan=True)


def test_ort_and_qaccel_reject_a_longer_blocked_scale():
    """The reference accepts S * block_size >= D; ORT and qaccel want S == ceil(D / B)."""
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    s, zp = np.ones((2, 3), np.float32), np.zeros((2, 3), np.int8)  # ceil(6 / 4) = 2 blocks
    attrs = {"axis": 1, "block_size": 4}
    reference("QuantizeLinear", [x, s, zp], opset=21, y_dtype=np.int8, **attrs)  # accepted
    with pytest.raises(Exception, match="block"):
        ort_run("QuantizeLinear", [x, s, zp], opset=21, y_dtype=np.int8, **attrs)
    with pytest.raises(ValueError, match=r"must have shape \(2, 2\)"):
        quantize_linear(x, s, zp, **attrs)


@pytest.mark.parametrize(
    "inputs,attrs",
    [
        ([np.ones(3, BF16), np.ones((), BF16), np.zeros((), np.int8)], {}),
        ([np.ones(3, np.int32), np.ones((), np.int32), np.zeros((), np.int8)], {}),
        ([np.ones(3, np.float32), np.ones((), np.float32)], {"output_dtype": FLOAT4}),
    ],
    ids=["bfloat16-x", "int32-x", "float4-out"],
)
def test_ort_has_no_kernel_where_qaccel_has_the_reference(inputs, attrs):
    out = attrs.get("output_dtype", inputs[-1].dtype)
    opset = q_opset(inputs[0].dtype, inputs[1].dtype, out, attrs=attrs)
    with pytest.raises(Exception, match="NOT_IMPLEMENTED|INVALID_GRAPH|Type Error"):
        ort_run("QuantizeLinear", inputs, opset=opset, y_dtype=out, **attrs)
    expected = reference("QuantizeLinear", inputs, opset=opset, y_dtype=out, **attrs)
    assert_bitexact(quantize_linear(*inputs, **attrs), expected)


# --- kernels against the naive twins on random data, large enough to use every thread -------


@pytest.mark.parametrize(
    "xs,out,shape,scale_shape,axis,block",
    [
        ((F32, F32), np.int8, (256, 1200), (), 1, 0),
        ((F32, F32), np.uint8, (300, 1024), (1024,), 1, 0),
        ((F32, F32), np.int8, (600, 512), (600,), 0, 0),
        ((F32, F16), np.uint16, (512, 640), (512, 20), 1, 32),
        ((F16, F16), ml_dtypes.int4, (40, 96, 80), (40, 3, 80), 1, 40),
        ((BF16, BF16), FLOAT8[0], (300, 1000), (300, 34), -1, 30),
        ((I32, F32), np.int16, (1000, 300), (300,), -1, 0),
        ((F32, F32), FLOAT4, (300, 1000), (1,), 0, 0),
    ],
    ids=tid,
)
def test_kernels_match_naive_twin_on_random_data(xs, out, shape, scale_shape, axis, block):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(shape) * rng.choice([1, 30, 1e4], shape)).astype(xs[0])
    scale = (rng.uniform(0.05, 4, scale_shape) * rng.choice([-1, 1], scale_shape)).astype(xs[1])
    if np.dtype(out) in INT_TYPES:
        info = ml_dtypes.iinfo(out)
        zp = rng.integers(int(info.min), int(info.max) + 1, scale_shape).astype(out)
    else:
        zp = None
    kwargs = {"axis": axis, "block_size": block, "output_dtype": out if zp is None else None}
    assert_bitexact(
        quantize_linear(x, scale, zp, **kwargs), naive.quantize(x, scale, zp, **kwargs)
    )


def test_scalar_empty_and_strided_inputs():
    x0 = np.float32(3.7)
    assert_bitexact(quantize_linear(x0, np.float32(0.5)), np.array(7, np.uint8))
    empty = quantize_linear(np.zeros((0, 4), np.float32), np.ones(4, np.float32), axis=1)
    assert empty.shape == (0, 4) and empty.dtype == np.uint8
    xt = np.arange(24, dtype=np.float32).reshape(4, 6).T  # not C-contiguous
    scale = np.arange(8, dtype=np.float32)[1::2]  # neither
    expected = reference("QuantizeLinear", [xt.copy(), scale.copy()], opset=13, y_dtype=np.uint8)
    assert_bitexact(quantize_linear(xt, scale, axis=1), expected)
