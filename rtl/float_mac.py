"""The MatMulNBits engine's float path MAC (accuracy levels 0..3): ORT's dequantisation,
``simd`` float32 products per column, per-lane partial sums, the lane tree and the bias."""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.validate import check_int, check_int_choice
from qaccel.rtl.binary32 import LATENCY, Binary32
from qaccel.rtl.pipeline import delay
from qaccel.rtl.row_accumulate import RowAccumulate

__all__ = ["SIMD", "FloatMac"]

#: Elements per input beat :class:`FloatMac` supports.
SIMD = (1, 2, 4, 8, 16)

_MUL, _ADD = LATENCY["mul"], LATENCY["add"]
#: Cycles of the product stage: q - zp to float32 (1), f32(qf * s), f32(. + nz), f32(a * w).
_FRONT = 1 + _MUL + _ADD + _MUL
_NEG_ZERO = 0x8000_0000
#: Rows in flight (last beat taken, y not yet transferred): depth of the bias and o FIFOs.
_ROWS = 16
_FIFO_LATENCY = 2                   # SyncFIFOBuffered: write to r_rdy on an empty queue


def _small_int_to_f32(m: Module, d, name: str) -> Signal:
    """float32 bits of the signed integer ``d`` (|d| <= 255), exactly; +0 for 0 (comb)."""
    out = Signal(32, name=name)
    mag = Signal(8, name=f"{name}_mag")
    m.d.comb += mag.eq(Mux(d < 0, -d, d))
    with m.If(mag == 0):
        m.d.comb += out.eq(0)
    for e in range(8):                                   # the highest set bit wins
        with m.If(mag[e:] == 1):
            m.d.comb += out.eq(Cat((mag << (23 - e))[:23], Const(127 + e, 8), d < 0))
    return out


