"""Every ``qaccel`` error is one line on stderr, ``qaccel <command>: <message>``, with exit
status 2 (usage) or 1 (failure), never a traceback (issue 19, point 1).

(a) the cases a probe found, one by one; (b) generated cases: every option of every
subcommand that takes a value, fed bad values. The expensive back ends (RTL simulation,
synthesis, bitstreams, Verilog, sweep points, benchmarks, the demo, plots) are replaced by
fakes raising :class:`Reached`, so a value that gets past validation is caught, not run;
only the values :func:`may_pass` lists may get there.

``python -m pytest -p no:cacheprovider -q tests/qaccel/app/test_cli_errors.py -n 0 -s -k
generated`` prints the table: ``argv -> exit status, message``.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

import pytest

from qaccel.app import cli

#: An error line: the command's words, then the message.
LINE = re.compile(r"qaccel(?: [a-z][a-z-]*){0,2}: \S.*")


class Reached(BaseException):
    """Raised by the fake back ends: the command got past validation to ``args[0]``.
    A BaseException, so that main's handling of unexpected exceptions cannot absorb it."""


#: Back ends the fakes replace: (module, attribute).
BACKENDS = [
    ("qaccel.engine.facade", "RTL._unit"),                 # Q / DQ / DirectML: build, simulate
    ("qaccel.engine.facade", "RTL._matmul_nbits_v2"),      # MatMulNBits: build, simulate
    ("qaccel.eda.hwreport", "hw_report"),                  # synth
    ("qaccel.eda.hwreport", "mac_packing"),                # synth --packing
    ("qaccel.eda.bitstream", "build_bitstream"),           # bitstream
    ("qaccel.eda.emit", "write_verilog"),                  # verilog
    ("qaccel.explore.sweep", "_pool"),                     # sweep: the points' workers
    ("qaccel.explore.plots", "write_report"),              # report: matplotlib
    ("qaccel.app.bench", "golden_cases"),                  # bench golden
    ("qaccel.app.bench", "thread_scaling"),                # bench threads
    ("qaccel.app.bench_rtl", "verify_throughput"),         # bench verify: Python-checked
    ("qaccel.app.bench_rtl", "checked_throughput"),        # bench verify: checked in C++
    ("qaccel.app.demo", "main"),                           # demo
]


def _fake(name: str):
    def fake(*args, **kwargs):
        raise Reached(name)
    return fake


