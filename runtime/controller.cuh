// Warp 0: claims instructions in stream order and hands each to a free
// compute group; claims the next one while the groups work, so the claim's
// latency hides behind them (one claim held, not yet handed out).
//
// No deadlock, by construction. Every instruction waits only on instructions
// earlier in the stream. A block receives its indices in increasing order
// (one atomic head, or an increasing static list) and hands them out in that
// order, so it never holds an earlier claim behind a later one. Take the
// earliest instruction m not finished: everything m waits on is finished, so
// if a group has m it completes. Otherwise m is this block's held claim, and
// every instruction its groups hold is earlier than m, hence finished, so a
// group comes free and m is handed to it. In dynamic mode this needs no
// co-residency (an unstarted block holds nothing); static mode needs every
// block resident, which the launch checks.
#pragma once
#include "shared.cuh"
#include "stamps.cuh"
#include "../scheduler/claim.cuh"
#include "../scheduler/counters.cuh"

// Queues a claimed instruction's weight range for the loader (lane 0 only).
__device__ __forceinline__ void gvm_push_prefetch(gvm_shared& sh, unsigned& head, const gvm_pf_entry& e) {
    while (head - sh.ring_tail >= GVM_PF_RING) gvm_nanosleep(32);
    gvm_pf_entry& slot = sh.ring[head % GVM_PF_RING];
    slot.idx = e.idx;
    slot.tensor = e.tensor;
    slot.offset = e.offset;
    slot.bytes = e.bytes;
    __threadfence_block();
    sh.ring_head = ++head;
}

// Starts loading the claimed instruction's record (one word per lane).
__device__ __forceinline__ unsigned gvm_load_record(const gvm_params& p, unsigned idx, unsigned lane) {
    return __ldg(reinterpret_cast<const unsigned*>(p.instrs + idx) + lane);
}

// Queues the weight range of a claimed instruction (its record in `word`,
// one 32-bit word per lane) for the loader, or stamps LOAD = CLAIM if none.
__device__ __forceinline__ void gvm_queue_prefetch(const gvm_params& p, gvm_shared& sh, unsigned& ring_head,
                                                   unsigned idx, unsigned word, unsigned lane) {
    // pf_offset: words 16-17, pf_bytes: word 18, pf_slot: low half of word 19, tensor[]: words 12-15
    const unsigned pf_slot = __shfl_sync(0xffffffffu, word, 19) & 0xffffu;
    const unsigned pf_bytes = __shfl_sync(0xffffffffu, word, 18);
    const unsigned lo = __shfl_sync(0xffffffffu, word, 16), hi = __shfl_sync(0xffffffffu, word, 17);
    const unsigned tword = __shfl_sync(0xffffffffu, word, 12 + ((pf_slot >> 1) & 3u));
    const unsigned tensor = pf_slot & 1u ? tword >> 16 : tword & 0xffffu;
    if (lane != 0) return;
    if (pf_slot < GVM_MAX_TENSORS && pf_bytes != 0 && tensor != GVM_NONE) {
        gvm_pf_entry e{idx, tensor, (unsigned long long)hi << 32 | lo, pf_bytes, 0u};
        gvm_push_prefetch(sh, ring_head, e);
    } else {
        GVM_STAMP_COPY(p.trace, idx, GVM_STAMP_LOAD, GVM_STAMP_CLAIM);
    }
}

// The claim of the next instruction normally starts once the current one
// has a group (claim ahead while groups work). When a group is already free
// as the current record arrives, it starts at once instead, so that the
// claim's latency overlaps the record load; the current instruction is then
// handed out within that load, so a block never sits on two claims.
__device__ __forceinline__ void gvm_controller(const gvm_params& p, gvm_shared& sh) {
    const unsigned lane = threadIdx.x & 31u;
    const unsigned n = p.n_instrs;
    unsigned* abort_flag = p.state + GVM_STATE_ABORT;
    gvm_groups_view view{0u, 0u, 0u};
    if (p.n_warm != 0) gvm_mark_busy(view, 0);  // the warmer handed group 0 its warm instruction
    gvm_claimer claimer = gvm_claimer_init(p);
    unsigned ring_head = 0;
    unsigned aborted = lane == 0 ? gvm_ld_relaxed(abort_flag) : 0u;  // overlaps the claim
    unsigned idx = gvm_claim_finish(claimer, gvm_claim_issue(claimer), n);
    if (__shfl_sync(0xffffffffu, aborted, 0) != 0u) idx = n;
    unsigned word = 0;
    if (idx < n) {
        if (lane == 0) GVM_STAMP(p.trace, idx, GVM_STAMP_CLAIM);
        word = gvm_load_record(p, idx, lane);
    }
    while (idx < n) {
        const bool early = gvm_any_group_free(view, sh.empty, p.groups);
        unsigned raw = 0;
        if (early) {
            aborted = lane == 0 ? gvm_ld_relaxed(abort_flag) : 0u;
            raw = gvm_claim_issue(claimer);
        }
        gvm_queue_prefetch(p, sh, ring_head, idx, word, lane);
        const unsigned g = gvm_acquire_group(view, sh.empty, p.groups);
        if (!early) {
            aborted = lane == 0 ? gvm_ld_relaxed(abort_flag) : 0u;
            raw = gvm_claim_issue(claimer);
        }
        reinterpret_cast<unsigned*>(&sh.slot[g].ins)[lane] = word;
        if (lane == 0) sh.slot[g].idx = idx;
        __syncwarp();
        if (lane == 0) gvm_mbar_arrive(&sh.full[g]);
        gvm_mark_busy(view, g);
        idx = gvm_claim_finish(claimer, raw, n);
        if (__shfl_sync(0xffffffffu, aborted, 0) != 0u) idx = n;
        if (idx < n) {
            if (lane == 0) GVM_STAMP(p.trace, idx, GVM_STAMP_CLAIM);
            word = gvm_load_record(p, idx, lane);
        }
    }
    for (unsigned g = 0; g < p.groups; ++g) {
        gvm_drain_group(view, sh.empty, g);
        if (lane == 0) {
            sh.slot[g].idx = GVM_SLOT_EXIT;
            gvm_mbar_arrive(&sh.full[g]);
        }
        gvm_mark_busy(view, g);
    }
    if (lane == 0) {
        __threadfence_block();
        sh.ring_closed = 1u;
    }
    __syncwarp();
}
