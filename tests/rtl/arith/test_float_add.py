# amaranth: UnusedElaboratable=no
"""FloatAdd through Verilator (qaccel.sim.vectors), each unit chained into FloatRound in the
test-only wrapper of test_float_mul.py, against NumPy float32 sums and differences (and their
float16 / bfloat16 / float4 casts: QuantizeLinear's float4 path adds the zero point in float32,
then casts) and, field by field, against exact Fraction / integer arithmetic, which proves the
truncation-with-sticky rule; latency in Amaranth's simulator; parameter errors.

NaN results are compared by NaN-ness and sign, the sign by the x86 rule (the first NaN operand's
sign, never flipped by a subtraction; the negative default NaN for inf - inf), which NumPy
follows except for some lanes of its float32 add when both operands are NaN.
"""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from amaranth.sim import Simulator

from qaccel.model.floatfmt import FORMATS
from qaccel.rtl.arith.float_add import FloatAdd, min_exp_width
from qaccel.rtl.arith.wide_float import wide_float_layout
from qaccel.sim.runner import missing_simulator
from qaccel.sim.vectors import ComponentBank, VectorSim, join_fields

from ..wide_np import INF, NAN, NORM, ZERO, round_to_odd_32
from .test_float_mul import (
    Chain,
    all_pairs,
    assert_codes,
    assert_raw_exact,
    assert_specials_clean,
    codes_of,
    f32_values,
    nan_signs,
    random_f32,
    run_chain,
    special_f32,
    truncated,
    wide,
)

requires_verilator = pytest.mark.skipif(missing_simulator("verilator") is not None,
                                        reason=missing_simulator("verilator") or "")

F = FORMATS
FP4 = ml_dtypes.float4_e2m1fn

#: key -> (FloatAdd parameters, formats of the first rounding, formats of the second one).
UNITS = {
    # float32 + float32, 26-bit sum (float32 has out_width - 2 bits), rounded to float32 (or
    # float16 / bfloat16), then to float16, bfloat16 or float4e2m1.
    "f32": (dict(a_width=24, b_width=24, exp_width=9, out_width=26, latency=7),
            ("float32", "float16", "bfloat16"), ("float16", "bfloat16", "float4e2m1")),
    # The same with a 25-bit sum: float32 has out_width - 1 bits, still correct.
    "f25": (dict(a_width=24, b_width=24, exp_width=9, out_width=25, latency=4),
            ("float32",), ("float16",)),
    # QuantizeLinear's float4 path: a float32 quotient plus a float4e2m1 zero point.
    "fp4": (dict(a_width=24, b_width=2, exp_width=9, out_width=26, latency=3),
            ("float32",), ("float4e2m1",)),
    # Tiny, every input: out_width below the operands' width, exp_width at its minimum (the
    # smallest result exponent, -4 - 4, is the bottom of the output's signed(4)).
    "tiny": (dict(a_width=3, b_width=5, exp_width=3, out_width=3, latency=0),
             ("float4e2m1",), ("float4e2m1",)),
}


@pytest.fixture(scope="module")
def bank() -> tuple[VectorSim, dict[str, Chain]]:
    units = {key: Chain(FloatAdd(**params), f1, f2) for key, (params, f1, f2) in UNITS.items()}
    return VectorSim(ComponentBank(units), name="float_add_bank"), units


def add_inputs(a, b, sub, width_a: int, width_b: int) -> dict:
    sub = np.asarray(sub, np.uint8)
    return {"a": wide(a, width_a), "b": wide(b, width_b), "sub": sub if sub.ndim else int(sub)}


def reference(a: np.ndarray, b: np.ndarray, sub: np.ndarray) -> np.ndarray:
    """NumPy's ``a + b`` or ``a - b`` (in the operands' precision)."""
    with np.errstate(all="ignore"):
        return np.where(sub != 0, a - b, a + b)


