"""MatMulNBits on the simulated engine, with its report: ``qaccel sim matmul-nbits`` and the
GEMV of ``make demo``.

A float32 weight ``W (K, N)`` is quantised by qaccel's quantiser (bit-exact with ONNX
Runtime's), ``A (M, K)`` is random; :meth:`qaccel.RTL.matmul_nbits` runs the call on the
engine (v2) and checks every output bit for bit against the engine's model
(:func:`qaccel.model.nbits_hw.matmul_nbits_v2`). The report gives its cycles beside the
performance model's (:func:`qaccel.explore.perf.nbits_v2_call`, which must be equal on the
stream harness without pauses), the MACs per cycle and the utilisation against the array's
peak (``pe * simd``, half at 5..8 bits), for the int8 path (accuracy_level 4, integer or no
zero points) and the float path (a configuration with ``float_path``) alike, and the error
against the golden model and ONNX Runtime as a fraction of ``sum_k |a_k w_k|`` (the
tolerance is 1e-6).
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


def _v2_lines(rtl, call: dict, M: int, level: int) -> tuple[list[str], bool]:
    """The v2 engine's cycles against the performance model, MAC/cycle and utilisation."""
    from qaccel.explore.perf import nbits_v2_call
    from qaccel.model.config import int8_path
    from qaccel.model.nbits_hw import block_layout

    c, r = rtl.config, rtl.last_run
    K, N, bits = call["K"], call["N"], call["bits"]
    zp = call.get("zero_points")
    fzp = zp is not None and zp.dtype != np.uint8
    gidx = call.get("g_idx")
    float_path = not int8_path(level, float_zero_points=fzp, g_idx=gidx is not None)
    if gidx is not None:             # the engine's k: the padded group-by-group layout
        from qaccel.model.nbits import NBitsArgs

        op = NBitsArgs(call["B"], call["scales"], zp, gidx, K=K, N=N, bits=bits,
                 block_size=call["block_size"], dtype=np.asarray(call["A"]).dtype)
        K = block_layout(op)[0].size
    model = nbits_v2_call(c, M=M, N=N, K=K, bits=bits, block_size=call["block_size"],
                          bias=call.get("bias") is not None, float_path=float_path,
                          float_zero_points=fzp)
    peak = model.peak_per_cycle
    rate = r.elements / r.cycles if r.cycles else 0.0
    exact = r.harness == "stream" and rtl.idle == rtl.backpressure == 0
    if exact:
        verdict = "equal" if r.cycles == model.cycles else "DIFFERENT"
    else:
        verdict = "not compared: " + ("pauses" if r.harness == "stream" else
                                      "cocotb counts to the last y beat")
    cols = c.pe // 2 if bits > 4 else c.pe
    lines = [
        f"v2 engine: {r.beats:,} results, {r.elements:,} MACs; row tiles {model.tiles} (up to "
        f"{c.m_tile} rows), column groups {-(-N // cols)} (of {cols} columns)",
        f"cycles: RTL {r.cycles:,}, model (nbits_v2_call) {model.cycles:,}: {verdict}",
        f"{rate:.2f} MAC/cycle: MAC utilisation {rate / peak:.1%} of the peak {peak} MAC/cycle "
        f"(pe {c.pe} x simd {c.simd}{', half at 5..8 bits' if bits > 4 else ''}); model "
        f"{model.macs_per_cycle / peak:.1%}, steady state {model.steady_utilisation:.1%} "
        f"({model.bound} bound); latency {r.latency} cycles",
    ]
    return lines, not exact or r.cycles == model.cycles


def run_report(rtl, call: dict, accuracy_level: int, *, indent: str = "  ") -> bool:
    """Run ``call`` on ``rtl`` (a :class:`qaccel.RTL` with ``check=True``), print the report;
    return whether every check passed: bit-exact with the engine's model, the errors against
    the golden model and ONNX Runtime within 1e-6 of ``sum |a*w|``, and on the v2 engine
    (stream harness, no pauses) the cycles equal to :func:`~qaccel.explore.perf.nbits_v2_call`'s.
    Raises ValueError for a call the configuration does not take."""
    import qaccel
    from qaccel import onnx_models
    from qaccel.engine import RTLMismatchError
    from qaccel.model.nbits import error_bound, max_relative_error

    A = call["A"]
    M = int(np.prod(A.shape[:-1]))
    model_name = "qaccel.model.nbits_hw.matmul_nbits_v2"
    try:
        y = rtl.matmul_nbits(**call, accuracy_level=accuracy_level)
        verdict, ok = f"bit-exact with the engine's model ({model_name})", True
    except RTLMismatchError as e:
        y, verdict, ok = None, f"DIFFERENT: {e}", False
    r = rtl.last_run
    lines, cycles_ok = _v2_lines(rtl, call, M, accuracy_level)
    ok &= cycles_ok
    lines += [f"{r.simulator} ({r.harness}) {r.wall_time:.1f} s wall; build "
              f"{'reused' if r.build_reused else 'compiled'}",
              f"RTL: {verdict}"]
    if y is not None:
        kw = {k: v for k, v in call.items() if k != "A"}
        golden = qaccel.matmul_nbits(A, **kw, accuracy_level=accuracy_level)
        bound = error_bound(A, **{k: v for k, v in kw.items() if k != "bias"})
        refs = [("golden model", golden)]
        try:
            model = onnx_models.matmul_nbits_model(A, **kw, accuracy_level=accuracy_level)
            refs.append(("ONNX Runtime", onnx_models.ort_session(model).run(None, {"A": A})[0]))
        except Exception as e:  # ORT's CPU kernel takes bits 2, 4, 8 only
            lines.append(f"ONNX Runtime: not compared ({type(e).__name__}: "
                         f"{str(e).splitlines()[0][:100]})")
        for name, ref in refs:
            err = max_relative_error(y, ref, bound)
            ok &= err <= 1e-6
            lines.append(f"vs {name}: max |y - ref| / sum|a*w| = {err:.2e} (tolerance 1e-6)")
    print("\n".join(indent + line for line in lines), flush=True)
    return ok
