# amaranth: UnusedElaboratable=no
"""DequantizeLane through Verilator against the golden model, element by element.

Every (x type, scale type, output type) of the default configuration, with and without a zero
point, in one Verilator build (see lane_groups). The golden model gets each group as a per-axis
DequantizeLinear along axis 0 (one scale and zero point per element).
"""

from __future__ import annotations

import numpy as np
import pytest

from qaccel.model.config import AccelConfig
from qaccel.model.dtypes import FLOAT_TYPES, QTYPES, SCALE_TYPES
from qaccel.model.presets import preset
from qaccel.model.quant import dequantize_linear
from qaccel.rtl.elementwise.dequantize_lane import DequantizeLane, dq_scales
from qaccel.sim.runner import missing_simulator
from qaccel.sim.vectors import VectorSim

from ..lane_groups import Groups, random_e8m0, run_groups

requires_verilator = pytest.mark.skipif(missing_simulator("verilator") is not None,
                                        reason=missing_simulator("verilator") or "")

CONFIG = AccelConfig()
GROUP = 1200


def random_x(name: str, n: int, rng) -> np.ndarray:
    """Codes of type ``name``: all of them for narrow types, random (with extremes) for wide."""
    q = QTYPES[name]
    if q.bits <= 8:
        codes = np.resize(rng.permutation(1 << q.bits), n)
    else:
        codes = rng.integers(0, 1 << q.bits, n, dtype=np.uint64)
    if q.is_int:
        lo, hi = int(q.qmin), int(q.qmax)
        codes = codes.astype(np.int64)
        vals = np.where(codes > hi, codes - (1 << q.bits), codes) if q.signed else codes
        vals[:4] = [lo, hi, 0, lo + 1]
        return vals.astype(q.dtype)
    return codes.astype(np.uint8).view(q.dtype)


def random_scale(name: str, n: int, rng) -> np.ndarray:
    if name == "float8e8m0":
        return random_e8m0(n, rng)
    dt = FLOAT_TYPES[name]
    mag = np.exp2(rng.uniform(-30, 20, n))
    with np.errstate(over="ignore"):    # magnitudes past a 16-bit type's range become inf
        s = np.where(rng.random(n) < 0.1, -mag, mag).astype(np.float32).astype(dt)
    m = n // 20
    bits = rng.integers(0, 1 << (8 * dt.itemsize), m, dtype=np.uint64)
    s[:m] = bits.astype({2: np.uint16, 4: np.uint32}[dt.itemsize]).view(dt)
    s[:5] = np.array([0.0, -0.0, np.inf, np.nan, 1e-40], np.float32).astype(dt)
    return s


@pytest.fixture(scope="module")
def lane_sim():
    lane = DequantizeLane(CONFIG)
    return lane, VectorSim(lane, name="dequantize_lane")


def every_type_groups(lane: DequantizeLane, rng) -> Groups:
    """Every x type x scale type x output type of ``lane``, with and without a zero point."""
    c = lane.config
    groups = Groups(lane)
    for xt in c.dq_inputs:
        q = QTYPES[xt]
        for st in dq_scales(c):
            for out in c.dq_outputs:
                for with_zp in (True, False):
                    x = random_x(xt, GROUP, rng)
                    s = random_scale(st, GROUP, rng)
                    if not with_zp:
                        zp = None
                    elif q.is_int:
                        zp = random_x(xt, GROUP, rng)
                    else:  # float8 / float4 zero points must be zero (and are ignored)
                        zp = np.zeros(GROUP, np.float32).astype(q.dtype)
                    with np.errstate(all="ignore"):
                        want = dequantize_linear(x, s, zp, axis=0, output_dtype=FLOAT_TYPES[out])
                    use_zp = with_zp and q.is_int
                    fields = {"x_fmt": c.dq_inputs.index(xt), "s_fmt": dq_scales(c).index(st),
                              "out_fmt": c.dq_outputs.index(out), "use_zp": int(use_zp),
                              "wide": int(use_zp and xt == "int32")}
                    groups.add(f"{xt} x {st} -> {out} zp={with_zp}", fields, x, s,
                               zp if use_zp else None, want)
    return groups


@pytest.mark.sim
@requires_verilator
def test_dequantize_lane_every_type(lane_sim):
    """Every x type x scale type x output type, with and without a zero point."""
    lane, sim = lane_sim
    groups = every_type_groups(lane, np.random.default_rng(7))
    assert run_groups(lane, sim, groups) == len(groups.labels) * GROUP


@pytest.mark.sim
@requires_verilator
def test_dequantize_lane_e8m0_only():
    """With float8e8m0 the only scale type the multiplier's scale operand is one bit (a power
    of two); every x and output type, with and without a zero point, stays exact."""
    lane = DequantizeLane(AccelConfig(scales=("float8e8m0",)))
    assert lane._dec_s.sig_width == 1
    sim = VectorSim(lane, name="dequantize_lane_e8m0")
    groups = every_type_groups(lane, np.random.default_rng(8))
    assert run_groups(lane, sim, groups) == len(groups.labels) * GROUP


