# amaranth: UnusedElaboratable=no
"""AxiLiteRegisters in Amaranth's simulator: every access kind, byte strobes, SLVERR, the
lock on job and held registers, a stalled write, and the handshake timing."""

from __future__ import annotations

import pytest
from amaranth.lib import wiring
from amaranth.sim import Simulator

from qaccel.rtl.axi.axil_registers import RESP_OKAY, RESP_SLVERR, AxiLiteRegisters
from qaccel.rtl.axi.regmap import Field, Register, RegisterMap

F, R = Field, Register
MAP = RegisterMap("t", "quantize", (
    R("ID", 0x00, "", (F("id", 0, 32, "ro", "", 0x51414343),), constant=True),
    R("CTRL", 0x04, "", (F("start", 0, 1, "wo", ""), F("arg", 8, 8, "wo", ""))),
    R("STATUS", 0x08, "", (F("busy", 0, 1, "ro", ""), F("level", 4, 4, "ro", ""))),
    R("ERROR", 0x0C, "", (F("a", 0, 1, "w1c", ""), F("b", 1, 1, "w1c", ""))),
    R("IRQ_ENABLE", 0x10, "", (F("done", 0, 1, "rw", "", 1),)),
    R("SIZE", 0x14, "", (F("size", 0, 16, "rw", "", job_bit=0),)),
    R("MODE", 0x18, "", (F("p", 0, 3, "rw", "", job_bit=16), F("q", 3, 2, "rw", "", job_bit=19))),
    R("PUSH", 0x1C, "", (F("value", 0, 32, "wo", ""),), stall=True, held=True),
), job_width=21, config_crc=0)


def _run(bench):
    dut = AxiLiteRegisters(MAP, addr_width=8)
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    async def testbench(ctx):
        await bench(ctx, dut)

    sim.add_testbench(testbench)
    sim.run()


async def _write(ctx, dut, addr, data, strb=0xF, *, wait=20):
    """AW and W together; returns (response, cycles until accepted)."""
    ctx.set(dut.s_axil_awaddr, addr)
    ctx.set(dut.s_axil_wdata, data)
    ctx.set(dut.s_axil_wstrb, strb)
    ctx.set(dut.s_axil_awvalid, 1)
    ctx.set(dut.s_axil_wvalid, 1)
    ctx.set(dut.s_axil_bready, 1)
    waited = 0
    while not ctx.get(dut.s_axil_awready):
        if waited == wait:
            return None, wait
        await ctx.tick()
        waited += 1
    assert ctx.get(dut.s_axil_wready)
    await ctx.tick()
    ctx.set(dut.s_axil_awvalid, 0)
    ctx.set(dut.s_axil_wvalid, 0)
    assert ctx.get(dut.s_axil_bvalid)
    resp = ctx.get(dut.s_axil_bresp)
    await ctx.tick()
    assert not ctx.get(dut.s_axil_bvalid)
    return resp, waited


async def _read(ctx, dut, addr):
    ctx.set(dut.s_axil_araddr, addr)
    ctx.set(dut.s_axil_arvalid, 1)
    ctx.set(dut.s_axil_rready, 1)
    assert ctx.get(dut.s_axil_arready)
    await ctx.tick()
    ctx.set(dut.s_axil_arvalid, 0)
    assert ctx.get(dut.s_axil_rvalid)
    data, resp = ctx.get(dut.s_axil_rdata), ctx.get(dut.s_axil_rresp)
    await ctx.tick()
    return data, resp


def test_access_kinds():
    async def bench(ctx, dut):
        assert await _read(ctx, dut, 0x00) == (0x51414343, RESP_OKAY)
        assert await _read(ctx, dut, 0x10) == (1, RESP_OKAY)          # rw reset value
        assert await _read(ctx, dut, 0x40) == (0, RESP_SLVERR)        # unmapped
        assert (await _write(ctx, dut, 0x40, 5))[0] == RESP_SLVERR
        ctx.set(dut.status_busy, 1)
        ctx.set(dut.status_level, 0xA)
        assert await _read(ctx, dut, 0x08) == (0xA1, RESP_OKAY)       # ro inputs
        # a write to a read-only register is ignored, OKAY
        assert (await _write(ctx, dut, 0x08, 0))[0] == RESP_OKAY
        # wo: the value and a one-cycle pulse; reads 0
        ctx.set(dut.s_axil_awaddr, 0x04)
        resp, _ = await _write(ctx, dut, 0x04, 0x2A01)
        assert resp == RESP_OKAY
        assert await _read(ctx, dut, 0x04) == (0, RESP_OKAY)
        # job fields: the job vector, byte strobes honoured
        await _write(ctx, dut, 0x14, 0xBEEF)
        await _write(ctx, dut, 0x14, 0x1200, strb=0b0010)
        await _write(ctx, dut, 0x18, 0b10_101)
        assert ctx.get(dut.job) == 0x12EF | (0b101 << 16) | (0b10 << 19)
        assert await _read(ctx, dut, 0x18) == (0b10101, RESP_OKAY)
    _run(bench)


