"""The :class:`RTL` engine: the golden model's API answered by simulating the generated
Verilog. A call is validated (the model's checks: same exceptions, output type and shape),
tiled into unit jobs (:mod:`.tiling`), turned into register and stream beats
(:mod:`qaccel.sim.jobs`), simulated on the unit's build (:mod:`.builds`), and decoded; the
golden model runs only with ``check=True``, once per call, to compare.

The simulation side (:mod:`qaccel.sim`, :mod:`qaccel.rtl`: Amaranth, cocotb) is imported
inside the methods that use it, so that ``qaccel.RTL()`` is cheap to make."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from qaccel.model import nbits_kernels as _k
from qaccel.model.config import ZERO_POINTS, AccelConfig, int8_path
from qaccel.model.dml import check_dml, dml_quantize_linear
from qaccel.model.dtypes import dtype_name
from qaccel.model.nbits import NBitsArgs, check_A, matmul_nbits
from qaccel.model.quant import check_dequantize, check_quantize, dequantize_linear, quantize_linear
from qaccel.model.validate import check_int

from .builds import (
    UNIT_OF,
    elementwise_unit,
    nbits_engine,
    nbits_stream_sim,
    stream_harness,
    unit_stream_sim,
)
from .tiling import broadcast_box, onnx_scale_box, plan, sub

__all__ = ["HARNESSES", "RTL", "RTLMismatchError", "RunRecord"]

#: How jobs reach the simulator: ``"auto"`` (the C++ stream harness on Verilator when it is
#: available, else cocotb), ``"cocotb"`` or ``"stream"`` (the C++ harness, Verilator only).
HARNESSES = ("auto", "cocotb", "stream")
_SIMULATORS = ("verilator", "icarus")
#: Job labels per operator.
_LABELS = {"quantize": "Q", "dequantize": "DQ", "dml": "DML"}
#: With a progress report, the stream harness runs jobs in batches of at least this many beats.
STREAM_BATCH_BEATS = 1 << 18


class RTLMismatchError(AssertionError):
    """With ``check=True``: the simulated unit's output differs from the golden model's."""


@dataclass(frozen=True)
class RunRecord:
    """What one :class:`RTL` call cost.

    Attributes
    ----------
    op : str
        ``"quantize"``, ``"dequantize"``, ``"dml"`` or ``"matmul_nbits"`` (whose fields
        :meth:`RTL.matmul_nbits` describes: MACs, ``y`` beats, the engine's cycles).
    simulator, harness : str
        ``"verilator"`` or ``"icarus"``; ``"cocotb"`` or ``"stream"`` (``"none"``: nothing
        was simulated, the call was empty).
    jobs : int
        Unit jobs the call took (more than one when the scale table had to be split).
    elements, beats : int
        Elements of ``x``; output beats (``ceil(elements / lanes)`` per job).
    cycles : int
        Clock cycles of the unit from the first table write to idle after the last job,
        table loads included (``load_cycles`` of them: per job, the table writes, one per
        entry or one per ``table_interval`` cycles when the unit prepares its entries
        (:attr:`qaccel.rtl.elementwise.unit.Elementwise.load_cycles`), and the start strobe).
    table_entries : int
        Scale-table entries written, over all jobs.
    latency : int or None
        Smallest cycles from an ``x`` beat's transfer to its ``y`` beat.
    wall_time : float
        Seconds of the whole call (validation, job building, simulation, decoding).
    build_reused : bool
        No design had to be compiled for this call.
    """

    op: str
    simulator: str
    harness: str
    jobs: int
    elements: int
    beats: int
    cycles: int
    load_cycles: int
    latency: int | None
    wall_time: float
    build_reused: bool
    table_entries: int = 0

    @property
    def beats_per_cycle(self) -> float:
        """Output beats per clock cycle over the whole call (at most 1)."""
        return self.beats / self.cycles if self.cycles else 0.0

    @property
    def elements_per_second(self) -> float:
        """Elements simulated per second of wall time."""
        return self.elements / self.wall_time if self.wall_time else 0.0

    def summary(self, indent: str = "  ") -> str:
        """Return the record as a few lines of text (the CLI's and the demo's cycle report)."""
        latency = "-" if self.latency is None else f"{self.latency} cycles"
        return "\n".join(indent + line for line in (
            f"jobs {self.jobs}, elements {self.elements}, beats {self.beats}, cycles "
            f"{self.cycles} ({self.load_cycles} loading tables), "
            f"{self.beats_per_cycle:.3f} beats/cycle over the call (table loads included)",
            f"latency {latency}; {self.simulator} ({self.harness}) {self.wall_time:.2f} s "
            f"wall, {self.elements_per_second:,.0f} elements/s simulated; build "
            f"{'reused' if self.build_reused else 'compiled'}",
        ))


class RTL:
    """Run QuantizeLinear, DequantizeLinear and DirectML's quantize on the simulated RTL.

    Parameters
    ----------
    config : AccelConfig, optional
        The hardware instance (default ``AccelConfig()``: Quantize / Dequantize of one lane
        and every format, the ``ecp5-25k`` MatMulNBits v2 engine without a float path).
    simulator : str
        ``"verilator"`` or ``"icarus"``.
    check : bool
        Also compare every output with the golden model; :exc:`RTLMismatchError` on a
        difference.
    harness : str
        One of :data:`HARNESSES`.
    idle, backpressure : float
        Pause probabilities per cycle on the ``x`` input and the ``y`` output (0: full speed;
        cycle counts then grow accordingly).
    seed : int
        Seed of the pause generators.
    progress : callable, optional
        ``progress(beats_done, beats_total)``, called while a simulation runs.

    Members
    -------
    config, simulator, check, harness, idle, backpressure, seed, progress : as given
    last_run : RunRecord or None
        The record of the last call.

    Raises
    ------
    TypeError
        ``config`` is not an AccelConfig, ``check`` not a bool, ``seed`` not an integer.
    ValueError
        Unknown ``simulator`` or ``harness``, ``"stream"`` with Icarus, a pause probability
        outside ``[0, 1)``, a negative ``seed``.

    The Quantize and Dequantize units and the MatMulNBits engines are created and built on
    first use, once per configuration in a process (a finished build on disk is reused, see
    :func:`qaccel.sim.elementwise_sim.elementwise_build` and :mod:`qaccel.sim.streamsim`).
    Each call raises what the golden function raises for invalid arguments (and converts
    array-likes and non-native byte order as it does), and ValueError naming the
    configuration field when the instance does not carry a type the call needs (for empty
    calls too). A call without elements returns the golden model's empty result (shape and
    dtype) without building or simulating anything (``last_run.harness == "none"``).
    Simulator failures raise :mod:`qaccel.sim.runner`'s exceptions
    (:exc:`~qaccel.sim.runner.SimulatorNotFoundError`, :exc:`~qaccel.sim.runner.BuildError`,
    :exc:`~qaccel.sim.runner.SimulationError` and its subclasses).
    """

    def __init__(self, config=None, simulator: str = "verilator", *, check: bool = False,
                 harness: str = "auto", idle: float = 0.0, backpressure: float = 0.0,
                 seed: int = 1, progress: Callable[[int, int], None] | None = None):
        if config is None:
            config = AccelConfig()
        if not isinstance(config, AccelConfig):
            raise TypeError(f"config must be an AccelConfig, not {type(config).__name__} "
                            f"{config!r}: build one, e.g. AccelConfig(lanes=2) "
                            f"(qaccel.model.config), or preset(name) (qaccel.model.presets)")
        if simulator not in _SIMULATORS:
            raise ValueError(f"simulator must be one of {', '.join(_SIMULATORS)}, "
                             f"not {simulator!r}")
        if harness not in HARNESSES:
            raise ValueError(f"harness must be one of {', '.join(HARNESSES)}, not {harness!r}")
        if harness == "stream" and simulator != "verilator":
            raise ValueError(f"harness 'stream' runs on Verilator only, not {simulator!r}: "
                             f"use harness='cocotb' (or 'auto') with {simulator!r}")
        if not isinstance(check, bool):
            raise TypeError(f"check must be a bool, not {check!r}: check=True or False")
        for name, p in (("idle", idle), ("backpressure", backpressure)):
            if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p < 1:
                raise ValueError(f"{name} must be a probability in [0, 1), not {p!r}")
        self.config = config
        self.simulator = simulator
        self.check = check
        self.harness = harness
        self.idle, self.backpressure = float(idle), float(backpressure)
        self.seed = check_int("seed", seed, 0, (1 << 64) - 1)
        self.progress = progress
        self.last_run: RunRecord | None = None

    def __repr__(self) -> str:
        return (f"RTL(lanes={self.config.lanes}, table_depth={self.config.table_depth}, "
                f"simulator={self.simulator!r}, slug={self.config.slug!r})")

    # -- the golden API -----------------------------------------------------------------------

    def quantize_linear(self, x, y_scale, y_zero_point=None, *, axis=1, block_size=0,
                        output_dtype=None, saturate=True, precision=None):
        """:func:`qaccel.quantize_linear` on the Quantize unit."""
        from qaccel.sim.jobs import quantize_job

        t0 = time.perf_counter()
        kw = dict(axis=axis, block_size=block_size, output_dtype=output_dtype,
                  saturate=saturate, precision=precision)
        call = check_quantize(x, y_scale, y_zero_point, **kw)
        x, s = call.x, call.scale
        # (validated: the scale's shape, or one element each; sim.jobs wants the same shape)
        zp = None if call.zero_point is None else call.zero_point.reshape(s.shape)
        c = self.config

        def job(unit, box, label):
            s_box = onnx_scale_box(call.layout, box, axis, block_size)
            return quantize_job(unit, sub(x, box), sub(s, s_box), sub(zp, s_box), **kw,
                                label=label, expect=False)

        return self._run_elementwise(
            "quantize", call, t0, job, lambda: quantize_linear(x, s, call.zero_point, **kw),
            ("q_inputs", "x", x.dtype, c.q_inputs), ("scales", "y_scale", s.dtype, c.scales),
            ("q_outputs", "output", call.out_dtype, c.q_outputs),
            ("precisions", "division precision", call.division, c.precisions))

    def dequantize_linear(self, x, x_scale, x_zero_point=None, *, axis=1, block_size=0,
                          output_dtype=None):
        """:func:`qaccel.dequantize_linear` on the Dequantize unit."""
        from qaccel.rtl.elementwise.dequantize_lane import dq_scales
        from qaccel.sim.jobs import dequantize_job

        t0 = time.perf_counter()
        kw = dict(axis=axis, block_size=block_size, output_dtype=output_dtype)
        call = check_dequantize(x, x_scale, x_zero_point, **kw)
        x, s = call.x, call.scale
        zp = None if call.zero_point is None else call.zero_point.reshape(s.shape)
        c = self.config

        def job(unit, box, label):
            s_box = onnx_scale_box(call.layout, box, axis, block_size)
            return dequantize_job(unit, sub(x, box), sub(s, s_box), sub(zp, s_box), **kw,
                                  label=label, expect=False)

        return self._run_elementwise(
            "dequantize", call, t0, job,
            lambda: dequantize_linear(x, s, call.zero_point, **kw),
            ("dq_inputs", "x", x.dtype, c.dq_inputs), ("scales", "x_scale", s.dtype, dq_scales(c)),
            ("dq_outputs", "output", call.out_dtype, c.dq_outputs))

    def dml_quantize_linear(self, input, scale, zero_point=None, *, output_dtype=np.int8):
        """:func:`qaccel.dml_quantize_linear` on the Quantize unit (float32 division)."""
        from qaccel.sim.jobs import dml_job

        t0 = time.perf_counter()
        call = check_dml(input, scale, zero_point, output_dtype=output_dtype)
        # scale and zero point broadcast to their common shape
        x, s, zp = call.x, call.scale, call.zero_point
        c = self.config

        def job(unit, box, label):
            return dml_job(unit, sub(x, box), sub(s, broadcast_box(s.shape, box)),
                           None if zp is None else sub(zp, broadcast_box(zp.shape, box)),
                           output_dtype=output_dtype, label=label, expect=False)

        return self._run_elementwise(
            "dml", call, t0, job, lambda: dml_quantize_linear(x, s, zp, output_dtype=output_dtype),
            ("q_inputs", "input", x.dtype, c.q_inputs), ("scales", "scale", s.dtype, c.scales),
            ("q_outputs", "output", call.out_dtype, c.q_outputs),
            ("precisions", "division precision", call.division, c.precisions))

    def _run_elementwise(self, op: str, call, t0: float, job, golden, *carried) -> np.ndarray:
        """A validated Q / DQ / DirectML ``call``: the ``carried`` type checks (``(field,
        what, dtype, types)``), its jobs (``job(unit, box, label)`` per box of ``x``),
        simulated and decoded; with ``check`` compared with ``golden()``."""
        for field, what, dtype, types in carried:
            self._carried(field, what, dtype, types)
        if call.x.size == 0:
            return self._empty(op, call.shape, call.out_dtype, t0)
        unit = self._unit(op)
        label = (f"{_LABELS[op]} {dtype_name(call.x.dtype)} -> "
                 f"{dtype_name(call.out_dtype)}")
        jobs, boxes = plan(call.layout, self.config,
                           lambda box: job(unit, box, f"{label} {box}"))
        out = self._execute(op, unit, jobs, boxes, call, t0)
        if self.check:
            _compare(out, golden(), op)
        return out

    def matmul_nbits(self, A, B, scales, zero_points=None, g_idx=None, bias=None, *, K, N,
                     bits, block_size, accuracy_level=0):
        """:func:`qaccel.matmul_nbits` on the MatMulNBits engine, arguments in ONNX Runtime's
        layout (the host side repacks them, :mod:`qaccel.sim.nbits_jobs`).

        * The int8 path (accuracy_level 4, integer or no zero points, no g_idx) runs on the
          v2 engine (:class:`~qaccel.rtl.nbits.matmul_nbits_v2.MatMulNBitsV2`, one job: every row
          tile against every column group); with ``check=True`` every result must equal
          :func:`qaccel.model.nbits_hw.matmul_nbits_v2` bit for bit.
        * The float path (levels 0..3, g_idx, float zero points) runs on the v2 engine too if
          ``config.float_path`` is True (block floating point, four digit rows per row;
          ``m_tile`` a multiple of 4), bit-exact with the same model. Without
          ``config.float_path`` (the default configuration) a float-path call raises
          ValueError.

        Both agree with :func:`qaccel.matmul_nbits` and ONNX Runtime within
        ``1e-6 * sum_k |a_k w_k|``. ``last_run.elements`` counts multiply-accumulates
        (``M * N * K``), ``beats`` the ``y`` beats (one result each), ``cycles`` the
        engine's cycles from ``start``, ``latency`` the cycles from the first row's last
        ``a`` beat to its first ``y`` beat (None with the cocotb harness). An A without
        rows (M = 0, any leading dimension 0) gives the golden model's empty result (its
        shape and dtype), simulating nothing and building nothing. Raises what
        ``matmul_nbits`` raises; ValueError naming accuracy_level, the zero points and g_idx
        for a float-path call without ``config.float_path``; ValueError for what the engine
        does not take: bits outside ``config.nbits``, block_size outside
        ``[16, config.max_block_size]``, K (g_idx: its padded layout) above
        ``config.max_k`` (these configuration checks hold for any M, an empty A too, as the
        Q/DQ types do), an odd ``config.pe`` (:func:`~qaccel.sim.nbits_jobs.nbits_job_v2`);
        with ``check``,
        :exc:`RTLMismatchError` naming the first differing row, column and both codes.
        """
        t0 = time.perf_counter()
        level = check_int("accuracy_level", accuracy_level, 0, 4)
        a = check_A(A, check_int("K", K, 1))
        op = NBitsArgs(B, scales, zero_points, g_idx, K=K, N=N, bits=bits, block_size=block_size,
                 dtype=a.dtype)
        int8 = int8_path(level, float_zero_points=op.zmode == _k.ZP_FLOAT,
                         g_idx=op.gidx is not None)
        if not int8 and not self.config.float_path:
            raise ValueError(
                f"this configuration has no float path (config.float_path False), which "
                f"accuracy_level {level} with zero points {ZERO_POINTS[op.zmode]} and "
                f"{'a' if op.gidx is not None else 'no'} g_idx needs: the engine takes "
                f"accuracy_level 4 with integer or no zero points and no g_idx (a "
                f"configuration with float_path=True runs the rest)")
        self._engine_takes(op)
        if a.size == 0:
            # (the golden model checks bias too; with no rows it computes nothing)
            want = matmul_nbits(a, B, scales, zero_points, g_idx, bias, K=K, N=N, bits=bits,
                                block_size=block_size, accuracy_level=level)
            return self._empty("matmul_nbits", want.shape, want.dtype, t0)
        args = (a, B, scales, zero_points, g_idx, bias)
        kwargs = dict(K=K, N=N, bits=bits, block_size=block_size, accuracy_level=level)
        return self._matmul_nbits_v2(*args, **kwargs, t0=t0)

    def _engine_takes(self, op: NBitsArgs) -> None:
        """ValueError naming the configuration field if the engine cannot take the
        validated call ``op`` (bits, block_size, K), whatever M."""
        c = self.config
        if op.bits not in c.nbits:
            raise ValueError(f"bits {op.bits} is not carried by this engine "
                             f"(config.nbits {c.nbits}): build the RTL with an AccelConfig "
                             f"whose nbits holds {op.bits}")
        if not 16 <= op.block_size <= c.max_block_size:
            raise ValueError(f"block_size must be in [16, {c.max_block_size}] for this "
                             f"engine, not {op.block_size}: quantise the weights with a "
                             f"smaller block_size, or raise config.max_block_size")
        k_layout = op.K
        if op.gidx is not None:       # g_idx's groups, each padded to whole blocks
            counts = np.bincount(op.gidx, minlength=op.kb)
            k_layout = int((-(-counts // op.block_size)).sum()) * op.block_size
        if k_layout > c.max_k:
            raise ValueError(f"K must be at most config.max_k ({c.max_k}), not {op.K}"
                             + (f" (g_idx's padded layout: {k_layout})" if k_layout != op.K
                                else "") + ": split K, or raise config.max_k")

    def _matmul_nbits_v2(self, *args, t0: float, **kwargs) -> np.ndarray:
        """A call on the v2 engine (see :meth:`matmul_nbits`)."""
        from qaccel.sim.nbits_jobs import is_nan_code, nbits_job_v2, unpack_y_v2

        # the engine's model only runs for the check
        job = nbits_job_v2(*args, **kwargs, config=self.config, expect=self.check)
        engine = nbits_engine(self.config)
        harness = self._harness()
        if harness == "stream":
            beats, cycles, latency, built = self._run_nbits_v2_stream(engine, job)
        else:
            beats, cycles, latency, built = self._run_nbits_cocotb(engine, job)
        beats = np.asarray(beats, np.uint64).reshape(-1)
        _check_v2_beats(job, beats)
        got = (beats & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        out = unpack_y_v2(job, got)
        self.last_run = RunRecord("matmul_nbits", self.simulator, harness, 1,
                                  int(out.size) * kwargs["K"], len(got), cycles, 0, latency,
                                  time.perf_counter() - t0, not built)
        if self.check:
            fmt = job.regs["out_fmt"]
            same = (got == job.y) | (is_nan_code(got, fmt) & is_nan_code(job.y, fmt))
            bad = np.flatnonzero(~same & job.real)
            if bad.size:
                k = int(bad[0])
                r, c = (int(i) for i in job.order[k])
                raise RTLMismatchError(
                    f"matmul_nbits: the v2 engine differs from its model "
                    f"(qaccel.model.nbits_hw.matmul_nbits_v2) at {bad.size} of "
                    f"{int(job.real.sum())} results; first at row {r}, column {c}: RTL "
                    f"{int(got[k]):#010x}, model {int(job.y[k]):#010x}")
        return out

    def _run_nbits_v2_stream(self, engine, job):
        from qaccel.sim.streamsim import Segment

        sim, built = nbits_stream_sim(engine)
        r, c = job.regs, self.config
        # Stall timeout: an input may wait for a whole row tile (the next tile's rows wait
        # for every column group): its load, its blocks at their slowest bound (MAC steps,
        # lane terms or the lanes' accumulator recurrence), its read-out; stretched by pauses.
        rows, kb = min(c.m_tile, r["m"]), -(-r["k"] // r["block_size"])
        cols = c.pe // 2 if r["bits"] > 4 else c.pe
        per_block = max(rows * r["block_size"] // c.simd, rows * c.pe // engine.lanes,
                        engine.timing["recurrence"])
        tile = rows * kb * r["block_size"] + r["groups"] * (kb * per_block + rows * cols)
        watchdog = 10_000 + int(4 * tile / ((1 - self.idle) * (1 - self.backpressure)))
        seg = Segment(job.inputs, job.regs, phases=[["start"], list(job.inputs)],
                      expect={"y": len(job.y)})
        res = sim.run_segments([seg], idle=self.idle, backpressure=self.backpressure,
                               seed=self.seed, watchdog=watchdog)[0]
        # latency: the first row's last ``a`` beat (K of them) to its first ``y`` beat
        latency = int(res.output_cycles["y"][0]) - int(res.accepted["a"][r["k"] - 1])
        return res.outputs["y"], res.cycles, latency, built

    def _run_nbits_cocotb(self, engine, job):
        from qaccel.sim.nbits_sim import run_nbits_cocotb

        run = run_nbits_cocotb(engine, [job], simulator=self.simulator, idle=self.idle,
                               backpressure=self.backpressure, seed=self.seed, check=False)
        return run.beats[0], run.cycles[0], None, run.built

    # -- internals ----------------------------------------------------------------------------

    @staticmethod
    def _carried(field: str, what: str, dtype, carried: tuple[str, ...]) -> None:
        name = dtype_name(dtype)
        if name not in carried:
            raise ValueError(f"this RTL configuration does not carry {what} type {name} "
                             f"(config.{field} = {carried}): build the RTL with an "
                             f"AccelConfig whose {field} holds {name!r}")

    def _unit(self, op: str):
        """The unit that runs ``op`` (shared by every RTL of this configuration)."""
        return elementwise_unit(op, self.config)

    def _empty(self, op: str, shape, dtype, t0: float) -> np.ndarray:
        """The output of a call without elements: nothing simulated."""
        self.last_run = RunRecord(op, self.simulator, "none", 0, 0, 0, 0, 0, None,
                                  time.perf_counter() - t0, True)
        return np.empty(shape, dtype)

    def _harness(self) -> str:
        if self.harness != "auto":
            return self.harness
        if self.simulator == "verilator" and stream_harness() is not None:
            return "stream"
        return "cocotb"

    def _execute(self, op: str, unit, jobs, boxes, call, t0: float) -> np.ndarray:
        """Simulate ``jobs`` (which carry no expected beats: what comes back is the unit's own
        answer), decode the ``y`` beats into the output array of ``call``, record the run."""
        from qaccel.sim.jobs import lane_widths, unpack_output

        lanes = self.config.lanes
        width = lane_widths(unit)[1]
        harness = self._harness()
        name = UNIT_OF[op]
        if harness == "stream":
            beats, cycles, load, latency, built = self._run_stream(unit, jobs, name)
        else:
            beats, cycles, load, latency, built = self._run_cocotb(unit, jobs, name)
        out = np.empty(call.shape, call.out_dtype)
        for job, got, box in zip(jobs, beats, boxes, strict=True):
            _check_last(job, got, lanes * width)
            out[box] = unpack_output(job, got, width, lanes)
        self.last_run = RunRecord(
            op, self.simulator, harness, len(jobs), int(out.size),
            sum(len(b) for b in beats), cycles, load, latency, time.perf_counter() - t0,
            not built, sum(len(j.table) for j in jobs))
        return out

    def _progress(self, total: int):
        if self.progress is None:
            return None
        report = self.progress
        report(0, total)
        return lambda _jobs, beats: report(beats, total)

    def _run_cocotb(self, unit, jobs, name: str):
        from qaccel.sim.elementwise_sim import capture_elementwise

        total = sum(len(j.x) for j in jobs)
        cap = capture_elementwise(unit, jobs, name=name, simulator=self.simulator,
                                  idle=self.idle, backpressure=self.backpressure,
                                  seed=self.seed, progress=self._progress(total))
        if self.progress is not None:
            self.progress(total, total)
        return (cap.beats, sum(cap.cycles) + sum(cap.load_cycles), sum(cap.load_cycles),
                cap.latency[0] if cap.latency else None, cap.built)

    def _run_stream(self, unit, jobs, name: str):
        run = stream_harness()
        if run is None:
            raise RuntimeError("the C++ stream harness (qaccel.sim.streamsim) is not available")
        built = unit_stream_sim(unit, name)[1]
        # One harness process runs every job; with a progress report, batches of jobs.
        batches, size = [[]], 0
        for job in jobs:
            if size >= STREAM_BATCH_BEATS and self.progress is not None:
                batches.append([])
                size = 0
            batches[-1].append(job)
            size += len(job.x)
        total, done, results = sum(len(j.x) for j in jobs), 0, []
        for batch in batches:
            if self.progress is not None:
                self.progress(done, total)
            results += run(unit, batch, idle=self.idle, backpressure=self.backpressure,
                           seed=self.seed + len(results), name=name)
            done += sum(len(j.x) for j in batch)
        if self.progress is not None:
            self.progress(total, total)
        lats = [int(np.min(r.y_cycles - r.x_cycles)) for r in results
                if len(r.y_cycles) and len(r.y_cycles) == len(r.x_cycles)]
        return ([r.y for r in results], sum(r.cycles for r in results),
                sum(unit.load_cycles(len(j.table)) for j in jobs), min(lats) if lats else None,
                built)


def _check_last(job, beats: list[int], data_width: int) -> None:
    """Every beat but the last has ``last`` clear; the count is one per ``x`` beat."""
    flags = [b >> data_width & 1 for b in beats]
    if len(beats) != len(job.x) or (flags and (flags[-1] != 1 or any(flags[:-1]))):
        from qaccel.sim.runner import SimulationError

        raise SimulationError(f"job {job.label!r}: {len(beats)} y beats for {len(job.x)} x "
                              f"beats, last flags at {[k for k, f in enumerate(flags) if f]}")


def _check_v2_beats(job, beats: np.ndarray) -> None:
    """A v2 job's ``y`` beats: one per result word, ``last`` (bit 32) on the last only."""
    last = (beats >> np.uint64(32)) & np.uint64(1)
    if len(beats) != len(job.y) or (len(last) and (last[-1] != 1 or last[:-1].any())):
        from qaccel.sim.runner import SimulationError

        raise SimulationError(f"matmul_nbits: {len(beats)} y beats for {len(job.y)} results, "
                              f"last flags at {np.flatnonzero(last).tolist()[:8]}")


def _compare(out: np.ndarray, want: np.ndarray, op: str) -> None:
    """Raise RTLMismatchError unless ``out`` has ``want``'s storage bits, element by element
    (unused container bits, NaN payloads and -0 included)."""
    from qaccel.sim.jobs import storage_words

    a, b = storage_words(out), storage_words(want)
    bad = np.flatnonzero(a != b)
    if bad.size:
        k = int(bad[0])
        idx = np.unravel_index(k, want.shape) if want.shape else ()
        raise RTLMismatchError(
            f"{op}: the RTL differs from the golden model at {bad.size} of {want.size} "
            f"elements; first at index {tuple(int(i) for i in idx)}: RTL code {int(a[k]):#x} "
            f"({out.reshape(-1)[k]!r}), golden {int(b[k]):#x} ({want.reshape(-1)[k]!r})")
