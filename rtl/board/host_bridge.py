"""A UART host link: a PC drives a core's AXI4-Lite slave and AXI4-Stream ports over 8N1 frames.

The wire protocol (all multi-byte fields little-endian; ``B`` is a stream's beat width in
bytes, ``Y`` the output's, ``K = ceil(Y / 8)``):

Host to board:

=========================================  ===================================================
``0x57`` ('W') addr:u16 data:u32            AXI4-Lite write of ``data`` to ``addr`` (all four
                                            byte strobes). Reply ``0x77`` ('w') resp:u8 after
                                            the write response (B channel).
``0x52`` ('R') addr:u16                     AXI4-Lite read. Reply ``0x72`` ('r') resp:u8
                                            data:u32.
``0x53`` ('S') stream:u8 count:u16 then     ``count`` beats (1..65535) for input stream
``count * B`` bytes                         ``stream`` (ids in the order of ``inputs``), a
                                            beat's bytes lowest first (``tdata[7:0]`` first).
                                            Reply ``0x73`` ('s') stream:u8 once every beat was
                                            accepted (``tvalid & tready``).
any other byte                              Dropped; reply ``0x65`` ('e') byte:u8.
=========================================  ===================================================

The host keeps at most one frame outstanding (it waits for the reply before sending the
next) and a frame, header included, is at most ``rx_fifo`` bytes: the board buffers
received bytes in an ``rx_fifo``-byte FIFO (block RAM), which then never overflows, even
while a stream is back-pressured. Two cases outside the protocol have a defined answer: an
``S`` frame with ``count`` 0 is answered ``0x73`` stream at once; an ``S`` frame naming a
stream id that does not exist is answered ``0x65 0x53`` and only its 4-byte header is dropped
(the board cannot know the payload's length). Address bits above ``addr_width`` are ignored.

Board to host, unsolicited: each beat of the output stream ``y`` as ``0x79`` ('y'), ``Y``
``tdata`` bytes (lowest first), ``K`` ``tkeep`` bytes (only with ``output_keep``; bit ``j``
of ``tkeep`` is bit ``j % 8`` of keep byte ``j // 8``) and a flags byte (bit 0: ``tlast``).

Frames to the host are atomic (never interleaved byte-wise); y frames and replies share the
line round-robin, so ``y`` waits at most one reply frame (6 bytes) between its frames and is
never blocked by the host's traffic: it drains at the UART's rate whatever the host does,
and a core whose input needs its output drained cannot deadlock the link.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from amaranth.hdl import Cat, Const, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from qaccel.model.validate import check_bool, check_int
from qaccel.rtl.board.uart_rx import UartRx
from qaccel.rtl.board.uart_tx import UartTx

__all__ = [
    "HEADER_BYTES",
    "MAX_BEATS",
    "TAGS",
    "TAG_ERROR",
    "TAG_READ",
    "TAG_READ_REPLY",
    "TAG_STREAM",
    "TAG_STREAM_REPLY",
    "TAG_WRITE",
    "TAG_WRITE_REPLY",
    "TAG_Y",
    "HostBridge",
    "baud_divisor",
]

# The tags (qaccel.board.protocol, the host's side, imports them).
TAG_WRITE, TAG_READ, TAG_STREAM = 0x57, 0x52, 0x53
TAG_WRITE_REPLY, TAG_READ_REPLY, TAG_STREAM_REPLY = 0x77, 0x72, 0x73
TAG_ERROR, TAG_Y = 0x65, 0x79
#: The tags by name.
TAGS = {"write": TAG_WRITE, "read": TAG_READ, "stream": TAG_STREAM,
        "write_ack": TAG_WRITE_REPLY, "read_data": TAG_READ_REPLY,
        "stream_ack": TAG_STREAM_REPLY, "error": TAG_ERROR, "y": TAG_Y}
#: Bytes of an ``S`` frame's header; beats an ``S`` frame may carry at most.
HEADER_BYTES, MAX_BEATS = 4, 65535
_WRITE_BYTES = 7          # the longest register frame


def baud_divisor(clk_hz: float, baud: float, *, tolerance: float = 0.01) -> int:
    """Return the divisor giving ``baud`` from a ``clk_hz`` clock; ValueError if the nearest
    one misses ``baud`` by more than ``tolerance`` (relative) or is below 4."""
    if not clk_hz > 0 or not baud > 0:
        raise ValueError(f"clk_hz and baud must be positive, not {clk_hz!r} and {baud!r}")
    divisor = round(clk_hz / baud)
    if divisor < 4:
        raise ValueError(f"baud {baud} needs a divisor of at least 4 at {clk_hz} Hz, "
                         f"not {clk_hz / baud:.3g}")
    error = abs(clk_hz / divisor - baud) / baud
    if error > tolerance:
        raise ValueError(f"baud {baud} is {error:.2%} off with divisor {divisor} at {clk_hz} Hz "
                         f"(tolerance {tolerance:.2%})")
    return divisor


class HostBridge(wiring.Component):
    """Serve the UART protocol of this module's docstring on ``uart_rx`` / ``uart_tx``
    (``divisor`` clock cycles per bit, at least 4) as an AXI4-Lite master (``m_axil_*``,
    ``addr_width`` address bits, 32-bit data), one AXI4-Stream master per entry of
    ``inputs`` (``m_axis_<name>_tdata/tvalid/tready``, ``8 * width`` data bits) and one
    AXI4-Stream slave for the core's output (``s_axis_y_tdata/tkeep/tlast/tvalid/tready``;
    ``tkeep`` only with ``output_keep``). Everything runs in the ``sync`` domain.

    ``inputs`` maps stream names (Python identifiers, at most 256) to beat widths in bytes
    (1..128); ``output_bytes`` is 1..128. ``rx_fifo`` (block RAM) is the largest frame the
    host may send, at least ``max(7, 4 + widest input)`` bytes.

    Throughput: each direction runs at the UART's rate (one byte per ``10 * divisor``
    cycles); a stream beat goes out one cycle after its last byte leaves the FIFO and is held
    until taken; AXI4-Lite does one transaction at a time (AW and W together). ``y`` is
    taken (``tready``) when its frame starts: one beat per ``10 * divisor * (2 + Y + K)``
    cycles.
    """

    def __init__(self, inputs: Mapping[str, int], output_bytes: int, output_keep: bool, *,
                 divisor: int, rx_fifo: int = 2048, addr_width: int = 12):
        if not isinstance(inputs, Mapping):
            raise TypeError(f"inputs must be a mapping of stream names to byte widths, "
                            f"not {inputs!r}")
        if len(inputs) > 256:
            raise ValueError(f"inputs must name at most 256 streams, not {len(inputs)}")
        self._inputs = {}
        for name, width in inputs.items():
            if not isinstance(name, str) or not name.isidentifier():
                raise ValueError(f"inputs must be named by identifiers, not {name!r}")
            self._inputs[name] = check_int(f"inputs[{name!r}]", width, 1, 128)
        self._output_bytes = check_int("output_bytes", output_bytes, 1, 128)
        self._output_keep = check_bool("output_keep", output_keep)
        self._divisor = check_int("divisor", divisor, 4, 1 << 24)
        widest = max(self._inputs.values(), default=0)
        self._rx_fifo = check_int("rx_fifo", rx_fifo, max(_WRITE_BYTES, HEADER_BYTES + widest),
                                  1 << 20)
        self._addr_width = check_int("addr_width", addr_width, 2, 16)

        ports = {"uart_rx": In(1, init=1), "uart_tx": Out(1, init=1)}
        for name, width, flow in (
                ("awaddr", addr_width, Out), ("awvalid", 1, Out), ("awready", 1, In),
                ("wdata", 32, Out), ("wstrb", 4, Out), ("wvalid", 1, Out), ("wready", 1, In),
                ("bresp", 2, In), ("bvalid", 1, In), ("bready", 1, Out),
                ("araddr", addr_width, Out), ("arvalid", 1, Out), ("arready", 1, In),
                ("rdata", 32, In), ("rresp", 2, In), ("rvalid", 1, In), ("rready", 1, Out)):
            ports[f"m_axil_{name}"] = flow(width)
        for name, width in self._inputs.items():
            ports[f"m_axis_{name}_tdata"] = Out(8 * width)
            ports[f"m_axis_{name}_tvalid"] = Out(1)
            ports[f"m_axis_{name}_tready"] = In(1)
        ports["s_axis_y_tdata"] = In(8 * output_bytes)
        if output_keep:
            ports["s_axis_y_tkeep"] = In(output_bytes)
        ports |= {"s_axis_y_tlast": In(1), "s_axis_y_tvalid": In(1), "s_axis_y_tready": Out(1)}
        super().__init__(ports)

    @property
    def inputs(self) -> dict[str, int]:
        return dict(self._inputs)

    @property
    def output_bytes(self) -> int:
        return self._output_bytes

    @property
    def output_keep(self) -> bool:
        return self._output_keep

    @property
    def divisor(self) -> int:
        return self._divisor

    @property
    def rx_fifo(self) -> int:
        return self._rx_fifo

    @property
    def addr_width(self) -> int:
        return self._addr_width

    @property
    def y_frame_bytes(self) -> int:
        """Bytes of one ``y`` frame: tag, tdata, tkeep (if any), flags."""
        keep = math.ceil(self._output_bytes / 8) if self._output_keep else 0
        return 2 + self._output_bytes + keep

    def frame_beats(self, stream: str) -> int:
        """Return the most beats one ``S`` frame for ``stream`` may carry."""
        if stream not in self._inputs:
            raise ValueError(f"stream must be one of {', '.join(self._inputs) or '(none)'}, "
                             f"not {stream!r}")
        return min(MAX_BEATS, (self._rx_fifo - HEADER_BYTES) // self._inputs[stream])

    def elaborate(self, platform):
        m = Module()
        m.submodules.rx = rx = UartRx(self._divisor)
        m.submodules.tx = tx = UartTx(self._divisor)
        # one more entry than rx_fifo: the memory itself then holds rx_fifo bytes
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=8, depth=self._rx_fifo + 1)
        m.d.comb += [rx.rx.eq(self.uart_rx), self.uart_tx.eq(tx.tx),
                     fifo.w_data.eq(rx.o.payload), fifo.w_en.eq(rx.o.valid),
                     rx.o.ready.eq(fifo.w_rdy)]

        # -- replies: one slot, filled by the command engine, emptied by the TX framer -------
        rep_valid = Signal()
        rep_data = Signal(48)
        rep_len = Signal(range(7))

        def reply(tag, *fields):
            data = Cat(Const(tag, 8), *fields)
            return [rep_data.eq(data), rep_len.eq(len(data) // 8), rep_valid.eq(1)]

        self._commands(m, fifo, reply, rep_valid)
        self._transmit(m, tx, rep_valid, rep_data, rep_len)
        return m

    def _commands(self, m, fifo, reply, rep_valid):
        names = list(self._inputs)
        widest = max(self._inputs.values(), default=1)
        byte = fifo.r_data
        tag = Signal(8)
        hdr = Signal(48)                   # header bytes, shifted in from the top
        need = Signal(range(6))            # header bytes still to read, minus one
        beat = Signal(8 * widest)          # beat bytes, shifted in from the top
        bleft = Signal(range(widest))      # beat bytes still to read, minus one
        left = Signal(16)                  # beats of the frame not yet accepted
        sid = hdr[24:32]
        count = hdr[32:48]
        awvalid, wvalid, arvalid = Signal(), Signal(), Signal()
        m.d.comb += [
            self.m_axil_awaddr.eq(hdr[:16]), self.m_axil_wdata.eq(hdr[16:48]),
            self.m_axil_wstrb.eq(0xF), self.m_axil_araddr.eq(hdr[32:48]),
            self.m_axil_awvalid.eq(awvalid), self.m_axil_wvalid.eq(wvalid),
            self.m_axil_arvalid.eq(arvalid),
        ]
        for name, width in self._inputs.items():
            m.d.comb += getattr(self, f"m_axis_{name}_tdata").eq(beat[8 * (widest - width):])
        ready = Signal()                   # tready of the stream of the current frame
        with m.Switch(sid):
            for k, name in enumerate(names):
                with m.Case(k):
                    m.d.comb += ready.eq(getattr(self, f"m_axis_{name}_tready"))

        def load_beat():
            with m.Switch(sid):
                for k, name in enumerate(names):
                    with m.Case(k):
                        m.d.sync += bleft.eq(self._inputs[name] - 1)

        with m.FSM(name="command"):
            with m.State("tag"):
                with m.If(fifo.r_rdy & ~rep_valid):
                    m.d.comb += fifo.r_en.eq(1)
                    m.d.sync += tag.eq(byte)
                    with m.Switch(byte):
                        with m.Case(TAG_WRITE):
                            m.d.sync += need.eq(5)
                            m.next = "header"
                        with m.Case(TAG_READ):
                            m.d.sync += need.eq(1)
                            m.next = "header"
                        with m.Case(TAG_STREAM):
                            m.d.sync += need.eq(2)
                            m.next = "header"
                        with m.Default():
                            m.d.sync += reply(TAG_ERROR, byte)
            with m.State("header"):
                with m.If(fifo.r_rdy):
                    m.d.comb += fifo.r_en.eq(1)
                    m.d.sync += [hdr.eq(Cat(hdr[8:], byte)), need.eq(need - 1)]
                    with m.If(need == 0):
                        m.next = "dispatch"
            with m.State("dispatch"):
                with m.Switch(tag):
                    with m.Case(TAG_WRITE):
                        m.d.sync += [awvalid.eq(1), wvalid.eq(1)]
                        m.next = "write"
                    with m.Case(TAG_READ):
                        m.d.sync += arvalid.eq(1)
                        m.next = "read"
                    with m.Default():
                        with m.If(sid >= len(names)):
                            m.d.sync += reply(TAG_ERROR, Const(TAG_STREAM, 8))
                            m.next = "tag"
                        with m.Elif(count == 0):
                            m.d.sync += reply(TAG_STREAM_REPLY, sid)
                            m.next = "tag"
                        with m.Else():
                            m.d.sync += left.eq(count)
                            load_beat()
                            m.next = "beat"
            with m.State("write"):
                with m.If(self.m_axil_awready):
                    m.d.sync += awvalid.eq(0)
                with m.If(self.m_axil_wready):
                    m.d.sync += wvalid.eq(0)
                m.d.comb += self.m_axil_bready.eq(~awvalid & ~wvalid)
                with m.If(self.m_axil_bready & self.m_axil_bvalid):
                    m.d.sync += reply(TAG_WRITE_REPLY, self.m_axil_bresp, Const(0, 6))
                    m.next = "tag"
            with m.State("read"):
                with m.If(self.m_axil_arready):
                    m.d.sync += arvalid.eq(0)
                m.d.comb += self.m_axil_rready.eq(~arvalid)
                with m.If(self.m_axil_rready & self.m_axil_rvalid):
                    m.d.sync += reply(TAG_READ_REPLY, self.m_axil_rresp, Const(0, 6),
                                      self.m_axil_rdata)
                    m.next = "tag"
            with m.State("beat"):
                with m.If(fifo.r_rdy):
                    m.d.comb += fifo.r_en.eq(1)
                    m.d.sync += [beat.eq(Cat(beat[8:], byte)), bleft.eq(bleft - 1)]
                    with m.If(bleft == 0):
                        m.next = "push"
            with m.State("push"):
                with m.Switch(sid):
                    for k, name in enumerate(names):
                        with m.Case(k):
                            m.d.comb += getattr(self, f"m_axis_{name}_tvalid").eq(1)
                with m.If(ready):
                    m.d.sync += left.eq(left - 1)
                    with m.If(left == 1):
                        m.d.sync += reply(TAG_STREAM_REPLY, sid)
                        m.next = "tag"
                    with m.Else():
                        load_beat()
                        m.next = "beat"

    def _transmit(self, m, tx, rep_valid, rep_data, rep_len):
        ob = self._output_bytes
        kb = math.ceil(ob / 8) if self._output_keep else 0
        y_len = self.y_frame_bytes
        length = max(6, y_len)
        txsh = Signal(8 * length)          # the frame being sent, next byte lowest
        txn = Signal(range(length + 1))    # its bytes still to send
        last_y = Signal()                  # the previous frame was a y frame (round-robin)
        m.d.comb += [tx.i.payload.eq(txsh[:8]), tx.i.valid.eq(txn != 0)]
        with m.If(tx.i.valid & tx.i.ready):
            m.d.sync += [txsh.eq(txsh >> 8), txn.eq(txn - 1)]
        with m.If(txn == 0):
            with m.If(self.s_axis_y_tvalid & (~rep_valid | ~last_y)):
                keep = []
                if self._output_keep:
                    keep = [self.s_axis_y_tkeep, Const(0, 8 * kb - ob)]
                frame = Cat(Const(TAG_Y, 8), self.s_axis_y_tdata, *keep,
                            self.s_axis_y_tlast, Const(0, 7))
                m.d.comb += self.s_axis_y_tready.eq(1)
                m.d.sync += [txsh.eq(frame), txn.eq(y_len), last_y.eq(1)]
            with m.Elif(rep_valid):
                m.d.sync += [txsh.eq(rep_data), txn.eq(rep_len), rep_valid.eq(0),
                             last_y.eq(0)]
