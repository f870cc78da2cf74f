"""Does a proxy fence wait for the copies a warp has in flight? (issue 6)

The warpgroup attention round (ops/attention.cuh) converts each step's raw
K/V into f16 tiles with plain shared stores, so before its `wgmma` reads them
every thread runs `fence.proxy.async.shared::cta`, which ptxas emits as
`MEMBAR.ALL.CTA` + `FENCE.VIEW.ASYNC.S`. The same threads have the next steps'
`cp.async` copies in flight. If the MEMBAR waits for those, each step pays a
memory round trip and the copies run ahead for nothing.

This kernel times it alone: each block's threads start `n` 16-byte loads of
cold memory (`cp.async`, `ld.global` into registers, or `cp.async.bulk` on an
mbarrier, the async proxy), then run a fence (none, the proxy fence,
`fence.acq_rel.cta` (MEMBAR), or a block barrier), then wait for the loads;
thread 0 notes %clock64 around each part. Cycles per part, medians over the
iterations (a fresh 64 KB region of a 1 GiB buffer each), first with one
block, then with two blocks an SM (the VM's groups).

    PYTHONPATH=. python3 tools/fence_probe.py --out out/fence_probe.json
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools.bulk_probe import HELPERS, probe_main  # noqa: E402

ITERS = 32
REGION = 64 * 1024  # bytes a block reads an iteration: 128 threads x n <= 4 x 16 B, 512 B apart
KINDS = {"cp.async": 0, "ld.global": 1, "cp.async.bulk": 2}
FENCES = {"none": 0, "proxy.async": 1, "membar.cta": 2, "bar.sync": 3}

SRC = HELPERS + r"""
__device__ __forceinline__ unsigned long long clk() {
    unsigned long long t; asm volatile("mov.u64 %0, %%clock64;" : "=l"(t) :: "memory"); return t;
}
extern "C" __global__ void __launch_bounds__(128) probe(const char* src, int kind, int fence, int n,
                                                        unsigned long long* out, unsigned* sink) {
    __shared__ __align__(128) unsigned char sm[8192 + 16];
    const unsigned tid = threadIdx.x, bar = smem_u32(sm + 8192), dst0 = smem_u32(sm);
    if (tid == 0) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n\tfence.mbarrier_init.release.cluster;" :: "r"(bar) : "memory");
    __syncthreads();
    unsigned acc = 0;
    for (int it = 0; it < ITERS; ++it) {
        const char* base = src + ((unsigned long long)blockIdx.x * ITERS + it) * REGION;
        if (kind == 2 && tid == 0)
            asm volatile("{ .reg .b64 st; mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 st, [%0], %1; }"
                         :: "r"(bar), "r"(128u * 16u * n) : "memory");
        __syncthreads();
        const unsigned long long t0 = clk();
        uint4 r[4] = {};
#pragma unroll
        for (int j = 0; j < 4; ++j) {  // chunk j of thread tid: 16 B at 512 (32 j + tid / 4) + 16 (tid % 4)
            if (j >= n) break;
            const char* p = base + 512 * (32 * j + tid / 4) + 16 * (tid % 4);
            const unsigned d = dst0 + 16 * (128 * j + tid);
            if (kind == 0) asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(d), "l"(p) : "memory");
            if (kind == 1) asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r[j].x), "=r"(r[j].y), "=r"(r[j].z), "=r"(r[j].w) : "l"(p) : "memory");
            if (kind == 2) asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], 16, [%2];"
                                        :: "r"(d), "l"(p), "r"(bar) : "memory");
        }
        if (kind == 0) asm volatile("cp.async.commit_group;" ::: "memory");
        const unsigned long long t1 = clk();
        if (fence == 1) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        if (fence == 2) asm volatile("fence.acq_rel.cta;" ::: "memory");
        if (fence == 3) asm volatile("bar.sync 1, 128;" ::: "memory");
        const unsigned long long t2 = clk();
        if (kind == 0) asm volatile("cp.async.wait_group 0;" ::: "memory");
        if (kind == 1)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc += j < n ? r[j].x ^ r[j].w : 0u;
        if (kind == 2) bar_wait(bar, it & 1);
        if (kind != 1) { unsigned v; asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(dst0 + 16 * tid) : "memory"); acc += v; }
        const unsigned long long t3 = clk();
        if (tid == 0) {
            unsigned long long* o = out + 3 * ((unsigned long long)blockIdx.x * ITERS + it);
            o[0] = t1 - t0; o[1] = t2 - t1; o[2] = t3 - t2;
        }
    }
    if (acc == 0x12345678u) sink[0] = acc;
}
"""


def source() -> str:
    """The probe kernel's CUDA source, its constants filled in."""
    return SRC.replace("ITERS", str(ITERS)).replace("REGION", str(REGION))


def probe() -> dict[str, object]:
    from cuda.core import Device, LaunchConfig, ObjectCode, launch

    from gpuvm.device.build import compile_source

    dev = Device()
    dev.set_current()
    stream = dev.create_stream()
    cubin, _ = compile_source(source(), "fence_probe.cu", [], [])
    k = ObjectCode.from_cubin(cubin).get_kernel("probe")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    src = torch.ones((2 * sms * ITERS * REGION) // 4, dtype=torch.int32, device="cuda")
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    sink = torch.zeros(1, dtype=torch.int32, device="cuda")
    res: dict[str, object] = {}
    for blocks in (1, 2 * sms):
        out = torch.zeros(blocks * ITERS * 3, dtype=torch.int64, device="cuda")
        for kind, kv in KINDS.items():
            for n in (1, 4):
                for fence, fv in FENCES.items():
                    flush.fill_(1)
                    torch.cuda.synchronize()
                    launch(stream, LaunchConfig(grid=blocks, block=128), k, src.data_ptr(), np.int32(kv), np.int32(fv), np.int32(n),
                           out.data_ptr(), sink.data_ptr())
                    stream.sync()
                    o = out.view(-1, 3)[4:] if blocks == 1 else out.view(blocks, ITERS, 3)[:, 4:].reshape(-1, 3)  # first iterations: cold code
                    med = [statistics.median(o[:, i].tolist()) for i in range(3)]
                    key = f"blocks{blocks}/{kind}/n{n}/{fence}"
                    res[key] = {"issue": med[0], "fence": med[1], "wait": med[2]}
                    print(f"{key:40s} issue {med[0]:7.0f}  fence {med[1]:7.0f}  wait after {med[2]:7.0f} cycles", flush=True)
    return res


def main() -> int:
    return probe_main(__doc__, "out/fence_probe.json", probe)


if __name__ == "__main__":
    sys.exit(main())
