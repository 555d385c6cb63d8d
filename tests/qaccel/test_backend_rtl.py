"""ONNX's own backend test runner on the simulated RTL, filtered to the Q/DQ node tests: every
case must be bit-exact (the runner compares the outputs; ``check=True`` also compares each
call with the golden model)."""

import importlib
from unittest import mock

import numpy as np
import onnx.backend.test
import onnx.backend.test.case.node as node_cases
import pytest
from onnx import TensorProto, helper

import qaccel.backend.rtl as rtl_backend
from qaccel.engine import RTL
from qaccel.sim.runner import missing_simulator

pytestmark = [pytest.mark.sim,
              pytest.mark.skipif(missing_simulator("verilator") is not None,
                                 reason=missing_simulator("verilator") or "")]


def _qdq_node_tests(data_dir=None, kind=None):
    """The Q/DQ node test cases only (see tests/qaccel/test_backend_golden.py)."""
    if kind != "node":
        return []
    for name in ("quantizelinear", "dequantizelinear"):
        importlib.import_module(f"{node_cases.__name__}.{name}")
    return [case for case in node_cases._NodeTestCases
            if case.name.startswith(("test_quantizelinear", "test_dequantizelinear"))]


rtl_backend.RTLBackend.use(RTL(check=True))
with mock.patch("onnx.backend.test.runner.load_model_tests", _qdq_node_tests):
    _backend_test = onnx.backend.test.BackendTest(rtl_backend, __name__)
_backend_test.include(r"^test_(de)?quantizelinear")
_backend_test.exclude(r"_cuda$")
# pytest collects the unittest classes; every included case must pass (no xfail list).
globals().update(_backend_test.test_cases)


def test_backend_collected_all_qdq_node_tests():
    names = [t for case in _backend_test.test_cases.values() for t in dir(case)
             if t.startswith("test_")]
    q = [n for n in names if n.startswith("test_quantizelinear")]
    dq = [n for n in names if n.startswith("test_dequantizelinear")]
    assert len(q) >= 10 and len(dq) >= 10, (len(q), len(dq))


def test_backend_runs_qdq_in_a_model_with_other_ops():
    """A Q -> DQ -> Relu model: Q/DQ on the RTL, Relu on onnx.reference; cycles recorded."""
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"]),
        helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["dq"]),
        helper.make_node("Relu", ["dq"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5])],
        initializer=[helper.make_tensor("s", TensorProto.FLOAT, [], [0.5]),
                     helper.make_tensor("zp", TensorProto.INT8, [], [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    assert rtl_backend.is_compatible(model)
    rep = rtl_backend.prepare(model)
    (y,) = rep.run([np.float32([-70.0, -1.25, 0.25, 0.75, 100.0])])
    np.testing.assert_array_equal(y, np.float32([0.0, 0.0, 0.0, 1.0, 62.0]))
    assert rep.node_counts == {"QuantizeLinear": 1, "DequantizeLinear": 1}
    run = rtl_backend.RTLBackend.rtl().last_run
    assert run.op == "dequantize" and run.elements == 5 and run.cycles > run.beats == 5


def test_backend_refuses_matmul_nbits():
    node = helper.make_node("MatMulNBits", ["A", "B", "s"], ["y"], domain="com.microsoft",
                            K=32, N=1, bits=4, block_size=32)
    graph = helper.make_graph([node], "m", [], [])
    model = helper.make_model(graph)
    assert not rtl_backend.is_compatible(model)
    with pytest.raises(NotImplementedError, match="MatMulNBits has no RTL unit"):
        rtl_backend.RTLBackend.get_engine().matmul_nbits()
