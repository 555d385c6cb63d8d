"""Unpack and classify a binary floating-point number of any :class:`FloatFormat`."""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Shape, Signal, unsigned
from amaranth.lib import data, enum, wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.floatfmt import FloatFormat, float_format
from qaccel.model.validate import check_int
from qaccel.rtl.arith.pipeline import stage

__all__ = ["FloatClass", "FloatUnpack", "unpacked_layout"]


class FloatClass(enum.Enum, shape=3):
    """What a floating-point code encodes."""

    ZERO = 0
    SUBNORMAL = 1
    NORMAL = 2
    INF = 3
    NAN = 4


def _exp_range(fmt: FloatFormat, normalize: bool) -> tuple[int, int]:
    lo = fmt.emin - fmt.mbits if normalize else fmt.emin
    hi = (1 << fmt.ebits) - 1 - fmt.bias
    return lo, hi


def unpacked_layout(fmt, *, normalize: bool = True) -> data.StructLayout:
    """Return the layout of :class:`FloatUnpack`'s output for ``fmt`` (see its Members).

    Fields: ``sign`` (1 bit), ``exp`` (signed, unbiased), ``sig`` (``unsigned(mbits + 1)``,
    hidden bit explicit at the top) and ``cls`` (:class:`FloatClass`).
    """
    fmt = float_format(fmt)
    if not isinstance(normalize, bool):
        raise TypeError(f"normalize must be a bool, not {normalize!r}")
    lo, hi = _exp_range(fmt, normalize)
    exp_shape = Shape.cast(range(lo, hi + 1))
    if not exp_shape.signed:
        exp_shape = Shape(exp_shape.width + 1, signed=True)
    return data.StructLayout({
        "sign": unsigned(1),
        "exp": exp_shape,
        "sig": unsigned(fmt.mbits + 1),
        "cls": FloatClass,
    })


