# amaranth: UnusedElaboratable=no
"""BlockFifo (qaccel.rtl.arith.block_fifo) against a cycle model of
amaranth.lib.fifo.SyncFIFOBuffered
(the FIFO it replaces), under random writes, reads and resets; its DP16KD build against the
behavioural one on Icarus."""

from __future__ import annotations

import random

import pytest
from amaranth.hdl import ClockDomain, Module
from amaranth.lib import fifo, wiring
from amaranth.sim import Simulator

from qaccel.rtl.arith.block_fifo import LATENCY, BlockFifo

from ..ecp5_models import DP16KD_MODEL, needs_icarus, run_twins


class _Pair(wiring.Component):
    """BlockFifo and SyncFIFOBuffered side by side, the same inputs, a resettable domain."""

    def __init__(self, width, depth):
        self.dut = BlockFifo(width=width, depth=depth)
        self.ref = fifo.SyncFIFOBuffered(width=width, depth=depth)
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.domains.sync = self.cd = ClockDomain("sync")
        m.submodules.dut, m.submodules.ref = self.dut, self.ref
        return m


@pytest.mark.parametrize("depth, seed", [(4, 1), (8, 2), (32, 3), (512, 4)])
def test_same_as_sync_fifo_buffered(depth, seed):
    """Every cycle: the same ``w_rdy``, ``r_rdy`` and offered word as SyncFIFOBuffered (when
    offered); every word out once, in order; the latency is :data:`LATENCY`."""
    top = _Pair(13, depth)
    dut, ref = top.dut, top.ref
    rng = random.Random(seed)
    got = {"out": [], "in": [], "mismatch": 0, "latency": None}

    async def bench(ctx):
        n = 0
        # latency: one word into the empty FIFO
        ctx.set(dut.w_data, 77)
        ctx.set(ref.w_data, 77)
        for p in (dut, ref):
            ctx.set(p.w_en, 1)
        await ctx.tick()
        for p in (dut, ref):
            ctx.set(p.w_en, 0)
        c = 1
        while not ctx.get(dut.r_rdy):
            await ctx.tick()
            c += 1
        got["latency"] = c
        for p in (dut, ref):
            ctx.set(p.r_en, 1)
        await ctx.tick()
        for cycle in range(6000):
            phase = (cycle // 500) % 3               # fill, drain, mixed
            w = rng.random() < (0.9, 0.2, 0.5)[phase]
            r = rng.random() < (0.2, 0.9, 0.5)[phase]
            word = rng.randrange(1 << 13)
            for p in (dut, ref):
                ctx.set(p.w_data, word)
                ctx.set(p.w_en, w)
                ctx.set(p.r_en, r)
            same = (ctx.get(dut.w_rdy) == ctx.get(ref.w_rdy)
                    and ctx.get(dut.r_rdy) == ctx.get(ref.r_rdy)
                    and (not ctx.get(ref.r_rdy) or ctx.get(dut.r_data) == ctx.get(ref.r_data)))
            got["mismatch"] += not same
            if w and ctx.get(dut.w_rdy):
                got["in"].append(word)
            if r and ctx.get(dut.r_rdy):
                got["out"].append(ctx.get(dut.r_data))
            if cycle == 4500:                        # a reset with words inside
                ctx.set(top.cd.rst, 1)
                await ctx.tick()
                ctx.set(top.cd.rst, 0)
                got["in"], got["out"] = [], []
                n += 1
                continue
            await ctx.tick()
        # drain
        for p in (dut, ref):
            ctx.set(p.w_en, 0)
            ctx.set(p.r_en, 1)
        for _ in range(depth + 4):
            if ctx.get(dut.r_rdy):
                got["out"].append(ctx.get(dut.r_data))
            await ctx.tick()

    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert got["latency"] == LATENCY
    assert got["mismatch"] == 0
    assert got["out"] == got["in"] and len(got["in"]) > 300


@needs_icarus
def test_dp16kd_build_matches_behaviour_icarus(tmp_path):
    """With DP16KD instances (two cells for 50 bits; a model of the cell) the FIFO behaves
    exactly like the behavioural build, cycle by cycle, under random writes and reads."""
    beh, prim = BlockFifo(width=50, depth=16), BlockFifo(width=50, depth=16, ecp5=True)
    assert prim.blocks == 2
    tb = """
module tb;
  reg clk = 0, rst = 1, we = 0, re = 0;
  reg [49:0] wd = 0;
  wire [49:0] rb, rp;
  wire wr_b, wr_p, rr_b, rr_p;
  beh b(.clk(clk), .rst(rst), .w_data(wd), .w_en(we), .w_rdy(wr_b), .r_data(rb), .r_en(re),
        .r_rdy(rr_b));
  prim p(.clk(clk), .rst(rst), .w_data(wd), .w_en(we), .w_rdy(wr_p), .r_data(rp), .r_en(re),
         .r_rdy(rr_p));
  always #5 clk = ~clk;
  integer k, errors = 0, outs = 0;
  initial begin
    repeat (3) @(negedge clk);
    rst = 0;
    for (k = 0; k < 4000; k = k + 1) begin
      @(negedge clk);
      wd = {$random, $random};
      we = ($random & 3) != 0;
      re = ($random & 3) != ((k / 300) % 2 ? 0 : 3);
      #1;
      if (wr_b !== wr_p || rr_b !== rr_p || (rr_b && rb !== rp)) errors = errors + 1;
      if (rr_b && re) outs = outs + 1;
    end
    $display("RESULT %0d %0d", errors, outs);
    $finish;
  end
endmodule
"""
    errors, outs = run_twins(tmp_path, beh, prim, DP16KD_MODEL, tb)
    assert errors == 0 and outs > 1000, (errors, outs)


@pytest.mark.parametrize(("kwargs", "exc", "match"), [
    ({"width": 0, "depth": 8}, ValueError, "width must be in"),
    ({"width": 8, "depth": 12}, ValueError, "depth must be a power of two, not 12"),
    ({"width": 8, "depth": 1024}, ValueError, "depth must be in"),
    ({"width": 8, "depth": 8, "ecp5": 1}, TypeError, "ecp5 must be a bool, not 1"),
    ({"width": 8.0, "depth": 8}, TypeError, "width must be an integer"),
])
def test_errors(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        BlockFifo(**kwargs)
