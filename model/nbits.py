"""Golden model of ONNX Runtime's MatMulNBits contrib op and of ORT's block weight quantiser.

MatMulNBits (domain ``com.microsoft``) computes ``Y = A @ W + bias`` for a MatMul weight
``W`` (K, N) stored transposed and block-wise quantised along K: ``B`` uint8
``[N, k_blocks, block_size*bits/8]`` holds ``W^T``, with one scale (and optionally one zero
point) per column and K-block.  See SEMANTICS.md section 3.

Storage
    Every block of ``B`` is a little-endian bit stream: element ``j`` occupies bits
    ``[j*bits, (j+1)*bits)`` (for 3, 5, 6, 7 bits elements cross byte boundaries).  Packed
    zero points use the same layout per row of ``[N, ceil(k_blocks*bits/8)]``, each row padded
    to a whole byte.  When K is not a multiple of block_size the tail of the last block and the
    unused zero-point slots are ignored.

Dequantisation (bit-exact with ORT 1.31.1)
    integer or absent zero point (default ``2**(bits-1)``): ``w = f32(q - zp) * s``;
    float zero point: ``w = f32(q * s) + f32(-s * zp)`` (two roundings, no FMA).  Scales and
    float zero points of float16/bfloat16 are widened to float32 first.  With ``g_idx`` the
    scale/zero-point index of row k is ``g_idx[k]`` instead of ``k // block_size``, and the
    zero points are honoured.

Accumulation (the defined order, independent of threads and tiling)
    accuracy_level 0..3 (float path): ``y[m, n] = f32(sum_k f64(a[m, k]) * f64(w[n, k]))``,
    k ascending, accumulated in float64 (the product of two float32 is exact in float64, so
    the kernels may fuse each multiply-add without changing a bit).
    accuracy_level 4 (int8 path, ORT's CompInt8): A is quantised per row and K-block,
    symmetric int8 (``amax = max|a|``, zero-padded past K; ``sa = f32(amax/127)``,
    ``inv = f32(127/amax)`` or 0, ``qa = RNE(f32(a*inv))``, or 0 where that product is not
    finite, as ONNX Runtime: a block with ``0 < amax < 127/FLT_MAX`` adds 0, one holding
    inf or NaN gives NaN through ``sa``); then for each block b in
    ascending order ``acc += f64(f32(sa*sb)) * isum + f64(f32(sa*asum)) * f64(f32(-sb*zp))``
    with ``isum = sum(qa*q)`` over the raw weights and ``asum = sum(qa)``, both exact, and
    ``y = f32(acc)``.  Then, on both paths, ``y = f32(y + bias)`` and the result is rounded
    to A's type (float16 and bfloat16 A are computed in float32, as ORT does for float16).

Prepared weights
    ``prepare_nbits(B, scales, ...)`` validates the weights and lays them out once in column
    tiles (16 columns side by side: B's packed 32-bit words, still nibble-packed for 4 bits,
    or bytes for 3, 5, 6, 7 bits; scales; packed zero points), as ORT prepacks B at session
    creation; ``NBitsWeights.matmul(A, bias, accuracy_level=...)`` then computes, bit for
    bit, what ``matmul_nbits`` does (which builds the same tiles on the fly, a few at a time,
    for bits 2, 4, 8).  Same order per output as above; only the integer block sums of the
    int8 path are taken differently (exact int32 sums in any order, so the same integers),
    and ``bsum * zs + f64(xs) * isum`` is one fma where both products are exact.

Array-likes
    NumPy arrays keep their dtype (a non-native byte order becomes native); Python numbers,
    lists and tuples become: ``A`` float32; ``scales``, ``bias`` and float zero points A's
    type (float32 in :func:`prepare_nbits` and :func:`dequantize_nbits`, which have no A);
    ``B`` uint8; ``zero_points`` of Python ints packed uint8, with a Python float A's type;
    ``g_idx`` int32; ``W`` float32.  Integers must fit their type (ValueError naming the
    value).  A, scales, bias and float zero points share one type: a mismatch is a
    TypeError naming both types and the conversion.

ORT 1.31.1 on x86-64 with AVX512-VNNI (measured; B, scales, zero points and g_idx as
initializers, which is what lets ORT prepack B and use CompInt8):

=============================================  ==========================================
configuration                                  ORT
=============================================  ==========================================
bits 3, 5, 6, 7                                rejected ("Only 2b, 4b and 8b")
block_size 512 and above                       rejected (only 16..256)
bfloat16 A                                     rejected (no CPU kernel)
8 bits with float zero points or with g_idx    rejected at run time
2 bits with g_idx and float zero points        rejected
2 bits with g_idx                              reads B as 4-bit (SEMANTICS.md; not run)
4 bits with g_idx and packed zero points       zero points ignored (2**(bits-1) used)
level 4, float zero points or g_idx            float32 path (qaccel: float path too)
level 4, 2 bits with block_size 16 or 256      float32 path (qaccel: int8 path)
level 4, other integer/absent zero points      CompInt8 (qaccel: int8 path)
=============================================  ==========================================

With B as a graph input instead of an initializer ORT always takes its float32 path and also
rejects float zero points and g_idx with 8 bits.  Everything ORT rejects or gets wrong is
computed by qaccel with the formulas above.  Results agree with ORT within
``2.5e-7 * sum_k |a_k w_k|`` when both take the same path (one float16 ulp for float16 A);
ORT accumulates in float32 in a kernel-dependent order.
"""

