"""Floorplans: pin a netlist's multipliers and block RAMs to sites before nextpnr places it.

A large design on a large part places badly when left alone: nextpnr's analytical placer
spreads the MULT18X18D and DP16KD cells of one engine cluster over every DSP and RAM row
of an LFE5U-85F, and the soft logic follows them, so nets inside one cluster run 80-120
tiles (docs/matmul_nbits_v2.md, section 5). A :class:`Region` names a cell-name prefix and
a rectangle of tiles; :func:`pin` gives every MULT18X18D and DP16KD whose name starts with
the prefix a free site in the rectangle (a ``BEL`` attribute in the Yosys JSON, which
nextpnr honours) and leaves the soft logic to the placer, which then gathers each
cluster around its hard blocks. :func:`engine_floorplan` lays out the v2 MatMulNBits
engine's clusters on a part.

Site tables are known for the LFE5U-85F (:data:`SITE_TABLES`); on other parts
:func:`engine_floorplan` returns no regions (the design places freely).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["SITE_TABLES", "Region", "Site", "engine_floorplan", "pin", "sites"]

#: Hard-block kinds :func:`pin` places, and each kind's site names in a tile (a DSP block
#: of nine tiles holds MULT18_0/1 at its first two columns and MULT18_4/5 at its fifth and
#: sixth; a RAM block holds EBR0..3 at every second column).
_SLOTS = {"MULT18X18D": ((0, "MULT18_0"), (1, "MULT18_1"), (4, "MULT18_4"), (5, "MULT18_5")),
          "DP16KD": ((0, "EBR0"), (2, "EBR1"), (4, "EBR2"), (6, "EBR3"))}


@dataclass(frozen=True)
class SiteTable:
    """Where an ECP5 part's hard blocks are: the first column of each nine-tile DSP/RAM
    block, and the rows holding MULT18X18D and DP16KD sites."""
    block_columns: tuple[int, ...]
    dsp_rows: tuple[int, ...]
    ram_rows: tuple[int, ...]


#: ECP5 devices (nextpnr's ``--85k`` etc.) whose hard-block sites are known: the LFE5U-85F's
#: 156 MULT18X18D in three rows and 208 DP16KD in four, 13 blocks of 4 per row (the die's
#: centre column, 64..68, holds none).
SITE_TABLES: dict[str, SiteTable] = {
    "85k": SiteTable(block_columns=(*range(4, 59, 9), *range(69, 115, 9)),
                     dsp_rows=(10, 34, 58), ram_rows=(22, 46, 70, 82)),
}


@dataclass(frozen=True)
class Site:
    """One hard-block site: tile ``x``, ``y`` and nextpnr's BEL name ``X{x}/Y{y}/{slot}``."""
    kind: str
    x: int
    y: int
    slot: str

    @property
    def bel(self) -> str:
        return f"X{self.x}/Y{self.y}/{self.slot}"


def sites(device: str) -> dict[str, tuple[Site, ...]]:
    """Every MULT18X18D and DP16KD site of the ECP5 ``device`` (a key of :data:`SITE_TABLES`)."""
    if device not in SITE_TABLES:
        raise ValueError(f"device must be one of {', '.join(SITE_TABLES)} (a known site "
                         f"table), not {device!r}")
    t = SITE_TABLES[device]
    rows = {"MULT18X18D": t.dsp_rows, "DP16KD": t.ram_rows}
    return {kind: tuple(Site(kind, x + dx, y, slot) for y in rows[kind]
                        for x in t.block_columns for dx, slot in slots)
            for kind, slots in _SLOTS.items()}


@dataclass(frozen=True)
class Region:
    """The hard blocks of cells named ``prefix...`` go to sites with ``x0 <= x <= x1`` and
    ``y0 <= y <= y1``: a run of as many free sites as cells in the middle of the
    rectangle, in column order, taken by the cells in name order, except that the cells
    whose name after the prefix starts with one of ``centre`` (a cluster's float lanes,
    which every column feeds) take the middle of the run."""
    prefix: str
    x0: int
    x1: int
    y0: int
    y1: int
    centre: tuple[str, ...] = ()


