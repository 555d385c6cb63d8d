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
from qaccel.model.dtypes import FLOAT_TYPES, QTYPES
from qaccel.model.presets import preset
from qaccel.model.quant import dequantize_linear
from qaccel.rtl.dequantize_lane import DequantizeLane, dq_scales
from qaccel.sim.runner import missing_simulator
from qaccel.sim.vectors import VectorSim

from .lane_groups import Groups, random_e8m0, run_groups

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
    """The unit presets' lanes build only the stages their types need (no int32: no
    ``x.astype(float32)`` rounding and no float64 product; a float32-only output: no output
    rounding after the product's) and stay exact for every type they carry."""
    lane = DequantizeLane(preset(name))
    assert lane._round_x is None and lane._round_b is None
    assert (lane._round_out is None) == (lane.config.dq_outputs == ("float32",))
    assert lane.latency < DequantizeLane(CONFIG).latency
    sim = VectorSim(lane, name=f"dequantize_lane_{name.replace('-', '_')}")
    groups = every_type_groups(lane, np.random.default_rng(9))
    assert run_groups(lane, sim, groups) == len(groups.labels) * GROUP
