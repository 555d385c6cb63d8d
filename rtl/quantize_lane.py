"""One lane of the Quantize unit: QuantizeLinear / DirectML quantize of one element."""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.config import AccelConfig
from qaccel.model.dtypes import QTYPES
from qaccel.model.floatfmt import FORMATS
from qaccel.rtl.decode import Decode, decode_type, exact_in
from qaccel.rtl.decode import min_exp_width as decode_exp_width
from qaccel.rtl.decode import min_sig_width as decode_sig_width
from qaccel.rtl.float_add import LATENCIES as ADD_LATENCIES
from qaccel.rtl.float_add import FloatAdd
from qaccel.rtl.float_divide import FloatDivide
from qaccel.rtl.float_round import LATENCIES as ROUND_LATENCIES
from qaccel.rtl.float_round import FloatRound
from qaccel.rtl.float_round import min_exp_width as round_exp_width
from qaccel.rtl.float_to_int import LATENCIES as TO_INT_LATENCIES
from qaccel.rtl.float_to_int import FloatToInt
from qaccel.rtl.float_unpack import FloatClass
from qaccel.rtl.pipeline import delay, field_width, stage
from qaccel.rtl.pow2_divide import Pow2Divide

__all__ = ["QuantizeLane", "quantize_lane_regs"]

#: The arithmetic units' deepest pipelines: one compare, shift or add per stage.
ROUND_LATENCY = max(ROUND_LATENCIES)
DECODE_LATENCY = 4
ADD_LATENCY = max(ADD_LATENCIES)
TO_INT_LATENCY = max(TO_INT_LATENCIES)


