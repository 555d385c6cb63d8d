# amaranth: UnusedElaboratable=no
"""Performance model of the MatMulNBits engine: the steady-state cost of one pass.

A pass is one row of A against ``pe`` output columns (see
:class:`qaccel.rtl.matmul_nbits.MatMulNBits`). With input streams that never stall, a pass
takes the largest of

* ``compute``: ``K_pad / simd`` beats, one per cycle (``K_pad``: K rounded up to whole blocks).
  This is also the activation path's rate: ``a`` carries ``simd`` elements a beat and the
  activation quantiser takes one beat a cycle, so it never binds on its own; its per-block
  amax pass is a block of latency (:func:`nbits_latency`), paid once per call;
* ``weight bus``: ``K_pad * bits`` bits per column over ``weight_bus_width / pe`` bits per
  cycle (the job's weights are one continuous bit stream per column, so this is an average);
* ``scale stream``: one ``s`` beat per block, plus the bias beat;
* ``accumulate``: each float32 accumulator takes ``partial_sums`` operands per 8 cycles (an
  operand waits until the adder is done with the previous one in the same partial sum): one
  operand per block on the int8 path (the block terms), one per beat on the float path;
* ``fold``: ``8 * partial_sums`` cycles, the previous row's fold of its partial sums.

That is the steady state measured in RTL simulation, exactly for every
bits 2..8 x block_size 16..256 pair on the shapes of tests/rtl/test_matmul_nbits.py.

:func:`nbits_call` adds a call's fill and drain: the cycles from ``start`` to the first ``a``
beat, and the pipeline latency (:func:`nbits_latency`, the sum of the units' documented
latencies, checked against the RTL classes in tests/model/test_perf.py).
:func:`elementwise_call` models the QuantizeLinear / DequantizeLinear / DirectML units: table
loads, one beat per cycle, and the unit's start and pipeline latencies.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from fractions import Fraction

from .config import ZERO_POINTS, AccelConfig, int8_path
from .validate import check_bool, check_int, check_int_choice, check_power_of_two

__all__ = ["BOUNDS", "V2_BOUNDS", "ElementwiseCall", "NBitsCall", "NBitsPass", "NBitsV2Call",
           "elementwise_call", "nbits_v2_call",
           "nbits_call", "nbits_latency", "nbits_pass"]

#: What limits a pass, in the order ties are named.
BOUNDS = ("compute", "weight bus", "scale stream", "accumulate", "fold")


@dataclass(frozen=True)
class NBitsPass:
    """The steady-state cost of one MatMulNBits pass (``pe`` columns x one row of K).

    ``cycles`` is exact as a :class:`~fractions.Fraction` (the weight-bus bound is an
    average when a pass's weights do not fill whole bus words). ``bytes`` maps each stream
    (``a``, ``w``, ``s``, ``z``, ``y``) to the bytes it carries per pass at its bus width.
    """

    config: AccelConfig
    K: int
    bits: int
    block_size: int
    path: str                       # "int8" or "float"
    bound: str                      # one of BOUNDS
    cycles: Fraction
    limits: dict[str, Fraction]     # each bound's cycles
    bytes: dict[str, int]

    @property
    def macs(self) -> int:
        """Multiply-adds of the pass (K of every one of the ``pe`` columns)."""
        return self.K * self.config.pe

    @property
    def macs_per_cycle(self) -> float:
        return float(self.macs / self.cycles)

    @property
    def utilisation(self) -> float:
        """Fraction of the ``pe * simd`` MAC slots used (padding past K counts as unused)."""
        return self.macs_per_cycle / (self.config.pe * self.config.simd)


def nbits_pass(config: AccelConfig, *, K: int, bits: int, block_size: int,
               zero_points: str = "packed", accuracy_level: int = 4,
               bias: bool = False) -> NBitsPass:
    """Return the steady-state cost of one pass of MatMulNBits on ``config``'s engine.

    ``zero_points`` is ``"none"``, ``"packed"`` or ``"float"``; accuracy_level 4 with integer
    or no zero points takes the int8 path, everything else the float path (which the
    configuration must carry). Raises :exc:`ValueError` / :exc:`TypeError` naming a bad
    parameter.
    """
    if not isinstance(config, AccelConfig):
        raise TypeError(f"config must be an AccelConfig, not {config!r}")
    check_int("K", K, 1)
    check_int_choice("bits", bits, config.nbits)
    check_power_of_two("block_size", block_size, max(16, config.simd))
    check_int("block_size", block_size, None, config.max_block_size)
    if zero_points not in ZERO_POINTS:
        raise ValueError(f"zero_points must be one of {ZERO_POINTS}, not {zero_points!r}")
    check_int("accuracy_level", accuracy_level, 0, 4)
    float_zp = zero_points == "float"
    path = "int8" if int8_path(accuracy_level, float_zero_points=float_zp, g_idx=False) else "float"
    if path == "float" and not config.float_path:
        raise ValueError(f"accuracy_level {accuracy_level} with zero_points {zero_points!r} "
                         f"takes the float path, which this config leaves out (float_path)")
    pe, simd = config.pe, config.simd
    lane_bus = config.weight_bus_width // pe
    blocks = -(-K // block_size)
    k_pad = blocks * block_size
    s_beats = blocks + bool(bias)
    limits = {
        "compute": Fraction(k_pad // simd),
        "weight bus": Fraction(k_pad * bits, lane_bus),
        "scale stream": Fraction(s_beats),
        "accumulate": Fraction(_accumulate_row(_operands(path, blocks, k_pad, simd),
                                               config.partial_sums)),
        "fold": Fraction(8 * config.partial_sums),
    }
    bound = max(BOUNDS, key=lambda b: (limits[b], -BOUNDS.index(b)))
    cycles = limits[bound]
    return NBitsPass(
        config=config, K=K, bits=bits, block_size=block_size, path=path, bound=bound,
        cycles=cycles, limits=limits,
        bytes={"a": -(-K // simd) * simd * 4,
               "w": pe * k_pad * bits // 8,
               "s": s_beats * pe * 8,
               "z": -(-blocks * bits // 8) * pe if zero_points == "packed" else 0,
               "y": pe * 4})


def _operands(path: str, blocks: int, k_pad: int, simd: int) -> int:
    """Operands one row gives each float32 accumulator: block terms (int8) or beats (float)."""
    return blocks if path == "int8" else k_pad // simd


def _accumulate_row(operands: int, partial_sums: int, spacing: Fraction = Fraction(1)) -> int:
    """Cycles from a row's first operand entering its accumulator to the last one, plus one:
    operand ``j`` goes to partial sum ``j % partial_sums`` and waits 8 cycles after the
    previous operand of that partial sum; operands are ``spacing`` cycles apart otherwise."""
    last = operands - 1
    return int(8 * (last // partial_sums) + spacing * (last % partial_sums)) + 1


#: Cycles from ``start`` to the first ``a`` beat: the job registers (3 cycles), then the
#: first beat on the int8 path; the float path also waits for the first block's parameters
#: through the ``s`` FIFO (and, with a bias, for the bias beat ahead of them). Measured.
_START = {"int8": 5, "float": 7}
#: The engine's output stage: float16/bfloat16 rounding (Decode 1 + FloatRound 3), y FIFO 2.
OUTPUT_LATENCY = 6


def _tree_stages(simd: int) -> int:
    """Register stages of a ``simd``-input max / adder tree (a register every two levels)."""
    return -(-(simd.bit_length() - 1) // 2)


def nbits_latency(config: AccelConfig, *, block_size: int, path: str) -> int:
    """Cycles from the transfer of a pass's last ``a`` beat (K a multiple of ``block_size``) to
    its ``y`` beat, nothing stalled, as the sum of the units' latencies:

    * int8: :class:`~qaccel.rtl.activation_quant.ActivationQuant` ``35 + t``, the last block
      read out again (``block_size / simd``), :class:`~qaccel.rtl.mac_array.MacArray`
      ``t + 3``, the block-term hand-off 1, :class:`~qaccel.rtl.block_scale.BlockScale` 23,
      :class:`~qaccel.rtl.row_accumulate.RowAccumulate` ``8 * partial_sums + 9`` (``t`` the
      tree stages, ``ceil(log2(simd) / 2)``);
    * float: :class:`~qaccel.rtl.float_mac.FloatMac` ``40 + 8 * partial_sums +
      7 * log2(simd)``;

    plus :data:`OUTPUT_LATENCY`.
    """
    if path not in ("int8", "float"):
        raise ValueError(f"path must be 'int8' or 'float', not {path!r}")
    simd, sums = config.simd, config.partial_sums
    if path == "int8":
        t = _tree_stages(simd)
        core = (35 + t) + block_size // simd + (t + 3) + 1 + 23 + (8 * sums + 9)
    else:
        core = 40 + 8 * sums + 7 * (simd.bit_length() - 1)
    return core + OUTPUT_LATENCY


@dataclass(frozen=True)
class NBitsCall:
    """A whole MatMulNBits call (one engine job: ``M`` rows x ``ceil(N / pe)`` column groups).

    ``cycles`` runs from the ``start`` strobe to the engine going idle after the last ``y``
    beat; ``per_pass`` is the steady state (:func:`nbits_pass`), ``latency`` the pipeline's
    (:func:`nbits_latency`), ``bytes`` each stream's total.
    """

    per_pass: NBitsPass
    M: int
    N: int
    passes: int
    latency: int
    cycles: int

    @property
    def macs(self) -> int:
        """Useful multiply-adds, ``M * N * K`` (padding columns and K past the end excluded)."""
        return self.M * self.N * self.per_pass.K

    @property
    def macs_per_cycle(self) -> float:
        return self.macs / self.cycles

    @property
    def utilisation(self) -> float:
        """Fraction of the ``pe * simd`` MAC slots of the whole call that did useful work."""
        c = self.per_pass.config
        return self.macs_per_cycle / (c.pe * c.simd)

    @property
    def bound(self) -> str:
        return self.per_pass.bound

    @property
    def bytes(self) -> dict[str, int]:
        return {k: v * self.passes for k, v in self.per_pass.bytes.items()}


def nbits_call(config: AccelConfig, *, M: int, N: int, K: int, bits: int, block_size: int,
               zero_points: str = "packed", accuracy_level: int = 4,
               bias: bool = False) -> NBitsCall:
    """Return the cycles of one MatMulNBits call ``(M, K) x (K, N)`` on ``config``'s engine,
    input streams never stalled and ``y`` never back-pressured.

    ``start`` cycles + the passes + the pipeline latency. The first pass runs at the
    upstream rate (compute, weight bus, scale stream); each further pass takes
    :func:`nbits_pass`'s cycles. When the accumulators bound a pass, its operands queue, and
    the call ends ``latency`` after its last operand enters them. On the int8 path a
    weight-bus-bound call gains the weight unpacker's head start (the words it buffers while
    the first block is quantised), and a row of one partial block is read out after its
    ``ceil(K / simd)`` beats. Exact against the RTL on every call measured: 840 calls, every
    bits 2..8 x block_size 16..256 point on six shapes and both paths
    (tests/rtl/test_matmul_nbits.py::test_whole_call_cycles and its slow sweep).
    """
    check_int("M", M, 1)
    check_int("N", N, 1)
    p = nbits_pass(config, K=K, bits=bits, block_size=block_size, zero_points=zero_points,
                   accuracy_level=accuracy_level, bias=bias)
    passes = M * -(-N // config.pe)
    latency = nbits_latency(config, block_size=block_size, path=p.path)
    lim = p.limits
    first = max(lim["compute"], lim["weight bus"], lim["scale stream"])
    # the float path's first beat waits for the bias beat on ``s`` unless the weights are later
    start = _START[p.path] + (p.path == "float" and bias and first == lim["compute"])
    upstream = start + latency + int(-(-(first + (passes - 1) * p.cycles) // 1))
    if p.path == "int8" and lim["weight bus"] > lim["compute"]:
        # while the first block is quantised, each column's WeightUnpack fills its bit buffer
        # and output register; the weight bus starts that far ahead (less its 3-cycle
        # pipeline), and the first row's operands come at the compute rate
        lane_bus = config.weight_bus_width // config.pe
        buffered = (lane_bus + 8 * config.simd + min(lane_bus, 8 * config.simd)
                    + config.simd * bits)
        upstream -= buffered // lane_bus - 3
        first = lim["compute"]
    blocks = -(-K // block_size)
    operands = _operands(p.path, blocks, blocks * block_size, config.simd)
    spacing = first / operands
    accumulate = (start + latency + int(spacing - 1) + (passes - 1) * int(lim["accumulate"])
                  + _accumulate_row(operands, config.partial_sums, spacing))
    cycles = max(upstream, accumulate)
    if p.path == "int8":
        # the first block is read out once its ``a`` beats are in: fewer than block_size /
        # simd when a row is one partial block
        cycles -= block_size // config.simd - -(-min(block_size, K) // config.simd)
    return NBitsCall(per_pass=p, M=M, N=N, passes=passes, latency=latency, cycles=cycles)


@dataclass(frozen=True)
class ElementwiseCall:
    """A QuantizeLinear / DequantizeLinear / DirectML call on an elementwise unit.

    ``cycles`` runs from the first table write to the unit going idle after the last job
    (as :attr:`qaccel.engine.RunRecord.cycles`), ``load_cycles`` of them writing tables (one
    per entry, plus the ``start`` strobe of each job).
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

    Per job: ``table_entries`` writes and the ``start`` strobe, the index generator's
    ``start_latency``, ``ceil(elements / lanes)`` beats at one per cycle, and the unit's
    ``latency`` (the :class:`~qaccel.rtl.quantize.Quantize` / ``Dequantize`` unit's own
    attributes; DirectML runs on the Quantize unit). Exact against the RTL
    (tests/qaccel/test_rtl_engine.py::test_elementwise_cycles_equal_the_model).
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
    if op == "dequantize":
        from qaccel.rtl.dequantize import Dequantize as unit_class
    else:
        from qaccel.rtl.quantize import Quantize as unit_class
    unit = unit_class(config)
    beats = sum(-(-e // config.lanes) for e, _ in jobs)
    load = sum(t + 1 for _, t in jobs)
    fixed = len(jobs) * (unit.start_latency + unit.latency)
    return ElementwiseCall(op=op, lanes=config.lanes, jobs=len(jobs),
                           elements=sum(e for e, _ in jobs), beats=beats, load_cycles=load,
                           latency=unit.latency, start_latency=unit.start_latency,
                           cycles=load + beats + fixed)


# -- the v2 engine (qaccel.rtl.matmul_nbits_v2, docs/matmul_nbits_v2.md) -----------------------

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


@functools.lru_cache(maxsize=64)
def _v2_engine(config: AccelConfig):
    """(timing, lanes, row quantiser) of the v2 engine of ``config`` (built, not elaborated)."""
    from qaccel.rtl.matmul_nbits_v2 import MatMulNBitsV2
    from qaccel.sim.runner import mark_elaborated

    engine = MatMulNBitsV2(config)
    mark_elaborated(engine)            # read for its figures only, never elaborated
    return engine.timing, engine.lanes, engine.row_quantizer


def nbits_v2_call(config: AccelConfig, *, M: int, N: int, K: int, bits: int,
                  block_size: int, bias: bool = False, float_path: bool = False,
                  float_zero_points: bool = False) -> NBitsV2Call:
    """Return the cycles of a MatMulNBits call (accuracy_level 4, integer or no zero points)
    on the v2 engine of ``config``, composed from the engine's
    :attr:`~qaccel.rtl.matmul_nbits_v2.MatMulNBitsV2.timing` (its own pipeline and its
    units' latencies) and the row quantiser's :meth:`job_cycles`.

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
    Exact against the RTL (tests/rtl/test_matmul_nbits_v2.py::test_call_cycles) whenever a
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
    tm, lanes, rq = _v2_engine(config)
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
        load = rq.job_cycles(K, Ra, block_size, bfp=float_path)
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
