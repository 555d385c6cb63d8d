# amaranth: UnusedElaboratable=no
"""qaccel.RTL: the golden API answered by the simulated Quantize and Dequantize units.

Simulator tests (default configuration, so they share the builds of tests/sim): a handful of
calls compared bit for bit with the golden model, a scale table split (along the outer and
along an inner dimension), the run record, the cocotb capture path on Verilator (with pauses)
and on Icarus, ``qaccel sim``. Without a simulator: errors mirror the golden model's, the
returned array is the decoded beats (a fake harness), constructor errors.
"""

from __future__ import annotations

import inspect

import ml_dtypes
import numpy as np
import pytest

import qaccel
from qaccel.app import cli
from qaccel.engine import RTL, RTLMismatchError, RunRecord, example_call
from qaccel.explore.perf import elementwise_call
from qaccel.model.config import AccelConfig
from qaccel.model.presets import preset
from qaccel.sim.runner import missing_simulator
from tests.model.quant_helpers import assert_bitexact, reference, tid
from tests.sub_byte_cases import SPECIAL_SCALE, SPECIAL_X, SUB_BYTE, special_case, top_bit_set


def needs(simulator: str):
    """Mark a test ``sim`` and skip it when ``simulator`` is missing."""
    reason = missing_simulator(simulator)

    def mark(test):
        return pytest.mark.sim(pytest.mark.skipif(reason is not None, reason=reason or "")(test))
    return mark


@pytest.fixture(scope="module")
def rtl():
    return RTL()


@needs("verilator")
@pytest.mark.parametrize("check", [False, True])
def test_golden_model_runs_once_and_only_to_check(check, monkeypatch):
    """A Q / DQ / DirectML call validates its arguments, simulates and decodes; the golden
    model runs once, on the whole tensor, and only with ``check`` (a call split into several
    jobs too).  (MatMulNBits: nbits_job_v2 runs the engine's model only with expect=True,
    which the engine passes as its check: tests/sim/test_jobs.py.)"""
    import qaccel.engine.facade as facade_module
    import qaccel.model.dml as dml_module
    import qaccel.model.quant as quant_module
    import qaccel.sim.jobs as jobs_module

    calls = []

    def counted(module, name):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, **k: calls.append(name) or real(*a, **k))

    for module in (quant_module, jobs_module, facade_module):
        counted(module, "quantize_linear")
        counted(module, "dequantize_linear")
    for module in (dml_module, jobs_module, facade_module):
        counted(module, "dml_quantize_linear")
    rtl = RTL(AccelConfig(table_depth=16), check=check)
    args, kwargs = example_call("quantize", (4, 64), axis=1, block_size=1, seed=1)
    rtl.quantize_linear(*args, **kwargs)
    assert rtl.last_run.jobs > 1
    args, kwargs = example_call("dequantize", (3, 40), axis=0, seed=2)
    rtl.dequantize_linear(*args, **kwargs)
    args, kwargs = example_call("dml", (3, 40), axis=0, seed=3)
    rtl.dml_quantize_linear(*args, **kwargs)
    want = ["quantize_linear", "dequantize_linear", "dml_quantize_linear"]
    assert calls == (want if check else [])


