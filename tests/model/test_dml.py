"""DirectML ELEMENT_WISE_QUANTIZE_LINEAR: float32 division, round half to even, clamp."""

from __future__ import annotations

import numpy as np
import pytest

from qaccel.model.dml import dml_quantize_linear
from qaccel.model.quant import quantize_linear

from . import naive_quant as naive
from .quant_helpers import assert_bitexact, tid
from .test_quantize import F16_TIE

# (input shape, scale shape, zero-point shape): ranks 1 to 8, zero strides anywhere
SHAPES = [
    ((7,), (1,), (1,)),
    ((7,), (7,), (1,)),
    ((4, 6), (1, 6), (1, 6)),
    ((4, 6), (4, 1), (1, 6)),
    ((2, 3, 5), (1, 3, 1), (1, 3, 1)),
    ((2, 3, 4, 5), (1, 3, 1, 1), (1, 1, 1, 1)),
    ((2, 3, 4, 5), (2, 3, 4, 5), (2, 3, 4, 5)),
    ((3, 1, 4, 2, 5), (1, 1, 4, 1, 5), (3, 1, 1, 2, 1)),
    ((2, 2, 3, 1, 2, 3), (2, 1, 3, 1, 1, 3), (1, 2, 1, 1, 2, 1)),
    ((2, 1, 2, 3, 1, 2, 2), (1, 1, 2, 1, 1, 1, 2), (2, 1, 1, 3, 1, 1, 1)),
    ((2, 2, 1, 3, 2, 1, 2, 3), (1, 2, 1, 3, 1, 1, 1, 3), (1, 1, 1, 1, 1, 1, 1, 1)),
]
SPECIALS = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e10, -1e10, 2.5, 3.5, -2.5, 127.5])


def _case(x_dtype, shapes, out, with_zp, seed=0):
    rng = np.random.default_rng(seed)
    x_shape, s_shape, z_shape = shapes
    s_dtype = np.float32 if x_dtype == np.int32 else x_dtype
    scale = rng.choice([0.5, 2.0, 0.37, -1.25, 0.0, 1e-3, 3.0], s_shape).astype(s_dtype)
    values = rng.uniform(-300, 300, x_shape)
    if x_dtype != np.int32:
        values.flat[: SPECIALS.size] = SPECIALS[: values.size]
        with np.errstate(over="ignore"):
            x = values.astype(x_dtype)
    else:
        x = np.rint(values * 1000).astype(np.int32)
    zp = None
    if with_zp:
        info = np.iinfo(out)
        zp = rng.integers(info.min, info.max, z_shape, endpoint=True).astype(out)
    return x, scale, zp


@pytest.mark.parametrize("with_zp", [True, False], ids=["zp", "nozp"])
@pytest.mark.parametrize("out", [np.int8, np.uint8], ids=tid)
@pytest.mark.parametrize("x_dtype", [np.float32, np.float16, np.int32], ids=tid)
@pytest.mark.parametrize("shapes", SHAPES, ids=lambda s: f"rank{len(s[0])}-{s[1]}")
def test_matches_naive_twin(shapes, x_dtype, out, with_zp):
    x, scale, zp = _case(x_dtype, shapes, out, with_zp)
    got = dml_quantize_linear(x, scale, zp, output_dtype=out)
    assert_bitexact(got, naive.dml_quantize(x, scale, zp, output_dtype=out))


def test_float32_equals_onnx_per_axis():
    x, scale, zp = _case(np.float32, ((4, 6, 5), (1, 6, 1), (1, 6, 1)), np.int8, True)
    onnx = quantize_linear(x, scale.reshape(6), zp.reshape(6), axis=1)
    assert_bitexact(dml_quantize_linear(x, scale, zp), onnx)


@pytest.mark.parametrize("x,s,even", [F16_TIE], ids=["float16"])
def test_float16_divides_in_float32(x, s, even):
    """The documented choice: float16 operands are widened, the quotient is not rounded to
    float16 (ONNX QuantizeLinear with float16 operands rounds it, and gets a tie)."""
    got = dml_quantize_linear(x, s.reshape(1), output_dtype=np.int8)
    assert got[0] == even + 1
    assert quantize_linear(x, s, output_dtype=np.int8)[0] == even
    assert quantize_linear(x, s, output_dtype=np.int8, precision=np.float32)[0] == even + 1


def test_int32_input_is_rounded_to_float32_first():
    # 16842753 = 128.5 * 2**17 + 1 becomes 128.5 * 2**17 in float32: a tie, rounded to even
    x = np.array([16842753], np.int32)
    scale = np.array([2.0**17], np.float32)
    assert dml_quantize_linear(x, scale, output_dtype=np.uint8)[0] == 128
    # ONNX QuantizeLinear divides an int32 in float64: 128.5000076 -> 129
    assert quantize_linear(x, scale, output_dtype=np.uint8)[0] == 129


def test_saturation_nan_and_zero_scale():
    x = np.array([1e10, -1e10, np.inf, -np.inf, np.nan, 1.0, 0.0, -1.0], np.float32)
    scale = np.array([1, 1, 1, 1, 1, 0, 0, 0], np.float32)
    got = dml_quantize_linear(x, scale, np.array([3], np.int8))
    assert_bitexact(got, np.int8([127, -128, 127, -128, -128, 127, -128, -128]))


@pytest.mark.parametrize("x_dtype", [np.float32, np.float16, np.int32], ids=tid)
def test_large_inputs_use_every_thread(x_dtype):
    x, scale, zp = _case(x_dtype, ((64, 48, 200), (1, 48, 1), (64, 1, 1)), np.uint8, True, seed=3)
    got = dml_quantize_linear(x, scale, zp)
    assert_bitexact(got, naive.dml_quantize(x, scale, zp))
