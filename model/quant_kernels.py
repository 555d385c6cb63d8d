"""Numba kernels of QuantizeLinear, DequantizeLinear and DirectML ELEMENT_WISE_QUANTIZE_LINEAR.

The kernels see flat C-contiguous arrays and the collapsed :class:`~.indexing.ScaleLayout`;
:func:`~.indexing.item_runs` splits the elements into work items and runs that share a scale.
Each kernel claims work items one at a time (:func:`next_item`) with the GIL released;
:func:`run_items` runs it on several threads, and :func:`output_buffer` recycles the memory of
large outputs.
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

import contextlib
import ctypes
import os
import sys
import threading
import time

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from .indexing import ITEM_ELEMENTS, item_runs
from .jitcache import ensure_compiled

__all__ = [
    "FMT_BF16",
    "FMT_F16",
    "dequantize_kernel",
    "f16_bits_to_f32",
    "f32_to_bf16_bits",
    "f32_to_f16_bits",
    "item_done",
    "next_item",
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


# --- work items ----------------------------------------------------------------------------
# A kernel takes ``items``, int64 ``[next, done, end, ...]``: it claims work items one at a time
# (atomically, ``next``), computes them, and counts each one ``done``, until ``next`` reaches
# ``end``.  Any number of threads can run it on the same ``items`` (:func:`run_items`).


@intrinsic
def _fetch_add(typingctx, arr, i, delta):
    """Atomically add ``delta`` to ``arr[i]`` (int64, C-contiguous), returning the old value."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.int64 and arr.layout == "C"):
        return None

    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        index = context.cast(builder, args[1], sig.args[1], types.intp)
        value = context.cast(builder, args[2], sig.args[2], types.int64)
        return builder.atomic_rmw("add", builder.gep(data, [index]), value, "seq_cst")

    return types.int64(arr, i, delta), codegen


@numba.njit(**_JIT)
def next_item(items):
    """Claim the next work item of ``items`` (``>= items[2]``: none left)."""
    return _fetch_add(items, 0, 1)


@numba.njit(**_JIT)
def item_done(items):
    """Count a claimed work item as computed (after its results are stored)."""
    _fetch_add(items, 1, 1)


# --- kernels -------------------------------------------------------------------------------
# A kernel processes the work items it claims and the runs item_runs gives for them, calling an
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


# A long run of float32 elements with one float32 scale, quantised to 8-bit codes (per-tensor
# QuantizeLinear, the common case) is memory bound: it reads 4 bytes and writes 1 per element.
# Its output goes out in whole 64-byte lines with non-temporal stores, which skip reading each
# output line into the cache before overwriting it (a fifth of the memory traffic).  Blocked
# runs (blocked QuantizeLinear along the last axis) do the same: a line holds four blocks of
# 16, two of 32 or a part of a block of a multiple of 64, each lane with its block's scale and
# zero point; other blocks of a multiple of 16 go out 16 codes per store (the write-combining
# buffers join them into lines).  The arithmetic is _q_int's, lane for lane.
LINE = 64
_ULINE = np.uint64(LINE)
#: Runs at least this long take the line path.
NT_MIN_RUN = 4096
#: Codes per store of blocks that do not tile lines; blocks of a multiple of it are vectorised.
BLOCK_VECTOR = 16
_UBLOCK_VECTOR = np.uint64(BLOCK_VECTOR)


def _emit_q8(context, builder, x, out, index, sv, top, bottom, zp, width):
    """Emit ``out[index:index + width] = clip(x / sv, bottom, top)`` rounded, ``+ zp``, low 8
    bits (NaN gives bottom), with a non-temporal store; ``sv``, ``top``, ``bottom`` are float32
    vectors and ``zp`` an int32 vector of ``width`` lanes."""
    f32, i32, i8 = ir.FloatType(), ir.IntType(32), ir.IntType(8)
    vf, vb = ir.VectorType(f32, width), ir.VectorType(i8, width)
    xp = builder.bitcast(builder.gep(x.data, [index]), vf.as_pointer())
    q = builder.fdiv(builder.load(xp, align=4), sv)
    q = builder.select(builder.fcmp_ordered(">", q, top), top, q)
    q = builder.select(builder.fcmp_ordered(">", q, bottom), q, bottom)
    rint = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vf, [vf]),
                                          f"llvm.rint.v{width}f32")
    code = builder.fptosi(builder.call(rint, [q]), ir.VectorType(i32, width))
    code = builder.trunc(builder.add(code, zp), vb)
    op = builder.bitcast(builder.gep(out.data, [index]), vb.as_pointer())
    store = builder.store(code, op, align=width)
    store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(i32, 1)]))


