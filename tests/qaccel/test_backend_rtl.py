"""ONNX's own backend test runner on the simulated RTL, filtered to the Q/DQ node tests: every
case must be bit-exact (the runner compares the outputs; ``check=True`` also compares each
call with the golden model)."""

import numpy as np
import pytest
from onnx import helper

import qaccel.backend.rtl as rtl_backend
from qaccel.engine import RTL
from qaccel.sim.runner import missing_simulator
from tests.qaccel.backend_cases import (
    QDQ_RELU_X,
    QDQ_RELU_Y,
    assert_collected_all_qdq,
    qdq_backend_test,
    qdq_relu_model,
)

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
    np.testing.assert_array_equal(y, QDQ_RELU_Y)
    assert rep.node_counts == {"QuantizeLinear": 1, "DequantizeLinear": 1}
    run = rtl_backend.RTLBackend.rtl().last_run
    assert run.op == "dequantize" and run.elements == 5 and run.cycles > run.beats == 5


def test_backend_takes_matmul_nbits():
    """MatMulNBits nodes run on the engine (tests/qaccel/test_real_model_nbits.py runs a
    quantised model through it)."""
    node = helper.make_node("MatMulNBits", ["A", "B", "s"], ["y"], domain="com.microsoft",
                            K=32, N=1, bits=4, block_size=32)
    graph = helper.make_graph([node], "m", [], [])
    model = helper.make_model(graph)
    assert rtl_backend.is_compatible(model)
