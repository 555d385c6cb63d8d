# amaranth: UnusedElaboratable=no
"""FloatToInt through Verilator (qaccel.sim.vectors) against
``np.clip(np.rint(v) + zp, qmin, qmax)`` in float64 (NaN -> qmin): every float16 value and a
grid of ties, near-ties, huge exponents, infinities and NaNs through every (bits, signed)
combination with several zero points; >= 1M random float32-range wide floats with random
bits / signed / zero points; every input of a tiny unit; sticky inputs against exact rational
rounding. Latency in Amaranth's simulator; parameter errors.

The float64 reference ``v`` is the wide input rounded to odd at 53 bits (``round_to_odd_53``):
exact for significands up to 52 bits, and for wider ones it keeps enough bits below the units
place of every value that does not saturate to round it to an integer correctly. Its sticky
bit reads as "a little more than sig", which is also what the unit does where the sticky bit
lies above the half place (documented; see test_float_to_int_sticky_exact).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from amaranth.sim import Simulator

from qaccel.rtl.arith.float_to_int import FloatToInt
from qaccel.rtl.arith.wide_float import wide_float_layout
from qaccel.sim.runner import missing_simulator
from qaccel.sim.vectors import ComponentBank, VectorSim, join_fields

from ..wide_np import (
    NORM,
    SUB,
    concat,
    describe,
    round_to_odd_53,
    specials,
    step,
    wide_from_float64,
    with_sticky,
)

requires_verilator = pytest.mark.skipif(missing_simulator("verilator") is not None,
                                        reason=missing_simulator("verilator") or "")

#: The units of the shared build: key -> (sig_width, exp_width, max_bits, latency[,
#: fixed_range]).
UNITS = {
    # float32 significands (sig_width >= max_bits + 2: every sticky input rounds correctly).
    "q16": (24, 10, 16, 1),
    # float16 significands: sticky inputs with 10 <= exp <= 16 are truncated (documented).
    "f16": (11, 6, 16, 0),
    # A float32 divider's quotient.
    "wide": (56, 10, 16, 5),
    # int32 outputs from 64-bit significands (allowed, not needed by the accelerator).
    "i32": (64, 13, 32, 1),
    # Small enough to try every input, bits, signed and zero point.
    "tiny": (4, 4, 4, 3),
    # One range built as constants (a lane with one integer output type): bits / signed
    # ignored.
    "s8": (24, 10, 8, 5, (8, True)),
    "u4": (24, 10, 8, 5, (4, False)),
}


def make_unit(key: str) -> FloatToInt:
    sig_width, exp_width, max_bits, latency, *fixed = UNITS[key]
    return FloatToInt(sig_width=sig_width, exp_width=exp_width, max_bits=max_bits,
                      latency=latency, fixed_range=fixed[0] if fixed else None)


@pytest.fixture(scope="module")
def bank() -> tuple[VectorSim, dict[str, FloatToInt]]:
    units = {key: make_unit(key) for key in UNITS}
    return VectorSim(ComponentBank(units), name="float_to_int_bank"), units


# ---------------------------------------------------------------------------------------------
# Reference


def int_range(bits, signed, max_bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """qmin, qmax (int64) and the effective width of each (bits, signed); bits outside
    [2, max_bits] act as the nearer end."""
    b = np.clip(np.asarray(bits, np.int64), 2, max_bits)
    s = np.asarray(signed).astype(bool)
    qmin = np.where(s, -(np.int64(1) << (b - 1)), 0)
    qmax = np.where(s, (np.int64(1) << (b - 1)) - 1, (np.int64(1) << b) - 1)
    return qmin, qmax, b


def expected(v: np.ndarray, zp, bits, signed, max_bits: int) -> tuple[np.ndarray, np.ndarray]:
    """``code`` and ``clipped``: np.clip(np.rint(v) + zp, qmin, qmax) in float64, NaN -> qmin."""
    qmin, qmax, b = int_range(bits, signed, max_bits)
    with np.errstate(invalid="ignore", over="ignore"):
        t = np.rint(v) + np.asarray(zp, np.float64)
        y = np.clip(t, qmin, qmax)
    nan = np.isnan(v)
    y = np.where(nan, qmin, y).astype(np.int64)
    clipped = nan | (t < qmin) | (t > qmax)
    return y & ((np.int64(1) << b) - 1), clipped


def exact_result(w: dict, k: int, width: int, delta: Fraction, zp: int, bits: int,
                 signed: bool, max_bits: int) -> int:
    """The code for a finite wide float ``k`` of ``w`` whose value is ``sig * u + delta * u``
    (``delta`` in [0, 1)), by exact rational round-half-even."""
    sig, exp, sign = int(w["sig"][k]), int(w["exp"][k]), int(w["sign"][k])
    shift = exp - width + 1
    u = Fraction(1 << shift) if shift >= 0 else Fraction(1, 1 << -shift)
    mag = (sig + delta) * u
    n, rem = divmod(mag, 1)
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and n % 2):
        n += 1
    qmin, qmax, b = (int(a) for a in int_range(bits, signed, max_bits))
    y = min(max((-n if sign else n) + zp, qmin), qmax)
    return y & ((1 << b) - 1)


# ---------------------------------------------------------------------------------------------
# Running and checking


def run_unit(bank, key: str, w, zp, bits, signed) -> tuple[np.ndarray, np.ndarray]:
    """``w``: a dict of fields or its joined bit patterns."""
    sim, units = bank
    unit = units[key]
    if isinstance(w, dict):
        w = join_fields(w, wide_float_layout(unit.sig_width, unit.exp_width))
    out = sim.run({f"i_{key}": w, f"zero_point_{key}": zp, f"bits_{key}": bits,
                   f"signed_{key}": signed}, latency=unit.latency,
                  outputs=[f"code_{key}", f"clipped_{key}"])
    return out[f"code_{key}"].astype(np.int64), out[f"clipped_{key}"].astype(bool)


def check(bank, key: str, w: dict, zp, bits, signed, v: np.ndarray | None = None,
          joined: np.ndarray | None = None) -> int:
    """Run ``w`` (optionally pre-joined; ``v`` its float64 values) on unit ``key`` with the
    given zero points, bits and signedness (scalars or arrays); compare with the reference."""
    unit = bank[1][key]
    if v is None:
        v = round_to_odd_53(w, unit.sig_width)
    code, clipped = run_unit(bank, key, w if joined is None else joined, zp, bits, signed)
    want, want_clipped = expected(v, zp, bits, signed, unit.max_bits)
    bad = np.flatnonzero((code != want) | (clipped != want_clipped))
    if bad.size:
        n = v.size
        zpa, ba, sa = (np.broadcast_to(np.asarray(a), (n,)) for a in (zp, bits, signed))
        base = w["sig"].size
        raise AssertionError(
            f"{key}: {bad.size} of {n} wrong, first: " + "; ".join(
                f"{describe(w, k % base)} v={v[k]!r} zp={int(zpa[k])} bits={int(ba[k])} "
                f"signed={int(sa[k])}: code {int(code[k]):#x} clipped {int(clipped[k])}, want "
                f"{int(want[k]):#x} {int(want_clipped[k])}" for k in bad[:4]))
    return v.size


def zero_points(qmin: int, qmax: int, max_bits: int, rng) -> np.ndarray:
    """Zero points for one range: 0, ±1, the range ends, the ends of the zero point's shape
    and two random ones."""
    lo, hi = -(1 << max_bits), (1 << max_bits) - 1
    return np.array([0, 1, -1, qmin, qmax, lo, hi, *rng.integers(lo, hi + 1, 2)], np.int64)


def check_combinations(bank, key: str, w: dict, copies: np.ndarray) -> int:
    """``w`` through every (bits 2..max_bits, signed). Input ``i`` runs ``copies[i]`` times per
    combination, copy ``r`` with zero point ``(i + r + c) % 9`` of :func:`zero_points` in
    combination ``c``, so every input meets several zero points and each combination all
    nine."""
    unit = bank[1][key]
    idx = np.repeat(np.arange(copies.size), copies)
    rank = np.arange(idx.size) - np.repeat(np.cumsum(copies) - copies, copies)  # r of each copy
    w = {k: a[idx] for k, a in w.items()}
    v = round_to_odd_53(w, unit.sig_width)
    joined = join_fields(w, wide_float_layout(unit.sig_width, unit.exp_width))
    rng = np.random.default_rng(7)
    total = 0
    for bits in range(2, unit.max_bits + 1):
        for signed in (False, True):
            c = 2 * bits + signed
            qmin, qmax, _ = (int(a) for a in int_range(bits, signed, unit.max_bits))
            zps = zero_points(qmin, qmax, unit.max_bits, rng)
            zp = zps[(idx + rank + c) % zps.size]
            total += check(bank, key, w, zp, bits, signed, v=v, joined=joined)
    return total


# ---------------------------------------------------------------------------------------------
# Inputs


def float16_values(width: int) -> dict:
    """Every float16 code's value (infinities and NaNs included) as a wide float."""
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float64)
    return wide_from_float64(x, width)


