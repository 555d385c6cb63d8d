"""MatMulNBits on the simulated engine, with its report: ``qaccel sim matmul-nbits`` and the
GEMV of ``make demo``.

A float32 weight ``W (K, N)`` is quantised by qaccel's quantiser (bit-exact with ONNX
Runtime's), ``A (M, K)`` is random; :meth:`qaccel.RTL.matmul_nbits` runs the call on the
engine and checks every output bit for bit against the engine-order model; the report gives
the cycles, the MAC utilisation (MACs per cycle against ``pe * simd``, and against the weight
bus bound) and the error against the golden model and ONNX Runtime as a fraction of
``sum_k |a_k w_k|`` (the tolerance is 1e-6).
"""

from __future__ import annotations

import numpy as np

from qaccel.model.config import ZERO_POINTS

__all__ = ["ZERO_POINTS", "nbits_example", "run_report"]


def nbits_example(*, K: int, N: int, M: int, bits: int, block_size: int,
                  zero_points: str = "packed", bias: bool = False, seed: int = 0) -> dict:
    """Keyword arguments of a realistic ``matmul_nbits`` call (without accuracy_level)."""
    import qaccel

    if zero_points not in ZERO_POINTS:
        raise ValueError(f"zero_points must be one of {', '.join(ZERO_POINTS)}, "
                         f"not {zero_points!r}")
    rng = np.random.default_rng(seed)
    W = (rng.standard_normal((K, N)) * 0.02).astype(np.float32)
    B, scales, zp = qaccel.quantize_weights_nbits(W, bits=bits, block_size=block_size,
                                                  symmetric=zero_points == "none")
    if zero_points == "float":
        zp = (rng.random(scales.shape) * (2**bits - 1)).astype(np.float32)
    return dict(A=rng.standard_normal((M, K)).astype(np.float32), B=B, scales=scales,
                zero_points=zp, bias=(rng.standard_normal(N) * 0.1).astype(np.float32)
                if bias else None, K=K, N=N, bits=bits, block_size=block_size)


def run_report(rtl, call: dict, accuracy_level: int, *, indent: str = "  ") -> bool:
    """Run ``call`` on ``rtl`` (a :class:`qaccel.RTL` with ``check=True``), print the report;
    return whether every check passed."""
    import qaccel
    from qaccel import onnx_models
    from qaccel.engine import RTLMismatchError

    c = rtl.config
    K, N, bits = call["K"], call["N"], call["bits"]
    try:
        y = rtl.matmul_nbits(**call, accuracy_level=accuracy_level)
        verdict, ok = "bit-exact with the engine-order model (qaccel.model.nbits_hw)", True
    except RTLMismatchError as e:
        y, verdict, ok = None, f"DIFFERENT: {e}", False
    r = rtl.last_run
    peak = c.pe * c.simd
    bus_peak = min(peak, c.weight_bus_width / bits)
    rate = r.elements / r.cycles if r.cycles else 0.0
    lines = [
        f"passes {r.beats} ({-(-N // c.pe)} column groups x {call['A'].shape[0]} rows), "
        f"{r.elements:,} MACs in {r.cycles:,} cycles: {rate:.2f} MACs/cycle",
        f"MAC utilisation {rate / peak:.1%} of pe x simd = {peak} "
        f"({rate / bus_peak:.1%} of the weight-bus bound {bus_peak:g} for {bits}-bit codes); "
        f"latency {r.latency} cycles",
        f"{r.simulator} ({r.harness}) {r.wall_time:.1f} s wall; build "
        f"{'reused' if r.build_reused else 'compiled'}",
        f"RTL: {verdict}",
    ]
    if y is not None:
        kw = {k: v for k, v in call.items() if k != "A"}
        A = call["A"]
        golden = qaccel.matmul_nbits(A, **kw, accuracy_level=accuracy_level)
        W = qaccel.matmul_nbits(np.eye(K, dtype=np.float32),
                                **{**kw, "bias": None}, accuracy_level=0)
        bound = np.abs(A).astype(np.float64) @ np.abs(W).astype(np.float64) + 1e-30
        refs = [("golden model", golden)]
        try:
            model = onnx_models.matmul_nbits_model(A, **kw, accuracy_level=accuracy_level)
            refs.append(("ONNX Runtime", onnx_models.ort_session(model).run(None, {"A": A})[0]))
        except Exception as e:  # ORT's CPU kernel takes bits 2, 4, 8 only
            lines.append(f"ONNX Runtime: not compared ({type(e).__name__}: "
                         f"{str(e).splitlines()[0][:100]})")
        for name, ref in refs:
            err = float(np.max(np.abs(y.astype(np.float64) - ref) / bound))
            ok &= err <= 1e-6
            lines.append(f"vs {name}: max |y - ref| / sum|a*w| = {err:.2e} (tolerance 1e-6)")
    print("\n".join(indent + line for line in lines), flush=True)
    return ok
