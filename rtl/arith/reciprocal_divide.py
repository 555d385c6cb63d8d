"""Divide two exact wide floats through the divisor's reciprocal: a multiply, a back-multiply of
the low bits, one correction step; the quotient and sticky bit of the restoring divider."""

from __future__ import annotations

from dataclasses import dataclass, replace

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In

from qaccel.model.validate import check_bool, check_int
from qaccel.rtl.arith.ecp5 import MULT_WIDTH, registered_product
from qaccel.rtl.arith.float_divide import QuotientPorts, quotient_class
from qaccel.rtl.arith.float_unpack import FloatClass
from qaccel.rtl.arith.pipeline import delay

__all__ = ["ReciprocalDivide"]

#: A product tile of at most this many bit products (9 x 9) is built in LUTs, not a DSP.
LUT_TILE_BITS = 81
#: Cycles from a product's operands to its tiles (registered operands, registered products).
TILE_CYCLES = 2


@dataclass(frozen=True)
class _Term:
    """An addend ``value * 2**pos`` with ``0 <= value <= vmax`` (``value`` None when planning)."""

    pos: int
    vmax: int
    value: Value | None = None


class _ProductSlice:
    """Plan and build ``floor((x * y + extra + const) / 2**lo) mod 2**(hi - lo)`` for unsigned
    ``x``, ``y``, an optional ``extra_width``-bit addend and a constant, pipelined.

    ``x`` and ``y`` are cut into 18-bit chunks from bit 0; a chunk pair whose tile lies wholly
    at or above bit ``hi`` is left out, one crossing ``hi`` has its operands cut to the bits
    below ``hi``. A tile of at most ``lut_bits`` (default :data:`LUT_TILE_BITS`) bit products
    is built in LUTs:
    the wider operand and its triple registered, then one registered row per radix-4 digit of
    the narrower (0, 1, 2 or 3 times the wider); any other tile is a
    :func:`~qaccel.rtl.arith.ecp5.registered_product` (a MULT18X18D between registers). The
    tiles and rows (``extra`` delayed to them, ``const``) are summed by a tree of two-operand
    adders: the bits of the lowest term below ``lo`` and below every other term dropped, terms
    that do not overlap concatenated (no adder), the others paired by position, bits below the
    other operand passed through, every sum cut at ``hi``; a register after each level but the
    last. The result is combinational in the cycle :attr:`cycle` after the operands (a
    register when there is only one term).
    """

    def __init__(self, x_width: int, y_width: int, lo: int, hi: int, extra_width: int = 0,
                 const: int = 0, lut_bits: int = LUT_TILE_BITS):
        self.lo, self.hi, self.extra_width, self.const = lo, hi, extra_width, const
        self.tiles = []                           # (x_lo, x_width, y_lo, y_width, pos, lut)
        for xl in range(0, x_width, MULT_WIDTH):
            for yl in range(0, y_width, MULT_WIDTH):
                pos = xl + yl
                if pos >= hi:
                    continue
                xw = min(MULT_WIDTH, x_width - xl, hi - pos)
                yw = min(MULT_WIDTH, y_width - yl, hi - pos)
                self.tiles.append((xl, xw, yl, yw, pos, xw * yw <= lut_bits))
        self.levels = self._sum(self._terms(None, None, None, None, "", False), None, "")[1]

    @property
    def dsps(self) -> int:
        """MULT18X18D tiles."""
        return sum(not t[-1] for t in self.tiles)

    @property
    def cycle(self) -> int:
        """Cycle of the result after the operands' (``TILE_CYCLES + levels - 1``, at least
        ``TILE_CYCLES``)."""
        return TILE_CYCLES + max(self.levels - 1, 0)

    def build(self, m: Module, x, y, extra, name: str, ecp5: bool = False) -> Value:
        """Add the slice of ``x * y (+ extra)`` to ``m``; return its ``hi - lo`` bits."""
        term = self._sum(self._terms(m, x, y, extra, name, ecp5), m, name)[0]
        v, shift = term.value, self.lo - term.pos
        if shift < 0:
            v, shift = Cat(Const(0, -shift), v), 0
        width = self.hi - self.lo
        v = Cat(v, Const(0, max(0, width + shift - len(v))))
        return v[shift:shift + width]

    # -- the tiles ------------------------------------------------------------------------------

    def _terms(self, m, x, y, extra, name, ecp5) -> list[_Term]:
        terms = []
        for k, (xl, xw, yl, yw, pos, lut) in enumerate(self.tiles):
            xs = None if m is None else x[xl:xl + xw]
            ys = None if m is None else y[yl:yl + yw]
            if lut:
                terms += self._rows(m, xs, ys, (xw, yw), pos, f"{name}_t{k}")
            else:
                vmax = min(((1 << xw) - 1) * ((1 << yw) - 1), (1 << (self.hi - pos)) - 1)
                p = None if m is None else registered_product(m, xs, ys, ecp5=ecp5,
                                                              name=f"{name}_t{k}")
                terms.append(self._cut(_Term(pos, vmax, p)))
        if self.extra_width:
            value = None if m is None else delay(m, extra, TILE_CYCLES, f"{name}_extra")
            terms.append(self._cut(_Term(0, (1 << self.extra_width) - 1, value)))
        if self.const:
            pos = (self.const & -self.const).bit_length() - 1
            value = None if m is None else Const(self.const >> pos)
            terms.append(self._cut(_Term(pos, self.const >> pos, value)))
        return terms

    def _rows(self, m, xs, ys, widths, pos, name) -> list[_Term]:
        """A LUT tile: a row per radix-4 digit of the narrower operand."""
        (nw, narrow), (ww, wide) = sorted(zip(widths, (xs, ys), strict=True),
                                          key=lambda t: t[0])
        wmax, rows = (1 << ww) - 1, []
        if m is not None:
            regs = {"n": narrow, "w": wide, "w3": wide + (wide << 1)}
            for key, value in regs.items():
                reg = Signal(len(value), name=f"{name}_{key}", reset_less=True)
                m.d.sync += reg.eq(value)
                regs[key] = reg
            n1, w1, w3 = regs["n"], regs["w"], regs["w3"]
        for j in range(0, nw, 2):
            if pos + j >= self.hi:
                break
            two = j + 1 < nw
            value = None
            if m is not None:
                value = (Mux(n1[j + 1], Mux(n1[j], w3, w1 << 1), Mux(n1[j], w1, 0)) if two
                         else Mux(n1[j], w1, 0))
                row = Signal(len(value), name=f"{name}_r{j // 2}", reset_less=True)
                m.d.sync += row.eq(value)
                value = row
            rows.append(self._cut(_Term(pos + j, 3 * wmax if two else wmax, value)))
        return rows

    # -- the adder tree -------------------------------------------------------------------------

    def _cut(self, t: _Term) -> _Term:
        """``t`` without its bits at and above ``hi``, as narrow as its bound allows."""
        vmax = min(t.vmax, (1 << (self.hi - t.pos)) - 1)
        value = None if t.value is None else t.value[:max(1, vmax.bit_length())]
        return _Term(t.pos, vmax, value)

    def _add(self, a: _Term, b: _Term) -> _Term:
        if a.pos > b.pos:
            a, b = b, a
        gap = b.pos - a.pos
        value = None
        if a.value is not None:
            if a.vmax >> gap == 0:                # no overlap: a concatenation
                value = Cat(a.value[:gap], Const(0, max(0, gap - len(a.value))), b.value)
            else:
                value = Cat(a.value[:gap], a.value[gap:] + b.value)
        return self._cut(_Term(a.pos, a.vmax + (b.vmax << gap), value))

    def _pack(self, terms: list[_Term]) -> list[_Term]:
        """Concatenate terms that do not overlap (each onto the one ending last below it);
        return the rest sorted by position."""
        def end(t):
            return t.pos + t.vmax.bit_length()

        lanes = []
        for t in sorted(terms, key=lambda t: (t.pos, t.vmax)):
            below = [k for k, lane in enumerate(lanes) if end(lane) <= t.pos]
            if below:
                k = max(below, key=lambda k: end(lanes[k]))
                lanes[k] = self._add(lanes[k], t)
            else:
                lanes.append(t)
        return sorted(lanes, key=lambda t: (t.pos, t.vmax))

    def _sum(self, terms: list[_Term], m, name) -> tuple[_Term, int]:
        terms = sorted(terms, key=lambda t: (t.pos, t.vmax))
        # the bits of the lowest term below every other term are the sum's own: drop those
        # below lo
        top = self.lo if len(terms) == 1 else min(self.lo, terms[1].pos)
        low = terms[0]
        if top > low.pos:
            shift = top - low.pos
            value = low.value
            if value is not None:
                value = value[shift:] if shift < len(value) else Const(0, 1)
            terms[0] = self._cut(_Term(top, low.vmax >> shift, value))
        levels = 0
        while len(terms := self._pack(terms)) > 1:
            terms = [self._add(terms[i], terms[i + 1]) for i in range(0, len(terms) - 1, 2)] \
                + terms[len(terms) & ~1:]
            levels += 1
            if len(terms) > 1 and m is not None:
                regs = []
                for k, t in enumerate(terms):
                    reg = Signal(len(t.value), name=f"{name}_s{levels}_{k}", reset_less=True)
                    m.d.sync += reg.eq(t.value)
                    regs.append(replace(t, value=reg))
                terms = regs
        return terms[0], levels


