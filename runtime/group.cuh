// Warps 4+: compute groups of 4 warps. Each waits for its slot, runs the
// instruction's dependency waits (threads 0..n_waits-1, one counter each),
// runs the op, then signals its counter (one thread, release, after a group
// barrier so every thread's stores are ordered before it; by one, or by what
// the op asked for with GVM_SIGNAL_N) and frees the slot.
#pragma once
#include "shared.cuh"
#include "stamps.cuh"
#include "dispatch.cuh"
#include "../scheduler/counters.cuh"

// True in every thread of the group if pred holds in any (a group barrier).
__device__ __forceinline__ bool gvm_group_any(unsigned bar_id, bool pred) {
    unsigned r;
    asm volatile("{ .reg .pred p, q; setp.ne.u32 p, %1, 0; bar.red.or.pred q, %2, 128, p; selp.u32 %0, 1, 0, q; }"
                 : "=r"(r)
                 : "r"((unsigned)pred), "r"(bar_id)
                 : "memory");
    return r != 0;
}

// The tensor slots are read as one 16-byte word (8 of them: ops/op_ctx.cuh asserts it);
// NVRTC 13.0 (the GPU machine's) has no __builtin_offsetof, so their offset is proven
// where the compiler has it (CI).
#if defined(__has_builtin)
#if __has_builtin(__builtin_offsetof)
static_assert(__builtin_offsetof(gvm_instr, tensor) % 16 == 0, "an instruction's tensor slots: 16-byte aligned");
#endif
#endif

// Lane 0 writes the warp's loop word once every lane has read it; the other
// lanes see the new value after the second __syncwarp().
__device__ __forceinline__ void gvm_loop_set(unsigned loop, unsigned v, unsigned tid) {
    __syncwarp();
    if ((tid & 31u) == 0) gvm_sts(loop, v);
    __syncwarp();
}

