"""Fp32Add (``a + b``, ``a - b``) and Fp32Mul (LUT and MULT18X18D products) against NumPy's
float32 arithmetic on this x86-64 machine, through one Verilator build of the four units.
All four see the same 1,600,576 operand pairs in one run: a million random pairs
(tests/rtl/f32_vectors.py), the edge-case grid (ties, subnormal operands and results,
overflow, underflow, cancellation, signed zeros, infinities, NaN) and 300,000 pairs each
aimed at the hard bands of addition (sums of subnormals, cancellations, exponent gaps of
22 to 29, sums near overflow) and of multiplication (results near the underflow and
overflow thresholds), a third of the fractions with trailing zeros (rounding ties).
The ``synth`` tests place and route each unit alone on an LFE5U-25F speed 6
(``qaccel.eda.synth``) and check the 150 MHz target."""

from __future__ import annotations

import numpy as np
import pytest

from qaccel.eda import synth
from qaccel.rtl.arith.fp32_add import Fp32Add
from qaccel.rtl.arith.fp32_mul import LATENCY, Fp32Mul
from qaccel.sim.runner import missing_simulator
from qaccel.sim.vectors import ComponentBank, VectorSim

from ..ecp5_models import mult18x18d_model, needs_icarus, run_icarus
from ..f32_vectors import assert_matches_numpy, edge_operands, random_operands

_SIM_MARKS = (pytest.mark.sim,
              pytest.mark.skipif(missing_simulator("verilator") is not None,
                                 reason=missing_simulator("verilator") or ""))
#: Bank key: (NumPy operation, unit factory).
UNITS = {
    "add": ("add", lambda: Fp32Add()),
    "sub": ("sub", lambda: Fp32Add(sub=True)),
    "mul": ("mul", lambda: Fp32Mul()),
    "mul_dsp": ("mul", lambda: Fp32Mul(dsp=True)),
}
#: Clock target of the v2 scale lane (docs/matmul_nbits_v2.md), MHz.
TARGET_MHZ = 150


def simulated(test):
    """Mark ``test`` as a Verilator test (skipped without Verilator)."""
    for mark in _SIM_MARKS:
        test = mark(test)
    return test


@pytest.fixture(scope="module")
def bank():
    units = {key: make() for key, (_, make) in UNITS.items()}
    return VectorSim(ComponentBank(units), name="fp32_units_bank"), units


def run(bank, key: str, a: np.ndarray, b: np.ndarray, latency: int | None = None):
    sim, units = bank
    if latency is None:
        latency = units[key].latency
    return sim.run({f"a_{key}": a, f"b_{key}": b}, latency=latency, outputs=[f"y_{key}"])[
        f"y_{key}"]


def _pack(sign, exp, frac) -> np.ndarray:
    return ((sign.astype(np.uint32) << 31) | (exp.astype(np.uint32) << 23)
            | frac.astype(np.uint32))


def _fractions(rng, n: int) -> np.ndarray:
    """Random fractions, a third of them with a random number of trailing zeros (ties)."""
    f = rng.integers(0, 1 << 23, n)
    cut = rng.random(n) < 0.35
    f[cut] &= ~((1 << rng.integers(0, 24, cut.sum())) - 1)
    return f


