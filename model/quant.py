"""ONNX QuantizeLinear and DequantizeLinear, bit-exact with ``onnx.reference``.

Both functions take and return NumPy arrays (ml_dtypes arrays for the sub-byte, float8 and
float4 types), mirror the ONNX argument names, and return exactly the shape and dtype the ONNX
reference implementation (onnx 1.23, opsets 10 to 25) returns.  Every output bit equals the
reference's, except where documented below.

Granularity comes from the scale's shape (see :func:`.indexing.scale_layout`): one element =
per-tensor (whatever its rank and ``axis``), 1-D = per-axis, same rank as ``x`` with
``block_size > 0`` = blocked (the last block may be partial).  The zero point must have the
scale's shape (two one-element arrays of different rank are accepted).

Scope: the semantics of the latest opset, which contain the earlier ones (an older model's
restrictions, such as opset 19's rank-1 scales, are not enforced).  Not supported: the float6
types (opset 28).

float8e8m0 scales (opset 24; :data:`.dtypes.E8M0`, powers of two ``2**(c - 127)``, code 0xFF
NaN) are accepted wherever the spec allows them: QuantizeLinear's ``y_scale`` (not ``x``) and
DequantizeLinear's ``x_scale``, for every element type and granularity.  As in the reference,
the scale is widened exactly: QuantizeLinear divides in float32 (float64 for an int32 ``x``),
or, with ``precision``, casts the scale to it (to float16 it underflows to 0 below 2**-24 and
overflows to infinity from 2**16); DequantizeLinear multiplies in float32 (float64 for int32
with a zero point).  With such a scale DequantizeLinear requires ``output_dtype`` (ValueError
without it): the reference would return float8e8m0, which the spec's output types exclude.

Array-likes and byte order
--------------------------
NumPy arrays and scalars (and other libraries' arrays, through ``__array__``) keep their
dtype: a float64 array is refused (TypeError naming the allowed types and the fix,
``x.astype(np.float32)``), as the ONNX type constraints exclude it.  A non-native byte order
(``x.astype('>f4')``) is converted to the native one of the same type.  Python numbers,
lists and tuples have no ONNX type; they become, per parameter (ints must fit, zero points
must be exact, else ValueError naming the value):

=====================  ===================================================================
parameter              what Python numbers (lists, tuples) become
=====================  ===================================================================
Q ``x``                float32 (some Python float), int32 (all ints)
Q ``y_scale``          ``x``'s type if float32, float16 or bfloat16, else float32
Q ``y_zero_point``     ``output_dtype`` (default uint8): the zero point's type is the output's
DQ ``x``               a typed ``x_zero_point``'s type; without one int32 (floats refused)
DQ ``x_scale``         ``output_dtype`` if given, else float32
DQ ``x_zero_point``    ``x``'s type
=====================  ===================================================================

So ``quantize_linear([1.5, 2.6], 1.0, [3], output_dtype=np.int8)`` is
``quantize_linear(np.float32([1.5, 2.6]), np.float32(1), np.int8([3]))``: the rule of opsets
10 to 21 that ``x`` and its scale share a type, and the spec's rule that the zero point's type
is the output's.  onnx.reference (1.23) itself refuses Python lists and numbers (its operators
read ``.shape`` and ``.dtype``; TypeError "Issues with types"); it divides big-endian float
arrays as NumPy does, with the same result, and refuses a big-endian integer ``x`` of
DequantizeLinear ("Unable to convert type").

Documented deviations from onnx.reference
-----------------------------------------
- **float64 ``x``.**  The reference divides whatever NumPy divides, float64 too; qaccel
  keeps to the spec's types (TypeError, with the conversion to make).
- **Saturation where the reference's int32 arithmetic wraps (QuantizeLinear to integer
  types).**  The reference computes ``clip(int32(rint(x / scale)) + zero_point)`` in int32:
  quotients beyond the int32 range, +-inf and NaN become INT32_MIN, and the sum with the zero
  point wraps around.  So +1e10 or +inf gives ``qmin`` (0 for uint8), and NaN with a negative
  zero point gives ``qmax``.  qaccel follows the spec and saturates: large positive or +inf
  gives ``qmax``, large negative or -inf ``qmin``, NaN always ``qmin``.  ONNX Runtime
  saturates the same way in its per-tensor and per-axis kernels (not in its float16-input
  kernel, nor for blocks along an axis other than the last, which wrap like the reference).
- **Blocked scale shape.**  The reference accepts any scale with ``S * block_size >= D``
  along the axis (the extra blocks are never used); qaccel requires ``S == ceil(D /
  block_size)``, as the spec and ONNX Runtime do.
- **NaN times NaN (DequantizeLinear).**  Where a float8 ``x`` and its scale are both NaN the
  output is NaN, but which operand's NaN (sign bit) survives is left open by IEEE 754 and
  differs between NumPy's loops: the reference (NumPy) keeps ``x``'s, except with a 0-d scale;
  qaccel's kernels give the scale's.  float8e8m0 scales make the case common (code 0xFF).
- **Zero-point checks.**  The reference does not check the shape of a float8 zero point, nor
  look at a float4e2m1 zero point of DequantizeLinear at all; qaccel requires the scale's
  shape (and, for DequantizeLinear, the dtype of ``x``) for every zero point.

Large outputs come from recycled buffers (:func:`.quant_kernels.output_buffer`), the work is
spread over threads (:func:`.quant_kernels.run_items`), and the Numba kernels compile on first
use and are cached on disk.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from . import quant_kernels as qk
from .config import DQ_INPUTS, DQ_OUTPUTS, Q_INPUTS, Q_OUTPUTS, SCALES
from .dtypes import E8M0, QTYPES, QType, dtype_name, float_dtype, qtype
from .indexing import ScaleLayout, scale_layout
from .validate import as_array, check_dtype, check_int, dtype_expr, is_python_data

__all__ = ["CheckedCall", "check_dequantize", "check_quantize", "division_dtype",
           "dequantize_linear", "quantize_linear"]

#: Types of DequantizeLinear scales (opset 24 adds float8e8m0): all but int32.
DQ_SCALES = tuple(name for name in SCALES if name != "int32")

_F16 = np.dtype(np.float16)
_BF16 = np.dtype(ml_dtypes.bfloat16)
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_HALF_FORMAT = {_F16: qk.FMT_F16, _BF16: qk.FMT_BF16}
_FLOAT8 = ("float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz")


def division_dtype(x_dtype, scale_dtype) -> np.dtype:
    """Return the type NumPy divides ``x / scale`` in, as onnx.reference does.

    int32 on either side gives float64; equal float types keep their type (float16 / float16
    is rounded to float16, bfloat16 / bfloat16 to bfloat16); other float mixes give float32,
    among them any float ``x`` over a float8e8m0 scale (int32 ``x`` over it: float64).
    """
    x_dtype, scale_dtype = np.dtype(x_dtype), np.dtype(scale_dtype)
    if np.dtype(np.int32) in (x_dtype, scale_dtype):
        return _F64
    return x_dtype if x_dtype == scale_dtype else _F32


def _check_saturate(saturate) -> bool:
    if isinstance(saturate, (bool, np.bool_)):
        return bool(saturate)
    if isinstance(saturate, (int, np.integer)):
        if saturate in (0, 1):
            return bool(saturate)
        raise ValueError(f"saturate must be True/False or 0/1, not {saturate!r}")
    raise TypeError(f"saturate must be a bool, not {type(saturate).__name__} {saturate!r}")


def _check_zero_point_shape(param: str, zero_point, scale) -> None:
    if zero_point.shape != scale.shape and not (zero_point.size == 1 == scale.size):
        raise ValueError(
            f"{param} must have the shape of the scale {scale.shape}, not {zero_point.shape}: "
            f"one zero point per scale"
        )


def _code_view(q: QType, array: np.ndarray) -> np.ndarray:
    """Return integer data as the kernels' codes: uint8/uint16 views, int32 as is."""
    if q.bits == 32:
        return array.reshape(-1)
    return array.reshape(-1).view(np.uint8 if q.bits <= 8 else np.uint16)


