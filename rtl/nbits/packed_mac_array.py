"""MatMulNBits v2 integer MAC array: exact int8 x nibble block sums for a tile of rows, two MACs
per MULT18X18D (docs/matmul_nbits_v2.md, sections 1 and 3)."""

from __future__ import annotations

from amaranth.hdl import (
    Cat,
    Const,
    Module,
    Mux,
    Signal,
    signed,
    unsigned,
)
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from qaccel.model.config import M_TILES, MAX_BLOCK_SIZES, SIMD
from qaccel.model.config import PE as CONFIG_PE
from qaccel.model.validate import check_bool, check_int, check_int_choice
from qaccel.rtl.arith.block_fifo import BlockFifo
from qaccel.rtl.arith.ecp5 import registered_product
from qaccel.rtl.arith.pipeline import signed_width

__all__ = ["BLOCK_FIFO_MAX_PE", "PE", "SHIFT", "PackedMacArray", "acc_width", "latency"]

#: Legal ``pe`` (output columns; even): the configuration's :data:`~qaccel.model.config.PE`
#: from 2.
PE = range(2, CONFIG_PE.stop)
#: Bit position of the second nibble in a multiplier's packed operand ``n0 + n1 * 2 ** SHIFT``.
SHIFT = 12
#: Widest array whose output FIFO is in block RAM (above: LUT RAM).
BLOCK_FIFO_MAX_PE = 64
#: Bits of one nibble product ``qa * n`` (``-1920 .. 1905``), signed: exactly ``SHIFT``.
PRODUCT_WIDTH = 12
#: Bits of a packed product ``qa * (n0 + n1 * 2 ** SHIFT)`` (``|P| <= 128 * 61455``), signed.
PACKED_WIDTH = SHIFT + PRODUCT_WIDTH


def acc_width(max_block: int) -> int:
    """Bits of an accumulator and of each ``isum`` (signed) for blocks of up to ``max_block``
    elements: ``log2(max_block) + 12``."""
    return signed_width(-128 * 15 * max_block, 127 * 15 * max_block)


def latency(*, simd: int, lut_pairs: bool) -> int:
    """Cycles from the transfer of a block's last beat to its ``o`` beat being offered (no
    back-pressure): the pre-stages (2, or 3 with LUT multipliers), ``log2(simd)`` adder-tree
    stages, and 3 (:attr:`PackedMacArray.latency`, computed without building the array)."""
    return (3 if lut_pairs else 2) + simd.bit_length() - 1 + 3


