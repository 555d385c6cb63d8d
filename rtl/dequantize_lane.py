"""One lane of the Dequantize unit: ONNX DequantizeLinear of one element."""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Signal, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.config import AccelConfig
from qaccel.model.dtypes import QType
from qaccel.model.floatfmt import FORMATS
from qaccel.rtl.decode import Decode, decode_type, exact_in
from qaccel.rtl.decode import min_exp_width as decode_exp_width
from qaccel.rtl.decode import min_sig_width as decode_sig_width
from qaccel.rtl.float_add import LATENCIES as ADD_LATENCIES
from qaccel.rtl.float_add import FloatAdd
from qaccel.rtl.float_mul import LATENCIES as MUL_LATENCIES
from qaccel.rtl.float_mul import FloatMul
from qaccel.rtl.float_round import LATENCIES as ROUND_LATENCIES
from qaccel.rtl.float_round import FloatRound
from qaccel.rtl.float_round import min_exp_width as round_exp_width
from qaccel.rtl.float_unpack import FloatClass
from qaccel.rtl.pipeline import delay, field_width, line

__all__ = ["DequantizeLane", "dequantize_lane_regs", "dq_scales"]

#: The arithmetic units' deepest pipelines: one compare, shift or add per stage.
ROUND_LATENCY = max(ROUND_LATENCIES)
DECODE_LATENCY = 4
ADD_LATENCY = max(ADD_LATENCIES)

#: Width of the exact difference ``f32(x) - zero_point`` for int32: both are integers below
#: 2**32.
_DIFF_WIDTH_INT32 = 36


def _diff_width(types) -> int:
    """Significant bits of ``f32(x) - zero_point`` for the carried ``x`` types: a ``b``-bit
    integer minus its zero point fits ``b`` bits (int32: :data:`_DIFF_WIDTH_INT32`), a float
    (no zero point subtracted) its significand."""
    return max(t.mbits + 1 if not isinstance(t, QType) else
               _DIFF_WIDTH_INT32 if t.bits == 32 else t.bits for t in types)


def dq_scales(config: AccelConfig) -> tuple[str, ...]:
    """The scale types the Dequantize unit carries: ``config.scales`` without int32."""
    return tuple(t for t in config.scales if t != "int32")


def dequantize_lane_regs(config: AccelConfig) -> data.StructLayout:
    """Return the layout of :class:`DequantizeLane`'s run-time registers for ``config``.

    ``x_fmt``, ``s_fmt`` and ``out_fmt`` index ``config.dq_inputs``, :func:`dq_scales` and
    ``config.dq_outputs``; ``use_zp`` subtracts the zero point (integer inputs; ONNX ignores
    float8 / float4 zero points); ``wide`` computes in float64 (int32 input with a zero point,
    as onnx.reference does).
    """
    return data.StructLayout({
        "x_fmt": unsigned(field_width(len(config.dq_inputs))),
        "s_fmt": unsigned(field_width(len(dq_scales(config)))),
        "out_fmt": unsigned(field_width(len(config.dq_outputs))),
        "use_zp": unsigned(1),
        "wide": unsigned(1),
    })


