"""Decode a code of a run-time selected float or integer type into an exact wide float."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from amaranth.hdl import Cat, Module, Mux, Shape, Signal, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.dtypes import QTYPES, QType, dtype_name
from qaccel.model.floatfmt import FORMATS, FloatFormat
from qaccel.model.validate import check_int
from qaccel.rtl.arith.float_unpack import FloatClass, FloatUnpack
from qaccel.rtl.arith.int_to_float import IntToFloat
from qaccel.rtl.arith.pipeline import choice_index, delay
from qaccel.rtl.arith.wide_float import MAX_EXP_WIDTH, MAX_SIG_WIDTH, wide_float_layout

__all__ = ["E8M0", "INT_TYPES", "Decode", "PowerOfTwoFormat", "decode_type", "exact_in",
           "min_exp_width", "min_sig_width"]

#: Integer types :class:`Decode` accepts (the integer :data:`~qaccel.model.dtypes.QTYPES`):
#: the signed ones, then the unsigned, by width.
INT_TYPES = tuple(q.name for q in sorted((q for q in QTYPES.values() if q.is_int),
                                         key=lambda q: (not q.signed, q.bits)))


@dataclass(frozen=True)
class PowerOfTwoFormat:
    """An unsigned exponent-only format: code ``c`` is ``2**(c - bias)``, all ones is NaN (no
    sign, zero, infinity or subnormals).  Its one instance is :data:`E8M0`."""

    name: str
    bits: int
    bias: int

    @property
    def mbits(self) -> int:
        """No mantissa bits: the significand is the implicit 1."""
        return 0

    @property
    def emin(self) -> int:
        """Exponent of code 0."""
        return -self.bias

    @property
    def emax(self) -> int:
        """Exponent of the largest finite code (all ones but the last bit)."""
        return (1 << self.bits) - 2 - self.bias


#: float8e8m0, the OCP Microscaling shared scale (ONNX opset 24): ``2**(c - 127)``, 0xFF NaN.
E8M0 = PowerOfTwoFormat("float8e8m0", 8, 127)

_Float = (FloatFormat, PowerOfTwoFormat)


def decode_type(t, *, param: str = "type") -> FloatFormat | PowerOfTwoFormat | QType:
    """Return ``t`` as a :class:`~qaccel.model.floatfmt.FloatFormat` (float formats of
    :data:`~qaccel.model.floatfmt.FORMATS`), :data:`E8M0` or an integer
    :class:`~qaccel.model.dtypes.QType` (:data:`INT_TYPES`). ``t`` is either of those, a name,
    or a NumPy / ml_dtypes dtype.

    Raises ``TypeError`` (wrong kind of value) or ``ValueError`` (unknown type) naming
    ``param``.
    """
    if isinstance(t, _Float):
        return t
    if isinstance(t, QType):
        name = t.name
    elif isinstance(t, str):
        name = t
    else:
        try:
            name = dtype_name(np.dtype(t))
        except TypeError:
            raise TypeError(f"{param} must be a FloatFormat, an integer QType, a type name or "
                            f"a dtype, not {t!r}") from None
    if name in FORMATS:
        return FORMATS[name]
    if name == E8M0.name:
        return E8M0
    if name in INT_TYPES:
        return QTYPES[name]
    raise ValueError(f"{param} must be one of {', '.join((*FORMATS, E8M0.name, *INT_TYPES))}, "
                     f"not {name!r}")


def exact_in(t, p: FloatFormat) -> bool:
    """Whether every value of ``t`` (a :func:`~qaccel.rtl.arith.decode.decode_type` result) is exact
    in the IEEE-style format ``p``, infinities and NaNs included: rounding to ``p`` leaves it
    unchanged."""
    if isinstance(t, QType):
        return t.bits - t.signed <= p.mbits + 1
    return (t.mbits <= p.mbits and t.emax <= p.emax
            and t.emin - t.mbits >= p.emin - p.mbits)


def min_sig_width(types) -> int:
    """Return the narrowest ``sig_width`` :class:`Decode` accepts for ``types`` (resolved):
    the widest significand (``mbits + 1``) or integer width among them."""
    return max(t.mbits + 1 if isinstance(t, _Float) else t.bits for t in types)


def min_exp_width(types) -> int:
    """Return the narrowest ``exp_width`` :class:`Decode` accepts for ``types`` (resolved): the
    signed ``exp`` field must hold every finite value's exponent, from a float format's
    smallest subnormal (``emin - mbits``) up to its ``emax``, and an integer's ``bits - 1``."""
    lo = min((t.emin - t.mbits if isinstance(t, _Float) else 0) for t in types)
    hi = max((t.emax if isinstance(t, _Float) else t.bits - 1) for t in types)
    return Shape.cast(range(lo, hi + 1)).width + (0 if lo < 0 else 1)


