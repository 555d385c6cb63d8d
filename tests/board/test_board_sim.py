"""The board path without a board: the host driver (qaccel.board.Board, the code that runs
over pyserial) drives the simulated board top (HostTop: the UART host bridge, the AXI4-Lite
decoder and the Quantize, Dequantize and MatMulNBits cores of the default configuration)
through cocotbext-uart; every result equals the golden model's, checked against
onnx.reference here."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from qaccel.model.config import AccelConfig
from qaccel.model.nbits import matmul_nbits
from qaccel.model.quant import dequantize_linear, quantize_linear
from qaccel.rtl.axi.host_top import HostTop
from qaccel.sim.nbits_jobs import nbits_job_v2, unpack_y_v2
from qaccel.sim.runner import run_cocotb
from tests.model.quant_helpers import assert_bitexact, dq_opset, q_opset, reference

pytestmark = pytest.mark.sim

DIVISOR = 4                     # clock cycles a bit: 25 Mbaud at the testbench's 100 MHz


def _save(path, args, kwargs, want) -> str:
    def raw(a):            # (ml_dtypes arrays go as bytes and their dtype's name)
        a = np.asarray(a)
        return a.view(f"u{a.dtype.itemsize}"), np.str_(a.dtype.name)

    arrays = {"nargs": np.int64(len(args))}
    arrays["want"], arrays["want_dtype"] = raw(want)
    for k, a in enumerate(args):
        arrays[f"none{k}"] = np.bool_(a is None)
        arrays[f"arg{k}"], arrays[f"dtype{k}"] = raw(np.zeros(0) if a is None else a)
    arrays |= {f"kw_{k}": np.asarray(v) for k, v in kwargs.items()}
    np.savez(path, **arrays)
    return str(path)


def _calls(tmp_path) -> list[dict]:
    rng = np.random.default_rng(3)
    calls = []

    def add(op, args, kwargs, want):
        calls.append({"op": op, "npz": _save(tmp_path / f"call{len(calls)}.npz", args, kwargs,
                                             want)})

    x = rng.normal(0, 3, (4, 10)).astype(np.float32)
    s = rng.uniform(0.05, 0.5, 10).astype(np.float32)
    z = rng.integers(-5, 5, 10).astype(np.int8)
    want = quantize_linear(x, s, z, axis=1)
    assert_bitexact(want, reference("QuantizeLinear", [x, s, z], axis=1, y_dtype=np.int8,
                                    opset=q_opset(np.float32, np.float32, np.int8)))
    add("quantize_linear", [x, s, z], {"axis": 1}, want)
    s2 = rng.uniform(0.2, 1, (4, 5)).astype(np.float32)
    z2 = np.zeros((4, 5), ml_dtypes.int4)
    want = quantize_linear(x, s2, z2, axis=1, block_size=2)
    assert_bitexact(want, reference("QuantizeLinear", [x, s2, z2], axis=1, block_size=2,
                                    y_dtype=ml_dtypes.int4,
                                    opset=q_opset(np.float32, np.float32, ml_dtypes.int4,
                                                  blocked=True)))
    add("quantize_linear", [x, s2, z2], {"axis": 1, "block_size": 2}, want)
    q = rng.integers(-128, 128, 23).astype(np.int8)
    want = dequantize_linear(q, np.float32(0.0625), np.int8(4))
    assert_bitexact(want, reference("DequantizeLinear", [q, np.float32(0.0625), np.int8(4)],
                                    y_dtype=np.float32, opset=dq_opset(np.int8)))
    add("dequantize_linear", [q, np.float32(0.0625), np.int8(4)], {}, want)
    for M, K, N, bits, bs, bias in ((3, 32, 40, 4, 32, True), (2, 48, 9, 6, 16, False)):
        A = rng.normal(0, 1, (M, K)).astype(np.float32)
        kb = -(-K // bs)
        B = rng.integers(0, 256, (N, kb, bs * bits // 8), dtype=np.uint8)
        S = rng.uniform(0.01, 0.1, (N, kb)).astype(np.float32)
        Z = rng.integers(0, 256, (N, -(-kb * bits // 8)), dtype=np.uint8)
        b = rng.normal(0, 1, N).astype(np.float32) if bias else None
        kw = {"K": K, "N": N, "bits": bits, "block_size": bs}
        # the engine's fixed accumulation order (qaccel.model.nbits_hw), bit for bit; ONNX
        # Runtime's order (the golden model) to float32 rounding
        job = nbits_job_v2(A, B, S, Z, None, b, config=AccelConfig(), **kw)
        want = unpack_y_v2(job, job.y)
        golden = matmul_nbits(A, B, S, Z, None, b, accuracy_level=4, **kw)
        np.testing.assert_allclose(want, golden, rtol=1e-5, atol=1e-5)
        add("matmul_nbits", [A, B, S, Z, None, b], kw, want)
    return calls


def test_board_driver_on_the_simulated_top(tmp_path):
    top = HostTop(ops=("quantize", "dequantize", "matmul_nbits"), divisor=DIVISOR)
    params = {"description": top.describe(), "baud": round(1e9 / (10 * DIVISOR)),
              "calls": _calls(tmp_path)}
    result = run_cocotb(top, name="qaccel_board", test_module="tb_board",
                        simulator="verilator", config=params)
    assert result.passed == 2, result
    last = result.records[f"call {len(params['calls']) - 1}"]
    assert last["sent"] > 1000 and last["received"] > 100
