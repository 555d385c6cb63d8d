"""Write the accelerator's Verilog for FPGA synthesis: ``qaccel verilog --config cfg.json -o out/``.

For each operator unit (Quantize, Dequantize, the MatMulNBits engine) of a configuration,
:func:`write_verilog` writes ``qaccel_<op>.v`` (:func:`qaccel.rtl.verilog.clean_verilog`:
deterministic, legal module names, each distinct unit once; AXI4-Stream port names, see
:class:`qaccel.rtl.elementwise.axis_top.AxisTop` and
:class:`qaccel.rtl.nbits.matmul_nbits_axis.NBitsAxisTop`)
and ``qaccel_<op>.json`` (ports, register, table and stream fields, type indices, latency,
the configuration), ``config.json`` (the configuration itself, reloadable with
:meth:`AccelConfig.load <qaccel.model.config.AccelConfig.load>`) and ``qaccel_lint.vlt``
(Verilator's waivers for ``-Wall``, each rule with its reason:
:data:`qaccel.rtl.verilog.LINT_WAIVERS`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from qaccel.model.config import AccelConfig

__all__ = ["OPS", "lint_waivers", "write_verilog"]

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


def write_verilog(config: AccelConfig | None, out_dir: str | os.PathLike,
                  ops=OPS, *, progress: Callable[[str], None] | None = None) -> list[Path]:
    """Emit the units ``ops`` of ``config`` (default configuration if None) into ``out_dir``;
    ``progress`` (if given) is called with a line per stage of each unit.

    Returns the written paths. Raises ValueError for an unknown op.
    """
    from qaccel.rtl.elementwise.axis_top import AxisTop
    from qaccel.rtl.elementwise.dequantize import Dequantize
    from qaccel.rtl.elementwise.quantize import Quantize
    from qaccel.rtl.nbits.matmul_nbits_axis import NBitsAxisTop
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
        if op == "matmul_nbits":
            top = NBitsAxisTop(config)
        else:
            top = AxisTop((Quantize if op == "quantize" else Dequantize)(config), op=op)
        name = f"qaccel_{op}"
        desc = top.describe()
        say = (lambda line, name=name: progress(f"{name}: {line}")) if progress else None
        text = clean_verilog(top, name, comment=f"configuration {config.slug} "
                             f"(config.json beside this file)", progress=say)
        (out / f"{name}.v").write_text(text)
        (out / f"{name}.json").write_text(json.dumps(desc, indent=1) + "\n")
        written += [out / f"{name}.v", out / f"{name}.json"]
    (out / "config.json").write_text(config.to_json() + "\n")
    (out / "qaccel_lint.vlt").write_text(lint_waivers())
    written += [out / "config.json", out / "qaccel_lint.vlt"]
    return written
