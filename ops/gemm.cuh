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
// (from L2) for each unless GVM_GEMM_TT > 1: with 4 (the 2-group default) a pass
// over the weights serves 4 token tiles (measured: the 256-token layer 5.0 -> 4.2 ms).
// From GVM_GEMM_XS_MIN tokens the group stages W and x in shared memory
// instead (gvm_gemm_xs, below).
//
// f32 path (x, W, out f32; the router): CUDA-core FMAs, the group splits K;
// staged (below), the tensor cores as three tf32 MMAs a product.
// Both paths take a token range (a2 t0, a3 count; 0: all tokens) in the
// 2-group kernel: the lowering cuts the bf16 tiles over tokens from 64 tokens
// on and the router's from 32 (gpuvm/muse/lowering.py, Tiles.gemm_span and
// router_span), and each path stages W and x in shared memory for them
// (gvm_gemm_xs, gvm_gemm_f32_xs). The f32 path also takes a part of K (a5,
// a6): the router's staged tiles are few (32 rows x 64 tokens each), so the
// lowering cuts them over K as well to spread them over the SMs.
// Thread tid owns the 16-byte chunks tid, tid + 128, ... (one per step) of
// every row and token of a register tile of RT rows x TT tokens: per step it
// loads RT float4 of W (one per row) and TT of x (one per token), so one x
// load serves RT rows and one W load TT tokens. The loads roll over S steps
// as in the bf16 path, S as large as the register budget allows (see
// gvm_gemm_f32_steps): at T = 1, 11 to 16 float4 of W in flight per thread in
// the 2-group kernel, 7 or 8 in the 4-group one, whatever cnt is, since the
// rows go in tiles of 8 (4 in the 4-group kernel), then 4, 2, 1 (cnt's binary
// digits: no load wasted on a row past the end). T > 1 goes in tiles of 4
// rows (the last one partial; one tile per call of the op, GVM_AGAIN) x 4
// tokens (tokens past T are not loaded), W re-read from L2 for each token
// tile. Each tile ends in a reduction over the 128 threads: a butterfly in
// each warp that leaves one of the RT * TT sums per lane, then the 4 warps'
// sums through the group's scratch (double-buffered: one group barrier per
// tile), added in warp order, so the result is deterministic.
//
// Host build (tools/ops_emu, no __CUDA_ARCH__): the few PTX primitives below
// have plain C++ versions, so that the emulator runs this header unchanged.
#pragma once
#include "common.cuh"
#include "../runtime/params.cuh"

#ifndef GVM_GEMM_STEPS          // k-steps of 32 held per thread: as many as the register budget allows
#if GVM_MAX_GROUPS <= 2
#define GVM_GEMM_STEPS 6           // 7 spills 44 B (NVRTC 13.0 and 13.5) with the resumable group loop around it
#else
#define GVM_GEMM_STEPS 2           // 3 spills in the 4-group kernel (96 registers)
#endif
#endif
#define GVM_GEMM_TILE_BYTES 512 // one partial 16 x 8 f32 tile
#ifndef GVM_GEMM_FOLD  // tiles of at most 8 rows and 4 tokens fold their K range (gvm_gemm_bf16_unit); 0: never
#define GVM_GEMM_FOLD 1
#endif

#ifdef __CUDA_ARCH__
// Weights: read-only for the whole launch, so the non-coherent path is safe.
// OFF: a constant byte offset, folded into the instruction (no address math;
// the bf16 path keeps 0 and the plain form).
template <int OFF = 0>
__device__ __forceinline__ uint4 gvm_gemm_ld_w16(const void* p, unsigned long long pol) {
    uint4 v;
    if (OFF == 0)
        asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(p), "l"(pol));
    else
        asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4+%6], %5;"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(p), "l"(pol), "n"(OFF));
    return v;
}

// Activations: may have been written earlier in this launch: coherent load.
template <int OFF = 0>
__device__ __forceinline__ uint4 gvm_gemm_ld_x16(const void* p) {
    uint4 v;
    if (OFF == 0)
        asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    else
        asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4+%5];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(p), "n"(OFF));
    return v;
}

__device__ __forceinline__ unsigned short gvm_gemm_bf16_bits(float f) {
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

#else   // host (tools/ops_emu): the same semantics in plain C++
template <int OFF = 0> inline uint4 gvm_gemm_ld_w16(const void* p, unsigned long long) {
    return gvm_emu_load<uint4>(static_cast<const char*>(p) + OFF);
}
template <int OFF = 0> inline uint4 gvm_gemm_ld_x16(const void* p) {
    return gvm_emu_load<uint4>(static_cast<const char*>(p) + OFF);
}
inline unsigned short gvm_gemm_bf16_bits(float f) { return (unsigned short)(gvm_pack_bf16x2(f, 0.f) & 0xffffu); }
#endif

// A sum into the output (gvm_view: its fields read once), f32 or bf16.
__device__ __forceinline__ void gvm_gemm_store(const gvm_view& d, long long off, float v) {
    if (d.dtype == GVM_DT_BF16)
        reinterpret_cast<unsigned short*>(d.ptr)[off] = gvm_gemm_bf16_bits(v);
    else
        reinterpret_cast<float*>(d.ptr)[off] = v;
}

// K step u of a batch: rows a and b of W and the TT tokens' x (tiles of 8
// tokens apart), 16 bytes each at 64 u past the batch's pointers, or zeros
// when this lane's chunks ran out.
template <int TT>
__device__ __forceinline__ void gvm_gemm_bf16_fill(uint4& a, uint4& b, uint4 (&x)[TT], const char* pa, const char* pb,
                                                   const char* const (&px)[TT], int u, int left,
                                                   unsigned long long pol) {
    if (4 * u < left) {
        a = gvm_gemm_ld_w16(pa + 64 * u, pol);
        b = gvm_gemm_ld_w16(pb + 64 * u, pol);
#pragma unroll
        for (int j = 0; j < TT; ++j) x[j] = gvm_gemm_ld_x16(px[j] + 64 * u);
    } else {
        a = b = make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int j = 0; j < TT; ++j) x[j] = make_uint4(0, 0, 0, 0);
    }
}

// One unit: rows [row0, row0 + 16) (valid below row_end), TT token tiles of
// 8 from t0, 16-byte chunks [c_beg, c_end) of K. Returns each tile's 16 x 8
// partial in the C fragment (rows g, g+8; tokens 2q, 2q+1). Rows and tokens
// past the end read a valid row instead (their results are never stored), so
// only the K range needs a predicate. With TT > 1 the weights loaded once
// serve TT token tiles (each tile's sums in the same order as with TT = 1).
//
// The loads roll: S k-steps are held in registers, and each step's registers
// are refilled with the step S ahead as soon as its MMAs have consumed them,
// so about S - 1 steps of loads stay in flight per thread all along (a batch
// that waited for all its loads before issuing the next one averaged half of
// that).
//
// fold (TT = 1, at most 8 rows and 4 tokens, an even K range): rows g + 8 of
// the MMA are rows g again over the second half of the K range, and token
// columns 4..7 hold tokens 0..3's x of that half, so that the loads a lane
// holds for rows g + 8 (otherwise copies of the last row) are weight bytes
// too and the unit takes half the round trips; row g's sum for token t is
// then D[g][t] + D[g + 8][t + 4], one shuffle from lane q + 2.
template <int TT, int S, bool FOLD = false>
__device__ __forceinline__ void gvm_gemm_bf16_unit(float (&acc)[TT][4], const char* w_base, long long w_row_bytes,
                                                   const char* x_base, long long x_row_bytes, int row0, int row_end,
                                                   int t0, int T, int c_beg, int c_end, unsigned lane,
                                                   unsigned long long pol) {
    static_assert(!FOLD || TT == 1, "fold: one token tile");
    const int g = lane >> 2, q = lane & 3;
    const int span = FOLD ? (c_end - c_beg) / 2 : c_end - c_beg;  // chunks the loop walks
    const long long half = FOLD ? (long long)span * 16 : 0;      // where rows g + 8 and tokens 4..7 read
    const int ra = row0 + g < row_end ? row0 + g : row_end - 1;
    const int rb = FOLD ? ra : (row0 + g + 8 < row_end ? row0 + g + 8 : row_end - 1);
    const long long first = (long long)(c_beg + q) * 16;
    const char* pa = w_base + (long long)ra * w_row_bytes + first;
    const char* pb = w_base + (long long)rb * w_row_bytes + first + half;
    const char* px[TT];
#pragma unroll
    for (int j = 0; j < TT; ++j) {
        const int tg = FOLD ? (g & 3) : g;
        const int tx = t0 + 8 * j + tg < T ? t0 + 8 * j + tg : T - 1;
        px[j] = x_base + (long long)tx * x_row_bytes + first + (FOLD && g >= 4 ? half : 0);
        acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    }
    constexpr int BATCH = 4 * S;  // chunks per batch (4 quad members per step)
    const int n_batches = (span + BATCH - 1) / BATCH;  // uniform: mma.sync needs the whole warp
    uint4 A[S], B[S], X[S][TT];
    int left = span - q;  // chunks this lane has left from the batch being loaded
#pragma unroll
    for (int u = 0; u < S; ++u) gvm_gemm_bf16_fill<TT>(A[u], B[u], X[u], pa, pb, px, u, left, pol);
#pragma unroll 1
    for (int b = 0; b < n_batches; ++b) {
        pa += 64 * S;
        pb += 64 * S;
#pragma unroll
        for (int j = 0; j < TT; ++j) px[j] += 64 * S;
        left -= BATCH;  // now: chunks left from the next batch (<= 0 past the last)
#pragma unroll
        for (int u = 0; u < S; ++u) {
#pragma unroll
            for (int j = 0; j < TT; ++j) {
                gvm_mma_bf16(acc[j], A[u].x, B[u].x, A[u].y, B[u].y, X[u][j].x, X[u][j].y);
                gvm_mma_bf16(acc[j], A[u].z, B[u].z, A[u].w, B[u].w, X[u][j].z, X[u][j].w);
            }
            gvm_gemm_bf16_fill<TT>(A[u], B[u], X[u], pa, pb, px, u, left, pol);
        }
    }
    if (FOLD) {  // lane q < 2 adds the second half's tokens 2q, 2q + 1 (lane q + 2's rows g + 8)
        acc[0][0] += __shfl_xor_sync(0xffffffffu, acc[0][2], 2);
        acc[0][1] += __shfl_xor_sync(0xffffffffu, acc[0][3], 2);
    }
}