class Decode(wiring.Component):
    """Decode a code of one of the carried types, selected at run time, into an exact wide float.

    The types an instance decodes are fixed at elaboration (``types``): float formats of
    :data:`~qaccel.model.floatfmt.FORMATS` and integer types of
    :data:`~qaccel.model.dtypes.QTYPES` (int2 .. int32, uint2 .. uint16). The input ``fmt``
    selects one in every cycle by its index; an ``fmt`` of ``len(types)`` or more selects the
    last. ``code`` holds the code right-aligned; bits above the selected type's width are
    ignored.

    The output ``o`` is the code's value as an exact wide float (``sticky = 0``):

    * float codes are unpacked (:class:`~qaccel.rtl.arith.float_unpack.FloatUnpack`, subnormals
      normalised) and their significand placed at the top of ``sig``; ``sign`` is the code's
      sign bit. ``cls`` is ``ZERO`` (±0), ``SUBNORMAL`` (a subnormal code; a wide float
      reads it as ``NORMAL``), ``NORMAL``, ``INF`` or ``NAN`` (with the code's sign: an fnuz
      NaN has sign 1; no payload). ``exp`` and ``sig`` are 0 for ``ZERO``, ``INF`` and
      ``NAN``. ``o`` equals the ``value`` output of
      :class:`~qaccel.rtl.arith.float_round.FloatRound`
      for the same code.
    * :data:`E8M0` codes are ``NORMAL`` powers of two (``sig`` its top bit alone, ``exp`` the
      code minus 127, ``sign`` 0), the all-ones code ``NAN`` (positive);
    * integer codes (two's complement for the signed types) convert as
      :class:`~qaccel.rtl.arith.int_to_float.IntToFloat` converts them: ``NORMAL`` with ``exp`` the
      magnitude's top bit position, or ``ZERO`` (+0, ``exp = sig = 0``) for 0.

    Latency is ``latency`` cycles (0: combinational, no clock; 1: the output is registered, so
    a code applied in cycle *n* is decoded on ``o`` in cycle *n + 1*; 2 and 3 pipeline the
    converters, see ``latency`` below). Throughput is one code per cycle. There is no
    handshake; a stream wrapper adds one.

    Parameters
    ----------
    types : :class:`tuple`
        The types the unit decodes, in ``fmt`` order: each a
        :class:`~qaccel.model.floatfmt.FloatFormat`, :data:`E8M0`, an integer
        :class:`~qaccel.model.dtypes.QType`, a name or a NumPy / ml_dtypes dtype (see
        :func:`decode_type`). Non-empty, no repeats.
    sig_width : :class:`int`
        Width of ``sig``: at least the widest significand or integer among ``types``
        (:func:`min_sig_width`), at most :data:`~qaccel.rtl.arith.wide_float.MAX_SIG_WIDTH`.
    exp_width : :class:`int`
        Width of ``exp``: at least :func:`min_exp_width`, at most
        :data:`~qaccel.rtl.arith.wide_float.MAX_EXP_WIDTH`.
    latency : :class:`int`
        Register stages, 0 to 4: 1 registers the output, 2 also the converters' outputs
        (before the selection by ``fmt``), 3 also their first halves (an integer's
        magnitude, a subnormal's normalising shift), 4 also the integer normalisation's
        first shifts.

    Raises
    ------
    :exc:`TypeError`
        If ``types`` is not a tuple or list of types, or a width or ``latency`` is not an
        integer.
    :exc:`ValueError`
        If ``types`` is empty, repeats a type or names an unknown one, a width is out of
        range, or ``latency`` is not in 0 .. 4.

    Members
    -------
    code : :py:`In(unsigned(max bits of types))`
        The code, right-aligned.
    fmt : :py:`In(unsigned(max(1, (len(types) - 1).bit_length())))`
        Index of the code's type in ``types``.
    o : :py:`Out(wide_float_layout(sig_width, exp_width))`
        The code's value.
    """

    def __init__(self, types, *, sig_width: int, exp_width: int, latency: int = 1):
        if not isinstance(types, (tuple, list)):
            raise TypeError(f"types must be a tuple of types, not {types!r}")
        if not types:
            raise ValueError("types must name at least one type, not ()")
        ts = tuple(decode_type(t, param=f"types[{k}]") for k, t in enumerate(types))
        for k, t in enumerate(ts):
            if t in ts[:k]:
                raise ValueError(f"types must be distinct, not {tuple(u.name for u in ts)!r} "
                                 f"({t.name} appears twice)")
        self._types = ts
        names = ", ".join(t.name for t in ts)
        check_int("sig_width", sig_width)
        lo = min_sig_width(ts)
        if not lo <= sig_width <= MAX_SIG_WIDTH:
            raise ValueError(f"sig_width must be in [{lo}, {MAX_SIG_WIDTH}] for types {names}, "
                             f"not {sig_width}")
        check_int("exp_width", exp_width)
        lo = min_exp_width(ts)
        if not lo <= exp_width <= MAX_EXP_WIDTH:
            raise ValueError(f"exp_width must be in [{lo}, {MAX_EXP_WIDTH}] for types {names}, "
                             f"not {exp_width}")
        self._sig_width = sig_width
        self._exp_width = exp_width
        self._latency = check_int("latency", latency, 0, 4)
        super().__init__({
            "code": In(unsigned(max(t.bits for t in ts))),
            "fmt": In(unsigned(max(1, (len(ts) - 1).bit_length()))),
            "o": Out(wide_float_layout(sig_width, exp_width)),
        })

    @property
    def types(self) -> tuple[FloatFormat | PowerOfTwoFormat | QType, ...]:
        """The types ``fmt`` selects from, in index order."""
        return self._types

    @property
    def sig_width(self) -> int:
        """Width of the output's significand."""
        return self._sig_width

    @property
    def exp_width(self) -> int:
        """Width of the output's exponent."""
        return self._exp_width

    @property
    def latency(self) -> int:
        """Cycles from a code on ``code`` to its value on ``o`` (0 .. 4)."""
        return self._latency

    def index(self, t) -> int:
        """Return the ``fmt`` input value that selects type ``t`` (a type, name or dtype).

        Raises :exc:`ValueError` if the unit does not carry ``t``.
        """
        return choice_index(self._types, decode_type(t))

    def elaborate(self, platform):
        m = Module()
        W = self._sig_width
        ts = self._types
        n = len(ts)
        ints = [t for t in ts if not isinstance(t, _Float)]

        # The per-type converters take the code directly (the integer one sign- or
        # zero-extended by `fmt`), with `inner` register stages of their own; the result is
        # selected by `fmt` delayed to match, then registered (latency >= 1).
        inner = max(0, self._latency - 1)
        fmt = delay(m, self.fmt, inner, "fmt")
        code = delay(m, self.code, inner, "code")
        res = Signal(self.o.shape())
        if ints:
            # One converter for every integer type: codes are sign- or zero-extended to the
            # widest integer, read as signed for the signed types.
            iw = max(t.bits for t in ints)
            conv = m.submodules.int_to_float = IntToFloat(width=iw, exp_width=self._exp_width,
                                                          latency=inner)
            with m.Switch(self.fmt):
                for k, t in enumerate(ts):
                    if not isinstance(t, _Float):
                        with m.Case(k) if k < n - 1 else m.Default():
                            raw = self.code[:t.bits]
                            m.d.comb += [conv.i.eq(raw.as_signed() if t.signed else raw),
                                         conv.signed.eq(int(t.signed))]
        unpacked = {}
        for k, t in enumerate(ts):
            if isinstance(t, FloatFormat):
                # stages beyond FloatUnpack's deepest pipeline register the code before it
                # (its leading-zero count then starts at a register, not at the code's source)
                lat = min(inner, 2)
                unpack = m.submodules[f"unpack_{k}"] = FloatUnpack(t, normalize=True,
                                                                  latency=lat)
                m.d.comb += unpack.i.eq(delay(m, self.code[:t.bits], inner - lat,
                                              f"code{k}"))
                unpacked[k] = unpack.o
        with m.Switch(fmt):
            for k, t in enumerate(ts):
                with m.Case(k) if k < n - 1 else m.Default():
                    if isinstance(t, FloatFormat):
                        u = unpacked[k]
                        special = ((u.cls == FloatClass.ZERO) | (u.cls == FloatClass.INF)
                                   | (u.cls == FloatClass.NAN))
                        m.d.comb += [res.sign.eq(u.sign), res.cls.eq(u.cls)]
                        with m.If(~special):
                            m.d.comb += [res.exp.eq(u.exp),
                                         res.sig.eq(u.sig << (W - t.mbits - 1))]
                    elif isinstance(t, PowerOfTwoFormat):
                        raw = code[:t.bits]
                        nan = raw == (1 << t.bits) - 1
                        m.d.comb += res.cls.eq(Mux(nan, FloatClass.NAN, FloatClass.NORMAL))
                        with m.If(~nan):
                            m.d.comb += [res.exp.eq(Cat(raw, 0).as_signed() - t.bias),
                                         res.sig.eq(1 << (W - 1))]
                    else:
                        m.d.comb += [
                            res.sign.eq(conv.o.sign),
                            res.exp.eq(conv.o.exp),
                            res.sig.eq(conv.o.sig << (W - iw)),
                            res.cls.eq(conv.o.cls),
                        ]

        # sticky is left undriven: a constant 0 (an `always @*` holding only a constant would
        # never run in Icarus, leaving it X)
        domain = m.d.sync if self._latency else m.d.comb
        domain += [self.o.sign.eq(res.sign), self.o.exp.eq(res.exp), self.o.sig.eq(res.sig),
                   self.o.cls.eq(res.cls)]
        return m
