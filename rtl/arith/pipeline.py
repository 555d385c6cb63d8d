"""Small elaboration helpers shared by the stream units: delay lines and register-field widths.

Not components: functions that add logic to a :class:`~amaranth.hdl.Module` being elaborated.
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth.hdl import Const, Module, Signal, Value, unsigned
from amaranth.lib.memory import Memory

__all__ = ["KEEP_ATTR", "RAM_DELAY_BITS", "check_latencies", "choice_index", "choose", "delay",
           "field_width", "line", "local_copy", "signed_width", "stage"]

#: Attribute marking a register that synthesis must keep even where an identical one exists
#: (:func:`local_copy`; ``qaccel.eda.synth`` sets Yosys's ``keep`` on the flip-flops driving it).
KEEP_ATTR = "qaccel_keep"


def field_width(n: int) -> int:
    """Bits of a field that indexes ``n`` choices (at least 1)."""
    return max(1, (n - 1).bit_length())


def signed_width(lo: int, hi: int) -> int:
    """Return the fewest bits of a two's complement value holding every integer in
    ``[lo, hi]`` (``lo <= 0 <= hi``)."""
    w = 1
    while not (-(1 << (w - 1)) <= lo and hi <= (1 << (w - 1)) - 1):
        w += 1
    return w


def choice_index(choices: tuple, choice) -> int:
    """Return the index of ``choice`` in ``choices`` (a unit's carried types or formats, each
    with a ``name``): the value of the ``fmt`` input that selects it.

    Raises :exc:`ValueError` naming the carried choices if ``choice`` is not one of them.
    """
    if choice not in choices:
        raise ValueError(f"fmt must be one of {', '.join(c.name for c in choices)}, "
                         f"not {choice.name!r}")
    return choices.index(choice)


def check_latencies(owner: str, planned: dict[str, int], units: dict) -> None:
    """Raise RuntimeError (an internal error) unless the units built (the values of ``units``
    that are not None, by name) are those of ``planned``, each of its planned ``latency``: a
    unit whose cycles are planned before its sub-units are built checks them with this."""
    built = {name: unit.latency for name, unit in units.items() if unit is not None}
    if built != planned:
        raise RuntimeError(f"internal error: {owner} built units of latencies {built}, "
                           f"planned {planned}")


def choose(m: Module, sel, values, shape, name: str) -> Value:
    """Return ``values[sel]`` (the last value for larger ``sel``) as a ``shape`` value: a
    constant when the values are all equal (so that a build carrying one format folds the
    selection away), else a signal set by a ``Switch``. (A ``Switch`` with only a default
    case becomes an ``always @*`` block without inputs in Verilog, which Icarus never runs.)
    """
    values = list(values)
    if len(set(values)) == 1:
        return Const(values[0], shape)
    out = Signal(shape, name=name)
    with m.Switch(sel):
        for k, v in enumerate(values):
            with m.Case(k) if k < len(values) - 1 else m.Default():
                m.d.comb += out.eq(v)
    return out


def delay(m: Module, value, cycles: int, name: str) -> Value:
    """Return ``value`` delayed by ``cycles`` register stages of ``m``'s ``sync`` domain.

    ``value`` may be a plain value or a :class:`~amaranth.lib.data.View` (its shape is kept).
    The stages are reset-less: a delay line carries data, and its valid bit, which does reset,
    travels separately.
    """
    if cycles < 0:
        raise ValueError(f"cycles must be >= 0, not {cycles}")
    out = value
    for k in range(cycles):
        reg = Signal.like(value, name=f"{name}_d{k + 1}", reset_less=True)
        m.d.sync += reg.eq(out)
        out = reg
    return out


def stage(m: Module, registered: bool, name: str, **values) -> SimpleNamespace:
    """Return ``values`` as attributes, through one reset-less register stage if
    ``registered`` (an optional pipeline stage of a unit with a ``latency`` parameter);
    constants pass unregistered."""
    if registered:
        regs = {}
        for key, value in values.items():
            if isinstance(value, Const):
                regs[key] = value
                continue
            reg = Signal(value.shape(), name=f"{name}_{key}", reset_less=True)
            m.d.sync += reg.eq(value)
            regs[key] = reg
        values = regs
    return SimpleNamespace(**values)


#: Delay lines at least this many bits x cycles, and at least 4 cycles long, run through a
#: LUT RAM (one write and one read per cycle) instead of flip-flops.
RAM_DELAY_BITS = 128


def line(m: Module, value, cycles: int, name: str) -> Value:
    """``value`` delayed by ``cycles`` (>= 0): flip-flops (:func:`delay`), or a LUT RAM ring
    for long, wide lines (:data:`RAM_DELAY_BITS`). The ring's pointer runs freely, so the
    line suits a pipeline that never stalls."""
    width = len(value)
    if cycles < 4 or width * cycles < RAM_DELAY_BITS:
        return delay(m, value, cycles, name)
    size = max(16, 1 << (cycles - 1).bit_length())
    mem = Memory(shape=unsigned(width), depth=size, init=[])
    m.submodules[f"{name}_ring"] = mem
    ptr = Signal(range(size), name=f"{name}_ptr")
    m.d.sync += ptr.eq(ptr + 1)
    wp = mem.write_port()
    rp = mem.read_port(domain="sync")
    # written in cycle t, read (registered) in cycle t + cycles - 1, out in t + cycles
    m.d.comb += [wp.addr.eq(ptr), wp.data.eq(value), wp.en.eq(1),
                 rp.addr.eq(ptr - (cycles - 1))]
    return rp.data


def local_copy(m: Module, value, name: str) -> Signal:
    """Return ``value`` registered (one cycle later) in a register of its own: a unit that
    has several instances on a large part takes its inputs through one, so each instance
    reads a nearby copy rather than one far register. The copies are identical logic, so
    the register carries :data:`KEEP_ATTR`, for which ``qaccel.eda.synth`` keeps it (Yosys's
    ``opt_merge`` would otherwise merge the copies back into one)."""
    reg = Signal.like(value, name=name, attrs={KEEP_ATTR: 1})
    m.d.sync += reg.eq(value)
    return reg
