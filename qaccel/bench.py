"""Benchmarks that time qaccel against ONNX Runtime side by side, in one process.

``python -m qaccel bench golden`` runs the golden model and ONNX Runtime on the same data, at
their default thread settings, alternating the two for every repeat so that load on a shared
machine hits both alike, and prints the median times and their ratio (qaccel / ORT; below 1.0
qaccel is faster) with the range of the ratios of the single repeats.  Each case also checks
that the two agree, so no ratio is for wrong work.

Neither side is timed while the other one's threads are still busy: ONNX Runtime's pool
threads spin for about 40 ms after a run (on 2 cores they take a core from whatever runs
next).  So each timed call follows an untimed call of the same side, as in
back-to-back use, and the process is idle before each side's pair of calls.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import qaccel
from qaccel import onnx_models

__all__ = ["BenchCase", "BenchRow", "format_table", "golden_cases", "run_cases"]


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
    ratios: tuple[float, ...] = ()  # qaccel / ORT of each repeat (paired, same round)

    @property
    def ratio(self) -> float:
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


def _qdq_cases(rows: int, cols: int, rng) -> list[BenchCase]:
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
                                                                block_size=block))
        ds = onnx_models.ort_session(onnx_models.dequantize_model(q, scale, zp, axis=1,
                                                                  block_size=block))
        cases += [
            BenchCase(f"QuantizeLinear f32->int8 {label}",
                      lambda x=x, s=scale, z=zp, b=block: qaccel.quantize_linear(
                          x, s, z, axis=1, block_size=b),
                      lambda x=x, sess=qs: sess.run(None, {"x": x})[0],
                      1.0, _bit_mismatches),
            BenchCase(f"DequantizeLinear int8->f32 {label}",
                      lambda q=q, s=scale, z=zp, b=block: qaccel.dequantize_linear(
                          q, s, z, axis=1, block_size=b),
                      lambda q=q, sess=ds: sess.run(None, {"x": q})[0],
                      1.0, _bit_mismatches),
        ]
    return cases


def _matmul_nbits_cases(K: int, N: int, ms, rng) -> list[BenchCase]:
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
                    onnx_models.matmul_nbits_model(A, B, scales, zp, **kw))
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
                    3.0, _relative_error))
    return cases


def golden_cases(*, quick: bool = False, seed: int = 0) -> list[BenchCase]:
    """The golden-model benchmark: Q/DQ on 16M elements, MatMulNBits int4 at K = N = 4096.

    ``quick`` shrinks the sizes (256 x 256, K = N = 256) for a smoke run."""
    rng = np.random.default_rng(seed)
    side = 256 if quick else 4096
    return _qdq_cases(side, side, rng) + _matmul_nbits_cases(side, side, (1, 16), rng)


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


def run_cases(
    cases: list[BenchCase], *, repeat: int = 7, progress=None, settle: bool = True
) -> list[BenchRow]:
    """Time every case: one warm-up call each (JIT compile, session set-up), then ``repeat``
    rounds of, for qaccel and then ORT: wait until the process is idle, one untimed call, one
    timed call.  Report the medians and the per-round ratios.  ``settle=False`` times the
    calls straight after one another instead (each side then shares the cores with what the
    other side's threads still do)."""
    rows = []
    for case in cases:
        agreement = case.agreement(case.qaccel(), case.ort())
        times = {"qaccel": [], "ort": []}
        for _ in range(repeat):
            for label, fn in (("qaccel", case.qaccel), ("ort", case.ort)):
                if settle:
                    _wait_idle()
                    fn()
                t0 = time.perf_counter()
                fn()
                times[label].append(time.perf_counter() - t0)
        ratios = tuple(q / o for q, o in zip(times["qaccel"], times["ort"], strict=True))
        rows.append(BenchRow(case.name, 1e3 * statistics.median(times["qaccel"]),
                             1e3 * statistics.median(times["ort"]), case.target, agreement,
                             ratios))
        if progress is not None:
            progress(rows[-1])
    return rows


def format_table(rows: list[BenchRow]) -> str:
    """Render rows as a fixed-width table (median ms, ratio of the medians and the range of
    the per-round ratios, target, agreement)."""
    width = max(len(r.name) for r in rows)
    lines = [f"{'case':<{width}}  {'qaccel ms':>10}  {'ORT ms':>9}  {'ratio':>6}  "
             f"{'rounds':>13}  {'target':>7}  agreement"]
    for r in rows:
        mark = "ok" if r.meets_target else "OVER"
        spread = f"{min(r.ratios):.2f}-{max(r.ratios):.2f}" if r.ratios else "-"
        lines.append(f"{r.name:<{width}}  {r.qaccel_ms:10.2f}  {r.ort_ms:9.2f}  {r.ratio:6.2f}  "
                     f"{spread:>13}  <={r.target:<4.1f}{mark:>3}  {r.agreement}")
    return "\n".join(lines)
