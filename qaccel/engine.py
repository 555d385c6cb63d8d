"""The RTL as an engine: the golden model's API, answered by simulating the generated Verilog.

>>> import numpy as np, qaccel
>>> rtl = qaccel.RTL()                                     # default AccelConfig, Verilator
>>> y = rtl.quantize_linear(np.float32([1.5, -2.5]), np.float32(1.0), np.int8(0))
>>> y, rtl.last_run.cycles                                 # doctest: +SKIP
(array([ 2, -2], dtype=int8), 80)

:class:`RTL` has the methods and signatures of :func:`qaccel.quantize_linear`,
:func:`qaccel.dequantize_linear`, :func:`qaccel.dml_quantize_linear` and
:func:`qaccel.matmul_nbits` (on the MatMulNBits engine v2, see :meth:`RTL.matmul_nbits`). A
Q / DQ call is validated by the golden model (same exceptions, same output dtype and shape),
turned into jobs for the Quantize or Dequantize unit (:mod:`qaccel.sim.jobs`), simulated, and
the output array is decoded from the ``y`` beats the simulated unit produced. The record of the
last call is :attr:`RTL.last_run` (:class:`RunRecord`).

A layout needing more scales than the unit's table holds (``config.table_depth``) is split
into boxes of ``x`` whose scales fit: along the outermost dimensions first, and along an
inner axis (in whole blocks) only when one slice of the outer dimensions needs too many.
"""

from __future__ import annotations

import importlib
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["HARNESSES", "RTL", "RTLMismatchError", "RunRecord", "example_call"]

