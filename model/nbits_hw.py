"""MatMulNBits in the engine's order: what the RTL MatMulNBits engine computes, bit for bit.

:func:`qaccel.model.nbits.matmul_nbits` fixes one order for every output (a float64 sum,
rounded once), which is what a CPU can afford.  The engine accumulates in float32 with
``simd`` lanes per output column and pipelined adders, so its sums are rounded in a
different, equally fixed, order.  :func:`matmul_nbits_hw` reproduces that order from the
:class:`~qaccel.model.config.AccelConfig` (``simd``, ``partial_sums``), so that the
cocotb scoreboard can demand bit-exact equality with the RTL; against ONNX Runtime and the
golden model it agrees within ``1e-6 * sum_k |a_k w_k|`` (tested).

Every operation below is one IEEE float32 operation, rounded to nearest even (``f32(...)``);
integers are exact.  ``L = config.partial_sums``, ``S = config.simd``.

Weights (both paths)
    ``w = f32(q - zp) * s`` (integer or absent zero point, default ``2**(bits-1)``) or
    ``w = f32(q * s) + f32(-s * zp)`` (float zero point): ORT's dequantisation, exactly as
    :func:`~qaccel.model.nbits.dequantize_nbits` computes it.

Float path (accuracy_level 0..3; level 4 with float zero points or g_idx)
    Products ``p_k = f32(a_k * w_k)``.  Element ``k`` goes to lane ``j = k % S`` and, within
    the lane, to partial sum ``r = (k // S) % L`` (a pipelined adder takes a new operand every
    cycle by cycling through ``L`` partial sums).  Each partial sum starts at
    +0 and adds its products in ascending ``k``; elements past K add nothing.  A lane's total
    is ``((P[0] + P[1]) + P[2]) ...``; the lanes are then summed pairwise, level by level
    (``T[2i] + T[2i+1]``), into ``y``.

Int8 path (accuracy_level 4, integer or absent zero points, no g_idx)
    A is quantised per row and K-block exactly as the golden model does it (``sa = f32(amax /
    127)``, ``qa = RNE(f32(a * f32(127 / amax)))``, 0 where not finite).  For each block
    ``b``: ``isum = sum(qa * q)`` over the raw weights and ``asum = sum(qa)`` (exact), then
    the block term ``t_b = f32(f32(f32(sa * sb) * isum) + f32(f32(sa * asum) * f32(-sb *
    zp)))``.  Block ``b`` is added to partial sum ``b % L`` (each starts at +0, blocks
    ascending), and ``y = ((P[0] + P[1]) + P[2]) ...``.

g_idx (float path)
    The engine reads blocks in order, so :func:`gidx_operands` first lays K out group by
    group: the elements of group 0, ascending ``k``, padded to whole blocks, then group 1, ...
    (empty groups take no block). Each new block carries its group's scale and zero point;
    a padding slot has ``a = +0`` and code 0 (it adds ``f32(+0 * w)``, which changes nothing
    unless ``w`` is inf or NaN). The float path then runs on that layout.

Then ``y = f32(y + bias)``, rounded to A's type (float16 / bfloat16 A are widened to float32,
exactly, and the result rounded at the end).
"""

from __future__ import annotations

import numpy as np

from . import nbits_kernels as _k
from .config import ZERO_POINTS, AccelConfig, int8_path
from .nbits import (
    _A_DTYPES,
    _check_A,
    _Op,
    dequantize_nbits,
    pack_nbits,
    pack_zero_points,
    unpack_nbits,
    unpack_zero_points,
)
from .validate import as_array, check_int, check_shape

__all__ = ["accumulate_terms", "gidx_operands", "int8_block_terms", "int8_path", "matmul_nbits_hw",
           "matmul_nbits_v2"]

_F32 = np.float32


def _fold(partials: np.ndarray) -> np.ndarray:
    """``((P[..., 0] + P[..., 1]) + P[..., 2]) ...`` in float32."""
    total = partials[..., 0]
    for r in range(1, partials.shape[-1]):
        total = total + partials[..., r]
    return total


