"""cocotb system testbench of :class:`qaccel.rtl.axi.axi_core.AxiCore`, driven only through its
AXI4-Lite and AXI4-Stream ports with standard verification IP (cocotbext-axi's
AxiLiteMaster, AxiStreamSource and AxiStreamSink, with pauses).

Parameters (``qaccel.sim.tbconfig.params()``, made by tests/rtl/axi/test_axi_core.py):
``register_map`` (:meth:`RegisterMap.to_dict`), ``inputs`` (the input streams in order),
``jobs`` (each: ``writes`` (offset, word) for its job registers, ``table`` entries
(addr, scale, zero point) or none, ``streams`` (per stream, its beats as hex ``tdata``),
``y`` (the expected output bytes, hex), ``y_beats``, ``real`` (per 4-byte word, whether it
is compared; None: every byte) and ``table_by`` ("lite" or "stream")), ``bad_writes`` (a
job error: (offset, word) writes and the ERROR field it must set), ``seed``.
"""

from __future__ import annotations

import itertools
import logging
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, FallingEdge, RisingEdge, with_timeout
from cocotbext.axi import (
    AxiLiteBus,
    AxiLiteMaster,
    AxiStreamBus,
    AxiStreamFrame,
    AxiStreamSink,
    AxiStreamSource,
)

from qaccel.rtl.axi.regmap import CORE_ID, MAP_VERSION, OPS, RegisterMap
from qaccel.sim import tbconfig

log = logging.getLogger("cocotb.qaccel.tb_axi_core")

OKAY, SLVERR = 0, 2


def _pauses(rng: random.Random, probability: float, max_burst: int):
    """A cocotbext-axi pause generator: bursts of up to ``max_burst`` paused cycles."""
    while True:
        if rng.random() < probability:
            yield from itertools.repeat(True, rng.randint(1, max_burst))
        else:
            yield False


