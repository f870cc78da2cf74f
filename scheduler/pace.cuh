// Claim pacing (dynamic mode): when to issue a claim while every group is busy.
//
// A claim held ahead waits for its own block's groups even when another
// block has one free. At an op's tail that leaves groups idle elsewhere while
// a claimed instruction waits a whole run for its block: full-c16-t8's 1,312
// attention chunks of ~44 us ended 28 us later than on the host's lists, 45
// groups running six chunks and 53 four (H200 traces, session 39). So while
// no group is free the controller issues its next claim only once the group
// due first is near its end: GVM_PACE_LEAD cycles before 3/4 of the run the
// last instruction with the same signal counter took on this block. A key
// not seen yet, or a parked instruction (its run holds its waits), gives no
// estimate, and the claim goes out at once, as without pacing. A late
// estimate costs a claim's latency; an early one, the old wait.
//
// The state lives in the controller warp: lane g < groups for group g's
// current instruction, lane k for entry k of a 32-entry table of runs
// (direct-mapped by counter % 32). Cycles of this SM's clock: every stamp
// here is read on the same SM.
#pragma once

#ifndef GVM_CLAIM_PACE
#define GVM_CLAIM_PACE 1
#endif
#ifndef GVM_PACE_LEAD
#define GVM_PACE_LEAD 4000u  // cycles (~2 us at 1.98 GHz): a contended claim and its record's read
#endif
#define GVM_PACE_NOKEY 0xffffffffu  // signal counters are 16-bit

struct gvm_pace {
    unsigned t0;   // lane g: clock when group g got its instruction
    unsigned key;  // lane g: that instruction's signal counter, or GVM_PACE_NOKEY (parked)
    unsigned est;  // lane g: its expected run, cycles (0: none)
    unsigned tag;  // lane k: the counter whose run entry k holds
    unsigned run;  // lane k: that counter's last run on this block, cycles
};

__device__ __forceinline__ unsigned gvm_pace_clock() {
    unsigned c;
    asm volatile("mov.u32 %0, %%clock;" : "=r"(c));
    return __shfl_sync(0xffffffffu, c, 0);  // one clock for the warp
}

__device__ __forceinline__ gvm_pace gvm_pace_init() { return gvm_pace{0u, GVM_PACE_NOKEY, 0u, GVM_PACE_NOKEY, 0u}; }

// Group g was handed an instruction that signals counter `key`.
__device__ __forceinline__ void gvm_pace_start(gvm_pace& pc, unsigned g, unsigned key, bool parked) {
    if (!GVM_CLAIM_PACE) return;
    const unsigned lane = threadIdx.x & 31u;
    const unsigned tag = __shfl_sync(0xffffffffu, pc.tag, key & 31u), run = __shfl_sync(0xffffffffu, pc.run, key & 31u);
    const unsigned now = gvm_pace_clock();
    if (lane == g) {
        pc.t0 = now;
        pc.key = parked ? GVM_PACE_NOKEY : key;
        pc.est = !parked && tag == key ? run : 0u;
    }
}

// The groups of mask m (the same in every lane) finished: their runs go into the table.
__device__ __forceinline__ void gvm_pace_retire(gvm_pace& pc, unsigned m) {
    if (!GVM_CLAIM_PACE || m == 0u) return;
    const unsigned lane = threadIdx.x & 31u, now = gvm_pace_clock();
    for (; m != 0u; m &= m - 1u) {
        const unsigned g = __ffs(m) - 1u;
        const unsigned key = __shfl_sync(0xffffffffu, pc.key, g), t0 = __shfl_sync(0xffffffffu, pc.t0, g);
        if (key != GVM_PACE_NOKEY && lane == (key & 31u)) {
            pc.tag = key;
            pc.run = now - t0;
        }
    }
}

// May the next claim go out now? Yes with a group free, else once some busy
// group is within GVM_PACE_LEAD cycles of 3/4 of its estimate.
__device__ __forceinline__ bool gvm_pace_due(const gvm_pace& pc, unsigned busy, unsigned groups) {
    if (!GVM_CLAIM_PACE || (~busy & ((1u << groups) - 1u)) != 0u) return true;
    const unsigned lane = threadIdx.x & 31u, now = gvm_pace_clock();
    const unsigned at = pc.est - pc.est / 4u;  // 3/4 of the estimate
    return __any_sync(0xffffffffu, lane < groups && (at <= GVM_PACE_LEAD || now - pc.t0 >= at - GVM_PACE_LEAD));
}
