"""The board driver: ONNX operators on the cores ``qaccel bitstream`` puts on a board, over the
host link, with the golden model's arguments and results."""

from __future__ import annotations

import json
import os
from functools import cached_property

import numpy as np

from qaccel.board.protocol import HostLink, LinkError
from qaccel.model.config import AccelConfig
from qaccel.rtl.axi.regmap import CORE_ID, OPS, RegisterMap, to_tdata

__all__ = ["Board"]


def _array(raw: bytes, dtype_name: str, shape) -> np.ndarray:
    """The tensor ONNX stores as ``raw`` (sub-byte types packed, low nibble first)."""
    from onnx import helper, numpy_helper

    from qaccel.model.dtypes import FLOAT_TYPES, QTYPES

    dtype = QTYPES[dtype_name].dtype if dtype_name in QTYPES else FLOAT_TYPES[dtype_name]
    tensor = helper.make_tensor("y", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
                                list(shape), raw, raw=True)
    return numpy_helper.to_array(tensor)


class Board:
    """The cores of a board top (:class:`qaccel.rtl.axi.host_top.HostTop`) over ``transport``
    (pyserial's ``Serial`` from :func:`qaccel.board.link.open_serial`, or
    :class:`qaccel.sim.uart_link.UartTransport` in simulation). ``description`` is the top's
    :meth:`~qaccel.rtl.axi.host_top.HostTop.describe` (``qaccel bitstream`` writes it as
    ``board.json`` beside the bitstream).

    :meth:`quantize_linear`, :meth:`dequantize_linear` and :meth:`matmul_nbits` take the
    arguments of :mod:`qaccel.model` and return its results, bit for bit. Each call checks
    the core's ERROR and STATUS afterwards (LinkError with the flags set).
    """

    def __init__(self, transport, description: dict, *, timeout: float = 10.0):
        self.description = description
        streams = {name: (s["id"], s["bytes"]) for name, s in description["streams"].items()}
        self.link = HostLink(transport, streams, description["y_bytes"],
                             rx_fifo=description["rx_fifo"], timeout=timeout)
        self.config = AccelConfig.from_dict(description["config"])
        self.cores = description["cores"]
        self.maps = {op: RegisterMap.from_dict(c["register_map"]) for op, c in self.cores.items()}

    @classmethod
    def open(cls, port: str, description: str | os.PathLike, *, baud: int | None = None,
             timeout: float = 10.0) -> Board:
        """The board on serial ``port`` whose top ``description`` (a ``board.json``) gives."""
        from qaccel.board.link import DEFAULT_BAUD, open_serial

        with open(description) as f:
            desc = json.load(f)
        return cls(open_serial(port, baud or DEFAULT_BAUD), desc, timeout=timeout)

    # -- registers ---------------------------------------------------------------------------

    def _core(self, op: str) -> tuple[int, RegisterMap]:
        if op not in self.cores:
            raise ValueError(f"this board has no {op} core (it has "
                             f"{', '.join(self.cores)})")
        return self.cores[op]["base"], self.maps[op]

    def write(self, op: str, register: str, value: int) -> None:
        base, rmap = self._core(op)
        self.link.write32(base + rmap[register].offset, value)

    def read(self, op: str, register: str) -> dict[str, int]:
        """The fields of ``register`` of core ``op``."""
        base, rmap = self._core(op)
        return rmap.decode(register, self.link.read32(base + rmap[register].offset))

    def check(self) -> None:
        """Each core answers with the qaccel ID, its operator and this configuration's CRC;
        LinkError naming the difference otherwise."""
        for op in self.cores:
            base, rmap = self._core(op)
            ident = self.link.read32(base + rmap["ID"].offset)
            if ident != CORE_ID:
                raise LinkError(f"{op} core at {base:#06x}: ID reads {ident:#010x}, not "
                                f"{CORE_ID:#010x} (is the bitstream loaded?)")
            version = self.read(op, "VERSION")
            if version["op"] != OPS[op]:
                raise LinkError(f"the core at {base:#06x} is operator {version['op']}, not "
                                f"{op} ({OPS[op]})")
            crc = self.link.read32(base + rmap["CONFIG"].offset)
            if crc != rmap.config_crc:
                raise LinkError(f"{op} core: configuration CRC {crc:#010x}, the description's "
                                f"is {rmap.config_crc:#010x} (another bitstream?)")

    def _start(self, op: str, job_regs) -> None:
        base, rmap = self._core(op)
        if any(self.read(op, "ERROR").values()):
            raise LinkError(f"{op}: ERROR flags set before the job: {self.read(op, 'ERROR')}")
        for offset, word in rmap.job_writes(job_regs):
            self.link.write32(base + offset, word)

    def _finish(self, op: str) -> None:
        errors = {k: v for k, v in self.read(op, "ERROR").items() if v}
        status = self.read(op, "STATUS")
        if errors or status["busy"] or not status["done"]:
            raise LinkError(f"{op}: the job ended with STATUS {status}, ERROR {errors}")

    def _output(self) -> bytes:
        beats = self.link.receive()
        return b"".join(b.kept_bytes(self.description["y_bytes"]) for b in beats)

    # -- elementwise ----------------------------------------------------------------------------

    @cached_property
    def _units(self) -> dict:
        from qaccel.rtl.elementwise.dequantize import Dequantize
        from qaccel.rtl.elementwise.quantize import Quantize

        return {"quantize": Quantize(self.config), "dequantize": Dequantize(self.config)}

    def _elementwise(self, op: str, job) -> np.ndarray:
        streams = self.cores[op]["streams"]
        self._start(op, job.regs)
        table = streams["table"]["fields"]
        self.link.send(f"{op}_table", [to_tdata(table, {"addr": a, "scale": s,
                                                        "zero_point": z})
                                       for a, s, z in job.table])
        self.write(op, "CTRL", self.maps[op].encode("CTRL", start=1))
        if job.count:
            xf = streams["x"]["fields"]
            self.link.send(f"{op}_x", [to_tdata(xf, b) for b in job.x])
            raw = self._output()
        else:
            raw = b""
        self._finish(op)
        return _array(raw, job.out_dtype, job.shape)

    def quantize_linear(self, x, y_scale, y_zero_point=None, **kwargs) -> np.ndarray:
        """:func:`qaccel.model.quant.quantize_linear` on the board's Quantize core."""
        from qaccel.sim.jobs import quantize_job

        self._core("quantize")
        job = quantize_job(self._units["quantize"], x, y_scale, y_zero_point, expect=False,
                           **kwargs)
        return self._elementwise("quantize", job)

    def dequantize_linear(self, x, x_scale, x_zero_point=None, **kwargs) -> np.ndarray:
        """:func:`qaccel.model.quant.dequantize_linear` on the board's Dequantize core."""
        from qaccel.sim.jobs import dequantize_job

        self._core("dequantize")
        job = dequantize_job(self._units["dequantize"], x, x_scale, x_zero_point,
                             expect=False, **kwargs)
        return self._elementwise("dequantize", job)

    # -- MatMulNBits ----------------------------------------------------------------------------

    def matmul_nbits(self, A, B, scales, zero_points=None, g_idx=None, bias=None, *, K, N,
                     bits, block_size, accuracy_level=4) -> np.ndarray:
        """:func:`qaccel.model.nbits.matmul_nbits` on the board's MatMulNBits core. The
        streams go in the order the engine takes them: per row tile its rows of A, then per
        column group its biases and, block by block, the block's scales then weight steps
        (the top's stream FIFOs hold a block ahead)."""
        from qaccel.sim.nbits_jobs import nbits_job_v2, unpack_y_v2

        self._core("matmul_nbits")
        job = nbits_job_v2(A, B, scales, zero_points, g_idx, bias, K=K, N=N, bits=bits,
                           block_size=block_size, accuracy_level=accuracy_level,
                           config=self.config, expect=False)
        fields = self.cores["matmul_nbits"]["streams"]
        beats = {s: [to_tdata(fields[s]["fields"],
                              int.from_bytes(np.asarray(b, "<u8").tobytes(), "little"))
                     for b in job.inputs[s]] for s in job.inputs}
        tiles, groups, kb = job.meta["tiles"], job.regs["groups"], job.meta["k_blocks"]

        def chunks(stream: str, parts: int) -> list[list[int]]:
            seq = beats.get(stream, [])
            if len(seq) % parts:
                raise AssertionError(f"stream {stream}: {len(seq)} beats in {parts} parts")
            n = len(seq) // parts
            return [seq[k * n:(k + 1) * n] for k in range(parts)]

        a = chunks("a", tiles)
        b = chunks("b", tiles * groups) if "b" in beats else None
        s = chunks("s", tiles * groups * kb)
        w = chunks("w", tiles * groups * kb)
        self._start("matmul_nbits", job.regs)
        self.write("matmul_nbits", "CTRL", self.maps["matmul_nbits"].encode("CTRL", start=1))
        for t in range(tiles):
            self.link.send("matmul_nbits_a", a[t])
            for g in range(groups):
                if b is not None:
                    self.link.send("matmul_nbits_b", b[t * groups + g])
                for k in range(kb):
                    at = (t * groups + g) * kb + k
                    self.link.send("matmul_nbits_s", s[at])
                    if w[at]:
                        self.link.send("matmul_nbits_w", w[at])
        raw = self._output()
        self._finish("matmul_nbits")
        words = np.frombuffer(raw, "<u4")
        if len(words) != len(job.order):
            raise LinkError(f"matmul_nbits: {len(words)} output words, expected "
                            f"{len(job.order)}")
        return unpack_y_v2(job, words.astype(np.uint32))
