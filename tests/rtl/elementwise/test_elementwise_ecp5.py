# amaranth: UnusedElaboratable=no
"""The Quantize / Dequantize units' ECP5 build (``ecp5=True``: the table from DP16KD
instances, 36-bit columns, one per lane; the lanes' multipliers MULT18X18D instances with their
own registers) against the inferred twin on Icarus with the cell models
(tests/rtl/ecp5_models.py): the same job (every table entry written, ``table.ready`` obeyed,
then the beats with random back-pressure on ``y``), the two units' ``y`` stream compared in
every cycle; and the cells are there."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.back import verilog
from amaranth.hdl import Value

from qaccel.model.presets import preset
from qaccel.rtl.elementwise.dequantize import Dequantize
from qaccel.rtl.elementwise.quantize import Quantize
from qaccel.sim.elementwise_sim import table_fields
from qaccel.sim.jobs import dequantize_job, quantize_job

from ..ecp5_models import DP16KD_MODEL, mult18x18d_model, needs_icarus, run_twins

TB = """
module tb;
  reg clk = 0, rst = 1, start = 0, t_valid = 0, x_valid = 0, y_ready = 0;
  reg [%(tw)d:0] t_data = 0;
  reg [%(xw)d:0] x_data = 0;
  reg [%(rw)d:0] regs = %(regs)s;
  reg [%(tw)d:0] table_mem [0:%(nt)d];
  reg [%(xw)d:0] x_mem [0:%(nx)d];
  wire t_ready_b, t_ready_p, x_ready_b, x_ready_p, y_valid_b, y_valid_p, busy_b, busy_p;
  wire [%(yw)d:0] y_b, y_p;
  beh b(.clk(clk), .rst(rst), .regs(regs), .start(start), .table__valid(t_valid),
        .table__payload(t_data), .table__ready(t_ready_b), .x__valid(x_valid),
        .x__payload(x_data), .x__ready(x_ready_b), .y__valid(y_valid_b), .y__payload(y_b),
        .y__ready(y_ready), .busy(busy_b));
  prim p(.clk(clk), .rst(rst), .regs(regs), .start(start), .table__valid(t_valid),
         .table__payload(t_data), .table__ready(t_ready_p), .x__valid(x_valid),
         .x__payload(x_data), .x__ready(x_ready_p), .y__valid(y_valid_p), .y__payload(y_p),
         .y__ready(y_ready), .busy(busy_p));
  always #5 clk = ~clk;
  integer errors = 0, outs = 0, ti = 0, xi = 0, seed = 7, cycle = 0;
  reg taken;
  initial begin
    $readmemh("table.hex", table_mem);
    $readmemh("x.hex", x_mem);
    repeat (3) @(negedge clk);
    rst = 0;
    repeat (3) @(negedge clk);          // (Icarus: comb blocks settle after the reset edge)
    while (ti <= %(nt)d) begin          // the table, each entry held until ready
      t_valid = 1; t_data = table_mem[ti];
      #1 taken = t_ready_b;              // ready in this cycle (it depends on registers)
      @(posedge clk); #1;
      if (taken) ti = ti + 1;
    end
    t_valid = 0;
    @(negedge clk); start = 1; @(negedge clk); start = 0;
    x_valid = 1;
    while (xi <= %(nx)d || busy_b) begin
      x_data = x_mem[xi > %(nx)d ? %(nx)d : xi]; x_valid = xi <= %(nx)d;
      y_ready = ($random(seed) & 3) != 0;
      #1 taken = x_valid && x_ready_b;
      @(posedge clk); #1;
      if (taken) xi = xi + 1;
      cycle = cycle + 1;
      if (cycle > 200000) begin errors = errors + 1; xi = %(nx)d + 1; end
    end
    $display("RESULT %%0d %%0d", errors, outs);
    $finish;
  end
  always @(posedge clk) if (!rst) begin
    if (t_ready_b !== t_ready_p || x_ready_b !== x_ready_p || y_valid_b !== y_valid_p
        || busy_b !== busy_p) errors = errors + 1;
    if (y_valid_b && y_ready) begin
      outs = outs + 1;
      if (y_b !== y_p) errors = errors + 1;
    end
  end
endmodule
"""


def _tb(unit, job) -> tuple[str, dict[str, str]]:
    fields = table_fields(unit)
    words = []
    for entry in job.table:
        word = 0
        for (_, offset, _), value in zip(fields, entry, strict=True):
            word |= value << offset
        words.append(word)
    def width(member) -> int:
        return len(Value.cast(member.payload if hasattr(member, "payload") else member))

    params = {"tw": width(unit.table) - 1, "xw": width(unit.x) - 1, "yw": width(unit.y) - 1,
              "rw": width(unit.regs) - 1, "regs": f"{width(unit.regs)}'h{job.regs:x}",
              "nt": len(words) - 1, "nx": len(job.x) - 1}
    files = {"table.hex": "\n".join(f"{w:x}" for w in words),
             "x.hex": "\n".join(f"{w:x}" for w in job.x)}
    return TB % params, files


@needs_icarus
@pytest.mark.parametrize(("op", "name"), [("quantize", "qdq-int8"), ("dequantize", "qdq-int8"),
                                          ("quantize", "qdq-int8-x8")])
def test_ecp5_build_same_as_inferred(tmp_path, op, name):
    config = preset(name)
    rng = np.random.default_rng(5)
    if op == "quantize":
        beh, prim = Quantize(config), Quantize(config, ecp5=True)
        x = (rng.standard_normal((3, 512)) * 50).astype(np.float32)
        scale = np.exp2(rng.uniform(-8, 4, 512)).astype(np.float32)
        zp = rng.integers(-128, 128, 512).astype(np.int8)
        job = quantize_job(beh, x, scale, zp, axis=1)
    else:
        beh, prim = Dequantize(config), Dequantize(config, ecp5=True)
        x = rng.integers(-128, 128, (3, 512)).astype(np.int8)
        scale = np.exp2(rng.uniform(-8, 4, 512)).astype(np.float32)
        zp = rng.integers(-128, 128, 512).astype(np.int8)
        job = dequantize_job(beh, x, scale, zp, axis=1)
    assert len(job.table) == 512
    text = verilog.convert(prim, name="prim", emit_src=False)
    lanes = config.lanes
    assert text.count("DP16KD ") == 2 * lanes
    # the lanes' multipliers: the divider's (divider_dsps each) or IntScaleMul's 2
    dsps = (config.divider_dsps or 4) if op == "quantize" else 2
    assert text.count("MULT18X18D ") == dsps * lanes
    tb, files = _tb(beh, job)
    for name, body in files.items():
        (tmp_path / name).write_text(body)
    errors, outs = run_twins(tmp_path, beh, prim, DP16KD_MODEL + mult18x18d_model(), tb)
    assert errors == 0 and outs == len(job.x), (errors, outs)


def test_ecp5_flag_type():
    with pytest.raises(TypeError, match="ecp5 must be a bool"):
        Quantize(preset("qdq-int8"), ecp5=1)
