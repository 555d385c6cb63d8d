"""The ``qaccel`` parser itself: every subcommand's options and defaults (the table below was
taken from the command line before it declared shared options once), ``--help`` on every
subcommand, and the shared options' validation naming the option."""

from __future__ import annotations

import argparse

import pytest

from qaccel.app import cli

#: An option a subcommand cannot run without.
REQUIRED = "required"

#: The options of a MatMulNBits call (sim and perf) and their defaults.
NBITS_CALL = {"--K": 1024, "--N": 1024, "--M": 1, "--level": 4, "--zero-points": "packed",
              "--bias": False}

#: Per subcommand: each option (its option strings joined by "/", a positional's name) and
#: its default, or REQUIRED.
OPTIONS = {
    "demo": {
        "--quick": False,
    },
    "bench": {
        "suite": REQUIRED,
        "--quick": False,
        "--repeat": 9,
        "--seed": 0,
        "--shards": None,
        "--scheduler": None,
        "--checked-beats": 8_000_000,
        "--rounds": 3,
    },
    "sim": {
        "op": REQUIRED,
        "--shape": (64, 256),
        "--dtype": None,
        "--scale-dtype": None,
        "--output-dtype": None,
        "--axis": None,
        "--block-size": 0,
        "--precision": None,
        "--no-zero-point": False,
        "--simulator": "verilator",
        "--harness": "auto",
        "--config": None,
        "--preset": None,
        "--lanes": None,
        "--idle": 0.0,
        "--backpressure": 0.0,
        "--seed": 0,
        "--bits": 4,
        **NBITS_CALL,
    },
    "perf": {
        "--bits": [2, 3, 4, 5, 6, 7, 8],
        "--block-size": [16, 32, 64, 128, 256],
        **NBITS_CALL,
        "--fmax": 100.0,
        "--memory-gbps": 1.6,
        "--config": None,
        "--preset": None,
    },
    "synth": {
        "--target": None,
        "--config": None,
        "--preset": None,
        "--unit": "matmul_nbits",
        "--seed": 1,
        "--freq": None,
        "--router": "router1",
        "--slow-nets": False,
        "--layer": (4096, 4096),
        "--bits": None,
        "--block-size": None,
        "--memory-gbps": 1.6,
        "--packing": False,
    },
    "bitstream": {"--board": REQUIRED, "--top": "accel", "--ops": None, "--config": None,
                  "--preset": None, "-o/--output": None, "--seed": 1},
    "sweep": {
        "-o/--output": REQUIRED,
        "--unit": "matmul_nbits",
        "--target": ["ecp5-25k"],
        "--pe": None,
        "--simd": None,
        "--dsp-pairs": None,
        "--m-tile": None,
        "--lanes": None,
        "--bits": [2, 3, 4, 5, 6, 7, 8],
        "--block-size": [16, 32, 64, 128, 256],
        "--layer": (4096, 4096),
        "--M": 1,
        "--memory-gbps": 1.6,
        "--config": None,
        "--preset": None,
        "--synth": False,
        "--seed": 1,
        "--freq": None,
        "--router": "router1",
        "--jobs": 1,
        "--scheduler": None,
    },
    "report": {
        "sweep": REQUIRED,
        "-o/--output": None,
    },
    "verilog": {
        "--config": None,
        "--preset": None,
        "-o/--output": REQUIRED,
        "--ops": ["matmul_nbits", "quantize", "dequantize"],  # (model.config.UNITS)
    },
    "cache": {"cache_command": REQUIRED},
}

#: What each subcommand needs on its command line besides the option under test.
MINIMAL = {"demo": [], "bench": ["golden"], "sim": ["matmul-nbits"], "perf": [], "synth": [],
           "bitstream": ["--board", "icebreaker"], "sweep": ["-o", "out"], "report": ["out"],
           "verilog": ["-o", "out"], "cache": ["info"]}


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return action.choices


def _options(parser: argparse.ArgumentParser) -> dict[str, object]:
    """``parser``'s options as :data:`OPTIONS` lists them (``--help`` left out)."""
    return {"/".join(a.option_strings) or a.dest: REQUIRED if a.required else a.default
            for a in parser._actions if not isinstance(a, argparse._HelpAction)}


def test_every_subcommand_keeps_its_options_and_defaults():
    subparsers = _subparsers(cli.build_parser())
    assert list(subparsers) == list(OPTIONS)
    for name, parser in subparsers.items():
        assert _options(parser) == OPTIONS[name], name


