"""One shared float lane of the MatMulNBits v2 engine: block terms of (row, column) accumulators
to float32, accumulated in a memory of accumulators (docs/matmul_nbits_v2.md, section 1)."""

from __future__ import annotations

from typing import NamedTuple

from amaranth.hdl import Cat, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from qaccel.model.validate import check_bool, check_int
from qaccel.rtl.arith.block_fifo import LATENCY as _FIFO_LATENCY
from qaccel.rtl.arith.block_fifo import BlockFifo
from qaccel.rtl.arith.fp32_add import Fp32Add
from qaccel.rtl.arith.fp32_mul import LATENCY as FP32_MUL_LATENCY
from qaccel.rtl.arith.fp32_mul import Fp32Mul
from qaccel.rtl.arith.pipeline import delay, line

__all__ = ["ADD_LATENCY", "LUT_RAM_DEPTH", "MAX_DEPTH", "MUL_LATENCY", "RECURRENCE", "Ages",
           "ScaleLane", "ages", "latency"]

#: Largest ``depth`` (accumulator words).
MAX_DEPTH = 1024
#: Largest ``depth`` kept in LUT RAM (``ram_style = "distributed"``); deeper memories are
#: block RAM (``"block"``) with a registered output.
LUT_RAM_DEPTH = 64


#: Cycles of the float32 multiplier (:class:`~qaccel.rtl.arith.fp32_mul.Fp32Mul` on DSPs).
MUL_LATENCY = FP32_MUL_LATENCY[True]
#: Cycles of the float32 adder (:class:`~qaccel.rtl.arith.fp32_add.Fp32Add`).
ADD_LATENCY = Fp32Add.LATENCY
#: Smallest distance between two admitted beats of one accumulator that never stalls: the
#: adder's latency + 1 (:attr:`ScaleLane.recurrence`).
RECURRENCE = ADD_LATENCY + 1


def _mul(ecp5: bool) -> wiring.Component:
    """The float32 multiplier: ports ``a``, ``b``, ``y`` (bit patterns), :data:`MUL_LATENCY`
    cycles; the significand product on MULT18X18Ds, instances with their registers with
    ``ecp5``."""
    return Fp32Mul(dsp=True, ecp5=ecp5)


def _add() -> wiring.Component:
    """The float32 adder: ports ``a``, ``b``, ``y`` (bit patterns), :data:`ADD_LATENCY`
    cycles."""
    return Fp32Add()


class Ages(NamedTuple):
    """Cycles after a beat's input transfer (no stall) at which a ScaleLane's values are
    available: ``f = f32(d)``, the second multiply's operands, the adder's operands, the
    sum."""

    f: int
    mul2: int
    add: int
    y: int


def ages(isum_width: int, asum_width: int) -> Ages:
    """The :class:`Ages` of a ScaleLane of these widths: the input register, ``zp * asum``
    (2), ``d``, ``|d|``, the normalising shifts (:func:`_shift_groups`), round and pack give
    ``f``; the first multiply runs beside them."""
    f = 6 + len(_shift_groups(_d_width(isum_width, asum_width)))
    mul2 = max(1 + MUL_LATENCY, f)
    return Ages(f, mul2, mul2 + MUL_LATENCY, mul2 + MUL_LATENCY + ADD_LATENCY)


def latency(isum_width: int, asum_width: int) -> int:
    """:attr:`ScaleLane.latency` of a lane of these widths, without building it: the sum's
    age, then the output FIFO."""
    return ages(isum_width, asum_width).y + _FIFO_LATENCY


def _d_width(isum_width: int, asum_width: int) -> int:
    """Bits of the signed ``d = isum + 16 * isum_hi - zp * asum`` (the first two fit
    ``isum_width + 5``, ``zp * asum`` fits ``asum_width + 8``)."""
    return max(isum_width + 5, asum_width + 8) + 1


def _shift_groups(n: int) -> list[list[int]]:
    """The normalising shifts of an ``n``-bit magnitude (16, 8, 4, 2, 1 for ``n`` 17..32),
    grouped by pipeline stage: 8 and more alone (a wide zero test), 4 and 2 together, 1 in the
    stage that also forms the exponent."""
    shifts = [1 << k for k in reversed(range((n - 1).bit_length()))]
    groups = [[s] for s in shifts if s >= 8]
    mid = [s for s in shifts if s in (2, 4)]
    if mid:
        groups.append(mid)
    if 1 in shifts:
        groups.append([1])
    return groups


