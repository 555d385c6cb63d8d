"""The host side of the board link (the wire protocol of :mod:`qaccel.rtl.board.host_bridge`):
frame encoders, a sans-IO frame parser, and :class:`HostLink`, which runs the protocol over
any transport with blocking ``write(bytes)`` and ``read(n) -> bytes`` (pyserial's ``Serial``,
:func:`qaccel.board.link.open_serial`, or :class:`qaccel.sim.uart_link.UartTransport` in a
cocotb test).

Host to board: ``W`` addr:u16 data:u32, ``R`` addr:u16, ``S`` stream:u8 count:u16 + beats.
Board to host: ``w`` resp:u8, ``r`` resp:u8 data:u32, ``s`` stream:u8, ``e`` tag:u8 (an
unknown tag) and, unsolicited, ``y`` tdata [tkeep] flags. Little-endian throughout.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

# the tags and frame limits: the bridge's own (one definition for both sides of the link)
from qaccel.rtl.board.host_bridge import (
    HEADER_BYTES,
    MAX_BEATS,
    TAG_ERROR,
    TAG_READ,
    TAG_READ_REPLY,
    TAG_STREAM,
    TAG_STREAM_REPLY,
    TAG_WRITE,
    TAG_WRITE_REPLY,
    TAG_Y,
    TAGS,
)

__all__ = [
    "HEADER_BYTES",
    "MAX_BEATS",
    "RESPONSES",
    "TAGS",
    "TAG_ERROR",
    "TAG_READ",
    "TAG_READ_REPLY",
    "TAG_STREAM",
    "TAG_STREAM_REPLY",
    "TAG_WRITE",
    "TAG_WRITE_REPLY",
    "TAG_Y",
    "ErrorReply",
    "FrameParser",
    "HostLink",
    "LinkError",
    "LinkTimeout",
    "ProtocolError",
    "ReadReply",
    "ResponseError",
    "StreamReply",
    "WriteReply",
    "YBeat",
    "beat_bytes",
    "encode_read",
    "encode_stream",
    "encode_write",
    "frame_beats",
    "stream_frames",
]

#: AXI response codes.
RESPONSES = {0: "OKAY", 1: "EXOKAY", 2: "SLVERR", 3: "DECERR"}


class LinkError(RuntimeError):
    """The board answered with an error, something unexpected, or nothing in time."""


class ProtocolError(LinkError):
    """The board sent bytes the protocol does not allow here, or rejected a frame (``e``)."""


class ResponseError(LinkError):
    """An AXI4-Lite transaction ended with a response other than OKAY."""

    def __init__(self, op: str, addr: int, resp: int):
        self.op, self.addr, self.resp = op, addr, resp
        super().__init__(f"{op} of register {addr:#06x}: response {resp} "
                         f"({RESPONSES.get(resp, '?')})")


class LinkTimeout(LinkError, TimeoutError):
    """The board did not send what the host waited for within the timeout."""


class YBeat(NamedTuple):
    """An output beat: ``tdata``, ``tkeep`` (a bit per byte; all ones for a core without
    ``tkeep``) and ``tlast``."""

    tdata: int
    tkeep: int
    tlast: bool

    def kept_bytes(self, nbytes: int) -> bytes:
        """Return the bytes of ``tdata`` (``nbytes`` wide) that ``tkeep`` marks, lowest first."""
        raw = self.tdata.to_bytes(nbytes, "little")
        return bytes(b for k, b in enumerate(raw) if self.tkeep >> k & 1)


class WriteReply(NamedTuple):
    """``w``: the AXI write response."""

    resp: int


class ReadReply(NamedTuple):
    """``r``: the AXI read response and data."""

    resp: int
    data: int


class StreamReply(NamedTuple):
    """``s``: every beat of a stream frame was accepted."""

    stream: int


class ErrorReply(NamedTuple):
    """``e``: the board dropped an unknown tag byte (``0x53`` for an unknown stream id)."""

    tag: int


_REPLY_NAMES = {WriteReply: "w", ReadReply: "r", StreamReply: "s", ErrorReply: "e"}


def _check_int(name: str, value, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, not {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], not {value}")
    return value


def encode_write(addr: int, value: int) -> bytes:
    """Return the ``W`` frame writing ``value`` (u32) to ``addr`` (u16)."""
    _check_int("addr", addr, 0, 0xFFFF)
    _check_int("value", value, 0, 0xFFFF_FFFF)
    return bytes([TAG_WRITE]) + addr.to_bytes(2, "little") + value.to_bytes(4, "little")


def encode_read(addr: int) -> bytes:
    """Return the ``R`` frame reading ``addr`` (u16)."""
    _check_int("addr", addr, 0, 0xFFFF)
    return bytes([TAG_READ]) + addr.to_bytes(2, "little")


def encode_stream(stream_id: int, payload: bytes, width: int) -> bytes:
    """Return the ``S`` frame carrying ``payload`` (whole ``width``-byte beats, 1..65535 of
    them) to stream ``stream_id``."""
    _check_int("stream_id", stream_id, 0, 255)
    _check_int("width", width, 1, 1 << 16)
    count, extra = divmod(len(payload), width)
    if extra or not 1 <= count <= MAX_BEATS:
        raise ValueError(f"payload must be 1..{MAX_BEATS} beats of {width} bytes, not "
                         f"{len(payload)} bytes")
    return bytes([TAG_STREAM, stream_id]) + count.to_bytes(2, "little") + bytes(payload)


def frame_beats(width: int, rx_fifo: int) -> int:
    """Return the most ``width``-byte beats one frame may carry to a board whose receive
    FIFO holds ``rx_fifo`` bytes."""
    _check_int("width", width, 1, 1 << 16)
    _check_int("rx_fifo", rx_fifo, 1, 1 << 30)
    beats = min(MAX_BEATS, (rx_fifo - HEADER_BYTES) // width)
    if beats < 1:
        raise ValueError(f"rx_fifo must hold a frame of one {width}-byte beat "
                         f"({HEADER_BYTES + width} bytes), not {rx_fifo}")
    return beats


def stream_frames(stream_id: int, payload: bytes, width: int, rx_fifo: int) -> list[bytes]:
    """Return ``payload`` (whole ``width``-byte beats) as ``S`` frames of at most
    ``rx_fifo`` bytes each, in order."""
    step = frame_beats(width, rx_fifo) * width
    return [encode_stream(stream_id, payload[at:at + step], width)
            for at in range(0, len(payload), step)]


def beat_bytes(beats, width: int) -> bytes:
    """Return ``beats`` as bytes: ``bytes``-like input as is (whole ``width``-byte beats),
    an iterable of ints as each one's ``width`` bytes, lowest first."""
    if isinstance(beats, (bytes, bytearray, memoryview)):
        raw = bytes(beats)
        if len(raw) % width:
            raise ValueError(f"beats must be whole {width}-byte beats, not {len(raw)} bytes")
        return raw
    if not isinstance(beats, Iterable):
        raise TypeError(f"beats must be bytes or a sequence of ints, not {beats!r}")
    out = bytearray()
    for k, beat in enumerate(beats):
        out += _check_int(f"beats[{k}]", beat, 0, (1 << 8 * width) - 1).to_bytes(width, "little")
    return bytes(out)


