// Row norms of the residual stream: RMSNORM and RESIDUAL (isa/gvm_isa.h).
// One group walks its rows one after another; 128 threads stride over a row in
// float4s, so every access is a coalesced 16-byte one. A row is read twice (sum
// of squares, then the scaled write); the second read hits L1/L2.
#pragma once
#include "common.cuh"

__device__ __forceinline__ float gvm_sumsq4(float4 v, float s) {
    return fmaf(v.w, v.w, fmaf(v.z, v.z, fmaf(v.y, v.y, fmaf(v.x, v.x, s))));
}

__device__ __forceinline__ float gvm_row_sumsq(const float4* x, int n4, unsigned tid) {
    float s = 0.0f;
    for (int i = tid; i < n4; i += 128) s = gvm_sumsq4(x[i], s);
    return s;
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

// An f32 [rows, D] tensor whose rows can be read as float4s.
__device__ __forceinline__ bool gvm_f32_rows(const gvm_tensor& t, int rows, int d) {
    return gvm_is(t, GVM_DT_F32, 2) && t.shape[0] == rows && t.shape[1] == d && gvm_aligned(t, 4, 16);
}

__device__ __forceinline__ bool gvm_f32_vec(const gvm_tensor& t, int d) {
    return gvm_is(t, GVM_DT_F32, 1) && t.shape[0] == d && gvm_aligned(t, 4, 16);
}

// An output of [rows, D], f32 or bf16, writable four values at a time.
__device__ __forceinline__ bool gvm_out_rows(const gvm_tensor& t, int rows, int d) {
    return gvm_f32_rows(t, rows, d) ||
           (gvm_is(t, GVM_DT_BF16, 2) && t.shape[0] == rows && t.shape[1] == d && gvm_aligned(t, 2, 8));
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
    const bool ok = gvm_f32_rows(ti, n, d) && gvm_f32_vec(tw, d) && gvm_out_rows(to, n, d) && d % 4 == 0 &&
                    row0 >= 0 && rows >= 0 && row0 + rows <= n && c.smem_bytes >= 32;
    if (!ok) return GVM_ERR_BAD_ARGS;
    gvm_group_sum gsum(gvm_smem_addr(c.smem));
    const bool obf = to.dtype == GVM_DT_BF16;
    const float4* w = reinterpret_cast<const float4*>(tw.ptr);
    const int n4 = d / 4;
    for (int r = row0; r < row0 + rows; ++r) {
        const float4* x = reinterpret_cast<const float4*>(gvm_row_addr(ti, r));
        const float inv = gvm_rms_inv(gsum(c, gvm_row_sumsq(x, n4, c.tid)), d);
        const unsigned long long out = gvm_row_addr(to, r);
        for (int i = c.tid; i < n4; i += 128) gvm_store_row4(out, obf, i, gvm_norm4(x[i], inv, w[i]));
    }
    return GVM_ERR_NONE;
}

// t0 s = alpha * s + beta * rms(t1 a); with t4 w_next set, also
// n = rms(s) * (1 + w_next) into t5 (f32) and/or t6 (bf16). Rows [a0, a0 + a1).
__device__ int gvm_op_residual(const gvm_ctx& c) {
    const gvm_tensor& ts = gvm_t(c, 0);
    const gvm_tensor& ta = gvm_t(c, 1);
    const gvm_tensor& tal = gvm_t(c, 2);
    const gvm_tensor& tbe = gvm_t(c, 3);
    const int row0 = c.ins->arg[0], rows = c.ins->arg[1];
    const int n = ts.shape[0], d = ts.shape[1];
    const bool has_w = gvm_has(c, 4), has_f = gvm_has(c, 5), has_b = gvm_has(c, 6);
    bool ok = gvm_f32_rows(ts, n, d) && gvm_f32_rows(ta, n, d) && gvm_f32_vec(tal, d) && gvm_f32_vec(tbe, d) &&
              d % 4 == 0 && row0 >= 0 && rows >= 0 && row0 + rows <= n && c.smem_bytes >= 32;
    if (has_w) ok = ok && gvm_f32_vec(gvm_t(c, 4), d) && (has_f || has_b);
    if (has_w && has_f) ok = ok && gvm_f32_rows(gvm_t(c, 5), n, d);
    if (has_w && has_b) ok = ok && gvm_is(gvm_t(c, 6), GVM_DT_BF16, 2) && gvm_out_rows(gvm_t(c, 6), n, d);
    if (!ok) return GVM_ERR_BAD_ARGS;
    gvm_group_sum gsum(gvm_smem_addr(c.smem));
    const float4* alpha = reinterpret_cast<const float4*>(tal.ptr);
    const float4* beta = reinterpret_cast<const float4*>(tbe.ptr);
    const float4* wn = has_w ? reinterpret_cast<const float4*>(gvm_t(c, 4).ptr) : nullptr;
    const int n4 = d / 4;
    for (int r = row0; r < row0 + rows; ++r) {
        float4* s = reinterpret_cast<float4*>(gvm_row_addr(ts, r));
        const float4* a = reinterpret_cast<const float4*>(gvm_row_addr(ta, r));
        const float inv_a = gvm_rms_inv(gsum(c, gvm_row_sumsq(a, n4, c.tid)), d);
        float ss = 0.0f;
        for (int i = c.tid; i < n4; i += 128) {
            const float4 sv = s[i], av = a[i], al = alpha[i], be = beta[i];
            const float4 nv = make_float4(al.x * sv.x + be.x * (av.x * inv_a), al.y * sv.y + be.y * (av.y * inv_a),
                                          al.z * sv.z + be.z * (av.z * inv_a), al.w * sv.w + be.w * (av.w * inv_a));
            s[i] = nv;
            ss = gvm_sumsq4(nv, ss);
        }
        if (!has_w) continue;
        const float inv_s = gvm_rms_inv(gsum(c, ss), d);
        const unsigned long long of = has_f ? gvm_row_addr(gvm_t(c, 5), r) : 0;
        const unsigned long long ob = has_b ? gvm_row_addr(gvm_t(c, 6), r) : 0;
        for (int i = c.tid; i < n4; i += 128) {  // each thread re-reads only what it wrote
            const float4 v = gvm_norm4(s[i], inv_s, wn[i]);
            if (has_f) gvm_store_row4(of, false, i, v);
            if (has_b) gvm_store_row4(ob, true, i, v);
        }
    }
    return GVM_ERR_NONE;
}
