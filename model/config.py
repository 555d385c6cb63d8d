"""One configuration object for one hardware instance: :class:`AccelConfig`.

The same object drives the RTL elaboration (:mod:`qaccel.rtl`), the cocotb testbenches (as one
JSON environment variable), the RTL runner and the performance model. It holds the structural,
elaboration-time parameters only: what an instance *can* do. What a job does (which of the
carried formats, granularity, axis, block size, shapes) is chosen at run time through the
units' configuration registers, so one build serves many jobs.

``AccelConfig()`` is the default instance: Quantize / Dequantize units of one lane carrying
every format the golden model supports, and the MatMulNBits v2 engine of the ``ecp5-25k``
preset (:mod:`qaccel.model.presets`: 32 columns x 1 K element, row tiles of 4, 12 of its 16
MAC pairs on MULT18X18D, int8 path only). It validates itself on construction
(``TypeError`` / ``ValueError`` naming the field and the bad value), serialises to JSON
(:meth:`AccelConfig.to_json`, :meth:`AccelConfig.from_json`) and has a stable
:attr:`AccelConfig.slug` for build directories and caches.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .validate import check_int

__all__ = [
    "DQ_INPUTS",
    "DQ_OUTPUTS",
    "ENGINE_COUNT_WIDTH",
    "LANES",
    "Q_INPUTS",
    "Q_OUTPUTS",
    "NBITS",
    "SCALES",
    "M_TILES",
    "PE",
    "MAX_BLOCK_SIZES",
    "SIMD",
    "UNITS",
    "ZERO_POINTS",
    "AccelConfig",
    "ElementwiseConfig",
    "MatMulNBitsConfig",
    "int8_path",
]

#: Lane counts the stream units support.
LANES = (1, 2, 4, 8)
#: Types of QuantizeLinear's ``x`` (and DirectML's ``input``).
Q_INPUTS = ("float32", "float16", "bfloat16", "int32")
#: Scale types: QuantizeLinear takes all five, DequantizeLinear all but int32.  float8e8m0
#: (opset 24) is the OCP Microscaling power-of-two scale: the lanes scale by it exactly,
#: with an exponent subtraction (Quantize) or a one-bit significand (Dequantize).
SCALES = ("float32", "float16", "bfloat16", "int32", "float8e8m0")
#: QuantizeLinear output types, integer first.
Q_OUTPUTS = ("int8", "uint8", "int16", "uint16", "int4", "uint4", "int2", "uint2",
             "float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz", "float4e2m1")
#: DequantizeLinear input types.
DQ_INPUTS = (*Q_OUTPUTS[:8], "int32", *Q_OUTPUTS[8:])
#: DequantizeLinear output types.
DQ_OUTPUTS = ("float32", "float16", "bfloat16")
#: Division precisions of QuantizeLinear (float64 for int32 operands).
PRECISIONS = ("float32", "float16", "bfloat16", "float64")
#: Output columns of the MatMulNBits engine (``pe``; the v2 engine pairs columns: even).
PE = range(1, 129)
#: K elements per cycle per output column the MatMulNBits engine supports.
SIMD = (1, 2, 4, 8, 16)
#: Rows of A per MatMulNBits row tile (``m_tile``; the MAC array's rows).
M_TILES = range(1, 17)
#: The largest MatMulNBits block size an engine takes (``max_block_size``): powers of two.
MAX_BLOCK_SIZES = range(16, 1025)
#: Width of the MatMulNBits engine's job registers ``k``, ``m`` and ``groups`` (and of the
#: counters they bound), whatever the elementwise units' ``count_width``.
ENGINE_COUNT_WIDTH = 22
#: MatMulNBits weight widths.
NBITS = (2, 3, 4, 5, 6, 7, 8)
#: MatMulNBits zero points: absent (``2 ** (bits - 1)``), packed uint8 codes, or float.
ZERO_POINTS = ("none", "packed", "float")
#: The units a configuration builds: the MatMulNBits engine, the Quantize and the Dequantize
#: unit (DirectML's quantize runs on the Quantize unit).
UNITS = ("matmul_nbits", "quantize", "dequantize")


def int8_path(accuracy_level: int, *, float_zero_points: bool, g_idx: bool) -> bool:
    """Whether the MatMulNBits engine takes the int8 path (accuracy_level 4 with integer or
    no zero points and no g_idx); otherwise it takes the float path."""
    return accuracy_level == 4 and not float_zero_points and not g_idx


def _types(name: str, value, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """Check a tuple of type names against ``allowed``; return it in ``allowed``'s order."""
    if isinstance(value, str) or not isinstance(value, (tuple, list)):
        raise TypeError(f"{name} must be a tuple of type names, not {value!r}")
    if not value:
        raise ValueError(f"{name} must name at least one type, not {tuple(value)!r}")
    for v in value:
        if v not in allowed:
            raise ValueError(f"{name} may contain {', '.join(allowed)}; got {v!r}")
    if len(set(value)) != len(value):
        raise ValueError(f"{name} must not repeat a type, not {tuple(value)!r}")
    return tuple(t for t in allowed if t in value)


