"""The performance model (qaccel.model.perf): each bound of a MatMulNBits pass, bytes per
stream, a whole call's latency as the sum of the RTL units' own latencies, the elementwise
units' calls, and bad input. Agreement with the RTL: tests/rtl/test_matmul_nbits.py
(test_utilisation, test_whole_call_cycles) and tests/qaccel/test_rtl_engine.py."""

from __future__ import annotations

from fractions import Fraction

import pytest

from qaccel.model.config import AccelConfig
from qaccel.model.perf import (
    OUTPUT_LATENCY,
    elementwise_call,
    nbits_call,
    nbits_latency,
    nbits_pass,
)

P2S4 = AccelConfig(pe=2, simd=4, weight_bus_width=32, float_path=True)
#: The v1 engine of the old default configuration (AccelConfig() is the v2 engine now).
V1 = AccelConfig(pe=4, simd=8, weight_bus_width=128, float_path=True, m_tile=1,
                 dsp_pairs=None)


@pytest.mark.parametrize(("config", "kwargs", "bound", "cycles"), [
    (P2S4, dict(K=1024, bits=4, block_size=32), "compute", 256),
    (P2S4, dict(K=1000, bits=4, block_size=32), "compute", 256),          # K padded to blocks
    (P2S4, dict(K=1024, bits=5, block_size=32), "weight bus", 320),
    (V1, dict(K=1024, bits=5, block_size=32), "weight bus", 160),
    (AccelConfig(pe=4, simd=16, weight_bus_width=128, float_path=True),  # an average
     dict(K=1040, bits=3, block_size=16), "weight bus", Fraction(195, 2)),
    (P2S4, dict(K=128, bits=4, block_size=32), "fold", 64),
    (AccelConfig(pe=1, simd=16, weight_bus_width=128, float_path=True),
     dict(K=1024, bits=4, block_size=16, bias=True), "scale stream", 65),
    (V1, dict(K=1024, bits=4, block_size=32, accuracy_level=0, bias=True),
     "compute", 128),
    (AccelConfig(pe=1, simd=16, weight_bus_width=32, partial_sums=2, float_path=False),
     dict(K=1024, bits=2, block_size=16), "accumulate", 8 * 31 + 1 + 1),  # RTL: 250
    (AccelConfig(pe=1, simd=8, weight_bus_width=64, partial_sums=3, float_path=True),
     # a beat per operand
     dict(K=1024, bits=4, block_size=32, accuracy_level=0), "accumulate", 8 * 42 + 1 + 1),
    (V1, dict(K=1024, bits=4, block_size=32, accuracy_level=4, bias=True),
     "compute", 128),
])
def test_bounds(config, kwargs, bound, cycles):
    p = nbits_pass(config, **kwargs)
    assert (p.bound, p.cycles) == (bound, cycles)
    assert p.limits[bound] <= p.cycles and all(v <= p.cycles for v in p.limits.values())


def test_paths_bytes_and_rates():
    p = nbits_pass(V1, K=1000, bits=4, block_size=32, zero_points="packed")
    assert p.path == "int8" and p.macs == 4000
    assert p.bytes == {"a": 1000 * 4, "w": 4 * 1024 * 4 // 8, "s": 32 * 4 * 8,
                       "z": 16 * 4, "y": 16}
    assert p.macs_per_cycle == pytest.approx(4000 / 128) and p.utilisation < 1.0
    assert nbits_pass(V1, K=64, bits=4, block_size=32,
                      zero_points="float").path == "float"
    assert nbits_pass(V1, K=64, bits=4, block_size=32,
                      zero_points="none").bytes["z"] == 0


@pytest.mark.parametrize(("kwargs", "exc", "match"), [
    (dict(bits=9), ValueError, "bits must be one of"),
    (dict(bits=4.0), TypeError, "bits must be an integer"),
    (dict(block_size=24), ValueError, "block_size must be a power of two"),
    (dict(block_size=512), ValueError, "block_size must be in .*512"),
    (dict(K=0), ValueError, "K must be in"),
    (dict(zero_points="int"), ValueError, "zero_points must be one of"),
    (dict(accuracy_level=5), ValueError, "accuracy_level must be in"),
])
def test_bad_input_is_named(kwargs, exc, match):
    args = dict(K=64, bits=4, block_size=32) | kwargs
    with pytest.raises(exc, match=match):
        nbits_pass(P2S4, **args)


