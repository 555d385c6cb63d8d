"""Widen a float scale code (float32, float16, bfloat16, float8e8m0) to the float32 code of the
same value."""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from qaccel.rtl.arith.float_unpack import FloatClass, FloatUnpack
from qaccel.rtl.arith.pipeline import field_width

__all__ = ["LATENCY", "TYPES", "ScaleToF32"]

#: The scale types :class:`ScaleToF32` widens.
TYPES = ("float32", "float16", "bfloat16", "float8e8m0")
_BITS = {"float32": 32, "float16": 16, "bfloat16": 16, "float8e8m0": 8}
#: Cycles from ``code`` and ``fmt`` to ``f32``.
LATENCY = 1


class ScaleToF32(wiring.Component):
    """``f32`` = the float32 code of the scale ``code`` (type ``types[fmt]``; ``len(types)`` or
    more selects the last), exact for every code, as NumPy / ml_dtypes widen it:

    * float32: the code itself;
    * bfloat16: the code shifted up 16 places (a NaN keeps its payload);
    * float16: rebiased, a subnormal normalised (every float16 is a normal float32), an
      infinity or NaN keeps its mantissa field shifted up 13 places (the NaN's payload);
    * float8e8m0: ``2**(c - 127)``, code 0 (``2**-127``) the float32 subnormal ``0x00400000``,
      code 255 the quiet NaN ``0x7FC00000``.

    NaNs are not quieted here. Latency 1 (the output is registered), one code per cycle.

    Members
    -------
    code : :py:`In(unsigned(widest type's bits))`
    fmt : :py:`In(unsigned(field_width(len(types))))`
    f32 : :py:`Out(unsigned(32))`
    """

    def __init__(self, types):
        types = tuple(types)
        if not types or any(t not in TYPES for t in types) or len(set(types)) != len(types):
            raise ValueError(f"types must be distinct names among {', '.join(TYPES)}, "
                             f"not {types!r}")
        self._types = types
        super().__init__({
            "code": In(unsigned(max(_BITS[t] for t in types))),
            "fmt": In(unsigned(field_width(len(types)))),
            "f32": Out(unsigned(32)),
        })

    @property
    def types(self) -> tuple[str, ...]:
        return self._types

    @property
    def latency(self) -> int:
        """:data:`LATENCY`."""
        return LATENCY

    def elaborate(self, platform):
        m = Module()
        ts = self._types
        res = Signal(32)
        with m.Switch(self.fmt):
            for k, t in enumerate(ts):
                with m.Case(k) if k < len(ts) - 1 else m.Default():
                    if t == "float32":
                        m.d.comb += res.eq(self.code[:32])
                    elif t == "bfloat16":
                        m.d.comb += res.eq(self.code[:16] << 16)
                    elif t == "float8e8m0":
                        c = self.code[:8]
                        m.d.comb += res.eq(Mux(c == 0xFF, 0x7FC00000,
                                               Mux(c == 0, 0x00400000, Cat(Const(0, 23), c))))
                    else:                                              # float16
                        u = m.submodules.unpack_f16 = FloatUnpack("float16", normalize=True,
                                                                  latency=0)
                        m.d.comb += u.i.eq(self.code[:16])
                        o = u.o
                        special = (o.cls == FloatClass.INF) | (o.cls == FloatClass.NAN)
                        # a finite value: the normalised significand's fraction, the exponent
                        # rebiased (float16's smallest subnormal 2**-24 has field 103)
                        fin = Cat(Const(0, 13), o.sig[:10], (o.exp + 127)[:8])
                        with m.If(o.cls == FloatClass.ZERO):
                            m.d.comb += res.eq(Cat(Const(0, 31), o.sign))
                        with m.Elif(special):
                            m.d.comb += res.eq(Cat(Const(0, 13), self.code[:10],
                                                   Const(0xFF, 8), o.sign))
                        with m.Else():
                            m.d.comb += res.eq(Cat(fin[:31], o.sign))
        m.d.sync += self.f32.eq(res)
        return m
