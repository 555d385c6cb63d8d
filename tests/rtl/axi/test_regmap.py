# amaranth: UnusedElaboratable=no
"""The register map table and what is generated from it: the access layer, the JSON round
trip, the C header (compiled), the Markdown reference, the byte-aligned stream layouts."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from qaccel.model.config import AccelConfig
from qaccel.rtl.axi.regmap import (
    CORE_ID,
    RegisterMap,
    byte_fields,
    register_map,
    tdata_bytes,
    to_tdata,
)
from qaccel.rtl.elementwise.quantize import Quantize
from qaccel.sim.jobs import quantize_job

OPS = ("quantize", "dequantize", "matmul_nbits")


@pytest.fixture(scope="module")
def maps():
    return {op: register_map(op) for op in OPS}


def test_layout(maps):
    for op, rmap in maps.items():
        offsets = [r.offset for r in rmap.registers]
        assert offsets == sorted(set(offsets)) and all(o % 4 == 0 for o in offsets), op
        for r in rmap.registers:
            used = 0
            for f in r.fields:
                assert f.lsb + f.width <= 32 and not used & f.mask, (op, r.name, f.name)
                used |= f.mask
        assert rmap["ID"].fields[0].reset == CORE_ID
        # every job bit belongs to one field
        bits = sorted(b for r in rmap.registers for f in r.fields if f.job_bit is not None
                      for b in range(f.job_bit, f.job_bit + f.width))
        assert bits == list(range(rmap.job_width)), op


def test_job_writes_round_trip(maps):
    c = AccelConfig()
    unit = Quantize(c)
    import numpy as np

    job = quantize_job(unit, np.float32([1, 2, 3]), np.float32([0.5, 1, 2]), None, axis=0)
    rmap = maps["quantize"]
    words = dict(rmap.job_writes(job.regs))
    back = 0
    for r in rmap.registers:
        for f in r.fields:
            if f.job_bit is not None:
                back |= ((words[r.offset] >> f.lsb) & ((1 << f.width) - 1)) << f.job_bit
    assert back == job.regs
    nb = maps["matmul_nbits"]
    w = dict(nb.job_writes({"k": 64, "block_size": 32, "bits": 4, "m": 3, "groups": 1,
                            "bias": 1, "out_fmt": 1, "fmode": 0}))
    assert nb.decode("MODE", w[nb["MODE"].offset]) == {"bits": 4, "bias": 1, "out_fmt": 1,
                                                        "fmode": 0}
    assert w[nb["K"].offset] == 64 and w[nb["BLOCK_SIZE"].offset] == 32
    with pytest.raises(KeyError, match="no job field 'kk'"):
        nb.job_writes({"kk": 1})
    with pytest.raises(ValueError, match="job field bits is 4 bits wide; 16 does not fit"):
        nb.job_writes({"bits": 16})
    with pytest.raises(ValueError, match=r"IRQ_ENABLE.done is 1 bits wide; 2 does not fit"):
        nb.encode("IRQ_ENABLE", done=2)
    with pytest.raises(KeyError, match="register CTRL has no field 'go'"):
        nb.encode("CTRL", go=1)


def test_json_round_trip(maps):
    for rmap in maps.values():
        again = RegisterMap.from_dict(json.loads(json.dumps(rmap.to_dict())))
        assert again == rmap


def test_markdown(maps):
    text = maps["quantize"].markdown()
    for r in maps["quantize"].registers:
        assert f"| 0x{r.offset:03X} | `{r.name}` |" in text
    assert "SLVERR" in text and "Type lists: x_fmt: float32" in text


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_c_header_compiles(maps, tmp_path):
    """Every map's header, included together, compiles with -Wall -Werror; a program
    built from it prints the offsets and masks the map has."""
    for rmap in maps.values():
        (tmp_path / f"{rmap.module}_regs.h").write_text(rmap.c_header())
    prog = tmp_path / "t.c"
    prog.write_text("\n".join([
        *[f'#include "qaccel_{op}_regs.h"' for op in OPS],
        "#include <stdio.h>",
        "int main(void) {",
        '  printf("%x %x %x %x\\n", QACCEL_QUANTIZE_TABLE_SCALE,',
        "         QACCEL_MATMUL_NBITS_MODE_BITS_MASK, QACCEL_DEQUANTIZE_ID_VALUE,",
        "         QACCEL_QUANTIZE_CONFIG_CRC);",
        "  return 0;", "}"]))
    subprocess.run(["cc", "-std=c99", "-Wall", "-Werror", "-o", str(tmp_path / "t"),
                    str(prog)], check=True, cwd=tmp_path)
    out = subprocess.run([str(tmp_path / "t")], capture_output=True, text=True,
                         check=True).stdout.split()
    assert [int(v, 16) for v in out] == [
        maps["quantize"]["TABLE_SCALE"].offset, maps["matmul_nbits"]["MODE"].field("bits").mask,
        CORE_ID, maps["quantize"].config_crc]


def test_config_crc_tracks_the_configuration():
    a = register_map("matmul_nbits")
    b = register_map("matmul_nbits", AccelConfig(max_k=2048))
    assert a.config_crc != b.config_crc
    assert register_map("quantize").config_crc == register_map("dequantize").config_crc


def test_byte_fields_and_tdata():
    from amaranth.hdl import unsigned
    from amaranth.lib import data

    layout = data.StructLayout({"addr": unsigned(10), "scale": unsigned(32),
                                "zero_point": unsigned(12)})
    fields = byte_fields(layout)
    assert [(f["name"], f["offset"], f["byte_offset"]) for f in fields] == [
        ("addr", 0, 0), ("scale", 10, 16), ("zero_point", 42, 48)]
    assert tdata_bytes(fields) == 8
    payload = 0x2AB | (0xDEADBEEF << 10) | (0xFED << 42)
    assert to_tdata(fields, payload) == 0x2AB | (0xDEADBEEF << 16) | (0xFED << 48)
    assert to_tdata(fields, {"addr": 0x2AB, "scale": 0xDEADBEEF, "zero_point": 0xFED}) == \
        to_tdata(fields, payload)
    with pytest.raises(ValueError, match="field addr is 10 bits wide; 1024 does not fit"):
        to_tdata(fields, {"addr": 1024, "scale": 0, "zero_point": 0})


def test_bad_arguments():
    with pytest.raises(ValueError, match="op must be one of quantize, dequantize, "
                                         "matmul_nbits, not 'matmul'"):
        register_map("matmul")
    with pytest.raises(TypeError, match="config must be an AccelConfig, not 3"):
        register_map("quantize", 3)
