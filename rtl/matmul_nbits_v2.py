"""The MatMulNBits engine v2 (docs/matmul_nbits_v2.md): integer block sums on packed MACs, a few
shared float lanes, activations quantised once per row into on-chip memory, row tiles that
share each weight fetch. Bit-exact with :func:`qaccel.model.nbits_hw.matmul_nbits_v2`."""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.config import AccelConfig
from qaccel.model.validate import check_bool
from qaccel.rtl.fp32_narrow import LATENCY as _OUT_ROUND_LATENCY
from qaccel.rtl.fp32_narrow import Fp32Narrow
from qaccel.rtl.lane_admission import LaneAdmission
from qaccel.rtl.packed_mac_array import PackedMacArray
from qaccel.rtl.pipeline import delay
from qaccel.rtl.row_quantizer import RowQuantizer
from qaccel.rtl.scale_lane import ScaleLane

__all__ = ["COUNT_WIDTH", "OUT_FORMATS", "REGISTERS", "MatMulNBitsV2", "lane_column",
           "wide_columns"]

#: ``out_fmt`` values: the type ``y`` is rounded to (A's type), by index.
OUT_FORMATS = ("float32", "float16", "bfloat16")
#: The job registers (input ports), latched at ``start``.
REGISTERS = ("k", "block_size", "bits", "m", "groups", "bias", "out_fmt", "fmode")
#: Width of the ``k``, ``m`` and ``groups`` registers.
COUNT_WIDTH = 22
_Y_FIFO = 16           # y beats reserved past the rounding (more than its latency)
_TERM_REG = 1           # the terms' register between the hand-off and the lanes
_BANK_READ_LATENCY = 2  # the output banks' registered read, then the lane choice registered


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
    ``J = 1``)."""
    J = pe // lanes
    if not wide:
        return f * J + j
    if J == 1:
        return f if f < pe // 2 else None
    return f * (J // 2) + j if j < J // 2 else None


class MatMulNBitsV2(wiring.Component):
    """MatMulNBits ``Y = A W^T + bias`` at accuracy_level 4 (int8 activations, integer or no
    zero points): ``pe * simd`` MACs per cycle for 2..4-bit weights, half that for 5..8 bits.

    A job is one operator call of ``m`` rows and ``groups`` column groups. Column groups are
    ``pe`` columns for 2..4-bit weights and ``pe / 2`` for 5..8 bits (``cols`` below). The
    engine walks row tiles of up to ``m_tile`` rows; per tile it quantises the rows once into
    its activation memory, then runs every column group over them, the tile's rows taking
    turns on each weight step. Streams, in the order the host sends them (all per tile, then
    per group):

    ``a``
        The tile's rows, ``k`` float32 elements each, one per beat.
    ``w``
        Per group, ``ceil(k_blocks * block_size / simd)`` weight steps (2-bit weights: two
        steps per word, the first in the low half). A step is the :class:`PackedMacArray`'s
        nibble array ``w[p][j]`` (bit ``4 * (p * simd + j)``): 3..4-bit codes one per nibble
        (2-bit codes two bits each, zero-extended on chip); 5..8-bit codes as column ``c``'s
        low nibble in ``w[lo]`` and high nibble in ``w[hi]``, ``(lo, hi) =``
        :func:`wide_columns` ``(pe, F)[c]`` (the lane that serves column ``c`` adds
        ``16 *`` the high nibbles' sum). Columns past N carry 0.
    ``b``
        With ``bias``, per group ``J = pe / F`` beats, beat ``j`` holding the biases of columns
        :func:`lane_column` ``(pe, F, f, j, wide)`` for lane ``f`` (float32; 0 where None).
    ``s``
        Per group and block, ``J`` beats, beat ``j`` holding lane ``f``'s column
        :func:`lane_column` ``(pe, F, f, j, wide)``:
        ``scale`` (float32) and ``zp`` (the integer zero point, ``2 ** (bits - 1)`` when the
        operator has none). With float zero points (``fmode = 3``) ``2 J`` beats: the ``J``
        above with ``zp = 0``, then ``J`` more in the same order whose ``scale`` is the
        column's ``z = f32(-scale * zero_point)`` (``zp = 0``).
    ``y``
        Per tile and group, the tile's rows in order, each ``cols`` results (float32, or
        float16 / bfloat16 by ``out_fmt`` in the low 16 bits), ``last`` on the job's last.

    ``ecp5=True`` builds the units' ECP5 primitives (registered MULT18X18D, DP16KD) for
    synthesis; simulation needs the default, which describes the same cycles behaviourally.

    Registers (latched at ``start`` while ``busy`` is low): ``k`` (1 .. ``max_k``),
    ``block_size`` (a power of two, 16 .. ``max_block_size``), ``bits`` (2 .. 8), ``m``,
    ``groups``, ``bias``, ``out_fmt``, ``fmode``. ``busy`` is high from the cycle after
    ``start`` until the last ``y`` beat is transferred.

    ``fmode`` (with ``config.float_path``, which needs ``m_tile`` a multiple of 4; ignored
    otherwise): bit 0 the float path of docs/matmul_nbits_v2.md, section 2; bit 1 (with bit
    0) its float zero points, two terms per digit and column (the weights' ``d = sum x q``,
    then the zero point's ``d = asum`` with the scale ``z``), at half the lanes' rate. A
    tile then holds ``m_tile / 4`` rows of A; the row quantiser writes each row in block
    floating point as four int8 digit rows (digit ``i`` with its scale ``sa_i`` and sum),
    which the MAC array takes as rows; the four digit rows of a row add into one
    accumulator per column, digit 0 opening it (with the bias) and digit 3 closing it. The
    streams are as above with ``k`` the layout's length (g_idx: the host's padded
    group-by-group layout) and ``s`` carrying each block's scale and zero point.

    Throughput: one MAC step (``pe * simd`` MACs for 2..4-bit weights) per cycle while ``w``
    keeps up (``y`` taking a word a cycle keeps the read-out unthrottled: its FIFO's credit
    covers the output latency); ``F`` float lanes take ``F`` block terms per cycle, which a
    block of 16 needs when ``F = pe * simd / 16``. Per tile, the rows are loaded (one ``a``
    element per cycle) before the groups run and the tile's last outputs are read out before
    the next tile loads. :func:`qaccel.model.perf.nbits_v2_call` gives a call's cycles.
    """

    def __init__(self, config: AccelConfig | None = None, *, ecp5: bool = False):
        config = AccelConfig() if config is None else config
        check_bool("ecp5", ecp5)
        if not isinstance(config, AccelConfig):
            raise TypeError(f"config must be an AccelConfig, not {config!r}")
        if config.pe % 2:
            raise ValueError(f"pe must be even for the v2 engine (two columns share a "
                             f"multiplier), not {config.pe}")
        if config.float_path and config.m_tile % 4:
            raise ValueError(f"m_tile must be a multiple of 4 for the v2 engine's float path "
                             f"(four digit rows per row of A), not {config.m_tile}")
        self._config = config
        pe, simd = config.pe, config.simd
        self._lanes_n = F = config.scale_lanes
        self._J = pe // F
        if self._J > 1 and self._J % 2:
            raise ValueError(f"pe / scale_lanes (MAC columns per float lane) must be 1 or "
                             f"even for the v2 engine (5..8-bit columns pair two of a lane's "
                             f"MAC columns), not {pe} / {F}")
        self._mac = PackedMacArray(pe=pe, simd=simd, rows=config.m_tile,
                                   max_block=config.max_block_size,
                                   dsp_pairs=config.dsp_pairs, ecp5=ecp5)
        self._rq = RowQuantizer(max_block=config.max_block_size, ecp5=ecp5,
                                bfp=config.float_path)
        asum_width = self._rq.asum_width
        self._lanes = [ScaleLane(depth=config.m_tile * self._J,
                                 isum_width=self._mac.acc_width, asum_width=asum_width,
                                 ecp5=ecp5)
                       for _ in range(F)]
        super().__init__({
            "k": In(unsigned(COUNT_WIDTH)),
            "block_size": In(unsigned(16)),
            "bits": In(unsigned(4)),
            "m": In(unsigned(COUNT_WIDTH)),
            "groups": In(unsigned(COUNT_WIDTH)),
            "bias": In(1),
            "out_fmt": In(unsigned(2)),
            "fmode": In(unsigned(2)),
            "start": In(1),
            "busy": Out(1),
            "a": In(stream.Signature(unsigned(32))),
            "w": In(stream.Signature(unsigned(4 * pe * simd))),
            "b": In(stream.Signature(data.ArrayLayout(unsigned(32), F))),
            "s": In(stream.Signature(data.ArrayLayout(
                data.StructLayout({"scale": unsigned(32), "zp": unsigned(8)}), F))),
            "y": Out(stream.Signature(data.StructLayout({"y": unsigned(32),
                                                         "last": unsigned(1)}))),
        })

    @property
    def config(self) -> AccelConfig:
        return self._config

    @property
    def timing(self) -> dict[str, int]:
        """The cycle counts :func:`qaccel.model.perf.nbits_v2_call` composes, each measured
        in the engine's own pipeline or taken from its units:

        ``start``: ``start`` to the first tile's row-quantiser start (the sizing states);
        ``issue``: the quantiser's ``busy`` low to the first weight step; ``to_lane``: a
        step's issue to its MAC beat (the activation word read and registered), plus the
        block sums' register (where the block's activation scale and sum join them), without
        the MAC latency; ``lane``: a term's hand-off to its result offered (the terms'
        register, then the lane's latency); ``bank``: a lane result to its bank being
        readable;
        ``out``: a bank word taken to its ``y`` beat (the bank's registered read, the
        float16 / bfloat16 rounding of :class:`~qaccel.rtl.fp32_narrow.Fp32Narrow` and the
        ``y`` FIFO);
        ``next_tile``: a tile's last bank word taken to the next tile's quantiser start;
        ``done``: the last ``y`` beat to ``busy`` low; and the units' ``mac`` and
        ``recurrence`` and the row quantiser's ``quantizer`` latency."""
        return {"start": 3, "issue": 2, "to_lane": 3, "bank": 1,
                "out": _BANK_READ_LATENCY + _OUT_ROUND_LATENCY + 2,
                "next_tile": 4,
                "done": 1, "mac": self._mac.latency,
                "lane": _TERM_REG + self._lanes[0].latency,
                "recurrence": self._lanes[0].recurrence, "quantizer": self._rq.latency}

    @property
    def row_quantizer(self) -> RowQuantizer:
        """The activation quantiser (its :meth:`~RowQuantizer.job_cycles` times a tile's
        load)."""
        return self._rq

    @property
    def lanes(self) -> int:
        """Float lanes ``F``; lane ``f`` serves the MAC columns ``f * J .. f * J + J - 1``
        (:func:`lane_column`)."""
        return self._lanes_n

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        pe, simd, T, mb = cfg.pe, cfg.simd, cfg.m_tile, cfg.max_block_size
        F, J = self._lanes_n, self._J
        CW = COUNT_WIDTH
        steps_max = cfg.max_k // simd
        kb_max = cfg.max_k // 16
        log_steps, log_kb = _log2(steps_max), _log2(kb_max)
        log_simd = _log2(simd)
        m.submodules.rq = rq = self._rq
        m.submodules.mac = mac = self._mac
        for f, lane in enumerate(self._lanes):
            m.submodules[f"lane{f}"] = lane

        # -- job registers ----------------------------------------------------------------------
        k_r = Signal(CW)
        bs_r = Signal(range(mb + 1))
        log_bs = Signal(range(_log2(mb) + 1))
        bits_r = Signal(4)
        m_r = Signal(CW)
        groups_r = Signal(CW)
        bias_r = Signal()
        out_fmt_r = Signal(2)
        kb_r = Signal(CW)                   # blocks per row
        steps_r = Signal(CW)                # weight steps per row (padded to whole blocks)
        wide = Signal()
        two = Signal()                      # 2-bit weights: two steps per word
        rows_r = Signal(range(T + 1))       # rows of the current tile (digit rows in fmode)
        out_rows = Signal(range(T + 1))     # its rows of A and y (rows_r / 4 in fmode)
        row0 = Signal(CW)                   # first row of the current tile
        last_tile = Signal()
        # the float path (block floating point: four int8 digit rows per row of A), with
        # ``config.float_path`` only
        fmode = Signal() if cfg.float_path else Const(0, 1)
        fzp = Signal() if cfg.float_path else Const(0, 1)     # and float zero points
        out_groups = Signal(CW)             # groups whose MAC results are all attached
        read_groups = Signal(CW)            # groups whose outputs are all read out

        with m.Switch(bs_r):
            for e in range(4, _log2(mb) + 1):
                with m.Case(1 << e):
                    m.d.comb += log_bs.eq(e)
        m.d.comb += [wide.eq(bits_r > 4), two.eq(bits_r == 2)]
        load_go = Signal()
        feed_go = Signal()
        feeding = Signal()
        with m.FSM() as fsm:
            with m.State("IDLE"):
                with m.If(self.start & (self.k != 0) & (self.m != 0) & (self.groups != 0)):
                    m.d.sync += [k_r.eq(self.k), bs_r.eq(self.block_size),
                                 bits_r.eq(self.bits), m_r.eq(self.m),
                                 groups_r.eq(self.groups), bias_r.eq(self.bias),
                                 out_fmt_r.eq(self.out_fmt), row0.eq(0)]
                    if cfg.float_path:
                        m.d.sync += [fmode.eq(self.fmode[0]),
                                     fzp.eq(self.fmode[0] & self.fmode[1])]
                    m.next = "SIZE"
            with m.State("SIZE"):
                kb = (k_r + bs_r - 1) >> log_bs
                m.d.sync += [kb_r.eq(kb), steps_r.eq((kb << log_bs) >> log_simd)]
                m.next = "TILE"
            with m.State("TILE"):
                left = m_r - row0
                Ta = Mux(fmode, T // 4, T) if cfg.float_path else T   # rows of A per tile
                act_rows = Mux(left <= Ta, left, Ta)
                m.d.sync += [rows_r.eq(Mux(fmode, act_rows << 2, act_rows)),
                             out_rows.eq(act_rows), last_tile.eq(left <= Ta)]
                m.next = "LOAD_START"
            with m.State("LOAD_START"):
                m.d.comb += load_go.eq(1)
                m.next = "LOAD"
            with m.State("LOAD"):
                with m.If(~rq.busy & ~load_go):
                    m.next = "COMPUTE_START"
            with m.State("COMPUTE_START"):
                m.d.comb += feed_go.eq(1)
                m.next = "COMPUTE"
            with m.State("COMPUTE"):
                with m.If(~feeding & ~feed_go & (out_groups == groups_r)
                          & (read_groups == groups_r)):
                    m.d.sync += row0.eq(row0 + out_rows)
                    m.next = "NEXT"
            with m.State("NEXT"):
                with m.If(row0 < m_r):
                    m.next = "TILE"
                with m.Else():
                    m.next = "DRAIN"
            with m.State("DRAIN"):
                with m.If(self.y.valid & self.y.ready & self.y.payload.last):
                    m.next = "IDLE"
        m.d.comb += self.busy.eq(~fsm.ongoing("IDLE"))

        # -- activations: the row quantiser into the activation and block memories -------------
        act = memory.Memory(shape=unsigned(8 * simd), depth=T * steps_max, init=[])
        blkp = memory.Memory(shape=rq.blk.payload.shape(), depth=T * kb_max, init=[])
        m.submodules.act_mem, m.submodules.blk_mem = act, blkp
        act_w, blk_w = act.write_port(), blkp.write_port()
        m.d.comb += [rq.k.eq(k_r), rq.block_size.eq(bs_r), rq.rows.eq(out_rows),
                     rq.start.eq(load_go),
                     *([rq.fmode.eq(fmode)] if cfg.float_path else []),
                     rq.a.payload.eq(self.a.payload), rq.a.valid.eq(self.a.valid),
                     self.a.ready.eq(rq.a.ready)]
        pack = Signal(8 * simd)
        lane_i = Signal(range(simd))
        lrow = Signal(range(T + 1))
        lstep = Signal(log_steps + 1)
        lbase = Signal(log_steps + 1)       # the block's first step (fmode: digit rows rewind)
        qp = rq.q.payload
        digit = qp.digit if cfg.float_path else Const(0, 2)

        def act_row(row, dig):
            """Memory row of row ``row`` of A (and its digit ``dig`` in fmode)."""
            return Mux(fmode, Cat(dig, row), row) if cfg.float_path else row
        m.d.comb += rq.q.ready.eq(1)
        with m.If(rq.q.valid):
            qa8 = qp.qa.as_unsigned()
            word = (pack >> 8) | (qa8 << (8 * simd - 8)) if simd > 1 else qa8
            m.d.sync += pack.eq(word)
            m.d.sync += lane_i.eq(Mux(lane_i == simd - 1, 0, lane_i + 1))
            with m.If(lane_i == simd - 1):
                m.d.comb += [act_w.en.eq(1), act_w.data.eq(word),
                             act_w.addr.eq((act_row(lrow, digit) << log_steps) | lstep)]
                with m.If(qp.row_last):
                    m.d.sync += [lrow.eq(lrow + 1), lstep.eq(0), lbase.eq(0)]
                with m.Elif(qp.block_last & fmode & (digit != 3)):
                    m.d.sync += lstep.eq(lbase)
                with m.Else():
                    m.d.sync += lstep.eq(lstep + 1)
                    with m.If(qp.block_last):
                        m.d.sync += lbase.eq(lstep + 1)
        brow = Signal(range(T + 1))
        bblk = Signal(log_kb + 1)
        bdig = Signal(2)                    # fmode: the digit of the next blk beat
        m.d.comb += rq.blk.ready.eq(1)
        with m.If(rq.blk.valid):
            m.d.comb += [blk_w.en.eq(1), blk_w.data.eq(rq.blk.payload),
                         blk_w.addr.eq((act_row(brow, bdig) << log_kb) | bblk)]
            if cfg.float_path:
                m.d.sync += bdig.eq(Mux(fmode, bdig + 1, 0))
            with m.If(~fmode | (bdig == 3)):           # the block's last (or only) beat
                with m.If(bblk == kb_r - 1):
                    m.d.sync += [bblk.eq(0), brow.eq(brow + 1)]
                with m.Else():
                    m.d.sync += bblk.eq(bblk + 1)
        with m.If(load_go):
            m.d.sync += [lane_i.eq(0), lrow.eq(0), lstep.eq(0), lbase.eq(0), brow.eq(0),
                         bblk.eq(0), bdig.eq(0)]

        # -- weight steps into the MAC array, the tile's rows taking turns ----------------------
        # (every compare of a counter with its end is a register, set when the counter moves)
        act_r = act.read_port()
        c = Signal(log_steps + 1)           # step of the row
        cb = Signal(range(mb // simd + 1))  # step within the block
        r = Signal(range(T))
        g = Signal(CW)
        c_last, cb_last, r_last, g_last = Signal(), Signal(), Signal(), Signal()
        bpb = bs_r >> log_simd              # steps per block
        # two stages: s1 holds the step while the activation memory reads its word; s2 adds
        # that word (a register after the block RAM's slow unregistered output)
        s1_valid, s2_valid = Signal(), Signal()
        s1, s2 = Signal(mac.i.payload.shape()), Signal(mac.i.payload.shape())
        advance2 = ~s2_valid | mac.i.ready
        advance = ~s1_valid | advance2
        issue = Signal()
        m.d.comb += issue.eq(feeding & self.w.valid & advance)
        half = Signal()
        m.d.comb += half.eq(two & c[0])
        nib = Signal(4 * pe * simd)
        with m.If(two):
            lo2 = Mux(half, self.w.payload[2 * pe * simd:], self.w.payload[:2 * pe * simd])
            for i in range(pe * simd):
                m.d.comb += nib[4 * i:4 * i + 4].eq(lo2[2 * i:2 * i + 2])
        with m.Else():
            m.d.comb += nib.eq(self.w.payload)
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
                    m.d.sync += [c.eq(0), c_last.eq(steps_r == 1),
                                 g.eq(g + 1), g_last.eq(g == groups_r - 2)]
                    with m.If(g_last):
                        m.d.sync += feeding.eq(0)
                with m.Else():
                    m.d.sync += [c.eq(c + 1), c_last.eq(c == steps_r - 2)]
            with m.Else():
                m.d.sync += [r.eq(r + 1), r_last.eq(r == rows_r - 2)]
        with m.If(feed_go):
            m.d.sync += [feeding.eq(1), c.eq(0), cb.eq(0), r.eq(0), g.eq(0),
                         c_last.eq(steps_r == 1), cb_last.eq(bpb == 1),
                         r_last.eq(rows_r == 1), g_last.eq(groups_r == 1)]

        # -- MAC results: held in a register with their block's activation scale and sum -------
        # (the MAC array's output FIFO is the buffer; a result leaves it once the lanes have
        # taken its J terms)
        # (every compare that the hand-off needs is a register, set when its counter moves)
        blk_r = blkp.read_port()
        head_valid = Signal()
        head_isum = Signal.like(mac.o.payload.isum)
        head_row = Signal.like(mac.o.payload.row)
        head_first, head_last = Signal(), Signal()
        need_s, need_b = Signal(), Signal()        # the head's row 0: s beats; and bias beats
        ob = Signal(log_kb + 1)                    # block of the next result
        orow = Signal(range(T))                    # its row
        ob_last, orow_last = Signal(), Signal()    # ob == kb_r - 1, orow == rows_r - 1
        ob_zero, orow_zero = Signal(init=1), Signal(init=1)     # ob == 0, orow == 0
        j = Signal(range(J))
        j_last = Signal(init=J == 1)               # j == J - 1
        # with float zero points (fzp) a result's terms come twice: its J weight terms, then
        # (zt) its J zero-point terms, d = asum with the s beats' scales z
        zt = Signal() if cfg.float_path else Const(0, 1)
        r_last = j_last & (zt | ~fzp)              # the head's last term
        go = Signal()
        h_move = ~head_valid | (go & r_last)
        accept = mac.o.valid & h_move
        # the next result's accumulator row (its row of A) and whether its terms open or close
        # the accumulators: in fmode its digit rows share one, opened by digit 0, closed by 3
        if cfg.float_path:
            o_arow = Mux(fmode, orow >> 2, orow)
            o_first = ob_zero & (~fmode | (orow[:2] == 0))
            o_last = ob_last & (~fmode | (orow[:2] == 3))
        else:
            o_arow, o_first, o_last = orow, ob_zero, ob_last
        o_need_s = orow_zero                       # its terms take s beats; and bias beats
        o_need_b = bias_r & ob_zero & o_need_s
        m.d.comb += [mac.o.ready.eq(h_move),
                     blk_r.addr.eq((orow << log_kb) | ob[:log_kb]), blk_r.en.eq(h_move)]
        with m.If(h_move):
            # (the result's row and block from the hand-off's counters, which follow the MAC
            # array's order, rather than from its block RAM FIFO's slow output)
            m.d.sync += [head_valid.eq(mac.o.valid), head_isum.eq(mac.o.payload.isum),
                         head_row.eq(o_arow), head_first.eq(o_first),
                         head_last.eq(o_last), need_s.eq(o_need_s), need_b.eq(o_need_b)]
        head_blk = data.View(rq.blk.payload.shape(), blk_r.data)
        # a group's last result taken: counted a cycle later (only the tile's end waits on
        # out_groups, and its read-out comes later still)
        group_done = Signal()
        m.d.sync += group_done.eq(0)
        with m.If(group_done):
            m.d.sync += out_groups.eq(out_groups + 1)
        with m.If(accept):
            with m.If(orow_last):
                m.d.sync += [orow.eq(0), orow_last.eq(rows_r == 1), orow_zero.eq(1),
                             ob.eq(Mux(ob_last, 0, ob + 1)), ob_zero.eq(ob_last),
                             ob_last.eq(Mux(ob_last, kb_r == 1, ob == kb_r - 2))]
                m.d.sync += group_done.eq(ob_last)
            with m.Else():
                m.d.sync += [orow.eq(orow + 1), orow_last.eq(orow == rows_r - 2),
                             orow_zero.eq(0)]
        with m.If(load_go):
            m.d.sync += [ob.eq(0), orow.eq(0), out_groups.eq(0), read_groups.eq(0),
                         group_done.eq(0), ob_zero.eq(1), orow_zero.eq(1),
                         ob_last.eq(kb_r == 1), orow_last.eq(rows_r == 1)]

        # -- the lanes: each MAC result as J terms per lane, in lock step -----------------------
        # A term goes when it can (its scale and bias beats are there) and the admission
        # allows it: a register, decided a cycle ahead for the term offered next.
        def term_addr(row, jj):
            jj = Const(jj, len(j)) if isinstance(jj, int) else jj[:len(j)]
            return Cat(jj, row) if J & (J - 1) == 0 else row * J + jj
        m.submodules.admission = adm = LaneAdmission.for_lane(self._lanes[0])
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
        # (their J-way multiplexers and the lanes are far apart on the chip)
        term_r = Signal(terms, reset_less=True)
        term_v = Signal()
        m.d.sync += [term_r.eq(term_in), term_v.eq(go)]
        m.d.comb += go.eq(adm.ok)
        with m.If(go):
            m.d.sync += [j.eq(Mux(j_last, 0, j + 1)),
                         j_last.eq(Mux(j_last, J == 1, j == J - 2))]
            if cfg.float_path:
                with m.If(j_last):
                    m.d.sync += zt.eq(~zt & fzp)
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
        j_next = Mux(j_last, 0, j + 1) if cfg.float_path else j + 1
        next_term = (beats(need_s, need_b & ~zt_next, s_adv, b_adv),
                     term_addr(head_row, j_next), *flags(zt_next))
        for cand, sel, a, b in ((adm.stay, head_valid, this_term, first_of_next[0]),
                                (adm.advance, r_last, first_of_next[1], next_term)):
            m.d.comb += [field.eq(Mux(sel, x, y)) for field, x, y in zip(
                (cand.valid, cand.addr, cand.first, cand.last), a, b, strict=True)]
        t_first, t_last = flags(zt)
        m.d.comb += [adm.take.eq(go), adm.beat.addr.eq(term_addr(head_row, j)),
                     adm.beat.last.eq(t_last)]
        pairs = wide_columns(pe, F)
        replay_layout = data.StructLayout({"scale": unsigned(32), "zp": unsigned(8),
                                           "bias": unsigned(32)})
        for f, lane in enumerate(self._lanes):
            # (a term's s beat kept for the tile's other rows; 2 J entries with fzp)
            rep = memory.Memory(shape=replay_layout, depth=2 * J if cfg.float_path else J,
                                init=[])
            m.submodules[f"replay{f}"] = rep
            rw, rr = rep.write_port(), rep.read_port(domain="comb")
            cur = Signal(replay_layout, name=f"params{f}")
            slot = Mux(zt, j + J, j) if cfg.float_path else j
            m.d.comb += [rr.addr.eq(slot), rw.addr.eq(slot), rw.en.eq(go & need_s),
                         cur.eq(rr.data)]
            with m.If(need_s):
                m.d.comb += [cur.scale.eq(s_buf[f].scale), cur.zp.eq(s_buf[f].zp)]
                with m.If(need_bt):
                    m.d.comb += cur.bias.eq(b_buf[f])
                with m.Elif(~head_first):
                    m.d.comb += cur.bias.eq(rr.data.bias)
            m.d.comb += rw.data.eq(cur)
            # the term's block sums: MAC column lane_column(...), or at 5..8 bits the two
            # MAC columns of its output column (wide_columns)
            isum = Signal.like(head_isum[0], name=f"isum{f}")
            isum_hi = Signal.like(head_isum[0], name=f"isum_hi{f}")
            with m.Switch(j):
                for jj in range(J):
                    c = lane_column(pe, F, f, jj, False)
                    cw = lane_column(pe, F, f, jj, True)
                    with m.Case(jj):
                        if cw is not None:
                            lo, hi = pairs[cw]
                            m.d.comb += [isum.eq(Mux(wide, head_isum[lo], head_isum[c])),
                                         isum_hi.eq(Mux(wide, head_isum[hi], 0))]
                        else:
                            m.d.comb += isum.eq(head_isum[c])
            if cfg.float_path:                     # a zero-point term: d = asum (zp 0)
                isum, isum_hi = Mux(zt, head_blk.asum, isum), Mux(zt, 0, isum_hi)
            li = term_in[f]
            m.d.comb += [li.isum.eq(isum), li.isum_hi.eq(isum_hi),
                         li.asum.eq(head_blk.asum), li.sa.eq(head_blk.sa),
                         li.sb.eq(cur.scale), li.zp.eq(cur.zp),
                         li.bias.eq(Mux(bias_r, cur.bias, 0)),
                         li.first.eq(t_first), li.last.eq(t_last),
                         li.addr.eq(term_addr(head_row, j)),
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
        word = Signal(32)                   # the bank word taken two cycles before
        with m.Switch(delay(m, rr_f, 1, "rr_f")):
            for f in range(F):
                with m.Case(f):
                    m.d.sync += word.eq(banks[f][1].data)
        for f in range(F):
            m.d.comb += banks[f][1].addr.eq((rb << _log2(depth)) | (rr_row * J + rr_j))
        # output columns in order: lane by lane, each its run of terms (lane_column)
        j_end = Mux(wide, J // 2 - 1, J - 1) if J > 1 else 0
        col_last = (rr_j == j_end) & (rr_f == Mux(wide, F // 2 - 1, F - 1) if J == 1 else
                                      rr_f == F - 1)
        bank_last = col_last & (rr_row == out_rows - 1)
        job_last = bank_last & last_tile & (read_groups == groups_r - 1)
        with m.If(take):
            with m.If(col_last):
                m.d.sync += [rr_f.eq(0), rr_j.eq(0)]
                with m.If(rr_row == out_rows - 1):
                    m.d.sync += [rr_row.eq(0), rb.eq(~rb), read_groups.eq(read_groups + 1)]
                    m.d.sync += full.bit_select(rb, 1).eq(0)
                with m.Else():
                    m.d.sync += rr_row.eq(rr_row + 1)
            with m.Elif(rr_j == j_end):
                m.d.sync += [rr_j.eq(0), rr_f.eq(rr_f + 1)]
            with m.Else():
                m.d.sync += rr_j.eq(rr_j + 1)

        # -- output: rounding to A's type, then a FIFO reserved by a credit ---------------------
        assert _Y_FIFO > self.timing["out"]         # a word a cycle with y ready
        m.submodules.y_fifo = y_fifo = fifo.SyncFIFOBuffered(width=33, depth=_Y_FIFO)
        m.submodules.out_round = rnd = Fp32Narrow()
        lat = rnd.latency
        m.d.comb += [rnd.a.eq(word), rnd.fmt.eq(out_fmt_r == OUT_FORMATS.index("bfloat16")),
                     y_fifo.w_data.eq(Mux(out_fmt_r == 0, delay(m, word, lat, "y"), rnd.y)),
                     y_fifo.w_data[32].eq(delay(m, job_last, _BANK_READ_LATENCY + lat,
                                                "y_last"))]
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
        m.d.sync += reserved.eq(reserved + take - send)
        return m
