# amaranth: UnusedElaboratable=no
"""FloatDivide through Verilator (qaccel.sim.vectors), each unit chained into a FloatRound,
against NumPy / ml_dtypes division; its raw quotient against exact integer division and
fractions.Fraction; latency in Amaranth's simulator; parameter errors.

References: np.float16 and np.float32 division, ml_dtypes bfloat16 division, and NumPy's
int32 / float32 and int32 / int32 true division (float64). NumPy and ml_dtypes divide float16
and bfloat16 in float32, then cast: a double rounding that equals one correct rounding
(float32 has at least 2p + 2 bits for p = 8 and 11, and a bfloat16 subnormal quotient of
8-bit significands is never within 2**-150 of a bfloat16 midpoint without being one);
test_float_divide_half_exhaustive checks that on every finite pair it divides, against
the exact quotient from integer division.
"""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from amaranth.hdl import Module, Signal, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from qaccel.model.floatfmt import FORMATS
from qaccel.rtl.arith.float_divide import FloatDivide
from qaccel.rtl.arith.float_round import FloatRound, min_exp_width
from qaccel.rtl.arith.wide_float import wide_float_layout
from qaccel.sim.runner import missing_simulator
from qaccel.sim.vectors import ComponentBank, VectorSim, join_fields, split_fields

from ..wide_np import INF, NAN, NORM, SUB, ZERO, describe, reference_codes, wide_from_float64

requires_verilator = pytest.mark.skipif(missing_simulator("verilator") is not None,
                                        reason=missing_simulator("verilator") or "")
F = FORMATS
FIELDS = ("cls", "sign", "exp", "sig", "sticky")

#: key -> (FloatDivide parameters, target format). float16 gets the narrowest quotient that
#: rounds correctly (p + 1 bits), the others the accelerator's p + 2. "ab" (float32 / float16
#: to float16, a quotient narrower than the dividend) and "ba" (bfloat16 / float32 to bfloat16,
#: a single stage) mix operand widths.
UNITS = {
    "f16": (dict(a_width=11, b_width=11, q_width=12, exp_width=6, bits_per_stage=1), "float16"),
    "bf16": (dict(a_width=8, b_width=8, q_width=10, exp_width=9, bits_per_stage=3), "bfloat16"),
    "f32": (dict(a_width=24, b_width=24, q_width=26, exp_width=9, bits_per_stage=2), "float32"),
    "i32": (dict(a_width=32, b_width=32, q_width=55, exp_width=10, bits_per_stage=4), "float64"),
    "ab": (dict(a_width=24, b_width=11, q_width=12, exp_width=9, bits_per_stage=5), "float16"),
    "ba": (dict(a_width=8, b_width=24, q_width=9, exp_width=9, bits_per_stage=10), "bfloat16"),
}


class DivideRound(wiring.Component):
    """Test-only chain: a FloatDivide, then a FloatRound (latency 1) to one format. ``q`` is
    the raw quotient, delayed to come out with its rounding ``code``; both are delayed further
    to a total latency ``latency``, so that the units of the bank can run side by side."""

    def __init__(self, fmt: str, latency: int, **params):
        self.div = FloatDivide(**params)
        self.latency = latency
        self.fmt = F[fmt]
        self.rnd = FloatRound((fmt,), sig_width=self.div.q_width, latency=1,
                              exp_width=max(self.div.exp_width + 2, min_exp_width((self.fmt,))))
        super().__init__({"a": In(self.div.a.shape()), "b": In(self.div.b.shape()),
                          "code": Out(unsigned(self.fmt.bits)), "q": Out(self.div.q.shape())})

    def elaborate(self, platform):
        m = Module()
        m.submodules.div, m.submodules.rnd = self.div, self.rnd
        q = self.div.q
        m.d.comb += [self.div.a.eq(self.a), self.div.b.eq(self.b)]
        m.d.comb += [getattr(self.rnd.i, name).eq(getattr(q, name)) for name in FIELDS]
        code, raw = self.rnd.code, Signal.like(q.as_value())
        m.d.sync += raw.eq(q.as_value())
        assert self.latency >= self.div.latency + self.rnd.latency
        for _ in range(self.latency - self.div.latency - self.rnd.latency):
            code_d, raw_d = Signal.like(code), Signal.like(raw)
            m.d.sync += [code_d.eq(code), raw_d.eq(raw)]
            code, raw = code_d, raw_d
        m.d.comb += [self.code.eq(code), self.q.as_value().eq(raw)]
        return m


