# amaranth: UnusedElaboratable=no
"""FloatMul through Verilator (qaccel.sim.vectors), each unit chained into FloatRound in a
test-only wrapper, against NumPy products (float32, float64, float16 and the double roundings
DequantizeLinear performs) and, field by field, against exact Fraction arithmetic; latency in
Amaranth's simulator; parameter errors.

NaN results are compared by NaN-ness and sign (FloatRound gives canonical NaNs, NumPy keeps
payloads). The sign follows x86 SSE: a NaN operand's sign, the first operand's if both are NaN,
and the negative default NaN for ``0 * inf``. NumPy itself is not consistent when both operands
are NaN (test_numpy_nan_rules), so there the rule, not NumPy, is the reference.
"""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from qaccel.model.floatfmt import FORMATS, FloatFormat
from qaccel.rtl.arith.float_mul import FloatMul
from qaccel.rtl.arith.float_round import FloatRound
from qaccel.rtl.arith.wide_float import wide_float_layout
from qaccel.sim.runner import missing_simulator
from qaccel.sim.vectors import ComponentBank, VectorSim, join_fields, split_fields

from ..wide_np import NORM, ZERO, describe, wide_from_float64

requires_verilator = pytest.mark.skipif(missing_simulator("verilator") is not None,
                                        reason=missing_simulator("verilator") or "")

F = FORMATS


# ---------------------------------------------------------------------------------------------
# Test-only wrapper and helpers (test_float_add.py uses them too)


class Chain(wiring.Component):
    """Test-only: ``unit`` (a FloatMul or FloatAdd) with its output on ``raw``, rounded by a
    combinational FloatRound to one of ``formats1`` (``code1``), whose ``value`` a second one
    rounds to one of ``formats2`` (``code2``): the double roundings of DequantizeLinear's
    float16 / bfloat16 outputs and of QuantizeLinear's float4 path. Every input of ``unit``
    is an input of the same name; ``fmt1`` and ``fmt2`` select the formats (delayed with the
    operands), ``saturate`` is 0. Latency: the unit's."""

    def __init__(self, unit, formats1, formats2):
        self.unit = unit
        members = unit.signature.members
        (self._out,) = [name for name, m in members.items() if m.flow == wiring.Out]
        self._ins = [name for name, m in members.items() if m.flow == wiring.In]
        widths = {"sig_width": unit.out_width, "exp_width": unit.exp_width + 1}
        self.r1 = FloatRound(formats1, **widths, latency=0)
        self.r2 = FloatRound(formats2, **widths, latency=0)
        sig = {name: In(members[name].shape) for name in self._ins}
        for k, r in ((1, self.r1), (2, self.r2)):
            sig[f"fmt{k}"] = In(r.fmt.shape())
            sig[f"code{k}"] = Out(r.code.shape())
        sig["raw"] = Out(members[self._out].shape)
        super().__init__(sig)

    @property
    def latency(self) -> int:
        return self.unit.latency

    def elaborate(self, platform):
        m = Module()
        m.submodules.unit = self.unit
        m.submodules.r1 = self.r1
        m.submodules.r2 = self.r2
        out = getattr(self.unit, self._out)
        m.d.comb += [getattr(self.unit, name).eq(getattr(self, name)) for name in self._ins]
        fmt1, fmt2 = self.fmt1, self.fmt2
        for k in range(self.latency):                 # the formats travel with the operands
            d1, d2 = Signal.like(fmt1, name=f"fmt1_d{k}"), Signal.like(fmt2, name=f"fmt2_d{k}")
            m.d.sync += [d1.eq(fmt1), d2.eq(fmt2)]
            fmt1, fmt2 = d1, d2
        m.d.comb += [
            self.raw.eq(out),
            self.r1.i.eq(out), self.r1.fmt.eq(fmt1),
            self.r2.i.eq(self.r1.value), self.r2.fmt.eq(fmt2),
            self.code1.eq(self.r1.code), self.code2.eq(self.r2.code),
        ]
        return m


