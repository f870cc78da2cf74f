// Row norms of the residual stream: RMSNORM and RESIDUAL (isa/gvm_isa.h).
// One group walks its rows one after another; 128 threads stride over a row in
// float4s, so every access is a coalesced 16-byte one. A one-token row is
// latency bound, so each pass issues GVM_ROW_BATCH loads per thread before it
// uses any, and the row read by the first pass waits in the thread's own slots
// of shared memory (no barrier: a thread reads back only what it wrote) when it
// fits the scratch, instead of being read from global memory again. Batches
// past the row's end load its last float4 again rather than being predicated
// off: predicated vector loads cost the persistent kernel registers (spills).
#pragma once
#include "common.cuh"

#ifndef GVM_ROW_BATCH
#define GVM_ROW_BATCH 8   // independent 16-byte loads in flight per thread
#endif
#ifndef GVM_RES_BATCH
#define GVM_RES_BATCH 4   // indices per batch of RESIDUAL's s, alpha, beta pass: 12 loads in flight
#endif
#define GVM_ROW_STASH 32  // scratch bytes before the stashed row (group-sum buffer)
#ifndef GVM_ROW_PF
#define GVM_ROW_PF 1      // weight vectors fetched into L2 as the op starts (0: read when their pass comes)
#endif
#define GVM_ROW_PF_CHUNK 8192u

// A weight vector of d floats (16-byte aligned: gvm_f32_vec) on its way into L2,
// one bulk prefetch per 8 KB over the group's threads: the passes that read
// it come after one or two round trips of their own, and at one token each
// of their batches would otherwise wait for HBM (RESIDUAL reads three such
// vectors, cold in every layer).
__device__ __forceinline__ void gvm_vec_prefetch(const gvm_tensor& t, int d, unsigned tid) {
    const unsigned bytes = 4u * (unsigned)d, off = tid * GVM_ROW_PF_CHUNK;
    if (GVM_ROW_PF && off < bytes)
        gvm_prefetch_l2(reinterpret_cast<const char*>(t.ptr) + off, bytes - off < GVM_ROW_PF_CHUNK ? bytes - off : GVM_ROW_PF_CHUNK);
}

__device__ __forceinline__ float gvm_sumsq4(float4 v, float s) {
    return fmaf(v.w, v.w, fmaf(v.z, v.z, fmaf(v.y, v.y, fmaf(v.x, v.x, s))));
}

