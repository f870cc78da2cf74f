// Entry point of the emulator library: run a list of instructions of the Muse
// ops, one warp group (128 fibers) per instruction, in order. Built by
// tools/ops_check.py (build_emulator) with the op headers staged next to the
// host op_ctx.cuh / ptx.cuh of this folder.
#include "ops/norm.cuh"
#include "ops/attention.cuh"
#include "ops/route.cuh"
#include "ops/experts.cuh"
#include "ops/gemm.cuh"

#if defined(__x86_64__)
// gvm_emu_switch(save_sp, load_sp): the System V callee-saved registers onto this
// stack, its pointer to *save_sp, then the same in reverse from load_sp's stack,
// returning into the other fiber (see simt.h).
asm(R"(
    .text
    .globl gvm_emu_switch
    .hidden gvm_emu_switch
    .type gvm_emu_switch, @function
gvm_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size gvm_emu_switch, .-gvm_emu_switch
)");
#endif

namespace {

using OpFn = int (*)(const gvm_ctx&);

OpFn op_of(int opcode) {
    switch (opcode) {
        case GVM_OP_RMSNORM: return gvm_op_rmsnorm;
        case GVM_OP_RESIDUAL: return gvm_op_residual;
        case GVM_OP_QK_ROPE_KV: return gvm_op_qk_rope_kv;
        case GVM_OP_ATTN_CHUNK: return gvm_op_attn_chunk;
        case GVM_OP_ATTN_MERGE: return gvm_op_attn_merge;
        case GVM_OP_TOPK: return gvm_op_topk;
        case GVM_OP_EXPERT_UP: return gvm_op_expert_up;
        case GVM_OP_EXPERT_DOWN: return gvm_op_expert_down;
        case GVM_OP_EXPERT_COMBINE: return gvm_op_expert_combine;
        case GVM_OP_GEMM: return gvm_op_gemm;
        default: return nullptr;
    }
}

struct Job {
    OpFn fn;
    const gvm_instr* ins;
    const gvm_tensor* desc;  // the operands' descriptors by slot, as the VM's slot holds them
    int rc[emu::kThreads];
};
Job* job = nullptr;

void fiber_main() {
    emu::Machine* m = emu::machine();
    const int t = m->cur;
    gvm_ctx c{job->ins, job->desc, (unsigned)t, 1u, 0u, m->smem, m->smem_bytes, 0u};
    int rc;
    for (;; ++c.again) {  // an op that returns GVM_AGAIN is called again, scratch kept
        rc = job->fn(c);
        if (!m->wgmma[t].empty()) emu::fail("the op returned with a wgmma not retired by a wait");
        // copies still in flight would land in the scratch after the op (empty groups are harmless)
        bool in_flight = !m->cp_open[t].empty();
        for (const auto& g : m->cp_groups[t]) in_flight |= !g.empty();
        if (in_flight) emu::fail("the op returned with cp.async copies that no cp.async.wait_group landed");
        m->cp_groups[t].clear();
        if (rc != GVM_AGAIN) break;
    }
    job->rc[t] = rc;
    m->done[t] = true;
    ++m->progress;
}  // ucontext: returns to m->main through uc_link

#if defined(__x86_64__)
// A fiber's first frame: the op, then back to the scheduler for good (a done
// fiber is never resumed).
void fiber_entry() {
    fiber_main();
    emu::yield();
    __builtin_trap();
}
#endif

// Runs one instruction on a fresh machine; returns "" or what went wrong.
std::string run_one(const gvm_instr* ins, const gvm_tensor* tab, unsigned smem_bytes, int* rc) {
    OpFn fn = op_of(ins->opcode);
    if (!fn) return "opcode " + std::to_string(ins->opcode) + " is not a Muse op";
    emu::Machine m;
    std::vector<unsigned char> smem(smem_bytes, 0xff);  // NaN everywhere: reading unwritten scratch shows
    m.smem = smem.data();
    m.smem_bytes = smem_bytes;
    m.w_epoch.assign(smem_bytes, 0);
    m.r_epoch.assign(smem_bytes, 0);
    m.writer.assign(smem_bytes, -1);
    m.reader.assign(smem_bytes, -1);
    m.w_wep.assign(smem_bytes, 0);
    m.r_wep.assign(smem_bytes, 0);
    m.r_warp.assign(smem_bytes, -1);
    m.cp_pending.assign(smem_bytes, 0);
    m.bulk_bar.assign(smem_bytes, 0);
    m.bulk_phase.assign(smem_bytes, 0);
    m.group.expected = emu::kThreads;
    for (auto& w : m.warp) w.expected = 32;
    // the fibers' stacks, allocated once and not cleared: a fresh zeroed 32 MB an
    // instruction was most of the emulator's system time
    static char* stacks = new char[(size_t)emu::kThreads * emu::kStack];
    m.stacks = stacks;
    for (int i = 0; i < GVM_MAX_TENSORS; ++i) {  // each tensor's bytes, from its last element's offset
        if (ins->tensor[i] == GVM_NONE) continue;
        const gvm_tensor& t = tab[ins->tensor[i]];
        const int esize = t.dtype == GVM_DT_F32 || t.dtype == GVM_DT_I32 ? 4 : t.dtype == GVM_DT_BF16 ? 2 : 1;
        long long last = 0;
        for (int d = 0; d < t.ndim; ++d) last += (long long)(t.shape[d] - 1) * t.stride[d];
        m.tensors.emplace_back(reinterpret_cast<const unsigned char*>(t.ptr), (size_t)(last + 1) * esize);
    }
    gvm_tensor desc[GVM_MAX_TENSORS] = {};  // zeros for an absent slot (runtime/group.cuh's copy)
    for (int i = 0; i < GVM_MAX_TENSORS; ++i)
        if (ins->tensor[i] != GVM_NONE) desc[i] = tab[ins->tensor[i]];
    Job j{fn, ins, desc, {}};
    job = &j;
    emu::machine() = &m;
    for (int t = 0; t < emu::kThreads; ++t) {
#if defined(__x86_64__)
        // as if gvm_emu_switch had saved it: 6 registers, then the return into
        // fiber_entry, whose own return address slot leaves rsp = 8 mod 16 at its entry
        void** sp = reinterpret_cast<void**>(m.stacks + (size_t)(t + 1) * emu::kStack);
        *--sp = nullptr;
        *--sp = reinterpret_cast<void*>(&fiber_entry);
        for (int i = 0; i < 6; ++i) *--sp = nullptr;
        m.sp[t] = sp;
#else
        getcontext(&m.ctx[t]);
        m.ctx[t].uc_stack.ss_sp = m.stacks + (size_t)t * emu::kStack;
        m.ctx[t].uc_stack.ss_size = emu::kStack;
        m.ctx[t].uc_link = &m.main;
        makecontext(&m.ctx[t], fiber_main, 0);
#endif
    }
    std::string err;
    for (int live = emu::kThreads; live > 0 && err.empty();) {
        const unsigned long long before = m.progress;
        for (int t = 0; t < emu::kThreads && err.empty(); ++t) {
            if (m.done[t]) continue;
            m.cur = t;
#if defined(__x86_64__)
            emu::gvm_emu_switch(&m.main_sp, m.sp[t]);
#else
            swapcontext(&m.main, &m.ctx[t]);
#endif
            if (!m.error.empty()) err = "thread " + std::to_string(t) + ": " + m.error;
        }
        live = 0;
        for (bool d : m.done) live += !d;
        if (err.empty() && live > 0 && m.progress == before)
            err = "deadlock: " + std::to_string(live) + " threads wait at a barrier or collective the others never reach";
    }
    emu::machine() = nullptr;
    if (!err.empty()) return err;
    for (int t = 1; t < emu::kThreads; ++t)
        if (j.rc[t] != j.rc[0]) return "threads returned different codes (" + std::to_string(j.rc[0]) + ", " + std::to_string(j.rc[t]) + ")";
    *rc = j.rc[0];
    return "";
}

}  // namespace

// err[i]: the op's return code for instruction i. Returns 0, or -1 with a
// message (deadlock, divergence, shared memory misuse) in msg.
extern "C" int gvm_emu_run(const void* instrs, int n, const void* table, unsigned smem_bytes, int* err, char* msg,
                           int msg_len) {
    const gvm_instr* ins = static_cast<const gvm_instr*>(instrs);
    for (int i = 0; i < n; ++i) {
        const std::string e = run_one(ins + i, static_cast<const gvm_tensor*>(table), smem_bytes, err + i);
        if (!e.empty()) {
            std::snprintf(msg, (size_t)msg_len, "instruction %d: %s", i, e.c_str());
            return -1;
        }
    }
    return 0;
}
