"""A real quantised model on the MatMulNBits engine.

A float32 MLP (MatMul -> Add -> Relu -> MatMul -> Add) is quantised by ONNX Runtime's own
``MatMulNBitsQuantizer`` (4 bits, blocks of 32, asymmetric: packed uint8 zero points) at
accuracy levels 0 and 4, and run on :mod:`qaccel.backend.rtl`: both MatMulNBits nodes on the
simulated engine, Add and Relu on ``onnx.reference``. Level 4 runs on the v2 engine's int8
path (the pe 4 x simd 2, row tiles of 3 shape of tests/rtl/nbits/test_matmul_nbits_v2.py), level 0
on its float path (the same shape with float_path and row tiles of 4 there); the Verilator
builds are shared with those tests.

Checks, with ``bound = sum_k |a_k w_k|`` (``w`` the dequantised weight):

* per node, on the input the engine was given: the engine's output against ONNX Runtime running
  that node alone and against :func:`qaccel.matmul_nbits`, within ``1e-6 * bound``;
* the whole model against ONNX Runtime and against :mod:`qaccel.backend.golden`, the first
  node's output within ``1e-6 * bound`` (same input ``x``) and the final output within the
  propagated tolerance of :func:`_final_tolerance`.

``pytest -s`` prints the figures: nodes on the engine, cycles per node, error ratios.
"""

from __future__ import annotations

import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

import qaccel
import qaccel.backend.golden as golden_backend
import qaccel.backend.rtl as rtl_backend
from qaccel import onnx_models
from qaccel.engine import RTL
from qaccel.explore.perf import nbits_v2_call
from qaccel.model.nbits import error_bound, max_relative_error
from qaccel.sim.runner import missing_simulator
from tests.model.quant_helpers import assert_bitexact
from tests.rtl.nbits.test_matmul_nbits_v2 import FLOAT_SHAPES, SHAPES

pytestmark = [pytest.mark.sim,
              pytest.mark.skipif(missing_simulator("verilator") is not None,
                                 reason=missing_simulator("verilator") or "")]

V2 = SHAPES["p4s2t3"]                                       # the v2 engine, int8 path only
FLOAT = FLOAT_SHAPES["p4s2t4f"]                             # the same with the float path
#: The engine configuration of each accuracy level.
CONFIGS = {0: FLOAT, 4: V2}
M, K, H, N = 3, 100, 72, 40                                 # x (M, K) -> h (M, H) -> y (M, N)
BLOCK = 32
TOL = 1e-6