// This thread's part of the sum of squares of a row; with stash != 0 the row's
// float4 i also goes to shared address stash + 16 i.
__device__ __forceinline__ float gvm_row_sumsq(const float4* x, int n4, unsigned tid, unsigned stash) {
    float s = 0.0f;
    for (int i0 = tid; i0 < n4; i0 += 128 * GVM_ROW_BATCH) {
        float4 v[GVM_ROW_BATCH];
#pragma unroll
        for (int u = 0; u < GVM_ROW_BATCH; ++u) {
            const int i = i0 + 128 * u;
            v[u] = x[min(i, n4 - 1)];  // clamped, not predicated: predicated vector loads cost registers
            if (i >= n4) v[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int u = 0; u < GVM_ROW_BATCH; ++u) {
            const int i = i0 + 128 * u;
            s = gvm_sumsq4(v[u], s);
            if (stash && i < n4) gvm_sts(stash + 16 * i, v[u]);
        }
    }
    return s;
}

// Float4 i of a row: from the stash when there is one, else from global memory.
__device__ __forceinline__ float4 gvm_row_get(const float4* x, unsigned stash, int i) {
    return stash ? gvm_lds_f4(stash + 16 * i) : x[i];
}

// Shared address of the row stash, or 0 when a row of d floats does not fit.
__device__ __forceinline__ unsigned gvm_row_stash(const gvm_ctx& c, int d) {
    return (unsigned)GVM_ROW_STASH + 4u * (unsigned)d <= c.smem_bytes ? gvm_smem_addr(c.smem) + GVM_ROW_STASH : 0u;
}

__device__ __forceinline__ float gvm_rms_inv(float sumsq, int d) {
    return 1.0f / sqrtf(sumsq / (float)d + GVM_RMS_EPS);
}

// Four consecutive values of a row, as f32 or as bf16 (round to nearest even).
__device__ __forceinline__ void gvm_store_row4(unsigned long long row, bool bf16, int i4, float4 v) {
    if (bf16) {
        reinterpret_cast<uint2*>(row)[i4] = make_uint2(gvm_pack_bf16x2(v.x, v.y), gvm_pack_bf16x2(v.z, v.w));
    } else {
        reinterpret_cast<float4*>(row)[i4] = v;
    }
}

__device__ __forceinline__ float4 gvm_norm4(float4 x, float inv, float4 w) {
    return make_float4(x.x * inv * (1.0f + w.x), x.y * inv * (1.0f + w.y), x.z * inv * (1.0f + w.z),
                       x.w * inv * (1.0f + w.w));
}

// out1 (f32, out1 != 0) and/or out2 (bf16, out2 != 0) = row * inv * (1 + w), the
// row from the stash or x; the loads of w go out a batch at a time.
__device__ __forceinline__ void gvm_row_scale(const float4* x, unsigned stash, const float4* w, float inv, int n4,
                                              unsigned tid, unsigned long long out1, unsigned long long out2) {
    for (int i0 = tid; i0 < n4; i0 += 128 * GVM_ROW_BATCH) {
        float4 wv[GVM_ROW_BATCH];
#pragma unroll
        for (int u = 0; u < GVM_ROW_BATCH; ++u) {
            const int i = i0 + 128 * u;
            wv[u] = w[min(i, n4 - 1)];
        }
#pragma unroll
        for (int u = 0; u < GVM_ROW_BATCH; ++u) {
            const int i = i0 + 128 * u;
            if (i >= n4) continue;
            const float4 v = gvm_norm4(gvm_row_get(x, stash, i), inv, wv[u]);
            if (out1) gvm_store_row4(out1, false, i, v);
            if (out2) gvm_store_row4(out2, true, i, v);
        }
    }
}

// An f32 [rows, D] tensor whose rows can be read as float4s.
__device__ __forceinline__ bool gvm_f32_rows(const gvm_tensor& t, int rows, int d) {
    return gvm_is(t, GVM_DT_F32, 2) & t.shape[0] == rows & t.shape[1] == d & gvm_aligned(t, 4, 16);
}

__device__ __forceinline__ bool gvm_f32_vec(const gvm_tensor& t, int d) {
    return gvm_is(t, GVM_DT_F32, 1) & t.shape[0] == d & gvm_aligned(t, 4, 16);
}

// An output of [rows, D], f32 or bf16, writable four values at a time.
__device__ __forceinline__ bool gvm_out_rows(const gvm_tensor& t, int rows, int d) {
    return gvm_f32_rows(t, rows, d) |
           (gvm_is(t, GVM_DT_BF16, 2) & t.shape[0] == rows & t.shape[1] == d & gvm_aligned(t, 2, 8));
}

__device__ __forceinline__ unsigned long long gvm_row_addr(const gvm_tensor& t, int row) {
    const int eb = t.dtype == GVM_DT_BF16 ? 2 : 4;
    return t.ptr + (unsigned long long)(row * t.stride[0] * eb);
}

// t0 out = rms(t1) * (1 + t2) for rows [a0, a0 + a1).
__device__ int gvm_op_rmsnorm(const gvm_ctx& c) {
    const gvm_tensor& to = gvm_t(c, 0);
    const gvm_tensor& ti = gvm_t(c, 1);
    const gvm_tensor& tw = gvm_t(c, 2);
    const int row0 = c.ins->arg[0], rows = c.ins->arg[1];
    const int n = ti.shape[0], d = ti.shape[1];
    const bool ok = gvm_f32_rows(ti, n, d) & gvm_f32_vec(tw, d) & gvm_out_rows(to, n, d) & d % 4 == 0 &
                    row0 >= 0 & rows >= 0 & row0 + rows <= n & c.smem_bytes >= GVM_ROW_STASH;
    if (!ok) return GVM_ERR_BAD_ARGS;
    gvm_vec_prefetch(tw, d, c.tid);
    gvm_group_sum gsum(gvm_smem_addr(c.smem));
    const unsigned stash = gvm_row_stash(c, d);
    const bool obf = to.dtype == GVM_DT_BF16;
    const float4* w = reinterpret_cast<const float4*>(tw.ptr);
    const int n4 = d / 4;
    for (int r = row0; r < row0 + rows; ++r) {
        const float4* x = reinterpret_cast<const float4*>(gvm_row_addr(ti, r));
        const float inv = gvm_rms_inv(gsum(c, gvm_row_sumsq(x, n4, c.tid, stash)), d);
        const unsigned long long out = gvm_row_addr(to, r);
        gvm_row_scale(x, stash, w, inv, n4, c.tid, obf ? 0 : out, obf ? out : 0);
    }
    return GVM_ERR_NONE;
}

// t0 s = alpha * s + beta * rms(t1 a); with t4 w_next set, also
// n = rms(s) * (1 + w_next) into t5 (f32) and/or t6 (bf16). Rows [a0, a0 + a1);
// with t7 (the rows' statistics), columns [a2, a2 + a3) only (gvm_residual_cols).
// The stash holds a, then (same slots, same thread) the new s.
// Kept out of line: checking seven descriptors inline hoists their fields into
// registers that the batched loads below need.
__device__ __noinline__ bool gvm_residual_args_ok(const gvm_ctx& c) {
    const gvm_tensor& ts = gvm_t(c, 0);
    const int row0 = c.ins->arg[0], rows = c.ins->arg[1];
    const int n = ts.shape[0], d = ts.shape[1];
    const bool has_w = gvm_has(c, 4), has_f = gvm_has(c, 5), has_b = gvm_has(c, 6);
    bool ok = gvm_f32_rows(ts, n, d) & gvm_f32_rows(gvm_t(c, 1), n, d) & gvm_f32_vec(gvm_t(c, 2), d) &
              gvm_f32_vec(gvm_t(c, 3), d) & d % 4 == 0 & row0 >= 0 & rows >= 0 & row0 + rows <= n &
              c.smem_bytes >= GVM_ROW_STASH;
    if (has_w) ok &= gvm_f32_vec(gvm_t(c, 4), d) & (has_f || has_b);
    if (has_w & has_f) ok &= gvm_f32_rows(gvm_t(c, 5), n, d);
    if (has_w & has_b) ok &= gvm_is(gvm_t(c, 6), GVM_DT_BF16, 2) & gvm_out_rows(gvm_t(c, 6), n, d);
    const int c0 = c.ins->arg[2], cols = c.ins->arg[3];
    if (gvm_has(c, 7)) {  // a column range with its rows' statistics: float4s of whole slots
        const gvm_tensor& st = gvm_t(c, 7);
        ok &= gvm_is(st, GVM_DT_F32, 3) & st.shape[0] == n & st.shape[1] >= 1 & st.shape[2] == 4 & st.stride[1] == 4 &
              gvm_aligned(st, 4, 16) & c0 >= 0 & cols >= 0 & c0 % 4 == 0 & cols % 4 == 0 & c0 + cols <= d &
              (cols > 0 | c0 == 0) & c.smem_bytes >= 128;
    } else {
        ok &= c0 == 0 & cols == 0;  // whole rows: the op takes both sums itself
    }
    return ok;
}

// RESIDUAL over columns [a2, a2 + a3) (a3 = 0: all) of rows whose sums came
// with t7 (GEMM's residual statistics, ops/gemm.cuh): per row, the P slots'
// (A, C, B, S) summed over the group in a fixed order (every column range
// gets the same norms), then r_a = rms factor of A, r_s of S + 2 r_a C + r_a^2 B,
// and s' = alpha s + beta a r_a, n = s' r_s (1 + w_next) column by column. A
// row's first 256 slots and its first batch of columns are loaded before any is
// used, so a one-token range of up to 1,024 columns is one round trip (the loop
// as first written added the slots before the batch's loads went out: two).
#define GVM_RES_COL_BATCH 2  // float4s of each vector per thread and batch
__device__ int gvm_residual_cols(const gvm_ctx& c) {
    const gvm_tensor& ts = gvm_t(c, 0);
    const gvm_tensor& ta = gvm_t(c, 1);
    const gvm_tensor& st = gvm_t(c, 7);
    const int row0 = c.ins->arg[0], rows = c.ins->arg[1], d = ts.shape[1], np = st.shape[1];
    const int c4 = c.ins->arg[2] / 4, e4 = c.ins->arg[3] ? c4 + c.ins->arg[3] / 4 : d / 4;
    const bool has_w = gvm_has(c, 4), has_f = gvm_has(c, 5), has_b = gvm_has(c, 6);
    const float4* alpha = reinterpret_cast<const float4*>(gvm_t(c, 2).ptr);
    const float4* beta = reinterpret_cast<const float4*>(gvm_t(c, 3).ptr);
    const float4* wn = has_w ? reinterpret_cast<const float4*>(gvm_t(c, 4).ptr) : alpha;
    gvm_group_sum4 gsum(gvm_smem_addr(c.smem));
    constexpr int B = GVM_RES_COL_BATCH;
    for (int r = row0; r < row0 + rows; ++r) {
        const float4* sl = gvm_ptr<const float4>(st, (long long)r * st.stride[0], 4);
        float4* s = reinterpret_cast<float4*>(gvm_row_addr(ts, r));
        const float4* a = reinterpret_cast<const float4*>(gvm_row_addr(ta, r));
        // the outputs' rows found before the row's stores (after one, each batch reloaded their descriptors)
        const unsigned long long fr = has_w && has_f ? gvm_row_addr(gvm_t(c, 5), r) : 0;
        const unsigned long long br = has_w && has_b ? gvm_row_addr(gvm_t(c, 6), r) : 0;
        float4 sv[B], av[B], al[B], be[B], wv[B];
        const auto load = [&](int b0) {
#pragma unroll
            for (int u = 0; u < B; ++u) {
                const int j = min(b0 + (int)c.tid + 128 * u, e4 - 1);
                sv[u] = s[j];
                av[u] = a[j];
                al[u] = alpha[j];
                be[u] = beta[j];
                wv[u] = wn[j];
            }
        };
        // the first 256 slots and the first batch of columns go out before either
        // is used (slots past np read slot np - 1, not added; e4 > c4 always)
        const float4 u0 = sl[min((int)c.tid, np - 1)], v0 = sl[min((int)c.tid + 128, np - 1)];
        load(c4);
        float4 part = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const auto add = [&](int j, float4 u, float4 v) {  // slots j and j + 128, those below np
            if (j < np) part = make_float4(part.x + u.x, part.y + u.y, part.z + u.z, part.w + u.w);
            if (j + 128 < np) part = make_float4(part.x + v.x, part.y + v.y, part.z + v.z, part.w + v.w);
        };
        add((int)c.tid, u0, v0);
        for (int j0 = 256; j0 < np; j0 += 256) {  // uniform trip count
            const int j = j0 + (int)c.tid;
            add(j, sl[min(j, np - 1)], sl[min(j + 128, np - 1)]);
        }
        const float4 sum = gsum(c, part);  // (A, C, B, S)
        const float inv_a = gvm_rms_inv(sum.x, d);
        const float inv_s = gvm_rms_inv(fmaxf(sum.w + inv_a * (2.0f * sum.y + inv_a * sum.z), 0.0f), d);
        for (int b0 = c4; b0 < e4; b0 += 128 * B) {
            if (b0 != c4) load(b0);
#pragma unroll
            for (int u = 0; u < B; ++u) {
                const int i = b0 + (int)c.tid + 128 * u;
                if (i >= e4) continue;
                const float4 nv = make_float4(al[u].x * sv[u].x + be[u].x * (av[u].x * inv_a),
                                              al[u].y * sv[u].y + be[u].y * (av[u].y * inv_a),
                                              al[u].z * sv[u].z + be[u].z * (av[u].z * inv_a),
                                              al[u].w * sv[u].w + be[u].w * (av[u].w * inv_a));
                s[i] = nv;
                if (!has_w) continue;
                const float4 v = gvm_norm4(nv, inv_s, wv[u]);
                if (has_f) gvm_store_row4(fr, false, i, v);
                if (has_b) gvm_store_row4(br, true, i, v);
            }
        }
    }
    return GVM_ERR_NONE;
}

__device__ int gvm_op_residual(const gvm_ctx& c) {
    if (!gvm_residual_args_ok(c)) return GVM_ERR_BAD_ARGS;
    if (gvm_has(c, 7)) return gvm_residual_cols(c);
    const gvm_tensor& ts = gvm_t(c, 0);
    const gvm_tensor& ta = gvm_t(c, 1);
    const int row0 = c.ins->arg[0], rows = c.ins->arg[1], d = ts.shape[1];
    const bool has_w = gvm_has(c, 4), has_f = gvm_has(c, 5), has_b = gvm_has(c, 6);
    const gvm_tensor& tal = gvm_t(c, 2);
    const gvm_tensor& tbe = gvm_t(c, 3);
    gvm_vec_prefetch(tal, d, c.tid);
    gvm_vec_prefetch(tbe, d, c.tid);
    if (has_w) gvm_vec_prefetch(gvm_t(c, 4), d, c.tid);
    gvm_group_sum gsum(gvm_smem_addr(c.smem));
    const unsigned stash = gvm_row_stash(c, d);
    const float4* alpha = reinterpret_cast<const float4*>(tal.ptr);
    const float4* beta = reinterpret_cast<const float4*>(tbe.ptr);
    const int n4 = d / 4;
    constexpr int B = GVM_RES_BATCH;
    for (int r = row0; r < row0 + rows; ++r) {
        float4* s = reinterpret_cast<float4*>(gvm_row_addr(ts, r));
        const float4* a = reinterpret_cast<const float4*>(gvm_row_addr(ta, r));
        const float inv_a = gvm_rms_inv(gsum(c, gvm_row_sumsq(a, n4, c.tid, stash)), d);
        float ss = 0.0f;
        for (int i0 = c.tid; i0 < n4; i0 += 128 * B) {
            float4 sv[B], al[B], be[B];
#pragma unroll
            for (int u = 0; u < B; ++u) {
                const int i = i0 + 128 * u;
                const int j = min(i, n4 - 1);
                sv[u] = s[j];
                al[u] = alpha[j];
                be[u] = beta[j];
            }
#pragma unroll
            for (int u = 0; u < B; ++u) {
                const int i = i0 + 128 * u;
                if (i >= n4) continue;
                const float4 av = gvm_row_get(a, stash, i);
                const float4 nv = make_float4(al[u].x * sv[u].x + be[u].x * (av.x * inv_a),
                                              al[u].y * sv[u].y + be[u].y * (av.y * inv_a),
                                              al[u].z * sv[u].z + be[u].z * (av.z * inv_a),
                                              al[u].w * sv[u].w + be[u].w * (av.w * inv_a));
                s[i] = nv;
                if (stash) gvm_sts(stash + 16 * i, nv);
                ss = gvm_sumsq4(nv, ss);
            }
        }
        if (!has_w) continue;
        const float inv_s = gvm_rms_inv(gsum(c, ss), d);
        // without a stash each thread re-reads only what it wrote to s
        gvm_row_scale(s, stash, reinterpret_cast<const float4*>(gvm_t(c, 4).ptr), inv_s, n4, c.tid,
                      has_f ? gvm_row_addr(gvm_t(c, 5), r) : 0, has_b ? gvm_row_addr(gvm_t(c, 6), r) : 0);
    }
    return GVM_ERR_NONE;
}
