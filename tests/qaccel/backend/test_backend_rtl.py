"""ONNX's own backend test runner on the simulated RTL, filtered to the Q/DQ node tests: every
case must be bit-exact (the runner compares the outputs; ``check=True`` also compares each
call with the golden model). MatMulNBits nodes: level 4 on the v2 engine, level 0 refused by
a configuration without a float path."""

import pytest
from onnx import helper

import qaccel.backend.rtl as rtl_backend
from qaccel import onnx_models
from qaccel.app.nbits_report import nbits_example
from qaccel.engine import RTL
from qaccel.explore.perf import nbits_v2_call
from qaccel.model.nbits_hw import matmul_nbits_v2
from qaccel.sim.runner import missing_simulator
from tests.model.quant_helpers import assert_bitexact
from tests.qaccel.backend.backend_cases import (
    QDQ_RELU_X,
    QDQ_RELU_Y,
    assert_collected_all_qdq,
    qdq_backend_test,
    qdq_relu_model,
)
from tests.rtl.nbits.test_matmul_nbits_v2 import SHAPES

#: The v2 engine shape of tests/rtl/nbits/test_matmul_nbits_v2.py (its build is shared).
V2 = SHAPES["p4s2t3"]

pytestmark = [pytest.mark.sim,
              pytest.mark.skipif(missing_simulator("verilator") is not None,
                                 reason=missing_simulator("verilator") or "")]

rtl_backend.RTLBackend.use(RTL(check=True))
_backend_test = qdq_backend_test(rtl_backend, __name__)
globals().update(_backend_test.test_cases)


def test_backend_collected_all_qdq_node_tests():
    assert_collected_all_qdq(_backend_test)


def test_backend_runs_qdq_in_a_model_with_other_ops():
    """A Q -> DQ -> Relu model: Q/DQ on the RTL, Relu on onnx.reference; cycles recorded."""
    model = qdq_relu_model()
    assert rtl_backend.is_compatible(model)
    rep = rtl_backend.prepare(model)
    (y,) = rep.run([QDQ_RELU_X])
    assert_bitexact(y, QDQ_RELU_Y)
    assert rep.node_counts == {"QuantizeLinear": 1, "DequantizeLinear": 1}
    run = rtl_backend.RTLBackend.rtl().last_run
    assert run.op == "dequantize" and run.elements == 5 and run.cycles > run.beats == 5


def test_backend_takes_matmul_nbits():
    """MatMulNBits nodes run on the engine (tests/qaccel/backend/test_real_model_nbits.py runs a
    quantised model through it)."""
    node = helper.make_node("MatMulNBits", ["A", "B", "s"], ["y"], domain="com.microsoft",
                            K=32, N=1, bits=4, block_size=32)
    graph = helper.make_graph([node], "m", [], [])
    model = helper.make_model(graph)
    assert rtl_backend.is_compatible(model)


def _nbits_model(call: dict, accuracy_level: int):
    """One MatMulNBits node; B, scales, zero points and bias initializers; Y's shape given
    (the backend's checker wants it)."""
    model = onnx_models.matmul_nbits_model(
        call["A"], **{k: v for k, v in call.items() if k != "A"}, accuracy_level=accuracy_level)
    shape = model.graph.output[0].type.tensor_type.shape
    for n in (*call["A"].shape[:-1], call["N"]):
        shape.dim.add().dim_value = n
    return model


def test_backend_runs_level4_nodes_on_v2():
    """A level-4 node on an RTL of a v2 configuration: bit-exact with the v2 engine's model,
    the record of a v2 run (one y beat per result, the model's cycles); a level-0 node on the
    backend's engine (the default configuration, no float path) is refused, naming it."""
    call = nbits_example(K=80, N=6, M=4, bits=4, block_size=16, bias=True, seed=9)
    rep = rtl_backend.prepare(_nbits_model(call, 4), config=V2)
    (y,) = rep.run([call["A"]])
    want = matmul_nbits_v2(**call, accuracy_level=4)
    assert_bitexact(y, want)
    ((op, run),) = rep.runs
    assert op == "MatMulNBits" and run.beats == 4 * 8 and run.elements == 4 * 6 * 80
    assert run.cycles == nbits_v2_call(V2, M=4, N=6, K=80, bits=4, block_size=16).cycles
    with pytest.raises(ValueError, match=r"no float path \(config.float_path False\)"):
        rtl_backend.prepare(_nbits_model(call, 0)).run([call["A"]])
