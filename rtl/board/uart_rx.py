"""An 8N1 UART receiver."""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out

from qaccel.model.validate import check_int

__all__ = ["UartRx"]


class UartRx(wiring.Component):
    """Receive 8N1 frames on ``rx`` (idle high, ``divisor`` cycles per bit, at least 4) and
    offer each byte on ``o``.

    ``rx`` passes a two-flop synchroniser, so it may come straight from a pin. A falling edge
    starts a frame; each bit is sampled once, ``(divisor - 1) // 2`` cycles after its expected
    start (mid-bit), timed from that edge, so the sender's bit rate may differ by a few per
    cent (the frame's 9.5 bits must drift less than about 40 % of a bit: 2 % is safe for
    every divisor from 8 up). A start bit that is high again at mid-bit is a glitch and is
    ignored. The stop bit is sampled mid-bit and the receiver looks for the next start edge
    from there, so frames may follow each other without a pause.

    A UART cannot be back-pressured: ``o.valid`` rises 2 to 3 cycles after the middle of the
    stop bit and the byte waits on ``o`` until taken. If the next byte completes while
    ``o.valid & ~o.ready``, that next byte is dropped and ``overrun`` goes high. A frame whose
    stop bit is 0 is dropped and sets ``framing_error``; the receiver then waits for the line
    to return high (a break). Both flags stay high until reset.

    Members
    -------
    rx : :py:`In(1, init=1)`
    o : :py:`Out(stream.Signature(8))`
    overrun : :py:`Out(1)`
    framing_error : :py:`Out(1)`
    """

    def __init__(self, divisor: int):
        self._divisor = check_int("divisor", divisor, 4, 1 << 24)
        super().__init__({"rx": In(1, init=1), "o": Out(stream.Signature(8)),
                          "overrun": Out(1), "framing_error": Out(1)})

    @property
    def divisor(self) -> int:
        return self._divisor

    @property
    def sample_offset(self) -> int:
        """Cycles from the start of a bit (as seen after the synchroniser) to its sample."""
        return (self._divisor - 1) // 2

    def elaborate(self, platform):
        m = Module()
        d = self._divisor
        rx = Signal(init=1)
        m.submodules.sync = FFSynchronizer(self.rx, rx, init=1)
        timer = Signal(range(d))
        bit = Signal(range(8))
        shreg = Signal(8)

        with m.If(self.o.ready):
            m.d.sync += self.o.valid.eq(0)

        with m.FSM():
            with m.State("idle"):
                with m.If(~rx):
                    m.d.sync += timer.eq(self.sample_offset - 1)
                    m.next = "start"
            with m.State("start"):
                m.d.sync += timer.eq(timer - 1)
                with m.If(timer == 0):
                    m.d.sync += [timer.eq(d - 1), bit.eq(0)]
                    with m.If(rx):
                        m.next = "idle"     # a glitch, not a start bit
                    with m.Else():
                        m.next = "data"
            with m.State("data"):
                m.d.sync += timer.eq(timer - 1)
                with m.If(timer == 0):
                    m.d.sync += [timer.eq(d - 1), shreg.eq(Cat(shreg[1:], rx)), bit.eq(bit + 1)]
                    with m.If(bit == 7):
                        m.next = "stop"
            with m.State("stop"):
                m.d.sync += timer.eq(timer - 1)
                with m.If(timer == 0):
                    with m.If(rx):
                        with m.If(self.o.valid & ~self.o.ready):
                            m.d.sync += self.overrun.eq(1)
                        with m.Else():
                            m.d.sync += [self.o.payload.eq(shreg), self.o.valid.eq(1)]
                        m.next = "idle"
                    with m.Else():
                        m.d.sync += self.framing_error.eq(1)
                        m.next = "break"
            with m.State("break"):
                with m.If(rx):
                    m.next = "idle"
        return m
