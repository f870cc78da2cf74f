"""What the few-token expert ring's copies can stream, outside the VM (issue 6).

Session 25's probes showed the one-round expert lists wait on their weight
copies, not on the decode (NOTES.md "Ringbench"), and that more ring slots do
not help. This kernel copies the way `gvm_expr_unit_ring` (ops/experts.cuh)
does and does nothing else: 2 blocks of 4 warps an SM (the VM's groups); each
warp streams units of 16 rows x 2,048 B of codes (one expert's rows of the
4096-wide squeeze) plus 128 B of scales a row, through a ring of `slots` slots
of two pieces (16 rows x 64 B of codes + 16 x 8 B of scales: one K step of the
gate and up sets), by per-lane 16-byte and 4-byte `cp.async` with one commit
group a slot, and reads each slot back from shared memory once it is in.
Layouts of the same bytes:

- rows: as the shard stores them (row-major [rows][2048]): a piece reads 64 B of
  each of 16 rows 2 KB apart (and 8 B of scales of each);
- packed: every piece's 1,152 bytes contiguous, in the order they are read (an
  offline repack into the ring's order);
- bulk: packed, each piece one `cp.async.bulk` by lane 0 on the slot's mbarrier;
- split: codes and scales kept apart, each in piece order (a piece's 1,024 bytes of
  codes contiguous, its 128 bytes of scales contiguous in a second tensor);
- split8: the same in blocks of 8 rows (a piece is two runs of 512 + 64 bytes: the
  shared tile's UP unit is 8 rows).

Host-timed, median of 10 launches over `mb` MB of weights with an L2 flush
before each; GB/s against the streaming read of the same bytes.

    PYTHONPATH=. python3 tools/ring_probe.py --out out/ring_probe.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools.bulk_probe import HELPERS  # noqa: E402

SRC = HELPERS + r"""
__device__ __forceinline__ void cp16(unsigned dst, const void* src, unsigned long long pol) {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "l"(pol) : "memory");
}
__device__ __forceinline__ void cp4(unsigned dst, const void* src, unsigned long long pol) {
    asm volatile("cp.async.ca.shared.global.L2::cache_hint [%0], [%1], 4, %2;" :: "r"(dst), "l"(src), "l"(pol) : "memory");
}
#define PIECE 1152u   // 16 rows x 64 B of codes + 16 x 8 B of scales
#define SLOT (2u * PIECE)
#define STEPS 32u     // K steps of a unit: 2,048 B of codes a row / 64
// layout 0 rows, 1 packed (per-lane copies), 2 packed (one bulk copy a piece), 3 split, 4 split in 8-row blocks
extern "C" __global__ void __launch_bounds__(128) ring(const unsigned char* codes, const unsigned char* scales, unsigned units,
                                                       unsigned layout, unsigned slots, unsigned* sink) {
    extern __shared__ __align__(128) unsigned char sm[];
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned ring = smem_u32(sm) + 128 + warp * slots * SLOT, bars = smem_u32(sm) + warp * 32;
    unsigned long long pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    if (layout == 2 && lane < slots)
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(bars + 8 * lane) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    __syncwarp();
    const unsigned gw = blockIdx.x * 4 + warp, nw = gridDim.x * 4;
    unsigned acc = 0, issued = 0, done = 0;
    for (unsigned u = gw; u < units; u += nw) {
        // unit u: pieces (set s, step k), s = 0, 1; a slot is step k of both sets
        auto issue = [&](unsigned k) {
            const unsigned slot = issued % slots, base = ring + slot * SLOT;
            if (k < STEPS) {
                for (unsigned s = 0; s < 2; ++s) {
                    const unsigned long long piece = ((unsigned long long)(2 * u + s) * STEPS + k);  // its index in the packed order
                    if (layout != 2) {  // this lane's 32 bytes of codes (row lane / 2, half lane % 2) and 4 of scales
                        const unsigned r = lane >> 1, half = lane & 1;
                        const unsigned char *cs, *ss;
                        if (layout == 0) {
                            const unsigned long long row = (2ull * u + s) * 16 + r;
                            cs = codes + row * 2048 + 64 * k + 32 * half;
                            ss = scales + row * 256 + 8 * k + 4 * half;
                        } else if (layout == 1) {
                            cs = codes + piece * PIECE + 32 * lane;
                            ss = codes + piece * PIECE + 1024 + 4 * lane;
                        } else if (layout == 3) {
                            cs = codes + piece * 1024 + 32 * lane;
                            ss = scales + piece * 128 + 4 * lane;
                        } else {
                            const unsigned long long blk = ((2ull * u + s) * 2 + (r >> 3)) * STEPS + k;
                            cs = codes + blk * 512 + (r & 7) * 64 + 32 * half;
                            ss = scales + blk * 64 + (r & 7) * 8 + 4 * half;
                        }
                        cp16(base + s * PIECE + 32 * lane, cs, pol);
                        cp16(base + s * PIECE + 32 * lane + 16, cs + 16, pol);
                        cp4(base + s * PIECE + 1024 + 4 * lane, ss, pol);
                    } else if (lane == 0) {
                        const unsigned bar = bars + 8 * slot;
                        if (s == 0)
                            asm volatile("{ .reg .b64 st; mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 st, [%0], %1; }" :: "r"(bar), "r"(SLOT) : "memory");
                        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
                                     :: "r"(base + s * PIECE), "l"(codes + piece * PIECE), "r"(PIECE), "r"(bar), "l"(pol) : "memory");
                    }
                }
            } else if (layout == 2 && lane == 0) {
                asm volatile("{ .reg .b64 st; mbarrier.arrive.release.cta.shared::cta.b64 st, [%0]; }" :: "r"(bars + 8 * slot) : "memory");
            }
            if (layout != 2) asm volatile("cp.async.commit_group;" ::: "memory");
            ++issued;
        };
        for (unsigned k = 0; k + 1 < slots; ++k) issue(k);
        for (unsigned k = 0; k < STEPS; ++k) {
            if (layout == 2) {
                bar_wait(bars + 8 * (done % slots), (done / slots) & 1);
            } else if (slots == 2) {
                asm volatile("cp.async.wait_group 0;" ::: "memory");
            } else if (slots == 3) {
                asm volatile("cp.async.wait_group 1;" ::: "memory");
            } else {
                asm volatile("cp.async.wait_group 2;" ::: "memory");
            }
            __syncwarp();
            const unsigned base = ring + (done % slots) * SLOT;
            issue(k + slots - 1);
            unsigned v0, v1, v2;
            asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v0) : "r"(base + 16 * lane) : "memory");
            asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v1) : "r"(base + PIECE + 16 * lane) : "memory");
            asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v2) : "r"(base + 1024 + 4 * lane) : "memory");
            acc += v0 ^ v1 ^ v2;
            ++done;
        }
        if (layout == 2) {  // the empty arrivals past the unit's end complete their phases
            for (unsigned k = STEPS; k < STEPS + slots - 1; ++k) { bar_wait(bars + 8 * (done % slots), (done / slots) & 1); ++done; }
        } else {
            asm volatile("cp.async.wait_group 0;" ::: "memory");
        }
        __syncwarp();
    }
    if (acc == 0x12345678u) sink[0] = acc;
}
"""

PIECE, STEPS = 1152, 32  # the kernel's
LAYOUTS = ("rows", "packed", "bulk", "split", "split8")  # the kernel's layout numbers


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="out/ring_probe.json")
    ap.add_argument("--mb", type=int, default=1024, help="MB of codes (+1/8 of scales)")
    ap.add_argument("--slots", default="2,3,4")
    ap.add_argument("--layouts", default="rows,packed,bulk,split,split8")
    a = ap.parse_args()
    slot_counts = [int(x) for x in a.slots.split(",")]
    if not all(2 <= n <= 4 for n in slot_counts):  # the kernel waits on 2-4 slots' groups and has 4 barriers a warp
        ap.error(f"--slots takes 2 to 4 slots, not {a.slots}")
    if unknown := set(a.layouts.split(",")) - set(LAYOUTS):
        ap.error(f"unknown layouts {sorted(unknown)}; known: {', '.join(LAYOUTS)}")
    from cuda.core import Device, LaunchConfig, ObjectCode, Stream, launch

    from gpuvm.device.bench import L2Flush, StreamRead, time_ms
    from gpuvm.device.build import compile_source

    dev = Device(0)
    dev.set_current()
    sms = dev.properties.multiprocessor_count
    gpu = SimpleNamespace(torch_device=torch.device("cuda", 0), n_blocks=sms)  # what StreamRead reads of a VM
    cubin, _ = compile_source(SRC, "ring_probe.cu", [], [])
    kern = ObjectCode.from_cubin(cubin).get_kernel("ring")
    units = a.mb * 2**20 // (2 * 16 * 2048)
    codes = torch.randint(0, 255, (units * 2 * 16 * (2048 + 256),), dtype=torch.uint8, device="cuda")
    scales = codes[units * 2 * 16 * 2048 :]
    sink = torch.zeros(1, dtype=torch.int32, device="cuda")
    nbytes = units * 2 * STEPS * PIECE
    ts = torch.cuda.Stream()
    flush = L2Flush(torch.device("cuda", 0))
    floor = StreamRead(gpu).measure()  # type: ignore[arg-type]
    res: dict[str, float] = {"streaming_read_tb_s": floor["tb_s"], "bytes": nbytes}
    print(f"streaming read {floor['tb_s']:.2f} TB/s; {nbytes / 1e6:.0f} MB a launch", flush=True)
    for layout, name in enumerate(LAYOUTS):
        if name not in a.layouts.split(","):
            continue
        for slots in slot_counts:
            cfg = LaunchConfig(grid=2 * sms, block=128, shmem_size=128 + 4 * slots * 2 * PIECE)
            args = (codes.data_ptr(), scales.data_ptr(), np.uint32(units), np.uint32(layout), np.uint32(slots), sink.data_ptr())
            t = statistics.median(time_ms(lambda r: launch(Stream.from_handle(ts.cuda_stream), cfg, kern, *args), ts, 10, before=flush)) * 1e-3
            res[f"{name}/{slots}"] = nbytes / t / 1e9
            print(f"{name:7s} slots {slots}: {t * 1e6:8.1f} us  {nbytes / t / 1e9:7.0f} GB/s  ({nbytes / t / 1e12 / floor['tb_s']:.0%} of the streaming read)", flush=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