def wide(x, width: int) -> dict:
    """The exact wide floats of float64-representable values ``x`` (any float dtype), with the
    fields a unit's output has: ``exp`` 0 for the classes without a magnitude."""
    with np.errstate(invalid="ignore"):                      # signalling NaNs
        w = wide_from_float64(np.asarray(x).astype(np.float64), width)
    return w | {"exp": np.where(w["cls"] == NORM, w["exp"], 0)}


def run_chain(bank, key: str, inputs: dict, fmt1=0, fmt2=0) -> tuple[dict, np.ndarray,
                                                                      np.ndarray]:
    """Stream ``inputs`` (wide-float dicts, or integers for 1-bit ports) through unit ``key``;
    return its raw output fields and the codes of both roundings (uint64)."""
    sim, units = bank
    chain = units[key]
    members = chain.signature.members
    ports = {}
    for name, value in inputs.items():
        ports[f"{name}_{key}"] = (join_fields(value, members[name].shape)
                                  if isinstance(value, dict) else value)
    ports |= {f"fmt1_{key}": fmt1, f"fmt2_{key}": fmt2}
    out = sim.run(ports, latency=chain.latency,
                  outputs=[f"raw_{key}", f"code1_{key}", f"code2_{key}"])
    raw = split_fields(out[f"raw_{key}"], members["raw"].shape)
    return (raw, out[f"code1_{key}"].astype(np.uint64), out[f"code2_{key}"].astype(np.uint64))


def codes_of(y: np.ndarray) -> np.ndarray:
    """The bit patterns of a float array as uint64."""
    return y.view(f"u{y.dtype.itemsize}").astype(np.uint64)


def assert_codes(label: str, fmt: FloatFormat, got, want, nan_sign, where=None, info=None):
    """``got`` equals ``want`` (codes of ``fmt``), except that NaNs match by NaN-ness and
    sign, the sign being ``nan_sign`` (the x86 rule) rather than NumPy's. ``where`` restricts
    the check; ``info(k)`` describes vector ``k``. Returns the number of vectors checked."""
    got, want = np.asarray(got, np.uint64), np.asarray(want, np.uint64)
    nan_sign = np.broadcast_to(np.asarray(nan_sign, np.uint64), got.shape)
    idx = np.arange(got.size) if where is None else np.flatnonzero(where)
    got, want, nan_sign = got[idx], want[idx], nan_sign[idx]
    sign = lambda c: (c >> np.uint64(fmt.bits - 1)) & np.uint64(1)  # noqa: E731
    nan_got, nan_want = fmt.is_nan(got), fmt.is_nan(want)
    ok = np.where(nan_want, nan_got & (sign(got) == nan_sign), got == want)
    bad = np.flatnonzero(~ok)
    assert not bad.size, (
        f"{label} -> {fmt.name}: {bad.size} of {idx.size} wrong codes, first: "
        + "; ".join(f"[{info(idx[k]) if info else idx[k]}] {int(got[k]):#x}, want "
                    f"{int(want[k]):#x}{f' (NaN, sign {int(nan_sign[k])})' if nan_want[k] else ''}"
                    for k in bad[:4]))
    return idx.size


def truncated(value: Fraction, width: int) -> tuple[int, int, int, int]:
    """(sign, exp, sig, sticky) of a non-zero ``value`` truncated to ``width`` leading bits."""
    sign, mag = int(value < 0), abs(value)
    num, den = mag.numerator, mag.denominator
    exp = num.bit_length() - den.bit_length()
    if (num << max(0, -exp)) < (den << max(0, exp)):
        exp -= 1
    shift = width - 1 - exp                                  # sig = floor(mag * 2**shift)
    n, d = (num << shift, den) if shift >= 0 else (num, den << -shift)
    sig, rem = divmod(n, d)
    return sign, exp, sig, int(rem != 0)


