"""One lane of the Quantize unit: QuantizeLinear / DirectML quantize of one element."""

from __future__ import annotations

from types import SimpleNamespace

from amaranth.hdl import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.config import AccelConfig
from qaccel.model.dtypes import QTYPES
from qaccel.model.floatfmt import FORMATS
from qaccel.model.validate import check_bool
from qaccel.rtl.arith.decode import Decode, decode_type, exact_in
from qaccel.rtl.arith.decode import min_exp_width as decode_exp_width
from qaccel.rtl.arith.decode import min_sig_width as decode_sig_width
from qaccel.rtl.arith.float_add import LATENCIES as ADD_LATENCIES
from qaccel.rtl.arith.float_add import FloatAdd
from qaccel.rtl.arith.float_divide import FloatDivide
from qaccel.rtl.arith.float_round import FloatRound
from qaccel.rtl.arith.float_round import min_exp_width as round_exp_width
from qaccel.rtl.arith.float_to_int import LATENCIES as TO_INT_LATENCIES
from qaccel.rtl.arith.float_to_int import FloatToInt
from qaccel.rtl.arith.float_unpack import FloatClass
from qaccel.rtl.arith.pipeline import check_latencies, choose, delay, field_width, stage
from qaccel.rtl.arith.pow2_divide import Pow2Divide
from qaccel.rtl.arith.reciprocal_divide import ReciprocalDivide
from qaccel.rtl.arith.significand_round import SignificandRound
from qaccel.rtl.arith.wide_float import wide_float_layout
from qaccel.rtl.elementwise.operand_cast import (
    ROUND_LATENCY,
    OperandCast,
    cast_control,
    cast_precisions,
)
from qaccel.rtl.elementwise.scale_prep import ScalePrep

__all__ = ["QuantizeLane", "quantize_lane_regs"]

#: The arithmetic units' deepest pipelines: one compare, shift or add per stage.
ADD_LATENCY = max(ADD_LATENCIES)
TO_INT_LATENCY = max(TO_INT_LATENCIES)

#: The lane's units (attributes ``_<name>``, None when not built; submodules ``<name>``).
_UNITS = ("op_x", "op_s", "div", "pow2", "round_q", "to_int", "dec_zp", "add_zp", "round_c",
          "round_32", "round_out")


def quantize_lane_regs(config: AccelConfig) -> data.StructLayout:
    """Return the layout of :class:`QuantizeLane`'s run-time registers for ``config``.

    ``x_fmt``, ``s_fmt``, ``prec`` and ``out_fmt`` index ``config.q_inputs``,
    ``config.scales``, ``config.precisions`` and ``config.q_outputs``; ``cast`` rounds both
    operands to ``prec`` before dividing (the ``precision`` attribute, DirectML's float32);
    ``saturate`` is QuantizeLinear's attribute (float8 outputs). An index past the carried
    choices selects the last one (so a build with one choice has constant selections).
    """
    return data.StructLayout({
        "x_fmt": unsigned(field_width(len(config.q_inputs))),
        "s_fmt": unsigned(field_width(len(config.scales))),
        "prec": unsigned(field_width(len(config.precisions))),
        "cast": unsigned(1),
        "out_fmt": unsigned(field_width(len(config.q_outputs))),
        "saturate": unsigned(1),
    })