// Token tiles of 8 per pass over the weights when T > 8 (GVM_GEMM_TT; 1: every
// token tile re-reads the weights from L2), and the k-steps held for them.
#ifndef GVM_GEMM_TT  // the 4-group kernel (96 registers) spills with 2 or 4 under tracing
#define GVM_GEMM_TT (GVM_MAX_GROUPS <= 2 ? 4 : 1)
#endif
#ifndef GVM_GEMM_TT_STEPS  // k-steps held with TT tiles: 2-group kernel, TT 2: 4, TT 4: 2 (more spill)
#define GVM_GEMM_TT_STEPS (GVM_GEMM_STEPS * 4 / (3 * GVM_GEMM_TT) > 1 ? GVM_GEMM_STEPS * 4 / (3 * GVM_GEMM_TT) : 1)
#endif

// ---- residual statistics (optional t3..t6) ------------------------------------------
// The norms of RESIDUAL (ops/norm.cuh) need two sums over a whole row, rms(a)
// and then rms of the new s; one group walking a one-token row of 8,192 makes
// them a chain of round trips (~7.6 us an op on the H200 step's critical path).
// A GEMM that produces a can hand RESIDUAL the sums instead: per token and
// column tile, (sum a^2, sum alpha beta s a, sum beta^2 a^2, sum alpha^2 s^2)
// give both norms (s' = alpha s + beta a r_a has sum s'^2 = S + 2 r_a C + r_a^2 B),
// so RESIDUAL can be cut over columns. The register tiles (gvm_gemm_bf16_tiles)
// add them up from their sums as they store them; the other paths read out
// back after their stores (gvm_gemm_stats: warp w takes tokens 4w.. four at a
// time, lanes stride over the columns). Butterfly sums in a fixed order: the
// sums do not depend on the schedule. Reading back cost a round trip a tile
// (Wo and Wex tiles ~2 us longer at one token, H200, cf027d9).

// True without statistics. Branch-free (an absent slot's descriptor is zeros,
// masked out), so that its reads go out with the op's other checks.
__device__ __forceinline__ bool gvm_gemm_stats_ok(const gvm_ctx& c) {
    const bool has = gvm_has(c, 3), all = gvm_has(c, 4) & gvm_has(c, 5) & gvm_has(c, 6);
    const gvm_tensor& out = gvm_t(c, 0);
    const gvm_tensor& st = gvm_t(c, 3);
    const gvm_tensor& s = gvm_t(c, 4);
    const gvm_tensor& al = gvm_t(c, 5);
    const gvm_tensor& be = gvm_t(c, 6);
    const int t = out.shape[0], n = out.shape[1], slot = c.ins->arg[4];
    const bool ok = all & (out.dtype == GVM_DT_F32) & gvm_is(st, GVM_DT_F32, 3) & (st.shape[0] == t) & (st.shape[2] == 4) &
                    (st.stride[1] == 4) & gvm_aligned(st, 4, 16) & (slot >= 0) & (slot < st.shape[1]) & gvm_is(s, GVM_DT_F32, 2) &
                    (s.shape[0] == t) & (s.shape[1] == n) & gvm_is(al, GVM_DT_F32, 1) & (al.shape[0] == n) &
                    gvm_is(be, GVM_DT_F32, 1) & (be.shape[0] == n);
    return !has | ok;
}

// The instruction's columns and tokens, read again from the instruction: held
// across the GEMM's body they cost a spill.
__device__ __forceinline__ void gvm_gemm_range(const gvm_ctx& c, int& n0, int& cnt, int& t0, int& tn) {
    n0 = c.ins->arg[0], cnt = c.ins->arg[1];
    t0 = GVM_MAX_GROUPS <= 2 ? c.ins->arg[2] : 0;
    tn = GVM_MAX_GROUPS <= 2 && c.ins->arg[3] ? c.ins->arg[3] : gvm_t(c, 0).shape[0];
}

__device__ __forceinline__ void gvm_stats_add(float (&r)[4], float a, float s, float alpha, float beta) {
    const float ba = beta * a, as = alpha * s;
    r[0] = fmaf(a, a, r[0]);
    r[1] = fmaf(as, ba, r[1]);
    r[2] = fmaf(ba, ba, r[2]);
    r[3] = fmaf(as, as, r[3]);
}

__device__ __forceinline__ void gvm_stats_store(const gvm_ctx& c, int t, const float (&r)[4]) {
    const gvm_tensor& st = gvm_t(c, 3);
    *gvm_ptr<float4>(st, (long long)t * st.stride[0] + 4ll * c.ins->arg[4], 4) = make_float4(r[0], r[1], r[2], r[3]);
}

