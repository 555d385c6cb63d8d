"""What the golden and RTL ONNX backend tests share: ONNX's backend test runner filtered to the
Q/DQ node cases and comparing outputs by their bytes, the check that all of them were
collected, and a Q -> DQ -> Relu model."""

from __future__ import annotations

import importlib
from unittest import mock

import numpy as np
import onnx.backend.test
import onnx.backend.test.case.node as node_cases
from onnx import TensorProto, helper

from tests.model.quant_helpers import assert_bitexact

#: The input of :func:`qdq_relu_model` and what the model gives for it.
QDQ_RELU_X = np.float32([-70.0, -1.25, 0.25, 0.75, 100.0])
QDQ_RELU_Y = np.float32([0.0, 0.0, 0.0, 1.0, 62.0])


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


class BitExactBackendTest(onnx.backend.test.BackendTest):
    """ONNX's BackendTest comparing each output with the expected one by dtype, shape and
    bytes (unused container bits of int4 / float4e2m1, -0 and NaN payloads included), where
    the runner's own comparison is ``assert_allclose`` with the case's rtol / atol."""

    @classmethod
    def assert_similar_outputs(cls, ref_outputs, outputs, rtol, atol, model_dir=None):
        assert len(outputs) == len(ref_outputs), (len(outputs), len(ref_outputs), model_dir)
        for k, (out, ref) in enumerate(zip(outputs, ref_outputs, strict=True)):
            assert_bitexact(out, ref, context=f"{model_dir or 'model'} output {k}: ")


def qdq_backend_test(backend, module_name: str) -> onnx.backend.test.BackendTest:
    """A :class:`BitExactBackendTest` for ``backend``, holding the Q/DQ node cases (CUDA ones
    excluded). Put its ``test_cases`` in the test module's globals for pytest to collect
    them; every case must pass (there is no xfail list)."""
    with mock.patch("onnx.backend.test.runner.load_model_tests", _qdq_node_tests):
        backend_test = BitExactBackendTest(backend, module_name)
    backend_test.include(r"^test_(de)?quantizelinear")
    backend_test.exclude(r"_cuda$")
    return backend_test


def assert_collected_all_qdq(backend_test: onnx.backend.test.BackendTest) -> None:
    """At least ten QuantizeLinear and ten DequantizeLinear cases were collected."""
    names = [t for case in backend_test.test_cases.values() for t in dir(case)
             if t.startswith("test_")]
    q = [n for n in names if n.startswith("test_quantizelinear")]
    dq = [n for n in names if n.startswith("test_dequantizelinear")]
    assert len(q) >= 10 and len(dq) >= 10, (len(q), len(dq))


def qdq_relu_model() -> onnx.ModelProto:
    """QuantizeLinear -> DequantizeLinear -> Relu on 5 float32 values (scale 0.5, zp 3)."""
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
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
