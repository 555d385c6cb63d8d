"""Numba kernels behind :mod:`qaccel.model.nbits` (MatMulNBits and ORT's block quantiser).

Arguments are validated by the public functions in ``nbits.py``; the kernels trust their
inputs (shapes, dtypes, contiguity, value ranges).  Each kernel has a slow NumPy twin in
``tests/model/naive_nbits.py``.

MatMulNBits has two sets of kernels with the same results, bit for bit:

- :func:`matmul_packed` and :func:`matmul_tiles` (bits 2, 4, 8 per call; any bits prepared;
  no g_idx), written with explicit 512-bit vectors (section "SIMD vectors"): column tiles of
  16 columns, B's packed 32-bit words unpacked in registers, the int8 path's dot products
  with the instructions of the CPU tier compiled for (:data:`DOT_TIERS`: AVX512-VNNI,
  AVX-512BW, AVX2, plain IR; every tier gives the same bits).  They run on threads that claim
  work items (:mod:`.quant_kernels`).
- :func:`matmul`, the general one (g_idx, bits 3, 5, 6, 7 per call, NaN or infinity in A on
  the int8 path, blocks above 65536), auto-vectorised by LLVM, with ``prange``.  Its hot
  loops index with unsigned integers (``_U``): Numba then skips negative-index wraparound,
  which otherwise keeps LLVM from vectorising the column loops.

Only the kernels are cached on disk (their helpers are compiled into them), and
:mod:`.nbits` calls them through :func:`.jitcache.locked_call`.
"""

from __future__ import annotations

import llvmlite.binding as llvm
import numba
import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

from .config import ZERO_POINTS
from .quant_kernels import f16_bits_to_f32, f32_to_f16_bits, item_done, next_item

_U = np.uintp
_F32 = np.float32
_F64 = np.float64
_FLT_MAX = _F32(np.finfo(np.float32).max)
_Q_CHUNK = 256  # rows per exact float32 integer partial sum: 256*127*255 < 2**24
_GATHER_WORDS = 32  # words of B read per column at a time (64 bytes)

#: Zero-point modes of the kernels: the codes of :data:`.config.ZERO_POINTS`, in its order.
ZP_DEFAULT, ZP_PACKED, ZP_FLOAT = (ZERO_POINTS.index(k) for k in ("none", "packed", "float"))


# --------------------------------------------------------------------------- bit streams


@numba.njit(inline="always")
def _bits_at(buf, r, j, bits):
    """Element ``j`` of the LSB-first ``bits``-bit stream in row ``r`` of a uint8 array."""
    off = j * bits
    i = off >> 3
    sh = off & 7
    v = np.int32(buf[r, i])
    if sh + bits > 8:
        v |= np.int32(buf[r, i + 1]) << 8
    return (v >> sh) & ((1 << bits) - 1)


@numba.njit(cache=True)
def unpack_bits(packed, bits, count):
    """(R, nbytes) uint8 bit streams -> (R, count) uint8 elements."""
    rows = packed.shape[0]
    out = np.empty((rows, count), np.uint8)
    for r in range(rows):
        for j in range(count):
            out[r, j] = _bits_at(packed, r, j, bits)
    return out


@numba.njit(cache=True)
def pack_bits(values, bits, nbytes):
    """(R, count) uint8 elements < 2**bits -> (R, nbytes) uint8 bit streams, spare bits 0."""
    rows, count = values.shape
    out = np.zeros((rows, nbytes), np.uint8)
    for r in range(rows):
        for j in range(count):
            off = j * bits
            i = off >> 3
            v = np.int32(values[r, j]) << (off & 7)
            out[r, i] |= np.uint8(v & 0xFF)
            if v > 0xFF:
                out[r, i + 1] |= np.uint8(v >> 8)
    return out


# --------------------------------------------------------------------------- ORT quantiser


@numba.njit(inline="always")
def _roundf(x):
    """C ``roundf``: to nearest, ties away from zero (exact for every float32)."""
    ax = np.abs(x)
    r = np.floor(ax)
    if ax - r >= _F32(0.5):
        r += _F32(1.0)
    return np.copysign(r, x)


@numba.njit(cache=True, parallel=True)
def quantize_blockwise(W, bits, block_size, symmetric, half_scales):
    """ORT's ``MlasQuantizeBlockwise`` on W (K, N) float32, column-wise blocks along K.

    ``half_scales``: W holds float16 values and the scales are stored as float16, as ORT's
    float16 overload does: the zero point comes from the float32 scale, the elements are
    quantised with the stored (float16) one.

    Returns q (N, k_blocks*block_size) uint8 (tail elements 0), scales (N, k_blocks) float32
    (float16 values with ``half_scales``) and zero points (N, k_blocks) uint8
    (2**(bits-1) when ``symmetric``).
    """
    K, N = W.shape
    kb = (K + block_size - 1) // block_size
    qmax = (1 << bits) - 1
    mid = 1 << (bits - 1)
    q = np.zeros((N, kb * block_size), np.uint8)
    scales = np.empty((N, kb), np.float32)
    zps = np.full((N, kb), mid, np.uint8)
    for n in prange(N):
        for b in range(kb):
            k0 = b * block_size
            k1 = min(K, k0 + block_size)
            lo = _FLT_MAX
            hi = -_FLT_MAX
            for k in range(k0, k1):
                v = W[k, n]
                if v < lo:
                    lo = v
                if v > hi:
                    hi = v
            if symmetric:
                m = hi if np.abs(hi) > np.abs(lo) else lo
                s = m / _F32(-mid)
                zf = _F32(mid)
            else:
                lo = min(lo, _F32(0.0))
                hi = max(hi, _F32(0.0))
                s = (hi - lo) / _F32(qmax)
                zf = lo
                if s != _F32(0.0):
                    zf = _F32(0.0) - lo / s
                if zf < _F32(0.0):
                    zf = _F32(0.0)
                elif zf > _F32(qmax):
                    zf = _F32(qmax)
                else:
                    zf = _roundf(zf)
                zps[n, b] = np.uint8(zf)
            if half_scales:
                s = f16_bits_to_f32(f32_to_f16_bits(s))
            scales[n, b] = s
            rs = _F32(1.0) / s if s != _F32(0.0) else _F32(0.0)
            for k in range(k0, k1):
                x = _roundf(W[k, n] * rs + zf)
                if x > _F32(qmax):
                    x = _F32(qmax)
                if not x > _F32(0.0):  # also NaN -> 0
                    x = _F32(0.0)
                q[n, k] = np.uint8(x)
    return q, scales, zps


# --------------------------------------------------------------------------- MatMulNBits


@intrinsic
def _fma(typingctx, a, b, c):
    """``fma(a, b, c)`` with one rounding, for three floats of the same type.

    Used only where the product ``a*b`` is exact (two float32 values widened to float64, or
    small integers in float32), so that the result equals ``c + a*b`` rounded once per
    operation: the accumulation order is unchanged and no fastmath flag is needed.
    """
    if not (isinstance(a, types.Float) and a == b == c):
        return None

    def codegen(context, builder, signature, args):
        ty = context.get_value_type(a)
        fn = builder.module.declare_intrinsic("llvm.fma", [ty], ir.FunctionType(ty, [ty] * 3))
        return builder.call(fn, args)

    return a(a, b, c), codegen


