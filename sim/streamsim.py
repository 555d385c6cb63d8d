"""Run ``amaranth.lib.stream`` handshakes through a component's Verilog with Verilator, no cocotb.

The cocotb testbenches act in Python every cycle (a few thousand beats per second);
:class:`StreamSim` generates a Verilator C++ loop that drives and checks the streams itself, so
a run costs what the Verilated model costs, for long runs and for the RTL engine::

    sim = StreamSim(PlusN(), name="plus_n")
    r = sim.run({"i": np.arange(1000)}, until_idle=None, expect={"o": 1000},
                idle=0.3, backpressure=0.3)
    r.outputs["o"], r.output_cycles["o"], r.accepted["i"], r.cycles

:class:`StreamSim` is a :class:`~qaccel.sim.vectors.VectorSim` (same build cache, ccache, file
lock and port conventions; build directory ``<build root>/<name>-stream-<hash>/``) whose loop
knows the stream ports ``<name>__payload``, ``<name>__valid`` and ``<name>__ready`` (payloads up
to :data:`~qaccel.sim.vectors.MAX_WIDTH` bits, wide ones as ``(n, words)`` ``uint64`` arrays
least significant word first, or as lists of Python ints).

Cycle contract:

* ``rst`` is held high for ``reset_cycles`` cycles with every input at 0. Cycle 0 is the first
  rising clock edge after that; "a transfer in cycle ``t``" means ``valid & ready`` just before
  edge ``t``.
* A run is a list of :class:`Segment` s, back to back in one process (:meth:`StreamSim.
  run_segments`; :meth:`StreamSim.run` runs one). In a segment's first cycle its ``static``
  ports take their values (ports not named: 0) and hold them to the segment's end.
* Input streams are fed in *phases*: phase ``k + 1`` begins in the cycle after the last beat
  of phase ``k`` was accepted. A phase lists input streams, fed concurrently, and 1-bit plain
  input ports, raised for exactly the phase's first cycle (a *pulse*, e.g. ``start``). Without
  ``phases`` every given stream is in one phase (all concurrently). ``pulses`` raise 1-bit
  ports for exactly one cycle at a cycle counted from the segment's first cycle.
* A driver follows the stream rules: ``valid`` stays high with a stable payload until the beat
  is accepted; before offering each beat it stays idle while a draw with probability ``idle``
  succeeds (a geometric number of idle cycles, at least one with probability ``idle``). Every
  output stream's ``ready`` is withheld with probability ``backpressure`` per cycle. The draws
  come from a xorshift64* generator seeded by ``seed``, so a run is reproducible.
  ``stall_burst=(p, min_len, max_len)`` also starts, with probability ``p`` per cycle, a burst
  of ``min_len`` to ``max_len`` cycles with an output stream's ``ready`` low, and
  ``starve_burst`` one with an input stream's ``valid`` low before its next beat: bursts
  longer than an output FIFO plus the pipeline fill it (``StreamResult.blocked`` /
  ``CheckedRun.blocked`` give the longest stretch an input beat then waited on ``ready``).
* The segment is *done* in the first cycle in which every phase and pulse was completed in an
  earlier cycle, each output stream in ``expect`` has received that many beats, and the 1-bit
  output ``until_idle`` (if not None) is low. ``drain`` more cycles follow (outputs are still
  received, so a spurious late beat shows up in the result); the next segment begins after.
* Checks, which end the run with :exc:`StreamProtocolError`: once an output stream's ``valid``
  is high without ``ready``, ``valid`` must stay high and the payload stable until the
  transfer. A watchdog ends it with :exc:`StreamStallError` when an input stream with beats
  left, an output stream with ``valid`` high or with beats still expected, or the ``until_idle``
  flag after the last input beat, sees no handshake for ``watchdog`` cycles, and at
  ``max_cycles``; the message names each stalled stream with its ``valid``/``ready`` state.

Checking in the loop: a segment's ``check`` gives an output stream's expected beats (the last
compared through ``check_mask``); each received beat is compared as it arrives and a
difference, or a beat past the expected ones, is a :class:`Mismatch` (segment, stream, beat
index, cycle, expected and received payloads). :meth:`StreamSim.run_segments` returns them
with every beat; :meth:`StreamSim.run_checked` records nothing else (no output beats, no
cycles come back: a run costs the simulation) and stops at the ``max_mismatches``-th
difference. Long runs go in chunks of segments (one loop process
each), so inputs and expected beats are in memory one chunk at a time
(:func:`qaccel.sim.elementwise_sim.run_regression`).

The loop is generated from the C++ template ``sim/cpp/stream_loop.cpp`` (its notes list the
placeholders :func:`_stream_main` fills). :func:`qaccel.sim.elementwise_sim.
run_elementwise_fast` runs :class:`~qaccel.sim.jobs.Job` s on a Quantize or Dequantize unit
this way (one segment per job, all jobs in one process) and :func:`qaccel.sim.elementwise_sim.
check_jobs` compares what the RTL produced with the jobs' expected beats.

Files exchanged with the loop (all 64-bit little-endian words): the configuration holds a
header (``_HEADER`` fields), one record per segment (phase count, static words, per input
stream beat count / phase / word offset, per output stream the expected count, the offset of
its expected beats (-1: unchecked) and the last beat's mask words, pulses as (port, cycle or
``-1 - phase``) pairs) and the beat data; the result holds the segments run, the cycles, the
mismatch count and the number listed, per segment its start, done and end cycles, transfer
counts and per input stream its longest wait on ``ready``, the mismatches (segment, stream,
beat, cycle, past-the-end flag, expected and received payload words), then when recording
per output stream the payload words and cycles, then per input stream the accept cycles.

Speed (2-core machine, measured in CPU seconds of the loop because 3 other agents shared it):
the loop itself takes under 5% of the time; the rest is the model's ``eval``. A small block (two
16/100-bit "+ n" channels with FIFOs) runs 4-7M cycles per CPU second, at one beat per cycle
with 300k beats 1.3M beats per wall second on the loaded machine. The Quantize unit with
``lanes=2`` and float32 to int8/uint4 runs 0.5-0.7M cycles (1-1.4M elements) per CPU second,
0.15M beats per wall second loaded. Python adds about 40 ms per 100k beats (encoding, results
as ints); the build as :class:`VectorSim`'s (the Quantize unit: 12 s of Verilog emission
loaded, about 40 s cold Verilator build). The default Quantize unit (1 lane) under idle 0.2 /
back-pressure 0.2 (1.28 cycles per ``y`` beat), checked in the loop (:meth:`StreamSim.
run_checked`): 0.9M cycles, 0.7M checked beats per CPU second (perf: 84% in the model's
clocked logic, 5% in the loop); with job generation (0.05 CPU s per 1M beats) and encoding
(0.1), 2 shards checked 1.27M beats per wall second on 2 quiet cores (10^8 beats in 80 s).
C++ ``-O2`` instead of ``-O1`` (:data:`~qaccel.sim.vectors.MAKE_ARGS`) takes 12% off the
loop; ``-march=native`` and ``-O3`` add nothing.
"""

