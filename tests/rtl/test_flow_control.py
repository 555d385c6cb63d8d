# amaranth: UnusedElaboratable=no
"""Flow control at its limit, in Amaranth's simulator: the MatMulNBits row quantizer's ``q``
FIFO, whose credit the engine never runs out (it takes ``q`` every cycle), filled by long
stalls on ``q`` and checked every cycle.

Stall patterns, computed from the unit: ``q.ready`` low for ``out_depth + latency + 8``
cycles in a row (then a random run of up to as many cycles with 30 % pauses), and the same
stall from each job's start; ``a.valid`` low for ``latency + 8`` cycles between runs of beats
(input starvation: the ring and the FIFO run empty). Every ``q`` and ``blk`` beat is compared
with the golden model (``quantize_a``) and counted; the ``q`` FIFO (found in the elaborated
design) must never be written while full (a beat lost: the credit let one too many through)
and must reach its depth. The mutants of the unit's credit (one beat too many, the credit
ignored, a credit released without a beat leaving) fail the same check.

Also the cocotb agents' long-stall pattern (:func:`~qaccel.sim.streams.burst_pauses`) and
occupancy monitor (:class:`~qaccel.sim.streams.OccupancyMonitor`), on fake handles.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from amaranth.hdl import Fragment
from amaranth.lib import fifo
from amaranth.sim import Simulator

from qaccel.rtl.nbits.row_quantizer import RowQuantizer
from qaccel.sim.streams import CreditError, OccupancyMonitor, burst_pauses
from tests.rtl.mutants import mutant
from tests.rtl.nbits.test_row_quantizer import Run, check, random_rows

#: Cycles a long stall lasts beyond what fills the unit.
MARGIN = 8
#: (old, new) in RowQuantizer.elaborate.
MUTANTS = {
    "off_by_one": ("(reserved != _OUT_DEPTH)", "(reserved != _OUT_DEPTH + 1)"),
    "ignored": ("(reserved != _OUT_DEPTH)", "1"),
    "early_release": ("q_done = q.valid & q.ready", "q_done = q.ready"),
}
#: Two jobs of 3 and 2 rows (blocks of 16 and 32): more q beats than the FIFO holds.
JOBS = [((3, 40), 16), ((2, 70), 32)]


class Overrun(AssertionError):
    """A FIFO written while full."""


def stalls(stall: int, rng: random.Random):
    """``stall`` paused cycles, then a random run of 1..``stall`` with 30 % pauses, repeating."""
    while True:
        yield from [True] * stall
        for _ in range(rng.randint(1, stall)):
            yield rng.random() < 0.3


def out_fifo(fragment: Fragment) -> fifo.SyncFIFOBuffered:
    """The row quantizer's ``q`` FIFO in its elaborated design."""
    for sub, name, *_ in fragment.subfragments:
        if name == "out":
            found = [o for o in sub.origins if isinstance(o, fifo.SyncFIFOBuffered)]
            if found:
                return found[0]
    raise AssertionError("RowQuantizer no longer has a SyncFIFOBuffered 'out': update the test")


def long_stalls(unit: RowQuantizer, jobs, *, seed: int):
    """Run ``jobs`` (``(A, block_size)``) back to back under long stalls; return the
    :class:`~tests.rtl.nbits.test_row_quantizer.Run`, the FIFO's highest level and the cycles
    it was full. Raises :exc:`Overrun` the cycle the FIFO is written while full."""
    rng = random.Random(seed)
    depth = unit.out_depth
    stall, starve = depth + unit.latency + MARGIN, unit.latency + MARGIN
    q_pause, a_pause = stalls(stall, rng), stalls(starve, rng)
    fragment = Fragment.get(unit, None)
    out = out_fifo(fragment)
    run = Run()
    high = full = 0

    async def tb(ctx):
        nonlocal high, full
        cycle = 0
        for A, bs in jobs:
            rows, k = A.shape
            words = A.view(np.uint32).reshape(-1)
            n_q, n_blk = unit.q_beats(k, rows, bs), unit.blk_beats(k, rows, bs)
            q, blk = [], []
            ctx.set(unit.block_size, bs)
            ctx.set(unit.k, k)
            ctx.set(unit.rows, rows)
            ctx.set(unit.start, 1)
            await ctx.tick()
            ctx.set(unit.start, 0)
            held = stall                                   # a stall at the job's start
            sent, a_on = 0, False
            while len(q) < n_q or len(blk) < n_blk or ctx.get(unit.busy):
                if not a_on and sent < len(words) and not next(a_pause):
                    a_on = True
                    ctx.set(unit.a.payload, int(words[sent]))
                ctx.set(unit.a.valid, a_on)
                q_rdy = not (held or next(q_pause))
                held = max(0, held - 1)
                ctx.set(unit.q.ready, q_rdy)
                ctx.set(unit.blk.ready, 1)
                if ctx.get(out.w_en) and not ctx.get(out.w_rdy):
                    raise Overrun(f"q FIFO written while full ({depth} beats) at cycle {cycle}")
                level = ctx.get(out.level)
                high = max(high, level)
                full += level == depth
                if a_on and ctx.get(unit.a.ready):
                    sent, a_on = sent + 1, False
                if ctx.get(unit.q.valid) and q_rdy:
                    p = ctx.get(unit.q.payload)
                    q.append((int(p.qa), int(p.block_last), int(p.row_last), 0))
                if ctx.get(unit.blk.valid):
                    p = ctx.get(unit.blk.payload)
                    blk.append((int(p.sa), int(p.asum)))
                await ctx.tick()
                cycle += 1
                assert cycle < 200_000, "stalled"
            ctx.set(unit.a.valid, 0)
            run.q.append(np.array(q, np.int64).reshape(-1, 4))
            run.blk.append(np.array(blk, np.int64).reshape(-1, 2))
        run.cycles = cycle

    sim = Simulator(fragment)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    return run, high, full


