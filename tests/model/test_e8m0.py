"""float8e8m0 scales (opset 24): QuantizeLinear and DequantizeLinear bit-exact with
onnx.reference and the naive twins, for every element type, granularity, ``saturate`` and
``precision``; the type's name and ONNX number; errors; a model through the golden backend."""

from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from qaccel.model import dml
from qaccel.model.dtypes import E8M0_ONNX, FLOAT_TYPES, QTYPES, dtype_name, float_dtype
from qaccel.model.quant import dequantize_linear, division_dtype, quantize_linear

from . import naive_quant as naive
from . import test_dequantize as dq_tests
from .quant_helpers import (
    BF16,
    E8M0,
    F16,
    F32,
    FLOAT4,
    FLOAT8,
    I32,
    INT_TYPES,
    Q_OUTPUTS,
    assert_bitexact,
    dq_opset,
    reference,
    tid,
)
from .test_quantize import (
    GRANULARITIES,
    _absolute_specials,
    _cast,
    _qrange,
    _random_zero_point,
    _rounded_ties,
    _special_quotients,
    check_against_reference,
)

X_TYPES = (F32, F16, BF16, I32)
PRECISIONS = (None, F32, F16, BF16)
DQ_INPUTS = INT_TYPES + (I32,) + FLOAT8 + (FLOAT4,)
DQ_OUTPUTS = (F32, F16, BF16)

# 2**-127 (0x00), 2**-126 (0x01), 1 (0x7F), 2**127 (0xFE), NaN (0xFF)
SPECIAL_CODES = (0x00, 0x01, 0x7F, 0xFE, 0xFF)
# cycled over multi-element scales: the special codes; float16's edges (2**-25 rounds to 0,
# 2**-24 its smallest subnormal, 2**-14 its smallest normal, 2**15 its largest power of two,
# 2**16 overflows); codes next to the ends; ordinary powers of two
SCALE_CODES = [*SPECIAL_CODES, 0x66, 0x67, 0x71, 0x8E, 0x8F, 0x02, 0xFD, 0x7A, 0x83, 0x79, 0x80,
               0x75, 0x7C]  # fmt: skip


def e8m0(codes) -> np.ndarray:
    """float8e8m0 array of the given codes."""
    return np.asarray(codes, np.uint8).view(E8M0)


def _rng(*key):
    return np.random.default_rng(zlib.crc32("/".join(map(str, key)).encode()))


def _cycled_scale(shape, rng) -> np.ndarray:
    start = rng.integers(len(SCALE_CODES))
    codes = np.resize(np.roll(SCALE_CODES, -start), int(np.prod(shape)))
    return e8m0(codes).reshape(shape)


# --- the type ------------------------------------------------------------------------------


def test_e8m0_is_a_named_scale_type_only():
    assert dtype_name(E8M0) == "float8e8m0"
    assert E8M0_ONNX == TensorProto.FLOAT8E8M0 == helper.np_dtype_to_tensor_dtype(E8M0)
    assert helper.tensor_dtype_to_np_dtype(E8M0_ONNX) == E8M0
    assert "float8e8m0" not in QTYPES and E8M0 not in FLOAT_TYPES.values()
    with pytest.raises(TypeError, match="dtype must be one of float32, float16, bfloat16; got "
                                        "'float8e8m0'"):
        float_dtype(E8M0)
    with pytest.raises(TypeError, match="scale must be one of float32, float16; got 'float8e8m0'"):
        dml.dml_quantize_linear(np.float32([1.0]), e8m0(0x7F))


def test_special_codes_decode():
    values = e8m0(SPECIAL_CODES).astype(np.float64)
    np.testing.assert_array_equal(values, [2.0**-127, 2.0**-126, 1.0, 2.0**127, np.nan])


@pytest.mark.parametrize("x_dtype", X_TYPES, ids=tid)
def test_division_dtype_is_numpys(x_dtype):
    numpy_result = (np.ones(1, x_dtype) / e8m0([0x7F])).dtype
    assert division_dtype(x_dtype, E8M0) == numpy_result == (np.float64 if x_dtype == I32 else F32)


