"""qaccel: a quantisation and low-bit matmul accelerator, its golden model and its tests.

The golden model (``qaccel.model``) is re-exported here, and :class:`~qaccel.engine.RTL`, the
same API answered by simulating the generated Verilog.  Attributes load lazily, so
``import qaccel`` neither imports Numba or Amaranth nor compiles anything.

>>> import numpy as np, qaccel
>>> qaccel.quantize_linear(np.float32([1.5, -2.5]), np.float32(1.0), np.int8(0))
array([ 2, -2], dtype=int8)
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "quantize_linear": "qaccel.model.quant",
    "dequantize_linear": "qaccel.model.quant",
    "dml_quantize_linear": "qaccel.model.dml",
    "matmul_nbits": "qaccel.model.nbits",
    "quantize_weights_nbits": "qaccel.model.nbits",
    "mx_quantize": "qaccel.model.mx",
    "mx_dequantize": "qaccel.model.mx",
    "MX_FORMATS": "qaccel.model.mx",
    "RTL": "qaccel.engine",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'qaccel' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
