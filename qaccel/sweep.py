"""Design-space sweeps: the performance model (and optionally synthesis) over a grid of points.

A point of ``matmul_nbits`` is (target, pe, simd, bits, block_size); its engine is the base
configuration with that ``pe`` and ``simd``, ``nbits=(bits,)``, ``max_block_size`` the
sweep's largest block size (one engine serves every block size: it is a run-time register)
and ``float_path`` as asked. A point of ``quantize`` / ``dequantize`` is (target, lanes).
Fields that do not apply to a unit are empty.

:func:`run_sweep` evaluates the points and writes ``results.json`` and ``results.csv``
(columns :data:`COLUMNS`) in the output folder after every finished task, so a sweep can be
interrupted and run again: a point is keyed by a hash of everything that determines its
figures (:func:`point_key`: the point, the base configuration, the options, the performance
model's source; synthesis results are cached by :func:`qaccel.synth.synthesize`), and a
point whose row is already there with status ``ok`` is not redone (failed points are).
Points sharing a hardware configuration form one task that synthesises once; a failure is
recorded in the rows it concerns (``status`` ``failed``, ``error``) and the sweep goes on.
Tasks run on local processes (:class:`~concurrent.futures.ProcessPoolExecutor`, ``jobs``
workers) or, given a scheduler address, on a Dask distributed cluster (``Client(address)``,
``submit``, ``as_completed``).

Row fields: the point; ``K``, ``N`` (the layer); ``config`` (the configuration's slug);
``cycles`` (per pass; elementwise: the call), ``per_cycle`` (MACs or elements), ``bound``,
``utilisation`` (see :func:`qaccel.hwreport.throughput`); for a roofline (matmul_nbits)
``peak_per_cycle`` (``pe * simd`` MACs), ``bus_bytes_per_cycle`` (the weight bus) and
``macs_per_bus_byte`` (MACs per byte of weight codes: ``8 / bits`` less K's padding to whole
blocks); with synthesis ``lut``, ``ff``,
``dsp``, ``bram``, ``undriven_dsp``, ``fmax_mhz``, ``critical_path`` (its first line),
``synth_seconds``, ``cached``, ``per_second`` (MAC/s or elements/s) and ``tokens_per_second``
(matmul_nbits); ``seconds`` is the wall time of the point's task.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import csv
import functools
import inspect
import itertools
import json
import os
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from qaccel.hwreport import UNITS, build_unit, check_layer, throughput, undriven_dsp_inputs
from qaccel.model import perf
from qaccel.model.config import NBITS, AccelConfig
from qaccel.model.validate import check_int
from qaccel.sim.runner import digest
from qaccel.synth import TARGETS, synthesize

__all__ = ["COLUMNS", "SweepResult", "point_key", "run_sweep", "summary"]

#: Bump when a row's meaning changes, so that older rows are redone.
SWEEP_VERSION = 2
_POINT = ("unit", "target", "pe", "simd", "lanes", "bits", "block_size")
#: Columns of ``results.csv`` (and keys of every row).
COLUMNS = ("key", *_POINT, "K", "N", "config", "status", "error", "cycles", "per_cycle",
           "bound", "utilisation", "peak_per_cycle", "bus_bytes_per_cycle",
           "macs_per_bus_byte", "lut", "ff", "dsp", "bram", "undriven_dsp", "fmax_mhz",
           "critical_path", "synth_seconds", "cached", "per_second", "tokens_per_second",
           "seconds")
_SYNTH_FIELDS = ("lut", "ff", "dsp", "bram", "fmax_mhz")


@dataclass(frozen=True)
class SweepResult:
    """The rows of a sweep's points, in grid order, and what this run did: ``ran`` points
    evaluated, ``kept`` points already done in the output, ``failed`` rows with status
    ``failed`` (old or new), ``wall_time`` seconds."""

    rows: list[dict[str, Any]]
    ran: int
    kept: int
    failed: int
    wall_time: float


def point_key(point: dict[str, Any], settings: dict[str, Any]) -> str:
    """Return the stable 16-hex-digit key of ``point`` under the sweep ``settings`` (the base
    configuration and every option that changes the figures)."""
    return digest({"point": point, "settings": settings, "version": SWEEP_VERSION})[:16]


def _model_digest() -> str:
    """A hash of the performance model's source: rows of an edited model are redone."""
    return digest(inspect.getsource(perf))[:16]


def _grid(unit, targets, pe, simd, lanes, bits, block_sizes) -> list[dict[str, Any]]:
    if unit == "matmul_nbits":
        shape = itertools.product(targets, pe, simd, [None], bits, block_sizes)
    else:
        shape = itertools.product(targets, [None], [None], lanes, [None], [None])
    return [dict(zip(_POINT, (unit, *values), strict=True)) for values in shape]


def _changes(point: dict[str, Any], max_block: int, float_path: bool) -> dict[str, Any]:
    """The configuration fields a point sets on the base configuration."""
    if point["unit"] == "matmul_nbits":
        return {"pe": point["pe"], "simd": point["simd"], "nbits": (point["bits"],),
                "max_block_size": max_block, "float_path": float_path}
    return {"lanes": point["lanes"]}


