"""Kernel building blocks: 16-bit float conversions, threads and output buffer recycling."""

from __future__ import annotations

import os

import ml_dtypes
import numba
import numpy as np
import pytest

from qaccel.model import quant_kernels as qk
from qaccel.model.quant import dequantize_linear, quantize_linear

from . import naive_quant
from .quant_helpers import assert_bitexact


@numba.njit
def _map(fn, values, out):
    for i in range(values.size):
        out[i] = fn(values[i])


@numba.njit
def _map_round(values, fmt, out):
    for i in range(values.size):
        out[i] = qk.round_to_format(values[i], fmt)


def _float32_probe() -> np.ndarray:
    """Random bit patterns (NaN payloads included), every 16-bit value widened, the ties
    between neighbouring float16 / bfloat16 values and their float32 neighbours."""
    rng = np.random.default_rng(5)
    patterns = rng.integers(0, 2**32, 2_000_000, dtype=np.uint64).astype(np.uint32)
    all16 = np.arange(2**16, dtype=np.uint16)
    widened = [all16.view(np.float16).astype(np.float32), all16.view(ml_dtypes.bfloat16)]
    f16 = np.sort(all16.view(np.float16)[np.isfinite(all16.view(np.float16))].astype(np.float64))
    with np.errstate(invalid="ignore"):
        bf16 = all16.view(ml_dtypes.bfloat16).astype(np.float64)
    bf16 = np.sort(bf16[np.isfinite(bf16)])
    ties = [(a[1:] + a[:-1]) / 2 for a in (f16, bf16)] + [np.array([65520.0, -65520.0])]
    ties = np.concatenate(ties).astype(np.float32)
    neighbours = [np.nextafter(ties, np.float32(np.inf)), np.nextafter(ties, np.float32(-np.inf))]
    values = [patterns.view(np.float32), *(w.astype(np.float32) for w in widened), ties]
    return np.concatenate(values + neighbours)


PROBE = _float32_probe()


def test_float32_to_float16_bits_is_numpys_cast():
    out = np.empty(PROBE.size, np.uint16)
    _map(qk.f32_to_f16_bits, PROBE, out)
    with np.errstate(over="ignore"):
        assert_bitexact(out.view(np.float16), PROBE.astype(np.float16))


def test_float32_to_bfloat16_bits_is_ml_dtypes_cast():
    out = np.empty(PROBE.size, np.uint16)
    _map(qk.f32_to_bf16_bits, PROBE, out)
    with np.errstate(invalid="ignore"):
        assert_bitexact(out.view(ml_dtypes.bfloat16), PROBE.astype(ml_dtypes.bfloat16))


def test_float16_bits_to_float32_is_exact():
    patterns = np.arange(2**16, dtype=np.uint16)
    out = np.empty(patterns.size, np.float32)
    _map(qk.f16_bits_to_f32, patterns, out)
    assert_bitexact(out, patterns.view(np.float16).astype(np.float32))


@pytest.mark.parametrize(
    "fmt,dtype", [(qk.FMT_F16, np.float16), (qk.FMT_BF16, ml_dtypes.bfloat16)], ids=str
)
def test_round_to_format(fmt, dtype):
    finite = PROBE[~np.isnan(PROBE)]
    out = np.empty(finite.size, np.float32)
    _map_round(finite, fmt, out)
    with np.errstate(over="ignore"):
        assert_bitexact(out, finite.astype(dtype).astype(np.float32))


def test_threads_give_the_same_bits(monkeypatch):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((640, 1000), np.float32) * 100  # 10 work items
    scale = rng.uniform(0.5, 2, (640, 32)).astype(np.float32)
    kwargs = {"axis": 1, "block_size": 32, "output_dtype": np.int8}
    monkeypatch.setattr(qk, "PARALLEL_MIN_ELEMENTS", 1 << 62)
    expected = quantize_linear(x, scale, **kwargs)
    dq = dequantize_linear(expected, scale, axis=1, block_size=32)
    monkeypatch.setattr(qk, "PARALLEL_MIN_ELEMENTS", 0)
    for _ in range(5):  # threads claim the items in a different order each time
        assert_bitexact(quantize_linear(x, scale, **kwargs), expected)
        assert_bitexact(dequantize_linear(expected, scale, axis=1, block_size=32), dq)


