"""The MatMulNBits engine: ``pe`` output columns of ONNX Runtime's MatMulNBits at a time, int8
path (accuracy_level 4) and float32 path (levels 0..3), bit-exact with
:func:`qaccel.model.nbits_hw.matmul_nbits_hw`."""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.config import AccelConfig
from qaccel.model.floatfmt import FORMATS
from qaccel.rtl.activation_quant import ActivationQuant
from qaccel.rtl.block_scale import BlockScale
from qaccel.rtl.decode import Decode
from qaccel.rtl.decode import min_exp_width as decode_exp_width
from qaccel.rtl.float_round import FloatRound
from qaccel.rtl.float_round import min_exp_width as round_exp_width
from qaccel.rtl.mac_array import MacArray
from qaccel.rtl.pipeline import delay
from qaccel.rtl.row_accumulate import RowAccumulate
from qaccel.rtl.weight_unpack import BUS_WIDTHS, WeightUnpack

__all__ = ["COUNT_WIDTH", "OUT_FORMATS", "REGISTERS", "ZP_DEFAULT", "ZP_FLOAT", "ZP_PACKED",
           "MatMulNBits"]

#: ``zp_mode`` values: no zero points (``2 ** (bits - 1)``), packed uint8 codes on ``z``,
#: float32 zero points on ``s``.
ZP_DEFAULT, ZP_PACKED, ZP_FLOAT = 0, 1, 2
#: ``out_fmt`` values: the type ``y`` is rounded to (A's type), by index.
OUT_FORMATS = ("float32", "float16", "bfloat16")
#: The job registers (input ports), latched at ``start``.
REGISTERS = ("k", "block_size", "bits", "passes", "int8", "zp_mode", "bias", "out_fmt")
#: Width of the ``k`` and ``passes`` registers.
COUNT_WIDTH = 22
_TERM_FIFO = 32        # block terms between BlockScale and RowAccumulate (> BlockScale latency)
_OUT_DECODE_LATENCY, _OUT_ROUND_LATENCY = 1, 3       # the float16/bfloat16 rounding of y
_Y_FIFO = 8            # y beats reserved past the rounding (> its latency: one beat per cycle)
_PARAM_FIFO = 4        # block parameters from ``s`` taken ahead of their block