#: (op, example_call arguments): every granularity, several types; small tensors.
CALLS = {
    "q-f32-int8-per-axis": ("quantize", dict(shape=(4, 33), axis=1)),
    "q-f16-uint4-blocked": ("quantize", dict(shape=(3, 20), axis=1, block_size=8,
                                             dtype="float16", scale_dtype="float16",
                                             output_dtype="uint4")),
    "q-bf16-e4m3fn-per-tensor": ("quantize", dict(shape=(5, 7), dtype="bfloat16",
                                                  output_dtype="float8e4m3fn",
                                                  zero_point=False)),
    "q-f32-fp4-per-tensor": ("quantize", dict(shape=(4, 9), output_dtype="float4e2m1")),
    "q-f32-int4-per-axis": ("quantize", dict(shape=(3, 11), axis=0, output_dtype="int4")),
    "q-f32-fp4-e8m0-blocked": ("quantize", dict(shape=(3, 64), axis=1, block_size=32,
                                                scale_dtype="float8e8m0",
                                                output_dtype="float4e2m1")),
    "q-bf16-int8-e8m0-per-axis": ("quantize", dict(shape=(5, 6), axis=0, dtype="bfloat16",
                                                   scale_dtype="float8e8m0")),
    "q-int32-int16-per-axis": ("quantize", dict(shape=(6, 5), axis=0, dtype="int32",
                                                scale_dtype="int32", output_dtype="int16")),
    "dq-int4-bf16-blocked": ("dequantize", dict(shape=(16, 6), axis=0, block_size=4,
                                                dtype="int4", scale_dtype="bfloat16")),
    "dq-e5m2-f16-per-axis": ("dequantize", dict(shape=(3, 9), axis=1, dtype="float8e5m2",
                                                scale_dtype="float16")),
    "dq-e4m3fn-e8m0-blocked": ("dequantize", dict(shape=(2, 64), axis=1, block_size=32,
                                                  dtype="float8e4m3fn",
                                                  scale_dtype="float8e8m0")),
    "dq-int8-e8m0-bf16-per-tensor": ("dequantize", dict(shape=(9,), dtype="int8",
                                                        scale_dtype="float8e8m0",
                                                        output_dtype="bfloat16")),
    "dq-int32-f32-per-tensor": ("dequantize", dict(shape=(17,), dtype="int32")),
    "dml-f16-uint8": ("dml", dict(shape=(2, 3, 8), axis=2, dtype="float16",
                                  output_dtype="uint8")),
}
GOLDEN = {"quantize": qaccel.quantize_linear, "dequantize": qaccel.dequantize_linear,
          "dml": qaccel.dml_quantize_linear}
METHOD = {"quantize": "quantize_linear", "dequantize": "dequantize_linear",
          "dml": "dml_quantize_linear"}


def call(engine, op, args, kwargs):
    return getattr(engine, METHOD[op])(*args, **kwargs)


# ---------------------------------------------------------------------------------------------
# Simulated


@needs("verilator")
@pytest.mark.parametrize("case", CALLS)
def test_rtl_returns_golden_arrays(rtl, case):
    op, kw = CALLS[case]
    args, kwargs = example_call(op, seed=len(case), **kw)
    assert_bitexact(call(rtl, op, args, kwargs), GOLDEN[op](*args, **kwargs))
    run = rtl.last_run
    assert run.op == op and run.jobs == 1
    # the performance model's cycles are the RTL's
    model = elementwise_call(rtl.config, op, [(run.elements, run.table_entries)])
    assert (model.cycles, model.beats, model.latency) == (run.cycles, run.beats, run.latency)


