"""Bad calls over the public API: each raises TypeError or ValueError whose message names the
parameter, the value and the fix (issue 19).  The qaccel.RTL cases go through the facade with
its builds replaced by a failure: the errors come before anything is built, and calls without
elements (M = 0, empty x) give the golden model's empty result without a build either."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import qaccel
from qaccel.model.config import AccelConfig
from qaccel.model.nbits import prepare_nbits

F32 = np.float32
X = np.ones((4, 64), F32)
S = F32(0.5)
K, N, BITS, BS = 64, 8, 4, 32


def _weights(dtype=F32):
    W = np.random.default_rng(0).standard_normal((K, N)).astype(F32)
    B, scales, zp = qaccel.quantize_weights_nbits(W, bits=BITS, block_size=BS, symmetric=False)
    return B, scales.astype(dtype), zp


B, SC, ZP = _weights()
A = np.ones((2, K), F32)
NB = dict(K=K, N=N, bits=BITS, block_size=BS)
#: K = 512 weights (two columns), for a configuration with max_k 256
B512, SC512, _ = qaccel.quantize_weights_nbits(np.ones((512, 2), F32), bits=4, block_size=32,
                                               symmetric=True)


def mm(**change):
    """matmul_nbits's arguments (valid, the int8 path) with ``change``."""
    return {"A": A, "B": B, "scales": SC, "zero_points": ZP, **NB, "accuracy_level": 4,
            **change}


def golden_or_rtl(op: str, rtl: bool, config=None):
    return getattr(qaccel.RTL(config) if rtl else qaccel, op)


