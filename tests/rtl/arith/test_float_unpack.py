# amaranth: UnusedElaboratable=no
"""FloatUnpack: every float16/bfloat16/float8/float4 code and >= 1M float32/float64 patterns
through Verilator (qaccel.sim.vectors), against a NumPy model; latency in Amaranth's simulator."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.sim import Simulator

from qaccel.model.floatfmt import FORMATS, FloatFormat
from qaccel.rtl.arith.float_unpack import FloatClass, FloatUnpack, unpacked_layout
from qaccel.sim.runner import missing_simulator
from qaccel.sim.vectors import ComponentBank, VectorSim, split_fields

requires_verilator = pytest.mark.skipif(missing_simulator("verilator") is not None,
                                        reason=missing_simulator("verilator") or "")


def unpack_model(fmt: FloatFormat, codes: np.ndarray, normalize: bool) -> dict[str, np.ndarray]:
    """Naive NumPy unpacking: the FloatUnpack contract, field by field."""
    c = codes.astype(np.uint64)
    sign = (c >> np.uint64(fmt.bits - 1)).astype(np.int64) & 1
    e = ((c & np.uint64(fmt.exp_mask)) >> np.uint64(fmt.mbits)).astype(np.int64)
    mant = (c & np.uint64(fmt.mant_mask)).astype(np.int64)
    exp = np.where(e == 0, fmt.emin, e - fmt.bias)
    sig = np.where(e == 0, mant, mant + (1 << fmt.mbits))
    if normalize:
        sub = (e == 0) & (mant != 0)
        bit_length = np.frexp(mant.astype(np.float64))[1]  # exact: mant < 2**53
        shift = np.where(sub, fmt.mbits + 1 - bit_length, 0)
        sig = sig << shift
        exp = exp - shift
    cls = np.full(c.shape, FloatClass.NORMAL.value)
    cls[(e == 0) & (mant != 0)] = FloatClass.SUBNORMAL.value
    cls[(e == 0) & (mant == 0)] = FloatClass.ZERO.value
    cls[fmt.is_inf(c)] = FloatClass.INF.value
    cls[fmt.is_nan(c)] = FloatClass.NAN.value
    return {"sign": sign, "exp": exp, "sig": sig, "cls": cls}


def check_unpack(sim: VectorSim, key: str, dut: FloatUnpack, codes: np.ndarray) -> None:
    """Run ``codes`` through the bank unit ``key`` and compare every field with the model."""
    fmt = dut.fmt
    out = sim.run({f"i_{key}": codes}, latency=dut.latency, outputs=[f"o_{key}"])[f"o_{key}"]
    got = split_fields(out, unpacked_layout(fmt, normalize=dut.normalize))
    want = unpack_model(fmt, codes, dut.normalize)
    for field in ("cls", "sign", "exp", "sig"):
        bad = np.flatnonzero(got[field].astype(np.int64) != want[field])
        assert not bad.size, (
            f"{key}: {bad.size} codes with a wrong {field}, first "
            + ", ".join(f"{int(codes[k]):#x}: {int(got[field][k])} (want {int(want[field][k])})"
                        for k in bad[:4]))
    # The fields rebuild every finite value exactly (and -0 keeps its sign).
    finite = (want["cls"] != FloatClass.NAN.value) & (want["cls"] != FloatClass.INF.value)
    mag = np.ldexp(want["sig"][finite].astype(np.float64), want["exp"][finite] - fmt.mbits)
    value = np.where(want["sign"][finite] == 1, -mag, mag)
    ref = fmt.decode(codes[finite])
    np.testing.assert_array_equal(value, ref)
    np.testing.assert_array_equal(np.signbit(value), np.signbit(ref))


def edge_codes(fmt: FloatFormat) -> np.ndarray:
    """Zeros, subnormal extremes, normal extremes, infinities and NaN payloads, both signs."""
    m, top = fmt.mant_mask, fmt.exp_mask
    pos = [0, 1, 2, 3, m >> 1, m - 1, m, fmt.min_normal_code, fmt.min_normal_code + 1,
           fmt.max_code - 1, fmt.max_code, top, top | 1, top | (1 << (fmt.mbits - 1)), top | m,
           top | (m - 1)]
    pos += [1 << k for k in range(fmt.mbits)]
    pos = np.array(pos, dtype=np.uint64)
    return np.concatenate([pos, pos | np.uint64(fmt.sign_mask)]).astype(fmt.code_dtype)


def random_codes(fmt: FloatFormat, n: int, seed: int) -> np.ndarray:
    """``n`` random codes (mostly normals), with subnormal and NaN/inf-exponent codes mixed in."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 2**fmt.bits, n, dtype=np.uint64, endpoint=False)
    sub = rng.integers(0, fmt.mant_mask + 1, n // 8, dtype=np.uint64)
    special = rng.integers(0, fmt.mant_mask + 1, n // 16, dtype=np.uint64) | np.uint64(
        fmt.exp_mask)
    signs = rng.integers(0, 2, n // 8 + n // 16, dtype=np.uint64) << np.uint64(fmt.bits - 1)
    mixed = np.concatenate([sub, special]) | signs
    return np.concatenate([edge_codes(fmt), codes, mixed]).astype(fmt.code_dtype)


EXHAUSTIVE = ["float16", "bfloat16", "float8e4m3fn", "float8e4m3fnuz", "float8e5m2",
              "float8e5m2fnuz", "float4e2m1"]
#: (format, normalize, latency) for exhaustive runs: every small format as a divider wants it,
#: plus unnormalised and combinational variants.
EXHAUSTIVE_CASES = ([(name, True, 1) for name in EXHAUSTIVE]
                    + [("float16", False, 1), ("float8e4m3fnuz", False, 0),
                       ("float4e2m1", False, 1), ("bfloat16", True, 0), ("float16", True, 2),
                       ("float8e5m2", False, 2)])
#: (format, normalize, number of random codes, seed)
RANDOM_CASES = [("float32", True, 1_200_000, 1), ("float32", False, 300_000, 2),
                ("float64", True, 300_000, 3)]


def case_key(name: str, normalize: bool, latency: int = 1) -> str:
    return f"{name}_{'norm' if normalize else 'raw'}_lat{latency}"


@pytest.fixture(scope="module")
def bank() -> tuple[VectorSim, dict[str, FloatUnpack]]:
    units = {case_key(*case): FloatUnpack(case[0], normalize=case[1], latency=case[2])
             for case in EXHAUSTIVE_CASES}
    units |= {case_key(name, z): FloatUnpack(name, normalize=z) for name, z, _, _ in RANDOM_CASES}
    return VectorSim(ComponentBank(units), name="float_unpack_bank"), units


@pytest.mark.sim
@requires_verilator
@pytest.mark.parametrize(("name", "normalize", "latency"), EXHAUSTIVE_CASES,
                         ids=[case_key(*case) for case in EXHAUSTIVE_CASES])
def test_float_unpack_exhaustive(bank, name, normalize, latency):
    sim, units = bank
    key = case_key(name, normalize, latency)
    dut = units[key]
    codes = np.arange(dut.fmt.n_codes, dtype=np.uint64).astype(dut.fmt.code_dtype)
    check_unpack(sim, key, dut, codes)


@pytest.mark.sim
@requires_verilator
@pytest.mark.parametrize(("name", "normalize", "n", "seed"), RANDOM_CASES,
                         ids=[case_key(n, z) for n, z, _, _ in RANDOM_CASES])
def test_float_unpack_random(bank, name, normalize, n, seed):
    sim, units = bank
    key = case_key(name, normalize)
    dut = units[key]
    codes = random_codes(dut.fmt, n, seed=seed)
    assert codes.size >= n
    check_unpack(sim, key, dut, codes)


# ---------------------------------------------------------------------------------------------
# Amaranth simulator: latency


def simulate(dut: FloatUnpack, codes: list[int]) -> list[tuple[int, dict]]:
    """Apply one code per cycle; return, per cycle, the code applied and ``o`` sampled before
    the clock edge (for a combinational dut, after the inputs settle)."""
    seen: list[tuple[int, dict]] = []

    async def testbench(ctx):
        for code in codes:
            ctx.set(dut.i, code)
            o = ctx.get(dut.o)
            seen.append((code, {"sign": o.sign, "exp": o.exp, "sig": o.sig, "cls": o.cls}))
            if dut.latency:
                await ctx.tick()

    sim = Simulator(dut)
    if dut.latency:
        sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    return seen


@pytest.mark.parametrize("latency", [0, 1, 2])
def test_float_unpack_latency(latency):
    dut = FloatUnpack("float8e4m3fn", latency=latency)
    assert dut.latency == latency
    codes = [0x01, 0x7F, 0x80, 0x38, 0xFE, 0x07]
    seen = simulate(dut, codes)
    model = unpack_model(dut.fmt, np.array(codes, dtype=np.uint8), normalize=True)
    for k, (_, got) in enumerate(seen):
        j = k - latency  # the code whose fields are on `o` in cycle k
        if j < 0:
            continue
        want = {f: int(model[f][j]) for f in ("sign", "exp", "sig")}
        want["cls"] = FloatClass(int(model["cls"][j]))
        assert got == want, f"cycle {k}: {got} != {want} for code {codes[j]:#x}"
    with pytest.raises(AttributeError):
        dut.latency = 2


def test_float_unpack_layout():
    dut = FloatUnpack("float32")
    layout = dut.signature.members["o"].shape
    assert layout == unpacked_layout("float32")
    assert dut.signature.members["i"].shape.width == 32
    # exp spans emin - mbits = -149 .. 255 - 127 = 128: signed(9).
    assert layout["exp"].shape.signed and layout["exp"].shape.width == 9
    assert layout["sig"].shape.width == 24
    assert unpacked_layout("float4e2m1", normalize=False)["exp"].shape.signed
    assert FloatUnpack(FORMATS["bfloat16"]).fmt is FORMATS["bfloat16"]
    assert not FloatUnpack("float16", normalize=False).normalize


def test_float_unpack_parameter_errors():
    with pytest.raises(ValueError, match=r"fmt must be one of float64, .*, not 'float7'"):
        FloatUnpack("float7")
    with pytest.raises(TypeError, match=r"fmt must be a FloatFormat, a format name or a float "
                                        r"dtype, not 3.5"):
        FloatUnpack(3.5)
    with pytest.raises(ValueError, match=r"fmt must be one of .*, not 'int8'"):
        FloatUnpack(np.int8)
    with pytest.raises(TypeError, match=r"normalize must be a bool, not 1"):
        FloatUnpack("float16", normalize=1)
    with pytest.raises(TypeError, match=r"latency must be an integer, not '1'"):
        FloatUnpack("float16", latency="1")
    with pytest.raises(ValueError, match=r"latency must be in \[0, 2\], not 3"):
        FloatUnpack("float16", latency=3)
    with pytest.raises(TypeError, match=r"normalize must be a bool, not None"):
        unpacked_layout("float16", normalize=None)
