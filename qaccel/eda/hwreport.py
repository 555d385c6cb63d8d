"""Hardware figures in real units: a unit's synthesis combined with the cycle model.

:func:`hw_report` synthesises one unit built from an :class:`~qaccel.model.config.AccelConfig`
(:func:`qaccel.eda.synth.synthesize`: timing wrapper, YoWASP Yosys + nextpnr, cached) and returns
its LUT, FF, DSP, BRAM, Fmax and critical path with rates at the achieved Fmax:

- ``matmul_nbits``: the v2 engine (:class:`~qaccel.rtl.nbits.matmul_nbits_v2.MatMulNBitsV2` with
  ECP5 primitives, :func:`build_nbits_v2`) and :func:`engine_rates`, per weight width and
  block size: the call of one token (one row of A, ``M = 1``) through a layer of K x N
  weights (:func:`qaccel.explore.perf.nbits_v2_call`), its MAC/cycle times Fmax (GMAC/s), and
  tokens/s on chip and with an external memory of :data:`MEMORY_GBPS` GB/s feeding every
  stream (the memory-bound figure). The headline ``token`` is int4 in blocks of 32
  (:data:`TOKEN_SETTING`).
- ``quantize`` / ``dequantize``: one call on a K x N tensor with a per-tensor scale
  (:func:`qaccel.explore.perf.elementwise_call`: table load, one beat of ``lanes`` elements
  per cycle, start and pipeline latencies), its elements per cycle times Fmax
  (:func:`throughput`).

:mod:`qaccel.explore.sweep` evaluates the same figures over a grid of engines (:func:`build_unit`,
:func:`engine_rates`, :func:`throughput`).

:func:`mac_packing` measures how many MACs the engine's packed MAC array
(:class:`~qaccel.rtl.nbits.packed_mac_array.PackedMacArray`) gets per DSP block for each weight
width,
next to Xilinx's DSP48E2 packings (:data:`REFERENCE_PACKINGS`). :func:`format_report`,
:func:`format_rates` and :func:`format_packing` render them as text (``qaccel synth``,
``qaccel perf``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

from amaranth.hdl import Module, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In

from qaccel.eda.floorplan import Region, engine_floorplan
from qaccel.eda.synth import TARGETS, SynthResult, check_router, synthesize
from qaccel.explore.perf import elementwise_call, nbits_v2_call
from qaccel.model.config import NBITS, UNITS, AccelConfig
from qaccel.model.presets import DEFAULT_TARGET, MEMORY_GBPS, MEMORY_NOTE
from qaccel.model.validate import check_int

__all__ = ["ELEMENTWISE", "MEMORY_GBPS", "MEMORY_NOTE", "REFERENCE_PACKINGS", "TOKEN_SETTING",
           "UNITS", "EngineRate", "HwReport", "Packing", "Throughput", "build_nbits_v2",
           "build_unit", "check_layer", "check_positive", "engine_rates", "engine_summary",
           "format_packing", "format_rates", "format_report", "hw_report", "mac_packing",
           "throughput", "token_setting", "undriven_dsp_inputs", "unit_floorplan",
           "weight_bus_bits"]

#: DSP cell of each family, and its data inputs (checked for undriven bits).
_DSP_CELLS = {"ecp5": ("MULT18X18D", ("A", "B", "C")), "ice40": ("SB_MAC16", ("A", "B", "C", "D"))}
#: Published packings to compare with: (device and source, operands, MACs per DSP).
REFERENCE_PACKINGS = (
    ("Xilinx DSP48E2, WP486", "int8 x int8, shared operand", 2),
    ("Xilinx DSP48E2, WP521", "int4 x int4", 4),
)
#: (bits, block_size) of the headline token figures: int4 weights in blocks of 32.
TOKEN_SETTING = (4, 32)


def build_unit(unit: str, config: AccelConfig) -> wiring.Component:
    """Return the component ``unit`` (one of :data:`UNITS`) built from ``config`` for
    synthesis. ``matmul_nbits`` is the v2 engine (:func:`build_nbits_v2`), with the float
    path when ``config.float_path`` asks for it; the Quantize / Dequantize units take their
    ECP5 table (``ecp5=True``: DP16KD instances when the table has at most 512 entries)."""
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {', '.join(UNITS)}, not {unit!r}")
    if not isinstance(config, AccelConfig):
        raise TypeError(f"config must be an AccelConfig, not {config!r}")
    if unit == "matmul_nbits":
        return build_nbits_v2(config)
    if unit == "quantize":
        from qaccel.rtl.elementwise.quantize import Quantize
        return Quantize(config, ecp5=True)
    from qaccel.rtl.elementwise.dequantize import Dequantize
    return Dequantize(config, ecp5=True)


def build_nbits_v2(config: AccelConfig) -> wiring.Component:
    """Return the v2 MatMulNBits engine of ``config`` with ECP5 primitives (for synthesis)."""
    from qaccel.rtl.nbits.matmul_nbits_v2 import MatMulNBitsV2
    return MatMulNBitsV2(config, ecp5=True)


def unit_floorplan(unit: str, config: AccelConfig, target: str) -> tuple[Region, ...]:
    """The floorplan :func:`~qaccel.eda.synth.synthesize` takes for ``unit`` built from
    ``config`` on ``target``: the v2 engine's clusters pinned
    (:func:`~qaccel.eda.floorplan.engine_floorplan`) where the part has a site table; else
    none."""
    if unit != "matmul_nbits" or target not in TARGETS:
        return ()
    return engine_floorplan(config.clusters, TARGETS[target].device)


def weight_bus_bits(config: AccelConfig) -> int:
    """Bits per beat of the v2 engine's ``w`` stream (one weight step): a nibble per MAC,
    ``4 * pe * simd``. A 2..4-bit code takes one nibble, a 5..8-bit code two (which halves
    the peak there); 2-bit codes travel two steps to a beat."""
    return 4 * config.pe * config.simd


@dataclass(frozen=True)
class Throughput:
    """An elementwise unit's rate (:func:`throughput`): ``cycles`` of the whole call on the
    layer-sized tensor, ``per_cycle`` elements per cycle, its ``bound``, ``utilisation``
    (``per_cycle`` over ``lanes``) and ``per_second`` elements/s (None without an Fmax)."""

    cycles: float
    per_cycle: float
    bound: str
    utilisation: float
    per_second: float | None


def check_layer(layer) -> tuple[int, int]:
    """Return ``layer`` as ``(K, N)``, both >= 1; ValueError/TypeError naming it otherwise."""
    if not isinstance(layer, (tuple, list)) or len(layer) != 2:
        raise ValueError(f"layer must be (K, N), not {layer!r}")
    return check_int("layer K", layer[0], 1), check_int("layer N", layer[1], 1)


def check_positive(param: str, value, *, optional: bool = False) -> float | None:
    """Return ``value`` (a number > 0, or None when ``optional``); TypeError/ValueError
    naming ``param`` otherwise."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{param} must be a number{' or None' if optional else ''}, "
                        f"not {value!r}")
    if not value > 0:
        raise ValueError(f"{param} must be positive, not {value!r}")
    return float(value)


