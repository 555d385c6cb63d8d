"""Directly instantiated ECP5 primitives shared by the v2 units, and their behavioural twins.

Each unit that has an ECP5 variant takes ``ecp5: bool = False``: with True it instantiates the
primitives below for synthesis (Yosys's ``synth_ecp5`` passes them through, nextpnr places
them); with False (the default) it builds the same function, with the same cycle timing, from
ordinary Amaranth logic, which every simulator runs. Amaranth's and Verilator's simulators have
no model of these cells: simulate with ``ecp5=False``; the tests check each unit's instances
against its behavioural twin on Icarus with models of the cells
(tests/rtl/ecp5_models.py).

- :func:`mult18x18d`: one MULT18X18D with its A/B input registers and its output register
  (``p = a * b`` two cycles after ``a`` / ``b``). Yosys never uses these registers when it
  infers a multiplier, and nextpnr then times the bare cell as 3.93 ns of combinational logic
  (register - DSP - register stops near 130-140 MHz on LFE5U-25F speed 6); with the cell's
  own registers that path is gone.
- :func:`registered_product`: :func:`mult18x18d`, or its twin (registers, ``*``, register).
- :func:`product_24x24`: an unsigned 24 x 24-bit product (float32 significands) from three
  :func:`registered_product` (18 + 6-bit split) and the 6 x 6 piece in LUTs, in two parts
  the caller adds.
- :func:`bram_column_width`: the widest column of a memory that one block RAM holds at a
  given depth.
- :func:`dp16kd_sdp`: one DP16KD as a 512 x 36 simple dual-port RAM (write port A, read port
  B, unregistered read), without the collision bypass Yosys adds after an inferred block
  RAM's read data.
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth.hdl import (
    Cat,
    ClockSignal,
    Const,
    Instance,
    Module,
    Mux,
    Signal,
    Value,
    signed,
    unsigned,
)

from qaccel.model.validate import check_bool

__all__ = ["DP16KD_DEPTH", "DP16KD_WIDTH", "MULT_WIDTH", "PRODUCT_24X24_LATENCY",
           "dp16kd_sdp", "mult18x18d", "product_24x24", "registered_product"]

#: Largest operand width of :func:`mult18x18d` (bits, sign included for signed operands).
MULT_WIDTH = 18
#: Cycles of :func:`product_24x24` from its operands to its two parts.
PRODUCT_24X24_LATENCY = 3
#: Low part of a 24-bit operand of :func:`product_24x24` (the MULT18X18D's width).
_LO = 18
#: Words and word width of :func:`dp16kd_sdp` (the DP16KD in its 36-bit mode).
DP16KD_DEPTH = 512
DP16KD_WIDTH = 36


def _product_shape(a: Value, b: Value):
    """Shape of ``a * b`` (Amaranth's), limited to the cell's 36 output bits."""
    shape = (a * b).shape()
    return signed(min(shape.width, 36)) if shape.signed else unsigned(min(shape.width, 36))


def _check_operands(a, b) -> tuple[Value, Value]:
    a, b = Value.cast(a), Value.cast(b)
    for name, v in (("a", a), ("b", b)):
        if not 1 <= len(v) <= MULT_WIDTH:
            raise ValueError(f"operand {name} must be 1 to {MULT_WIDTH} bits wide, not "
                             f"{len(v)}")
    return a, b


def mult18x18d(m: Module, a, b, *, name: str) -> Signal:
    """Instantiate an ECP5 MULT18X18D computing ``a * b`` with its A and B input registers and
    its output register on the ``sync`` clock (CLK0, CE0 high, no reset): the product is valid
    two cycles after ``a`` / ``b``.

    ``a`` and ``b`` are up to 18 bits each; a signed operand is sign-extended to 18 bits and
    drives its SIGNEDA / SIGNEDB pin high, an unsigned one is zero-extended with the pin low
    (so an unsigned 18-bit operand is exact). Returns a signal of ``a * b``'s shape (at most
    36 bits), named ``{name}_p``; the cell is the submodule ``name``.
    """
    a, b = _check_operands(a, b)
    p = Signal(_product_shape(a, b), name=f"{name}_p")
    a18 = Signal(signed(MULT_WIDTH) if a.shape().signed else unsigned(MULT_WIDTH),
                 name=f"{name}_a")
    b18 = Signal(signed(MULT_WIDTH) if b.shape().signed else unsigned(MULT_WIDTH),
                 name=f"{name}_b")
    p36 = Signal(36, name=f"{name}_p36")
    m.d.comb += [a18.eq(a), b18.eq(b), p.eq(p36[:len(p)])]
    ports = {f"i_A{k}": a18[k] for k in range(MULT_WIDTH)}
    ports.update({f"i_B{k}": b18[k] for k in range(MULT_WIDTH)})
    ports.update({f"i_C{k}": Const(0, 1) for k in range(MULT_WIDTH)})
    ports.update({f"o_P{k}": p36[k] for k in range(36)})
    for k in range(4):
        ports.update({f"i_CLK{k}": ClockSignal() if k == 0 else Const(0, 1),
                      f"i_CE{k}": Const(1 if k == 0 else 0, 1), f"i_RST{k}": Const(0, 1)})
    m.submodules[name] = Instance(
        "MULT18X18D",
        p_REG_INPUTA_CLK="CLK0", p_REG_INPUTB_CLK="CLK0", p_REG_OUTPUT_CLK="CLK0",
        p_GSR="DISABLED", p_RESETMODE="SYNC",
        i_SIGNEDA=Const(int(a.shape().signed), 1), i_SIGNEDB=Const(int(b.shape().signed), 1),
        i_SOURCEA=Const(0, 1), i_SOURCEB=Const(0, 1), **ports)
    return p


def registered_product(m: Module, a, b, *, ecp5: bool, name: str) -> Signal:
    """``a * b`` two cycles after ``a`` / ``b``: with ``ecp5`` one :func:`mult18x18d`; without,
    its behavioural twin of the same timing and value (``a`` and ``b`` registered, their
    product registered; Yosys maps the ``*`` onto one MULT18X18D, unregistered). Operands of
    up to 18 bits each; the result has ``a * b``'s shape (at most 36 bits)."""
    check_bool("ecp5", ecp5)
    a, b = _check_operands(a, b)
    if ecp5:
        return mult18x18d(m, a, b, name=name)
    ra = Signal(a.shape(), name=f"{name}_ra", reset_less=True)
    rb = Signal(b.shape(), name=f"{name}_rb", reset_less=True)
    p = Signal(_product_shape(a, b), name=f"{name}_p", reset_less=True)
    m.d.sync += [ra.eq(a), rb.eq(b), p.eq(ra * rb)]
    return p


