"""``qaccel cache``: what the build cache holds, and clearing it.

The build cache is the build root of :mod:`qaccel.sim.runner` (``$QACCEL_BUILD_DIR``, else
``sim_build/`` in the repository): simulator builds (cocotb on Verilator or Icarus, Verilator
vector and stream loops), synthesis, formal and bitstream runs, and small index, job and
capture files. Everything in it is rebuilt on demand, so clearing it only costs build time.

``qaccel cache info`` prints the root, where it comes from, whether it is writable, its total
size, the size and entry count per kind and the largest entries. ``qaccel cache clear``
removes the entries (all, or with ``--older-than DAYS`` those not used for that long: a
build's time is that of its stamp, which every reuse touches), each under its build lock,
skipping builds that are running, and prints the space freed. Exit status: 0, 1 when some
entries could not be removed (in use, or not writable), 2 for bad arguments; errors are one
line starting ``qaccel cache:``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import math
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from qaccel.app.cli import number_type
from qaccel.sim.runner import BUILD_DIR_ENV, build_root, root_writable

__all__ = ["KINDS", "Entry", "add_arguments", "entries", "format_size", "run"]

#: Kinds of entries, in the order ``info`` lists them, with their labels.
KINDS = {
    "cocotb": "cocotb builds",
    "vectors": "vectors/stream builds",
    "synth": "synth",
    "formal": "formal",
    "bitstream": "bitstream",
    "index": "index",
    "jobs": "jobs/capture files",
    "numba": "numba caches",
    "other": "other",
}
#: Folders of the root whose children are the entries, by kind.
_GROUPS = {"synth": "synth", "formal": "formal", "bitstream": "bitstream", "index": "index",
           "jobs": "jobs", "capture": "jobs"}
_BUILD = re.compile(r"^.+-(verilator|icarus|vectors|stream)-[0-9a-f]{12}$")
#: Stamps whose time is a build's last use.
_STAMPS = ("build.json", "vectors.json")


@dataclass(frozen=True)
class Entry:
    """One removable unit of the cache: a build folder or a file, its kind, size in bytes and
    the time it was last used (seconds since the epoch)."""

    path: Path
    kind: str
    size: int
    used: float


def format_size(size: int) -> str:
    """``size`` bytes in B, kB, MB or GB (powers of 1000)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def _size(path: Path) -> int:
    try:
        st = path.lstat()
    except OSError:
        return 0
    if not path.is_dir() or path.is_symlink():
        return st.st_size
    total = 0
    for dirpath, _, filenames in os.walk(path):
        for name in filenames:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def _used(path: Path) -> float:
    times = []
    for stamp in _STAMPS:
        with contextlib.suppress(OSError):
            times.append((path / stamp).stat().st_mtime)
    if not times:
        with contextlib.suppress(OSError):
            times.append(path.lstat().st_mtime)
    return max(times, default=0.0)


def _kind(entry: Path) -> str:
    m = _BUILD.match(entry.name)
    if m:
        return "cocotb" if m[1] in ("verilator", "icarus") else "vectors"
    if entry.name.startswith("numba") or entry.name == "__pycache__":
        return "numba"
    return "other"


def entries(root: Path) -> list[Entry]:
    """The removable entries of the build root ``root``: its build folders and the children
    of its synth, formal, bitstream, index, jobs and capture folders (lock files left out)."""
    out = []
    if not root.is_dir():
        return out
    for child in sorted(root.iterdir()):
        if child.name.startswith("."):
            continue
        group = _GROUPS.get(child.name)
        if group is not None and child.is_dir() and not child.is_symlink():
            for item in sorted(child.iterdir()):
                if not item.name.endswith(".lock"):
                    out.append(Entry(item, group, _size(item), _used(item)))
        else:
            out.append(Entry(child, _kind(child), _size(child), _used(child)))
    return out


def _root_source(root: Path) -> str:
    env = os.environ.get(BUILD_DIR_ENV)
    if env:
        return f"from {BUILD_DIR_ENV}={env}"
    return f"the default; {BUILD_DIR_ENV} is not set"