class ReciprocalDivide(QuotientPorts, wiring.Component):
    """Divide ``a`` by ``b`` (wide floats) given ``r``, the reciprocal of ``b``'s significand
    (:class:`~qaccel.rtl.arith.reciprocal.Reciprocal` with ``d_width = b_width``,
    ``r_width = q_width + 1``): the result of :class:`~qaccel.rtl.arith.float_divide.FloatDivide`
    with the same widths, bit for bit, for every input (``r`` is ignored unless ``a`` and ``b``
    are both finite and non-zero; then it must be the reciprocal of ``b.sig``).

    ``q`` is ``a / b`` truncated to a normalised ``q_width``-bit significand with an exact
    sticky bit; classes, signs and the exponent (``a.exp - b.exp`` or one less, ``q.exp``
    ``exp_width + 2`` bits) as FloatDivide states them
    (:func:`~qaccel.rtl.arith.float_divide.quotient_class`), ``exp``, ``sig`` and ``sticky`` 0 for
    the classes without a magnitude. Operands as for FloatDivide: exact, finite non-zero ones
    normalised.

    **Algorithm.** Let ``d = b.sig``, ``a' = a.sig >> t``, ``t = max(0, a_width - q_width -
    b_width)`` (dropped bits only reach the sticky bit: ``floor(floor(u / 2**t) / d) =
    floor(u / (d * 2**t))``), ``n`` the width of ``a'`` and ``s = q_width + b_width - n >= 0``.
    FloatDivide's digits are ``Q = floor(a' * 2**s / d) < 2**(q_width + 1)``, its sticky bit
    ``a' * 2**s mod d != 0`` or a dropped bit. With ``K = q_width + b_width``,
    ``r * d = 2**K - 1 - rho``, ``0 <= rho < d``:

    1. *Bound.* As ``K - n = s``, ``a' * r / 2**n = a' * 2**s / d - e`` with
       ``e = a' * (1 + rho) / (d * 2**n)``, and ``0 < e < 1`` since ``1 + rho <= d`` and
       ``0 < a' < 2**n``. So ``q0 = floor(a' * r / 2**n)`` is ``Q`` or ``Q - 1``, and
       ``Q - 1`` whenever the quotient is exact. The first product gives ``q1 = q0 + 1 =
       floor((a' * r + 2**n) / 2**n)``, ``Q`` or ``Q + 1`` (the constant is free: it is
       concatenated onto a term with zeros there).
    2. *Low bits suffice.* ``y = a' * 2**s - q1 * d`` lies in ``[-d, d)``, inside
       ``[-2**b_width, 2**b_width)``, so ``z = -y mod 2**w``, ``w = b_width + 1``, determines
       it; ``z = q1 * d - a' * 2**s (mod 2**w)`` needs only the tiles of ``q1 * d`` below bit
       ``w``, each cut there, and ``a' * 2**s mod 2**w``, which is 0 when ``s >= w`` (the
       usual case: no extra term).
    3. *Correction.* ``z = 0``: exact, ``Q = q1``. Else ``z``'s top bit set: ``y > 0``,
       ``Q = q1``; clear: ``y < 0``, ``Q = q1 - 1`` with remainder ``y + d``, never 0 (by 1.).
       Sticky = ``z != 0``. Then FloatDivide's normalisation (``Q``'s top bit set: its last bit
       into the sticky bit, exponent ``a.exp - b.exp``; else ``a.exp - b.exp - 1``).

    **Pipeline**: one division per cycle, no handshake, :attr:`latency` cycles from ``a``,
    ``b``, ``r`` to ``q``. Each product takes registered operands and registered tiles (a
    ``*`` between fabric registers, which Yosys maps onto a MULT18X18D, or radix-4 LUT rows),
    then one two-operand adder level per cycle, the last level into the next register (the
    back-multiply's operands, ``z``); then the correction's two bits, then ``q1 - 1`` and the
    normalisation, each registered. For ``a_width = b_width = 24``, ``q_width = 26`` (the
    Quantize lane's float32 divider): ``a' * r`` (24 x 27 bits) as three MULT18X18D (18 x 18,
    18 x 9, 6 x 18) and a 6 x 9 LUT tile (three rows), three levels; ``q1 * d mod 2**25`` as
    one MULT18X18D (18 x 18) and two LUT tiles mod ``2**7`` (7 x 7, 6 x 7), three levels;
    latency 11 (FloatDivide: 28 with one digit per stage). Measured alone on an LFE5U-25F
    speed 6 (Yosys ``synth_ecp5``; nextpnr through :func:`qaccel.eda.synth.synthesize`): 376
    LUT4 (100 of them CCU2C pairs), 910 FF, 4 MULT18X18D, 139-140 MHz (seeds 1-3; limited by
    the MULT18X18D between fabric registers); FloatDivide the same way: 1423 LUT4, 2098 FF,
    183 MHz.

    Parameters
    ----------
    a_width, b_width, q_width : :class:`int`
        Widths of ``a.sig``, ``b.sig`` and ``q.sig``, each in ``[1, MAX_SIG_WIDTH]``.
    exp_width : :class:`int`
        Width of ``a.exp`` and ``b.exp``, in ``[2, MAX_EXP_WIDTH - 2]``.
    max_dsps : :class:`int` or None
        At most this many MULT18X18D (a budget, so that many lanes fit a part): the smallest
        DSP tiles are built in LUTs instead until the rest fit (for the float32 divider, 3
        moves the 6 x 18 tile of ``a' * r`` into LUT rows). None: the tiles above
        :data:`LUT_TILE_BITS` bit products are all DSPs.
    ecp5 : :class:`bool`
        Build the DSP tiles as MULT18X18D instances with their own input and output registers
        (:func:`~qaccel.rtl.arith.ecp5.mult18x18d`; the same cycles) for synthesis, not a ``*``
        between fabric registers, which nextpnr times as 3.9 ns of logic plus the routing in
        and out. Simulate with False (the default).

    Raises
    ------
    :exc:`TypeError`
        If a parameter is not an integer.
    :exc:`ValueError`
        If a parameter is out of its range.

    Members
    -------
    a : :py:`In(wide_float_layout(a_width, exp_width))`
        The dividend.
    b : :py:`In(wide_float_layout(b_width, exp_width))`
        The divisor.
    r : :py:`In(unsigned(q_width + 1))`
        The reciprocal of ``b.sig``, with ``b``.
    q : :py:`Out(wide_float_layout(q_width, exp_width + 2))`
        The quotient, with its sticky bit.
    """

    def __init__(self, *, a_width: int, b_width: int, q_width: int, exp_width: int,
                 max_dsps: int | None = None, ecp5: bool = False):
        members = self._quotient_members(a_width=a_width, b_width=b_width, q_width=q_width,
                                         exp_width=exp_width)
        if max_dsps is not None:
            check_int("max_dsps", max_dsps, 0)
        self._ecp5 = check_bool("ecp5", ecp5)
        self._mul, self._back = self._products(a_width, b_width, q_width, max_dsps)
        super().__init__({**members, "r": In(unsigned(q_width + 1))})

    @staticmethod
    def _products(a_width: int, b_width: int, q_width: int,
                  max_dsps: int | None) -> tuple[_ProductSlice, _ProductSlice]:
        """The plans of ``a' * r`` and ``q1 * d mod 2**w``, within ``max_dsps`` MULT18X18D."""
        n = min(a_width, q_width + b_width)            # width of a'
        w = b_width + 1
        lut_bits = LUT_TILE_BITS
        while True:
            # q1 = floor((a' * r + 2**n) / 2**n), z = q1 * d - a_low (mod 2**w)
            mul = _ProductSlice(n, q_width + 1, n, n + q_width + 2, const=1 << n,
                                lut_bits=lut_bits)
            back = _ProductSlice(q_width + 2, b_width, 0, w,
                                 w if q_width + b_width - n < w else 0, lut_bits=lut_bits)
            dsp_tiles = [t[1] * t[3] for t in mul.tiles + back.tiles if not t[-1]]
            if max_dsps is None or len(dsp_tiles) <= max_dsps:
                return mul, back
            lut_bits = min(dsp_tiles)                   # the smallest DSP tiles into LUTs

    @staticmethod
    def _cycles(mul: _ProductSlice, back: _ProductSlice) -> int:
        """The latency: the two products, the correction and the normalisation registers."""
        return mul.cycle + back.cycle + 3

    @staticmethod
    def latency_for(*, a_width: int, b_width: int, q_width: int,
                    max_dsps: int | None = None) -> int:
        """:attr:`latency` of a divider with these (valid) parameters, without building it
        (``ecp5`` builds have the same)."""
        return ReciprocalDivide._cycles(
            *ReciprocalDivide._products(a_width, b_width, q_width, max_dsps))

    @property
    def r_width(self) -> int:
        """Width of the reciprocal ``r``: ``q_width + 1``."""
        return self._q_width + 1

    @property
    def dsps(self) -> int:
        """MULT18X18D the two products take (the other tiles are LUTs)."""
        return self._mul.dsps + self._back.dsps

    @property
    def latency(self) -> int:
        """Cycles from ``a``, ``b`` and ``r`` to their quotient on ``q``."""
        return self._cycles(self._mul, self._back)

    def elaborate(self, platform):
        m = Module()
        aw, bw, qw = self._a_width, self._b_width, self._q_width
        n = min(aw, qw + bw)
        t, s, w = aw - n, qw + bw - n, bw + 1
        a, b = self.a, self.b

        # -- cycle 0: class, sign, exponent difference, the operands of a' * r ---------------
        cls, sign = quotient_class(m, a, b)
        ediff = Signal(signed(self._exp_width + 1), name="ediff")
        m.d.comb += ediff.eq(a.exp - b.exp)
        dropped = Signal(name="dropped")                 # a's bits below a' (t > 0)
        m.d.comb += dropped.eq(a.sig[:t] != 0 if t else 0)
        # -- q1 = q0 + 1, combinational in cycle c1 -------------------------------------------
        c1 = self._mul.cycle
        q1 = Signal(qw + 2, name="q1")
        m.d.comb += q1.eq(self._mul.build(m, a.sig[t:], self.r, None, "ar", self._ecp5))

        # -- z = q1 * d - a_low = -y (mod 2**w), registered in cycle cf -----------------------
        neg_low = None                                   # -(a' * 2**s) mod 2**w, when not 0
        if s < w:
            neg_low = Signal(w, name="neg_low")
            m.d.comb += neg_low.eq(-(a.sig[t:] << s))
            neg_low = delay(m, neg_low, c1, "neg_low")
        z = Signal(w, name="z", reset_less=True)
        m.d.sync += z.eq(self._back.build(m, q1, delay(m, b.sig, c1, "d"), neg_low, "qd",
                                          self._ecp5))

        # -- the correction (registered), then the normalisation (registered) -----------------
        exact = Signal(name="exact", reset_less=True)
        down = Signal(name="down", reset_less=True)
        m.d.sync += [exact.eq(z == 0),                   # y = 0
                     down.eq((z != 0) & ~z[-1])]         # y < 0: Q = q1 - 1
        cf = c1 + self._back.cycle + 2
        q1 = delay(m, q1, cf - c1, "q1")
        cls, sign, ediff, dropped = (delay(m, v, cf, key) for key, v in (
            ("cls", cls), ("sign", sign), ("ediff", ediff), ("dropped", dropped)))
        quo = Signal(qw + 1, name="quo")
        m.d.comb += quo.eq(q1 - down)
        top = quo[qw]
        out = Signal(self.q.shape())
        m.d.comb += [out.sign.eq(sign), out.cls.eq(cls)]
        with m.If(cls == FloatClass.NORMAL):
            m.d.comb += [
                out.sig.eq(Mux(top, quo[1:], quo[:qw])),
                out.sticky.eq(~exact | (top & quo[0]) | dropped),
                out.exp.eq(ediff - 1 + top),
            ]
        q = Signal(self.q.shape(), name="q_reg", reset_less=True)
        m.d.sync += q.eq(out)
        m.d.comb += self.q.eq(q)
        return m
