"""What the fuzzing properties share: the budgets, the runner and the Hypothesis strategies.

:func:`run` runs a property (a check and the strategy of its argument) under one budget of
:data:`BUDGETS` and counts the examples (printed at the end of the session by
``tests/fuzz/conftest.py``). The strategies draw the arguments of the golden functions:

- :func:`layouts`: an ``x`` shape (0-d, empty, 1..4-D) and how the scale covers it
  (per-tensor with a one-element scale of any rank, per-axis, blocked with any block size,
  dividing the axis or not), the axis negative or not;
- :func:`quantize_cases` / :func:`dequantize_cases`: every type the golden model takes (x,
  scale, zero point, output, ``precision``, ``saturate``) and values around the edges: .5
  ties (also after rounding the quotient to float16 / bfloat16), the output range's ends and
  beyond, +-inf, NaN, -0.0, subnormals, each type's extremes, zero points at their type's
  ends, tiny and huge scales, every code of the narrow types;
- :func:`dml_cases`: DirectML's broadcast quantize (ranks 1..6, sizes 1 broadcast).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qaccel.model.quant import division_dtype
from tests.model import naive_quant as naive
from tests.model.quant_helpers import BF16, E8M0, F16, F32, FLOAT4, FLOAT8, I32, INT_TYPES
from tests.model.test_quantize import _cast, _qrange, _rounded_ties

#: The two budgets of every property: the loaded profile (``default`` unless
#: ``HYPOTHESIS_PROFILE`` says otherwise), unmarked; the ``fuzz`` profile, opt-in.
BUDGETS = [pytest.param("loaded", id="default"),
           pytest.param("fuzz", id="fuzz", marks=pytest.mark.fuzz)]

#: ``(test id, budget) -> [examples, seconds]`` of the properties run in this process.
STATS: dict[tuple[str, str], list] = defaultdict(lambda: [0, 0.0])


def run(budget: str, strategy, check, *, factor: float = 1.0, name: str | None = None) -> None:
    """Run ``check(case)`` on cases drawn from ``strategy`` with ``budget`` (a value of
    :data:`BUDGETS`): the profile's ``max_examples`` times ``factor`` examples (at least 1).
    ``name`` labels the count in :data:`STATS` (default: ``check``'s name)."""
    if budget not in ("loaded", "fuzz"):
        raise ValueError(f"budget must be 'loaded' or 'fuzz', not {budget!r}")
    base = settings() if budget == "loaded" else settings.get_profile("fuzz")
    examples = max(1, round(base.max_examples * factor))
    key = (name or check.__name__, "fuzz" if budget == "fuzz" else "default")
    stats = STATS[key]

    def counted(case):
        stats[0] += 1
        check(case)

    counted.__qualname__ = counted.__name__ = key[0]  # derandomize seeds by name
    start = time.perf_counter()
    try:
        settings(base, max_examples=examples)(given(strategy)(counted))()
    finally:
        stats[1] += time.perf_counter() - start


# --------------------------------------------------------------------------- shapes, layouts


@st.composite
def shapes(draw, *, max_rank: int = 4, max_size: int = 48, min_rank: int = 0,
           min_dim: int = 0) -> tuple[int, ...]:
    """A shape of rank ``min_rank..max_rank`` with at most ``max_size`` elements; one time
    in ten one size is 0 (an empty tensor) unless ``min_dim`` is 1."""
    rank = draw(st.integers(min_rank, max_rank))
    dims, room = [], max_size
    for _ in range(rank):
        d = draw(st.integers(1, max(1, min(7, room))))
        dims.append(d)
        room //= d
    if rank and min_dim == 0 and draw(st.integers(0, 9)) == 0:
        dims[draw(st.integers(0, rank - 1))] = 0
    return tuple(dims)


@st.composite
def layouts(draw, *, max_size: int = 48, kinds=("tensor", "axis", "blocked")):
    """``(x shape, scale shape, axis, block_size)`` of one granularity of ``kinds``."""
    shape = draw(shapes(max_size=max_size))
    rank = len(shape)
    kind = draw(st.sampled_from(kinds if rank else ("tensor",)))
    axis = draw(st.integers(-rank, rank - 1)) if rank else draw(st.sampled_from([0, 1, -1]))
    if kind == "tensor":
        return shape, (1,) * draw(st.integers(0, max(rank, 1))), axis, 0
    d = shape[axis]
    if kind == "axis":
        return shape, (d,), axis, 0
    block = draw(st.integers(1, d + 2))
    s_shape = list(shape)
    s_shape[axis] = -(-d // block)
    return shape, tuple(s_shape), axis, block


# --------------------------------------------------------------------------- values


def _float_specials(dtype) -> list[float]:
    """+-inf, NaN, signed zeros, the extremes (smallest subnormal and normal, max)."""
    info = ml_dtypes.finfo(dtype)
    tiny, normal, big = (float(info.smallest_subnormal), float(info.smallest_normal),
                         float(info.max))
    return [np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0, tiny, -tiny, 3 * tiny, normal, -normal,
            big, -big, 1e-40, 6e-8, 1.0, -1.0]


_INT32_SPECIALS = [0, 1, -1, 2**31 - 1, -(2**31), 2**24 + 1, -(2**24) - 3, 65519, 65520, 7, -9]


def codes(dtype, n: int):
    """``n`` codes of a quantised type: any bit pattern (NaNs and infinities of the float
    types too), the integer types' extremes often."""
    dtype = np.dtype(dtype)
    if dtype in FLOAT8 or dtype == FLOAT4 or dtype == E8M0 or dtype.itemsize == 1:
        bits = 8 if dtype in FLOAT8 or dtype == E8M0 or dtype in (np.int8, np.uint8) else (
            2 if "int2" in dtype.name else 4)
        top = (1 << bits) - 1
        code = st.one_of(st.integers(0, top), st.sampled_from([0, top, top >> 1, (top >> 1) + 1]))
        return st.lists(code, min_size=n, max_size=n).map(
            lambda c: np.array(c, np.uint8).view(dtype))
    info = np.iinfo(dtype)
    value = st.one_of(st.integers(int(info.min), int(info.max)),
                      st.sampled_from([int(info.min), int(info.max), 0, -1 if info.min else 1,
                                       int(info.max) // 2 + 1]))
    return st.lists(value, min_size=n, max_size=n).map(lambda v: np.array(v, dtype))


def _float_scales(dtype) -> list[float]:
    info = ml_dtypes.finfo(dtype)
    return [1.0, 0.5, 2.0, 0.37, -1.25, 0.0, -0.0, 1e-3, 1e3, 3.0, 0.1, 6e-8, 3e-39, 1e30,
            float(info.smallest_subnormal), float(info.smallest_normal), float(info.max),
            -float(info.max), np.inf, -np.inf, np.nan]


def scales(dtype, shape):
    """A scale of ``dtype`` and ``shape``: ordinary values, powers of two, zero, negative,
    tiny (subnormal) and huge ones, infinities and NaN; float8e8m0: any code."""
    n = math.prod(shape)
    dtype = np.dtype(dtype)
    if dtype == E8M0:
        return codes(E8M0, n).map(lambda c: c.reshape(shape))
    if dtype == I32:
        value = st.one_of(st.sampled_from([1, 2, 3, -2, 0, 7, -1, 100, 2**31 - 1, -(2**31)]),
                          st.integers(-(2**31), 2**31 - 1))
        return st.lists(value, min_size=n, max_size=n).map(
            lambda v: np.array(v, np.int32).reshape(shape))
    value = st.one_of(st.sampled_from(_float_scales(dtype)),
                      st.floats(1e-4, 1e4).flatmap(lambda v: st.sampled_from([v, -v])))

    def cast(values):
        with np.errstate(over="ignore"):
            return np.array(values, np.float64).astype(dtype).reshape(shape)

    return st.lists(value, min_size=n, max_size=n).map(cast)


# one element of x: ("q", v) the quotient v (times the element's scale), ("tie", v) the same,
# nudged to a .5 tie after the division's rounding, ("abs", v) the value v itself
def _x_elements(out, x_dtype):
    lo, hi = _qrange(out)
    q_edges = [k + 0.5 for k in range(-4, 4)] + [hi + d for d in (-0.5, 0.0, 0.5, 1.0, 1.5)]
    q_edges += [lo + d for d in (0.5, 0.0, -0.5, -1.0)]
    q_edges += [2.0**31, -(2.0**31), 3e9, -1e10, 2.0**31 - 64]
    if not naive.is_int(out):  # float8 / float4: around max, halfway to the next binade,
        tiny = float(ml_dtypes.finfo(out).smallest_subnormal)  # subnormals and their ties
        q_edges += [hi * f for f in (1.03125, 1.0625, 1.125, 1.5, 2.0, -1.0625, -1.5)]
        q_edges += [tiny * f for f in (0.25, 0.5, 0.75, 1.5, 2.5, -0.5, -1.5)]
    absolute = _INT32_SPECIALS if x_dtype == I32 else _float_specials(x_dtype)
    return st.one_of(
        st.tuples(st.just("q"), st.sampled_from(q_edges)),
        st.tuples(st.just("q"), st.floats(1.6 * lo - 2, 1.6 * hi + 2)),
        st.tuples(st.just("tie"), st.integers(-40, 40).map(lambda k: k + 0.5)),
        st.tuples(st.just("abs"), st.sampled_from(absolute)),
    )


def _x_values(elements, s_elem, x_dtype, division, precision):
    """x of ``x_dtype`` from the drawn elements (see :func:`_x_elements`)."""
    kinds = np.array([k for k, _ in elements], dtype="<U3")
    v = np.array([v for _, v in elements], np.float64)
    with np.errstate(all="ignore"):
        s = s_elem.astype(division).astype(np.float64)
        scaled = np.where(np.isfinite(s) & (s != 0), v * s, v)
        x = _cast(np.where(kinds == "abs", v, scaled), x_dtype)
    tie = kinds == "tie"
    if precision is None and tie.any():
        x[tie] = _rounded_ties(x[tie], s_elem[tie], division)
    return x


QX_TYPES = (F32, F16, BF16, I32)
Q_SCALES = (F32, F16, BF16, I32, E8M0)
Q_OUTPUTS = INT_TYPES + FLOAT8 + (FLOAT4,)
DQ_INPUTS = INT_TYPES + (I32,) + FLOAT8 + (FLOAT4,)
DQ_SCALES = (F32, F16, BF16, E8M0)
FLOAT_OUT = (F32, F16, BF16)


@st.composite
def zero_points(draw, out, s_shape, *, dequantize: bool = False):
    """A zero point of type ``out`` and ``s_shape``, or None. Integer types: any value, the
    ends of the range often. float8: ignored by QuantizeLinear (any code); DequantizeLinear
    takes only ``|zp| < 1`` (codes of +-0, subnormals and small values). float4e2m1: any code
    (added by QuantizeLinear, ignored by DequantizeLinear)."""
    if draw(st.booleans()):
        return None
    out = np.dtype(out)
    n = math.prod(s_shape)
    if dequantize and out in FLOAT8:
        small = [v for v in (0.0, -0.0, 0.5, -0.75, 2.0**-9, -(2.0**-7), 0.875)]
        vals = draw(st.lists(st.sampled_from(small), min_size=n, max_size=n))
        return np.array(vals, np.float64).astype(out).reshape(s_shape)
    return draw(codes(out, n)).reshape(s_shape)


@st.composite
def quantize_cases(draw, *, x_types=QX_TYPES, scale_types=Q_SCALES, outputs=Q_OUTPUTS,
                   precisions=(None, F32, F16, BF16), max_size: int = 48):
    """quantize_linear's keyword arguments (with the output type as ``out``)."""
    x_dtype = draw(st.sampled_from(x_types))
    s_dtype = draw(st.sampled_from(scale_types))
    out = draw(st.sampled_from(outputs))
    precision = draw(st.sampled_from(precisions)) if draw(st.integers(0, 3)) == 0 else None
    x_shape, s_shape, axis, block = draw(layouts(max_size=max_size))
    scale = draw(scales(s_dtype, s_shape))
    zp = draw(zero_points(out, s_shape))
    n = math.prod(x_shape)
    elements = draw(st.lists(_x_elements(out, x_dtype), min_size=n, max_size=n))
    s_elem = naive.expand(scale, x_shape, axis, block).reshape(-1)
    division = precision if precision is not None else division_dtype(x_dtype, s_dtype)
    x = _x_values(elements, s_elem, x_dtype, np.dtype(division), precision).reshape(x_shape)
    output_dtype = None if zp is not None else (
        draw(st.sampled_from([None, out])) if out == np.uint8 else out)
    return {"x": x, "y_scale": scale, "y_zero_point": zp, "axis": axis, "block_size": block,
            "output_dtype": output_dtype, "precision": precision,
            "saturate": draw(st.booleans()), "out": out}


@st.composite
def dequantize_cases(draw, *, x_types=DQ_INPUTS, scale_types=DQ_SCALES, outputs=FLOAT_OUT,
                     max_size: int = 48):
    """dequantize_linear's keyword arguments."""
    x_dtype = draw(st.sampled_from(x_types))
    s_dtype = draw(st.sampled_from(scale_types))
    out = draw(st.sampled_from(outputs if s_dtype == E8M0 else (None, *outputs)))
    x_shape, s_shape, axis, block = draw(layouts(max_size=max_size))
    scale = draw(scales(s_dtype, s_shape))
    zp = draw(zero_points(x_dtype, s_shape, dequantize=True))
    x = draw(codes(x_dtype, math.prod(x_shape))).reshape(x_shape)
    return {"x": x, "x_scale": scale, "x_zero_point": zp, "axis": axis, "block_size": block,
            "output_dtype": out}


_DML_SPECIALS = [np.inf, -np.inf, np.nan, 0.0, -0.0, 1e10, -1e10, 2.5, 3.5, -2.5, 127.5, -128.5,
                 255.5, 65504.0, 1e-40, 6e-8]


@st.composite
def dml_cases(draw, *, max_rank: int = 6, max_size: int = 48):
    """dml_quantize_linear's arguments: rank 1..``max_rank``, scale and zero point broadcast
    (size 1) along any dimensions, float32 / float16 / int32 input."""
    x_dtype = draw(st.sampled_from([F32, F16, I32]))
    s_dtype = F32 if x_dtype == I32 else x_dtype
    out = draw(st.sampled_from([np.dtype(np.int8), np.dtype(np.uint8)]))
    shape = draw(shapes(min_rank=1, max_rank=max_rank, min_dim=1, max_size=max_size))

    def broadcast():
        return st.lists(st.booleans(), min_size=len(shape), max_size=len(shape)).map(
            lambda keep: tuple(d if k else 1 for d, k in zip(shape, keep, strict=True)))

    s_shape = draw(broadcast())
    scale = draw(scales(s_dtype, s_shape))
    zp = None
    if draw(st.booleans()):
        z_shape = draw(st.sampled_from([s_shape, draw(broadcast())]))
        zp = draw(codes(out, math.prod(z_shape))).reshape(z_shape)
    n = math.prod(shape)
    if x_dtype == I32:
        value = st.one_of(st.sampled_from(_INT32_SPECIALS), st.integers(-(2**31), 2**31 - 1),
                          st.integers(-1000, 1000))
        x = np.array(draw(st.lists(value, min_size=n, max_size=n)), np.int32)
    else:
        value = st.one_of(st.sampled_from(_DML_SPECIALS + _float_specials(x_dtype)),
                          st.floats(-400, 400), st.integers(-300, 300).map(lambda k: k + 0.5))
        with np.errstate(over="ignore"):
            x = np.array(draw(st.lists(value, min_size=n, max_size=n)), np.float64).astype(
                x_dtype)
    return {"input": x.reshape(shape), "scale": scale, "zero_point": zp, "output_dtype": out}
