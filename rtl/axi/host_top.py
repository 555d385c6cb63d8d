"""The cores a board carries behind its UART host link: the top ``qaccel bitstream`` builds
(inside the board's pins) and the suite simulates."""

from __future__ import annotations

from typing import Any

from amaranth.hdl import ClockSignal, Const, Module, ResetSignal
from amaranth.lib import fifo, wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.config import AccelConfig
from qaccel.rtl.axi.axi_core import AxiCore
from qaccel.rtl.axi.axil_decoder import AxiLiteDecoder
from qaccel.rtl.axi.regmap import OPS, tdata_bytes

__all__ = ["HostTop", "WINDOW_BITS"]

#: Each core's register window: 4 KiB (core ``k`` at byte address ``k << WINDOW_BITS``).
WINDOW_BITS = 12


class HostTop(wiring.Component):
    """The cores ``ops`` of ``config`` (:class:`~qaccel.rtl.axi.axi_core.AxiCore`) behind a
    :class:`~qaccel.rtl.board.host_bridge.HostBridge` on ``uart_rx`` / ``uart_tx`` (8N1,
    ``divisor`` clock cycles a bit), all in the ``sync`` domain.

    Core ``k`` of ``ops`` answers register addresses ``k << 12`` onwards (an
    :class:`~qaccel.rtl.axi.axil_decoder.AxiLiteDecoder`); its input streams are the bridge's
    streams ``<op>_<stream>`` (their ids in :meth:`describe`); the cores' ``y`` streams share
    the bridge's output (one job runs at a time; the lower core wins if both offer), each
    word padded to the widest with its ``tkeep`` marking the core's bytes. The engine's
    ``w``, ``s`` and ``b`` streams pass FIFOs of two blocks' beats, so a host sending them
    one after the other, block by block, never stalls the engine for good.
    """

    def __init__(self, config: AccelConfig | None = None, ops=("quantize", "matmul_nbits"), *,
                 divisor: int, ecp5: bool = False, rx_fifo: int = 2048):
        from qaccel.rtl.board.host_bridge import HostBridge

        ops = tuple(ops)
        if not ops or len(set(ops)) != len(ops) or any(op not in OPS for op in ops):
            raise ValueError(f"ops must be distinct names among {', '.join(OPS)}, not {ops!r}")
        config = AccelConfig() if config is None else config
        self._config, self._ops = config, ops
        self._cores = {op: AxiCore(op, config, ecp5=ecp5, addr_width=WINDOW_BITS) for op in ops}
        self._inputs = {f"{op}_{s}": tdata_bytes(fields) for op, core in self._cores.items()
                        for s, fields in core.stream_fields.items()}
        self._y_bytes = max(self._y_width(c) // 8 for c in self._cores.values())
        # the engine's w, s and b streams, fed one after the other by the host, each through
        # a FIFO holding two blocks' beats (:meth:`qaccel.board.driver.Board.matmul_nbits`)
        J = config.pe // config.scale_lanes
        self._fifo_depths = ({"matmul_nbits_w": 2 * -(-config.max_block_size // config.simd),
                              "matmul_nbits_s": 4 * J, "matmul_nbits_b": 2 * J}
                             if "matmul_nbits" in ops else {})
        self._decoder = AxiLiteDecoder(len(ops), window_bits=WINDOW_BITS)
        self._bridge = HostBridge(self._inputs, self._y_bytes, True, divisor=divisor,
                                  rx_fifo=rx_fifo, addr_width=self._decoder.addr_width)
        self._divisor = divisor
        self._rx_fifo = rx_fifo
        super().__init__({"uart_rx": In(1, init=1), "uart_tx": Out(1, init=1)})

    @staticmethod
    def _y_width(core: AxiCore) -> int:
        return core.signature.members["m_axis_y_tdata"].shape.width

    @property
    def cores(self) -> dict[str, AxiCore]:
        return dict(self._cores)

    def describe(self) -> dict[str, Any]:
        """What the host driver (:class:`qaccel.board.Board`) needs: each core's window base
        and description, the bridge's streams (id, bytes) and output width, the divisor."""
        return {
            "config": self._config.to_dict(),
            "cores": {op: {"base": k << WINDOW_BITS, **core.describe()}
                      for k, (op, core) in enumerate(self._cores.items())},
            "streams": {name: {"id": k, "bytes": b}
                        for k, (name, b) in enumerate(self._inputs.items())},
            "y_bytes": self._y_bytes, "divisor": self._divisor, "rx_fifo": self._rx_fifo,
            "stream_fifos": self._fifo_depths,
        }

    def elaborate(self, platform):
        m = Module()
        m.submodules.bridge = bridge = self._bridge
        m.submodules.decoder = decoder = self._decoder
        m.d.comb += [bridge.uart_rx.eq(self.uart_rx), self.uart_tx.eq(bridge.uart_tx)]
        # bridge -> decoder (AXI4-Lite)
        for name, member in decoder.signature.members.items():
            if name.startswith("s_axil_"):
                theirs = getattr(bridge, "m_axil_" + name[len("s_axil_"):], None)
                mine = getattr(decoder, name)
                if theirs is None:           # (awprot, arprot: the bridge has none)
                    m.d.comb += mine.eq(0)
                elif member.flow == In:
                    m.d.comb += mine.eq(theirs)
                else:
                    m.d.comb += theirs.eq(mine)
        y_taken = Const(0, 1)
        for k, (op, core) in enumerate(self._cores.items()):
            m.submodules[op] = core
            m.d.comb += [core.aclk.eq(ClockSignal()),
                         core.aresetn.eq(~ResetSignal(allow_reset_less=True))]
            for name, member in core.signature.members.items():
                if name.startswith("s_axil_"):
                    theirs = getattr(decoder, f"m{k}_axil_" + name[len("s_axil_"):])
                    mine = getattr(core, name)
                    m.d.comb += mine.eq(theirs) if member.flow == In else theirs.eq(mine)
            for s in core.stream_fields:
                src = f"m_axis_{op}_{s}"
                tdata, tvalid = getattr(bridge, f"{src}_tdata"), getattr(bridge, f"{src}_tvalid")
                tready = getattr(bridge, f"{src}_tready")
                depth = self._fifo_depths.get(f"{op}_{s}")
                if depth:
                    m.submodules[f"{op}_{s}_fifo"] = q = fifo.SyncFIFOBuffered(
                        width=len(tdata), depth=depth)
                    m.d.comb += [q.w_data.eq(tdata), q.w_en.eq(tvalid), tready.eq(q.w_rdy)]
                    tdata, tvalid, tready = q.r_data, q.r_rdy, q.r_en
                m.d.comb += [getattr(core, f"s_axis_{s}_tdata").eq(tdata),
                             getattr(core, f"s_axis_{s}_tvalid").eq(tvalid),
                             tready.eq(getattr(core, f"s_axis_{s}_tready"))]
            # the output: this core's word when no lower core offers one
            nbytes = self._y_width(core) // 8
            keep = (core.m_axis_y_tkeep if "m_axis_y_tkeep" in core.signature.members
                    else Const((1 << nbytes) - 1, nbytes))
            with m.If(core.m_axis_y_tvalid & ~y_taken):
                m.d.comb += [bridge.s_axis_y_tdata.eq(core.m_axis_y_tdata),
                             bridge.s_axis_y_tkeep.eq(keep),
                             bridge.s_axis_y_tlast.eq(core.m_axis_y_tlast),
                             bridge.s_axis_y_tvalid.eq(1),
                             core.m_axis_y_tready.eq(bridge.s_axis_y_tready)]
            y_taken = y_taken | core.m_axis_y_tvalid
        return m
