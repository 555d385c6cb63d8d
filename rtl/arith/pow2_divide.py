"""Divide a wide float by a power of two: an exponent subtraction, exact, one cycle."""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring

from qaccel.model.validate import check_int
from qaccel.rtl.arith.float_divide import QuotientPorts, quotient_class
from qaccel.rtl.arith.float_unpack import FloatClass
from qaccel.rtl.arith.pipeline import delay
from qaccel.rtl.arith.wide_float import MAX_SIG_WIDTH

__all__ = ["Pow2Divide"]


class Pow2Divide(QuotientPorts, wiring.Component):
    """Divide ``a`` by ``b`` where ``b`` is a power of two, zero, infinity or NaN: the
    float8e8m0 (OCP Microscaling) scale path of QuantizeLinear, with no divider.

    The interface and the result are those of :class:`~qaccel.rtl.arith.float_divide.FloatDivide`
    with the same widths (so the two are interchangeable in a lane): ``q`` is ``a / b`` with
    ``a``'s significand placed at the top of ``q.sig``, ``q.exp = a.exp - b.exp`` and
    ``sticky = 0``, which is exact; the special classes and signs follow
    :func:`~qaccel.rtl.arith.float_divide.quotient_class`. ``b.sig`` is ignored: a finite non-zero
    ``b`` must be a power of two (an unsigned e8m0 code decodes to one; so does its rounding to
    float16 or bfloat16 when it stays finite and non-zero), and ``a`` must be exact with a
    normalised significand, as for the divider.

    Latency :attr:`latency` cycles (1: the result is registered; 2: the operands too, so that
    the class and exponent logic starts at a register, not at the operand's source: free
    beside a divider of longer latency), one division per cycle, no handshake.

    Parameters
    ----------
    a_width : :class:`int`
        Width of ``a.sig``, in ``[1, q_width]``.
    b_width : :class:`int`
        Width of ``b.sig``, in ``[1, MAX_SIG_WIDTH]``.
    q_width : :class:`int`
        Width of ``q.sig``, in ``[1, MAX_SIG_WIDTH]``.
    exp_width : :class:`int`
        Width of ``a.exp`` and ``b.exp``, in ``[2, MAX_EXP_WIDTH - 2]``.
    latency : :class:`int`
        1 or 2 (default 1).

    Raises
    ------
    :exc:`TypeError`
        If a parameter is not an integer.
    :exc:`ValueError`
        If a parameter is out of its range.

    Members
    -------
    a : :py:`In(wide_float_layout(a_width, exp_width))`
    b : :py:`In(wide_float_layout(b_width, exp_width))`
    q : :py:`Out(wide_float_layout(q_width, exp_width + 2))`
    """

    def __init__(self, *, a_width: int, b_width: int, q_width: int, exp_width: int,
                 latency: int = 1):
        check_int("a_width", a_width, 1, check_int("q_width", q_width, 1, MAX_SIG_WIDTH))
        self._latency = check_int("latency", latency, 1, 2)
        super().__init__(self._quotient_members(a_width=a_width, b_width=b_width,
                                                q_width=q_width, exp_width=exp_width))

    @property
    def latency(self) -> int:
        """Cycles from ``a`` and ``b`` to their quotient on ``q``."""
        return self._latency

    def elaborate(self, platform):
        m = Module()
        a, b = delay(m, self.a, self._latency - 1, "a"), delay(m, self.b, self._latency - 1, "b")
        cls, sign = quotient_class(m, a, b)
        out = Signal(self.q.shape())
        m.d.comb += [out.sign.eq(sign), out.cls.eq(cls)]
        with m.If(cls == FloatClass.NORMAL):
            m.d.comb += [out.exp.eq(a.exp - b.exp),
                         out.sig.eq(a.sig << (self._q_width - self._a_width))]
        q = Signal(self.q.shape(), name="q_reg", reset_less=True)
        m.d.sync += q.eq(out)
        m.d.comb += self.q.eq(q)
        return m
