# amaranth: UnusedElaboratable=no
"""Fast checks of Saturate and emit_verilog with Amaranth's Python simulator."""

from __future__ import annotations

import random

import pytest
from amaranth.hdl import Fragment, Shape
from amaranth.sim import Simulator

from qaccel.model.dtypes import QTYPES
from qaccel.rtl.arith.saturate import Saturate
from qaccel.rtl.verilog import emit_verilog


def reference(x: int, bits: int, signed: bool) -> int:
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    return min(max(x, lo), hi)


def simulate(dut: Saturate, values, *, idle=None, stall=None, drain: int = 8):
    """Stream ``values`` through ``dut``; return (accept cycles, [(output, cycle)], cycles).

    ``idle(cycle)`` / ``stall(cycle)`` say when the source withholds ``valid`` (between beats
    only) and when the sink withholds ``ready``. Also checks the stream rules on ``o``: once
    valid, it stays valid with the same payload until accepted.
    """
    idle = idle or (lambda c: False)
    stall = stall or (lambda c: False)
    accepted: list[int] = []
    produced: list[tuple[int, int]] = []
    state = {"cycles": 0}

    async def testbench(ctx):
        pending = list(values)
        holding = False
        held = None  # (payload) of an offered but not accepted output beat
        cycle = 0
        extra = 0
        while len(produced) < len(values) or extra < drain:
            if len(produced) >= len(values):
                extra += 1
            assert cycle < 20 * (len(values) + 10), "stalled"
            if not holding and pending and not idle(cycle):
                holding = True
            ctx.set(dut.i.valid, holding)
            if holding:
                ctx.set(dut.i.payload, pending[0])
            ctx.set(dut.o.ready, not stall(cycle))
            _, _, i_valid, i_ready, o_valid, o_ready, o_payload = await ctx.tick().sample(
                dut.i.valid, dut.i.ready, dut.o.valid, dut.o.ready, dut.o.payload
            )
            if held is not None:
                assert o_valid, f"o.valid dropped at cycle {cycle} before its beat was taken"
                assert o_payload == held, f"o.payload changed at cycle {cycle} while stalled"
            held = o_payload if (o_valid and not o_ready) else None
            if i_valid and i_ready:
                accepted.append(cycle)
                pending.pop(0)
                holding = False
            if o_valid and o_ready:
                produced.append((o_payload, cycle))
            cycle += 1
        state["cycles"] = cycle

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    return accepted, produced, state["cycles"]


def check(dut: Saturate, values, **kwargs):
    accepted, produced, cycles = simulate(dut, values, **kwargs)
    assert len(accepted) == len(values), f"{len(accepted)} of {len(values)} inputs accepted"
    assert len(produced) == len(values), f"{len(produced)} outputs for {len(values)} inputs"
    for k, (x, (y, cycle)) in enumerate(zip(values, produced, strict=True)):
        want = reference(x, dut.bits, dut.signed)
        assert y == want, f"beat {k} (cycle {cycle}): {x} -> {y}, expected {want}"
    latencies = [out - acc for acc, (_, out) in zip(accepted, produced, strict=True)]
    assert min(latencies) >= dut.latency
    return latencies, cycles


def input_range(in_width: int) -> range:
    return range(-(2 ** (in_width - 1)), 2 ** (in_width - 1))


# --- parameters -----------------------------------------------------------------------------


def test_saturate_ports_and_properties():
    dut = Saturate(12, bits=8, signed=True)
    assert (dut.in_width, dut.bits, dut.signed) == (12, 8, True)
    assert (dut.qmin, dut.qmax, dut.latency) == (-128, 127, 1)
    assert Shape.cast(dut.i.payload.shape()) == Shape(12, signed=True)
    assert Shape.cast(dut.o.payload.shape()) == Shape(8, signed=True)
    assert Shape.cast(Saturate(5, bits=3, signed=False).o.payload.shape()) == Shape(3)
    with pytest.raises(AttributeError):
        dut.latency = 2


