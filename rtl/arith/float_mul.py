"""Multiply two wide floats, exactly or truncated to a narrower significand with a sticky bit."""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.validate import check_int
from qaccel.rtl.arith.float_unpack import FloatClass
from qaccel.rtl.arith.pipeline import stage
from qaccel.rtl.arith.wide_float import MAX_EXP_WIDTH, MAX_SIG_WIDTH, wide_float_layout

__all__ = ["LATENCIES", "FloatMul"]

#: Latencies :class:`FloatMul` supports (register stages).
LATENCIES = (0, 1, 2, 3, 4)
#: Bits of the wider operand per partial product (a MULT18X18D's width).
_SLICE = 18


class FloatMul(wiring.Component):
    """Multiply two wide floats: ``p = a * b``.

    The inputs are exact wide floats (:func:`~qaccel.rtl.arith.wide_float.wide_float_layout`,
    ``sticky = 0``; a sticky input gives an unspecified result) with ``a_width``- and
    ``b_width``-bit significands and a common ``exp_width``. The output ``p`` has an
    ``out_width``-bit significand and ``exp_width + 1`` exponent bits:

    * With the default ``out_width = a_width + b_width``, ``p`` is the exact product
      (``sticky = 0``).
    * A smaller ``out_width`` keeps the product's ``out_width`` leading bits (truncation toward
      zero) and sets ``sticky`` when any dropped bit is 1. :class:`~qaccel.rtl.arith.float_round.
      FloatRound` with ``sig_width = out_width`` then rounds ``p`` correctly to every format of
      at most ``out_width - 1`` significant bits (the kept bits hold a round bit).

    Exponents: ``p.exp`` is ``a.exp + b.exp`` or one more, so every product of inputs whose
    exponents span the whole ``signed(exp_width)`` field fits ``signed(exp_width + 1)``; the
    product never overflows or underflows here (:class:`~qaccel.rtl.arith.float_round.FloatRound`
    decides that for its format).

    Special values, as IEEE 754 and x86-64 SSE (NumPy on this machine) give them: a NaN operand
    gives a NaN with that operand's sign (``a``'s if both are NaN); ``0 * inf`` gives x86's
    default NaN, which is negative (``0xFFC00000`` in float32); ``inf`` times a non-zero
    value or ``inf`` gives ``inf``; a zero operand (with a finite one) gives a zero. Infinite,
    zero and finite results carry the exclusive or of the signs. An input class ``SUBNORMAL``
    counts as ``NORMAL``. On the output, finite non-zero results are ``NORMAL``, and ``exp``,
    ``sig`` and ``sticky`` are 0 for ``ZERO``, ``INF`` and ``NAN``.

    Latency is ``latency`` cycles (0: combinational, no clock): operands applied in cycle *n*
    give their product on ``p`` in cycle *n + latency*. Throughput is one product per cycle.
    There is no handshake; a stream wrapper adds one. The stages are: (1) the
    ``a_width x b_width`` multiplier, a plain ``*`` that synthesis maps to DSP blocks, the
    exponent sum and the special cases; (2) normalisation (a one-bit shift) and truncation.
    ``latency`` 1 registers the output, 2 also the product, 3 also the operands (before the
    multiplier), 4 also the partial products of 18-bit slices of the wider operand (before
    their sum).

    Parameters
    ----------
    a_width : :class:`int`
        Width of ``a.sig``, 1 to :data:`~qaccel.rtl.arith.wide_float.MAX_SIG_WIDTH` (256).
    b_width : :class:`int`
        Width of ``b.sig``, 1 to 256.
    exp_width : :class:`int`
        Width of ``a.exp`` and ``b.exp``, 2 to ``MAX_EXP_WIDTH - 1`` (31); ``p.exp`` has one
        bit more.
    out_width : :class:`int` or None
        Width of ``p.sig``, 1 to ``a_width + b_width`` (at most 256); None (the default) means
        ``a_width + b_width``, the exact product.
    latency : :class:`int`
        Register stages, one of :data:`LATENCIES`.

    Raises
    ------
    :exc:`TypeError`
        If a width or ``latency`` is not an integer (``out_width`` may also be None).
    :exc:`ValueError`
        If a width is out of range (``out_width`` must be given when ``a_width + b_width``
        exceeds 256), or ``latency`` is not in :data:`LATENCIES`.

    Members
    -------
    a : :py:`In(wide_float_layout(a_width, exp_width))`
        First factor.
    b : :py:`In(wide_float_layout(b_width, exp_width))`
        Second factor.
    p : :py:`Out(wide_float_layout(out_width, exp_width + 1))`
        The product.
    """

    def __init__(self, *, a_width: int, b_width: int, exp_width: int,
                 out_width: int | None = None, latency: int = 1):
        self._a_width = check_int("a_width", a_width, 1, MAX_SIG_WIDTH)
        self._b_width = check_int("b_width", b_width, 1, MAX_SIG_WIDTH)
        self._exp_width = check_int("exp_width", exp_width, 2, MAX_EXP_WIDTH - 1)
        full = self._a_width + self._b_width
        if out_width is None:
            if full > MAX_SIG_WIDTH:
                raise ValueError(f"out_width must be given when a_width + b_width = {full} "
                                 f"exceeds {MAX_SIG_WIDTH}")
            out_width = full
        self._out_width = check_int("out_width", out_width, 1, min(full, MAX_SIG_WIDTH))
        self._latency = check_int("latency", latency, min(LATENCIES), max(LATENCIES))
        super().__init__({
            "a": In(wide_float_layout(self._a_width, self._exp_width)),
            "b": In(wide_float_layout(self._b_width, self._exp_width)),
            "p": Out(wide_float_layout(self._out_width, self._exp_width + 1)),
        })

    @property
    def a_width(self) -> int:
        """Width of ``a.sig``."""
        return self._a_width

    @property
    def b_width(self) -> int:
        """Width of ``b.sig``."""
        return self._b_width

    @property
    def exp_width(self) -> int:
        """Width of the input exponents (``p.exp`` has one bit more)."""
        return self._exp_width

    @property
    def out_width(self) -> int:
        """Width of ``p.sig``."""
        return self._out_width

    @property
    def exact(self) -> bool:
        """Whether ``p`` is the exact product (``out_width == a_width + b_width``)."""
        return self._out_width == self._a_width + self._b_width

    @property
    def latency(self) -> int:
        """Cycles from operands on ``a`` and ``b`` to their product on ``p``."""
        return self._latency

    def elaborate(self, platform):
        m = Module()
        a, b = self.a, self.b
        P = self._a_width + self._b_width
        W = self._out_width

        # -- stage 1: multiply, add the exponents, classify ----------------------------------
        esum = Signal(signed(self._exp_width + 1))
        m.d.comb += esum.eq(a.exp + b.exp)

        def is_(x, cls):
            return x.cls == cls

        a_nan, b_nan = is_(a, FloatClass.NAN), is_(b, FloatClass.NAN)
        a_inf, b_inf = is_(a, FloatClass.INF), is_(b, FloatClass.INF)
        a_zero, b_zero = is_(a, FloatClass.ZERO), is_(b, FloatClass.ZERO)
        cls = Signal(FloatClass)
        sign = Signal()
        m.d.comb += sign.eq(a.sign ^ b.sign)
        with m.If(a_nan | b_nan):
            m.d.comb += [cls.eq(FloatClass.NAN), sign.eq(Mux(a_nan, a.sign, b.sign))]
        with m.Elif((a_inf & b_zero) | (a_zero & b_inf)):
            m.d.comb += [cls.eq(FloatClass.NAN), sign.eq(1)]          # x86 default NaN
        with m.Elif(a_inf | b_inf):
            m.d.comb += cls.eq(FloatClass.INF)
        with m.Elif(a_zero | b_zero):
            m.d.comb += cls.eq(FloatClass.ZERO)
        with m.Else():
            m.d.comb += cls.eq(FloatClass.NORMAL)

        i = stage(m, self._latency >= 3, "in", a_sig=a.sig, b_sig=b.sig, esum=esum, cls=cls,
                  sign=sign)
        # the product in partial products of 18-bit slices of the wider operand (one
        # MULT18X18D column each), registered with latency 4, then summed
        x, y = (i.a_sig, i.b_sig) if self._a_width >= self._b_width else (i.b_sig, i.a_sig)
        parts = [(lo, y * x[lo:lo + _SLICE]) for lo in range(0, len(x), _SLICE)]
        pp = stage(m, self._latency >= 4, "pp", esum=i.esum, cls=i.cls, sign=i.sign,
                   **{f"p{lo}": v for lo, v in parts})
        prod = Signal(P)
        m.d.comb += prod.eq(sum(getattr(pp, f"p{lo}") << lo for lo, _ in parts))
        s = stage(m, self._latency >= 2, "mul", prod=prod, esum=pp.esum, cls=pp.cls,
                  sign=pp.sign)

        # -- stage 2: normalise (the product of two normalised significands has its leading
        # one at bit P - 1 or P - 2) and truncate to W bits --------------------------------
        top = s.prod[P - 1]
        norm = Signal(P)
        m.d.comb += norm.eq(Mux(top, s.prod, s.prod << 1))
        finite = s.cls == FloatClass.NORMAL
        res = Signal(self.p.shape())
        m.d.comb += [
            res.sign.eq(s.sign),
            res.cls.eq(s.cls),
            res.exp.eq(Mux(finite, s.esum + top, 0)),
            res.sig.eq(Mux(finite, norm[P - W:], 0)),
        ]
        if W < P:
            m.d.comb += res.sticky.eq(finite & norm[:P - W].any())

        out = stage(m, self._latency >= 1, "out", p=res)
        m.d.comb += self.p.eq(out.p)
        return m
