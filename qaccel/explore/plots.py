"""Plots of a sweep's rows (:func:`qaccel.explore.sweep.run_sweep`, ``qaccel sweep``) as matplotlib
figures, and ``qaccel report``'s PNG files.

Both MatMulNBits figures draw rates with the sweep's external memory (``memory_gbps`` GB/s
feeding every stream of the call: ``a``, the weight codes, scales and zero points, bias,
``y``) at a clock (:func:`clock_of`: the row's measured Fmax, else its target's clock
constraint, 100 MHz on ECP5): a call takes the longer of its cycles and its memory time
(:func:`delivered`), so a point is bound by the engine (compute, the float lanes, the
accumulators) or by the memory.

* :func:`throughput_figure`: GMAC/s against weight bits, a panel per engine (pe x simd,
  m_tile, DSP pairs), a line per block size (its own colour and line style, the block sizes
  set slightly apart on the bits axis so that lines that coincide stay visible) under the
  engine's peak (dotted: ``pe * simd`` MACs a cycle at 2..4 bits, half at 5..8, whose codes
  take two nibble MACs each); the marker names the bound.
* :func:`roofline_figure`: GMAC/s against MACs per byte from memory (:func:`intensity`), a
  panel per engine, on log axes labelled per decade (the same decades in every panel), under
  the roofs ``min(memory_gbps * MAC/B, peak)`` (dashed: the 5..8-bit peak) with the ridge
  marked; a point's colour is its width's class (2 bits, 3..4, 5..8: the codes' room on the
  ``w`` stream, so widths of a class share a point), its marker its block size (later block
  sizes smaller, so coinciding points show as rings). Row tiles (``m_tile``) of a call with
  ``M > 1`` multiply the MACs per byte of weights.
* :func:`area_figure`: throughput at the measured Fmax (GMAC/s or G elements/s) against
  LUT4s (a line per weight width through the engines, each its own marker and line style, so
  that widths of the same rate stay visible) and against DSP blocks (points), from the
  synthesised rows (``qaccel sweep --synth``).

Figures are :class:`matplotlib.figure.Figure` objects made without pyplot (no global state,
no display needed); a notebook shows one with ``display(fig)``.
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from qaccel.eda.synth import TARGETS

__all__ = ["BOUND_MARKERS", "area_figure", "clock_of", "delivered", "intensity", "load_rows",
           "roofline_figure", "throughput_figure", "write_report"]

#: Marker of each bound in the throughput plots: the engine's
#: (:data:`qaccel.explore.perf.V2_BOUNDS`) and the external memory's.
BOUND_MARKERS = {"compute": "o", "lanes": "s", "accumulator": "v", "memory": "D"}
#: Line styles and roofline markers of the block sizes, in order (colours: matplotlib's cycle).
_LINESTYLES = ("-", "--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)))
_BLOCK_MARKERS = ("o", "s", "^", "D", "v", "P")
#: Colours of the weight widths' classes on the roofline, 2 / 3..4 / 5..8 bits (ColorBrewer
#: Dark2).
_WIDTH_COLOURS = ("#1b9e77", "#d95f02", "#7570b3")
_PANEL_SIZE = (4.2, 3.2)


def load_rows(folder: str | os.PathLike) -> list[dict[str, Any]]:
    """Return the rows of the sweep in ``folder`` (its ``results.json``)."""
    path = Path(folder) / "results.json"
    if not path.is_file():
        raise ValueError(f"folder {str(folder)!r} holds no sweep results (no {path.name}; "
                         "make one with qaccel sweep -o FOLDER)")
    try:
        rows = json.loads(path.read_text())
        if not isinstance(rows, list) or not all(isinstance(r, dict) and "status" in r
                                                 for r in rows):
            raise ValueError("not a list of rows with a status")
    except ValueError as e:
        raise ValueError(f"{path} is not a sweep's results ({e})") from None
    return rows


def _nbits_rows(rows) -> list[dict[str, Any]]:
    rows = [r for r in rows if r.get("unit") == "matmul_nbits" and r.get("status") == "ok"]
    if any(r.get("peak_per_cycle") is None or "m_tile" not in r for r in rows):
        raise ValueError("rows lack the v2 engine's fields (m_tile, peak_per_cycle): an older "
                         "qaccel sweep made them; run the sweep again to update them")
    return rows


def _dsp_pairs(row) -> str:
    """The engine's MAC pairs on DSPs: ``12 of 16`` or ``all 16``."""
    slots, budget = row["pe"] * row["simd"] // 2, row["dsp_pairs"]
    return f"all {slots}" if budget is None or budget >= slots else f"{budget} of {slots}"


