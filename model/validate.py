"""Argument checks shared by the golden model's public functions.

Every check raises ``TypeError`` or ``ValueError`` whose message names the parameter and the
offending value, so that bad input never reaches a Numba kernel.
"""

from __future__ import annotations

import operator

import numpy as np

__all__ = ["as_array", "check_axis", "check_dtype", "check_int", "check_power_of_two",
           "check_shape", "conversion_hint", "dtype_expr", "is_python_data"]


def as_array(param: str, value, *, allow_none: bool = False, floats=None, ints=None,
             exact: bool = False, why: str = ""):
    """Return ``value`` as a NumPy array in native byte order.

    - A NumPy array or scalar, or an object with ``__array__`` (another library's array), keeps
      its dtype; a non-native byte order (``x.astype('>f4')``) becomes the native one of the
      same type.
    - A Python number or a (nested) list or tuple goes through ``np.asarray``; then, if that
      gives float64 (some element is a Python float) it becomes ``floats``, and if it gives
      int64 (Python ints) it becomes ``ints``, when those are given (None: left as NumPy
      infers it, which the caller's dtype check then refuses, naming the fix).  Python ints
      must fit the type they become, and with ``exact`` so must Python floats (zero points):
      ValueError naming ``param``, the value, the type and ``why`` it is that type.
      Any other dtype NumPy infers (a list of ``np.float16`` scalars: float16) is kept.

    TypeError naming ``param`` for None (unless ``allow_none``) and for what is not numbers
    (strings, ragged lists, other objects).
    """
    if value is None:
        if allow_none:
            return None
        raise TypeError(f"{param} must be an array, not None")
    python = is_python_data(value)
    if not (python or isinstance(value, (np.ndarray, np.generic))
            or hasattr(value, "__array__") or hasattr(value, "__array_interface__")):
        raise TypeError(f"{param} must be a numpy array, not {type(value).__name__} "
                        f"{_short(value)} (or an array-like of numbers: a Python number, "
                        f"list or tuple)")
    try:
        arr = np.asarray(value)
    except (ValueError, OverflowError) as e:
        raise ValueError(f"{param} must be a numpy array or a rectangular list of numbers "
                         f"that fit int64 or float64; np.asarray({param}) fails for "
                         f"{_short(value)}: {e}") from None
    if arr.dtype.kind in "OUSMm" or arr.dtype.type is np.void:  # (ml_dtypes are kind "V")
        raise TypeError(f"{param} must be a numpy array, not {type(value).__name__} "
                        f"{_short(value)} (NumPy makes it {arr.dtype}; an array-like must "
                        f"hold numbers)")
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if python:
        target = {"f": floats, "i": ints}.get(arr.dtype.kind) if arr.dtype.itemsize == 8 \
            else None
        if target is not None:
            arr = _convert(param, arr, np.dtype(target), exact or arr.dtype.kind == "i", why)
    return arr


def is_python_data(value) -> bool:
    """True for a Python number, list or tuple (data without a dtype of its own)."""
    return isinstance(value, (int, float, bool, list, tuple)) and not isinstance(value,
                                                                                 np.generic)


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _convert(param: str, arr: np.ndarray, target: np.dtype, exact: bool, why: str):
    """``arr`` (float64 or int64 from Python numbers) as ``target``; with ``exact`` every
    value must come back unchanged (ValueError naming the first that does not)."""
    from .dtypes import dtype_name

    with np.errstate(all="ignore"):
        out = arr.astype(target)
        if not exact:
            return out
        if arr.dtype.kind == "f" or target.kind not in "iu":
            back = out.astype(np.float64)
            same = (back == arr) | (np.isnan(back) & np.isnan(arr))
        else:
            same = out.astype(np.int64) == arr
    if not np.all(same):
        bad = (arr[~same].flat[0] if arr.ndim else arr).item()
        reason = f" ({why})" if why else ""
        raise ValueError(
            f"{param} value {bad!r} does not fit {dtype_name(target)}, the type Python numbers "
            f"become for {param}{reason}: pass a NumPy array of the type you mean instead, "
            f"np.array(..., dtype=...)")
    return out