@pytest.fixture(scope="module")
def bank() -> tuple[VectorSim, dict[str, DivideRound]]:
    latency = max(FloatDivide(**params).latency for params, _ in UNITS.values()) + 1
    units = {key: DivideRound(fmt, latency, **params) for key, (params, fmt) in UNITS.items()}
    return VectorSim(ComponentBank(units), name="float_divide_bank"), units


# ---------------------------------------------------------------------------------------------
# Operands and references


def wide_operands(x, width: int, exp_width: int, seed: int, min_normal: float) -> dict:
    """float64 values (exact in ``width`` bits) as wide floats: ``SUBNORMAL`` below
    ``min_normal`` as FloatUnpack marks them, random junk in the ignored fields of 0/inf/NaN."""
    with np.errstate(invalid="ignore"):                    # signalling NaNs
        x = np.asarray(x, np.float64)
    w = wide_from_float64(x, width)
    rng = np.random.default_rng(seed)
    sub = (w["cls"] == NORM) & (np.abs(x) < min_normal)
    w["cls"] = np.where(sub, SUB, w["cls"]).astype(np.uint64)
    special = (w["cls"] != NORM) & (w["cls"] != SUB)
    n, lo = x.size, -(1 << (exp_width - 1))
    w["exp"] = np.where(special, rng.integers(lo, -lo, n), w["exp"])
    w["sig"] = np.where(special, rng.integers(0, 1 << width, n, dtype=np.uint64), w["sig"])
    w["sticky"] = np.where(special, rng.integers(0, 2, n, dtype=np.uint64), 0).astype(np.uint64)
    return w


def expected_quotient(wa: dict, wb: dict, aw: int, bw: int, qw: int) -> dict:
    """The raw quotient FloatDivide must give: x86 special rules, and for finite operands the
    exact quotient truncated to ``qw`` bits by integer division, sticky = remainder != 0."""
    ca, cb, sa, sb = wa["cls"], wb["cls"], wa["sign"], wb["sign"]
    fa, fb = (ca == NORM) | (ca == SUB), (cb == NORM) | (cb == SUB)
    xor = sa ^ sb
    conds = [ca == NAN, cb == NAN, ((ca == ZERO) & (cb == ZERO)) | ((ca == INF) & (cb == INF)),
             (ca == INF) | (cb == ZERO), (ca == ZERO) | (cb == INF)]
    cls = np.select(conds, [NAN, NAN, NAN, INF, ZERO], NORM).astype(np.uint64)
    sign = np.select(conds, [sa, sb, np.ones_like(sa), xor, xor], xor).astype(np.uint64)
    f = max(aw, bw) - 1
    dt = object if f + qw + 2 > 64 else np.uint64          # Python integers beyond 64 bits
    num = (np.where(fa & fb, wa["sig"], 1).astype(dt) << (f + 1 - aw)) << qw
    den = np.where(fa & fb, wb["sig"], 1).astype(dt) << (f + 1 - bw)
    quo, rem = num // den, num % den
    hi = (quo >> qw).astype(np.uint64)                     # quotient of significands >= 1
    sig = np.where(hi == 1, quo >> 1, quo).astype(np.uint64)
    sticky = ((rem != 0) | ((hi == 1) & ((quo & 1) != 0))).astype(np.uint64)
    norm = cls == NORM
    return {"cls": cls, "sign": sign,
            "exp": np.where(norm, wa["exp"] - wb["exp"] - 1 + hi.astype(np.int64), 0),
            "sig": np.where(norm, sig, 0), "sticky": np.where(norm, sticky, 0)}


