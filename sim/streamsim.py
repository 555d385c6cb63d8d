"""Run ``amaranth.lib.stream`` handshakes through a component's Verilog with Verilator, no cocotb.

The cocotb testbenches act in Python every cycle (a few thousand beats per second);
:class:`StreamSim` generates a Verilator C++ loop that drives and checks the streams itself, so
a run costs what the Verilated model costs, for long runs and for the RTL engine::

    sim = StreamSim(PlusN(), name="plus_n")
    r = sim.run({"i": np.arange(1000)}, until_idle=None, expect={"o": 1000},
                idle=0.3, backpressure=0.3)
    r.outputs["o"], r.output_cycles["o"], r.accepted["i"], r.cycles

:class:`StreamSim` is a :class:`~qaccel.sim.vectors.VectorSim` (same build cache, ccache, file
lock and port conventions; build directory ``<build root>/<name>-stream-<hash>/``) whose loop
knows the stream ports ``<name>__payload``, ``<name>__valid`` and ``<name>__ready`` (payloads up
to :data:`~qaccel.sim.vectors.MAX_WIDTH` bits, wide ones as ``(n, words)`` ``uint64`` arrays
least significant word first, or as lists of Python ints).

Cycle contract:

* ``rst`` is held high for ``reset_cycles`` cycles with every input at 0. Cycle 0 is the first
  rising clock edge after that; "a transfer in cycle ``t``" means ``valid & ready`` just before
  edge ``t``.
* A run is a list of :class:`Segment` s, back to back in one process (:meth:`StreamSim.
  run_segments`; :meth:`StreamSim.run` runs one). In a segment's first cycle its ``static``
  ports take their values (ports not named: 0) and hold them to the segment's end.
* Input streams are fed in *phases*: phase ``k + 1`` begins in the cycle after the last beat
  of phase ``k`` was accepted. A phase lists input streams, fed concurrently, and 1-bit plain
  input ports, raised for exactly the phase's first cycle (a *pulse*, e.g. ``start``). Without
  ``phases`` every given stream is in one phase (all concurrently). ``pulses`` raise 1-bit
  ports for exactly one cycle at a cycle counted from the segment's first cycle.
* A driver follows the stream rules: ``valid`` stays high with a stable payload until the beat
  is accepted; before offering each beat it stays idle while a draw with probability ``idle``
  succeeds (a geometric number of idle cycles, at least one with probability ``idle``). Every
  output stream's ``ready`` is withheld with probability ``backpressure`` per cycle. The draws
  come from a xorshift64* generator seeded by ``seed``, so a run is reproducible.
* The segment is *done* in the first cycle in which every phase and pulse was completed in an
  earlier cycle, each output stream in ``expect`` has received that many beats, and the 1-bit
  output ``until_idle`` (if not None) is low. ``drain`` more cycles follow (outputs are still
  received, so a spurious late beat shows up in the result); the next segment begins after.
* Checks, which end the run with :exc:`StreamProtocolError`: once an output stream's ``valid``
  is high without ``ready``, ``valid`` must stay high and the payload stable until the
  transfer. A watchdog ends it with :exc:`StreamStallError` when an input stream with beats
  left, an output stream with ``valid`` high or with beats still expected, or the ``until_idle``
  flag after the last input beat, sees no handshake for ``watchdog`` cycles, and at
  ``max_cycles``; the message names each stalled stream with its ``valid``/``ready`` state.

:func:`run_elementwise_fast` runs :class:`~qaccel.sim.jobs.Job` s on a Quantize or Dequantize
unit this way (one segment per job, all jobs in one process) and :func:`check_jobs` compares
what the RTL produced with the jobs' expected beats.

Files exchanged with the loop (all 64-bit little-endian words): the configuration holds a
header (``_HEADER`` fields), one record per segment (phase count, static words, per input
stream beat count / phase / word offset, per output stream the expected count, pulses as
(port, cycle or ``-1 - phase``) pairs) and the beat data; the result holds per segment its
start, done and end cycles and transfer counts, then per output stream the payload words and
cycles, then per input stream the accept cycles.

Speed (2-core machine, measured in CPU seconds of the loop because 3 other agents shared it):
the loop itself takes under 5% of the time; the rest is the model's ``eval``. A small block (two
16/100-bit "+ n" channels with FIFOs) runs 4-7M cycles per CPU second, at one beat per cycle
with 300k beats 1.3M beats per wall second on the loaded machine. The Quantize unit with
``lanes=2`` and float32 to int8/uint4 runs 0.5-0.7M cycles (1-1.4M elements) per CPU second,
0.15M beats per wall second loaded. Python adds about 40 ms per 100k beats (encoding, results
as ints); the build as :class:`VectorSim`'s (the Quantize unit: 12 s of Verilog emission
loaded, about 40 s cold Verilator build).
"""

from __future__ import annotations

import operator
import os
import shutil
import string
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from amaranth.lib import wiring

from qaccel.model.validate import check_int
from qaccel.rtl.elementwise import Elementwise
from qaccel.sim.elementwise_sim import design_key, table_fields
from qaccel.sim.jobs import Job
from qaccel.sim.runner import SimulationError
from qaccel.sim.vectors import (
    _CLOCK,
    _EXE,
    _RESET,
    MAX_WIDTH,
    RESET_CYCLES,
    Port,
    RunStats,
    VectorSim,
    _as_column,
    _loop_ports,
)

__all__ = [
    "DRAIN",
    "WATCHDOG",
    "JobResult",
    "Segment",
    "StreamProtocolError",
    "StreamResult",
    "StreamSim",
    "StreamStallError",
    "check_jobs",
    "elementwise_sim",
    "run_elementwise_fast",
]

#: Cycles run after a segment is done (see the module notes).
DRAIN = 8
#: Cycles without a handshake on a stream that is owed one before the run fails.
WATCHDOG = 10_000
#: Default ``max_cycles``: this many plus :data:`_CYCLES_PER_BEAT` per input beat.
_BASE_CYCLES = 10_000_000
_CYCLES_PER_BEAT = 1_000
#: Bump when the generated loop changes, so stale builds are not reused.
_LOOP_VERSION = 1
_MAGIC = 0x5354524D
_EXIT_STALL, _EXIT_PROTOCOL = 3, 4
_SOURCE = "streams_main.cpp"
#: Configuration header, after the magic word and the port counts.
_HEADER = ("segments", "seed", "idle", "backpressure", "watchdog", "max_cycles",
           "reset_cycles", "drain", "idle_flag", "data_start")


class StreamStallError(SimulationError):
    """A stream owed a handshake saw none for ``watchdog`` cycles, or ``max_cycles`` passed; the
    message names the stalled streams and their ``valid``/``ready`` state."""


class StreamProtocolError(SimulationError):
    """An output stream broke the stream rules (``valid`` fell, or the payload changed, before
    the transfer); the message names the stream, the cycle and the values."""


