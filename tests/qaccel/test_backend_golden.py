"""ONNX's own backend test runner on the golden model, filtered to Q/DQ node tests."""

import importlib
from unittest import mock

import numpy as np
import onnx.backend.test
import onnx.backend.test.case.node as node_cases
from onnx import TensorProto, helper

import qaccel.backend.golden as golden


def _qdq_node_tests(data_dir=None, kind=None):
    """The Q/DQ node test cases only.  ONNX's loader would import (and generate data for)
    every operator's cases, about 20 s per pytest worker; importing the two modules that
    define the Q/DQ cases registers exactly those."""
    if kind != "node":
        return []
    for name in ("quantizelinear", "dequantizelinear"):
        importlib.import_module(f"{node_cases.__name__}.{name}")
    return [case for case in node_cases._NodeTestCases
            if case.name.startswith(("test_quantizelinear", "test_dequantizelinear"))]


with mock.patch("onnx.backend.test.runner.load_model_tests", _qdq_node_tests):
    _backend_test = onnx.backend.test.BackendTest(golden, __name__)
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
    """A Q -> DQ -> Relu model: Q/DQ on the golden model, Relu on onnx.reference."""
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
    rep = golden.prepare(model)
    x = np.float32([-70.0, -1.25, 0.25, 0.75, 100.0])
    (y,) = rep.run([x])
    np.testing.assert_array_equal(y, np.float32([0.0, 0.0, 0.0, 1.0, 62.0]))
    assert rep.node_counts == {"QuantizeLinear": 1, "DequantizeLinear": 1}


def test_backend_run_node():
    node = helper.make_node("QuantizeLinear", ["x", "s"], ["y"], output_dtype=TensorProto.INT4)
    (y,) = golden.run_node(node, [np.float32([1.5, 2.5, -20.0]), np.float32(1.0)])
    assert y.dtype == np.dtype("int4")
    np.testing.assert_array_equal(y.astype(np.int8), [2, 2, -8])
