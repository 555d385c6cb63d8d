"""MatMulNBits in the engine's order: what the RTL MatMulNBits engine computes, bit for bit.

:func:`qaccel.model.nbits.matmul_nbits` fixes one order for every output (a float64 sum,
rounded once), which is what a CPU can afford.  The engine
(:class:`~qaccel.rtl.nbits.matmul_nbits_v2.MatMulNBitsV2`, docs/matmul_nbits_v2.md) reduces each
K-block in exact integers and adds float32 terms per (row, column, block) to an accumulator
that starts at the bias, so its sums are rounded in a different, equally fixed, order.
:func:`matmul_nbits_v2` reproduces that order, so that the testbenches can demand bit-exact
equality with the RTL; against ONNX Runtime and the golden model it agrees within
``1e-6 * sum_k |a_k w_k|`` (tested).

Every ``f32(...)`` is one IEEE float32 operation, rounded to nearest even; integers are exact.
The int8 path (section 1: accuracy_level 4, integer or absent zero points, no g_idx) has one
term per block (:func:`int8_block_terms`); the float path (section 2: the rest) writes each
block of A in block floating point as four int8 digits and has four terms per block, eight
with float zero points (:func:`float_operands`, :func:`float_block_terms`; with g_idx, K
laid out group by group: :func:`block_layout`). Both share :func:`accumulate_terms`; the
result is rounded to A's type at the end (float16 / bfloat16 A are widened to float32,
exactly).
"""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np

from . import nbits_kernels as _k
from .config import int8_path
from .nbits import (
    NBitsArgs,
    check_A,
    check_bias,
    unpack_nbits,
    unpack_zero_points,
)
from .quant_kernels import item_done, next_item, run_items
from .validate import check_int

__all__ = ["E_MIN", "FloatOperands", "accumulate_terms", "block_layout", "float_block_terms",
           "float_operands", "int8_block_terms", "int8_path", "matmul_nbits_v2"]

_F32 = np.float32


def _int8_operands(a: np.ndarray, op: NBitsArgs):
    """The int8 path's integers: ``qa`` (M, kb, bs) and codes ``q`` (N, kb, bs) as int64 (codes
    past K are 0), ``sa`` (M, kb) float32 and the integer zero points ``zp`` (N, kb) int64."""
    M, K = a.shape
    bs, kb, N = op.block_size, op.kb, op.N
    padded = np.zeros((M, kb * bs), _F32)
    padded[:, :K] = a
    qa, sa, _ = _k.quantize_a(padded, bs)
    qa = qa.astype(np.int64).reshape(M, kb, bs)
    q = unpack_nbits(op.Bw.view(np.uint8), op.bits, bs).reshape(N, kb, bs).astype(np.int64)
    q[:, :, :] = np.where(np.arange(kb * bs).reshape(kb, bs) < K, q, 0)
    if op.zmode == _k.ZP_PACKED:
        zp = unpack_zero_points(op.zpk, op.bits, kb).astype(np.int64)      # (N, kb)
    else:
        zp = np.full((N, kb), 1 << (op.bits - 1), np.int64)
    return qa, q, sa, zp


def int8_block_terms(a: np.ndarray, op: NBitsArgs) -> np.ndarray:
    """The v2 engine's int8-path block terms (docs/matmul_nbits_v2.md, section 1) of
    validated operands: ``a`` (M, K) float32 -> ``t`` (M, N, k_blocks) float32 with
    ``t = f32(f32(sa * sb) * f32(isum - zp * asum))``, the integers exact."""
    qa, q, sa, zp = _int8_operands(a, op)
    d = np.einsum("mbk,nbk->mnb", qa, q) - zp[None] * qa.sum(axis=2)[:, None, :]
    with np.errstate(all="ignore"):
        return (sa[:, None, :] * op.scales[None]) * d.astype(_F32)


