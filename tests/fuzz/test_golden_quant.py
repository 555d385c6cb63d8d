"""Property-based fuzzing of the golden QuantizeLinear, DequantizeLinear and DirectML quantize
(``qaccel.model``) against onnx.reference, bit for bit.

Cases come from :mod:`tests.fuzz.strategies` (every type the model takes, 0-d / empty /
1..4-D shapes, every granularity, edge values). Equal bytes are required everywhere except
where docs/semantics.md documents a difference, each encoded exactly:

- QuantizeLinear to integer types: where the reference's int32 arithmetic wraps
  (:func:`tests.model.naive_quant.reference_wraps`: quotients beyond int32, +-inf, NaN with
  a negative zero point) qaccel saturates; there the reference must give the wrapped value.
- DequantizeLinear of a NaN float8 ``x`` by a NaN scale: both NaN, qaccel's with the scale's
  sign (the reference's sign depends on NumPy's loop).
- DirectML has no reference implementation: it is compared with its documented formula
  (:func:`tests.model.naive_quant.dml_quantize`) and, where the layouts coincide (scale and
  zero point varying along one axis at most), with onnx.reference's QuantizeLinear with
  ``precision=float32`` (the same float32 division), outside the wrap-around above.
"""

from __future__ import annotations

import numpy as np
import pytest

from qaccel.model.dml import dml_quantize_linear
from qaccel.model.quant import dequantize_linear, quantize_linear
from tests.model import naive_quant as naive
from tests.model.quant_helpers import F32, assert_bitexact, dq_opset, q_opset, reference
from tests.model.test_quantize import check_against_reference

from .strategies import BUDGETS, dequantize_cases, dml_cases, quantize_cases, run


def check_quantize(case):
    """quantize_linear equals onnx.reference (and the naive twin) but where the reference
    wraps (integer outputs), where it must give the wrapped value."""
    case = dict(case)
    out, saturate = case.pop("out"), case.pop("saturate")
    if case["y_scale"].size == 0:
        _check_empty(quantize_linear(**case, saturate=saturate), case["x"], out)
        return
    check_against_reference(case, out, saturate)


def _check_empty(got, x, dtype):
    """An empty axis gives an empty scale, on which onnx.reference fails (the min of an empty
    zero point): the golden result is an empty array of x's shape and the output type."""
    assert got.shape == x.shape and got.size == 0 and got.dtype == dtype


def _dq_reference(case):
    x, scale, out = case["x"], case["x_scale"], case["output_dtype"]
    attrs = {"axis": case["axis"]}
    if case["block_size"]:
        attrs["block_size"] = case["block_size"]
    if out is not None:
        attrs["output_dtype"] = out
    opset = dq_opset(x.dtype, out, blocked=bool(case["block_size"]), scale_dtype=scale.dtype)
    opset = max(opset, 21 if scale.ndim > 1 else 0)  # opset 19 wants a scale of rank <= 1
    return reference("DequantizeLinear", [x, scale, case["x_zero_point"]], opset=opset,
                     y_dtype=scale.dtype if out is None else out, **attrs)


def check_dequantize(case):
    """dequantize_linear equals onnx.reference, but for NaN x times NaN scale (both NaN,
    qaccel's with the scale's sign)."""
    got = dequantize_linear(**case)
    if case["x_scale"].size == 0:
        out = case["output_dtype"]
        _check_empty(got, case["x"], case["x_scale"].dtype if out is None else out)
        return
    expected = _dq_reference(case)
    x = case["x"]
    s = naive.expand(case["x_scale"], x.shape, case["axis"], case["block_size"])
    s32 = s.astype(np.float32)
    nan_x = (np.zeros(x.shape, bool) if naive.is_int(x.dtype)
             else np.isnan(x.astype(np.float32)))
    both = nan_x & np.isnan(s32)
    assert_bitexact(got, expected, mask=~both)
    if np.any(both):
        assert np.isnan(got[both].astype(np.float32)).all()
        assert np.isnan(expected[both].astype(np.float32)).all()
        assert_bitexact(np.signbit(got[both].astype(np.float32)), np.signbit(s32[both]),
                        context="NaN x NaN keeps the scale's sign: ")


def _one_axis(shape, param_shape):
    """The axis along which a broadcast parameter varies, -1 if it is one element, None if it
    varies along several."""
    varying = [k for k, (d, p) in enumerate(zip(shape, param_shape, strict=True)) if p != 1]
    if len(varying) > 1:
        return None
    return varying[0] if varying else -1


def check_dml(case):
    """dml_quantize_linear equals its documented formula; where an ONNX layout expresses the
    broadcast, onnx.reference with precision=float32 too (outside the reference's wraps)."""
    x, scale, zp, out = case["input"], case["scale"], case["zero_point"], case["output_dtype"]
    got = dml_quantize_linear(x, scale, zp, output_dtype=out)
    assert_bitexact(got, naive.dml_quantize(x, scale, zp, output_dtype=out),
                    context="documented formula: ")
    axis = _one_axis(x.shape, scale.shape)
    if axis is None or (zp is not None and zp.shape != scale.shape):
        return
    onnx_shape = (scale.size,) if axis >= 0 else ()
    s = scale.reshape(onnx_shape)
    z = None if zp is None else zp.reshape(onnx_shape)
    kwargs = {"axis": max(axis, 0), "output_dtype": out, "precision": F32}
    attrs = {"axis": max(axis, 0), "precision": F32}
    if z is None:
        attrs["output_dtype"] = out
    opset = q_opset(x.dtype, s.dtype, out, precision=F32, attrs=attrs)
    expected = reference("QuantizeLinear", [x, s, z], opset=opset, y_dtype=out, **attrs)
    wraps, wrapped = naive.reference_wraps(x, s, z, **kwargs)
    assert_bitexact(got, expected, mask=~wraps, context="onnx.reference, precision float32: ")
    assert_bitexact(expected[wraps], wrapped[wraps].astype(out), context="reference wraps: ")


@pytest.mark.parametrize("budget", BUDGETS)
def test_quantize_matches_reference(budget):
    run(budget, quantize_cases(), check_quantize)


@pytest.mark.parametrize("budget", BUDGETS)
def test_dequantize_matches_reference(budget):
    run(budget, dequantize_cases(), check_dequantize)


@pytest.mark.parametrize("budget", BUDGETS)
def test_dml_matches_formula_and_reference(budget):
    run(budget, dml_cases(), check_dml)