from __future__ import annotations

import operator
import os
import shutil
import string
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from amaranth.lib import wiring

from qaccel.model.validate import check_int
from qaccel.sim import runner
from qaccel.sim.runner import SimulationError
from qaccel.sim.vectors import (
    CLOCK,
    EXE,
    MAX_WIDTH,
    RESET,
    RESET_CYCLES,
    Port,
    RunStats,
    VectorSim,
    as_column,
    cpp_template,
    loop_ports,
)

__all__ = [
    "DRAIN",
    "MAX_MISMATCHES",
    "CheckedRun",
    "Mismatch",
    "WATCHDOG",
    "Segment",
    "StreamProtocolError",
    "StreamResult",
    "StreamSim",
    "StreamStallError",
]

#: Cycles run after a segment is done (see the module notes).
DRAIN = 8
#: Cycles without a handshake on a stream that is owed one before the run fails.
WATCHDOG = 10_000
#: Default ``max_cycles``: this many plus :data:`_CYCLES_PER_BEAT` per input beat.
_BASE_CYCLES = 10_000_000
_CYCLES_PER_BEAT = 1_000
#: Bump when :func:`_stream_main` changes the generated loop, so stale builds are not reused
#: (the template text is part of the build key already).
_LOOP_VERSION = 2
_MAGIC = 0x5354524D
_EXIT_STALL, _EXIT_PROTOCOL = 3, 4
_SOURCE = "streams_main.cpp"
#: Configuration header, after the magic word and the port counts.
_HEADER = ("segments", "seed", "idle", "backpressure", "watchdog", "max_cycles",
           "reset_cycles", "drain", "idle_flag", "stall_p", "stall_min", "stall_max",
           "starve_p", "starve_min", "starve_max", "record", "max_mismatches", "data_start")
#: Default ``max_mismatches`` of :meth:`StreamSim.run_checked`.
MAX_MISMATCHES = 10


class StreamStallError(SimulationError):
    """A stream owed a handshake saw none for ``watchdog`` cycles, or ``max_cycles`` passed; the
    message names the stalled streams and their ``valid``/``ready`` state."""


class StreamProtocolError(SimulationError):
    """An output stream broke the stream rules (``valid`` fell, or the payload changed, before
    the transfer); the message names the stream, the cycle and the values."""


@dataclass(frozen=True)
class _Stream:
    """The ports of one stream interface; ``direction`` is that of the stream (``valid``)."""

    name: str
    direction: str
    valid: Port
    ready: Port
    payload: Port | None

    @property
    def width(self) -> int:
        return 0 if self.payload is None else self.payload.width

    @property
    def words(self) -> int:
        return 0 if self.payload is None else self.payload.words


