// The contract between the persistent kernel and every op (ops/*.cuh).
//
// An op runs on one warp group (128 threads, 4 consecutive warps). It gets the
// decoded instruction, its operands' descriptors, a private shared-memory scratch area
// and the group's named barrier. It must not touch other groups' scratch,
// must not wait on counters (the runtime did that before calling; the one
// exception, EXPERT_DOWN's bounded wait for an expert's up rows, waits only for
// work that running groups hold, ops/experts.cuh) and must not signal (the
// runtime does that after it returns: one, or the n of a GVM_SIGNAL_N(n) the op
// returned). It reports unusable input by returning a gvm_error_code
// (GVM_ERR_BAD_ARGS; GVM_ERR_WATCHDOG for that wait past its bound), never by trapping.
//
// An op may do its work over several calls by returning GVM_AGAIN: the
// runtime calls it again at once, on the same group, with c.again one higher
// (0 on the first call) and its scratch as the last call left it. The loop
// over calls is then the runtime's own instruction loop, not a loop of the op
// around its body: that nesting cost the expert tiles registers (spills).
#pragma once
#include "../isa/gvm_isa.h"

#define GVM_AGAIN (-1)
// Done, and the runtime adds n >= 0 to the signal counter instead of one: the
// workers of an expert work list (ops/experts.cuh) signal for the whole list
// when one of them completes it, and nothing otherwise.
#define GVM_SIGNAL_N(n) (-2 - (int)(n))

struct gvm_ctx {
    const gvm_instr* ins;      // the instruction (in shared memory)
    const gvm_tensor* desc;    // the instruction's operands' descriptors by slot (shared memory)
    unsigned tid;              // 0..127 inside the group
    unsigned bar_id;           // named barrier of this group (1..15)
    unsigned step;             // step index of this launch
    unsigned char* smem;       // this group's scratch
    unsigned smem_bytes;
    unsigned again;            // calls of this instruction before this one (see GVM_AGAIN)
};

// Synchronise the 128 threads of the group (not the block).
__device__ __forceinline__ void gvm_group_sync(const gvm_ctx& c) {
    asm volatile("bar.sync %0, 128;" :: "r"(c.bar_id) : "memory");
}

__device__ __forceinline__ const gvm_tensor& gvm_t(const gvm_ctx& c, int slot) {
    return c.desc[slot];
}

// The runtime's copy of an instruction's operand descriptors into shared
// memory, one 16-byte quarter a lane of one warp (8 x 64 bytes), before the op
// (zeros for an absent slot): the ops' argument checks then read shared memory.
// From the table their ~50 reads went out together but came back at L2's
// latency whenever the lines had left L1 (an expert item's check took 0.8 us at
// one token: session 73's timeline, H100).
// The copy's type is 16-byte aligned, as its stores are: tools/ops_check.py's kernel
// kept a plain gvm_tensor array (8-byte aligned) and faulted with a misaligned
// address on the GPU (session 77), which the host emulator cannot see.
static_assert(sizeof(gvm_tensor) == 64 && GVM_MAX_TENSORS == 8, "a descriptor quarter per lane of a warp (and the runtime reads the slots as one 16-byte word)");
struct __align__(16) gvm_descs {
    gvm_tensor t[GVM_MAX_TENSORS];
};
__device__ __forceinline__ void gvm_copy_desc(const gvm_instr& ins, const gvm_tensor* tab, gvm_descs& desc, unsigned lane) {
    const unsigned slot = lane >> 2, t = ins.tensor[slot];
    const uint4 v = t != GVM_NONE ? __ldg(reinterpret_cast<const uint4*>(tab + t) + (lane & 3)) : make_uint4(0u, 0u, 0u, 0u);
    reinterpret_cast<uint4*>(desc.t + slot)[lane & 3] = v;
}

__device__ __forceinline__ float gvm_argf(const gvm_ctx& c, int i) {
    return __int_as_float(c.ins->arg[i]);
}