@pytest.mark.parametrize("offset", [0, 1, 17, 63])
@pytest.mark.parametrize("zero_point", [np.int8(3), np.int8(-128), np.uint8(128), np.uint8(0)])
def test_long_runs_to_8_bits_with_line_stores(offset, zero_point):
    """Per-tensor float32 -> int8/uint8 runs of NT_MIN_RUN and more go out in 64-byte lines
    with non-temporal stores (a scalar head up to the first aligned line, a scalar tail):
    bit-exact with the naive model for any alignment of x, ties, saturation, inf and NaN."""
    rng = np.random.default_rng(offset)
    for n in (qk.NT_MIN_RUN - 1, qk.NT_MIN_RUN, 3 * qk.ITEM_ELEMENTS + 77):
        x = (rng.standard_normal(n + offset) * 120).astype(np.float32)[offset:]
        x[::97], x[5::101], x[7::103] = np.nan, np.inf, -np.inf
        x[9::89] = np.float32(0.5) * rng.integers(-600, 600, x[9::89].size)  # ties
        want = naive_quant.quantize(x, np.float32(0.5), zero_point)
        assert_bitexact(quantize_linear(x, np.float32(0.5), zero_point), want)


@pytest.mark.parametrize("offset", [0, 1, 5, 63])
@pytest.mark.parametrize("zero_point", [np.int8(3), np.int8(-128), np.uint8(255), np.uint8(0)])
def test_long_runs_of_8_bit_codes_dequantised_with_line_stores(offset, zero_point):
    """Per-tensor int8/uint8 -> float32 runs of NT_MIN_RUN and more go out in 64-byte lines of
    16 floats with non-temporal stores (scalar head and tail): bit-exact with the naive model
    for any alignment of x and of the output, every code, and scales that round."""
    rng = np.random.default_rng(offset)
    info = np.iinfo(zero_point.dtype)
    # small outputs start anywhere on 16 bytes; large ones (recycled) on a line
    for n in (qk.NT_MIN_RUN - 1, qk.NT_MIN_RUN, 3 * qk.ITEM_ELEMENTS + 77,
              qk.RECYCLE_MIN_BYTES // 4 + 77):
        x = rng.integers(info.min, info.max + 1, n + offset, dtype=zero_point.dtype)[offset:]
        for scale in (np.float32(0.1), np.float32(3.0e38), np.float32(1e-45)):
            want = naive_quant.dequantize(x, scale, zero_point)
            assert_bitexact(dequantize_linear(x, scale, zero_point), want)


@pytest.mark.parametrize("block", [8, 16, 32, 48, 64, 192, qk.NT_MIN_RUN])
@pytest.mark.parametrize("codes", [np.int8, np.uint8])
def test_blocked_runs_to_8_bits_with_vector_stores(block, codes):
    """Blocked float32 -> int8/uint8 along the last axis: blocks of 16 and 32 go out four or
    two to a 64-byte line, multiples of 64 a line at a time, other multiples of 16 in 16-code
    stores, the rest (and unaligned runs) element by element.  Bit-exact with the naive model
    for rows that start on any 16-byte boundary or none, partial first blocks (work items that
    split a row), partial last blocks, ties, saturation, inf and NaN; large outputs (recycled,
    line aligned) and small ones."""
    rng = np.random.default_rng(block)
    for rows, cols, offset in ((3, 1000, 0), (5, 4096 + 48, 1), (2, 3 * qk.ITEM_ELEMENTS + 80, 0),
                               (300, 4096, 3)):
        x = (rng.standard_normal(rows * cols + offset) * 120).astype(np.float32)[offset:]
        x = x.reshape(rows, cols)
        flat = x.reshape(-1)
        flat[::97], flat[5::101], flat[7::103] = np.nan, np.inf, -np.inf
        flat[9::89] = np.float32(0.5) * rng.integers(-600, 600, flat[9::89].size)  # ties
        n_blocks = -(-cols // block)
        scale = rng.choice(np.float32([0.5, 0.25, 1.0, 3.0]), (rows, n_blocks))
        zero_point = rng.integers(np.iinfo(codes).min, np.iinfo(codes).max + 1,
                                  (rows, n_blocks), dtype=codes)
        want = naive_quant.quantize(x, scale, zero_point, axis=1, block_size=block)
        assert_bitexact(quantize_linear(x, scale, zero_point, axis=1, block_size=block), want)


def test_run_items_claims_every_item_once():
    """Every work item is claimed and counted once, by whichever thread: the calling thread
    alone when the helpers start late, or all of them."""
    n = 37
    for parallel in (1 << 62, 0):
        seen = np.zeros(n + 64, np.int64)
        qk.PARALLEL_MIN_ELEMENTS, saved = parallel, qk.PARALLEL_MIN_ELEMENTS
        try:
            qk.run_items(_count_items, n, 1, seen)
        finally:
            qk.PARALLEL_MIN_ELEMENTS = saved
        np.testing.assert_array_equal(seen[:n], 1)
        assert not seen[n:].any()


def test_run_items_honours_numba_set_num_threads(monkeypatch):
    """``numba.set_num_threads(1)`` keeps a large job on the calling thread (no helpers), as it
    does Numba's own parallel kernels; the default uses the helpers."""
    n = 37
    monkeypatch.setattr(qk, "PARALLEL_MIN_ELEMENTS", 0)
    calls = []
    real = qk._get_helpers
    monkeypatch.setattr(qk, "_get_helpers", lambda k: calls.append(k) or real(k))
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        seen = np.zeros(n, np.int64)
        qk.run_items(_count_items, n, 1, seen)
    finally:
        numba.set_num_threads(before)
    np.testing.assert_array_equal(seen, 1)
    assert calls == []
    if qk._n_threads() > 1:
        qk.run_items(_count_items, n, 1, np.zeros(n, np.int64))
        assert calls == [qk._n_threads() - 1]


@pytest.mark.skipif(qk._n_threads() < 2, reason="needs two CPUs")
def test_run_items_binds_threads_to_cpus_of_their_own_and_restores_the_caller(monkeypatch):
    """During a parallel job the caller stays on its CPU and the helpers on the others; the
    caller's own binding is back afterwards, also when a helper's item fails."""
    monkeypatch.setattr(qk, "PARALLEL_MIN_ELEMENTS", 0)
    before = os.sched_getaffinity(0)
    seen = np.zeros(64, np.int64)
    qk.run_items(_count_items, 64, 1, seen)
    np.testing.assert_array_equal(seen, 1)
    assert os.sched_getaffinity(0) == before
    if qk._getcpu is not None:
        cpu, allowed = qk._helpers.placed_for
        assert allowed == before
        for thread in qk._helpers.threads:
            assert os.sched_getaffinity(thread.native_id) <= before - {cpu}
    for _ in range(20):  # the failing item goes to the caller or to a helper
        with pytest.raises(ValueError, match="item 5 failed"):
            qk.run_items(_fail_at_item_5, 64, 1, np.zeros(64, np.int64))
        assert os.sched_getaffinity(0) == before


@numba.njit(nogil=True)
def _fail_at_item_5(items, seen):
    w = qk.next_item(items)
    while w < items[2]:
        if w == 5:
            raise ValueError("item 5 failed")
        seen[w] += 1
        qk.item_done(items)
        w = qk.next_item(items)


@numba.njit(nogil=True)
def _count_items(items, seen):
    w = qk.next_item(items)
    while w < items[2]:
        seen[w] += 1
        qk.item_done(items)
        w = qk.next_item(items)


def test_output_buffers_are_recycled_only_when_unreferenced():
    q = np.ones((1024, 1024), np.int8)
    first = dequantize_linear(q, np.float32(2))
    address = first.ctypes.data
    assert address % qk.LINE == 0               # large outputs start on a 64-byte line
    del first
    second = dequantize_linear(q, np.float32(3))
    assert second.ctypes.data == address  # nothing referenced the first output any more
    view = second[::7]
    del second
    third = dequantize_linear(q, np.float32(4))
    assert third.ctypes.data != address and (view == 3).all()
    memory = memoryview(third)
    address = third.ctypes.data
    del third, view
    fourth = dequantize_linear(q, np.float32(5))
    assert fourth.ctypes.data != address
    assert (np.frombuffer(memory, np.float32) == 4).all() and (fourth == 5).all()


def test_small_outputs_are_not_recycled():
    out = qk.output_buffer(100, np.float32)
    assert out.flags.owndata and out.base is None


def test_ensure_compiled_locks_once_per_argument_types(monkeypatch):
    from qaccel.model import jitcache

    locked = []

    class Recorder:
        def __enter__(self):
            locked.append(1)

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(jitcache, "compile_lock", lambda name: Recorder())

    @numba.njit
    def dispatcher(array, n):
        return n

    arrays = [np.zeros(2, np.float32), np.ones(3, np.float32), np.zeros(2, np.int8)]
    for array in arrays:
        jitcache.ensure_compiled(dispatcher, array, 1)
    assert len(locked) == 2  # float32 twice, then int8