def tie_grid(width: int, exp_width: int, max_bits: int) -> dict:
    """Half-integers in [-300, 300]; ±(2**k + d) for k up to max_bits + 3 and d in
    -2 .. 2 by halves (the range ends of every width and zero point); each exact, one unit of
    the last place below and above, with the sticky bit; the ends of the exponent field,
    zeros, infinities and NaNs (:func:`specials`)."""
    x = np.arange(-600, 601) / 2
    k = np.arange(max_bits + 4)[:, None]
    d = np.arange(-4, 5)[None, :] / 2
    x = np.concatenate([x, (2.0 ** k + d).ravel()])
    frac, _ = np.frexp(x)
    x = x[(x != 0) & (np.ldexp(frac, width) % 1 == 0)]          # representable in width bits
    w = wide_from_float64(np.concatenate([x, -x]), width)
    w = concat(w, step(w, width, False), step(w, width, True))
    return concat(w, with_sticky(w), specials(width, exp_width, n_exp=64))


def random_wide(n: int, width: int, exp_lo: int, exp_hi: int, seed: int) -> dict:
    """``n`` random finite wide floats, exponents uniform in [exp_lo, exp_hi]. The bits below
    the half place: a quarter exact ties (sticky 0), a quarter just below a tie, a quarter just
    above, the rest random (sticky random)."""
    rng = np.random.default_rng(seed)
    top = np.uint64(1 << (width - 1))
    sig = rng.integers(0, 2**64, n, dtype=np.uint64, endpoint=False) >> np.uint64(64 - width)
    sig |= top
    exp = rng.integers(exp_lo, exp_hi, n, endpoint=True)
    sticky = rng.integers(0, 2, n, dtype=np.uint64)
    p = width - 2 - exp                                   # position of the half bit in sig
    ok = (p >= 0) & (p < width - 1)
    pc = np.clip(p, 0, 63).astype(np.uint64)
    half = np.uint64(1) << pc
    below = half - np.uint64(1)
    kind = rng.integers(0, 4, n)
    s = np.where(kind == 0, (sig | half) & ~below, sig)                       # tie
    s = np.where(kind == 1, (s & ~half) | below, s)                           # just below
    s = np.where(kind == 2, (s | half) & ~below, s)                           # just above
    sig = np.where(ok, s, sig)
    sticky = np.where(ok & (kind == 0), 0, np.where(ok & (kind == 2), 1, sticky))
    return {"sign": rng.integers(0, 2, n, dtype=np.uint64), "exp": exp, "sig": sig,
            "sticky": sticky.astype(np.uint64), "cls": np.full(n, NORM, np.uint64)}


