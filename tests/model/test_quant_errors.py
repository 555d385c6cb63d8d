"""Structural errors: one test each, matching the message.  Numeric edge cases (zero or
negative scales, NaN, infinities) are not errors and are covered by the other tests."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from qaccel.model.dml import dml_quantize_linear
from qaccel.model.quant import dequantize_linear, quantize_linear

X = np.zeros((3, 4), np.float32)
Q = np.zeros((3, 4), np.int8)
S4 = np.ones(4, np.float32)
S = np.float32(1)

QUANTIZE_ERRORS = {
    "axis out of range": (dict(y_scale=S4, axis=2), ValueError, r"axis must be in \[-2, 1\]"),
    "axis not an integer": (dict(y_scale=S4, axis=1.0), TypeError, "axis must be an integer"),
    "per-axis length": (
        dict(y_scale=np.ones(3, np.float32)), ValueError, r"1-D of length x.shape\[1\] = 4",
    ),
    "per-axis scale of rank 2": (
        dict(y_scale=np.ones((3, 4), np.float32)), ValueError, "for per-axis quantisation",
    ),
    "zero point shape": (
        dict(y_scale=S4, y_zero_point=np.zeros(3, np.uint8)), ValueError,
        r"y_zero_point must have the shape of the scale \(4,\)",
    ),
    "blocked: too few blocks": (
        dict(y_scale=np.ones((3, 1), np.float32), block_size=2), ValueError,
        r"y_scale must have shape \(3, 2\) .* block_size=2",
    ),
    "blocked: more blocks than ceil(D/B)": (
        dict(y_scale=np.ones((3, 3), np.float32), block_size=2), ValueError,
        r"must have shape \(3, 2\)",
    ),
    "blocked: other dimension differs": (
        dict(y_scale=np.ones((2, 2), np.float32), block_size=2), ValueError,
        r"must have shape \(3, 2\)",
    ),
    "blocked: scale rank": (
        dict(y_scale=np.ones((3, 2, 1), np.float32), block_size=2), ValueError,
        r"must have shape \(3, 2\)",
    ),
    "block_size negative": (
        dict(y_scale=S4, block_size=-1), ValueError, r"block_size must be in \[0, inf\]",
    ),
    "block_size not an integer": (
        dict(y_scale=S4, block_size=2.0), TypeError, "block_size must be an integer",
    ),
    "output_dtype contradicts zero point": (
        dict(y_scale=S, y_zero_point=np.int8(0), output_dtype=np.uint8), ValueError,
        "output_dtype uint8 contradicts the zero point's type int8",
    ),
    "unsupported output_dtype": (
        dict(y_scale=S, output_dtype=np.int32), TypeError, "output_dtype must be one of",
    ),
    "float output_dtype": (
        dict(y_scale=S, output_dtype=np.float32), TypeError, "output_dtype must be one of",
    ),
    "output_dtype not a dtype": (
        dict(y_scale=S, output_dtype="int9"), TypeError, "output_dtype must be a numpy",
    ),
    "zero point type": (
        dict(y_scale=S, y_zero_point=np.int32(0)), TypeError, "y_zero_point must be one of",
    ),
    "scale type": (dict(y_scale=np.float64(1)), TypeError, "y_scale must be one of"),
    "saturate type": (dict(y_scale=S, saturate="yes"), TypeError, "saturate must be a bool"),
    "saturate value": (dict(y_scale=S, saturate=2), ValueError, "saturate must be True/False"),
    "precision type": (dict(y_scale=S, precision=np.int8), TypeError, "precision must be one"),
    "precision float64": (
        dict(y_scale=S, precision=np.float64), TypeError, "precision must be one of",
    ),
    "precision not a dtype": (dict(y_scale=S, precision=16), TypeError, "precision must be"),
    "scale not an array": (dict(y_scale="1"), TypeError, "y_scale must be a numpy array"),
}


@pytest.mark.parametrize("kwargs,error,match", QUANTIZE_ERRORS.values(), ids=QUANTIZE_ERRORS)
def test_quantize_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        quantize_linear(X, **kwargs)


@pytest.mark.parametrize(
    "x", [X.astype(np.float64), Q, np.zeros(3, ml_dtypes.float8_e4m3fn)], ids=["f64", "i8", "f8"]
)
def test_quantize_rejects_unsupported_x(x):
    with pytest.raises(TypeError, match="x must be one of float32, float16, bfloat16, int32"):
        quantize_linear(x, S)


DEQUANTIZE_ERRORS = {
    "axis out of range": (dict(x_scale=S4, axis=-3), ValueError, r"axis must be in \[-2, 1\]"),
    "per-axis length": (
        dict(x_scale=np.ones(3, np.float32)), ValueError, r"1-D of length x.shape\[1\] = 4",
    ),
    "blocked shape": (
        dict(x_scale=np.ones((3, 3), np.float32), block_size=3), ValueError,
        r"x_scale must have shape \(3, 2\)",
    ),
    "zero point shape": (
        dict(x_scale=S4, x_zero_point=np.zeros((1, 4), np.int8)), ValueError,
        "x_zero_point must have the shape of the scale",
    ),
    "zero point type": (
        dict(x_scale=S, x_zero_point=np.uint8(0)), ValueError,
        r"x_zero_point must have the type of x \(int8\), not uint8",
    ),
    "scale type": (dict(x_scale=np.int32(1)), TypeError, "x_scale must be one of"),
    "output_dtype": (dict(x_scale=S, output_dtype=np.int8), TypeError, "output_dtype must be"),
    "block_size negative": (dict(x_scale=S4, block_size=-4), ValueError, "block_size must be"),
}


@pytest.mark.parametrize("kwargs,error,match", DEQUANTIZE_ERRORS.values(), ids=DEQUANTIZE_ERRORS)
def test_dequantize_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        dequantize_linear(Q, **kwargs)


@pytest.mark.parametrize("x", [X, Q.astype(np.int64), Q.astype(bool)], ids=["f32", "i64", "bool"])
def test_dequantize_rejects_unsupported_x(x):
    with pytest.raises(TypeError, match="x must be one of"):
        dequantize_linear(x, S)


def test_dequantize_float8_zero_point_must_be_zero():
    x = np.zeros(3, ml_dtypes.float8_e4m3fn)
    with pytest.raises(ValueError, match="x_zero_point must be zero for float8 types"):
        dequantize_linear(x, S, np.array(1.0, ml_dtypes.float8_e4m3fn))


F = np.zeros((2, 3), np.float32)
DML_ERRORS = {
    "rank mismatch": ((F, np.ones(3, np.float32)), {}, ValueError, "must have the rank of input"),
    "rank 9": (
        (np.zeros((1,) * 9, np.float32), np.ones((1,) * 9, np.float32)), {}, ValueError,
        "input must have 1 to 8 dimensions, not 9",
    ),
    "rank 0": ((np.float32(1), np.float32(1)), {}, ValueError, "1 to 8 dimensions, not 0"),
    "scale not broadcastable": (
        (F, np.ones((2, 2), np.float32)), {}, ValueError,
        r"scale shape \(2, 2\) does not broadcast to input shape \(2, 3\)",
    ),
    "zero point not broadcastable": (
        (F, np.ones((1, 3), np.float32), np.zeros((3, 1), np.int8)), {}, ValueError,
        "zero_point shape",
    ),
    "zero point rank": (
        (F, np.ones((1, 3), np.float32), np.zeros(3, np.int8)), {}, ValueError,
        "zero_point must have the rank of input",
    ),
    "int32 input, float16 scale": (
        (F.astype(np.int32), np.ones((1, 1), np.float16)), {}, TypeError,
        "an int32 input needs a float32 scale, not float16",
    ),
    "float16 input, float32 scale": (
        (F.astype(np.float16), np.ones((1, 1), np.float32)), {}, TypeError,
        r"scale must have the input's type \(float16\), not float32",
    ),
    "bfloat16 input": (
        (F.astype(ml_dtypes.bfloat16), np.ones((1, 1), ml_dtypes.bfloat16)), {}, TypeError,
        "input must be one of float32, float16, int32",
    ),
    "zero point type": (
        (F, np.ones((1, 1), np.float32), np.zeros((1, 1), np.int16)), {}, TypeError,
        "zero_point must be one of int8, uint8",
    ),
    "output_dtype": (
        (F, np.ones((1, 1), np.float32)), {"output_dtype": np.int16}, TypeError,
        "output_dtype must be one of int8, uint8",
    ),
}


@pytest.mark.parametrize("args,kwargs,error,match", DML_ERRORS.values(), ids=DML_ERRORS)
def test_dml_errors(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        dml_quantize_linear(*args, **kwargs)
