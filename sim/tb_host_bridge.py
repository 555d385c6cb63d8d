"""cocotb testbench of the UART host link: the blocking :class:`~qaccel.board.protocol.HostLink`
code, run in a :func:`cocotb.task.bridge` thread over :class:`~qaccel.sim.uart_link.UartTransport`
(cocotbext-uart), drives a device made of a :class:`~qaccel.rtl.board.host_bridge.HostBridge`,
a register file and a loop from its input streams to ``y`` (tests/board/loop_device.py).

Parameters (``qaccel.sim.tbconfig.params()``): ``divisor`` (clock cycles a bit), ``rx_fifo``,
``output_keep``; ``host_rx_fifo`` (the frame size HostLink keeps to in the random part of the
stream test, at most ``rx_fifo``: small, to split sends into many frames); ``device``: the
device's ``id``, ``regs`` (name to byte address), ``inputs`` (name to beat bytes) and
``output_bytes``; ``ops`` (random operations of the stream test), ``stall`` ([input
``tready`` stalls, ``y`` gaps, AXI4-Lite ready stalls], each a chance in 256 per cycle),
``gap`` (the chance of an idle pause before a byte the host sends), ``max_a`` / ``max_b``
(most beats of one send), ``long`` (beats of one last send on ``a``, in frames as long as
``rx_fifo`` allows) and ``seed``.

The expected ``y`` beats follow the loop's documented rule: an ``a`` beat (16 bytes) gives
its four 32-bit words (``tkeep`` 0xF, ``tlast`` on the fourth), a ``b`` beat one word
holding it (``tkeep`` 0x3, or 0xF without ``tkeep``; ``tlast`` set).
"""

from __future__ import annotations

import logging
import random

import cocotb
from cocotb.task import bridge

from qaccel.board.protocol import (
    FrameParser,
    HostLink,
    LinkTimeout,
    ProtocolError,
    ReadReply,
    ResponseError,
    StreamReply,
    WriteReply,
    YBeat,
    frame_beats,
)
from qaccel.sim import tbconfig
from qaccel.sim.tb import CLOCK_PERIOD_NS, reset, start_clock
from qaccel.sim.uart_link import UartTransport

log = logging.getLogger("cocotb.qaccel.tb_host_bridge")

DEFAULTS = {"output_keep": True, "host_rx_fifo": None, "ops": 40, "stall": [64, 64, 64],
            "gap": 0.0, "max_a": 12, "max_b": 40, "long": 0, "seed": None}
#: Reply timeout in byte times (a full 2048-byte frame whose beats wait for y to drain).
REPLY_BYTES = 40_000