def mlp_model(seed: int = 0) -> onnx.ModelProto:
    """The float32 MLP; h0 (first MatMul), h (Relu) and y0 (second MatMul) are outputs too."""
    rng = np.random.default_rng(seed)
    inits = {"W1": rng.standard_normal((K, H)) * 0.1, "b1": rng.standard_normal(H) * 0.1,
             "W2": rng.standard_normal((H, N)) * 0.1, "b2": rng.standard_normal(N) * 0.1}
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h0"], name="fc1"),
             helper.make_node("Add", ["h0", "b1"], ["h1"], name="bias1"),
             helper.make_node("Relu", ["h1"], ["h"], name="relu"),
             helper.make_node("MatMul", ["h", "W2"], ["y0"], name="fc2"),
             helper.make_node("Add", ["y0", "b2"], ["y"], name="bias2")]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [M, d])
               for n, d in (("y", N), ("h0", H), ("h", H), ("y0", N))]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [M, K])], outputs,
        initializer=[numpy_helper.from_array(a.astype(np.float32), n) for n, a in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def quantise(model: onnx.ModelProto, accuracy_level: int, *, bits: int = 4,
             symmetric: bool = False) -> onnx.ModelProto:
    q = MatMulNBitsQuantizer(onnx.ModelProto.FromString(model.SerializeToString()), bits=bits,
                           block_size=BLOCK, is_symmetric=symmetric,
                           accuracy_level=accuracy_level)
    q.process()
    return q.model.model


def _nbits_call(node: onnx.NodeProto, inits: dict) -> dict:
    """The MatMulNBits node as ``qaccel.matmul_nbits`` keyword arguments (without A)."""
    names = list(node.input) + [""] * (6 - len(node.input))
    call = {key: inits[name] if name else None for key, name in
            zip(("B", "scales", "zero_points", "g_idx", "bias"), names[1:], strict=True)}
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    call.update(K=attrs["K"], N=attrs["N"], bits=attrs.get("bits", 4),
                block_size=attrs["block_size"], accuracy_level=attrs.get("accuracy_level", 0))
    return call


def _bound(A: np.ndarray, call: dict) -> np.ndarray:
    """sum_k |a_k w_k| per output element (w: the dequantised weight, K x N)."""
    return error_bound(A, **{k: v for k, v in call.items() if k not in ("bias", "accuracy_level")})


def _seen_activations(h: np.ndarray, accuracy_level: int) -> np.ndarray:
    """The activations a MatMulNBits kernel multiplies: ``h`` itself (levels 0..3), or ``h``
    quantised to int8 per row and block and dequantised (level 4)."""
    if accuracy_level != 4:
        return h.astype(np.float64)
    from qaccel.model.nbits_kernels import quantize_a

    qa, sa, _ = quantize_a(np.ascontiguousarray(h, np.float32), BLOCK)
    return qa.astype(np.float64) * np.repeat(sa, BLOCK, axis=1)[:, :h.shape[1]]


def _final_tolerance(h_ours, h_ref, y_ours, y_ref, call) -> np.ndarray:
    """How far the final outputs of two runs may differ when each MatMulNBits node is within
    ``TOL * bound`` of the exact product of the activations it sees, and the runs reach the
    second node with different inputs ``h_ours`` and ``h_ref``:

        TOL * (|h_ours| @ |W2| + |h_ref| @ |W2|)     each run's second node against exact
        + |a(h_ours) - a(h_ref)| @ |W2|               the exact product of the input difference
        + 2**-23 * max(|y_ours|, |y_ref|)             the final Add's roundings

    with ``a(h)`` the activations the kernel multiplies (:func:`_seen_activations`: at level
    4, a tiny difference in ``h`` can move an int8 code by one step of its block's scale)."""
    W = np.abs(qaccel.matmul_nbits(np.eye(call["K"], dtype=np.float32),
                                   **{**call, "bias": None, "accuracy_level": 0}))
    level = call["accuracy_level"]
    diff = np.abs(_seen_activations(h_ours, level) - _seen_activations(h_ref, level))
    return (TOL * (np.abs(h_ours) @ W + np.abs(h_ref) @ W) + diff @ W
            + 2.0 ** -23 * np.maximum(np.abs(y_ours), np.abs(y_ref)))


@pytest.fixture(scope="module")
def float_model():
    return mlp_model()


@pytest.mark.parametrize(("bits", "symmetric"), [(4, False), (4, True), (8, False), (2, False)],
                         ids=["4bit-zp", "4bit-sym", "8bit-zp", "2bit-zp"])
@pytest.mark.parametrize("accuracy_level", [0, 4])
def test_quantised_mlp_on_the_engine(float_model, accuracy_level, bits, symmetric):
    qmodel = quantise(float_model, accuracy_level, bits=bits, symmetric=symmetric)
    inits = {t.name: numpy_helper.to_array(t) for t in qmodel.graph.initializer}
    nbits = [n for n in qmodel.graph.node if n.op_type == "MatMulNBits"]
    # what ORT's quantiser made: every MatMul became a MatMulNBits (packed uint8 zero points
    # unless symmetric; no g_idx, no bias: the Adds stay)
    assert [n.op_type for n in qmodel.graph.node] == ["MatMulNBits", "Add", "Relu",
                                                      "MatMulNBits", "Add"]
    calls = [_nbits_call(n, inits) for n in nbits]
    for c in calls:
        assert (c["bits"], c["block_size"], c["accuracy_level"]) == (bits, BLOCK,
                                                                     accuracy_level)
        if symmetric:
            assert c["zero_points"] is None
        else:
            assert c["zero_points"] is not None and c["zero_points"].dtype == np.uint8
        assert c["g_idx"] is None and c["bias"] is None
    print(f"\n  accuracy_level {accuracy_level}, {bits} bits, "
          f"{'symmetric' if symmetric else 'asymmetric'}: ORT's MatMulNBitsQuantizer made")
    for n, c in zip(nbits, calls, strict=True):
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        zp = c["zero_points"]
        print(f"    {n.name}: {attrs}, inputs {list(n.input)}; B {c['B'].shape}, scales "
              f"{c['scales'].shape}, zero_points "
              f"{'none' if zp is None else f'{zp.shape} {zp.dtype}'}")

    x = np.random.default_rng(1).standard_normal((M, K)).astype(np.float32)
    names = [o.name for o in qmodel.graph.output]

    t0 = time.perf_counter()
    config = CONFIGS[accuracy_level]
    rep = rtl_backend.prepare(qmodel, engine=RTL(config, check=True))
    ours = dict(zip(names, rep.run([x]), strict=True))
    t_rtl = time.perf_counter() - t0
    session = onnx_models.ort_session(qmodel, threads=1)
    ort = dict(zip(names, session.run(None, {"x": x}), strict=True))
    gold = dict(zip(names, golden_backend.prepare(qmodel).run([x]), strict=True))

    # every MatMulNBits node ran on the engine, nothing else did
    assert rep.node_counts == {"MatMulNBits": 2}
    assert [op for op, _ in rep.runs] == ["MatMulNBits"] * 2
    print(f"    engine nodes {len(rep.runs)} (of {len(qmodel.graph.node)}); "
          f"RTL backend run {t_rtl:.1f} s")
    for n, c, (_, r) in zip(nbits, calls, rep.runs, strict=True):
        assert r.op == "matmul_nbits" and r.elements == M * n_of(n) * k_of(n)
        # one y beat per result of a whole column group, the model's cycles
        cols = config.pe // 2 if bits > 4 else config.pe
        assert r.beats == M * -(-n_of(n) // cols) * cols
        assert r.cycles == nbits_v2_call(config, M=M, N=n_of(n), K=k_of(n), bits=bits,
                                         block_size=c["block_size"],
                                         float_path=accuracy_level != 4).cycles
        print(f"    {n.name}: {r.elements:,} MACs, {r.beats} y beats, {r.cycles:,} cycles "
              f"({r.elements / r.cycles:.2f} MACs/cycle), latency {r.latency}, "
              f"{r.wall_time:.2f} s wall, build {'reused' if r.build_reused else 'compiled'}")

    # per node, on the input the engine was given (x; then the engine run's own h)
    values = {"x": x, **ours}
    for n, c in zip(nbits, calls, strict=True):
        A, y = values[n.input[0]], values[n.output[0]]
        bound = _bound(A, c)
        ort_node = onnx_models.ort_session(onnx_models.matmul_nbits_model(A, **c), threads=1).run(
            None, {"A": A})[0]
        e_ort = max_relative_error(y, ort_node, bound)
        e_gold = max_relative_error(y, qaccel.matmul_nbits(A, **c), bound)
        print(f"    {n.name} (same input): max |y - ref| / sum|a*w| vs ORT {e_ort:.2e}, "
              f"vs golden {e_gold:.2e} (tolerance {TOL:g})")
        assert e_ort <= TOL and e_gold <= TOL

    # the whole model against ORT and the golden backend
    c1, c2 = calls
    for ref_name, ref in (("ORT", ort), ("golden", gold)):
        e_h0 = max_relative_error(ours["h0"], ref["h0"], _bound(x, c1))
        tol = _final_tolerance(ours["h"], ref["h"], ours["y"], ref["y"], c2)
        e_y = float(np.max(np.abs(ours["y"].astype(np.float64) - ref["y"]) / tol))
        plain = max_relative_error(ours["y0"], ref["y0"], _bound(ours["h"], c2))
        h_same = np.array_equal(ours["h"].view(np.uint32), ref["h"].view(np.uint32))
        print(f"    model vs {ref_name}: fc1 output {e_h0:.2e} of sum|a*w|; h bit-equal "
              f"{h_same}; fc2 output {plain:.2e} of sum|a*w|; final y at "
              f"{e_y:.2f} of the propagated tolerance (max |dy| "
              f"{np.max(np.abs(ours['y'] - ref['y'])):.2e})")
        assert e_h0 <= TOL and e_y <= 1.0
    # and the quantised model is still the float model, roughly (4-bit weights)
    (y_float,) = onnx_models.ort_session(float_model, threads=1).run(["y"], {"x": x})
    drift = float(np.linalg.norm(ours["y"] - y_float) / np.linalg.norm(y_float))
    print(f"    quantised vs float model: |y - y_float| / |y_float| = {drift:.3f}")
    assert drift < (1.0 if bits == 2 else 0.3)


def n_of(node) -> int:
    return next(helper.get_attribute_value(a) for a in node.attribute if a.name == "N")


def k_of(node) -> int:
    return next(helper.get_attribute_value(a) for a in node.attribute if a.name == "K")


def test_prepare_on_a_config(float_model):
    """``config=`` runs the model on an RTL of that configuration (the backend's own engine
    unchanged); the same engine gives the same bits; ``engine`` and ``config`` exclude each
    other; a level-0 model on a configuration without a float path is refused, naming it."""
    qmodel = quantise(float_model, 4)
    x = np.random.default_rng(2).standard_normal((M, K)).astype(np.float32)
    before = rtl_backend.RTLBackend.engine
    rep = rtl_backend.prepare(qmodel, config=V2)
    assert rep.rtl.config == V2 and rtl_backend.RTLBackend.engine is before
    y = rep.run([x])[0]
    y2 = rtl_backend.run_model(qmodel, [x], engine=RTL(V2))[0]
    assert_bitexact(y, y2)
    assert [op for op, _ in rep.runs] == ["MatMulNBits"] * 2
    with pytest.raises(ValueError, match="no float path .*accuracy_level 0"):
        rtl_backend.run_model(quantise(float_model, 0), [x], engine=RTL(V2))
    with pytest.raises(TypeError, match="engine or config"):
        rtl_backend.prepare(qmodel, engine=RTL(V2), config=V2)
    with pytest.raises(TypeError, match="must be a qaccel.RTL"):
        rtl_backend.prepare(qmodel, engine=qaccel)
