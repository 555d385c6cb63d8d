"""Slow, obviously correct NumPy twins of the quantisation kernels (tests only).

They follow onnx.reference's steps (the same NumPy divisions, casts and promotions) and
qaccel's documented behaviour where it differs: integer quantisation saturates instead of
wrapping through int32.  They do not use qaccel.model.indexing: scales are expanded with
``np.repeat`` / reshapes, as the reference expands them.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

_FLOAT8 = {
    np.dtype(t)
    for t in (
        ml_dtypes.float8_e4m3fn,
        ml_dtypes.float8_e4m3fnuz,
        ml_dtypes.float8_e5m2,
        ml_dtypes.float8_e5m2fnuz,
    )
}
_FLOAT4 = np.dtype(ml_dtypes.float4_e2m1fn)


def is_int(dtype) -> bool:
    return np.dtype(dtype) not in _FLOAT8 and np.dtype(dtype) != _FLOAT4


def expand(param: np.ndarray, shape, axis: int, block_size: int) -> np.ndarray:
    """Return ``param`` (scale or zero point) expanded to ``shape``."""
    param = np.asarray(param)
    if param.size == 1:
        return np.broadcast_to(param.reshape(()), shape)
    axis %= len(shape)
    if block_size:
        full = np.repeat(param, block_size, axis=axis)
        return np.take(full, np.arange(shape[axis]), axis=axis)
    dims = [1] * len(shape)
    dims[axis] = param.size
    return np.broadcast_to(param.reshape(dims), shape)


def quotient(x, scale, axis=1, block_size=0, precision=None) -> np.ndarray:
    """Return ``x / scale`` in the reference's precision."""
    s = expand(scale, x.shape, axis, block_size)
    with np.errstate(all="ignore"):
        if precision is not None:
            return x.astype(precision) / s.astype(precision)
        return x / s


def output_dtype_of(zero_point, output_dtype) -> np.dtype:
    if zero_point is not None:
        return np.dtype(zero_point.dtype)
    return np.dtype(np.uint8 if output_dtype is None else output_dtype)


def quantize(
    x,
    y_scale,
    y_zero_point=None,
    *,
    axis=1,
    block_size=0,
    output_dtype=None,
    saturate=True,
    precision=None,
):
    """QuantizeLinear: the reference's steps, saturating integer outputs (qaccel)."""
    zero_point = y_zero_point
    out = output_dtype_of(zero_point, output_dtype)
    q = quotient(x, y_scale, axis, block_size, precision)
    with np.errstate(all="ignore"):
        if is_int(out):
            info = ml_dtypes.iinfo(out)
            v = np.rint(q).astype(np.float64)
            if zero_point is not None:
                v = v + expand(zero_point, x.shape, axis, block_size).astype(np.float64)
            v = np.where(np.isnan(v), info.min, np.clip(v, info.min, info.max))
            return v.astype(out)
        if out in _FLOAT8:
            if saturate:
                fmax = float(ml_dtypes.finfo(out).max)
                q = np.clip(q, -fmax, fmax)
            return q.astype(out)
        if zero_point is not None:
            q = q + expand(zero_point, x.shape, axis, block_size)
        return q.astype(out)


def reference_wraps(
    x, y_scale, y_zero_point=None, *, axis=1, block_size=0, output_dtype=None, precision=None, **_
):
    """Return ``(mask, values)``: where onnx.reference's int32 arithmetic wraps, and its result.

    The reference computes ``clip(int32(rint(q)) + zero_point)`` in int32: NaN and quotients
    outside the int32 range become INT32_MIN, and the sum wraps around.  ``mask`` marks the
    elements where that differs from saturating arithmetic (huge and infinite quotients; NaN
    with a negative zero point); ``values`` is what the reference returns there (as float64).
    """
    out = output_dtype_of(y_zero_point, output_dtype)
    r = np.rint(quotient(x, y_scale, axis, block_size, precision)).astype(np.float64)
    zp = 0.0 if y_zero_point is None else expand(y_zero_point, x.shape, axis, block_size)
    with np.errstate(invalid="ignore"):
        outside = ~(np.abs(r) < 2.0**31)  # NaN too
        r32 = np.where(outside, -(2.0**31), r)
        total = r32 + zp
        wrapped = np.mod(total + 2.0**31, 2.0**32) - 2.0**31
        info = ml_dtypes.iinfo(out)
        values = np.clip(wrapped, info.min, info.max)
        mask = (outside & ~np.isnan(r)) | (total != wrapped)
    return mask, values


def dequantize(x, x_scale, x_zero_point=None, *, axis=1, block_size=0, output_dtype=None):
    """DequantizeLinear, as onnx.reference computes it (float8e8m0 scales need
    ``output_dtype``: the reference's float8e8m0 output is outside the spec, as in qaccel)."""
    x = np.asarray(x)
    if output_dtype is None and x_scale.dtype == ml_dtypes.float8_e8m0fnu:
        raise ValueError("output_dtype is required with a float8e8m0 x_scale")
    s = expand(x_scale, x.shape, axis, block_size)
    dx = x.astype(np.float32)
    if x_zero_point is not None and is_int(x.dtype):
        dx = dx - expand(x_zero_point, x.shape, axis, block_size)
    with np.errstate(all="ignore"):
        y = dx * s
        return y.astype(x_scale.dtype if output_dtype is None else output_dtype)


def dml_quantize(x, scale, zero_point=None, *, output_dtype=np.int8):
    """DML_ELEMENT_WISE_QUANTIZE_LINEAR as qaccel defines it: float32 division, RNE, clamp."""
    out = np.dtype(output_dtype if zero_point is None else zero_point.dtype)
    info = np.iinfo(out)
    s = np.broadcast_to(scale, x.shape).astype(np.float32)
    with np.errstate(all="ignore"):
        v = np.rint(x.astype(np.float32) / s).astype(np.float64)
        if zero_point is not None:
            v = v + np.broadcast_to(zero_point, x.shape)
        v = np.where(np.isnan(v), info.min, np.clip(v, info.min, info.max))
    return v.astype(out)