def _roofline(config: AccelConfig, K: int, bits: int, block_size: int) -> dict[str, float]:
    """The roofline fields of a matmul_nbits row (see the module docstring)."""
    p = perf.nbits_pass(config, K=K, bits=bits, block_size=block_size)
    return {"peak_per_cycle": config.pe * config.simd,
            "bus_bytes_per_cycle": config.weight_bus_width / 8,
            "macs_per_bus_byte": p.macs / p.bytes["w"]}


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def _run_task(task: dict[str, Any]) -> list[dict[str, Any]]:
    """Evaluate one task (points sharing a hardware configuration); return their rows."""
    start = time.perf_counter()
    unit, (K, N) = task["unit"], task["layer"]
    rows = [{**dict.fromkeys(COLUMNS), **point, "key": key, "K": K, "N": N, "status": "ok"}
            for key, point in task["points"]]

    def fail(row, e):
        row.update(status="failed", error=_error(e))

    try:
        config = AccelConfig.from_dict(task["base"]).replace(**task["changes"])
    except (TypeError, ValueError) as e:
        for row in rows:
            fail(row, e)
        return rows

    def rates(row, fmax_mhz):
        one = (None, None) if unit != "matmul_nbits" else ([row["bits"]], [row["block_size"]])
        return throughput(config, unit, fmax_mhz, layer=(K, N), bits=one[0],
                          block_sizes=one[1])[0]

    for row in rows:
        row["config"] = config.slug
        try:
            t = rates(row, None)
            row.update(cycles=t.cycles, per_cycle=t.per_cycle, bound=t.bound,
                       utilisation=t.utilisation)
            if unit == "matmul_nbits":
                row.update(_roofline(config, K, row["bits"], row["block_size"]))
        except (TypeError, ValueError) as e:
            fail(row, e)
    if task["synth"] and any(row["status"] == "ok" for row in rows):
        try:
            r = synthesize(build_unit(unit, config), target=task["target"], name=unit,
                           seed=task["seed"], freq_mhz=task["freq_mhz"])
        except Exception as e:          # recorded in the rows; the sweep goes on
            for row in rows:
                fail(row, e)
        else:
            figures = {f: getattr(r, f) for f in _SYNTH_FIELDS}
            figures.update(undriven_dsp=undriven_dsp_inputs(r), cached=r.cached,
                           critical_path=r.critical_path.split("\n", 1)[0],
                           synth_seconds=r.wall_time)
            for row in (row for row in rows if row["status"] == "ok"):
                t = rates(row, r.fmax_mhz)
                row.update(figures, per_second=t.per_second,
                           tokens_per_second=t.tokens_per_second)
    seconds = round(time.perf_counter() - start, 3)
    for row in rows:
        row["seconds"] = seconds
    return rows


@contextlib.contextmanager
def _pool(jobs: int, scheduler: str | None):
    """Yield ``(submit, as_completed)`` of local processes or of a Dask cluster."""
    if scheduler is None:
        with concurrent.futures.ProcessPoolExecutor(max_workers=jobs) as pool:
            yield pool.submit, concurrent.futures.as_completed
    else:
        from dask.distributed import Client, as_completed

        with Client(scheduler) as client:
            yield functools.partial(client.submit, pure=False), as_completed


def _load(folder: Path) -> dict[str, dict[str, Any]]:
    path = folder / "results.json"
    if not path.exists():
        return {}
    try:
        rows = json.loads(path.read_text())
        return {row["key"]: row for row in rows}
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(f"output holds {path}, which is not a sweep's results ({e})") from None


def _write(folder: Path, rows: Iterable[dict[str, Any]]) -> None:
    rows = list(rows)
    for name in ("results.json", "results.csv"):
        tmp = folder / f".{name}.tmp"
        with open(tmp, "w", newline="") as f:
            if name.endswith(".json"):
                json.dump(rows, f, indent=1)
            else:
                writer = csv.DictWriter(f, COLUMNS, extrasaction="ignore")
                writer.writeheader()
                writer.writerows(rows)
        os.replace(tmp, folder / name)


def _int_values(name: str, values) -> list[int]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"{name} must be a sequence of integers, not {values!r}")
    values = list(values)
    if not values:
        raise ValueError(f"{name} must hold at least one value, not {values!r}")
    return [check_int(name, v) for v in values]


