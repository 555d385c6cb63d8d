"""Scale / zero-point index generator: the flat scale index of every element of a tensor."""

from __future__ import annotations

import functools

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.indexing import ScaleLayout
from qaccel.model.validate import check_int, check_int_choice
from qaccel.rtl.arith.pipeline import KEEP_ATTR

__all__ = ["LANES", "MAX_DIMS", "ScaleIndex", "index_registers"]

#: Elements per beat :class:`ScaleIndex` supports.
LANES = (1, 2, 4, 8)
#: Largest ``max_dims``.
MAX_DIMS = 8
#: Accepted ``size_width``, ``index_width`` and ``count_width`` ranges.
SIZE_WIDTH_RANGE = (4, 32)
INDEX_WIDTH_RANGE = (1, 64)
COUNT_WIDTH_RANGE = (1, 64)


def _check_params(lanes, max_dims, size_width, index_width, count_width) -> tuple[int, ...]:
    return (check_int_choice("lanes", lanes, LANES), check_int("max_dims", max_dims, 1, MAX_DIMS),
            check_int("size_width", size_width, *SIZE_WIDTH_RANGE),
            check_int("index_width", index_width, *INDEX_WIDTH_RANGE),
            check_int("count_width", count_width, *COUNT_WIDTH_RANGE))


def _need(param: str, width: int, value: int, what: str) -> None:
    """Raise ValueError naming ``param`` if ``value`` does not fit ``width`` unsigned bits."""
    if value >> width:
        raise ValueError(f"{param} must be at least {value.bit_length()} for this layout "
                         f"({what} {value}), not {width}")