#ifndef GVM_GEMM_STATS_PROBE
#define GVM_GEMM_STATS_PROBE 0  // timing probes (wrong sums): 1 the register tiles load no s, alpha, beta; 4 no argument check of t3..t6
#endif
// The statistics of tokens [t_beg, t_end) read back from out, after a group
// barrier (the group's own stores); the register tiles take theirs from their
// sums instead (gvm_gemm_bf16_tiles).
__device__ __forceinline__ void gvm_gemm_stats(const gvm_ctx& c, int t_beg, int t_end) {
    gvm_group_sync(c);  // out was stored by the whole group
    const gvm_tensor& out = gvm_t(c, 0);
    const gvm_tensor& ts = gvm_t(c, 4);
    const int n0 = c.ins->arg[0], cnt = c.ins->arg[1];
    const float* a = reinterpret_cast<const float*>(out.ptr);
    const float* s = reinterpret_cast<const float*>(ts.ptr);
    const float* al = reinterpret_cast<const float*>(gvm_t(c, 5).ptr);
    const float* be = reinterpret_cast<const float*>(gvm_t(c, 6).ptr);
    const long long ao = out.stride[0], so = ts.stride[0];
    const unsigned lane = c.tid & 31u;
#pragma unroll 1
    for (int tb = t_beg + 4 * (int)(c.tid >> 5); tb < t_end; tb += 16) {
        float r[4][4];
#pragma unroll
        for (int u = 0; u < 4; ++u) r[u][0] = r[u][1] = r[u][2] = r[u][3] = 0.0f;
#pragma unroll 1
        for (int n = n0 + (int)lane; n < n0 + cnt; n += 32) {
            const float alpha = al[n], beta = be[n];
            float av[4], sv[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {  // tokens past the end repeat the last one (not stored)
                const long long t = tb + u < t_end ? tb + u : t_end - 1;
                av[u] = a[t * ao + n];
                sv[u] = s[t * so + n];
            }
#pragma unroll
            for (int u = 0; u < 4; ++u) gvm_stats_add(r[u], av[u], sv[u], alpha, beta);
        }
#pragma unroll
        for (int u = 0; u < 4; ++u)
#pragma unroll
            for (int k = 0; k < 4; ++k) r[u][k] = gvm_warp_sum(r[u][k]);
        if (lane == 0) {
#pragma unroll
            for (int u = 0; u < 4; ++u)
                if (tb + u < t_end) gvm_stats_store(c, tb + u, r[u]);
        }
    }
}

// Token tiles [t0, t0 + 8 TT) (below T) x the instruction's rows, in passes of row
// blocks, each unit's K split S ways; partial tiles summed in shared memory
// in split order (deterministic) and stored.
template <int TT, int STEPS>
__device__ __forceinline__ int gvm_gemm_bf16_tiles(const gvm_ctx& c, const gvm_tensor& out, const gvm_tensor& x,
                                                   const gvm_tensor& w, int n0, int cnt, int t0, int T) {
    const unsigned lane = c.tid & 31u, warp = c.tid >> 5;
    const int nch = x.shape[1] / 8;
    const int row_end = n0 + cnt, n_rb = (cnt + 15) / 16;
    const int max_units = (int)(c.smem_bytes / (TT * GVM_GEMM_TILE_BYTES));
    const int per_pass = max_units / 4;  // row blocks per pass: room for 4 K splits each
    if (per_pass < 1) return GVM_ERR_BAD_ARGS;
    float* part = reinterpret_cast<float*>(c.smem);
    const unsigned long long pol = gvm_policy_evict_first();
    const char* w_base = reinterpret_cast<const char*>(w.ptr);
    const char* x_base = reinterpret_cast<const char*>(x.ptr);
    const long long w_row = w.stride[0] * 2, x_row = x.stride[0] * 2;
#pragma unroll 1
    for (int rb0 = 0; rb0 < n_rb; rb0 += per_pass) {
        const int nrb = n_rb - rb0 < per_pass ? n_rb - rb0 : per_pass;
        const int S = nrb % 4 == 0 ? 1 : (nrb % 2 == 0 ? 2 : 4);  // K splits: nrb * S units, 4 per warp-round
        const int cps = (nch + S - 1) / S;
        const bool fold = GVM_GEMM_FOLD && cnt <= 8 && T - t0 <= 4 && nch % (2 * S) == 0;  // every unit's K range even (see the unit)
#pragma unroll 1
        for (int u = warp; u < nrb * S; u += 4) {
            const int rb = u / S, s = u - rb * S;
            const int c_beg = s * cps, c_end = c_beg + cps < nch ? c_beg + cps : nch;
            float acc[TT][4];
            if (TT == 1 && fold)  // a copy of the unit: a runtime flag in the one loop cost the 8-token tiles ~1.5%
                gvm_gemm_bf16_unit<TT, STEPS, TT == 1>(acc, w_base, w_row, x_base, x_row, n0 + (rb0 + rb) * 16, row_end,
                                                       t0, T, c_beg, c_end, lane, pol);
            else
                gvm_gemm_bf16_unit<TT, STEPS>(acc, w_base, w_row, x_base, x_row, n0 + (rb0 + rb) * 16, row_end, t0, T,
                                              c_beg, c_end, lane, pol);
            const int g = lane >> 2, q = lane & 3;
#pragma unroll
            for (int j = 0; j < TT; ++j) {
                float* tile = part + (u * TT + j) * 128;  // [16 rows][8 tokens]
                tile[g * 8 + 2 * q] = acc[j][0];
                tile[g * 8 + 2 * q + 1] = acc[j][1];
                tile[(g + 8) * 8 + 2 * q] = acc[j][2];
                tile[(g + 8) * 8 + 2 * q + 1] = acc[j][3];
            }
        }
        // Sum the K splits and store; consecutive threads write consecutive n.
        // Thread tid's elements all hold token tk = tid / 16 of a token tile
        // (row r = tid % 16). With statistics and one pass, the thread adds up
        // (a, s, alpha, beta) of its token per token tile j, then the 16
        // threads of a token sum theirs (below). s, alpha and beta of its
        // first two row blocks are loaded before the barrier, while the other
        // warps finish their units (loaded in the loop they cost a round trip
        // a tile: H200, aee71da, Wo 7.3 us a tile, 6.6 without the loads).
        // (read here: a flag held across the K loop spilled; the 4-group kernel has no registers for it)
        const bool fused = GVM_MAX_GROUPS <= 2 && nrb == n_rb && gvm_has(c, 3);
        const int tk = (int)(c.tid >> 4), r = (int)(c.tid & 15u);
        float ps[2][TT], pa[2], pb[2];
#pragma unroll
        for (int q = 0; q < 2; ++q) {
            pa[q] = pb[q] = 0.f;
#pragma unroll
            for (int j = 0; j < TT; ++j) ps[q][j] = 0.f;
            if (TT == 1 && fused && !(GVM_GEMM_STATS_PROBE & 1)) {  // (4 token tiles: they spilled)
                const int row = min(n0 + q * 16 + r, row_end - 1);  // a valid row (its sums unused past the end)
                pa[q] = gvm_ptr<const float>(gvm_t(c, 5), row, 4)[0];
                pb[q] = gvm_ptr<const float>(gvm_t(c, 6), row, 4)[0];
#pragma unroll
                for (int j = 0; j < TT; ++j)
                    ps[q][j] = gvm_ptr<const float>(gvm_t(c, 4), (long long)min(t0 + 8 * j + tk, T - 1) * gvm_t(c, 4).stride[0] + row, 4)[0];
            }
        }
        gvm_group_sync(c);
        const gvm_view dst = gvm_view_of(out);
        float sr[TT][4];
#pragma unroll
        for (int j = 0; j < TT; ++j) sr[j][0] = sr[j][1] = sr[j][2] = sr[j][3] = 0.f;
#pragma unroll 1
        for (int e = c.tid; e < nrb * TT * 128; e += GVM_GROUP_THREADS) {
            const int rb = e / (TT * 128), j = (e >> 7) % TT;
            const int row = n0 + (rb0 + rb) * 16 + r, tok = t0 + 8 * j + tk;
            if (row < row_end && tok < T) {
                float sum = 0.f;
                for (int s = 0; s < S; ++s) sum += part[((rb * S + s) * TT + j) * 128 + r * 8 + tk];
                gvm_gemm_store(dst, (long long)tok * dst.s0 + row, sum);
                if (fused) {
                    float q[4] = {0.f, 0.f, 0.f, 0.f}, sv = 0.f, al = 0.f, be = 0.f;
#pragma unroll
                    for (int qq = 0; qq < 2; ++qq) {  // rb and j are not constants: select, not index (local memory)
                        if (rb != qq) continue;
                        al = pa[qq], be = pb[qq];
#pragma unroll
                        for (int jj = 0; jj < TT; ++jj) sv = jj == j ? ps[qq][jj] : sv;
                    }
                    if ((TT > 1 || rb >= 2) && !(GVM_GEMM_STATS_PROBE & 1)) {
                        sv = gvm_ptr<const float>(gvm_t(c, 4), (long long)tok * gvm_t(c, 4).stride[0] + row, 4)[0];
                        al = gvm_ptr<const float>(gvm_t(c, 5), row, 4)[0];
                        be = gvm_ptr<const float>(gvm_t(c, 6), row, 4)[0];
                    }
                    gvm_stats_add(q, sum, sv, al, be);
#pragma unroll
                    for (int jj = 0; jj < TT; ++jj)  // j is not a constant: select, not index (local memory)
#pragma unroll
                        for (int k = 0; k < 4; ++k) sr[jj][k] += jj == j ? q[k] : 0.f;
                }
            }
        }
        if (fused) {
#pragma unroll
            for (int j = 0; j < TT; ++j) {
#pragma unroll
                for (int k = 0; k < 4; ++k)
#pragma unroll
                    for (int o = 8; o > 0; o >>= 1) sr[j][k] += __shfl_xor_sync(0xffffffffu, sr[j][k], o);
                if (r == 0 && t0 + 8 * j + tk < T) gvm_stats_store(c, t0 + 8 * j + tk, sr[j]);
            }
        }
        gvm_group_sync(c);
    }
    if ((GVM_MAX_GROUPS > 2 || per_pass < n_rb) && gvm_has(c, 3)) gvm_gemm_stats(c, t0, min(t0 + 8 * TT, T));  // not summed above: read back
    return GVM_ERR_NONE;
}

// ---- bf16 at many tokens: W and x staged in shared memory ----------------------------
// At many tokens an instruction is bound by its math and by what it reads
// from L2, not by its weights: the path above has every warp read x itself,
// once per 16 rows, and its MMA operands come straight from 16-byte loads in
// a k order that needs register moves (4 per MMA) and that chains each
// token tile's two MMAs (the 256-token layer's Wqkvg tile of 64 rows x 64
// tokens ran 155 us, ~80 cycles an MMA). Here a pass covers M x 64 rows x 64
// tokens: each stage holds 64 k of both (8 KB a 64 rows or tokens, 128 bytes
// a row), copied by cp.async GVM_GEMM_XS_STAGES deep, and the group
// multiplies it as M warpgroup MMAs a k16 step (wgmma, operands read from
// shared memory). A 16-byte chunk c of a stage's row r sits at chunk
// c ^ (r & 7): wgmma's 128-byte swizzle, stages 1024-byte aligned. An
// instruction loops over its rows, then its tokens, a pass at a time; rows
// and tokens past its end are zero-filled and not stored. A pass of two row
// halves (M = 2, from more than 64 rows left: GVM_GEMM_XS_M2) reads its x
// stage once for 128 rows, so that a tile of 128 rows x 64 tokens moves 3 MB
// through L2 at K = 8,192 instead of 4 (the 256-token layer's squeeze, Wex
// and Wo tiles, whose phases moved ~6.9 TB/s from L2 in all at 64 rows a
// pass: tools/staged_l2.py on cacac56's traces).
// (Fetching W into L2 a few stages ahead by bulk prefetch lost: H200,
// 866548f, sliding-c32-t8 1945 us with, 1846 without; more stages won
// instead: runtime/params.cuh.)
#ifndef GVM_GEMM_XS_MIN  // tokens from which an instruction stages W and x (0: never; the 4-group kernel has no registers for it)
#define GVM_GEMM_XS_MIN (GVM_MAX_GROUPS <= 2 ? 64 : 0)
#endif
#ifndef GVM_GEMM_XS_M2  // passes of two row halves for more than 64 rows (0: 64 rows a pass)
#define GVM_GEMM_XS_M2 1
#endif
#define GVM_GEMM_XS_TILE 64     // rows (a half) and tokens of a pass
#define GVM_GEMM_XS_HALF (GVM_GEMM_XS_TILE * 128)  // bytes of 64 rows or tokens in a stage
#define GVM_GEMM_XS_STAGE_BYTES (2 * GVM_GEMM_XS_HALF)
#define GVM_GEMM_XS_NS(bytes) (GVM_GROUP_SMEM / (bytes) < 8 ? GVM_GROUP_SMEM / (bytes) : 8)
#ifndef GVM_GEMM_XS_STAGES  // as many as the group's scratch holds, up to 8
#define GVM_GEMM_XS_STAGES GVM_GEMM_XS_NS(GVM_GEMM_XS_STAGE_BYTES)
#endif
static_assert(GVM_GEMM_XS_STAGES >= 2, "GVM_GEMM_XS_STAGES: a stage in use and one landing");
static_assert(!GVM_GEMM_XS_M2 || GVM_GEMM_XS_NS(3 * GVM_GEMM_XS_HALF) >= 2, "GVM_GEMM_XS_M2: two stages of 128 rows");
static_assert(GVM_GEMM_XS_TILE == 64 && GVM_GROUP_SMEM % 1024 == 0, "the staged pass: wgmma m64n64, 1024-byte aligned stages");

// The cp.async pipeline of the staged paths (bf16 and f32): NS buffers of
// `bytes` from stage0; stage(k, buf) starts copying stage k into buf. Before
// stage kc is read, every thread waits for it and passes a group barrier,
// after which the buffer that stage kc - 1 used is free: stage kc + NS - 1
// goes there. One commit group per stage, empty past nk, so that waiting for
// all but NS - 2 groups always means stage kc.
template <int NS, class Stage>
__device__ __forceinline__ void gvm_stages_begin(int nk, unsigned stage0, unsigned bytes, const Stage& stage) {
#pragma unroll
    for (int s = 0; s < NS - 1; ++s) {
        if (s < nk) stage(s, stage0 + s * bytes);
        gvm_cp_async_commit();
    }
}

// ASYNC: the stage is read by wgmma (the async proxy), so each thread fences
// its copies for it before the barrier.
template <int NS, bool ASYNC = false, class Stage>
__device__ __forceinline__ unsigned gvm_stages_next(const gvm_ctx& c, int kc, int nk, unsigned stage0, unsigned bytes,
                                                    const Stage& stage) {
    gvm_cp_async_wait<NS - 2>();
    if (ASYNC) gvm_fence_async_smem();
    gvm_group_sync(c);
    const int kn = kc + NS - 1;
    if (kn < nk) stage(kn, stage0 + (kn % NS) * bytes);
    gvm_cp_async_commit();
    return stage0 + (kc % NS) * bytes;
}

// Starts copying stage kc (k in [64 kc, 64 kc + 64)) of W rows [0, nr) past
// wt (M halves of 64) and x tokens [0, nt) past xt into the stage at `buf`
// (the halves, then x); the rest is zeros.
template <int M>
__device__ __forceinline__ void gvm_gemm_xs_stage(unsigned buf, const char* wt, long long w_row, int nr,
                                                  const char* xt, long long x_row, int nt, int kc, unsigned tid,
                                                  unsigned long long pol) {
    const int ch = (int)(tid & 7u), r0 = (int)(tid >> 3);
#pragma unroll
    for (int i = 0; i < GVM_GEMM_XS_TILE / 16; ++i) {
        const int r = r0 + 16 * i;
#pragma unroll
        for (int h = 0; h < M; ++h) {
            const int rh = r + GVM_GEMM_XS_TILE * h;
            gvm_cp_async16(gvm_wgmma_at(buf + h * GVM_GEMM_XS_HALF, r, ch),
                           wt + (long long)(rh < nr ? rh : 0) * w_row + kc * 128 + ch * 16, rh < nr, pol);
        }
        gvm_cp_async16(gvm_wgmma_at(buf + M * GVM_GEMM_XS_HALF, r, ch),
                       xt + (long long)(r < nt ? r : 0) * x_row + kc * 128 + ch * 16, r < nt, pol);
    }
}

// One pass: W rows [0, nr) past wt (nr <= 64 M) x tokens [0, nt) past xt
// (nt <= 64), all of K (a multiple of 64); out's (token 0, row 0) at `ot`.
// M warpgroup MMAs (m64n64k16) a k16 step, one a row half, on the same x:
// the group's 4 warps are a warpgroup (its first warp a multiple of 4) and
// the stages are in wgmma's 128-byte swizzle, so the tensor cores read W and
// x from shared memory once a step (each warp's ldmatrix + mma.sync read
// twice that, session 22). The MMAs of a stage are waited for before the
// next barrier, after which its buffer is refilled.
template <int M>
__device__ __forceinline__ void gvm_gemm_xs_pass(const gvm_ctx& c, const gvm_tensor& out, long long ot,
                                                 const char* wt, long long w_row, int nr, const char* xt,
                                                 long long x_row, int nt, int K, unsigned long long pol) {
    constexpr unsigned BYTES = (M + 1) * GVM_GEMM_XS_HALF;
    constexpr int NS = M == 1 ? GVM_GEMM_XS_STAGES : GVM_GEMM_XS_NS(BYTES);
    const unsigned tid = gvm_opaque(c.tid);
    const unsigned stage0 = gvm_smem_addr(c.smem);
    const int nk = K / 64;
    float acc[M][32];
#pragma unroll
    for (int h = 0; h < M; ++h)
#pragma unroll
        for (int i = 0; i < 32; ++i) acc[h][i] = 0.f;
    const auto stage = [&](int k, unsigned buf) { gvm_gemm_xs_stage<M>(buf, wt, w_row, nr, xt, x_row, nt, k, tid, pol); };
    gvm_stages_begin<NS>(nk, stage0, BYTES, stage);
#pragma unroll 1
    for (int kc = 0; kc < nk; ++kc) {
        const unsigned sw = gvm_stages_next<NS, true>(c, kc, nk, stage0, BYTES, stage);
        const unsigned long long db = gvm_wgmma_desc(sw + M * GVM_GEMM_XS_HALF);
        gvm_wgmma_fence();
#pragma unroll
        for (int s = 0; s < 4; ++s)  // + 32 bytes a k16 step
#pragma unroll
            for (int h = 0; h < M; ++h) gvm_wgmma_bf16_n64(acc[h], gvm_wgmma_desc(sw + h * GVM_GEMM_XS_HALF) + 2 * s, db + 2 * s);
        gvm_wgmma_commit();
        gvm_wgmma_wait<0>();
    }
    gvm_cp_async_wait<0>();
    gvm_group_sync(c);  // every warp is done with the stages before the next pass refills them
    const int row0 = 16 * (int)(tid >> 5) + (int)((tid & 31u) >> 2), tok0 = 2 * (int)(tid & 3u);
    const gvm_view dst = gvm_view_of(out);
#pragma unroll
    for (int h = 0; h < M; ++h)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int row = GVM_GEMM_XS_TILE * h + row0 + 8 * (i >> 1), tok = tok0 + 8 * j + (i & 1);
                if (row < nr && tok < nt) gvm_gemm_store(dst, ot + (long long)tok * dst.s0 + row, acc[h][4 * j + i]);
            }
}

