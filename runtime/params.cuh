// Kernel parameters and the launch-time constants of the persistent kernel.
//
// gvm_params travels by value (one struct, __grid_constant__). Python builds
// the same bytes with a numpy dtype (gpuvm/device/layout.py) and checks its
// offsets against gvm_layout below, which the build reads out of the cubin.
#pragma once
#include "../isa/gvm_isa.h"

#ifndef GVM_MAX_GROUPS
#define GVM_MAX_GROUPS 4          // compute warp groups a block may have (launch picks 1..this)
#endif
// Private scratch of each compute group, bytes. 96 KB with up to 2 groups
// (the Muse kernel): the staged GEMM's stages (6 of 16 KB, ops/gemm.cuh),
// attention's and the experts' buffers grow with it (a weight ring for every
// register-path expert, ops/experts.cuh), and what is left of the SM's 256 KB
// still serves as L1. H200, 9b8f102, 72 / 88 / 96 / 104 / 112 KB, two rounds,
// us: full-c16-t8 956, 954 / 925, 930 / 922, 928 / 925, 929 / 925, 929;
// sliding-c32-t8 1026, 1032 / 1013, 1017 / 1005, 1010 / 1004, 1012 / 1007, 1013;
// sliding-c16-t1 374, 375 / 346, 347 / 345, 345 / 358, 357 / 357, 357;
// full-c1-t1 179, 180 / 179, 179 / 180, 180 / 197, 197 / 197, 198; step 1x1
// 8.32, 8.19 / 8.27, 8.27 / 8.28, 8.28 / 9.52, 9.50 / 9.49, 9.47 ms; step
// 32x8 64.0, 63.9 / 62.8, 62.9 / 62.7, 62.5 / 62.5, 62.5 / 62.6, 62.7. From
// 104 KB the one-token layers lose 10-15% (L1 too small). bdf5c57 (session 7)
// had measured step 1x1 13.19 ms at 96 KB against 11.40 at 48.
#ifndef GVM_GROUP_SMEM
#define GVM_GROUP_SMEM (GVM_MAX_GROUPS <= 2 ? 98304 : 49152)
#endif
#define GVM_CONTROL_THREADS 128   // warps 0-3: controller, loader, warmer, spare
#define GVM_GROUP_THREADS 128
#define GVM_BLOCK_THREADS (GVM_CONTROL_THREADS + GVM_MAX_GROUPS * GVM_GROUP_THREADS)
#define GVM_PF_RING 16            // claimed instructions queued for the loader
// Claims a controller can hold (runtime/controller.cuh). Its ring visits
// every slot in turn, so fewer slots hand a claim out in fewer visits, and at
// the default claim depth of 1 the rest only lengthen the way. H200, 4ac2153,
// 6 / 3 slots: empty instructions at depth 1 0.96 / 0.69 us an instruction a
// block (at full depth 0.453 / 0.482 dynamic, 0.467 / 0.443 static); step
// 16 x 1 25.5 / 25.0 ms, 32 x 8 72.3 / 71.5, 1 x 8 15.8 / 15.7, 1 x 1 8.86 / 8.94.
#ifndef GVM_CLAIM_SLOTS
#define GVM_CLAIM_SLOTS 3
#endif

// state[] words (u32), zero before the first launch
#define GVM_STATE_HEAD 0          // dynamic mode: next stream index to claim
#define GVM_STATE_EXITED 1        // blocks that finished this launch; the last resets head
#define GVM_STATE_ABORT 2         // nonzero: a block failed, everyone stops (sticky until the host clears it)
#define GVM_STATE_WORDS 4

#define GVM_MODE_DYNAMIC 0
#define GVM_MODE_STATIC 1

