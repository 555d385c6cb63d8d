# amaranth: UnusedElaboratable=no
"""The build cache heals itself: damaged outputs are rebuilt, killed builds leave nothing
running, a read-only cache is reused, an unwritable one is named, ``qaccel cache`` reports and
clears it, and a build reports itself on stderr."""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from amaranth.hdl import Const, Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from qaccel.app import cache_cmd
from qaccel.rtl.arith.saturate import Saturate
from qaccel.sim import runner, vectors
from qaccel.sim.runner import BuildRootError, SimulationError, missing_simulator
from qaccel.sim.smoke import saturate_config
from qaccel.sim.vectors import VectorSim

pytestmark = pytest.mark.sim

REPO = Path(__file__).resolve().parents[2]
NO_VERILATOR = missing_simulator("verilator")
NO_ICARUS = missing_simulator("icarus")
needs_verilator = pytest.mark.skipif(NO_VERILATOR is not None, reason=NO_VERILATOR or "")
needs_icarus = pytest.mark.skipif(NO_ICARUS is not None, reason=NO_ICARUS or "")


class Adder(wiring.Component):
    """A registered 8-bit adder with a constant output ``tag`` (a new tag is a new Verilog
    text, and new C++ for ccache)."""

    def __init__(self, tag: int = 0):
        self.tag_value = tag
        super().__init__({"a": In(8), "b": In(8), "s": Out(9), "tag": Out(32)})

    def elaborate(self, platform):
        m = Module()
        m.d.sync += self.s.eq(self.a + self.b)
        m.d.comb += self.tag.eq(Const(self.tag_value, 32))
        return m


@pytest.fixture(scope="module")
def shared_root(tmp_path_factory):
    """A build root shared by this module's tests (builds made once per worker)."""
    return tmp_path_factory.mktemp("build_root")


@pytest.fixture
def root(shared_root, tmp_path, monkeypatch):
    monkeypatch.setenv(runner.BUILD_DIR_ENV, str(shared_root))
    monkeypatch.setenv(runner.SCRATCH_DIR_ENV, str(tmp_path / "scratch"))
    monkeypatch.delenv(runner.VERBOSE_ENV, raising=False)
    return shared_root


def run_saturate(simulator: str):
    dut = Saturate(8, bits=4)
    config = saturate_config(dut, simulator, beats=200, throughput_beats=50)
    return runner.run_cocotb(dut, name="saturate", test_module="tb_saturate",
                             simulator=simulator, config=config,
                             testcase="test_random_stream")


def run_adder():
    sim = VectorSim(Adder(), name="cache_adder")
    out = sim.run({"a": np.arange(20), "b": 5}, latency=1)
    np.testing.assert_array_equal(out["s"], np.arange(20) + 5)
    return sim


def damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "emptied":
        path.write_bytes(b"")
    elif how == "replaced":             # same size, one byte changed in the middle
        mid = len(data) // 2
        path.write_bytes(data[:mid] + bytes([data[mid] ^ 0xFF]) + data[mid + 1:])
    else:
        path.unlink()


DAMAGES = ["truncated", "emptied", "replaced", "missing"]
EXPECT = {"truncated": "is truncated", "emptied": "is empty", "missing": "is missing",
          "replaced": "was replaced or corrupted"}


# ---------------------------------------------------------------------------------------------
# Verified reuse


@needs_icarus
@pytest.mark.parametrize(("how", "target"),
                         [(how, "sim.vvp") for how in DAMAGES] + [("replaced", "saturate.v")])
def test_damaged_icarus_build_is_rebuilt(root, capsys, how, target):
    first = run_saturate("icarus")
    capsys.readouterr()
    again = run_saturate("icarus")
    assert not again.built and capsys.readouterr().err == ""     # a reuse says nothing
    assert runner.check_build(first.build_dir, "icarus", "saturate") is None
    damage(first.build_dir / target, how)
    assert EXPECT[how] in runner.check_build(first.build_dir, "icarus", "saturate")
    res = run_saturate("icarus")
    err = capsys.readouterr().err
    assert res.built and res.passed == 1
    assert (f"qaccel: rebuilding {first.build_dir.name}: {first.build_dir / target} "
            f"{EXPECT[how]}") in err
    assert "its outputs were damaged" in err and "qaccel: built the Icarus model" in err


@needs_verilator
@pytest.mark.parametrize("how", DAMAGES)
def test_damaged_vectors_build_is_rebuilt(root, capsys, how):
    sim = run_adder()
    capsys.readouterr()
    assert not run_adder().built and capsys.readouterr().err == ""
    exe = sim.build_dir / "obj_dir" / vectors.EXE
    damage(exe, how)
    rebuilt = run_adder()
    err = capsys.readouterr().err
    assert rebuilt.built
    assert f"qaccel: rebuilding {sim.build_dir.name}: {exe} {EXPECT[how]}" in err


