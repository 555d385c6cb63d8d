"""MatMulNBits CompInt8 (accuracy_level 4) activation quantiser: float32 rows of A to int8 blocks
with a float32 scale per block, as :func:`qaccel.model.nbits_kernels.quantize_a`."""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.validate import check_int, check_int_choice
from qaccel.rtl.decode import Decode
from qaccel.rtl.float_divide import FloatDivide
from qaccel.rtl.float_mul import FloatMul
from qaccel.rtl.float_round import FloatRound
from qaccel.rtl.float_to_int import FloatToInt
from qaccel.rtl.float_unpack import FloatClass
from qaccel.rtl.pipeline import delay
from qaccel.rtl.wide_float import wide_float_layout

__all__ = ["MAX_BLOCKS", "SIMD", "ActivationQuant"]

#: Elements per beat :class:`ActivationQuant` supports.
SIMD = (1, 2, 4, 8, 16)
#: Values of ``max_block`` :class:`ActivationQuant` supports.
MAX_BLOCKS = (16, 32, 64, 128, 256, 512, 1024)

_SIG, _EXP = 24, 9            # a float32 as an exact wide float (min_exp_width of float32: 9)
_F32_INF = 0x7F800000         # magnitudes above this are NaNs
_F32_QUIET = 0x00400000
_DIV_BITS = 2                 # quotient digits per FloatDivide stage (13 + 1 + 1 cycles)
_ROUND_LATENCY = 3            # the FloatRound units
_MUL_LATENCY = 2
_TO_INT_LATENCY = 2
_TREE_LEVELS_PER_STAGE = 2    # lane-max tree levels between registers
_FIFO_LATENCY = 2             # SyncFIFOBuffered: write in cycle c, readable in cycle c + 2
_SLACK = 4                    # spare ring beats / scale entries beyond the steady-state need


def _combine(m: Module, lo, hi, name: str) -> Signal:
    """``quantize_a``'s running amax step on float32 magnitudes (31-bit codes), ``hi`` being
    the later element: a NaN replaces (the last NaN wins), else the larger; as integers the
    magnitudes order like the values, inf above every finite one."""
    out = Signal(31, name=name)
    lo_nan, hi_nan = lo > _F32_INF, hi > _F32_INF
    m.d.comb += out.eq(Mux(hi_nan | (~lo_nan & (hi >= lo)), hi, lo))
    return out


