// Warp 1: starts the weight loads of an instruction that will wait on its
// dependencies, into L2, as it is handed to a group and before its waits are
// met (weights never depend on earlier ops). Bulk L2 prefetches cost no
// registers and complete on their own; the op's own loads then hit L2.
//
// An instruction whose waits are already met when the loader looks gets no
// prefetch: its group streams the weights at once, and a prefetch of the
// same bytes only competes with that stream (measured on the H200: GEMM at
// 59-71% of the streaming read with it, 86-90% without). For one that waits,
// only the first GVM_PF_MAX_BYTES are fetched: enough to cover the group's
// start, and little enough that the burst of prefetches when a wave of tiles
// is claimed does not hold up the latency-bound op they wait for (H200,
// 61bf680, 8 / 0 / 32 / 128 KB: step 1x1 11.42 / 11.35 / 11.73 / 13.16 ms,
// 1x8 20.96 / 21.13 / 21.41 / 22.89; 256 tokens and the layers alone within 2%).
#pragma once
#include "shared.cuh"
#include "stamps.cuh"
#include "../scheduler/counters.cuh"
#include "../ops/ptx.cuh"  // gvm_prefetch_l2

#define GVM_PF_CHUNK 8192u  // bytes per bulk prefetch
#ifndef GVM_PF_MAX_BYTES
#define GVM_PF_MAX_BYTES 8192u
#endif

// Lanes split [begin, end) (16-byte aligned) into chunks.
__device__ __forceinline__ void gvm_prefetch_range(unsigned long long begin, unsigned long long end, unsigned lane) {
#pragma unroll 1
    for (unsigned long long a = begin + (unsigned long long)lane * GVM_PF_CHUNK; a < end; a += 32ull * GVM_PF_CHUNK) {
        const unsigned long long left = end - a;
        gvm_prefetch_l2(reinterpret_cast<const void*>(a), left < GVM_PF_CHUNK ? (unsigned)left : GVM_PF_CHUNK);
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
        const gvm_pf_entry& e = sh.ring[tail % GVM_PF_RING];
        const unsigned n_waits = e.n_waits < GVM_MAX_WAITS ? e.n_waits : GVM_MAX_WAITS;
        const bool unmet = lane < n_waits && !gvm_reached(gvm_ld_relaxed(p.counters + e.counter[lane]), e.target[lane]);
        if (__any_sync(0xffffffffu, unmet)) {
            const unsigned long long base = p.table[e.tensor].ptr + e.offset;
            const unsigned bytes = e.bytes < GVM_PF_MAX_BYTES ? e.bytes : GVM_PF_MAX_BYTES;
            gvm_prefetch_range(base & ~15ull, (base + bytes + 15ull) & ~15ull, lane);
            if (lane == 0) GVM_STAMP(p.trace, e.idx, GVM_STAMP_LOAD);
        } else if (lane == 0) {
            GVM_STAMP_COPY(p.trace, e.idx, GVM_STAMP_LOAD, GVM_STAMP_CLAIM);
        }
        __syncwarp();
        ++tail;
        if (lane == 0) sh.ring_tail = tail;
    }
}
