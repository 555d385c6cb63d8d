"""One lane of the Dequantize unit: ONNX DequantizeLinear of one element."""

from __future__ import annotations

from types import SimpleNamespace

from amaranth.hdl import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.config import AccelConfig
from qaccel.model.dtypes import QType
from qaccel.model.floatfmt import FORMATS
from qaccel.model.validate import check_bool
from qaccel.rtl.arith.decode import Decode, decode_type
from qaccel.rtl.arith.decode import min_exp_width as decode_exp_width
from qaccel.rtl.arith.decode import min_sig_width as decode_sig_width
from qaccel.rtl.arith.float_mul import LATENCIES as MUL_LATENCIES
from qaccel.rtl.arith.float_mul import FloatMul
from qaccel.rtl.arith.float_round import LATENCIES as ROUND_LATENCIES
from qaccel.rtl.arith.float_round import FloatRound
from qaccel.rtl.arith.float_round import min_exp_width as round_exp_width
from qaccel.rtl.arith.float_unpack import FloatClass
from qaccel.rtl.arith.fp32_narrow import LATENCY as NARROW_LATENCY
from qaccel.rtl.arith.fp32_narrow import Fp32Narrow
from qaccel.rtl.arith.int_diff import IntDiff
from qaccel.rtl.arith.int_scale_mul import IntScaleMul
from qaccel.rtl.arith.int_to_float import IntToFloat
from qaccel.rtl.arith.pipeline import check_latencies, delay, field_width, line
from qaccel.rtl.arith.wide_float import wide_float_layout
from qaccel.rtl.elementwise.scale_to_f32 import LATENCY as SCALE32_LATENCY
from qaccel.rtl.elementwise.scale_to_f32 import ScaleToF32

__all__ = ["DequantizeLane", "dequantize_lane_regs", "dq_scales"]

#: The arithmetic units' deepest pipelines: one compare, shift or add per stage.
ROUND_LATENCY = max(ROUND_LATENCIES)
MUL_LATENCY = max(MUL_LATENCIES)
DECODE_LATENCY = 4
I2F_LATENCY = 3

#: Significant bits of each scale type's significand once widened to float32 (the top bits of
#: float32's 24; float8e8m0's ``2**23`` or, for code 0, ``2**22``: two).
_SCALE_SIG = {"float32": 24, "float16": 11, "bfloat16": 8, "float8e8m0": 2}