// K part j of P (a5 P > 1: the sums go to the parts tensor t3 [T, P*N] f32,
// its block of columns j*N + n, instead of out): K/P of the k's from j*K/P on.
// P, j and the parts tensor are read from the instruction at each pass, not
// held through the loops (the GVM_GEMM_TT=2 build and the one-op kernel
// spilled them).
__device__ __forceinline__ int gvm_gemm_xs(const gvm_ctx& c, const gvm_tensor& out, const gvm_tensor& x,
                                           const gvm_tensor& w, int n0, int cnt, int t0, int tn) {
    // normal, not evict-first: the token spans of a row tile read W at about the same time
    const unsigned long long pol = gvm_policy_evict_normal();
    const long long x_row = x.stride[0] * 2, w_row = w.stride[0] * 2;
    if (gvm_smem_addr(c.smem) & 1023u) return GVM_ERR_BAD_ARGS;  // wgmma's swizzle needs 1024-byte stages
    int step = GVM_GEMM_XS_TILE;
#pragma unroll 1
    for (int r0 = n0; r0 < n0 + cnt; r0 += step) {
        const bool two = GVM_GEMM_XS_M2 && n0 + cnt - r0 > GVM_GEMM_XS_TILE &&
                         c.smem_bytes >= GVM_GEMM_XS_NS(3 * GVM_GEMM_XS_HALF) * 3 * GVM_GEMM_XS_HALF;
        step = two ? 2 * GVM_GEMM_XS_TILE : GVM_GEMM_XS_TILE;
        const int nr = n0 + cnt - r0 < step ? n0 + cnt - r0 : step;
#pragma unroll 1
        for (int tp = t0; tp < t0 + tn; tp += GVM_GEMM_XS_TILE) {
            const int nt = t0 + tn - tp < GVM_GEMM_XS_TILE ? t0 + tn - tp : GVM_GEMM_XS_TILE;
            const volatile int* a = c.ins->arg;
            const int P = a[5] > 1 ? a[5] : 1, j = P > 1 ? a[6] : 0, K = x.shape[1] / P;
            const gvm_tensor& o = P > 1 ? gvm_t(c, 3) : out;
            const long long kb = 2ll * j * K, ot = (long long)tp * o.stride[0] + (long long)j * w.shape[0] + r0;
            const char* wt = reinterpret_cast<const char*>(w.ptr) + r0 * w_row + kb;
            const char* xt = reinterpret_cast<const char*>(x.ptr) + tp * x_row + kb;
            if (two)
                gvm_gemm_xs_pass<2>(c, o, ot, wt, w_row, nr, xt, x_row, nt, K, pol);
            else
                gvm_gemm_xs_pass<1>(c, o, ot, wt, w_row, nr, xt, x_row, nt, K, pol);
        }
    }
    return GVM_ERR_NONE;
}

// Tokens [ta, ta + tn): staged (above) from GVM_GEMM_XS_MIN tokens when K
// is a multiple of 64 and the scratch holds the stages, else token tiles of 8.
__device__ __forceinline__ bool gvm_gemm_bf16_staged(const gvm_ctx& c, const gvm_tensor& x, int tn) {
    return GVM_GEMM_XS_MIN > 0 && tn >= GVM_GEMM_XS_MIN && x.shape[1] % 64 == 0 &&
           c.smem_bytes >= GVM_GEMM_XS_STAGES * GVM_GEMM_XS_STAGE_BYTES;
}

