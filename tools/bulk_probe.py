"""How fast bulk copies (cp.async.bulk, completing on an mbarrier) stream
weights on this GPU, outside the VM (issue 6).

Inside the VM a one-token GEMM that streamed its tile through a ring of bulk
copies ran at 1.9-2.6 TB/s, whatever the ring's depth, against 4.1 for the
register loads. This asks the copy engine alone: 2 blocks of 128 threads per
SM (the VM's two groups) each stream their share of 1 GiB through a ring of
`stages` slots of `copies` x `bytes`; thread 0 issues, every warp waits on a
slot's full barrier and releases it on its empty barrier (4 arrivals), as
session 11's bulk-copy GEMM path did (since removed: NOTES.md); `waiters` 1
has only warp 0 wait (the others idle). Host-timed over 10 launches (a
launch is ~0.25 ms).

    PYTHONPATH=. python3 tools/bulk_probe.py --out out/bulk_probe.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import torch

#: shared-memory address and mbarrier wait, also used by tools/ring_probe.py
HELPERS = r"""
__device__ __forceinline__ unsigned smem_u32(const void* p) {
    unsigned r; asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p)); return r;
}
__device__ __forceinline__ void bar_wait(unsigned bar, unsigned parity) {
    unsigned done;
    do {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2; selp.b32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}
"""

SRC = HELPERS + r"""
extern "C" __global__ void __launch_bounds__(128) ring(const char* src, unsigned long long per_block, unsigned bytes,
                                                       unsigned copies, unsigned stages, unsigned waiters, unsigned* sink) {
    extern __shared__ __align__(128) unsigned char sm[];
    const unsigned tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const unsigned bars = smem_u32(sm), ring0 = bars + 1024;
    const unsigned stage_bytes = bytes * copies;
    const char* base = src + per_block * blockIdx.x;
    const unsigned n_st = (unsigned)(per_block / stage_bytes);
    unsigned long long pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    if (tid == 0) {
        for (unsigned s = 0; s < stages; ++s) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(bars + 8 * s) : "memory");
            asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bars + 512 + 8 * s), "r"(waiters) : "memory");
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n\tfence.proxy.async;" ::: "memory");
    }
    __syncthreads();
    auto issue = [&](unsigned j) {
        const unsigned slot = j % stages, bar = bars + 8 * slot;
        asm volatile("{ .reg .b64 st; mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 st, [%0], %1; }" :: "r"(bar), "r"(stage_bytes) : "memory");
        for (unsigned c = 0; c < copies; ++c)
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
                         :: "r"(ring0 + slot * stage_bytes + c * bytes), "l"(base + (unsigned long long)j * stage_bytes + c * bytes),
                            "r"(bytes), "r"(bar), "l"(pol) : "memory");
    };
    if (tid == 0) for (unsigned j = 0; j < stages && j < n_st; ++j) issue(j);
    unsigned acc = 0, slot = 0, parity = 0;
    for (unsigned i = 0; i < n_st; ++i) {
        if (warp < waiters) {
            bar_wait(bars + 8 * slot, parity);
            unsigned v;
            asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(ring0 + slot * stage_bytes + 16 * tid) : "memory");
            acc += v;
            __syncwarp();
            if (lane == 0) asm volatile("{ .reg .b64 st; mbarrier.arrive.release.cta.shared::cta.b64 st, [%0]; }" :: "r"(bars + 512 + 8 * slot) : "memory");
        }
        if (tid == 0 && i + stages < n_st) {
            bar_wait(bars + 512 + 8 * slot, parity);
            issue(i + stages);
        }
        if (++slot == stages) { slot = 0; parity ^= 1; }
    }
    if (acc == 0x12345678u) sink[0] = acc;
}
"""


def probe() -> dict[str, object]:
    import time

    from cuda.bindings import driver
    from cuda.core import Device, LaunchConfig, ObjectCode, launch

    from gpuvm.device.build import compile_source

    dev = Device()
    dev.set_current()
    stream = dev.create_stream()
    cubin, _ = compile_source(SRC, "bulk_probe.cu", [], [])
    k = ObjectCode.from_cubin(cubin).get_kernel("ring")
    func = driver.cuKernelGetFunction(driver.CUkernel(int(k.handle)))[1]
    driver.cuFuncSetAttribute(func, driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 100 * 1024)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    blocks = 2 * sms
    total = 1 << 30
    src = torch.ones(total // 4, dtype=torch.int32, device="cuda")
    sink = torch.zeros(1, dtype=torch.int32, device="cuda")
    res: dict[str, object] = {}
    for bytes_, copies, stages, waiters in ((512, 16, 6, 4), (8192, 1, 3, 4), (8192, 1, 6, 4), (8192, 1, 6, 1),
                                            (16384, 1, 3, 4), (32768, 1, 2, 4), (4096, 1, 12, 4), (2048, 4, 6, 4),
                                            (8192, 2, 3, 4), (1024, 8, 6, 4)):
        stage_bytes = bytes_ * copies
        smem = 1024 + stages * stage_bytes
        per_block = (total // blocks) // stage_bytes * stage_bytes
        cfg = LaunchConfig(grid=blocks, block=128, shmem_size=smem)
        args = (src.data_ptr(), np.uint64(per_block), np.uint32(bytes_), np.uint32(copies), np.uint32(stages), np.uint32(waiters), sink.data_ptr())
        launch(stream, cfg, k, *args)
        stream.sync()
        reps = 10
        t0 = time.perf_counter()
        for _ in range(reps):
            launch(stream, cfg, k, *args)
        stream.sync()
        ms = (time.perf_counter() - t0) * 1e3 / reps
        tb = per_block * blocks / ms / 1e9
        key = f"{bytes_}Bx{copies}/stages{stages}/waiters{waiters}"
        res[key] = {"ms": ms, "tb_s": tb, "in_flight_kb_per_block": (stages - 1) * stage_bytes / 1024}
        print(f"{key:32s} {ms:7.3f} ms  {tb:5.2f} TB/s  ({(stages - 1) * stage_bytes // 1024} KB in flight a block)", flush=True)
    return res


def probe_main(doc: str, out: str, run: Callable[[], dict[str, object]]) -> int:
    """A probe's command line (also tools/fence_probe.py's): run it, its results as JSON to --out."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=out)
    a = ap.parse_args()
    res = run()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))
    return 0


def main() -> int:
    return probe_main(__doc__, "out/bulk_probe.json", probe)


if __name__ == "__main__":
    sys.exit(main())