def _float_path(a: np.ndarray, w: np.ndarray, simd: int, lat: int) -> np.ndarray:
    """a (M, K), w (N, K) float32 -> (M, N) float32 in the float path's order."""
    M, K = a.shape
    N = w.shape[0]
    acc = np.zeros((M, N, simd, lat), _F32)
    with np.errstate(all="ignore"):
        for t in range(-(-K // simd)):
            k0, k1 = t * simd, min(K, (t + 1) * simd)
            p = a[:, None, k0:k1] * w[None, :, k0:k1]          # (M, N, lanes), float32
            acc[:, :, : k1 - k0, t % lat] += p
        lanes = _fold(acc)                                      # (M, N, simd)
        while lanes.shape[-1] > 1:
            lanes = lanes[..., 0::2] + lanes[..., 1::2]
    return lanes[..., 0]


def _int8_operands(a: np.ndarray, op: _Op):
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


def _int8_path(a: np.ndarray, op: _Op, lat: int) -> np.ndarray:
    """a (M, K) float32 -> (M, N) float32 in the int8 path's order."""
    qa, q, sa, zp = _int8_operands(a, op)
    M, N, kb = a.shape[0], op.N, op.kb
    zp = zp.astype(_F32)
    sb = op.scales                                                      # (N, kb) float32
    acc = np.zeros((M, N, lat), _F32)
    with np.errstate(all="ignore"):
        for b in range(kb):
            isum = qa[:, b, :] @ q[:, b, :].T                            # (M, N), exact
            asum = qa[:, b, :].sum(axis=1)                               # (M,), exact
            scale = sa[:, b, None] * sb[None, :, b]                      # f32(sa * sb)
            t1 = scale * isum.astype(_F32)                               # |isum| < 2**24
            t2 = (sa[:, b] * asum.astype(_F32))[:, None] * (-sb[:, b] * zp[:, b])[None, :]
            acc[:, :, b % lat] += t1 + t2
        return _fold(acc)


def int8_block_terms(a: np.ndarray, op: _Op) -> np.ndarray:
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


def matmul_nbits_v2(A, B, scales, zero_points=None, g_idx=None, bias=None, *, K, N, bits,
                    block_size, accuracy_level=4):
    """MatMulNBits as the v2 engine computes it (docs/matmul_nbits_v2.md, section 1), bit for
    bit: integer block sums with the zero point applied in the integer domain, one float32
    term per (row, column, block), accumulated after the bias in block order.

    Arguments as :func:`qaccel.model.nbits.matmul_nbits`. Only the int8 path exists so far
    (accuracy_level 4, integer or absent zero points, no g_idx): other calls raise
    ValueError naming the argument. This function becomes :func:`matmul_nbits_hw` when the
    v2 engine replaces v1.
    """
    level = check_int("accuracy_level", accuracy_level, 0, 4)
    a = _check_A(A, check_int("K", K, 1))
    op = _Op(B, scales, zero_points, g_idx, K=K, N=N, bits=bits, block_size=block_size,
             dtype=a.dtype)
    if not int8_path(level, float_zero_points=op.zmode == _k.ZP_FLOAT,
                     g_idx=op.gidx is not None):
        raise ValueError(f"the v2 engine's float path is not built yet: accuracy_level "
                         f"{level}, zero points {ZERO_POINTS[op.zmode]}, g_idx "
                         f"{op.gidx is not None} need accuracy_level 4, integer or no zero "
                         f"points and no g_idx")
    b = _check_bias(bias, a.dtype, op.N)
    y = accumulate_terms(int8_block_terms(a.reshape(-1, op.K).astype(_F32), op), b)
    return y.astype(a.dtype).reshape(*a.shape[:-1], op.N)


def gidx_operands(a: np.ndarray, op: _Op):
    """The g_idx layout (see the module notes) of validated operands: ``a`` (M, K) in A's
    type and ``op`` (with ``op.gidx``) -> ``(A, B, scales, zero_points, K)`` without g_idx,
    ``K`` a whole number of blocks, for the engine's float path."""
    bs, bits, N = op.block_size, op.bits, op.N
    g = op.gidx
    counts = np.bincount(g, minlength=op.kb)
    blocks = -(-counts // bs)                                # blocks per group
    group_of_block = np.repeat(np.arange(op.kb), blocks)
    start = bs * (np.cumsum(blocks) - blocks)                # first slot of each group
    order = np.argsort(g, kind="stable")
    rank = np.arange(len(g)) - np.repeat(np.cumsum(counts) - counts, counts)
    slots = start[g[order]] + rank                           # new slot of element order[j]
    K2 = bs * int(blocks.sum())
    a2 = np.zeros((a.shape[0], K2), a.dtype)
    a2[:, slots] = a[:, order]
    q = unpack_nbits(op.Bw.view(np.uint8), bits, bs).reshape(N, -1)[:, : op.K]
    q2 = np.zeros((N, K2), np.uint8)
    q2[:, slots] = q[:, order]
    B2 = pack_nbits(q2.reshape(N, -1, bs), bits)
    scales2 = np.ascontiguousarray(op.scales[:, group_of_block]).astype(a.dtype)
    zp2 = None
    if op.zmode == _k.ZP_FLOAT:
        zp2 = np.ascontiguousarray(op.zpf[:, group_of_block]).astype(a.dtype)
    elif op.zmode == _k.ZP_PACKED:
        codes = unpack_zero_points(op.zpk, bits, op.kb)[:, group_of_block]
        zp2 = pack_zero_points(codes, bits)
    return a2, B2, scales2, zp2, K2


def matmul_nbits_hw(A, B, scales, zero_points=None, g_idx=None, bias=None, *, K, N, bits,
                    block_size, accuracy_level=0, config: AccelConfig | None = None):
    """MatMulNBits as the engine of ``config`` computes it (arguments as
    :func:`qaccel.model.nbits.matmul_nbits`; see the module notes for the order).

    Raises ValueError / TypeError as ``matmul_nbits`` does, and ValueError if the engine of
    ``config`` does not carry ``bits`` (``config.nbits``).  (block_size >= 16 >= simd always.)
    """
    config = AccelConfig() if config is None else config
    if not isinstance(config, AccelConfig):
        raise TypeError(f"config must be an AccelConfig, not {config!r}")
    level = check_int("accuracy_level", accuracy_level, 0, 4)
    a = _check_A(A, check_int("K", K, 1))
    op = _Op(B, scales, zero_points, g_idx, K=K, N=N, bits=bits, block_size=block_size,
             dtype=a.dtype)
    if op.bits not in config.nbits:
        raise ValueError(f"bits {op.bits} is not carried by this engine (config.nbits "
                         f"{config.nbits})")
    out_shape = (*a.shape[:-1], op.N)
    if op.gidx is not None:
        a2, B2, s2, z2, K2 = gidx_operands(a.reshape(-1, op.K), op)
        y = matmul_nbits_hw(a2, B2, s2, z2, None, bias, K=K2, N=op.N, bits=op.bits,
                            block_size=op.block_size, accuracy_level=0, config=config)
        return y.reshape(out_shape)
    a32 = a.reshape(-1, op.K).astype(_F32)
    if int8_path(level, float_zero_points=op.zmode == _k.ZP_FLOAT, g_idx=op.gidx is not None):
        y = _int8_path(a32, op, config.partial_sums)
    else:
        w = dequantize_nbits(B, scales, zero_points, g_idx, K=op.K, N=op.N, bits=op.bits,
                             block_size=op.block_size)
        y = _float_path(a32, np.ascontiguousarray(w, _F32), config.simd,
                        config.partial_sums)
    b = _check_bias(bias, a.dtype, op.N)
    if b is not None:
        with np.errstate(all="ignore"):
            y = y + b.astype(_F32)
    return y.astype(a.dtype).reshape(out_shape)


def _check_bias(bias, dtype: np.dtype, N: int) -> np.ndarray | None:
    """The bias as an (N,) array of A's type, or None; TypeError / ValueError naming it."""
    if bias is None:
        return None
    b = as_array("bias", bias)
    if b.dtype != dtype:
        raise TypeError(f"bias must be {_A_DTYPES[dtype]} like A, not {b.dtype}")
    check_shape("bias", b, (N,), "N")
    return b
