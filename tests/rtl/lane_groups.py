"""Element-by-element checks of the Quantize / Dequantize lanes through Verilator: groups of
vectors, each with its own register setting, back to back in one stream with a pipeline flush
between groups (a lane's registers must be stable while elements are in flight).

Outputs compare bit for bit with the golden model's codes, NaN signs and payloads included."""

from __future__ import annotations

import numpy as np

from qaccel.model.dtypes import SCALE_TYPES
from qaccel.sim.jobs import codes_of
from qaccel.sim.vectors import VectorSim, join_fields


def random_e8m0(n: int, rng) -> np.ndarray:
    """``n`` float8e8m0 scales: mostly 2**-12 .. 2**6, a tenth any code, and 2**-127, 2**127,
    NaN and 1 first."""
    codes = rng.integers(115, 134, n)
    codes[: n // 10] = rng.integers(0, 256, n // 10)
    codes[:4] = [0, 254, 255, 127]
    return codes.astype(np.uint8).view(SCALE_TYPES["float8e8m0"])


class Groups:
    """Vectors of many register settings, back to back, each group followed by a flush."""

    def __init__(self, lane):
        self.lane = lane
        self.layout = lane.signature.members["regs"].shape
        self.cols = {k: [] for k in ("regs", "x", "scale", "zero_point")}
        self.expected: list[np.ndarray] = []
        self.labels: list[tuple[str, int, int]] = []
        self.n = 0

    def add(self, label: str, fields: dict, x, scale, zp, want) -> None:
        """Add a group: register ``fields`` (field name -> value), operands, expected output."""
        n = x.size
        word = int(join_fields({k: np.array([v]) for k, v in fields.items()}, self.layout)[0])
        pad = self.lane.latency + 1
        self.cols["regs"].append(np.full(n + pad, word, np.int64))
        for key, arr in (("x", x), ("scale", scale), ("zero_point", zp)):
            codes = np.zeros(n + pad, np.int64)
            if arr is not None:
                codes[:n] = codes_of(arr)
            self.cols[key].append(codes)
        self.expected.append(codes_of(want))
        self.labels.append((label, self.n, n))
        self.n += n + pad

    def inputs(self) -> dict[str, np.ndarray]:
        return {k: np.concatenate(v) for k, v in self.cols.items()}


def run_groups(lane, sim: VectorSim, groups: Groups) -> int:
    """Run every group; assert each output equals the expected one; return the count."""
    y = sim.run(groups.inputs(), latency=lane.latency, outputs=["y"])["y"].astype(np.int64)
    checked = 0
    for (label, start, n), want, x_col, s_col in zip(
            groups.labels, groups.expected, groups.cols["x"], groups.cols["scale"], strict=True):
        got = y[start:start + n]
        bad = np.flatnonzero(got != want)
        assert not bad.size, (
            f"{label}: {bad.size} of {n} wrong; first: " + "; ".join(
                f"x={int(x_col[k]):#x} scale={int(s_col[k]):#x}: {int(got[k]):#x}, "
                f"want {int(want[k]):#x}" for k in bad[:4]))
        checked += n
    return checked