def _part_fields(cls) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _part_dict(part) -> dict[str, Any]:
    """A part's fields, JSON-compatible (tuples become lists)."""
    return {name: (list(v) if isinstance(v := getattr(part, name), tuple) else v)
            for name in _part_fields(type(part))}


@dataclass(frozen=True)
class ElementwiseConfig:
    """The QuantizeLinear, DequantizeLinear and DirectML units
    (:mod:`qaccel.rtl.elementwise.quantize`,
    :mod:`qaccel.rtl.elementwise.dequantize`): what their builds carry.

    Attributes
    ----------
    lanes : int
        Elements per stream beat: 1, 2, 4 or 8.
    q_inputs : tuple of str
        QuantizeLinear ``x`` types the Quantize unit carries (subset of :data:`Q_INPUTS`).
    scales : tuple of str
        Scale types carried (subset of :data:`SCALES`; DequantizeLinear uses the float ones).
    q_outputs : tuple of str
        QuantizeLinear output types carried (subset of :data:`Q_OUTPUTS`).
    dq_inputs, dq_outputs : tuple of str
        DequantizeLinear input and output types carried.
    precisions : tuple of str
        Division precisions carried (subset of ``float32, float16, bfloat16, float64``).
        ``x / scale`` is computed in NumPy's promoted type (:meth:`division_type`) or in the
        ``precision`` attribute's type; every precision a carried input/scale pair needs must
        be listed. Default: exactly those, plus float32 (DirectML divides in float32).
    table_depth : int
        Entries of the scale / zero-point table (a power of two, 2..65536). A tensor whose
        layout needs more scales is split by the runner into jobs that fit.
    max_dims : int
        Dimensions of the scale-index generator (1..8) after collapsing the layout
        (see :class:`qaccel.model.indexing.ScaleLayout`).
    size_width : int
        Bits of one dimension's size in the index generator (4..32).
    count_width : int
        Bits of a job's element count (8..40).  (The MatMulNBits engine's counters are its
        own: :class:`MatMulNBitsConfig`.)
    divider_bits_per_stage : int
        Quotient bits per pipeline stage of the radix-2 array divider: 1, 2 or 4 (latency
        against logic depth).
    reciprocal_units : int
        Quantize unit: 0 (default) divides in each lane with a pipelined radix-2 array
        divider (no multipliers). 1 to 8 instead prepare every scale-table entry as it is
        written: the scale decoded, rounded to the division precision and given the
        reciprocal of its significand, by this many shared iterative reciprocal units (one
        table write per ``ceil(latency / reciprocal_units)`` cycles, the reciprocal's latency
        28 cycles for float32 scales); each lane then divides with a multiply and an exact
        remainder correction (MULT18X18D blocks, a quarter of the array's LUTs).
    divider_dsps : int or None
        With ``reciprocal_units``: MULT18X18D per lane's divider at most (the smaller product
        tiles move into LUTs), so that many lanes fit a part's DSP blocks; None: as the
        products need (4 for float32 scales).

    The defaults: one lane, every format the golden model supports.
    """

    lanes: int = 1
    q_inputs: tuple[str, ...] = Q_INPUTS
    scales: tuple[str, ...] = SCALES
    q_outputs: tuple[str, ...] = Q_OUTPUTS
    dq_inputs: tuple[str, ...] = DQ_INPUTS
    dq_outputs: tuple[str, ...] = DQ_OUTPUTS
    precisions: tuple[str, ...] | None = None
    table_depth: int = 1024
    max_dims: int = 4
    size_width: int = 16
    count_width: int = 32
    divider_bits_per_stage: int = 1
    reciprocal_units: int = 0
    divider_dsps: int | None = None

    def __post_init__(self):
        if isinstance(self.lanes, bool) or self.lanes not in LANES:
            raise ValueError(f"lanes must be one of {LANES}, not {self.lanes!r}")
        set_ = object.__setattr__
        set_(self, "q_inputs", _types("q_inputs", self.q_inputs, Q_INPUTS))
        set_(self, "scales", _types("scales", self.scales, SCALES))
        set_(self, "q_outputs", _types("q_outputs", self.q_outputs, Q_OUTPUTS))
        set_(self, "dq_inputs", _types("dq_inputs", self.dq_inputs, DQ_INPUTS))
        set_(self, "dq_outputs", _types("dq_outputs", self.dq_outputs, DQ_OUTPUTS))
        if self.precisions is None:
            needed = {self.division_type(x, s) for x in self.q_inputs for s in self.scales}
            set_(self, "precisions", tuple(p for p in PRECISIONS
                                           if p in needed or p == "float32"))
        set_(self, "precisions", _types("precisions", self.precisions, PRECISIONS))
        depth = check_int("table_depth", self.table_depth, 2, 1 << 16)
        if depth & (depth - 1):
            raise ValueError(f"table_depth must be a power of two, not {depth}")
        check_int("max_dims", self.max_dims, 1, 8)
        check_int("size_width", self.size_width, 4, 32)
        check_int("count_width", self.count_width, 8, 40)
        if self.divider_bits_per_stage not in (1, 2, 4) or isinstance(
                self.divider_bits_per_stage, bool):
            raise ValueError(f"divider_bits_per_stage must be 1, 2 or 4, not "
                             f"{self.divider_bits_per_stage!r}")
        check_int("reciprocal_units", self.reciprocal_units, 0, 8)
        if self.divider_dsps is not None:
            check_int("divider_dsps", self.divider_dsps, 0, 64)
        for x in self.q_inputs:
            for s in self.scales:
                need = self.division_type(x, s)
                if need not in self.precisions:
                    raise ValueError(
                        f"precisions must include {need} for q_inputs {x} with scales {s}; "
                        f"got {self.precisions}")

    @staticmethod
    def division_type(x: str, scale: str) -> str:
        """Return the type ``x / scale`` is computed in without a ``precision`` attribute."""
        if "int32" in (x, scale):
            return "float64"
        return x if x == scale else "float32"


