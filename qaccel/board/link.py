"""The serial transport of the board link (pyserial, imported when a port is opened)."""

from __future__ import annotations

__all__ = ["DEFAULT_BAUD", "SerialTransport", "open_serial"]

#: The host link's baud rate on every board (``qaccel bitstream``): an exact divisor of the
#: 12, 25 and 48 MHz board clocks, within the FT231X's and FT2232H's range.
DEFAULT_BAUD = 1_000_000


class SerialTransport:
    """A :class:`~qaccel.board.protocol.HostLink` transport over an open pyserial port:
    ``write`` hands all bytes to the driver, ``read(n)`` returns at most ``n`` bytes, fewer
    (possibly none) when the port's ``timeout`` passes first; ``in_waiting`` counts the
    bytes already received. A context manager closing the port."""

    def __init__(self, port):
        self.serial = port

    def write(self, data: bytes) -> None:
        """Send ``data`` (all of it)."""
        self.serial.write(data)

    def read(self, n: int) -> bytes:
        """Return at most ``n`` received bytes, waiting at most the port's timeout."""
        return bytes(self.serial.read(n))

    @property
    def in_waiting(self) -> int:
        return self.serial.in_waiting

    def close(self) -> None:
        """Close the port."""
        self.serial.close()

    def __enter__(self) -> SerialTransport:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_serial(port: str, baud: int = DEFAULT_BAUD, *, timeout: float = 0.05
                ) -> SerialTransport:
    """Open ``port`` 8N1 at ``baud``, no flow control, as a transport for
    :class:`~qaccel.board.protocol.HostLink`; ``read`` returns what arrived within
    ``timeout`` seconds. ``port`` is a device (``/dev/ttyUSB1``, ``COM5``) or a pyserial URL
    (``socket://host:port``, ``rfc2217://...``, ``loop://``)."""
    if not isinstance(baud, int) or isinstance(baud, bool) or baud <= 0:
        raise ValueError(f"baud must be a positive integer, not {baud!r}")
    if not timeout > 0:
        raise ValueError(f"timeout must be positive, not {timeout!r}")
    import serial

    return SerialTransport(serial.serial_for_url(
        port, baudrate=baud, bytesize=serial.EIGHTBITS, parity=serial.PARITY_NONE,
        stopbits=serial.STOPBITS_ONE, timeout=timeout, xonxoff=False, rtscts=False,
        dsrdtr=False))
