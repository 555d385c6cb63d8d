"""MatMulNBits on the engine: an operator call turned into the v2 engine's register values and
stream beats (:class:`~qaccel.rtl.nbits.matmul_nbits_v2.MatMulNBitsV2`, the host-side layout of
docs/matmul_nbits_v2.md), and its ``y`` words back into Y.

The expected ``y`` words come from :func:`qaccel.model.nbits_hw.matmul_nbits_v2`, so the
comparison is bit-exact. Beats are StreamSim payloads: ``(beats, words)`` ``uint64`` arrays
(``(beats,)`` when one word), least significant word first, each stream's payload layout as
the engine declares it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from qaccel.model import nbits_kernels as _k
from qaccel.model.config import ZERO_POINTS, AccelConfig
from qaccel.model.dtypes import dtype_name
from qaccel.model.nbits import NBitsArgs, check_A, check_bias, unpack_nbits, unpack_zero_points
from qaccel.model.nbits_hw import block_layout, int8_path, matmul_nbits_v2
from qaccel.model.validate import check_int
from qaccel.rtl.nbits.matmul_nbits_v2 import OUT_FORMATS, lane_column, wide_columns

__all__ = ["NBitsJobV2", "is_nan_code", "nbits_job_v2", "unpack_y_v2"]

#: (exponent mask, mantissa mask) of the ``y`` codes of each ``out_fmt``.
_NAN_MASKS = ((0x7F800000, 0x007FFFFF), (0x7C00, 0x03FF), (0x7F80, 0x007F))


def _codes(y: np.ndarray) -> np.ndarray:
    """Float32 / float16 / bfloat16 values -> their codes as uint32."""
    return y.view(np.uint32 if y.dtype.itemsize == 4 else np.uint16).astype(np.uint32)


def is_nan_code(code, out_fmt: int):
    """Whether ``y`` codes (ints or a uint32 array) of format ``out_fmt`` are NaNs."""
    exp, man = _NAN_MASKS[out_fmt]
    return ((code & exp) == exp) & ((code & man) != 0)


def _words(rows: np.ndarray) -> np.ndarray:
    """(n, bytes) uint8 -> StreamSim payloads: (n, ceil(bytes / 8)) uint64, little-endian,
    zero-padded; (n,) when one word."""
    n, nbytes = rows.shape
    out = np.zeros((n, -(-nbytes // 8) * 8), np.uint8)
    out[:, :nbytes] = rows
    words = out.view("<u8")
    return words[:, 0] if words.shape[1] == 1 else words


def _bitstream(codes: np.ndarray, bits: int) -> np.ndarray:
    """(..., n) codes -> (..., ceil(n * bits / 8)) bytes: an LSB-first bit stream per row."""
    lead, n = codes.shape[:-1], codes.shape[-1]
    b = (codes[..., None].astype(np.uint16) >> np.arange(bits, dtype=np.uint16)) & 1
    b = b.reshape(*lead, n * bits).astype(np.uint8)
    pad = (-b.shape[-1]) % 8
    b = np.concatenate([b, np.zeros((*lead, pad), np.uint8)], axis=-1)
    return np.packbits(b, axis=-1, bitorder="little")


@dataclass
class NBitsJobV2:
    """One v2 engine job: ``regs``, ``inputs`` (beats per input stream), ``y`` (the expected
    ``y`` words in the engine's order, uint32 codes), ``real`` (which of them are columns of
    Y rather than a partial group's padding) and the operator's output shape."""

    regs: dict[str, int]
    inputs: dict[str, np.ndarray]
    y: np.ndarray
    real: np.ndarray
    order: np.ndarray                   # (len(y), 2): the (row, column) of each y word
    out_shape: tuple[int, ...]
    out_dtype: np.dtype
    meta: dict = field(default_factory=dict)


def _fields(values: np.ndarray, width: int) -> np.ndarray:
    """(n, fields) unsigned values of ``width`` bits -> StreamSim payloads, field ``i`` at
    bit ``i * width`` of its beat."""
    v = np.ascontiguousarray(values, np.uint64)
    b = ((v[..., None] >> np.arange(width, dtype=np.uint64)) & np.uint64(1)).astype(np.uint8)
    return _words(np.packbits(b.reshape(len(v), -1), axis=-1, bitorder="little"))


def nbits_job_v2(A, B, scales, zero_points=None, g_idx=None, bias=None, *, K, N, bits,
                 block_size, accuracy_level=4, config: AccelConfig | None = None,
                 expect: bool = True) -> NBitsJobV2:
    """Return the v2 engine job computing ``matmul_nbits(...)`` (arguments as
    :func:`qaccel.model.nbits.matmul_nbits`) with its expected ``y`` words: B repacked into
    the engine's weight steps, scales and zero-point codes per lane on ``s``, biases on
    ``b`` (the host-side layout of docs/matmul_nbits_v2.md).

    Calls of the int8 path (section 1) run on every engine. Calls of the float path (section
    2: accuracy_level 0..3, or g_idx) need ``config.float_path`` (``fmode`` set: the engine
    writes each row in block floating point, four digit rows a row); g_idx is the host's
    group-by-group layout of K (:func:`~qaccel.model.nbits_hw.block_layout`: A's columns
    and B's rows permuted, groups padded to whole blocks, each block with its group's scale
    and zero point); float zero points send each block's scales and then its ``z =
    f32(-scale * zero_point)`` on ``s`` (``fmode = 3``). Without ``expect`` the engine's model
    does not run: the expected words are zeros (the arguments are checked all the same)."""
    config = AccelConfig() if config is None else config
    check_int("accuracy_level", accuracy_level, 0, 4)
    a = check_A(A, K)
    op = NBitsArgs(B, scales, zero_points, g_idx, K=K, N=N, bits=bits, block_size=block_size,
             dtype=a.dtype)
    bias = check_bias(bias, a.dtype, N)
    out_shape, out_dtype = (*a.shape[:-1], N), a.dtype
    y_ref = (matmul_nbits_v2(A, B, scales, zero_points, g_idx, bias, K=K, N=N, bits=bits,
                             block_size=block_size, accuracy_level=accuracy_level)
             if expect else None)
    fmode = not int8_path(accuracy_level, float_zero_points=op.zmode == _k.ZP_FLOAT,
                          g_idx=op.gidx is not None)
    if fmode and not config.float_path:
        raise ValueError(f"this engine takes the int8 path only (accuracy_level 4, integer or "
                         f"no zero points, no g_idx), not accuracy_level {accuracy_level} with "
                         f"{ZERO_POINTS[op.zmode]} zero points and "
                         f"{'a' if op.gidx is not None else 'no'} g_idx: build it with "
                         f"float_path=True")
    fzp = op.zmode == _k.ZP_FLOAT
    bs, pe, simd, T = op.block_size, config.pe, config.simd, config.m_tile
    if not 16 <= bs <= config.max_block_size:
        raise ValueError(f"block_size must be in [16, {config.max_block_size}] for this "
                         f"engine, not {bs}")
    a32 = a.reshape(-1, K).astype(np.float32)
    M = a32.shape[0]
    if M == 0:
        raise ValueError(f"A has no rows (shape {a.shape}): an engine job needs M >= 1; "
                         f"qaccel.RTL().matmul_nbits returns the empty result without one")
    # the K layout: natural blocks, or g_idx's groups (A and B permuted, padding slots 0)
    slots, group = block_layout(op)
    kb = slots.shape[0]
    Kp = kb * bs
    codes = np.zeros((N, Kp), np.uint8)
    if op.gidx is None:
        k_reg = K
        codes[:, :K] = unpack_nbits(op.Bw.view(np.uint8), op.bits, bs).reshape(N, Kp)[:, :K]
    else:
        k_reg = Kp
        flat = slots.reshape(-1)
        real = flat >= 0
        codes[:, real] = unpack_nbits(op.Bw.view(np.uint8), op.bits, bs).reshape(
            N, -1)[:, flat[real]]
        a_perm = np.zeros((M, Kp), np.float32)
        a_perm[:, real] = a32[:, flat[real]]
        a32 = a_perm
    if k_reg > config.max_k:
        raise ValueError(f"K must be at most config.max_k ({config.max_k}), not {K}"
                         + (f" (g_idx's padded layout: {k_reg})" if k_reg != K else ""))
    F = config.scale_lanes
    J = pe // F
    wide = op.bits > 4
    cols = pe // 2 if wide else pe
    groups = -(-N // cols)
    Np = groups * cols
    steps = Kp // simd
    Ta = T // 4 if fmode else T                            # activation rows per tile
    tiles = [(r0, min(Ta, M - r0)) for r0 in range(0, M, Ta)]

    q = np.zeros((Np, Kp), np.uint8)
    q[:N] = codes
    qg = q.reshape(groups, cols, steps, simd).transpose(0, 2, 1, 3)      # g, step, col, j
    if wide:                      # column c's nibbles in MAC columns wide_columns(...)[c]
        lo, hi = np.array(wide_columns(pe, F)).T
        nib = np.zeros((groups, steps, pe, simd), np.uint8)               # g, step, slot, j
        nib[:, :, lo], nib[:, :, hi] = qg & 15, qg >> 4
        w_steps = nib.reshape(groups, steps, pe * simd)
    else:
        w_steps = qg.reshape(groups, steps, pe * simd)
    if op.bits == 2:              # two steps per word: each nibble both, the first low
        if steps % 2:
            w_steps = np.concatenate([w_steps, np.zeros_like(w_steps[:, :1])], axis=1)
        w_group = _bitstream(w_steps[:, 0::2] | (w_steps[:, 1::2] << 2), 4)
    else:
        w_group = _bitstream(w_steps, 4)
    w_group = w_group.reshape(-1, w_group.shape[-1])                     # words of all groups
    w_beats = _words(np.tile(w_group, (len(tiles), 1)))

    sc = np.zeros((Np, kb), np.float32)
    sc[:N] = op.scales[:, group]
    zp = np.full((Np, kb), 1 << (op.bits - 1), np.uint64)
    if op.zmode == _k.ZP_PACKED:
        zp[:N] = unpack_zero_points(op.zpk, op.bits, op.kb)[:, group]
    # s beats: the scale and zero-point code; float zero points: the scale with code 0,
    # then z = f32(-scale * zero_point) (float32, as the model) with code 0
    entries = [sc.view(np.uint32).astype(np.uint64) | (zp << np.uint64(32))]
    if fzp:
        z = np.zeros((Np, kb), np.float32)
        with np.errstate(all="ignore"):
            z[:N] = -op.scales[:, group] * op.zpf[:, group]
        entries = [sc.view(np.uint32).astype(np.uint64), z.view(np.uint32).astype(np.uint64)]
    P = len(entries)                                     # beats per (block, j)
    lanes = np.zeros((groups, kb, P, J, F), np.uint64)   # beat j, lane f: column col[j, f]
    col = np.array([[-1 if (c := lane_column(pe, F, f, j, wide)) is None else c
                     for f in range(F)] for j in range(J)])
    real_col = col >= 0
    for g in range(groups):
        c = g * cols + np.minimum(col, cols - 1)
        for p_, entry in enumerate(entries):
            lanes[g, :, p_] = np.where(real_col[..., None], entry[c], 0).transpose(2, 0, 1)
    s_beats = _fields(np.tile(lanes.reshape(-1, F), (len(tiles), 1)), 40)
    inputs = {"a": a32.view(np.uint32).reshape(-1).astype(np.uint64),
              "w": w_beats, "s": s_beats}
    if bias is not None:
        bv = np.zeros(Np, np.float32)
        bv[:N] = np.asarray(bias).astype(np.float32)
        bl = np.zeros((groups, J, F), np.uint32)
        for g in range(groups):
            bl[g] = np.where(real_col, bv[g * cols + np.minimum(col, cols - 1)], 0).view(
                np.uint32)
        inputs["b"] = _fields(np.tile(bl.reshape(-1, F), (len(tiles), 1)), 32)

    y2 = np.zeros((M, Np), np.uint32)
    if y_ref is not None:
        y2[:, :N] = _codes(y_ref.reshape(M, N))
    order = [(r0 + r, g * cols + p) for r0, rows in tiles for g in range(groups)
             for r in range(rows) for p in range(cols)]
    order = np.array(order, np.int64).reshape(-1, 2)
    out_fmt = OUT_FORMATS.index(dtype_name(out_dtype))
    regs = {"k": k_reg, "block_size": bs, "bits": op.bits, "m": M, "groups": groups,
            "bias": int(bias is not None), "out_fmt": out_fmt,
            "fmode": int(fmode) | (2 if fzp else 0)}
    return NBitsJobV2(regs, inputs, y2[order[:, 0], order[:, 1]], order[:, 1] < N, order,
                      out_shape, out_dtype, {"accuracy_level": accuracy_level,
                                             "tiles": len(tiles), "k_blocks": kb})


def unpack_y_v2(job: NBitsJobV2, words: np.ndarray) -> np.ndarray:
    """The v2 engine's ``y`` words (uint32 codes, its order) -> Y, shaped and typed as the
    operator's output."""
    M = job.order[:, 0].max() + 1
    N = job.out_shape[-1]
    y = np.zeros((M, job.order[:, 1].max() + 1), np.uint32)
    y[job.order[:, 0], job.order[:, 1]] = words
    y = np.ascontiguousarray(y[:, :N])
    if job.out_dtype.itemsize == 2:
        y = y.astype(np.uint16)
    return y.view(job.out_dtype).reshape(job.out_shape)
