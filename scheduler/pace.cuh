// Claim pacing (dynamic mode): when to issue a claim while every group is busy.
//
// A claim held ahead waits for its own block's groups even when another
// block has one free. At an op's tail that leaves groups idle elsewhere while
// a claimed instruction waits a whole run for its block: full-c16-t8's 1,312
// attention chunks of ~44 us ended 28 us later than on the host's lists, 45
// groups running six chunks and 53 four (H200 traces, session 39). So while
// no group is free the controller issues its next claim only once the group
// due first is near its end: GVM_PACE_LEAD cycles before 3/4 of the run the
// last instruction of the same op took on this block. An op is known by its
// tensors (one set per op of a program: its signal counter will not do, as
// attention's chunks signal one per conversation and a block's next chunk is
// of another). An op not seen yet, or a parked instruction (its run holds
// its waits), gives no estimate, and the claim goes out at once, as without
// pacing. A late estimate costs a claim's latency; an early one, the old wait.
//
// The state lives in the controller warp: lane g < groups for group g's
// current instruction, lane k for entry k of a 32-entry table of runs
// (direct-mapped by a hash of the key). Cycles of this SM's clock: every
// stamp here is read on the same SM.
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
    unsigned key;  // lane g: that instruction's op (gvm_pace_key), or GVM_PACE_NOKEY (parked)
    unsigned tag;  // lane k: the op whose run entry k holds
    unsigned run;  // lane k: that op's last run on this block, cycles
};

__device__ __forceinline__ unsigned gvm_pace_clock() {
    unsigned c;
    asm volatile("mov.u32 %0, %%clock;" : "=r"(c));
    return c;
}

__device__ __forceinline__ gvm_pace gvm_pace_init() { return gvm_pace{0u, GVM_PACE_NOKEY, GVM_PACE_NOKEY, 0u}; }

__device__ __forceinline__ unsigned gvm_pace_entry(unsigned key) { return (key * 0x9E3779B1u) >> 27; }

// An instruction's op, from this lane's word of its record: the tensor
// indices (words 12-15) folded into one word.
__device__ __forceinline__ unsigned gvm_pace_key(unsigned word) {
    const unsigned lane = threadIdx.x & 31u;
    unsigned v = lane - 12u < 4u ? __funnelshift_l(word, word, 8u * (lane - 12u) + 3u) : 0u;
    v ^= __shfl_xor_sync(0xffffffffu, v, 1);
    v ^= __shfl_xor_sync(0xffffffffu, v, 2);
    return __shfl_sync(0xffffffffu, v, 12);
}

// Group g was handed an instruction of op `key`.
__device__ __forceinline__ void gvm_pace_start(gvm_pace& pc, unsigned g, unsigned key, bool parked) {
    if ((threadIdx.x & 31u) == g) {
        pc.t0 = gvm_pace_clock();
        pc.key = parked ? GVM_PACE_NOKEY : key;
    }
}

// The groups of mask m (the same in every lane) finished: their runs go into the table.
__device__ __forceinline__ void gvm_pace_retire(gvm_pace& pc, unsigned m) {
    if (!GVM_CLAIM_PACE || m == 0u) return;
    const unsigned lane = threadIdx.x & 31u, now = gvm_pace_clock();
    for (; m != 0u; m &= m - 1u) {
        const unsigned g = __ffs(m) - 1u;
        const unsigned key = __shfl_sync(0xffffffffu, pc.key, g), t0 = __shfl_sync(0xffffffffu, pc.t0, g);
        if (key != GVM_PACE_NOKEY && lane == gvm_pace_entry(key)) {
            pc.tag = key;
            pc.run = now - t0;
        }
    }
}

// May the next claim go out now? Yes with a group free, else once some busy
// group is within GVM_PACE_LEAD cycles of 3/4 of its op's last run here.
__device__ __forceinline__ bool gvm_pace_due(const gvm_pace& pc, unsigned busy, unsigned groups) {
    if ((~busy & ((1u << groups) - 1u)) != 0u) return true;
    const unsigned lane = threadIdx.x & 31u, e = gvm_pace_entry(pc.key);
    const unsigned tag = __shfl_sync(0xffffffffu, pc.tag, e), run = __shfl_sync(0xffffffffu, pc.run, e);
    const unsigned at = tag == pc.key ? run - run / 4u : 0u;  // 3/4 of the last run, 0 for none
    return __any_sync(0xffffffffu, lane < groups && (at <= GVM_PACE_LEAD || gvm_pace_clock() - pc.t0 >= at - GVM_PACE_LEAD));
}
