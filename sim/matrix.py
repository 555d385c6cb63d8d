"""Coverage matrices of jobs for the Quantize and Dequantize units.

:func:`quantize_matrix` and :func:`dequantize_matrix` return one :class:`~qaccel.sim.jobs.Job`
per (input type, output type, granularity) the unit carries (scale types rotate through the
carried ones), on random data that includes rounding ties, values beyond the output range,
infinities, NaN and signed zeros; :func:`dml_matrix` covers DirectML's quantize with
broadcast scales. Granularities: per-tensor, per-axis (a random axis, negative half the time),
blocked (random axis and block size, usually with a partial last block). :func:`fill_job` is
one job long enough to fill a unit's output FIFO under back-pressure.
"""

from __future__ import annotations

import numpy as np

from qaccel.model.dtypes import FLOAT_TYPES, QTYPES, SCALE_TYPES
from qaccel.rtl.elementwise.dequantize import Dequantize
from qaccel.rtl.elementwise.dequantize_lane import dq_scales
from qaccel.rtl.elementwise.unit import Elementwise
from qaccel.sim.jobs import Job, dequantize_job, dml_job, quantize_job

__all__ = ["GRANULARITIES", "dequantize_matrix", "dml_matrix", "fill_job", "quantize_matrix",
           "random_codes", "random_float", "random_scale"]

GRANULARITIES = ("per-tensor", "per-axis", "blocked")
_DTYPES = {**FLOAT_TYPES, **SCALE_TYPES, "int32": np.dtype(np.int32)}


def _dtype(name: str) -> np.dtype:
    return _DTYPES[name] if name in _DTYPES else QTYPES[name].dtype


def random_float(name: str, shape, rng, *, spread: float = 40.0) -> np.ndarray:
    """Values of float32 / float16 / bfloat16 / int32 ``name``: mostly moderate (multiples of
    0.5 for ties), some random bit patterns, the specials."""
    n = int(np.prod(shape))
    if name == "int32":
        v = rng.integers(-400, 400, n)
        v[: n // 8] = rng.integers(-(1 << 31), 1 << 31, n // 8)
        v[:3] = [(1 << 31) - 1, -(1 << 31), 0][: min(3, n)]
        return v.astype(np.int32).reshape(shape)
    dt = _DTYPES[name]
    v = np.round(rng.standard_normal(n) * spread * 2) / 2
    v = v.astype(np.float32).astype(dt)
    k = n // 10
    bits = rng.integers(0, 1 << (8 * dt.itemsize), k, dtype=np.uint64)
    v[n - k:] = bits.astype({2: np.uint16, 4: np.uint32}[dt.itemsize]).view(dt)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e30], np.float32)
    with np.errstate(over="ignore"):
        v[: min(6, n)] = specials[: min(6, n)].astype(dt)
    return v.reshape(shape)


def random_scale(name: str, shape, rng) -> np.ndarray:
    """Scales: powers of two (exact quotients, ties), random magnitudes, a negative one (a
    float8e8m0 scale has no sign: NaN)."""
    n = int(np.prod(shape))
    if name == "int32":
        return rng.integers(1, 9, n).astype(np.int32).reshape(shape)
    s = np.where(rng.random(n) < 0.5, np.exp2(rng.integers(-3, 3, n)),
                 np.exp2(rng.uniform(-4, 3, n)))
    s = np.where(rng.random(n) < 0.05, -s, s)
    return s.astype(np.float32).astype(_DTYPES[name]).reshape(shape)


def random_codes(name: str, shape, rng) -> np.ndarray:
    """Random values of quantised type ``name`` (every bit pattern possible)."""
    q = QTYPES[name]
    n = int(np.prod(shape))
    if q.is_int:
        return rng.integers(q.qmin, q.qmax + 1, n).astype(q.dtype).reshape(shape)
    codes = rng.integers(0, 1 << q.bits, n).astype(np.uint8)
    return codes.view(q.dtype).reshape(shape)