def _engine_label(row) -> str:
    return (f"pe {row['pe']} x simd {row['simd']}, m_tile {row['m_tile']},\n"
            f"{_dsp_pairs(row)} MAC pairs on DSPs")


def _short_label(row) -> str:
    """The engine in a few words, two lines: ``pe 32 x 1, tile 4`` / ``12/16 DSP pairs``."""
    pairs = _dsp_pairs(row).replace(" of ", "/")
    return f"pe {row['pe']} x {row['simd']}, tile {row['m_tile']}\n{pairs} DSP pairs"


def _by_engine(rows) -> dict[str, list[dict[str, Any]]]:
    """Rows grouped by engine (cycle figures do not depend on the target), smallest first."""
    groups = defaultdict(dict)
    for r in rows:
        groups[_engine_label(r)].setdefault((r["bits"], r["block_size"]), r)

    def size(label):
        some = next(iter(groups[label].values()))
        return (max(r["peak_per_cycle"] for r in groups[label].values()), some["pe"],
                some["simd"], some["m_tile"], label)

    order = sorted(groups, key=size)
    return {k: sorted(groups[k].values(), key=lambda r: (r["block_size"], r["bits"]))
            for k in order}


def _by_block(group) -> dict[int, list[dict[str, Any]]]:
    """An engine's rows by block size, in the order they come."""
    blocks = defaultdict(list)
    for r in group:
        blocks[r["block_size"]].append(r)
    return blocks


def _panels(n: int, title: str) -> tuple[Figure, list]:
    cols = 2 if n == 4 else min(n, 3)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(_PANEL_SIZE[0] * cols, _PANEL_SIZE[1] * rows + 0.6),
                 layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel().tolist()
    for ax in axes[n:]:
        ax.set_visible(False)
    fig.suptitle(title)
    return fig, axes[:n]


def _require(rows, what: str) -> None:
    if not rows:
        raise ValueError(f"rows hold no {what} (status ok); got {len(rows)} usable rows")


def _check_clock(clock_mhz) -> float | None:
    if clock_mhz is None:
        return None
    if isinstance(clock_mhz, bool) or not isinstance(clock_mhz, (int, float)) \
            or not clock_mhz > 0:
        raise ValueError(f"clock_mhz must be a positive number of MHz or None (each row's "
                         f"Fmax, else its target's clock), not {clock_mhz!r}")
    return float(clock_mhz)


def clock_of(row, clock_mhz: float | None = None) -> float:
    """The clock (MHz) a row's rates are drawn at: ``clock_mhz`` if given, else the row's
    measured Fmax (a synthesised row), else its target's clock constraint (100 MHz on ECP5)."""
    clock = _check_clock(clock_mhz)
    if clock is not None:
        return clock
    if row.get("fmax_mhz"):
        return float(row["fmax_mhz"])
    return TARGETS[row["target"]].freq_mhz


def delivered(row, clock_mhz: float) -> tuple[float, str]:
    """``(GMAC/s, bound)`` of a matmul_nbits row at ``clock_mhz`` with the row's
    ``memory_gbps`` GB/s of external memory feeding every stream (its ``bytes``): the call
    takes the longer of its cycles and its memory time; ``bound`` is ``"memory"`` when the
    memory is slower, else the engine's own bound."""
    chip = row["cycles"] / (clock_mhz * 1e6)
    memory = row["bytes"] / (row["memory_gbps"] * 1e9)
    macs = row["M"] * row["K"] * row["N"]
    return macs / max(chip, memory) / 1e9, "memory" if memory > chip else row["bound"]


def intensity(row) -> float:
    """MACs per byte crossing the engine's interface (every stream: a, w, s, b, y)."""
    return row["M"] * row["K"] * row["N"] / row["bytes"]


def _block_styles(rows) -> dict[int, dict[str, Any]]:
    """Colour, line style and marker of each block size of ``rows`` (the same in every
    panel and figure)."""
    sizes = sorted({r["block_size"] for r in rows})
    return {bs: {"color": f"C{i % 10}", "linestyle": _LINESTYLES[i % len(_LINESTYLES)],
                 "marker": _BLOCK_MARKERS[i % len(_BLOCK_MARKERS)]}
            for i, bs in enumerate(sizes)}


def _call_text(row) -> str:
    return f"M {row['M']} x K {row['K']} by N {row['N']}"


