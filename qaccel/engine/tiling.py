"""Tiling an elementwise call into unit jobs: boxes of ``x`` whose scales fit the unit's table
and whose element counts fit its counters.

A layout needing more scales than the table holds (``config.table_depth``) is split into
boxes of ``x`` whose scales fit: along the outermost dimensions first, and along an inner axis
(in whole blocks) only when one slice of the outer dimensions needs too many.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np

from qaccel.model.config import AccelConfig
from qaccel.model.indexing import ScaleLayout

__all__ = ["Box", "boxes", "broadcast_box", "onnx_scale_box", "plan", "sub"]

#: A box of ``x``: one slice per dimension.
Box = tuple[slice, ...]


def plan(layout: ScaleLayout, config: AccelConfig, job: Callable[[Box], object]
         ) -> tuple[list, list[Box]]:
    """Return the jobs (``job(box)`` for each box of ``x``, see :func:`boxes`) and the boxes.
    When a box's index registers do not fit ``config.size_width``, the boxes are made again
    with the inner dimensions bounded; ValueError naming the shape of ``x`` if the unit still
    cannot take them."""
    parts = boxes(layout, config)
    try:
        return [job(b) for b in parts], parts
    except ValueError as e:
        if "size_width" not in str(e):
            raise
    parts = boxes(layout, config, inner_limit=(1 << config.size_width) - 1)
    try:
        return [job(b) for b in parts], parts
    except ValueError as e:
        raise ValueError(f"x of shape {layout.x_shape} ({layout.kind} scales) does not fit "
                         f"this RTL configuration: {e}") from e


def boxes(layout: ScaleLayout, config: AccelConfig, inner_limit: int | None = None
          ) -> list[Box]:
    """Split ``x`` into boxes whose scales fit the table and whose element counts fit the
    counter: whole dimensions from the innermost out while they fit, then the largest chunk of
    the next one (in whole blocks), then as much of the outer ones as still fits (all of those
    that use no scales). With ``inner_limit``, the dimensions inside a box's outermost one hold
    at most that many elements (the index generator's ``size_width``)."""
    shape = layout.x_shape
    if not shape:
        return [()]
    budget, max_count = config.table_depth, (1 << config.count_width) - 1
    chunks = [1] * len(shape)
    scales = count = 1
    outermost = False               # (inner_limit) the last dimension is the box's outermost
    for d in reversed(range(len(shape))):
        if outermost:
            break
        n, b, used = shape[d], layout.blocks[d], layout.strides[d] != 0
        chunk = min(n, (budget // scales) * b) if used else n
        chunk = max(1, min(chunk, max_count // count))
        if used and b < chunk < n:
            chunk -= chunk % b
        if used and chunk < min(b, n):
            raise ValueError(f"x of shape {shape}: one block of {b} elements along "
                             f"dimension {d} exceeds the unit's element counter "
                             f"(config.count_width = {config.count_width})")
        chunks[d] = chunk
        outermost = inner_limit is not None and count * chunk > inner_limit
        scales *= -(-chunk // b) if used else 1
        count *= chunk
    starts = [range(0, n, k) for n, k in zip(shape, chunks, strict=True)]
    return [tuple(slice(a, min(a + k, n)) for a, k, n in zip(s, chunks, shape, strict=True))
            for s in itertools.product(*starts)]


def onnx_scale_box(layout: ScaleLayout, box: Box, axis: int, block_size: int) -> Box:
    """The slice of an ONNX Q/DQ scale (and zero point) that the ``x`` box uses."""
    if layout.kind == "per-tensor":
        return ()
    ax = axis % len(layout.x_shape)
    if layout.kind == "per-axis":
        return (box[ax],)
    s = box[ax]
    return tuple(slice(s.start // block_size, -(-s.stop // block_size)) if d == ax else
                 box[d] for d in range(len(box)))


def broadcast_box(shape: tuple[int, ...], box: Box) -> Box:
    """The slice of a DirectML broadcast parameter (of ``shape``) that the ``x`` box uses."""
    return tuple(slice(None) if n == 1 else s for n, s in zip(shape, box, strict=True))


def sub(a: np.ndarray | None, box: Box) -> np.ndarray | None:
    """``a[box]`` as an array (``a`` itself for the empty box, None for None)."""
    if a is None or not box:
        return a
    return a[box]
