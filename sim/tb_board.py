"""cocotb testbench of :class:`qaccel.rtl.axi.host_top.HostTop`: the host driver
(:class:`qaccel.board.driver.Board`) runs the operators over the UART, modelled by
cocotbext-uart, exactly as it runs them on a board over pyserial.

Parameters (``qaccel.sim.tbconfig.params()``): ``description`` (the top's
:meth:`~qaccel.rtl.axi.host_top.HostTop.describe`), ``baud`` (the UART's, for the 10 ns
clock), ``calls`` (each an operator and the ``.npz`` file of its arguments, ``kwargs`` and
the expected output, from tests/board/test_board_sim.py).
"""

from __future__ import annotations

import logging

import cocotb
import ml_dtypes
import numpy as np
from cocotb.clock import Clock
from cocotb.task import bridge
from cocotb.triggers import ClockCycles
from cocotbext.uart import UartSink, UartSource

from qaccel.board.driver import Board
from qaccel.board.protocol import LinkError
from qaccel.sim import tbconfig
from qaccel.sim.uart_link import UartTransport

log = logging.getLogger("cocotb.qaccel.tb_board")


async def _setup(dut):
    p = tbconfig.params()
    Clock(dut.clk, 10, unit="ns").start(start_high=False)
    dut.uart_rx.value = 1
    dut.rst.value = 1
    await ClockCycles(dut.clk, 4)
    dut.rst.value = 0
    source = UartSource(dut.uart_rx, baud=p["baud"], bits=8, stop_bits=1)
    sink = UartSink(dut.uart_tx, baud=p["baud"], bits=8, stop_bits=1)
    source.log.setLevel(logging.WARNING)
    sink.log.setLevel(logging.WARNING)
    await ClockCycles(dut.clk, 10)
    transport = UartTransport(source, sink, poll_ns=p.get("poll_ns", 20_000))
    return p, transport


def _dtype(name: str) -> np.dtype:
    try:
        return np.dtype(name)
    except TypeError:
        return np.dtype(getattr(ml_dtypes, name))


def _args(path: str) -> tuple[list, dict, np.ndarray]:
    """A call's arguments, keywords and expected output (arrays as raw codes and their
    dtype's name, which keeps ml_dtypes types through .npz)."""
    data = np.load(path, allow_pickle=False)
    n = int(data["nargs"])
    args = [None if data[f"none{k}"] else data[f"arg{k}"].view(_dtype(str(data[f"dtype{k}"])))
            for k in range(n)]
    kwargs = {k[3:]: (data[k].item() if data[k].ndim == 0 else data[k]) for k in data.files
              if k.startswith("kw_")}
    return args, kwargs, data["want"].view(_dtype(str(data["want_dtype"])))


@cocotb.test()
async def driver_calls(dut):
    """Board.check, then every call: the board's result equals the golden model's, bit for
    bit (NaN payloads included)."""
    p, transport = await _setup(dut)

    @bridge
    def host():
        board = Board(transport, p["description"], timeout=3600)
        board.check()
        for k, call in enumerate(p["calls"]):
            args, kwargs, want = _args(call["npz"])
            got = getattr(board, call["op"])(*args, **kwargs)
            assert got.dtype == want.dtype and got.shape == want.shape, (k, got.dtype,
                                                                         got.shape)
            bad = np.flatnonzero(got.reshape(-1).view(np.uint8) != want.reshape(-1).view(
                np.uint8)) if got.dtype.itemsize == 1 else np.flatnonzero(
                got.reshape(-1).view(f"u{got.dtype.itemsize}")
                != want.reshape(-1).view(f"u{got.dtype.itemsize}"))
            assert bad.size == 0, f"call {k} ({call['op']}): {bad.size} mismatches"
            tbconfig.record(f"call {k}", op=call["op"], sent=transport.sent,
                            received=transport.received)
        return board

    await host()


@cocotb.test()
async def driver_reports_errors(dut):
    """A job the core refuses (a register write out of its range) reaches the host as a
    LinkError naming the flag; the next call runs exactly."""
    p, transport = await _setup(dut)

    @bridge
    def host():
        board = Board(transport, p["description"], timeout=3600)
        op = p["calls"][0]["op"].removesuffix("_linear")
        rmap = board.maps[op]
        try:
            board.link.write32(board.cores[op]["base"] + rmap.span + 0x100, 1)
        except LinkError as e:
            assert "SLVERR" in str(e), e
        else:
            raise AssertionError("an unmapped write was not refused")
        board.write(op, "CTRL", rmap.encode("CTRL", start=1))      # the job registers: 0
        flags = {k for k, v in board.read(op, "ERROR").items() if v}
        assert flags, "the empty job raised no error flag"
        args, kwargs, want = _args(p["calls"][0]["npz"])
        try:
            getattr(board, p["calls"][0]["op"])(*args, **kwargs)
        except LinkError as e:
            assert "ERROR flags set before the job" in str(e), e
        else:
            raise AssertionError("a call ran with error flags set")
        board.write(op, "ERROR", (1 << 32) - 1)
        got = getattr(board, p["calls"][0]["op"])(*args, **kwargs)
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8))

    await host()
