"""An AXI4-Lite register bank built from a :class:`~qaccel.rtl.axi.regmap.RegisterMap`."""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from qaccel.rtl.axi.regmap import Field, Register, RegisterMap

__all__ = ["RESP_OKAY", "RESP_SLVERR", "AxiLiteRegisters", "axil_ports", "port_name"]

RESP_OKAY = 0
RESP_SLVERR = 2


def axil_ports(prefix: str, addr_width: int, *, master: bool = False) -> dict:
    """The flat AXI4-Lite ports of a slave (or, with ``master``, a master) named
    ``<prefix>_awaddr`` ... ``<prefix>_rready``, 32-bit data, ``awprot``/``arprot`` included
    (as Vivado's and Quartus's interface inference expect them)."""
    to_slave, from_slave = (Out, In) if master else (In, Out)
    ports = {}
    for name, width, flow in (
            ("awaddr", addr_width, to_slave), ("awprot", 3, to_slave), ("awvalid", 1, to_slave),
            ("awready", 1, from_slave), ("wdata", 32, to_slave), ("wstrb", 4, to_slave),
            ("wvalid", 1, to_slave), ("wready", 1, from_slave), ("bresp", 2, from_slave),
            ("bvalid", 1, from_slave), ("bready", 1, to_slave), ("araddr", addr_width, to_slave),
            ("arprot", 3, to_slave), ("arvalid", 1, to_slave), ("arready", 1, from_slave),
            ("rdata", 32, from_slave), ("rresp", 2, from_slave), ("rvalid", 1, from_slave),
            ("rready", 1, to_slave)):
        ports[f"{prefix}_{name}"] = flow(width)
    return ports


def port_name(register: Register, field: Field) -> str:
    """The bank's member for ``field`` of ``register``: ``<register>_<field>`` in lower case,
    or the register's name alone for a register of one field."""
    r = register.name.lower()
    return r if len(register.fields) == 1 else f"{r}_{field.name}"


