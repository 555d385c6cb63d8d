"""Admission control of the MatMulNBits v2 engine's scale lanes: the accumulator scoreboard and
the output credit, decided a cycle ahead and registered, beside the source that feeds the
lanes (so no lane signal lies on the source's own control paths)."""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.validate import check_int

__all__ = ["LaneAdmission"]


class LaneAdmission(wiring.Component):
    """Decide, one cycle ahead, whether the beat a source will offer to its
    :class:`~qaccel.rtl.nbits.scale_lane.ScaleLane` (or several in lock step) may be admitted.

    A lane has no flow control on its input: every beat it is given enters its pipeline. Two
    rules keep it correct, and this unit enforces both:

    - **Scoreboard**: a beat that reads its accumulator (``first`` clear) may not be admitted
      while a beat that writes the same ``addr`` (``last`` clear) was admitted in the
      previous ``window`` cycles (``window = lane.recurrence - 1``, the adder's latency), so
      beats of one ``addr`` are at least ``recurrence`` cycles apart.
    - **Credit**: a ``last`` beat is admitted only while fewer than ``credits`` (the lane's
      ``fifo_depth``) results are admitted and not yet released (``release``: a result
      transferred on the lane's ``o``; its room counts a cycle later).

    The source presents the beat it will offer in the next cycle in two versions: ``stay``
    if no beat is admitted in this cycle and ``advance`` if one is, each as ``choices``
    candidates of which ``stay_pick`` / ``advance_pick`` names the one offered (``valid``
    low: none), and ``take`` with ``beat``: the beat admitted in this cycle. Every candidate
    is checked in parallel (``stay_ok``, ``advance_ok``: a verdict each), so a source whose
    picks are registers may select its verdict beside each of its loads, one LUT from them.
    ``ok`` is a register: high when the beat offered in this cycle may be admitted, so the
    source admits it as ``take = offered & ok``; ``ok_next`` is the value ``ok`` takes in
    the next cycle (the verdict picked). The loop from ``ok`` through ``take`` back to
    ``ok`` is two LUTs deep. A synchronous reset forgets every beat in flight and every
    credit (reset the lanes with it).

    Parameters
    ----------
    addr_width : :class:`int`
        Bits of ``addr``, 1..16.
    window : :class:`int`
        Cycles a write blocks a read of its ``addr``, 1..64 (``ScaleLane.recurrence - 1``).
    credits : :class:`int`
        Results that may be outstanding, 1..1024 (``ScaleLane.fifo_depth``).
    choices : :class:`int`
        Candidates per version, 1..4.

    Members
    -------
    stay, advance : :py:`In(ArrayLayout(StructLayout({"valid": 1, "addr":
        unsigned(addr_width), "first": 1, "last": 1}), choices))`
    stay_pick, advance_pick : :py:`In(range(choices))`
    take : :py:`In(1)`
    beat : :py:`In(StructLayout({"addr": unsigned(addr_width), "last": 1}))`
    release : :py:`In(1)`
    stay_ok, advance_ok : :py:`Out(choices)`
    ok, ok_next : :py:`Out(1)`
    """

    def __init__(self, *, addr_width: int, window: int, credits: int, choices: int = 1):
        self._addr_width = check_int("addr_width", addr_width, 1, 16)
        self._window = check_int("window", window, 1, 64)
        self._credits = check_int("credits", credits, 1, 1024)
        self._choices = check_int("choices", choices, 1, 4)
        cand = data.ArrayLayout(data.StructLayout({"valid": 1, "addr": unsigned(addr_width),
                                                   "first": 1, "last": 1}), choices)
        super().__init__({
            "stay": In(cand), "advance": In(cand),
            "stay_pick": In(range(choices)), "advance_pick": In(range(choices)),
            "stay_ok": Out(choices), "advance_ok": Out(choices),
            "take": In(1),
            "beat": In(data.StructLayout({"addr": unsigned(addr_width), "last": 1})),
            "release": In(1),
            "ok": Out(1), "ok_next": Out(1),
        })

    @classmethod
    def for_lane(cls, lane, choices: int = 1) -> LaneAdmission:
        """The admission of ``lane`` (a :class:`~qaccel.rtl.nbits.scale_lane.ScaleLane`)."""
        return cls(addr_width=lane.addr_width, window=lane.recurrence - 1,
                   credits=lane.fifo_depth, choices=choices)

    @property
    def window(self) -> int:
        return self._window

    @property
    def credits(self) -> int:
        return self._credits

    def elaborate(self, platform):
        m = Module()
        W = self._window
        beat = self.beat
        # beats admitted 1 .. W - 1 cycles ago that write their address (ages 2 .. W next
        # cycle; this cycle's beat is age 1 then)
        writes = Signal(max(1, W - 1))
        addrs = [Signal(self._addr_width, name=f"addr_a{k + 1}", reset_less=True)
                 for k in range(W - 1)]
        if W > 1:
            m.d.sync += [writes.eq(Cat(self.take & ~beat.last, writes[:-1])),
                         addrs[0].eq(beat.addr)]
            m.d.sync += [addrs[k].eq(addrs[k - 1]) for k in range(1, W - 1)]

        # `held`: results admitted and not yet released, a release counting a cycle later;
        # whether one more (`room`) or two more (`room2`) fit, as registers decided with it
        C = self._credits
        held = Signal(range(C + 1))
        room, room2 = Signal(init=1), Signal(init=C > 1)
        held_next = held + (self.take & beat.last) - self.release
        m.d.sync += [held.eq(held_next), room.eq(held_next < C), room2.eq(held_next < C - 1)]
        room_after = Mux(beat.last, room2, room)        # with `beat` admitted

        def allowed(cand, taken: bool):
            hits = [writes[k] & (addrs[k] == cand.addr) for k in range(W - 1)]
            if taken:
                hits.append(~beat.last & (beat.addr == cand.addr))
            busy = Cat(*hits).any() if hits else 0
            return (cand.valid & ~(~cand.first & busy)
                    & (~cand.last | (room_after if taken else room)))

        for i in range(self._choices):
            m.d.comb += [self.stay_ok[i].eq(allowed(self.stay[i], False)),
                         self.advance_ok[i].eq(allowed(self.advance[i], True))]
        m.d.comb += self.ok_next.eq(Mux(self.take,
                                        self.advance_ok.bit_select(self.advance_pick, 1),
                                        self.stay_ok.bit_select(self.stay_pick, 1)))
        m.d.sync += self.ok.eq(self.ok_next)
        return m
