"""RowAccumulate (the engine's float32 row accumulator) on Verilator against the order of
model/nbits_hw.py in NumPy float32 arithmetic: random rows of 1..40 terms with idle cycles
and back-pressure, for 1, 3 and 8 partial sums; its throughput and latency without pauses."""

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
    got = outputs(res)
    want = np.array([reference(t, b, sums) for t, b in data])
    assert got.shape == want.shape
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def test_throughput_and_latency():
    unit, sim = accumulator(8)
    rng = np.random.default_rng(5)
    one = rows(rng, 1)
    res = sim.run({"i": beats(one)})
    assert res.output_cycles["o"][0] - res.accepted["i"][-1] == unit.latency
    long_rows = [(np.ones((200, PE), F32), np.zeros(PE, F32)) for _ in range(4)]
    res = sim.run({"i": beats(long_rows)})
    span = res.accepted["i"][-1] - res.accepted["i"][0] + 1
    # one term per cycle, plus the drain of each row's last additions before the next row
    assert span == 800 + 3 * unit.row_gap, (span, unit.row_gap)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"pe": 0, "partial_sums": 8}, "pe must be in"),
    ({"pe": 2, "partial_sums": 17}, "partial_sums must be in"),
])
def test_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RowAccumulate(**kwargs)
