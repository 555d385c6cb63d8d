"""Performance models: the cycles of a call on the MatMulNBits engine and on the elementwise
units, with streams that never stall.

:func:`nbits_v2_call` composes a MatMulNBits call on the v2 engine
(:class:`qaccel.rtl.nbits.matmul_nbits_v2.MatMulNBitsV2`, docs/matmul_nbits_v2.md) from the engine's
own timing figures and the row quantiser's job cycles; it is exact against the RTL
(tests/rtl/nbits/test_matmul_nbits_v2.py::test_call_cycles). :func:`elementwise_call` models the
QuantizeLinear / DequantizeLinear / DirectML units: table loads, one beat per cycle, and the
unit's start and pipeline latencies (tests/qaccel/engine/test_rtl_engine.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from qaccel.model.config import AccelConfig
from qaccel.model.validate import check_bool, check_int, check_int_choice, check_power_of_two
from qaccel.rtl.elementwise.dequantize import Dequantize
from qaccel.rtl.elementwise.quantize import Quantize
from qaccel.rtl.nbits import row_quantizer
from qaccel.rtl.nbits.matmul_nbits_v2 import engine_timing

__all__ = ["V2_BOUNDS", "ElementwiseCall", "NBitsV2Call", "elementwise_call", "nbits_v2_call"]


@dataclass(frozen=True)
class ElementwiseCall:
    """A QuantizeLinear / DequantizeLinear / DirectML call on an elementwise unit.

    ``cycles`` runs from the first table write to the unit going idle after the last job
    (as :attr:`qaccel.engine.RunRecord.cycles`), ``load_cycles`` of them writing tables (one
    per entry, or one per ``table_interval`` cycles on a Quantize unit that prepares its
    entries, ``AccelConfig.reciprocal_units``), plus the ``start`` strobe of each job).
    """

    op: str
    lanes: int
    jobs: int
    elements: int
    beats: int
    load_cycles: int
    latency: int
    start_latency: int
    cycles: int

    @property
    def elements_per_cycle(self) -> float:
        return self.elements / self.cycles

    @property
    def bound(self) -> str:
        """``"stream"`` when the beats take most of the cycles, else ``"table load"`` or
        ``"latency"``."""
        fixed = self.jobs * (self.latency + self.start_latency)
        return max((self.beats, "stream"), (self.load_cycles, "table load"),
                   (fixed, "latency"))[1]


#: Operators of the elementwise units.
ELEMENTWISE_OPS = ("quantize", "dequantize", "dml")


def elementwise_call(config: AccelConfig, op: str, jobs) -> ElementwiseCall:
    """Return the cycles of an elementwise call made of ``jobs``, a sequence of ``(elements,
    table_entries)`` pairs, one per unit job (:class:`qaccel.RTL` splits a call into jobs when
    its scales do not fit ``config.table_depth``; ``RunRecord.jobs`` says how many).

    Per job: ``table_entries`` writes (:meth:`~qaccel.rtl.elementwise.unit.Elementwise.load_cycles`)
    and the ``start`` strobe, the unit's ``start_latency`` (the index generator's, or the
    table preparation's), ``ceil(elements / lanes)`` beats at one per cycle, and the unit's
    ``latency`` (the :class:`~qaccel.rtl.elementwise.quantize.Quantize` / ``Dequantize`` unit's
    :meth:`~qaccel.rtl.elementwise.unit.Elementwise.timing`, which builds nothing; DirectML runs
    on the Quantize unit). Exact against the RTL
    (tests/qaccel/engine/test_rtl_engine.py::test_elementwise_cycles_equal_the_model).
    """
    if not isinstance(config, AccelConfig):
        raise TypeError(f"config must be an AccelConfig, not {config!r}")
    if op not in ELEMENTWISE_OPS:
        raise ValueError(f"op must be one of {ELEMENTWISE_OPS}, not {op!r}")
    if isinstance(jobs, (str, bytes)) or not hasattr(jobs, "__iter__"):
        raise TypeError(f"jobs must be a sequence of (elements, table_entries), not {jobs!r}")
    jobs = list(jobs)
    if not jobs:
        raise ValueError("jobs must hold at least one (elements, table_entries) pair")
    for j, job in enumerate(jobs):
        if not isinstance(job, tuple) or len(job) != 2:
            raise TypeError(f"jobs[{j}] must be an (elements, table_entries) pair, not {job!r}")
        check_int(f"jobs[{j}] elements", job[0], 1)
        check_int(f"jobs[{j}] table_entries", job[1], 1, config.table_depth)
    unit = (Dequantize if op == "dequantize" else Quantize).timing(config)
    beats = sum(-(-e // config.lanes) for e, _ in jobs)
    load = sum(unit.load_cycles(t) for _, t in jobs)
    fixed = len(jobs) * (unit.start_latency + unit.latency)
    return ElementwiseCall(op=op, lanes=config.lanes, jobs=len(jobs),
                           elements=sum(e for e, _ in jobs), beats=beats, load_cycles=load,
                           latency=unit.latency, start_latency=unit.start_latency,
                           cycles=load + beats + fixed)


# -- the v2 engine (qaccel.rtl.nbits.matmul_nbits_v2, docs/matmul_nbits_v2.md) ---------------------

#: What bounds a v2 block, in the order ties are named.
V2_BOUNDS = ("compute", "lanes", "accumulator")


@dataclass(frozen=True)
class NBitsV2Call:
    """A MatMulNBits call (M x K by K x N, accuracy_level 4) on the v2 engine.

    ``cycles`` runs from ``start`` to ``busy`` low with streams that never stall. Per row
    tile: ``load`` cycles quantising its rows (one element slot per cycle), then every column
    group over them, then the drain of the tile's last group. ``block_cycles`` is the steady
    state of one K-block of a full tile (``block_rows``: ``m_tile``, or M when smaller) and
    one column group, and ``bound``
    what sets it: the MAC steps (``compute``), the float lanes' term rate (``lanes``) or the
    accumulator read-add-write of the lanes (``accumulator``). ``weight_bytes`` and
    ``bytes`` are what crosses the interface per call (weights are re-sent per row tile;
    ``a`` once per row).
    """

    config: AccelConfig
    M: int
    N: int
    K: int
    bits: int
    block_size: int
    cycles: int
    load_cycles: int
    tiles: int
    block_cycles: int
    block_rows: int
    bound: str
    bytes: dict[str, int]

    @property
    def macs(self) -> int:
        return self.M * self.N * self.K

    @property
    def macs_per_cycle(self) -> float:
        return self.macs / self.cycles

    @property
    def peak_per_cycle(self) -> int:
        """MACs per cycle of the array at this width: ``pe * simd``, half at 5..8 bits."""
        return self.config.pe * self.config.simd // (2 if self.bits > 4 else 1)

    @property
    def steady_utilisation(self) -> float:
        """Fraction of the peak in the steady state (a full tile, a whole block)."""
        steps = self.block_size // self.config.simd * self.block_rows
        return steps / self.block_cycles

    @property
    def weight_bytes(self) -> int:
        return self.bytes["w"] + self.bytes["s"]

    def seconds(self, fmax_mhz: float, memory_gbps: float | None = None) -> float:
        """Time of the call at ``fmax_mhz``, and, with an external memory of ``memory_gbps``
        GB/s feeding every stream, the larger of that and the memory time (the memory-bound
        figure a board with that memory reaches)."""
        if isinstance(fmax_mhz, bool) or not isinstance(fmax_mhz, (int, float)) \
                or not fmax_mhz > 0:
            raise ValueError(f"fmax_mhz must be a positive number, not {fmax_mhz!r}")
        t = self.cycles / (fmax_mhz * 1e6)
        if memory_gbps is None:
            return t
        if isinstance(memory_gbps, bool) or not isinstance(memory_gbps, (int, float)) \
                or not memory_gbps > 0:
            raise ValueError(f"memory_gbps must be a positive number, not {memory_gbps!r}")
        return max(t, sum(self.bytes.values()) / (memory_gbps * 1e9))


def _lane_schedule(first: int, groups: int, kb: int, R: int, bpb: int, J: int,
                   rec: int, digits: int = 1, zero_terms: bool = False) -> int:
    """The cycle of a tile's last lane term when the lanes or their accumulators bound.

    MAC result ``k`` (block ``n = k // R``, row ``r = k % R``) could reach the lanes at
    ``first + (n * bpb + bpb - 1) * R + r`` (``first``: the first step's issue plus the
    hand-off and the MAC latency); it waits for the previous result's ``J`` terms, and,
    unless it opens its accumulators, ``rec`` cycles after the previous result on the same
    accumulators (ScaleLane's recurrence, kept by LaneAdmission): the same row's previous
    block, or with ``digits = 4`` (the float path: rows ``4a .. 4a + 3`` are the digit rows
    of row ``a`` of A and share its accumulators) the previous digit row. With
    ``zero_terms`` (float zero points) a result's ``J`` weight terms are followed by its
    ``J`` zero-point terms on the same accumulators, no sooner than ``rec`` after the weight
    terms, and the next result on them waits for those. Assumes the MAC array's output FIFO
    never fills (the lanes' backlog stays below its depth), so the steps themselves never
    stall."""
    writes = []                          # per result: its last phase's first term
    end = None                           # the cycle after the previous result's last term
    for n in range(groups * kb):
        for r in range(R):
            t = first + (n * bpb + bpb - 1) * R + r
            if end is not None:
                t = max(t, end)
            if r % digits:                               # the previous digit row
                t = max(t, writes[-1] + rec)
            elif n % kb:                                 # the same row's previous block
                t = max(t, writes[(n - 1) * R + r + digits - 1] + rec)
            w = t + max(J, rec) if zero_terms else t
            writes.append(w)
            end = w + J
    return end - 1


def nbits_v2_call(config: AccelConfig, *, M: int, N: int, K: int, bits: int,
                  block_size: int, bias: bool = False, float_path: bool = False,
                  float_zero_points: bool = False) -> NBitsV2Call:
    """Return the cycles of a MatMulNBits call (accuracy_level 4, integer or no zero points)
    on the v2 engine of ``config``, composed from the engine's
    :func:`~qaccel.rtl.nbits.matmul_nbits_v2.engine_timing` (its own pipeline and its units'
    latencies) and the row quantiser's :func:`~qaccel.rtl.nbits.row_quantizer.job_cycles`,
    without building any of them.

    With ``R`` the tile's rows, ``G`` the column groups (``pe`` columns, ``pe / 2`` at 5..8
    bits: ``cols``), ``S = ceil(K / block_size) * block_size / simd`` weight steps per row,
    ``J = pe / F`` terms per lane per MAC result and ``bpb = block_size / simd``: a tile
    loads (``start`` or the previous tile's switch, then the quantiser's job), issues its
    first step ``issue`` cycles later and then one step a cycle, ``G * S * R`` in all, when
    the MACs bound (``bpb >= J`` and ``R * bpb >= recurrence``). Otherwise the lanes bound:
    they take a block's ``R * J`` terms back to back, a block no sooner than ``recurrence``
    after the previous one of the same group. The tile's last lane term follows the later of
    the two; its result reaches the bank ``lane + bank`` cycles later, the ``R * cols``
    words of the last group leave one a cycle, and then the next tile starts
    (``next_tile``) or the last ``y`` beat follows (``out``) and ``busy`` falls (``done``).
    Exact against the RTL (tests/rtl/nbits/test_matmul_nbits_v2.py::test_call_cycles) whenever a
    group's steps outlast the read-out of the previous group (``S * R >= R * cols``, i.e.
    ``K / simd >= cols``); shorter rows also wait for the read-out.

    ``float_path``: a call of the float path (docs/matmul_nbits_v2.md, section 2; needs
    ``config.float_path``): a tile holds ``m_tile / 4`` rows of A, each quantised into four
    int8 digit rows (the row quantiser's block-floating-point job) that the MAC array and the
    lanes treat as rows sharing one accumulator per column, so ``R`` above counts digit rows
    and the read-out ``R / 4`` rows. ``K`` is the engine's ``k``: with g_idx the padded
    group-by-group layout's length. ``float_zero_points`` (with ``float_path``): each result
    has ``2 J`` terms per lane (the weights', then the zero point's), and ``s`` twice the
    beats.
    """
    if not isinstance(config, AccelConfig):
        raise TypeError(f"config must be an AccelConfig, not {config!r}")
    check_int("M", M, 1)
    check_int("N", N, 1)
    check_int("K", K, 1, config.max_k)
    check_int_choice("bits", bits, config.nbits)
    check_power_of_two("block_size", block_size, 16)
    check_int("block_size", block_size, None, config.max_block_size)
    check_bool("float_path", float_path)
    check_bool("float_zero_points", float_zero_points)
    if float_path and not config.float_path:
        raise ValueError("float_path calls need an engine built with config.float_path")
    if float_zero_points and not float_path:
        raise ValueError("float_zero_points calls take the float path: pass float_path=True")
    tm, lanes = engine_timing(config), config.scale_lanes
    digits = 4 if float_path else 1
    pe, simd, T = config.pe, config.simd, config.m_tile
    J = pe // lanes
    Jt = 2 * J if float_zero_points else J           # terms per lane per MAC result
    cols = pe // 2 if bits > 4 else pe
    groups = -(-N // cols)
    kb = -(-K // block_size)
    steps = kb * block_size // simd
    bpb = block_size // simd
    rec = tm["recurrence"]

    def block(rows: int) -> tuple[int, str]:
        chain = max(J, rec) + rec if float_zero_points else rec
        lim = {"compute": rows * bpb, "lanes": rows * Jt,
               "accumulator": chain * (rows if float_path else 1)}
        bound = max(V2_BOUNDS, key=lambda b: (lim[b], -V2_BOUNDS.index(b)))
        return lim[bound], bound

    t = tm["start"]                      # the tile's quantiser start
    load_total = 0
    Ta = T // digits                     # rows of A per tile
    tiles = [min(Ta, M - r0) for r0 in range(0, M, Ta)]
    for i, Ra in enumerate(tiles):
        R = Ra * digits                  # rows through the MAC array
        load = row_quantizer.job_cycles(K, Ra, block_size, bfp=float_path)
        load_total += load
        first_issue = t + load + tm["issue"]
        if Jt <= bpb and rec <= R * bpb and (digits == 1 or rec <= J):
            # the MAC steps bound: each block's R results leave the lanes before the next
            last_issue = first_issue + groups * steps * R - 1
            last_term = last_issue + tm["to_lane"] + tm["mac"] + R * (Jt - 1)
        else:
            last_term = _lane_schedule(first_issue + tm["to_lane"] + tm["mac"], groups, kb,
                                       R, bpb, J, rec, digits, float_zero_points)
        last_take = last_term + tm["lane"] + tm["bank"] + Ra * cols - 1
        if i + 1 < len(tiles):
            t = last_take + tm["next_tile"]
        else:
            cycles = last_take + tm["out"] + tm["done"]
    rows = min(Ta, M) * digits
    per_block, bound = block(rows)
    F = lanes
    w_words = -(-steps // 2) if bits == 2 else steps
    nbytes = {"a": 4 * M * K,
              "w": len(tiles) * groups * w_words * 4 * pe * simd // 8,
              "s": len(tiles) * groups * kb * Jt * 5 * F,
              "b": len(tiles) * groups * J * 4 * F if bias else 0,
              "y": 4 * M * groups * cols}
    return NBitsV2Call(config=config, M=M, N=N, K=K, bits=bits, block_size=block_size,
                       cycles=cycles + 1, load_cycles=load_total, tiles=len(tiles),
                       block_cycles=per_block, block_rows=rows, bound=bound, bytes=nbytes)
