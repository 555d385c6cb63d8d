"""The units, engines and simulator builds of the RTL engine, made once per configuration
in a process and shared by every :class:`~qaccel.engine.RTL` of that configuration (the
simulation layers cache their builds per unit object; a finished build on disk is reused,
see :func:`qaccel.sim.elementwise_sim.elementwise_build` and :mod:`qaccel.sim.streamsim`).
"""

from __future__ import annotations

import importlib

from qaccel.model.config import AccelConfig

__all__ = ["UNIT_OF", "elementwise_unit", "nbits_engine", "nbits_stream_sim", "stream_harness",
           "unit_stream_sim"]

#: The unit kind each elementwise operator runs on (DirectML's quantize on the Quantize unit).
UNIT_OF = {"quantize": "quantize", "dml": "quantize", "dequantize": "dequantize"}
#: Units and engines by (kind, AccelConfig).
_UNITS: dict = {}
#: Stream harness builds by ``id(unit)`` (units in :data:`_UNITS` live as long as the process).
_STREAM_SIMS: dict = {}


def elementwise_unit(op: str, config: AccelConfig):
    """The Quantize or Dequantize unit that runs ``op`` (a key of :data:`UNIT_OF`) for
    ``config``, created on first use."""
    kind = UNIT_OF[op]
    unit = _UNITS.get((kind, config))
    if unit is None:
        if kind == "quantize":
            from qaccel.rtl.elementwise.quantize import Quantize as cls
        else:
            from qaccel.rtl.elementwise.dequantize import Dequantize as cls
        unit = _UNITS[kind, config] = cls(config)
    return unit


def nbits_engine(config: AccelConfig):
    """The v2 MatMulNBits engine of ``config``, created on first use."""
    key = ("matmul_nbits_v2", config)
    engine = _UNITS.get(key)
    if engine is None:
        from qaccel.rtl.nbits.matmul_nbits_v2 import MatMulNBitsV2

        engine = _UNITS[key] = MatMulNBitsV2(config)
    return engine


def unit_stream_sim(unit, name: str):
    """The C++ stream harness build of an elementwise ``unit``; returns (sim, built now)."""
    sim = _STREAM_SIMS.get(id(unit))
    if sim is not None:
        return sim, False
    from qaccel.sim.elementwise_sim import elementwise_sim

    sim = _STREAM_SIMS[id(unit)] = elementwise_sim(unit, name=name)
    return sim, sim.built


def nbits_stream_sim(engine):
    """The engine's StreamSim, built (or found) on first use; returns (sim, built now)."""
    sim = _STREAM_SIMS.get(id(engine))
    if sim is not None:
        return sim, False
    from qaccel.sim.elementwise_sim import design_key
    from qaccel.sim.nbits_sim import NBITS_NAME
    from qaccel.sim.streamsim import StreamSim

    sim = _STREAM_SIMS[id(engine)] = StreamSim(engine, name=NBITS_NAME,
                                               design_key=design_key(engine))
    return sim, sim.built


def stream_harness():
    """Return ``qaccel.sim.elementwise_sim.run_elementwise_fast``, or None where the C++
    stream harness cannot be imported."""
    try:
        module = importlib.import_module("qaccel.sim.elementwise_sim")
    except ImportError:
        return None
    return getattr(module, "run_elementwise_fast", None)
