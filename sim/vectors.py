"""Stream millions of test vectors through a component's Verilog with Verilator, no cocotb.

Exhaustive checks of numeric blocks need millions of cycles; cocotb manages tens of thousands
per second, a Verilator C++ loop tens of millions. :class:`VectorSim` builds such a loop once
per Verilog text and runs NumPy arrays through it::

    sim = VectorSim(Adder(16), name="adder")
    out = sim.run({"a": a, "b": b}, latency=1)      # {"s": array([...], dtype=uint32)}

The build lives in ``<build root>/<name>-vectors-<hash>/`` (the build root of
:mod:`qaccel.sim.runner`), keyed by a hash of the Verilog text, the build options, the C++
template (``sim/cpp/vector_loop.cpp``, read by :func:`cpp_template`) and the Verilator
version; a finished build is reused without compiling when its outputs (the loop executable
and the Verilog) still match the sizes and SHA-256 its stamp recorded (else it is rebuilt, with
a notice on stderr), and concurrent processes share one build through a file lock. A
read-only build root serves finished builds; runs then go to
:func:`qaccel.sim.runner.scratch_dir`. Builds run in a process group that dies with this
process and report on stderr (see :mod:`qaccel.sim.runner`). Verilator's C++ build goes
through ccache when it is installed, so a new Verilog text costs a few seconds once the
Verilator runtime is in the cache.

Contract of the loop (one vector per clock, no handshake):

* Ports are those of the emitted Verilog: signature paths flattened with ``__``
  (``i__payload``), plus ``clk`` and ``rst`` when the design has a ``sync`` domain. ``clk``
  and ``rst`` are driven by the loop and cannot be given as inputs.
* ``rst`` is held high for ``reset_cycles`` clock cycles first, with every input at 0.
* Then vector ``t`` is applied to the inputs in cycle ``t``; the outputs are sampled in cycle
  ``t + latency`` just before that cycle's rising clock edge, i.e. after ``latency`` rising
  edges. After the last vector the inputs keep their last values for ``latency`` more cycles.
  A design without a clock must be run with ``latency=0``.
* Inputs not given are held at 0. Values are bit patterns: an input of width ``w`` accepts
  integers in ``[-2**(w-1), 2**w - 1]`` (negative values are taken as two's complement); an
  output comes back as unsigned integers in the smallest of ``uint8/16/32/64`` that holds it.
  Ports wider than 64 bits (up to :data:`MAX_WIDTH`) use 2-D ``uint64`` arrays of shape
  ``(n, ceil(width / 64))``, least significant word first.

:func:`split_fields` / :func:`join_fields` convert between a port's bits and the fields of
an Amaranth :class:`~amaranth.lib.data.StructLayout`.

Speed and build cost (2-core machine, small registered adder, other jobs running): the loop
runs about 11M cycles/s, and :meth:`VectorSim.run` about 9.5M vectors/s file I/O included, at
both 1M and 10M vectors. A new Verilog text builds in 3.5-5 s once the Verilator runtime is
in ccache (two C++ files of about 1.8 s each, mostly parsing ``verilated.h``, compiled in
parallel); the first build ever also compiles the runtime (about 12 s of CPU). Reusing a
build costs only the Verilog emission (0.5-2 s). ``-O1`` (:data:`MAKE_ARGS`) is the faster
choice for build plus run: ``-O2`` runs about 25% faster but compiles 0.5-0.7 s slower, which
pays back only beyond some 40M vectors per build.
"""

from __future__ import annotations

import enum as py_enum
import importlib.metadata
import importlib.resources
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from amaranth.hdl import Module, Shape
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from qaccel.model.validate import check_int
from qaccel.rtl.verilog import clean_verilog
from qaccel.sim.runner import (
    BUILD_ARGS,
    BuildError,
    BuildProgress,
    SimulationError,
    _clear_build_dir,
    _has_builds,
    _notice,
    _unwritable_root,
    build_lock,
    build_root,
    crash_message,
    digest,
    fingerprint,
    log_tail,
    mark_elaborated,
    require_simulator,
    reuse_state,
    root_writable,
    run_dir,
    run_tool,
    simulator_env,
    usual_duration,
    verbose_enabled,
    write_stamp,
)
from qaccel.sim.tbconfig import write_atomic