def check_fraction(wa, wb, q, aw: int, bw: int, qw: int, n: int, seed: int) -> int:
    """On ``n`` random finite pairs: ``sig * 2**(exp - qw + 1) <= |a / b|`` is within one unit
    of the last place, with equality exactly when ``sticky == 0`` (Fraction arithmetic)."""
    finite = np.flatnonzero(np.isin(wa["cls"], [NORM, SUB]) & np.isin(wb["cls"], [NORM, SUB]))
    pick = np.random.default_rng(seed).choice(finite, min(n, finite.size), replace=False)
    def value(w, width, k):
        return Fraction(int(w["sig"][k])) * Fraction(2) ** (int(w["exp"][k]) - width + 1)

    for k in pick.tolist():
        exact = value(wa, aw, k) / value(wb, bw, k)
        low, ulp = value(q, qw, k), Fraction(2) ** (int(q["exp"][k]) - qw + 1)
        assert int(q["cls"][k]) == NORM and int(q["sig"][k]) >> (qw - 1) == 1
        assert int(q["sign"][k]) == int(wa["sign"][k] ^ wb["sign"][k])
        assert low <= exact < low + ulp, f"vector {k}: {exact} outside [{low}, {low + ulp})"
        assert bool(q["sticky"][k]) == (exact != low), f"vector {k}: sticky"
    return pick.size


def run_and_check(bank, jobs: dict) -> dict:
    """Run the units named by ``jobs`` (key -> (wa, wb, want, bits or None); ``bits`` are the
    joined ``wa`` and ``wb``) side by side; compare each ``code`` with ``want`` (NaN by
    NaN-ness and sign) and the raw quotient with :func:`expected_quotient` on every vector and
    with Fraction on a sample. Return the expected quotients by key."""
    sim, units = bank
    n = max(len(job[2]) for job in jobs.values())
    inputs, result = {}, {}
    for key, (wa, wb, _, bits) in jobs.items():
        d = units[key].div
        bits = bits or (join_fields(wa, d.a.shape()), join_fields(wb, d.b.shape()))
        for port, v in zip("ab", bits, strict=True):
            inputs[f"{port}_{key}"] = np.concatenate([v, np.zeros(n - len(v), v.dtype)])
    out = sim.run(inputs, latency=next(iter(units.values())).latency,
                  outputs=[f"{port}_{key}" for key in jobs for port in ("code", "q")])
    for key, (wa, wb, want, _) in jobs.items():
        d, fmt = units[key].div, units[key].fmt
        code = out[f"code_{key}"][:len(want)].astype(np.uint64)
        want = want.astype(np.uint64)
        top = np.uint64(fmt.bits - 1)
        nan = fmt.is_nan(want.astype(fmt.code_dtype))
        ok = np.where(nan, fmt.is_nan(code.astype(fmt.code_dtype))
                      & ((code >> top) == (want >> top)), code == want)
        bad = np.flatnonzero(~ok)
        assert not bad.size, f"{key}: {bad.size} of {code.size} wrong codes, first: " + "; ".join(
            f"({describe(wa, k)}) / ({describe(wb, k)}): {int(code[k]):#x}, want "
            f"{int(want[k]):#x}" for k in bad[:4])
        q = split_fields(out[f"q_{key}"][:len(want)], d.q.shape())
        ref = expected_quotient(wa, wb, d.a_width, d.b_width, d.q_width)
        for name in FIELDS:
            bad = np.flatnonzero(q[name].astype(np.int64) != ref[name].astype(np.int64))
            assert not bad.size, f"{key}: {bad.size} wrong q.{name}, first at {bad[:4]}"
        check_fraction(wa, wb, q, d.a_width, d.b_width, d.q_width, 2000, seed=len(key))
        result[key] = ref
    return result


def scale_codes(name: str, seed: int) -> np.ndarray:
    """At least 48 scales of a 16-bit format: powers of two, 1/3-ish and other inexact
    reciprocals, subnormals, max, tiny, neighbours of 1, random codes, both signs, zeros,
    infinities and NaNs."""
    fmt = F[name]
    pow2 = np.ldexp(1.0, [fmt.emin - fmt.mbits, fmt.emin - 1, fmt.emin, -5, -1, 0, 1, 3, 8,
                          fmt.emax])
    odd = [1 / 3, 2 / 3, 3.0, 0.1, 0.7, 1.1, 5.0, 6.02, 10.0, 127.3, 1e-3, 7.0, 0.15]
    one = int(fmt.encode(1.0))
    codes = [fmt.encode(np.concatenate([pow2, odd])).astype(np.int64),
             [1, 3, 0x55, fmt.mant_mask, fmt.min_normal_code, fmt.min_normal_code + 1,
              fmt.max_code, fmt.max_code - 1, one + 1, one - 1, one + 2],
             np.random.default_rng(seed).integers(0, fmt.inf_code, 4)]
    mags = np.unique(np.concatenate(codes)).astype(np.int64)
    sign = fmt.sign_mask
    specials = [0, sign, fmt.inf_code, fmt.inf_code | sign, fmt.nan_code, fmt.nan_code | sign,
                fmt.nan_code | 5]
    out = np.concatenate([mags, mags[::5] | sign, specials])
    assert np.unique(out).size >= 48
    return out.astype(fmt.code_dtype)