# id: (function name, RTL or golden, args, kwargs, exception, what the message must hold:
#      the parameter, the value, the fix)
CASES = {
    # ---- QuantizeLinear
    "Q 0-d x, per-axis scale": (
        "quantize_linear", (F32(2.6), F32([1, 2])), dict(axis=0), ValueError,
        ["x is 0-d (a scalar)", "y_scale", "(2,)", "give a one-element y_scale"]),
    "Q block_size 2**70": (
        "quantize_linear", (X, np.ones((4, 2), F32)), dict(block_size=2 ** 70), ValueError,
        ["block_size", str(2 ** 70), "block_size=64"]),
    "Q block_size forgotten": (
        "quantize_linear", (X, np.ones((4, 2), F32)), {}, ValueError,
        ["y_scale", "(4, 2)", "give block_size=32"]),
    "Q blocked along the other axis": (
        "quantize_linear", (X.T, np.ones((2, 4), F32)), dict(block_size=32), ValueError,
        ["y_scale", "(2, 4)", "give axis=0, block_size=32"]),
    "Q per-axis scale of the other axis": (
        "quantize_linear", (X, np.ones(4, F32)), {}, ValueError,
        ["y_scale", "(4,)", "give axis=0"]),
    "Q per-axis scale with block_size": (
        "quantize_linear", (X, np.ones(64, F32)), dict(block_size=16), ValueError,
        ["y_scale", "(64,)", "needs block_size=0"]),
    "Q axis out of range": (
        "quantize_linear", (X, np.ones(64, F32)), dict(axis=2), ValueError,
        ["axis", "not 2", "[-2, 1]"]),
    "Q float64 x": (
        "quantize_linear", (X.astype(np.float64), S), {}, TypeError,
        ["x must be one of", "'float64'", "x.astype(np.float32)"]),
    "Q big-endian float64 x": (
        "quantize_linear", (X.astype(">f8"), S), {}, TypeError,
        ["x must be one of", "'float64'", "x.astype(np.float32)"]),
    "Q float64 y_scale": (
        "quantize_linear", (X, np.float64(0.5)), {}, TypeError,
        ["y_scale must be one of", "'float64'", "y_scale.astype(np.float32)"]),
    "Q int32 zero point": (
        "quantize_linear", (X, S, np.int32(0)), {}, TypeError,
        ["y_zero_point must be one of", "'int32'", "y_zero_point.astype(np.int8)"]),
    "Q list zero point below uint8": (
        "quantize_linear", (X, S, [-3]), {}, ValueError,
        ["y_zero_point value -3", "uint8", "give output_dtype"]),
    "Q output_dtype contradicts the zero point": (
        "quantize_linear", (X, S, np.int8(0)), dict(output_dtype=np.uint8), ValueError,
        ["output_dtype uint8", "int8", "y_zero_point.astype(np.uint8)"]),
    "Q x a string": (
        "quantize_linear", ("1.5", S), {}, TypeError,
        ["x must be a numpy array", "'1.5'", "array-like of numbers"]),
    "Q x ragged list": (
        "quantize_linear", ([[1.0], [1.0, 2.0]], S), {}, ValueError,
        ["x must be a numpy array or a rectangular list", "[[1.0], [1.0, 2.0]]"]),
    "Q x int beyond int32": (
        "quantize_linear", ([2 ** 40], S), {}, ValueError,
        ["x value 1099511627776", "int32", "pass a NumPy array of the type you mean"]),
    "Q saturate 2": (
        "quantize_linear", (X, S), dict(saturate=2), ValueError,
        ["saturate", "not 2", "True/False or 0/1"]),
    "Q output_dtype float32": (
        "quantize_linear", (X, S), dict(output_dtype=np.float32), TypeError,
        ["output_dtype must be one of", "'float32'", "int8"]),
    # ---- DequantizeLinear
    "DQ float64 x": (
        "dequantize_linear", ([1.5], S), {}, TypeError,
        ["x must be one of", "'float64'", "x holds quantised codes", "x.astype(np.int8)"]),
    "DQ zero point of another type": (
        "dequantize_linear", (np.int8([1]), S, np.uint8(0)), {}, ValueError,
        ["x_zero_point", "uint8", "x_zero_point.astype(np.int8)"]),
    "DQ list zero point beyond int8": (
        "dequantize_linear", (np.int8([1]), S, [300]), {}, ValueError,
        ["x_zero_point value 300", "int8", "pass a NumPy array of the type you mean"]),
    "DQ non-zero float8 zero point": (
        "dequantize_linear", (np.zeros(2, ml_dtypes.float8_e4m3fn), S,
                              np.array(1, ml_dtypes.float8_e4m3fn)), {}, ValueError,
        ["x_zero_point must be zero", "1", "x_zero_point=None"]),
    "DQ e8m0 scale without output_dtype": (
        "dequantize_linear", (np.int8([1]), np.array(1, ml_dtypes.float8_e8m0fnu)), {},
        ValueError, ["output_dtype", "None", "float32, float16 or bfloat16"]),
    "DQ block_size forgotten": (
        "dequantize_linear", (np.zeros((4, 64), np.int8), np.ones((4, 2), F32)), {},
        ValueError, ["x_scale", "(4, 2)", "give block_size=32"]),
    # ---- DirectML quantize
    "DML 0-d scale": (
        "dml_quantize_linear", (np.ones((2, 3), F32), S), {}, ValueError,
        ["scale must have the rank of input (2)", "()", "scale.reshape(1, 1)"]),
    "DML 1-D scale (NumPy broadcasting)": (
        "dml_quantize_linear", (np.ones((2, 3), F32), np.ones(3, F32)), {}, ValueError,
        ["scale", "(3,)", "scale.reshape(1, 3)"]),
    "DML scale not broadcastable": (
        "dml_quantize_linear", (np.ones((2, 3), F32), np.ones((2, 2), F32)), {}, ValueError,
        ["scale shape (2, 2)", "2 is neither 1 nor 3", "input's or 1"]),
    "DML float16 input, float32 scale": (
        "dml_quantize_linear", (np.ones(3, np.float16), np.ones(1, F32)), {}, TypeError,
        ["scale must have the input's type (float16)", "float32", "scale.astype(np.float16)"]),
    "DML 0-d input": (
        "dml_quantize_linear", (F32(1), F32(1)), {}, ValueError,
        ["input must have 1 to 8 dimensions", "not 0", "input.reshape(1)"]),
    "DML list zero point beyond int8": (
        "dml_quantize_linear", (np.ones(3, F32), np.ones(1, F32), [200]), {}, ValueError,
        ["zero_point value 200", "int8", "pass a NumPy array of the type you mean"]),
    # ---- MatMulNBits
    "MM float64 A": (
        "matmul_nbits", (), mm(A=A.astype(np.float64)), TypeError,
        ["A must be float32, float16 or bfloat16", "float64", "A.astype(np.float32)"]),
    "MM float16 A, float32 scales": (
        "matmul_nbits", (), mm(A=A.astype(np.float16)), TypeError,
        ["scales must be float16 like A", "float32", "scales.astype(np.float16)",
         "A.astype(np.float32)"]),
    "MM A rank 1": (
        "matmul_nbits", (), mm(A=A[0]), ValueError,
        ["A must have rank >= 2", "rank 1", "A.reshape(1, -1)"]),
    "MM A last dimension": (
        "matmul_nbits", (), mm(A=np.ones((2, 65), F32)), ValueError,
        ["A's last dimension must be K=64", "not 65", "A is (..., K)"]),
    "MM int8 B": (
        "matmul_nbits", (), mm(B=B.view(np.int8)), TypeError,
        ["B must be a uint8 array", "int8", "B.view(np.uint8)"]),
    "MM B list beyond uint8": (
        "matmul_nbits", (), mm(B=[[[256]]]), ValueError,
        ["B value 256", "uint8", "pass a NumPy array of the type you mean"]),
    "MM int64 g_idx": (
        "matmul_nbits", (), mm(g_idx=np.zeros(K, np.int64), accuracy_level=0), TypeError,
        ["g_idx must be an int32 array", "int64", "g_idx.astype(np.int32)"]),
    "MM float64 zero points": (
        "matmul_nbits", (), mm(zero_points=np.ones((N, 2))), TypeError,
        ["zero_points must be uint8 (packed) or float32", "float64",
         "zero_points.astype(np.uint8)"]),
    "MM bits 9": (
        "matmul_nbits", (), mm(bits=9), ValueError, ["bits must be in [2, 8]", "not 9"]),
    "MM block_size 48": (
        "matmul_nbits", (), mm(block_size=48), ValueError,
        ["block_size must be a power of two >= 16", "not 48"]),
    "MM block_size 2**70": (
        "matmul_nbits", (), mm(block_size=2 ** 70), ValueError,
        ["block_size must be a power of two from 16 to 2**31", str(2 ** 70),
         "the next power of two >= K"]),
    "MM bias shape": (
        "matmul_nbits", (), mm(bias=np.ones(9, F32)), ValueError,
        ["bias must have shape (8,)", "(9,)"]),
}