def make_jobs(seed: int):
    rng = np.random.default_rng(seed)
    return [(random_rows(rng, rows, k, bs), bs) for (rows, k), bs in JOBS]


def test_row_quantizer_long_stalls():
    unit = RowQuantizer(max_block=32)
    jobs = make_jobs(5)
    assert sum(unit.q_beats(A.shape[1], A.shape[0], bs) for A, bs in jobs) > 2 * unit.out_depth
    run, high, full = long_stalls(unit, jobs, seed=5)
    check(run, jobs)
    assert high == unit.out_depth and full > 0, (high, full)
    print(f"\nrow quantizer: q FIFO {high} of {unit.out_depth}, full {full} cycles, "
          f"{run.cycles} cycles")


@pytest.mark.parametrize("kind", list(MUTANTS))
def test_row_quantizer_mutant_fails(kind):
    unit = mutant(RowQuantizer, *MUTANTS[kind], name=f"RowQuantizer_{kind}")(max_block=32)
    jobs = make_jobs(5)
    with pytest.raises(Overrun) as info:
        long_stalls(unit, jobs, seed=5)
    print(f"\n{kind}: {info.value}")


# ---------------------------------------------------------------------------------------------
# The cocotb agents' stall patterns and occupancy monitor (plain Python: fake handles)


class FakeValue:
    def __init__(self, v):
        self.v = v
        self.is_resolvable = v is not None

    def __int__(self):
        return self.v

    def __str__(self):
        return "x" if self.v is None else str(self.v)


class FakeSignal:
    def __init__(self, v=0):
        self.value = FakeValue(v)

    def set(self, v):
        self.value = FakeValue(v)


class FakeFifo:
    def __init__(self):
        self.w_en, self.r_en, self.r_rdy = FakeSignal(), FakeSignal(), FakeSignal()


def test_burst_pauses():
    rng = random.Random(1)
    got = list(itertools.islice(burst_pauses(5, rng=rng, run=(2, 3), probability=0.0), 40))
    runs = [(k, len(list(g))) for k, g in itertools.groupby(got)]
    assert all(n == 5 for k, n in runs[:-1] if k) and all(2 <= n <= 3 for k, n in runs[:-1]
                                                           if not k), runs
    for kwargs, match in [({"stall": 0}, "stall"), ({"stall": 2, "run": (0, 1)}, "run"),
                          ({"stall": 2, "run": (3, 2)}, "run"),
                          ({"stall": 2, "probability": 1.0}, "probability")]:
        with pytest.raises(ValueError, match=match):
            next(burst_pauses(rng=rng, **kwargs))


def test_occupancy_monitor():
    fifo = FakeFifo()
    inside = [0]
    mon = OccupancyMonitor(inside=lambda: inside[0], limit=2, fifos={"f": (fifo, 2)})
    fifo.w_en.set(1)
    for cycle in range(2):                       # two writes, nothing read
        inside[0] = cycle + 1
        mon.sample(cycle)
    assert mon.reached() == {"beats inside": True, "f": True}
    mon.check_reached()
    fifo.r_en.set(1)                             # r_en without r_rdy: no read
    with pytest.raises(CreditError, match=r"f: 3 at cycle 2, outside 0\.\.2"):
        mon.sample(2)
    assert mon.summary()["f"] == {"limit": 2, "high": 2, "full_cycles": 1}
    fresh = OccupancyMonitor(fifos={"f": (FakeFifo(), 4)})
    fresh.sample(0)
    with pytest.raises(AssertionError, match="f reached 0 of 4"):
        fresh.check_reached()
    bad = FakeFifo()
    bad.w_en.set(None)
    with pytest.raises(CreditError, match="a FIFO port is x"):
        OccupancyMonitor(fifos={"f": (bad, 4)}).sample(0)
    for kwargs, match in [({}, "nothing to monitor"), ({"limit": 3}, "together"),
                          ({"inside": int, "limit": 0}, "limit"),
                          ({"fifos": {"f": (fifo, 0)}}, "depth of FIFO 'f'")]:
        with pytest.raises(ValueError, match=match):
            OccupancyMonitor(**kwargs)
