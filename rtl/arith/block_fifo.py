"""A first-word-fall-through FIFO in block RAM, a drop-in for the buffered FIFO of
:mod:`amaranth.lib.fifo` where LUTs are dear and block RAMs idle."""

from __future__ import annotations

from amaranth.hdl import Module, Signal, unsigned
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.validate import check_bool, check_int
from qaccel.rtl.arith.ecp5 import DP16KD_DEPTH, DP16KD_WIDTH, dp16kd_sdp

__all__ = ["LATENCY", "BlockFifo"]

#: Cycles from ``w_en`` to ``r_rdy`` (as :class:`amaranth.lib.fifo.SyncFIFOBuffered`).
LATENCY = 2


class BlockFifo(wiring.Component):
    """``depth`` words of ``width`` bits, first word fall through, in block RAM.

    The same ports and timing as :class:`amaranth.lib.fifo.SyncFIFOBuffered` (without
    ``level``): a word written (``w_en`` with ``w_rdy``) in cycle ``c`` is offered
    (``r_rdy``, ``r_data``) from cycle ``c + 2`` when the FIFO was empty, and one word a
    cycle is read (``r_en`` with ``r_rdy``) and written. The offered word is the block RAM's
    own read register, held with its clock enable while ``r_en`` is low, so the FIFO has no
    LUT RAM and no wide output multiplexer; its cost is a few pointer bits and
    ``ceil(width / 36)`` DP16KD (with ``ecp5``; otherwise one
    :class:`~amaranth.lib.memory.Memory` with ``ram_style = "block"``). The offered data come
    from the RAM's clock-to-out (5.8 ns in nextpnr's ECP5 model): give them a short path.
    A synchronous reset empties the FIFO.

    Parameters
    ----------
    width : :class:`int`
        Bits per word, 1..4096.
    depth : :class:`int`
        Words, a power of two, 2..512.
    ecp5 : :class:`bool`
        DP16KD instances (synthesis for ECP5; simulation needs False, the default).
    """

    def __init__(self, *, width: int, depth: int, ecp5: bool = False):
        self._width = check_int("width", width, 1, 4096)
        self._depth = check_int("depth", depth, 2, DP16KD_DEPTH)
        if depth & (depth - 1):
            raise ValueError(f"depth must be a power of two, not {depth}")
        self._ecp5 = check_bool("ecp5", ecp5)
        super().__init__({
            "w_data": In(unsigned(width)), "w_en": In(1), "w_rdy": Out(1),
            "r_data": Out(unsigned(width)), "r_en": In(1), "r_rdy": Out(1),
        })

    @property
    def width(self) -> int:
        return self._width

    @property
    def depth(self) -> int:
        return self._depth

    @property
    def blocks(self) -> int:
        """DP16KD cells with ``ecp5``."""
        return -(-self._width // DP16KD_WIDTH)

    def elaborate(self, platform):
        m = Module()
        D = self._depth
        aw = (D - 1).bit_length()
        wp = Signal(aw + 1)                 # words written
        rp = Signal(aw + 1)                 # words moved into the RAM's read register
        count = Signal(range(D + 1))        # words in the FIFO (the read register's included)
        valid = Signal()                    # the read register holds a word
        write = self.w_en & self.w_rdy
        read = self.r_en & valid
        load = ~valid | self.r_en           # the read register may take the next word
        fetch = load & (wp != rp)
        m.d.comb += [self.w_rdy.eq(count != D), self.r_rdy.eq(valid)]
        m.d.sync += valid.eq(fetch | (valid & ~self.r_en))
        with m.If(write):
            m.d.sync += wp.eq(wp + 1)
        with m.If(fetch):
            m.d.sync += rp.eq(rp + 1)
        with m.If(write & ~read):
            m.d.sync += count.eq(count + 1)
        with m.Elif(read & ~write):
            m.d.sync += count.eq(count - 1)

        if self._ecp5:
            for k in range(self.blocks):
                lo, hi = k * DP16KD_WIDTH, min(self._width, (k + 1) * DP16KD_WIDTH)
                wr, rd = dp16kd_sdp(m, depth=D, width=hi - lo, name=f"ram{k}")
                m.d.comb += [wr.addr.eq(wp[:aw]), wr.data.eq(self.w_data[lo:hi]),
                             wr.en.eq(write), rd.addr.eq(rp[:aw]), rd.en.eq(load),
                             self.r_data[lo:hi].eq(rd.data)]
        else:
            mem = memory.Memory(shape=unsigned(self._width), depth=D, init=[],
                                attrs={"ram_style": "block"})
            m.submodules.ram = mem
            wr, rd = mem.write_port(), mem.read_port(domain="sync")
            m.d.comb += [wr.addr.eq(wp[:aw]), wr.data.eq(self.w_data), wr.en.eq(write),
                         rd.addr.eq(rp[:aw]), rd.en.eq(load), self.r_data.eq(rd.data)]
        return m
