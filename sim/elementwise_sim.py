"""Run jobs (:mod:`qaccel.sim.jobs`) on a Quantize or Dequantize unit through cocotb.

:func:`run_elementwise` writes the jobs to a JSON file next to the build, runs the testbench
:mod:`qaccel.sim.tb_elementwise` on Verilator or Icarus and returns the
:class:`~qaccel.sim.runner.SimResult` (its ``records`` hold each test's measurements).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from qaccel.rtl.elementwise import Elementwise
from qaccel.sim.jobs import Job
from qaccel.sim.runner import SimResult, build_root, digest, run_cocotb

__all__ = ["run_elementwise", "table_fields"]


def table_fields(unit: Elementwise) -> list[tuple[str, int, int]]:
    """``(name, offset, width)`` of the table payload's fields, in Job.table order."""
    layout = unit.signature.members["table"].signature.members["payload"].shape
    return [(name, layout[name].offset, layout[name].width)
            for name in ("addr", "scale", "zero_point")]


def run_elementwise(unit: Elementwise, jobs: Sequence[Job], *, name: str,
                    simulator: str = "verilator", testcase: str | Sequence[str] | None = None,
                    **params: Any) -> SimResult:
    """Run ``jobs`` on ``unit`` (built as module ``name``); raise if any check fails.

    ``params`` override the testbench defaults (``idle``, ``backpressure``, ``max_burst``,
    ``watchdog``, ``seed``, ``reset_after``).
    """
    if not jobs:
        raise ValueError("jobs must hold at least one Job")
    text = json.dumps([j.to_dict() for j in jobs])
    path = build_root() / "jobs" / f"{digest(text)[:16]}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    config = {"jobs_file": str(path), "latency": unit.latency,
              "table_fields": table_fields(unit), "seed": 1, **params}
    return run_cocotb(unit, name=name, test_module="tb_elementwise", simulator=simulator,
                      config=config, testcase=testcase)