@dataclass(frozen=True)
class _Stream:
    """The ports of one stream interface; ``direction`` is that of the stream (``valid``)."""

    name: str
    direction: str
    valid: Port
    ready: Port
    payload: Port | None

    @property
    def width(self) -> int:
        return 0 if self.payload is None else self.payload.width

    @property
    def words(self) -> int:
        return 0 if self.payload is None else self.payload.words


def _classify(ports: Mapping[str, Port]) -> tuple[list[_Stream], list[_Stream], list[Port],
                                                 list[Port]]:
    """Return (input streams, output streams, static inputs, 1-bit plain outputs)."""
    streams = []
    for name, valid in ports.items():
        if not name.endswith("__valid") or valid.width != 1:
            continue
        base = name[: -len("__valid")]
        ready = ports.get(f"{base}__ready")
        payload = ports.get(f"{base}__payload")
        if (ready is None or ready.width != 1 or ready.direction == valid.direction
                or valid.direction not in ("input", "output")):
            continue
        if payload is not None and payload.direction != valid.direction:
            continue
        if payload is not None and payload.width > MAX_WIDTH:
            raise ValueError(f"stream {base!r} has a {payload.width}-bit payload; the stream "
                             f"loop supports payloads up to {MAX_WIDTH} bits")
        streams.append(_Stream(base, valid.direction, valid, ready, payload))
    members = {p.name for s in streams for p in (s.valid, s.ready, s.payload) if p is not None}
    loop_in, loop_out = _loop_ports(ports.values())
    statics = [p for p in loop_in if p.name not in members]
    flags = [p for p in loop_out if p.name not in members and p.width == 1]
    return ([s for s in streams if s.direction == "input"],
            [s for s in streams if s.direction == "output"], statics, flags)


# ---------------------------------------------------------------------------------------------
# The generated loop


def _cases(items, body) -> str:
    return "\n".join(f"    case {k}: {body(item)} break;" for k, item in enumerate(items)) \
        or "    default: break;"


def _set(port: Port, src: str) -> str:
    if port.wide:
        return f"std::memcpy(top->{port.cname}.data(), {src}, {-(-port.width // 32) * 4});"
    return f"top->{port.cname} = {src}[0];"


def _get(port: Port, dst: str) -> str:
    if port.wide:
        return (f"{dst}[{port.words - 1}] = 0; std::memcpy({dst}, top->{port.cname}.data(), "
                f"{-(-port.width // 32) * 4});")
    return f"{dst}[0] = top->{port.cname};"


def _stream_main(ports: Sequence[Port]) -> str:
    """Return the C++ loop for ``ports`` (the model class is ``Vdut``)."""
    by_name = {p.name: p for p in ports}
    ins, outs, statics, flags = _classify(by_name)

    def names(items):
        return "".join(f'"{x.name}", ' for x in items)

    def words(items):
        return "".join(f"{x.words}, " for x in items)

    def pulse(p):
        return f"top->{p.cname} = v;" if p.width == 1 else ""

    return string.Template(_CXX_TEMPLATE).substitute(
        n_is=len(ins), n_os=len(outs), n_st=len(statics), n_fl=len(flags),
        is_words=words(ins), os_words=words(outs), st_words=words(statics),
        is_names=names(ins), os_names=names(outs), st_names=names(statics),
        fl_names=names(flags),
        is_valid=_cases(ins, lambda s: f"top->{s.valid.cname} = v;"),
        is_payload=_cases(ins, lambda s: "" if s.payload is None else _set(s.payload, "w")),
        is_ready=_cases(ins, lambda s: f"return top->{s.ready.cname};"),
        os_valid=_cases(outs, lambda s: f"return top->{s.valid.cname};"),
        os_ready=_cases(outs, lambda s: f"top->{s.ready.cname} = v;"),
        os_payload=_cases(outs, lambda s: "" if s.payload is None else _get(s.payload, "w")),
        st_set=_cases(statics, lambda p: _set(p, "w")),
        st_pulse=_cases(statics, pulse),
        fl_get=_cases(flags, lambda p: f"return top->{p.cname};"),
        clk0=f"top->{_CLOCK} = 0;", clk1=f"top->{_CLOCK} = 1;",
        rst1=f"top->{_RESET} = 1;" if _RESET in by_name else "",
        rst0=f"top->{_RESET} = 0;" if _RESET in by_name else "",
        max_words=max([1, *(s.words for s in outs)]), max_all=MAX_WIDTH // 64,
        magic=_MAGIC, exit_stall=_EXIT_STALL, exit_protocol=_EXIT_PROTOCOL,
        n_header=len(_HEADER),
    )