__all__ = [
    "CLOCK",
    "EXE",
    "MAX_WIDTH",
    "RESET",
    "ComponentBank",
    "RESET_CYCLES",
    "Port",
    "RunStats",
    "VectorSim",
    "as_column",
    "cpp_template",
    "join_fields",
    "loop_ports",
    "run_vectors",
    "split_fields",
]

#: Widest port the loop can drive or sample, in bits.
MAX_WIDTH = 4096
#: Clock cycles with ``rst`` high before the first vector.
RESET_CYCLES = 4
#: Verilator options: no timing support (none is needed), X handling that costs nothing at
#: run time, and the lint waivers Amaranth's Verilog needs.
VERILATOR_ARGS = ("--no-timing", "--x-assign", "fast", "--x-initial", "fast",
                  *BUILD_ARGS["verilator"])
#: C++ optimisation of the model, the Verilator runtime and the loop (see the module notes
#: on speed and build cost).
MAKE_ARGS = ("OPT_FAST=-O1", "OPT_SLOW=-O1", "OPT_GLOBAL=-O1")
#: Parallel C++ compile jobs.
BUILD_JOBS = 2

#: Bump when :func:`_cxx_main` changes the generated loop, so stale builds are not reused
#: (the template text is part of the build key already).
_LOOP_VERSION = 1
#: Clock input of a design with a ``sync`` domain, driven by the loops (never a vector).
CLOCK = "clk"
#: Reset input of a design with a ``sync`` domain, driven by the loops (never a vector).
RESET = "rst"
#: File name of the compiled loop in ``<build dir>/obj_dir/``.
EXE = "vectors"
#: Start of the line that ends the notes at the top of a C++ template in ``sim/cpp/``.
_NOTES_END = "// ---- end of template notes"
_STAMP = "vectors.json"
_HEADER_PORT = re.compile(
    r"VL_(IN|OUT|INOUT)(8|16|64|W)?\(&(\w+),(\d+),(\d+)(?:,(\d+))?\);")


