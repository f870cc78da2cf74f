// Who runs what: the next stream index for this block.
//
// Dynamic mode: one atomicAdd on the global head per claim, so the order in
// which blocks come free decides the placement at run time. Static mode:
// the block's host-made list (gpuvm/static.py: int32 offsets[n_blocks + 1],
// then the indices), read 32 entries at a time into the controller's lanes,
// the next 32 already loading while the current ones are handed out.
// Both hand out indices in increasing stream order per block, which the
// deadlock argument in runtime/controller.cuh relies on.
//
// Called by all 32 lanes of the controller warp; every lane gets the index.
#pragma once
#include "../runtime/params.cuh"

// v, kept in a register by the controller warp (all 32 lanes): left alone,
// the compiler reloads a launch constant from the constant bank at every use,
// each reload a dependent step on the per-instruction path. An identity
// shuffle is opaque to ptxas (a plain register move is not).
__device__ __forceinline__ unsigned gvm_reg(unsigned v) {
    return __shfl_sync(0xffffffffu, v, threadIdx.x & 31u);
}

__device__ __forceinline__ unsigned long long gvm_reg(unsigned long long v) {
    return (unsigned long long)gvm_reg((unsigned)(v >> 32)) << 32 | gvm_reg((unsigned)v);
}

struct gvm_claimer {
    unsigned mode;
    unsigned* head;        // dynamic: global head
    const int* indices;    // static: this launch's index array
    unsigned pos, end;     // static: cursor into indices
    unsigned window;       // static: first position held in the lanes
    unsigned cached;       // static: this lane's entry of the window
    unsigned ahead;        // static: this lane's entry of the window after it (loading)
};

// Static: this lane's entry of the window starting at `first` (past the end: none).
__device__ __forceinline__ unsigned gvm_claim_window(const gvm_claimer& c, unsigned first) {
    const unsigned i = first + (threadIdx.x & 31u);
    return i < c.end ? (unsigned)c.indices[i] : 0xffffffffu;
}

__device__ __forceinline__ gvm_claimer gvm_claimer_init(const gvm_params& p) {
    gvm_claimer c;
    c.mode = gvm_reg(p.mode);
    // the same address in every lane, through an identity shuffle: to the
    // compiler a per-lane value (see gvm_claim_issue)
    c.head = reinterpret_cast<unsigned*>(gvm_reg(reinterpret_cast<unsigned long long>(p.state + GVM_STATE_HEAD)));
    c.indices = nullptr;
    c.pos = c.end = c.window = 0;
    c.cached = c.ahead = 0;
    if (p.mode == GVM_MODE_STATIC) {
        c.indices = p.static_lists + gridDim.x + 1;
        c.pos = (unsigned)p.static_lists[blockIdx.x];
        c.end = (unsigned)p.static_lists[blockIdx.x + 1];
        c.window = c.pos;
        c.cached = gvm_claim_window(c, c.pos);
        c.ahead = gvm_claim_window(c, c.pos + 32);
    }
    return c;
}

// A claim in two halves, so that its latency can overlap other work:
// issue() starts it (dynamic: lane 0's atomic, whose result is only waited
// for in finish()); finish() gives every lane the index, or n when none is left.
__device__ __forceinline__ unsigned gvm_claim_issue(gvm_claimer& c) {
    const unsigned lane = threadIdx.x & 31u;
    if (c.mode != GVM_MODE_STATIC) {
        // ptxas makes an atomic on a warp-uniform address warp-aggregated,
        // shuffling (and so waiting for) its result at once (SASS at
        // 3e6785a); c.head is not provably uniform (see gvm_claimer_init),
        // so this one's result is waited for only in finish().
        unsigned v = 0;
        if (lane == 0) asm volatile("atom.relaxed.gpu.global.add.u32 %0, [%1], 1;" : "=r"(v) : "l"(c.head) : "memory");
        return v;
    }
    if (c.pos >= c.end) return 0xffffffffu;
    if (c.pos - c.window >= 32u) {
        c.window += 32u;
        c.cached = c.ahead;  // loaded 32 claims ago
        c.ahead = gvm_claim_window(c, c.window + 32u);
    }
    const unsigned idx = __shfl_sync(0xffffffffu, c.cached, c.pos - c.window);
    ++c.pos;
    return idx;
}

__device__ __forceinline__ unsigned gvm_claim_finish(const gvm_claimer& c, unsigned raw, unsigned n) {
    const unsigned idx = c.mode != GVM_MODE_STATIC ? __shfl_sync(0xffffffffu, raw, 0) : raw;
    return idx < n ? idx : n;
}