# --- QuantizeLinear --------------------------------------------------------------------------


def _subnormal_quotients(out):
    """Quotients around the smallest subnormal of a float output (ties included)."""
    if naive.is_int(out):
        return np.array([])
    tiny = float(ml_dtypes.finfo(out).smallest_subnormal)
    return tiny * np.array([0.25, 0.5, 0.75, 1.0, 1.5, 2.5, 3.5, -0.5, -1.5, -2.5])


def make_q_case(x_dtype, out, gran, precision=None):
    """quantize_linear's arguments with a float8e8m0 scale of :data:`SCALE_CODES`, and x
    probing ties, limits, subnormal quotients and special values (as test_quantize's)."""
    x_shape, s_shape, axis, block, with_zp = GRANULARITIES[gran]
    rng = _rng(x_dtype, np.dtype(out), gran, precision)
    scale = _cycled_scale(s_shape, rng)
    s_elem = naive.expand(scale, x_shape, axis, block).reshape(-1)
    division = precision if precision is not None else division_dtype(x_dtype, E8M0)
    with np.errstate(all="ignore"):
        s_div = s_elem.astype(division).astype(np.float64)

    lo, hi = _qrange(out)
    n = int(np.prod(x_shape))
    u = rng.uniform(1.6 * lo - 2, 1.6 * hi + 2, n)
    special_q = np.concatenate([_special_quotients(out), _subnormal_quotients(out)])
    u[: special_q.size] = special_q
    with np.errstate(all="ignore"):
        x = _cast(u * s_div, x_dtype)
    tie_at = slice(special_q.size, special_q.size + 12)
    if precision is None:
        x[tie_at] = _rounded_ties(x[tie_at], s_elem[tie_at], division)
    absolute = _absolute_specials(x_dtype)
    x[n - absolute.size :] = _cast(absolute, x_dtype)

    zero_point = _random_zero_point(out, s_shape, rng) if with_zp else None
    return {
        "x": x.reshape(x_shape),
        "y_scale": scale,
        "y_zero_point": zero_point,
        "axis": axis,
        "block_size": block,
        "output_dtype": None if with_zp else out,
        "precision": precision,
    }


@pytest.mark.parametrize("saturate", [True, False], ids=["sat", "nosat"])
@pytest.mark.parametrize("gran", GRANULARITIES)
@pytest.mark.parametrize("out", Q_OUTPUTS, ids=tid)
@pytest.mark.parametrize("precision", PRECISIONS, ids=tid)
@pytest.mark.parametrize("x_dtype", X_TYPES, ids=tid)
def test_quantize_matches_reference(x_dtype, precision, out, gran, saturate):
    check_against_reference(make_q_case(x_dtype, out, gran, precision), out, saturate)


def _x_probes(x_dtype, rng) -> np.ndarray:
    """x values whose quotients, over all 256 scale codes, overflow, underflow to subnormals,
    tie, saturate and stay NaN / infinite; plus random magnitudes from 2**-140 to 2**140."""
    fixed = [0.0, -0.0, 0.5, 1.0, -1.0, 1.5, 2.5, -2.5, 3.0, 6.0, 7.0, 127.5, -128.5, 255.5,
             448.0, 480.0, 57344.0, 65504.0, 32767.5, 1e-3, 3.0 * 2.0**-126]  # fmt: skip
    with np.errstate(all="ignore"):
        rand = rng.standard_normal(40) * np.exp2(rng.integers(-140, 141, 40).astype(float))
    x = _cast(np.array(fixed + list(rand)), x_dtype)
    return np.concatenate([x, _cast(_absolute_specials(x_dtype), x_dtype)])


