"""Scale-table preparation for the reciprocal divider: each entry's scale decoded, rounded to the
division precision and given the reciprocal of its significand, as the table is written."""

from __future__ import annotations

from types import SimpleNamespace

from amaranth.hdl import Cat, Module, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.validate import check_int
from qaccel.rtl.arith.pipeline import delay
from qaccel.rtl.arith.reciprocal import Reciprocal
from qaccel.rtl.arith.wide_float import wide_float_layout

__all__ = ["ScalePrep", "prepared_entry_layout"]


def prepared_entry_layout(sig_width: int, exp_width: int, r_width: int,
                          zp_shape) -> data.StructLayout:
    """A prepared table entry: the scale as the divider takes it, its reciprocal without the
    top bit (always set: :class:`~qaccel.rtl.arith.reciprocal.Reciprocal`), the zero point's code.
    For float32 scales and 8-bit outputs, 72 bits: four DP16KD at 1,024 entries."""
    return data.StructLayout({"scale": wide_float_layout(sig_width, exp_width),
                              "recip": unsigned(r_width - 1), "zero_point": zp_shape})


class ScalePrep(wiring.Component):
    """Turn scale-table writes (``addr``, scale code, zero-point code) into prepared entries:
    the scale decoded and rounded to the division precision, and ``recip = floor((2**K - 1) /
    sig)`` (:class:`~qaccel.rtl.arith.reciprocal.Reciprocal`, ``K = sig_width + r_width - 1``),
    which :class:`~qaccel.rtl.arith.reciprocal_divide.ReciprocalDivide` needs (``r_width =
    q_width + 1``).

    The decoding is borrowed: the unit presents each scale code on ``dec_code`` (registered)
    and takes the decoded, cast value on ``dec_o`` ``decode_latency`` cycles later. The
    Quantize unit lends lane 0's dividend decoder (an
    :class:`~qaccel.rtl.elementwise.operand_cast.OperandCast` that also carries the scale
    types), idle
    while the table loads: ``busy`` selects the scale codes.

    ``units`` reciprocal units take the entries in turn. A write is accepted at most once every
    :attr:`interval` ``= ceil(Reciprocal latency / units)`` cycles (``i.ready`` low between),
    so each unit is free when its next entry arrives; entry *n* accepted in cycle *t* is
    written (``w_en``) in cycle *t +* :attr:`latency`, in order, one write per cycle at most.
    ``busy`` (a register) is high from the cycle after an accepted write until the cycle after
    its entry is written. A synchronous reset drops the entries in flight.

    Members
    -------
    i : :py:`In(stream.Signature(StructLayout({"addr", "scale", "zero_point"})))`
    dec_code : :py:`Out(scale_shape)`
        The scale code to decode (valid while ``busy``).
    dec_o : :py:`In(wide_float_layout(sig_width, exp_width))`
        Its decoded, cast value, ``decode_latency`` cycles later.
    w_en : :py:`Out(1)`
    w_addr : :py:`Out(unsigned(addr_width))`
    w_data : :py:`Out(prepared_entry_layout(...))`
    busy : :py:`Out(1)`
    """

    def __init__(self, *, decode_latency: int, sig_width: int, exp_width: int, r_width: int,
                 addr_width: int, scale_shape, zp_shape, units: int):
        self._units = check_int("units", units, 1, 8)
        self._decode_latency = check_int("decode_latency", decode_latency, 0)
        self._recips = [Reciprocal(d_width=sig_width, r_width=r_width) for _ in range(units)]
        self._timing = self.timing_for(decode_latency=decode_latency, r_width=r_width,
                                       units=units)
        self._entry = prepared_entry_layout(sig_width, exp_width, r_width, zp_shape)
        super().__init__({
            "i": In(stream.Signature(data.StructLayout({
                "addr": unsigned(addr_width), "scale": scale_shape,
                "zero_point": zp_shape}))),
            "dec_code": Out(scale_shape),
            "dec_o": In(wide_float_layout(sig_width, exp_width)),
            "w_en": Out(1),
            "w_addr": Out(unsigned(addr_width)),
            "w_data": Out(self._entry),
            "busy": Out(1),
        })

    @property
    def entry_layout(self) -> data.StructLayout:
        """Layout of a prepared entry (``w_data``)."""
        return self._entry

    @property
    def interval(self) -> int:
        """Cycles between accepted writes, at least."""
        return self._timing.interval

    @property
    def latency(self) -> int:
        """Cycles from an accepted write to its ``w_en``: the payload register, the decode
        and cast, the reciprocal, the write register."""
        return self._timing.latency

    @staticmethod
    def timing_for(*, decode_latency: int, r_width: int, units: int) -> SimpleNamespace:
        """:attr:`latency` and :attr:`interval` (attributes of the result) of a unit with
        these (valid) parameters, without building it."""
        recip = Reciprocal.latency_for(r_width=r_width)
        return SimpleNamespace(latency=1 + decode_latency + recip + 1,
                               interval=-(-recip // units))

    def elaborate(self, platform):
        m = Module()
        for k, unit in enumerate(self._recips):
            m.submodules[f"recip{k}"] = unit
        n, interval = self._units, self.interval

        # admission: one write per `interval` cycles
        wait = Signal(range(interval), name="wait")
        take = Signal()
        m.d.comb += [self.i.ready.eq(wait == 0), take.eq(self.i.valid & self.i.ready)]
        with m.If(take):
            m.d.sync += wait.eq(interval - 1)
        with m.Elif(wait != 0):
            m.d.sync += wait.eq(wait - 1)

        # the payload registered, then decoded and cast; addr and zero point alongside
        p = Signal.like(self.i.payload, reset_less=True)
        p_valid = Signal()
        m.d.sync += [p.eq(self.i.payload), p_valid.eq(take)]
        m.d.comb += self.dec_code.eq(p.scale)
        lat = self._decode_latency
        dec = self.dec_o
        line = Signal(max(lat, 1), name="valid_line")   # a shift register that resets
        chain = Cat(p_valid, line)
        if lat:
            m.d.sync += line.eq(chain[:lat])
        c_valid = chain[lat]
        c_addr = delay(m, p.addr, lat, "addr")
        c_zp = delay(m, p.zero_point, lat, "zp")

        # the reciprocal units in turn, each with its entry held until it is done
        turn = Signal(range(max(n, 2)), name="turn")    # (no zero-width signal: Icarus)
        hold = [Signal(data.StructLayout({"addr": len(p.addr), "scale": dec.shape(),
                                          "zero_point": len(p.zero_point)}),
                       name=f"hold{k}", reset_less=True) for k in range(n)]
        for k, unit in enumerate(self._recips):
            start = c_valid & (turn == k)
            m.d.comb += [unit.start.eq(start), unit.d.eq(dec.sig)]
            with m.If(start):
                m.d.sync += [hold[k].addr.eq(c_addr), hold[k].scale.eq(dec),
                             hold[k].zero_point.eq(c_zp)]
        with m.If(c_valid):
            m.d.sync += turn.eq(0 if n == 1 else (turn + 1) % n)

        # the write, registered (one unit is done per cycle at most)
        m.d.sync += self.w_en.eq(0)
        for k, unit in enumerate(self._recips):
            with m.If(unit.done):
                m.d.sync += [self.w_en.eq(1), self.w_addr.eq(hold[k].addr),
                             self.w_data.scale.eq(hold[k].scale),
                             self.w_data.recip.eq(unit.r[:-1]),
                             self.w_data.zero_point.eq(hold[k].zero_point)]

        # entries in flight; ``busy`` a register of its own (it gates the unit's admission)
        pending = Signal(range(2 * (self.latency + 1)), name="pending")
        busy = Signal(name="busy_reg")
        with m.If(take & ~self.w_en):
            m.d.sync += [pending.eq(pending + 1), busy.eq(1)]
        with m.Elif(self.w_en & ~take):
            m.d.sync += [pending.eq(pending - 1), busy.eq(pending != 1)]
        m.d.comb += self.busy.eq(busy)
        return m