def throughput_figure(rows, *, clock_mhz: float | None = None) -> Figure:
    """GMAC/s against weight bits per block size, a panel per engine, with the sweep's
    external memory (see the module docstring); ``clock_mhz`` as :func:`clock_of`."""
    rows = _nbits_rows(rows)
    _require(rows, "matmul_nbits rows")
    _check_clock(clock_mhz)
    engines = _by_engine(rows)
    styles = _block_styles(rows)
    first = rows[0]
    fig, axes = _panels(len(engines), f"MatMulNBits v2, int8 path: a call of {_call_text(first)}"
                                      f", fed by {first['memory_gbps']:g} GB/s of memory")
    sizes = list(styles)
    for ax, (label, group) in zip(axes, engines.items(), strict=True):
        clock = clock_of(group[0], clock_mhz)
        for bs, line in _by_block(group).items():
            # block sizes side by side: lines that coincide stay visible
            dodge = (sizes.index(bs) - (len(sizes) - 1) / 2) * 0.1
            xs = [r["bits"] + dodge for r in line]
            rates = [delivered(r, clock) for r in line]
            style = styles[bs]
            ax.plot(xs, [g for g, _ in rates], color=style["color"],
                    linestyle=style["linestyle"], linewidth=1.4, label=f"block {bs}",
                    gid=f"block {bs}")
            for x, (g, bound) in zip(xs, rates, strict=True):
                ax.plot(x, g, BOUND_MARKERS[bound], color=style["color"], markersize=5,
                        markeredgecolor="black", markeredgewidth=0.5)
        peaks = sorted({(r["bits"], r["peak_per_cycle"] * clock / 1e3) for r in group})
        ax.plot(*zip(*peaks, strict=True), color="grey", linestyle=":", linewidth=1.2,
                drawstyle="steps-mid", gid="peak")
        ax.set(xlabel="weight bits", ylabel=f"GMAC/s at {clock:g} MHz",
               ylim=(0, max(p for _, p in peaks) * 1.12))
        ax.set_title(label, fontsize="medium")
        ax.set_xticks(sorted({r["bits"] for r in group}))
        ax.grid(alpha=0.3)
    lines = [(Line2D([], [], color=s["color"], linestyle=s["linestyle"]), f"block {bs}")
             for bs, s in styles.items()]
    lines.append((Line2D([], [], color="grey", linestyle=":"),
                  "peak: pe x simd MAC/cycle (half at 5..8 bits)"))
    bounds = [(Line2D([], [], marker=marker, linestyle="none", color="white",
                      markeredgecolor="black"), f"bound: {b}")
              for b, marker in BOUND_MARKERS.items()
              if any(delivered(r, clock_of(r, clock_mhz))[1] == b for r in rows)]
    _grouped_legend(fig, [lines, bounds])
    return fig


def _decades(lo: float, hi: float, at_least: int = 2) -> tuple[float, float]:
    """Whole decades around ``lo .. hi``, at least ``at_least`` of them."""
    a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    while b - a < at_least:
        if (b - a) % 2:
            a -= 1
        else:
            b += 1
    return 10.0 ** a, 10.0 ** b


def _log_axis(axis) -> None:
    """Decades labelled as plain numbers (0.1, 1, 10), unlabelled minor ticks between."""
    axis.set_major_locator(LogLocator(base=10))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_locator(LogLocator(base=10, subs=tuple(range(2, 10))))
    axis.set_minor_formatter(NullFormatter())


