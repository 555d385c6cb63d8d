"""The channel between the runner and a cocotb testbench: one JSON variable in, one file out.

The runner puts ``{"params": {...}, "records": "<path>"}`` into the environment variable
:data:`ENV_VAR`; inside the simulator the testbench reads its parameters with :func:`params`
and writes its measurements with :func:`record`, which the runner returns as
``SimResult.records``. This module does not import cocotb, so both sides can use it.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["ENV_VAR", "encode", "load_records", "params", "record", "write_atomic"]

#: Name of the environment variable holding the testbench configuration.
ENV_VAR = "QACCEL_TB_CONFIG"


def encode(params: Mapping[str, Any], records: str | os.PathLike) -> str:
    """Return the JSON text for :data:`ENV_VAR` (``params`` must be JSON-serialisable)."""
    try:
        return json.dumps({"params": dict(params), "records": os.fspath(records)}, sort_keys=True)
    except TypeError as e:
        raise TypeError(f"config must be JSON-serialisable: {e}") from None


def _load() -> dict:
    text = os.environ.get(ENV_VAR)
    if text is None:
        raise RuntimeError(f"{ENV_VAR} is not set: run this testbench through qaccel.sim.runner")
    return json.loads(text)


def params() -> dict[str, Any]:
    """Return the testbench parameters given to the runner as ``config``."""
    return dict(_load()["params"])


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename, so that a reader
    (another process, a pytest-xdist worker) sees the old file or the new one, never a part
    of it; the parent folder is created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def record(test: str, **values: Any) -> None:
    """Store JSON-serialisable ``values`` under ``test`` in the records file of this run."""
    path = Path(_load()["records"])
    data = load_records(path)
    data.setdefault(test, {}).update(values)
    write_atomic(path, json.dumps(data, indent=1, sort_keys=True))


def load_records(path: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """Return the records written by :func:`record` (empty if there are none)."""
    path = Path(path)
    if not path.is_file():
        return {}
    return json.loads(path.read_text())