def _block_sizes(config: AccelConfig, block_sizes) -> list[int]:
    """``block_sizes`` as a list, or the powers of two from 16 to ``max_block_size``."""
    if block_sizes is None:
        return [1 << e for e in range(4, config.max_block_size.bit_length())]
    return list(block_sizes)


@dataclass(frozen=True)
class EngineRate:
    """One MatMulNBits call, ``M x K`` by ``K x N`` (accuracy_level 4), on the v2 engine
    (:func:`~qaccel.explore.perf.nbits_v2_call`) at ``fmax_mhz``, with an external memory of
    ``memory_gbps`` GB/s feeding every stream.

    ``cycles``, ``macs_per_cycle`` (``M * N * K`` over the call's cycles),
    ``peak_per_cycle``, ``steady_utilisation`` and ``bound`` (what sets a steady-state block:
    ``compute``, ``lanes`` or ``accumulator``) are the model's; ``bytes`` is every stream's
    bytes per call, ``w_bytes`` the ``w`` stream's (packed weight codes). With an Fmax:
    ``seconds`` = cycles / Fmax (on-chip bound), ``memory_seconds`` = ``max(seconds, bytes /
    bandwidth)`` (the memory-bound figure, :meth:`~qaccel.explore.perf.NBitsV2Call.seconds`),
    ``per_second`` MAC/s on chip,
    ``tokens_per_second`` = ``M / seconds`` and ``memory_tokens_per_second`` =
    ``M / memory_seconds`` (a token is one row of A); all None without an Fmax.
    """

    bits: int
    block_size: int
    M: int
    K: int
    N: int
    cycles: int
    macs_per_cycle: float
    peak_per_cycle: int
    steady_utilisation: float
    bound: str
    bytes: int
    w_bytes: int
    fmax_mhz: float | None
    memory_gbps: float
    seconds: float | None
    memory_seconds: float | None
    per_second: float | None
    tokens_per_second: float | None
    memory_tokens_per_second: float | None

    @property
    def memory_bound(self) -> bool:
        """Whether the memory, not the chip, sets the call's time (False without an Fmax)."""
        return self.seconds is not None and self.memory_seconds > self.seconds