def assert_raw_exact(label: str, raw: dict, width: int, exact: dict[int, Fraction],
                     zero_sign: dict[int, int], info=None) -> int:
    """Raw output fields equal the exact value truncated to ``width`` bits with sticky, for
    every vector index in ``exact`` (zeros: class ZERO with sign ``zero_sign[k]``)."""
    bad = []
    for k, value in exact.items():
        got = tuple(int(raw[f][k]) for f in ("cls", "sign", "exp", "sig", "sticky"))
        if value == 0:
            want = (ZERO, zero_sign[k], 0, 0, 0)
        else:
            want = (NORM, *truncated(value, width))
        if got != want:
            bad.append(f"[{info(k) if info else k}] cls, sign, exp, sig, sticky = {got}, "
                       f"want {want}")
    assert not bad, f"{label}: {len(bad)} of {len(exact)} wrong raw outputs, first: " + \
        "; ".join(bad[:3])
    return len(exact)


def assert_specials_clean(label: str, raw: dict) -> None:
    """Outputs without a magnitude have exp, sig and sticky 0."""
    empty = raw["cls"] != NORM
    for f in ("exp", "sig", "sticky"):
        assert not np.any(raw[f][empty] != 0), f"{label}: {f} non-zero on a ZERO/INF/NAN output"