def index_registers(layout: ScaleLayout, *, max_dims: int, size_width: int = 16,
                    index_width: int = 20, count_width: int = 32) -> dict:
    """Return :class:`ScaleIndex`'s run-time register values for ``layout``.

    The result maps the member names ``size``, ``stride``, ``block`` (tuples of ``max_dims``
    integers) and ``count`` to their values. Dimensions are numbered **innermost first**: the
    layout's collapsed dimensions (:attr:`~qaccel.model.indexing.ScaleLayout.sizes_c`, in C
    order) are reversed, the outermost goes to dimension ``max_dims - 1`` (whose size the
    generator does not use, so it is given as 0 and may exceed ``size_width``), and padding
    (size 1, stride 0, block 1) fills the dimensions in between. A dimension that never leaves
    its first block (``block >= size``) is given as stride 0, block 1, which indexes alike.
    An empty layout gives ``count = 0`` and padding only.

    Raises
    ------
    :exc:`TypeError`
        If ``layout`` is not a :class:`~qaccel.model.indexing.ScaleLayout` or a parameter is
        not an integer.
    :exc:`ValueError`
        If a parameter is out of :class:`ScaleIndex`'s range, or, naming the parameter, the
        layout needs more than ``max_dims`` dimensions, a size or block does not fit
        ``size_width``, a stride or the largest scale index does not fit ``index_width``, or
        the element count does not fit ``count_width``.
    """
    if not isinstance(layout, ScaleLayout):
        raise TypeError(f"layout must be a ScaleLayout, not {layout!r}")
    _, max_dims, size_width, index_width, count_width = _check_params(
        1, max_dims, size_width, index_width, count_width)
    count = layout.size
    _need("count_width", count_width, count, "element count")
    size, stride, block = [1] * max_dims, [0] * max_dims, [1] * max_dims
    size[-1] = 0
    if count == 0:
        return {"size": tuple(size), "stride": tuple(stride), "block": tuple(block),
                "count": 0}
    dims = list(zip(layout.sizes_c, layout.strides_c, layout.blocks_c, strict=True))[::-1]
    if len(dims) > max_dims:
        raise ValueError(f"max_dims must be at least {len(dims)} for this layout (collapsed "
                         f"sizes {layout.sizes_c}), not {max_dims}")
    slots = [*range(len(dims) - 1), max_dims - 1]
    largest = 0
    for d, (n, s, b) in zip(slots, dims, strict=True):
        if b >= n:
            s, b = 0, 1
        if d != max_dims - 1:
            _need("size_width", size_width, n, "dimension size")
            size[d] = n
        _need("size_width", size_width, b, "block size")
        _need("index_width", index_width, s, "stride")
        stride[d], block[d] = s, b
        largest += s * ((n - 1) // b)
    _need("index_width", index_width, largest, "largest scale index")
    return {"size": tuple(size), "stride": tuple(stride), "block": tuple(block), "count": count}


class ScaleIndex(wiring.Component):
    """Stream the flat scale index of every element of a tensor, ``lanes`` elements per beat.

    For elements ``e = 0, 1, ..., count - 1`` in C order, beat ``t`` carries the indices of
    elements ``t * lanes + k`` in ``index[k]``::

        scale_index(e) = sum_d stride[d] * (i_d // block[d])   (mod 2**index_width)

    where ``i_d`` are the coordinates of ``e`` in a tensor of sizes ``size[d]``, dimension 0
    innermost (it varies fastest), dimension ``max_dims - 1`` outermost. Per-tensor,
    per-axis, blocked (with a partial last block) and DirectML broadcast scales are all such
    layouts (:mod:`qaccel.model.indexing`); :meth:`registers` gives the register values of a
    :class:`~qaccel.model.indexing.ScaleLayout`.

    The configuration inputs (``size``, ``stride``, ``block``, ``count``) are registers: they
    may change up to the cycle of ``start`` and must then hold until the job ends. Unused
    dimensions have size 1, stride 0, block 1 and may sit anywhere. Sizes and blocks are at
    least 1 (a block may exceed its size). The outermost dimension never wraps (``count``
    bounds it), so its size is not used and it may be longer than ``size_width`` allows; were
    ``count`` larger than the tensor, it would just continue.

    ``start`` (a one-cycle strobe) starts a job from element 0, and aborts a running one: the
    beat offered on ``o`` is withdrawn (one transferred in the cycle of ``start`` belongs to
    the old job). A ``start`` in cycle *n* offers the first beat in cycle *n +*
    :attr:`latency` (3 for one lane, ``2 * lanes + max_dims + 6`` for more). After that, one
    beat per cycle while ``o.ready`` is high; a beat is held until it is transferred. The
    beat holding element ``count - 1`` has ``last`` set; in it, ``index[k]`` for elements
    ``count`` and beyond are unspecified. ``count = 0`` emits nothing.

    Mechanism. An odometer holds, per dimension, the coordinate and the position in the
    block as gaps (to the end of the row and of the block, counting down) and the
    contribution ``c_d = stride[d] * (i_d // block[d])`` (plus ``stride[d]`` when a block
    ends, 0 when the dimension wraps); the index is the sum of the ``c_d``.

    One lane: the odometer steps one element per beat. Its gaps are kept minus one, so that
    each counter's sign bit says "last position" and is its reload select (no comparator,
    and every wide multiplexer selects on a flip-flop). ``start`` sets the coordinates' sign
    bits; the cycle after, the odometer steps from "before element 0" to element 0. The
    output register takes the sum.

    ``lanes > 1``: a lead lane steps by ``lanes`` elements per beat; lane ``k`` is lane
    ``k - 1`` one element on, a cycle later (with gaps saturated at ``lanes - 1``, all a beat
    needs), and the indices are realigned at the output. The lead lane adds the digits
    ``a_d`` of ``lanes`` in the mixed radix of the sizes (found at start by a walk of
    ``lanes`` elements in small counters), so that carries are 0 or 1. With
    ``a_d = alpha_d * block[d] + beta_d``, a dimension that does not wrap advances its block
    position by ``beta_d + carry`` (at most one more block ends) and its contribution by
    ``alpha_d`` or ``alpha_d + 1`` strides; one that wraps restarts at ``x < lanes``: block
    position and number ``x % block[d]``, ``x // block[d]`` from a table, contribution
    ``stride[d] * (x // block[d])`` (these small products select among 0 to 3 strides per
    two bits, and add). The lead lane is a pipeline: dimension ``d``'s coordinate at stage
    ``d``, its block at ``d + 2``, its contribution at ``d + 4``, carries through registers.
    Its wide counters hold both candidate next values and the choice, and restart values
    are built from low bits and a borrow, so that neither a wide multiplexer nor a wide
    carry chain waits for a short one.

    All registers move together when the output register is empty or being transferred;
    ``o.valid`` is a register, copied for the clock enables of each group of registers.

    Measured (Yosys ``synth_ecp5``: LUT4 + 2 x CCU2C; nextpnr, LFE5U-25F-6, seeds 1 to 4) with
    ``max_dims = 4``, ``size_width = 16``, ``index_width = 10``, ``count_width = 32``: one lane
    400 LUT4 equivalents and 206 flip-flops, 171 to 185 MHz; eight lanes 2,800 and 1,830,
    155 to 169 MHz (two lanes 1,490, four 1,900 LUT4 equivalents).

    Parameters
    ----------
    lanes : :class:`int`
        Elements per beat, one of :data:`LANES` (1, 2, 4, 8).
    max_dims : :class:`int`
        Dimensions of the configuration, 1 to :data:`MAX_DIMS` (8).
    size_width : :class:`int`
        Width of ``size`` and ``block``, 4 to 32.
    index_width : :class:`int`
        Width of ``stride`` and of the indices, 1 to 64.
    count_width : :class:`int`
        Width of ``count``, 1 to 64.

    Raises
    ------
    :exc:`TypeError`
        If a parameter is not an integer.
    :exc:`ValueError`
        If ``lanes`` is not in :data:`LANES` or a width or ``max_dims`` is out of range.

    Members
    -------
    size : :py:`In(data.ArrayLayout(unsigned(size_width), max_dims))`
        Size of each dimension, innermost first (``size[max_dims - 1]`` is not used).
    stride : :py:`In(data.ArrayLayout(unsigned(index_width), max_dims))`
        Index stride of each dimension's blocks (0: broadcast).
    block : :py:`In(data.ArrayLayout(unsigned(size_width), max_dims))`
        Block length of each dimension (1: one scale per coordinate).
    count : :py:`In(unsigned(count_width))`
        Number of elements of the job.
    start : :py:`In(1)`
        Start (or restart) a job.
    o : :py:`Out(stream.Signature(payload_layout))`
        The indices: ``payload.index`` (``data.ArrayLayout(unsigned(index_width), lanes)``)
        and ``payload.last``.
    busy : :py:`Out(1)`
        High from the cycle after ``start`` until the last beat is transferred.
    """

    def __init__(self, *, lanes: int, max_dims: int, size_width: int = 16,
                 index_width: int = 20, count_width: int = 32):
        params = _check_params(lanes, max_dims, size_width, index_width, count_width)
        (self._lanes, self._max_dims, self._size_width, self._index_width,
         self._count_width) = params
        super().__init__({
            "size": In(data.ArrayLayout(unsigned(size_width), max_dims)),
            "stride": In(data.ArrayLayout(unsigned(index_width), max_dims)),
            "block": In(data.ArrayLayout(unsigned(size_width), max_dims)),
            "count": In(unsigned(count_width)),
            "start": In(1),
            "o": Out(stream.Signature(self.payload_layout)),
            "busy": Out(1),
        })

    @property
    def lanes(self) -> int:
        """Elements per beat."""
        return self._lanes

    @property
    def max_dims(self) -> int:
        """Dimensions of the configuration."""
        return self._max_dims

    @property
    def size_width(self) -> int:
        """Width of ``size`` and ``block``."""
        return self._size_width

    @property
    def index_width(self) -> int:
        """Width of ``stride`` and of the indices."""
        return self._index_width

    @property
    def count_width(self) -> int:
        """Width of ``count``."""
        return self._count_width

    @property
    def payload_layout(self) -> data.StructLayout:
        """Layout of ``o.payload``: ``index`` (one per lane) and ``last``."""
        return data.StructLayout({
            "index": data.ArrayLayout(unsigned(self._index_width), self._lanes),
            "last": unsigned(1),
        })

    @property
    def latency(self) -> int:
        """Cycles from ``start`` to the first beat offered on ``o``: 3 for one lane, else
        ``2 * lanes + max_dims + 6`` (the walk, the lead lane's pipeline, the lanes' chain)."""
        return self.latency_for(lanes=self._lanes, max_dims=self._max_dims)

    @staticmethod
    def latency_for(*, lanes: int, max_dims: int) -> int:
        """:attr:`latency` of a generator with these (valid) parameters, without building it
        (the widths do not change it)."""
        return 3 if lanes == 1 else 2 * lanes + max_dims + 6

    def registers(self, layout: ScaleLayout) -> dict:
        """Return the register values for ``layout``: :func:`index_registers` with this
        unit's ``max_dims`` and widths."""
        return index_registers(layout, max_dims=self._max_dims, size_width=self._size_width,
                               index_width=self._index_width, count_width=self._count_width)

    # -- elaboration ----------------------------------------------------------------------------

    def elaborate(self, platform):
        m = Module()
        L, cw = self._lanes, self._count_width
        s = L.bit_length() - 1
        o, start = self.o, self.start

        # Beats left: y = beats - 2 - (beats transferred); -1 on the last, -2 when done.
        beats_max = ((1 << cw) - 1 + L - 1) >> s
        y = Signal(signed(beats_max.bit_length() + 1), init=-2)
        count_lo = self.count[:s].any() if s else Const(0, 1)
        transfer = o.valid & o.ready
        with m.If(start | transfer):
            m.d.sync += y.eq(Mux(start, self.count >> s, y)
                             + Cat(~start | count_lo, Const(-1, len(y) - 1)))
        more = Signal()                         # a beat is left
        m.d.comb += [more.eq(~(y[-1] & ~y[0])), o.payload.last.eq(y[-1] & y[0])]
        # The first beat reaches o latency cycles after start: a token (no beat is offered
        # before, so no stall). The tokens need no reset: o.valid needs "more".
        token = start
        for j in range(1, self.latency):
            nxt = Signal(name=f"token{j}", reset_less=True)
            m.d.sync += nxt.eq(Mux(start, 0, token) if j > 1 else token)
            token = nxt
        # o.valid is a register; beats follow each other until the last is transferred.
        valid_next = Signal()
        m.d.comb += valid_next.eq(~start & (o.valid | token) & Mux(transfer, ~o.payload.last,
                                                                   more))
        m.d.sync += o.valid.eq(valid_next)

        def stepper(name):
            """``step`` (all registers move) for a group of registers, from a copy of
            o.valid: its clock enables are the widest net of the unit."""
            if L == 1:
                return ~o.valid | o.ready
            valid = Signal(name=f"{name}_valid", attrs={KEEP_ATTR: 1})
            step = Signal(name=f"{name}_step")
            m.d.sync += valid.eq(valid_next)
            m.d.comb += step.eq(~valid | o.ready)
            return step

        fresh = Signal()                        # the cycle after start
        m.d.sync += fresh.eq(start)
        m.d.comb += self.busy.eq(fresh | more)
        if L == 1:
            index = [self._one_lane(m, stepper("lane0"), fresh)]
        else:
            index = self._follow(m, stepper, self._lead_lane(m, stepper, fresh, self._walk(m)))
        for k, value in enumerate(index):
            m.d.comb += o.payload.index[k].eq(value)
        return m

    @staticmethod
    def _static(m, value, name):
        """A register following ``value``, a function of the configuration (which holds
        during a job): it keeps the configuration's logic off the other paths."""
        r = Signal.like(value, name=name, reset_less=True)
        m.d.sync += r.eq(value)
        return r

    @staticmethod
    def _delay(m, step, value, n, name):
        """``value`` through ``n`` registers that move with ``step``."""
        for i in range(n):
            r = Signal.like(value, name=f"{name}_d{i}", reset_less=True)
            with m.If(step):
                m.d.sync += r.eq(value)
            value = r
        return value

    def _sum(self, m, values, name):
        """The sum of ``values`` (``index_width`` bits) as a tree of two-input adders (kept
        apart: Yosys would otherwise merge them into a carry-save tree of LUTs)."""
        level = list(values)
        while len(level) > 1:
            nxt = []
            for i in range(0, len(level) - 1, 2):
                p = Signal(self._index_width, name=f"{name}_s{len(level)}_{i}",
                           attrs={"keep": 1})
                m.d.comb += p.eq(level[i] + level[i + 1])
                nxt.append(p)
            level = nxt + level[len(level) & ~1:]
        return level[0]

    # -- the odometer: a lane that steps one element ----------------------------------------------

    def _lane_regs(self, name, wide, like=None):
        """The registers of a lane, per dimension: gaps ``g`` (coordinate: to the end of the
        row; not for the outermost dimension) and ``h`` (block position: to the end of the
        block), either wide and minus one (the sign bit says "last position") or saturated
        at ``lanes - 1``; ``c``, the contribution. Saturated lanes also carry flags computed
        with the state they describe, so that the wide multiplexers select on flip-flops:
        ``t`` (``g == 0``) and ``z`` (``h == 0``). ``reload_g``, ``reload_h`` (the counters'
        values at position 0, as the counter takes them), ``one_g``, ``one_h`` (size, block
        is 1) are set by the caller or taken from ``like``."""
        D, sw, iw = self._max_dims, self._size_width, self._index_width
        width = sw + 1 if wide else max(1, (self._lanes - 1).bit_length())
        shape = signed(width) if wide else unsigned(width)
        regs = {
            "wide": wide,
            "g": [Signal(shape, name=f"{name}_g{d}", reset_less=True) for d in range(D - 1)],
            "h": [Signal(shape, name=f"{name}_h{d}", reset_less=True) for d in range(D)],
            "c": [Signal(iw, name=f"{name}_c{d}", reset_less=True) for d in range(D)],
        }
        if not wide:
            regs["t"] = [Signal(name=f"{name}_t{d}", reset_less=True) for d in range(D - 1)]
            regs["z"] = [Signal(name=f"{name}_z{d}", reset_less=True) for d in range(D)]
        if like is not None:
            for key in ("reload_g", "reload_h", "one_g", "one_h"):
                regs[key] = like[key]
        return regs

    @staticmethod
    def _assign(regs, values):
        return [r.eq(v) for key in ("g", "h", "c", "t", "z") if key in regs
                for r, v in zip(regs[key], values[key], strict=True)]

    def _step_lane(self, m, lane, advance, name, fresh=None):
        """The state of ``lane`` (see :meth:`_lane_regs`) one element on when ``advance``
        (else the same). ``fresh``: the state is the one before element 0 (every
        coordinate at its last position); the outermost dimension then restarts too."""
        D = self._max_dims
        wide = lane["wide"]
        out = {"g": [], "h": [], "c": [], "t": [], "z": []}

        def counter(value, sel, en, reload_value, tag):
            if wide:        # gap - 1: reload with limit - 2, else count down
                moved = Mux(sel, reload_value, value) + Cat(~sel, Const(-1, len(value) - 1))
            else:           # min(gap, lanes - 1)
                moved = Mux(sel, reload_value, value - 1)
            nxt = Signal(len(value), name=f"{name}_{tag}")
            m.d.comb += nxt.eq(Mux(en, moved, value))
            return nxt

        def flag(value, tag):
            f = Signal(name=f"{name}_{tag}")
            m.d.comb += f.eq(value)
            return f

        k = advance                             # the dimensions below d all wrap
        for d in range(D):
            top = d == D - 1
            if wide:        # the counters' sign bits
                wrap = (fresh if fresh is not None else Const(0, 1)) if top else lane["g"][d][-1]
                end = lane["h"][d][-1] | wrap   # (when k: d wraps; its block ends)
            else:           # the registered flags
                wrap = Const(0, 1) if top else lane["t"][d]
                end = lane["z"][d] | wrap
            if not top:
                g = counter(lane["g"][d], wrap, k, lane["reload_g"][d], f"g{d}")
                out["g"].append(g)
                if not wide:    # (spelt out: the reload value is 0 iff the size is 1)
                    out["t"].append(flag(Mux(k, Mux(wrap, lane["one_g"][d], lane["g"][d] == 1),
                                             lane["t"][d]), f"t{d}"))
            h = counter(lane["h"][d], end, k, lane["reload_h"][d], f"h{d}")
            out["h"].append(h)
            if not wide:
                out["z"].append(flag(Mux(k, Mux(end, lane["one_h"][d], lane["h"][d] == 1),
                                         lane["z"][d]), f"z{d}"))
            c = Signal(self._index_width, name=f"{name}_c{d}")
            m.d.comb += c.eq(Mux(k & end, Mux(wrap, 0, lane["c"][d] + self.stride[d]),
                                 lane["c"][d]))
            out["c"].append(c)
            if not top:
                k = k & wrap
        return out

    def _one_lane(self, m, step, fresh):
        """One lane: the odometer advances an element per step, the output register takes
        the sum of its contributions."""
        lane = self._lane_regs("lane0", wide=True)
        lane["reload_g"] = list(self.size)[:-1]
        lane["reload_h"] = list(self.block)
        nxt = self._step_lane(m, lane, step, "lane0n", fresh)
        m.d.sync += self._assign(lane, nxt)
        with m.If(self.start):      # the state before element 0: every coordinate at its end
            m.d.sync += [g[-1].eq(1) for g in lane["g"]]
        index = Signal(self._index_width, reset_less=True)
        total = self._sum(m, lane["c"], "lane0")
        with m.If(step):
            m.d.sync += index.eq(total)
        return index

    # -- several lanes: a lead lane steps by ``lanes`` elements, the others follow --------------

    def _walk(self, m):
        """Walk from element 0 to element ``lanes`` at start, one element per cycle, in small
        counters per dimension (coordinate, position in the block, block number), dimension
        ``d + 1`` a cycle behind dimension ``d``; their ends are compared with registered
        low bits of ``size - 1`` and ``block - 1``. Returns their values, the final ones a
        cycle after ``lanes + d`` (``a_d``, ``beta_d``, ``alpha_d``), those low bits, and a
        flag that is high from a cycle after the walk."""
        L, D = self._lanes, self._max_dims
        s = L.bit_length() - 1
        lw = s + 2
        size, block, start = self.size, self.block, self.start
        # (at most 2**lw: then the low bits say it all; statics outside of conditions)
        small_n = [self._static(m, (size[d][lw + 1:] == 0) & (size[d][:lw + 1] <= (1 << lw)),
                                f"small_n{d}") for d in range(D)]
        small_b = [self._static(m, (block[d][lw + 1:] == 0) & (block[d][:lw + 1] <= (1 << lw)),
                                f"small_b{d}") for d in range(D)]
        nlo1 = [self._static(m, size[d][:lw] - 1, f"nlo1_{d}") for d in range(D - 1)]
        blo1 = [self._static(m, block[d][:lw] - 1, f"blo1_{d}") for d in range(D)]
        walk = Signal(range(L + 1))
        step = [Signal(name=f"walk_step{d}") for d in range(D)]
        i, r, q = ([Signal(s + 1, name=f"walk_{x}{d}") for d in range(D)] for x in "irq")
        with m.If(start):           # (the statics follow the configuration a cycle later)
            m.d.sync += [walk.eq(L), step[0].eq(1), *(x.eq(0) for x in i + r + q + step[1:])]
        with m.Else():                          # (no beat is offered yet: no stall)
            m.d.sync += [walk.eq(walk - (walk != 0)), step[0].eq(walk > 1)]
            for d in range(D):
                i_end = Signal(name=f"walk_iend{d}")
                r_end = Signal(name=f"walk_rend{d}")
                m.d.comb += r_end.eq(small_b[d] & (r[d] == blo1[d]))
                if d < D - 1:
                    m.d.comb += i_end.eq(small_n[d] & (i[d] == nlo1[d]))
                    m.d.sync += step[d + 1].eq(step[d] & i_end)
                with m.If(step[d] & i_end):
                    m.d.sync += [i[d].eq(0), r[d].eq(0), q[d].eq(0)]
                with m.Elif(step[d]):
                    m.d.sync += i[d].eq(i[d] + 1)
                    with m.If(r_end):
                        m.d.sync += [r[d].eq(0), q[d].eq(q[d] + 1)]
                    with m.Else():
                        m.d.sync += r[d].eq(r[d] + 1)
        return {"a": i, "beta": r, "alpha": q, "small_n": small_n, "small_b": small_b,
                "nlo1": nlo1, "blo1": blo1, "done": walk == 0}

    def _lead_lane(self, m, stepper, fresh, walk):
        """The lead lane, a pipeline: dimension ``d``'s coordinate at stage ``d``, the small
        division of a restart at ``d + 1``, its block position at ``d + 2``, the product at
        ``d + 3``, its contribution at ``d + 4``. Returns, per dimension, the gaps (saturated
        at ``lanes - 1``) and the contribution of each beat, aligned."""
        L, D, sw, iw = self._lanes, self._max_dims, self._size_width, self._index_width
        s = L.bit_length() - 1
        lw = s + 2                              # low bits of the gaps
        size, block, stride, start = self.size, self.block, self.stride, self.start
        static = functools.partial(self._static, m)
        step = None                             # (a copy per dimension, below)

        def delay(value, n, name):
            return self._delay(m, step, value, n, name)

        # go[j]: stage j runs (from a cycle after the walk, for the statics below); ld[j]:
        # or the cycle after start (the stages load element 0)
        go = [Signal(name=f"go{j}") for j in range(D + 4)]
        ld = [Signal(name=f"ld{j}") for j in range(D + 4)]
        for j in range(D + 4):
            nxt = Mux(start, 0, go[j - 1] if j else walk["done"])
            m.d.sync += [go[j].eq(nxt), ld[j].eq(start | nxt)]

        def saturate(low, small):
            return Mux(small & (low < L - 1), low, L - 1)[:s]

        def gap_counter(name, limit, small_limit, stage):
            """A gap (to ``limit - 1``), retimed: the registers hold both candidate next
            values (restart, continue) and the choice. Returns the gap, "at most 2**lw",
            ``low_sum``, ``negative`` and ``update`` (see there)."""
            cand_r = Signal(sw, name=f"{name}_r", reset_less=True)
            cand_k = Signal(sw, name=f"{name}_k", reset_less=True)
            small_k = Signal(name=f"{name}_smallk", reset_less=True)
            choose = Signal(name=f"{name}_sel", reset_less=True)
            gap = Signal(sw, name=name)
            small = Signal(name=f"{name}_small")
            m.d.comb += [gap.eq(Mux(choose, cand_r, cand_k)),
                         small.eq(Mux(choose, small_limit, small_k))]

            def low_sum(add, ci):
                """The gap's low bits + ``add`` (small, signed) + ``ci``, computed on both
                candidates (so that the short carry chain does not wait for the
                multiplexer)."""
                return Mux(choose, cand_r[:lw] + add + ci, cand_k[:lw] + add + ci)

            def negative(add, ci):
                """``gap + add + ci < 0`` (``add``: small, signed)."""
                return Mux(choose, small_limit & (cand_r[:lw] + add + ci)[-1],
                           small_k & (cand_k[:lw] + add + ci)[-1])
            hi = limit[lw:]
            hi_m1 = Signal(len(hi), name=f"{name}_him1", attrs={"keep": 1})
            m.d.comb += hi_m1.eq(hi - 1)

            def update(restart, fixed, fixed_low, add, add_ci, neg_sub, sub_ci):
                """The next gap is ``gap + neg_sub + sub_ci`` (``neg_sub``: small, signed);
                on ``restart`` a value near ``limit`` given by its low bits (signed: a
                negative one borrows from the high bits, so that no wide carry chain follows
                a short one): ``fixed_low`` if ``fixed``, else ``gap + add + add_ci``."""
                low = Signal(signed(lw + 2), name=f"{name}_low")
                m.d.comb += low.eq(Mux(fixed, fixed_low, low_sum(add, add_ci)))
                with m.If(step & ld[stage]):
                    m.d.sync += [cand_r.eq(Cat(low[:lw], Mux(low[-1], hi_m1, hi))),
                                 cand_k.eq(gap + neg_sub + sub_ci),
                                 small_k.eq((gap[lw:] == 0) if sw > lw else 1),
                                 choose.eq(restart | fresh)]
            return gap, small, low_sum, negative, update

        # Statics: ~a (-1 - a) and the low bits of size - 1 - a, with the carry into the
        # dimension as carry in (u = a + carry, t = g - u, size - u + g); ~beta and the low
        # bits of block - beta.
        stat = [{"na": static(-1 - walk["a"][d], f"na{d}"),
                 "nla": static(size[d][:lw] - walk["a"][d] - 1, f"nla{d}"),
                 "nb": static(-1 - walk["beta"][d], f"nb{d}"),
                 "bb": static(block[d][:lw] - walk["beta"][d], f"bb{d}"),
                 "alpha1": static(walk["alpha"][d] + 1, f"alpha1_{d}")} for d in range(D)]
        views = {"g": [], "h": [], "c": []}
        carry, n_carry = Const(0, 1), Const(1, 1)   # into the dimension (and inverted)
        for d in range(D):
            top = d == D - 1
            n, b, st = size[d], block[d], stride[d]
            step = stepper(f"dim{d}")
            # stage d: coordinate gap g = size - 1 - i, advanced by u = a + carry. It wraps
            # when t = g - u < 0; the row then restarts at x = u - 1 - g = ~t < lanes.
            wrap1 = Signal(name=f"wrap1_{d}")   # (for the next stages:)
            nv1 = Signal(signed(lw + 2), name=f"nv1_{d}")       # ~v, v = beta + carry
            bv1 = Signal(signed(lw + 2), name=f"bv1_{d}")       # block - v, low bits
            x1 = Signal(s, name=f"x1_{d}")
            wrap = Const(0, 1)
            if not top:
                g, g_small, g_sum, g_negative, g_update = gap_counter(
                    f"g{d}", n, walk["small_n"][d], d)
                t = Signal(signed(lw + 2), name=f"t{d}")
                wrap = Signal(name=f"wrap{d}")
                m.d.comb += [t.eq(g_sum(stat[d]["na"], n_carry)),
                             wrap.eq(g_negative(stat[d]["na"], n_carry))]
                g_update(wrap, fresh, walk["nlo1"][d], stat[d]["nla"],
                         n_carry, stat[d]["na"], n_carry)
                views["g"].append(delay(saturate(g[:lw], g_small), D + 3 - d, f"vg{d}"))
                with m.If(step):
                    m.d.sync += x1.eq(~t[:s])
            with m.If(step):
                m.d.sync += [wrap1.eq(wrap), nv1.eq(stat[d]["nb"] - carry),
                             bv1.eq(stat[d]["bb"] - carry)]
            if not top:
                carry = Signal(name=f"carry{d + 1}")
                n_carry = Signal(name=f"n_carry{d + 1}")
                with m.If(step):
                    m.d.sync += [carry.eq(wrap), n_carry.eq(~wrap)]
            # stage d + 1: x % block and x // block from a table, on block if it is below
            # lanes (0 stands for larger blocks: x and 0)
            b_small = static(Mux(b[s:] == 0, b[:s], 0), f"b_small{d}")
            xr = Signal(s, name=f"xr{d}")
            xq = Signal(s, name=f"xq{d}")
            with m.Switch(Cat(x1, b_small)):
                for xv in range(L):
                    for bv in range(L):
                        with m.Case(xv | bv << s):
                            m.d.comb += [xr.eq(xv % bv if bv else xv),
                                         xq.eq(xv // bv if bv else 0)]
            wrap1, nv1, bv1 = (delay(x, 1, f"{x.name}b") for x in (wrap1, nv1, bv1))
            xr1 = Signal(s, name=f"xr1_{d}")
            xq1 = Signal(s, name=f"xq1_{d}")
            with m.If(step):
                m.d.sync += [xr1.eq(xr), xq1.eq(xq)]
            with m.If(start):               # (so that stage d + 2 loads block - 1 first)
                m.d.sync += [wrap1.eq(1), xr1.eq(0)]
            # stage d + 2: block gap h = block - 1 - (i % block), advanced by v (and alpha
            # blocks). It restarts at x % block (gap block - 1 - x % block), or the block
            # ends (kappa: h < v; gap block - (v - h)).
            h, h_small, _, h_negative, h_update = gap_counter(f"h{d}", b, walk["small_b"][d],
                                                              d + 2)
            kappa = Signal(name=f"kappa{d}")
            m.d.comb += kappa.eq(~wrap1 & h_negative(nv1, 1))
            h_update(wrap1 | kappa, wrap1, walk["blo1"][d] - xr1, bv1, 0,
                     nv1, 1)
            kappa2 = Signal(name=f"kappa2_{d}")
            xq2 = Signal(s, name=f"xq2_{d}")
            wrap2 = Signal(name=f"wrap2_{d}")
            with m.If(step):
                m.d.sync += [kappa2.eq(kappa), xq2.eq(xq1), wrap2.eq(wrap1)]
            views["h"].append(delay(saturate(h[:lw], h_small), D + 1 - d, f"vh{d}"))
            # stage d + 3: stride * blocks (advanced, or restarted at), two bits at a time
            # from 0, 1, 2 and 3 times the stride
            blocks = Signal(s + 1, name=f"blocks{d}")
            m.d.comb += blocks.eq(Mux(wrap2, xq2, Mux(kappa2, stat[d]["alpha1"],
                                                       walk["alpha"][d])))
            st3 = static((st + (st << 1))[:iw], f"stride3_{d}")
            terms = [Mux(blocks[j + 1] if j + 1 <= s else 0, Mux(blocks[j], st3, st << 1),
                         Mux(blocks[j], st, 0)) << j for j in range(0, s + 1, 2)]
            total = self._sum(m, terms, f"mul{d}")
            prod = Signal(iw, name=f"prod{d}", reset_less=True)
            wrap3 = Signal(name=f"wrap3_{d}")
            with m.If(step):
                m.d.sync += [prod.eq(total), wrap3.eq(wrap2)]
            # stage d + 4: contribution
            c = Signal(iw, name=f"c{d}", reset_less=True)
            with m.If(fresh):
                m.d.sync += c.eq(0)
            with m.Elif(step & go[d + 4]):
                m.d.sync += c.eq(Mux(wrap3, 0, c) + prod)
            views["c"].append(delay(c, D - 1 - d, f"vc{d}"))
        return views

    def _follow(self, m, stepper, views):
        """Lane 0 (the lead lane's state, aligned), then lane k = lane k - 1 one element on,
        a cycle later; each lane's index, realigned."""
        L, D, iw = self._lanes, self._max_dims, self._index_width
        s = L.bit_length() - 1
        size, block = self.size, self.block
        static = functools.partial(self._static, m)
        lane = self._lane_regs("lane0", wide=False)
        lane["reload_g"] = [static(Mux(size[d][s:] == 0, size[d][:s] - 1, L - 1)[:s], f"rg{d}")
                            for d in range(D - 1)]
        lane["reload_h"] = [static(Mux(block[d][s:] == 0, block[d][:s] - 1, L - 1)[:s],
                                   f"rh{d}") for d in range(D)]
        lane["one_g"] = [static(size[d] == 1, f"one_g{d}") for d in range(D - 1)]
        lane["one_h"] = [static(block[d] == 1, f"one_h{d}") for d in range(D)]
        with m.If(stepper("lane0")):
            for d in range(D):
                if d < D - 1:
                    m.d.sync += [lane["g"][d].eq(views["g"][d]),
                                 lane["t"][d].eq(views["g"][d] == 0)]
                m.d.sync += [lane["h"][d].eq(views["h"][d]), lane["z"][d].eq(views["h"][d] == 0),
                             lane["c"][d].eq(views["c"][d])]
        lanes = [lane]
        for k in range(1, L):
            nxt = self._lane_regs(f"lane{k}", wide=False, like=lane)
            stepped = self._step_lane(m, lanes[-1], Const(1, 1), f"lane{k}n")
            with m.If(stepper(f"lane{k}")):
                m.d.sync += self._assign(nxt, stepped)
            lanes.append(nxt)
        index = []
        for k, ln in enumerate(lanes):
            step = stepper(f"out{k}")
            total = self._sum(m, ln["c"], f"lane{k}")
            idx = Signal(iw, name=f"index{k}", reset_less=True)
            with m.If(step):
                m.d.sync += idx.eq(total)
            index.append(self._delay(m, step, idx, L - 1 - k, f"out{k}"))
        return index