def engine_rates(config: AccelConfig, fmax_mhz: float | None = None, *,
                 layer: tuple[int, int] = (4096, 4096), M: int = 1,
                 bits: Iterable[int] | None = None, block_sizes: Iterable[int] | None = None,
                 memory_gbps: float = MEMORY_GBPS, bias: bool = False,
                 float_path: bool = False,
                 float_zero_points: bool = False) -> list[EngineRate]:
    """Return the v2 engine's :class:`EngineRate` of an ``M x K`` by ``K x N`` call
    (``layer = (K, N)``) per ``bits`` (default ``config.nbits``) x ``block_sizes`` (default
    the powers of two from 16 to ``config.max_block_size``), at ``fmax_mhz`` (None: cycle and
    byte figures only) with ``memory_gbps`` GB/s of external memory; ``float_path`` and
    ``float_zero_points`` as :func:`~qaccel.explore.perf.nbits_v2_call` takes them.

    Bad parameters raise ValueError/TypeError naming them (the model's checks: bits the
    config carries, block sizes powers of two from 16 to ``max_block_size``, K up to
    ``max_k``, an even ``pe``).
    """
    if not isinstance(config, AccelConfig):
        raise TypeError(f"config must be an AccelConfig, not {config!r}")
    fmax_mhz = check_positive("fmax_mhz", fmax_mhz, optional=True)
    memory_gbps = check_positive("memory_gbps", memory_gbps)
    K, N = check_layer(layer)
    check_int("M", M, 1)
    timed = fmax_mhz is not None
    rows = []
    for b in config.nbits if bits is None else bits:
        for bs in _block_sizes(config, block_sizes):
            c = nbits_v2_call(config, M=M, N=N, K=K, bits=b, block_size=bs, bias=bias,
                              float_path=float_path, float_zero_points=float_zero_points)
            t = c.seconds(fmax_mhz) if timed else None
            tm = c.seconds(fmax_mhz, memory_gbps) if timed else None
            rows.append(EngineRate(
                bits=b, block_size=bs, M=M, K=K, N=N, cycles=c.cycles,
                macs_per_cycle=c.macs_per_cycle, peak_per_cycle=c.peak_per_cycle,
                steady_utilisation=c.steady_utilisation, bound=c.bound,
                bytes=sum(c.bytes.values()), w_bytes=c.bytes["w"], fmax_mhz=fmax_mhz,
                memory_gbps=memory_gbps,
                seconds=t, memory_seconds=tm,
                per_second=c.macs_per_cycle * fmax_mhz * 1e6 if timed else None,
                tokens_per_second=M / t if timed else None,
                memory_tokens_per_second=M / tm if timed else None))
    return rows


