"""Timings of the VM on the GPU, each a ratio against a figure measured in the
same run (MEASURE.md): the streaming-read bandwidth of a plain kernel, the VM's
weight-streaming GEMM, the dispatch cost of empty instructions (dynamic and
static), the cost of the self-timestamps and the instruction-cache warmer.
Median of `reps` timed runs after warm-up, with CUDA events."""
from __future__ import annotations

import statistics
from contextlib import contextmanager
from typing import Callable, Iterator

import numpy as np
import torch

from ..isa import DType, Op, Stamp
from .build import compile_source
from .programs import gemm_bindings, gemm_stream, nop_stream
from .vm import VM, Loaded

__all__ = ["time_ms", "timing_stream", "at_claim_depth", "STREAM_BYTES", "weight_rows", "StreamRead", "L2Flush", "gemm_bandwidth", "dispatch_overhead", "step_time", "stamp_cost", "first_use_us", "clock_ghz", "warm_effect"]

_STREAM_READ_SRC = r"""
// Plain streaming read: 16-byte loads, a persistent grid, four loads in flight per thread.
__device__ __forceinline__ uint4 ldcs(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
extern "C" __global__ void __launch_bounds__(512) gvm_stream_read(const uint4* p, unsigned long long n, unsigned* sink) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned acc = 0;
    for (; i + 3 * stride < n; i += 4 * stride) {
        const uint4 a = ldcs(p + i), b = ldcs(p + i + stride), c = ldcs(p + i + 2 * stride), d = ldcs(p + i + 3 * stride);
        acc ^= a.x ^ a.w ^ b.y ^ b.z ^ c.x ^ c.w ^ d.y ^ d.z;
    }
    for (; i < n; i += stride) { const uint4 a = ldcs(p + i); acc ^= a.x ^ a.y ^ a.z ^ a.w; }
    if (acc == 0x9e3779b9u) *sink = acc;  // keeps the loads; practically never true
}
"""


_SPIN_CYCLES = 200_000  # ~0.1 ms: the GPU spins while the host enqueues the timed launch


def time_ms(launch: Callable[[int], None], stream: torch.cuda.Stream, reps: int = 20, warmup: int = 3, before: Callable[[], None] | None = None) -> list[float]:
    """Times of launch(r) on stream (CUDA events), one per rep r >= warmup.
    `before` runs first, untimed; a spin kernel keeps the GPU busy while the
    host enqueues, so host launch latency stays out of the figure."""
    out = []
    stream.wait_stream(torch.cuda.current_stream(stream.device))  # buffers made on the current stream
    with torch.cuda.stream(stream):
        for r in range(warmup + reps):
            if before is not None:
                before()
            torch.cuda._sleep(_SPIN_CYCLES)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(stream)
            launch(r)
            b.record(stream)
            b.synchronize()
            if r >= warmup:
                out.append(a.elapsed_time(b))
    return out


_STREAMS: dict[int, torch.cuda.Stream] = {}


def timing_stream(vm: VM) -> torch.cuda.Stream:
    """A side stream per device for every timed launch (a real handle, unlike
    the legacy default stream, for the cuda.core launches too)."""
    key = vm.torch_device.index or 0
    if key not in _STREAMS:
        _STREAMS[key] = torch.cuda.Stream(vm.torch_device)
    return _STREAMS[key]


def _stats(times: list[float]) -> dict[str, float]:
    return {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times), "runs": len(times)}