struct gvm_params {
    const gvm_instr* instrs;       // the stream, n_instrs records
    const gvm_tensor* table;       // tensor table
    unsigned* counters;            // monotonic counters
    unsigned* state;               // GVM_STATE_* words
    gvm_error* error;              // first failure of a launch
    gvm_trace* trace;              // one record per instruction, or null
    const int* static_lists;       // offsets[n_blocks + 1] then indices (static mode)
    const gvm_instr* warm_instrs;  // warmer's instructions (no waits, no signal), or null
    const gvm_tensor* warm_table;  // their tensor table
    unsigned long long watchdog_ns;
    unsigned n_instrs;
    unsigned step;
    unsigned mode;                 // GVM_MODE_*
    unsigned groups;               // compute groups per block, 1..GVM_MAX_GROUPS
    unsigned n_warm;               // warm instructions (0: warmer off)
    unsigned claim_depth;          // claims held ahead per block, 1..GVM_CLAIM_SLOTS (0: GVM_CLAIM_SLOTS)
};

// Field offsets of gvm_params, written out because NVRTC 13.0 (the GPU
// machine's) has no __builtin_offsetof; where the compiler has it (NVRTC 13.5
// in CI), static_asserts prove the numbers.
#define GVM_OFF_instrs 0
#define GVM_OFF_table 8
#define GVM_OFF_counters 16
#define GVM_OFF_state 24
#define GVM_OFF_error 32
#define GVM_OFF_trace 40
#define GVM_OFF_static_lists 48
#define GVM_OFF_warm_instrs 56
#define GVM_OFF_warm_table 64
#define GVM_OFF_watchdog_ns 72
#define GVM_OFF_n_instrs 80
#define GVM_OFF_step 84
#define GVM_OFF_mode 88
#define GVM_OFF_groups 92
#define GVM_OFF_n_warm 96
#define GVM_OFF_claim_depth 100
#define GVM_PARAMS_BYTES 104
#define GVM_PARAM_OFFSET(f) ((unsigned)GVM_OFF_##f)
#if defined(__has_builtin)
#if __has_builtin(__builtin_offsetof)
#define GVM_CHECK_OFF(f) static_assert(__builtin_offsetof(gvm_params, f) == GVM_OFF_##f, "gvm_params." #f " offset");
GVM_CHECK_OFF(instrs) GVM_CHECK_OFF(table) GVM_CHECK_OFF(counters) GVM_CHECK_OFF(state) GVM_CHECK_OFF(error)
GVM_CHECK_OFF(trace) GVM_CHECK_OFF(static_lists) GVM_CHECK_OFF(warm_instrs) GVM_CHECK_OFF(warm_table)
GVM_CHECK_OFF(watchdog_ns) GVM_CHECK_OFF(n_instrs) GVM_CHECK_OFF(step) GVM_CHECK_OFF(mode) GVM_CHECK_OFF(groups)
GVM_CHECK_OFF(n_warm) GVM_CHECK_OFF(claim_depth)
#undef GVM_CHECK_OFF
#endif
#endif
static_assert(sizeof(gvm_params) == GVM_PARAMS_BYTES, "gvm_params size");

extern "C" __device__ const unsigned gvm_layout[] = {
    (unsigned)sizeof(gvm_params),
    GVM_PARAM_OFFSET(instrs), GVM_PARAM_OFFSET(table), GVM_PARAM_OFFSET(counters),
    GVM_PARAM_OFFSET(state), GVM_PARAM_OFFSET(error), GVM_PARAM_OFFSET(trace),
    GVM_PARAM_OFFSET(static_lists), GVM_PARAM_OFFSET(warm_instrs), GVM_PARAM_OFFSET(warm_table),
    GVM_PARAM_OFFSET(watchdog_ns), GVM_PARAM_OFFSET(n_instrs), GVM_PARAM_OFFSET(step),
    GVM_PARAM_OFFSET(mode), GVM_PARAM_OFFSET(groups), GVM_PARAM_OFFSET(n_warm), GVM_PARAM_OFFSET(claim_depth),
    GVM_MAX_GROUPS, GVM_GROUP_SMEM, GVM_CONTROL_THREADS, GVM_GROUP_THREADS, GVM_STATE_WORDS,
    (unsigned)sizeof(gvm_instr), (unsigned)sizeof(gvm_tensor), (unsigned)sizeof(gvm_trace),
    (unsigned)sizeof(gvm_error), GVM_CLAIM_SLOTS,
};
