# amaranth: UnusedElaboratable=no
"""QuantizeLane through Verilator against the golden model, element by element.

Every (x type, scale type, output type) of the default configuration, with and without
``saturate``, the ``precision`` attribute for every precision, and DirectML's quantize, in one
Verilator build: the groups of vectors run back to back in one stream, separated by a pipeline
flush (the lane's registers must be stable while elements are in flight). The golden model gets
each group as a per-axis QuantizeLinear along axis 0 (one scale and zero point per element).
"""

from __future__ import annotations

import numpy as np
import pytest

from qaccel.model.config import AccelConfig
from qaccel.model.dml import dml_quantize_linear
from qaccel.model.dtypes import FLOAT_TYPES, QTYPES, SCALE_TYPES
from qaccel.model.quant import division_dtype, quantize_linear
from qaccel.rtl.arith.significand_round import SignificandRound
from qaccel.rtl.elementwise.quantize_lane import QuantizeLane
from qaccel.sim.runner import missing_simulator
from qaccel.sim.vectors import VectorSim

from ..lane_groups import Groups, random_e8m0, run_groups
from ..prepared_lane import PreparedLane

requires_verilator = pytest.mark.skipif(missing_simulator("verilator") is not None,
                                        reason=missing_simulator("verilator") or "")

CONFIG = AccelConfig()
DTYPES = {**FLOAT_TYPES, **SCALE_TYPES, "int32": np.dtype(np.int32)}
#: Every input, output and precision with float8e8m0 scales only: the lane without a divider.
MX_CONFIG = AccelConfig(scales=("float8e8m0",),
                        precisions=("float32", "float16", "bfloat16", "float64"))

#: Every format with prepared scales: the reciprocal divider (int32's float64 division too).
RECIP_CONFIG = AccelConfig(reciprocal_units=1)
#: Integer outputs only: the quotient rounded by SignificandRound (no subnormals, no overflow)
#: instead of FloatRound, with either divider.
INT_OUTPUTS = tuple(t for t in AccelConfig().q_outputs if QTYPES[t].is_int)
INT_CONFIGS = {"array": AccelConfig(q_outputs=INT_OUTPUTS),
               "prepared": AccelConfig(q_outputs=INT_OUTPUTS, reciprocal_units=1)}

GROUP = 1500


def _dtype(name: str) -> np.dtype:
    return DTYPES[name] if name in DTYPES else QTYPES[name].dtype


def random_x(name: str, n: int, scale: np.ndarray, rng) -> np.ndarray:
    """Values of type ``name``: random magnitudes, ties of ``x / scale``, specials."""
    dt = _dtype(name)
    if name == "int32":
        x = rng.integers(-(1 << 31), 1 << 31, n, dtype=np.int64)
        x[: n // 4] = rng.integers(-300, 300, n // 4)
        x[:8] = [0, 1, -1, (1 << 31) - 1, -(1 << 31), 127, -128, 255]
        return x.astype(np.int32)
    bits = rng.integers(0, 1 << (8 * dt.itemsize), n, dtype=np.uint64)
    x = bits.astype({2: np.uint16, 4: np.uint32}[dt.itemsize]).view(dt)
    # a third of them near (k + 1/2) * scale: ties, and values just off ties
    k = n // 3
    # inf / NaN scales give inf / NaN inputs, and 1e30 overflows a 16-bit type: meant
    with np.errstate(over="ignore", invalid="ignore"):
        f32 = scale[:k].astype(np.float32) * (rng.integers(-300, 300, k) + np.float32(0.5))
        x[:k] = f32.astype(dt)
        x[k:2 * k] = (rng.standard_normal(k) * 40).astype(dt)
        x[:6] = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e30]).astype(dt)
    return x


def random_scale(name: str, n: int, rng) -> np.ndarray:
    dt = _dtype(name)
    if name == "float8e8m0":
        return random_e8m0(n, rng)
    if name == "int32":
        s = rng.integers(-5, 40, n).astype(np.int32)
        return s
    mag = np.exp2(rng.uniform(-12, 6, n)).astype(np.float32)
    s = np.where(rng.random(n) < 0.3, np.exp2(rng.integers(-8, 4, n)).astype(np.float32), mag)
    s = np.where(rng.random(n) < 0.05, -s, s)
    s = s.astype(dt)
    if dt.itemsize == 2:  # a few random codes: subnormals, inf, NaN
        m = n // 20
        s[:m] = rng.integers(0, 1 << 16, m, dtype=np.uint64).astype(np.uint16).view(dt)
    s[:4] = np.array([0.0, np.inf, np.nan, 1e-40], dtype=np.float32).astype(dt)
    return s


def random_zp(name: str, n: int, rng) -> np.ndarray:
    q = QTYPES[name]
    if q.is_int:
        return rng.integers(q.qmin, q.qmax + 1, n).astype(q.dtype)
    return rng.uniform(-7, 7, n).astype(q.dtype)


@pytest.fixture(scope="module")
def lane_sim():
    lane = QuantizeLane(CONFIG)
    return lane, VectorSim(lane, name="quantize_lane")


