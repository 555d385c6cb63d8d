"""A Quantize lane that takes prepared scales (``AccelConfig.reciprocal_units > 0``) behind the
scale-code interface of the other lanes, for the element-by-element tests: the scale decoded
and cast as :class:`~qaccel.rtl.elementwise.scale_prep.ScalePrep` does it (the same
:class:`~qaccel.rtl.elementwise.operand_cast.OperandCast`), the reciprocal by an exact division
in the
simulator (Verilog ``/``) instead of the iterative unit, delays to meet the lane's
``scale_delay``."""

from __future__ import annotations

from amaranth.hdl import Const, Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from qaccel.rtl.arith.pipeline import delay
from qaccel.rtl.elementwise.operand_cast import OperandCast, cast_control
from qaccel.rtl.elementwise.quantize_lane import QuantizeLane


class PreparedLane(wiring.Component):
    """``lane`` (prepared scales) with ``regs``, ``x``, ``scale`` (a code), ``zero_point`` and
    ``y`` in the same cycles, :attr:`latency` cycles from inputs to ``y``."""

    def __init__(self, lane: QuantizeLane):
        prep = lane.scale_prep(1)
        assert prep is not None, "the lane must take prepared scales"
        self.lane = lane
        self.config = lane.config
        c = lane.config
        self._op = OperandCast(c.scales, casts=lane._casts, cast=lane._cast_needed,
                               sig_width=lane._sig, exp_width=lane._exp)
        self._scale_lat = self._op.latency + 1  # the registered reciprocal
        self._x_extra = max(0, self._scale_lat - lane.scale_delay)
        members = lane.signature.members
        super().__init__({
            "regs": In(members["regs"].shape),
            "x": In(members["x"].shape),
            "scale": In(prep.i.payload.shape()["scale"].shape),
            "zero_point": In(members["zero_point"].shape),
            "y": Out(members["y"].shape),
        })

    @property
    def latency(self) -> int:
        return self.lane.latency + self._x_extra

    def elaborate(self, platform):
        m = Module()
        lane, op = self.lane, self._op
        m.submodules.lane = lane
        m.submodules.op = op
        regs = self.regs
        cast_fmt, keep = cast_control(m, self.config.precisions, regs.prec, regs.cast)
        m.d.comb += [op.code.eq(self.scale), op.fmt.eq(regs.s_fmt),
                     op.cast_fmt.eq(cast_fmt), op.keep.eq(keep)]
        sig = op.o.sig
        k = len(sig) + len(lane.recip)          # the lane takes r without its top bit
        recip = delay(m, (Const((1 << k) - 1, k) // sig)[:len(lane.recip)], 1, "recip")
        s_extra = max(0, lane.scale_delay - self._scale_lat)
        x_extra = self._x_extra
        m.d.comb += [
            lane.regs.eq(regs),
            lane.x.eq(delay(m, self.x, x_extra, "x")),
            lane.scale.eq(delay(m, delay(m, op.o, 1, "scale"), s_extra, "scale_x")),
            lane.recip.eq(delay(m, recip, s_extra, "recip_x")),
            lane.zero_point.eq(delay(m, self.zero_point, x_extra + lane.scale_delay, "zp")),
            self.y.eq(lane.y),
            lane.prep_sel.eq(0),
        ]
        return m
