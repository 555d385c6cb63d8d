"""Performance model of the MatMulNBits engine: the steady-state cost of one pass.

A pass is one row of A against ``pe`` output columns (see
:class:`qaccel.rtl.matmul_nbits.MatMulNBits`). With input streams that never stall, a pass
takes the largest of

* ``compute``: ``K_pad / simd`` beats, one per cycle (``K_pad``: K rounded up to whole blocks);
* ``weight bus``: ``K_pad * bits`` bits per column over ``weight_bus_width / pe`` bits per
  cycle (the job's weights are one continuous bit stream per column, so this is an average);
* ``scale stream``: one ``s`` beat per block, plus the bias beat;
* ``fold``: ``8 * partial_sums`` cycles, the previous row's fold of its partial sums;

plus one cycle on the float path with a bias (the bias beat on ``s`` sits between two passes'
block parameters). That is the steady state measured in RTL simulation, exactly for every
bits 2..8 x block_size 16..256 pair on the shapes of tests/rtl/test_matmul_nbits.py.
Not modelled yet: a call's fill and drain (about 110-210 cycles at the tested shapes).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from .config import ZERO_POINTS, AccelConfig, int8_path
from .validate import check_int, check_int_choice, check_power_of_two

__all__ = ["BOUNDS", "NBitsPass", "nbits_pass"]

#: What limits a pass, in the order ties are named.
BOUNDS = ("compute", "weight bus", "scale stream", "fold")


@dataclass(frozen=True)
class NBitsPass:
    """The steady-state cost of one MatMulNBits pass (``pe`` columns x one row of K).

    ``cycles`` is exact as a :class:`~fractions.Fraction` (the weight-bus bound is an
    average when a pass's weights do not fill whole bus words). ``bytes`` maps each stream
    (``a``, ``w``, ``s``, ``z``, ``y``) to the bytes it carries per pass at its bus width.
    """

    config: AccelConfig
    K: int
    bits: int
    block_size: int
    path: str                       # "int8" or "float"
    bound: str                      # one of BOUNDS
    cycles: Fraction
    limits: dict[str, Fraction]     # each bound's cycles
    bytes: dict[str, int]

    @property
    def macs(self) -> int:
        """Multiply-adds of the pass (K of every one of the ``pe`` columns)."""
        return self.K * self.config.pe

    @property
    def macs_per_cycle(self) -> float:
        return float(self.macs / self.cycles)

    @property
    def utilisation(self) -> float:
        """Fraction of the ``pe * simd`` MAC slots used (padding past K counts as unused)."""
        return self.macs_per_cycle / (self.config.pe * self.config.simd)


def nbits_pass(config: AccelConfig, *, K: int, bits: int, block_size: int,
               zero_points: str = "packed", accuracy_level: int = 4,
               bias: bool = False) -> NBitsPass:
    """Return the steady-state cost of one pass of MatMulNBits on ``config``'s engine.

    ``zero_points`` is ``"none"``, ``"packed"`` or ``"float"``; accuracy_level 4 with integer
    or no zero points takes the int8 path, everything else the float path (which the
    configuration must carry). Raises :exc:`ValueError` / :exc:`TypeError` naming a bad
    parameter.
    """
    if not isinstance(config, AccelConfig):
        raise TypeError(f"config must be an AccelConfig, not {config!r}")
    check_int("K", K, 1)
    check_int_choice("bits", bits, config.nbits)
    check_power_of_two("block_size", block_size, max(16, config.simd))
    check_int("block_size", block_size, None, config.max_block_size)
    if zero_points not in ZERO_POINTS:
        raise ValueError(f"zero_points must be one of {ZERO_POINTS}, not {zero_points!r}")
    check_int("accuracy_level", accuracy_level, 0, 4)
    float_zp = zero_points == "float"
    path = "int8" if int8_path(accuracy_level, float_zero_points=float_zp, g_idx=False) else "float"
    if path == "float" and not config.float_path:
        raise ValueError(f"accuracy_level {accuracy_level} with zero_points {zero_points!r} "
                         f"takes the float path, which this config leaves out (float_path)")
    pe, simd = config.pe, config.simd
    lane_bus = config.weight_bus_width // pe
    blocks = -(-K // block_size)
    k_pad = blocks * block_size
    s_beats = blocks + bool(bias)
    limits = {
        "compute": Fraction(k_pad // simd),
        "weight bus": Fraction(k_pad * bits, lane_bus),
        "scale stream": Fraction(s_beats),
        "fold": Fraction(8 * config.partial_sums),
    }
    bound = max(BOUNDS, key=lambda b: (limits[b], -BOUNDS.index(b)))
    cycles = limits[bound] + (1 if path == "float" and bias else 0)
    return NBitsPass(
        config=config, K=K, bits=bits, block_size=block_size, path=path, bound=bound,
        cycles=cycles, limits=limits,
        bytes={"a": -(-K // simd) * simd * 4,
               "w": pe * k_pad * bits // 8,
               "s": s_beats * pe * 8,
               "z": -(-blocks * bits // 8) * pe if zero_points == "packed" else 0,
               "y": pe * 4})