def quantize_lane_regs(config: AccelConfig) -> data.StructLayout:
    """Return the layout of :class:`QuantizeLane`'s run-time registers for ``config``.

    ``x_fmt``, ``s_fmt``, ``prec`` and ``out_fmt`` index ``config.q_inputs``,
    ``config.scales``, ``config.precisions`` and ``config.q_outputs``; ``cast`` rounds both
    operands to ``prec`` before dividing (the ``precision`` attribute, DirectML's float32);
    ``saturate`` is QuantizeLinear's attribute (float8 outputs).
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
       (:func:`~qaccel.rtl.decode.exact_in`) has no cast units;
    3. divide, correctly rounded to ``prec`` (:class:`~qaccel.rtl.float_divide.FloatDivide`,
       then :class:`~qaccel.rtl.float_round.FloatRound`): float16 / float16 gives a float16
       quotient, as NumPy (and so onnx.reference) computes it.  A float8e8m0 scale (a power
       of two) takes :class:`~qaccel.rtl.pow2_divide.Pow2Divide` instead, an exact exponent
       subtraction; a lane whose only scale type is float8e8m0 has no divider at all;
    4. integer outputs: round half to even, add the zero point, saturate
       (:class:`~qaccel.rtl.float_to_int.FloatToInt`); NaN gives ``qmin``;
    5. float outputs: add the float4e2m1 zero point (``-0`` otherwise) in the compute
       precision (float64 after a float64 division, else float32), round to float32 (ml_dtypes
       casts float64 through float32), then to the float8 / float4 output, saturating or not.

    ``zero_point`` holds the zero point's code: an integer output's two's complement (or
    unsigned) code, a float4e2m1 code; it is ignored for float8 outputs, as in the reference.
    ``y`` is the output code, right-aligned, bits above the output type's width 0.

    Latency is :attr:`latency` cycles whatever the formats; throughput one element per cycle.
    The registers are not pipelined: they must be stable while elements are in flight. No
    handshake: the stream unit (:class:`~qaccel.rtl.elementwise.Elementwise`) adds one.

    Members
    -------
    regs : :py:`In(quantize_lane_regs(config))`
    x : :py:`In(unsigned(widest q_inputs type))`
    scale : :py:`In(unsigned(widest scales type))`
    zero_point : :py:`In(unsigned(widest q_outputs type))`
    y : :py:`Out(unsigned(widest q_outputs type))`
    """

    def __init__(self, config: AccelConfig):
        if not isinstance(config, AccelConfig):
            raise TypeError(f"config must be an AccelConfig, not {config!r}")
        self._config = c = config
        outs = [QTYPES[t] for t in c.q_outputs]
        self._int_outs = [q for q in outs if q.is_int]
        self._float_outs = [FORMATS[q.name] for q in outs if not q.is_int]
        self._has_fp4 = "float4e2m1" in c.q_outputs
        casts = tuple(p for p in c.precisions if p != "float64")
        self._casts = casts or ("float32",)
        # the casts are built only if some carried x or scale type is not exact in some
        # carried precision (float32 / float16 / bfloat16 / float8e8m0 in float32 are)
        self._cast_needed = any(not exact_in(decode_type(t), FORMATS[p])
                                for t in {*c.q_inputs, *c.scales} for p in self._casts)
        self._computes = ("float32", "float64") if "float64" in c.precisions else ("float32",)

        ops = [decode_type(t) for t in {*c.q_inputs, *c.scales}]
        self._sig = max(decode_sig_width(ops), 24)
        prec_exp = round_exp_width([FORMATS[p] for p in (*c.precisions, *self._computes)])
        self._exp = max(decode_exp_width(ops), round_exp_width(
            [FORMATS[p] for p in self._casts]), prec_exp - 2)
        p_max = max(FORMATS[p].mbits + 1 for p in c.precisions)
        self._q_width = p_max + 2
        self._build()
        super().__init__({
            "regs": In(quantize_lane_regs(c)),
            "x": In(unsigned(max(QTYPES[t].bits if t in QTYPES else FORMATS[t].bits
                                 for t in c.q_inputs))),
            "scale": In(unsigned(max(decode_type(t).bits for t in c.scales))),
            "zero_point": In(unsigned(max(q.bits for q in outs))),
            "y": Out(unsigned(max(q.bits for q in outs))),
        })

    def _build(self):
        """Create the sub-units (so that :attr:`latency` is known before elaboration)."""
        c, W, E, Q = self._config, self._sig, self._exp, self._q_width
        self._dec_x = Decode(c.q_inputs, sig_width=W, exp_width=E,
                             latency=DECODE_LATENCY)
        self._dec_s = Decode(c.scales, sig_width=W, exp_width=E,
                             latency=DECODE_LATENCY)
        self._cast_x = self._cast_s = None
        if self._cast_needed:
            self._cast_x = FloatRound(self._casts, sig_width=W, exp_width=E,
                                      latency=ROUND_LATENCY)
            self._cast_s = FloatRound(self._casts, sig_width=W, exp_width=E,
                                      latency=ROUND_LATENCY)
        self._cast_latency = self._cast_x.latency if self._cast_needed else 0
        self._div = self._pow2 = None
        if any(s != "float8e8m0" for s in c.scales):
            self._div = FloatDivide(a_width=W, b_width=W, q_width=Q, exp_width=E,
                                    bits_per_stage=c.divider_bits_per_stage)
        if "float8e8m0" in c.scales:
            self._pow2 = Pow2Divide(a_width=W, b_width=W, q_width=Q, exp_width=E)
        self._div_latency = (self._div or self._pow2).latency
        self._round_q = FloatRound(c.precisions, sig_width=Q, exp_width=E + 2,
                                   latency=ROUND_LATENCY)
        front = (self._dec_x.latency + self._cast_latency + self._div_latency
                 + self._round_q.latency)
        self._to_int = None
        if self._int_outs:
            self._to_int = FloatToInt(sig_width=Q, exp_width=E + 2,
                                      max_bits=max(q.bits for q in self._int_outs),
                                      latency=TO_INT_LATENCY)
        int_latency = self._to_int.latency if self._to_int else 0
        float_latency = 0
        self._dec_zp = self._add_zp = self._round_c = self._round_32 = self._round_out = None
        if self._float_outs:
            if self._has_fp4:
                self._dec_zp = Decode(("float4e2m1",), sig_width=2, exp_width=E + 2, latency=1)
                self._add_zp = FloatAdd(a_width=Q, b_width=2, exp_width=E + 2, out_width=Q,
                                        latency=ADD_LATENCY)
                self._round_c = FloatRound(self._computes, sig_width=Q, exp_width=E + 3,
                                           latency=ROUND_LATENCY)
                float_latency += self._add_zp.latency + self._round_c.latency
            if "float64" in self._computes:
                self._round_32 = FloatRound(("float32",), sig_width=Q,
                                            exp_width=E + 3 if self._has_fp4 else E + 2,
                                            latency=ROUND_LATENCY)
                float_latency += self._round_32.latency
            self._round_out = FloatRound(self._float_outs, sig_width=Q,
                                         exp_width=E + 3 if self._has_fp4 else E + 2,
                                         latency=ROUND_LATENCY)
            float_latency += self._round_out.latency
        self._tail = max(int_latency, float_latency)
        self._int_latency, self._float_latency = int_latency, float_latency
        self._latency = front + self._tail + 1

    @property
    def config(self) -> AccelConfig:
        return self._config

    @property
    def latency(self) -> int:
        """Cycles from ``x``/``scale``/``zero_point``/``regs`` to ``y``."""
        return self._latency

    def elaborate(self, platform):
        m = Module()
        c = self._config
        regs = self.regs
        for name in ("dec_x", "dec_s", "cast_x", "cast_s", "div", "pow2", "round_q", "to_int",
                     "dec_zp", "add_zp", "round_c", "round_32", "round_out"):
            unit = getattr(self, f"_{name}")
            if unit is not None:
                m.submodules[name] = unit

        # Constants of the selected types, registered: ``regs`` is stable while elements are
        # in flight, and every use below is at least one cycle after an element's entry (the
        # decoders are registered), so the copies keep the format decoding out of the
        # arithmetic stages' timing paths.
        n_int = len(self._int_outs)
        is_int = Signal()
        bits = Signal(6)
        signed_out = Signal()
        float_sel = Signal(max(1, (len(self._float_outs) - 1).bit_length()))
        adds_zp = Signal()
        code_mask = Signal(len(self.zero_point) + 1)      # the output type's code bits
        sign_mask = Signal(self.zero_point.shape())       # its sign bit (signed types)
        with m.Switch(regs.out_fmt):
            for k, name in enumerate(c.q_outputs):
                q = QTYPES[name]
                with m.Case(k):
                    m.d.comb += [is_int.eq(q.is_int), bits.eq(q.bits), signed_out.eq(q.signed),
                                 code_mask.eq((1 << q.bits) - 1),
                                 sign_mask.eq(1 << (q.bits - 1) if q.signed else 0)]
                    if not q.is_int:
                        m.d.comb += [float_sel.eq(k - n_int),
                                     adds_zp.eq(name == "float4e2m1")]
        prec = self._config.precisions
        cast_fmt = Signal(range(len(self._casts)))
        no_cast = Signal()
        with m.Switch(regs.prec):
            for k, p in enumerate(prec):
                with m.Case(k):
                    m.d.comb += no_cast.eq(p == "float64")
                    if p != "float64":
                        m.d.comb += cast_fmt.eq(self._casts.index(p))
        pow2 = Signal()             # the float8e8m0 scale's path instead of the divider's
        if self._pow2 is not None:
            m.d.comb += pow2.eq((regs.s_fmt == c.scales.index("float8e8m0"))
                                | (self._div is None))
        keep = Signal()             # the operands exact, not cast to the precision
        m.d.comb += keep.eq(~regs.cast | no_cast)
        cfg = stage(m, True, "cfg", is_int=is_int, bits=bits, signed_out=signed_out,
                    float_sel=float_sel, adds_zp=adds_zp, code_mask=code_mask,
                    sign_mask=sign_mask, cast_fmt=cast_fmt, no_cast=no_cast, keep=keep,
                    prec=regs.prec, saturate=regs.saturate, pow2=pow2)

        # 1. decode
        m.d.comb += [self._dec_x.code.eq(self.x), self._dec_x.fmt.eq(regs.x_fmt),
                     self._dec_s.code.eq(self.scale), self._dec_s.fmt.eq(regs.s_fmt)]
        lat = self._dec_x.latency
        # 2. cast to the division precision (or keep the exact value)
        a = Signal.like(self._dec_x.o)
        b = Signal.like(self._dec_s.o)
        m.d.comb += [a.eq(self._dec_x.o), b.eq(self._dec_s.o)]
        if self._cast_needed:
            for dec, cast in ((self._dec_x, self._cast_x), (self._dec_s, self._cast_s)):
                m.d.comb += [cast.i.eq(dec.o), cast.fmt.eq(cfg.cast_fmt), cast.saturate.eq(0)]
            m.d.comb += [a.eq(self._cast_x.value), b.eq(self._cast_s.value)]
            with m.If(cfg.keep):
                m.d.comb += [a.eq(delay(m, self._dec_x.o, self._cast_latency, "raw_a")),
                             b.eq(delay(m, self._dec_s.o, self._cast_latency, "raw_b"))]
        lat += self._cast_latency
        # 3. divide (a float8e8m0 scale: subtract its exponent), round to the precision
        quotient = Signal(self._round_q.i.shape())
        if self._div is not None:
            m.d.comb += [self._div.a.eq(a), self._div.b.eq(b), quotient.eq(self._div.q)]
        if self._pow2 is not None:
            m.d.comb += [self._pow2.a.eq(a), self._pow2.b.eq(b)]
            pow2_q = delay(m, self._pow2.q, self._div_latency - self._pow2.latency, "pow2_q")
            with m.If(cfg.pow2):
                m.d.comb += quotient.eq(pow2_q)
        lat += self._div_latency
        m.d.comb += [self._round_q.i.eq(quotient),
                     self._round_q.fmt.eq(cfg.prec),
                     self._round_q.saturate.eq(0)]
        lat += self._round_q.latency
        q = self._round_q.value

        zp_code = delay(m, self.zero_point, lat, "zp")  # the zero point, next to the quotient
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
            m.d.comb += int_code.eq(delay(m, t.code, self._tail - self._int_latency, "int_pad"))
        if self._round_out is not None:
            flat = lat
            v = q
            if self._add_zp is not None:
                m.d.comb += [self._dec_zp.code.eq(delay(m, self.zero_point, lat - 1, "zp4")),
                             self._dec_zp.fmt.eq(0)]
                use_zp = cfg.adds_zp
                minus_zero = Signal.like(self._dec_zp.o)
                m.d.comb += [minus_zero.sign.eq(1), minus_zero.cls.eq(FloatClass.ZERO)]
                m.d.comb += [self._add_zp.a.eq(v), self._add_zp.sub.eq(0),
                             self._add_zp.b.eq(minus_zero)]
                with m.If(use_zp):
                    m.d.comb += self._add_zp.b.eq(self._dec_zp.o)
                flat += self._add_zp.latency
                m.d.comb += [self._round_c.i.eq(self._add_zp.s), self._round_c.saturate.eq(0),
                             self._round_c.fmt.eq(cfg.no_cast if len(self._computes) > 1 else 0)]
                flat += self._round_c.latency
                v = self._round_c.value
            if self._round_32 is not None:
                m.d.comb += [self._round_32.i.eq(v), self._round_32.fmt.eq(0),
                             self._round_32.saturate.eq(0)]
                flat += self._round_32.latency
                v = self._round_32.value
            r = self._round_out
            m.d.comb += [r.i.eq(v), r.fmt.eq(cfg.float_sel), r.saturate.eq(cfg.saturate)]
            m.d.comb += float_code.eq(delay(m, r.code, self._tail - self._float_latency,
                                            "float_pad"))
        out_int = cfg.is_int
        y = Signal(self.y.shape())
        m.d.comb += y.eq(float_code)
        with m.If(out_int):
            m.d.comb += y.eq(int_code)
        m.d.sync += self.y.eq(y)
        return m
