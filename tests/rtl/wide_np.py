"""Wide floats (:func:`qaccel.rtl.arith.wide_float.wide_float_layout`) in NumPy, for the tests
of the
arithmetic units: dicts of field arrays (``sign``, ``exp``, ``sig``, ``sticky``, ``cls``, each
``uint64`` but ``exp``, ``int64``), conversions from float64, input generators and the
references that round them (NumPy / ml_dtypes casts, exact rational rounding).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from onnx.numpy_helper import saturate_cast

from qaccel.model.floatfmt import FloatFormat
from qaccel.rtl.arith.float_unpack import FloatClass

ZERO, SUB, NORM, INF, NAN = (FloatClass.ZERO.value, FloatClass.SUBNORMAL.value,
                             FloatClass.NORMAL.value, FloatClass.INF.value,
                             FloatClass.NAN.value)


def concat(*parts: dict) -> dict:
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def wide_from_float64(x, width: int) -> dict:
    """The wide floats holding float64 values exactly (their significands must fit ``width``)."""
    x = np.asarray(x, dtype=np.float64)
    frac, e = np.frexp(np.where(np.isfinite(x), np.abs(x), 0.0))
    sig53 = np.ldexp(frac, 53).astype(np.uint64)
    if width >= 53:
        sig = sig53 << np.uint64(width - 53)
    else:
        assert not np.any(sig53 & np.uint64((1 << (53 - width)) - 1)), "value too precise"
        sig = sig53 >> np.uint64(53 - width)
    cls = np.where(x == 0, ZERO, np.where(np.isinf(x), INF, np.where(np.isnan(x), NAN, NORM)))
    return {"sign": np.signbit(x).astype(np.uint64), "exp": (e - 1).astype(np.int64),
            "sig": np.where(cls == NORM, sig, 0).astype(np.uint64),
            "sticky": np.zeros(x.shape, np.uint64), "cls": cls.astype(np.uint64)}


def step(w: dict, width: int, up: bool) -> dict:
    """The wide floats one unit of the last place away from finite ``w`` (same sign)."""
    top, full = np.uint64(1 << (width - 1)), np.uint64((1 << width) - 1)
    sig, exp = w["sig"].copy(), w["exp"].copy()
    if up:
        wrap = sig == full
        sig = np.where(wrap, top, sig + np.uint64(1))
        exp = np.where(wrap, exp + 1, exp)
    else:
        wrap = sig == top
        sig = np.where(wrap, full, sig - np.uint64(1))
        exp = np.where(wrap, exp - 1, exp)
    return w | {"sig": sig, "exp": exp}


def with_sticky(w: dict) -> dict:
    return w | {"sticky": np.ones_like(w["sticky"])}


def negate(w: dict) -> dict:
    return w | {"sign": w["sign"] ^ np.uint64(1)}


def specials(width: int, exp_width: int, n_exp: int = 0, seed: int = 0) -> dict:
    """Zeros, infinities, NaNs (with junk in the ignored fields), both signs, and finite values
    at the ends of the exponent field (and ``n_exp`` random exponents)."""
    rng = np.random.default_rng(seed)
    lo, hi = -(1 << (exp_width - 1)), (1 << (exp_width - 1)) - 1
    exps = np.array([lo, lo + 1, hi - 1, hi, -1, 0, 1], dtype=np.int64)
    exps = np.concatenate([exps, rng.integers(lo, hi + 1, n_exp)])
    top = 1 << (width - 1)
    sigs = np.array([top, top | 1, (top << 1) - 1, top | (top >> 1)], dtype=np.uint64)
    e, s = np.meshgrid(exps, sigs)
    finite = {"sign": np.zeros(e.size, np.uint64), "exp": e.ravel(), "sig": s.ravel(),
              "sticky": np.zeros(e.size, np.uint64), "cls": np.full(e.size, NORM, np.uint64)}
    n = 6
    junk = {"sign": np.zeros(3 * n, np.uint64), "exp": np.tile(np.arange(n) - 3, 3),
            "sig": np.tile(np.array([0, 1, top, top + 5, 7, 0], np.uint64), 3),
            "sticky": np.tile(np.array([0, 1], np.uint64), 3 * n // 2),
            "cls": np.repeat(np.array([ZERO, INF, NAN], np.uint64), n)}
    out = concat(finite, with_sticky(finite), junk)
    return concat(out, negate(out))


def round_to_odd_53(w: dict, width: int) -> np.ndarray:
    """The wide floats as float64 values rounded to odd (signs, zeros, inf and NaN kept).

    Exponents beyond float64's normal range become ±inf (above) or ±2**-1000 (below): every
    format here but float64 rounds such values as it rounds those.
    """
    sig, sticky = w["sig"], w["sticky"] != 0
    if width > 53:
        rest = (sig & np.uint64((1 << (width - 53)) - 1)) != 0
        t = (sig >> np.uint64(width - 53)) | (rest | sticky).astype(np.uint64)
    else:
        t = (sig << np.uint64(53 - width)) | sticky.astype(np.uint64)
    exp = w["exp"]
    normal_range = (exp >= -1000) & (exp <= 1023)
    mag = np.ldexp(t.astype(np.float64), np.where(normal_range, exp - 52, 0))
    mag = np.where(exp > 1023, np.inf, np.where(exp < -1000, np.ldexp(1.0, -1000), mag))
    cls = w["cls"]
    mag = np.where(cls == ZERO, 0.0, np.where(cls == INF, np.inf,
                                              np.where(cls == NAN, np.nan, mag)))
    return np.copysign(mag, np.where(w["sign"] != 0, -1.0, 1.0))


def round_to_odd_32(x: np.ndarray) -> np.ndarray:
    """float64 values rounded to odd at float32 (24 bits; inf and NaN kept)."""
    with np.errstate(over="ignore", invalid="ignore"):
        y = x.astype(np.float32)
    inexact = np.isfinite(x) & (y.astype(np.float64) != x)
    over = inexact & (np.abs(y.astype(np.float64)) > np.abs(x))
    y = np.where(over, np.nextafter(y, np.float32(0)), y)
    bits = y.view(np.uint32) | inexact.astype(np.uint32)
    return bits.view(np.float32)


def reference_codes(fmt: FloatFormat, w: dict, width: int, saturate: bool) -> np.ndarray:
    """Codes NumPy / ml_dtypes (saturate=0) or onnx's saturate_cast (saturate=1) give for the
    exact wide values, as uint64 (targets of at most 24 significant bits)."""
    assert fmt.mbits <= 23
    x = round_to_odd_53(w, width)
    if fmt.name not in ("float32", "float16"):
        x = round_to_odd_32(x)
    with np.errstate(over="ignore", invalid="ignore"):
        y = saturate_cast(x, fmt.dtype) if saturate else x.astype(fmt.dtype)
    return y.view(fmt.code_dtype).astype(np.uint64)


def exact_codes(fmt: FloatFormat, w: dict, width: int, saturate: bool) -> np.ndarray:
    """Codes by exact rational rounding, one value at a time (:meth:`FloatFormat.encode_exact`);
    the sticky bit stands for half a unit of the last place. NaN codes as ml_dtypes gives them.
    """
    out = np.empty(w["sig"].shape, np.uint64)
    nan = np.array([np.nan, -np.nan])
    with np.errstate(invalid="ignore"):
        nan_codes = [int(c) for c in nan.astype(fmt.dtype).view(fmt.code_dtype)]
    for k, (sign, exp, sig, sticky, cls) in enumerate(zip(
            w["sign"].tolist(), w["exp"].tolist(), w["sig"].tolist(), w["sticky"].tolist(),
            w["cls"].tolist(), strict=True)):
        if cls == NAN:
            out[k] = nan_codes[sign]
            continue
        if cls == ZERO:
            value = -0.0 if sign else 0.0
        elif cls == INF:
            value = -np.inf if sign else np.inf
        else:
            num, shift = 2 * sig + sticky, exp - width     # |value| = num * 2**shift
            mag = Fraction(num << shift) if shift >= 0 else Fraction(num, 1 << -shift)
            value = -mag if sign else mag
        out[k] = fmt.encode_exact(value, saturate=saturate)
    return out


def value_fields(fmt: FloatFormat, codes: np.ndarray, width: int) -> dict:
    """The wide float FloatRound's ``value`` output holds for ``codes`` of ``fmt``."""
    codes = codes.astype(fmt.code_dtype)
    x = fmt.decode(codes)
    nan, inf = fmt.is_nan(codes), fmt.is_inf(codes)
    w = wide_from_float64(np.where(nan | inf, 0.0, x), width)
    sign = (codes.astype(np.uint64) >> np.uint64(fmt.bits - 1)) & np.uint64(1)
    sub = (w["cls"] == NORM) & (np.abs(x) < fmt.min_normal)
    cls = np.where(nan, NAN, np.where(inf, INF, np.where(sub, SUB, w["cls"])))
    zero = cls != NORM
    zero &= cls != SUB
    return {"sign": sign, "exp": np.where(zero, 0, w["exp"]), "sig": w["sig"],
            "sticky": np.zeros_like(sign), "cls": cls.astype(np.uint64)}