class L2Flush:
    """Writes a buffer larger than L2 so that the next launch starts cold."""

    def __init__(self, device: torch.device, nbytes: int = 256 << 20) -> None:
        self.buf = torch.empty(nbytes // 4, dtype=torch.int32, device=device)
        self.k = 0

    def __call__(self) -> None:
        self.k += 1
        self.buf.fill_(self.k)

    def restoring(self, dst: torch.Tensor, src: torch.Tensor) -> Callable[[], None]:
        """A `before` for time_ms: dst = src, then this flush. For a program
        that updates its input in place (a layer, its residual stream): every
        timed run then starts from the checked run's input with its weights in
        HBM. Timed on one copy, a layer's stream drifted, and its routing with
        it: sliding-c16-t8 ran 6% faster every 23 launches (session 44)."""

        def before() -> None:
            dst.copy_(src, non_blocking=True)
            self()

        return before


STREAM_BYTES = 2 << 30  # what the streaming read and the GEMM stream each read (far more than L2)


def weight_rows(k: int) -> int:
    """Rows of a bf16 W of K columns holding STREAM_BYTES: a GEMM stream that
    reads as many bytes as the streaming read it is compared with (a launch's
    fixed costs and its last wave weigh the same on both)."""
    return STREAM_BYTES // (2 * k)


class StreamRead:
    """The floor's bandwidth B: a plain streaming-read kernel over `nbytes`."""

    def __init__(self, vm: VM, nbytes: int = STREAM_BYTES) -> None:
        from cuda.core import ObjectCode

        cubin, _ = compile_source(_STREAM_READ_SRC, "gvm_stream_read.cu", [], [])
        self._obj = ObjectCode.from_cubin(cubin)
        self.kernel = self._obj.get_kernel("gvm_stream_read")
        self.vm = vm
        self.nbytes = nbytes // 16 * 16
        self.buf = torch.ones(self.nbytes // 4, dtype=torch.int32, device=vm.torch_device)
        self.sink = torch.zeros(1, dtype=torch.int32, device=vm.torch_device)
        per_sm = self.kernel.occupancy.max_active_blocks_per_multiprocessor(512, 0)
        self.grid = vm.n_blocks * max(1, per_sm)

    def launch(self, stream: torch.cuda.Stream) -> None:
        from cuda.core import LaunchConfig, Stream, launch

        s = Stream.from_handle(stream.cuda_stream)
        launch(s, LaunchConfig(grid=self.grid, block=512), self.kernel, self.buf.data_ptr(), np.uint64(self.nbytes // 16), self.sink.data_ptr())

    def measure(self, reps: int = 20) -> dict[str, float]:
        ts = timing_stream(self.vm)
        t = _stats(time_ms(lambda r: self.launch(ts), ts, reps))
        return {**t, "bytes": self.nbytes, "tb_s": self.nbytes / (t["median_ms"] * 1e-3) / 1e12, "grid": self.grid}


@contextmanager
def at_claim_depth(vm: VM, depth: int) -> Iterator[None]:
    """The VM at this claim depth for the block, its own depth restored after."""
    kept, vm.claim_depth = vm.claim_depth, depth
    try:
        yield
    finally:
        vm.claim_depth = kept


def gemm_bandwidth(
    vm: VM, tokens: int, n: int | None = None, k: int = 4096, rows: int = 16, prefetch: bool = True, reps: int = 20,
    bufs: dict[str, torch.Tensor] | None = None, claim_depth: int | None = None,
) -> dict[str, float]:
    """Weight bytes / step time of a stream of GEMMs over one big bf16 W of n
    rows (default weight_rows(k): as many bytes as StreamRead reads, far more
    than L2, so every byte comes from HBM). bufs: reuse buffers of an earlier
    call with the same tokens, n and k. claim_depth: for this measurement
    (default the VM's); independent instructions stream best with a claim in
    flight (H200, fbb625c: 89.5% of the read at depth 1, 92.4% at 2 and 6)."""
    n = weight_rows(k) if n is None else n
    stream = gemm_stream(tokens, n, k, rows, DType.BF16, prefetch=prefetch)
    loaded = vm.load(stream, bufs if bufs is not None else gemm_bindings(stream, vm.torch_device))
    ts = timing_stream(vm)
    depth = claim_depth or vm.claim_depth
    with at_claim_depth(vm, depth):
        t = _stats(time_ms(lambda r: loaded.run(loaded.next_step, check=False, stream=ts), ts, reps))
        loaded.check(ts)
    wbytes = n * k * 2
    return {**t, "tokens": tokens, "rows_per_instr": rows, "prefetch": prefetch, "claim_depth": depth,
            "weight_bytes": wbytes, "instructions": len(stream), "tb_s": wbytes / (t["median_ms"] * 1e-3) / 1e12}


def dispatch_overhead(vm: VM, mode: str, per_block: int = 1000, reps: int = 20, claim_depth: int | None = None) -> dict[str, float]:
    """Empty instructions: step time of n_blocks * per_block NOPs, net of a
    launch with one NOP per block, per instruction per block (us), with
    claim_depth claims held ahead (default: every claim slot of the build;
    the VM's own depth is restored after)."""
    claim_depth = claim_depth or vm.claim_slots
    ts = timing_stream(vm)
    out: dict[str, float] = {"mode": mode, "per_block": per_block, "claim_depth": claim_depth}  # type: ignore[dict-item]
    with at_claim_depth(vm, claim_depth):
        for name, count in (("small", vm.n_blocks), ("big", vm.n_blocks * per_block)):
            loaded = vm.load(nop_stream(count), {})
            out[f"{name}_ms"] = _stats(time_ms(lambda r: loaded.run(loaded.next_step, mode, check=False, stream=ts), ts, reps))["median_ms"]
            loaded.check(ts)
    n = vm.n_blocks * (per_block - 1)
    out["us_per_instr_per_block"] = (out["big_ms"] - out["small_ms"]) * 1e3 * vm.n_blocks / n
    out["raw_us_per_instr_per_block"] = out["big_ms"] * 1e3 / per_block
    return out


def step_time(loaded: Loaded, mode: str = "dynamic", reps: int = 20, before: Callable[[], None] | None = None) -> dict[str, float]:
    """Median step time of a loaded stream (steps advance, counters carry)."""
    ts = timing_stream(loaded.vm)
    t = _stats(time_ms(lambda r: loaded.run(loaded.next_step, mode, check=False, stream=ts), ts, reps, before=before))
    loaded.check(ts)
    return t


def stamp_cost(plain: Loaded, traced: Loaded, mode: str = "dynamic", reps: int = 20) -> dict[str, float]:
    """The same stream on a kernel without and with the stamps compiled in."""
    a = step_time(plain, mode, reps)["median_ms"]
    b = step_time(traced, mode, reps)["median_ms"]
    return {"off_ms": a, "on_ms": b, "cost_ms": b - a, "cost_us_per_instr": (b - a) * 1e3 / len(plain.stream), "ratio": b / a}


def clock_ghz(tr: "object") -> float:
    """SM clock in GHz from a trace: clock64 span over %globaltimer span, per
    SM, median (the globaltimer's 256 ns steps vanish over a whole launch)."""
    rec = tr.records  # type: ignore[attr-defined]
    rates = []
    for sm in np.unique(rec["sm"]):
        r = rec[rec["sm"] == sm]
        clk = r["clock"][:, [int(Stamp.READY), int(Stamp.DONE)]].astype(np.int64)
        gt = r["globaltimer"][:, [int(Stamp.READY), int(Stamp.DONE)]].astype(np.int64)
        span = gt.max() - gt.min()
        if span > 10_000:
            rates.append((clk.max() - clk.min()) / span)
    if not rates:
        raise ValueError("the trace is too short to calibrate the clock")
    return float(np.median(rates))


def first_use_us(loaded: Loaded) -> dict[str, float]:
    """From the last launch's trace: mean compute time (READY -> DONE, clock64)
    of each opcode's first run on each SM, and of its later runs: a cold
    instruction cache shows as first > later."""
    tr = loaded.trace()
    ghz = clock_ghz(tr)
    clk = tr.records["clock"].astype(np.int64)
    dur = clk[:, int(Stamp.DONE)] - clk[:, int(Stamp.READY)]
    order = np.argsort(tr.records["globaltimer"][:, int(Stamp.READY)], kind="stable")
    seen: set[tuple[int, int]] = set()
    first: dict[str, list[int]] = {}
    later: dict[str, list[int]] = {}
    for i in order:
        key = (int(tr.records["sm"][i]), int(tr.opcodes[i]))
        name = Op(int(tr.opcodes[i])).name
        (later if key in seen else first).setdefault(name, []).append(int(dur[i]))
        seen.add(key)
    out: dict[str, float] = {"clock_ghz": ghz}
    for name in first:
        out[f"{name}_first_us"] = float(np.mean(first[name])) / ghz / 1e3
        if name in later:
            out[f"{name}_later_us"] = float(np.mean(later[name])) / ghz / 1e3
    return out


def warm_effect(loaded: Loaded, reps: int = 20) -> dict[str, object]:
    """Step time with the L2 flushed before every launch (code cold in L2),
    warmer off and on, and with a warm L2; with a traced VM, also the first-use
    times of each op."""
    vm = loaded.vm
    flush = L2Flush(vm.torch_device)
    out: dict[str, object] = {}
    for warm in (False, True):
        vm.warm = warm
        tag = "on" if warm else "off"
        out[f"cold_warm_{tag}_ms"] = step_time(loaded, reps=reps, before=flush)["median_ms"]
        out[f"hot_warm_{tag}_ms"] = step_time(loaded, reps=reps)["median_ms"]
        if vm.trace:
            flush()
            loaded.run(loaded.next_step)  # a cold launch, traced
            out[f"cold_warm_{tag}_first_use"] = first_use_us(loaded)
    return out
