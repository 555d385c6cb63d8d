"""Benchmarks that time qaccel against ONNX Runtime side by side, in one process.

``python -m qaccel bench golden`` runs the golden model and ONNX Runtime on the same data, at
one thread and at their default thread settings, alternating the two in every round so that
load on a shared machine hits both alike, and prints per case the median times and the median
of the per-round ratios qaccel / ORT (below 1.0 qaccel is faster) with their range, against
the target (Q/DQ at most 1.0, MatMulNBits at most 1.5). The CPU and its ISA tier head the
table. Each case also checks that the two agree, so no ratio is for wrong work.

Neither side is timed while the other one's threads are still busy: ONNX Runtime's pool
threads spin for about 40 ms after a run (on 2 cores they take a core from whatever runs
next).  So each timed call follows an untimed call of the same side, as in
back-to-back use, and the process is idle before each side's pair of calls.
"""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numba
import numpy as np

import qaccel
from qaccel import onnx_models
from qaccel.model.validate import check_int

__all__ = ["BenchCase", "BenchRow", "cpu_info", "format_table", "golden_cases", "kernel_tier",
           "run_cases", "thread_scaling", "time_call"]

#: Target ratios qaccel / ORT: Q/DQ lines, MatMulNBits lines.
QDQ_TARGET = 1.0
NBITS_TARGET = 1.5
#: Rounds per case by default (each gives one paired ratio).
DEFAULT_REPEAT = 9


def cpu_info() -> tuple[str, str]:
    """The CPU's model name and the widest x86 SIMD tier its flags show: ``AVX-512 VNNI``,
    ``AVX-512``, ``AVX2`` (``+ AVX-VNNI``), ``below AVX2``; AMX-INT8 noted when present."""
    fields = {}
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())      # the first core's
    name = fields.get("model name") or platform.processor() or platform.machine()
    flags = set(fields.get("flags", "").split())
    if {"avx512f", "avx512_vnni"} <= flags:
        tier = "AVX-512 VNNI"
    elif "avx512f" in flags:
        tier = "AVX-512"
    elif "avx2" in flags:
        tier = "AVX2" + (" + AVX-VNNI" if "avx_vnni" in flags else "")
    else:
        tier = "below AVX2" if flags else "unknown (no /proc/cpuinfo flags)"
    if "amx_int8" in flags:
        tier += ", AMX-INT8 present too"
    return name, tier


def kernel_tier() -> str:
    """The dot-product tier qaccel's MatMulNBits kernels are compiled for
    (:data:`qaccel.model.nbits_kernels.DOT_TIERS`): the CPU's own, or the one
    ``NUMBA_CPU_NAME`` / ``NUMBA_CPU_FEATURES`` name (then said so)."""
    from numba.core import config
    from numba.core.registry import cpu_target

    from qaccel.model.nbits_kernels import dot_tier

    tier = dot_tier(cpu_target.target_context)
    if config.CPU_NAME:
        tier += f" (NUMBA_CPU_NAME={config.CPU_NAME})"
    return tier


@dataclass(frozen=True)
class BenchCase:
    """One comparison: two callables on the same data, a target ratio, an agreement check."""

    name: str
    qaccel: Callable[[], np.ndarray]
    ort: Callable[[], np.ndarray]
    target: float
    agreement: Callable[[np.ndarray, np.ndarray], str]


@dataclass(frozen=True)
class BenchRow:
    name: str
    qaccel_ms: float
    ort_ms: float
    target: float
    agreement: str
    ratios: tuple[float, ...] = ()  # qaccel / ORT of each round (paired, same round)
    threads: int = 0                # 0: both sides' defaults

    @property
    def ratio(self) -> float:
        """The median of the per-round ratios (the ratio of the medians without rounds)."""
        if self.ratios:
            return statistics.median(self.ratios)
        return self.qaccel_ms / self.ort_ms

    @property
    def meets_target(self) -> bool:
        return self.ratio <= self.target


def _bit_mismatches(a: np.ndarray, b: np.ndarray) -> str:
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"MISMATCH {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
    n = int(np.count_nonzero(a.view(np.uint8) != b.view(np.uint8)))
    return "bit-exact" if n == 0 else f"{n} bytes differ"


def _relative_error(a: np.ndarray, b: np.ndarray) -> str:
    err = float(np.max(np.abs(a.astype(np.float64) - b)))
    return f"max|d|/max|y| {err / float(np.max(np.abs(b))):.1e}"


