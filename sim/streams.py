"""cocotb agents for Amaranth ``stream`` interfaces: driver, sink, monitor, watchdog.

Timing discipline (race-free on Verilator and Icarus): a :class:`CycleLoop` wakes once per clock
cycle at the falling edge, lets every agent *drive* its inputs, waits for ``ReadOnly`` and lets
every agent *sample*. The values seen while sampling are those present at the next rising
edge, so ``valid & ready`` in the sample phase is exactly the handshake of that edge. Cycle
``n`` is the ``n``-th rising edge after the loop started. Agents are plain objects with
``drive(cycle)`` and/or ``sample(cycle)`` methods; exceptions they raise (checker mismatch,
:class:`StallError`) propagate out of :meth:`CycleLoop.run` into the test.
"""

from __future__ import annotations

import itertools
import random
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from cocotb.triggers import FallingEdge, ReadOnly

__all__ = [
    "CreditError",
    "CycleLoop",
    "OccupancyMonitor",
    "StallError",
    "StreamDriver",
    "StreamMonitor",
    "StreamPort",
    "StreamSink",
    "Watchdog",
    "burst_pauses",
    "cycle_pauses",
    "no_pauses",
    "random_pauses",
]


# ---------------------------------------------------------------------------------------------
# Pause generators: infinite iterators of bool, True meaning "pause this cycle".


def no_pauses() -> Iterator[bool]:
    """Never pause."""
    return itertools.repeat(False)


def cycle_pauses(pattern: Iterable[int | bool] = (1, 1, 1, 0)) -> Iterator[bool]:
    """Pause by a repeating ``pattern`` (Forencich's ``cycle_pause``)."""
    return (bool(p) for p in itertools.cycle(tuple(pattern)))


def burst_pauses(stall: int, *, rng: random.Random, run: tuple[int, int] = (1, 8),
                 probability: float = 0.5) -> Iterator[bool]:
    """Long stalls: ``stall`` paused cycles in a row, then a run of ``run[0]..run[1]`` cycles
    (random) in which each cycle pauses with ``probability`` (short random pauses), repeating.

    For ``ready``, a ``stall`` longer than an output FIFO's depth plus the unit's latency
    fills the FIFO whenever the input keeps up; for ``valid``, it empties the unit (input
    starvation)."""
    if not isinstance(stall, int) or stall < 1:
        raise ValueError(f"stall must be an int >= 1, not {stall!r}")
    lo, hi = run
    if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
        raise ValueError(f"run must be (lo, hi) with 1 <= lo <= hi, not {run!r}")
    if not 0.0 <= probability < 1.0:
        raise ValueError(f"probability must be in [0, 1), not {probability!r}")
    while True:
        yield from itertools.repeat(True, stall)
        for _ in range(rng.randint(lo, hi)):
            yield rng.random() < probability


def random_pauses(probability: float, *, rng: random.Random, max_burst: int = 1) -> Iterator[bool]:
    """Start a pause with ``probability`` per cycle, lasting 1..``max_burst`` cycles."""
    if not 0.0 <= probability < 1.0:
        raise ValueError(f"probability must be in [0, 1), not {probability!r}")
    if max_burst < 1:
        raise ValueError(f"max_burst must be >= 1, not {max_burst!r}")
    if probability == 0.0:
        yield from no_pauses()
    while True:
        if rng.random() < probability:
            for _ in range(rng.randint(1, max_burst)):
                yield True
        else:
            yield False


# ---------------------------------------------------------------------------------------------
# DUT access


def _bit(handle, name: str) -> bool:
    s = str(handle.value)
    if s == "1":
        return True
    if s == "0":
        return False
    raise AssertionError(f"{name} is {s!r}, not 0 or 1")


