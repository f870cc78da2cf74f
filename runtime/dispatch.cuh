// The switch from opcode to op function, and the list of ops compiled in.
//
// The Muse op headers are written alongside this runtime; each is included
// when present (and GVM_NO_MUSE_OPS is not defined: a kernel of the synthetic
// ops and GEMM alone, to measure the runtime without the big ops' code). An op whose header is missing resolves to a fallback that
// reports GVM_ERR_BAD_OPCODE: a template loses overload resolution to the real
// `int gvm_op_x(const gvm_ctx&)` whenever a header declares one, whichever
// header that is.
#pragma once
#include "../ops/op_ctx.cuh"
#include "../ops/synthetic.cuh"
#include "../ops/gemm.cuh"
#if !defined(GVM_NO_MUSE_OPS) && __has_include("../ops/norm.cuh")
#include "../ops/norm.cuh"
#endif
#if !defined(GVM_NO_MUSE_OPS) && __has_include("../ops/attention.cuh")
#include "../ops/attention.cuh"
#endif
#if !defined(GVM_NO_MUSE_OPS) && __has_include("../ops/route.cuh")
#include "../ops/route.cuh"
#endif
#if !defined(GVM_NO_MUSE_OPS) && __has_include("../ops/experts.cuh")
#include "../ops/experts.cuh"
#endif
#if !defined(GVM_NO_MUSE_OPS) && __has_include("../ops/step.cuh")
#include "../ops/step.cuh"
#endif

struct gvm_missing_op {
    __device__ operator int() const { return GVM_ERR_BAD_OPCODE; }
};
template <class R> struct gvm_is_missing { static constexpr bool value = false; };
template <> struct gvm_is_missing<gvm_missing_op> { static constexpr bool value = true; };

#define GVM_FALLBACK(name) \
    template <class C>     \
    __device__ __forceinline__ gvm_missing_op name(const C&) { return {}; }
GVM_FALLBACK(gvm_op_rmsnorm)
GVM_FALLBACK(gvm_op_qk_rope_kv)
GVM_FALLBACK(gvm_op_attn_chunk)
GVM_FALLBACK(gvm_op_attn_merge)
GVM_FALLBACK(gvm_op_residual)
GVM_FALLBACK(gvm_op_topk)
GVM_FALLBACK(gvm_op_expert_up)
GVM_FALLBACK(gvm_op_expert_down)
GVM_FALLBACK(gvm_op_expert_combine)
GVM_FALLBACK(gvm_op_embed)
GVM_FALLBACK(gvm_op_argmax)
#undef GVM_FALLBACK

#define GVM_HAS(op, name) \
    (gvm_is_missing<decltype(name(*static_cast<const gvm_ctx*>(nullptr)))>::value ? 0ull : 1ull << (op))

// Read by gpuvm/device/build.py from the cubin: bit k set when opcode k runs.
extern "C" __device__ const unsigned long long gvm_compiled_ops =
    GVM_HAS(GVM_OP_NOP, gvm_op_nop) | GVM_HAS(GVM_OP_SLEEP, gvm_op_sleep) | GVM_HAS(GVM_OP_COPY, gvm_op_copy) |
    GVM_HAS(GVM_OP_SCALE_ADD, gvm_op_scale_add) | GVM_HAS(GVM_OP_GEMM, gvm_op_gemm) |
    GVM_HAS(GVM_OP_RMSNORM, gvm_op_rmsnorm) | GVM_HAS(GVM_OP_QK_ROPE_KV, gvm_op_qk_rope_kv) |
    GVM_HAS(GVM_OP_ATTN_CHUNK, gvm_op_attn_chunk) | GVM_HAS(GVM_OP_ATTN_MERGE, gvm_op_attn_merge) |
    GVM_HAS(GVM_OP_RESIDUAL, gvm_op_residual) | GVM_HAS(GVM_OP_TOPK, gvm_op_topk) |
    GVM_HAS(GVM_OP_EXPERT_UP, gvm_op_expert_up) | GVM_HAS(GVM_OP_EXPERT_DOWN, gvm_op_expert_down) |
    GVM_HAS(GVM_OP_EXPERT_COMBINE, gvm_op_expert_combine) | GVM_HAS(GVM_OP_EMBED, gvm_op_embed) |
    GVM_HAS(GVM_OP_ARGMAX, gvm_op_argmax);

__device__ __forceinline__ int gvm_dispatch(const gvm_ctx& c) {
    switch (c.ins->opcode) {
        case GVM_OP_NOP: return gvm_op_nop(c);
        case GVM_OP_SLEEP: return gvm_op_sleep(c);
        case GVM_OP_COPY: return gvm_op_copy(c);
        case GVM_OP_SCALE_ADD: return gvm_op_scale_add(c);
        case GVM_OP_GEMM: return gvm_op_gemm(c);
        case GVM_OP_RMSNORM: return gvm_op_rmsnorm(c);
        case GVM_OP_QK_ROPE_KV: return gvm_op_qk_rope_kv(c);
        case GVM_OP_ATTN_CHUNK: return gvm_op_attn_chunk(c);
        case GVM_OP_ATTN_MERGE: return gvm_op_attn_merge(c);
        case GVM_OP_RESIDUAL: return gvm_op_residual(c);
        case GVM_OP_TOPK: return gvm_op_topk(c);
        case GVM_OP_EXPERT_UP: return gvm_op_expert_up(c);
        case GVM_OP_EXPERT_DOWN: return gvm_op_expert_down(c);
        case GVM_OP_EXPERT_COMBINE: return gvm_op_expert_combine(c);
        case GVM_OP_EMBED: return gvm_op_embed(c);
        case GVM_OP_ARGMAX: return gvm_op_argmax(c);
        default: return GVM_ERR_BAD_OPCODE;
    }
}
