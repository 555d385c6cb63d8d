# amaranth: UnusedElaboratable=no
"""``Quantize.timing`` / ``Dequantize.timing``: a unit's cycles without building it (no
Amaranth component, no signal), equal to those of the unit built from the same configuration,
for the presets and configurations that take every path through the lanes."""

from __future__ import annotations

import pytest
from amaranth.hdl import Signal
from amaranth.lib import wiring

from qaccel.model.config import AccelConfig
from qaccel.model.presets import PRESETS, UNIT_PRESETS
from qaccel.rtl.arith.float_divide import FloatDivide
from qaccel.rtl.arith.float_to_int import FloatToInt
from qaccel.rtl.arith.int_diff import IntDiff
from qaccel.rtl.arith.int_scale_mul import IntScaleMul
from qaccel.rtl.arith.reciprocal import Reciprocal
from qaccel.rtl.arith.reciprocal_divide import ReciprocalDivide
from qaccel.rtl.elementwise import unit as elementwise
from qaccel.rtl.elementwise.dequantize import Dequantize
from qaccel.rtl.elementwise.dequantize_lane import DequantizeLane, dq_scales
from qaccel.rtl.elementwise.operand_cast import OperandCast
from qaccel.rtl.elementwise.quantize import Quantize
from qaccel.rtl.elementwise.quantize_lane import QuantizeLane
from qaccel.rtl.elementwise.scale_index import ScaleIndex
from qaccel.rtl.elementwise.scale_prep import ScalePrep
from qaccel.rtl.elementwise.unit import ElementwiseTiming
from qaccel.sim.formal import with_delay_lanes

_INT8 = dict(q_inputs=("float32",), scales=("float32",), q_outputs=("int8",))

CONFIGS = {
    "default": AccelConfig(),
    **{f"preset {name}": c for name, c in PRESETS.items()},
    **{f"unit preset {name}": c for name, c in UNIT_PRESETS.items()},
    # lanes and dimensions: the index generator's latency
    "2 lanes": AccelConfig(lanes=2, **_INT8),
    "4 lanes, 1 dim": AccelConfig(lanes=4, max_dims=1, **_INT8),
    "8 lanes, 8 dims": AccelConfig(lanes=8, max_dims=8, **_INT8),
    # scales: float8e8m0 alone (no divider) or beside a divider, narrow and int32 ones
    "e8m0 scales": AccelConfig(scales=("float8e8m0",)),
    "f32 and e8m0 scales": AccelConfig(scales=("float32", "float8e8m0")),
    "f16": AccelConfig(q_inputs=("float16",), scales=("float16",), dq_outputs=("float16",)),
    "bf16": AccelConfig(q_inputs=("bfloat16",), scales=("bfloat16",),
                        dq_outputs=("bfloat16",)),
    "int32 scales": AccelConfig(scales=("int32",), q_inputs=("float32",)),
    "int32 scales only": AccelConfig(scales=("int32",), q_inputs=("int32",)),
    # outputs: integer only (SignificandRound), float8, float4 (the zero point's add),
    # float64 computes (the rounding through float32)
    "int8 out": AccelConfig(**_INT8),
    "int and f8 out": AccelConfig(q_outputs=("uint4", "float8e5m2")),
    "f4 out": AccelConfig(q_outputs=("float4e2m1",)),
    "int and f4 out": AccelConfig(q_outputs=("int8", "float4e2m1")),
    "f64 compute": AccelConfig(q_inputs=("float32",), scales=("float32",),
                               precisions=("float32", "float64"),
                               q_outputs=("float8e4m3fn",)),
    "f64 compute, f4 out": AccelConfig(q_inputs=("int32",), scales=("float16",),
                                       q_outputs=("float4e2m1",)),
    "all precisions": AccelConfig(q_inputs=("float32",), scales=("float32",),
                                  precisions=("float32", "float16", "bfloat16", "float64")),
    # dequantize inputs and outputs: the integer path (narrow types, a narrowed output), the
    # general path (int32 and its float64 product, float8 / float4 codes)
    "dq int32": AccelConfig(dq_inputs=("int32",), dq_outputs=("float32",)),
    "dq int8 int32 to bf16": AccelConfig(dq_inputs=("int8", "int32"),
                                         dq_outputs=("bfloat16",)),
    "dq int16 f16": AccelConfig(dq_inputs=("int16",), scales=("float16",),
                                dq_outputs=("float16",)),
    "dq int4 e8m0": AccelConfig(dq_inputs=("int4", "uint2"), scales=("float8e8m0",)),
    "dq int2 f32": AccelConfig(dq_inputs=("int2", "uint2"), scales=("float32",),
                               dq_outputs=("float32",)),
    "dq int8 bf16 f16": AccelConfig(dq_inputs=("uint8", "int8"),
                                    scales=("bfloat16", "float16"),
                                    dq_outputs=("bfloat16", "float16")),
    "dq f8": AccelConfig(dq_inputs=("float8e4m3fn", "float8e5m2fnuz"),
                         dq_outputs=("float16",)),
    "dq f4": AccelConfig(dq_inputs=("float4e2m1",), dq_outputs=("float32",)),
    # prepared scales: reciprocal units (the table interval), divider DSP budgets
    "recip 1": AccelConfig(reciprocal_units=1),
    "recip 3, no dsp": AccelConfig(reciprocal_units=3, divider_dsps=0),
    "recip 8, 1 dsp, 2 lanes": AccelConfig(reciprocal_units=8, divider_dsps=1, lanes=2),
    "recip 2, f16": AccelConfig(reciprocal_units=2, q_inputs=("float16",),
                                scales=("float16",)),
    "recip, f32 and e8m0": AccelConfig(reciprocal_units=1, scales=("float32", "float8e8m0"),
                                       q_outputs=("int8", "float8e4m3fn")),
    "recip 4, int32, 2 dsp": AccelConfig(reciprocal_units=4, q_inputs=("int32",),
                                         scales=("float32",), divider_dsps=2),
    # the array divider's digits per stage
    "divider 2 bits": AccelConfig(divider_bits_per_stage=2),
    "divider 4 bits, f64": AccelConfig(divider_bits_per_stage=4, q_inputs=("int32",)),
    # table depths
    "depth 2": AccelConfig(table_depth=2, **_INT8),
    "depth 16, 2 lanes": AccelConfig(table_depth=16, lanes=2),
    "depth 65536, recip": AccelConfig(table_depth=65536, reciprocal_units=1, **_INT8),
}