_CXX_TEMPLATE = r"""// Generated by qaccel.sim.streamsim: stream handshakes through Vdut.
// usage: streams CONFIG RESULT (file formats: the notes of qaccel/sim/streamsim.py)
#include "Vdut.h"
#include "verilated.h"

#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef long long i64;
typedef unsigned long long u64;

static const int N_IS = ${n_is};  // input streams
static const int N_OS = ${n_os};  // output streams
static const int N_ST = ${n_st};  // static (plain) inputs
static const int N_FL = ${n_fl};  // 1-bit plain outputs
static const int IS_WORDS[] = {${is_words}0};
static const int OS_WORDS[] = {${os_words}0};
static const int ST_WORDS[] = {${st_words}0};
static const char* const IS_NAME[] = {${is_names}nullptr};
static const char* const OS_NAME[] = {${os_names}nullptr};
static const char* const ST_NAME[] = {${st_names}nullptr};
static const char* const FL_NAME[] = {${fl_names}nullptr};
static const int MAX_WORDS = ${max_words};

[[noreturn]] static void fail(const char* what, const char* arg) {
    std::fprintf(stderr, "streams: %s %s%s%s\n", what, arg, errno ? ": " : "",
                 errno ? std::strerror(errno) : "");
    std::exit(2);
}

[[noreturn]] static void stop(int code, const std::string& message) {
    std::fprintf(stderr, "%s\n", message.c_str());
    std::exit(code);
}

static inline void is_valid(Vdut* top, int s, bool v) {
    switch (s) {
${is_valid}
    }
}
static inline void is_payload(Vdut* top, int s, const u64* w) {
    switch (s) {
${is_payload}
    }
}
static inline bool is_ready(Vdut* top, int s) {
    switch (s) {
${is_ready}
    }
    return false;
}
static inline bool os_valid(Vdut* top, int s) {
    switch (s) {
${os_valid}
    }
    return false;
}
static inline void os_ready(Vdut* top, int s, bool v) {
    switch (s) {
${os_ready}
    }
}
static inline void os_payload(Vdut* top, int s, u64* w) {
    switch (s) {
${os_payload}
    }
}
static inline void st_set(Vdut* top, int k, const u64* w) {
    switch (k) {
${st_set}
    }
}
static inline void st_pulse(Vdut* top, int k, bool v) {
    switch (k) {
${st_pulse}
    }
}
static inline bool fl_get(Vdut* top, int k) {
    switch (k) {
${fl_get}
    }
    return false;
}

static u64 rng_state;
static inline bool chance(u64 threshold) {  // true with probability threshold / 2**32
    if (!threshold) return false;
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return ((rng_state * 2685821657736338717ULL) >> 32) < threshold;
}

static std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static std::string format(const char* fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return buf;
}

static std::string hex(const u64* w, int n) {
    std::string s = "0x";
    int k = n - 1;
    while (k > 0 && !w[k]) --k;
    s += format("%llx", w[k]);
    while (--k >= 0) s += format("%016llx", w[k]);
    return s;
}

struct Reader {
    const i64* p;
    const i64* end;
    i64 next(const char* what) {
        if (p >= end) fail("the configuration file ends early, at", what);
        return *p++;
    }
};

struct Segment {
    i64 n_phases;
    const u64* statics;
    i64 is_n[N_IS + 1], is_phase[N_IS + 1];
    const u64* is_data[N_IS + 1];
    i64 os_expect[N_OS + 1];
    std::vector<i64> pulse_port, pulse_when;  // when >= 0: cycle of the segment; else -1 - phase
};

int main(int argc, char** argv) {
    if (argc != 3) fail("expected 2 arguments, usage in", __FILE__);
    struct stat st;
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0 || fstat(fd, &st) != 0) fail("cannot open", argv[1]);
    if (st.st_size % 8 || st.st_size < 8 * (5 + ${n_header})) fail("malformed", argv[1]);
    void* map = mmap(nullptr, st.st_size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    if (map == MAP_FAILED) fail("cannot map", argv[1]);
    const i64* base = static_cast<const i64*>(map);
    const i64 n_words = st.st_size / 8;
    Reader cfg{base, base + n_words};
    if (cfg.next("magic") != ${magic} || cfg.next("N_IS") != N_IS || cfg.next("N_OS") != N_OS
        || cfg.next("N_ST") != N_ST || cfg.next("N_FL") != N_FL)
        fail("configuration made for another build:", argv[1]);
    const i64 n_seg = cfg.next("segments");
    rng_state = (u64)cfg.next("seed");
    const u64 idle_thr = (u64)cfg.next("idle"), bp_thr = (u64)cfg.next("backpressure");
    const u64 watchdog = (u64)cfg.next("watchdog");
    const u64 max_cycles = (u64)cfg.next("max_cycles");
    const u64 reset_cycles = (u64)cfg.next("reset_cycles");
    const u64 drain = (u64)cfg.next("drain");
    const i64 idle_flag = cfg.next("idle_flag");
    const i64 data_start = cfg.next("data_start");
    if (data_start < 0 || data_start > n_words || idle_flag >= N_FL || watchdog < 1)
        fail("malformed header in", argv[1]);
    const u64* data = reinterpret_cast<const u64*>(base + data_start);
    const i64 data_words = n_words - data_start;
    std::vector<Segment> segs(n_seg);
    for (Segment& S : segs) {
        S.n_phases = cfg.next("phases");
        S.statics = reinterpret_cast<const u64*>(cfg.p);
        for (int k = 0; k < N_ST; ++k)
            for (int j = 0; j < ST_WORDS[k]; ++j) cfg.next("statics");
        for (int s = 0; s < N_IS; ++s) {
            S.is_n[s] = cfg.next("beats");
            S.is_phase[s] = cfg.next("phase");
            const i64 off = cfg.next("offset");
            if (S.is_n[s] < 0 || S.is_phase[s] >= S.n_phases || off < 0
                || off + S.is_n[s] * IS_WORDS[s] > data_words)
                fail("malformed input stream record in", argv[1]);
            S.is_data[s] = data + off;
        }
        for (int o = 0; o < N_OS; ++o) S.os_expect[o] = cfg.next("expect");
        const i64 n_pulses = cfg.next("pulses");
        for (i64 j = 0; j < n_pulses; ++j) {
            const i64 port = cfg.next("pulse port"), when = cfg.next("pulse cycle");
            if (port < 0 || port >= N_ST || when < -S.n_phases) fail("malformed pulse in", argv[1]);
            S.pulse_port.push_back(port);
            S.pulse_when.push_back(when);
        }
    }

    const std::unique_ptr<VerilatedContext> context{new VerilatedContext};
    const std::unique_ptr<Vdut> model{new Vdut{context.get(), "dut"}};
    Vdut* top = model.get();
    static const u64 zeros[${max_all}] = {0};
    for (int s = 0; s < N_IS; ++s) { is_valid(top, s, false); is_payload(top, s, zeros); }
    for (int o = 0; o < N_OS; ++o) os_ready(top, o, false);
    for (int k = 0; k < N_ST; ++k) st_set(top, k, zeros);
    ${clk0}
    ${rst1}
    top->eval();
    for (u64 r = 0; r < reset_cycles; ++r) {
        ${clk1}
        top->eval();
        ${clk0}
        top->eval();
    }
    ${rst0}

    std::vector<u64> is_acc[N_IS + 1], os_data[N_OS + 1], os_cyc[N_OS + 1];
    i64 in_beats = 0;  // capacity hints: every input beat, and as many output beats
    for (int s = 0; s < N_IS; ++s) {
        i64 n = 0;
        for (const Segment& S : segs) n += S.is_n[s];
        is_acc[s].reserve(n);
        in_beats += n;
    }
    for (int o = 0; o < N_OS; ++o) {
        os_data[o].reserve(in_beats * OS_WORDS[o]);
        os_cyc[o].reserve(in_beats);
    }
    std::vector<i64> record;
    u64 cycle = 0;
    // Output stream state carries over from one segment to the next (the protocol checks).
    bool stall[N_OS + 1] = {false}, os_v[N_OS + 1] = {false}, os_r[N_OS + 1] = {false};
    u64 saved[N_OS + 1][${max_words}], now[${max_words}];
    for (i64 g = 0; g < n_seg; ++g) {
        const Segment& S = segs[g];
        const u64 start = cycle;
        const u64* w = S.statics;
        for (int k = 0; k < N_ST; ++k) { st_set(top, k, w); w += ST_WORDS[k]; }
        i64 beat[N_IS + 1] = {0}, got[N_OS + 1] = {0};
        bool offer[N_IS + 1] = {false}, is_v[N_IS + 1] = {false}, is_r[N_IS + 1] = {false};
        u64 is_prog[N_IS + 1] = {0}, os_prog[N_OS + 1];
        for (int o = 0; o < N_OS; ++o) os_prog[o] = start;
        i64 phase = 0, pulses_left = 0;
        for (i64 when : S.pulse_when) pulses_left += when >= 0;
        bool started = false, inputs_done = false;
        u64 inputs_done_cycle = 0, last_handshake = start;
        i64 done = -1;
        std::vector<int> raised;

        auto where = [&]() {
            return format("at cycle %llu (cycle %llu of segment %lld)", cycle, cycle - start, g);
        };
        auto state = [&]() {
            std::string s = "; state:";
            for (int k = 0; k < N_IS; ++k)
                s += format(" input '%s' valid=%d ready=%d (%lld of %lld beats accepted),",
                            IS_NAME[k], (int)is_v[k], (int)is_r[k], beat[k], S.is_n[k]);
            for (int k = 0; k < N_OS; ++k)
                s += format(" output '%s' valid=%d ready=%d (%lld beats received),",
                            OS_NAME[k], (int)os_v[k], (int)os_r[k], got[k]);
            if (idle_flag >= 0)
                s += format(" %s=%d,", FL_NAME[idle_flag], (int)fl_get(top, (int)idle_flag));
            s.pop_back();
            return s;
        };
        auto violation = [&](int o, const std::string& what) {
            stop(${exit_protocol}, format("protocol violation on output stream '%s' ", OS_NAME[o])
                 + where() + ": " + what);
        };

        for (;;) {
            if (cycle >= max_cycles)
                stop(${exit_stall}, format("max_cycles (%llu) reached ", max_cycles) + where()
                     + state());
            // -- drive ------------------------------------------------------------------------
            for (int k : raised) st_pulse(top, k, false);
            raised.clear();
            for (size_t j = 0; j < S.pulse_when.size(); ++j)
                if (S.pulse_when[j] >= 0 && start + (u64)S.pulse_when[j] == cycle) {
                    st_pulse(top, (int)S.pulse_port[j], true);
                    raised.push_back((int)S.pulse_port[j]);
                    --pulses_left;
                }
            while (!started && phase < S.n_phases) {
                started = true;
                bool work = false;
                for (size_t j = 0; j < S.pulse_when.size(); ++j)
                    if (S.pulse_when[j] == -1 - phase) {
                        st_pulse(top, (int)S.pulse_port[j], true);
                        raised.push_back((int)S.pulse_port[j]);
                        work = true;
                    }
                for (int s = 0; s < N_IS; ++s)
                    if (S.is_phase[s] == phase) {
                        is_prog[s] = cycle;
                        work |= S.is_n[s] > 0;
                    }
                if (!work) { ++phase; started = false; }
            }
            for (int s = 0; s < N_IS; ++s) {
                if (!offer[s] && started && S.is_phase[s] == phase && beat[s] < S.is_n[s]
                    && !chance(idle_thr)) {
                    offer[s] = true;
                    is_payload(top, s, S.is_data[s] + beat[s] * IS_WORDS[s]);
                }
                is_valid(top, s, offer[s]);
            }
            for (int o = 0; o < N_OS; ++o) {
                os_r[o] = !chance(bp_thr);
                os_ready(top, o, os_r[o]);
            }
            ${clk0}
            top->eval();
            // -- sample -----------------------------------------------------------------------
            bool any = false;
            for (int s = 0; s < N_IS; ++s) {
                is_v[s] = offer[s];
                is_r[s] = is_ready(top, s);
                if (offer[s] && is_r[s]) {
                    is_acc[s].push_back(cycle);
                    ++beat[s];
                    offer[s] = false;
                    is_prog[s] = cycle;
                    any = true;
                }
            }
            for (int o = 0; o < N_OS; ++o) {
                const bool v = os_valid(top, o);
                os_v[o] = v;
                if (stall[o]) {
                    if (!v)
                        violation(o, format("valid fell without a transfer (it was high without "
                                            "ready in cycle %llu, so it must stay high until "
                                            "the transfer)", cycle - 1));
                    os_payload(top, o, now);
                    if (std::memcmp(now, saved[o], 8 * OS_WORDS[o]))
                        violation(o, "the payload changed from " + hex(saved[o], OS_WORDS[o])
                                  + " to " + hex(now, OS_WORDS[o]) + " while valid was high "
                                  "without ready (it must stay stable until the transfer)");
                }
                if (v && os_r[o]) {
                    const size_t n0 = os_data[o].size();
                    os_data[o].resize(n0 + OS_WORDS[o]);
                    os_payload(top, o, os_data[o].data() + n0);
                    os_cyc[o].push_back(cycle);
                    ++got[o];
                    stall[o] = false;
                    os_prog[o] = cycle;
                    any = true;
                } else if (v) {
                    if (!stall[o]) os_payload(top, o, saved[o]);
                    stall[o] = true;
                } else {
                    stall[o] = false;
                }
            }
            if (any) last_handshake = cycle;
            // -- end of the segment (inputs_done as of the previous cycles) ----------------------
            if (done < 0 && inputs_done) {
                bool ok = idle_flag < 0 || !fl_get(top, (int)idle_flag);
                for (int o = 0; o < N_OS; ++o)
                    ok &= S.os_expect[o] < 0 || got[o] >= S.os_expect[o];
                if (ok) done = (i64)cycle;
            }
            if (started) {
                bool complete = true;
                for (int s = 0; s < N_IS; ++s)
                    complete &= S.is_phase[s] != phase || beat[s] >= S.is_n[s];
                if (complete) { ++phase; started = false; }
            }
            if (!inputs_done && phase >= S.n_phases && pulses_left == 0) {
                inputs_done = true;
                inputs_done_cycle = cycle;
            }
            // -- watchdog ---------------------------------------------------------------------
            if (done < 0) {
                std::string stalled;
                for (int s = 0; s < N_IS; ++s)
                    if (started && S.is_phase[s] == phase && beat[s] < S.is_n[s]
                        && cycle - is_prog[s] >= watchdog)
                        stalled += format("input stream '%s' stalled for %llu cycles (valid=%d "
                                          "ready=%d, %lld of %lld beats accepted); ", IS_NAME[s],
                                          cycle - is_prog[s], (int)is_v[s], (int)is_r[s],
                                          beat[s], S.is_n[s]);
                for (int o = 0; o < N_OS; ++o) {
                    const bool owed = S.os_expect[o] >= 0 && got[o] < S.os_expect[o];
                    if (!os_v[o] && !owed) os_prog[o] = cycle;
                    else if (cycle - os_prog[o] >= watchdog)
                        stalled += format("output stream '%s' stalled for %llu cycles (valid=%d "
                                          "ready=%d, %lld beats received", OS_NAME[o],
                                          cycle - os_prog[o], (int)os_v[o], (int)os_r[o], got[o])
                                   + (owed ? format(" of %lld expected); ", S.os_expect[o])
                                           : std::string("); "));
                }
                if (idle_flag >= 0 && inputs_done) {
                    const u64 since = last_handshake > inputs_done_cycle ? last_handshake
                                                                         : inputs_done_cycle;
                    if (cycle - since >= watchdog)
                        stalled += format("'%s' stayed high for %llu cycles after the last input "
                                          "with no handshake; ", FL_NAME[idle_flag],
                                          cycle - since);
                }
                if (!stalled.empty()) {
                    stalled.resize(stalled.size() - 2);
                    stop(${exit_stall}, where() + ": " + stalled + state());
                }
            }
            ${clk1}
            top->eval();
            ++cycle;
            if (done >= 0 && cycle > (u64)done + drain) break;
        }
        for (int k : raised) st_pulse(top, k, false);
        record.push_back((i64)start);
        record.push_back(done);
        record.push_back((i64)cycle - 1);
        for (int s = 0; s < N_IS; ++s) record.push_back(beat[s]);
        for (int o = 0; o < N_OS; ++o) record.push_back(got[o]);
    }
    model->final();

    FILE* f = std::fopen(argv[2], "wb");
    if (!f) fail("cannot create", argv[2]);
    const i64 head[2] = {n_seg, (i64)cycle};
    bool ok = std::fwrite(head, 8, 2, f) == 2;
    ok &= std::fwrite(record.data(), 8, record.size(), f) == record.size();
    for (int o = 0; o < N_OS; ++o) {
        ok &= std::fwrite(os_data[o].data(), 8, os_data[o].size(), f) == os_data[o].size();
        ok &= std::fwrite(os_cyc[o].data(), 8, os_cyc[o].size(), f) == os_cyc[o].size();
    }
    for (int s = 0; s < N_IS; ++s)
        ok &= std::fwrite(is_acc[s].data(), 8, is_acc[s].size(), f) == is_acc[s].size();
    if (std::fclose(f) != 0 || !ok) fail("cannot write", argv[2]);
    munmap(map, st.st_size);
    close(fd);
    return 0;
}
"""