def accumulate_terms(t: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """The v2 lane's order: ``acc = bias`` (``+0`` without one), then ``acc = f32(acc + t_b)``
    for ``b = 0, 1, ...``; ``t`` (M, N, k_blocks) float32, ``bias`` (N,) float32."""
    acc = np.zeros(t.shape[:2], _F32) if bias is None else np.tile(bias.astype(_F32),
                                                                    (t.shape[0], 1))
    with np.errstate(all="ignore"):
        for b in range(t.shape[2]):
            acc = acc + t[:, :, b]
    return acc


#: The smallest block exponent of the float path: every digit scale ``2**(e - 29 + 8 i)`` is
#: then a normal float32 (``2**-126`` and up).
E_MIN = -97
#: Terms per row chunk of the float path (memory, not results).
_CHUNK = 1 << 22


class FloatOperands(NamedTuple):
    """The v2 float path's operands (docs/matmul_nbits_v2.md, section 2), as the host and the
    row quantiser lay them out; ``kb`` blocks of ``bs`` slots (after the g_idx permutation).

    slots : (kb, bs) int64
        The ``k`` of A's column and B's row in each slot, -1 for a padding slot.
    group : (kb,) int64
        The scale / zero-point column of each block (``k // block_size``, or the group).
    e : (M, kb) int32
        Block exponents: ``floor(log2(max finite |a|))``, at least :data:`E_MIN`.
    sa : (M, kb, 4) float32
        Digit scales ``2**(e - 29 + 8 i)``; NaN in a block holding a NaN or infinite ``a``.
    x : (M, kb, 4, bs) int8
        Digits of ``X = trunc(a * 2**(29 - e))`` (0 for padding and non-finite ``a``).
    q : (N, kb, bs) uint8
        Weight codes, 0 in padding slots.
    s : (N, kb) float32
        The block's scale.
    zp : (N, kb) int64 or None
        Integer zero points (the packed codes or ``2**(bits-1)``); None with float ones.
    z : (N, kb) float32 or None
        ``f32(-s * zp)`` for float zero points; None otherwise.
    """

    slots: np.ndarray
    group: np.ndarray
    e: np.ndarray
    sa: np.ndarray
    x: np.ndarray
    q: np.ndarray
    s: np.ndarray
    zp: np.ndarray | None
    z: np.ndarray | None


def block_layout(op: NBitsArgs) -> tuple[np.ndarray, np.ndarray]:
    """``(slots, group)`` of :class:`FloatOperands`: without g_idx the natural blocks (the
    last padded); with g_idx K stably sorted by group, each group split into blocks of
    ``block_size`` in ascending ``k`` (its last block padded), groups ascending, empty
    groups taking no block."""
    bs, K = op.block_size, op.K
    if op.gidx is None:
        slots = np.arange(op.kb * bs, dtype=np.int64)
        slots[K:] = -1
        return slots.reshape(op.kb, bs), np.arange(op.kb, dtype=np.int64)
    g = op.gidx.astype(np.int64)
    counts = np.bincount(g, minlength=op.kb)
    blocks = -(-counts // bs)
    order = np.argsort(g, kind="stable")
    rank = np.arange(K) - np.repeat(np.cumsum(counts) - counts, counts)
    slots = np.full(int(blocks.sum()) * bs, -1, np.int64)
    slots[bs * (np.cumsum(blocks) - blocks)[g[order]] + rank] = order
    return slots.reshape(-1, bs), np.repeat(np.arange(op.kb, dtype=np.int64), blocks)


def _codes(op: NBitsArgs) -> np.ndarray:
    """B's codes (N, k_blocks * block_size) uint8 (as :func:`unpack_nbits`, the tail past K
    included), shifts and masks for 2, 4 and 8 bits."""
    b = op.Bw.view(np.uint8).reshape(op.N, -1)
    if op.bits not in (2, 4, 8):
        return unpack_nbits(b.reshape(op.N, op.kb, -1), op.bits, op.block_size).reshape(op.N, -1)
    shifts = np.arange(0, 8, op.bits, dtype=np.uint8)
    return ((b[:, :, None] >> shifts) & np.uint8((1 << op.bits) - 1)).reshape(op.N, -1)


def float_operands(a: np.ndarray, op: NBitsArgs) -> FloatOperands:
    """The float path's operands of validated arguments: ``a`` (M, K) float32 (float16 and
    bfloat16 A widened) and ``op``; see :class:`FloatOperands`."""
    slots, group = block_layout(op)
    M, kb, bs, N = a.shape[0], slots.shape[0], op.block_size, op.N
    pad = slots < 0
    if op.gidx is None:                                      # the natural blocks
        a3 = np.zeros((M, kb * bs), _F32)
        a3[:, : op.K] = a
        a3 = a3.reshape(M, kb, bs)
        q = _codes(op).reshape(N, kb, bs)
    else:
        take = np.where(pad, 0, slots)
        a3 = np.where(pad, _F32(0), a[:, take])
        q = _codes(op)[:, take]
    q[:, pad] = 0
    finite = np.isfinite(a3)
    a3 = np.where(finite, a3, _F32(0))                                  # (M, kb, bs)
    amax = np.abs(a3).max(axis=2, initial=_F32(0))
    e = np.where(amax > 0, np.maximum(np.frexp(amax)[1] - 1, E_MIN), E_MIN).astype(np.int32)
    X = np.trunc(a3.astype(np.float64) * np.ldexp(1.0, 29 - e)[:, :, None]).astype(np.int64)
    x = np.empty((M, kb, 4, bs), np.int8)
    for i in range(3):
        xi = ((X + 128) & 255) - 128
        x[:, :, i] = xi
        X = (X - xi) >> 8
    x[:, :, 3] = X
    sa = np.ldexp(np.ones((M, kb, 4), _F32), e[:, :, None] - 29 + 8 * np.arange(4))
    sa[~finite.all(axis=2)] = np.nan
    s = np.ascontiguousarray(op.scales[:, group])
    zp = z = None
    if op.zmode == _k.ZP_FLOAT:
        with np.errstate(all="ignore"):
            z = -s * op.zpf[:, group]                                   # f32(-s * zp)
    elif op.zmode == _k.ZP_PACKED:
        zp = unpack_zero_points(op.zpk, op.bits, op.kb).astype(np.int64)[:, group]
    else:
        zp = np.full((N, kb), 1 << (op.bits - 1), np.int64)
    return FloatOperands(slots, group, e, sa, x, q, s, zp, z)


#: Output columns per work item of :func:`_digit_sums`.
_COLUMNS = 64


@numba.njit(cache=True, nogil=True)
def _digit_sums(items, x, q, zp, out):
    """``out[m, n, b, i] = sum_k x[m, b, i, k] * (q[n, b, k] - zp[n, b])``, exact (int64), for
    the columns of the work items claimed (``_COLUMNS`` each); x (M, kb, 4, bs) int8,
    q (N, kb, bs) uint8, zp (N, kb) int64, out (M, N, kb, 4) int64."""
    M, kb, _, bs = x.shape
    N = q.shape[0]
    w = np.empty(bs, np.int32)
    it = next_item(items)
    while it < items[2]:
        for n in range(it * _COLUMNS, min(N, (it + 1) * _COLUMNS)):
            for b in range(kb):
                z = np.int32(zp[n, b])
                for k in range(bs):
                    w[k] = np.int32(q[n, b, k]) - z
                for m in range(M):
                    for i in range(4):
                        acc = np.int64(0)
                        for k in range(bs):
                            acc += np.int32(x[m, b, i, k]) * w[k]
                        out[m, n, b, i] = acc
        item_done(items)
        it = next_item(items)


def float_block_terms(fo: FloatOperands) -> np.ndarray:
    """The v2 float path's terms, in the lane's order: ``t`` (M, N, kb * T) float32, block by
    block, digit ``i = 0..3`` within a block, ``T = 1`` term per digit with integer zero
    points (``f32(f32(sa_i * s) * f32(d_i))``, ``d_i = sum_k x_i (q - zp)``) and ``T = 2``
    with float ones (``f32(f32(sa_i * s) * f32(S_i))``, ``S_i = sum_k x_i q``, then
    ``f32(f32(sa_i * z) * f32(A_i))``, ``A_i = sum_k x_i``); the integer sums exact."""
    M, kb, _, bs = fo.x.shape
    N = fo.q.shape[0]
    zp = np.zeros((N, kb), np.int64) if fo.zp is None else fo.zp
    d = np.empty((M, N, kb, 4), np.int64)
    run_items(_digit_sums, -(-N // _COLUMNS), M * N * kb * 4 * bs, np.ascontiguousarray(fo.x),
              np.ascontiguousarray(fo.q), np.ascontiguousarray(zp, np.int64), d)
    sa = fo.sa[:, None]                                                 # (M, 1, kb, 4)
    with np.errstate(all="ignore"):
        t = (sa * fo.s[None, :, :, None]) * d.astype(_F32)
        if fo.z is None:
            return t.reshape(M, N, kb * 4)
        asum = fo.x.sum(axis=3, dtype=np.int64).astype(_F32)[:, None]   # (M, 1, kb, 4)
        tz = (sa * fo.z[None, :, :, None]) * asum
        return np.stack([t, tz], axis=-1).reshape(M, N, kb * 8)


def matmul_nbits_v2(A, B, scales, zero_points=None, g_idx=None, bias=None, *, K, N, bits,
                    block_size, accuracy_level=4):
    """MatMulNBits as the v2 engine computes it (docs/matmul_nbits_v2.md, sections 1 and 2),
    bit for bit: integer block sums, float32 terms per (row, column, block) accumulated after
    the bias in block order.

    Arguments as :func:`qaccel.model.nbits.matmul_nbits` (and the same TypeError /
    ValueError for bad ones). The int8 path (accuracy_level 4, integer or absent zero
    points, no g_idx): :func:`int8_block_terms`; the float path (the rest):
    :func:`float_operands`, :func:`float_block_terms`; both then :func:`accumulate_terms`
    and the rounding to A's type.
    """
    level = check_int("accuracy_level", accuracy_level, 0, 4)
    a = check_A(A, check_int("K", K, 1))
    op = NBitsArgs(B, scales, zero_points, g_idx, K=K, N=N, bits=bits, block_size=block_size,
             dtype=a.dtype)
    b = check_bias(bias, a.dtype, op.N)
    a32 = a.reshape(-1, op.K).astype(_F32)
    if int8_path(level, float_zero_points=op.zmode == _k.ZP_FLOAT, g_idx=op.gidx is not None):
        y = accumulate_terms(int8_block_terms(a32, op), b)
    else:
        fo = float_operands(a32, op)
        M, N = a32.shape[0], op.N
        rows = max(1, _CHUNK // (N * fo.x.shape[1] * (4 if fo.z is None else 8)))
        y = np.empty((M, N), _F32)
        for r0 in range(0, M, rows):
            part = fo._replace(e=fo.e[r0:r0 + rows], sa=fo.sa[r0:r0 + rows],
                               x=fo.x[r0:r0 + rows])
            y[r0:r0 + rows] = accumulate_terms(float_block_terms(part), b)
    return y.astype(a.dtype).reshape(*a.shape[:-1], op.N)


