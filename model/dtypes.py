"""The numeric types qaccel handles, in one table.

Every quantised type of the ONNX QuantizeLinear/DequantizeLinear specs (opsets 10..25) is a
:class:`QType` with its numpy / ml_dtypes dtype, its ONNX ``TensorProto`` number and, for integer
types, its range.  Sub-byte types are stored one element per byte, as ml_dtypes stores them:
the low ``bits`` bits hold the two's complement (signed) or plain binary (unsigned) code.
The one scale-only type, float8e8m0 (:data:`E8M0`), is in :data:`SCALE_TYPES`.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

__all__ = [
    "E8M0",
    "E8M0_ONNX",
    "FLOAT_TYPES",
    "QTYPES",
    "SCALE_TYPES",
    "QType",
    "dtype_name",
    "float_dtype",
    "qtype",
]


@dataclass(frozen=True)
class QType:
    """One quantised element type.

    ``kind`` is ``"int"`` or ``"float"``.  ``qmin``/``qmax`` are the integer range (integer
    kinds) or the largest finite magnitude as ``-max``/``max`` (float kinds).
    """

    name: str
    dtype: np.dtype
    onnx: int
    kind: str
    bits: int
    signed: bool
    qmin: float
    qmax: float

    @property
    def is_int(self) -> bool:
        return self.kind == "int"


def _int(name, dtype, onnx, bits, signed):
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    return QType(name, np.dtype(dtype), onnx, "int", bits, signed, lo, hi)


def _float(name, dtype, onnx, bits):
    fmax = float(ml_dtypes.finfo(dtype).max)
    return QType(name, np.dtype(dtype), onnx, "float", bits, True, -fmax, fmax)


#: Quantised types by name.  ONNX TensorProto numbers are spelled out so that model/ never
#: imports onnx (import time); tests check them against onnx.helper.
QTYPES: dict[str, QType] = {
    q.name: q
    for q in (
        _int("uint8", np.uint8, 2, 8, False),
        _int("int8", np.int8, 3, 8, True),
        _int("uint16", np.uint16, 4, 16, False),
        _int("int16", np.int16, 5, 16, True),
        _int("int32", np.int32, 6, 32, True),
        _int("uint4", ml_dtypes.uint4, 21, 4, False),
        _int("int4", ml_dtypes.int4, 22, 4, True),
        _int("uint2", ml_dtypes.uint2, 25, 2, False),
        _int("int2", ml_dtypes.int2, 26, 2, True),
        _float("float8e4m3fn", ml_dtypes.float8_e4m3fn, 17, 8),
        _float("float8e4m3fnuz", ml_dtypes.float8_e4m3fnuz, 18, 8),
        _float("float8e5m2", ml_dtypes.float8_e5m2, 19, 8),
        _float("float8e5m2fnuz", ml_dtypes.float8_e5m2fnuz, 20, 8),
        _float("float4e2m1", ml_dtypes.float4_e2m1fn, 23, 4),
    )
}

_BY_DTYPE = {q.dtype: q for q in QTYPES.values()}

#: Floating-point types used for x / scale / outputs, by name.
FLOAT_TYPES: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
}

#: float8e8m0 (ml_dtypes ``float8_e8m0fnu``), the OCP Microscaling shared scale: code ``c`` is
#: ``2**(c - 127)`` (0x00 = 2**-127), 0xFF is NaN; no sign, zero or infinity.  A scale type
#: only (QuantizeLinear ``y_scale`` and DequantizeLinear ``x_scale`` from opset 24): it is
#: neither in :data:`QTYPES` nor in :data:`FLOAT_TYPES`.
E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
#: Its ONNX ``TensorProto`` number (FLOAT8E8M0).
E8M0_ONNX = 24

#: Types that only ever hold scales, by name.
SCALE_TYPES: dict[str, np.dtype] = {"float8e8m0": E8M0}


def dtype_name(dtype) -> str:
    """Return the short name of a numpy / ml_dtypes dtype (``"int4"``, ``"bfloat16"``...)."""
    dt = np.dtype(dtype)
    q = _BY_DTYPE.get(dt)
    if q is not None:
        return q.name
    for name, fdt in (*FLOAT_TYPES.items(), *SCALE_TYPES.items()):
        if fdt == dt:
            return name
    return str(dt)


def _as_dtype(param: str, dtype) -> np.dtype:
    try:
        return np.dtype(dtype)
    except TypeError:
        raise TypeError(f"{param} must be a numpy or ml_dtypes dtype, not {dtype!r}") from None


def qtype(dtype, *, param: str = "dtype", allowed=None) -> QType:
    """Return the :class:`QType` of ``dtype``.

    Raises ``TypeError`` naming ``param`` and the value when ``dtype`` is not a quantised type,
    or not among ``allowed`` (an iterable of QType names) when given.
    """
    dt = _as_dtype(param, dtype)
    q = _BY_DTYPE.get(dt)
    names = sorted(allowed) if allowed is not None else sorted(QTYPES)
    if q is None or (allowed is not None and q.name not in allowed):
        raise TypeError(f"{param} must be one of {', '.join(names)}; got {dtype_name(dt)!r}")
    return q


def float_dtype(dtype, *, param: str = "dtype", allowed=("float32", "float16", "bfloat16")):
    """Return ``dtype`` as a numpy dtype if it is one of the ``allowed`` float type names.

    Raises ``TypeError`` naming ``param`` and the value otherwise.
    """
    dt = _as_dtype(param, dtype)
    if dtype_name(dt) not in allowed:
        raise TypeError(f"{param} must be one of {', '.join(allowed)}; got {dtype_name(dt)!r}")
    return dt
