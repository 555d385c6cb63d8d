"""Integer models of :class:`~qaccel.rtl.arith.reciprocal.Reciprocal` and of the significand path of
:class:`~qaccel.rtl.arith.reciprocal_divide.ReciprocalDivide`, vectorised over NumPy arrays, and the
exact truncated quotient they must equal (FloatDivide's, by ``divmod``).

Arrays are ``uint64`` while every intermediate fits 64 bits, else ``object`` arrays of Python
integers (slow: for the wide units' samples only).
"""

from __future__ import annotations

import numpy as np

__all__ = ["divide_exact", "divide_sig", "reciprocal", "reciprocal_steps", "split"]


def _ints(x, bits: int) -> np.ndarray:
    """``x`` as uint64, or as Python integers when values of ``bits`` bits would not fit."""
    x = np.asarray(x)
    return x.astype(object) if bits > 64 else x.astype(np.uint64)


def _mask(bits: int) -> int:
    return (1 << bits) - 1


def split(a_width: int, b_width: int, q_width: int) -> tuple[int, int, int, int]:
    """``(n, t, s, w)`` of ReciprocalDivide's docstring: the width of ``a' = a >> t``, the
    dropped bits, the scale ``2**s`` of ``a'`` in the quotient, the remainder's bits."""
    n = min(a_width, q_width + b_width)
    return n, a_width - n, q_width + b_width - n, b_width + 1


def reciprocal(d, d_width: int, r_width: int) -> np.ndarray:
    """``floor((2**K - 1) / d)``, ``K = d_width + r_width - 1``: Reciprocal's contract."""
    k = d_width + r_width - 1
    d = _ints(d, k)
    return (d * 0 + _mask(k)) // d


def reciprocal_steps(d, d_width: int, r_width: int, bits_per_cycle: int) -> np.ndarray:
    """Reciprocal's iteration, digit by digit: ``ceil(r_width / bits_per_cycle)`` cycles of
    ``bits_per_cycle`` restoring steps on the all-ones dividend, starting from its bits above
    the digits made; checks the invariant ``rem < d`` after every step."""
    k = d_width + r_width - 1
    steps = -(-r_width // bits_per_cycle) * bits_per_cycle
    d = _ints(d, d_width + 1)
    rem = d * 0 + ((1 << max(0, k - steps)) - 1)
    quo = d * 0
    for i in range(steps):
        bit = 1 if steps - 1 - i < k else 0               # the dividend's bit at this position
        rem = 2 * rem + bit
        digit = rem >= d
        rem = np.where(digit, rem - d, rem)
        quo = ((quo << 1) | digit.astype(quo.dtype)) & _mask(r_width)
        assert np.all(rem < d)
    return quo


def divide_sig(a, d, r, a_width: int, b_width: int, q_width: int) -> dict[str, np.ndarray]:
    """ReciprocalDivide's significand path for normalised ``a``, ``d`` and ``r`` (Reciprocal's
    result for ``d``): ``q1 = floor((a' * r + 2**n) / 2**n)``, ``z = q1 * d - a' * 2**s``
    modulo ``2**w`` from ``w`` bits of each (uint64 products wrap modulo 2**64, which
    ``2**w`` divides), and the corrected digits ``quo`` with ``sticky``."""
    n, t, s, w = split(a_width, b_width, q_width)
    a = _ints(a, a_width)
    a1, dropped = a >> t, (a & _mask(t)) != 0
    wide = n + q_width + 2
    q1 = (_ints(a1, wide) * _ints(r, wide) + (1 << n)) >> n
    q1w, d = _ints(q1 & _mask(w), w), _ints(d, w)
    a_low = (_ints(a1, w) & _mask(w - s)) << s if s < w else 0
    z = (q1w * d - a_low) & _mask(w)
    exact = z == 0
    down = ~exact & ((z >> (w - 1)) == 0)
    return {"q1": q1, "z": z, "quo": q1 - down.astype(q1.dtype), "sticky": ~exact | dropped}


def divide_exact(a, d, a_width: int, b_width: int, q_width: int) -> dict[str, np.ndarray]:
    """FloatDivide's digits by ``divmod``: ``quo = floor(a * 2**(q_width + b_width - a_width)
    / d)`` (``floor(a / (d * 2**-shift))`` for a negative shift), ``sticky`` = remainder
    != 0."""
    shift = q_width + b_width - a_width
    bits = max(a_width + max(shift, 0), b_width - min(shift, 0))
    num = _ints(a, bits) << max(shift, 0)
    den = _ints(d, bits) << max(-shift, 0)
    return {"quo": num // den, "sticky": num % den != 0}
