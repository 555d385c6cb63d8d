# amaranth: UnusedElaboratable=no
"""Tests of qaccel.eda.floorplan: the LFE5U-85F's site table, pinning cells by name, the v2
engine's cluster layout, and (``synth``) nextpnr taking the pins."""

from __future__ import annotations

import json

import pytest

from qaccel.eda import synth
from qaccel.eda.floorplan import SITE_TABLES, Region, engine_floorplan, pin, sites

from .test_synth import _Multipliers


def test_sites_85k():
    """156 MULT18X18D in rows 10/34/58 and 208 DP16KD in rows 22/46/70/82, 52 a row, all
    names distinct, no multiplier in the die's centre columns."""
    s = sites("85k")
    assert len(s["MULT18X18D"]) == 156 and len(s["DP16KD"]) == 208
    for kind, rows in (("MULT18X18D", (10, 34, 58)), ("DP16KD", (22, 46, 70, 82))):
        assert sorted({x.y for x in s[kind]}) == list(rows)
        assert all(sum(x.y == y for x in s[kind]) == 52 for y in rows)
        assert len({x.bel for x in s[kind]}) == len(s[kind])
    assert not any(64 <= x.x <= 68 for x in s["MULT18X18D"])
    assert "X13/Y34/MULT18_0" in {x.bel for x in s["MULT18X18D"]}
    assert "X120/Y82/EBR3" in {x.bel for x in s["DP16KD"]}


def test_sites_device_error():
    with pytest.raises(ValueError, match="device must be one of 85k .* not '25k'"):
        sites("25k")


def _cluster_cells(clusters=4, macs=12, lanes=2, top="dut."):
    cells = {}
    for e in range(clusters):
        p = f"{top}cluster{e}."
        cells.update({f"{p}mac.mult_{i}_0": {"type": "MULT18X18D"} for i in range(macs)})
        for lane in range(lanes):
            cells.update({f"{p}lane{lane}.mul_{k}": {"type": "MULT18X18D"} for k in range(6)})
            cells[f"{p}lane{lane}.fifo.ram0"] = {"type": "DP16KD"}
        cells.update({f"{p}act_mem.{i}.0": {"type": "DP16KD"} for i in range(8)})
        cells[f"{p}sum_LUT4"] = {"type": "LUT4"}
    cells.update({f"{top}rq.sig_{k}": {"type": "MULT18X18D"} for k in ("ll", "lh", "hl")})
    cells[f"{top}rq.ring"] = {"type": "DP16KD"}
    cells["other_MULT18X18D"] = {"type": "MULT18X18D"}
    return cells


def _xy(bel):
    x, y, _ = bel.split("/")
    return int(x[1:]), int(y[1:])


def test_engine_floorplan_85k():
    """Four clusters: the outer DSP rows' halves, each with the RAM row beyond it; the top
    level's quantiser in the middle row."""
    regions = engine_floorplan(4, "85k")
    assert [r.prefix for r in regions] == [*(f"dut.cluster{e}." for e in range(4)), "dut.rq."]
    assert [(r.y0, r.y1) for r in regions] == [(10, 22), (10, 22), (58, 70), (58, 70),
                                               (34, 46)]
    assert regions[0].x1 < regions[1].x0 and regions[2].x1 < regions[3].x0
    assert engine_floorplan(1, "85k") == () and engine_floorplan(4, "25k") == ()
    assert engine_floorplan(4, None) == ()


@pytest.mark.parametrize("clusters", [2, 3, 4, 6, 8])
def test_engine_floorplan_disjoint(clusters):
    """Any cluster count gets disjoint rectangles on the part."""
    regions = engine_floorplan(clusters, "85k")
    boxes = [r for r in regions if "cluster" in r.prefix]
    assert len(boxes) == clusters
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert a.x1 < b.x0 or b.x1 < a.x0 or a.y1 < b.y0 or b.y1 < a.y0


