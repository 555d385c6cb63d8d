"""The MatMulNBits engine behind AXI4-Stream ports, for an FPGA design."""

from __future__ import annotations

from typing import Any

from amaranth.hdl import Module, Shape, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.config import AccelConfig
from qaccel.rtl.elementwise.axis_top import layout_fields
from qaccel.rtl.nbits import matmul_nbits_v2 as v2

__all__ = ["INPUTS", "NBitsAxisTop"]

#: The engine's input streams.
INPUTS = ("a", "w", "s", "b")


class NBitsAxisTop(wiring.Component):
    """The MatMulNBits engine of ``config`` (:class:`~qaccel.rtl.nbits.matmul_nbits_v2.
    MatMulNBitsV2`, with the float path when ``config.float_path``) with AXI4-Stream port
    names.

    Ports (the names the emitted Verilog carries): ``s_axis_<stream>_tdata/tvalid/tready``
    for the engine's input streams (``a`` A rows, ``w`` weight steps, ``s`` scales and
    zero-point codes per lane, ``b`` biases), their payloads as flat words (see
    :meth:`describe`), ``m_axis_y_tdata/tlast/tvalid/tready`` (``tlast`` on a job's last
    beat), ``cfg_<register>`` for the job registers, ``cfg_start`` and ``busy``. Latency and
    throughput are the engine's: nothing is added. ``ecp5`` instantiates ECP5 primitives
    (MULT18X18D, DP16KD) for an ECP5 build.
    """

    def __init__(self, config: AccelConfig | None = None, *, ecp5: bool = False):
        config = AccelConfig() if config is None else config
        self._engine = v2.MatMulNBitsV2(config, ecp5=ecp5)
        members = self._engine.signature.members
        ports = {f"cfg_{r}": In(members[r].shape) for r in v2.REGISTERS}
        ports |= {"cfg_start": In(1), "busy": Out(1)}
        for s in INPUTS:
            width = Shape.cast(members[s].signature.members["payload"].shape).width
            ports |= {f"s_axis_{s}_tdata": In(unsigned(width)), f"s_axis_{s}_tvalid": In(1),
                      f"s_axis_{s}_tready": Out(1)}
        y = members["y"].signature.members["payload"].shape["y"].shape
        ports |= {"m_axis_y_tdata": Out(unsigned(Shape.cast(y).width)),
                  "m_axis_y_tlast": Out(1), "m_axis_y_tvalid": Out(1),
                  "m_axis_y_tready": In(1)}
        super().__init__(ports)

    @property
    def engine(self) -> v2.MatMulNBitsV2:
        return self._engine

    def describe(self) -> dict[str, Any]:
        """A JSON-compatible description: ports, stream payload fields, register codes."""
        members = self._engine.signature.members
        return {
            "module": "qaccel_matmul_nbits",
            "operator": "matmul_nbits",
            "engine": "v2",
            "config": self._engine.config.to_dict("matmul_nbits"),
            "ports": [{"name": name, "direction": "in" if m.flow == wiring.In else "out",
                       "width": Shape.cast(m.shape).width}
                      for name, m in self.signature.members.items()] + [
                {"name": "clk", "direction": "in", "width": 1},
                {"name": "rst", "direction": "in", "width": 1}],
            "tdata": {s: layout_fields(members[s].signature.members["payload"].shape)
                      for s in INPUTS},
            "out_fmt": list(v2.OUT_FORMATS),
            "fmode": {"int8 path": 0, "float path": 1, "float path, float zero points": 3},
            "lanes": self._engine.lanes,
            "timing": self._engine.timing,
            "wide_columns": [list(p) for p in v2.wide_columns(self._engine.config.pe,
                                                              self._engine.lanes)],
        }

    def elaborate(self, platform):
        m = Module()
        m.submodules.engine = e = self._engine
        m.d.comb += [getattr(e, r).eq(getattr(self, f"cfg_{r}")) for r in v2.REGISTERS]
        m.d.comb += [e.start.eq(self.cfg_start), self.busy.eq(e.busy)]
        for s in INPUTS:
            port = getattr(e, s)
            m.d.comb += [port.payload.eq(getattr(self, f"s_axis_{s}_tdata")),
                         port.valid.eq(getattr(self, f"s_axis_{s}_tvalid")),
                         getattr(self, f"s_axis_{s}_tready").eq(port.ready)]
        m.d.comb += [self.m_axis_y_tdata.eq(e.y.payload.y), self.m_axis_y_tlast.eq(
            e.y.payload.last), self.m_axis_y_tvalid.eq(e.y.valid),
            e.y.ready.eq(self.m_axis_y_tready)]
        return m
