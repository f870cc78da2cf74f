// Warp 1: issues each claimed instruction's weight prefetch into L2 as soon
// as it is claimed, before the instruction's dependency waits, since weights
// never depend on earlier ops. Bulk L2 prefetches cost no registers and
// complete on their own; the op's own loads then hit L2.
#pragma once
#include "shared.cuh"
#include "stamps.cuh"

#define GVM_PF_CHUNK 8192u  // bytes per bulk prefetch

__device__ __forceinline__ void gvm_prefetch_l2(unsigned long long addr, unsigned bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(addr), "r"(bytes) : "memory");
}

// Lanes split [begin, end) (16-byte aligned) into chunks.
__device__ __forceinline__ void gvm_prefetch_range(unsigned long long begin, unsigned long long end, unsigned lane) {
#pragma unroll 1
    for (unsigned long long a = begin + (unsigned long long)lane * GVM_PF_CHUNK; a < end; a += 32ull * GVM_PF_CHUNK) {
        const unsigned long long left = end - a;
        gvm_prefetch_l2(a, left < GVM_PF_CHUNK ? (unsigned)left : GVM_PF_CHUNK);
    }
}

__device__ __forceinline__ void gvm_loader(const gvm_params& p, gvm_shared& sh) {
    const unsigned lane = threadIdx.x & 31u;
    {   // this block's share of the stream's records, so that claims read them from L2
        const unsigned total = p.n_instrs * (unsigned)sizeof(gvm_instr);  // < 2^29 (GVM_MAX_INSTRS)
        const unsigned share = (total / gridDim.x + 15u) & ~15u;
        const unsigned b = share * blockIdx.x, e = b + share < total ? b + share : total;
        const unsigned long long base = reinterpret_cast<unsigned long long>(p.instrs);
        if (b < e) gvm_prefetch_range(base + b, base + e, lane);
    }
    unsigned tail = 0;
    for (;;) {  // lane 0's reads decide, so the warp never diverges around __syncwarp
        if (__shfl_sync(0xffffffffu, sh.ring_head, 0) == tail) {
            const unsigned closed = __shfl_sync(0xffffffffu, sh.ring_closed, 0);
            if (closed && __shfl_sync(0xffffffffu, sh.ring_head, 0) == tail) break;  // closed after its last push
            if (!closed) gvm_nanosleep(64);
            continue;
        }
        __threadfence_block();
        const gvm_pf_entry e = sh.ring[tail % GVM_PF_RING];
        const unsigned long long base = p.table[e.tensor].ptr + e.offset;
        gvm_prefetch_range(base & ~15ull, (base + e.bytes + 15ull) & ~15ull, lane);
        if (lane == 0) GVM_STAMP(p.trace, e.idx, GVM_STAMP_LOAD);
        __syncwarp();
        ++tail;
        if (lane == 0) sh.ring_tail = tail;
    }
}