#: How jobs reach the simulator: ``"auto"`` (the C++ stream harness on Verilator when it is
#: available, else cocotb), ``"cocotb"`` or ``"stream"`` (the C++ harness, Verilator only).
HARNESSES = ("auto", "cocotb", "stream")
_SIMULATORS = ("verilator", "icarus")
_UNIT_OF = {"quantize": "quantize", "dml": "quantize", "dequantize": "dequantize"}
#: With a progress report, the stream harness runs jobs in batches of at least this many beats.
STREAM_BATCH_BEATS = 1 << 18
#: Units by (kind, AccelConfig), shared by the RTL instances of one configuration.
_UNITS: dict = {}
#: Stream harness builds by ``id(unit)`` (units in :data:`_UNITS` live as long as the process).
_STREAM_SIMS: dict = {}


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
        (:attr:`qaccel.rtl.elementwise.Elementwise.load_cycles`), and the start strobe).
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
            f"{self.beats_per_cycle:.3f} beats/cycle",
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
    Each call raises what the golden function raises for invalid arguments, and ValueError
    naming the configuration field when the instance does not carry a type the call needs.
    Simulator failures raise :mod:`qaccel.sim.runner`'s exceptions
    (:exc:`~qaccel.sim.runner.SimulatorNotFoundError`, :exc:`~qaccel.sim.runner.BuildError`,
    :exc:`~qaccel.sim.runner.SimulationError` and its subclasses).
    """

    def __init__(self, config=None, simulator: str = "verilator", *, check: bool = False,
                 harness: str = "auto", idle: float = 0.0, backpressure: float = 0.0,
                 seed: int = 1, progress: Callable[[int, int], None] | None = None):
        from qaccel.model.config import AccelConfig
        from qaccel.model.validate import check_int

        if config is None:
            config = AccelConfig()
        if not isinstance(config, AccelConfig):
            raise TypeError(f"config must be an AccelConfig, not {config!r}")
        if simulator not in _SIMULATORS:
            raise ValueError(f"simulator must be one of {', '.join(_SIMULATORS)}, "
                             f"not {simulator!r}")
        if harness not in HARNESSES:
            raise ValueError(f"harness must be one of {', '.join(HARNESSES)}, not {harness!r}")
        if harness == "stream" and simulator != "verilator":
            raise ValueError(f"harness 'stream' runs on Verilator only, not {simulator!r}")
        if not isinstance(check, bool):
            raise TypeError(f"check must be a bool, not {check!r}")
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
        self._units: dict = {}

    def __repr__(self) -> str:
        return (f"RTL(lanes={self.config.lanes}, table_depth={self.config.table_depth}, "
                f"simulator={self.simulator!r}, slug={self.config.slug!r})")

    # -- the golden API -----------------------------------------------------------------------

    def quantize_linear(self, x, y_scale, y_zero_point=None, *, axis=1, block_size=0,
                        output_dtype=None, saturate=True, precision=None):
        """:func:`qaccel.quantize_linear` on the Quantize unit."""
        from qaccel.model.dtypes import dtype_name
        from qaccel.model.quant import check_quantize, quantize_linear
        from qaccel.sim.jobs import quantize_job

        t0 = time.perf_counter()
        kw = dict(axis=axis, block_size=block_size, output_dtype=output_dtype,
                  saturate=saturate, precision=precision)
        call = check_quantize(x, y_scale, y_zero_point, **kw)
        x, y_scale, layout = call.x, call.scale, call.layout
        # (validated: the scale's shape, or one element each; sim.jobs wants the same shape)
        zp = None if call.zero_point is None else call.zero_point.reshape(y_scale.shape)
        c = self.config
        self._carried("q_inputs", "x", x.dtype, c.q_inputs)
        self._carried("scales", "y_scale", y_scale.dtype, c.scales)
        self._carried("q_outputs", "output", call.out_dtype, c.q_outputs)
        self._carried("precisions", "division precision", call.division, c.precisions)
        if x.size == 0:
            return self._empty("quantize", call.shape, call.out_dtype, t0)
        unit = self._unit("quantize")
        label = f"Q {dtype_name(x.dtype)} -> {dtype_name(call.out_dtype)}"

        def job(box):
            s_box = self._onnx_scale_box(layout, box, axis, block_size)
            return quantize_job(unit, _sub(x, box), _sub(y_scale, s_box), _sub(zp, s_box),
                                **kw, label=f"{label} {box}", expect=False)

        jobs, boxes = self._plan(layout, job)
        out = self._execute("quantize", unit, jobs, boxes, call, t0)
        if self.check:
            _compare(out, quantize_linear(x, y_scale, call.zero_point, **kw), "quantize")
        return out

    def dequantize_linear(self, x, x_scale, x_zero_point=None, *, axis=1, block_size=0,
                          output_dtype=None):
        """:func:`qaccel.dequantize_linear` on the Dequantize unit."""
        from qaccel.model.dtypes import dtype_name
        from qaccel.model.quant import check_dequantize, dequantize_linear
        from qaccel.rtl.dequantize_lane import dq_scales
        from qaccel.sim.jobs import dequantize_job

        t0 = time.perf_counter()
        kw = dict(axis=axis, block_size=block_size, output_dtype=output_dtype)
        call = check_dequantize(x, x_scale, x_zero_point, **kw)
        x, x_scale, layout = call.x, call.scale, call.layout
        zp = None if call.zero_point is None else call.zero_point.reshape(x_scale.shape)
        c = self.config
        self._carried("dq_inputs", "x", x.dtype, c.dq_inputs)
        self._carried("scales", "x_scale", x_scale.dtype, dq_scales(c))
        self._carried("dq_outputs", "output", call.out_dtype, c.dq_outputs)
        if x.size == 0:
            return self._empty("dequantize", call.shape, call.out_dtype, t0)
        unit = self._unit("dequantize")
        label = f"DQ {dtype_name(x.dtype)} -> {dtype_name(call.out_dtype)}"

        def job(box):
            s_box = self._onnx_scale_box(layout, box, axis, block_size)
            return dequantize_job(unit, _sub(x, box), _sub(x_scale, s_box), _sub(zp, s_box),
                                  **kw, label=f"{label} {box}", expect=False)

        jobs, boxes = self._plan(layout, job)
        out = self._execute("dequantize", unit, jobs, boxes, call, t0)
        if self.check:
            _compare(out, dequantize_linear(x, x_scale, call.zero_point, **kw), "dequantize")
        return out

    def dml_quantize_linear(self, input, scale, zero_point=None, *, output_dtype=np.int8):
        """:func:`qaccel.dml_quantize_linear` on the Quantize unit (float32 division)."""
        from qaccel.model.dml import check_dml, dml_quantize_linear
        from qaccel.model.dtypes import dtype_name
        from qaccel.sim.jobs import dml_job

        t0 = time.perf_counter()
        call = check_dml(input, scale, zero_point, output_dtype=output_dtype)
        # scale and zero point broadcast to their common shape
        x, scale, zp, layout = call.x, call.scale, call.zero_point, call.layout
        c = self.config
        self._carried("q_inputs", "input", x.dtype, c.q_inputs)
        self._carried("scales", "scale", scale.dtype, c.scales)
        self._carried("q_outputs", "output", call.out_dtype, c.q_outputs)
        self._carried("precisions", "division precision", call.division, c.precisions)
        if x.size == 0:
            return self._empty("dml", call.shape, call.out_dtype, t0)
        unit = self._unit("dml")
        label = f"DML {dtype_name(x.dtype)} -> {dtype_name(call.out_dtype)}"

        def job(box):
            return dml_job(unit, _sub(x, box), _sub(scale, _broadcast_box(scale.shape, box)),
                           None if zp is None else _sub(zp, _broadcast_box(zp.shape, box)),
                           output_dtype=output_dtype, label=f"{label} {box}", expect=False)

        jobs, boxes = self._plan(layout, job)
        out = self._execute("dml", unit, jobs, boxes, call, t0)
        if self.check:
            _compare(out, dml_quantize_linear(x, scale, zp, output_dtype=output_dtype), "dml")
        return out

    def matmul_nbits(self, A, B, scales, zero_points=None, g_idx=None, bias=None, *, K, N,
                     bits, block_size, accuracy_level=0):
        """:func:`qaccel.matmul_nbits` on the MatMulNBits engine, arguments in ONNX Runtime's
        layout (the host side repacks them, :mod:`qaccel.sim.nbits_jobs`).

        * The int8 path (accuracy_level 4, integer or no zero points, no g_idx) runs on the
          v2 engine (:class:`~qaccel.rtl.matmul_nbits_v2.MatMulNBitsV2`, one job: every row
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
        rows gives the golden model's empty result, simulating nothing. Raises what
        ``matmul_nbits`` raises; ValueError naming accuracy_level, the zero points and g_idx
        for a float-path call without ``config.float_path``; ValueError for what the engine
        does not take (:func:`~qaccel.sim.nbits_jobs.nbits_job_v2`: block_size outside
        ``[16, config.max_block_size]``, K above ``config.max_k``, an odd ``config.pe``);
        with ``check``,
        :exc:`RTLMismatchError` naming the first differing row, column and both codes.
        """
        from qaccel.model import nbits_kernels as _k
        from qaccel.model.config import ZERO_POINTS, int8_path
        from qaccel.model.nbits import _check_A, _Op, matmul_nbits
        from qaccel.model.validate import check_int

        t0 = time.perf_counter()
        level = check_int("accuracy_level", accuracy_level, 0, 4)
        a = _check_A(A, check_int("K", K, 1))
        op = _Op(B, scales, zero_points, g_idx, K=K, N=N, bits=bits, block_size=block_size,
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
        if a.size == 0:
            # (the golden model checks bias too; with no rows it computes nothing)
            want = matmul_nbits(A, B, scales, zero_points, g_idx, bias, K=K, N=N, bits=bits,
                                block_size=block_size, accuracy_level=level)
            return self._empty("matmul_nbits", want.shape, want.dtype, t0)
        args = (A, B, scales, zero_points, g_idx, bias)
        kwargs = dict(K=K, N=N, bits=bits, block_size=block_size, accuracy_level=level)
        return self._matmul_nbits_v2(*args, **kwargs, t0=t0)

    def _matmul_nbits_v2(self, *args, t0: float, **kwargs) -> np.ndarray:
        """A call on the v2 engine (see :meth:`matmul_nbits`)."""
        from qaccel.sim.nbits_jobs import is_nan_code, nbits_job_v2, unpack_y_v2

        if kwargs["bits"] not in self.config.nbits:
            raise ValueError(f"bits {kwargs['bits']} is not carried by this engine "
                             f"(config.nbits {self.config.nbits})")
        # the engine's model only runs for the check
        job = nbits_job_v2(*args, **kwargs, config=self.config, expect=self.check)
        engine = self._nbits_engine()
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

    def _nbits_engine(self):
        """The configuration's v2 MatMulNBits engine, created on first use and shared by the
        RTL instances of that configuration (so are its builds)."""
        key = ("matmul_nbits_v2", self.config)
        engine = _UNITS.get(key)
        if engine is None:
            from qaccel.rtl.matmul_nbits_v2 import MatMulNBitsV2

            engine = _UNITS[key] = MatMulNBitsV2(self.config)
        return engine

    @staticmethod
    def _nbits_stream_sim(engine):
        """The engine's StreamSim, built (or found) on first use; returns (sim, built)."""
        from qaccel.sim.elementwise_sim import design_key
        from qaccel.sim.nbits_sim import NBITS_NAME
        from qaccel.sim.streamsim import StreamSim

        sim = _STREAM_SIMS.get(id(engine))
        if sim is not None:
            return sim, False
        sim = _STREAM_SIMS[id(engine)] = StreamSim(engine, name=NBITS_NAME,
                                                   design_key=design_key(engine))
        return sim, sim.built

    def _run_nbits_v2_stream(self, engine, job):
        from qaccel.sim.streamsim import Segment

        sim, built = self._nbits_stream_sim(engine)
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
        from qaccel.model.dtypes import dtype_name

        name = dtype_name(dtype)
        if name not in carried:
            raise ValueError(f"this RTL configuration does not carry {what} type {name} "
                             f"(config.{field} = {carried})")

    def _unit(self, op: str):
        """The unit of ``op``, created on first use; instances of one configuration share it
        (and so its builds, which the simulation layers cache per unit object)."""
        kind = _UNIT_OF[op]
        unit = self._units.get(kind)
        if unit is None:
            unit = _UNITS.get((kind, self.config))
            if unit is None:
                if kind == "quantize":
                    from qaccel.rtl.quantize import Quantize as cls
                else:
                    from qaccel.rtl.dequantize import Dequantize as cls
                unit = _UNITS[kind, self.config] = cls(self.config)
            self._units[kind] = unit
        return unit

    def _plan(self, layout, job) -> tuple[list, list]:
        """Return the jobs (``job(box)`` for each box of ``x``, see :meth:`_boxes`) and the
        boxes. When a box's index registers do not fit ``config.size_width``, the boxes are
        made again with the inner dimensions bounded; ValueError naming the shape of ``x``
        if the unit still cannot take them."""
        boxes = self._boxes(layout)
        try:
            return [job(b) for b in boxes], boxes
        except ValueError as e:
            if "size_width" not in str(e):
                raise
        boxes = self._boxes(layout, inner_limit=(1 << self.config.size_width) - 1)
        try:
            return [job(b) for b in boxes], boxes
        except ValueError as e:
            raise ValueError(f"x of shape {layout.x_shape} ({layout.kind} scales) does not fit "
                             f"this RTL configuration: {e}") from e

    def _boxes(self, layout, inner_limit: int | None = None) -> list[tuple[slice, ...]]:
        """Split ``x`` into boxes whose scales fit the table and whose element counts fit
        the counter: whole dimensions from the innermost out while they fit, then the largest
        chunk of the next one (in whole blocks), then as much of the outer ones as still fits
        (all of those that use no scales). With ``inner_limit``, the dimensions inside a box's
        outermost one hold at most that many elements (the index generator's ``size_width``)."""
        c = self.config
        shape = layout.x_shape
        if not shape:
            return [()]
        budget, max_count = c.table_depth, (1 << c.count_width) - 1
        chunks = [1] * len(shape)
        scales = count = 1
        outermost = False               # (inner_limit) the last dimension is the box's outermost
        for d in reversed(range(len(shape))):
            if outermost:
                break
            n, b, used = shape[d], layout.blocks[d], layout.strides[d] != 0
            chunk = min(n, (budget // scales) * b) if used else n
            chunk = max(1, min(chunk, max_count // count))
            if used and b < chunk < n:
                chunk -= chunk % b
            if used and chunk < min(b, n):
                raise ValueError(f"x of shape {shape}: one block of {b} elements along "
                                 f"dimension {d} exceeds the unit's element counter "
                                 f"(config.count_width = {c.count_width})")
            chunks[d] = chunk
            outermost = inner_limit is not None and count * chunk > inner_limit
            scales *= -(-chunk // b) if used else 1
            count *= chunk
        starts = [range(0, n, k) for n, k in zip(shape, chunks, strict=True)]
        return [tuple(slice(a, min(a + k, n)) for a, k, n in zip(s, chunks, shape, strict=True))
                for s in itertools.product(*starts)]

    @staticmethod
    def _onnx_scale_box(layout, box, axis: int, block_size: int) -> tuple[slice, ...]:
        """The slice of an ONNX Q/DQ scale (and zero point) that the ``x`` box uses."""
        if layout.kind == "per-tensor":
            return ()
        ax = axis % len(layout.x_shape)
        if layout.kind == "per-axis":
            return (box[ax],)
        s = box[ax]
        return tuple(slice(s.start // block_size, -(-s.stop // block_size)) if d == ax else
                     box[d] for d in range(len(box)))

    def _empty(self, op: str, shape, dtype, t0: float) -> np.ndarray:
        """The output of a call without elements: nothing simulated."""
        self.last_run = RunRecord(op, self.simulator, "none", 0, 0, 0, 0, 0, None,
                                  time.perf_counter() - t0, True)
        return np.empty(shape, dtype)

    def _harness(self) -> str:
        if self.harness != "auto":
            return self.harness
        if self.simulator == "verilator" and _stream_harness() is not None:
            return "stream"
        return "cocotb"

    def _execute(self, op: str, unit, jobs, boxes, call, t0: float) -> np.ndarray:
        """Simulate ``jobs`` (which carry no expected beats: what comes back is the unit's own
        answer), decode the ``y`` beats into the output array of ``call``, record the run."""
        from qaccel.sim.jobs import lane_widths, unpack_output

        lanes = self.config.lanes
        width = lane_widths(unit)[1]
        harness = self._harness()
        name = _UNIT_OF[op]
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
        from qaccel.sim.elementwise_sim import elementwise_sim

        run = _stream_harness()
        if run is None:
            raise RuntimeError("the C++ stream harness (qaccel.sim.streamsim) is not available")
        built = False
        if id(unit) not in _STREAM_SIMS:       # the first run of this unit in the process
            sim = _STREAM_SIMS[id(unit)] = elementwise_sim(unit, name=name)
            built = sim.built
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


def _sub(a: np.ndarray | None, box: tuple[slice, ...]) -> np.ndarray | None:
    """``a[box]`` as an array (``a`` itself for the empty box, None for None)."""
    if a is None or not box:
        return a
    return a[box]


def _broadcast_box(shape, box) -> tuple[slice, ...]:
    """The slice of a DirectML broadcast parameter that the ``x`` box uses."""
    return tuple(slice(None) if n == 1 else s for n, s in zip(shape, box, strict=True))


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


# ---------------------------------------------------------------------------------------------
# The C++ stream harness (qaccel.sim.streamsim), when present



def _stream_harness():
    """Return ``qaccel.sim.elementwise_sim.run_elementwise_fast`` or None if it is not there."""
    try:
        module = importlib.import_module("qaccel.sim.elementwise_sim")
    except ImportError:
        return None
    return getattr(module, "run_elementwise_fast", None)


# ---------------------------------------------------------------------------------------------
# Example inputs (the CLI and the demo)


def example_call(op: str, shape, *, dtype=None, scale_dtype=None, output_dtype=None,
                 axis: int | None = None, block_size: int = 0, zero_point: bool = True,
                 seed: int = 0) -> tuple[tuple, dict]:
    """Return ``(args, kwargs)`` of a realistic ``op`` call on random data.

    ``op`` is ``"quantize"``, ``"dequantize"`` or ``"dml"``; types are dtypes or qaccel's
    type names (``"int4"``, ``"float8e4m3fn"``, ``"bfloat16"``, ...). Granularity:
    per-tensor without ``axis``, per-axis with it, blocked with ``block_size`` too (DirectML:
    the scale varies along ``axis``, size 1 elsewhere). Quantize scales come from the largest
    magnitude their elements have (``amax / (range / 2)``), zero points are random and small;
    dequantize inputs are random codes. Defaults: float32 data and scales, int8 output
    (dequantize: int8 input, the scale's float type out; float32 for a float8e8m0 scale).
    """
    from qaccel.model.dtypes import FLOAT_TYPES, QTYPES, dtype_name
    from qaccel.model.indexing import broadcast_layout, scale_layout

    if op not in _UNIT_OF:
        raise ValueError(f"op must be one of {', '.join(_UNIT_OF)}, not {op!r}")
    shape = tuple(int(n) for n in shape)
    rng = np.random.default_rng(seed)
    if axis is None and block_size:
        raise ValueError("block_size needs an axis")
    ax = None if axis is None else axis % len(shape)
    if op == "dml":
        s_shape = tuple(n if d == ax else 1 for d, n in enumerate(shape))
    elif ax is None:
        s_shape = ()
    elif block_size:
        s_shape = tuple(-(-n // block_size) if d == ax else n for d, n in enumerate(shape))
    else:
        s_shape = (shape[ax],)
    layout = (broadcast_layout(shape, s_shape) if op == "dml" else
              scale_layout(shape, s_shape, ax or 0, block_size))
    idx = layout.indices().reshape(-1)
    n_scales = max(1, math.prod(s_shape))
    kwargs: dict = {}
    if ax is not None and op != "dml":
        kwargs = {"axis": ax, "block_size": block_size}

    if op == "dequantize":
        q = QTYPES[dtype_name(_dtype(dtype)) if dtype is not None else "int8"]
        if q.is_int:
            x = rng.integers(q.qmin, q.qmax, size=shape, endpoint=True).astype(q.dtype)
            zp = None
            if zero_point:
                zp = (rng.integers(q.qmin, q.qmax, size=s_shape, endpoint=True) // 8)
                zp = zp.astype(q.dtype)
        else:
            x = (rng.standard_normal(shape) * (q.qmax / 8)).astype(q.dtype)
            zp = None
        s_dt = _dtype(scale_dtype) if scale_dtype is not None else FLOAT_TYPES["float32"]
        scale = (0.01 + 0.04 * rng.random(s_shape)).astype(s_dt)
        if output_dtype is None and s_dt not in FLOAT_TYPES.values():
            output_dtype = "float32"            # a float8e8m0 scale is not an output type
        if output_dtype is not None:
            kwargs["output_dtype"] = _dtype(output_dtype)
        return (x, scale, zp), kwargs

    x_dt = _dtype(dtype) if dtype is not None else np.dtype(np.float32)
    if x_dt == np.int32:
        x = rng.integers(-1000, 1000, size=shape, endpoint=True).astype(np.int32)
    else:
        x = rng.standard_normal(shape).astype(x_dt)
    s_dt = (_dtype(scale_dtype) if scale_dtype is not None else
            x_dt if op == "dml" and x_dt != np.int32 else np.dtype(np.float32))
    out = QTYPES[dtype_name(_dtype(output_dtype)) if output_dtype is not None else "int8"]
    amax = np.zeros(n_scales)
    np.maximum.at(amax, idx, np.abs(x.astype(np.float64)).reshape(-1))
    half = (out.qmax - out.qmin) / 2 if out.is_int else out.qmax
    scale = np.where(amax > 0, amax / half, 1.0).reshape(s_shape)
    if s_dt == np.int32:
        scale = np.maximum(1, np.rint(scale))
    scale = scale.astype(s_dt)
    zp = None
    if zero_point and out.is_int:
        mid = 0 if out.signed else int(out.qmax + 1) // 2
        spread = max(1, int(out.qmax - out.qmin) // 16)
        zp = (mid + rng.integers(-spread, spread, size=s_shape, endpoint=True)).astype(out.dtype)
    kwargs["output_dtype"] = out.dtype
    return (x, scale, zp), kwargs


def _dtype(value) -> np.dtype:
    """A dtype from a dtype or a qaccel type name (``QTYPES`` / ``FLOAT_TYPES`` /
    ``SCALE_TYPES`` keys)."""
    from qaccel.model.dtypes import FLOAT_TYPES, QTYPES, SCALE_TYPES

    if isinstance(value, str):
        if value in QTYPES:
            return QTYPES[value].dtype
        if value in FLOAT_TYPES:
            return FLOAT_TYPES[value]
        if value in SCALE_TYPES:
            return SCALE_TYPES[value]
    try:
        return np.dtype(value)
    except TypeError:
        raise TypeError(f"not a type: {value!r} (give a dtype or one of "
                        f"{', '.join([*QTYPES, *FLOAT_TYPES, *SCALE_TYPES])})") from None
