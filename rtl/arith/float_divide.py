"""Divide two exact wide floats, giving a quotient that rounds correctly: a pipelined divider."""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.validate import check_int
from qaccel.rtl.arith.float_unpack import FloatClass
from qaccel.rtl.arith.wide_float import MAX_EXP_WIDTH, MAX_SIG_WIDTH, wide_float_layout

__all__ = ["FloatDivide", "QuotientPorts", "quotient_class"]


class QuotientPorts:
    """What the dividers (:class:`FloatDivide`, ReciprocalDivide, Pow2Divide) share: the
    checked widths as properties and the members ``a``, ``b`` (operands) and ``q`` (the
    quotient, ``exp_width + 2`` exponent bits). A mixin before ``wiring.Component``."""

    def _quotient_members(self, *, a_width: int, b_width: int, q_width: int,
                          exp_width: int) -> dict:
        """Check and keep the widths; return the members for ``super().__init__``."""
        self._a_width = check_int("a_width", a_width, 1, MAX_SIG_WIDTH)
        self._b_width = check_int("b_width", b_width, 1, MAX_SIG_WIDTH)
        self._q_width = check_int("q_width", q_width, 1, MAX_SIG_WIDTH)
        self._exp_width = check_int("exp_width", exp_width, 2, MAX_EXP_WIDTH - 2)
        return {
            "a": In(wide_float_layout(a_width, exp_width)),
            "b": In(wide_float_layout(b_width, exp_width)),
            "q": Out(wide_float_layout(q_width, exp_width + 2)),
        }

    @property
    def a_width(self) -> int:
        """Width of the dividend's significand."""
        return self._a_width

    @property
    def b_width(self) -> int:
        """Width of the divisor's significand."""
        return self._b_width

    @property
    def q_width(self) -> int:
        """Width of the quotient's significand."""
        return self._q_width

    @property
    def exp_width(self) -> int:
        """Width of the operands' exponents (the quotient's is ``exp_width + 2``)."""
        return self._exp_width


def quotient_class(m: Module, a, b) -> tuple[Signal, Signal]:
    """Return combinational ``(cls, sign)`` signals of ``a / b`` (wide floats) by the IEEE 754 /
    x86 rules :class:`FloatDivide` states: a NaN operand gives NaN with its sign (``a``'s
    first), ``0 / 0`` and ``inf / inf`` x86's negative default NaN, ``inf / x`` and ``x / 0``
    ``INF``, ``0 / x`` and ``x / inf`` ``ZERO``, anything else ``NORMAL``; the sign of a
    non-NaN result is ``a.sign ^ b.sign``."""
    def kinds(x):
        return (x.cls == FloatClass.ZERO, x.cls == FloatClass.INF, x.cls == FloatClass.NAN)

    a_zero, a_inf, a_nan = kinds(a)
    b_zero, b_inf, b_nan = kinds(b)
    cls = Signal(FloatClass, name="cls0")
    sign = Signal(name="sign0")
    m.d.comb += sign.eq(a.sign ^ b.sign)
    with m.If(a_nan):
        m.d.comb += [cls.eq(FloatClass.NAN), sign.eq(a.sign)]
    with m.Elif(b_nan):
        m.d.comb += [cls.eq(FloatClass.NAN), sign.eq(b.sign)]
    with m.Elif((a_zero & b_zero) | (a_inf & b_inf)):
        m.d.comb += [cls.eq(FloatClass.NAN), sign.eq(1)]           # x86's default NaN
    with m.Elif(a_inf | b_zero):
        m.d.comb += cls.eq(FloatClass.INF)
    with m.Elif(a_zero | b_inf):
        m.d.comb += cls.eq(FloatClass.ZERO)
    with m.Else():
        m.d.comb += cls.eq(FloatClass.NORMAL)
    return cls, sign