def _code_params(q: QType) -> tuple[np.int32, np.int32]:
    """Return ``(mask, sgn)`` that sign- or zero-extend the codes of ``q``."""
    if q.bits == 32:
        return np.int32(-1), np.int32(0)
    return np.int32((1 << q.bits) - 1), np.int32(1 << (q.bits - 1) if q.signed else 0)


def _kernel_x(x: np.ndarray):
    """Return ``(flat x for the kernels, its 16-bit float format code or 0)``."""
    fmt = _HALF_FORMAT.get(x.dtype, 0)
    flat = x.reshape(-1)
    return (flat.view(np.uint16), fmt) if fmt else (flat, 0)


@functools.cache
def _float32_table(dtype: np.dtype) -> np.ndarray:
    """Return the float32 value of each of the 256 byte patterns of an 8-bit-or-less float."""
    return np.arange(256, dtype=np.uint8).view(dtype).astype(np.float32)


def _run(kernel, layout, x, s, z, out, *prm):
    sizes, strides, blocks, n_items = layout.kernel_args()
    qk.run_items(kernel, n_items, layout.size, x, s, z, out, sizes, strides, blocks, prm)


@dataclass(frozen=True)
class CheckedCall:
    """A QuantizeLinear, DequantizeLinear or DirectML quantize call whose arguments passed
    every check: what the output is and how the scales cover ``x``, without computing it.

    ``x``, ``scale``, ``zero_point`` (or None) as arrays; ``layout`` the scale layout;
    ``out_q`` the output :class:`~.dtypes.QType` (QuantizeLinear) or None, ``out_dtype`` the
    output dtype; ``x_q`` the input QType (DequantizeLinear) or None; ``division`` the dtype
    ``x / scale`` is computed in and ``saturate`` (QuantizeLinear) or None.
    """

    x: np.ndarray
    scale: np.ndarray
    zero_point: np.ndarray | None
    layout: ScaleLayout
    out_dtype: np.dtype
    out_q: QType | None = None
    x_q: QType | None = None
    division: np.dtype | None = None
    saturate: bool | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        """The output's shape (``x``'s)."""
        return self.x.shape