// K parts only staged (gvm_op_gemm checks).
__device__ __forceinline__ int gvm_gemm_bf16(const gvm_ctx& c, const gvm_tensor& out, const gvm_tensor& x,
                                             const gvm_tensor& w, int n0, int cnt, int ta, int tn) {
    if (gvm_gemm_bf16_staged(c, x, tn)) return gvm_gemm_xs(c, out, x, w, n0, cnt, ta, tn);
    const int T = ta + tn;  // the token tiles' end: tokens past it read token T - 1 and are not stored
    int t0 = ta;
#if GVM_GEMM_TT > 1
    for (; t0 + 8 < T; t0 += 8 * GVM_GEMM_TT) {  // more than one tile left: TT tiles a pass
        const int rc = gvm_gemm_bf16_tiles<GVM_GEMM_TT, GVM_GEMM_TT_STEPS>(c, out, x, w, n0, cnt, t0, T);
        if (rc != GVM_ERR_NONE) return rc;
    }
#endif
#pragma unroll 1
    for (; t0 < T; t0 += 8) {
        const int rc = gvm_gemm_bf16_tiles<1, GVM_GEMM_STEPS>(c, out, x, w, n0, cnt, t0, T);
        if (rc != GVM_ERR_NONE) return rc;
    }
    return GVM_ERR_NONE;
}

__device__ __forceinline__ float4 gvm_gemm_f4(uint4 v) {
    return make_float4(__uint_as_float(v.x), __uint_as_float(v.y), __uint_as_float(v.z), __uint_as_float(v.w));
}

// f32 tiles: registers of loads in flight plus accumulators (the 2-group
// kernel spills at 112 under NVRTC 13.5 and 13.0, 104 still fits), and the
// most float4 of W in flight per thread.
#ifndef GVM_GEMM_F32_REGS
#if GVM_MAX_GROUPS <= 2
#define GVM_GEMM_F32_REGS 96
#else
#define GVM_GEMM_F32_REGS 64
#endif
#endif
#ifndef GVM_GEMM_F32_W
#if GVM_MAX_GROUPS <= 2
#define GVM_GEMM_F32_W 16
#else
#define GVM_GEMM_F32_W 8
#endif
#endif
#ifndef GVM_GEMM_F32_RT  // rows per tile at T = 1, at most (8, 4, 2 or 1)
#if GVM_MAX_GROUPS <= 2
#define GVM_GEMM_F32_RT 8
#else
#define GVM_GEMM_F32_RT 4
#endif
#endif
// Tokens x rows per tile when T > 1: the router's instructions have 2 rows, so
// 2 x 8 wastes none (measured: 256-token layer 5.0 -> 4.8 ms); the 4-group
// kernel's 64 registers of f32 tile spill at 2 x 8 and keep 4 x 4.
#ifndef GVM_GEMM_F32_TT
#define GVM_GEMM_F32_TT (GVM_MAX_GROUPS <= 2 ? 8 : 4)
#endif
#ifndef GVM_GEMM_F32_RN
#define GVM_GEMM_F32_RN (GVM_MAX_GROUPS <= 2 ? 2 : 4)
#endif

// Steps in flight S of an RT x TT tile: S * (RT + TT) float4 plus RT * TT
// accumulators within GVM_GEMM_F32_REGS, S * RT within GVM_GEMM_F32_W.
// T = 1: RT 1, 2, 4, 8 -> S 11, 7, 4, 2 (2 groups); RT 1, 2, 4 -> S 7, 4, 2
// (4 groups: 72 spills in the core 4-group kernel with tracing).
// T > 1: 2 x 8 -> S 2 (2 groups); 4 x 4 -> S 1 (4 groups).
template <int RT, int TT>
struct gvm_gemm_f32_steps {
    static constexpr int by_regs = (GVM_GEMM_F32_REGS - RT * TT) / (4 * (RT + TT));
    static constexpr int by_w = GVM_GEMM_F32_W / RT;
    static constexpr int fit = by_regs < by_w ? by_regs : by_w;
    static constexpr int value = fit < 1 ? 1 : fit;
};

// The loads of step U of a batch (chunk tid + 128 U past the row pointers: a
// constant offset): W of RT rows, x of the first tt of TT tokens (zero past tt).
template <int U, int RT, int TT>
__device__ __forceinline__ void gvm_gemm_f32_load(float4 (&w)[RT], float4 (&x)[TT], const char* pw, unsigned w_row,
                                                  int rv, const char* px, unsigned x_row, int tt,
                                                  unsigned long long pol) {
#pragma unroll
    for (int r = 0; r < RT; ++r) w[r] = gvm_gemm_f4(gvm_gemm_ld_w16<2048 * U>(pw + (r < rv ? r : 0) * w_row, pol));
#pragma unroll
    for (int t = 0; t < TT; ++t)
        x[t] = t < tt ? gvm_gemm_f4(gvm_gemm_ld_x16<2048 * U>(px + t * x_row)) : make_float4(0.f, 0.f, 0.f, 0.f);
}

// Steps U..S-1 of a batch, one instance per U (the slots' indices and the
// load offsets stay constants). A step is in K while 128 U < left (chunks of
// this thread from the batch's start on).
template <int U, int S, int RT, int TT>
struct gvm_gemm_f32_steps_from {
    // The first batch's loads.
    __device__ __forceinline__ static void load(float4 (&W)[S][RT], float4 (&X)[S][TT], const char* pw, unsigned w_row,
                                                int rv, const char* px, unsigned x_row, int tt, int left,
                                                unsigned long long pol) {
        if (128 * U < left) gvm_gemm_f32_load<U>(W[U], X[U], pw, w_row, rv, px, x_row, tt, pol);
        gvm_gemm_f32_steps_from<U + 1, S, RT, TT>::load(W, X, pw, w_row, rv, px, x_row, tt, left, pol);
    }
    // Step U of the previous batch (done: its left) into the accumulators,
    // then its registers refilled with step U of this one.
    __device__ __forceinline__ static void roll(float (&acc)[RT * TT], float4 (&W)[S][RT], float4 (&X)[S][TT],
                                                const char* pw, unsigned w_row, int rv, const char* px, unsigned x_row,
                                                int tt, int done, int left, unsigned long long pol) {
        if (128 * U < done) {
#pragma unroll
            for (int r = 0; r < RT; ++r) {
#pragma unroll
                for (int t = 0; t < TT; ++t) {
                    float a = acc[r * TT + t];
                    a = fmaf(W[U][r].x, X[U][t].x, a);
                    a = fmaf(W[U][r].y, X[U][t].y, a);
                    a = fmaf(W[U][r].z, X[U][t].z, a);
                    a = fmaf(W[U][r].w, X[U][t].w, a);
                    acc[r * TT + t] = a;
                }
            }
        }
        if (128 * U < left) gvm_gemm_f32_load<U>(W[U], X[U], pw, w_row, rv, px, x_row, tt, pol);
        gvm_gemm_f32_steps_from<U + 1, S, RT, TT>::roll(acc, W, X, pw, w_row, rv, px, x_row, tt, done, left, pol);
    }
};
template <int S, int RT, int TT>
struct gvm_gemm_f32_steps_from<S, S, RT, TT> {
    __device__ __forceinline__ static void load(float4 (&)[S][RT], float4 (&)[S][TT], const char*, unsigned, int,
                                                const char*, unsigned, int, int, unsigned long long) {}
    __device__ __forceinline__ static void roll(float (&)[RT * TT], float4 (&)[S][RT], float4 (&)[S][TT], const char*,
                                                unsigned, int, const char*, unsigned, int, int, int,
                                                unsigned long long) {}
};

