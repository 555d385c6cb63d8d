"""Behavioural Verilog models of the ECP5 cells that qaccel.rtl.arith.ecp5 instantiates, for the
Icarus tests that check a unit's ``ecp5=True`` build against its ``ecp5=False`` twin.

Each model covers only the configuration the builders use (and stops the simulation on any
other): they check the instances' wiring (pins, bit order, signedness, the cycles), not
Lattice's cells. Yosys ships only black boxes for them.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

__all__ = ["DP16KD_MODEL", "needs_icarus", "mult18x18d_model", "run_icarus"]

#: Skip mark for tests that need Icarus Verilog (``iverilog`` and ``vvp``).
needs_icarus = pytest.mark.skipif(shutil.which("iverilog") is None or shutil.which("vvp") is None,
                                  reason="Icarus Verilog (iverilog, vvp) not installed")

#: MULT18X18D (ECP5 sysDSP guide) with the A and B input registers and the output register on
#: CLK0 with CE0 and no reset, no pipeline register; SIGNEDA / SIGNEDB select a signed or an
#: unsigned 18-bit operand each (sampled with the operand).
_MULT18X18D = """
module MULT18X18D(%(ports)s);
  parameter REG_INPUTA_CLK = "NONE";
  parameter REG_INPUTB_CLK = "NONE";
  parameter REG_OUTPUT_CLK = "NONE";
  parameter REG_PIPELINE_CLK = "NONE";
  parameter GSR = "ENABLED";
  parameter RESETMODE = "SYNC";
  input %(inputs)s;
  output %(outputs)s;
  wire [17:0] a = {%(a)s};
  wire [17:0] b = {%(b)s};
  reg [17:0] ra = 0, rb = 0;
  reg sa = 0, sb = 0;
  reg [35:0] rp = 0;
  wire signed [18:0] xa = {sa & ra[17], ra};
  wire signed [18:0] xb = {sb & rb[17], rb};
  wire signed [37:0] prod = xa * xb;
  initial if (REG_INPUTA_CLK != "CLK0" || REG_INPUTB_CLK != "CLK0" || REG_OUTPUT_CLK != "CLK0"
              || REG_PIPELINE_CLK != "NONE")
    $fatal(1, "MULT18X18D model: registers not on CLK0");
  always @(posedge CLK0) if (CE0) begin
    if (SOURCEA || SOURCEB || RST0) $fatal(1, "MULT18X18D model: mode");
    ra <= a;
    rb <= b;
    sa <= SIGNEDA;
    sb <= SIGNEDB;
    rp <= prod[35:0];
  end
  assign {%(p)s} = rp;
endmodule
"""


def mult18x18d_model() -> str:
    """Verilog text of the MULT18X18D model (all of the cell's ports)."""
    def pins(x, n):
        return [f"{x}{k}" for k in range(n)]
    ins = (pins("A", 18) + pins("B", 18) + pins("C", 18) + ["SIGNEDA", "SIGNEDB", "SOURCEA",
           "SOURCEB"] + pins("CLK", 4) + pins("CE", 4) + pins("RST", 4))
    outs = pins("P", 36)
    return _MULT18X18D % {
        "ports": ", ".join(ins + outs), "inputs": ", ".join(ins), "outputs": ", ".join(outs),
        "a": ", ".join(reversed(pins("A", 18))), "b": ", ".join(reversed(pins("B", 18))),
        "p": ", ".join(reversed(outs))}


#: DP16KD in the one mode :func:`qaccel.rtl.arith.ecp5.dp16kd_sdp` uses: 36-bit words, address bits
#: 5..13 (ADA0..3 the write byte enables, all set), write on port A, read on port B,
#: REGMODE_B "NOREG" (or "OUTREG": one more register after the read), clock enables
#: CEA / CEB / OCEB.
DP16KD_MODEL = """
module DP16KD(\n""" + ",\n".join(
    [f"  input ADA{i}, ADB{i}" for i in range(14)]
    + [f"  input DIA{i}, DIB{i}" for i in range(18)]
    + [f"  output DOA{i}, DOB{i}" for i in range(18)]
    + ["  input CLKA, CLKB, CEA, CEB, OCEA, OCEB, WEA, WEB, RSTA, RSTB, CSA0, CSA1, CSA2, "
       "CSB0, CSB1, CSB2"]) + """);
  parameter DATA_WIDTH_A = 36, DATA_WIDTH_B = 36, REGMODE_A = "NOREG", REGMODE_B = "NOREG";
  parameter RESETMODE = "SYNC", ASYNC_RESET_RELEASE = "SYNC", CSDECODE_A = "0b000";
  parameter CSDECODE_B = "0b000", CLKAMUX = "CLKA", CLKBMUX = "CLKB", GSR = "DISABLED";
  reg [35:0] mem [0:511];
  reg [35:0] lat = 0, out = 0;
  wire [8:0] wa = {ADA13, ADA12, ADA11, ADA10, ADA9, ADA8, ADA7, ADA6, ADA5};
  wire [8:0] ra = {ADB13, ADB12, ADB11, ADB10, ADB9, ADB8, ADB7, ADB6, ADB5};
  wire [35:0] di = {""" + ", ".join(f"DIB{i}" for i in range(17, -1, -1)) + ", " + ", ".join(
    f"DIA{i}" for i in range(17, -1, -1)) + """};
  wire [35:0] dout = REGMODE_B == "OUTREG" ? out : lat;
  initial if (DATA_WIDTH_A != 36 || DATA_WIDTH_B != 36) $fatal(1, "DP16KD model: width");
  always @(posedge CLKA) if (CEA && WEA && {ADA3, ADA2, ADA1, ADA0} == 4'hF) mem[wa] <= di;
  always @(posedge CLKB) begin
    if (CEB) lat <= mem[ra];
    if (OCEB) out <= lat;
  end
  assign {""" + ", ".join(f"DOB{i}" for i in range(17, -1, -1)) + ", " + ", ".join(
    f"DOA{i}" for i in range(17, -1, -1)) + """} = dout;
endmodule
"""


def run_icarus(folder: Path, sources: dict[str, str], top: str = "tb") -> str:
    """Write ``sources`` (file name: Verilog text) into ``folder``, compile them with
    ``iverilog -g2012`` (top module ``top``) and run them there with ``vvp``; return the
    simulation's standard output (files it writes are in ``folder``)."""
    for fname, text in sources.items():
        (folder / fname).write_text(text)
    subprocess.run(["iverilog", "-g2012", "-o", "sim", "-s", top, *sources], cwd=folder,
                   check=True, capture_output=True, text=True)
    return subprocess.run(["vvp", "-n", "sim"], cwd=folder, check=True, capture_output=True,
                          text=True).stdout


def run_twins(folder: Path, beh, prim, models: str, tb: str) -> tuple[int, int]:
    """Emit ``beh`` and ``prim`` (Amaranth components) as modules ``beh`` and ``prim``, run
    them on Icarus with the cell ``models`` and the testbench ``tb`` (module ``tb``, which
    prints ``RESULT <errors> <outputs>``); return (errors, outputs)."""
    from qaccel.rtl.verilog import emit_verilog
    out = run_icarus(folder, {"all.v": emit_verilog(beh, "beh", emit_src=False)
                              + emit_verilog(prim, "prim", emit_src=False) + models + tb})
    line = [x for x in out.splitlines() if x.startswith("RESULT")]
    assert line, out
    errors, outs = map(int, line[0].split()[1:])
    return errors, outs
