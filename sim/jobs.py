"""Jobs for the Quantize and Dequantize units: an operator call turned into what the hardware
sees (register values, table writes, input beats) and what it must answer (output beats).

The golden model (:mod:`qaccel.model`) computes the expected output, so a :class:`Job` is a
self-contained test vector for the cocotb testbench (:mod:`qaccel.sim.tb_elementwise`) and the
work order of the RTL engine. Everything is plain integers, JSON-serialisable.

Codes in beats: lane ``k`` of a beat holds element ``beat * lanes + k`` in bits
``[k * width, (k + 1) * width)``; an output beat has ``last`` above its data. Sub-byte output
codes are right-aligned in their lane; :func:`unpack_output` turns beats back into the ONNX
array (ml_dtypes stores int4 / float4 one element per byte, as the golden model returns them).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from amaranth.hdl import Shape
from amaranth.lib import data

from qaccel.model.dml import check_dml, dml_quantize_linear
from qaccel.model.dtypes import FLOAT_TYPES, QTYPES, dtype_name
from qaccel.model.quant import (
    CheckedCall,
    check_dequantize,
    check_quantize,
    dequantize_linear,
    quantize_linear,
)
from qaccel.rtl.elementwise.dequantize_lane import dq_scales
from qaccel.rtl.elementwise.unit import Elementwise

__all__ = ["Job", "beat_words", "codes_of", "dequantize_job", "dml_job", "lane_widths", "pack",
           "quantize_job", "unpack_output"]


@dataclass
class Job:
    """One run of a unit: registers, table, input beats, expected output beats.

    ``ymask`` has the bits of the last beat that are specified (lanes past ``count`` are not).
    ``x`` and ``y`` are lists of ints, or ``uint64`` arrays for jobs made with ``words=True``
    (the stream harness takes both; JSON and :func:`qaccel.sim.elementwise_sim.check_jobs`
    need lists).
    ``out_dtype`` and ``shape`` describe the output array (for :func:`unpack_output`).
    """

    label: str
    regs: int
    table: list[tuple[int, int, int]]
    x: list[int]
    y: list[int]
    ymask: int
    count: int
    shape: tuple[int, ...]
    out_dtype: str
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def pack(layout, value) -> int:
    """Return the bit pattern of ``value`` in ``layout`` (a StructLayout takes a dict, an
    ArrayLayout a sequence, a plain shape an int; missing struct fields are 0)."""
    if isinstance(layout, data.StructLayout):
        out = 0
        for name, fld in layout:
            if name in value:
                out |= pack(fld.shape, value[name]) << fld.offset
        return out
    if isinstance(layout, data.ArrayLayout):
        width = Shape.cast(layout.elem_shape).width
        return sum(pack(layout.elem_shape, v) << (k * width) for k, v in enumerate(value))
    width = Shape.cast(layout).width
    v = int(value)
    if not -(1 << width) < v < (1 << width):
        raise ValueError(f"value {v} does not fit {width} bits")
    return v & ((1 << width) - 1)


def storage_words(a: np.ndarray) -> np.ndarray:
    """``a``'s elements as unsigned words of their storage (every bit: unused container bits,
    NaN payloads, the sign of zero), flattened in C order."""
    a = np.ascontiguousarray(a).reshape(-1)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def codes_of(a: np.ndarray) -> np.ndarray:
    """Bit patterns of ``a``'s elements as int64 (sub-byte types: their low ``bits``)."""
    raw = storage_words(a)
    name = dtype_name(np.asarray(a).dtype)
    bits = QTYPES[name].bits if name in QTYPES else 8 * raw.dtype.itemsize
    return raw.astype(np.int64) & ((1 << bits) - 1)


def _beats(codes: np.ndarray, lanes: int, width: int) -> list[int]:
    """Pack codes ``lanes`` to a beat, lane ``k`` in bits ``[k * width, (k + 1) * width)``
    (the last beat padded with zeros), as Python integers: bit planes through
    ``np.packbits`` and one ``int.from_bytes`` per beat."""
    pad = (-codes.size) % lanes
    c = np.concatenate([codes.astype(np.uint64), np.zeros(pad, np.uint64)])
    planes = (c[:, None] >> np.arange(width, dtype=np.uint64)) & np.uint64(1)
    raw = np.packbits(planes.astype(np.uint8).reshape(-1, lanes * width), axis=1,
                      bitorder="little")
    data, n = raw.tobytes(), raw.shape[1]
    return [int.from_bytes(data[i:i + n], "little") for i in range(0, len(data), n)]


