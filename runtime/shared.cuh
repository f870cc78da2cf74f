// The block's shared control state (static shared memory). The compute
// groups' scratch is separate: dynamic shared memory, GVM_GROUP_SMEM each.
#pragma once
#include "params.cuh"
#include "../scheduler/handoff.cuh"

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
    unsigned since[GVM_CLAIM_SLOTS];  // a waiting slot's first probe, %globaltimer's low word (not held in registers)
    unsigned long long full[GVM_MAX_GROUPS];
    unsigned long long empty[GVM_MAX_GROUPS];
    gvm_pf_entry ring[GVM_PF_RING];
    // each compute warp's loop state (runtime/group.cuh): mbarrier parity << 31 | calls of the op so far
    unsigned loop[GVM_MAX_GROUPS][GVM_GROUP_THREADS / 32];
    volatile unsigned ring_head;    // entries pushed (controller)
    volatile unsigned ring_tail;    // entries done (loader)
    volatile unsigned ring_closed;  // the controller claims no more
};