class ActivationQuant(wiring.Component):
    """Quantise rows of float32 activations per K-block to symmetric int8, bit-exact with
    :func:`qaccel.model.nbits_kernels.quantize_a` (ONNX Runtime's CompInt8 path).

    Per row and per block of ``block_size`` elements (the last block of a row zero-padded
    past ``k``): ``amax = max|a|`` (a NaN element makes amax that NaN, the last one wins),
    ``sa = f32(amax / 127)`` and ``inv = f32(127 / amax)`` (correctly rounded, 0 when
    ``amax == 0``), ``qa = RNE(f32(a * inv))``.

    A job: set ``block_size``, ``k`` and ``rows`` and pulse ``start`` while ``busy`` is low
    (a ``start`` while busy is ignored; a synchronous reset aborts a job). Then ``a`` takes
    the ``rows`` rows back to back, ``ceil(k / simd)`` beats each, float32 bit patterns, lane
    ``j`` of beat ``t`` of a row holding element ``t * simd + j`` (lanes past ``k`` in a
    row's last beat are ignored). ``q`` gives per row ``k_blocks * block_size / simd`` beats
    (``k_blocks = ceil(k / block_size)``): the quantised row, zero-padded to whole blocks
    (``qa = 0`` past ``k``), with ``sa``, the float32 code of the block's scale, on every
    beat of the block, ``block_last`` on a block's final beat, ``row_last`` on a row's final
    beat and ``last`` on the job's final beat. ``busy`` is high from ``start`` until the last
    beat has left ``q``.

    Registers: ``block_size`` a power of two with ``simd <= block_size <= max_block``; any
    other value acts as ``max_block``. ``k >= 1`` and ``rows >= 1``; ``k == 0`` or
    ``rows == 0`` is an empty job (no beat taken or given, ``busy`` stays low). They must be
    valid at ``start`` and hold while ``busy``.

    Non-finite products. Where ``f32(a * inv)`` is not finite ``quantize_a`` (like ONNX
    Runtime) gives ``qa = 0``; that happens for whole blocks, whose beats here carry
    ``qa = 0`` and ``invalid = 1`` (0 elsewhere), ``sa`` being ``quantize_a``'s:

    * a NaN in the block: ``sa`` is that NaN (the last one), sign cleared, made quiet
      (x86 division keeps the payload);
    * an infinity (no NaN): ``sa = +inf`` (``inv = 0``; the finite elements give 0 anyway);
    * a finite ``amax`` below ``127 / FLT_MAX`` (about 3.7e-37, subnormals included) but not
      0: ``127 / amax`` overflows to inf; ``sa = f32(amax / 127)`` as usual (tiny, or 0).

    Otherwise ``|qa| <= 127`` (``a * inv <= 127 * (1 + 2**-24)``).

    Throughput: one beat per cycle on ``a`` and on ``q``, sustained (measured 1.000 without
    pauses); when ``k`` is not a multiple of ``block_size`` a row has more ``q`` beats than
    ``a`` beats and ``a`` waits. ``a.ready`` and ``q.valid`` depend on registers only.
    Latency: the first beat of a block is offered on ``q`` :attr:`latency` cycles (35 to 37:
    ``35 + ceil(log2(simd) / 2)``) after the ``a`` transfer that completes the block, when
    nothing stalls and ``q`` is not still busy with earlier blocks.

    Mechanism. Accepted beats go to a ring buffer (a :class:`~amaranth.lib.memory.Memory` of
    :attr:`ring_depth` beats, ``simd * 32`` bits wide: one largest block plus the beats that
    arrive while a block's scale is computed; the double buffering, generalised so that the
    scale's latency costs no throughput). Next to it, the masked lane magnitudes go through
    a max tree (a register every two levels) into the block's running amax. At a block's end
    the amax is decoded and divided twice (two :class:`~qaccel.rtl.float_divide.FloatDivide`,
    two digits per stage, then :class:`~qaccel.rtl.float_round.FloatRound` to float32:
    ``amax / 127`` and ``127 / amax``); ``sa``, ``inv`` and the flags enter a scale FIFO of
    :attr:`scale_depth` entries. The reader starts a block when its scale is at the FIFO's
    head, reads the block's beats from the ring (padding beats read nothing) and runs each
    lane through :class:`~qaccel.rtl.decode.Decode`, :class:`~qaccel.rtl.float_mul.FloatMul`
    (24 x 24-bit product, kept to 26 bits and a sticky bit), FloatRound (float32) and
    :class:`~qaccel.rtl.float_to_int.FloatToInt` (RNE, int8) into an output FIFO of
    :attr:`out_depth` beats with credit flow control (back-pressure loses nothing). ``a`` is
    accepted while the ring has room and fewer than :attr:`scale_depth` blocks are pending.

    Parameters
    ----------
    simd : :class:`int`
        Elements per beat, one of :data:`SIMD`.
    max_block : :class:`int`
        Largest run-time block size, one of :data:`MAX_BLOCKS` (default 256).
    count_width : :class:`int`
        Width of ``k`` and ``rows``, 1 to 32 (default 16).

    Raises
    ------
    :exc:`TypeError`, :exc:`ValueError`
        If a parameter is not an integer or out of range; the message names it.

    Members
    -------
    block_size : :py:`In(unsigned(16))`
    k : :py:`In(unsigned(count_width))`
        Elements per row.
    rows : :py:`In(unsigned(count_width))`
    start : :py:`In(1)`
    a : :py:`In(stream.Signature(ArrayLayout(unsigned(32), simd)))`
    q : :py:`Out(stream.Signature(StructLayout({"qa": ArrayLayout(signed(8), simd),
        "sa": unsigned(32), "invalid": 1, "block_last": 1, "row_last": 1, "last": 1})))`
    busy : :py:`Out(1)`
    """

    def __init__(self, *, simd: int, max_block: int = 256, count_width: int = 16):
        self._simd = check_int_choice("simd", simd, SIMD)
        self._max_block = check_int_choice("max_block", max_block, MAX_BLOCKS)
        self._count_width = check_int("count_width", count_width, 1, 32)
        # the scale dividers (made here so that the latency is known before elaboration)
        self._div_sa, self._div_inv = (
            FloatDivide(a_width=_SIG, b_width=_SIG, q_width=_SIG + 2, exp_width=_EXP,
                        bits_per_stage=_DIV_BITS) for _ in range(2))
        self._div_latency = self._div_sa.latency
        super().__init__({
            "block_size": In(unsigned(16)),
            "k": In(unsigned(count_width)),
            "rows": In(unsigned(count_width)),
            "start": In(1),
            "a": In(stream.Signature(data.ArrayLayout(unsigned(32), simd))),
            "q": Out(stream.Signature(data.StructLayout({
                "qa": data.ArrayLayout(signed(8), simd),
                "sa": unsigned(32),
                "invalid": unsigned(1),
                "block_last": unsigned(1),
                "row_last": unsigned(1),
                "last": unsigned(1),
            }))),
            "busy": Out(1),
        })

    # -- contract ------------------------------------------------------------------------------

    @property
    def simd(self) -> int:
        """Elements per beat."""
        return self._simd

    @property
    def max_block(self) -> int:
        """Largest run-time block size."""
        return self._max_block

    @property
    def count_width(self) -> int:
        """Width of ``k`` and ``rows``."""
        return self._count_width

    @property
    def _tree_stages(self) -> int:
        levels = self._simd.bit_length() - 1
        return -(-levels // _TREE_LEVELS_PER_STAGE)

    @property
    def _scale_latency(self) -> int:
        """Cycles from the transfer completing a block to its scale entering the FIFO."""
        # lane registers, tree, running amax, Decode, divider, FloatRound
        return 1 + self._tree_stages + 1 + 1 + self._div_latency + _ROUND_LATENCY

    @property
    def _lane_latency(self) -> int:
        """Cycles from a reader fire to the beat entering the output FIFO."""
        # memory read, read-data register, Decode, FloatMul, FloatRound, FloatToInt
        return 1 + 1 + 1 + _MUL_LATENCY + _ROUND_LATENCY + _TO_INT_LATENCY

    @property
    def latency(self) -> int:
        """Cycles from the ``a`` transfer completing a block to the block's first ``q`` beat
        being offered, without stalls."""
        return self._scale_latency + _FIFO_LATENCY + self._lane_latency + _FIFO_LATENCY

    @property
    def ring_depth(self) -> int:
        """Beats the input ring buffer holds: ``max_block / simd`` plus the beats accepted
        while a block's scale is computed (:attr:`latency` minus the read-out part), plus
        slack."""
        return (self._max_block // self._simd + self._scale_latency + _FIFO_LATENCY
                + _SLACK)

    @property
    def scale_depth(self) -> int:
        """Entries of the scale FIFO: the blocks that can be pending (completed on ``a``, not
        yet read out) at one block per cycle."""
        return self._scale_latency + _FIFO_LATENCY + _SLACK

    @property
    def out_depth(self) -> int:
        """Beats the output FIFO holds (the credit limit): a power of two above the beats in
        flight at one beat per cycle (:attr:`latency`'s read-out part, plus one)."""
        return 1 << (self._lane_latency + _FIFO_LATENCY + 1).bit_length()

    def a_beats(self, k: int, rows: int) -> int:
        """Return the ``a`` beats of a job: ``rows * ceil(k / simd)``."""
        k = check_int("k", k, 0, (1 << self._count_width) - 1)
        rows = check_int("rows", rows, 0, (1 << self._count_width) - 1)
        return rows * -(-k // self._simd)

    def q_beats(self, k: int, rows: int, block_size: int) -> int:
        """Return the ``q`` beats of a job: ``rows * ceil(k / block_size) * block_size /
        simd``, for a legal ``block_size``."""
        k = check_int("k", k, 0, (1 << self._count_width) - 1)
        rows = check_int("rows", rows, 0, (1 << self._count_width) - 1)
        bs = check_int("block_size", block_size, self._simd, self._max_block)
        if bs & (bs - 1):
            raise ValueError(f"block_size must be a power of two, not {bs}")
        return rows * -(-k // bs) * (bs // self._simd)

    # -- hardware ------------------------------------------------------------------------------

    def elaborate(self, platform):
        m = Module()
        S, CW = self._simd, self._count_width
        D = self._max_block // S
        R, F, OF = self.ring_depth, self.scale_depth, self.out_depth
        a, q = self.a, self.q

        # -- job registers ---------------------------------------------------------------------
        busy = Signal()
        go = Signal()
        m.d.comb += [go.eq(self.start & ~busy), self.busy.eq(busy)]
        bpb_m1 = Signal(range(D))                          # beats per block - 1
        bpb_in = Signal(range(D))
        m.d.comb += bpb_in.eq(D - 1)
        with m.Switch(self.block_size):
            bs = S
            while bs <= self._max_block:
                with m.Case(bs):
                    m.d.comb += bpb_in.eq(bs // S - 1)
                bs *= 2
        job_ok = (self.k != 0) & (self.rows != 0)
        with m.If(go):
            m.d.sync += bpb_m1.eq(bpb_in)

        # -- ring buffer -------------------------------------------------------------------------
        m.submodules.ring = ring = memory.Memory(shape=a.payload.shape(), depth=R, init=[])
        wr = ring.write_port()
        rd = ring.read_port()
        used = Signal(range(R + 1))                        # beats written, not yet read
        pend = Signal(range(F + 1))                        # blocks completed, not yet read out

        # -- writer: accept, store, mask ---------------------------------------------------------
        w_run = Signal()
        w_left = Signal(CW)                                # elements left in the row
        w_bbeat = Signal(range(D))                         # beat within the block
        w_rows = Signal(CW)                                # rows left
        wptr = Signal(range(R))
        m.d.comb += a.ready.eq(w_run & (used < R) & (pend < F))
        accept = Signal()
        m.d.comb += accept.eq(a.valid & a.ready)
        w_row_last = Signal()
        w_done = Signal()                                  # the beat completes a block
        m.d.comb += [w_row_last.eq(w_left <= S),
                     w_done.eq((w_bbeat == bpb_m1) | w_row_last)]
        m.d.comb += [wr.addr.eq(wptr), wr.data.eq(a.payload), wr.en.eq(accept)]
        with m.If(accept):
            m.d.sync += [wptr.eq(Mux(wptr == R - 1, 0, wptr + 1)),
                         w_bbeat.eq(Mux(w_done, 0, w_bbeat + 1)),
                         w_left.eq(Mux(w_row_last, self.k, w_left - S))]
            with m.If(w_row_last):
                m.d.sync += w_rows.eq(w_rows - 1)
                with m.If(w_rows == 1):
                    m.d.sync += w_run.eq(0)
        with m.If(go):
            m.d.sync += [w_run.eq(job_ok), w_left.eq(self.k), w_bbeat.eq(0),
                         w_rows.eq(self.rows)]

        # -- amax: masked magnitudes, the lane tree, the running block maximum ----------------
        mags = []
        for j in range(S):
            mag = Signal(31, name=f"mag{j}", reset_less=True)
            m.d.sync += mag.eq(Mux(w_left > j, a.payload[j][:31], 0))
            mags.append(mag)
        t_valid = Signal()
        t_done = Signal()
        m.d.sync += [t_valid.eq(accept), t_done.eq(accept & w_done)]
        level = 0
        while len(mags) > 1:
            mags = [_combine(m, mags[i], mags[i + 1], f"max{level}_{i // 2}")
                    for i in range(0, len(mags), 2)]
            level += 1
            if level % _TREE_LEVELS_PER_STAGE == 0 or len(mags) == 1:
                regs = []
                for i, v in enumerate(mags):
                    r = Signal(31, name=f"max{level}r_{i}", reset_less=True)
                    m.d.sync += r.eq(v)
                    regs.append(r)
                mags = regs
                nv, nd = Signal(name=f"t_valid{level}"), Signal(name=f"t_done{level}")
                m.d.sync += [nv.eq(t_valid), nd.eq(t_done)]
                t_valid, t_done = nv, nd
        acc = Signal(31)                                   # the block's amax so far
        acc_new = _combine(m, acc, mags[0], "acc_new")
        with m.If(t_valid):
            m.d.sync += acc.eq(Mux(t_done, 0, acc_new))
        b_valid = Signal()
        b_amax = Signal(31, reset_less=True)
        m.d.sync += [b_valid.eq(t_valid & t_done), b_amax.eq(acc_new)]

        # -- scale: sa = f32(amax / 127), inv = f32(127 / amax), flags ---------------------------
        m.submodules.dec_amax = dec = Decode(("float32",), sig_width=_SIG, exp_width=_EXP)
        m.submodules.div_sa = div_sa = self._div_sa
        m.submodules.div_inv = div_inv = self._div_inv
        m.submodules.round_sa = round_sa = FloatRound(
            ("float32",), sig_width=_SIG + 2, exp_width=_EXP + 2, latency=_ROUND_LATENCY)
        m.submodules.round_inv = round_inv = FloatRound(
            ("float32",), sig_width=_SIG + 2, exp_width=_EXP + 2, latency=_ROUND_LATENCY)
        c127 = Signal(wide_float_layout(_SIG, _EXP))
        m.d.comb += [c127.sign.eq(0), c127.exp.eq(6), c127.sig.eq(127 << (_SIG - 7)),
                     c127.sticky.eq(0), c127.cls.eq(FloatClass.NORMAL)]
        m.d.comb += [dec.code.eq(b_amax), dec.fmt.eq(0),
                     div_sa.a.eq(dec.o), div_sa.b.eq(c127),
                     div_inv.a.eq(c127), div_inv.b.eq(dec.o),
                     round_sa.i.eq(div_sa.q), round_sa.fmt.eq(0), round_sa.saturate.eq(0),
                     round_inv.i.eq(div_inv.q), round_inv.fmt.eq(0), round_inv.saturate.eq(0)]
        s_lat = dec.latency + self._div_latency + _ROUND_LATENCY
        s_valid = Signal(s_lat)
        m.d.sync += s_valid.eq((s_valid << 1) | b_valid)
        amax = delay(m, b_amax, s_lat, "amax")

        entry_layout = data.StructLayout({
            "sa": unsigned(32), "inv": wide_float_layout(_SIG, _EXP),
            "kill": unsigned(1), "invalid": unsigned(1)})
        entry = Signal(entry_layout)
        is_nan, is_inf, is_zero = amax > _F32_INF, amax == _F32_INF, amax == 0
        inv = round_inv.value
        m.d.comb += [
            entry.invalid.eq(is_nan | is_inf | (~is_zero & (inv.cls == FloatClass.INF))),
            entry.kill.eq(entry.invalid | is_zero),
            entry.sa.eq(Mux(is_nan, amax | _F32_QUIET, round_sa.code)),
            entry.inv.sign.eq(inv.sign), entry.inv.exp.eq(inv.exp[:_EXP]),
            entry.inv.sig.eq(inv.sig[2:]), entry.inv.sticky.eq(0), entry.inv.cls.eq(inv.cls),
        ]
        m.submodules.scales = scales = fifo.SyncFIFOBuffered(width=entry_layout.size, depth=F)
        m.d.comb += [scales.w_data.eq(entry), scales.w_en.eq(s_valid[-1])]
        head = data.View(entry_layout, scales.r_data)

        # -- reader: one beat per cycle once the block's scale is at the head -----------------
        r_run = Signal()
        r_left = Signal(CW)                                # row elements left (0 in padding)
        r_bbeat = Signal(range(D))
        r_rows = Signal(CW)
        rptr = Signal(range(R))
        reserved = Signal(range(OF + 1))                   # beats in flight or in the FIFO
        fire = Signal()
        m.d.comb += fire.eq(r_run & scales.r_rdy & (reserved < OF))
        r_block_last = Signal()
        r_row_last = Signal()
        r_data = Signal()
        m.d.comb += [r_block_last.eq(r_bbeat == bpb_m1),
                     r_row_last.eq(r_block_last & (r_left <= S)),
                     r_data.eq(r_left != 0)]
        r_last = r_row_last & (r_rows == 1)
        m.d.comb += [rd.addr.eq(rptr), rd.en.eq(fire & r_data),
                     scales.r_en.eq(fire & r_block_last)]
        with m.If(fire):
            m.d.sync += [r_bbeat.eq(Mux(r_block_last, 0, r_bbeat + 1)),
                         r_left.eq(Mux(r_row_last, self.k, Mux(r_left > S, r_left - S, 0)))]
            with m.If(r_data):
                m.d.sync += rptr.eq(Mux(rptr == R - 1, 0, rptr + 1))
            with m.If(r_row_last):
                m.d.sync += r_rows.eq(r_rows - 1)
                with m.If(r_rows == 1):
                    m.d.sync += r_run.eq(0)
        with m.If(go):
            m.d.sync += [r_run.eq(job_ok), r_left.eq(self.k), r_bbeat.eq(0),
                         r_rows.eq(self.rows)]

        freed = fire & r_data
        m.d.sync += used.eq(used + accept - freed)
        m.d.sync += pend.eq(pend + (accept & w_done) - (fire & r_block_last))

        # -- lanes: decode, multiply by inv, round to float32, round to int8 -------------------
        meta_layout = data.StructLayout({
            "sa": unsigned(32), "mask": unsigned(S), "kill": unsigned(1), "invalid": unsigned(1),
            "block_last": unsigned(1), "row_last": unsigned(1), "last": unsigned(1)})
        meta = Signal(meta_layout)
        m.d.comb += [meta.sa.eq(head.sa), meta.kill.eq(head.kill),
                     meta.invalid.eq(head.invalid), meta.block_last.eq(r_block_last),
                     meta.row_last.eq(r_row_last), meta.last.eq(r_last)]
        m.d.comb += meta.mask.eq(Cat(*(r_left > j for j in range(S))))
        L = self._lane_latency
        x2 = Signal.like(rd.data, reset_less=True)
        m.d.sync += x2.eq(rd.data)
        inv_at_mul = delay(m, head.inv, 3, "inv")          # fire, read, register -> Decode out
        meta_out = delay(m, meta, L, "meta")
        valid = Signal(L)
        m.d.sync += valid.eq((valid << 1) | fire)
        result = Signal(q.payload.shape())
        for j in range(S):
            dec_x = Decode(("float32",), sig_width=_SIG, exp_width=_EXP)
            # the product truncated to 26 bits with a sticky bit: enough for one correct
            # rounding to float32 (a round bit), with a 30-bit instead of a 52-bit increment
            mul = FloatMul(a_width=_SIG, b_width=_SIG, exp_width=_EXP, out_width=_SIG + 2,
                           latency=_MUL_LATENCY)
            rnd = FloatRound(("float32",), sig_width=_SIG + 2, exp_width=_EXP + 1,
                             latency=_ROUND_LATENCY)
            to_int = FloatToInt(sig_width=_SIG, exp_width=_EXP + 1, max_bits=8,
                                latency=_TO_INT_LATENCY)
            m.submodules[f"dec{j}"] = dec_x
            m.submodules[f"mul{j}"] = mul
            m.submodules[f"round{j}"] = rnd
            m.submodules[f"to_int{j}"] = to_int
            v = rnd.value
            m.d.comb += [dec_x.code.eq(x2[j]), dec_x.fmt.eq(0),
                         mul.a.eq(dec_x.o), mul.b.eq(inv_at_mul),
                         rnd.i.eq(mul.p), rnd.fmt.eq(0), rnd.saturate.eq(0),
                         to_int.i.sign.eq(v.sign), to_int.i.exp.eq(v.exp),
                         to_int.i.sig.eq(v.sig[2:]), to_int.i.sticky.eq(0),
                         to_int.i.cls.eq(v.cls),
                         to_int.zero_point.eq(0), to_int.bits.eq(8), to_int.signed.eq(1)]
            keep = meta_out.mask[j] & ~meta_out.kill
            m.d.comb += result.qa[j].eq(Mux(keep, to_int.code[:8], 0))
        m.d.comb += [result.sa.eq(meta_out.sa), result.invalid.eq(meta_out.invalid),
                     result.block_last.eq(meta_out.block_last),
                     result.row_last.eq(meta_out.row_last), result.last.eq(meta_out.last)]

        # -- output FIFO ------------------------------------------------------------------------
        m.submodules.out = out = fifo.SyncFIFOBuffered(width=result.shape().size, depth=OF)
        m.d.comb += [out.w_data.eq(result), out.w_en.eq(valid[-1]),
                     q.payload.eq(out.r_data), q.valid.eq(out.r_rdy), out.r_en.eq(q.ready)]
        done = q.valid & q.ready
        m.d.sync += reserved.eq(reserved + fire - done)
        m.d.comb += busy.eq(w_run | r_run | (reserved != 0))
        return m
