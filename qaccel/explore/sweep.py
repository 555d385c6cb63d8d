"""Design-space sweeps: the performance model (and optionally synthesis) over a grid of points.

A point of ``matmul_nbits`` is (target, pe, simd, dsp_pairs, m_tile, bits, block_size) on the
v2 engine (:class:`~qaccel.rtl.nbits.matmul_nbits_v2.MatMulNBitsV2` with ECP5 primitives, as
``qaccel synth`` builds it): ``pe`` MAC columns (even), ``simd`` K elements per column and
cycle, ``dsp_pairs`` how many two-MAC multiplier slots sit on MULT18X18D (a budget: None or
at least ``pe * simd / 2`` means all of them), ``m_tile`` rows of A sharing each weight
fetch (it matters for calls of ``M > 1`` rows). The engine of a point is the base
configuration with those four fields; ``bits`` and
``block_size`` are run-time registers, so one engine serves them all, and a setting the
engine does not carry (``nbits``, ``max_block_size``) fails its point. A point of
``quantize`` / ``dequantize`` is (target, lanes). Fields that do not apply to a unit are
empty. The base configuration is ``base``, else for ``matmul_nbits`` the preset sized for
each target (:data:`qaccel.model.presets.TARGET_PRESETS`, as ``qaccel synth``), else
``AccelConfig()``.

:func:`run_sweep` evaluates the points and writes ``results.json`` and ``results.csv``
(columns :data:`COLUMNS`) in the output folder after every finished task, so a sweep can be
interrupted and run again: a point is keyed by a hash of everything that determines its
figures (:func:`point_key`: the point, its base configuration, the options, the source of
the performance model and of the RTL whose latencies it reads; synthesis results are cached
by :func:`qaccel.eda.synth.synthesize`), and a point whose row is already there with status
``ok`` is not redone (failed points are). Points sharing a hardware configuration form one
task that synthesises once; a failure is recorded in the rows it concerns (``status``
``failed``, ``error``) and the sweep goes on. Tasks run on local processes
(:class:`~concurrent.futures.ProcessPoolExecutor`, ``jobs`` workers) or, given a scheduler
address, on a Dask distributed cluster (``Client(address)``, ``submit``, ``as_completed``).

Row fields: the point; ``M``, ``K``, ``N`` (the call: M x K by K x N; elementwise: the K x N
tensor); ``config`` (the configuration's slug); ``cycles``, ``per_cycle``, ``bound``,
``utilisation``: for matmul_nbits the call's cycles, MACs per cycle and the steady state's
bound and share of the width's peak (:func:`qaccel.eda.hwreport.engine_rates`), elementwise the
call's cycles, elements per cycle and bound (:func:`qaccel.eda.hwreport.throughput`). For a
roofline (matmul_nbits): ``peak_per_cycle`` (``pe * simd`` MACs at 2..4 bits, half at 5..8),
``bus_bytes_per_cycle`` (the ``w`` stream, :func:`qaccel.eda.hwreport.weight_bus_bits`),
``macs_per_bus_byte`` (MACs per byte of that stream), and ``bytes`` (every stream of the
call). With synthesis: ``lut``, ``ff``, ``dsp``, ``bram``, ``undriven_dsp``, ``fmax_mhz``,
``critical_path`` (its first line), ``synth_seconds``, ``cached``, ``per_second`` (MAC/s or
elements/s) and for matmul_nbits ``tokens_per_second`` (on chip) and
``memory_tokens_per_second`` (with ``memory_gbps`` GB/s of external memory feeding every
stream). ``seconds`` is the wall time of the point's task.
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

from qaccel.eda.hwreport import (
    build_unit,
    check_layer,
    check_positive,
    engine_rates,
    throughput,
    undriven_dsp_inputs,
    unit_floorplan,
    weight_bus_bits,
)
from qaccel.eda.synth import TARGETS, check_router, synthesize
from qaccel.explore import perf
from qaccel.model.config import NBITS, UNITS, AccelConfig
from qaccel.model.presets import DEFAULT_TARGET, MEMORY_GBPS, preset, target_preset
from qaccel.model.validate import check_int
from qaccel.sim.runner import digest

__all__ = ["COLUMNS", "SweepResult", "point_key", "run_sweep", "summary"]

#: Bump when a row's meaning changes, so that older rows are redone.
SWEEP_VERSION = 3
_NBITS_POINT = ("unit", "target", "pe", "simd", "dsp_pairs", "m_tile", "bits", "block_size")
_POINT = (*_NBITS_POINT[:6], "lanes", *_NBITS_POINT[6:])
#: Columns of ``results.csv`` (and keys of every row).
COLUMNS = ("key", *_POINT, "M", "K", "N", "config", "status", "error", "cycles", "per_cycle",
           "bound", "utilisation", "peak_per_cycle", "bus_bytes_per_cycle",
           "macs_per_bus_byte", "bytes", "lut", "ff", "dsp", "bram", "undriven_dsp",
           "fmax_mhz", "critical_path", "synth_seconds", "cached", "per_second",
           "tokens_per_second", "memory_gbps", "memory_tokens_per_second", "seconds")
_SYNTH_FIELDS = ("lut", "ff", "dsp", "bram", "fmax_mhz")
#: The engine fields a matmul_nbits point sets.
_ENGINE_AXES = ("pe", "simd", "dsp_pairs", "m_tile")


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
    """A hash of the performance model's source and of the RTL's (the model composes the
    units' latencies): rows of an edited model or engine are redone."""
    import qaccel.rtl

    rtl = Path(qaccel.rtl.__file__).parent
    sources = [inspect.getsource(perf)] + [p.read_text() for p in sorted(rtl.rglob("*.py"))]
    return digest(sources)[:16]


def _changes(point: dict[str, Any]) -> dict[str, Any]:
    """The configuration fields a point sets on its base configuration."""
    if point["unit"] == "matmul_nbits":
        return {f: point[f] for f in _ENGINE_AXES}
    return {"lanes": point["lanes"]}


def _figures(config: AccelConfig, task: dict[str, Any], row: dict[str, Any],
             fmax_mhz: float | None) -> dict[str, Any]:
    """A row's model figures on ``config`` at ``fmax_mhz`` (None: cycle figures only)."""
    K, N = task["layer"]
    if task["unit"] != "matmul_nbits":
        t = throughput(config, task["unit"], fmax_mhz, layer=(K, N))
        return {"cycles": t.cycles, "per_cycle": t.per_cycle, "bound": t.bound,
                "utilisation": t.utilisation, "per_second": t.per_second}
    (r,) = engine_rates(config, fmax_mhz, layer=(K, N), M=task["M"], bits=[row["bits"]],
                        block_sizes=[row["block_size"]], memory_gbps=task["memory_gbps"])
    return {"cycles": r.cycles, "per_cycle": r.macs_per_cycle, "bound": r.bound,
            "utilisation": r.steady_utilisation, "peak_per_cycle": r.peak_per_cycle,
            "bus_bytes_per_cycle": weight_bus_bits(config) / 8,
            "macs_per_bus_byte": r.M * r.N * r.K / r.w_bytes, "bytes": r.bytes,
            "memory_gbps": r.memory_gbps, "per_second": r.per_second,
            "tokens_per_second": r.tokens_per_second,
            "memory_tokens_per_second": r.memory_tokens_per_second}


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def _run_task(task: dict[str, Any]) -> list[dict[str, Any]]:
    """Evaluate one task (points sharing a hardware configuration); return their rows."""
    start = time.perf_counter()
    unit, (K, N) = task["unit"], task["layer"]
    M = task["M"] if unit == "matmul_nbits" else None
    rows = [{**dict.fromkeys(COLUMNS), **point, "key": key, "M": M, "K": K, "N": N,
             "status": "ok"} for key, point in task["points"]]

    def fail(row, e):
        row.update(status="failed", error=_error(e))

    try:
        config = AccelConfig.from_dict(task["base"]).replace(**task["changes"])
    except (TypeError, ValueError) as e:
        for row in rows:
            fail(row, e)
        return rows
    for row in rows:
        row["config"] = config.slug
        try:
            row.update(_figures(config, task, row, None))
        except (TypeError, ValueError) as e:
            fail(row, e)
    if task["synth"] and any(row["status"] == "ok" for row in rows):
        try:
            r = synthesize(build_unit(unit, config), target=task["target"], name=unit,
                           seed=task["seed"], freq_mhz=task["freq_mhz"], router=task["router"],
                           floorplan=unit_floorplan(unit, config, task["target"]))
        except Exception as e:          # recorded in the rows; the sweep goes on
            for row in rows:
                fail(row, e)
        else:
            figures = {f: getattr(r, f) for f in _SYNTH_FIELDS}
            figures.update(undriven_dsp=undriven_dsp_inputs(r), cached=r.cached,
                           critical_path=r.critical_path.split("\n", 1)[0],
                           synth_seconds=r.wall_time)
            for row in (row for row in rows if row["status"] == "ok"):
                row.update(figures, **_figures(config, task, row, r.fmax_mhz))
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


def _int_values(name: str, values, *, none: bool = False) -> list[int | None]:
    """``values`` as a non-empty list of integers (and None when ``none``)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"{name} must be a sequence of integers, not {values!r}")
    values = list(values)
    if not values:
        raise ValueError(f"{name} must hold at least one value, not {values!r}")
    return [v if v is None and none else check_int(name, v) for v in values]


def _bases(unit: str, targets: list[str], base: AccelConfig | None) -> dict[str, AccelConfig]:
    """The base configuration of each target (see the module docstring)."""
    if base is not None:
        if not isinstance(base, AccelConfig):
            raise TypeError(f"base must be an AccelConfig, not {base!r}")
        if unit == "matmul_nbits" and base.float_path:
            raise ValueError("base.float_path must be False: the sweep explores the v2 engine, "
                             "which has no float path yet")
        return dict.fromkeys(targets, base)
    if unit != "matmul_nbits":
        return dict.fromkeys(targets, AccelConfig())
    try:
        return {t: preset(target_preset(t)) for t in targets}
    except ValueError as e:
        raise ValueError(f"targets: {e}; give base, an engine sized by hand") from None


def run_sweep(output: str | os.PathLike, *, unit: str = "matmul_nbits",
              targets: Sequence[str] = (DEFAULT_TARGET,), pe: Iterable[int] | None = None,
              simd: Iterable[int] | None = None,
              dsp_pairs: Iterable[int | None] | None = None,
              m_tile: Iterable[int] | None = None, lanes: Iterable[int] | None = None,
              bits: Iterable[int] = NBITS, block_sizes: Iterable[int] = (16, 32, 64, 128, 256),
              base: AccelConfig | None = None, layer: tuple[int, int] = (4096, 4096),
              M: int = 1, memory_gbps: float = MEMORY_GBPS, synth: bool = False,
              seed: int = 1, freq_mhz: float | None = None, router: str = "router1",
              jobs: int = 1, scheduler: str | None = None, progress: bool = True) -> SweepResult:
    """Evaluate every point of the grid not already done in ``output`` and return all rows.

    ``pe``, ``simd``, ``dsp_pairs`` (None in it: all pairs), ``m_tile`` (matmul_nbits) and
    ``lanes`` (quantize / dequantize) default to the base configuration's (``base``, else
    the target's preset, see the module docstring). ``bits`` and ``block_sizes`` are the
    run-time settings of each engine; ``layer`` is (K, N) and ``M`` the rows of A of the
    call whose cycles and tokens/s are reported, ``memory_gbps`` the external memory of the
    memory-bound tokens/s. ``synth`` adds synthesis for ``targets`` (``seed``, ``freq_mhz``,
    ``router`` as in :func:`qaccel.eda.synth.synthesize`; ``router2`` for large designs such as
    the ECP5-85F engine). Tasks run on ``jobs`` local processes, or on the Dask scheduler at
    ``scheduler``. A progress bar goes to stderr unless ``progress`` is False. Bad
    parameters raise ValueError / TypeError naming them; a point's own failure (a field the
    configuration rejects, a setting the engine does not carry, a design that does not fit)
    is recorded in its row instead.
    """
    start = time.perf_counter()
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {', '.join(UNITS)}, not {unit!r}")
    targets = list(targets)
    if not targets or any(t not in TARGETS for t in targets):
        raise ValueError(f"targets must be among {', '.join(TARGETS)}, not {targets!r}")
    bases = _bases(unit, targets, base)
    given = {"pe": pe, "simd": simd, "dsp_pairs": dsp_pairs, "m_tile": m_tile, "lanes": lanes}
    given = {name: None if values is None else _int_values(name, values,
                                                          none=name == "dsp_pairs")
             for name, values in given.items()}
    bits = _int_values("bits", bits)
    block_sizes = _int_values("block_sizes", block_sizes)
    layer = check_layer(layer)
    check_int("M", M, 1)
    memory_gbps = check_positive("memory_gbps", memory_gbps)
    check_router(router)
    check_int("jobs", jobs, 1)
    if scheduler is not None and not isinstance(scheduler, str):
        raise TypeError(f"scheduler must be an address string, not {scheduler!r}")
    folder = Path(output)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"output must be a folder, not the file {str(folder)!r}")
    folder.mkdir(parents=True, exist_ok=True)

    settings = {"layer": list(layer), "synth": synth, "model": _model_digest()}
    if unit == "matmul_nbits":
        settings.update(M=M, memory_gbps=memory_gbps)
    if synth:
        settings.update(seed=seed, freq_mhz=freq_mhz, router=router)
    points, keys = [], []
    for target in targets:
        axes = {name: [getattr(bases[target], name)] if values is None else values
                for name, values in given.items()}
        if unit == "matmul_nbits":
            shape = itertools.product(*(axes[f] for f in _ENGINE_AXES), [None], bits,
                                      block_sizes)
        else:
            shape = itertools.product(*[[None]] * 4, axes["lanes"], [None], [None])
        for values in shape:
            point = dict(zip(_POINT, (unit, target, *values), strict=True))
            points.append(point)
            keys.append(point_key(point, {**settings, "base": bases[target].to_dict()}))
    done = _load(folder)
    todo = [(k, p) for k, p in zip(keys, points, strict=True)
            if done.get(k, {}).get("status") != "ok"]
    tasks: dict[tuple, dict[str, Any]] = {}
    for key, point in todo:
        target = point["target"]
        changes = _changes(point)
        task = tasks.setdefault(
            (target, json.dumps(changes, sort_keys=True)),
            {"unit": unit, "target": target, "base": bases[target].to_dict(),
             "changes": changes, "layer": tuple(layer), "M": M, "memory_gbps": memory_gbps,
             "synth": synth, "seed": seed, "freq_mhz": freq_mhz, "router": router,
             "points": []})
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


def _where(row: dict[str, Any]) -> str:
    """A row's point as text (``dsp_pairs all`` for None)."""
    fields = _NBITS_POINT if row.get("unit") == "matmul_nbits" else ("unit", "target", "lanes")
    return ", ".join(f"{f} {'all' if row.get(f) is None else row[f]}" for f in fields)


def summary(result: SweepResult, output: str | os.PathLike, max_failures: int = 10) -> str:
    """Return a few lines: counts, where the results are, and the first ``max_failures``
    failed points' errors."""
    lines = [f"{len(result.rows)} points: {result.ran} evaluated, {result.kept} kept from "
             f"{output}, {result.failed} failed ({result.wall_time:.1f} s); results in "
             f"{Path(output) / 'results.csv'} and results.json"]
    failed = [row for row in result.rows if row["status"] != "ok"]
    for row in failed[:max_failures]:
        lines.append(f"  failed: {_where(row)}: {row['error'].splitlines()[0]}")
    if len(failed) > max_failures:
        lines.append(f"  ... and {len(failed) - max_failures} more failed points (see the "
                     "error column)")
    return "\n".join(lines)
