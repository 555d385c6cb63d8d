"""Random example calls of the elementwise operators (the CLI's ``qaccel sim``, the demo,
benchmarks and notebooks)."""

from __future__ import annotations

import math

import numpy as np

from qaccel.model.dtypes import FLOAT_TYPES, QTYPES, SCALE_TYPES, dtype_name
from qaccel.model.indexing import broadcast_layout, scale_layout

from .builds import UNIT_OF

__all__ = ["example_call"]


def example_call(op: str, shape, *, dtype=None, scale_dtype=None, output_dtype=None,
                 axis: int | None = None, block_size: int = 0, zero_point: bool = True,
                 seed: int = 0) -> tuple[tuple, dict]:
    """Return ``(args, kwargs)`` of a realistic ``op`` call on random data.

    ``op`` is ``"quantize"``, ``"dequantize"`` or ``"dml"``; types are dtypes or qaccel's
    type names (``"int4"``, ``"float8e4m3fn"``, ``"bfloat16"``, ...). Granularity:
    per-tensor without ``axis``, per-axis with it, blocked with ``block_size`` too (DirectML:
    the scale varies along ``axis``, size 1 elsewhere). Quantize scales come from the largest
    magnitude their elements have (``amax / (range / 2)``), zero points are random and small;
    dequantize inputs are random codes. Defaults: float32 data and scales, int8 output
    (dequantize: int8 input, the scale's float type out; float32 for a float8e8m0 scale).
    """
    if op not in UNIT_OF:
        raise ValueError(f"op must be one of {', '.join(UNIT_OF)}, not {op!r}")
    shape = tuple(int(n) for n in shape)
    rng = np.random.default_rng(seed)
    if axis is None and block_size:
        raise ValueError("block_size needs an axis")
    ax = None if axis is None else axis % len(shape)
    if op == "dml":
        s_shape = tuple(n if d == ax else 1 for d, n in enumerate(shape))
    elif ax is None:
        s_shape = ()
    elif block_size:
        s_shape = tuple(-(-n // block_size) if d == ax else n for d, n in enumerate(shape))
    else:
        s_shape = (shape[ax],)
    layout = (broadcast_layout(shape, s_shape) if op == "dml" else
              scale_layout(shape, s_shape, ax or 0, block_size))
    idx = layout.indices().reshape(-1)
    n_scales = max(1, math.prod(s_shape))
    kwargs: dict = {}
    if ax is not None and op != "dml":
        kwargs = {"axis": ax, "block_size": block_size}

    if op == "dequantize":
        q = QTYPES[dtype_name(_dtype(dtype)) if dtype is not None else "int8"]
        if q.is_int:
            x = rng.integers(q.qmin, q.qmax, size=shape, endpoint=True).astype(q.dtype)
            zp = None
            if zero_point:
                zp = (rng.integers(q.qmin, q.qmax, size=s_shape, endpoint=True) // 8)
                zp = zp.astype(q.dtype)
        else:
            x = (rng.standard_normal(shape) * (q.qmax / 8)).astype(q.dtype)
            zp = None
        s_dt = _dtype(scale_dtype) if scale_dtype is not None else FLOAT_TYPES["float32"]
        scale = (0.01 + 0.04 * rng.random(s_shape)).astype(s_dt)
        if output_dtype is None and s_dt not in FLOAT_TYPES.values():
            output_dtype = "float32"            # a float8e8m0 scale is not an output type
        if output_dtype is not None:
            kwargs["output_dtype"] = _dtype(output_dtype)
        return (x, scale, zp), kwargs

    x_dt = _dtype(dtype) if dtype is not None else np.dtype(np.float32)
    if x_dt == np.int32:
        x = rng.integers(-1000, 1000, size=shape, endpoint=True).astype(np.int32)
    else:
        x = rng.standard_normal(shape).astype(x_dt)
    s_dt = (_dtype(scale_dtype) if scale_dtype is not None else
            x_dt if op == "dml" and x_dt != np.int32 else np.dtype(np.float32))
    out = QTYPES[dtype_name(_dtype(output_dtype)) if output_dtype is not None else "int8"]
    amax = np.zeros(n_scales)
    np.maximum.at(amax, idx, np.abs(x.astype(np.float64)).reshape(-1))
    half = (out.qmax - out.qmin) / 2 if out.is_int else out.qmax
    scale = np.where(amax > 0, amax / half, 1.0).reshape(s_shape)
    if s_dt == np.int32:
        scale = np.maximum(1, np.rint(scale))
    scale = scale.astype(s_dt)
    zp = None
    if zero_point and out.is_int:
        mid = 0 if out.signed else int(out.qmax + 1) // 2
        spread = max(1, int(out.qmax - out.qmin) // 16)
        zp = (mid + rng.integers(-spread, spread, size=s_shape, endpoint=True)).astype(out.dtype)
    kwargs["output_dtype"] = out.dtype
    return (x, scale, zp), kwargs


def _dtype(value) -> np.dtype:
    """A dtype from a dtype or a qaccel type name (``QTYPES`` / ``FLOAT_TYPES`` /
    ``SCALE_TYPES`` keys)."""
    if isinstance(value, str):
        if value in QTYPES:
            return QTYPES[value].dtype
        if value in FLOAT_TYPES:
            return FLOAT_TYPES[value]
        if value in SCALE_TYPES:
            return SCALE_TYPES[value]
    try:
        return np.dtype(value)
    except TypeError:
        raise TypeError(f"not a type: {value!r} (give a dtype or one of "
                        f"{', '.join([*QTYPES, *FLOAT_TYPES, *SCALE_TYPES])})") from None
