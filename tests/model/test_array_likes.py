"""Array-likes and non-native byte order (issue 19): Python numbers, lists and big-endian arrays
are converted by the rule of qaccel.model.quant's module notes (per parameter), and the result
is bit for bit onnx.reference's on the typed arrays the rule names (onnx.reference takes
big-endian float arrays itself: there on the very same inputs)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper

import qaccel
from qaccel.model.dml import check_dml
from qaccel.model.quant import check_dequantize, check_quantize
from tests.model.quant_helpers import assert_bitexact, dq_opset, q_opset, reference

F32, F16, BF16 = np.float32, np.float16, ml_dtypes.bfloat16
BE = ">f4"

# name: (raw x, scale, zero point, kwargs; the typed x, scale, zero point the rule gives)
QUANTIZE = {
    "list of floats, float scale": (
        [1.5, 2.6, -3.4], 1.0, None, {},
        (F32([1.5, 2.6, -3.4]), F32(1.0), None)),
    "Python float x, int zero point with output_dtype": (
        2.6, 0.5, 3, dict(output_dtype=np.int8),
        (F32(2.6), F32(0.5), np.int8(3))),
    "list of ints: int32 x": (
        [1, -7, 300, 2 ** 31 - 1], 2.5, None, {},
        (np.int32([1, -7, 300, 2 ** 31 - 1]), F32(2.5), None)),
    "float16 x, list per-axis scale": (
        np.array([[1.5, 2.5, 7.0], [-1.0, 3.3, 0.2]], F16), [0.5, 0.25], None, dict(axis=0),
        (np.array([[1.5, 2.5, 7.0], [-1.0, 3.3, 0.2]], F16), F16([0.5, 0.25]), None)),
    "bfloat16 x, float scale": (
        np.array([0.3, -1.7, 12.0], BF16), 0.1, [2], {},
        (np.array([0.3, -1.7, 12.0], BF16), np.array(0.1, BF16), np.uint8([2]))),
    "blocked list scale and int4 zero point": (
        np.arange(8, dtype=F32).reshape(2, 4) - 3.3, [[0.5, 0.25], [1.0, 2.0]],
        [[1, -2], [3, 7]], dict(block_size=2, output_dtype=ml_dtypes.int4),
        (np.arange(8, dtype=F32).reshape(2, 4) - 3.3, F32([[0.5, 0.25], [1.0, 2.0]]),
         np.array([[1, -2], [3, 7]], ml_dtypes.int4))),
    "float8 output, Python float zero point": (
        [1.5, -300.0, 0.01], 0.5, 0.0, dict(output_dtype=ml_dtypes.float8_e4m3fn),
        (F32([1.5, -300.0, 0.01]), F32(0.5), np.array(0, ml_dtypes.float8_e4m3fn))),
    "int32 x, tuple scale": (
        np.int32([[5, -5], [9, 1000]]), (3.0, 7.0), None, dict(axis=1),
        (np.int32([[5, -5], [9, 1000]]), F32([3.0, 7.0]), None)),
}


@pytest.mark.parametrize("name", QUANTIZE, ids=QUANTIZE)
def test_quantize_array_likes(name):
    x, s, z, kw, typed = QUANTIZE[name]
    call = check_quantize(x, s, z, **kw)
    for got, want in zip((call.x, call.scale, call.zero_point), typed, strict=True):
        assert (got is None) == (want is None)
        if want is not None:
            assert got.dtype == want.dtype and got.shape == np.shape(want)
    y = qaccel.quantize_linear(x, s, z, **kw)
    assert_bitexact(y, qaccel.quantize_linear(*typed, **kw))
    tx, ts, tz = typed
    attrs = {k: v for k, v in kw.items() if not (k == "output_dtype" and tz is not None)}
    opset = q_opset(tx.dtype, ts.dtype, y.dtype, blocked="block_size" in kw, attrs=attrs)
    assert_bitexact(y, reference("QuantizeLinear", typed, opset=opset, y_dtype=y.dtype,
                                 **attrs))


DEQUANTIZE = {
    "list of ints: int32 x, float scale": (
        [1, -2, 300], 0.5, None, {}, (np.int32([1, -2, 300]), F32(0.5), None)),
    "list x takes the typed zero point's type": (
        [1, -2, 127], 0.5, np.int8(3), {}, (np.int8([1, -2, 127]), F32(0.5), np.int8(3))),
    "uint4 x, list zero point": (
        np.array([1, 15, 7], ml_dtypes.uint4), 0.25, [3], {},
        (np.array([1, 15, 7], ml_dtypes.uint4), F32(0.25),
         np.array([3], ml_dtypes.uint4))),
    "per-axis list scale takes output_dtype": (
        np.int8([[1, -2, 3], [100, -128, 127]]), [0.1, 0.3], None,
        dict(axis=0, output_dtype=F16),
        (np.int8([[1, -2, 3], [100, -128, 127]]), F16([0.1, 0.3]), None)),
    "float8 x, Python float zero point": (
        np.array([1.5, -3.0], ml_dtypes.float8_e5m2), 2.0, 0.0, {},
        (np.array([1.5, -3.0], ml_dtypes.float8_e5m2), F32(2.0),
         np.array(0, ml_dtypes.float8_e5m2))),
}


@pytest.mark.parametrize("name", DEQUANTIZE, ids=DEQUANTIZE)
def test_dequantize_array_likes(name):
    x, s, z, kw, typed = DEQUANTIZE[name]
    call = check_dequantize(x, s, z, **kw)
    for got, want in zip((call.x, call.scale, call.zero_point), typed, strict=True):
        assert (got is None) == (want is None)
        if want is not None:
            assert got.dtype == want.dtype and got.shape == np.shape(want)
    y = qaccel.dequantize_linear(x, s, z, **kw)
    assert_bitexact(y, qaccel.dequantize_linear(*typed, **kw))
    opset = dq_opset(typed[0].dtype, kw.get("output_dtype"))
    assert_bitexact(y, reference("DequantizeLinear", typed, opset=opset, y_dtype=y.dtype,
                                 **kw))


def test_big_endian_quantize_as_onnx_reference():
    """Big-endian x and scale: the native arrays' result, which is also what onnx.reference
    gives on the big-endian arrays themselves."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((3, 5)) * 40).astype(BE)
    s = (rng.random(5) + 0.1).astype(BE)
    z = np.arange(5, dtype=">u2") * 300
    y = qaccel.quantize_linear(x, s, z, axis=1)
    assert y.dtype == np.uint16 and y.dtype.isnative
    assert_bitexact(y, qaccel.quantize_linear(x.astype(F32), s.astype(F32), z.astype(np.uint16),
                                              axis=1))
    # (onnx.reference refuses a big-endian zero point: it reads its type)
    assert_bitexact(y, _raw_reference("QuantizeLinear", {"x": x, "s": s,
                                                         "z": z.astype(np.uint16)}, axis=1))


