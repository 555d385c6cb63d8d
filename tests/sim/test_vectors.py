# amaranth: UnusedElaboratable=no
"""The Verilator vector loop: a registered probe block on 1M vectors, errors, the build cache."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
from amaranth.hdl import Module, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from qaccel.sim import vectors
from qaccel.sim.runner import missing_simulator
from qaccel.sim.vectors import VectorSim, join_fields, run_vectors, split_fields

pytestmark = [
    pytest.mark.sim,
    pytest.mark.skipif(missing_simulator("verilator") is not None,
                       reason=missing_simulator("verilator") or ""),
]

WIDE = 100


class Probe(wiring.Component):
    """Registered (latency 1): ``s = a + b``, ``s_valid = valid``, ``w1 = w + 1`` (wraps),
    ``d = a - b`` as a signed 17-bit value, and ``cnt`` counting cycles since reset."""

    def __init__(self):
        super().__init__({
            "a": In(16), "b": In(16), "valid": In(1), "w": In(WIDE),
            "s": Out(17), "s_valid": Out(1), "w1": Out(WIDE), "d": Out(signed(17)),
            "cnt": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        m.d.sync += [
            self.s.eq(self.a + self.b),
            self.s_valid.eq(self.valid),
            self.w1.eq(self.w + 1),
            self.d.eq(self.a - self.b),
            self.cnt.eq(self.cnt + 1),
        ]
        return m


class Pair(wiring.Component):
    """Combinational (no clock): a payload struct in, ``o = x ^ y`` and ``neg = -x`` out."""

    def __init__(self):
        super().__init__({"i": In(data.StructLayout({"x": unsigned(8), "y": signed(8)})),
                          "o": Out(8), "neg": Out(signed(9))})

    def elaborate(self, platform):
        m = Module()
        m.d.comb += [self.o.eq(self.i.x ^ self.i.y), self.neg.eq(-self.i.x)]
        return m


@pytest.fixture(scope="module")
def probe() -> VectorSim:
    return VectorSim(Probe(), name="vectors_probe")


def wide_words(values: list[int]) -> np.ndarray:
    return np.array([[(v >> 64 * k) & (2**64 - 1) for k in range(2)] for v in values],
                    dtype=np.uint64)


def test_vectors_probe_1m(probe):
    """One million random vectors through a registered adder, checked against NumPy."""
    n = 1_000_000
    rng = np.random.default_rng(2024)
    a = rng.integers(0, 2**16, n, dtype=np.uint16)
    b = rng.integers(0, 2**16, n, dtype=np.uint16)
    valid = rng.integers(0, 2, n).astype(bool)
    out = probe.run({"a": a, "b": b, "valid": valid}, latency=1)  # bool array, 1-bit port
    assert set(out) == {"s", "s_valid", "w1", "d", "cnt"}
    assert out["s"].dtype == np.uint32 and out["s"].shape == (n,)
    np.testing.assert_array_equal(out["s"], a.astype(np.uint32) + b)
    np.testing.assert_array_equal(out["s_valid"], valid)
    # Reset was held: the counter restarts at 0 and reaches 1 at the first sample.
    np.testing.assert_array_equal(out["cnt"], np.arange(1, n + 1, dtype=np.uint32))
    d = out["d"].astype(np.int64)
    np.testing.assert_array_equal(np.where(d >= 2**16, d - 2**17, d),
                                  a.astype(np.int64) - b)
    stats = probe.last_run
    assert stats.vectors == n and stats.cycles == n + 1 + vectors.RESET_CYCLES
    assert stats.vectors_per_second > 5e5  # >= 5e6 unloaded; keep slack for a busy machine


def test_vectors_latency_and_reset(probe):
    """Outputs sampled ``latency`` cycles later; reset_cycles does not move the counter."""
    a = np.arange(10, dtype=np.uint16)
    for latency in (1, 2, 5):
        out = probe.run({"a": a, "b": 3}, latency=latency, outputs=["s", "cnt"], reset_cycles=0)
        assert set(out) == {"s", "cnt"}
        # Sampled after `latency` edges: s holds the vector applied latency-1 cycles later
        # (inputs hold their last value after the last vector).
        shifted = np.minimum(np.arange(10) + latency - 1, 9)
        np.testing.assert_array_equal(out["s"], shifted + 3)
        np.testing.assert_array_equal(out["cnt"], np.arange(10) + latency)


def test_vectors_wide_and_signed_inputs(probe):
    values = [0, 1, 2**64 - 1, 2**64, 2**WIDE - 1, 0x1234_5678_9ABC_DEF0_1122_3344_5]
    out = probe.run({"w": wide_words(values), "a": np.array([-1, 0, 1, -32768, 65535, 7]),
                     "b": -1}, latency=1, outputs=["w1", "s"])
    assert out["w1"].shape == (len(values), 2) and out["w1"].dtype == np.uint64
    np.testing.assert_array_equal(out["w1"], wide_words([(v + 1) % 2**WIDE for v in values]))
    np.testing.assert_array_equal(out["s"], [0xFFFF + 0xFFFF, 0xFFFF, 0x10000, 0x8000 + 0xFFFF,
                                             0xFFFF + 0xFFFF, 7 + 0xFFFF])
    const = probe.run({"a": np.zeros(3, np.uint8), "w": 2**WIDE - 2, "valid": True}, latency=1,
                      outputs=["w1", "s_valid"])
    np.testing.assert_array_equal(const["w1"], wide_words([2**WIDE - 1] * 3))
    np.testing.assert_array_equal(const["s_valid"], [1, 1, 1])


def test_vectors_empty_run(probe):
    out = probe.run({"a": np.zeros(0, np.uint16)}, latency=1, outputs=["s"])
    assert out["s"].shape == (0,)


def test_vectors_port_errors(probe):
    a = np.zeros(4, np.uint16)
    with pytest.raises(ValueError, match=r"vectors_probe has no input port 'x'; its inputs are: "
                                         r".*a \(16 bits\).*w \(100 bits\)"):
        probe.run({"x": a}, latency=1)
    with pytest.raises(ValueError, match=r"no input port 's'"):
        probe.run({"s": a}, latency=1)
    with pytest.raises(ValueError, match=r"no output port 'sum'; its outputs are: .*s \(17 bits\)"):
        probe.run({"a": a}, latency=1, outputs=["sum"])
    with pytest.raises(ValueError, match=r"input port 'clk' is driven by the vector loop"):
        probe.run({"clk": a}, latency=1)
    with pytest.raises(ValueError, match=r"input 'a' \(16 bits\) has values outside "
                                         r"\[-32768, 65535\]: min 0, max 65536"):
        probe.run({"a": np.array([0, 65536])}, latency=1)
    with pytest.raises(ValueError, match=r"input 'valid' \(1 bits\) cannot hold 2"):
        probe.run({"a": a, "valid": 2}, latency=1)
    with pytest.raises(TypeError, match=r"input 'a' \(16 bits\) must be an integer array"):
        probe.run({"a": a.astype(np.float32)}, latency=1)
    with pytest.raises(ValueError, match=r"input arrays must have one length"):
        probe.run({"a": a, "b": np.zeros(5, np.uint16)}, latency=1)
    with pytest.raises(ValueError, match=r"at least one input must be an array"):
        probe.run({"a": 1}, latency=1)
    with pytest.raises(ValueError, match=r"input 'w' \(100 bits\) must be a uint64 array of "
                                         r"shape \(n, 2\)"):
        probe.run({"w": a}, latency=1)
    with pytest.raises(ValueError, match=r"input 'w' \(100 bits\) has bits set above bit 99"):
        probe.run({"w": wide_words([2**WIDE])}, latency=1)
    with pytest.raises(ValueError, match=r"latency must be in \[0, 1048576\], not -1"):
        probe.run({"a": a}, latency=-1)
    with pytest.raises(TypeError, match=r"latency must be an integer, not 1.5"):
        probe.run({"a": a}, latency=1.5)
    with pytest.raises(ValueError, match=r"reset_cycles must be in \[0, 1048576\], not -1"):
        probe.run({"a": a}, latency=1, reset_cycles=-1)
    with pytest.raises(TypeError, match=r"outputs must be an iterable of port names, not 's'"):
        probe.run({"a": a}, latency=1, outputs="s")
    with pytest.raises(TypeError, match=r"inputs must be a mapping"):
        probe.run([a], latency=1)


def test_vectors_width_limit(probe, monkeypatch):
    monkeypatch.setattr(vectors, "MAX_WIDTH", 64)
    with pytest.raises(ValueError, match=r"input port 'w' is 100 bits wide; the vector loop "
                                         r"supports ports up to 64 bits"):
        probe.run({"w": wide_words([1])}, latency=1)
    with pytest.raises(ValueError, match=r"output port 'w1' is 100 bits wide"):
        probe.run({"a": np.zeros(1, np.uint16)}, latency=1, outputs=["w1"])


def test_vectors_loop_checks_its_files(probe, tmp_path):
    """The C++ loop refuses offsets that run past its files (exit 2, a message)."""
    exe = probe.build_dir / "obj_dir" / "vectors"
    (tmp_path / "in.bin").write_bytes(b"\0" * 10)
    n_in, n_out = len(probe.inputs), len(probe.outputs)
    base = [str(exe), str(tmp_path / "in.bin"), str(tmp_path / "out.bin"), "100", "1", "0"]
    offsets = ",".join(["0"] + ["-1"] * (n_in - 1))
    res = subprocess.run([*base, offsets, ",".join(["-1"] * n_out), "0"],
                         capture_output=True, text=True, check=False)
    assert res.returncode == 2 and "input file too short" in res.stderr
    res = subprocess.run([*base, "x", ",".join(["-1"] * n_out), "0"],
                         capture_output=True, text=True, check=False)
    assert res.returncode == 2 and "bad offset list" in res.stderr


def test_vectors_build_reused(probe):
    """A second VectorSim of the same Verilog reuses the build without compiling."""
    again = VectorSim(Probe(), name="vectors_probe")
    assert not again.built and again.build_dir == probe.build_dir
    assert (again.build_dir / "vectors.json").is_file()
    assert again.ports == probe.ports
    assert again.inputs == probe.inputs and "clk" not in again.inputs
    assert set(again.outputs) == {"s", "s_valid", "w1", "d", "cnt"}
    assert again.ports["w"].width == WIDE and again.ports["d"].width == 17


def test_vectors_combinational_struct():
    """A design without a clock: latency 0, struct fields packed and split."""
    layout = Pair().signature.members["i"].shape
    rng = np.random.default_rng(7)
    x = rng.integers(0, 256, 5000)
    y = rng.integers(-128, 128, 5000)
    out = run_vectors(Pair(), {"i": join_fields({"x": x, "y": y}, layout)}, latency=0,
                      name="vectors_pair")
    np.testing.assert_array_equal(out["o"], x ^ (y & 0xFF))
    neg = split_fields(out["neg"], data.StructLayout({"v": signed(9)}))["v"]
    np.testing.assert_array_equal(neg, -x)
    sim = VectorSim(Pair(), name="vectors_pair")
    assert not sim.built and not sim.has_clock
    with pytest.raises(ValueError, match=r"latency must be 0 for vectors_pair, which has no "
                                         r"clock, not 1"):
        sim.run({"i": x.astype(np.uint16)}, latency=1)


def test_split_join_fields():
    layout = data.StructLayout({"a": unsigned(3), "b": signed(4), "c": unsigned(1)})
    bits = join_fields({"a": [5, 7], "b": [-8, 7], "c": [1, 0]}, layout)
    np.testing.assert_array_equal(bits, [5 | (8 << 3) | (1 << 7), 7 | (7 << 3)])
    f = split_fields(bits, layout)
    np.testing.assert_array_equal(f["a"], [5, 7])
    np.testing.assert_array_equal(f["b"], [-8, 7])
    np.testing.assert_array_equal(f["c"], [1, 0])
    with pytest.raises(ValueError, match=r"layout has no field 'd'"):
        join_fields({"d": 1}, layout)
    with pytest.raises(TypeError, match=r"layout must be an amaranth data layout, not 3"):
        split_fields(bits, 3)
    wide = data.StructLayout({"a": unsigned(60), "b": signed(10), "c": unsigned(64)})
    wbits = join_fields({"a": [2**60 - 1, 3], "b": [-1, 5], "c": [2**64 - 1, 2**63]}, wide)
    assert wbits.shape == (2, 3) and wbits.dtype == np.uint64
    np.testing.assert_array_equal(wbits[:, 0], [2**64 - 1, 3 | (5 << 60)])
    wf = split_fields(wbits, wide)
    np.testing.assert_array_equal(wf["a"], [2**60 - 1, 3])
    np.testing.assert_array_equal(wf["b"], [-1, 5])
    np.testing.assert_array_equal(wf["c"], np.array([2**64 - 1, 2**63], dtype=np.uint64))
    with pytest.raises(ValueError, match=r"bits of a 134-bit layout must have shape \(n, 3\)"):
        split_fields(bits, wide)
    with pytest.raises(ValueError, match=r"field 'a' is 65 bits wide; split_fields supports"):
        split_fields(np.zeros((1, 2), np.uint64), data.StructLayout({"a": unsigned(65)}))
    with pytest.raises(TypeError, match=r"field 'a' must hold integers, not float64"):
        join_fields({"a": [0.5]}, layout)


def test_vector_sim_parameter_errors():
    with pytest.raises(TypeError, match=r"component must be an amaranth wiring.Component, not 3"):
        VectorSim(3)
    with pytest.raises(ValueError, match=r"name must be a Verilog identifier, not 'a b'"):
        VectorSim(Pair(), name="a b")
