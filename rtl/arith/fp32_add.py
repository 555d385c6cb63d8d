"""IEEE float32 addition on bit patterns, rounded to nearest even: ``y = f32(a + b)`` (or
``f32(a - b)``), pipelined for 150 MHz on an ECP5 at speed grade 6.

Also holds the small elaboration helpers the dedicated float32 units share (a register, a
windowed multi-level shifter, leading- and trailing-zero counters).
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.validate import check_bool

__all__ = ["Fp32Add", "leading_zeros", "lz_merge", "reg", "shift_window", "trailing_zeros"]

_FRAC = 23                    # float32 fraction bits
_SIG = _FRAC + 1              # significand with the hidden bit
_EXT = 3                      # guard, round and sticky bits kept below the significand
_ALIGN = _SIG + _EXT          # aligned significand: 27 bits
_SUM = _ALIGN + 1             # sum with its carry: 28 bits
INF = 0x7F800000


def reg(m: Module, value, name: str) -> Signal:
    """Return ``value`` through one reset-less register of ``m``'s ``sync`` domain."""
    value = Value.cast(value)
    r = Signal(value.shape(), name=name, reset_less=True)
    m.d.sync += r.eq(value)
    return r


def shift_window(m: Module, v: Value, levels, lo: int, hi: int, name: str) -> Value:
    """Return bits ``lo .. hi`` of ``v`` shifted by ``sum(select * amount)`` over ``levels``
    (``(select, amount)`` pairs, positive amounts shift left), one 2:1 multiplexer level per
    pair (a combinational signal of ``m`` each); at each level only the positions that can
    still reach the window are built."""
    base, width = 0, len(v)                      # v holds positions base .. base + width - 1
    for i, (select, amount) in enumerate(levels):
        later = [a for _, a in levels[i + 1:]]
        need_lo = max(lo - sum(a for a in later if a > 0), min(base, base + amount))
        need_hi = min(hi - sum(a for a in later if a < 0),
                      max(base, base + amount) + width - 1)

        def part(src_base, first, last, v=v):  # positions first .. last of v at src_base
            bits = []
            for p in range(first, last + 1):
                k = p - src_base
                bits.append(v[k] if 0 <= k < len(v) else Const(0, 1))
            return Cat(*bits)

        keep = part(base, need_lo, need_hi)
        moved = part(base + amount, need_lo, need_hi)
        base, width = need_lo, need_hi - need_lo + 1
        v = Signal(width, name=f"{name}_{i}")
        m.d.comb += v.eq(Mux(select, moved, keep))
    out = []
    for p in range(lo, hi + 1):
        out.append(v[p - base] if 0 <= p - base < width else Const(0, 1))
    return Cat(*out)


