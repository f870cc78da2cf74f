// GEMM: out[t, n] = sum_k x[t, k] * W[n, k] for n in [n0, n0 + cnt), f32 accumulate.
//
// bf16 path (x, W bf16; out bf16 or f32): tensor cores (mma.sync m16n8k16),
// W rows as M (16 per unit), tokens as N (8 per tile). The reduction order
// over k is free, so each thread feeds the fragments straight from its own
// 16-byte loads: quad member q of row group g loads 8 consecutive k of rows g
// and g+8 and of token g, and the same k permutation applies to A and B.
// Weights are streamed with 16-byte non-coherent loads that skip L1 and carry
// an L2 evict-first policy, rolling GVM_GEMM_STEPS k-steps (3 loads each) per
// thread so that about that many stay in flight. Units of 16 rows x a K range go round-robin to the group's 4
// warps; K is split in 1, 2 or 4 so that the units are a multiple of 4 (every
// warp streams the same bytes) and the partial tiles are summed in the group's
// shared scratch.
// T > 8 loops over token tiles and re-reads the instruction's weight rows
// (from L2): correct at any T, fast for decode sizes.
//
// f32 path (x, W, out f32): one warp per row, float4 loads, CUDA-core FMAs.
#pragma once
#include "op_ctx.cuh"
#include "../runtime/params.cuh"

#ifndef GVM_GEMM_STEPS          // k-steps of 32 held per thread: as many as the register budget allows
#if GVM_MAX_GROUPS <= 2
#define GVM_GEMM_STEPS 6           // 7 spills 44 B (NVRTC 13.0 and 13.5) with the resumable group loop around it
#else
#define GVM_GEMM_STEPS 2           // 3 spills in the 4-group kernel (96 registers)
#endif
#endif
#define GVM_GEMM_TILE_BYTES 512 // one partial 16 x 8 f32 tile

__device__ __forceinline__ unsigned long long gvm_gemm_policy() {
    unsigned long long pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    return pol;
}

// Weights: read-only for the whole launch, so the non-coherent path is safe.
__device__ __forceinline__ uint4 gvm_gemm_ld_w16(const void* p, unsigned long long pol) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "l"(pol));
    return v;
}

