"""The scale / zero-point index mechanism shared by every granularity (model/indexing.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx.reference.ops._quant_utils import reshape_input

from qaccel.model.indexing import (
    ITEM_ELEMENTS,
    broadcast_layout,
    run_indices,
    scale_layout,
)

# (x shape, scale shape, axis, block_size)
ONNX_LAYOUTS = [
    ((), (), 1, 0),
    ((7,), (), 0, 0),
    ((3, 4), (1,), 1, 0),
    ((3, 4), (1, 1), 5, 0),  # per-tensor: axis is not looked at
    ((2, 3, 4), (1,), -1, 8),  # per-tensor wins over block_size
    ((7,), (7,), 0, 0),
    ((3, 4), (3,), 0, 0),
    ((3, 4), (4,), 1, 0),
    ((3, 4), (4,), -1, 0),
    ((2, 3, 4, 5), (3,), 1, 0),
    ((2, 3, 4, 5), (4,), -2, 0),
    ((1, 3, 1, 5), (3,), 1, 0),
    ((4, 12), (4, 3), 1, 4),  # collapses to one dimension
    ((4, 10), (4, 3), 1, 4),  # partial last block
    ((4, 10), (4, 3), -1, 4),
    ((12, 4), (3, 4), 0, 4),
    ((10, 3, 5), (4, 3, 5), 0, 3),
    ((2, 9, 5), (2, 3, 5), 1, 3),
    ((2, 9, 5), (2, 2, 5), 1, 5),
    ((2, 9, 1), (2, 1, 1), 1, 16),  # one block longer than the axis
    ((3, 1, 8), (3, 1, 2), 2, 4),
    ((5, 0, 3), (5,), 0, 0),  # empty
]


def _reference_indices(x_shape, scale_shape, axis, block_size):
    """Scale index of every element, as onnx.reference expands the scale."""
    index = np.arange(math.prod(scale_shape)).reshape(scale_shape)
    return np.broadcast_to(reshape_input(index, x_shape, axis, block_size), x_shape)


@pytest.mark.parametrize("x_shape,scale_shape,axis,block", ONNX_LAYOUTS, ids=str)
def test_scale_layout_indexes_like_the_reference(x_shape, scale_shape, axis, block):
    layout = scale_layout(x_shape, scale_shape, axis, block)
    expected = _reference_indices(x_shape, scale_shape, axis, block)
    np.testing.assert_array_equal(layout.indices(), expected)
    for idx in np.ndindex(*x_shape):
        assert layout.index(idx) == expected[idx]


@pytest.mark.parametrize("per_item", [1, 2, 3, 5, 7, 64, ITEM_ELEMENTS])
@pytest.mark.parametrize("x_shape,scale_shape,axis,block", ONNX_LAYOUTS, ids=str)
def test_kernel_runs_give_every_element_its_scale(x_shape, scale_shape, axis, block, per_item):
    layout = scale_layout(x_shape, scale_shape, axis, block)
    np.testing.assert_array_equal(run_indices(layout, per_item), layout.indices())


@pytest.mark.parametrize(
    "x_shape,scale_shape,axis,block,kind,collapsed",
    [
        ((64, 64), (), 1, 0, "per-tensor", ((4096,), (0,), (1,))),
        ((4096, 64), (4096, 2), 1, 32, "blocked", ((4096 * 64,), (1,), (32,))),
        ((4, 10), (4, 3), 1, 4, "blocked", ((4, 10), (3, 1), (1, 4))),
        ((8, 5, 6), (5,), 1, 0, "per-axis", ((8, 5, 6), (0, 1, 0), (1, 1, 1))),
        ((8, 5, 6), (8,), 0, 0, "per-axis", ((8, 30), (1, 0), (1, 1))),
        ((8, 5, 1), (5,), -2, 0, "per-axis", ((8, 5), (0, 1), (1, 1))),
        ((12, 4), (3, 4), 0, 4, "blocked", ((12, 4), (4, 1), (4, 1))),
    ],
    ids=str,
)
def test_collapsed_form(x_shape, scale_shape, axis, block, kind, collapsed):
    layout = scale_layout(x_shape, scale_shape, axis, block)
    assert layout.kind == kind
    assert (layout.sizes_c, layout.strides_c, layout.blocks_c) == collapsed


# (x shape, parameter shape): DirectML zero strides
BROADCASTS = [
    ((5,), (1,)),
    ((5,), (5,)),
    ((2, 3), (1, 3)),
    ((2, 3), (2, 1)),
    ((2, 3, 4, 5), (1, 3, 1, 1)),
    ((2, 3, 4, 5), (2, 1, 4, 1)),
    ((2, 3, 4, 5), (1, 1, 4, 5)),
    ((2, 1, 3, 1, 2, 1, 2, 3), (1, 1, 3, 1, 1, 1, 2, 1)),
]


@pytest.mark.parametrize("x_shape,param_shape", BROADCASTS, ids=str)
def test_broadcast_layout_matches_numpy_broadcasting(x_shape, param_shape):
    layout = broadcast_layout(x_shape, param_shape)
    index = np.arange(math.prod(param_shape)).reshape(param_shape)
    expected = np.broadcast_to(index, x_shape)
    np.testing.assert_array_equal(layout.indices(), expected)
    for per_item in (1, 3, 8, ITEM_ELEMENTS):
        np.testing.assert_array_equal(run_indices(layout, per_item), expected)


def test_long_rows_are_split_into_work_items():
    layout = scale_layout((3, 100_000), (3,), 0, 0)
    assert layout.kernel_args()[3] == 3 * math.ceil(100_000 / ITEM_ELEMENTS)
    np.testing.assert_array_equal(run_indices(layout), layout.indices())
