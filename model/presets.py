"""Named MatMulNBits v2 engine configurations sized for real FPGA parts (docs/matmul_nbits_v2.md).

Each preset is an :class:`~qaccel.model.config.AccelConfig`; :func:`preset` returns one by
name. The figures they are sized for (LUT4, MULT18X18D, DP16KD, Fmax after place and route)
are measured with the project's own flow (``qaccel.eda.synth.synthesize``) and listed in
docs/matmul_nbits_v2.md.

* ``ecp5-25k`` (LFE5U-25F: 24,288 LUT4, 28 MULT18X18D, 56 DP16KD), the default
  ``AccelConfig()``: 32 MACs per cycle at 2..4 bits (16 at 5..8), one column of weights
  per MAC and cycle, two float lanes, row tiles of 4. Its 28 multipliers: 16 in the two
  lanes' float32 multipliers, 4 in the activation quantiser, 8 holding two MACs each; the
  other 16 MACs are LUT multipliers.
* ``ecp5-85k`` (LFE5U-85F: 83,640 LUT4, 156 MULT18X18D, 208 DP16KD): 128 MACs per cycle at
  2..4 bits, eight float lanes, and the float path (accuracy_level 0..3, g_idx and float
  zero points in block floating point: four int8 digit rows per row of A, so 32 of those
  MACs per cycle). Four clusters of 32 columns and two lanes each (the 25F's slice), each
  with 12 of its 16 MAC pairs on multipliers: its 24 MULT18X18D fill half a DSP row of the
  part, where :func:`qaccel.eda.floorplan.engine_floorplan` pins them (``qaccel synth`` does).
* ``ecp5-85k-float``: the 25F's engine (32 MACs per cycle at 2..4 bits, two float lanes,
  row tiles of 4) with the float path, every MAC pair on a multiplier (31 MULT18X18D, more
  than the 25F has): float-path jobs run four int8 digit rows per row of A, so 8 of their
  MACs per cycle.
"""

from __future__ import annotations

from .config import AccelConfig

__all__ = ["DEFAULT_TARGET", "MEMORY_GBPS", "MEMORY_NOTE", "PRESETS", "TARGET_PRESETS",
           "UNIT_PRESETS", "preset", "target_preset"]

#: The synthesis target of the default configuration (``AccelConfig()`` is sized for it), and
#: the default of ``qaccel synth`` / ``sweep`` and the synthesis functions.
DEFAULT_TARGET = "ecp5-25k"
#: External memory bandwidth (GB/s) of the memory-bound figures unless told otherwise: a
#: 16-bit DDR3-800 interface (800 MT/s x 2 bytes), :data:`MEMORY_NOTE`.
MEMORY_GBPS = 1.6
MEMORY_NOTE = "16-bit DDR3-800 as on common ECP5 boards"

#: The presets by name (the synthesis target each is sized for). ``ecp5-25k`` is the default
#: configuration, ``AccelConfig()``.
PRESETS: dict[str, AccelConfig] = {
    "ecp5-25k": AccelConfig(),
    "ecp5-85k": AccelConfig(pe=128, dsp_pairs=48, float_path=True, clusters=4),
    "ecp5-85k-float": AccelConfig(float_path=True, dsp_pairs=None),
}


_INT8 = dict(q_inputs=("float32",), scales=("float32",), q_outputs=("int8",),
             dq_inputs=("int8",), dq_outputs=("float32",), table_depth=512)
_MX = ("int8", "float8e4m3fn", "float8e5m2", "float4e2m1")

#: Quantize / Dequantize builds (``qaccel synth --unit quantize|dequantize --preset NAME``;
#: their MatMulNBits fields are the defaults). The default ``AccelConfig()`` carries every
#: format; these carry the common ones, and their figures are in the README. Their tables
#: hold 512 entries (one DP16KD per 36-bit column, ``Elementwise(ecp5=True)``):
#:
#: * ``qdq-int8``: float32 -> int8 and back, one lane, float32 scales, the Quantize lane
#:   dividing through reciprocals prepared when the table loads (``reciprocal_units`` 1);
#: * ``qdq-int8-x8``: the same with eight lanes (eight elements a cycle), two reciprocal
#:   units, three MULT18X18D per lane's divider (24 of the LFE5U-25F's 28);
#: * ``qdq-mx``: the OCP Microscaling element types (MXINT8, MXFP8 E4M3 / E5M2, MXFP4) from
#:   and to float32 / bfloat16 with float8e8m0 scales only: no divider, no casts.
UNIT_PRESETS: dict[str, AccelConfig] = {
    "qdq-int8": AccelConfig(reciprocal_units=1, **_INT8),
    "qdq-int8-x8": AccelConfig(lanes=8, reciprocal_units=2, divider_dsps=3, **_INT8),
    "qdq-mx": AccelConfig(q_inputs=("float32", "bfloat16"), scales=("float8e8m0",),
                          table_depth=512,
                          q_outputs=_MX, dq_inputs=_MX, dq_outputs=("float32", "bfloat16")),
}


def preset(name: str) -> AccelConfig:
    """Return the preset ``name`` (one of :data:`PRESETS` or :data:`UNIT_PRESETS`);
    ValueError naming the choices."""
    if name in PRESETS:
        return PRESETS[name]
    if name in UNIT_PRESETS:
        return UNIT_PRESETS[name]
    raise ValueError(f"preset must be one of {', '.join([*PRESETS, *UNIT_PRESETS])}, "
                     f"not {name!r}")


#: The preset to build for each synthesis target (:data:`qaccel.eda.synth.TARGETS`) that one fits:
#: the LFE5U-45F gets the 25F's engine (the 85F's does not fit its 72 MULT18X18D). Targets
#: left out (the iCE40 UP5K) fit no MatMulNBits engine preset.
TARGET_PRESETS: dict[str, str] = {
    "ecp5-25k": "ecp5-25k",
    "ecp5-45k": "ecp5-25k",
    "ecp5-85k": "ecp5-85k",
}


def target_preset(target: str) -> str:
    """Return the name of the preset sized for the synthesis ``target``; ValueError saying
    that no preset fits a target outside :data:`TARGET_PRESETS`."""
    if target not in TARGET_PRESETS:
        fits = ", ".join(f"{t} ({n})" for t, n in TARGET_PRESETS.items())
        raise ValueError(f"no MatMulNBits engine preset fits target {target!r}; presets are "
                         f"sized for {fits}")
    return TARGET_PRESETS[target]