# ---------------------------------------------------------------------------------------------
# Python side


@dataclass(frozen=True)
class Segment:
    """One stretch of a run: beats to feed, ports to hold and pulse, and what ends it.

    ``inputs`` maps input stream names to their beats (1-D integer arrays or sequences of
    ints, two's complement if negative; for payloads wider than 64 bits also ``(n, words)``
    ``uint64`` arrays); ``static``
    maps plain input ports to integers held for the whole segment (others are 0); ``pulses``
    maps 1-bit plain inputs to the segment cycle in which they are high; ``phases`` orders
    the streams and phase pulses (see the module notes; default: every stream in one phase);
    ``expect`` maps output streams to the beats the segment waits for.
    """

    inputs: Mapping[str, object] = field(default_factory=dict)
    static: Mapping[str, int] = field(default_factory=dict)
    pulses: Mapping[str, int] = field(default_factory=dict)
    phases: Sequence[Sequence[str]] | None = None
    expect: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class StreamResult:
    """What one segment produced. Cycles count from the segment's first cycle.

    ``outputs`` holds each output stream's payloads in arrival order (1-D arrays in the
    smallest unsigned dtype of the payload width, ``(n, words)`` ``uint64`` above 64 bits),
    ``output_cycles`` the cycle of each, ``accepted`` each input stream's accept cycles.
    ``cycles`` runs to the cycle the segment was done (inclusive); beats arriving in the
    ``drain`` cycles after it are included in ``outputs``.
    """

    outputs: dict[str, np.ndarray]
    output_cycles: dict[str, np.ndarray]
    accepted: dict[str, np.ndarray]
    cycles: int
    drain: int


