"""The int8 path's block term of the MatMulNBits engine, for ``pe`` columns at once."""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Signal, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.floatfmt import FORMATS
from qaccel.model.validate import check_int
from qaccel.rtl.binary32 import LATENCY, Binary32
from qaccel.rtl.float_round import FloatRound
from qaccel.rtl.float_round import min_exp_width as round_exp_width
from qaccel.rtl.int_to_float import IntToFloat
from qaccel.rtl.int_to_float import min_exp_width as int_exp_width
from qaccel.rtl.pipeline import delay

__all__ = ["BlockScale"]


_TO_F32_LATENCY = 4


class _ToBinary32(wiring.Component):
    """A ``width``-bit integer (signed or not, elaboration time) to float32 bits, rounded to
    nearest even (exact below 2**24); latency 4."""

    def __init__(self, width: int, is_signed: bool):
        self._width, self._signed = width, is_signed
        w = max(width + 1, 25)  # room for the sign and float32's 24-bit significand
        ew = max(int_exp_width(w), round_exp_width([FORMATS["float32"]]))
        self._conv = IntToFloat(width=w, exp_width=ew, latency=1)
        self._round = FloatRound(("float32",), sig_width=w, exp_width=ew, latency=3)
        self.latency = self._conv.latency + self._round.latency
        assert self.latency == _TO_F32_LATENCY
        super().__init__({"i": In(signed(width) if is_signed else unsigned(width)),
                          "y": Out(unsigned(32))})

    def elaborate(self, platform):
        m = Module()
        m.submodules.conv = conv = self._conv
        m.submodules.round = rnd = self._round
        m.d.comb += [conv.i.eq(self.i), conv.signed.eq(1), rnd.i.eq(conv.o), rnd.fmt.eq(0),
                     rnd.saturate.eq(0), self.y.eq(rnd.code)]
        return m


class BlockScale(wiring.Component):
    """Block terms of the int8 path (accuracy_level 4), one per column, every cycle.

    For each column ``p``: ``t[p] = f32(f32(f32(sa * sb[p]) * f32(isum[p])) + f32(f32(sa *
    f32(asum)) * f32(-sb[p] * zp[p])))``, the block term of :mod:`qaccel.model.nbits_hw`:
    ``isum[p]`` the exact block sum of activation times raw weight codes, ``asum`` that of the
    activations, ``sa`` the block's activation scale, ``sb[p]`` and ``zp[p]`` the column's
    weight scale and zero point. Floats are float32 bit patterns; every operation is one
    :class:`~qaccel.rtl.binary32.Binary32` (or an integer-to-float32 conversion, exact for
    magnitudes below 2**24), so the result is bit-exact with NumPy float32 arithmetic, NaN
    payloads aside.

    No handshake: operands with ``valid`` in cycle *n* give ``t`` with ``o_valid`` in cycle
    *n +* :attr:`latency` (23: conversion 4, ``sa*sb`` and ``sa*asum`` 6, the second products 6,
    the sum 7, with the operands delayed to meet); one block per cycle. ``o_valid`` resets to
    0; the data path does not.

    Parameters
    ----------
    pe : int
        Columns, 1..64.
    isum_width, asum_width : int
        Widths of the signed block sums (2..40 and 2..32).

    Members
    -------
    valid : In(1); isum : In(ArrayLayout(signed(isum_width), pe)); asum : In(signed(asum_width))
    sa : In(unsigned(32)); sb : In(ArrayLayout(unsigned(32), pe));
    zp : In(ArrayLayout(unsigned(8), pe)); o_valid : Out(1); t : Out(ArrayLayout(unsigned(32), pe))
    """

    def __init__(self, *, pe: int, isum_width: int, asum_width: int):
        self._pe = check_int("pe", pe, 1, 64)
        self._isum_width = check_int("isum_width", isum_width, 2, 40)
        self._asum_width = check_int("asum_width", asum_width, 2, 32)
        self._latency = _TO_F32_LATENCY + 2 * LATENCY["mul"] + LATENCY["add"]
        super().__init__({
            "valid": In(1),
            "isum": In(data.ArrayLayout(signed(isum_width), pe)),
            "asum": In(signed(asum_width)),
            "sa": In(unsigned(32)),
            "sb": In(data.ArrayLayout(unsigned(32), pe)),
            "zp": In(data.ArrayLayout(unsigned(8), pe)),
            "o_valid": Out(1),
            "t": Out(data.ArrayLayout(unsigned(32), pe)),
        })

    @property
    def pe(self) -> int:
        return self._pe

    @property
    def latency(self) -> int:
        """Cycles from operands (``valid``) to block terms (``o_valid``): 23."""
        return self._latency

    def elaborate(self, platform):
        m = Module()

        def unit(component, name):
            m.submodules[name] = component
            return component

        def mul(a, b, name):
            u = unit(Binary32("mul"), name)
            m.d.comb += [u.a.eq(a), u.b.eq(b)]
            return u.y, u.latency

        def to_f32(value, width, is_signed, name):
            u = unit(_ToBinary32(width, is_signed), name)
            m.d.comb += u.i.eq(value)
            return u.y, u.latency

        # shared by the columns: f32(sa * f32(asum))
        fa, c = to_f32(self.asum, self._asum_width, True, "asum_f32")
        sasum, lm = mul(delay(m, self.sa, c, "sa"), fa, "sa_asum")
        for p in range(self._pe):
            sb = self.sb[p]
            fi, _ = to_f32(self.isum[p], self._isum_width, True, f"isum_f32_{p}")
            fz, _ = to_f32(self.zp[p], 8, False, f"zp_f32_{p}")
            s_ab, _ = mul(self.sa, sb, f"sa_sb_{p}")                                # c. lm
            t1, _ = mul(s_ab, delay(m, fi, lm - c, f"fi_{p}"), f"t1_{p}")          # c. 2 lm
            nsb = Cat(sb[:31], ~sb[31])                                            # -sb, exact
            nz, _ = mul(delay(m, nsb, c, f"nsb_{p}"), fz, f"nz_{p}")               # c + lm
            t2, _ = mul(sasum, nz, f"t2_{p}")                                      # c + 2 lm
            add = unit(Binary32("add"), f"t_{p}")
            m.d.comb += [add.a.eq(delay(m, t1, c, f"t1d_{p}")), add.b.eq(t2),
                         self.t[p].eq(add.y)]
        v = self.valid
        for k in range(self._latency):
            r = Signal(name=f"valid_d{k + 1}")
            m.d.sync += r.eq(v)
            v = r
        m.d.comb += self.o_valid.eq(v)
        return m