@needs("verilator")
@pytest.mark.parametrize("case", ["per-tensor", "per-axis", "blocked", "split"])
def test_prepared_scales_cycles(case):
    """The qdq-int8 preset's Quantize unit prepares each table entry as it is written (one
    reciprocal unit: a write every 28 cycles): bit-exact, and the performance model's cycles
    are the RTL's, with one job and with a call split into several."""
    config = preset("qdq-int8")
    rtl = RTL(config)
    kw = {"per-tensor": dict(shape=(7, 40)), "per-axis": dict(shape=(6, 50), axis=0),
          "blocked": dict(shape=(4, 96), axis=1, block_size=16),
          "split": dict(shape=(4, 512), axis=1, block_size=1)}[case]
    args, kwargs = example_call("quantize", seed=3, output_dtype="int8", **kw)
    if case == "split":
        rtl = RTL(config.replace(table_depth=256))
    assert_bitexact(rtl.quantize_linear(*args, **kwargs), qaccel.quantize_linear(*args, **kwargs))
    run = rtl.last_run
    unit = rtl._unit("quantize")
    assert unit.table_interval == 28 and unit.start_latency > unit._index.latency
    entries = run.table_entries
    jobs = [(run.elements // run.jobs, entries // run.jobs)] * run.jobs
    model = elementwise_call(rtl.config, "quantize", jobs)
    assert (model.cycles, model.load_cycles, model.beats) == (run.cycles, run.load_cycles,
                                                              run.beats)


@needs("verilator")
@pytest.mark.parametrize("fmt", qaccel.MX_FORMATS)
def test_mx_formats_on_the_rtl(rtl, fmt):
    """The OCP MX helpers with the RTL as their Q/DQ: the element codes, the shared scales and
    the decoded values have the golden model's bytes (blocks of 32 along the last axis, a
    partial last block, a NaN block and an all-zero block)."""
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((3, 72)) * np.exp2(rng.integers(-20, 20, (3, 1)))).astype(np.float32)
    x[1, 32:64] = 0.0
    x[2, 40] = np.nan
    codes, scales = qaccel.mx_quantize(x, fmt, ops=rtl)
    want_codes, want_scales = qaccel.mx_quantize(x, fmt)
    assert_bitexact(codes, want_codes)
    assert_bitexact(scales, want_scales)
    assert rtl.last_run.op == "quantize"
    assert_bitexact(qaccel.mx_dequantize(codes, scales, fmt, ops=rtl),
                    qaccel.mx_dequantize(want_codes, want_scales, fmt))
    assert rtl.last_run.op == "dequantize"


@needs("verilator")
@pytest.mark.parametrize("shape, axis, block_size, jobs", [
    ((40, 64), 1, 2, 2),          # blocked: 1280 scales, split into whole rows
    ((1100, 3), 0, 0, 2),         # per-axis along the outer axis
    ((2, 1500), 1, 0, 2),         # per-axis along the inner axis: boxes of 1024 columns
    ((2, 70000), 0, 0, 2),        # rows longer than the index generator's sizes (16 bits)
], ids=["blocked-rows", "per-axis-outer", "per-axis-inner", "size-width"])
def test_table_split(rtl, shape, axis, block_size, jobs):
    args, kwargs = example_call("quantize", shape, axis=axis, block_size=block_size, seed=3)
    assert_bitexact(rtl.quantize_linear(*args, **kwargs), qaccel.quantize_linear(*args, **kwargs))
    run = rtl.last_run
    assert run.jobs == jobs and run.elements == np.prod(shape)
    assert run.load_cycles == args[1].size + jobs     # every scale loaded once, a start each
    # one lane: the model's cycles depend on the jobs' total elements and entries only
    split = [(run.elements // jobs, args[1].size // jobs)] * (jobs - 1)
    split.append((run.elements - sum(e for e, _ in split), args[1].size - sum(t for _, t in split)))
    assert elementwise_call(rtl.config, "quantize", split).cycles == run.cycles
    dq_args, dq_kwargs = example_call("dequantize", shape, axis=axis, block_size=block_size,
                                      seed=4)
    assert_bitexact(rtl.dequantize_linear(*dq_args, **dq_kwargs),
              qaccel.dequantize_linear(*dq_args, **dq_kwargs))
    assert rtl.last_run.jobs == jobs


def _sub_byte_param(out, zero_point):
    return pytest.param(out, zero_point, id=f"{tid(out)}-{'zp' if zero_point else 'nozp'}")


@needs("verilator")
@pytest.mark.parametrize("out, zero_point", [_sub_byte_param(out, zp) for out in SUB_BYTE
                                             for zp in (True, False)])
def test_sub_byte_outputs_are_the_reference_bytes(rtl, out, zero_point):
    """Sub-byte outputs from the RTL (negatives, -0, NaN, +-inf, saturation): the golden
    model's bytes and onnx.reference's (except where its int32 arithmetic wraps, a
    documented deviation), the container's upper bits zero."""
    args, kwargs, ref, mask = special_case(out, zero_point)
    got = rtl.quantize_linear(*args, **kwargs)
    want = qaccel.quantize_linear(*args, **kwargs)
    assert top_bit_set(want).any() or out in (ml_dtypes.uint4, ml_dtypes.uint2)
    assert_bitexact(got, want, context="RTL vs golden: ")
    assert_bitexact(got, ref, mask=mask, context="RTL vs onnx.reference: ")


@needs("verilator")
@pytest.mark.parametrize("out", [np.dtype(np.int8), np.dtype(np.uint8)], ids=tid)
def test_dml_output_bytes(rtl, out):
    """DirectML's quantize (int8 / uint8 only: no unused container bits) through the RTL:
    negatives, -0, saturation, +-inf and NaN give the golden model's bytes."""
    x = SPECIAL_X.reshape(2, 1, -1)
    scale = SPECIAL_SCALE.reshape(2, 1, 1)
    zp = np.array([[[3]], [[-5 if out == np.int8 else 250]]], out)
    for z in (None, zp):
        got = rtl.dml_quantize_linear(x, scale, z, output_dtype=out)
        assert_bitexact(got, qaccel.dml_quantize_linear(x, scale, z, output_dtype=out))


@needs("verilator")
@pytest.mark.parametrize("out", [np.dtype(np.float32), np.dtype(np.float16)], ids=tid)
def test_dequantize_nan_scale_payload(rtl, out):
    """A NaN scale with a payload: x * scale keeps it in the golden model and the reference."""
    scale = (np.uint32([0x7FC00001, 0xFFC00002, 0x7F800001, 0x3F800000]).view(np.float32)
             if out == np.float32 else np.uint16([0x7E01, 0xFE02, 0x7C01, 0x3C00]).view(out))
    x = np.int8([1, -1, 3, 0])
    want = qaccel.dequantize_linear(x, scale, axis=0)
    assert_bitexact(want, reference("DequantizeLinear", [x, scale], opset=19, y_dtype=out,
                                    axis=0), context="golden vs onnx.reference: ")
    assert_bitexact(rtl.dequantize_linear(x, scale, axis=0), want, context="RTL vs golden: ")


@needs("verilator")
def test_last_run_record(rtl):
    args, kwargs = example_call("quantize", (8, 64), axis=1, seed=5)
    rtl.quantize_linear(*args, **kwargs)
    run = rtl.last_run
    assert isinstance(run, RunRecord)
    assert (run.op, run.simulator, run.jobs, run.elements, run.beats) == (
        "quantize", "verilator", 1, 512, 512)
    assert run.harness in ("stream", "cocotb") and isinstance(run.build_reused, bool)
    unit = rtl._unit("quantize")
    assert run.latency == unit.latency
    assert run.load_cycles == 64 + 1
    # table, start, the index generator's start latency, the beats, the pipeline, then idle
    assert run.beats + run.load_cycles + unit.latency <= run.cycles <= run.beats + 200
    assert 0.5 < run.beats_per_cycle < 1 and run.wall_time > 0 and run.elements_per_second > 0
    assert "beats/cycle" in run.summary()


@pytest.mark.sim
@pytest.mark.parametrize("simulator", [
    pytest.param(s, marks=pytest.mark.skipif(missing_simulator(s) is not None,
                                             reason=missing_simulator(s) or ""))
    for s in ("verilator", "icarus")])
def test_cocotb_capture(simulator):
    """The cocotb testbench in capture mode (Verilator with random pauses; Icarus)."""
    seen = []
    pauses = 0.3 if simulator == "verilator" else 0.0
    engine = RTL(simulator=simulator, harness="cocotb", idle=pauses, backpressure=pauses,
                 seed=7, progress=lambda done, total: seen.append((done, total)))
    args, kwargs = example_call("quantize", (3, 10), axis=0, output_dtype="int4", seed=6)
    want = qaccel.quantize_linear(*args, **kwargs)
    assert top_bit_set(want).any()          # negative codes: 0x0_, never 0xF_
    assert_bitexact(engine.quantize_linear(*args, **kwargs), want)
    run = engine.last_run
    assert (run.simulator, run.harness, run.beats) == (simulator, "cocotb", 30)
    assert seen[0] == (0, 30) and seen[-1] == (30, 30)
    assert run.latency >= engine._unit("quantize").latency      # == without back-pressure
    if pauses:
        assert run.cycles > 30 + run.load_cycles + run.latency


@needs("verilator")
def test_cli_sim(capsys):
    assert cli.main(["sim", "quantize", "--shape", "6,40", "--axis", "1", "--block-size", "8",
                     "--output-dtype", "int4"]) == 0
    out = capsys.readouterr().out
    assert "golden model: bit-exact (240 elements, output int4)" in out
    assert "beats/cycle" in out and "latency" in out
    assert cli.main(["sim", "dml", "--shape", "4,5", "--axis", "0"]) == 0
    assert "bit-exact" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# Without a simulator


def test_signatures_match_the_golden_api():
    for op, method in METHOD.items():
        golden = inspect.signature(GOLDEN[op]).parameters
        ours = inspect.signature(getattr(RTL, method)).parameters
        assert list(ours)[1:] == list(golden), op
        assert [p.default for p in list(ours.values())[1:]] == [
            p.default for p in golden.values()], op


def test_import_qaccel_loads_no_amaranth():
    import subprocess
    import sys

    code = ("import sys, qaccel; r = qaccel.RTL(); "
            "assert 'amaranth' not in sys.modules, 'amaranth imported eagerly'")
    subprocess.run([sys.executable, "-c", code], check=True)


ERRORS = [
    ("quantize", (np.float32([1, 2]), np.float64(1.0)), {}),
    ("quantize", (np.float32([[1, 2]]), np.float32([1, 2, 3])), {"axis": 1}),
    ("quantize", (np.float32([1, 2]), np.float32(1)), {"saturate": 2}),
    ("quantize", (np.float32([1, 2]), np.float32(1), np.int8(0)), {"output_dtype": np.uint8}),
    ("dequantize", (np.int8([1, 2]), np.float32(1), np.uint8(0)), {}),
    ("dequantize", (np.float32([1, 2]), np.float32(1)), {}),
    ("dequantize", (np.int8([[1, 2, 3, 4]]), np.float32([[1, 2, 3]])),
     {"axis": 1, "block_size": 2}),
    ("dml", (np.float32([1, 2]), np.float16([1, 1])), {}),
    ("dml", (np.float32([[1, 2]]), np.float32([1, 1])), {}),
]


@pytest.mark.parametrize("op, args, kwargs", ERRORS, ids=range(len(ERRORS)))
def test_errors_mirror_the_golden_model(op, args, kwargs):
    with pytest.raises((TypeError, ValueError)) as want:
        GOLDEN[op](*args, **kwargs)
    with pytest.raises(want.type) as got:
        call(RTL(), op, args, kwargs)
    assert str(got.value) == str(want.value)


def test_error_type_not_carried():
    engine = RTL(AccelConfig(q_outputs=("int8", "uint8")))
    with pytest.raises(ValueError, match=r"does not carry output type uint4 "
                                         r"\(config.q_outputs = \('int8', 'uint8'\)\)"):
        engine.quantize_linear(np.float32([1]), np.float32(1), output_dtype=ml_dtypes.uint4)
    engine = RTL(AccelConfig(dq_inputs=("int8",), scales=("float32", "int32")))
    with pytest.raises(ValueError, match="does not carry x_scale type float16"):
        engine.dequantize_linear(np.int8([1]), np.float16(1))


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(config={"lanes": 2}), TypeError, "config must be an AccelConfig"),
    (dict(simulator="xsim"), ValueError, "simulator must be one of verilator, icarus"),
    (dict(harness="fast"), ValueError, "harness must be one of auto, cocotb, stream"),
    (dict(simulator="icarus", harness="stream"), ValueError, "Verilator only"),
    (dict(check=1), TypeError, "check must be a bool"),
    (dict(idle=1.0), ValueError, r"idle must be a probability in \[0, 1\), not 1.0"),
    (dict(backpressure=-0.1), ValueError, "backpressure must be a probability"),
    (dict(seed=1.5), TypeError, "seed must be an integer"),
])
def test_constructor_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        RTL(**kwargs)


