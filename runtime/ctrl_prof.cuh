// Where the controller's time goes: a probe build (GVM_CTRL_PROF) sums the
// clock64 cycles of each leg of the controller's visits, per block, and the
// controller writes the sums to gvm_ctrl_prof[block][leg] as it exits
// (tools/dispatch_probe.py reads them). Without the switch the struct is
// empty and every call compiles to nothing.
#pragma once
#include "stamps.cuh"

enum gvm_leg {
    GVM_LEG_CLAIM,     // turn start, a claim's index read, its record staged, the commit
    GVM_LEG_RECORD,    // waiting for a staged record and reading it
    GVM_LEG_DECIDE,    // its waits decoded, and probed if it waits
    GVM_LEG_QUEUE,     // its prefetch queued for the loader (or skipped)
    GVM_LEG_ACQUIRE,   // finding a free group (naps included)
    GVM_LEG_SLOT,      // writing the group's slot and arriving
    GVM_LEG_ISSUE,     // the next claim issued, the visit's end
    GVM_LEG_HANDOFFS,  // a count: instructions handed out
    GVM_LEGS
};

#ifdef GVM_CTRL_PROF
#define GVM_PROF_BLOCKS 1024
extern "C" {
__device__ unsigned gvm_ctrl_prof[GVM_PROF_BLOCKS * GVM_LEGS];
}

struct gvm_prof {
    unsigned long long t;
    unsigned acc[GVM_LEGS];
};

__device__ __forceinline__ void gvm_prof_init(gvm_prof& pr) {
#pragma unroll
    for (int k = 0; k < GVM_LEGS; ++k) pr.acc[k] = 0;
    pr.t = gvm_clock64();
}

// The cycles since the last mark go to `leg`.
__device__ __forceinline__ void gvm_prof_mark(gvm_prof& pr, int leg) {
    const unsigned long long now = gvm_clock64();
    pr.acc[leg] += (unsigned)(now - pr.t);
    pr.t = now;
}

__device__ __forceinline__ void gvm_prof_count(gvm_prof& pr) { ++pr.acc[GVM_LEG_HANDOFFS]; }

__device__ __forceinline__ void gvm_prof_flush(const gvm_prof& pr, unsigned lane) {
    if (lane == 0 && blockIdx.x < GVM_PROF_BLOCKS) {
#pragma unroll
        for (int k = 0; k < GVM_LEGS; ++k) gvm_ctrl_prof[blockIdx.x * GVM_LEGS + k] = pr.acc[k];
    }
}
#else
struct gvm_prof {};
__device__ __forceinline__ void gvm_prof_init(gvm_prof&) {}
__device__ __forceinline__ void gvm_prof_mark(gvm_prof&, int) {}
__device__ __forceinline__ void gvm_prof_count(gvm_prof&) {}
__device__ __forceinline__ void gvm_prof_flush(const gvm_prof&, unsigned) {}
#endif
