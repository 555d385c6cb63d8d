"""A division operand: a code decoded into an exact wide float, then rounded to the division
precision (QuantizeLinear's ``precision`` attribute, DirectML's float32) or kept exact."""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from qaccel.rtl.arith.decode import Decode
from qaccel.rtl.arith.float_round import LATENCIES as ROUND_LATENCIES
from qaccel.rtl.arith.float_round import FloatRound
from qaccel.rtl.arith.pipeline import choose, delay, field_width
from qaccel.rtl.arith.wide_float import wide_float_layout

__all__ = ["DECODE_LATENCY", "ROUND_LATENCY", "OperandCast", "cast_control", "cast_precisions"]

#: The decoder's and the rounding unit's deepest pipelines: one compare, shift or add per stage.
DECODE_LATENCY = 4
ROUND_LATENCY = max(ROUND_LATENCIES)


def cast_precisions(precisions) -> tuple[str, ...]:
    """The precisions a cast rounds to: the carried ones but float64 (float32 if none)."""
    return tuple(p for p in precisions if p != "float64") or ("float32",)


def cast_control(m: Module, precisions, prec, cast) -> tuple[Signal, Signal]:
    """Return combinational ``(cast_fmt, keep)`` for :class:`OperandCast` from a precision
    index ``prec`` (into ``precisions``) and QuantizeLinear's ``cast`` register: the index in
    :func:`cast_precisions`, and whether the operand stays exact (no cast, or float64)."""
    casts = cast_precisions(precisions)
    cast_fmt = choose(m, prec, [casts.index(p) if p != "float64" else 0 for p in precisions],
                      field_width(len(casts)), "cast_fmt")
    exact = choose(m, prec, [p == "float64" for p in precisions], 1, "exact_precision")
    keep = Signal(name="keep")
    m.d.comb += keep.eq(~cast | exact)
    return cast_fmt, keep


class OperandCast(wiring.Component):
    """Decode a code of one of ``types`` (:class:`~qaccel.rtl.arith.decode.Decode`) and, unless
    ``keep``, round it to the precision ``casts[cast_fmt]`` (a
    :class:`~qaccel.rtl.arith.float_round.FloatRound`, no saturation: an overflow gives infinity).

    ``cast`` False builds no rounding unit: for operand types that are exact in every carried
    precision (:func:`~qaccel.rtl.arith.decode.exact_in`), where the cast is the identity.

    Latency :attr:`latency` cycles (``DECODE_LATENCY``, plus ``ROUND_LATENCY`` with a cast),
    one code per cycle. ``fmt``, ``cast_fmt`` and ``keep`` are read in the cycles their code
    needs them: hold them while codes are in flight.

    Members
    -------
    code : :py:`In(unsigned(widest of types))`
    fmt : :py:`In(unsigned(...))`
        Index of the code's type in ``types``.
    cast_fmt : :py:`In(unsigned(...))`
        Index of the precision in ``casts``.
    keep : :py:`In(1)`
        Pass the exact value (no ``precision``, or a float64 one).
    o : :py:`Out(wide_float_layout(sig_width, exp_width))`
    """

    def __init__(self, types, *, casts, cast: bool, sig_width: int, exp_width: int):
        self._decode = Decode(types, sig_width=sig_width, exp_width=exp_width,
                              latency=DECODE_LATENCY)
        self._round = None
        if cast:
            self._round = FloatRound(casts, sig_width=sig_width, exp_width=exp_width,
                                     latency=ROUND_LATENCY)
        members = self._decode.signature.members
        super().__init__({
            "code": In(members["code"].shape),
            "fmt": In(members["fmt"].shape),
            "cast_fmt": In(field_width(len(casts))),
            "keep": In(1),
            "o": Out(wide_float_layout(sig_width, exp_width)),
        })

    @property
    def latency(self) -> int:
        """Cycles from ``code`` to ``o``."""
        return self.latency_for(cast=self._round is not None)

    @staticmethod
    def latency_for(*, cast: bool) -> int:
        """:attr:`latency` of a unit built with ``cast``, without building it."""
        return DECODE_LATENCY + (ROUND_LATENCY if cast else 0)

    def elaborate(self, platform):
        m = Module()
        m.submodules.decode = dec = self._decode
        m.d.comb += [dec.code.eq(self.code), dec.fmt.eq(self.fmt), self.o.eq(dec.o)]
        if self._round is not None:
            m.submodules.cast = cast = self._round
            m.d.comb += [cast.i.eq(dec.o), cast.fmt.eq(self.cast_fmt), cast.saturate.eq(0),
                         self.o.eq(cast.value)]
            with m.If(self.keep):
                m.d.comb += self.o.eq(delay(m, dec.o, cast.latency, "exact"))
        return m