def _classify(ports: Mapping[str, Port]) -> tuple[list[_Stream], list[_Stream], list[Port],
                                                 list[Port]]:
    """Return (input streams, output streams, static inputs, 1-bit plain outputs)."""
    streams = []
    for name, valid in ports.items():
        if not name.endswith("__valid") or valid.width != 1:
            continue
        base = name[: -len("__valid")]
        ready = ports.get(f"{base}__ready")
        payload = ports.get(f"{base}__payload")
        if (ready is None or ready.width != 1 or ready.direction == valid.direction
                or valid.direction not in ("input", "output")):
            continue
        if payload is not None and payload.direction != valid.direction:
            continue
        if payload is not None and payload.width > MAX_WIDTH:
            raise ValueError(f"stream {base!r} has a {payload.width}-bit payload; the stream "
                             f"loop supports payloads up to {MAX_WIDTH} bits")
        streams.append(_Stream(base, valid.direction, valid, ready, payload))
    members = {p.name for s in streams for p in (s.valid, s.ready, s.payload) if p is not None}
    loop_in, loop_out = loop_ports(ports.values())
    statics = [p for p in loop_in if p.name not in members]
    flags = [p for p in loop_out if p.name not in members and p.width == 1]
    return ([s for s in streams if s.direction == "input"],
            [s for s in streams if s.direction == "output"], statics, flags)


# ---------------------------------------------------------------------------------------------
# The generated loop


def _cases(items, body) -> str:
    return "\n".join(f"    case {k}: {body(item)} break;" for k, item in enumerate(items)) \
        or "    default: break;"


def _set(port: Port, src: str) -> str:
    if port.wide:
        return f"std::memcpy(top->{port.cname}.data(), {src}, {-(-port.width // 32) * 4});"
    return f"top->{port.cname} = {src}[0];"


def _get(port: Port, dst: str) -> str:
    if port.wide:
        return (f"{dst}[{port.words - 1}] = 0; std::memcpy({dst}, top->{port.cname}.data(), "
                f"{-(-port.width // 32) * 4});")
    return f"{dst}[0] = top->{port.cname};"


def _stream_main(ports: Sequence[Port]) -> str:
    """Return the C++ loop for ``ports`` (the model class is ``Vdut``)."""
    by_name = {p.name: p for p in ports}
    ins, outs, statics, flags = _classify(by_name)

    def names(items):
        return "".join(f'"{x.name}", ' for x in items)

    def words(items):
        return "".join(f"{x.words}, " for x in items)

    def pulse(p):
        return f"top->{p.cname} = v;" if p.width == 1 else ""

    return string.Template(_CXX_TEMPLATE).substitute(
        n_is=len(ins), n_os=len(outs), n_st=len(statics), n_fl=len(flags),
        is_words=words(ins), os_words=words(outs), st_words=words(statics),
        is_names=names(ins), os_names=names(outs), st_names=names(statics),
        fl_names=names(flags),
        is_valid=_cases(ins, lambda s: f"top->{s.valid.cname} = v;"),
        is_payload=_cases(ins, lambda s: "" if s.payload is None else _set(s.payload, "w")),
        is_ready=_cases(ins, lambda s: f"return top->{s.ready.cname};"),
        os_valid=_cases(outs, lambda s: f"return top->{s.valid.cname};"),
        os_ready=_cases(outs, lambda s: f"top->{s.ready.cname} = v;"),
        os_payload=_cases(outs, lambda s: "" if s.payload is None else _get(s.payload, "w")),
        st_set=_cases(statics, lambda p: _set(p, "w")),
        st_pulse=_cases(statics, pulse),
        fl_get=_cases(flags, lambda p: f"return top->{p.cname};"),
        clk0=f"top->{CLOCK} = 0;", clk1=f"top->{CLOCK} = 1;",
        rst1=f"top->{RESET} = 1;" if RESET in by_name else "",
        rst0=f"top->{RESET} = 0;" if RESET in by_name else "",
        max_words=max([1, *(s.words for s in outs)]), max_all=MAX_WIDTH // 64,
        magic=_MAGIC, exit_stall=_EXIT_STALL, exit_protocol=_EXIT_PROTOCOL,
        n_header=len(_HEADER),
    )


_CXX_TEMPLATE = cpp_template("stream_loop.cpp")


# ---------------------------------------------------------------------------------------------
# Python side


@dataclass(frozen=True)
class Segment:
    """One stretch of a run: beats to feed, ports to hold and pulse, and what ends it.

    ``inputs`` maps input stream names to their beats (1-D integer arrays or sequences of
    ints, two's complement if negative; for payloads wider than 64 bits also ``(n, words)``
    ``uint64`` arrays); ``static``
    maps plain input ports to integers held for the whole segment (others are 0); ``pulses``
    maps 1-bit plain inputs to the segment cycle in which they are high; ``phases`` orders
    the streams and phase pulses (see the module notes; default: every stream in one phase);
    ``expect`` maps output streams to the beats the segment waits for. ``check`` maps output
    streams to their expected beats (as ``inputs``): the loop compares every received beat
    with them (the last one through ``check_mask[name]``, default all bits) and reports each
    difference as a :class:`Mismatch`; ``expect`` defaults to their number.
    """

    inputs: Mapping[str, object] = field(default_factory=dict)
    static: Mapping[str, int] = field(default_factory=dict)
    pulses: Mapping[str, int] = field(default_factory=dict)
    phases: Sequence[Sequence[str]] | None = None
    expect: Mapping[str, int] = field(default_factory=dict)
    check: Mapping[str, object] = field(default_factory=dict)
    check_mask: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class StreamResult:
    """What one segment produced. Cycles count from the segment's first cycle.

    ``outputs`` holds each output stream's payloads in arrival order (1-D arrays in the
    smallest unsigned dtype of the payload width, ``(n, words)`` ``uint64`` above 64 bits),
    ``output_cycles`` the cycle of each, ``accepted`` each input stream's accept cycles.
    ``cycles`` runs to the cycle the segment was done (inclusive); beats arriving in the
    ``drain`` cycles after it are included in ``outputs``. ``blocked`` holds, per input
    stream, the longest stretch of cycles in which a beat was offered and ``ready`` stayed
    low; ``mismatches`` the differences from ``Segment.check`` (:class:`Mismatch`).
    """

    outputs: dict[str, np.ndarray]
    output_cycles: dict[str, np.ndarray]
    accepted: dict[str, np.ndarray]
    cycles: int
    drain: int
    blocked: dict[str, int] = field(default_factory=dict)
    mismatches: tuple[Mismatch, ...] = ()


