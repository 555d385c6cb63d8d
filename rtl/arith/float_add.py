"""Add or subtract two wide floats; the sum truncated to a chosen width with a sticky bit."""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.validate import check_int
from qaccel.rtl.arith.float_unpack import FloatClass
from qaccel.rtl.arith.pipeline import stage
from qaccel.rtl.arith.wide_float import MAX_EXP_WIDTH, MAX_SIG_WIDTH, wide_float_layout

__all__ = ["LATENCIES", "FloatAdd", "min_exp_width"]

#: Latencies :class:`FloatAdd` supports (register stages).
LATENCIES = (0, 1, 2, 3, 4, 5, 6, 7)


def min_exp_width(a_width: int, b_width: int) -> int:
    """Return the narrowest ``exp_width`` :class:`FloatAdd` accepts for these significands.

    A non-zero sum is a multiple of the smaller operand's last place, so its exponent is at
    least ``-2**(exp_width - 1) - (max(a_width, b_width) - 1)``; that must fit the output's
    ``signed(exp_width + 1)``, i.e. ``max(a_width, b_width) - 1 <= 2**(exp_width - 1)``.
    """
    n = max(check_int("a_width", a_width, 1, MAX_SIG_WIDTH),
            check_int("b_width", b_width, 1, MAX_SIG_WIDTH))
    return max(2, max(n - 2, 0).bit_length() + 1)


def _leading_zeros(v: Value) -> tuple[Value, Value]:
    """Return (count of leading zeros, all zero) of ``v``, whose width is a power of two >= 2,
    as a tree of ``log2(len(v))`` levels of 2:1 multiplexers."""
    if len(v) == 2:
        return ~v[1], ~(v[0] | v[1])
    h = len(v) // 2
    count_hi, zero_hi = _leading_zeros(v[h:])
    count_lo, zero_lo = _leading_zeros(v[:h])
    return Cat(Mux(zero_hi, count_lo, count_hi), zero_hi), zero_hi & zero_lo