def nan_signs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The x86 rule for a NaN result's sign: ``a``'s if it is a NaN, else ``b``'s if it is a
    NaN (never flipped by a subtraction), else 1 (the default NaN of 0 * inf, inf - inf)."""
    sa, sb = np.signbit(a), np.signbit(b)
    return np.where(np.isnan(a), sa, np.where(np.isnan(b), sb, True)).astype(np.uint64)


def f32_values(sign, exp, mant) -> np.ndarray:
    """float32 values with the given signs, unbiased exponents (below -126: subnormal, the
    mantissa then shifted right accordingly) and 23-bit mantissas."""
    exp = np.asarray(exp, np.int64)
    field = np.clip(exp + 127, 0, 254)
    m = np.asarray(mant, np.uint64) & np.uint64((1 << 23) - 1)
    shift = np.clip(-126 - exp, 0, 24).astype(np.uint64)
    m = np.where(field == 0, ((m | np.uint64(1 << 23)) >> shift), m)
    bits = (np.asarray(sign, np.uint64) << np.uint64(31)) | (field.astype(np.uint64)
                                                             << np.uint64(23)) | m
    return bits.astype(np.uint32).view(np.float32)


def random_f32(rng, n: int, exp_lo: int, exp_hi: int) -> np.ndarray:
    """``n`` float32 values of random sign and mantissa, exponents uniform in the range."""
    return f32_values(rng.integers(0, 2, n), rng.integers(exp_lo, exp_hi, n, endpoint=True),
                      rng.integers(0, 1 << 23, n))


def special_f32() -> np.ndarray:
    """Zeros, subnormal and normal extremes, powers of two, infinities, quiet and signalling
    NaNs, both signs."""
    bits = [0, 1, 2, 0x3, 0x00400000, 0x007FFFFF, 0x00800000, 0x00800001, 0x00FFFFFF,
            0x3F800000, 0x3F800001, 0x3FFFFFFF, 0x3F000000, 0x40000000, 0x34000000, 0x2A800000,
            0x1A000000, 0x5F000000, 0x7E800000, 0x7F000000, 0x7F7FFFFF, 0x7F7FFFFE,
            0x7F800000, 0x7FC00000, 0x7FC00123, 0x7F800001, 0x7FFFFFFF]
    b = np.array(bits, np.uint32)
    return np.concatenate([b, b | np.uint32(1 << 31)]).view(np.float32)


def all_pairs(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.repeat(x, y.size), np.tile(y, x.size)


# ---------------------------------------------------------------------------------------------
# The shared build


#: key -> (FloatMul parameters, formats of the first rounding, formats of the second one).
UNITS = {
    # float32 x float32, exact 48-bit product, rounded to float32, then float16 / bfloat16.
    "f32": (dict(a_width=24, b_width=24, exp_width=9, latency=4),
            ("float32",), ("float16", "bfloat16")),
    # The same, truncated to 25 bits with sticky (float32 has out_width - 1 bits).
    "trunc": (dict(a_width=24, b_width=24, exp_width=9, out_width=25, latency=1),
              ("float32",), ("float16", "bfloat16")),
    # int32 x float32, exact 56-bit product, rounded to float64, then float32.
    "i32": (dict(a_width=32, b_width=24, exp_width=11, latency=3), ("float64",), ("float32",)),
    # float16 x float16, combinational.
    "f16": (dict(a_width=11, b_width=11, exp_width=6, latency=0), ("float16",), ("float16",)),
}


@pytest.fixture(scope="module")
def bank() -> tuple[VectorSim, dict[str, Chain]]:
    units = {key: Chain(FloatMul(**params), f1, f2) for key, (params, f1, f2) in UNITS.items()}
    return VectorSim(ComponentBank(units), name="float_mul_bank"), units


def mul_inputs(a: np.ndarray, b: np.ndarray, width_a: int, width_b: int) -> dict:
    return {"a": wide(a, width_a), "b": wide(b, width_b)}


def float32_pairs(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """>= 1M float32 pairs: random bit patterns; products near the underflow (subnormal and
    zero results) and overflow thresholds; ties after rounding in the normal and the subnormal
    range; every pair of special values."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 1 << 32, (2, 550_000), dtype=np.uint64).astype(np.uint32)
    parts = [(bits[0].view(np.float32), bits[1].view(np.float32))]
    for lo, hi in ((-180, -120), (115, 135)):                 # product exponent targets
        n = 150_000
        ea = rng.integers(-149, 127, n, endpoint=True)
        eb = np.clip(rng.integers(lo, hi, n, endpoint=True) - ea, -149, 127)
        parts.append((f32_values(rng.integers(0, 2, n), ea, rng.integers(0, 1 << 23, n)),
                      f32_values(rng.integers(0, 2, n), eb, rng.integers(0, 1 << 23, n))))
    # Ties: odd m1 * m2 of exactly 25 bits (normal range), or any odd product at 2**-150
    # (half the smallest subnormal) and nearby (subnormal range).
    n = 400_000
    m1 = rng.integers(1 << 12, 1 << 13, n) | 1
    m2 = rng.integers(1 << 12, 1 << 13, n) | 1
    keep = np.frexp((m1 * m2).astype(np.float64))[1] == 25
    m1, m2 = m1[keep][:120_000], m2[keep][:120_000]
    k1 = rng.integers(-100, 60, m1.size)
    k2 = rng.integers(-100, 60, m1.size)
    parts.append((np.ldexp(m1, k1).astype(np.float32), np.ldexp(m2, k2).astype(np.float32)))
    s1 = rng.integers(1, 1 << 11, 60_000) | 1
    s2 = rng.integers(1, 1 << 11, 60_000) | 1
    k1 = rng.integers(-130, -20, s1.size)
    k2 = rng.integers(-152, -147, s1.size, endpoint=True) - k1
    parts.append((np.ldexp(s1, k1).astype(np.float32), np.ldexp(s2, k2).astype(np.float32)))
    parts.append(all_pairs(special_f32(), special_f32()))
    a = np.concatenate([p[0] for p in parts])
    b = np.concatenate([p[1] for p in parts])
    signs = rng.integers(0, 2, (2, a.size)).astype(bool)
    signs[:, -special_f32().size ** 2:] = False                 # keep the specials' signs
    a = np.where(signs[0], -a, a)
    b = np.where(signs[1], -b, b)
    swap = rng.integers(0, 2, a.size).astype(bool)
    return np.where(swap, b, a), np.where(swap, a, b)


def exact_sample(a: np.ndarray, b: np.ndarray, n: int, seed: int, op) -> dict[int, Fraction]:
    """``op(Fraction(a), Fraction(b))`` for ``n`` random vectors with finite operands."""
    finite = np.flatnonzero(np.isfinite(a) & np.isfinite(b))
    pick = np.random.default_rng(seed).choice(finite, min(n, finite.size), replace=False)
    return {int(k): op(Fraction(float(a[k])), Fraction(float(b[k]))) for k in pick}


# ---------------------------------------------------------------------------------------------
# Verilator tests


