"""Round a wide float to a precision's significand width, ties to even, with an unbounded
exponent: the Quantize lane's quotient rounding where only integer outputs follow."""

from __future__ import annotations

from amaranth.hdl import Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.floatfmt import float_format
from qaccel.model.validate import check_int
from qaccel.rtl.arith.float_unpack import FloatClass
from qaccel.rtl.arith.pipeline import choose, field_width, stage
from qaccel.rtl.arith.wide_float import MAX_EXP_WIDTH, MAX_SIG_WIDTH, wide_float_layout

__all__ = ["SignificandRound"]


class SignificandRound(wiring.Component):
    """Round ``i`` to the significand width ``p = mbits + 1`` of ``formats[fmt]``, to nearest,
    ties to even, whatever its exponent: no subnormals and no overflow (the exponent grows by
    one when the significand rounds up to a power of two).

    This is :class:`~qaccel.rtl.arith.float_round.FloatRound`'s ``value`` wherever that is a normal
    number of the format. Elsewhere it differs, and an integer conversion that follows
    (:class:`~qaccel.rtl.arith.float_to_int.FloatToInt`, at most 16-bit outputs, formats with
    ``emax >= 15`` and ``emin <= -2``: float16, bfloat16, float32, float64) cannot tell: a
    value in the format's subnormal range is below 1/4 either way, so both round to the
    integer 0; one that would overflow to infinity is at least ``2**16`` either way, so both
    saturate.

    ``o`` is exact (``sticky`` 0) with a ``sig_width_out = max p``-bit significand (the bits
    below a narrower format's ``p`` are 0) and an ``exp_width + 1``-bit exponent; ``ZERO``,
    ``INF`` and ``NAN`` pass with their sign (their other fields 0), ``SUBNORMAL`` inputs are
    rounded as normal ones and come out ``NORMAL``. An ``fmt`` past the formats selects the
    last. ``sig_width`` must exceed every ``p`` (a round bit).

    Latency 2 cycles (the round and sticky bits and the increment decision, then the
    increment), one value per cycle, no handshake.

    Members
    -------
    i : :py:`In(wide_float_layout(sig_width, exp_width))`
    fmt : :py:`In(unsigned(...))`
    o : :py:`Out(wide_float_layout(sig_width_out, exp_width + 1))`
    """

    latency = 2

    def __init__(self, formats, *, sig_width: int, exp_width: int):
        self._formats = tuple(float_format(f, param="formats") for f in formats)
        if not self._formats:
            raise ValueError("formats must name at least one format, not ()")
        self._p = [f.mbits + 1 for f in self._formats]
        self._sig_width = check_int("sig_width", sig_width, max(self._p) + 1, MAX_SIG_WIDTH)
        self._exp_width = check_int("exp_width", exp_width, 2, MAX_EXP_WIDTH - 1)
        super().__init__({
            "i": In(wide_float_layout(sig_width, exp_width)),
            "fmt": In(field_width(len(self._formats))),
            "o": Out(wide_float_layout(max(self._p), exp_width + 1)),
        })

    def elaborate(self, platform):
        m = Module()
        W, P, x = self._sig_width, max(self._p), self.i
        # per format: the kept bits' mask, the last kept bit, the round bit, the bits below
        kept = choose(m, self.fmt, [((1 << p) - 1) << (W - p) for p in self._p], W, "kept")
        lsb = choose(m, self.fmt, [1 << (W - p) for p in self._p], W, "lsb")
        rnd = choose(m, self.fmt, [1 << (W - p - 1) for p in self._p], W, "rnd")
        low = ~kept & ~rnd
        up = (x.sig & rnd).any() & ((x.sig & low).any() | x.sticky | (x.sig & lsb).any())
        finite = (x.cls == FloatClass.NORMAL) | (x.cls == FloatClass.SUBNORMAL)
        s = stage(m, True, "s1", sig=x.sig & kept, lsb=lsb, up=up & finite, exp=x.exp,
                  sign=x.sign, cls=Mux(finite, FloatClass.NORMAL, x.cls), finite=finite)
        total = Signal(W + 1)
        m.d.comb += total.eq(s.sig + Mux(s.up, s.lsb, 0))
        carry = total[W]                            # rounded up to 2**(exp + 1)
        o = Signal(self.o.shape(), name="o_reg", reset_less=True)
        m.d.sync += [o.sign.eq(s.sign), o.cls.eq(s.cls), o.sticky.eq(0)]  # (all driven: Icarus)
        with m.If(s.finite):
            m.d.sync += [o.sig.eq(Mux(carry, Const(1 << (P - 1), P), total[W - P:W])),
                         o.exp.eq(s.exp + carry)]
        with m.Else():
            m.d.sync += [o.sig.eq(0), o.exp.eq(0)]
        m.d.comb += self.o.eq(o)
        return m
