"""IEEE float32 multiplication on bit patterns, rounded to nearest even: ``y = f32(a * b)``,
pipelined for 150 MHz on an ECP5 at speed grade 6."""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.validate import check_bool
from qaccel.rtl.arith.ecp5 import PRODUCT_24X24_LATENCY, product_24x24
from qaccel.rtl.arith.fp32_add import (
    INF,
    leading_zeros,
    lz_merge,
    reg,
    shift_window,
    trailing_zeros,
)
from qaccel.rtl.arith.pipeline import delay

__all__ = ["LATENCY", "Fp32Mul"]

#: :attr:`Fp32Mul.latency` by ``dsp``.
LATENCY = {False: 9, True: 8}
_FRAC = 23
_SIG = _FRAC + 1              # significand with the hidden bit
_PROD = 2 * _SIG              # exact significand product: 48 bits
_WIN = _SIG + 1               # result significand and guard bit: product bits 47..23
_LO = 18                      # low part of a significand on a MULT18X18D


class Fp32Mul(wiring.Component):
    """``y = f32(a * b)`` on float32 bit patterns, as NumPy's float32 arithmetic gives it on
    x86-64.

    The arithmetic contract (that of the v1 engine's ``Binary32`` unit): the exact
    product rounded to nearest even, IEEE overflow to infinity, gradual underflow (subnormal
    operands and results), and the special values of x86-64 SSE: ``0 * inf`` gives the
    default NaN ``0xFFC00000``; a NaN operand gives a NaN with that operand's sign (``a``'s if
    both are). NaN results are the canonical quiet NaN with that sign (``0x7FC00000`` /
    ``0xFFC00000``): payloads are not carried. Every 32-bit pattern is a legal operand.

    A dedicated float32 datapath, every stage registered, at most about three LUT levels or
    one carry chain and two LUT levels per stage (``P`` register stages for the product):

    1. unpack: significands with the hidden bit, the exponent sum ``t = ea + eb - 127``
       (subnormal exponents read as 1), special operand flags; ``3 * a``'s significand
       (LUT product);
    2. - 1 + P. the exact 48-bit significand product (below; with ``dsp`` its operand
       registers are stage 1). Alongside: trailing zeros of
       each significand (the product's are their sum: the sticky bit needs no shifted-out
       bits), a marker that makes the leading-zero count the wanted shift: it stops the
       normalisation at exponent 1 (bit 47 - t, for 0 <= t <= 24), and for t < 0 it alone
       is counted (the product is masked), giving the underflow shift;
    2 + P. leading zeros of each byte of the marked top 25 bits; the right shift by 32 of
       the underflow case;
    3 + P. leading-zero count, shift by 16 and 8;
    4 + P. shift by 4, 2 and 1 (left up to 24 places to normalise a product with a
       subnormal operand, or right ``1 - t`` places, saturating, for gradual underflow),
       keeping only the 24-bit significand and the guard bit; exponent; sticky bit;
    5 + P. round to nearest even and pack in one add (a carry out of the significand raises
       the exponent, up to infinity), special values and overflow.

    The product, by ``dsp``:

    - ``False`` (default): in LUTs, P = 4: twelve radix-4 rows (0, 1, 2 or 3 times ``a``'s
      significand, one 2:1 + 2:1 multiplexer per bit) summed by a tree of carry-chain adders,
      a register after each level. Measured alone on an LFE5U-25F speed 6
      (:func:`qaccel.eda.synth.synthesize`, the wrapper included): 1,456 LUT4, 997 FF, no DSP,
      166-174 MHz over nextpnr seeds 1-3.
    - ``True``: :func:`~qaccel.rtl.arith.ecp5.product_24x24`, P = 3: three MULT18X18Ds
      (``al * bl``, ``al * bh``, ``ah * bl``, 18 + 6-bit split) with registered operands and
      products, the 6 x 6 ``ah * bh`` in LUTs; then the middle products' sum beside the
      outer ones, registered; the last add (30 bits) in the next stage. The MULT18X18Ds'
      operand registers are stage 1 (they take the unpacked significands).

      With ``ecp5=True`` the MULT18X18Ds are instances with their A/B input registers and
      output register (:func:`~qaccel.rtl.arith.ecp5.registered_product`), for synthesis only:
      665 LUT4, 684 FF, 3 DSP, 162-165 MHz over seeds 1-3 (the exponent and the side paths
      critical; the DSP is no longer on it). The same with a fourth MULT18X18D for
      ``ah * bh``: 596 LUT4, 4 DSP, 157-171 MHz. Without the registered middle sum (P = 2)
      the DSP output, 4 ns of routing and two carry chains gave 130-149 MHz.

      With ``ecp5=False`` (default) the same stages and values in plain Amaranth (a ``*``
      between registers, which Yosys maps onto a MULT18X18D without its registers:
      136 MHz, the bare DSP then critical); every simulator runs it, and the tests check
      the instances against it on Icarus with a model of the cell.

    (The v1 engine's ``Binary32`` ``mul``: 1,238 LUT4 + 4 DSP, 59.1 MHz.)

    Latency: :attr:`latency` = P + 5 cycles from ``a``/``b`` to ``y`` (:data:`LATENCY`: 9,
    or 8 with ``dsp``, ``ecp5`` or not); one result per cycle (a new operand pair every
    cycle), no handshake and no reset needed (a stream wrapper or a valid bit delayed by
    ``latency`` adds one).

    Parameters
    ----------
    dsp : :class:`bool`
        Significand product on MULT18X18Ds (fewer LUTs; 150 MHz only with ``ecp5``)
        instead of LUTs.
    ecp5 : :class:`bool`
        Instantiate the ECP5 primitives this unit has a variant for: with ``dsp``, the
        MULT18X18Ds as instances with their registers (synthesis only; simulation needs
        False, the default). No effect without ``dsp`` (no primitive there).

    Members
    -------
    a, b : :py:`In(unsigned(32))`
        The operands' bit patterns.
    y : :py:`Out(unsigned(32))`
        The result's bit pattern.
    """

    def __init__(self, dsp: bool = False, ecp5: bool = False):
        check_bool("dsp", dsp)
        check_bool("ecp5", ecp5)
        self._dsp = dsp
        self._ecp5 = ecp5
        super().__init__({"a": In(unsigned(32)), "b": In(unsigned(32)),
                          "y": Out(unsigned(32))})

    @property
    def dsp(self) -> bool:
        """Whether the significand product is on MULT18X18Ds."""
        return self._dsp

    @property
    def ecp5(self) -> bool:
        """Whether the MULT18X18Ds are instances with their registers (``dsp`` only)."""
        return self._ecp5

    @property
    def latency(self) -> int:
        """Cycles from operands on ``a``/``b`` to their result on ``y``."""
        return LATENCY[self._dsp]

    def elaborate(self, platform):
        m = Module()
        a, b = self.a, self.b

        # --- 1: unpack ----------------------------------------------------------------------------
        def unpack(x):
            e = x[_FRAC:31]
            f = x[:_FRAC]
            ez, emax, fz = e == 0, e == 0xFF, f == 0
            return e | ez, Cat(f, ~ez), emax & fz, emax & ~fz, ez & fz

        ea, ma, inf_a, nan_a, zero_a = unpack(a)
        eb, mb, inf_b, nan_b, zero_b = unpack(b)
        s1_ma = reg(m, ma, "s1_ma")
        s1_mb = reg(m, mb, "s1_mb")
        s1_t = reg(m, (ea + eb - 127).as_signed()[:10].as_signed(), "s1_t")   # -125 .. 381
        s1_flags = reg(m, Cat(inf_a, nan_a, zero_a, inf_b, nan_b, zero_b, a[31], b[31]),
                       "s1_flags")
        if self._dsp:
            prod, stages = _dsp_product(m, ma, mb, self._ecp5)
        else:
            # 3 * significand: the fraction's multiple on a carry chain straight from the
            # operand, the hidden bit's 3 * 2**23 added to its top two bits
            f = a[:_FRAC]
            f3 = (f + (f << 1))[:_SIG + 1]
            ma3 = Cat(f3[:_FRAC], (f3[_FRAC:] + ma[_FRAC].replicate(2))[:3])
            prod, stages = _lut_product(m, s1_ma, s1_mb, reg(m, ma3, "s1_ma3"))

        # --- 2: side information, carried along the product's stages ------------------------------
        t = s1_t
        tneg = t < 0
        # shift amount the leading-zero count is to give: the product's bit 47 has exponent
        # t + 1, so normalising stops at bit 47 - t (exponent 1) for 0 <= t <= 24 (a marker
        # bit); for t < 0 the product is masked and the marker makes the count rsh, the right
        # shift's low five bits (right by k = min(-t, 32) = 32 - rsh: rsh = t mod 32, or 0)
        rsh = Mux(t < -32, 0, t[:5])
        x = Mux(tneg, rsh, t[:5])
        valid = tneg | (t <= _WIN - 1)
        hi_dec = [valid & (x[3:5] == j) for j in range(4)]
        lo_dec = [x[:3] == j for j in range(8)]
        marker = Cat(*(hi_dec[(31 - i) >> 3] & lo_dec[(31 - i) & 7] for i in range(32)))
        marker = marker | Cat(Const(0, 6), ~tneg)      # stop at 25 (no marker above bit 23)
        # trailing zeros of the fractions (23 for 0): those of the product are their sum
        tz = Cat(*(trailing_zeros(Cat(x[:_FRAC], Const(1, 32 - _FRAC))) for x in (s1_ma, s1_mb)))
        inf_a, nan_a, zero_a, inf_b, nan_b, zero_b, sa, sb = s1_flags
        nan = nan_a | nan_b | (inf_a & zero_b) | (inf_b & zero_a)
        force_sign = Mux(nan_a, sa, Mux(nan_b, sb, Mux(nan, 1, sa ^ sb)))
        ones = nan | inf_a | inf_b
        # a forced result: sign, exponent all ones (inf, NaN) or zero, the quiet bit
        force = Cat(ones | zero_a | zero_b, nan, ones, force_sign)
        side = reg(m, Cat(t, tneg, marker, tz, force, sa ^ sb), "s2_side")
        side = delay(m, side, stages - 1, "side")
        t, tneg = side[:10].as_signed(), side[10]
        marker, tz = side[11:43], side[43:53]
        force, sign = side[53:57], side[57]

        # --- product stage: the marked top bits for the leading-zero count ------------------------
        top = prod[_PROD - _WIN:] & ~tneg.replicate(_WIN)
        lz_in = Cat(marker[:32 - _WIN], top | marker[32 - _WIN:])
        p_prod = reg(m, prod, "p_prod")
        p_lz_in = reg(m, lz_in, "p_lz_in")
        p_t = reg(m, t, "p_t")
        p_tneg = reg(m, tneg, "p_tneg")
        p_tz = reg(m, tz[:5] + tz[5:], "p_tz")
        p_force = reg(m, force, "p_force")
        p_sign = reg(m, sign, "p_sign")

        # --- leading zeros of each byte; right shift by 32 for an underflow ---------------------
        # positions: product bit p is at p; after this stage the vector holds positions -8..47
        bytes_lz = [leading_zeros(p_lz_in[8 * k:8 * k + 8]) for k in range(4)]
        z_bytes = reg(m, Cat(*(Cat(n, z) for n, z in bytes_lz)), "z_bytes")
        z_pre = reg(m, shift_window(m, p_prod, [(p_tneg, -32)], -8, _PROD - 1, "pre"), "z_pre")
        z_t = reg(m, p_t, "z_t")
        z_tfar = reg(m, p_t < -32, "z_tfar")      # a compare of its own: one chain per stage
        z_tneg = reg(m, p_tneg, "z_tneg")
        # sticky: some product bit ends below the window, i.e. its trailing zeros < 23 - shift:
        # lz <= 22 - tz (left), t <= 22 - tz (right; always for k = 32)
        z_st_lim = reg(m, (_FRAC - 1 - p_tz)[:7].as_signed(), "z_st_lim")
        z_force = reg(m, p_force, "z_force")
        z_sign = reg(m, p_sign, "z_sign")

        # --- leading zeros (the shift: lz, or -32 + lz = -k for t < 0); shift by 16 and 8 ---------
        parts = [(z_bytes[4 * k:4 * k + 3], z_bytes[4 * k + 3]) for k in range(4)]
        lz, _ = lz_merge(lz_merge(parts[3], parts[2]), lz_merge(parts[1], parts[0]))
        # positions 16..47 (those a shift by up to 7 more brings into the window)
        c_coarse = reg(m, shift_window(m, z_pre, [(lz[4], 16), (lz[3], 8)], 24, _PROD - 1 + 8,
                                       "coarse"),
                       "c_coarse")
        c_lz = reg(m, lz, "c_lz")
        c_t = reg(m, z_t, "c_t")
        c_tneg = reg(m, z_tneg, "c_tneg")
        c_st_neg = reg(m, (z_t <= z_st_lim) | z_tfar, "c_st_neg")
        c_st_lim = reg(m, z_st_lim, "c_st_lim")
        c_force = reg(m, z_force, "c_force")
        c_sign = reg(m, z_sign, "c_sign")

        # --- shift by 4, 2 and 1: the window (product bits 47..23 after the shift) --------------
        levels = [(c_lz[i], 1 << i) for i in reversed(range(3))]
        n_win = reg(m, shift_window(m, c_coarse, levels, _PROD - _WIN - 16, _PROD - 1 - 16,
                                        "fine"), "n_win")
        n_exp = reg(m, Mux(c_tneg, 0, c_t - c_lz)[:9], "n_exp")     # biased exponent - 1
        n_sticky = reg(m, Mux(c_tneg, c_st_neg, c_lz <= c_st_lim), "n_sticky")
        n_force = reg(m, c_force, "n_force")
        n_sign = reg(m, c_sign, "n_sign")

        # --- round to nearest even and pack -------------------------------------------------------
        sig = n_win[1:]
        up = n_win[0] & (n_sticky | sig[0])
        packed = (Cat(Const(0, _FRAC), n_exp[:8]) + sig + up)[:31]
        ovf = n_exp >= 254
        force, q, ones, force_sign = n_force
        special = Cat(Const(0, _FRAC - 1), q, ones.replicate(8), force_sign)
        y = Mux(force, special, Cat(Mux(ovf, INF, packed)[:31], n_sign))
        m.d.sync += self.y.eq(y)
        return m