// One tile: rows [r0, r0 + rv) x tokens [t0, t0 + tt) (rv <= RT, tt <= TT;
// the rows past rv re-read row r0, the tokens past tt are not loaded, and
// neither is stored) over all of K (n4 chunks of 4 floats). buf: the half of
// the scratch the reduction goes through.
template <int RT, int TT>
__device__ __forceinline__ void gvm_gemm_f32_tile(const gvm_ctx& c, unsigned tid, float* ob, long long o_row,
                                                  const float* xb, long long x_row, const float* wb, long long w_row,
                                                  int r0, int rv, int t0, int tt, int n4, unsigned buf,
                                                  unsigned long long pol) {
    constexpr int S = gvm_gemm_f32_steps<RT, TT>::value;
    constexpr int V = RT * TT;  // sums of the tile
    constexpr int L = V >= 32 ? 5 : V >= 16 ? 4 : V >= 8 ? 3 : V >= 4 ? 2 : V >= 2 ? 1 : 0;
    static_assert(V == 1 << L, "RT * TT: a power of two up to 32");
    using steps = gvm_gemm_f32_steps_from<0, S, RT, TT>;
    // Row r of the tile at pw + r * w_row bytes (rows past rv: r0's), token t at px + t * x_row.
    const char* pw = reinterpret_cast<const char*>(wb + (long long)r0 * w_row + 4 * tid);
    const char* px = reinterpret_cast<const char*>(xb + (long long)t0 * x_row + 4 * tid);
    const unsigned wr = (unsigned)(w_row * 4), xr = (unsigned)(x_row * 4);
    float acc[V];
#pragma unroll
    for (int v = 0; v < V; ++v) acc[v] = 0.f;
    // Set before the loads that may skip them: a register left unset would
    // stay live around the persistent kernel's loop.
    float4 W[S][RT], X[S][TT];
#pragma unroll
    for (int u = 0; u < S; ++u) {
#pragma unroll
        for (int r = 0; r < RT; ++r) W[u][r] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int t = 0; t < TT; ++t) X[u][t] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    int left = n4 - (int)tid;
    steps::load(W, X, pw, wr, rv, px, xr, tt, left, pol);
    const int n_batches = (n4 + 128 * S - 1) / (128 * S);
#pragma unroll 1
    for (int b = 0; b < n_batches; ++b) {
        pw += 2048 * S;
        px += 2048 * S;
        steps::roll(acc, W, X, pw, wr, rv, px, xr, tt, left, left - 128 * S, pol);
        left -= 128 * S;
    }
    // Butterfly: at each level a lane keeps half of its sums (the upper half
    // where its lane bit is set) and adds its partner's copy of that half;
    // after L levels lane l holds sum l >> (5 - L), the remaining levels add
    // it up over the warp.
    const unsigned lane = tid & 31u;
#pragma unroll
    for (int l = 0; l < L; ++l) {
        const int off = 16 >> l, h = V >> (l + 1);
        const bool up = (lane & off) != 0;
#pragma unroll
        for (int i = 0; i < (V > 1 ? V / 2 : 1); ++i) {  // a constant trip count: constant indices
            if (i < h) {
                const float send = up ? acc[i] : acc[i + h];
                const float keep = up ? acc[i + h] : acc[i];
                acc[i] = keep + __shfl_xor_sync(0xffffffffu, send, off);
            }
        }
    }
#pragma unroll
    for (int off = 16 >> L; off > 0; off >>= 1) acc[0] += __shfl_xor_sync(0xffffffffu, acc[0], off);
    // The 4 warps' sums through the scratch ([warp][lane]: every lane stores,
    // sum v is in lane v << (5 - L)), added in warp order. Two buffers, used
    // in turn: the next tile's barrier orders these reads before the buffer
    // is written again.
    const unsigned part = gvm_smem_addr(c.smem) + (buf & 1u) * (GVM_GROUP_THREADS * 4);
    gvm_sts(part + tid * 4, acc[0]);
    gvm_group_sync(c);
    if (tid < (unsigned)V && (int)tid % TT < tt && (int)tid / TT < rv) {
        const unsigned at = part + (tid << (5 - L)) * 4;
        float sum = gvm_lds_f(at);
#pragma unroll
        for (int w = 1; w < 4; ++w) sum += gvm_lds_f(at + w * 32 * 4);
        ob[(long long)(t0 + (int)tid % TT) * o_row + r0 + (int)tid / TT] = sum;
    }
}

// ---- f32 at many tokens (the router): W and x staged in shared memory ------------------
// The register tiles above (RN rows x TT tokens a call) read each row of W
// once per 8 tokens and each token of x once per 2 rows, all from L2: the
// 256-token router read ~1 GB in 430 us, beside a squeeze GEMM of 166. Here a
// pass covers 32 rows x 64 tokens, each stage 32 k of both (4 + 8 KB, 128
// bytes a row) by cp.async, GVM_GEMM_F32_XS_STAGES deep, and the tensor cores
// take the products as three tf32 MMAs (m16n8k8) of the operands' split
// v = hi + lo (hi: v's top 19 bits, lo = v - hi, exact; lo's own low bits
// the MMA drops): lo*hi + hi*lo + hi*hi, the lo*lo term (2^-22 of the
// product) left out, so each product is good to about 2^-21 rather than
// f32's 2^-24 (CUDA-core FMAs ran the 256-token router's 128 K parts 98 us
// beside the squeeze: H200, 71d0283 traces). Warp w takes all 32 rows x
// tokens 16 w .. + 15. A k8 MMA takes chunks 2 kk and 2 kk + 1 of the stage's
// rows (k 0-3 and 4-7 of its fragments), each operand's fragments loaded by
// ldmatrix as they lie: with a 16-byte load a row, ptxas spent ~124 moves a
// stage assembling the A quads from two rows' loads (363 instructions a stage,
// session 64). Chunk c of a row r of either operand sits at c ^ (r & 7), so
// the 8 rows of an ldmatrix matrix hit 8 bank groups. The MMA ignores a tf32
// operand's low 13 bits, so the raw value serves as its hi part. Each output
// is a stage's partial sum added to the total
// (blocked: rounding grows with the 256 stages, not the 8192 terms) in a fixed
// order, so the result does not depend on the schedule.
#ifndef GVM_GEMM_F32_XS_MIN  // tokens from which the f32 path stages (0: never; the 4-group kernel has no registers for it)
#define GVM_GEMM_F32_XS_MIN (GVM_MAX_GROUPS <= 2 ? 32 : 0)  // half a pass of tokens: the router from 32 (lowering.py)
#endif
#define GVM_F32XS_ROWS 32
#define GVM_F32XS_TOK 64
#define GVM_F32XS_W_BYTES (GVM_F32XS_ROWS * 128)
#define GVM_F32XS_STAGE_BYTES (GVM_F32XS_W_BYTES + GVM_F32XS_TOK * 128)
#ifndef GVM_GEMM_F32_XS_STAGES  // as many as the group's scratch holds, up to 6
#define GVM_GEMM_F32_XS_STAGES (GVM_GROUP_SMEM / GVM_F32XS_STAGE_BYTES < 6 ? GVM_GROUP_SMEM / GVM_F32XS_STAGE_BYTES : 6)
#endif
static_assert(GVM_GEMM_F32_XS_STAGES >= 2, "GVM_GEMM_F32_XS_STAGES: a stage in use and one landing");

// Shared address of 16-byte chunk ch of row r (a W row or an x token) of an operand at base.
__device__ __forceinline__ unsigned gvm_f32xs_at(unsigned base, int r, int ch) {
    return base + (unsigned)r * 128u + ((unsigned)(ch ^ (r & 7)) << 4);
}

// Starts copying stage kc (k in [32 kc, 32 kc + 32)) of W rows [0, nr) past
// wb and x tokens [0, nt) past xb into `stage`; the rest is zeros.
__device__ __forceinline__ void gvm_f32xs_stage(unsigned stage, const char* wb, long long w_row, int nr, const char* xb,
                                                long long x_row, int nt, int kc, unsigned tid,
                                                unsigned long long pol) {
    const int ch = (int)(tid & 7u), r0 = (int)(tid >> 3);
#pragma unroll
    for (int i = 0; i < GVM_F32XS_ROWS / 16; ++i) {
        const int r = r0 + 16 * i;
        gvm_cp_async16(gvm_f32xs_at(stage, r, ch), wb + (long long)(r < nr ? r : 0) * w_row + kc * 128 + ch * 16, r < nr,
                       pol);
    }
#pragma unroll
    for (int i = 0; i < GVM_F32XS_TOK / 16; ++i) {
        const int t = r0 + 16 * i;
        gvm_cp_async16(gvm_f32xs_at(stage + GVM_F32XS_W_BYTES, t, ch), xb + (long long)(t < nt ? t : 0) * x_row + kc * 128 + ch * 16,
                       t < nt, pol);
    }
}

// lo = v - hi for a 3xTF32 product, hi being v's top 19 bits (exact): the
// MMA reads v itself as hi (it ignores a tf32 operand's low 13 bits).
__device__ __forceinline__ unsigned gvm_tf32_lo(unsigned v) {
    return __float_as_uint(__uint_as_float(v) - __uint_as_float(v & 0xffffe000u));
}
__device__ __forceinline__ uint4 gvm_tf32_lo4(uint4 v) {
    return make_uint4(gvm_tf32_lo(v.x), gvm_tf32_lo(v.y), gvm_tf32_lo(v.z), gvm_tf32_lo(v.w));
}

// One pass: W rows [0, nr) past wb x tokens [0, nt) past xb, all of K (n4
// float4s, a multiple of 8); out's (token 0, row 0) at ob.
__device__ __forceinline__ void gvm_f32xs_pass(const gvm_ctx& c, float* ob, long long o_row, const char* wb,
                                               long long w_row, int nr, const char* xb, long long x_row, int nt,
                                               int n4, unsigned long long pol) {
    constexpr int NS = GVM_GEMM_F32_XS_STAGES;
    const unsigned tid = gvm_opaque(c.tid);  // not hoisted out of the persistent loop (registers)
    const int lane = (int)(tid & 31u), g = lane >> 2, t4 = lane & 3, tok0 = 16 * (int)(tid >> 5);
    const unsigned stage0 = gvm_smem_addr(c.smem);
    const int nk = n4 / 8;
    float tot[2][2][4];  // [m-tile: rows 16 m ..][n-tile: tokens tok0 + 8 n ..][fragment]
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int n = 0; n < 2; ++n) tot[m][n][0] = tot[m][n][1] = tot[m][n][2] = tot[m][n][3] = 0.f;
    const auto stage = [&](int k, unsigned buf) { gvm_f32xs_stage(buf, wb, w_row, nr, xb, x_row, nt, k, tid, pol); };
    gvm_stages_begin<NS>(nk, stage0, GVM_F32XS_STAGE_BYTES, stage);