def check_float32_products(bank, key: str, a: np.ndarray, b: np.ndarray) -> int:
    """Products of float32 pairs on unit ``key``: code1 vs NumPy's float32 product, code2 vs
    its cast to float16 (even vectors) or bfloat16 (odd ones), raw fields vs Fraction on a
    sample. Returns the number of vectors."""
    unit = bank[1][key].unit
    fmt2 = np.arange(a.size) % 2
    raw, code1, code2 = run_chain(bank, key, mul_inputs(a, b, 24, 24), fmt2=fmt2)
    with np.errstate(all="ignore"):
        p = a * b
        p16, pbf = p.astype(np.float16), p.astype(ml_dtypes.bfloat16)
    rule = nan_signs(a, b)
    # The rule is NumPy's wherever at most one operand is a NaN.
    one = ~(np.isnan(a) & np.isnan(b)) & np.isnan(p)
    np.testing.assert_array_equal(np.signbit(p[one]), rule[one].astype(bool))
    info = lambda k: f"{a[k]!r} * {b[k]!r}"  # noqa: E731
    assert_codes(key, F["float32"], code1, codes_of(p), rule, info=info)
    assert_codes(key, F["float16"], code2, codes_of(p16), rule, where=fmt2 == 0, info=info)
    assert_codes(key, F["bfloat16"], code2, codes_of(pbf), rule, where=fmt2 == 1, info=info)
    exact = exact_sample(a, b, 20_000, 1, lambda x, y: x * y)
    zero_sign = {k: int(np.signbit(a[k]) ^ np.signbit(b[k])) for k in exact}
    assert_raw_exact(key, raw, unit.out_width, exact, zero_sign, info=info)
    assert_specials_clean(key, raw)
    if unit.exact:
        assert not np.any(raw["sticky"])
    else:
        assert np.any(raw["sticky"])
    return a.size


@pytest.mark.sim
@requires_verilator
def test_float_mul_float32_random(bank):
    """>= 1M float32 products (exact 48-bit unit) rounded to float32 vs NumPy, and then to
    float16 / bfloat16 (DequantizeLinear's double rounding); raw output vs Fraction."""
    a, b = float32_pairs(seed=1)
    assert check_float32_products(bank, "f32", a, b) >= 1_000_000


@pytest.mark.sim
@requires_verilator
def test_float_mul_float32_truncated(bank):
    """The 25-bit truncated product (sticky for the dropped bits) still rounds correctly to
    float32 (24 bits): the same >= 1M pairs; raw output vs Fraction."""
    a, b = float32_pairs(seed=2)
    assert check_float32_products(bank, "trunc", a, b) >= 1_000_000


def int32_values(rng, n: int) -> np.ndarray:
    """Random int32 values of random bit length (1..31, half of them 26..31; both signs), with
    trailing zeros in some, plus the extremes."""
    length = np.where(rng.random(n) < 0.5, rng.integers(1, 31, n, endpoint=True),
                      rng.integers(26, 31, n, endpoint=True))
    mag = rng.integers(0, 1 << 31, n, dtype=np.int64) & ((1 << length) - 1) | (1 << (length - 1))
    mag = np.where(rng.random(n) < 0.2, mag & ~((1 << rng.integers(0, 20, n)) - 1), mag)
    x = np.where(rng.integers(0, 2, n).astype(bool), -mag, mag)
    extremes = np.array([0, 1, -1, 2, -(1 << 31), (1 << 31) - 1, -(1 << 31) + 1, 1 << 30,
                         (1 << 29) - 1, (1 << 30) - 1, -((1 << 29) + 1)], np.int64)
    return np.concatenate([extremes, x]).astype(np.int32)


def significant_bits(x: np.ndarray) -> np.ndarray:
    """Bits from the leading to the trailing one of |x| (0 for 0)."""
    mag = np.abs(x.astype(np.int64))
    low = mag & -mag
    top = np.frexp(mag.astype(np.float64))[1]
    return np.where(mag == 0, 0, top - np.frexp(low.astype(np.float64))[1] + 1)


