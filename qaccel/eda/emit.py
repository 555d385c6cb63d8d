"""Write the accelerator's Verilog for FPGA synthesis: ``qaccel verilog --config cfg.json -o out/``.

For each operator core (Quantize, Dequantize, the MatMulNBits engine) of a configuration,
:func:`write_verilog` writes:

- ``qaccel_<op>.v`` (:func:`qaccel.rtl.verilog.clean_verilog`: deterministic, legal module
  names, each distinct unit once): the core behind AXI4-Lite control and byte-aligned
  AXI4-Stream data, ``aclk`` / ``aresetn`` (:class:`qaccel.rtl.axi.axi_core.AxiCore`);
- ``qaccel_<op>.json`` (ports, stream byte layouts, the register map, type indices, latency,
  the configuration);
- ``qaccel_<op>_regs.h`` and ``qaccel_<op>_regs.md``: the register map as a C header and a
  Markdown reference (:mod:`qaccel.rtl.axi.regmap`);
- ``qaccel_<op>_inst.vh`` (an instantiation template) and ``qaccel_<op>.sdc`` (an example
  clock constraint);

and ``config.json`` (the configuration, reloadable with :meth:`AccelConfig.load
<qaccel.model.config.AccelConfig.load>`) and ``qaccel_lint.vlt`` (Verilator's waivers for
``-Wall``, each rule with its reason: :data:`qaccel.rtl.verilog.LINT_WAIVERS`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from qaccel.model.config import AccelConfig

__all__ = ["OPS", "example_sdc", "instantiation_template", "lint_waivers", "write_verilog"]

#: Operator units :func:`write_verilog` can emit.
OPS = ("quantize", "dequantize", "matmul_nbits")


def lint_waivers() -> str:
    """The Verilator configuration file waiving :data:`~qaccel.rtl.verilog.LINT_WAIVERS`
    (pass it before the Verilog: ``verilator --lint-only -Wall qaccel_lint.vlt x.v``)."""
    from qaccel.rtl.verilog import LINT_WAIVERS

    lines = ["`verilator_config", "// qaccel: Verilator -Wall waivers for the emitted cores"]
    for rule, why in LINT_WAIVERS.items():
        lines += [f"// {rule}: {why}", f"lint_off -rule {rule}"]
    return "\n".join(lines) + "\n"


def instantiation_template(desc: dict) -> str:
    """A Verilog instantiation of the core ``desc`` describes (its JSON description): one
    wire per port, of the port's width, and the instance ``u_<module>`` connecting them, to
    paste into a design (``qaccel_<op>_inst.vh``)."""
    module, ports = desc["module"], desc["ports"]
    lines = [f"// {module}: an instantiation template (qaccel); ports as in {module}.json,",
             f"// registers in {module}_regs.md",
             "// aclk: one clock; aresetn: synchronous reset, active low"]
    for p in ports:
        width = f"[{p['width'] - 1}:0] " if p["width"] > 1 else ""
        lines.append(f"wire {width}{module}_{p['name']};   // {p['direction']}")
    lines.append(f"{module} u_{module} (")
    lines += [f"    .{p['name']}({module}_{p['name']}){',' if i + 1 < len(ports) else ''}"
              for i, p in enumerate(ports)]
    return "\n".join([*lines, ");"]) + "\n"


def example_sdc(desc: dict, freq_mhz: float = 100.0) -> str:
    """An example SDC constraint for the core ``desc`` describes: its clock at
    ``freq_mhz`` (``qaccel synth`` reports the Fmax a part reaches after place and route),
    the I/O delays left to the design it sits in."""
    return (f"# {desc['module']}: example timing constraint (qaccel); the core is synchronous to"
            f" aclk\ncreate_clock -name aclk -period {1e3 / freq_mhz:.3f} [get_ports aclk]\n")


def write_verilog(config: AccelConfig | None, out_dir: str | os.PathLike,
                  ops=OPS, *, progress: Callable[[str], None] | None = None) -> list[Path]:
    """Emit the units ``ops`` of ``config`` (default configuration if None) into ``out_dir``;
    ``progress`` (if given) is called with a line per stage of each unit.

    Returns the written paths. Raises ValueError for an unknown op.
    """
    from qaccel.rtl.axi.axi_core import AxiCore
    from qaccel.rtl.verilog import clean_verilog

    config = config or AccelConfig()
    if not isinstance(config, AccelConfig):
        raise TypeError(f"config must be an AccelConfig, not {config!r}")
    ops = tuple(ops)
    for op in ops:
        if op not in OPS:
            raise ValueError(f"ops must be among {', '.join(OPS)}, not {op!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for op in ops:
        name = f"qaccel_{op}"
        say = (lambda line, name=name: progress(f"{name}: {line}")) if progress else None
        if say:
            say("building the core")
        top = AxiCore(op, config)
        desc = top.describe()
        text = clean_verilog(top, name, comment=f"configuration {config.slug} "
                             f"(config.json beside this file)", progress=say)
        files = {".v": text, ".json": json.dumps(desc, indent=1) + "\n",
                 "_regs.h": top.regmap.c_header(), "_regs.md": top.regmap.markdown(),
                 "_inst.vh": instantiation_template(desc), ".sdc": example_sdc(desc)}
        for ext, content in files.items():
            (out / f"{name}{ext}").write_text(content)
            written.append(out / f"{name}{ext}")
    (out / "config.json").write_text(config.to_json() + "\n")
    (out / "qaccel_lint.vlt").write_text(lint_waivers())
    written += [out / "config.json", out / "qaccel_lint.vlt"]
    return written
