"""Numba kernels of QuantizeLinear, DequantizeLinear and DirectML ELEMENT_WISE_QUANTIZE_LINEAR.

The kernels see flat C-contiguous arrays and the collapsed :class:`~.indexing.ScaleLayout`;
:func:`~.indexing.item_runs` splits the elements into work items and runs that share a scale.
Each kernel processes a range of work items with the GIL released; :func:`run_items` spreads
the items over threads, and :func:`output_buffer` recycles the memory of large outputs.
(Threads rather than ``prange``: a ``parallel=True`` specialisation takes about 3.5 s more to
compile, and the type combinations below need two dozen of them.)  First calls compile under
:func:`.jitcache.ensure_compiled`, which keeps concurrent processes from corrupting Numba's
on-disk cache.  Argument checks, dtype selection and the float8/float4 encodings (ml_dtypes
casts) live in :mod:`.quant` and :mod:`.dml`; the slow NumPy twins of the kernels in
``tests/model/naive_quant.py``.

Number formats inside the kernels:

- float16 and bfloat16 travel as their ``uint16`` bit patterns (Numba has no such types) and
  are widened exactly to float32; :func:`round_to_format` rounds a float32 to their grid
  (round-half-even, overflow to infinity), exactly as NumPy's and ml_dtypes' casts do.
  A float16 or bfloat16 quotient is the float32 quotient rounded once more, which is how
  NumPy and ml_dtypes divide these types.
- Integer codes (inputs, outputs and zero points, 2 to 16 bits) travel as ``uint8``/``uint16``
  holding the low ``bits`` bits, as ml_dtypes stores them; ``mask``/``sgn`` sign-extend them.
- The arithmetic type is the scale array's type, float32 or float64.
"""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
from numba import types
from numba.extending import overload

from .indexing import ITEM_ELEMENTS, item_runs
from .jitcache import ensure_compiled

__all__ = [
    "FMT_BF16",
    "FMT_F16",
    "dequantize_kernel",
    "f16_bits_to_f32",
    "f32_to_bf16_bits",
    "f32_to_f16_bits",
    "quantize_float_kernel",
    "quantize_int_kernel",
    "output_buffer",
    "round_to_format",
    "run_items",
]

#: Codes of the 16-bit float formats carried as uint16 bit patterns.
FMT_F16 = 1
FMT_BF16 = 2

# error_model="numpy": x / 0 gives inf/NaN as in NumPy (no ZeroDivisionError check, which
# would also stop vectorisation).  No fastmath: every operation is IEEE round-to-nearest.
# Only the kernels are cached on disk (with their callees compiled in), so that concurrent
# processes only ever share the kernels' cache files, which jitcache serialises.
_JIT = {"error_model": "numpy"}
_KERNEL = {**_JIT, "cache": True, "nogil": True}


# --- 16-bit float formats ------------------------------------------------------------------


@numba.njit(**_JIT)
def _bits(v):
    return np.int64(np.float32(v).view(np.uint32))


@numba.njit(**_JIT)
def _from_bits(b):
    return np.uint32(b).view(np.float32)


@numba.njit(**_JIT)
def f32_to_f16_bits(v):
    """Return the float16 bit pattern nearest to float32 ``v`` (RNE), as NumPy's cast does.

    NaN keeps its sign and the top payload bits (``0x7C00 | sig >> 13``, never 0x7C00).
    """
    b = _bits(v)
    sign = (b >> 16) & 0x8000
    a = b & 0x7FFFFFFF
    if a > 0x7F800000:
        h = 0x7C00 | ((a & 0x7FFFFF) >> 13)
        return sign | (h + 1 if h == 0x7C00 else h)
    if a >= 0x477FF000:  # >= 65520: beyond max + half an ulp, or infinity
        return sign | 0x7C00
    if a >= 0x38800000:  # normal float16: rebias the exponent, round the low 13 bits
        a -= 0x38000000
        return sign | ((a + 0xFFF + ((a >> 13) & 1)) >> 13)
    # subnormal float16 (quantum 2**-24): the scaling is exact, rint rounds half to even
    return sign | np.int64(np.rint(np.abs(np.float32(v)) * np.float32(16777216.0)))


@numba.njit(**_JIT)
def f16_bits_to_f32(h):
    """Return the float16 with bit pattern ``h`` as a float32 (exact)."""
    h = np.int64(h)
    sign = (h & 0x8000) << 16
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 0:
        v = np.float32(m) * np.float32(5.9604644775390625e-08)  # m * 2**-24, exact
        return -v if sign else v
    if e == 31:
        return _from_bits(sign | 0x7F800000 | (m << 13))
    return _from_bits(sign | ((e + 112) << 23) | (m << 13))


