"""sim.jobs: beat packing against a plain Python packer, zero-point shapes, and jobs whose
expected beats unpack to the golden model's and onnx.reference's bytes (no simulator)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from qaccel.model.config import AccelConfig
from qaccel.model.nbits import quantize_weights_nbits
from qaccel.model.quant import dequantize_linear, quantize_linear
from qaccel.rtl.elementwise.dequantize import Dequantize
from qaccel.rtl.elementwise.quantize import Quantize
from qaccel.sim.jobs import _beats, _codes, dequantize_job, lane_widths, quantize_job, unpack_output
from tests.model.quant_helpers import assert_bitexact, q_opset, reference


def naive_beats(codes, lanes, width):
    padded = list(codes) + [0] * ((-len(codes)) % lanes)
    return [sum(int(v) << (k * width) for k, v in enumerate(padded[i:i + lanes]))
            for i in range(0, len(padded), lanes)]


@pytest.mark.parametrize("lanes", [1, 2, 4, 8])
@pytest.mark.parametrize("width", [2, 4, 8, 16, 32])
def test_beats_match_plain_packing_and_unpack(lanes, width):
    rng = np.random.default_rng(lanes * 100 + width)
    codes = rng.integers(0, 1 << width, 203, dtype=np.int64)
    beats = _beats(codes, lanes, width)
    assert beats == naive_beats(codes, lanes, width)
    # a set bit above the lanes (an output beat's last flag) is not part of any code
    flagged = [b | (1 << (lanes * width)) for b in beats]
    np.testing.assert_array_equal(_codes(flagged, lanes, width)[:codes.size], codes)


@pytest.fixture(scope="module")
def units():
    config = AccelConfig(lanes=4)
    return Quantize(config), Dequantize(config)


def test_scalar_scale_with_one_element_zero_point(units):
    """A 0-d scale with a (1,) zero point: the golden model accepts it, so a job does too."""
    quantize, dequantize = units
    x = np.linspace(-40, 40, 13, dtype=np.float32)
    job = quantize_job(quantize, x, np.float32(0.5), np.array([3], np.int8))
    assert job.table == [(0, int(np.float32(0.5).view(np.uint32)), 3)]
    want = quantize_linear(x, np.float32(0.5), np.array([3], np.int8))
    assert_bitexact(unpack_output(job, job.y, lane_widths(quantize)[1], 4), want)

    q = want
    job = dequantize_job(dequantize, q, np.float32(0.5), np.array([-2], np.int8))
    assert job.table[0][2] == 0xFE
    got = unpack_output(job, job.y, lane_widths(dequantize)[1], 4)
    assert_bitexact(got, dequantize_linear(q, np.float32(0.5), np.array([-2], np.int8)))


@pytest.mark.parametrize("dtype", [np.int8, ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.int2,
                                   ml_dtypes.uint2, ml_dtypes.float8_e4m3fn,
                                   ml_dtypes.float4_e2m1fn])
def test_job_beats_unpack_to_golden(units, dtype):
    """The expected beats of a blocked job unpack to the golden output's bytes, which are
    onnx.reference's: negatives, -0 and NaN included, a sub-byte container's upper bits zero
    (int4 -2 is 0x0E, not 0xFE)."""
    quantize, _ = units
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((6, 37)) * 20).astype(np.float32)
    x[:, :4] = [-0.0, -0.2, np.nan, -1e9]     # -0, a negative rounding to 0, NaN, saturation
    scale = (rng.random((6, 3)) + 0.25).astype(np.float32)
    zp = np.zeros((6, 3), dtype)
    job = quantize_job(quantize, x, scale, zp, axis=1, block_size=16)
    want = quantize_linear(x, scale, zp, axis=1, block_size=16)
    assert_bitexact(unpack_output(job, job.y, lane_widths(quantize)[1], 4), want)
    attrs = {"axis": 1, "block_size": 16}
    ref = reference("QuantizeLinear", [x, scale, zp],
                    opset=q_opset(np.float32, np.float32, dtype, blocked=True), y_dtype=dtype,
                    **attrs)
    assert_bitexact(want, ref)
    assert job.count == x.size and len(job.x) == -(-x.size // 4)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_job_without_expected_beats_skips_the_model(dtype, monkeypatch):
    """Jobs built with ``expect=False`` (the RTL engine's without check) carry no expected
    beats and do not run the golden model; everything else is the job with them."""
    import qaccel.sim.jobs as jobs_module
    import qaccel.sim.nbits_jobs as nbits_jobs_module

    rng = np.random.default_rng(5)
    unit = Quantize(AccelConfig(lanes=2))
    x = rng.standard_normal((3, 10)).astype(np.float32)
    scale = np.float32([0.1, 0.2, 0.3])
    with_y = quantize_job(unit, x, scale, np.int8([1, 2, 3]), axis=0)
    K, N = 40, 6
    W = rng.standard_normal((K, N)).astype(np.float32)
    B, s, z = quantize_weights_nbits(W, bits=4, block_size=16, symmetric=False)
    A = rng.standard_normal((2, K)).astype(dtype)
    call = dict(K=K, N=N, bits=4, block_size=16, config=AccelConfig(pe=4))
    nb_with_y = nbits_jobs_module.nbits_job_v2(A, B, s.astype(dtype), z, **call)

    def forbidden(*args, **kwargs):
        raise AssertionError("the golden model ran")

    monkeypatch.setattr(jobs_module, "quantize_linear", forbidden)
    monkeypatch.setattr(nbits_jobs_module, "matmul_nbits_v2", forbidden)
    blind = quantize_job(unit, x, scale, np.int8([1, 2, 3]), axis=0, expect=False)
    assert (blind.y, blind.ymask) == ([], 0) and with_y.y
    assert (blind.regs, blind.table, blind.x, blind.shape, blind.out_dtype) == (
        with_y.regs, with_y.table, with_y.x, with_y.shape, with_y.out_dtype)
    nb = nbits_jobs_module.nbits_job_v2(A, B, s.astype(dtype), z, **call, expect=False)
    assert not nb.y.any() and nb_with_y.y.any() and nb.y.shape == nb_with_y.y.shape
    assert nb.regs == nb_with_y.regs and (nb.out_shape, nb.out_dtype) == (
        nb_with_y.out_shape, nb_with_y.out_dtype)
    for name, beats in nb_with_y.inputs.items():
        np.testing.assert_array_equal(nb.inputs[name], beats)
