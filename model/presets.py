"""Named MatMulNBits v2 engine configurations sized for real FPGA parts (docs/matmul_nbits_v2.md).

Each preset is an :class:`~qaccel.model.config.AccelConfig`; :func:`preset` returns one by
name. The figures they are sized for (LUT4, MULT18X18D, DP16KD, Fmax after place and route)
are measured with the project's own flow (``qaccel.synth.synthesize``) and listed in
docs/matmul_nbits_v2.md.

* ``ecp5-25k`` (LFE5U-25F: 24,288 LUT4, 28 MULT18X18D, 56 DP16KD): 32 MACs per cycle at 2..4
  bits (16 at 5..8), one column of weights per MAC and cycle, two float lanes, row tiles of
  4. Its 28 multipliers: 16 in the two lanes' float32 multipliers, 4 in the activation
  quantiser, 8 holding two MACs each; the other 16 MACs are LUT multipliers.
* ``ecp5-85k`` (LFE5U-85F: 83,640 LUT4, 156 MULT18X18D, 208 DP16KD): 128 MACs per cycle at
  2..4 bits, eight float lanes, every MAC pair on a multiplier.
"""

from __future__ import annotations

from .config import AccelConfig

__all__ = ["PRESETS", "preset"]

_ENGINE = dict(simd=1, m_tile=4, max_k=4096, max_block_size=256, float_path=False)

#: The presets by name (the synthesis target each is sized for).
PRESETS: dict[str, AccelConfig] = {
    "ecp5-25k": AccelConfig(pe=32, weight_bus_width=256, dsp_pairs=12, **_ENGINE),
    "ecp5-85k": AccelConfig(pe=128, weight_bus_width=1024, **_ENGINE),
}


def preset(name: str) -> AccelConfig:
    """Return the preset ``name`` (one of :data:`PRESETS`); ValueError naming the choices."""
    if name not in PRESETS:
        raise ValueError(f"preset must be one of {', '.join(PRESETS)}, not {name!r}")
    return PRESETS[name]