def _probability(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a probability (a float), not {value!r}")
    if not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], not {value!r}")
    return float(value)


def _words(port: Port, value, what: str) -> np.ndarray:
    """Return beats ``value`` of a payload ``port`` as an ``(n, words)`` uint64 array.

    ``value`` is an integer array (for wide ports a ``(n, words)`` uint64 array, see
    :class:`VectorSim`) or a sequence of integers (any width; Python ints are converted at
    about 10M per second up to 64 bits, 3M per second above).
    """
    if isinstance(value, np.ndarray) and value.dtype != object:
        if value.ndim == 0:
            raise TypeError(f"{what} must be an array of beats, not {value!r}")
        if value.size == 0:
            return np.zeros((0, port.words), np.uint64)
        col = _as_column(port, value, None)
        return np.asarray(col, dtype=np.uint64).reshape(-1, port.words)
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence | np.ndarray):
        raise TypeError(f"{what} must be an array of beats, not {value!r}")
    mask = (1 << port.width) - 1
    try:
        if port.words == 1:
            try:
                a = np.fromiter(map(operator.index, value), np.uint64, len(value))
            except OverflowError:      # negative values or 2**64 and more: checked below
                pass
            else:
                if not a.size or port.width == 64 or int(a.max()) <= mask:
                    return a.reshape(-1, 1)
        ints = [operator.index(v) for v in value]
    except TypeError:
        raise TypeError(f"{what} must hold integers (bit patterns), not "
                        f"{next(v for v in value if not isinstance(v, int | np.integer))!r} "
                        "(view floats as unsigned integers first)") from None
    if not ints:
        return np.zeros((0, port.words), np.uint64)
    lo, hi = min(ints), max(ints)
    if lo < -(1 << (port.width - 1)) or hi > mask:
        raise ValueError(f"{what} has values outside [{-(1 << (port.width - 1))}, {mask}] "
                         f"({port.width} bits): min {lo}, max {hi}")
    raw = b"".join((v & mask).to_bytes(8 * port.words, "little") for v in ints)
    return np.frombuffer(raw, dtype=np.uint64).reshape(-1, port.words)


def _ints(words: np.ndarray) -> list[int]:
    """Return ``(n, words)`` uint64 payloads as Python ints."""
    if words.shape[1] == 1:
        return words[:, 0].tolist()
    return [int.from_bytes(row.tobytes(), "little") for row in words]