def test_main_dispatches_to_the_subcommand(monkeypatch):
    """main(argv) returns what the subcommand's function returns for the parsed arguments."""
    parser, seen = cli.build_parser(), []
    _subparsers(parser)["perf"].set_defaults(func=lambda args: seen.append(args) or 7)
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    assert cli.main(["perf", "--K", "64"]) == 7
    assert seen[0].K == 64 and seen[0].command == "perf"


@pytest.mark.parametrize("argv", [[], *([name] for name in OPTIONS)],
                         ids=lambda argv: " ".join(["qaccel", *argv]))
def test_help_exits_0(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main([*argv, "--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {' '.join(['qaccel', *argv])}")


#: Bad values of the shared options: (argv, the error argparse prints, the subcommands).
BAD_VALUES = [
    (["--K", "-5"], "argument --K: expected an integer >= 1, not '-5'", ["sim", "perf"]),
    (["--N", "two"], "argument --N: expected an integer >= 1, not 'two'", ["sim", "perf"]),
    (["--M", "0"], "argument --M: expected an integer >= 1, not '0'", ["sim", "perf", "sweep"]),
    (["--level", "5"], "argument --level: invalid choice: 5", ["sim", "perf"]),
    (["--zero-points", "int4"], "argument --zero-points: invalid choice: 'int4'",
     ["sim", "perf"]),
    (["--memory-gbps", "0"], "argument --memory-gbps: expected a number > 0, not '0'",
     ["perf", "synth", "sweep"]),
    (["--memory-gbps", "inf"], "argument --memory-gbps: expected a number > 0, not 'inf'",
     ["perf", "synth", "sweep"]),
    (["--layer", "4096"], "argument --layer: a layer is K x N like 4096x4096, not '4096'",
     ["synth", "sweep"]),
    (["--bits", "9"], "argument --bits: weight bits are 2..8, not 9", ["perf", "synth"]),
    (["--block-size", "48"], "argument --block-size: block sizes are powers of two from 16, "
                             "not 48", ["perf", "synth"]),
    (["--target", "ice40"], "argument --target: invalid choice: 'ice40'", ["synth", "sweep"]),
    (["--unit", "mac"], "argument --unit: invalid choice: 'mac'", ["synth", "sweep"]),
    (["--router", "router3"], "argument --router: invalid choice: 'router3'",
     ["synth", "sweep"]),
    (["--freq", "fast"], "argument --freq: expected a number > 0, not 'fast'",
     ["synth", "sweep"]),
    (["--freq", "-100"], "argument --freq: expected a number > 0, not '-100'",
     ["synth", "sweep"]),
    (["--seed", "x"], "argument --seed: invalid int value: 'x'",
     ["bench", "sim", "synth", "sweep"]),
    (["--preset", "nope"], "argument --preset: ", ["sim", "perf", "synth", "sweep", "verilog"]),
    (["--preset", "ecp5-25k", "--config", "c.json"],
     "argument --config: not allowed with argument --preset",
     ["sim", "perf", "synth", "sweep", "verilog"]),
]


@pytest.mark.parametrize(("command", "argv", "message"), [
    (command, argv, message) for argv, message, commands in BAD_VALUES for command in commands],
    ids=lambda value: " ".join(value) if isinstance(value, list) else None)
def test_bad_shared_option_is_an_argparse_error(command, argv, message, capsys):
    """Exit status 2 and one line ``qaccel <command>: argument --X: ...`` (sim and bench:
    ``qaccel sim matmul-nbits: ...``), before any work."""
    with pytest.raises(SystemExit) as exit_:
        cli.main([command, *MINIMAL[command], *argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    label = " ".join(["qaccel", command, *MINIMAL[command][:1]] if command in ("sim", "bench")
                     else ["qaccel", command])
    assert err.startswith(f"{label}: {message}") and err.count("\n") == 1, err
    assert str(exit_.value) == err.rstrip("\n")


def test_sweep_grid_takes_any_integers():
    """sweep's --bits and --block-size are grid axes: a point the engine rejects fails alone
    (recorded in the results), so parsing lets any integers through."""
    args = cli.build_parser().parse_args(["sweep", "-o", "out", "--bits", "1..2",
                                          "--block-size", "8,16"])
    assert (args.bits, args.block_size) == ([1, 2], [8, 16])
