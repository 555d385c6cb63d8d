"""The stream shell shared by the Quantize and Dequantize units: scale-index generator, scale and
zero-point table, ``lanes`` element datapaths, output FIFO with credit-based flow control."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import SimpleNamespace

from amaranth.hdl import Cat, Module, Shape, Signal, Value, unsigned
from amaranth.lib import data, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.config import AccelConfig
from qaccel.model.validate import check_bool
from qaccel.rtl.arith.ecp5 import DP16KD_DEPTH, DP16KD_WIDTH, bram_column_width, dp16kd_sdp
from qaccel.rtl.arith.pipeline import delay, line
from qaccel.rtl.elementwise.scale_index import ScaleIndex

__all__ = ["Elementwise", "ElementwiseTiming"]

#: Cycles from an accepted beat to the lanes' inputs: the table's synchronous read, then a
#: register on the read data (the block RAM's output is slow; decoding it in the same cycle
#: limited Fmax).
_TABLE_STAGES = 2


@dataclass(frozen=True)
class ElementwiseTiming:
    """The cycles of an :class:`Elementwise` unit (its attributes of the same names), for one
    configuration: :meth:`Elementwise.timing` gives them without building the unit."""

    #: Cycles from an ``x`` transfer to its ``y`` beat being offered (no back-pressure).
    latency: int
    #: Cycles from ``start`` until the first ``x`` beat can be accepted.
    start_latency: int
    #: Cycles per table write at most.
    table_interval: int
    #: Latency of one lane's datapath.
    lane_latency: int

    def load_cycles(self, entries: int) -> int:
        """Cycles to write ``entries`` table entries and pulse ``start``, the writes back to
        back as ``table.ready`` allows."""
        return (entries - 1) * self.table_interval + 2 if entries else 1


def _compose(lane_latency: int, index_latency: int, prep) -> ElementwiseTiming:
    """The unit's cycles from its parts': the lane's latency, the index generator's, and the
    table preparation's ``latency`` and ``interval`` (``prep``; None without one)."""
    return ElementwiseTiming(
        latency=_TABLE_STAGES + lane_latency + 2,
        # the first beat waits until the last entry is in
        start_latency=max(index_latency, prep.latency) if prep else index_latency,
        table_interval=prep.interval if prep else 1,
        lane_latency=lane_latency)


def _check_config(config) -> AccelConfig:
    """``config``, or ``AccelConfig()`` for None; TypeError naming it otherwise."""
    if config is None:
        return AccelConfig()
    if not isinstance(config, AccelConfig):
        raise TypeError(f"config must be an AccelConfig, not {config!r}")
    return config


@functools.lru_cache(maxsize=256)
def _planned(cls: type, config: AccelConfig) -> ElementwiseTiming:
    """:meth:`Elementwise.timing` (cached: the configuration is hashable)."""
    plan = getattr(cls.lane_class, "plan", None)
    if plan is None:
        raise TypeError(f"{cls.__name__}.timing needs a lane_class with a plan(config) "
                        f"method, not {cls.lane_class!r}")
    lane = plan(config)
    index = ScaleIndex.latency_for(lanes=config.lanes, max_dims=config.max_dims)
    return _compose(lane.latency, index, lane.prep)


