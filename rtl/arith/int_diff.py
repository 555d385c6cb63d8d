"""The exact difference ``x - zero_point`` of two integer codes, as a sign and a magnitude."""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.dtypes import QType
from qaccel.rtl.arith.decode import decode_type
from qaccel.rtl.arith.pipeline import field_width, stage

__all__ = ["IntDiff"]

#: Significant bits of a float32 (int32 codes beyond them are rounded, see ``IntDiff``).
_F32_SIG = 24


def _plan(types) -> tuple[tuple[QType, ...], bool]:
    """``types`` decoded, and whether they need the int32 rounding; ValueError unless they
    are integer types."""
    ts = tuple(decode_type(t) for t in types)
    if not ts or not all(isinstance(t, QType) and t.is_int for t in ts):
        raise ValueError(f"types must be integer types, not {types!r}")
    return ts, any(t.bits - t.signed > _F32_SIG for t in ts)


class IntDiff(wiring.Component):
    """``d = x - zero_point`` (``x`` alone when ``use_zp`` is 0) for codes of a run-time selected
    integer type, exact: ``neg`` is ``d < 0``, ``mag`` is ``|d|``, ``zero`` is ``d == 0``.

    The golden model subtracts from ``x.astype(float32)``: exact for every type but int32,
    whose ``x`` is first rounded to float32's 24 significant bits (to nearest even, an integer
    again, up to ``2**31``) when int32 is carried; the difference of that and an int32 zero
    point is still exact (it is what float64 gives).

    A ``b``-bit type's difference lies in ``-(2**b - 1) .. 2**b - 1`` and an int32 one in
    ``-(2**32 - 1) .. 2**32``, so ``mag`` has :attr:`width` bits: the widest carried type's,
    33 with int32. The codes are sign- or zero-extended by the type (``fmt`` indexes
    ``types``; ``len(types)`` or more selects the last), then both ``x - zp`` and ``zp - x``
    are computed beside each other and the non-negative one kept: two carry chains side by
    side, one 2:1 multiplexer, no negation after the subtraction.

    The int32 rounding (built only when int32 is carried; the narrower types pass through it
    unchanged, having fewer than 24 significant bits) works on the two's complement code:
    with ``k`` the bits beyond 24 significant ones of ``x ^ sign`` (0 .. 8: ``x ^ sign`` is
    ``|x|``, or ``|x| - 1`` for a negative ``x``, which gives a ``k`` one smaller for a power
    of two, exact either way), ``x`` with its low ``k`` bits cleared is ``floor(x / 2**k)``
    and rounding to nearest even adds ``2**k`` on the usual round, sticky and last bits; a
    thermometer of ``k`` is the OR of each suffix of ``x ^ sign``'s top 8 bits. Two more
    register stages: the thermometer, then the rounding add.

    Latency :attr:`latency`: 1 (the outputs are registered), 3 with the int32 rounding. One
    difference per cycle.

    Parameters
    ----------
    types : :class:`tuple`
        Integer types (names or :class:`~qaccel.model.dtypes.QType`) in ``fmt`` order, at most
        32 bits wide.

    Members
    -------
    x, zero_point : :py:`In(unsigned(widest type's bits))`
        The codes, right-aligned (bits above the selected type's width are ignored).
    fmt : :py:`In(unsigned(field_width(len(types))))`
    use_zp : :py:`In(1)`
        0: the zero point is taken as 0.
    mag : :py:`Out(unsigned(width))`
    neg, zero : :py:`Out(1)`
    """

    def __init__(self, types):
        ts, self._round = _plan(types)
        self._types = ts
        bits = max(t.bits for t in ts)
        self._width = self.width_for(ts)
        super().__init__({
            "x": In(unsigned(bits)),
            "zero_point": In(unsigned(bits)),
            "fmt": In(unsigned(field_width(len(ts)))),
            "use_zp": In(1),
            "mag": Out(unsigned(self._width)),
            "neg": Out(1),
            "zero": Out(1),
        })

    @property
    def types(self) -> tuple[QType, ...]:
        return self._types

    @property
    def width(self) -> int:
        """Width of ``mag``: the widest carried type's, one more with the int32 rounding."""
        return self._width

    @property
    def latency(self) -> int:
        return self.latency_for(self._types)

    @staticmethod
    def width_for(types) -> int:
        """:attr:`width` of a unit carrying ``types``, without building it."""
        ts, rounds = _plan(types)
        return max(t.bits for t in ts) + rounds

    @staticmethod
    def latency_for(types) -> int:
        """:attr:`latency` of a unit carrying ``types``, without building it."""
        return 3 if _plan(types)[1] else 1

    def elaborate(self, platform):
        m = Module()
        ts = self._types
        bits = max(t.bits for t in ts)
        xe = Signal(signed(bits + 1))
        ze = Signal(signed(bits + 1))
        with m.Switch(self.fmt):
            for k, t in enumerate(ts):
                with m.Case(k) if k < len(ts) - 1 else m.Default():
                    for ext, code in ((xe, self.x), (ze, self.zero_point)):
                        raw = code[:t.bits]
                        m.d.comb += ext.eq(raw.as_signed() if t.signed else raw)
        zp = Signal(signed(bits + 1))
        m.d.comb += zp.eq(Mux(self.use_zp, ze, 0))
        if self._round:
            xr, zp = self._round_f32(m, xe, zp)
        else:
            xr = xe
        up = Signal(signed(len(xr) + 2))
        down = Signal(signed(len(xr) + 2))
        m.d.comb += [up.eq(xr - zp), down.eq(zp - xr)]
        neg = up[-1]
        m.d.sync += [self.neg.eq(neg), self.mag.eq(Mux(neg, down, up)[:self._width]),
                     self.zero.eq(xr == zp)]
        return m

    def _round_f32(self, m: Module, xe, zp):
        """``xe`` rounded to 24 significant bits (two register stages); ``zp`` delayed."""
        n = len(xe)                                   # 33: int32 sign-extended
        extra = n - 1 - _F32_SIG                      # 8 bits beyond 24 significant ones
        mag = xe[:n - 1] ^ xe[n - 1].replicate(n - 1)
        # therm[i]: more than 24 + i significant bits, i.e. bit i lies below the kept ones
        therm = Cat(*(mag[_F32_SIG + i:].any() for i in range(extra)))
        a = stage(m, True, "rnd", x=xe, therm=therm, zp=zp)
        t = Cat(a.therm, Const(0, 1))                 # t[extra] = 0
        low = a.x[:extra + 1]
        round_bit = Cat(*(low[i] & t[i] & ~t[i + 1] for i in range(extra))).any()
        sticky = Cat(*(low[i] & t[i + 1] for i in range(extra))).any()
        last = Cat(*(low[i] & t[i - 1] & ~t[i] for i in range(1, extra + 1))).any()
        inc = round_bit & (sticky | last)
        step = Cat(Const(0, 1), *(t[i - 1] & ~t[i] & inc for i in range(1, extra + 1)))
        kept = Cat(a.x[:extra] & ~a.therm, a.x[extra:]).as_signed()
        xr = Signal(signed(n + 1))
        m.d.comb += xr.eq(kept + step)
        b = stage(m, True, "rounded", x=xr, zp=a.zp)
        return b.x, b.zp