@intrinsic
def _field(typingctx, word, shift, mask):
    """``int32((word >> shift) & mask)`` for uint32 ``word``, ``mask``, ``shift < 32``.

    Numba would widen the uint32 shift to 64 bits; this keeps it in 32-bit vector lanes.
    """
    if not (word == mask == types.uint32 and isinstance(shift, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        w, s, m = args
        s = builder.zext(s, w.type) if s.type.width < 32 else builder.trunc(s, w.type)
        return builder.and_(builder.lshr(w, s), m)

    return types.int32(word, shift, mask), codegen


@intrinsic
def _prefer_512bit_vectors(typingctx):
    """Let LLVM vectorise the calling function with 512-bit registers.

    LLVM defaults to 256-bit vectors on AVX-512 CPUs (``prefer-vector-width``); the kernels'
    column loops run about 1.4x faster with 512.  Harmless where AVX-512 is absent.  The
    attribute is added to llvmlite's attribute set directly, as llvmlite only validates a
    fixed list of attribute names.
    """

    def codegen(context, builder, signature, args):
        attrs = builder.function.attributes
        if isinstance(attrs, set):
            set.add(attrs, '"prefer-vector-width"="512"')
        return context.get_dummy_value()

    return types.none(), codegen


@numba.njit(inline="always")
def _accumulate_block(A, m, k0, kend, wT, T, acc):
    """``acc[m*T + c] += f64(A[m, k0 + j]) * f64(wT[j*T + c])`` for j ascending in
    ``[0, kend)``, fused (the products are exact in float64), four rows per pass over acc."""
    mo = m * T
    j = _U(0)
    while j + _U(4) <= kend:
        a0 = _F64(A[m, k0 + j])
        a1 = _F64(A[m, k0 + j + _U(1)])
        a2 = _F64(A[m, k0 + j + _U(2)])
        a3 = _F64(A[m, k0 + j + _U(3)])
        q0 = j * T
        for c in range(T):
            v = _fma(a0, _F64(wT[q0 + c]), acc[mo + c])
            v = _fma(a1, _F64(wT[q0 + T + c]), v)
            v = _fma(a2, _F64(wT[q0 + _U(2) * T + c]), v)
            acc[mo + c] = _fma(a3, _F64(wT[q0 + _U(3) * T + c]), v)
        j += _U(4)
    for jj in range(j, kend):
        a64 = _F64(A[m, k0 + jj])
        for c in range(T):
            acc[mo + c] = _fma(a64, _F64(wT[jj * T + c]), acc[mo + c])


@numba.njit(cache=True, nogil=True)
def quantize_a(A, block_size):
    """CompInt8 activation quantiser: per row and K-block of A (M, K) float32.

    Returns qa (M, K) float32 holding the int8 values, sa (M, k_blocks) float32 and the
    block sums ``absum = f32(sa * sum(qa))`` (M, k_blocks) float32.  Where ``f32(a * inv)``
    is not finite (``127 / amax`` overflowed: 0 < amax < 127 / FLT_MAX; or an inf or NaN in
    the block) qa is 0, as ONNX Runtime gives (measured: such blocks add 0, or NaN through
    ``sa``).
    """
    M, K = A.shape
    kb = (K + block_size - 1) // block_size
    qa = np.empty((M, K), np.float32)
    sa = np.empty((M, kb), np.float32)
    absum = np.empty((M, kb), np.float32)
    for m in range(M):  # little work: no threads
        for b in range(kb):
            k0 = b * block_size
            k1 = min(K, k0 + block_size)
            amax = _F32(0.0)
            for k in range(k0, k1):
                v = np.abs(A[m, k])
                if v > amax or np.isnan(v):  # a NaN stays: nothing compares greater
                    amax = v
            scale = amax / _F32(127.0)
            inv = _F32(127.0) / amax if amax != _F32(0.0) else _F32(0.0)
            total = _F32(0.0)  # exact: |sum| <= 127 * block_size < 2**24
            for k in range(k0, k1):
                v = np.rint(A[m, k] * inv)
                if not np.isfinite(v):
                    v = _F32(0.0)
                qa[m, k] = v
                total += v
            sa[m, b] = scale
            absum[m, b] = scale * total
    return qa, sa, absum


@numba.njit(cache=True, parallel=True)
def matmul(A, sa, absum, Bw, scales, zpk, zpf, zmode, gidx, bits, block_size, int8, tile, out):
    """Both MatMulNBits paths; output columns in parallel tiles of ``tile`` columns.

    Bw (N, k_blocks, words) is B viewed as 16-bit words; scales (N, G) float32;
    zpk (N, ceil(G*bits/8)) packed uint8 zero points (zmode ZP_PACKED), zpf (N, G) float32
    (zmode ZP_FLOAT); out (M, N) float32.

    Float path (``int8`` False): A (M, K) float32; gidx (K,) the group of each k, or empty
    for ``k // block_size``; out[m, n] = f32(sum over k ascending of f64(A[m, k]) * f64(w)).

    Int8 path (``int8`` True, integer zero points, no gidx): A, sa, absum from
    :func:`quantize_a`; for each block b, ascending,
    acc += f64(f32(sa*sb)) * sum(qa*q) + f64(absum) * f64(f32(-sb*zp)), out = f32(acc).
    The integer sums are exact: float32 partial sums of at most 256 products (< 2**24).

    Each thread owns whole columns, so the order per output does not depend on threading.
    The tile buffers are flat (row r of a buffer starts at r*T) and indices unsigned, which
    keeps the column loops simple enough for LLVM to vectorise; helpers taking arrays are
    avoided in the loops (Numba would reference-count the arrays at every call).
    """
    M, K = A.shape
    N, kb, nw = Bw.shape
    groups = scales.shape[1]
    has_gidx = gidx.shape[0] > 0
    rows = groups if has_gidx else 1  # scale/zero-point rows held per tile
    T = _U(tile)
    bs = _U(block_size)
    ubits = _U(bits)
    qmask = np.uint32((1 << bits) - 1)
    mid = _F32(1 << (bits - 1))
    chunk = _U(_Q_CHUNK)
    fused = M == 1  # one row: unpack, dequantise and accumulate in a single pass
    Bflat = Bw.reshape(N, kb * nw)
    chunk_words = _U(max(1, _GATHER_WORDS // nw) * nw)
    for t in prange((N + tile - 1) // tile):
        _prefer_512bit_vectors()  # here: Numba compiles the loop body as its own function
        n0 = _U(t * tile)
        nt = _U(min(tile, N - t * tile))
        # scale and zero-point terms of the tile's columns, one row per group:
        # w = f32(f32(q - zT) * sT) + cT, i.e. zT = zp, cT = 0 for integer zero points and
        # zT = 0, cT = f32(-s * zp) for float zero points.  With g_idx all groups are
        # filled once; otherwise row 0 is refilled for each block.
        sT = np.zeros(rows * tile, np.float32)
        zT = np.zeros(rows * tile, np.float32)
        cT = np.zeros(rows * tile, np.float32)
        bT = np.zeros((chunk_words + _U(1)) * T, np.uint32)  # words, one row per word
        qT = np.empty(block_size * tile, np.float32)  # elements, one row per k
        isum = np.empty(tile, np.float32)
        isum64 = np.empty(tile, np.float64)
        zs = np.empty(tile, np.float32)
        acc = np.zeros(M * tile, np.float64)
        wb = _U(0)  # first word of the current block in bT
        for blk in range(_U(kb)):
            k0 = blk * bs
            kend = min(bs, _U(K) - k0)
            g0 = _U(0) if has_gidx else blk
            if blk == 0 or not has_gidx:
                for g in range(g0, g0 + _U(rows)):
                    ro = (g - g0) * T
                    off = g * ubits
                    zb = off >> _U(3)
                    zsh = np.uint32(off & _U(7))
                    ztwo = (off & _U(7)) + ubits > _U(8)
                    for c in range(nt):
                        s = scales[n0 + c, g]
                        sT[ro + c] = s
                        if zmode == ZP_FLOAT:
                            cT[ro + c] = -s * zpf[n0 + c, g]
                        elif zmode == ZP_PACKED:
                            v = np.uint32(zpk[n0 + c, zb])
                            if ztwo:
                                v = np.uint32(v | (np.uint32(zpk[n0 + c, zb + _U(1)]) << 8))
                            zT[ro + c] = _F32(_field(v, zsh, qmask))
                        else:
                            zT[ro + c] = mid
            # the words of the next blocks of the T columns side by side, a chunk of each
            # row at a time (few, sequential memory streams)
            if wb == 0:
                count = min(chunk_words, (_U(kb) - blk) * _U(nw))
                for c in range(nt):
                    for i in range(count):
                        bT[i * T + c] = Bflat[n0 + c, blk * _U(nw) + i]
            # element j of every column: int8 path q, float path w = f32(q - zT)*sT + cT;
            # stored in qT, or consumed at once when fused
            for c in range(T):
                isum64[c] = 0.0
            for j0 in range(_U(0), kend, chunk):
                for c in range(T):
                    isum[c] = 0.0
                for j in range(j0, min(kend, j0 + chunk)):
                    off = j * ubits
                    bi = (wb + (off >> _U(4))) * T
                    sh = np.uint32(off & _U(15))
                    if (off & _U(15)) + ubits > _U(16):
                        # crosses into the next word (3, 5, 6, 7 bits): append that word
                        # above this one, which no later element reads
                        for c in range(T):
                            bT[bi + c] |= bT[bi + T + c] << np.uint32(16)
                    ro = ((_U(gidx[k0 + j]) - g0) if has_gidx else _U(0)) * T
                    qj = j * T
                    if int8 and fused:
                        a = A[0, k0 + j]
                        for c in range(T):
                            isum[c] = _fma(a, _F32(_field(bT[bi + c], sh, qmask)), isum[c])
                    elif int8:
                        for c in range(T):
                            qT[qj + c] = _F32(_field(bT[bi + c], sh, qmask))
                    elif fused:
                        a64 = _F64(A[0, k0 + j])
                        for c in range(T):
                            q = _F32(_field(bT[bi + c], sh, qmask))
                            w = (q - zT[ro + c]) * sT[ro + c] + cT[ro + c]
                            acc[c] = _fma(a64, _F64(w), acc[c])
                    else:
                        for c in range(T):
                            q = _F32(_field(bT[bi + c], sh, qmask))
                            qT[qj + c] = (q - zT[ro + c]) * sT[ro + c] + cT[ro + c]
                if int8 and fused:
                    for c in range(T):
                        isum64[c] += _F64(isum[c])
            wb += _U(nw)
            if wb == chunk_words:
                wb = _U(0)
            if int8:
                for c in range(T):
                    zs[c] = -sT[c] * zT[c]
                for m in range(_U(M)):
                    if not fused:
                        # isum = sum of qa*q over the block: exact float32 partial sums of
                        # up to 256 rows (the first row initialises), collected in isum64
                        for j0 in range(_U(0), kend, chunk):
                            j1 = min(kend, j0 + chunk)
                            a = A[m, k0 + j0]
                            for c in range(T):
                                isum[c] = a * qT[j0 * T + c]
                            j = j0 + _U(1)
                            while j + _U(4) <= j1:  # four rows per pass over isum
                                a0 = A[m, k0 + j]
                                a1 = A[m, k0 + j + _U(1)]
                                a2 = A[m, k0 + j + _U(2)]
                                a3 = A[m, k0 + j + _U(3)]
                                q0 = j * T
                                for c in range(T):
                                    v = _fma(a0, qT[q0 + c], isum[c])
                                    v = _fma(a1, qT[q0 + T + c], v)
                                    v = _fma(a2, qT[q0 + _U(2) * T + c], v)
                                    isum[c] = _fma(a3, qT[q0 + _U(3) * T + c], v)
                                j += _U(4)
                            for jj in range(j, j1):
                                a = A[m, k0 + jj]
                                for c in range(T):
                                    isum[c] = _fma(a, qT[jj * T + c], isum[c])
                            if j0 == 0:
                                for c in range(T):
                                    isum64[c] = _F64(isum[c])
                            else:
                                for c in range(T):
                                    isum64[c] += _F64(isum[c])
                    s_a = sa[m, blk]
                    bsum = _F64(absum[m, blk])
                    mo = m * T
                    for c in range(T):
                        acc[mo + c] += _F64(s_a * sT[c]) * isum64[c] + bsum * _F64(zs[c])
            elif not fused:
                for m in range(_U(M)):
                    _accumulate_block(A, m, k0, kend, qT, T, acc)
        for m in range(_U(M)):
            for c in range(nt):
                out[m, n0 + c] = _F32(acc[m * T + c])


# --------------------------------------------------------------------------- SIMD vectors
# The packed kernels below are written with explicit 512-bit vectors: a Numba type whose
# values are LLVM vectors, and intrinsics that emit the plain LLVM vector instructions
# (loads, stores, lane-wise arithmetic, conversions, shuffles).  LLVM keeps such values in
# registers and lowers them to whatever the CPU has (two 256-bit halves without AVX-512).
# Each operation is one IEEE operation per lane (no fastmath, no contraction), so the
# kernels state their arithmetic exactly.  The CPU-specific parts are chosen by the tier of
# the compiling target (dot_tier): the int8 dot product (AVX512-VNNI vpdpbusd, AVX-512BW or
# AVX2 pmaddubsw / pmaddwd, or plain IR: exact integer operations, so the same bits), the
# width of the in-register transposes, and how many rows of accumulators stay in registers.


class _Vec(types.Type):
    """A 512-bit vector of ``count`` lanes of the Numba scalar type ``dtype``."""

    def __init__(self, dtype, count):
        self.dtype = dtype
        self.count = count
        super().__init__(name=f"qaccel.vec({dtype}x{count})")


_I32X16 = _Vec(types.int32, 16)
_F32X16 = _Vec(types.float32, 16)
_F64X8 = _Vec(types.float64, 8)
# the vector type that loads from / stores to an array of each dtype
_LANES = {
    types.uint32: _I32X16,
    types.int32: _I32X16,
    types.float32: _F32X16,
    types.float64: _F64X8,
}


@register_model(_Vec)
class _VecModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        lane = dmm.lookup(fe_type.dtype).get_value_type()
        super().__init__(dmm, fe_type, ir.VectorType(lane, fe_type.count))


def _mask(indices):
    return ir.Constant(ir.VectorType(ir.IntType(32), len(indices)), list(indices))


def _broadcast(builder, value, count):
    vty = ir.VectorType(value.type, count)
    vec = builder.insert_element(ir.Constant(vty, None), value, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(vec, vec, _mask([0] * count))


def _pointer(context, builder, sig, args, pointee):
    """Pointer to element ``args[1]`` (flat) of the C-contiguous array ``args[0]``."""
    data = context.make_array(sig.args[0])(context, builder, args[0]).data
    index = context.cast(builder, args[1], sig.args[1], types.intp)
    return builder.bitcast(builder.gep(data, [index]), pointee.as_pointer())


def _contiguous(arr):
    return isinstance(arr, types.Array) and arr.layout == "C"


@intrinsic
def _vload(typingctx, arr, i):
    """The vector at flat element ``i`` of a C-contiguous array (no bounds check)."""
    if not (_contiguous(arr) and arr.dtype in _LANES and isinstance(i, types.Integer)):
        return None
    vec = _LANES[arr.dtype]

    def codegen(context, builder, sig, args):
        ptr = _pointer(context, builder, sig, args, context.get_value_type(vec))
        return builder.load(ptr, align=4)

    return vec(arr, i), codegen


@intrinsic
def _vstore(typingctx, arr, i, v):
    """Store vector ``v`` at flat element ``i`` of a C-contiguous array (no bounds check)."""
    if not (_contiguous(arr) and _LANES.get(arr.dtype) == v and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ptr = _pointer(context, builder, sig, args, args[2].type)
        builder.store(args[2], ptr, align=4)
        return context.get_dummy_value()

    return types.none(arr, i, v), codegen


@intrinsic
def _scalar(typingctx, arr, i):
    """``arr.flat[i]`` of a C-contiguous array, without Numba's negative-index fix-up."""
    if not (_contiguous(arr) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ptr = _pointer(context, builder, sig, args, context.get_data_type(sig.args[0].dtype))
        return context.unpack_value(builder, sig.args[0].dtype, ptr)

    return arr.dtype(arr, i), codegen


def _splat_intrinsic(vec):
    def splat(typingctx, x):
        if not isinstance(x, (types.Integer, types.Float)):
            return None

        def codegen(context, builder, sig, args):
            lane = context.cast(builder, args[0], sig.args[0], vec.dtype)
            return _broadcast(builder, lane, vec.count)

        return vec(x), codegen

    return intrinsic(splat)


_splat_i32 = _splat_intrinsic(_I32X16)  # the scalar converted as Numba converts, in every lane
_splat_f32 = _splat_intrinsic(_F32X16)
_splat_f64 = _splat_intrinsic(_F64X8)


def _binary_intrinsic(int_op, float_op):
    def op(typingctx, x, y):
        if not (isinstance(x, _Vec) and x == y):
            return None
        name = float_op if isinstance(x.dtype, types.Float) else int_op
        if name is None:
            return None

        def codegen(context, builder, sig, args):
            return getattr(builder, name)(*args)

        return x(x, y), codegen

    return intrinsic(op)


_vadd = _binary_intrinsic("add", "fadd")  # integer lanes wrap around
_vsub = _binary_intrinsic("sub", "fsub")
_vmul = _binary_intrinsic("mul", "fmul")
_vand = _binary_intrinsic("and_", None)


@intrinsic
def _vneg(typingctx, x):
    """``-x`` lane-wise (sign flip, exact)."""
    if not (isinstance(x, _Vec) and isinstance(x.dtype, types.Float)):
        return None

    def codegen(context, builder, sig, args):
        return builder.fneg(args[0])

    return x(x), codegen


@intrinsic
def _vshr(typingctx, x, shift):
    """Logical shift right of int32 lanes by ``shift`` (0..31) bits."""
    if not (x == _I32X16 and isinstance(shift, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        s = context.cast(builder, args[1], sig.args[1], types.int32)
        return builder.lshr(args[0], _broadcast(builder, s, 16))

    return x(x, shift), codegen


@intrinsic
def _vfma(typingctx, a, b, c):
    """``a * b + c`` lane-wise with one rounding (used where ``a * b`` is exact)."""
    if not (isinstance(a, _Vec) and a == b == c and isinstance(a.dtype, types.Float)):
        return None

    def codegen(context, builder, sig, args):
        ty = args[0].type
        name = f"llvm.fma.v{a.count}f{a.dtype.bitwidth}"
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ty, [ty] * 3), name)
        return builder.call(fn, args)

    return a(a, b, c), codegen


@intrinsic
def _to_f32(typingctx, x):
    """int32 lanes to float32 (exact for |x| <= 2**24, which is all that is converted)."""
    if x != _I32X16:
        return None

    def codegen(context, builder, sig, args):
        return builder.sitofp(args[0], ir.VectorType(ir.FloatType(), 16))

    return _F32X16(x), codegen


def _half_intrinsic(high):
    def half(typingctx, x):
        if x not in (_I32X16, _F32X16):
            return None

        def codegen(context, builder, sig, args):
            part = builder.shuffle_vector(args[0], args[0], _mask(range(8 * high, 8 * high + 8)))
            f64x8 = ir.VectorType(ir.DoubleType(), 8)
            if sig.args[0] == _F32X16:
                return builder.fpext(part, f64x8)
            return builder.sitofp(part, f64x8)

        return _F64X8(x), codegen

    return intrinsic(half)


_lo_f64 = _half_intrinsic(0)  # lanes 0..7 of 16 int32/float32 lanes, exactly as float64
_hi_f64 = _half_intrinsic(1)  # lanes 8..15


@intrinsic
def _round_f32(typingctx, lo, hi):
    """16 float64 lanes (lo, hi) rounded to float32 (round to nearest even)."""
    if not (lo == hi == _F64X8):
        return None

    def codegen(context, builder, sig, args):
        f32x8 = ir.VectorType(ir.FloatType(), 8)
        a, b = (builder.fptrunc(v, f32x8) for v in args)
        return builder.shuffle_vector(a, b, _mask(range(16)))

    return _F32X16(lo, hi), codegen


def _dpbusd_generic(builder, acc, u, s):
    """``vpdpbusd`` in plain LLVM IR: widened products summed in groups of four."""
    wide = ir.VectorType(ir.IntType(32), 64)
    b8 = ir.VectorType(ir.IntType(8), 64)
    p = builder.mul(
        builder.zext(builder.bitcast(u, b8), wide), builder.sext(builder.bitcast(s, b8), wide)
    )
    g = [builder.shuffle_vector(p, p, _mask(range(j, 64, 4))) for j in range(4)]
    return builder.add(acc, builder.add(builder.add(g[0], g[1]), builder.add(g[2], g[3])))


#: The int8 dot-product tiers, best first.
DOT_TIERS = ("vnni", "avx512bw", "avx2", "plain")

_PROBES = {  # tier -> (LLVM IR, what its assembly holds when the target has the tier)
    "avx512bw": ("define <64 x i8> @p(<64 x i8> %a, <64 x i8> %b) {\n"
                 "  %r = add <64 x i8> %a, %b\n  ret <64 x i8> %r\n}", "vpaddb\t%zmm"),
    "avx2": ("define <8 x i32> @p(<8 x i32> %a, <8 x i32> %b) {\n"
             "  %r = add <8 x i32> %a, %b\n  ret <8 x i32> %r\n}", "vpaddd\t%ymm"),
    # with AVX512-VNNI, LLVM folds the add into vpdpwssd (asked for only with AVX-512BW)
    "vnni": ("declare <16 x i32> @llvm.x86.avx512.pmaddw.d.512(<32 x i16>, <32 x i16>)\n"
             "define <16 x i32> @p(<16 x i32> %c, <32 x i16> %a, <32 x i16> %b) {\n"
             "  %m = call <16 x i32> @llvm.x86.avx512.pmaddw.d.512(<32 x i16> %a, <32 x i16> %b)\n"
             "  %r = add <16 x i32> %c, %m\n  ret <16 x i32> %r\n}", "vpdpwssd"),
}
_tiers: dict[int, str] = {}


def _compiles_to(tm, ir_text, marker):
    module = llvm.parse_assembly(f'target triple = "{tm.triple}"\n{ir_text}')
    module.verify()
    return marker in tm.emit_assembly(module)


def dot_tier(context) -> str:
    """The dot-product tier (DOT_TIERS) of the CPU that ``context`` compiles for.

    Read off the code LLVM generates for that target (tiny probes), so it is right whether
    Numba was given the target's features or only its name (``NUMBA_CPU_NAME`` with
    ``NUMBA_CPU_FEATURES`` empty), and on any CPU llvmlite can name."""
    tm = context.codegen()._tm
    if id(tm) not in _tiers:
        tier = "plain"
        if "x86" in tm.triple or "i686" in tm.triple:
            if _compiles_to(tm, *_PROBES["avx512bw"]):
                tier = "vnni" if _compiles_to(tm, *_PROBES["vnni"]) else "avx512bw"
            elif _compiles_to(tm, *_PROBES["avx2"]):
                tier = "avx2"
        _tiers[id(tm)] = tier
    return _tiers[id(tm)]


def _has_avx512(context) -> bool:
    """Whether ``context``'s target has AVX-512: 32 vector registers of 512 bits (AVX2 has 16
    of 256)."""
    return dot_tier(context) in ("vnni", "avx512bw")


def _x86_pairs(builder, tier, name, a, b, lanes_in, out_lanes):
    """An x86 pairwise multiply-add (``pmaddubsw`` / ``pmaddwd``) on 512-bit operands: the
    AVX-512BW instruction, or two AVX2 ones on the 256-bit halves (``tier`` avx2)."""
    bits_in = 512 // lanes_in
    out_ty = ir.VectorType(ir.IntType(512 // out_lanes), out_lanes)
    if tier != "avx2":
        fn = builder.module.declare_intrinsic(
            f"llvm.x86.avx512.{name[0]}.512", (), ir.FunctionType(out_ty, [a.type, b.type]))
        return builder.call(fn, [a, b])
    half_in = ir.VectorType(ir.IntType(bits_in), lanes_in // 2)
    half_out = ir.VectorType(out_ty.element, out_lanes // 2)
    fn = builder.module.declare_intrinsic(
        f"llvm.x86.avx2.{name[1]}", (), ir.FunctionType(half_out, [half_in, half_in]))
    halves = []
    for h in range(2):
        sel = _mask(range(h * lanes_in // 2, (h + 1) * lanes_in // 2))
        halves.append(builder.call(fn, [builder.shuffle_vector(a, a, sel),
                                        builder.shuffle_vector(b, b, sel)]))
    return builder.shuffle_vector(halves[0], halves[1], _mask(range(out_lanes)))


_PMADDUBSW = ("pmaddubs.w", "pmadd.ub.sw")  # u8 x s8 pairs -> i16 (saturating)
_PMADDWD = ("pmaddw.d", "pmadd.wd")  # i16 x i16 pairs -> i32


def _dpbusd_madd(builder, tier, acc, u, s, small):
    """``vpdpbusd`` from the pairwise multiply-adds of AVX2 / AVX-512BW, exactly.

    ``small`` (every byte of u below 128): ``pmaddubsw`` then ``pmaddwd`` by ones, its pair
    sums at most 2 * 127 * 128 < 2**15, so nothing saturates.  Otherwise the even and the odd
    bytes are widened to 16 bits in place (u zero-, s sign-extended) and go through two
    ``pmaddwd``."""
    i8x64 = ir.VectorType(ir.IntType(8), 64)
    i16x32 = ir.VectorType(ir.IntType(16), 32)
    if small:
        pairs = _x86_pairs(builder, tier, _PMADDUBSW, builder.bitcast(u, i8x64),
                           builder.bitcast(s, i8x64), 64, 32)
        ones = ir.Constant(i16x32, [1] * 32)
        return builder.add(acc, _x86_pairs(builder, tier, _PMADDWD, pairs, ones, 32, 16))
    u16, s16 = builder.bitcast(u, i16x32), builder.bitcast(s, i16x32)
    eight = ir.Constant(i16x32, [8] * 32)
    even_u = builder.and_(u16, ir.Constant(i16x32, [0xFF] * 32))
    odd_u = builder.lshr(u16, eight)
    even_s = builder.ashr(builder.shl(s16, eight), eight)
    odd_s = builder.ashr(s16, eight)
    even = _x86_pairs(builder, tier, _PMADDWD, even_u, even_s, 32, 16)
    odd = _x86_pairs(builder, tier, _PMADDWD, odd_u, odd_s, 32, 16)
    return builder.add(acc, builder.add(even, odd))


def _dpbusd_intrinsic(tier, small):
    def dpbusd(typingctx, acc, u, s):
        if not (acc == u == s == _I32X16):
            return None

        def codegen(context, builder, sig, args):
            t = dot_tier(context) if tier is None else tier
            if t == "vnni":
                ty = args[0].type
                fn = builder.module.declare_intrinsic(
                    "llvm.x86.avx512.vpdpbusd.512", (), ir.FunctionType(ty, [ty] * 3)
                )
                return builder.call(fn, args)
            if t == "plain":
                return _dpbusd_generic(builder, *args)
            return _dpbusd_madd(builder, t, *args, small)

        return _I32X16(acc, u, s), codegen

    return intrinsic(dpbusd)


# acc + sum over each group of 4 bytes of zext(u byte) * sext(s byte), per int32 lane
# (AVX512-VNNI vpdpbusd; exact, wrapping like int32), with the instructions of the compile
# target's tier (DOT_TIERS); _dpbusd_small only for u bytes below 128.  The fixed variants
# (DOT_VARIANTS[tier, small]) are for tests.
_dpbusd = _dpbusd_intrinsic(None, False)
_dpbusd_small = _dpbusd_intrinsic(None, True)
DOT_VARIANTS = {(t, small): _dpbusd_intrinsic(t, small) for t in DOT_TIERS
                for small in (False, True)}


@intrinsic
def _avx512(typingctx):
    """:func:`_has_avx512` of the compile target, as a constant (a kernel keeps half as many
    accumulators in registers without it)."""

    def codegen(context, builder, sig, args):
        return ir.Constant(ir.IntType(1), _has_avx512(context))

    return types.boolean(), codegen


def _transpose_ir(builder, rows):
    """Transpose n vectors of n lanes (n a power of two): log2(n) stages, each swapping one
    bit of the row index with the same bit of the lane index."""
    n = len(rows)
    for b in range(n.bit_length() - 1):
        step = 1 << b
        lo = [c if not c & step else n + c - step for c in range(n)]
        hi = [c + step if not c & step else n + c for c in range(n)]
        new = list(rows)
        for r in range(n):
            if not r & step:
                new[r] = builder.shuffle_vector(rows[r], rows[r + step], _mask(lo))
                new[r + step] = builder.shuffle_vector(rows[r], rows[r + step], _mask(hi))
        rows = new
    return rows


@intrinsic
def _transpose16(typingctx, src, soff, stride, dst, doff):
    """``dst.flat[doff + 16*i + j] = src.flat[soff + stride*j + i]`` for i, j < 16.

    Both arrays C-contiguous with 4-byte elements (moved as bits).  With AVX-512 one 16x16
    transpose in 512-bit registers; otherwise four 8x8 ones in 256-bit registers (AVX2 has
    no cheap shuffle across 512 bits), which move the same bits."""
    ok = all(_contiguous(a) and a.dtype.bitwidth == 32 for a in (src, dst))
    if not (ok and all(isinstance(v, types.Integer) for v in (soff, stride, doff))):
        return None

    def codegen(context, builder, sig, args):
        n = 16 if _has_avx512(context) else 8  # lanes per register
        vty = ir.VectorType(ir.IntType(32), n)
        intp = context.get_value_type(types.intp)
        s_arr = context.make_array(sig.args[0])(context, builder, args[0]).data
        d_arr = context.make_array(sig.args[3])(context, builder, args[3]).data
        soff_, stride_, doff_ = (
            context.cast(builder, args[k], sig.args[k], types.intp) for k in (1, 2, 4)
        )

        def at(arr, index):
            return builder.bitcast(builder.gep(arr, [index]), vty.as_pointer())

        for r0 in range(0, 16, n):  # the n x n sub-block of source rows r0.., lanes c0..
            for c0 in range(0, 16, n):
                rows = []
                for j in range(r0, r0 + n):
                    idx = builder.add(soff_, builder.mul(stride_, ir.Constant(intp, j)))
                    idx = builder.add(idx, ir.Constant(intp, c0))
                    rows.append(builder.load(at(s_arr, idx), align=4))
                for i, row in enumerate(_transpose_ir(builder, rows)):
                    idx = builder.add(doff_, ir.Constant(intp, 16 * (c0 + i) + r0))
                    builder.store(row, at(d_arr, idx), align=4)
        return context.get_dummy_value()

    return types.none(src, soff, stride, dst, doff), codegen


@intrinsic
def _prefetch(typingctx, arr, i):
    """Prefetch the cache line of flat element ``i`` of a C-contiguous array into L2."""
    if not (_contiguous(arr) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ptr = _pointer(context, builder, sig, args, ir.IntType(8))
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        # read, locality 2 (prefetcht1), data cache
        builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 2), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.none(arr, i), codegen


# --------------------------------------------------------------------------- packed kernels
# Weights in column tiles: TILE columns side by side (one vector of 16 int32/float32 lanes),
# the k-th 32-bit word of each column's packed bit stream together:
#   W[w*TILE + c]  word w of column n0 + c (elements w*32/wbits ..., element e at bits
#                  [e*wbits, (e+1)*wbits), wbits = 2, 4 or 8; LSB-first as in B),
#   S[b*TILE + c]  the scale of block b, float32,
#   Z[w*TILE + c]  word w of the packed zero points (same layout; ZP_PACKED),
#   C[b*TILE + c]  the float zero point of block b (ZP_FLOAT).
# Prepared weights hold these tiles (:func:`tile_columns`); the per-call kernel builds them
# for the few tiles of a work item at a time (in-register 16x16 transposes, into a scratch
# buffer that stays in cache), so B is read once and not laid out again in memory.  Missing
# columns of the last tile are zero and not stored.

TILE = 16
PREFETCH_WORDS = 128  # how far ahead in each row _tile_columns prefetches (512 bytes)
PREFETCH_TILE_WORDS = 32  # how far ahead the kernels prefetch a prepared tile's words (2 KB)


@numba.njit(inline="always")
def _byte_mask(wbits):
    """The mask of one ``wbits``-bit element in each byte of a word, as int32."""
    m = (1 << wbits) - 1
    return np.int32(np.uint32((m | m << 8 | m << 16 | m << 24) & 0xFFFFFFFF))


@numba.njit
def _tile_columns(src, n0, nt, dst, doff, nnext):
    """``dst[doff + w*TILE + c] = src[n0 + c, w]`` for c < nt, 0 for nt <= c < TILE.

    Full tiles go through in-register 16x16 transposes, with the rows read PREFETCH_WORDS
    ahead (continuing into the first ``nnext`` rows of the next tile): the 16 rows are 16
    memory streams, which the hardware prefetchers alone follow too slowly."""
    nw = src.shape[1]
    w = 0
    if nt == TILE:
        while w + TILE <= nw:
            ahead = w + PREFETCH_WORDS
            if ahead < nw:
                for c in range(TILE):
                    _prefetch(src, (n0 + c) * nw + ahead)
            elif ahead - nw < nw:
                for c in range(nnext):
                    _prefetch(src, (n0 + TILE + c) * nw + ahead - nw)
            _transpose16(src, n0 * nw + w, nw, dst, doff + w * TILE)
            w += TILE
    for ww in range(w, nw):
        for c in range(TILE):
            if c < nt:
                dst[doff + ww * TILE + c] = src[n0 + c, ww]
            else:
                dst[doff + ww * TILE + c] = 0


@numba.njit(cache=True)
def tile_columns(src):
    """(N, nw) array of 4-byte elements -> (ceil(N/TILE), nw, TILE) column tiles, zero-padded."""
    N, nw = src.shape
    ntiles = (N + TILE - 1) // TILE
    out = np.empty((ntiles, nw, TILE), src.dtype)
    flat = out.reshape(-1)
    for t in range(ntiles):
        _tile_columns(src, t * TILE, min(TILE, N - t * TILE), flat, t * nw * TILE, 0)
    return out


@numba.njit(inline="always")
def _block_zero_point(Z, zo, C, co, s, blk, zmode, wbits, mid):
    """The tile's (z, c) of block ``blk``: ``w = f32(f32(q - z) * s) + c``.

    Integer zero points: z = zp, c = 0; float zero points: z = 0, c = f32(-s * zp)."""
    if zmode == ZP_PACKED:
        off = blk * wbits
        word = _vload(Z, zo + (off >> 5) * TILE)
        z = _to_f32(_vand(_vshr(word, off & 31), _splat_i32((1 << wbits) - 1)))
        c = _splat_f32(0.0)
    elif zmode == ZP_FLOAT:
        z = _splat_f32(0.0)
        c = _vmul(_vneg(s), _vload(C, co + blk * TILE))
    else:
        z = _splat_f32(mid)
        c = _splat_f32(0.0)
    return z, c


@numba.njit(inline="always")
def _store_row(out, m, n0, nt, lo, hi, tmp):
    """``out[m, n0:n0+nt] = f32`` of the lanes (lo, hi) of a tile's accumulator."""
    if nt == TILE:
        _vstore(out, m * out.shape[1] + n0, _round_f32(lo, hi))
    else:
        _vstore(tmp, 0, lo)
        _vstore(tmp, 8, hi)
        for c in range(nt):
            out[m, n0 + c] = _F32(tmp[c])


@numba.njit(inline="always")
def _word_dot(isum, x, QD, qd, wbits, bmask, small):
    """``isum`` plus, per column, the products of the elements of weight word ``x`` with the
    activation words ``QD.flat[qd:qd + 8//wbits]``: one vpdpbusd per ``8 // wbits``
    elements (the element bytes of each word, ``(x >> r*wbits) & bmask``).  ``small``: every
    weight code is below 128 (bits < 8), which lets AVX2 / AVX-512BW take ``pmaddubsw``."""
    if wbits == 4:
        isum = _dpbusd_small(isum, _vand(x, bmask), _splat_i32(_scalar(QD, qd)))
        return _dpbusd_small(isum, _vand(_vshr(x, 4), bmask), _splat_i32(_scalar(QD, qd + 1)))
    if wbits == 8:
        if small:
            return _dpbusd_small(isum, x, _splat_i32(_scalar(QD, qd)))
        return _dpbusd(isum, x, _splat_i32(_scalar(QD, qd)))
    for r in range(8 // wbits):
        q = _vand(_vshr(x, r * wbits), bmask)
        isum = _dpbusd_small(isum, q, _splat_i32(_scalar(QD, qd + r)))
    return isum


@numba.njit(inline="always")
def _block_term(acc0, acc1, xs, isum, bsum, zs0, zs1, exact):
    """``acc + (f64(xs) * f64(isum) + bsum * zs)`` on the lanes 0..7 (acc0, zs0) and 8..15.

    Both products are exact (float32 x float32; xs x isum when ``exact``, |isum| < 2**29),
    so the sum of the two is rounded once, by one fma when ``exact``."""
    if exact:
        t0 = _vfma(_lo_f64(xs), _lo_f64(isum), _vmul(bsum, zs0))
        t1 = _vfma(_hi_f64(xs), _hi_f64(isum), _vmul(bsum, zs1))
    else:
        t0 = _vadd(_vmul(_lo_f64(xs), _lo_f64(isum)), _vmul(bsum, zs0))
        t1 = _vadd(_vmul(_hi_f64(xs), _hi_f64(isum)), _vmul(bsum, zs1))
    return _vadd(acc0, t0), _vadd(acc1, t1)


@numba.njit
def _tile_int8_rows(
    QD, sa, absum, m, R, W, wo, S, so, Z, zo, C, co, zmode, wbits, mid, kb, wpb, pf, po
):
    """Int8 path of rows ``m .. m+R`` of A (R = 1 or 4) on a tile, accumulators in registers.

    QD (M, nq) holds the activation words: int32 ``QD[m, (b*wpb + w)*P + r]`` packs, byte
    j, the qa that meets element ``r + j*P`` of byte j of word w of block b (``P = 8 //
    wbits``); one vpdpbusd per (word, r) adds the four products of each column, exactly.
    Then, per block in order, the block term of :func:`matmul`.  Returns the R rows' float64
    sums (lanes 0..7, 8..15 of each row; rows past R are zero).
    """
    nq = QD.shape[1]
    P = 8 // wbits
    bmask = _splat_i32(_byte_mask(wbits))
    exact = wpb * (32 // wbits) <= 16384  # block_size: 127 * 255 * 16384 < 2**29
    small = mid < 128  # bits < 8: every weight code below 128
    zero = _splat_f64(0.0)
    a0 = a1 = b0 = b1 = c0 = c1 = d0 = d1 = zero
    for blk in range(kb):
        i0 = i1 = i2 = i3 = _splat_i32(0)
        for w in range(wpb):
            _prefetch(pf, po + (blk * wpb + w) * TILE)
            x = _vload(W, wo + (blk * wpb + w) * TILE)
            qd = m * nq + (blk * wpb + w) * P
            i0 = _word_dot(i0, x, QD, qd, wbits, bmask, small)
            if R == 4:  # the element bytes of x are computed once for all four rows
                i1 = _word_dot(i1, x, QD, qd + nq, wbits, bmask, small)
                i2 = _word_dot(i2, x, QD, qd + 2 * nq, wbits, bmask, small)
                i3 = _word_dot(i3, x, QD, qd + 3 * nq, wbits, bmask, small)
        s = _vload(S, so + blk * TILE)
        z, _ = _block_zero_point(Z, zo, C, co, s, blk, zmode, wbits, mid)
        zs = _vmul(_vneg(s), z)
        zs0 = _lo_f64(zs)
        zs1 = _hi_f64(zs)
        ka = sa.shape[1]
        o = m * ka + blk
        xs = _vmul(_splat_f32(_scalar(sa, o)), s)
        a0, a1 = _block_term(a0, a1, xs, i0, _splat_f64(_scalar(absum, o)), zs0, zs1, exact)
        if R == 4:
            xs = _vmul(_splat_f32(_scalar(sa, o + ka)), s)
            bsum = _splat_f64(_scalar(absum, o + ka))
            b0, b1 = _block_term(b0, b1, xs, i1, bsum, zs0, zs1, exact)
            xs = _vmul(_splat_f32(_scalar(sa, o + 2 * ka)), s)
            bsum = _splat_f64(_scalar(absum, o + 2 * ka))
            c0, c1 = _block_term(c0, c1, xs, i2, bsum, zs0, zs1, exact)
            xs = _vmul(_splat_f32(_scalar(sa, o + 3 * ka)), s)
            bsum = _splat_f64(_scalar(absum, o + 3 * ka))
            d0, d1 = _block_term(d0, d1, xs, i3, bsum, zs0, zs1, exact)
    return a0, a1, b0, b1, c0, c1, d0, d1


@numba.njit(inline="always")
def _fma_element(acc0, acc1, x, shift, qmask, z, s, c, has_c, a):
    """Dequantise the element at ``shift`` of each column's word ``x`` and add its product
    with ``a`` (float64, broadcast): ``acc += a * f64(f32(f32(q - z) * s) + c)``, fused.

    Without float zero points (``has_c`` False) c is +0.0 and not added: that only turns a
    product -0.0 into +0.0, and an accumulator that starts at +0.0 never becomes -0.0, so
    ``acc + a*(-0.0)`` and ``acc + a*(+0.0)`` are the same (and NaN for infinite a)."""
    wv = _vmul(_vsub(_to_f32(_vand(_vshr(x, shift), qmask)), z), s)
    if has_c:
        wv = _vadd(wv, c)
    return _vfma(a, _lo_f64(wv), acc0), _vfma(a, _hi_f64(wv), acc1)


@numba.njit
def _tile_float_row(
    A64, m, G, W, wo, S, so, Z, zo, C, co, steps, zmode, wbits, mid, K, bs, kb, pf, po, po1
):
    """Float path of row m of A on G = 1 or 2 tiles (the second one's data ``steps`` after
    the first's): unpack, dequantise and accumulate in one pass, the accumulators in
    registers.  ``acc += f64(a) * f64(w)`` fused (exact products), k ascending: a chain of
    dependent fmas per column, so two tiles side by side keep twice as many in flight.
    Returns the float64 sums (lanes 0..7, 8..15 of the first tile, then of the second)."""
    epw = 32 // wbits
    wpb = bs * wbits // 32
    qmask = _splat_i32((1 << wbits) - 1)
    has_c = zmode == ZP_FLOAT
    w1, s1, z1, c1 = wo + steps[0], so + steps[1], zo + steps[2], co + steps[3]
    acc0 = acc1 = acc2 = acc3 = _splat_f64(0.0)
    for blk in range(kb):
        k0 = blk * bs
        kend = min(bs, K - k0)
        s = _vload(S, so + blk * TILE)
        z, c = _block_zero_point(Z, zo, C, co, s, blk, zmode, wbits, mid)
        t = _vload(S, s1 + blk * TILE) if G == 2 else s
        y, d = _block_zero_point(Z, z1, C, c1, t, blk, zmode, wbits, mid) if G == 2 else (z, c)
        for w in range(wpb):
            j0 = w * epw
            if j0 >= kend:
                break
            _prefetch(pf, po + (blk * wpb + w) * TILE)
            x = _vload(W, wo + (blk * wpb + w) * TILE)
            if G == 2:
                _prefetch(pf, po1 + (blk * wpb + w) * TILE)
            x1 = _vload(W, w1 + (blk * wpb + w) * TILE) if G == 2 else x
            ka = m * K + k0 + j0
            if wbits == 4 and j0 + 8 <= kend:  # unrolled: constant shifts
                for e in range(8):
                    a = _splat_f64(_scalar(A64, ka + e))
                    acc0, acc1 = _fma_element(acc0, acc1, x, 4 * e, qmask, z, s, c, has_c, a)
                    if G == 2:
                        acc2, acc3 = _fma_element(acc2, acc3, x1, 4 * e, qmask, y, t, d, has_c, a)
            else:
                for e in range(min(epw, kend - j0)):
                    a = _splat_f64(_scalar(A64, ka + e))
                    sh = e * wbits
                    acc0, acc1 = _fma_element(acc0, acc1, x, sh, qmask, z, s, c, has_c, a)
                    if G == 2:
                        acc2, acc3 = _fma_element(acc2, acc3, x1, sh, qmask, y, t, d, has_c, a)
    return acc0, acc1, acc2, acc3


@numba.njit
def _tile_float_rows(
    A64, W, wo, S, so, Z, zo, C, co, zmode, wbits, mid, K, bs, kb, wpb, acc, wb, pf, po
):
    """Float path of all M rows of A on a tile; ``acc`` (M*TILE) float64 in memory.

    Each block is dequantised once to float64 (``wb``), then accumulated into four rows at a
    time with the 8 accumulators in registers; per row and column the same fused
    ``acc += f64(a) * f64(w)``, k ascending, as :func:`_tile_float_row`.
    """
    M = A64.shape[0]
    epw = 32 // wbits
    qmask = _splat_i32((1 << wbits) - 1)
    has_c = zmode == ZP_FLOAT
    for blk in range(kb):
        k0 = blk * bs
        kend = min(bs, K - k0)
        s = _vload(S, so + blk * TILE)
        z, c = _block_zero_point(Z, zo, C, co, s, blk, zmode, wbits, mid)
        for w in range(wpb):
            j0 = w * epw
            if j0 >= kend:
                break
            _prefetch(pf, po + (blk * wpb + w) * TILE)
            x = _vload(W, wo + (blk * wpb + w) * TILE)
            for e in range(min(epw, kend - j0)):
                q = _to_f32(_vand(_vshr(x, e * wbits), qmask))
                wv = _vmul(_vsub(q, z), s)
                if has_c:  # else c = +0.0, not added (see _fma_element)
                    wv = _vadd(wv, c)
                _vstore(wb, (j0 + e) * TILE, _lo_f64(wv))
                _vstore(wb, (j0 + e) * TILE + 8, _hi_f64(wv))
        m = 0
        rows = 4 if _avx512() else 2  # the accumulators (4 per 2 rows) stay in registers
        while m + rows <= M:
            r0 = m * TILE
            p0 = _vload(acc, r0)
            p1 = _vload(acc, r0 + 8)
            p2 = _vload(acc, r0 + 16)
            p3 = _vload(acc, r0 + 24)
            p4 = p5 = p6 = p7 = p0
            if rows == 4:
                p4 = _vload(acc, r0 + 32)
                p5 = _vload(acc, r0 + 40)
                p6 = _vload(acc, r0 + 48)
                p7 = _vload(acc, r0 + 56)
            ka = m * K + k0
            for j in range(kend):
                w0 = _vload(wb, j * TILE)
                w1 = _vload(wb, j * TILE + 8)
                a = _splat_f64(_scalar(A64, ka + j))
                p0 = _vfma(a, w0, p0)
                p1 = _vfma(a, w1, p1)
                a = _splat_f64(_scalar(A64, ka + K + j))
                p2 = _vfma(a, w0, p2)
                p3 = _vfma(a, w1, p3)
                if rows == 4:
                    a = _splat_f64(_scalar(A64, ka + 2 * K + j))
                    p4 = _vfma(a, w0, p4)
                    p5 = _vfma(a, w1, p5)
                    a = _splat_f64(_scalar(A64, ka + 3 * K + j))
                    p6 = _vfma(a, w0, p6)
                    p7 = _vfma(a, w1, p7)
            _vstore(acc, r0, p0)
            _vstore(acc, r0 + 8, p1)
            _vstore(acc, r0 + 16, p2)
            _vstore(acc, r0 + 24, p3)
            if rows == 4:
                _vstore(acc, r0 + 32, p4)
                _vstore(acc, r0 + 40, p5)
                _vstore(acc, r0 + 48, p6)
                _vstore(acc, r0 + 56, p7)
            m += rows
        while m < M:
            p0 = _vload(acc, m * TILE)
            p1 = _vload(acc, m * TILE + 8)
            ka = m * K + k0
            for j in range(kend):
                a = _splat_f64(_scalar(A64, ka + j))
                p0 = _vfma(a, _vload(wb, j * TILE), p0)
                p1 = _vfma(a, _vload(wb, j * TILE + 8), p1)
            _vstore(acc, m * TILE, p0)
            _vstore(acc, m * TILE + 8, p1)
            m += 1


@numba.njit(inline="always")
def _shifted(offsets, steps, g):
    """The four offsets of tile g: ``offsets + g * steps``."""
    return (
        offsets[0] + g * steps[0],
        offsets[1] + g * steps[1],
        offsets[2] + g * steps[2],
        offsets[3] + g * steps[3],
    )


@numba.njit
def _tiles(
    A64, QD, sa, absum, arrays, offsets, steps, G, zmode, wbits, bits, bs, K, int8, out, n0,
    pf, pbase, pstep,
):
    """Output columns from ``n0`` on, for all rows, from G consecutive tiles: the arrays (W,
    S, Z, C) of tile g start at ``offsets + g * steps`` (flat element offsets).

    While tile g is computed, the words ``pf.flat[pbase + g*pstep ...]`` that follow (one
    cache line of TILE words per word of the tile's columns) are prefetched: further along
    the prepared tiles, or B's rows of the next work item in the per-call kernel."""
    W, S, Z, C = arrays
    M, N = out.shape
    kb = (K + bs - 1) // bs
    wpb = bs * wbits // 32
    mid = _F32(1 << (bits - 1))
    tmp = np.empty(TILE, np.float64)
    if not int8 and M == 1:
        g = 0
        while g < G:
            two = 2 if g + 2 <= G else 1
            wo, so, zo, co = _shifted(offsets, steps, g)
            r = _tile_float_row(
                A64, 0, two, W, wo, S, so, Z, zo, C, co, steps, zmode, wbits, mid, K, bs, kb,
                pf, pbase + g * pstep, pbase + (g + 1) * pstep,
            )
            for i in range(two):
                c0 = n0 + (g + i) * TILE
                _store_row(out, 0, c0, min(TILE, N - c0), r[2 * i], r[2 * i + 1], tmp)
            g += two
        return
    acc = np.empty(M * TILE if not int8 else 0, np.float64)
    wb = np.empty(bs * TILE if not int8 else 0, np.float64)
    for g in range(G):
        wo, so, zo, co = _shifted(offsets, steps, g)
        c0 = n0 + g * TILE
        nt = min(TILE, N - c0)
        if int8:
            m = 0
            while m < M:
                R = 4 if m + 4 <= M else 1
                r = _tile_int8_rows(
                    QD, sa, absum, m, R, W, wo, S, so, Z, zo, C, co, zmode, wbits, mid, kb, wpb,
                    pf, pbase + g * pstep,
                )
                for i in range(R):
                    _store_row(out, m + i, c0, nt, r[2 * i], r[2 * i + 1], tmp)
                m += R
        else:
            acc[:] = 0.0
            _tile_float_rows(
                A64, W, wo, S, so, Z, zo, C, co, zmode, wbits, mid, K, bs, kb, wpb, acc, wb,
                pf, pbase + g * pstep,
            )
            for m in range(M):
                lo, hi = _vload(acc, m * TILE), _vload(acc, m * TILE + 8)
                _store_row(out, m, c0, nt, lo, hi, tmp)


# The two kernels compute the output columns of the work items they claim, TILES_PER_ITEM
# tiles each, with the GIL released (:func:`.quant_kernels.run_items` runs them on several
# threads).

TILES_PER_ITEM = 4


@numba.njit(cache=True, nogil=True)
def matmul_packed(items, A64, QD, sa, absum, B, S, Z, C, zmode, wbits, bits, bs, K, int8, out):
    """Both MatMulNBits paths (no g_idx; bits 2, 4, 8) straight from the operator's layout.

    B (N, nw) uint32: each column's packed blocks as 32-bit words (B's bytes); S (N, k_blocks)
    float32 scales; Z (N, nz) uint32 packed zero points as words (ZP_PACKED, else (N, 0));
    C (N, k_blocks) float32 zero points (ZP_FLOAT, else (N, 0)); out (M, N) float32.
    Work item i: the columns of tiles ``[i, i+1) * TILES_PER_ITEM`` (TILE columns each).

    Float path (``int8`` False): A64 (M, K) float64, A widened; out[m, n] = f32(sum over k
    ascending of f64(A[m, k]) * f64(w)), w = f32(f32(q - z) * s) + c (see
    :func:`_block_zero_point`), each product added with one rounding (fma of exact products).

    Int8 path (``int8`` True, finite A, integer zero points, bs <= 65536): QD the activation
    words of :func:`_tile_int8_rows` (M, nw*8/wbits) int32; sa, absum (M, k_blocks) from
    :func:`quantize_a`; for each block b, ascending,
    acc += f64(f32(sa*s)) * isum + f64(absum) * f64(f32(-s*z)), isum = sum(qa*q) exact
    int32; out = f32(acc).  Bit for bit what :func:`matmul` computes.

    Each tile is laid out as :func:`tile_columns` does, one at a time (in-register
    transposes), then computed; the order per output does not depend on tiling or threads.
    A thread claims its next item when it starts one, and prefetches that item's rows of B
    while it computes (a line per word of each tile's columns).
    """
    N, nw = B.shape
    kb = S.shape[1]
    ntiles = (N + TILE - 1) // TILE
    steps = (nw * TILE, kb * TILE, Z.shape[1] * TILE, C.shape[1] * TILE)
    G = TILES_PER_ITEM
    arrays = (
        np.empty(G * steps[0], np.uint32),
        np.empty(G * steps[1], np.float32),
        np.empty(G * steps[2], np.uint32),
        np.empty(G * steps[3], np.float32),
    )
    W, St, Zt, Ct = arrays
    i = next_item(items)
    while i < items[2]:
        t0 = i * G
        t1 = min(ntiles, t0 + G)
        # claimed now: its rows of B are prefetched meanwhile (past the end of B when there is
        # none, which is harmless: a prefetch never faults)
        following = next_item(items)
        for t in range(t0, t1):
            n0 = t * TILE
            nt = min(TILE, N - n0)
            nn = min(TILE, N - n0 - TILE)  # the next tile's rows are prefetched
            g = t - t0
            _tile_columns(B, n0, nt, W, g * steps[0], nn)
            _tile_columns(S, n0, nt, St, g * steps[1], nn)
            _tile_columns(Z, n0, nt, Zt, g * steps[2], 0)
            _tile_columns(C, n0, nt, Ct, g * steps[3], 0)
        offsets = (0, 0, 0, 0)
        _tiles(
            A64,
            QD,
            sa,
            absum,
            arrays,
            offsets,
            steps,
            t1 - t0,
            zmode,
            wbits,
            bits,
            bs,
            K,
            int8,
            out,
            t0 * TILE,
            B,
            following * G * TILE * nw,
            TILE * nw,
        )
        item_done(items)
        i = following


@numba.njit(cache=True, nogil=True)
def matmul_tiles(items, A64, QD, sa, absum, W, S, Z, C, zmode, wbits, bits, bs, K, int8, out):
    """:func:`matmul_packed` on prepared column tiles (:func:`tile_columns` of its B, S, Z,
    C: (ntiles, nw, TILE) and so on), bit for bit the same."""
    ntiles = W.shape[0]
    arrays = (W.reshape(-1), S.reshape(-1), Z.reshape(-1), C.reshape(-1))
    steps = (W.shape[1] * TILE, S.shape[1] * TILE, Z.shape[1] * TILE, C.shape[1] * TILE)
    i = next_item(items)
    while i < items[2]:
        t0 = i * TILES_PER_ITEM
        G = min(ntiles, t0 + TILES_PER_ITEM) - t0
        offsets = (t0 * steps[0], t0 * steps[1], t0 * steps[2], t0 * steps[3])
        _tiles(
            A64,
            QD,
            sa,
            absum,
            arrays,
            offsets,
            steps,
            G,
            zmode,
            wbits,
            bits,
            bs,
            K,
            int8,
            out,
            t0 * TILE,
            arrays[0],
            offsets[0] + PREFETCH_TILE_WORDS * TILE,
            steps[0],
        )
        item_done(items)
        i = next_item(items)