from __future__ import annotations

import ml_dtypes
import numba
import numpy as np

from . import nbits_kernels as _k
from .jitcache import locked_call
from .quant_kernels import run_items
from .validate import as_array, check_int, check_power_of_two, check_shape, dtype_expr

__all__ = [
    "NBitsArgs",
    "check_A",
    "check_bias",
    "dequantize_nbits",
    "error_bound",
    "max_relative_error",
    "NBitsWeights",
    "matmul_nbits",
    "pack_nbits",
    "prepare_nbits",
    "pack_zero_points",
    "quantize_weights_nbits",
    "unpack_nbits",
    "unpack_zero_points",
]

_A_DTYPES = {
    np.dtype(np.float32): "float32",
    np.dtype(np.float16): "float16",
    np.dtype(ml_dtypes.bfloat16): "bfloat16",
}
_TILE = 128  # output columns per parallel work item of the generic kernel
_PACKED_BITS = (2, 4, 8)  # bits that matmul_packed reads straight from B
# multiply-adds per element of run_items's threshold for threads (PARALLEL_MIN_ELEMENTS, 1M):
# threads from 4M MACs on the float path, from 16M on the int8 path (4-5 times cheaper per
# MAC: at K = N = 1024, M = 4 a second thread made it 1.5x slower; ``qaccel bench threads``)
_MACS_PER_ELEMENT = {False: 4, True: 16}
_INT8_MAX_BLOCK = 65536  # int32 block sums stay exact: 127 * 255 * 65536 < 2**31


# --------------------------------------------------------------------------- helpers


def _bits(bits) -> int:
    return check_int("bits", bits, 2, 8)


#: Largest block_size (the kernels index blocks with native integers).
MAX_BLOCK_SIZE = 1 << 31


def _block_size(block_size) -> int:
    bs = check_power_of_two("block_size", block_size, 16)
    if bs > MAX_BLOCK_SIZE:
        raise ValueError(f"block_size must be a power of two from 16 to 2**31, not {bs}: the "
                         f"next power of two >= K already makes one block per column")
    return bs


def _storage_bits(bits: int) -> int:
    """Bits per element of B in the packed kernels' words: 2, 4, 8 as is, others as bytes."""
    return bits if bits in _PACKED_BITS else 8


def _nbytes(count: int, bits: int) -> int:
    return (count * bits + 7) // 8


def _uint8(param: str, value) -> np.ndarray:
    arr = as_array(param, value, ints=np.uint8, why="packed bytes")
    if arr.dtype != np.uint8:
        fix = (f"{param}.view(np.uint8) reinterprets its bytes" if arr.dtype == np.int8
               else f"convert it: {param}.astype(np.uint8)")
        raise TypeError(f"{param} must be a uint8 array, not {arr.dtype}: {fix}")
    return arr


