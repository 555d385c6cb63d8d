"""Verilog emission for qaccel components."""

from __future__ import annotations

import os
from pathlib import Path

from amaranth.back import verilog
from amaranth.lib import wiring

__all__ = ["emit_verilog"]


def emit_verilog(
    component: wiring.Component,
    name: str,
    path: str | os.PathLike | None = None,
    *,
    emit_src: bool = True,
) -> str:
    """Convert ``component`` to a Verilog module called ``name`` and return its text.

    Ports follow the component's signature, flattened with ``__`` (``i__payload``, ``i__valid``,
    ``i__ready``, ...), plus ``clk`` and ``rst`` when the design has a ``sync`` domain.
    If ``path`` is given the text is also written there, but only when it differs from the
    file's current content, so that mtime-based build tools do not rebuild needlessly.
    ``emit_src=False`` leaves out the ``src`` attributes (Python file and line), which makes
    the text depend on the logic only.
    """
    if not isinstance(component, wiring.Component):
        raise TypeError(f"component must be an amaranth wiring.Component, not {component!r}")
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"name must be a Verilog identifier, not {name!r}")
    text = verilog.convert(component, name=name, emit_src=emit_src)
    if path is not None:
        path = Path(path)
        if not path.is_file() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(text)
            os.replace(tmp, path)
    return text
