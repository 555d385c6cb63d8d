"""A ScaleLane fed as the v2 engine feeds its lanes, for the lane's own tests: a stream input
with back-pressure, one holding register and a LaneAdmission deciding a cycle ahead."""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from qaccel.rtl.nbits.lane_admission import LaneAdmission
from qaccel.rtl.nbits.scale_lane import ScaleLane


class AdmittedLane(wiring.Component):
    """``lane`` behind a one-beat holding register and its :class:`LaneAdmission`.

    A beat transferred on ``i`` waits in the register and enters the lane in the next cycle
    at the earliest, when the admission allows it; ``i.ready`` is high while the register is
    empty or its beat enters the lane. ``o`` is the lane's. Figures: :attr:`latency` counts
    from the transfer on ``i`` (the lane's plus the register's cycle); the others are the
    lane's."""

    def __init__(self, lane: ScaleLane):
        self.lane = lane
        self.admission = LaneAdmission.for_lane(lane)
        super().__init__({"i": In(stream.Signature(lane.i.payload.shape())),
                          "o": Out(stream.Signature(lane.o.payload.shape()))})

    def __getattr__(self, name):
        if name in ("depth", "recurrence", "read_latency", "fifo_depth", "addr_width",
                    "adder_cycle", "_adder", "_mul1", "_mul2"):
            return getattr(self.lane, name)
        raise AttributeError(name)

    @property
    def latency(self) -> int:
        return self.lane.latency + 1

    def elaborate(self, platform):
        m = Module()
        m.submodules.lane = lane = self.lane
        m.submodules.admission = adm = self.admission
        held = Signal.like(self.i.payload)
        held_valid = Signal()
        take = held_valid & adm.ok
        m.d.comb += [self.i.ready.eq(~held_valid | take),
                     lane.i.payload.eq(held), lane.i.valid.eq(take),
                     adm.take.eq(take), adm.beat.addr.eq(held.addr),
                     adm.beat.last.eq(held.last),
                     adm.release.eq(lane.o.valid & lane.o.ready)]
        m.d.sync += held_valid.eq(Mux(self.i.ready, self.i.valid, held_valid))
        with m.If(self.i.ready):
            m.d.sync += held.eq(self.i.payload)
        incoming, kept = (adm.advance[0], adm.stay[0])
        m.d.comb += [incoming.valid.eq(self.i.valid), incoming.addr.eq(self.i.payload.addr),
                     incoming.first.eq(self.i.payload.first),
                     incoming.last.eq(self.i.payload.last),
                     kept.valid.eq(held_valid | self.i.valid),
                     kept.addr.eq(Mux(held_valid, held.addr, self.i.payload.addr)),
                     kept.first.eq(Mux(held_valid, held.first, self.i.payload.first)),
                     kept.last.eq(Mux(held_valid, held.last, self.i.payload.last))]
        wiring.connect(m, lane.o, wiring.flipped(self.o))
        return m
