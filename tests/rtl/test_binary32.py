"""Binary32 (float32 multiply / add / subtract on bit patterns) against NumPy's float32
arithmetic on this x86-64 machine: a million random operand pairs per operation plus edge
cases (ties, subnormal operands and results, overflow, underflow, cancellation, signed
zeros, infinities, NaN), through one Verilator build of all three units (operand generators
and the comparison: tests/rtl/f32_vectors.py)."""

from __future__ import annotations

import numpy as np
import pytest

from qaccel.rtl.binary32 import OPS, Binary32
from qaccel.sim.runner import missing_simulator
from qaccel.sim.vectors import ComponentBank, VectorSim

from .f32_vectors import assert_matches_numpy, edge_operands, random_operands

pytestmark = [pytest.mark.sim,
              pytest.mark.skipif(missing_simulator("verilator") is not None,
                                 reason=missing_simulator("verilator") or "")]


@pytest.fixture(scope="module")
def bank():
    units = {op: Binary32(op) for op in OPS}
    return VectorSim(ComponentBank(units), name="binary32_bank"), units


def check(bank, op: str, a: np.ndarray, b: np.ndarray) -> int:
    sim, units = bank
    unit = units[op]
    out = sim.run({f"a_{op}": a, f"b_{op}": b}, latency=unit.latency, outputs=[f"y_{op}"])
    return assert_matches_numpy(op, a, b, out[f"y_{op}"])


@pytest.mark.parametrize("op", OPS)
def test_binary32_random_and_edges(bank, op):
    rng = np.random.default_rng(OPS.index(op))
    n = check(bank, op, *random_operands(rng, 1_000_000))
    n += check(bank, op, *edge_operands())
    assert n > 1_000_000


def test_binary32_latency_and_errors(bank):
    assert [bank[1][op].latency for op in OPS] == [6, 7, 7]
    with pytest.raises(ValueError, match="op must be one of mul, add, sub, not 'div'"):
        Binary32("div")
