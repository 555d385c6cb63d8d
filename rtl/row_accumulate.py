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

    Structure: two accumulation banks used alternately (rows 0, 2, 4, ... in one, 1, 3, ...
    in the other) share one pipelined adder per column, so a row's first term is taken in the
    cycle after the previous row's last: there is no gap between rows (:attr:`row_gap` is
    0). Once a finished bank's last additions are done it is copied to the fold bank and
    cleared. The fold (``partial_sums`` additions, P[1].. and the bias, of ``LATENCY['add']
    + 1 = 8`` cycles each) runs on a second adder per column while the next rows accumulate.

    Throughput: one term per cycle, across row boundaries too, when ``partial_sums >= 8``
    (``LATENCY['add'] + 1``: a partial sum is reused 8 cycles after its previous term) and
    every row has at least :attr:`fold_cycles` ``= 8 * partial_sums`` terms (the fold of one
    row overlaps the next). With fewer partial sums, a row's terms come in groups of
    ``partial_sums`` every 8 cycles. With shorter rows the fold falls behind: the banks give
    one row of slack, then ``i`` waits (a row's first term is held until the bank it goes to
    has been handed to the fold), so rows are taken at one per :attr:`fold_cycles` cycles on
    average; nothing is lost. ``o`` is a register held until taken: while it is full, the
    next fold stops before its result, and then ``i`` waits as above. ``i.ready`` depends on
    registers only (never on ``i.valid`` or ``o.ready``).

    Latency: :attr:`latency` ``= 8 * partial_sums + 9`` cycles from the transfer of a row's
    last term to its ``y`` offered, when the fold is free.

    Parameters
    ----------
    pe : int
        Columns, 1..64.
    partial_sums : int
        Partial sums per column, 1..16 (:attr:`AccelConfig.partial_sums
        <qaccel.model.config.AccelConfig.partial_sums>`).

    Members
    -------
    i : :py:`In(stream.Signature(StructLayout({"t": ArrayLayout(unsigned(32), pe), "bias":
        ArrayLayout(unsigned(32), pe), "row_last": 1})))`
    o : :py:`Out(stream.Signature(StructLayout({"y": ArrayLayout(unsigned(32), pe)})))`
    busy : :py:`Out(1)`
        A row begun, a finished row not yet transferred on ``o``, or additions in flight.
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
        """Cycles from the transfer of a row's last term to its ``y`` offered, the fold
        free: the last addition (``_ADD + 1``), the hand-off, and ``partial_sums`` fold
        additions of ``_ADD + 1`` cycles."""
        return _ADD + 2 + (_ADD + 1) * self._sums

    @property
    def fold_cycles(self) -> int:
        """Cycles the fold takes per row, ``(_ADD + 1) * partial_sums``: rows at least this
        long (in terms) keep one term per cycle."""
        return (_ADD + 1) * self._sums

    @property
    def row_gap(self) -> int:
        """Idle cycles of ``i`` between a row's last term and the next row's first (no
        pauses, rows of at least :attr:`fold_cycles` terms): 0."""
        return 0

    def elaborate(self, platform):
        m = Module()
        pe, L = self._pe, self._sums
        i, o = self.i, self.o
        sw = max(1, (L - 1).bit_length())

        # -- accumulation: banks 0 and 1, one adder per column -------------------------------
        bank = [[[Signal(32, name=f"b{b}_p{p}_{r}") for r in range(L)] for p in range(pe)]
                for b in range(2)]
        cur = Signal()                                  # the bank the input adds to
        slot = Signal(sw)                               # partial sum of the next term
        open_row = Signal()                             # terms of an unfinished row taken
        busy_slot = [Signal(L, name=f"busy_slot{b}") for b in range(2)]   # additions in flight
        pending = Signal(2)                             # bank holds a finished row
        end_bias = [[Signal(32, name=f"end_bias{b}_{p}") for p in range(pe)] for b in range(2)]
        flight_slot = [Signal(sw, name=f"fs{k}") for k in range(_ADD)]
        flight_bank = Signal(_ADD)
        flight_valid = Signal(_ADD)

        take = Signal()
        slot_free = Signal()
        m.d.comb += [
            slot_free.eq(~Mux(cur, busy_slot[1], busy_slot[0]).bit_select(slot, 1)),
            i.ready.eq(~pending.bit_select(cur, 1) & slot_free),
            take.eq(i.valid & i.ready),
        ]
        adders = []
        for p in range(pe):
            add = Binary32("add")
            m.submodules[f"acc{p}"] = add
            adders.append(add)
            c0 = pick(m, slot, bank[0][p], f"cur0_{p}")
            c1 = pick(m, slot, bank[1][p], f"cur1_{p}")
            m.d.comb += [add.a.eq(Mux(cur, c1, c0)), add.b.eq(i.payload.t[p])]
        # the bank and slot each result returns to, and when
        m.d.sync += [flight_valid.eq((flight_valid << 1) | take),
                     flight_bank.eq((flight_bank << 1) | cur),
                     flight_slot[0].eq(slot)]
        for k in range(1, _ADD):
            m.d.sync += flight_slot[k].eq(flight_slot[k - 1])
        done, done_bank, done_slot = (flight_valid[_ADD - 1], flight_bank[_ADD - 1],
                                      flight_slot[_ADD - 1])
        onehot_take = (1 << slot) if L > 1 else 1
        onehot_done = (1 << done_slot) if L > 1 else 1
        for b in range(2):
            set_b = Mux(take & (cur == b), onehot_take, 0)
            clear_b = Mux(done & (done_bank == b), onehot_done, 0)
            m.d.sync += busy_slot[b].eq((busy_slot[b] | set_b) & ~clear_b)
        with m.If(done):
            for b in range(2):
                with m.If(done_bank == b):
                    for p in range(pe):
                        with m.Switch(done_slot):
                            for r in range(L):
                                with m.Case(r):
                                    m.d.sync += bank[b][p][r].eq(adders[p].y)
        set_pending = Signal(2)
        with m.If(take):
            m.d.sync += [slot.eq(Mux(i.payload.row_last | (slot == L - 1), 0, slot + 1)),
                         open_row.eq(~i.payload.row_last)]
            with m.If(i.payload.row_last):
                m.d.sync += cur.eq(~cur)
                m.d.comb += set_pending.eq(Mux(cur, 0b10, 0b01))
                for b in range(2):
                    with m.If(cur == b):
                        m.d.sync += [end_bias[b][p].eq(i.payload.bias[p]) for p in range(pe)]

        # -- fold: the fold bank, a second adder per column ----------------------------------
        fbank = [[Signal(32, name=f"f{p}_{r}") for r in range(L + 1)] for p in range(pe)]
        step = Signal(range(L + 2))                      # next operand of the fold
        wait = Signal(range(_ADD + 1))
        acc = [Signal(32, name=f"facc{p}") for p in range(pe)]
        fold_idle = Signal(init=1)
        folders = []
        for p in range(pe):
            add = Binary32("add")
            m.submodules[f"fold{p}"] = add
            folders.append(add)
            operand = pick(m, step, fbank[p], f"fop{p}")      # step 1..L: P[1].. and the bias
            m.d.comb += [add.a.eq(acc[p]), add.b.eq(operand)]
        # one addition at a time: issue, wait for the adder, take its result; the last result
        # waits while o is full (the adder's operands are held, so its output is too)
        finishing = Signal()
        m.d.comb += finishing.eq(~fold_idle & (wait == _ADD) & (step == L) & ~o.valid)
        with m.If(~fold_idle):
            with m.If(wait == _ADD):
                with m.If(step != L):
                    m.d.sync += [wait.eq(0), step.eq(step + 1),
                                 *(acc[p].eq(folders[p].y) for p in range(pe))]
                with m.Elif(~o.valid):
                    m.d.sync += [o.valid.eq(1), fold_idle.eq(1),
                                 *(o.payload.y[p].eq(folders[p].y) for p in range(pe))]
            with m.Else():
                m.d.sync += wait.eq(wait + 1)
        with m.If(o.valid & o.ready):
            m.d.sync += o.valid.eq(0)

        # -- hand-off: the oldest finished bank, once drained, to the fold -------------------
        # (in the fold's last cycle at the latest: the statements below win over the fold's)
        hb = Signal()                                    # bank of the next hand-off
        handoff = Signal()
        hb_busy = Mux(hb, busy_slot[1], busy_slot[0]).any()
        clear_pending = Signal(2)
        m.d.comb += handoff.eq(pending.bit_select(hb, 1) & ~hb_busy & (fold_idle | finishing))
        with m.If(handoff):
            m.d.sync += [hb.eq(~hb), fold_idle.eq(0), step.eq(1), wait.eq(0)]
            m.d.comb += clear_pending.eq(Mux(hb, 0b10, 0b01))
            for b in range(2):
                with m.If(hb == b):
                    for p in range(pe):
                        m.d.sync += [acc[p].eq(bank[b][p][0]), fbank[p][L].eq(end_bias[b][p])]
                        for r in range(L):
                            m.d.sync += [fbank[p][r].eq(bank[b][p][r]), bank[b][p][r].eq(0)]
        m.d.sync += pending.eq((pending | set_pending) & ~clear_pending)
        m.d.comb += self.busy.eq(open_row | pending.any() | flight_valid.any() | ~fold_idle
                                 | o.valid)
        return m
