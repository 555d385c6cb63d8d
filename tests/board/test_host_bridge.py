# amaranth: UnusedElaboratable=no
"""HostBridge: its parameters and ports, the protocol on Amaranth's simulator (a bit-level
UART model and the host's encoders and parser), and the whole link on Verilator / Icarus:
the blocking HostLink code driving LoopDevice through cocotbext-uart (sim/tb_host_bridge.py).
"""

from __future__ import annotations

import random

import pytest
from amaranth.hdl import Shape
from amaranth.lib import wiring
from amaranth.sim import Simulator

from qaccel.board import protocol
from qaccel.board.protocol import (
    ErrorReply,
    FrameParser,
    ReadReply,
    StreamReply,
    WriteReply,
    YBeat,
    encode_read,
    encode_stream,
    encode_write,
)
from qaccel.rtl.board import host_bridge
from qaccel.rtl.board.host_bridge import HostBridge, baud_divisor
from qaccel.sim.runner import missing_simulator, run_cocotb
from tests.board.loop_device import (
    DEVICE_ID,
    INPUTS,
    OUTPUT_BYTES,
    REGS,
    LoopDevice,
    expected_y,
)

# -- parameters and ports ----------------------------------------------------------------------


def test_host_bridge_ports():
    """The flat AXI4-Lite master and AXI4-Stream ports, named and sized as the board top
    expects."""
    b = HostBridge({"x": 16, "table": 3}, 5, True, divisor=8, addr_width=10)
    ports = {n: (m.flow, Shape.cast(m.shape).width) for n, m in b.signature.members.items()}
    O, I = wiring.Out, wiring.In
    want = {"uart_rx": (I, 1), "uart_tx": (O, 1),
            "m_axil_awaddr": (O, 10), "m_axil_awvalid": (O, 1), "m_axil_awready": (I, 1),
            "m_axil_wdata": (O, 32), "m_axil_wstrb": (O, 4), "m_axil_wvalid": (O, 1),
            "m_axil_wready": (I, 1), "m_axil_bresp": (I, 2), "m_axil_bvalid": (I, 1),
            "m_axil_bready": (O, 1), "m_axil_araddr": (O, 10), "m_axil_arvalid": (O, 1),
            "m_axil_arready": (I, 1), "m_axil_rdata": (I, 32), "m_axil_rresp": (I, 2),
            "m_axil_rvalid": (I, 1), "m_axil_rready": (O, 1),
            "m_axis_x_tdata": (O, 128), "m_axis_x_tvalid": (O, 1), "m_axis_x_tready": (I, 1),
            "m_axis_table_tdata": (O, 24), "m_axis_table_tvalid": (O, 1),
            "m_axis_table_tready": (I, 1),
            "s_axis_y_tdata": (I, 40), "s_axis_y_tkeep": (I, 5), "s_axis_y_tlast": (I, 1),
            "s_axis_y_tvalid": (I, 1), "s_axis_y_tready": (O, 1)}
    assert ports == want
    assert b.frame_beats("x") == (2048 - 4) // 16 and b.frame_beats("table") == 681
    assert b.y_frame_bytes == 1 + 5 + 1 + 1
    plain = HostBridge({}, 9, False, divisor=4, rx_fifo=7)
    assert "s_axis_y_tkeep" not in plain.signature.members and plain.y_frame_bytes == 11
    assert HostBridge({"w": 1}, 1, False, divisor=4, rx_fifo=1 << 17).frame_beats("w") == 65535


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"inputs": [("x", 4)]}, TypeError, r"inputs must be a mapping"),
    ({"inputs": {"2x": 4}}, ValueError, r"inputs must be named by identifiers, not '2x'"),
    ({"inputs": {"x": 0}}, ValueError, r"inputs\['x'\] must be in \[1, 128\], not 0"),
    ({"inputs": {f"s{k}": 1 for k in range(257)}}, ValueError, r"at most 256 streams, not 257"),
    ({"output_bytes": 129}, ValueError, r"output_bytes must be in \[1, 128\], not 129"),
    ({"output_keep": 1}, TypeError, r"output_keep must be a bool, not 1"),
    ({"divisor": 3}, ValueError, r"divisor must be in \[4, \d+\], not 3"),
    ({"rx_fifo": 19}, ValueError, r"rx_fifo must be in \[20, \d+\], not 19"),
    ({"addr_width": 17}, ValueError, r"addr_width must be in \[2, 16\], not 17"),
    ({"addr_width": "12"}, TypeError, r"addr_width must be an integer, not '12'"),
])
def test_host_bridge_parameter_checks(kwargs, error, message):
    args = {"inputs": {"x": 16}, "output_bytes": 4, "output_keep": True, "divisor": 8} | kwargs
    with pytest.raises(error, match=message):
        HostBridge(args.pop("inputs"), args.pop("output_bytes"), args.pop("output_keep"),
                   **args)
    with pytest.raises(ValueError, match=r"stream must be one of x, not 'y'"):
        HostBridge({"x": 1}, 1, False, divisor=4).frame_beats("y")


