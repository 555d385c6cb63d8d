"""MatMulNBits int8 x intN MAC array: per K-block, ``pe`` exact dot products of int8 activations
with raw unsigned weight codes, and the activations' sum (the CompInt8 path, accuracy_level 4)."""

from __future__ import annotations

from amaranth.hdl import Module, Signal, signed, unsigned
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.validate import check_int, check_int_choice

__all__ = ["MAX_BLOCK", "PE", "SIMD", "MacArray", "signed_width"]

#: Elements per input beat :class:`MacArray` supports.
SIMD = (1, 2, 4, 8, 16)
#: Legal ``pe`` (output columns in parallel).
PE = range(1, 65)
#: Legal ``max_block`` (powers of two).
MAX_BLOCK = range(16, 65537)


def signed_width(lo: int, hi: int) -> int:
    """Return the fewest bits of a two's complement value holding every integer in
    ``[lo, hi]`` (``lo <= 0 <= hi``)."""
    w = 1
    while not (-(1 << (w - 1)) <= lo and hi <= (1 << (w - 1)) - 1):
        w += 1
    return w


class MacArray(wiring.Component):
    """Block sums of an int8 activation row against ``pe`` columns of raw weight codes.

    For each K-block, with ``qa[k]`` the int8 activations and ``q[p][k]`` the raw unsigned
    weight codes (0 to 255) of column ``p``, the unit emits ``isum[p] = sum_k qa[k] * q[p][k]``
    for every ``p < pe`` and ``asum = sum_k qa[k]``, exactly: the integer terms of ONNX
    Runtime's CompInt8 path (see :mod:`qaccel.model.nbits_hw`, the int8 path).

    A block arrives as beats, ``simd`` consecutive K elements per beat, on two streams that
    are consumed together: ``a`` (the activations, shared by the columns, with the
    ``block_last`` and ``last`` flags) and ``w`` (the same ``simd`` elements of each of the
    ``pe`` columns, ``w[p][j]``). Both are accepted in the same cycle, and only when both are
    valid (``a.ready`` and ``w.ready`` are one signal, ``a.valid & w.valid & credit``); one is
    never taken alone. Lanes past the block's end must carry ``qa = 0`` (their weights are
    then ignored). The beat with ``block_last`` ends the block; one ``o`` beat follows per
    block, in order, with ``last`` copied from that input beat (the engine sets it on a row's
    last block). A block may be any number of beats from one up to ``max_block / simd``;
    longer blocks may overflow the accumulators (they wrap).

    Widths (exact minima for blocks of up to ``max_block`` elements, ``qa`` in -128..127 and
    ``q`` in 0..255): ``isum`` is :attr:`isum_width` ``= log2(max_block) + 16`` bits signed
    (its range is ``[-32640, 32385] * max_block``; 24 bits at 256) and ``asum``
    :attr:`asum_width` ``= log2(max_block) + 8`` bits signed (``[-128, 127] * max_block``,
    which reaches ``-2 ** (asum_width - 1)`` exactly; 16 bits at 256).

    Pipeline: the products (``pe * simd`` signed 8 x unsigned 8 multipliers, 16-bit results
    in ``-32640 .. 32385``) are registered, then a balanced adder tree per column (and one for
    ``asum``) of ``log2(simd)`` levels with a register after every second level and after the
    last: :attr:`tree_stages` ``= ceil(log2(simd) / 2)`` stages (0 for ``simd = 1``). Then the
    block accumulator: one adder whose sum is written to the output FIFO on the block's last
    beat, the accumulator restarting at 0, so the next block's first beat is added in the very
    next cycle, without a bubble. No path has more than two adder levels (the multipliers
    alone excepted). The stages never stall: admission is the only flow control.

    Latency: :attr:`latency` ``= tree_stages + 3`` cycles from the transfer of a block's last
    beat to its ``o`` beat being offered, without back-pressure (product register, tree
    stages, FIFO write, FIFO output register).

    Throughput: one beat pair per cycle, sustained with ``o.ready`` high, whatever the block
    length (one-beat blocks included). Flow control is a credit counter: a beat pair is
    accepted only while fewer than :attr:`fifo_depth` blocks are between acceptance of their
    last beat and the transfer of their ``o`` beat, so back-pressure on ``o`` stalls the
    inputs without losing or duplicating anything; the FIFO (``fifo_depth``, a power of two
    ``> latency + 1``) is deep enough that the credit never runs out while ``o.ready`` is high.
    ``a.ready`` / ``w.ready`` depend on both ``valid`` s (and registers), never on ``o.ready``
    combinationally. A synchronous reset drops everything in flight, an open block included.

    Parameters
    ----------
    pe : :class:`int`
        Output columns in parallel, 1 to 64.
    simd : :class:`int`
        K elements per beat, one of :data:`SIMD` (1 to 16, powers of two).
    max_block : :class:`int`
        Largest block in elements, a power of two from 16 to 65536 (default 256): sets the
        accumulator widths.

    Raises
    ------
    :exc:`TypeError`, :exc:`ValueError`
        If a parameter is not an integer or out of range; the message names it.

    Members
    -------
    a : :py:`In(stream.Signature(StructLayout({"qa": ArrayLayout(signed(8), simd),
        "block_last": 1, "last": 1})))`
        The activations, ``qa[j]`` element ``j`` of the beat.
    w : :py:`In(stream.Signature(ArrayLayout(ArrayLayout(unsigned(8), simd), pe)))`
        The raw weight codes, ``w[p][j]`` column ``p``, element ``j`` of the beat.
    o : :py:`Out(stream.Signature(StructLayout({"isum": ArrayLayout(signed(isum_width), pe),
        "asum": signed(asum_width), "last": 1})))`
        One beat per block.
    busy : :py:`Out(1)`
        Anything in flight: a block begun (beats accepted, its ``block_last`` beat not yet),
        or a block's result not yet transferred on ``o``.
    """

    def __init__(self, *, pe: int, simd: int, max_block: int = 256):
        self._pe = check_int("pe", pe, PE.start, PE.stop - 1)
        self._simd = check_int_choice("simd", simd, SIMD)
        self._max_block = check_int("max_block", max_block, MAX_BLOCK.start, MAX_BLOCK.stop - 1)
        if max_block & (max_block - 1):
            raise ValueError(f"max_block must be a power of two in [{MAX_BLOCK.start}, "
                             f"{MAX_BLOCK.stop - 1}], not {max_block}")
        self._levels = simd.bit_length() - 1
        self._isum_width = signed_width(-128 * 255 * max_block, 127 * 255 * max_block)
        self._asum_width = signed_width(-128 * max_block, 127 * max_block)
        self._fifo_depth = 1 << (self.latency + 1).bit_length()
        super().__init__({
            "a": In(stream.Signature(data.StructLayout({
                "qa": data.ArrayLayout(signed(8), simd), "block_last": unsigned(1),
                "last": unsigned(1)}))),
            "w": In(stream.Signature(data.ArrayLayout(data.ArrayLayout(unsigned(8), simd),
                                                      pe))),
            "o": Out(stream.Signature(data.StructLayout({
                "isum": data.ArrayLayout(signed(self._isum_width), pe),
                "asum": signed(self._asum_width), "last": unsigned(1)}))),
            "busy": Out(1),
        })

    @property
    def pe(self) -> int:
        """Output columns in parallel."""
        return self._pe

    @property
    def simd(self) -> int:
        """K elements per beat."""
        return self._simd

    @property
    def max_block(self) -> int:
        """Largest block in elements."""
        return self._max_block

    @property
    def isum_width(self) -> int:
        """Bits of each ``isum`` (signed): ``log2(max_block) + 16``."""
        return self._isum_width

    @property
    def asum_width(self) -> int:
        """Bits of ``asum`` (signed): ``log2(max_block) + 8``."""
        return self._asum_width

    @property
    def tree_stages(self) -> int:
        """Register stages of the adder trees: ``ceil(log2(simd) / 2)``."""
        return -(-self._levels // 2)

    @property
    def latency(self) -> int:
        """Cycles from the transfer of a block's last beat to its ``o`` beat being offered
        (no back-pressure): ``tree_stages + 3``."""
        return self.tree_stages + 3

    @property
    def fifo_depth(self) -> int:
        """Blocks the output FIFO holds (the credit limit)."""
        return self._fifo_depth

    def _tree(self, m: Module, leaves: list, name: str):
        """Sum ``leaves`` pairwise, level by level, registering after every second level and
        after the last; return the root (the leaf itself when there is one)."""
        level = leaves
        for lv in range(1, self._levels + 1):
            sums = [level[2 * k] + level[2 * k + 1] for k in range(len(level) // 2)]
            if lv % 2 == 0 or lv == self._levels:
                regs = []
                for k, s in enumerate(sums):
                    r = Signal(s.shape(), name=f"{name}_l{lv}_{k}", reset_less=True)
                    m.d.sync += r.eq(s)
                    regs.append(r)
                sums = regs
            level = sums
        return level[0]

    def elaborate(self, platform):
        m = Module()
        P, S = self._pe, self._simd
        a, w, o = self.a, self.w, self.o
        depth = self._fifo_depth
        m.submodules.fifo = out_fifo = fifo.SyncFIFOBuffered(
            width=o.payload.shape().size, depth=depth)

        # -- admission: both streams together, within the credit --------------------------------
        reserved = Signal(range(depth + 1))     # blocks whose last beat is in, o not yet out
        fire = Signal()
        m.d.comb += [fire.eq(a.valid & w.valid & (reserved < depth)),
                     a.ready.eq(fire), w.ready.eq(fire)]

        # -- stage 1: products (and the activations, for asum) ---------------------------------
        stages = 1 + self.tree_stages            # register stages before the accumulator
        valid = Signal(stages)                   # shift registers of the beat's flags
        block_last = Signal(stages)
        last = Signal(stages)
        m.d.sync += [valid.eq((valid << 1) | fire),
                     block_last.eq((block_last << 1) | (fire & a.payload.block_last)),
                     last.eq((last << 1) | (fire & a.payload.last))]
        qa = [Signal(signed(8), name=f"qa_{j}", reset_less=True) for j in range(S)]
        prod = [[Signal(signed(16), name=f"prod_{p}_{j}", reset_less=True) for j in range(S)]
                for p in range(P)]
        for j in range(S):
            m.d.sync += qa[j].eq(a.payload.qa[j])
            for p in range(P):
                m.d.sync += prod[p][j].eq(a.payload.qa[j] * w.payload[p][j])

        # -- adder trees ------------------------------------------------------------------------
        beat_isum = [self._tree(m, prod[p], f"isum{p}") for p in range(P)]
        beat_asum = self._tree(m, qa, "asum")

        # -- block accumulators: the sum goes to the FIFO on block_last, then restarts at 0 ----
        acc_isum = [Signal(signed(self._isum_width), name=f"acc_isum{p}") for p in range(P)]
        acc_asum = Signal(signed(self._asum_width))
        result = Signal(o.payload.shape())
        m.d.comb += [result.asum.eq(acc_asum + beat_asum), result.last.eq(last[-1])]
        for p in range(P):
            m.d.comb += result.isum[p].eq(acc_isum[p] + beat_isum[p])
        with m.If(valid[-1]):
            with m.If(block_last[-1]):
                m.d.sync += [acc.eq(0) for acc in (*acc_isum, acc_asum)]
            with m.Else():
                m.d.sync += [acc_isum[p].eq(result.isum[p]) for p in range(P)]
                m.d.sync += acc_asum.eq(result.asum)

        # -- output FIFO and credits ------------------------------------------------------------
        m.d.comb += [out_fifo.w_data.eq(result), out_fifo.w_en.eq(valid[-1] & block_last[-1]),
                     o.payload.eq(out_fifo.r_data), o.valid.eq(out_fifo.r_rdy),
                     out_fifo.r_en.eq(o.ready)]
        taken = Signal()
        m.d.comb += taken.eq(fire & a.payload.block_last)
        done = o.valid & o.ready
        with m.If(taken & ~done):
            m.d.sync += reserved.eq(reserved + 1)
        with m.Elif(done & ~taken):
            m.d.sync += reserved.eq(reserved - 1)

        open_block = Signal()                    # beats of an unfinished block accepted
        with m.If(fire):
            m.d.sync += open_block.eq(~a.payload.block_last)
        m.d.comb += self.busy.eq(open_block | (reserved != 0))
        return m
