"""QuantizeLinear's integer output stage: round a wide float half to even, add the zero point,
saturate to a run-time selected integer range."""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.validate import check_bool, check_int
from qaccel.rtl.arith.float_unpack import FloatClass
from qaccel.rtl.arith.pipeline import stage
from qaccel.rtl.arith.wide_float import MAX_EXP_WIDTH, MAX_SIG_WIDTH, wide_float_layout

__all__ = ["LATENCIES", "MAX_BITS", "FloatToInt"]

#: Latencies :class:`FloatToInt` supports (register stages).
LATENCIES = (0, 1, 2, 3, 4, 5)
#: Widest integer output :class:`FloatToInt` accepts.
MAX_BITS = 32


class FloatToInt(wiring.Component):
    """Compute ``y = clip(round_half_even(v) + zero_point, qmin, qmax)`` for a wide float ``v``.

    ``qmin, qmax`` are the range of a ``bits``-bit integer, chosen at run time by ``bits``
    and ``signed``: ``-2**(bits-1), 2**(bits-1) - 1`` or ``0, 2**bits - 1``. This is ONNX
    QuantizeLinear's integer output step after the division, ``clip(rint(v) + zp)``, with
    qaccel's saturation rule: the value saturates, never wraps, however large its exponent
    (the whole ``exp`` field is valid input).

    * Finite ``v`` (``cls`` ``NORMAL`` or ``SUBNORMAL``, normalised ``sig``) rounds to the
      nearest integer, ties to even; ``ZERO`` (either sign) is 0; ``+inf`` gives ``qmax``,
      ``-inf`` ``qmin``; NaN gives ``qmin`` (ONNX's reference and ORT both do).
    * Sticky inputs: ``v`` lies strictly between ``sig * u`` and ``(sig + 1) * u``,
      ``u = 2**(exp - sig_width + 1)``. When ``u <= 1/2`` (``exp <= sig_width - 2``: ``sig``
      has a bit below the units place) no half-integer lies in that interval, so ``v`` is
      never a tie and rounds correctly whatever the dropped bits were. When ``u >= 1``
      (``exp >= sig_width - 1``) the unit rounds ``sig * u`` (an integer) plus less than
      one half, i.e. returns ``sig * u``: correct only if the dropped fraction was below 1/2,
      or if the result saturates anyway, which every ``|v| >= 2**(max_bits + 1)``
      (``exp >= max_bits + 1``) does. Hence every sticky input is handled correctly when
      ``sig_width >= max_bits + 2``, and otherwise exactly those with ``exp <= sig_width - 2``
      or ``exp >= max_bits + 1`` (or whose truncated value already saturates).
    * ``bits`` outside ``[2, max_bits]`` act as the nearer end of that range. ``zero_point``
      may be any value of its shape (a uint16 or int16 zero point for ``max_bits = 16``).

    ``code`` holds ``y``'s two's complement bit pattern in its low ``bits`` bits, the bits
    above are 0. ``clipped`` is 1 when ``y`` is not ``round_half_even(v) + zero_point``: the
    sum was saturated (infinities included) or ``v`` is NaN.

    Latency is ``latency`` cycles (0: combinational, no clock): a value applied in cycle *n*
    gives its result in cycle *n + latency*. Throughput is one value per cycle. There is no
    handshake; a stream wrapper adds one. The stages are (1) align and round (a right shift of
    ``sig``'s top ``max_bits + 2`` bits, the only ones that reach the integer part or the half
    bit, by at most ``max_bits + 1`` places; an OR of the rest; the round-up bit), (2) add the
    signed magnitude and the zero point in one adder (the round-up bit and the sign as its
    carry) and saturate. ``latency`` 1 registers the outputs, 2 also the signed magnitude and
    its carry, 3 also the aligned bits (before the round-up decision), 4 also the sum with the
    zero point (before the saturating compare), 5 also the alignment's shift amount (before
    the shift).

    Parameters
    ----------
    sig_width : :class:`int`
        Width of ``sig`` in ``i``, 1 .. :data:`~qaccel.rtl.arith.wide_float.MAX_SIG_WIDTH`.
    exp_width : :class:`int`
        Width of ``exp`` in ``i``, 2 .. :data:`~qaccel.rtl.arith.wide_float.MAX_EXP_WIDTH`.
    max_bits : :class:`int`
        Widest integer output, 2 .. :data:`MAX_BITS` (32).
    latency : :class:`int`
        Register stages, one of :data:`LATENCIES`.
    fixed_range : ``(bits, signed)`` or None
        The only output range this unit will produce: the range is then built as constants,
        and the ``bits`` and ``signed`` inputs are ignored (a lane with one integer output
        type, whose range registers would otherwise be flip-flops of constant data).

    Raises
    ------
    :exc:`TypeError`
        If a parameter is not an integer.
    :exc:`ValueError`
        If a parameter is out of range.

    Members
    -------
    i : :py:`In(wide_float_layout(sig_width, exp_width))`
        The value ``v``.
    zero_point : :py:`In(signed(max_bits + 1))`
        The zero point.
    bits : :py:`In(unsigned(max_bits.bit_length()))`
        Width of the output integer, 2 .. ``max_bits``.
    signed : :py:`In(1)`
        1 for a signed (two's complement) output range, 0 for unsigned.
    code : :py:`Out(unsigned(max_bits))`
        The result's bit pattern, right-aligned.
    clipped : :py:`Out(1)`
        The result was saturated (or ``v`` is NaN).
    """

    def __init__(self, *, sig_width: int, exp_width: int, max_bits: int = 16,
                 latency: int = 1, fixed_range: tuple[int, bool] | None = None):
        self._sig_width = check_int("sig_width", sig_width, 1, MAX_SIG_WIDTH)
        self._exp_width = check_int("exp_width", exp_width, 2, MAX_EXP_WIDTH)
        self._max_bits = check_int("max_bits", max_bits, 2, MAX_BITS)
        self._latency = check_int("latency", latency, min(LATENCIES), max(LATENCIES))
        if fixed_range is not None:
            if not isinstance(fixed_range, tuple) or len(fixed_range) != 2:
                raise TypeError(f"fixed_range must be a (bits, signed) tuple or None, not "
                                f"{fixed_range!r}")
            fixed_range = (check_int("fixed_range bits", fixed_range[0], 2, max_bits),
                           check_bool("fixed_range signed", fixed_range[1]))
        self._fixed_range = fixed_range
        super().__init__({
            "i": In(wide_float_layout(sig_width, exp_width)),
            "zero_point": In(signed(max_bits + 1)),
            "bits": In(unsigned(max_bits.bit_length())),
            "signed": In(1),
            "code": Out(unsigned(max_bits)),
            "clipped": Out(1),
        })

    @property
    def sig_width(self) -> int:
        """Width of the input's significand."""
        return self._sig_width

    @property
    def exp_width(self) -> int:
        """Width of the input's exponent."""
        return self._exp_width

    @property
    def max_bits(self) -> int:
        """Widest integer output."""
        return self._max_bits

    @property
    def latency(self) -> int:
        """Cycles from a value on ``i`` to its result on ``code`` and ``clipped``."""
        return self._latency

    def elaborate(self, platform):
        m = Module()
        W = self._sig_width
        B = self._max_bits
        A = B + 1               # integer bits kept: magnitudes of 2**A and more saturate
        x = self.i

        # -- stage 1: align the units place and round -----------------------------------------
        # |v| >= 2**A saturates any result (|zero_point| <= 2**B, |qmin|, qmax < 2**B), so the
        # rounded magnitude is clamped to 2**A. Only sig's top A + 1 bits (``window``, zeros
        # below a narrower sig) can reach the integer part or the half bit: with ``exp + 1``
        # integer bits, window >> (A - exp - 1) is Cat(half, whole), and the window's bits
        # shifted out, the bits below it and the sticky bit are the rest.
        big = x.exp >= A
        tiny = x.exp < -1       # |v| < 1/2
        rsh = Signal(range(A + 1))
        m.d.comb += rsh.eq(Mux(big, 0, Mux(tiny, A, A - 1 - x.exp)))
        finite = (x.cls == FloatClass.NORMAL) | (x.cls == FloatClass.SUBNORMAL)
        padded = Cat(Const(0, max(0, A + 1 - W)), x.sig)
        below = padded[:len(padded) - A - 1]
        h = stage(m, self._latency >= 5, "sh", rsh=rsh, window=padded[-(A + 1):],
                  below=(below.any() if len(below) else 0) | x.sticky, tiny=tiny,
                  sat=(finite & big) | (x.cls == FloatClass.INF), finite=finite,
                  nan=x.cls == FloatClass.NAN, neg=x.sign, zero_point=self.zero_point,
                  bits=self.bits, signed=self.signed)
        aligned = Signal(A + 1)             # Cat(half, whole)
        m.d.comb += aligned.eq(h.window >> h.rsh)
        out_mask = Signal(A + 1)            # the window's bits shifted out
        m.d.comb += out_mask.eq((1 << h.rsh) - 1)
        s0 = stage(m, self._latency >= 3, "s0", whole=aligned[1:],
                   half=aligned[0] & ~h.tiny, rest=(h.window & out_mask).any() | h.below,
                   sat=h.sat, finite=h.finite, nan=h.nan, neg=h.neg,
                   zero_point=h.zero_point, bits=h.bits, signed=h.signed)
        # the rounded magnitude's sign applied as one add with the zero point: ``v``'s
        # magnitude is ``val + inc`` (``inc`` the round-up bit), so its signed value is
        # ``val + inc``, or ``~val + (1 - inc)`` when negative: ``val`` XOR the sign, plus a
        # carry of ``inc`` XOR the sign (no increment or negation adder of its own)
        inc = s0.half & (s0.rest | s0.whole[0])
        val = Signal(A + 1)
        m.d.comb += val.eq(Mux(s0.sat, 1 << A, Mux(s0.finite, s0.whole, 0)))
        wide = Cat(val, Const(0, 1)).as_signed()
        operand = Signal(signed(A + 2))
        m.d.comb += operand.eq(Mux(s0.neg, ~wide, wide))
        carry = (s0.finite & ~s0.sat & inc) ^ s0.neg

        r = stage(m, self._latency >= 2, "s1", operand=operand, carry=carry, nan=s0.nan,
                  zero_point=s0.zero_point, bits=s0.bits, signed=s0.signed)

        # -- stage 2: add the zero point, saturate ---------------------------------------------
        total = Signal(signed(A + 2))
        m.d.comb += total.eq(r.zero_point + r.operand + r.carry)
        if self._fixed_range is not None:
            bits, is_signed = self._fixed_range
            top = 1 << (bits - 1)
            mask = Const((1 << bits) - 1, B)
            qmax = Const(top - 1 if is_signed else (1 << bits) - 1, signed(B + 1))
            qmin = Const(-top if is_signed else 0, signed(B + 1))
        else:
            b1 = Signal(range(B))                    # bits - 1, clamped to [1, B - 1]
            m.d.comb += b1.eq(Mux(r.bits < 2, 1, Mux(r.bits > B, B - 1, r.bits - 1)))
            top = Signal(B)                          # 2**(bits - 1)
            m.d.comb += top.eq(1 << b1)
            mask = Signal(B)                         # 2**bits - 1
            m.d.comb += mask.eq((top << 1) - 1)
            qmax = Signal(signed(B + 1))
            qmin = Signal(signed(B + 1))
            m.d.comb += [
                qmax.eq(Mux(r.signed, top - 1, mask)),
                qmin.eq(Mux(r.signed, -top, 0)),
            ]
        t = stage(m, self._latency >= 4, "s2", total=total, qmin=qmin, qmax=qmax, mask=mask,
                  nan=r.nan)
        low = t.nan | (t.total < t.qmin)
        high = ~t.nan & (t.total > t.qmax)
        result = Signal(signed(A + 2))
        m.d.comb += result.eq(Mux(low, t.qmin, Mux(high, t.qmax, t.total)))
        code = Signal(B)
        m.d.comb += code.eq(result & t.mask)
        clipped = low | high

        domain = m.d.sync if self._latency >= 1 else m.d.comb
        domain += [self.code.eq(code), self.clipped.eq(clipped)]
        return m