def _reg(m: Module, value, name: str) -> Signal:
    value = Value.cast(value)
    r = Signal(value.shape(), name=name, reset_less=True)
    m.d.sync += r.eq(value)
    return r


def product_24x24(m: Module, a, b, *, ecp5: bool, name: str) -> tuple[Signal, Signal]:
    """The exact product of two unsigned 24-bit values, as two registered parts three cycles
    (:data:`PRODUCT_24X24_LATENCY`) after ``a`` / ``b``: ``(outer, mid)`` with
    ``a * b == outer + (mid << 18)``; the caller adds them (48 bits; ``outer[:18]`` are
    already the product's low bits, so that is one 30-bit add).

    ``a = ah * 2**18 + al``, ``b = bh * 2**18 + bl``. Cycles 1 and 2: ``al * bl``,
    ``al * bh`` and ``ah * bl`` as :func:`registered_product` (MULT18X18D instances with
    ``ecp5``, their twins without); ``ah * bh`` (6 x 6 bits) in LUTs, no DSP: ``ah``,
    ``3 * ah`` and ``bh`` registered, then three radix-4 rows (0, 1, 2 or 3 times ``ah``)
    registered. Cycle 3: ``mid = al * bh + ah * bl`` (25 bits) beside
    ``outer = Cat(al * bl, ah * bh)`` (the rows summed), registered. Three MULT18X18D,
    about 70 LUT4 for the 6 x 6 piece and the middle add. Measured in
    :class:`~qaccel.rtl.arith.fp32_mul.Fp32Mul`: the 6 x 6 piece in LUTs costs no timing against
    a fourth MULT18X18D (162-165 MHz against 157-171 MHz, seeds 1-3, LFE5U-25F speed 6).
    """
    a, b = Value.cast(a), Value.cast(b)
    if len(a) != 24 or len(b) != 24 or a.shape().signed or b.shape().signed:
        raise ValueError("product_24x24 takes two unsigned 24-bit operands")
    al, ah = a[:_LO], a[_LO:]
    bl, bh = b[:_LO], b[_LO:]
    ll = registered_product(m, al, bl, ecp5=ecp5, name=f"{name}_ll")        # cycle 2
    lh = registered_product(m, al, bh, ecp5=ecp5, name=f"{name}_lh")
    hl = registered_product(m, ah, bl, ecp5=ecp5, name=f"{name}_hl")
    ah1 = _reg(m, ah, f"{name}_ah")                                         # cycle 1
    ah3 = _reg(m, ah + (ah << 1), f"{name}_ah3")
    bh1 = _reg(m, bh, f"{name}_bh")
    rows = [_reg(m, Mux(bh1[2 * k + 1], Mux(bh1[2 * k], ah3, ah1 << 1),
                        Mux(bh1[2 * k], ah1, 0))[:8], f"{name}_hh_r{k}")    # cycle 2
            for k in range(3)]
    hh = rows[0] + (rows[1] << 2) + (rows[2] << 4)
    mid = _reg(m, lh + hl, f"{name}_mid")                                   # cycle 3
    outer = _reg(m, Cat(ll, hh[:12]), f"{name}_outer")
    return outer, mid


