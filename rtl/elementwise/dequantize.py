"""The Dequantize unit: ONNX DequantizeLinear on a stream."""

from __future__ import annotations

from qaccel.rtl.elementwise.dequantize_lane import DequantizeLane
from qaccel.rtl.elementwise.unit import Elementwise

__all__ = ["Dequantize"]


class Dequantize(Elementwise):
    """Dequantise a stream of ``config.lanes`` elements per beat, bit-exact with
    :func:`qaccel.dequantize_linear`.

    The stream shell (table, scale-index generator, flow control, latency) is
    :class:`~qaccel.rtl.elementwise.unit.Elementwise`; each element goes through a
    :class:`~qaccel.rtl.elementwise.dequantize_lane.DequantizeLane` (its ``regs`` are
    ``regs.lane``). The
    ``x`` beat carries the input codes (integer, float8 or float4 codes, right-aligned in each
    lane; sub-byte types one per lane), the table the scale codes and the zero points' codes
    (the input type's), the ``y`` beat one float32 / float16 / bfloat16 code per lane.
    """

    lane_class = DequantizeLane
