"""ONNX backend on the simulated RTL (:class:`qaccel.RTL <qaccel.engine.RTL>`).

QuantizeLinear and DequantizeLinear run on the Quantize and Dequantize units, simulated from
their generated Verilog (default configuration, Verilator); every other node runs on
``onnx.reference``. MatMulNBits has no RTL unit yet: a model holding one is reported as not
compatible, and running it raises NotImplementedError. Usable wherever ONNX expects a
backend::

    import qaccel.backend.rtl as backend
    outputs = backend.prepare(model).run(inputs)
    backend.RTLBackend.rtl().last_run          # cycles of the last Q/DQ node
    onnx.backend.test.BackendTest(backend, __name__)

:meth:`RTLBackend.use` swaps the engine (another configuration, Icarus, ``check=True``).
"""

from __future__ import annotations

import threading

from qaccel.backend.base import QaccelBackend

__all__ = ["RTLBackend", "is_compatible", "prepare", "run_model", "run_node",
           "supports_device"]


class _Engine:
    """An :class:`~qaccel.engine.RTL` with MatMulNBits refused by a clear message."""

    def __init__(self, rtl):
        self.rtl = rtl

    def __getattr__(self, name):
        return getattr(self.rtl, name)

    def matmul_nbits(self, *args, **kwargs):
        raise NotImplementedError("MatMulNBits has no RTL unit yet; run the model on "
                                  "qaccel.backend.golden")


class RTLBackend(QaccelBackend):
    """The ONNX backend over an :class:`~qaccel.engine.RTL` engine, created on first use."""

    engine = None
    _lock = threading.Lock()

    @classmethod
    def rtl(cls):
        """Return the :class:`~qaccel.engine.RTL` the nodes run on (an ``RTL()`` on the
        default configuration unless :meth:`use` set another)."""
        with cls._lock:
            if cls.engine is None:
                from qaccel.engine import RTL

                cls.engine = RTL()
            return cls.engine

    @classmethod
    def get_engine(cls):
        return _Engine(cls.rtl())

    @classmethod
    def use(cls, engine) -> None:
        """Run the Q/DQ nodes on ``engine`` (an :class:`~qaccel.engine.RTL`) from now on."""
        from qaccel.engine import RTL

        if not isinstance(engine, RTL):
            raise TypeError(f"engine must be a qaccel.RTL, not {engine!r}")
        with cls._lock:
            cls.engine = engine

    @classmethod
    def is_compatible(cls, model, device="CPU", **kwargs) -> bool:
        """CPU only, and no MatMulNBits node (no RTL unit for it yet)."""
        nodes = getattr(getattr(model, "graph", None), "node", ())
        return cls.supports_device(device) and not any(
            n.op_type == "MatMulNBits" for n in nodes)


prepare = RTLBackend.prepare
run_model = RTLBackend.run_model
run_node = RTLBackend.run_node
supports_device = RTLBackend.supports_device
is_compatible = RTLBackend.is_compatible
