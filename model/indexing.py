"""Scale / zero-point indexing: one mechanism for every granularity.

Every element of ``x`` finds its scale (and zero point, which always shares the scale's layout)
with one formula.  For ``x`` of shape ``(n_0, ..., n_{r-1})`` and the scale stored flat in C
order,

    scale_index(i_0, ..., i_{r-1}) = sum_d strides[d] * (i_d // blocks[d])

where a broadcast dimension has stride 0 and only a blocked axis has ``blocks[d] > 1``:

=============  ===========================================================================
per-tensor     all strides 0
per-axis       stride 1 on ``axis``, 0 elsewhere
blocked        C-order strides of the scale shape, ``blocks[axis] = block_size``
broadcast      (DirectML) C-order strides of the parameter shape, 0 where its size is 1
=============  ===========================================================================

:func:`scale_layout` (ONNX Q/DQ) and :func:`broadcast_layout` (DirectML) validate the shapes
and return a :class:`ScaleLayout`.  Its *collapsed* form merges neighbouring dimensions that
index the scale contiguously and drops size-1 dimensions, so kernels see a few dimensions
only (per-tensor and ``(M, K)`` blocked along ``K`` both become one dimension).

The Numba kernels walk the elements as *runs*: pieces of one row of the last collapsed
dimension whose elements use consecutive scales, one scale each or one per block.
:func:`item_runs` produces them; :func:`run_indices` replays them into a scale index per
element, which the tests compare with :meth:`ScaleLayout.indices` and against which the RTL
index generator is checked.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numba
import numpy as np

from .jitcache import ensure_compiled
from .validate import check_axis

__all__ = [
    "ITEM_ELEMENTS",
    "ScaleLayout",
    "broadcast_layout",
    "item_runs",
    "run_indices",
    "scale_layout",
]

#: Target number of elements per parallel work item of the kernels.
ITEM_ELEMENTS = 1 << 16


@dataclass(frozen=True)
class ScaleLayout:
    """Where each element of ``x`` finds its scale.

    Attributes
    ----------
    kind : str
        ``"per-tensor"``, ``"per-axis"``, ``"blocked"`` or ``"broadcast"``.
    x_shape, scale_shape : tuple of int
        Shapes of the data and of the scale (the zero point has the scale's shape).
    strides, blocks : tuple of int
        Per dimension of ``x``: stride into the flat scale (0 = broadcast) and block length.
    sizes_c, strides_c, blocks_c : tuple of int
        The collapsed form (at least one dimension; same formula, same flat index).
    """

    kind: str
    x_shape: tuple[int, ...]
    scale_shape: tuple[int, ...]
    strides: tuple[int, ...]
    blocks: tuple[int, ...]
    sizes_c: tuple[int, ...] = field(init=False)
    strides_c: tuple[int, ...] = field(init=False)
    blocks_c: tuple[int, ...] = field(init=False)

    def __post_init__(self):
        sizes, strides, blocks = _collapse(self.x_shape, self.strides, self.blocks)
        object.__setattr__(self, "sizes_c", sizes)
        object.__setattr__(self, "strides_c", strides)
        object.__setattr__(self, "blocks_c", blocks)
        # C-order parameter strides make the last collapsed dimension broadcast or contiguous,
        # which the kernels' runs rely on.
        assert strides[-1] in (0, 1), (sizes, strides, blocks)

    @property
    def size(self) -> int:
        """Number of elements of ``x``."""
        return math.prod(self.x_shape)

    def index(self, idx) -> int:
        """Return the flat scale index of the element at multi-index ``idx`` of ``x``."""
        terms = zip(idx, self.strides, self.blocks, strict=True)
        return sum(s * (int(i) // b) for i, s, b in terms)

    def indices(self) -> np.ndarray:
        """Return the flat scale index of every element, as an int64 array of ``x_shape``."""
        out = np.zeros(self.x_shape, np.int64)
        for d, (n, s, b) in enumerate(zip(self.x_shape, self.strides, self.blocks, strict=True)):
            shape = [1] * len(self.x_shape)
            shape[d] = n
            out += (s * (np.arange(n) // b)).reshape(shape)
        return out

    @functools.cached_property
    def _kernel_args(self):
        arrays = (np.array(a, np.int64) for a in (self.sizes_c, self.strides_c, self.blocks_c))
        return (*arrays, _n_items(self.sizes_c, ITEM_ELEMENTS))

    def kernel_args(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """Return ``(sizes, strides, blocks, n_items)`` of the collapsed form for the kernels."""
        return self._kernel_args


def _c_strides(shape) -> list[int]:
    strides, acc = [0] * len(shape), 1
    for d in range(len(shape) - 1, -1, -1):
        strides[d] = acc
        acc *= shape[d]
    return strides


def _collapse(shape, strides, blocks):
    """Drop size-1 dimensions and merge neighbours whose flat scale index stays one formula."""
    dims = [(n, s, b) for n, s, b in zip(shape, strides, blocks, strict=True) if n != 1]
    if any(n == 0 for n, _, _ in dims):
        return (0,), (0,), (1,)
    out: list[tuple[int, int, int]] = []
    for n, s, b in dims:
        if out:
            n0, s0, b0 = out[-1]
            # outer index i0, inner i1: s0*i0 + s*(i1//b) == s*((i0*n + i1)//b) iff these hold
            if b0 == 1 and n % b == 0 and s0 == s * (n // b):
                out[-1] = (n0 * n, s, b)
                continue
        out.append((n, s, b))
    if not out:
        out = [(1, 0, 1)]
    return tuple(d[0] for d in out), tuple(d[1] for d in out), tuple(d[2] for d in out)


def _n_items(sizes, per_item: int) -> int:
    n_last = sizes[-1]
    n_rows = math.prod(sizes[:-1])
    if n_last == 0 or n_rows == 0:
        return 0
    if n_last >= per_item:
        return n_rows * -(-n_last // per_item)
    rows_per_item = per_item // n_last
    return -(-n_rows // rows_per_item)


def scale_layout(x_shape, scale_shape, axis=1, block_size=0, *, param="scale") -> ScaleLayout:
    """Return the :class:`ScaleLayout` of an ONNX QuantizeLinear/DequantizeLinear scale.

    Parameters
    ----------
    x_shape, scale_shape : tuple of int
        Shapes of the data and of the scale.
    axis : int
        Quantisation axis (negative counts from the back).  Ignored for per-tensor scales.
    block_size : int
        0 for per-tensor / per-axis, else the block length along ``axis``.
    param : str
        Name of the scale argument, used in error messages.

    Notes
    -----
    A scale with one element is per-tensor whatever its rank, ``axis`` and ``block_size`` (as
    in onnx.reference and ONNX Runtime).  Otherwise a zero ``block_size`` needs a 1-D scale of
    length ``x_shape[axis]``, and a positive one needs the rank of ``x`` with
    ``scale_shape[axis] == ceil(x_shape[axis] / block_size)`` and every other dimension equal
    to ``x``'s.  That is the spec's rule and ONNX Runtime's; onnx.reference also accepts a
    longer scale axis (whose extra blocks are never used), qaccel does not.

    Raises
    ------
    ValueError
        When the shapes do not fit, naming ``param``.
    """
    shapes = tuple(int(n) for n in x_shape), tuple(int(n) for n in scale_shape)
    return _scale_layout(*shapes, axis, block_size, param)


@functools.lru_cache(maxsize=256)
def _scale_layout(x_shape, scale_shape, axis, block_size, param) -> ScaleLayout:
    rank = len(x_shape)
    if math.prod(scale_shape) == 1:
        return ScaleLayout("per-tensor", x_shape, scale_shape, (0,) * rank, (1,) * rank)
    if rank == 0:
        raise ValueError(
            f"x is 0-d (a scalar), so only a per-tensor {param} (one element) applies to it, "
            f"not shape {scale_shape}: give a one-element {param}, or an x with the axis "
            f"that the scales run along"
        )
    ax = check_axis("axis", axis, rank)
    blocks = [1] * rank
    if block_size == 0:
        if len(scale_shape) != 1 or scale_shape[0] != x_shape[ax]:
            raise ValueError(
                f"{param} must be a scalar, or 1-D of length x.shape[{ax}] = {x_shape[ax]} "
                f"for per-axis quantisation (axis={axis}); got shape {scale_shape}"
                + _layout_hint(x_shape, scale_shape, ax, param)
            )
        strides = [0] * rank
        strides[ax] = 1
        return ScaleLayout("per-axis", x_shape, scale_shape, tuple(strides), tuple(blocks))
    expected = list(x_shape)
    expected[ax] = -(-x_shape[ax] // block_size)
    if scale_shape != tuple(expected):
        raise ValueError(
            f"{param} must have shape {tuple(expected)} for blocked quantisation of x "
            f"{x_shape} along axis {ax} with block_size={block_size} "
            f"(ceil({x_shape[ax]}/{block_size}) blocks); got {scale_shape}"
            + _layout_hint(x_shape, scale_shape, ax, param, block_size)
        )
    blocks[ax] = block_size
    strides = tuple(_c_strides(scale_shape))
    return ScaleLayout("blocked", x_shape, scale_shape, strides, tuple(blocks))


def _layout_hint(x_shape, scale_shape, ax, param, block_size=0) -> str:
    """The arguments that would make ``scale_shape`` fit ``x_shape`` (``"; ..."``), or ``""``:
    ``block_size=0`` for a per-axis scale, the ``axis`` of a per-axis scale whose length is
    another dimension's, the ``block_size`` (and ``axis``) of a blocked scale."""
    rank = len(x_shape)
    if len(scale_shape) == 1:
        n = scale_shape[0]
        if n == x_shape[ax]:
            return f"; a per-axis {param} needs block_size=0"
        axes = [d for d in range(rank) if x_shape[d] == n]
        zero = ", block_size=0" if block_size else ""
        return f"; for per-axis quantisation along axis {axes[0]} give axis={axes[0]}{zero}" \
            if axes else ""
    if len(scale_shape) != rank:
        return ""
    diffs = [d for d in range(rank) if scale_shape[d] != x_shape[d]]
    if not diffs:  # one scale per element: blocks of 1 along any axis
        return "" if block_size == 1 else "; it fits block_size=1 (one scale per element)"
    if len(diffs) != 1 or scale_shape[diffs[0]] < 1:
        return ""
    d = diffs[0]
    n, s = x_shape[d], scale_shape[d]
    b = -(-n // s) if n else 1
    if -(-n // b) != s:
        return ""
    axis = "" if d == ax else f"axis={d}, "
    return (f"; for blocked quantisation give {axis}block_size={b} (ceil({n}/{b}) = {s} "
            f"blocks along axis {d})")


def broadcast_layout(x_shape, param_shape, *, param="scale") -> ScaleLayout:
    """Return the :class:`ScaleLayout` of a DirectML-style broadcast parameter.

    ``param_shape`` must have the rank of ``x_shape`` and each size must equal ``x``'s or be 1
    (a zero stride in DirectML's tensor description).  ValueError naming ``param`` otherwise.
    """
    shapes = tuple(int(n) for n in x_shape), tuple(int(n) for n in param_shape)
    return _broadcast_layout(*shapes, param)


@functools.lru_cache(maxsize=256)
def _broadcast_layout(x_shape, param_shape, param) -> ScaleLayout:
    if len(param_shape) != len(x_shape):
        rank, short = len(x_shape), len(param_shape)
        numpy_style = short < rank and all(
            p in (1, n) for p, n in zip(param_shape[::-1], x_shape[::-1], strict=False))
        hint = (f"{param}.reshape{(1,) * (rank - short) + param_shape}" if numpy_style
                else f"{param}.reshape{(1,) * rank} for one value")
        raise ValueError(
            f"{param} must have the rank of input ({len(x_shape)}); got shape {param_shape}: "
            f"give its sizes with 1s for the broadcast dimensions, e.g. {hint}"
        )
    for d, (n, p) in enumerate(zip(x_shape, param_shape, strict=True)):
        if p not in (1, n):
            raise ValueError(
                f"{param} shape {param_shape} does not broadcast to input shape {x_shape} "
                f"(dimension {d}: {p} is neither 1 nor {n}): each size must be input's or 1"
            )
    c_strides = zip(_c_strides(param_shape), param_shape, strict=True)
    strides = [s if p != 1 else 0 for s, p in c_strides]
    return ScaleLayout("broadcast", x_shape, param_shape, tuple(strides), (1,) * len(x_shape))


@numba.njit  # compiled into the cached kernels that call it
def item_runs(w, sizes, strides, blocks, per_item):
    """Return the runs of work item ``w`` as an ``(n, 5)`` int64 array.

    A row ``(start, stop, scale, block, first_stop)`` covers flat elements ``start:stop`` of
    one row of the last collapsed dimension.  With ``block == 0`` element ``e`` uses scale
    ``scale + e - start``.  Otherwise elements ``start:first_stop`` use ``scale``, and each
    following ``block`` elements the next scale (``scale + 1``, ...).  Work items are
    ``per_item`` consecutive elements of one row, or whole rows when rows are shorter.
    """
    k = sizes.shape[0]
    n_last = sizes[k - 1]
    b = blocks[k - 1] if strides[k - 1] else n_last
    if n_last >= per_item:
        pieces = (n_last + per_item - 1) // per_item
        r0 = w // pieces
        r1 = r0 + 1
        j0 = (w % pieces) * per_item
        j1 = min(n_last, j0 + per_item)
    else:
        rows_per_item = per_item // n_last
        n_rows = 1
        for d in range(k - 1):
            n_rows *= sizes[d]
        r0 = w * rows_per_item
        r1 = min(n_rows, r0 + rows_per_item)
        j0 = 0
        j1 = n_last
    runs = np.empty((r1 - r0, 5), np.int64)
    for r in range(r0, r1):
        base = 0
        rem = r
        for d in range(k - 2, -1, -1):
            i = rem % sizes[d]
            rem //= sizes[d]
            base += strides[d] * (i // blocks[d])
        run = runs[r - r0]
        run[0] = r * n_last + j0
        run[1] = r * n_last + j1
        if b == 1:  # consecutive scales
            run[2] = base + j0
            run[3] = 0
            run[4] = run[1]
        else:  # one scale per block (or per row)
            run[2] = base + j0 // b
            run[3] = b
            run[4] = r * n_last + min(j1, (j0 // b + 1) * b)
    return runs


@numba.njit(cache=True)
def _fill_run_indices(out, sizes, strides, blocks, n_items, per_item):
    for w in range(n_items):
        runs = item_runs(w, sizes, strides, blocks, per_item)
        for r in range(runs.shape[0]):
            a, e, si, b, f = runs[r, 0], runs[r, 1], runs[r, 2], runs[r, 3], runs[r, 4]
            if b == 0:
                for k in range(a, e):
                    out[k] = si + k - a
            else:
                k0, k1 = a, f
                while k0 < e:
                    for k in range(k0, k1):
                        out[k] = si
                    si += 1
                    k0, k1 = k1, min(e, k1 + b)


def run_indices(layout: ScaleLayout, per_item: int = ITEM_ELEMENTS) -> np.ndarray:
    """Return the scale index of every element as the kernels' runs see it (``x_shape``).

    Equal to :meth:`ScaleLayout.indices` by construction; the tests check that it is, for any
    ``per_item``, and the RTL index generator is checked against it.
    """
    out = np.full(layout.size, -1, np.int64)
    arrays = (np.array(a, np.int64) for a in (layout.sizes_c, layout.strides_c, layout.blocks_c))
    args = (out, *arrays)
    ensure_compiled(_fill_run_indices, *args, 0, per_item)
    _fill_run_indices(*args, _n_items(layout.sizes_c, per_item), per_item)
    return out.reshape(layout.x_shape)
