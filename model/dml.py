"""DirectML ``DML_OPERATOR_ELEMENT_WISE_QUANTIZE_LINEAR`` golden model.

``output = clamp(round(input / scale) + zero_point, Min, Max)`` element by element, with
``[Min, Max]`` = [-128, 127] for int8 and [0, 255] for uint8.

DirectML gives every tensor the same DimensionCount (1 to 8) and Sizes and broadcasts with zero
strides; here NumPy shapes stand in for that: ``scale`` and ``zero_point`` must have the rank
of ``input`` and each of their sizes must be ``input``'s or 1 (:func:`.indexing.broadcast_layout`).

The DirectML documentation names neither the rounding nor the division precision.  qaccel
chooses, and is bit-exact with:

- division in **float32**, correctly rounded: float16 inputs and scales are widened to
  float32 exactly, an int32 input is converted to float32 with round-half-even;
- ``round`` = round half to even (HLSL ``round``), then ``+ zero_point`` and the clamp;
- quotients beyond the range, and +-inf, saturate; NaN (for example 0 / 0) gives ``Min``.
  A zero scale is undefined in DirectML; here it gives what IEEE division gives.

Array-likes follow :mod:`.quant`'s rule (NumPy arrays keep their dtype, a non-native byte
order becomes native): Python numbers, lists and tuples become, for ``input``, float32
(some float) or int32 (all ints); for ``scale``, ``input``'s type (float32 for an int32
``input``); for ``zero_point``, ``output_dtype`` (default int8), exactly.  Each must still
have ``input``'s rank (DirectML's DimensionCount): ``scale=[[0.5]]`` for a 2-D input.
"""

from __future__ import annotations

import numpy as np

from . import quant_kernels as qk
from .dtypes import dtype_name, qtype
from .indexing import broadcast_layout
from .quant import CheckedCall
from .validate import as_array, check_dtype, dtype_expr, is_python_data

__all__ = ["check_dml", "dml_quantize_linear"]

#: DirectML tensors have 1 to 8 dimensions.
MAX_RANK = 8


def check_dml(input, scale, zero_point=None, *, output_dtype=np.int8) -> CheckedCall:
    """Check the arguments of :func:`dml_quantize_linear` (its exceptions, nothing computed);
    ``scale`` and ``zero_point`` come back broadcast to their common shape."""
    x = as_array("input", input, floats=np.float32, ints=np.int32)
    x_dtype = check_dtype("input", x, ("float32", "float16", "int32"))
    s_type = np.float32 if x_dtype == np.int32 else x_dtype
    scale = as_array("scale", scale, floats=s_type, ints=s_type)
    s_dtype = check_dtype("scale", scale, ("float32", "float16"))
    if x_dtype == np.int32 and s_dtype != np.float32:
        raise TypeError(f"an int32 input needs a float32 scale, not {dtype_name(s_dtype)}: "
                        f"convert it: scale.astype(np.float32)")
    if x_dtype != np.int32 and s_dtype != x_dtype:
        raise TypeError(
            f"scale must have the input's type ({dtype_name(x_dtype)}), not "
            f"{dtype_name(s_dtype)}: convert it: scale.astype({dtype_expr(x_dtype)})"
        )
    if zero_point is None:
        out_q = qtype(output_dtype, param="output_dtype", allowed=("int8", "uint8"))
    else:
        zp_type = qtype(output_dtype, param="output_dtype", allowed=("int8", "uint8")).dtype \
            if is_python_data(zero_point) else None
        zero_point = as_array("zero_point", zero_point, floats=zp_type, ints=zp_type,
                              exact=True, why="output_dtype, default int8")
        check_dtype("zero_point", zero_point, ("int8", "uint8"))
        out_q = qtype(zero_point.dtype, param="zero_point", allowed=("int8", "uint8"))
    if not 1 <= x.ndim <= MAX_RANK:
        fix = "input.reshape(1)" if x.ndim == 0 else "merge dimensions: input.reshape(...)"
        raise ValueError(f"input must have 1 to {MAX_RANK} dimensions, not {x.ndim}: {fix}")

    layout = broadcast_layout(x.shape, scale.shape, param="scale")
    if zero_point is not None and zero_point.shape != scale.shape:
        # one layout serves both: broadcast them to their common shape
        broadcast_layout(x.shape, zero_point.shape, param="zero_point")
        shape = np.broadcast_shapes(scale.shape, zero_point.shape)
        scale = np.broadcast_to(scale, shape)
        zero_point = np.broadcast_to(zero_point, shape)
        layout = broadcast_layout(x.shape, shape, param="scale")

    return CheckedCall(x, scale, zero_point, layout, out_q.dtype, out_q=out_q,
                       division=np.dtype(np.float32), saturate=True)


def dml_quantize_linear(input, scale, zero_point=None, *, output_dtype=np.int8):
    """Quantise ``input`` as DML_ELEMENT_WISE_QUANTIZE_LINEAR does (see the module notes).

    Parameters
    ----------
    input : array_like
        float32, float16 or int32, 1 to 8 dimensions (Python floats: float32, ints: int32).
    scale : array_like
        The rank of ``input``, each size ``input``'s or 1; float32 for an int32 input,
        otherwise ``input``'s type (Python numbers become that type).
    zero_point : array_like, optional
        int8 or uint8, shaped like ``scale`` (independently broadcast); its type is the
        output type (Python numbers: ``output_dtype``, exactly).
    output_dtype : dtype
        int8 or uint8, the output type when there is no zero point (ignored otherwise).

    Returns
    -------
    ndarray
        Shape of ``input``, int8 or uint8.

    Raises
    ------
    TypeError
        Unsupported or inconsistent dtypes (naming the conversion to make).
    ValueError
        Ranks outside 1..8 or different, sizes that do not broadcast.
    """
    c = check_dml(input, scale, zero_point, output_dtype=output_dtype)
    x, scale, zero_point, out_q, layout = c.x, c.scale, c.zero_point, c.out_q, c.layout
    x_dtype = x.dtype

    flat = np.ascontiguousarray(x).reshape(-1)
    xk, xfmt = (flat.view(np.uint16), qk.FMT_F16) if x_dtype == np.float16 else (flat, 0)
    sk = np.ascontiguousarray(scale, dtype=np.float32).reshape(-1)
    if zero_point is None:
        zk = np.zeros(sk.size, np.uint8)
    else:
        zk = np.ascontiguousarray(zero_point).reshape(-1).view(np.uint8)
    out = qk.output_buffer(layout.size, np.uint8)
    sizes, strides, blocks, n_items = layout.kernel_args()
    mask, sgn = np.int32(0xFF), np.int32(0x80 if out_q.signed else 0)
    lo, hi = np.float32(out_q.qmin), np.float32(out_q.qmax)
    prm = (xfmt, 0, mask, sgn, lo, hi)
    args = (xk, sk, zk, out, sizes, strides, blocks, prm)
    qk.run_items(qk.quantize_int_kernel, n_items, layout.size, *args)
    return out.view(out_q.dtype).reshape(x.shape)
