"""A Quantize or Dequantize unit behind AXI4-Stream ports, with ONNX packing of the output."""

from __future__ import annotations

from typing import Any

from amaranth.hdl import Module, Shape, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.dtypes import QTYPES
from qaccel.model.floatfmt import FORMATS
from qaccel.rtl.elementwise.pack import Pack
from qaccel.rtl.elementwise.unit import Elementwise

__all__ = ["AxisTop", "layout_fields", "type_lists"]


def _bits(name: str) -> int:
    return QTYPES[name].bits if name in QTYPES else FORMATS[name].bits


def layout_fields(layout, offset: int = 0, prefix: str = "") -> list[dict[str, Any]]:
    """Flatten a (nested) data layout into ``{name, offset, width}`` records."""
    out = []
    if isinstance(layout, data.StructLayout):
        for name, fld in layout:
            out += layout_fields(fld.shape, offset + fld.offset, f"{prefix}{name}.")
    elif isinstance(layout, data.ArrayLayout):
        width = Shape.cast(layout.elem_shape).width
        for k in range(layout.length):
            out += layout_fields(layout.elem_shape, offset + k * width, f"{prefix}{k}.")
    else:
        out.append({"name": prefix.rstrip("."), "offset": offset,
                    "width": Shape.cast(layout).width})
    return out


def type_lists(op: str, config) -> dict[str, tuple[str, ...]]:
    """The type lists the ``op`` (``quantize`` / ``dequantize``) unit's format registers
    index, by register field (``x_fmt``, ``s_fmt``, ``prec``, ``out_fmt``)."""
    c = config
    if op == "quantize":
        return {"x_fmt": c.q_inputs, "s_fmt": c.scales, "prec": c.precisions,
                "out_fmt": c.q_outputs}
    from qaccel.rtl.elementwise.dequantize_lane import dq_scales

    return {"x_fmt": c.dq_inputs, "s_fmt": dq_scales(c), "out_fmt": c.dq_outputs}


