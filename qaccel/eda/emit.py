"""Write the accelerator's Verilog for FPGA synthesis: ``qaccel verilog --config cfg.json -o out/``.

For each operator unit (Quantize, Dequantize, the MatMulNBits engine) of a configuration,
:func:`write_verilog` writes ``qaccel_<op>.v`` (AXI4-Stream port names, see
:class:`qaccel.rtl.elementwise.axis_top.AxisTop` and
:class:`qaccel.rtl.nbits.matmul_nbits_axis.NBitsAxisTop`)
and ``qaccel_<op>.json`` (ports, register, table and stream fields, type indices, latency,
the configuration), and ``config.json`` (the configuration itself, reloadable with
:meth:`AccelConfig.load <qaccel.model.config.AccelConfig.load>`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from qaccel.model.config import AccelConfig

__all__ = ["OPS", "write_verilog"]

#: Operator units :func:`write_verilog` can emit.
OPS = ("quantize", "dequantize", "matmul_nbits")


def write_verilog(config: AccelConfig | None, out_dir: str | os.PathLike,
                  ops=OPS) -> list[Path]:
    """Emit the units ``ops`` of ``config`` (default configuration if None) into ``out_dir``.

    Returns the written paths. Raises ValueError for an unknown op.
    """
    from qaccel.rtl.elementwise.axis_top import AxisTop
    from qaccel.rtl.elementwise.dequantize import Dequantize
    from qaccel.rtl.elementwise.quantize import Quantize
    from qaccel.rtl.nbits.matmul_nbits_axis import NBitsAxisTop
    from qaccel.rtl.verilog import emit_verilog

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
        (out / f"{name}.v").write_text(emit_verilog(top, name))
        (out / f"{name}.json").write_text(json.dumps(desc, indent=1) + "\n")
        written += [out / f"{name}.v", out / f"{name}.json"]
    (out / "config.json").write_text(config.to_json() + "\n")
    written.append(out / "config.json")
    return written