@dataclass(frozen=True)
class Mismatch:
    """A received output beat that differs from ``Segment.check``: ``segment`` (index in the
    run), ``stream``, ``beat`` (index in the segment), ``cycle`` (of the segment), the
    ``expected`` payload (masked; None for a beat past the expected ones) and the one ``got``."""

    segment: int
    stream: str
    beat: int
    cycle: int
    expected: int | None
    got: int

    def __str__(self) -> str:
        want = "no beat" if self.expected is None else f"{self.expected:#x}"
        return (f"segment {self.segment}, output '{self.stream}' beat {self.beat} (cycle "
                f"{self.cycle}): expected {want}, got {self.got:#x}")


@dataclass(frozen=True)
class CheckedRun:
    """What :meth:`StreamSim.run_checked` saw: ``segments`` run (fewer than given when it
    stopped at ``max_mismatches``), output ``beats`` received (checked against
    ``Segment.check`` where given), ``cycles`` of the run after reset, the ``mismatch_count``
    and the first ``mismatches``, per input stream the longest ``blocked`` stretch (see
    :class:`StreamResult`), and ``sim_time`` / ``wall_time`` in seconds."""

    segments: int
    beats: int
    cycles: int
    mismatch_count: int
    mismatches: tuple[Mismatch, ...]
    blocked: dict[str, int]
    sim_time: float
    wall_time: float

    @property
    def ok(self) -> bool:
        """True if no beat differed."""
        return self.mismatch_count == 0


def _probability(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a probability (a float), not {value!r}")
    if not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], not {value!r}")
    return float(value)


def _burst(name: str, value) -> tuple[int, int, int]:
    """``(probability, min_len, max_len)`` or None as the loop's (threshold, min, max)."""
    if value is None:
        return 0, 0, 0
    if not isinstance(value, tuple | list) or len(value) != 3:
        raise TypeError(f"{name} must be None or (probability, min_len, max_len), not {value!r}")
    p = _probability(f"{name}[0] (the probability)", value[0])
    lo = check_int(f"{name}[1] (min_len)", value[1], 1, 1 << 40)
    hi = check_int(f"{name}[2] (max_len)", value[2], lo, 1 << 40)
    return round(p * 2**32), lo, hi


def _words(port: Port, value, what: str) -> np.ndarray:
    """Return beats ``value`` of a payload ``port`` as an ``(n, words)`` uint64 array.

    ``value`` is an integer array (for wide ports a ``(n, words)`` uint64 array, see
    :class:`VectorSim`) or a sequence of integers (any width; Python ints are converted at
    about 10M per second up to 64 bits, 3M per second above).
    """
    if isinstance(value, np.ndarray) and value.dtype != object:
        if value.ndim == 0:
            raise TypeError(f"{what} must be an array of beats, not {value!r}")
        if value.size == 0:
            return np.zeros((0, port.words), np.uint64)
        col = as_column(port, value, None)
        return np.asarray(col, dtype=np.uint64).reshape(-1, port.words)
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence | np.ndarray):
        raise TypeError(f"{what} must be an array of beats, not {value!r}")
    mask = (1 << port.width) - 1
    try:
        if port.words == 1:
            try:
                a = np.fromiter(map(operator.index, value), np.uint64, len(value))
            except OverflowError:      # negative values or 2**64 and more: checked below
                pass
            else:
                if not a.size or port.width == 64 or int(a.max()) <= mask:
                    return a.reshape(-1, 1)
        ints = [operator.index(v) for v in value]
    except TypeError:
        raise TypeError(f"{what} must hold integers (bit patterns), not "
                        f"{next(v for v in value if not isinstance(v, int | np.integer))!r} "
                        "(view floats as unsigned integers first)") from None
    if not ints:
        return np.zeros((0, port.words), np.uint64)
    lo, hi = min(ints), max(ints)
    if lo < -(1 << (port.width - 1)) or hi > mask:
        raise ValueError(f"{what} has values outside [{-(1 << (port.width - 1))}, {mask}] "
                         f"({port.width} bits): min {lo}, max {hi}")
    raw = b"".join((v & mask).to_bytes(8 * port.words, "little") for v in ints)
    return np.frombuffer(raw, dtype=np.uint64).reshape(-1, port.words)


