"""The reciprocal of a divisor significand: a small iterative restoring divider, one at a time."""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.validate import check_int
from qaccel.rtl.arith.wide_float import MAX_SIG_WIDTH

__all__ = ["Reciprocal"]


class Reciprocal(wiring.Component):
    """Compute ``r = floor((2**K - 1) / d)``, ``K = d_width + r_width - 1``: the reciprocal
    significand :class:`~qaccel.rtl.arith.reciprocal_divide.ReciprocalDivide` takes with a divisor
    significand ``d`` (``d_width = b_width``, ``r_width = q_width + 1`` there).

    ``d`` must be normalised, ``2**(d_width - 1) <= d < 2**d_width`` (otherwise ``r`` is
    unspecified); then ``2**(r_width - 1) <= r < 2**r_width`` (the top bit is always set) and
    ``r * d = 2**K - 1 - rho`` with ``0 <= rho < d``: ``r`` lies ``(1 + rho) / d`` below
    ``2**K / d``, more than 0 and at most 1 (exactly 1 for a power of two ``d``, which keeps
    ``r`` within ``r_width`` bits).

    A restoring division of the all-ones dividend ``2**K - 1`` by ``d``: each quotient digit
    compares the shifted partial remainder ``2 * rem + 1`` with ``d`` and subtracts if it is
    not smaller (a ``d_width + 2``-bit subtractor and a ``d_width``-bit multiplexer).
    ``bits_per_cycle`` digits are chained per cycle, for :attr:`cycles`
    ``= ceil(r_width / bits_per_cycle)`` cycles; the partial remainder starts at the
    dividend's bits above the ``cycles * bits_per_cycle`` digits made (any extra leading digits
    are zeros and shift out of ``r``). Registers: ``d`` (latched), the partial remainder,
    ``r`` (a shift register) and a cycle counter. Measured alone for ``d_width = 24``,
    ``r_width = 27`` on an LFE5U-25F speed 6 (Yosys ``synth_ecp5``, LUT4 counting a CCU2C as
    two; nextpnr seeds 1-3): 67 LUT4 and 81 FF at 213-227 MHz with one digit per cycle, 115
    LUT4 at 111-117 MHz with two, 213 LUT4 at 59-60 MHz with four (each digit adds a carry
    chain and a multiplexer level to the path).

    Handshake: ``start`` high in cycle *n* takes ``d``; ``busy`` is high in cycles *n + 1* to
    *n + cycles*, ``done`` is high in cycle *n +* :attr:`latency` (``cycles + 1``) alone, and
    ``r`` holds the reciprocal from then until the next ``start`` (inclusive). A ``start``
    while busy abandons the running reciprocal (no ``done`` for it) and begins the new one, so
    starts may come back to back, one per :attr:`latency` cycles, ``start`` in a ``done``
    cycle included. Reset: not busy, no ``done``; ``r`` is unspecified until the first
    ``done``.

    Parameters
    ----------
    d_width : :class:`int`
        Width of ``d``, in ``[1, MAX_SIG_WIDTH]``.
    r_width : :class:`int`
        Width of ``r``, in ``[1, MAX_SIG_WIDTH + 1]``.
    bits_per_cycle : :class:`int`
        Quotient digits per cycle, in ``[1, r_width]``.

    Raises
    ------
    :exc:`TypeError`
        If a parameter is not an integer.
    :exc:`ValueError`
        If a parameter is out of its range.

    Members
    -------
    start : :py:`In(1)`
    d : :py:`In(unsigned(d_width))`
    busy : :py:`Out(1)`
    done : :py:`Out(1)`
    r : :py:`Out(unsigned(r_width))`
    """

    def __init__(self, *, d_width: int, r_width: int, bits_per_cycle: int = 1):
        self._d_width = check_int("d_width", d_width, 1, MAX_SIG_WIDTH)
        self._r_width = check_int("r_width", r_width, 1, MAX_SIG_WIDTH + 1)
        self._bits_per_cycle = check_int("bits_per_cycle", bits_per_cycle, 1, r_width)
        super().__init__({
            "start": In(1),
            "d": In(d_width),
            "busy": Out(1),
            "done": Out(1),
            "r": Out(r_width),
        })

    @property
    def d_width(self) -> int:
        """Width of the divisor significand ``d``."""
        return self._d_width

    @property
    def r_width(self) -> int:
        """Width of the reciprocal ``r``."""
        return self._r_width

    @property
    def bits_per_cycle(self) -> int:
        """Quotient digits made per cycle."""
        return self._bits_per_cycle

    @property
    def cycles(self) -> int:
        """Iteration cycles: ``ceil(r_width / bits_per_cycle)``."""
        return self.cycles_for(r_width=self._r_width, bits_per_cycle=self._bits_per_cycle)

    @property
    def latency(self) -> int:
        """Cycles from ``start`` to ``done``: :attr:`cycles` ``+ 1``."""
        return self.latency_for(r_width=self._r_width, bits_per_cycle=self._bits_per_cycle)

    @staticmethod
    def cycles_for(*, r_width: int, bits_per_cycle: int = 1) -> int:
        """:attr:`cycles` of a unit with these (valid) parameters, without building it."""
        return -(-r_width // bits_per_cycle)

    @staticmethod
    def latency_for(*, r_width: int, bits_per_cycle: int = 1) -> int:
        """:attr:`latency` of a unit with these (valid) parameters, without building it."""
        return Reciprocal.cycles_for(r_width=r_width, bits_per_cycle=bits_per_cycle) + 1

    def elaborate(self, platform):
        m = Module()
        dw, bpc, cycles = self._d_width, self._bits_per_cycle, self.cycles
        k = dw + self._r_width - 1                 # the dividend 2**k - 1 has k bits, all ones
        zeros = max(0, cycles * bpc - k)           # leading digits above the dividend's top bit
        div = Signal(dw, name="div", reset_less=True)
        rem = Signal(dw, name="rem", reset_less=True)
        quo = Signal(self._r_width, name="quo", reset_less=True)
        count = Signal(range(cycles + 1))
        first = Signal(name="first")
        m.d.comb += first.eq(count == cycles)
        done = Signal(name="done_reg")

        part, digits = rem, []
        for i in range(bpc):
            bit_in = ~first if i < zeros else 1       # the dividend's bit: 0 above its top
            shifted = Cat(bit_in, part)               # 2 * rem + bit, < 2 * div
            diff = Signal(signed(dw + 2), name=f"diff{i}")
            m.d.comb += diff.eq(shifted - div)
            digit = ~diff[-1]
            nxt = Signal(dw, name=f"rem{i + 1}")
            m.d.comb += nxt.eq(Mux(digit, diff[:dw], shifted[:dw]))
            part = nxt
            digits.insert(0, digit)                   # the first digit is the most significant

        # the partial remainder steps every cycle (don't care when idle): no enable in its path
        m.d.sync += [done.eq((count == 1) & ~self.start),
                     rem.eq(Mux(self.start, (1 << max(0, k - cycles * bpc)) - 1, part))]
        with m.If(self.start):
            m.d.sync += [div.eq(self.d), count.eq(cycles)]
        with m.Elif(count != 0):
            m.d.sync += [quo.eq(Cat(*digits, quo)), count.eq(count - 1)]
        m.d.comb += [self.busy.eq(count != 0), self.done.eq(done), self.r.eq(quo)]
        return m
