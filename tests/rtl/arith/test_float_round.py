# amaranth: UnusedElaboratable=no
"""FloatRound through Verilator (qaccel.sim.vectors) against NumPy / ml_dtypes casts and ONNX's
saturate_cast, and against exact rational rounding (FloatFormat.encode_exact) where a float64
cannot stand for the input; latency in Amaranth's simulator; parameter errors.

The reference for targets of at most 24 significant bits rounds the wide input to odd at 53
bits (truncate, then set the last bit if anything was dropped): a float64 rounded that way
rounds once, correctly, to any format with at most 51 significant bits. NumPy's float64 to
float32 / float16 casts round once; ml_dtypes' float64 to bfloat16 / float8 / float4 casts go
through float32 (a double rounding, see test_ml_dtypes_double_rounding), so for those the
float64 is first rounded to odd at 24 bits, then cast from float32.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from amaranth.sim import Simulator
from onnx.numpy_helper import saturate_cast

from qaccel.model.floatfmt import FORMATS
from qaccel.rtl.arith.float_round import FloatRound, min_exp_width, min_sig_width
from qaccel.rtl.arith.wide_float import wide_float_layout
from qaccel.sim.runner import missing_simulator
from qaccel.sim.vectors import ComponentBank, VectorSim, join_fields, split_fields

from ..wide_np import (
    NORM,
    SUB,
    concat,
    describe,
    exact_codes,
    grid_inputs,
    negate,
    random_for,
    random_inputs,
    reference_codes,
    round_to_odd_53,
    specials,
    step,
    value_fields,
    wide_from_float64,
    with_sticky,
)

requires_verilator = pytest.mark.skipif(missing_simulator("verilator") is not None,
                                        reason=missing_simulator("verilator") or "")

F = FORMATS
SMALL = ("float16", "bfloat16", "float8e4m3fn", "float8e4m3fnuz", "float8e5m2",
         "float8e5m2fnuz", "float4e2m1")
FP8 = ("float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz", "float4e2m1")

#: The units of the shared build: key -> (formats, sig_width, exp_width, latency).
UNITS = {
    # Every format, as the Quantize unit carries them, 64-bit significand (int32 / float64).
    "all": (tuple(FORMATS), 64, 13, 8),
    # A float32 divider's 56-bit quotient.
    "f32": (("float32", "float16", "bfloat16"), 56, 10, 6),
    # The float8 / float4 encoders with one guard bit: small enough to try every input.
    "fp8": (FP8, 5, 6, 1),
    # No guard bit for float16 (documented truncation of sticky inputs), combinational.
    "comb": (("float16", "float8e4m3fn"), 11, 6, 0),
}


def make_unit(key: str) -> FloatRound:
    formats, sig_width, exp_width, latency = UNITS[key]
    return FloatRound(formats, sig_width=sig_width, exp_width=exp_width, latency=latency)


@pytest.fixture(scope="module")
def bank() -> tuple[VectorSim, dict[str, FloatRound]]:
    units = {key: make_unit(key) for key in UNITS}
    return VectorSim(ComponentBank(units), name="float_round_bank"), units


# ---------------------------------------------------------------------------------------------
# Wide floats in NumPy: dicts of field arrays (sign, exp, sig, sticky, cls)


# ---------------------------------------------------------------------------------------------
# References


# ---------------------------------------------------------------------------------------------
# Running and checking


def run_unit(bank, key: str, w: dict, fmt: str, saturate) -> tuple[np.ndarray, dict]:
    sim, units = bank
    unit = units[key]
    layout = wide_float_layout(unit.sig_width, unit.exp_width)
    out = sim.run({f"i_{key}": join_fields(w, layout), f"fmt_{key}": unit.index(fmt),
                   f"saturate_{key}": saturate},
                  latency=unit.latency, outputs=[f"code_{key}", f"value_{key}"])
    return out[f"code_{key}"].astype(np.uint64), split_fields(out[f"value_{key}"], layout)


def check(bank, key: str, w: dict, fmt_name: str, saturate: bool, want=None) -> int:
    """Round ``w`` on unit ``key`` to ``fmt_name``; compare ``code`` with the reference
    (``want``, else :func:`reference_codes`) and ``value`` with the decoded code."""
    fmt = F[fmt_name]
    width = bank[1][key].sig_width
    code, value = run_unit(bank, key, w, fmt_name, int(saturate))
    if want is None:
        want = reference_codes(fmt, w, width, saturate)
    bad = np.flatnonzero(code != want)
    assert not bad.size, (
        f"{key} -> {fmt_name} saturate={int(saturate)}: {bad.size} of {code.size} wrong codes, "
        "first: " + "; ".join(f"{describe(w, k)}: {int(code[k]):#x}, want {int(want[k]):#x}"
                              for k in bad[:4]))
    ref = value_fields(fmt, want, width)
    for field in ("cls", "sign", "exp", "sig", "sticky"):
        got = value[field].astype(np.int64)
        bad = np.flatnonzero(got != ref[field].astype(np.int64))
        assert not bad.size, (
            f"{key} -> {fmt_name} saturate={int(saturate)}: {bad.size} wrong value.{field}, "
            "first: " + "; ".join(f"code {int(want[k]):#x}: {int(got[k])}, want "
                                  f"{int(ref[field][k])}" for k in bad[:4]))
    return code.size


# ---------------------------------------------------------------------------------------------
# Inputs


# ---------------------------------------------------------------------------------------------
# Verilator tests


@pytest.mark.sim
@requires_verilator
@pytest.mark.parametrize("name", SMALL)
def test_float_round_exhaustive(bank, name):
    """Every code, midpoint and near-midpoint of a 16-bit or smaller target, from a 64-bit
    significand, plus specials and far exponents; saturate 0 and 1."""
    fmt = F[name]
    w = concat(grid_inputs(fmt, 64), specials(64, 13, n_exp=64))
    for saturate in (False, True):
        check(bank, "all", w, name, saturate)


@pytest.mark.sim
@requires_verilator
def test_float_round_fp8_every_input(bank):
    """The fp8 unit (5-bit significand, 6-bit exponent): every input pattern with a valid class,
    every format, both saturate values."""
    unit = bank[1]["fp8"]
    sig = np.concatenate([[0], np.arange(16, 32)]).astype(np.uint64)
    sign, exp, sig, sticky, cls = (a.ravel() for a in np.meshgrid(
        np.arange(2), np.arange(-32, 32), sig, np.arange(2), np.arange(5), indexing="ij"))
    w = {"sign": sign.astype(np.uint64), "exp": exp, "sig": sig,
         "sticky": sticky.astype(np.uint64), "cls": cls.astype(np.uint64)}
    # Finite classes need a normalised significand; ZERO/INF/NAN take anything.
    keep = ~(((cls == NORM) | (cls == SUB)) & (sig == 0))
    w = {k: v[keep] for k, v in w.items()}
    for fmt in unit.formats:
        for saturate in (False, True):
            check(bank, "fp8", w, fmt.name, saturate)


@pytest.mark.sim
@requires_verilator
def test_float_round_float32_random(bank):
    """>= 1M random 56-bit significands with sticky bits to float32 (and 200k each to float16
    and bfloat16) on the three-format unit, plus edge cases."""
    edge = concat(grid_inputs(F["float16"], 56), specials(56, 10, n_exp=200))
    w = concat(random_for(F["float32"], 1_050_000, 56, seed=1), edge)
    assert w["sig"].size >= 1_000_000
    check(bank, "f32", w, "float32", False)
    check(bank, "f32", w, "float32", True)
    for name, seed in (("float16", 4), ("bfloat16", 5)):
        w = concat(random_for(F[name], 200_000, 56, seed), edge)
        for saturate in (False, True):
            check(bank, "f32", w, name, saturate)


@pytest.mark.sim
@requires_verilator
def test_float_round_float32_on_all(bank):
    """float32 targets on the nine-format unit (64-bit significands)."""
    w = concat(random_for(F["float32"], 200_000, 64, seed=6), specials(64, 13, n_exp=64))
    for saturate in (False, True):
        check(bank, "all", w, "float32", saturate)


@pytest.mark.sim
@requires_verilator
def test_float_round_float64_random(bank):
    """Random 64-bit significands with sticky bits to float64 (normal, subnormal, underflow and
    overflow ranges), against exact rational rounding."""
    f64 = F["float64"]
    w = concat(random_for(f64, 50_000, 64, seed=7),
               random_inputs(20_000, 64, f64.emin, f64.emax, seed=8, prec=53),
               wide_from_float64(np.array([f64.max, f64.min_normal, f64.min_subnormal,
                                           f64.min_subnormal / 2, f64.min_normal / 2]), 64))
    w = concat(w, step(w, 64, True), specials(64, 13, n_exp=100))
    for saturate in (False, True):
        want = exact_codes(f64, w, 64, saturate)
        check(bank, "all", w, "float64", saturate, want=want)


@pytest.mark.sim
@requires_verilator
@pytest.mark.parametrize("name", ["float16", "float8e4m3fn"])
def test_float_round_no_guard_bit(bank, name):
    """sig_width == mbits + 1 (float16 on the combinational unit): exact inputs round
    correctly, a sticky bit is dropped in the normal range and honoured where a subnormal
    result leaves a round bit. The reference reads sticky as "a little more", which is that."""
    fmt = F[name]
    mags = np.unique(np.abs(fmt.decode(np.arange(fmt.n_codes))))
    w = wide_from_float64(mags[np.isfinite(mags) & (mags > 0)], 11)
    w = concat(w, with_sticky(w), step(w, 11, True), specials(11, 6))
    w = concat(w, negate(w))
    for saturate in (False, True):
        check(bank, "comb", w, name, saturate)


@pytest.mark.sim
@requires_verilator
def test_float_round_chained(bank):
    """``value`` feeds a second rounding: float32 then float16 is NumPy's double rounding
    ``x.astype(float32).astype(float16)``, float16 then float8e4m3fn ml_dtypes' ditto."""
    f16 = F["float16"]
    w = random_inputs(100_000, 56, f16.emin - 14, f16.emax + 2, seed=10, prec=11)
    w = concat(w, specials(56, 10))
    _, v32 = run_unit(bank, "f32", w, "float32", 0)
    code, _ = run_unit(bank, "f32", v32, "float16", 0)
    x = round_to_odd_53(w, 56)
    with np.errstate(over="ignore"):
        want = x.astype(np.float32).astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(code, want)
    wa = concat(grid_inputs(f16, 64), specials(64, 13))
    _, v16 = run_unit(bank, "all", wa, "float16", 1)
    code, _ = run_unit(bank, "all", v16, "float8e4m3fn", 1)
    x16 = saturate_cast(round_to_odd_53(wa, 64), np.float16)
    want = saturate_cast(x16.astype(np.float32), ml_dtypes.float8_e4m3fn).view(np.uint8)
    np.testing.assert_array_equal(code, want)


