# amaranth: UnusedElaboratable=no
"""The Quantize and Dequantize units through cocotb (sim/tb_elementwise.py), every output beat
checked against the golden model, with random idle cycles and back-pressure, a reset in the
middle of a stream, the throughput and latency checks and the watchdog. On Verilator each run
also carries a job longer than the output FIFO (:func:`~qaccel.sim.matrix.fill_job`) and the
unit's ``fifo_depth``, so ``test_credit_limit`` fills the FIFO with long stalls and checks the
credit every cycle (on Icarus it is skipped: ~1k cycles/s).

Default suite: every (input type, output type, granularity) of the default configuration on
Verilator (plus DirectML's broadcast quantize), a per-granularity subset on Icarus, and small
multi-lane instances. ``-m slow``: the full matrix on both simulators, more lanes, bigger
tensors.
"""

from __future__ import annotations

import numpy as np
import pytest

from qaccel.model.config import AccelConfig
from qaccel.model.presets import preset
from qaccel.rtl.elementwise.dequantize import Dequantize
from qaccel.rtl.elementwise.quantize import Quantize
from qaccel.sim.elementwise_sim import run_elementwise
from qaccel.sim.jobs import lane_widths, quantize_job, unpack_output
from qaccel.sim.matrix import dequantize_matrix, dml_matrix, fill_job, quantize_matrix
from qaccel.sim.runner import missing_simulator
from tests.model.quant_helpers import assert_bitexact
from tests.sub_byte_cases import SUB_BYTE, special_case, top_bit_set

pytestmark = pytest.mark.sim


def needs(simulator: str):
    reason = missing_simulator(simulator)
    return pytest.mark.skipif(reason is not None, reason=reason or "")


SMALL_Q = dict(q_inputs=("float32", "float16"), scales=("float32", "float16"),
               q_outputs=("int8", "uint4", "int2", "float8e4m3fn", "float4e2m1"))
SMALL_DQ = dict(dq_inputs=("int8", "uint4", "int16", "float8e5m2", "float4e2m1"),
                dq_outputs=("float32", "bfloat16"))


def with_fill(unit, jobs, rng):
    """``jobs`` and a job that fills ``unit``'s output FIFO, and the parameter naming its depth:
    ``run_elementwise(unit, *with_fill(...))`` runs test_credit_limit too."""
    return jobs + [fill_job(unit, rng)], {"fifo_depth": unit.fifo_depth}


def run_filled(unit, jobs, rng, *, name, **kw):
    """Run ``jobs`` plus a fill job on Verilator, test_credit_limit included; check it all."""
    jobs, params = with_fill(unit, jobs, rng)
    result = run_elementwise(unit, jobs, name=name, **params, **kw)
    check(result, jobs, "verilator", filled=unit.fifo_depth)
    return result


def check(result, jobs, simulator, *, filled: int | None = None):
    """Every cocotb test passed (test_credit_limit skipped unless ``filled``, the FIFO depth:
    then the beats inside and the FIFO level reached it and never passed it)."""
    rec = result.records
    assert result.tests == 5 and result.skipped == (filled is None), result
    assert result.passed == result.tests - result.skipped, result
    beats = sum(len(j.y) for j in jobs)
    assert rec["test_jobs"]["beats"] == beats
    assert rec["test_throughput"]["beats_per_cycle"] >= 0.99
    fill = ""
    if filled is not None:
        credit = rec["test_credit_limit"]
        assert credit["fifo_depth"] == filled and credit["stall"] > filled + credit["latency"]
        for name, occ in credit["occupancy"].items():
            assert occ["high"] == occ["limit"] == filled and occ["full_cycles"] > 0, (name, occ)
        fill = (f"; credit limit {filled} reached ({credit['occupancy']}), stalls "
                f"{credit['stall']}/{credit['starve']} cycles, FIFO ports peeked: "
                f"{credit['fifo_peeked']}")
    print(f"\n{simulator}: {len(jobs)} jobs, {beats} beats checked at "
          f"{rec['test_jobs']['beats_per_second']:.0f} beats/s; "
          f"throughput {rec['test_throughput']['beats_per_cycle']} beats/cycle, "
          f"latency {rec['test_throughput']['latency']} cycles{fill}")