def test_float_path_must_be_carried():
    config = AccelConfig(pe=2, simd=4, weight_bus_width=32, float_path=False)
    with pytest.raises(ValueError, match="float_path"):
        nbits_pass(config, K=64, bits=4, block_size=32, accuracy_level=0)
    with pytest.raises(TypeError, match="config must be an AccelConfig"):
        nbits_pass({}, K=64, bits=4, block_size=32)


SHAPES = [P2S4, AccelConfig(pe=4, simd=2, weight_bus_width=64, partial_sums=3, float_path=True),
          AccelConfig(pe=1, simd=16, weight_bus_width=32, partial_sums=2, float_path=True), V1]


@pytest.mark.parametrize("config", SHAPES, ids=["p2s4", "p4s2", "p1s16", "default"])
def test_latency_is_the_units_latencies(config):
    """nbits_latency is the sum of the RTL units' own latency attributes (plus the block-term
    hand-off), so a change in a unit's pipeline shows here."""
    from qaccel.rtl import matmul_nbits as engine
    from qaccel.rtl.activation_quant import ActivationQuant
    from qaccel.rtl.block_scale import BlockScale
    from qaccel.rtl.float_mac import FloatMac
    from qaccel.rtl.mac_array import MacArray
    from qaccel.rtl.row_accumulate import RowAccumulate

    pe, simd, sums = config.pe, config.simd, config.partial_sums
    assert OUTPUT_LATENCY == engine._OUT_DECODE_LATENCY + engine._OUT_ROUND_LATENCY + 2
    mac = MacArray(pe=pe, simd=simd, max_block=config.max_block_size)
    int8_units = (ActivationQuant(simd=simd, max_block=config.max_block_size,
                                  count_width=engine.COUNT_WIDTH).latency + mac.latency
                  + BlockScale(pe=pe, isum_width=mac.isum_width,
                               asum_width=mac.asum_width).latency
                  + RowAccumulate(pe=pe, partial_sums=sums).latency)
    for bs in (16, 32, 256):
        assert nbits_latency(config, block_size=bs, path="int8") == \
            int8_units + bs // simd + 1 + OUTPUT_LATENCY
    assert nbits_latency(config, block_size=32, path="float") == \
        FloatMac(pe=pe, simd=simd, partial_sums=sums).latency + OUTPUT_LATENCY


def test_whole_call():
    """Start cycles + passes + latency; bytes and MACs of the whole call."""
    c = nbits_call(P2S4, M=2, N=4, K=1024, bits=4, block_size=32)
    assert c.passes == 4 and c.latency == 151 and c.bound == "compute"
    assert c.cycles == 5 + 4 * 256 + 151                                   # RTL: 1180
    assert nbits_call(P2S4, M=2, N=4, K=1024, bits=4, block_size=32,
                      accuracy_level=0).cycles == 7 + 4 * 256 + 124       # RTL: 1155
    assert c.macs == 2 * 4 * 1024 and c.bytes["w"] == 4 * 2 * 1024 * 4 // 8
    assert c.utilisation == pytest.approx(8192 / 1180 / 8)
    # short rows wait for the fold, but the first does not: RTL 488
    assert nbits_call(P2S4, M=3, N=4, K=64, bits=4, block_size=16).cycles == 5 + 16 + 5 * 64 + 147
    for name, value in (("M", 0), ("N", 0)):
        with pytest.raises(ValueError, match=f"{name} must be in"):
            nbits_call(P2S4, **({"M": 1, "N": 1} | {name: value}), K=64, bits=4, block_size=32)
    with pytest.raises(ValueError, match="path must be"):
        nbits_latency(P2S4, block_size=32, path="int4")


def test_elementwise_call():
    """Per job: table entries + start, the index generator's start latency, one beat per
    cycle, the unit's latency (the default Quantize unit: start latency 6, latency 81)."""
    c = elementwise_call(AccelConfig(), "quantize", [(16384, 1)])
    assert (c.start_latency, c.latency) == (6, 81)
    assert (c.cycles, c.load_cycles, c.beats, c.bound) == (2 + 16384 + 6 + 81, 2, 16384,
                                                           "stream")
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
