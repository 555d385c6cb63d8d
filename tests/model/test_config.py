"""AccelConfig: defaults, validation (one test per error), JSON round trip, stable slug."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle

import pytest

from qaccel.model.config import (
    DQ_INPUTS,
    Q_INPUTS,
    Q_OUTPUTS,
    AccelConfig,
    ElementwiseConfig,
    MatMulNBitsConfig,
)


def test_defaults_carry_every_type():
    c = AccelConfig()
    assert c.lanes == 1
    assert c.q_inputs == Q_INPUTS and c.q_outputs == Q_OUTPUTS and c.dq_inputs == DQ_INPUTS
    assert c.precisions == ("float32", "float16", "bfloat16", "float64")


def test_default_engine_is_the_ecp5_25k_v2_engine():
    c = AccelConfig()
    assert (c.pe, c.simd, c.m_tile, c.max_k, c.max_block_size, c.dsp_pairs,
            c.float_path) == (32, 1, 4, 4096, 256, 12, False)
    assert c.scale_lanes == 2 and c.nbits == tuple(range(2, 9))


def test_dsp_pairs_is_a_budget():
    """A budget covering every two-MAC slot (``pe * simd / 2``) means all of them: None."""
    assert AccelConfig(pe=4, simd=2).dsp_pairs is None                # default 12 >= 4 slots
    assert AccelConfig(pe=4, simd=2) == AccelConfig(pe=4, simd=2, dsp_pairs=None)
    assert AccelConfig(pe=4, simd=2, dsp_pairs=4).dsp_pairs is None
    assert AccelConfig(pe=4, simd=2, dsp_pairs=3).dsp_pairs == 3
    assert AccelConfig(pe=32, dsp_pairs=16).slug == AccelConfig(pe=32, dsp_pairs=None).slug
    assert AccelConfig(pe=4, simd=2).replace(dsp_pairs=0).dsp_pairs == 0


def test_default_json_round_trip(tmp_path):
    """The default engine's fields survive a save and load; a file of an older default
    (only the fields it set) loads with today's defaults for the rest."""
    c = AccelConfig()
    path = tmp_path / "default.json"
    path.write_text(c.to_json())
    assert AccelConfig.load(path) == c and AccelConfig.load(path).dsp_pairs == 12
    v1 = AccelConfig(pe=4, simd=8, float_path=True, m_tile=1, dsp_pairs=None)
    path.write_text(v1.to_json())
    assert AccelConfig.load(path) == v1
    path.write_text(json.dumps({"pe": 4, "simd": 8, "weight_bus_width": 128}))
    with pytest.warns(DeprecationWarning, match="weight_bus_width is ignored"):
        loaded = AccelConfig.load(path)
    assert (loaded.pe, loaded.float_path, loaded.m_tile, loaded.dsp_pairs) == (4, False, 4, 12)


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
    assert json.loads(c.to_json())["elementwise"]["lanes"] == 4


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
    ({"dsp_pairs": -1}, ValueError, r"dsp_pairs must be in \[0, inf\], not -1"),
    ({"dsp_pairs": "all"}, TypeError, "dsp_pairs must be an integer"),
    ({"simd": 32}, ValueError, r"simd must be one of \(1, 2, 4, 8, 16\), not 32"),
    ({"weight_bus_width": 256}, TypeError, "no field weight_bus_width any more"),
    ({"partial_sums": 8}, TypeError, "no field partial_sums any more"),
    ({"lane": 2}, TypeError, r"unknown field\(s\) lane=2; the fields are"),
    ({"nbits": 4}, TypeError, "nbits must be a tuple of bit widths, not 4"),
    ({"nbits": (4, 4)}, ValueError, "nbits must hold distinct widths"),
    ({"nbits": (1, 4)}, ValueError, r"nbits must hold distinct widths .*, not \(1, 4\)"),
    ({"max_block_size": 48}, ValueError, r"max_block_size must be a power of two .*, not 48"),
    ({"max_block_size": 2048}, ValueError, r"max_block_size must be in \[16, 1024\]"),
    ({"float_path": 1}, TypeError, "float_path must be a bool, not 1"),
    ({"clusters": 0}, ValueError, r"clusters must be in \[1, 16\], not 0"),
    ({"clusters": 2.0}, TypeError, "clusters must be an integer"),
    ({"clusters": 3}, ValueError, r"clusters must divide pe \(32\) and the float lanes \(2\), "
                                  "not 3"),
    ({"clusters": 4}, ValueError, r"clusters must divide pe \(32\) and the float lanes \(2\)"),
])
def test_errors_name_field_and_value(changes, error, match):
    with pytest.raises(error, match=match):
        AccelConfig(**changes)


