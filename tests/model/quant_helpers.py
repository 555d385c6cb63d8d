"""Shared helpers of the QuantizeLinear / DequantizeLinear / DirectML tests.

- :func:`assert_bitexact` compares arrays by their bytes (NaN equals NaN, -0 differs from +0).
- :func:`reference` runs ``onnx.reference.ReferenceEvaluator`` on a one-node model at the
  lowest opset that has the types and attributes used (:func:`q_opset`, :func:`dq_opset`).
- :func:`ort_run` runs the same node through ONNX Runtime's CPU provider.
- :func:`backend_cases` collects ONNX's own backend node test cases for an operator.
"""

from __future__ import annotations

import functools
import importlib
import warnings

import ml_dtypes
import numpy as np
from onnx import TensorProto, helper, numpy_helper

from qaccel.model.dtypes import dtype_name

F32, F16, BF16, I32 = (np.dtype(t) for t in (np.float32, np.float16, ml_dtypes.bfloat16, np.int32))
FLOAT8 = tuple(
    np.dtype(t)
    for t in (
        ml_dtypes.float8_e4m3fn,
        ml_dtypes.float8_e4m3fnuz,
        ml_dtypes.float8_e5m2,
        ml_dtypes.float8_e5m2fnuz,
    )
)
FLOAT4 = np.dtype(ml_dtypes.float4_e2m1fn)
E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
INT_TYPES = tuple(
    np.dtype(t)
    for t in (
        np.int8,
        np.uint8,
        np.int16,
        np.uint16,
        ml_dtypes.int4,
        ml_dtypes.uint4,
        ml_dtypes.int2,
        ml_dtypes.uint2,
    )
)
Q_OUTPUTS = INT_TYPES + FLOAT8 + (FLOAT4,)
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def tid(value) -> str:
    """Short pytest id for dtypes and other parameters."""
    if value is None:
        return "none"
    if isinstance(value, (np.dtype, type)):
        return dtype_name(np.dtype(value))
    if isinstance(value, tuple) and all(isinstance(v, (np.dtype, type)) for v in value):
        return "/".join(tid(v) for v in value)
    return None


def bits(a: np.ndarray) -> np.ndarray:
    """Return the raw bit patterns of ``a`` as unsigned integers of its itemsize."""
    a = np.ascontiguousarray(a)
    return a.view(_UINT[a.dtype.itemsize])