def describe(w: dict, k: int) -> str:
    return (f"sign={int(w['sign'][k])} exp={int(w['exp'][k])} sig={int(w['sig'][k]):#x} "
            f"sticky={int(w['sticky'][k])} cls={FloatClass(int(w['cls'][k])).name}")


def grid_inputs(fmt: FloatFormat, width: int) -> dict:
    """Every finite code's value and every midpoint between neighbours (from 0 up to the
    overflow threshold ``max + ulp/2``), each exact, one unit of the last place (``width``
    bits) below and above, and with the sticky bit; both signs."""
    mags = np.unique(np.abs(fmt.decode(np.arange(fmt.n_codes))))
    mags = mags[np.isfinite(mags)]
    ulp_max = np.ldexp(1.0, fmt.emax - fmt.mbits)
    edges = np.append(mags, mags[-1] + ulp_max)              # + the first value beyond max
    mids = (edges[:-1] + edges[1:]) / 2                      # exact: < 24-bit significands
    values = wide_from_float64(np.concatenate([mags[1:], mids, edges[-1:]]), width)
    zero = wide_from_float64(np.zeros(1), width)
    out = concat(zero, values, step(values, width, False), step(values, width, True),
                 with_sticky(values), with_sticky(step(values, width, False)))
    return concat(out, negate(out))