@pytest.mark.sim
@requires_verilator
def test_float_mul_int32_float64(bank):
    """int32 x float32 (DequantizeLinear's float64 path): the exact 56-bit product rounded to
    float64 vs NumPy's float64 product, then to float32; raw output vs the float64 product
    where that is exact (<= 29 significant bits in the int), else vs Fraction."""
    rng = np.random.default_rng(3)
    x = int32_values(rng, 250_000)
    bits = rng.integers(0, 1 << 32, x.size, dtype=np.uint64).astype(np.uint32)
    s = np.where(rng.random(x.size) < 0.8, random_f32(rng, x.size, -140, 120),
                 bits.view(np.float32))
    xs, ss = all_pairs(x[:40], special_f32())
    x, s = np.concatenate([x, xs]), np.concatenate([s, ss])
    raw, code1, code2 = run_chain(bank, "i32", mul_inputs(x, s, 32, 24))
    with np.errstate(all="ignore"):
        p = x.astype(np.float64) * s.astype(np.float64)
        p32 = p.astype(np.float32)
    rule = nan_signs(x.astype(np.float64), s)
    info = lambda k: f"{int(x[k])} * {s[k]!r}"  # noqa: E731
    assert_codes("i32", F["float64"], code1, codes_of(p), rule, info=info)
    assert_codes("i32", F["float32"], code2, codes_of(p32), rule, info=info)
    # Raw: exact in float64 when the int has at most 29 significant bits (+ 24 <= 53).
    short = significant_bits(x) <= 29
    want = wide(p, 56)
    for field in ("cls", "sign", "exp", "sig", "sticky"):
        bad = np.flatnonzero(short & (raw[field].astype(np.int64) !=
                                      want[field].astype(np.int64)))
        assert not bad.size, (f"i32: {bad.size} wrong raw.{field}, first: " + "; ".join(
            f"[{info(k)}] {describe(raw, k)}, want {describe(want, k)}" for k in bad[:3]))
    long_ = np.flatnonzero(~short & np.isfinite(s))
    assert long_.size > 10_000
    exact = {int(k): Fraction(int(x[k])) * Fraction(float(s[k])) for k in long_[:20_000]}
    zero_sign = {k: int(np.signbit(s[k])) ^ int(x[k] < 0) for k in exact}
    assert_raw_exact("i32", raw, 56, exact, zero_sign, info=info)
    assert_specials_clean("i32", raw)
    assert not np.any(raw["sticky"])


@pytest.mark.sim
@requires_verilator
def test_float_mul_float16_every_value(bank):
    """Every float16 code times 48 float16 scales (specials included) rounded to float16 vs
    NumPy's float16 product; raw output vs the (exact) float64 product."""
    x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    rng = np.random.default_rng(4)
    fixed = np.array([1, -1, 0.5, 2, 3, -0.1, 1 / 3, 7, 1000, -0.001, 65504, 2.0 ** -14,
                      2.0 ** -24, -(2.0 ** -20), 0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan,
                      1.5, 0.999, 255, 1 / 255], np.float16)
    rand = rng.integers(0, 0x7C00, 24).astype(np.uint16).view(np.float16)
    scales = np.concatenate([fixed, np.where(rng.random(24) < 0.5, -rand, rand)])
    assert scales.size >= 32
    a, b = all_pairs(x, scales)
    raw, code1, _ = run_chain(bank, "f16", mul_inputs(a, b, 11, 11))
    with np.errstate(all="ignore"):
        p = a * b
    rule = nan_signs(a, b)
    assert_codes("f16", F["float16"], code1, codes_of(p), rule,
                 info=lambda k: f"{a[k]!r} * {b[k]!r}")
    with np.errstate(invalid="ignore"):
        want = wide(a.astype(np.float64) * b.astype(np.float64), 22)
    finite = np.isfinite(a) & np.isfinite(b)
    for field in ("cls", "sign", "exp", "sig", "sticky"):
        bad = np.flatnonzero(finite & (raw[field].astype(np.int64) !=
                                       want[field].astype(np.int64)))
        assert not bad.size, f"f16: {bad.size} wrong raw.{field}"
    assert_specials_clean("f16", raw)
    assert a.size >= 32 << 16


# ---------------------------------------------------------------------------------------------
# NumPy's behaviour on this machine (no simulator)


