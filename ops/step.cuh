// The ops around the layers of a whole step: EMBED (token ids -> residual
// stream) and ARGMAX (logits -> next token ids), isa/gvm_isa.h. Both check
// their whole row range before writing anything, so a refused instruction
// (GVM_ERR_BAD_ARGS) leaves its outputs as they were.
//
// Token ids and logits may have been written earlier in the same launch by
// another SM (ARGMAX reads the LM head's GEMM output), so they are read with
// plain coherent loads.
#pragma once
#include "common.cuh"

// ---- EMBED ----------------------------------------------------------------------
// A group copies one row after another: 128 threads stride over the row, 8 bf16
// (16 bytes) in, two float4s out per step.
__device__ __forceinline__ float4 gvm_bf16x4_to_f32(unsigned lo, unsigned hi) {
    return make_float4(gvm_bf16_lo(lo), gvm_bf16_hi(lo), gvm_bf16_lo(hi), gvm_bf16_hi(hi));
}

__device__ int gvm_op_embed(const gvm_ctx& c) {
    const gvm_tensor& ts = gvm_t(c, 0);
    const gvm_tensor& tt = gvm_t(c, 1);
    const gvm_tensor& tk = gvm_t(c, 2);
    const int row0 = c.ins->arg[0], rows = c.ins->arg[1];
    const int n = ts.shape[0], d = ts.shape[1], vocab = tt.shape[0];
    const bool ok = gvm_is(ts, GVM_DT_F32, 2) & gvm_is(tt, GVM_DT_BF16, 2) & gvm_is(tk, GVM_DT_I32, 1) &
                    tt.shape[1] == d & tk.shape[0] == n & d % 8 == 0 & gvm_aligned(ts, 4, 16) &
                    gvm_aligned(tt, 2, 16) & row0 >= 0 & rows >= 0 & row0 + rows <= n & c.smem_bytes >= 32;
    if (!ok) return GVM_ERR_BAD_ARGS;
    const int* tok = gvm_ptr<const int>(tk, 0, 4);
    float bad = 0.0f;
    for (int r = row0 + (int)c.tid; r < row0 + rows; r += 128) {
        const int id = tok[r];
        if (id < 0 || id >= vocab) bad = 1.0f;
    }
    gvm_group_sum gsum(gvm_smem_addr(c.smem));
    if (gsum(c, bad) != 0.0f) return GVM_ERR_BAD_ARGS;
    const int n8 = d / 8;
#pragma unroll 1
    for (int r = row0; r < row0 + rows; ++r) {
        const uint4* src = gvm_ptr<const uint4>(tt, (long long)tok[r] * tt.stride[0], 2);
        float4* dst = gvm_ptr<float4>(ts, (long long)r * ts.stride[0], 4);
#pragma unroll 1
        for (int i = c.tid; i < n8; i += 128) {
            const uint4 w = src[i];
            dst[2 * i] = gvm_bf16x4_to_f32(w.x, w.y);
            dst[2 * i + 1] = gvm_bf16x4_to_f32(w.z, w.w);
        }
    }
    return GVM_ERR_NONE;
}

// ---- ARGMAX ---------------------------------------------------------------------
// A group reduces one row after another: each thread keeps the best value, its
// index and the second best over the elements it saw (ascending indices, so
// the first of equal values stays), then warps merge by shuffles and the four
// warps' results meet in shared memory. The merge is symmetric and orders by
// (value descending, index ascending), so every lane ends with the same answer.
struct gvm_top2 {
    float v1;  // best value
    int i1;    // its index
    float v2;  // best value among the other indices seen
};

__device__ __forceinline__ gvm_top2 gvm_top2_merge(gvm_top2 a, gvm_top2 b) {
    const bool b_wins = b.v1 > a.v1 || (b.v1 == a.v1 && b.i1 < a.i1);
    return b_wins ? gvm_top2{b.v1, b.i1, fmaxf(b.v2, a.v1)} : gvm_top2{a.v1, a.i1, fmaxf(a.v2, b.v1)};
}

__device__ __forceinline__ void gvm_top2_push(gvm_top2& t, float v, int i) {
    if (v > t.v1) {
        t.v2 = t.v1;
        t.v1 = v;
        t.i1 = i;
    } else {
        t.v2 = fmaxf(t.v2, v);
    }
}