def run_sweep(output: str | os.PathLike, *, unit: str = "matmul_nbits",
              targets: Sequence[str] = ("ecp5-25k",), pe: Iterable[int] | None = None,
              simd: Iterable[int] | None = None, lanes: Iterable[int] | None = None,
              bits: Iterable[int] = NBITS, block_sizes: Iterable[int] = (16, 32, 64, 128, 256),
              base: AccelConfig | None = None, layer: tuple[int, int] = (4096, 4096),
              synth: bool = False, float_path: bool = False, seed: int = 1,
              freq_mhz: float | None = None, jobs: int = 1, scheduler: str | None = None,
              progress: bool = True) -> SweepResult:
    """Evaluate every point of the grid not already done in ``output`` and return all rows.

    ``pe``, ``simd``, ``lanes`` default to ``base``'s (``AccelConfig()`` when None);
    ``layer`` is (K, N) of the layer whose tokens/s is reported; ``synth`` adds synthesis
    for ``targets`` (``seed``, ``freq_mhz`` as in :func:`qaccel.synth.synthesize`). Tasks
    run on ``jobs`` local processes, or on the Dask scheduler at ``scheduler``. A progress
    bar goes to stderr unless ``progress`` is False. Bad parameters raise ValueError /
    TypeError naming them; a point's own failure is recorded in its row instead.
    """
    start = time.perf_counter()
    base = AccelConfig() if base is None else base
    if not isinstance(base, AccelConfig):
        raise TypeError(f"base must be an AccelConfig, not {base!r}")
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {', '.join(UNITS)}, not {unit!r}")
    targets = list(targets)
    if not targets or any(t not in TARGETS for t in targets):
        raise ValueError(f"targets must be among {', '.join(TARGETS)}, not {targets!r}")
    pe = _int_values("pe", [base.pe] if pe is None else pe)
    simd = _int_values("simd", [base.simd] if simd is None else simd)
    lanes = _int_values("lanes", [base.lanes] if lanes is None else lanes)
    bits = _int_values("bits", bits)
    block_sizes = _int_values("block_sizes", block_sizes)
    layer = check_layer(layer)
    check_int("jobs", jobs, 1)
    if scheduler is not None and not isinstance(scheduler, str):
        raise TypeError(f"scheduler must be an address string, not {scheduler!r}")
    folder = Path(output)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"output must be a folder, not the file {str(folder)!r}")
    folder.mkdir(parents=True, exist_ok=True)

    max_block = max(16, *block_sizes)
    settings = {"base": base.to_dict(), "layer": list(layer), "float_path": float_path,
                "max_block": max_block, "synth": synth, "model": _model_digest()}
    if synth:
        settings.update(seed=seed, freq_mhz=freq_mhz)
    points = _grid(unit, targets, pe, simd, lanes, bits, block_sizes)
    keys = [point_key(p, settings) for p in points]
    done = _load(folder)
    todo = [(k, p) for k, p in zip(keys, points, strict=True)
            if done.get(k, {}).get("status") != "ok"]
    tasks: dict[tuple, dict[str, Any]] = {}
    for key, point in todo:
        changes = _changes(point, max_block, float_path)
        task = tasks.setdefault(
            (point["target"], json.dumps(changes, sort_keys=True)),
            {"unit": unit, "target": point["target"], "base": base.to_dict(),
             "changes": changes, "layer": tuple(layer), "synth": synth, "seed": seed,
             "freq_mhz": freq_mhz, "points": []})
        task["points"].append((key, point))

    def ordered():
        grid = set(keys)
        return [done[k] for k in keys if k in done] + [r for k, r in done.items()
                                                      if k not in grid]

    bar = tqdm(total=len(points), initial=len(points) - len(todo), desc=f"sweep {unit}",
               unit="point", file=sys.stderr, disable=not progress)
    try:
        if tasks:
            with _pool(jobs, scheduler) as (submit, as_completed):
                futures = {submit(_run_task, task): task for task in tasks.values()}
                for future in as_completed(futures):
                    try:
                        rows = future.result()
                    except Exception as e:  # a worker lost: the task's points fail
                        task = futures[future]
                        rows = [{**dict.fromkeys(COLUMNS), **p, "key": k, "status": "failed",
                                 "error": _error(e)} for k, p in task["points"]]
                    done.update((row["key"], row) for row in rows)
                    _write(folder, ordered())
                    bar.update(len(rows))
        _write(folder, ordered())
    finally:
        bar.close()
    rows = [done[k] for k in keys]
    return SweepResult(rows=rows, ran=len(todo), kept=len(points) - len(todo),
                       failed=sum(row["status"] != "ok" for row in rows),
                       wall_time=time.perf_counter() - start)


def summary(result: SweepResult, output: str | os.PathLike, max_failures: int = 10) -> str:
    """Return a few lines: counts, where the results are, and the first ``max_failures``
    failed points' errors."""
    lines = [f"{len(result.rows)} points: {result.ran} evaluated, {result.kept} kept from "
             f"{output}, {result.failed} failed ({result.wall_time:.1f} s); results in "
             f"{Path(output) / 'results.csv'} and results.json"]
    failed = [row for row in result.rows if row["status"] != "ok"]
    for row in failed[:max_failures]:
        where = ", ".join(f"{f} {row[f]}" for f in _POINT if row[f] is not None)
        lines.append(f"  failed: {where}: {row['error'].splitlines()[0]}")
    if len(failed) > max_failures:
        lines.append(f"  ... and {len(failed) - max_failures} more failed points (see the "
                     "error column)")
    return "\n".join(lines)

