"""cocotb testbench for :class:`qaccel.rtl.arith.saturate.Saturate`; run it with qaccel.sim.runner.

Parameters (``qaccel.sim.tbconfig.params()``): ``in_width``, ``bits``, ``signed`` and the
stated ``latency`` of the component; ``beats`` (random test), ``throughput_beats``, ``idle``
and ``backpressure`` (pause probabilities per cycle), ``max_burst`` (longest pause),
``watchdog`` (stall timeout in cycles) and ``seed``. Each test records ``beats``, ``cycles``,
``seconds`` and its measurements through ``tbconfig.record``.
"""

from __future__ import annotations

import logging
import random
import time

import cocotb

from qaccel.sim import tbconfig
from qaccel.sim.scoreboard import Scoreboard
from qaccel.sim.streams import (
    CycleLoop,
    StallError,
    StreamDriver,
    StreamMonitor,
    StreamPort,
    StreamSink,
    Watchdog,
    cycle_pauses,
    no_pauses,
    random_pauses,
)
from qaccel.sim.tb import reset, start_clock

log = logging.getLogger("cocotb.qaccel.tb_saturate")

DEFAULTS = {
    "beats": 2000,
    "throughput_beats": 1000,
    "idle": 0.3,
    "backpressure": 0.3,
    "max_burst": 4,
    "watchdog": 1000,
    "seed": None,
}


def target_range(bits: int, signed: bool) -> tuple[int, int]:
    """Return the output range, written out independently of the RTL."""
    if signed:
        return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    return 0, 2**bits - 1


def saturate(x: int, lo: int, hi: int) -> int:
    """Reference model: clamp ``x`` to ``[lo, hi]``."""
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def stimulus(rng: random.Random, n: int, in_width: int, lo: int, hi: int) -> list[int]:
    """Return at least ``n`` inputs: every edge first, then a random mix stressing the edges.

    Edges: ``lo``, ``hi``, one beyond each, one inside each, the extremes of the input width
    and 0/±1 (those representable in ``in_width`` bits). The random part mixes uniform inputs,
    in-range inputs and values within 4 of an edge, and repeats the edge list now and then.
    """
    in_lo, in_hi = -(2 ** (in_width - 1)), 2 ** (in_width - 1) - 1
    edges = [lo, hi, lo - 1, hi + 1, lo + 1, hi - 1, in_lo, in_hi, in_lo + 1, in_hi - 1, 0, 1, -1]
    edges = [e for e in dict.fromkeys(edges) if in_lo <= e <= in_hi]
    anchors = [e for e in (lo, hi, in_lo, in_hi, 0) if in_lo <= e <= in_hi]
    pass_lo, pass_hi = max(lo, in_lo), min(hi, in_hi)
    values = list(edges)
    while len(values) < n:
        r = rng.random()
        if r < 0.01:
            values.extend(rng.sample(edges, len(edges)))
        elif r < 0.4:
            values.append(rng.randint(in_lo, in_hi))
        elif r < 0.7:
            values.append(rng.randint(pass_lo, pass_hi))
        else:
            v = rng.choice(anchors) + rng.randint(-4, 4)
            values.append(min(max(v, in_lo), in_hi))
    return values[: max(n, len(edges))]


class SaturateTB:
    """Clock, reset, driver, sink, monitors, scoreboard and watchdog around one DUT."""

    def __init__(self, dut, params: dict, *, idle=None, backpressure=None, watchdog=None):
        self.dut = dut
        self.params = params
        self.lo, self.hi = target_range(params["bits"], params["signed"])
        self.i = StreamPort(dut, "i", signed=True)
        self.o = StreamPort(dut, "o", signed=params["signed"])
        assert self.i.width == params["in_width"], f"i__payload is {self.i.width} bits"
        assert self.o.width == params["bits"], f"o__payload is {self.o.width} bits"
        self.driver = StreamDriver(self.i, pauses=idle)
        self.sink = StreamSink(self.o, pauses=backpressure)
        self.board = Scoreboard(lambda x: saturate(x, self.lo, self.hi), name="o")
        self.in_mon = StreamMonitor(self.i, self.board.add_input)
        self.out_mon = StreamMonitor(self.o, self.board.add_output)
        self.watchdog = Watchdog(
            watchdog or params["watchdog"],
            (self.out_mon, lambda: self.board.pending),
            (self.in_mon, lambda: self.driver.pending),
        )
        self.loop = CycleLoop(
            dut.clk, self.driver, self.sink, self.in_mon, self.out_mon, self.watchdog
        )

    async def start(self) -> None:
        self.dut.i__valid.value = 0
        self.dut.i__payload.value = 0
        self.dut.o__ready.value = 0
        start_clock(self.dut)
        await reset(self.dut)

    async def run(self, values: list[int], *, drain: int = 16) -> dict:
        """Send ``values``, wait for every output, then ``drain`` more cycles; check all."""
        n = len(values)
        self.driver.send(values)
        t0 = time.perf_counter()
        cycles = await self.loop.run(
            until=lambda: self.out_mon.count >= n and self.driver.pending == 0,
            max_cycles=1000 * (n + 10),
        )
        cycles += await self.loop.run(cycles=drain)
        seconds = time.perf_counter() - t0
        self.board.check_done()
        assert self.in_mon.count == n, f"{self.in_mon.count} beats accepted on 'i', sent {n}"
        assert self.out_mon.count == n, f"{self.out_mon.count} beats seen on 'o', sent {n}"
        clamped_lo = sum(v < self.lo for v in values)
        clamped_hi = sum(v > self.hi for v in values)
        return {
            "beats": n,
            "cycles": cycles,
            "seconds": round(seconds, 4),
            "beats_per_second": round(n / seconds, 1),
            "cycles_per_second": round(cycles / seconds, 1),
            "min_latency": self.board.checker.min_latency,
            "max_latency": self.board.checker.max_latency,
            "clamped_low": clamped_lo,
            "clamped_high": clamped_hi,
            "passed_through": n - clamped_lo - clamped_hi,
        }


