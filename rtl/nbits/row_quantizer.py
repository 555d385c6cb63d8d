"""MatMulNBits v2 activation quantiser: float32 rows, one element per cycle, to int8 blocks with a
float32 scale and the block's integer sum, as :func:`qaccel.model.nbits_kernels.quantize_a`; or
(``bfp=True``, ``fmode`` jobs) to block floating point in four int8 digit passes per block, as
:func:`qaccel.model.nbits_hw.float_operands`."""

from __future__ import annotations

from amaranth.hdl import (
    Array,
    Cat,
    Const,
    Module,
    Mux,
    Signal,
    signed,
    unsigned,
)
from amaranth.lib import data, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.config import ENGINE_COUNT_WIDTH, MAX_BLOCK_SIZES
from qaccel.model.validate import check_bool, check_int, check_int_choice
from qaccel.rtl.arith.ecp5 import DP16KD_DEPTH, dp16kd_sdp, product_24x24
from qaccel.rtl.arith.pipeline import delay

__all__ = ["BFP_LATENCY", "LATENCY", "MAX_BLOCKS", "RowQuantizer", "asum_width", "job_cycles",
           "q_beats"]

#: Values of ``max_block`` :class:`RowQuantizer` supports.
MAX_BLOCKS = tuple(b for b in MAX_BLOCK_SIZES if b & (b - 1) == 0)

K_WIDTH = ENGINE_COUNT_WIDTH  # width of the k and rows registers: the engine's
_F32_INF = 0x7F800000
_F32_QUIET = 0x00400000
_DIV_STEPS = 14               # radix-4 steps per division: 28 quotient bits
_DIV_PERIOD = _DIV_STEPS + 1  # divider occupancy per block: one load cycle and the steps
_AMAX_DEPTH = 2               # block maxima waiting for the divider
_SCALES = 4                   # scale entries (divided, not yet given on blk)
_LANE_LATENCY = 11            # reader fire -> the q FIFO written
_OUT_DEPTH = 16               # q FIFO entries (the reader's credit)
_FIFO_LATENCY = 2             # SyncFIFOBuffered: written in cycle c, offered in c + 2
# a transfer completing a block (cycle t) -> the reader's first fire of the block: W1, W2
# (the amax queue written in t + 1, popped in t + 2), load and steps, two rounding stages
_SCALE_LATENCY = 1 + 1 + _DIV_PERIOD + 2
# block floating point: W1, W2 (the pop in t + 2), the pop's registers, stage 1, stage 2
# writing the scale entry (t + 4): no divider
_BFP_SCALE_LATENCY = 1 + 1 + 1 + 1 + 1
_BFP_EMIN = 30                # E_MIN + 127: the smallest biased block exponent
_BFP_OFFSET = 0x808080        # X + this: the balanced base-256 digits as bytes


#: Cycles from the ``a`` transfer completing a block to the block's first ``q`` beat being
#: offered, without stalls (32; :attr:`RowQuantizer.latency`).
LATENCY = _SCALE_LATENCY + _LANE_LATENCY + _FIFO_LATENCY
#: :data:`LATENCY` of a block-floating-point job (18: no divider).
BFP_LATENCY = _BFP_SCALE_LATENCY + _LANE_LATENCY + _FIFO_LATENCY


def asum_width(max_block: int) -> int:
    """Width of ``blk.asum`` (signed) for blocks of up to ``max_block``:
    ``log2(max_block) + 9``."""
    return max_block.bit_length() - 1 + 9


