"""A column slice of the MatMulNBits engine v2
(:class:`~qaccel.rtl.nbits.matmul_nbits_v2.MatMulNBitsV2`):
its copy of the tile's activations, the weight feed, the MAC array, the hand-off of the block
sums to the float lanes, the lanes' output banks and the read-out to ``y``."""

from __future__ import annotations

from types import SimpleNamespace

from amaranth.hdl import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.config import ENGINE_COUNT_WIDTH
from qaccel.model.validate import check_bool, check_int
from qaccel.rtl.arith.fp32_narrow import LATENCY as _OUT_ROUND_LATENCY
from qaccel.rtl.arith.fp32_narrow import Fp32Narrow
from qaccel.rtl.arith.pipeline import KEEP_ATTR, delay, local_copy
from qaccel.rtl.nbits import scale_lane
from qaccel.rtl.nbits.lane_admission import LaneAdmission
from qaccel.rtl.nbits.packed_mac_array import PackedMacArray, acc_width
from qaccel.rtl.nbits.row_quantizer import asum_width
from qaccel.rtl.nbits.scale_lane import ScaleLane

__all__ = ["COUNT_WIDTH", "INPUT_STAGES", "OUT_FORMATS", "OUT_LATENCY", "NBitsCluster",
           "lane_column", "lane_latency", "stream_members", "wide_columns"]

#: ``out_fmt`` values: the type ``y`` is rounded to (A's type), by index.
OUT_FORMATS = ("float32", "float16", "bfloat16")
#: Width of the engine's ``k``, ``m`` and ``groups`` registers (and the counters they bound).
COUNT_WIDTH = ENGINE_COUNT_WIDTH
_Y_FIFO = 16           # y beats reserved past the rounding (more than its latency)
_TERM_REG = 1           # the terms' register between the hand-off and the lanes
_CHAIN_GROUP = 4        # column pairs of a lane's block-sum chains under one sequencer replica
_BANK_READ_LATENCY = 3  # the banks' registered read, its word registered, the lane's chosen
#: Registers an input takes to a cluster with ``input_stage`` (one of several on a large part).
INPUT_STAGES = 3
#: A bank word taken to its ``y`` beat: the bank's registered read, its word registered, the
#: lane choice, the float16 / bfloat16 rounding and the ``y`` FIFO
#: (:attr:`NBitsCluster.out_latency`).
OUT_LATENCY = _BANK_READ_LATENCY + _OUT_ROUND_LATENCY + 2


def lane_latency(*, max_block: int) -> int:
    """A term's hand-off to its lane result offered, the terms' register then the lane
    (:attr:`NBitsCluster.lane_latency` without building the cluster): the lane's widths are
    the MAC array's accumulator and the row quantiser's ``asum`` for ``max_block``."""
    return _TERM_REG + scale_lane.latency(acc_width(max_block), asum_width(max_block))


def _log2(n: int) -> int:
    return (n - 1).bit_length()