def decode(fmt, codes) -> np.ndarray:
    """The float64 values of ``codes``, NaNs keeping their sign."""
    neg = (codes.astype(np.uint64) >> np.uint64(fmt.bits - 1)) != 0
    return np.copysign(fmt.decode(codes), np.where(neg, -1.0, 1.0))


def half_vectors(name: str, div: FloatDivide):
    """Every code x of ``name`` divided by every scale of :func:`scale_codes`: the operands as
    wide floats and joined for ``div``, and the NumPy / ml_dtypes quotient codes."""
    fmt = F[name]
    x = np.arange(1 << 16, dtype=np.uint64).astype(fmt.code_dtype)
    s = scale_codes(name, seed=fmt.ebits)
    with np.errstate(all="ignore"):
        want = (x.view(fmt.dtype)[None, :] / s.view(fmt.dtype)[:, None]).ravel()
    p = fmt.mbits + 1
    wa = wide_operands(decode(fmt, x), p, div.exp_width, 1, fmt.min_normal)
    wb = wide_operands(decode(fmt, s), p, div.exp_width, 2, fmt.min_normal)
    bits = (np.tile(join_fields(wa, div.a.shape()), s.size),
            np.repeat(join_fields(wb, div.b.shape()), x.size))
    wa = {k: np.tile(v, s.size) for k, v in wa.items()}
    wb = {k: np.repeat(v, x.size) for k, v in wb.items()}
    return wa, wb, want.view(fmt.code_dtype), bits


# ---------------------------------------------------------------------------------------------
# Verilator tests


@pytest.mark.sim
@requires_verilator
def test_float_divide_half_exhaustive(bank):
    """Every float16 and every bfloat16 x by at least 48 scales (the two units side by side)
    vs np.float16 / ml_dtypes division; and that division (float32, then a cast) is one correct
    rounding of the exact quotient."""
    jobs = {key: half_vectors(name, bank[1][key].div)
            for key, name in (("f16", "float16"), ("bf16", "bfloat16"))}
    exact = run_and_check(bank, jobs)
    for key, (_, _, want, _) in jobs.items():
        fmt, q_width = bank[1][key].fmt, bank[1][key].div.q_width
        assert want.size >= 48 << 16
        finite = exact[key]["cls"] == NORM
        assert np.sum(finite) > 40 << 16
        ref = reference_codes(fmt, {k: v[finite] for k, v in exact[key].items()}, q_width, False)
        np.testing.assert_array_equal(want[finite].astype(np.uint64), ref)


