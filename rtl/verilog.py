"""Verilog emission for qaccel components: :func:`emit_verilog` (Amaranth's converter, for the
simulators and the synthesis flow) and :func:`clean_verilog` (the file a user takes into a vendor
flow: deterministic, legal module names, one module per distinct design unit, a timescale)."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from amaranth._toolchain.yosys import find_yosys
from amaranth.back import rtlil, verilog
from amaranth.lib import wiring

from qaccel import __version__

__all__ = ["LINT_WAIVERS", "TIMESCALE", "clean_verilog", "dedup_modules", "emit_verilog",
           "legal_module_name", "run_at_time_zero"]

#: The timescale (unit, precision) :func:`clean_verilog` declares and the simulations run at
#: (the cores are synchronous: it only matters to a simulator that mixes them with delays).
TIMESCALE = ("1ns", "1ps")

#: Verilator ``-Wall`` rules waived on :func:`clean_verilog`'s output, with the reason: what
#: Amaranth's netlist, written by Yosys, is made of. Written out as ``qaccel_lint.vlt`` by
#: ``qaccel verilog``; everything else is an error (tests/rtl/test_verilog.py).
LINT_WAIVERS = {
    "PROCASSINIT": "registers carry their reset value as an initial value (FPGA power-up "
                   "state), and are also assigned in their always block",
    "UNUSEDSIGNAL": "fields of packed structures and stream payloads that a unit does not "
                    "read; synthesis removes them",
    "UNDRIVEN": "bits of packed structures that no consumer reads (driven by nothing)",
    "WIDTHEXPAND": "Yosys writes operands at their own width; Amaranth's typed arithmetic "
                   "defines the result width, which the simulators and synthesis agree on",
    "WIDTHTRUNC": "as WIDTHEXPAND: results assigned to narrower nets keep the low bits, as "
                  "Amaranth defines",
    "UNSIGNED": "generic comparisons against zero of unsigned values in parametrised code",
    "CASEINCOMPLETE": "case statements over a subset of values, with the default assignment "
                      "made before the case",
    "LATCH": "full_case statements whose selector has constant bits: every reachable value "
             "assigns, which Verilator does not see (Yosys and Icarus infer no latch)",
    "CASEOVERLAP": "priority case statements of Amaranth's Switch (the first match wins)",
    "ASCRANGE": "memories and arrays declared with ascending ranges by Yosys",
    "DECLFILENAME": "all of a core's modules live in one file named after the top module",
    "VARHIDDEN": "a port and a local net share a name in a nested scope",
    "UNOPTFLAT": "Verilator's own scheduling note on combinational nets split into parts",
}

#: Attributes that name the build machine's paths or Amaranth's internals: removed.
_STRIPPED_ATTRS = ("generator", "src", "amaranth.hierarchy", "amaranth.decoding")
_MODULE = re.compile(r"^module \\(\S+)$", re.M)
_CELL = re.compile(r"^(  cell )\\(\S+) (\S+)$", re.M)        # the type and the instance
# an always block that only assigns a constant: no sensitivity, so an event-driven simulator
# never runs it (Icarus warns, the net stays X)
_CONST_ALWAYS = re.compile(r"^  always @\*\n    ([\w\\$.]+ ?(?:\[\d+(?::\d+)?\])?) ?= "
                           r"(\d+'[hbdo][0-9a-fA-FxXzZ_]+);\n", re.M)
# Yosys's time-0 trigger of its other always blocks: a register read by each, initialised in
# its declaration, which Icarus 11 applies before any process waits (no event)
_YOSYS_TRIGGER = re.compile(r"^  reg (\\\$auto\$verilog_backend\.cc:\d+:dump_module\$\d+) += 0;$",
                            re.M)
_INIT = "\\qaccel$init "


def run_at_time_zero(text: str) -> str:
    """Make every combinational ``always @*`` block of Yosys's Verilog ``text`` run at time
    0 in every simulator: each reads a register set to 0 by an ``initial`` statement (an
    event, where a declaration's initialiser is none in Icarus 11), Yosys's own for the
    blocks it guards and ``qaccel$init`` for the blocks that only assign a constant (which
    have no sensitivity at all). Synthesis sees constants."""
    text = _YOSYS_TRIGGER.sub(r"  reg \1 ;\n  initial \1 = 1'h0;", text)
    out = []
    for part in re.split(r"(?=^module )", text, flags=re.M):
        if _CONST_ALWAYS.search(part):
            part = _CONST_ALWAYS.sub(
                lambda m: f"  always @* begin\n    if ({_INIT}) begin end\n"
                          f"    {m[1].rstrip()} = {m[2]};\n  end\n", part)
            header_end = part.index(");\n") + 3
            part = (f"{part[:header_end]}  reg {_INIT};\n  initial {_INIT} = 1'h0;\n"
                    f"{part[header_end:]}")
        out.append(part)
    return "".join(out)


def emit_verilog(
    component: wiring.Component,
    name: str,
    path: str | os.PathLike | None = None,
    *,
    emit_src: bool = True,
) -> str:
    """Convert ``component`` to a Verilog module called ``name`` and return its text.

    Ports follow the component's signature, flattened with ``__`` (``i__payload``, ``i__valid``,
    ``i__ready``, ...), plus ``clk`` and ``rst`` when the design has a ``sync`` domain.
    If ``path`` is given the text is also written there, but only when it differs from the
    file's current content, so that mtime-based build tools do not rebuild needlessly.
    ``emit_src=False`` leaves out the ``src`` attributes (Python file and line), which makes
    the text depend on the logic only.
    """
    _check(component, name)
    text = verilog.convert(component, name=name, emit_src=emit_src)
    if path is not None:
        path = Path(path)
        if not path.is_file() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(text)
            os.replace(tmp, path)
    return text


def _check(component, name) -> None:
    if not isinstance(component, wiring.Component):
        raise TypeError(f"component must be an amaranth wiring.Component, not {component!r}")
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"name must be a Verilog identifier, not {name!r}")


def legal_module_name(path: str) -> str:
    """The Verilog identifier for Amaranth's hierarchical module name ``path``
    (``qaccel_quantize.unit.lane0`` -> ``qaccel_quantize__unit__lane0``; any other character
    that is not a letter, digit or ``_`` -> ``_``)."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", path.replace(".", "__"))
    return name if re.match(r"[A-Za-z_]", name) else f"m_{name}"


