# amaranth: UnusedElaboratable=no
"""Decode through Verilator (qaccel.sim.vectors): every code of every float16 / bfloat16 /
float8 / float4 / int2..int16 / uint2..uint16 type (with junk above the type's bits), >= 1M
random float32 codes (subnormals, infinities, NaN payloads, -0) and int32 codes, against the
values, signs and classes NumPy / ml_dtypes give for the codes, and against the exact fields
FloatRound's ``value`` output holds for them; latency in Amaranth's simulator; parameter
errors."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from amaranth.sim import Simulator

from qaccel.model.dtypes import E8M0 as E8M0_DTYPE
from qaccel.model.dtypes import QTYPES
from qaccel.model.floatfmt import FORMATS, FloatFormat
from qaccel.rtl.arith.decode import (
    E8M0,
    INT_TYPES,
    Decode,
    PowerOfTwoFormat,
    decode_type,
    min_exp_width,
    min_sig_width,
)
from qaccel.rtl.arith.wide_float import wide_float_layout
from qaccel.sim.runner import missing_simulator
from qaccel.sim.vectors import ComponentBank, VectorSim, split_fields

from ..wide_np import INF, NAN, NORM, SUB, ZERO, value_fields

requires_verilator = pytest.mark.skipif(missing_simulator("verilator") is not None,
                                        reason=missing_simulator("verilator") or "")

FP8 = ("float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz", "float4e2m1")
SMALL_FLOATS = ("float16", "bfloat16", *FP8, "float8e8m0")
SMALL_INTS = tuple(t for t in INT_TYPES if QTYPES[t].bits <= 16)
ALL = ("float32", *SMALL_FLOATS, *INT_TYPES)

#: The units of the shared build: key -> (types, sig_width, exp_width, latency).
UNITS = {
    # Every type but float64, the narrowest fields.
    "all": (ALL, 32, 9, 4),
    # The Quantize unit's x / scale inputs, combinational, a wider significand.
    "q": (("float32", "float16", "bfloat16", "int32", "float8e8m0"), 40, 10, 0),
    # The Dequantize unit's inputs: every integer type up to 16 bits, float8 and float4.
    "dq": ((*SMALL_INTS, *FP8), 16, 6, 2),
    # float64 is allowed.
    "f64": (("int8", "float64"), 53, 12, 1),
}


def make_unit(key: str) -> Decode:
    types, sig_width, exp_width, latency = UNITS[key]
    return Decode(types, sig_width=sig_width, exp_width=exp_width, latency=latency)


@pytest.fixture(scope="module")
def bank() -> tuple[VectorSim, dict[str, Decode]]:
    units = {key: make_unit(key) for key in UNITS}
    return VectorSim(ComponentBank(units), name="decode_bank"), units


# ---------------------------------------------------------------------------------------------
# References


def numpy_values(name: str, codes: np.ndarray) -> np.ndarray:
    """What NumPy / ml_dtypes give for the codes, as float64 (NaNs keep their sign)."""
    t = decode_type(name)
    if isinstance(t, PowerOfTwoFormat):
        return codes.astype(np.uint8).view(E8M0_DTYPE).astype(np.float64)
    if isinstance(t, FloatFormat):
        c = codes.astype(t.code_dtype)
        with np.errstate(invalid="ignore"):
            return c.view(t.dtype).astype(np.float64)
    storage = {8: np.uint8, 16: np.uint16, 32: np.uint32}[max(8, 1 << (t.bits - 1).bit_length())]
    return codes.astype(storage).view(t.dtype).astype(np.float64)


def numpy_classes(name: str, x: np.ndarray) -> np.ndarray:
    """ZERO / SUBNORMAL / NORMAL / INF / NAN of float64 values of type ``name``."""
    t = decode_type(name)
    tiny = ml_dtypes.finfo(t.dtype).smallest_normal if isinstance(t, FloatFormat) else 0
    a = np.abs(x)
    with np.errstate(invalid="ignore"):
        return np.select([np.isnan(x), np.isinf(x), a == 0, a < tiny],
                         [NAN, INF, ZERO, SUB], NORM).astype(np.uint64)


def exact_fields(name: str, codes: np.ndarray, width: int) -> dict:
    """The exact output fields: FloatRound's ``value`` contract for float codes; for integers,
    the magnitude normalised to the top of ``sig`` (+0 for 0)."""
    t = decode_type(name)
    if isinstance(t, FloatFormat):
        return value_fields(t, codes.astype(np.uint64), width)
    if isinstance(t, PowerOfTwoFormat):
        nan = codes == (1 << t.bits) - 1
        zero = np.zeros(codes.shape, np.uint64)
        return {"sign": zero, "exp": np.where(nan, 0, codes.astype(np.int64) - t.bias),
                "sig": np.where(nan, zero, np.uint64(1 << (width - 1))), "sticky": zero,
                "cls": np.where(nan, NAN, NORM).astype(np.uint64)}
    v = numpy_values(name, codes).astype(np.int64)
    mag = np.abs(v).astype(np.uint64)
    exp = np.zeros(v.shape, np.int64)
    for k in range(1, 33):
        exp += (mag >> np.uint64(k)) != 0
    sig = np.where(mag == 0, np.uint64(0), mag << (np.uint64(width - 1) - exp.astype(np.uint64)))
    return {"sign": (v < 0).astype(np.uint64), "exp": exp, "sig": sig,
            "sticky": np.zeros_like(mag), "cls": np.where(mag == 0, ZERO, NORM).astype(np.uint64)}


# ---------------------------------------------------------------------------------------------
# Running and checking


def run_unit(bank, key: str, codes: np.ndarray, fmt) -> dict:
    sim, units = bank
    unit = units[key]
    out = sim.run({f"code_{key}": codes, f"fmt_{key}": fmt}, latency=unit.latency,
                  outputs=[f"o_{key}"])[f"o_{key}"]
    return split_fields(out, wide_float_layout(unit.sig_width, unit.exp_width))


def check(bank, key: str, name: str, codes: np.ndarray, junk: np.ndarray | None = None) -> int:
    """Decode ``codes`` (plus ``junk`` above the type's bits) as ``name`` on unit ``key``."""
    unit = bank[1][key]
    t = decode_type(name)
    width = unit.sig_width
    applied = codes if junk is None else codes | (junk << np.uint64(t.bits))
    got = run_unit(bank, key, applied, unit.index(name))
    want = exact_fields(name, codes, width)
    for field in ("cls", "sign", "exp", "sig", "sticky"):
        bad = np.flatnonzero(got[field].astype(np.int64) != want[field].astype(np.int64))
        assert not bad.size, (
            f"{key} {name}: {bad.size} of {codes.size} wrong {field}, first: "
            + ", ".join(f"{int(applied[k]):#x}: {int(got[field][k]):#x} (want "
                        f"{int(want[field][k]):#x})" for k in bad[:4]))
    # Value, sign and class against NumPy / ml_dtypes (sig has at most 53 significant bits).
    x = numpy_values(name, codes)
    cls = got["cls"]
    np.testing.assert_array_equal(cls, numpy_classes(name, x), err_msg=f"{key} {name}: class")
    finite = (cls == NORM) | (cls == SUB)
    drop = max(0, width - 53)
    mag = np.ldexp((got["sig"] >> np.uint64(drop)).astype(np.float64),
                   got["exp"] - (width - drop) + 1)
    mag = np.where(finite, mag, np.where(cls == INF, np.inf, 0.0))
    value = np.where(got["sign"] != 0, -mag, mag)
    nan = cls == NAN
    np.testing.assert_array_equal(value[~nan], x[~nan], err_msg=f"{key} {name}: value")
    np.testing.assert_array_equal(np.signbit(value[~nan]), np.signbit(x[~nan]),
                                  err_msg=f"{key} {name}: sign")
    # NaNs: the code's sign (NumPy keeps it through the cast; an fnuz NaN is negative).
    np.testing.assert_array_equal(got["sign"][nan].astype(bool), np.signbit(x[nan]),
                                  err_msg=f"{key} {name}: NaN sign")
    top = np.uint64(1 << (width - 1))
    assert np.all((got["sig"][finite] & top) != 0), "finite significands must be normalised"
    return codes.size


def every_code(name: str) -> np.ndarray:
    return np.arange(1 << decode_type(name).bits, dtype=np.uint64)


def junk_for(unit: Decode, name: str, n: int, seed: int) -> np.ndarray:
    """Random bits for the code port above the type's width."""
    spare = unit.signature.members["code"].shape.width - decode_type(name).bits
    rng = np.random.default_rng(seed)
    return rng.integers(0, 1 << spare, n, dtype=np.uint64) if spare else np.zeros(n, np.uint64)


# ---------------------------------------------------------------------------------------------
# Verilator tests


@pytest.mark.sim
@requires_verilator
@pytest.mark.parametrize("name", SMALL_FLOATS + SMALL_INTS)
def test_decode_every_code(bank, name):
    """Every code of the type on the all-types unit, with and without junk above its bits; and
    on the Quantize or Dequantize unit where it carries the type."""
    unit = bank[1]["all"]
    codes = every_code(name)
    check(bank, "all", name, codes)
    check(bank, "all", name, codes, junk_for(unit, name, codes.size, seed=1))
    for key in ("q", "dq"):
        if name in (t.name for t in bank[1][key].types):
            check(bank, key, name, codes, junk_for(bank[1][key], name, codes.size, seed=2))


def float32_codes(n: int, seed: int) -> np.ndarray:
    """``n`` random float32 codes, an eighth subnormal, a sixteenth with the inf/NaN exponent
    (random payloads), both signs, plus zeros, infinities, quiet and signalling NaNs and the
    ends of each range."""
    rng = np.random.default_rng(seed)
    c = rng.integers(0, 2**32, n, dtype=np.uint64)
    k = n // 8
    c[:k] &= np.uint64(0x807FFFFF)                               # subnormal (or zero)
    c[k:k + k // 2] |= np.uint64(0x7F800000)                     # inf / NaN payloads
    edge = [0, 0x80000000, 1, 0x80000001, 0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0xFF7FFFFF,
            0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001,
            0x7FFFFFFF, 0xFFFFFFFF, 0x3F800000, 0xBF800000, 0x00400000]
    return np.concatenate([np.array(edge, np.uint64), c])


def int32_codes(n: int, seed: int) -> np.ndarray:
    """``n`` random int32 patterns with random bit lengths, and the extremes."""
    rng = np.random.default_rng(seed)
    length = rng.integers(0, 33, n).astype(np.uint64)
    c = rng.integers(0, 2**32, n, dtype=np.uint64) & ((np.uint64(1) << length) - np.uint64(1))
    neg = rng.integers(0, 2, n).astype(bool)
    c = np.where(neg, (~c + np.uint64(1)) & np.uint64(0xFFFFFFFF), c)
    edge = [0, 1, 0xFFFFFFFF, 0x80000000, 0x7FFFFFFF, 0x80000001, 0x7FFFFFFE, 0x40000000]
    return np.concatenate([np.array(edge, np.uint64), c])


@pytest.mark.sim
@requires_verilator
@pytest.mark.parametrize("key", ["all", "q"])
def test_decode_float32_random(bank, key):
    """>= 1M random float32 codes on the all-types unit, 300k on the Quantize unit."""
    codes = float32_codes(1_050_000 if key == "all" else 300_000, seed=3)
    assert key != "all" or codes.size >= 1_000_000
    check(bank, key, "float32", codes)


@pytest.mark.sim
@requires_verilator
@pytest.mark.parametrize("key", ["all", "q"])
def test_decode_int32_random(bank, key):
    """>= 1M random int32 codes on the all-types unit, 300k on the Quantize unit."""
    codes = int32_codes(1_050_000 if key == "all" else 300_000, seed=4)
    check(bank, key, "int32", codes)


@pytest.mark.sim
@requires_verilator
def test_decode_float64(bank):
    """Random float64 codes (including subnormal, inf and NaN exponents) and every int8 code on
    a unit carrying float64."""
    rng = np.random.default_rng(5)
    c = rng.integers(0, 2**64, 100_000, dtype=np.uint64)
    c[:10_000] &= np.uint64(0x800FFFFFFFFFFFFF)
    c[10_000:15_000] |= np.uint64(0x7FF0000000000000)
    edge = np.array([0, 1 << 63, 1, 0x7FF0000000000000, 0xFFF0000000000000,
                     0x7FF8000000000000, 0x7FEFFFFFFFFFFFFF, 0x0010000000000000], np.uint64)
    check(bank, "f64", "float64", np.concatenate([edge, c]))
    check(bank, "f64", "int8", every_code("int8"))


@pytest.mark.sim
@requires_verilator
def test_decode_fmt_out_of_range(bank):
    """An ``fmt`` beyond the tuple selects the last type."""
    unit = bank[1]["dq"]
    assert unit.types[-1].name == "float4e2m1"
    codes = every_code("float4e2m1")
    width = unit.signature.members["fmt"].shape.width
    for fmt in (len(unit.types), (1 << width) - 1):
        got = run_unit(bank, "dq", codes, fmt)
        want = exact_fields("float4e2m1", codes, unit.sig_width)
        for field in ("cls", "sign", "exp", "sig"):
            np.testing.assert_array_equal(got[field].astype(np.int64),
                                          want[field].astype(np.int64))


def test_reference_pins():
    """The references on hand-worked codes."""
    x = numpy_values("int4", np.array([0x7, 0x8, 0xF], np.uint64))
    assert x.tolist() == [7.0, -8.0, -1.0]
    f = exact_fields("int4", np.array([0x8, 0x0, 0x3], np.uint64), 8)
    assert f["sign"].tolist() == [1, 0, 0] and f["exp"].tolist() == [3, 0, 1]
    assert f["sig"].tolist() == [0x80, 0, 0xC0]
    x = numpy_values("float8e4m3fnuz", np.array([0x80, 0x00], np.uint64))
    assert np.isnan(x[0]) and np.signbit(x[0]) and x[1] == 0
    x = numpy_values("float8e8m0", np.array([0x00, 0x7F, 0xFE, 0xFF], np.uint64))
    assert x[:3].tolist() == [2.0**-127, 1.0, 2.0**127] and np.isnan(x[3])
    f = exact_fields("float8e8m0", np.array([0x00, 0x80, 0xFF], np.uint64), 8)
    assert f["exp"].tolist() == [-127, 1, 0] and f["sig"].tolist() == [0x80, 0x80, 0]
    assert f["cls"].tolist() == [NORM, NORM, NAN] and decode_type("float8e8m0") is E8M0
    assert numpy_classes("float16", np.array([2.0 ** -15, 2.0 ** -14])).tolist() == [SUB, NORM]


# ---------------------------------------------------------------------------------------------
# Amaranth simulator: latency


@pytest.mark.parametrize("latency", [0, 1, 2, 3, 4])
def test_decode_latency(latency):
    dut = Decode(("float8e4m3fn", "int4"), sig_width=4, exp_width=5, latency=latency)
    assert dut.latency == latency
    inputs = [(0x38, 0), (0x8, 1), (0x7F, 0), (0x1, 0), (0x7, 1), (0x0, 1), (0xC0, 0)]
    expect = []
    for code, fmt in inputs:
        name = dut.types[fmt].name
        f = exact_fields(name, np.array([code], np.uint64), 4)
        expect.append(tuple(int(f[k][0]) for k in ("sign", "exp", "sig", "cls")))
    seen = []

    async def testbench(ctx):
        for k in range(len(inputs) + latency):
            code, fmt = inputs[min(k, len(inputs) - 1)]
            ctx.set(dut.code, code)
            ctx.set(dut.fmt, fmt)
            o = ctx.get(dut.o)
            seen.append((o.sign, o.exp, o.sig, o.cls.value))
            if latency:
                await ctx.tick()

    sim = Simulator(dut)
    if latency:
        sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    assert seen[latency:] == expect
    with pytest.raises(AttributeError):
        dut.latency = 0


def test_decode_members():
    dut = make_unit("all")
    members = dut.signature.members
    assert members["code"].shape.width == 32
    assert members["fmt"].shape.width == 5                      # 18 types
    assert members["o"].shape == wide_float_layout(32, 9)
    assert dut.index("int32") == ALL.index("int32")
    assert dut.index(np.int8) == ALL.index("int8")
    assert dut.index(ml_dtypes.uint4) == ALL.index("uint4")
    assert dut.index(np.float32) == 0 and dut.index(FORMATS["float4e2m1"]) == ALL.index(
        "float4e2m1")
    assert dut.index(QTYPES["float8e5m2"]) == ALL.index("float8e5m2")
    assert dut.types[0] is FORMATS["float32"] and dut.types[-1] is QTYPES["uint16"]
    assert Decode(("uint2",), sig_width=2, exp_width=2).signature.members["fmt"].shape.width == 1
    ts = tuple(decode_type(t) for t in ALL)
    assert min_sig_width(ts) == 32 and min_exp_width(ts) == 9
    assert min_exp_width((QTYPES["int16"],)) == 5                     # 0 .. 15
    assert min_exp_width((FORMATS["float8e4m3fn"],)) == 5            # -9 .. 8
    assert min_exp_width((E8M0,)) == 8 and min_sig_width((E8M0,)) == 1  # -127 .. 127
    with pytest.raises(ValueError, match=r"fmt must be one of float32, float16, bfloat16, "
                                         r"int32, float8e8m0, not 'int8'"):
        make_unit("q").index("int8")


# ---------------------------------------------------------------------------------------------
# Parameter errors


def test_decode_types_type():
    with pytest.raises(TypeError, match=r"types must be a tuple of types, not 'float16'"):
        Decode("float16", sig_width=11, exp_width=6)


def test_decode_types_empty():
    with pytest.raises(ValueError, match=r"types must name at least one type, not \(\)"):
        Decode((), sig_width=11, exp_width=6)


def test_decode_types_unknown():
    with pytest.raises(ValueError, match=r"types\[1\] must be one of float64, .*, uint16, "
                                         r"not 'uint32'"):
        Decode(("float16", "uint32"), sig_width=32, exp_width=6)
    with pytest.raises(ValueError, match=r"types\[0\] must be one of .* not 'int64'"):
        Decode((np.int64,), sig_width=64, exp_width=8)
    with pytest.raises(TypeError, match=r"types\[0\] must be a FloatFormat, an integer QType, "
                                        r"a type name or a dtype, not 2.5"):
        Decode((2.5,), sig_width=11, exp_width=6)


def test_decode_types_repeated():
    with pytest.raises(ValueError, match=r"types must be distinct, not \('int8', 'float16', "
                                         r"'int8'\) \(int8 appears twice\)"):
        Decode(("int8", "float16", np.int8), sig_width=11, exp_width=6)


def test_decode_sig_width():
    with pytest.raises(ValueError, match=r"sig_width must be in \[16, 256\] for types "
                                         r"float16, int16, not 15"):
        Decode(("float16", "int16"), sig_width=15, exp_width=6)
    with pytest.raises(ValueError, match=r"sig_width must be in \[24, 256\] for types "
                                         r"float32, uint8, not 23"):
        Decode(("float32", "uint8"), sig_width=23, exp_width=9)
    with pytest.raises(TypeError, match=r"sig_width must be an integer, not 16.0"):
        Decode(("int16",), sig_width=16.0, exp_width=6)


def test_decode_exp_width():
    # float16 needs -24 .. 15, int32 0 .. 31: signed(6).
    with pytest.raises(ValueError, match=r"exp_width must be in \[6, 32\] for types "
                                         r"float16, int32, not 5"):
        Decode(("float16", "int32"), sig_width=32, exp_width=5)
    with pytest.raises(TypeError, match=r"exp_width must be an integer, not '6'"):
        Decode(("float16",), sig_width=11, exp_width="6")


def test_decode_latency_value():
    with pytest.raises(ValueError, match=r"latency must be in \[0, 4\], not 5"):
        Decode(("float16",), sig_width=11, exp_width=6, latency=5)
    with pytest.raises(TypeError, match=r"latency must be an integer, not None"):
        Decode(("float16",), sig_width=11, exp_width=6, latency=None)
