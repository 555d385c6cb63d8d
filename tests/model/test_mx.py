"""OCP Microscaling helpers (qaccel.model.mx) against a straightforward NumPy implementation of
the OCP MX v1.0 conversion written here, block by block in float64."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from qaccel.model import mx, quant
from qaccel.model.mx import MX_FORMATS, mx_dequantize, mx_quantize, qdq_scales, shared_scales

from .quant_helpers import BF16, E8M0, F16, F32, assert_bitexact, tid

# name: (emax, mantissa bits, smallest normal exponent, largest normal); None: MXINT8
ELEMENTS = {
    "mxfp4": (2, 1, 0, 6.0),
    "mxfp8_e4m3": (8, 3, -6, 448.0),
    "mxfp8_e5m2": (15, 2, -14, 57344.0),
    "mxint8": (0, None, None, 127 / 64),
}
#: Smallest shared exponent: e8m0's 2**-127, or 2**-121 for MXINT8 (the folded 2**-6).
MIN_EXP = {"mxfp4": -127, "mxfp8_e4m3": -127, "mxfp8_e5m2": -127, "mxint8": -121}


def ocp_block(v: np.ndarray, fmt: str) -> tuple[float, np.ndarray]:
    """OCP MX v1.0 section 6.3 on one block: return (shared exponent or NaN, the values)."""
    emax, mbits, emin, max_normal = ELEMENTS[fmt]
    v = v.astype(np.float64)
    if not np.isfinite(v).all():
        return math.nan, np.full(v.shape, np.nan)
    amax = np.abs(v).max()
    e = MIN_EXP[fmt] if amax == 0 else int(np.floor(np.log2(amax))) - emax
    e = min(max(e, MIN_EXP[fmt]), 127)
    q = v / 2.0**e
    if mbits is None:  # int8, 1.6 fixed point
        p = np.clip(np.rint(q * 64), -128, 127) / 64
    else:
        with np.errstate(divide="ignore"):
            binade = np.maximum(np.floor(np.log2(np.abs(q))), emin)
        step = 2.0 ** (binade - mbits)
        p = np.clip(np.rint(q / step) * step, -max_normal, max_normal)
    return float(e), p * 2.0**e


def ocp_reference(x: np.ndarray, fmt: str, axis: int, block_size: int):
    """Return (shared exponents, values) of ``x``, one block at a time."""
    xm = np.moveaxis(x, axis, -1)
    n_blocks = -(-xm.shape[-1] // block_size)
    exps = np.empty((*xm.shape[:-1], n_blocks))
    values = np.empty(xm.shape)
    for idx in np.ndindex(*xm.shape[:-1]):
        for b in range(n_blocks):
            sl = slice(b * block_size, (b + 1) * block_size)
            exps[(*idx, b)], values[(*idx, sl)] = ocp_block(xm[(*idx, sl)], fmt)
    return np.moveaxis(exps, -1, axis), np.moveaxis(values, -1, axis)


def decoded(codes, scales, fmt, block_size=32) -> np.ndarray:
    """float64 values of MX codes and OCP scales (blocks along the last axis), by definition."""
    p = codes.astype(np.float64) / (64 if fmt == "mxint8" else 1)
    s = np.repeat(scales.astype(np.float64), block_size, axis=-1)
    return p * s[..., : codes.shape[-1]]


def make_x(shape, dtype, seed, *, axis=-1, specials=True) -> np.ndarray:
    """Values over many magnitudes; lines along ``axis`` of zeros, NaN, +-inf, tiny and huge
    values and values at the element formats' edges."""
    rng = np.random.default_rng(seed)
    shape = tuple(np.moveaxis(np.empty(shape, np.bool_), axis, -1).shape)
    info = ml_dtypes.finfo(dtype)
    lo, hi = math.log2(float(info.smallest_subnormal)), math.log2(float(info.max))
    mag = np.exp2(rng.uniform(-8, 8, (*shape[:-1], 1)))  # a magnitude per row
    x = rng.standard_normal(shape) * mag
    if specials:
        row = x.reshape(-1, shape[-1])
        row[0, :] = 0.0
        row[1, 3] = np.nan
        row[2, 5] = np.inf
        row[3, 7] = -np.inf
        row[4, :] = np.exp2(rng.uniform(lo, lo + 6, shape[-1])) * rng.choice([-1, 1], shape[-1])
        row[5, :] = np.exp2(rng.uniform(hi - 4, hi - 0.01, shape[-1])) * rng.choice([-1, 1])
        row[6, :] = -0.0
        row[7, ::2] = rng.choice([6.0, 7.9, 448.0, 500.0, 1.99, -2.0, 1.0, 0.75], shape[-1])[::2]
    with np.errstate(over="ignore"):
        return np.moveaxis(x.astype(dtype), -1, axis)