#pragma unroll 1
    for (int kc = 0; kc < nk; ++kc) {
        const unsigned sw = gvm_stages_next<NS>(c, kc, nk, stage0, GVM_F32XS_STAGE_BYTES, stage);
        const unsigned sx = sw + GVM_F32XS_W_BYTES;
        float part[2][2][4];
#pragma unroll
        for (int m = 0; m < 2; ++m)
#pragma unroll
            for (int n = 0; n < 2; ++n) part[m][n][0] = part[m][n][1] = part[m][n][2] = part[m][n][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {  // the stage's four k8 MMAs: chunks 2 kk, 2 kk + 1
            // lane l's row for ldmatrix: matrix j = l / 8, row l % 8. W (A quads of m-tile m):
            // rows 16 m + 8 (j & 1) .., chunk 2 kk + j / 2; x (B pairs of tokens tok0 + 8 n):
            // tokens tok0 + 8 (j / 2) .., chunk 2 kk + (j & 1)
            const int j = lane >> 3, r = lane & 7;
            uint4 ah[2], al[2], bh, bl;  // ah: rows g, g + 8 at k t4, t4 + 4; bh: (b0, b1) of tokens 8 n + g
#pragma unroll
            for (int m = 0; m < 2; ++m) {
                ah[m] = gvm_ldsm_x4(gvm_f32xs_at(sw, 16 * m + 8 * (j & 1) + r, 2 * kk + (j >> 1)));
                al[m] = gvm_tf32_lo4(ah[m]);
            }
            bh = gvm_ldsm_x4(gvm_f32xs_at(sx, tok0 + 8 * (j >> 1) + r, 2 * kk + (j & 1)));
            bl = gvm_tf32_lo4(bh);
#pragma unroll
            for (int m = 0; m < 2; ++m)
#pragma unroll
                for (int n = 0; n < 2; ++n) {
                    const unsigned bh0 = n ? bh.z : bh.x, bh1 = n ? bh.w : bh.y, bl0 = n ? bl.z : bl.x, bl1 = n ? bl.w : bl.y;
                    gvm_mma_tf32(part[m][n], al[m].x, al[m].y, al[m].z, al[m].w, bh0, bh1);
                    gvm_mma_tf32(part[m][n], ah[m].x, ah[m].y, ah[m].z, ah[m].w, bl0, bl1);
                    gvm_mma_tf32(part[m][n], ah[m].x, ah[m].y, ah[m].z, ah[m].w, bh0, bh1);
                }
        }
#pragma unroll
        for (int m = 0; m < 2; ++m)
#pragma unroll
            for (int n = 0; n < 2; ++n)
#pragma unroll
                for (int i = 0; i < 4; ++i) tot[m][n][i] += part[m][n][i];
    }
    gvm_cp_async_wait<0>();
    gvm_group_sync(c);  // every thread is done with the stages before the next pass refills them
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int row = 16 * m + g + 8 * (i >> 1), tok = tok0 + 8 * n + 2 * t4 + (i & 1);
                if (row < nr && tok < nt) ob[(long long)tok * o_row + row] = tot[m][n][i];
            }
}

__device__ __forceinline__ void gvm_gemm_f32_xs(const gvm_ctx& c, float* ob, long long o_row, const float* xb,
                                                long long x_row, const float* wb, long long w_row, int n0, int cnt,
                                                int T, int n4, unsigned long long pol) {
#pragma unroll 1
    for (int r0 = n0; r0 < n0 + cnt; r0 += GVM_F32XS_ROWS) {
        const int nr = n0 + cnt - r0 < GVM_F32XS_ROWS ? n0 + cnt - r0 : GVM_F32XS_ROWS;
#pragma unroll 1
        for (int tp = 0; tp < T; tp += GVM_F32XS_TOK) {
            const int nt = T - tp < GVM_F32XS_TOK ? T - tp : GVM_F32XS_TOK;
            gvm_f32xs_pass(c, ob + tp * o_row + r0, o_row, reinterpret_cast<const char*>(wb + r0 * w_row), w_row * 4,
                           nr, reinterpret_cast<const char*>(xb + tp * x_row), x_row * 4, nt, n4, pol);
        }
    }
}

// Tokens [ta, ta + T) of x and out; K part j of P (isa/gvm_isa.h): the part's
// k range is a pointer offset into x and W, its sums go to out's column block j.
__device__ __forceinline__ int gvm_gemm_f32(const gvm_ctx& c, const gvm_tensor& out, const gvm_tensor& x,
                                            const gvm_tensor& w, int n0, int cnt, int ta, int T, int P, int j) {
    const int kp = x.shape[1] / P, n4 = kp / 4;
    // Row offsets inside a tile are 32-bit byte counts: rows of up to 256 MB.
    if (c.smem_bytes < 2 * GVM_GROUP_THREADS * 4 || w.stride[0] > (1ll << 26) || x.stride[0] > (1ll << 26))
        return GVM_ERR_BAD_ARGS;
    const unsigned long long pol = gvm_policy_evict_first();
    const long long o_row = out.stride[0], x_row = x.stride[0], w_row = w.stride[0];
    const float* xb = reinterpret_cast<const float*>(x.ptr) + ta * x_row + j * kp;
    const float* wb = reinterpret_cast<const float*>(w.ptr) + j * kp;
    float* ob = reinterpret_cast<float*>(out.ptr) + ta * o_row + j * w.shape[0];
    // What the tiles derive from the thread index (addresses, lane masks) is
    // computed here rather than hoisted out of the persistent kernel's loop,
    // where it would hold registers all along.
    const unsigned tid = gvm_opaque(c.tid);
    const int end = n0 + cnt;
    // staged: full passes of rows only (a few rows a tile, as the router has
    // below Tiles.router_span tokens, keep the register tiles: H200, a7cea4d,
    // 2-row tiles staged ran the 128-token layer full-c16-t8 2388 us, in
    // registers 1838)
    if (GVM_GEMM_F32_XS_MIN > 0 && T >= GVM_GEMM_F32_XS_MIN && cnt >= GVM_F32XS_ROWS && n4 % 8 == 0 &&
        c.smem_bytes >= GVM_GEMM_F32_XS_STAGES * GVM_F32XS_STAGE_BYTES) {
        // normal, not evict-first: the token spans of a row tile read W at about the same time
        gvm_gemm_f32_xs(c, ob, o_row, xb, x_row, wb, w_row, n0, cnt, T, n4, gvm_policy_evict_normal());
        return GVM_ERR_NONE;
    }
    if (T == 1) {  // W is the whole cost: tiles of GVM_GEMM_F32_RT rows, the rest in 4, 2, 1 (none partial)
        constexpr int RT = GVM_GEMM_F32_RT;
        unsigned buf = 0;
        int r = n0;
#pragma unroll 1
        for (; r + RT <= end; r += RT, ++buf)
            gvm_gemm_f32_tile<RT, 1>(c, tid, ob, o_row, xb, x_row, wb, w_row, r, RT, 0, 1, n4, buf, pol);
        if (RT > 4 && (cnt & 4)) {
            gvm_gemm_f32_tile<4, 1>(c, tid, ob, o_row, xb, x_row, wb, w_row, r, 4, 0, 1, n4, buf++, pol);
            r += 4;
        }
        if (RT > 2 && (cnt & 2)) {
            gvm_gemm_f32_tile<2, 1>(c, tid, ob, o_row, xb, x_row, wb, w_row, r, 2, 0, 1, n4, buf++, pol);
            r += 2;
        }
        if (RT > 1 && (cnt & 1))
            gvm_gemm_f32_tile<1, 1>(c, tid, ob, o_row, xb, x_row, wb, w_row, r, 1, 0, 1, n4, buf, pol);
        return GVM_ERR_NONE;
    }
    // T > 1: tiles of RN rows (the last one partial) x TT tokens, one per call
    // (GVM_AGAIN), the token tiles of a row tile in a row (its W from L2).
    constexpr int RN = GVM_GEMM_F32_RN, TT = GVM_GEMM_F32_TT;
    const unsigned n_tok = (unsigned)((T + TT - 1) / TT), k = c.again;
    const int r = n0 + RN * (int)(k / n_tok), t0 = TT * (int)(k % n_tok);
    gvm_gemm_f32_tile<RN, TT>(c, tid, ob, o_row, xb, x_row, wb, w_row, r, end - r < RN ? end - r : RN, t0,
                              T - t0 < TT ? T - t0 : TT, n4, k, pol);
    return r + RN < end || t0 + TT < T ? GVM_AGAIN : GVM_ERR_NONE;
}

// ---- K parts (a5 P > 1: t3 parts, t4 tickets, a6 part, a7 ticket) ---------------------
__device__ __forceinline__ bool gvm_gemm_parts_ok(const gvm_ctx& c, int P, int j, int T, int N, int K) {
    const gvm_tensor& pt = gvm_t(c, 3);
    const gvm_tensor& tk = gvm_t(c, 4);
    const int m = c.ins->arg[7];
    return gvm_has(c, 3) & gvm_has(c, 4) & (P <= GVM_GEMM_MAX_PARTS) & ((P & (P - 1)) == 0) & (j >= 0) & (j < P) &
           (K % (8 * P) == 0) & gvm_is(pt, GVM_DT_F32, 2) & (pt.shape[0] == T) & (pt.shape[1] == P * N) &
           (pt.stride[1] == 1) & gvm_aligned(pt, 4, 16) & gvm_is(tk, GVM_DT_I32, 1) & (m >= 0) & (m < tk.shape[0]);
}

// After part j's sums are in parts: the tile's ticket; its last part (the one
// that brings the ticket to a multiple of P) adds the P parts in part order,
// so the sums do not depend on which part finishes last.
//
// Timing probe (GVM_GEMM_PARTS_PROBE; the tiles' outputs are zeros: for traces
// only, NOTES.md sessions 62-63). 1: the last part stores zeros without
// reading the parts (the ticket as ever); 2: no ticket either, every part
// stores the zeros.
#ifndef GVM_GEMM_PARTS_PROBE
#define GVM_GEMM_PARTS_PROBE 0
#endif