def fields(c: AccelConfig, regs: dict) -> dict:
    return {"x_fmt": c.q_inputs.index(regs["x"]), "s_fmt": c.scales.index(regs["s"]),
            "prec": c.precisions.index(regs["prec"]), "cast": int(regs["cast"]),
            "out_fmt": c.q_outputs.index(regs["out"]), "saturate": int(regs.get("saturate", 1))}


def every_type_groups(lane: QuantizeLane, rng) -> Groups:
    """Every x type x scale type x output type of ``lane`` (saturate on and, for float8,
    off), in the division type NumPy promotes to."""
    groups = Groups(lane)
    c = lane.config
    for xt in c.q_inputs:
        for st in c.scales:
            for out in c.q_outputs:
                sats = (True, False) if out.startswith("float8") else (True,)
                for sat in sats:
                    s = random_scale(st, GROUP, rng)
                    x = random_x(xt, GROUP, s, rng)
                    zp = random_zp(out, GROUP, rng)
                    with np.errstate(all="ignore"):
                        want = quantize_linear(x, s, zp, axis=0, saturate=sat)
                    prec = _prec_name(division_dtype(_dtype(xt), _dtype(st)))
                    regs = {"x": xt, "s": st, "prec": prec, "cast": 0, "out": out,
                            "saturate": sat}
                    label = f"{xt}/{st} -> {out} sat={int(sat)}"
                    groups.add(label, fields(c, regs), x, s, zp, want)
    return groups