@numba.njit(**_JIT)
def f32_to_bf16_bits(v):
    """Return the bfloat16 bit pattern nearest to float32 ``v`` (RNE), as ml_dtypes does.

    NaN becomes the quiet NaN ``0x7FC0`` with the sign kept.
    """
    b = _bits(v)
    if (b & 0x7FFFFFFF) > 0x7F800000:
        return ((b >> 16) & 0x8000) | 0x7FC0
    return (b + 0x7FFF + ((b >> 16) & 1)) >> 16


@numba.njit(**_JIT)
def round_to_format(v, fmt):
    """Return float32 ``v`` rounded to the grid of ``fmt`` (FMT_F16 / FMT_BF16), as float32."""
    if fmt == FMT_F16:
        return f16_bits_to_f32(f32_to_f16_bits(v))
    return _from_bits(f32_to_bf16_bits(v) << 16)


@numba.njit(**_JIT)
def _encode_half(v, fmt):
    if fmt == FMT_F16:
        return f32_to_f16_bits(v)
    return f32_to_bf16_bits(v)


@numba.njit(**_JIT)
def _decode_half(h, fmt):
    if fmt == FMT_F16:
        return f16_bits_to_f32(h)
    return _from_bits(np.int64(h) << 16)


# --- element operations ----------------------------------------------------------------------


def _to_compute(v, like):
    """Convert integer ``v`` to the float type of ``like`` (Numba only)."""


@overload(_to_compute)
def _to_compute_impl(v, like):
    if like == types.float32:
        return lambda v, like: np.float32(v)
    return lambda v, like: np.float64(v)


def _widen(xe, xfmt, like):
    """Widen an element of x to float32 (or, for int32, to the arithmetic type)."""


@overload(_widen)
def _widen_impl(xe, xfmt, like):
    if isinstance(xe, types.Float):
        return lambda xe, xfmt, like: xe
    if xe == types.uint16:
        return lambda xe, xfmt, like: _decode_half(xe, xfmt)
    return lambda xe, xfmt, like: _to_compute(xe, like)


@numba.njit(**_JIT)
def _sext(code, mask, sgn):
    """Sign-extend (``sgn`` = sign bit) or zero-extend (``sgn`` = 0) a masked integer code."""
    return np.int32(np.int32(np.int32(np.int32(code) & mask) ^ sgn) - sgn)


@numba.njit(**_JIT)
def _quotient(xe, xfmt, sv, rnd):
    xv = _widen(xe, xfmt, sv)
    if rnd != 0:
        xv = round_to_format(xv, rnd)
    q = xv / sv
    if rnd != 0:
        q = round_to_format(q, rnd)
    return q


@numba.njit(**_JIT)
def _q_int(xe, sv, ze, prm):
    xfmt, rnd, mask, sgn, lo, hi = prm
    q = _quotient(xe, xfmt, sv, rnd)
    zp = _sext(ze, mask, sgn)
    # clip(rint(q) + zp, lo, hi) == rint(clip(q, lo - zp, hi - zp)) + zp: the bounds are
    # integers.  Clipping first keeps the int32 conversion exact; rint next to it compiles
    # to one round-and-convert instruction.
    top = hi - _to_compute(zp, q)
    bottom = lo - _to_compute(zp, q)
    q = top if q > top else q
    q = q if q > bottom else bottom  # NaN gives bottom
    return np.int32(np.int32(np.int32(np.rint(q)) + zp) & mask)


@numba.njit(**_JIT)
def _q_float(xe, sv, zv, prm):
    xfmt, rnd, fmax = prm
    q = _quotient(xe, xfmt, sv, rnd)
    if q > fmax:
        q = fmax
    elif q < -fmax:
        q = -fmax
    return q + zv


def _output(y, ofmt, out):
    """Return ``y`` as stored in ``out``: itself, or its 16-bit pattern of format ``ofmt``."""


@overload(_output)
def _output_impl(y, ofmt, out):
    if out.dtype == types.uint16:
        return lambda y, ofmt, out: _encode_half(y, ofmt)
    return lambda y, ofmt, out: y


@numba.njit(**_JIT)
def _dq(xe, sv, ze, prm, out):
    lut, mask, sgn, ofmt = prm
    if lut.size:
        dx = lut[xe]
    else:
        dx = np.float32(_sext(xe, mask, sgn)) - _to_compute(_sext(ze, mask, sgn), sv)
    return _output(dx * sv, ofmt, out)


