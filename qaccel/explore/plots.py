"""Plots of a sweep's rows (:func:`qaccel.explore.sweep.run_sweep`, ``qaccel sweep``) as matplotlib
figures, and ``qaccel report``'s PNG files.

* :func:`throughput_figure`: the v2 MatMulNBits engine's MAC/cycle against weight bits, one
  line per block size, one panel per engine (pe x simd, m_tile, DSP pairs) under its peak
  (dotted: ``pe * simd`` at 2..4 bits, half at 5..8); the marker names the bound.
* :func:`roofline_figure`: MAC/cycle against MACs per byte of the ``w`` stream, one panel per
  engine, under the engine's roofs: compute (``pe * simd``; dashed, half that at 5..8 bits,
  whose codes take two nibble MACs each) and the weight stream (``bus bytes per cycle x MACs
  per byte``; a row tile of ``R`` rows uses each weight step ``R`` times). Points below the
  roofs are held by the float lanes, the accumulators' recurrence or the call's fill and
  drain.
* :func:`area_figure`: throughput at the measured Fmax (GMAC/s or G elements/s) against
  LUT4s (a line per weight width through the engines) and against DSP blocks (points), from
  the synthesised rows (``qaccel sweep --synth``).

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
from matplotlib.ticker import NullFormatter, ScalarFormatter

__all__ = ["BOUND_MARKERS", "area_figure", "load_rows", "roofline_figure",
           "throughput_figure", "write_report"]

#: Marker of each bound of :data:`qaccel.explore.perf.V2_BOUNDS` in the throughput plots.
BOUND_MARKERS = {"compute": "o", "lanes": "s", "accumulator": "v"}
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
    cols = min(n, 3)
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


def throughput_figure(rows) -> Figure:
    """MAC/cycle against bits per block size, a panel per engine (see the module docstring)."""
    rows = _nbits_rows(rows)
    _require(rows, "matmul_nbits rows")
    engines = _by_engine(rows)
    first = rows[0]
    fig, axes = _panels(len(engines), f"MatMulNBits v2: a call of M {first['M']} x K "
                                      f"{first['K']} by N {first['N']} (int8 path)")
    for ax, (label, group) in zip(axes, engines.items(), strict=True):
        by_block = _by_block(group)
        for i, (bs, line) in enumerate(by_block.items()):
            dodge = (i - (len(by_block) - 1) / 2) * 0.06   # coinciding lines stay visible
            xs = [r["bits"] + dodge for r in line]
            (drawn,) = ax.plot(xs, [r["per_cycle"] for r in line], label=f"block {bs}",
                               gid=f"block {bs}")
            for x, r in zip(xs, line, strict=True):
                ax.plot(x, r["per_cycle"], BOUND_MARKERS[r["bound"]], color=drawn.get_color(),
                        markersize=5)
        peaks = sorted({(r["bits"], r["peak_per_cycle"]) for r in group})
        ax.plot(*zip(*peaks, strict=True), color="grey", linestyle=":", linewidth=1,
                drawstyle="steps-mid", gid="peak")
        ax.set(xlabel="weight bits", ylabel="MAC / cycle", ylim=(0, None))
        ax.set_title(label, fontsize="medium")
        ax.set_xticks(sorted({r["bits"] for r in group}))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize="small")
    _bound_key(fig, rows)
    return fig


def _bound_key(fig: Figure, rows) -> None:
    bounds = [b for b in BOUND_MARKERS if any(r["bound"] == b for r in rows)]
    handles = [Line2D([], [], marker=BOUND_MARKERS[b], linestyle="none", color="black")
               for b in bounds]
    fig.legend(handles, [f"bound: {b}" for b in bounds], loc="outside lower center",
               ncols=len(bounds), fontsize="small", frameon=False)


def roofline_figure(rows) -> Figure:
    """The roofline of each engine with its sweep points (see the module docstring)."""
    rows = _nbits_rows(rows)
    _require(rows, "matmul_nbits rows")
    engines = _by_engine(rows)
    fig, axes = _panels(len(engines), "Roofline: compute against the weight stream")
    for ax, (label, group) in zip(axes, engines.items(), strict=True):
        peak = max(r["peak_per_cycle"] for r in group)
        bus = group[0]["bus_bytes_per_cycle"]
        xs = [r["macs_per_bus_byte"] for r in group]
        lo, hi = min(xs + [peak / bus]) / 1.5, max(xs + [peak / bus]) * 1.5
        ridge = peak / bus
        ax.plot([lo, ridge, hi], [bus * lo, peak, peak], color="black", linewidth=1.5,
                gid="roof")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.annotate(f"ridge {ridge:.3g} MAC/B", (ridge, peak), textcoords="offset points",
                    xytext=(4, -12), fontsize="small")
        widths = defaultdict(list)
        for r in group:
            widths[r["peak_per_cycle"]].append(r["bits"])
        for low in sorted(p for p in widths if p < peak):   # the 5..8-bit peak
            ax.plot([low / bus, hi], [low, low], color="black", linestyle="--", linewidth=1,
                    gid=f"peak {low:g}")
            ax.annotate(f"{min(widths[low])}..{max(widths[low])} bits", (hi, low),
                        textcoords="offset points", xytext=(-4, 3), fontsize="x-small",
                        ha="right")
        by_block = _by_block(group)
        for i, (bs, pts) in enumerate(by_block.items()):
            # shrinking markers: points of block sizes that coincide show as rings
            ax.plot([r["macs_per_bus_byte"] for r in pts], [r["per_cycle"] for r in pts],
                    "o", markersize=3 + 2.5 * (len(by_block) - 1 - i), label=f"block {bs}",
                    gid=f"block {bs}")
        where = defaultdict(list)           # widths on the same spot share one label
        for r in by_block[max(by_block)]:
            where[(r["macs_per_bus_byte"], r["per_cycle"])].append(str(r["bits"]))
        for xy, widths in where.items():
            ax.annotate(f"{','.join(widths)}b", xy, textcoords="offset points",
                        xytext=(0, 5), fontsize="x-small", ha="center")
        ax.set(xlabel="MACs per byte of weight codes", ylabel="MAC / cycle")
        ax.set_title(label, fontsize="medium")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(ScalarFormatter())
            axis.set_minor_formatter(NullFormatter())
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize="small")
    return fig


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
    for (target, name), pts in sorted(series.items()):
        for ax, field, style in ((ax_lut, "lut", "o-"), (ax_dsp, "dsp", "o")):
            pts = sorted(pts, key=lambda r, field=field: (r[field], r["per_second"]))
            ax.plot([r[field] for r in pts], [r["per_second"] / 1e9 for r in pts], style,
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
