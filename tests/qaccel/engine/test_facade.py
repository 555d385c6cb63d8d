"""The public facade: lazy imports, the exported API, the dtype table; qaccel.RTL's default
MatMulNBits engine (the ecp5-25k v2 engine) and what it refuses or answers without simulating
(tests/qaccel/engine/test_rtl_nbits.py simulates it)."""

import inspect
import subprocess
import sys

import numpy as np
import pytest
from onnx import helper

import qaccel
from qaccel.model import dtypes


def test_import_qaccel_loads_no_numba():
    code = "import sys, qaccel; assert 'numba' not in sys.modules, 'numba imported eagerly'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("name, params", [
    ("quantize_linear", "x y_scale y_zero_point axis block_size output_dtype saturate precision"),
    ("dequantize_linear", "x x_scale x_zero_point axis block_size output_dtype"),
    ("matmul_nbits", "A B scales zero_points g_idx bias K N bits block_size accuracy_level"),
    ("dml_quantize_linear", "input scale zero_point output_dtype"),
    ("quantize_weights_nbits", "W bits block_size symmetric"),
])
def test_public_api_signatures(name, params):
    assert list(inspect.signature(getattr(qaccel, name)).parameters) == params.split()


def test_unknown_attribute():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        qaccel.nope  # noqa: B018


@pytest.mark.parametrize("q", list(dtypes.QTYPES.values()), ids=lambda q: q.name)
def test_dtype_table_matches_onnx(q):
    assert helper.tensor_dtype_to_np_dtype(q.onnx) == q.dtype
    assert dtypes.qtype(q.dtype) is q
    assert dtypes.dtype_name(q.dtype) == q.name


def test_dtype_errors_name_the_parameter():
    with pytest.raises(TypeError, match=r"output_dtype must be one of .*; got 'float64'"):
        dtypes.qtype(np.float64, param="output_dtype")
    with pytest.raises(TypeError, match=r"x must be one of float32, float16; got 'bfloat16'"):
        dtypes.float_dtype("bfloat16", param="x", allowed=("float32", "float16"))
    with pytest.raises(TypeError, match="dt must be a numpy or ml_dtypes dtype, not 'nonsense'"):
        dtypes.qtype("nonsense", param="dt")


def test_numba_cache_is_per_worker():
    import os

    import numba

    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    assert numba.config.CACHE_DIR.endswith(f"numba-{worker}")


def _nbits_call(M=2, dtype=np.float32, **change):
    from qaccel.app.nbits_report import nbits_example

    call = nbits_example(K=64, N=3, M=max(M, 1), bits=4, block_size=32, bias=True, seed=1)
    call["A"] = call["A"][:M].astype(dtype)
    call["scales"] = call["scales"].astype(dtype)
    call["bias"] = call["bias"].astype(dtype)
    return {**call, **change}


def test_rtl_default_config_is_the_ecp5_25k_v2_engine():
    from qaccel.model.presets import preset

    rtl = qaccel.RTL()
    assert rtl.config == preset("ecp5-25k")
    assert (rtl.config.pe, rtl.config.simd, rtl.config.m_tile) == (32, 1, 4)
    assert not rtl.config.float_path


@pytest.mark.parametrize(("change", "match"), [
    ({"accuracy_level": 0},
     r"this configuration has no float path \(config.float_path False\), which "
     r"accuracy_level 0 with zero points packed and no g_idx needs: the engine takes "
     r"accuracy_level 4 with integer or no zero points and no g_idx"),
    ({"accuracy_level": 3, "zero_points": None},
     r"no float path .* accuracy_level 3 with zero points none and no g_idx"),
    ({"zero_points": np.full((3, 2), 7.5, np.float32)},
     r"no float path .* accuracy_level 4 with zero points float and no g_idx"),
    ({"g_idx": np.arange(64, dtype=np.int32) // 32},
     r"no float path .* accuracy_level 4 with zero points packed and a g_idx"),
])
def test_rtl_default_config_refuses_the_float_path(change, match):
    """Float-path calls need a configuration with float_path: the default one refuses them
    before building anything, for any M."""
    call = {"accuracy_level": 4, **_nbits_call()}
    call.update(change)
    with pytest.raises(ValueError, match=match):
        qaccel.RTL().matmul_nbits(**call)
    call["A"] = call["A"][:0]
    with pytest.raises(ValueError, match="no float path"):
        qaccel.RTL().matmul_nbits(**call)


@pytest.mark.parametrize(("shape", "dtype"), [((0, 64), np.float32), ((2, 0, 64), np.float16)])
def test_rtl_matmul_nbits_without_rows(shape, dtype):
    """An A without rows gives the golden model's empty result, simulating nothing."""
    call = _nbits_call(M=0, dtype=dtype, A=np.zeros(shape, dtype))
    rtl = qaccel.RTL()
    y = rtl.matmul_nbits(**call, accuracy_level=4)
    want = qaccel.matmul_nbits(**call, accuracy_level=4)
    assert y.shape == want.shape == (*shape[:-1], 3) and y.dtype == want.dtype == dtype
    r = rtl.last_run
    assert (r.op, r.harness, r.elements, r.beats, r.cycles) == ("matmul_nbits", "none", 0, 0, 0)
    with pytest.raises(ValueError, match="A's last dimension must be K=64"):
        rtl.matmul_nbits(**{**call, "A": np.zeros((0, 63), dtype)}, accuracy_level=4)