class FloatUnpack(wiring.Component):
    """Split a floating-point code into sign, unbiased exponent and significand; classify it.

    The fields describe the code's bits with the finite-number rule, whatever its class:

    * exponent field ``E > 0``: ``exp = E - bias``, ``sig = 2**mbits + M`` (hidden bit set);
    * ``E == 0``: ``exp = emin`` (``1 - bias``) and ``sig = M`` (hidden bit clear); with
      ``normalize`` (the default), a non-zero ``sig`` is then shifted left until its top bit
      is set and ``exp`` lowered by the shift, so a subnormal looks like a normal number with
      an exponent below ``emin``.

    For every finite code, ``value = (-1)**sign * sig * 2**(exp - mbits)``. ``cls`` says how to
    read the fields: :class:`FloatClass` ``ZERO``, ``SUBNORMAL``, ``NORMAL``, ``INF`` or
    ``NAN`` following ``fmt``'s special codes (an "fnuz" NaN thus has the fields of -0, an
    IEEE NaN keeps its payload in ``sig``).

    Latency is ``latency`` cycles (0: combinational, no clock; 1: the output is registered,
    so a code applied in cycle *n* is unpacked on ``o`` in cycle *n + 1*; 2: the normalising
    shift amount is registered too, before the shift). Throughput is one code per cycle.
    There is no handshake; a stream wrapper adds one.

    Parameters
    ----------
    fmt : :class:`~qaccel.model.floatfmt.FloatFormat`, :class:`str` or dtype
        The input format, its name in :data:`~qaccel.model.floatfmt.FORMATS`, or its
        NumPy / ml_dtypes dtype.
    normalize : :class:`bool`
        Whether subnormal significands are normalised (see above).
    latency : :class:`int`
        Register stages, 0, 1 or 2.

    Raises
    ------
    :exc:`TypeError`
        If ``fmt`` is not a format, a name or a dtype, ``normalize`` not a bool, or
        ``latency`` not an integer.
    :exc:`ValueError`
        If ``fmt`` names no known format or ``latency`` is not 0, 1 or 2.

    Members
    -------
    i : :py:`In(unsigned(fmt.bits))`
        The code.
    o : :py:`Out(unpacked_layout(fmt, normalize=normalize))`
        ``sign`` (1 bit); ``exp``, signed, wide enough for every code (from ``emin - mbits``,
        or ``emin`` without ``normalize``, up to ``2**ebits - 1 - bias``); ``sig``,
        ``unsigned(mbits + 1)``; ``cls``, :class:`FloatClass`.
    """

    def __init__(self, fmt, *, normalize: bool = True, latency: int = 1):
        self._fmt = float_format(fmt)
        if not isinstance(normalize, bool):
            raise TypeError(f"normalize must be a bool, not {normalize!r}")
        self._normalize = normalize
        self._latency = check_int("latency", latency, 0, 2)
        super().__init__({
            "i": In(unsigned(self._fmt.bits)),
            "o": Out(unpacked_layout(self._fmt, normalize=normalize)),
        })

    @property
    def fmt(self) -> FloatFormat:
        """The input format."""
        return self._fmt

    @property
    def normalize(self) -> bool:
        """Whether subnormal significands are normalised."""
        return self._normalize

    @property
    def latency(self) -> int:
        """Cycles from a code on ``i`` to its fields on ``o`` (0 or 1)."""
        return self._latency

    def elaborate(self, platform):
        m = Module()
        fmt = self._fmt
        e_top = (1 << fmt.ebits) - 1

        sign = self.i[fmt.bits - 1]
        e = self.i[fmt.mbits:fmt.mbits + fmt.ebits]
        mant = self.i[:fmt.mbits]

        # Shift = leading zeros of the mantissa field plus one; the last matching assignment
        # (highest set bit) wins. With latency 2 it is registered before the shift.
        shift = Signal(range(fmt.mbits + 1))
        if self._normalize:
            for k in range(fmt.mbits):
                with m.If(mant[k]):
                    m.d.comb += shift.eq(fmt.mbits - k)
        cls = Signal(FloatClass)
        p = stage(m, self._latency >= 2, "lz", sign=sign, e=e, mant=mant, shift=shift,
                  cls=cls)

        # The fields as plain expressions (no conditional assignments): Yosys then writes a
        # continuous assignment, which Icarus evaluates at time 0 even when the registers
        # above never change (an `always @*` process would stay X there).
        sub = p.e == 0
        res = Signal(self.o.shape())
        if self._normalize:
            sub_sig, sub_exp = p.mant << p.shift, fmt.emin - p.shift
        else:
            sub_sig, sub_exp = p.mant, fmt.emin
        m.d.comb += [res.sign.eq(p.sign), res.cls.eq(p.cls),
                     res.sig.eq(Mux(sub, sub_sig, p.mant | (1 << fmt.mbits))),
                     res.exp.eq(Mux(sub, sub_exp, p.e - fmt.bias))]

        if fmt.nan == "ieee":
            specials = [((e == e_top) & (mant != 0), FloatClass.NAN),
                        ((e == e_top) & (mant == 0), FloatClass.INF)]
        elif fmt.nan == "single":
            specials = [((e == e_top) & (mant == fmt.mant_mask), FloatClass.NAN)]
        elif fmt.nan == "negzero":
            specials = [(self.i == fmt.sign_mask, FloatClass.NAN)]
        else:
            specials = []
        m.d.comb += cls.eq(FloatClass.NORMAL)
        with m.If(e == 0):
            m.d.comb += cls.eq(FloatClass.SUBNORMAL)
            with m.If(mant == 0):
                m.d.comb += cls.eq(FloatClass.ZERO)
        for cond, special in specials:
            with m.If(cond):
                m.d.comb += cls.eq(special)

        domain = m.d.sync if self._latency else m.d.comb
        domain += self.o.eq(res)
        return m
