"""The long checked regression (issue 19, point 6): 10^9 output beats of random Quantize jobs
on the default unit, checked inside the C++ stream loop and sharded over the local cores
(``QACCEL_REGRESSION_BEATS`` / ``QACCEL_REGRESSION_SHARDS`` / ``QACCEL_REGRESSION_SCHEDULER``
override the size, the shard count and run the shards on a Dask scheduler). Opt-in:
``pytest -m regression tests/sim/test_regression.py -s``."""

import os

import pytest

from qaccel.sim.elementwise_sim import run_regression

BEATS = int(float(os.environ.get("QACCEL_REGRESSION_BEATS", "1e9")))


@pytest.mark.regression
@pytest.mark.parametrize("op", ["quantize"])
def test_checked_regression(op):
    shards = os.environ.get("QACCEL_REGRESSION_SHARDS")
    reg = run_regression(BEATS, op=op, shards=int(shards) if shards else None,
                         scheduler=os.environ.get("QACCEL_REGRESSION_SCHEDULER"),
                         seed=int(os.environ.get("QACCEL_REGRESSION_SEED", "0")))
    print(f"\n{op}: {reg.beats:,} beats checked in {reg.cycles:,} cycles, {reg.jobs:,} jobs, "
          f"{reg.shards} shards; wall {reg.wall_time:.1f} s, steady {reg.steady_time:.1f} s, "
          f"{reg.beats_per_second:,.0f} beats/s; job generation {reg.gen_time:.1f} s, loop "
          f"{reg.sim_time:.1f} s (summed over shards); {reg.mismatch_count} mismatches")
    assert reg.ok, "\n".join(f"shard {s} chunk {c} job {label!r}: {m}"
                             for s, c, label, m in reg.mismatches)
    assert reg.beats >= BEATS