def roofline_figure(rows, *, clock_mhz: float | None = None) -> Figure:
    """The roofline of each engine with its sweep points (see the module docstring);
    ``clock_mhz`` as :func:`clock_of`."""
    rows = _nbits_rows(rows)
    _require(rows, "matmul_nbits rows")
    _check_clock(clock_mhz)
    engines = _by_engine(rows)
    styles = _block_styles(rows)
    first = rows[0]
    gbps = first["memory_gbps"]
    fig, axes = _panels(len(engines), f"Roofline: {gbps:g} GB/s of memory against each "
                                      f"engine's MACs, a call of {_call_text(first)}")
    # every panel on the same decades, so that the engines compare at a glance
    xs = [intensity(r) for r in rows]
    ys = [delivered(r, clock_of(r, clock_mhz))[0] for r in rows]
    peaks = [r["peak_per_cycle"] * clock_of(r, clock_mhz) / 1e3 for r in rows]
    ridges = [p / gbps for p in peaks]
    xlo, xhi = _decades(min(xs + ridges) / 1.5, max(xs + ridges) * 3)
    ylo, yhi = _decades(min(ys) / 1.5, max(peaks) * 2)
    widths = _width_classes(rows)
    for ax, (label, group) in zip(axes, engines.items(), strict=True):
        clock = clock_of(group[0], clock_mhz)
        roofs = sorted({r["peak_per_cycle"] for r in group}, reverse=True)
        x0 = max(xlo, ylo / gbps)
        for i, per_cycle in enumerate(roofs):       # 2..4 bits, then 5..8 bits (dashed)
            peak = per_cycle * clock / 1e3
            ridge = peak / gbps
            ax.plot([x0, ridge, xhi], [gbps * x0, peak, peak], color="black",
                    linestyle="-" if i == 0 else "--", linewidth=1.5 if i == 0 else 1,
                    gid=f"roof {per_cycle}")
            if i == 0:
                ax.plot([ridge, ridge], [ylo, peak], color="grey", linestyle=":",
                        linewidth=1, gid="ridge")
                ax.annotate(f"ridge {ridge:.2g} MAC/B", (ridge, ylo), textcoords="offset points",
                            xytext=(3, 4), ha="left", va="bottom", fontsize="x-small")
        by_block = _by_block(group)
        for i, (bs, pts) in enumerate(sorted(by_block.items())):
            # later block sizes drawn smaller on top: points that coincide show as rings
            ax.scatter([intensity(r) for r in pts], [delivered(r, clock)[0] for r in pts],
                       c=[widths[r["bits"]][1] for r in pts], marker=styles[bs]["marker"],
                       s=max(3, 7.5 - 1.5 * i) ** 2, edgecolors="black", linewidths=0.6,
                       zorder=3, label=f"block {bs}", gid=f"block {bs}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set(xlim=(xlo, xhi), ylim=(ylo, yhi), xlabel="MAC per byte from memory",
               ylabel=f"GMAC/s at {clock:g} MHz")
        for axis in (ax.xaxis, ax.yaxis):
            _log_axis(axis)
        peak_text = " / ".join(f"{p}" for p in roofs)
        ax.set_title(f"{label}\npeak {peak_text} MAC/cycle = "
                     f"{' / '.join(f'{p * clock / 1e3:.3g}' for p in roofs)} GMAC/s",
                     fontsize="medium")
        ax.grid(alpha=0.35, which="major")
        ax.grid(alpha=0.12, which="minor")
    roofs = [(Line2D([], [], color="black"), f"roof: min({gbps:g} GB/s x MAC/B, peak)"),
             (Line2D([], [], color="black", linestyle="--"), "roof at 5..8 bits (half the peak)"),
             (Line2D([], [], color="grey", linestyle=":"), "ridge: where the roofs meet")]
    colours = [(Line2D([], [], marker="o", linestyle="none", color=colour,
                       markeredgecolor="black"), name)
               for name, colour in dict(widths.values()).items()]
    blocks = [(Line2D([], [], marker=s["marker"], linestyle="none", color="white",
                      markeredgecolor="black"), f"block {bs}") for bs, s in styles.items()]
    _grouped_legend(fig, [roofs, colours, blocks])
    return fig


def _grouped_legend(fig: Figure, groups) -> None:
    """A legend below the panels with a column per group of ``(handle, label)`` pairs."""
    depth = max(len(g) for g in groups)
    blank = (Line2D([], [], linestyle="none"), "")
    entries = [e for g in groups for e in g + [blank] * (depth - len(g))]
    fig.legend(*zip(*entries, strict=True), loc="outside lower center", ncols=len(groups),
               fontsize="small", frameon=False)


def _width_classes(rows) -> dict[int, tuple[str, str]]:
    """``{bits: (name, colour)}`` for the widths of ``rows``: widths whose codes take the same
    room on the ``w`` stream share a class and a colour (two 2-bit codes a nibble, a nibble
    per 3..4-bit code, two per 5..8-bit code; :func:`qaccel.eda.hwreport.weight_bus_bits`), as
    they share the roofline's points."""
    classes = {2: ("2 bits", _WIDTH_COLOURS[0])}
    classes.update({b: ("3..4 bits", _WIDTH_COLOURS[1]) for b in (3, 4)})
    classes.update({b: ("5..8 bits", _WIDTH_COLOURS[2]) for b in range(5, 9)})
    return {r["bits"]: classes[r["bits"]] for r in sorted(rows, key=lambda r: r["bits"])}


