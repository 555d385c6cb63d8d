"""Pack a stream of codes densely into bytes, the way ONNX stores sub-byte tensors."""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.validate import check_int

__all__ = ["Pack"]


class Pack(wiring.Component):
    """Pack ``lanes`` codes per beat, ``bits`` bits each, into ``lanes * max_bits``-bit words.

    Element ``e`` of the stream lands at bit ``(e mod per_word) * bits`` of word
    ``e // per_word``, ``per_word = lanes * max_bits // bits``: little-endian, first element in
    the lowest bits, as ONNX packs int4 / uint4 / float4e2m1 (two per byte, low nibble first)
    and int2 / uint2 (four per byte). Codes are right-aligned in their ``max_bits`` lane; bits
    above ``bits`` are ignored. ``bits`` (run time) is one of ``widths``: powers of two that
    divide ``max_bits``.

    The word holding element ``count - 1`` carries ``last``; its ``keep`` marks the bytes that
    hold elements (``ceil(n * bits / 8)`` of them for ``n`` elements; bytes of a full word are
    all kept). Input beats past ``count`` (the padding lanes of a partial last beat) are not
    packed. ``bits`` and ``count`` must hold for a whole stream; the packer counts elements
    from reset and after each ``last``.

    Throughput: one input beat per cycle while ``o`` accepts; a word is offered one cycle after
    its last beat arrives (latency 1) and held until taken.

    Members
    -------
    i : :py:`In(stream.Signature(StructLayout({"data": ArrayLayout(unsigned(max_bits), lanes),
        "last": 1})))`
    bits : :py:`In(range(max_bits + 1))`
    count : :py:`In(unsigned(count_width))`
    o : :py:`Out(stream.Signature(StructLayout({"data": unsigned(lanes * max_bits),
        "keep": unsigned(lanes * max_bits // 8), "last": 1})))`
    """

    def __init__(self, *, lanes: int, max_bits: int, widths, count_width: int = 32):
        self._lanes = check_int("lanes", lanes, 1, 64)
        self._max_bits = check_int("max_bits", max_bits, 8, 64)
        if max_bits & (max_bits - 1):
            raise ValueError(f"max_bits must be a power of two, not {max_bits}")
        widths = tuple(sorted(set(widths)))
        for w in widths:
            if check_int("widths", w, 1, max_bits) & (w - 1) or max_bits % w:
                raise ValueError(f"widths must be powers of two dividing max_bits={max_bits}, "
                                 f"not {w}")
        if not widths:
            raise ValueError("widths must name at least one width")
        self._widths = widths
        self._count_width = check_int("count_width", count_width, 1, 64)
        word = lanes * max_bits
        super().__init__({
            "i": In(stream.Signature(data.StructLayout({
                "data": data.ArrayLayout(unsigned(max_bits), lanes), "last": unsigned(1)}))),
            "bits": In(range(max_bits + 1)),
            "count": In(unsigned(count_width)),
            "o": Out(stream.Signature(data.StructLayout({
                "data": unsigned(word), "keep": unsigned(word // 8), "last": unsigned(1)}))),
        })

    @property
    def widths(self) -> tuple[int, ...]:
        return self._widths

    def elaborate(self, platform):
        m = Module()
        L, B = self._lanes, self._max_bits
        word = L * B
        n_bytes = word // 8

        # elements left in the stream (for keep and the padding lanes)
        left = Signal(self._count_width)   # elements not yet packed
        first = Signal(init=1)
        remaining = Signal(self._count_width)
        m.d.comb += remaining.eq(Mux(first, self.count, left))

        # per width: beats per word (ratio) and the beat's codes packed to lanes * w bits;
        # lanes past `count` contribute zeros (ONNX pads a partial byte with zero bits)
        fill = Signal(range(B + 1))        # beats already in the current word
        acc = Signal(word)
        ratio = Signal(range(B + 1))
        packed = Signal(word)              # this beat's codes at their place in the word
        for w in self._widths:
            with m.If(self.bits == w):
                m.d.comb += ratio.eq(B // w)
                beat = Cat(*(Mux(remaining > k, self.i.payload.data[k][:w], 0)
                             for k in range(L)))
                m.d.comb += packed.eq(beat << (fill * (L * w)))
        ends_word = (fill == ratio - 1) | self.i.payload.last
        room = ~self.o.valid | self.o.ready
        m.d.comb += self.i.ready.eq(~ends_word | room)

        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        with m.If(self.i.valid & self.i.ready):
            taken = Signal(self._count_width)
            m.d.comb += taken.eq(Mux(remaining > L, L, remaining))
            m.d.sync += [left.eq(remaining - taken), first.eq(self.i.payload.last)]
            with m.If(ends_word):
                # elements in this word: fill * L + taken; keep their bytes
                elems = Signal(range(L * B + 1))
                m.d.comb += elems.eq(fill * L + taken)
                nbits = Signal(range(word + 8))
                for w in self._widths:
                    with m.If(self.bits == w):
                        m.d.comb += nbits.eq(elems * w)
                keep = Signal(n_bytes)
                m.d.comb += keep.eq(Cat(*((nbits > 8 * j) for j in range(n_bytes))))
                m.d.sync += [self.o.payload.data.eq(acc | packed),
                             self.o.payload.keep.eq(keep),
                             self.o.payload.last.eq(self.i.payload.last),
                             self.o.valid.eq(1), acc.eq(0), fill.eq(0)]
            with m.Else():
                m.d.sync += [acc.eq(acc | packed), fill.eq(fill + 1)]
        return m
