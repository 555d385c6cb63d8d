"""A :class:`~qaccel.board.protocol.HostLink` transport inside a cocotb test: the same
blocking host code that drives a board over pyserial drives the simulated UART pins.

cocotb runs blocking code in a thread started with :func:`cocotb.task.bridge` (cocotb 2.x;
``cocotb.external`` before); that thread calls back into the simulation through
:func:`cocotb.task.resume`-wrapped coroutines, which is what :meth:`UartTransport.write`,
:meth:`~UartTransport.read` and :meth:`~UartTransport.now` do. Only call them from such a
thread::

    transport = UartTransport.attach(dut.uart_rx, dut.uart_tx, baud)
    link = HostLink(transport, inputs, 4, clock=transport.now, timeout=1e-3)
    await bridge(link.write32)(0, 1)
"""

from __future__ import annotations

import logging
import random

from cocotb.simtime import get_sim_time
from cocotb.task import resume
from cocotb.triggers import Timer
from cocotbext.uart import UartSink, UartSource

__all__ = ["UartTransport"]


class UartTransport:
    """Write to the DUT through ``source`` (a cocotbext-uart ``UartSource`` on its receive
    pin) and read what it sends from ``sink`` (a ``UartSink`` on its transmit pin); see
    :meth:`attach` to make both. ``read(n)`` waits at most ``poll_ns`` of simulated time
    (default: 40 bit times) for a first byte.

    ``gap`` (0..1) is the chance that a byte is preceded by an idle pause of 1 to
    ``max_gap_bits`` bit times (drawn from ``rng``): the host's own jitter. With gaps,
    ``write`` returns once the last byte is queued, after the pauses; without, at once
    (bytes queue in the source, as they do in an OS serial driver). ``sent`` and
    ``received`` count the bytes written and read.
    """

    def __init__(self, source: UartSource, sink: UartSink, *, poll_ns: float | None = None,
                 gap: float = 0.0, max_gap_bits: int = 20, rng: random.Random | None = None):
        if not isinstance(source, UartSource) or not isinstance(sink, UartSink):
            raise TypeError(f"source and sink must be a cocotbext-uart UartSource and "
                            f"UartSink, not {source!r} and {sink!r}")
        if not 0 <= gap <= 1:
            raise ValueError(f"gap must be in [0, 1], not {gap!r}")
        if max_gap_bits < 1:
            raise ValueError(f"max_gap_bits must be at least 1, not {max_gap_bits!r}")
        self.source, self.sink = source, sink
        self._bit_ns = 1e9 / source.baud
        self._poll_ns = 40 * self._bit_ns if poll_ns is None else poll_ns
        if not self._poll_ns > 0:
            raise ValueError(f"poll_ns must be positive, not {poll_ns!r}")
        self._gap = gap
        self._max_gap_bits = max_gap_bits
        self._rng = rng or random.Random(0)
        self.sent = 0
        self.received = 0

    @classmethod
    def attach(cls, rx_pin, tx_pin, baud: float, **kwargs) -> UartTransport:
        """Make the source on ``rx_pin`` and the sink on ``tx_pin`` (8N1 at ``baud`` bits
        per second of simulated time, per-byte logging silenced) and return their
        transport; ``kwargs`` as for the constructor."""
        if not baud > 0:
            raise ValueError(f"baud must be positive, not {baud!r}")
        source = UartSource(rx_pin, baud=baud, bits=8, stop_bits=1)
        sink = UartSink(tx_pin, baud=baud, bits=8, stop_bits=1)
        for endpoint in (source, sink):
            endpoint.log.setLevel(logging.WARNING)
        return cls(source, sink, **kwargs)

    # -- the transport (call from a bridge thread) ----------------------------------------

    def write(self, data: bytes) -> None:
        """Queue ``data`` on the DUT's receive pin."""
        self.sent += len(data)
        resume(self._write)(bytes(data))

    def read(self, n: int) -> bytes:
        """Return at most ``n`` bytes the DUT sent; waits up to ``poll_ns`` for the first."""
        data = resume(self._read)(n)
        self.received += len(data)
        return data

    @property
    def in_waiting(self) -> int:
        """Bytes received and not read (a plain queue size: safe from the bridge thread,
        which runs only while the simulator waits for it)."""
        return self.sink.count()

    def now(self) -> float:
        """Simulated time in seconds (a ``clock`` for HostLink)."""
        return resume(self._now)()

    # -- coroutines (simulator side) ------------------------------------------------------

    async def _write(self, data: bytes) -> None:
        if not self._gap:
            self.source.write_nowait(data)
            return
        for byte in data:
            if self._rng.random() < self._gap:
                await self.source.wait()
                bits = self._rng.randint(1, self._max_gap_bits)
                await Timer(round(bits * self._bit_ns), "ns")
            self.source.write_nowait([byte])

    async def _read(self, n: int) -> bytes:
        if self.sink.empty():
            await self.sink.wait(round(self._poll_ns), "ns")
        return bytes(self.sink.read_nowait(min(n, self.sink.count())))

    async def _now(self) -> float:
        return get_sim_time("sec")

    async def drain(self) -> None:
        """Wait until every queued byte has left the source (a coroutine, for the test)."""
        await self.source.wait()