// Activations: may have been written earlier in this launch: coherent load.
__device__ __forceinline__ uint4 gvm_gemm_ld_x16(const void* p) {
    uint4 v;
    asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ void gvm_gemm_mma(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                             unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned short gvm_gemm_bf16_bits(float f) {
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ void gvm_gemm_store(const gvm_tensor& out, long long off, float v) {
    if (out.dtype == GVM_DT_BF16)
        reinterpret_cast<unsigned short*>(out.ptr)[off] = gvm_gemm_bf16_bits(v);
    else
        reinterpret_cast<float*>(out.ptr)[off] = v;
}

// One unit: rows [row0, row0 + 16) (valid below row_end), token tile t0,
// 16-byte chunks [c_beg, c_end) of K. Returns the 16 x 8 partial in the
// C fragment (rows g, g+8; tokens 2q, 2q+1). Rows and tokens past the end
// read a valid row instead (their results are never stored), so only the K
// range needs a predicate.
//
// The loads roll: GVM_GEMM_STEPS k-steps are held in registers, and each
// step's registers are refilled with the step GVM_GEMM_STEPS ahead as soon
// as its MMAs have consumed them, so about GVM_GEMM_STEPS - 1 steps of loads
// stay in flight per thread all along (a batch that waited for all its loads
// before issuing the next one averaged half of that).
__device__ __forceinline__ void gvm_gemm_bf16_unit(float (&acc)[4], const char* w_base, long long w_row_bytes,
                                                   const char* x_base, long long x_row_bytes, int row0, int row_end,
                                                   int t0, int T, int c_beg, int c_end, unsigned lane,
                                                   unsigned long long pol) {
    const int g = lane >> 2, q = lane & 3;
    const int ra = row0 + g < row_end ? row0 + g : row_end - 1;
    const int rb = row0 + g + 8 < row_end ? row0 + g + 8 : row_end - 1;
    const int tx = t0 + g < T ? t0 + g : T - 1;
    const long long first = (long long)(c_beg + q) * 16;
    const char* pa = w_base + (long long)ra * w_row_bytes + first;
    const char* pb = w_base + (long long)rb * w_row_bytes + first;
    const char* px = x_base + (long long)tx * x_row_bytes + first;
    acc[0] = acc[1] = acc[2] = acc[3] = 0.f;
    constexpr int BATCH = 4 * GVM_GEMM_STEPS;  // chunks per batch (4 quad members per step)
    const int n_batches = (c_end - c_beg + BATCH - 1) / BATCH;  // uniform: mma.sync needs the whole warp
    uint4 A[GVM_GEMM_STEPS], B[GVM_GEMM_STEPS], X[GVM_GEMM_STEPS];
    int left = c_end - c_beg - q;  // chunks this lane has left from the batch being loaded
#pragma unroll
    for (int u = 0; u < GVM_GEMM_STEPS; ++u) {
        if (4 * u < left) {
            A[u] = gvm_gemm_ld_w16(pa + 64 * u, pol);
            B[u] = gvm_gemm_ld_w16(pb + 64 * u, pol);
            X[u] = gvm_gemm_ld_x16(px + 64 * u);
        } else {
            A[u] = B[u] = X[u] = make_uint4(0, 0, 0, 0);
        }
    }
#pragma unroll 1
    for (int b = 0; b < n_batches; ++b) {
        pa += 64 * GVM_GEMM_STEPS;
        pb += 64 * GVM_GEMM_STEPS;
        px += 64 * GVM_GEMM_STEPS;
        left -= BATCH;  // now: chunks left from the next batch (<= 0 past the last)
#pragma unroll
        for (int u = 0; u < GVM_GEMM_STEPS; ++u) {
            gvm_gemm_mma(acc, A[u].x, B[u].x, A[u].y, B[u].y, X[u].x, X[u].y);
            gvm_gemm_mma(acc, A[u].z, B[u].z, A[u].w, B[u].w, X[u].z, X[u].w);
            if (4 * u < left) {
                A[u] = gvm_gemm_ld_w16(pa + 64 * u, pol);
                B[u] = gvm_gemm_ld_w16(pb + 64 * u, pol);
                X[u] = gvm_gemm_ld_x16(px + 64 * u);
            } else {
                A[u] = B[u] = X[u] = make_uint4(0, 0, 0, 0);
            }
        }
    }
}

__device__ __forceinline__ int gvm_gemm_bf16(const gvm_ctx& c, const gvm_tensor& out, const gvm_tensor& x,
                                             const gvm_tensor& w, int n0, int cnt) {
    const unsigned lane = c.tid & 31u, warp = c.tid >> 5;
    const int T = x.shape[0], nch = x.shape[1] / 8;
    const int row_end = n0 + cnt, n_rb = (cnt + 15) / 16;
    const int max_units = (int)(c.smem_bytes / GVM_GEMM_TILE_BYTES);
    const int per_pass = max_units / 4;  // row blocks per pass: room for 4 K splits each
    if (per_pass < 1) return GVM_ERR_BAD_ARGS;
    float* part = reinterpret_cast<float*>(c.smem);
    const unsigned long long pol = gvm_gemm_policy();
    const char* w_base = reinterpret_cast<const char*>(w.ptr);
    const char* x_base = reinterpret_cast<const char*>(x.ptr);
    const long long w_row = w.stride[0] * 2, x_row = x.stride[0] * 2;
#pragma unroll 1
    for (int t0 = 0; t0 < T; t0 += 8) {
#pragma unroll 1
        for (int rb0 = 0; rb0 < n_rb; rb0 += per_pass) {
            const int nrb = n_rb - rb0 < per_pass ? n_rb - rb0 : per_pass;
            const int S = nrb % 4 == 0 ? 1 : (nrb % 2 == 0 ? 2 : 4);  // K splits: nrb * S units, 4 per warp-round
            const int cps = (nch + S - 1) / S;
#pragma unroll 1
            for (int u = warp; u < nrb * S; u += 4) {
                const int rb = u / S, s = u - rb * S;
                const int c_beg = s * cps, c_end = c_beg + cps < nch ? c_beg + cps : nch;
                float acc[4];
                gvm_gemm_bf16_unit(acc, w_base, w_row, x_base, x_row, n0 + (rb0 + rb) * 16, row_end, t0, T, c_beg,
                                   c_end, lane, pol);
                float* tile = part + u * 128;  // [16 rows][8 tokens]
                const int g = lane >> 2, q = lane & 3;
                tile[g * 8 + 2 * q] = acc[0];
                tile[g * 8 + 2 * q + 1] = acc[1];
                tile[(g + 8) * 8 + 2 * q] = acc[2];
                tile[(g + 8) * 8 + 2 * q + 1] = acc[3];
            }
            gvm_group_sync(c);
            // Sum the K splits and store; consecutive threads write consecutive n.
#pragma unroll 1
            for (int e = c.tid; e < nrb * 128; e += GVM_GROUP_THREADS) {
                const int rb = e >> 7, tk = (e >> 4) & 7, r = e & 15;
                const int row = n0 + (rb0 + rb) * 16 + r, tok = t0 + tk;
                if (row < row_end && tok < T) {
                    float sum = 0.f;
                    for (int s = 0; s < S; ++s) sum += part[(rb * S + s) * 128 + r * 8 + tk];
                    gvm_gemm_store(out, (long long)tok * out.stride[0] + row, sum);
                }
            }
            gvm_group_sync(c);
        }
    }
    return GVM_ERR_NONE;
}

__device__ __forceinline__ float4 gvm_gemm_ld_wf4(const float* p, unsigned long long pol) {
    const uint4 v = gvm_gemm_ld_w16(p, pol);
    return make_float4(__uint_as_float(v.x), __uint_as_float(v.y), __uint_as_float(v.z), __uint_as_float(v.w));
}

__device__ __forceinline__ float4 gvm_gemm_ld_xf4(const float* p) {
    const uint4 v = gvm_gemm_ld_x16(p);
    return make_float4(__uint_as_float(v.x), __uint_as_float(v.y), __uint_as_float(v.z), __uint_as_float(v.w));
}

// f32: warp per output row, lanes over K in float4 chunks, 8 tokens at a time.
__device__ __forceinline__ int gvm_gemm_f32(const gvm_ctx& c, const gvm_tensor& out, const gvm_tensor& x,
                                            const gvm_tensor& w, int n0, int cnt) {
    const unsigned lane = c.tid & 31u, warp = c.tid >> 5;
    const int T = x.shape[0], n4 = x.shape[1] / 4;
    const unsigned long long pol = gvm_gemm_policy();
    const float* xb = reinterpret_cast<const float*>(x.ptr);
    float* ob = reinterpret_cast<float*>(out.ptr);
#pragma unroll 1
    for (int r = n0 + (int)warp; r < n0 + cnt; r += 4) {
        const float* wr = reinterpret_cast<const float*>(w.ptr) + (long long)r * w.stride[0];
#pragma unroll 1
        for (int t0 = 0; t0 < T; t0 += 8) {
            const int tt = T - t0 < 8 ? T - t0 : 8;
            float acc[8];
#pragma unroll
            for (int t = 0; t < 8; ++t) acc[t] = 0.f;
#pragma unroll 1
            for (int ch = lane; ch < n4; ch += 32) {
                const float4 wv = gvm_gemm_ld_wf4(wr + 4 * ch, pol);
#pragma unroll
                for (int t = 0; t < 8; ++t) {
                    if (t < tt) {
                        const float4 xv = gvm_gemm_ld_xf4(xb + (long long)(t0 + t) * x.stride[0] + 4 * ch);
                        acc[t] = fmaf(wv.x, xv.x, acc[t]);
                        acc[t] = fmaf(wv.y, xv.y, acc[t]);
                        acc[t] = fmaf(wv.z, xv.z, acc[t]);
                        acc[t] = fmaf(wv.w, xv.w, acc[t]);
                    }
                }
            }
#pragma unroll
            for (int t = 0; t < 8; ++t) {
#pragma unroll
                for (int off = 16; off > 0; off >>= 1) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], off);
                if (lane == (unsigned)t && t < tt) ob[(long long)(t0 + t) * out.stride[0] + r] = acc[t];
            }
        }
    }
    return GVM_ERR_NONE;
}

__device__ __forceinline__ bool gvm_gemm_operand_ok(const gvm_tensor& t, int esize) {
    return t.ndim == 2 && t.stride[1] == 1 && (t.ptr & 15ull) == 0 && ((t.stride[0] * esize) & 15) == 0;
}

__device__ __forceinline__ int gvm_op_gemm(const gvm_ctx& c) {
    const gvm_instr& in = *c.ins;
    if (in.tensor[0] == GVM_NONE || in.tensor[1] == GVM_NONE || in.tensor[2] == GVM_NONE) return GVM_ERR_BAD_ARGS;
    const gvm_tensor& out = gvm_t(c, 0);
    const gvm_tensor& x = gvm_t(c, 1);
    const gvm_tensor& w = gvm_t(c, 2);
    const int n0 = in.arg[0], cnt = in.arg[1];
    const bool bf = x.dtype == GVM_DT_BF16 && w.dtype == GVM_DT_BF16 &&
                    (out.dtype == GVM_DT_BF16 || out.dtype == GVM_DT_F32);
    const bool f32 = x.dtype == GVM_DT_F32 && w.dtype == GVM_DT_F32 && out.dtype == GVM_DT_F32;
    const int es = bf ? 2 : 4;
    if (!(bf || f32) || !gvm_gemm_operand_ok(x, es) || !gvm_gemm_operand_ok(w, es) || out.ndim != 2 ||
        out.stride[1] != 1 || x.shape[1] % 8 != 0 || w.shape[1] != x.shape[1] || out.shape[0] != x.shape[0] ||
        out.shape[1] != w.shape[0] || n0 < 0 || cnt < 0 || n0 + cnt > w.shape[0])
        return GVM_ERR_BAD_ARGS;
    if (cnt == 0 || x.shape[0] == 0) return GVM_ERR_NONE;
    return bf ? gvm_gemm_bf16(c, out, x, w, n0, cnt) : gvm_gemm_f32(c, out, x, w, n0, cnt);
}
