"""Binary floating-point formats, in one table, with plain NumPy encode and decode.

A :class:`FloatFormat` describes a format by its field widths, its exponent bias and the
way it spends its special codes; :data:`FORMATS` holds every format qaccel handles, keyed by
the names :mod:`qaccel.model.dtypes` uses. :meth:`FloatFormat.decode` and
:meth:`FloatFormat.encode` convert between bit patterns and float64 values with NumPy
integer and power-of-two arithmetic only (no ml_dtypes), so that the table can be checked
against ml_dtypes code by code and the RTL checked against the table.

Special codes (``S`` sign, ``E`` exponent field, ``M`` mantissa field; "all ones" is
``2**ebits - 1`` or ``2**mbits - 1``):

========== ============================================================================
``nan``    NaN codes
========== ============================================================================
"ieee"     ``E`` all ones and ``M != 0`` (``M == 0`` is infinity): IEEE 754.
"single"   ``E`` and ``M`` all ones, either sign (float8e4m3fn); no infinity.
"negzero"  the negative-zero pattern, sign bit alone (the "fnuz" formats); no -0.
"none"     no NaN and no infinity (float4e2m1): every code is a finite number.
========== ============================================================================
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from qaccel.model.validate import check_int

__all__ = ["FORMATS", "NAN_KINDS", "FloatFormat", "float_format"]

#: Accepted values of :attr:`FloatFormat.nan`.
NAN_KINDS = ("ieee", "single", "negzero", "none")


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format: sign bit, ``ebits`` exponent bits, ``mbits`` mantissa bits.

    A code with exponent field ``E`` and mantissa field ``M`` is worth
    ``(-1)**S * 2**(E - bias) * (1 + M / 2**mbits)`` when ``E > 0`` (normal) and
    ``(-1)**S * 2**(1 - bias) * (M / 2**mbits)`` when ``E == 0`` (subnormal or zero),
    unless it is one of the special codes named by ``inf`` and ``nan`` (see the module
    docstring).

    Parameters
    ----------
    name : :class:`str`
        Table key (``"float32"``, ``"float8e4m3fn"``, ...).
    ebits : :class:`int`
        Exponent field width, 1..11.
    mbits : :class:`int`
        Mantissa field width (without the hidden bit), 1..52.
    bias : :class:`int`
        Exponent bias, 0..2**ebits - 1.
    inf : :class:`bool`
        Whether ``E`` all ones with ``M == 0`` is infinity (only with ``nan="ieee"``).
    nan : :class:`str`
        One of :data:`NAN_KINDS`.
    neg_zero : :class:`bool`
        Whether the sign-bit-only code is -0 (False exactly when ``nan="negzero"``).

    Raises
    ------
    :exc:`TypeError`
        If a field has the wrong type.
    :exc:`ValueError`
        If a field is out of range or the fields contradict each other.
    """

    name: str
    ebits: int
    mbits: int
    bias: int
    inf: bool
    nan: str
    neg_zero: bool

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"name must be a non-empty string, not {self.name!r}")
        check_int("ebits", self.ebits, 1, 11)
        check_int("mbits", self.mbits, 1, 52)
        check_int("bias", self.bias, 0, (1 << self.ebits) - 1)
        for field in ("inf", "neg_zero"):
            if not isinstance(getattr(self, field), bool):
                raise TypeError(f"{field} must be a bool, not {getattr(self, field)!r}")
        if self.nan not in NAN_KINDS:
            raise ValueError(f"nan must be one of {', '.join(NAN_KINDS)}, not {self.nan!r}")
        if self.inf != (self.nan == "ieee"):
            raise ValueError(f"inf={self.inf!r} does not fit nan={self.nan!r}: a format has "
                             "infinities exactly when its NaNs are IEEE-style")
        if self.neg_zero == (self.nan == "negzero"):
            raise ValueError(f"neg_zero={self.neg_zero!r} does not fit nan={self.nan!r}: the "
                             "sign-bit-only code is NaN exactly when there is no -0")

    # -- widths and masks ---------------------------------------------------------------------

    @property
    def bits(self) -> int:
        """Total width: sign, exponent and mantissa bits."""
        return 1 + self.ebits + self.mbits

    @property
    def sign_mask(self) -> int:
        """The sign bit of a code."""
        return 1 << (self.ebits + self.mbits)

    @property
    def exp_mask(self) -> int:
        """The exponent field of a code, in place."""
        return ((1 << self.ebits) - 1) << self.mbits

    @property
    def mant_mask(self) -> int:
        """The mantissa field of a code, in place."""
        return (1 << self.mbits) - 1

    @property
    def code_dtype(self) -> np.dtype:
        """Smallest unsigned NumPy dtype holding a code (``uint8`` for 4 and 8 bits)."""
        for dt in (np.uint8, np.uint16, np.uint32):
            if self.bits <= 8 * np.dtype(dt).itemsize:
                return np.dtype(dt)
        return np.dtype(np.uint64)

    @property
    def n_codes(self) -> int:
        """Number of codes, ``2**bits``."""
        return 1 << self.bits

    # -- exponents and special codes ----------------------------------------------------------

    @property
    def emin(self) -> int:
        """Unbiased exponent of the smallest normal number, ``1 - bias``."""
        return 1 - self.bias

    @property
    def emax(self) -> int:
        """Unbiased exponent of the largest finite number."""
        top = (1 << self.ebits) - 1
        return (top - 1 if self.nan == "ieee" else top) - self.bias

    @property
    def max_code(self) -> int:
        """Code of the largest finite number (positive)."""
        top = (1 << self.ebits) - 1
        if self.nan == "ieee":
            return ((top - 1) << self.mbits) | self.mant_mask
        if self.nan == "single":
            return (top << self.mbits) | (self.mant_mask - 1)
        return (top << self.mbits) | self.mant_mask

    @property
    def max(self) -> float:
        """Largest finite value."""
        return float(self.decode(self.max_code))

    @property
    def min_normal_code(self) -> int:
        """Code of the smallest positive normal number."""
        return 1 << self.mbits

    @property
    def min_normal(self) -> float:
        """Smallest positive normal value, ``2**emin``."""
        return float(np.ldexp(1.0, self.emin))

    @property
    def min_subnormal_code(self) -> int:
        """Code of the smallest positive subnormal number (1)."""
        return 1

    @property
    def min_subnormal(self) -> float:
        """Smallest positive subnormal value, ``2**(emin - mbits)``."""
        return float(np.ldexp(1.0, self.emin - self.mbits))

    @property
    def inf_code(self) -> int | None:
        """Code of +infinity, or None."""
        return self.exp_mask if self.inf else None

    @property
    def nan_code(self) -> int | None:
        """Canonical (positive, quiet) NaN code, or None."""
        if self.nan == "ieee":
            return self.exp_mask | (1 << (self.mbits - 1))
        if self.nan == "single":
            return self.exp_mask | self.mant_mask
        if self.nan == "negzero":
            return self.sign_mask
        return None

    @property
    def dtype(self) -> np.dtype:
        """The NumPy / ml_dtypes dtype of this format (from :mod:`qaccel.model.dtypes`)."""
        from qaccel.model.dtypes import FLOAT_TYPES, QTYPES

        if self.name in QTYPES:
            return QTYPES[self.name].dtype
        if self.name in FLOAT_TYPES:
            return FLOAT_TYPES[self.name]
        return np.dtype(self.name)

    # -- classification -----------------------------------------------------------------------

    def _fields(self, codes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        c = np.asarray(codes).astype(np.uint64)
        if c.size and int(c.max()) >> self.bits:
            raise ValueError(f"codes must be below 2**{self.bits} for {self.name}, "
                             f"not {int(c.max())}")
        sign = (c >> np.uint64(self.bits - 1)) & np.uint64(1)
        e = (c >> np.uint64(self.mbits)) & np.uint64((1 << self.ebits) - 1)
        m = c & np.uint64(self.mant_mask)
        return sign, e, m

    def is_nan(self, codes) -> np.ndarray:
        """Return whether each code is a NaN."""
        sign, e, m = self._fields(codes)
        top = np.uint64((1 << self.ebits) - 1)
        if self.nan == "ieee":
            return (e == top) & (m != 0)
        if self.nan == "single":
            return (e == top) & (m == np.uint64(self.mant_mask))
        if self.nan == "negzero":
            return (sign == 1) & (e == 0) & (m == 0)
        return np.zeros(np.shape(sign), dtype=bool)

    def is_inf(self, codes) -> np.ndarray:
        """Return whether each code is an infinity."""
        _, e, m = self._fields(codes)
        if not self.inf:
            return np.zeros(np.shape(e), dtype=bool)
        return (e == np.uint64((1 << self.ebits) - 1)) & (m == 0)

    # -- conversion ---------------------------------------------------------------------------

    def decode(self, codes) -> np.ndarray:
        """Return the float64 values of ``codes`` (unsigned integers below ``2**bits``).

        Every finite value of every format in :data:`FORMATS` is exact in float64.
        """
        sign, e, m = self._fields(codes)
        nan, inf = self.is_nan(codes), self.is_inf(codes)
        mf = m.astype(np.float64)
        ei = np.where(nan | inf, self.bias, e.astype(np.int64))  # no overflow for float64
        mag = np.where(
            ei == 0,
            np.ldexp(mf, self.emin - self.mbits),
            np.ldexp(mf + float(1 << self.mbits), ei - self.bias - self.mbits),
        )
        mag = np.where(inf, np.inf, mag)
        value = np.where(sign == 1, -mag, mag)
        return np.where(nan, np.nan, value)

    def encode(self, values, *, saturate: bool = False) -> np.ndarray:
        """Return the codes (:attr:`code_dtype`) of ``values``, rounded to nearest, ties to even.

        Rounding happens as if the exponent range had no upper end; a result above
        :attr:`max` overflows to infinity (formats with ``inf``), to NaN (formats with a NaN
        but no infinity), or saturates to ``±max`` (``nan="none"``). ``saturate=True``
        first clamps values, infinities included, to ``[-max, max]``. NaN becomes
        :attr:`nan_code` with the input's sign where the format has a signed NaN, and the
        sign-bit-only code for ``nan="none"`` (ml_dtypes gives that for +NaN but 0 for -NaN).
        -0 and negative values that round to zero become 0 when the format has no -0.
        """
        if not isinstance(saturate, bool):
            raise TypeError(f"saturate must be a bool, not {saturate!r}")
        try:
            x = np.asarray(values).astype(np.float64)
        except (TypeError, ValueError):
            raise TypeError(f"values must be an array of numbers, not {values!r}") from None
        nan = np.isnan(x)
        neg = np.signbit(x)
        a = np.abs(x)
        fmax = self.max
        if saturate:
            a = np.minimum(a, fmax)
        # Exponent of each value (floor(log2 a)), clamped below to emin: subnormal quantum.
        finite = np.isfinite(a) & (a > 0)
        _, ex = np.frexp(np.where(finite, a, 1.0))
        e = np.maximum(ex.astype(np.int64) - 1, self.emin)
        q = np.rint(np.ldexp(np.where(finite, a, 0.0), self.mbits - e))  # RNE, exact
        r = np.ldexp(q, e - self.mbits)
        overflow = ~nan & ((r > fmax) | np.isinf(a))
        # Code of the rounded magnitude r (a power-of-two multiple of the subnormal quantum).
        _, er = np.frexp(np.where(r > 0, r, 1.0))
        er = er.astype(np.int64) - 1
        normal = r >= self.min_normal
        r_normal = np.where(normal, r, 0.0)
        r_sub = np.where(normal, 0.0, r)
        mag = np.where(
            normal,
            ((er + self.bias) << self.mbits)
            + (np.ldexp(r_normal, self.mbits - er).astype(np.int64) - (1 << self.mbits)),
            np.ldexp(r_sub, self.mbits - self.emin).astype(np.int64),
        )
        if self.inf:
            over_code = self.inf_code
        elif self.nan == "none":
            over_code = self.max_code
        else:
            over_code = self.nan_code
        mag = np.where(overflow, over_code, mag)
        codes = mag.astype(np.uint64)
        signed = neg & ((mag != 0) | self.neg_zero)
        codes = np.where(signed, codes | np.uint64(self.sign_mask), codes)
        if self.nan_code is not None:
            nan_codes = np.uint64(self.nan_code)
            if self.nan in ("ieee", "single"):
                nan_codes = np.where(neg, nan_codes | np.uint64(self.sign_mask), nan_codes)
            codes = np.where(nan, nan_codes, codes)
        else:
            codes = np.where(nan, np.uint64(self.sign_mask), codes)
        return codes.astype(self.code_dtype)

    def encode_exact(self, value, *, saturate: bool = False) -> int:
        """Return the code of one number rounded once to this format, ties to even.

        ``value`` is an :class:`int`, a :class:`~fractions.Fraction` (any rational, exactly,
        however many bits it needs) or a :class:`float`. The rules are those of
        :meth:`encode`: overflow, ``saturate``, signed zeros and NaN codes alike (a float
        NaN, infinity or zero is passed to :meth:`encode`). Plain Python integer arithmetic:
        a reference for units that round wider intermediates than float64, such as a divider's
        quotient, not a fast path.
        """
        if not isinstance(saturate, bool):
            raise TypeError(f"saturate must be a bool, not {saturate!r}")
        if isinstance(value, float) and (value == 0 or not math.isfinite(value)):
            return int(self.encode(value, saturate=saturate))
        if isinstance(value, bool) or not isinstance(value, (int, float, Fraction)):
            raise TypeError(f"value must be an int, a Fraction or a float, not {value!r}")
        q = Fraction(value)
        neg = q < 0
        a = abs(q)
        if saturate:
            k = self.emax - self.mbits
            top = (1 << self.mbits) | (self.max_code & self.mant_mask)
            a = min(a, Fraction(top << k) if k >= 0 else Fraction(top, 1 << -k))
        num, den = a.numerator, a.denominator
        if num == 0:
            return 0
        # e = floor(log2(a)), clamped below to emin: the exponent of the quantum's binade.
        e = num.bit_length() - den.bit_length()
        if (num << max(0, -e)) < (den << max(0, e)):
            e -= 1
        e = max(e, self.emin)
        shift = self.mbits - e                      # a * 2**shift is the significand
        n, d = (num << shift, den) if shift >= 0 else (num, den << -shift)
        sig, rem = divmod(n, d)
        if 2 * rem > d or (2 * rem == d and sig & 1):
            sig += 1
        if sig >> (self.mbits + 1):                 # rounded up into the next binade
            sig >>= 1
            e += 1
        if sig >> self.mbits:
            mag = ((e + self.bias) << self.mbits) | (sig & self.mant_mask)
        else:                                       # subnormal (e == emin) or zero
            mag = sig
        if e > self.emax or mag > self.max_code:
            if self.inf:
                mag = self.inf_code
            elif self.nan == "none":
                mag = self.max_code
            else:
                return self.nan_code | (self.sign_mask if neg and self.nan == "single" else 0)
        if neg and (mag != 0 or self.neg_zero):
            mag |= self.sign_mask
        return mag


def _f(name, ebits, mbits, bias, nan, *, inf=False, neg_zero=True):
    return FloatFormat(name, ebits, mbits, bias, inf, nan, neg_zero)


#: Every format qaccel handles, by the names :mod:`qaccel.model.dtypes` uses.
FORMATS: dict[str, FloatFormat] = {
    f.name: f
    for f in (
        _f("float64", 11, 52, 1023, "ieee", inf=True),
        _f("float32", 8, 23, 127, "ieee", inf=True),
        _f("float16", 5, 10, 15, "ieee", inf=True),
        _f("bfloat16", 8, 7, 127, "ieee", inf=True),
        _f("float8e4m3fn", 4, 3, 7, "single"),
        _f("float8e4m3fnuz", 4, 3, 8, "negzero", neg_zero=False),
        _f("float8e5m2", 5, 2, 15, "ieee", inf=True),
        _f("float8e5m2fnuz", 5, 2, 16, "negzero", neg_zero=False),
        _f("float4e2m1", 2, 1, 1, "none"),
    )
}


def float_format(fmt, *, param: str = "fmt") -> FloatFormat:
    """Return ``fmt`` as a :class:`FloatFormat`: a FloatFormat, a name in :data:`FORMATS`, or
    a NumPy / ml_dtypes dtype of one of them.

    Raises ``TypeError`` (wrong kind of value) or ``ValueError`` (unknown name) naming
    ``param``.
    """
    if isinstance(fmt, FloatFormat):
        return fmt
    if isinstance(fmt, str):
        if fmt not in FORMATS:
            raise ValueError(f"{param} must be one of {', '.join(FORMATS)}, not {fmt!r}")
        return FORMATS[fmt]
    try:
        dt = np.dtype(fmt)
    except TypeError:
        raise TypeError(f"{param} must be a FloatFormat, a format name or a float dtype, "
                        f"not {fmt!r}") from None
    from qaccel.model.dtypes import dtype_name

    name = dtype_name(dt)
    if name not in FORMATS:
        raise ValueError(f"{param} must be one of {', '.join(FORMATS)}, not {name!r}")
    return FORMATS[name]