RTL_ONLY = {
    "RTL type not carried": (
        "quantize_linear", (np.float32([1]), S), dict(output_dtype=ml_dtypes.uint4),
        AccelConfig(q_outputs=("int8", "uint8")), ValueError,
        ["output type uint4", "config.q_outputs", "AccelConfig whose q_outputs holds"]),
    "RTL float path": (
        "matmul_nbits", (), mm(accuracy_level=0), None, ValueError,
        ["accuracy_level 0", "config.float_path False", "float_path=True"]),
    "RTL bits not carried": (
        "matmul_nbits", (), mm(), AccelConfig(nbits=(2, 8)), ValueError,
        ["bits 4", "config.nbits (2, 8)", "AccelConfig whose nbits holds 4"]),
    "RTL block_size above max_block_size": (
        "matmul_nbits", (), mm(block_size=32), AccelConfig(max_block_size=16), ValueError,
        ["block_size must be in [16, 16]", "not 32", "config.max_block_size"]),
    "RTL K above max_k": (
        "matmul_nbits", (), mm(A=np.ones((2, 512), F32), B=B512, scales=SC512, zero_points=None,
                               K=512, N=2), AccelConfig(max_k=256), ValueError,
        ["K must be at most config.max_k (256)", "not 512", "split K"]),
}


@pytest.fixture
def no_build(monkeypatch):
    """Make every build of the facade fail: the calls under test must not reach one."""
    import qaccel.engine.facade as facade

    def refuse(*args, **kwargs):
        raise AssertionError("a unit, engine or simulator was built")

    for name in ("elementwise_unit", "nbits_engine", "nbits_stream_sim", "unit_stream_sim"):
        monkeypatch.setattr(facade, name, refuse)


def _check_message(exc_info, parts):
    message = str(exc_info.value)
    missing = [p for p in parts if p not in message]
    assert not missing, f"{missing} not in {message!r}"


@pytest.mark.parametrize("rtl", [False, True], ids=["golden", "RTL"])
@pytest.mark.parametrize("case", CASES, ids=CASES)
def test_bad_call(case, rtl, no_build):
    """The golden function and qaccel.RTL's method raise the same error (type and message),
    naming the parameter, the value and the fix, before any build."""
    op, args, kwargs, error, parts = CASES[case]
    with pytest.raises(error) as want:
        golden_or_rtl(op, False)(*args, **kwargs)
    _check_message(want, parts)
    if rtl:
        with pytest.raises(error) as got:
            golden_or_rtl(op, True)(*args, **kwargs)
        assert str(got.value) == str(want.value)


