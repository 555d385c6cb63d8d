"""Saturating clamp of a signed integer stream to a narrower integer range."""

from __future__ import annotations

from amaranth.hdl import Module, Shape
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.validate import check_int

__all__ = ["Saturate"]

#: Input widths accepted by :class:`Saturate`.
IN_WIDTH_RANGE = (2, 64)
#: Output widths accepted by :class:`Saturate` (int2..int16 and their unsigned twins).
BITS_RANGE = (2, 16)


class Saturate(wiring.Component):
    """Clamp a stream of signed integers to the range of a ``bits``-bit integer.

    Each input beat ``x`` (``signed(in_width)``) produces one output beat
    ``min(max(x, qmin), qmax)`` of shape ``signed(bits)`` or ``unsigned(bits)``, where
    ``qmin, qmax`` are ``-2**(bits-1), 2**(bits-1)-1`` (signed) or ``0, 2**bits-1`` (unsigned).

    Latency is 1 cycle: a beat accepted on ``i`` at clock edge *n* is offered on ``o`` from
    edge *n + 1*. Throughput is 1 beat per cycle, sustained while ``o`` is ready. The output is
    registered; ``i.ready`` depends combinationally on ``o.ready`` (``~o.valid | o.ready``), so
    the stage holds one beat and never loses or duplicates one under back-pressure.

    Parameters
    ----------
    in_width : :class:`int`
        Width of the signed input, 2..64.
    bits : :class:`int`
        Width of the output integer, 2..16.
    signed : :class:`bool`
        Whether the output range is signed (two's complement) or unsigned.

    Raises
    ------
    :exc:`TypeError`
        If ``in_width`` or ``bits`` is not an integer, or ``signed`` is not a bool.
    :exc:`ValueError`
        If ``in_width`` or ``bits`` is out of range.

    Members
    -------
    i : :py:`In(stream.Signature(signed(in_width)))`
        Input stream.
    o : :py:`Out(stream.Signature(signed(bits)))` or :py:`Out(stream.Signature(unsigned(bits)))`
        Saturated output stream.
    """

    def __init__(self, in_width: int, *, bits: int, signed: bool = True):
        self._in_width = check_int("in_width", in_width, *IN_WIDTH_RANGE)
        self._bits = check_int("bits", bits, *BITS_RANGE)
        if not isinstance(signed, bool):
            raise TypeError(f"signed must be a bool, not {signed!r}")
        self._signed = signed
        super().__init__({
            "i": In(stream.Signature(Shape(self._in_width, signed=True))),
            "o": Out(stream.Signature(Shape(self._bits, signed=self._signed))),
        })

    @classmethod
    def from_qtype(cls, qtype, *, in_width: int) -> Saturate:
        """Build a clamp to the range of an integer :class:`qaccel.model.dtypes.QType`."""
        if not getattr(qtype, "is_int", False) or not hasattr(qtype, "bits"):
            raise TypeError(f"qtype must be an integer QType, not {qtype!r}")
        check_int("in_width", in_width, *IN_WIDTH_RANGE)
        check_int("bits", qtype.bits, *BITS_RANGE)
        return cls(in_width, bits=qtype.bits, signed=qtype.signed)

    @property
    def in_width(self) -> int:
        """Width of the signed input."""
        return self._in_width

    @property
    def bits(self) -> int:
        """Width of the output integer."""
        return self._bits

    @property
    def signed(self) -> bool:
        """Whether the output is signed."""
        return self._signed

    @property
    def qmin(self) -> int:
        """Smallest output value."""
        return -(1 << (self._bits - 1)) if self._signed else 0

    @property
    def qmax(self) -> int:
        """Largest output value."""
        return (1 << (self._bits - 1)) - 1 if self._signed else (1 << self._bits) - 1

    @property
    def latency(self) -> int:
        """Cycles from a beat's acceptance on ``i`` to its first offer on ``o`` (1)."""
        return 1

    def elaborate(self, platform):
        m = Module()

        x = self.i.payload
        with m.If(~self.o.valid | self.o.ready):
            m.d.comb += self.i.ready.eq(1)
            m.d.sync += self.o.valid.eq(self.i.valid)
            with m.If(self.i.valid):
                with m.If(x < self.qmin):
                    m.d.sync += self.o.payload.eq(self.qmin)
                with m.Elif(x > self.qmax):
                    m.d.sync += self.o.payload.eq(self.qmax)
                with m.Else():
                    m.d.sync += self.o.payload.eq(x)

        return m