def token_setting(config: AccelConfig) -> tuple[int, int]:
    """(bits, block_size) of the headline token figures: :data:`TOKEN_SETTING`, or where
    ``config`` lacks them its smallest width and its ``max_block_size``."""
    bits, block = TOKEN_SETTING
    return (bits if bits in config.nbits else min(config.nbits),
            min(block, config.max_block_size))


def format_rates(rates: Iterable[EngineRate], lut: int | None = None) -> str:
    """Return :func:`engine_rates`' rows as a table (a header of two lines, then a row per
    setting); with ``lut`` (the synthesised LUT4s) a GMAC/s per kLUT column too. The
    ``bound`` column names what sets a steady-state block, and ``memory`` after it when the
    memory is slower than the chip."""
    rates = list(rates)
    gbps = rates[0].memory_gbps if rates else MEMORY_GBPS
    per_klut = lut is not None
    left = (f"{'bits':>4} {'block':>5} {'cycles':>9} {'MAC/cycle':>9} {'steady':>6} "
            f"{'GMAC/s':>7}" + (f" {'/kLUT':>6}" if per_klut else "") + f" {'bytes':>10}")
    lines = [(" " * len(left) + f"  {'on chip':^20}  {f'memory {gbps:g} GB/s':^20}").rstrip(),
             left + f"  {'us/call':>9} {'tokens/s':>10}  {'us/call':>9} {'tokens/s':>10}"
             "  bound"]

    def num(value, width, digits, scale=1.0):
        return f"{'-':>{width}}" if value is None else f"{value * scale:>{width}.{digits}f}"

    for r in rates:
        klut = (None if r.per_second is None or not lut
                else r.per_second / 1e9 / (lut / 1000))
        bound = r.bound + (", memory" if r.memory_bound else "")
        lines.append(
            f"{r.bits:>4} {r.block_size:>5} {r.cycles:>9} {r.macs_per_cycle:>9.2f} "
            f"{r.steady_utilisation:>6.1%} {num(r.per_second, 7, 3, 1e-9)}"
            + (f" {num(klut, 6, 3)}" if per_klut else "") + f" {r.bytes:>10}"
            f"  {num(r.seconds, 9, 1, 1e6)} {num(r.tokens_per_second, 10, 1)}"
            f"  {num(r.memory_seconds, 9, 1, 1e6)} "
            f"{num(r.memory_tokens_per_second, 10, 1)}  {bound}")
    return "\n".join(lines)


#: Units :func:`throughput` rates (the MatMulNBits engine's are :func:`engine_rates`).
ELEMENTWISE = ("quantize", "dequantize")


def throughput(config: AccelConfig, unit: str, fmax_mhz: float | None = None, *,
               layer: tuple[int, int] = (4096, 4096)) -> Throughput:
    """Return the rate of the elementwise ``unit`` (one of :data:`ELEMENTWISE`) of ``config``
    at ``fmax_mhz`` (None: cycle figures only): one call on a K x N tensor (``layer = (K,
    N)``) with one scale. Bad parameters raise ValueError/TypeError naming them.
    """
    if unit not in ELEMENTWISE:
        raise ValueError(f"unit must be one of {', '.join(ELEMENTWISE)} (matmul_nbits: "
                         f"engine_rates), not {unit!r}")
    fmax_mhz = check_positive("fmax_mhz", fmax_mhz, optional=True)
    K, N = check_layer(layer)
    call = elementwise_call(config, unit, [(K * N, 1)])
    per = call.elements_per_cycle
    return Throughput(float(call.cycles), per, call.bound, per / config.lanes,
                      None if fmax_mhz is None else per * fmax_mhz * 1e6)


