"""One-node ONNX models of the four operators, and ONNX Runtime sessions over them.

Used by the benchmark, the demo and the tests to run the same arithmetic on ONNX Runtime
(or onnx.reference) that qaccel runs.  Constant inputs become initializers, as they are in a
real quantised model; ``x`` / ``A`` stay graph inputs.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = [
    "dequantize_model",
    "matmul_nbits_model",
    "ort_quantize_weights",
    "ort_session",
    "quantize_model",
]


def _tensor_type(dtype) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _model(node, inputs, initializers, output_dtype, opset, extra_opsets=()):
    graph = helper.make_graph(
        [node], node.op_type,
        [helper.make_tensor_value_info(n, _tensor_type(a.dtype), a.shape) for n, a in inputs],
        [helper.make_tensor_value_info(node.output[0], _tensor_type(output_dtype), None)],
        initializer=[numpy_helper.from_array(a, n) for n, a in initializers],
    )
    opsets = [helper.make_opsetid("", opset), *extra_opsets]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    return model


def _q_inputs(x, scale, zero_point, constant_x):
    inputs = [] if constant_x else [("x", x)]
    inits = ([("x", x)] if constant_x else []) + [("scale", np.asarray(scale))]
    names = ["x", "scale"]
    if zero_point is not None:
        inits.append(("zero_point", np.asarray(zero_point)))
        names.append("zero_point")
    return inputs, inits, names


def quantize_model(x, y_scale, y_zero_point=None, *, axis=1, block_size=0, output_dtype=None,
                   saturate=True, opset=21) -> onnx.ModelProto:
    """A QuantizeLinear model whose graph input is ``x`` (shape and dtype of the array)."""
    inputs, inits, names = _q_inputs(x, y_scale, y_zero_point, False)
    out = (y_zero_point.dtype if y_zero_point is not None
           else output_dtype if output_dtype is not None else np.uint8)
    attrs = {"axis": axis}
    if opset >= 19:
        attrs["saturate"] = int(saturate)
    if opset >= 21:
        attrs["block_size"] = block_size
        if output_dtype is not None and y_zero_point is None:
            attrs["output_dtype"] = _tensor_type(output_dtype)
    node = helper.make_node("QuantizeLinear", names, ["y"], **attrs)
    return _model(node, inputs, inits, out, opset)


def dequantize_model(x, x_scale, x_zero_point=None, *, axis=1, block_size=0, opset=21):
    """A DequantizeLinear model whose graph input is ``x``."""
    inputs, inits, names = _q_inputs(x, x_scale, x_zero_point, False)
    attrs = {"axis": axis}
    if opset >= 21:
        attrs["block_size"] = block_size
    node = helper.make_node("DequantizeLinear", names, ["y"], **attrs)
    return _model(node, inputs, inits, np.asarray(x_scale).dtype, opset)


def matmul_nbits_model(A, B, scales, zero_points=None, g_idx=None, bias=None, *, K, N, bits,
                       block_size, accuracy_level=0) -> onnx.ModelProto:
    """A com.microsoft MatMulNBits model whose graph input is ``A``; the rest are initializers.

    Omitted optional inputs in the middle are passed as empty names, as ORT expects."""
    optional = [("zero_points", zero_points), ("g_idx", g_idx), ("bias", bias)]
    while optional and optional[-1][1] is None:
        optional.pop()
    names = ["A", "B", "scales"] + [n if a is not None else "" for n, a in optional]
    inits = [("B", B), ("scales", scales)] + [(n, a) for n, a in optional if a is not None]
    node = helper.make_node("MatMulNBits", names, ["Y"], domain="com.microsoft", K=K, N=N,
                            bits=bits, block_size=block_size, accuracy_level=accuracy_level)
    return _model(node, [("A", A)], inits, A.dtype, 21, [helper.make_opsetid("com.microsoft", 1)])


def ort_session(model: onnx.ModelProto, *, threads: int = 0):
    """An ONNX Runtime CPU session over ``model``; ``threads=0`` keeps ORT's default."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def ort_quantize_weights(W: np.ndarray, *, bits: int, block_size: int, symmetric: bool):
    """Quantise a float32 (K, N) MatMul weight with ONNX Runtime's own block quantiser.

    Calls ``quantize_matmul_{2,4,8}bits`` exactly as onnxruntime's MatMulNBitsQuantizer does
    (zero padding to whole blocks first).  Returns ``(B, scales, zero_points or None)`` in
    MatMulNBits layout: B ``[N, k_blocks, block_size*bits/8]``, scales ``[N, k_blocks]``,
    packed zero points ``[N, ceil(k_blocks*bits/8)]`` (None when symmetric).
    """
    from onnxruntime.capi import _pybind_state as ort_c

    quantize = {2: ort_c.quantize_matmul_2bits, 4: ort_c.quantize_matmul_4bits,
                8: ort_c.quantize_matmul_8bits}.get(bits)
    if quantize is None:
        raise ValueError(f"bits must be 2, 4 or 8 for ONNX Runtime's quantiser, not {bits}")
    rows, cols = W.shape
    per_byte = 8 // bits
    k_blocks = -(-rows // block_size)
    padded = np.zeros((k_blocks * block_size, cols), np.float32)
    padded[:rows] = W
    B = np.zeros((cols, k_blocks, -(-block_size // per_byte)), np.uint8)
    zero_points = np.zeros((cols, -(-k_blocks // per_byte)), np.uint8)
    scales = np.zeros((cols, k_blocks), np.float32)
    quantize(B, padded, scales, zero_points, block_size, cols, rows, symmetric)
    return B, scales, (None if symmetric else zero_points)