@pytest.mark.parametrize("saturate", [True, False], ids=["sat", "nosat"])
@pytest.mark.parametrize("out", Q_OUTPUTS, ids=tid)
@pytest.mark.parametrize("precision", PRECISIONS, ids=tid)
@pytest.mark.parametrize("x_dtype", X_TYPES, ids=tid)
def test_quantize_every_scale_code(x_dtype, precision, out, saturate):
    """Each x probe divided by each of the 256 codes (per-axis scale), with a zero point."""
    rng = _rng("every-code", x_dtype, np.dtype(out), precision)
    x = np.repeat(_x_probes(x_dtype, rng)[:, None], 256, axis=1)
    lo, hi = _qrange(out)
    if naive.is_int(out):
        zp = rng.integers(int(lo), int(hi) + 1, 256).astype(out)
    else:
        zp = rng.choice([-1.0, -0.0, 0.0, 2.0], 256).astype(out)
    case = {"x": x, "y_scale": e8m0(np.arange(256)), "y_zero_point": zp, "axis": 1,
            "block_size": 0, "output_dtype": None, "precision": precision}  # fmt: skip
    check_against_reference(case, out, saturate)


@pytest.mark.parametrize(
    "code,out,expected",
    [
        (0x66, np.int8, 127),  # 2**-25 -> float16 0: 3 / 0 = inf, saturated
        (0x67, np.int8, 127),  # 2**-24: 3 * 2**24 overflows float16 too
        (0x71, np.int8, 127),  # 2**-14: 3 * 2**14 = 49152 fits float16, saturates int8
        (0x8F, FLOAT8[0], 0.0),  # 2**16 -> float16 inf: 3 / inf = 0
        (0x8E, FLOAT8[2], 1.5 * 2.0**-14),  # 2**15 still fits float16
        (0x66, FLOAT8[0], 448.0),  # inf, saturated
        (0x66, FLOAT4, 6.0),  # inf, float4e2m1 always saturates
    ],
    ids=lambda v: f"{v:#04x}" if isinstance(v, int) and not isinstance(v, bool) else tid(v),
)
def test_float16_precision_underflows_and_overflows_the_scale(code, out, expected):
    """``precision`` casts the scale too: float16 holds 2**-24 .. 2**15 of e8m0's range."""
    x, s = np.float32([3.0]), e8m0([code])
    got = quantize_linear(x, s, output_dtype=out, precision=np.float16)
    assert got.astype(np.float64)[0] == expected
    ref = reference("QuantizeLinear", [x, s], opset=24, y_dtype=out, output_dtype=out,
                    precision=np.float16)  # fmt: skip
    if np.dtype(out) == np.int8 and code in (0x66, 0x67):
        assert ref[0] == -128  # the reference's int32 wraps +inf (the documented deviation)
    else:
        assert_bitexact(got, ref)


# --- DequantizeLinear ------------------------------------------------------------------------


def run_dq_reference(case):
    attrs = {"axis": case["axis"], "output_dtype": case["output_dtype"]}
    if case["block_size"]:
        attrs["block_size"] = case["block_size"]
    x, scale = case["x"], case["x_scale"]
    opset = dq_opset(x.dtype, case["output_dtype"], blocked=bool(case["block_size"]),
                     scale_dtype=scale.dtype)  # fmt: skip
    return reference("DequantizeLinear", [x, scale, case["x_zero_point"]], opset=opset,
                     y_dtype=case["output_dtype"], **attrs)  # fmt: skip


def check_dq(case):
    """Bit-exact with the reference and the twin, except the sign of NaN where x and the scale
    are both NaN (IEEE 754 leaves it open; see the quant module's deviations)."""
    got = dequantize_linear(**case)
    x, scale = case["x"], case["x_scale"]
    s = naive.expand(scale, x.shape, case["axis"], case["block_size"])
    both_nan = np.isnan(x.astype(np.float32)) & np.isnan(s.astype(np.float32))
    for expected, context in [(run_dq_reference(case), ""), (naive.dequantize(**case), "twin: ")]:
        assert_bitexact(got, expected, mask=~both_nan, context=context)
        assert np.isnan(got[both_nan].astype(np.float32)).all()
        assert np.isnan(expected[both_nan].astype(np.float32)).all()