def _split_modules(text: str) -> tuple[str, list[list]]:
    """RTLIL text -> (its lines before the first attribute or module, [[name, attributes,
    body], ...] in order); ``body`` is the text after the ``module`` line up to and
    including its ``end``."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines)
                  if line.startswith(("attribute ", "module "))), len(lines))
    modules, pending, i = [], [], start
    while i < len(lines):
        line = lines[i]
        if line.startswith("module "):
            j = lines.index("end\n", i)
            modules.append([_MODULE.match(line.rstrip("\n")).group(1), "".join(pending),
                            "".join(lines[i + 1:j + 1])])
            pending, i = [], j
        elif line.strip():
            pending.append(line)
        i += 1
    return "".join(lines[:start]), modules


def _rename_cells(body: str, names: dict[str, str]) -> str:
    return _CELL.sub(lambda m: f"{m[1]}\\{names.get(m[2], m[2])} {m[3]}", body)


# Amaranth numbers generated names from counters across the design (``\port$12225$59``,
# ``$17``): two instances of one unit differ in them alone
_NUMBERED = re.compile(r"(?<![\w$\\])(\\[A-Za-z_][\w.]*(?:\$\d+)+|\$\d+)(?![\w$])")
_CELL_PORT = re.compile(r"^(    connect )(\S+)( .*)$")


def _numbered_name(token: str, k: int) -> str:
    return f"{token.split('$', 1)[0]}${k}" if token.startswith("\\") else f"${k}"


def _canonical_names(modules: list[list]) -> list[list]:
    """Renumber each module's generated names in order of first use (children first, so
    that a parent's connections name its children's renumbered ports): modules that are
    the same design then have the same text."""
    names = {name for name, _, _ in modules}
    bodies = {name: body for name, _, body in modules}
    ports: dict[str, dict[str, str]] = {}

    def visit(name: str) -> None:
        if name in ports:
            return
        ports[name] = {}
        children = {m[2] for m in _CELL.finditer(bodies[name]) if m[2] in names}
        for child in sorted(children):
            visit(child)
        mapping: dict[str, str] = {}

        def rename(match) -> str:
            token = match[1]
            if token not in mapping:
                mapping[token] = _numbered_name(token, len(mapping) + 1)
            return mapping[token]

        out, child = [], None
        for line in bodies[name].splitlines(keepends=True):
            cell = _CELL.match(line.rstrip("\n"))
            if cell:                   # the type keeps its name (the module's, or a primitive)
                child = cell[2] if cell[2] in names else None
                out.append(f"{cell[1]}\\{cell[2]} {_NUMBERED.sub(rename, cell[3])}\n")
                continue
            if line.startswith("  end"):
                child = None
            port = _CELL_PORT.match(line.rstrip("\n")) if child else None
            if port:
                line = (f"{port[1]}{ports[child].get(port[2], port[2])}"
                        f"{_NUMBERED.sub(rename, port[3])}\n")
            else:
                line = _NUMBERED.sub(rename, line)
            out.append(line)
        bodies[name] = "".join(out)
        ports[name] = mapping

    for name, _, _ in modules:
        visit(name)
    return [[name, attrs, bodies[name]] for name, attrs, _ in modules]


def dedup_modules(text: str) -> tuple[str, int]:
    """Merge the modules of RTLIL ``text`` that are the same design (Amaranth writes one
    module per instance): generated names renumbered per module (:func:`_canonical_names`),
    then, children first, a module whose text equals an earlier one's is dropped and its
    instances use the earlier one, until nothing changes. Then give every module a
    :func:`legal_module_name`. Return the text and the number of modules dropped."""
    head, modules = _split_modules(text)
    if not re.search(r'"[^"\n]*\$\d', text):    # (names quoted in strings are not renumbered)
        modules = _canonical_names(modules)
    dropped = 0
    while True:
        first: dict[str, str] = {}
        same: dict[str, str] = {}
        for name, attrs, body in modules:
            key = attrs + body
            if key in first:
                same[name] = first[key]
            else:
                first[key] = name
        if not same:
            break
        dropped += len(same)
        modules = [[n, a, _rename_cells(b, same)] for n, a, b in modules if n not in same]
    legal: dict[str, str] = {}
    for name, _, _ in modules:
        new, k = legal_module_name(name), 1
        while new in legal.values():                  # (two paths folding to one name)
            k += 1
            new = f"{legal_module_name(name)}_{k}"
        legal[name] = new
    out = [head]
    for name, attrs, body in modules:
        out.append(f"{attrs}module \\{legal[name]}\n{_rename_cells(body, legal)}\n")
    return "".join(out), dropped


def clean_verilog(component: wiring.Component, name: str, *, comment: str = "",
                  progress: Callable[[str], None] | None = None) -> str:
    """Convert ``component`` to the Verilog a user takes into a vendor flow, top module
    ``name``, and return its text.

    Deterministic: the same design gives the same bytes from any checkout and machine (no
    ``src`` attributes, no paths, no dates). Module names are legal identifiers
    (:func:`legal_module_name`), and identical units are written once
    (:func:`dedup_modules`). The file opens with a comment (``comment`` added), the
    ``timescale`` :data:`TIMESCALE` and ``default_nettype none`` (restored to ``wire`` at
    its end). The logic is Amaranth's, converted as :func:`emit_verilog` converts it (Yosys's
    ``proc -nomux -norom; memory_collect``), ports named as there, its ``always @*`` blocks
    made to run at time 0 in every simulator (:func:`run_at_time_zero`). ``progress`` (if given)
    is called with a line per stage and its duration."""
    _check(component, name)
    say = progress or (lambda line: None)
    t0 = time.perf_counter()
    il = rtlil.convert(component, name=name, emit_src=False)
    n_before = len(_MODULE.findall(il))
    say(f"elaborated to {n_before} modules ({time.perf_counter() - t0:.1f} s)")
    t0 = time.perf_counter()
    il, dropped = dedup_modules(il)
    say(f"merged {dropped} repeated modules: {n_before - dropped} left "
        f"({time.perf_counter() - t0:.1f} s)")
    t0 = time.perf_counter()
    attrs = " ".join(f"-remove {a}" for a in _STRIPPED_ATTRS)
    script = "\n".join([f"read_rtlil <<rtlil\n{il}\nrtlil", "proc -nomux -norom",
                        "memory_collect", f"attrmap {attrs}", f"attrmap -modattr {attrs}",
                        "write_verilog -norename"])
    text = find_yosys(lambda ver: ver >= (0, 40)).run(["-q", "-"], script,
                                                      ignore_warnings=True)
    say(f"written as Verilog, {len(text) / 1e6:.1f} MB ({time.perf_counter() - t0:.1f} s)")
    body = run_at_time_zero(text.split("\n", 1)[1] if text.startswith("/*") else text)
    head = [f"// {name}: generated by qaccel {__version__}; do not edit."]
    head += [f"// {line}" for line in comment.splitlines()]
    head += [f"`timescale {TIMESCALE[0]} / {TIMESCALE[1]}", "`default_nettype none", ""]
    return "\n".join(head) + body.lstrip("\n").rstrip("\n") + "\n\n`default_nettype wire\n"