def leading_zeros(v: Value) -> tuple[Value, Value]:
    """Return ``(count, all_zero)``: the leading zeros of ``v`` (``len(v)`` a power of two;
    ``count`` is only meaningful when ``all_zero`` is 0), as a tree of 2:1 choices."""
    n = len(v)
    if n == 1:
        return Const(0, 0), ~v[0]
    return lz_merge(leading_zeros(v[n // 2:]), leading_zeros(v[:n // 2]))


def lz_merge(hi: tuple[Value, Value], lo: tuple[Value, Value]) -> tuple[Value, Value]:
    """Return the ``(count, all_zero)`` of two equal halves' ``(count, all_zero)`` (the
    high half first): one level of the :func:`leading_zeros` tree."""
    (hi_n, hi_z), (lo_n, lo_z) = hi, lo
    return Cat(Mux(hi_z, lo_n, hi_n), hi_z), hi_z & lo_z


def trailing_zeros(v: Value) -> Value:
    """Return the trailing zeros of ``v`` (``len(v)`` a power of two; ``len(v) - 1`` for 0,
    the same as for a lone top bit), as a tree of 2:1 choices."""
    count, _ = leading_zeros(Cat(*reversed(list(v))))
    return count


class Fp32Add(wiring.Component):
    """``y = f32(a + b)`` (``f32(a - b)`` when ``sub``) on float32 bit patterns, as NumPy's
    float32 arithmetic gives it on x86-64.

    The arithmetic contract (that of the v1 engine's ``Binary32`` unit): the exact sum
    rounded to nearest even, IEEE overflow to infinity, gradual underflow (subnormal
    operands and results), and the special values of x86-64 SSE: ``inf - inf`` gives the
    default NaN ``0xFFC00000``; a NaN operand gives a NaN with that operand's sign (``a``'s
    if both are; for ``sub``, ``b``'s own sign, not flipped); an exact cancellation gives +0
    and ``(-0) + (-0)`` gives -0. NaN results are the canonical quiet NaN with that sign
    (``0x7FC00000`` / ``0xFFC00000``): payloads are not carried. Every 32-bit pattern is a
    legal operand.

    A dedicated float32 datapath, every stage registered, at most about three LUT levels or
    one carry chain and two LUT levels per stage:

    1. magnitude compare of ``a`` and ``b`` (31-bit carry chain), both exponent differences,
       special operand flags, trailing zeros of each significand;
    2. swap (larger magnitude first), alignment distance clamped to 31;
    3. alignment shift of the smaller significand (24 + 3 bits: guard, round, sticky); the
       sticky bit is set when a set bit reaches it (trailing zeros + 3 <= distance), so
       no shifted-out bits are collected; a subtrahend is inverted here;
    4. add or subtract on a 28-bit carry chain (never negative); a marker bit at the
       position of exponent 1, so that the normalisation of a subnormal result stops there;
    5. leading zeros of each byte of the marked sum, zero-sum flag;
    6. leading-zero count, normalising left shift by 16 and 8;
    7. left shift by 4, 2 and 1, result exponent, guard and sticky bits (a shift by 3 or
       more only follows a cancellation, which leaves nothing below the guard bit);
    8. round to nearest even and pack in one add (a carry out of the significand raises the
       exponent, up to infinity), special values, overflow, exact zeros.

    Measured alone on an LFE5U-25F speed 6 (:func:`qaccel.eda.synth.synthesize`, the wrapper
    included): 760 LUT4, 546 FF, no DSP, 167-174 MHz over nextpnr seeds 1-3
    (the v1 engine's ``Binary32`` ``add``: 1,396 LUT4, 53.8 MHz).

    Latency: :attr:`latency` = 8 cycles from ``a``/``b`` to ``y``; one result per cycle (a
    new operand pair every cycle), no handshake and no reset needed (a stream wrapper or a
    valid bit delayed by ``latency`` adds one).

    Parameters
    ----------
    sub : :class:`bool`
        Subtract ``b`` instead of adding it (elaboration time; it costs no logic).

    Members
    -------
    a, b : :py:`In(unsigned(32))`
        The operands' bit patterns.
    y : :py:`Out(unsigned(32))`
        The result's bit pattern.
    """

    LATENCY = 8

    def __init__(self, sub: bool = False):
        check_bool("sub", sub)
        self._sub = sub
        super().__init__({"a": In(unsigned(32)), "b": In(unsigned(32)),
                          "y": Out(unsigned(32))})

    @property
    def sub(self) -> bool:
        """Whether the unit computes ``a - b``."""
        return self._sub

    @property
    def latency(self) -> int:
        """Cycles from operands on ``a``/``b`` to their result on ``y``."""
        return self.LATENCY

    def elaborate(self, platform):
        m = Module()
        a, b = self.a, self.b

        # --- 1: compare, exponent differences, special operands ----------------------------
        def unpack(x):
            e, f = x[_FRAC:31], x[:_FRAC]
            ez, emax, fz = e == 0, e == 0xFF, f == 0
            # exponent as max(e, 1), hidden bit, inf, NaN, zero, trailing zeros (23 for f = 0)
            return (e | ez, ~ez, emax & fz, emax & ~fz, ez & fz,
                    trailing_zeros(Cat(f, Const(1, 32 - _FRAC))))

        ea, ha, inf_a, nan_a, zero_a, tz_a = unpack(a)
        eb, hb, inf_b, nan_b, zero_b, tz_b = unpack(b)
        sb = b[31] ^ int(self._sub)
        s1_a_ge = reg(m, a[:31] >= b[:31], "s1_a_ge")           # |a| >= |b| (or a NaN)
        s1_d_ab = reg(m, (ea - eb)[:8], "s1_d_ab")
        s1_d_ba = reg(m, (eb - ea)[:8], "s1_d_ba")
        s1_a = reg(m, Cat(a[:_FRAC], ha, ea, a[31]), "s1_a")     # significand, exponent, sign
        s1_b = reg(m, Cat(b[:_FRAC], hb, eb, sb), "s1_b")
        s1_tz = reg(m, Cat(tz_a, zero_a, tz_b, zero_b), "s1_tz")
        s1_flags = reg(m, Cat(inf_a, nan_a, inf_b, nan_b, b[31]), "s1_flags")

        # --- 2: swap (larger magnitude first), alignment distance, special results ----------
        a_ge = s1_a_ge
        big = Mux(a_ge, s1_a, s1_b)
        small = Mux(a_ge, s1_b, s1_a)
        tz_small = Mux(a_ge, s1_tz[6:12], s1_tz[:6])
        d = Mux(a_ge, s1_d_ab, s1_d_ba)
        inf_a, nan_a, inf_b, nan_b, sb_raw = s1_flags
        sa, sb = s1_a[-1], s1_b[-1]
        nan = nan_a | nan_b | (inf_a & inf_b & (sa != sb))
        force_sign = Mux(nan_a, sa, Mux(nan_b, sb_raw, Mux(nan, 1, Mux(inf_a, sa, sb))))
        s2_big = reg(m, big, "s2_big")
        s2_small = reg(m, small[:_SIG], "s2_small")
        s2_tz = reg(m, Cat((tz_small[:5] + _EXT)[:6], tz_small[5]), "s2_tz")   # + 3, zero
        s2_sh = reg(m, Mux(d[5:].any(), 31, d[:5]), "s2_shift")  # 31: everything is sticky
        s2_sub = reg(m, sa != sb, "s2_sub")
        # a forced result: sign, exponent all ones (inf, NaN) or zero, the quiet bit
        force = nan_a | nan_b | inf_a | inf_b
        s2_force = reg(m, Cat(force, nan, force, force_sign), "s2_force")

        # --- 3: alignment shift, sticky bit, inversion of a subtrahend ----------------------
        # significand at bits 26..3 (guard, round, sticky below), shifted right by sh; bit 0
        # collects the bits at or below it: one is set when trailing zeros + 3 <= sh
        levels = [(s2_sh[i], -(1 << i)) for i in reversed(range(5))]
        aligned = shift_window(m, Cat(Const(0, _EXT), s2_small), levels, 0, _ALIGN - 1,
                               "align")
        sticky = (s2_tz[:6] <= s2_sh) & ~s2_tz[6]
        s3_small = reg(m, Cat(sticky, aligned[1:]) ^ s2_sub.replicate(_ALIGN), "s3_small")
        s3_big = reg(m, s2_big, "s3_big")
        s3_sub = reg(m, s2_sub, "s3_sub")
        s3_force = reg(m, s2_force, "s3_force")

        # --- 4: add or subtract (|big| >= |small|: never negative) -------------------------
        m3_big = Cat(Const(0, _EXT), s3_big[:_SIG])
        e3 = s3_big[_SIG:_SIG + 8]
        # -x = ~x + 1 on 28 bits: the inverted significand, a one on top, a carry in
        total = (m3_big + Cat(s3_small, s3_sub) + s3_sub)[:_SUM]
        # marker bit: the sum's top bit has exponent e + 1, normalising stops at exponent 1,
        # bit 27 - e (a decoder from two predecoders)
        hi = [(e3[5:] == 0) & (e3[3:5] == j) for j in range(4)]
        lo = [e3[:3] == j for j in range(8)]
        marker = Cat(*(hi[(_SUM - 1 - i) >> 3] & lo[(_SUM - 1 - i) & 7]
                       for i in range(_SUM - 1)), Const(0, 1))
        s4_sum = reg(m, total, "s4_sum")
        s4_marked = reg(m, total | marker, "s4_marked")
        s4_exp = reg(m, e3, "s4_exp")
        s4_sign = reg(m, s3_big[-1], "s4_sign")
        s4_sub = reg(m, s3_sub, "s4_sub")
        s4_force = reg(m, s3_force, "s4_force")

        # --- 5: leading zeros of each byte of the marked sum --------------------------------
        marked = Cat(Const(1 << 3, 32 - _SUM), s4_marked)       # at most 28 leading zeros
        bytes_lz = [leading_zeros(marked[8 * k:8 * k + 8]) for k in range(4)]
        s5_bytes = reg(m, Cat(*(Cat(n, z) for n, z in bytes_lz)), "s5_bytes")
        s5_zero = reg(m, s4_sum == 0, "s5_zero")
        s5_sum = reg(m, s4_sum, "s5_sum")
        s5_exp = reg(m, s4_exp, "s5_exp")
        s5_sign = reg(m, s4_sign, "s5_sign")
        s5_sub = reg(m, s4_sub, "s5_sub")
        s5_force = reg(m, s4_force, "s5_force")

        # --- 6: leading zeros, normalising shift by 16 and 8 --------------------------------
        parts = [(s5_bytes[4 * k:4 * k + 3], s5_bytes[4 * k + 3]) for k in range(4)]
        lz, _ = lz_merge(lz_merge(parts[3], parts[2]), lz_merge(parts[1], parts[0]))
        levels = [(lz[4], 16), (lz[3], 8)]
        s6_coarse = reg(m, shift_window(m, s5_sum, levels, 0, _SUM - 1, "coarse"), "s6_coarse")
        s6_lz = reg(m, lz, "s6_lz")
        s6_low = reg(m, s5_sum[:4], "s6_low")
        s6_exp = reg(m, s5_exp, "s6_exp")
        s6_sign = reg(m, s5_sign, "s6_sign")
        # an exact zero sum is forced: +0 from a cancellation, the sign of two equal-signed
        # zeros otherwise (the exponent alone would not pack to zero)
        force, q, ones, force_sign = s5_force
        zero_sign = s5_sign & ~s5_sub
        s6_force = reg(m, Cat(force | s5_zero, q, ones, Mux(force, force_sign, zero_sign)),
                       "s6_force")

        # --- 7: normalising shift by 4, 2 and 1, exponent, guard and sticky bits ------------
        levels = [(s6_lz[i], 1 << i) for i in reversed(range(3))]
        s7_sig = reg(m, shift_window(m, s6_coarse, levels, _SUM - _SIG, _SUM - 1, "fine"), "s7_sig")
        s7_exp = reg(m, (s6_exp - s6_lz)[:8], "s7_exp")          # biased exponent - 1
        s7_ovf = reg(m, (s6_exp == 254) & (s6_lz == 0), "s7_ovf")
        # a shift by 3 or more (a cancellation of two bits or more, which needs exponents 0
        # or 1 apart) leaves the two low bits of the sum 0: nothing set goes below the guard
        low = s6_low
        lz0, lz1, lz2 = s6_lz == 0, s6_lz == 1, s6_lz == 2
        s7_guard = reg(m, (lz0 & low[3]) | (lz1 & low[2]) | (lz2 & low[1]), "s7_guard")
        s7_sticky = reg(m, (lz0 & low[:3].any()) | (lz1 & low[:2].any()) | (lz2 & low[0]),
                        "s7_sticky")
        s7_sign = reg(m, s6_sign, "s7_sign")
        s7_force = reg(m, s6_force, "s7_force")

        # --- 8: round to nearest even and pack ---------------------------------------------
        up = s7_guard & (s7_sticky | s7_sig[0])
        packed = (Cat(Const(0, _FRAC), s7_exp) + s7_sig + up)[:31]
        force, q, ones, force_sign = s7_force
        special = Cat(Const(0, _FRAC - 1), q, ones.replicate(8), force_sign)
        m.d.sync += self.y.eq(Mux(force, special, Cat(Mux(s7_ovf, INF, packed)[:31], s7_sign)))
        return m