class FloatDivide(QuotientPorts, wiring.Component):
    """Divide ``a`` by ``b`` (wide floats, :func:`~qaccel.rtl.arith.wide_float.wide_float_layout`),
    giving a ``q_width``-bit quotient and a sticky bit: a restoring digit-recurrence array.

    The quotient ``q`` is the exact value ``a / b`` truncated to a normalised ``q_width``-bit
    significand, with ``sticky = 1`` exactly when the truncated part (the remainder) is not
    zero. A :class:`~qaccel.rtl.arith.float_round.FloatRound` with ``sig_width = q_width`` therefore
    rounds it correctly (ties to even, subnormals included, a single rounding of the exact
    quotient) to any format with at most ``q_width - 1`` significant bits (a round bit plus the
    sticky); the accelerator uses ``q_width = p + 2`` for a ``p``-bit target (26 for float32,
    55 for float64).

    The operands must be exact (``sticky = 0``): a sticky input gives an unspecified result.
    A finite non-zero operand (``cls`` ``NORMAL`` or ``SUBNORMAL``, which mean the same here)
    must have a normalised significand (top bit set); for the other classes ``exp``, ``sig`` and
    ``sticky`` are ignored. ``cls`` must be a :class:`~qaccel.rtl.arith.float_unpack.FloatClass`.

    Special values follow IEEE 754 as x86-64 SSE implements it (and NumPy / ml_dtypes with it):

    * a NaN operand gives NaN with that operand's sign (``a``'s if both are NaN);
    * ``0 / 0`` and ``inf / inf`` give x86's default NaN, which is negative (``sign = 1``);
    * otherwise ``sign = a.sign ^ b.sign``, and ``inf / x`` and ``x / 0`` give ``INF``,
      ``0 / x`` and ``x / inf`` give ``ZERO`` (signed: ``-0`` when the signs differ);
    * a finite non-zero quotient has ``cls = NORMAL``. For the classes without a magnitude
      ``exp``, ``sig`` and ``sticky`` are 0. NaNs carry no payload.

    The quotient's exponent is ``a.exp - b.exp`` or one less, within
    ``[-2**exp_width, 2**exp_width - 1]``: it always fits ``exp_width + 1`` bits, and ``q.exp``
    has ``exp_width + 2`` so that it can be rounded by a unit whose exponent field is wider than
    the operands' (overflow and underflow are FloatRound's business).

    The significands are aligned to ``f = max(a_width, b_width) - 1`` fraction bits and
    ``q_width + 1`` quotient digits are produced, one per restoring step (compare the shifted
    remainder with the divisor, subtract if not smaller; ``f + 3``-bit adders), since the
    quotient of the significands lies in ``(1/2, 2)``; a final step drops the leading zero or
    the last digit (into the sticky bit). Each pipeline stage makes ``bits_per_stage`` digits
    and registers them, so the latency is ``ceil((q_width + 1) / bits_per_stage) + 1`` cycles
    (the ``+ 1`` is the registered normalisation): operands applied in cycle *n* give their
    quotient on ``q`` in cycle *n + latency*. Throughput is one division per cycle. There is no
    handshake; a stream wrapper adds one.

    Parameters
    ----------
    a_width : :class:`int`
        Width of ``a.sig``, in ``[1, MAX_SIG_WIDTH]``.
    b_width : :class:`int`
        Width of ``b.sig``, in ``[1, MAX_SIG_WIDTH]``.
    q_width : :class:`int`
        Width of ``q.sig``, in ``[1, MAX_SIG_WIDTH]``.
    exp_width : :class:`int`
        Width of ``a.exp`` and ``b.exp``, in ``[2, MAX_EXP_WIDTH - 2]``.
    bits_per_stage : :class:`int`
        Quotient digits per pipeline stage, in ``[1, q_width + 1]`` (any value; powers of two
        are usual).

    Raises
    ------
    :exc:`TypeError`
        If a parameter is not an integer.
    :exc:`ValueError`
        If a parameter is out of its range.

    Members
    -------
    a : :py:`In(wide_float_layout(a_width, exp_width))`
        The dividend (the element ``x``).
    b : :py:`In(wide_float_layout(b_width, exp_width))`
        The divisor (the scale).
    q : :py:`Out(wide_float_layout(q_width, exp_width + 2))`
        The quotient, with its sticky bit.
    """

    def __init__(self, *, a_width: int, b_width: int, q_width: int, exp_width: int,
                 bits_per_stage: int = 1):
        members = self._quotient_members(a_width=a_width, b_width=b_width, q_width=q_width,
                                         exp_width=exp_width)
        self._bits_per_stage = check_int("bits_per_stage", bits_per_stage, 1, q_width + 1)
        super().__init__(members)

    @property
    def bits_per_stage(self) -> int:
        """Quotient digits made per pipeline stage."""
        return self._bits_per_stage

    @property
    def stages(self) -> int:
        """Pipeline stages of the digit recurrence: ``ceil((q_width + 1) / bits_per_stage)``."""
        return self.stages_for(q_width=self._q_width, bits_per_stage=self._bits_per_stage)

    @property
    def latency(self) -> int:
        """Cycles from ``a`` and ``b`` to their quotient on ``q``: :attr:`stages` ``+ 1``."""
        return self.latency_for(q_width=self._q_width, bits_per_stage=self._bits_per_stage)

    @staticmethod
    def stages_for(*, q_width: int, bits_per_stage: int = 1) -> int:
        """:attr:`stages` of a divider with these (valid) parameters, without building it."""
        return -(-(q_width + 1) // bits_per_stage)

    @staticmethod
    def latency_for(*, q_width: int, bits_per_stage: int = 1) -> int:
        """:attr:`latency` of a divider with these (valid) parameters, without building it."""
        return FloatDivide.stages_for(q_width=q_width, bits_per_stage=bits_per_stage) + 1

    def elaborate(self, platform):
        m = Module()
        aw, bw, qw = self._a_width, self._b_width, self._q_width
        f = max(aw, bw) - 1                    # fraction bits of the aligned significands
        n = qw + 1                             # quotient digits, the first one of weight 1
        a, b = self.a, self.b

        # -- the result's class and sign, the exponent difference -------------------------------
        cls, sign = quotient_class(m, a, b)
        ediff = Signal(signed(self._exp_width + 1), name="ediff0")
        m.d.comb += ediff.eq(a.exp - b.exp)

        # -- the digit recurrence: rem < 2 * div before the first digit, rem < div after each --
        rem = Signal(f + 1, name="rem0")
        div = Signal(f + 1, name="div0")
        m.d.comb += [rem.eq(a.sig << (f + 1 - aw)), div.eq(b.sig << (f + 1 - bw))]
        quo = Cat()
        digit = 0
        for s in range(1, self.stages + 1):
            for _ in range(min(self._bits_per_stage, n - digit)):
                part = rem if digit == 0 else Cat(0, rem)          # rem, then 2 * rem
                diff = Signal(signed(f + 3), name=f"diff{digit}")
                m.d.comb += diff.eq(part - div)
                bit = ~diff[-1]
                nxt = Signal(f + 1, name=f"rem{digit}_{digit + 1}")
                m.d.comb += nxt.eq(Mux(bit, diff[:f + 1], part[:f + 1]))
                rem, quo = nxt, Cat(bit, quo)
                digit += 1
            values = {"rem": rem, "quo": quo, "ediff": ediff, "sign": sign, "cls": cls}
            if digit < n:
                values["div"] = div
            regs = {}
            for key, value in values.items():
                reg = Signal(value.shape(), name=f"{key}{s}", reset_less=True)
                m.d.sync += reg.eq(value)
                regs[key] = reg
            rem, quo, ediff, sign, cls = (regs[k] for k in ("rem", "quo", "ediff", "sign", "cls"))
            div = regs.get("div")

        # -- normalise: drop the leading zero, or the last digit into the sticky bit -------------
        top = quo[n - 1]
        out = Signal(self.q.shape())
        m.d.comb += [out.sign.eq(sign), out.cls.eq(cls)]
        with m.If(cls == FloatClass.NORMAL):
            m.d.comb += [
                out.sig.eq(Mux(top, quo[1:], quo[:qw])),
                out.sticky.eq((rem != 0) | (top & quo[0])),
                out.exp.eq(ediff - 1 + top),
            ]
        q = Signal(self.q.shape(), name="q_reg", reset_less=True)
        m.d.sync += q.eq(out)
        m.d.comb += self.q.eq(q)
        return m
