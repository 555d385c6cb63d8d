"""The public facade: lazy imports, the exported API, the dtype table."""

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