def ulp_steps(x: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """float32 values ``steps`` codes away from ``x`` (same sign; crossing binades)."""
    bits = x.view(np.uint32).astype(np.int64)
    mag = np.clip((bits & 0x7FFFFFFF) + steps, 0, 0x7F7FFFFF)
    return ((bits & 0x80000000) | mag).astype(np.uint32).view(np.float32)


def float32_pairs(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """>= 1M float32 operand pairs and ``sub`` bits: random bit patterns; exponent gaps of
    0..60 (subnormals and zeros at the bottom); near-cancellation (equal exponents, neighbours,
    random low bits); ties after rounding (half-ulp multiples); sums that overflow; every pair
    of special values (zeros, infinities, NaNs, extremes) with both ``sub``."""
    rng = np.random.default_rng(seed)
    parts = []
    bits = rng.integers(0, 1 << 32, (2, 300_000), dtype=np.uint64).astype(np.uint32)
    parts.append((bits[0].view(np.float32), bits[1].view(np.float32)))
    n = 330_000
    ea = rng.integers(-149, 127, n, endpoint=True)
    gap = rng.integers(0, 60, n, endpoint=True)
    parts.append((f32_values(rng.integers(0, 2, n), ea, rng.integers(0, 1 << 23, n)),
                  f32_values(rng.integers(0, 2, n), ea - gap, rng.integers(0, 1 << 23, n))))
    n = 200_000
    a = random_f32(rng, n, -149, 127)
    low = (1 << rng.integers(0, 24, n)) - 1
    b_bits = (a.view(np.uint32) & ~low.astype(np.uint32)) | (
        rng.integers(0, 1 << 23, n).astype(np.uint32) & low.astype(np.uint32))
    b = np.where(rng.random(n) < 0.5, b_bits.view(np.float32),
                 ulp_steps(a, rng.integers(-3, 3, n, endpoint=True)))
    parts.append((a, -b))                       # a + (-b) or a - (-b): cancellation or doubling
    n = 150_000                                 # a + m/2 ulp(a), m odd: a tie unless it carries
    ea = rng.integers(-100, 127, n)
    a = f32_values(rng.integers(0, 2, n), ea, rng.integers(0, 1 << 23, n))
    m = rng.integers(0, 1 << 10, n) | 1
    b = np.ldexp(m.astype(np.float64), ea - 24 - rng.integers(0, 2, n)).astype(np.float32)
    parts.append((a, np.where(rng.random(n) < 0.5, -b, b)))
    n = 20_000                                  # overflow
    parts.append((random_f32(rng, n, 126, 127), random_f32(rng, n, 125, 127)))
    a = np.concatenate([p[0] for p in parts])
    b = np.concatenate([p[1] for p in parts])
    swap = rng.integers(0, 2, a.size).astype(bool)
    a, b = np.where(swap, b, a), np.where(swap, a, b)
    sub = rng.integers(0, 2, a.size).astype(np.uint8)
    sa, sb = all_pairs(special_f32(), special_f32())
    a = np.concatenate([a, sa, sa])
    b = np.concatenate([b, sb, sb])
    sub = np.concatenate([sub, np.zeros(sa.size, np.uint8), np.ones(sa.size, np.uint8)])
    return a, b, sub


def with_rule_nans(s: np.ndarray, rule: np.ndarray) -> np.ndarray:
    """``s`` with every NaN's sign set by ``rule`` (NumPy's own choice differs in some lanes
    when both operands are NaN)."""
    nan = np.copysign(np.array(np.nan, s.dtype), np.where(rule == 1, -1, 1).astype(s.dtype))
    return np.where(np.isnan(s), nan, s)


def exact_sums(a, b, sub, pick) -> tuple[dict[int, Fraction], dict[int, int]]:
    """Exact ``a +- b`` for the vectors ``pick`` (finite operands) and the sign of a zero result
    (-0 only for (-0) + (-0) after applying ``sub``)."""
    exact, zero_sign = {}, {}
    for k in pick.tolist():
        x, y = Fraction(float(a[k])), Fraction(float(b[k]))
        exact[k] = x - y if sub[k] else x + y
        neg_b = bool(np.signbit(b[k])) != bool(sub[k])
        zero_sign[k] = int(a[k] == 0 and b[k] == 0 and bool(np.signbit(a[k])) and neg_b)
    return exact, zero_sign


def check_float32_sums(bank, key: str, a, b, sub, fmt2=0) -> None:
    """code1 (float32) vs NumPy's float32 result, code2 (the second rounding, format index
    ``fmt2`` per vector) vs its cast, raw fields vs Fraction on a sample."""
    chain = bank[1][key]
    raw, code1, code2 = run_chain(bank, key, add_inputs(a, b, sub, 24, 24), fmt2=fmt2)
    s = reference(a, b, sub)
    rule = nan_signs(a, b)
    one = ~(np.isnan(a) & np.isnan(b)) & np.isnan(s)
    np.testing.assert_array_equal(np.signbit(s[one]), rule[one].astype(bool))
    info = lambda k: f"{a[k]!r} {'-' if sub[k] else '+'} {b[k]!r}"  # noqa: E731
    assert_codes(key, F["float32"], code1, codes_of(s), rule, info=info)
    fmt2 = np.broadcast_to(fmt2, a.shape)
    s = with_rule_nans(s, rule)                  # float4e2m1 has no NaN: the sign picks a code
    with np.errstate(all="ignore"):
        for k, fmt in enumerate(chain.r2.formats):
            want = codes_of(s.astype(fmt.dtype))
            assert_codes(key, fmt, code2, want, rule, where=fmt2 == k, info=info)
    finite = np.flatnonzero(np.isfinite(a) & np.isfinite(b))
    pick = np.random.default_rng(5).choice(finite, 30_000, replace=False)
    n_special = int(np.isfinite(special_f32()).sum()) ** 2 * 2
    pick = np.concatenate([pick, finite[-n_special:]])            # + finite special pairs
    exact, zero_sign = exact_sums(a, b, sub, pick)
    assert_raw_exact(key, raw, chain.unit.out_width, exact, zero_sign, info=info)
    assert_specials_clean(key, raw)


# ---------------------------------------------------------------------------------------------
# Verilator tests


@pytest.mark.sim
@requires_verilator
def test_float_add_float32_random(bank):
    """>= 1M float32 sums and differences (26-bit unit) rounded to float32 vs NumPy, then to
    float16 / bfloat16 / float4e2m1; raw output vs Fraction."""
    a, b, sub = float32_pairs(seed=1)
    assert a.size >= 1_000_000
    check_float32_sums(bank, "f32", a, b, sub, fmt2=np.arange(a.size) % 3)


@pytest.mark.sim
@requires_verilator
def test_float_add_float32_25_bits(bank):
    """A 25-bit sum rounds correctly to float32 (24 bits) too: >= 1M vectors."""
    a, b, sub = float32_pairs(seed=2)
    check_float32_sums(bank, "f25", a, b, sub)


@pytest.mark.sim
@requires_verilator
def test_float_add_float16_float32_outputs(bank):
    """Sums of float16 values rounded straight to float16 and bfloat16 on the float32 unit: one
    rounding of the exact sum. NumPy's float16 add rounds through float32, which is innocuous
    (24 >= 2 * 11 + 2); for bfloat16 the exact float64 sum is rounded to odd at 24 bits first
    (a float32 sum cast to bfloat16 would round twice and differ)."""
    rng = np.random.default_rng(6)
    n = 300_000
    a = rng.integers(0, 1 << 16, n).astype(np.uint16).view(np.float16)
    with np.errstate(all="ignore"):                         # near a: cancellation
        near = (a.astype(np.float32) * np.float32(1 + rng.random(n) / 64)).astype(np.float16)
    b = np.where(rng.random(n) < 0.5, rng.integers(0, 1 << 16, n).astype(np.uint16).view(
        np.float16), near)
    sub = rng.integers(0, 2, n).astype(np.uint8)
    fmt1 = rng.integers(1, 3, n)                               # float16 or bfloat16
    _, code1, _ = run_chain(bank, "f32", add_inputs(a, b, sub, 24, 24), fmt1=fmt1)
    s16 = reference(a, b, sub)
    s64 = reference(a.astype(np.float64), b.astype(np.float64), sub)     # exact
    rule = nan_signs(a, b)
    assert_codes("f32", F["float16"], code1, codes_of(s16), rule, where=fmt1 == 1)
    with np.errstate(invalid="ignore", over="ignore"):
        sbf = round_to_odd_32(s64).astype(ml_dtypes.bfloat16)        # one rounding
    assert_codes("f32", F["bfloat16"], code1, codes_of(sbf), rule, where=fmt1 == 2)


def float4_zero_points() -> np.ndarray:
    """Every float4e2m1 code as a float32 value (-6 .. 6, both zeros)."""
    return np.arange(16, dtype=np.uint8).view(FP4).astype(np.float32)


def float32_quotients(seed: int) -> np.ndarray:
    """float32 quotients: random ones in the float4 range and beyond, values whose sum with a
    zero point lies on or next to a float4 rounding boundary, and specials."""
    rng = np.random.default_rng(seed)
    rand = random_f32(rng, 20_000, -12, 5)
    zps = float4_zero_points().astype(np.float64)
    edges = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 7.0, 0.0, 1.0, 2.0, 4.0])
    edges = np.concatenate([edges, -edges])
    near = (edges[:, None] - zps[None, :]).ravel().astype(np.float32)
    near = np.concatenate([ulp_steps(near, np.full(near.size, k)) for k in range(-3, 4)])
    return np.concatenate([rand, near, special_f32()])


