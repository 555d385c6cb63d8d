"""Numba kernels behind :mod:`qaccel.model.nbits` (MatMulNBits and ORT's block quantiser).

Arguments are validated by the public functions in ``nbits.py``; the kernels trust their
inputs (shapes, dtypes, contiguity, value ranges).  Each kernel has a slow NumPy twin in
``tests/model/naive_nbits.py``.

Hot loops index with unsigned integers (``_U``): Numba then skips negative-index wraparound,
which otherwise keeps LLVM from vectorising the column loops.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.extending import intrinsic

_U = np.uintp
_F32 = np.float32
_F64 = np.float64
_FLT_MAX = _F32(np.finfo(np.float32).max)
_Q_CHUNK = 256  # rows per exact float32 integer partial sum: 256*127*255 < 2**24
_GATHER_WORDS = 32  # words of B read per column at a time (64 bytes)

ZP_DEFAULT, ZP_PACKED, ZP_FLOAT = 0, 1, 2


# --------------------------------------------------------------------------- bit streams


@numba.njit(cache=True, inline="always")
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


@numba.njit(cache=True, inline="always")
def _roundf(x):
    """C ``roundf``: to nearest, ties away from zero (exact for every float32)."""
    ax = np.abs(x)
    r = np.floor(ax)
    if ax - r >= _F32(0.5):
        r += _F32(1.0)
    return np.copysign(r, x)


@numba.njit(cache=True, parallel=True)
def quantize_blockwise(W, bits, block_size, symmetric):
    """ORT's ``MlasQuantizeBlockwise`` on W (K, N) float32, column-wise blocks along K.

    Returns q (N, k_blocks*block_size) uint8 (tail elements 0), scales (N, k_blocks) float32
    and zero points (N, k_blocks) uint8 (2**(bits-1) when ``symmetric``).
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
def _madd32(typingctx, a, b, c):
    """``int32(a * b + c)`` for three int32, in 32-bit lanes (Numba would widen to int64).

    Used only where no intermediate overflows, so the result is the exact integer.
    """
    if not (a == b == c == types.int32):
        return None

    def codegen(context, builder, signature, args):
        x, y, z = args
        return builder.add(builder.mul(x, y), z)

    return types.int32(a, b, c), codegen


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


@numba.njit(cache=True, inline="always")
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


@numba.njit(cache=True, parallel=True)
def quantize_a(A, block_size):
    """CompInt8 activation quantiser: per row and K-block of A (M, K) float32.

    Returns qa (M, K) float32 holding the int8 values, sa (M, k_blocks) float32 and the
    block sums ``absum = f32(sa * sum(qa))`` (M, k_blocks) float32.
    """
    M, K = A.shape
    kb = (K + block_size - 1) // block_size
    qa = np.empty((M, K), np.float32)
    sa = np.empty((M, kb), np.float32)
    absum = np.empty((M, kb), np.float32)
    for m in prange(M):
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