class Harness:
    def __init__(self, dut, params):
        self.dut = dut
        self.p = params
        self.map = RegisterMap.from_dict(params["register_map"])
        self.rng = random.Random(params.get("seed", 1))
        Clock(dut.aclk, 10, unit="ns").start(start_high=False)
        self.axil = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axil"), dut.aclk,
                                  dut.aresetn, reset_active_level=False)
        self.sources = {s: AxiStreamSource(AxiStreamBus.from_prefix(dut, f"s_axis_{s}"),
                                           dut.aclk, dut.aresetn, reset_active_level=False)
                        for s in params["inputs"]}
        self.sink = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis_y"), dut.aclk,
                                  dut.aresetn, reset_active_level=False)
        for s in self.sources.values():
            s.log.setLevel(logging.WARNING)
        self.sink.log.setLevel(logging.WARNING)
        # the first input stream's transfer cycles and the first y word's, per run
        self.first = params["inputs"][-1] if "x" in params["inputs"] else params["inputs"][0]
        self.in_cycles: list[int] = []
        self.y_cycle: int | None = None
        self.start_cycle: int | None = None
        cocotb.start_soon(self._watch())

    async def _watch(self):
        dut, cycle = self.dut, 0
        tvalid = getattr(dut, f"s_axis_{self.first}_tvalid")
        tready = getattr(dut, f"s_axis_{self.first}_tready")
        while True:
            await RisingEdge(dut.aclk)
            cycle += 1
            if tvalid.value == 1 and tready.value == 1 and len(self.in_cycles) < 64:
                self.in_cycles.append(cycle)
            if dut.m_axis_y_tvalid.value == 1 and self.y_cycle is None:
                self.y_cycle = cycle
            if (dut.s_axil_awvalid.value == 1 and dut.s_axil_awready.value == 1
                    and int(dut.s_axil_awaddr.value) == self.offset("CTRL")):
                self.start_cycle = cycle

    async def reset(self):
        self.dut.aresetn.value = 0
        await ClockCycles(self.dut.aclk, 4)
        await FallingEdge(self.dut.aclk)
        self.dut.aresetn.value = 1
        await RisingEdge(self.dut.aclk)

    def pause(self, probability: float, max_burst: int = 4) -> None:
        for s in self.sources.values():
            s.set_pause_generator(_pauses(self.rng, probability, max_burst))
        self.sink.set_pause_generator(_pauses(self.rng, probability, max_burst))

    def offset(self, register: str) -> int:
        return self.map[register].offset

    async def write(self, register: str | int, word: int, resp: int = OKAY) -> None:
        at = self.offset(register) if isinstance(register, str) else register
        r = await self.axil.write(at, int(word).to_bytes(4, "little"))
        assert r.resp == resp, f"write {register} ({at:#x}): resp {r.resp}, expected {resp}"

    async def read(self, register: str | int, resp: int = OKAY) -> int:
        at = self.offset(register) if isinstance(register, str) else register
        r = await self.axil.read(at, 4)
        assert r.resp == resp, f"read {register} ({at:#x}): resp {r.resp}, expected {resp}"
        return int.from_bytes(r.data, "little")

    async def fields(self, register: str) -> dict[str, int]:
        return self.map.decode(register, await self.read(register))

    async def load(self, job: dict) -> None:
        """The job registers, then the table (registers or stream)."""
        for at, word in job["writes"]:
            await self.write(at, word)
        if not job.get("table"):
            return
        if job["table_by"] == "lite":
            for addr, scale, zp in job["table"]:
                await self.write("TABLE_ADDR", addr)
                await self.write("TABLE_ZERO_POINT", zp)
                await self.write("TABLE_SCALE", scale)
        else:
            self._send("table", job["table_tdata"])
            await self.sources["table"].wait()

    def _send(self, stream: str, beats: list[str]) -> None:
        width = len(self.sources[stream].bus.tdata) // 8
        data = b"".join(int(b, 16).to_bytes(width, "little") for b in beats)
        self.sources[stream].send_nowait(AxiStreamFrame(data))

    async def run(self, job: dict, *, timeout_us: float = 2000) -> bytes:
        """Start ``job`` (loaded), stream its inputs, return the output frame's bytes."""
        self.in_cycles, self.y_cycle = [], None
        for s, beats in job["streams"].items():     # offered before the start: not taken
            if beats:
                self._send(s, beats)
        await ClockCycles(self.dut.aclk, 4)
        assert not self.in_cycles, f"{self.first} taken before the start"
        await self.write("CTRL", self.map.encode("CTRL", start=1))
        frame = await with_timeout(self.sink.recv(), timeout_us, "us")
        return bytes(frame.tdata)

    async def wait_idle(self, limit: int = 100000) -> None:
        for _ in range(limit // 8):
            if not (await self.fields("STATUS"))["busy"]:
                return
        raise AssertionError("STATUS.busy did not fall")

    def check_output(self, job: dict, got: bytes, what: str) -> None:
        want = bytes.fromhex(job["y"])
        assert len(got) == len(want), f"{what}: {len(got)} output bytes, expected {len(want)}"
        if job.get("real") is None:
            bad = [k for k in range(len(want)) if got[k] != want[k]]
        else:
            bad = [k for k, real in enumerate(job["real"])
                   if real and got[4 * k:4 * k + 4] != want[4 * k:4 * k + 4]]
        assert not bad, f"{what}: {len(bad)} mismatches, first at {bad[0]}"

    async def complete(self, job: dict, what: str) -> None:
        """Run ``job`` to its end: output, done, interrupt, counters."""
        got = await self.run(job)
        self.check_output(job, got, what)
        await self.wait_idle()
        status = await self.fields("STATUS")
        assert status == {"busy": 0, "done": 1, "error": 0}, f"{what}: STATUS {status}"
        assert await self.read("Y_BEATS") == job["y_beats"], what
        cycles = await self.read("CYCLES")
        assert cycles >= job["y_beats"], f"{what}: CYCLES {cycles}"
        tbconfig.record(what, cycles=cycles, y_beats=job["y_beats"],
                        input_cycles=self.in_cycles, y_cycle=self.y_cycle,
                        start_cycle=self.start_cycle)


async def _setup(dut) -> Harness:
    h = Harness(dut, tbconfig.params())
    await h.reset()
    return h


@cocotb.test()
async def identification(dut):
    """ID, VERSION and CONFIG read as the register map says; an unmapped address answers
    SLVERR, reading and writing."""
    h = await _setup(dut)
    assert await h.read("ID") == CORE_ID
    version = await h.fields("VERSION")
    assert version == {"map": MAP_VERSION, "op": OPS[h.map.op]}, version
    assert await h.read("CONFIG") == h.map.config_crc
    unmapped = h.map.span + 0x100
    await h.read(unmapped, resp=SLVERR)
    await h.write(unmapped, 1, resp=SLVERR)
    assert await h.read("ERROR") == 0


@cocotb.test()
async def jobs_with_pauses(dut):
    """Every job, back to back, its table loaded as the job says, with pauses on every stream
    (none for the first job): the output byte for byte, STATUS.done, Y_BEATS, CYCLES and the
    done interrupt (enabled, then cleared)."""
    h = await _setup(dut)
    await h.write("IRQ_ENABLE", h.map.encode("IRQ_ENABLE", done=1, error=1))
    for k, job in enumerate(h.p["jobs"]):
        h.pause(0.0 if k == 0 else 0.3)
        await h.load(job)
        await h.complete(job, f"job {k}")
        await RisingEdge(dut.aclk)
        assert dut.irq.value == 1, f"job {k}: no interrupt"
        assert (await h.fields("IRQ_STATUS"))["done"] == 1
        await h.write("IRQ_STATUS", h.map.encode("IRQ_STATUS", done=1))
        await ClockCycles(dut.aclk, 2)
        assert dut.irq.value == 0, f"job {k}: interrupt after clearing"


@cocotb.test()
async def bad_job_then_recovery(dut):
    """A job the instance does not carry: start sets its ERROR flag, raises the error
    interrupt and starts nothing; after clearing, a good job runs exactly."""
    h = await _setup(dut)
    await h.write("IRQ_ENABLE", h.map.encode("IRQ_ENABLE", error=1))
    good = h.p["jobs"][0]
    await h.load(good)
    for at, word in h.p["bad_writes"]["writes"]:
        await h.write(at, word)
    await h.write("CTRL", h.map.encode("CTRL", start=1))
    await ClockCycles(dut.aclk, 3)
    flag = h.p["bad_writes"]["error"]
    errors = await h.fields("ERROR")
    assert errors[flag] == 1 and sum(errors.values()) == 1, errors
    assert await h.fields("STATUS") == {"busy": 0, "done": 0, "error": 1}
    assert dut.irq.value == 1
    assert h.sink.empty() and await h.read("Y_BEATS") == 0
    await h.write("ERROR", h.map.encode("ERROR", **{flag: 1}))
    await h.write("IRQ_STATUS", h.map.encode("IRQ_STATUS", error=1))
    assert await h.read("ERROR") == 0
    await h.load(good)
    await h.complete(good, "recovered job")


@cocotb.test()
async def held_while_busy(dut):
    """While a job runs (its output held back): a job-register write answers SLVERR and is
    ignored, a second start is refused, both flagged; the job's output is still exact."""
    h = await _setup(dut)
    job = h.p["jobs"][0]
    await h.load(job)
    h.sink.pause = True
    await h.write("CTRL", h.map.encode("CTRL", start=1))
    assert (await h.fields("STATUS"))["busy"] == 1
    first_at, first_word = job["writes"][0]
    await h.write(first_at, first_word ^ 1, resp=SLVERR)
    await h.write("CTRL", h.map.encode("CTRL", start=1))
    errors = await h.fields("ERROR")
    assert errors["locked_write"] == 1 and errors["start_busy"] == 1, errors
    assert await h.read(first_at) == first_word
    for s, beats in job["streams"].items():
        if beats:
            h._send(s, beats)
    h.sink.pause = False
    got = bytes((await with_timeout(h.sink.recv(), 2000, "us")).tdata)
    h.check_output(job, got, "job under held writes")
    await h.write("ERROR", h.map.encode("ERROR", locked_write=1, start_busy=1))


@cocotb.test()
async def soft_reset_aborts(dut):
    """CTRL.reset during a job (part of its input sent, its output held back): busy falls,
    no done, and the next job is exact."""
    h = await _setup(dut)
    job = h.p["jobs"][0]
    await h.load(job)
    h.sink.pause = True
    await h.write("CTRL", h.map.encode("CTRL", start=1))
    first = h.p["inputs"][-1] if h.map.op != "matmul_nbits" else "a"
    beats = job["streams"][first]
    h._send(first, beats[:max(1, len(beats) // 2)])
    await h.sources[first].wait()
    await ClockCycles(dut.aclk, 20)
    await h.write("CTRL", h.map.encode("CTRL", reset=1))
    await ClockCycles(dut.aclk, 4)
    assert await h.fields("STATUS") == {"busy": 0, "done": 0, "error": 0}
    h.sink.pause = False
    await ClockCycles(dut.aclk, 20)
    assert h.sink.empty(), "output after the reset"
    await h.load(job)
    await h.complete(job, "job after reset")