def mul_band_operands(rng, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Products near the underflow threshold (gradual underflow, subnormal operands times
    large ones, rounding up to the smallest normal) and near the overflow threshold."""
    ea = rng.integers(0, 255, n)
    total = np.where(rng.random(n) < 0.75, rng.integers(127 - 52, 131, n),
                     rng.integers(127 + 252, 127 + 257, n))
    eb = np.clip(total - ea, 0, 254)
    a = _pack(rng.integers(0, 2, n), ea, _fractions(rng, n))
    b = _pack(rng.integers(0, 2, n), eb, _fractions(rng, n))
    return a, b


def add_band_operands(rng, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Sums of subnormals and tiny normals, cancellations (opposite signs, exponents 0 or 1
    apart, significands a few units apart), exponent gaps of 22 to 29 (the guard, round and
    sticky bits) and sums near the overflow threshold."""
    kind = rng.integers(0, 4, n)
    sa, sb = rng.integers(0, 2, n), rng.integers(0, 2, n)
    ea = rng.integers(1, 255, n)
    fa, fb = _fractions(rng, n), _fractions(rng, n)
    eb = ea.copy()
    tiny = kind == 0
    ea[tiny], eb[tiny] = rng.integers(0, 4, tiny.sum()), rng.integers(0, 4, tiny.sum())
    cancel = kind == 1
    sb[cancel] = 1 - sa[cancel]
    eb[cancel] = np.clip(ea[cancel] - rng.integers(-1, 2, cancel.sum()), 0, 254)
    fb[cancel] = np.clip(fa[cancel] + rng.integers(-4, 5, cancel.sum()), 0, (1 << 23) - 1)
    gap = kind == 2
    eb[gap] = np.clip(ea[gap] - rng.integers(22, 30, gap.sum()), 0, 254)
    big = kind == 3
    ea[big], eb[big] = rng.integers(250, 255, big.sum()), rng.integers(250, 255, big.sum())
    return _pack(sa, ea, fa), _pack(sb, eb, fb)


@pytest.fixture(scope="module")
def vectors(bank):
    """Every unit's result on the same operands, in one run of the bank: a million random
    pairs, the edge-case grid and both sets of hard bands (1,600,576 pairs)."""
    rng = np.random.default_rng(2024)
    parts = [random_operands(rng, 1_000_000), edge_operands(),
             add_band_operands(rng, 300_000), mul_band_operands(rng, 300_000)]
    a = np.concatenate([p[0] for p in parts])
    b = np.concatenate([p[1] for p in parts])
    sim, units = bank
    # one run sampled at the shortest latency, padded so that the slowest unit's last
    # result is sampled too; each unit's results start at its own latency
    low = min(u.latency for u in units.values())
    pad = max(u.latency for u in units.values()) - low
    out = sim.run({**{f"a_{k}": np.concatenate([a, a[:pad]]) for k in units},
                   **{f"b_{k}": np.concatenate([b, b[:pad]]) for k in units}},
                  latency=low, outputs=[f"y_{k}" for k in units])
    got = {k: out[f"y_{k}"][u.latency - low:u.latency - low + a.size]
           for k, u in units.items()}
    return a, b, got


@simulated
@pytest.mark.parametrize("key", list(UNITS))
def test_fp32_unit_against_numpy(vectors, key):
    a, b, got = vectors
    assert assert_matches_numpy(UNITS[key][0], a, b, got[key]) == 1_600_576


@simulated
@pytest.mark.parametrize("key", list(UNITS))
def test_fp32_unit_latency(bank, key):
    """``latency`` is the measured one: results line up at ``latency`` cycles, not one
    earlier and not one later."""
    op = UNITS[key][0]
    a, b = random_operands(np.random.default_rng(7), 200)
    assert assert_matches_numpy(op, a, b, run(bank, key, a, b)) == 200
    for wrong in (bank[1][key].latency - 1, bank[1][key].latency + 1):
        with pytest.raises(AssertionError, match="differ"):
            assert_matches_numpy(op, a, b, run(bank, key, a, b, latency=wrong))


def test_fp32_unit_parameters():
    assert (Fp32Add().latency, Fp32Add(sub=True).latency) == (8, 8)
    assert (Fp32Add().sub, Fp32Add(sub=True).sub) == (False, True)
    assert (Fp32Mul().latency, Fp32Mul(dsp=True).latency) == (LATENCY[False], LATENCY[True])
    assert (Fp32Mul().dsp, Fp32Mul(dsp=True).dsp) == (False, True)
    assert Fp32Mul(dsp=True, ecp5=True).latency == Fp32Mul(dsp=True).latency == 8
    assert (Fp32Mul().ecp5, Fp32Mul(dsp=True, ecp5=True).ecp5) == (False, True)
    assert set(Fp32Add().signature.members) == {"a", "b", "y"}
    assert set(Fp32Mul().signature.members) == {"a", "b", "y"}
    with pytest.raises(TypeError, match="sub must be a bool, not 1"):
        Fp32Add(sub=1)
    with pytest.raises(TypeError, match="dsp must be a bool, not 'yes'"):
        Fp32Mul(dsp="yes")
    with pytest.raises(TypeError, match="ecp5 must be a bool, not 1"):
        Fp32Mul(dsp=True, ecp5=1)


# ---------------------------------------------------------------------------------------------
# The MULT18X18D instances (ecp5=True) against the behavioural twin, on Icarus

_TB = """
`timescale 1ns/1ps
module tb;
  reg clk = 0;
  reg [31:0] av [0:{n} - 1];
  reg [31:0] bv [0:{n} - 1];
  reg [31:0] a = 0, b = 0;
  wire [31:0] y_beh, y_prim;
  integer k, f;
  beh u_beh(.clk(clk), .rst(1'b0), .a(a), .b(b), .y(y_beh));
  prim u_prim(.clk(clk), .rst(1'b0), .a(a), .b(b), .y(y_prim));
  always #5 clk = ~clk;
  initial begin
    $readmemh("a.hex", av);
    $readmemh("b.hex", bv);
    f = $fopen("y.txt", "w");
    for (k = 0; k < {n} + {lat}; k = k + 1) begin
      @(negedge clk);
      $fwrite(f, "%h %h\\n", y_beh, y_prim);
      a = k < {n} ? av[k] : 0;
      b = k < {n} ? bv[k] : 0;
    end
    $fclose(f);
    $finish;
  end
endmodule
"""


@pytest.mark.sim
@needs_icarus
def test_fp32_mul_ecp5_instances_icarus(tmp_path):
    """``Fp32Mul(dsp=True, ecp5=True)`` (MULT18X18D instances, with a model of the cell)
    gives, cycle by cycle, the results of its behavioural twin ``Fp32Mul(dsp=True)``
    (whose exactness the Verilator tests above check), and those are NumPy's at
    ``latency``: random pairs, the edge grid and the multiplication bands."""
    from qaccel.rtl.verilog import emit_verilog
    beh, prim = Fp32Mul(dsp=True), Fp32Mul(dsp=True, ecp5=True)
    assert beh.latency == prim.latency
    rng = np.random.default_rng(11)
    parts = [random_operands(rng, 6000), edge_operands(), mul_band_operands(rng, 3000)]
    a = np.concatenate([p[0] for p in parts])
    b = np.concatenate([p[1] for p in parts])
    (tmp_path / "a.hex").write_text("".join(f"{x:08x}\n" for x in a))
    (tmp_path / "b.hex").write_text("".join(f"{x:08x}\n" for x in b))
    tb = _TB.format(n=a.size, lat=beh.latency)
    run_icarus(tmp_path, {"units.v": emit_verilog(beh, "beh", emit_src=False)
                          + emit_verilog(prim, "prim", emit_src=False),
                          "mult.v": mult18x18d_model(), "tb.v": tb})
    words = (tmp_path / "y.txt").read_text().split()
    y = np.array([int(w, 16) for w in words], np.uint32).reshape(-1, 2)
    assert y.shape[0] == a.size + beh.latency
    assert np.array_equal(y[:, 0], y[:, 1]), np.flatnonzero(y[:, 0] != y[:, 1])[:10]
    # row k is sampled after k clock edges; the operands of row j are taken at edge j + 1
    got = y[beh.latency:, 1]
    assert assert_matches_numpy("mul", a, b, got) == a.size


# ---------------------------------------------------------------------------------------------
# Synthesis, place and route, each unit alone (qaccel.eda.synth's TimingWrapper)


#: Synthesis-only builds (simulators cannot run the MULT18X18D instances).
SYNTH_ONLY = {"mul_ecp5": lambda: Fp32Mul(dsp=True, ecp5=True)}


def _synth(key: str, seed: int = 1) -> synth.SynthResult:
    reason = synth.missing_tools("ecp5-25k")
    if reason is not None:
        pytest.skip(reason)
    make = SYNTH_ONLY[key] if key in SYNTH_ONLY else UNITS[key][1]
    r = synth.synthesize(make(), target="ecp5-25k", name=f"fp32_{key}", seed=seed,
                         freq_mhz=TARGET_MHZ if key in SYNTH_ONLY else None)
    print()
    print(r.summary())
    print(r.critical_path)
    return r


@pytest.mark.synth
@pytest.mark.parametrize("key", ["add", "mul"])
def test_fp32_unit_synth_150mhz(key):
    r = _synth(key)
    assert r.fmax_mhz >= TARGET_MHZ
    assert r.dsp == 0 and r.bram == 0
    assert r.lut < (900 if key == "add" else 1700)


@pytest.mark.synth
def test_fp32_mul_dsp_synth():
    """The behavioural MULT18X18D product (``ecp5=False``): three DSPs (the 6 x 6 piece in
    LUTs), far fewer LUTs, but below 150 MHz (136 MHz measured): nextpnr times every
    inferred MULT18X18D as a 3.93 ns combinational block and Yosys uses none of its
    registers, so a bare register-DSP-register path stops near 140 MHz."""
    r = _synth("mul_dsp")
    assert r.dsp == 3 and r.bram == 0
    assert r.lut < 900
    assert r.fmax_mhz >= 125


@pytest.mark.synth
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fp32_mul_ecp5_synth_150mhz(seed):
    """``Fp32Mul(dsp=True, ecp5=True)``: the three MULT18X18D instances with their input
    and output registers take the DSP off the critical path. Measured (seeds 1, 2, 3):
    663 LUT4, 685 FF, 3 DSP, 165.6 / 165.0 / 161.5 MHz."""
    r = _synth("mul_ecp5", seed)
    assert r.dsp == 3 and r.bram == 0
    assert r.lut < 750
    assert r.fmax_mhz >= TARGET_MHZ
