// PREFETCH (isa/gvm_isa.h): byte ranges of any tensor into L2, e.g. weights an
// op will read later, fetched while the ops before it run. Bulk prefetches
// (gvm_prefetch_l2) hold no register and complete on their own, so the op
// returns once they are issued, in chunks of 8 KB like the loader's
// (runtime/loader.cuh). Unpaced, the group's 128 threads issue every chunk at
// once; paced, warp 0 issues rounds of 64 KB (lanes 0-7, a chunk each) a2 ns
// apart, so that a long range leaves the HBM to the ops running beside it. The
// other warps return at once and wait at the runtime's barrier after the op.
// Counts are 32-bit (a1 < 2^31 units): with 64-bit ones the persistent kernel
// spilled (4 B stores, 56 B loads at 168 registers, NVRTC 13.0).
#pragma once
#include "common.cuh"
#include "../runtime/params.cuh"  // GVM_GROUP_THREADS
#include "../runtime/stamps.cuh"  // gvm_globaltimer, gvm_nanosleep

#define GVM_PREFETCH_CHUNK_UNITS 512u   // 16-byte units per bulk prefetch: 8 KB
#define GVM_PREFETCH_ROUND 8u           // chunks per paced round: 64 KB
#define GVM_PREFETCH_MAX_PACE 1000000   // ns per round (gpuvm/opspec.py PREFETCH_MAX_PACE_NS)

// Bytes of a contiguous tensor: its shape's product times the element's bytes
// (an e2m1x2 shape counts bytes, as gpuvm.isa.DTYPE_BYTES); 0 for an unknown dtype.
__device__ __forceinline__ long long gvm_tensor_bytes(const gvm_tensor& t) {
    const int dt = t.dtype;
    long long n = (dt == GVM_DT_F32) | (dt == GVM_DT_I32) ? 4
                  : dt == GVM_DT_BF16                      ? 2
                  : (dt == GVM_DT_E4M3) | (dt == GVM_DT_E2M1X2) | (dt == GVM_DT_U8) ? 1 : 0;
#pragma unroll
    for (int d = 0; d < GVM_MAX_DIMS; ++d) n *= d < t.ndim ? t.shape[d] : 1;
    return n;
}

// Chunk k of the `units` 16-byte units at p; the last may be shorter.
__device__ __forceinline__ void gvm_prefetch_chunk(const char* p, unsigned units, unsigned k) {
    const unsigned left = units - k * GVM_PREFETCH_CHUNK_UNITS;
    gvm_prefetch_l2(p + (unsigned long long)k * GVM_PREFETCH_CHUNK_UNITS * 16,
                    16u * (left < GVM_PREFETCH_CHUNK_UNITS ? left : GVM_PREFETCH_CHUNK_UNITS));
}

__device__ int gvm_op_prefetch(const gvm_ctx& c) {
    if (!gvm_has(c, 0)) return GVM_ERR_BAD_ARGS;  // no descriptor to read
    const gvm_tensor& t = gvm_t(c, 0);
    const int a0 = c.ins->arg[0], a1 = c.ins->arg[1], pace = c.ins->arg[2], stride = c.ins->arg[4];
    const int n = c.ins->arg[3] > 1 ? c.ins->arg[3] : 1;
    const unsigned cpr = ((unsigned)a1 + GVM_PREFETCH_CHUNK_UNITS - 1) / GVM_PREFETCH_CHUNK_UNITS;  // chunks a range
    const bool ok = (a0 >= 0) & (a1 >= 1) & (pace >= 0) & (pace <= GVM_PREFETCH_MAX_PACE) & (stride >= 0) &
                    (c.ins->arg[3] >= 0) & ((long long)n * cpr < (1ll << 31)) &
                    (((long long)a0 + (long long)(n - 1) * stride + a1) * 16 <= gvm_tensor_bytes(t)) & (t.ptr % 16 == 0);
    if (!ok) return GVM_ERR_BAD_ARGS;
    const char* p = reinterpret_cast<const char*>(t.ptr) + (long long)a0 * 16;
    const unsigned units = a1, chunks = (unsigned)n * cpr;
    // flat chunk j: chunk j % cpr of range j / cpr
    auto issue = [&](unsigned j) {
        const unsigned r = j / cpr;
        gvm_prefetch_chunk(p + (unsigned long long)r * (unsigned)stride * 16ull, units, j - r * cpr);
    };
    if (pace == 0) {
#pragma unroll 1
        for (unsigned j = c.tid; j < chunks; j += GVM_GROUP_THREADS) issue(j);
        return GVM_ERR_NONE;
    }
    if (c.tid >= 32) return GVM_ERR_NONE;
    const unsigned long long start = c.tid == 0 ? gvm_globaltimer() : 0ull;
#pragma unroll 1
    for (unsigned r = 0; r * GVM_PREFETCH_ROUND < chunks; ++r) {
        if (c.tid == 0) {  // round r not before start + r * pace, in naps of at most 1 us like SLEEP
            const unsigned long long at = start + (unsigned long long)r * (unsigned)pace;
            for (unsigned long long now = gvm_globaltimer(); now < at; now = gvm_globaltimer()) {
                const unsigned long long left = at - now;
                gvm_nanosleep(left < 1000ull ? (unsigned)left : 1000u);
            }
        }
        __syncwarp();
        const unsigned j = r * GVM_PREFETCH_ROUND + c.tid;
        if (c.tid < GVM_PREFETCH_ROUND && j < chunks) issue(j);
    }
    return GVM_ERR_NONE;
}