@pytest.fixture
def backends(monkeypatch, tmp_path):
    """Fake back ends, the working directory in ``tmp_path``, no progress bars."""
    import importlib

    for module, attr in BACKENDS:
        owner = importlib.import_module(module)
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        monkeypatch.setattr(owner, name, _fake(f"{module}.{attr}"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TQDM_DISABLE", "1")
    monkeypatch.delenv("QACCEL_DEBUG", raising=False)


def run(argv: list[str], capsys) -> tuple[int | str, str]:
    """``(status, stderr)`` of ``cli.main(argv)``; status ``"reached <back end>"`` if a fake
    back end was called."""
    try:
        status = cli.main(argv)
    except SystemExit as e:
        status = e.code
    except Reached as e:
        status = f"reached {e.args[0]}"
    return status, capsys.readouterr().err


def check_error(status, err: str, label: str, *, code: int | None = None) -> str:
    """Assert that ``err`` is one error line of ``label`` and ``status`` an error status;
    return the message."""
    assert "Traceback" not in err, err
    assert status in ((1, 2) if code is None else (code,)), (status, err)
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert LINE.fullmatch(lines[0]) and lines[0].startswith(f"{label}: "), lines[0]
    assert lines[0].isprintable(), lines[0]           # control characters escaped
    return lines[0][len(label) + 2:]


# ---------------------------------------------------------------------------------------------
# (a) the probe's cases


@pytest.fixture
def files(tmp_path):
    """A binary file, a file with bad JSON, a missing file."""
    binary, bad = tmp_path / "binary.bin", tmp_path / "bad.json"
    binary.write_bytes(bytes(range(256)) * 4)
    bad.write_text("{not json")
    return {"BINARY": str(binary), "BAD": str(bad), "MISSING": str(tmp_path / "missing.json")}


#: (argv, exit status, a piece of the message that names the value); file names as in
#: ``files``.
PROBE = [
    (["sim", "quantize", "--dtype", "float64"], 2, "--dtype must be one of float32"),
    (["sim", "quantize", "--output-dtype", "float32"], 2, "not 'float32'"),
    (["sim", "quantize", "--axis", "1", "--block-size", "-4"], 2, "--block-size must be >= 0"),
    (["sim", "quantize", "--shape", "1000000,1000000"], 2,
     "1,000,000,000,000 elements, above the limit of 16,777,216 ('1000000,1000000')"),
    (["sim", "matmul-nbits", "--K", "1000000000000"], 2,
     "A would have 1,000,000,000,000 elements"),
    (["sim", "dml", "--shape", "1,1,1,1,1,1,1,1,1"], 2, "--shape has 9 dimensions"),
    (["sim", "dequantize", "--dtype", "float32"], 2, "not 'float32'"),
    (["verilog", "-o", "/dev/null/x"], 2, "-o /dev/null/x: /dev/null is a file, not a folder"),
    (["verilog", "-o", "out", "--config", "BAD"], 2, "--config BAD: not JSON"),
    (["verilog", "-o", "out", "--config", '{"lanes": -1}'], 2,
     "--config {\"lanes\": -1}: No such file or directory (--config takes the name of a JSON "
     "file, not the JSON itself)"),
    (["bench", "golden", "--repeat", "0"], 2, "argument --repeat: expected an integer >= 1, "
                                              "not '0'"),
    (["bench", "golden", "--repeat", "-1"], 2, "not '-1'"),
    (["sim", "quantize", "--shape", "4,8", "--axis", "7"], 2,
     "--axis must be in [-2, 1] for a shape of 2 dimensions, not 7"),
    (["perf", "--bits", "8..2"], 2, "a range runs upwards, like 2..8, not 8..2"),
    (["sweep", "-o", "out", "--freq", "-100"], 2, "argument --freq: expected a number > 0, "
                                                  "not '-100'"),
    (["sim", "quantize", "--shape", "-1,4"], 2, "a shape needs one or more sizes >= 0, "
                                                "not '-1,4'"),
    (["sim", "matmul-nbits", "--K", "-5"], 2, "argument --K: expected an integer >= 1, "
                                              "not '-5'"),
    (["sim", "matmul-nbits", "--M", "0"], 2, "argument --M: expected an integer >= 1, not '0'"),
    (["perf", "--block-size", "1048576"], 2, "--block-size 1048576 is above the engine's "
                                             "max_block_size 256"),
    (["verilog", "-o", "out", "--config", "BINARY"], 2,
     "--config BINARY: not a text file (an AccelConfig JSON file is UTF-8 text)"),
    (["verilog", "-o", "out", "--config", "MISSING"], 2,
     "--config MISSING: No such file or directory"),
    (["frobnicate"], 2, "invalid choice: 'frobnicate'"),
    (["sim", "quantize", "--shape"], 2, "argument --shape: expected one argument"),
    (["sim", "quantize", "--K", "64"], 2, "--K does not apply to sim quantize (--K 64)"),
    (["sim", "matmul-nbits", "--axis", "0"], 2, "--axis does not apply to sim matmul-nbits"),
    (["sim", "quantize", "--block-size", "32"], 2, "--block-size 32 needs --axis"),
    (["sim", "quantize", "--idle", "1"], 2, "expected a probability in [0, 1), not '1'"),
    (["sim", "quantize", "--seed", "-1"], 2, "seed must be in [0, 18446744073709551615], "
                                             "not -1"),
    (["sim", "matmul-nbits", "--K", "8192"], 2, "--K 8192 is above the engine's max_k 4096"),
    (["synth", "--seed", "-1"], 2, "seed must be in [0, 2147483647], not -1"),
    (["synth", "--freq", "1e300"], 2, "at most 1000 MHz, not '1e300'"),
    (["perf", "--M", "1000000000000"], 2, "expected at most 65536 rows, not '1000000000000'"),
    (["sweep", "-o", "out", "--jobs", "0"], 2, "--jobs must be in [1, 256], not 0"),
    (["sweep", "-o", "out", "--pe", "1..99999"], 2, "more than 4096 values ('1..99999')"),
    (["sim", "quantize", "--shape", "1,,2"], 2, "not '1,,2'"),
    (["report", "MISSING"], 2, "holds no sweep results"),
]


@pytest.mark.parametrize(("argv", "status", "message"), PROBE,
                         ids=[" ".join(case[0]) for case in PROBE])
def test_probe_case_is_one_line(argv, status, message, files, backends, capsys):
    argv = [files.get(a, a) for a in argv]
    got, err = run(argv, capsys)
    label = cli._label(argv)
    text = check_error(got, err, label, code=status)
    for name, path in files.items():
        message = message.replace(name, path)
    assert message in text


def test_error_line_is_the_exit_text(capsys):
    """What ``main`` raises is a SystemExit whose ``code`` is the status and whose text is the
    printed line (so ``pytest.raises(SystemExit, match=...)`` matches the message)."""
    with pytest.raises(cli.CommandExit) as e:
        cli.main(["perf", "--K", "0"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and str(e.value) == err.rstrip("\n")
    assert err == "qaccel perf: argument --K: expected an integer >= 1, not '0'\n"


def test_quantize_output_defaults_to_uint8(backends, monkeypatch, capsys):
    """The CLI's QuantizeLinear output type is ONNX's default, uint8; --help says so."""
    import qaccel.engine

    seen, real = [], qaccel.engine.example_call

    def spy(op, shape, **kwargs):
        seen.append(kwargs["output_dtype"])
        return real(op, shape, **kwargs)

    monkeypatch.setattr(qaccel.engine, "example_call", spy)
    for op in ("quantize", "dml", "dequantize"):
        status, _ = run(["sim", op, "--shape", "4,8"], capsys)
        assert status == "reached qaccel.engine.facade.RTL._unit"
    assert seen == ["uint8", None, None]
    with pytest.raises(SystemExit):
        cli.main(["sim", "--help"])
    assert "quantize uint8, ONNX's default" in capsys.readouterr().out


def _raiser(error: BaseException):
    def fake(*args, **kwargs):
        raise error
    return fake


def _runner_errors():
    from qaccel.sim import runner

    return [runner.BuildError("verilator: cannot compile\nsecond line"),
            runner.SimulationError("the stream harness stalled"),
            runner.SimulationFailed("1 test failed"),
            runner.SimulatorNotFoundError("verilator is not installed")]


@pytest.mark.parametrize("error", _runner_errors(), ids=lambda e: type(e).__name__)
def test_simulator_failure_is_status_1(error, backends, monkeypatch, capsys):
    from qaccel.engine.facade import RTL

    monkeypatch.setattr(RTL, "_unit", _raiser(error))
    status, err = run(["sim", "quantize", "--shape", "4,8"], capsys)
    text = check_error(status, err, "qaccel sim quantize", code=1)
    assert text.startswith(f"{type(error).__name__}: {str(error).splitlines()[0]}")


@pytest.mark.parametrize(("error", "status", "message"), [
    (MemoryError("Unable to allocate 7.28 TiB for an array with shape (1000000, 1000000)"), 1,
     "out of memory: Unable to allocate 7.28 TiB"),
    (PermissionError(13, "Permission denied", "out/qaccel_quantize.v"), 1,
     "Permission denied (out/qaccel_quantize.v)"),
    (ValueError("lanes must be in [1, 64], not 99"), 2, "lanes must be in [1, 64], not 99"),
    (KeyboardInterrupt(), 130, "interrupted"),
    (KeyError("float32"), 1, "internal error: KeyError: 'float32' (set QACCEL_DEBUG=1 for the "
                             "traceback)"),
], ids=["MemoryError", "OSError", "ValueError", "KeyboardInterrupt", "bug"])
def test_exception_of_a_command_is_one_line(error, status, message, backends, monkeypatch,
                                            capsys):
    import qaccel.eda.emit

    monkeypatch.setattr(qaccel.eda.emit, "write_verilog", _raiser(error))
    got, err = run(["verilog", "-o", "out"], capsys)
    assert check_error(got, err, "qaccel verilog", code=status).startswith(message)


def test_qaccel_debug_shows_the_traceback(backends, monkeypatch, capsys):
    import qaccel.eda.emit

    monkeypatch.setattr(qaccel.eda.emit, "write_verilog", _raiser(KeyError("float32")))
    monkeypatch.setenv("QACCEL_DEBUG", "1")
    status, err = run(["verilog", "-o", "out"], capsys)
    assert status == 1 and err.startswith("Traceback (most recent call last):")
    assert err.splitlines()[-1] == ("qaccel verilog: internal error: KeyError: 'float32' (set "
                                    "QACCEL_DEBUG=1 for the traceback)")


def test_entry_point_exit_status(tmp_path):
    """The installed command (``python -m qaccel``): the line on stderr, status 2, nothing
    else."""
    proc = subprocess.run([sys.executable, "-m", "qaccel", "sim", "quantize", "--shape", "4,8",
                           "--axis", "7"], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == ("qaccel sim quantize: --axis must be in [-2, 1] for a shape of 2 "
                           "dimensions, not 7\n")


# ---------------------------------------------------------------------------------------------
# (b) generated cases

#: Bad values for every option; BINARY, MISSING and FOLDER become paths (``paths``).
VALUES = ["", "abc", "-1", "0", "nan", "inf", "-inf", "1e300", "1.5", "99999999999999999999",
          "1000000000000", "1,,2", "8..2", "1,1,1,1,1,1,1,1,1", "\x00", "BINARY", "MISSING",
          "FOLDER"]

#: Per command: its words and what it needs besides the option under test (flag -> value).
COMMAND_LINES = {
    **{f"sim {op}": (["sim", op], {}) for op in cli.SIM_OPS},
    **{f"bench {suite}": (["bench", suite], {}) for suite in cli.BENCH_SUITES},
    "demo": (["demo"], {}),
    "perf": (["perf"], {}),
    "synth": (["synth"], {}),
    "bitstream": (["bitstream"], {"--board": "icebreaker"}),
    "sweep": (["sweep"], {"-o": "out"}),
    "report": (["report", "SWEEP"], {}),
    "verilog": (["verilog"], {"-o": "out"}),
}

#: Output folders: any name but an empty one, one with NUL, or a file's.
_NAMES = set(VALUES) - {"", "\x00", "BINARY"}
_INTEGERS = {"-1", "0", "99999999999999999999", "1000000000000"}

#: The generated values that are valid for an option (command, flag; command "*": every
#: command): they may reach the back end or run (exit status 0).
VALID = {
    ("*", "--seed"): {"0"},
    **{(command, "--seed"): {"0", "1000000000000"} for command in ("sim", "bench")},
    ("*", "-o"): _NAMES,
    # an empty tensor (nothing to simulate); 9 dimensions (ONNX's Q / DQ: any rank)
    ("sim", "--shape"): {"0", "1,1,1,1,1,1,1,1,1"},
    ("sim", "--axis"): {"-1", "0"},
    ("sim", "--block-size"): {"0"},
    ("sim", "--idle"): {"0"},
    ("sim", "--backpressure"): {"0"},
    ("sim", "--level"): {"0"},
    ("perf", "--level"): {"0"},
    ("*", "--freq"): {"1.5"},
    ("perf", "--N"): {"99999999999999999999", "1000000000000"},
    **{(command, "--memory-gbps"): {"1e300", "1.5", "99999999999999999999", "1000000000000"}
       for command in ("perf", "synth", "sweep")},
    ("perf", "--fmax"): {"1e300", "1.5", "99999999999999999999", "1000000000000"},
    # sweep's grid axes take any integers: a point the engine rejects fails alone
    **{("sweep", flag): _INTEGERS | {"1,1,1,1,1,1,1,1,1"}
       for flag in ("--pe", "--simd", "--dsp-pairs", "--m-tile", "--lanes", "--bits",
                    "--block-size")},
    ("sweep", "--scheduler"): set(VALUES) - {"", "\x00"},  # the fake pool stands for Dask
    ("bench verify", "--scheduler"): set(VALUES) - {"", "\x00"},  # a fake stands for Dask
}


def may_pass(command: str, flag: str, value: str) -> bool:
    """Whether ``value`` is valid for ``flag`` of ``command`` (see :data:`VALID`)."""
    word = command.split()[0]
    return any(value in VALID.get(key, ())
               for key in ((command, flag), (word, flag), ("*", flag)))


def _options(parser: argparse.ArgumentParser) -> list[tuple[str, bool]]:
    """``(flag or dest, positional)`` of each argument of ``parser`` that takes a value."""
    return [(a.option_strings[0] if a.option_strings else a.dest, not a.option_strings)
            for a in parser._actions
            if a.nargs != 0 and not isinstance(a, argparse._HelpAction)]


def _cases() -> list[tuple[str, str, bool]]:
    (sub,) = (a for a in cli.build_parser()._actions
              if isinstance(a, argparse._SubParsersAction))
    cases, seen = [], set()
    for command, (words, _) in COMMAND_LINES.items():
        for flag, positional in _options(sub.choices[words[0]]):
            if positional and (words[0], flag) in seen:     # sim's op, bench's suite: once
                continue
            seen.add((words[0], flag))
            cases.append((command, flag, positional))
    return cases


@pytest.fixture(scope="module")
def sweep_folder(tmp_path_factory):
    """A small real sweep's output (for ``report``)."""
    from qaccel.explore.sweep import run_sweep

    folder = tmp_path_factory.mktemp("sweep")
    run_sweep(folder, bits=[4], block_sizes=[32], progress=False)
    return str(folder)


@pytest.fixture
def paths(tmp_path, sweep_folder):
    binary = tmp_path / "binary.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    (tmp_path / "folder").mkdir()
    return {"BINARY": str(binary), "MISSING": str(tmp_path / "missing" / "x.json"),
            "FOLDER": str(tmp_path / "folder"), "SWEEP": sweep_folder}


def _argv(command: str, flag: str, positional: bool, value: str) -> list[str]:
    words, needs = COMMAND_LINES[command]
    if positional:              # the command's own word (sim's op, bench's suite, SWEEP)
        words = [words[0], value, *words[2:]]
    argv = [*words, *(token for f, v in needs.items() if f != flag for token in (f, v))]
    return argv if positional else [*argv, flag, value]


@pytest.mark.parametrize(("command", "flag", "positional"), _cases(),
                         ids=lambda v: v if isinstance(v, str) else None)
def test_generated_bad_values(command, flag, positional, paths, backends, capsys):
    """Every generated value of ``flag``: one error line with status 1 or 2, or (a valid
    value) a run that reaches the faked back end or succeeds. Prints ``argv -> status,
    message`` for each."""
    problems, table = [], []
    for raw in VALUES:
        value = paths.get(raw, raw)
        argv = [paths.get(a, a) for a in _argv(command, flag, positional, value)]
        status, err = run(argv, capsys)
        shown = f"qaccel {' '.join(map(repr, argv))}"
        if status == 0 or isinstance(status, str):
            table.append(f"{shown} -> {status}")
            if not may_pass(command, flag, raw):
                problems.append(f"{shown}: accepted ({status})")
            continue
        table.append(f"{shown} -> {status}, {err.strip()}")
        try:
            check_error(status, err, cli._label(argv))
        except AssertionError as e:
            problems.append(f"{shown}: {e}")
    with capsys.disabled():         # the table, shown with -s
        print("\n" + "\n".join(table))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(("words", "flag", "valid"), [
    (["cache", "clear"], "--older-than", {"0", "1.5", "1e300", "99999999999999999999",
                                          "1000000000000"}),
    (["cache", "info"], "--largest", {"0", "99999999999999999999", "1000000000000"}),
])
def test_cache_bad_values(words, flag, valid, paths, monkeypatch, tmp_path, capsys):
    """``qaccel cache``'s options, fed the generated values, on a build root of its own:
    one error line with status 2, or (a valid value) a run that succeeds."""
    monkeypatch.setenv("QACCEL_BUILD_DIR", str(tmp_path / "build"))
    (tmp_path / "build" / "quantize-verilator-0123456789ab").mkdir(parents=True)
    for raw in VALUES:
        status, err = run([*words, flag, paths.get(raw, raw)], capsys)
        if raw in valid:
            assert status == 0, (raw, err)
        else:
            message = check_error(status, err, "qaccel cache", code=2)
            assert flag in message, (raw, message)