def _layout(kind: str, shape: tuple[int, ...], rng) -> tuple[tuple[int, ...], int, int]:
    """Return ``(scale shape, axis, block_size)`` for a granularity."""
    rank = len(shape)
    if kind == "per-tensor":
        return (), 1, 0
    axis = int(rng.integers(0, rank))
    signed_axis = axis - rank if rng.random() < 0.5 else axis
    if kind == "per-axis":
        return (shape[axis],), signed_axis, 0
    block = int(rng.choice([1, 2, 3, 4, 8]))
    s = list(shape)
    s[axis] = -(-shape[axis] // block)
    return tuple(s), signed_axis, block


def quantize_matrix(unit: Elementwise, rng, *, shape=(3, 5, 7),
                    granularities=GRANULARITIES) -> list[Job]:
    """One QuantizeLinear job per (x type, output type, granularity) of ``unit``'s config."""
    c = unit.config
    jobs = []
    k = 0
    for xt in c.q_inputs:
        for out in c.q_outputs:
            for kind in granularities:
                st = c.scales[k % len(c.scales)]
                k += 1
                s_shape, axis, block = _layout(kind, shape, rng)
                scale = random_scale(st, s_shape, rng)
                zp = random_codes(out, s_shape, rng)
                x = random_float(xt, shape, rng)
                sat = bool(rng.random() < 0.7)
                with np.errstate(all="ignore"):
                    jobs.append(quantize_job(unit, x, scale, zp, axis=axis, block_size=block,
                                             saturate=sat,
                                             label=f"Q {xt}/{st} -> {out} {kind} sat={sat}"))
    return jobs


def dml_matrix(unit: Elementwise, rng, *, shape=(2, 3, 4, 5)) -> list[Job]:
    """DirectML quantize jobs: every input type x int8/uint8, broadcast scale and zero point."""
    c = unit.config
    jobs = []
    for xt in ("float32", "float16", "int32"):
        if xt not in c.q_inputs:
            continue
        st = "float32" if xt == "int32" else xt
        if st not in c.scales:
            continue
        for out in ("int8", "uint8"):
            if out not in c.q_outputs:
                continue
            s_shape = tuple(n if rng.random() < 0.5 else 1 for n in shape)
            z_shape = tuple(n if rng.random() < 0.5 else 1 for n in shape)
            scale = random_scale(st, s_shape, rng)
            zp = random_codes(out, z_shape, rng)
            with np.errstate(all="ignore"):
                jobs.append(dml_job(unit, random_float(xt, shape, rng), scale, zp,
                                    label=f"DML {xt} -> {out} {s_shape}/{z_shape}"))
    return jobs


def dequantize_matrix(unit: Elementwise, rng, *, shape=(3, 5, 7),
                      granularities=GRANULARITIES) -> list[Job]:
    """One DequantizeLinear job per (x type, output type, granularity) of ``unit``'s config."""
    c = unit.config
    scales = dq_scales(c)
    jobs = []
    k = 0
    for xt in c.dq_inputs:
        q = QTYPES[xt]
        for out in c.dq_outputs:
            for kind in granularities:
                st = scales[k % len(scales)]
                k += 1
                s_shape, axis, block = _layout(kind, shape, rng)
                scale = random_scale(st, s_shape, rng)
                if xt == "int32":
                    x = random_float("int32", shape, rng)
                else:
                    x = random_codes(xt, shape, rng)
                if q.is_int:
                    zp = random_codes(xt, s_shape, rng) if xt != "int32" else (
                        random_float("int32", s_shape, rng) if rng.random() < 0.5 else None)
                else:
                    zp = np.zeros(s_shape, np.float32).astype(q.dtype)
                with np.errstate(all="ignore"):
                    jobs.append(dequantize_job(unit, x, scale, zp, axis=axis, block_size=block,
                                               output_dtype=FLOAT_TYPES[out],
                                               label=f"DQ {xt} x {st} -> {out} {kind}"))
    return jobs


def fill_job(unit: Elementwise, rng) -> Job:
    """A per-tensor job of ``2 * fifo_depth + latency`` beats on ``unit`` (a Quantize or a
    Dequantize unit; its first input, output and scale types): more beats than the output FIFO
    holds, so a long stall on ``y`` runs the credit out (``tb_elementwise.test_credit_limit``).

    Raises ValueError if the job's element count does not fit ``config.count_width`` or its
    one dimension ``config.size_width`` (give a configuration with wider counts)."""
    c = unit.config
    n = c.lanes * (2 * unit.fifo_depth + unit.latency)
    if n >> c.count_width or n >> c.size_width:
        raise ValueError(f"a fill job of {n} elements does not fit count_width "
                         f"{c.count_width} / size_width {c.size_width} of {c!r}: widen them")
    if isinstance(unit, Dequantize):
        xt, out, st = c.dq_inputs[0], c.dq_outputs[0], dq_scales(c)[0]
        x = (random_float("int32", (n,), rng) if xt == "int32" else
             random_codes(xt, (n,), rng))
        zp = (np.zeros((), np.float32).astype(QTYPES[xt].dtype) if not QTYPES[xt].is_int
              else random_codes(xt, (), rng) if xt != "int32" else None)
        with np.errstate(all="ignore"):
            return dequantize_job(unit, x, random_scale(st, (), rng), zp, axis=1,
                                  block_size=0, output_dtype=FLOAT_TYPES[out],
                                  label=f"DQ fill {xt} x {st} -> {out} ({n})")
    xt, out, st = c.q_inputs[0], c.q_outputs[0], c.scales[0]
    with np.errstate(all="ignore"):
        return quantize_job(unit, random_float(xt, (n,), rng), random_scale(st, (), rng),
                            random_codes(out, (), rng), axis=1, block_size=0, saturate=True,
                            label=f"Q fill {xt}/{st} -> {out} ({n})")
