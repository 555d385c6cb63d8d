"""The RTL as an engine: the golden model's API, answered by simulating the generated Verilog.

>>> import numpy as np, qaccel
>>> rtl = qaccel.RTL()                                     # default AccelConfig, Verilator
>>> y = rtl.quantize_linear(np.float32([1.5, -2.5]), np.float32(1.0), np.int8(0))
>>> y, rtl.last_run.cycles                                 # doctest: +SKIP
(array([ 2, -2], dtype=int8), 80)

:class:`RTL` has the methods and signatures of :func:`qaccel.quantize_linear`,
:func:`qaccel.dequantize_linear`, :func:`qaccel.dml_quantize_linear` and
:func:`qaccel.matmul_nbits` (on the MatMulNBits engine v2, see :meth:`RTL.matmul_nbits`). The
record of the last call is :attr:`RTL.last_run` (:class:`RunRecord`).

Modules: :mod:`.facade` (the RTL class: validate, plan, simulate, decode), :mod:`.tiling`
(a call's boxes of ``x`` as unit jobs), :mod:`.builds` (the units, engines and simulator
builds, once per configuration), :mod:`.examples` (random example calls).
"""

from .examples import example_call
from .facade import HARNESSES, RTL, STREAM_BATCH_BEATS, RTLMismatchError, RunRecord

__all__ = ["HARNESSES", "RTL", "STREAM_BATCH_BEATS", "RTLMismatchError", "RunRecord",
           "example_call"]