#: Entry counts for ``load_cycles``.
ENTRIES = (0, 1, 2, 3, 17, 512)


def figures(unit) -> ElementwiseTiming:
    """A built unit's cycles, read from its attributes."""
    return ElementwiseTiming(latency=unit.latency, start_latency=unit.start_latency,
                             table_interval=unit.table_interval,
                             lane_latency=unit.lane_latency)


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("cls", [Quantize, Dequantize])
def test_timing_equals_built_unit(cls, name):
    config = CONFIGS[name]
    if cls is Dequantize and not dq_scales(config):
        # no float scale type: neither the unit nor its timing exists
        for make in (cls, cls.timing):
            with pytest.raises(ValueError, match="float type for dequantisation"):
                make(config)
        pytest.skip(f"Dequantize needs a float scale type, not {config.scales}")
    timing = cls.timing(config)
    unit = cls(config)
    assert timing == figures(unit)
    assert timing.lane_latency == unit._lanes[0].latency
    assert [timing.load_cycles(n) for n in ENTRIES] == [unit.load_cycles(n) for n in ENTRIES]
    assert cls.timing(config) is timing                     # cached


@pytest.mark.parametrize("cls", [Quantize, Dequantize])
@pytest.mark.parametrize("name", ["unit preset qdq-int8-x8", "recip 8, 1 dsp, 2 lanes",
                                  "dq int8 bf16 f16"])
def test_timing_describes_ecp5_builds(cls, name):
    config = CONFIGS[name]
    assert figures(cls(config, ecp5=True)) == cls.timing(config)


def test_timing_figures():
    """The composition: table read and FIFO around the lane; the index generator or the table
    preparation before the first beat; one write per ``table_interval`` cycles."""
    plain = Quantize.timing(CONFIGS["2 lanes"])
    assert plain.latency == 2 + plain.lane_latency + 2
    assert plain.start_latency == ScaleIndex.latency_for(lanes=2, max_dims=4)
    assert plain.table_interval == 1
    assert [plain.load_cycles(n) for n in ENTRIES] == [1, 2, 3, 4, 18, 513]
    config = CONFIGS["recip 3, no dsp"]
    prep = QuantizeLane.plan(config).prep
    prepared = Quantize.timing(config)
    assert prepared.table_interval == prep.interval > 1
    assert prepared.start_latency == prep.latency
    assert prepared.load_cycles(3) == 2 * prep.interval + 2
    assert Dequantize.timing(config).table_interval == 1
    assert DequantizeLane.plan(config).prep is None