@dataclass(frozen=True)
class HwReport:
    """A unit's synthesis (:class:`~qaccel.eda.synth.SynthResult`) and its rates at the achieved
    Fmax: ``matmul_nbits`` :func:`engine_rates` rows (``M = 1`` on the layer) and ``token``,
    the headline setting's (:func:`token_setting`); elementwise units one :func:`throughput`
    row and no ``token``. ``undriven_dsp`` counts DSP cells of the netlist with an undriven
    (``x``) data input bit: a synthesis fault that makes the DSP count wrong."""

    unit: str
    config: AccelConfig
    synth: SynthResult
    layer: tuple[int, int]
    rows: tuple[EngineRate, ...] | tuple[Throughput, ...]
    undriven_dsp: int
    token: EngineRate | None = None

    @property
    def gmacs_per_klut(self) -> float | None:
        """The headline token's GMAC/s per thousand LUT4 (all-in, timing wrapper included);
        None for elementwise units."""
        if self.token is None or not self.synth.lut:
            return None
        return self.token.per_second / 1e9 / (self.synth.lut / 1000)

    def to_dict(self) -> dict:
        """Return the report as JSON-compatible values."""
        return {"unit": self.unit, "config": self.config.to_dict(),
                "synth": self.synth.to_dict(), "layer": list(self.layer),
                "rows": [asdict(r) for r in self.rows], "undriven_dsp": self.undriven_dsp,
                "token": None if self.token is None else asdict(self.token),
                "gmacs_per_klut": self.gmacs_per_klut}


def undriven_dsp_inputs(result: SynthResult) -> int:
    """Return how many DSP cells of ``result``'s netlist have an undriven (``x``) bit on a
    data input (0 when the netlist is not at hand)."""
    cell, ports = _DSP_CELLS[TARGETS[result.target].family]
    path = result.build_dir / f"{result.name}.json" if result.build_dir else None
    if path is None or not path.is_file():
        return 0
    cells = json.loads(path.read_text())["modules"][result.name]["cells"].values()
    return sum(1 for c in cells if c["type"] == cell
               and any("x" in c["connections"].get(p, ()) for p in ports))


def hw_report(config: AccelConfig, *, unit: str = "matmul_nbits", target: str = DEFAULT_TARGET,
              seed: int = 1, freq_mhz: float | None = None,
              layer: tuple[int, int] = (4096, 4096), bits: Iterable[int] | None = None,
              block_sizes: Iterable[int] | None = None,
              memory_gbps: float = MEMORY_GBPS, router: str = "router1",
              slow_nets: bool = False) -> HwReport:
    """Synthesise ``unit`` built from ``config`` for ``target`` and return its figures at
    the achieved Fmax: ``matmul_nbits`` the v2 engine (:func:`build_nbits_v2`) with
    :func:`engine_rates` for one token (``M = 1``) through ``layer`` per ``bits`` x
    ``block_sizes`` and the headline :func:`token_setting`, ``memory_gbps`` GB/s of external
    memory; elementwise units :func:`throughput`. ``seed``, ``freq_mhz`` and ``router``
    (nextpnr's ``router1``, or ``router2`` for large designs such as the ECP5-85F engine) and
    ``slow_nets`` (list the nets into the latest-arriving endpoints) go to
    :func:`~qaccel.eda.synth.synthesize`.

    Raises ValueError/TypeError naming a bad parameter (the rate settings are checked before
    synthesis), and :func:`~qaccel.eda.synth.synthesize`'s errors
    (:exc:`~qaccel.eda.synth.DesignDoesNotFitError` when the unit does not fit the device).
    """
    if not isinstance(config, AccelConfig):
        raise TypeError(f"config must be an AccelConfig, not {config!r}")
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {', '.join(UNITS)}, not {unit!r}")
    tools = {"target": target, "name": unit, "seed": seed, "freq_mhz": freq_mhz,
             "router": check_router(router), "slow_nets": slow_nets}
    bits = None if bits is None else list(bits)
    block_sizes = None if block_sizes is None else list(block_sizes)
    if unit != "matmul_nbits":
        throughput(config, unit, layer=layer)
        result = synthesize(build_unit(unit, config), **tools)
        row = throughput(config, unit, result.fmax_mhz, layer=layer)
        return HwReport(unit, config, result, layer, (row,), undriven_dsp_inputs(result))
    b, bs = token_setting(config)
    settings = {"layer": layer, "memory_gbps": memory_gbps}
    engine_rates(config, **settings, bits=bits, block_sizes=block_sizes)
    result = synthesize(build_nbits_v2(config), **tools,
                        floorplan=unit_floorplan(unit, config, target))
    rows = engine_rates(config, result.fmax_mhz, **settings, bits=bits,
                        block_sizes=block_sizes)
    (token,) = engine_rates(config, result.fmax_mhz, **settings, bits=[b], block_sizes=[bs])
    return HwReport(unit, config, result, check_layer(layer), tuple(rows),
                    undriven_dsp_inputs(result), token)