def _splat(builder, value, width):
    vec = builder.insert_element(ir.Constant(ir.VectorType(value.type, width), None), value,
                                 ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(vec, vec, ir.Constant(ir.VectorType(ir.IntType(32), width),
                                                        [0] * width))


def _line_operands(context, builder, sig, args):
    """The ``x`` and ``out`` arrays and the index ``k`` of a line intrinsic's first three
    arguments ``(x, out, k, ...)``."""
    x = context.make_array(sig.args[0])(context, builder, args[0])
    out = context.make_array(sig.args[1])(context, builder, args[1])
    return x, out, context.cast(builder, args[2], sig.args[2], types.intp)


def _widen_codes(context, builder, sig, args, i, codes):
    """``codes`` (a vector of 8-bit codes) as int32 lanes, sign-extended when the intrinsic's
    argument ``i`` (the ``sgn`` of the codes) is not zero, zero-extended otherwise."""
    i32 = ir.IntType(32)
    lanes = ir.VectorType(i32, codes.type.count)
    is_signed = builder.icmp_signed(
        "!=", context.cast(builder, args[i], sig.args[i], types.int32), ir.Constant(i32, 0))
    return builder.select(is_signed, builder.sext(codes, lanes), builder.zext(codes, lanes))


def _float32_array(a):
    return isinstance(a, types.Array) and a.dtype == types.float32 and a.layout == "C"


def _uint8_array(a):
    return isinstance(a, types.Array) and a.dtype == types.uint8 and a.layout == "C"


def _q8_store(width: int):
    """Return an intrinsic ``(x, out, k, sv, top, bottom, zp)`` that quantises
    ``x[k:k + width]`` (float32) into ``out[k:k + width]`` (uint8, ``width``-byte aligned there)
    with one scale ``sv``, zero point ``zp`` and clip bounds ``top``, ``bottom``."""

    @intrinsic
    def q8_store(typingctx, x, out, k, sv, top, bottom, zp):
        if not (_float32_array(x) and _uint8_array(out) and sv == top == bottom == types.float32
                and isinstance(zp, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            xa, oa, index = _line_operands(context, builder, sig, args)
            zp = context.cast(builder, args[6], sig.args[6], types.int32)
            _emit_q8(context, builder, xa, oa, index, *(_splat(builder, v, width) for v in
                     (args[3], args[4], args[5], zp)), width)
            return context.get_dummy_value()

        return types.none(x, out, k, sv, top, bottom, zp), codegen

    return q8_store


def _q8_blocks_line(block: int):
    """Return an intrinsic ``(x, out, k, s, z, si, signed, lo, hi)`` that quantises the line
    ``x[k:k + LINE]`` into ``out`` (64-byte aligned there), whose ``LINE / block`` blocks take
    the scales ``s[si:]`` and the zero-point codes ``z[si:]`` (sign-extended when ``signed``):
    ``clip(x / s, lo - z, hi - z)`` rounded, ``+ z``, low 8 bits."""
    groups = LINE // block

    @intrinsic
    def q8_blocks_line(typingctx, x, out, k, s, z, si, signed, lo, hi):
        if not (_float32_array(x) and _uint8_array(out) and _float32_array(s)
                and _uint8_array(z) and lo == hi == types.float32
                and isinstance(signed, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            xa, oa, index = _line_operands(context, builder, sig, args)
            sa, za = (context.make_array(sig.args[i])(context, builder, args[i]) for i in (3, 4))
            first = context.cast(builder, args[5], sig.args[5], types.intp)
            i32 = ir.IntType(32)
            vs, vz = ir.VectorType(ir.FloatType(), groups), ir.VectorType(ir.IntType(8), groups)
            scales = builder.load(builder.bitcast(builder.gep(sa.data, [first]),
                                                  vs.as_pointer()), align=4)
            codes = builder.load(builder.bitcast(builder.gep(za.data, [first]),
                                                 vz.as_pointer()), align=1)
            codes = _widen_codes(context, builder, sig, args, 6, codes)
            lanes = ir.Constant(ir.VectorType(i32, LINE), [j // block for j in range(LINE)])
            sv = builder.shuffle_vector(scales, scales, lanes)
            zp = builder.shuffle_vector(codes, codes, lanes)
            zpf = builder.sitofp(zp, ir.VectorType(ir.FloatType(), LINE))
            top = builder.fsub(_splat(builder, args[8], LINE), zpf)
            bottom = builder.fsub(_splat(builder, args[7], LINE), zpf)
            _emit_q8(context, builder, xa, oa, index, sv, top, bottom, zp, LINE)
            return context.get_dummy_value()

        return types.none(x, out, k, s, z, si, signed, lo, hi), codegen

    return q8_blocks_line


_q8_line = _q8_store(LINE)
_q8_vector = _q8_store(BLOCK_VECTOR)
_q8_line_16 = _q8_blocks_line(16)
_q8_line_32 = _q8_blocks_line(32)


@intrinsic
def _store_fence(typingctx):
    """Order the non-temporal stores before everything after (``sfence``)."""

    def codegen(context, builder, sig, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return types.none(), codegen


def _q8_run(x, out, a, f, sv, ze, prm):
    """Quantise ``x[a:f]`` with scale ``sv`` and zero-point code ``ze``; return whether it was
    done (only float32 into 8-bit codes, with no 16-bit rounding, is)."""


def _q8_types(x, out, sv):
    return x.dtype == types.float32 and out.dtype == types.uint8 and sv == types.float32


@overload(_q8_run)
def _q8_run_impl(x, out, a, f, sv, ze, prm):
    if not _q8_types(x, out, sv):
        return lambda x, out, a, f, sv, ze, prm: False

    def impl(x, out, a, f, sv, ze, prm):
        xfmt, rnd, mask, sgn, lo, hi = prm
        if rnd != 0 or mask != 0xFF or f - a < NT_MIN_RUN:
            return False
        zp = _sext(ze, mask, sgn)
        top = hi - np.float32(zp)
        bottom = lo - np.float32(zp)
        head = a + (-(out.ctypes.data + a)) % _ULINE
        body = head + (f - head) // _ULINE * _ULINE
        for k in range(a, head):
            out[k] = _q_int(x[k], sv, ze, prm)
        for k in range(head, body, _ULINE):
            _q8_line(x, out, k, sv, top, bottom, zp)
        _store_fence()
        for k in range(body, f):
            out[k] = _q_int(x[k], sv, ze, prm)
        return True

    return impl


def _q8_blocks(x, s, z, out, a, e, si, b, f, prm):
    """Quantise the blocked run ``x[a:e]`` (see :func:`_q_int_blocks`) in lines and 16-code
    stores; return whether it was done (float32 into 8-bit codes, no 16-bit rounding, blocks of
    a multiple of 16 shorter than NT_MIN_RUN (longer ones take the line path) on 16-byte
    boundaries of ``out``)."""


@overload(_q8_blocks)
def _q8_blocks_impl(x, s, z, out, a, e, si, b, f, prm):
    if not _q8_types(x, out, s.dtype):
        return lambda x, s, z, out, a, e, si, b, f, prm: False

    def impl(x, s, z, out, a, e, si, b, f, prm):
        xfmt, rnd, mask, sgn, lo, hi = prm
        if (rnd != 0 or mask != 0xFF or b % _UBLOCK_VECTOR != 0 or b >= NT_MIN_RUN
                or (out.ctypes.data + a) % _UBLOCK_VECTOR != 0
                or (f - a) % _UBLOCK_VECTOR != 0):
            return False
        lines = b == 16 or b == 32 or b % _ULINE == 0       # blocks tile the lines
        start = a
        while a < e:
            if (lines and a != start and (out.ctypes.data + a) % _ULINE == 0
                    and e - a >= _ULINE):
                # a block starts on a line: whole lines to the end of the run
                n = (e - a) // _ULINE * _ULINE
                for k in range(a, a + n, _ULINE):
                    i = si + (k - a) // b
                    if b == 16:
                        _q8_line_16(x, out, k, s, z, i, sgn, lo, hi)
                    elif b == 32:
                        _q8_line_32(x, out, k, s, z, i, sgn, lo, hi)
                    else:
                        zp = _sext(z[i], mask, sgn)
                        _q8_line(x, out, k, s[i], hi - np.float32(zp), lo - np.float32(zp), zp)
                si, f = si + n // b, min(e, a + (n // b + _ONE) * b)
                a += n
                continue
            sv, ze = s[si], z[si]
            zp = _sext(ze, mask, sgn)
            top = hi - np.float32(zp)
            bottom = lo - np.float32(zp)
            body = a + (f - a) // _UBLOCK_VECTOR * _UBLOCK_VECTOR  # short only at the end
            for k in range(a, body, _UBLOCK_VECTOR):
                _q8_vector(x, out, k, sv, top, bottom, zp)
            for k in range(body, f):
                out[k] = _q_int(x[k], sv, ze, prm)
            si, a, f = si + _ONE, f, min(e, f + b)
        _store_fence()
        return True

    return impl


@numba.njit(**_JIT)
def _q_int_blocks(x, s, z, out, a, e, si, b, f, prm):
    if _q8_blocks(x, s, z, out, a, e, si, b, f, prm):
        return
    while a < e:
        sv, ze = s[si], z[si]
        if not _q8_run(x, out, a, f, sv, ze, prm):
            for k in range(a, f):
                out[k] = _q_int(x[k], sv, ze, prm)
        si, a, f = si + _ONE, f, min(e, f + b)


@numba.njit(**_KERNEL)
def quantize_int_kernel(items, x, s, z, out, sizes, strides, blocks, prm):
    """Quantise to integer codes: ``clip(rint(x / s) + z, lo, hi) & mask`` into ``out``.

    ``x``: float32, uint16 (float16/bfloat16 bits, format ``xfmt``) or int32; ``s``: float32
    or float64, the arithmetic type; ``z`` and ``out``: uint8/uint16 codes.  ``prm`` is
    ``(xfmt, rnd, mask, sgn, lo, hi)``: ``rnd`` is 0 or the 16-bit format that x and the
    quotient are rounded to, ``mask``/``sgn`` extend the codes, ``lo``/``hi`` (of ``s``'s type)
    bound the result.  Out-of-range and infinite quotients saturate, NaN gives ``lo``.
    """
    w = next_item(items)
    while w < items[2]:
        runs = item_runs(w, sizes, strides, blocks, ITEM_ELEMENTS)
        for r in range(runs.shape[0]):
            a, e, si, b, f = _unsigned_run(runs, r)
            if b == 0:
                _q_int_each(x, s, z, out, a, e, si, prm)
            else:
                _q_int_blocks(x, s, z, out, a, e, si, b, f, prm)
        item_done(items)
        w = next_item(items)


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
def quantize_float_kernel(items, x, s, z, out, sizes, strides, blocks, prm):
    """Write the quotient ``x / s``, clipped to ``[-fmax, fmax]``, plus ``z`` into ``out``.

    As :func:`quantize_int_kernel`, except ``z``: float zero points of ``s``'s type (``-0.0``
    adds nothing, not even to ``-0.0``), ``out`` of ``s``'s type, and ``prm`` is
    ``(xfmt, rnd, fmax)``.  NaN passes.  The caller encodes ``out`` to float8/float4.
    """
    w = next_item(items)
    while w < items[2]:
        runs = item_runs(w, sizes, strides, blocks, ITEM_ELEMENTS)
        for r in range(runs.shape[0]):
            a, e, si, b, f = _unsigned_run(runs, r)
            if b == 0:
                _q_float_each(x, s, z, out, a, e, si, prm)
            else:
                _q_float_blocks(x, s, z, out, a, e, si, b, f, prm)
        item_done(items)
        w = next_item(items)


@numba.njit(**_JIT)
def _dq_each(x, s, z, out, a, e, si, prm):
    for k in range(a, e):
        i = si + (k - a)
        out[k] = _dq(x[k], s[i], z[i], prm, out)


# A long run of 8-bit codes with one float32 scale dequantised to float32 (per-tensor
# DequantizeLinear) writes four bytes per byte it reads: its output goes out in whole 64-byte
# lines of 16 floats with non-temporal stores, as the quantiser's does.  The arithmetic is
# _dq's, lane for lane: float32(x) - float32(z), times the scale.
_DQ_LINE = LINE // 4


@intrinsic
def _dq8_line(typingctx, x, out, k, sv, zpf, signed):
    """``out[k:k + 16] = (float32(x[k:k + 16]) - zpf) * sv`` (``x`` uint8 codes, sign-extended
    when ``signed``; ``out`` float32, 64-byte aligned there), with a non-temporal store."""
    if not (_uint8_array(x) and _float32_array(out) and sv == zpf == types.float32
            and isinstance(signed, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        xa, oa, index = _line_operands(context, builder, sig, args)
        i32 = ir.IntType(32)
        vb, vf = ir.VectorType(ir.IntType(8), _DQ_LINE), ir.VectorType(ir.FloatType(), _DQ_LINE)
        codes = builder.load(builder.bitcast(builder.gep(xa.data, [index]), vb.as_pointer()),
                             align=1)
        codes = _widen_codes(context, builder, sig, args, 5, codes)
        y = builder.fsub(builder.sitofp(codes, vf), _splat(builder, args[4], _DQ_LINE))
        y = builder.fmul(y, _splat(builder, args[3], _DQ_LINE))
        store = builder.store(y, builder.bitcast(builder.gep(oa.data, [index]), vf.as_pointer()),
                              align=LINE)
        store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(i32, 1)]))
        return context.get_dummy_value()

    return types.none(x, out, k, sv, zpf, signed), codegen


def _dq8_run(x, out, a, f, sv, ze, prm):
    """Dequantise ``x[a:f]`` with scale ``sv`` and zero-point code ``ze``; return whether it
    was done (only 8-bit codes into float32, no table, runs of NT_MIN_RUN or more are)."""


@overload(_dq8_run)
def _dq8_run_impl(x, out, a, f, sv, ze, prm):
    if not (x.dtype == types.uint8 and out.dtype == types.float32 and sv == types.float32):
        return lambda x, out, a, f, sv, ze, prm: False

    def impl(x, out, a, f, sv, ze, prm):
        lut, mask, sgn, ofmt = prm
        if (lut.size or mask != 0xFF or ofmt != 0 or f - a < NT_MIN_RUN
                or out.ctypes.data % 4 != 0):
            return False
        zpf = np.float32(_sext(ze, mask, sgn))
        head = min(f, a + (-(out.ctypes.data + a * 4) % _ULINE) // 4)
        body = head + (f - head) // _DQ_LINE * _DQ_LINE
        for k in range(a, head):
            out[k] = _dq(x[k], sv, ze, prm, out)
        for k in range(head, body, _DQ_LINE):
            _dq8_line(x, out, k, sv, zpf, sgn)
        _store_fence()
        for k in range(body, f):
            out[k] = _dq(x[k], sv, ze, prm, out)
        return True

    return impl


@numba.njit(**_JIT)
def _dq_long_blocks(x, s, z, out, a, e, si, b, f, prm):
    while a < e:
        sv, ze = s[si], z[si]
        if not _dq8_run(x, out, a, f, sv, ze, prm):
            for k in range(a, f):
                out[k] = _dq(x[k], sv, ze, prm, out)
        si, a, f = si + _ONE, f, min(e, f + b)


@numba.njit(**_JIT)
def _dq_blocks(x, s, z, out, a, e, si, b, f, prm):
    if b >= NT_MIN_RUN:       # kept apart: the line path in the loop slows short blocks 2x
        _dq_long_blocks(x, s, z, out, a, e, si, b, f, prm)
        return
    while a < e:
        sv, ze = s[si], z[si]
        for k in range(a, f):
            out[k] = _dq(x[k], sv, ze, prm, out)
        si, a, f = si + _ONE, f, min(e, f + b)


@numba.njit(**_KERNEL)
def dequantize_kernel(items, x, s, z, out, sizes, strides, blocks, prm):
    """Dequantise: ``(x - z) * s`` into ``out``.

    ``prm`` is ``(lut, mask, sgn, ofmt)``.  ``x`` and ``z``: uint8/uint16 codes
    (``mask``/``sgn``) or int32; or, when ``lut`` is not empty, uint8 codes that ``lut``
    decodes to float32 (``z`` is then ignored).  ``x - z`` is exact in float32 for codes up
    to 16 bits; for int32 it is ``float32(x) - z`` in ``s``'s type.  ``out``: ``s``'s type, or
    uint16 bit patterns of the 16-bit format ``ofmt``.
    """
    w = next_item(items)
    while w < items[2]:
        runs = item_runs(w, sizes, strides, blocks, ITEM_ELEMENTS)
        for r in range(runs.shape[0]):
            a, e, si, b, f = _unsigned_run(runs, r)
            if b == 0:
                _dq_each(x, s, z, out, a, e, si, prm)
            else:
                _dq_blocks(x, s, z, out, a, e, si, b, f, prm)
        item_done(items)
        w = next_item(items)


# --- threads ---------------------------------------------------------------------------------

#: Arrays smaller than this run on the calling thread only. Measured on a 2-vCPU AMD EPYC
#: (``qaccel bench threads``): below about 800K elements a second thread made every Q/DQ line
#: slower (1.3-1.6x at 256K elements), from 1M on it pays for Q and blocked DQ.
PARALLEL_MIN_ELEMENTS = 1 << 20
#: The calling thread, done with its items, waits for the helpers' last items spinning this
#: long with the GIL released (a helper returning from the kernel needs it), then in sleeps
#: of this long.
WAIT_SPIN_SECONDS = 1e-3
WAIT_SLEEP_SECONDS = 50e-6
#: A helper thread, done with a job, spins this long for the next one before it sleeps
#: (as ONNX Runtime's pool threads do): back-to-back calls then find it on a core.
HELPER_SPIN_SECONDS = 5e-3


@intrinsic
def _load_atomic(typingctx, arr, i):
    """``arr[i]`` (int64, C-contiguous) read atomically: a loop can poll it."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.int64 and arr.layout == "C"):
        return None

    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        index = context.cast(builder, args[1], sig.args[1], types.intp)
        return builder.load_atomic(builder.gep(data, [index]), "acquire", 8)

    return types.int64(arr, i), codegen


@intrinsic
def _pause(typingctx):
    """The spin-wait hint (x86 ``pause``; nothing elsewhere)."""

    def codegen(context, builder, sig, args):
        if "x86" in builder.module.triple or not builder.module.triple:
            fnty = ir.FunctionType(ir.VoidType(), [])
            fn = builder.module.declare_intrinsic("llvm.x86.sse2.pause", (), fnty)
            builder.call(fn, [])
        return context.get_dummy_value()

    return types.none(), codegen


@numba.njit(cache=True, nogil=True)
def _hold(items, delta):
    """Count a helper in (``delta`` 1) or out (-1) of ``items``'s job: ``items[3]``."""
    _fetch_add(items, 3, delta)


@numba.njit(cache=True, nogil=True)
def _wait_for_job(ctrl, seen, spins, held):
    """Count the helper out of the job of ``held`` (the items of the job it last worked on,
    if not None), with the GIL released; then poll ``ctrl[0]`` until it differs from
    ``seen``, at most ``spins`` times; return it."""
    if held is not None:
        _hold(held, -1)
    for _ in range(spins):
        value = _load_atomic(ctrl, 0)
        if value != seen:
            return value
        _pause()
    return _load_atomic(ctrl, 0)


@numba.njit(cache=True, nogil=True)
def _wait_for_helpers(items, spins):
    """Poll until no helper holds the job of ``items`` (``items[3] == 0``), at most ``spins``
    times."""
    for _ in range(spins):
        if _load_atomic(items, 3) == 0:
            return
        _pause()


def _cpu_getter():
    """``sched_getcpu`` of the C library (the CPU the calling thread runs on), or None where
    there is none or threads cannot be bound to CPUs."""
    try:
        getcpu = ctypes.CDLL(None, use_errno=True).sched_getcpu
    except (AttributeError, OSError):
        return None
    getcpu.restype = ctypes.c_int
    getcpu.argtypes = ()
    return getcpu if hasattr(os, "sched_setaffinity") and getcpu() >= 0 else None


_getcpu = _cpu_getter()


class _Helpers:
    """Helper threads that run the kernel of each job posted, next to the calling thread.

    Between jobs a helper spins for HELPER_SPIN_SECONDS with the GIL released, then sleeps
    until the next job; a job posted while it spins starts at once, on its own core.

    During a job (:func:`run_items`) the caller and each helper are bound to CPUs of their
    own."""

    def __init__(self, n_threads: int):
        self.pid = os.getpid()
        self.ctrl = np.zeros(1, np.int64)  # sequence number of the last job posted
        self.job = None
        self.cond = threading.Condition()
        for held in (None, np.zeros(4, np.int64)):
            ensure_compiled(_wait_for_job, self.ctrl, 1, 0, held)
        ensure_compiled(_wait_for_helpers, np.zeros(4, np.int64), 0)
        ensure_compiled(_hold, np.zeros(4, np.int64), 0)
        t0 = time.perf_counter()
        _wait_for_job(self.ctrl, 0, 20000, None)
        per_spin = max(time.perf_counter() - t0, 1e-6) / 20000
        self.spins = max(1, int(HELPER_SPIN_SECONDS / per_spin))
        self.wait_spins = max(1, int(WAIT_SPIN_SECONDS / per_spin))
        self.threads = [
            threading.Thread(target=self._loop, name=f"qaccel-{i}", daemon=True)
            for i in range(n_threads)
        ]
        for thread in self.threads:
            thread.start()
        self.placed_for = None  # (caller's CPU, the CPUs it may use) the binding is for

    def place(self, cpu: int, allowed: frozenset) -> None:
        """Bind the helpers to the CPUs of ``allowed`` other than ``cpu`` (the caller's)."""
        if (cpu, allowed) == self.placed_for:
            return
        others = sorted(allowed - {cpu}) or sorted(allowed)
        try:
            for i, thread in enumerate(self.threads):
                os.sched_setaffinity(thread.native_id, {others[i % len(others)]})
        except OSError:  # a sandbox may forbid it: the scheduler places them then
            return
        self.placed_for = (cpu, allowed)

    def post(self, job) -> None:
        """Offer ``job = (kernel, items, args, errors)`` to the helpers."""
        with self.cond:
            self.job = job
            self.ctrl[0] += 1
            self.cond.notify_all()

    def retract(self, job) -> None:
        """Offer ``job`` no more (its items are all computed)."""
        with self.cond:
            if self.job is job:
                self.job = None

    def _loop(self) -> None:
        seen, held = 0, None
        while True:
            # counted out of its last job only now, with the GIL released and its references
            # to the job's arrays dropped: the caller waits for that without the GIL
            if _wait_for_job(self.ctrl, seen, self.spins, held) == seen:
                with self.cond:
                    while self.ctrl[0] == seen:
                        self.cond.wait()
            held = None
            with self.cond:
                seen = int(self.ctrl[0])
                if self.job is None or self.job[1][0] >= self.job[1][2]:
                    continue  # nothing left to claim
                kernel, held, args, errors = self.job
                _hold(held, 1)  # a helper holds the job's arrays
            try:
                kernel(held, *args)
            except BaseException as exc:  # handed to the calling thread
                errors.append(exc)
            del kernel, args, errors  # no reference to the arrays (output buffers) is left


_helpers: _Helpers | None = None
_helpers_lock = threading.Lock()


def _n_threads() -> int:
    """Threads for a large job: Numba's setting for the calling thread
    (``numba.set_num_threads``, ``NUMBA_NUM_THREADS`` by default), as its ``prange`` kernels
    use, and no more than the CPUs this process may use."""
    return max(1, min(numba.get_num_threads(), len(os.sched_getaffinity(0))))


def _get_helpers(n_threads: int) -> _Helpers:
    global _helpers
    with _helpers_lock:
        if _helpers is None or len(_helpers.threads) < n_threads or _helpers.pid != os.getpid():
            _helpers = _Helpers(n_threads)
        return _helpers


@contextlib.contextmanager
def _bound_to_own_cpu(helpers: _Helpers):
    """Inside the block the calling thread stays on the CPU it is on, and the helpers are
    bound to the others it may use (on Linux; elsewhere the scheduler places them all).

    Left to the scheduler, a helper woken by the caller was often queued on the caller's own
    CPU while another one idled, or the caller was moved onto a helper's: on a 2-vCPU VM,
    M = 1 MatMulNBits at two threads then took as long as at one thread, or 4x as long when
    the two shared time slices.  The caller's own binding is restored on leaving.
    """
    if _getcpu is None:
        yield
        return
    allowed = os.sched_getaffinity(0)
    cpu = _getcpu()
    try:
        os.sched_setaffinity(0, {cpu})
    except OSError:  # a sandbox may forbid it
        yield
        return
    try:
        helpers.place(cpu, frozenset(allowed))
        yield
    finally:
        os.sched_setaffinity(0, allowed)


def run_items(kernel, n_items: int, n_elements: int, *args) -> None:
    """Compute work items ``[0, n_items)`` with ``kernel(items, *args)`` (see ``next_item``).

    Large jobs (``n_elements >= PARALLEL_MIN_ELEMENTS``) run on up to
    ``numba.get_num_threads()`` threads (``numba.set_num_threads`` limits them, as it does the
    ``prange`` kernels; no more than the CPUs this process may use), the calling thread included,
    each claiming one item at a time, so that a thread slowed down by other processes on the
    machine does less of the work.  The calling thread never waits for a helper that has not
    started: it waits only for items a helper is still computing.  The kernels release the
    GIL.  The first call with new argument types compiles under
    :func:`.jitcache.ensure_compiled`.
    """
    ensure_compiled(kernel, np.zeros(4, np.int64), *args)
    items = np.array([0, 0, n_items, 0], np.int64)  # next, done, end; helpers holding it
    n_threads = min(_n_threads(), n_items) if n_elements >= PARALLEL_MIN_ELEMENTS else 1
    if n_threads <= 1:
        kernel(items, *args)
        return
    errors: list[BaseException] = []
    job = (kernel, items, args, errors)
    helpers = _get_helpers(n_threads - 1)
    with _bound_to_own_cpu(helpers):
        helpers.post(job)
        try:
            kernel(items, *args)
        finally:
            helpers.retract(job)
    # helpers still computing items or holding the arrays: wait without the GIL (a helper
    # needs it to leave the kernel), then in sleeps
    _wait_for_helpers(items, helpers.wait_spins)
    while items[3]:
        time.sleep(WAIT_SLEEP_SECONDS)
    if errors:
        raise errors[0]


# --- output buffers --------------------------------------------------------------------------

#: Outputs of at least this many bytes are carved from recycled buffers.
RECYCLE_MIN_BYTES = 1 << 22
#: The most recently used buffers kept for recycling.
RECYCLE_MAX_BUFFERS = 4

_buffers: list[np.ndarray] = []  # least recently used first
_buffers_lock = threading.Lock()


def output_buffer(n: int, dtype) -> np.ndarray:
    """Return an uninitialised 1-D array of ``n`` elements of ``dtype``.

    A large array reuses the memory of an earlier one that nothing references any more (no
    array, view or buffer of it is alive), as ONNX Runtime's arena does: writing fresh pages
    costs a page fault each, which is as much time as the kernel itself.  The arrays behave as
    ordinary arrays; their ``base`` is a uint8 buffer kept for recycling, and their data starts
    on a 64-byte line (the line paths of the kernels need no unaligned head).
    """
    dtype = np.dtype(dtype)
    nbytes = n * dtype.itemsize
    if nbytes < RECYCLE_MIN_BYTES:
        return np.empty(n, dtype)
    with _buffers_lock:
        for i in range(len(_buffers)):
            # referenced only by the list and getrefcount's argument: no view of it is alive
            if _buffers[i].nbytes == nbytes + LINE and sys.getrefcount(_buffers[i]) == 2:
                _buffers.append(_buffers.pop(i))
                break
        else:
            _buffers.append(np.empty(nbytes + LINE, np.uint8))
            del _buffers[:-RECYCLE_MAX_BUFFERS]
        raw = _buffers[-1]
        start = -raw.ctypes.data % LINE
        return raw[start:start + nbytes].view(dtype)
