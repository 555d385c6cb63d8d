# amaranth: UnusedElaboratable=no
"""IntToFloat through Verilator (qaccel.sim.vectors): every input of every width up to 16,
signed and unsigned, and >= 1M random int32 / 200k int64 patterns with the extremes, against
NumPy (the value equals float64(x), exactly) and the exact integer fields; latency in
Amaranth's simulator; parameter errors."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.sim import Simulator

from qaccel.rtl.arith.int_to_float import IntToFloat, min_exp_width
from qaccel.rtl.arith.wide_float import wide_float_layout
from qaccel.sim.runner import missing_simulator
from qaccel.sim.vectors import ComponentBank, VectorSim, split_fields

from ..wide_np import NORM, ZERO

requires_verilator = pytest.mark.skipif(missing_simulator("verilator") is not None,
                                        reason=missing_simulator("verilator") or "")

#: The units of the shared build: key -> (width, exp_width, latency). Widths 2..16 with the
#: narrowest exponent field, half of them combinational; int32 / int64 as the Quantize unit
#: needs them; a 24-bit one with a wide exponent field.
UNITS = {f"w{w}": (w, min_exp_width(w), w % 4) for w in range(2, 17)} | {
    "w32": (32, 6, 3),
    "w64": (64, 7, 1),
    "w24": (24, 12, 0),
}


def make_unit(key: str) -> IntToFloat:
    width, exp_width, latency = UNITS[key]
    return IntToFloat(width=width, exp_width=exp_width, latency=latency)


@pytest.fixture(scope="module")
def bank() -> tuple[VectorSim, dict[str, IntToFloat]]:
    units = {key: make_unit(key) for key in UNITS}
    return VectorSim(ComponentBank(units), name="int_to_float_bank"), units


def bit_length(a: np.ndarray) -> np.ndarray:
    """Bit length of each uint64 (exact for all 64 bits, unlike frexp)."""
    n = np.zeros(a.shape, np.int64)
    for k in range(64):
        n += (a >> np.uint64(k)) != 0
    return n


def reference(codes: np.ndarray, width: int, signed: bool) -> dict:
    """The exact wide float of each ``width``-bit pattern (uint64): integer arithmetic only."""
    c = codes.astype(np.uint64)
    neg = (c >> np.uint64(width - 1)).astype(bool) & signed
    full = np.uint64((1 << width) - 1) if width < 64 else np.uint64(2**64 - 1)
    mag = np.where(neg, (~c + np.uint64(1)) & full, c)
    exp = bit_length(mag) - 1
    shift = np.where(mag == 0, 0, width - 1 - exp).astype(np.uint64)
    return {"sign": neg.astype(np.uint64), "exp": np.where(mag == 0, 0, exp),
            "sig": mag << shift, "sticky": np.zeros_like(c), "cls": np.where(mag == 0, ZERO, NORM)}


def as_ints(codes: np.ndarray, width: int, signed: bool) -> np.ndarray:
    """The patterns as NumPy integers (int64 / uint64) of the right signedness."""
    c = codes.astype(np.uint64)
    if not signed:
        return c
    if width == 64:
        return c.view(np.int64)
    v = c.astype(np.int64)
    return np.where(v >= 1 << (width - 1), v - (1 << width), v)


def check(bank, key: str, codes: np.ndarray, signed: bool) -> int:
    sim, units = bank
    unit = units[key]
    w = unit.width
    out = sim.run({f"i_{key}": codes, f"signed_{key}": int(signed)}, latency=unit.latency,
                  outputs=[f"o_{key}"])[f"o_{key}"]
    got = split_fields(out, wide_float_layout(w, unit.exp_width))
    want = reference(codes, w, signed)
    for field in ("cls", "sign", "exp", "sig", "sticky"):
        bad = np.flatnonzero(got[field].astype(np.int64) != want[field].astype(np.int64))
        assert not bad.size, (
            f"{key} signed={int(signed)}: {bad.size} of {codes.size} wrong {field}, first: "
            + ", ".join(f"{int(codes[k]):#x}: {int(got[field][k]):#x} (want "
                        f"{int(want[field][k]):#x})" for k in bad[:4]))
    # The value the fields stand for is float64(x): exact for every width here up to 53 bits,
    # and for 64 bits on the patterns float64 holds exactly.
    x = as_ints(codes, w, signed)
    drop = max(0, w - 53)
    sig = got["sig"]
    mag = np.ldexp((sig >> np.uint64(drop)).astype(np.float64), got["exp"] - min(w, 53) + 1)
    value = np.where(got["sign"] != 0, -mag, mag)
    keep = (sig & np.uint64((1 << drop) - 1)) == 0
    assert np.mean(keep) > 0.25
    np.testing.assert_array_equal(value[keep], x[keep].astype(np.float64))
    assert not np.any(np.signbit(value) & (x == 0)), "zero must be +0"
    return codes.size


@pytest.mark.sim
@requires_verilator
@pytest.mark.parametrize("width", range(2, 17))
def test_int_to_float_exhaustive(bank, width):
    """Every pattern of every width up to 16, read as signed and as unsigned."""
    codes = np.arange(1 << width, dtype=np.uint64)
    for signed in (False, True):
        check(bank, f"w{width}", codes, signed)


def extremes(width: int) -> np.ndarray:
    """0, ±1, powers of two and their neighbours, the ends of both ranges (as patterns)."""
    mask = (1 << width) - 1
    vals = {0, 1, mask, mask - 1, 1 << (width - 1), (1 << (width - 1)) - 1,
            (1 << (width - 1)) + 1}
    for k in range(width):
        for d in (-1, 0, 1):
            vals.add(((1 << k) + d) & mask)
            vals.add((-(1 << k) + d) & mask)
    return np.array(sorted(vals), dtype=np.uint64)


def random_codes(width: int, n: int, seed: int) -> np.ndarray:
    """``n`` random patterns: a third uniform, the rest with a random bit length (so every
    exponent is well covered), plus :func:`extremes`."""
    rng = np.random.default_rng(seed)
    full = np.uint64(2**64 - 1) >> np.uint64(64 - width)
    c = rng.integers(0, 2**64, n, dtype=np.uint64, endpoint=False) & full
    length = rng.integers(0, width + 1, n - n // 3).astype(np.uint64)
    keep = np.where(length == 64, np.uint64(2**64 - 1),
                    (np.uint64(1) << np.minimum(length, 63)) - np.uint64(1))
    c[n // 3:] &= keep
    neg = rng.integers(0, 2, n - n // 3).astype(bool)
    c[n // 3:] = np.where(neg, (~c[n // 3:] + np.uint64(1)) & full, c[n // 3:])
    return np.concatenate([extremes(width), c])


@pytest.mark.sim
@requires_verilator
def test_int_to_float_int32_random(bank):
    """>= 1M random int32 / uint32 patterns and the extremes (-2**31 included)."""
    codes = random_codes(32, 1_050_000, seed=1)
    assert codes.size >= 1_000_000
    assert 0x80000000 in codes and 0x7FFFFFFF in codes and 0xFFFFFFFF in codes
    for signed in (False, True):
        check(bank, "w32", codes, signed)


@pytest.mark.sim
@requires_verilator
@pytest.mark.parametrize(("key", "n"), [("w64", 200_000), ("w24", 200_000)])
def test_int_to_float_wide_random(bank, key, n):
    """Random int64 / uint64 patterns (and 24-bit ones on a unit with a 12-bit exponent)."""
    codes = random_codes(bank[1][key].width, n, seed=2)
    for signed in (False, True):
        check(bank, key, codes, signed)


def test_reference_pins():
    """The reference on hand-worked cases, -2**63 and 2**64 - 1 included."""
    r = reference(np.array([0, 1, 6, 2**63, 2**64 - 1], np.uint64), 64, True)
    assert r["sign"].tolist() == [0, 0, 0, 1, 1]
    assert r["exp"].tolist() == [0, 0, 2, 63, 0]
    assert r["sig"].tolist() == [0, 2**63, 3 << 62, 2**63, 2**63]
    r = reference(np.array([2**64 - 1, 2], np.uint64), 64, False)
    assert r["exp"].tolist() == [63, 1] and r["sig"].tolist() == [2**64 - 1, 2**63]


# ---------------------------------------------------------------------------------------------
# Amaranth simulator: latency


@pytest.mark.parametrize("latency", [0, 1, 2, 3])
def test_int_to_float_latency(latency):
    dut = IntToFloat(width=8, exp_width=4, latency=latency)
    assert dut.latency == latency and dut.width == 8 and dut.exp_width == 4
    codes = [0x00, 0x01, 0x80, 0xFF, 0x06, 0x7F, 0x80]
    signs = [1, 1, 1, 1, 0, 0, 0]
    want = [reference(np.array([c], np.uint64), 8, bool(s)) for c, s in zip(codes, signs,
                                                                            strict=True)]
    seen = []

    async def testbench(ctx):
        for k in range(len(codes) + latency):
            j = min(k, len(codes) - 1)
            ctx.set(dut.i, codes[j])
            ctx.set(dut.signed, signs[j])
            o = ctx.get(dut.o)
            seen.append((o.sign, o.exp, o.sig, o.cls.value))
            if latency:
                await ctx.tick()

    sim = Simulator(dut)
    if latency:
        sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    expect = [(int(r["sign"][0]), int(r["exp"][0]), int(r["sig"][0]), int(r["cls"][0]))
              for r in want]
    assert seen[latency:] == expect
    with pytest.raises(AttributeError):
        dut.latency = 0


def test_int_to_float_members():
    dut = make_unit("w32")
    members = dut.signature.members
    assert members["i"].shape.width == 32 and not members["i"].shape.signed
    assert members["signed"].shape == 1
    assert members["o"].shape == wide_float_layout(32, 6)
    assert min_exp_width(2) == 2 and min_exp_width(16) == 5 and min_exp_width(64) == 7
    assert min_exp_width(33) == 7


# ---------------------------------------------------------------------------------------------
# Parameter errors


def test_int_to_float_width():
    with pytest.raises(ValueError, match=r"width must be in \[2, 64\], not 1"):
        IntToFloat(width=1, exp_width=4)
    with pytest.raises(ValueError, match=r"width must be in \[2, 64\], not 65"):
        IntToFloat(width=65, exp_width=8)
    with pytest.raises(TypeError, match=r"width must be an integer, not 8.0"):
        IntToFloat(width=8.0, exp_width=4)


def test_int_to_float_exp_width():
    with pytest.raises(ValueError, match=r"exp_width must be in \[6, 32\] for width 32, "
                                         r"not 5"):
        IntToFloat(width=32, exp_width=5)
    with pytest.raises(ValueError, match=r"exp_width must be in \[4, 32\] for width 8, not 33"):
        IntToFloat(width=8, exp_width=33)
    with pytest.raises(TypeError, match=r"exp_width must be an integer, not None"):
        IntToFloat(width=8, exp_width=None)


def test_int_to_float_latency_value():
    with pytest.raises(ValueError, match=r"latency must be in \[0, 3\], not 4"):
        IntToFloat(width=8, exp_width=4, latency=4)
    with pytest.raises(TypeError, match=r"latency must be an integer, not True"):
        IntToFloat(width=8, exp_width=4, latency=True)
