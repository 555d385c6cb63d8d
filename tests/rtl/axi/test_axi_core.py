"""AxiCore end to end on a simulator, driven only through its AXI4-Lite and AXI4-Stream ports
by cocotbext-axi (sim/tb_axi_core.py): each core of the default configuration, several jobs
with pauses, a bad job and recovery, held writes and a soft reset. The expected outputs are the
golden model's, checked against onnx.reference here."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import numpy_helper

from qaccel.explore.perf import nbits_v2_call
from qaccel.model.nbits import matmul_nbits
from qaccel.model.quant import dequantize_linear, quantize_linear
from qaccel.rtl.axi.axi_core import AxiCore
from qaccel.rtl.axi.regmap import to_tdata
from qaccel.sim.jobs import dequantize_job, quantize_job
from qaccel.sim.nbits_jobs import nbits_job_v2
from qaccel.sim.runner import run_cocotb
from tests.model.quant_helpers import assert_bitexact, dq_opset, q_opset, reference

pytestmark = pytest.mark.sim


def _hex(v: int) -> str:
    return f"{v:x}"


def _elementwise_job(core: AxiCore, job, want: np.ndarray, table_by: str) -> dict:
    fields = core.stream_fields
    y = numpy_helper.from_array(want).raw_data
    word = core.signature.members["m_axis_y_tdata"].shape.width // 8
    return {
        "writes": core.regmap.job_writes(job.regs),
        "table": job.table, "table_by": table_by,
        "table_tdata": [_hex(to_tdata(fields["table"], {"addr": a, "scale": s,
                                                        "zero_point": z}))
                        for a, s, z in job.table],
        "streams": {"x": [_hex(to_tdata(fields["x"], b)) for b in job.x]},
        "y": y.hex(), "y_beats": -(-len(y) // word), "real": None,
    }


def _quantize_jobs(core: AxiCore) -> list[dict]:
    rng = np.random.default_rng(7)
    unit = core.inner.unit
    jobs = []
    cases = [
        (rng.normal(0, 3, 37).astype(np.float32), np.float32(0.25), np.int8(3), {}, "lite"),
        (rng.normal(0, 2, (5, 6)).astype(np.float32),
         rng.uniform(0.1, 1, 6).astype(np.float32),
         np.arange(6, dtype=np.uint8), {"axis": 1}, "stream"),
        (rng.normal(0, 4, (3, 9)).astype(np.float32),
         rng.uniform(0.2, 1, (3, 3)).astype(np.float32),
         np.zeros((3, 3), ml_dtypes.int4), {"axis": 1, "block_size": 3}, "stream"),
    ]
    for x, s, z, kw, by in cases:
        want = quantize_linear(x, s, z, **kw)
        ref = reference("QuantizeLinear", [x, s, z],
                        opset=q_opset(x.dtype, s.dtype, z.dtype, blocked="block_size" in kw),
                        y_dtype=z.dtype, **kw)
        assert_bitexact(want, ref)
        jobs.append(_elementwise_job(core, quantize_job(unit, x, s, z, **kw), want, by))
    return jobs


def _dequantize_jobs(core: AxiCore) -> list[dict]:
    rng = np.random.default_rng(8)
    unit = core.inner.unit
    jobs = []
    cases = [
        (rng.integers(-128, 128, 29).astype(np.int8), np.float32(0.125), np.int8(-2), {},
         "lite"),
        (rng.integers(-8, 8, (4, 6)).astype(ml_dtypes.int4),
         rng.uniform(0.1, 1, 6).astype(np.float16), None, {"axis": 1}, "stream"),
        (rng.integers(0, 256, (2, 8)).astype(np.uint8),
         rng.uniform(0.1, 1, (2, 2)).astype(np.float32), np.full((2, 2), 128, np.uint8),
         {"axis": 1, "block_size": 4}, "stream"),
    ]
    for x, s, z, kw, by in cases:
        want = dequantize_linear(x, s, z, **kw)
        inputs = [x, s] if z is None else [x, s, z]
        ref = reference("DequantizeLinear", inputs, y_dtype=want.dtype,
                        opset=dq_opset(x.dtype, want.dtype, blocked="block_size" in kw,
                                       scale_dtype=s.dtype), **kw)
        assert_bitexact(want, ref)
        jobs.append(_elementwise_job(core, dequantize_job(unit, x, s, z, **kw), want, by))
    return jobs


#: MatMulNBits jobs: M, K, N, bits, block_size, zero points, bias, output type.
JOB_SHAPES = ((3, 64, 20, 4, 32, True, False, np.float32),
              (2, 96, 12, 8, 16, False, True, np.float16),
              (5, 40, 33, 3, 16, True, True, np.float32))
#: The first job's output type per elementwise core (int8 and float32).
OUT_DTYPES = {"quantize": np.int8, "dequantize": np.float32}


def _nbits_jobs(core: AxiCore) -> list[dict]:
    rng = np.random.default_rng(9)
    fields = core.stream_fields
    jobs = []
    for M, K, N, bits, bs, zp, bias, out in JOB_SHAPES:
        A = rng.normal(0, 1, (M, K)).astype(out)
        kb = -(-K // bs)
        B = rng.integers(0, 256, (N, kb, bs * bits // 8), dtype=np.uint8)
        S = rng.uniform(0.01, 0.1, (N, kb)).astype(out)
        Z = (rng.integers(0, 256, (N, -(-kb * bits // 8)), dtype=np.uint8) if zp else None)
        b = rng.normal(0, 1, N).astype(out) if bias else None
        job = nbits_job_v2(A, B, S, Z, None, b, K=K, N=N, bits=bits, block_size=bs,
                           config=core.inner.engine.config)
        golden = matmul_nbits(A, B, S, Z, None, b, K=K, N=N, bits=bits, block_size=bs,
                              accuracy_level=4)
        assert golden.shape == job.out_shape
        streams = {}
        for s, beats in job.inputs.items():
            rows = beats.reshape(len(beats), -1)
            streams[s] = [_hex(to_tdata(fields[s], int.from_bytes(r.astype("<u8").tobytes(),
                                                                  "little"))) for r in rows]
        jobs.append({"writes": core.regmap.job_writes(job.regs), "table": None,
                     "streams": streams, "y": job.y.astype("<u4").tobytes().hex(),
                     "y_beats": len(job.y), "real": [bool(r) for r in job.real]})
    return jobs


def _bad(core: AxiCore) -> dict:
    rmap = core.regmap
    if core.op == "matmul_nbits":
        return {"writes": [(rmap["BLOCK_SIZE"].offset, 8)], "error": "block_size"}
    fmt = rmap["FORMAT"]
    types = core.describe()["type_indices"]
    name = next(f.name for f in fmt.fields if len(types.get(f.name, [0, 0])) < 1 << f.width)
    return {"writes": [(fmt.offset, rmap.encode("FORMAT", **{name: len(types[name])}))],
            "error": "format"}


JOBS = {"quantize": _quantize_jobs, "dequantize": _dequantize_jobs,
        "matmul_nbits": _nbits_jobs}


@pytest.mark.parametrize("op", list(JOBS))
def test_axi_core_system(op):
    core = AxiCore(op)
    jobs = JOBS[op](core)
    params = {"register_map": core.regmap.to_dict(), "inputs": list(core.stream_fields),
              "jobs": jobs, "bad_writes": _bad(core), "seed": 5}
    result = run_cocotb(core, name=f"qaccel_{op}", test_module="tb_axi_core",
                        simulator="verilator", config=params)
    assert result.passed == 5, result
    # the JSON's latency, measured on the ports (job 0 runs without pauses)
    first = result.records["job 0"]
    desc = core.describe()
    if op == "matmul_nbits":
        shape = JOB_SHAPES[0]
        call = nbits_v2_call(core.inner.engine.config, M=shape[0], K=shape[1], N=shape[2],
                             bits=shape[3], block_size=shape[4], bias=shape[6])
        assert first["cycles"] == call.cycles
        assert desc["latency"]["model"] == "qaccel.explore.perf.nbits_v2_call"
    else:
        word = core.signature.members["m_axis_y_tdata"].shape.width
        per_word = word // (8 * np.dtype(OUT_DTYPES[op]).itemsize)
        lanes = core.inner.unit.config.lanes
        x_cycle = first["input_cycles"][(per_word - 1) // lanes]
        assert first["y_cycle"] - x_cycle == desc["latency"]