def _dsp_product(m: Module, ma, mb, ecp5: bool):
    """Return ``(product, stages)``: the 48-bit product of two 24-bit significands ``ma``,
    ``mb`` (unregistered: the MULT18X18Ds' input registers are stage 1), from
    :func:`~qaccel.rtl.arith.ecp5.product_24x24`'s two parts with their last add combinational:
    ``stages`` = 2 register stages after stage 1."""
    outer, mid = product_24x24(m, ma, mb, ecp5=ecp5, name="d")
    return Cat(outer[:_LO], outer[_LO:] + mid)[:_PROD], PRODUCT_24X24_LATENCY - 1


def _lut_product(m: Module, ma, mb, ma3):
    """Return ``(product, stages)``: the 48-bit product of two registered 24-bit significands
    in LUTs: twelve radix-4 rows (0, 1, 2 or 3 times ``ma``; ``ma3`` = 3 * ``ma`` registered
    with the operands), summed by a tree of carry-chain adders with a register after each
    level but the last (``stages`` = 3 register stages after the operands)."""
    terms = []                                   # (value, offset, bound)
    for k in range(_SIG // 2):
        d = mb[2 * k:2 * k + 2]
        row = Mux(d[1], Mux(d[0], ma3, ma << 1), Mux(d[0], ma, 0))[:_SIG + 2]
        terms.append((row, 2 * k, 3 * ((1 << _SIG) - 1)))
    stages = 0
    while len(terms) > 1:
        if stages:
            terms = [(reg(m, v, f"l{stages}_{i}"), o, bnd) for i, (v, o, bnd) in enumerate(terms)]
        nxt = []
        for i in range(0, len(terms) - 1, 2):
            (x, ox, bx), (y, oy, by) = terms[i], terms[i + 1]
            sh = oy - ox
            bound = bx + (by << sh)
            width = bound.bit_length()
            nxt.append((Cat(x[:sh], x[sh:] + y)[:width], ox, bound))
        if len(terms) % 2:
            nxt.append(terms[-1])
        terms = nxt
        stages += 1
    value, offset, _ = terms[0]
    assert offset == 0
    return value[:_PROD], stages - 1
