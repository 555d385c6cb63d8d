"""The "wide float": an exact-or-sticky intermediate value passed between arithmetic units.

Dividers, multipliers and integer-to-float converters produce a wide float; :class:`FloatRound`
(:mod:`qaccel.rtl.arith.float_round`) rounds one to a :class:`~qaccel.model.floatfmt.FloatFormat`
and gives the rounded value back as a wide float of the same layout, so roundings chain.
"""

from __future__ import annotations

from amaranth.hdl import signed, unsigned
from amaranth.lib import data

from qaccel.model.validate import check_int
from qaccel.rtl.arith.float_unpack import FloatClass

__all__ = ["MAX_EXP_WIDTH", "MAX_SIG_WIDTH", "wide_float_layout"]

#: Widest ``sig`` field :func:`wide_float_layout` accepts.
MAX_SIG_WIDTH = 256
#: Widest ``exp`` field :func:`wide_float_layout` accepts.
MAX_EXP_WIDTH = 32


def wide_float_layout(sig_width: int, exp_width: int) -> data.StructLayout:
    """Return the layout of a wide float with a ``sig_width``-bit significand.

    Fields, from bit 0 up (``W = sig_width``, ``E = exp_width``; ``W + E + 5`` bits in all:
    ``sign`` at bit 0, ``exp`` at 1, ``sig`` at ``E + 1``, ``sticky`` at ``E + W + 1``,
    ``cls`` at ``E + W + 2``):

    ``sign`` : :py:`unsigned(1)`
        1 for negative values (and for -0, -inf, a negative NaN).
    ``exp`` : :py:`signed(exp_width)`
        Exponent of the significand's most significant bit: ``sig[W-1]`` weighs ``2**exp``.
    ``sig`` : :py:`unsigned(sig_width)`
        Significand, normalised: its top bit is set for every finite non-zero value.
    ``sticky`` : :py:`unsigned(1)`
        1 if the exact value has non-zero bits below ``sig``'s least significant bit, i.e.
        its magnitude lies strictly between ``sig * 2**(exp - W + 1)`` and
        ``(sig + 1) * 2**(exp - W + 1)``; 0 if ``sig`` holds the value exactly.
    ``cls`` : :class:`~qaccel.rtl.arith.float_unpack.FloatClass`
        ``ZERO`` (``exp``, ``sig`` and ``sticky`` are ignored), ``NORMAL`` (finite and
        non-zero: ``|value| = sig * 2**(exp - W + 1)``, plus the sticky fraction),
        ``INF`` or ``NAN`` (``exp``, ``sig`` and ``sticky`` ignored; NaNs carry no payload).
        A wide float has no subnormals; ``SUBNORMAL`` means the same as ``NORMAL`` on an input
        (so a normalised :class:`~qaccel.rtl.arith.float_unpack.FloatUnpack` output converts field
        by field, its significand shifted to the top of ``sig``), and on the ``value`` output of
        :class:`~qaccel.rtl.arith.float_round.FloatRound` it marks a result that is subnormal in the
        selected format.

    Raises :exc:`TypeError` or :exc:`ValueError` (naming the parameter) unless ``sig_width``
    is an integer in ``[1, MAX_SIG_WIDTH]`` and ``exp_width`` one in ``[2, MAX_EXP_WIDTH]``.
    """
    check_int("sig_width", sig_width, 1, MAX_SIG_WIDTH)
    check_int("exp_width", exp_width, 2, MAX_EXP_WIDTH)
    return data.StructLayout({
        "sign": unsigned(1),
        "exp": signed(exp_width),
        "sig": unsigned(sig_width),
        "sticky": unsigned(1),
        "cls": FloatClass,
    })
