"""Float32 to float16 or bfloat16, rounded to nearest even: the v2 engine's output rounding."""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["FORMATS", "LATENCY", "Fp32Narrow"]

#: ``fmt`` codes: 0 float16, 1 bfloat16.
FORMATS = ("float16", "bfloat16")
#: Cycles from ``a`` and ``fmt`` to ``y``.
LATENCY = 3

_F16_INF, _BF16_INF = 0x7C00, 0x7F80
_F16_QNAN, _BF16_QNAN = 0x7E00, 0x7FC0


class Fp32Narrow(wiring.Component):
    """``y = `` the float32 ``a`` (bit pattern) rounded to float16 (``fmt = 0``) or bfloat16
    (``fmt = 1``), to nearest even, as NumPy's ``astype(np.float16)`` and ml_dtypes'
    ``astype(bfloat16)`` round on x86-64: subnormal results included, values beyond the
    largest finite rounding to infinity, infinities kept, a NaN giving the quiet NaN of the
    format with ``a``'s sign (``0x7E00`` / ``0x7FC0``; the payload is not carried).

    One path for both formats: with ``m`` the 24-bit significand (the hidden bit set for
    normal ``a``), the result is ``base + RNE(m / 2^s)``, where ``base`` is the biased
    exponent less one, shifted to the field (0 for results below the normal range), and
    ``s`` is 13 (float16) or 16 (bfloat16) plus the subnormal shift; the hidden bit lands
    in the exponent field and a carry out of the rounding moves the exponent up (to
    infinity from the largest binade).

    Pipeline: :data:`LATENCY` cycles, a register after each stage: the exponent, ``base``,
    ``s`` and the trailing zeros of ``m``; a 12-bit shift (the guard bit with the kept
    bits) and the sticky bit as a comparison of ``s`` with the trailing zeros; the rounding
    add and the special values. Accepts a new ``a`` every cycle.

    Members
    -------
    a : :py:`In(32)`
    fmt : :py:`In(1)`
    y : :py:`Out(16)`
    """

    def __init__(self):
        super().__init__({"a": In(32), "fmt": In(1), "y": Out(16)})

    @property
    def latency(self) -> int:
        """Cycles from ``a`` to ``y``: :data:`LATENCY`."""
        return LATENCY

    def elaborate(self, platform):
        m = Module()
        a = self.a
        sign, exp, frac = a[31], a[23:31], a[:23]
        sig = Cat(frac, exp != 0)                                    # 24 bits

        # -- stage 1: exponents, shift and trailing zeros ------------------------------------
        # float16: biased exponent e16 = exp - 112; normal results for exp >= 113 (base
        # (e16 - 1) << 10), subnormal shift 1 - e16 = 113 - exp clamped to 0..12: compares
        # with constants and a 4-bit subtract, no wide adder chain
        s1 = {name: Signal(width, name=f"s1_{name}") for name, width in (
            ("sign", 1), ("nan", 1), ("ovf", 1), ("base", 15), ("sub", 4), ("bf", 1),
            ("sig", 24), ("tz", 5))}
        with m.If(self.fmt):                                         # bfloat16
            m.d.sync += [s1["ovf"].eq(exp == 255),
                         s1["base"].eq(Mux(exp != 0, exp - 1, 0) << 7), s1["sub"].eq(0)]
        with m.Else():                                               # float16
            m.d.sync += [s1["ovf"].eq(exp >= 143),
                         s1["base"].eq(Mux(exp >= 113, (exp - 113)[:5], 0) << 10),
                         s1["sub"].eq(Mux(exp >= 113, 0,
                                          Mux(exp <= 101, 12, (113 - exp)[:4])))]
        tz = Const(24, 5)
        for k in reversed(range(24)):
            tz = Mux(sig[k], k, tz)
        m.d.sync += [s1["sign"].eq(sign), s1["nan"].eq((exp == 255) & (frac != 0)),
                     s1["bf"].eq(self.fmt), s1["sig"].eq(sig), s1["tz"].eq(tz)]

        # -- stage 2: the kept bits with the guard bit, and the sticky bit ---------------------
        # the shift less one is 12 + sub (float16, sub 0..12; 13 and more leave nothing
        # but a sticky bit, as 12 does with the guard bit clear) or 15 (bfloat16)
        top = Mux(s1["bf"], s1["sig"][15:], s1["sig"][12:])          # 9 or 12 bits
        kept = Signal(12, name="s2_kept_guard")
        sticky = Signal(name="s2_sticky")
        shift_less_one = Mux(s1["bf"], 15, 12 + s1["sub"])
        m.d.sync += [kept.eq(top >> Mux(s1["bf"], 0, s1["sub"])),
                     sticky.eq(s1["tz"] < shift_less_one)]
        s2 = {name: Signal(len(s1[name]), name=f"s2_{name}")
              for name in ("sign", "nan", "ovf", "base", "bf")}
        m.d.sync += [s2[name].eq(s1[name]) for name in s2]

        # -- stage 3: round to nearest even, specials ----------------------------------------
        r, guard = kept[1:], kept[0]
        code = Signal(15)
        m.d.comb += code.eq(s2["base"] + r + (guard & (sticky | r[0])))
        inf = Mux(s2["bf"], _BF16_INF, _F16_INF)
        qnan = Mux(s2["bf"], _BF16_QNAN, _F16_QNAN)
        m.d.sync += self.y.eq(Cat(Mux(s2["nan"], qnan, Mux(s2["ovf"], inf, code))[:15],
                                  s2["sign"]))
        return m