def beat_words(codes: np.ndarray, lanes: int, width: int) -> np.ndarray:
    """:func:`_beats` as a ``uint64`` array, for beats of at most 63 bits (``lanes * width``;
    one bit stays free for ``last``): vectorised, about 100 times faster than Python ints."""
    if lanes * width > 63:
        raise ValueError(f"beat_words packs beats of up to 63 bits, not {lanes} lanes of "
                         f"{width} bits; use the Python-int beats")
    c = codes.astype(np.uint64) & np.uint64((1 << width) - 1)
    if lanes == 1:
        return c
    c = np.concatenate([c, np.zeros((-c.size) % lanes, np.uint64)]).reshape(-1, lanes)
    out = c[:, 0].copy()
    for k in range(1, lanes):
        out |= c[:, k] << np.uint64(k * width)
    return out


def _codes(beats: list[int], lanes: int, width: int) -> np.ndarray:
    """The inverse of :func:`_beats`: every lane of every beat, as int64 codes."""
    nbytes, mask = (lanes * width + 7) // 8, (1 << (lanes * width)) - 1
    raw = np.frombuffer(b"".join((b & mask).to_bytes(nbytes, "little") for b in beats),
                        np.uint8).reshape(-1, nbytes)
    planes = np.unpackbits(raw, axis=1, count=lanes * width, bitorder="little")
    weights = np.left_shift(np.int64(1), np.arange(width, dtype=np.int64))
    return (planes.reshape(-1, width).astype(np.int64) * weights).sum(axis=1)


def _zero_point_codes(zero_point, scale_shape: tuple[int, ...], n: int) -> np.ndarray:
    """Codes of the zero points for the ``n`` scales of shape ``scale_shape`` (zeros when
    absent); a zero point with as many elements as the scale takes its shape (a 0-d scale
    with a (1,) zero point, which the golden model accepts)."""
    if zero_point is None:
        return np.zeros(n, np.int64)
    z = np.asarray(zero_point)
    z = z.reshape(scale_shape) if z.size == n else np.broadcast_to(z, scale_shape)
    return codes_of(z)


def lane_widths(unit: Elementwise) -> tuple[int, int]:
    """Bits per lane of ``unit``'s input (``x``) and output (``y``) beats."""
    members = unit.signature.members
    x = members["x"].signature.members["payload"].shape.elem_shape
    y = members["y"].signature.members["payload"].shape["data"].shape.elem_shape
    return Shape.cast(x).width, Shape.cast(y).width


def _type_name(dtype) -> str:
    name = dtype_name(dtype)
    return "int32" if name == "int32" else name


def _finish(unit: Elementwise, label: str, lane_regs: dict, call: CheckedCall,
            scale_codes: np.ndarray, zp_codes: np.ndarray, want: np.ndarray | None,
            meta: dict, words: bool = False) -> Job:
    """The job of ``call``: registers, table and ``x`` beats; the expected ``y`` beats from
    ``want`` (None: none, ``ymask`` 0). With ``words`` (and beats of at most 63 bits), ``x``
    and ``y`` are ``uint64`` arrays (:func:`beat_words`) instead of lists of ints."""
    c = unit.config
    n_scales = scale_codes.size
    if n_scales > c.table_depth:
        raise ValueError(f"the layout needs {n_scales} scales; the table holds "
                         f"{c.table_depth} (config.table_depth)")
    regs_layout = unit.signature.members["regs"].shape
    regs = pack(regs_layout, {"lane": lane_regs, **unit.index_registers(call.layout)})
    x_width, y_width = lane_widths(unit)
    pack_x = beat_words if words and c.lanes * x_width <= 63 else _beats
    pack_y = beat_words if words and c.lanes * y_width <= 62 else _beats
    xb = pack_x(codes_of(call.x), c.lanes, x_width)
    count = int(call.x.size)
    yb, ymask = [], 0
    if want is not None:
        yb = pack_y(codes_of(want), c.lanes, y_width)
        if len(yb):
            yb[-1] |= (np.uint64 if pack_y is beat_words else int)(1 << (c.lanes * y_width))
        used = count - (len(yb) - 1) * c.lanes
        ymask = ((1 << (used * y_width)) - 1) | (1 << (c.lanes * y_width))
    table = list(zip(range(n_scales), np.asarray(scale_codes).tolist(),
                     np.asarray(zp_codes).tolist(), strict=True))
    return Job(label, regs, table, xb, yb, ymask, count, tuple(call.shape),
               dtype_name(call.out_dtype), meta)