@numba.njit(cache=True, parallel=True)
def matmul_int8_row(qp, sa, absum, B, scales, zpk, zmode, bits, block_size, out):
    """Int8 path for a single row of A and bits 2, 4 or 8, without transposing B.

    Same result as :func:`matmul` bit for bit: each column's block sums ``sum(qa*q)`` are
    exact int32 dot products taken straight from its packed bytes, and the block terms are
    accumulated in the same order.  ``qp`` holds qa as int8, zero-padded to whole blocks and
    permuted so that it runs along the bytes of a block once per element position in a byte:
    ``qp[(b*P + p)*blob + i] = qa[b*block_size + i*P + p]`` with ``P = 8 // bits``.
    """
    N, kb, blob = B.shape
    P = _U(8 // bits)
    ubits = _U(bits)
    qmask = np.int32((1 << bits) - 1)
    mid = _F32(1 << (bits - 1))
    ublob = _U(blob)
    for n in prange(N):
        acc = 0.0
        for blk in range(_U(kb)):
            isum = np.int32(0)
            for p in range(P):
                sh = p * ubits
                base = (blk * P + p) * ublob
                for i in range(ublob):
                    q = (np.int32(B[n, blk, i]) >> sh) & qmask
                    isum = np.int32(isum + np.int32(np.int32(qp[base + i]) * q))
            s = scales[n, blk]
            if zmode == ZP_PACKED:
                off = blk * ubits
                z = _F32((np.int32(zpk[n, off >> _U(3)]) >> (off & _U(7))) & qmask)
            else:
                z = mid
            t1 = _F64(sa[0, blk] * s) * _F64(isum)
            acc += t1 + _F64(absum[0, blk]) * _F64(-s * z)
        out[0, n] = _F32(acc)


# --------------------------------------------------------------------------- prepared weights


@numba.njit(cache=True, parallel=True)
def prepare_tiles(Bw, scales, zpk, zpf, zmode, bits, K, tile):
    """Unpack B once into column tiles for :func:`matmul_prepared_float` and ``_int8``.

    Returns qT (tiles, K, tile) uint8, the element k of column ``t*tile + c`` at
    ``qT[t, k, c]``, and the per-block terms (tiles, k_blocks, tile) float32 of
    :func:`matmul`: sT = s, zT = zp (float zero points: 0), cT = f32(-s * zp) for float
    zero points (else 0), and zs = f32(-sT * zT) for the int8 path.  Columns past N are 0.
    """
    N, kb, nw = Bw.shape
    block_size = nw * 16 // bits
    ntiles = (N + tile - 1) // tile
    qmask = np.uint32((1 << bits) - 1)
    mid = _F32(1 << (bits - 1))
    qT = np.zeros((ntiles, K, tile), np.uint8)
    sT = np.zeros((ntiles, kb, tile), np.float32)
    zT = np.zeros((ntiles, kb, tile), np.float32)
    cT = np.zeros((ntiles, kb, tile), np.float32)
    zs = np.zeros((ntiles, kb, tile), np.float32)
    B8 = Bw.view(np.uint8)
    for t in prange(ntiles):
        n0 = t * tile
        nt = min(tile, N - n0)
        for c in range(nt):
            n = n0 + c
            for k in range(K):
                blk = k // block_size
                off = (k - blk * block_size) * bits
                i = off >> 3
                v = np.uint32(B8[n, blk, i])
                if (off & 7) + bits > 8:
                    v = np.uint32(v | (np.uint32(B8[n, blk, i + 1]) << np.uint32(8)))
                qT[t, k, c] = np.uint8(_field(v, np.uint32(off & 7), qmask))
            for g in range(kb):
                s = scales[n, g]
                sT[t, g, c] = s
                if zmode == ZP_FLOAT:
                    cT[t, g, c] = -s * zpf[n, g]
                elif zmode == ZP_PACKED:
                    off = g * bits
                    zb = off >> 3
                    v = np.uint32(zpk[n, zb])
                    if (off & 7) + bits > 8:
                        v = np.uint32(v | (np.uint32(zpk[n, zb + 1]) << np.uint32(8)))
                    zT[t, g, c] = _F32(_field(v, np.uint32(off & 7), qmask))
                else:
                    zT[t, g, c] = mid
                zs[t, g, c] = -sT[t, g, c] * zT[t, g, c]
    return qT, sT, zT, cT, zs


@numba.njit(cache=True, parallel=True)
def matmul_prepared_float(A, qT, sT, zT, cT, block_size, N, out):
    """Float path of :func:`matmul` (no g_idx) on the tiles of :func:`prepare_tiles`.

    out[m, n] = f32(sum over k ascending of f64(A[m, k]) * f64(w)), w = f32(f32(q - zT)*sT)
    + cT, exactly the expressions and order of :func:`matmul`.
    """
    M, K = A.shape
    ntiles, _, tile = qT.shape
    kb = sT.shape[1]
    T = _U(tile)
    bs = _U(block_size)
    for t in prange(ntiles):
        _prefer_512bit_vectors()
        n0 = _U(t * tile)
        nt = _U(min(tile, N - t * tile))
        q = qT[t].reshape(K * tile)
        s = sT[t].reshape(kb * tile)
        z = zT[t].reshape(kb * tile)
        cc = cT[t].reshape(kb * tile)
        acc = np.zeros(M * tile, np.float64)
        wT = np.empty(block_size * tile, np.float32)
        for blk in range(_U(kb)):
            k0 = blk * bs
            kend = min(bs, _U(K) - k0)
            go = blk * T
            if M == 1:
                for j in range(kend):
                    a64 = _F64(A[0, k0 + j])
                    qo = (k0 + j) * T
                    for c in range(T):
                        w = (_F32(q[qo + c]) - z[go + c]) * s[go + c] + cc[go + c]
                        acc[c] = _fma(a64, _F64(w), acc[c])
                continue
            for j in range(kend):
                qo = (k0 + j) * T
                wo = j * T
                for c in range(T):
                    wT[wo + c] = (_F32(q[qo + c]) - z[go + c]) * s[go + c] + cc[go + c]
            for m in range(_U(M)):
                _accumulate_block(A, m, k0, kend, wT, T, acc)
        for m in range(_U(M)):
            for c in range(nt):
                out[m, n0 + c] = _F32(acc[m * T + c])


@numba.njit(cache=True, parallel=True)
def matmul_prepared_int8(qa, qaf, sa, absum, qT, sT, zs, block_size, N, out):
    """Int8 path of :func:`matmul` on the tiles of :func:`prepare_tiles`.

    qa (M, K) int32 and qaf (M, K) float32: the finite int8 values of :func:`quantize_a`;
    the block sums
    ``sum(qa*q)`` are exact int32 sums (block_size <= 65536), equal to the exact float sums
    of :func:`matmul`; the block terms are accumulated with the same expression and order.
    """
    M, K = qa.shape
    ntiles, _, tile = qT.shape
    kb = sT.shape[1]
    T = _U(tile)
    bs = _U(block_size)
    for t in prange(ntiles):
        _prefer_512bit_vectors()
        n0 = _U(t * tile)
        nt = _U(min(tile, N - t * tile))
        q = qT[t].reshape(K * tile)
        s = sT[t].reshape(kb * tile)
        zz = zs[t].reshape(kb * tile)
        acc = np.zeros(M * tile, np.float64)
        isum = np.empty(tile, np.int32)
        small = block_size <= _Q_CHUNK
        qb = np.empty(block_size * tile if M > 1 and not small else 0, np.int32)
        qf = np.empty(block_size * tile if M > 1 and small else 0, np.float32)
        isf = np.empty(tile, np.float32)
        for blk in range(_U(kb)):
            k0 = blk * bs
            kend = min(bs, _U(K) - k0)
            go = blk * T
            if M == 1:
                for c in range(T):
                    isum[c] = 0
                j = _U(0)
                while j + _U(2) <= kend:
                    a0 = qa[0, k0 + j]
                    a1 = qa[0, k0 + j + _U(1)]
                    qo = (k0 + j) * T
                    for c in range(T):
                        v = _madd32(a0, np.int32(q[qo + c]), isum[c])
                        isum[c] = _madd32(a1, np.int32(q[qo + T + c]), v)
                    j += _U(2)
                if j < kend:
                    a0 = qa[0, k0 + j]
                    qo = (k0 + j) * T
                    for c in range(T):
                        isum[c] = _madd32(a0, np.int32(q[qo + c]), isum[c])
            elif small:  # the block widened once to float32, then reused by every row
                for j in range(kend):
                    qo = (k0 + j) * T
                    for c in range(T):
                        qf[j * T + c] = _F32(q[qo + c])
            else:  # the block widened once, then reused by every row
                for j in range(kend):
                    qo = (k0 + j) * T
                    for c in range(T):
                        qb[j * T + c] = np.int32(q[qo + c])
            for m in range(_U(M)):
                if M != 1 and small:
                    # exact float32 sums: |sum| <= 256 * 127 * 255 < 2**24
                    for c in range(T):
                        isf[c] = 0.0
                    j = _U(0)
                    while j + _U(4) <= kend:
                        a0 = qaf[m, k0 + j]
                        a1 = qaf[m, k0 + j + _U(1)]
                        a2 = qaf[m, k0 + j + _U(2)]
                        a3 = qaf[m, k0 + j + _U(3)]
                        q0 = j * T
                        for c in range(T):
                            v = _fma(a0, qf[q0 + c], isf[c])
                            v = _fma(a1, qf[q0 + T + c], v)
                            v = _fma(a2, qf[q0 + _U(2) * T + c], v)
                            isf[c] = _fma(a3, qf[q0 + _U(3) * T + c], v)
                        j += _U(4)
                    for jj in range(j, kend):
                        a0 = qaf[m, k0 + jj]
                        for c in range(T):
                            isf[c] = _fma(a0, qf[jj * T + c], isf[c])
                    for c in range(T):
                        isum[c] = np.int32(isf[c])
                elif M != 1:
                    for c in range(T):
                        isum[c] = 0
                    j = _U(0)
                    while j + _U(4) <= kend:
                        a0 = qa[m, k0 + j]
                        a1 = qa[m, k0 + j + _U(1)]
                        a2 = qa[m, k0 + j + _U(2)]
                        a3 = qa[m, k0 + j + _U(3)]
                        q0 = j * T
                        for c in range(T):
                            v = _madd32(a0, qb[q0 + c], isum[c])
                            v = _madd32(a1, qb[q0 + T + c], v)
                            v = _madd32(a2, qb[q0 + _U(2) * T + c], v)
                            isum[c] = _madd32(a3, qb[q0 + _U(3) * T + c], v)
                        j += _U(4)
                    for jj in range(j, kend):
                        a0 = qa[m, k0 + jj]
                        for c in range(T):
                            isum[c] = _madd32(a0, qb[jj * T + c], isum[c])
                s_a = sa[m, blk]
                bsum = _F64(absum[m, blk])
                mo = m * T
                for c in range(T):
                    acc[mo + c] += _F64(s_a * s[go + c]) * _F64(isum[c]) + bsum * _F64(zz[go + c])
        for m in range(_U(M)):
            for c in range(nt):
                out[m, n0 + c] = _F32(acc[m * T + c])