def test_numpy_nan_rules():
    """Pin the x86 / NumPy special-value behaviour the units follow: the default NaN is
    negative; one NaN operand gives that NaN; two give the first one in scalar code (and in
    NumPy's float32 SIMD loop body) -- but NumPy's AVX-512 tail of a float32 multiply gives the
    second, and its float16 multiply the second everywhere, hence the rule as reference."""
    f32 = np.float32
    pn = np.array([0x7FC00001], np.uint32).view(f32)
    nn = np.array([0xFFC00002], np.uint32).view(f32)
    one = np.ones(1, f32)
    with np.errstate(invalid="ignore"):
        assert codes_of(np.zeros(1, f32) * np.full(1, np.inf, f32))[0] == 0xFFC00000
        assert codes_of(np.zeros(1) * np.full(1, np.inf))[0] == 0xFFF8000000000000
        assert codes_of(pn * nn)[0] == 0x7FC00001 and codes_of(nn * pn)[0] == 0xFFC00002
        assert codes_of(one * nn)[0] == 0xFFC00002 and codes_of(pn * -one)[0] == 0x7FC00001
        tail = np.full(17, pn[0]) * np.full(17, nn[0])
        assert codes_of(tail)[0] == 0x7FC00001          # which one wins depends on the lane
        h = np.array([0x7E01], np.uint16).view(np.float16)
        hn = np.array([0xFE02], np.uint16).view(np.float16)
        assert np.signbit(h * hn)[0] and not np.signbit(hn * h)[0]    # the second operand's


# ---------------------------------------------------------------------------------------------
# Amaranth simulator: latency


def simulate(dut: FloatMul, a: dict, b: dict) -> list[int]:
    """Apply one pair per cycle; return ``p``'s bits sampled before each clock edge."""
    seen: list[int] = []
    bits_a = join_fields(a, wide_float_layout(dut.a_width, dut.exp_width))
    bits_b = join_fields(b, wide_float_layout(dut.b_width, dut.exp_width))

    async def testbench(ctx):
        for k in range(len(bits_a) + dut.latency):
            j = min(k, len(bits_a) - 1)
            ctx.set(dut.a.as_value(), int(bits_a[j]))
            ctx.set(dut.b.as_value(), int(bits_b[j]))
            seen.append(ctx.get(dut.p.as_value()))
            if dut.latency:
                await ctx.tick()

    sim = Simulator(dut)
    if dut.latency:
        sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    return seen


@pytest.mark.parametrize("latency", [0, 1, 2, 3, 4])
def test_float_mul_latency(latency):
    dut = FloatMul(a_width=4, b_width=3, exp_width=5, out_width=5, latency=latency)
    assert dut.latency == latency
    x = np.array([1.0, 15.0, 15.0, 0.0, 2.0 ** -9, -3.0, np.inf, 0.875])
    y = np.array([1.5, -1.75, -7.0, -2.0, 0.5, 0.0, 0.0, 0.75])
    with np.errstate(invalid="ignore"):
        p = x * y
    want = wide(p, 7)                        # exact in 7 bits (15 * 7 = 105), truncated to 5
    want["sticky"] = ((want["sig"] & np.uint64(3)) != 0).astype(np.uint64)
    want["sig"] >>= np.uint64(2)
    assert want["sticky"].tolist() == [0, 1, 1, 0, 0, 0, 0, 0]
    seen = simulate(dut, wide(x, 4), wide(y, 3))
    expect = join_fields(want, dut.p.shape()).tolist()
    assert seen[latency:] == expect, f"latency {latency}: {seen} != {expect} (delayed)"
    with pytest.raises(AttributeError):
        dut.latency = 2


def test_float_mul_members():
    dut = FloatMul(a_width=24, b_width=11, exp_width=9)
    members = dut.signature.members
    assert members["a"].shape == wide_float_layout(24, 9)
    assert members["b"].shape == wide_float_layout(11, 9)
    assert members["p"].shape == wide_float_layout(35, 10)
    assert (dut.out_width, dut.exact, dut.latency) == (35, True, 1)
    dut = FloatMul(a_width=24, b_width=24, exp_width=9, out_width=26, latency=2)
    assert (dut.a_width, dut.b_width, dut.exp_width, dut.out_width, dut.exact) == \
        (24, 24, 9, 26, False)
    assert dut.signature.members["p"].shape == wide_float_layout(26, 10)