@needs("verilator")
def test_quantize_matrix_verilator():
    unit = Quantize(AccelConfig())
    rng = np.random.default_rng(11)
    jobs = quantize_matrix(unit, rng) + dml_matrix(unit, rng)
    run_filled(unit, jobs, rng, name="quantize")


@needs("verilator")
def test_dequantize_matrix_verilator():
    unit = Dequantize(AccelConfig())
    rng = np.random.default_rng(12)
    jobs = dequantize_matrix(unit, rng)
    run_filled(unit, jobs, rng, name="dequantize")


@needs("verilator")
def test_sub_byte_specials_verilator():
    """Negatives, -0, NaN, +-inf and saturation into every sub-byte output, with and without
    a zero point. The testbench compares each lane's whole word with the code right-aligned
    and zero above it, so a code sign-extended across its lane fails; the jobs' expected
    beats unpack to onnx.reference's bytes. (float4e2m1 without a zero point is left out:
    the RTL gives +0 for an exact -0 quotient, see tests/qaccel/engine/test_rtl_engine.py.)"""
    unit = Quantize(AccelConfig())
    jobs = []
    for out in SUB_BYTE:
        for zero_point in (True, False) if out.name != "float4_e2m1fn" else (True,):
            args, kwargs, ref, mask = special_case(out, zero_point)
            job = quantize_job(unit, *args, **kwargs)
            got = unpack_output(job, job.y, lane_widths(unit)[1], unit.config.lanes)
            assert_bitexact(got, ref, mask=mask, context=f"{job.label}: ")
            assert top_bit_set(got).any() or not out.name.startswith(("int", "float"))
            jobs.append(job)
    check(run_elementwise(unit, jobs, name="quantize"), jobs, "verilator")


@needs("icarus")
def test_quantize_icarus():
    """Icarus, default configuration: each granularity with a few type pairs."""
    unit = Quantize(AccelConfig())
    rng = np.random.default_rng(13)
    jobs = quantize_matrix(unit, rng, shape=(2, 3, 5))[::12] + dml_matrix(unit, rng)[:1]
    check(run_elementwise(unit, jobs, name="quantize", simulator="icarus", watchdog=3000),
          jobs, "icarus")


@needs("icarus")
def test_dequantize_icarus():
    unit = Dequantize(AccelConfig())
    rng = np.random.default_rng(14)
    jobs = dequantize_matrix(unit, rng, shape=(2, 3, 5))[::10]
    check(run_elementwise(unit, jobs, name="dequantize", simulator="icarus"), jobs, "icarus")


@needs("verilator")
@pytest.mark.parametrize("lanes", [2])   # 8 lanes: test_lanes_full (-m slow); its C++ build is long
def test_quantize_lanes(lanes):
    unit = Quantize(AccelConfig(lanes=lanes, **SMALL_Q))
    rng = np.random.default_rng(20 + lanes)
    jobs = quantize_matrix(unit, rng, shape=(3, 5, 7)) + dml_matrix(unit, rng)
    run_filled(unit, jobs, rng, name=f"quantize_l{lanes}")


#: Prepared scales (the reciprocal divider), two lanes and two reciprocal units taking the
#: table entries in turn; float8e8m0 scales too, which lane 0's decoder then carries beside
#: the input types.
PREPARED_Q = AccelConfig(lanes=2, reciprocal_units=2,
                         **(SMALL_Q | {"scales": ("float32", "float16", "float8e8m0")}))


@pytest.mark.parametrize("simulator", [
    pytest.param("verilator", marks=needs("verilator")),
    pytest.param("icarus", marks=needs("icarus"))])
