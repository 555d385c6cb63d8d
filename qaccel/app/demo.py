"""The main job (``make demo``): qaccel on the default configuration, end to end.

1. A realistic layer: a float32 (K, N) MatMul weight quantised to MatMulNBits int4 / block 32
   by qaccel and by ONNX Runtime's own quantiser (they must agree bit for bit), then
   MatMulNBits at accuracy levels 0 and 4 on the golden model and on ONNX Runtime: the error
   against ORT (as a fraction of the sum |a*w| bound), the quantisation error against the
   float layer, and the throughput of both.
2. The RTL as an engine (:class:`qaccel.RTL`): a 64 x 256 float32 weight slice quantised
   per-axis to int8 and blocked to int4, then dequantised, on the Quantize and Dequantize
   units simulated from their Verilog on Verilator; every output compared with the golden
   model, with the cycle report of each call: beats per cycle while streaming (the
   throughput contract, >= 0.99 less the pipeline's fill) and over the whole call with the
   scale-table loads counted (lower: each table entry takes a cycle or more).
3. The MatMulNBits engine v2 of the default configuration (the ``ecp5-25k`` preset: 32
   columns x 1 K element per cycle, row tiles of 4) on a GEMV (4096 x 4096; ``--quick``:
   1024 x 256), int4 block 32 with packed zero points and a bias, at accuracy level 4 (the
   int8 path), simulated from its Verilog on Verilator: every output bit-exact with the
   engine's model, the error against the golden model and ONNX Runtime, the cycles beside
   the performance model's (equal), MACs per cycle and utilisation. A level-0 call is
   refused: the default configuration has no float path (until v2's lands).
4. The toolchain smoke design emitted to Verilog, simulated on Verilator by a cocotb
   testbench that checks every beat, with its cycle report.
"""

from __future__ import annotations

import time

import numpy as np

import qaccel
from qaccel import onnx_models
from qaccel.model.nbits import error_bound, max_relative_error

__all__ = ["main"]


def _timed(fn, repeat=5):
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return out, best


def _layer_report(K: int, N: int, M: int, bits: int, block_size: int) -> bool:
    rng = np.random.default_rng(2026)
    W = (rng.standard_normal((K, N)) * 0.02).astype(np.float32)
    A = rng.standard_normal((M, K)).astype(np.float32)
    print(f"Layer: A ({M} x {K}) @ W ({K} x {N}), W quantised to int{bits}, block {block_size}, "
          "asymmetric")
    B, scales, zp = qaccel.quantize_weights_nbits(W, bits=bits, block_size=block_size,
                                                  symmetric=False)
    ort_B, ort_scales, ort_zp = onnx_models.ort_quantize_weights(
        W, bits=bits, block_size=block_size, symmetric=False)
    same = (np.array_equal(B, ort_B) and np.array_equal(scales.view(np.uint32),
                                                        ort_scales.view(np.uint32))
            and np.array_equal(zp, ort_zp))
    print(f"  quantiser vs ORT quantize_matmul_{bits}bits: "
          f"{'bit-exact' if same else 'DIFFERENT'} ({B.nbytes + scales.nbytes + zp.nbytes} bytes)")
    # sum |a*w|: the bound the ORT comparison is measured against
    bound = error_bound(A, B, scales, zp, K=K, N=N, bits=bits, block_size=block_size)
    y_float = A.astype(np.float64) @ W.astype(np.float64)
    ok = same
    print(f"  {'accuracy level':<16}{'max|y-ORT|/sum|aw|':>20}{'max|y-float|/max|y|':>22}"
          f"{'qaccel GMAC/s':>15}{'ORT GMAC/s':>12}")
    for level in (0, 4):
        kw = dict(K=K, N=N, bits=bits, block_size=block_size, accuracy_level=level)
        sess = onnx_models.ort_session(onnx_models.matmul_nbits_model(A, B, scales, zp, **kw))
        y, t_q = _timed(lambda kw=kw: qaccel.matmul_nbits(A, B, scales, zp, **kw))
        y_ort, t_o = _timed(lambda sess=sess: sess.run(None, {"A": A})[0])
        err = max_relative_error(y, y_ort, bound)
        qerr = float(np.max(np.abs(y - y_float)) / np.max(np.abs(y_float)))
        macs = M * K * N
        print(f"  {level:<16}{err:>20.2e}{qerr:>22.2e}{macs / t_q / 1e9:>15.2f}"
              f"{macs / t_o / 1e9:>12.2f}")
        ok &= err <= 1e-6
    return ok