class FrameParser:
    """Split the board's byte stream into frames (:class:`WriteReply`, :class:`ReadReply`,
    :class:`StreamReply`, :class:`ErrorReply`, :class:`YBeat`). ``output_bytes`` and
    ``output_keep`` describe the ``y`` frames (the bridge's parameters)."""

    def __init__(self, output_bytes: int, output_keep: bool):
        self._ob = _check_int("output_bytes", output_bytes, 1, 1 << 16)
        if not isinstance(output_keep, bool):
            raise TypeError(f"output_keep must be a bool, not {output_keep!r}")
        self._kb = -(-output_bytes // 8) if output_keep else 0
        self._lengths = {TAG_WRITE_REPLY: 2, TAG_READ_REPLY: 6, TAG_STREAM_REPLY: 2,
                         TAG_ERROR: 2, TAG_Y: 2 + self._ob + self._kb}
        self._buf = bytearray()

    @property
    def need(self) -> int:
        """Bytes still missing from the frame being received (1 between frames)."""
        if not self._buf:
            return 1
        return self._lengths[self._buf[0]] - len(self._buf)

    def feed(self, data: bytes) -> list:
        """Take ``data``; return the frames it completes, in order. ProtocolError on a byte
        that cannot start a frame (that byte is dropped)."""
        frames = []
        for byte in data:
            if not self._buf and byte not in self._lengths:
                raise ProtocolError(f"byte {byte:#04x} from the board starts no frame "
                                    f"(after {len(frames)} frames of this read)")
            self._buf.append(byte)
            if len(self._buf) == self._lengths[self._buf[0]]:
                frames.append(self._decode(bytes(self._buf)))
                self._buf.clear()
        return frames

    def _decode(self, f: bytes):
        tag = f[0]
        if tag == TAG_Y:
            ob, kb = self._ob, self._kb
            tdata = int.from_bytes(f[1:1 + ob], "little")
            keep = int.from_bytes(f[1 + ob:1 + ob + kb], "little") if kb else (1 << ob) - 1
            return YBeat(tdata, keep, bool(f[-1] & 1))
        if tag == TAG_WRITE_REPLY:
            return WriteReply(f[1] & 3)
        if tag == TAG_READ_REPLY:
            return ReadReply(f[1] & 3, int.from_bytes(f[2:6], "little"))
        if tag == TAG_STREAM_REPLY:
            return StreamReply(f[1])
        return ErrorReply(f[1])


class HostLink:
    """Run the protocol over ``transport``: ``write(bytes)`` and ``read(n)``, which returns
    at most ``n`` bytes and, for the timeouts to work, returns early (possibly with none)
    when nothing arrives for a while (pyserial's ``timeout``). If the transport has
    ``in_waiting`` (pyserial does), reads take everything waiting at once.

    ``inputs`` maps each input stream's name to its beat width in bytes, ids in order (the
    bridge's ``inputs``), or to ``(id, width)``; ``output_bytes`` and ``output_keep`` describe
    the output ``y``; ``rx_fifo`` is the bridge's receive FIFO (frames are never longer).
    ``timeout`` (seconds of ``clock``) bounds each wait for a reply and each :meth:`receive`.

    One frame is outstanding at a time. ``y`` beats arrive whenever the core makes them and
    are kept, in order, until :meth:`receive` takes them. After a :exc:`LinkTimeout` on a
    register or stream frame the reply may still come: reopen the link.
    """

    def __init__(self, transport, inputs: Mapping[str, int | tuple[int, int]],
                 output_bytes: int, output_keep: bool = True, *, rx_fifo: int = 2048,
                 timeout: float = 10.0, clock: Callable[[], float] = time.monotonic):
        for method in ("write", "read"):
            if not callable(getattr(transport, method, None)):
                raise TypeError(f"transport must have write(bytes) and read(n), not "
                                f"{transport!r}")
        if not isinstance(inputs, Mapping):
            raise TypeError(f"inputs must be a mapping of stream names to widths, not "
                            f"{inputs!r}")
        self._streams: dict[str, tuple[int, int]] = {}
        for k, (name, spec) in enumerate(inputs.items()):
            sid, width = (k, spec) if isinstance(spec, int) else spec
            _check_int(f"inputs[{name!r}] id", sid, 0, 255)
            _check_int(f"inputs[{name!r}] width", width, 1, 1 << 16)
            frame_beats(width, rx_fifo)
            self._streams[name] = (sid, width)
        self._parser = FrameParser(output_bytes, output_keep)
        self._output_bytes = output_bytes
        self._rx_fifo = rx_fifo
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, not {timeout!r}")
        self.timeout = timeout
        self._clock = clock
        self.transport = transport
        self._y: deque[YBeat] = deque()
        self._replies: deque = deque()

    @property
    def streams(self) -> dict[str, tuple[int, int]]:
        """Each input stream's ``(id, width in bytes)``."""
        return dict(self._streams)

    @property
    def output_bytes(self) -> int:
        return self._output_bytes

    @property
    def rx_fifo(self) -> int:
        """The longest frame sent, in bytes."""
        return self._rx_fifo

    def pending_beats(self) -> int:
        """Return how many ``y`` beats were received and not yet taken by :meth:`receive`."""
        return len(self._y)

    # -- the API ---------------------------------------------------------------------------

    def write32(self, addr: int, value: int, *, timeout: float | None = None) -> None:
        """Write ``value`` to the register at byte address ``addr`` (a multiple of 4);
        ResponseError unless the slave answers OKAY."""
        self._check_addr(addr)
        what = f"the write of {value:#x} to {addr:#06x}"
        reply = self.request(encode_write(addr, value), WriteReply, what, timeout=timeout)
        if reply.resp:
            raise ResponseError("write", addr, reply.resp)

    def read32(self, addr: int, *, timeout: float | None = None) -> int:
        """Return the register at byte address ``addr`` (a multiple of 4); ResponseError
        unless the slave answers OKAY."""
        self._check_addr(addr)
        reply = self.request(encode_read(addr), ReadReply, f"the read of {addr:#06x}",
                             timeout=timeout)
        if reply.resp:
            raise ResponseError("read", addr, reply.resp)
        return reply.data

    def send(self, stream: str, beats, *, timeout: float | None = None) -> int:
        """Send ``beats`` (bytes holding whole beats, lowest byte first, or a sequence of
        ``tdata`` ints) on input ``stream`` in frames that fit the board's FIFO; return
        when the core has accepted every beat. ``timeout`` bounds each frame's wait.
        Return the number of frames sent."""
        if stream not in self._streams:
            raise ValueError(f"stream must be one of {', '.join(self._streams) or '(none)'}, "
                             f"not {stream!r}")
        sid, width = self._streams[stream]
        frames = stream_frames(sid, beat_bytes(beats, width), width, self._rx_fifo)
        for k, frame in enumerate(frames):
            what = f"frame {k + 1} of {len(frames)} on stream {stream!r}"
            reply = self.request(frame, StreamReply, what, timeout=timeout)
            if reply.stream != sid:
                raise ProtocolError(f"{what} (id {sid}) was acknowledged as stream "
                                    f"{reply.stream}")
        return len(frames)

    def receive(self, n_beats: int | None = None, timeout: float | None = None) -> list[YBeat]:
        """Return the next ``n_beats`` output beats or, without ``n_beats``, the beats up to
        and including the next ``tlast``. On LinkTimeout the beats that did arrive stay
        buffered for the next call."""
        if n_beats is not None:
            _check_int("n_beats", n_beats, 0, 1 << 62)
            what = f"{n_beats} y beats"
        else:
            what = "a y beat with tlast"

        def ready() -> bool:
            if n_beats is None:
                return any(b.tlast for b in self._y)
            return len(self._y) >= n_beats

        self._pump(ready, self._deadline(timeout), what, timeout, replies=False)
        if n_beats is None:
            n_beats = next(k for k, b in enumerate(self._y) if b.tlast) + 1
        return [self._y.popleft() for _ in range(n_beats)]

    def request(self, frame: bytes, expect: type, what: str, *,
                timeout: float | None = None):
        """Send ``frame``, wait for its reply and return it, keeping ``y`` beats that come
        first. ProtocolError if the reply is an ``e`` frame or not of type ``expect``;
        LinkTimeout naming ``what`` if none comes."""
        if self._replies:
            raise ProtocolError(f"unexpected reply {self._replies[0]} before {what}")
        self.transport.write(bytes(frame))
        self._pump(lambda: bool(self._replies), self._deadline(timeout),
                   f"the reply to {what}", timeout)
        reply = self._replies.popleft()
        if isinstance(reply, ErrorReply):
            raise ProtocolError(f"the board rejected tag {reply.tag:#04x} (sending {what})")
        if not isinstance(reply, expect):
            raise ProtocolError(f"reply {_REPLY_NAMES[type(reply)]!r} {reply} to {what}, "
                                f"expected {_REPLY_NAMES[expect]!r}")
        return reply

    # -- internals -------------------------------------------------------------------------

    def _check_addr(self, addr) -> None:
        _check_int("addr", addr, 0, 0xFFFC)
        if addr % 4:
            raise ValueError(f"addr must be a multiple of 4, not {addr:#x}")

    def _deadline(self, timeout: float | None) -> float:
        return self._clock() + (self.timeout if timeout is None else timeout)

    def _pump(self, done: Callable[[], bool], deadline: float, what: str,
              timeout: float | None, *, replies: bool = True) -> None:
        while not done():
            if self._clock() >= deadline:
                t = self.timeout if timeout is None else timeout
                got = (f"; {len(self._y)} y beats arrived (kept for the next receive)"
                       if not replies else "")
                raise LinkTimeout(f"waited {t:g} s for {what}{got}")
            n = max(self._parser.need, int(getattr(self.transport, "in_waiting", 0) or 0))
            for frame in self._parser.feed(self.transport.read(n)):
                if isinstance(frame, YBeat):
                    self._y.append(frame)
                elif replies:
                    self._replies.append(frame)
                else:
                    raise ProtocolError(f"unexpected reply {_REPLY_NAMES[type(frame)]!r} "
                                        f"{frame} while waiting for {what}")
