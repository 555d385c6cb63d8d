"""The MatMulNBits engine v2 (docs/matmul_nbits_v2.md): integer block sums on packed MACs, a few
shared float lanes, activations quantised once per row into on-chip memory, row tiles that
share each weight fetch. Bit-exact with :func:`qaccel.model.nbits_hw.matmul_nbits_v2`."""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value, unsigned
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.config import AccelConfig
from qaccel.model.validate import check_bool
from qaccel.rtl.arith.pipeline import delay, local_copy
from qaccel.rtl.nbits import packed_mac_array, row_quantizer
from qaccel.rtl.nbits.nbits_cluster import (
    COUNT_WIDTH,
    INPUT_STAGES,
    OUT_FORMATS,
    OUT_LATENCY,
    NBitsCluster,
    lane_column,
    lane_latency,
    stream_members,
    wide_columns,
)
from qaccel.rtl.nbits.row_quantizer import RowQuantizer
from qaccel.rtl.nbits.scale_lane import RECURRENCE

__all__ = ["COUNT_WIDTH", "OUT_FORMATS", "REGISTERS", "MatMulNBitsV2", "check_engine",
           "engine_timing", "lane_column", "wide_columns"]

#: The job registers (input ports), latched at ``start``.
REGISTERS = ("k", "block_size", "bits", "m", "groups", "bias", "out_fmt", "fmode")
# (with several clusters; 16 deep: one LUT RAM's depth)
_SPLIT_FIFO = 16        # w, s and b beats buffered per cluster
_SPLIT_MARGIN = 5       # beats a split FIFO keeps free: 4 in flight past its room, and 1
_SPLIT_CHUNK = 32       # bits of a split FIFO under one read pointer (a beat's part is cut)
_MERGE_FIFO = 16        # y words buffered from each cluster
_MERGE_MARGIN = 6       # words a merge FIFO keeps free: 5 in flight past its room, and 1
_OUT_FIFO = 8           # y words buffered after the merge


def _log2(n: int) -> int:
    return (n - 1).bit_length()


