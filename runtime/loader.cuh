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

#if GVM_WATCH
// Marks a watched instruction met for the controller. A slot's claims come in
// stream order, so the largest mark is its current claim's: a late mark of an
// earlier claim (one parked after it was watched) never hides it.
__device__ __forceinline__ void gvm_watch_mark(gvm_shared& sh, unsigned idx, unsigned slot) {
    if (slot < GVM_CLAIM_SLOTS) atomicMax(const_cast<unsigned*>(&sh.watch_met[slot]), idx + 1u);
}

// One poll of the watch list (lane k: entry k, its waits loaded together):
// marks and drops the entries whose waits are met. Returns the list's mask.
__device__ __forceinline__ unsigned gvm_watch_poll(const gvm_params& p, gvm_shared& sh, unsigned mask, unsigned lane) {
    bool met = false;
    if (lane < GVM_WATCH_LIST && ((mask >> lane) & 1u)) {
        const gvm_watch_entry& w = sh.watch[lane];
        unsigned v[GVM_MAX_WAITS];
#pragma unroll
        for (int i = 0; i < GVM_MAX_WAITS; ++i) v[i] = w.counter[i] != GVM_NONE ? gvm_ld_relaxed(p.counters + w.counter[i]) : 0u;
        met = true;
#pragma unroll
        for (int i = 0; i < GVM_MAX_WAITS; ++i) met = met && (w.counter[i] == GVM_NONE || gvm_reached(v[i], w.target[i]));
        if (met) gvm_watch_mark(sh, w.idx, w.slot);
    }
    return mask & ~__ballot_sync(0xffffffffu, met);
}
#endif

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
    unsigned watched = 0;  // GVM_WATCH: the watch list's entries in use (bit k: entry k), the same in every lane
    for (;;) {  // lane 0's reads decide, so the warp never diverges around __syncwarp
#if GVM_WATCH
        if (watched != 0u) watched = gvm_watch_poll(p, sh, watched, lane);
#endif
        if (__shfl_sync(0xffffffffu, sh.ring_head, 0) == tail) {
            const unsigned closed = __shfl_sync(0xffffffffu, sh.ring_closed, 0);
            if (closed && __shfl_sync(0xffffffffu, sh.ring_head, 0) == tail) break;  // closed after its last push
            if (!closed && watched == 0u) gvm_nanosleep(64);
            continue;
        }
        __threadfence_block();
        const gvm_pf_entry& e = sh.ring[tail % GVM_PF_RING];
        const unsigned n_waits = e.n_waits < GVM_MAX_WAITS ? e.n_waits : GVM_MAX_WAITS;
        const bool unmet = lane < n_waits && !gvm_reached(gvm_ld_relaxed(p.counters + e.counter[lane]), e.target[lane]);
        if (__any_sync(0xffffffffu, unmet)) {
#if GVM_WATCH
            if (e.bytes != 0u) {
#endif
            const unsigned long long base = p.table[e.tensor].ptr + e.offset;
            const unsigned bytes = e.bytes < GVM_PF_MAX_BYTES ? e.bytes : GVM_PF_MAX_BYTES;
            gvm_prefetch_range(base & ~15ull, (base + bytes + 15ull) & ~15ull, lane);
            if (lane == 0) GVM_STAMP(p.trace, e.idx, GVM_STAMP_LOAD);
#if GVM_WATCH
            } else if (lane == 0) {
                GVM_STAMP_COPY(p.trace, e.idx, GVM_STAMP_LOAD, GVM_STAMP_CLAIM);
            }
            // a held claim into the watch list (never full for long: at most the claims
            // held, or held once and parked since, are unmet: GVM_CLAIM_SLOTS + groups < GVM_WATCH_LIST)
            if (e.slot < GVM_CLAIM_SLOTS) {
            while (watched == (1u << GVM_WATCH_LIST) - 1u) watched = gvm_watch_poll(p, sh, watched, lane);
            const unsigned k = __ffs(~watched) - 1u;
            if (lane < GVM_MAX_WAITS) {
                sh.watch[k].counter[lane] = lane < n_waits ? e.counter[lane] : GVM_NONE;
                sh.watch[k].target[lane] = e.target[lane];
            }
            if (lane == 0) {
                sh.watch[k].idx = e.idx;
                sh.watch[k].slot = e.slot;
            }
            __syncwarp();
            watched |= 1u << k;
            }
#endif
        } else if (lane == 0) {
            GVM_STAMP_COPY(p.trace, e.idx, GVM_STAMP_LOAD, GVM_STAMP_CLAIM);
#if GVM_WATCH
            gvm_watch_mark(sh, e.idx, e.slot);  // met already: the controller may be waiting on it
#endif
        }
        __syncwarp();
        ++tail;
        if (lane == 0) sh.ring_tail = tail;
    }
}