def _si(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.2f} {prefix}{unit}"
    return f"{value:.2f} {unit}"


def format_report(report: HwReport) -> str:
    """Return ``report`` as text: resources, Fmax, critical path, then the throughput table."""
    r, c = report.synth, report.config
    lines = [r.summary(),
             f"  LUT4 {r.lut}  FF {r.ff}  DSP {r.dsp}  BRAM {r.bram}  Fmax {r.fmax_mhz:.1f} MHz"
             f"  (timing wrapper included: about {r.wrapper_ff} of the FFs)"]
    if report.undriven_dsp:
        lines.append(f"  WARNING: {report.undriven_dsp} DSP cells have undriven data inputs: "
                     "Yosys mis-mapped them, the DSP count and Fmax are not trustworthy")
    lines += [f"  critical path: {line.strip()}" if k == 0 else f"  {line}"
              for k, line in enumerate(r.critical_path.splitlines())]
    if r.slow_nets:
        lines.append("  latest arrivals (ns after the clock edge, endpoints, the net into them):")
        lines += [f"    {delay:5.2f} ns  {fanout:5d}  {net}" for net, fanout, delay in r.slow_nets]
    if report.unit != "matmul_nbits":
        row = report.rows[0]
        K, N = report.layer
        lines.append(f"throughput: a {K} x {N} tensor, per-tensor scale, {c.lanes} lanes: "
                     f"{row.per_cycle:.3f} elements/cycle ({row.bound} bound) x "
                     f"{r.fmax_mhz:.1f} MHz = {_si(row.per_second, 'elements/s')}")
        return "\n".join(lines)
    K, N = report.layer
    t = report.token
    lines += [engine_summary(c),
              f"one token (M = 1) through a layer of K {K} x N {N}, int{t.bits} block "
              f"{t.block_size}: {t.macs_per_cycle:.2f} MAC/cycle x {r.fmax_mhz:.1f} MHz = "
              f"{t.per_second / 1e9:.3f} GMAC/s, {report.gmacs_per_klut:.3f} GMAC/s per kLUT "
              f"({r.lut} LUT4)",
              f"  on chip: {t.tokens_per_second:.1f} tokens/s ({t.seconds * 1e3:.3f} ms a token)",
              f"  memory bound at {t.memory_gbps:g} GB/s "
              f"({MEMORY_NOTE if t.memory_gbps == MEMORY_GBPS else 'external memory'}), "
              f"{t.bytes / 1e6:.2f} MB a token: {t.memory_tokens_per_second:.1f} tokens/s "
              f"({t.memory_seconds * 1e3:.3f} ms a token; "
              f"{'the memory' if t.memory_bound else 'the chip'} binds)",
              "per setting, one token (M = 1, int8 path, accuracy_level 4):",
              format_rates(report.rows, r.lut)]
    return "\n".join(lines)