class MatMulNBits(wiring.Component):
    """MatMulNBits ``Y = A W^T + bias`` for ``pe`` output columns per pass.

    A job is ``passes`` passes; each pass takes one row of A and the weights of ``pe`` columns
    (a *column group*) and gives one ``y`` beat of ``pe`` float32 results. The host chooses the
    passes (every row against every column group, in any order) and feeds the streams, per
    pass, in the same order:

    ``a``
        The row, ``ceil(k / simd)`` beats of ``simd`` float32 lanes (element ``t * simd + j``
        in lane ``j``; lanes past ``k`` ignored).
    ``w``
        The group's weight codes. Column ``p`` of the group is one little-endian bit stream of
        ``bits``-bit codes (ONNX Runtime's B row, ``k_blocks * block_size`` codes per pass),
        carried in bits ``[p * wb, (p + 1) * wb)`` of the ``weight_bus_width``-bit words
        (``wb = weight_bus_width / pe``). The streams of consecutive passes follow each other
        without padding; only the job's last word is padded.
    ``s``
        With ``bias``, first one beat whose ``scale[p]`` is the bias of column ``p``; then
        ``k_blocks`` beats, one per block: ``scale[p]`` (float32) and, with
        ``zp_mode == ZP_FLOAT``, ``zero[p]`` (float32).
    ``z``
        With ``zp_mode == ZP_PACKED``: byte ``p`` of each word belongs to column ``p``'s bit
        stream of ``bits``-bit zero-point codes, one per block, LSB first (ONNX Runtime's
        packed layout), the codes of consecutive passes following each other without the
        per-column byte padding ONNX Runtime leaves. Unused otherwise.
    ``y``
        One beat per pass, ``last`` on the job's last pass: ``y[p]`` float32, or with
        ``out_fmt`` 1 / 2 rounded to nearest even to float16 / bfloat16 (A's type) in its low
        16 bits (a 4-cycle rounding pipeline into an 8-beat output FIFO that a credit
        reserves, so back-pressure on ``y`` loses nothing). Columns past N
        (a partial last group) carry whatever their codes give; the host drops them.

    Registers (valid at ``start``, latched then): ``k`` (1 to ``2**22 - 1``), ``block_size``
    (a power of two, ``max(16, simd)`` to ``max_block_size``; other values act as
    ``max_block_size``), ``bits`` (2 to 8; others act as 8), ``passes``, ``int8`` (take the
    int8 path; ignored with float zero points), ``out_fmt`` (index in :data:`OUT_FORMATS`),
    ``zp_mode`` (``ZP_FLOAT`` needs ``config.float_path``), ``bias``. ``start`` while ``busy`` is
    ignored; ``k == 0`` or ``passes == 0`` is an empty job. ``busy`` is high from the cycle
    after ``start`` until the last ``y`` beat is transferred.

    Paths. Int8 (``int8`` and integer or no zero points): :class:`ActivationQuant` ->
    :class:`MacArray` (with the unpacked codes) -> :class:`BlockScale` (with the block's
    scales and zero points) -> :class:`RowAccumulate` (with the bias). Float (otherwise,
    when ``config.float_path``): the row, padded to whole blocks, with the codes and the
    block's scale and zero point, -> :class:`~qaccel.rtl.float_mac.FloatMac`. Both take one
    ``simd``-element beat per cycle per column when the streams keep up.

    Throughput: ``pe * simd`` MACs per cycle, bounded by the weight bus at
    ``weight_bus_width / bits`` codes per cycle; consecutive passes leave no gap (``s`` goes
    through a bias FIFO and a 4-entry block-parameter FIFO, so a pass's bias beat is taken
    while the previous pass computes). A pass takes at least ``8 * partial_sums`` cycles (the
    previous row's fold), and each float32 accumulator takes ``partial_sums`` operands (block
    terms on the int8 path, beats on the float path) per 8 cycles. ``s``, ``z`` and ``a``
    need far less. :func:`qaccel.model.perf.nbits_call` gives a call's cycles exactly
    (tests/rtl/test_matmul_nbits.py::test_whole_call_cycles, test_utilisation).

    Latency, from the transfer of a pass's last ``a`` beat to its ``y`` beat, no stalls: the
    path's pipeline (int8: ActivationQuant, MacArray, BlockScale, RowAccumulate; float: the
    row padding and FloatMac), then 6 cycles of output (the 4-stage rounding pipeline and the
    ``y`` FIFO's 2); measured 149 (int8) and 131 (float) cycles at the default configuration
    (``qaccel demo``), 151 / 124 at pe 2 x simd 4 (``qaccel demo --quick``;
    ``qaccel.RTL.last_run.latency``).
    """

    def __init__(self, config: AccelConfig | None = None):
        config = AccelConfig() if config is None else config
        if not isinstance(config, AccelConfig):
            raise TypeError(f"config must be an AccelConfig, not {config!r}")
        self._config = config
        pe, simd = config.pe, config.simd
        self._lane_bus = config.weight_bus_width // pe
        if config.weight_bus_width % pe or self._lane_bus not in BUS_WIDTHS:
            raise ValueError(f"weight_bus_width / pe must be one of {BUS_WIDTHS} (each column "
                             f"its share of the bus), not {config.weight_bus_width} / {pe}")
        self._aq = ActivationQuant(simd=simd, max_block=config.max_block_size,
                                   count_width=COUNT_WIDTH)
        self._mac = MacArray(pe=pe, simd=simd, max_block=config.max_block_size)
        self._float_mac = None
        if config.float_path:
            from qaccel.rtl.float_mac import FloatMac
            self._float_mac = FloatMac(pe=pe, simd=simd, partial_sums=config.partial_sums)
        words = data.ArrayLayout(unsigned(32), pe)
        super().__init__({
            "k": In(unsigned(COUNT_WIDTH)),
            "block_size": In(unsigned(16)),
            "bits": In(unsigned(4)),
            "passes": In(unsigned(COUNT_WIDTH)),
            "int8": In(1),
            "zp_mode": In(unsigned(2)),
            "bias": In(1),
            "out_fmt": In(unsigned(2)),
            "start": In(1),
            "busy": Out(1),
            "a": In(stream.Signature(data.ArrayLayout(unsigned(32), simd))),
            "w": In(stream.Signature(unsigned(config.weight_bus_width))),
            "s": In(stream.Signature(data.StructLayout({"scale": words, "zero": words}))),
            "z": In(stream.Signature(data.ArrayLayout(unsigned(8), pe))),
            "y": Out(stream.Signature(data.StructLayout({"y": words, "last": unsigned(1)}))),
        })

    @property
    def config(self) -> AccelConfig:
        return self._config

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        pe, simd, mb = cfg.pe, cfg.simd, cfg.max_block_size
        CW = COUNT_WIDTH
        words = data.ArrayLayout(unsigned(32), pe)

        # -- job registers ----------------------------------------------------------------------
        k_r = Signal(CW)
        passes_r = Signal(CW)
        bits_r = Signal(4)
        bs_r = Signal(range(mb + 1))
        log_bs = Signal(range(mb.bit_length()))
        int8_r = Signal()
        zp_r = Signal(2)
        bias_r = Signal()
        out_fmt_r = Signal(2)
        padded_k = Signal(CW + 1)           # k rounded up to whole blocks
        kb_r = Signal(CW)                   # blocks per row
        total_w = Signal(2 * CW + 1)        # weight codes per column in the job
        total_z = Signal(2 * CW)            # zero-point codes per column in the job
        phase = Signal(2)                   # 0 idle/running, 1 latched, 2 sized: go next
        go = Signal()
        active = Signal()

        legal_bs = Signal()
        bs_in = self.block_size
        m.d.comb += legal_bs.eq((bs_in & (bs_in - 1)) == 0)
        lo = max(16, simd)
        with m.If(self.start & ~active & (phase == 0)):
            m.d.sync += [k_r.eq(self.k), passes_r.eq(self.passes),
                         bits_r.eq(Mux((self.bits >= 2) & (self.bits <= 8), self.bits, 8)),
                         bs_r.eq(Mux(legal_bs & (bs_in >= lo) & (bs_in <= mb), bs_in, mb)),
                         zp_r.eq(Mux(self.zp_mode > ZP_FLOAT, ZP_DEFAULT, self.zp_mode)),
                         bias_r.eq(self.bias), out_fmt_r.eq(self.out_fmt),
                         phase.eq(Mux((self.k != 0) & (self.passes != 0), 1, 0))]
            m.d.sync += int8_r.eq(self.int8 & (self.zp_mode != ZP_FLOAT)
                                  if cfg.float_path else 1)
        with m.Switch(bs_r):
            for e in range(4, mb.bit_length()):
                with m.Case(1 << e):
                    m.d.comb += log_bs.eq(e)
        with m.If(phase == 1):
            pk = ((k_r + bs_r - 1) >> log_bs) << log_bs
            m.d.sync += [padded_k.eq(pk), kb_r.eq((k_r + bs_r - 1) >> log_bs), phase.eq(2)]
        with m.If(phase == 2):
            m.d.sync += [total_w.eq(padded_k * passes_r), total_z.eq(kb_r * passes_r),
                         phase.eq(3)]
        with m.If(phase == 3):
            m.d.sync += [phase.eq(0), active.eq(1)]
        m.d.comb += [go.eq(phase == 3), self.busy.eq(active | (phase != 0))]

        # -- weights: one unpacker per column, fed in lock step -----------------------------------
        wb = self._lane_bus
        unpackers = []
        for p in range(pe):
            u = WeightUnpack(simd=simd, bus_width=wb, count_width=2 * CW + 1)
            m.submodules[f"unpack{p}"] = u
            m.d.comb += [u.bits.eq(bits_r), u.count.eq(total_w), u.start.eq(go),
                         u.i.payload.eq(self.w.payload[p * wb:(p + 1) * wb]),
                         u.i.valid.eq(self.w.valid)]
            unpackers.append(u)
        # identical units with identical inputs: their handshakes coincide
        m.d.comb += self.w.ready.eq(unpackers[0].i.ready)
        codes_valid = unpackers[0].o.valid
        codes_ready = Signal()
        for u in unpackers:
            m.d.comb += u.o.ready.eq(codes_ready)

        # -- zero points: packed codes, one unpacker per column ----------------------------------
        zunpack = []
        for p in range(pe):
            u = WeightUnpack(simd=1, bus_width=8, count_width=2 * CW)
            m.submodules[f"zunpack{p}"] = u
            m.d.comb += [u.bits.eq(bits_r), u.count.eq(total_z),
                         u.start.eq(go & (zp_r == ZP_PACKED)),
                         u.i.payload.eq(self.z.payload[p]), u.i.valid.eq(self.z.valid)]
            zunpack.append(u)
        m.d.comb += self.z.ready.eq(zunpack[0].i.ready)

        # -- block parameters and bias from ``s`` --------------------------------------------------
        s_cnt = Signal(CW)
        s_is_bias = Signal()
        m.d.comb += s_is_bias.eq(bias_r & (s_cnt == 0))
        # ``s`` is split into a bias FIFO and a block-parameter FIFO, so that the next pass's
        # bias beat is taken while the current pass's last block is still being computed
        m.submodules.bias_fifo = bias_fifo = fifo.SyncFIFOBuffered(width=32 * pe, depth=4)
        param_layout = data.StructLayout(
            {"scale": words, **({"zero": words} if cfg.float_path else {})})
        m.submodules.param_fifo = param_fifo = fifo.SyncFIFOBuffered(
            width=param_layout.size, depth=_PARAM_FIFO)
        param = data.View(param_layout, param_fifo.r_data)
        param_valid = Signal()
        param_take = Signal()
        zp_ok = (zp_r != ZP_PACKED) | zunpack[0].o.valid
        m.d.comb += [param_valid.eq(active & param_fifo.r_rdy & zp_ok),
                     param_fifo.r_en.eq(param_take),
                     param_fifo.w_data.eq(self.s.payload.as_value()[:param_layout.size]),
                     param_fifo.w_en.eq(active & self.s.valid & ~s_is_bias),
                     bias_fifo.w_data.eq(self.s.payload.scale),
                     bias_fifo.w_en.eq(active & self.s.valid & s_is_bias),
                     self.s.ready.eq(active & Mux(s_is_bias, bias_fifo.w_rdy,
                                                  param_fifo.w_rdy))]
        for u in zunpack:
            m.d.comb += u.o.ready.eq(param_take & (zp_r == ZP_PACKED))
        with m.If(self.s.valid & self.s.ready):
            last_s = s_cnt == kb_r - 1 + bias_r
            m.d.sync += s_cnt.eq(Mux(last_s, 0, s_cnt + 1))
        with m.If(go):
            m.d.sync += s_cnt.eq(0)
        zp8 = [Mux(zp_r == ZP_PACKED, zunpack[p].o.payload.q[0],
                   (Const(1, 9) << bits_r)[1:9]) for p in range(pe)]
        bias_word = Mux(bias_r, bias_fifo.r_data, 0)
        bias_ok = ~bias_r | bias_fifo.r_rdy

        # -- int8 path --------------------------------------------------------------------------
        m.submodules.aq = aq = self._aq
        m.submodules.mac = mac = self._mac
        m.submodules.block_scale = bsc = BlockScale(
            pe=pe, isum_width=mac.isum_width, asum_width=mac.asum_width)
        m.submodules.row_acc = racc = RowAccumulate(pe=pe, partial_sums=cfg.partial_sums)
        m.submodules.sa_fifo = sa_fifo = fifo.SyncFIFOBuffered(
            width=32, depth=mac.fifo_depth + 1)
        term_layout = data.StructLayout({"t": data.ArrayLayout(unsigned(32), pe),
                                         "row_last": unsigned(1)})
        m.submodules.terms = terms = fifo.SyncFIFOBuffered(width=term_layout.size,
                                                           depth=_TERM_FIFO)
        int8_run = active & int8_r
        qb = aq.q.payload
        m.d.comb += [aq.k.eq(k_r), aq.rows.eq(passes_r), aq.block_size.eq(bs_r),
                     aq.start.eq(go & int8_r),
                     aq.a.payload.eq(self.a.payload), aq.a.valid.eq(self.a.valid & int8_run),
                     mac.a.payload.qa.eq(qb.qa), mac.a.payload.block_last.eq(qb.block_last),
                     mac.a.payload.last.eq(qb.row_last),
                     mac.a.valid.eq(aq.q.valid & sa_fifo.w_rdy),
                     aq.q.ready.eq(mac.a.ready),
                     sa_fifo.w_data.eq(qb.sa),
                     sa_fifo.w_en.eq(aq.q.valid & mac.a.ready & qb.block_last),
                     mac.w.valid.eq(codes_valid & int8_run)]
        for p in range(pe):
            m.d.comb += mac.w.payload[p].eq(unpackers[p].o.payload.q)
        # block terms: one block per cycle, with room reserved in the term FIFO
        in_flight = Signal(range(_TERM_FIFO + 1))
        fire = Signal()
        m.d.comb += fire.eq(mac.o.valid & sa_fifo.r_rdy & param_valid & int8_r
                            & (in_flight < _TERM_FIFO))
        m.d.comb += [mac.o.ready.eq(fire), sa_fifo.r_en.eq(fire),
                     bsc.valid.eq(fire), bsc.isum.eq(mac.o.payload.isum),
                     bsc.asum.eq(mac.o.payload.asum), bsc.sa.eq(sa_fifo.r_data)]
        for p in range(pe):
            m.d.comb += [bsc.sb[p].eq(param.scale[p]), bsc.zp[p].eq(zp8[p])]
        term = Signal(term_layout)
        m.d.comb += [term.t.eq(bsc.t),
                     term.row_last.eq(delay(m, mac.o.payload.last, bsc.latency, "row_last")),
                     terms.w_data.eq(term), terms.w_en.eq(bsc.o_valid)]
        head = data.View(term_layout, terms.r_data)
        racc_go = racc.i.valid & racc.i.ready
        m.d.comb += [racc.i.payload.t.eq(head.t), racc.i.payload.row_last.eq(head.row_last),
                     racc.i.payload.bias.eq(bias_word),
                     racc.i.valid.eq(terms.r_rdy & (~head.row_last | bias_ok)),
                     terms.r_en.eq(racc_go)]
        m.d.sync += in_flight.eq(in_flight + fire - racc_go)
        int8_bias_pop = racc_go & head.row_last & bias_r

        # -- float path -------------------------------------------------------------------------
        f_take = Signal()
        f_bias_pop = Signal()
        f_param_take = Signal()
        y_src = racc.o
        if self._float_mac is not None:
            m.submodules.float_mac = fm = self._float_mac
            f_run = Signal()
            left = Signal(CW)                           # row elements left (0 in padding)
            bbeat = Signal(range(mb // simd + 1))
            rows = Signal(CW)
            block_last = Signal()
            row_last = Signal()
            need_a = Signal()
            beats_per_block = bs_r >> (simd.bit_length() - 1)
            m.d.comb += [block_last.eq(bbeat == beats_per_block - 1),
                         row_last.eq(block_last & (left <= simd)),
                         need_a.eq(left != 0)]
            fi = fm.i.payload
            m.d.comb += [fi.a.eq(self.a.payload), fi.mask.eq(Cat(*(left > j
                                                                   for j in range(simd)))),
                         fi.row_last.eq(row_last), fi.bias.eq(bias_word), fm.zp_float.eq(
                             zp_r == ZP_FLOAT)]
            for p in range(pe):
                m.d.comb += [fi.q[p].eq(unpackers[p].o.payload.q),
                             fi.scale[p].eq(param.scale[p]),
                             fi.zero[p].eq(Mux(zp_r == ZP_FLOAT, param.zero[p],
                                               zp8[p]))]
            m.d.comb += fm.i.valid.eq(f_run & (~need_a | self.a.valid) & codes_valid
                                      & param_valid & (~row_last | bias_ok))
            m.d.comb += f_take.eq(fm.i.valid & fm.i.ready)
            m.d.comb += [f_param_take.eq(f_take & block_last),
                         f_bias_pop.eq(f_take & row_last & bias_r)]
            with m.If(f_take):
                m.d.sync += [bbeat.eq(Mux(block_last, 0, bbeat + 1)),
                             left.eq(Mux(row_last, k_r, Mux(left > simd, left - simd, 0)))]
                with m.If(row_last):
                    m.d.sync += rows.eq(rows - 1)
                    with m.If(rows == 1):
                        m.d.sync += f_run.eq(0)
            with m.If(go):
                m.d.sync += [f_run.eq(~int8_r), left.eq(k_r), bbeat.eq(0),
                             rows.eq(passes_r)]
            y_src = fm.o
            a_ready_f = f_take & need_a
        else:
            a_ready_f = Const(0)

        # -- shared handshakes ------------------------------------------------------------------
        m.d.comb += [codes_ready.eq(Mux(int8_r, mac.w.ready, f_take)),
                     param_take.eq(Mux(int8_r, fire, f_param_take)),
                     bias_fifo.r_en.eq(int8_bias_pop | f_bias_pop),
                     self.a.ready.eq(Mux(int8_r, aq.a.ready & int8_run, a_ready_f))]

        # -- output: rounding pipeline, then a FIFO reserved by a credit ------------------------
        src_valid = Mux(int8_r, racc.o.valid, y_src.valid)
        src_y = Mux(int8_r, racc.o.payload.y.as_value(), y_src.payload.y.as_value())
        m.submodules.y_fifo = y_fifo = fifo.SyncFIFOBuffered(width=32 * pe, depth=_Y_FIFO)
        reserved = Signal(range(_Y_FIFO + 1))
        take = Signal()
        m.d.comb += [take.eq(src_valid & active & (reserved < _Y_FIFO)),
                     racc.o.ready.eq(take & int8_r)]
        if self._float_mac is not None:
            m.d.comb += y_src.ready.eq(take & ~int8_r)
        halves = tuple(FORMATS[f] for f in OUT_FORMATS[1:])
        ew = max(decode_exp_width((FORMATS["float32"],)), round_exp_width(halves))
        lat = _OUT_DECODE_LATENCY + _OUT_ROUND_LATENCY
        for p in range(pe):
            word = src_y[32 * p:32 * (p + 1)]
            dec = Decode(("float32",), sig_width=24, exp_width=ew, latency=_OUT_DECODE_LATENCY)
            rnd = FloatRound(halves, sig_width=24, exp_width=ew, latency=_OUT_ROUND_LATENCY)
            m.submodules[f"out_dec{p}"], m.submodules[f"out_round{p}"] = dec, rnd
            m.d.comb += [dec.code.eq(word), dec.fmt.eq(0), rnd.i.eq(dec.o),
                         rnd.fmt.eq(out_fmt_r - 1), rnd.saturate.eq(0),
                         y_fifo.w_data[32 * p:32 * (p + 1)].eq(
                             Mux(out_fmt_r == 0, delay(m, word, lat, f"y{p}"), rnd.code))]
        taken = take                            # its valid bit (resets, unlike the data)
        for k in range(lat):
            reg = Signal(name=f"y_taken_d{k + 1}")
            m.d.sync += reg.eq(taken)
            taken = reg
        m.d.comb += y_fifo.w_en.eq(taken)

        y_cnt = Signal(CW)
        y_last = Signal()
        m.d.comb += [y_last.eq(y_cnt == passes_r - 1),
                     self.y.payload.y.eq(y_fifo.r_data), self.y.payload.last.eq(y_last),
                     self.y.valid.eq(y_fifo.r_rdy), y_fifo.r_en.eq(self.y.ready)]
        m.d.sync += reserved.eq(reserved + take - (self.y.valid & self.y.ready))
        with m.If(self.y.valid & self.y.ready):
            m.d.sync += y_cnt.eq(y_cnt + 1)
            with m.If(y_last):
                m.d.sync += active.eq(0)
        with m.If(go):
            m.d.sync += y_cnt.eq(0)
        return m
