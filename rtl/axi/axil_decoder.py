"""An AXI4-Lite address decoder: one master to several slaves, one window each."""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring

from qaccel.model.validate import check_int
from qaccel.rtl.axi.axil_registers import RESP_SLVERR, axil_ports

__all__ = ["AxiLiteDecoder"]

_TO_SLAVE = ("awprot", "wdata", "wstrb", "arprot")


class AxiLiteDecoder(wiring.Component):
    """Route the AXI4-Lite slave port ``s_axil_*`` (``window_bits + select bits`` of address)
    to ``slaves`` master ports ``m<k>_axil_*`` (``window_bits`` each): slave ``k`` answers
    byte addresses ``k << window_bits`` up to the next window. An address past the last
    window answers SLVERR (a read returns 0).

    One write and one read are in flight at a time: a new AW / AR is taken once the previous
    response of its kind has been taken, so responses cannot overtake each other. No cycle
    is added on the way to a slave (AW, W and AR pass combinationally); B and R pass
    combinationally back.
    """

    def __init__(self, slaves: int, *, window_bits: int = 12):
        self._slaves = check_int("slaves", slaves, 1, 64)
        self._window = check_int("window_bits", window_bits, 2, 30)
        self._select = max(1, (slaves - 1).bit_length())
        ports = axil_ports("s_axil", window_bits + self._select)
        for k in range(slaves):
            ports |= axil_ports(f"m{k}_axil", window_bits, master=True)
        super().__init__(ports)

    @property
    def addr_width(self) -> int:
        return self._window + self._select

    def elaborate(self, platform):
        m = Module()
        n, w = self._slaves, self._window
        s = self

        def port(k, name):
            return getattr(s, f"m{k}_axil_{name}")

        for k in range(n):
            m.d.comb += [port(k, "awaddr").eq(s.s_axil_awaddr[:w]),
                         port(k, "araddr").eq(s.s_axil_araddr[:w])]
            m.d.comb += [port(k, name).eq(getattr(s, f"s_axil_{name}")) for name in _TO_SLAVE]

        # -- writes ---------------------------------------------------------------------------
        w_busy, w_sel, w_err = Signal(), Signal(self._select), Signal()
        sel = s.s_axil_awaddr[w:]
        with m.If(~w_busy):
            for k in range(n):
                with m.If(sel == k):
                    m.d.comb += [port(k, "awvalid").eq(s.s_axil_awvalid),
                                 port(k, "wvalid").eq(s.s_axil_wvalid),
                                 s.s_axil_awready.eq(port(k, "awready")),
                                 s.s_axil_wready.eq(port(k, "wready"))]
            with m.If(sel >= n):                  # no slave: take AW and W together
                m.d.comb += [s.s_axil_awready.eq(s.s_axil_awvalid & s.s_axil_wvalid),
                             s.s_axil_wready.eq(s.s_axil_awvalid & s.s_axil_wvalid)]
            with m.If(s.s_axil_awvalid & s.s_axil_awready):
                m.d.sync += [w_busy.eq(1), w_sel.eq(sel), w_err.eq(sel >= n)]
        with m.Else():
            with m.If(w_err):
                m.d.comb += [s.s_axil_bvalid.eq(1), s.s_axil_bresp.eq(RESP_SLVERR)]
            for k in range(n):
                with m.Elif(w_sel == k):
                    m.d.comb += [s.s_axil_bvalid.eq(port(k, "bvalid")),
                                 s.s_axil_bresp.eq(port(k, "bresp")),
                                 port(k, "bready").eq(s.s_axil_bready)]
            with m.If(s.s_axil_bvalid & s.s_axil_bready):
                m.d.sync += w_busy.eq(0)

        # -- reads ----------------------------------------------------------------------------
        r_busy, r_sel, r_err = Signal(), Signal(self._select), Signal()
        sel = s.s_axil_araddr[w:]
        with m.If(~r_busy):
            for k in range(n):
                with m.If(sel == k):
                    m.d.comb += [port(k, "arvalid").eq(s.s_axil_arvalid),
                                 s.s_axil_arready.eq(port(k, "arready"))]
            with m.If(sel >= n):
                m.d.comb += s.s_axil_arready.eq(1)
            with m.If(s.s_axil_arvalid & s.s_axil_arready):
                m.d.sync += [r_busy.eq(1), r_sel.eq(sel), r_err.eq(sel >= n)]
        with m.Else():
            with m.If(r_err):
                m.d.comb += [s.s_axil_rvalid.eq(1), s.s_axil_rresp.eq(RESP_SLVERR)]
            for k in range(n):
                with m.Elif(r_sel == k):
                    m.d.comb += [s.s_axil_rvalid.eq(port(k, "rvalid")),
                                 s.s_axil_rresp.eq(port(k, "rresp")),
                                 s.s_axil_rdata.eq(port(k, "rdata")),
                                 port(k, "rready").eq(s.s_axil_rready)]
            with m.If(s.s_axil_rvalid & s.s_axil_rready):
                m.d.sync += r_busy.eq(0)
        return m
