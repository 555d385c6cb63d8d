"""The v2 engine presets: valid configurations whose steady state keeps at least 95% of the
MAC peak at every bits 2..8 x block_size 16..256 point (the performance model's figure, which
tests/rtl/nbits/test_matmul_nbits_v2.py holds exact against the RTL)."""

from __future__ import annotations

import pytest

from qaccel.explore.perf import nbits_v2_call
from qaccel.model.config import AccelConfig
from qaccel.model.presets import PRESETS, preset


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_steady_state_at_least_95_percent(name, capsys):
    config = preset(name)
    worst = min(nbits_v2_call(config, M=M, N=4096, K=4096, bits=bits,
                              block_size=bs).steady_utilisation
                for bits in range(2, 9) for bs in (16, 32, 64, 128, 256)
                for M in (1, config.m_tile))
    with capsys.disabled():
        print(f"\n{name}: pe {config.pe} x simd {config.simd}, {config.scale_lanes} lanes in "
              f"{config.clusters} cluster(s), "
              f"worst steady-state utilisation {worst:.3f}")
    assert worst >= 0.95


def test_gemv_4096_int4(capsys):
    """The 4096 x 4096 int4 layer (block 32, M = 1): cycles and MAC/cycle per preset."""
    for name in sorted(PRESETS):
        c = nbits_v2_call(preset(name), M=1, N=4096, K=4096, bits=4, block_size=32)
        with capsys.disabled():
            print(f"\n{name}: {c.cycles} cycles, {c.macs_per_cycle:.2f} MAC/cycle of "
                  f"{c.peak_per_cycle}, {sum(c.bytes.values())} bytes")
        assert c.macs_per_cycle >= 0.95 * c.peak_per_cycle


def test_ecp5_25k_is_the_default_config():
    assert preset("ecp5-25k") == AccelConfig() and preset("ecp5-25k").dsp_pairs == 12
    c = preset("ecp5-85k")
    assert (c.pe, c.simd, c.m_tile, c.dsp_pairs, c.float_path, c.clusters) == (
        128, 1, 4, 48, True, 4)


def test_unknown_preset():
    with pytest.raises(ValueError, match="preset must be one of ecp5-25k, ecp5-85k, "
                                         "ecp5-85k-float, qdq-int8, qdq-int8-x8, qdq-mx, "
                                         "not 'x'"):
        preset("x")


def test_unit_presets():
    """The Quantize / Dequantize presets: what they carry; the int8 ones divide through
    prepared reciprocals (the eight-lane one within 24 MULT18X18D), the MX one builds no
    divider and no casts."""
    from qaccel.rtl.arith.reciprocal_divide import ReciprocalDivide
    from qaccel.rtl.elementwise.quantize_lane import QuantizeLane

    assert preset("qdq-int8").q_outputs == ("int8",) and preset("qdq-int8-x8").lanes == 8
    one, eight = (QuantizeLane(preset(n)) for n in ("qdq-int8", "qdq-int8-x8"))
    assert isinstance(one._div, ReciprocalDivide) and one._div.dsps == 4
    assert isinstance(eight._div, ReciprocalDivide) and 8 * eight._div.dsps <= 24
    mx = QuantizeLane(preset("qdq-mx"))
    assert mx._div is None and mx._op_x._round is None and preset("qdq-mx").precisions == (
        "float32",)