@pytest.mark.parametrize(
    "name", [n for n, q in QTYPES.items() if q.is_int and q.bits <= 16]
)
def test_saturate_range_matches_qtype(name):
    q = QTYPES[name]
    dut = Saturate.from_qtype(q, in_width=20)
    assert (dut.bits, dut.signed, dut.qmin, dut.qmax) == (q.bits, q.signed, q.qmin, q.qmax)
    Fragment.get(dut, None)  # elaborates


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"in_width": "8", "bits": 4}, TypeError, r"in_width must be an integer, not '8'"),
        ({"in_width": True, "bits": 4}, TypeError, r"in_width must be an integer, not True"),
        ({"in_width": 1, "bits": 4}, ValueError, r"in_width must be in \[2, 64\], not 1"),
        ({"in_width": 65, "bits": 4}, ValueError, r"in_width must be in \[2, 64\], not 65"),
        ({"in_width": 8, "bits": 4.0}, TypeError, r"bits must be an integer, not 4\.0"),
        ({"in_width": 8, "bits": 1}, ValueError, r"bits must be in \[2, 16\], not 1"),
        ({"in_width": 8, "bits": 17}, ValueError, r"bits must be in \[2, 16\], not 17"),
        ({"in_width": 8, "bits": 4, "signed": 1}, TypeError, r"signed must be a bool, not 1"),
    ],
)
def test_saturate_parameter_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        Saturate(**kwargs)


@pytest.mark.parametrize("name", ["float8e4m3fn", "int32"])
def test_saturate_from_qtype_errors(name):
    q = QTYPES[name]
    error = TypeError if q.kind == "float" else ValueError
    match = r"qtype must be an integer QType" if q.kind == "float" else r"bits must be in"
    with pytest.raises(error, match=match):
        Saturate.from_qtype(q, in_width=32)


# --- behaviour ------------------------------------------------------------------------------


@pytest.mark.parametrize(("in_width", "bits", "signed"), [(6, 4, True), (6, 4, False),
                                                          (5, 2, True), (4, 8, False)])
def test_saturate_exhaustive_full_rate(in_width, bits, signed):
    """Every input value, no pauses: exact values, latency 1, one beat per cycle."""
    dut = Saturate(in_width, bits=bits, signed=signed)
    values = list(input_range(in_width))
    latencies, cycles = check(dut, values)
    assert set(latencies) == {dut.latency}
    assert cycles == len(values) + dut.latency + 8  # 8 drain cycles


@pytest.mark.parametrize("seed", [1, 2])
def test_saturate_backpressure(seed):
    """Random idle cycles and back-pressure, with long stalls: nothing lost or duplicated."""
    rng = random.Random(seed)
    dut = Saturate(10, bits=6, signed=seed == 1)
    values = [rng.choice(input_range(10)) for _ in range(300)]
    idle = [rng.random() < 0.3 for _ in range(3000)]
    stall = [rng.random() < (0.9 if (c // 50) % 4 == 3 else 0.3) for c in range(3000)]
    check(dut, values, idle=idle.__getitem__, stall=stall.__getitem__)


def test_saturate_alternating_stall():
    """A sink ready every other cycle limits throughput to 1/2, never loses a beat."""
    dut = Saturate(8, bits=4, signed=True)
    values = list(range(-128, 128, 3))
    _, produced, _ = simulate(dut, values, stall=lambda c: c % 2 == 0)
    cycles = [c for _, c in produced]
    assert all(b - a == 2 for a, b in zip(cycles, cycles[1:], strict=False))


# --- Verilog --------------------------------------------------------------------------------


def test_emit_verilog_ports(tmp_path):
    path = tmp_path / "sub" / "saturate.v"
    text = emit_verilog(Saturate(12, bits=8), "saturate", path)
    assert path.read_text() == text
    assert "module saturate(" in text
    for port in ("clk", "rst", "i__payload", "i__valid", "i__ready",
                 "o__payload", "o__valid", "o__ready"):
        assert port in text
    assert "input [11:0] i__payload;" in text and "output [7:0] o__payload;" in text
    mtime = path.stat().st_mtime_ns
    emit_verilog(Saturate(12, bits=8), "saturate", path)
    assert path.stat().st_mtime_ns == mtime, "unchanged Verilog must not be rewritten"


def test_emit_verilog_errors():
    with pytest.raises(ValueError, match=r"name must be a Verilog identifier, not 'a b'"):
        emit_verilog(Saturate(8, bits=4), "a b")
    with pytest.raises(TypeError, match=r"component must be an amaranth wiring.Component"):
        emit_verilog(object(), "x")