class StreamSim(VectorSim):
    """A Verilator build of ``component`` whose loop drives and checks its stream interfaces.

    Building happens on construction (or a finished build is reused); :meth:`run` and
    :meth:`run_segments` then cost file I/O and simulation. See the module notes for the cycle
    contract. The vector interface of :class:`VectorSim` (``run(inputs, latency=...)``) is
    replaced by the stream one.

    Parameters
    ----------
    component : :class:`amaranth.lib.wiring.Component`
        The design, with a ``sync`` domain; members ``stream.Signature`` interfaces and plain
        ports.
    name : :class:`str` or None
        Verilog module name and build directory prefix; defaults to the class name in
        lower case.
    verbose : :class:`bool` or None
        Stream build output to stdout instead of ``build.log``.

    Raises
    ------
    :exc:`TypeError`
        If ``component`` is not a wiring.Component.
    :exc:`ValueError`
        If ``name`` is not a Verilog identifier, the design has no clock, or a stream payload
        is wider than :data:`~qaccel.sim.vectors.MAX_WIDTH` bits.
    :exc:`~qaccel.sim.runner.SimulatorNotFoundError`, :exc:`~qaccel.sim.runner.BuildError`
        As :class:`VectorSim`.

    Members
    -------
    input_streams, output_streams : tuple of str
        Stream interface names (``x`` for ports ``x__payload``, ``x__valid``, ``x__ready``).
    statics : tuple of str
        Plain input ports (``static``; the 1-bit ones can be pulsed).
    flags : tuple of str
        1-bit plain output ports (candidates for ``until_idle``).
    last_run : :class:`~qaccel.sim.vectors.RunStats` or None
        Measurements of the last run; ``vectors`` counts the output beats received.
    """

    _kind = "stream"
    _loop_file = _SOURCE
    _loop_template = _CXX_TEMPLATE

    def _loop_source(self, ports) -> str:
        return _stream_main(ports)

    def __init__(self, component: wiring.Component, *, name: str | None = None,
                 verbose: bool | None = None, design_key: str | None = None):
        super().__init__(component, name=name, verbose=verbose, design_key=design_key)
        if not self.has_clock:
            raise ValueError(f"{self.name} has no clock (sync domain); streams need one")
        ins, outs, statics, flags = _classify(self._ports)
        self._in_streams = {s.name: s for s in ins}
        self._out_streams = {s.name: s for s in outs}
        self._statics = {p.name: k for k, p in enumerate(statics)}
        self._static_ports = statics
        self._flags = {p.name: k for k, p in enumerate(flags)}

    # -- properties ----------------------------------------------------------------------------

    @property
    def input_streams(self) -> tuple[str, ...]:
        """Names of the input stream interfaces."""
        return tuple(self._in_streams)

    @property
    def output_streams(self) -> tuple[str, ...]:
        """Names of the output stream interfaces."""
        return tuple(self._out_streams)

    @property
    def statics(self) -> tuple[str, ...]:
        """Plain input ports (held per segment; the 1-bit ones may be pulsed)."""
        return tuple(self._statics)

    @property
    def flags(self) -> tuple[str, ...]:
        """1-bit plain output ports."""
        return tuple(self._flags)

    # -- encoding ------------------------------------------------------------------------------

    def _names(self, what: str, names, choices: Mapping) -> None:
        for name in names:
            if name not in choices:
                listed = ", ".join(choices) or "none"
                raise ValueError(f"{self._name} has no {what} {name!r}; its {what}s are: {listed}")

    def _encode(self, seg: Segment, data: list[np.ndarray],
                offset: int) -> tuple[list[int], int, int]:
        """Return the record of ``seg``, the next data offset and its number of input beats;
        append its beat data to ``data``."""
        if not isinstance(seg, Segment):
            raise TypeError(f"must be a Segment, not {seg!r}")
        for attr in ("inputs", "static", "pulses", "expect"):
            if not isinstance(getattr(seg, attr), Mapping):
                raise TypeError(f"{attr} must be a mapping, not {getattr(seg, attr)!r}")
        self._names("input stream", seg.inputs, self._in_streams)
        self._names("output stream", seg.expect, self._out_streams)
        self._names("plain input", [*seg.static, *seg.pulses], self._statics)
        phases = [list(seg.inputs)] if seg.phases is None else seg.phases
        if isinstance(phases, str) or not all(
                isinstance(p, Sequence) and not isinstance(p, str) for p in phases):
            raise TypeError(f"phases must be a sequence of sequences of names, not {phases!r}")
        phase_of: dict[str, int] = {}
        for j, group in enumerate(phases):
            for name in group:
                if name in phase_of:
                    raise ValueError(f"phases name {name!r} twice")
                if name not in seg.inputs and name not in self._statics:
                    raise ValueError(f"phases name {name!r}, which is neither a stream given in "
                                     f"inputs ({', '.join(seg.inputs) or 'none'}) nor a plain "
                                     f"1-bit input ({', '.join(self._statics) or 'none'})")
                phase_of[name] = j
        missing = [name for name in seg.inputs if name not in phase_of]
        if missing:
            raise ValueError(f"phases must place every input stream; missing {missing}")
        pulsed = [*seg.pulses, *(n for n in phase_of if n in self._statics)]
        for name in pulsed:
            port = self._static_ports[self._statics[name]]
            if port.width != 1:
                raise ValueError(f"only 1-bit ports can be pulsed; {name!r} is {port.width} bits")
            if name in seg.static:
                raise ValueError(f"{name!r} is both static and pulsed")
        if len(set(pulsed)) != len(pulsed):
            raise ValueError(f"{sorted(set(seg.pulses) & set(phase_of))[0]!r} is pulsed both by "
                             "pulses and by phases")
        rec = [len(phases)]
        for port in self._static_ports:
            value = seg.static.get(port.name, 0)
            check_int(f"static[{port.name!r}]", value)
            col = np.ascontiguousarray(_as_column(port, value, 1), np.uint64)
            rec += col.reshape(-1).view(np.int64).tolist()
        beats = 0
        for name, s in self._in_streams.items():
            if name not in seg.inputs:
                rec += [0, -1, 0]
                continue
            value = seg.inputs[name]
            if s.payload is None:
                n = len(value) if isinstance(value, Sequence | np.ndarray) else check_int(
                    f"inputs[{name!r}]", value, 0)
                words = np.zeros((n, 0), np.uint64)
            else:
                words = _words(s.payload, value, f"inputs[{name!r}]")
            data.append(words.reshape(-1))
            rec += [len(words), phase_of[name], offset]
            offset += words.size
            beats += len(words)
        for name in self._out_streams:
            rec.append(check_int(f"expect[{name!r}]", seg.expect[name], 0)
                       if name in seg.expect else -1)
        pulses = [(self._statics[n], check_int(f"pulses[{n!r}]", c, 0))
                  for n, c in seg.pulses.items()]
        pulses += [(self._statics[n], -1 - j) for n, j in phase_of.items() if n in self._statics]
        rec.append(len(pulses))
        for pair in pulses:
            rec += pair
        return rec, offset, beats

    # -- run -----------------------------------------------------------------------------------

    def run(self, inputs: Mapping[str, object], static: Mapping[str, int] | None = None, *,
            pulses: Mapping[str, int] | None = None,
            phases: Sequence[Sequence[str]] | None = None,
            expect: Mapping[str, int] | None = None,
            idle: float = 0.0, backpressure: float = 0.0, seed: int = 1,
            max_cycles: int | None = None, until_idle: str | None = "busy",
            reset_cycles: int = RESET_CYCLES, drain: int = DRAIN,
            watchdog: int = WATCHDOG) -> StreamResult:
        """Run one :class:`Segment` and return its :class:`StreamResult`.

        ``inputs`` (stream name to beats), ``static`` (port to value), ``pulses`` (1-bit port
        to cycle), ``phases`` and ``expect`` (output stream to beat count) are the segment's
        fields; the other options and the exceptions are those of :meth:`run_segments`.
        """
        seg = Segment(inputs=inputs, static=static or {}, pulses=pulses or {}, phases=phases,
                      expect=expect or {})
        return self.run_segments([seg], idle=idle, backpressure=backpressure, seed=seed,
                                 max_cycles=max_cycles, until_idle=until_idle,
                                 reset_cycles=reset_cycles, drain=drain, watchdog=watchdog)[0]

    def run_segments(self, segments: Sequence[Segment], *, idle: float = 0.0,
                     backpressure: float = 0.0, seed: int = 1, max_cycles: int | None = None,
                     until_idle: str | None = "busy", reset_cycles: int = RESET_CYCLES,
                     drain: int = DRAIN, watchdog: int = WATCHDOG) -> list[StreamResult]:
        """Run ``segments`` back to back in one process after one reset; return their results.

        ``idle`` and ``backpressure`` are pause probabilities (see the module notes); ``seed``
        seeds the pauses; ``max_cycles`` bounds the whole run (default: 10 million plus 1000
        per input beat); ``until_idle`` names a 1-bit output that must be low for a segment to
        end (None: no such condition); ``drain`` cycles follow each segment's end;
        ``watchdog`` is the stall timeout in cycles.

        Raises :exc:`TypeError` / :exc:`ValueError` for bad arguments (unknown ports, values
        that do not fit, a stream missing from ``phases``, ...), :exc:`StreamStallError` and
        :exc:`StreamProtocolError` as the module notes say, and
        :exc:`~qaccel.sim.runner.SimulationError` if the loop fails otherwise.
        """
        start = time.perf_counter()
        if isinstance(segments, Segment) or not isinstance(segments, Sequence):
            raise TypeError(f"segments must be a sequence of Segment, not {segments!r}")
        if not segments:
            raise ValueError("segments must hold at least one Segment")
        idle = _probability("idle", idle)
        backpressure = _probability("backpressure", backpressure)
        seed = check_int("seed", seed, 0, (1 << 64) - 1)
        reset_cycles = check_int("reset_cycles", reset_cycles, 0, 1 << 20)
        drain = check_int("drain", drain, 0, 1 << 20)
        watchdog = check_int("watchdog", watchdog, 1, 1 << 40)
        if until_idle is None:
            flag = -1
        else:
            self._names("1-bit plain output", [until_idle], self._flags)
            flag = self._flags[until_idle]
        data: list[np.ndarray] = []
        records: list[int] = []
        offset = beats = 0
        for k, seg in enumerate(segments):
            try:
                rec, offset, n = self._encode(seg, data, offset)
            except (TypeError, ValueError) as e:
                if len(segments) == 1 and isinstance(seg, Segment):
                    raise                       # run(): the arguments are the segment
                raise type(e)(f"segments[{k}]: {e}") from None
            records += rec
            beats += n
        if max_cycles is None:
            max_cycles = _BASE_CYCLES + _CYCLES_PER_BEAT * beats
        max_cycles = check_int("max_cycles", max_cycles, 1, (1 << 62))
        # xorshift64* needs a non-zero state: seed through splitmix64's finaliser.
        z = (seed + 0x9E3779B97F4A7C15) & ((1 << 64) - 1)
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & ((1 << 64) - 1)
        state = (z ^ (z >> 31)) or 1
        header = [_MAGIC, len(self._in_streams), len(self._out_streams), len(self._statics),
                  len(self._flags), len(segments), state - (1 << 64) if state >> 63 else state,
                  round(idle * 2**32), round(backpressure * 2**32), watchdog, max_cycles,
                  reset_cycles, drain, flag]
        data_start = len(header) + 1 + len(records)
        config = np.concatenate([np.array([*header, data_start, *records], np.int64),
                                 *(d.view(np.int64) for d in data)])

        run_dir = self._dir / "runs" / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        run_dir.mkdir(parents=True)
        try:
            config_path, result_path = run_dir / "config.bin", run_dir / "result.bin"
            config.tofile(config_path)
            cmd = [str(self._dir / "obj_dir" / _EXE), str(config_path), str(result_path)]
            sim_start = time.perf_counter()
            res = subprocess.run(cmd, capture_output=True, text=True, check=False)
            sim_time = time.perf_counter() - sim_start
            message = f"{self._name}: {res.stderr.strip()}"
            if res.returncode == _EXIT_STALL:
                raise StreamStallError(message)
            if res.returncode == _EXIT_PROTOCOL:
                raise StreamProtocolError(message)
            if res.returncode != 0:
                raise SimulationError(f"the stream loop of {self._name} failed "
                                      f"(exit {res.returncode}): {res.stderr.strip()}")
            out = np.fromfile(result_path, dtype=np.uint64)
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)
        results, received, total_cycles = self._decode(out, len(segments), drain)
        self.last_run = RunStats(received, reset_cycles + total_cycles,
                                 time.perf_counter() - start, sim_time)
        return results

    def _decode(self, out: np.ndarray, n_seg: int,
                drain: int) -> tuple[list[StreamResult], int, int]:
        n_is, n_os = len(self._in_streams), len(self._out_streams)
        total_cycles = int(out[1])
        width = 3 + n_is + n_os
        rec = out[2: 2 + n_seg * width].view(np.int64).reshape(n_seg, width)
        starts, dones = rec[:, 0], rec[:, 1]
        pos = 2 + n_seg * width
        outputs: dict[str, list] = {}
        output_cycles: dict[str, list] = {}
        received = 0
        for j, (name, s) in enumerate(self._out_streams.items()):
            counts = rec[:, 3 + n_is + j]
            total = int(counts.sum())
            received += total
            words = out[pos: pos + total * s.words].reshape(total, s.words)
            pos += total * s.words
            cycles = out[pos: pos + total].view(np.int64)
            pos += total
            bounds = np.cumsum(counts)[:-1]
            if s.payload is None:
                beats = np.zeros(total, np.uint8)
            elif s.payload.wide:
                beats = words
            else:
                beats = words[:, 0].astype(s.payload.dtype)
            outputs[name] = np.split(beats, bounds)
            output_cycles[name] = [c - starts[g] for g, c in enumerate(np.split(cycles, bounds))]
        accepted: dict[str, list] = {}
        for j, name in enumerate(self._in_streams):
            counts = rec[:, 3 + j]
            total = int(counts.sum())
            cycles = out[pos: pos + total].view(np.int64)
            pos += total
            accepted[name] = [c - starts[g] for g, c in
                              enumerate(np.split(cycles, np.cumsum(counts)[:-1]))]
        if pos != out.size:
            raise SimulationError(f"the stream loop of {self._name} wrote {out.size} words, "
                                  f"{pos} expected")
        results = [StreamResult({n: v[g] for n, v in outputs.items()},
                                {n: v[g] for n, v in output_cycles.items()},
                                {n: v[g] for n, v in accepted.items()},
                                int(dones[g] - starts[g]) + 1, drain) for g in range(n_seg)]
        return results, received, total_cycles


