"""The packed MatMulNBits kernels (SIMD column tiles): per call, prepared, threads, primitives.

Sizes here are large enough for every code path of ``matmul_packed``/``matmul_tiles``: the
in-register 16x16 transposes (>= 16 words of B and >= 16 blocks of scales per column), full
and partial tiles, four-row groups plus single rows, K not a multiple of the block size,
prefetching within a work item, and several threads.  The reference is the NumPy twin in
``naive_nbits.py``.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest

from qaccel.model import jitcache, nbits
from qaccel.model import nbits_kernels as kernels
from qaccel.model import quant_kernels as qk

from . import naive_nbits as naive
from .quant_helpers import assert_bitexact
from .test_nbits import operands

PACKED_CONFIGS = [
    # bits, block_size, K, zero points
    (4, 32, 1024, "packed"),  # the benchmark's layout: 128 words, 32 blocks per column
    (4, 32, 1000, "none"),  # K not a multiple of block_size
    (4, 16, 520, "float"),
    (2, 64, 1100, "packed"),
    (8, 16, 300, "packed"),
    (8, 256, 1024, "none"),
    (3, 32, 700, "packed"),  # prepared: stored as bytes; per call: the generic kernel
    (4, 16384, 20000, "packed"),  # large blocks: the int8 block term without fma
    (8, 32768, 33000, "none"),  # int32 block sums up to 127 * 255 * 32768
]


def _ref(A, ops, **kw):
    return naive.matmul_nbits(A, **ops, **kw)


@pytest.mark.parametrize("level", [0, 4])
@pytest.mark.parametrize("config", PACKED_CONFIGS, ids=str)
def test_packed_vs_naive(config, level):
    """Per call and prepared, M = 1, 2, 5, 8 (row groups of four and single rows), N = 100
    (six full tiles and a partial one): bit-exact with the twin."""
    bits, bs, K, zp_kind = config
    N = 100 if K < 10000 else 20
    ops = operands(bits, bs, K, N, zp_kind, bias=True, seed=K + bits)
    kw = dict(K=K, N=N, bits=bits, block_size=bs, accuracy_level=level)
    bias = ops.pop("bias")
    w = nbits.prepare_nbits(**ops, K=K, N=N, bits=bits, block_size=bs)
    rng = np.random.default_rng(level)
    for M in (1, 2, 5, 8) if K < 10000 else (1, 5):
        A = rng.standard_normal((M, K)).astype(np.float32)
        ref = _ref(A, dict(ops, bias=bias), **kw)
        y = nbits.matmul_nbits(A, **ops, bias=bias, **kw)
        assert_bitexact(y, ref)
        y = w.matmul(A, bias, accuracy_level=level)
        assert_bitexact(y, ref)


@pytest.mark.parametrize("level", [0, 4])
def test_packed_threads_and_items(level, monkeypatch):
    """Two threads claiming work items give the very bits of one thread."""
    K, N = 2048, 16 * kernels.TILES_PER_ITEM * 5 + 7
    ops = operands(4, 32, K, N, "packed", seed=3)
    del ops["bias"]
    kw = dict(K=K, N=N, bits=4, block_size=32)
    w = nbits.prepare_nbits(**ops, **kw)
    A = np.random.default_rng(0).standard_normal((3, K)).astype(np.float32)

    def both():
        return (
            nbits.matmul_nbits(A, **ops, **kw, accuracy_level=level),
            w.matmul(A, accuracy_level=level),
        )

    monkeypatch.setattr(qk, "PARALLEL_MIN_ELEMENTS", 1 << 62)
    one = both()
    assert_bitexact(one[0], one[1])
    monkeypatch.setattr(qk, "PARALLEL_MIN_ELEMENTS", 1)
    for _ in range(3):
        for y, ref in zip(both(), one, strict=True):
            assert_bitexact(y, ref)


def test_prepared_layout():
    """Prepared weights: column tiles of B's 32-bit words (bits 2, 4, 8) or of bytes (others),
    scales, zero-point words; read-only."""
    K, N = 256, 20
    for bits in (4, 5):
        ops = operands(bits, 32, K, N, "packed")
        w = nbits.prepare_nbits(
            ops["B"], ops["scales"], ops["zero_points"], K=K, N=N, bits=bits, block_size=32
        )
        W, S, Z, C = w._tiles
        assert W.shape[0] == S.shape[0] == Z.shape[0] == 2 and W.shape[2] == kernels.TILE
        assert C.shape == (2, 0, kernels.TILE)
        assert not any(a.flags.writeable for a in w._tiles)
        words = W.transpose(0, 2, 1).reshape(-1, W.shape[1])[:N]  # (N, words)
        if bits == 4:
            np.testing.assert_array_equal(words, ops["B"].reshape(N, -1).view(np.uint32))
        else:  # one byte per element
            q = nbits.unpack_nbits(ops["B"], bits, 32).reshape(N, -1)
            np.testing.assert_array_equal(words.view(np.uint8), q)
        assert_bitexact(
            S.transpose(0, 2, 1).reshape(-1, S.shape[1])[:N], ops["scales"]
        )
        assert not W.transpose(0, 2, 1).reshape(-1, W.shape[1])[N:].any()  # padding


def test_non_finite_A_int8_takes_the_generic_kernel():
    K, N = 512, 40
    ops = operands(4, 32, K, N, "packed")
    del ops["bias"]
    kw = dict(K=K, N=N, bits=4, block_size=32, accuracy_level=4)
    A = np.random.default_rng(0).standard_normal((2, K)).astype(np.float32)
    A[1, 7] = np.inf
    with np.errstate(all="ignore"):
        y = nbits.matmul_nbits(A, **ops, **kw)
        assert_bitexact(y, _ref(A, ops, **kw))
    assert np.isfinite(y[0]).all() and np.isnan(y[1]).all()


# --------------------------------------------------------------------------- primitives


def _dot_kernel(dpbusd):
    @numba.njit
    def dots(acc, u, s, out):
        for i in range(acc.size // 16):
            a = kernels._vload(acc, i * 16)
            x = kernels._vload(u, i * 16)
            y = kernels._vload(s, i * 16)
            kernels._vstore(out, i * 16, dpbusd(a, x, y))

    return dots


def _host_tiers():
    """The dot-product tiers this CPU can execute (the host's and every one below it)."""
    from numba.core.registry import cpu_target

    tiers = kernels.DOT_TIERS
    return tiers[tiers.index(kernels.dot_tier(cpu_target.target_context)):]


@pytest.mark.parametrize("small", [False, True])
def test_dpbusd_tiers_vs_numpy(small):
    """Every dot-product tier the CPU can run (AVX512-VNNI vpdpbusd, AVX-512BW and AVX2
    pmaddubsw / pmaddwd, plain IR), and the one the kernels use: acc + sum of four
    zext(u byte) * sext(s byte) per int32 lane, wrapping; ``small`` variants for u below 128
    (pmaddubsw's pair sums then cannot saturate), at the extremes too."""
    rng = np.random.default_rng(0)
    n = 16 * 64
    top = 128 if small else 256
    acc = rng.integers(-(2**31), 2**31, n, dtype=np.int64).astype(np.int32)
    u = rng.integers(0, top, 4 * n, dtype=np.uint8)
    s = rng.integers(-128, 128, 4 * n, dtype=np.int8)
    u[: 4 * 16], s[: 4 * 16] = top - 1, -128  # the largest products, every lane of a vector
    u[4 * 16: 8 * 16], s[4 * 16: 8 * 16] = top - 1, 127
    ref = acc.astype(np.int64) + (u.astype(np.int64) * s).reshape(n, 4).sum(1)
    ref = ref.astype(np.int32)  # wraps like int32
    variants = [kernels.DOT_VARIANTS[t, small] for t in _host_tiers()]
    variants.append(kernels._dpbusd_small if small else kernels._dpbusd)
    for dpbusd in variants:
        out = np.empty(n, np.int32)
        _dot_kernel(dpbusd)(acc, u.view(np.int32), s.view(np.int32), out)
        np.testing.assert_array_equal(out, ref)


def test_tile_columns_transposes():
    rng = np.random.default_rng(1)
    for N, nw in ((40, 37), (16, 16), (5, 3), (33, 0)):
        src = rng.integers(0, 2**32, (N, nw), dtype=np.uint64).astype(np.uint32)
        t = kernels.tile_columns(src)
        ntiles = -(-N // 16)
        assert t.shape == (ntiles, nw, 16)
        back = t.transpose(0, 2, 1).reshape(ntiles * 16, nw)
        np.testing.assert_array_equal(back[:N], src)
        assert not back[N:].any()
        f = kernels.tile_columns(src.view(np.float32))
        assert f.dtype == np.float32
        np.testing.assert_array_equal(f.view(np.uint32), t)


def test_locked_call_keys(monkeypatch):
    """Each new combination of argument types takes the lock once; a read-only array is
    another Numba type than a writable one."""
    calls = []
    monkeypatch.setattr(jitcache, "compile_lock", lambda name: _Recorder(calls, name))
    monkeypatch.setattr(jitcache, "_seen", set())
    a = np.arange(4, dtype=np.int32).reshape(2, 2)
    jitcache.locked_call(kernels.tile_columns, a)
    jitcache.locked_call(kernels.tile_columns, a)
    b = a.copy()
    b.flags.writeable = False
    t = jitcache.locked_call(kernels.tile_columns, b)
    assert t.shape == (1, 2, 16)
    assert calls == ["qaccel.model.nbits_kernels.tile_columns"] * 2


class _Recorder:
    def __init__(self, calls, name):
        self.calls, self.name = calls, name

    def __enter__(self):
        self.calls.append(self.name)

    def __exit__(self, *exc):
        return False