class StreamPort:
    """Handles of one ``amaranth.lib.stream`` interface in the emitted Verilog.

    Amaranth flattens interface ``name`` to ports ``<name>__payload``, ``<name>__valid`` and
    ``<name>__ready``. ``signed`` selects how the payload is read back.
    """

    def __init__(self, dut, name: str, *, signed: bool = False):
        self.name = name
        self.signed = signed
        self.payload = getattr(dut, f"{name}__payload")
        self.valid = getattr(dut, f"{name}__valid")
        self.ready = getattr(dut, f"{name}__ready")
        self.width = len(self.payload)
        self._mask = (1 << self.width) - 1

    def read_payload(self) -> int:
        """Return the payload as an int (two's complement decoded if ``signed``).

        Raises :exc:`AssertionError` naming the stream if a payload bit is X or Z (a
        four-state simulator such as Icarus shows undriven or uninitialised bits)."""
        v = self.payload.value
        if not v.is_resolvable:
            raise AssertionError(f"{self.name}__payload has X/Z bits: {v}")
        return v.to_signed() if self.signed else v.to_unsigned()

    def write_payload(self, value: int) -> None:
        """Drive the payload (inputs only); negative values are written in two's complement."""
        self.payload.value = value & self._mask

    def is_valid(self) -> bool:
        """Return ``valid``; :exc:`AssertionError` if it is X or Z."""
        return _bit(self.valid, f"{self.name}__valid")

    def is_ready(self) -> bool:
        """Return ``ready``; :exc:`AssertionError` if it is X or Z."""
        return _bit(self.ready, f"{self.name}__ready")

    def __repr__(self) -> str:
        return f"StreamPort({self.name!r}, width={self.width}, signed={self.signed})"


# ---------------------------------------------------------------------------------------------
# The per-cycle scheduler


class CycleLoop:
    """Run agents once per cycle: ``drive`` after the falling edge, ``sample`` in ReadOnly."""

    def __init__(self, clk, *agents: Any):
        self.clk = clk
        self.cycle = 0
        self._drivers: list[Callable[[int], None]] = []
        self._samplers: list[Callable[[int], None]] = []
        self.add(*agents)

    def add(self, *agents: Any) -> None:
        """Register agents (objects with ``drive`` and/or ``sample`` methods)."""
        for agent in agents:
            if hasattr(agent, "drive"):
                self._drivers.append(agent.drive)
            if hasattr(agent, "sample"):
                self._samplers.append(agent.sample)

    async def run(
        self,
        *,
        until: Callable[[], bool] | None = None,
        cycles: int | None = None,
        max_cycles: int | None = None,
    ) -> int:
        """Run until ``until()`` is true after a sample phase, or for ``cycles`` cycles.

        ``max_cycles`` bounds a run with ``until``; exceeding it raises :exc:`StallError`.
        Returns the number of cycles run.
        """
        if (until is None) == (cycles is None):
            raise ValueError("give exactly one of until= and cycles=")
        falling, read_only = FallingEdge(self.clk), ReadOnly()
        drivers, samplers = self._drivers, self._samplers
        start = self.cycle
        while True:
            if cycles is not None and self.cycle - start >= cycles:
                break
            await falling
            for drive in drivers:
                drive(self.cycle)
            await read_only
            for sample in samplers:
                sample(self.cycle)
            self.cycle += 1
            if until is not None and until():
                break
            if max_cycles is not None and self.cycle - start >= max_cycles:
                raise StallError(f"run did not finish within {max_cycles} cycles")
        return self.cycle - start


# ---------------------------------------------------------------------------------------------
# Agents


class StreamDriver:
    """Offer queued values on an input stream, inserting idle cycles from ``pauses``.

    Follows the stream rules: once ``valid`` is raised it stays raised, with the same payload,
    until the beat is accepted; pauses only apply between beats.
    """

    def __init__(self, port: StreamPort, *, pauses: Iterator[bool] | None = None):
        self.port = port
        self.pauses = pauses if pauses is not None else no_pauses()
        self.queue: deque[int] = deque()
        self.sent = 0
        self._offering = False
        self._accepted = False
        self._valid_out: bool | None = None
        self._payload_out: int | None = None

    def send(self, values: Iterable[int]) -> None:
        """Queue ``values`` for transmission."""
        self.queue.extend(values)

    @property
    def pending(self) -> int:
        """Beats queued and not yet accepted."""
        return len(self.queue)

    @property
    def offering(self) -> bool:
        """A beat is offered (``valid`` driven high) in this cycle."""
        return self._offering

    def reset(self) -> None:
        """Drop queued beats and drive ``valid`` low."""
        self.queue.clear()
        self._offering = self._accepted = False
        self._valid_out = None
        self._set(False, None)

    def _set(self, valid: bool, payload: int | None) -> None:
        if valid != self._valid_out:
            self.port.valid.value = int(valid)
            self._valid_out = valid
        if payload is not None and payload != self._payload_out:
            self.port.write_payload(payload)
            self._payload_out = payload

    def drive(self, cycle: int) -> None:
        if self._offering and self._accepted:
            self.queue.popleft()
            self.sent += 1
            self._offering = False
        if not self._offering and self.queue and not next(self.pauses):
            self._offering = True
        self._set(self._offering, self.queue[0] if self._offering else None)

    def sample(self, cycle: int) -> None:
        self._accepted = self._offering and self.port.is_ready()