def area_figure(rows, *, block_size: int | None = None) -> Figure:
    """Throughput at the measured Fmax against LUT4s and DSP blocks, from synthesised rows.

    MatMulNBits rows at ``block_size`` (default: the most common one, then the smallest)
    give one line per weight width through the engines; quantize / dequantize rows one line
    per unit through the lane counts. Each engine is labelled once.
    """
    done = [r for r in rows if r.get("status") == "ok" and r.get("lut") is not None
            and r.get("per_second") is not None]
    _require(done, "synthesised rows (qaccel sweep --synth)")
    nbits = [r for r in done if r["unit"] == "matmul_nbits"]
    if nbits:
        sizes = sorted({r["block_size"] for r in nbits})
        if block_size is None:
            block_size = max(sizes, key=lambda bs: (sum(r["block_size"] == bs for r in nbits),
                                                    -bs))
        elif block_size not in sizes:
            raise ValueError(f"block_size must be one of the sweep's {sizes}, not "
                             f"{block_size!r}")
    series = defaultdict(list)
    for r in done:
        if r["unit"] == "matmul_nbits":
            if r["block_size"] == block_size:
                series[(r["target"], f"int{r['bits']}")].append(r)
        else:
            series[(r["target"], r["unit"])].append(r)
    fig = Figure(figsize=(10, 4), layout="constrained")
    ax_lut, ax_dsp = fig.subplots(1, 2)
    unit = "GMAC/s" if nbits else "G elements/s"
    for i, ((target, name), pts) in enumerate(sorted(series.items())):
        # each series its own marker and line style, later ones smaller: widths whose rates
        # coincide (2..4 bits) stay visible
        marker, size = _BLOCK_MARKERS[i % len(_BLOCK_MARKERS)], max(3.0, 7.0 - 1.5 * i)
        for ax, field, line in ((ax_lut, "lut", _LINESTYLES[i % len(_LINESTYLES)]),
                                (ax_dsp, "dsp", "none")):
            pts = sorted(pts, key=lambda r, field=field: (r[field], r["per_second"]))
            ax.plot([r[field] for r in pts], [r["per_second"] / 1e9 for r in pts],
                    color=f"C{i % 10}", marker=marker, markersize=size, linestyle=line,
                    markeredgecolor="black", markeredgewidth=0.5,
                    label=f"{name} ({target})", gid=f"{target} {name}")
    labelled = set()
    for r in done:
        engine = (_short_label(r) if r["unit"] == "matmul_nbits"
                  else f"{r['unit']}, {r['lanes']} lanes")
        if (r["target"], engine) in labelled or r["block_size"] != block_size:
            continue
        # alternately above and below the point: neighbours' labels overlap less
        below = len(labelled) % 2
        labelled.add((r["target"], engine))
        text = ax_lut.annotate(f"{engine}, {r['fmax_mhz']:.0f} MHz",
                               (r["lut"], r["per_second"] / 1e9), textcoords="offset points",
                               xytext=(4, -4) if below else (4, 4),
                               va="top" if below else "bottom", fontsize="x-small")
        text.set_in_layout(False)           # the panel keeps its size; room on the right
    lo, hi = ax_lut.get_xlim()
    ax_lut.set_xlim(lo, hi + 0.4 * (hi - lo))
    ax_lut.set(xlabel="LUT4", ylabel=unit)
    ax_lut.xaxis.set_major_formatter(FuncFormatter(_thousands))
    ax_dsp.set(xlabel="DSP blocks (MULT18X18D / SB_MAC16)", ylabel=unit)
    for ax in (ax_lut, ax_dsp):
        ax.set_ylim(0, ax.get_ylim()[1] * 1.15)         # room for the labels
        ax.grid(alpha=0.3)
    fig.legend(*ax_dsp.get_legend_handles_labels(), loc="outside right upper",
               fontsize="small")
    what = (f"MatMulNBits v2, block {block_size}, M {nbits[0]['M']}" if nbits
            else "elementwise units")
    fig.suptitle(f"Throughput at the measured Fmax against area: {what}")
    return fig


def _thousands(value: float, _pos=None) -> str:
    """A tick label in thousands (``12k``) when the value is that large."""
    return f"{value / 1e3:g}k" if abs(value) >= 1e3 else f"{value:g}"


def write_report(rows, folder: str | os.PathLike) -> dict[str, Path | str]:
    """Write the figures that ``rows`` support as PNG files in ``folder``.

    Returns ``{name: path}`` for each file written and ``{name: reason}`` for each figure
    the rows cannot make (no matmul_nbits rows, nothing synthesised).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path | str] = {}
    for name, make in (("throughput_vs_bits", throughput_figure),
                       ("roofline", roofline_figure),
                       ("throughput_vs_area", area_figure)):
        try:
            fig = make(rows)
        except ValueError as e:
            out[name] = str(e)
            continue
        path = folder / f"{name}.png"
        fig.savefig(path, dpi=110)
        out[name] = path
    return out