def random_controls(n: int, max_bits: int, seed: int) -> tuple[np.ndarray, ...]:
    """Random (zero point, bits, signed) per vector: bits mostly in [2, max_bits], a few
    outside; zero points half within the selected range, half anywhere in their shape."""
    rng = np.random.default_rng(seed)
    bits_w = max_bits.bit_length()
    bits = rng.integers(2, max_bits + 1, n)
    odd = rng.random(n) < 0.05
    bits = np.where(odd, rng.integers(0, 1 << bits_w, n), bits)
    signed = rng.integers(0, 2, n)
    qmin, qmax, _ = int_range(bits, signed, max_bits)
    lo, hi = -(1 << max_bits), (1 << max_bits) - 1
    zp = np.where(rng.random(n) < 0.5,
                  qmin + (rng.random(n) * (qmax - qmin + 1)).astype(np.int64),
                  rng.integers(lo, hi + 1, n))
    return zp, bits, signed


# ---------------------------------------------------------------------------------------------
# Verilator tests


@pytest.mark.sim
@requires_verilator
@pytest.mark.parametrize("key", ["q16", "f16", "wide"])
def test_float_to_int_float16_and_ties(bank, key):
    """Every float16 value (one zero point each per combination) and the tie grid (three) through
    every (bits, signed) combination."""
    unit = bank[1][key]
    f16 = float16_values(unit.sig_width)
    grid = tie_grid(unit.sig_width, unit.exp_width, unit.max_bits)
    copies = np.concatenate([np.ones(f16["sig"].size, np.int64),
                             np.full(grid["sig"].size, 3)])
    total = check_combinations(bank, key, concat(f16, grid), copies)
    assert total == 2 * (unit.max_bits - 1) * int(copies.sum())