def test_tags_agree():
    """The host's copy of the tags is the gateware's."""
    assert protocol.TAGS == host_bridge.TAGS
    for name in ("TAG_WRITE", "TAG_READ", "TAG_STREAM", "TAG_WRITE_REPLY", "TAG_READ_REPLY",
                 "TAG_STREAM_REPLY", "TAG_ERROR", "TAG_Y", "HEADER_BYTES", "MAX_BEATS"):
        assert getattr(protocol, name) == getattr(host_bridge, name), name


def test_baud_divisor():
    assert baud_divisor(100e6, 1_000_000) == 100
    assert baud_divisor(12e6, 1_000_000) == 12
    assert baud_divisor(25e6, 115200) == 217          # 0.03 % off
    with pytest.raises(ValueError, match=r"baud 2600000 is 7.69% off with divisor 5"):
        baud_divisor(12e6, 2_600_000)
    with pytest.raises(ValueError, match=r"divisor of at least 4"):
        baud_divisor(12e6, 4_000_000)


# -- the protocol on Amaranth's simulator ------------------------------------------------------


def run_script(dut: LoopDevice, script: list[bytes], *, divisor: int, keep: bool = True,
               drain: int = 0, max_wait: int = 200_000) -> list:
    """Send each frame of ``script`` bit by bit on ``uart_rx`` and wait for its reply (a
    frame that is not a y beat) before the next, decoding ``uart_tx`` throughout; return
    every frame received, in order, after ``drain`` more byte times."""
    parser = FrameParser(4, keep)
    frames: list = []
    d = divisor

    async def bench(ctx):
        state = {"count": 0, "bits": [], "timer": 0}

        async def step():
            # decode uart_tx: a falling edge, then a sample in the middle of each bit
            level = ctx.get(dut.uart_tx)
            if state["count"] == 0:
                if level == 0:
                    state.update(count=10, timer=d // 2, bits=[])
            else:
                state["timer"] -= 1
                if state["timer"] == 0:
                    state["bits"].append(level)
                    state["count"] -= 1
                    state["timer"] = d
                    if state["count"] == 0:
                        bits = state["bits"]
                        assert bits[0] == 0 and bits[9] == 1, bits
                        byte = sum(b << k for k, b in enumerate(bits[1:9]))
                        frames.extend(parser.feed(bytes([byte])))
                        state["count"] = 0
            await ctx.tick()

        ctx.set(dut.uart_rx, 1)
        for _ in range(8):
            await step()
        for frame in script:
            replies = sum(not isinstance(f, YBeat) for f in frames)
            for byte in frame:
                for bit in [0] + [byte >> k & 1 for k in range(8)] + [1]:
                    ctx.set(dut.uart_rx, bit)
                    for _ in range(d):
                        await step()
            for _ in range(max_wait):
                if sum(not isinstance(f, YBeat) for f in frames) > replies:
                    break
                await step()
            else:
                raise AssertionError(f"no reply to {frame.hex()} within {max_wait} cycles")
        for _ in range(drain * 10 * d):
            await step()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return frames


def test_host_bridge_protocol_amaranth():
    """Every kind of frame once: writes and reads (OKAY and SLVERR, byte order, address bits
    above addr_width ignored), stream frames looped back as y beats, an unknown tag, an
    unknown stream id and an empty stream frame."""
    rng = random.Random(1)
    a = [rng.getrandbits(128) for _ in range(3)]
    script = [
        encode_write(0x04, 0x1234_5678), encode_read(0x04), encode_read(REGS["ID"]),
        encode_read(0x1004),                          # = 0x04 with 8 address bits
        encode_write(REGS["ID"], 1), encode_read(0xFC),
        bytes([0x00]), bytes([0x53, 2, 1, 0]), bytes([0x53, 1, 0, 0]),
        encode_stream(0, b"".join(v.to_bytes(16, "little") for v in a), 16),
        encode_stream(1, bytes([0x34, 0x12, 0xCD, 0xAB]), 2),
        encode_read(REGS["A_BEATS"]),
    ]
    frames = run_script(LoopDevice(divisor=4, rx_fifo=64), script, divisor=4, drain=120)
    replies = [f for f in frames if not isinstance(f, YBeat)]
    assert replies == [
        WriteReply(0), ReadReply(0, 0x1234_5678), ReadReply(0, DEVICE_ID),
        ReadReply(0, 0x1234_5678), WriteReply(2), ReadReply(2, 0xDEAD_BEEF),
        ErrorReply(0x00), ErrorReply(0x53), StreamReply(1), StreamReply(0), StreamReply(1),
        ReadReply(0, 3)]
    beats = [tuple(f) for f in frames if isinstance(f, YBeat)]
    assert beats == expected_y("a", a) + expected_y("b", [0x1234, 0xABCD])


def test_host_bridge_no_keep_amaranth():
    """Without tkeep a y frame is tag, tdata and flags; the host reports tkeep all ones."""
    frames = run_script(LoopDevice(divisor=5, rx_fifo=24, output_keep=False),
                        [encode_stream(1, bytes([0x01, 0x02]), 2)], divisor=5, keep=False,
                        drain=10)
    assert frames == [StreamReply(1), YBeat(0x0201, 0xF, True)] or frames == [
        YBeat(0x0201, 0xF, True), StreamReply(1)]


# -- the whole link on an HDL simulator --------------------------------------------------------


def simulator_param(name: str):
    reason = missing_simulator(name)
    return pytest.param(name, id=name,
                        marks=pytest.mark.skipif(reason is not None, reason=reason or ""))


#: (simulator, device parameters, testbench parameters). Verilator: the 2048-byte FIFO, heavy
#: stalls and host pauses, the random part in frames of at most 64 bytes (3 ``a`` beats),
#: then frames as long as the FIFO. Icarus: the smallest divisor, a 40-byte FIFO that whole
#: frames fill, no tkeep.
SIM_CASES = [
    pytest.param("verilator", {"divisor": 8, "rx_fifo": 2048},
                 {"host_rx_fifo": 64, "ops": 60, "stall": [96, 64, 128], "gap": 0.05,
                  "long": 140}, id="verilator"),
    pytest.param("icarus", {"divisor": 4, "rx_fifo": 40, "output_keep": False},
                 {"ops": 30, "stall": [64, 64, 64], "gap": 0.1}, id="icarus"),
]


@pytest.mark.sim
@pytest.mark.parametrize(("simulator", "device", "tb"), SIM_CASES)
def test_host_bridge_sim(simulator, device, tb):
    reason = missing_simulator(simulator)
    if reason:
        pytest.skip(reason)
    dut = LoopDevice(**device)
    config = {**device, **tb, "seed": 5,
              "device": {"id": DEVICE_ID, "regs": REGS, "inputs": INPUTS,
                         "output_bytes": OUTPUT_BYTES}}
    res = run_cocotb(dut, name="loop_device", test_module="tb_host_bridge",
                     simulator=simulator, config=config)
    assert res.ok and res.passed == res.tests == 3, res
    streams = res.records["streams"]
    assert streams["y_beats"] == streams["expected_beats"] > 0
    assert streams["interleaved_replies"] > 0          # replies arrived between y frames
    assert streams["frames"] > streams["sends"]          # sends were split
    if "long" in tb:
        assert streams["long_frames"] == -(-tb["long"] // ((device["rx_fifo"] - 4) // 16)) > 1


# -- the host side (pure Python, a fake board as the transport) --------------------------------


class FakeBoard:
    """A transport playing the board: it parses the host's frames, answers each through
    ``handler`` (default: a register file and stream acks), inserts ``y_per_reply`` y frames
    before each reply, serves reads ``chunk`` bytes at a time and advances :meth:`clock` by
    0.1 s on a read that finds nothing. It checks the host keeps one frame outstanding."""

    def __init__(self, widths, *, handler=None, chunk=3, y_per_reply=0, keep=True,
                 in_waiting=False):
        self.widths = widths                 # stream id -> beat bytes
        self.handler = handler or self.answer
        self.chunk, self.y_per_reply, self.keep = chunk, y_per_reply, keep
        self.out = bytearray()
        self.inbox = bytearray()
        self.frames: list[bytes] = []
        self.regs: dict[int, int] = {}
        self.now = 0.0
        self.y_sent = []
        self._read_pos = self._reply_end = 0
        self._y_counter = 0
        if in_waiting:
            self.in_waiting = 0

    def clock(self) -> float:
        return self.now

    def y(self, tdata: int, tkeep: int = 0xF, tlast: bool = False) -> None:
        """Queue a y frame (4 data bytes)."""
        self.y_sent.append((tdata, tkeep if self.keep else 0xF, tlast))
        self.out += bytes([0x79]) + tdata.to_bytes(4, "little")
        self.out += bytes([tkeep]) if self.keep else b""
        self.out += bytes([int(tlast)])

    def answer(self, frame: bytes) -> bytes:
        tag = frame[0]
        if tag == 0x57:
            self.regs[int.from_bytes(frame[1:3], "little")] = int.from_bytes(frame[3:7],
                                                                             "little")
            return bytes([0x77, 0])
        if tag == 0x52:
            value = self.regs.get(int.from_bytes(frame[1:3], "little"), 0)
            return bytes([0x72, 0]) + value.to_bytes(4, "little")
        return bytes([0x73, frame[1]])

    def _length(self) -> int | None:
        buf = self.inbox
        if buf[0] == 0x57:
            return 7
        if buf[0] == 0x52:
            return 3
        if buf[0] == 0x53 and len(buf) >= 4:
            return 4 + int.from_bytes(buf[2:4], "little") * self.widths[buf[1]]
        return None if buf[0] == 0x53 else 1

    def write(self, data: bytes) -> None:
        for byte in data:
            if not self.inbox:
                assert self._read_pos >= self._reply_end, "a frame sent before the last reply"
            self.inbox.append(byte)
            n = self._length()
            if n is not None and len(self.inbox) == n:
                frame = bytes(self.inbox)
                self.inbox.clear()
                self.frames.append(frame)
                for _ in range(self.y_per_reply):
                    self._y_counter += 1
                    self.y(self._y_counter, 0xF, self._y_counter % 3 == 0)
                self.out += self.handler(frame)
                self._reply_end = self._read_pos + len(self.out)

    def read(self, n: int) -> bytes:
        if hasattr(self, "in_waiting"):
            self.in_waiting = len(self.out)
        if not self.out:
            self.now += 0.1
            return b""
        k = min(n, self.chunk, len(self.out))
        data = bytes(self.out[:k])
        del self.out[:k]
        self._read_pos += k
        if hasattr(self, "in_waiting"):
            self.in_waiting = len(self.out)
        return data


def make_link(board: FakeBoard, **kwargs) -> protocol.HostLink:
    kwargs = {"rx_fifo": 64, "timeout": 1.0, "clock": board.clock} | kwargs
    return protocol.HostLink(board, {"a": 16, "b": 2}, 4, board.keep, **kwargs)


def test_encoders():
    assert encode_write(0x1234, 0xAABBCCDD) == bytes.fromhex("573412ddccbbaa")
    assert encode_read(0xFFFF) == bytes.fromhex("52ffff")
    assert encode_stream(2, bytes(range(6)), 2) == bytes.fromhex("5302030000010203" "0405")
    assert protocol.beat_bytes([0x0102, 0xA0B0], 2) == bytes([2, 1, 0xB0, 0xA0])
    assert protocol.beat_bytes(b"\x01\x02", 2) == b"\x01\x02"
    for call, error, match in (
            (lambda: encode_write(0x10000, 0), ValueError, r"addr must be in \[0, 65535\]"),
            (lambda: encode_write(0, -1), ValueError, r"value must be in \[0, 4294967295\]"),
            (lambda: encode_read(1.0), TypeError, r"addr must be an integer, not 1.0"),
            (lambda: encode_stream(0, b"", 1), ValueError, r"1..65535 beats of 1 bytes"),
            (lambda: encode_stream(0, bytes(65536), 1), ValueError, r"not 65536 bytes"),
            (lambda: encode_stream(0, bytes(3), 2), ValueError, r"not 3 bytes"),
            (lambda: protocol.beat_bytes([0x10000], 2), ValueError,
             r"beats\[0\] must be in \[0, 65535\], not 65536"),
            (lambda: protocol.beat_bytes(b"\x01", 2), ValueError, r"whole 2-byte beats"),
            (lambda: protocol.frame_beats(16, 19), ValueError,
             r"rx_fifo must hold a frame of one 16-byte beat \(20 bytes\), not 19")):
        with pytest.raises(error, match=match):
            call()


def test_stream_frames_split_at_the_fifo():
    assert protocol.frame_beats(16, 2048) == 127 and protocol.frame_beats(1, 1 << 20) == 65535
    payload = bytes(random.Random(2).randbytes(300 * 16))
    frames = protocol.stream_frames(3, payload, 16, 2048)
    assert [int.from_bytes(f[2:4], "little") for f in frames] == [127, 127, 46]
    assert all(len(f) <= 2048 for f in frames) and len(frames[0]) == 2036
    assert b"".join(f[4:] for f in frames) == payload
    assert protocol.stream_frames(0, bytes(20), 1, 24) == [encode_stream(0, bytes(20), 1)]


def test_frame_parser():
    frames = [bytes([0x77, 2]), bytes([0x72, 0]) + (0xCAFE).to_bytes(4, "little"),
              bytes([0x73, 1]), bytes([0x65, 0x99]),
              bytes([0x79]) + bytes(range(9)) + bytes([0xFF, 0x01, 0x01])]
    want = [WriteReply(2), ReadReply(0, 0xCAFE), StreamReply(1), ErrorReply(0x99),
            YBeat(int.from_bytes(bytes(range(9)), "little"), 0x1FF, True)]
    whole = FrameParser(9, True)
    assert whole.feed(b"".join(frames)) == want
    split = FrameParser(9, True)
    got = []
    for k, byte in enumerate(b"".join(frames)):
        got += split.feed(bytes([byte]))
        assert split.need >= 1, k
    assert got == want and split.need == 1
    p = FrameParser(2, False)
    assert p.feed(bytes([0x79, 1, 2])) == [] and p.need == 1
    assert p.feed(bytes([0])) == [YBeat(0x0201, 0x3, False)]
    with pytest.raises(protocol.ProtocolError, match=r"byte 0x00 from the board starts no"):
        p.feed(bytes([0x00]))
    assert YBeat(0x04030201, 0b0101, True).kept_bytes(4) == bytes([1, 3])


@pytest.mark.parametrize("chunk", [1, 3, 64])
@pytest.mark.parametrize("in_waiting", [False, True])
def test_host_link_registers_and_interleaved_y(chunk, in_waiting):
    """Replies arrive behind y frames in pieces of any size; the y beats are kept, in order,
    for receive()."""
    board = FakeBoard({0: 16, 1: 2}, chunk=chunk, y_per_reply=2, in_waiting=in_waiting)
    link = make_link(board)
    link.write32(0x10, 0xDEADBEEF)
    link.write32(0x14, 7)
    assert link.read32(0x10) == 0xDEADBEEF and link.read32(0x18) == 0
    assert link.pending_beats() == 8
    assert link.receive(3) == board.y_sent[:3]
    assert link.receive() == board.y_sent[3:6]          # up to the next tlast
    assert link.receive(2) == board.y_sent[6:8] and link.pending_beats() == 0
    assert board.frames[0] == encode_write(0x10, 0xDEADBEEF)


def test_host_link_send_splits_frames():
    """A long send goes out in frames of at most rx_fifo bytes, one at a time; ints and
    bytes give the same frames; the y frames arriving meanwhile are kept."""
    board = FakeBoard({0: 16, 1: 2}, y_per_reply=1)
    link = make_link(board)
    beats = [random.Random(3).getrandbits(128) for _ in range(10)]
    assert link.send("a", beats) == 4                   # 3 + 3 + 3 + 1 beats of 16 bytes
    assert [len(f) for f in board.frames] == [52, 52, 52, 20]
    assert link.send("a", protocol.beat_bytes(beats, 16)) == 4
    assert board.frames[:4] == board.frames[4:]
    assert link.send("b", list(range(31))) == 2         # 30 + 1 beats of 2 bytes
    assert link.send("b", []) == 0 and len(board.frames) == 10
    assert link.pending_beats() == 10
    assert make_link(FakeBoard({0: 16, 1: 2}), rx_fifo=2048).send("a", bytes(16 * 200)) == 2


def test_host_link_inputs_by_id():
    """inputs may give each stream's (id, width), as the board description does."""
    board = FakeBoard({5: 3})
    link = protocol.HostLink(board, {"x": (5, 3)}, 4, rx_fifo=64, clock=board.clock)
    link.send("x", [0x030201])
    assert board.frames == [bytes([0x53, 5, 1, 0, 1, 2, 3])]
    assert link.streams == {"x": (5, 3)}


@pytest.mark.parametrize(("reply", "error", "match"), [
    (bytes([0x77, 2]), protocol.ResponseError, r"write of register 0x0024: response 2 \(SLVERR"),
    (bytes([0x77, 3]), protocol.ResponseError, r"write of register 0x0024: response 3 \(DECERR"),
    (bytes([0x65, 0x57]), protocol.ProtocolError, r"rejected tag 0x57 \(sending the write"),
    (bytes([0x73, 0]), protocol.ProtocolError, r"reply 's' StreamReply\(stream=0\) to the "
                                               r"write of 0x1 to 0x0024, expected 'w'"),
    (bytes([0x42]), protocol.ProtocolError, r"byte 0x42 from the board starts no frame"),
])
def test_host_link_errors(reply, error, match):
    board = FakeBoard({0: 16, 1: 2}, handler=lambda frame: reply)
    with pytest.raises(error, match=match):
        make_link(board).write32(0x24, 1)


def test_host_link_read_error_and_stream_id():
    board = FakeBoard({0: 16, 1: 2}, handler=lambda f: bytes([0x72, 2, 0, 0, 0, 0])
                      if f[0] == 0x52 else bytes([0x73, 0]))
    link = make_link(board)
    with pytest.raises(protocol.ResponseError, match=r"read of register 0x0100") as e:
        link.read32(0x100)
    assert (e.value.op, e.value.addr, e.value.resp) == ("read", 0x100, 2)
    with pytest.raises(protocol.ProtocolError, match=r"stream 'b' \(id 1\) was acknowledged "
                                                     r"as stream 0"):
        link.send("b", [1])


def test_host_link_timeouts():
    """A missing reply or missing y beats raise LinkTimeout naming what was awaited; the
    beats that did arrive stay buffered."""
    board = FakeBoard({0: 16, 1: 2}, handler=lambda frame: b"")
    link = make_link(board, timeout=0.5)
    with pytest.raises(protocol.LinkTimeout, match=r"waited 0.5 s for the reply to the read "
                                                   r"of 0x0010$"):
        link.read32(0x10)
    with pytest.raises(TimeoutError, match=r"frame 1 of 1 on stream 'a'"):
        link.send("a", bytes(16), timeout=0.2)
    board = FakeBoard({0: 16, 1: 2})
    link = make_link(board)
    board.y(1)
    with pytest.raises(protocol.LinkTimeout, match=r"waited 0.3 s for 2 y beats; 1 y beats "
                                                   r"arrived \(kept for the next receive\)"):
        link.receive(2, timeout=0.3)
    with pytest.raises(protocol.LinkTimeout, match=r"for a y beat with tlast"):
        link.receive()
    board.y(2, tlast=True)
    assert link.receive() == [(1, 0xF, False), (2, 0xF, True)]


def test_host_link_reply_while_receiving():
    board = FakeBoard({0: 16, 1: 2})
    board.out += bytes([0x77, 0])
    with pytest.raises(protocol.ProtocolError, match=r"unexpected reply 'w' .* while waiting "
                                                     r"for 1 y beats"):
        make_link(board).receive(1)


def test_host_link_argument_checks():
    board = FakeBoard({0: 16, 1: 2})
    link = make_link(board)
    for call, error, match in (
            (lambda: link.write32(0x11, 0), ValueError, r"addr must be a multiple of 4, not "
                                                        r"0x11"),
            (lambda: link.read32(0x10000), ValueError, r"addr must be in \[0, 65532\]"),
            (lambda: link.send("c", b""), ValueError, r"stream must be one of a, b, not 'c'"),
            (lambda: link.send("b", [1 << 16]), ValueError, r"beats\[0\] must be in"),
            (lambda: link.send("a", 5), TypeError, r"beats must be bytes or a sequence"),
            (lambda: link.receive(-1), ValueError, r"n_beats must be in"),
            (lambda: protocol.HostLink(object(), {}, 4), TypeError,
             r"transport must have write\(bytes\) and read\(n\)"),
            (lambda: protocol.HostLink(board, {"a": 70}, 4, rx_fifo=64), ValueError,
             r"rx_fifo must hold a frame of one 70-byte beat"),
            (lambda: protocol.HostLink(board, {}, 4, output_keep=1), TypeError,
             r"output_keep must be a bool")):
        with pytest.raises(error, match=match):
            call()
    assert board.frames == []


def test_open_serial_loopback():
    """open_serial over pyserial's loop:// URL: a y frame written comes back as a beat."""
    from qaccel.board.link import open_serial

    with open_serial("loop://", 115200, timeout=0.01) as transport:
        link = protocol.HostLink(transport, {}, 2, False, timeout=0.5)
        transport.write(bytes([0x79, 0x34, 0x12, 0x01]))
        assert link.receive(1) == [(0x1234, 0x3, True)]
    with pytest.raises(ValueError, match=r"baud must be a positive integer, not 0"):
        open_serial("loop://", 0)
