"""README.md runs as written.

The rule:

* Every ```python block runs as it stands, in a fresh namespace, and prints what its comments
  say (:data:`PRINTS`). A block needing the RTL runs on the default ``AccelConfig()`` (the
  build the rest of the suite shares). The board block (``Board.open`` of a serial port)
  runs with ``Board.open`` answered by a stand-in that binds each call to the driver's own
  signature and answers it with the engine's model (no board is attached here).
* Every ``qaccel`` command of a ```sh block (``.venv/bin/qaccel`` too; backslash continuations
  joined, ``#`` comments dropped) is parsed by the CLI's own parser. ``...`` stands for more
  arguments and is dropped; ``[...]`` marks optional arguments, parsed with them, run without
  them; ``a|b`` offers alternatives, the first is taken. The cheap commands (``perf``,
  ``report``, ``sweep`` without ``--synth``: the model only) are also run, in README order,
  in a temporary folder standing for the working directory. Other commands (``make``,
  ``pytest``) are not qaccel's and are left alone.
* The sweep example's plots read well (the figure properties a hardware engineer needs): a
  bus-bound and a compute-bound region, every block size visible, log axes labelled per decade
  with units, and no two texts overlapping.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import itertools
import re
import shlex
from pathlib import Path

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.text import Text

import qaccel
from qaccel.app import cli
from qaccel.board.driver import Board
from qaccel.explore import plots

README = Path(__file__).resolve().parents[1] / "README.md"
TEXT = README.read_text()
BLOCKS = re.findall(r"^```(\w*)\n(.*?)^```", TEXT, re.M | re.S)
PYTHON = [code for lang, code in BLOCKS if lang == "python"]
SHELL = [code for lang, code in BLOCKS if lang == "sh"]
#: What each Python block prints (by a line of its code), a regular expression per line.
PRINTS = {
    "y = qaccel.quantize_linear(x, y_scale, y_zero_point, axis=1, block_size=0,":
        [r"int8 True", r"int4 -7 7", r"\(4, 16\) 0\.075\d*", r"int8 \(4, 64\)"],
    "board = Board.open(": [r"\d\.\d+e-0[7-9]|0\.0"],
    "rtl = qaccel.RTL(simulator=\"verilator\")": [
        r"  jobs 1, elements 16384, beats 16384, cycles \d+\D.*\b0\.9\d+ beats/cycle.*",
        r"  latency \d+ cycles; verilator .*"],
}
#: Commands run for real (the model only), not just parsed.
CHEAP = ("perf", "report", "sweep")


def _key(code: str) -> str:
    (key,) = [k for k in PRINTS if k in code]
    return key


def test_every_python_block_is_known():
    assert len(PYTHON) == len(PRINTS)
    assert sorted(_key(code) for code in PYTHON) == sorted(PRINTS)


class _ModelBoard:
    """A board's driver calls answered by the engine's model: each call is first bound to
    :class:`Board`'s signature (TypeError if the README passes what the driver does not
    take)."""

    def check(self) -> None:
        inspect.signature(Board.check).bind(self)

    def quantize_linear(self, *args, **kwargs):
        inspect.signature(Board.quantize_linear).bind(self, *args, **kwargs)
        return qaccel.quantize_linear(*args, **kwargs)

    def matmul_nbits(self, *args, **kwargs):
        from qaccel.model.nbits_hw import matmul_nbits_v2

        bound = inspect.signature(Board.matmul_nbits).bind(self, *args, **kwargs)
        bound.apply_defaults()
        del bound.arguments["self"]
        return matmul_nbits_v2(*bound.args, **bound.kwargs)


@pytest.mark.parametrize("code", PYTHON, ids=[_key(c).split("(")[0].strip() for c in PYTHON])
def test_python_block_runs_and_prints_what_it_says(code, monkeypatch, capsys):
    def open_board(port, description, **kwargs):
        inspect.signature(Board.open).bind(port, description, **kwargs)
        assert Path(description).name == "board.json"
        return _ModelBoard()

    monkeypatch.setattr(Board, "open", open_board)
    exec(compile(code, f"{README.name}: {_key(code)}", "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out.splitlines()
    want = PRINTS[_key(code)]
    assert len(out) == len(want), out
    for line, pattern in zip(out, want, strict=True):
        assert re.fullmatch(pattern, line), (line, pattern)


def _commands() -> list[str]:
    """The ``qaccel`` command lines of the sh blocks, in README order."""
    lines = []
    for block in SHELL:
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words and Path(words[0]).name == "qaccel":
                lines.append(line.strip())
    return lines


def _argv(line: str, *, optional: bool) -> list[str]:
    """``line``'s arguments after the rule of the module docstring."""
    argv, inside = [], False
    for word in shlex.split(line, comments=True)[1:]:
        opens, closes = word.startswith("["), word.endswith("]")
        word = word.strip("[]")
        if (inside or opens) and not optional:
            inside = not closes and (inside or opens)
            continue
        inside = not closes and (inside or opens)
        if word != "...":
            argv.append(word.split("|")[0])
    return argv


def _parse(argv: list[str]) -> None:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            cli.build_parser().parse_args(argv)
    except SystemExit as e:
        pytest.fail(f"qaccel {' '.join(argv)}: not parsed ({e.code}): {err.getvalue()}")


