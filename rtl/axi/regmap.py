"""The AXI4-Lite register map of a qaccel core, described once as a Python table.

:func:`register_map` gives the map of one core (``quantize``, ``dequantize`` or
``matmul_nbits``) of a configuration: a :class:`RegisterMap` of 32-bit registers, each of
:class:`Field` s. Everything else is generated from it:

* the register bank (:class:`~qaccel.rtl.axi.axil_registers.AxiLiteRegisters`, inside
  :class:`~qaccel.rtl.axi.axi_core.AxiCore`);
* a C header (:meth:`RegisterMap.c_header`) and a Markdown reference
  (:meth:`RegisterMap.markdown`), which ``qaccel verilog`` writes beside each core;
* the Python access layer (:meth:`RegisterMap.encode`, :meth:`~RegisterMap.decode`,
  :meth:`~RegisterMap.job_writes`): it computes the words; the caller moves them (the cocotb
  testbenches with cocotbext-axi, :mod:`qaccel.board` over the UART link);
* the JSON description (:meth:`RegisterMap.to_dict`, reloaded by
  :meth:`RegisterMap.from_dict`).

Every core has the same control block at 0x000..0x03f (identification, control, status,
error flags, interrupt, cycle and beat counters); its job registers follow from 0x040 (the
fields of the unit's job vector, see :attr:`RegisterMap.job_width`), and the Quantize and
Dequantize cores have a scale-table window after them.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any

from amaranth.hdl import Shape
from amaranth.lib import data

from qaccel import __version__
from qaccel.model.config import AccelConfig

__all__ = ["ACCESS", "CORE_ID", "MAP_VERSION", "OPS", "Field", "Register", "RegisterMap",
           "byte_fields", "job_layout", "register_map", "tdata_bytes", "to_tdata",
           "type_lists"]

#: Register access kinds: ``ro`` read-only (driven by the core), ``rw`` read-write,
#: ``wo`` write-only (an action; reads 0), ``w1c`` set by the core, cleared by writing 1.
ACCESS = ("ro", "rw", "wo", "w1c")
#: The ``ID`` register's value: ASCII "QACC".
CORE_ID = 0x51414343
#: The register map's layout version (``VERSION.map``).
MAP_VERSION = 1
#: The cores, with their ``VERSION.op`` codes.
OPS = {"quantize": 1, "dequantize": 2, "matmul_nbits": 3}
#: Offset of the first job register; the control block is below it.
JOB_BASE = 0x040


@dataclass(frozen=True)
class Field:
    """Bits ``[lsb + width - 1 : lsb]`` of a register. ``job_bit`` is the field's offset in
    the core's job vector (job fields only: written while the core is idle)."""

    name: str
    lsb: int
    width: int
    access: str
    doc: str
    reset: int = 0
    job_bit: int | None = None

    @property
    def mask(self) -> int:
        return ((1 << self.width) - 1) << self.lsb


@dataclass(frozen=True)
class Register:
    """A 32-bit register at byte ``offset``. ``stall``: a write waits (no write response)
    until the core can take it. ``held``: writes are refused while the core is busy (job
    and table registers; job registers are held whatever the flag). ``constant``: its
    fields read their ``reset`` values (identification)."""

    name: str
    offset: int
    doc: str
    fields: tuple[Field, ...]
    stall: bool = False
    held: bool = False
    constant: bool = False

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"register {self.name} has no field {name!r} (fields: "
                       f"{', '.join(f.name for f in self.fields)})")

    @property
    def job(self) -> bool:
        return any(f.job_bit is not None for f in self.fields)


