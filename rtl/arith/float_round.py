"""Round a wide float to one of several floating-point formats, chosen at run time."""

from __future__ import annotations

from collections.abc import Sequence

from amaranth.hdl import Cat, Const, Module, Mux, Shape, Signal, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.floatfmt import FloatFormat, float_format
from qaccel.model.validate import check_int
from qaccel.rtl.arith.float_unpack import FloatClass
from qaccel.rtl.arith.pipeline import choice_index, stage
from qaccel.rtl.arith.wide_float import MAX_EXP_WIDTH, MAX_SIG_WIDTH, wide_float_layout

__all__ = ["LATENCIES", "FloatRound", "min_exp_width", "min_sig_width"]

#: Latencies :class:`FloatRound` supports (register stages).
LATENCIES = (0, 1, 2, 3, 4, 5, 6, 7, 8)


def min_sig_width(formats: Sequence[FloatFormat]) -> int:
    """Return the narrowest ``sig_width`` :class:`FloatRound` accepts for ``formats``.

    That is the widest significand among them (``mbits + 1``), so that every rounded value
    fits a wide float exactly.
    """
    return max(f.mbits + 1 for f in formats)


def min_exp_width(formats: Sequence[FloatFormat]) -> int:
    """Return the narrowest ``exp_width`` :class:`FloatRound` accepts for ``formats``.

    The ``exp`` field must hold the exponent of every finite value of every format: from the
    smallest subnormal's ``emin - mbits`` up to ``emax``.
    """
    lo = min(f.emin - f.mbits for f in formats)
    hi = max(f.emax for f in formats)
    return Shape.cast(range(lo, hi + 1)).width + (0 if lo < 0 else 1)


