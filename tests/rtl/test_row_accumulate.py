"""RowAccumulate (the engine's float32 row accumulator) on Verilator against the order of
model/nbits_hw.py in NumPy float32 arithmetic: random rows of 1..40 terms with idle cycles
and back-pressure, for 1, 3 and 8 partial sums; its throughput (one term per cycle across
row boundaries), the fold-bound rate of short rows, and the latency without pauses."""

from __future__ import annotations

import numpy as np
import pytest

from qaccel.rtl.row_accumulate import RowAccumulate
from qaccel.sim.runner import missing_simulator
from qaccel.sim.streamsim import StreamSim

pytestmark = [pytest.mark.sim,
              pytest.mark.skipif(missing_simulator("verilator") is not None,
                                 reason=missing_simulator("verilator") or "")]

F32 = np.float32
PE = 2
_SIMS: dict[int, tuple[RowAccumulate, StreamSim]] = {}


def accumulator(sums: int):
    if sums not in _SIMS:
        unit = RowAccumulate(pe=PE, partial_sums=sums)
        _SIMS[sums] = unit, StreamSim(unit, name=f"row_accumulate_pe{PE}_s{sums}")
    return _SIMS[sums]


def rows(rng, n_rows):
    """Random rows: terms (n, PE) float32 with mixed magnitudes and a few specials; bias."""
    out = []
    for _ in range(n_rows):
        n = int(rng.integers(1, 41))
        t = (rng.standard_normal((n, PE)) * 2.0 ** rng.integers(-10, 10, (n, PE))).astype(F32)
        special = rng.random((n, PE)) < 0.01
        t[special] = rng.choice(np.array([0.0, -0.0, np.inf, 1e-45], F32), special.sum())
        bias = rng.standard_normal(PE).astype(F32)
        out.append((t, bias))
    return out


def reference(terms, bias, sums):
    """The int8 path's order: term b into partial sum b % sums, fold, + bias."""
    part = np.zeros((sums, PE), F32)
    with np.errstate(all="ignore"):
        for b, t in enumerate(terms):
            part[b % sums] = part[b % sums] + t
        total = part[0]
        for r in range(1, sums):
            total = total + part[r]
        return total + bias


def beats(data):
    """Input beats as StreamSim words: t (PE x 32 bits), bias (PE x 32), row_last."""
    words = []
    for terms, bias in data:
        for b, t in enumerate(terms):
            v = 0
            for p in range(PE):
                v |= int(t[p].view(np.uint32)) << (32 * p)
                v |= int(bias[p].view(np.uint32)) << (32 * (PE + p))
            v |= int(b == len(terms) - 1) << (64 * PE)
            words.append([(v >> (64 * w)) & ((1 << 64) - 1) for w in range(3)])
    return np.array(words, np.uint64)


def outputs(res):
    y = np.asarray(res.outputs["o"]).astype(np.uint64)
    return np.stack([(y >> np.uint64(32 * p)) & np.uint64(0xFFFFFFFF) for p in range(PE)],
                    axis=1).astype(np.uint32).view(F32)


@pytest.mark.parametrize("sums", [1, 3, 8])
def test_rows_match_the_order_under_pauses(sums):
    unit, sim = accumulator(sums)
    rng = np.random.default_rng(sums)
    data = rows(rng, 300)
    res = sim.run({"i": beats(data)}, idle=0.3, backpressure=0.3, seed=sums)
    assert len(res.accepted["i"]) == sum(len(t) for t, _ in data)   # every term taken once
    got = outputs(res)                                                # one y per row, in order
    want = np.array([reference(t, b, sums) for t, b in data])
    assert got.shape == want.shape
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def test_throughput_and_latency():
    unit, sim = accumulator(8)
    assert unit.row_gap == 0 and unit.fold_cycles == 64
    rng = np.random.default_rng(5)
    one = rows(rng, 1)
    res = sim.run({"i": beats(one)})
    assert res.output_cycles["o"][0] - res.accepted["i"][-1] == unit.latency == 73
    # rows as long as the fold: one term per cycle across the row boundaries
    long_rows = [(rng.standard_normal((n, PE)).astype(F32), rng.standard_normal(PE).astype(F32))
                 for n in (64, 64, 200, 64, 100, 64, 64)]
    res = sim.run({"i": beats(long_rows)})
    acc = res.accepted["i"]
    assert len(acc) == sum(len(t) for t, _ in long_rows)
    assert acc[-1] - acc[0] + 1 == len(acc)                  # 1.0 term per cycle
    assert np.array_equal(np.diff(res.output_cycles["o"]),
                          np.diff(np.cumsum([len(t) for t, _ in long_rows])))
    got = outputs(res)
    want = np.array([reference(t, b, 8) for t, b in long_rows])
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_short_rows_wait_for_the_fold():
    """Rows shorter than the fold: one row per fold_cycles on average, nothing lost."""
    unit, sim = accumulator(8)
    rng = np.random.default_rng(6)
    data = [(rng.standard_normal((n, PE)).astype(F32), rng.standard_normal(PE).astype(F32))
            for n in [1] * 12 + [20] * 6]
    res = sim.run({"i": beats(data)})
    assert len(res.accepted["i"]) == sum(len(t) for t, _ in data)
    out = res.output_cycles["o"]
    assert len(out) == len(data)
    assert np.all(np.diff(out) == unit.fold_cycles)          # the fold is the bottleneck
    got = outputs(res)
    want = np.array([reference(t, b, 8) for t, b in data])
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("sums", [1, 3])
def test_few_partial_sums_rate(sums):
    """With partial_sums < 8 a row takes its terms in groups of partial_sums every 8 cycles;
    the next row starts at once in the other bank."""
    unit, sim = accumulator(sums)
    n = 8 * sums * 3
    data = [(np.ones((n, PE), F32), np.zeros(PE, F32)) for _ in range(3)]
    res = sim.run({"i": beats(data)})
    acc = np.asarray(res.accepted["i"])
    for r in range(3):
        row = acc[r * n:(r + 1) * n]
        # the last group's terms are taken back to back: (n/sums - 1) * 8 + sums cycles
        assert row[-1] - row[0] + 1 == (n // sums - 1) * 8 + sums
    # no gap at the row boundaries beyond the partial-sum reuse
    assert np.all(acc[n::n] - acc[n - 1::n][:2] == 1)
    np.testing.assert_array_equal(outputs(res), np.full((3, PE), n, F32))


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"pe": 0, "partial_sums": 8}, "pe must be in"),
    ({"pe": 2, "partial_sums": 17}, "partial_sums must be in"),
])
def test_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RowAccumulate(**kwargs)