@dataclass(frozen=True)
class RegisterMap:
    """The registers of one core (``module`` is its Verilog module name)."""

    module: str
    op: str
    registers: tuple[Register, ...]
    job_width: int
    config_crc: int
    notes: tuple[str, ...] = field(default=())

    def __getitem__(self, name: str) -> Register:
        for r in self.registers:
            if r.name == name:
                return r
        raise KeyError(f"{self.module} has no register {name!r}")

    def __contains__(self, name: str) -> bool:
        return any(r.name == name for r in self.registers)

    @property
    def span(self) -> int:
        """Bytes the map occupies (the last register's end)."""
        return self.registers[-1].offset + 4

    # -- the Python access layer ------------------------------------------------------------

    def encode(self, register: str, **values: int) -> int:
        """The 32-bit word of ``register`` with its fields set to ``values`` (others 0).
        Raises KeyError for an unknown field, ValueError for a value that does not fit."""
        reg = self[register]
        word = 0
        for name, value in values.items():
            f = reg.field(name)
            if not 0 <= int(value) < 1 << f.width:
                raise ValueError(f"{register}.{name} is {f.width} bits wide; {value} does not "
                                 f"fit")
            word |= int(value) << f.lsb
        return word

    def decode(self, register: str, word: int) -> dict[str, int]:
        """The fields of ``register`` in ``word``."""
        return {f.name: (int(word) >> f.lsb) & ((1 << f.width) - 1)
                for f in self[register].fields}

    def job_writes(self, job: int | dict[str, int]) -> list[tuple[int, int]]:
        """The ``(offset, word)`` writes that load ``job`` into the job registers: ``job`` is
        the unit's packed job vector (:attr:`qaccel.sim.jobs.Job.regs`) or, for a core whose
        job fields are named registers, a mapping of them (:attr:`qaccel.sim.nbits_jobs.
        NBitsJobV2.regs`)."""
        if isinstance(job, dict):
            job = self._pack_named(job)
        job = int(job)
        if not 0 <= job < 1 << self.job_width:
            raise ValueError(f"job must be a {self.job_width}-bit vector, not {job:#x}")
        writes = []
        for reg in self.registers:
            if reg.job:
                word = 0
                for f in reg.fields:
                    word |= ((job >> f.job_bit) & ((1 << f.width) - 1)) << f.lsb
                writes.append((reg.offset, word))
        return writes

    def _pack_named(self, values: dict[str, int]) -> int:
        fields = {f.name: f for r in self.registers if r.job for f in r.fields}
        job = 0
        for name, value in values.items():
            if name not in fields:
                raise KeyError(f"{self.module} has no job field {name!r} (job fields: "
                               f"{', '.join(fields)})")
            f = fields[name]
            if not 0 <= int(value) < 1 << f.width:
                raise ValueError(f"job field {name} is {f.width} bits wide; {value} does not "
                                 f"fit")
            job |= int(value) << f.job_bit
        return job

    # -- generated descriptions -------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {"module": self.module, "op": self.op, "job_width": self.job_width,
                "config_crc": self.config_crc, "notes": list(self.notes),
                "registers": [asdict(r) for r in self.registers]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RegisterMap:
        """The map :meth:`to_dict` described (as ``qaccel verilog`` writes it in the core's
        JSON, under ``register_map``)."""
        regs = tuple(Register(**{**r, "fields": tuple(Field(**f) for f in r["fields"])})
                     for r in d["registers"])
        return cls(d["module"], d["op"], regs, d["job_width"], d["config_crc"],
                   tuple(d.get("notes", ())))

    def c_header(self) -> str:
        """A C header: each register's offset, each field's shift and mask, the constants."""
        up = self.module.upper()
        lines = [f"/* {self.module}: AXI4-Lite register map (qaccel {__version__}, map "
                 f"version {MAP_VERSION}); generated, do not edit. */",
                 f"#ifndef {up}_REGS_H", f"#define {up}_REGS_H", "",
                 f"#define {up}_ID_VALUE 0x{CORE_ID:08X}u",
                 f"#define {up}_CONFIG_CRC 0x{self.config_crc:08X}u",
                 f"#define {up}_SPAN 0x{self.span:03X}u", ""]
        for reg in self.registers:
            lines.append(f"/* {reg.name}: {_one_line(reg.doc)} */")
            lines.append(f"#define {up}_{reg.name} 0x{reg.offset:03X}u")
            for f in reg.fields:
                if len(reg.fields) == 1 and f.lsb == 0 and f.width == 32:
                    continue
                stem = (f"{up}_{reg.name}" if f.name.upper() == reg.name
                        else f"{up}_{reg.name}_{f.name.upper()}")
                lines += [f"#define {stem}_SHIFT {f.lsb}u",
                          f"#define {stem}_MASK 0x{f.mask:08X}u"]
            lines.append("")
        return "\n".join([*lines, f"#endif /* {up}_REGS_H */", ""])

    def markdown(self) -> str:
        """A Markdown register reference: a summary table, then each register's fields."""
        lines = [f"# {self.module}: register reference",
                 "",
                 f"Generated by qaccel {__version__} (register map version {MAP_VERSION}) "
                 f"from `qaccel.rtl.axi.regmap`; the C header `{self.module}_regs.h` and "
                 f"`{self.module}.json` (`register_map`) carry the same table.",
                 "",
                 "AXI4-Lite, 32-bit data, byte addresses; reads of an unmapped address "
                 "return SLVERR, as do writes to it and writes to a job or table register "
                 "while `STATUS.busy` (the write is ignored and `ERROR.locked_write` set).",
                 "Access: `ro` read-only, `rw` read-write, `wo` write-only (an action; reads "
                 "0), `w1c` set by the core, cleared by writing 1.",
                 "", *[f"- {n}" for n in self.notes], "",
                 "| offset | register | description |", "|---|---|---|"]
        lines += [f"| 0x{r.offset:03X} | `{r.name}` | {_one_line(r.doc)} |"
                  for r in self.registers]
        for reg in self.registers:
            lines += ["", f"## 0x{reg.offset:03X} `{reg.name}`", "", reg.doc, "",
                      "| bits | field | access | reset | description |", "|---|---|---|---|---|"]
            for f in reg.fields:
                bits = (f"{f.lsb}" if f.width == 1 else f"{f.lsb + f.width - 1}:{f.lsb}")
                lines.append(f"| {bits} | `{f.name}` | {f.access} | {f.reset:#x} | "
                             f"{_one_line(f.doc)} |")
        return "\n".join(lines) + "\n"