@contextlib.contextmanager
def _try_lock(entry: Path) -> Iterator[bool]:
    """Hold the lock of build ``entry`` without waiting: yield False if it is in use.
    Entries without a lock file (index, job files) yield True."""
    candidates = [entry / ".lock", entry.with_name(entry.name + ".lock")]
    lock = next((c for c in candidates if c.is_file()), None)
    if lock is None:
        yield True
        return
    try:
        f = open(lock, "a")
    except OSError:
        yield True          # cannot open it: the removal will fail on permissions as well
        return
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``info`` and ``clear`` subcommands to ``parser`` (the ``cache`` command's)."""
    sub = parser.add_subparsers(dest="cache_command", metavar="{info,clear}", required=True)
    info = sub.add_parser("info", help="the build root, its size per kind and largest entries")
    info.add_argument("--largest", type=number_type(int, lambda v: v >= 0, "an integer >= 0"),
                      default=10, metavar="N",
                      help="list the N largest entries (default 10)")
    clear = sub.add_parser("clear", help="remove cached builds (each under its lock; running "
                                         "builds are skipped)")
    clear.add_argument("--older-than", default=None, metavar="DAYS",
                       type=number_type(float, lambda v: 0 <= v < math.inf,
                                        "a number of days >= 0"),
                       help="only entries not used for DAYS days")


def _error(message: str, code: int) -> int:
    print(f"qaccel cache: {message}", file=sys.stderr)
    return code


def _info(args: argparse.Namespace, root: Path) -> int:
    largest = args.largest
    if not isinstance(largest, int) or largest < 0:
        return _error(f"--largest must be a count >= 0, not {largest!r}", 2)
    exists = root.is_dir()
    writable = root_writable(root) if exists else None
    found = entries(root)
    total = sum(e.size for e in found)
    print(f"build root  {root} ({_root_source(root)})")
    if not exists:
        print("            does not exist yet: nothing is cached")
        return 0
    print(f"writable    {'yes' if writable else 'no (finished builds are reused, none is made)'}")
    print(f"total       {format_size(total)} in {len(found)} entries")
    for kind, label in KINDS.items():
        of_kind = [e for e in found if e.kind == kind]
        if of_kind:
            size = sum(e.size for e in of_kind)
            print(f"  {label:<22} {len(of_kind):>6}  {format_size(size):>9}")
    if largest and found:
        print("largest entries:")
        now = time.time()
        for e in sorted(found, key=lambda e: e.size, reverse=True)[:largest]:
            age = (now - e.used) / 86400
            print(f"  {format_size(e.size):>9}  {e.path.relative_to(root)}  "
                  f"(used {age:.1f} days ago)")
    print(f"clear it with `qaccel cache clear` (everything is rebuilt on demand); move it with "
          f"{BUILD_DIR_ENV}")
    return 0


def _clear(args: argparse.Namespace, root: Path) -> int:
    days = args.older_than
    if days is not None and (not isinstance(days, (int, float)) or not days >= 0):
        return _error(f"--older-than must be a number of days >= 0, not {days!r}", 2)
    if not root.is_dir():
        print(f"nothing to clear: {root} does not exist")
        return 0
    if not root_writable(root):
        return _error(f"cannot clear {root}: it is not writable ({_root_source(root)})", 1)
    cutoff = None if days is None else time.time() - days * 86400
    freed = removed = 0
    busy, failed = [], []
    for e in entries(root):
        if cutoff is not None and e.used > cutoff:
            continue
        with _try_lock(e.path) as locked:
            if not locked:
                busy.append(e.path)
                continue
            try:
                _remove(e.path)
            except OSError as err:
                failed.append(f"{e.path} ({err.strerror or err})")
                continue
        freed += e.size
        removed += 1
    what = "" if days is None else f" not used for {days:g} days"
    print(f"freed {format_size(freed)}: removed {removed} entries{what} from {root}")
    for path in busy:
        print(f"  skipped (in use by a running build): {path}")
    for line in failed:
        print(f"  could not remove {line}")
    return 1 if busy or failed else 0


def run(args: argparse.Namespace) -> int:
    """Run ``qaccel cache info`` or ``qaccel cache clear`` on the parsed ``args``; return the
    exit status."""
    root = build_root()
    command = getattr(args, "cache_command", None)
    if command == "info":
        return _info(args, root)
    if command == "clear":
        return _clear(args, root)
    return _error(f"unknown cache command {command!r}; use info or clear", 2)
