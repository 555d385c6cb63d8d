"""The MatMulNBits performance model (qaccel.model.perf): each bound, the float path's bias
cycle, bytes per stream, and bad input. Its agreement with the RTL is tested in
tests/rtl/test_matmul_nbits.py::test_utilisation (every bits x block_size pair, exact)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from qaccel.model.config import AccelConfig
from qaccel.model.perf import nbits_pass

P2S4 = AccelConfig(pe=2, simd=4, weight_bus_width=32)


@pytest.mark.parametrize(("config", "kwargs", "bound", "cycles"), [
    (P2S4, dict(K=1024, bits=4, block_size=32), "compute", 256),
    (P2S4, dict(K=1000, bits=4, block_size=32), "compute", 256),          # K padded to blocks
    (P2S4, dict(K=1024, bits=5, block_size=32), "weight bus", 320),
    (AccelConfig(), dict(K=1024, bits=5, block_size=32), "weight bus", 160),
    (AccelConfig(pe=4, simd=16, weight_bus_width=128),                    # an average
     dict(K=1040, bits=3, block_size=16), "weight bus", Fraction(195, 2)),
    (P2S4, dict(K=128, bits=4, block_size=32), "fold", 64),
    (AccelConfig(pe=1, simd=16, weight_bus_width=128, partial_sums=1),
     dict(K=1024, bits=4, block_size=16, bias=True), "scale stream", 65),
    (AccelConfig(), dict(K=1024, bits=4, block_size=32, accuracy_level=0, bias=True),
     "compute", 129),                                                     # measured: 129
    (AccelConfig(), dict(K=1024, bits=4, block_size=32, accuracy_level=4, bias=True),
     "compute", 128),
])
def test_bounds(config, kwargs, bound, cycles):
    p = nbits_pass(config, **kwargs)
    assert (p.bound, p.cycles) == (bound, cycles)
    assert p.limits[bound] <= p.cycles and all(v <= p.cycles for v in p.limits.values())


def test_paths_bytes_and_rates():
    p = nbits_pass(AccelConfig(), K=1000, bits=4, block_size=32, zero_points="packed")
    assert p.path == "int8" and p.macs == 4000
    assert p.bytes == {"a": 1000 * 4, "w": 4 * 1024 * 4 // 8, "s": 32 * 4 * 8,
                       "z": 16 * 4, "y": 16}
    assert p.macs_per_cycle == pytest.approx(4000 / 128) and p.utilisation < 1.0
    assert nbits_pass(AccelConfig(), K=64, bits=4, block_size=32,
                      zero_points="float").path == "float"
    assert nbits_pass(AccelConfig(), K=64, bits=4, block_size=32,
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