class QuantizeLane(wiring.Component):
    """``y = quantize(x / scale, zero_point)`` for one element, bit-exact with the golden model.

    The datapath (every stage always present; formats chosen by the registers ``regs``):

    1. decode ``x`` (a ``config.q_inputs`` code) and ``scale`` (a ``config.scales`` code)
       into exact wide floats;
    2. with ``regs.cast``, round both to the division precision ``prec`` (float32, float16 or
       bfloat16; a float64 precision leaves them exact, as int32 and float32 are); a lane
       whose carried x and scale types are all exact in every carried precision
       (:func:`~qaccel.rtl.arith.decode.exact_in`) has no cast units;
    3. divide, correctly rounded to ``prec`` (a divider, then
       :class:`~qaccel.rtl.arith.float_round.FloatRound`): float16 / float16 gives a float16
       quotient, as NumPy (and so onnx.reference) computes it. The divider is the radix-2
       array :class:`~qaccel.rtl.arith.float_divide.FloatDivide` or, with
       ``config.reciprocal_units``, :class:`~qaccel.rtl.arith.reciprocal_divide.ReciprocalDivide`
       (a multiply by the scale's reciprocal and an exact remainder correction, the same
       quotient bit for bit). Then the lane takes *prepared* scales: ``scale`` is the scale
       already decoded and cast (steps 1-2, done by :meth:`scale_prep` when the table is
       written) and ``recip`` its reciprocal, both :attr:`scale_delay` cycles after ``x``.
       A float8e8m0 scale (a power of two) takes
       :class:`~qaccel.rtl.arith.pow2_divide.Pow2Divide` instead, an exact exponent subtraction;
       a lane whose only scale type is float8e8m0 has no divider at all;
    4. integer outputs: round half to even, add the zero point, saturate
       (:class:`~qaccel.rtl.arith.float_to_int.FloatToInt`); NaN gives ``qmin``;
    5. float outputs: add the float4e2m1 zero point (``-0`` otherwise) in the compute
       precision (float64 after a float64 division, else float32), round to float32 (ml_dtypes
       casts float64 through float32), then to the float8 / float4 output, saturating or not.

    ``zero_point`` holds the zero point's code: an integer output's two's complement (or
    unsigned) code, a float4e2m1 code; it is ignored for float8 outputs, as in the reference.
    ``y`` is the output code, right-aligned, bits above the output type's width 0.

    Latency is :attr:`latency` cycles whatever the formats; throughput one element per cycle.
    The registers are not pipelined: they must be stable while elements are in flight. No
    handshake: the stream unit (:class:`~qaccel.rtl.elementwise.unit.Elementwise`) adds one.

    ``ecp5=True`` builds the reciprocal divider's multipliers as MULT18X18D instances with
    their own registers, for synthesis (the same cycles); simulate with False (the default).

    Members
    -------
    regs : :py:`In(quantize_lane_regs(config))`
    x : :py:`In(unsigned(widest q_inputs type))`
    scale : :py:`In(unsigned(widest scales type))`
        The scale's code; with prepared scales its wide float
        (:func:`~qaccel.rtl.arith.wide_float.wide_float_layout`).
    recip : :py:`In(unsigned(q_width))`
        With prepared scales only: ``floor((2**K - 1) / scale.sig)``
        (:class:`~qaccel.rtl.arith.reciprocal.Reciprocal`) without its top bit, which is set.
    zero_point : :py:`In(unsigned(widest q_outputs type))`
    y : :py:`Out(unsigned(widest q_outputs type))`
    """

    def __init__(self, config: AccelConfig, *, ecp5: bool = False):
        self._plan = p = self.plan(config)
        self._config = c = config
        self._ecp5 = check_bool("ecp5", ecp5)
        self._int_outs, self._float_outs, self._has_fp4 = p.int_outs, p.float_outs, p.has_fp4
        self._casts, self._cast_needed, self._computes = p.casts, p.cast_needed, p.computes
        self._sig, self._exp, self._q_width = p.sig, p.exp, p.q_width
        self._prepared, self._dec_types = p.prepared, p.dec_types
        self._build()
        scale_code = unsigned(max(decode_type(t).bits for t in c.scales))
        self._scale_code = scale_code
        members = {
            "regs": In(quantize_lane_regs(c)),
            "x": In(unsigned(max(QTYPES[t].bits if t in QTYPES else FORMATS[t].bits
                                 for t in c.q_inputs))),
            "scale": In(scale_code),
            "zero_point": In(unsigned(max(q.bits for q in p.outs))),
            "y": Out(unsigned(max(q.bits for q in p.outs))),
        }
        if self._prepared:
            wide = wide_float_layout(self._sig, self._exp)
            members["scale"] = In(wide)
            members["recip"] = In(unsigned(self._q_width))
            members["prep_sel"] = In(1)
            members["prep_code"] = In(scale_code)
            members["prep_o"] = Out(wide)
        super().__init__(members)

    @classmethod
    def plan(cls, config: AccelConfig) -> SimpleNamespace:
        """The lane for ``config`` without building it (``ecp5`` builds have the same cycles):
        its widths and types; ``units``, the latency of each sub-unit built (by the name of its
        attribute without the ``_``); ``front`` (``x`` to the rounded quotient), ``div_latency``,
        ``int_latency`` and ``float_latency`` (the output paths), ``tail`` (the longer),
        ``latency``, ``scale_delay``; ``prep_args``, the parameters of :meth:`scale_prep`'s
        unit that set its cycles, and ``prep``, their :meth:`ScalePrep.timing_for
        <qaccel.rtl.elementwise.scale_prep.ScalePrep.timing_for>` (both None without prepared
        scales). TypeError unless ``config`` is an :class:`~qaccel.model.config.AccelConfig`."""
        if not isinstance(config, AccelConfig):
            raise TypeError(f"config must be an AccelConfig, not {config!r}")
        c = config
        p = SimpleNamespace(outs=[QTYPES[t] for t in c.q_outputs])
        p.int_outs = [q for q in p.outs if q.is_int]
        p.float_outs = [FORMATS[q.name] for q in p.outs if not q.is_int]
        p.has_fp4 = "float4e2m1" in c.q_outputs
        p.casts = cast_precisions(c.precisions)
        # the casts are built only if some carried x or scale type is not exact in some
        # carried precision (float32 / float16 / bfloat16 / float8e8m0 in float32 are)
        p.cast_needed = any(not exact_in(decode_type(t), FORMATS[f])
                            for t in {*c.q_inputs, *c.scales} for f in p.casts)
        p.computes = ("float32", "float64") if "float64" in c.precisions else ("float32",)

        ops = [decode_type(t) for t in {*c.q_inputs, *c.scales}]
        p.sig = max(decode_sig_width(ops), 24)
        prec_exp = round_exp_width([FORMATS[f] for f in (*c.precisions, *p.computes)])
        p.exp = max(decode_exp_width(ops), round_exp_width(
            [FORMATS[f] for f in p.casts]), prec_exp - 2)
        p_max = max(FORMATS[f].mbits + 1 for f in c.precisions)
        p.q_width = p_max + 2
        p.prepared = c.reciprocal_units > 0
        # with prepared scales, the dividend's decoder decodes the scales too while the table
        # loads (ScalePrep borrows it): it carries the scale types after the input types
        p.dec_types = c.q_inputs
        if p.prepared:
            p.dec_types += tuple(s for s in c.scales if s not in c.q_inputs)

        W, Q = p.sig, p.q_width
        u = p.units = {"op_x": OperandCast.latency_for(cast=p.cast_needed)}
        if not p.prepared:
            u["op_s"] = u["op_x"]
        if any(s != "float8e8m0" for s in c.scales):
            u["div"] = (ReciprocalDivide.latency_for(a_width=W, b_width=W, q_width=Q,
                                                     max_dsps=c.divider_dsps)
                        if p.prepared else
                        FloatDivide.latency_for(q_width=Q,
                                                bits_per_stage=c.divider_bits_per_stage))
        if "float8e8m0" in c.scales:
            # beside a divider its operands are registered first, at no cost in latency
            u["pow2"] = 2 if "div" in u else 1
        # integer outputs only: the quotient's rounding to the precision needs no subnormals
        # or overflow (SignificandRound), else the float outputs take FloatRound's value
        u["round_q"] = ROUND_LATENCY if p.float_outs else SignificandRound.latency
        if p.int_outs:
            u["to_int"] = TO_INT_LATENCY
        if p.float_outs:
            if p.has_fp4:
                u.update(dec_zp=1, add_zp=ADD_LATENCY, round_c=ROUND_LATENCY)
            if "float64" in p.computes:
                u["round_32"] = ROUND_LATENCY
            u["round_out"] = ROUND_LATENCY
        p.div_latency = u.get("div", u.get("pow2"))
        p.front = u["op_x"] + p.div_latency + u["round_q"]
        p.int_latency = u.get("to_int", 0)
        p.float_latency = sum(u.get(k, 0) for k in ("add_zp", "round_c", "round_32",
                                                    "round_out"))
        p.tail = max(p.int_latency, p.float_latency)
        p.latency = p.front + p.tail + 1
        p.scale_delay = u["op_x"] if p.prepared else 0
        p.prep_args = p.prep = None
        if p.prepared:
            p.prep_args = dict(decode_latency=u["op_x"], r_width=Q + 1,
                               units=c.reciprocal_units)
            p.prep = ScalePrep.timing_for(**p.prep_args)
        return p

    def _build(self):
        """Create the sub-units (so that :attr:`latency` is known before elaboration), as
        :meth:`plan` lays them out; RuntimeError (an internal error) if their latencies are
        not the planned ones."""
        c, W, E, Q, p = self._config, self._sig, self._exp, self._q_width, self._plan
        self._op_x = OperandCast(self._dec_types, casts=self._casts, cast=self._cast_needed,
                                 sig_width=W, exp_width=E)
        self._op_s = None
        if not self._prepared:
            self._op_s = OperandCast(c.scales, casts=self._casts, cast=self._cast_needed,
                                     sig_width=W, exp_width=E)
        self._div = self._pow2 = None
        if "div" in p.units:
            if self._prepared:
                self._div = ReciprocalDivide(a_width=W, b_width=W, q_width=Q, exp_width=E,
                                             max_dsps=c.divider_dsps, ecp5=self._ecp5)
            else:
                self._div = FloatDivide(a_width=W, b_width=W, q_width=Q, exp_width=E,
                                        bits_per_stage=c.divider_bits_per_stage)
        if "pow2" in p.units:
            self._pow2 = Pow2Divide(a_width=W, b_width=W, q_width=Q, exp_width=E,
                                    latency=p.units["pow2"])
        if self._float_outs:
            self._round_q = FloatRound(c.precisions, sig_width=Q, exp_width=E + 2,
                                       latency=ROUND_LATENCY)
            q_sig, q_exp = Q, E + 2
        else:
            self._round_q = SignificandRound(c.precisions, sig_width=Q, exp_width=E + 2)
            q_sig, q_exp = self._round_q.o.sig.shape().width, E + 3
        self._to_int = None
        if self._int_outs:
            ranges = {(q.bits, q.signed) for q in self._int_outs}
            self._to_int = FloatToInt(sig_width=q_sig, exp_width=q_exp,
                                      max_bits=max(q.bits for q in self._int_outs),
                                      latency=TO_INT_LATENCY,
                                      fixed_range=ranges.pop() if len(ranges) == 1 else None)
        self._dec_zp = self._add_zp = self._round_c = self._round_32 = self._round_out = None
        if self._float_outs:
            if self._has_fp4:
                self._dec_zp = Decode(("float4e2m1",), sig_width=2, exp_width=E + 2,
                                      latency=p.units["dec_zp"])
                self._add_zp = FloatAdd(a_width=Q, b_width=2, exp_width=E + 2, out_width=Q,
                                        latency=ADD_LATENCY)
                self._round_c = FloatRound(self._computes, sig_width=Q, exp_width=E + 3,
                                           latency=ROUND_LATENCY)
            if "float64" in self._computes:
                self._round_32 = FloatRound(("float32",), sig_width=Q,
                                            exp_width=E + 3 if self._has_fp4 else E + 2,
                                            latency=ROUND_LATENCY)
            self._round_out = FloatRound(self._float_outs, sig_width=Q,
                                         exp_width=E + 3 if self._has_fp4 else E + 2,
                                         latency=ROUND_LATENCY)
        check_latencies(type(self).__name__, p.units,
                        {name: getattr(self, f"_{name}") for name in _UNITS})

    @property
    def config(self) -> AccelConfig:
        return self._config

    @property
    def latency(self) -> int:
        """Cycles from ``x`` and ``regs`` to ``y``."""
        return self._plan.latency

    @property
    def scale_delay(self) -> int:
        """Cycles from ``x`` to its ``scale``, ``recip`` and ``zero_point``: 0, or with
        prepared scales the dividend's decode and cast (the table is read that much later)."""
        return self._plan.scale_delay

    def scale_prep(self, addr_width: int) -> ScalePrep | None:
        """The :class:`~qaccel.rtl.elementwise.scale_prep.ScalePrep` that fills this lane's table
        (``config.reciprocal_units > 0``), for a table of ``2**addr_width`` entries; else
        None (the table holds the scale codes)."""
        if not self._prepared:
            return None
        return ScalePrep(**self._plan.prep_args, sig_width=self._sig, exp_width=self._exp,
                         addr_width=addr_width, scale_shape=self._scale_code,
                         zp_shape=self.signature.members["zero_point"].shape)

    def elaborate(self, platform):
        m = Module()
        c, p = self._config, self._plan
        regs = self.regs
        for name in _UNITS:
            unit = getattr(self, f"_{name}")
            if unit is not None:
                m.submodules[name] = unit

        # Constants of the selected types, registered: ``regs`` is stable while elements are
        # in flight, and every use below is at least one cycle after an element's entry (the
        # decoders are registered), so the copies keep the format decoding out of the
        # arithmetic stages' timing paths.
        n_int = len(self._int_outs)
        outs = [QTYPES[name] for name in c.q_outputs]

        def by_output(name, shape, values):
            """The value for the output type ``regs.out_fmt`` selects."""
            return choose(m, regs.out_fmt, values, shape, name)

        is_int = by_output("is_int", 1, [q.is_int for q in outs])
        bits = by_output("bits", 6, [q.bits for q in outs])
        signed_out = by_output("signed_out", 1, [q.signed for q in outs])
        float_sel = by_output("float_sel", max(1, (len(self._float_outs) - 1).bit_length()),
                              [0 if q.is_int else k - n_int for k, q in enumerate(outs)])
        adds_zp = by_output("adds_zp", 1, [q.name == "float4e2m1" for q in outs])
        # the output type's code bits, and its sign bit (signed types)
        code_mask = by_output("code_mask", len(self.zero_point) + 1,
                              [(1 << q.bits) - 1 for q in outs])
        sign_mask = by_output("sign_mask", self.zero_point.shape(),
                              [1 << (q.bits - 1) if q.signed else 0 for q in outs])
        cast_fmt, keep = cast_control(m, c.precisions, regs.prec, regs.cast)
        no_cast = Signal()          # a float64 division: the zero point added in float64
        if "float64" in c.precisions:
            m.d.comb += no_cast.eq(regs.prec == c.precisions.index("float64"))
        pow2 = Signal()             # the float8e8m0 scale's path instead of the divider's
        if self._pow2 is not None:
            m.d.comb += pow2.eq((regs.s_fmt == c.scales.index("float8e8m0"))
                                | (self._div is None))
        cfg = stage(m, True, "cfg", is_int=is_int, bits=bits, signed_out=signed_out,
                    float_sel=float_sel, adds_zp=adds_zp, code_mask=code_mask,
                    sign_mask=sign_mask, cast_fmt=cast_fmt, no_cast=no_cast, keep=keep,
                    prec=regs.prec if len(c.precisions) > 1 else Const(0, 1),
                    saturate=regs.saturate, pow2=pow2)

        # 1-2. decode, cast to the division precision (or keep the exact value); a prepared
        # scale arrives decoded and cast, with its reciprocal, ``scale_delay`` cycles after x
        operands = [(self._op_x, self.x, regs.x_fmt)]
        if self._prepared:          # the scale codes of ScalePrep instead, while it is busy
            s_fmt = choose(m, regs.s_fmt, [self._dec_types.index(s) for s in c.scales],
                           field_width(len(self._dec_types)), "s_fmt_as_input")
            operands = [(self._op_x, Mux(self.prep_sel, self.prep_code, self.x),
                         Mux(self.prep_sel, s_fmt, regs.x_fmt))]
            m.d.comb += self.prep_o.eq(self._op_x.o)
        if self._op_s is not None:
            operands.append((self._op_s, self.scale, regs.s_fmt))
        for op, code, fmt in operands:
            m.d.comb += [op.code.eq(code), op.fmt.eq(fmt), op.cast_fmt.eq(cfg.cast_fmt),
                         op.keep.eq(cfg.keep)]
        a = self._op_x.o
        b = self.scale if self._prepared else self._op_s.o
        # 3. divide (a float8e8m0 scale: subtract its exponent), round to the precision
        quotient = Signal(self._round_q.i.shape())
        if self._div is not None:
            m.d.comb += [self._div.a.eq(a), self._div.b.eq(b), quotient.eq(self._div.q)]
            if self._prepared:
                m.d.comb += self._div.r.eq(Cat(self.recip, Const(1, 1)))     # the top bit is set
        if self._pow2 is not None:
            m.d.comb += [self._pow2.a.eq(a), self._pow2.b.eq(b)]
            pow2_q = delay(m, self._pow2.q, p.div_latency - p.units["pow2"], "pow2_q")
            with m.If(cfg.pow2):
                m.d.comb += quotient.eq(pow2_q)
        m.d.comb += [self._round_q.i.eq(quotient), self._round_q.fmt.eq(cfg.prec)]
        if self._float_outs:
            m.d.comb += self._round_q.saturate.eq(0)
            q = self._round_q.value
        else:
            q = self._round_q.o

        # the zero point, next to the quotient
        zp_code = delay(m, self.zero_point, p.front - p.scale_delay, "zp")
        int_code = Signal(self.y.shape())
        float_code = Signal(self.y.shape())
        if self._to_int is not None:
            t = self._to_int
            zp = Signal(t.zero_point.shape())
            zp_bits, zp_signed = cfg.bits, cfg.signed_out
            # sign-extend the zero point's code from `bits`
            negative = (zp_code & cfg.sign_mask).any()
            m.d.comb += zp.eq(Mux(negative, zp_code | ~cfg.code_mask, zp_code & cfg.code_mask))
            m.d.comb += [t.i.eq(q), t.bits.eq(zp_bits), t.signed.eq(zp_signed),
                         t.zero_point.eq(zp)]
            m.d.comb += int_code.eq(delay(m, t.code, p.tail - p.int_latency, "int_pad"))
        if self._round_out is not None:
            v = q
            if self._add_zp is not None:
                zp4 = p.front - p.units["dec_zp"] - p.scale_delay
                m.d.comb += [self._dec_zp.code.eq(delay(m, self.zero_point, zp4, "zp4")),
                             self._dec_zp.fmt.eq(0)]
                use_zp = cfg.adds_zp
                minus_zero = Signal.like(self._dec_zp.o)
                m.d.comb += [minus_zero.sign.eq(1), minus_zero.cls.eq(FloatClass.ZERO)]
                m.d.comb += [self._add_zp.a.eq(v), self._add_zp.sub.eq(0),
                             self._add_zp.b.eq(minus_zero)]
                with m.If(use_zp):
                    m.d.comb += self._add_zp.b.eq(self._dec_zp.o)
                m.d.comb += [self._round_c.i.eq(self._add_zp.s), self._round_c.saturate.eq(0),
                             self._round_c.fmt.eq(cfg.no_cast if len(self._computes) > 1 else 0)]
                v = self._round_c.value
            if self._round_32 is not None:
                m.d.comb += [self._round_32.i.eq(v), self._round_32.fmt.eq(0),
                             self._round_32.saturate.eq(0)]
                v = self._round_32.value
            r = self._round_out
            m.d.comb += [r.i.eq(v), r.fmt.eq(cfg.float_sel), r.saturate.eq(cfg.saturate)]
            m.d.comb += float_code.eq(delay(m, r.code, p.tail - p.float_latency,
                                            "float_pad"))
        out_int = cfg.is_int
        y = Signal(self.y.shape())
        m.d.comb += y.eq(float_code)
        with m.If(out_int):
            m.d.comb += y.eq(int_code)
        m.d.sync += self.y.eq(y)
        return m
