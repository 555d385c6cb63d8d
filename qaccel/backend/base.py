"""An ONNX backend whose quantisation operators run on a qaccel engine.

A model runs on ``onnx.reference.ReferenceEvaluator``; the nodes qaccel implements are swapped
for ``OpRun`` classes that call an *engine*: any object with the golden API's methods
(``quantize_linear``, ``dequantize_linear``, ``matmul_nbits``).  The golden model is one engine
(:mod:`qaccel.backend.golden`); the RTL runner is another, so real ONNX models drive both
through the same code.  Every other node runs on the ONNX reference implementation.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

__all__ = ["QaccelBackend", "QaccelRep", "engine_ops"]

#: (domain, op_type) of the nodes an engine runs.
ENGINE_OPS = {
    ("", "QuantizeLinear"),
    ("", "DequantizeLinear"),
    ("com.microsoft", "MatMulNBits"),
}


def _np_dtype(onnx_type):
    """ONNX TensorProto data type (0 or None = unset) -> numpy dtype or None."""
    return helper.tensor_dtype_to_np_dtype(onnx_type) if onnx_type else None


def engine_ops(engine, counter: Counter | None = None) -> list[type[OpRun]]:
    """Return ``OpRun`` classes that run QuantizeLinear, DequantizeLinear and MatMulNBits on
    ``engine``.  ``counter`` (if given) counts the nodes executed, by op type."""

    def count(op_type):
        if counter is not None:
            counter[op_type] += 1

    class QuantizeLinear(OpRun):
        op_domain = ""

        def _run(self, x, y_scale, y_zero_point=None, axis=1, saturate=1, block_size=0,
                 output_dtype=0, precision=0):
            count("QuantizeLinear")
            y = engine.quantize_linear(
                x, y_scale, y_zero_point, axis=axis, block_size=block_size or 0,
                output_dtype=_np_dtype(output_dtype), saturate=bool(saturate),
                precision=_np_dtype(precision))
            return (y,)

    class DequantizeLinear(OpRun):
        op_domain = ""

        def _run(self, x, x_scale, x_zero_point=None, axis=1, block_size=0, output_dtype=0):
            count("DequantizeLinear")
            y = engine.dequantize_linear(
                x, x_scale, x_zero_point, axis=axis, block_size=block_size or 0,
                output_dtype=_np_dtype(output_dtype))
            return (y,)

    class MatMulNBits(OpRun):
        op_domain = "com.microsoft"

        def _run(self, A, B, scales, zero_points=None, g_idx=None, bias=None, *, K, N, bits=4,
                 block_size, accuracy_level=0):
            count("MatMulNBits")
            y = engine.matmul_nbits(
                A, B, scales, zero_points, g_idx, bias, K=K, N=N, bits=bits,
                block_size=block_size, accuracy_level=accuracy_level)
            return (y,)

    return [QuantizeLinear, DequantizeLinear, MatMulNBits]


class QaccelRep(BackendRep):
    """A prepared model.  ``run(inputs)`` returns the graph outputs as a list of arrays;
    ``node_counts`` counts the nodes the engine executed so far, by op type."""

    def __init__(self, model: onnx.ModelProto, engine):
        self.node_counts: Counter = Counter()
        self._input_names = [i.name for i in model.graph.input
                             if i.name not in {t.name for t in model.graph.initializer}]
        self._evaluator = ReferenceEvaluator(model, new_ops=engine_ops(engine, self.node_counts))

    def run(self, inputs, **kwargs):
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            if len(inputs) > len(self._input_names):
                raise ValueError(f"inputs: the model takes {len(self._input_names)} inputs "
                                 f"({self._input_names}), got {len(inputs)}")
            feeds = dict(zip(self._input_names, inputs, strict=False))
        return list(self._evaluator.run(None, feeds))


class QaccelBackend(Backend):
    """``onnx.backend.base.Backend`` over an engine; subclasses set :attr:`engine`."""

    engine = None

    @classmethod
    def get_engine(cls):
        return cls.engine

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper() == "CPU"

    @classmethod
    def is_compatible(cls, model, device="CPU", **kwargs) -> bool:
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs) -> QaccelRep:
        super().prepare(model, device, **kwargs)
        return QaccelRep(model, cls.get_engine())

    @classmethod
    def run_model(cls, model, inputs, device="CPU", **kwargs):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs, device="CPU", outputs_info=None, **kwargs):
        """Run one node on ``inputs`` (a list of arrays, ``None`` for omitted optional ones;
        array-likes go through ``np.asarray``, a non-native byte order becomes native)."""
        names = list(node.input)
        graph_inputs, feeds = [], {}
        for name, value in zip(names, inputs, strict=False):
            if not name or value is None:
                continue
            value = np.asarray(value)
            if not value.dtype.isnative:  # ONNX tensor types are little-endian
                value = value.astype(value.dtype.newbyteorder("="))
            elem = helper.np_dtype_to_tensor_dtype(value.dtype)
            graph_inputs.append(helper.make_tensor_value_info(name, elem, value.shape))
            feeds[name] = value
        outputs = [helper.make_tensor_value_info(n, onnx.TensorProto.UNDEFINED, None)
                   for n in node.output]
        graph = helper.make_graph([node], "node", graph_inputs, outputs)
        domain = node.domain or ""
        opsets = [helper.make_opsetid("", kwargs.get("opset", onnx.defs.onnx_opset_version()))]
        if domain:
            opsets.append(helper.make_opsetid(domain, 1))
        model = helper.make_model(graph, opset_imports=opsets)
        rep = QaccelRep(model, cls.get_engine())
        return rep.run(feeds)