@dataclass(frozen=True)
class MatMulNBitsConfig:
    """The MatMulNBits engine (v2, :mod:`qaccel.rtl.nbits.matmul_nbits_v2`,
    docs/matmul_nbits_v2.md).

    Attributes
    ----------
    pe : int
        Output columns computed in parallel (1..128; the engine takes an even number).
    simd : int
        K elements per cycle per column, one of :data:`SIMD`; a run-time block_size must be
        at least ``simd``.
    nbits : tuple of int
        Weight widths carried (subset of :data:`NBITS`).
    max_block_size : int
        The largest run-time block_size (a power of two, 16 to 1024); it sizes the
        activation buffer and the integer block sums.
    float_path : bool
        Carry the float path (accuracy levels 0..3, float zero points, g_idx: block floating
        point, four int8 digit rows per row of A; docs/matmul_nbits_v2.md, section 2) beside
        the int8 path (accuracy level 4 with integer or no zero points). Without it the
        engine is smaller and takes int8-path jobs only; :class:`qaccel.RTL` refuses
        float-path calls on it.
    m_tile : int
        Rows of A that share each weight fetch (1..16); the on-chip activation buffer holds
        this many rows.
    max_k : int
        The longest row (K) the activation buffer holds, a power of two from
        ``max_block_size`` to 65536.
    dsp_pairs : int or None
        How many of the ``pe * simd / 2`` two-MAC multiplier slots are built for DSP blocks
        (MULT18X18D); the rest are LUT shift-and-add multipliers. None: all of them. A
        budget: a value of at least ``pe * simd / 2`` also means all of them and is stored as
        None (so ``AccelConfig(pe=4, simd=2)`` takes the default 12 and equals
        ``AccelConfig(pe=4, simd=2, dsp_pairs=None)``).
    clusters : int
        Column slices (1..16), each ``pe / clusters`` columns with ``scale_lanes / clusters``
        float lanes, its own copy of the activations and its own weight feed, hand-off and
        read-out, so each places as a compact block on a large part. The same streams and
        cycles as one slice; ``pe`` and ``scale_lanes`` must be multiples of it.

    The engine's job registers ``k``, ``m`` and ``groups`` are 22 bits wide
    (:data:`ENGINE_COUNT_WIDTH`), whatever the elementwise units' ``count_width``. The
    defaults are the ``ecp5-25k`` engine (``pe`` 32, ``simd`` 1, ``m_tile`` 4, ``max_k`` 4096,
    ``dsp_pairs`` 12, no float path).
    """

    pe: int = 32
    simd: int = 1
    nbits: tuple[int, ...] = NBITS
    max_block_size: int = 256
    float_path: bool = False
    m_tile: int = 4
    max_k: int = 4096
    dsp_pairs: int | None = 12
    clusters: int = 1

    def __post_init__(self):
        set_ = object.__setattr__
        check_int("pe", self.pe, PE.start, PE.stop - 1)
        if isinstance(self.simd, bool) or self.simd not in SIMD:
            raise ValueError(f"simd must be one of {SIMD}, not {self.simd!r}")
        if isinstance(self.nbits, (str, int)) or not isinstance(self.nbits, (tuple, list)):
            raise TypeError(f"nbits must be a tuple of bit widths, not {self.nbits!r}")
        if not self.nbits or any(isinstance(b, bool) or b not in NBITS for b in self.nbits) \
                or len(set(self.nbits)) != len(self.nbits):
            raise ValueError(f"nbits must hold distinct widths from {NBITS}, not "
                             f"{tuple(self.nbits)!r}")
        set_(self, "nbits", tuple(sorted(self.nbits)))
        lo, hi = MAX_BLOCK_SIZES.start, MAX_BLOCK_SIZES.stop - 1
        mb = check_int("max_block_size", self.max_block_size, lo, hi)
        if mb & (mb - 1) or mb < self.simd:
            raise ValueError(f"max_block_size must be a power of two from {lo} to {hi}, not "
                             f"{mb}")
        if not isinstance(self.float_path, bool):
            raise TypeError(f"float_path must be a bool, not {self.float_path!r}")
        check_int("m_tile", self.m_tile, M_TILES.start, M_TILES.stop - 1)
        mk = check_int("max_k", self.max_k, mb, 1 << 16)
        if mk & (mk - 1):
            raise ValueError(f"max_k must be a power of two from max_block_size ({mb}) to "
                             f"65536, not {mk}")
        if self.dsp_pairs is not None and check_int("dsp_pairs", self.dsp_pairs, 0) >= \
                self.pe * self.simd // 2:
            set_(self, "dsp_pairs", None)       # a budget covering every slot: all of them
        n = check_int("clusters", self.clusters, 1, 16)
        if self.pe % n or self.scale_lanes % n:
            raise ValueError(f"clusters must divide pe ({self.pe}) and the float lanes "
                             f"({self.scale_lanes}), not {n}")

    @property
    def scale_lanes(self) -> int:
        """Float lanes, the smallest divisor of ``pe`` that is at least ``pe * simd / 16``
        (blocks of 16 give that many block terms per cycle)."""
        need = -(-self.pe * self.simd // 16)
        return next(f for f in range(need, self.pe + 1) if self.pe % f == 0)


#: The parts of :class:`AccelConfig`: attribute name and class.
PARTS = {"elementwise": ElementwiseConfig, "matmul_nbits": MatMulNBitsConfig}
_OWNER = {name: part for part, cls in PARTS.items() for name in _part_fields(cls)}
#: Fields of earlier versions, gone with the v1 MatMulNBits engine
#: (docs/matmul_nbits_engine.md): configuration files that hold them still load.
REMOVED_FIELDS = ("weight_bus_width", "partial_sums")
_MISSING = object()


class AccelConfig:
    """The structural parameters of one accelerator instance: an :class:`ElementwiseConfig`
    (``elementwise``) and a :class:`MatMulNBitsConfig` (``matmul_nbits``), each validating its
    own fields.

    ``AccelConfig(lanes=2, pe=16)`` takes any field of either part by name (the others keep
    their defaults), or whole parts: ``AccelConfig(elementwise=..., matmul_nbits=...)``.
    Every field reads as an attribute of the configuration too (``config.lanes``,
    ``config.pe``).  Immutable, hashable, equal when both parts are.
    """

    __slots__ = ("elementwise", "matmul_nbits", "_slug")

    def __init__(self, elementwise: ElementwiseConfig | None = None,
                 matmul_nbits: MatMulNBitsConfig | None = None, **fields: Any):
        removed = sorted(set(fields) & set(REMOVED_FIELDS))
        if removed:
            raise TypeError(f"AccelConfig has no field {', '.join(removed)} any more (the v1 "
                            f"MatMulNBits engine's; docs/matmul_nbits_engine.md): leave it out")
        unknown = sorted(set(fields) - set(_OWNER))
        if unknown:
            raise TypeError(f"AccelConfig got unknown field(s) "
                            f"{', '.join(f'{n}={fields[n]!r}' for n in unknown)}; the fields "
                            f"are {', '.join(sorted(_OWNER))}")
        given = {"elementwise": elementwise, "matmul_nbits": matmul_nbits}
        set_ = object.__setattr__
        for part, cls in PARTS.items():
            value = given[part]
            mine = {k: v for k, v in fields.items() if _OWNER[k] == part}
            if value is None:
                value = cls(**mine)
            elif not isinstance(value, cls):
                raise TypeError(f"{part} must be a {cls.__name__}, not {value!r}")
            elif mine:
                value = dataclasses.replace(value, **mine)
            set_(self, part, value)
        text = json.dumps(self.to_dict(), sort_keys=True)
        set_(self, "_slug", hashlib.sha256(text.encode()).hexdigest()[:12])

    def __getattr__(self, name: str):
        """A field or property of either part (``config.lanes``, ``config.scale_lanes``)."""
        if not name.startswith("_"):
            for part in PARTS:
                value = getattr(object.__getattribute__(self, part), name, _MISSING)
                if value is not _MISSING:
                    return value
        raise AttributeError(f"'AccelConfig' object has no attribute {name!r}")

    def __setattr__(self, name: str, value) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    def __eq__(self, other) -> bool:
        if not isinstance(other, AccelConfig):
            return NotImplemented
        return (self.elementwise, self.matmul_nbits) == (other.elementwise, other.matmul_nbits)

    def __hash__(self) -> int:
        return hash((self.elementwise, self.matmul_nbits))

    def __reduce__(self):
        return (AccelConfig, (self.elementwise, self.matmul_nbits))

    def __repr__(self) -> str:
        changed = [f"{name}={getattr(self, name)!r}" for name, owner in _OWNER.items()
                   if getattr(self, name) != getattr(PARTS[owner](), name)]
        return f"AccelConfig({', '.join(changed)})"

    @staticmethod
    def division_type(x: str, scale: str) -> str:
        """:meth:`ElementwiseConfig.division_type`."""
        return ElementwiseConfig.division_type(x, scale)

    # -- serialisation ------------------------------------------------------------------------

    def to_dict(self, *parts: str) -> dict[str, Any]:
        """Return the parts (``parts``, default both: ``"elementwise"``, ``"matmul_nbits"``)
        as a JSON-compatible dict of dicts (tuples become lists); :meth:`from_dict` reads it,
        the missing part taking its defaults."""
        for part in parts:
            if part not in PARTS:
                raise ValueError(f"parts must be among {', '.join(PARTS)}, not {part!r}")
        return {part: _part_dict(getattr(self, part)) for part in parts or PARTS}

    def to_json(self) -> str:
        """Return the configuration as JSON text (keys sorted)."""
        return json.dumps(self.to_dict(), sort_keys=True, indent=1)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AccelConfig:
        """Build a configuration from :meth:`to_dict`'s output, or from the flat dict of
        fields that files of earlier versions hold (missing keys take defaults; the
        :data:`REMOVED_FIELDS` are ignored, with a DeprecationWarning)."""
        if not isinstance(data, dict):
            raise TypeError(f"config must be a JSON object, not {type(data).__name__}")
        flat = {}
        for key, value in data.items():
            if key in PARTS:
                if not isinstance(value, dict):
                    raise TypeError(f"config field {key} must be a JSON object, not "
                                    f"{type(value).__name__}")
                unknown = sorted(set(value) - set(_part_fields(PARTS[key])))
                if unknown:
                    raise ValueError(f"unknown {key} field(s) {', '.join(unknown)}; known: "
                                     f"{', '.join(sorted(_part_fields(PARTS[key])))}")
                flat.update(value)
            elif key in REMOVED_FIELDS:
                warnings.warn(f"config field {key} is ignored: the v1 MatMulNBits engine that "
                              "used it was removed", DeprecationWarning, stacklevel=2)
            elif key in _OWNER:
                flat[key] = value
            else:
                raise ValueError(f"unknown config field(s) {key}; known: "
                                 f"{', '.join(sorted([*PARTS, *_OWNER]))}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in flat.items()})

    @classmethod
    def from_json(cls, text: str) -> AccelConfig:
        """Parse :meth:`to_json`'s output."""
        return cls.from_dict(json.loads(text))

    @classmethod
    def load(cls, path: str | os.PathLike) -> AccelConfig:
        """Read a configuration from a JSON file."""
        return cls.from_json(Path(path).read_text())

    def replace(self, **changes: Any) -> AccelConfig:
        """Return a copy with ``changes`` (fields of either part, or whole parts) applied,
        validated again."""
        parts = {part: changes.pop(part, getattr(self, part)) for part in PARTS}
        return AccelConfig(**parts, **changes)

    @property
    def slug(self) -> str:
        """A stable 12-hex-digit hash of the fields, for build directories and caches."""
        return self._slug