def random_inputs(n: int, width: int, exp_lo: int, exp_hi: int, seed: int, prec: int) -> dict:
    """``n`` random finite wide floats: random significands, sticky bits and signs, exponents
    uniform in ``[exp_lo, exp_hi]``; in a quarter of them the bits below a ``prec``-bit
    format's round bit are cleared, in another quarter set (ties and near-ties)."""
    rng = np.random.default_rng(seed)
    sig = rng.integers(0, 1 << width, n, dtype=np.uint64) | np.uint64(1 << (width - 1))
    q = n // 4
    low = np.uint64((1 << (width - prec - 1)) - 1)
    sig[:q] &= ~low
    sig[q:2 * q] |= low
    return {"sign": rng.integers(0, 2, n, dtype=np.uint64),
            "exp": rng.integers(exp_lo, exp_hi, n, endpoint=True),
            "sig": sig, "sticky": rng.integers(0, 2, n, dtype=np.uint64),
            "cls": np.full(n, NORM, np.uint64)}


def random_for(fmt: FloatFormat, n: int, width: int, seed: int) -> dict:
    """:func:`random_inputs` for ``fmt``: from below half its smallest subnormal to beyond
    its overflow threshold, a fifth of them in its subnormal range, a fifth near ``max``."""
    lo, hi = fmt.emin - fmt.mbits - 3, fmt.emax + 2
    k = n // 5
    return concat(random_inputs(n - 2 * k, width, lo, hi, seed, fmt.mbits + 1),
                  random_inputs(k, width, lo, fmt.emin, seed + 1000, fmt.mbits + 1),
                  random_inputs(k, width, fmt.emax - 1, hi, seed + 2000, fmt.mbits + 1))
