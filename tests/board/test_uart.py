"""UartRx and UartTx in Amaranth's simulator: bit-exact line timing, divisors at the edges,
a 2 % baud mismatch, glitches, framing errors and overrun."""

from __future__ import annotations

import random

import pytest
from amaranth.hdl import Module
from amaranth.sim import Simulator

from qaccel.rtl.board.uart_rx import UartRx
from qaccel.rtl.board.uart_tx import UartTx


def frame_bits(byte: int, stop: int = 1) -> list[int]:
    """The 8N1 frame of ``byte``: start, data LSB first, stop."""
    return [0] + [byte >> k & 1 for k in range(8)] + [stop]


def line_wave(frames, bit: float, *, phase: float = 0.0, lead: int = 8, tail: int = 40):
    """Sample, once per cycle, a line carrying ``frames`` (``(byte, stop, idle_bits)``:
    ``idle_bits`` of idle before the frame) with bits ``bit`` cycles long, the first edge
    ``phase`` of a cycle after cycle ``lead``."""
    segments = []                                  # (level, start time)
    t = lead + phase
    for byte, stop, idle in frames:
        t += idle * bit
        for level in frame_bits(byte, stop):
            segments.append((level, t))
            t += bit
    segments.append((1, t))
    n = int(t) + tail
    wave, k, level = [], 0, 1
    for c in range(n):
        while k < len(segments) and segments[k][1] <= c:
            level = segments[k][0]
            k += 1
        wave.append(level)
    return wave


def run_rx(dut: UartRx, wave, *, ready=lambda c: True) -> tuple[list[int], dict]:
    """Drive ``wave`` into ``dut.rx`` (one level a cycle); return the bytes taken and the
    final flags."""
    got, flags = [], {}

    async def bench(ctx):
        for c, level in enumerate(wave):
            ctx.set(dut.rx, level)
            ctx.set(dut.o.ready, ready(c))
            if ctx.get(dut.o.valid) and ctx.get(dut.o.ready):
                got.append(ctx.get(dut.o.payload))
            await ctx.tick()
        flags["overrun"] = ctx.get(dut.overrun)
        flags["framing_error"] = ctx.get(dut.framing_error)
        flags["valid"] = ctx.get(dut.o.valid)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return got, flags


def decode_line(line: list[int], divisor: int) -> list[tuple[int, int]]:
    """Strictly decode a transmitter's line: each bit exactly ``divisor`` cycles of one
    level, stop bit 1. Return ``(start cycle, byte)`` for every frame."""
    out, c = [], 1
    while c < len(line):
        if line[c] == 0 and line[c - 1] == 1 or (out and c == out[-1][0] + 10 * divisor
                                                 and line[c] == 0):
            bits = []
            for k in range(10):
                chunk = line[c + k * divisor:c + (k + 1) * divisor]
                assert len(chunk) == divisor and len(set(chunk)) == 1, (
                    f"bit {k} of the frame at cycle {c} is not {divisor} cycles of one level: "
                    f"{chunk}")
                bits.append(chunk[0])
            assert bits[0] == 0 and bits[9] == 1, f"frame at cycle {c}: {bits}"
            out.append((c, sum(b << k for k, b in enumerate(bits[1:9]))))
            c += 10 * divisor
        else:
            assert line[c] == 1 or out == [] and c == 0, f"line low outside a frame at {c}"
            c += 1
    return out


def run_tx(dut: UartTx, data: list[int], *, gaps=lambda k: 0, tail: int = 20):
    """Offer ``data`` on ``dut.i`` (after ``gaps(k)`` idle cycles before byte ``k``);
    return the line (one level a cycle), the transfer cycles and ``i.ready`` per cycle."""
    line, taken, ready = [], [], []

    async def bench(ctx):
        c = 0
        for k, byte in enumerate(data):
            for _ in range(gaps(k)):
                line.append(ctx.get(dut.tx))
                ready.append(ctx.get(dut.i.ready))
                await ctx.tick()
                c += 1
            ctx.set(dut.i.valid, 1)
            ctx.set(dut.i.payload, byte)
            while True:
                line.append(ctx.get(dut.tx))
                ready.append(ctx.get(dut.i.ready))
                done = ctx.get(dut.i.ready)
                await ctx.tick()
                c += 1
                if done:
                    taken.append(c - 1)
                    break
            ctx.set(dut.i.valid, 0)
        for _ in range(10 * dut.divisor + tail):
            line.append(ctx.get(dut.tx))
            ready.append(ctx.get(dut.i.ready))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return line, taken, ready