@pytest.mark.sim
@requires_verilator
@pytest.mark.parametrize("name", ["bfloat16", "float8e4m3fn", "float8e5m2fnuz", "float4e2m1"])
def test_float_round_float64_casts(bank, name):
    """ml_dtypes' float64 casts to bfloat16 / float8 / float4 (and saturate_cast's) round to
    float32 first: a float32 rounding whose ``value`` feeds a second one reproduces them, on
    float64 values just off the target's ties."""
    fmt = F[name]
    mags = np.unique(np.abs(fmt.decode(np.arange(min(fmt.n_codes, 1 << 16)))))
    mags = mags[np.isfinite(mags)]
    mids = (mags[:-1] + mags[1:]) / 2
    x = np.concatenate([mids * (1 + 2.0 ** -30), mids * (1 - 2.0 ** -30),
                        mids * (1 + 2.0 ** -20), mids * (1 - 2.0 ** -20), mags])
    x = np.concatenate([x, -x, [np.inf, -np.inf, np.nan, 0.0]])
    w = wide_from_float64(x, 64)
    for saturate in (0, 1):
        _, v32 = run_unit(bank, "all", w, "float32", saturate)
        code, _ = run_unit(bank, "all", v32, name, saturate)
        with np.errstate(over="ignore", invalid="ignore"):
            y = saturate_cast(x, fmt.dtype) if saturate else x.astype(fmt.dtype)
        np.testing.assert_array_equal(code, y.view(fmt.code_dtype))
        # ... which is not the single rounding on some of these inputs.
        assert np.sum(code != reference_codes(fmt, w, 64, bool(saturate))) > 10