def check_float4(bank, key: str, q: np.ndarray, fp4_index: int) -> int:
    """Every float4e2m1 zero point plus each quotient: code1 vs NumPy's float32 ``q + zp``,
    code2 vs its ml_dtypes cast to float4e2m1. Returns the number of vectors."""
    q, zp = all_pairs(q, float4_zero_points())
    width_b = bank[1][key].unit.b_width
    raw, code1, code2 = run_chain(bank, key, add_inputs(q, zp, 0, 24, width_b), fmt2=fp4_index)
    with np.errstate(invalid="ignore"):
        s = q + zp
    rule = nan_signs(q, zp)
    info = lambda k: f"{q[k]!r} + {zp[k]!r}"  # noqa: E731
    assert_codes(key, F["float32"], code1, codes_of(s), rule, info=info)
    with np.errstate(invalid="ignore"):
        want = s.astype(FP4).view(np.uint8).astype(np.uint64)
    assert_codes(key, F["float4e2m1"], code2, want, rule, info=info)
    assert_specials_clean(key, raw)
    return q.size


@pytest.mark.sim
@requires_verilator
def test_float_add_float4_zero_points(bank):
    """QuantizeLinear's float4 path, ``(q + zp).astype(float4e2m1)`` with the sum in float32:
    every float4 zero point plus float32 quotients and every float16 quotient (widened), on
    the float32 unit and on the float32 + float4 unit."""
    q32 = float32_quotients(seed=7)
    q16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(
        np.float32)
    n = 0
    for key, fp4 in (("f32", 2), ("fp4", 0)):
        n += check_float4(bank, key, q32, fp4)
        n += check_float4(bank, key, q16, fp4)
    assert n >= 2 * 16 * (1 << 16)