class ScaleLane(wiring.Component):
    """Block terms to float32 and their accumulation, one operation per cycle.

    Each input beat on ``i`` is one K-block term of one accumulator ``acc[addr]`` (one (row,
    column) pair of the int8 path, :mod:`qaccel.model.nbits_hw`). The lane computes, exactly
    as the contract of docs/matmul_nbits_v2.md (section 1) says:

    * ``d = isum + 16 * isum_hi - zp * asum``, an exact integer (``isum`` and ``isum_hi``
      signed ``isum_width`` bits: a block sum, or with codes of 5..8 bits the sums of their
      low and high nibbles, which the MAC array keeps in two columns; ``asum``
      signed ``asum_width`` bits, ``zp`` unsigned 8 bits), and ``f = f32(d)``, rounded to
      nearest even when ``|d| >= 2**24`` (a dedicated pipeline: subtract, magnitude, a
      leading-zero shift in stages, round and pack);
    * ``t = f32(f32(sa * sb) * f)`` (``sa``, ``sb`` float32 bit patterns; ``sa * sb`` is
      computed beside the conversion);
    * ``acc' = f32(base + t)``, ``base = bias`` if ``first`` else ``acc[addr]``;
    * if ``last``: ``acc'`` leaves on ``o`` with its ``addr`` (and is not written back); else
      ``acc[addr] = acc'``. ``first`` and ``last`` may both be set (a one-block row).

    Every float32 operation is one unit of :func:`_mul` / :func:`_add`
    (:class:`~qaccel.rtl.arith.fp32_mul.Fp32Mul` with ``dsp=True`` and the lane's ``ecp5``,
    :class:`~qaccel.rtl.arith.fp32_add.Fp32Add`): rounded to nearest even, subnormals included, with
    x86-64 NumPy's special values (``0 * inf`` gives ``0xFFC00000``, a NaN operand a NaN with
    its sign, the first operand's if both are: ``sa * sb``, then ``(sa*sb) * f``, then
    ``base + t``). NaN payloads are not carried (NumPy keeps them). After a ``last`` beat the
    next beat of the same ``addr`` must have ``first`` set (the accumulator is not written);
    ``addr`` must be below ``depth``.

    Input: no flow control (``i.ready`` is always high): every transferred beat is admitted
    into the pipeline, which never stalls. The feeder keeps the two rules below with a
    :class:`~qaccel.rtl.nbits.lane_admission.LaneAdmission` (``LaneAdmission.for_lane(lane)``),
    which decides a cycle ahead and beside the feeder, so no lane signal lies on the
    feeder's control paths.

    Pipeline (cycles after the transfer; ``Lm``, ``La`` the units' latencies, ``Lc`` the
    conversion's, 9 for ``d`` of 17..32 bits): input register (1); ``sa * sb`` from cycle 1
    beside ``zp * asum`` (shift and add in LUTs), ``d``, ``f``; the second product from cycle
    ``1 + max(Lm, Lc)``; the accumulator is read (:attr:`read_latency` registers, then one
    that selects the bias or forwards the write-backs the read cannot see yet) so that
    ``base`` and ``t`` meet the adder in cycle :attr:`adder_cycle`; the sum is written back
    (or into the output FIFO) ``La`` cycles later. The pipeline never stalls: admission is the
    only flow control.

    Latency: :attr:`latency` cycles from the transfer of a ``last`` beat to its ``o`` beat
    being offered (no stalls): ``adder_cycle + La + 2`` (the FIFO's write and output
    register); 28 for ``d`` of 17..32 bits (Fp32Mul 8, Fp32Add 8 cycles).

    Recurrence: :attr:`recurrence` ``= La + 1`` cycles (9 with Fp32Add): a beat that reads
    ``acc[addr]`` (``first`` clear) must come at least that many cycles after the last beat
    that writes the same ``addr`` (``last`` clear); its read then sees that write-back
    through the forwarding. Beats with ``first`` set never wait for it.

    Output credit: at most :attr:`fifo_depth` results (a power of two above :attr:`latency`,
    so the credit never runs out while ``o.ready`` is high) may be admitted and not yet
    transferred on ``o``. Back-pressure on ``o`` then never loses or duplicates a result.

    Throughput: one beat per cycle. A synchronous reset drops everything in flight and the
    FIFO (the accumulator memory keeps its contents, which ``first`` overwrites).

    Resources (LFE5U-25F speed 6, :func:`qaccel.eda.synth.synthesize`): see
    tests/rtl/nbits/test_scale_lane.py's ``synth`` tests for the measured figures. With the former
    Binary32 units (``depth=32``, 26/17-bit sums) the lane was 4723 LUT4, 8 MULT18X18D,
    54-58 MHz (Binary32's own paths); the lane's own logic, measured with the float units
    replaced by registered stand-ins, reaches about 177 MHz (the forwarding compare); with
    block RAM accumulators (``depth > 64``) about 138 MHz, the DP16KD's unregistered output
    being the limit. Each Fp32Mul(dsp=True) takes three MULT18X18D (``zp * asum`` is
    shift-and-add in LUTs): six per lane.

    Parameters
    ----------
    depth : :class:`int`
        Accumulator words, 1 .. :data:`MAX_DEPTH` (1024): a :class:`~amaranth.lib.memory.
        Memory` with a synchronous read, LUT RAM up to :data:`LUT_RAM_DEPTH` (64) words,
        block RAM above (its ``ram_style`` attribute).
    isum_width : :class:`int`
        Width of the signed ``isum`` and ``isum_hi``, 2..40.
    asum_width : :class:`int`
        Width of the signed ``asum``, 2..32.
    ecp5 : :class:`bool`
        Instantiate the ECP5 primitives this unit has a variant for: the float32
        multipliers' MULT18X18Ds as instances with their registers (synthesis only;
        simulation needs False, the default).

    Raises
    ------
    :exc:`TypeError`, :exc:`ValueError`
        If a parameter is not an integer or out of range; the message names it.

    Members
    -------
    i : :py:`In(stream.Signature(StructLayout({"isum": signed(isum_width), "isum_hi":
        signed(isum_width), "asum":
        signed(asum_width), "zp": unsigned(8), "sa": unsigned(32), "sb": unsigned(32),
        "bias": unsigned(32), "first": unsigned(1), "last": unsigned(1),
        "addr": unsigned(addr_width)})))`
        One block term; ``bias`` is read with ``first`` only.
    o : :py:`Out(stream.Signature(StructLayout({"y": unsigned(32), "addr":
        unsigned(addr_width)})))`
        One beat per ``last`` input, in input order.
    """

    def __init__(self, *, depth: int, isum_width: int, asum_width: int, ecp5: bool = False):
        self._depth = check_int("depth", depth, 1, MAX_DEPTH)
        self._isum_width = check_int("isum_width", isum_width, 2, 40)
        self._asum_width = check_int("asum_width", asum_width, 2, 32)
        check_bool("ecp5", ecp5)
        self._ecp5 = ecp5
        self._addr_width = max(1, (depth - 1).bit_length())
        self._mul1, self._mul2, self._adder = _mul(ecp5), _mul(ecp5), _add()
        built = (self._mul1.latency, self._mul2.latency, self._adder.latency)
        assert built == (MUL_LATENCY, MUL_LATENCY, ADD_LATENCY), built
        self._dw = _d_width(isum_width, asum_width)
        self._groups = _shift_groups(self._dw)
        self._ages = ages(isum_width, asum_width)
        self._fifo_depth = 1 << (self.latency + 1).bit_length()
        self._in_layout = data.StructLayout({
            "isum": signed(isum_width), "isum_hi": signed(isum_width),
            "asum": signed(asum_width), "zp": unsigned(8),
            "sa": unsigned(32), "sb": unsigned(32), "bias": unsigned(32),
            "first": unsigned(1), "last": unsigned(1), "addr": unsigned(self._addr_width)})
        self._out_layout = data.StructLayout({"y": unsigned(32),
                                              "addr": unsigned(self._addr_width)})
        super().__init__({
            "i": In(stream.Signature(self._in_layout)),
            "o": Out(stream.Signature(self._out_layout)),
        })

    @property
    def depth(self) -> int:
        """Accumulator words."""
        return self._depth

    @property
    def ecp5(self) -> bool:
        """Whether the float32 multipliers' MULT18X18Ds are instances (synthesis only)."""
        return self._ecp5

    @property
    def isum_width(self) -> int:
        return self._isum_width

    @property
    def asum_width(self) -> int:
        return self._asum_width

    @property
    def addr_width(self) -> int:
        """Bits of ``addr``: ``max(1, ceil(log2(depth)))``."""
        return self._addr_width

    @property
    def read_latency(self) -> int:
        """Registers on the accumulator read: 1 for up to :data:`LUT_RAM_DEPTH` words (LUT
        RAM), 2 above (block RAM, whose output is registered once more)."""
        return 1 if self._depth <= LUT_RAM_DEPTH else 2

    @property
    def convert_latency(self) -> int:
        """Cycles of the ``f32(d)`` path from the input register to ``f``."""
        return self._ages.f - 1

    @property
    def adder_cycle(self) -> int:
        """Cycles from the input transfer (no stall) to ``base`` and ``t`` at the adder's
        inputs."""
        return self._ages.add

    @property
    def latency(self) -> int:
        """Cycles from the transfer of a ``last`` beat to its ``o`` beat offered (no
        stalls): :attr:`adder_cycle` ``+`` the adder's latency ``+ 2``."""
        return latency(self._isum_width, self._asum_width)

    @property
    def recurrence(self) -> int:
        """Smallest distance in cycles between two admitted beats of the same ``addr`` (the
        second with ``first`` clear) that never stalls: the adder's latency ``+ 1``."""
        return RECURRENCE

    @property
    def fifo_depth(self) -> int:
        """Output FIFO entries (``last`` beats admitted and not yet transferred on ``o``)."""
        return self._fifo_depth

    # -- helpers ----------------------------------------------------------------------------

    def elaborate(self, platform):
        m = Module()
        i, o = self.i, self.o
        y_age, a_age = self._ages.y, self._ages.add
        m.submodules.mul_ab = mul1 = self._mul1
        m.submodules.mul_t = mul2 = self._mul2
        m.submodules.add = add = self._adder
        m.submodules.fifo = out_fifo = BlockFifo(width=self._out_layout.size,
                                                 depth=self._fifo_depth, ecp5=self._ecp5)

        # -- control lines, by age (cycles since admission); index 0 is age 1 ------------------
        span = y_age
        valid = Signal(span)                          # resets: nothing in flight
        first_l = Signal(span, reset_less=True)
        last_l = Signal(span, reset_less=True)
        addr_l = [Signal(self._addr_width, name=f"addr_a{k + 1}", reset_less=True)
                  for k in range(span)]

        def age(line, k):
            return line[k - 1]

        # -- admission: every transferred beat enters the pipeline (LaneAdmission decides) --
        take = i.valid
        p = i.payload
        m.d.comb += i.ready.eq(1)
        m.d.sync += [valid.eq(Cat(take, valid[:-1])),
                     first_l.eq(Cat(p.first, first_l[:-1])),
                     last_l.eq(Cat(p.last, last_l[:-1])),
                     addr_l[0].eq(p.addr)]
        m.d.sync += [addr_l[k].eq(addr_l[k - 1]) for k in range(1, span)]

        # -- age 1: the input register --------------------------------------------------------
        s1 = Signal(self._in_layout, reset_less=True)
        m.d.sync += s1.eq(p)

        # -- f32(sa * sb), from age 1 ----------------------------------------------------------
        m.d.comb += [mul1.a.eq(s1.sa), mul1.b.eq(s1.sb)]

        # -- d = isum + 16 * isum_hi - zp * asum and f = f32(d) ----------------------------------
        N = self._dw
        # zp * asum in LUTs, shift and add (a multiplier block's delay alone is most of a
        # 150 MHz cycle): one adder level per stage, then d = isum' - (h0 + 16 * h1), with
        # isum' = isum + 16 * isum_hi formed beside the first level.
        aw = self._asum_width
        pp = [Mux(s1.zp[j], s1.asum, 0) for j in range(8)]
        q = [Signal(signed(aw + 2), name=f"zp_asum_q{k}", reset_less=True)   # age 2
             for k in range(4)]
        m.d.sync += [q[k].eq(pp[2 * k] + (pp[2 * k + 1] << 1)) for k in range(4)]
        h = [Signal(signed(aw + 4), name=f"zp_asum_h{k}", reset_less=True)   # age 3
             for k in range(2)]
        m.d.sync += [h[k].eq(q[2 * k] + (q[2 * k + 1] << 2)) for k in range(2)]
        isum2 = Signal(signed(self._isum_width + 5), name="isum_lohi", reset_less=True)
        m.d.sync += isum2.eq(s1.isum + (s1.isum_hi << 4))                  # age 2
        isum3 = delay(m, isum2, 1, "isum")
        d = Signal(signed(N), reset_less=True)                            # age 4
        m.d.sync += d.eq(isum3 - h[0] - (h[1] << 4))
        neg = Signal(reset_less=True)                                     # age 5
        x = Signal(N, reset_less=True)
        m.d.sync += [neg.eq(d[N - 1]), x.eq(Mux(d[N - 1], -d, d))]
        lz_bits = {}
        for gi, group in enumerate(self._groups):                        # ages 6 ..
            cur = x
            for s in group:
                z = Signal(name=f"lz{s}")
                m.d.comb += z.eq(cur[N - s:] == 0)
                nxt = Signal(N, name=f"norm{s}")
                m.d.comb += nxt.eq(Mux(z, cur << s, cur))
                cur = nxt
                lz_bits[s] = z
            x_next = Signal(N, name=f"x_g{gi}", reset_less=True)
            neg_next = Signal(name=f"neg_g{gi}", reset_less=True)
            m.d.sync += [x_next.eq(cur), neg_next.eq(neg)]
            regs = {}
            for s, z in lz_bits.items():
                r = Signal(name=f"lz{s}_g{gi}", reset_less=True)
                m.d.sync += r.eq(z)
                regs[s] = r
            if group == [1]:
                # the biased exponent, 0 for d = 0 (the shifts add up to at least N - 1)
                lz = Cat(*(lz_bits[1 << k] for k in range(len(lz_bits))))  # shifts: 2 ** k
                e = Signal(8, name="exp8", reset_less=True)
                m.d.sync += e.eq(Mux(cur[N - 1], 127 + N - 1 - lz, 0))
            x, neg, lz_bits = x_next, neg_next, regs
        # round to 24 bits, ties to even; the carry of the mantissa runs into the exponent
        if N > 24:
            mant = x[N - 24:N - 1]
            rnd = x[N - 25]
            sticky = x[:N - 25].any() if N > 25 else 0
            inc = rnd & (sticky | x[N - 24])
        else:
            mant = x[:N - 1] << (24 - N)                                  # exact
            inc = 0
        packed = Signal(31)
        m.d.comb += packed.eq(Cat(mant, e) + inc)
        f = Signal(32, reset_less=True)                                   # age f_age
        m.d.sync += f.eq(Cat(packed, neg))

        # -- t = f32(f32(sa * sb) * f) --------------------------------------------------------
        m2 = self._ages.mul2
        m.d.comb += [mul2.a.eq(delay(m, mul1.y, m2 - (1 + mul1.latency), "sab")),
                     mul2.b.eq(delay(m, f, m2 - self._ages.f, "f"))]
        t = mul2.y                                                        # age a_age

        # -- base: the bias, or acc[addr] with the write-backs it cannot see forwarded --------
        rl = self.read_latency
        acc = Memory(shape=unsigned(32), depth=self._depth, init=[],
                     attrs={"ram_style": "distributed" if rl == 1 else "block"})
        m.submodules.acc = acc
        wp = acc.write_port()
        rp = acc.read_port(domain="sync")
        we = Signal()
        waddr = addr_l[y_age - 1]
        issue = a_age - 1 - rl                     # age at which the read address is presented
        m.d.comb += [we.eq(age(valid, y_age) & ~age(last_l, y_age)),
                     wp.en.eq(we), wp.addr.eq(waddr), wp.data.eq(add.y),
                     rp.addr.eq(addr_l[issue - 1])]
        rdata = delay(m, rp.data, rl - 1, "acc_rd")                        # age a_age - 1
        # writes from the read's cycle on are not in rdata: compare each with the address
        # when it happens, and let the match travel with the beat to age a_age - 1
        wb = [add.y]                               # wb[j]: the sum of j cycles ago
        for j in range(1, rl + 1):
            r = Signal(32, name=f"wb_d{j}", reset_less=True)
            m.d.sync += r.eq(wb[-1])
            wb.append(r)
        fwd = rdata
        for k in range(issue, a_age - 1):          # oldest first: the newest match wins
            hit = Signal(name=f"hit_a{k}")
            m.d.comb += hit.eq(we & (waddr == addr_l[k - 1]))
            j = a_age - 1 - k
            fwd = Mux(delay(m, hit, j, f"hit_a{k}"), wb[j], fwd)
        hit0 = Signal()                            # the write in the same cycle
        m.d.comb += hit0.eq(we & (waddr == addr_l[a_age - 2]))
        bias = line(m, s1.bias, a_age - 2, "bias")                 # age a_age - 1
        base = Signal(32, reset_less=True)                                # age a_age
        m.d.sync += base.eq(Mux(age(first_l, a_age - 1), bias, Mux(hit0, add.y, fwd)))
        m.d.comb += [add.a.eq(base), add.b.eq(t)]

        # -- results: the output FIFO ---------------------------------------------------------
        result = Signal(self._out_layout)
        m.d.comb += [result.y.eq(add.y), result.addr.eq(addr_l[y_age - 1]),
                     out_fifo.w_data.eq(result),
                     out_fifo.w_en.eq(age(valid, y_age) & age(last_l, y_age)),
                     o.payload.eq(out_fifo.r_data), o.valid.eq(out_fifo.r_rdy),
                     out_fifo.r_en.eq(o.ready)]
        return m