# ---------------------------------------------------------------------------------------------
# Jobs on the Quantize and Dequantize units


@dataclass(frozen=True)
class JobResult:
    """What the RTL produced for one :class:`~qaccel.sim.jobs.Job`, with cycle counts.

    ``y`` holds the received ``y`` beats as Python ints (as ``Job.y``). Cycles count from the
    job's first cycle (its first table write): ``y_cycles`` of each ``y`` beat, ``x_cycles``
    of each accepted ``x`` beat; ``cycles`` runs to the cycle ``busy`` was seen low.
    """

    label: str
    y: list[int]
    y_cycles: np.ndarray
    x_cycles: np.ndarray
    cycles: int

    @property
    def beats(self) -> int:
        """Number of ``y`` beats received."""
        return len(self.y)

    @property
    def first_cycle(self) -> int | None:
        """Cycle of the first ``y`` beat (None without beats)."""
        return int(self.y_cycles[0]) if len(self.y_cycles) else None

    @property
    def last_cycle(self) -> int | None:
        """Cycle of the last ``y`` beat (None without beats)."""
        return int(self.y_cycles[-1]) if len(self.y_cycles) else None

    @property
    def latency(self) -> int | None:
        """Cycles from the first ``x`` transfer to the first ``y`` transfer."""
        if not len(self.y_cycles) or not len(self.x_cycles):
            return None
        return int(self.y_cycles[0] - self.x_cycles[0])

    @property
    def beats_per_cycle(self) -> float:
        """``y`` beats over the span from the first to the last, inclusive (0 if none)."""
        if not len(self.y_cycles):
            return 0.0
        return self.beats / (self.last_cycle - self.first_cycle + 1)

    @property
    def x_beats_per_cycle(self) -> float:
        """Accepted ``x`` beats over their span, inclusive (0 if none)."""
        if not len(self.x_cycles):
            return 0.0
        return len(self.x_cycles) / int(self.x_cycles[-1] - self.x_cycles[0] + 1)