def test_dequantize_lane_errors():
    with pytest.raises(TypeError, match="config must be an AccelConfig"):
        DequantizeLane("default")
    with pytest.raises(ValueError, match="config.scales must include a float type"):
        DequantizeLane(AccelConfig(scales=("int32",), q_inputs=("int32",)))


@pytest.mark.sim
@requires_verilator
@pytest.mark.parametrize("name", ["qdq-int8", "qdq-mx"])
def test_dequantize_lane_presets(name):
    """The unit presets' lanes build only the stages their types need (integer inputs only:
    the integer path; no int32: no float64 product; a float32-only output: no output
    rounding after the product's) and stay exact for every type they carry."""
    lane = DequantizeLane(preset(name))
    assert lane._round_b is None
    if lane._int_path:        # integer inputs: one rounding of the exact product, no decode
        assert lane._imul is not None and lane._mul is None and lane._round_p is None
        assert (lane._narrow is None) == (lane.config.dq_outputs == ("float32",))
    else:
        assert (lane._round_out is None) == (lane.config.dq_outputs == ("float32",))
    assert lane._int_path == (name == "qdq-int8")
    assert lane.latency < DequantizeLane(CONFIG).latency
    sim = VectorSim(lane, name=f"dequantize_lane_{name.replace('-', '_')}")
    groups = every_type_groups(lane, np.random.default_rng(9))
    assert run_groups(lane, sim, groups) == len(groups.labels) * GROUP


#: Every integer input type the integer path carries (int32 takes the general path).
INT_INPUTS = tuple(t for t in CONFIG.dq_inputs if QTYPES[t].is_int and QTYPES[t].bits <= 16)


def stress_scales(name: str, n: int, rng) -> np.ndarray:
    """``n`` codes of scale type ``name`` spread over every exponent: uniform bit patterns
    (subnormals, the overflow range, NaN payloads, infinities), then the smallest subnormals,
    the largest finite values and powers of two at the edges."""
    if name == "float8e8m0":
        return rng.integers(0, 256, n).astype(np.uint8).view(SCALE_TYPES[name])
    dt = FLOAT_TYPES[name]
    uint = {2: np.uint16, 4: np.uint32}[dt.itemsize]
    bits = rng.integers(0, 1 << (8 * dt.itemsize), n, dtype=np.uint64).astype(uint)
    top = 1 << (8 * dt.itemsize - 1)
    edges = [1, 2, 3, 0x7F, 0x80, 0xFF, top + 1, top - 1]          # subnormals, NaN
    mbits = {"float32": 23, "float16": 10, "bfloat16": 7}[name]
    inf = (top - 1) & ~((1 << mbits) - 1)
    edges += [inf - 1, inf - (1 << mbits), (1 << mbits) - 1, 1 << mbits, (1 << mbits) + 1]
    bits[:len(edges)] = edges
    return bits.view(dt)


#: Integer-path configurations beside the qdq-int8 preset: every such input type with every
#: float scale and output type (16-bit differences: the shift after the multiplier); the
#: sub-byte types with float8e8m0 scales only (a LUT product); 8-bit types with 16-bit
#: scales (one multiplier slice) and outputs; int16 with float16 scales; the 2-bit types
#: alone (the narrowest difference).
INT_CONFIGS = {
    "int-only": dict(dq_inputs=INT_INPUTS),
    "int4-e8m0": dict(dq_inputs=("int4", "uint4", "int2", "uint2"), scales=("float8e8m0",)),
    "int8-half": dict(dq_inputs=("uint8", "int8"), scales=("bfloat16", "float16"),
                      dq_outputs=("bfloat16", "float16")),
    "int16-f16": dict(dq_inputs=("int16",), scales=("float16",), dq_outputs=("float32",)),
    "int2-f32": dict(dq_inputs=("int2", "uint2"), scales=("float32",), dq_outputs=("float32",)),
}


@pytest.mark.sim
@requires_verilator
@pytest.mark.parametrize("name", ["qdq-int8", *INT_CONFIGS])
def test_dequantize_lane_int_path(name):
    """The integer path (``x`` and the zero point integers of at most 16 bits: one integer
    subtraction, one multiply, one rounding): every x code against scales over every exponent,
    subnormal and overflowing products included, for every scale and output type carried."""
    config = preset(name) if name == "qdq-int8" else AccelConfig(**INT_CONFIGS[name])
    lane = DequantizeLane(config)
    assert lane._int_path and lane._dec_x is None and lane._mul is None
    sim = VectorSim(lane, name=f"dequantize_lane_int_{name.replace('-', '_')}")
    c = lane.config
    rng = np.random.default_rng(11)
    groups = Groups(lane)
    n = 20000 if name == "qdq-int8" else 4000
    for xt in c.dq_inputs:
        for st in dq_scales(c):
            for out in c.dq_outputs:
                x = random_x(xt, n, rng)
                zp = random_x(xt, n, rng)
                s = stress_scales(st, n, rng)
                with np.errstate(all="ignore"):
                    want = dequantize_linear(x, s, zp, axis=0, output_dtype=FLOAT_TYPES[out])
                fields = {"x_fmt": c.dq_inputs.index(xt), "s_fmt": dq_scales(c).index(st),
                          "out_fmt": c.dq_outputs.index(out), "use_zp": 1, "wide": 0}
                groups.add(f"{xt} x {st} -> {out}", fields, x, s, zp, want)
    assert run_groups(lane, sim, groups) == len(groups.labels) * n


