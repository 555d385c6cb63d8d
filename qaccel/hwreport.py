"""Hardware figures in real units: a unit's synthesis combined with the cycle model.

:func:`hw_report` synthesises one unit built from an :class:`~qaccel.model.config.AccelConfig`
(:func:`qaccel.synth.synthesize`: timing wrapper, YoWASP Yosys + nextpnr, cached) and returns
its LUT, FF, DSP, BRAM, Fmax and critical path with :func:`throughput` rows:

- ``matmul_nbits``: per weight width and block size, the steady-state pass of
  :func:`qaccel.model.perf.nbits_pass` at the layer's K, its MAC/cycle times Fmax (GMAC/s),
  and tokens/s for a layer of K x N weights: one token is one row of A through the layer, a
  GEMV call of ``ceil(N / pe)`` passes with its fill and drain
  (:func:`qaccel.model.perf.nbits_call` with ``M = 1``).
- ``quantize`` / ``dequantize``: one call on a K x N tensor with a per-tensor scale
  (:func:`qaccel.model.perf.elementwise_call`: table load, one beat of ``lanes`` elements
  per cycle, start and pipeline latencies), its elements per cycle times Fmax.

:func:`mac_packing` measures how many MACs the engine's int8 x intN MAC array
(:class:`~qaccel.rtl.mac_array.MacArray`) gets per DSP block for each weight width, next to
Xilinx's DSP48E2 packings (:data:`REFERENCE_PACKINGS`). :func:`format_report` and
:func:`format_packing` render them as text (``qaccel synth``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

from amaranth.hdl import Module, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In

from qaccel.model.config import NBITS, AccelConfig
from qaccel.model.perf import elementwise_call, nbits_call, nbits_pass
from qaccel.model.validate import check_int
from qaccel.synth import TARGETS, SynthResult, synthesize

__all__ = ["REFERENCE_PACKINGS", "UNITS", "HwReport", "Packing", "Throughput", "build_unit",
           "check_layer",
           "format_packing", "format_report", "hw_report", "mac_packing", "throughput",
           "undriven_dsp_inputs"]

#: Units :func:`build_unit` makes.
UNITS = ("matmul_nbits", "quantize", "dequantize")
#: DSP cell of each family, and its data inputs (checked for undriven bits).
_DSP_CELLS = {"ecp5": ("MULT18X18D", ("A", "B", "C")), "ice40": ("SB_MAC16", ("A", "B", "C", "D"))}
#: Published packings to compare with: (device and source, operands, MACs per DSP).
REFERENCE_PACKINGS = (
    ("Xilinx DSP48E2, WP486", "int8 x int8, shared operand", 2),
    ("Xilinx DSP48E2, WP521", "int4 x int4", 4),
)


def build_unit(unit: str, config: AccelConfig) -> wiring.Component:
    """Return the component ``unit`` (one of :data:`UNITS`) elaborated from ``config``."""
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {', '.join(UNITS)}, not {unit!r}")
    if unit == "matmul_nbits":
        from qaccel.rtl.matmul_nbits import MatMulNBits
        return MatMulNBits(config)
    if unit == "quantize":
        from qaccel.rtl.quantize import Quantize
        return Quantize(config)
    from qaccel.rtl.dequantize import Dequantize
    return Dequantize(config)


@dataclass(frozen=True)
class Throughput:
    """One setting's steady-state rate.

    ``matmul_nbits``: ``cycles`` per pass, ``per_cycle`` MACs per cycle, ``bound`` and
    ``utilisation`` from :func:`~qaccel.model.perf.nbits_pass`; ``per_second`` MAC/s and
    ``tokens_per_second`` (one GEMV call through the layer). Elementwise units: ``bits`` and
    ``block_size`` None, ``cycles`` of the whole call on the layer-sized tensor,
    ``per_cycle`` elements per cycle, ``utilisation`` that over ``lanes``, ``per_second``
    elements/s, no tokens. Rates are None without an Fmax.
    """

    bits: int | None
    block_size: int | None
    cycles: float
    per_cycle: float
    bound: str
    utilisation: float
    per_second: float | None
    tokens_per_second: float | None


def check_layer(layer) -> tuple[int, int]:
    """Return ``layer`` as ``(K, N)``, both >= 1; ValueError/TypeError naming it otherwise."""
    if not isinstance(layer, (tuple, list)) or len(layer) != 2:
        raise ValueError(f"layer must be (K, N), not {layer!r}")
    return check_int("layer K", layer[0], 1), check_int("layer N", layer[1], 1)


def throughput(config: AccelConfig, unit: str, fmax_mhz: float | None = None, *,
               layer: tuple[int, int] = (4096, 4096), bits: Iterable[int] | None = None,
               block_sizes: Iterable[int] | None = None) -> list[Throughput]:
    """Return ``unit``'s rates on ``config`` at ``fmax_mhz`` (None: cycle figures only).

    ``matmul_nbits``: one row per ``bits`` (default ``config.nbits``) x ``block_sizes``
    (default the powers of two from ``max(16, simd)`` to ``config.max_block_size``) on the
    int8 path with packed zero points, for ``layer = (K, N)``. Elementwise units: one row,
    a K x N tensor with one scale.
    Bad parameters raise ValueError/TypeError naming them.
    """
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {', '.join(UNITS)}, not {unit!r}")
    if fmax_mhz is not None:
        if isinstance(fmax_mhz, bool) or not isinstance(fmax_mhz, (int, float)):
            raise TypeError(f"fmax_mhz must be a number or None, not {fmax_mhz!r}")
        if not fmax_mhz > 0:
            raise ValueError(f"fmax_mhz must be positive, not {fmax_mhz!r}")
    hz = None if fmax_mhz is None else fmax_mhz * 1e6
    K, N = check_layer(layer)
    if unit != "matmul_nbits":
        call = elementwise_call(config, unit, [(K * N, 1)])
        per = call.elements_per_cycle
        return [Throughput(None, None, float(call.cycles), per, call.bound, per / config.lanes,
                           None if hz is None else per * hz, None)]
    lo = max(16, config.simd)
    if block_sizes is None:
        block_sizes = [1 << e for e in range(lo.bit_length() - 1,
                                             config.max_block_size.bit_length())]
    rows = []
    for b in config.nbits if bits is None else bits:
        for bs in block_sizes:
            p = nbits_pass(config, K=K, bits=b, block_size=bs)
            token = nbits_call(config, M=1, N=N, K=K, bits=b, block_size=bs).cycles
            rows.append(Throughput(
                b, bs, float(p.cycles), p.macs_per_cycle, p.bound, p.utilisation,
                None if hz is None else p.macs_per_cycle * hz,
                None if hz is None else hz / token))
    return rows


@dataclass(frozen=True)
class HwReport:
    """A unit's synthesis (:class:`~qaccel.synth.SynthResult`) and its :func:`throughput`
    rows at the achieved Fmax. ``undriven_dsp`` counts DSP cells of the netlist with an
    undriven (``x``) data input bit: a synthesis fault that makes the DSP count wrong."""

    unit: str
    config: AccelConfig
    synth: SynthResult
    layer: tuple[int, int]
    rows: tuple[Throughput, ...]
    undriven_dsp: int

    def to_dict(self) -> dict:
        """Return the report as JSON-compatible values."""
        return {"unit": self.unit, "config": self.config.to_dict(),
                "synth": self.synth.to_dict(), "layer": list(self.layer),
                "rows": [asdict(r) for r in self.rows], "undriven_dsp": self.undriven_dsp}


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


def hw_report(config: AccelConfig, *, unit: str = "matmul_nbits", target: str = "ecp5-25k",
              seed: int = 1, freq_mhz: float | None = None,
              layer: tuple[int, int] = (4096, 4096), bits: Iterable[int] | None = None,
              block_sizes: Iterable[int] | None = None) -> HwReport:
    """Synthesise ``unit`` built from ``config`` for ``target`` and return its figures with
    :func:`throughput` at the achieved Fmax.

    Raises ValueError/TypeError naming a bad parameter (the throughput settings are checked
    before synthesis), and :func:`~qaccel.synth.synthesize`'s errors
    (:exc:`~qaccel.synth.DesignDoesNotFitError` when the unit does not fit the device).
    """
    if not isinstance(config, AccelConfig):
        raise TypeError(f"config must be an AccelConfig, not {config!r}")
    bits = None if bits is None else list(bits)
    block_sizes = None if block_sizes is None else list(block_sizes)
    throughput(config, unit, layer=layer, bits=bits, block_sizes=block_sizes)
    result = synthesize(build_unit(unit, config), target=target, name=unit, seed=seed,
                        freq_mhz=freq_mhz)
    rows = throughput(config, unit, result.fmax_mhz, layer=layer, bits=bits,
                      block_sizes=block_sizes)
    return HwReport(unit, config, result, layer, tuple(rows), undriven_dsp_inputs(result))


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
    if report.unit != "matmul_nbits":
        row = report.rows[0]
        K, N = report.layer
        lines.append(f"throughput: a {K} x {N} tensor, per-tensor scale, {c.lanes} lanes: "
                     f"{row.per_cycle:.3f} elements/cycle ({row.bound} bound) x "
                     f"{r.fmax_mhz:.1f} MHz = {_si(row.per_second, 'elements/s')}")
        return "\n".join(lines)
    K, N = report.layer
    lines += [f"engine pe {c.pe} x simd {c.simd}, weight bus {c.weight_bus_width} bits; layer "
              f"K {K} x N {N}: one token = a GEMV of {-(-N // c.pe)} passes with fill and drain "
              "(int8 path, packed zero points)",
              f"{'bits':>4} {'block':>5} {'cycles':>8} {'MAC/cycle':>9} {'util':>6} "
              f"{'GMAC/s':>8} {'tokens/s':>9}  bound"]
    for t in report.rows:
        lines.append(f"{t.bits:>4} {t.block_size:>5} {t.cycles:>8.1f} {t.per_cycle:>9.2f} "
                     f"{t.utilisation:>6.1%} {t.per_second / 1e9:>8.3f} "
                     f"{t.tokens_per_second:>9.1f}  {t.bound}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# MAC packing


class _CodeWidthMac(wiring.Component):
    """:class:`~qaccel.rtl.mac_array.MacArray` fed ``bits``-bit weight codes (the upper code
    bits tied to 0): the MAC array as an engine carrying one weight width would build it."""

    def __init__(self, *, pe: int, simd: int, max_block: int, bits: int):
        from qaccel.rtl.mac_array import MacArray

        self._mac = MacArray(pe=pe, simd=simd, max_block=max_block)
        members = self._mac.signature.members
        codes = data.ArrayLayout(data.ArrayLayout(unsigned(bits), simd), pe)
        super().__init__({"a": members["a"], "w": In(stream.Signature(codes)),
                          "o": members["o"], "busy": members["busy"]})

    def elaborate(self, platform):
        m = Module()
        m.submodules.mac = mac = self._mac
        wiring.connect(m, wiring.flipped(self.a), mac.a)
        wiring.connect(m, mac.o, wiring.flipped(self.o))
        m.d.comb += [self.busy.eq(mac.busy), mac.w.valid.eq(self.w.valid),
                     self.w.ready.eq(mac.w.ready)]
        for p, column in enumerate(self.w.payload):
            m.d.comb += [mac.w.payload[p][j].eq(code) for j, code in enumerate(column)]
        return m


@dataclass(frozen=True)
class Packing:
    """The MAC array's DSP use for one weight width on one target (``macs = pe * simd``
    multipliers; ``lut`` counts the whole wrapped array: multipliers mapped to logic, adder
    trees, accumulators, output FIFO, timing wrapper). ``undriven_dsp`` as in
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


def mac_packing(targets: Iterable[str] = ("ecp5-25k", "up5k"), widths: Iterable[int] = NBITS,
                *, pe: int = 2, simd: int = 4, max_block: int = 16,
                progress: Callable[[Packing], None] | None = None) -> list[Packing]:
    """Synthesise the MAC array (``pe`` x ``simd`` multipliers, blocks up to ``max_block``)
    for each target and weight width and return its DSP and LUT use.

    The engine as built carries 8-bit codes into the array whatever the run-time width (its
    figure is the 8-bit row); the other rows tie the upper code bits to 0, which is what an
    array specialised to that width would get. ``progress`` is called after each synthesis.
    """
    widths = list(widths)
    for b in widths:
        if isinstance(b, bool) or b not in NBITS:
            raise ValueError(f"widths must be in {NBITS}, not {b!r}")
    rows = []
    for target in targets:
        for b in widths:
            unit = _CodeWidthMac(pe=pe, simd=simd, max_block=max_block, bits=b)
            r = synthesize(unit, target=target, name=f"mac_array_p{pe}s{simd}_w{b}")
            row = Packing(target, b, pe * simd, r.dsp, r.lut, r.fmax_mhz,
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

