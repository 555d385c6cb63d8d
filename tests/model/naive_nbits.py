"""Slow, obviously correct NumPy twins of the kernels in ``model/nbits_kernels.py``.

Used only by the tests.  Each function follows the written definition (SEMANTICS.md section 3
and the docstrings of ``model/nbits.py``) element by element, with no tiling and no tricks.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32


def pack_bits(values, bits):
    """(..., count) elements -> (..., ceil(count*bits/8)) uint8, LSB-first bit stream."""
    v = np.asarray(values, dtype=np.uint64)
    count = v.shape[-1]
    nbytes = (count * bits + 7) // 8
    planes = (v[..., None] >> np.arange(bits, dtype=np.uint64)) & 1  # (..., count, bits)
    stream = planes.reshape(*v.shape[:-1], count * bits).astype(np.uint8)
    stream = np.concatenate(
        [stream, np.zeros((*v.shape[:-1], 8 * nbytes - count * bits), np.uint8)], axis=-1
    )
    return np.packbits(stream, axis=-1, bitorder="little")


def unpack_bits(packed, bits, count):
    """(..., nbytes) uint8 -> (..., count) uint8, element j = bits [j*bits, (j+1)*bits)."""
    p = np.asarray(packed, dtype=np.uint8)
    stream = np.unpackbits(p, axis=-1, bitorder="little")[..., : count * bits]
    planes = stream.reshape(*p.shape[:-1], count, bits).astype(np.uint32)
    return (planes << np.arange(bits, dtype=np.uint32)).sum(-1).astype(np.uint8)


def roundf(x):
    """Round half away from zero."""
    x = np.asarray(x, dtype=np.float64)
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def quantize_blockwise(W, bits, block_size, symmetric, half_scales=False):
    """ORT's block quantiser, one block at a time.  Returns q (N, kb*bs), scales, zps (N, kb).

    ``half_scales``: the scales stored as float16 (ORT's float16 overload), the zero point from
    the float32 scale, the elements quantised with the stored one."""
    K, N = W.shape
    kb = -(-K // block_size)
    qmax, mid = 2**bits - 1, 2 ** (bits - 1)
    q = np.zeros((N, kb * block_size), np.uint8)
    scales = np.zeros((N, kb), F32)
    zps = np.full((N, kb), mid, np.uint8)
    for n in range(N):
        for b in range(kb):
            blk = W[b * block_size : (b + 1) * block_size, n].astype(F32)
            if symmetric:
                hi, lo = blk.max(), blk.min()
                m = hi if abs(hi) > abs(lo) else lo
                s = F32(m) / F32(-mid)
                z = mid
            else:
                lo, hi = min(blk.min(), F32(0)), max(blk.max(), F32(0))
                s = F32(F32(hi - lo) / F32(qmax))
                zf = F32(F32(0) - F32(lo / s)) if s != 0 else F32(lo)
                z = int(np.clip(roundf(zf), 0, qmax))
                zps[n, b] = z
            if half_scales:
                s = F32(np.float16(s))
            scales[n, b] = s
            rs = F32(F32(1) / s) if s != 0 else F32(0)
            x = F32(blk * rs) + F32(z)  # two float32 roundings, as without FMA
            q[n, b * block_size : b * block_size + len(blk)] = np.clip(roundf(x), 0, qmax)
    return q, scales, zps


def dequantize(B, scales, zero_points, g_idx, K, N, bits, block_size):
    """W^T (N, K) float32 by the element-wise formulas."""
    kb = -(-K // block_size)
    q = unpack_bits(B, bits, block_size).reshape(N, kb * block_size)[:, :K].astype(np.int64)
    g = np.arange(K) // block_size if g_idx is None else np.asarray(g_idx)
    s = np.asarray(scales, dtype=F32).reshape(N, kb)[:, g]
    if zero_points is None:
        return (q - 2 ** (bits - 1)).astype(F32) * s
    zp = np.asarray(zero_points)
    if zp.dtype == np.uint8:
        z = unpack_bits(zp.reshape(N, -1), bits, kb)[:, g].astype(np.int64)
        return (q - z).astype(F32) * s
    zf = zp.astype(F32).reshape(N, kb)[:, g]
    return F32(q.astype(F32) * s) + F32(-s * zf)


def matmul_f64(A, Wt):
    """y[m, n] = f32(sum over k ascending of f64(a) * f64(w)), one k at a time."""
    A64, W64 = np.asarray(A, np.float64), np.asarray(Wt, np.float64)
    acc = np.zeros((A64.shape[0], W64.shape[0]))
    for k in range(A64.shape[1]):
        acc += A64[:, k : k + 1] * W64[None, :, k]
    return acc.astype(F32)


def quantize_a(A, block_size):
    """Per row and block: amax, sa = f32(amax/127), inv = f32(127/amax), qa = rint(f32(a*inv)),
    0 where that is not finite."""
    M, K = A.shape
    kb = -(-K // block_size)
    qa = np.zeros((M, K), F32)
    sa = np.zeros((M, kb), F32)
    for m in range(M):
        for b in range(kb):
            sl = slice(b * block_size, min(K, (b + 1) * block_size))
            amax = F32(np.abs(A[m, sl]).max())
            sa[m, b] = amax / F32(127)
            inv = F32(127) / amax if amax != 0 else F32(0)
            with np.errstate(invalid="ignore", over="ignore"):
                v = np.rint(F32(A[m, sl] * inv))
            qa[m, sl] = np.where(np.isfinite(v), v, 0)  # ORT: inv overflowed, or inf/NaN
    return qa, sa


def matmul_int8(A, B, scales, zero_points, K, N, bits, block_size):
    """The CompInt8 emulation: exact integer block sums, per-block terms in f64, blocks in order."""
    kb = -(-K // block_size)
    qa, sa = quantize_a(np.asarray(A, F32), block_size)
    q = unpack_bits(B, bits, block_size).reshape(N, kb * block_size)[:, :K].astype(np.int64)
    if zero_points is None:
        z = np.full((N, kb), 2 ** (bits - 1), np.int64)
    else:
        z = unpack_bits(np.asarray(zero_points).reshape(N, -1), bits, kb).astype(np.int64)
    s = np.asarray(scales, F32).reshape(N, kb)
    qa_i = qa.astype(np.int64)
    acc = np.zeros((A.shape[0], N))
    for b in range(kb):
        sl = slice(b * block_size, min(K, (b + 1) * block_size))
        isum = qa_i[:, sl] @ q[:, sl].T  # exact
        asum = qa_i[:, sl].sum(1).astype(F32)
        t1 = (sa[:, b : b + 1] * s[None, :, b]).astype(np.float64) * isum
        bsum = F32(sa[:, b] * asum).astype(np.float64)[:, None]
        zterm = F32(-s[:, b] * z[:, b].astype(F32)).astype(np.float64)[None, :]
        acc += t1 + bsum * zterm
    return acc.astype(F32)


def matmul_nbits(
    A,
    B,
    scales,
    zero_points=None,
    g_idx=None,
    bias=None,
    *,
    K,
    N,
    bits,
    block_size,
    accuracy_level=0,
):
    """The whole operator: path choice, dtype handling and bias as documented."""
    A = np.asarray(A)
    a2 = A.reshape(-1, K).astype(F32)
    zp = None if zero_points is None else np.asarray(zero_points)
    int_zp = zp is None or zp.dtype == np.uint8
    if accuracy_level == 4 and int_zp and g_idx is None:
        y = matmul_int8(a2, B, scales, zp, K, N, bits, block_size)
    else:
        y = matmul_f64(a2, dequantize(B, scales, zp, g_idx, K, N, bits, block_size))
    if bias is not None:
        y = y + np.asarray(bias).astype(F32)
    return y.astype(A.dtype).reshape(*A.shape[:-1], N)
