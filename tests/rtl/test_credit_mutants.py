# amaranth: UnusedElaboratable=no
"""Mutation tests of the credit counters: each mutant, made in-process (:func:`tests.rtl.
mutants.mutant`: the unit's ``elaborate`` recompiled with one condition changed, the files on
disk untouched), must fail a check of the default suite.

Mutants, per credit-counted FIFO:

* ``off_by_one``: the credit admits one beat more than the FIFO holds (``reserved <= depth``
  for ``reserved < depth``);
* ``ignored``: the credit is not consulted at all (a beat taken while the output has no room);
* ``early_release``: a credit comes back whenever the output's ``ready`` is high, whether or
  not a beat leaves (the counter falls behind the beats inside).

(Not a mutant: a beat also admitted whenever ``ready`` is high. The FIFO is deeper than the
pipeline, so with every credit taken a beat waits on the output and leaves with ``ready``:
the proofs pass it, rightly.)

Killed by the bounded credit proofs (:class:`qaccel.sim.formal.ElementwiseHarness` for the
Quantize / Dequantize shell, :class:`qaccel.sim.formal.CreditHarness` for the MatMulNBits
engine's packed MAC array), each failing on the credit assertion (``inside <= limit``) or,
for ``early_release``, on ``busy`` low with beats inside, within ``limit + 4`` steps; and,
for the elementwise units (``-m slow``: each mutant is a Verilator build), by the cocotb
``test_credit_limit`` of ``sim/tb_elementwise.py`` (its occupancy monitor, the cycle the
credit is overrun; ``early_release`` survives it, see that test).
The unmutated units pass the same proofs in ``tests/rtl/elementwise/test_formal_quantize.py``
and ``tests/rtl/nbits/test_formal_credit.py``.

The engine's other credits have their mutants beside their checks: the scale lanes' admission
in ``tests/rtl/nbits/test_formal_credit.py`` (its proof), the row quantizer's ``q`` credit in
``tests/rtl/test_flow_control.py`` (long stalls in Amaranth's simulator), and the cluster's
``y`` credit, the MAC array's and the admission's inside the whole engine in
``tests/sim/test_tb_matmul_nbits_v2.py::test_long_stalls_kill_engine_mutants`` (``-m slow``:
a Verilator build each).
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from qaccel.model.config import AccelConfig
from qaccel.rtl.elementwise.dequantize import Dequantize
from qaccel.rtl.elementwise.quantize import Quantize
from qaccel.rtl.nbits.packed_mac_array import PackedMacArray
from qaccel.sim.formal import (
    CreditHarness,
    ElementwiseHarness,
    run_bmc,
    with_delay_lanes,
)
from qaccel.sim.runner import SimulationFailed, missing_simulator
from tests.rtl.elementwise.test_formal_quantize import (
    CONFIG,
    SHORT,
    credit_depth,
    failed_statements,
    requires_formal,
)
from tests.rtl.mutants import mutant

#: (old, new) in Elementwise.elaborate.
ELEMENTWISE = {
    "off_by_one": ("(reserved < self._fifo_depth)", "(reserved <= self._fifo_depth)"),
    "ignored": ("(reserved < self._fifo_depth)", "1"),
    "early_release": ("done = self.y.valid & self.y.ready", "done = self.y.ready"),
}
#: (old, new) in PackedMacArray.elaborate.
MAC = {
    "off_by_one": ("i.ready.eq(reserved < depth)", "i.ready.eq(reserved <= depth)"),
    "ignored": ("i.ready.eq(reserved < depth)", "i.ready.eq(1)"),
    "early_release": ("done = o.valid & o.ready", "done = o.ready"),
}
#: The assertions (source text) each mutant fails: the credit, or ``busy`` low with beats
#: inside (the counter released a credit while its beat was still inside).
KILLED_BY = {"off_by_one": ("inside <= ",), "ignored": ("inside <= ",),
             "early_release": ("inside <= ", "Assert(u.busy)")}


def check_killed(r, kind: str, what: str) -> None:
    assert r.failed, f"{what} survived: {r.summary()}"
    texts = failed_statements(r)
    assert any(e in t for t in texts for e in KILLED_BY[kind]), (what, texts, r.summary())
    print(f"{what}: {r.summary()}", file=sys.stderr)


@requires_formal
@pytest.mark.parametrize("unit_class", [Quantize, pytest.param(Dequantize, marks=pytest.mark.slow)],
                         ids=lambda c: c.__name__)
@pytest.mark.parametrize("kind", list(ELEMENTWISE))
def test_elementwise_mutant_fails_credit_proof(kind, unit_class):
    """The shell (Elementwise.elaborate) is the Quantize and the Dequantize unit's: the
    default suite mutates it in the Quantize unit, ``-m slow`` in the Dequantize one too."""
    base = with_delay_lanes(unit_class, SHORT)
    cls = mutant(base, *ELEMENTWISE[kind], name=f"{unit_class.__name__}_{kind}")
    config = CONFIG if unit_class is Quantize else DQ_CONFIG
    h = ElementwiseHarness(cls(config), tagged=True)
    r = run_bmc(h, h.ports(), depth=credit_depth(h),
                name=f"{unit_class.__name__.lower()}-credit-{kind}", timeout=600)
    check_killed(r, kind, f"{unit_class.__name__} {kind}")


#: The Dequantize shell's proof configuration (one int8 input, float32 out).
DQ_CONFIG = AccelConfig(lanes=1, dq_inputs=("int8",), scales=("float32",),
                        dq_outputs=("float32",), table_depth=4, max_dims=1, size_width=4,
                        count_width=8)


def mac_harness(unit: PackedMacArray) -> CreditHarness:
    """The credit harness of a packed MAC array: a block's ``last`` beat makes an ``o`` beat."""
    return CreditHarness(unit, i="i", o="o", limit=unit.fifo_depth, latency=unit.latency,
                         counts=lambda p: p.last)