@needs_verilator
def test_verilator_cocotb_build_heals_and_names_a_crash(root, capsys):
    first = run_saturate("verilator")
    exe = first.build_dir / "saturate"
    damage(exe, "truncated")
    capsys.readouterr()
    res = run_saturate("verilator")
    err = capsys.readouterr().err
    assert res.built and res.passed == 1 and f"{exe} is truncated" in err
    # A build that verifies but crashes: the error names the executable, the folder, the fix.
    exe.write_text("#!/bin/sh\nkill -SEGV $$\n")
    exe.chmod(0o755)
    stamp = first.build_dir / "build.json"
    info = json.loads(stamp.read_text())
    info["files"] = runner.fingerprint(first.build_dir, list(info["files"]))
    runner.write_stamp(stamp, info)
    with pytest.raises(SimulationError) as e:
        run_saturate("verilator")
    text = str(e.value)
    assert "crashed (SIGSEGV" in text and str(exe) in text and str(first.build_dir) in text
    assert "qaccel cache clear" in text
    shutil.rmtree(first.build_dir)


@needs_verilator
def test_vectors_crash_names_the_build(root):
    sim = run_adder()
    exe = sim.build_dir / "obj_dir" / vectors.EXE
    saved = exe.read_bytes()
    exe.write_text("#!/bin/sh\nkill -SEGV $$\n")
    with pytest.raises(SimulationError, match=r"crashed \(SIGSEGV.*qaccel cache clear") as e:
        sim.run({"a": np.arange(4)}, latency=1)
    assert str(exe) in str(e.value) and str(sim.build_dir) in str(e.value)
    exe.write_bytes(saved)


def test_legacy_stamp_is_adopted_only_when_complete(tmp_path):
    elf = Path(sys.executable).resolve()
    shutil.copy(elf, tmp_path / "tool")
    (tmp_path / "top.v").write_text("module top; endmodule\n")
    files = ["tool", "top.v"]
    stamp = tmp_path / "build.json"
    runner.write_stamp(stamp, {"key": "k"})             # a stamp from before fingerprints
    info, problem = runner.reuse_state(tmp_path, stamp, "k", files, writable=True)
    assert problem is None and info["files"] == runner.fingerprint(tmp_path, files)
    runner.write_stamp(stamp, {"key": "k"})
    damage(tmp_path / "tool", "truncated")
    info, problem = runner.reuse_state(tmp_path, stamp, "k", files, writable=True)
    assert info is None and problem == f"{tmp_path / 'tool'} is empty or incomplete"
    assert runner.reuse_state(tmp_path, stamp, "other key", files, True) == (None, None)


# ---------------------------------------------------------------------------------------------
# Process groups


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            kids.setdefault(int(fields[1]), []).append(int(d.name))
    return kids


def descendants(pid: int) -> dict[int, str]:
    """``{pid: command name}`` of every live descendant of ``pid`` (from /proc)."""
    kids, out, stack = _children(), {}, [pid]
    while stack:
        for child in kids.get(stack.pop(), []):
            try:
                comm = Path(f"/proc/{child}/comm").read_text().strip()
            except OSError:
                continue
            out[child] = comm
            stack.append(child)
    return out


def alive(pids) -> list[int]:
    """Those of ``pids`` that still run (zombies count as gone)."""
    out = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            out.append(pid)
    return out


def wait_gone(pids, seconds: float = 10.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive(pids)


def wait_for(proc: subprocess.Popen, names: set[str], seconds: float) -> dict[int, str]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        found = descendants(proc.pid)
        if names & set(found.values()):
            return found
        time.sleep(0.02)
    return {}


TOOL_SCRIPT = textwrap.dedent("""
    import sys
    from pathlib import Path
    from qaccel.sim.runner import run_tool
    # a tool with grandchildren: sh -> (sleep, sh -> sleep)
    cmd = ["sh", "-c", "sleep 300 & sh -c 'sleep 300' & wait"]
    try:
        run_tool(cmd, cwd=Path("."), out=sys.stdout)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(3)
""")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["sigkill", "ctrl-c"])
def test_run_tool_group_dies_with_parent(tmp_path, sig):
    proc = subprocess.Popen([sys.executable, "-c", TOOL_SCRIPT], cwd=tmp_path,
                            stdout=subprocess.PIPE, text=True)
    try:
        found = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and list(found.values()).count("sleep") < 2:
            found = descendants(proc.pid)
            time.sleep(0.02)
        assert list(found.values()).count("sleep") == 2, found
        os.kill(proc.pid, sig)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert wait_gone(found) == [], {p: found[p] for p in alive(found)}
    if sig == signal.SIGINT:
        assert proc.returncode == 3 and "interrupted" in out