class FloatMac(wiring.Component):
    """The float path of the engine for ``pe`` columns: ``y[p] = sum_k a[k] * w[p][k] +
    bias[p]`` in the order of :mod:`qaccel.model.nbits_hw` (``_float_path``, then the bias).

    A row arrives as beats of ``simd`` K elements; beat ``t`` of the row (counted from 0)
    carries ``a[j]`` (float32 bits), ``mask`` (bit ``j``: lane ``j`` holds an element), for
    each column ``p`` the raw codes ``q[p][j]``, the float32 ``scale[p]`` and the zero point
    ``zero[p]`` of that element's block, and on the row's last beat (``row_last``) the
    float32 ``bias[p]`` (+0 or -0 when there is none). Per column ``p`` and lane ``j``:

    - ``w = f32(f32(q - zero) * scale)`` when ``zp_float`` is 0 (``zero`` an integer code,
      0..255, in its low 8 bits; ``q - zero`` is exact), ``w = f32(f32(q * scale) +
      f32(-scale * zero))`` when it is 1 (``zero`` float32 bits): ORT's dequantisation, as
      :func:`~qaccel.model.nbits.dequantize_nbits` does it;
    - the product ``f32(a * w)``, or +0 for a lane whose ``mask`` bit is 0 (the same as
      adding nothing: a partial sum starts at +0 and is never -0);
    - added to the lane's partial sum ``t % partial_sums``; at the row's end each lane is
      folded, ``((P[0] + P[1]) + P[2]) ...`` (a :class:`~qaccel.rtl.row_accumulate.
      RowAccumulate` per column, its bias +0: ``f32(fold + 0) == fold``), the lanes summed
      pairwise, level by level (``T[2i] + T[2i+1]``), and ``y = f32(total + bias)``.

    Every float operation is one :class:`~qaccel.rtl.binary32.Binary32` (the integer
    ``q - zero`` converted exactly), so ``y`` is bit-exact with NumPy float32 arithmetic,
    NaN payloads aside (NaNs are canonical).

    Flow: the product stage (:attr:`front_latency` = 20 cycles, no stall) writes a FIFO of
    :attr:`fifo_depth` beats that feeds the accumulators; a beat is taken on ``i`` only while
    fewer than :attr:`fifo_depth` beats are between ``i`` and the accumulators and fewer than
    16 rows between their last beat and ``o``. So back-pressure on ``o`` (a FIFO of 16 rows)
    stalls ``i`` without losing or duplicating anything, and ``i.ready`` depends on
    registers only, never on ``o.ready`` or ``i.valid``.

    Throughput: one beat per cycle, across rows too, with ``o.ready`` high, when
    ``partial_sums >= 8`` and every row has at least ``8 * partial_sums`` beats (64 at the
    default 8): the accumulators' limits (:class:`~qaccel.rtl.row_accumulate.RowAccumulate`).
    With fewer partial sums a row takes ``partial_sums`` beats per 8 cycles; shorter rows are
    taken at one per ``8 * partial_sums`` cycles on average.

    Latency: :attr:`latency` ``= 40 + 8 * partial_sums + 7 * log2(simd)`` cycles from the
    transfer of a row's last beat to its ``y`` offered (products 20, FIFO 2, accumulator
    ``9 + 8 * partial_sums``, lane tree ``7 * log2(simd)``, bias 7, o FIFO 2; 125 at ``simd
    = 8, partial_sums = 8``) when nothing waits: the accumulators take each beat as it
    arrives (``partial_sums >= 8``, or the row has at most ``partial_sums`` beats) and the
    previous rows' folds are done.

    Parameters
    ----------
    pe : int
        Output columns, 1..64.
    simd : int
        K elements per beat, one of :data:`SIMD`.
    partial_sums : int
        Partial sums per lane, 1..16.

    Raises
    ------
    :exc:`TypeError`, :exc:`ValueError`
        If a parameter is not an integer or out of range; the message names it.

    Members
    -------
    i : :py:`In(stream.Signature(StructLayout({"a": ArrayLayout(unsigned(32), simd), "mask":
        unsigned(simd), "q": ArrayLayout(ArrayLayout(unsigned(8), simd), pe), "scale":
        ArrayLayout(unsigned(32), pe), "zero": ArrayLayout(unsigned(32), pe), "bias":
        ArrayLayout(unsigned(32), pe), "row_last": 1})))`
    zp_float : :py:`In(1)`
        The zero points are float32 (1) or integer codes (0); held during a job.
    o : :py:`Out(stream.Signature(StructLayout({"y": ArrayLayout(unsigned(32), pe)})))`
        One beat per row.
    busy : :py:`Out(1)`
        A row begun, or a row's ``y`` not yet transferred.
    """

    def __init__(self, *, pe: int, simd: int, partial_sums: int):
        self._pe = check_int("pe", pe, 1, 64)
        self._simd = check_int_choice("simd", simd, SIMD)
        self._sums = check_int("partial_sums", partial_sums, 1, 16)
        self._levels = simd.bit_length() - 1
        words = data.ArrayLayout(unsigned(32), pe)
        super().__init__({
            "i": In(stream.Signature(data.StructLayout({
                "a": data.ArrayLayout(unsigned(32), simd),
                "mask": unsigned(simd),
                "q": data.ArrayLayout(data.ArrayLayout(unsigned(8), simd), pe),
                "scale": words,
                "zero": words,
                "bias": words,
                "row_last": unsigned(1)}))),
            "zp_float": In(1),
            "o": Out(stream.Signature(data.StructLayout({"y": words}))),
            "busy": Out(1),
        })

    @property
    def pe(self) -> int:
        return self._pe

    @property
    def simd(self) -> int:
        return self._simd

    @property
    def partial_sums(self) -> int:
        return self._sums

    @property
    def front_latency(self) -> int:
        """Cycles from a beat on ``i`` to its products: 20."""
        return _FRONT

    @property
    def fifo_depth(self) -> int:
        """Beats between ``i`` and the accumulators (the beat credit): ``front_latency + 3``,
        enough for one beat per cycle."""
        return _FRONT + _FIFO_LATENCY + 1

    @property
    def latency(self) -> int:
        """Cycles from the transfer of a row's last beat to its ``y`` offered, no stalls:
        ``40 + 8 * partial_sums + 7 * log2(simd)``."""
        acc = _ADD + 2 + (_ADD + 1) * self._sums          # RowAccumulate.latency
        return (_FRONT + _FIFO_LATENCY + acc + _ADD * self._levels + _ADD + _FIFO_LATENCY)

    def elaborate(self, platform):
        m = Module()
        P, S, L = self._pe, self._simd, self._sums
        i, o = self.i, self.o
        depth = self.fifo_depth

        # -- admission: beat and row credits ------------------------------------------------
        beats = Signal(range(depth + 1))   # beats taken on i, not yet by the accumulators
        rows = Signal(range(_ROWS + 1))    # rows whose last beat is taken, y not transferred
        take = Signal()
        m.d.comb += [i.ready.eq((beats < depth) & (rows < _ROWS)), take.eq(i.valid & i.ready)]

        # -- products: 20 cycles, no stall --------------------------------------------------
        zp_float = self.zp_float
        terms = Signal(data.ArrayLayout(unsigned(32), P * S))
        a_d = [delay(m, i.payload.a[j], 1 + _MUL + _ADD, f"a{j}") for j in range(S)]  # c + 14
        for p in range(P):
            scale = i.payload.scale[p]
            zero = i.payload.zero[p]
            nz = Binary32("mul")                                         # f32(-s * zp)
            m.submodules[f"nz{p}"] = nz
            m.d.comb += [nz.a.eq(Cat(scale[:31], ~scale[31])), nz.b.eq(zero)]
            nz_d = delay(m, nz.y, 1 + _MUL - nz.latency, f"nz{p}")       # to c + 7
            s_d = delay(m, scale, 1, f"s{p}")
            zsub = Mux(zp_float, 0, zero[:8])
            for j in range(S):
                d = Signal(signed(10), name=f"d{p}_{j}")
                m.d.comb += d.eq(i.payload.q[p][j] - zsub)
                qf = Signal(32, name=f"qf{p}_{j}", reset_less=True)       # c + 1
                m.d.sync += qf.eq(_small_int_to_f32(m, d, f"qfc{p}_{j}"))
                m1 = Binary32("mul")                                     # f32(qf * s), c + 7
                m.submodules[f"qs{p}_{j}"] = m1
                m.d.comb += [m1.a.eq(qf), m1.b.eq(s_d)]
                w = Binary32("add")                                      # w, c + 14
                m.submodules[f"w{p}_{j}"] = w
                m.d.comb += [w.a.eq(m1.y), w.b.eq(Mux(zp_float, nz_d, _NEG_ZERO))]
                prod = Binary32("mul")                                   # f32(a * w), c + 20
                m.submodules[f"aw{p}_{j}"] = prod
                m.d.comb += [prod.a.eq(a_d[j]), prod.b.eq(w.y)]
                m.d.comb += terms[p * S + j].eq(prod.y)
        mask = delay(m, i.payload.mask, _FRONT, "mask")
        row_last = delay(m, i.payload.row_last, _FRONT, "row_last")
        valid = Signal(_FRONT)
        m.d.sync += valid.eq((valid << 1) | take)

        # -- the beat FIFO and the accumulators (a RowAccumulate per column) ----------------
        beat = data.StructLayout({"t": data.ArrayLayout(unsigned(32), P * S), "row_last": 1})
        m.submodules.beats = bfifo = fifo.SyncFIFOBuffered(width=beat.size, depth=depth)
        w_beat = Signal(beat)
        for k in range(P * S):
            m.d.comb += w_beat.t[k].eq(Mux(mask[k % S], terms[k], 0))
        m.d.comb += [w_beat.row_last.eq(row_last), bfifo.w_data.eq(w_beat),
                     bfifo.w_en.eq(valid[-1])]
        r_beat = beat(bfifo.r_data)
        accs = []
        for p in range(P):
            ra = RowAccumulate(pe=S, partial_sums=L)
            m.submodules[f"acc{p}"] = ra
            accs.append(ra)
        # identical units fed identically: their ready signals are equal (registers only)
        all_ready = Signal()
        m.d.comb += all_ready.eq(Cat(ra.i.ready for ra in accs).all())
        for p, ra in enumerate(accs):
            m.d.comb += [ra.i.valid.eq(bfifo.r_rdy & all_ready),
                         ra.i.payload.row_last.eq(r_beat.row_last),
                         ra.o.ready.eq(1)]                 # room guaranteed by the row credit
            for j in range(S):
                m.d.comb += [ra.i.payload.t[j].eq(r_beat.t[p * S + j]),
                             ra.i.payload.bias[j].eq(0)]
        moved = Signal()
        m.d.comb += [moved.eq(bfifo.r_rdy & all_ready), bfifo.r_en.eq(moved)]

        # -- lane tree, bias, o FIFO --------------------------------------------------------
        m.submodules.bias = bias_fifo = fifo.SyncFIFOBuffered(width=32 * P, depth=_ROWS)
        m.d.comb += [bias_fifo.w_data.eq(i.payload.bias),
                     bias_fifo.w_en.eq(take & i.payload.row_last)]
        bias = data.ArrayLayout(unsigned(32), P)(bias_fifo.r_data)
        m.submodules.out = out_fifo = fifo.SyncFIFOBuffered(width=32 * P, depth=_ROWS)
        y = Signal(data.ArrayLayout(unsigned(32), P))
        for p, ra in enumerate(accs):
            level = [ra.o.payload.y[j] for j in range(S)]
            for lv in range(self._levels):
                nxt = []
                for k in range(len(level) // 2):
                    add = Binary32("add")
                    m.submodules[f"tree{p}_{lv}_{k}"] = add
                    m.d.comb += [add.a.eq(level[2 * k]), add.b.eq(level[2 * k + 1])]
                    nxt.append(add.y)
                level = nxt
            add = Binary32("add")
            m.submodules[f"bias{p}"] = add
            m.d.comb += [add.a.eq(level[0]), add.b.eq(bias[p]), y[p].eq(add.y)]
        tree = _ADD * self._levels
        tv = Signal(tree + _ADD)
        m.d.sync += tv.eq((tv << 1) | accs[0].o.valid)
        at_bias = tv[tree - 1] if tree else accs[0].o.valid
        m.d.comb += [bias_fifo.r_en.eq(at_bias),
                     out_fifo.w_data.eq(y), out_fifo.w_en.eq(tv[-1]),
                     o.payload.eq(out_fifo.r_data), o.valid.eq(out_fifo.r_rdy),
                     out_fifo.r_en.eq(o.ready)]

        # -- credits and busy ---------------------------------------------------------------
        m.d.sync += beats.eq(beats + take - moved)
        row_in = take & i.payload.row_last
        row_out = o.valid & o.ready
        m.d.sync += rows.eq(rows + row_in - row_out)
        open_row = Signal()
        with m.If(take):
            m.d.sync += open_row.eq(~i.payload.row_last)
        m.d.comb += self.busy.eq(open_row | (beats != 0) | (rows != 0))
        return m
