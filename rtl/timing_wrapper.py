"""A timing harness around any component: registered inputs from an LFSR, registered outputs
XOR-reduced to a few pins, so that place and route reports a meaningful Fmax on a small package."""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.validate import check_int

__all__ = ["TimingWrapper", "port_name"]

#: Output pins accepted by :class:`TimingWrapper`.
OUT_PINS_RANGE = (1, 32)
#: Width and taps of the pattern LFSR (x^16 + x^14 + x^13 + x^11 + 1, maximal length).
LFSR_WIDTH = 16
LFSR_TAPS = (15, 13, 12, 10)
#: Bits XOR-ed per stage of the output reduction tree (one LUT4 level per stage).
XOR_FAN_IN = 4


def port_name(path: tuple) -> str:
    """Return a flattened signature path as text: ``("x", "payload")`` -> ``"x.payload"``,
    array elements as ``"lane[3]"``."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


class TimingWrapper(wiring.Component):
    """Wrap ``component`` so that every path that matters for timing is register to register
    and the top level has only ``clk``, ``rst``, ``din`` and ``out_pins`` output pins.

    Inputs: the signature is flattened (streams' ``payload`` / ``valid`` / ``ready``,
    struct- and array-typed ports, arrays of members) and every bit the wrapped component
    reads is driven by one flip-flop of a shift chain. The chain is fed by a 16-bit maximal
    LFSR XOR-ed with the ``din`` pin, so the synthesiser cannot prove any input constant and
    no pin is needed per port. Ports are packed into the chain in signature order, each
    right-aligned (bit 0 of the first input port is chain bit 0, the newest bit). ``rst``
    (the ``sync`` domain's reset) resets the component and the LFSR.

    Outputs: every bit the component drives is captured in a flip-flop, then reduced by a
    pipelined XOR tree (:data:`XOR_FAN_IN` bits per stage, a register after each stage) to
    ``out_pins`` registered pins: output bit ``k`` ends up in pin ``k % out_pins``. No output
    bit is left unobserved, so nothing is optimised away, and every logic level of the tree
    is a single LUT4, so the tree never sets Fmax.

    The wrapper adds :attr:`register_bits` flip-flops (before optimisation; synthesis may
    drop a few, e.g. the capture of a constant output) and the tree's LUTs; subtract them
    to estimate the bare component. The component must use the ``sync`` domain only (or
    none). There is no functional contract: the outputs are a hash of the behaviour.

    Parameters
    ----------
    component : :class:`amaranth.lib.wiring.Component`
        The design to wrap (elaborated as submodule ``dut``).
    out_pins : :class:`int`
        Output pins, 1..32.

    Raises
    ------
    :exc:`TypeError`
        If ``component`` is not a wiring.Component or ``out_pins`` is not an integer.
    :exc:`ValueError`
        If ``out_pins`` is out of range.

    Members
    -------
    din : :py:`In(1)`
        Mixed into the input pattern.
    dout : :py:`Out(out_pins)`
        XOR reductions of the registered outputs.
    """

    def __init__(self, component: wiring.Component, *, out_pins: int = 4):
        if not isinstance(component, wiring.Component):
            raise TypeError(f"component must be an amaranth wiring.Component, not {component!r}")
        self._out_pins = check_int("out_pins", out_pins, *OUT_PINS_RANGE)
        self._component = component
        self._inputs: list[tuple[str, Value]] = []
        self._outputs: list[tuple[str, Value]] = []
        for path, member, value in component.signature.flatten(component):
            target = self._inputs if member.flow == wiring.In else self._outputs
            target.append((port_name(path), Value.cast(value)))
        super().__init__({"din": In(1), "dout": Out(self._out_pins)})

    @property
    def component(self) -> wiring.Component:
        """The wrapped component."""
        return self._component

    @property
    def out_pins(self) -> int:
        """Number of output pins."""
        return self._out_pins

    @property
    def inputs(self) -> tuple[tuple[str, int], ...]:
        """``(port name, width)`` of the component's inputs, in chain order."""
        return tuple((name, len(v)) for name, v in self._inputs)

    @property
    def outputs(self) -> tuple[tuple[str, int], ...]:
        """``(port name, width)`` of the component's outputs, in capture order."""
        return tuple((name, len(v)) for name, v in self._outputs)

    @property
    def input_bits(self) -> int:
        """Flip-flops of the input shift chain (total input width)."""
        return sum(len(v) for _, v in self._inputs)

    @property
    def output_bits(self) -> int:
        """Flip-flops capturing the outputs (total output width)."""
        return sum(len(v) for _, v in self._outputs)

    def _tree_widths(self) -> list[int]:
        """Widths of the XOR tree's register stages after the capture stage, down to the
        pins (the last is ``out_pins``). Each is a multiple of ``out_pins`` and bit ``k`` of a
        stage feeds bit ``k % width`` of the next, so output bit ``k`` reaches pin
        ``k % out_pins``."""
        p, widths, n = self._out_pins, [], self.output_bits
        while n > p:
            n = p * -(-n // (XOR_FAN_IN * p))     # a multiple of p, at most 4 bits per XOR
            widths.append(n)
        return widths or [p]

    @property
    def out_latency(self) -> int:
        """Register stages from an output port of the component to the pins (capture
        included)."""
        return 1 + len(self._tree_widths())

    @property
    def register_bits(self) -> int:
        """Flip-flops the wrapper adds: LFSR, input chain, output capture and XOR tree."""
        tree = sum(self._tree_widths()) if self.output_bits else 0
        return LFSR_WIDTH + self.input_bits + self.output_bits + tree

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = self._component

        # -- inputs: LFSR ^ din -> shift chain -> ports -------------------------------------
        lfsr = Signal(LFSR_WIDTH, init=1)
        feedback = lfsr[LFSR_TAPS[0]]
        for tap in LFSR_TAPS[1:]:
            feedback ^= lfsr[tap]
        m.d.sync += lfsr.eq(Cat(feedback, lfsr[:-1]))
        n_in = self.input_bits
        if n_in:
            chain = Signal(n_in, reset_less=True)
            new_bit = lfsr[-1] ^ self.din
            m.d.sync += chain.eq(Cat(new_bit, chain[:-1]) if n_in > 1 else new_bit)
            offset = 0
            for _, port in self._inputs:
                m.d.comb += port.eq(chain[offset:offset + len(port)])
                offset += len(port)

        # -- outputs: capture -> pipelined XOR tree -> pins ---------------------------------
        n_out = self.output_bits
        if not n_out:
            return m
        level = Signal(n_out, reset_less=True)
        m.d.sync += level.eq(Cat(port for _, port in self._outputs))
        for width in self._tree_widths():
            nxt = Signal(width, reset_less=True)
            for k in range(width):
                bits = level[k::width]
                m.d.sync += nxt[k].eq(bits.xor() if len(bits) else 0)
            level = nxt
        m.d.comb += self.dout.eq(level)
        return m
