"""One IEEE float32 operation on bit patterns, rounded to nearest even: ``y = f32(a * b)``,
``f32(a + b)`` or ``f32(a - b)``."""

from __future__ import annotations

from amaranth.hdl import Module, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.floatfmt import FORMATS
from qaccel.rtl.decode import Decode
from qaccel.rtl.decode import min_exp_width as decode_exp_width
from qaccel.rtl.float_add import FloatAdd
from qaccel.rtl.float_mul import FloatMul
from qaccel.rtl.float_round import FloatRound
from qaccel.rtl.float_round import min_exp_width as round_exp_width

__all__ = ["LATENCY", "OPS", "Binary32"]

#: The operations :class:`Binary32` computes.
OPS = ("mul", "add", "sub")
#: :attr:`Binary32.latency` of each operation.
LATENCY = {"mul": 6, "add": 7, "sub": 7}
_SIG = 24          # float32 significand with the hidden bit
_SUM = _SIG + 2    # sum significand kept by FloatAdd: a guard bit and a round bit, plus sticky


class Binary32(wiring.Component):
    """``y = f32(a op b)`` on float32 bit patterns, as NumPy's float32 arithmetic gives it.

    ``op`` is ``"mul"``, ``"add"`` or ``"sub"`` (elaboration time). The result is the exact
    result rounded to nearest even, with IEEE overflow to infinity and gradual underflow
    (subnormal operands and results included), and the special values of x86-64 SSE, which
    NumPy uses: ``0 * inf`` and ``inf - inf`` give the default NaN, ``0xFFC00000``; a NaN
    operand gives a NaN with that operand's sign (``a``'s if both are); an exact cancellation
    gives +0, and ``(-0) + (-0)`` gives -0. NaN results are the canonical quiet NaN with that
    sign (``0x7FC00000`` / ``0xFFC00000``): payloads are not carried (NumPy keeps them).

    Built from the verified blocks: :class:`~qaccel.rtl.decode.Decode` (float32 code to an
    exact wide float), :class:`~qaccel.rtl.float_mul.FloatMul` (exact product) or
    :class:`~qaccel.rtl.float_add.FloatAdd` (sum truncated to 26 bits with a sticky bit,
    enough for a correct rounding), and :class:`~qaccel.rtl.float_round.FloatRound`.

    Latency: :attr:`latency` cycles from ``a``/``b`` to ``y`` (1 + 2 + 3 = 6 for ``mul``,
    1 + 3 + 3 = 7 for ``add``/``sub``: decode registered, the operation, the rounding), one
    result per cycle, no handshake (a stream wrapper or a valid bit delayed by ``latency``
    adds one).

    Members
    -------
    a, b : :py:`In(unsigned(32))`
        The operands' bit patterns.
    y : :py:`Out(unsigned(32))`
        The result's bit pattern.
    """

    def __init__(self, op: str):
        if op not in OPS:
            raise ValueError(f"op must be one of {', '.join(OPS)}, not {op!r}")
        self._op = op
        f32 = FORMATS["float32"]
        self._exp = max(decode_exp_width([f32]), round_exp_width([f32]))
        E = self._exp
        self._dec_a = Decode(("float32",), sig_width=_SIG, exp_width=E, latency=1)
        self._dec_b = Decode(("float32",), sig_width=_SIG, exp_width=E, latency=1)
        if op == "mul":
            self._core = FloatMul(a_width=_SIG, b_width=_SIG, exp_width=E, latency=2)
            width = 2 * _SIG
        else:
            self._core = FloatAdd(a_width=_SIG, b_width=_SIG, exp_width=E, out_width=_SUM,
                                  latency=3)
            width = _SUM
        self._round = FloatRound(("float32",), sig_width=width, exp_width=E + 1, latency=3)
        self._latency = self._dec_a.latency + self._core.latency + self._round.latency
        assert self._latency == LATENCY[op]
        super().__init__({"a": In(unsigned(32)), "b": In(unsigned(32)),
                          "y": Out(unsigned(32))})

    @property
    def op(self) -> str:
        """``"mul"``, ``"add"`` or ``"sub"``."""
        return self._op

    @property
    def latency(self) -> int:
        """Cycles from operands on ``a``/``b`` to their result on ``y``."""
        return self._latency

    def elaborate(self, platform):
        m = Module()
        m.submodules.dec_a = dec_a = self._dec_a
        m.submodules.dec_b = dec_b = self._dec_b
        m.submodules.core = core = self._core
        m.submodules.round = rnd = self._round
        m.d.comb += [dec_a.code.eq(self.a), dec_a.fmt.eq(0),
                     dec_b.code.eq(self.b), dec_b.fmt.eq(0),
                     core.a.eq(dec_a.o), core.b.eq(dec_b.o)]
        if self._op == "mul":
            m.d.comb += rnd.i.eq(core.p)
        else:
            m.d.comb += [core.sub.eq(int(self._op == "sub")), rnd.i.eq(core.s)]
        m.d.comb += [rnd.fmt.eq(0), rnd.saturate.eq(0), self.y.eq(rnd.code)]
        return m
