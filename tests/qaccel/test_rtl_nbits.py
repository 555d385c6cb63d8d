# amaranth: UnusedElaboratable=no
"""qaccel.RTL.matmul_nbits and ``qaccel sim matmul-nbits``: MatMulNBits answered by the
simulated engine (an int8-path engine shared with tests/rtl/test_matmul_nbits.py)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import qaccel
from qaccel import cli
from qaccel.engine import RTL, RTLMismatchError
from qaccel.model.config import AccelConfig
from qaccel.model.nbits_hw import matmul_nbits_hw
from qaccel.nbits_sim import nbits_example

SMALL = AccelConfig(pe=2, simd=4, weight_bus_width=32)                  # both paths
INT8_ONLY = AccelConfig(pe=2, simd=4, weight_bus_width=32, float_path=False)


def test_matmul_nbits_on_the_engine():
    call = nbits_example(K=100, N=5, M=3, bits=4, block_size=32, bias=True, seed=1)
    rtl = RTL(SMALL, check=True)
    y = rtl.matmul_nbits(**call, accuracy_level=4)
    want = matmul_nbits_hw(**call, accuracy_level=4, config=SMALL)
    np.testing.assert_array_equal(y.view(np.uint32), want.view(np.uint32))
    golden = qaccel.matmul_nbits(**call, accuracy_level=4)
    assert np.abs(y - golden).max() < 1e-4
    r = rtl.last_run
    assert (r.op, r.harness, r.jobs, r.elements, r.beats) == ("matmul_nbits", "stream", 1,
                                                              3 * 5 * 100, 9)
    # 9 passes of 128 / 4 beats; a pass this short waits for the previous row's fold
    # (partial_sums additions of 8 cycles: 64 cycles), plus the pipeline
    assert 9 * 32 < r.cycles < 9 * 64 + 400 and 0 < r.latency < 400


@pytest.mark.parametrize("simulator", ["verilator", "icarus"])
def test_matmul_nbits_cocotb_harness(simulator):
    """The cocotb testbench path (Icarus always takes it), with pauses on every stream."""
    from qaccel.sim.runner import missing_simulator

    if missing_simulator(simulator):
        pytest.skip(missing_simulator(simulator))
    call = nbits_example(K=40, N=3, M=2, bits=3, block_size=16, bias=True, seed=4)
    rtl = RTL(INT8_ONLY, simulator, check=True, harness="cocotb", idle=0.3, backpressure=0.3)
    y = rtl.matmul_nbits(**call, accuracy_level=4)
    want = matmul_nbits_hw(**call, accuracy_level=4, config=INT8_ONLY)
    np.testing.assert_array_equal(y.view(np.uint32), want.view(np.uint32))
    assert rtl.last_run.harness == "cocotb" and rtl.last_run.cycles > 4 * 12


def test_signature_matches_the_golden_api():
    golden = inspect.signature(qaccel.matmul_nbits).parameters
    ours = inspect.signature(RTL.matmul_nbits).parameters
    assert list(ours)[1:] == list(golden)
    assert [p.default for p in list(ours.values())[1:]] == [p.default for p in golden.values()]


@pytest.mark.parametrize(("change", "match"), [
    ({"accuracy_level": 0}, "no float path"),
    ({"g_idx": np.arange(64, dtype=np.int32) // 32}, "no float path"),
    ({"bits": 9}, "bits must be in"),
])
def test_errors(change, match):
    call = nbits_example(K=64, N=2, M=1, bits=4, block_size=32, seed=2)
    call["accuracy_level"] = 4
    call.update(change)
    with pytest.raises((ValueError, TypeError), match=match):
        RTL(INT8_ONLY).matmul_nbits(**call)


def test_mismatch_is_reported(monkeypatch):
    """check=True compares the decoded beats with the engine-order model."""
    call = nbits_example(K=64, N=3, M=2, bits=4, block_size=32, seed=3)

    def fake(self, job):
        beats = np.zeros((job.passes, 2), np.uint64)           # y = +0 everywhere
        beats[-1, 1] = 1                                        # last
        return beats, 100, 10, False

    monkeypatch.setattr(RTL, "_run_nbits_stream", fake)
    y = RTL(SMALL).matmul_nbits(**call, accuracy_level=4)
    assert y.shape == (2, 3) and not y.any()
    with pytest.raises(RTLMismatchError, match=r"differs from the engine-order model .* pass 0, "
                                               r"column 0"):
        RTL(SMALL, check=True).matmul_nbits(**call, accuracy_level=4)


def test_cli_sim_matmul_nbits(tmp_path, capsys):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(SMALL.to_json())
    assert cli.main(["sim", "matmul-nbits", "--config", str(cfg), "--K", "96", "--N", "6",
                     "--M", "2", "--bits", "4", "--block-size", "32", "--bias"]) == 0
    out = capsys.readouterr().out
    assert "RTL: bit-exact with the engine-order model" in out
    assert "MAC utilisation" in out and "vs ONNX Runtime" in out and "vs golden model" in out
