# amaranth: UnusedElaboratable=no
"""Property-based fuzzing of the RTL against the golden model: generated QuantizeLinear,
DequantizeLinear, DirectML quantize and MatMulNBits calls through :class:`qaccel.RTL` on the
default configuration (``AccelConfig()``: its builds are shared with the rest of the suite),
on the C++ stream harness (Verilator), with drawn idle cycles on the inputs and back-pressure
on the output.

Each example is one pause setting (idle and back-pressure probabilities, the pause seed) and
a list of calls run back to back on the same simulator build. Q / DQ / DirectML outputs must
equal the golden model's storage bytes (-0, NaN payloads and sub-byte containers included).
MatMulNBits (the int8 path, the only one the default engine has: accuracy_level 4, no or
packed zero points, bits 2..8, block sizes 16..256, float32 / float16 / bfloat16 A) must
equal the engine's bit-exact model (``RTL(check=True)``) and be within the bound of
:func:`qaccel.matmul_nbits` that tests/fuzz/test_golden_nbits.py holds ORT to
(:func:`~tests.fuzz.test_golden_nbits.close_enough`).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import strategies as st

import qaccel
from qaccel.engine import RTL
from qaccel.model.config import AccelConfig
from qaccel.sim.runner import missing_simulator
from tests.model.quant_helpers import assert_bitexact

from .strategies import BUDGETS, dequantize_cases, dml_cases, quantize_cases, run
from .test_golden_nbits import close_enough

pytestmark = [pytest.mark.sim,
              pytest.mark.skipif(missing_simulator("verilator") is not None,
                                 reason=missing_simulator("verilator") or "")]

CONFIG = AccelConfig()
#: Calls per example (one simulator process runs them back to back).
CALLS = 4


def pauses():
    """``(idle, backpressure, seed)``: none, light, heavy or any pause probabilities."""
    p = st.one_of(st.sampled_from([0.0, 0.1, 0.5, 0.9]), st.floats(0.0, 0.95))
    return st.tuples(p, p, st.integers(0, 2**32 - 1))


def _rtl(idle, backpressure, seed, *, check=False):
    return RTL(CONFIG, idle=idle, backpressure=backpressure, seed=seed, check=check)


def check_quantize(example):
    """The Quantize unit's output bytes equal quantize_linear's."""
    (idle, bp, seed), cases = example
    rtl = _rtl(idle, bp, seed)
    for case in cases:
        kw = {k: v for k, v in case.items() if k != "out"}
        assert_bitexact(rtl.quantize_linear(**kw), qaccel.quantize_linear(**kw),
                        context="RTL vs golden: ")


def check_dequantize(example):
    """The Dequantize unit's output bytes equal dequantize_linear's."""
    (idle, bp, seed), cases = example
    rtl = _rtl(idle, bp, seed)
    for case in cases:
        assert_bitexact(rtl.dequantize_linear(**case), qaccel.dequantize_linear(**case),
                        context="RTL vs golden: ")


def check_dml(example):
    """The Quantize unit's DirectML output bytes equal dml_quantize_linear's."""
    (idle, bp, seed), cases = example
    rtl = _rtl(idle, bp, seed)
    for case in cases:
        assert_bitexact(rtl.dml_quantize_linear(**case), qaccel.dml_quantize_linear(**case),
                        context="RTL vs golden: ")


def _jobs(cases):
    return st.tuples(pauses(), st.lists(cases, min_size=1, max_size=CALLS))


# --------------------------------------------------------------------------- MatMulNBits


@st.composite
def nbits_cases(draw):
    """One int8-path MatMulNBits call the default engine takes."""
    bits = draw(st.sampled_from(CONFIG.nbits))
    block_size = draw(st.sampled_from([b for b in (16, 32, 64, 128, 256)
                                       if b <= CONFIG.max_block_size]))
    dtype = np.dtype(draw(st.sampled_from([np.float32, np.float16, ml_dtypes.bfloat16])))
    K = draw(st.one_of(st.integers(1, 3 * block_size + 7),
                       st.sampled_from([block_size - 1, block_size, block_size + 1])))
    m_tile, pe = CONFIG.m_tile, CONFIG.pe
    M = draw(st.one_of(st.integers(1, 2 * m_tile + 1), st.sampled_from([1, m_tile])))
    N = draw(st.one_of(st.integers(1, 2 * pe + 3), st.sampled_from([1, pe, pe + 1])))
    packed = draw(st.booleans())
    small = dtype != np.float32  # 16-bit A: magnitudes that keep every sum finite
    a_mag = draw(st.sampled_from([1.0, 1e-2] + ([] if small else [30.0, 1e-20])))
    s_mag = draw(st.sampled_from([0.1, 1e-3] + ([] if small else [1.0, 1e5])))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kb = -(-K // block_size)
    B = rng.integers(0, 256, (N, kb, -(-block_size * bits // 8)), dtype=np.uint8)
    scales = (rng.standard_normal((N, kb)) * s_mag).astype(dtype)
    zp = rng.integers(0, 256, (N, -(-kb * bits // 8)), dtype=np.uint8) if packed else None
    A = rng.standard_normal((M, kb * block_size)) * a_mag
    A *= np.repeat(rng.random((M, kb)) >= draw(st.sampled_from([0.0, 0.3])), block_size, axis=1)
    A = A[:, :K].astype(dtype)
    bias = (rng.standard_normal(N) * a_mag).astype(dtype) if draw(st.booleans()) else None
    return {"A": A, "B": B, "scales": scales, "zero_points": zp, "bias": bias, "K": K, "N": N,
            "bits": bits, "block_size": block_size, "accuracy_level": 4}


def check_matmul_nbits(example):
    """The engine equals its bit-exact model (check=True) and is within the bound of the
    golden matmul_nbits."""
    (idle, bp, seed), cases = example
    rtl = _rtl(idle, bp, seed, check=True)
    for c in cases:
        close_enough(rtl.matmul_nbits(**c), qaccel.matmul_nbits(**c), c)


@pytest.mark.parametrize("budget", BUDGETS)
def test_rtl_quantize(budget):
    run(budget, _jobs(quantize_cases()), check_quantize, factor=0.4, name="rtl_quantize")


@pytest.mark.parametrize("budget", BUDGETS)
def test_rtl_dequantize(budget):
    run(budget, _jobs(dequantize_cases()), check_dequantize, factor=0.4,
        name="rtl_dequantize")


@pytest.mark.parametrize("budget", BUDGETS)
def test_rtl_dml(budget):
    run(budget, _jobs(dml_cases(max_rank=CONFIG.max_dims)), check_dml, factor=0.2,
        name="rtl_dml")


@pytest.mark.parametrize("budget", BUDGETS)
def test_rtl_matmul_nbits(budget):
    run(budget, _jobs(nbits_cases()), check_matmul_nbits, factor=0.2,
        name="rtl_matmul_nbits")