def _check(x, fmt, axis, block_size):
    codes, scales = mx_quantize(x, fmt, axis=axis, block_size=block_size)
    exps, values = ocp_reference(x, fmt, axis % x.ndim, block_size)
    assert codes.dtype == MX_FORMATS[fmt].dtype and codes.shape == x.shape
    assert scales.dtype == E8M0
    want_codes = np.where(np.isnan(exps), 0xFF, np.nan_to_num(exps) + 127).astype(np.uint8)
    np.testing.assert_array_equal(scales.view(np.uint8), want_codes)
    got = decoded(np.moveaxis(codes, axis, -1), np.moveaxis(scales, axis, -1), fmt, block_size)
    np.testing.assert_array_equal(got, np.moveaxis(values, axis, -1))
    y = mx_dequantize(codes, scales, fmt, axis=axis, block_size=block_size)
    np.testing.assert_array_equal(y, values.astype(np.float32))  # exact in float32
    return codes, scales, y


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=tid)
@pytest.mark.parametrize("fmt", MX_FORMATS)
@pytest.mark.parametrize(
    "shape,axis,block_size",
    [((12, 96), -1, 32), ((12, 70), 1, 32), ((40, 9), 0, 32), ((2, 9, 45), 1, 16),
     ((10, 33), -1, 8)],
    ids=["rows", "partial", "axis0", "3d", "block8"],
)  # fmt: skip
def test_matches_the_ocp_algorithm(fmt, dtype, shape, axis, block_size):
    x = make_x(shape, dtype, seed=len(fmt) + axis, axis=axis)
    _check(x, fmt, axis, block_size)


@pytest.mark.parametrize("fmt", MX_FORMATS)
def test_round_trip_error_is_bounded_by_the_block_maximum(fmt):
    """|v - y| <= amax * r per block: the top binade's clamp or half its step, whichever is
    larger (float4e2m1 1/4, e4m3 and e5m2 1/8, MXINT8 1/64)."""
    bound = {"mxfp4": 1 / 4, "mxfp8_e4m3": 1 / 8, "mxfp8_e5m2": 1 / 8, "mxint8": 1 / 64}[fmt]
    x = make_x((64, 256), F32, seed=3, specials=False)
    codes, scales = mx_quantize(x, fmt)
    y = mx_dequantize(codes, scales, fmt)
    amax = np.repeat(np.abs(x).reshape(64, 8, 32).max(axis=-1), 32, axis=-1)
    err = np.abs(y.astype(np.float64) - x)
    assert (err <= bound * amax).all()
    assert err.max() > bound * amax.max() / 16  # the bound is not vacuous
    rel = np.linalg.norm(y - x) / np.linalg.norm(x)
    assert rel < {"mxfp4": 0.2, "mxfp8_e4m3": 0.04, "mxfp8_e5m2": 0.08, "mxint8": 0.01}[fmt]


