"""The float format table against ml_dtypes / NumPy: every code of every small format."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from qaccel.model.dtypes import FLOAT_TYPES, QTYPES
from qaccel.model.floatfmt import FORMATS, FloatFormat, float_format

SMALL = [name for name, f in FORMATS.items() if f.bits <= 16]


def finfo(fmt: FloatFormat):
    return np.finfo(fmt.dtype) if fmt.name in ("float64", "float32", "float16") \
        else ml_dtypes.finfo(fmt.dtype)


def reference_values(fmt: FloatFormat, codes: np.ndarray) -> np.ndarray:
    """Decode with ml_dtypes / NumPy (float4 is stored one code per byte)."""
    view = np.dtype(f"uint{8 * fmt.dtype.itemsize}")
    with np.errstate(invalid="ignore"):
        return codes.astype(view).view(fmt.dtype).astype(np.float64)


def reference_codes(fmt: FloatFormat, values: np.ndarray) -> np.ndarray:
    view = np.dtype(f"uint{8 * fmt.dtype.itemsize}")
    with np.errstate(invalid="ignore", over="ignore"):
        return values.astype(fmt.dtype).view(view).astype(np.uint64)


def assert_same_values(got: np.ndarray, want: np.ndarray, codes: np.ndarray, what: str):
    nan = np.isnan(want)
    bad = (np.isnan(got) != nan) | (~nan & ((got != want) | (np.signbit(got) != np.signbit(want))))
    k = np.flatnonzero(bad)
    assert not k.size, (f"{what}: {k.size} codes differ, first "
                        + ", ".join(f"{int(codes[j]):#x}: {got[j]!r} != {want[j]!r}"
                                    for j in k[:4]))


@pytest.mark.parametrize("name", SMALL)
def test_floatfmt_decode_every_code(name):
    fmt = FORMATS[name]
    codes = np.arange(fmt.n_codes, dtype=np.uint64)
    values = fmt.decode(codes)
    assert_same_values(values, reference_values(fmt, codes), codes, name)
    np.testing.assert_array_equal(fmt.is_nan(codes), np.isnan(values))
    np.testing.assert_array_equal(fmt.is_inf(codes), np.isinf(values))
    assert np.isnan(values).sum() == {"ieee": 2 * ((1 << fmt.mbits) - 1), "single": 2,
                                      "negzero": 1, "none": 0}[fmt.nan]


@pytest.mark.parametrize("name", ["float32", "float64"])
def test_floatfmt_decode_random_codes(name):
    fmt = FORMATS[name]
    rng = np.random.default_rng(5)
    codes = rng.integers(0, 2**fmt.bits, 500_000, dtype=np.uint64, endpoint=False)
    edges = np.array([0, 1, fmt.mant_mask, fmt.min_normal_code, fmt.max_code, fmt.inf_code,
                      fmt.inf_code + 1, fmt.nan_code, fmt.exp_mask | fmt.mant_mask],
                     dtype=np.uint64)
    codes = np.concatenate([codes, edges, edges | np.uint64(fmt.sign_mask)])
    assert_same_values(fmt.decode(codes), reference_values(fmt, codes), codes, name)


@pytest.mark.parametrize("name", list(FORMATS))
def test_floatfmt_properties(name):
    fmt = FORMATS[name]
    fi = finfo(fmt)
    assert fmt.bits == fi.bits and fmt.ebits == fi.nexp and fmt.mbits == fi.nmant
    assert fmt.max == float(fi.max)
    assert fmt.min_normal == float(fi.smallest_normal)
    assert fmt.min_subnormal == float(fi.smallest_subnormal)
    assert fmt.emin == fi.minexp and fmt.emax == fi.maxexp - 1
    assert fmt.decode(fmt.max_code) == fmt.max
    assert fmt.decode(fmt.min_normal_code) == fmt.min_normal
    assert fmt.decode(fmt.min_subnormal_code) == fmt.min_subnormal
    assert fmt.sign_mask | fmt.exp_mask | fmt.mant_mask == 2**fmt.bits - 1
    assert 8 * fmt.code_dtype.itemsize >= fmt.bits
    if fmt.inf:
        assert fmt.decode(fmt.inf_code) == np.inf
    else:
        assert fmt.inf_code is None
    if fmt.nan_code is not None:
        assert np.isnan(fmt.decode(fmt.nan_code))
    # The dtype named like the format is the format.
    assert fmt.dtype == (QTYPES[name].dtype if name in QTYPES
                         else FLOAT_TYPES.get(name, np.dtype(name)))


def test_floatfmt_table_covers_dtypes():
    floats = {q.name for q in QTYPES.values() if q.kind == "float"} | set(FLOAT_TYPES)
    assert floats <= set(FORMATS)
    for name in floats:
        assert float_format(FORMATS[name].dtype) is FORMATS[name]
        assert float_format(name) is FORMATS[name]
    assert float_format(np.float64) is FORMATS["float64"]
    assert FORMATS["float8e4m3fnuz"].nan_code == 0x80
    assert FORMATS["float8e4m3fn"].nan_code == 0x7F
    assert FORMATS["float8e5m2"].nan_code == 0x7E and FORMATS["float8e5m2"].inf_code == 0x7C
    assert FORMATS["float4e2m1"].max_code == 0x7 and FORMATS["float4e2m1"].nan_code is None


def encode_inputs(fmt: FloatFormat, seed: int) -> np.ndarray:
    """float32 values: every value of ``fmt``, midpoints and their neighbours, overflow,
    underflow, specials and random magnitudes across the whole range."""
    codes = np.arange(fmt.n_codes, dtype=np.uint64)
    v = fmt.decode(codes)
    v = np.unique(v[np.isfinite(v)])
    mid = (v[1:] + v[:-1]) / 2
    extra = np.array([fmt.max * 1.0625, fmt.max * 1.125, fmt.max * 2, 1e30, np.inf, np.nan,
                      0.0, fmt.min_subnormal / 2, fmt.min_subnormal / 4,
                      fmt.min_subnormal * 0.75])
    rng = np.random.default_rng(seed)
    n = 200_000
    rnd = rng.standard_normal(n) * np.exp2(rng.integers(fmt.emin - fmt.mbits - 3, fmt.emax + 3, n))
    with np.errstate(over="ignore"):
        x = np.concatenate([v, mid, extra, rnd]).astype(np.float32)
        x = np.concatenate([x, -x, np.nextafter(x, np.float32(np.inf)),
                            np.nextafter(x, np.float32(-np.inf))])
    return x


@pytest.mark.parametrize("saturate", [False, True], ids=["plain", "saturate"])
@pytest.mark.parametrize("name", [n for n in SMALL if n != "float16"] + ["float16"])
def test_floatfmt_encode_matches_ml_dtypes(name, saturate):
    """RNE encode of float32 inputs agrees with ml_dtypes' cast, code for code."""
    fmt = FORMATS[name]
    x = encode_inputs(fmt, seed=len(name))
    got = fmt.encode(x, saturate=saturate).astype(np.uint64)
    assert got.dtype == np.uint64 and fmt.encode(x[:1]).dtype == fmt.code_dtype
    want = reference_codes(fmt, np.clip(x, -fmt.max, fmt.max) if saturate else x)
    bad = got != want
    if fmt.nan == "ieee":  # any NaN code will do
        bad &= ~(fmt.is_nan(got) & fmt.is_nan(want))
    if fmt.nan == "none":  # ml_dtypes gives 0x8 for +NaN but 0x0 for -NaN; we give 0x8
        bad &= ~np.isnan(x)
        assert (got[np.isnan(x)] == fmt.sign_mask).all()
    k = np.flatnonzero(bad)
    assert not k.size, (f"{name}: {k.size} values encode differently, first "
                        + ", ".join(f"{x[j]!r}: {int(got[j]):#x} != {int(want[j]):#x}"
                                    for j in k[:4]))