// Four sums of adjacent columns at off (a multiple of 4) in one store.
__device__ __forceinline__ void gvm_gemm_store4(const gvm_view& d, long long off, float4 v) {
    if (d.dtype == GVM_DT_BF16)
        *reinterpret_cast<uint2*>(reinterpret_cast<unsigned short*>(d.ptr) + off) = {gvm_pack_bf16x2(v.x, v.y), gvm_pack_bf16x2(v.z, v.w)};
    else
        *reinterpret_cast<float4*>(reinterpret_cast<float*>(d.ptr) + off) = v;
}

// The sum 16 bytes a load (4 columns), 8 loads in flight a thread: a thread's
// quads (every 128th of the tile from its own) times the P parts, in that
// order, 8 at a time, a quad's sum carried over when its parts straddle two
// rounds (P 16). One element a thread a round trip (2 loads in flight) held
// the last part of Wqkvg's 64 x 64 tiles 11.6 us past its other part (32 round
// trips; 3.0 us without the loads, GVM_GEMM_PARTS_PROBE 1); this sum, 6.9 us
// (H100 traces, session 63). 16 loads in flight spilled.
__device__ __forceinline__ void gvm_gemm_parts_sum4(const gvm_view& dst, const float* pb, long long p_row, int P, int N,
                                                    int n0, int cnt, int t0, int tn, int tid) {
    constexpr int S = 8;
    const int lg = __ffs(P) - 1, c4 = cnt >> 2, total = tn * c4;
    const int loads = tid < total ? ((total - 1 - tid) / GVM_GROUP_THREADS + 1) << lg : 0;  // quads x parts
    float4 s = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 1
    for (int f0 = 0; f0 < loads; f0 += S) {
        uint4 v[S];
#pragma unroll
        for (int k = 0; k < S; ++k) {  // past the thread's last: a repeat of its first, not added
            const int f = f0 + k < loads ? f0 + k : 0, g = tid + (f >> lg) * GVM_GROUP_THREADS, t = g / c4;
            v[k] = gvm_ld_stream16(pb + (t0 + t) * p_row + n0 + 4 * (g - t * c4) + (f & (P - 1)) * N);
        }
#pragma unroll
        for (int k = 0; k < S; ++k) {
            const int f = f0 + k, p = f & (P - 1), g = tid + (f >> lg) * GVM_GROUP_THREADS;
            const float4 x = {__uint_as_float(v[k].x), __uint_as_float(v[k].y), __uint_as_float(v[k].z), __uint_as_float(v[k].w)};
            s = p == 0 ? x : float4{s.x + x.x, s.y + x.y, s.z + x.z, s.w + x.w};
            if (p == P - 1 && f < loads) {
                const int t = g / c4;
                gvm_gemm_store4(dst, (t0 + t) * dst.s0 + n0 + 4 * (g - t * c4), s);
            }
        }
    }
}

__device__ __forceinline__ void gvm_gemm_parts_sum(const gvm_ctx& c) {
    int n0, cnt, t0, tn;
    gvm_gemm_range(c, n0, cnt, t0, tn);
    const int P = c.ins->arg[5];
    const gvm_tensor& out = gvm_t(c, 0);
    const gvm_tensor& pt = gvm_t(c, 3);
    const unsigned flag = gvm_smem_addr(c.smem);
    gvm_group_sync(c);  // the group's part stores (and its scratch reads) before the ticket
    if (GVM_GEMM_PARTS_PROBE == 2) {
        if (c.tid == 0) gvm_sts(flag, 1u);
    } else if (c.tid == 0) {
        unsigned* tk = gvm_ptr<unsigned>(gvm_t(c, 4), c.ins->arg[7], 4);
        gvm_sts(flag, ((gvm_atom_add_acq_rel(tk, 1u) + 1u) & (unsigned)(P - 1)) == 0u ? 1u : 0u);
    }
    gvm_group_sync(c);
    if (!gvm_lds_u(flag)) return;
    const int N = out.shape[1];
    const long long p_row = pt.stride[0];
    const gvm_view dst = gvm_view_of(out);
    const float* pb = reinterpret_cast<const float*>(pt.ptr);
    // quads: the parts tensor is 16-byte aligned (gvm_gemm_parts_ok); the columns, its rows and the output's too
    if (!GVM_GEMM_PARTS_PROBE && ((n0 | cnt | N | (int)p_row | (int)dst.s0) & 3) == 0 &&
        (reinterpret_cast<unsigned long long>(dst.ptr) & 15ull) == 0) {
        gvm_gemm_parts_sum4(dst, pb, p_row, P, N, n0, cnt, t0, tn, (int)gvm_opaque(c.tid));
        return;
    }
#pragma unroll 1
    for (int i = (int)gvm_opaque(c.tid); i < tn * cnt; i += GVM_GROUP_THREADS) {
        const int t = t0 + i / cnt, n = n0 + i % cnt;
        const float* src = pb + t * p_row + n;
        float v[GVM_GEMM_MAX_PARTS];
#pragma unroll
        for (int p = 0; p < GVM_GEMM_MAX_PARTS; ++p) v[p] = p < P && !GVM_GEMM_PARTS_PROBE ? src[p * N] : 0.f;  // all in flight at once
        float sum = v[0];
#pragma unroll
        for (int p = 1; p < GVM_GEMM_MAX_PARTS; ++p)
            if (p < P) sum += v[p];
        gvm_gemm_store(dst, t * dst.s0 + n, sum);  // f32, or bf16 (a staged bf16 GEMM's parts)
    }
}

__device__ __forceinline__ bool gvm_gemm_operand_ok(const gvm_tensor& t, int esize) {
    return t.ndim == 2 & t.stride[1] == 1 & (t.ptr & 15ull) == 0 & ((t.stride[0] * esize) & 15) == 0;
}

__device__ __forceinline__ int gvm_op_gemm(const gvm_ctx& c) {
    const gvm_instr& in = *c.ins;
    if (in.tensor[0] == GVM_NONE || in.tensor[1] == GVM_NONE || in.tensor[2] == GVM_NONE) return GVM_ERR_BAD_ARGS;
    const gvm_tensor& out = gvm_t(c, 0);
    const gvm_tensor& x = gvm_t(c, 1);
    const gvm_tensor& w = gvm_t(c, 2);
    const int n0 = in.arg[0], cnt = in.arg[1];
#if GVM_MAX_GROUPS <= 2
    const int t0 = in.arg[2], tn = in.arg[3] ? in.arg[3] : x.shape[0];
    const int P = in.arg[5] > 1 ? in.arg[5] : 1, j = in.arg[6];
#else  // the 4-group kernel (dispatch probes) has no register to spare for a range or K parts (it spilled): all
    const int t0 = 0, tn = (in.arg[2] | in.arg[3] | (in.arg[5] > 1)) ? -1 : x.shape[0];
    const int P = 1, j = 0;
#endif
    const bool bf = x.dtype == GVM_DT_BF16 && w.dtype == GVM_DT_BF16 &&
                    (out.dtype == GVM_DT_BF16 || out.dtype == GVM_DT_F32);
    const bool f32 = x.dtype == GVM_DT_F32 && w.dtype == GVM_DT_F32 && out.dtype == GVM_DT_F32;
    const int es = bf ? 2 : 4;
    const bool parts = P > 1;
    const bool stats_ok = parts || (GVM_GEMM_STATS_PROBE & 4) || gvm_gemm_stats_ok(c);
    // bf16 K parts only on the staged path, each part's K a whole number of its 64-k stages
    const bool parts_ok = (in.arg[5] >= 0) &&
                          (parts ? (f32 || (bf && gvm_gemm_bf16_staged(c, x, tn) && (x.shape[1] / P) % 64 == 0)) &&
                                       gvm_gemm_parts_ok(c, P, j, x.shape[0], w.shape[0], x.shape[1])
                                 : (in.arg[6] == 0) & (in.arg[7] == 0));
    if (!(bf | f32) | !stats_ok | !parts_ok | !gvm_gemm_operand_ok(x, es) | !gvm_gemm_operand_ok(w, es) |
        out.ndim != 2 | out.stride[1] != 1 | x.shape[1] % 8 != 0 | w.shape[1] != x.shape[1] |
        out.shape[0] != x.shape[0] | out.shape[1] != w.shape[0] | n0 < 0 | cnt < 0 | n0 + cnt > w.shape[0] |
        t0 < 0 | tn < 0 | t0 + tn > x.shape[0] | (in.arg[3] == 0 && t0 != 0))
        return GVM_ERR_BAD_ARGS;
    if (cnt == 0 || tn == 0) return GVM_ERR_NONE;
    const int rc = bf ? gvm_gemm_bf16(c, out, x, w, n0, cnt, t0, tn)
                      : gvm_gemm_f32(c, parts ? gvm_t(c, 3) : out, x, w, n0, cnt, t0, tn, P, j);
    // read again, not held through the GEMM (the kernel's peak: it spilled)
    if (rc == GVM_ERR_NONE && *reinterpret_cast<volatile const int*>(&c.ins->arg[5]) > 1) {
        gvm_gemm_parts_sum(c);
    } else if (rc == GVM_ERR_NONE && gvm_has(c, 3)) {
        int n0_, cnt_, t0_, tn_;
        gvm_gemm_range(c, n0_, cnt_, t0_, tn_);
        const bool tiles = gvm_t(c, 2).dtype == GVM_DT_BF16 && !gvm_gemm_bf16_staged(c, gvm_t(c, 1), tn_);
        if (!tiles) gvm_gemm_stats(c, t0_, t0_ + tn_);  // the register tiles took theirs
    }
    return rc;
}