@pytest.mark.parametrize(
    "fmt,block_max,code",
    [
        ("mxfp4", 6.0, 127),  # 6 = 1.5 * 2**2: scale 2**0
        ("mxfp4", 7.9, 127),  # same binade: scale 2**0, 7.9 clamps to 6
        ("mxfp4", 8.0, 128),
        ("mxfp4", 1.0, 125),  # 2**-2
        ("mxfp8_e4m3", 448.0, 127),
        ("mxfp8_e4m3", 1.0, 119),  # 2**-8
        ("mxfp8_e5m2", 57344.0, 127),
        ("mxfp8_e5m2", 2.0**-20, 92),  # 2**-35
        ("mxint8", 1.5, 127),  # 1.5 = 96 * 2**-6 at scale 2**0
        ("mxint8", 100.0, 133),  # 2**6
        ("mxfp4", 0.0, 0),  # all zero: the smallest scale
        ("mxint8", 0.0, 6),  # ... MXINT8's: 2**-121
        ("mxfp4", 2.0**-149, 0),  # clamped up to 2**-127
        ("mxint8", 2.0**-126, 6),
        ("mxfp4", float(np.finfo(np.float32).max), 252),  # 2**(127 - 2)
        ("mxint8", float(np.finfo(np.float32).max), 254),  # 2**127
        ("mxfp4", np.nan, 0xFF),
        ("mxint8", np.inf, 0xFF),
        ("mxfp8_e4m3", -np.inf, 0xFF),
    ],
    ids=str,
)
def test_shared_scale_choice(fmt, block_max, code):
    x = np.zeros(32, np.float32)
    x[5] = block_max
    x[6] = block_max / 3 if np.isfinite(block_max) else 1.0
    scales = shared_scales(x, fmt)
    assert scales.shape == (1,) and scales.view(np.uint8)[0] == code
    codes, scales = mx_quantize(x, fmt)
    y = mx_dequantize(codes, scales, fmt)
    if np.isnan(block_max) or np.isinf(block_max):
        assert np.isnan(y).all()  # a NaN scale: the whole block
    else:
        _check(x, fmt, -1, 32)


def test_mxfp4_block_max_six_is_exact():
    x = np.array([6.0, -6.0, 3.0, 1.5, 0.5, 0.25, -0.0] + [0.0] * 25, np.float32)
    codes, scales = mx_quantize(x, "mxfp4")
    assert scales.view(np.uint8).tolist() == [127]
    np.testing.assert_array_equal(codes.astype(np.float32)[:6], [6.0, -6.0, 3.0, 1.5, 0.5, 0.0])
    assert_bitexact(mx_dequantize(codes, scales, "mxfp4"), codes.astype(np.float32))


def test_mxint8_is_a_plain_int8_quantize_linear_with_the_folded_scale():
    """MXINT8 codes are QuantizeLinear's int8 with scale 2**(e - 6); the value is
    code * 2**-6 * 2**e (OCP scale 2**e)."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((8, 64)) * 3).astype(np.float32)
    codes, scales = mx_quantize(x, "mxint8")
    folded = qdq_scales(scales, "mxint8")
    np.testing.assert_array_equal(folded.view(np.uint8), scales.view(np.uint8) - 6)
    plain = quant.quantize_linear(x, folded, axis=1, block_size=32, output_dtype=np.int8)
    assert_bitexact(codes, plain)
    want = codes.astype(np.float64) / 64 * np.repeat(scales.astype(np.float64), 32, axis=1)
    np.testing.assert_array_equal(mx_dequantize(codes, scales, "mxint8"), want)
    assert -128 in mx_quantize(np.float32([-1.999, 1.0] + [0.0] * 30), "mxint8")[0]


def test_qdq_scales_keep_nan_and_leave_float_formats_alone():
    s = np.array([0xFF, 127, 6], np.uint8).view(E8M0)
    assert qdq_scales(s, "mxint8").view(np.uint8).tolist() == [0xFF, 121, 0]
    for fmt in ("mxfp4", "mxfp8_e4m3", "mxfp8_e5m2"):
        assert qdq_scales(s, fmt) is s


@pytest.mark.parametrize("out", [F16, BF16], ids=tid)
def test_dequantize_output_dtypes(out):
    x = make_x((4, 64), F32, seed=9, specials=False)
    for fmt in MX_FORMATS:
        codes, scales = mx_quantize(x, fmt)
        y = mx_dequantize(codes, scales, fmt, output_dtype=out)
        assert_bitexact(y, mx_dequantize(codes, scales, fmt).astype(out))


class RecordingOps:
    """An ``ops`` object: the golden functions, recording each call's scale and keywords."""

    def __init__(self):
        self.calls = []

    def quantize_linear(self, x, y_scale, *args, **kwargs):
        self.calls.append(("Q", y_scale.dtype, kwargs))
        return quant.quantize_linear(x, y_scale, *args, **kwargs)

    def dequantize_linear(self, x, x_scale, *args, **kwargs):
        self.calls.append(("DQ", x_scale.dtype, kwargs))
        return quant.dequantize_linear(x, x_scale, *args, **kwargs)