def pack_nbits(values, bits):
    """Pack ``bits``-bit unsigned elements into LSB-first bit streams along the last axis.

    Element ``j`` of a row occupies bits ``[j*bits, (j+1)*bits)`` of the row's little-endian
    bit stream (crossing byte boundaries for 3, 5, 6, 7 bits); the row is padded with zero
    bits to a whole byte.  This is the layout of one MatMulNBits block of ``B`` and of one
    row of packed zero points.

    Parameters
    ----------
    values : array_like of int, shape (..., count)
        Elements in ``[0, 2**bits)``.
    bits : int
        2..8.

    Returns
    -------
    numpy.ndarray of uint8, shape (..., ceil(count*bits/8))
    """
    bits = _bits(bits)
    v = as_array("values", values)
    if v.dtype.kind not in "iub":
        raise TypeError(f"values must be an integer array, not {v.dtype}")
    if v.ndim == 0:
        raise ValueError("values must have at least 1 dimension, not 0")
    if v.size and (v.min() < 0 or v.max() >= 1 << bits):
        bad = v[(v < 0) | (v >= 1 << bits)].flat[0]
        raise ValueError(f"values must be in [0, {(1 << bits) - 1}] for {bits} bits, not {bad}")
    count = v.shape[-1]
    rows = np.ascontiguousarray(v.reshape(-1, count), dtype=np.uint8)
    out = locked_call(_k.pack_bits, rows, bits, _nbytes(count, bits))
    return out.reshape(*v.shape[:-1], out.shape[-1])


def unpack_nbits(packed, bits, count):
    """Inverse of :func:`pack_nbits`: the first ``count`` elements of each row's bit stream.

    Parameters
    ----------
    packed : numpy.ndarray of uint8, shape (..., nbytes)
    bits : int
        2..8.
    count : int
        Elements per row; ``count*bits <= 8*nbytes``.

    Returns
    -------
    numpy.ndarray of uint8, shape (..., count)
    """
    bits = _bits(bits)
    p = _uint8("packed", packed)
    if p.ndim == 0:
        raise ValueError("packed must have at least 1 dimension, not 0")
    count = check_int("count", count, 0)
    if count * bits > 8 * p.shape[-1]:
        raise ValueError(
            f"count must be <= {8 * p.shape[-1] // bits} for {p.shape[-1]} bytes of "
            f"{bits}-bit elements, not {count}"
        )
    rows = np.ascontiguousarray(p.reshape(-1, p.shape[-1]))
    return locked_call(_k.unpack_bits, rows, bits, count).reshape(*p.shape[:-1], count)


def pack_zero_points(zero_points, bits):
    """Pack integer zero points (N, k_blocks) as MatMulNBits (and ORT's quantiser) stores them.

    Each row becomes ``ceil(k_blocks*bits/8)`` bytes; the unused whole slots of the last byte
    hold ``2**(bits-1)`` (what ORT's quantiser writes for bits 2 and 4), leftover bits are 0.
    """
    bits = _bits(bits)
    z = as_array("zero_points", zero_points)
    if z.ndim != 2:
        raise ValueError(f"zero_points must be 2-D (N, k_blocks), not {z.ndim}-D")
    n, kb = z.shape
    slots = 8 * _nbytes(kb, bits) // bits
    padded = np.full((n, slots), 1 << (bits - 1), dtype=np.int64)
    padded[:, :kb] = z
    return pack_nbits(padded, bits)


def unpack_zero_points(zero_points, bits, k_blocks):
    """Packed zero points (N, ceil(k_blocks*bits/8)) uint8 -> (N, k_blocks) uint8."""
    return unpack_nbits(zero_points, bits, k_blocks)


# --------------------------------------------------------------------------- validation