class PackedMacArray(wiring.Component):
    """Exact integer block sums of int8 activations against 4-bit weight nibbles, for a tile
    of rows that share each weight step, with two MACs per 18 x 18 multiplier.

    For row ``r`` of the tile, column ``p`` and one K-block, the unit emits
    ``isum[r][p] = sum_k qa[r][k] * q[p][k]`` exactly, with ``qa`` the int8 activations
    (-128 .. 127) and ``q[p][k] = w[p][s]`` the 4-bit unsigned nibble (0 .. 15) of column
    ``p``: the ``isum`` of the int8 path of docs/matmul_nbits_v2.md, section 1 (``asum`` and
    the zero points are not computed here). Codes of 2 to 4 bits are the nibbles themselves.
    Codes of 5 to 8 bits take two columns: the caller puts a code's low nibble in one column
    and its high nibble in another and combines the two sums as ``lo + 16 * hi`` downstream
    (the v2 engine does it in its scale lanes); this unit has no mode and never combines
    columns.

    Multipliers: slot ``(j, s)`` (pair ``j < pe / 2``, lane ``s < simd``, index
    ``j * simd + s``) takes ``n0 = w[2j][s]``, ``n1 = w[2j+1][s]`` and ``qa[s]`` and yields
    ``qa * n0`` and ``qa * n1`` (each in ``-1920 .. 1905``, 12 bits signed). Slots with
    index below ``dsp_pairs`` compute one product ``P = qa * (n0 + n1 * 2 ** 12)``
    (8-bit signed times a 16-bit non-negative operand: one MULT18X18D on ECP5; :data:`SHIFT`
    ``= 12``, the fewest bits that hold ``qa * n0`` exactly), registered, and split it:
    ``qa * n0`` is ``P``'s low 12 bits sign-extended, ``qa * n1`` is ``(P >> 12) + P[11]``
    (the arithmetic shift borrows 1 when the low product is negative). The other slots are
    LUT multipliers: each nibble product is ``d0 * qa + 4 * d1 * qa`` with ``d0, d1`` the
    nibble's 2-bit digits, each digit product a 4-way choice of ``0, qa, 2 * qa, 3 * qa``
    (``3 * qa`` formed once per lane), then one add: no ``*``, so Yosys cannot put them on a
    DSP. Column ``2j`` sums the ``qa * n0`` of pair ``j``, column ``2j + 1`` its ``qa * n1``.

    Input ``i``: one beat per (K step, row): ``simd`` activations of row ``row``, the
    ``pe x simd`` nibbles of the step (held by the feed for the tile's rows), ``first`` (the
    block's first step for this row: its accumulator restarts) and ``last`` (the block's last
    step for this row: its sum is emitted). A block is 1 to ``max_block / simd`` steps; rows
    may interleave in any order, each row's beats in K order. Lanes past the block's end must
    carry ``qa = 0``. ``row`` must be below ``rows`` (a beat with another row updates no
    accumulator, its result if any is undefined) and a row's first beat after a reset must
    have ``first`` set (the accumulators are not reset).

    Output ``o``: one beat per (row, block), in the order of the ``last`` beats, with the
    block's ``row``.

    Widths: the accumulators and each ``isum`` are :attr:`acc_width`
    ``= log2(max_block) + 12`` bits signed, which holds ``[-128, 127] * 15 * max_block``
    (``[-1920, 1905] * max_block``) exactly. Longer blocks may wrap.

    Pipeline (one level of logic per stage, the multipliers alone excepted): stage 1 the
    operands (DSP slots: ``qa`` and the nibbles, inside the MULT18X18D with ``ecp5``; LUT
    slots: the nibbles, and ``3 * qa`` per lane), stage 2 the packed products (DSP) / the
    digit products (LUT), and with LUT slots a stage 3: their add (a delay for the DSP
    products); :attr:`pre_stages` is 2 (all slots on DSPs) or 3. The split needs no stage:
    its low part is wiring and its borrow bit ``P[11]`` enters one of column ``2j + 1``'s
    adders as the carry-in (free on the carry chain; a column has as many adders, ``simd - 1``
    in its tree and the accumulator's, as borrow bits). Then one balanced adder tree per
    column over the ``simd`` lanes with a register after every level (:attr:`tree_stages`
    ``= log2(simd)``; the first level's inputs come out of the DSP blocks, about 2 ns of
    routing, so two chained carry chains there missed 150 MHz). Then the accumulators: per
    group of up to 4 columns (up to 12 groups) a LUT RAM with a word per row and one more
    that is never written and stays 0: a ``first`` beat reads that word instead of its row's,
    the choice made at the input, so no logic sits between the asynchronous read and the
    adders (registers and a ``first`` multiplexer when ``rows == 1``); each group has its own
    copy of the read address register, which would otherwise fan out to every RAM cell. The
    word is read, added to the step's sums and written back in the same cycle, so a row's
    next step may follow in the very next cycle. ``rows = 16`` needs 17 words: a second RAM
    bank and a multiplexer in that loop. On ``last`` the sums are registered and written
    as they are into the output FIFO: :class:`~qaccel.rtl.arith.block_fifo.BlockFifo` (block RAM)
    up to :data:`BLOCK_FIFO_MAX_PE` columns (or as ``block_fifo`` says),
    :class:`~amaranth.lib.fifo.SyncFIFO` (LUT RAM read unregistered, behind a second result
    register: the same cycles, and no enable of a register as wide as the word) above, where a
    FIFO of ``pe * acc_width`` bits would take more than 36 DP16KD spread over the part's
    block-RAM rows, which nextpnr could not route around on the LFE5U-85F (``pe = 128``: 72
    DP16KD; router2's overuse grew from its 11th iteration, against convergence with the
    LUT-RAM FIFO). ``block_fifo`` True / False chooses block / LUT RAM whatever ``pe``.

    DSP mapping: each DSP slot is :func:`qaccel.rtl.arith.ecp5.registered_product`. With
    ``ecp5=False`` (default) the packed product is a ``*`` between two registers, which
    Yosys's ``synth_ecp5`` maps to exactly one MULT18X18D per slot, but unregistered (Yosys
    does not absorb registers into ECP5 DSPs): about 130 MHz on LFE5U-25F speed 6, the DSP's
    own delay (3.9 ns) plus its routing in and out. ``ecp5=True`` instantiates the MULT18X18D
    with its A/B input registers and its output register (the same two cycles) for
    synthesis: 168-171 MHz for pe 8, simd 4, rows 4 (the accumulator loop critical: address
    register, LUT-RAM read, carry chain, LUT-RAM write). Amaranth's and Verilator's
    simulators have no MULT18X18D model: simulate with ``ecp5=False`` (the tests check the
    instances' wiring against it on Icarus with a model of the cell).

    Latency: :attr:`latency` ``= pre_stages + tree_stages + 3`` cycles from the transfer of a
    block's last beat to its ``o`` beat being offered, without back-pressure (the 3: the
    result register, the FIFO's memory and its output register, or in LUT RAM two result
    registers and the FIFO's memory read unregistered; the accumulator stage
    itself is combinational into the result register): ``5 + log2(simd)`` with all slots on
    DSPs, ``6 + log2(simd)`` with LUT multipliers (7 and 8 at simd 4).

    Throughput: one ``i`` beat per cycle, sustained with ``o.ready`` high, whatever the block
    length and row order (one-step blocks included). Flow control is a credit counter: a beat
    is accepted only while fewer than :attr:`fifo_depth` blocks are between the transfer of
    their last beat and the transfer of their ``o`` beat, so back-pressure on ``o`` stalls
    ``i`` without losing or duplicating anything; ``fifo_depth`` (a power of two
    ``> latency + 1``) is deep enough that the credit never runs out while ``o.ready`` is
    high. ``i.ready`` depends on registers only. A synchronous reset drops everything in
    flight: open blocks, blocks in the pipeline and results in the FIFO.

    Parameters
    ----------
    pe : :class:`int`
        Output columns, even, 2 to 128.
    simd : :class:`int`
        K elements per step, one of :data:`qaccel.model.config.SIMD`.
    rows : :class:`int`
        Largest row tile (accumulators per column), 1 to 16.
    max_block : :class:`int`
        Largest block in elements, a power of two from 16 to 1024 (default 256).
    dsp_pairs : :class:`int` or None
        Multiplier slots built as one multiplier each (for MULT18X18D), 0 to
        ``pe / 2 * simd`` (default: all); the others are LUT multipliers.
    ecp5 : :class:`bool`
        Instantiate the ECP5 primitives this unit has a variant for: the DSP slots as
        registered MULT18X18D cells (synthesis only; default False: a behavioural ``*`` of
        the same timing, which simulation needs).

    Raises
    ------
    :exc:`TypeError`, :exc:`ValueError`
        If a parameter is not an integer or out of range; the message names it.

    Members
    -------
    i : :py:`In(stream.Signature(StructLayout({"qa": ArrayLayout(signed(8), simd),
        "w": ArrayLayout(ArrayLayout(unsigned(4), simd), pe), "row": unsigned(row_width),
        "first": 1, "last": 1})))`
        One (K step, row): ``qa[s]`` lane ``s``'s activation, ``w[p][s]`` nibble of column
        ``p``, lane ``s``.
    o : :py:`Out(stream.Signature(StructLayout({"isum": ArrayLayout(signed(acc_width), pe),
        "row": unsigned(row_width)})))`
        One beat per (row, block): ``isum[p]`` column ``p``'s block sum.
    busy : :py:`Out(1)`
        Anything in flight: a row's block begun (its ``last`` beat not yet taken) or a
        block's result not yet transferred on ``o``.
    """

    def __init__(self, *, pe: int, simd: int, rows: int = 1, max_block: int = 256,
                 dsp_pairs: int | None = None, block_fifo: bool | None = None,
                 ecp5: bool = False):
        self._pe = check_int("pe", pe, PE.start, PE.stop - 1)
        if pe % 2:
            raise ValueError(f"pe must be even, not {pe}")
        self._simd = check_int_choice("simd", simd, SIMD)
        self._rows = check_int("rows", rows, M_TILES.start, M_TILES.stop - 1)
        lo, hi = MAX_BLOCK_SIZES.start, MAX_BLOCK_SIZES.stop - 1
        self._max_block = check_int("max_block", max_block, lo, hi)
        if max_block & (max_block - 1):
            raise ValueError(f"max_block must be a power of two in [{lo}, "
                             f"{hi}], not {max_block}")
        slots = pe // 2 * simd
        self._dsp_pairs = slots if dsp_pairs is None else check_int("dsp_pairs", dsp_pairs,
                                                                    0, slots)
        check_bool("ecp5", ecp5)
        self._ecp5 = ecp5
        if block_fifo is not None:
            check_bool("block_fifo", block_fifo)
        self._block_fifo = pe <= BLOCK_FIFO_MAX_PE if block_fifo is None else block_fifo
        self._levels = simd.bit_length() - 1
        self._acc_width = acc_width(max_block)
        self._row_width = max(1, (rows - 1).bit_length())
        self._fifo_depth = 1 << (self.latency + 1).bit_length()
        super().__init__({
            "i": In(stream.Signature(data.StructLayout({
                "qa": data.ArrayLayout(signed(8), simd),
                "w": data.ArrayLayout(data.ArrayLayout(unsigned(4), simd), pe),
                "row": unsigned(self._row_width), "first": unsigned(1),
                "last": unsigned(1)}))),
            "o": Out(stream.Signature(data.StructLayout({
                "isum": data.ArrayLayout(signed(self._acc_width), pe),
                "row": unsigned(self._row_width)}))),
            "busy": Out(1),
        })

    # -- contract numbers ----------------------------------------------------------------------

    @property
    def pe(self) -> int:
        """Output columns."""
        return self._pe

    @property
    def simd(self) -> int:
        """K elements per step."""
        return self._simd

    @property
    def rows(self) -> int:
        """Largest row tile."""
        return self._rows

    @property
    def max_block(self) -> int:
        """Largest block in elements."""
        return self._max_block

    @property
    def slots(self) -> int:
        """Multiplier slots, ``pe / 2 * simd`` (two MACs each)."""
        return self._pe // 2 * self._simd

    @property
    def dsp_pairs(self) -> int:
        """Slots built as one multiplier each (the first ``dsp_pairs`` slot indices)."""
        return self._dsp_pairs

    @property
    def lut_pairs(self) -> int:
        """Slots built as LUT multipliers."""
        return self.slots - self._dsp_pairs

    @property
    def row_width(self) -> int:
        """Bits of ``row``: ``max(1, ceil(log2(rows)))``."""
        return self._row_width

    @property
    def acc_width(self) -> int:
        """Bits of an accumulator and of each ``isum`` (signed): ``log2(max_block) + 12``."""
        return self._acc_width

    @property
    def ecp5(self) -> bool:
        """Whether the DSP slots are MULT18X18D instances (synthesis for ECP5 only)."""
        return self._ecp5

    @property
    def pre_stages(self) -> int:
        """Register stages from the input to the adder trees' leaves: 2, or 3 with LUT
        multipliers."""
        return self.latency - self.tree_stages - 3

    @property
    def tree_stages(self) -> int:
        """Register stages of the adder trees: ``log2(simd)`` (one per level)."""
        return self._levels

    @property
    def latency(self) -> int:
        """Cycles from the transfer of a block's last beat to its ``o`` beat being offered
        (no back-pressure): ``pre_stages + tree_stages + 3`` (:func:`latency`)."""
        return latency(simd=self._simd, lut_pairs=self.lut_pairs > 0)

    @property
    def fifo_depth(self) -> int:
        """Blocks the output FIFO holds (the credit limit): the least power of two
        ``> latency + 1``."""
        return self._fifo_depth

    # -- hardware ------------------------------------------------------------------------------

    def _tree(self, m: Module, leaves: list, carries: list, name: str):
        """Sum ``leaves`` and the 1-bit ``carries`` (all valid in the same cycle): pairwise,
        level by level, each adder also taking one carry as its carry-in (free on a carry
        chain), with a register after every level. Return the root (the leaf itself when
        there is one) and the carries left over (at most one, for the accumulator's adder),
        both valid in the root's cycle."""
        level, carries = leaves, list(carries)
        for lv in range(1, self._levels + 1):
            sums, delayed = [], []
            for k in range(len(level) // 2):
                s = level[2 * k] + level[2 * k + 1]
                s = s + carries.pop() if carries else s
                r = Signal(s.shape(), name=f"{name}_l{lv}_{k}", reset_less=True)
                m.d.sync += r.eq(s)
                sums.append(r)
            for k, c in enumerate(carries):
                r = Signal(name=f"{name}_l{lv}_c{k}", reset_less=True)
                m.d.sync += r.eq(c)
                delayed.append(r)
            level, carries = sums, delayed
        assert len(carries) <= 1
        return level[0], carries

    def _groups(self) -> list[range]:
        """Columns of each accumulator group: at most 4 per group while there are at most
        12 groups (the register variants that Yosys does not merge)."""
        n = min(12, -(-self._pe // 4))
        size = -(-self._pe // n)
        return [range(g * size, min(self._pe, (g + 1) * size))
                for g in range(-(-self._pe // size))]

    @staticmethod
    def _digit(m: Module, d, qa, qa3, name: str) -> Signal:
        """Register ``d * qa`` for a 2-bit digit ``d``: a choice of 0, qa, 2 qa, 3 qa."""
        r = Signal(signed(10), name=name, reset_less=True)
        with m.Switch(d):
            with m.Case(0):
                m.d.sync += r.eq(0)
            with m.Case(1):
                m.d.sync += r.eq(qa)
            with m.Case(2):
                m.d.sync += r.eq(qa << 1)
            with m.Case(3):
                m.d.sync += r.eq(qa3)
        return r

    def elaborate(self, platform):
        m = Module()
        P, S, R = self._pe, self._simd, self._rows
        i, o = self.i, self.o
        depth = self._fifo_depth
        width = o.payload.shape().size
        m.submodules.fifo = out_fifo = (
            BlockFifo(width=width, depth=depth, ecp5=self._ecp5) if self._block_fifo
            else SyncFIFO(width=width, depth=depth))

        # -- admission within the credit -------------------------------------------------------
        reserved = Signal(range(depth + 1))     # blocks whose last beat is in, o not yet out
        fire = Signal()
        m.d.comb += [i.ready.eq(reserved < depth), fire.eq(i.valid & i.ready)]

        # -- beat flags, through the pre stages and the tree stages -------------------------------
        # ``read``: the accumulator word the beat adds to, row ``R`` (always 0) on ``first``;
        # ``write``: a beat with a legal row (a bad row never overwrites word R)
        flag_layout = data.StructLayout({"valid": 1, "write": 1, "first": 1, "last": 1,
                                         "row": unsigned(self._row_width),
                                         "read": range(R + 1)})
        stages = self.pre_stages + self.tree_stages
        flags = [Signal(flag_layout, name=f"flags_{k}") for k in range(stages)]
        m.d.sync += [flags[0].valid.eq(fire), flags[0].write.eq(fire & (i.payload.row < R)),
                     flags[0].first.eq(i.payload.first),
                     flags[0].last.eq(i.payload.last),
                     flags[0].row.eq(i.payload.row),
                     flags[0].read.eq(Mux(i.payload.first, R, i.payload.row))]
        for k in range(1, stages):
            m.d.sync += flags[k].eq(flags[k - 1])

        # -- multiplier slots: (qa * n0, qa * n1) per pair j and lane s ------------------------
        # stage 1: operands registered (inside the MULT18X18D with ecp5), 3 * qa per lane;
        # stage 2: the packed products / the LUT digit products; stage 3 (with LUT slots):
        # the LUT slots' add, a delay for the DSP slots
        qa_in, w_in = i.payload.qa, i.payload.w
        if self.lut_pairs:                      # lane operands for the LUT multipliers
            qa1 = [Signal(signed(8), name=f"qa1_{s}", reset_less=True) for s in range(S)]
            for s in range(S):
                m.d.sync += qa1[s].eq(qa_in[s])
            qa3 = [Signal(signed(10), name=f"qa3_{s}", reset_less=True) for s in range(S)]
            for s in range(S):
                m.d.sync += qa3[s].eq(qa_in[s] + (qa_in[s] << 1))
        lo = [[] for _ in range(P // 2)]        # per pair: qa * n0 of each lane
        hi = [[] for _ in range(P // 2)]        # per pair: qa * n1, or its floor part ...
        borrow = [[] for _ in range(P // 2)]    # ... and the bit that completes it
        for j in range(P // 2):
            for s in range(S):
                n0, n1 = w_in[2 * j][s], w_in[2 * j + 1][s]
                name = f"_{j}_{s}"
                if j * S + s < self._dsp_pairs:
                    # one multiplier: 8-bit signed x 16-bit non-negative, registered in and out
                    # (the operand zero-extended to 17 bits signed: both SIGNED pins high)
                    op = Cat(n0, Const(0, SHIFT - 4), n1, Const(0, 1)).as_signed()
                    packed = registered_product(m, qa_in[s], op, ecp5=self._ecp5,
                                                name=f"mult{name}")[:PACKED_WIDTH].as_signed()
                    if self.lut_pairs:          # line up with the LUT slots' add
                        late = Signal(signed(PACKED_WIDTH), name=f"late{name}",
                                      reset_less=True)
                        m.d.sync += late.eq(packed)
                        packed = late
                    # the split: qa * n1 = (P >> 12) + P[11], the bit added in the tree
                    lo[j].append(packed[:SHIFT].as_signed())
                    hi[j].append(packed[SHIFT:].as_signed())
                    borrow[j].append(packed[SHIFT - 1])
                else:
                    # LUT multiplier: two 2-bit digit products per nibble, then one add
                    nib = Signal(8, name=f"nib{name}", reset_less=True)
                    m.d.sync += nib.eq(Cat(n0, n1))
                    parts = [self._digit(m, nib[2 * d:2 * d + 2], qa1[s], qa3[s],
                                         f"digit{name}_{d}") for d in range(4)]
                    lo3 = Signal(signed(PRODUCT_WIDTH), name=f"lo{name}", reset_less=True)
                    hi3 = Signal(signed(PRODUCT_WIDTH), name=f"hi{name}", reset_less=True)
                    m.d.sync += [lo3.eq(parts[0] + (parts[1] << 2)),
                                 hi3.eq(parts[2] + (parts[3] << 2))]
                    lo[j].append(lo3)
                    hi[j].append(hi3)

        # -- adder trees: column 2j sums pair j's qa * n0, column 2j + 1 its qa * n1 -----------
        step, carry = [], []
        for p in range(P):
            if p % 2 == 0:
                root, left = self._tree(m, lo[p // 2], [], f"col{p}")
            else:
                root, left = self._tree(m, hi[p // 2], borrow[p // 2], f"col{p}")
            step.append(root)
            carry.append(left[0] if left else Const(0, 1))

        # -- accumulators: read, add, write back in one cycle --------------------------------
        # LUT RAM, one memory per group of columns; the row a beat adds to (a word that is
        # never written and stays 0 on ``first``) is chosen at the input, so no logic sits
        # between the asynchronous read and the adders; registers for R = 1. Each group has
        # its own copy of the read address (of ``first`` for R = 1): one register for all
        # columns fans out to pe * acc_width / 4 RAM cells, and at pe 32 its routing alone
        # took 2.7 ns (2.3 ns with groups of 8 columns, 1.9 ns with groups of 4). Yosys
        # merges equal registers, so the copies differ in form: stored inverted or not (the
        # group's memory then holds row r at word ~r), with or without a clock enable, with
        # no reset, reset to 0 or to 1 (all harmless: the address only matters with a valid
        # beat).
        f, prev = flags[-1], flags[-2]
        acc_shape = data.ArrayLayout(signed(self._acc_width), P)
        total = Signal(acc_shape)

        def copy(value, width: int, g: int, name: str) -> Signal:
            inverted, enabled, reset = g % 2, (g // 2) % 2, g // 4
            ones = (1 << width) - 1
            r = Signal(width, name=name, reset_less=not reset, init=ones if reset == 2 else 0)
            d = value ^ ones if inverted else value
            if enabled:
                with m.If(prev.valid):
                    m.d.sync += r.eq(d)
            else:
                m.d.sync += r.eq(d)
            return r

        aw = R.bit_length()                      # address bits of words 0 .. R
        row_inv = Signal(aw, name="row_inv", reset_less=True)
        m.d.sync += row_inv.eq(prev.row ^ ((1 << aw) - 1))
        for g, cols in enumerate(self._groups()):
            if R == 1:
                sel = copy(prev.first, 1, g, f"first_g{g}")
                acc = Signal(data.ArrayLayout(signed(self._acc_width), len(cols)),
                             name=f"acc_g{g}")
                with m.If(f.write):
                    m.d.sync += [acc[k].eq(total[p]) for k, p in enumerate(cols)]
                for k, p in enumerate(cols):
                    base = Mux(sel, acc[k], 0) if g % 2 else Mux(sel, 0, acc[k])
                    m.d.comb += total[p].eq(base + step[p] + carry[p])
            else:
                mem = Memory(shape=data.ArrayLayout(signed(self._acc_width), len(cols)),
                             depth=1 << aw, init=[[0] * len(cols)] * (1 << aw))
                m.submodules[f"acc_g{g}"] = mem
                rd = mem.read_port(domain="comb")
                wr = mem.write_port()
                m.d.comb += [rd.addr.eq(copy(prev.read, aw, g, f"read_g{g}")),
                             wr.addr.eq(row_inv if g % 2 else f.row), wr.en.eq(f.write)]
                for k, p in enumerate(cols):
                    m.d.comb += [total[p].eq(rd.data[k] + step[p] + carry[p]),
                                 wr.data[k].eq(total[p])]

        # -- results: registered on last, into the FIFO as they are ------------------------------
        res = Signal(acc_shape, reset_less=True)
        res_valid = Signal()
        res_row = Signal(self._row_width, reset_less=True)
        m.d.sync += [res.eq(total), res_row.eq(f.row), res_valid.eq(f.valid & f.last)]
        result = Signal(o.payload.shape())
        m.d.comb += [result.isum.eq(res), result.row.eq(res_row)]

        # -- output FIFO and credits ------------------------------------------------------------
        if not self._block_fifo:        # (the LUT RAM's read is unregistered: one more stage)
            result2 = Signal(o.payload.shape(), reset_less=True)
            res_valid2 = Signal()
            m.d.sync += [result2.eq(result), res_valid2.eq(res_valid)]
            result, res_valid = result2, res_valid2
        m.d.comb += [out_fifo.w_data.eq(result), out_fifo.w_en.eq(res_valid),
                     o.payload.eq(out_fifo.r_data), o.valid.eq(out_fifo.r_rdy),
                     out_fifo.r_en.eq(o.ready)]
        taken = Signal()
        m.d.comb += taken.eq(fire & i.payload.last)
        done = o.valid & o.ready
        with m.If(taken & ~done):
            m.d.sync += reserved.eq(reserved + 1)
        with m.Elif(done & ~taken):
            m.d.sync += reserved.eq(reserved - 1)

        open_rows = Signal(R)                    # rows with an unfinished block accepted
        with m.If(fire):
            m.d.sync += open_rows.bit_select(i.payload.row, 1).eq(~i.payload.last)
        m.d.comb += self.busy.eq((open_rows != 0) | (reserved != 0))
        return m
