# amaranth: UnusedElaboratable=no
"""Credit-limit proofs of the MatMulNBits engine's packed MAC array and of its scale lanes'
admission (:class:`~qaccel.rtl.nbits.lane_admission.LaneAdmission`), by bounded model checking.

The packed MAC array (:class:`qaccel.sim.formal.CreditHarness`): with ``o`` stalled the array
takes exactly ``fifo_depth`` blocks (their ``last`` beats) and no more, never loses, duplicates
or withholds a block's result (``o.valid`` exactly when a block whose last beat went in
``latency`` or more cycles ago is still inside), keeps ``o`` stable while it waits, and is
``busy`` while any is inside. Small arrays (pe 2, simd 1, 16-element blocks: an 8-block
FIFO, latency 5), with the block-RAM FIFO (the default at this size) and the LUT-RAM one, to
a depth where the credit is exhausted and one more block tries to enter. The mutants these
proofs reject are in ``tests/rtl/test_credit_mutants.py``. About 3-7 s each.

The lane admission (:class:`AdmissionHarness`): a source that follows its protocol (the beat
offered in a cycle is the candidate it picked in the previous one, ``stay`` or ``advance`` as a
beat was admitted or not; it admits ``take = offered & ok``, ``beat`` the offered beat) and
releases a result only while one is outstanding: never more than ``credits`` results admitted
and not released. 4 credits, to a depth where they run out and one more ``last`` beat is
offered; the mutants (one credit too many, the credit not consulted) fail it.
"""

from __future__ import annotations

import sys

import pytest
from amaranth.hdl import (
    Assert,
    Assume,
    ClockDomain,
    Elaboratable,
    Module,
    Mux,
    Signal,
    Value,
    signed,
)

from qaccel.rtl.nbits.lane_admission import LaneAdmission
from qaccel.rtl.nbits.packed_mac_array import PackedMacArray
from qaccel.sim.formal import CreditHarness, run_bmc
from tests.rtl.elementwise.test_formal_quantize import failed_statements, requires_formal
from tests.rtl.mutants import mutant
from tests.rtl.test_credit_mutants import MAC_CONFIGS, mac_harness


@requires_formal
@pytest.mark.parametrize("fifo", list(MAC_CONFIGS))
def test_mac_credit_limit(fifo):
    unit = PackedMacArray(**MAC_CONFIGS[fifo])
    h = mac_harness(unit)
    assert h.credit_depth > 1 + unit.fifo_depth + 1      # the credit runs out, one more tries
    r = run_bmc(h, h.ports(), depth=h.credit_depth, name=f"mac-credit-{fifo}", timeout=600)
    assert r.passed, r.summary()
    print(f"PackedMacArray ({fifo}) fifo {unit.fifo_depth}, latency {unit.latency}: "
          f"{r.summary()}", file=sys.stderr)


def test_credit_harness_errors():
    unit = PackedMacArray(**MAC_CONFIGS["bram"])
    with pytest.raises(TypeError, match="unit"):
        CreditHarness(object(), i="i", o="o", limit=8, latency=5)
    with pytest.raises(ValueError, match="'o' is not an In stream"):
        CreditHarness(unit, i="o", o="o", limit=8, latency=5)
    with pytest.raises(ValueError, match="'busy' is not an Out stream"):
        CreditHarness(unit, i="i", o="busy", limit=8, latency=5)
    with pytest.raises(ValueError, match="limit"):
        CreditHarness(unit, i="i", o="o", limit=0, latency=5)
    with pytest.raises(TypeError, match="latency"):
        CreditHarness(unit, i="i", o="o", limit=8, latency=5.0)
    with pytest.raises(TypeError, match="counts"):
        CreditHarness(unit, i="i", o="o", limit=8, latency=5, counts=1)


class AdmissionHarness(Elaboratable):
    """A :class:`LaneAdmission` with a source that follows its protocol (see the module notes)
    and releases freely while results are outstanding; asserts that at most ``credits``
    results are outstanding (and never fewer than none)."""

    def __init__(self, unit: LaneAdmission):
        self.unit = unit
        self.sync = ClockDomain("sync")

    @property
    def depth(self) -> int:
        """Reset, ``credits`` admissions, one more offered, the check after."""
        return 1 + self.unit.credits + 4

    def ports(self) -> list[Value]:
        u = self.unit
        return [self.sync.clk, self.sync.rst,
                *(Value.cast(v) for _, _, v in u.signature.flatten(u))]

    def elaborate(self, platform):
        m = Module()
        m.domains.sync = self.sync
        m.submodules.unit = u = self.unit
        first = Signal(init=1, reset_less=True)
        m.d.sync += first.eq(0)
        with m.If(first):
            m.d.comb += Assume(self.sync.rst)
        # the beat offered in this cycle: the candidate picked in the previous one
        offered = Signal.like(u.stay[0])
        m.d.sync += offered.eq(Mux(u.take, u.advance[u.advance_pick], u.stay[u.stay_pick]))
        m.d.comb += [Assume(u.take == (offered.valid & u.ok)),
                     Assume(u.beat.addr == offered.addr), Assume(u.beat.last == offered.last)]
        outstanding = Signal(signed(u.credits.bit_length() + 2))
        m.d.comb += Assume(~u.release | (outstanding > 0))
        m.d.sync += outstanding.eq(outstanding + (u.take & u.beat.last) - u.release)
        m.d.comb += [Assert(outstanding >= 0), Assert(outstanding <= u.credits)]
        return m


#: A small admission: 4 credits, a window of 2, two candidates per version.
ADMISSION = dict(addr_width=2, window=2, credits=4, choices=2)
#: (old, new) in LaneAdmission.elaborate.
ADMISSION_MUTANTS = {
    "off_by_one": ("room.eq(held_next < C), room2.eq(held_next < C - 1)",
                   "room.eq(held_next <= C), room2.eq(held_next <= C - 1)"),
    "ignored": ("(~cand.last | (room_after if taken else room))", "1"),
}


@requires_formal
@pytest.mark.parametrize("kind", [None, *ADMISSION_MUTANTS])
def test_admission_credit_limit(kind):
    """The admission's credit holds (``kind`` None); each mutant fails on it."""
    cls = LaneAdmission if kind is None else mutant(LaneAdmission, *ADMISSION_MUTANTS[kind],
                                                    name=f"LaneAdmission_{kind}")
    h = AdmissionHarness(cls(**ADMISSION))
    r = run_bmc(h, h.ports(), depth=h.depth, name=f"admission-credit-{kind or 'unit'}",
                timeout=600)
    if kind is None:
        assert r.passed, r.summary()
    else:
        assert r.failed, f"{kind} survived: {r.summary()}"
        assert any("outstanding <= " in t for t in failed_statements(r)), r.summary()
    print(f"LaneAdmission {kind or 'unit'} ({ADMISSION}): {r.summary()}", file=sys.stderr)
