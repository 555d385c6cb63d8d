"""ONNX backend on qaccel's golden model.

QuantizeLinear, DequantizeLinear and com.microsoft MatMulNBits run on the bit-exact golden
model; every other node on ``onnx.reference``.  Usable wherever ONNX expects a backend::

    import qaccel.backend.golden as backend
    outputs = backend.prepare(model).run(inputs)
    onnx.backend.test.BackendTest(backend, __name__)
"""

from __future__ import annotations

import qaccel
from qaccel.backend.base import QaccelBackend

__all__ = ["GoldenBackend", "is_compatible", "prepare", "run_model", "run_node", "supports_device"]


class GoldenBackend(QaccelBackend):
    engine = qaccel


prepare = GoldenBackend.prepare
run_model = GoldenBackend.run_model
run_node = GoldenBackend.run_node
supports_device = GoldenBackend.supports_device
is_compatible = GoldenBackend.is_compatible