EDGE_BYTES = [0x00, 0xFF, 0x55, 0xAA, 0x01, 0x80, 0x7F, 0xFE]


# -- transmitter -------------------------------------------------------------------------------

@pytest.mark.parametrize("divisor", [1, 2, 3, 8, 13])
def test_uart_tx_back_to_back(divisor):
    """Bytes offered without a pause leave as frames exactly 10 * divisor cycles apart, each
    bit exactly divisor cycles, the first start bit the cycle after the transfer."""
    data = EDGE_BYTES + random.Random(divisor).sample(range(256), 6)
    line, taken, ready = run_tx(UartTx(divisor), data)
    frames = decode_line(line, divisor)
    assert [b for _, b in frames] == data
    starts = [c for c, _ in frames]
    assert starts[0] == taken[0] + 1
    assert all(b - a == 10 * divisor for a, b in zip(starts, starts[1:], strict=False))
    assert [t + 1 for t in taken] == starts
    # ready: high idle, then only in the last cycle of each stop bit until the line is idle
    for c in range(starts[0], starts[-1] + 10 * divisor - 1):
        assert ready[c] == ((c - starts[0]) % (10 * divisor) == 10 * divisor - 1), c
    assert all(ready[starts[-1] + 10 * divisor:])


@pytest.mark.parametrize("divisor", [1, 4, 7])
def test_uart_tx_gaps(divisor):
    """Random idle gaps between bytes: the line idles high, every frame is exact."""
    rng = random.Random(divisor)
    data = [rng.randrange(256) for _ in range(12)]
    gaps = [rng.choice([0, 0, 1, 5, 3 * divisor, 17]) for _ in data]
    line, _, _ = run_tx(UartTx(divisor), data, gaps=lambda k: gaps[k])
    assert line[0] == 1
    assert [b for _, b in decode_line(line, divisor)] == data
    assert line[-20:] == [1] * 20


def test_uart_tx_idles_high():
    line, _, ready = run_tx(UartTx(5), [], tail=30)
    assert line == [1] * len(line) and all(ready)


# -- receiver ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("divisor", "scale"), [
    (4, 1.0), (5, 1.0), (6, 1.0), (8, 1.0), (13, 1.0), (16, 1.0),
    (8, 0.98), (8, 1.02), (16, 0.98), (16, 1.02), (13, 0.98), (13, 1.02),
], ids=lambda v: str(v))
def test_uart_rx_bytes(divisor, scale):
    """Back-to-back frames and frames after idle gaps, at the exact baud rate and 2 % fast or
    slow, from several sub-cycle phases: every byte arrives, no flag rises."""
    rng = random.Random(divisor * 100 + int(scale * 100))
    data = EDGE_BYTES + [rng.randrange(256) for _ in range(8)]
    for phase in (0.0, 0.3, 0.7):
        frames = [(b, 1, rng.choice([0, 0, 0, 0.5, 3])) for b in data]
        got, flags = run_rx(UartRx(divisor), line_wave(frames, divisor * scale, phase=phase))
        assert got == data, (phase, [hex(b) for b in got])
        assert not flags["overrun"] and not flags["framing_error"]


def test_uart_rx_too_slow_sender_fails():
    """The checker is meaningful: a 12 % slower sender garbles bytes at divisor 8."""
    data = [0x55, 0x0F, 0xF0] * 3
    got, _ = run_rx(UartRx(8), line_wave([(b, 1, 0) for b in data], 8 * 1.12))
    assert got != data