def engine_summary(config: AccelConfig) -> str:
    """One line: the v2 engine's shape and MAC peak."""
    c = config
    pairs = c.pe * c.simd // 2
    dsp = f"all {pairs}" if c.dsp_pairs is None else f"{c.dsp_pairs} of {pairs}"
    slices = f", {c.clusters} clusters" if c.clusters > 1 else ""
    return (f"engine v2 pe {c.pe} x simd {c.simd}{slices}, m_tile {c.m_tile}, max_k {c.max_k}, "
            f"{dsp} MAC pairs on DSPs: peak {c.pe * c.simd} MAC/cycle at 2..4 bits, "
            f"{c.pe * c.simd // 2} at 5..8")


# ---------------------------------------------------------------------------------------------
# MAC packing


class _CodeWidthMac(wiring.Component):
    """:class:`~qaccel.rtl.nbits.packed_mac_array.PackedMacArray` fed ``bits``-bit weight codes as
    the v2 engine feeds it: a code of 2..4 bits is one column's nibble (its upper bits tied
    to 0, as an array carrying that width only would get it), a code of 5..8 bits takes two
    columns (here its low nibble in column ``2c`` and its high nibble in column ``2c + 1``;
    which two columns the engine takes, :func:`~qaccel.rtl.nbits.matmul_nbits_v2.wide_columns`,
    does not change the multiplier count; its lanes add the sums as ``lo + 16 * hi``). So a step
    takes ``cols = pe`` codes per lane at 2..4 bits and ``pe / 2`` at 5..8: :attr:`macs`
    ``= cols * simd`` MACs of ``bits``-bit weights per cycle."""

    def __init__(self, *, pe: int, simd: int, max_block: int, bits: int, ecp5: bool = False):
        from qaccel.rtl.nbits.packed_mac_array import PackedMacArray

        self._mac = PackedMacArray(pe=pe, simd=simd, max_block=max_block, ecp5=ecp5)
        self._bits = bits
        self._cols = pe if bits <= 4 else pe // 2
        self._simd = simd
        members = self._mac.signature.members
        i = members["i"].signature.members["payload"].shape
        codes = data.ArrayLayout(data.ArrayLayout(unsigned(bits), simd), self._cols)
        layout = data.StructLayout({"qa": i["qa"].shape, "w": codes, "row": i["row"].shape,
                                    "first": i["first"].shape, "last": i["last"].shape})
        super().__init__({"i": In(stream.Signature(layout)), "o": members["o"],
                          "busy": members["busy"]})

    @property
    def macs(self) -> int:
        """MACs of ``bits``-bit weights per cycle."""
        return self._cols * self._simd

    def elaborate(self, platform):
        m = Module()
        m.submodules.mac = mac = self._mac
        wiring.connect(m, mac.o, wiring.flipped(self.o))
        src, dst = self.i.payload, mac.i.payload
        m.d.comb += [self.busy.eq(mac.busy), mac.i.valid.eq(self.i.valid),
                     self.i.ready.eq(mac.i.ready), dst.qa.eq(src.qa), dst.row.eq(src.row),
                     dst.first.eq(src.first), dst.last.eq(src.last)]
        for c, column in enumerate(src.w):
            for j, code in enumerate(column):
                if self._bits <= 4:
                    m.d.comb += dst.w[c][j].eq(code)
                else:
                    m.d.comb += [dst.w[2 * c][j].eq(code[:4]), dst.w[2 * c + 1][j].eq(code[4:])]
        return m