class NBitsArgs:
    """Validated MatMulNBits arguments, converted to what the kernels take (shared by the
    golden model, the engine's model and the RTL job builder)."""

    def __init__(self, B, scales, zero_points, g_idx, *, K, N, bits, block_size, dtype):
        self.K = K = check_int("K", K, 1)
        self.N = N = check_int("N", N, 1)
        self.bits = bits = _bits(bits)
        self.block_size = bs = _block_size(block_size)
        self.kb = kb = (K + bs - 1) // bs
        blob = bs * bits // 8
        b = _uint8("B", B)
        check_shape("B", b, (N, kb, blob), f"N, ceil(K/block_size), block_size*bits/8 for K={K}")
        self.Bw = np.ascontiguousarray(b).view(np.uint16)  # blob = 2*bits*block_size/16

        self.scales = self._per_block("scales", scales, dtype, N, kb)
        self.zmode = _k.ZP_DEFAULT
        self.zpk = np.zeros((1, 1), np.uint8)
        self.zpf = np.zeros((1, 1), np.float32)
        if zero_points is not None:
            z = as_array("zero_points", zero_points, floats=dtype, ints=np.uint8,
                         why="Python ints are packed uint8 zero points, floats A's type")
            if z.dtype == np.uint8:
                nz = _nbytes(kb, bits)
                if z.shape not in ((N, nz), (N * nz,)):
                    raise ValueError(
                        f"zero_points (packed uint8) must have shape {(N, nz)} "
                        f"(N, ceil(k_blocks*bits/8)), not {z.shape}"
                    )
                self.zpk = np.ascontiguousarray(z.reshape(N, nz))
                self.zmode = _k.ZP_PACKED
            elif z.dtype == dtype:
                self.zpf = self._per_block("zero_points", z, dtype, N, kb)
                self.zmode = _k.ZP_FLOAT
            else:
                raise TypeError(
                    f"zero_points must be uint8 (packed) or {_A_DTYPES[dtype]} like A, "
                    f"not {z.dtype}: convert it: zero_points.astype(np.uint8) (packed) or "
                    f"zero_points.astype({dtype_expr(dtype)}) (one per block)"
                )

        self.gidx = None
        if g_idx is not None:
            g = as_array("g_idx", g_idx, ints=np.int32)
            if g.dtype != np.int32:
                raise TypeError(f"g_idx must be an int32 array, not {g.dtype}: convert it: "
                                f"g_idx.astype(np.int32)")
            check_shape("g_idx", g, (K,), "K")
            bad = (g < 0) | (g >= kb)
            if bad.any():
                raise ValueError(f"g_idx values must be in [0, {kb - 1}], not {g[bad][0]}")
            self.gidx = np.ascontiguousarray(g)

    @staticmethod
    def _per_block(param, value, dtype, N, kb):
        v = as_array(param, value, floats=dtype, ints=dtype)
        if v.dtype != dtype:
            raise TypeError(_like_A(param, v.dtype, dtype))
        if v.shape not in ((N, kb), (N * kb,)):
            raise ValueError(f"{param} must have shape {(N, kb)} (N, k_blocks), not {v.shape}")
        return np.ascontiguousarray(v.reshape(N, kb), dtype=np.float32)

    def kernel_args(self) -> tuple:
        """The weight-side arguments of :func:`nbits_kernels.matmul`, in its order.

        g_idx is passed as an empty array for the default ``k // block_size``.
        """
        gidx = self.gidx if self.gidx is not None else np.zeros(0, np.int32)
        return (
            self.Bw,
            self.scales,
            self.zpk,
            self.zpf,
            self.zmode,
            gidx,
            self.bits,
            self.block_size,
        )

    def packed_args(self, wbits) -> tuple:
        """B, S, Z, C of :func:`nbits_kernels.matmul_packed`, B and packed zero points stored
        with ``wbits`` bits per element (``bits``, or 8 when bits is 3, 5, 6 or 7)."""
        N = self.N
        b8 = self.Bw.view(np.uint8).reshape(N, -1)
        if wbits != self.bits:
            b8 = unpack_nbits(b8.reshape(N, self.kb, -1), self.bits, self.block_size)
            b8 = b8.reshape(N, -1)
        B = _words(b8)
        Z = np.zeros((N, 0), np.uint32)
        C = np.zeros((N, 0), np.float32)
        if self.zmode == _k.ZP_PACKED:
            z = self.zpk
            if wbits != self.bits:
                z = unpack_zero_points(z, self.bits, self.kb)
            Z = _words(z)
        elif self.zmode == _k.ZP_FLOAT:
            C = self.zpf
        return B, self.scales, Z, C