BUILD_SCRIPT = textwrap.dedent("""
    import sys
    from tests.sim.test_build_cache import Adder
    from qaccel.sim.vectors import VectorSim
    VectorSim(Adder(int(sys.argv[1])), name="cache_killed")
""")


@needs_verilator
def test_killed_build_leaves_no_survivors(root):
    tag = uuid.uuid4().int & 0xFFFFFFFF     # a new Verilog text: the model misses ccache
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-c", BUILD_SCRIPT, str(tag)], cwd=REPO,
                            env=env, stderr=subprocess.PIPE, text=True)
    try:
        found = wait_for(proc, {"cc1plus"}, 120)
        assert found, f"no compiler seen (exit {proc.poll()}): {proc.stderr.read()}"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    assert wait_gone(found) == [], {p: found[p] for p in alive(found)}
    assert {"make", "cc1plus"} <= set(found.values())       # grandchildren were running
    sim = VectorSim(Adder(tag), name="cache_killed")           # the next build succeeds
    assert sim.built
    out = sim.run({"a": [1, 2], "b": 3}, latency=1)
    np.testing.assert_array_equal(out["s"], [4, 5])
    np.testing.assert_array_equal(out["tag"], [tag, tag])
    shutil.rmtree(sim.build_dir)


# ---------------------------------------------------------------------------------------------
# Read-only and unwritable roots


READER = textwrap.dedent("""
    import json, sys
    from tests.sim.test_build_cache import run_adder, run_saturate
    res = run_saturate("icarus")
    sim = run_adder()
    print(json.dumps({"cocotb_built": res.built, "passed": res.passed,
                      "run_dir": str(res.run_dir), "vectors_built": sim.built}))
""")


def _tree(path: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(path)): (p.lstat().st_size, p.lstat().st_mtime_ns)
            for p in sorted(path.rglob("*"))}


def _read_only_prefix(lab: Path) -> list[str]:
    """The command prefix that runs the reader with ``lab`` read-only: as root (whom chmod
    does not stop) a read-only bind mount of it in a private mount namespace, else nothing
    (the caller made it ``chmod -R a-w``); skips when neither is possible."""
    if os.geteuid() != 0:
        return []
    script = (f'mount --bind "{lab}" "{lab}" && mount -o remount,bind,ro "{lab}" && '
              f'! touch "{lab}/.probe" 2>/dev/null && exec "$@"')
    prefix = ["unshare", "-m", "sh", "-c", script, "sh"]
    if shutil.which("unshare") is None or subprocess.run(
            [*prefix, "true"], capture_output=True).returncode != 0:
        pytest.skip("running as root, where chmod a-w does not stop writes, and a read-only "
                    "bind mount (unshare -m, mount) is not permitted here")
    return prefix