@pytest.mark.sim
@requires_verilator
def test_float_round_fmt_out_of_range(bank):
    """An ``fmt`` beyond the tuple selects the last format."""
    sim, units = bank
    unit = units["f32"]
    w = concat(random_inputs(1000, 56, -20, 20, seed=11, prec=8), specials(56, 10))
    layout = wide_float_layout(56, 10)
    code = sim.run({"i_f32": join_fields(w, layout), "fmt_f32": 3},
                   latency=unit.latency, outputs=["code_f32"])["code_f32"]
    np.testing.assert_array_equal(code, reference_codes(F["bfloat16"], w, 56, False))


# ---------------------------------------------------------------------------------------------
# References checked against each other (no simulator)


@pytest.mark.parametrize("name", SMALL + ("float32",))
def test_reference_matches_exact_rounding(name):
    """The round-to-odd + NumPy / ml_dtypes reference agrees with exact rational rounding on
    ties and near-ties with 64-bit significands."""
    fmt = F[name]
    w = concat(specials(64, 13), random_for(fmt, 3000, 64, seed=13))
    if fmt.bits <= 16:
        grid = grid_inputs(fmt, 64)
        pick = np.random.default_rng(12).choice(grid["sig"].size, min(grid["sig"].size, 3000),
                                                replace=False)
        w = concat(w, {k: v[pick] for k, v in grid.items()})
    for saturate in (False, True):
        np.testing.assert_array_equal(reference_codes(fmt, w, 64, saturate),
                                      exact_codes(fmt, w, 64, saturate))


