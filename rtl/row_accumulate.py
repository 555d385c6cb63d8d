"""The MatMulNBits engine's float32 accumulator: terms of a row into ``partial_sums`` partial
sums per column, then folded, plus the bias."""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.validate import check_int
from qaccel.rtl.binary32 import LATENCY, Binary32
from qaccel.rtl.pipeline import pick

__all__ = ["RowAccumulate"]

_ADD = LATENCY["add"]


class RowAccumulate(wiring.Component):
    """Sum the terms of each row in the engine's order, for ``pe`` columns at once.

    Term ``b`` of a row (counted from 0) is added to partial sum ``b % partial_sums`` of its
    column; every partial sum starts at +0. After the row's last term (``row_last``) the
    partial sums are folded, ``((P[0] + P[1]) + P[2]) ...``, and the bias is added: ``y =
    f32(fold + bias)``, with the bias of the row's last beat. This is the int8 path's order
    in :mod:`qaccel.model.nbits_hw` (terms are the block terms). Every addition is one
    :class:`~qaccel.rtl.binary32.Binary32` ``add``.

    Streams: ``i`` carries ``t`` (float32 bits per column), ``bias`` (read with
    ``row_last``) and ``row_last``; ``o`` carries ``y`` per column, one beat per row, held
    until taken.

    Throughput: one term per cycle when ``partial_sums >= 7`` (the adder's latency); with
    fewer, a partial sum is reused before its last addition is done, and ``i`` waits. After
    a row's last term, ``i`` waits :attr:`row_gap` cycles while the last additions finish and
    the partial sums move to the fold bank. The fold (``partial_sums`` additions, 8 cycles
    each) runs on its own adder, overlapping the next row, which must not end before it is
    done. Latency: :attr:`latency` cycles from the transfer of a row's last term to its
    ``y`` offered, no stalls.

    Parameters
    ----------
    pe : int
        Columns, 1..64.
    partial_sums : int
        Partial sums per column, 1..16 (:attr:`AccelConfig.partial_sums
        <qaccel.model.config.AccelConfig.partial_sums>`).
    """

    def __init__(self, *, pe: int, partial_sums: int):
        self._pe = check_int("pe", pe, 1, 64)
        self._sums = check_int("partial_sums", partial_sums, 1, 16)
        words = data.ArrayLayout(unsigned(32), pe)
        super().__init__({
            "i": In(stream.Signature(data.StructLayout(
                {"t": words, "bias": words, "row_last": 1}))),
            "o": Out(stream.Signature(data.StructLayout({"y": words}))),
            "busy": Out(1),
        })

    @property
    def latency(self) -> int:
        """Cycles from the transfer of a row's last term to its ``y`` offered, no stalls:
        the drain (``_ADD + 1``), the hand-off, and ``partial_sums`` additions of
        ``_ADD + 1`` cycles."""
        return _ADD + 2 + (_ADD + 1) * self._sums

    @property
    def row_gap(self) -> int:
        """Idle cycles of ``i`` between a row's last term and the next row's first (no
        pauses): the last additions finish and the bank is handed to the fold."""
        return _ADD + 1

    def elaborate(self, platform):
        m = Module()
        pe, L = self._pe, self._sums
        i, o = self.i, self.o
        sw = max(1, (L - 1).bit_length())

        # -- accumulation: bank A, one adder per column --------------------------------------
        bank = [[Signal(32, name=f"p{p}_{r}") for r in range(L)] for p in range(pe)]
        slot = Signal(sw)                               # partial sum of the next term
        busy_slot = Signal(L)                           # an addition into it is in flight
        flight_slot = [Signal(sw, name=f"fs{k}") for k in range(_ADD)]
        flight_valid = Signal(_ADD)
        ending = Signal()                               # row_last taken, additions draining
        end_bias = [Signal(32, name=f"end_bias{p}") for p in range(pe)]
        handoff = Signal()                              # bank A moves to the fold bank now

        fold_idle = Signal(init=1)
        take = Signal()
        m.d.comb += [
            i.ready.eq(~ending & ~busy_slot.bit_select(slot, 1)),
            take.eq(i.valid & i.ready),
            handoff.eq(ending & ~flight_valid.any() & fold_idle),
        ]
        adders = []
        for p in range(pe):
            add = Binary32("add")
            m.submodules[f"acc{p}"] = add
            adders.append(add)
            cur = pick(m, slot, bank[p], f"cur{p}")
            m.d.comb += [add.a.eq(cur), add.b.eq(i.payload.t[p])]
        # the slot each result returns to, and when
        m.d.sync += [flight_valid.eq(Mux(take, 1, 0) | (flight_valid << 1)),
                     flight_slot[0].eq(slot)]
        for k in range(1, _ADD):
            m.d.sync += flight_slot[k].eq(flight_slot[k - 1])
        done_slot, done = flight_slot[_ADD - 1], flight_valid[_ADD - 1]
        set_busy = Mux(take, 1 << slot, 0) if L > 1 else Mux(take, 1, 0)
        clear = Mux(done, 1 << done_slot, 0) if L > 1 else Mux(done, 1, 0)
        m.d.sync += busy_slot.eq((busy_slot | set_busy) & ~clear)
        with m.If(done):
            for p in range(pe):
                with m.Switch(done_slot):
                    for r in range(L):
                        with m.Case(r):
                            m.d.sync += bank[p][r].eq(adders[p].y)
        with m.If(take):
            m.d.sync += slot.eq(Mux(i.payload.row_last | (slot == L - 1), 0, slot + 1))
            with m.If(i.payload.row_last):
                m.d.sync += [ending.eq(1), *(end_bias[p].eq(i.payload.bias[p])
                                             for p in range(pe))]

        # -- fold: bank F, a second adder per column -----------------------------------------
        fbank = [[Signal(32, name=f"f{p}_{r}") for r in range(L + 1)] for p in range(pe)]
        step = Signal(range(L + 2))                      # next operand of the fold
        wait = Signal(range(_ADD + 1))
        acc = [Signal(32, name=f"facc{p}") for p in range(pe)]
        with m.If(handoff):
            m.d.sync += [ending.eq(0), fold_idle.eq(0), step.eq(1), wait.eq(0)]
            for p in range(pe):
                m.d.sync += [acc[p].eq(bank[p][0]), fbank[p][L].eq(end_bias[p])]
                for r in range(L):
                    m.d.sync += [fbank[p][r].eq(bank[p][r]), bank[p][r].eq(0)]
        folders = []
        for p in range(pe):
            add = Binary32("add")
            m.submodules[f"fold{p}"] = add
            folders.append(add)
            operand = pick(m, step, fbank[p], f"fop{p}")      # step 1..L: P[1].. and the bias
            m.d.comb += [add.a.eq(acc[p]), add.b.eq(operand)]
        # one addition at a time: issue, wait for the adder, take its result
        with m.If(~fold_idle & ~o.valid):
            with m.If(wait == _ADD):
                m.d.sync += [wait.eq(0), step.eq(step + 1),
                             *(acc[p].eq(folders[p].y) for p in range(pe))]
                with m.If(step == L):
                    m.d.sync += [o.valid.eq(1), fold_idle.eq(1),
                                 *(o.payload.y[p].eq(folders[p].y) for p in range(pe))]
            with m.Else():
                m.d.sync += wait.eq(wait + 1)
        with m.If(o.valid & o.ready):
            m.d.sync += o.valid.eq(0)
        m.d.comb += self.busy.eq(ending | flight_valid.any() | ~fold_idle | o.valid
                                 | (slot != 0))
        return m