def test_pin_engine_cells():
    """Each cluster's 24 multipliers and 10 RAMs land in its rectangle, on distinct sites,
    its lanes in the middle of its run; a lane's six multipliers side by side; other cells
    untouched."""
    cells = _cluster_cells()
    regions = engine_floorplan(4, "85k")
    counts = pin(cells, regions, "85k")
    assert counts == {**{f"dut.cluster{e}.": 34 for e in range(4)}, "dut.rq.": 4}
    bels = [c["attributes"]["BEL"] for c in cells.values() if "attributes" in c]
    assert len(bels) == len(set(bels)) == 4 * 34 + 4
    valid = {s.bel for kind in sites("85k").values() for s in kind}
    assert set(bels) <= valid
    for r in regions:
        for n, c in cells.items():
            if n.startswith(r.prefix) and "attributes" in c:
                x, y = _xy(c["attributes"]["BEL"])
                assert r.x0 <= x <= r.x1 and r.y0 <= y <= r.y1, n
    assert "attributes" not in cells["other_MULT18X18D"]
    assert "attributes" not in cells["dut.cluster0.sum_LUT4"]
    xs = {n: _xy(c["attributes"]["BEL"])[0] for n, c in cells.items()
          if n.startswith("dut.cluster0.") and c["type"] == "MULT18X18D"}
    lane_xs = [x for n, x in xs.items() if ".lane" in n]
    mac_xs = [x for n, x in xs.items() if ".mac." in n]
    assert min(mac_xs) < min(lane_xs) and max(lane_xs) < max(mac_xs)
    lane0 = sorted(x for n, x in xs.items() if ".lane0." in n)
    assert lane0[-1] - lane0[0] <= 14                      # two DSP blocks


def test_pin_too_many_cells():
    cells = _cluster_cells(macs=20)                        # 32 multipliers a cluster
    with pytest.raises(ValueError, match=r"region 'dut.cluster0.' holds 24 free MULT18X18D "
                                         r"sites in x 4..57, y 10..22, fewer than its 32"):
        pin(cells, engine_floorplan(4, "85k"), "85k")


def test_pin_overlapping_regions():
    """An earlier region takes its sites first; a later one gets the rest."""
    cells = {f"a.m{i}": {"type": "MULT18X18D"} for i in range(3)}
    cells.update({f"b.m{i}": {"type": "MULT18X18D"} for i in range(2)})
    box = dict(x0=4, x1=9, y0=10, y1=10)                  # one DSP block: four sites
    pin(cells, (Region("a.", **box), Region("b.", x0=4, x1=18, y0=10, y1=10)), "85k")
    a = {cells[f"a.m{i}"]["attributes"]["BEL"] for i in range(3)}
    b = {cells[f"b.m{i}"]["attributes"]["BEL"] for i in range(2)}
    assert not a & b and all(_xy(s)[0] <= 9 for s in a)
    with pytest.raises(ValueError, match="region 'b.' holds 1 free"):
        pin({k: {"type": v["type"]} for k, v in cells.items()},
            (Region("a.", **box), Region("b.", **box)), "85k")


def test_unit_floorplan():
    """What qaccel synth and the sweep pin: the clustered engine on the 85F only."""
    from qaccel.eda.hwreport import unit_floorplan
    from qaccel.model.presets import preset
    big = preset("ecp5-85k")
    assert unit_floorplan("matmul_nbits", big, "ecp5-85k") == engine_floorplan(4, "85k")
    assert unit_floorplan("matmul_nbits", big, "ecp5-45k") == ()
    assert unit_floorplan("matmul_nbits", preset("ecp5-25k"), "ecp5-85k") == ()
    assert unit_floorplan("quantize", big, "ecp5-85k") == ()


def test_synth_floorplan_errors():
    from qaccel.rtl.arith.saturate import Saturate
    with pytest.raises(ValueError, match="floorplan needs an ECP5 part with a site table "
                                         r"\(85k\), not target 'ecp5-25k'"):
        synth.synthesize(Saturate(8, bits=4), floorplan=engine_floorplan(4, "85k"))
    with pytest.raises(TypeError, match="floorplan must be a tuple of Region"):
        synth.synthesize(Saturate(8, bits=4), target="ecp5-85k", floorplan=("dut.",))


@pytest.mark.synth
def test_synth_pins_reach_nextpnr():
    """The pins are in the JSON nextpnr reads, and nextpnr places the design with them (it
    stops on a BEL name it does not know)."""
    if (reason := synth.missing_tools("ecp5-85k")) is not None:
        pytest.skip(reason)
    region = Region("dut.", x0=100, x1=110, y0=58, y1=58)
    r = synth.synthesize(_Multipliers(3), target="ecp5-85k", name="floorplan_products",
                         floorplan=(region,))
    assert r.dsp == 3 and r.fmax_mhz > 100
    netlist = json.loads((r.build_dir / "floorplan_products.json").read_text())
    cells = netlist["modules"]["floorplan_products"]["cells"]
    bels = sorted(c["attributes"]["BEL"] for c in cells.values() if c["type"] == "MULT18X18D")
    # (six sites in x 100..110: the middle run of three)
    assert bels == ["X101/Y58/MULT18_5", "X105/Y58/MULT18_0", "X106/Y58/MULT18_1"]
    assert SITE_TABLES["85k"].dsp_rows[-1] == 58