def _params() -> tuple[dict, random.Random]:
    params = {**DEFAULTS, **tbconfig.params()}
    seed = params["seed"] if params["seed"] is not None else cocotb.RANDOM_SEED
    params["seed"] = seed
    log.info("tb_saturate params %s", params)
    return params, random.Random(seed)


@cocotb.test()
async def test_random_stream(dut):
    """Random beats with random idle cycles and back-pressure: every beat checked in order."""
    params, rng = _params()
    tb = SaturateTB(
        dut,
        params,
        idle=random_pauses(params["idle"], rng=rng, max_burst=params["max_burst"]),
        backpressure=random_pauses(params["backpressure"], rng=rng,
                                   max_burst=params["max_burst"]),
    )
    await tb.start()
    values = stimulus(rng, params["beats"], params["in_width"], tb.lo, tb.hi)
    result = await tb.run(values)
    assert result["min_latency"] >= params["latency"], (
        f"a beat left after {result['min_latency']} cycles, stated latency {params['latency']}"
    )
    if tb.lo - 1 >= -(2 ** (params["in_width"] - 1)):
        assert result["clamped_low"] > 0, "stimulus never saturated low"
    if tb.hi + 1 <= 2 ** (params["in_width"] - 1) - 1:
        assert result["clamped_high"] > 0, "stimulus never saturated high"
    tbconfig.record("test_random_stream", seed=params["seed"], **result)


@cocotb.test()
async def test_throughput(dut):
    """No idle cycles or back-pressure: >= 0.99 beats/cycle sustained, the stated latency."""
    params, rng = _params()
    tb = SaturateTB(dut, params, idle=no_pauses(), backpressure=no_pauses())
    await tb.start()
    values = stimulus(rng, params["throughput_beats"], params["in_width"], tb.lo, tb.hi)
    result = await tb.run(values)
    n = len(values)
    # Sustained rate: beats over the span of handshakes on each stream (independent of n and
    # of the pipeline fill); end_to_end also counts the latency and is only recorded.
    rate_in, rate_out = tb.in_mon.beats_per_cycle(), tb.out_mon.beats_per_cycle()
    end_to_end = n / (tb.out_mon.last_cycle - tb.in_mon.first_cycle + 1)
    assert min(rate_in, rate_out) >= 0.99, (
        f"{rate_in:.4f} beats/cycle accepted on 'i', {rate_out:.4f} delivered on 'o' ({n} beats)"
    )
    assert result["min_latency"] == result["max_latency"] == params["latency"], (
        f"latency {result['min_latency']}..{result['max_latency']} cycles, "
        f"stated {params['latency']}"
    )
    tbconfig.record(
        "test_throughput",
        beats_per_cycle=round(min(rate_in, rate_out), 5),
        end_to_end_beats_per_cycle=round(end_to_end, 5),
        latency=result["min_latency"],
        **result,
    )


@cocotb.test()
async def test_watchdog_names_stalled_stream(dut):
    """A sink that never becomes ready makes the watchdog fail naming stream 'o'."""
    params, rng = _params()
    timeout = 50
    tb = SaturateTB(dut, params, backpressure=cycle_pauses((1,)), watchdog=timeout)
    await tb.start()
    tb.driver.send([0, 1, 2, 3])
    try:
        await tb.loop.run(until=lambda: tb.out_mon.count >= 4, max_cycles=10 * timeout)
    except StallError as e:
        message = str(e)
    else:
        raise AssertionError("the watchdog did not fire on a stalled output stream")
    assert "stream 'o' stalled" in message and "valid=1 ready=0" in message, message
    tbconfig.record("test_watchdog_names_stalled_stream", message=message)