def tiny_inputs(width: int, exp_width: int) -> tuple[dict, np.ndarray]:
    """Every finite wide float of the given widths, both signs, and the specials; with the
    exact values times 2**(2**(exp_width - 1) + width) (integers), 0 for the specials."""
    lo, hi = -(1 << (exp_width - 1)), (1 << (exp_width - 1)) - 1
    sign, exp, sig = (v.ravel() for v in np.meshgrid(
        np.arange(2), np.arange(lo, hi + 1), np.arange(1 << (width - 1), 1 << width),
        indexing="ij"))
    w = {"sign": sign.astype(np.uint64), "exp": exp.astype(np.int64),
         "sig": sig.astype(np.uint64), "sticky": np.zeros(sign.size, np.uint64),
         "cls": np.full(sign.size, NORM, np.uint64)}
    scaled = np.where(sign == 1, -1, 1) * (sig.astype(np.int64) << (exp - lo + 1))
    cls = np.repeat(np.array([ZERO, INF, NAN], np.uint64), 2)
    spec = {"sign": np.tile(np.arange(2, dtype=np.uint64), 3), "exp": np.zeros(6, np.int64),
            "sig": np.zeros(6, np.uint64), "sticky": np.zeros(6, np.uint64), "cls": cls}
    return ({k: np.concatenate([w[k], spec[k]]) for k in w},
            np.concatenate([scaled, np.zeros(6, np.int64)]))


def as_float64(w: dict, scaled: np.ndarray, scale: int) -> np.ndarray:
    """The float64 values of tiny wide floats (``scaled`` * 2**-scale for finite ones)."""
    x = np.ldexp(scaled.astype(np.float64), -scale)
    x = np.where(w["cls"] == INF, np.inf, np.where(w["cls"] == NAN, np.nan, x))
    return np.where(w["sign"] == 1, -np.abs(x), np.abs(x))


