"""Scoreboard pieces: a transaction-level model feeding an in-order checker.

Wire them to :class:`qaccel.sim.streams.StreamMonitor` callbacks (cocotb's matrix_multiplier
example)::

    board = Scoreboard(reference, name="o")
    StreamMonitor(i_port, board.add_input)
    StreamMonitor(o_port, board.add_output)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["InOrderChecker", "Scoreboard"]


class InOrderChecker:
    """Compare actual beats with expected beats, strictly in order, failing on the first error.

    Each expected beat may carry the cycle it was caused at (to measure latency) and a ``tag``
    (e.g. the input value) quoted in error messages. Raises :exc:`AssertionError` on a
    mismatch, or on a beat arriving when none is expected (a duplicated or spurious beat).
    """

    def __init__(self, name: str = "output"):
        self.name = name
        self.expected: deque[tuple[Any, int | None, Any]] = deque()
        self.matched = 0
        self.min_latency: int | None = None
        self.max_latency: int | None = None

    @property
    def pending(self) -> int:
        """Expected beats not yet seen."""
        return len(self.expected)

    def add_expected(self, value: Any, cycle: int | None = None, tag: Any = None) -> None:
        self.expected.append((value, cycle, tag))

    def add_actual(self, value: Any, cycle: int | None = None) -> None:
        if not self.expected:
            raise AssertionError(
                f"{self.name}: unexpected beat {value!r} at cycle {cycle} after all "
                f"{self.matched} expected beats were seen (duplicated or spurious beat)"
            )
        want, cause, tag = self.expected.popleft()
        if value != want:
            because = f" for input {tag!r}" if tag is not None else ""
            raise AssertionError(
                f"{self.name}: beat {self.matched} at cycle {cycle} is {value!r}, "
                f"expected {want!r}{because}"
            )
        self.matched += 1
        if cause is not None and cycle is not None:
            latency = cycle - cause
            if self.min_latency is None or latency < self.min_latency:
                self.min_latency = latency
            if self.max_latency is None or latency > self.max_latency:
                self.max_latency = latency

    def check_done(self) -> None:
        """Raise :exc:`AssertionError` if expected beats are still missing."""
        if self.expected:
            value, cycle, tag = self.expected[0]
            raise AssertionError(
                f"{self.name}: {len(self.expected)} expected beats never arrived "
                f"(first: {value!r} for input {tag!r} accepted at cycle {cycle}); "
                f"{self.matched} matched"
            )


class Scoreboard:
    """Feed input beats through a reference ``model`` into an :class:`InOrderChecker`.

    ``model`` maps one input beat to one expected output beat. :meth:`add_input` and
    :meth:`add_output` have the ``(payload, cycle)`` signature of monitor callbacks.
    """

    def __init__(self, model: Callable[[Any], Any], *, name: str = "output"):
        self.model = model
        self.checker = InOrderChecker(name)
        self.inputs = 0

    def add_input(self, value: Any, cycle: int | None = None) -> None:
        self.inputs += 1
        self.checker.add_expected(self.model(value), cycle, tag=value)

    def add_output(self, value: Any, cycle: int | None = None) -> None:
        self.checker.add_actual(value, cycle)

    @property
    def pending(self) -> int:
        return self.checker.pending

    @property
    def matched(self) -> int:
        return self.checker.matched

    def check_done(self) -> None:
        """Raise unless every input produced exactly one matching output."""
        self.checker.check_done()
        if self.checker.matched != self.inputs:
            raise AssertionError(
                f"{self.checker.name}: {self.inputs} input beats but "
                f"{self.checker.matched} output beats"
            )
