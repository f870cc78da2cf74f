// The block's shared control state (static shared memory). The compute
// groups' scratch is separate: dynamic shared memory, GVM_GROUP_SMEM each.
#pragma once
#include "params.cuh"
#include "../scheduler/handoff.cuh"

#ifndef GVM_MET_BOARD
#define GVM_MET_BOARD 1  // groups post the counter waits they saw met for the controller (0: off, for A/B runs)
#endif
#define GVM_MET_SLOTS 8
#define GVM_NONE_U32 0xffffffffu

// A claimed instruction's weight range, queued from the controller to the
// loader, with its dependency waits (the loader prefetches only for an
// instruction that will wait: see runtime/loader.cuh).
struct __align__(16) gvm_pf_entry {
    unsigned idx;                    // stream index (for the LOAD stamp)
    unsigned tensor;                 // tensor-table index of the weights
    unsigned long long offset;       // byte range [offset, offset + bytes) of that tensor
    unsigned bytes;
    unsigned n_waits;
    unsigned counter[GVM_MAX_WAITS]; // wait w: counter[w] must reach target[w] (this step's)
    unsigned target[GVM_MAX_WAITS];
    unsigned pad[2];
};

struct gvm_shared {
    gvm_slot slot[GVM_MAX_GROUPS];
    __align__(16) unsigned stage[GVM_CLAIM_SLOTS][32];  // claimed records on their way in (controller)
    __align__(16) unsigned probe[GVM_CLAIM_SLOTS][16];  // counter lines of a waiting slot's waits, 4 per wait
    unsigned long long full[GVM_MAX_GROUPS];
    unsigned long long empty[GVM_MAX_GROUPS];
    gvm_pf_entry ring[GVM_PF_RING];
    // each compute thread's loop state (runtime/group.cuh): mbarrier parity << 31 | calls of the op so far
    unsigned loop[GVM_MAX_GROUPS][GVM_GROUP_THREADS];
    volatile unsigned ring_head;    // entries pushed (controller)
    volatile unsigned ring_tail;    // entries done (loader)
    volatile unsigned ring_closed;  // the controller claims no more
    __align__(8) unsigned met[GVM_MET_SLOTS][2];  // the met board: (counter, target) by counter % GVM_MET_SLOTS
};

// The met board (GVM_MET_BOARD): a group whose counter wait was met posts
// (counter, target), so that the controller can hand out a held instruction
// that waits on the same counter at its next visit, instead of when its own
// probe comes back a ring turn later (the hop into each GEMM phase: ~2.7 us on
// the H200 step, session 10). fence + store / load + fence at CTA scope carry
// the group's acquire of the counter to the controller, whose hand-off
// (mbarrier arrive, release) carries it on to the group that runs the op.
__device__ __forceinline__ void gvm_met_init(gvm_shared& sh, unsigned tid) {
    if (tid < 2 * GVM_MET_SLOTS) (&sh.met[0][0])[tid] = GVM_NONE_U32;
}

__device__ __forceinline__ void gvm_met_post(gvm_shared& sh, unsigned ctr, unsigned target) {
    asm volatile("fence.acq_rel.cta;" ::: "memory");
    asm volatile("st.volatile.shared.v2.u32 [%0], {%1, %2};" ::"r"(gvm_smem_u32(&sh.met[ctr % GVM_MET_SLOTS][0])), "r"(ctr),
                 "r"(target)
                 : "memory");
}

// Whether a group saw counter ctr reach target (the caller fences before using it).
__device__ __forceinline__ bool gvm_met_seen(const gvm_shared& sh, unsigned ctr, unsigned target) {
    unsigned c, t;
    asm volatile("ld.volatile.shared.v2.u32 {%0, %1}, [%2];"
                 : "=r"(c), "=r"(t)
                 : "r"(gvm_smem_u32(&sh.met[ctr % GVM_MET_SLOTS][0]))
                 : "memory");
    return c == ctr && (int)(t - target) >= 0;
}
