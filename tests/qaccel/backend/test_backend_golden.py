"""ONNX's own backend test runner on the golden model, filtered to Q/DQ node tests."""

import ml_dtypes
import numpy as np
from onnx import TensorProto, helper

import qaccel.backend.golden as golden
from tests.model.quant_helpers import assert_bitexact
from tests.qaccel.backend.backend_cases import (
    QDQ_RELU_X,
    QDQ_RELU_Y,
    assert_collected_all_qdq,
    qdq_backend_test,
    qdq_relu_model,
)

_backend_test = qdq_backend_test(golden, __name__)
globals().update(_backend_test.test_cases)


def test_backend_collected_all_qdq_node_tests():
    assert_collected_all_qdq(_backend_test)


def test_backend_runs_qdq_in_a_model_with_other_ops():
    """A Q -> DQ -> Relu model: Q/DQ on the golden model, Relu on onnx.reference."""
    rep = golden.prepare(qdq_relu_model())
    (y,) = rep.run([QDQ_RELU_X])
    assert_bitexact(y, QDQ_RELU_Y)
    assert rep.node_counts == {"QuantizeLinear": 1, "DequantizeLinear": 1}


def test_backend_run_node():
    node = helper.make_node("QuantizeLinear", ["x", "s"], ["y"], output_dtype=TensorProto.INT4)
    (y,) = golden.run_node(node, [np.float32([1.5, 2.5, -20.0]), np.float32(1.0)])
    assert_bitexact(y, np.array([2, 2, -8], ml_dtypes.int4))   # -8 is 0x08, not 0xF8