def _natural(name: str) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def pin(cells: dict[str, dict[str, Any]], regions: tuple[Region, ...] | list[Region],
        device: str) -> dict[str, int]:
    """Set a ``BEL`` attribute on each MULT18X18D and DP16KD of ``cells`` (a Yosys JSON
    module's ``cells``) that a region of ``regions`` claims (the first whose prefix the
    name starts with); return how many cells each region's prefix pinned. A cell no region
    claims is left to the placer.

    Raises ValueError naming the region and kind when its rectangle holds fewer free sites
    than it has cells (regions may overlap; earlier ones take their sites first)."""
    table = sites(device)
    taken: set[str] = set()
    claimed: dict[tuple[str, str], list[str]] = {}    # (prefix, kind): its cells
    for n, c in cells.items():
        r = next((q for q in regions if n.startswith(q.prefix)), None)
        if r is not None and c.get("type") in table:
            claimed.setdefault((r.prefix, c["type"]), []).append(n)
    counts: dict[str, int] = {}
    for r in regions:
        counts[r.prefix] = 0
        for kind, all_sites in table.items():
            names = sorted(claimed.get((r.prefix, kind), []), key=_natural)
            free = sorted((s for s in all_sites if r.x0 <= s.x <= r.x1 and r.y0 <= s.y <= r.y1
                           and s.bel not in taken), key=lambda s: (s.x, s.y))
            if len(free) < len(names):
                raise ValueError(f"region {r.prefix!r} holds {len(free)} free {kind} sites "
                                 f"in x {r.x0}..{r.x1}, y {r.y0}..{r.y1}, fewer than its "
                                 f"{len(names)} cells")
            # a run of sites about the middle, the centre cells in the middle of the run
            start = (len(free) - len(names)) // 2
            free = free[start:start + len(names)]
            mid = [n for n in names if r.centre and n[len(r.prefix):].startswith(r.centre)]
            rest = [n for n in names if n not in mid]
            names = rest[:len(rest) // 2] + mid + rest[len(rest) // 2:]
            for n, s in zip(names, free, strict=True):
                cells[n].setdefault("attributes", {})["BEL"] = s.bel
                taken.add(s.bel)
            counts[r.prefix] += len(names)
    return counts


def engine_floorplan(clusters: int, device: str, top: str = "dut.") -> tuple[Region, ...]:
    """Regions for the v2 MatMulNBits engine's ``clusters`` (cells ``{top}cluster{e}.``)
    on the ECP5 ``device``; none with one cluster or on a part without a site table.

    The clusters share out the DSP rows: with up to two per row, the outermost rows are
    used first (so the engine's middle, where its streams meet, stays free for the top
    level's activation quantiser, ``{top}rq.``), each row cut into runs of whole DSP
    blocks. Each DSP row also takes the RAM row nearest it (on the die's outer side when
    two are as near) for its clusters, over the same columns: a rectangle spans both."""
    if clusters <= 1 or device not in SITE_TABLES:
        return ()
    t = SITE_TABLES[device]
    n_rows = min(len(t.dsp_rows), math.ceil(clusters / 2))
    per_row = math.ceil(clusters / n_rows)
    rows = ([t.dsp_rows[len(t.dsp_rows) // 2]] if n_rows == 1 else
            [t.dsp_rows[round(i * (len(t.dsp_rows) - 1) / (n_rows - 1))] for i in range(n_rows)])
    middle = (min(t.dsp_rows) + max(t.dsp_rows)) / 2
    # each DSP row used, outermost first, takes the nearest free RAM row (beyond it if any)
    ram_of: dict[int, int] = {}
    for y in sorted(rows, key=lambda y: -abs(y - middle)):
        free = [r for r in t.ram_rows if r not in ram_of.values()]
        ram_of[y] = min(free, key=lambda r: (abs(r - y), (r - y) * (y - middle) <= 0))
    regions = []
    blocks = t.block_columns
    for i in range(clusters):
        y = rows[i // per_row]
        k = i % per_row
        cols = blocks[k * len(blocks) // per_row:(k + 1) * len(blocks) // per_row]
        ram = ram_of[y]
        regions.append(Region(f"{top}cluster{i}.", cols[0], cols[-1] + 8, min(y, ram),
                              max(y, ram), centre=("lane",)))
    used = set(rows)
    free_rows = [r for r in t.dsp_rows if r not in used]
    if free_rows:
        y = min(free_rows, key=lambda r: abs(r - middle))
        ram = min(t.ram_rows, key=lambda r: (abs(r - y), -r))
        mid = blocks[len(blocks) // 2]
        regions.append(Region(f"{top}rq.", mid - 18, mid + 26, min(y, ram), max(y, ram)))
    return tuple(regions)