class StreamSink:
    """Drive ``ready`` of an output stream, withholding it on cycles given by ``pauses``, and
    for the next ``n`` cycles after :meth:`stall` ``(n)`` (a stall placed by the testbench, e.g.
    at a job boundary; ``pauses`` is not consumed meanwhile)."""

    def __init__(self, port: StreamPort, *, pauses: Iterator[bool] | None = None):
        self.port = port
        self.pauses = pauses if pauses is not None else no_pauses()
        self.held = 0
        self._ready_out: bool | None = None

    def stall(self, cycles: int) -> None:
        """Hold ``ready`` low for the next ``cycles`` cycles."""
        if not isinstance(cycles, int) or cycles < 0:
            raise ValueError(f"cycles must be an int >= 0, not {cycles!r}")
        self.held = cycles

    def drive(self, cycle: int) -> None:
        if self.held:
            self.held -= 1
            ready = False
        else:
            ready = not next(self.pauses)
        if ready != self._ready_out:
            self.port.ready.value = int(ready)
            self._ready_out = ready


class StreamMonitor:
    """Observe handshakes on a stream and pass each beat to callbacks ``f(payload, cycle)``.

    Passive: it drives nothing. Keeps the beat count, the cycles of the first and last beat
    and the last sampled ``valid``/``ready`` (for stall diagnostics).
    """

    def __init__(self, port: StreamPort, *callbacks: Callable[[int, int], None]):
        self.port = port
        self.name = port.name
        self.callbacks = list(callbacks)
        self.count = 0
        self.first_cycle: int | None = None
        self.last_cycle: int | None = None
        self.valid = False
        self.ready = False

    def add_callback(self, callback: Callable[[int, int], None]) -> None:
        self.callbacks.append(callback)

    def sample(self, cycle: int) -> None:
        self.valid = valid = self.port.is_valid()
        self.ready = ready = self.port.is_ready()
        if valid and ready:
            payload = self.port.read_payload()
            self.count += 1
            if self.first_cycle is None:
                self.first_cycle = cycle
            self.last_cycle = cycle
            for callback in self.callbacks:
                callback(payload, cycle)

    def beats_per_cycle(self) -> float:
        """Beats over the span from the first to the last beat, inclusive (0 if < 1 beat)."""
        if self.first_cycle is None or self.last_cycle is None:
            return 0.0
        return self.count / (self.last_cycle - self.first_cycle + 1)


class CreditError(AssertionError):
    """A unit held more beats than its credit allows, or a FIFO more than its depth."""