@dataclass(frozen=True)
class Port:
    """One top-level port of the Verilated design.

    ``name`` is the Verilog name, ``cname`` the C++ member of Verilator's model (Verilator
    encodes ``__`` as ``___05F``), ``direction`` is ``"input"`` or ``"output"``.
    """

    name: str
    cname: str
    direction: str
    width: int

    @property
    def words(self) -> int:
        """Number of ``uint64`` words holding one value (1 up to 64 bits)."""
        return -(-self.width // 64)

    @property
    def dtype(self) -> np.dtype:
        """NumPy dtype of one value (of one word for ports wider than 64 bits)."""
        for bits, dt in ((8, np.uint8), (16, np.uint16), (32, np.uint32)):
            if self.width <= bits:
                return np.dtype(dt)
        return np.dtype(np.uint64)

    @property
    def itemsize(self) -> int:
        """Bytes per vector in the exchange files."""
        return self.dtype.itemsize * self.words

    @property
    def wide(self) -> bool:
        """Whether values are 2-D word arrays (ports wider than 64 bits)."""
        return self.width > 64


@dataclass(frozen=True)
class RunStats:
    """Measurements of one :meth:`VectorSim.run`: vectors, clock cycles, seconds.

    ``wall`` covers the whole call (checks, file I/O, the process), ``sim`` only the
    Verilator process.
    """

    vectors: int
    cycles: int
    wall: float
    sim: float

    @property
    def vectors_per_second(self) -> float:
        """Vectors per wall-clock second, file I/O included."""
        return self.vectors / self.wall if self.wall > 0 else float("inf")


def _decode_cname(cname: str) -> str:
    return re.sub(r"__0([0-9A-F]{2})", lambda m: chr(int(m[1], 16)), cname)


def _parse_header(text: str) -> list[Port]:
    ports = []
    for direction, _, cname, msb, lsb, _ in _HEADER_PORT.findall(text):
        width = int(msb) - int(lsb) + 1
        direction = {"IN": "input", "OUT": "output", "INOUT": "inout"}[direction]
        ports.append(Port(_decode_cname(cname), cname, direction, width))
    return ports


def loop_ports(ports: Iterable[Port]) -> tuple[list[Port], list[Port]]:
    """Return the (inputs, outputs) a loop drives and samples (not ``clk``/``rst``, none wider
    than :data:`MAX_WIDTH`), in the order of its offset lists."""
    ins = [p for p in ports if p.direction == "input" and p.name not in (CLOCK, RESET)
           and p.width <= MAX_WIDTH]
    outs = [p for p in ports if p.direction == "output" and p.width <= MAX_WIDTH]
    return ins, outs


def _cxx_main(ports: Sequence[Port]) -> str:
    """Return the C++ loop for ``ports`` (the model class is ``Vdut``)."""
    ins, outs = loop_ports(ports)
    names = {p.name for p in ports if p.direction == "input"}
    ctype = {1: "uint8_t", 2: "uint16_t", 4: "uint32_t", 8: "uint64_t"}
    decl, zero, assign, capture = [], [], [], []
    for k, p in enumerate(ins):
        t = ctype[p.dtype.itemsize]
        decl.append(f"    const {t}* in{k} = in_off[{k}] < 0 ? nullptr : "
                    f"reinterpret_cast<const {t}*>(in_base + in_off[{k}]);")
        if p.wide:
            zero.append(f"    std::memset(top->{p.cname}.data(), 0, sizeof(top->{p.cname}));")
            assign.append(f"            if (in{k}) std::memcpy(top->{p.cname}.data(), "
                          f"in{k} + t * {p.words}, {-(-p.width // 32) * 4});")
        else:
            zero.append(f"    top->{p.cname} = 0;")
            assign.append(f"            if (in{k}) top->{p.cname} = in{k}[t];")
    for k, p in enumerate(outs):
        t = ctype[p.dtype.itemsize]
        decl.append(f"    {t}* out{k} = out_off[{k}] < 0 ? nullptr : "
                    f"reinterpret_cast<{t}*>(out_base + out_off[{k}]);")
        if p.wide:
            capture.append(f"            if (out{k}) std::memcpy(out{k} + j * {p.words}, "
                           f"top->{p.cname}.data(), {-(-p.width // 32) * 4});")
        else:
            capture.append(f"            if (out{k}) out{k}[j] = top->{p.cname};")
    clk = CLOCK in names
    rst = RESET in names
    return _CXX_TEMPLATE.format(
        n_in=len(ins), n_out=len(outs),
        in_bytes=", ".join(str(p.itemsize) for p in ins) or "0",
        out_bytes=", ".join(str(p.itemsize) for p in outs) or "0",
        decl="\n".join(decl),
        zero="\n".join(zero),
        assign="\n".join(assign) or "            // no inputs",
        capture="\n".join(capture) or "            // no outputs",
        clk0=f"top->{CLOCK} = 0;" if clk else "",
        clk1=f"top->{CLOCK} = 1; top->eval();" if clk else "",
        rst1=f"top->{RESET} = 1;" if rst else "",
        rst0=f"top->{RESET} = 0;" if rst else "",
    )


def cpp_template(name: str) -> str:
    """Return the C++ loop template ``sim/cpp/<name>`` (package data of ``qaccel.sim``)
    without its notes (the lines down to the one starting ``// ---- end of template notes``):
    the text that is filled in and hashed into the build key."""
    text = (importlib.resources.files(__package__) / "cpp" / name).read_text(encoding="utf-8")
    _, marker, body = text.partition(_NOTES_END)
    if not marker:
        raise RuntimeError(f"the C++ template {name} has no line {_NOTES_END!r}")
    return body.partition("\n")[2]


_CXX_TEMPLATE = cpp_template("vector_loop.cpp")


def _verilator_version() -> str:
    try:
        return importlib.metadata.version("verilator")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def as_column(port: Port, value, n: int | None) -> np.ndarray:
    """Return ``value`` as the file column of input ``port`` (checked, masked, broadcast to
    ``n``); :exc:`ValueError` / :exc:`TypeError` name the port if it does not fit."""
    what = f"input {port.name!r} ({port.width} bits)"
    if isinstance(value, (int, np.integer, np.bool_)):
        v = int(value)
        if not -(1 << (port.width - 1)) <= v < (1 << port.width):
            raise ValueError(f"{what} cannot hold {v}")
        v &= (1 << port.width) - 1
        if port.wide:
            words = [(v >> (64 * k)) & ((1 << 64) - 1) for k in range(port.words)]
            return np.broadcast_to(np.array(words, dtype=np.uint64), (n, port.words))
        return np.full(n, v, dtype=port.dtype)
    a = np.asarray(value)
    if a.dtype == np.bool_:
        a = a.astype(np.uint8)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{what} must be an integer array (bit patterns), not {a.dtype} "
                        "(view floats as unsigned integers first)")
    if port.wide:
        if a.ndim != 2 or a.shape[1] != port.words or a.dtype != np.uint64:
            raise ValueError(f"{what} must be a uint64 array of shape (n, {port.words}), "
                             f"not {a.dtype} {a.shape}")
        top = port.width - 64 * (port.words - 1)
        if top < 64 and a.size and int(a[:, -1].max()) >> top:
            raise ValueError(f"{what} has bits set above bit {port.width - 1}")
        return a
    if a.ndim != 1:
        raise ValueError(f"{what} must be a 1-D array or an integer, not shape {a.shape}")
    if a.size:
        lo, hi = int(a.min()), int(a.max())
        if lo < -(1 << (port.width - 1)) or hi >= (1 << port.width):
            raise ValueError(f"{what} has values outside [{-(1 << (port.width - 1))}, "
                             f"{(1 << port.width) - 1}]: min {lo}, max {hi}")
    col = a.astype(port.dtype, copy=False)
    if port.width < 8 * port.dtype.itemsize and a.dtype.kind == "i":
        col = col & port.dtype.type((1 << port.width) - 1)
    return col