#: Small MAC arrays: the block-RAM FIFO (default at this pe) and the LUT-RAM one.
MAC_CONFIGS = {"bram": dict(pe=2, simd=1, max_block=16),
               "lutram": dict(pe=2, simd=1, max_block=16, block_fifo=False)}


@requires_formal
@pytest.mark.parametrize("fifo", ["bram", pytest.param("lutram", marks=pytest.mark.slow)])
@pytest.mark.parametrize("kind", list(MAC))
def test_mac_mutant_fails_credit_proof(kind, fifo):
    """The credit logic is the same whatever the FIFO: the default suite mutates the array
    with the block-RAM FIFO, ``-m slow`` the LUT-RAM one too."""
    cls = mutant(PackedMacArray, *MAC[kind], name=f"PackedMacArray_{kind}")
    h = mac_harness(cls(**MAC_CONFIGS[fifo]))
    r = run_bmc(h, h.ports(), depth=h.credit_depth, name=f"mac-credit-{fifo}-{kind}",
                timeout=600)
    check_killed(r, kind, f"PackedMacArray ({fifo}) {kind}")


def test_mutant_errors():
    with pytest.raises(ValueError, match="occurs 0 times"):
        mutant(PackedMacArray, "reserved < depth + 7", "0")
    with pytest.raises(ValueError, match="differ"):
        mutant(PackedMacArray, *(MAC["off_by_one"][0],) * 2)
    with pytest.raises(TypeError, match="cls"):
        mutant("PackedMacArray", "a", "b")
    with pytest.raises(TypeError, match="must be a function"):
        mutant(PackedMacArray, "a", "b", method="fifo_depth")


# ---------------------------------------------------------------------------------------------
# cocotb: the long-stall test kills the elementwise mutants


#: The real Quantize lane, one type pair: a 64-beat FIFO, latency 44.
SIM_CONFIG = AccelConfig(lanes=1, q_inputs=("float32",), scales=("float32",),
                         q_outputs=("int8",))


@pytest.mark.slow
@pytest.mark.sim
@pytest.mark.skipif(missing_simulator("verilator") is not None,
                    reason=missing_simulator("verilator") or "")
@pytest.mark.parametrize("kind", [None, "off_by_one", "ignored"])
def test_elementwise_mutant_fails_long_stalls(kind):
    """tb_elementwise's test_credit_limit passes on the unit and fails on the off-by-one and
    the ignored credit (its occupancy monitor: beats inside past the FIFO depth).
    ``early_release`` passes it (seed 1 and 61): its counter drifts low only while ``y`` is
    ready and empty, then wraps past 0 and blocks admission rather than overrun the FIFO;
    the credit proofs kill it (``busy`` low with a beat inside)."""
    from qaccel.sim.elementwise_sim import run_elementwise
    from qaccel.sim.matrix import fill_job

    cls = Quantize if kind is None else mutant(Quantize, *ELEMENTWISE[kind],
                                               name=f"Quantize_{kind}")
    unit = cls(SIM_CONFIG)
    rng = np.random.default_rng(61)
    jobs = [fill_job(unit, rng) for _ in range(3)]
    run = dict(name=f"quantize_credit_{kind or 'unit'}", testcase="test_credit_limit",
               fifo_depth=unit.fifo_depth)
    if kind is None:
        r = run_elementwise(unit, jobs, **run)
        assert r.passed == r.tests == 1, r
        print(r.records["test_credit_limit"], file=sys.stderr)
        return
    with pytest.raises(SimulationFailed) as info:
        run_elementwise(unit, jobs, **run)
    message = str(info.value)
    assert f"outside 0..{unit.fifo_depth}" in message, message
    print(f"{kind}: {message.splitlines()[1][:200]}", file=sys.stderr)
