"""The Quantize unit: ONNX QuantizeLinear and DirectML ELEMENT_WISE_QUANTIZE_LINEAR on a stream."""

from __future__ import annotations

from qaccel.rtl.elementwise.quantize_lane import QuantizeLane
from qaccel.rtl.elementwise.unit import Elementwise

__all__ = ["Quantize"]


class Quantize(Elementwise):
    """Quantise a stream of ``config.lanes`` elements per beat, bit-exact with
    :func:`qaccel.quantize_linear` and :func:`qaccel.dml_quantize_linear`.

    The stream shell (table, scale-index generator, flow control, latency) is
    :class:`~qaccel.rtl.elementwise.unit.Elementwise`; each element goes through a
    :class:`~qaccel.rtl.elementwise.quantize_lane.QuantizeLane` (its ``regs`` are
    ``regs.lane``). The
    ``x`` beat carries the input codes (float32 / float16 / bfloat16 / int32 bit patterns,
    right-aligned in each lane), the table the scale codes and the zero points' codes, the
    ``y`` beat one output code per lane (right-aligned; :mod:`qaccel.sim.jobs` packs sub-byte
    codes the way ONNX stores them).

    DirectML's operator is QuantizeLinear with ``cast = 1`` and a float32 precision (both
    operands rounded to float32, then divided in float32), a broadcast scale layout, and int8
    or uint8 outputs.
    """

    lane_class = QuantizeLane