def test_big_endian_dequantize():
    """Big-endian integer x and zero point (which onnx.reference refuses, test below): the
    native arrays' result, the reference's on those."""
    x = np.array([[-300, 5, 32767], [0, 1, -32768]], ">i2")
    s = np.array([0.5, 2.0, 1e-3], BE)
    z = np.array([1, -1, 7], ">i2")
    native = (x.astype(np.int16), s.astype(F32), z.astype(np.int16))
    y = qaccel.dequantize_linear(x, s, z, output_dtype=BF16)
    assert_bitexact(y, qaccel.dequantize_linear(*native, output_dtype=BF16))
    assert_bitexact(y, reference("DequantizeLinear", native, opset=23, y_dtype=BF16,
                                 output_dtype=BF16))


def _raw_reference(op, feeds, **attrs):
    """onnx.reference (opset 23) on a one-node model with untyped inputs, fed ``feeds`` as
    they are."""
    from onnx.reference import ReferenceEvaluator

    node = helper.make_node(op, list(feeds), ["y"], **attrs)
    inputs = [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in feeds]
    out = helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)
    model = helper.make_model(helper.make_graph([node], "g", inputs, [out]),
                              opset_imports=[helper.make_opsetid("", 23)])
    return ReferenceEvaluator(model).run(None, feeds)[0]


@pytest.mark.parametrize("op, feeds, error", [
    ("QuantizeLinear", {"x": [1.5, 2.6], "s": 1.0}, TypeError),
    ("DequantizeLinear", {"x": np.array([1, 2], ">i2"), "s": np.array(0.5, BE)}, ValueError),
])
def test_onnx_reference_refuses_what_qaccel_converts(op, feeds, error):
    """What the module notes state of onnx.reference: Python lists and numbers, and
    big-endian integer arrays, are refused there; qaccel converts them."""
    with pytest.raises(error):
        _raw_reference(op, feeds)
    fn = qaccel.quantize_linear if op == "QuantizeLinear" else qaccel.dequantize_linear
    assert fn(*feeds.values()).size == 2