class AxiLiteRegisters(wiring.Component):
    """The registers of ``regmap`` behind an AXI4-Lite slave (``s_axil_*``, ``addr_width``
    address bits, 32-bit data).

    Members besides the bus, per field (:func:`port_name`): ``rw`` fields an output holding
    the value; ``ro`` fields an input; ``w1c`` fields an input ``<name>_set`` (bits to set)
    and an output (the value); ``wo`` fields an output holding the last written value, with
    ``<register>_write`` pulsing for a cycle when the register is written. Job fields are
    not separate members: ``job`` holds the job vector they make up. ``lock`` high refuses
    writes to job registers and ``held`` ones (SLVERR, ``locked`` pulses); a ``stall``
    register's write waits for ``<register>_ready``.

    Timing: a write is taken in the cycle AW and W are both valid (and a ``stall``
    register's ready is high) and answered on B the next cycle; a read is answered on R the
    cycle after AR. One transaction of each kind at a time. Unmapped addresses answer
    SLVERR; writes honour ``wstrb`` for ``rw`` and ``w1c`` fields.
    """

    def __init__(self, regmap: RegisterMap, *, addr_width: int = 12):
        if not isinstance(regmap, RegisterMap):
            raise TypeError(f"regmap must be a RegisterMap, not {regmap!r}")
        if regmap.span > 1 << addr_width:
            raise ValueError(f"addr_width must cover the map's {regmap.span} bytes, not "
                             f"{addr_width}")
        self._map = regmap
        self._addr_width = addr_width
        ports = axil_ports("s_axil", addr_width)
        ports |= {"job": Out(regmap.job_width), "lock": In(1), "locked": Out(1)}
        for reg in regmap.registers:
            if reg.stall:
                ports[f"{reg.name.lower()}_ready"] = In(1)
            if any(f.access == "wo" for f in reg.fields):
                ports[f"{reg.name.lower()}_write"] = Out(1)
            for f in reg.fields:
                if f.job_bit is not None:
                    continue
                name = port_name(reg, f)
                if f.access == "ro":
                    if not reg.constant:
                        ports[name] = In(f.width)
                elif f.access == "w1c":
                    ports[f"{name}_set"] = In(f.width)
                    ports[name] = Out(f.width)
                else:
                    ports[name] = Out(f.width, init=f.reset)
        super().__init__(ports)

    @property
    def regmap(self) -> RegisterMap:
        return self._map

    def elaborate(self, platform):
        m = Module()
        rmap = self._map
        waddr = self.s_axil_awaddr[2:]
        raddr = self.s_axil_araddr[2:]
        strobe = Cat(*(self.s_axil_wstrb[k // 8] for k in range(32)))

        # -- write: AW and W taken together, B the cycle after ------------------------------
        bvalid, bresp = Signal(), Signal(2)
        both = self.s_axil_awvalid & self.s_axil_wvalid & ~bvalid
        take, stalled, resp = Signal(), Signal(), Signal(2)
        for reg in rmap.registers:
            if reg.stall:
                with m.If(waddr == reg.offset >> 2):
                    m.d.comb += stalled.eq(~getattr(self, f"{reg.name.lower()}_ready")
                                           & ~(self.lock & reg.held))
        m.d.comb += take.eq(both & ~stalled)
        m.d.comb += [self.s_axil_awready.eq(take), self.s_axil_wready.eq(take),
                     self.s_axil_bvalid.eq(bvalid), self.s_axil_bresp.eq(bresp)]
        with m.If(bvalid & self.s_axil_bready):
            m.d.sync += bvalid.eq(0)
        with m.If(take):
            m.d.sync += [bvalid.eq(1), bresp.eq(resp)]

        job = Signal(rmap.job_width, init=self._job_init())
        m.d.comb += self.job.eq(job)
        wdata = self.s_axil_wdata
        m.d.comb += resp.eq(RESP_SLVERR)
        for reg in rmap.registers:
            at = take & (waddr == reg.offset >> 2)
            locked = reg.job or reg.held
            ok = at & ~self.lock if locked else at
            with m.If(ok):
                m.d.comb += resp.eq(RESP_OKAY)
            if locked:
                with m.If(at & self.lock):
                    m.d.comb += self.locked.eq(1)
            if any(f.access == "wo" for f in reg.fields):
                m.d.sync += getattr(self, f"{reg.name.lower()}_write").eq(ok)
            for f in reg.fields:
                bits = slice(f.lsb, f.lsb + f.width)
                if f.job_bit is not None:
                    target = job[f.job_bit:f.job_bit + f.width]
                    with m.If(ok):
                        m.d.sync += target.eq((wdata[bits] & strobe[bits])
                                              | (target & ~strobe[bits]))
                    continue
                name = port_name(reg, f)
                if f.access == "rw":
                    sig = getattr(self, name)
                    with m.If(ok):
                        m.d.sync += sig.eq((wdata[bits] & strobe[bits]) | (sig & ~strobe[bits]))
                elif f.access == "wo":
                    with m.If(ok):
                        m.d.sync += getattr(self, name).eq(wdata[bits])
                elif f.access == "w1c":
                    sig = getattr(self, name)
                    clear = Signal(f.width, name=f"{name}_clear")
                    m.d.comb += clear.eq(Const(0, f.width))
                    with m.If(ok):
                        m.d.comb += clear.eq(wdata[bits] & strobe[bits])
                    m.d.sync += sig.eq((sig & ~clear) | getattr(self, f"{name}_set"))

        # -- read: AR taken when R is free, R the cycle after --------------------------------
        rvalid, rdata, rresp = Signal(), Signal(32), Signal(2)
        m.d.comb += [self.s_axil_arready.eq(~rvalid), self.s_axil_rvalid.eq(rvalid),
                     self.s_axil_rdata.eq(rdata), self.s_axil_rresp.eq(rresp)]
        with m.If(rvalid & self.s_axil_rready):
            m.d.sync += rvalid.eq(0)
        with m.If(self.s_axil_arvalid & ~rvalid):
            m.d.sync += [rvalid.eq(1), rresp.eq(RESP_SLVERR), rdata.eq(0)]
            with m.Switch(raddr):
                for reg in rmap.registers:
                    with m.Case(reg.offset >> 2):
                        m.d.sync += [rresp.eq(RESP_OKAY), rdata.eq(self._read_word(reg, job))]
        return m

    def _job_init(self) -> int:
        return sum(f.reset << f.job_bit for r in self._map.registers for f in r.fields
                   if f.job_bit is not None)

    def _read_word(self, reg, job):
        """The value a read of ``reg`` returns (``wo`` fields read 0)."""
        parts = []
        for f in reg.fields:
            if f.access == "wo":
                continue
            if f.job_bit is not None:
                value = job[f.job_bit:f.job_bit + f.width]
            elif reg.constant:
                value = Const(f.reset, f.width)
            else:
                value = getattr(self, port_name(reg, f))
            parts.append((f.lsb, value))
        return sum((value.as_unsigned() << lsb for lsb, value in parts), Const(0, 32))[:32]

