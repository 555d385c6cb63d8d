"""Float32 operand generators and the NumPy comparison of the float32 unit tests
(tests/rtl/arith/test_fp32_units.py).

NaN results are compared by NaN-ness and sign: the units return the canonical quiet NaN,
NumPy keeps the operand's payload (they are the same for canonical NaN operands)."""

from __future__ import annotations

import numpy as np

F32 = np.float32
#: NumPy's float32 operation for each operation name.
NUMPY = {"mul": np.multiply, "add": np.add, "sub": np.subtract}


def random_operands(rng, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Bit patterns: half uniform over all codes, half near each other in exponent (where
    additions round and cancel), with a sprinkling of special codes."""
    a = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    b = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    near = rng.random(n) < 0.5
    shift = rng.integers(-30, 30, n) << 23
    b[near] = (a[near].astype(np.int64) + shift[near]).astype(np.uint32) ^ (
        rng.integers(0, 1 << 23, near.sum()).astype(np.uint32))
    specials = np.array([0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000,
                         0xFFC00000, 0x00000001, 0x80000001, 0x007FFFFF, 0x00800000,
                         0x7F7FFFFF, 0xFF7FFFFF, 0x3F800000, 0xBF800000], np.uint32)
    pick = rng.random(n) < 0.02
    a[pick] = rng.choice(specials, pick.sum())
    pick = rng.random(n) < 0.02
    b[pick] = rng.choice(specials, pick.sum())
    return a, b


def edge_operands() -> tuple[np.ndarray, np.ndarray]:
    """Ties and boundary cases for every operation, as float32 values."""
    one_ulp = np.nextafter(F32(1), F32(2))
    tiny = np.float32(1.4e-45)
    big = np.finfo(F32).max
    vals = np.array([0.0, -0.0, 1.0, -1.0, 1.5, one_ulp, 2 ** -24, 2 ** -25, 3 * 2 ** -25,
                     tiny, -tiny, 2 ** -126, 2 ** -127, big, -big, 2.0 ** 64, 2.0 ** -64,
                     np.inf, -np.inf, np.nan, 1 + 2 ** -23, 1 - 2 ** -24, 3.0, 1 / 3],
                    F32)
    a, b = np.meshgrid(vals, vals)
    return a.ravel().view(np.uint32), b.ravel().view(np.uint32)


def assert_matches_numpy(op: str, a: np.ndarray, b: np.ndarray, got: np.ndarray) -> int:
    """Assert that ``got`` (bit patterns) is NumPy's float32 ``op`` of ``a`` and ``b``, with
    canonical quiet NaNs of NumPy's sign; return the number of vectors checked."""
    got = got.astype(np.uint32)
    with np.errstate(all="ignore"):
        want = NUMPY[op](a.view(F32), b.view(F32)).view(np.uint32)
    nan = np.isnan(want.view(F32))
    bad = np.flatnonzero(np.where(nan, ~np.isnan(got.view(F32)) | ((got ^ want) >> 31 != 0),
                                  got != want))
    assert bad.size == 0, (
        f"{op}: {bad.size} of {a.size} differ, first a={a[bad[0]]:#010x} b={b[bad[0]]:#010x}: "
        f"got {got[bad[0]]:#010x}, NumPy {want[bad[0]]:#010x}")
    nan_out = got[np.isnan(got.view(F32))]
    assert np.all(nan_out & 0x7FFFFFFF == 0x7FC00000)          # canonical quiet NaNs
    return a.size
