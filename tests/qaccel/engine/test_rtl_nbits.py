# amaranth: UnusedElaboratable=no
"""qaccel.RTL.matmul_nbits and ``qaccel sim matmul-nbits``: MatMulNBits answered by the
simulated engine. Level-4 calls with integer or no zero points run on the v2 engine (the
pe 4 x simd 2, row tiles of 3 shape of tests/rtl/nbits/test_matmul_nbits_v2.py, so the builds are
shared); float-path calls (levels 0..3, g_idx, float zero points) on the v2 engine of a
configuration with ``float_path`` (the pe 4 x simd 2 float shape there); the default engine
(ecp5-25k) once."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import qaccel
from qaccel import onnx_models
from qaccel.app import cli
from qaccel.app.nbits_report import nbits_example
from qaccel.engine import RTL, RTLMismatchError
from qaccel.explore.perf import nbits_v2_call
from qaccel.model.nbits import error_bound
from qaccel.model.nbits_hw import matmul_nbits_v2
from qaccel.sim.runner import missing_simulator
from tests.model.quant_helpers import assert_bitexact
from tests.rtl.nbits.test_matmul_nbits_v2 import FLOAT_SHAPES, SHAPES

pytestmark = pytest.mark.skipif(missing_simulator("verilator") is not None,
                                reason=missing_simulator("verilator") or "")

V2 = SHAPES["p4s2t3"]                                   # pe 4 x simd 2, row tiles of 3
FLOAT = FLOAT_SHAPES["p4s2t4f"]                        # the same with the float path


def _call(*, K, N, M, bits, block_size, zero_points="packed", bias=True, seed=0,
          dtype=np.float32) -> dict:
    call = nbits_example(K=K, N=N, M=M, bits=bits, block_size=block_size,
                         zero_points=zero_points, bias=bias, seed=seed)
    call["A"] = call["A"].astype(dtype)
    call["scales"] = call["scales"].astype(dtype)
    if bias:
        call["bias"] = call["bias"].astype(dtype)
    return call


def _bound(call: dict) -> np.ndarray:
    """sum_k |a_k w_k| per output element (w the dequantised weight)."""
    return error_bound(**{k: v for k, v in call.items() if k != "bias"})


#: bits, block_size, K, N, M, zero points, bias, A's type: 2/4/8 bits, M 1..7 (one, several
#: and partial row tiles of 3), K and N off the block and the group, float16 A. (ORT's
#: level-4 kernel takes its float path for 2-bit weights in blocks of 16, so 2 bits has 32.)
V2_CALLS = [
    (4, 32, 100, 5, 7, "packed", True, np.float32),
    (2, 32, 70, 9, 3, "none", False, np.float32),
    (8, 64, 200, 6, 4, "packed", True, np.float16),
    (4, 16, 48, 4, 1, "none", True, np.float16),
]


@pytest.mark.parametrize(("idle", "backpressure"), [(0.0, 0.0), (0.3, 0.4)],
                         ids=["full-speed", "pauses"])
def test_level4_runs_on_v2(idle, backpressure):
    """Level 4 runs on the v2 engine: bit-exact with matmul_nbits_v2; within 1e-6 of
    sum|a*w| of the golden model and ONNX Runtime; one y beat per result; without pauses the
    cycles are the performance model's, with random pauses more."""
    rtl = RTL(V2, check=True, idle=idle, backpressure=backpressure, seed=5)
    for k, (bits, bs, K, N, M, zp, bias, dtype) in enumerate(V2_CALLS):
        call = _call(K=K, N=N, M=M, bits=bits, block_size=bs, zero_points=zp, bias=bias,
                     seed=k, dtype=dtype)
        y = rtl.matmul_nbits(**call, accuracy_level=4)
        want = matmul_nbits_v2(**call, accuracy_level=4)
        assert y.dtype == dtype and y.shape == (M, N)
        assert_bitexact(y, want)
        kw = {key: v for key, v in call.items() if key != "A"}
        ort = onnx_models.ort_session(onnx_models.matmul_nbits_model(
            call["A"], **kw, accuracy_level=4)).run(None, {"A": call["A"]})[0]
        bound = _bound(call)
        for ref in (qaccel.matmul_nbits(**call, accuracy_level=4), ort):
            # float16 A: both results rounded from float32, up to a unit in the last place
            ulp = 0.0 if dtype == np.float32 else np.abs(ref.astype(np.float64)) * 2.0**-10
            err = np.abs(y.astype(np.float64) - ref.astype(np.float64)) - ulp
            assert np.all(err <= 1e-6 * bound), float(np.max(err / bound))
        r = rtl.last_run
        cols = V2.pe // 2 if bits > 4 else V2.pe
        model = nbits_v2_call(V2, M=M, N=N, K=K, bits=bits, block_size=bs, bias=bias).cycles
        assert (r.op, r.harness, r.jobs, r.elements, r.load_cycles) == (
            "matmul_nbits", "stream", 1, M * N * K, 0)
        assert r.beats == M * -(-N // cols) * cols and (r.build_reused or k == 0)
        assert r.cycles == model if idle == 0 else r.cycles > model
        assert 0 < r.latency < r.cycles


@pytest.mark.parametrize("simulator", ["verilator", "icarus"])
def test_level4_cocotb_harness(simulator):
    """The cocotb testbench path (Icarus always takes it) on v2, with pauses on every
    stream and a bias; the same bits."""
    if missing_simulator(simulator):
        pytest.skip(missing_simulator(simulator))
    call = _call(K=40, N=3, M=4, bits=3, block_size=16, seed=4)
    rtl = RTL(V2, simulator, check=True, harness="cocotb", idle=0.3, backpressure=0.3)
    y = rtl.matmul_nbits(**call, accuracy_level=4)
    assert_bitexact(y, matmul_nbits_v2(**call, accuracy_level=4))
    r = rtl.last_run
    assert (r.harness, r.beats, r.latency) == ("cocotb", 4 * 4, None) and r.cycles > 4 * 20


@pytest.mark.parametrize("level", [0, 4])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
def test_nan_and_inf_activations_bit_exact(level, dtype):
    """NaN and +-inf in A (the float path at level 0, the int8 path at level 4): every y
    code is matmul_nbits_v2's, NaN sign and payload included (``check`` and the testbench
    take any NaN for any other, so this compares the bytes itself)."""
    call = _call(K=64, N=5, M=3, bits=4, block_size=32, seed=1, dtype=dtype)
    call["A"][0, 3] = np.nan
    call["A"][1, 40] = np.inf
    call["A"][2, 7:9] = [-np.inf, np.inf]
    y = RTL(FLOAT).matmul_nbits(**call, accuracy_level=level)
    want = matmul_nbits_v2(**call, accuracy_level=level)
    assert np.isnan(want).all()       # each row has a NaN or an inf (level 4: NaNs of both signs)
    assert_bitexact(y, want)


def test_float_path_on_v2():
    """Levels 0 and 3, a g_idx call and a float-zero-point call at level 4 on a
    configuration with float_path: the v2 engine's float path, bit-exact with
    matmul_nbits_v2, within 1e-6 * sum|a w| of the golden model, one y beat per result, the
    model's cycles (without g_idx)."""
    rtl = RTL(FLOAT, check=True)
    for level, zp, gidx in ((0, "packed", False), (3, "none", False), (4, "packed", True),
                            (4, "float", False)):
        call = _call(K=64, N=5, M=2, bits=4, block_size=32, zero_points=zp, seed=level)
        if gidx:
            call["g_idx"] = (np.arange(64, dtype=np.int32) * 7 % 64) // 32
        y = rtl.matmul_nbits(**call, accuracy_level=level)
        want = matmul_nbits_v2(**call, accuracy_level=level)
        assert_bitexact(y, want)
        assert np.all(np.abs(y - qaccel.matmul_nbits(**call, accuracy_level=level))
                      <= 1e-6 * _bound(call))
        r = rtl.last_run
        assert (r.harness, r.elements, r.beats) == ("stream", 2 * 5 * 64, 2 * 8)  # 2 groups
        if not gidx:
            assert r.cycles == nbits_v2_call(FLOAT, M=2, N=5, K=64, bits=4, block_size=32,
                                             float_path=True,
                                             float_zero_points=zp == "float").cycles


def test_default_engine():
    """The default configuration's engine (ecp5-25k: pe 32, 12 of 16 MAC pairs on DSPs),
    two row tiles of 4 and a 5-bit call (half-width groups): bit-exact, the model's cycles."""
    rtl = RTL(check=True)
    for bits, M in ((4, 5), (5, 1)):
        call = _call(K=96, N=40, M=M, bits=bits, block_size=32, seed=bits)
        y = rtl.matmul_nbits(**call, accuracy_level=4)
        assert_bitexact(y, matmul_nbits_v2(**call, accuracy_level=4))
        model = nbits_v2_call(rtl.config, M=M, N=40, K=96, bits=bits, block_size=32)
        assert rtl.last_run.cycles == model.cycles
        assert rtl.last_run.elements == M * 40 * 96


def test_signature_matches_the_golden_api():
    golden = inspect.signature(qaccel.matmul_nbits).parameters
    ours = inspect.signature(RTL.matmul_nbits).parameters
    assert list(ours)[1:] == list(golden)
    assert [p.default for p in list(ours.values())[1:]] == [p.default for p in golden.values()]


@pytest.mark.parametrize(("change", "match"), [
    ({"accuracy_level": 0}, r"no float path .*accuracy_level 0 with zero points packed and "
                            r"no g_idx"),
    ({"g_idx": np.arange(64, dtype=np.int32) // 32}, r"no float path .*accuracy_level 4 "
                                                     r"with zero points packed and a g_idx"),
    ({"zero_points": np.full((2, 2), 8, np.float32)}, r"no float path .*zero points float"),
    ({"bits": 9}, "bits must be in"),
    ({"block_size": 512, "B": np.zeros((2, 1, 256), np.uint8),
      "scales": np.ones((2, 1), np.float32), "zero_points": None},
     r"block_size must be in \[16, 256\] for this engine, not 512"),
    ({"K": 1100, "A": np.ones((1, 1100), np.float32), "B": np.zeros((2, 35, 16), np.uint8),
      "scales": np.ones((2, 35), np.float32), "zero_points": None},
     r"K must be at most config.max_k \(1024\), not 1100"),
])
def test_errors(change, match):
    """What the v2 configuration does not take, before anything is simulated."""
    call = nbits_example(K=64, N=2, M=1, bits=4, block_size=32, seed=2)
    call["accuracy_level"] = 4
    call.update(change)
    with pytest.raises((ValueError, TypeError), match=match):
        RTL(V2).matmul_nbits(**call)


def test_mismatch_is_reported(monkeypatch):
    """check=True compares the decoded words with the engine's model, naming the row, the
    column and both codes."""
    call = _call(K=64, N=3, M=2, bits=4, block_size=32, seed=3)

    def fake_v2(self, engine, job):
        beats = np.zeros(len(job.y), np.uint64)             # y = +0 everywhere
        beats[-1] = 1 << 32                                 # last
        return beats, 100, 10, False

    monkeypatch.setattr(RTL, "_run_nbits_v2_stream", fake_v2)
    y = RTL(V2).matmul_nbits(**call, accuracy_level=4)
    assert y.shape == (2, 3) and not y.any()
    with pytest.raises(RTLMismatchError, match=r"v2 engine differs from its model .* first at "
                                               r"row 0, column 0: RTL 0x00000000, model 0x"):
        RTL(V2, check=True).matmul_nbits(**call, accuracy_level=4)


def test_cli_sim_matmul_nbits(tmp_path, capsys):
    """``qaccel sim matmul-nbits`` on the v2 engine: bit-exact, the RTL's cycles equal the
    model's, the error against the golden model and ONNX Runtime."""
    cfg = tmp_path / "cfg.json"
    cfg.write_text(V2.to_json())
    assert cli.main(["sim", "matmul-nbits", "--config", str(cfg), "--K", "96", "--N", "6",
                     "--M", "4", "--bits", "4", "--block-size", "32", "--bias"]) == 0
    out = capsys.readouterr().out
    assert "RTL: bit-exact with the engine's model (qaccel.model.nbits_hw.matmul_nbits_v2)" in out
    assert "model (nbits_v2_call)" in out and ": equal" in out and "MAC/cycle" in out
    assert "vs ONNX Runtime" in out and "vs golden model" in out