def test_quantize_prepared_scales(simulator):
    """Table entries prepared as they are written (``table.ready`` back-pressures the
    writes), on both simulators: every type pair and granularity on Verilator, a subset on
    Icarus."""
    unit = Quantize(PREPARED_Q)
    assert unit.table_interval == 14
    rng = np.random.default_rng(25)
    jobs = quantize_matrix(unit, rng, shape=(3, 5, 7)) + dml_matrix(unit, rng)
    if simulator == "icarus":
        check(run_elementwise(unit, jobs[::9], name="quantize_prepared", simulator=simulator,
                              watchdog=3000), jobs[::9], simulator)
    else:
        run_filled(unit, jobs, rng, name="quantize_prepared", watchdog=3000)


@pytest.mark.parametrize("simulator", [
    pytest.param("verilator", marks=needs("verilator")),
    pytest.param("icarus", marks=needs("icarus"))])
@pytest.mark.parametrize("op", ["quantize", "dequantize"])
def test_qdq_int8_preset(op, simulator):
    """The ``qdq-int8`` preset's units (prepared scales and SignificandRound in the
    Quantize lane; the integer path in the Dequantize lane) on both simulators."""
    unit = (Quantize if op == "quantize" else Dequantize)(preset("qdq-int8"))
    rng = np.random.default_rng(27)
    if op == "quantize":
        jobs = quantize_matrix(unit, rng, shape=(3, 5, 7)) + dml_matrix(unit, rng)
    else:
        jobs = dequantize_matrix(unit, rng, shape=(3, 5, 7))
    if simulator == "icarus":
        check(run_elementwise(unit, jobs, name=f"{op}_qdq_int8", simulator=simulator,
                              watchdog=3000), jobs, simulator)
    else:
        run_filled(unit, jobs, rng, name=f"{op}_qdq_int8", watchdog=3000)


@needs("verilator")
@pytest.mark.parametrize("lanes", [4])
def test_dequantize_lanes(lanes):
    unit = Dequantize(AccelConfig(lanes=lanes, **SMALL_DQ))
    rng = np.random.default_rng(30 + lanes)
    jobs = dequantize_matrix(unit, rng, shape=(3, 5, 7))
    run_filled(unit, jobs, rng, name=f"dequantize_l{lanes}")


@pytest.mark.slow
@pytest.mark.parametrize("simulator", ["verilator", "icarus"])
@pytest.mark.parametrize("op", ["quantize", "dequantize"])
def test_full_matrix(op, simulator):
    """Every combination on both simulators, bigger tensors."""
    if missing_simulator(simulator):
        pytest.skip(missing_simulator(simulator))
    rng = np.random.default_rng(40)
    shape = (4, 9, 11) if simulator == "verilator" else (3, 5, 7)   # Icarus: ~100 beats/s
    if op == "quantize":
        unit = Quantize(AccelConfig())
        jobs = quantize_matrix(unit, rng, shape=shape) + dml_matrix(unit, rng)
    else:
        unit = Dequantize(AccelConfig())
        jobs = dequantize_matrix(unit, rng, shape=shape)
    check(run_elementwise(unit, jobs, name=op, simulator=simulator, watchdog=3000), jobs,
          simulator)


@pytest.mark.slow
@pytest.mark.parametrize("lanes", [1, 2, 4, 8])
@pytest.mark.parametrize("op", ["quantize", "dequantize"])
def test_lanes_full(op, lanes):
    """Every type and granularity at each lane count (Verilator)."""
    if missing_simulator("verilator"):
        pytest.skip(missing_simulator("verilator"))
    rng = np.random.default_rng(50 + lanes)
    if op == "quantize":
        unit = Quantize(AccelConfig(lanes=lanes))
        jobs = quantize_matrix(unit, rng, shape=(5, 6, 7)) + dml_matrix(unit, rng)
    else:
        unit = Dequantize(AccelConfig(lanes=lanes))
        jobs = dequantize_matrix(unit, rng, shape=(5, 6, 7))
    check(run_elementwise(unit, jobs, name=f"{op}_full_l{lanes}"), jobs, f"verilator l{lanes}")