@pytest.mark.parametrize("gran", GRANULARITIES)
@pytest.mark.parametrize("out", DQ_OUTPUTS, ids=tid)
@pytest.mark.parametrize("x_dtype", DQ_INPUTS, ids=tid)
def test_dequantize_matches_reference(x_dtype, out, gran):
    """test_dequantize's cases (codes, zero points), with float8e8m0 scales."""
    case = dq_tests.make_case(x_dtype, F32, gran, out)
    case["x_scale"] = _cycled_scale(case["x_scale"].shape, _rng("dq", x_dtype, out, gran))
    check_dq(case)


SMALL_DQ_INPUTS = tuple(t for t in DQ_INPUTS if t.itemsize == 1)


@pytest.mark.parametrize("out", DQ_OUTPUTS, ids=tid)
@pytest.mark.parametrize("x_dtype", SMALL_DQ_INPUTS, ids=tid)
def test_dequantize_every_code_times_every_scale_code(x_dtype, out):
    """Exhaustive: each code of x (a row) times each of the 256 scale codes (a column); integer
    types with a random zero point per scale code."""
    bits = (ml_dtypes.iinfo if naive.is_int(x_dtype) else ml_dtypes.finfo)(x_dtype).bits
    codes = np.arange(2**bits, dtype=np.uint8).view(x_dtype)
    x = np.repeat(codes[:, None], 256, axis=1)
    zp = None
    if naive.is_int(x_dtype):
        zp = _rng("zp", x_dtype).choice(codes, 256)
    check_dq({"x": x, "x_scale": e8m0(np.arange(256)), "x_zero_point": zp, "axis": 1,
              "block_size": 0, "output_dtype": out})  # fmt: skip


@pytest.mark.parametrize("out", DQ_OUTPUTS, ids=tid)
@pytest.mark.parametrize("x_dtype", [np.dtype(np.int16), np.dtype(np.uint16)], ids=tid)
def test_dequantize_every_16bit_code_times_the_scale_codes(x_dtype, out):
    codes = np.arange(2**16, dtype=np.uint16).view(x_dtype)
    x = np.repeat(codes[:, None], len(SCALE_CODES), axis=1)
    zp = _rng("zp16", x_dtype).choice(codes, len(SCALE_CODES))
    check_dq({"x": x, "x_scale": e8m0(SCALE_CODES), "x_zero_point": zp, "axis": -1,
              "block_size": 0, "output_dtype": out})  # fmt: skip


def test_reference_would_return_e8m0_without_output_dtype():
    """Why qaccel requires ``output_dtype``: the reference casts the product to the scale's
    type, float8e8m0, which is not among the spec's outputs (and loses sign and mantissa)."""
    x, s = np.int8([-3, 3]), e8m0([0x7F])
    ref = reference("DequantizeLinear", [x, s], opset=24, y_dtype=E8M0)
    assert ref.dtype == E8M0
    with pytest.raises(ValueError, match="output_dtype is required with a float8e8m0 x_scale"):
        dequantize_linear(x, s)
    with pytest.raises(ValueError, match="output_dtype is required"):
        naive.dequantize(x, s)


# --- errors ----------------------------------------------------------------------------------