class FloatAdd(wiring.Component):
    """Add or subtract two wide floats: ``s = a + b``, or ``a - b`` when ``sub`` is 1.

    The inputs are exact wide floats (:func:`~qaccel.rtl.arith.wide_float.wide_float_layout`,
    ``sticky = 0``; a sticky input gives an unspecified result) with ``a_width``- and
    ``b_width``-bit significands and a common ``exp_width``. The output ``s`` has an
    ``out_width``-bit significand and ``exp_width + 1`` exponent bits.

    Truncation rule: ``s`` is the exact sum truncated toward zero to its ``out_width`` leading
    bits, with ``sticky = 1`` exactly when a non-zero bit lies below them, i.e.
    ``s.sig = floor(|a ± b| / 2**(s.exp - out_width + 1))`` and ``sticky`` = (remainder != 0),
    however far apart the exponents are (a much smaller operand only sets ``sticky``).
    :class:`~qaccel.rtl.arith.float_round.FloatRound` with ``sig_width = out_width`` then rounds
    ``s`` correctly to every format of at most ``out_width - 1`` significant bits (``s`` is
    exact, ``sticky = 0``, whenever the sum fits ``out_width`` bits).

    Exponent range: ``s.exp`` lies between ``min(a.exp - a_width, b.exp - b_width) + 1``
    (after cancellation) and ``max(a.exp, b.exp) + 1`` (carry), so it fits
    ``signed(exp_width + 1)`` for inputs anywhere in ``signed(exp_width)`` as long as
    ``max(a_width, b_width) - 1 <= 2**(exp_width - 1)`` (:func:`min_exp_width`, checked).
    The sum never overflows or underflows here (:class:`~qaccel.rtl.arith.float_round.FloatRound`
    decides that for its format).

    Special values, as IEEE 754 in round to nearest and x86-64 SSE (NumPy on this machine) give
    them: an exact cancellation gives +0, except that ``(-0) + (-0)`` and ``(-0) - (+0)`` give
    -0 (a zero plus a zero is -0 only when both are -0 after applying ``sub``); a zero plus a
    finite ``x`` gives ``x`` (truncated by the rule above); ``inf - inf`` (infinities of
    opposite effective signs) gives x86's default NaN, which is negative; otherwise an infinity
    wins, with its effective sign. A NaN operand gives a NaN with that operand's sign (``a``'s
    if both are NaN); ``sub`` does not flip a NaN's sign, as x86's ``subss`` does not. An input
    class ``SUBNORMAL`` counts as ``NORMAL``. On the output, finite non-zero results are
    ``NORMAL``, and ``exp``, ``sig`` and ``sticky`` are 0 for ``ZERO``, ``INF`` and ``NAN``.

    Latency is ``latency`` cycles (0: combinational, no clock): operands applied in cycle *n*
    give their sum on ``s`` in cycle *n + latency*. Throughput is one sum per cycle. There is
    no handshake; a stream wrapper adds one. The datapath works on ``G + 3`` bits, where
    ``G = max(a_width, b_width, out_width)``: the carry, the larger operand's significand
    and ``G`` bits below its leading bit, and a jam bit, the OR of the smaller operand's bits
    shifted below those. The stages are: (1) compare the magnitudes, swap, align the smaller
    operand (a barrel shift and the jam bit) and handle the special values; (2) add or
    subtract (one ``G + 3``-bit adder); (3) normalise: a leading-zero count (a
    multiplexer tree) and a left shift, then truncation and the sticky bit. ``latency`` 1
    registers the output, 2 also the sum, 3 also the aligned operands, 4 also the swapped
    operands and the shift amount (before the barrel shift), 5 also the leading-zero count
    (before the normalising shift), 6 also the magnitude comparison (before the swap), 7 also
    the alignment shift's first half (its multiples of 8): every stage then holds one
    compare, half a shift or an add.

    Parameters
    ----------
    a_width : :class:`int`
        Width of ``a.sig``, 1 to :data:`~qaccel.rtl.arith.wide_float.MAX_SIG_WIDTH` (256).
    b_width : :class:`int`
        Width of ``b.sig``, 1 to 256.
    exp_width : :class:`int`
        Width of ``a.exp`` and ``b.exp``: :func:`min_exp_width` (at least 2) to
        ``MAX_EXP_WIDTH - 1`` (31); ``s.exp`` has one bit more.
    out_width : :class:`int`
        Width of ``s.sig``, 1 to 256.
    latency : :class:`int`
        Register stages, one of :data:`LATENCIES`.

    Raises
    ------
    :exc:`TypeError`
        If a width or ``latency`` is not an integer.
    :exc:`ValueError`
        If a width is out of range (``exp_width`` below :func:`min_exp_width`), or
        ``latency`` is not in :data:`LATENCIES`.

    Members
    -------
    a : :py:`In(wide_float_layout(a_width, exp_width))`
        First operand.
    b : :py:`In(wide_float_layout(b_width, exp_width))`
        Second operand.
    sub : :py:`In(1)`
        1: compute ``a - b``.
    s : :py:`Out(wide_float_layout(out_width, exp_width + 1))`
        The sum or difference.
    """

    def __init__(self, *, a_width: int, b_width: int, exp_width: int, out_width: int,
                 latency: int = 1):
        self._a_width = check_int("a_width", a_width, 1, MAX_SIG_WIDTH)
        self._b_width = check_int("b_width", b_width, 1, MAX_SIG_WIDTH)
        check_int("exp_width", exp_width)
        lo = min_exp_width(self._a_width, self._b_width)
        if not lo <= exp_width <= MAX_EXP_WIDTH - 1:
            raise ValueError(f"exp_width must be in [{lo}, {MAX_EXP_WIDTH - 1}] for significands "
                             f"of {max(self._a_width, self._b_width)} bits, not {exp_width}")
        self._exp_width = exp_width
        self._out_width = check_int("out_width", out_width, 1, MAX_SIG_WIDTH)
        self._latency = check_int("latency", latency, min(LATENCIES), max(LATENCIES))
        super().__init__({
            "a": In(wide_float_layout(self._a_width, self._exp_width)),
            "b": In(wide_float_layout(self._b_width, self._exp_width)),
            "sub": In(1),
            "s": Out(wide_float_layout(self._out_width, self._exp_width + 1)),
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
        """Width of the input exponents (``s.exp`` has one bit more)."""
        return self._exp_width

    @property
    def out_width(self) -> int:
        """Width of ``s.sig``."""
        return self._out_width

    @property
    def latency(self) -> int:
        """Cycles from operands on ``a``, ``b`` and ``sub`` to their sum on ``s``."""
        return self._latency

    def elaborate(self, platform):
        m = Module()
        a, b = self.a, self.b
        N = max(self._a_width, self._b_width)
        W = self._out_width
        G = max(N, W)
        R = G + 3                      # carry, leading bit, G bits below it, jam bit
        ew = self._exp_width

        # -- stage 1: specials, compare, swap, align -------------------------------------------
        # Both significands left-aligned to N bits; b's effective sign applies `sub`.
        sig_a = Signal(N)
        sig_b = Signal(N)
        m.d.comb += [sig_a.eq(a.sig << (N - self._a_width)),
                     sig_b.eq(b.sig << (N - self._b_width))]
        sign_b = b.sign ^ self.sub
        a_nan, b_nan = a.cls == FloatClass.NAN, b.cls == FloatClass.NAN
        a_inf, b_inf = a.cls == FloatClass.INF, b.cls == FloatClass.INF
        a_zero, b_zero = a.cls == FloatClass.ZERO, b.cls == FloatClass.ZERO
        a_fin = ~(a_nan | a_inf | a_zero)
        b_fin = ~(b_nan | b_inf | b_zero)

        special = Signal()
        spec_cls = Signal(FloatClass)
        spec_sign = Signal()
        m.d.comb += special.eq(1)
        with m.If(a_nan | b_nan):
            m.d.comb += [spec_cls.eq(FloatClass.NAN), spec_sign.eq(Mux(a_nan, a.sign, b.sign))]
        with m.Elif(a_inf & b_inf & (a.sign != sign_b)):
            m.d.comb += [spec_cls.eq(FloatClass.NAN), spec_sign.eq(1)]   # x86 default NaN
        with m.Elif(a_inf):
            m.d.comb += [spec_cls.eq(FloatClass.INF), spec_sign.eq(a.sign)]
        with m.Elif(b_inf):
            m.d.comb += [spec_cls.eq(FloatClass.INF), spec_sign.eq(sign_b)]
        with m.Elif(a_zero & b_zero):
            m.d.comb += [spec_cls.eq(FloatClass.ZERO), spec_sign.eq(a.sign & sign_b)]
        with m.Else():
            m.d.comb += special.eq(0)

        # x: the operand of larger magnitude (a finite non-zero one), y: the other one (finite,
        # maybe zero). The sum then has x's sign and a non-negative magnitude |x| +- |y|.
        swap = b_fin & (~a_fin | (b.exp > a.exp) | ((b.exp == a.exp) & (sig_b > sig_a)))
        # the alignment shift both ways (y = b, y = a), clamped at G + 1, beside the compare
        d_ab = Signal(signed(ew + 2))
        d_ba = Signal(signed(ew + 2))
        m.d.comb += [d_ab.eq(a.exp - b.exp), d_ba.eq(b.exp - a.exp)]
        sh_ab = Signal(range(G + 2))
        sh_ba = Signal(range(G + 2))
        m.d.comb += [sh_ab.eq(Mux(d_ab > G + 1, G + 1, d_ab)),
                     sh_ba.eq(Mux(d_ba > G + 1, G + 1, d_ba))]
        k = stage(m, self._latency >= 6, "cmp", swap=swap, sig_a=sig_a, sig_b=sig_b,
                  a_exp=a.exp, b_exp=b.exp, a_sign=a.sign, sign_b=sign_b, a_fin=a_fin,
                  b_fin=b_fin, sh_ab=sh_ab, sh_ba=sh_ba, special=special, spec_cls=spec_cls,
                  spec_sign=spec_sign)
        x_exp = Signal(signed(ew))
        x_sig = Signal(N)
        x_sign = Signal()
        y_sig = Signal(N)
        y_sign = Signal()
        y_fin = Mux(k.swap, k.a_fin, k.b_fin)
        m.d.comb += [
            x_exp.eq(Mux(k.swap, k.b_exp, k.a_exp)), x_sig.eq(Mux(k.swap, k.sig_b, k.sig_a)),
            x_sign.eq(Mux(k.swap, k.sign_b, k.a_sign)),
            y_sig.eq(Mux(y_fin, Mux(k.swap, k.sig_a, k.sig_b), 0)),
            y_sign.eq(Mux(k.swap, k.a_sign, k.sign_b)),
        ]
        # Register bit i weighs 2**(x_exp + i - G - 1): x's leading bit is bit G + 1.
        shift = Signal(range(G + 2))
        m.d.comb += shift.eq(Mux(~y_fin, G + 1, Mux(k.swap, k.sh_ba, k.sh_ab)))
        s0 = stage(m, self._latency >= 4, "swap", x_sig=x_sig, x_sign=x_sign, x_exp=x_exp,
                   y_sig=y_sig, y_sign=y_sign, shift=shift, special=k.special,
                   spec_cls=k.spec_cls, spec_sign=k.spec_sign)
        # y's leading bit at the top, then shifted right: by the shift's multiples of 8 first,
        # with latency 7 registered, then by the rest (no bit leaves the vector: shift <= G + 1)
        coarse = Signal(G + 1 + N)
        m.d.comb += coarse.eq(Cat(Const(0, G + 1), s0.y_sig) >> Cat(Const(0, 3), s0.shift[3:]))
        s5 = stage(m, self._latency >= 7, "coarse", coarse=coarse, fine=s0.shift[:3],
                   x_sig=s0.x_sig, x_sign=s0.x_sign, x_exp=s0.x_exp, y_sign=s0.y_sign,
                   special=s0.special, spec_cls=s0.spec_cls, spec_sign=s0.spec_sign)
        wide = Signal(G + 1 + N)
        m.d.comb += wide.eq(s5.coarse >> s5.fine)
        x_reg = Signal(R)
        y_reg = Signal(R)
        m.d.comb += [
            x_reg.eq(Cat(Const(0, G - N + 2), s5.x_sig, Const(0, 1))),
            y_reg.eq(Cat(wide[:N].any(), wide[N:], Const(0, 1))),
        ]

        s1 = stage(m, self._latency >= 3, "align", x=x_reg, y=y_reg,
                    subtract=s5.x_sign ^ s5.y_sign, sign=s5.x_sign, exp=s5.x_exp,
                    special=s5.special, spec_cls=s5.spec_cls, spec_sign=s5.spec_sign)

        # -- stage 2: add or subtract (|x| >= |y|: no borrow) ----------------------------------
        total = Signal(R)
        m.d.comb += total.eq(s1.x + (s1.y ^ Mux(s1.subtract, (1 << R) - 1, 0)) + s1.subtract)

        s2 = stage(m, self._latency >= 2, "add", total=total, sign=s1.sign, exp=s1.exp,
                    special=s1.special, spec_cls=s1.spec_cls, spec_sign=s1.spec_sign)

        # -- stage 3: normalise, truncate -----------------------------------------------------
        P = 1 << (R - 1).bit_length()               # the count tree's width, zeros padded below
        count, zero = _leading_zeros(Cat(Const(0, P - R), s2.total))
        lz = Signal(range(P))
        m.d.comb += lz.eq(count)
        s3 = stage(m, self._latency >= 5, "count", total=s2.total, lz=lz, zero=zero,
                   sign=s2.sign, exp=s2.exp, special=s2.special, spec_cls=s2.spec_cls,
                   spec_sign=s2.spec_sign)
        norm = Signal(R)
        m.d.comb += norm.eq(s3.total << s3.lz)
        res = Signal(self.s.shape())
        with m.If(s3.special):
            m.d.comb += [res.cls.eq(s3.spec_cls), res.sign.eq(s3.spec_sign)]
        with m.Elif(s3.zero):
            m.d.comb += res.cls.eq(FloatClass.ZERO)                 # cancellation: +0
        with m.Else():
            m.d.comb += [
                res.cls.eq(FloatClass.NORMAL), res.sign.eq(s3.sign),
                res.exp.eq(s3.exp + 1 - s3.lz),
                res.sig.eq(norm[R - W:]),
                res.sticky.eq(norm[:R - W].any()),
            ]

        out = stage(m, self._latency >= 1, "out", s=res)
        m.d.comb += self.s.eq(out.s)
        return m