#: The data widths of a DP16KD (18 Kib) port; 36 as a 512 x 36 PDPW16KD.
BRAM_WIDTHS = (1, 2, 4, 9, 18, 36)


def bram_column_width(depth: int) -> int:
    """The widest DP16KD configuration at ``depth`` entries or more (18 bits at 1,024, 36 at
    512, 1 bit from 16,384 on). A memory built of columns this wide maps each column onto
    whole block RAMs side by side, with no multiplexer after the read data: Yosys otherwise
    may stack 512 x 36 blocks two deep for 1,024 entries and select between them in LUTs,
    behind the block RAM's slow clock-to-output (about 5.8 ns on speed 6)."""
    return max(w for w in BRAM_WIDTHS if w * max(depth, 512) <= 18432 or w == 1)


def dp16kd_sdp(m: Module, *, depth: int, width: int, name: str) -> tuple[SimpleNamespace,
                                                                           SimpleNamespace]:
    """Instantiate one ECP5 DP16KD as a simple dual-port RAM of ``depth`` (<= 512) words of
    ``width`` (<= 36) bits, in its 512 x 36 mode: port A writes (all four byte enables on),
    port B reads with no output register (REGMODE_B "NOREG": the data of the address
    presented in cycle ``c`` is out in cycle ``c + 1``, like a synchronous read port, after
    the cell's clock-to-out: 5.6-5.8 ns in nextpnr's model, which gives the same figure with
    REGMODE_B "OUTREG", so the output register buys nothing there), no collision bypass
    (reading a word in the cycle it is written gives an undefined value).

    Returns write and read port stand-ins, ``SimpleNamespace(addr, data, en)`` each (the read
    port's ``en`` is its clock enable, initially 1: leave it alone for the shortest path).
    The cell is the submodule ``name``.
    """
    if not 1 <= depth <= DP16KD_DEPTH:
        raise ValueError(f"depth must be 1 to {DP16KD_DEPTH}, not {depth}")
    if not 1 <= width <= DP16KD_WIDTH:
        raise ValueError(f"width must be 1 to {DP16KD_WIDTH}, not {width}")
    aw = max(1, (depth - 1).bit_length())
    wr = SimpleNamespace(addr=Signal(aw, name=f"{name}_waddr"),
                         data=Signal(width, name=f"{name}_wdata"), en=Signal(name=f"{name}_wen"))
    rd = SimpleNamespace(addr=Signal(aw, name=f"{name}_raddr"),
                         data=Signal(width, name=f"{name}_rdata"),
                         en=Signal(name=f"{name}_ren", init=1))
    di = Signal(DP16KD_WIDTH, name=f"{name}_di")
    do = Signal(DP16KD_WIDTH, name=f"{name}_do")
    m.d.comb += [di.eq(wr.data), rd.data.eq(do[:width])]
    ports = {}
    # 36-bit mode: address bits 5..13 (the word), ADA0..3 the byte enables of a write
    for k in range(14):
        ports[f"i_ADA{k}"] = (Const(1, 1) if k < 4 else
                              wr.addr[k - 5] if 5 <= k < 5 + aw else Const(0, 1))
        ports[f"i_ADB{k}"] = rd.addr[k - 5] if 5 <= k < 5 + aw else Const(0, 1)
    for k in range(18):
        ports[f"i_DIA{k}"] = di[k]
        ports[f"i_DIB{k}"] = di[18 + k]
        ports[f"o_DOA{k}"] = do[k]
        ports[f"o_DOB{k}"] = do[18 + k]
    for k in range(3):
        ports[f"i_CSA{k}"] = Const(0, 1)
        ports[f"i_CSB{k}"] = Const(0, 1)
    m.submodules[name] = Instance(
        "DP16KD",
        p_DATA_WIDTH_A=36, p_DATA_WIDTH_B=36, p_REGMODE_A="NOREG", p_REGMODE_B="NOREG",
        p_RESETMODE="SYNC", p_ASYNC_RESET_RELEASE="SYNC", p_CSDECODE_A="0b000",
        p_CSDECODE_B="0b000", p_CLKAMUX="CLKA", p_CLKBMUX="CLKB", p_GSR="DISABLED",
        i_CLKA=ClockSignal(), i_WEA=Const(1, 1), i_CEA=wr.en, i_OCEA=Const(0, 1),
        i_RSTA=Const(0, 1), i_CLKB=ClockSignal(), i_WEB=Const(0, 1), i_CEB=rd.en,
        i_OCEB=Const(1, 1), i_RSTB=Const(0, 1), **ports)
    return wr, rd