@needs_icarus
@needs_verilator
def test_read_only_root_reuses_finished_builds(tmp_path, monkeypatch):
    lab = tmp_path / "lab"
    monkeypatch.setenv(runner.BUILD_DIR_ENV, str(lab))
    monkeypatch.setenv(runner.SCRATCH_DIR_ENV, str(tmp_path / "owner"))
    run_saturate("icarus")
    run_adder()
    for p in [lab, *lab.rglob("*")]:
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    try:
        before = _tree(lab)
        env = dict(os.environ, PYTHONPATH=str(REPO), **{
            runner.BUILD_DIR_ENV: str(lab), runner.SCRATCH_DIR_ENV: str(tmp_path / "reader")})
        res = subprocess.run([*_read_only_prefix(lab), sys.executable, "-c", READER], cwd=REPO,
                             env=env, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        out = json.loads(res.stdout.strip().splitlines()[-1])
        assert out == {"cocotb_built": False, "passed": 1, "vectors_built": False,
                       "run_dir": out["run_dir"]}
        assert out["run_dir"].startswith(str(tmp_path / "reader"))
        assert _tree(lab) == before                          # nothing written to the root
        assert "qaccel:" not in res.stderr                   # nothing built
    finally:
        for p in [lab, *lab.rglob("*")]:
            p.chmod(p.stat().st_mode | stat.S_IWUSR)


@needs_icarus
@needs_verilator
@pytest.mark.parametrize("what", ["cocotb", "vectors"])
def test_unwritable_root_is_named_before_emitting(tmp_path, monkeypatch, what):
    blocker = tmp_path / "file"
    blocker.write_text("")                  # a folder under a file cannot be made, even by root
    monkeypatch.setenv(runner.BUILD_DIR_ENV, str(blocker / "cache"))

    def no_emission(*args, **kwargs):
        raise AssertionError("the Verilog was emitted")

    monkeypatch.setattr(runner, "clean_verilog", no_emission)
    monkeypatch.setattr(vectors, "clean_verilog", no_emission)
    with pytest.raises(BuildRootError) as e:
        if what == "cocotb":
            runner.build(Saturate(8, bits=4), name="saturate", simulator="icarus")
        else:
            VectorSim(Adder(), name="cache_adder")
    text = str(e.value)
    assert f"{runner.BUILD_DIR_ENV}={blocker / 'cache'}" in text
    assert f"set {runner.BUILD_DIR_ENV} to a writable folder" in text
    assert isinstance(e.value, runner.BuildError)


def test_scratch_and_run_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv(runner.SCRATCH_DIR_ENV, str(tmp_path / "s"))
    assert runner.scratch_dir("a", "b") == tmp_path / "s" / "a" / "b"
    assert runner.run_dir(tmp_path / "build", "t1") == tmp_path / "build" / "runs" / "t1"
    blocked = tmp_path / "f"
    blocked.write_text("")
    assert runner.run_dir(blocked, "t2") == tmp_path / "s" / "runs" / "f" / "t2"
    monkeypatch.setenv(runner.SCRATCH_DIR_ENV, str(blocked / "x"))
    with pytest.raises(OSError, match=runner.SCRATCH_DIR_ENV):
        runner.scratch_dir("a")


# ---------------------------------------------------------------------------------------------
# What a build says


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("tty", [True, False], ids=["tty", "pipe"])
def test_build_progress(tmp_path, monkeypatch, tty):
    monkeypatch.setattr(runner, "PROGRESS_EVERY", 0.05)
    (tmp_path / "Vtop_classes.mk").write_text(
        "VM_PARALLEL_BUILDS = 1\nVM_CLASSES_FAST += \\\n  Vtop \\\n  Vtop__1 \\\n\n"
        "VM_GLOBAL_FAST += \\\n  verilated \\\n\n")
    stream = FakeTTY() if tty else io.StringIO()
    with runner.BuildProgress("the model of x", tmp_path, usually="usually about 1-2 s",
                              reason="first use of this configuration", stream=stream) as p:
        p.step("verilating")
        p.line("make: Entering directory '/x'\n")
        p.line("ccache c++ -O0 -c -o Vtop.o Vtop.cpp\n")
        p.line("c++ -O0 -x c++-header Vtop__pch.h -o Vtop__pch.h.fast.gch\n")
        time.sleep(0.2)
    lines = stream.getvalue().splitlines()
    assert lines[0] == (f"qaccel: building the model of x (first use of this configuration; "
                        f"usually about 1-2 s; cached in {tmp_path})")
    assert lines[-1].startswith("qaccel: built the model of x in ")
    ticks = [line for line in lines[1:-1]]
    if tty:
        assert "qaccel:   verilating (0 s)" in ticks
        assert any(t.startswith("qaccel:   compiling C++: 1/3 C++ files compiled") for t in ticks)
    else:
        assert ticks == []


def test_usual_duration_from_history(tmp_path):
    for k, seconds in enumerate([30.0, 50.0]):
        d = tmp_path / f"quantize-verilator-{k:012x}"
        d.mkdir()
        (d / "build.json").write_text(json.dumps({"seconds": seconds}))
    text = runner.usual_duration(tmp_path, "quantize-verilator-", "build.json", 10**6, 50, 5)
    assert text == f"usually about 30-50 s on {os.cpu_count()} cores, 2 earlier builds of it"
    text = runner.usual_duration(tmp_path, "other-", "build.json", 10**6, 50.0, 5.0)
    assert text == f"usually about 33-88 s on {os.cpu_count()} cores, estimated from 1.00 MB " \
                   "of Verilog"


# ---------------------------------------------------------------------------------------------
# qaccel cache


def cache(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="qaccel cache")
    cache_cmd.add_arguments(parser)
    return cache_cmd.run(parser.parse_args(list(argv)))


def du(path: Path) -> int:
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


@needs_icarus
def test_cache_info_and_clear(tmp_path, monkeypatch, capsys):
    root = tmp_path / "root"
    monkeypatch.setenv(runner.BUILD_DIR_ENV, str(root))
    old = run_saturate("icarus").build_dir
    new = runner.build(Saturate(8, bits=5), name="saturate", simulator="icarus").build_dir
    (root / "synth" / "x-ecp5-000000000000").mkdir(parents=True)
    (root / "synth" / "x-ecp5-000000000000" / "x.v").write_text("module x; endmodule\n")
    (root / "index").mkdir()
    (root / "index" / "a.json").write_text("{}")
    capsys.readouterr()

    assert cache("info", "--largest", "2") == 0
    out = capsys.readouterr().out
    assert f"build root  {root} (from {runner.BUILD_DIR_ENV}={root})" in out
    assert "writable    yes" in out
    total = du(root)
    assert f"total       {cache_cmd.format_size(total)} in 4 entries" in out
    cocotb_size = du(old) + du(new)
    assert f"cocotb builds               2  {cache_cmd.format_size(cocotb_size):>9}" in out
    assert "synth                       1" in out and "index                       1" in out
    largest = max((old, new), key=du).relative_to(root)
    assert f"largest entries:\n  {cache_cmd.format_size(du(root / largest)):>9}  {largest}" in out

    stamp = old / "build.json"
    os.utime(stamp, (time.time() - 3 * 86400,) * 2)
    for p in (root / "synth" / "x-ecp5-000000000000", root / "index" / "a.json"):
        os.utime(p, (time.time() - 3 * 86400,) * 2)
    size = du(old) + du(root / "synth") + du(root / "index")
    with runner.file_lock(new / ".lock"):          # a running build is never pulled away
        assert cache("clear", "--older-than", "2") == 0
        out = capsys.readouterr().out
        assert not old.exists() and new.exists() and not (root / "index" / "a.json").exists()
        assert out.startswith(f"freed {cache_cmd.format_size(size)}: removed 3 entries not "
                              f"used for 2 days from {root}")
        assert cache("clear") == 1
        out = capsys.readouterr().out
        assert new.exists() and f"skipped (in use by a running build): {new}" in out
    assert cache("clear") == 0
    assert not new.exists() and "removed 1 entries" in capsys.readouterr().out
    assert cache_cmd.entries(root) == []
    assert run_saturate("icarus").built                         # rebuilt on demand


def test_cache_errors(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(runner.BUILD_DIR_ENV, str(tmp_path / "none"))
    assert cache("info") == 0
    assert "does not exist yet: nothing is cached" in capsys.readouterr().out
    assert cache("clear") == 0
    with pytest.raises(SystemExit) as exit_:                # refused by its argument type
        cache("clear", "--older-than", "-1")
    assert exit_.value.code == 2
    assert "argument --older-than: expected a number of days >= 0, not '-1'" in (
        capsys.readouterr().err)
    assert cache_cmd.run(argparse.Namespace(cache_command="clear", older_than=-1.0)) == 2
    assert capsys.readouterr().err == ("qaccel cache: --older-than must be a number of days "
                                       ">= 0, not -1.0\n")
    assert cache_cmd.run(argparse.Namespace(cache_command="gc")) == 2
    assert "qaccel cache: unknown cache command 'gc'" in capsys.readouterr().err


@pytest.mark.slow
@needs_verilator
def test_quantize_unit_first_build_talks_and_reuse_is_cheap(root, tmp_path, monkeypatch, capsys):
    """The RTL engine's first use: the Quantize unit's stream loop, built in a fresh root."""
    from qaccel.engine.builds import elementwise_unit
    from qaccel.model.config import AccelConfig
    from qaccel.sim.streamsim import StreamSim

    monkeypatch.setenv(runner.BUILD_DIR_ENV, str(tmp_path / "fresh"))
    unit = elementwise_unit("quantize", AccelConfig())
    sim = StreamSim(unit, name="quantize")
    err = capsys.readouterr().err.splitlines()
    assert sim.built
    assert err[0].startswith("qaccel: building the Verilator stream loop of quantize (first use "
                             "of this configuration; usually about ")
    assert err[0].endswith(f"; cached in {sim.build_dir})")
    assert err[-1].startswith("qaccel: built the Verilator stream loop of quantize in ")
    stamp = sim.build_dir / "vectors.json"
    info = json.loads(stamp.read_text())
    files = list(info["files"])
    seconds = []
    for _ in range(5):
        start = time.perf_counter()
        got, problem = runner.reuse_state(sim.build_dir, stamp, info["key"], files, True)
        seconds.append(time.perf_counter() - start)
        assert problem is None and got["files"] == info["files"]
    assert min(seconds) < 0.05, seconds
    again = StreamSim(unit, name="quantize")
    assert not again.built and capsys.readouterr().err == ""