class DequantizeLane(wiring.Component):
    """``y = (x - zero_point) * scale`` for one element, bit-exact with the golden model.

    The datapath (formats chosen by the registers ``regs``):

    1. decode ``x`` and ``zero_point`` (codes of a ``config.dq_inputs`` type) and ``scale``
       into exact wide floats;
    2. round ``x`` to float32 (``x.astype(float32)``: exact but for int32, so built only when
       int32 is carried);
    3. subtract the zero point (exact: both are integers below ``2**32``);
    4. multiply by the scale (exact product; the multiplier is as wide as the widest scale
       significand carried, a float8e8m0 scale's being a constant power of two; a NaN ``x``
       times a NaN scale keeps the scale's sign, as the golden model does), round to
       float32, or float64 when ``wide``;
    5. round to the output type (a float64 product bound for bfloat16 goes through float32,
       as ml_dtypes casts it; with float32 the only output and no int32 input, step 4's
       rounding is the last).

    ``y`` is the output code, right-aligned. Latency is :attr:`latency` cycles whatever the
    formats, one element per cycle; the registers are not pipelined and must be stable while
    elements are in flight. No handshake: :class:`~qaccel.rtl.elementwise.Elementwise` adds
    one.

    Members
    -------
    regs : :py:`In(dequantize_lane_regs(config))`
    x, zero_point : :py:`In(unsigned(widest dq_inputs type))`
    scale : :py:`In(unsigned(widest float scale type))`
    y : :py:`Out(unsigned(widest dq_outputs type))`
    """

    def __init__(self, config: AccelConfig):
        if not isinstance(config, AccelConfig):
            raise TypeError(f"config must be an AccelConfig, not {config!r}")
        self._config = c = config
        scales = dq_scales(c)
        if not scales:
            raise ValueError(f"config.scales must include a float type for dequantisation, "
                             f"not {c.scales}")
        ins = [decode_type(t) for t in c.dq_inputs]
        self._exp = max(decode_exp_width(ins), decode_exp_width(
            [decode_type(t) for t in scales]) - 1, round_exp_width([FORMATS["float64"]]) - 2)
        E, W = self._exp, decode_sig_width(ins)
        D = _diff_width(ins)
        # the multiplier: the widest scale significand (float8e8m0's is one bit) times the
        # difference; the exact product is padded to the roundings' widest format
        S = decode_sig_width([decode_type(t) for t in scales])
        self._dec_x = Decode(c.dq_inputs, sig_width=W, exp_width=E,
                             latency=DECODE_LATENCY)
        self._dec_zp = Decode(c.dq_inputs, sig_width=W, exp_width=E,
                             latency=DECODE_LATENCY)
        self._dec_s = Decode(scales, sig_width=S, exp_width=E + 1, latency=DECODE_LATENCY)
        # Stages built only when a carried type needs them: x.astype(float32) rounds only
        # int32; int32 also brings the float64 product (``wide``), and with a bfloat16
        # output its second rounding through float32; a float32-only output needs no
        # rounding after the product's.
        f32 = FORMATS["float32"]
        self._wide = "int32" in c.dq_inputs
        self._round_x = self._round_b = self._round_out = None
        if not all(exact_in(t, f32) for t in ins):
            self._round_x = FloatRound(("float32",), sig_width=W, exp_width=E,
                                       latency=ROUND_LATENCY)
        self._sub = FloatAdd(a_width=W, b_width=W, exp_width=E, out_width=D,
                             latency=ADD_LATENCY)
        # the scale first: a NaN times a NaN keeps the scale's (the golden kernels' result)
        self._mul = FloatMul(a_width=S, b_width=D, exp_width=E + 1,
                             latency=max(MUL_LATENCIES))
        wide = ("float32", "float64")
        P = max(D + S, 53 if self._wide else 24)
        self._round_p = FloatRound(wide if self._wide else ("float32",), sig_width=P,
                                   exp_width=E + 2, latency=ROUND_LATENCY)
        if self._wide and "bfloat16" in c.dq_outputs:
            self._round_b = FloatRound(wide, sig_width=P, exp_width=E + 2,
                                       latency=ROUND_LATENCY)
        if self._wide or c.dq_outputs != ("float32",):
            self._round_out = FloatRound(c.dq_outputs, sig_width=P, exp_width=E + 2,
                                         latency=ROUND_LATENCY)
        # A NaN scale's payload survives to float32 and float16 outputs (quieted, truncated),
        # as NumPy's multiply and casts keep it; bfloat16 outputs and the other NaNs are the
        # canonical ones FloatRound gives.
        self._payload = (any(t in ("float32", "float16", "bfloat16") for t in scales)
                         and any(t in ("float32", "float16") for t in c.dq_outputs))
        self._latency = 1 + sum(u.latency for u in (
            self._dec_x, self._round_x, self._sub, self._mul, self._round_p, self._round_b,
            self._round_out) if u is not None)
        out_bits = max(FORMATS[t].bits for t in c.dq_outputs)
        super().__init__({
            "regs": In(dequantize_lane_regs(c)),
            "x": In(unsigned(max(t.bits for t in ins))),
            "zero_point": In(unsigned(max(t.bits for t in ins))),
            "scale": In(unsigned(max(decode_type(t).bits for t in scales))),
            "y": Out(unsigned(out_bits)),
        })

    def _nan_payload(self, m: Module, code) -> Signal:
        """``code`` with a NaN scale's payload: the scale's mantissa widened to float32's 23
        bits (float16 << 13, bfloat16 << 16), quieted, and for a float16 output its top 10
        bits, as NumPy gives them; the sign is the scale's, as the product's already is."""
        c, regs = self._config, self.regs
        scales = dq_scales(c)
        payload = Signal(23)
        with m.Switch(regs.s_fmt):
            for k, t in enumerate(scales):
                if t in ("float32", "float16", "bfloat16"):
                    f = FORMATS[t]
                    with m.Case(k):
                        m.d.comb += payload.eq(self.scale[:f.mbits] << (23 - f.mbits))
        nan = self._dec_s.o.cls == FloatClass.NAN
        d = self._dec_s.latency
        late = line(m, Cat(delay(m, payload, d, "payload"), nan), self._latency - 1 - d,
                    "payload")
        out = Signal.like(code)
        m.d.comb += out.eq(code)
        with m.If(late[-1]):
            with m.Switch(regs.out_fmt):
                for k, t in enumerate(c.dq_outputs):
                    f = FORMATS[t]
                    if t in ("float32", "float16"):
                        with m.Case(k):
                            quiet = 1 << (f.mbits - 1)
                            m.d.comb += out[:f.mbits].eq(late[23 - f.mbits:23] | quiet)
        return out

    @property
    def config(self) -> AccelConfig:
        return self._config

    @property
    def latency(self) -> int:
        """Cycles from ``x``/``scale``/``zero_point``/``regs`` to ``y``."""
        return self._latency

    def elaborate(self, platform):
        m = Module()
        regs = self.regs
        for name in ("dec_x", "dec_zp", "dec_s", "round_x", "sub", "mul", "round_p",
                     "round_b", "round_out"):
            if getattr(self, f"_{name}") is not None:
                m.submodules[name] = getattr(self, f"_{name}")
        dec_x, dec_zp, dec_s = self._dec_x, self._dec_zp, self._dec_s

        m.d.comb += [dec_x.code.eq(self.x), dec_x.fmt.eq(regs.x_fmt),
                     dec_zp.code.eq(self.zero_point), dec_zp.fmt.eq(regs.x_fmt),
                     dec_s.code.eq(self.scale), dec_s.fmt.eq(regs.s_fmt)]
        lat = dec_x.latency
        x, zp = dec_x.o, dec_zp.o
        # 2. x.astype(float32)
        if self._round_x is not None:
            rx = self._round_x
            m.d.comb += [rx.i.eq(x), rx.fmt.eq(0), rx.saturate.eq(0)]
            x, zp = rx.value, delay(m, zp, rx.latency, "zp")
            lat += rx.latency
        # 3. minus the zero point (+0 when there is none: x - (+0) is x, -0 included)
        sub = self._sub
        m.d.comb += [sub.a.eq(x), sub.sub.eq(1)]
        plus_zero = Signal.like(zp)
        m.d.comb += [plus_zero.cls.eq(FloatClass.ZERO), sub.b.eq(plus_zero)]
        with m.If(regs.use_zp):
            m.d.comb += sub.b.eq(zp)
        lat += sub.latency
        # 4. times the scale, rounded to float32 (float64 when wide)
        mul = self._mul
        m.d.comb += [mul.b.eq(sub.s), mul.a.eq(delay(m, dec_s.o, lat - dec_s.latency, "s"))]
        rp = self._round_p
        pad = len(rp.i.sig) - len(mul.p.sig)
        m.d.comb += [rp.i.sign.eq(mul.p.sign), rp.i.exp.eq(mul.p.exp),
                     rp.i.sig.eq(mul.p.sig << pad), rp.i.sticky.eq(mul.p.sticky),
                     rp.i.cls.eq(mul.p.cls), rp.fmt.eq(regs.wide if self._wide else 0),
                     rp.saturate.eq(0)]
        value, code = rp.value, rp.code
        # 5. a float64 product bound for bfloat16 is rounded to float32 first (ml_dtypes)
        c = self._config
        if self._round_b is not None:
            rb = self._round_b
            to_bf16 = Signal()
            with m.Switch(regs.out_fmt):
                for k, name in enumerate(c.dq_outputs):
                    with m.Case(k):
                        m.d.comb += to_bf16.eq(name == "bfloat16")
            m.d.comb += [rb.i.eq(value), rb.fmt.eq(~(regs.wide & to_bf16)),
                         rb.saturate.eq(0)]
            value = rb.value
        if self._round_out is not None:
            ro = self._round_out
            m.d.comb += [ro.i.eq(value), ro.fmt.eq(regs.out_fmt), ro.saturate.eq(0)]
            code = ro.code
        if self._payload:
            code = self._nan_payload(m, code)
        m.d.sync += self.y.eq(code)
        return m
