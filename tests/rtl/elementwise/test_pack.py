# amaranth: UnusedElaboratable=no
"""Pack in Amaranth's simulator: the byte stream equals ONNX's packing of the elements, under
random idle cycles and back-pressure; parameter errors."""

from __future__ import annotations

import random

import numpy as np
import pytest
from amaranth.sim import Simulator

from qaccel.rtl.elementwise.pack import Pack


def onnx_bytes(codes: list[int], bits: int) -> bytes:
    """Little-endian dense packing, first element lowest, a partial last byte zero-padded."""
    value = sum((c & ((1 << bits) - 1)) << (k * bits) for k, c in enumerate(codes))
    return value.to_bytes(-(-len(codes) * bits // 8), "little")


def simulate(dut: Pack, bits: int, codes: list[int], seed: int, idle: float, stall: float):
    rng = random.Random(seed)
    lanes = dut.i.payload.data.shape().length
    beats = [codes[k:k + lanes] + [rng.randrange(256)] * (lanes - len(codes[k:k + lanes]))
             for k in range(0, len(codes), lanes)]
    words = []

    async def source(ctx):
        ctx.set(dut.bits, bits)
        ctx.set(dut.count, len(codes))
        for n, beat in enumerate(beats):
            while rng.random() < idle:
                await ctx.tick()
            ctx.set(dut.i.payload, {"data": beat, "last": int(n == len(beats) - 1)})
            ctx.set(dut.i.valid, 1)
            await ctx.tick().until(dut.i.ready)
            ctx.set(dut.i.valid, 0)

    async def sink(ctx):
        while True:
            ctx.set(dut.o.ready, int(rng.random() >= stall))
            await ctx.delay(1e-9)
            if ctx.get(dut.o.valid) and ctx.get(dut.o.ready):
                words.append(ctx.get(dut.o.payload))
                if words[-1]["last"]:
                    await ctx.tick()
                    return
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(source)
    sim.add_testbench(sink)
    sim.run_until(1e-6 * (20 * len(beats) + 200))
    out = b""
    for w in words:
        width = dut.o.payload.data.shape().width
        raw = int(w["data"]).to_bytes(width // 8, "little")
        out += bytes(b for j, b in enumerate(raw) if (int(w["keep"]) >> j) & 1)
    return out, words


@pytest.mark.parametrize(("lanes", "max_bits"), [(1, 16), (2, 16), (4, 16), (3, 32)])
@pytest.mark.parametrize("count", [1, 5, 16, 37])
def test_pack_matches_onnx(lanes, max_bits, count):
    widths = tuple(w for w in (2, 4, 8, 16, 32) if w <= max_bits)
    dut = Pack(lanes=lanes, max_bits=max_bits, widths=widths)
    rng = np.random.default_rng(count * 7 + lanes)
    for k, bits in enumerate(widths):
        codes = [int(c) for c in rng.integers(0, 1 << bits, count)]
        got, words = simulate(dut, bits, codes, seed=k, idle=0.3, stall=0.3)
        assert got == onnx_bytes(codes, bits), (bits, codes, words)
        assert sum(int(w["last"]) for w in words) == 1


def test_pack_full_rate():
    """No pauses: one input beat per cycle; int4 with 2 lanes fills a 32-bit word in 4 beats."""
    dut = Pack(lanes=2, max_bits=16, widths=(4, 8, 16))
    codes = list(range(16))
    got, words = simulate(dut, 4, codes, seed=0, idle=0.0, stall=0.0)
    assert got == onnx_bytes(codes, 4)
    assert len(words) == 2


def test_pack_errors():
    with pytest.raises(ValueError, match="max_bits must be a power of two"):
        Pack(lanes=1, max_bits=24, widths=(8,))
    with pytest.raises(ValueError, match="widths must be powers of two dividing"):
        Pack(lanes=1, max_bits=16, widths=(3,))
    with pytest.raises(ValueError, match="widths must name at least one width"):
        Pack(lanes=1, max_bits=16, widths=())
    with pytest.raises(TypeError, match="lanes must be an integer"):
        Pack(lanes=1.5, max_bits=16, widths=(8,))