def assert_bitexact(actual, expected, *, mask=None, context="") -> None:
    """Assert equal dtype, shape and bytes, optionally only where ``mask`` is True."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.dtype == expected.dtype, f"{context}dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{context}shape {actual.shape} != {expected.shape}"
    a, e = bits(actual), bits(expected)
    bad = a != e
    if mask is not None:
        bad &= np.broadcast_to(mask, bad.shape)
    if bad.any():
        idx = np.argwhere(bad)[:8]
        rows = [
            f"  at {tuple(int(i) for i in ix)}: {actual[tuple(ix)]!r} (0x{int(a[tuple(ix)]):x}) "
            f"!= {expected[tuple(ix)]!r} (0x{int(e[tuple(ix)]):x})"
            for ix in idx
        ]
        raise AssertionError(f"{context}{int(bad.sum())} of {bad.size} differ:\n" + "\n".join(rows))


def onnx_type(dtype) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def q_opset(x_dtype, scale_dtype, out_dtype, *, blocked=False, precision=None, attrs=()) -> int:
    """Lowest QuantizeLinear opset with these types and features (13 at least, for ``axis``)."""
    out = np.dtype(out_dtype)
    opset = 13
    if np.dtype(x_dtype) in (F16, BF16) or out in FLOAT8 or "saturate" in attrs:
        opset = 19
    if out in INT_TYPES[2:6] or blocked or "output_dtype" in attrs:
        opset = 21
    if precision is not None or out == FLOAT4 or np.dtype(x_dtype) != np.dtype(scale_dtype):
        opset = 23
    if np.dtype(scale_dtype) == E8M0:
        opset = 24
    if out in INT_TYPES[6:]:
        opset = 25
    return opset


def dq_opset(x_dtype, out_dtype=None, *, blocked=False, scale_dtype=None) -> int:
    """Lowest DequantizeLinear opset of onnx.reference with these types (19 at least)."""
    x = np.dtype(x_dtype)
    opset = 19
    if x in INT_TYPES[2:6] or blocked:
        opset = 21
    if out_dtype is not None or x == FLOAT4:
        opset = 23
    if scale_dtype is not None and np.dtype(scale_dtype) == E8M0:
        opset = 24
    if x in INT_TYPES[6:]:
        opset = 25
    return opset


def _attr_value(value):
    if isinstance(value, (np.dtype, type)):
        return onnx_type(value)
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    return value


def node_model(op, inputs, opset, attrs, output_dtype, *, ir_version=None):
    """Return a one-node ModelProto for ``op`` with typed inputs ``x``, ``s`` and maybe ``z``."""
    names = ["x", "s", "z"][: len(inputs)]
    value_infos = [
        helper.make_tensor_value_info(n, onnx_type(a.dtype), a.shape)
        for n, a in zip(names, inputs, strict=True)
    ]
    node = helper.make_node(op, names, ["y"], **{k: _attr_value(v) for k, v in attrs.items()})
    out = helper.make_tensor_value_info("y", onnx_type(output_dtype), None)
    graph = helper.make_graph([node], op, value_infos, [out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    if ir_version is not None:
        model.ir_version = ir_version
    return model


@functools.lru_cache(maxsize=512)
def _evaluator(op, opset, types, ranks, attrs, output_dtype):
    from onnx.reference import ReferenceEvaluator

    inputs = [np.zeros((1,) * r, t) for t, r in zip(types, ranks, strict=True)]
    return ReferenceEvaluator(node_model(op, inputs, opset, dict(attrs), output_dtype))


def reference(op, inputs, *, opset, y_dtype, **attrs) -> np.ndarray:
    """Run ``op`` in onnx.reference; ``inputs`` = x, scale[, zero point] (None is dropped)."""
    inputs = [np.asarray(a) for a in inputs if a is not None]
    key = (
        op,
        opset,
        tuple(a.dtype for a in inputs),
        tuple(a.ndim for a in inputs),
        tuple(sorted((k, _attr_value(v)) for k, v in attrs.items())),
        np.dtype(y_dtype),
    )
    names = ["x", "s", "z"]
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return _evaluator(*key).run(None, dict(zip(names, inputs, strict=False)))[0]


@functools.lru_cache(maxsize=128)
def _session(model_bytes):
    import onnxruntime as ort

    return ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])


def _ort_value(a: np.ndarray):
    import onnxruntime as ort

    if a.dtype in FLOAT8:  # ml_dtypes arrays go in as bytes with their ONNX type
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(a.view(np.uint8), onnx_type(a.dtype))
    return ort.OrtValue.ortvalue_from_numpy(a)


def ort_run(op, inputs, *, opset, y_dtype, **attrs) -> np.ndarray:
    """Run ``op`` on ONNX Runtime's CPU provider (outputs of NumPy-native dtypes only)."""
    inputs = [np.ascontiguousarray(a) for a in inputs if a is not None]
    model = node_model(op, inputs, opset, attrs, y_dtype, ir_version=10)
    sess = _session(model.SerializeToString())
    feeds = {n: _ort_value(a) for n, a in zip(["x", "s", "z"], inputs, strict=False)}
    return sess.run_with_ort_values(None, feeds)[0].numpy()


@functools.cache
def backend_cases(op_type: str) -> list:
    """Return ONNX's backend node test cases of ``op_type`` as (name, inputs, attrs, outputs).

    Importing ``onnx.backend.test.case.node.<op>`` registers its cases (exports run at import);
    ``collect_testcases`` would import every operator's module, which takes 15 s.
    """
    from onnx.backend.test.case import node

    importlib.import_module(f"onnx.backend.test.case.node.{op_type.lower()}")
    cases = []
    for case in node._NodeTestCases:
        graph_node = case.model.graph.node[0]
        if graph_node.op_type != op_type:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in graph_node.attribute}
        (inputs, outputs), *_ = case.data_sets
        arrays = [
            numpy_helper.to_array(a) if isinstance(a, TensorProto) else np.asarray(a)
            for a in inputs
        ]
        expected = [
            numpy_helper.to_array(a) if isinstance(a, TensorProto) else np.asarray(a)
            for a in outputs
        ]
        cases.append((case.name, arrays, attrs, expected[0]))
    return cases


def dtype_of(onnx_elem_type: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(onnx_elem_type))