DML = {
    "list input and scale": (
        [[1.5, -2.6, 300.0]], [[0.5]], None, {}, (F32([[1.5, -2.6, 300.0]]), F32([[0.5]]), None)),
    "int list input: int32, float32 scale": (
        [7, -9, 1000], [2.0], [3], dict(output_dtype=np.uint8),
        (np.int32([7, -9, 1000]), F32([2.0]), np.uint8([3]))),
    "float16 input, list scale": (
        np.array([1.5, 2.5], F16), [0.5, 0.25], None, {},
        (np.array([1.5, 2.5], F16), F16([0.5, 0.25]), None)),
    "big-endian input and scale": (
        np.array([[1.5, -7.25]], BE), np.array([[0.5, 0.1]], BE), None, {},
        (F32([[1.5, -7.25]]), F32([[0.5, 0.1]]), None)),
}


@pytest.mark.parametrize("name", DML, ids=DML)
def test_dml_array_likes(name):
    x, s, z, kw, typed = DML[name]
    call = check_dml(x, s, z, **kw)
    assert (call.x.dtype, call.scale.dtype) == (typed[0].dtype, typed[1].dtype)
    assert_bitexact(qaccel.dml_quantize_linear(x, s, z, **kw),
                    qaccel.dml_quantize_linear(*typed, **kw))


@pytest.mark.parametrize("level", [0, 4])
def test_matmul_nbits_array_likes(level):
    """Lists (A, B, scales, zero points, g_idx, bias) and big-endian arrays give the typed
    call's bits, through matmul_nbits and prepare_nbits."""
    K, N, bs = 40, 3, 16
    rng = np.random.default_rng(level)
    W = rng.standard_normal((K, N)).astype(F32)
    B, scales, zp = qaccel.quantize_weights_nbits(W, bits=4, block_size=bs, symmetric=False)
    A = rng.standard_normal((2, K)).astype(F32)
    bias = F32([0.5, -1.0, 2.0])
    g_idx = (np.arange(K, dtype=np.int32) * 7) % 3
    kw = dict(K=K, N=N, bits=4, block_size=bs, accuracy_level=level)
    want = qaccel.matmul_nbits(A, B, scales, zp, g_idx if level == 0 else None, bias, **kw)
    lists = (A.tolist(), B.tolist(), scales.tolist(), zp.tolist(),
             g_idx.tolist() if level == 0 else None, bias.tolist())
    assert_bitexact(qaccel.matmul_nbits(*lists, **kw), want)
    big = (A.astype(BE), B, scales.astype(BE), zp, g_idx.astype(">i4") if level == 0 else None,
           bias.astype(BE))
    assert_bitexact(qaccel.matmul_nbits(*big, **kw), want)
    prepared = qaccel.model.nbits.prepare_nbits(*lists[1:5], K=K, N=N, bits=4, block_size=bs)
    assert_bitexact(prepared.matmul(lists[0], lists[5], accuracy_level=level), want)


def test_float64_arrays_keep_their_type_and_are_refused():
    """A NumPy float64 array (or scalar) is not a Python number: it keeps its type, which the
    spec does not allow, and the error says how to convert it."""
    with pytest.raises(TypeError, match=r"x must be one of .*'float64': convert it: "
                                        r"x\.astype\(np\.float32\)"):
        qaccel.quantize_linear(np.float64([1.5]), 1.0)
    with pytest.raises(TypeError, match=r"y_scale .*'float64'.*y_scale\.astype\(np\.float32\)"):
        qaccel.quantize_linear([1.5], np.float64(1.0))


def test_backend_run_node_big_endian():
    """The ONNX backend's run_node declares its inputs' ONNX types: big-endian inputs are
    made native first (ONNX has no big-endian types), with the native inputs' result."""
    import qaccel.backend.golden as backend

    node = helper.make_node("QuantizeLinear", ["x", "s"], ["y"], axis=0)
    x, s = np.array([[1.5, -2.6], [7.0, 0.4]], BE), np.array([0.5, 0.25], BE)
    y = backend.run_node(node, [x, s])[0]
    assert_bitexact(y, qaccel.quantize_linear(x.astype(F32), s.astype(F32), axis=0))
