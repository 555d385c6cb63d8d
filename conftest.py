"""Suite-wide set-up.

Each pytest-xdist worker gets its own Numba cache directory: Numba updates a cache index with
an unlocked read-modify-write, so two workers compiling the same kernel on a cold cache could
leave an entry that points at the other's machine code.  Set before any test imports Numba.

Notebooks (``notebooks/*.ipynb``, collected by nbmake) run in a kernel that inherits this
environment: matplotlib draws with its non-interactive Agg backend there, and a notebook can
ask for markers in its metadata (``"qaccel": {"markers": ["synth"]}``), which then select
and skip it like any marked test.
"""

import os
from pathlib import Path

_worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
# Assigned, not defaulted: xdist workers inherit the controller's environment.
os.environ["NUMBA_CACHE_DIR"] = str(
    Path(__file__).resolve().parent / ".cache" / f"numba-{_worker}")
os.environ["MPLBACKEND"] = "Agg"

#: Markers whose tests run only when selected with ``-m`` (e.g. ``pytest -m slow``): large
#: sweeps and the synthesis / formal tools, run and reported in the issue notes.
OPT_IN_MARKERS = ("slow", "synth", "fuzz", "regression")


def _notebook_markers(items) -> None:
    """Add the markers each nbmake notebook item names in its metadata."""
    import json

    import pytest

    for item in items:
        if getattr(item, "nbmake", False):
            meta = json.loads(Path(item.path).read_text()).get("metadata", {})
            for name in meta.get("qaccel", {}).get("markers", []):
                item.add_marker(getattr(pytest.mark, name))


def pytest_collection_modifyitems(config, items):
    import pytest

    _notebook_markers(items)
    selected = config.getoption("markexpr") or ""
    for marker in OPT_IN_MARKERS:
        if marker in selected:
            continue
        skip = pytest.mark.skip(reason=f"opt-in: run with -m {marker}")
        for item in items:
            if item.get_closest_marker(marker) is not None:
                item.add_marker(skip)