def f32_pairs(rng) -> tuple[np.ndarray, np.ndarray]:
    """float32 (x, scale) bit patterns: random codes, quotients near underflow and overflow,
    subnormal operands, exact quotients, half-integer quotients, subnormal ties, specials."""
    def codes(sign, ef, mant):
        return ((sign.astype(np.uint32) << 31) | (ef.astype(np.uint32) << 23)
                | mant.astype(np.uint32))

    def rand(n, e_lo, e_hi):
        return codes(rng.integers(0, 2, n), rng.integers(e_lo, e_hi, n, endpoint=True),
                     rng.integers(0, 1 << 23, n))

    xs, ss = [rng.integers(0, 1 << 32, 600_000, dtype=np.uint64).astype(np.uint32)], []
    ss.append(rng.integers(0, 1 << 32, 600_000, dtype=np.uint64).astype(np.uint32))
    for n, d_lo, d_hi in ((200_000, -155, -120), (100_000, 124, 130)):   # exponent differences
        ex = rng.integers(max(1, 1 + d_lo), min(254, 254 + d_hi), n, endpoint=True)
        es = np.clip(ex - rng.integers(d_lo, d_hi, n, endpoint=True), 1, 254)
        xs.append(codes(rng.integers(0, 2, n), ex, rng.integers(0, 1 << 23, n)))
        ss.append(codes(rng.integers(0, 2, n), es, rng.integers(0, 1 << 23, n)))
    xs += [rand(50_000, 0, 0), rand(50_000, 0, 30), rand(50_000, 1, 40)]     # subnormal x
    ss += [rand(50_000, 0, 30), rand(50_000, 0, 0), rand(50_000, 0, 0)]      # subnormal scale
    q = np.ldexp(rng.integers(1 << 11, 1 << 12, 50_000), rng.integers(-140, 100, 50_000))
    qs = np.ldexp(rng.integers(1 << 11, 1 << 12, 50_000), rng.integers(-15, 5, 50_000))
    half = np.ldexp(rng.integers(0, 1 << 13, 50_000) + 0.5, rng.integers(-3, 3, 50_000))
    hs = np.ldexp(rng.integers(1 << 9, 1 << 10, 50_000), rng.integers(-20, 20, 50_000))
    tie_x, tie_s = rand(50_000, 0, 3), np.ldexp(1.0, rng.integers(1, 25, 50_000))
    for x, s in ((q * qs, qs), (half * hs, hs)):                               # exact quotients
        xs.append(x.astype(np.float32).view(np.uint32))
        ss.append(s.astype(np.float32).view(np.uint32))
    xs.append(tie_x)
    ss.append(tie_s.astype(np.float32).view(np.uint32))
    edge = np.array([0, 1.0, 3.0, 1 / 3, 2.0 ** -149, 3 * 2.0 ** -149, 2.0 ** -126, 2.0 ** -127,
                     np.float32(3.4028235e38), 2.0 ** 127, 1 - 2.0 ** -24, 1 + 2.0 ** -23,
                     np.inf, np.nan], np.float32)
    edge = np.concatenate([edge, -edge]).view(np.uint32)
    xs.append(np.repeat(edge, edge.size))
    ss.append(np.tile(edge, edge.size))
    return np.concatenate(xs), np.concatenate(ss)


@pytest.mark.sim
@requires_verilator
def test_float_divide_float32(bank):
    """>= 1M float32 pairs vs np.float32 division: overflow, underflow to subnormals and to
    zero, subnormal operands, exact and half-integer quotients, subnormal ties, specials."""
    xs, ss = f32_pairs(np.random.default_rng(3))
    with np.errstate(all="ignore"):
        want = (xs.view(np.float32) / ss.view(np.float32)).view(np.uint32)
    f32, e = F["float32"], UNITS["f32"][0]["exp_width"]
    wa = wide_operands(xs.view(np.float32), 24, e, 4, f32.min_normal)
    wb = wide_operands(ss.view(np.float32), 24, e, 5, f32.min_normal)
    with np.errstate(all="ignore"):
        q = np.abs(xs.view(np.float32).astype(np.float64) / ss.view(np.float32))
    assert np.sum(q < 2.0 ** -126) > 100_000 and np.sum(q < 2.0 ** -150) > 10_000
    assert np.sum(np.isinf(want.view(np.float32)) & np.isfinite(xs.view(np.float32))
                  & (ss.view(np.float32) != 0)) > 10_000
    assert want.size >= 1_000_000
    exact = run_and_check(bank, {"f32": (wa, wb, want, None)})["f32"]
    assert np.sum((exact["cls"] == NORM) & (exact["sticky"] == 0)) > 100_000