def test_write_strobe_pulse():
    async def bench(ctx, dut):
        pulses = []
        ctx.set(dut.s_axil_awaddr, 0x04)
        ctx.set(dut.s_axil_wdata, 0x2A01)
        ctx.set(dut.s_axil_wstrb, 0xF)
        ctx.set(dut.s_axil_awvalid, 1)
        ctx.set(dut.s_axil_wvalid, 1)
        ctx.set(dut.s_axil_bready, 1)
        for _ in range(5):
            await ctx.tick()
            ctx.set(dut.s_axil_awvalid, 0)
            ctx.set(dut.s_axil_wvalid, 0)
            pulses.append((ctx.get(dut.ctrl_write), ctx.get(dut.ctrl_start),
                           ctx.get(dut.ctrl_arg)))
        assert pulses[0] == (1, 1, 0x2A) and all(p[0] == 0 for p in pulses[1:])
    _run(bench)


def test_w1c():
    async def bench(ctx, dut):
        ctx.set(dut.error_a_set, 1)
        await ctx.tick()
        ctx.set(dut.error_a_set, 0)
        ctx.set(dut.error_b_set, 1)
        await ctx.tick()
        ctx.set(dut.error_b_set, 0)
        assert await _read(ctx, dut, 0x0C) == (0b11, RESP_OKAY)
        await _write(ctx, dut, 0x0C, 0b01)
        assert await _read(ctx, dut, 0x0C) == (0b10, RESP_OKAY)
        await _write(ctx, dut, 0x0C, 0b10, strb=0)                   # no strobe: no clear
        assert await _read(ctx, dut, 0x0C) == (0b10, RESP_OKAY)
    _run(bench)


def test_lock_and_stall():
    async def bench(ctx, dut):
        await _write(ctx, dut, 0x14, 7)
        ctx.set(dut.lock, 1)
        resp, _ = await _write(ctx, dut, 0x14, 9)
        assert resp == RESP_SLVERR and ctx.get(dut.job) & 0xFFFF == 7
        resp, waited = await _write(ctx, dut, 0x1C, 1)                # held: refused at once
        assert (resp, waited) == (RESP_SLVERR, 0)
        assert (await _write(ctx, dut, 0x10, 0))[0] == RESP_OKAY       # not held
        ctx.set(dut.lock, 0)
        # a stall register waits for its ready, then takes the write
        ctx.set(dut.push_ready, 0)
        resp, waited = await _write(ctx, dut, 0x1C, 0x55, wait=6)
        assert resp is None and waited == 6
        ctx.set(dut.push_ready, 1)
        assert ctx.get(dut.s_axil_awready)
        await ctx.tick()
        assert ctx.get(dut.s_axil_bvalid) and ctx.get(dut.s_axil_bresp) == RESP_OKAY
        assert ctx.get(dut.push_write) and ctx.get(dut.push) == 0x55
    _run(bench)


def test_map_checks():
    with pytest.raises(TypeError, match="regmap must be a RegisterMap"):
        AxiLiteRegisters({})
    with pytest.raises(ValueError, match="addr_width must cover the map's 32 bytes, not 4"):
        AxiLiteRegisters(MAP, addr_width=4)


def test_decoder_routes_windows():
    """Two banks behind an AxiLiteDecoder: each answers in its window, an address past the
    last window answers SLVERR, and one response at a time comes back."""
    from amaranth.hdl import Module

    from qaccel.rtl.axi.axil_decoder import AxiLiteDecoder

    dec = AxiLiteDecoder(3, window_bits=8)
    banks = [AxiLiteRegisters(MAP, addr_width=8) for _ in range(3)]
    m = Module()
    m.submodules.dec = dec
    for k, b in enumerate(banks):
        m.submodules[f"b{k}"] = b
        for name, member in b.signature.members.items():
            if name.startswith("s_axil_"):
                theirs = getattr(dec, f"m{k}_axil_" + name[len("s_axil_"):])
                m.d.comb += (getattr(b, name).eq(theirs) if member.flow == wiring.In
                             else theirs.eq(getattr(b, name)))
    sim = Simulator(m)
    sim.add_clock(1e-8)

    async def bench(ctx):
        for k in range(3):
            assert (await _write(ctx, dec, (k << 8) | 0x14, 100 + k))[0] == RESP_OKAY
        for k in range(3):
            assert await _read(ctx, dec, (k << 8) | 0x14) == (100 + k, RESP_OKAY)
            assert ctx.get(banks[k].job) & 0xFFFF == 100 + k
        assert await _read(ctx, dec, (3 << 8) | 0x14) == (0, RESP_SLVERR)
        assert (await _write(ctx, dec, 3 << 8, 1))[0] == RESP_SLVERR
        assert await _read(ctx, dec, 0x00) == (0x51414343, RESP_OKAY)

    sim.add_testbench(bench)
    sim.run()
    with pytest.raises(ValueError, match="slaves"):
        AxiLiteDecoder(0)