def test_ml_dtypes_double_rounding():
    """Pin the ml_dtypes behaviour the reference works around: float64 -> bfloat16 / float8 /
    float4 casts round to float32 first (a double rounding); NumPy's float64 -> float16 does
    not. And float4e2m1 has no NaN: +NaN gives 0x8 (-0), -NaN gives 0x0."""
    for name in ("bfloat16", "float8e4m3fn", "float8e5m2", "float4e2m1"):
        fmt = F[name]
        x = np.array([1 + 2.0 ** -(fmt.mbits + 1) + 2.0 ** -40])   # just above a tie
        assert int(x.astype(fmt.dtype).view(fmt.code_dtype)[0]) == fmt.encode_exact(1.0)
        assert fmt.encode_exact(float(x[0])) == fmt.encode_exact(1.0) + 1
    x = np.array([1 + 2.0 ** -11 + 2.0 ** -40])
    assert int(x.astype(np.float16).view(np.uint16)[0]) == 0x3C01
    with np.errstate(invalid="ignore"):
        nan = np.array([np.nan, -np.nan]).astype(ml_dtypes.float4_e2m1fn).view(np.uint8)
    assert nan.tolist() == [0x8, 0x0]


# ---------------------------------------------------------------------------------------------
# Amaranth simulator: latency


def simulate(dut: FloatRound, w: dict, fmt: str) -> list[int]:
    """Apply one wide float per cycle; return ``code`` sampled before each clock edge."""
    seen: list[int] = []
    layout = wide_float_layout(dut.sig_width, dut.exp_width)
    bits = join_fields(w, layout)

    async def testbench(ctx):
        ctx.set(dut.fmt, dut.index(fmt))
        for k in range(len(bits) + dut.latency):
            ctx.set(dut.i.as_value(), int(bits[min(k, len(bits) - 1)]))
            seen.append(ctx.get(dut.code))
            if dut.latency:
                await ctx.tick()

    sim = Simulator(dut)
    if dut.latency:
        sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    return seen


@pytest.mark.parametrize("latency", [0, 1, 2, 3, 4, 5, 6, 7, 8])
def test_float_round_latency(latency):
    dut = FloatRound(("float8e4m3fn", "float8e5m2"), sig_width=5, exp_width=6, latency=latency)
    assert dut.latency == latency
    x = np.array([1.0, -1.5, 448.0, 0.0, 2.0 ** -9, -3.0, 0.25, 0.5])
    w = wide_from_float64(x, 5)
    want = F["float8e5m2"].encode(x).tolist()
    seen = simulate(dut, w, "float8e5m2")
    assert seen[latency:] == want, f"latency {latency}: {seen} != {want} (delayed)"
    with pytest.raises(AttributeError):
        dut.latency = 2