_X, _S = np.float32([1.0, 2.0]), e8m0([0x7F])


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda: quantize_linear(_S, _S), TypeError, "x must be one of .*got 'float8e8m0'"),
        (lambda: quantize_linear(_X, _S, e8m0(0x7F)), TypeError,
         "y_zero_point must be one of .*got 'float8e8m0'"),
        (lambda: quantize_linear(_X, _S, output_dtype=E8M0), TypeError,
         "output_dtype must be one of .*got 'float8e8m0'"),
        (lambda: quantize_linear(_X, _S, precision=E8M0), TypeError,
         "precision must be one of float32, float16, bfloat16; got 'float8e8m0'"),
        (lambda: quantize_linear(_X, e8m0([0x7F, 0x80, 0x81]), axis=0), ValueError, "y_scale"),
        (lambda: dequantize_linear(_S, _S, output_dtype=F32), TypeError,
         "x must be one of .*got 'float8e8m0'"),
        (lambda: dequantize_linear(np.int8([1]), _S), ValueError,
         "output_dtype is required with a float8e8m0 x_scale"),
        (lambda: dequantize_linear(np.int8([1]), _S, output_dtype=E8M0), TypeError,
         "output_dtype must be one of float32, float16, bfloat16; got 'float8e8m0'"),
        (lambda: dequantize_linear(np.int8([1]), _S, e8m0(0x7F), output_dtype=F32), ValueError,
         "x_zero_point must have the type of x"),
        (lambda: dequantize_linear(np.float32([1]), _S, output_dtype=F32), TypeError,
         "x must be one of"),
    ],
    ids=["q-x", "q-zero-point", "q-output-dtype", "q-precision", "q-scale-shape", "dq-x",
         "dq-no-output-dtype", "dq-e8m0-output", "dq-zero-point", "dq-float32-x"],
)
def test_errors_name_the_parameter(call, error, match):
    with pytest.raises(error, match=match):
        call()


# --- an ONNX model through the golden backend ------------------------------------------------


def _one_node_model(op, x, scale, out_dtype, **attrs):
    """``op``(x, scale initializer) with ``attrs``; x a graph input."""
    node = helper.make_node(op, ["x", "s"], ["y"], **attrs)
    graph = helper.make_graph(
        [node], op,
        [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)],
        [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(np.dtype(out_dtype)),
                                       x.shape)],
        initializer=[numpy_helper.from_array(scale, "s")],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)])


MODEL_CASES = {
    "q-int8-blocked": ("QuantizeLinear", np.float32, np.int8,
                       {"axis": 1, "block_size": 4, "output_dtype": TensorProto.INT8}),
    "q-fp4-axis": ("QuantizeLinear", np.float16, FLOAT4,
                   {"axis": 0, "output_dtype": TensorProto.FLOAT4E2M1}),
    "q-e4m3-tensor": ("QuantizeLinear", ml_dtypes.bfloat16, FLOAT8[0],
                      {"output_dtype": TensorProto.FLOAT8E4M3FN, "saturate": 0}),
    "dq-int4-blocked": ("DequantizeLinear", ml_dtypes.int4, F32,
                        {"axis": 1, "block_size": 4, "output_dtype": TensorProto.FLOAT}),
    "dq-e4m3-axis": ("DequantizeLinear", FLOAT8[0], BF16,
                     {"axis": 0, "output_dtype": TensorProto.BFLOAT16}),
}  # fmt: skip


@pytest.mark.parametrize("name", MODEL_CASES)
def test_golden_backend_runs_e8m0_models_like_the_reference(name):
    from onnx.reference import ReferenceEvaluator

    import qaccel.backend.golden as golden

    op, x_dtype, out_dtype, attrs = MODEL_CASES[name]
    rng = _rng("model", name)
    shape = (3, 8)
    if op == "DequantizeLinear":
        x = rng.integers(-8, 8, shape).astype(x_dtype)
    else:  # quotients within int32 (where the reference wraps and qaccel saturates)
        x = (rng.standard_normal(shape) * 4).astype(x_dtype)
        x.flat[:3] = [np.nan, 1e3, -500.0]
    s_shape = (3, 2) if attrs.get("block_size") else (3,) if "axis" in attrs else ()
    scale = e8m0(rng.choice([0x79, 0x7C, 0x7F, 0x81, 0xFF], s_shape))
    model = _one_node_model(op, x, scale, out_dtype, **attrs)
    rep = golden.prepare(model)
    (got,) = rep.run([x])
    with np.errstate(invalid="ignore"):  # the reference casts NaN to int32
        (expected,) = ReferenceEvaluator(model).run(None, {"x": x})
    assert_bitexact(got, expected)
    assert rep.node_counts == {op: 1}