def precision_groups(lane: QuantizeLane, rng) -> Groups:
    """The ``precision`` attribute: both operands rounded to it, the division in it."""
    groups = Groups(lane)
    c = lane.config
    for xt in c.q_inputs:
        for st in c.scales:
            for prec in (p for p in c.precisions if p != "float64"):
                for out in (o for o in ("int8", "uint4", "int16", "float8e4m3fn", "float4e2m1")
                            if o in c.q_outputs):
                    s = random_scale(st, GROUP // 3, rng)
                    x = random_x(xt, GROUP // 3, s, rng)
                    zp = random_zp(out, GROUP // 3, rng)
                    with np.errstate(all="ignore"):
                        want = quantize_linear(x, s, zp, axis=0, precision=FLOAT_TYPES[prec])
                    regs = {"x": xt, "s": st, "prec": prec, "cast": 1, "out": out}
                    groups.add(f"{xt}/{st} precision={prec} -> {out}", fields(c, regs), x, s, zp,
                               want)
    return groups


@pytest.mark.sim
@requires_verilator
def test_quantize_lane_every_type(lane_sim):
    """Every x type x scale type x output type (saturate on and, for float8, off)."""
    groups = every_type_groups(lane_sim[0], np.random.default_rng(1))
    assert run_groups(*lane_sim, groups) == len(groups.labels) * GROUP


def _prec_name(dt: np.dtype) -> str:
    if dt == np.float64:
        return "float64"
    return next(n for n, d in FLOAT_TYPES.items() if d == dt)


@pytest.mark.sim
@requires_verilator
def test_quantize_lane_precision(lane_sim):
    """The ``precision`` attribute: both operands rounded to it, the division in it."""
    groups = precision_groups(lane_sim[0], np.random.default_rng(2))
    assert run_groups(*lane_sim, groups) == len(groups.labels) * (GROUP // 3)


@pytest.mark.sim
@requires_verilator
def test_quantize_lane_e8m0_only():
    """A lane whose only scale type is float8e8m0 (the OCP MX lane) has no divider, is shorter
    than the default lane, and is exact for every x and output type, saturate and precision."""
    lane = QuantizeLane(MX_CONFIG)
    assert lane._div is None and lane.latency < QuantizeLane(CONFIG).latency
    check_groups(lane, "quantize_lane_e8m0", 4, (every_type_groups, precision_groups))


def check_groups(unit, name: str, seed: int, makers) -> None:
    """Build ``unit`` (a lane, or a PreparedLane) as ``name`` and run the groups each of
    ``makers`` makes for it; every element of every group is checked."""
    sim = (unit, VectorSim(unit, name=name))
    rng = np.random.default_rng(seed)
    for make in makers:
        groups = make(unit, rng)
        assert run_groups(*sim, groups) == sum(n for _, _, n in groups.labels)


def dml_groups(lane, rng) -> Groups:
    """DirectML's quantize: float32 division (int32 input rounded to float32 first)."""
    groups = Groups(lane)
    for xt in ("float32", "float16", "int32"):
        st = "float32" if xt == "int32" else xt
        for out in ("int8", "uint8"):
            for with_zp in (True, False):
                s = random_scale(st, GROUP, rng)
                x = random_x(xt, GROUP, s, rng)
                zp = random_zp(out, GROUP, rng) if with_zp else None
                with np.errstate(all="ignore"):
                    want = dml_quantize_linear(x, s, zp, output_dtype=QTYPES[out].dtype)
                regs = {"x": xt, "s": st, "prec": "float32", "cast": 1, "out": out}
                groups.add(f"DML {xt} -> {out} zp={with_zp}", fields(lane.config, regs), x, s,
                           zp if zp is not None else np.zeros(GROUP, QTYPES[out].dtype), want)
    return groups


@pytest.mark.sim
@requires_verilator
def test_quantize_lane_dml(lane_sim):
    """DirectML's quantize: float32 division (int32 input rounded to float32 first)."""
    groups = dml_groups(lane_sim[0], np.random.default_rng(3))
    assert run_groups(*lane_sim, groups) == len(groups.labels) * GROUP


@pytest.mark.sim
@requires_verilator
def test_quantize_lane_prepared_scales():
    """The lane of ``reciprocal_units > 0``: scales decoded and cast when the table is written,
    the division a multiply by the reciprocal with an exact correction. Every x, scale and
    output type, saturate, every precision and DirectML, as for the default lane."""
    lane = QuantizeLane(RECIP_CONFIG)
    assert lane._op_s is None and lane.scale_delay > 0
    check_groups(PreparedLane(lane), "quantize_lane_prepared", 6,
                 (every_type_groups, precision_groups, dml_groups))


def range_edge_groups(lane, rng) -> Groups:
    """Quotients where SignificandRound and FloatRound differ: at float16's and bfloat16's
    overflow threshold (65520 rounds to inf in float16, to 65536 unbounded) and across the
    subnormal ranges, for the 16-bit outputs that reach them, with and without a zero
    point."""
    groups = Groups(lane)
    c = lane.config
    edges = np.array([65503.9, 65504, 65504.1, 65519.9, 65520, 65520.1, 65535.4, 65535.5,
                      65536, 70000, 3.0e38, 3.4e38, 2.0**-14, 2.0**-24, 2.0**-25, 2.0**-126,
                      2.0**-149, 0.25, 0.4999, 0.5, 0.5001, 1.5, 2.5])
    q = np.concatenate([edges, -edges, rng.uniform(6e4, 7e4, 200), 2.0 ** rng.uniform(
        -30, -10, 200)])
    for prec in (p for p in ("float16", "bfloat16", "float32") if p in c.precisions):
        for out in ("uint16", "int16", "uint8"):
            s = np.exp2(rng.integers(-4, 4, q.size)).astype(np.float32)
            x = (q * s).astype(np.float32)
            zp = random_zp(out, q.size, rng)
            zp[: q.size // 2] = 0
            with np.errstate(all="ignore"):
                want = quantize_linear(x, s, zp, axis=0, precision=FLOAT_TYPES[prec])
            regs = {"x": "float32", "s": "float32", "prec": prec, "cast": 1, "out": out}
            groups.add(f"edges precision={prec} -> {out}", fields(c, regs), x, s, zp, want)
    return groups


@pytest.mark.sim
@requires_verilator
@pytest.mark.parametrize("divider", list(INT_CONFIGS))
def test_quantize_lane_int_outputs(divider):
    """A lane with integer outputs only rounds the quotient with SignificandRound (a shorter
    lane): exact for every x and scale type, every precision, DirectML, and the quotients at
    the precisions' overflow and subnormal edges."""
    lane = QuantizeLane(INT_CONFIGS[divider])
    assert isinstance(lane._round_q, SignificandRound)
    assert lane.latency < QuantizeLane(CONFIG).latency
    check_groups(PreparedLane(lane) if divider == "prepared" else lane,
                 f"quantize_lane_int_{divider}", 7,
                 (every_type_groups, precision_groups, dml_groups, range_edge_groups))


def test_quantize_lane_config_type():
    with pytest.raises(TypeError, match="config must be an AccelConfig"):
        QuantizeLane({"lanes": 1})


def test_quantize_lane_small_config():
    """A float32-only, int8-only instance is much shorter (no float64 quotient) and has no
    cast units (float32 operands are exact in its one precision)."""
    small = QuantizeLane(AccelConfig(q_inputs=("float32",), scales=("float32",),
                                     q_outputs=("int8", "uint8")))
    assert small.latency < QuantizeLane(CONFIG).latency
    assert small._op_x._round is None and QuantizeLane(CONFIG)._op_x._round is not None


@pytest.mark.sim
@requires_verilator
def test_quantize_lane_without_casts():
    """float32 x over float32 or float8e8m0 scales, every output: no cast units (the
    ``precision`` attribute float32 and DirectML's cast are the identity), still exact."""
    lane = QuantizeLane(AccelConfig(q_inputs=("float32",), scales=("float32", "float8e8m0")))
    assert lane._op_x._round is None and lane.config.precisions == ("float32",)
    sim = (lane, VectorSim(lane, name="quantize_lane_castless"))
    rng = np.random.default_rng(5)
    groups = every_type_groups(lane, rng)
    assert run_groups(*sim, groups) == len(groups.labels) * GROUP
    groups = precision_groups(lane, rng)
    assert run_groups(*sim, groups) == len(groups.labels) * (GROUP // 3)