@pytest.mark.sim
@requires_verilator
@pytest.mark.parametrize(("key", "n"), [("q16", 1_050_000), ("wide", 300_000),
                                        ("i32", 300_000)])
def test_float_to_int_random(bank, key, n):
    """Random wide floats over the float32 exponent range (half of them where results do not
    saturate), with random bits, signed and zero point per vector."""
    unit = bank[1][key]
    W, mb = unit.sig_width, unit.max_bits
    w = concat(random_wide(n // 2, W, -3, mb + 2, seed=1),
               random_wide(n - n // 2, W, -149, 127, seed=2),
               specials(W, unit.exp_width, n_exp=200))
    zp, bits, signed = random_controls(w["sig"].size, mb, seed=3)
    assert check(bank, key, w, zp, bits, signed) >= n


@pytest.mark.sim
@requires_verilator
@pytest.mark.parametrize("key", ["s8", "u4"])
def test_float_to_int_fixed_range(bank, key):
    """A unit built for one range: random wide floats (half where results do not saturate)
    with random bits and signed inputs, which it ignores, give that range's results."""
    unit = bank[1][key]
    fixed_bits, fixed_signed = UNITS[key][4]
    W, mb = unit.sig_width, unit.max_bits
    w = concat(random_wide(100_000, W, -3, mb + 2, seed=4),
               random_wide(100_000, W, -149, 127, seed=5),
               specials(W, unit.exp_width, n_exp=200))
    zp, bits, signed = random_controls(w["sig"].size, mb, seed=6)
    code, clipped = run_unit(bank, key, w, zp, bits, signed)
    want, want_clipped = expected(round_to_odd_53(w, W), zp, fixed_bits, fixed_signed, mb)
    assert np.array_equal(code, want) and np.array_equal(clipped, want_clipped)
    assert clipped.any() and not clipped.all()


@pytest.mark.sim
@requires_verilator
def test_float_to_int_tiny_every_input(bank):
    """The 4-bit unit: every input pattern with a valid class (normalised or zero sig), every
    bits input (0..7: out-of-range ones act as 2 or 4), signed, and every zero point."""
    sig = np.concatenate([[0], np.arange(8, 16)]).astype(np.uint64)
    sign, exp, sig, sticky, cls = (a.ravel() for a in np.meshgrid(
        np.arange(2), np.arange(-8, 8), sig, np.arange(2), np.arange(5), indexing="ij"))
    keep = ~(((cls == NORM) | (cls == SUB)) & (sig == 0))
    w = {"sign": sign[keep].astype(np.uint64), "exp": exp[keep], "sig": sig[keep],
         "sticky": sticky[keep].astype(np.uint64), "cls": cls[keep].astype(np.uint64)}
    n = w["sig"].size
    zp, bits, signed = (a.ravel() for a in np.meshgrid(np.arange(-16, 16), np.arange(8),
                                                       np.arange(2), indexing="ij"))
    m = zp.size
    ww = {k: np.tile(a, m) for k, a in w.items()}
    total = check(bank, "tiny", ww, np.repeat(zp, n), np.repeat(bits, n), np.repeat(signed, n))
    assert total == n * 512 > 1_000_000


@pytest.mark.sim
@requires_verilator
@pytest.mark.parametrize("key", ["q16", "f16", "wide", "i32", "tiny"])
def test_float_to_int_sticky_exact(bank, key):
    """Sticky inputs against exact rational rounding of values ``(sig + delta) * u`` for random
    ``delta`` in (0, 1): correct whenever ``exp <= sig_width - 2`` or ``exp >= max_bits + 1``
    (so always when ``sig_width >= max_bits + 2``); otherwise the unit returns ``sig * u``,
    which the exact rounding contradicts for some ``delta > 1/2``."""
    unit = bank[1][key]
    W, mb = unit.sig_width, unit.max_bits
    rng = np.random.default_rng(11)
    n = 6000
    w = random_wide(n, W, -3, mb + 3, seed=12)
    w["sticky"] = np.ones(n, np.uint64)
    zp, bits, signed = random_controls(n, mb, seed=13)
    code, _ = run_unit(bank, key, w, zp, bits, signed)
    deltas = rng.integers(1, 1024, n)
    exp = w["exp"]
    sure = (exp <= W - 2) | (exp >= mb + 1)
    assert sure.all() == (W >= mb + 2)
    wrong_exact = 0
    for k in range(n):
        args = (int(zp[k]), int(bits[k]), bool(signed[k]), mb)
        want = exact_result(w, k, W, Fraction(int(deltas[k]), 1024), *args)
        if sure[k]:
            assert code[k] == want, f"{key}: {describe(w, k)}, delta {deltas[k]}/1024: " \
                                    f"{int(code[k]):#x} != {want:#x}"
        else:
            assert code[k] == exact_result(w, k, W, Fraction(0), *args), describe(w, k)
            wrong_exact += code[k] != want
    if not sure.all():
        assert wrong_exact > 0


# ---------------------------------------------------------------------------------------------
# References checked against each other (no simulator)


def test_reference_matches_exact_rounding():
    """round_to_odd_53 + np.rint + np.clip agrees with exact rational rounding on random 64-bit
    significands (ties, near-ties, sticky bits) up to beyond int32 saturation."""
    w = concat(random_wide(4000, 64, -3, 36, seed=21), random_wide(1000, 24, -3, 20, seed=22))
    zp, bits, signed = random_controls(5000, 32, seed=23)
    v = np.concatenate([round_to_odd_53({k: a[:4000] for k, a in w.items()}, 64),
                        round_to_odd_53({k: a[4000:] for k, a in w.items()}, 24)])
    code, _ = expected(v, zp, bits, signed, 32)
    for k in range(5000):
        width = 64 if k < 4000 else 24
        # A sticky bit stands for any fraction below the half place when there is one: half.
        half = Fraction(1, 2) if w["sticky"][k] and int(w["exp"][k]) <= width - 2 else 0
        want = exact_result(w, k, width, half, int(zp[k]), int(bits[k]), bool(signed[k]), 32)
        assert code[k] == want, describe(w, k)


def test_reference_pins():
    """Hand-worked cases: ties to even, NaN to qmin, saturation, bits clamping, code masking."""
    v = np.array([2.5, 3.5, -2.5, np.nan, np.inf, -np.inf, 1e30, -0.5, 127.5, -129.0])
    code, clipped = expected(v, 0, 8, 1, 16)
    assert code.tolist() == [2, 4, 0xFE, 0x80, 0x7F, 0x80, 0x7F, 0, 0x7F, 0x80]
    assert clipped.tolist() == [0, 0, 0, 1, 1, 1, 1, 0, 1, 1]
    code, _ = expected(np.array([300.0, -1.0]), 10, 1, 0, 16)      # bits 1 acts as 2
    assert code.tolist() == [3, 3]
    code, _ = expected(np.array([5.0]), -65536, 20, 0, 16)         # bits 20 acts as 16
    assert code.tolist() == [0]


# ---------------------------------------------------------------------------------------------
# Amaranth simulator: latency


@pytest.mark.parametrize("latency", [0, 1, 2, 3, 4, 5])
def test_float_to_int_latency(latency):
    dut = FloatToInt(sig_width=8, exp_width=6, max_bits=8, latency=latency)
    assert dut.latency == latency and dut.max_bits == 8
    x = np.array([2.5, -3.5, 200.0, np.nan, -0.0, 0.75, -200.0, 2.0 ** 30])
    w = wide_from_float64(x, 8)
    bits_in = join_fields(w, wide_float_layout(8, 6))
    controls = [(3, 8, 1), (0, 8, 1), (-60, 8, 0), (5, 4, 1), (1, 8, 0), (0, 2, 1),
                (0, 8, 1), (0, 6, 0)]
    zp, bits, signed = (np.array(c) for c in zip(*controls, strict=True))
    want, want_clipped = expected(x, zp, bits, signed, 8)
    seen = []

    async def testbench(ctx):
        for k in range(len(x) + latency):
            j = min(k, len(x) - 1)
            ctx.set(dut.i.as_value(), int(bits_in[j]))
            ctx.set(dut.zero_point, int(zp[j]))
            ctx.set(dut.bits, int(bits[j]))
            ctx.set(dut.signed, int(signed[j]))
            seen.append((ctx.get(dut.code), ctx.get(dut.clipped)))
            if latency:
                await ctx.tick()

    sim = Simulator(dut)
    if latency:
        sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    assert seen[latency:] == list(zip(want.tolist(), want_clipped.astype(int).tolist(),
                                      strict=True))
    with pytest.raises(AttributeError):
        dut.latency = 0


def test_float_to_int_members():
    dut = make_unit("q16")
    members = dut.signature.members
    assert members["i"].shape == wide_float_layout(24, 10)
    assert members["zero_point"].shape.width == 17 and members["zero_point"].shape.signed
    assert members["bits"].shape.width == 5 and not members["bits"].shape.signed
    assert members["signed"].shape == 1 and members["clipped"].shape == 1
    assert members["code"].shape.width == 16
    assert (dut.sig_width, dut.exp_width, dut.max_bits, dut.latency) == (24, 10, 16, 1)
    assert FloatToInt(sig_width=24, exp_width=10).latency == 1
    assert make_unit("i32").signature.members["zero_point"].shape.width == 33


# ---------------------------------------------------------------------------------------------
# Parameter errors


def test_float_to_int_sig_width():
    with pytest.raises(ValueError, match=r"sig_width must be in \[1, 256\], not 0"):
        FloatToInt(sig_width=0, exp_width=8)
    with pytest.raises(TypeError, match=r"sig_width must be an integer, not 24.0"):
        FloatToInt(sig_width=24.0, exp_width=8)


def test_float_to_int_exp_width():
    with pytest.raises(ValueError, match=r"exp_width must be in \[2, 32\], not 33"):
        FloatToInt(sig_width=24, exp_width=33)
    with pytest.raises(TypeError, match=r"exp_width must be an integer, not None"):
        FloatToInt(sig_width=24, exp_width=None)


def test_float_to_int_max_bits():
    with pytest.raises(ValueError, match=r"max_bits must be in \[2, 32\], not 1"):
        FloatToInt(sig_width=24, exp_width=8, max_bits=1)
    with pytest.raises(ValueError, match=r"max_bits must be in \[2, 32\], not 33"):
        FloatToInt(sig_width=24, exp_width=8, max_bits=33)
    with pytest.raises(TypeError, match=r"max_bits must be an integer, not '16'"):
        FloatToInt(sig_width=24, exp_width=8, max_bits="16")


def test_float_to_int_fixed_range_value():
    with pytest.raises(ValueError, match=r"fixed_range bits must be in \[2, 8\], not 9"):
        FloatToInt(sig_width=24, exp_width=8, max_bits=8, fixed_range=(9, True))
    with pytest.raises(TypeError, match=r"fixed_range signed must be a bool, not 1"):
        FloatToInt(sig_width=24, exp_width=8, fixed_range=(8, 1))
    with pytest.raises(TypeError, match=r"fixed_range must be a \(bits, signed\) tuple"):
        FloatToInt(sig_width=24, exp_width=8, fixed_range=8)


def test_float_to_int_latency_value():
    with pytest.raises(ValueError, match=r"latency must be in \[0, 5\], not 6"):
        FloatToInt(sig_width=24, exp_width=8, latency=6)
    with pytest.raises(TypeError, match=r"latency must be an integer, not False"):
        FloatToInt(sig_width=24, exp_width=8, latency=False)

