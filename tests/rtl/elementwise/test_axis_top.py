# amaranth: UnusedElaboratable=no
"""AxisTop: AXI4-Stream port names in the Verilog, the JSON description, and (Amaranth's
simulator) Quantize jobs whose packed output bytes are ONNX's packing of onnx.reference's
result (which the golden model's bytes equal)."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from amaranth.sim import Simulator
from onnx import numpy_helper

from qaccel.eda.emit import write_verilog
from qaccel.model.config import AccelConfig
from qaccel.model.quant import quantize_linear
from qaccel.rtl.elementwise.axis_top import AxisTop
from qaccel.rtl.elementwise.quantize import Quantize
from qaccel.sim.jobs import quantize_job
from tests.model.quant_helpers import assert_bitexact, q_opset, reference, tid

SMALL = AccelConfig(lanes=2, q_inputs=("float32",), scales=("float32",),
                    q_outputs=("int8", "int4", "uint4", "int2", "uint2", "float4e2m1"),
                    dq_inputs=("int8", "int4"),
                    dq_outputs=("float32",), table_depth=16, max_dims=2)

AXIS = {"s_axis_table_tdata", "s_axis_table_tvalid", "s_axis_table_tready", "s_axis_x_tdata",
        "s_axis_x_tvalid", "s_axis_x_tready", "m_axis_y_tdata", "m_axis_y_tkeep",
        "m_axis_y_tlast", "m_axis_y_tvalid", "m_axis_y_tready"}
AXIL = {f"s_axil_{s}" for s in ("awaddr", "awprot", "awvalid", "awready", "wdata", "wstrb",
                                "wvalid", "wready", "bresp", "bvalid", "bready", "araddr",
                                "arprot", "arvalid", "arready", "rdata", "rresp", "rvalid",
                                "rready")}
FILES = (".v", ".json", "_regs.h", "_regs.md", "_inst.vh", ".sdc")


def _ports(path) -> set[str]:
    header = path.read_text().split(f"module {path.stem}(")[1].split(");")[0]
    return {p.strip() for p in header.split(",")}


def test_write_verilog_axi_names(tmp_path):
    """qaccel verilog's Quantize and Dequantize cores: AXI4-Lite control, byte-aligned
    AXI4-Stream data (the table entry's fields each on a byte), aclk / aresetn, irq; the
    JSON lists the ports, the register map and the stream byte layouts."""
    paths = write_verilog(SMALL, tmp_path, ops=("quantize", "dequantize"))
    assert {p.name for p in paths} == {f"qaccel_{op}{ext}" for op in ("quantize", "dequantize")
                                       for ext in FILES} | {"config.json", "qaccel_lint.vlt"}
    for op in ("quantize", "dequantize"):
        ports = _ports(tmp_path / f"qaccel_{op}.v")
        assert ports == AXIS | AXIL | {"aclk", "aresetn", "irq"}
        desc = json.loads((tmp_path / f"qaccel_{op}.json").read_text())
        assert {p["name"] for p in desc["ports"]} == ports
        widths = {p["name"]: p["width"] for p in desc["ports"]}
        assert all(widths[p] % 8 == 0 for p in ports if p.endswith("tdata"))
        assert desc["reset"] == {"name": "aresetn", "active": "low", "synchronous": True}
        table = {f["name"]: f["byte_offset"] for f in desc["streams"]["table"]["fields"]}
        assert table == {"addr": 0, "scale": 8, "zero_point": 40}
        assert widths["s_axis_table_tdata"] == 8 * desc["streams"]["table"]["tdata_bytes"]
        assert desc["register_map"]["registers"][0]["name"] == "ID"
        assert desc["config"] == SMALL.to_dict("elementwise")
        assert desc["type_indices"]["out_fmt"] == list(
            SMALL.q_outputs if op == "quantize" else SMALL.dq_outputs)
        assert "| 0x000 | `ID` |" in (tmp_path / f"qaccel_{op}_regs.md").read_text()
    assert AccelConfig.load(tmp_path / "config.json") == SMALL


def test_write_verilog_matmul_nbits(tmp_path):
    """The v2 engine (a configuration without the float path, as the default) behind AXI:
    a, w, s, b in, y out, the job in registers; its timing, nibble columns and call
    cycles (the performance model) in the JSON."""
    config = AccelConfig(pe=4, simd=2, m_tile=3, max_k=1024, float_path=False,
                         dsp_pairs=None)
    paths = write_verilog(config, tmp_path, ops=("matmul_nbits",))
    assert {p.name for p in paths} == {f"qaccel_matmul_nbits{ext}" for ext in FILES} | {
        "config.json", "qaccel_lint.vlt"}
    ports = _ports(tmp_path / "qaccel_matmul_nbits.v")
    want = {f"s_axis_{s}_{f}" for s in "awsb" for f in ("tdata", "tvalid", "tready")}
    want |= {"m_axis_y_tdata", "m_axis_y_tlast", "m_axis_y_tvalid", "m_axis_y_tready",
             "aclk", "aresetn", "irq"} | AXIL
    assert ports == want
    desc = json.loads((tmp_path / "qaccel_matmul_nbits.json").read_text())
    assert desc["engine"] == "v2" and desc["lanes"] == config.scale_lanes
    assert {p["name"] for p in desc["ports"]} == ports
    widths = {p["name"]: p["width"] for p in desc["ports"]}
    assert widths["s_axis_w_tdata"] == 4 * 4 * 2 and widths["m_axis_y_tdata"] == 32
    assert widths["s_axis_a_tdata"] == 32
    assert widths["s_axis_s_tdata"] == config.scale_lanes * 40
    assert desc["timing"]["mac"] > 0 and len(desc["wide_columns"]) == config.pe // 2
    assert [r["name"] for r in desc["register_map"]["registers"]][10:] == [
        "K", "BLOCK_SIZE", "MODE", "M", "GROUPS"]
    assert all(e["cycles"] > 0 for e in desc["latency"]["examples"])


def test_write_verilog_matmul_nbits_float_path(tmp_path):
    """A configuration with the float path gets the v2 engine with it: a 2-bit fmode field
    in MODE, the fmode codes in the description."""
    config = AccelConfig(pe=4, simd=2, m_tile=4, max_k=1024, float_path=True)
    write_verilog(config, tmp_path, ops=("matmul_nbits",))
    desc = json.loads((tmp_path / "qaccel_matmul_nbits.json").read_text())
    assert desc["engine"] == "v2" and desc["config"]["matmul_nbits"]["float_path"] is True
    mode = next(r for r in desc["register_map"]["registers"] if r["name"] == "MODE")
    assert {f["name"]: f["width"] for f in mode["fields"]}["fmode"] == 2
    assert desc["fmode"] == {"int8 path": 0, "float path": 1,
                             "float path, float zero points": 3}
    assert "module qaccel_matmul_nbits(" in (tmp_path / "qaccel_matmul_nbits.v").read_text()


def test_axis_top_errors():
    with pytest.raises(TypeError, match="unit must be a Quantize or Dequantize unit"):
        AxisTop(object(), op="quantize")
    with pytest.raises(ValueError, match="op must be 'quantize' or 'dequantize'"):
        AxisTop(Quantize(SMALL), op="matmul")
    with pytest.raises(ValueError, match="ops must be among"):
        write_verilog(SMALL, "/tmp/unused", ops=("matmul",))


#: 13 elements (an odd count: the last byte of a 4-bit stream is half padding) with negative
#: codes, -0 (exact, and -0.2 rounding to it), NaN and saturation; scale 0.5.
AXIS_X = np.float32([-0.0, -1.2, 2.6, -3.5, -2.5, -0.2, -100, 100, np.nan, -0.6, 1.4, -7, 5])


@pytest.mark.parametrize(("dtype", "bits"), [
    (np.dtype(np.int8), 8), (np.dtype(ml_dtypes.int4), 4), (np.dtype(ml_dtypes.uint4), 4),
    (np.dtype(ml_dtypes.int2), 2), (np.dtype(ml_dtypes.uint2), 2),
    (np.dtype(ml_dtypes.float4_e2m1fn), 4)], ids=tid)
def test_axis_top_packs_like_onnx(dtype, bits):
    """A per-tensor job on 2 lanes: the packed stream is, byte for byte, ONNX's packing
    (``numpy_helper.from_array``) of onnx.reference's output. A code with its container's
    upper bits set would spill into its neighbour or the padding. With a word per beat (8
    bits), the first word is offered ``latency`` cycles after the first ``x`` transfer, the
    figure the JSON description states."""
    unit = Quantize(SMALL)
    top = AxisTop(unit, op="quantize")
    x, scale, zp = AXIS_X, np.float32(0.5), np.zeros((), dtype)
    ref = reference("QuantizeLinear", [x, scale, zp], opset=q_opset(np.float32, np.float32,
                                                                     dtype), y_dtype=dtype)
    assert_bitexact(quantize_linear(x, scale, zp), ref)
    want = numpy_helper.from_array(ref).raw_data
    assert len(want) == -(-x.size * bits // 8)
    job = quantize_job(unit, x, scale, zp)
    table_layout = unit.signature.members["table"].signature.members["payload"].shape
    out = bytearray()
    seen = {}

    async def bench(ctx):
        ctx.set(top.cfg_regs.as_value(), job.regs)
        for addr, s, z in job.table:
            ctx.set(top.s_axis_table_tdata, (addr << table_layout["addr"].offset)
                    | (s << table_layout["scale"].offset)
                    | (z << table_layout["zero_point"].offset))
            ctx.set(top.s_axis_table_tvalid, 1)
            await ctx.tick()
        ctx.set(top.s_axis_table_tvalid, 0)
        ctx.set(top.cfg_start, 1)
        await ctx.tick()
        ctx.set(top.cfg_start, 0)
        ctx.set(top.m_axis_y_tready, 1)
        beats = list(job.x)
        cycles = 0
        while cycles < 400:
            if beats:
                ctx.set(top.s_axis_x_tdata, beats[0])
                ctx.set(top.s_axis_x_tvalid, 1)
            else:
                ctx.set(top.s_axis_x_tvalid, 0)
            await ctx.delay(1e-9)
            if beats and ctx.get(top.s_axis_x_tready):
                beats.pop(0)
                seen.setdefault("x", cycles)
            if ctx.get(top.m_axis_y_tvalid):
                seen.setdefault("y", cycles)
                data, keep = ctx.get(top.m_axis_y_tdata), ctx.get(top.m_axis_y_tkeep)
                raw = data.to_bytes(len(top.m_axis_y_tdata) // 8, "little")
                out.extend(b for j, b in enumerate(raw) if keep >> j & 1)
                if ctx.get(top.m_axis_y_tlast):
                    return
            await ctx.tick()
            cycles += 1
        raise AssertionError("no tlast within 400 cycles")

    sim = Simulator(top)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert bytes(out) == want, (bytes(out).hex(), want.hex())
    if bits == 8:
        assert seen["y"] - seen["x"] == top.latency == top.describe()["latency"]


def test_cli_verilog(tmp_path):
    """`qaccel verilog --config cfg.json -o out/` writes the Verilog, its JSON and the config."""
    from qaccel.app.cli import main

    cfg = tmp_path / "cfg.json"
    cfg.write_text(SMALL.to_json())
    assert main(["verilog", "--config", str(cfg), "-o", str(tmp_path / "out"),
                 "--ops", "quantize"]) == 0
    assert (tmp_path / "out" / "qaccel_quantize.v").is_file()
    assert json.loads((tmp_path / "out" / "qaccel_quantize.json").read_text())["lanes"] == 2