def test_mac_engine_fields_round_trip():
    c = AccelConfig(pe=8, simd=16, nbits=[8, 4])
    assert c.nbits == (4, 8)                                   # sorted tuple
    assert AccelConfig.from_json(c.to_json()) == c
    assert c.slug != AccelConfig().slug


def test_from_dict_errors():
    with pytest.raises(ValueError, match="unknown config field.*lane\\b"):
        AccelConfig.from_dict({"lane": 2})
    with pytest.raises(TypeError, match="config must be a JSON object"):
        AccelConfig.from_dict([1])


def test_parts_own_their_fields():
    """An AccelConfig is an ElementwiseConfig and a MatMulNBitsConfig; flat fields reach
    their part, parts can be given whole, and every field reads on the whole."""
    c = AccelConfig(lanes=2, table_depth=64, pe=16, m_tile=2)
    assert c.elementwise == ElementwiseConfig(lanes=2, table_depth=64)
    assert c.matmul_nbits == MatMulNBitsConfig(pe=16, m_tile=2)
    assert (c.lanes, c.table_depth, c.pe, c.m_tile) == (2, 64, 16, 2)
    assert c.scale_lanes == c.matmul_nbits.scale_lanes
    assert AccelConfig(elementwise=c.elementwise, matmul_nbits=c.matmul_nbits) == c
    assert AccelConfig(elementwise=c.elementwise, lanes=4).lanes == 4
    assert c.replace(lanes=4, pe=8) == AccelConfig(lanes=4, table_depth=64, pe=8, m_tile=2)
    assert c.replace(matmul_nbits=MatMulNBitsConfig()).matmul_nbits == MatMulNBitsConfig()
    # each part validates its own fields, without the other part
    with pytest.raises(ValueError, match="lanes must be one of"):
        ElementwiseConfig(lanes=3)
    with pytest.raises(ValueError, match="m_tile must be in"):
        MatMulNBitsConfig(m_tile=0)
    with pytest.raises(TypeError, match="elementwise must be a ElementwiseConfig"):
        AccelConfig(elementwise=MatMulNBitsConfig())


def test_immutable_hashable_picklable():
    c = AccelConfig(lanes=4, pe=8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.lanes = 2
    assert hash(c) == hash(AccelConfig(lanes=4, pe=8)) and len({c, AccelConfig(lanes=4, pe=8)}) == 1
    assert pickle.loads(pickle.dumps(c)) == c and copy.deepcopy(c) == c
    assert repr(c) == "AccelConfig(lanes=4, pe=8, dsp_pairs=None)"


def test_json_is_nested_by_part_and_reads_flat_files():
    c = AccelConfig(lanes=4, pe=8)
    data = json.loads(c.to_json())
    assert set(data) == {"elementwise", "matmul_nbits"} and data["elementwise"]["lanes"] == 4
    assert AccelConfig.from_dict(data) == c
    assert AccelConfig.from_dict({"lanes": 4, "pe": 8}) == c               # earlier files
    with pytest.raises(ValueError, match="unknown matmul_nbits field.*lanes"):
        AccelConfig.from_dict({"matmul_nbits": {"lanes": 2}})
    with pytest.raises(TypeError, match="config field elementwise must be a JSON object"):
        AccelConfig.from_dict({"elementwise": [2]})