# --- kernels -------------------------------------------------------------------------------
# A kernel processes work items [w0, w1) and the runs item_runs gives for them, calling an
# ``_each`` function for a run of consecutive scales and a ``_blocks`` one for a run of
# blocks.  Separate functions let LLVM vectorise each element loop (one function holding both
# loops got one of them vectorised).  Loops index the full arrays with unsigned indices:
# Numba then emits no negative-index fix-up.  Runtime flags such as ``rnd`` are unswitched
# out of the loops.  ``prm`` holds the element operation's parameters.

_ONE = np.uint64(1)


@numba.njit(**_JIT)
def _unsigned_run(runs, r):
    return (
        np.uint64(runs[r, 0]),
        np.uint64(runs[r, 1]),
        np.uint64(runs[r, 2]),
        np.uint64(runs[r, 3]),
        np.uint64(runs[r, 4]),
    )


@numba.njit(**_JIT)
def _q_int_each(x, s, z, out, a, e, si, prm):
    for k in range(a, e):
        i = si + (k - a)
        out[k] = _q_int(x[k], s[i], z[i], prm)


@numba.njit(**_JIT)
def _q_int_blocks(x, s, z, out, a, e, si, b, f, prm):
    while a < e:
        sv, ze = s[si], z[si]
        for k in range(a, f):
            out[k] = _q_int(x[k], sv, ze, prm)
        si, a, f = si + _ONE, f, min(e, f + b)


@numba.njit(**_KERNEL)
def quantize_int_kernel(w0, w1, x, s, z, out, sizes, strides, blocks, prm):
    """Quantise to integer codes: ``clip(rint(x / s) + z, lo, hi) & mask`` into ``out``.

    ``x``: float32, uint16 (float16/bfloat16 bits, format ``xfmt``) or int32; ``s``: float32
    or float64, the arithmetic type; ``z`` and ``out``: uint8/uint16 codes.  ``prm`` is
    ``(xfmt, rnd, mask, sgn, lo, hi)``: ``rnd`` is 0 or the 16-bit format that x and the
    quotient are rounded to, ``mask``/``sgn`` extend the codes, ``lo``/``hi`` (of ``s``'s type)
    bound the result.  Out-of-range and infinite quotients saturate, NaN gives ``lo``.
    """
    for w in range(w0, w1):
        runs = item_runs(w, sizes, strides, blocks, ITEM_ELEMENTS)
        for r in range(runs.shape[0]):
            a, e, si, b, f = _unsigned_run(runs, r)
            if b == 0:
                _q_int_each(x, s, z, out, a, e, si, prm)
            else:
                _q_int_blocks(x, s, z, out, a, e, si, b, f, prm)


@numba.njit(**_JIT)
def _q_float_each(x, s, z, out, a, e, si, prm):
    for k in range(a, e):
        i = si + (k - a)
        out[k] = _q_float(x[k], s[i], z[i], prm)


@numba.njit(**_JIT)
def _q_float_blocks(x, s, z, out, a, e, si, b, f, prm):
    while a < e:
        sv, zv = s[si], z[si]
        for k in range(a, f):
            out[k] = _q_float(x[k], sv, zv, prm)
        si, a, f = si + _ONE, f, min(e, f + b)


@numba.njit(**_KERNEL)
def quantize_float_kernel(w0, w1, x, s, z, out, sizes, strides, blocks, prm):
    """Write the quotient ``x / s``, clipped to ``[-fmax, fmax]``, plus ``z`` into ``out``.

    As :func:`quantize_int_kernel`, except ``z``: float zero points of ``s``'s type (``-0.0``
    adds nothing, not even to ``-0.0``), ``out`` of ``s``'s type, and ``prm`` is
    ``(xfmt, rnd, fmax)``.  NaN passes.  The caller encodes ``out`` to float8/float4.
    """
    for w in range(w0, w1):
        runs = item_runs(w, sizes, strides, blocks, ITEM_ELEMENTS)
        for r in range(runs.shape[0]):
            a, e, si, b, f = _unsigned_run(runs, r)
            if b == 0:
                _q_float_each(x, s, z, out, a, e, si, prm)
            else:
                _q_float_blocks(x, s, z, out, a, e, si, b, f, prm)


@numba.njit(**_JIT)
def _dq_each(x, s, z, out, a, e, si, prm):
    for k in range(a, e):
        i = si + (k - a)
        out[k] = _dq(x[k], s[i], z[i], prm, out)


@numba.njit(**_JIT)
def _dq_blocks(x, s, z, out, a, e, si, b, f, prm):
    while a < e:
        sv, ze = s[si], z[si]
        for k in range(a, f):
            out[k] = _dq(x[k], sv, ze, prm, out)
        si, a, f = si + _ONE, f, min(e, f + b)