@pytest.mark.parametrize("case", RTL_ONLY, ids=RTL_ONLY)
@pytest.mark.parametrize("rows", [2, 0])
def test_bad_call_for_the_configuration(case, rows, no_build):
    """What the RTL configuration does not carry, for any M (an empty A too)."""
    op, args, kwargs, config, error, parts = RTL_ONLY[case]
    if op == "matmul_nbits":
        kwargs = {**kwargs, "A": kwargs["A"][:rows]}
    elif rows == 0:
        args = (args[0][:0], *args[1:])
    with pytest.raises(error) as got:
        golden_or_rtl(op, True, config)(*args, **kwargs)
    _check_message(got, parts)


def _quantize_weights(**change):
    return qaccel.quantize_weights_nbits(**{"W": np.ones((K, N), F32), "bits": BITS,
                                            "block_size": BS, "symmetric": True, **change})


MODEL_ONLY = {
    "quantize_weights_nbits float64 W": (
        lambda: _quantize_weights(W=np.ones((K, N))), TypeError,
        ["W must be a float32 or float16 array", "float64", "W.astype(np.float32)"]),
    "quantize_weights_nbits block_size 2**70": (
        lambda: _quantize_weights(block_size=2 ** 70), ValueError,
        ["block_size must be a power of two from 16 to 2**31", str(2 ** 70)]),
    "quantize_weights_nbits symmetric 1": (
        lambda: _quantize_weights(symmetric=1), TypeError, ["symmetric must be a bool", "1"]),
    "prepare_nbits float64 scales": (
        lambda: prepare_nbits(B, SC.astype(np.float64), ZP, **NB), TypeError,
        ["scales must be float32, float16 or bfloat16", "float64", "scales.astype(np.float32)"]),
    "prepare_nbits B a string": (
        lambda: prepare_nbits("B", SC, ZP, **NB), TypeError,
        ["B must be a numpy array", "str 'B'", "array-like of numbers"]),
}


@pytest.mark.parametrize("case", MODEL_ONLY, ids=MODEL_ONLY)
def test_bad_model_call(case):
    """The model's functions without an RTL twin."""
    call, error, parts = MODEL_ONLY[case]
    with pytest.raises(error) as got:
        call()
    _check_message(got, parts)


@pytest.mark.parametrize("A_dtype, scales_dtype", [(np.float16, F32), (F32, np.float16),
                                                   (ml_dtypes.bfloat16, F32)])
def test_prepared_weights_blame_A(A_dtype, scales_dtype):
    """prepare_nbits(...).matmul(A) with A of another type than the prepared scales names A,
    its type, the weights' type and both fixes."""
    w = prepare_nbits(B, SC.astype(scales_dtype), ZP, **NB)
    a_name, s_name = np.dtype(A_dtype).name, np.dtype(scales_dtype).name
    with pytest.raises(TypeError) as got:
        w.matmul(A.astype(A_dtype))
    _check_message(got, [f"A must be {s_name}", f"not {a_name}", f"A.astype(np.{s_name})",
                         f"prepare the weights with {a_name} scales"])


@pytest.mark.parametrize("kwargs, error, parts", [
    (dict(config={"lanes": 2}), TypeError, ["config must be an AccelConfig", "{'lanes': 2}",
                                            "AccelConfig(lanes=2)"]),
    (dict(simulator="xsim"), ValueError, ["simulator must be one of verilator, icarus",
                                          "'xsim'"]),
    (dict(simulator="icarus", harness="stream"), ValueError,
     ["harness 'stream'", "'icarus'", "harness='cocotb'"]),
    (dict(check=1), TypeError, ["check must be a bool", "not 1", "check=True or False"]),
    (dict(idle=1.0), ValueError, ["idle must be a probability in [0, 1)", "not 1.0"]),
    (dict(seed=-1), ValueError, ["seed must be in [0,", "not -1"]),
])
def test_rtl_constructor(kwargs, error, parts):
    with pytest.raises(error) as got:
        qaccel.RTL(**kwargs)
    _check_message(got, parts)


@pytest.mark.parametrize("kwargs, parts", [
    (dict(lanes=3), ["lanes must be one of (1, 2, 4, 8)", "not 3"]),
    (dict(table_depth=5), ["table_depth must be a power of two", "not 5"]),
    (dict(q_inputs=("float64",)), ["q_inputs may contain float32", "'float64'"]),
    (dict(max_k=1000), ["max_k must be a power of two from max_block_size (256)", "not 1000"]),
    (dict(nbits=(9,)), ["nbits must hold distinct widths from (2, 3, 4, 5, 6, 7, 8)",
                        "not (9,)"]),
])
def test_accel_config(kwargs, parts):
    """AccelConfig's field checks name the field, the value and what it may be."""
    with pytest.raises(ValueError) as got:
        AccelConfig(**kwargs)
    _check_message(got, parts)