class VectorSim:
    """A Verilator build of ``component`` that streams NumPy vectors through it.

    Building happens on construction (or a finished build is reused); :meth:`run` then costs
    only file I/O and simulation. See the module docstring for the cycle contract.

    Parameters
    ----------
    component : :class:`amaranth.lib.wiring.Component`
        The design; its ports should be plain signals (no handshake is driven).
    name : :class:`str` or None
        Verilog module name and build directory prefix; defaults to the class name in
        lower case.
    verbose : :class:`bool` or None
        Stream build output to stdout instead of ``build.log`` (default:
        ``$QACCEL_SIM_VERBOSE``).

    Raises
    ------
    :exc:`TypeError`
        If ``component`` is not a wiring.Component.
    :exc:`ValueError`
        If ``name`` is not a Verilog identifier.
    :exc:`~qaccel.sim.runner.SimulatorNotFoundError`
        If Verilator or a C++ toolchain is missing.
    :exc:`~qaccel.sim.runner.BuildError`
        If Verilator or the C++ compiler fails;
        :exc:`~qaccel.sim.runner.BuildRootError` if a build is needed and the build root
        cannot be written.
    """

    def __init__(self, component: wiring.Component, *, name: str | None = None,
                 verbose: bool | None = None, design_key: str | None = None):
        if not isinstance(component, wiring.Component):
            raise TypeError(f"component must be an amaranth wiring.Component, not {component!r}")
        if name is None:
            name = type(component).__name__.lower()
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"name must be a Verilog identifier, not {name!r}")
        require_simulator("verilator")
        self._name = name
        self._verbose = verbose
        self.last_run: RunStats | None = None
        start = time.perf_counter()
        build_params = {
            "toplevel": name,
            "verilator_args": VERILATOR_ARGS,
            "make_args": MAKE_ARGS,
            "template": self._loop_template,
            "loop_version": self._loop_version,
            "max_width": MAX_WIDTH,
            "verilator": _verilator_version(),
        }
        # With a design key (a hash of whatever determines the Verilog), a finished build is
        # found through <build root>/index/ without emitting the Verilog (seconds for a big
        # design).
        root = build_root()
        self._writable = root_writable(root)
        index = None
        if design_key is not None:
            index = root / "index" / (
                f"{name}-{self._kind}-{digest({'design': design_key, **build_params})[:16]}.json")
            if self._reuse_indexed(index):
                mark_elaborated(component)
                self._built = False
                self._build_time = time.perf_counter() - start
                return
        if not self._writable and not _has_builds(root, f"{name}-{self._kind}-", _STAMP):
            raise _unwritable_root(root, f"the Verilator {self._kind} loop of {name} has to be "
                                   "built")
        if index is not None and sys.stderr.isatty() and not verbose_enabled(verbose):
            # A big design takes seconds to emit before its build can be looked up or begin.
            _notice(f"emitting the Verilog of {name} to find or make its {self._kind} build "
                    "(first use of this configuration here)")
        text = clean_verilog(component, name)
        self._key = digest({"verilog": text, **build_params})
        self._dir = root / f"{name}-{self._kind}-{self._key[:12]}"
        self._built = self._build(text)
        if index is not None and self._writable:
            write_atomic(index, json.dumps({"key": self._key}))
        self._build_time = time.perf_counter() - start

    def _reuse_indexed(self, index: Path) -> bool:
        """Take the finished build that ``index`` names, if there is one."""
        try:
            self._key = json.loads(index.read_text())["key"]
        except (OSError, ValueError, KeyError, TypeError):
            return False
        self._dir = build_root() / f"{self._name}-{self._kind}-{self._key[:12]}"
        if not (self._dir / _STAMP).is_file():
            return False
        with build_lock(self._dir) as locked:
            return self._reuse(locked)[0]

    # -- build ---------------------------------------------------------------------------------
    # Subclasses with another C++ loop (qaccel.sim.streamsim.StreamSim) override these five.

    #: Build directory kind: ``<build root>/<name>-<kind>-<hash>``.
    _kind = "vectors"
    #: C++ source file name of the loop.
    _loop_file = "vectors_main.cpp"
    #: The loop's template text (``sim/cpp/vector_loop.cpp`` without its notes; part of the
    #: build key, so an edited template is never served by a stale build).
    _loop_template = _CXX_TEMPLATE
    #: Version of the Python that fills the template (part of the build key).
    _loop_version = _LOOP_VERSION

    def _loop_source(self, ports: Sequence[Port]) -> str:
        """Return the C++ loop for ``ports``."""
        return _cxx_main(ports)

    def _outputs(self) -> list[str]:
        """The files (relative to the build dir) a reuse depends on."""
        return [f"obj_dir/{EXE}", f"{self._name}.v"]

    def _reuse(self, writable: bool) -> tuple[bool, str | None]:
        """Take the finished build in the build dir if its stamp matches and its outputs
        verify; return (taken, what is wrong with the outputs or None)."""
        info, problem = reuse_state(self._dir, self._dir / _STAMP, self._key, self._outputs(),
                                    writable)
        if info is None:
            return False, problem
        try:
            self._ports = {p["name"]: Port(**p) for p in info["ports"]}
            self._loop_in = [self._ports[name] for name in info["loop_inputs"]]
            self._loop_out = [self._ports[name] for name in info["loop_outputs"]]
        except (KeyError, TypeError):
            return False, None
        return True, None

    def _verilate(self, args: Sequence[str], log, progress: BuildProgress) -> None:
        cmd = ["verilator", "--cc", *VERILATOR_ARGS, "--prefix", "Vdut",
               "--top-module", self._name, "--Mdir", "obj_dir", *args, f"{self._name}.v"]
        code = run_tool(cmd, cwd=self._dir, env=simulator_env("verilator"), out=log,
                        on_line=progress.line)
        if code != 0:
            log_path = None if log is None else Path(log.name)
            if log is not None:
                log.flush()
            raise BuildError(f"Verilator failed ({' '.join(cmd)}, exit {code}) "
                             f"in {self._dir}{log_tail(log_path)}")

    def _build(self, text: str) -> bool:
        start = time.perf_counter()
        with build_lock(self._dir) as locked:
            taken, problem = self._reuse(locked)
            if taken:
                return False
            what = f"the Verilator {self._kind} loop of {self._name}"
            if not locked:
                raise _unwritable_root(self._dir.parent, f"{what} has to be built "
                                       f"({problem or f'no finished build in {self._dir}'})")
            if problem is not None:
                _notice(f"rebuilding {self._dir.name}: {problem}")
            stamp = self._dir / _STAMP
            stamp.unlink(missing_ok=True)
            _clear_build_dir(self._dir)
            (self._dir / f"{self._name}.v").write_text(text)
            verbose = verbose_enabled(self._verbose)
            usually = usual_duration(self._dir.parent, f"{self._name}-{self._kind}-", _STAMP,
                                     len(text), 40.0, 4.0)
            reason = ("its outputs were damaged" if problem is not None
                      else "first use of this configuration")
            progress = BuildProgress(what, self._dir, usually=usually, reason=reason,
                                     verbose=verbose)
            with progress, open(self._dir / "build.log", "w") as log_file:
                log = None if verbose else log_file
                # Pass 1 produces Vdut.h, whose port list (exact widths and C++ names) the loop
                # is generated from; pass 2 builds the loop and the model.
                progress.step("verilating")
                self._verilate([], log, progress)
                header = (self._dir / "obj_dir" / "Vdut.h").read_text()
                ports = _parse_header(header)
                if not ports:
                    raise BuildError(f"no ports found in {self._dir / 'obj_dir' / 'Vdut.h'} "
                                     "(has Verilator's header format changed?)")
                self._ports = {p.name: p for p in ports}
                self._loop_in, self._loop_out = loop_ports(ports)
                (self._dir / self._loop_file).write_text(self._loop_source(ports))
                make = [a for arg in MAKE_ARGS for a in ("-MAKEFLAGS", arg)]
                progress.step("verilating and compiling C++")
                self._verilate(["--exe", "--build", "-j", str(BUILD_JOBS), "-o", EXE, *make,
                                self._loop_file], log, progress)
                if not (self._dir / "obj_dir" / EXE).is_file():
                    raise BuildError(f"the Verilator build in {self._dir} produced no {EXE}"
                                     f"{log_tail(self._dir / 'build.log')}")
            write_stamp(stamp, {
                "key": self._key, "seconds": round(time.perf_counter() - start, 3),
                "files": fingerprint(self._dir, self._outputs()),
                "ports": [asdict(p) for p in ports],
                "loop_inputs": [p.name for p in self._loop_in],
                "loop_outputs": [p.name for p in self._loop_out]})
            return True

    # -- properties ----------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """Verilog module name."""
        return self._name

    @property
    def build_dir(self) -> Path:
        """Folder of this build (``<build root>/<name>-vectors-<hash>``)."""
        return self._dir

    @property
    def built(self) -> bool:
        """Whether constructing this object compiled the model (False: reused a build)."""
        return self._built

    @property
    def build_time(self) -> float:
        """Seconds spent constructing this object (Verilog emission and build or reuse)."""
        return self._build_time

    @property
    def ports(self) -> Mapping[str, Port]:
        """Every top-level port by Verilog name, ``clk``/``rst`` included."""
        return dict(self._ports)

    @property
    def inputs(self) -> tuple[str, ...]:
        """Names of the input ports a vector can drive (``clk`` and ``rst`` excluded)."""
        return tuple(p.name for p in self._loop_in)

    @property
    def outputs(self) -> tuple[str, ...]:
        """Names of the output ports."""
        return tuple(p.name for p in self._loop_out)

    @property
    def has_clock(self) -> bool:
        """Whether the design has a ``clk`` input (a ``sync`` domain)."""
        return CLOCK in self._ports

    def _port(self, name, direction: str) -> Port:
        if not isinstance(name, str):
            raise TypeError(f"{direction} port names must be strings, not {name!r}")
        port = self._ports.get(name)
        if port is None or port.direction != direction:
            if direction == "input":
                choices = [p for p in self._ports.values() if p.direction == "input"
                           and p.name not in (CLOCK, RESET)]
            else:
                choices = [p for p in self._ports.values() if p.direction == "output"]
            listed = ", ".join(f"{p.name} ({p.width} bits)" for p in choices) or "none"
            raise ValueError(f"{self._name} has no {direction} port {name!r}; its "
                             f"{direction}s are: {listed}")
        if direction == "input" and name in (CLOCK, RESET):
            raise ValueError(f"input port {name!r} is driven by the vector loop, not by vectors")
        if port.width > MAX_WIDTH or port not in (self._loop_in + self._loop_out):
            raise ValueError(f"{direction} port {name!r} is {port.width} bits wide; the "
                             f"vector loop supports ports up to {MAX_WIDTH} bits")
        return port

    # -- run -----------------------------------------------------------------------------------

    def run(self, inputs: Mapping[str, object], *, latency: int,
            outputs: Iterable[str] | None = None,
            reset_cycles: int = RESET_CYCLES) -> dict[str, np.ndarray]:
        """Apply one vector per clock cycle and return the outputs, vector by vector.

        ``inputs`` maps input port names to 1-D integer arrays of one common length ``n``
        (2-D ``uint64`` word arrays for ports wider than 64 bits) or to integers held
        constant. ``outputs`` names the ports to return (default: all). Output ``k`` is
        sampled ``latency`` cycles after vector ``k`` was applied.

        Raises :exc:`ValueError` for unknown ports, ports wider than :data:`MAX_WIDTH`,
        out-of-range values, mismatched lengths and a ``latency`` above 0 on a design
        without a clock; :exc:`TypeError` for non-integer data; and
        :exc:`~qaccel.sim.runner.SimulationError` if the loop process fails.
        """
        start = time.perf_counter()
        latency = check_int("latency", latency, 0, 1 << 20)
        reset_cycles = check_int("reset_cycles", reset_cycles, 0, 1 << 20)
        if latency and not self.has_clock:
            raise ValueError(f"latency must be 0 for {self._name}, which has no clock, "
                             f"not {latency}")
        if not isinstance(inputs, Mapping):
            raise TypeError(f"inputs must be a mapping of port names to arrays, not {inputs!r}")
        in_ports = {name: self._port(name, "input") for name in inputs}
        if outputs is None:
            out_ports = list(self._loop_out)
        else:
            if isinstance(outputs, str):
                raise TypeError(f"outputs must be an iterable of port names, not {outputs!r}")
            out_ports = [self._port(name, "output") for name in outputs]
        lengths = {name: len(v) for name, v in inputs.items() if np.ndim(v) > 0}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"input arrays must have one length, not {lengths}")
        if not lengths:
            raise ValueError("at least one input must be an array (it sets the vector count)")
        n = next(iter(lengths.values()))
        columns = {name: as_column(in_ports[name], v, n) for name, v in inputs.items()}

        tmp = run_dir(self._dir, f"{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            in_path, out_path = tmp / "in.bin", tmp / "out.bin"
            in_off = []
            offset = 0
            with open(in_path, "wb") as f:
                for name in (p.name for p in self._loop_in):
                    if name in columns:
                        in_off.append(offset)
                        col = np.ascontiguousarray(columns[name])
                        col.tofile(f)
                        offset += col.nbytes
                    else:
                        in_off.append(-1)
            wanted = {p.name for p in out_ports}
            out_off: dict[str, int] = {}
            offsets = []
            offset = 0
            for p in self._loop_out:
                if p.name in wanted:
                    out_off[p.name] = offset
                    offsets.append(offset)
                    offset += n * p.itemsize
                else:
                    offsets.append(-1)
            cmd = [str(self._dir / "obj_dir" / EXE), str(in_path), str(out_path), str(n),
                   str(latency), str(reset_cycles), ",".join(map(str, in_off)) or "-1",
                   ",".join(map(str, offsets)) or "-1", str(offset)]
            sim_start = time.perf_counter()
            res = subprocess.run(cmd, capture_output=True, text=True, check=False)
            sim_time = time.perf_counter() - sim_start
            if res.returncode != 0:
                raise SimulationError(
                    crash_message(f"the vector loop of {self._name}", res.returncode,
                                  self._dir / "obj_dir" / EXE, self._dir)
                    + f": {res.stderr.strip()}")
            result = {}
            for p in out_ports:
                count = n * p.words
                a = np.fromfile(out_path, dtype=p.dtype, count=count, offset=out_off[p.name])
                result[p.name] = a.reshape(n, p.words) if p.wide else a
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self.last_run = RunStats(n, reset_cycles + n + latency, time.perf_counter() - start,
                                 sim_time)
        return result


def run_vectors(component: wiring.Component, inputs: Mapping[str, object], *, latency: int,
                outputs: Iterable[str] | None = None, name: str | None = None,
                reset_cycles: int = RESET_CYCLES,
                verbose: bool | None = None) -> dict[str, np.ndarray]:
    """Build ``component`` (or reuse its build) and run ``inputs`` through it.

    Shorthand for ``VectorSim(component, name=name).run(inputs, latency=latency, ...)``;
    keep a :class:`VectorSim` to run several batches without emitting the Verilog again.
    """
    sim = VectorSim(component, name=name, verbose=verbose)
    return sim.run(inputs, latency=latency, outputs=outputs, reset_cycles=reset_cycles)


class ComponentBank(wiring.Component):
    """Several components side by side in one module, so that one Verilator build serves many
    test cases.

    Member ``name`` of the unit at key ``key`` becomes the port ``<name>_<key>`` (flattened
    further by the Verilog emission, e.g. ``i_<key>``). Every unit's members must be plain
    ``In``/``Out`` ports (no nested signatures); a ``sync`` domain is shared.
    """

    def __init__(self, units: Mapping[str, wiring.Component]):
        self.units = dict(units)
        members = {}
        for key, unit in self.units.items():
            for name, member in unit.signature.members.items():
                if not member.is_port:
                    raise TypeError(f"units[{key!r}].{name} must be a port, not {member!r}")
                members[f"{name}_{key}"] = (In if member.flow == wiring.In else Out)(
                    member.shape)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        for key, unit in self.units.items():
            m.submodules[key] = unit
            for name, member in unit.signature.members.items():
                port, inner = getattr(self, f"{name}_{key}"), getattr(unit, name)
                m.d.comb += (inner.eq(port) if member.flow == wiring.In else port.eq(inner))
        return m


# ---------------------------------------------------------------------------------------------
# Struct layouts


def _layout(layout) -> data.Layout:
    try:
        return data.Layout.cast(layout)
    except TypeError:
        raise TypeError(f"layout must be an amaranth data layout, not {layout!r}") from None


def _words(size: int) -> int:
    return -(-size // 64)


def split_fields(bits, layout) -> dict[str, np.ndarray]:
    """Return the fields of ``layout`` from an array of its bit patterns.

    ``bits`` is 1-D for layouts of at most 64 bits, else a ``(n, ceil(size / 64))`` word
    array as :meth:`VectorSim.run` returns it. Signed fields come back as ``int64``, the
    others as ``uint64``; nested layouts and enums come back as their raw bits. Fields wider
    than 64 bits are not supported.
    """
    lay = _layout(layout)
    v = np.asarray(bits)
    if lay.size > 64:
        if v.ndim != 2 or v.shape[1] != _words(lay.size):
            raise ValueError(f"bits of a {lay.size}-bit layout must have shape "
                             f"(n, {_words(lay.size)}), not {v.shape}")
        words = v.astype(np.uint64)
    else:
        words = v.astype(np.uint64)[..., np.newaxis]
    out = {}
    for name, field in lay:
        if field.width > 64:
            raise ValueError(f"field {name!r} is {field.width} bits wide; split_fields "
                             "supports fields up to 64 bits")
        lo, sh = divmod(field.offset, 64)
        f = words[..., lo] >> np.uint64(sh)
        if sh and sh + field.width > 64:
            f = f | (words[..., lo + 1] << np.uint64(64 - sh))
        if field.width < 64:
            f = f & np.uint64((1 << field.width) - 1)
        if Shape.cast(field.shape).signed and field.width:
            top = (f >> np.uint64(field.width - 1)).astype(bool)
            f = f.astype(np.int64)
            if field.width < 64:
                f = np.where(top, f - (1 << field.width), f)
        out[name] = f
    return out


def join_fields(fields: Mapping[str, object], layout) -> np.ndarray:
    """Return the bit patterns of ``layout`` with the given field values.

    The result is ``uint64``, 1-D for layouts of at most 64 bits, else ``(n, words)`` as
    :meth:`VectorSim.run` takes it. Missing fields are 0; values (integers, signed or not)
    are truncated to their field's width. Fields wider than 64 bits are not supported.
    """
    lay = _layout(layout)
    names = {name for name, _ in lay}
    unknown = sorted(set(fields) - names)
    if unknown:
        raise ValueError(f"layout has no field {unknown[0]!r}; its fields are "
                         f"{', '.join(sorted(names))}")
    values = {}
    for name, value in fields.items():
        if isinstance(value, py_enum.Enum):
            value = value.value
        a = np.asarray(value)
        if a.dtype.kind not in "iub":
            raise TypeError(f"field {name!r} must hold integers, not {a.dtype}")
        values[name] = a.astype(np.int64) if a.dtype.kind in "ib" else a.astype(np.uint64)
    shape = np.broadcast_shapes(*(a.shape for a in values.values())) if values else ()
    out = np.zeros((*shape, _words(lay.size)), dtype=np.uint64)
    for name, a in values.items():
        field = lay[name]
        if field.width > 64:
            raise ValueError(f"field {name!r} is {field.width} bits wide; join_fields "
                             "supports fields up to 64 bits")
        f = np.broadcast_to(a.astype(np.uint64), shape)
        if field.width < 64:
            f = f & np.uint64((1 << field.width) - 1)
        lo, sh = divmod(field.offset, 64)
        out[..., lo] |= f << np.uint64(sh)
        if sh and sh + field.width > 64:
            out[..., lo + 1] |= f >> np.uint64(64 - sh)
    return out if lay.size > 64 else out[..., 0]
