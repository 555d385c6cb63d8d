"""OCP Microscaling (MX v1.0) formats on top of QuantizeLinear / DequantizeLinear.

An MX tensor splits one axis into blocks of ``k = 32`` consecutive elements; each block stores
one shared float8e8m0 scale ``X = 2**e`` and ``k`` elements ``P``, and holds the values
``X * P``.  The formats (:data:`MX_FORMATS`):

=============  =============  =====================  ========
name           element        largest normal         emax
=============  =============  =====================  ========
``mxfp4``      float4e2m1     6 = 1.5 * 2**2         2
``mxfp8_e4m3`` float8e4m3fn   448 = 1.75 * 2**8      8
``mxfp8_e5m2`` float8e5m2     57344 = 1.75 * 2**15   15
``mxint8``     int8, 1.6      127/64 = 1.98 * 2**0   0
=============  =============  =====================  ========

Shared scale (OCP MX v1.0, section 6.3): ``e = floor(log2(max |v|)) - emax`` over the block,
clamped to e8m0's range; the elements are ``v / X`` rounded to the element format, values
beyond its largest normal clamped to it.  Here that is one blocked QuantizeLinear with the
e8m0 scale (``saturate=True``, round half to even), so a block's largest element lands in the
element format's top binade, ``[2**emax, 2**(emax + 1))``.  Where that binade goes beyond the
largest normal, the spec's clamp applies: quotients in (6, 8) become 6 in float4e2m1 (up to
25 % off), (448, 512) become 448 in e4m3, (57344, 65536) 57344 in e5m2, and MXINT8's
``[127.5/64, 2)`` 127/64.  Quotients in ``(-2, -127.5/64]`` give MXINT8 code -128 (-2.0: the
two's complement value QuantizeLinear's int8 range includes; microxcaling clamps to -127).
Where the spec leaves a choice:

- **All-zero block** (or all ``-0``): scale 2**-127 (code 0x00), the smallest; any scale gives
  zero elements, and the smallest is the limit of a block of ever smaller values (it is what
  Microsoft's microxcaling library, from the spec's authors, gives too).
- **NaN or infinity in a block**: scale NaN (code 0xFF), so the whole block decodes as NaN, as
  the spec defines a NaN scale; the elements are what QuantizeLinear gives for ``v / NaN``.
- **Partial last block**: allowed (``D`` need not be a multiple of ``block_size``), as in
  blocked QuantizeLinear; ``block_size`` may be any positive size (OCP fixes 32).

MXINT8: the element value is ``code * 2**-6`` (1.6 fixed point), so the block holds
``code * 2**(e - 6)``.  qaccel folds the fixed point into the scale: QuantizeLinear and
DequantizeLinear run with the e8m0 scale ``2**(e - 6)`` (code minus 6, NaN kept; see
:func:`qdq_scales`) and plain int8 elements.  The returned scales are the OCP ones (``2**e``).
The folded scale must stay in e8m0's range, so MXINT8's ``e`` is clamped to ``[-121, 127]``
rather than ``[-127, 127]``: a block whose largest magnitude is below 2**-121 is quantised on
a 2**-127 grid instead of finer (such values are near float32's subnormals), and
:func:`mx_dequantize` rejects MXINT8 scales below 2**-121 (codes 0..5) from elsewhere.
The float formats need no clamp at the top: ``floor(log2(max |v|)) <= 127`` for every finite
float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .dtypes import E8M0, QTYPES, dtype_name, float_dtype
from .validate import as_array, check_axis, check_int

__all__ = [
    "MX_FORMATS",
    "MXFormat",
    "mx_dequantize",
    "mx_quantize",
    "qdq_scales",
    "shared_scales",
]

_NAN_CODE = 0xFF
_BIAS = 127


@dataclass(frozen=True)
class MXFormat:
    """One MX format: ``element`` is the :data:`.dtypes.QTYPES` name of its elements, ``emax``
    the exponent of their largest normal value, ``shift`` the fixed-point fraction bits folded
    into the QuantizeLinear scale (6 for MXINT8's 1.6 fixed point, else 0)."""

    name: str
    element: str
    emax: int
    shift: int = 0

    @property
    def dtype(self) -> np.dtype:
        return QTYPES[self.element].dtype

    @property
    def bits(self) -> int:
        """Bits per element (add ``8 / block_size`` for the shared scale)."""
        return QTYPES[self.element].bits

    @property
    def min_exponent(self) -> int:
        """Smallest shared exponent ``e``: -127, or -121 where the fold needs 6 codes."""
        return -_BIAS + self.shift


#: The OCP MX v1.0 formats, by name.
MX_FORMATS: dict[str, MXFormat] = {
    f.name: f
    for f in (
        MXFormat("mxfp4", "float4e2m1", 2),
        MXFormat("mxfp8_e4m3", "float8e4m3fn", 8),
        MXFormat("mxfp8_e5m2", "float8e5m2", 15),
        MXFormat("mxint8", "int8", 0, shift=6),
    )
}

#: Types of the values ``mx_quantize`` takes.
_X_TYPES = ("float32", "float16", "bfloat16")


def _format(fmt) -> MXFormat:
    if isinstance(fmt, MXFormat):
        return fmt
    if not isinstance(fmt, str):
        raise TypeError(f"fmt must be a format name ({', '.join(MX_FORMATS)}), not {fmt!r}")
    if fmt not in MX_FORMATS:
        raise ValueError(f"fmt must be one of {', '.join(MX_FORMATS)}, not {fmt!r}")
    return MX_FORMATS[fmt]


def _ops(ops):
    if ops is None:
        from . import quant

        return quant
    for name in ("quantize_linear", "dequantize_linear"):
        if not callable(getattr(ops, name, None)):
            raise TypeError(
                f"ops must have quantize_linear and dequantize_linear methods; "
                f"{type(ops).__name__} has no {name}"
            )
    return ops


def _blocks(shape, axis, block_size) -> tuple[int, ...]:
    """Shape of the scales of ``shape`` blocked along ``axis``."""
    return tuple(-(-n // block_size) if d == axis else n for d, n in enumerate(shape))


def _check_layout(x: np.ndarray, axis, block_size) -> tuple[int, int]:
    if x.ndim == 0:
        raise ValueError("x must have at least one dimension (the block axis), not a scalar")
    return check_axis("axis", axis, x.ndim), check_int("block_size", block_size, lo=1)


def shared_scales(x, fmt, *, axis=-1, block_size=32) -> np.ndarray:
    """Return the OCP shared scales (float8e8m0) of ``x`` in blocks along ``axis``.

    ``2**(floor(log2(max |v|)) - emax)`` per block, clamped to ``[2**min_exponent, 2**127]``;
    all-zero blocks 2**min_exponent, blocks with a NaN or an infinity NaN (module notes).
    Shape: ``x``'s with ``ceil(D / block_size)`` along ``axis``.
    """
    f = _format(fmt)
    x = as_array("x", x)
    float_dtype(x.dtype, param="x", allowed=_X_TYPES)
    axis, block_size = _check_layout(x, axis, block_size)
    a = np.moveaxis(np.abs(x.astype(np.float32)), axis, -1)
    n_blocks = -(-a.shape[-1] // block_size)
    pad = n_blocks * block_size - a.shape[-1]
    a = np.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, pad)])
    amax = a.reshape(*a.shape[:-1], n_blocks, block_size).max(axis=-1, initial=0.0)
    _, exp = np.frexp(amax)  # amax = m * 2**exp, 0.5 <= m < 1: floor(log2(amax)) = exp - 1
    e = np.clip(exp.astype(np.int64) - 1 - f.emax, f.min_exponent, _BIAS)
    e = np.where(amax == 0, f.min_exponent, e)
    codes = np.where(np.isfinite(amax), e + _BIAS, _NAN_CODE).astype(np.uint8)
    return np.ascontiguousarray(np.moveaxis(codes, -1, axis)).view(E8M0)


def qdq_scales(scales, fmt) -> np.ndarray:
    """Return the e8m0 scales that QuantizeLinear / DequantizeLinear use for MX ``scales``.

    The scales themselves, except MXINT8's: ``2**-6`` times them (code minus 6; NaN stays
    NaN), the 1.6 fixed point folded in.  ValueError for MXINT8 scales below 2**-121.
    """
    f = _format(fmt)
    scales = as_array("scales", scales)
    if scales.dtype != E8M0:
        raise TypeError(f"scales must be float8e8m0, not {dtype_name(scales.dtype)}")
    if not f.shift:
        return scales
    codes = scales.view(np.uint8)
    low = codes < f.shift
    if low.any():
        raise ValueError(
            f"scales of {f.name} must be at least 2**{f.min_exponent} (code {f.shift}) to "
            f"fold the 2**-{f.shift} fixed point into an e8m0 scale; got code "
            f"{int(codes[low].min())}"
        )
    folded = np.where(codes == _NAN_CODE, _NAN_CODE, codes - f.shift).astype(np.uint8)
    return folded.view(E8M0)


def mx_quantize(x, fmt, *, axis=-1, block_size=32, ops=None):
    """Quantise ``x`` to an MX format: return ``(codes, scales)``.

    Parameters
    ----------
    x : ndarray
        float32, float16 or bfloat16, at least 1-D.
    fmt : str
        A name of :data:`MX_FORMATS`: ``"mxfp4"``, ``"mxfp8_e4m3"``, ``"mxfp8_e5m2"``,
        ``"mxint8"``.
    axis : int
        The axis split into blocks (negative counts from the back).
    block_size : int
        Elements per block (OCP: 32); the last block may be partial.
    ops : object, optional
        Anything with the golden model's ``quantize_linear`` and ``dequantize_linear``
        (default: :mod:`qaccel.model.quant`; ``qaccel.RTL()`` has them too).

    Returns
    -------
    codes : ndarray
        Shape of ``x``, the element type (float4e2m1, float8e4m3fn, float8e5m2 or int8).
    scales : ndarray
        float8e8m0 OCP shared scales, ``x``'s shape with ``ceil(D / block_size)`` along
        ``axis`` (:func:`shared_scales`).  MXINT8 codes are 1.6 fixed point: the value is
        ``codes * 2**-6 * scales``.

    Raises
    ------
    TypeError, ValueError
        Unsupported ``x`` dtype or ``fmt``, scalar ``x``, bad ``axis`` / ``block_size``, an
        ``ops`` without the two methods.
    """
    f = _format(fmt)
    ops = _ops(ops)
    scales = shared_scales(x, f, axis=axis, block_size=block_size)
    codes = ops.quantize_linear(
        np.asarray(x), qdq_scales(scales, f), axis=axis, block_size=block_size,
        output_dtype=f.dtype, saturate=True,
    )  # fmt: skip
    return codes, scales


def mx_dequantize(codes, scales, fmt, *, axis=-1, block_size=32, output_dtype=np.float32,
                  ops=None):  # fmt: skip
    """Return the values of an MX tensor, ``codes * scales`` (MXINT8: times 2**-6 too).

    ``codes`` (the element type of ``fmt``) and ``scales`` (float8e8m0, ``codes``' shape with
    ``ceil(D / block_size)`` along ``axis``) as :func:`mx_quantize` returns them;
    ``output_dtype`` float32, float16 or bfloat16; ``ops`` as in :func:`mx_quantize`.  One
    blocked DequantizeLinear: exact in float32 unless the product leaves float32's range, then
    rounded to ``output_dtype``.  A NaN scale makes its block NaN.

    Raises TypeError / ValueError naming the parameter for a wrong element type, scale type or
    shape, ``axis``, ``block_size`` or ``output_dtype``, and for MXINT8 scales below 2**-121
    (:func:`qdq_scales`).
    """
    f = _format(fmt)
    ops = _ops(ops)
    codes = as_array("codes", codes)
    if codes.dtype != f.dtype:
        raise TypeError(
            f"codes must be {f.element} for {f.name}, not {dtype_name(codes.dtype)}"
        )
    axis, block_size = _check_layout(codes, axis, block_size)
    q_scales = qdq_scales(scales, f)
    want = _blocks(codes.shape, axis, block_size)
    if q_scales.shape != want:
        raise ValueError(
            f"scales must have shape {want} for codes {codes.shape} in blocks of {block_size} "
            f"along axis {axis}, not {q_scales.shape}"
        )
    output_dtype = float_dtype(output_dtype, param="output_dtype")
    return ops.dequantize_linear(
        codes, q_scales, axis=axis, block_size=block_size, output_dtype=output_dtype
    )