class StreamSim(VectorSim):
    """A Verilator build of ``component`` whose loop drives and checks its stream interfaces.

    Building happens on construction (or a finished build is reused); :meth:`run` and
    :meth:`run_segments` then cost file I/O and simulation. See the module notes for the cycle
    contract. The vector interface of :class:`VectorSim` (``run(inputs, latency=...)``) is
    replaced by the stream one.

    Parameters
    ----------
    component : :class:`amaranth.lib.wiring.Component`
        The design, with a ``sync`` domain; members ``stream.Signature`` interfaces and plain
        ports.
    name : :class:`str` or None
        Verilog module name and build directory prefix; defaults to the class name in
        lower case.
    verbose : :class:`bool` or None
        Stream build output to stdout instead of ``build.log``.

    Raises
    ------
    :exc:`TypeError`
        If ``component`` is not a wiring.Component.
    :exc:`ValueError`
        If ``name`` is not a Verilog identifier, the design has no clock, or a stream payload
        is wider than :data:`~qaccel.sim.vectors.MAX_WIDTH` bits.
    :exc:`~qaccel.sim.runner.SimulatorNotFoundError`, :exc:`~qaccel.sim.runner.BuildError`
        As :class:`VectorSim`.

    Members
    -------
    input_streams, output_streams : tuple of str
        Stream interface names (``x`` for ports ``x__payload``, ``x__valid``, ``x__ready``).
    statics : tuple of str
        Plain input ports (``static``; the 1-bit ones can be pulsed).
    flags : tuple of str
        1-bit plain output ports (candidates for ``until_idle``).
    last_run : :class:`~qaccel.sim.vectors.RunStats` or None
        Measurements of the last run; ``vectors`` counts the output beats received.
    """

    _kind = "stream"
    _loop_file = _SOURCE
    _loop_template = _CXX_TEMPLATE
    _loop_version = _LOOP_VERSION

    def _loop_source(self, ports) -> str:
        return _stream_main(ports)

    def __init__(self, component: wiring.Component, *, name: str | None = None,
                 verbose: bool | None = None, design_key: str | None = None):
        super().__init__(component, name=name, verbose=verbose, design_key=design_key)
        if not self.has_clock:
            raise ValueError(f"{self.name} has no clock (sync domain); streams need one")
        ins, outs, statics, flags = _classify(self._ports)
        self._in_streams = {s.name: s for s in ins}
        self._out_streams = {s.name: s for s in outs}
        self._statics = {p.name: k for k, p in enumerate(statics)}
        self._static_ports = statics
        self._flags = {p.name: k for k, p in enumerate(flags)}

    # -- properties ----------------------------------------------------------------------------

    @property
    def input_streams(self) -> tuple[str, ...]:
        """Names of the input stream interfaces."""
        return tuple(self._in_streams)

    @property
    def output_streams(self) -> tuple[str, ...]:
        """Names of the output stream interfaces."""
        return tuple(self._out_streams)

    @property
    def statics(self) -> tuple[str, ...]:
        """Plain input ports (held per segment; the 1-bit ones may be pulsed)."""
        return tuple(self._statics)

    @property
    def flags(self) -> tuple[str, ...]:
        """1-bit plain output ports."""
        return tuple(self._flags)

    # -- encoding ------------------------------------------------------------------------------

    def _names(self, what: str, names, choices: Mapping) -> None:
        for name in names:
            if name not in choices:
                listed = ", ".join(choices) or "none"
                raise ValueError(f"{self._name} has no {what} {name!r}; its {what}s are: {listed}")

    def _encode(self, seg: Segment, data: list[np.ndarray],
                offset: int) -> tuple[list[int], int, int]:
        """Return the record of ``seg``, the next data offset and its number of input beats;
        append its beat data to ``data``."""
        if not isinstance(seg, Segment):
            raise TypeError(f"must be a Segment, not {seg!r}")
        for attr in ("inputs", "static", "pulses", "expect", "check", "check_mask"):
            if not isinstance(getattr(seg, attr), Mapping):
                raise TypeError(f"{attr} must be a mapping, not {getattr(seg, attr)!r}")
        self._names("input stream", seg.inputs, self._in_streams)
        self._names("output stream", [*seg.expect, *seg.check, *seg.check_mask],
                    self._out_streams)
        for name in seg.check_mask:
            if name not in seg.check:
                raise ValueError(f"check_mask names {name!r}, which check does not")
        self._names("plain input", [*seg.static, *seg.pulses], self._statics)
        phases = [list(seg.inputs)] if seg.phases is None else seg.phases
        if isinstance(phases, str) or not all(
                isinstance(p, Sequence) and not isinstance(p, str) for p in phases):
            raise TypeError(f"phases must be a sequence of sequences of names, not {phases!r}")
        phase_of: dict[str, int] = {}
        for j, group in enumerate(phases):
            for name in group:
                if name in phase_of:
                    raise ValueError(f"phases name {name!r} twice")
                if name not in seg.inputs and name not in self._statics:
                    raise ValueError(f"phases name {name!r}, which is neither a stream given in "
                                     f"inputs ({', '.join(seg.inputs) or 'none'}) nor a plain "
                                     f"1-bit input ({', '.join(self._statics) or 'none'})")
                phase_of[name] = j
        missing = [name for name in seg.inputs if name not in phase_of]
        if missing:
            raise ValueError(f"phases must place every input stream; missing {missing}")
        pulsed = [*seg.pulses, *(n for n in phase_of if n in self._statics)]
        for name in pulsed:
            port = self._static_ports[self._statics[name]]
            if port.width != 1:
                raise ValueError(f"only 1-bit ports can be pulsed; {name!r} is {port.width} bits")
            if name in seg.static:
                raise ValueError(f"{name!r} is both static and pulsed")
        if len(set(pulsed)) != len(pulsed):
            raise ValueError(f"{sorted(set(seg.pulses) & set(phase_of))[0]!r} is pulsed both by "
                             "pulses and by phases")
        rec = [len(phases)]
        for port in self._static_ports:
            value = seg.static.get(port.name, 0)
            check_int(f"static[{port.name!r}]", value)
            col = np.ascontiguousarray(as_column(port, value, 1), np.uint64)
            rec += col.reshape(-1).view(np.int64).tolist()
        beats = 0
        for name, s in self._in_streams.items():
            if name not in seg.inputs:
                rec += [0, -1, 0]
                continue
            value = seg.inputs[name]
            if s.payload is None:
                n = len(value) if isinstance(value, Sequence | np.ndarray) else check_int(
                    f"inputs[{name!r}]", value, 0)
                words = np.zeros((n, 0), np.uint64)
            else:
                words = _words(s.payload, value, f"inputs[{name!r}]")
            data.append(words.reshape(-1))
            rec += [len(words), phase_of[name], offset]
            offset += words.size
            beats += len(words)
        for name, s in self._out_streams.items():
            count = (check_int(f"expect[{name!r}]", seg.expect[name], 0)
                     if name in seg.expect else -1)
            check_offset, mask = -1, np.full(s.words, -1, np.int64)
            if name in seg.check:
                if s.payload is None:
                    raise ValueError(f"output stream {name!r} has no payload to check")
                want = _words(s.payload, seg.check[name], f"check[{name!r}]")
                if count >= 0 and count != len(want):
                    raise ValueError(f"expect[{name!r}] is {count} but check[{name!r}] holds "
                                     f"{len(want)} beats; leave expect out or make them agree")
                count = len(want)
                data.append(want.reshape(-1))
                check_offset = offset
                offset += want.size
                if name in seg.check_mask:
                    mask = _words(s.payload, [check_int(f"check_mask[{name!r}]",
                                                        seg.check_mask[name])],
                                  f"check_mask[{name!r}]").reshape(-1).view(np.int64)
            rec += [count, check_offset, *mask.tolist()]
        pulses = [(self._statics[n], check_int(f"pulses[{n!r}]", c, 0))
                  for n, c in seg.pulses.items()]
        pulses += [(self._statics[n], -1 - j) for n, j in phase_of.items() if n in self._statics]
        rec.append(len(pulses))
        for pair in pulses:
            rec += pair
        return rec, offset, beats

    # -- run -----------------------------------------------------------------------------------

    def run(self, inputs: Mapping[str, object], static: Mapping[str, int] | None = None, *,
            pulses: Mapping[str, int] | None = None,
            phases: Sequence[Sequence[str]] | None = None,
            expect: Mapping[str, int] | None = None, **options) -> StreamResult:
        """Run one :class:`Segment` and return its :class:`StreamResult`.

        ``inputs`` (stream name to beats), ``static`` (port to value), ``pulses`` (1-bit port
        to cycle), ``phases`` and ``expect`` (output stream to beat count) are the segment's
        fields; ``options`` and the exceptions are those of :meth:`run_segments`.
        """
        seg = Segment(inputs=inputs, static=static or {}, pulses=pulses or {}, phases=phases,
                      expect=expect or {})
        return self.run_segments([seg], **options)[0]

    def run_segments(self, segments: Sequence[Segment], *, idle: float = 0.0,
                     backpressure: float = 0.0, seed: int = 1, max_cycles: int | None = None,
                     until_idle: str | None = "busy", reset_cycles: int = RESET_CYCLES,
                     drain: int = DRAIN, watchdog: int = WATCHDOG,
                     stall_burst: tuple[float, int, int] | None = None,
                     starve_burst: tuple[float, int, int] | None = None) -> list[StreamResult]:
        """Run ``segments`` back to back in one process after one reset; return their results
        (every beat received and its cycle; ``Segment.check`` differences in ``mismatches``).

        ``idle`` and ``backpressure`` are pause probabilities (see the module notes); ``seed``
        seeds the pauses; ``max_cycles`` bounds the whole run (default: 10 million plus 1000
        per input beat); ``until_idle`` names a 1-bit output that must be low for a segment to
        end (None: no such condition); ``drain`` cycles follow each segment's end;
        ``watchdog`` is the stall timeout in cycles. ``stall_burst`` ``(probability, min_len,
        max_len)`` starts, with that probability per cycle, a burst of ``min_len`` to
        ``max_len`` cycles (uniform) in which an output stream's ``ready`` stays low;
        ``starve_burst`` likewise keeps an input stream's ``valid`` low before a beat (both
        on top of ``backpressure`` / ``idle``; None: no bursts).

        Raises :exc:`TypeError` / :exc:`ValueError` for bad arguments (unknown ports, values
        that do not fit, a stream missing from ``phases``, ...), :exc:`StreamStallError` and
        :exc:`StreamProtocolError` as the module notes say, and
        :exc:`~qaccel.sim.runner.SimulationError` if the loop fails otherwise.
        """
        start = time.perf_counter()
        out, sim_time, n_seg, reset_cycles = self._execute(
            segments, True, 1 << 62, idle=idle, backpressure=backpressure, seed=seed,
            max_cycles=max_cycles, until_idle=until_idle, reset_cycles=reset_cycles,
            drain=drain, watchdog=watchdog, stall_burst=stall_burst, starve_burst=starve_burst)
        results, received, total_cycles = self._decode(out, n_seg, drain)
        self.last_run = RunStats(received, reset_cycles + total_cycles,
                                 time.perf_counter() - start, sim_time)
        return results

    def run_checked(self, segments: Sequence[Segment], *,
                    max_mismatches: int = MAX_MISMATCHES, **options) -> CheckedRun:
        """Run ``segments`` as :meth:`run_segments` does (same ``options``, same exceptions),
        but compare in the loop: received beats are checked against ``Segment.check`` and
        counted, not returned, so a run costs the simulation and the input files only.

        The run stops in the cycle of the ``max_mismatches``-th difference (at least 1; that
        segment, cut short, is counted); the :class:`CheckedRun` lists the first
        ``max_mismatches``.
        """
        start = time.perf_counter()
        max_mismatches = check_int("max_mismatches", max_mismatches, 1, 1 << 40)
        out, sim_time, _, reset_cycles = self._execute(segments, False, max_mismatches,
                                                       **options)
        n_run, cycles, n_mism, n_stored = (int(v) for v in out[:4].view(np.int64))
        n_is, n_os = len(self._in_streams), len(self._out_streams)
        width = 3 + 2 * n_is + n_os
        rec = out[4: 4 + n_run * width].view(np.int64).reshape(n_run, width)
        mism = self._mismatches(out, 4 + n_run * width, n_stored)
        blocked = {n: int(rec[:, 3 + n_is + n_os + j].max(initial=0))
                   for j, n in enumerate(self._in_streams)}
        run = CheckedRun(n_run, int(rec[:, 3 + n_is: 3 + n_is + n_os].sum()), cycles, n_mism,
                         mism, blocked, sim_time, time.perf_counter() - start)
        self.last_run = RunStats(run.beats, reset_cycles + cycles, run.wall_time, sim_time)
        return run

    def _mismatches(self, out: np.ndarray, pos: int, n: int) -> tuple[Mismatch, ...]:
        mw = max([1, *(s.words for s in self._out_streams.values())])
        names = list(self._out_streams)
        entries = out[pos: pos + n * (5 + 2 * mw)].reshape(n, 5 + 2 * mw)

        def value(words) -> int:
            return int.from_bytes(np.ascontiguousarray(words).tobytes(), "little")

        return tuple(Mismatch(int(e[0]), names[int(e[1])], int(e[2]), int(e[3]),
                              None if e[4] else value(e[5: 5 + mw]), value(e[5 + mw:]))
                     for e in entries)

    def _execute(self, segments: Sequence[Segment], record: bool, max_mismatches: int, *,
                 idle: float = 0.0, backpressure: float = 0.0, seed: int = 1,
                 max_cycles: int | None = None, until_idle: str | None = "busy",
                 reset_cycles: int = RESET_CYCLES, drain: int = DRAIN,
                 watchdog: int = WATCHDOG, stall_burst: tuple[float, int, int] | None = None,
                 starve_burst: tuple[float, int, int] | None = None
                 ) -> tuple[np.ndarray, float, int, int]:
        """Encode, run the loop, return (result words, loop seconds, segments, reset cycles)."""
        if isinstance(segments, Segment) or not isinstance(segments, Sequence):
            raise TypeError(f"segments must be a sequence of Segment, not {segments!r}")
        if not segments:
            raise ValueError("segments must hold at least one Segment")
        idle = _probability("idle", idle)
        backpressure = _probability("backpressure", backpressure)
        stall = _burst("stall_burst", stall_burst)
        starve = _burst("starve_burst", starve_burst)
        seed = check_int("seed", seed, 0, (1 << 64) - 1)
        reset_cycles = check_int("reset_cycles", reset_cycles, 0, 1 << 20)
        drain = check_int("drain", drain, 0, 1 << 20)
        watchdog = check_int("watchdog", watchdog, 1, 1 << 40)
        if until_idle is None:
            flag = -1
        else:
            self._names("1-bit plain output", [until_idle], self._flags)
            flag = self._flags[until_idle]
        data: list[np.ndarray] = []
        records: list[int] = []
        offset = beats = 0
        for k, seg in enumerate(segments):
            try:
                rec, offset, n = self._encode(seg, data, offset)
            except (TypeError, ValueError) as e:
                if len(segments) == 1 and isinstance(seg, Segment):
                    raise                       # run(): the arguments are the segment
                raise type(e)(f"segments[{k}]: {e}") from None
            records += rec
            beats += n
        if max_cycles is None:
            max_cycles = _BASE_CYCLES + _CYCLES_PER_BEAT * beats
        max_cycles = check_int("max_cycles", max_cycles, 1, (1 << 62))
        # xorshift64* needs a non-zero state: seed through splitmix64's finaliser.
        z = (seed + 0x9E3779B97F4A7C15) & ((1 << 64) - 1)
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & ((1 << 64) - 1)
        state = (z ^ (z >> 31)) or 1
        header = [_MAGIC, len(self._in_streams), len(self._out_streams), len(self._statics),
                  len(self._flags), len(segments), state - (1 << 64) if state >> 63 else state,
                  round(idle * 2**32), round(backpressure * 2**32), watchdog, max_cycles,
                  reset_cycles, drain, flag, *stall, *starve, int(record), max_mismatches]
        data_start = len(header) + 1 + len(records)
        config = np.concatenate([np.array([*header, data_start, *records], np.int64),
                                 *(d.view(np.int64) for d in data)])

        run_dir = runner.run_dir(self._dir, f"{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            config_path, result_path = run_dir / "config.bin", run_dir / "result.bin"
            config.tofile(config_path)
            cmd = [str(self._dir / "obj_dir" / EXE), str(config_path), str(result_path)]
            sim_start = time.perf_counter()
            res = subprocess.run(cmd, capture_output=True, text=True, check=False)
            sim_time = time.perf_counter() - sim_start
            message = f"{self._name}: {res.stderr.strip()}"
            if res.returncode == _EXIT_STALL:
                raise StreamStallError(message)
            if res.returncode == _EXIT_PROTOCOL:
                raise StreamProtocolError(message)
            if res.returncode != 0:
                raise SimulationError(
                    runner.crash_message(f"the stream loop of {self._name}", res.returncode,
                                         self._dir / "obj_dir" / EXE, self._dir)
                    + f": {res.stderr.strip()}")
            out = np.fromfile(result_path, dtype=np.uint64)
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)
        return out, sim_time, len(segments), reset_cycles

    def _decode(self, out: np.ndarray, n_seg: int,
                drain: int) -> tuple[list[StreamResult], int, int]:
        n_is, n_os = len(self._in_streams), len(self._out_streams)
        total_cycles, n_stored = int(out[1]), int(out[3])
        width = 3 + 2 * n_is + n_os
        rec = out[4: 4 + n_seg * width].view(np.int64).reshape(n_seg, width)
        starts, dones = rec[:, 0], rec[:, 1]
        pos = 4 + n_seg * width
        mism = self._mismatches(out, pos, n_stored)
        pos += n_stored * (5 + 2 * max([1, *(s.words for s in self._out_streams.values())]))
        outputs: dict[str, list] = {}
        output_cycles: dict[str, list] = {}
        received = 0
        for j, (name, s) in enumerate(self._out_streams.items()):
            counts = rec[:, 3 + n_is + j]
            total = int(counts.sum())
            received += total
            words = out[pos: pos + total * s.words].reshape(total, s.words)
            pos += total * s.words
            cycles = out[pos: pos + total].view(np.int64)
            pos += total
            bounds = np.cumsum(counts)[:-1]
            if s.payload is None:
                beats = np.zeros(total, np.uint8)
            elif s.payload.wide:
                beats = words
            else:
                beats = words[:, 0].astype(s.payload.dtype)
            outputs[name] = np.split(beats, bounds)
            output_cycles[name] = [c - starts[g] for g, c in enumerate(np.split(cycles, bounds))]
        accepted: dict[str, list] = {}
        for j, name in enumerate(self._in_streams):
            counts = rec[:, 3 + j]
            total = int(counts.sum())
            cycles = out[pos: pos + total].view(np.int64)
            pos += total
            accepted[name] = [c - starts[g] for g, c in
                              enumerate(np.split(cycles, np.cumsum(counts)[:-1]))]
        if pos != out.size:
            raise SimulationError(f"the stream loop of {self._name} wrote {out.size} words, "
                                  f"{pos} expected")
        blocked = rec[:, 3 + n_is + n_os:]
        results = [StreamResult({n: v[g] for n, v in outputs.items()},
                                {n: v[g] for n, v in output_cycles.items()},
                                {n: v[g] for n, v in accepted.items()},
                                int(dones[g] - starts[g]) + 1, drain,
                                {n: int(blocked[g, j]) for j, n in enumerate(self._in_streams)},
                                tuple(m for m in mism if m.segment == g))
                   for g in range(n_seg)]
        return results, received, total_cycles