def test_empty_tensor_needs_no_simulation():
    engine = RTL()
    y = engine.quantize_linear(np.zeros((0, 4), np.float32), np.float32(1), np.uint8(3))
    assert y.shape == (0, 4) and y.dtype == np.uint8
    assert engine.last_run.jobs == 0 and engine.last_run.harness == "none"


@pytest.fixture
def fake_harness(monkeypatch):
    """Replace the simulator by a harness answering ``lane_code`` for every element (the
    whole lane word, 1 unless a test sets it), with ``last`` on each job's last beat."""
    answer = {"lane_code": 1}

    def run(self, unit, jobs, name):
        width = unit.signature.members["y"].signature.members["payload"].shape["data"] \
            .shape.elem_shape.width
        code = answer["lane_code"] & ((1 << width) - 1)
        beats = []
        for job in jobs:
            assert job.y == [], "the simulator must not see the expected beats"
            b = [sum(code << (k * width) for k in range(self.config.lanes))] * len(job.x)
            b[-1] |= 1 << (self.config.lanes * width)
            beats.append(b)
        return beats, 10 * len(jobs), len(jobs), 3, False

    monkeypatch.setattr(RTL, "_harness", lambda self: "cocotb")
    monkeypatch.setattr(RTL, "_run_cocotb", run)
    return answer