__device__ __forceinline__ bool gvm_not_finite(float v) {
    return (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u;
}

// smem: [0, 32) group sum, [32, 128) two phases of the four warps' (v1, i1, v2),
// [128, 128 + 8 * rows) each row's (token, margin) until the range is checked.
#define GVM_ARGMAX_SMEM_HEAD 128u

__device__ int gvm_op_argmax(const gvm_ctx& c) {
    const gvm_tensor& tl = gvm_t(c, 0);
    const gvm_tensor& tk = gvm_t(c, 1);
    const bool has_m = gvm_has(c, 2);
    const int row0 = c.ins->arg[0], rows = c.ins->arg[1];
    const int n = tl.shape[0], vocab = tl.shape[1];
    bool ok = gvm_is(tl, GVM_DT_F32, 2) & gvm_is(tk, GVM_DT_I32, 1) & tk.shape[0] == n & vocab > 0 &
              row0 >= 0 & rows >= 0 & row0 + rows <= n &
              c.smem_bytes >= GVM_ARGMAX_SMEM_HEAD + 8u * (unsigned)rows;
    if (has_m) ok &= gvm_is(gvm_t(c, 2), GVM_DT_F32, 1) & gvm_t(c, 2).shape[0] == n;
    if (!ok) return GVM_ERR_BAD_ARGS;
    const unsigned warp = c.tid >> 5, lane = c.tid & 31;
    const unsigned base = gvm_smem_addr(c.smem), s_part = base + 32, s_res = base + GVM_ARGMAX_SMEM_HEAD;
    const bool vec = gvm_aligned(tl, 4, 16);
    const int n4 = vec ? vocab / 4 : 0;
    float bad = 0.0f;
    unsigned phase = 0;
#pragma unroll 1
    for (int r = 0; r < rows; ++r) {
        const float* x = gvm_ptr<const float>(tl, (long long)(row0 + r) * tl.stride[0], 4);
        gvm_top2 t{GVM_NEG_INF, 0x7fffffff, GVM_NEG_INF};
#pragma unroll 1
        for (int i = c.tid; i < n4; i += 128) {
            const float4 v = reinterpret_cast<const float4*>(x)[i];
            if (gvm_not_finite(v.x) || gvm_not_finite(v.y) || gvm_not_finite(v.z) || gvm_not_finite(v.w)) bad = 1.0f;
            gvm_top2_push(t, v.x, 4 * i);
            gvm_top2_push(t, v.y, 4 * i + 1);
            gvm_top2_push(t, v.z, 4 * i + 2);
            gvm_top2_push(t, v.w, 4 * i + 3);
        }
#pragma unroll 1
        for (int i = 4 * n4 + (int)c.tid; i < vocab; i += 128) {
            if (gvm_not_finite(x[i])) bad = 1.0f;
            gvm_top2_push(t, x[i], i);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const gvm_top2 u{__shfl_xor_sync(0xffffffffu, t.v1, o), __shfl_xor_sync(0xffffffffu, t.i1, o),
                             __shfl_xor_sync(0xffffffffu, t.v2, o)};
            t = gvm_top2_merge(t, u);
        }
        const unsigned slot = s_part + (phase * 4 + warp) * 12;
        if (lane == 0) {
            gvm_sts(slot, t.v1);
            gvm_sts(slot + 4, (unsigned)t.i1);
            gvm_sts(slot + 8, t.v2);
        }
        gvm_group_sync(c);  // a phase is rewritten two rows later, past the next row's barrier
        gvm_top2 best{GVM_NEG_INF, 0x7fffffff, GVM_NEG_INF};
#pragma unroll 1
        for (unsigned w = 0; w < 4; ++w) {
            const unsigned a = s_part + (phase * 4 + w) * 12;
            best = gvm_top2_merge(best, gvm_top2{gvm_lds_f(a), (int)gvm_lds_u(a + 4), gvm_lds_f(a + 8)});
        }
        if (c.tid == 0) {
            gvm_sts(s_res + 8 * r, (unsigned)best.i1);
            gvm_sts(s_res + 8 * r + 4, best.v1 - best.v2);
        }
        phase ^= 1u;
    }
    gvm_group_sum gsum(base);
    if (gsum(c, bad) != 0.0f) return GVM_ERR_BAD_ARGS;  // its barrier also publishes the rows' results
    int* tok = gvm_ptr<int>(tk, row0, 4);
    float* margin = has_m ? gvm_ptr<float>(gvm_t(c, 2), row0, 4) : nullptr;
    for (int r = c.tid; r < rows; r += 128) {
        tok[r] = (int)gvm_lds_u(s_res + 8 * r);
        if (has_m) margin[r] = gvm_lds_f(s_res + 8 * r + 4);
    }
    return GVM_ERR_NONE;
}