@dataclass(frozen=True)
class Packing:
    """The packed MAC array's DSP use for one weight width on one target (``macs``: MACs of
    ``bits``-bit weights per cycle, ``pe * simd`` at 2..4 bits and half that at 5..8, whose
    codes take two nibble columns; ``lut`` counts the whole wrapped array: LUT multipliers if
    any, adder trees, accumulators, output FIFO, timing wrapper). ``undriven_dsp`` as in
    :class:`HwReport`: nonzero means the DSP count is a mis-mapping, not a packing."""

    target: str
    bits: int
    macs: int
    dsp: int
    lut: int
    fmax_mhz: float
    undriven_dsp: int

    @property
    def macs_per_dsp(self) -> float | None:
        """MACs per DSP block (None when no DSP is used)."""
        return self.macs / self.dsp if self.dsp else None

    @property
    def luts_per_mac(self) -> float:
        return self.lut / self.macs


def mac_packing(targets: Iterable[str] = (DEFAULT_TARGET, "up5k"), widths: Iterable[int] = NBITS,
                *, pe: int = 2, simd: int = 4, max_block: int = 16, router: str = "router1",
                progress: Callable[[Packing], None] | None = None) -> list[Packing]:
    """Synthesise the v2 engine's packed MAC array (``pe`` columns x ``simd`` lanes of 4-bit
    nibbles, two nibble MACs per multiplier, every multiplier a DSP slot, blocks up to
    ``max_block``; with ECP5 primitives on ECP5 targets, as the engine is built) for each
    target and weight width (nextpnr's ``router``) and return its DSP and LUT use.

    The engine's array takes nibbles whatever the run-time width: its figures are the int4
    row (``pe * simd`` MACs) and the int8 row (half: a code in two columns); the int2 / int3
    rows tie the upper nibble bits to 0, which is what an array carrying only that width
    would get. ``progress`` is called after each synthesis.
    """
    check_router(router)
    targets, widths = list(targets), list(widths)
    for t in targets:
        if not isinstance(t, str) or t not in TARGETS:
            raise ValueError(f"targets must be in {', '.join(TARGETS)}, not {t!r}")
    for b in widths:
        if isinstance(b, bool) or b not in NBITS:
            raise ValueError(f"widths must be in {NBITS}, not {b!r}")
    rows = []
    for target in targets:
        for b in widths:
            unit = _CodeWidthMac(pe=pe, simd=simd, max_block=max_block, bits=b,
                                 ecp5=TARGETS[target].family == "ecp5")
            r = synthesize(unit, target=target, name=f"packed_mac_array_p{pe}s{simd}_w{b}",
                           router=router)
            row = Packing(target, b, unit.macs, r.dsp, r.lut, r.fmax_mhz,
                          undriven_dsp_inputs(r))
            rows.append(row)
            if progress is not None:
                progress(row)
    return rows


def format_packing(rows: Iterable[Packing]) -> str:
    """Return the packing table, then :data:`REFERENCE_PACKINGS` for comparison."""
    lines = [f"{'target':<9} {'weight':>6} {'MACs':>4} {'DSP':>4} {'MAC/DSP':>7} "
             f"{'LUT':>5} {'LUT/MAC':>7} {'Fmax':>6}  note"]
    for r in rows:
        per = "-" if r.macs_per_dsp is None else f"{r.macs_per_dsp:.2f}"
        note = ""
        if r.undriven_dsp:
            per += "*"
            note = f"*{r.undriven_dsp} DSPs with undriven inputs: a mis-mapping, not a packing"
        lines.append(f"{r.target:<9} {'int' + str(r.bits):>6} {r.macs:>4} {r.dsp:>4} "
                     f"{per:>7} {r.lut:>5} {r.luts_per_mac:>7.1f} {r.fmax_mhz:>6.1f}  {note}")
    lines.append("LUT: the whole wrapped array (multipliers in logic, adder trees, "
                 "accumulators, FIFO, timing wrapper)")
    lines.append("reference packings (published, not measured here):")
    lines += [f"  {name}: {ops}, {n} MACs per DSP" for name, ops, n in REFERENCE_PACKINGS]
    return "\n".join(lines)