# ---------------------------------------------------------------------------------------------
# Parameter errors


def test_float_mul_a_width():
    with pytest.raises(ValueError, match=r"a_width must be in \[1, 256\], not 0"):
        FloatMul(a_width=0, b_width=24, exp_width=9)
    with pytest.raises(TypeError, match=r"a_width must be an integer, not 24.0"):
        FloatMul(a_width=24.0, b_width=24, exp_width=9)


def test_float_mul_b_width():
    with pytest.raises(ValueError, match=r"b_width must be in \[1, 256\], not 257"):
        FloatMul(a_width=24, b_width=257, exp_width=9)
    with pytest.raises(TypeError, match=r"b_width must be an integer, not None"):
        FloatMul(a_width=24, b_width=None, exp_width=9)


def test_float_mul_exp_width():
    with pytest.raises(ValueError, match=r"exp_width must be in \[2, 31\], not 32"):
        FloatMul(a_width=24, b_width=24, exp_width=32)
    with pytest.raises(ValueError, match=r"exp_width must be in \[2, 31\], not 1"):
        FloatMul(a_width=24, b_width=24, exp_width=1)
    with pytest.raises(TypeError, match=r"exp_width must be an integer, not '9'"):
        FloatMul(a_width=24, b_width=24, exp_width="9")


def test_float_mul_out_width():
    with pytest.raises(ValueError, match=r"out_width must be in \[1, 48\], not 49"):
        FloatMul(a_width=24, b_width=24, exp_width=9, out_width=49)
    with pytest.raises(ValueError, match=r"out_width must be in \[1, 48\], not 0"):
        FloatMul(a_width=24, b_width=24, exp_width=9, out_width=0)
    with pytest.raises(ValueError, match=r"out_width must be given when a_width \+ b_width "
                                         r"= 300 exceeds 256"):
        FloatMul(a_width=200, b_width=100, exp_width=9)
    with pytest.raises(ValueError, match=r"out_width must be in \[1, 256\], not 257"):
        FloatMul(a_width=200, b_width=100, exp_width=9, out_width=257)
    with pytest.raises(TypeError, match=r"out_width must be an integer, not True"):
        FloatMul(a_width=24, b_width=24, exp_width=9, out_width=True)


def test_float_mul_latency_value():
    with pytest.raises(ValueError, match=r"latency must be in \[0, 4\], not 5"):
        FloatMul(a_width=24, b_width=24, exp_width=9, latency=5)
    with pytest.raises(TypeError, match=r"latency must be an integer, not 1.0"):
        FloatMul(a_width=24, b_width=24, exp_width=9, latency=1.0)


def test_float_mul_inputs_helper():
    """The generators above produce what they claim (ties, underflow, specials)."""
    a, b = float32_pairs(seed=1)
    assert a.size >= 1_000_000
    with np.errstate(all="ignore"):
        p64 = a.astype(np.float64) * b.astype(np.float64)
        p = a * b
    finite = np.isfinite(p64) & (p64 != 0)
    # ties: exact float64 products exactly halfway between float32 neighbours
    r = p.astype(np.float64)
    with np.errstate(all="ignore"):
        nxt = np.nextafter(p, np.where(p64 > r, np.float32(np.inf), np.float32(-np.inf)))
        half = np.abs(nxt.astype(np.float64) - r) / 2
        tie = finite & np.isfinite(nxt) & (np.abs(p64 - r) == half)
    assert tie.sum() > 100_000
    assert np.sum(finite & (np.abs(p64) < 2.0 ** -126) & (p != 0)) > 50_000   # subnormal
    assert np.sum(finite & (p == 0)) > 10_000                                  # underflow
    assert np.sum(np.isinf(p) & np.isfinite(a) & np.isfinite(b)) > 10_000     # overflow
    assert np.sum(np.isnan(p)) > 1000 and np.sum((p == 0) & np.signbit(p)) > 1000
