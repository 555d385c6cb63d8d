"""Suite-wide set-up.

Each pytest-xdist worker gets its own Numba cache directory: Numba updates a cache index with
an unlocked read-modify-write, so two workers compiling the same kernel on a cold cache could
leave an entry that points at the other's machine code.  Set before any test imports Numba.
"""

import os
from pathlib import Path

_worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
# Assigned, not defaulted: xdist workers inherit the controller's environment.
os.environ["NUMBA_CACHE_DIR"] = str(
    Path(__file__).resolve().parent.parent / ".cache" / f"numba-{_worker}")
