"""The golden model's results on a fixed set of calls, for comparing code generation targets.

``python -m tests.model.isa_probe OUT.npz`` computes them and saves them; run under
``NUMBA_CPU_NAME`` / ``NUMBA_CPU_FEATURES`` it exercises the kernels as compiled for another
x86 tier (see tests/model/test_isa_targets.py). The calls cover every kernel family: Q / DQ
per tensor, per axis and blocked (int8, uint8, int4, float8, float16 input, the line-store
paths at 4096 columns), DirectML quantize, MX, the block quantiser, and MatMulNBits at
accuracy levels 0 and 4 for 2, 4 and 8 bits, with M = 1 and 16 (the packed and tiled paths),
and prepared 3- and 7-bit weights (stored as bytes).
"""

from __future__ import annotations

import sys

import ml_dtypes
import numpy as np

import qaccel
from qaccel.model.nbits import prepare_nbits


def results() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out = {}
    x = (rng.standard_normal((24, 4096)) * 40).astype(np.float32)
    x.flat[::97], x.flat[5::101] = np.nan, np.inf
    s_blk = rng.uniform(0.05, 0.5, (24, 128)).astype(np.float32)
    z_blk = rng.integers(-8, 8, (24, 128), dtype=np.int8)
    s_ax = rng.uniform(0.05, 0.5, 4096).astype(np.float32)
    for name, kw in {
        "pt_i8": dict(y_scale=np.float32(0.3), y_zero_point=np.int8(3)),
        "pt_u8": dict(y_scale=np.float32(0.3), y_zero_point=np.uint8(100)),
        "ax_i8": dict(y_scale=s_ax, y_zero_point=np.zeros(4096, np.int8), axis=1),
        "blk_i8": dict(y_scale=s_blk, y_zero_point=z_blk, axis=1, block_size=32),
        "blk_i4": dict(y_scale=s_blk, y_zero_point=z_blk.astype(ml_dtypes.int4), axis=1,
                       block_size=32),
        "pt_f8": dict(y_scale=np.float32(0.3),
                      y_zero_point=np.zeros((), ml_dtypes.float8_e4m3fn)),
    }.items():
        q = qaccel.quantize_linear(x, **kw)
        out[f"q_{name}"] = q.view(np.uint8)
        dq_kw = {k.replace("y_", "x_"): v for k, v in kw.items()}
        out[f"dq_{name}"] = qaccel.dequantize_linear(q, **dq_kw)
    out["q_f16"] = qaccel.quantize_linear(x.astype(np.float16), np.float16(0.3),
                                          np.int8(1)).view(np.uint8)
    out["dml"] = qaccel.dml_quantize_linear(x, np.full((1, 4096), 0.3, np.float32),
                                            np.full((1, 4096), 2, np.int8))
    for fmt in qaccel.MX_FORMATS:
        codes, scales = qaccel.mx_quantize(x, fmt)
        out[f"mx_{fmt}"] = qaccel.mx_dequantize(codes, scales, fmt)
    K, N = 200, 96
    W = rng.standard_normal((K, N)).astype(np.float32)
    for bits in (2, 4, 8):
        B, S, Z = qaccel.quantize_weights_nbits(W, bits=bits, block_size=32, symmetric=False)
        out[f"w{bits}"] = B
        for m in (1, 16):
            A = rng.standard_normal((m, K)).astype(np.float32)
            for level in (0, 4):
                out[f"mm{bits}_{m}_{level}"] = qaccel.matmul_nbits(
                    A, B, S, Z, K=K, N=N, bits=bits, block_size=32, accuracy_level=level)
    for bits in (3, 7):  # prepared: byte codes below 128 (the pmaddubsw dot product)
        B, S, Z = qaccel.quantize_weights_nbits(W, bits=bits, block_size=32, symmetric=False)
        weights = prepare_nbits(B, S, Z, K=K, N=N, bits=bits, block_size=32)
        for m in (1, 16):
            A = rng.standard_normal((m, K)).astype(np.float32)
            for level in (0, 4):
                out[f"mm{bits}_{m}_{level}_prepared"] = weights.matmul(A, accuracy_level=level)
    return out


if __name__ == "__main__":
    np.savez(sys.argv[1], **results())
