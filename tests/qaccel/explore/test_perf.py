"""The performance models (qaccel.explore.perf): the elementwise units' calls and bad input to
them and to the v2 engine's model. Agreement with the RTL: tests/qaccel/engine/test_rtl_engine.py
(elementwise_call) and tests/rtl/nbits/test_matmul_nbits_v2.py (nbits_v2_call)."""

from __future__ import annotations

import pytest

from qaccel.explore.perf import elementwise_call, nbits_v2_call
from qaccel.model.config import AccelConfig
from qaccel.model.presets import preset
from qaccel.rtl.elementwise.quantize import Quantize
from qaccel.rtl.elementwise.unit import _planned


def test_elementwise_call():
    """Per job: table entries + start, the index generator's start latency, one beat per
    cycle, the unit's latency (the default Quantize unit: latency 113); on
    the qdq-int8 Quantize unit a table write every 28 cycles and the preparation's latency
    (34 cycles) before the first beat."""
    c = elementwise_call(AccelConfig(), "quantize", [(16384, 1)])
    index = Quantize.timing(AccelConfig()).start_latency
    assert (c.start_latency, c.latency) == (index, 113)
    assert (c.cycles, c.load_cycles, c.beats, c.bound) == (2 + 16384 + index + 113, 2, 16384,
                                                           "stream")
    p = elementwise_call(preset("qdq-int8"), "quantize", [(1000, 10)])
    assert (p.load_cycles, p.start_latency) == (9 * 28 + 2, 34)
    assert p.cycles == p.load_cycles + 1000 + 34 + p.latency
    c4 = elementwise_call(AccelConfig(lanes=4), "dequantize", [(105, 7), (1000, 1)])
    assert c4.beats == 27 + 250 and c4.jobs == 2
    assert c4.cycles == 8 + 2 + 277 + 2 * (c4.start_latency + c4.latency)
    assert elementwise_call(AccelConfig(), "dml", [(10, 10)]).bound == "latency"


@pytest.mark.parametrize(("op", "jobs", "exc", "match"), [
    ("matmul", [(1, 1)], ValueError, "op must be one of"),
    ("quantize", [], ValueError, "jobs must hold at least one"),
    ("quantize", 5, TypeError, "jobs must be a sequence"),
    ("quantize", [(1, 2, 3)], TypeError, r"jobs\[0\] must be an \(elements"),
    ("quantize", [(0, 1)], ValueError, r"jobs\[0\] elements must be in"),
    ("quantize", [(8, 2000)], ValueError, r"jobs\[0\] table_entries must be in"),
])
def test_elementwise_bad_input(op, jobs, exc, match):
    with pytest.raises(exc, match=match):
        elementwise_call(AccelConfig(), op, jobs)


@pytest.mark.parametrize(("kwargs", "exc", "match"), [
    (dict(M=0), ValueError, "M must be in"),
    (dict(K=2048), ValueError, r"K must be in \[1, 1024\], not 2048"),
    (dict(bits=9), ValueError, "bits must be one of"),
    (dict(bits=4.0), TypeError, "bits must be an integer"),
    (dict(block_size=24), ValueError, "block_size must be a power of two"),
    (dict(block_size=512), ValueError, "block_size must be in .*512"),
    (dict(float_path=1), TypeError, "float_path must be a bool"),
    (dict(float_path=True), ValueError, "need an engine built with config.float_path"),
    (dict(float_zero_points=True), ValueError, "float_zero_points calls take the float path"),
])
def test_nbits_v2_call_bad_input_is_named(kwargs, exc, match):
    config = AccelConfig(pe=4, simd=2, m_tile=3, max_k=1024, max_block_size=256)
    args = dict(M=1, N=8, K=64, bits=4, block_size=32) | kwargs
    with pytest.raises(exc, match=match):
        nbits_v2_call(config, **args)
    with pytest.raises(TypeError, match="config must be an AccelConfig"):
        nbits_v2_call({}, **args)


def test_models_build_no_rtl(monkeypatch):
    """The models compose the units' timing functions (each unit's own, which its properties
    use too): no Amaranth component is made, for the elementwise units (the timing cache
    cleared), an engine of several clusters or one with the float path. A config the engine
    refuses is refused by the model alike."""
    from amaranth.lib import wiring

    def refuse(self, *args, **kwargs):
        raise AssertionError(f"{type(self).__name__} was built")

    monkeypatch.setattr(wiring.Component, "__init__", refuse)
    _planned.cache_clear()                  # computed afresh below
    for config in (AccelConfig(), preset("qdq-int8"), AccelConfig(lanes=4)):
        for op in ("quantize", "dequantize", "dml"):
            call = elementwise_call(config, op, [(1000, 3)])
            assert call.cycles > call.beats + call.latency
    for name in ("ecp5-25k", "ecp5-85k", "ecp5-85k-float"):
        config = preset(name)
        call = nbits_v2_call(config, M=5, N=64, K=512, bits=4, block_size=32)
        assert call.cycles > call.macs / (config.pe * config.simd)
        if config.float_path:
            f = nbits_v2_call(config, M=5, N=64, K=512, bits=4, block_size=32,
                              float_path=True, float_zero_points=True)
            assert f.cycles > call.cycles
    for config, match in ((AccelConfig(pe=6, simd=4), r"pe / scale_lanes .* 6 / 2"),
                          (AccelConfig(pe=4, simd=16, clusters=2), r"clusters \(2\) need")):
        with pytest.raises(ValueError, match=match):
            nbits_v2_call(config, M=1, N=8, K=64, bits=4, block_size=32)
