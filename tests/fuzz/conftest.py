"""Hypothesis profiles of the property-based fuzzing (tests/fuzz).

- ``default``: a modest budget for the default suite (:data:`DEFAULT_EXAMPLES` examples per
  property, times the property's ``factor`` in :func:`tests.fuzz.strategies.run`: fewer for
  the simulator properties), derandomised so that every run tries the same examples, no
  example database.
- ``fuzz``: :data:`FUZZ_EXAMPLES` examples per property, random, failures kept in an example
  database under ``<repo>/.cache/hypothesis`` (git-ignored) and replayed first next time.

Each property runs twice, parametrised by :data:`BUDGETS`: unmarked with the loaded profile
(``default``, or whatever ``HYPOTHESIS_PROFILE`` names, e.g. ``HYPOTHESIS_PROFILE=fuzz``)
and marked ``fuzz`` (opt-in: ``pytest -m fuzz tests/fuzz``) with the ``fuzz`` profile.
Hypothesis's own files go under ``<repo>/.cache/hypothesis`` too, never into the tree.
"""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis.configuration import set_hypothesis_home_dir
from hypothesis.database import DirectoryBasedExampleDatabase

#: Hypothesis's directory (its example database, its caches): git-ignored.
HOME = Path(__file__).resolve().parents[2] / ".cache" / "hypothesis"
set_hypothesis_home_dir(HOME)

#: Examples per property of the two profiles (before :func:`budget`'s per-property factor).
DEFAULT_EXAMPLES = 50
FUZZ_EXAMPLES = 4000

_COMMON = dict(
    deadline=None,
    print_blob=True,
    # the simulator and ONNX Runtime properties are slow by nature; shapes and value lists
    # are drawn element by element
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much],
)
settings.register_profile("default", max_examples=DEFAULT_EXAMPLES, derandomize=True,
                          database=None, **_COMMON)
settings.register_profile("fuzz", max_examples=FUZZ_EXAMPLES, derandomize=False,
                          database=DirectoryBasedExampleDatabase(HOME / "examples"), **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def pytest_terminal_summary(terminalreporter):
    """Print the examples each property ran in this process (not under pytest-xdist's
    controller, which runs none itself)."""
    from .strategies import STATS

    if not STATS:
        return
    terminalreporter.section("hypothesis examples per property")
    for (name, budget), (examples, seconds) in sorted(STATS.items()):
        terminalreporter.write_line(f"{name:40s} {budget:8s} {examples:7d} examples "
                                    f"{seconds:8.1f} s")