def test_uart_rx_overrun():
    """A byte completing while the previous one waits is dropped and sets overrun (sticky);
    the waiting byte is kept and reception goes on once it is taken."""
    d = 8
    frames = [(0x11, 1, 0), (0x22, 1, 0), (0x33, 1, 0), (0x44, 1, 20)]
    wave = line_wave(frames, d)
    release = 8 + 3 * 10 * d + 5 * d          # after 0x33 completed, before 0x44 did
    got, flags = run_rx(UartRx(d), wave, ready=lambda c: c >= release)
    assert got == [0x11, 0x44]
    assert flags["overrun"] and not flags["framing_error"]


def test_uart_rx_byte_taken_as_next_completes():
    """Taking the waiting byte in the very cycle the next one completes is no overrun."""
    d = 6
    wave = line_wave([(0xA1, 1, 0), (0xB2, 1, 0)], d)
    got, flags = run_rx(UartRx(d), wave, ready=lambda c: False)
    assert got == [] and flags["overrun"] and flags["valid"]
    # find the cycle the second byte completes: the first offer lasts until then
    dut = UartRx(d)
    first_valid = []

    async def bench(ctx):
        for c, level in enumerate(wave):
            ctx.set(dut.rx, level)
            if ctx.get(dut.o.valid):
                first_valid.append(c)
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    completes = first_valid[0] + 10 * d      # the next byte completes one frame later
    got, flags = run_rx(UartRx(d), wave, ready=lambda c: c == completes - 1 or c > completes)
    assert got == [0xA1, 0xB2] and not flags["overrun"]
    got, flags = run_rx(UartRx(d), wave, ready=lambda c: c == completes or c > completes)
    assert got == [0xA1] and flags["overrun"]       # one cycle late: the next byte is lost


def test_uart_rx_framing_error_and_break():
    """A frame with a low stop bit is dropped and sets framing_error; a long break is one
    error, not a run of zero bytes; reception resumes after the line returns high."""
    d = 8
    wave = line_wave([(0x5A, 0, 0)], d, tail=0)
    wave += [0] * (30 * d) + [1] * (2 * d)
    wave += line_wave([(0xC3, 1, 0)], d, lead=0)
    got, flags = run_rx(UartRx(d), wave)
    assert got == [0xC3]
    assert flags["framing_error"] and not flags["overrun"]


def test_uart_rx_ignores_glitches():
    """Low pulses shorter than half a bit are not start bits."""
    d = 16
    wave = [1] * 10 + [0] * 3 + [1] * 40 + [0] * 6 + [1] * 40
    wave += line_wave([(0x96, 1, 0)], d, lead=0)
    got, flags = run_rx(UartRx(d), wave)
    assert got == [0x96] and not flags["framing_error"]


def test_uart_loopback():
    """UartTx into UartRx: 64 random bytes arrive in order."""
    d = 5
    m = Module()
    m.submodules.tx = tx = UartTx(d)
    m.submodules.rx = rx = UartRx(d)
    m.d.comb += rx.rx.eq(tx.tx)
    rng = random.Random(7)
    data = [rng.randrange(256) for _ in range(64)]
    got = []

    async def bench(ctx):
        ctx.set(rx.o.ready, 1)
        k = 0
        for _ in range(len(data) * 10 * d + 50):
            if k < len(data):
                ctx.set(tx.i.valid, 1)
                ctx.set(tx.i.payload, data[k])
                if ctx.get(tx.i.ready):
                    k += 1
            else:
                ctx.set(tx.i.valid, 0)
            if ctx.get(rx.o.valid):
                got.append(ctx.get(rx.o.payload))
            await ctx.tick()

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert got == data


# -- parameters ------------------------------------------------------------------------------

def test_uart_divisor_checks():
    with pytest.raises(ValueError, match=r"divisor must be in \[4, .*\], not 3"):
        UartRx(3)
    with pytest.raises(ValueError, match=r"divisor must be in \[1, .*\], not 0"):
        UartTx(0)
    with pytest.raises(TypeError, match=r"divisor must be an integer, not 8.0"):
        UartRx(8.0)
    with pytest.raises(TypeError, match=r"divisor must be an integer, not True"):
        UartTx(True)
    assert UartRx(9).sample_offset == 4 and UartRx(4).divisor == 4