class AxisTop(wiring.Component):
    """Wrap ``unit`` (a :class:`~qaccel.rtl.elementwise.quantize.Quantize` or
    :class:`~qaccel.rtl.elementwise.dequantize.Dequantize`) for an FPGA design.

    Ports (the names the emitted Verilog carries):

    * ``s_axis_table_tdata/tvalid/tready``: scale / zero-point table writes
      (``addr``, ``scale``, ``zero_point`` fields, see :meth:`describe`);
    * ``s_axis_x_tdata/tvalid/tready``: input codes, ``lanes`` per beat, right-aligned lanes;
    * ``m_axis_y_tdata/tkeep/tlast/tvalid/tready``: the output codes packed densely, as ONNX
      stores the tensor (int4 / uint4 / float4e2m1 two per byte, low nibble first; int2 /
      uint2 four per byte; wider types little-endian), ``tkeep`` marking the bytes of the last
      word that hold elements (:class:`~qaccel.rtl.elementwise.pack.Pack`);
    * ``cfg_regs`` (the unit's ``regs``), ``cfg_start``, ``busy``.

    Latency: the unit's plus one cycle for packing (a word leaves one cycle after its last
    element). Throughput: one ``x`` beat per cycle.
    """

    def __init__(self, unit: Elementwise, *, op: str):
        if not isinstance(unit, Elementwise):
            raise TypeError(f"unit must be a Quantize or Dequantize unit, not {unit!r}")
        if op not in ("quantize", "dequantize"):
            raise ValueError(f"op must be 'quantize' or 'dequantize', not {op!r}")
        self._unit = unit
        self._op = op
        c = unit.config
        self._outputs = c.q_outputs if op == "quantize" else c.dq_outputs
        members = unit.signature.members
        y_data = members["y"].signature.members["payload"].shape["data"].shape
        self._max_bits = max(8, 1 << (Shape.cast(y_data.elem_shape).width - 1).bit_length())
        self._pack = Pack(lanes=c.lanes, max_bits=self._max_bits,
                          widths={_bits(t) for t in self._outputs},
                          count_width=c.count_width)
        table = members["table"].signature.members["payload"].shape
        x = members["x"].signature.members["payload"].shape
        word = c.lanes * self._max_bits
        super().__init__({
            "cfg_regs": In(members["regs"].shape),
            "cfg_start": In(1),
            "busy": Out(1),
            "s_axis_table_tdata": In(unsigned(table.size)),
            "s_axis_table_tvalid": In(1),
            "s_axis_table_tready": Out(1),
            "s_axis_x_tdata": In(unsigned(x.size)),
            "s_axis_x_tvalid": In(1),
            "s_axis_x_tready": Out(1),
            "m_axis_y_tdata": Out(unsigned(word)),
            "m_axis_y_tkeep": Out(unsigned(word // 8)),
            "m_axis_y_tlast": Out(1),
            "m_axis_y_tvalid": Out(1),
            "m_axis_y_tready": In(1),
        })

    @property
    def unit(self) -> Elementwise:
        return self._unit

    @property
    def latency(self) -> int:
        """Cycles from an ``x`` transfer to the word holding its last element (no stalls)."""
        return self._unit.latency + 1

    def describe(self) -> dict[str, Any]:
        """A JSON-compatible description: ports, register and table fields, type indices."""
        c = self._unit.config
        members = self._unit.signature.members
        lane_regs = members["regs"].shape["lane"].shape
        types = {}
        for name, _ in lane_regs:
            if name.endswith("_fmt"):
                types[name] = list(type_lists(self._op, c)[name])
        return {
            "module": f"qaccel_{self._op}",
            "operator": self._op,
            "config": c.to_dict("elementwise"),
            "latency": self.latency,
            "lanes": c.lanes,
            "ports": [{"name": name, "direction": "in" if m.flow == wiring.In else "out",
                       "width": Shape.cast(m.shape).width}
                      for name, m in self.signature.members.items()] + [
                {"name": "clk", "direction": "in", "width": 1},
                {"name": "rst", "direction": "in", "width": 1}],
            "cfg_regs": layout_fields(members["regs"].shape),
            "table": layout_fields(members["table"].signature.members["payload"].shape),
            "type_indices": types,
            "output_bits": {t: _bits(t) for t in self._outputs},
        }


    def elaborate(self, platform):
        m = Module()
        m.submodules.unit = u = self._unit
        m.submodules.pack = p = self._pack
        m.d.comb += [
            u.regs.eq(self.cfg_regs), u.start.eq(self.cfg_start),
            self.busy.eq(u.busy | p.o.valid),
            u.table.payload.eq(self.s_axis_table_tdata),
            u.table.valid.eq(self.s_axis_table_tvalid),
            self.s_axis_table_tready.eq(u.table.ready),
            u.x.payload.eq(self.s_axis_x_tdata), u.x.valid.eq(self.s_axis_x_tvalid),
            self.s_axis_x_tready.eq(u.x.ready),
        ]
        m.d.comb += [p.i.valid.eq(u.y.valid), u.y.ready.eq(p.i.ready),
                     p.i.payload.last.eq(u.y.payload.last)]
        for k in range(self._unit.config.lanes):
            m.d.comb += p.i.payload.data[k].eq(u.y.payload.data[k])
        m.d.comb += [p.count.eq(self.cfg_regs.count)]
        with m.Switch(self.cfg_regs.lane.out_fmt):
            for k, name in enumerate(self._outputs):
                with m.Case(k):
                    m.d.comb += p.bits.eq(_bits(name))
        m.d.comb += [
            self.m_axis_y_tdata.eq(p.o.payload.data), self.m_axis_y_tkeep.eq(p.o.payload.keep),
            self.m_axis_y_tlast.eq(p.o.payload.last), self.m_axis_y_tvalid.eq(p.o.valid),
            p.o.ready.eq(self.m_axis_y_tready),
        ]
        return m