#: The lane's units (attributes ``_<name>``, None when not built; submodules ``<name>``):
#: the integer path's, then the general path's.
_UNITS = ("diff", "scale32", "imul", "narrow", "i2f", "dec_x", "dec_s", "mul", "round_p",
          "round_b", "round_out")


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

    The golden model computes ``x.astype(float32) - zero_point``, exact for every type (an
    integer difference, int32's ``x`` rounded to float32 first; a float8 / float4 ``x`` has
    no zero point), then the product with the scale, rounded once to float32 (float64 for
    int32 with a zero point), then to the output type. Two datapaths, chosen at build time
    from the carried types (formats chosen at run time by the registers ``regs``):

    * **Integer path**, when every ``config.dq_inputs`` type is an integer of at most 16
      bits (the qdq-int8 preset): the exact difference ``d``
      (:class:`~qaccel.rtl.arith.int_diff.IntDiff`, a sign and a magnitude) beside the scale
      widened to float32 (:class:`~qaccel.rtl.elementwise.scale_to_f32.ScaleToF32`), then
      ``f32(d * scale)`` (:class:`~qaccel.rtl.arith.int_scale_mul.IntScaleMul`: the integer
      product of ``|d|`` and the scale's significand, subnormal scales unnormalised, one
      rounding whose position never moves, since the small results are exact), then for a
      float16 / bfloat16 output a second rounding from float32
      (:class:`~qaccel.rtl.arith.fp32_narrow.Fp32Narrow`, as ``astype`` does; a float16 NaN keeps
      the top of the float32 NaN's payload). No wide floats, no leading-zero normalisation
      of the scale.
    * **General path**, otherwise (float8 / float4 inputs, int32): an integer ``x``'s exact
      difference (IntDiff, which rounds an int32 ``x`` to float32 first) converted once to a
      wide float (:class:`~qaccel.rtl.arith.int_to_float.IntToFloat`), or a float ``x`` decoded
      (:class:`~qaccel.rtl.arith.decode.Decode`); times the decoded scale
      (:class:`~qaccel.rtl.arith.float_mul.FloatMul`, truncated to a round and a sticky bit below
      the widest first rounding's significand; a NaN ``x`` times a NaN scale keeps the
      scale's sign, as the golden model does), rounded to float32, or float64 when ``wide``
      (:class:`~qaccel.rtl.arith.float_round.FloatRound`); then rounded to the output type (a
      float64 product bound for bfloat16 goes through float32, as ml_dtypes casts it; with
      float32 the only output and no int32 input, the first rounding is the last). A NaN
      scale's payload is carried to float32 and float16 outputs.

    ``y`` is the output code, right-aligned. Latency is :attr:`latency` cycles whatever the
    formats, one element per cycle; the registers are not pipelined and must be stable while
    elements are in flight. No handshake: :class:`~qaccel.rtl.elementwise.unit.Elementwise` adds
    one. ``ecp5=True`` builds the integer path's multipliers as MULT18X18D instances with their
    own registers, for synthesis (the same cycles); simulate with False (the default).

    Members
    -------
    regs : :py:`In(dequantize_lane_regs(config))`
    x, zero_point : :py:`In(unsigned(widest dq_inputs type))`
    scale : :py:`In(unsigned(widest float scale type))`
    y : :py:`Out(unsigned(widest dq_outputs type))`
    """

    def __init__(self, config: AccelConfig, *, ecp5: bool = False):
        self._plan = p = self.plan(config)
        self._config = c = config
        self._ecp5 = check_bool("ecp5", ecp5)
        self._int_path = p.int_path
        for name in _UNITS:
            setattr(self, f"_{name}", None)
        self._payload = False
        if self._int_path:
            self._init_int(c, p.scales)
        else:
            self._init_general(c, p.scales, p.ins)
        check_latencies(type(self).__name__, p.units,
                        {name: getattr(self, f"_{name}") for name in _UNITS})
        out_bits = max(FORMATS[t].bits for t in c.dq_outputs)
        super().__init__({
            "regs": In(dequantize_lane_regs(c)),
            "x": In(unsigned(max(t.bits for t in p.ins))),
            "zero_point": In(unsigned(max(t.bits for t in p.ins))),
            "scale": In(unsigned(max(decode_type(t).bits for t in p.scales))),
            "y": Out(unsigned(out_bits)),
        })

    @classmethod
    def plan(cls, config: AccelConfig) -> SimpleNamespace:
        """The lane for ``config`` without building it (``ecp5`` builds have the same cycles):
        ``scales`` (:func:`dq_scales`), ``ins`` (the input types), ``int_path``; ``units``, the
        latency of each sub-unit built (by the name of its attribute without the ``_``);
        ``latency``; on the general path ``front`` (``x`` to the multiplier's operand),
        ``ints``, ``floats`` and ``wide``; ``prep`` None (no table preparation).

        Raises TypeError unless ``config`` is an :class:`~qaccel.model.config.AccelConfig`,
        ValueError if it carries no float scale type."""
        if not isinstance(config, AccelConfig):
            raise TypeError(f"config must be an AccelConfig, not {config!r}")
        c = config
        p = SimpleNamespace(scales=dq_scales(c), prep=None)
        if not p.scales:
            raise ValueError(f"config.scales must include a float type for dequantisation, "
                             f"not {c.scales}")
        p.ins = [decode_type(t) for t in c.dq_inputs]
        # Integer inputs of at most 16 bits: the exact difference x - zero_point times the
        # scale widened to float32, rounded once (IntScaleMul); the other types (float8 /
        # float4 codes, int32 with its float32 rounding and float64 product) need the
        # general path.
        p.int_path = all(isinstance(t, QType) and t.bits <= 16 for t in p.ins)
        u = p.units = {}
        if p.int_path:
            p.imul_sig = max(_SCALE_SIG[t] for t in p.scales)
            u.update(diff=IntDiff.latency_for(c.dq_inputs), scale32=SCALE32_LATENCY,
                     imul=IntScaleMul.latency_for(width=IntDiff.width_for(c.dq_inputs),
                                                  sig_width=p.imul_sig))
            if c.dq_outputs != ("float32",):
                u["narrow"] = NARROW_LATENCY
            # a narrowed result is registered once more on y
            p.latency = u["diff"] + u["imul"] + (u["narrow"] + 1 if "narrow" in u else 0)
            return p
        p.ints = tuple(t.name for t in p.ins if isinstance(t, QType))
        p.floats = tuple(t.name for t in p.ins if not isinstance(t, QType))
        if p.ints:
            u.update(diff=IntDiff.latency_for(p.ints), i2f=I2F_LATENCY)
        if p.floats:
            u["dec_x"] = DECODE_LATENCY
        u.update(dec_s=DECODE_LATENCY, mul=MUL_LATENCY, round_p=ROUND_LATENCY)
        # Stages built only when a carried type needs them: int32 brings the float64 product
        # (``wide``), and with a bfloat16 output its second rounding through float32; a
        # float32-only output needs no rounding after the product's.
        p.wide = "int32" in c.dq_inputs
        if p.wide and "bfloat16" in c.dq_outputs:
            u["round_b"] = ROUND_LATENCY
        if p.wide or c.dq_outputs != ("float32",):
            u["round_out"] = ROUND_LATENCY
        p.front = max(u.get("diff", 0) + u.get("i2f", 0), u.get("dec_x", 0))
        # the product and its roundings, then the output register
        p.latency = 1 + p.front + sum(u.get(k, 0) for k in ("mul", "round_p", "round_b",
                                                          "round_out"))
        return p

    def _init_int(self, c: AccelConfig, scales) -> None:
        """The integer path's units (see :meth:`_elaborate_int`)."""
        self._diff = IntDiff(c.dq_inputs)
        self._scale32 = ScaleToF32(scales)
        self._imul = IntScaleMul(width=self._diff.width, sig_width=self._plan.imul_sig,
                                 ecp5=self._ecp5)
        if "narrow" in self._plan.units:
            self._narrow = Fp32Narrow()

    def _init_general(self, c: AccelConfig, scales, ins) -> None:
        """The general path's units (see :meth:`_elaborate_general`)."""
        p = self._plan
        self._exp = max(decode_exp_width(ins), decode_exp_width(
            [decode_type(t) for t in scales]) - 1, round_exp_width([FORMATS["float64"]]) - 2)
        E = self._exp
        # x - zero_point: an integer x's exact difference (int32's x rounded to float32
        # first), converted once; a float8 / float4 x as it is (its zero point is ignored)
        widths = []
        if p.ints:
            self._diff = IntDiff(p.ints)
            self._i2f = IntToFloat(width=self._diff.width, exp_width=E + 1,
                                   latency=I2F_LATENCY)
            widths.append(self._diff.width)
        if p.floats:
            widths.append(decode_sig_width([decode_type(t) for t in p.floats]))
            self._dec_x = Decode(p.floats, sig_width=widths[-1], exp_width=E + 1,
                                 latency=DECODE_LATENCY)
        D = max(widths)
        # the multiplier: the widest scale significand (float8e8m0's is one bit) times the
        # difference
        S = decode_sig_width([decode_type(t) for t in scales])
        self._dec_s = Decode(scales, sig_width=S, exp_width=E + 1, latency=DECODE_LATENCY)
        self._wide = p.wide
        # The product keeps the first rounding's widest significand (R bits: float64's with
        # int32, float32's otherwise), a round bit and a sticky bit (FloatMul's out_width),
        # which round as the exact product does; the first rounding's result is exact in R
        # bits, so the later roundings take R bits. The scale is the first operand: a NaN
        # times a NaN keeps the scale's (the golden kernels' result).
        R = 53 if self._wide else 24
        self._mul = FloatMul(a_width=S, b_width=D, exp_width=E + 1,
                             out_width=R + 1 if D + S > R + 1 else None,
                             latency=MUL_LATENCY)
        wide = ("float32", "float64")
        self._round_p = FloatRound(wide if self._wide else ("float32",),
                                   sig_width=max(self._mul.out_width, R), exp_width=E + 2,
                                   latency=ROUND_LATENCY)
        if "round_b" in p.units:
            self._round_b = FloatRound(wide, sig_width=R, exp_width=E + 2,
                                       latency=ROUND_LATENCY)
        if "round_out" in p.units:
            self._round_out = FloatRound(c.dq_outputs, sig_width=R, exp_width=E + 2,
                                         latency=ROUND_LATENCY)
        # A NaN scale's payload survives to float32 and float16 outputs (quieted, truncated),
        # as NumPy's multiply and casts keep it; bfloat16 outputs and the other NaNs are the
        # canonical ones FloatRound gives.
        self._payload = (any(t in ("float32", "float16", "bfloat16") for t in scales)
                         and any(t in ("float32", "float16") for t in c.dq_outputs))

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
        late = line(m, Cat(delay(m, payload, d, "payload"), nan), self._plan.latency - 1 - d,
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
        return self._plan.latency

    def elaborate(self, platform):
        m = Module()
        for name in _UNITS:
            if getattr(self, f"_{name}") is not None:
                m.submodules[name] = getattr(self, f"_{name}")
        if self._int_path:
            self._elaborate_int(m)
        else:
            self._elaborate_general(m)
        return m

    def _elaborate_int(self, m: Module) -> None:
        """Integer inputs: ``d = x - zero_point`` exactly (:class:`~qaccel.rtl.arith.int_diff.
        IntDiff`) beside the scale widened to float32 (:class:`~qaccel.rtl.elementwise.scale_to_f32.
        ScaleToF32`), then ``f32(d * scale)``
        (:class:`~qaccel.rtl.arith.int_scale_mul.IntScaleMul`),
        the golden model's one rounding: ``x.astype(float32) - zp`` is exact and a float16 /
        bfloat16 scale is widened to float32 by NumPy's promotion. A float16 / bfloat16
        output is that float32 rounded again (:class:`~qaccel.rtl.arith.fp32_narrow.Fp32Narrow`, as
        ``astype`` does), a float16 NaN keeping the top of the float32 NaN's payload."""
        regs, c = self.regs, self._config
        diff, scale32, imul = self._diff, self._scale32, self._imul
        m.d.comb += [diff.x.eq(self.x), diff.zero_point.eq(self.zero_point),
                     diff.fmt.eq(regs.x_fmt), diff.use_zp.eq(regs.use_zp),
                     scale32.code.eq(self.scale), scale32.fmt.eq(regs.s_fmt),
                     imul.mag.eq(diff.mag), imul.neg.eq(diff.neg), imul.zero.eq(diff.zero),
                     imul.s.eq(scale32.f32)]
        if self._narrow is None:
            m.d.comb += self.y.eq(imul.y)
            return
        narrow = self._narrow
        f32 = imul.y
        to_bf16 = Signal()
        with m.Switch(regs.out_fmt):
            for k, name in enumerate(c.dq_outputs):
                with m.Case(k) if k < len(c.dq_outputs) - 1 else m.Default():
                    m.d.comb += to_bf16.eq(name == "bfloat16")
        m.d.comb += [narrow.a.eq(f32), narrow.fmt.eq(to_bf16)]
        late = delay(m, f32, narrow.latency, "f32")
        nan = (late[23:31] == 0xFF) & (late[:23] != 0)
        y = Signal.like(self.y)
        with m.Switch(regs.out_fmt):
            for k, name in enumerate(c.dq_outputs):
                with m.Case(k) if k < len(c.dq_outputs) - 1 else m.Default():
                    if name == "float32":
                        m.d.comb += y.eq(late)
                    elif name == "float16":
                        m.d.comb += y.eq(Mux(nan, Cat(late[13:23], Const(0x1F, 5), late[31]),
                                             narrow.y))
                    else:
                        m.d.comb += y.eq(narrow.y)
        m.d.sync += self.y.eq(y)

    def _elaborate_general(self, m: Module) -> None:
        """The other input types: an integer x's exact difference ``x - zero_point``
        (:class:`~qaccel.rtl.arith.int_diff.IntDiff`, which rounds an int32 x to float32 first) as
        a wide float (:class:`~qaccel.rtl.arith.int_to_float.IntToFloat`), or a float x decoded;
        times the scale (decoded), rounded to float32 (float64 when ``wide``), then to the
        output type."""
        regs, c = self.regs, self._config
        dec_s = self._dec_s
        m.d.comb += [dec_s.code.eq(self.scale), dec_s.fmt.eq(regs.s_fmt)]
        diff, i2f, dec_x = self._diff, self._i2f, self._dec_x
        ints = diff.types if diff is not None else ()
        lat = self._plan.front
        b = Signal(self._mul.b.shape())
        is_int = Signal()
        with m.Switch(regs.x_fmt):
            for k, name in enumerate(c.dq_inputs):
                t = decode_type(name)
                with m.Case(k) if k < len(c.dq_inputs) - 1 else m.Default():
                    if isinstance(t, QType):
                        m.d.comb += [is_int.eq(1), diff.fmt.eq(ints.index(t))]
                    else:
                        m.d.comb += dec_x.fmt.eq(dec_x.index(t))
        width = len(b.sig)
        from_int = from_float = None
        if diff is not None:
            m.d.comb += [diff.x.eq(self.x), diff.zero_point.eq(self.zero_point),
                         diff.use_zp.eq(regs.use_zp), i2f.i.eq(diff.mag), i2f.signed.eq(0)]
            v = Signal.like(b)
            neg = delay(m, diff.neg, i2f.latency, "neg")
            m.d.comb += [v.sign.eq(neg), v.exp.eq(i2f.o.exp), v.cls.eq(i2f.o.cls),
                         v.sig.eq(i2f.o.sig << (width - len(i2f.o.sig)))]
            from_int = delay(m, v, lat - diff.latency - i2f.latency, "d")
        if dec_x is not None:
            m.d.comb += dec_x.code.eq(self.x)
            v = Signal.like(b)
            o = dec_x.o
            m.d.comb += [v.sign.eq(o.sign), v.exp.eq(o.exp), v.cls.eq(o.cls),
                         v.sig.eq(o.sig << (width - len(o.sig)))]
            from_float = delay(m, v, lat - dec_x.latency, "xf")
        if from_int is None or from_float is None:
            m.d.comb += b.eq(from_int if from_float is None else from_float)
        else:
            m.d.comb += b.eq(Mux(is_int, from_int, from_float))
        # 4. times the scale, rounded to float32 (float64 when wide)
        mul = self._mul
        m.d.comb += [mul.b.eq(b), mul.a.eq(delay(m, dec_s.o, lat - dec_s.latency, "s"))]
        rp = self._round_p
        pad = len(rp.i.sig) - len(mul.p.sig)
        m.d.comb += [rp.i.sign.eq(mul.p.sign), rp.i.exp.eq(mul.p.exp),
                     rp.i.sig.eq(mul.p.sig << pad), rp.i.sticky.eq(mul.p.sticky),
                     rp.i.cls.eq(mul.p.cls), rp.fmt.eq(regs.wide if self._wide else 0),
                     rp.saturate.eq(0)]
        code = rp.code
        value = Signal(wide_float_layout(53 if self._wide else 24, len(rp.value.exp)))
        m.d.comb += [value.sign.eq(rp.value.sign), value.exp.eq(rp.value.exp),
                     value.cls.eq(rp.value.cls),
                     value.sig.eq(rp.value.sig[len(rp.value.sig) - len(value.sig):])]
        # 5. a float64 product bound for bfloat16 is rounded to float32 first (ml_dtypes)
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