def quantize_job(unit: Elementwise, x, y_scale, y_zero_point=None, *, axis=1, block_size=0,
                 output_dtype=None, saturate=True, precision=None, label: str = "",
                 expect: bool = True, words: bool = False) -> Job:
    """A QuantizeLinear call as a :class:`Job` for a
    :class:`~qaccel.rtl.elementwise.quantize.Quantize`;
    with ``expect`` its expected ``y`` beats, from the golden model; with ``words`` the beats
    as ``uint64`` arrays (see :func:`_finish`; not JSON-serialisable)."""
    c = unit.config
    kw = dict(axis=axis, block_size=block_size, output_dtype=output_dtype, saturate=saturate,
              precision=precision)
    call = check_quantize(x, y_scale, y_zero_point, **kw)
    want = quantize_linear(x, y_scale, y_zero_point, **kw) if expect else None
    x, y_scale = call.x, call.scale
    out = dtype_name(call.out_dtype)
    if precision is not None:
        prec, cast = dtype_name(np.dtype(precision)), 1
    else:
        prec = "float64" if call.division == np.float64 else dtype_name(call.division)
        cast = 0
    lane_regs = {
        "x_fmt": c.q_inputs.index(_type_name(x.dtype)),
        "s_fmt": c.scales.index(_type_name(y_scale.dtype)),
        "prec": c.precisions.index(prec), "cast": cast,
        "out_fmt": c.q_outputs.index(out), "saturate": int(bool(saturate)),
    }
    zp = _zero_point_codes(y_zero_point, y_scale.shape, y_scale.size)
    if y_zero_point is None and out == "float4e2m1":
        zp[:] = 0x8           # -0, the additive identity: an exact -0 quotient stays -0
    kind = call.layout.kind
    return _finish(unit, label or f"Q {dtype_name(x.dtype)}/{dtype_name(y_scale.dtype)} -> {out}"
                   f" {kind}", lane_regs, call, codes_of(y_scale), zp, want,
                   {"op": "quantize", "layout": kind}, words)


def dml_job(unit: Elementwise, input, scale, zero_point=None, *, output_dtype=np.int8,
            label: str = "", expect: bool = True) -> Job:
    """A DirectML ELEMENT_WISE_QUANTIZE_LINEAR call as a :class:`Job` (float32 division);
    with ``expect`` its expected ``y`` beats, from the golden model."""
    c = unit.config
    call = check_dml(input, scale, zero_point, output_dtype=output_dtype)
    want = (dml_quantize_linear(input, scale, zero_point, output_dtype=output_dtype)
            if expect else None)
    x, scale_b = call.x, np.ascontiguousarray(call.scale)
    zp = (np.zeros(scale_b.size, np.int64) if call.zero_point is None
          else codes_of(np.ascontiguousarray(call.zero_point)))
    out = dtype_name(call.out_dtype)
    lane_regs = {
        "x_fmt": c.q_inputs.index(_type_name(x.dtype)),
        "s_fmt": c.scales.index(_type_name(scale_b.dtype)),
        "prec": c.precisions.index("float32"), "cast": 1,
        "out_fmt": c.q_outputs.index(out), "saturate": 1,
    }
    return _finish(unit, label or f"DML {dtype_name(x.dtype)} -> {out}", lane_regs, call,
                   codes_of(scale_b), zp, want, {"op": "dml", "layout": call.layout.kind})


def dequantize_job(unit: Elementwise, x, x_scale, x_zero_point=None, *, axis=1, block_size=0,
                   output_dtype=None, label: str = "", expect: bool = True,
                   words: bool = False) -> Job:
    """A DequantizeLinear call as a :class:`Job` for a :class:`~qaccel.rtl.elementwise.dequantize.
    Dequantize`; with ``expect`` its expected ``y`` beats, from the golden model; ``words`` as
    in :func:`quantize_job`."""
    c = unit.config
    kw = dict(axis=axis, block_size=block_size, output_dtype=output_dtype)
    call = check_dequantize(x, x_scale, x_zero_point, **kw)
    want = dequantize_linear(x, x_scale, x_zero_point, **kw) if expect else None
    x, x_scale = call.x, call.scale
    x_name = _type_name(x.dtype)
    use_zp = x_zero_point is not None and QTYPES[x_name].is_int
    lane_regs = {
        "x_fmt": c.dq_inputs.index(x_name),
        "s_fmt": dq_scales(c).index(dtype_name(x_scale.dtype)),
        "out_fmt": c.dq_outputs.index(dtype_name(call.out_dtype)),
        "use_zp": int(use_zp),
        "wide": int(use_zp and x_name == "int32"),
    }
    zp = _zero_point_codes(x_zero_point if use_zp else None, x_scale.shape, x_scale.size)
    return _finish(unit, label or f"DQ {x_name} -> {dtype_name(call.out_dtype)} "
                   f"{call.layout.kind}", lane_regs, call, codes_of(x_scale), zp, want,
                   {"op": "dequantize", "layout": call.layout.kind}, words)