# ---- calls without elements: the golden model's result, nothing built ----------------------

EMPTY = {
    "Q (0, 3) per-tensor": ("quantize_linear", (np.zeros((0, 3), F32), S, np.int8(1)), {}),
    "Q (0, 3) per-axis": ("quantize_linear", (np.zeros((0, 3), F32), np.ones(3, F32)), {}),
    "Q (2, 0) blocked": ("quantize_linear", (np.zeros((2, 0), np.float16),
                                             np.zeros((2, 0), np.float16)), dict(block_size=4)),
    "Q (0,) list": ("quantize_linear", ([], 1.0), dict(output_dtype=ml_dtypes.int4)),
    "DQ (3, 0) per-axis": ("dequantize_linear", (np.zeros((3, 0), np.int8), np.ones(3, F32),
                                                 np.zeros(3, np.int8)), dict(axis=0)),
    "DQ (0, 64) blocked": ("dequantize_linear", (np.zeros((0, 64), ml_dtypes.uint4),
                                                 np.zeros((0, 2), F32)),
                           dict(block_size=32, output_dtype=ml_dtypes.bfloat16)),
    "DML (0, 3)": ("dml_quantize_linear", (np.zeros((0, 3), F32), np.ones((1, 3), F32)), {}),
    "DML (2, 0) int32": ("dml_quantize_linear", (np.zeros((2, 0), np.int32),
                                                 np.ones((2, 1), F32)),
                         dict(output_dtype=np.uint8)),
    "MM M=0": ("matmul_nbits", (), mm(A=np.zeros((0, K), F32))),
    "MM (2, 0, K) float16 with bias": (
        "matmul_nbits", (), mm(A=np.zeros((2, 0, K), np.float16), scales=SC.astype(np.float16),
                               bias=np.ones(N, np.float16))),
    "MM M=0 K=1 N=1 bits 2": ("matmul_nbits", (), dict(
        A=np.zeros((0, 1), F32), B=np.zeros((1, 1, 4), np.uint8), scales=np.ones((1, 1), F32),
        K=1, N=1, bits=2, block_size=16, accuracy_level=4)),
    "MM M=0 big-endian A": ("matmul_nbits", (), mm(A=np.zeros((0, K), ">f4"))),
}


@pytest.mark.parametrize("case", EMPTY, ids=EMPTY)
def test_empty_calls(case, no_build):
    """M = 0 and other empty shapes: the RTL returns the golden model's shape and dtype,
    simulating and building nothing."""
    op, args, kwargs = EMPTY[case]
    want = golden_or_rtl(op, False)(*args, **kwargs)
    rtl = qaccel.RTL()
    got = getattr(rtl, op)(*args, **kwargs)
    assert want.size == 0
    assert (got.shape, got.dtype) == (want.shape, want.dtype)
    assert (rtl.last_run.harness, rtl.last_run.jobs, rtl.last_run.cycles) == ("none", 0, 0)


# ---- array-likes on the simulated units -----------------------------------------------------

def _verilator_missing():
    from qaccel.sim.runner import missing_simulator

    return missing_simulator("verilator")


@pytest.mark.sim
@pytest.mark.skipif(_verilator_missing() is not None, reason=str(_verilator_missing()))
def test_rtl_converts_array_likes_as_the_golden_model():
    """Lists, Python numbers and big-endian arrays reach the units converted (check=True:
    every output equals the golden model's, bit for bit)."""
    rtl = qaccel.RTL(check=True)
    y = rtl.quantize_linear([[1.5, -2.6, 300.0]], [0.5, 0.25, 2.0], [1, 2, 3],
                            output_dtype=np.int8)
    assert y.dtype == np.int8 and rtl.last_run.beats > 0
    y = rtl.dequantize_linear(np.array([[1, -2, 300]], ">i2"), np.array(0.5, ">f4"))
    assert y.dtype == F32 and y.tolist() == [[0.5, -1.0, 150.0]]
    y = rtl.dml_quantize_linear([[1.5, -2.6]], [[0.5]])
    assert y.dtype == np.int8 and y.tolist() == [[3, -5]]