@numba.njit(**_KERNEL)
def dequantize_kernel(w0, w1, x, s, z, out, sizes, strides, blocks, prm):
    """Dequantise: ``(x - z) * s`` into ``out``.

    ``prm`` is ``(lut, mask, sgn, ofmt)``.  ``x`` and ``z``: uint8/uint16 codes
    (``mask``/``sgn``) or int32; or, when ``lut`` is not empty, uint8 codes that ``lut``
    decodes to float32 (``z`` is then ignored).  ``x - z`` is exact in float32 for codes up
    to 16 bits; for int32 it is ``float32(x) - z`` in ``s``'s type.  ``out``: ``s``'s type, or
    uint16 bit patterns of the 16-bit format ``ofmt``.
    """
    for w in range(w0, w1):
        runs = item_runs(w, sizes, strides, blocks, ITEM_ELEMENTS)
        for r in range(runs.shape[0]):
            a, e, si, b, f = _unsigned_run(runs, r)
            if b == 0:
                _dq_each(x, s, z, out, a, e, si, prm)
            else:
                _dq_blocks(x, s, z, out, a, e, si, b, f, prm)


# --- threads ---------------------------------------------------------------------------------

#: Arrays smaller than this run on the calling thread only.
PARALLEL_MIN_ELEMENTS = 1 << 18
#: Work items are handed to threads in this many pieces per thread (dynamic scheduling, so a
#: thread slowed down by other processes on the machine does less of the work).
PIECES_PER_THREAD = 4

_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_lock = threading.Lock()


def _n_threads() -> int:
    return max(1, min(numba.config.NUMBA_NUM_THREADS, len(os.sched_getaffinity(0))))


def _thread_pool(n_workers: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or _pool_size < n_workers:
            _pool = ThreadPoolExecutor(max_workers=n_workers, thread_name_prefix="qaccel")
            _pool_size = n_workers
        return _pool


def run_items(kernel, n_items: int, n_elements: int, *args) -> None:
    """Call ``kernel(w0, w1, *args)`` on consecutive ranges covering work items ``[0, n_items)``.

    Large jobs run on up to ``NUMBA_NUM_THREADS`` threads (and no more than the CPUs this
    process may use), the calling thread included; each takes the next range of items until
    none is left.  The kernels release the GIL.  The first call with new argument types
    compiles under :func:`.jitcache.ensure_compiled`.
    """
    ensure_compiled(kernel, 0, 0, *args)
    n_threads = min(_n_threads(), n_items) if n_elements >= PARALLEL_MIN_ELEMENTS else 1
    if n_threads <= 1:
        kernel(0, n_items, *args)
        return
    step = -(-n_items // (n_threads * PIECES_PER_THREAD))
    starts = iter(range(0, n_items, step))  # next() is atomic under the GIL

    def work():
        for w0 in starts:
            kernel(w0, min(n_items, w0 + step), *args)

    futures = [_thread_pool(n_threads - 1).submit(work) for _ in range(n_threads - 1)]
    work()
    for future in futures:
        future.result()


# --- output buffers --------------------------------------------------------------------------

#: Outputs of at least this many bytes are carved from recycled buffers.
RECYCLE_MIN_BYTES = 1 << 22
#: The most recently used buffers kept for recycling.
RECYCLE_MAX_BUFFERS = 4

_buffers: list[np.ndarray] = []  # least recently used first


def output_buffer(n: int, dtype) -> np.ndarray:
    """Return an uninitialised 1-D array of ``n`` elements of ``dtype``.

    A large array reuses the memory of an earlier one that nothing references any more (no
    array, view or buffer of it is alive), as ONNX Runtime's arena does: writing fresh pages
    costs a page fault each, which is as much time as the kernel itself.  The arrays behave as
    ordinary arrays; their ``base`` is a uint8 buffer kept for recycling.
    """
    dtype = np.dtype(dtype)
    nbytes = n * dtype.itemsize
    if nbytes < RECYCLE_MIN_BYTES:
        return np.empty(n, dtype)
    with _pool_lock:
        for i in range(len(_buffers)):
            # referenced only by the list and getrefcount's argument: no view of it is alive
            if _buffers[i].nbytes == nbytes and sys.getrefcount(_buffers[i]) == 2:
                _buffers.append(_buffers.pop(i))
                return _buffers[-1].view(dtype)
        _buffers.append(np.empty(nbytes, np.uint8))
        del _buffers[:-RECYCLE_MAX_BUFFERS]
        return _buffers[-1].view(dtype)
