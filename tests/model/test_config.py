"""AccelConfig: defaults, validation (one test per error), JSON round trip, stable slug."""

from __future__ import annotations

import json

import pytest

from qaccel.model.config import DQ_INPUTS, Q_INPUTS, Q_OUTPUTS, AccelConfig


def test_defaults_carry_every_type():
    c = AccelConfig()
    assert c.lanes == 1
    assert c.q_inputs == Q_INPUTS and c.q_outputs == Q_OUTPUTS and c.dq_inputs == DQ_INPUTS
    assert c.precisions == ("float32", "float16", "bfloat16", "float64")


def test_precisions_derived_from_types():
    c = AccelConfig(q_inputs=("float16",), scales=("float16",))
    assert c.precisions == ("float32", "float16")
    assert AccelConfig(q_inputs=("int32",), scales=("float32",)).precisions == (
        "float32", "float64")


def test_type_tuples_are_put_in_canonical_order():
    c = AccelConfig(q_outputs=["uint4", "int8"])
    assert c.q_outputs == ("int8", "uint4")


def test_json_round_trip(tmp_path):
    c = AccelConfig(lanes=4, q_outputs=("int8", "float4e2m1"), table_depth=64)
    assert AccelConfig.from_json(c.to_json()) == c
    path = tmp_path / "cfg.json"
    path.write_text(c.to_json())
    assert AccelConfig.load(path) == c
    assert json.loads(c.to_json())["lanes"] == 4


def test_slug_is_stable_and_distinguishes():
    assert AccelConfig().slug == AccelConfig().slug
    assert AccelConfig(lanes=2).slug != AccelConfig().slug
    assert len(AccelConfig().slug) == 12
    assert AccelConfig().replace(lanes=2) == AccelConfig(lanes=2)


@pytest.mark.parametrize(("changes", "error", "match"), [
    ({"lanes": 3}, ValueError, "lanes must be one of"),
    ({"lanes": True}, ValueError, "lanes must be one of"),
    ({"q_inputs": "float32"}, TypeError, "q_inputs must be a tuple of type names"),
    ({"q_inputs": ()}, ValueError, "q_inputs must name at least one type"),
    ({"q_outputs": ("int7",)}, ValueError, "q_outputs may contain .* got 'int7'"),
    ({"dq_outputs": ("float32", "float32")}, ValueError, "dq_outputs must not repeat"),
    ({"scales": ("float64",)}, ValueError, "scales may contain"),
    ({"table_depth": 1000}, ValueError, "table_depth must be a power of two"),
    ({"table_depth": 1 << 17}, ValueError, "table_depth must be in"),
    ({"table_depth": 16.0}, TypeError, "table_depth must be an integer"),
    ({"max_dims": 0}, ValueError, "max_dims must be in"),
    ({"size_width": 2}, ValueError, "size_width must be in"),
    ({"count_width": 64}, ValueError, "count_width must be in"),
    ({"divider_bits_per_stage": 3}, ValueError, "divider_bits_per_stage must be 1, 2 or 4"),
    ({"precisions": ("float32",)}, ValueError, "precisions must include float64"),
    ({"pe": 0}, ValueError, r"pe must be in \[1, 128\], not 0"),
    ({"pe": 2.0}, TypeError, "pe must be an integer"),
    ({"m_tile": 17}, ValueError, r"m_tile must be in \[1, 16\], not 17"),
    ({"max_k": 3000}, ValueError, "max_k must be a power of two from max_block_size"),
    ({"max_k": 128}, ValueError, r"max_k must be in \[256, 65536\], not 128"),
    ({"dsp_pairs": 17}, ValueError, r"dsp_pairs must be in \[0, 16\], not 17"),
    ({"dsp_pairs": "all"}, TypeError, "dsp_pairs must be an integer"),
    ({"simd": 32}, ValueError, r"simd must be one of \(1, 2, 4, 8, 16\), not 32"),
    ({"weight_bus_width": 96}, ValueError, "weight_bus_width must be a power of two, not 96"),
    ({"weight_bus_width": 16}, ValueError, r"weight_bus_width must be in \[32, 2048\]"),
    ({"nbits": 4}, TypeError, "nbits must be a tuple of bit widths, not 4"),
    ({"nbits": (4, 4)}, ValueError, "nbits must hold distinct widths"),
    ({"nbits": (1, 4)}, ValueError, r"nbits must hold distinct widths .*, not \(1, 4\)"),
    ({"partial_sums": 17}, ValueError, r"partial_sums must be in \[1, 16\], not 17"),
    ({"max_block_size": 48}, ValueError, r"max_block_size must be a power of two .*, not 48"),
    ({"max_block_size": 2048}, ValueError, r"max_block_size must be in \[16, 1024\]"),
    ({"pe": 1, "weight_bus_width": 512}, ValueError, r"at most 256 bits per column"),
])
def test_errors_name_field_and_value(changes, error, match):
    with pytest.raises(error, match=match):
        AccelConfig(**changes)


def test_mac_engine_fields_round_trip():
    c = AccelConfig(pe=8, simd=16, weight_bus_width=512, nbits=[8, 4], partial_sums=2)
    assert c.nbits == (4, 8)                                   # sorted tuple
    assert AccelConfig.from_json(c.to_json()) == c
    assert c.slug != AccelConfig().slug


def test_from_dict_errors():
    with pytest.raises(ValueError, match="unknown config field.*lane\\b"):
        AccelConfig.from_dict({"lane": 2})
    with pytest.raises(TypeError, match="config must be a JSON object"):
        AccelConfig.from_dict([1])