def _words(a):
    """(R, n) uint8 -> (R, ceil(n/4)) uint32 holding the same bytes (zero-padded), aligned."""
    rows, n = a.shape
    if n % 4 == 0 and a.flags.c_contiguous and a.ctypes.data % 4 == 0:
        return a.view(np.uint32)
    w = np.zeros((rows, -(-n // 4) * 4), np.uint8)
    w[:, :n] = a
    return w.view(np.uint32)


def _activation_words(qa, op, wbits):
    """qa (M, K) as the int32 words of :func:`nbits_kernels.matmul_packed` (zero-padded to
    whole blocks): byte j of word ``(w*P + r)`` is the qa of element ``r + j*P`` of
    weight word w (P = 8 // wbits elements per byte)."""
    M = qa.shape[0]
    q = np.zeros((M, op.kb * op.block_size), np.int8)
    q[:, : op.K] = qa
    P = 8 // wbits
    q = np.ascontiguousarray(q.reshape(M, -1, 4, P).transpose(0, 1, 3, 2))
    return q.view(np.int32).reshape(M, -1)


def _like_A(param: str, got, dtype) -> str:
    """The message for a ``param`` whose type is not A's ``dtype``."""
    return (f"{param} must be {_A_DTYPES[dtype]} like A, not {np.dtype(got)}: A, scales, "
            f"bias and float zero points share one type; convert it: "
            f"{param}.astype({dtype_expr(dtype)}), or A: A.astype({dtype_expr(got)})"
            if np.dtype(got) in _A_DTYPES else
            f"{param} must be {_A_DTYPES[dtype]} like A, not {np.dtype(got)}: convert it: "
            f"{param}.astype({dtype_expr(dtype)})")


def _scales(scales) -> np.ndarray:
    """``scales`` without A to compare with (prepare_nbits, dequantize_nbits): float32,
    float16 or bfloat16; Python numbers become float32."""
    s = as_array("scales", scales, floats=np.float32, ints=np.float32)
    if s.dtype not in _A_DTYPES:
        raise TypeError(f"scales must be float32, float16 or bfloat16, not {s.dtype}: "
                        f"convert it: scales.astype(np.float32)")
    return s


def check_bias(bias, dtype, N):
    """``bias`` as an array of A's ``dtype`` and shape (N,), or None."""
    if bias is None:
        return None
    b = as_array("bias", bias, floats=dtype, ints=dtype)
    if b.dtype != dtype:
        raise TypeError(_like_A("bias", b.dtype, dtype))
    check_shape("bias", b, (N,), "N")
    return b


def check_A(A, K, dtype=np.float32):
    """``A`` as an array of float32, float16 or bfloat16 of rank >= 2 and last dimension
    ``K`` (TypeError / ValueError naming it); Python numbers (lists) become ``dtype``."""
    a = as_array("A", A, floats=dtype, ints=dtype)
    if a.dtype not in _A_DTYPES:
        raise TypeError(f"A must be float32, float16 or bfloat16, not {a.dtype}: convert it: "
                        f"A.astype({dtype_expr(dtype)})")
    if a.ndim < 2:
        raise ValueError(f"A must have rank >= 2 ([..., K]), not rank {a.ndim} (shape "
                         f"{a.shape}): one row is A.reshape(1, -1)")
    if a.shape[-1] != K:
        raise ValueError(f"A's last dimension must be K={K}, not {a.shape[-1]} (A of shape "
                         f"{a.shape}): A is (..., K), the weights W (K, N)")
    return a


# --------------------------------------------------------------------------- prepared weights


class NBitsWeights:
    """MatMulNBits weights validated and laid out for the kernels once, as ORT prepacks B.

    Made by :func:`prepare_nbits`; :meth:`matmul` gives bit for bit what
    :func:`matmul_nbits` gives for the same weights.  Immutable: the arrays are private
    copies, read-only.
    """

    __slots__ = ("_op", "_dtype", "_tiles")

    def __init__(self, op, dtype, *, own=True):
        if own:  # private, read-only copies (matmul_nbits passes own=False: used once,
            # by the per-call kernels, which transpose B on the fly instead of tiling it)
            for name in ("Bw", "scales", "zpk", "zpf", "gidx"):
                arr = getattr(op, name)
                if arr is not None:
                    arr = arr.copy()
                    arr.flags.writeable = False
                    setattr(op, name, arr)
        object.__setattr__(self, "_op", op)
        object.__setattr__(self, "_dtype", np.dtype(dtype))
        tiles = None
        if own and op.gidx is None:  # g_idx (or used once): the per-call kernels
            wbits = _storage_bits(op.bits)
            tiles = tuple(locked_call(_k.tile_columns, x) for x in op.packed_args(wbits))
        for arr in tiles or ():
            arr.flags.writeable = False
        object.__setattr__(self, "_tiles", tiles)

    def __setattr__(self, name, value):
        raise AttributeError("NBitsWeights is immutable")

    K = property(lambda self: self._op.K)
    N = property(lambda self: self._op.N)
    bits = property(lambda self: self._op.bits)
    block_size = property(lambda self: self._op.block_size)
    dtype = property(lambda self: self._dtype, doc="The type of scales, A, bias and Y.")

    def __repr__(self):
        return (
            f"NBitsWeights(K={self.K}, N={self.N}, bits={self.bits}, "
            f"block_size={self.block_size}, dtype={self._dtype.name})"
        )

    def matmul(self, A, bias=None, *, accuracy_level=0):
        """``Y = A @ W + bias``, as :func:`matmul_nbits` with these weights.

        ``A`` (and ``bias``) must have the type of the weights' scales (:attr:`dtype`; Python
        numbers become it): TypeError naming A, its type and the conversion otherwise."""
        level = check_int("accuracy_level", accuracy_level, 0, 4)
        a = check_A(A, self.K, dtype=self._dtype)
        if a.dtype != self._dtype:
            want = _A_DTYPES[self._dtype]
            raise TypeError(
                f"A must be {want}, the type of the prepared weights' scales, not "
                f"{_A_DTYPES[a.dtype]}: convert it: A.astype({dtype_expr(self._dtype)}), or "
                f"prepare the weights with {_A_DTYPES[a.dtype]} scales (A, scales, bias and "
                f"float zero points share one type: float32, float16 or bfloat16)")
        return self._run(a, bias, level)

    def _run_packed(self, a2, int8, out):
        op = self._op
        wbits = _storage_bits(op.bits)
        if int8:
            qa, sa, absum = locked_call(_k.quantize_a, a2, op.block_size)
            qd = _activation_words(qa, op, wbits)
            a64 = np.zeros((1, 1), np.float64)
        else:
            a64 = a2.astype(np.float64)
            qd = np.zeros((1, 1), np.int32)
            sa = absum = np.zeros((1, 1), np.float32)
        if self._tiles is not None:
            kernel, arrays = _k.matmul_tiles, self._tiles
        else:
            kernel, arrays = _k.matmul_packed, op.packed_args(wbits)
        M, N = out.shape
        args = (a64, qd, sa, absum, *arrays, op.zmode, wbits, op.bits, op.block_size, op.K)
        # a few tiles per work item, claimed one item at a time by each thread (threads only
        # for enough work)
        n_items = -(-N // (_k.TILE * _k.TILES_PER_ITEM))
        run_items(kernel, n_items, M * op.K * N // _MACS_PER_ELEMENT[bool(int8)], *args, int8,
                  out)

    def _run(self, a, bias, level):
        op = self._op
        b = check_bias(bias, a.dtype, op.N)
        b32 = None if b is None else b.astype(np.float32)

        a2 = np.ascontiguousarray(a.reshape(-1, op.K), dtype=np.float32)
        out = np.empty((a2.shape[0], op.N), np.float32)
        int8 = level == 4 and op.zmode != _k.ZP_FLOAT and op.gidx is None
        # the packed kernels (prepared tiles, or bits 2, 4, 8 per call), except for g_idx;
        # the int8 path also needs finite A (qa) and exact int32 block sums
        packed = op.gidx is None and (self._tiles is not None or op.bits in _PACKED_BITS)
        if packed and int8:
            packed = op.block_size <= _INT8_MAX_BLOCK and bool(np.isfinite(a2).all())
        if a2.shape[0] == 0:
            pass
        elif packed:
            self._run_packed(a2, int8, out)
        else:
            sa = absum = np.zeros((1, 1), np.float32)
            if int8:
                a2, sa, absum = locked_call(_k.quantize_a, a2, op.block_size)
            with numba.parallel_chunksize(1):  # tiles handed out one at a time: balances cores
                locked_call(_k.matmul, a2, sa, absum, *op.kernel_args(), int8, _TILE, out)
        if b32 is not None:
            out += b32
        return out.astype(a.dtype, copy=False).reshape(*a.shape[:-1], op.N)


def _prepare(B, scales, zero_points, g_idx, *, K, N, bits, block_size, dtype, own=True):
    op = NBitsArgs(B, scales, zero_points, g_idx, K=K, N=N, bits=bits, block_size=block_size,
                   dtype=dtype)
    return NBitsWeights(op, dtype, own=own)


def prepare_nbits(B, scales, zero_points=None, g_idx=None, *, K, N, bits, block_size):
    """Validate MatMulNBits weights and lay them out for the kernels once.

    Same weight arguments as :func:`matmul_nbits`; A's type (and the bias's) must then be
    the type of ``scales`` (float32, float16 or bfloat16).  ``prepare_nbits(...).matmul(A,
    bias, accuracy_level=l)`` is bit for bit ``matmul_nbits(A, ..., bias, accuracy_level=l)``.

    Returns
    -------
    NBitsWeights
    """
    s = _scales(scales)
    return _prepare(
        B, s, zero_points, g_idx, K=K, N=N, bits=bits, block_size=block_size, dtype=s.dtype
    )


# --------------------------------------------------------------------------- public API


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
    """MatMulNBits (com.microsoft): ``Y = A @ dequant(B)^T + bias``.

    Parameters
    ----------
    A : array_like, shape (..., K), float32, float16 or bfloat16
        (Array-likes: see the module notes; every array parameter converts the same way.)
    B : numpy.ndarray of uint8, shape (N, k_blocks, block_size*bits/8)
        ``k_blocks = ceil(K/block_size)``; each block an LSB-first ``bits``-bit stream.
    scales : numpy.ndarray of A's dtype, shape (N, k_blocks) (or flattened)
    zero_points : numpy.ndarray, optional
        uint8 packed ``(N, ceil(k_blocks*bits/8))``, or A's dtype unpacked ``(N, k_blocks)``
        (or either flattened).  Absent: ``2**(bits-1)``.
    g_idx : numpy.ndarray of int32, shape (K,), optional
        Scale/zero-point group of each row of W, in ``[0, k_blocks)``.
    bias : numpy.ndarray of A's dtype, shape (N,), optional
    K, N, bits, block_size : int
        bits 2..8, block_size a power of two >= 16.
    accuracy_level : int
        0..3 float path; 4 int8 path (float path with float zero points or g_idx).

    Returns
    -------
    numpy.ndarray of A's dtype, shape (..., N)
        Computed in float32 with the accumulation order of the module docstring, then rounded
        to A's dtype.  Dequantised weights are bit-exact with ORT; the sum is not (ORT
        accumulates in float32 in a kernel-dependent order).

    Raises
    ------
    TypeError, ValueError
        Naming the parameter and value, for any structural error.
    """
    level = check_int("accuracy_level", accuracy_level, 0, 4)
    a = check_A(A, check_int("K", K, 1))
    w = _prepare(
        B,
        scales,
        zero_points,
        g_idx,
        K=K,
        N=N,
        bits=bits,
        block_size=block_size,
        dtype=a.dtype,
        own=False,
    )
    return w._run(a, bias, level)


def dequantize_nbits(B, scales, zero_points=None, g_idx=None, *, K, N, bits, block_size):
    """The float32 weights ``W^T`` (N, K) that MatMulNBits multiplies by, bit-exact with ORT.

    Same arguments as :func:`matmul_nbits`; the result is float32 whatever the scales' type
    (ORT widens float16 scales and zero points to float32 before dequantising).
    """
    scales_arr = _scales(scales)
    op = NBitsArgs(
        B,
        scales_arr,
        zero_points,
        g_idx,
        K=K,
        N=N,
        bits=bits,
        block_size=block_size,
        dtype=scales_arr.dtype,
    )
    blocks = op.Bw.view(np.uint8)
    q = unpack_nbits(blocks, op.bits, op.block_size).reshape(op.N, -1)[:, : op.K]
    g = op.gidx if op.gidx is not None else np.arange(op.K) // op.block_size
    s = op.scales[:, g]
    qf = q.astype(np.float32)
    if op.zmode == _k.ZP_FLOAT:
        return qf * s + -s * op.zpf[:, g]
    if op.zmode == _k.ZP_PACKED:
        z = unpack_zero_points(op.zpk, op.bits, op.kb)[:, g]
    else:
        z = 1 << (op.bits - 1)
    return (q.astype(np.int32) - z).astype(np.float32) * s


#: Added to :func:`error_bound` so that it divides where A or W is all zero.
BOUND_FLOOR = 1e-30


def error_bound(A, B, scales, zero_points=None, g_idx=None, *, K, N, bits, block_size):
    """``sum_k |a[m, k] * w[k, n]|`` per output element, in float64, plus BOUND_FLOOR.

    The scale of MatMulNBits's rounding error: however the products are ordered and
    rounded, a float32 sum of them is off by at most a small multiple of float32's epsilon
    times this (the tests and ``qaccel sim`` accept 1e-6 of it).  ``w`` is the dequantised
    weight (:func:`dequantize_nbits`); the arguments are :func:`matmul_nbits`'s (no bias).
    Shape ``(..., N)`` as Y.
    """
    a = as_array("A", A)
    W = dequantize_nbits(B, scales, zero_points, g_idx, K=K, N=N, bits=bits,
                         block_size=block_size)
    a64 = np.abs(a.reshape(-1, K).astype(np.float64))
    bound = a64 @ np.abs(W.T.astype(np.float64)) + BOUND_FLOOR
    return bound.reshape(*a.shape[:-1], N)


def max_relative_error(y, ref, bound) -> float:
    """``max |y - ref| / bound`` over all elements, in float64 (``bound`` from
    :func:`error_bound`); a NaN in ``y - ref`` makes it NaN."""
    diff = np.abs(np.asarray(y).astype(np.float64) - np.asarray(ref).astype(np.float64))
    return float(np.max(diff / bound))


def quantize_weights_nbits(W, *, bits, block_size, symmetric):
    """Quantise a MatMul weight as ORT's ``quantize_matmul_{2,4,8}bits`` does, byte for byte.

    Per column of ``W`` and block of ``block_size`` rows (the last block may be partial):

    - asymmetric: ``lo = min(min(blk), 0)``, ``hi = max(max(blk), 0)``,
      ``s = f32((hi - lo) / (2**bits - 1))``, ``zp = clamp(roundf(-lo / s))`` (``zp = 0`` if
      ``s == 0``);
    - symmetric: ``s = f32(m / -2**(bits-1))`` with ``m`` the signed element of largest
      magnitude (the negative one on a tie), so ``s`` can be negative (and is -0.0 for an
      all-zero block); no zero points (the default ``2**(bits-1)`` applies);
    - float16 ``W``: ``s`` is stored as float16 (zp still from the float32 ``s``);
    - ``q = clamp(roundf(w * f32(1/s) + zp), 0, 2**bits - 1)`` (``1/s`` taken as 0 when
      ``s == 0``, ``s`` the stored scale), all in float32, without FMA, ``roundf`` rounding
      half away from zero.

    Bits 3, 5, 6, 7 (which ORT lacks) use the same formulas.  Past ``K`` the last block holds
    what ORT leaves there (called as onnxruntime's ``MatMulNBitsQuantizer`` calls it, ``W``
    padded with zero rows): whole bytes are 0; a byte that ``K`` splits (2 and 4 bits) gets,
    in its slots past ``K``, the codes of the same slots of the pack before it (ORT's per-pack
    buffer is reused, per thread block of ``block_size * 8 / bits`` rows of one column, and
    starts as 0s). Unused zero-point slots hold ``2**(bits-1)``.

    Parameters
    ----------
    W : numpy.ndarray of float32 or float16, shape (K, N)
        As stored in an ONNX MatMul initializer.
    bits : int
        2..8.
    block_size : int
        Power of two >= 16.
    symmetric : bool

    Returns
    -------
    B : numpy.ndarray of uint8, shape (N, k_blocks, block_size*bits/8)
    scales : numpy.ndarray of W's dtype, shape (N, k_blocks)
    zero_points : numpy.ndarray of uint8, shape (N, ceil(k_blocks*bits/8)), or None
        None when ``symmetric``.
    """
    bits = _bits(bits)
    bs = _block_size(block_size)
    if not isinstance(symmetric, (bool, np.bool_)):
        raise TypeError(f"symmetric must be a bool, not {symmetric!r}")
    w = as_array("W", W, floats=np.float32, ints=np.float32)
    if w.dtype not in (np.float32, np.float16):
        raise TypeError(f"W must be a float32 or float16 array, not {w.dtype}: convert it: "
                        f"W.astype(np.float32)")
    if w.ndim != 2 or 0 in w.shape:
        raise ValueError(f"W must be a non-empty 2-D array (K, N), not shape {w.shape}")
    K, N = w.shape
    half = w.dtype == np.float16
    q, scales, zps = locked_call(
        _k.quantize_blockwise, np.ascontiguousarray(w, dtype=np.float32), bits, bs,
        bool(symmetric), bool(half)
    )
    _ort_tail(q, K, bits, bs)
    kb = scales.shape[1]
    B = pack_nbits(q.reshape(N, kb, bs), bits)
    if half:
        scales = scales.astype(np.float16)          # exact: float16 values
    return B, scales, None if symmetric else pack_zero_points(zps, bits)


def _ort_tail(q, K: int, bits: int, block_size: int) -> None:
    """Fill the slots past ``K`` of a byte that ``K`` splits as ORT's quantiser leaves them:
    the codes of the same slots one pack earlier, if that pack is in the same thread block
    (``block_size * pack`` rows), else 0 (``q`` (N, padded K) uint8, in place)."""
    pack = 8 // bits if bits in (2, 4) else 1
    tail = K % pack
    if not tail:
        return
    start = K - tail                                # the split pack's first row
    if start % (block_size * pack):                 # not the first pack of its thread block
        q[:, K:start + pack] = q[:, K - pack:start]