__device__ __forceinline__ void gvm_group(const gvm_params& p, gvm_shared& sh, unsigned g, unsigned char* scratch) {
    gvm_ctx c;
    c.ins = &sh.slot[g].ins;
    c.desc = sh.slot[g].desc.t;
    c.tid = threadIdx.x - GVM_CONTROL_THREADS - g * GVM_GROUP_THREADS;
    c.bar_id = 1 + g;
    c.step = p.step;
    c.smem = scratch;
    c.smem_bytes = GVM_GROUP_SMEM;
    // The loop's state (parity, calls) lives in shared memory, one word per
    // warp, not in registers across the op: the ops' peak register use is the
    // kernel's, and state held through it spilled to local memory. Its address
    // too is derived again after the op from c.tid (live anyway), not held.
    // Every lane reads the word and lane 0 writes it between two __syncwarp()s
    // (the state is the same in every thread: so is each op's return code).
    // A word a thread (until session 74) made the block's static shared memory
    // 1 KB larger, which the descriptors' copies (gvm_slot.desc) now take: past
    // 196 KB in all the SM's L1 shrinks from 60 KB to 28 (runtime/params.cuh).
    if ((c.tid & 31u) == 0) gvm_sts(gvm_smem_u32(&sh.loop[g][c.tid >> 5]), 0u);
    __syncwarp();
    for (;;) {  // one pass per call of an op: a GVM_AGAIN comes straight back here
        // Opaque each pass: what the ops derive from the thread index is then
        // computed in the op, not hoisted out of this loop into registers held
        // through every op (the Muse kernel held ~20 such; the 4-group kernel,
        // at 96 registers, spills with it).
        if (GVM_MAX_GROUPS <= 2) c.tid = gvm_opaque(c.tid);
        const gvm_instr& ins = sh.slot[g].ins;
        unsigned loop = gvm_smem_u32(&sh.loop[g][c.tid >> 5]);
        const unsigned state = gvm_lds_u(loop);
        c.again = state & 0x7fffffffu;
        if (c.again == 0) {
            if (!gvm_mbar_wait(&sh.full[g], state >> 31, gvm_handoff_bound(p.watchdog_ns))) gvm_handoff_trap();
            gvm_loop_set(loop, state ^ 0x80000000u, c.tid);
            const unsigned idx = sh.slot[g].idx;
            if (idx == GVM_SLOT_EXIT) break;
            const bool warm = (idx & GVM_SLOT_WARM) != 0;
            // warp 1 copies the operands' descriptors while warp 0 runs the waits; an instruction
            // without tensors has none to copy and, without waits, no barrier (only NOP and SLEEP
            // take no tensors: the host's checks require every other op's, gpuvm/opspec.py)
            const uint4 tw = *reinterpret_cast<const uint4*>(ins.tensor);  // 8 x u16, all GVM_NONE: all ones
            const bool tensors = (tw.x & tw.y & tw.z & tw.w) != 0xffffffffu;
            if (tensors && c.tid >= 32 && c.tid < 64) gvm_copy_desc(ins, warm ? p.warm_table : p.table, sh.slot[g].desc, c.tid - 32);
            unsigned failed = 0;
            if (!warm && c.tid < ins.n_waits && c.tid < GVM_MAX_WAITS) {
                const unsigned ctr = ins.wait_counter[c.tid];
                const unsigned target = ins.wait_base[c.tid] + p.step * ins.wait_step[c.tid];
                failed = gvm_wait_counter(p.counters + ctr, ctr, target, idx, p.step, p.watchdog_ns, p.error,
                                          p.state + GVM_STATE_ABORT);
            }
            // the barrier also publishes the descriptors (n_waits and the tensors: the same in every thread)
            if ((tensors || (!warm && ins.n_waits != 0)) && gvm_group_any(c.bar_id, failed != 0)) {
                if (c.tid == 0) gvm_mbar_arrive(&sh.empty[g]);
                continue;  // the error is recorded; the controller stops claiming
            }
            if (!warm && c.tid == 0) {
                GVM_STAMP_WHERE(p.trace, idx, g);
                GVM_STAMP(p.trace, idx, GVM_STAMP_READY);
            }
        }
        const int rc = gvm_dispatch(c);
        loop = gvm_smem_u32(&sh.loop[g][gvm_opaque(c.tid) >> 5]);  // opaque: not the address above, held
        const unsigned after = gvm_lds_u(loop);
        if (rc == GVM_AGAIN) {  // the same in every thread
            gvm_loop_set(loop, after + 1u, c.tid);
            continue;
        }
        gvm_loop_set(loop, after & 0x80000000u, c.tid);  // ends with a __syncwarp(), before the barrier
        gvm_group_sync(c);
        if (c.tid == 0) {
            // read again, not held in registers across the op: the slot is
            // unchanged until this group frees it (the ops' peak is the kernel's)
            const unsigned idx = *reinterpret_cast<volatile const unsigned*>(&sh.slot[g].idx);
            const bool warm = (idx & GVM_SLOT_WARM) != 0;
            if (warm) {
            } else if (rc > GVM_ERR_NONE) {
                gvm_fail(p.error, p.state + GVM_STATE_ABORT, (unsigned)rc, idx, GVM_NONE, 0u, 0u, p.step, 0ull,
                         (unsigned long long)ins.opcode);
            } else {
                GVM_STAMP(p.trace, idx, GVM_STAMP_DONE);
                const unsigned n = rc == GVM_ERR_NONE ? 1u : (unsigned)(GVM_SIGNAL_N(0) - rc);  // see GVM_SIGNAL_N
                if (ins.signal != GVM_NONE && n != 0u) gvm_red_release_add(p.counters + ins.signal, n);
                GVM_STAMP(p.trace, idx, GVM_STAMP_SIGNAL);
            }
            gvm_mbar_arrive(&sh.empty[g]);
        }
    }
}