class RecordingTransport(UartTransport):
    """A UartTransport that also keeps every byte read (to check interleaving)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.log_rx = bytearray()

    def read(self, n: int) -> bytes:
        data = super().read(n)
        self.log_rx += data
        return data


def loop_model(stream: str, value: int, keep: bool) -> list[tuple[int, int, bool]]:
    """The y beats the loop device makes of one beat ``value`` on ``stream``."""
    if stream == "a":
        return [(value >> 32 * k & 0xFFFF_FFFF, 0xF, k == 3) for k in range(4)]
    return [(value, 0x3 if keep else 0xF, True)]


class LinkTB:
    """Clock, reset, the UART transport and the HostLink for one cocotb test."""

    def __init__(self, dut, params: dict):
        self.dut = dut
        self.p = params
        seed = params["seed"] if params["seed"] is not None else cocotb.RANDOM_SEED
        self.rng = random.Random(seed)
        baud = 1e9 / (CLOCK_PERIOD_NS * params["divisor"])
        self.byte_time = 10 / baud                          # seconds of simulated time
        self.transport = RecordingTransport.attach(dut.uart_rx, dut.uart_tx, baud,
                                                   gap=params["gap"],
                                                   rng=random.Random(self.rng.random()))
        dev = params["device"]
        self.regs = dev["regs"]
        self.inputs = dev["inputs"]
        self.keep = params["output_keep"]
        self.link = self.make_link(params["rx_fifo"])

    def make_link(self, rx_fifo: int) -> HostLink:
        """A HostLink on this transport whose frames are at most ``rx_fifo`` bytes."""
        return HostLink(self.transport, self.inputs, self.p["device"]["output_bytes"],
                        self.keep, rx_fifo=rx_fifo, timeout=REPLY_BYTES * self.byte_time,
                        clock=self.transport.now)

    async def start(self) -> None:
        start_clock(self.dut)
        await reset(self.dut)

    def set_stalls(self, tready: int, y_gap: int, axil: int) -> None:
        self.link.write32(self.regs["STALL"], tready | y_gap << 8 | axil << 16)

    def interleaved_replies(self) -> int:
        """Count the register replies received with a y frame right before and after."""
        frames = FrameParser(self.p["device"]["output_bytes"], self.keep).feed(
            bytes(self.transport.log_rx))
        return sum(isinstance(f, (ReadReply, WriteReply)) and isinstance(a, YBeat)
                   and isinstance(b, YBeat) for a, f, b in zip(frames, frames[1:], frames[2:],
                                                                strict=False))


def _params() -> dict:
    params = {**DEFAULTS, **tbconfig.params()}
    log.info("tb_host_bridge params %s", params)
    return params


# -- the tests ---------------------------------------------------------------------------------

@cocotb.test()
async def registers(dut):
    """Register writes and reads through a slave that stalls AW, W and AR at random; SLVERR
    names the address; an unknown tag, an unknown stream id and an empty stream frame get
    their defined replies; the link stays in step after each."""
    tb = LinkTB(dut, _params())
    await tb.start()

    @bridge
    def host():
        link, regs, rng = tb.link, tb.regs, tb.rng
        tb.set_stalls(0, 0, 200)
        values = [rng.getrandbits(32) for _ in range(8)]
        for k, v in enumerate(values):
            link.write32(4 * k, v)
        assert [link.read32(4 * k) for k in range(8)] == values
        assert link.read32(regs["ID"]) == tb.p["device"]["id"]
        assert link.read32(0x1004) == values[1], "address bits above addr_width not ignored"
        link.write32(0x0008, 0xFFFF_FFFF)
        assert link.read32(0x0008) == 0xFFFF_FFFF
        for call, match in ((lambda: link.write32(regs["ID"], 1), "write of register 0x0020"),
                            (lambda: link.read32(0x00FC), "read of register 0x00fc")):
            try:
                call()
            except ResponseError as e:
                assert match in str(e) and "SLVERR" in str(e) and e.resp == 2, e
            else:
                raise AssertionError(f"no ResponseError ({match})")
        for frame, tag in ((b"\x00", "0x00"), (bytes([0x53, 9, 1, 0]), "0x53")):
            try:
                link.request(frame, StreamReply, f"raw frame {frame.hex()}")
            except ProtocolError as e:
                assert f"rejected tag {tag}" in str(e), e
            else:
                raise AssertionError(f"no ProtocolError for {frame.hex()}")
        assert link.request(bytes([0x53, 1, 0, 0]), StreamReply, "an empty frame") == (1,)
        assert link.read32(0) == values[0]
        return {"writes": 9, "reads": 12}

    tbconfig.record("registers", **await host())


@cocotb.test()
async def streams(dut):
    """Random sends on both input streams (frames split at the FIFO's size), register
    traffic and partial receives, while the device stalls its inputs, gaps y and stalls its
    AXI4-Lite slave and the host pauses between bytes: every y beat arrives once, in order,
    and the device's counters agree."""
    p = _params()
    tb = LinkTB(dut, p)
    await tb.start()

    @bridge
    def host():
        rng, regs = tb.rng, tb.regs
        link = tb.make_link(p["host_rx_fifo"] or p["rx_fifo"])
        tb.set_stalls(*p["stall"])
        values = [0] * 8
        expected, got = [], []
        counts = {"a": 0, "b": 0}
        sends = frames = 0

        def send(link: HostLink, stream: str, n: int) -> int:
            nonlocal sends, frames
            width = tb.inputs[stream]
            beats = [rng.getrandbits(8 * width) for _ in range(n)]
            if rng.random() < 0.5:      # half the sends as raw bytes
                k = link.send(stream, b"".join(v.to_bytes(width, "little") for v in beats))
            else:
                k = link.send(stream, beats)
            assert k == -(-n // frame_beats(width, link.rx_fifo)), (stream, n, k)
            sends, frames = sends + 1, frames + k
            counts[stream] += n
            for v in beats:
                expected.extend(loop_model(stream, v, tb.keep))
            return k

        def check(got: list, expected: list) -> None:
            for k, (g, e) in enumerate(zip(got, expected, strict=True)):
                assert tuple(g) == e, f"y beat {k}: got {g}, expected {e}"

        fa, fb = (frame_beats(tb.inputs[s], link.rx_fifo) for s in ("a", "b"))
        for _ in range(p["ops"]):
            r = rng.random()
            if r < 0.35:
                send(link, "a", rng.choice([1, fa, fa + 1, rng.randint(1, p["max_a"])]))
            elif r < 0.55:
                send(link, "b", rng.choice([1, min(fb + 1, p["max_b"]),
                                            rng.randint(1, p["max_b"])]))
            elif r < 0.7:
                k = rng.randrange(8)
                values[k] = rng.getrandbits(32)
                link.write32(4 * k, values[k])
            elif r < 0.85:
                k = rng.randrange(8)
                assert link.read32(4 * k) == values[k], f"R{k}"
            else:
                got.extend(link.receive(rng.randint(0, len(expected) - len(got))))
        got.extend(link.receive(len(expected) - len(got)))
        check(got, expected)
        interleaved = tb.interleaved_replies()
        long_frames = 0
        if p["long"]:
            # frames as long as the board's FIFO allows (the stream test's link keeps all
            # beats it was sent, so a second link on the transport takes over cleanly)
            link = tb.make_link(p["rx_fifo"])
            long_frames = send(link, "a", p["long"])
            got.extend(link.receive(len(expected) - len(got)))
            check(got, expected)
        tb.set_stalls(0, 0, 0)
        assert link.read32(regs["A_BEATS"]) == counts["a"]
        assert link.read32(regs["B_BEATS"]) == counts["b"]
        assert link.read32(regs["Y_BEATS"]) == len(expected)
        try:
            extra = link.receive(1, timeout=200 * tb.byte_time)
        except LinkTimeout:
            pass
        else:
            raise AssertionError(f"a y beat more than expected: {extra}")
        return {"sends": sends, "frames": frames, "long_frames": long_frames,
                "a_beats": counts["a"], "b_beats": counts["b"], "y_beats": len(got),
                "expected_beats": len(expected), "bytes_sent": tb.transport.sent,
                "bytes_received": tb.transport.received, "interleaved_replies": interleaved}

    result = await host()
    log.info("streams: %s", result)
    tbconfig.record("streams", **result)


@cocotb.test()
async def receive_timeout(dut):
    """receive() times out naming what it waited for and keeps what did arrive."""
    tb = LinkTB(dut, _params())
    await tb.start()

    @bridge
    def host():
        link = tb.link
        t = 100 * tb.byte_time
        messages = []
        for n, call in ((1, lambda: link.receive(1, timeout=t)),
                        (None, lambda: link.receive(timeout=t)),
                        (2, lambda: link.receive(2, timeout=t))):
            if n == 2:
                link.send("b", [0x0102])
            try:
                call()
            except LinkTimeout as e:
                messages.append(str(e))
            else:
                raise AssertionError(f"receive({n}) did not time out")
        assert "for 1 y beats; 0 y beats arrived" in messages[0], messages[0]
        assert "for a y beat with tlast; 0 y beats" in messages[1], messages[1]
        assert "for 2 y beats; 1 y beats arrived" in messages[2], messages[2]
        assert link.receive(1) == [(0x0102, 0x3 if tb.keep else 0xF, True)]
        link.send("a", [1 << 96])                   # tlast on the fourth word
        beats = link.receive()
        assert [b.tlast for b in beats] == [False, False, False, True]
        assert beats[3].tdata == 1
        return messages

    tbconfig.record("receive_timeout", messages=await host())