def test_float_round_members():
    dut = make_unit("all")
    members = dut.signature.members
    assert members["i"].shape == wide_float_layout(64, 13)
    assert members["value"].shape == wide_float_layout(64, 13)
    assert members["fmt"].shape.width == 4
    assert members["code"].shape.width == 64
    assert members["saturate"].shape == 1
    assert dut.formats == tuple(FORMATS.values())
    assert dut.index("float4e2m1") == 8 and dut.index(ml_dtypes.bfloat16) == 3
    assert min_sig_width(dut.formats) == 53 and min_exp_width(dut.formats) == 12
    assert min_exp_width((F["float8e4m3fn"],)) == 5          # -9 .. 8
    unit = FloatRound(("float16",), sig_width=11, exp_width=6)
    assert unit.signature.members["fmt"].shape.width == 1
    assert unit.latency == 3
    layout = wide_float_layout(56, 10)
    assert [name for name, _ in layout] == ["sign", "exp", "sig", "sticky", "cls"]
    assert layout.size == 1 + 10 + 56 + 1 + 3 and layout["exp"].shape.signed


# ---------------------------------------------------------------------------------------------
# Parameter errors


def test_float_round_formats_type():
    with pytest.raises(TypeError, match=r"formats must be a tuple of FloatFormats, not "
                                        r"'float16'"):
        FloatRound("float16", sig_width=11, exp_width=6)


def test_float_round_formats_empty():
    with pytest.raises(ValueError, match=r"formats must name at least one format, not \(\)"):
        FloatRound((), sig_width=11, exp_width=6)


def test_float_round_formats_unknown():
    with pytest.raises(ValueError, match=r"formats\[1\] must be one of float64, .*, "
                                         r"not 'float7'"):
        FloatRound(("float16", "float7"), sig_width=11, exp_width=6)
    with pytest.raises(TypeError, match=r"formats\[0\] must be a FloatFormat, a format name "
                                        r"or a float dtype, not 2.5"):
        FloatRound((2.5,), sig_width=11, exp_width=6)


def test_float_round_formats_repeated():
    with pytest.raises(ValueError, match=r"formats must be distinct, not \('float16', "
                                         r"'bfloat16', 'float16'\) \(float16 appears twice\)"):
        FloatRound(("float16", "bfloat16", np.float16), sig_width=11, exp_width=8)


def test_float_round_sig_width():
    with pytest.raises(ValueError, match=r"sig_width must be in \[24, 256\] for formats "
                                         r"float32, float16, not 23"):
        FloatRound(("float32", "float16"), sig_width=23, exp_width=9)
    with pytest.raises(ValueError, match=r"sig_width must be in \[11, 256\] .* not 257"):
        FloatRound(("float16",), sig_width=257, exp_width=9)
    with pytest.raises(TypeError, match=r"sig_width must be an integer, not 24.0"):
        FloatRound(("float32",), sig_width=24.0, exp_width=9)


def test_float_round_exp_width():
    # float32 needs -149 .. 127: signed(9).
    with pytest.raises(ValueError, match=r"exp_width must be in \[9, 32\] for formats "
                                         r"float32, not 8"):
        FloatRound(("float32",), sig_width=24, exp_width=8)
    with pytest.raises(TypeError, match=r"exp_width must be an integer, not None"):
        FloatRound(("float32",), sig_width=24, exp_width=None)


def test_float_round_latency_value():
    with pytest.raises(ValueError, match=r"latency must be in \[0, 8\], not 9"):
        FloatRound(("float16",), sig_width=11, exp_width=6, latency=9)
    with pytest.raises(TypeError, match=r"latency must be an integer, not True"):
        FloatRound(("float16",), sig_width=11, exp_width=6, latency=True)


def test_wide_float_layout_errors():
    with pytest.raises(ValueError, match=r"sig_width must be in \[1, 256\], not 0"):
        wide_float_layout(0, 8)
    with pytest.raises(TypeError, match=r"exp_width must be an integer, not '8'"):
        wide_float_layout(24, "8")


def test_encode_exact_errors():
    with pytest.raises(TypeError, match=r"value must be an int, a Fraction or a float, not "
                                        r"'1'"):
        F["float16"].encode_exact("1")
    with pytest.raises(TypeError, match=r"saturate must be a bool, not 1"):
        F["float16"].encode_exact(1, saturate=1)