@pytest.mark.sim
@requires_verilator
def test_float_divide_int32(bank):
    """int32 x by float32 and by int32 scales vs NumPy's float64 true division, extremes
    included; the int32 wide float has a 32-bit significand."""
    rng = np.random.default_rng(6)
    ext = np.array([-(1 << 31), -(1 << 31) + 1, -1, 0, 1, (1 << 31) - 1, 3, -7, 255], np.int32)
    n = 150_000
    x = np.concatenate([rng.integers(-(1 << 31), 1 << 31, n), rng.integers(-300, 300, n // 2),
                        np.tile(ext, 2000)]).astype(np.int32)
    sf = np.concatenate([rng.integers(0, 1 << 32, n // 2, dtype=np.uint64).astype(np.uint32)
                         .view(np.float32), np.exp(rng.uniform(-12, 7, n)).astype(np.float32)])
    sf = np.concatenate([sf, np.array([0, -0.0, np.inf, -np.inf, np.nan, 1, -1, 2.0 ** -149,
                                       3.4028235e38, 0.1], np.float32).repeat(1800)])
    si = np.concatenate([rng.integers(-(1 << 31), 1 << 31, n), rng.integers(-20, 20, n // 2),
                         np.repeat(ext, 2000)]).astype(np.int32)
    rng.shuffle(sf)
    with np.errstate(all="ignore"):
        want = np.concatenate([x / sf, x / si])
    assert want.dtype == np.float64
    e = UNITS["i32"][0]["exp_width"]
    with np.errstate(invalid="ignore"):
        xx, ss = np.concatenate([x, x]).astype(np.float64), np.concatenate([sf, si]).astype(float)
    wa = wide_operands(xx, 32, e, 7, 2.0 ** -126)
    wb = wide_operands(ss, 32, e, 8, np.where(np.arange(ss.size) < x.size, 2.0 ** -126, 0))
    assert want.size >= 300_000
    run_and_check(bank, {"i32": (wa, wb, want.view(np.uint64), None)})


@pytest.mark.sim
@requires_verilator
@pytest.mark.parametrize(("key", "a_name", "b_name"), [("ab", "float32", "float16"),
                                                       ("ba", "bfloat16", "float32")])
def test_float_divide_mixed_widths(bank, key, a_name, b_name):
    """Random codes of two formats, specials included, vs one correct rounding of the exact
    quotient (integer division). In "ab" the quotient has fewer bits than the dividend: the
    digit dropped by the normalisation then matters for the sticky bit."""
    rng = np.random.default_rng(len(a_name) + len(b_name))
    fa, fb = F[a_name], F[b_name]
    edge = np.array([0, 1, 3, 1 / 3, np.inf, np.nan, 2.0 ** -24, 2.0 ** -133, 65504], np.float64)
    edge = np.concatenate([edge, -edge])
    xa = np.concatenate([decode(fa, rng.integers(0, 1 << fa.bits, 150_000, dtype=np.uint64)),
                         np.repeat(edge, edge.size)])
    xb = np.concatenate([decode(fb, rng.integers(0, 1 << fb.bits, 150_000, dtype=np.uint64)),
                         np.tile(edge, edge.size)])
    xa, xb = xa.astype(fa.dtype).astype(np.float64), xb.astype(fb.dtype).astype(np.float64)
    div = bank[1][key].div
    wa = wide_operands(xa, div.a_width, div.exp_width, 11, fa.min_normal)
    wb = wide_operands(xb, div.b_width, div.exp_width, 12, fb.min_normal)
    fmt = bank[1][key].fmt
    want = reference_codes(fmt, expected_quotient(wa, wb, div.a_width, div.b_width, 30), 30,
                           False)
    assert div.q_width < div.a_width or div.q_width < div.b_width
    run_and_check(bank, {key: (wa, wb, want, None)})


# ---------------------------------------------------------------------------------------------
# The NumPy behaviour copied (no simulator)


def test_x86_special_values():
    """Pin the NumPy behaviour FloatDivide copies: 0/0 and inf/inf give the negative default
    NaN, a NaN operand propagates with its sign (the dividend's if both are NaN)."""
    with np.errstate(all="ignore"):
        for dt in (np.float16, np.float32, ml_dtypes.bfloat16, np.float64):
            z, inf = np.array([0.0, -0.0], dt), np.array([np.inf, -np.inf], dt)
            assert np.all(np.signbit((z / z[::-1]).astype(np.float32)))
            assert np.all(np.signbit((inf / inf).astype(np.float32)))
            a, b = np.array([np.nan, -np.nan, 1.0, -0.0], dt), np.array([-np.nan, np.nan], dt)
            q = (a / np.array([b[0], b[1], b[0], b[1]], dt)).astype(np.float32)
            assert np.isnan(q).all() and np.signbit(q).tolist() == [False, True, True, False]
        assert np.signbit(np.zeros(4, np.int32) / np.zeros(4, np.int32)).all()


# ---------------------------------------------------------------------------------------------
# Amaranth simulator: latency


@pytest.mark.parametrize(("aw", "bw", "qw", "bps"), [
    (11, 11, 12, 1), (11, 11, 12, 2), (11, 11, 12, 5), (11, 11, 12, 13), (1, 1, 1, 1),
    (3, 2, 1, 2), (2, 5, 3, 4)])
def test_float_divide_latency(aw, bw, qw, bps):
    """Latency ``ceil((q_width + 1) / bits_per_stage) + 1``, one division per cycle; also at the
    smallest widths, on random wide floats of every class with exponents over the whole field
    (quotient exponents down to ``-2**exp_width``)."""
    dut = FloatDivide(a_width=aw, b_width=bw, q_width=qw, exp_width=4, bits_per_stage=bps)
    assert dut.stages == -(-(qw + 1) // bps) and dut.latency == dut.stages + 1
    rng = np.random.default_rng(aw * 100 + bps)

    def operands(n, width):
        cls = rng.choice([NORM, NORM, NORM, SUB, ZERO, INF, NAN], n).astype(np.uint64)
        cls[:2] = NORM
        return {"sign": rng.integers(0, 2, n, dtype=np.uint64), "exp": rng.integers(-8, 8, n),
                "sig": rng.integers(1 << (width - 1), 1 << width, n, dtype=np.uint64),
                "sticky": np.zeros(n, np.uint64), "cls": cls}

    wa, wb = operands(40, aw), operands(40, bw)
    wa["exp"][1], wb["exp"][1], wa["sig"][1], wb["sig"][1] = -8, 7, 1 << (aw - 1), (1 << bw) - 1
    want = join_fields(expected_quotient(wa, wb, aw, bw, qw), dut.q.shape()).tolist()
    a, b = join_fields(wa, dut.a.shape()), join_fields(wb, dut.b.shape())
    seen = []

    async def testbench(ctx):
        for k in range(len(want) + dut.latency):
            ctx.set(dut.a.as_value(), int(a[min(k, len(a) - 1)]))
            ctx.set(dut.b.as_value(), int(b[min(k, len(b) - 1)]))
            seen.append(ctx.get(dut.q.as_value()))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    assert seen[dut.latency:] == want and seen[dut.latency - 1] != want[0]
    exp = split_fields(np.array(want, np.uint64), dut.q.shape())["exp"]
    assert exp[1] == -16 if bw > 1 else exp[1] == -15


def test_float_divide_members():
    dut = FloatDivide(a_width=32, b_width=24, q_width=55, exp_width=10, bits_per_stage=4)
    members = dut.signature.members
    assert members["a"].shape == wide_float_layout(32, 10)
    assert members["b"].shape == wide_float_layout(24, 10)
    assert members["q"].shape == wide_float_layout(55, 12)
    assert (dut.a_width, dut.b_width, dut.q_width, dut.exp_width, dut.bits_per_stage) == \
        (32, 24, 55, 10, 4)
    assert dut.latency == 15
    assert FloatDivide(a_width=8, b_width=8, q_width=10, exp_width=9).latency == 12
    with pytest.raises(AttributeError):
        dut.latency = 3


# ---------------------------------------------------------------------------------------------
# Parameter errors


def make(**kw) -> FloatDivide:
    return FloatDivide(**(dict(a_width=24, b_width=24, q_width=26, exp_width=9) | kw))


@pytest.mark.parametrize("name", ["a_width", "b_width", "q_width"])
def test_float_divide_sig_widths(name):
    with pytest.raises(ValueError, match=rf"{name} must be in \[1, 256\], not 0"):
        make(**{name: 0})
    with pytest.raises(ValueError, match=rf"{name} must be in \[1, 256\], not 257"):
        make(**{name: 257})
    with pytest.raises(TypeError, match=rf"{name} must be an integer, not 24.0"):
        make(**{name: 24.0})


def test_float_divide_exp_width():
    with pytest.raises(ValueError, match=r"exp_width must be in \[2, 30\], not 31"):
        make(exp_width=31)
    with pytest.raises(ValueError, match=r"exp_width must be in \[2, 30\], not 1"):
        make(exp_width=1)
    with pytest.raises(TypeError, match=r"exp_width must be an integer, not '9'"):
        make(exp_width="9")


def test_float_divide_bits_per_stage():
    with pytest.raises(ValueError, match=r"bits_per_stage must be in \[1, 27\], not 0"):
        make(bits_per_stage=0)
    with pytest.raises(ValueError, match=r"bits_per_stage must be in \[1, 27\], not 28"):
        make(bits_per_stage=28)
    with pytest.raises(TypeError, match=r"bits_per_stage must be an integer, not True"):
        make(bits_per_stage=True)


def test_float_divide_keyword_only():
    with pytest.raises(TypeError):
        FloatDivide(24, 24, 26, 9)
