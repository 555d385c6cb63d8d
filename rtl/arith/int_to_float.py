"""Convert a signed or unsigned integer to an exact wide float."""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Shape, Signal, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.validate import check_int
from qaccel.rtl.arith.float_unpack import FloatClass
from qaccel.rtl.arith.pipeline import stage
from qaccel.rtl.arith.wide_float import MAX_EXP_WIDTH, wide_float_layout

__all__ = ["MAX_WIDTH", "IntToFloat", "min_exp_width"]

#: Widest integer :class:`IntToFloat` accepts.
MAX_WIDTH = 64


def min_exp_width(width: int) -> int:
    """Return the narrowest ``exp_width`` :class:`IntToFloat` accepts for ``width``-bit integers:
    the signed field must hold exponents ``0 .. width - 1``."""
    return Shape.cast(range(width)).width + 1


class IntToFloat(wiring.Component):
    """Convert a ``width``-bit integer, read as signed or unsigned at run time, to a wide float.

    The result is exact (``sticky = 0``): ``sig`` is the magnitude shifted left by its
    leading-zero count, so its top bit is set, and ``exp`` is the position of the magnitude's
    most significant bit (``0 .. width - 1``). ``sign`` is 1 for negative inputs. Every
    input converts, ``-2**(width - 1)`` included (its magnitude needs all ``width`` bits of
    ``sig``). Zero gives ``cls = ZERO``, ``sign = 0`` (+0), ``exp = 0``, ``sig = 0``; every
    other input ``cls = NORMAL``.

    Latency is ``latency`` cycles (0: combinational, no clock; 1: the output is registered,
    so an integer applied in cycle *n* is converted on ``o`` in cycle *n + 1*; 2: the
    magnitude is registered too, before the normalisation; 3: the normalisation too, after
    its shifts of 4 and more). Throughput is one integer per cycle. There is no handshake; a
    stream wrapper adds one.

    Parameters
    ----------
    width : :class:`int`
        Integer width, 2 .. :data:`MAX_WIDTH` (64); also the width of ``sig``.
    exp_width : :class:`int`
        Width of ``exp``: at least :func:`min_exp_width` (6 for 32 bits), at most
        :data:`~qaccel.rtl.arith.wide_float.MAX_EXP_WIDTH` (32).
    latency : :class:`int`
        Register stages, 0 to 3.

    Raises
    ------
    :exc:`TypeError`
        If a parameter is not an integer.
    :exc:`ValueError`
        If a parameter is out of range.

    Members
    -------
    i : :py:`In(unsigned(width))`
        The integer's bit pattern.
    signed : :py:`In(1)`
        1: ``i`` is two's complement; 0: ``i`` is unsigned.
    o : :py:`Out(wide_float_layout(width, exp_width))`
        The value as an exact wide float.
    """

    def __init__(self, *, width: int, exp_width: int, latency: int = 1):
        self._width = check_int("width", width, 2, MAX_WIDTH)
        check_int("exp_width", exp_width)
        lo = min_exp_width(width)
        if not lo <= exp_width <= MAX_EXP_WIDTH:
            raise ValueError(f"exp_width must be in [{lo}, {MAX_EXP_WIDTH}] for width {width}, "
                             f"not {exp_width}")
        self._exp_width = exp_width
        self._latency = check_int("latency", latency, 0, 3)
        super().__init__({
            "i": In(unsigned(width)),
            "signed": In(1),
            "o": Out(wide_float_layout(width, exp_width)),
        })

    @property
    def width(self) -> int:
        """Width of the integer and of the output's ``sig``."""
        return self._width

    @property
    def exp_width(self) -> int:
        """Width of the output's ``exp``."""
        return self._exp_width

    @property
    def latency(self) -> int:
        """Cycles from an integer on ``i`` to its value on ``o`` (0 .. 3)."""
        return self._latency

    def elaborate(self, platform):
        m = Module()
        w = self._width
        neg = Signal()
        m.d.comb += neg.eq(self.signed & self.i[w - 1])
        mag = Signal(w)
        m.d.comb += mag.eq(Mux(neg, -self.i, self.i))      # -(-2**(w-1)) is 2**(w-1) mod 2**w
        p = stage(m, self._latency >= 2, "mag", neg=neg, mag=mag)

        # Normalise in log2(w) steps: shift by 2**k when the top 2**k bits are all zero. The
        # shifts add up to the leading-zero count of any non-zero magnitude.
        # With latency 3 the shifts of 4 and more and those below are in separate stages.
        x, lzc, neg = p.mag, [], p.neg
        steps = (w - 1).bit_length()
        for k in reversed(range(steps)):
            s = 1 << k
            if s == min(2, 1 << (steps - 1)) and self._latency >= 3:
                h = stage(m, True, "half", x=x, neg=neg,
                          **{f"z{t}": z for z, t in lzc})
                x, neg, lzc = h.x, h.neg, [(getattr(h, f"z{t}"), t) for _, t in lzc]
            z = Signal(name=f"lz{s}")
            m.d.comb += z.eq(x[w - s:] == 0)
            nxt = Signal(w, name=f"norm{s}")
            m.d.comb += nxt.eq(Mux(z, x << s, x))
            x = nxt
            lzc.append((z, s))
        count = Signal(range(w))
        m.d.comb += count.eq(sum(Mux(z, s, 0) for z, s in lzc))

        # The fields as plain expressions (no conditional assignments): Yosys then writes a
        # continuous assignment, which Icarus evaluates at time 0 even when the registers
        # above never change (an `always @*` process would stay X there).
        nonzero = x[w - 1]                  # a normalised non-zero magnitude has its top bit
        res = Signal(self.o.shape())
        m.d.comb += [
            res.sign.eq(neg & nonzero),
            res.exp.eq(Mux(nonzero, w - 1 - count, 0)),
            res.sig.eq(x),
            res.cls.eq(Mux(nonzero, FloatClass.NORMAL, FloatClass.ZERO)),
        ]

        domain = m.d.sync if self._latency else m.d.comb
        domain += self.o.eq(res)
        return m
