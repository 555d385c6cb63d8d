"""Sub-byte outputs with every sign, zero and special case, and onnx.reference's bytes for
them: shared by the RTL engine tests (tests/qaccel) and the cocotb testbench tests (tests/sim).

ml_dtypes and onnx.reference store int4 / uint4 / int2 / uint2 / float4e2m1 one element per
byte with the unused upper bits zero (int4 -2 is 0x0E, not 0xFE; float4e2m1 -0.5 is 0x09).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from tests.model.naive_quant import reference_wraps
from tests.model.quant_helpers import q_opset, reference

#: The sub-byte output types.
SUB_BYTE = tuple(np.dtype(t) for t in (ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.int2,
                                        ml_dtypes.uint2, ml_dtypes.float4_e2m1fn))
#: Two rows (scales 1 and 0.5 along axis 0): negatives of every sub-byte code, -0 and +0,
#: ties, saturation, +-inf and NaN.
SPECIAL_X = np.float32([
    [-0.0, 0.0, -0.25, -0.5, -1, -1.5, -2, -2.5, -3, -4, -6, -7.5, -8, -100, 2.5, 7,
     -np.inf, np.inf, np.nan, -np.nan],
    [-0.0, 0.0, -0.125, -0.25, -0.5, -0.75, -1, -1.25, -1.5, -2, -3, -3.75, -4, -50, 1.25,
     3.5, -np.inf, np.inf, np.nan, -np.nan]])
SPECIAL_SCALE = np.float32([1, 0.5])


def special_case(out, zero_point: bool):
    """QuantizeLinear of :data:`SPECIAL_X` per axis 0 to ``out`` (a zero point of zeros, or
    ``output_dtype``): ``(args, kwargs, ref, mask)``, ``ref`` onnx.reference's output and
    ``mask`` where the golden model must equal it (all but the documented deviation: where
    the reference's int32 arithmetic wraps, for +-inf and huge quotients)."""
    out = np.dtype(out)
    zp = np.zeros(2, out) if zero_point else None
    kwargs = {"axis": 0} if zero_point else {"axis": 0, "output_dtype": out}
    args = (SPECIAL_X, SPECIAL_SCALE, zp)
    ref = reference("QuantizeLinear", list(args), y_dtype=out, **kwargs,
                    opset=q_opset(np.float32, np.float32, out, attrs=kwargs))
    mask = np.ones(SPECIAL_X.shape, bool)
    if out != ml_dtypes.float4_e2m1fn:
        mask = ~reference_wraps(*args, **kwargs)[0]
    return args, kwargs, ref, mask


def top_bit_set(codes: np.ndarray) -> np.ndarray:
    """Where a sub-byte code has its top bit set: a sign extension would fill the upper
    bits of its byte there (int4 -2: 0x0E -> 0xFE)."""
    bits = 2 if codes.dtype.name.endswith("int2") else 4
    return (np.ascontiguousarray(codes).view(np.uint8) >> (bits - 1)) == 1