def _one_line(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def job_layout(unit_or_engine) -> data.StructLayout:
    """The job vector of a unit: an :class:`~qaccel.rtl.elementwise.unit.Elementwise`'s
    ``regs``, or a StructLayout of a MatMulNBits engine's job registers."""
    members = unit_or_engine.signature.members
    if "regs" in members:
        return members["regs"].shape
    from qaccel.rtl.nbits.matmul_nbits_v2 import REGISTERS

    return data.StructLayout({r: members[r].shape for r in REGISTERS})


def byte_fields(layout) -> list[dict[str, Any]]:
    """The leaves of ``layout`` (``{name, offset, width}``, :func:`~qaccel.rtl.elementwise.
    axis_top.layout_fields`) with ``byte_offset``: their place in the byte-aligned word,
    each leaf in order starting on a byte and padded to whole bytes."""
    from qaccel.rtl.elementwise.axis_top import layout_fields

    out, at = [], 0
    for f in layout_fields(layout):
        out.append({**f, "byte_offset": at})
        at += -(-f["width"] // 8) * 8
    return out


def tdata_bytes(fields: list[dict[str, Any]]) -> int:
    """Bytes of the byte-aligned word :func:`byte_fields` lays out."""
    last = fields[-1]
    return last["byte_offset"] // 8 + -(-last["width"] // 8)


def to_tdata(fields: list[dict[str, Any]], payload: int | dict[str, int]) -> int:
    """The byte-aligned ``tdata`` of a stream beat: ``payload`` is the stream core's payload
    (its layout's packing, as :mod:`qaccel.sim.jobs` and :mod:`qaccel.sim.nbits_jobs` give
    beats) or a mapping of field names to values (a table entry's ``addr``, ``scale``,
    ``zero_point``)."""
    out = 0
    for f in fields:
        if isinstance(payload, dict):
            value = int(payload[f["name"]])
            if not 0 <= value < 1 << f["width"]:
                raise ValueError(f"field {f['name']} is {f['width']} bits wide; {value} "
                                 f"does not fit")
        else:
            value = (int(payload) >> f["offset"]) & ((1 << f["width"]) - 1)
        out |= value << f["byte_offset"]
    return out


def _crc(config: AccelConfig, op: str) -> int:
    part = "matmul_nbits" if op == "matmul_nbits" else "elementwise"
    return zlib.crc32(json.dumps(config.to_dict(part), sort_keys=True).encode())


def _control_block(op: str, config: AccelConfig, errors: list[tuple[str, str]]) -> list:
    R, F = Register, Field
    return [
        R("ID", 0x000, "Identifies a qaccel core: reads 0x51414343 (ASCII \"QACC\").",
          (F("id", 0, 32, "ro", "0x51414343", CORE_ID),), constant=True),
        R("VERSION", 0x004, "The register map's version and the core's operator.",
          (F("map", 0, 8, "ro", "register map version", MAP_VERSION),
           F("op", 8, 8, "ro", "1 quantize, 2 dequantize, 3 matmul_nbits", OPS[op])),
          constant=True),
        R("CONFIG", 0x008, "CRC-32 of the core's configuration (its part of config.json, "
          "keys sorted, compact JSON): a driver checks it against the configuration it "
          "was given.", (F("crc", 0, 32, "ro", "zlib.crc32 of the configuration",
                           _crc(config, op)),), constant=True),
        R("CTRL", 0x010, "Actions. Writing 1 to `start` starts the job held in the job "
          "registers (checked first: see ERROR; the write completes once a table entry "
          "committed before it is in); `reset` aborts the running job and empties the "
          "core's pipelines (the scale table keeps its contents).",
          (F("start", 0, 1, "wo", "start the job"),
           F("reset", 1, 1, "wo", "abort the job (a synchronous reset of the datapath)")),
          stall=op != "matmul_nbits"),
        R("STATUS", 0x014, "The core's state.",
          (F("busy", 0, 1, "ro", "a job runs (from start until its last output beat has "
             "left)"),
           F("done", 1, 1, "ro", "the last job finished (cleared by the next start)"),
           F("error", 2, 1, "ro", "ERROR is not 0"))),
        R("ERROR", 0x018, "Error flags, sticky until written with 1. A start with any "
          "job error does not start the job.",
          tuple(F(name, k, 1, "w1c", doc) for k, (name, doc) in enumerate(errors))),
        R("IRQ_ENABLE", 0x01C, "Which events drive the `irq` output (the interrupt).",
          (F("done", 0, 1, "rw", "a job finished"),
           F("error", 1, 1, "rw", "an error flag was set"))),
        R("IRQ_STATUS", 0x020, "Events since last cleared; `irq` is high while an "
          "enabled one is set.",
          (F("done", 0, 1, "w1c", "a job finished"),
           F("error", 1, 1, "w1c", "an error flag was set"))),
        R("CYCLES", 0x024, "Clock cycles of the running or last job: from the cycle the "
          "job starts (the cycle after the CTRL write is taken) through the cycle its last "
          "output has left, both counted (qaccel.explore.perf's call cycles; wraps at 2**32).",
          (F("cycles", 0, 32, "ro", "cycles"),)),
        R("Y_BEATS", 0x028, "Output (`m_axis_y`) transfers since the last start.",
          (F("y_beats", 0, 32, "ro", "beats"),)),
    ]


_COMMON_ERRORS = [
    ("start_busy", "start written while busy (ignored)"),
    ("locked_write", "a job or table register written while busy (ignored, SLVERR)"),
]


def _job_registers(layout: data.StructLayout, names: dict[str, str],
                   groups: dict[str, tuple[str, ...]], docs: dict[str, str],
                   base: int) -> list[Register]:
    """One register per leaf of ``layout`` (``names`` renames a leaf's register), except the
    leaves of each ``groups`` entry, which share one register (fields packed from bit 0)."""
    from qaccel.rtl.elementwise.axis_top import layout_fields

    leaves = {f["name"]: f for f in layout_fields(layout)}
    grouped = {leaf: g for g, members in groups.items() for leaf in members}
    regs, done = [], set()
    for name, leaf in leaves.items():
        if name in done:
            continue
        if name in grouped:
            g = grouped[name]
            fields, lsb = [], 0
            for member in groups[g]:
                f = leaves[member]
                fields.append(Field(member.rsplit(".", 1)[-1], lsb, f["width"], "rw",
                                    docs.get(member, ""), job_bit=f["offset"]))
                lsb += f["width"]
                done.add(member)
            if lsb > 32:
                raise ValueError(f"job register {g} needs {lsb} bits; a register has 32")
            regs.append(Register(g, base + 4 * len(regs), docs.get(g, ""), tuple(fields)))
            continue
        width = leaf["width"]
        reg = names.get(name, name.replace(".", "").upper())
        for part in range(0, width, 32):
            w = min(32, width - part)
            regs.append(Register(reg + (f"_{part // 32}" if width > 32 else ""),
                                 base + 4 * len(regs), docs.get(name, ""),
                                 (Field(reg.lower(), 0, w, "rw", docs.get(name, ""),
                                        job_bit=leaf["offset"] + part),)))
        done.add(name)
    return regs


def _elementwise_map(op: str, config: AccelConfig, layout: data.StructLayout,
                     table: data.StructLayout) -> RegisterMap:
    from qaccel.rtl.elementwise.axis_top import layout_fields

    lane = [f"lane.{name}" for name, _ in layout["lane"].shape]
    types = type_lists(op, config)
    docs = {f"lane.{k}": f"index into {v}" for k, v in types.items()}
    docs |= {"lane.cast": "1: cast the quotient to `prec` before rounding (DirectML, "
                          "precision=)",
             "lane.saturate": "1: saturate float8 outputs (ONNX saturate=1)",
             "lane.use_zp": "1: subtract the zero point",
             "lane.wide": "1: int32 input with a zero point (wide subtraction)",
             "FORMAT": "The job's element types (indices into the instance's type lists), as "
                       "qaccel.sim.jobs writes them.",
             "count": "elements of the job"}
    dims = config.max_dims
    for k in range(dims):
        docs[f"size.{k}"] = f"scale-index dimension {k} (innermost first): its size"
        docs[f"stride.{k}"] = f"scale-index dimension {k}: index stride of its blocks"
        docs[f"block.{k}"] = f"scale-index dimension {k}: block length (1 or more)"
    regs = _job_registers(layout, {}, {"FORMAT": tuple(lane)}, docs, JOB_BASE)
    tfields = {f["name"]: f for f in layout_fields(table)}
    base = JOB_BASE + 4 * len(regs)
    base = -(-base // 16) * 16
    regs += [
        Register("TABLE_ADDR", base, "Scale-table entry the next commit writes.",
                 (Field("addr", 0, tfields["addr"]["width"], "rw", "entry index"),),
                 held=True),
        Register("TABLE_ZERO_POINT", base + 4, "Zero-point code of the next commit.",
                 (Field("zero_point", 0, tfields["zero_point"]["width"], "rw",
                        "the code, right-aligned"),), held=True),
        Register("TABLE_SCALE", base + 8, "Writing the scale code commits the entry "
                 "(TABLE_ADDR, TABLE_ZERO_POINT, this scale); the write completes when the "
                 "table has taken it.",
                 (Field("scale", 0, tfields["scale"]["width"], "wo", "the code"),),
                 stall=True, held=True),
    ]
    errors = _COMMON_ERRORS + [
        ("format", "a FORMAT index beyond the instance's type lists"),
        ("shape", "a BLOCK register of 0"),
        ("table_addr", f"a table entry at or past the table depth ({config.table_depth}); "
                       f"dropped"),
    ]
    notes = ("Job: write the job registers (values from `qaccel.sim.jobs`, "
             "`RegisterMap.job_writes`), load the table (the TABLE_* registers or the "
             "`s_axis_table` stream), write CTRL.start, stream `count` elements on "
             "`s_axis_x` and read `m_axis_y` (tlast on the job's last word).",
             "Type lists: " + "; ".join(f"{k}: {', '.join(v)}" for k, v in types.items()))
    return RegisterMap(f"qaccel_{op}", op,
                       tuple(_control_block(op, config, errors) + regs),
                       Shape.cast(layout).width, _crc(config, op), notes)


def type_lists(op: str, c: AccelConfig) -> dict[str, tuple[str, ...]]:
    """The type lists a Quantize / Dequantize core's FORMAT fields index, by field
    (:func:`qaccel.rtl.elementwise.axis_top.type_lists`)."""
    from qaccel.rtl.elementwise import axis_top

    return axis_top.type_lists(op, c)


def _nbits_map(config: AccelConfig, layout: data.StructLayout) -> RegisterMap:
    docs = {"k": f"K, the reduction length: 1..{config.max_k}",
            "block_size": f"a power of two, 16..{config.max_block_size}",
            "bits": f"weight bits: {', '.join(map(str, config.nbits))}",
            "m": "rows of A (M)", "groups": "column groups (see the engine's docs)",
            "bias": "1: the job has a bias (the b stream)",
            "out_fmt": "0 float32, 1 float16, 2 bfloat16",
            "fmode": ("0 the int8 path; 1 the float path; 3 the float path with float zero "
                      "points" if config.float_path else "0 (this instance has the int8 "
                                                         "path only)"),
            "MODE": "The job's weight bits, bias, output format and path."}
    regs = _job_registers(layout, {"block_size": "BLOCK_SIZE"},
                          {"MODE": ("bits", "bias", "out_fmt", "fmode")}, docs, JOB_BASE)
    errors = _COMMON_ERRORS + [
        ("bits", f"MODE.bits not among this instance's ({', '.join(map(str, config.nbits))})"),
        ("block_size", f"BLOCK_SIZE not a power of two in 16..{config.max_block_size}"),
        ("k", f"K of 0 or above {config.max_k}"),
        ("mode", "MODE.out_fmt 3, or an fmode this instance does not carry"),
        ("shape", "M or GROUPS of 0"),
    ]
    notes = ("Job: write the job registers (values from `qaccel.sim.nbits_jobs`, "
             "`RegisterMap.job_writes`), write CTRL.start, stream `a`, `w`, `s` (and `b`) as "
             "the engine takes them and read `m_axis_y` (tlast on the job's last word).",)
    return RegisterMap("qaccel_matmul_nbits", "matmul_nbits",
                       tuple(_control_block("matmul_nbits", config, errors) + regs),
                       Shape.cast(layout).width, _crc(config, "matmul_nbits"), notes)


def register_map(op: str, config: AccelConfig | None = None, *, unit=None) -> RegisterMap:
    """The register map of core ``op`` of ``config`` (default configuration if None).
    ``unit`` (the built Quantize / Dequantize unit or MatMulNBits engine) saves building
    one. Raises ValueError for an unknown ``op``."""
    if op not in OPS:
        raise ValueError(f"op must be one of {', '.join(OPS)}, not {op!r}")
    config = AccelConfig() if config is None else config
    if not isinstance(config, AccelConfig):
        raise TypeError(f"config must be an AccelConfig, not {config!r}")
    if unit is None:
        unit = _build_unit(op, config)
    layout = job_layout(unit)
    if op == "matmul_nbits":
        return _nbits_map(config, layout)
    table = unit.signature.members["table"].signature.members["payload"].shape
    return _elementwise_map(op, config, layout, table)


def _build_unit(op: str, config: AccelConfig):
    if op == "matmul_nbits":
        from qaccel.rtl.nbits.matmul_nbits_v2 import MatMulNBitsV2

        return MatMulNBitsV2(config)
    from qaccel.rtl.elementwise.dequantize import Dequantize
    from qaccel.rtl.elementwise.quantize import Quantize

    return (Quantize if op == "quantize" else Dequantize)(config)
