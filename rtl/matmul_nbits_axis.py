"""The MatMulNBits engine behind AXI4-Stream ports, for an FPGA design."""

from __future__ import annotations

from typing import Any

from amaranth.hdl import Module, Shape, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.config import AccelConfig
from qaccel.rtl.axis_top import _fields
from qaccel.rtl.matmul_nbits import (
    OUT_FORMATS,
    REGISTERS,
    ZP_DEFAULT,
    ZP_FLOAT,
    ZP_PACKED,
    MatMulNBits,
)

__all__ = ["NBitsAxisTop"]

_INPUTS = ("a", "w", "s", "z")


class NBitsAxisTop(wiring.Component):
    """:class:`~qaccel.rtl.matmul_nbits.MatMulNBits` with AXI4-Stream port names.

    Ports (the names the emitted Verilog carries): ``s_axis_{a,w,s,z}_tdata/tvalid/tready``
    (A rows, packed weights, scales / float zero points / bias, packed zero points: the
    engine's ``a``, ``w``, ``s``, ``z`` payloads as flat words, see :meth:`describe`),
    ``m_axis_y_tdata/tlast/tvalid/tready`` (``pe`` float32 results per pass, ``tlast`` on a
    job's last pass), ``cfg_<register>`` for the job registers, ``cfg_start`` and ``busy``.
    Latency and throughput are the engine's: nothing is added.
    """

    def __init__(self, config: AccelConfig | None = None):
        self._engine = MatMulNBits(config)
        members = self._engine.signature.members
        ports = {f"cfg_{r}": In(members[r].shape) for r in REGISTERS}
        ports |= {"cfg_start": In(1), "busy": Out(1)}
        for s in _INPUTS:
            width = Shape.cast(members[s].signature.members["payload"].shape).width
            ports |= {f"s_axis_{s}_tdata": In(unsigned(width)), f"s_axis_{s}_tvalid": In(1),
                      f"s_axis_{s}_tready": Out(1)}
        y = members["y"].signature.members["payload"].shape["y"].shape
        ports |= {"m_axis_y_tdata": Out(unsigned(Shape.cast(y).width)),
                  "m_axis_y_tlast": Out(1), "m_axis_y_tvalid": Out(1),
                  "m_axis_y_tready": In(1)}
        super().__init__(ports)

    @property
    def engine(self) -> MatMulNBits:
        return self._engine

    def describe(self) -> dict[str, Any]:
        """A JSON-compatible description: ports, stream payload fields, register codes."""
        members = self._engine.signature.members
        return {
            "module": "qaccel_matmul_nbits",
            "operator": "matmul_nbits",
            "config": self._engine.config.to_dict(),
            "ports": [{"name": name, "direction": "in" if m.flow == wiring.In else "out",
                       "width": Shape.cast(m.shape).width}
                      for name, m in self.signature.members.items()] + [
                {"name": "clk", "direction": "in", "width": 1},
                {"name": "rst", "direction": "in", "width": 1}],
            "tdata": {s: _fields(members[s].signature.members["payload"].shape)
                      for s in _INPUTS},
            "zp_mode": {"default": ZP_DEFAULT, "packed": ZP_PACKED, "float": ZP_FLOAT},
            "out_fmt": list(OUT_FORMATS),
        }

    def elaborate(self, platform):
        m = Module()
        m.submodules.engine = e = self._engine
        m.d.comb += [getattr(e, r).eq(getattr(self, f"cfg_{r}")) for r in REGISTERS]
        m.d.comb += [e.start.eq(self.cfg_start), self.busy.eq(e.busy)]
        for s in _INPUTS:
            port = getattr(e, s)
            m.d.comb += [port.payload.eq(getattr(self, f"s_axis_{s}_tdata")),
                         port.valid.eq(getattr(self, f"s_axis_{s}_tvalid")),
                         getattr(self, f"s_axis_{s}_tready").eq(port.ready)]
        m.d.comb += [self.m_axis_y_tdata.eq(e.y.payload.y), self.m_axis_y_tlast.eq(
            e.y.payload.last), self.m_axis_y_tvalid.eq(e.y.valid),
            e.y.ready.eq(self.m_axis_y_tready)]
        return m