class FloatRound(wiring.Component):
    """Round a wide float to one of the carried floating-point formats, ties to even.

    The formats an instance can produce are fixed at elaboration (``formats``); the input
    ``fmt`` selects one of them in every cycle by its index, and ``saturate`` chooses the
    overflow rule. The input ``i`` is a wide float
    (:func:`~qaccel.rtl.arith.wide_float.wide_float_layout`): a sign, an exponent, a normalised
    ``sig_width``-bit significand and a sticky bit standing for any non-zero bits below it.
    The result is the exact value rounded once to the selected format, as a NumPy / ml_dtypes
    cast (``astype``, which ONNX's reference operators use) rounds a float32 or float64 that
    holds the value exactly. (ml_dtypes casts a float64 to bfloat16, float8 and float4 through
    float32, which rounds twice; two units in a row reproduce that, see ``value``.)

    * Finite values round to nearest, ties to even, on the format's grid, subnormals included
      (a sticky input is never a tie). Values that round to zero keep their sign, except in
      formats without -0 (the "fnuz" formats), which give +0.
    * A finite result above the format's largest finite value ``max`` overflows. With
      ``saturate=0`` it becomes ±inf (formats with infinities: float64, float32, float16,
      bfloat16, float8e5m2), the format's NaN (float8e4m3fn, float8e4m3fnuz, float8e5m2fnuz)
      or ±max (float4e2m1, which has neither). With ``saturate=1`` it becomes ±max in every
      format, as ONNX's ``saturate_cast`` clips the value before rounding.
    * ±inf gives ±max with ``saturate=1``, else what an overflow gives.
    * NaN gives the format's canonical quiet NaN with the input's sign (``0x7E00`` and
      ``0xFE00`` for float16), the sign-bit-only code for the fnuz formats, and for float4e2m1,
      as ml_dtypes casts it, ``0x8`` (-0) for a positive NaN and ``0x0`` (+0) for a negative
      one. NaN payloads are not carried (NumPy's float16 cast keeps them; this unit does not).

    ``saturate`` applies to every format alike (it is :meth:`FloatFormat.encode
    <qaccel.model.floatfmt.FloatFormat.encode>`'s ``saturate``); ONNX uses it for the float8
    formats only. An ``fmt`` of ``len(formats)`` or more selects the last format.

    The outputs are the code of the result (``code``) and the same result as a wide float
    (``value``), exact, with ``sticky = 0``, so that it can be rounded again (a double
    rounding) or converted to an integer. ``value`` decodes ``code``: ``value.sign`` is the
    code's sign bit; ``cls`` is ``ZERO``, ``SUBNORMAL`` (a subnormal of the selected format),
    ``NORMAL``, ``INF`` or ``NAN``; ``exp`` and ``sig`` are 0 for the classes without a
    magnitude. float4e2m1's NaN codes thus come back as a zero.

    The result is the correct rounding when the input is exact (``sticky = 0``) or its
    significand has a bit more than the selected format's (``sig_width > mbits + 1``: a round
    bit). With ``sig_width == mbits + 1`` a sticky input whose result is a normal number is
    truncated (the sticky bit cannot tell on which side of a tie the value lies); a
    subnormal result still honours it. A finite input with an unnormalised significand
    gives an unspecified result.

    Latency is ``latency`` cycles (0: combinational, no clock): a value applied in cycle *n*
    is rounded on the outputs in cycle *n + latency*. Throughput is one value per cycle.
    There is no handshake; a stream wrapper adds one. The stages are: (1) select the format's
    constants and compute the rounding position, (2) round the significand (a
    ``sig_width + 4``-bit increment), (3) encode, detect overflow and handle the special
    values. ``latency`` 1 registers the outputs, 2 also the significand after rounding, 3 also
    the rounding position, 4 also the increment decision (before the adder), 5 also the
    encoding's fields (before the per-format encoding), 6 also the mask of the bits at and
    below the rounding position (before the round and sticky bits' reductions), 7 also the
    distance below the format's smallest exponent (before the rounding position), 8 also the
    subnormal shift and the exponent compares (before the mantissa field's shift).

    Parameters
    ----------
    formats : :class:`tuple` of :class:`~qaccel.model.floatfmt.FloatFormat`
        The formats the unit can round to, in ``fmt`` order; each may also be given by name
        or dtype (see :func:`~qaccel.model.floatfmt.float_format`). Non-empty, no repeats.
    sig_width : :class:`int`
        Width of ``sig`` in ``i`` and ``value``: at least the widest significand of
        ``formats`` (:func:`min_sig_width`), at most
        :data:`~qaccel.rtl.arith.wide_float.MAX_SIG_WIDTH` (256).
    exp_width : :class:`int`
        Width of ``exp`` in ``i`` and ``value``: at least :func:`min_exp_width` (so every
        finite value of every format fits), at most
        :data:`~qaccel.rtl.arith.wide_float.MAX_EXP_WIDTH` (32). Input exponents may span the whole
        field: large ones overflow, small ones underflow.
    latency : :class:`int`
        Register stages, one of :data:`LATENCIES`.

    Raises
    ------
    :exc:`TypeError`
        If ``formats`` is not a tuple or list of formats, or a width or ``latency`` is not an
        integer.
    :exc:`ValueError`
        If ``formats`` is empty, repeats a format or names an unknown one, a width is out of
        range, or ``latency`` is not in :data:`LATENCIES`.

    Members
    -------
    i : :py:`In(wide_float_layout(sig_width, exp_width))`
        The value to round.
    fmt : :py:`In(unsigned(max(1, (len(formats) - 1).bit_length())))`
        Index of the target format in ``formats``.
    saturate : :py:`In(1)`
        Clip to ±max instead of overflowing to inf or NaN.
    code : :py:`Out(unsigned(max(f.bits for f in formats)))`
        The result's code, right-aligned; the bits above the selected format's width are 0.
    value : :py:`Out(wide_float_layout(sig_width, exp_width))`
        The result as an exact wide float.
    """

    def __init__(self, formats, *, sig_width: int, exp_width: int, latency: int = 3):
        if not isinstance(formats, (tuple, list)):
            raise TypeError(f"formats must be a tuple of FloatFormats, not {formats!r}")
        if not formats:
            raise ValueError("formats must name at least one format, not ()")
        fmts = tuple(float_format(f, param=f"formats[{k}]") for k, f in enumerate(formats))
        for k, f in enumerate(fmts):
            if f in fmts[:k]:
                raise ValueError(f"formats must be distinct, not {tuple(g.name for g in fmts)!r}"
                                 f" ({f.name} appears twice)")
        self._formats = fmts
        check_int("sig_width", sig_width)
        lo = min_sig_width(fmts)
        if not lo <= sig_width <= MAX_SIG_WIDTH:
            raise ValueError(f"sig_width must be in [{lo}, {MAX_SIG_WIDTH}] for formats "
                             f"{', '.join(f.name for f in fmts)}, not {sig_width}")
        check_int("exp_width", exp_width)
        lo = min_exp_width(fmts)
        if not lo <= exp_width <= MAX_EXP_WIDTH:
            raise ValueError(f"exp_width must be in [{lo}, {MAX_EXP_WIDTH}] for formats "
                             f"{', '.join(f.name for f in fmts)}, not {exp_width}")
        self._sig_width = sig_width
        self._exp_width = exp_width
        self._latency = check_int("latency", latency, min(LATENCIES), max(LATENCIES))
        layout = wide_float_layout(sig_width, exp_width)
        super().__init__({
            "i": In(layout),
            "fmt": In(unsigned(max(1, (len(fmts) - 1).bit_length()))),
            "saturate": In(1),
            "code": Out(unsigned(max(f.bits for f in fmts))),
            "value": Out(layout),
        })

    @property
    def formats(self) -> tuple[FloatFormat, ...]:
        """The formats ``fmt`` selects from, in index order."""
        return self._formats

    @property
    def sig_width(self) -> int:
        """Width of the wide floats' significand."""
        return self._sig_width

    @property
    def exp_width(self) -> int:
        """Width of the wide floats' exponent."""
        return self._exp_width

    @property
    def latency(self) -> int:
        """Cycles from a value on ``i`` to its rounding on ``code`` and ``value``."""
        return self._latency

    def index(self, fmt) -> int:
        """Return the ``fmt`` input value that selects ``fmt`` (a format, name or dtype).

        Raises :exc:`ValueError` if the unit does not carry ``fmt``.
        """
        return choice_index(self._formats, float_format(fmt))

    def elaborate(self, platform):
        m = Module()
        fmts = self._formats
        n = len(fmts)
        W = self._sig_width
        ew = self._exp_width + 2  # internal exponents: input range, +1 carry, differences
        p_max = min_sig_width(fmts)

        def select(sel, shape, values, name):
            """A signal holding ``values[sel]`` (the last one for larger ``sel``)."""
            s = Signal(shape, name=name)
            with m.Switch(sel):
                for k, v in enumerate(values):
                    with m.Case(k) if k < n - 1 else m.Default():
                        m.d.comb += s.eq(v)
            return s

        exp_shape = signed(ew)

        # -- stage 1: the format's constants, the rounding position ---------------------------
        # `cut` is the position of the round bit in s2 = {0, 0, sig, 0}: sig[j] is s2[j + 1],
        # so a normal result keeps sig[W - p:] and cut = W - p; a result d places below emin
        # keeps d bits fewer. d is clamped at p + 1, where even the round bit is 0.
        x = self.i
        e_in = Signal(exp_shape)
        m.d.comb += e_in.eq(x.exp)
        emin1 = select(self.fmt, exp_shape, [f.emin for f in fmts], "emin1")
        dmax1 = select(self.fmt, range(p_max + 2), [f.mbits + 2 for f in fmts], "dmax1")
        base1 = select(self.fmt, range(W), [W - f.mbits - 1 for f in fmts], "base1")
        below_emin = Signal(signed(ew + 1))
        m.d.comb += below_emin.eq(emin1 - e_in)
        e = stage(m, self._latency >= 7, "emin", below_emin=below_emin, dmax=dmax1, base=base1,
                  sign=x.sign, exp=e_in, sig=x.sig, sticky=x.sticky, cls=x.cls, fmt=self.fmt,
                  saturate=self.saturate)
        d = Signal(range(p_max + 2))
        m.d.comb += d.eq(Mux(e.below_emin < 0, 0,
                             Mux(e.below_emin > e.dmax, e.dmax, e.below_emin)))
        cut = Signal(range(W + 2))
        m.d.comb += cut.eq(e.base + d)

        a = stage(m, self._latency >= 3, "s1",
                   sign=e.sign, exp=e.exp, sig=e.sig, sticky=e.sticky, cls=e.cls, cut=cut,
                   fmt=e.fmt, saturate=e.saturate)

        # -- stage 2: round the significand at `cut` ------------------------------------------
        below = Signal(W + 3)                                      # s2 bits at and below cut
        m.d.comb += below.eq(Cat(*(a.cut >= j for j in range(W + 3))))
        t = stage(m, self._latency >= 6, "thermo", below=below, sig=a.sig, sticky=a.sticky,
                  sign=a.sign, exp=a.exp, cls=a.cls, fmt=a.fmt, saturate=a.saturate)
        s2 = Cat(Const(0, 1), t.sig, Const(0, 2))                  # W + 3 bits
        round_bit = (s2 & t.below & ~(t.below >> 1)).any()
        sticky = (s2 & (t.below >> 1)).any() | t.sticky
        lsb = (s2 & Cat(Const(1, 1), t.below) & ~t.below).any()
        inc = round_bit & (sticky | lsb)
        r = stage(m, self._latency >= 4, "inc", kept=s2 | t.below, below=t.below, inc=inc,
                  sign=t.sign, exp=t.exp, cls=t.cls, fmt=t.fmt, saturate=t.saturate)
        total = Signal(W + 4)
        m.d.comb += total.eq((r.kept + r.inc) & ~r.below)
        # rounded up to 2**(exp + 1): total[W + 1], decided without the adder's carry chain
        # (an increment carries out of bits 0..W when they are all ones), so that the
        # exponent's increment runs beside the significand's, not after it
        carry = r.inc & r.kept[:W + 1].all() & ~r.below[W + 1]
        rsig = Signal(W)
        m.d.comb += rsig.eq(total[1:W + 1] | (carry << (W - 1)))
        rexp = Signal(exp_shape)
        m.d.comb += rexp.eq(r.exp + carry)
        finite = (r.cls == FloatClass.NORMAL) | (r.cls == FloatClass.SUBNORMAL)
        nonzero = finite & (total[W] | carry)

        b = stage(m, self._latency >= 2, "s2",
                   sign=r.sign, exp=rexp, sig=rsig, nonzero=nonzero, cls=r.cls, fmt=r.fmt,
                   saturate=r.saturate)

        # -- stage 3: encode ----------------------------------------------------------------
        emin3 = select(b.fmt, exp_shape, [f.emin for f in fmts], "emin3")
        emax3 = select(b.fmt, exp_shape, [f.emax for f in fmts], "emax3")
        bias3 = select(b.fmt, exp_shape, [f.bias for f in fmts], "bias3")
        top = select(b.fmt, p_max, [b.sig[W - f.mbits - 1:] for f in fmts], "top")
        max_mant = select(b.fmt, p_max, [f.max_code & f.mant_mask for f in fmts], "max_mant")
        mant_mask = select(b.fmt, p_max, [f.mant_mask for f in fmts], "mant_mask")
        normal = b.exp >= emin3
        sub_shift = Signal(range(p_max + 1))                       # exp < emin: emin - exp
        m.d.comb += sub_shift.eq(Mux(normal, 0, emin3 - b.exp))
        biased = Signal(exp_shape)
        m.d.comb += biased.eq(b.exp + bias3)
        # Overflow needs exp >= emax, a normal result, whose mantissa field is unshifted: it
        # is decided beside the subnormal shift, not after it.
        overflow = (b.nonzero & ((b.exp > emax3)
                                 | ((b.exp == emax3) & ((top & mant_mask) > max_mant)))) \
            | (b.cls == FloatClass.INF)
        g = stage(m, self._latency >= 8, "sub", top=top, mant_mask=mant_mask,
                  sub_shift=sub_shift, normal=normal, biased=biased, overflow=overflow,
                  sign=b.sign, exp=b.exp, sig=b.sig, nonzero=b.nonzero, cls=b.cls, fmt=b.fmt,
                  saturate=b.saturate)
        mant = Signal(p_max)                                       # mantissa field of the code
        m.d.comb += mant.eq(Mux(g.normal, g.top & g.mant_mask, g.top >> g.sub_shift))

        e = stage(m, self._latency >= 5, "enc", mant=mant, biased=g.biased, normal=g.normal,
                  overflow=g.overflow, sign=g.sign, exp=g.exp, sig=g.sig, nonzero=g.nonzero,
                  cls=g.cls, fmt=g.fmt, saturate=g.saturate)
        code = Signal(self.code.shape())
        value = Signal(self.value.shape())
        with m.Switch(e.fmt):
            for k, f in enumerate(fmts):
                with m.Case(k) if k < n - 1 else m.Default():
                    self._encode(m, f, e, e.mant, e.biased, e.normal, e.overflow, code, value)

        c = stage(m, self._latency >= 1, "s3", code=code, value=value)
        m.d.comb += [self.code.eq(c.code), self.value.eq(c.value)]
        return m

    def _encode(self, m, f: FloatFormat, b, mant, biased, normal, overflow, code, value):
        """Drive ``code`` and ``value`` for format ``f`` (one case of the format switch)."""
        W = self._sig_width
        sign_bit = 1 << (f.bits - 1)

        def emit(mag, sign, cls, exp=0, sig=0):
            m.d.comb += [
                code.eq(mag | Mux(sign, sign_bit, 0)),
                value.sign.eq(sign), value.cls.eq(cls), value.exp.eq(exp),
                value.sig.eq(sig), value.sticky.eq(0),
            ]

        def emit_max():
            emit(f.max_code, b.sign, FloatClass.NORMAL, f.emax,
                 ((1 << f.mbits) | (f.max_code & f.mant_mask)) << (W - f.mbits - 1))

        def emit_nan():
            if f.nan in ("ieee", "single"):
                emit(f.nan_code & ~sign_bit, b.sign, FloatClass.NAN)
            elif f.nan == "negzero":
                emit(0, 1, FloatClass.NAN)
            else:  # no NaN: ml_dtypes gives the sign-bit-only code for +NaN, 0 for -NaN
                emit(0, ~b.sign, FloatClass.ZERO)

        def emit_overflow():
            if f.inf:
                emit(f.inf_code, b.sign, FloatClass.INF)
            else:
                emit_nan()

        with m.If(b.cls == FloatClass.NAN):
            emit_nan()
        with m.Elif(overflow):
            if f.nan == "none":
                emit_max()
            else:
                with m.If(b.saturate):
                    emit_max()
                with m.Else():
                    emit_overflow()
        with m.Elif(~b.nonzero):
            emit(0, b.sign if f.neg_zero else 0, FloatClass.ZERO)
        with m.Else():
            with m.If(normal):
                emit(Cat(mant[:f.mbits], biased[:f.ebits]), b.sign, FloatClass.NORMAL, b.exp,
                     b.sig)
            with m.Else():
                emit(mant[:f.mbits], b.sign, FloatClass.SUBNORMAL, b.exp, b.sig)
