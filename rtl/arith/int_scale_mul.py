"""``f32(d * s)``: a small integer times a float32 scale, rounded once to float32."""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.validate import check_bool, check_int
from qaccel.rtl.arith.ecp5 import MULT_WIDTH, registered_product
from qaccel.rtl.arith.pipeline import delay, stage

__all__ = ["IntScaleMul"]

_F32_SIG = 24                   # float32 significand, hidden bit included


def _pre_shift(width: int) -> bool:
    """Whether ``|d|`` of ``width`` bits is normalised before the multiplier."""
    return 2 * width <= MULT_WIDTH


def _mul_latency(sig_width: int) -> int:
    """Cycles of the product of ``|d|`` and the scale's top ``sig_width`` significand bits,
    operand registers included: a second stage sums two 18-bit slices."""
    slices = -(-sig_width // MULT_WIDTH)
    return 2 if sig_width <= 2 or slices == 1 else 3


def _leading_zeros(bits, limit: int) -> tuple[Value, Value]:
    """``(count, all_zero)`` of ``bits``' top ``limit`` bits (``limit`` a power of two):
    their leading zeros, valid when ``all_zero`` is 0, as a tree of 2:1 multiplexers."""
    v = Value.cast(bits)[-limit:]
    if limit == 1:
        return Const(0, 1), ~v[0]
    if limit == 2:
        return ~v[1], ~(v[0] | v[1])
    h = limit // 2
    count_hi, zero_hi = _leading_zeros(v[h:], h)
    count_lo, zero_lo = _leading_zeros(v[:h], h)
    return Cat(Mux(zero_hi, count_lo, count_hi), zero_hi), zero_hi & zero_lo


def _min_leading_zeros(m: Module, bits, limit: int, name: str) -> Signal:
    """``min(leading zeros of bits, limit)`` (``bits`` at least ``limit`` wide): the count
    over its top ``limit`` bits, padded below with ones to a power of two."""
    v = Value.cast(bits)
    top = v[len(v) - limit:]
    p = 1 << (limit - 1).bit_length()
    lz = Signal(range(limit + 1), name=name)
    if p > limit:                       # the ones stop the count at `limit`
        count, _ = _leading_zeros(Cat(Const((1 << (p - limit)) - 1, p - limit), top), p)
        m.d.comb += lz.eq(count)
    else:
        count, zero = _leading_zeros(top, p)
        m.d.comb += lz.eq(Mux(zero, limit, count))
    return lz


def _exponent_base(m: Module, e1, shift, width: int) -> Signal:
    """``e1 + width - 1 - shift`` (``shift`` in 0 .. ``width``): the small term from a table
    of ``shift`` (a few LUTs), then one add, rather than an add and a subtract."""
    t = Signal(range(-1, width), name="base_term")
    with m.Switch(shift):
        for k in range(width + 1):
            with m.Case(k):
                m.d.comb += t.eq(width - 1 - k)
    base = Signal(range(255 + width), name="base")
    m.d.comb += base.eq(e1 + t)
    return base


class IntScaleMul(wiring.Component):
    """``y`` = the float32 code of ``d * s``, rounded to nearest even, for an integer ``d``
    (``neg``, ``mag`` = ``|d|`` of ``width`` bits, ``zero`` = ``d == 0``) and the float32 code
    ``s``, as NumPy's float32 multiply gives it on x86-64 (gradual underflow, overflow to
    infinity; a NaN ``s`` gives ``s`` quieted, sign and payload kept; ``0 * inf`` gives the
    default NaN ``0xFFC00000``; zeros and infinities carry the exclusive or of the signs,
    ``d = 0`` counting as +0).

    Why it is small. With ``e1 = max(E, 1)`` (``E`` the scale's exponent field) and ``m`` its
    24-bit significand (hidden bit ``E != 0``), ``|d * s| = P * 2**(e1 - 150)`` with the
    integer ``P = |d| * m`` of ``N = width + 24`` bits. Hence:

    * every result below float32's normal range is a multiple of ``2**-149`` (``e1 >= 1``): a
      subnormal result is exact, never rounded, and the rounding position is always the
      normalised ``P``'s bit ``N - 25``;
    * the normalising shift is at most ``width``: a normal scale has ``m >= 2**23``, so ``P``
      has at most ``width`` leading zeros; a subnormal scale (``e1 = 1``) stops the shift at
      the subnormal boundary, which is ``width`` places. So the shift is
      ``sh = min(leading zeros of P, width)`` and the result is
      ``((e1 + width - 1 - sh) << 23) + (P << sh)[N-24:] + round``: one add, in which the
      hidden bit lands in the exponent field (0 for a subnormal result) and a rounding carry
      raises the exponent, up to infinity (the exponent field 255).

    Where the shift is done. ``P`` has ``L`` or ``L + 1`` leading zeros, ``L`` the sum of
    ``|d|``'s (in ``width`` bits) and ``m``'s; with ``2 * width <= 18`` (``pre_shift``, int8
    and narrower) ``|d|`` is shifted left by ``j = min(L, width)`` before the multiplier (a
    ``width``-bit shift into ``2 * width`` bits, still one MULT18X18D operand), which leaves
    a shift of 0 or 1 after it (1 when the product's top bit is clear and ``j < width``).
    Wider ``|d|`` are shifted after the multiplier, by ``sh`` read off ``P``'s top ``width``
    bits.

    ``sig_width`` (``S``) may narrow the multiplier when every scale fed has at least
    ``24 - S`` trailing zero bits in its significand (a widened float16: ``S = 11``; bfloat16:
    8; float8e8m0, ``2**23`` or ``2**22``: 2); only ``m``'s top ``S`` bits are multiplied.

    Pipeline (:attr:`latency` cycles, one product per cycle; every stage registered): with
    ``pre_shift``, the scale's fields and the leading-zero counts, then their sum capped at
    ``width`` (``j``), then the shift of ``|d|`` and the exponent field beside it (into the
    multiplier's operand registers); the product (a registered ``*`` per 18-bit slice of
    the scale significand, both operands registered first, which Yosys maps onto a
    MULT18X18D each; two slices summed in a further stage; with ``S <= 2`` a LUT shift-add
    instead); without ``pre_shift``, the leading-zero count of ``P``'s top ``width`` bits,
    then the shift; the round and sticky bits, the special values and overflow forced into
    the fields; the rounding add, registered on ``y``.

    Parameters
    ----------
    width : :class:`int`
        Bits of ``|d|``, 2 to 18.
    sig_width : :class:`int`
        ``S``, 1 to 24 (default 24).
    ecp5 : :class:`bool`
        The MULT18X18D as instances with their own registers
        (:func:`~qaccel.rtl.arith.ecp5.registered_product`, the same cycles), for synthesis;
        simulate with False (the default).

    Members
    -------
    mag : :py:`In(unsigned(width))`
    neg, zero : :py:`In(1)`
    s : :py:`In(unsigned(32))`
    y : :py:`Out(unsigned(32))`
    """

    def __init__(self, *, width: int, sig_width: int = _F32_SIG, ecp5: bool = False):
        self._width = check_int("width", width, 2, MULT_WIDTH)
        self._ecp5 = check_bool("ecp5", ecp5)
        self._sig_width = check_int("sig_width", sig_width, 1, _F32_SIG)
        self._pre_shift = _pre_shift(self._width)
        self._mul_latency = _mul_latency(self._sig_width)
        super().__init__({
            "mag": In(unsigned(self._width)),
            "neg": In(1),
            "zero": In(1),
            "s": In(unsigned(32)),
            "y": Out(unsigned(32)),
        })

    @property
    def width(self) -> int:
        return self._width

    @property
    def sig_width(self) -> int:
        return self._sig_width

    @property
    def pre_shift(self) -> bool:
        """Whether ``|d|`` is normalised before the multiplier (``2 * width <= 18``)."""
        return self._pre_shift

    @property
    def latency(self) -> int:
        """Cycles from the inputs to ``y``: the product's 2 or 3 (operand registers
        included), 3 after it, and with ``pre_shift`` 1 more before it."""
        return self.latency_for(width=self._width, sig_width=self._sig_width)

    @staticmethod
    def latency_for(*, width: int, sig_width: int = _F32_SIG) -> int:
        """:attr:`latency` of a unit with these (valid) parameters, without building it
        (``ecp5`` builds have the same)."""
        return _mul_latency(sig_width) + 3 + _pre_shift(width)

    def _product(self, m: Module, a, sig, width: int):
        """``a * sig`` (``width`` bits kept), :attr:`_mul_latency` cycles later."""
        S = self._sig_width
        if S <= 2:
            ra = delay(m, a, 1, "mul_a")
            rb = delay(m, sig, 1, "mul_b")
            prod = Signal(width, name="prod", reset_less=True)
            m.d.sync += prod.eq(sum(Mux(rb[k], ra << k, 0) for k in range(S)))
            return prod
        parts = [(lo, registered_product(m, a, sig[lo:lo + MULT_WIDTH], ecp5=self._ecp5,
                                         name=f"p{lo}"))
                 for lo in range(0, S, MULT_WIDTH)]
        if len(parts) == 1:
            return parts[0][1][:width]
        prod = Signal(width, name="prod", reset_less=True)
        m.d.sync += prod.eq(sum(p << lo for lo, p in parts))
        return prod

    def elaborate(self, platform):
        m = Module()
        Dw, S = self._width, self._sig_width
        N = Dw + _F32_SIG
        s = self.s
        lm = self._mul_latency

        # -- the scale's fields; the special values steered through the datapath ----------
        # An infinite or NaN scale (``special``, E = 255) multiplies 1 instead of |d|
        # (shifted by ``width``), which makes the result's exponent field 255: the datapath
        # then gives the infinity, or the NaN with its payload, whose quiet bit is set at
        # the end (and the overflow check spares it). A zero product (|d| = 0 or m = 0)
        # gets e1 = 1, which makes the exponent field 0 (the normalising shift is then
        # ``width``).
        e = s[23:31]
        frac = s[:23]
        e_zero, special, fz = e == 0, e == 0xFF, frac == 0
        sig24 = Cat(frac, ~e_zero)
        sig = sig24[_F32_SIG - S:]                          # the significand's top S bits
        e1 = Signal(8)
        m.d.comb += e1.eq(Mux((e_zero | self.zero) & ~special, 1, e))
        nan = special & ~fz
        default_nan = special & fz & self.zero              # 0 * inf
        quiet = nan | default_nan
        sign = Mux(nan, s[31], s[31] ^ self.neg) | default_nan

        if self._pre_shift:
            # -- j = min(L, width) ----------------------------------------------------------
            z = stage(m, True, "lz", lz_d=_min_leading_zeros(m, self.mag, Dw, "lz_d"),
                      lz_m=_min_leading_zeros(m, sig24, Dw, "lz_m"), mag=self.mag,
                      special=special, sig=sig, e1=e1, flags=Cat(nan, quiet, sign))
            total = z.lz_d + z.lz_m
            j = Signal(range(Dw + 1))
            m.d.comb += j.eq(Mux(z.special | (total > Dw), Dw, total))
            a = stage(m, True, "j", mag=Mux(z.special, 1, z.mag), j=j, sig=z.sig, e1=z.e1,
                      flags=z.flags)
            # -- |d| << j (1 << width for a special scale); the exponent field less the hidden
            # bit, ``base`` --------------------------------------------------------------
            shifted = Signal(2 * Dw)
            m.d.comb += shifted.eq(a.mag << a.j)
            base = _exponent_base(m, a.e1, a.j, Dw)
            side = delay(m, Cat(base, a.j < Dw, a.flags), lm, "side")
            base, jlt, flags = side[:len(base)], side[len(base)], side[len(base) + 1:]
            prod = self._product(m, shifted, a.sig, Dw + S)
            P = Cat(Const(0, _F32_SIG - S), prod)[:N]       # |d| * m << j, N bits
            # one more place when the top bit is clear and j < width
            one = ~P[N - 1] & jlt
            mant = Mux(one, P[N - 25:N - 2], P[N - 24:N - 1])
            round_bit = Mux(one, P[N - 26], P[N - 25])
            sticky = P[:N - 26].any() | (~one & P[N - 26])
            hidden = P[N - 1]
        else:
            side = delay(m, Cat(e1, nan, quiet, sign), lm, "side")
            e1, flags = side[:8], side[8:]
            prod = self._product(m, Mux(special, 1, self.mag), sig, Dw + S)
            P = Cat(Const(0, _F32_SIG - S), prod)           # N bits, |d| * m
            # -- the normalising shift sh = min(leading zeros, width) -----------------------
            sh = _min_leading_zeros(m, P, Dw, "sh")
            base = Signal(range(255 + Dw))
            m.d.comb += base.eq(e1 + (Dw - 1) - sh)
            a = stage(m, True, "lz", P=P, sh=sh, base=base, flags=flags)
            base, flags = a.base, a.flags
            Pn = Signal(N)
            m.d.comb += Pn.eq(a.P << a.sh)
            # sticky: P's bits below Dw - 1 - sh (Pn's below N - 25)
            below = [Const(0, 1)] + [a.P[:k].any() for k in range(1, Dw)]
            sticky = Signal()
            with m.Switch(a.sh):
                for k in range(Dw - 1):
                    with m.Case(k):
                        m.d.comb += sticky.eq(below[Dw - 1 - k])
            mant, round_bit, hidden = Pn[N - 24:N - 1], Pn[N - 25], Pn[N - 1]

        # -- the result is (base << 23) + Cat(mant, hidden) + inc; overflow (an exponent
        # field of 255 or more) clears the mantissa and the increment and, from 255 up,
        # clamps base and clears the hidden bit ----------------------------------------------
        nan, quiet, sign = flags[0], flags[1], flags[2]
        over = base >= 0xFF
        kill = (over | ((base == 0xFE) & hidden)) & ~nan
        inc = round_bit & (sticky | mant[0])
        b = stage(m, True, "fields", mant=(mant & ~kill.replicate(23)) | Cat(Const(0, 22), quiet),
                  hidden=hidden & ~over, base=base[:8] | over.replicate(8), inc=inc & ~kill,
                  sign=sign)

        # -- round and pack in one add: a carry out of the mantissa raises the exponent (254
        # to 255 is the overflow to infinity) ---------------------------------------------
        total = Cat(b.mant, b.hidden) + Cat(b.inc, Const(0, 22), b.base)
        m.d.sync += self.y.eq(Cat(total[:31], b.sign))
        return m