def _qdq_cases(rows: int, cols: int, rng, threads: int) -> list[BenchCase]:
    x = (rng.standard_normal((rows, cols)) * 3).astype(np.float32)
    q = rng.integers(-128, 128, (rows, cols), dtype=np.int8)
    granularities = {
        "per-tensor": (np.float32(0.02), np.int8(3), 0),
        "per-axis": (rng.uniform(0.01, 0.05, cols).astype(np.float32),
                     rng.integers(-8, 8, cols, dtype=np.int8), 0),
        "blocked 32": (rng.uniform(0.01, 0.05, (rows, -(-cols // 32))).astype(np.float32),
                       rng.integers(-8, 8, (rows, -(-cols // 32)), dtype=np.int8), 32),
    }
    cases = []
    for label, (scale, zp, block) in granularities.items():
        qs = onnx_models.ort_session(onnx_models.quantize_model(x, scale, zp, axis=1,
                                                                block_size=block),
                                     threads=threads)
        ds = onnx_models.ort_session(onnx_models.dequantize_model(q, scale, zp, axis=1,
                                                                  block_size=block),
                                     threads=threads)
        cases += [
            BenchCase(f"QuantizeLinear f32->int8 {label}",
                      lambda x=x, s=scale, z=zp, b=block: qaccel.quantize_linear(
                          x, s, z, axis=1, block_size=b),
                      lambda x=x, sess=qs: sess.run(None, {"x": x})[0],
                      QDQ_TARGET, _bit_mismatches),
            BenchCase(f"DequantizeLinear int8->f32 {label}",
                      lambda q=q, s=scale, z=zp, b=block: qaccel.dequantize_linear(
                          q, s, z, axis=1, block_size=b),
                      lambda q=q, sess=ds: sess.run(None, {"x": q})[0],
                      QDQ_TARGET, _bit_mismatches),
        ]
    return cases


def _matmul_nbits_cases(K: int, N: int, ms, rng, threads: int) -> list[BenchCase]:
    """MatMulNBits two ways: ``matmul_nbits`` per call (validating and laying out B in every
    call), and ``NBitsWeights.matmul`` on weights prepared once outside the timed region, as
    ORT prepacks B at session creation, outside its timed run."""
    from qaccel.model.nbits import prepare_nbits

    bits, block = 4, 32
    W = (rng.standard_normal((K, N)) * 0.02).astype(np.float32)
    B, scales, zp = qaccel.quantize_weights_nbits(W, bits=bits, block_size=block,
                                                  symmetric=False)
    weights = prepare_nbits(B, scales, zp, K=K, N=N, bits=bits, block_size=block)
    cases = []
    for prepared in (False, True):
        for level in (0, 4):
            for m in ms:
                A = rng.standard_normal((m, K)).astype(np.float32)
                kw = dict(K=K, N=N, bits=bits, block_size=block, accuracy_level=level)
                sess = onnx_models.ort_session(
                    onnx_models.matmul_nbits_model(A, B, scales, zp, **kw), threads=threads)
                if prepared:
                    name = "prepared"
                    fn = lambda A=A, lv=level: weights.matmul(A, accuracy_level=lv)  # noqa: E731
                else:
                    name = "per call"
                    fn = lambda A=A, kw=kw: qaccel.matmul_nbits(A, B, scales, zp, **kw)  # noqa: E731
                cases.append(BenchCase(
                    f"MatMulNBits int4 bs32 K=N={K} M={m} level {level} {name}",
                    fn,
                    lambda A=A, sess=sess: sess.run(None, {"A": A})[0],
                    NBITS_TARGET, _relative_error))
    return cases


def golden_cases(*, quick: bool = False, seed: int = 0, threads: int = 0) -> list[BenchCase]:
    """The golden-model benchmark: Q/DQ on 16M elements, MatMulNBits int4 at K = N = 4096,
    with ONNX Runtime sessions of ``threads`` intra-op threads (0: its default); run them with
    :func:`run_cases` at the same ``threads`` for qaccel.

    ``quick`` shrinks the sizes (256 x 256, K = N = 256) for a smoke run."""
    rng = np.random.default_rng(seed)
    side = 256 if quick else 4096
    return (_qdq_cases(side, side, rng, threads)
            + _matmul_nbits_cases(side, side, (1, 16), rng, threads))


@contextlib.contextmanager
def _numba_threads(threads: int):
    """qaccel's kernels on ``threads`` threads inside the block (0: all of Numba's)."""
    before = numba.get_num_threads()
    numba.set_num_threads(threads or numba.config.NUMBA_NUM_THREADS)
    try:
        yield
    finally:
        numba.set_num_threads(before)


def _wait_idle(timeout: float = 1.0) -> None:
    """Return once this process uses (almost) no CPU time: ORT's spinning threads are asleep.

    (ORT 1.31's pool threads spin for about 40 ms after a run.)  The window is longer than a
    scheduler tick: the CPU time of threads running on other cores is only counted per tick.
    """
    end = time.perf_counter() + timeout
    while time.perf_counter() < end:
        c0 = time.process_time()
        time.sleep(0.012)
        if time.process_time() - c0 < 1e-3:
            return


def _timed_call(fn: Callable[[], object], settle: bool) -> float:
    """Seconds of one call of ``fn``; with ``settle``, once the process is idle and after
    one untimed call (warm caches, ORT's threads asleep)."""
    if settle:
        _wait_idle()
        fn()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def time_call(fn: Callable[[], object], *, repeat: int = DEFAULT_REPEAT,
              settle: bool = True) -> float:
    """The median seconds of ``repeat`` calls of ``fn``, each timed as :func:`run_cases`
    times a side (after one warm-up call): the timer of ``qaccel bench`` for one callable,
    e.g. an ORT session's ``run`` in a notebook."""
    check_int("repeat", repeat, 1)
    fn()
    return statistics.median(_timed_call(fn, settle) for _ in range(repeat))


def run_cases(
    cases: list[BenchCase], *, repeat: int = DEFAULT_REPEAT, progress=None,
    settle: bool = True, threads: int = 0
) -> list[BenchRow]:
    """Time every case: one warm-up call each (JIT compile, session set-up), then ``repeat``
    rounds of, for qaccel and then ORT: wait until the process is idle, one untimed call, one
    timed call.  Report the medians and the per-round ratios (the row's ratio is their
    median).  qaccel runs on ``threads`` Numba threads (0: all), which should match the ORT
    sessions' (:func:`golden_cases`).  ``settle=False`` times the calls straight after one
    another instead (each side then shares the cores with what the other side's threads still
    do)."""
    check_int("repeat", repeat, 1)
    check_int("threads", threads, 0)
    rows = []
    with _numba_threads(threads):
        for case in cases:
            agreement = case.agreement(case.qaccel(), case.ort())
            times = {"qaccel": [], "ort": []}
            for _ in range(repeat):
                for label, fn in (("qaccel", case.qaccel), ("ort", case.ort)):
                    times[label].append(_timed_call(fn, settle))
            ratios = tuple(q / o for q, o in zip(times["qaccel"], times["ort"], strict=True))
            rows.append(BenchRow(case.name, 1e3 * statistics.median(times["qaccel"]),
                                 1e3 * statistics.median(times["ort"]), case.target,
                                 agreement, ratios, threads))
            if progress is not None:
                progress(rows[-1])
    return rows


def format_table(rows: list[BenchRow]) -> str:
    """Render rows as a fixed-width table (median ms, the median per-round ratio and the
    range of the per-round ratios, target, agreement), a section per thread setting."""
    width = max(len(r.name) for r in rows)
    lines = []
    for threads in dict.fromkeys(r.threads for r in rows):
        if len(lines):
            lines.append("")
        lines.append("one thread each:" if threads == 1 else
                     f"{threads} threads each:" if threads else
                     f"default threads (numba {numba.config.NUMBA_NUM_THREADS}, ORT its "
                     "default intra-op threads):")
        lines += _table_lines([r for r in rows if r.threads == threads], width)
    return "\n".join(lines)


def _table_lines(rows: list[BenchRow], width: int) -> list[str]:
    lines = [f"{'case':<{width}}  {'qaccel ms':>10}  {'ORT ms':>9}  {'ratio':>6}  "
             f"{'rounds':>13}  {'target':>7}  agreement"]
    for r in rows:
        mark = "ok" if r.meets_target else "OVER"
        spread = f"{min(r.ratios):.2f}-{max(r.ratios):.2f}" if r.ratios else "-"
        lines.append(f"{r.name:<{width}}  {r.qaccel_ms:10.2f}  {r.ort_ms:9.2f}  {r.ratio:6.2f}  "
                     f"{spread:>13}  <={r.target:<4.1f}{mark:>3}  {r.agreement}")
    return lines


# --- thread scaling ---------------------------------------------------------------------------

#: A thread-scaling ratio (default threads / one) above this counts as slower (noise allowance).
SLOWER_ABOVE = 1.05


def _scaling_cases(quick: bool, rng) -> list[tuple[str, Callable[[], np.ndarray]]]:
    from qaccel.model.nbits import prepare_nbits

    cases = []
    s, z = np.float32(0.02), np.int8(1)
    for n in ((1 << 16, 1 << 18) if quick else (1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24)):
        x = (rng.standard_normal(n) * 3).astype(np.float32).reshape(-1, 256)
        q = rng.integers(-128, 128, n, dtype=np.int8).reshape(-1, 256)
        sb = rng.uniform(0.01, 0.05, (x.shape[0], 8)).astype(np.float32)
        zb = np.zeros((x.shape[0], 8), np.int8)
        cases += [
            (f"Q per-tensor {n} elements", lambda x=x: qaccel.quantize_linear(x, s, z)),
            (f"DQ per-tensor {n} elements", lambda q=q: qaccel.dequantize_linear(q, s, z)),
            (f"Q blocked 32 {n} elements", lambda x=x, sb=sb, zb=zb: qaccel.quantize_linear(
                x, sb, zb, axis=1, block_size=32)),
            (f"DQ blocked 32 {n} elements", lambda q=q, sb=sb, zb=zb: qaccel.dequantize_linear(
                q, sb, zb, axis=1, block_size=32)),
        ]
    for side in ((256,) if quick else (256, 1024, 4096)):
        W = (rng.standard_normal((side, side)) * 0.02).astype(np.float32)
        B, scales, zp = qaccel.quantize_weights_nbits(W, bits=4, block_size=32, symmetric=False)
        weights = prepare_nbits(B, scales, zp, K=side, N=side, bits=4, block_size=32)
        for m in (1, 4, 16):
            A = rng.standard_normal((m, side)).astype(np.float32)
            for level in (0, 4):
                cases.append((f"MatMulNBits int4 K=N={side} M={m} level {level} prepared",
                              lambda A=A, lv=level, w=weights: w.matmul(A, accuracy_level=lv)))
    return cases


def thread_scaling(*, quick: bool = False, repeat: int = DEFAULT_REPEAT, seed: int = 0
                   ) -> list[tuple[str, float, float, float]]:
    """qaccel alone at one thread and at its default threads, interleaved round by round
    (two untimed calls, then a timed one, per setting): per case ``(name, one-thread ms,
    default ms, median per-round ratio default / one)``. Q/DQ per tensor and blocked from
    64K to 16M elements, MatMulNBits (prepared int4 weights) at K = N = 256, 1024, 4096 and
    M = 1, 4, 16, levels 0 and 4."""
    check_int("repeat", repeat, 1)
    rows = []
    for name, fn in _scaling_cases(quick, np.random.default_rng(seed)):
        times = {1: [], 0: []}
        for _ in range(repeat):
            for threads in (1, 0):
                with _numba_threads(threads):
                    fn()
                    fn()
                    t0 = time.perf_counter()
                    fn()
                    times[threads].append(time.perf_counter() - t0)
        ratio = statistics.median(d / o for o, d in zip(times[1], times[0], strict=True))
        rows.append((name, 1e3 * statistics.median(times[1]), 1e3 * statistics.median(times[0]),
                     ratio))
    return rows


def format_scaling(rows) -> str:
    """Render :func:`thread_scaling`'s rows; a ratio above :data:`SLOWER_ABOVE` is marked
    SLOWER (more threads slower than one)."""
    width = max(len(r[0]) for r in rows)
    default = f"{numba.config.NUMBA_NUM_THREADS} threads ms"
    lines = [f"{'case':<{width}}  {'1 thread ms':>11}  {default:>13}  {'ratio':>6}"]
    for name, one, default, ratio in rows:
        mark = "SLOWER" if ratio > SLOWER_ABOVE else ""
        lines.append(f"{name:<{width}}  {one:11.3f}  {default:13.3f}  {ratio:6.2f}  {mark}")
    return "\n".join(lines)