def dtype_expr(dtype) -> str:
    """The Python expression of ``dtype`` (``np.float32``, ``ml_dtypes.bfloat16``)."""
    dt = np.dtype(dtype)
    if dt.name in ("float32", "float16", "float64", "int8", "uint8", "int16", "uint16",
                   "int32", "uint32", "int64", "uint64", "bool"):
        return f"np.{dt.name}"
    return f"ml_dtypes.{dt.name}"


def check_dtype(param: str, array: np.ndarray, allowed, fix: str | None = None) -> np.dtype:
    """Return ``array.dtype`` if its name (:func:`.dtypes.dtype_name`) is in ``allowed``;
    TypeError naming ``param``, the dtype, the allowed ones and the conversion (``fix``, or
    :func:`conversion_hint`'s) otherwise."""
    from .dtypes import dtype_name

    name = dtype_name(array.dtype)
    if name in allowed:
        return array.dtype
    raise TypeError(f"{param} must be one of {', '.join(allowed)}; got {name!r}: "
                    f"{fix or conversion_hint(param, array.dtype, allowed)}")


def conversion_hint(param: str, dtype, allowed) -> str:
    """``"convert it: x.astype(np.float32)"``: the allowed type closest to ``dtype`` (the
    first allowed float type for a float, signed or unsigned integer type for an integer)."""
    from .dtypes import FLOAT_TYPES, QTYPES, SCALE_TYPES

    types = {**FLOAT_TYPES, **SCALE_TYPES, **{n: q.dtype for n, q in QTYPES.items()}}
    kind = np.dtype(dtype).kind
    # the first allowed type of the same kind (ml_dtypes types are kind "V")
    best = min(allowed, key=lambda n: n not in types or np.dtype(types[n]).kind != kind)
    expr = dtype_expr(types[best]) if best in types else best
    return f"convert it: {param}.astype({expr})"


def check_int(param: str, value, lo: int | None = None, hi: int | None = None) -> int:
    """Return ``value`` as an int within ``[lo, hi]``; TypeError/ValueError naming ``param``."""
    if isinstance(value, bool):
        raise TypeError(f"{param} must be an integer, not {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{param} must be an integer, not {value!r}") from None
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        lo_s = "-inf" if lo is None else lo
        hi_s = "inf" if hi is None else hi
        raise ValueError(f"{param} must be in [{lo_s}, {hi_s}], not {v}")
    return v


def check_bool(param: str, value) -> bool:
    """Return ``value`` if it is a bool; TypeError naming ``param`` otherwise."""
    if not isinstance(value, bool):
        raise TypeError(f"{param} must be a bool, not {value!r}")
    return value


def check_int_choice(param: str, value, choices) -> int:
    """Return ``value`` as an int if it is one of ``choices``; TypeError/ValueError naming
    ``param`` (and the choices) otherwise."""
    v = check_int(param, value)
    if v not in choices:
        raise ValueError(f"{param} must be one of {', '.join(map(str, choices))}, not {v}")
    return v


def check_power_of_two(param: str, value, minimum: int = 1) -> int:
    """Return ``value`` if it is a power of two ``>= minimum``; else ValueError naming it."""
    v = check_int(param, value)
    if v < minimum or v & (v - 1):
        raise ValueError(f"{param} must be a power of two >= {minimum}, not {v}")
    return v


def check_axis(param: str, axis, ndim: int) -> int:
    """Return ``axis`` normalised to ``[0, ndim)``; ValueError if out of range."""
    a = check_int(param, axis)
    if not -ndim <= a < ndim:
        raise ValueError(
            f"{param} must be in [{-ndim}, {ndim - 1}] for a rank-{ndim} input, not {a}")
    return a % ndim


def check_shape(param: str, array: np.ndarray, expected: tuple[int, ...], why: str = "") -> None:
    """Raise ValueError naming ``param`` if ``array.shape != expected``."""
    if tuple(array.shape) != tuple(expected):
        extra = f" ({why})" if why else ""
        raise ValueError(
            f"{param} must have shape {tuple(expected)}{extra}, not {tuple(array.shape)}")
