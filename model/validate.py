"""Argument checks shared by the golden model's public functions.

Every check raises ``TypeError`` or ``ValueError`` whose message names the parameter and the
offending value, so that bad input never reaches a Numba kernel.
"""

from __future__ import annotations

import operator

import numpy as np

__all__ = ["as_array", "check_axis", "check_int", "check_power_of_two", "check_shape"]


def as_array(param: str, value, *, allow_none: bool = False):
    """Return ``value`` as a numpy array; ``TypeError`` if it cannot be one."""
    if value is None:
        if allow_none:
            return None
        raise TypeError(f"{param} must be an array, not None")
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (np.generic, int, float, bool, list, tuple)):
        return np.asarray(value)
    raise TypeError(f"{param} must be a numpy array, not {type(value).__name__}")


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