@pytest.mark.sim
@requires_verilator
def test_dequantize_lane_int8_every_difference():
    """qdq-int8: every difference ``x - zero_point`` (-255 .. 255: every x with the zero points
    -128, 0 and 127) times float32 scales of every exponent field (0 .. 255), both signs, with
    the mantissas 0, 1, 2, all ones and four random ones: 3 x 256 x 4,096 products, subnormal,
    overflowing, infinite and NaN ones included."""
    lane = DequantizeLane(preset("qdq-int8"))
    sim = VectorSim(lane, name="dequantize_lane_int_qdq_int8")
    rng = np.random.default_rng(12)
    mants = np.concatenate([[0, 1, 2, (1 << 23) - 1], rng.integers(3, (1 << 23) - 1, 4)])
    exps = np.arange(256)
    s_bits = ((np.arange(2)[:, None, None] << 31) | (exps[None, :, None] << 23)
              | mants[None, None, :]).ravel().astype(np.uint32)
    x = np.arange(-128, 128).astype(np.int8)
    groups = Groups(lane)
    for zp in (-128, 0, 127):
        xs = np.repeat(x, s_bits.size)
        s = np.tile(s_bits, x.size).view(np.float32)
        zps = np.full(xs.size, zp, np.int8)
        with np.errstate(all="ignore"):
            want = dequantize_linear(xs, s, zps, axis=0, output_dtype=np.float32)
        groups.add(f"zp={zp}", {"x_fmt": 0, "s_fmt": 0, "out_fmt": 0, "use_zp": 1, "wide": 0},
                   xs, s, zps, want)
    assert run_groups(lane, sim, groups) == 3 * 256 * s_bits.size


def int32_edges(rng) -> np.ndarray:
    """int32 values where ``x.astype(float32)`` rounds: ties to even and odd at every
    rounding position (25 to 32 significant bits), their neighbours, both signs, the ends of
    the range and powers of two."""
    vals = []
    for k in range(1, 9):                       # bits dropped: 1 .. 8
        top = rng.integers(1 << 23, 1 << 24, 64, dtype=np.int64)
        top = top[(top << k) < (1 << 31)] if k == 8 else top
        half = 1 << (k - 1)
        for t in top:
            base = int(t) << k
            vals += [base + half, base + half - 1, base + half + 1, base, base + (1 << k) - 1]
    vals += [2**31 - 1, 2**31 - 64, 2**31 - 65, 2**31 - 128, 2**31 - 129, 2**24, 2**24 + 1,
             2**24 + 3, 2**25 + 2, 2**25 + 6, 2**30, 2**30 + 2**6]
    v = np.array(vals, np.int64)
    v = np.concatenate([v, -v, [-2**31, -2**31 + 1, 0, 1, -1]])
    return v[(v >= -2**31) & (v < 2**31)].astype(np.int32)


@pytest.mark.sim
@requires_verilator
def test_dequantize_lane_int32_rounding(lane_sim):
    """The general path's int32 ``x``: rounded to float32 before the zero point is taken off
    (an integer rounding in IntDiff), at every rounding position, ties included, with and
    without a zero point, to every output type."""
    lane, sim = lane_sim
    c = lane.config
    rng = np.random.default_rng(13)
    x = int32_edges(rng)
    n = x.size
    groups = Groups(lane)
    for out in c.dq_outputs:
        for zp in (None, np.zeros(n, np.int32), random_x("int32", n, rng),
                   rng.integers(-300, 300, n).astype(np.int32)):
            s = np.where(rng.random(n) < 0.5, np.float32(1),
                         random_scale("float32", n, rng)).astype(np.float32)
            with np.errstate(all="ignore"):
                want = dequantize_linear(x, s, zp, axis=0, output_dtype=FLOAT_TYPES[out])
            fields = {"x_fmt": c.dq_inputs.index("int32"), "s_fmt": dq_scales(c).index("float32"),
                      "out_fmt": c.dq_outputs.index(out), "use_zp": int(zp is not None),
                      "wide": int(zp is not None)}
            groups.add(f"int32 -> {out} zp={zp is not None}", fields, x, s, zp, want)
    assert run_groups(lane, sim, groups) == len(groups.labels) * n