#: Largest ``block_size`` (the kernels index blocks in int64); any ``block_size`` of at least
#: ``x.shape[axis]`` already makes one block along the axis.
MAX_BLOCK_SIZE = 1 << 62


def _check_block_size(block_size, x_shape, axis) -> int:
    block_size = check_int("block_size", block_size, lo=0)
    if block_size > MAX_BLOCK_SIZE:
        rank = len(x_shape)
        fix = (f"block_size={x_shape[axis % rank]} (x.shape[{axis % rank}]) gives one block "
               f"along axis {axis}" if rank and -rank <= axis < rank
               else "block_size=x.shape[axis] gives one block along the axis")
        raise ValueError(f"block_size must be in [0, 2**62], not {block_size}: {fix}")
    return block_size


def _float_side(dtype) -> np.dtype:
    """The float type Python-number scales take next to ``dtype``: itself if it is float32,
    float16 or bfloat16, else float32."""
    dtype = np.dtype(dtype) if dtype is not None else _F32
    return dtype if dtype in (_F32, _F16, _BF16) else _F32


def check_quantize(x, y_scale, y_zero_point=None, *, axis=1, block_size=0, output_dtype=None,
                   saturate=True, precision=None) -> CheckedCall:
    """Check the arguments of :func:`quantize_linear` (its exceptions, nothing computed) and
    convert array-likes as its docstring states."""
    x = as_array("x", x, floats=_F32, ints=np.int32)
    check_dtype("x", x, Q_INPUTS)
    side = _float_side(x.dtype)
    y_scale = as_array("y_scale", y_scale, floats=side, ints=side)
    check_dtype("y_scale", y_scale, SCALES)
    axis = check_int("axis", axis)
    block_size = _check_block_size(block_size, x.shape, axis)
    saturate = _check_saturate(saturate)
    if precision is not None:
        precision = float_dtype(precision, param="precision")
    out_q = None if output_dtype is None else qtype(
        output_dtype, param="output_dtype", allowed=Q_OUTPUTS
    )
    zp_type = (out_q or QTYPES["uint8"]).dtype
    why = ("output_dtype" if out_q is not None else
           "the default output type; give output_dtype for another")
    zero_point = as_array("y_zero_point", y_zero_point, allow_none=True, floats=zp_type,
                          ints=zp_type, exact=True, why=why)
    if zero_point is not None:
        check_dtype("y_zero_point", zero_point, Q_OUTPUTS)
        zp_q = qtype(zero_point.dtype, param="y_zero_point", allowed=Q_OUTPUTS)
        if out_q is not None and out_q != zp_q:
            raise ValueError(
                f"output_dtype {out_q.name} contradicts the zero point's type {zp_q.name}: "
                f"the zero point's type is the output type; drop output_dtype, or give "
                f"y_zero_point.astype({dtype_expr(out_q.dtype)})"
            )
        out_q = zp_q
    out_q = out_q or QTYPES["uint8"]
    layout = scale_layout(x.shape, y_scale.shape, axis, block_size, param="y_scale")
    if zero_point is not None:
        _check_zero_point_shape("y_zero_point", zero_point, y_scale)

    division = precision if precision is not None else division_dtype(x.dtype, y_scale.dtype)
    return CheckedCall(x, y_scale, zero_point, layout, out_q.dtype, out_q=out_q,
                   division=np.dtype(division), saturate=saturate)