class Elementwise(wiring.Component):
    """Apply a per-element datapath (a *lane*) to a stream of ``lanes`` elements per beat, each
    element with its own scale and zero point from a table.

    Subclasses set :attr:`lane_class`: a component taking an
    :class:`~qaccel.model.config.AccelConfig` (and ``ecp5``), with members ``regs``, ``x``,
    ``scale``, ``zero_point`` (inputs) and ``y`` (output), no handshake, and a fixed
    ``latency``; for :meth:`timing`, a classmethod ``plan(config)`` whose result has the
    lane's ``latency`` and ``prep`` (the :meth:`ScalePrep.timing_for
    <qaccel.rtl.elementwise.scale_prep.ScalePrep.timing_for>` of its ``scale_prep``, or
    None).

    A job:

    1. set ``regs`` (the lane's registers and the index generator's ``size``, ``stride``,
       ``block``, ``count``; see :class:`~qaccel.rtl.elementwise.scale_index.ScaleIndex` and
       :meth:`index_registers`);
    2. write the scale / zero-point codes to the table through ``table`` (one entry per
       transfer, at ``payload.addr``), any time the unit is idle, and pulse ``start``.
       ``table`` is always ready, unless the lane prepares its entries as they are written
       (the Quantize lane with ``AccelConfig.reciprocal_units``: a
       :class:`~qaccel.rtl.elementwise.scale_prep.ScalePrep` decodes each scale with the format in
       ``regs`` and computes its reciprocal), which takes a write every
       :attr:`table_interval` cycles and admits the first ``x`` beat once the last entry is
       in (:attr:`start_latency`);
    3. stream the ``count`` elements in C order on ``x``, ``lanes`` per beat (the last beat
       padded with any value), and read the results from ``y`` in the same order, with
       ``last`` on the final beat. Lanes past ``count`` in the last beat are unspecified.

    ``regs`` must hold from the first table write until ``busy`` falls. A synchronous reset
    aborts a job
    cleanly (the table keeps its contents).

    Flow control: an ``x`` beat is accepted when the index generator has its indices and the
    output FIFO has room for every beat in flight (a credit counter), so back-pressure on
    ``y`` never drops or duplicates a beat, and with ``y.ready`` held high one beat per cycle
    is sustained. Latency from an ``x`` transfer to its ``y`` beat being offered is
    :attr:`latency` cycles: two for the table read (registered), the lane's latency, and the
    FIFO's two.

    Parameters
    ----------
    config : :class:`~qaccel.model.config.AccelConfig`
    ecp5 : :class:`bool`
        Build a table of at most 512 entries from DP16KD instances
        (:func:`~qaccel.rtl.arith.ecp5.dp16kd_sdp`) for synthesis: the read data reaches its
        register without the read-during-write bypass of an inferred block RAM; and the lanes'
        multipliers as MULT18X18D instances with their own registers. Simulate with False (the
        default), the same cycles.

    Members
    -------
    regs : :py:`In(regs_layout)`
        ``lane`` (the lane's register layout), ``size``, ``stride``, ``block``, ``count``.
    start : :py:`In(1)`
        Start a job (index generator from element 0).
    table : :py:`In(stream.Signature(table_layout))`
        Table writes: ``addr``, ``scale`` and ``zero_point`` codes.
    x : :py:`In(stream.Signature(data.ArrayLayout(unsigned(x width), lanes)))`
    y : :py:`Out(stream.Signature(StructLayout({"data": ArrayLayout(...), "last": 1})))`
    busy : :py:`Out(1)`
        A job is running (indices left, or beats in flight or in the FIFO).
    """

    lane_class: type = None
    #: The part of the AccelConfig this unit is built from (its builds are keyed by it).
    config_part = "elementwise"

    def __init__(self, config: AccelConfig | None = None, *, ecp5: bool = False):
        config = _check_config(config)
        self._ecp5 = check_bool("ecp5", ecp5)
        self._config = c = config
        self._lanes = [self.lane_class(c, ecp5=ecp5) for _ in range(c.lanes)]
        lane = self._lanes[0]
        members = lane.signature.members
        self._addr_width = (c.table_depth - 1).bit_length()
        prep = getattr(lane, "scale_prep", None)
        self._prep = prep(self._addr_width) if prep else None
        self._index = ScaleIndex(lanes=c.lanes, max_dims=c.max_dims, size_width=c.size_width,
                                 index_width=self._addr_width, count_width=c.count_width)
        self._fifo_depth = 1 << (lane.latency + 5).bit_length()
        self._timing = _compose(lane.latency, self._index.latency, self._prep)
        if getattr(self.lane_class, "plan", None) is not None:
            planned = type(self).timing(c)
            if self._timing != planned:
                raise RuntimeError(f"internal error: {type(self).__name__} built with "
                                   f"{self._timing}, planned {planned}")
        self._y_data = data.ArrayLayout(members["y"].shape, c.lanes)
        index_sig = self._index.signature.members
        super().__init__({
            "regs": In(data.StructLayout({
                "lane": members["regs"].shape,
                "size": index_sig["size"].shape,
                "stride": index_sig["stride"].shape,
                "block": index_sig["block"].shape,
                "count": index_sig["count"].shape,
            })),
            "start": In(1),
            "table": In(stream.Signature(self._prep.i.payload.shape() if self._prep else
                                         data.StructLayout({
                                             "addr": unsigned(self._addr_width),
                                             "scale": members["scale"].shape,
                                             "zero_point": members["zero_point"].shape}))),
            "x": In(stream.Signature(data.ArrayLayout(members["x"].shape, c.lanes))),
            "y": Out(stream.Signature(data.StructLayout({
                "data": self._y_data, "last": unsigned(1)}))),
            "busy": Out(1),
        })

    @property
    def config(self) -> AccelConfig:
        """The configuration the unit was built from."""
        return self._config

    @classmethod
    def timing(cls, config: AccelConfig | None = None) -> ElementwiseTiming:
        """The cycles of a unit built from ``config`` (None: ``AccelConfig()``), without
        building it or any Amaranth object: from the functions a built unit's own figures
        come from (its constructor checks that they agree). ``ecp5`` builds have the same
        cycles. Cached per class and configuration.

        Raises TypeError if ``config`` is not an :class:`~qaccel.model.config.AccelConfig`
        (or :attr:`lane_class` has no ``plan``), and what the lane's ``plan`` raises for a
        configuration it cannot carry (ValueError: a Dequantize unit without a float scale
        type)."""
        return _planned(cls, _check_config(config))

    @property
    def lane_latency(self) -> int:
        """Latency of one lane's datapath."""
        return self._timing.lane_latency

    @property
    def latency(self) -> int:
        """Cycles from an ``x`` transfer to its ``y`` beat being offered (no back-pressure)."""
        return self._timing.latency

    @property
    def start_latency(self) -> int:
        """Cycles from ``start`` until the first ``x`` beat can be accepted, ``start`` coming
        in the cycle after the last table write: the index generator's latency, or the table
        preparation's if that is longer (the first beat waits until the last entry is in)."""
        return self._timing.start_latency

    @property
    def table_interval(self) -> int:
        """Cycles per table write at most (1; more when the entries are prepared as they are
        written: :attr:`qaccel.rtl.elementwise.scale_prep.ScalePrep.interval`)."""
        return self._timing.table_interval

    def load_cycles(self, entries: int) -> int:
        """Cycles to write ``entries`` table entries and pulse ``start``, the writes back to
        back as ``table.ready`` allows."""
        return self._timing.load_cycles(entries)

    @property
    def fifo_depth(self) -> int:
        """Beats the output FIFO holds (the credit limit)."""
        return self._fifo_depth

    def index_registers(self, layout) -> dict:
        """Return ``size``, ``stride``, ``block`` and ``count`` for a
        :class:`~qaccel.model.indexing.ScaleLayout` (see :meth:`ScaleIndex.registers`)."""
        return self._index.registers(layout)

    def elaborate(self, platform):
        m = Module()
        c = self._config
        m.submodules.index = index = self._index
        for k, lane in enumerate(self._lanes):
            m.submodules[f"lane{k}"] = lane
        m.submodules.fifo = out_fifo = fifo.SyncFIFOBuffered(
            width=self.y.payload.shape().size, depth=self._fifo_depth)

        # -- configuration -------------------------------------------------------------------
        m.d.comb += [index.size.eq(self.regs.size), index.stride.eq(self.regs.stride),
                     index.block.eq(self.regs.block), index.count.eq(self.regs.count),
                     index.start.eq(self.start)]
        for lane in self._lanes:
            m.d.comb += lane.regs.eq(self.regs.lane)

        # -- table: one write port (the scale codes, or the prepared entries), a read port per
        # lane
        prep = self._prep
        if prep is not None:
            m.submodules.prep = prep
            entry = prep.entry_layout
        else:
            entry = data.StructLayout({"scale": self.table.payload.scale.shape(),
                                       "zero_point": self.table.payload.zero_point.shape()})
        # the table in columns as wide as one block RAM holds at this depth (no LUTs after
        # the read data); one write port, a read port per lane
        bits = Shape.cast(entry).width
        # with ``ecp5`` and at most 512 entries: DP16KD instances, 36-bit columns, one per
        # column and lane (a read port each), without the read-during-write bypass Yosys puts
        # after an inferred block RAM's read data (no read ever meets a write: the table is
        # written while the unit is idle, or before ``credit`` admits the first beat)
        cells = self._ecp5 and c.table_depth <= DP16KD_DEPTH
        col = DP16KD_WIDTH if cells else bram_column_width(c.table_depth)
        spans = [(lo, min(col, bits - lo)) for lo in range(0, bits, col)]
        wr = SimpleNamespace(addr=Signal(self._addr_width, name="table_w_addr"),
                             data=Signal(entry, name="table_w_data"),
                             en=Signal(name="table_w_en"))
        columns = []
        for j, (lo, width) in enumerate(spans):
            if cells:
                continue
            mem = memory.Memory(shape=unsigned(width), depth=c.table_depth, init=[])
            m.submodules[f"table{j}"] = mem
            port = mem.write_port()
            m.d.comb += [port.addr.eq(wr.addr), port.en.eq(wr.en),
                         port.data.eq(Value.cast(wr.data)[lo:lo + width])]
            columns.append((mem, port))
        if prep is not None:
            wiring.connect(m, wiring.flipped(self.table), prep.i)
            m.d.comb += [wr.addr.eq(prep.w_addr), wr.data.eq(prep.w_data), wr.en.eq(prep.w_en)]
            # lane 0's dividend decoder decodes the scales (no x beat enters while prep.busy)
            lane0 = self._lanes[0]
            m.d.comb += [lane0.prep_sel.eq(prep.busy), lane0.prep_code.eq(prep.dec_code),
                         prep.dec_o.eq(lane0.prep_o)]
        else:
            m.d.comb += [self.table.ready.eq(1), wr.addr.eq(self.table.payload.addr),
                         wr.data.scale.eq(self.table.payload.scale),
                         wr.data.zero_point.eq(self.table.payload.zero_point),
                         wr.en.eq(self.table.valid)]
        # (prepared entries are all in before the first read: ``credit`` waits for them; a
        # read port that is not transparent maps onto the block RAM's output register)
        reads = []
        for k in range(len(self._lanes)):
            if cells:
                ports = []
                for j, (lo, width) in enumerate(spans):
                    cw, cr = dp16kd_sdp(m, depth=c.table_depth, width=width,
                                        name=f"table{j}_lane{k}")
                    m.d.comb += [cw.addr.eq(wr.addr), cw.en.eq(wr.en),
                                 cw.data.eq(Value.cast(wr.data)[lo:lo + width])]
                    ports.append(cr)
            else:
                ports = [mem.read_port(transparent_for=() if prep else (port,))
                         for mem, port in columns]
            rd = SimpleNamespace(addr=Signal(self._addr_width, name=f"table_r{k}_addr"),
                                 en=Signal(init=1, name=f"table_r{k}_en"),
                                 data=Signal(entry, name=f"table_r{k}_data"))
            m.d.comb += [Value.cast(rd.data).eq(Cat(*(p.data for p in ports)))]
            m.d.comb += [p.addr.eq(rd.addr) for p in ports] + [p.en.eq(rd.en) for p in ports]
            reads.append(rd)

        # -- admission: indices and data together, within the credit ---------------------------
        reserved = Signal(range(self._fifo_depth + 1))   # beats in flight or in the FIFO
        credit = Signal()           # room in the FIFO, and the table's entries all written
        m.d.comb += credit.eq((reserved < self._fifo_depth) & ~(prep.busy if prep else 0))
        fire = Signal()
        m.d.comb += [
            self.x.ready.eq(index.o.valid & credit),
            index.o.ready.eq(self.x.valid & credit),
            fire.eq(self.x.valid & index.o.valid & credit),
        ]
        # the table is read ``scale_delay`` cycles after the beat is taken (when the lane
        # wants its scales); the pipeline never stalls, so the addresses run through a line,
        # and the table is read every cycle (no enable in the block RAM's output path). When
        # the lane wants its scales later than the beat, the table is read a cycle earlier and
        # its data registered twice: the block RAM's slow clock-to-out (5.6-5.8 ns on ECP5
        # speed 6) then ends at a register the placer puts beside it, not across the part
        scale_delay = getattr(self._lanes[0], "scale_delay", 0)
        read_regs = 2 if scale_delay else 1
        addrs = line(m, Value.cast(index.o.payload.index), scale_delay + 1 - read_regs,
                     "read_addr")
        for k, rd in enumerate(reads):
            m.d.comb += rd.addr.eq(addrs[k * self._addr_width:(k + 1) * self._addr_width])
            if prep is None:
                m.d.comb += rd.en.eq(fire)

        # -- stages 1-2: table read, registered read data; then the lanes ---------------------
        x1 = Signal.like(self.x.payload, reset_less=True)
        x2 = Signal.like(self.x.payload, reset_less=True)
        depth = _TABLE_STAGES + self.lane_latency
        valid = Signal(depth)                           # a shift register of valid bits
        last = Signal(depth)
        with m.If(fire):
            m.d.sync += x1.eq(self.x.payload)
        m.d.sync += [x2.eq(x1), valid.eq((valid << 1) | fire),
                     last.eq((last << 1) | (fire & index.o.payload.last))]
        for k, (lane, rd) in enumerate(zip(self._lanes, reads, strict=True)):
            entry2 = delay(m, rd.data, read_regs, f"entry{k}")
            m.d.comb += [lane.x.eq(x2[k]), lane.scale.eq(entry2.scale),
                         lane.zero_point.eq(entry2.zero_point)]
            if prep is not None:
                m.d.comb += lane.recip.eq(entry2.recip)

        # -- output FIFO -----------------------------------------------------------------------
        result = Signal(self.y.payload.shape())
        for k, lane in enumerate(self._lanes):
            m.d.comb += result.data[k].eq(lane.y)
        m.d.comb += [result.last.eq(last[-1]),
                     out_fifo.w_data.eq(result), out_fifo.w_en.eq(valid[-1]),
                     self.y.payload.eq(out_fifo.r_data), self.y.valid.eq(out_fifo.r_rdy),
                     out_fifo.r_en.eq(self.y.ready)]
        done = self.y.valid & self.y.ready
        with m.If(fire & ~done):
            m.d.sync += reserved.eq(reserved + 1)
        with m.Elif(done & ~fire):
            m.d.sync += reserved.eq(reserved - 1)
        m.d.comb += self.busy.eq(index.busy | (reserved != 0) | (prep.busy if prep else 0))
        return m