_SIMS: dict[tuple, StreamSim] = {}


def elementwise_sim(unit: Elementwise, *, name: str | None = None) -> StreamSim:
    """Return the :class:`StreamSim` of ``unit``, built (or reused from disk) once per process
    for each unit class and configuration, which determine the hardware. ``name`` (the Verilog
    module name) None takes the cached simulator whatever its name."""
    if not isinstance(unit, Elementwise):
        raise TypeError(f"unit must be a Quantize or Dequantize unit, not {unit!r}")
    key = (type(unit), unit.config)
    sim = _SIMS.get(key)
    if sim is None or (name is not None and sim.name != name):
        sim = _SIMS[key] = StreamSim(unit, name=name, design_key=design_key(unit))
    return sim


def _job_segment(job: Job, fields: list[tuple[str, int, int]]) -> Segment:
    table = []
    for entry in job.table:
        word = 0
        for (name, offset, width), value in zip(fields, entry, strict=True):
            if not 0 <= value < 1 << width:
                raise ValueError(f"job {job.label!r}: table {name} {value:#x} does not fit "
                                 f"{width} bits")
            word |= value << offset
        table.append(word)
    return Segment(inputs={"table": table, "x": job.x}, static={"regs": job.regs},
                   phases=[["table"], ["start"], ["x"]])


def run_elementwise_fast(unit: Elementwise, jobs: Sequence[Job], *, idle: float = 0.0,
                         backpressure: float = 0.0, seed: int = 1, name: str | None = None,
                         watchdog: int = WATCHDOG) -> list[JobResult]:
    """Run ``jobs`` on a Quantize or Dequantize ``unit`` in one Verilator process; return what
    the RTL produced for each (nothing is compared: see :func:`check_jobs`).

    Each job is a :class:`Segment`: the table writes on ``table``, then a ``start`` pulse,
    then the ``x`` beats, with ``regs`` held throughout and ``y`` received; it ends when every
    ``x`` beat was accepted and ``busy`` is low (plus :data:`DRAIN` cycles), and the next job
    begins. ``idle`` / ``backpressure`` pause ``table`` and ``x`` / ``y``. The simulator is
    cached per unit class and configuration (:func:`elementwise_sim`; its ``last_run`` has
    the timing).

    Raises :exc:`StreamStallError` (a hang: the message names the stream and its valid/ready),
    :exc:`StreamProtocolError` (``y`` broke the stream rules), and :exc:`ValueError` /
    :exc:`TypeError` for bad arguments.
    """
    sim = elementwise_sim(unit, name=name)
    if isinstance(jobs, Job) or not isinstance(jobs, Sequence):
        raise TypeError(f"jobs must be a sequence of Job, not {jobs!r}")
    if not jobs:
        raise ValueError("jobs must hold at least one Job")
    fields = table_fields(unit)
    segments = []
    for k, job in enumerate(jobs):
        if not isinstance(job, Job):
            raise TypeError(f"jobs[{k}] must be a Job, not {job!r}")
        segments.append(_job_segment(job, fields))
    results = sim.run_segments(segments, idle=idle, backpressure=backpressure, seed=seed,
                               until_idle="busy", watchdog=watchdog)
    y = sim._out_streams["y"].payload
    out = []
    for job, r in zip(jobs, results, strict=True):
        beats = r.outputs["y"]
        words = beats if y.wide else beats.astype(np.uint64)[:, None]
        out.append(JobResult(job.label, _ints(words), r.output_cycles["y"], r.accepted["x"],
                             r.cycles))
    return out


def check_jobs(jobs: Sequence[Job], results: Sequence[JobResult]) -> None:
    """Compare each job's received ``y`` beats with its expected ones (the last beat through
    ``Job.ymask``); raise :exc:`AssertionError` naming the first wrong job and beat."""
    if len(jobs) != len(results):
        raise AssertionError(f"{len(results)} results for {len(jobs)} jobs")
    for k, (job, res) in enumerate(zip(jobs, results, strict=True)):
        what = f"job {k} ({job.label!r})"
        got, want = res.y, job.y
        if len(got) != len(want):
            raise AssertionError(f"{what}: {len(got)} y beats received, {len(want)} expected")
        if not want:
            continue
        n = len(want)
        if got[:-1] != want[:-1] or (got[-1] ^ want[-1]) & job.ymask:
            for b in range(n):
                mask = job.ymask if b == n - 1 else -1
                diff = (got[b] ^ want[b]) & mask
                if diff:
                    raise AssertionError(
                        f"{what}: y beat {b} of {n} is {got[b] & mask:#x}, expected "
                        f"{want[b] & mask:#x} (bits {diff:#x} differ; cycle "
                        f"{int(res.y_cycles[b])})")
