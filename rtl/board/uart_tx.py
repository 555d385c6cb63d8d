"""An 8N1 UART transmitter."""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.validate import check_int

__all__ = ["UartTx"]


class UartTx(wiring.Component):
    """Send each byte of ``i`` on ``tx`` as an 8N1 frame: a start bit (0), eight data bits
    least significant first, a stop bit (1); every bit lasts ``divisor`` cycles
    (``baud = f_clk / divisor``).

    ``tx`` idles high (also in reset). ``i.ready`` is high while the transmitter is idle and
    in the last cycle of a stop bit, so a byte offered without a pause starts right after the
    previous frame: throughput one byte per ``10 * divisor`` cycles. The start bit begins the
    cycle after the transfer.

    Members
    -------
    i : :py:`In(stream.Signature(8))`
    tx : :py:`Out(1, init=1)`
    """

    def __init__(self, divisor: int):
        self._divisor = check_int("divisor", divisor, 1, 1 << 24)
        super().__init__({"i": In(stream.Signature(8)), "tx": Out(1, init=1)})

    @property
    def divisor(self) -> int:
        return self._divisor

    def elaborate(self, platform):
        m = Module()
        d = self._divisor
        timer = Signal(range(d))          # cycles left in the current bit, minus one
        left = Signal(range(10))          # bits still to send after the current one
        shreg = Signal(9)                 # those bits, next one lowest
        active = Signal()
        last_cycle = (left == 0) & (timer == 0)
        m.d.comb += self.i.ready.eq(~active | last_cycle)

        with m.If(active):
            with m.If(timer != 0):
                m.d.sync += timer.eq(timer - 1)
            with m.Elif(left != 0):
                m.d.sync += [self.tx.eq(shreg[0]), shreg.eq(shreg >> 1), left.eq(left - 1),
                             timer.eq(d - 1)]
            with m.Else():
                m.d.sync += active.eq(0)
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [self.tx.eq(0), shreg.eq(Cat(self.i.payload, Const(1, 1))),
                         left.eq(9), timer.eq(d - 1), active.eq(1)]
        return m