def unpack_output(job: Job, beats: list[int], width: int, lanes: int) -> np.ndarray:
    """Turn output beats back into the output array of ``job`` (shape and dtype)."""
    codes = _codes(beats, lanes, width)[:job.count]
    name = job.out_dtype
    dt = QTYPES[name].dtype if name in QTYPES else FLOAT_TYPES[name]
    # (a sub-byte code in the low bits of its byte, the rest zero: as ml_dtypes and
    # onnx.reference store int4 / int2 / float4e2m1 and the unsigned types)
    raw = codes.astype({1: np.uint8, 2: np.uint16, 4: np.uint32}[dt.itemsize])
    return raw.view(dt).reshape(job.shape)


#: Float input types of the random regression jobs (:func:`random_jobs`).
_RANDOM_FLOATS = ("float32", "float16", "bfloat16")


def _quantize_args(rng: np.random.Generator, rows: int, cols: int, dtype: str, out: str,
                   block: int | None) -> tuple[tuple, dict]:
    """A random QuantizeLinear call as :func:`qaccel.engine.example_call` makes them (normal
    data, scales from each group's largest magnitude, small random zero points), vectorised
    for 2-D ``x``: per tensor (``block`` None), per column (0) or blocked along columns."""
    x_dt = FLOAT_TYPES[dtype]
    x = rng.standard_normal((rows, cols), np.float32).astype(x_dt)
    mag = np.abs(x.astype(np.float32))
    if block is None:
        amax, kw = mag.max(), {}
    elif block == 0:
        amax, kw = mag.max(axis=0), {"axis": 1}
    else:
        nb = -(-cols // block)
        padded = np.zeros((rows, nb * block), np.float32)
        padded[:, :cols] = mag
        amax, kw = padded.reshape(rows, nb, block).max(axis=2), {"axis": 1, "block_size": block}
    q = QTYPES[out]
    half = (q.qmax - q.qmin) / 2 if q.is_int else q.qmax
    scale = np.where(amax > 0, amax / half, 1.0).astype(x_dt)
    zp = None
    if q.is_int:
        mid = 0 if q.signed else int(q.qmax + 1) // 2
        spread = max(1, int(q.qmax - q.qmin) // 16)
        zp = (mid + rng.integers(-spread, spread, size=np.shape(scale), endpoint=True)
              ).astype(q.dtype)
    return (x, scale, zp), {**kw, "output_dtype": q.dtype}


def random_jobs(unit: Elementwise, rng: np.random.Generator, beats: int, *,
                max_elements: int = 1 << 15) -> list[Job]:
    """Random jobs for ``unit`` (a Quantize or Dequantize unit) with about ``beats`` output
    beats in all, as ``uint64`` beat arrays (``words=True``) with their expected beats from the
    golden model: each job draws a 2-D shape of up to ``max_elements`` elements, a granularity
    (per tensor, per axis, blocked by 16 to 128) within the unit's table, and the input /
    output types among those the unit's configuration supports (floats only for Quantize
    inputs). Deterministic for a given ``rng`` state."""
    from qaccel.engine import example_call  # (qaccel.engine imports this module)
    from qaccel.rtl.elementwise.dequantize import Dequantize

    c = unit.config

    op = "dequantize" if isinstance(unit, Dequantize) else "quantize"
    if op == "quantize":
        ins = [t for t in c.q_inputs if t in _RANDOM_FLOATS]
        outs = list(c.q_outputs)
    else:
        ins, outs = list(c.dq_inputs), list(c.dq_outputs)
    if not ins or not outs:
        raise ValueError(f"the configuration of {unit!r} has no input or output type to draw")
    jobs: list[Job] = []
    done = 0
    while done < beats:
        cols = int(rng.choice([64, 128, 256, 512, 1024]))
        rows = int(rng.integers(1, max(2, max_elements // cols) + 1))
        kind = int(rng.integers(0, 3))
        axis, block = (None, 0) if kind == 0 else (1, 0) if kind == 1 else \
            (1, int(rng.choice([16, 32, 64, 128])))
        if (kind == 1 and cols > c.table_depth) or \
                (kind == 2 and rows * -(-cols // block) > c.table_depth):
            axis, block = None, 0
        dtype, out = str(rng.choice(ins)), str(rng.choice(outs))
        if op == "quantize":
            args, kw = _quantize_args(rng, rows, cols, dtype, out,
                                      None if axis is None else block)
            job = quantize_job(unit, *args, **kw, words=True)
        else:
            args, kw = example_call(op, (rows, cols), dtype=dtype, output_dtype=out, axis=axis,
                                    block_size=block, seed=int(rng.integers(0, 1 << 31)))
            job = dequantize_job(unit, *args, **kw, words=True)
        jobs.append(job)
        done += len(job.y)
    return jobs