def test_ops_receive_one_blocked_call_with_e8m0_scales():
    ops = RecordingOps()
    x = make_x((3, 40), F32, seed=1, specials=False)
    codes, scales = mx_quantize(x, "mxfp8_e4m3", axis=1, ops=ops)
    mx_dequantize(codes, scales, "mxfp8_e4m3", axis=1, ops=ops)
    assert ops.calls == [
        ("Q", E8M0, {"axis": 1, "block_size": 32, "output_dtype": MX_FORMATS["mxfp8_e4m3"].dtype,
                     "saturate": True}),
        ("DQ", E8M0, {"axis": 1, "block_size": 32, "output_dtype": F32}),
    ]  # fmt: skip


def test_formats():
    assert list(MX_FORMATS) == ["mxfp4", "mxfp8_e4m3", "mxfp8_e5m2", "mxint8"]
    assert [f.bits for f in MX_FORMATS.values()] == [4, 8, 8, 8]
    for f in MX_FORMATS.values():  # emax: the exponent of the largest normal element
        top = float(ml_dtypes.finfo(f.dtype).max) if f.name != "mxint8" else 127 / 64
        assert math.floor(math.log2(top)) == f.emax


_X = np.ones((2, 32), np.float32)
_C, _S = mx_quantize(_X, "mxfp4")


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda: mx_quantize(_X, "mxfp6"), ValueError, "fmt must be one of mxfp4, .*'mxfp6'"),
        (lambda: mx_quantize(_X, np.int8), TypeError, "fmt must be a format name"),
        (lambda: mx_quantize(_X.astype(np.float64), "mxfp4"), TypeError,
         "x must be one of float32, float16, bfloat16; got 'float64'"),
        (lambda: mx_quantize(np.int32([1, 2]), "mxint8"), TypeError, "x must be one of"),
        (lambda: mx_quantize(np.float32(1.0), "mxfp4"), ValueError, "x must have at least one"),
        (lambda: mx_quantize(_X, "mxfp4", axis=2), ValueError, "axis must be in"),
        (lambda: mx_quantize(_X, "mxfp4", block_size=0), ValueError, "block_size must be in"),
        (lambda: mx_quantize(_X, "mxfp4", ops=object()), TypeError,
         "ops must have quantize_linear and dequantize_linear"),
        (lambda: mx_dequantize(_C.view(np.uint8), _S, "mxfp4"), TypeError,
         "codes must be float4e2m1 for mxfp4, not uint8"),
        (lambda: mx_dequantize(_C, _S.view(np.uint8), "mxfp4"), TypeError,
         "scales must be float8e8m0, not uint8"),
        (lambda: mx_dequantize(_C, _S[:1], "mxfp4"), ValueError,
         r"scales must have shape \(2, 1\)"),
        (lambda: mx_dequantize(_C, _S, "mxfp4", block_size=16), ValueError,
         r"scales must have shape \(2, 2\)"),
        (lambda: mx_dequantize(_C, _S, "mxfp4", output_dtype=np.int8), TypeError,
         "output_dtype must be one of"),
        (lambda: mx_dequantize(np.zeros((2, 32), np.int8), np.full((2, 1), 5, np.uint8).view(E8M0),
                               "mxint8"),
         ValueError, r"scales of mxint8 must be at least 2\*\*-121 \(code 6\).*got code 5"),
    ],
    ids=["fmt-name", "fmt-type", "x-float64", "x-int32", "x-scalar", "axis", "block-size", "ops",
         "codes", "scales-type", "scales-shape", "scales-block", "output-dtype", "mxint8-low"],
)  # fmt: skip
def test_errors_name_the_parameter(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_exported_from_the_package():
    import qaccel

    assert qaccel.mx_quantize is mx_quantize and qaccel.mx_dequantize is mx_dequantize
    assert qaccel.MX_FORMATS is mx.MX_FORMATS
