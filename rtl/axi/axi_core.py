"""A qaccel core behind AXI4-Lite control and byte-aligned AXI4-Stream data ports: the file
``qaccel verilog`` writes for each operator."""

from __future__ import annotations

from typing import Any

from amaranth.hdl import ClockDomain, Const, DomainRenamer, Module, Shape, Signal, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.config import AccelConfig
from qaccel.rtl.axi.axil_registers import AxiLiteRegisters, axil_ports
from qaccel.rtl.axi.regmap import OPS, RegisterMap, byte_fields, register_map, tdata_bytes

__all__ = ["AxiCore"]


class AxiCore(wiring.Component):
    """Core ``op`` (``quantize``, ``dequantize`` or ``matmul_nbits``) of ``config`` with
    AXI4-Lite control and AXI4-Stream data, one clock ``aclk`` and the synchronous,
    active-low reset ``aresetn`` (AMBA's convention).

    Ports:

    * ``s_axil_*``: AXI4-Lite slave (``addr_width`` address bits, 32-bit data), the
      registers of :func:`~qaccel.rtl.axi.regmap.register_map` (:attr:`regmap`);
    * ``irq``: the interrupt, high while an enabled ``IRQ_STATUS`` event is set (registered);
    * Quantize / Dequantize: ``s_axis_table`` (scale-table entries: ``addr``, ``scale``,
      ``zero_point``, each field starting on a byte), ``s_axis_x`` (``lanes`` input codes
      per beat, each lane in whole bytes, right-aligned), ``m_axis_y`` (the output packed as
      ONNX stores it, ``tkeep`` marking a last word's bytes, ``tlast`` on the job's last);
    * MatMulNBits: ``s_axis_a``, ``s_axis_w``, ``s_axis_s``, ``s_axis_b`` (the engine's
      streams, each field starting on a byte) and ``m_axis_y`` (``tlast`` on the job's
      last).

    Every ``tdata`` is a whole number of bytes; :meth:`describe` gives each field's byte
    offset. The stream cores are :class:`~qaccel.rtl.elementwise.axis_top.AxisTop` and
    :class:`~qaccel.rtl.nbits.matmul_nbits_axis.NBitsAxisTop`: latency and throughput are
    theirs (the first ``x`` beat is taken the cycle after ``CTRL.start`` is written at the
    earliest). Job and table registers, and the table stream, are held while ``busy``.
    """

    def __init__(self, op: str, config: AccelConfig | None = None, *, ecp5: bool = False,
                 addr_width: int = 12):
        if op not in OPS:
            raise ValueError(f"op must be one of {', '.join(OPS)}, not {op!r}")
        config = AccelConfig() if config is None else config
        if not isinstance(config, AccelConfig):
            raise TypeError(f"config must be an AccelConfig, not {config!r}")
        self._op, self._config = op, config
        if op == "matmul_nbits":
            from qaccel.rtl.nbits.matmul_nbits_axis import INPUTS, NBitsAxisTop

            self._inner = NBitsAxisTop(config, ecp5=ecp5)
            unit = self._inner.engine
            inputs = INPUTS
        else:
            from qaccel.rtl.elementwise.axis_top import AxisTop
            from qaccel.rtl.elementwise.dequantize import Dequantize
            from qaccel.rtl.elementwise.quantize import Quantize

            unit = (Quantize if op == "quantize" else Dequantize)(config, ecp5=ecp5)
            self._inner = AxisTop(unit, op=op)
            inputs = ("table", "x")
        self._map = register_map(op, config, unit=unit)
        self._bank = AxiLiteRegisters(self._map, addr_width=addr_width)
        members = unit.signature.members
        self._streams = {s: byte_fields(members[s].signature.members["payload"].shape)
                         for s in inputs}
        ports = {"aclk": In(1), "aresetn": In(1), **axil_ports("s_axil", addr_width),
                 "irq": Out(1)}
        for s, fields in self._streams.items():
            ports |= {f"s_axis_{s}_tdata": In(unsigned(8 * tdata_bytes(fields))),
                      f"s_axis_{s}_tvalid": In(1), f"s_axis_{s}_tready": Out(1)}
        y = self._inner.signature.members
        ports["m_axis_y_tdata"] = Out(y["m_axis_y_tdata"].shape)
        if "m_axis_y_tkeep" in y:
            ports["m_axis_y_tkeep"] = Out(y["m_axis_y_tkeep"].shape)
        ports |= {"m_axis_y_tlast": Out(1), "m_axis_y_tvalid": Out(1), "m_axis_y_tready": In(1)}
        super().__init__(ports)

    @property
    def regmap(self) -> RegisterMap:
        return self._map

    @property
    def op(self) -> str:
        return self._op

    @property
    def inner(self):
        """The stream core (AxisTop or NBitsAxisTop)."""
        return self._inner

    @property
    def stream_fields(self) -> dict[str, list[dict[str, Any]]]:
        """Per input stream, its payload's fields with their ``byte_offset`` in ``tdata``."""
        return self._streams

    def describe(self) -> dict[str, Any]:
        """A JSON-compatible description: the stream core's (latency, fields, type indices),
        with this core's ports, stream byte layouts and register map."""
        desc = self._inner.describe()
        desc.pop("cfg_regs", None)
        for s in ("table", "tdata"):
            desc.pop(s, None)
        desc |= {
            "module": f"qaccel_{self._op}",
            "clock": {"name": "aclk", "edge": "rising"},
            "reset": {"name": "aresetn", "active": "low", "synchronous": True},
            "ports": [{"name": name, "direction": "in" if m.flow == wiring.In else "out",
                       "width": Shape.cast(m.shape).width}
                      for name, m in self.signature.members.items()],
            "streams": {s: {"tdata_bytes": tdata_bytes(f), "fields": f}
                        for s, f in self._streams.items()},
            "register_map": self._map.to_dict(),
        }
        if self._op == "matmul_nbits":
            from qaccel.explore.perf import nbits_v2_call

            c = self._config
            examples = [dict(M=M, K=min(1024, c.max_k), N=1024, bits=bits, block_size=32)
                        for M in (1, c.m_tile) for bits in (4, 8) if bits in c.nbits]
            desc["latency"] = {
                "model": "qaccel.explore.perf.nbits_v2_call",
                "counts": "cycles of a call, CTRL.start to busy low, as the CYCLES register "
                          "counts them, with the inputs keeping up and y taken every cycle",
                "examples": [{**e, "cycles": nbits_v2_call(c, **e).cycles} for e in examples]}
        else:
            desc["latency_counts"] = ("cycles from the s_axis_x transfer of an output word's "
                                      "last element to that word offered on m_axis_y")
        return desc

    def _checks(self, job) -> dict[str, Any]:
        """The job errors (ERROR field name: the condition on the job vector ``job``)."""
        c = self._config
        fields = {f.name: job[f.job_bit:f.job_bit + f.width]
                  for r in self._map.registers if r.job for f in r.fields}
        if self._op == "matmul_nbits":
            bits, bs, k = fields["bits"], fields["block_size"], fields["k"]
            ok_bits = Const(0, 1)
            for b in c.nbits:
                ok_bits |= bits == b
            ok_bs = Const(0, 1)
            size = 16
            while size <= c.max_block_size:
                ok_bs |= bs == size
                size *= 2
            fmode = fields["fmode"]
            ok_fmode = ((fmode == 0) | (fmode == 1) | (fmode == 3)) if c.float_path else \
                (fmode == 0)
            return {"bits": ~ok_bits, "block_size": ~ok_bs,
                    "k": (k == 0) | (k > c.max_k),
                    "mode": (fields["out_fmt"] == 3) | ~ok_fmode,
                    "shape": (fields["m"] == 0) | (fields["groups"] == 0)}
        from qaccel.rtl.axi.regmap import type_lists

        bad_format = Const(0, 1)
        for name, types in type_lists(self._op, c).items():
            bad_format |= fields[name] >= len(types)
        bad_shape = Const(0, 1)
        for k in range(c.max_dims):
            bad_shape |= fields[f"block{k}"] == 0
        return {"format": bad_format, "shape": bad_shape}

    def elaborate(self, platform):
        m = Module()
        # core: the datapath (aresetn or CTRL.reset); ctrl: the registers (aresetn only);
        # both local, so a design instantiating the core keeps its own domains
        m.domains.core = sync = ClockDomain("core", local=True)
        m.domains.ctrl = ctrl = ClockDomain("ctrl", local=True)
        soft_reset = Signal()
        m.d.comb += [sync.clk.eq(self.aclk), ctrl.clk.eq(self.aclk),
                     ctrl.rst.eq(~self.aresetn), sync.rst.eq(~self.aresetn | soft_reset)]
        m.submodules.regs = bank = DomainRenamer("ctrl")(self._bank)
        m.submodules.stream = inner = DomainRenamer("core")(self._inner)
        rmap = self._map
        for name in (n for n in self.signature.members if n.startswith("s_axil_")):
            port, mine = getattr(bank, name), getattr(self, name)
            flow = self.signature.members[name].flow
            m.d.comb += (port.eq(mine) if flow == In else mine.eq(port))

        # -- control: start, checks, busy / done, errors, interrupt, counters ----------------
        start = Signal()
        running = Signal()
        m.d.comb += [start.eq(bank.ctrl_write & bank.ctrl_start),
                     soft_reset.eq(bank.ctrl_write & bank.ctrl_reset), bank.lock.eq(running)]
        checks = self._checks(bank.job)
        job_error = Signal()
        m.d.comb += job_error.eq(sum(checks.values(), Const(0, 1)) != 0)
        begin = Signal()
        m.d.comb += begin.eq(start & ~running & ~job_error)
        done = Signal()
        m.d.comb += done.eq(running & ~inner.busy)
        with m.If(soft_reset):
            m.d.ctrl += running.eq(0)
        with m.Elif(begin):
            m.d.ctrl += running.eq(1)
        with m.Elif(done):
            m.d.ctrl += running.eq(0)
        finished = Signal()
        with m.If(begin):
            m.d.ctrl += finished.eq(0)
        with m.Elif(done & ~soft_reset):
            m.d.ctrl += finished.eq(1)
        error_names = [f.name for f in rmap["ERROR"].fields]
        m.d.comb += [bank.status_busy.eq(running), bank.status_done.eq(finished),
                     bank.status_error.eq(sum(getattr(bank, f"error_{n}")
                                              for n in error_names) != 0)]

        set_bits = {"start_busy": start & running, "locked_write": bank.locked}
        set_bits |= {name: start & ~running & cond for name, cond in checks.items()}
        table_error = Signal()
        if "table_addr" in error_names:
            set_bits["table_addr"] = table_error
        any_error = Signal()
        m.d.comb += [getattr(bank, f"error_{n}_set").eq(set_bits[n]) for n in error_names]
        m.d.comb += [any_error.eq(sum(set_bits.values()) != 0),
                     bank.irq_status_done_set.eq(done & ~soft_reset),
                     bank.irq_status_error_set.eq(any_error)]
        m.d.ctrl += self.irq.eq((bank.irq_status_done & bank.irq_enable_done)
                                      | (bank.irq_status_error & bank.irq_enable_error))

        cycles, y_beats = Signal(32), Signal(32)
        with m.If(begin):
            m.d.ctrl += [cycles.eq(1), y_beats.eq(0)]
        with m.Else():
            with m.If(running):
                m.d.ctrl += cycles.eq(cycles + 1)
            with m.If(self.m_axis_y_tvalid & self.m_axis_y_tready):
                m.d.ctrl += y_beats.eq(y_beats + 1)
        m.d.comb += [bank.cycles.eq(cycles), bank.y_beats.eq(y_beats)]

        # -- the stream core ----------------------------------------------------------------
        if self._op == "matmul_nbits":
            from qaccel.rtl.nbits.matmul_nbits_v2 import REGISTERS

            fields = {f.name: f for r in rmap.registers if r.job for f in r.fields}
            for r in REGISTERS:
                f = fields[r]
                m.d.comb += getattr(inner, f"cfg_{r}").eq(bank.job[f.job_bit:f.job_bit
                                                                   + f.width])
            for s in self._streams:
                self._connect_input(m, s, getattr(inner, f"s_axis_{s}_tdata"),
                                    getattr(inner, f"s_axis_{s}_tvalid"),
                                    getattr(inner, f"s_axis_{s}_tready"), Const(1, 1))
        else:
            m.d.comb += inner.cfg_regs.eq(bank.job)
            self._connect_input(m, "x", inner.s_axis_x_tdata, inner.s_axis_x_tvalid,
                                inner.s_axis_x_tready, Const(1, 1))
            self._connect_table(m, bank, inner, running | start, table_error)
        m.d.comb += inner.cfg_start.eq(begin)
        for name in ("m_axis_y_tdata", "m_axis_y_tkeep", "m_axis_y_tlast", "m_axis_y_tvalid"):
            if name in self.signature.members:
                m.d.comb += getattr(self, name).eq(getattr(inner, name))
        m.d.comb += inner.m_axis_y_tready.eq(self.m_axis_y_tready)
        return m

    def _unpack(self, stream: str, tdata) -> Any:
        """The stream core's payload (its fields packed as its layout has them) from a
        byte-aligned ``tdata``."""
        fields = self._streams[stream]
        width = fields[-1]["offset"] + fields[-1]["width"]
        flat = Signal(width, name=f"{stream}_payload")
        return flat, [flat[f["offset"]:f["offset"] + f["width"]].eq(
            tdata[f["byte_offset"]:f["byte_offset"] + f["width"]]) for f in fields]

    def _connect_input(self, m, s, tdata, tvalid, tready, enable) -> None:
        flat, assigns = self._unpack(s, getattr(self, f"s_axis_{s}_tdata"))
        m.d.comb += [*assigns, tdata.eq(flat),
                     tvalid.eq(getattr(self, f"s_axis_{s}_tvalid") & enable),
                     getattr(self, f"s_axis_{s}_tready").eq(tready & enable)]

    def _connect_table(self, m, bank, inner, held, table_error) -> None:
        """Table entries from the TABLE_* registers (a commit waits in ``pending`` for the
        table, and so does a CTRL write) or from ``s_axis_table`` (not taken while ``held``:
        busy or starting); an entry past the table's depth is dropped and flags
        ``ERROR.table_addr``."""
        depth = self._config.table_depth
        fields = {f["name"]: f for f in self._streams["table"]}
        stream_flat, assigns = self._unpack("table", self.s_axis_table_tdata)
        m.d.comb += assigns
        lite_flat = Signal.like(stream_flat, name="table_lite_payload")
        for name, value in (("addr", bank.table_addr), ("scale", bank.table_scale),
                            ("zero_point", bank.table_zero_point)):
            f = fields[name]
            m.d.comb += lite_flat[f["offset"]:f["offset"] + f["width"]].eq(value)
        a = fields["addr"]
        pending = Signal()
        m.d.comb += [bank.table_scale_ready.eq(~pending), bank.ctrl_ready.eq(~pending)]
        lite_ok = bank.table_addr < depth
        stream_ok = stream_flat[a["offset"]:a["offset"] + a["width"]] < depth
        with m.If(bank.table_scale_write & lite_ok):
            m.d.ctrl += pending.eq(1)
        with m.Elif(pending & inner.s_axis_table_tready):
            m.d.ctrl += pending.eq(0)
        with m.If(pending):
            m.d.comb += [inner.s_axis_table_tdata.eq(lite_flat), inner.s_axis_table_tvalid.eq(1)]
        with m.Else():
            m.d.comb += [inner.s_axis_table_tdata.eq(stream_flat),
                         inner.s_axis_table_tvalid.eq(self.s_axis_table_tvalid & ~held
                                                      & stream_ok),
                         self.s_axis_table_tready.eq(~held & (inner.s_axis_table_tready
                                                              | ~stream_ok))]
        m.d.comb += table_error.eq((bank.table_scale_write & ~lite_ok)
                                   | (self.s_axis_table_tvalid & self.s_axis_table_tready
                                      & ~stream_ok))