def test_sub_unit_latency_for():
    """Each sub-unit's ``latency_for`` (``timing_for``) is its built latency."""
    for q, bits in [(26, 1), (26, 2), (26, 4), (55, 1), (55, 4), (13, 3)]:
        unit = FloatDivide(a_width=24, b_width=24, q_width=q, exp_width=10, bits_per_stage=bits)
        assert FloatDivide.latency_for(q_width=q, bits_per_stage=bits) == unit.latency
    for w, q, dsps in [(24, 26, None), (24, 26, 3), (24, 26, 0), (11, 13, None),
                       (53, 55, 2), (53, 55, None)]:
        unit = ReciprocalDivide(a_width=w, b_width=w, q_width=q, exp_width=10, max_dsps=dsps)
        assert ReciprocalDivide.latency_for(a_width=w, b_width=w, q_width=q,
                                            max_dsps=dsps) == unit.latency
    for r, bits in [(27, 1), (27, 2), (14, 4)]:
        unit = Reciprocal(d_width=24, r_width=r, bits_per_cycle=bits)
        assert Reciprocal.latency_for(r_width=r, bits_per_cycle=bits) == unit.latency
    for types in [("int8",), ("uint16", "int4"), ("int32",), ("int2", "int32")]:
        unit = IntDiff(types)
        assert (IntDiff.latency_for(types), IntDiff.width_for(types)) == (unit.latency,
                                                                          unit.width)
    for width in (2, 9, 10, 17):
        for sig in (1, 2, 8, 18, 19, 24):
            unit = IntScaleMul(width=width, sig_width=sig)
            assert IntScaleMul.latency_for(width=width, sig_width=sig) == unit.latency
    for cast in (False, True):
        unit = OperandCast(("float32", "int32"), casts=("float32",), cast=cast, sig_width=32,
                           exp_width=10)
        assert OperandCast.latency_for(cast=cast) == unit.latency
    for lanes, dims in [(1, 4), (2, 1), (8, 8)]:
        unit = ScaleIndex(lanes=lanes, max_dims=dims)
        assert ScaleIndex.latency_for(lanes=lanes, max_dims=dims) == unit.latency
    for units in (1, 3, 8):
        unit = ScalePrep(decode_latency=12, sig_width=24, exp_width=10, r_width=27,
                         addr_width=9, scale_shape=32, zp_shape=8, units=units)
        t = ScalePrep.timing_for(decode_latency=12, r_width=27, units=units)
        assert (t.latency, t.interval) == (unit.latency, unit.interval)


def test_timing_default_config():
    assert Quantize.timing() == Quantize.timing(None) == Quantize.timing(AccelConfig())
    assert Dequantize.timing() == figures(Dequantize())


def test_timing_builds_nothing(monkeypatch):
    """No component, no signal: the perf model reads the cycles of any configuration fast."""
    elementwise._planned.cache_clear()

    def refuse(*args, **kwargs):
        raise AssertionError("timing built an Amaranth object")

    monkeypatch.setattr(wiring.Component, "__init__", refuse)
    monkeypatch.setattr(Signal, "__init__", refuse)
    # Signal(...) itself, before __new__ (setting Signal.__new__ could not be undone cleanly)
    monkeypatch.setattr(type(Signal), "__call__", refuse)
    with pytest.raises(AssertionError, match="built an Amaranth object"):
        Quantize(CONFIGS["default"])
    for name, config in CONFIGS.items():
        assert Quantize.timing(config).latency > 0, name
        if dq_scales(config):
            assert Dequantize.timing(config).latency > 0, name
    monkeypatch.undo()
    for name in ("default", "recip 1", "dq int8 bf16 f16"):
        for cls in (Quantize, Dequantize):
            assert cls.timing(CONFIGS[name]) == figures(cls(CONFIGS[name]))


@pytest.mark.parametrize("config", [{"lanes": 2}, AccelConfig().elementwise, "default", 1])
@pytest.mark.parametrize("call", [Quantize.timing, Dequantize.timing, Quantize,
                                  QuantizeLane.plan, DequantizeLane.plan])
def test_timing_bad_config(call, config):
    with pytest.raises(TypeError, match="config must be an AccelConfig"):
        call(config)


def test_timing_needs_lane_plan():
    """Stand-in lanes without a plan (the formal harness's) build, but have no timing."""
    cls = with_delay_lanes(Quantize, 3)
    assert cls(CONFIGS["int8 out"]).lane_latency == 3
    with pytest.raises(TypeError, match="plan"):
        cls.timing(CONFIGS["int8 out"])


def test_drift_is_an_internal_error(monkeypatch):
    """A sub-unit whose built latency is not the planned one stops the build."""
    config = CONFIGS["int8 out"]
    monkeypatch.setattr(FloatToInt, "latency", property(lambda self: 99))
    with pytest.raises(RuntimeError, match="internal error: QuantizeLane"):
        Quantize(config)
    monkeypatch.undo()
    monkeypatch.setattr(ScaleIndex, "latency", property(lambda self: 99))
    with pytest.raises(RuntimeError, match="internal error: Quantize built"):
        Quantize(config)