def q_beats(k: int, rows: int, block_size: int, *, bfp: bool = False) -> int:
    """The ``q`` beats of a job: ``rows * ceil(k / block_size) * block_size``, four times
    that with ``bfp`` (:meth:`RowQuantizer.q_beats` without the checks)."""
    return rows * -(-k // block_size) * block_size * (4 if bfp else 1)


def job_cycles(k: int, rows: int, block_size: int, *, bfp: bool = False) -> int:
    """Cycles from the ``start`` pulse to the first cycle ``busy`` is low again
    (:meth:`RowQuantizer.job_cycles` without the checks, for the performance model)."""
    q = q_beats(k, rows, block_size, bfp=bfp)
    if bfp:
        return min(k, block_size) + BFP_LATENCY + q + 1
    return q + LATENCY + block_size + 1


class RowQuantizer(wiring.Component):
    """Quantise rows of float32 activations per K-block to symmetric int8, one element per
    cycle, bit-exact with :func:`qaccel.model.nbits_kernels.quantize_a` (ONNX Runtime's
    CompInt8 path), with the block sums the v2 engine needs.

    Per row and per block of ``block_size`` elements (the last block of a row zero-padded past
    ``k``): ``amax = max|a|`` (a NaN element makes amax that NaN, the last NaN wins; an
    infinity makes it inf unless a NaN is in the block), ``sa = f32(amax / 127)`` and
    ``inv = f32(127 / amax)`` (correctly rounded), ``qa = RNE(f32(a * inv))`` as int8, and
    ``asum = sum of the block's qa`` (exact). ``|qa| <= 127``.

    Blocks where ``f32(a * inv)`` is not finite give ``qa = 0`` (as ``quantize_a`` and ONNX
    Runtime): a NaN in the block (``sa`` is that NaN, sign cleared, made quiet, as x86
    division gives), an infinity (``sa = +inf``), or ``0 < amax < 127 / FLT_MAX`` (about
    3.7e-37, subnormals included: ``127 / amax`` overflows; ``sa = f32(amax / 127)``, tiny or
    0). An all-zero block gives ``qa = 0``, ``sa = 0``.

    A job: set ``block_size``, ``k`` and ``rows`` and pulse ``start`` while ``busy`` is low
    (a ``start`` while busy is ignored; a synchronous reset aborts a job and drops everything
    in flight). ``a`` then takes the ``rows`` rows back to back, ``k`` beats each (float32 bit
    patterns). ``q`` gives per row ``k_blocks * block_size`` beats (``k_blocks =
    ceil(k / block_size)``): the row's ``qa`` zero-padded to whole blocks, ``block_last`` on a
    block's final beat and ``row_last`` on a row's final beat. ``blk`` gives one beat per
    block: ``sa`` (the float32 code) and ``asum``. ``busy`` is high from ``start`` until the
    last ``q`` and ``blk`` beats are transferred.

    Order of ``q`` and ``blk``: the ``blk`` beat of a block is offered in the cycle after the
    transfer of the block's last ``q`` beat (``block_last``), so when it arrives every ``qa``
    of the block has been transferred. While a ``blk`` beat waits, ``q`` withholds the next
    block's last beat (its earlier beats still flow): a consumer must take ``blk`` without
    waiting for the end of the next block. ``q.valid`` and ``blk.valid`` depend on registers
    only; ``a.ready`` too.

    Registers: ``block_size`` a power of two, 16 .. ``max_block`` (any other value acts as
    ``max_block``); ``1 <= k < 2**22``, ``1 <= rows < 2**22``; ``k == 0`` or ``rows == 0`` is
    an empty job (no beat, ``busy`` stays low); ``fmode`` (with ``bfp``). They must be valid
    at ``start`` and hold while ``busy``.

    Rate: one element per cycle on ``a`` and on ``q``: in the steady state a block costs
    :meth:`cycles_per_block` cycles, ``max(block_size, 15)`` (the dividers take 15 cycles per
    block), i.e. ``block_size`` for every legal block size (16 and 32 included: no stall).
    A row with ``k`` not a multiple of ``block_size`` has more ``q`` beats than ``a`` beats
    and ``a`` waits for the padding. Latency: the first ``q`` beat of a block is offered
    :attr:`latency` cycles (32) after the ``a`` transfer completing the block, i.e.
    ``block_size - 1 + latency`` after its first ``a`` transfer, when nothing stalls and the
    reader is not still busy with earlier blocks.

    Block floating point (``bfp=True``; a job with the ``fmode`` register set), the float
    path of docs/matmul_nbits_v2.md (section 2), bit-exact with
    :func:`qaccel.model.nbits_hw.float_operands`: per row and block, ``e = floor(log2(max
    finite |a|))`` clamped below at -97 (zeros, subnormals only or no finite element: -97),
    ``X = trunc(a * 2**(29 - e))`` (0 for inf and NaN; ``|X| < 2**30``) as four balanced
    base-256 digits ``X = x0 + 2**8 x1 + 2**16 x2 + 2**24 x3`` (``x0..x2`` in [-128, 127],
    ``x3`` in [-64, 64]), digit scales ``sa_i = 2**(e - 29 + 8 i)`` (normal float32 codes;
    all four ``0x7FC00000``, NaN, if the block holds an inf or a NaN) and ``asum_i = sum of
    the block's x_i``. Per row and block, four passes ``i = 0..3`` each give the block's
    ``block_size`` ``q`` beats (``qa = x_i``, ``digit = i``, ``block_last`` on the pass's last
    beat, ``row_last`` only on the row's last block's pass 3) and one ``blk`` beat (``sa_i``,
    ``asum_i``), with the same ``q`` / ``blk`` order as above per pass. Int8 jobs run as
    above on the same unit (``digit = 0``). Rate: one ``q`` beat per cycle, so a block costs
    ``4 * block_size`` cycles (:meth:`cycles_per_block` with ``bfp``) and ``a`` takes a
    quarter of an element per cycle on average (it waits once the ring is full); latency
    :attr:`bfp_latency` (18) instead of 32, and from the first block on ``q`` runs back to
    back (:meth:`job_cycles`).

    Mechanism. Accepted elements are written to a ring buffer (one
    :class:`~amaranth.lib.memory.Memory` of :attr:`ring_depth` float32: two largest blocks,
    block RAM) while a register keeps the block's running amax. At the end of a block the
    amax goes through a two-entry queue to two iterative radix-4 restoring dividers working
    in lock step (one load cycle, 14 steps): ``N * 2**9 / 127`` (``N`` amax's integer
    significand; a 9-bit remainder) and ``127 * 2**43 / M`` (``M`` the 24-bit significand;
    three 26-bit subtractors against M, 2M and 3M), each giving 27 quotient bits and a
    remainder for the sticky bit; two rounding stages make ``sa`` (subnormal results
    included) and ``inv`` (24-bit significand and biased exponent; the block is killed, all
    ``qa = 0``, for amax 0, subnormal, inf, NaN or an ``inv`` that rounds to infinity). The
    scale entries live in a :attr:`scale_entries`-entry register file until the block's
    ``blk`` beat is given. A reader, once the block's scale is there, reads the block back
    (padding positions read nothing) through a pipeline of :attr:`lane_latency` stages:
    unpack (subnormal ``a`` normalised by up to 3 bits; smaller ones give 0), a 24 x 24-bit
    significand product (:func:`qaccel.rtl.arith.ecp5.product_24x24`: three MULT18X18D for 18x18,
    18x6 and 6x18, the 6x6 in LUTs), its parts' sum,
    rounding to float32 (24 bits, RNE), a right shift by 17..24 places to the integer with a
    round and a sticky bit, RNE, the sign. The results enter a :attr:`out_depth`-beat FIFO
    with credit flow control (back-pressure loses nothing); ``asum`` is accumulated as ``q``
    beats are transferred. Block floating point shares the ring, the writer (its running
    maximum skips inf and NaN, flagged beside it in the queue), the queue, the scale entries
    and the rounding's last stage (the pop loads its first stage with ``E = max(biased
    exponent, 30)`` and ``sa_0``'s field instead of dividing), the reader (it rewinds to the
    block's start for passes 1..3; the ring frees an element on pass 3), the lane's control,
    its significand product used as a shifter (``M`` times ``2**(23 - d)``, or ``2**(31 -
    d)`` for ``d > 23``, instead of ``inv``'s significand, with ``d = E - exp`` and 0 for
    ``X = 0``: ``|X| = floor(M * 2**(6 - d))`` is the product from bit 17 or 25 up), the
    FIFO and ``asum``; it adds ``Y = X + 0x808080`` (32 bits: byte ``i`` is ``x_i + 128``
    for ``i < 3``, the top byte ``x3``) and the pass's byte into the lane's last stage, and
    ``sa_i`` at the ``blk`` beat as ``sa_0`` plus ``i`` in its exponent's top five bits.
    With ``bfp=False`` none of this exists.

    Parameters
    ----------
    max_block : :class:`int`
        Largest run-time block size, one of :data:`MAX_BLOCKS` (a power of two, 16 to 1024;
        default 256).
    ecp5 : :class:`bool`
        Instantiate the ECP5 primitives this unit has a variant for (synthesis only; needs
        ``max_block <= 256``; simulation needs False, the default): the ring as one DP16KD
        (:func:`qaccel.rtl.arith.ecp5.dp16kd_sdp`) instead of a :class:`~amaranth.lib.memory.
        Memory` (Yosys puts a collision bypass multiplexer after an inferred block RAM, on
        the path from the RAM's slow clock-to-out, 5.8 ns in nextpnr's model: 119 -> 132
        MHz), and the product's three MULT18X18Ds as instances with their input and output
        registers.
    bfp : :class:`bool`
        Add the block-floating-point mode (the ``fmode`` register; default False).

    Raises
    ------
    :exc:`TypeError`, :exc:`ValueError`
        If ``max_block`` is not an integer or not one of :data:`MAX_BLOCKS`, ``bfp`` not a
        bool, or ``ecp5`` not a bool or set with ``max_block > 256``.

    Members
    -------
    block_size : :py:`In(unsigned(16))`
    k : :py:`In(unsigned(22))`
        Elements per row.
    rows : :py:`In(unsigned(22))`
    start : :py:`In(1)`
    a : :py:`In(stream.Signature(unsigned(32)))`
    q : :py:`Out(stream.Signature(StructLayout({"qa": signed(8), "block_last": 1,
        "row_last": 1, "digit": 2})))`
        ``digit``: the pass (block floating point), 0 in int8 jobs.
    blk : :py:`Out(stream.Signature(StructLayout({"sa": unsigned(32),
        "asum": signed(log2(max_block) + 9)})))`
    busy : :py:`Out(1)`
    fmode : :py:`In(1)`
        Only with ``bfp=True``: a register like ``k``, 1 for a block-floating-point job.
    """

    def __init__(self, *, max_block: int = 256, ecp5: bool = False, bfp: bool = False):
        self._max_block = check_int_choice("max_block", max_block, MAX_BLOCKS)
        check_bool("ecp5", ecp5)
        self._bfp = check_bool("bfp", bfp)
        if ecp5 and self.ring_depth > DP16KD_DEPTH:
            raise ValueError(f"ecp5 needs max_block <= 256 (the ring in one DP16KD), not "
                             f"{max_block}")
        self._ecp5 = ecp5
        self._asum_width = asum_width(max_block)
        members = {
            "block_size": In(unsigned(16)),
            "k": In(unsigned(K_WIDTH)),
            "rows": In(unsigned(K_WIDTH)),
            "start": In(1),
            "a": In(stream.Signature(unsigned(32))),
            "q": Out(stream.Signature(data.StructLayout({
                "qa": signed(8), "block_last": unsigned(1), "row_last": unsigned(1),
                "digit": unsigned(2)}))),
            "blk": Out(stream.Signature(data.StructLayout({
                "sa": unsigned(32), "asum": signed(self._asum_width)}))),
            "busy": Out(1),
        }
        if bfp:
            members["fmode"] = In(1)
        super().__init__(members)

    # -- contract ------------------------------------------------------------------------------

    @property
    def max_block(self) -> int:
        """Largest run-time block size."""
        return self._max_block

    @property
    def ecp5(self) -> bool:
        """Whether the ring and the multipliers are ECP5 primitives (synthesis only)."""
        return self._ecp5

    @property
    def asum_width(self) -> int:
        """Width of ``blk.asum`` (signed): ``log2(max_block) + 9``."""
        return self._asum_width

    @property
    def ring_depth(self) -> int:
        """Elements the input ring holds: ``2 * max_block`` (at least 64)."""
        return max(2 * self._max_block, 64)

    @property
    def scale_entries(self) -> int:
        """Blocks whose scale is held (divided, ``blk`` beat not yet transferred)."""
        return _SCALES

    @property
    def out_depth(self) -> int:
        """Beats of the ``q`` FIFO (the reader's credit)."""
        return _OUT_DEPTH

    @property
    def lane_latency(self) -> int:
        """Pipeline stages from the reader to the ``q`` FIFO."""
        return _LANE_LATENCY

    @property
    def divider_cycles(self) -> int:
        """Cycles the dividers are busy per block (15)."""
        return _DIV_PERIOD

    @property
    def latency(self) -> int:
        """Cycles from the ``a`` transfer completing a block to the block's first ``q`` beat
        being offered, without stalls (32)."""
        return LATENCY

    @property
    def bfp(self) -> bool:
        """Whether the unit has the block-floating-point mode (the ``fmode`` register)."""
        return self._bfp

    @property
    def bfp_latency(self) -> int:
        """:attr:`latency` of a block-floating-point job (18: no divider)."""
        return BFP_LATENCY

    def _block(self, block_size: int, bfp: bool) -> int:
        """Check a job's ``block_size`` and ``bfp`` (TypeError / ValueError naming them)."""
        bs = check_int("block_size", block_size, 16, self._max_block)
        if bs & (bs - 1):
            raise ValueError(f"block_size must be a power of two, not {bs}")
        if check_bool("bfp", bfp) and not self._bfp:
            raise ValueError("bfp=True needs a unit built with bfp=True")
        return bs

    def cycles_per_block(self, block_size: int, *, bfp: bool = False) -> int:
        """Steady-state cycles per block for a legal ``block_size`` (no pauses, ``k`` a
        multiple of it): ``max(block_size, 15)``, i.e. ``block_size``; ``4 * block_size``
        with ``bfp`` (one ``q`` beat per cycle, four digit passes per block)."""
        bs = self._block(block_size, bfp)
        return 4 * bs if bfp else max(bs, _DIV_PERIOD)

    def job_cycles(self, k: int, rows: int, block_size: int, *, bfp: bool = False) -> int:
        """Cycles from the ``start`` pulse to the first cycle ``busy`` is low again, for a
        non-empty job whose ``a`` beats never wait and whose outputs are taken at once: the
        padded rows at one element slot per cycle from the cycle after ``start`` (a padding
        slot costs a cycle like a real element), then the last block's :attr:`latency`, its
        ``block_size`` ``q`` beats and its ``blk`` beat. With ``bfp`` the ``q`` side sets the
        pace from the first block on: its ``min(k, block_size)`` ``a`` beats, then
        :attr:`bfp_latency`, every ``q`` beat back to back and the last ``blk`` beat."""
        self.q_beats(k, rows, block_size, bfp=bfp)                  # the checks
        return job_cycles(k, rows, block_size, bfp=bfp)

    def q_beats(self, k: int, rows: int, block_size: int, *, bfp: bool = False) -> int:
        """Return the ``q`` beats of a job: ``rows * ceil(k / block_size) * block_size``,
        four times that with ``bfp``."""
        k = check_int("k", k, 0, (1 << K_WIDTH) - 1)
        rows = check_int("rows", rows, 0, (1 << K_WIDTH) - 1)
        return q_beats(k, rows, self._block(block_size, bfp), bfp=bfp)

    def blk_beats(self, k: int, rows: int, block_size: int, *, bfp: bool = False) -> int:
        """Return the ``blk`` beats of a job: ``rows * ceil(k / block_size)``, four times
        that with ``bfp``."""
        return self.q_beats(k, rows, block_size, bfp=bfp) // block_size

    # -- hardware ------------------------------------------------------------------------------

    def elaborate(self, platform):
        m = Module()
        B = self._max_block
        R = self.ring_depth
        a, q, blk = self.a, self.q, self.blk

        # -- job registers ---------------------------------------------------------------------
        busy = Signal()
        go = Signal()
        m.d.comb += [go.eq(self.start & ~busy), self.busy.eq(busy)]
        bs_m1 = Signal(range(B))                           # block size - 1
        bs_in = Signal(range(B))
        m.d.comb += bs_in.eq(B - 1)
        with m.Switch(self.block_size):
            bs = 16
            while bs <= B:
                with m.Case(bs):
                    m.d.comb += bs_in.eq(bs - 1)
                bs *= 2
        job_ok = (self.k != 0) & (self.rows != 0)
        with m.If(go):
            m.d.sync += bs_m1.eq(bs_in)
        bfp = self._bfp
        if bfp:
            fm = Signal()                                  # the job is block floating point
            with m.If(go):
                m.d.sync += fm.eq(self.fmode)

        # -- ring buffer -------------------------------------------------------------------------
        if self._ecp5:
            # without the collision bypass Yosys adds after an inferred block RAM's read
            # data (the ring never reads a word in the cycle it is written)
            wr, rd = dp16kd_sdp(m, depth=R, width=32, name="ring")
        else:
            m.submodules.ring = ring = memory.Memory(shape=unsigned(32), depth=R, init=[])
            wr = ring.write_port()
            rd = ring.read_port()
        used = Signal(range(R + 1))                        # elements written, not yet read

        # -- writer ----------------------------------------------------------------------------
        w_run = Signal()
        w_left = Signal(K_WIDTH)                           # elements left in the row
        w_pos = Signal(range(B))                           # position in the block
        w_rows = Signal(K_WIDTH)
        wptr = Signal(range(R))
        credits = Signal(range(_AMAX_DEPTH + 1), init=_AMAX_DEPTH)
        m.d.comb += a.ready.eq(w_run & (used != R) & (credits != 0))
        accept = Signal()
        m.d.comb += accept.eq(a.valid & a.ready)
        # (the compares with the counters' ends are registers, set as the counters move)
        w_row_end = Signal()                               # w_left == 1
        w_last_row = Signal()                              # w_rows == 1
        w_end = Signal()                                   # the element completes a block
        m.d.comb += w_end.eq((w_pos == bs_m1) | w_row_end)
        m.d.comb += [wr.addr.eq(wptr), wr.data.eq(a.payload), wr.en.eq(accept)]
        k_r = Signal(K_WIDTH)
        with m.If(accept):
            m.d.sync += [wptr.eq(wptr + 1),                # R is a power of two
                         w_pos.eq(Mux(w_end, 0, w_pos + 1)),
                         w_left.eq(Mux(w_row_end, k_r, w_left - 1)),
                         w_row_end.eq(Mux(w_row_end, k_r == 1, w_left == 2))]
            with m.If(w_row_end):
                m.d.sync += [w_rows.eq(w_rows - 1), w_last_row.eq(w_rows == 2)]
                with m.If(w_last_row):
                    m.d.sync += w_run.eq(0)
        with m.If(go):
            m.d.sync += [w_run.eq(job_ok), w_left.eq(self.k), w_pos.eq(0),
                         w_rows.eq(self.rows), k_r.eq(self.k),
                         w_row_end.eq(self.k == 1), w_last_row.eq(self.rows == 1)]

        # -- running amax: W1 registers the magnitude, W2 combines ----------------------------
        w1_valid, w1_end = Signal(), Signal()
        w1_mag = Signal(31, reset_less=True)
        w1_nan = Signal(reset_less=True)
        m.d.sync += [w1_valid.eq(accept), w1_end.eq(accept & w_end),
                     w1_mag.eq(a.payload[:31]), w1_nan.eq(a.payload[:31] > _F32_INF)]
        acc = Signal(31)
        acc_nan = Signal()
        take = w1_nan | (~acc_nan & (w1_mag >= acc))       # quantize_a: v > amax or isnan(v)
        new = Signal(31)
        new_nan = Signal()
        if bfp:
            # block floating point: the largest finite magnitude (its exponent is the block's;
            # an inf or a NaN counts as 0, w1_nan stays low) and whether the block holds an inf
            # or a NaN (acc_nf), queued beside it
            w1_skip = Signal(reset_less=True)
            acc_nf = Signal()
            a_nf = a.payload[23:31] == 0xFF
            m.d.sync += [w1_nan.eq(~fm & (a.payload[:31] > _F32_INF)), w1_skip.eq(fm & a_nf)]
            with m.If(fm & a_nf):
                m.d.sync += w1_mag.eq(0)
            with m.If(w1_valid):
                m.d.sync += acc_nf.eq(~w1_end & (acc_nf | w1_skip))
        m.d.comb += [new.eq(Mux(take, w1_mag, acc)), new_nan.eq(Mux(take, w1_nan, acc_nan))]
        with m.If(w1_valid):
            m.d.sync += [acc.eq(Mux(w1_end, 0, new)), acc_nan.eq(~w1_end & new_nan)]

        m.submodules.amax_q = amax_q = fifo.SyncFIFO(width=32 if bfp else 31,
                                                     depth=_AMAX_DEPTH)
        if bfp:
            m.d.comb += amax_q.w_data.eq(Cat(new, acc_nf | w1_skip))
        else:
            m.d.comb += amax_q.w_data.eq(new)
        m.d.comb += amax_q.w_en.eq(w1_valid & w1_end)

        # -- dividers: sa = N * 2**9 / 127, inv = 127 * 2**43 / M, radix 4 --------------------
        # scale entries: written by the rounding stage, read by the reader (inv, kill) and
        # by the blk stage (sa); counters count blocks mod 2 * _SCALES
        SW = (2 * _SCALES - 1).bit_length()
        alloc = Signal(SW)                                 # divisions started
        s_wr = Signal(SW)                                  # scale entries written
        s_ret = Signal(SW)                                 # blk beats loaded (entries freed)
        e_sa = [Signal(32, name=f"e_sa{i}", reset_less=True) for i in range(_SCALES)]
        e_sig = [Signal(23, name=f"e_sig{i}", reset_less=True) for i in range(_SCALES)]
        e_exp = [Signal(8, name=f"e_exp{i}", reset_less=True) for i in range(_SCALES)]
        e_kill = [Signal(name=f"e_kill{i}", reset_less=True) for i in range(_SCALES)]

        d_run = Signal()                                   # stepping
        d_cnt = Signal(range(_DIV_STEPS))
        d_fin = Signal()                                   # the last step was last cycle
        d_amax = Signal(31, reset_less=True)
        d_m3 = Signal(26, reset_less=True)                 # 3 * M
        r_i = Signal(24, reset_less=True)                  # 127 / M remainder (< M)
        q_i = Signal(2 * _DIV_STEPS, reset_less=True)
        r_s = Signal(7, reset_less=True)                   # N / 127 remainder (< 127)
        q_s = Signal(2 * _DIV_STEPS, reset_less=True)
        ds = Signal(2 * _DIV_STEPS, reset_less=True)       # dividend bits left, MSB first

        pop = Signal()
        m.d.comb += pop.eq(~d_run & amax_q.r_rdy & ((alloc - s_ret)[:SW] < _SCALES))
        m.d.comb += amax_q.r_en.eq(pop)
        credit_back = pop
        m.d.sync += credits.eq(credits - (accept & w_end) + credit_back)

        pa = amax_q.r_data
        pa_m = Cat(pa[:23], 1)
        pa_n = Cat(pa[:23], pa[23:31] != 0)
        m.d.sync += d_fin.eq(d_run & (d_cnt == _DIV_STEPS - 1))
        with m.If(pop):
            m.d.sync += [d_amax.eq(pa), d_m3.eq(pa_m + (pa_m << 1)),
                         r_i.eq(127 << 15), q_i.eq(0),
                         r_s.eq(pa_n[19:24]), q_s.eq(0),
                         ds.eq(Cat(Const(0, 9), pa_n[:19])),
                         d_run.eq(~fm if bfp else 1), d_cnt.eq(0), alloc.eq(alloc + 1)]
        d_m = Cat(d_amax[:23], 1)
        with m.If(d_run):
            # 127 * 2**43 / M: x = 4r < 4M, digit from three compares
            x = Cat(Const(0, 2), r_i)
            x1, x2, x3 = x - d_m, x - (d_m << 1), x - d_m3
            g1, g2, g3 = ~x1[26], ~x2[26], ~x3[26]
            dig_i = Mux(g3, 3, Mux(g2, 2, Mux(g1, 1, 0)))
            m.d.sync += [r_i.eq(Mux(g3, x3, Mux(g2, x2, Mux(g1, x1, x)))[:24]),
                         q_i.eq(Cat(dig_i, q_i[:-2]))]
            # N * 2**9 / 127
            y = Cat(ds[-2:], r_s)
            y1, y2, y3 = y - 127, y - 254, y - 381
            h1, h2, h3 = ~y1[9], ~y2[9], ~y3[9]
            dig_s = Mux(h3, 3, Mux(h2, 2, Mux(h1, 1, 0)))
            m.d.sync += [r_s.eq(Mux(h3, y3, Mux(h2, y2, Mux(h1, y1, y)))[:7]),
                         q_s.eq(Cat(dig_s, q_s[:-2])),
                         ds.eq(ds << 2),
                         d_cnt.eq(d_cnt + 1)]
            with m.If(d_cnt == _DIV_STEPS - 1):
                m.d.sync += d_run.eq(0)

        # -- per-block constants of the sa rounding, from amax while the dividers step --------
        # sa = Q * 2**(e0 - 9), Q = floor(N * 2**9 / 127) with its leading bit at 25 + top
        # (top = Q[26]); the float32 LSB is at bit L of Q: 2 + top for a normal result
        # (biased exponent bexp - 7 + top >= 1; the field below is that minus 1 for the
        # hidden bit), else 10 - max(bexp, 1) (subnormal result: the LSB is 2**-149)
        bexp = d_amax[23:31]
        sub = bexp == 0
        p_shift = [Signal(range(10), name=f"p_shift{t}", reset_less=True) for t in (0, 1)]
        p_field = [Signal(8, name=f"p_field{t}", reset_less=True) for t in (0, 1)]
        for t in (0, 1):
            normal = ~sub & (bexp >= 8 - t)
            m.d.sync += [p_shift[t].eq(Mux(normal, 2 + t, Mux(sub, 9, 10 - bexp))),
                         p_field[t].eq(Mux(normal, bexp - 8 + t, 0))]
        p_kill = Signal(reset_less=True)                   # amax 0, subnormal, inf or NaN
        p_nan = Signal(reset_less=True)
        p_inf = Signal(reset_less=True)
        p_iexp = Signal(9, reset_less=True)                # 259 - bexp: inv's biased exponent
        m.d.sync += [p_kill.eq(sub | (bexp == 0xFF)), p_nan.eq(d_amax > _F32_INF),
                     p_inf.eq(d_amax == _F32_INF), p_iexp.eq(259 - bexp)]

        # -- rounding, stage 1 (the cycle after the last step; the registers still hold) ------
        n1_valid = Signal()
        m.d.sync += n1_valid.eq(d_fin)
        # inv: 27-bit quotient, leading bit 26 or 25; the biased exponent 259 - bexp + top
        # (+ 1 if the rounding carries out)
        n1_isig = Signal(24, reset_less=True)
        n1_iinc = Signal(reset_less=True)
        n1_iones = Signal(reset_less=True)                 # the significand is all ones
        n1_iexp = Signal(9, reset_less=True)
        top = q_i[26]
        i_sig = Mux(top, q_i[3:27], q_i[2:26])
        i_rb = Mux(top, q_i[2], q_i[1])
        i_st = Mux(top, q_i[:2] != 0, q_i[0]) | (r_i != 0)
        m.d.sync += [n1_isig.eq(i_sig), n1_iinc.eq(i_rb & (i_st | i_sig[0])),
                     n1_iones.eq(i_sig == 0xFFFFFF), n1_iexp.eq(p_iexp + top)]
        # sa: shift Q right by L (2..9) with round and sticky bits
        stop = q_s[26]
        s_shift = Mux(stop, p_shift[1], p_shift[0])
        n1_ssig = Signal(25, reset_less=True)
        n1_srb = Signal(reset_less=True)
        n1_sst = Signal(reset_less=True)
        n1_sfield = Signal(8, reset_less=True)
        with m.Switch(s_shift):
            for sh in range(2, 10):
                with m.Case(sh):
                    m.d.sync += [n1_ssig.eq(q_s[sh:27]), n1_srb.eq(q_s[sh - 1]),
                                 n1_sst.eq((q_s[:sh - 1] != 0) | (r_s != 0))]
        m.d.sync += n1_sfield.eq(Mux(stop, p_field[1], p_field[0]))
        n1_kill = Signal(reset_less=True)
        n1_nan = Signal(reset_less=True)
        n1_inf = Signal(reset_less=True)
        n1_amax = Signal(31, reset_less=True)
        m.d.sync += [n1_kill.eq(p_kill), n1_nan.eq(p_nan), n1_inf.eq(p_inf),
                     n1_amax.eq(d_amax)]
        if bfp:
            # block floating point (no division): the cycle after the pop (b_fin) loads stage 1
            # so that stage 2 writes, unchanged, E = max(bexp, 30) (the biased block exponent,
            # e = E - 127; a zero or subnormal maximum gives 30) as inv's exponent (no
            # increment) and sa_0 = 2**(E - 156) as sa's field (no significand, no rounding),
            # or NaN (0x7F800000 made quiet) for a block holding an inf or a NaN; e_sig and
            # e_kill unused
            b_fin = Signal()
            d_nf = Signal(reset_less=True)
            d_e = Signal(8, reset_less=True)
            m.d.sync += [b_fin.eq(pop & fm), n1_valid.eq(d_fin | b_fin)]
            with m.If(pop):
                m.d.sync += [d_nf.eq(pa[31]),
                             d_e.eq(Mux(pa[23:31] < _BFP_EMIN, _BFP_EMIN, pa[23:31]))]
            with m.If(fm):
                m.d.sync += [n1_iinc.eq(0), n1_iexp.eq(d_e), n1_ssig.eq(0), n1_srb.eq(0),
                             n1_sfield.eq(d_e - 29), n1_nan.eq(d_nf), n1_inf.eq(0),
                             n1_amax.eq(_F32_INF)]

        # -- rounding, stage 2: the scale entry -------------------------------------------------
        i_carry = n1_iones & n1_iinc
        i_exp = Signal(9)
        m.d.comb += i_exp.eq(n1_iexp + i_carry)
        i_kill = n1_kill | (n1_iexp >= 255) | ((n1_iexp == 254) & i_carry)
        i_sig23 = Signal(23)
        m.d.comb += i_sig23.eq(n1_isig[:23] + n1_iinc)     # 0 when it carries out
        s_code = Signal(32)
        m.d.comb += s_code.eq((n1_sfield << 23) + n1_ssig
                              + (n1_srb & (n1_sst | n1_ssig[0])))
        sa_val = Mux(n1_nan, n1_amax | _F32_QUIET, Mux(n1_inf, _F32_INF, s_code))
        with m.If(n1_valid):
            for i in range(_SCALES):
                with m.If(s_wr[:SW - 1] == i):
                    m.d.sync += [e_sa[i].eq(sa_val), e_sig[i].eq(i_sig23),
                                 e_exp[i].eq(i_exp[:8]), e_kill[i].eq(i_kill)]
            m.d.sync += s_wr.eq(s_wr + 1)

        # -- reader ------------------------------------------------------------------------------
        r_run = Signal()
        r_left = Signal(K_WIDTH)                           # row elements left (0: padding)
        r_pos = Signal(range(B))
        r_rows = Signal(K_WIDTH)
        r_idx = Signal(SW)                                 # the block's scale entry
        rptr = Signal(range(R))
        reserved = Signal(range(_OUT_DEPTH + 1))           # beats in flight or in the FIFO
        fire = Signal()
        m.d.comb += fire.eq(r_run & (r_idx != s_wr) & (reserved != _OUT_DEPTH))
        # (registers, set as the counters move: r_pos == bs_m1, r_left != 0, r_left <= 1,
        # r_rows == 1)
        r_block_last, r_data, r_le1, r_last_row = Signal(), Signal(), Signal(), Signal()
        r_row_last = Signal()
        if bfp:
            # block floating point: four passes over each block (digit r_dig), the read state
            # at the block's start kept to rewind to
            r_dig = Signal(2)
            r_rew = Signal()                               # fm & (r_dig != 3)
            r_left0 = Signal(K_WIDTH)
            r_data0, r_le10 = Signal(), Signal()
            rptr0 = Signal(range(R))
            m.d.comb += r_row_last.eq(r_block_last & r_le1 & ~r_rew)
        else:
            m.d.comb += r_row_last.eq(r_block_last & r_le1)
        m.d.comb += rd.addr.eq(rptr)                       # en stays 1: no logic after
        k_le1 = k_r <= 1
        if bfp:
            k_le1 = Signal()                               # k <= 1, a register
            with m.If(go):
                m.d.sync += k_le1.eq(self.k <= 1)
        with m.If(fire):
            n_left = Mux(r_row_last, k_r, Mux(r_data, r_left - 1, 0))
            n_data = Mux(r_row_last, k_r != 0, r_data & ~r_le1)
            n_le1 = Mux(r_row_last, k_le1, ~r_data | (r_left <= 2))
            m.d.sync += [r_pos.eq(Mux(r_block_last, 0, r_pos + 1)),
                         r_block_last.eq(~r_block_last & (r_pos == bs_m1 - 1)),
                         r_left.eq(n_left), r_data.eq(n_data), r_le1.eq(n_le1)]
            with m.If(r_data):
                m.d.sync += rptr.eq(rptr + 1)
            if bfp:
                with m.If(r_block_last & r_rew):           # the block again, next digit
                    m.d.sync += [r_left.eq(r_left0), r_data.eq(r_data0), r_le1.eq(r_le10),
                                 rptr.eq(rptr0), r_dig.eq(r_dig + 1), r_rew.eq(r_dig != 2)]
                with m.Elif(r_block_last):
                    m.d.sync += [r_left0.eq(n_left), r_data0.eq(n_data), r_le10.eq(n_le1),
                                 rptr0.eq(rptr + r_data), r_idx.eq(r_idx + 1), r_dig.eq(0),
                                 r_rew.eq(fm)]
            else:
                with m.If(r_block_last):
                    m.d.sync += r_idx.eq(r_idx + 1)
            with m.If(r_row_last):
                m.d.sync += [r_rows.eq(r_rows - 1), r_last_row.eq(r_rows == 2)]
                with m.If(r_last_row):
                    m.d.sync += r_run.eq(0)
        with m.If(go):
            m.d.sync += [r_run.eq(job_ok), r_left.eq(self.k), r_pos.eq(0),
                         r_rows.eq(self.rows), r_block_last.eq(0),
                         r_data.eq(self.k != 0), r_le1.eq(self.k <= 1),
                         r_last_row.eq(self.rows == 1)]
            if bfp:
                m.d.sync += [r_dig.eq(0), r_rew.eq(self.fmode), r_left0.eq(self.k),
                             r_data0.eq(self.k != 0), r_le10.eq(self.k <= 1)]
        if bfp:                                            # freed by the last pass
            m.d.sync += used.eq(used + accept - (fire & r_data & ~r_rew))
        else:
            m.d.sync += used.eq(used + accept - (fire & r_data))

        # -- lane: c0 fire, c1 read data, c2 unpack, c3 products, c4 partial sums, c5 product,
        # c6 float32 rounding, c7 low sticky, c8 shift to the integer, c9 RNE and sign,
        # c10 FIFO write ------------------------------------------------------------------------
        meta_fields = {"pad": unsigned(1), "block_last": unsigned(1), "row_last": unsigned(1),
                       "idx": unsigned(SW - 1)}
        if bfp:
            meta_fields["digit"] = unsigned(2)
        meta = Signal(data.StructLayout(meta_fields))
        m.d.comb += [meta.pad.eq(~r_data), meta.block_last.eq(r_block_last),
                     meta.row_last.eq(r_row_last), meta.idx.eq(r_idx[:SW - 1])]
        if bfp:
            m.d.comb += meta.digit.eq(r_dig)
        valid = Signal(_LANE_LATENCY)
        m.d.sync += valid.eq(Cat(fire, valid[:-1]))
        meta_d = [meta]
        for c in range(1, _LANE_LATENCY + 1):
            meta_d.append(delay(m, meta_d[-1], 1, f"meta{c}"))

        # c1: register the block RAM output (its clock-to-out is about 5.7 ns); c2: again,
        # next to the logic
        x0r = Signal(32, reset_less=True)
        x1r = Signal(32, reset_less=True)
        m.d.sync += [x0r.eq(rd.data), x1r.eq(x0r)]
        # c2: unpack, normalise a subnormal by up to 3 bits; inv from the scale entry
        a_exp = x1r[23:31]
        a_sig = Cat(x1r[:23], a_exp != 0)
        lz = Mux(a_exp != 0, 0, Mux(a_sig[22], 1, Mux(a_sig[21], 2, 3)))
        c2_e = Signal(signed(10), reset_less=True)         # max(exp, 1) - lz
        c2_sign = Signal(reset_less=True)
        c2_zero = Signal(reset_less=True)                  # |a| < 2**-129: qa = 0
        c2_iexp = Signal(8, reset_less=True)
        idx2 = meta_d[3].idx
        m.d.sync += [c2_e.eq(Mux(a_exp != 0, a_exp, 1) - lz),
                     c2_sign.eq(x1r[31]),
                     c2_zero.eq((a_exp == 0) & (a_sig[20:23] == 0)),
                     c2_iexp.eq(Array(e_exp)[idx2])]
        # c2 .. c4: the significand product (c2 its operand registers, inside the
        # MULT18X18Ds with ecp5), in two parts: c4_outer + (c4_mid << 18)
        i_op = Cat(Array(e_sig)[idx2], 1)
        if bfp:
            # block floating point: |X| = floor(M * 2**(6 - d)), M a's 24-bit significand,
            # d = E - exp (E the block's biased exponent, e_exp), on the same product: M times
            # 2**u, u = 23 - d (d <= 23; |X| = P >> 17) or 2**(u + 8) (d = 24 .. 29, "big";
            # P >> 25), times 0 for X = 0 (a zero, subnormal, inf or NaN, or d >= 30, i.e.
            # 29 - d < 0). c1: 23 - E and 29 - E (from the entry a cycle ahead) and the ring
            # word's first register give u and the power of two, 2**(u mod 32 mod 8) times
            # 2**(8 * (u mod 32 // 8)) (the last 0 when big)
            e_sel = Array(e_exp)[meta_d[1].idx]
            b0_c23 = Signal(signed(9), reset_less=True)
            b0_c29 = Signal(signed(9), reset_less=True)
            m.d.sync += [b0_c23.eq(23 - e_sel), b0_c29.eq(29 - e_sel)]
            x0_exp = x0r[23:31]
            b_u = Signal(signed(10))
            b_v = Signal(signed(10))
            m.d.comb += [b_u.eq(x0_exp + b0_c23), b_v.eq(x0_exp + b0_c29)]
            b_zero = (x0_exp == 0) | (x0_exp == 0xFF) | b_v[-1]
            hi, lo = b_u[3:5], b_u[:3]
            hi_sel = [(hi == 0) | (hi == 3), hi == 1, hi == 2]
            b1_pow = Signal(24, reset_less=True)
            b1_big = Signal(reset_less=True)
            m.d.sync += [b1_pow.eq(Cat(*(~b_zero & hi_sel[j >> 3] & (lo == (j & 7))
                                         for j in range(24)))),
                         b1_big.eq(hi == 3)]
            i_op = Mux(fm, b1_pow, i_op)
        c4_outer, c4_mid = product_24x24(m, (a_sig << lz)[:24], i_op, ecp5=self._ecp5,
                                         name="sig")
        # c3: the exponent: idx = e_p + 1 - [P >= 2**47]
        c3_c = Signal(signed(11), reset_less=True)
        m.d.sync += c3_c.eq(c2_e + c2_iexp - 253)
        c3_sign = delay(m, c2_sign, 1, "c3_sign")
        c3_zero = delay(m, c2_zero, 1, "c3_zero")
        # c5: the product, the low 18 product bits' OR
        c5_p = Signal(48, reset_less=True)
        c5_or = Signal(reset_less=True)
        m.d.sync += [c5_p.eq(c4_outer + (c4_mid << 18)), c5_or.eq(c4_outer[:18] != 0)]
        c5_c = delay(m, c3_c, 2, "c5_c")
        c5_sign = delay(m, c3_sign, 2, "c5_sign")
        c5_zero = delay(m, c3_zero, 2, "c5_zero")
        if bfp:
            # c6: Y = X + 0x808080 (32 bits), whose bytes are the balanced digits: x_i =
            # Y[8i:8i+8] - 128 (i < 3), x_3 = Y[24:32] (signed); the pass's byte
            b5_big = delay(m, b1_big, 4, "b5_big")
            b_x = Mux(b5_big, c5_p[25:47], c5_p[17:47])
            b_y = Signal(32)
            m.d.comb += b_y.eq((Cat(b_x, Const(0, 2)) ^ c5_sign.replicate(32))
                               + (Const(_BFP_OFFSET, 32) | c5_sign))
            b6_x = Signal(8, reset_less=True)
            with m.Switch(meta_d[7].digit):
                for i in range(4):
                    with m.Case(i):
                        m.d.sync += b6_x.eq(b_y[8 * i:8 * i + 8] ^ (0x80 if i < 3 else 0))
            b8_x = delay(m, b6_x, 2, "b8_x")
        # c6: round to float32 (24 bits)
        p47 = c5_p[47]
        f_sig = Mux(p47, c5_p[24:48], c5_p[23:47])
        f_rb = Mux(p47, c5_p[23], c5_p[22])
        f_st = c5_or | Mux(p47, c5_p[18:23] != 0, c5_p[18:22] != 0)
        c6_sig = Signal(25, reset_less=True)
        c6_idx = Signal(signed(11), reset_less=True)
        m.d.sync += [c6_sig.eq(f_sig + (f_rb & (f_st | f_sig[0]))), c6_idx.eq(c5_c + p47)]
        c6_sign = delay(m, c5_sign, 1, "c6_sign")
        c6_zero = delay(m, c5_zero, 1, "c6_zero")
        # c7: the OR of the low 16 bits (the sticky part every shift drops)
        c7_hi = Signal(9, reset_less=True)
        c7_lo = Signal(reset_less=True)
        c7_idx = Signal(3, reset_less=True)
        c7_zero = Signal(reset_less=True)
        m.d.sync += [c7_hi.eq(c6_sig[16:]), c7_lo.eq(c6_sig[:16] != 0), c7_idx.eq(c6_idx[:3]),
                     c7_zero.eq(c6_zero | (c6_idx < 0) | (c6_idx > 7))]
        c7_sign = delay(m, c6_sign, 1, "c7_sign")
        # c8: to the integer: shift right by 24 - idx (idx = 0..7), round and sticky bits
        c8_int = Signal(8, reset_less=True)
        c8_rb = Signal(reset_less=True)
        c8_st = Signal(reset_less=True)
        with m.Switch(c7_idx):
            for i in range(8):
                sh = 24 - i - 16                           # in c7_hi
                with m.Case(i):
                    m.d.sync += [c8_int.eq(c7_hi[sh:]), c8_rb.eq(c7_hi[sh - 1]),
                                 c8_st.eq(c7_lo | (c7_hi[:sh - 1] != 0))]
        c8_zero = delay(m, c7_zero, 1, "c8_zero")
        c8_sign = delay(m, c7_sign, 1, "c8_sign")
        # c9: RNE and sign in one adder (-(x + i) = ~x + (1 - i)), kill and padding
        inc = c8_rb & (c8_st | c8_int[0])
        sq = Signal(8)
        m.d.comb += sq.eq((c8_int ^ c8_sign.replicate(8)) + (inc ^ c8_sign))
        meta9 = meta_d[10]
        kill9 = Array(e_kill)[meta9.idx]
        c9_qa = Signal(signed(8), reset_less=True)
        if bfp:
            m.d.sync += c9_qa.eq(Mux(meta9.pad | (~fm & (c8_zero | kill9)), 0,
                                     Mux(fm, b8_x, sq)))
        else:
            m.d.sync += c9_qa.eq(Mux(c8_zero | kill9 | meta9.pad, 0, sq))
        meta10 = meta_d[11]

        # -- q FIFO --------------------------------------------------------------------------------
        beat_fields = {"qa": signed(8), "block_last": unsigned(1), "row_last": unsigned(1)}
        if bfp:
            beat_fields["digit"] = unsigned(2)
        beat_layout = data.StructLayout(beat_fields)
        result = Signal(beat_layout)
        m.d.comb += [result.qa.eq(c9_qa), result.block_last.eq(meta10.block_last),
                     result.row_last.eq(meta10.row_last)]
        if bfp:
            m.d.comb += result.digit.eq(meta10.digit)
        m.submodules.out = out = fifo.SyncFIFOBuffered(width=result.shape().size,
                                                       depth=_OUT_DEPTH)
        m.d.comb += [out.w_data.eq(result), out.w_en.eq(valid[_LANE_LATENCY - 1])]
        head = data.View(beat_layout, out.r_data)
        m.d.comb += [q.payload.qa.eq(head.qa), q.payload.block_last.eq(head.block_last),
                     q.payload.row_last.eq(head.row_last),
                     q.valid.eq(out.r_rdy & ~(head.block_last & blk.valid)),
                     out.r_en.eq(q.valid & q.ready)]
        if bfp:
            m.d.comb += q.payload.digit.eq(head.digit)
        q_done = q.valid & q.ready
        m.d.sync += reserved.eq(reserved + fire - q_done)

        # -- blk: asum over the transferred beats; sa from the scale entry -------------------
        asum = Signal(signed(self._asum_width))
        total = asum + head.qa
        with m.If(blk.valid & blk.ready):
            m.d.sync += blk.valid.eq(0)
        if bfp:
            # sa_i = 2**(E - 156 + 8 i): i added to the exponent's top five bits, not to NaN
            # (all ones there; sa_0's are at most 28); the entry is freed by the last pass
            # (int8 jobs have digit 0, one pass)
            e_sa_r = Array(e_sa)[s_ret[:SW - 1]]
            b_inc = Mux(e_sa_r[26:31].all(), 0, head.digit)
            sa_out = Cat(e_sa_r[:26], (e_sa_r[26:31] + b_inc)[:5], e_sa_r[31])
        else:
            sa_out = Array(e_sa)[s_ret[:SW - 1]]
        with m.If(q_done):
            m.d.sync += asum.eq(Mux(head.block_last, 0, total))
            with m.If(head.block_last):
                m.d.sync += [blk.valid.eq(1), blk.payload.asum.eq(total),
                             blk.payload.sa.eq(sa_out)]
                if bfp:
                    with m.If(~fm | (head.digit == 3)):
                        m.d.sync += s_ret.eq(s_ret + 1)
                else:
                    m.d.sync += s_ret.eq(s_ret + 1)

        m.d.comb += busy.eq(w_run | r_run | (reserved != 0) | blk.valid)
        return m
