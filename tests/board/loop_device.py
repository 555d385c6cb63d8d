"""A test device for the host link: a :class:`~qaccel.rtl.board.host_bridge.HostBridge`
wired to a small AXI4-Lite register file and to a loop that sends its input streams back as
the output ``y`` through a FIFO, with pseudo-random stalls set by a register.

Registers (byte addresses; the bridge's ``addr_width`` is 8, so bits above are ignored):

========  ====  ==============================================================================
0x00-1C   rw    ``R0``-``R7``, reset 0, byte strobes honoured
0x20      ro    ``ID`` = :data:`DEVICE_ID`
0x24      rw    ``STALL``: [7:0] chance (/256) a cycle's ``tready`` is low on the inputs,
                [15:8] chance of a gap before a ``y`` beat is offered, [23:16] chance the
                slave's ``awready`` / ``wready`` / ``arready`` are low (each its own draw)
0x28      ro    ``A_BEATS``: beats accepted on ``a``
0x2C      ro    ``B_BEATS``: beats accepted on ``b``
0x30      ro    ``Y_BEATS``: ``y`` beats taken by the bridge
========  ====  ==============================================================================

Writes to read-only or unmapped addresses and reads of unmapped ones answer SLVERR. The
slave takes AW and W independently (either first) and answers one transaction of each kind
at a time.

The loop: a beat of ``a`` (16 bytes) becomes four ``y`` beats of its 32-bit words, lowest
first, ``tkeep`` 0xF, ``tlast`` on the fourth; a beat of ``b`` (2 bytes) one ``y`` beat
holding it in the low bytes, ``tkeep`` 0x3, ``tlast`` set. Beats leave in the order they
were accepted. The FIFO holds ``fifo_depth`` beats, so a host that stops draining ``y`` soon
back-pressures ``a`` and ``b``.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from qaccel.rtl.board.host_bridge import HostBridge

__all__ = ["DEVICE_ID", "INPUTS", "OUTPUT_BYTES", "REGS", "LoopDevice", "expected_y"]

DEVICE_ID = 0x4C4F4F50            # "LOOP"
INPUTS = {"a": 16, "b": 2}
OUTPUT_BYTES = 4
REGS = {"R0": 0x00, "ID": 0x20, "STALL": 0x24, "A_BEATS": 0x28, "B_BEATS": 0x2C,
        "Y_BEATS": 0x30}
_ADDR_WIDTH = 8
_LFSR_TAPS = 0x80200003           # x^32 + x^22 + x^2 + x + 1


def expected_y(stream: str, beats: list[int], keep: bool = True) -> list[tuple[int, int, bool]]:
    """The ``y`` beats the loop makes of ``beats`` on ``stream`` (``tkeep`` all ones without
    ``keep``)."""
    out = []
    for v in beats:
        if stream == "a":
            out += [(v >> 32 * k & 0xFFFF_FFFF, 0xF, k == 3) for k in range(4)]
        else:
            out.append((v, 0x3 if keep else 0xF, True))
    return out


class LoopDevice(wiring.Component):
    """The bridge (``divisor`` cycles a bit, ``rx_fifo`` bytes, ``tkeep`` on ``y`` if
    ``output_keep``), its register file and the loop, behind ``uart_rx`` / ``uart_tx``."""

    def __init__(self, *, divisor: int = 8, rx_fifo: int = 2048, output_keep: bool = True,
                 fifo_depth: int = 8):
        self.bridge = HostBridge(INPUTS, OUTPUT_BYTES, output_keep, divisor=divisor,
                                 rx_fifo=rx_fifo, addr_width=_ADDR_WIDTH)
        self._fifo_depth = fifo_depth
        super().__init__({"uart_rx": In(1, init=1), "uart_tx": Out(1, init=1)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.bridge = br = self.bridge
        m.d.comb += [br.uart_rx.eq(self.uart_rx), self.uart_tx.eq(br.uart_tx)]

        lfsr = Signal(32, init=0xACE1_2345)
        m.d.sync += lfsr.eq((lfsr >> 1) ^ Mux(lfsr[0], _LFSR_TAPS, 0))
        stall = Signal(24)
        in_stall = lfsr[0:8] < stall[0:8]
        y_gap = lfsr[11:19] < stall[8:16]
        aw_stall, w_stall, ar_stall = (lfsr[k:k + 8] < stall[16:24] for k in (16, 20, 24))

        # -- the loop ------------------------------------------------------------------------
        m.submodules.fifo = fifo = SyncFIFO(width=32 + 4 + 1, depth=self._fifo_depth)
        conv = Signal(128)
        conv_n = Signal(range(5))
        a_beats, b_beats, y_beats = Signal(32), Signal(32), Signal(32)
        m.d.comb += [br.m_axis_a_tready.eq((conv_n == 0) & ~in_stall),
                     br.m_axis_b_tready.eq((conv_n == 0) & fifo.w_rdy & ~in_stall
                                           & ~br.m_axis_a_tvalid)]
        with m.If(conv_n != 0):
            m.d.comb += [fifo.w_data.eq(Cat(conv[:32], Const(0xF, 4), conv_n == 1)),
                         fifo.w_en.eq(1)]
            with m.If(fifo.w_rdy):
                m.d.sync += [conv.eq(conv >> 32), conv_n.eq(conv_n - 1)]
        with m.Elif(br.m_axis_b_tvalid & br.m_axis_b_tready):
            m.d.comb += [fifo.w_data.eq(Cat(br.m_axis_b_tdata, Const(0, 16), Const(0x3, 4),
                                            Const(1, 1))),
                         fifo.w_en.eq(1)]
            m.d.sync += b_beats.eq(b_beats + 1)
        with m.If(br.m_axis_a_tvalid & br.m_axis_a_tready):
            m.d.sync += [conv.eq(br.m_axis_a_tdata), conv_n.eq(4), a_beats.eq(a_beats + 1)]

        presenting = Signal()          # y offered and not yet taken: keep tvalid up
        y_valid = fifo.r_rdy & (presenting | ~y_gap)
        m.d.comb += [br.s_axis_y_tvalid.eq(y_valid), br.s_axis_y_tdata.eq(fifo.r_data[:32]),
                     br.s_axis_y_tlast.eq(fifo.r_data[36]),
                     fifo.r_en.eq(y_valid & br.s_axis_y_tready)]
        if br.output_keep:
            m.d.comb += br.s_axis_y_tkeep.eq(fifo.r_data[32:36])
        m.d.sync += presenting.eq(y_valid & ~br.s_axis_y_tready)
        with m.If(y_valid & br.s_axis_y_tready):
            m.d.sync += y_beats.eq(y_beats + 1)

        # -- the register file ---------------------------------------------------------------
        regs = [Signal(32, name=f"r{k}") for k in range(8)]
        aw_have, w_have = Signal(), Signal()
        aw_addr, w_data, w_strb = Signal(_ADDR_WIDTH), Signal(32), Signal(4)
        bvalid, bresp, rvalid, rresp, rdata = Signal(), Signal(2), Signal(), Signal(2), Signal(32)
        m.d.comb += [br.m_axil_awready.eq(~aw_have & ~aw_stall),
                     br.m_axil_wready.eq(~w_have & ~w_stall),
                     br.m_axil_bvalid.eq(bvalid), br.m_axil_bresp.eq(bresp),
                     br.m_axil_arready.eq(~rvalid & ~ar_stall),
                     br.m_axil_rvalid.eq(rvalid), br.m_axil_rresp.eq(rresp),
                     br.m_axil_rdata.eq(rdata)]
        with m.If(br.m_axil_awvalid & br.m_axil_awready):
            m.d.sync += [aw_have.eq(1), aw_addr.eq(br.m_axil_awaddr)]
        with m.If(br.m_axil_wvalid & br.m_axil_wready):
            m.d.sync += [w_have.eq(1), w_data.eq(br.m_axil_wdata), w_strb.eq(br.m_axil_wstrb)]
        with m.If(bvalid & br.m_axil_bready):
            m.d.sync += bvalid.eq(0)
        mask = Cat(*(w_strb[k // 8] for k in range(32)))

        def merged(old):
            return (old & ~mask) | (w_data & mask)

        with m.If(aw_have & w_have & ~bvalid):
            m.d.sync += [aw_have.eq(0), w_have.eq(0), bvalid.eq(1), bresp.eq(2)]
            with m.Switch(aw_addr[2:]):
                for k, reg in enumerate(regs):
                    with m.Case(k):
                        m.d.sync += [reg.eq(merged(reg)), bresp.eq(0)]
                with m.Case(REGS["STALL"] >> 2):
                    m.d.sync += [stall.eq(merged(stall)), bresp.eq(0)]

        with m.If(rvalid & br.m_axil_rready):
            m.d.sync += rvalid.eq(0)
        with m.If(br.m_axil_arvalid & br.m_axil_arready):
            m.d.sync += [rvalid.eq(1), rresp.eq(0), rdata.eq(0)]
            with m.Switch(br.m_axil_araddr[2:]):
                for k, reg in enumerate(regs):
                    with m.Case(k):
                        m.d.sync += rdata.eq(reg)
                for name, value in (("ID", DEVICE_ID), ("STALL", stall), ("A_BEATS", a_beats),
                                    ("B_BEATS", b_beats), ("Y_BEATS", y_beats)):
                    with m.Case(REGS[name] >> 2):
                        m.d.sync += rdata.eq(value)
                with m.Default():
                    m.d.sync += [rresp.eq(2), rdata.eq(0xDEAD_BEEF)]
        return m
