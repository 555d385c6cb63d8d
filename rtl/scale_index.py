"""Scale / zero-point index generator: the flat scale index of every element of a tensor."""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.indexing import ScaleLayout
from qaccel.model.validate import check_int, check_int_choice

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
    least 1. The outermost dimension never wraps (``count`` bounds it), so its size is not
    used and it may be longer than ``size_width`` allows; were ``count`` larger than the
    tensor, it would just continue.

    ``start`` (a one-cycle strobe) starts a job from element 0, and aborts a running one: the
    beat offered on ``o`` is withdrawn (one transferred in the cycle of ``start`` belongs to
    the old job). A ``start`` in cycle *n* offers the first beat in cycle *n + max_dims + 2*
    (:attr:`latency`: the configuration tables are registered, stage 0 is set up, then one
    cycle per dimension, see below). After that, one beat per cycle while ``o.ready`` is
    high; a beat is held until it is transferred. The beat holding element ``count - 1`` has
    ``last`` set; in it, ``index[k]`` for elements ``count`` and beyond are unspecified.
    ``count = 0`` emits nothing.

    Mechanism. Lane ``k`` holds the state of element ``k``, then ``k + lanes``, ... (a lane
    advances by ``lanes`` elements per beat): per dimension its coordinate ``i_d``, its
    position ``r_d`` in its block and its contribution ``c_d = stride[d] * (i_d //
    block[d])``; the index is the sum of the ``c_d``. The block number itself is not kept,
    ``c_d`` stands for it, and the outermost dimension keeps no coordinate. Coordinates and
    block positions are held as their distance to the end of the row or block (``size - 1 -
    i_d``, ``block - 1 - r_d``), so that the wrap test for a carry in ``[0, lanes]`` looks at
    a few low bits only. A digit of radix ``R`` advances by such a carry: for ``R >= lanes``
    it wraps at most once (carry out 0 or 1); for ``R < lanes`` (only when ``lanes > 1``)
    the carry out and the new digit are ``v // R`` and ``v % R`` of ``v = x + carry <
    2 * lanes - 1``, by ``lanes.bit_length()`` conditional subtractions of such small
    numbers; both are built and ``R < lanes`` chooses, except that ``lanes == 1`` builds the
    first only. The innermost dimension
    advances by ``lanes``, each dimension's carry out advances the next one; at set-up, lane
    ``k`` advances the zero state by ``k`` with the same logic. The block position advances
    by the same carry as its coordinate, and its carry ``delta`` adds ``stride * delta`` to
    ``c_d``. A dimension that wraps restarts at a coordinate ``x < lanes``: its block
    position and block number come from per-dimension tables of ``x % block`` and ``x //
    block``, its contribution is ``stride * (x // block)``. ``stride * k`` for ``k <= lanes``
    is a table too. The tables are registered from the configuration (the same division,
    shift and add) and shared by the lanes: there is no multiplier. Per lane and dimension the
    wide operations are one subtraction per digit, a ``lanes + 1``-way multiplexer of
    ``stride * k`` and an addition.

    Pipeline. Dimension ``d`` of every lane is stage ``d``, and the carries between
    dimensions go through registers: stage ``d`` handles a beat one cycle after stage
    ``d - 1``, so that no path crosses more than one dimension. Each stage adds its
    contribution to the beat's partial index as the beat passes, the outermost into the
    output register. All stages move together when the output register is empty or being
    transferred (``o.ready`` thus reaches the state registers' enables combinationally).

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
        """Cycles from ``start`` to the first beat offered on ``o``: ``max_dims + 2``."""
        return self._max_dims + 2

    def registers(self, layout: ScaleLayout) -> dict:
        """Return the register values for ``layout``: :func:`index_registers` with this
        unit's ``max_dims`` and widths."""
        return index_registers(layout, max_dims=self._max_dims, size_width=self._size_width,
                               index_width=self._index_width, count_width=self._count_width)

    # -- elaboration ----------------------------------------------------------------------------

    def elaborate(self, platform):
        m = Module()
        L, D, sw, iw = self._lanes, self._max_dims, self._size_width, self._index_width
        cw = L.bit_length()                     # carries and sums: [0, 2 * lanes - 2]
        xw = max(1, cw - 1)                     # coordinates below lanes: [0, lanes - 1]

        def comb(shape, value, name):
            s = Signal(shape, name=name)
            m.d.comb += s.eq(value)
            return s

        def reg(shape, value, name):
            s = Signal(shape, name=name, reset_less=True)
            m.d.sync += s.eq(value)
            return s

        def select(index, values, shape, name):
            """``values[index]`` (the last one for larger indices): a binary multiplexer
            tree."""
            level = list(values) + [values[-1]] * ((1 << len(index)) - len(values))
            for j in range(len(index)):
                level = [Mux(index[j], level[2 * i + 1], level[2 * i])
                         for i in range(len(level) // 2)]
            return comb(shape, level[0], name)

        def high_zero(value):
            """Whether ``value`` (``sw`` bits) is below ``2**cw``."""
            return (value[cw:] == 0) if sw > cw else Const(1, 1)

        def divmod_small(v, d, name):
            """``(v // d, v % d)`` for a ``cw``-bit ``v``: restoring division, ``cw``
            conditional subtractions (``d == 0`` gives garbage, never used)."""
            rem, bits = v, []
            for j in reversed(range(cw)):
                ge = comb(1, rem >= (d << j), f"{name}_ge{j}")
                rem = comb(cw, Mux(ge, rem - (d << j), rem), f"{name}_r{j}")
                bits.append(ge)
            return comb(cw, Cat(*reversed(bits)), f"{name}_q"), rem[:xw]

        # -- configuration tables (one register stage, shared by the lanes) --------------------
        cfg = []
        for d in range(D):
            size, block, stride = self.size[d], self.block[d], self.stride[d]
            t = [Const(0, iw)]                  # stride * k, shift and add
            for k in range(1, L + 1):
                terms = [stride << j for j in range(k.bit_length()) if k >> j & 1]
                t.append(reg(iw, sum(terms[1:], terms[0]), f"stride_x{k}_{d}"))
            qt, rt = [], []                     # x // block, x % block for x < lanes
            if L > 1:
                for x in range(L):
                    q, r = divmod_small(Const(x, cw), block[:xw], f"div{x}_{d}")
                    qt.append(reg(xw, Mux(block < L, q, 0), f"qt{x}_{d}"))
                    rt.append(reg(xw, Mux(block < L, r, x), f"rt{x}_{d}"))
            rm1 = reg(sw, size - 1, f"rm1_{d}")
            bm1 = reg(sw, block - 1, f"bm1_{d}")
            cfg.append({
                "t": t, "qt": qt, "rt": rt, "rm1": rm1, "bm1": bm1,
                "rm1_hz": reg(1, high_zero(comb(sw, size - 1, f"rm1c_{d}")), f"rm1_hz_{d}"),
                "bm1_hz": reg(1, high_zero(comb(sw, block - 1, f"bm1c_{d}")), f"bm1_hz_{d}"),
                "r_small": reg(1, size < L, f"r_small_{d}"),
                "b_small": reg(1, block < L, f"b_small_{d}"),
                "r_lo": reg(xw, size[:xw], f"r_lo_{d}"), "b_lo": reg(xw, block[:xw], f"b_lo_{d}"),
            })

        def digit(lo, hz, cin, rm1_lo, small, r_lo, name):
            """Advance a digit of radix ``R``, held as ``gap = R - 1 - x`` (low ``cw`` bits
            ``lo``, ``hz``: no higher bits), by ``cin``; return the carry out and, when it
            wrapped, the new ``x < lanes``. The new gap is ``gap - cin`` without a wrap, else
            ``R - 1 - x``: one subtraction, left to the caller."""
            # R >= lanes: at most one wrap, when gap < cin (a cw-bit compare).
            wrap = comb(1, hz & (lo < cin), f"{name}_wrap")
            x_big = comb(xw, cin - 1 - lo, f"{name}_xb")
            if L == 1:
                return wrap, x_big
            # R < lanes: x < R (R in r_lo), v = x + cin < 2 * lanes - 1; divide v by R.
            x = comb(xw, rm1_lo - lo[:xw], f"{name}_x")
            q, r = divmod_small(comb(cw, x + cin, f"{name}_v"), r_lo, name)
            return (comb(cw, Mux(small, q, wrap), f"{name}_co"),
                    comb(xw, Mux(small, r, x_big), f"{name}_xn"))

        # -- pipeline control -----------------------------------------------------------------
        # Stage d holds dimension d of every lane. Stage 0 moves to the next beat after
        # passing on the one it holds; its carries reach stage d + 1 a cycle later, through
        # registers, with a token saying whether they set up or advance the stage. The index
        # of a beat is summed along the stages behind it: stage d adds its contribution while
        # it holds the beat (partial sums p[d + 1]), the last stage into the output register.
        # All stages move together when the output register can take a beat (``step``).
        init = Signal()                         # the cycle after start: stage 0 sets up
        left = Signal(self._count_width)        # elements from stage 0's beat on
        s_valid = Signal()                      # stage 0 holds a beat to pass on
        s_last = Signal()                       # ... and it is the last one
        o = self.o
        step = comb(1, ~o.valid | o.ready, "step")
        t_init = [init] + [Signal(name=f"t_init_{d}") for d in range(1, D)]
        t_adv = [s_valid] + [Signal(name=f"t_adv_{d}") for d in range(1, D)]
        p_valid = [s_valid] + [Signal(name=f"p_valid_{d}") for d in range(1, D)]
        p_last = [s_last] + [Signal(name=f"p_last_{d}") for d in range(1, D)]

        # -- lanes ----------------------------------------------------------------------------
        # At set-up (t_init) a stage reads as the zero state (gap size - 1, block gap block - 1,
        # contribution 0) and advances by its carry (k in stage 0): the narrow inputs of the
        # digits are multiplexed, the wide ones enter through the "restart" operands below.
        for k in range(L):
            cin = comb(cw, Mux(init, k, L), f"cin{k}_0")
            psum = None
            for d in range(D):
                cf, top, ini = cfg[d], d == D - 1, t_init[d]
                rgap = Signal(sw, name=f"rgap{k}_{d}")
                c = Signal(iw, name=f"c{k}_{d}")
                if not top:                     # the outermost dimension never wraps
                    gap = Signal(sw, name=f"gap{k}_{d}")
                    carry, x_i = digit(Mux(ini, cf["rm1"][:cw], gap[:cw]),
                                       Mux(ini, cf["rm1_hz"], high_zero(gap)), cin,
                                       cf["rm1"][:xw], cf["r_small"], cf["r_lo"], f"i{k}_{d}")
                    wi = comb(1, carry != 0, f"i{k}_{d}_wrapped")
                else:
                    wi = Const(0, 1)
                delta, x_b = digit(Mux(ini, cf["bm1"][:cw], rgap[:cw]),
                                   Mux(ini, cf["bm1_hz"], high_zero(rgap)), cin,
                                   cf["bm1"][:xw], cf["b_small"], cf["b_lo"], f"b{k}_{d}")
                wb = comb(1, delta != 0, f"b{k}_{d}_wrapped")
                if top or L == 1:               # restart at x < lanes: x // block, x % block
                    q0, r0 = Const(0, xw), Const(0, xw)
                else:
                    q0 = select(x_i, cf["qt"], xw, f"q0_{k}_{d}")
                    r0 = select(x_i, cf["rt"], xw, f"r0_{k}_{d}")
                sel = comb(cw, Mux(wi, q0, delta), f"sel{k}_{d}")
                with m.If(step & (ini | t_adv[d])):
                    m.d.sync += [
                        rgap.eq(Mux(wi | wb | ini, cf["bm1"], rgap)
                                - Mux(wi, r0, Mux(wb, x_b, cin))),
                        c.eq(Mux(wi | ini, 0, c) + select(sel, cf["t"], iw, f"sx{k}_{d}")),
                    ]
                    if not top:
                        m.d.sync += gap.eq(Mux(wi | ini, cf["rm1"], gap) - Mux(wi, x_i, cin))
                total = c if psum is None else psum + c
                if top:
                    with m.If(step):
                        m.d.sync += o.payload.index[k].eq(total)
                    break
                cin, psum = Signal(cw, name=f"cin{k}_{d + 1}"), Signal(iw, name=f"p{k}_{d + 1}")
                with m.If(step):
                    m.d.sync += [cin.eq(carry), psum.eq(total)]

        # -- stream ---------------------------------------------------------------------------
        with m.If(step):
            for d in range(D - 1):
                m.d.sync += [t_init[d + 1].eq(t_init[d]), t_adv[d + 1].eq(t_adv[d] & ~t_init[d]),
                             p_valid[d + 1].eq(p_valid[d]), p_last[d + 1].eq(p_last[d])]
            m.d.sync += [o.valid.eq(p_valid[D - 1]), o.payload.last.eq(p_last[D - 1])]
            with m.If(s_valid):
                m.d.sync += [left.eq(left - L), s_valid.eq(~s_last), s_last.eq(left <= 2 * L)]
        with m.If(init):
            m.d.sync += [init.eq(0), left.eq(self.count), s_valid.eq(self.count != 0),
                         s_last.eq(self.count <= L)]
        with m.If(self.start):
            m.d.sync += [init.eq(1), s_valid.eq(0), o.valid.eq(0),
                         *(t.eq(0) for t in t_init[1:] + t_adv[1:] + p_valid[1:])]
        m.d.comb += self.busy.eq(init | s_valid | o.valid | Cat(*p_valid[1:], Const(0, 1)).any())
        return m