def check_dequantize(x, x_scale, x_zero_point=None, *, axis=1, block_size=0,
                     output_dtype=None) -> CheckedCall:
    """Check the arguments of :func:`dequantize_linear` (its exceptions, nothing computed) and
    convert array-likes as its docstring states."""
    typed_zp = x_zero_point is not None and not is_python_data(x_zero_point)
    zero_point = as_array("x_zero_point", x_zero_point) if typed_zp else None
    if typed_zp and dtype_name(zero_point.dtype) in DQ_INPUTS:
        x_type, why = zero_point.dtype, "x_zero_point's type"
        x = as_array("x", x, floats=x_type, ints=x_type, exact=True, why=why)
    else:
        x = as_array("x", x, ints=np.int32, why="Python ints become int32")
    codes = ("x holds quantised codes: give their type, e.g. x.astype(np.int8) or "
             "np.array(x, ml_dtypes.float8_e4m3fn)") if x.dtype.kind == "f" else None
    check_dtype("x", x, DQ_INPUTS, codes)
    x_q = qtype(x.dtype, param="x")
    if output_dtype is not None:
        out_dtype = float_dtype(output_dtype, param="output_dtype", allowed=DQ_OUTPUTS)
    side = _float_side(output_dtype)
    x_scale = as_array("x_scale", x_scale, floats=side, ints=side)
    check_dtype("x_scale", x_scale, DQ_SCALES)
    axis = check_int("axis", axis)
    block_size = _check_block_size(block_size, x.shape, axis)
    if output_dtype is None and x_scale.dtype == E8M0:
        raise ValueError(
            "output_dtype is required with a float8e8m0 x_scale (float32, float16 or "
            "bfloat16): the output cannot be float8e8m0; got output_dtype=None"
        )
    if output_dtype is None:
        out_dtype = x_scale.dtype
    layout = scale_layout(x.shape, x_scale.shape, axis, block_size, param="x_scale")
    if x_zero_point is not None and not typed_zp:
        zero_point = as_array("x_zero_point", x_zero_point, floats=x.dtype, ints=x.dtype,
                              exact=True, why="x's type")
    if zero_point is not None:
        _check_zero_point_shape("x_zero_point", zero_point, x_scale)
        if zero_point.dtype != x.dtype:
            raise ValueError(
                f"x_zero_point must have the type of x ({x_q.name}), "
                f"not {dtype_name(zero_point.dtype)}: convert it: "
                f"x_zero_point.astype({dtype_expr(x.dtype)})"
            )
        if x_q.name in _FLOAT8 and np.any(zero_point.astype(np.uint8) != 0):
            bad = zero_point.reshape(-1)[np.flatnonzero(zero_point.astype(np.uint8) != 0)[0]]
            raise ValueError(f"x_zero_point must be zero for float8 types, not {bad}: "
                             f"leave it out (x_zero_point=None)")

    return CheckedCall(x, x_scale, zero_point, layout, np.dtype(out_dtype), x_q=x_q)