def test_returns_the_decoded_beats_not_the_golden_result(fake_harness):
    x, s = np.float32([[-300, 0, 7]]), np.float32([1, 1, 1])
    y = RTL().quantize_linear(x, s, axis=1, output_dtype=np.int8)
    assert_bitexact(y, np.int8([[1, 1, 1]]))
    with pytest.raises(RTLMismatchError, match=r"at 3 of 3 elements; first at index \(0, 0\): "
                                               r"RTL code 0x1 \(np.int8\(1\)\), golden 0x80"):
        RTL(check=True).quantize_linear(x, s, axis=1, output_dtype=np.int8)
    y = RTL().dequantize_linear(np.array([[1, 1]], ml_dtypes.int4), np.float32(1))
    assert_bitexact(y, np.uint32([[1, 1]]).view(np.float32))   # not 1.0: the beats


@pytest.mark.parametrize("out, scale, lane_code, golden_byte", [
    (ml_dtypes.int4, 0.5, 0xFFFE, 0x0E),             # -1 / 0.5 = -2
    (ml_dtypes.float4_e2m1fn, 2.0, 0xFFF9, 0x09),    # -0.5
    (ml_dtypes.int2, 1.0, 0xFFFF, 0x03),             # -1
], ids=["int4", "float4e2m1", "int2"])
def test_check_catches_a_sign_extended_container(fake_harness, out, scale, lane_code,
                                                 golden_byte):
    """A unit answering a sub-byte code sign-extended across its lane: with ``check`` the
    engine raises or returns the golden bytes, never a byte with the upper bits set."""
    fake_harness["lane_code"] = lane_code
    x, s = np.float32([-1, -1]), np.float32(scale)
    want = qaccel.quantize_linear(x, s, output_dtype=out)
    assert_bitexact(want.view(np.uint8), np.uint8([golden_byte] * 2))
    try:
        got = RTL(check=True).quantize_linear(x, s, output_dtype=out)
    except RTLMismatchError:
        return
    assert_bitexact(got, want)