@pytest.mark.parametrize("name", ["float32", "float16"])
def test_floatfmt_encode_from_float64(name):
    """Rounding from float64 agrees with NumPy's (correctly rounded) casts."""
    fmt = FORMATS[name]
    rng = np.random.default_rng(11)
    x = rng.standard_normal(300_000) * np.exp2(
        rng.integers(fmt.emin - fmt.mbits - 2, fmt.emax + 2, 300_000))
    v = fmt.decode(np.arange(0, 2**fmt.bits, max(1, 2**fmt.bits // 50_000), dtype=np.uint64))
    v = v[np.isfinite(v)]
    x = np.concatenate([x, v, np.nextafter(v, np.inf), [np.inf, -np.inf, np.nan, -0.0]])
    got = fmt.encode(x)
    want = reference_codes(fmt, x)
    bad = (got != want) & ~(fmt.is_nan(got) & fmt.is_nan(want))
    assert not bad.any(), (x[bad][:4], got[bad][:4], want[bad][:4])


def test_floatfmt_encode_specials():
    e4 = FORMATS["float8e4m3fn"]
    assert list(e4.encode([464.0, 480.0, -1e9, np.inf, -0.0])) == [0x7E, 0x7F, 0xFF, 0x7F, 0x80]
    assert list(e4.encode([464.0, 1e9, -np.inf, np.nan], saturate=True)) == [0x7E, 0x7E, 0xFE,
                                                                             0x7F]
    uz = FORMATS["float8e4m3fnuz"]
    assert list(uz.encode([-0.0, -1e-30, np.nan, -np.nan, 1e9])) == [0, 0, 0x80, 0x80, 0x80]
    e5 = FORMATS["float8e5m2"]
    assert list(e5.encode([61440.0, -np.inf, np.nan])) == [0x7C, 0xFC, 0x7E]
    f4 = FORMATS["float4e2m1"]
    assert list(f4.encode([7.0, -100.0, np.inf, 0.25, 0.75, -0.2])) == [7, 15, 7, 0, 2, 8]


def test_floatfmt_errors():
    ok = {"name": "x", "ebits": 4, "mbits": 3, "bias": 7, "inf": False, "nan": "single",
          "neg_zero": True}
    for field, value, exc, msg in [
        ("name", "", TypeError, r"name must be a non-empty string, not ''"),
        ("ebits", 4.0, TypeError, r"ebits must be an integer, not 4.0"),
        ("ebits", 12, ValueError, r"ebits must be in \[1, 11\], not 12"),
        ("mbits", 0, ValueError, r"mbits must be in \[1, 52\], not 0"),
        ("bias", 16, ValueError, r"bias must be in \[0, 15\], not 16"),
        ("inf", 0, TypeError, r"inf must be a bool, not 0"),
        ("neg_zero", None, TypeError, r"neg_zero must be a bool, not None"),
        ("nan", "quiet", ValueError, r"nan must be one of ieee, single, negzero, none, "
                                     r"not 'quiet'"),
        ("inf", True, ValueError, r"inf=True does not fit nan='single'"),
        ("neg_zero", False, ValueError, r"neg_zero=False does not fit nan='single'"),
    ]:
        with pytest.raises(exc, match=msg):
            FloatFormat(**{**ok, field: value})
    with pytest.raises(ValueError, match=r"fmt must be one of float64, .*, not 'float7'"):
        float_format("float7")
    with pytest.raises(ValueError, match=r"dtype must be one of .*, not 'int8'"):
        float_format(np.int8, param="dtype")
    with pytest.raises(TypeError, match=r"fmt must be a FloatFormat, a format name or a float "
                                        r"dtype, not 3"):
        float_format(3)
    f16 = FORMATS["float16"]
    with pytest.raises(ValueError, match=r"codes must be below 2\*\*16 for float16, not 65536"):
        f16.decode([65536])
    with pytest.raises(TypeError, match=r"saturate must be a bool, not 1"):
        f16.encode([1.0], saturate=1)
    with pytest.raises(TypeError, match=r"values must be an array of numbers"):
        f16.encode(["a"])
