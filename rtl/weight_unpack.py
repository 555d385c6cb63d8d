"""MatMulNBits weight unpacker: a little-endian bit stream of ``bits``-bit codes to bytes."""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.validate import check_int, check_int_choice

__all__ = ["BITS", "BUS_WIDTHS", "LATENCY", "SIMD", "WeightUnpack"]

#: Elements per output beat :class:`WeightUnpack` supports.
SIMD = (1, 2, 4, 8, 16, 32, 64)
#: Input word widths (bits) :class:`WeightUnpack` supports.
BUS_WIDTHS = (8, 16, 32, 64, 128, 256)
#: Legal run-time ``bits``.
BITS = range(2, 9)
#: Cycles from the transfer of the word that completes a beat to the beat being offered.
LATENCY = 2


class WeightUnpack(wiring.Component):
    """Unpack a little-endian bit stream of ``bits``-bit codes, ``simd`` codes per beat.

    The input is one continuous LSB-first bit stream of ``count`` elements on ``i``, in
    ``bus_width``-bit words: bit ``b`` of the stream is bit ``b % bus_width`` of word
    ``b // bus_width``, element ``e`` occupies bits ``[e * bits, (e + 1) * bits)``. That is
    how ONNX Runtime's MatMulNBits stores a column of B (``[k_blocks, blob]`` bytes, each block
    a whole number of bytes), and how :func:`qaccel.model.nbits_kernels.unpack_bits` reads it.
    The stream is :meth:`words` ``= ceil(count * bits / bus_width)`` words, the last one padded
    (with zeros, though the padding is not used); exactly that many are accepted.

    Beat ``t`` on ``o`` carries elements ``t * simd + k`` in ``q[k]``, zero-extended to 8 bits;
    the beat holding element ``count - 1`` has ``last`` set, and in it lanes past ``count``
    are unspecified. ``count = 0`` accepts no word and emits no beat.

    ``bits`` (2 to 8) and ``count`` are registers: they must be valid in the cycle of
    ``start`` and hold until ``busy`` falls. Other ``bits`` values (0, 1, 9 to 15) act as 8:
    the stream is then ``ceil(count * 8 / bus_width)`` words of bytes; nothing hangs.
    ``start`` (a one-cycle strobe) starts a stream and aborts a running one: buffered bits
    are dropped and the beat offered on ``o`` is withdrawn (one transferred in the cycle of
    ``start`` belongs to the old stream). ``i.ready`` is low in the cycle of ``start``; words
    are accepted from the next cycle on.

    Latency: a beat is offered :attr:`latency` (2) cycles after the transfer of the word that
    completes it (the word enters the bit buffer, then the beat enters the output register),
    so the first beat comes ``latency`` cycles after word ``ceil(min(simd, count) * bits /
    bus_width) - 1`` (the first word when ``simd * bits <= bus_width``).

    Throughput, no pauses: :meth:`elements_per_cycle` ``= min(simd, bus_width / bits)``
    elements per cycle. When ``simd * bits <= bus_width`` that is one beat per cycle (the
    input then pauses now and then); otherwise one word is accepted every cycle and a beat is
    offered whenever the buffer holds one (input bound, ``bus_width / bits`` elements per
    cycle on average). ``i.ready`` depends on registers (and ``start``) only, not on
    ``o.ready``; a beat is held on ``o`` until it is transferred.

    Mechanism. A bit buffer of :attr:`buffer_width` ``= bus_width + 8 * simd + min(bus_width,
    8 * simd)`` bits holds the stream's next bits from bit 0 and its fill level ``f``. A word
    is accepted while ``f <= buffer_width - bus_width`` and ORed in at bit ``f`` (one barrel
    shift of ``bus_width`` bits); a beat leaves when ``f >= simd * bits`` (or, at the end of
    the stream, when every word is in), and the buffer then shifts right by ``simd * bits``,
    a 7-way multiplexer of constant shifts. Lane ``k`` takes bits ``[bits * k, bits * k +
    bits)``: a 7-way multiplexer of constant slices per lane, no multiplier. The buffer size
    keeps the output busy every cycle when ``simd * bits <= bus_width`` (the level never
    drops below a beat once it reached one) and the input busy every cycle otherwise (the
    level stays below ``simd * bits + bus_width``). The word count ``count * bits`` is a
    shift-and-add, at ``start``.

    Parameters
    ----------
    simd : :class:`int`
        Elements per output beat, one of :data:`SIMD` (1 to 64, powers of two).
    bus_width : :class:`int`
        Input word width in bits, one of :data:`BUS_WIDTHS` (8 to 256, powers of two).
    count_width : :class:`int`
        Width of ``count``, 1 to 48 (default 24).

    Raises
    ------
    :exc:`TypeError`, :exc:`ValueError`
        If a parameter is not an integer or out of range; the message names it.

    Members
    -------
    bits : :py:`In(unsigned(4))`
        Bits per element, 2 to 8.
    count : :py:`In(unsigned(count_width))`
        Elements in the stream.
    start : :py:`In(1)`
        Start a stream (aborting a running one).
    i : :py:`In(stream.Signature(unsigned(bus_width)))`
        The packed words, LSB first.
    o : :py:`Out(stream.Signature(StructLayout({"q": ArrayLayout(unsigned(8), simd),
        "last": 1})))`
    busy : :py:`Out(1)`
        A stream is running: beats left to emit, or one offered on ``o``.
    """

    def __init__(self, *, simd: int, bus_width: int, count_width: int = 24):
        self._simd = check_int_choice("simd", simd, SIMD)
        self._bus_width = check_int_choice("bus_width", bus_width, BUS_WIDTHS)
        self._count_width = check_int("count_width", count_width, 1, 48)
        super().__init__({
            "bits": In(unsigned(4)),
            "count": In(unsigned(count_width)),
            "start": In(1),
            "i": In(stream.Signature(unsigned(bus_width))),
            "o": Out(stream.Signature(data.StructLayout({
                "q": data.ArrayLayout(unsigned(8), simd), "last": unsigned(1)}))),
            "busy": Out(1),
        })

    @property
    def simd(self) -> int:
        """Elements per output beat."""
        return self._simd

    @property
    def bus_width(self) -> int:
        """Input word width in bits."""
        return self._bus_width

    @property
    def count_width(self) -> int:
        """Width of ``count``."""
        return self._count_width

    @property
    def buffer_width(self) -> int:
        """Bits in the bit buffer: ``bus_width + 8 * simd + min(bus_width, 8 * simd)``."""
        return self._bus_width + 8 * self._simd + min(self._bus_width, 8 * self._simd)

    @property
    def latency(self) -> int:
        """Cycles from the transfer of the word completing a beat to the beat being offered."""
        return LATENCY

    def elements_per_cycle(self, bits: int) -> float:
        """Return the sustained rate without pauses, ``min(simd, bus_width / bits)``
        elements per cycle, for ``bits`` in 2 to 8."""
        bits = check_int("bits", bits, BITS.start, BITS.stop - 1)
        return min(float(self._simd), self._bus_width / bits)

    def words(self, bits: int, count: int) -> int:
        """Return the words in a stream of ``count`` ``bits``-bit elements."""
        bits = check_int("bits", bits, BITS.start, BITS.stop - 1)
        count = check_int("count", count, 0, (1 << self._count_width) - 1)
        return -(-count * bits // self._bus_width)

    def elaborate(self, platform):
        m = Module()
        L, B, W = self._simd, self._bus_width, self.buffer_width
        i, o = self.i, self.o

        # bits as used: 2..8, anything else as 8; registered (it holds while busy, and nothing
        # reads the copies in the cycle of start), and simd * bits
        eb_in = Signal(4)
        m.d.comb += eb_in.eq(Mux((self.bits >= BITS.start) & (self.bits < BITS.stop),
                                 self.bits, 8))
        eb = Signal(4)
        per_beat = Signal(range(8 * L + 1))
        m.d.sync += eb.eq(eb_in)
        with m.Switch(eb_in):
            for b in BITS:
                with m.Case(b):
                    m.d.sync += per_beat.eq(L * b)

        buf = Signal(W)                        # the stream's next bits, from bit 0
        fill = Signal(range(W + 1))            # ... how many
        need = Signal(self._count_width + 3)   # stream bits still to accept
        in_more = Signal()                     # words left to accept
        left = Signal(self._count_width)       # elements left to emit
        running = Signal()                     # left != 0

        m.d.comb += i.ready.eq(in_more & (fill <= W - B) & ~self.start)
        accept = Signal()
        m.d.comb += accept.eq(i.valid & i.ready)
        spare = Signal(len(fill) + 1)          # fill - per_beat: its sign says a beat is in
        m.d.comb += spare.eq(fill - per_beat)
        emit = Signal()
        m.d.comb += emit.eq(running & (~spare[-1] | ~in_more) & (~o.valid | o.ready))
        last = Signal()
        m.d.comb += last.eq(left <= L)

        # the lanes of the beat at the head of the buffer
        lanes = Signal(data.ArrayLayout(unsigned(8), L))
        with m.Switch(eb):
            for b in BITS:
                with m.Case(b):
                    m.d.comb += [lanes[k].eq(buf[b * k: b * (k + 1)]) for k in range(L)]

        merged = Signal(W)
        m.d.comb += merged.eq(Mux(accept, buf | (i.payload << fill), buf))
        m.d.sync += buf.eq(merged)
        with m.If(emit):
            with m.Switch(eb):
                for b in BITS:
                    with m.Case(b):
                        m.d.sync += buf.eq(merged >> (L * b))
        m.d.sync += fill.eq(Mux(emit, spare[:-1], fill) + Mux(accept, B, 0))

        with m.If(accept):
            m.d.sync += [need.eq(need - B), in_more.eq(need > B)]

        with m.If(o.valid & o.ready):
            m.d.sync += o.valid.eq(0)
        with m.If(emit):
            m.d.sync += [o.valid.eq(1), o.payload.q.eq(lanes), o.payload.last.eq(last),
                         left.eq(left - L)]
            with m.If(last):
                m.d.sync += [running.eq(0), fill.eq(0)]

        with m.If(self.start):
            total = sum(Mux(eb_in[j], self.count << j, 0) for j in range(4))
            m.d.sync += [buf.eq(0), fill.eq(0), need.eq(total), in_more.eq(self.count != 0),
                         left.eq(self.count), running.eq(self.count != 0), o.valid.eq(0)]
        m.d.comb += self.busy.eq(running | o.valid)
        return m
