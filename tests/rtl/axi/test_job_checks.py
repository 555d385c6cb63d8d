# amaranth: UnusedElaboratable=no
"""The job checks AxiCore makes at CTRL.start (each ERROR flag), against the instance's
configuration, in Amaranth's simulator: every MatMulNBits flag at its edges, the Quantize
and Dequantize type-index and block checks."""

from __future__ import annotations

import pytest
from amaranth.hdl import Module, Signal
from amaranth.sim import Simulator

from qaccel.model.config import AccelConfig
from qaccel.rtl.axi.axi_core import AxiCore


def _flags(core: AxiCore, jobs: list[dict]) -> list[set[str]]:
    """The ERROR flags each job (job field values) raises."""
    rmap = core.regmap
    job = Signal(rmap.job_width)
    checks = core._checks(job)
    outs = {name: Signal(name=name) for name in checks}
    m = Module()
    m.d.comb += [outs[n].eq(v) for n, v in checks.items()]
    sim = Simulator(m)
    seen = []

    async def bench(ctx):
        for fields in jobs:
            value = 0
            for reg in rmap.registers:
                for f in reg.fields:
                    if f.job_bit is not None and f.name in fields:
                        value |= fields[f.name] << f.job_bit
            ctx.set(job, value)
            seen.append({n for n, s in outs.items() if ctx.get(s)})

    sim.add_testbench(bench)
    sim.run()
    return seen


@pytest.mark.parametrize("float_path", [False, True])
def test_matmul_nbits_checks(float_path):
    config = AccelConfig(nbits=(2, 4, 8), max_k=1024, max_block_size=64,
                         float_path=float_path, m_tile=4)
    core = AxiCore("matmul_nbits", config)
    good = {"k": 64, "block_size": 32, "bits": 4, "m": 1, "groups": 1, "fmode": 0,
            "out_fmt": 0}
    cases = [
        ({}, set()),
        ({"bits": 3}, {"bits"}), ({"bits": 8}, set()), ({"bits": 2}, set()),
        ({"bits": 0}, {"bits"}),
        ({"block_size": 8}, {"block_size"}), ({"block_size": 16}, set()),
        ({"block_size": 64}, set()), ({"block_size": 128}, {"block_size"}),
        ({"block_size": 48}, {"block_size"}),
        ({"k": 0}, {"k"}), ({"k": 1024}, set()), ({"k": 1025}, {"k"}),
        ({"out_fmt": 2}, set()), ({"out_fmt": 3}, {"mode"}),
        ({"fmode": 1}, set() if float_path else {"mode"}),
        ({"fmode": 3}, set() if float_path else {"mode"}), ({"fmode": 2}, {"mode"}),
        ({"m": 0}, {"shape"}), ({"groups": 0}, {"shape"}),
        ({"bits": 5, "k": 0}, {"bits", "k"}),
    ]
    got = _flags(core, [{**good, **change} for change, _ in cases])
    assert got == [want for _, want in cases]


@pytest.mark.parametrize("op", ["quantize", "dequantize"])
def test_elementwise_checks(op):
    config = AccelConfig(q_outputs=("int8", "uint8", "int4"), dq_inputs=("int8", "int4", "uint4"),
                         max_dims=2, table_depth=64)
    core = AxiCore(op, config)
    outs = "out_fmt" if op == "quantize" else "x_fmt"
    good = {"block0": 1, "block1": 1}
    cases = [({}, set()), ({outs: 2}, set()), ({outs: 3}, {"format"}),
             ({"block0": 0}, {"shape"}), ({"block1": 0, outs: 3}, {"shape", "format"})]
    got = _flags(core, [{**good, **change} for change, _ in cases])
    assert got == [want for _, want in cases]
