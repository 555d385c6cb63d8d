"""One lane of the Dequantize unit: ONNX DequantizeLinear of one element."""

from __future__ import annotations

from amaranth.hdl import Module, Signal, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.config import AccelConfig
from qaccel.model.floatfmt import FORMATS
from qaccel.rtl.decode import Decode, decode_type
from qaccel.rtl.decode import min_exp_width as decode_exp_width
from qaccel.rtl.float_add import FloatAdd
from qaccel.rtl.float_mul import FloatMul
from qaccel.rtl.float_round import FloatRound
from qaccel.rtl.float_round import min_exp_width as round_exp_width
from qaccel.rtl.float_unpack import FloatClass
from qaccel.rtl.pipeline import delay, field_width

__all__ = ["DequantizeLane", "dequantize_lane_regs", "dq_scales"]

#: Width of the exact difference ``f32(x) - zero_point``: both are integers below 2**32.
_DIFF_WIDTH = 36


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
    2. round ``x`` to float32 (``x.astype(float32)``: exact but for int32);
    3. subtract the zero point (exact: both are integers below ``2**32``);
    4. multiply by the scale (exact product), round to float32, or float64 when ``wide``;
    5. round to the output type (a float64 product bound for bfloat16 goes through float32,
       as ml_dtypes casts it).

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
        E, W = self._exp, 32
        self._dec_x = Decode(c.dq_inputs, sig_width=W, exp_width=E)
        self._dec_zp = Decode(c.dq_inputs, sig_width=W, exp_width=E)
        self._dec_s = Decode(scales, sig_width=24, exp_width=E + 1)
        self._round_x = FloatRound(("float32",), sig_width=W, exp_width=E, latency=3)
        self._sub = FloatAdd(a_width=W, b_width=W, exp_width=E, out_width=_DIFF_WIDTH,
                             latency=3)
        self._mul = FloatMul(a_width=_DIFF_WIDTH, b_width=24, exp_width=E + 1, latency=2)
        P = _DIFF_WIDTH + 24
        wide = ("float32", "float64")
        self._round_p = FloatRound(wide, sig_width=P, exp_width=E + 2, latency=3)
        self._round_b = FloatRound(wide, sig_width=P, exp_width=E + 2, latency=3)
        self._round_out = FloatRound(c.dq_outputs, sig_width=P, exp_width=E + 2, latency=3)
        self._latency = (self._dec_x.latency + self._round_x.latency + self._sub.latency
                         + self._mul.latency + self._round_p.latency + self._round_b.latency
                         + self._round_out.latency + 1)
        out_bits = max(FORMATS[t].bits for t in c.dq_outputs)
        super().__init__({
            "regs": In(dequantize_lane_regs(c)),
            "x": In(unsigned(max(t.bits for t in ins))),
            "zero_point": In(unsigned(max(t.bits for t in ins))),
            "scale": In(unsigned(max(FORMATS[t].bits for t in scales))),
            "y": Out(unsigned(out_bits)),
        })

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
            m.submodules[name] = getattr(self, f"_{name}")
        dec_x, dec_zp, dec_s = self._dec_x, self._dec_zp, self._dec_s

        m.d.comb += [dec_x.code.eq(self.x), dec_x.fmt.eq(regs.x_fmt),
                     dec_zp.code.eq(self.zero_point), dec_zp.fmt.eq(regs.x_fmt),
                     dec_s.code.eq(self.scale), dec_s.fmt.eq(regs.s_fmt)]
        lat = dec_x.latency
        # 2. x.astype(float32)
        rx = self._round_x
        m.d.comb += [rx.i.eq(dec_x.o), rx.fmt.eq(0), rx.saturate.eq(0)]
        zp = delay(m, dec_zp.o, rx.latency, "zp")
        lat += rx.latency
        # 3. minus the zero point (+0 when there is none: x - (+0) is x, -0 included)
        sub = self._sub
        m.d.comb += [sub.a.eq(rx.value), sub.sub.eq(1)]
        plus_zero = Signal.like(zp)
        m.d.comb += [plus_zero.cls.eq(FloatClass.ZERO), sub.b.eq(plus_zero)]
        with m.If(regs.use_zp):
            m.d.comb += sub.b.eq(zp)
        lat += sub.latency
        # 4. times the scale, rounded to float32 (float64 when wide)
        mul = self._mul
        m.d.comb += [mul.a.eq(sub.s), mul.b.eq(delay(m, dec_s.o, lat - dec_s.latency, "s"))]
        rp = self._round_p
        m.d.comb += [rp.i.eq(mul.p), rp.fmt.eq(regs.wide), rp.saturate.eq(0)]
        # 5. a float64 product bound for bfloat16 is rounded to float32 first (ml_dtypes)
        rb = self._round_b
        c = self._config
        to_bf16 = Signal()
        with m.Switch(regs.out_fmt):
            for k, name in enumerate(c.dq_outputs):
                with m.Case(k):
                    m.d.comb += to_bf16.eq(name == "bfloat16")
        m.d.comb += [rb.i.eq(rp.value), rb.fmt.eq(~(regs.wide & to_bf16)), rb.saturate.eq(0)]
        ro = self._round_out
        m.d.comb += [ro.i.eq(rb.value), ro.fmt.eq(regs.out_fmt), ro.saturate.eq(0)]
        m.d.sync += self.y.eq(ro.code)
        return m