class OccupancyMonitor:
    """Assert a unit's credit and its FIFOs' occupancy limits every cycle, and record the highs.

    ``inside()`` (optional) returns the beats the unit holds: taken on its input and not yet
    delivered on its output (e.g. ``lambda: x_mon.count - y_mon.count`` with monitors sampled
    before this agent); it must stay within ``limit`` (the credit). ``fifos`` maps a name to
    ``(handle, depth)``: a FIFO instance reached through the design's hierarchy
    (``dut.fifo``, ``dut.cluster0.y_fifo``) with Amaranth's FIFO ports ``w_en``, ``r_en`` and
    ``r_rdy``, and the entries it holds. Its occupancy is counted here, writes asked for
    (``w_en``) minus reads (``r_en & r_rdy``), so a write into a full FIFO (a beat the FIFO
    drops: the credit let one too many through) takes the count past ``depth``, whatever the
    FIFO's own ``w_rdy`` says. The first cycle a count leaves ``0..limit`` raises
    :exc:`CreditError` naming it, the cycle and the value. While ``reset()`` is true the FIFO
    counts restart from 0 and nothing is checked.

    :meth:`check_reached` fails unless every count reached its limit (a stall pattern that
    never fills a FIFO does not test its credit); :attr:`high` holds each maximum,
    :attr:`full_cycles` the cycles spent at each limit.
    """

    def __init__(self, *, inside: Callable[[], int] | None = None, limit: int | None = None,
                 name: str = "beats inside", fifos: dict[str, tuple[Any, int]] | None = None,
                 reset: Callable[[], bool] = lambda: False):
        if (inside is None) != (limit is None):
            raise ValueError("give inside= and limit= together, or neither")
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise ValueError(f"limit must be an int >= 1, not {limit!r}")
        fifos = dict(fifos or {})
        for key, (_, depth) in fifos.items():
            if not isinstance(depth, int) or depth < 1:
                raise ValueError(f"the depth of FIFO {key!r} must be an int >= 1, not "
                                 f"{depth!r}")
        if inside is None and not fifos:
            raise ValueError("nothing to monitor: give inside= and limit=, or fifos=")
        self.name = name
        self.inside = inside
        self.limits = {**({name: limit} if inside is not None else {}),
                       **{k: d for k, (_, d) in fifos.items()}}
        self.fifos = {k: (h.w_en, h.r_en, h.r_rdy) for k, (h, _) in fifos.items()}
        self.reset = reset
        self.count = dict.fromkeys(self.fifos, 0)
        self.high = dict.fromkeys(self.limits, 0)
        self.full_cycles = dict.fromkeys(self.limits, 0)

    @staticmethod
    def _bit(handle, key: str, cycle: int) -> int:
        v = handle.value
        if not v.is_resolvable:
            raise CreditError(f"{key}: a FIFO port is {v} at cycle {cycle}, not 0 or 1")
        return int(v)

    def sample(self, cycle: int) -> None:
        if self.reset():
            self.count = dict.fromkeys(self.fifos, 0)
            return
        values = {}
        if self.inside is not None:
            values[self.name] = self.inside()
        for key, (w_en, r_en, r_rdy) in self.fifos.items():
            # the count after this edge: its writes and reads
            self.count[key] += (self._bit(w_en, key, cycle)
                                - (self._bit(r_en, key, cycle) & self._bit(r_rdy, key, cycle)))
            values[key] = self.count[key]
        for key, value in values.items():
            limit = self.limits[key]
            if value > limit or value < 0:
                raise CreditError(
                    f"{key}: {value} at cycle {cycle}, outside 0..{limit} (credit or FIFO "
                    f"overrun: a beat taken without room for it, or one lost)")
            if value > self.high[key]:
                self.high[key] = value
            self.full_cycles[key] += value == limit

    def reached(self) -> dict[str, bool]:
        """Whether each count reached its limit (the FIFO was filled)."""
        return {k: self.high[k] == self.limits[k] for k in self.limits}

    def check_reached(self, names=None) -> None:
        """Raise :exc:`AssertionError` naming the counts (all, or those in ``names``) that
        never reached their limits."""
        short = [f"{k} reached {self.high[k]} of {self.limits[k]}"
                 for k, ok in self.reached().items() if not ok and (names is None or k in names)]
        if short:
            raise AssertionError("the stall pattern did not fill: " + "; ".join(short))

    def summary(self) -> dict[str, dict[str, int]]:
        """Per count: its limit, its high and the cycles at the limit."""
        return {k: {"limit": self.limits[k], "high": self.high[k],
                    "full_cycles": self.full_cycles[k]} for k in self.limits}


class StallError(AssertionError):
    """A stream made no progress for too long; the message names it and its valid/ready."""


class Watchdog:
    """Fail when a stream with outstanding beats sees no handshake for ``timeout`` cycles.

    ``watch`` pairs a :class:`StreamMonitor` with a function returning how many beats are still
    expected on that stream. The error names every stalled stream with its ``valid``/``ready``
    state, so a hang reads as e.g. ``stream 'o' stalled ... valid=1 ready=0``.
    """

    def __init__(self, timeout: int, *watch: tuple[StreamMonitor, Callable[[], int]]):
        if timeout < 1:
            raise ValueError(f"timeout must be >= 1, not {timeout!r}")
        self.timeout = timeout
        self.watch = list(watch)
        self._progress = [0] * len(self.watch)
        self._counts = [-1] * len(self.watch)

    def sample(self, cycle: int) -> None:
        stalled = []
        for k, (mon, pending) in enumerate(self.watch):
            if mon.count != self._counts[k] or pending() == 0:
                self._counts[k] = mon.count
                self._progress[k] = cycle
            elif cycle - self._progress[k] >= self.timeout:
                stalled.append(
                    f"stream {mon.name!r} stalled for {cycle - self._progress[k]} cycles "
                    f"(valid={int(mon.valid)} ready={int(mon.ready)}, {pending()} beats "
                    f"outstanding, {mon.count} transferred)"
                )
        if stalled:
            raise StallError(f"at cycle {cycle}: " + "; ".join(stalled))