def check_engine(config: AccelConfig) -> None:
    """Raise ValueError, naming the fields, where ``config`` describes no v2 engine: ``pe``
    odd, the float path without ``m_tile`` a multiple of 4, ``pe / scale_lanes`` odd and
    above 1, ``pe / clusters`` odd, several clusters with one column per lane."""
    if not isinstance(config, AccelConfig):
        raise TypeError(f"config must be an AccelConfig, not {config!r}")
    pe, F, n = config.pe, config.scale_lanes, config.clusters
    if pe % 2:
        raise ValueError(f"pe must be even for the v2 engine (two columns share a "
                         f"multiplier), not {pe}")
    if config.float_path and config.m_tile % 4:
        raise ValueError(f"m_tile must be a multiple of 4 for the v2 engine's float path "
                         f"(four digit rows per row of A), not {config.m_tile}")
    J = pe // F
    if J > 1 and J % 2:
        raise ValueError(f"pe / scale_lanes (MAC columns per float lane) must be 1 or "
                         f"even for the v2 engine (5..8-bit columns pair two of a lane's "
                         f"MAC columns), not {pe} / {F}")
    if (pe // n) % 2:
        raise ValueError(f"pe / clusters must be even for the v2 engine (two columns "
                         f"share a multiplier), not {pe} / {n}")
    if n > 1 and J == 1:
        raise ValueError(f"clusters ({n}) need at least two MAC columns per float lane "
                         f"(pe / scale_lanes = {pe} / {F})")


def _cluster_dsp_pairs(config: AccelConfig, e: int) -> int | None:
    """The DSP multiplier slots of cluster ``e`` (None: all; the budget split evenly, the
    first clusters taking one more)."""
    dsp, n = config.dsp_pairs, config.clusters
    return None if dsp is None else dsp // n + (e < dsp % n)


def engine_timing(config: AccelConfig) -> dict[str, int]:
    """The cycle counts :func:`qaccel.explore.perf.nbits_v2_call` composes, from the engine's
    own pipeline and its units' latencies, without building it (ValueError where
    :func:`check_engine` refuses ``config``):

    ``start``: ``start`` to the first tile's row-quantiser start (the sizing states);
    ``issue``: the quantiser's ``busy`` low to the first weight step; ``to_lane``: a
    step's issue to its MAC beat (the activation word read and registered), plus the
    block sums' register (where the block's activation scale and sum join them), without
    the MAC latency; ``lane``: a term's hand-off to its result offered (the terms'
    register, then the lane's latency); ``bank``: a lane result to its bank being
    readable;
    ``out``: a bank word taken to its ``y`` beat (the bank's registered read, the
    float16 / bfloat16 rounding of :class:`~qaccel.rtl.arith.fp32_narrow.Fp32Narrow` and the
    ``y`` FIFO; with several clusters, the merge: two registers and a FIFO to it, the
    output FIFO after it);
    ``next_tile``: a tile's last bank word taken to the next tile's quantiser start (the
    clusters' ``idle`` is a register; with several, the merge has taken their words);
    ``done``: the last ``y`` beat to ``busy`` low; and the units' ``mac`` (cluster 0's MAC
    array) and ``recurrence`` and the row quantiser's ``quantizer`` latency."""
    check_engine(config)
    several = config.clusters > 1
    stage = INPUT_STAGES if several else 0      # the clusters' input copies
    # the y merge: a cluster's word to its FIFO there (two registers, the FIFO), then
    # the output FIFO
    merge_in, merge_out = (4, 2) if several else (0, 0)
    slots = config.pe // config.clusters // 2 * config.simd
    dsp = _cluster_dsp_pairs(config, 0)
    mac = packed_mac_array.latency(simd=config.simd, lut_pairs=dsp is not None and dsp < slots)
    return {"start": 4, "issue": 2 + stage, "to_lane": 3, "bank": 1,
            "out": OUT_LATENCY + merge_in + merge_out,
            "next_tile": 5 + OUT_LATENCY + merge_in,
            "done": 5 - merge_out, "mac": mac,
            "lane": lane_latency(max_block=config.max_block_size),
            "recurrence": RECURRENCE, "quantizer": row_quantizer.LATENCY}


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
        steps per word, each nibble the codes of two steps, the first in its low two bits,
        so a slice of columns is a slice of the word). A step is the
        :class:`PackedMacArray`'s nibble array ``w[p][j]`` (bit ``4 * (p * simd + j)``):
        3..4-bit codes one per nibble (2-bit codes zero-extended on chip); 5..8-bit codes as
        column ``c``'s
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

    ``config.clusters`` cuts the columns into that many :class:`NBitsCluster` slices, each
    with ``F / clusters`` lanes, its own copy of the tile's activations, its weight feed,
    MAC array, hand-off and read-out (on a large part each places as a compact block, so no
    control net spans the chip). The streams and their layouts are the same: each slice
    takes its part of every ``w``, ``s`` and ``b`` beat through a small FIFO (a beat goes
    when all have room), and ``y`` merges the slices' words row by row, each slice sending
    into a FIFO of its own here. Every signal between the engine and a slice runs from a
    register to a register (the streams cross by credit: a register says there is room).

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
    element per cycle) before the groups run and the tile's last ``y`` words are sent before
    the next tile loads (and before ``busy`` falls). :func:`qaccel.explore.perf.nbits_v2_call`
    gives a call's cycles.
    """

    #: The part of the AccelConfig this engine is built from (its builds are keyed by it).
    config_part = "matmul_nbits"

    def __init__(self, config: AccelConfig | None = None, *, ecp5: bool = False):
        config = AccelConfig() if config is None else config
        check_bool("ecp5", ecp5)
        if not isinstance(config, AccelConfig):
            raise TypeError(f"config must be an AccelConfig, not {config!r}")
        check_engine(config)
        self._config = config
        pe, simd = config.pe, config.simd
        self._lanes_n = F = config.scale_lanes
        self._J = pe // F
        n = config.clusters
        self._rq = RowQuantizer(max_block=config.max_block_size, ecp5=ecp5,
                                bfp=config.float_path)
        blk = self._rq.blk.payload.shape()
        self._clusters = [
            NBitsCluster(pe=pe // n, simd=simd, lanes=F // n, rows=config.m_tile,
                         max_block=config.max_block_size, max_k=config.max_k,
                         float_path=config.float_path,
                         dsp_pairs=_cluster_dsp_pairs(config, e),
                         blk_layout=blk, input_stage=n > 1, ecp5=ecp5)
            for e in range(n)]
        cl, t = self._clusters[0], engine_timing(config)      # the built units agree
        assert (cl.mac.latency, cl.lane_latency, cl.lane.recurrence, self._rq.latency) == (
            t["mac"], t["lane"], t["recurrence"], t["quantizer"]), t
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
            **stream_members(pe, simd, F),
        })

    @property
    def config(self) -> AccelConfig:
        return self._config

    @property
    def timing(self) -> dict[str, int]:
        """The engine's cycle counts: :func:`engine_timing` of its configuration."""
        return engine_timing(self._config)

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
        CW = COUNT_WIDTH
        steps_max = cfg.max_k // simd
        kb_max = cfg.max_k // 16
        log_steps, log_kb = _log2(steps_max), _log2(kb_max)
        log_simd = _log2(simd)
        m.submodules.rq = rq = self._rq
        clusters = self._clusters
        for e, cl in enumerate(clusters):
            m.submodules[f"cluster{e}"] = cl

        # -- job registers ----------------------------------------------------------------------
        k_r = Signal(CW)
        bs_r = Signal(range(mb + 1))
        log_bs = Signal(range(_log2(mb) + 1))
        bits_r = Signal(4)
        groups_r = Signal(CW)
        bias_r = Signal()
        out_fmt_r = Signal(2)
        kb_r = Signal(CW)                   # blocks per row
        steps_r = Signal(CW)                # weight steps per row (padded to whole blocks)
        wide = Signal()
        two = Signal()                      # 2-bit weights: two steps per nibble
        rows_r = Signal(range(T + 1))       # rows of the current tile (digit rows in fmode)
        out_rows = Signal(range(T + 1))     # its rows of A and y (rows_r / 4 in fmode)
        left = Signal(CW)                   # rows of A from the current tile on
        last_tile = Signal()
        # the float path (block floating point: four int8 digit rows per row of A), with
        # ``config.float_path`` only
        fmode = Signal() if cfg.float_path else Const(0, 1)
        fzp = Signal() if cfg.float_path else Const(0, 1)     # and float zero points

        with m.Switch(bs_r):
            for e in range(4, _log2(mb) + 1):
                with m.Case(1 << e):
                    m.d.comb += log_bs.eq(e)
        m.d.comb += [wide.eq(bits_r > 4), two.eq(bits_r == 2)]
        load_go = Signal()                  # (registers: high in LOAD_START, COMPUTE_START)
        feed_go = Signal()
        m.d.sync += [load_go.eq(0), feed_go.eq(0)]
        idle = Signal()                     # every cluster's tile done (a cycle behind)
        y_empty = Signal(init=1)            # no y word past the clusters (in their merge)
        # the clusters' tile done: each idle, and (several) their words all merged
        idles = [cl.idle for cl in clusters]
        merged = Signal(init=1)             # (several: no word of theirs in the merge)
        if len(clusters) > 1:               # (registered here too: see the streams below)
            idles = [local_copy(m, v, f"idle{e}") for e, v in enumerate(idles)] + [merged]
        m.d.comb += idle.eq(Cat(idles).all())
        with m.FSM() as fsm:
            with m.State("IDLE"):
                with m.If(self.start & (self.k != 0) & (self.m != 0) & (self.groups != 0)):
                    m.d.sync += [k_r.eq(self.k), bs_r.eq(self.block_size),
                                 bits_r.eq(self.bits), left.eq(self.m),
                                 groups_r.eq(self.groups), bias_r.eq(self.bias),
                                 out_fmt_r.eq(self.out_fmt)]
                    if cfg.float_path:
                        m.d.sync += [fmode.eq(self.fmode[0]),
                                     fzp.eq(self.fmode[0] & self.fmode[1])]
                    m.next = "SIZE"
            with m.State("SIZE"):              # (two cycles: an add and a shift in each)
                m.d.sync += kb_r.eq((k_r + bs_r - 1) >> log_bs)
                m.next = "STEPS"
            with m.State("STEPS"):
                m.d.sync += steps_r.eq((kb_r << log_bs) >> log_simd)
                m.next = "TILE"
            with m.State("TILE"):
                Ta = Mux(fmode, T // 4, T) if cfg.float_path else T   # rows of A per tile
                act_rows = Mux(left <= Ta, left, Ta)
                m.d.sync += [rows_r.eq(Mux(fmode, act_rows << 2, act_rows)),
                             out_rows.eq(act_rows), last_tile.eq(left <= Ta)]
                m.d.sync += load_go.eq(1)
                m.next = "LOAD_START"
            with m.State("LOAD_START"):
                m.next = "LOAD"
            with m.State("LOAD"):
                with m.If(~rq.busy & ~load_go):
                    m.d.sync += feed_go.eq(1)
                    m.next = "COMPUTE_START"
            with m.State("COMPUTE_START"):
                m.next = "COMPUTE"
            with m.State("COMPUTE"):
                with m.If(idle):
                    m.d.sync += left.eq(left - out_rows)
                    m.next = "NEXT"
            with m.State("NEXT"):
                with m.If(left != 0):
                    m.next = "TILE"
                with m.Else():
                    m.next = "DRAIN"
            with m.State("DRAIN"):            # (the clusters have sent all; the merge empty)
                with m.If(y_empty):
                    m.next = "IDLE"
        m.d.comb += self.busy.eq(~fsm.ongoing("IDLE"))

        # -- activations: the row quantiser into every cluster's activation and block memories -
        # (each write registered here, then broadcast)
        act_w = Signal.like(clusters[0].act_w)
        blk_w = Signal.like(clusters[0].blk_w)
        act_wr = Signal.like(act_w, name="act_wr")
        blk_wr = Signal.like(blk_w, name="blk_wr")
        m.d.sync += [act_wr.eq(act_w), blk_wr.eq(blk_w)]
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
        qa8 = qp.qa.as_unsigned()
        word = (pack >> 8) | (qa8 << (8 * simd - 8)) if simd > 1 else qa8
        m.d.comb += [act_w.en.eq(rq.q.valid & (lane_i == simd - 1)), act_w.data.eq(word),
                     act_w.addr.eq((act_row(lrow, digit) << log_steps) | lstep)]
        with m.If(rq.q.valid):
            m.d.sync += pack.eq(word)
            m.d.sync += lane_i.eq(Mux(lane_i == simd - 1, 0, lane_i + 1))
            with m.If(lane_i == simd - 1):
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
        # (a write's data and address need no enable: only `en` waits on the beat's valid)
        m.d.comb += [rq.blk.ready.eq(1), blk_w.en.eq(rq.blk.valid),
                     blk_w.data.eq(rq.blk.payload),
                     blk_w.addr.eq((act_row(brow, bdig) << log_kb) | bblk)]
        with m.If(rq.blk.valid):
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


        # -- the clusters: job fields, the tile's activations, and the streams cut by columns ---
        for cl in clusters:
            m.d.comb += [cl.kb.eq(kb_r), cl.steps.eq(steps_r), cl.bpb.eq(bs_r >> log_simd),
                         cl.rows.eq(rows_r), cl.out_rows.eq(out_rows), cl.groups.eq(groups_r),
                         cl.wide.eq(wide), cl.two.eq(two), cl.bias.eq(bias_r),
                         cl.out_fmt.eq(out_fmt_r), cl.fmode.eq(fmode), cl.fzp.eq(fzp),
                         cl.last_tile.eq(last_tile), cl.load_go.eq(load_go),
                         cl.feed_go.eq(feed_go), cl.act_w.eq(act_wr), cl.blk_w.eq(blk_wr)]
        n = len(clusters)
        if n == 1:
            cl = clusters[0]
            for port in ("w", "s", "b"):
                wiring.connect(m, wiring.flipped(getattr(self, port)), getattr(cl, port))
            wiring.connect(m, cl.y, wiring.flipped(self.y))
            return m
        # several clusters: every signal between the engine and a cluster goes from a register
        # to a register (a cluster may sit across the part), so the streams cross by credit.
        # w, s, b: a beat taken is registered beside each cluster, then written into its FIFO;
        # the beat goes when every FIFO has room for it and those in flight (each at most
        # _SPLIT_FIFO - _SPLIT_MARGIN full two cycles before: a register beside the FIFO,
        # then their AND)
        for port in ("w", "s", "b"):
            src = getattr(self, port)
            beat = Value.cast(src.payload)
            width = len(beat) // n
            take = src.valid & src.ready
            rooms = []
            for e, cl in enumerate(clusters):
                # (unbuffered: its read is a LUT RAM's, so the cluster's ready moves only
                # read pointers, not a register as wide as the beat; one FIFO per
                # _SPLIT_CHUNK bits, in lock step, so each read pointer drives the address
                # of a few LUT RAMs, beside the bits' loads, not of some 32 over the cluster)
                dst = getattr(cl, port)
                dst_bits = Value.cast(dst.payload)
                part = beat[e * width:(e + 1) * width]
                put = local_copy(m, take, f"{port}_put{e}")
                part_r = delay(m, part, 1, f"{port}_part{e}")
                chunks = []
                for lo in range(0, width, _SPLIT_CHUNK):
                    hi = min(width, lo + _SPLIT_CHUNK)
                    q = fifo.SyncFIFO(width=hi - lo, depth=_SPLIT_FIFO)
                    m.submodules[f"{port}_fifo{e}_{lo // _SPLIT_CHUNK}"] = q
                    m.d.comb += [q.w_data.eq(part_r[lo:hi]), q.w_en.eq(put),
                                 dst_bits[lo:hi].eq(q.r_data), q.r_en.eq(dst.ready)]
                    chunks.append(q)
                room = Signal(name=f"{port}_room{e}")
                m.d.sync += room.eq(chunks[0].level <= _SPLIT_FIFO - _SPLIT_MARGIN)
                rooms.append(room)
                m.d.comb += dst.valid.eq(chunks[0].r_rdy)
            room = Signal(name=f"{port}_room")
            m.d.sync += room.eq(Cat(rooms).all())
            m.d.comb += src.ready.eq(room)
        # y: a cluster sends a word when a copy beside it of its FIFO's room here says so
        # (the FIFO at most _MERGE_FIFO - _MERGE_MARGIN full two cycles before), the word
        # registered beside the cluster and again here, then written; each row's words
        # are taken cluster by cluster (its cols = pe / n, or half at 5..8 bits) into the
        # output FIFO; the job's last word is the last cluster's last
        ins = []
        pending = []
        for e, cl in enumerate(clusters):
            q = fifo.SyncFIFOBuffered(width=33, depth=_MERGE_FIFO)
            m.submodules[f"y_fifo{e}"] = q
            room = Signal(name=f"y_room{e}")
            m.d.sync += room.eq(q.level <= _MERGE_FIFO - _MERGE_MARGIN)
            may_send = local_copy(m, room, f"y_may_send{e}")
            m.d.comb += cl.y.ready.eq(may_send)
            last = cl.y.payload.last if e == n - 1 else 0
            sent = cl.y.valid & may_send
            for hop in ("out", "in"):       # beside the cluster, then here
                sent_r = Signal(name=f"y_{hop}_valid{e}")
                m.d.sync += sent_r.eq(sent)
                sent = sent_r
            word = delay(m, Cat(cl.y.payload.y, last), 2, f"y_word{e}")
            m.d.comb += [q.w_en.eq(sent), q.w_data.eq(word)]
            ins.append(q)
            pending += [sent, q.level != 0]
        cols = pe // n
        sel = Signal(range(n))
        word_i = Signal(range(cols))
        word_last = Signal()                # word_i == this chunk's last
        m.submodules.y_fifo = y_fifo = fifo.SyncFIFOBuffered(width=33, depth=_OUT_FIFO)
        # (registers: a cluster's idle, here a cycle later, comes three cycles after its last
        # word left it, so by then the word is in its FIFO here or a stage before it)
        m.d.sync += [merged.eq(~Cat(*pending).any()),
                     y_empty.eq(~Cat(*pending, y_fifo.level != 0).any())]
        y_room = Signal()                   # (a register, as above)
        m.d.sync += y_room.eq(y_fifo.level <= _OUT_FIFO - 3)
        with m.Switch(sel):
            for e, q in enumerate(ins):
                with m.Case(e):
                    m.d.comb += [y_fifo.w_data.eq(q.r_data), y_fifo.w_en.eq(q.r_rdy & y_room),
                                 q.r_en.eq(y_room)]
        m.d.comb += word_last.eq(word_i == Mux(wide, cols // 2 - 1, cols - 1))
        with m.If(y_fifo.w_en):
            with m.If(word_last):
                m.d.sync += [word_i.eq(0), sel.eq(Mux(sel == n - 1, 0, sel + 1))]
            with m.Else():
                m.d.sync += word_i.eq(word_i + 1)
        m.d.comb += [self.y.payload.y.eq(y_fifo.r_data[:32]),
                     self.y.payload.last.eq(y_fifo.r_data[32]),
                     self.y.valid.eq(y_fifo.r_rdy), y_fifo.r_en.eq(self.y.ready)]
        return m
