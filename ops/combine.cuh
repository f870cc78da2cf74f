// The experts' combine of one token: fsq = bf16(sum over its local picks k of
// w_k * rms(y[slot_k])), written through a generic pointer, so that
// EXPERT_COMBINE (ops/experts.cuh) stores it in global memory and a GEMM that
// takes its x combined (ops/gemm.cuh, a7 = 1) in its own shared memory.
// One pass for the sums of squares of the live picks' rows (a single group
// reduction of 8 values), one pass for the weighted sum. Picks of other
// shards (slot -1) cost nothing: a token's slots and weights sit in lanes 0..7
// of every warp and reach the loop by shuffle, and each live row is read
// GVM_COMB_BATCH float4s per thread at a time, all in flight together.
#pragma once
#include "common.cuh"

#define GVM_COMB_BATCH 8  // float4 loads in flight per thread for the sums of squares
#define GVM_COMB_ACC 4    // float4 sums per thread in the weighted pass (accumulators + loads fit)
#define GVM_COMB_RED 256  // shared bytes of the sums: [2 halves, alternated by token][4 warps][8] f32

// Token t's fsq row (n4 float4 wide: hdim / 4) into out[0 .. n4), 4 bf16 an
// element. y: the f32 rows of the picks (ystride4 float4 apart, ny of them);
// wts / slots: route rows 3 and 4. red: GVM_COMB_RED bytes of shared memory;
// a group barrier between the passes, none after (the next token uses the
// other half of red, and a caller that reads out back syncs itself).
// BATCH, ACC: GVM_COMB_BATCH and GVM_COMB_ACC, or fewer where registers are
// held around the call (a GEMM's weight loads in flight).
template <int BATCH = GVM_COMB_BATCH, int ACC = GVM_COMB_ACC>
__device__ __forceinline__ void gvm_combine_row(const gvm_ctx& c, const float4* y, int ystride4, int ny, int n4,
                                                const int* wts, const int* slots, int t, uint2* out, unsigned red) {
    const unsigned warp = c.tid >> 5, lane = c.tid & 31;
    // lane k < 8: float4 offset of y[slot_k] (-1: a pick of another shard) and w_k
    int my_row = -1;
    float my_w = 0.0f;
    if (lane < GVM_TOPK) {
        const int s = slots[t * GVM_TOPK + lane];
        my_w = __int_as_float(wts[t * GVM_TOPK + lane]);
        my_row = s >= 0 && s < ny ? s * ystride4 : -1;
    }
    const unsigned buf = red + (t & 1) * 128;  // alternate halves: one barrier per token
#pragma unroll 1
    for (int k = 0; k < GVM_TOPK; ++k) {
        const int row = __shfl_sync(0xffffffffu, my_row, k);
        if (row < 0) continue;
        float ss = 0.0f;
        for (int i0 = c.tid; i0 < n4; i0 += 128 * BATCH) {
            float4 v[BATCH];
#pragma unroll
            for (int u = 0; u < BATCH; ++u)
                v[u] = y[row + min(i0 + 128 * u, n4 - 1)];  // clamped: predicated vector loads cost registers
#pragma unroll
            for (int u = 0; u < BATCH; ++u)
                if (i0 + 128 * u < n4) ss = fmaf(v[u].w, v[u].w, fmaf(v[u].z, v[u].z, fmaf(v[u].y, v[u].y, fmaf(v[u].x, v[u].x, ss))));
        }
        ss = gvm_warp_sum(ss);
        if (lane == 0) gvm_sts(buf + (warp * 8 + k) * 4, ss);
    }
    gvm_group_sync(c);
    const float hdim = (float)(4 * n4);
    for (int b0 = 0; b0 < n4; b0 += 128 * ACC) {  // uniform: the shuffles need every lane
        const int i0 = b0 + (int)c.tid;
        float4 a[ACC];
#pragma unroll
        for (int u = 0; u < ACC; ++u) a[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 1
        for (int k = 0; k < GVM_TOPK; ++k) {
            const int row = __shfl_sync(0xffffffffu, my_row, k);
            const float w = __shfl_sync(0xffffffffu, my_w, k);
            if (row < 0) continue;
            float4 v[ACC];
#pragma unroll
            for (int u = 0; u < ACC; ++u)
                v[u] = y[row + min(i0 + 128 * u, n4 - 1)];  // clamped: predicated vector loads cost registers
            const float s = (gvm_lds_f(buf + k * 4) + gvm_lds_f(buf + 32 + k * 4)) +
                            (gvm_lds_f(buf + 64 + k * 4) + gvm_lds_f(buf + 96 + k * 4));
            const float coef = w / sqrtf(s / hdim + GVM_RMS_EPS);
#pragma unroll
            for (int u = 0; u < ACC; ++u) {
                if (i0 + 128 * u >= n4) continue;
                a[u].x = fmaf(coef, v[u].x, a[u].x);
                a[u].y = fmaf(coef, v[u].y, a[u].y);
                a[u].z = fmaf(coef, v[u].z, a[u].z);
                a[u].w = fmaf(coef, v[u].w, a[u].w);
            }
        }
#pragma unroll
        for (int u = 0; u < ACC; ++u) {
            const int i = i0 + 128 * u;
            if (i >= n4) continue;
            out[i] = make_uint2(gvm_pack_bf16x2(a[u].x, a[u].y), gvm_pack_bf16x2(a[u].z, a[u].w));
        }
    }
}