def quantize_linear(
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
    """Quantise ``x``: ``saturate(rint(x / y_scale) + y_zero_point)`` (ONNX QuantizeLinear).

    Parameters
    ----------
    x : array_like
        float32, float16, bfloat16 or int32 (Python floats: float32, ints: int32).
    y_scale : array_like
        float32, float16, bfloat16, int32 or float8e8m0; one element (per-tensor), 1-D
        (per-axis) or the rank of ``x`` (blocked).  Python numbers take ``x``'s float type
        (float32 for an int32 ``x``).
    y_zero_point : array_like, optional
        Output-typed zero point with the scale's shape; its dtype sets the output type
        (Python numbers take ``output_dtype``, default uint8, and must be exact in it).  Not
        used for float8 outputs (as in the reference), added before encoding for float4e2m1.
    axis : int
        Quantisation axis for per-axis and blocked scales; negative counts from the back.
    block_size : int
        0, or the block length along ``axis`` (blocked quantisation), at most 2**62.
    output_dtype : dtype, optional
        Output type when there is no zero point (default uint8): int2..int16 and their unsigned
        twins, float8e4m3fn, float8e4m3fnuz, float8e5m2, float8e5m2fnuz, float4e2m1.
    saturate : bool
        Float8 only: clip to the largest finite value before encoding (default), or encode
        with overflow to NaN / infinity.
    precision : dtype, optional
        float32, float16 or bfloat16: cast ``x`` and ``y_scale`` to it and divide in it.

    Returns
    -------
    ndarray
        Shape of ``x``, the output type.

    Notes
    -----
    Bit-exact with onnx.reference.  The quotient is rounded to the type NumPy divides in
    (:func:`division_dtype`; ``precision`` if given), so float16 and bfloat16 quotients are
    rounded before ``rint`` (round half to even).  Integer outputs add the zero point and
    saturate to the output range; unlike the reference, quotients beyond the int32 range
    saturate too (see the module notes).  Float8 outputs are the round-to-nearest-even
    encoding of the quotient, clipped first when ``saturate``; float4e2m1 outputs that of
    ``quotient + zero_point`` (float32 sum, or float64 for an int32 ``x`` or scale).

    Raises
    ------
    TypeError
        Unsupported dtypes, wrong argument types (naming the conversion to make).
    ValueError
        Shapes that do not fit (naming the ``block_size`` or ``axis`` that would), ``axis``
        out of range, a 0-d ``x`` with more than one scale, ``output_dtype`` contradicting
        the zero point's type, Python numbers that do not fit their type.
    """
    c = check_quantize(x, y_scale, y_zero_point, axis=axis, block_size=block_size,
                       output_dtype=output_dtype, saturate=saturate, precision=precision)
    x, y_scale, zero_point, out_q, layout = c.x, c.scale, c.zero_point, c.out_q, c.layout
    saturate, division = c.saturate, c.division
    compute = _F64 if division == _F64 else _F32
    rnd = _HALF_FORMAT.get(division, 0)
    xk, xfmt = _kernel_x(np.ascontiguousarray(x))
    with np.errstate(over="ignore"):      # a scale beyond ``precision``'s range is inf (documented)
        sk = np.ascontiguousarray(y_scale.astype(division, copy=False),
                                  dtype=compute).reshape(-1)

    if out_q.is_int:
        codes = np.uint8 if out_q.bits <= 8 else np.uint16
        zk = (
            np.zeros(sk.size, codes)
            if zero_point is None
            else _code_view(out_q, np.ascontiguousarray(zero_point))
        )
        out = qk.output_buffer(layout.size, codes)
        mask, sgn = _code_params(out_q)
        lo, hi = compute.type(out_q.qmin), compute.type(out_q.qmax)
        _run(qk.quantize_int_kernel, layout, xk, sk, zk, out, xfmt, rnd, mask, sgn, lo, hi)
        return out.view(out_q.dtype).reshape(x.shape)

    # float8 / float4: the kernel writes the (clipped) quotient, ml_dtypes encodes it
    adds_zero_point = zero_point is not None and out_q.name not in _FLOAT8
    if adds_zero_point:
        zk = np.ascontiguousarray(zero_point, dtype=compute).reshape(-1)
    else:
        zk = np.full(sk.size, -0.0, compute)  # -0.0 is the exact additive identity
    fmax = compute.type(out_q.qmax if saturate and out_q.name in _FLOAT8 else np.inf)
    quotient = qk.output_buffer(layout.size, compute)
    _run(qk.quantize_float_kernel, layout, xk, sk, zk, quotient, xfmt, rnd, fmax)
    with np.errstate(over="ignore"):  # an int32 x's float64 quotient may exceed float32's range
        return quotient.astype(out_q.dtype).reshape(x.shape)


def dequantize_linear(x, x_scale, x_zero_point=None, *, axis=1, block_size=0, output_dtype=None):
    """Dequantise ``x``: ``(x - x_zero_point) * x_scale`` (ONNX DequantizeLinear).

    Parameters
    ----------
    x : array_like
        int2..int32 or their unsigned twins, float8e4m3fn, float8e4m3fnuz, float8e5m2,
        float8e5m2fnuz or float4e2m1.  Python numbers take the type of a typed
        ``x_zero_point`` (exactly); without one, Python ints become int32.
    x_scale : array_like
        float32, float16, bfloat16 or float8e8m0; one element, 1-D (per-axis) or blocked.
        Python numbers become ``output_dtype`` if given, else float32.
    x_zero_point : array_like, optional
        The type of ``x`` (Python numbers: converted to it, exactly) and the shape of the
        scale.  A float8 zero point must be zero (the
        reference's test: ``zero_point.astype(uint8) == 0``, so any ``|zp| < 1`` passes); a
        float4e2m1 zero point is ignored, as in the reference.
    axis, block_size : int
        As in :func:`quantize_linear`.
    output_dtype : dtype, optional
        float32, float16 or bfloat16; default: the scale's type (required with a float8e8m0
        scale).

    Returns
    -------
    ndarray
        Shape of ``x``, the output type.

    Notes
    -----
    Bit-exact with onnx.reference: ``float32(x) - zero_point`` (exact up to 16 bits; float64
    for int32 with a zero point), times the scale in float32 (float64 for int32 with a zero
    point), rounded to the output type (round half to even; a float16 or bfloat16 output is
    rounded twice, first to float32, as in the reference).

    Raises
    ------
    TypeError
        Unsupported dtypes, wrong argument types (naming the conversion to make).
    ValueError
        Shapes that do not fit (naming the ``block_size`` or ``axis`` that would), ``axis``
        out of range, a zero point whose type differs from ``x``'s, a non-zero float8 zero
        point, no ``output_dtype`` with a float8e8m0 scale, Python numbers that do not fit.
    """
    c = check_dequantize(x, x_scale, x_zero_point, axis=axis, block_size=block_size,
                         output_dtype=output_dtype)
    x, x_scale, zero_point, x_q, layout = c.x, c.scale, c.zero_point, c.x_q, c.layout
    out_dtype = c.out_dtype
    shape = x.shape
    x = np.ascontiguousarray(x)  # (at least 1-D)
    wide = x_q.bits == 32 and zero_point is not None  # the reference's float64 path
    compute = _F64 if wide else _F32
    sk = np.ascontiguousarray(x_scale, dtype=compute).reshape(-1)
    if x_q.is_int:
        lut = np.empty(0, np.float32)
        mask, sgn = _code_params(x_q)
        xk = _code_view(x_q, x)
        zk = (
            np.zeros(sk.size, xk.dtype)
            if zero_point is None
            else _code_view(x_q, np.ascontiguousarray(zero_point))
        )
    else:
        lut = _float32_table(x.dtype)
        mask, sgn = np.int32(0xFF), np.int32(0)
        xk = x.reshape(-1).view(np.uint8)
        zk = np.zeros(sk.size, np.uint8)

    if wide or out_dtype == _F32:
        out = qk.output_buffer(layout.size, compute)
        _run(qk.dequantize_kernel, layout, xk, sk, zk, out, lut, mask, sgn, 0)
        if out_dtype != compute:
            with np.errstate(over="ignore"):
                out = out.astype(out_dtype)
        return out.reshape(shape)
    out = qk.output_buffer(layout.size, np.uint16)
    _run(qk.dequantize_kernel, layout, xk, sk, zk, out, lut, mask, sgn, _HALF_FORMAT[out_dtype])
    return out.view(out_dtype).reshape(shape)