def _cycle_report(run, indent: str) -> str:
    """A Q/DQ call's cycle report with its two beats/cycle figures, each saying what it counts:
    streaming (the cycles after the scale-table load: the contract's >= 0.99, less the
    pipeline's fill) and the whole call (table loads included)."""
    streaming = run.cycles - run.load_cycles
    lines = [
        f"jobs {run.jobs}, elements {run.elements}, beats {run.beats}, cycles {run.cycles}: "
        f"{run.load_cycles} loading the scale table ({run.table_entries} entries), "
        f"{streaming} streaming",
        f"beats/cycle: {run.beats / streaming:.3f} streaming (table loads not counted; the "
        f"{run.latency}-cycle pipeline fill counted), {run.beats_per_cycle:.3f} over the "
        "whole call (table loads counted)",
        run.summary(indent="").splitlines()[1],
    ]
    return "\n".join(indent + line for line in lines)


def _rtl_engine_report(K: int = 64, N: int = 256, block_size: int = 32) -> bool:
    import ml_dtypes

    from qaccel.engine import RTLMismatchError

    rng = np.random.default_rng(2027)
    W = (rng.standard_normal((K, N)) * 0.02).astype(np.float32)
    rtl = qaccel.RTL(check=True)
    print(f"RTL engine: a {K} x {N} float32 weight slice through the Quantize and Dequantize "
          f"units ({rtl.config.lanes} lane, Verilog simulated on {rtl.simulator}), every "
          "output compared with the golden model")
    amax = np.abs(W).max(axis=0)
    s8 = (amax / 127).astype(np.float32)                                    # per column
    blocks = np.abs(W).reshape(K // block_size, block_size, N).max(axis=1)
    s4 = (blocks / 7).astype(np.float32)                                    # per K block
    calls = [
        ("quantize per-axis (axis 1) -> int8", "quantize_linear",
         (W, s8), dict(axis=1, output_dtype=np.int8)),
        ("dequantize int8 -> float32", "dequantize_linear", (None, s8), dict(axis=1)),
        (f"quantize blocked (axis 0, block {block_size}) -> int4", "quantize_linear",
         (W, s4), dict(axis=0, block_size=block_size, output_dtype=ml_dtypes.int4)),
        ("dequantize int4 -> float32", "dequantize_linear", (None, s4),
         dict(axis=0, block_size=block_size)),
    ]
    ok, q, errors = True, None, []
    for title, method, args, kwargs in calls:
        if args[0] is None:
            args = (q, *args[1:])
        try:
            out = getattr(rtl, method)(*args, **kwargs)
            verdict = "bit-exact with the golden model"
        except RTLMismatchError as e:
            out, verdict, ok = None, f"DIFFERENT: {e}", False
        print(f"  {title}: {verdict}")
        print(_cycle_report(rtl.last_run, indent="    "))
        if method == "quantize_linear":
            q = out
        elif out is not None:
            errors.append(float(np.abs(out - W).max() / np.abs(W).max()))
        if out is None:
            break
    if len(errors) == 2:
        print(f"  max|W - dequantised| / max|W|: int8 {errors[0]:.2e}, int4 {errors[1]:.2e}")
    return ok


def _rtl_gemv_report(K: int, N: int, bits: int = 4, block_size: int = 32,
                     config=None) -> bool:
    from qaccel.app.nbits_report import nbits_example, run_report

    rtl = qaccel.RTL(config, check=True)
    c = rtl.config
    print(f"RTL MatMulNBits engine v2: GEMV A (1 x {K}) @ W ({K} x {N}) int{bits} block "
          f"{block_size}, packed zero points, bias; pe {c.pe} x simd {c.simd}, row tiles of "
          f"{c.m_tile}, {c.scale_lanes} float lanes (ecp5-25k preset), Verilog simulated on "
          f"{rtl.simulator}")
    call = nbits_example(K=K, N=N, M=1, bits=bits, block_size=block_size, bias=True,
                         seed=2028)
    print("  accuracy_level 4 (int8 path):", flush=True)
    ok = run_report(rtl, call, 4, indent="    ")
    try:
        rtl.matmul_nbits(**call, accuracy_level=0)
        print("  accuracy_level 0 (float path): UNEXPECTEDLY TAKEN")
        ok = False
    except ValueError as e:
        print(f"  accuracy_level 0 (float path): refused, as documented: {e}")
    return ok


def _rtl_report() -> bool:
    from qaccel.sim.smoke import run_smoke

    print("RTL: toolchain smoke design (saturating clamp) -> Verilog -> cocotb on Verilator")
    r = run_smoke(simulator="verilator")
    for key, value in r.items():
        print(f"  {key:<22}{value}")
    return bool(r.get("passed"))


def main(*, quick: bool = False) -> int:
    """Run the demo; return 0 if every check passed, 1 otherwise."""
    K = N = 512 if quick else 2048
    ok = _layer_report(K, N, M=16, bits=4, block_size=32)
    print()
    ok &= _rtl_engine_report()
    print()
    ok &= _rtl_gemv_report(1024, 256) if quick else _rtl_gemv_report(4096, 4096)
    print()
    ok &= _rtl_report()
    print()
    print("demo: all checks passed" if ok else "demo: SOME CHECKS FAILED")
    return 0 if ok else 1