@pytest.mark.sim
@requires_verilator
def test_float_add_tiny_every_input(bank):
    """Every pair of 3- and 5-bit wide floats (exponents -4..3) and specials, both ``sub``:
    raw output vs exact integer arithmetic (3-bit truncation with sticky, exponents down to
    -8), rounded to float4e2m1 vs ml_dtypes' cast of the exact sum."""
    unit = bank[1]["tiny"].unit
    wa, xa = tiny_inputs(unit.a_width, unit.exp_width)
    wb, xb = tiny_inputs(unit.b_width, unit.exp_width)
    ia, ib = all_pairs(np.arange(xa.size), np.arange(xb.size))
    ia, ib = np.tile(ia, 2), np.tile(ib, 2)
    sub = np.repeat(np.arange(2, dtype=np.uint8), ia.size // 2)
    pick = lambda w, i: {k: v[i] for k, v in w.items()}  # noqa: E731
    raw, code1, _ = run_chain(bank, "tiny", {"a": pick(wa, ia), "b": pick(wb, ib), "sub": sub})
    # Exact: integers scaled by 2**(4 + width) (a's and b's scale differ by 2**2).
    scale = 4 + unit.b_width
    sa = xa[ia] << (unit.b_width - unit.a_width)
    total = np.where(sub == 1, sa - xb[ib], sa + xb[ib])
    fa = as_float64(wa, xa, 4 + unit.a_width)[ia]
    fb = as_float64(wb, xb, scale)[ib]
    s = reference(fa, fb, sub)                         # exact in float64 (and float32)
    finite = np.isfinite(fa) & np.isfinite(fb)
    mag = np.abs(total)
    length = np.frexp(mag.astype(np.float64))[1]       # bit length
    W = unit.out_width
    shift = np.maximum(length - W, 0)
    want = {
        "cls": np.where(total != 0, NORM, ZERO),
        "sign": (total < 0) | ((total == 0) & np.signbit(s)),
        "exp": np.where(total != 0, length - 1 - scale, 0),
        "sig": np.where(total != 0, (mag >> shift) << np.maximum(W - length, 0), 0),
        "sticky": (mag & ((1 << shift) - 1)) != 0,
    }
    assert np.min(want["exp"][total != 0]) == -8 and np.any(want["sticky"])
    for field, value in want.items():
        got = raw[field].astype(np.int64)
        bad = np.flatnonzero(finite & (got != value.astype(np.int64)))
        assert not bad.size, (f"tiny: {bad.size} wrong raw.{field}, first: " + "; ".join(
            f"{fa[k]!r} {'-' if sub[k] else '+'} {fb[k]!r}: {int(got[k])}, want "
            f"{int(value[k])}" for k in bad[:4]))
    rule = nan_signs(fa, fb)
    s = with_rule_nans(s, rule)
    with np.errstate(invalid="ignore"):
        want_codes = s.astype(FP4).view(np.uint8).astype(np.uint64)
    assert_codes("tiny", F["float4e2m1"], code1, want_codes, rule,
                 info=lambda k: f"{fa[k]!r} {'-' if sub[k] else '+'} {fb[k]!r}")
    assert_specials_clean("tiny", raw)
    assert ia.size > 30_000


# ---------------------------------------------------------------------------------------------
# NumPy's behaviour on this machine (no simulator)


def test_numpy_add_rules():
    """Pin the special cases FloatAdd follows: signed zeros in round to nearest, exact
    cancellation to +0, inf - inf the negative default NaN, a NaN operand's sign kept by a
    subtraction (x86 ``subss`` does not flip it), the first NaN when both are."""
    f = np.float32
    z, nz = np.zeros(1, f), -np.zeros(1, f)
    assert codes_of(nz + nz)[0] == 0x80000000 and codes_of(nz - z)[0] == 0x80000000
    assert codes_of(nz + z)[0] == 0 and codes_of(z - z)[0] == 0 and codes_of(z + nz)[0] == 0
    x = np.array([1.5, -2.0 ** -140], f)
    assert codes_of(x - x).tolist() == [0, 0] and codes_of(-x + x).tolist() == [0, 0]
    inf = np.full(1, np.inf, f)
    nn = np.array([0xFFC00002], np.uint32).view(f)
    pn = np.array([0x7FC00001], np.uint32).view(f)
    with np.errstate(invalid="ignore"):
        assert codes_of(inf - inf)[0] == 0xFFC00000 and codes_of(-inf + inf)[0] == 0xFFC00000
        assert codes_of(np.ones(1, f) - nn)[0] == 0xFFC00002
        assert codes_of(np.ones(1, f) - pn)[0] == 0x7FC00001
        assert codes_of(pn - nn)[0] == 0x7FC00001 and codes_of(nn + pn)[0] == 0xFFC00002
        assert codes_of(inf + pn)[0] == 0x7FC00001
        # float4e2m1 casts: +NaN -> 0x8, -NaN -> 0x0, overflow saturates, -0 + +0 = +0.
        y = np.array([np.nan, -np.nan, 7.0, -100.0], f).astype(FP4).view(np.uint8)
    assert y.tolist() == [0x8, 0x0, 0x7, 0xF]
    assert (nz + z).astype(FP4).view(np.uint8)[0] == 0


def test_float_add_inputs_helper():
    """The generators produce what they claim: gaps, cancellation, ties, overflow, specials."""
    a, b, sub = float32_pairs(seed=1)
    s = reference(a, b, sub)
    with np.errstate(all="ignore"):
        ea = np.frexp(a.astype(np.float64))[1]
        eb = np.frexp(b.astype(np.float64))[1]
        s64 = reference(a.astype(np.float64), b.astype(np.float64), sub)
        fin = np.isfinite(s64) & (s64 != 0) & np.isfinite(s)
        r = s.astype(np.float64)
        nxt = np.nextafter(s, np.where(s64 > r, np.float32(np.inf), np.float32(-np.inf)))
        half = np.abs(nxt.astype(np.float64) - r) / 2
        tie = fin & np.isfinite(nxt) & (np.abs(s64 - r) == half)
    assert tie.sum() > 50_000
    eff_sub = (np.signbit(a) ^ np.signbit(b) ^ (sub == 1)) & fin
    es = np.frexp(np.where(fin, s64, 1.0))[1]
    assert np.sum(eff_sub & (es < ea - 8)) > 20_000                      # deep cancellation
    assert np.sum(np.isinf(s) & np.isfinite(a) & np.isfinite(b)) > 5000  # overflow
    assert np.sum(np.abs(s64[fin]) < 2.0 ** -126) > 5000                  # subnormal results
    assert np.sum((s == 0) & np.isfinite(a) & (a != 0)) > 5000            # exact cancellation
    gap = np.abs(ea - eb)
    assert set(range(61)) <= set(gap[(a != 0) & (b != 0) & np.isfinite(a) & np.isfinite(b)])


# ---------------------------------------------------------------------------------------------
# Amaranth simulator: latency


def simulate(dut: FloatAdd, a: dict, b: dict, sub: np.ndarray) -> list[int]:
    """Apply one operation per cycle; return ``s``'s bits sampled before each clock edge."""
    seen: list[int] = []
    bits_a = join_fields(a, wide_float_layout(dut.a_width, dut.exp_width))
    bits_b = join_fields(b, wide_float_layout(dut.b_width, dut.exp_width))

    async def testbench(ctx):
        for k in range(len(bits_a) + dut.latency):
            j = min(k, len(bits_a) - 1)
            ctx.set(dut.a.as_value(), int(bits_a[j]))
            ctx.set(dut.b.as_value(), int(bits_b[j]))
            ctx.set(dut.sub, int(sub[j]))
            seen.append(ctx.get(dut.s.as_value()))
            if dut.latency:
                await ctx.tick()

    sim = Simulator(dut)
    if dut.latency:
        sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    return seen


@pytest.mark.parametrize("latency", [0, 1, 2, 3, 4, 5, 6, 7])
def test_float_add_latency(latency):
    dut = FloatAdd(a_width=4, b_width=3, exp_width=5, out_width=4, latency=latency)
    assert dut.latency == latency
    x = np.array([1.0, 15.0, 1.5, -0.0, 2.0 ** -9, -3.0, np.inf, 0.875, 1.0])
    y = np.array([1.5, 2.0 ** -10, 1.5, -0.0, 0.75, -3.0, np.inf, 0.75, 1.75])
    sub = np.array([0, 0, 1, 0, 1, 0, 1, 1, 1])
    want = wide(reference(x, y, sub), 24)             # then truncated to 4 bits
    want["cls"][6] = NAN
    for k in np.flatnonzero(want["cls"] == NORM):      # truncated with sticky
        v = Fraction(float(x[k])) + (-1 if sub[k] else 1) * Fraction(float(y[k]))
        want["sign"][k], want["exp"][k], want["sig"][k], want["sticky"][k] = truncated(v, 4)
    assert want["sticky"].tolist() == [0, 1, 0, 0, 1, 0, 0, 0, 0]
    assert want["cls"][2] == ZERO and want["sign"][3] == 1 and want["sign"][6] == 1
    seen = simulate(dut, wide(x, 4), wide(y, 3), sub)
    expect = join_fields(want, dut.s.shape()).tolist()
    assert seen[latency:] == expect, f"latency {latency}: {seen} != {expect} (delayed)"
    with pytest.raises(AttributeError):
        dut.latency = 2


def test_float_add_members():
    dut = FloatAdd(a_width=24, b_width=2, exp_width=9, out_width=26)
    members = dut.signature.members
    assert members["a"].shape == wide_float_layout(24, 9)
    assert members["b"].shape == wide_float_layout(2, 9)
    assert members["sub"].shape == 1
    assert members["s"].shape == wide_float_layout(26, 10)
    assert (dut.a_width, dut.b_width, dut.exp_width, dut.out_width, dut.latency) == \
        (24, 2, 9, 26, 1)
    assert [min_exp_width(n, 1) for n in (1, 2, 3, 4, 5, 6, 9, 10, 24, 129, 130, 256)] == \
        [2, 2, 2, 3, 3, 4, 4, 5, 6, 8, 9, 9]


# ---------------------------------------------------------------------------------------------
# Parameter errors


def test_float_add_a_width():
    with pytest.raises(ValueError, match=r"a_width must be in \[1, 256\], not 0"):
        FloatAdd(a_width=0, b_width=24, exp_width=9, out_width=26)
    with pytest.raises(TypeError, match=r"a_width must be an integer, not '24'"):
        FloatAdd(a_width="24", b_width=24, exp_width=9, out_width=26)


def test_float_add_b_width():
    with pytest.raises(ValueError, match=r"b_width must be in \[1, 256\], not 300"):
        FloatAdd(a_width=24, b_width=300, exp_width=9, out_width=26)
    with pytest.raises(TypeError, match=r"b_width must be an integer, not 2.5"):
        FloatAdd(a_width=24, b_width=2.5, exp_width=9, out_width=26)


def test_float_add_exp_width():
    with pytest.raises(ValueError, match=r"exp_width must be in \[6, 31\] for significands "
                                         r"of 24 bits, not 5"):
        FloatAdd(a_width=24, b_width=2, exp_width=5, out_width=26)
    with pytest.raises(ValueError, match=r"exp_width must be in \[2, 31\] .* not 32"):
        FloatAdd(a_width=2, b_width=2, exp_width=32, out_width=4)
    with pytest.raises(TypeError, match=r"exp_width must be an integer, not None"):
        FloatAdd(a_width=24, b_width=24, exp_width=None, out_width=26)


def test_float_add_out_width():
    with pytest.raises(ValueError, match=r"out_width must be in \[1, 256\], not 0"):
        FloatAdd(a_width=24, b_width=24, exp_width=9, out_width=0)
    with pytest.raises(TypeError, match=r"out_width must be an integer, not None"):
        FloatAdd(a_width=24, b_width=24, exp_width=9, out_width=None)


def test_float_add_latency_value():
    with pytest.raises(ValueError, match=r"latency must be in \[0, 7\], not 8"):
        FloatAdd(a_width=24, b_width=24, exp_width=9, out_width=26, latency=8)
    with pytest.raises(TypeError, match=r"latency must be an integer, not False"):
        FloatAdd(a_width=24, b_width=24, exp_width=9, out_width=26, latency=False)


def test_min_exp_width_errors():
    with pytest.raises(ValueError, match=r"b_width must be in \[1, 256\], not 0"):
        min_exp_width(24, 0)