def wide_columns(pe: int, lanes: int) -> tuple[tuple[int, int], ...]:
    """The MAC columns of each output column at 5..8 bits: ``(lo, hi)`` for column
    ``c < pe / 2``, the MAC columns whose nibble sums make ``isum = lo + 16 * hi`` (the host
    packs the code's low and high nibbles there): ``(2c, 2c + 1)``, both among the MAC
    columns of the lane that serves ``c`` (:func:`lane_column`), or with one MAC column per
    lane (``pe = lanes``) ``(c, c + pe / 2)``."""
    if pe == lanes:
        return tuple((c, c + pe // 2) for c in range(pe // 2))
    return tuple((2 * c, 2 * c + 1) for c in range(pe // 2))


def lane_column(pe: int, lanes: int, f: int, j: int, wide: bool) -> int | None:
    """The output column of lane ``f``'s term ``j`` (``0 <= j < J = pe / lanes``), or None
    for a term that carries none (at 5..8 bits). Each lane serves a contiguous run of MAC
    columns, ``f * J .. f * J + J - 1``, so its block sums come from one part of the MAC
    array: at 2..4 bits output column ``f * J + j``; at 5..8 bits (``pe / 2`` columns)
    ``f * J / 2 + j`` for ``j < J / 2`` (or column ``f`` of the first ``pe / 2`` lanes when
    ``J = 1``). With ``J > 1`` a run of lanes is a run of columns, so a slice of ``pe / n``
    columns and ``lanes / n`` lanes (an :class:`NBitsCluster`) maps the same way."""
    J = pe // lanes
    if not wide:
        return f * J + j
    if J == 1:
        return f if f < pe // 2 else None
    return f * (J // 2) + j if j < J // 2 else None


def _pick_isum(pe: int, lanes: int, f: int, isum, wide):
    """Lane ``f``'s block sums ``(isum, isum_hi)`` of a result's ``isum`` with one term per
    lane (``J = 1``): :func:`lane_column`, or at 5..8 bits (``wide``) :func:`wide_columns`."""
    c, cw = lane_column(pe, lanes, f, 0, False), lane_column(pe, lanes, f, 0, True)
    if cw is None:
        return isum[c], Const(0)
    lo, hi = wide_columns(pe, lanes)[cw]
    return Mux(wide, isum[lo], isum[c]), Mux(wide, isum[hi], 0)


def stream_members(pe: int, simd: int, lanes: int) -> dict:
    """The ``w``, ``b``, ``s`` and ``y`` members of an engine (or a cluster) of ``pe``
    columns, ``simd`` K elements per step and ``lanes`` float lanes."""
    return {
        "w": In(stream.Signature(unsigned(4 * pe * simd))),
        "b": In(stream.Signature(data.ArrayLayout(unsigned(32), lanes))),
        "s": In(stream.Signature(data.ArrayLayout(
            data.StructLayout({"scale": unsigned(32), "zp": unsigned(8)}), lanes))),
        "y": Out(stream.Signature(data.StructLayout({"y": unsigned(32),
                                                     "last": unsigned(1)}))),
    }


class NBitsCluster(wiring.Component):
    """``pe`` columns of the v2 engine with ``lanes`` float lanes: everything of
    :class:`~qaccel.rtl.nbits.matmul_nbits_v2.MatMulNBitsV2` that scales with the columns. The
    engine builds one or several (``AccelConfig.clusters``), each placed as a compact block:
    its job registers, row quantiser and stream split stay outside.

    The engine writes the tile's activations into the cluster's own copy of the activation
    and block memories (``act_w``, ``blk_w``: a registered write each) and pulses
    ``load_go`` when a tile's load starts and ``feed_go`` when its column groups start. The
    job fields (``kb`` blocks and ``steps`` weight steps per row, ``bpb`` steps per block,
    ``rows`` MAC rows and ``out_rows`` rows of ``y`` in the tile, ``groups``, ``wide``
    (5..8 bits), ``two`` (2-bit weights), ``bias``, ``out_fmt``, ``fmode``, ``fzp``,
    ``last_tile``) hold still while it works. The streams ``w``, ``s``, ``b`` and ``y`` are
    the engine's, cut to the cluster's columns and lanes (``y``: its ``cols`` words of each
    row, ``last`` on its last of the job). ``input_stage``: every input but the streams is
    registered three times in copies of its own, on the way and beside the cluster (three
    cycles later, :data:`INPUT_STAGES`; the engine's cycles follow), and the MAC array's result
    FIFO is LUT RAM (one of several clusters: block RAM sites are spread over the part, a
    cluster's FIFO would be too). ``idle`` (a register,
    one cycle behind) is high once the tile's groups are all fed, computed and their ``y``
    words sent, so the engine starts the next tile (or ends the job) only when nothing of
    this one is left inside.
    """

    def __init__(self, *, pe: int, simd: int, lanes: int, rows: int, max_block: int,
                 max_k: int, float_path: bool, dsp_pairs: int | None, blk_layout,
                 input_stage: bool = False, ecp5: bool = False):
        check_bool("ecp5", ecp5)
        check_bool("input_stage", input_stage)
        self._input_stage = input_stage
        check_bool("float_path", float_path)
        check_int("pe", pe, 2)
        check_int("lanes", lanes, 1, pe)
        self._pe, self._simd, self._F, self._T = pe, simd, lanes, rows
        self._mb, self._max_k, self._float_path = max_block, max_k, float_path
        self._J = pe // lanes
        self._blk_layout = blk_layout
        # (with an input stage, one of several clusters on a large part: its MAC results wait
        # in LUT RAM, beside it, rather than in block RAM spread over the part's rows)
        self._mac = PackedMacArray(pe=pe, simd=simd, rows=rows, max_block=max_block,
                                   dsp_pairs=dsp_pairs,
                                   block_fifo=False if input_stage else None, ecp5=ecp5)
        asum_w = data.Layout.cast(blk_layout)["asum"].shape.width
        self._lanes = [ScaleLane(depth=rows * self._J, isum_width=self._mac.acc_width,
                                 asum_width=asum_w, ecp5=ecp5)
                       for _ in range(lanes)]
        steps_max, kb_max = max_k // simd, max_k // 16
        CW = COUNT_WIDTH
        super().__init__({
            "kb": In(unsigned(CW)), "steps": In(unsigned(CW)),
            "bpb": In(range(max_block // simd + 1)),
            "rows": In(range(rows + 1)), "out_rows": In(range(rows + 1)),
            "groups": In(unsigned(CW)), "wide": In(1), "two": In(1), "bias": In(1),
            "out_fmt": In(unsigned(2)), "fmode": In(1), "fzp": In(1), "last_tile": In(1),
            "load_go": In(1), "feed_go": In(1),
            "act_w": In(data.StructLayout({"en": 1, "addr": range(rows * steps_max),
                                           "data": unsigned(8 * simd)})),
            "blk_w": In(data.StructLayout({"en": 1, "addr": range(rows * kb_max),
                                           "data": blk_layout})),
            **stream_members(pe, simd, lanes),
            "idle": Out(1),
        })

    @property
    def mac(self) -> PackedMacArray:
        return self._mac

    @property
    def lane(self) -> ScaleLane:
        """One of its lanes (all alike)."""
        return self._lanes[0]

    @property
    def out_latency(self) -> int:
        """A bank word taken to its ``y`` beat (:data:`OUT_LATENCY`)."""
        return OUT_LATENCY

    @property
    def lane_latency(self) -> int:
        """A term's hand-off to its lane result offered (the terms' register, then the
        lane; :func:`lane_latency`)."""
        return _TERM_REG + self._lanes[0].latency

    def _sequencer(self, m: Module, name: str, adm, o_valid, fzp) -> SimpleNamespace:
        """The hand-off's term sequencer, as registers named after ``name``: ``go`` (a term
        goes: the admission ``adm``'s verdict on the term offered next, picked here from its
        parallel verdicts by this sequencer's own registers, then registered), the head's
        term counter ``j``
        and ``j_last``, the zero-point phase ``zt`` (float path: a result's J weight terms,
        then with float zero points ``fzp`` its J zero-point terms), ``end`` (the term
        offered is the head's last), the head's ``valid`` and ``move`` (the head result
        leaves, the MAC array's next, valid with ``o_valid``, taken in its place). The
        hand-off runs one, and each lane and each run of block-sum chains a replica (kept
        registers, the same values) beside it: only the admission's verdicts and ``o_valid``
        come from afar, so no control net spans the cluster's columns."""
        J, keep = self._J, {KEEP_ATTR: 1}
        go = Signal(name=f"go_{name}", attrs=keep)
        j = Signal(range(J), name=f"j_{name}", attrs=keep)
        j_last = Signal(init=J == 1, name=f"j_last_{name}", attrs=keep)    # j == J - 1
        valid = Signal(name=f"valid_{name}", attrs=keep)
        with m.If(go):
            m.d.sync += j.eq(Mux(j_last, 0, j + 1))
        # the values j_last and zt take (a term going moves to the head's next term); `end`
        # is a register set from them (so that taking a result is one LUT from registers)
        j_last_after = Mux(go, Mux(j_last, J == 1, j == J - 2), j_last)
        m.d.sync += j_last.eq(j_last_after)
        # the term after j (0 after the last: the zero-point phase starts over) as a register
        j_next = Signal(range(J), init=1 % J, name=f"j_next_{name}")
        with m.If(go):
            m.d.sync += j_next.eq(Mux(j_last_after, 0, j_next + 1))
        if self._float_path:
            zt = Signal(name=f"zt_{name}", attrs=keep)
            end = Signal(init=J == 1, name=f"end_{name}", attrs=keep)
            zt_after = Mux(go & j_last, ~zt & fzp, zt)
            m.d.sync += [zt.eq(zt_after), end.eq(j_last_after & (zt_after | ~fzp))]
        else:
            zt, end = Const(0, 1), j_last
        # the admission's candidates: stay (no term goes now) the head's term or, with no
        # head, the next result's first; advance the next result's first after the head's
        # last term, else the head's next term (as the hand-off offers them)
        m.d.sync += go.eq(Mux(go, Mux(end, adm.advance_ok[0], adm.advance_ok[1]),
                              Mux(valid, adm.stay_ok[0], adm.stay_ok[1])))
        move = ~valid | (go & end)
        with m.If(move):
            m.d.sync += valid.eq(o_valid)
        return SimpleNamespace(go=go, j=j, j_last=j_last, j_next=j_next, zt=zt, end=end,
                               valid=valid, move=move)

    def _chains(self, m: Module, f: int, wide, lane_seq: SimpleNamespace, adm, fzp):
        """Lane ``f``'s block sums of the hand-off's head result (``J > 1``): two shift
        chains of ``J / 2`` registers, its even and its odd MAC columns (lane ``f`` serves
        columns ``f * J ..``, :func:`lane_column`). They load the result as the hand-off
        takes it and move one place per term at 5..8 bits (a term takes a column pair) or
        per two terms at 2..4 bits, so a term's block sums are the chains' heads: the
        returned ``(even, odd)``. (A J-way multiplexer would put one counter on some 400
        LUT inputs across the cluster's columns.) Each run of :data:`_CHAIN_GROUP` column
        pairs has its own replica of the hand-off's sequencer (:meth:`_sequencer`), the
        first (the chains' heads, beside the lane) the lane's ``lane_seq``."""
        J, mac = self._J, self._mac
        pairs = J // 2
        shape = mac.o.payload.isum[0].shape()
        chains = [[Signal(shape, name=f"chain{f}_{kind}{p}", reset_less=True)
                   for p in range(pairs)] for kind in ("even", "odd")]
        for g0 in range(0, pairs, _CHAIN_GROUP):
            name = f"l{f}g{g0 // _CHAIN_GROUP}"
            seq = (lane_seq if g0 == 0 else
                   self._sequencer(m, name, adm, mac.o.valid, fzp))
            wide_here = wide if g0 == 0 else local_copy(m, wide, f"wide_{name}")
            with m.If(seq.move | (seq.go & (wide_here | seq.j[0]))):
                for p in range(g0, min(pairs, g0 + _CHAIN_GROUP)):
                    for parity, chain in enumerate(chains):
                        after = chain[p + 1] if p + 1 < pairs else 0
                        column = mac.o.payload.isum[f * J + 2 * p + parity]
                        m.d.sync += chain[p].eq(Mux(seq.move, column, after))
        return chains[0][0], chains[1][0]

    def elaborate(self, platform):
        m = Module()
        pe, simd, T, mb = self._pe, self._simd, self._T, self._mb
        F, J = self._F, self._J
        float_path = self._float_path
        CW = COUNT_WIDTH
        steps_max = self._max_k // simd
        kb_max = self._max_k // 16
        log_steps, log_kb = _log2(steps_max), _log2(kb_max)
        m.submodules.mac = mac = self._mac
        for f, lane in enumerate(self._lanes):
            m.submodules[f"lane{f}"] = lane
        inputs = {name: getattr(self, name) for name in (
            "kb", "steps", "bpb", "rows", "out_rows", "groups", "wide", "two", "bias",
            "out_fmt", "fmode", "fzp", "last_tile", "load_go", "feed_go", "act_w", "blk_w")}
        if self._input_stage:   # copies on the way and beside this cluster (INPUT_STAGES)
            for k in range(INPUT_STAGES):
                inputs = {name: local_copy(m, value, f"{name}_in{k}")
                          for name, value in inputs.items()}
        kb_r, steps_r, rows_r, out_rows = (inputs[n] for n in ("kb", "steps", "rows",
                                                              "out_rows"))
        groups_r, wide, two, bias_r = (inputs[n] for n in ("groups", "wide", "two", "bias"))
        out_fmt_r, last_tile = inputs["out_fmt"], inputs["last_tile"]
        load_go, feed_go = inputs["load_go"], inputs["feed_go"]
        fmode = inputs["fmode"] if float_path else Const(0, 1)
        fzp = inputs["fzp"] if float_path else Const(0, 1)
        act_in, blk_in = inputs["act_w"], inputs["blk_w"]
        feeding = Signal()
        out_groups = Signal(CW)             # groups whose MAC results are all attached
        read_left = Signal(CW)              # groups whose outputs are to be read, less one
        sent_groups = Signal(CW)            # groups whose y words are all sent
        m.d.sync += self.idle.eq(~feeding & ~feed_go & (out_groups == groups_r)
                                 & (sent_groups == groups_r))

        # -- the tile's activations (this cluster's copy, written by the engine) ----------------
        act = memory.Memory(shape=unsigned(8 * simd), depth=T * steps_max, init=[])
        blkp = memory.Memory(shape=self._blk_layout, depth=T * kb_max, init=[])
        m.submodules.act_mem, m.submodules.blk_mem = act, blkp
        act_w, blk_w = act.write_port(), blkp.write_port()
        m.d.comb += [act_w.en.eq(act_in.en), act_w.addr.eq(act_in.addr),
                     act_w.data.eq(act_in.data), blk_w.en.eq(blk_in.en),
                     blk_w.addr.eq(blk_in.addr), blk_w.data.eq(blk_in.data)]

        # -- weight steps into the MAC array, the tile's rows taking turns ----------------------
        # (every compare of a counter with its end is a register, set when the counter moves)
        act_r = act.read_port()
        c = Signal(log_steps + 1)           # step of the row
        cb = Signal(range(mb // simd + 1))  # step within the block
        r = Signal(range(T))
        # (the long counters count down to their compare: no subtract before an equality)
        c_left = Signal(CW)                 # steps_r - 1 - c
        g_left = Signal(CW)                 # groups left after this one
        c_last, cb_last, r_last, g_last = Signal(), Signal(), Signal(), Signal()
        bpb = inputs["bpb"]                 # steps per block
        # two stages: s1 holds the step while the activation memory reads its word; s2 adds
        # that word (a register after the block RAM's slow unregistered output)
        s1_valid, s2_valid = Signal(), Signal()
        s1, s2 = Signal(mac.i.payload.shape()), Signal(mac.i.payload.shape())
        advance2 = ~s2_valid | mac.i.ready
        advance = ~s1_valid | advance2
        issue = Signal()
        m.d.comb += issue.eq(feeding & self.w.valid & advance)
        # 2-bit: each nibble two steps, low bits first (the odd steps take the high bits):
        # c[0] and `two` again in kept registers per 8 nibbles, beside their multiplexers
        # (`two` holds still while the tile's groups run)
        c0_after = Mux(feed_go, 0, Mux(issue & r_last, ~c_last & ~c[0], c[0]))
        nib = Signal(4 * pe * simd)
        for i0 in range(0, pe * simd, 8):
            odd = local_copy(m, c0_after, f"odd_step{i0 // 8}")
            two_here = local_copy(m, two, f"two_step{i0 // 8}")
            for i in range(i0, min(pe * simd, i0 + 8)):
                code = self.w.payload[4 * i:4 * i + 4]
                m.d.comb += nib[4 * i:4 * i + 4].eq(Mux(two_here, code.word_select(odd, 2),
                                                        code))
        word_done = r_last & (~two | c[0] | c_last)
        m.d.comb += [self.w.ready.eq(issue & word_done),
                     act_r.addr.eq((r << log_steps) | c[:log_steps]), act_r.en.eq(advance),
                     mac.i.payload.eq(s2), mac.i.valid.eq(s2_valid)]
        with m.If(advance2):
            m.d.sync += [s2_valid.eq(s1_valid), s2.eq(s1), s2.qa.eq(act_r.data)]
        with m.If(advance):
            m.d.sync += [s1_valid.eq(issue), s1.w.eq(nib), s1.row.eq(r),
                         s1.first.eq(cb == 0), s1.last.eq(cb_last)]
        with m.If(issue):
            with m.If(r_last):
                m.d.sync += [r.eq(0), r_last.eq(rows_r == 1),
                             cb.eq(Mux(cb_last, 0, cb + 1)),
                             cb_last.eq(Mux(cb_last, bpb == 1, cb == bpb - 2))]
                with m.If(c_last):
                    m.d.sync += [c.eq(0), c_left.eq(steps_r - 1), c_last.eq(steps_r == 1),
                                 g_left.eq(g_left - 1), g_last.eq(g_left == 1)]
                    with m.If(g_last):
                        m.d.sync += feeding.eq(0)
                with m.Else():
                    m.d.sync += [c.eq(c + 1), c_left.eq(c_left - 1), c_last.eq(c_left == 1)]
            with m.Else():
                m.d.sync += [r.eq(r + 1), r_last.eq(r == rows_r - 2)]
        with m.If(feed_go):
            m.d.sync += [feeding.eq(1), c.eq(0), cb.eq(0), r.eq(0), c_left.eq(steps_r - 1),
                         g_left.eq(groups_r - 1),
                         c_last.eq(steps_r == 1), cb_last.eq(bpb == 1),
                         r_last.eq(rows_r == 1), g_last.eq(groups_r == 1)]

        # -- MAC results: held in a register with their block's activation scale and sum -------
        # (the MAC array's output FIFO is the buffer; a result leaves it once the lanes have
        # taken its J terms)
        # (every compare that the hand-off needs is a register, set when its counter moves)
        blk_r = blkp.read_port()
        m.submodules.admission = adm = LaneAdmission.for_lane(self._lanes[0], choices=2)
        head = self._sequencer(m, "head", adm, mac.o.valid, fzp)
        go, j, j_last, zt = head.go, head.j, head.j_last, head.zt
        head_valid, head_end, h_move = head.valid, head.end, head.move
        # (J = 1: the head's block sums; J > 1: each lane holds its own, in shift chains)
        head_isum = Signal.like(mac.o.payload.isum) if J == 1 else None
        head_row = Signal.like(mac.o.payload.row)
        head_first, head_last = Signal(), Signal()
        need_s, need_b = Signal(), Signal()        # the head's row 0: s beats; and bias beats
        ob = Signal(log_kb + 1)                    # block of the next result
        orow = Signal(range(T))                    # its row
        ob_last, orow_last = Signal(), Signal()    # ob == kb_r - 1, orow == rows_r - 1
        ob_left = Signal(CW)                       # kb_r - 1 - ob
        ob_zero, orow_zero = Signal(init=1), Signal(init=1)     # ob == 0, orow == 0
        # (with float zero points a result's terms come twice: its J weight terms, then (zt)
        # its J zero-point terms, d = asum with the s beats' scales z)
        accept = mac.o.valid & h_move
        # the next result's accumulator row (its row of A) and whether its terms open or close
        # the accumulators: in fmode its digit rows share one, opened by digit 0, closed by 3
        # (registers, set as the counters move: they head the admission's candidates)
        if float_path:
            o_arow = Signal.like(orow, name="o_arow")
            o_first, o_last = Signal(init=1, name="o_first"), Signal(name="o_last")

            def next_result(row, ob_zero_after, ob_last_after):
                m.d.sync += [o_arow.eq(Mux(fmode, row >> 2, row)),
                             o_first.eq(ob_zero_after & (~fmode | (row[:2] == 0))),
                             o_last.eq(ob_last_after & (~fmode | (row[:2] == 3)))]
        else:
            o_arow, o_first, o_last = orow, ob_zero, ob_last

            def next_result(row, ob_zero_after, ob_last_after):
                pass
        o_need_s = orow_zero                       # its terms take s beats; and bias beats
        o_need_b = bias_r & ob_zero & o_need_s
        m.d.comb += [mac.o.ready.eq(h_move), blk_r.addr.eq((orow << log_kb) | ob[:log_kb])]
        if J > 1:
            # a result's terms take J cycles, so two results are never taken in a row: the
            # next one's entry is read ahead (its counters hold still) and registered with it
            # (the block RAM's slow output goes no further)
            head_blk = Signal(self._blk_layout, reset_less=True)
            m.d.comb += blk_r.en.eq(1)
            with m.If(h_move):
                m.d.sync += head_blk.eq(blk_r.data)
        else:
            m.d.comb += blk_r.en.eq(h_move)
            head_blk = data.View(self._blk_layout, blk_r.data)
        with m.If(h_move):
            # (the result's row and block from the hand-off's counters, which follow the MAC
            # array's order, rather than from its block RAM FIFO's slow output)
            if J == 1:
                m.d.sync += head_isum.eq(mac.o.payload.isum)
            m.d.sync += [head_row.eq(o_arow), head_first.eq(o_first),
                         head_last.eq(o_last), need_s.eq(o_need_s), need_b.eq(o_need_b)]
        # a group's last result taken: counted a cycle later (only the tile's end waits on
        # out_groups, and its read-out comes later still)
        group_done = Signal()
        m.d.sync += group_done.eq(accept & orow_last & ob_last)
        with m.If(group_done):
            m.d.sync += out_groups.eq(out_groups + 1)
        with m.If(accept):
            with m.If(orow_last):
                ob_last_after = Mux(ob_last, kb_r == 1, ob_left == 1)
                m.d.sync += [orow.eq(0), orow_last.eq(rows_r == 1), orow_zero.eq(1),
                             ob.eq(Mux(ob_last, 0, ob + 1)), ob_zero.eq(ob_last),
                             ob_left.eq(Mux(ob_last, kb_r - 1, ob_left - 1)),
                             ob_last.eq(ob_last_after)]
                next_result(Const(0, len(orow)), ob_last, ob_last_after)
            with m.Else():
                m.d.sync += [orow.eq(orow + 1), orow_last.eq(orow == rows_r - 2),
                             orow_zero.eq(0)]
                next_result(orow + 1, ob_zero, ob_last)
        with m.If(load_go):
            m.d.sync += [ob.eq(0), orow.eq(0), out_groups.eq(0), read_left.eq(groups_r - 1),
                         ob_left.eq(kb_r - 1),
                         sent_groups.eq(0), ob_zero.eq(1), orow_zero.eq(1),
                         ob_last.eq(kb_r == 1), orow_last.eq(rows_r == 1)]
            next_result(Const(0, len(orow)), Const(1, 1), kb_r == 1)

        # -- the lanes: each MAC result as J terms per lane, in lock step -----------------------
        # A term goes when it can (its scale and bias beats are there) and the admission
        # allows it: a register, decided a cycle ahead for the term offered next.
        def term_addr(row, jj):
            jj = Const(jj, len(j)) if isinstance(jj, int) else jj[:len(j)]
            return Cat(jj, row) if J & (J - 1) == 0 else row * J + jj
        # the scale and bias beats wait in a register each, so whether the term offered next
        # has its beats is known a cycle ahead: part of the admission's candidates, whose
        # registered verdict is `go` itself (no stream's valid on the hand-off's enables)
        s_buf = Signal.like(self.s.payload, reset_less=True)
        b_buf = Signal.like(self.b.payload, reset_less=True)
        s_full, b_full = Signal(), Signal()
        need_bt = need_b & ~zt                     # this term takes a bias beat
        for port, buf, full, need in ((self.s, s_buf, s_full, need_s),
                                      (self.b, b_buf, b_full, need_bt)):
            pop = go & need
            m.d.comb += port.ready.eq(~full | pop)
            with m.If(port.valid & port.ready):
                m.d.sync += buf.eq(port.payload)
            m.d.sync += full.eq((port.valid & port.ready) | (full & ~pop))
        # a beat there next cycle: if no term goes now (stay), or if this one goes (advance)
        s_stay, b_stay = s_full | self.s.valid, b_full | self.b.valid
        s_adv = Mux(need_s, self.s.valid, s_stay)
        b_adv = Mux(need_bt, self.b.valid, b_stay)
        terms = data.ArrayLayout(self._lanes[0].i.payload.shape(), F)
        term_in = Signal(terms)
        # the terms registered beside the hand-off: the lanes' inputs come from registers
        # (their J-way multiplexers and the lanes are far apart on the chip); each lane's
        # kept apart (the lanes share fields such as the activation scale, which Yosys would
        # otherwise merge into one register and one first multiplier stage for both lanes)
        term_r = [local_copy(m, term_in[f], f"term_r{f}") for f in range(F)]
        # the term offered next: if none goes now, this one (or, with no head, the next
        # result's first); if this one goes, the head's next term or the next result's first
        # (its row from the hand-off's own counter, not from the MAC array's block RAM FIFO)
        # (and only with its scale and bias beats there: `s_*` / `b_*` of its case)

        def beats(n_s, n_b, s_there, b_there):
            return (~n_s | s_there) & (~n_b | b_there)

        def flags(z):
            """A head term's (first, last) in phase ``z``."""
            return head_first & ~z, head_last & (z | ~fzp)

        first_of_next = [(mac.o.valid & beats(o_need_s, o_need_b, s_av, b_av),
                          term_addr(o_arow, 0), o_first, o_last & ~fzp)
                         for s_av, b_av in ((s_stay, b_stay), (s_adv, b_adv))]
        this_term = (beats(need_s, need_bt, s_stay, b_stay), term_addr(head_row, j),
                     *flags(zt))
        zt_next = zt | j_last                      # (the next term of the same head)
        j_next = head.j_next
        next_term = (beats(need_s, need_b & ~zt_next, s_adv, b_adv),
                     term_addr(head_row, j_next), *flags(zt_next))
        # (each candidate checked in parallel, the verdict picked in each sequencer)
        for cands, pick, sel, a, b in (
                (adm.stay, adm.stay_pick, head_valid, this_term, first_of_next[0]),
                (adm.advance, adm.advance_pick, head_end, first_of_next[1], next_term)):
            for cand, values in zip(cands, (a, b), strict=True):
                m.d.comb += [field.eq(x) for field, x in zip(
                    (cand.valid, cand.addr, cand.first, cand.last), values, strict=True)]
            m.d.comb += pick.eq(~sel)
        t_last = flags(zt)[1]
        m.d.comb += [adm.take.eq(go), adm.beat.addr.eq(term_addr(head_row, j)),
                     adm.beat.last.eq(t_last)]
        replay_layout = data.StructLayout({"scale": unsigned(32), "zp": unsigned(8),
                                           "bias": unsigned(32)})
        for f, lane in enumerate(self._lanes):
            # the hand-off's sequencer and head fields again beside this lane (kept
            # registers, the same values): the lanes lie apart, each with its replay memory
            # and operand fields to drive
            seq = self._sequencer(m, f"lane{f}", adm, mac.o.valid, fzp)
            go_f, j_f, zt_f = seq.go, seq.j, seq.zt
            here = {key: Signal(name=f"{key}_lane{f}", attrs={KEEP_ATTR: 1})
                    for key in ("need_s", "need_b", "first", "last")}
            with m.If(seq.move):
                m.d.sync += [here["need_s"].eq(o_need_s), here["need_b"].eq(o_need_b),
                             here["first"].eq(o_first), here["last"].eq(o_last)]
            need_s_f = here["need_s"]
            need_bt_f = here["need_b"] & ~zt_f
            first_f = here["first"] & ~zt_f
            last_f = here["last"] & (zt_f | ~fzp)
            term_v = Signal(name=f"term_v{f}")          # (term_r[f] holds a term)
            m.d.sync += term_v.eq(go_f)
            # (a term's s beat kept for the tile's other rows; 2 J entries with fzp)
            rep = memory.Memory(shape=replay_layout, depth=2 * J if float_path else J,
                                init=[])
            m.submodules[f"replay{f}"] = rep
            rw, rr = rep.write_port(), rep.read_port(domain="comb")
            cur = Signal(replay_layout, name=f"params{f}")
            slot = Mux(zt_f, j_f + J, j_f) if float_path else j_f
            m.d.comb += [rr.addr.eq(slot), rw.addr.eq(slot), rw.en.eq(go_f & need_s_f),
                         cur.eq(rr.data)]
            with m.If(need_s_f):
                m.d.comb += [cur.scale.eq(s_buf[f].scale), cur.zp.eq(s_buf[f].zp)]
                with m.If(need_bt_f):
                    m.d.comb += cur.bias.eq(b_buf[f])
                with m.Elif(~here["first"]):
                    m.d.comb += cur.bias.eq(rr.data.bias)
            m.d.comb += rw.data.eq(cur)
            # the term's block sums: MAC column lane_column(...), or at 5..8 bits the two
            # MAC columns of its output column (wide_columns)
            # (`wide` holds still while the tile works: a kept copy beside each lane)
            wide_f = local_copy(m, wide, f"wide_lane{f}")
            if J == 1:
                isum, isum_hi = _pick_isum(pe, F, f, head_isum, wide_f)
            else:
                even, odd = self._chains(m, f, wide_f, seq, adm, fzp)
                isum = Mux(j_f[0] & ~wide_f, odd, even)
                isum_hi = Mux(wide_f, odd, 0)
            if float_path:                     # a zero-point term: d = asum (zp 0)
                isum, isum_hi = Mux(zt_f, head_blk.asum, isum), Mux(zt_f, 0, isum_hi)
            li = term_in[f]
            m.d.comb += [li.isum.eq(isum), li.isum_hi.eq(isum_hi),
                         li.asum.eq(head_blk.asum), li.sa.eq(head_blk.sa),
                         li.sb.eq(cur.scale), li.zp.eq(cur.zp),
                         li.bias.eq(Mux(bias_r, cur.bias, 0)),
                         li.first.eq(first_f), li.last.eq(last_f),
                         li.addr.eq(term_addr(head_row, j_f)),
                         lane.i.payload.eq(term_r[f]), lane.i.valid.eq(term_v)]

        # -- lane outputs into two banks; the y path reads a full bank row by row ---------------
        depth = 1 << _log2(T * J)
        banks = []
        for f in range(F):
            mem = memory.Memory(shape=unsigned(32), depth=2 * depth, init=[])
            m.submodules[f"out{f}"] = mem
            banks.append((mem.write_port(), mem.read_port()))         # block RAM
        full = Signal(2)
        wb = Signal()
        rb = Signal()
        wcount = Signal(range(T * J + 1))
        out_valid = self._lanes[0].o.valid
        out_take = out_valid & ~full.bit_select(wb, 1)
        m.d.comb += adm.release.eq(out_take)
        for f, lane in enumerate(self._lanes):
            wp = banks[f][0]
            m.d.comb += [lane.o.ready.eq(~full.bit_select(wb, 1)), wp.en.eq(out_take),
                         wp.addr.eq((wb << _log2(depth)) | lane.o.payload.addr),
                         wp.data.eq(lane.o.payload.y)]
        with m.If(out_take):
            with m.If(wcount == out_rows * J - 1):
                m.d.sync += [wcount.eq(0), wb.eq(~wb)]
                m.d.sync += full.bit_select(wb, 1).eq(1)
            with m.Else():
                m.d.sync += wcount.eq(wcount + 1)

        rr_row = Signal(range(T))
        rr_f = Signal(range(F))
        rr_j = Signal(range(J))
        reserved = Signal(range(_Y_FIFO + 1))
        take = Signal()
        m.d.comb += take.eq(full.bit_select(rb, 1) & (reserved < _Y_FIFO))
        # each bank's read word registered beside it (the block RAM's slow output goes no
        # further), then the lane's chosen
        word = Signal(32)                   # the bank word taken three cycles before
        bank_q = [Signal(32, name=f"bank_q{f}", reset_less=True) for f in range(F)]
        m.d.sync += [q.eq(bank[1].data) for q, bank in zip(bank_q, banks, strict=True)]
        with m.Switch(delay(m, rr_f, 2, "rr_f")):
            for f in range(F):
                with m.Case(f):
                    m.d.sync += word.eq(bank_q[f])
        for f in range(F):
            m.d.comb += banks[f][1].addr.eq((rb << _log2(depth)) | (rr_row * J + rr_j))
        # output columns in order: lane by lane, each its run of terms (lane_column)
        wide_rd = local_copy(m, wide, "wide_readout")       # (a copy beside the read-out)
        j_end = Mux(wide_rd, J // 2 - 1, J - 1) if J > 1 else 0
        col_last = (rr_j == j_end) & (rr_f == Mux(wide_rd, F // 2 - 1, F - 1) if J == 1 else
                                      rr_f == F - 1)
        bank_last = col_last & (rr_row == out_rows - 1)
        job_last = bank_last & last_tile & (read_left == 0)
        with m.If(take):
            with m.If(col_last):
                m.d.sync += [rr_f.eq(0), rr_j.eq(0)]
                with m.If(rr_row == out_rows - 1):
                    m.d.sync += [rr_row.eq(0), rb.eq(~rb), read_left.eq(read_left - 1)]
                    m.d.sync += full.bit_select(rb, 1).eq(0)
                with m.Else():
                    m.d.sync += rr_row.eq(rr_row + 1)
            with m.Elif(rr_j == j_end):
                m.d.sync += [rr_j.eq(0), rr_f.eq(rr_f + 1)]
            with m.Else():
                m.d.sync += rr_j.eq(rr_j + 1)

        # -- output: rounding to A's type, then a FIFO reserved by a credit ---------------------
        assert _Y_FIFO > self.out_latency         # a word a cycle with y ready
        m.submodules.y_fifo = y_fifo = fifo.SyncFIFOBuffered(width=34, depth=_Y_FIFO)
        m.submodules.out_round = rnd = Fp32Narrow()
        lat = rnd.latency
        m.d.comb += [rnd.a.eq(word), rnd.fmt.eq(out_fmt_r == OUT_FORMATS.index("bfloat16")),
                     y_fifo.w_data.eq(Mux(out_fmt_r == 0, delay(m, word, lat, "y"), rnd.y)),
                     y_fifo.w_data[32].eq(delay(m, job_last, _BANK_READ_LATENCY + lat,
                                                "y_last")),
                     y_fifo.w_data[33].eq(delay(m, bank_last, _BANK_READ_LATENCY + lat,
                                                "y_group_last"))]
        taken = take
        for i in range(_BANK_READ_LATENCY + lat):
            reg = Signal(name=f"y_taken_d{i + 1}")
            m.d.sync += reg.eq(taken)
            taken = reg
        m.d.comb += y_fifo.w_en.eq(taken)
        send = self.y.valid & self.y.ready
        m.d.comb += [self.y.payload.y.eq(y_fifo.r_data[:32]),
                     self.y.payload.last.eq(y_fifo.r_data[32]),
                     self.y.valid.eq(y_fifo.r_rdy), y_fifo.r_en.eq(self.y.ready)]
        with m.If(send & y_fifo.r_data[33]):
            m.d.sync += sent_groups.eq(sent_groups + 1)
        m.d.sync += reserved.eq(reserved + take - send)
        return m