def test_every_shell_command_parses_and_the_cheap_ones_run(tmp_path, monkeypatch, capsys):
    lines = _commands()
    commands = {shlex.split(line, comments=True)[1] for line in lines}
    assert commands >= {"demo", "sim", "perf", "sweep", "report", "synth", "verilog"}
    monkeypatch.chdir(tmp_path)
    ran = []
    for line in lines:
        _parse(_argv(line, optional=True))
        argv = _argv(line, optional=False)
        if argv[0] in CHEAP and "--synth" not in argv:
            assert cli.main(argv) == 0, line
            ran.append(argv[0])
    assert sorted(ran) == ["perf", "report", "report", "sweep", "sweep"]
    out = capsys.readouterr().out
    assert "sweep/plots/roofline.png" in out
    for name in ("throughput_vs_bits", "roofline"):
        assert (tmp_path / "sweep" / "plots" / f"{name}.png").stat().st_size > 20_000


# -- the sweep example's plots ------------------------------------------------------------------


@pytest.fixture(scope="module")
def example_rows(tmp_path_factory):
    """The rows of the README's sweep example (its ``qaccel sweep`` command, run here)."""
    (line,) = [c for c in _commands() if " sweep " in c and "--m-tile" in c]
    folder = tmp_path_factory.mktemp("example")
    argv = _argv(line, optional=False)
    argv[argv.index("-o") + 1] = str(folder)
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(argv) == 0
    return plots.load_rows(folder)


def _in_view(axis, loc) -> bool:
    lo, hi = sorted(axis.get_view_interval())
    return lo - 1e-9 * abs(lo) <= loc <= hi + 1e-9 * abs(hi)


def _texts(fig):
    """Every text ``fig`` draws (titles, labels, annotations, legends, the tick labels in
    view) with its window extent, drawn by Agg."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    ticks = set()
    drawn = []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                ticks.update((tick.label1, tick.label2))
                if _in_view(axis, tick.get_loc()):
                    drawn += [t for t in (tick.label1, tick.label2) if t.get_visible()]
    drawn += [t for t in fig.findobj(Text) if t not in ticks and t.get_visible()]
    unique = {id(t): t for t in drawn if t.get_text().strip()}.values()
    return [(t, t.get_window_extent(renderer)) for t in unique]


def _visible_tick_labels(axis) -> list[str]:
    return [label.get_text() for tick, label in zip(axis.get_majorticklocs(),
                                                   axis.get_majorticklabels(), strict=True)
            if _in_view(axis, tick) and label.get_text()]


def test_the_example_has_a_memory_bound_and_a_compute_bound_region(example_rows):
    bounds = {}
    for r in example_rows:
        clock = plots.clock_of(r)
        gmacs, bound = plots.delivered(r, clock)
        bounds.setdefault(bound, []).append(r)
        roof = min(r["memory_gbps"] * plots.intensity(r), r["peak_per_cycle"] * clock / 1e3)
        assert gmacs <= roof * (1 + 1e-9)
        if bound == "memory":
            assert gmacs == pytest.approx(r["memory_gbps"] * plots.intensity(r))
    assert set(bounds) == {"memory", "compute"}
    assert min(len(bounds["memory"]), len(bounds["compute"])) >= 10
    # in the memory-bound region the block size matters: smaller blocks, more scale bytes
    int4 = sorted((r for r in bounds["memory"] if r["bits"] == 4), key=lambda r: r["block_size"])
    rates = [plots.delivered(r, plots.clock_of(r))[0] for r in int4]
    assert len(rates) == 3 and rates == sorted(rates) and rates[0] < 0.8 * rates[-1]


@pytest.mark.parametrize("figure", ["throughput", "roofline"])
def test_the_example_plots_read_well(example_rows, figure):
    fig = getattr(plots, f"{figure}_figure")(example_rows)
    texts = _texts(fig)
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert len(panels) == 4
    for ax in panels:
        assert "GMAC/s" in ax.get_ylabel()
        if figure == "roofline":
            assert ax.get_xscale() == ax.get_yscale() == "log"
            assert "MAC per byte" in ax.get_xlabel()
            for axis in (ax.xaxis, ax.yaxis):
                labels = _visible_tick_labels(axis)
                assert len(labels) >= 3, labels          # several decades, each labelled
                assert all(re.fullmatch(r"0\.0*1|10*", t) for t in labels), labels
            markers = [c.get_paths()[0].vertices.tobytes() for c in ax.collections]
            assert len(set(markers)) == len(markers) == 3      # a marker per block size
        else:
            assert len(_visible_tick_labels(ax.yaxis)) >= 4
            assert _visible_tick_labels(ax.xaxis) == [str(b) for b in range(2, 9)]
            lines = [line for line in ax.get_lines() if str(line.get_gid()).startswith("block")]
            assert len(lines) == 3
            styles = {(line.get_color(), str(line.get_linestyle())) for line in lines}
            assert len(styles) == 3                           # each its own colour and style
            for a, b in itertools.combinations(lines, 2):     # no line on top of another
                assert list(a.get_xdata()) != list(b.get_xdata())
    for (a, box_a), (b, box_b) in itertools.combinations(texts, 2):
        assert not box_a.overlaps(box_b), (a.get_text(), b.get_text())
