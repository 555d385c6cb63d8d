"""ONNX backend on the simulated RTL (:class:`qaccel.RTL <qaccel.engine.RTL>`).

QuantizeLinear and DequantizeLinear run on the Quantize and Dequantize units, com.microsoft
MatMulNBits on the MatMulNBits engine (:meth:`qaccel.RTL.matmul_nbits`: accuracy_level 4 on
the v2 engine; float-path nodes only on a configuration with ``float_path``, else they raise
ValueError), all simulated from their generated Verilog (default configuration, Verilator);
every other node runs on ``onnx.reference``. Usable wherever ONNX expects a backend::

    import qaccel.backend.rtl as backend
    rep = backend.prepare(model)
    outputs = rep.run(inputs)
    rep.runs                                   # (op, RunRecord) of every engine node, in order
    backend.RTLBackend.rtl().last_run          # cycles of the last engine node
    onnx.backend.test.BackendTest(backend, __name__)

:meth:`RTLBackend.use` swaps the engine (another configuration, Icarus, ``check=True``);
``prepare(model, engine=RTL(...))`` or ``prepare(model, config=AccelConfig(...))`` runs one
model on another engine without changing the backend's.
"""

from __future__ import annotations

import threading

from qaccel.backend.base import QaccelBackend, QaccelRep

__all__ = ["RTLBackend", "RTLRep", "is_compatible", "prepare", "run_model", "run_node",
           "supports_device"]


class _Engine:
    """An :class:`~qaccel.engine.RTL` that appends ``(op_type, rtl.last_run)`` to ``runs``
    (if given) after every node it runs."""

    def __init__(self, rtl, runs: list | None = None):
        self.rtl = rtl
        self.runs = runs

    def __getattr__(self, name):
        return getattr(self.rtl, name)

    def _record(self, op_type: str, y):
        if self.runs is not None:
            self.runs.append((op_type, self.rtl.last_run))
        return y

    def quantize_linear(self, *args, **kwargs):
        return self._record("QuantizeLinear", self.rtl.quantize_linear(*args, **kwargs))

    def dequantize_linear(self, *args, **kwargs):
        return self._record("DequantizeLinear", self.rtl.dequantize_linear(*args, **kwargs))

    def matmul_nbits(self, *args, **kwargs):
        return self._record("MatMulNBits", self.rtl.matmul_nbits(*args, **kwargs))


class RTLRep(QaccelRep):
    """A model prepared on an RTL engine.

    Members
    -------
    rtl : RTL
        The engine its nodes run on.
    runs : list of (str, RunRecord)
        The op type and :class:`~qaccel.engine.RunRecord` of every node run on the engine so
        far (all runs of this rep), in execution order.
    node_counts : Counter
        As :class:`~qaccel.backend.base.QaccelRep`.
    """

    def __init__(self, model, rtl):
        self.rtl = rtl
        self.runs: list = []
        super().__init__(model, _Engine(rtl, self.runs))


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
        """Run the engine nodes on ``engine`` (an :class:`~qaccel.engine.RTL`) from now on."""
        _check_rtl(engine)
        with cls._lock:
            cls.engine = engine

    @classmethod
    def prepare(cls, model, device: str = "CPU", *, engine=None, config=None,
                **kwargs) -> RTLRep:
        """Prepare ``model`` to run on the backend's engine, or on ``engine`` (an
        :class:`~qaccel.engine.RTL`), or on an RTL of ``config`` (an AccelConfig; the other
        settings — simulator, check, harness, pauses, seed — are the backend engine's if it
        has one yet, else RTL's defaults).  Neither changes the backend's engine."""
        if engine is not None and config is not None:
            raise TypeError("give engine or config, not both")
        if engine is not None:
            _check_rtl(engine)
        elif config is not None:
            from qaccel.engine import RTL

            base = cls.engine          # its settings, if the backend has an engine yet
            engine = RTL(config) if base is None else RTL(
                config, base.simulator, check=base.check, harness=base.harness,
                idle=base.idle, backpressure=base.backpressure, seed=base.seed,
                progress=base.progress)
        else:
            engine = cls.rtl()
        super(QaccelBackend, cls).prepare(model, device, **kwargs)   # onnx's checks only
        return RTLRep(model, engine)

    @classmethod
    def run_model(cls, model, inputs, device="CPU", **kwargs):
        return cls.prepare(model, device, **kwargs).run(inputs)


def _check_rtl(engine) -> None:
    from qaccel.engine import RTL

    if not isinstance(engine, RTL):
        raise TypeError(f"engine must be a qaccel.RTL, not {engine!r}")


prepare = RTLBackend.prepare
run_model = RTLBackend.run_model
run_node = RTLBackend.run_node
supports_device = RTLBackend.supports_device
is_compatible = RTLBackend.is_compatible
