// Attention ops (isa/gvm_isa.h): QK_ROPE_KV, ATTN_CHUNK, ATTN_MERGE.
#pragma once
#include "common.cuh"

// ---- QK_ROPE_KV ---------------------------------------------------------------------
// One warp per 64-wide head vector of a token, lane i owning the RoPE pair
// (2i, 2i+1): the head norm is one warp sum and the rotation needs no exchange.
// A warp loads all its head vectors of a token (up to GVM_QK_BATCH) before it
// uses any, so a token costs one global round trip, not one per head.
// RoPE angles p * 500000^(-2i/64) in f64 (positions reach 82K: an f32 angle there
// is off by up to 4e-3 rad), sin and cos by sincospi, whose range reduction is
// exact and needs no local memory, then rounded to f32, as gpuvm/cpu does.
#define GVM_LOG2_ROPE_BASE 18.931568569324174  // log2(500000)
#define GVM_INV_PI 0.31830988618379067154
#define GVM_QK_BATCH 8  // head vectors per warp loaded before any is used (20 at the shard: 5 per warp)

// pi-scaled angle step of RoPE pair i (inv_freq / pi), and (sin, cos) of position p's angle
__device__ __forceinline__ double gvm_rope_turns(int i) { return exp2(-(double)i * (GVM_LOG2_ROPE_BASE / 32.0)) * GVM_INV_PI; }
__device__ __forceinline__ float2 gvm_rope_sincos(int p, double turns) {
    double sd, cd;
    sincospi((double)p * turns, &sd, &cd);
    return make_float2((float)sd, (float)cd);
}

// Dims (x0, x1) = (2i, 2i + 1) of a head vector: x / rms * (1 + w), then rotated by
// the angle (sc.x = sin, sc.y = cos) when rope: QK_ROPE_KV's and the fused chunks' math.
__device__ __forceinline__ float2 gvm_qk_pair(float x0, float x1, float inv, float w0, float w1, bool rope, float2 sc) {
    x0 = x0 * inv * w0;
    x1 = x1 * inv * w1;
    return rope ? make_float2(x0 * sc.y - x1 * sc.x, x0 * sc.x + x1 * sc.y) : make_float2(x0, x1);
}

__device__ int gvm_op_qk_rope_kv(const gvm_ctx& c) {
    const gvm_tensor& tx = gvm_t(c, 0);
    const gvm_tensor& tq = gvm_t(c, 1);
    const gvm_tensor& twq = gvm_t(c, 2);
    const gvm_tensor& twk = gvm_t(c, 3);
    const gvm_tensor& tk = gvm_t(c, 4);
    const gvm_tensor& tv = gvm_t(c, 5);
    const gvm_tensor& tc = gvm_t(c, 6);
    const int conv = c.ins->arg[0], rope = c.ins->arg[1];
    const float k_scale = gvm_argf(c, 2), v_scale = gvm_argf(c, 3);
    const int nt = tx.shape[0], hq = tq.shape[1], hkv = tk.shape[2], n_conv = tk.shape[0], cache_s = tk.shape[1];
    bool ok = gvm_is(tx, GVM_DT_BF16, 2) & gvm_aligned(tx, 2, 4) & tx.shape[1] == (2 * hq + 2 * hkv) * 64 &
              gvm_is(tq, GVM_DT_BF16, 3) & gvm_aligned(tq, 2, 4) & tq.shape[0] == nt & tq.shape[2] == 64 &
              gvm_is(twq, GVM_DT_F32, 1) & twq.shape[0] == 64 & gvm_is(twk, GVM_DT_F32, 1) & twk.shape[0] == 64 &
              gvm_is(tk, GVM_DT_E4M3, 4) & gvm_is(tv, GVM_DT_E4M3, 4) & gvm_aligned(tk, 1, 2) & gvm_aligned(tv, 1, 2) &
              tk.shape[3] == 64 & hkv > 0 & hq > 0 & tv.shape[0] == n_conv & tv.shape[1] == cache_s &
              tv.shape[2] == hkv & tv.shape[3] == 64 & gvm_is(tc, GVM_DT_I32, 2) & tc.shape[0] == n_conv &
              tc.shape[1] >= 3 & conv >= 0 & conv < n_conv & (rope == 0 || rope == 1);
    if (!ok) return GVM_ERR_BAD_ARGS;
    const int* cv = gvm_ptr<const int>(tc, conv * tc.stride[0], 4);
    const int tok0 = cv[0], ntok = cv[1], pos0 = cv[2];
    if (tok0 < 0 || ntok < 0 || tok0 + ntok > nt || pos0 < 0 || cache_s <= 0) return GVM_ERR_BAD_ARGS;

    const unsigned warp = c.tid >> 5, lane = c.tid & 31;
    const int heads = hq + 2 * hkv;
    const double turns = gvm_rope_turns((int)lane);
    const float* wq = reinterpret_cast<const float*>(twq.ptr);
    const float* wk = reinterpret_cast<const float*>(twk.ptr);
    const float wq0 = 1.0f + wq[2 * lane], wq1 = 1.0f + wq[2 * lane + 1];
    const float wk0 = 1.0f + wk[2 * lane], wk1 = 1.0f + wk[2 * lane + 1];
    unsigned char* kc = gvm_ptr<unsigned char>(tk, conv * tk.stride[0], 1);
    unsigned char* vc = gvm_ptr<unsigned char>(tv, conv * tv.stride[0], 1);
    for (int j = 0; j < ntok; ++j) {
        const int t = tok0 + j, p = pos0 + j, slot = p % cache_s;
        float2 sc = make_float2(0.0f, 1.0f);
        const unsigned* row = gvm_ptr<const unsigned>(tx, t * tx.stride[0], 2);
        for (int h0 = warp; h0 < heads; h0 += 4 * GVM_QK_BATCH) {
            unsigned xw[GVM_QK_BATCH];  // all of the warp's head vectors in flight at once
#pragma unroll
            for (int u = 0; u < GVM_QK_BATCH; ++u) {
                const int hh = h0 + 4 * u;
                xw[u] = hh < heads ? row[hh * 32 + lane] : 0u;
            }
            if (rope && h0 == (int)warp) sc = gvm_rope_sincos(p, turns);  // the angle, while the first loads fly
#pragma unroll
            for (int u = 0; u < GVM_QK_BATCH; ++u) {
                const int hh = h0 + 4 * u;
                if (hh >= heads) continue;
                float x0 = gvm_bf16_lo(xw[u]), x1 = gvm_bf16_hi(xw[u]);
                if (hh >= hq + hkv) {  // v: straight to the cache
                    const int vh = hh - hq - hkv;
                    *reinterpret_cast<unsigned short*>(vc + slot * tv.stride[1] + vh * tv.stride[2] + 2 * lane) =
                        gvm_pack_e4m3x2(x0 / v_scale, x1 / v_scale);
                    continue;
                }
                const bool is_q = hh < hq;
                const float inv = 1.0f / sqrtf(gvm_warp_sum(x0 * x0 + x1 * x1) / 64.0f + GVM_RMS_EPS);
                const float2 r = gvm_qk_pair(x0, x1, inv, is_q ? wq0 : wk0, is_q ? wq1 : wk1, rope, sc);
                x0 = r.x;
                x1 = r.y;
                if (is_q) {
                    *gvm_ptr<unsigned>(tq, t * tq.stride[0] + hh * tq.stride[1] + 2 * lane, 2) = gvm_pack_bf16x2(x0, x1);
                } else {
                    const int kh = hh - hq;
                    *reinterpret_cast<unsigned short*>(kc + slot * tk.stride[1] + kh * tk.stride[2] + 2 * lane) =
                        gvm_pack_e4m3x2(x0 / k_scale, x1 / k_scale);
                }
            }
        }
    }
    return GVM_ERR_NONE;
}

// ---- ATTN_CHUNK -----------------------------------------------------------------------
// Query rows r = token * G + head (G query heads share kv head h), 16 rows per
// m-tile. Tensor cores (mma m16n8k16, f16 in, f32 accumulate) compute S = Q K^T
// and O += P V per tile of 16 keys. The head dimension of Q.K and the key order
// of P.V are permuted consistently so that each thread reads 16 contiguous bytes
// of a key row (K) and 8 contiguous bytes of a value row (V); e4m3 -> f16 is exact
// and the scales are applied in f32. Q goes bf16 -> f16 (exact for |q| in [2^-14, 65504]; QK-normed
// q is far inside) and waits in shared memory, private to its thread, so that
// the o accumulators fit the register budget. A warp takes two m-tiles (a unit)
// when there are two or more, so that a key tile's conversions serve both; warps
// split the keys of a unit when there are fewer than three units and merge
// (m, l, o) through shared memory.
// A warp's K and V tiles come through its own ring of GVM_ATT_STAGES stages in
// shared memory, filled by cp.async GVM_ATT_STAGES - 1 stages ahead: a tile was
// ~0.3 us of math against ~1 us of HBM latency, so a warp that loaded the tile
// it was about to use waited most of the time (1.9 GB/s a group, session 8).
// A stage is GVM_ATT_SUB tiles of 16 keys, taken in one softmax update (one max
// exchange, one o rescale, independent MMA chains to overlap). The ring sits
// where the warp's (m, l, o) go once its keys are done. A 4th stage (Q in
// registers to make room) measured no faster: the loop is bound by its chain of
// dependent steps, two warps a scheduler, not by loads (NOTES.md, session 15).
#define GVM_ATT_OSTRIDE 68                                   // padded f32 row of o in smem
#define GVM_ATT_STATE_BYTES ((16 * GVM_ATT_OSTRIDE + 32) * 4)  // o[16][68], m[16], l[16]
// H200, 046a761, 2 / 1 tiles a step (4 stages for 1): full-c32-t8 2251 / 2337 us,
// full-c16-t8 1394 / 1438, full-c1-t1 202 / 201, step 32x8 114.8 / 116.0 ms
#define GVM_ATT_SUB 2   // tiles a step with one m-tile a warp
#ifndef GVM_ATT_SUB2
#define GVM_ATT_SUB2 1  // and with two (their registers: 2 x 32 o accumulators)
#endif
#ifndef GVM_ATT_MTW
#define GVM_ATT_MTW 1   // most m-tiles a warp (2 spills 16 B with the lazy max)
#endif
#ifndef GVM_ATT_PROBE
#define GVM_ATT_PROBE 0  // timing probes (wrong sums), bits: 1 no QK (loads, conversions, MMAs), 2 no PV,
                         // 4 no e4m3 conversions (raw bits into the MMAs), 8 no fetches (the ring never refilled), 16 no softmax
#endif
#define GVM_ATT_SLACK 8.0f  // log2 of how far a score may pass the running max before it moves
#define GVM_ATT_STAGES 3  // stages of GVM_ATT_SUB tiles; the ring's bytes hold 6 / SUB stages of SUB tiles
#define GVM_ATT_TILE_BYTES 2048                              // 16 keys x 64 B of K, then of V
#define GVM_ATT_STAGE_BYTES (GVM_ATT_SUB * GVM_ATT_TILE_BYTES)
#define GVM_ATT_RING_BYTES (GVM_ATT_STAGES * GVM_ATT_STAGE_BYTES)
#define GVM_ATT_AREA_BYTES (GVM_ATT_RING_BYTES > GVM_ATT_STATE_BYTES ? GVM_ATT_RING_BYTES : GVM_ATT_STATE_BYTES)
#define GVM_ATT_Q_BYTES 2048                                 // an m-tile's Q fragments [4 k-steps][32 lanes] x 16 B
#define GVM_ATT_WARP_BYTES (GVM_ATT_AREA_BYTES + 2 * GVM_ATT_Q_BYTES)  // + two m-tiles' Q
static_assert(GVM_ATT_AREA_BYTES >= 2 * GVM_ATT_STATE_BYTES, "a warp's area holds two m-tiles' states");

struct gvm_attn_job {
    const unsigned char* kbase;   // k cache bytes of (conv, slot 0, head h)
    const unsigned char* vbase;
    int krow, vrow;               // bytes between consecutive cache slots
    int kb, ke, nt;               // keys [kb, ke) of the chunk in nt tiles of 16
    int pos0, g, rows, window, cache_s;
    float score_scale;            // k_scale / 8 * log2(e)
};

__device__ __forceinline__ bool gvm_attn_visible(const gvm_attn_job& jb, int key, int p) {
    return key < jb.ke && key <= p && (jb.window == 0 || key > p - jb.window);
}

// Query row r's dims 16 t4 .. 16 t4 + 15 (8 bf16 pairs) from t, heads head_stride
// elements apart in a token's row (q, or qkvg whose q heads come first); zeros past
// the chunk's rows. (HS: q's stride is a 64-bit field, qkvg's an int constant.)
template <typename HS>
__device__ __forceinline__ void gvm_attn_q_raw(const gvm_ctx& c, const gvm_tensor& t, HS head_stride,
                                               const gvm_attn_job& jb, int tok0, int r, unsigned t4, unsigned (&raw)[8]) {
    uint4 a = make_uint4(0, 0, 0, 0), b = a;
    if (r < jb.rows) {
        const int tok = tok0 + r / jb.g, head = c.ins->arg[1] * jb.g + r % jb.g;
        const uint4* p = gvm_ptr<const uint4>(t, tok * t.stride[0] + head * head_stride + 16 * t4, 2);
        a = p[0];
        b = p[1];
    }
    raw[0] = a.x, raw[1] = a.y, raw[2] = a.z, raw[3] = a.w, raw[4] = b.x, raw[5] = b.y, raw[6] = b.z, raw[7] = b.w;
}

// The A fragments of m-tile mt (rows g, g+8; dims 16*t4 + 4s .. +3 for k-step s)
// as f16, into this thread's 64 bytes of qf. Zero rows past the query rows.
__device__ __forceinline__ void gvm_attn_stage_q(const gvm_ctx& c, const gvm_attn_job& jb, int mt, unsigned qf) {
    const gvm_tensor& tq = gvm_t(c, 0);
    const int tok0 = gvm_ptr<const int>(gvm_t(c, 3), c.ins->arg[0] * gvm_t(c, 3).stride[0], 4)[0];
    const unsigned lane = c.tid & 31, g = lane >> 2, t4 = lane & 3;
    unsigned w[2][8];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        unsigned raw[8];
        gvm_attn_q_raw(c, tq, tq.stride[1], jb, tok0, mt * 16 + g + 8 * hr, t4, raw);
#pragma unroll
        for (int i = 0; i < 8; ++i) w[hr][i] = gvm_bf16x2_to_f16x2(raw[i]);
    }
#pragma unroll
    for (int s = 0; s < 4; ++s) gvm_sts(qf + (s * 32 + lane) * 16, make_uint4(w[0][2 * s], w[1][2 * s], w[0][2 * s + 1], w[1][2 * s + 1]));
}

// The same fragments straight from qkvg (fused QK-norm/RoPE, a7 of a fused
// chunk): thread (g, t4) holds dims 16 t4 .. 16 t4 + 15 of a row, so the head's
// sum of squares is its 4 lanes' by two shuffles and RoPE pair i = 8 t4 + k lies
// in its own dims. Rounded to bf16 as QK_ROPE_KV stores q, then to f16.
__device__ __forceinline__ void gvm_attn_stage_q_fused(const gvm_ctx& c, const gvm_attn_job& jb, int mt, unsigned qf,
                                                       unsigned lane, int rope) {
    const gvm_tensor& tx = gvm_t(c, 0);
    const int tok0 = gvm_ptr<const int>(gvm_t(c, 3), c.ins->arg[0] * gvm_t(c, 3).stride[0], 4)[0];
    const float* wq = reinterpret_cast<const float*>(gvm_t(c, 6).ptr) + 16 * (lane & 3);
    const unsigned g = lane >> 2, t4 = lane & 3;
    unsigned w[2][8];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const int r = mt * 16 + g + 8 * hr;
        unsigned raw[8];
        gvm_attn_q_raw(c, tx, 64, jb, tok0, r, t4, raw);
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; ++k) ss += gvm_bf16_lo(raw[k]) * gvm_bf16_lo(raw[k]) + gvm_bf16_hi(raw[k]) * gvm_bf16_hi(raw[k]);
        ss += __shfl_xor_sync(0xffffffffu, ss, 1);  // every lane: rows past the last are zeros
        ss += __shfl_xor_sync(0xffffffffu, ss, 2);
        const float inv = 1.0f / sqrtf(ss / 64.0f + GVM_RMS_EPS);
        const int pos = jb.pos0 + r / jb.g;
#pragma unroll
        for (int k = 0; k < 8; ++k) w[hr][k] = 0u;
        if (r < jb.rows) {  // no angles for the padding rows (half of a one-token m-tile)
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                const float2 sc = rope ? gvm_rope_sincos(pos, gvm_rope_turns(8 * (int)t4 + k)) : make_float2(0.0f, 1.0f);
                const float2 q = gvm_qk_pair(gvm_bf16_lo(raw[k]), gvm_bf16_hi(raw[k]), inv, 1.0f + wq[2 * k],
                                             1.0f + wq[2 * k + 1], rope, sc);
                w[hr][k] = gvm_bf16x2_to_f16x2(gvm_pack_bf16x2(q.x, q.y));
            }
        }
    }
#pragma unroll
    for (int s = 0; s < 4; ++s) gvm_sts(qf + (s * 32 + lane) * 16, make_uint4(w[0][2 * s], w[1][2 * s], w[0][2 * s + 1], w[1][2 * s + 1]));
}

// A fused chunk holding new positions [max(kb, pos0), ke) writes their k (normed with
// w_kn, rotated) and v of its kv head into the caches first, one warp a position,
// lane i dims (2i, 2i + 1): QK_ROPE_KV's bytes exactly.
__device__ __forceinline__ void gvm_attn_new_keys(const gvm_ctx& c, const gvm_attn_job& jb, int rope) {
    const gvm_tensor& tx = gvm_t(c, 0);
    const gvm_tensor& tk = gvm_t(c, 1);
    const gvm_tensor& tv = gvm_t(c, 2);
    const int conv = c.ins->arg[0], h = c.ins->arg[1], hkv = tk.shape[2], hq = hkv * jb.g;
    const int tok0 = gvm_ptr<const int>(gvm_t(c, 3), conv * gvm_t(c, 3).stride[0], 4)[0];
    const float k_scale = gvm_argf(c, 5), v_scale = gvm_argf(c, 6);
    const unsigned tid = gvm_opaque(c.tid);  // as measured (without it the code differs; the group loop's opaque index covers the persistent loop)
    const unsigned warp = tid >> 5, lane = tid & 31;
    const float* wk = reinterpret_cast<const float*>(gvm_t(c, 7).ptr);
    for (int p = max(jb.kb, jb.pos0) + (int)warp; p < jb.ke; p += 4) {
        const unsigned* row = gvm_ptr<const unsigned>(tx, (tok0 + p - jb.pos0) * tx.stride[0], 2);
        const unsigned xk = row[(hq + h) * 32 + lane], xv = row[(hq + hkv + h) * 32 + lane];
        const float2 sc = rope ? gvm_rope_sincos(p, gvm_rope_turns((int)lane)) : make_float2(0.0f, 1.0f);
        const float x0 = gvm_bf16_lo(xk), x1 = gvm_bf16_hi(xk);
        const float inv = 1.0f / sqrtf(gvm_warp_sum(x0 * x0 + x1 * x1) / 64.0f + GVM_RMS_EPS);
        const float2 k = gvm_qk_pair(x0, x1, inv, 1.0f + wk[2 * lane], 1.0f + wk[2 * lane + 1], rope, sc);
        const int slot = p % jb.cache_s;
        *gvm_ptr<unsigned short>(tk, conv * tk.stride[0] + slot * tk.stride[1] + h * tk.stride[2] + 2 * lane, 1) =
            gvm_pack_e4m3x2(k.x / k_scale, k.y / k_scale);
        *gvm_ptr<unsigned short>(tv, conv * tv.stride[0] + slot * tv.stride[1] + h * tv.stride[2] + 2 * lane, 1) =
            gvm_pack_e4m3x2(gvm_bf16_lo(xv) / v_scale, gvm_bf16_hi(xv) / v_scale);
    }
}

// Byte offset of 16-byte chunk c of key k (0..15) in a ring tile: pairs of keys
// swap by bit 1 of k and chunks by bit 2, so that both the K reads (a lane's 16
// B of one key) and the V reads (8 B of keys 2 t4 + c) hit 32 different banks.
__device__ __forceinline__ unsigned gvm_attn_swz(unsigned k, unsigned c) {
    return ((k ^ ((k >> 1) & 1)) << 6) | ((c ^ ((k >> 1) & 2)) << 4);
}

// (s + d) mod n for s in [0, n) and d in [0, n].
__device__ __forceinline__ int gvm_attn_slot_add(int s, int d, int n) {
    s += d;
    return s >= n ? s - n : s;
}

// cp.async of key tile `tile` (first key in cache slot s0) into the ring tile at
// dst: lane copies chunks lane and lane + 32 of K and of V (key = chunk / 4).
// Keys past the chunk are zero-filled: p = 0 times stale bytes could be NaN.
__device__ __forceinline__ void gvm_attn_fetch(const gvm_attn_job& jb, int tile, int s0, unsigned dst, unsigned lane,
                                               unsigned long long pol) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const unsigned k = (lane >> 2) + 8 * h, ch = lane & 3;
        const int sl = gvm_attn_slot_add(s0, (int)k, jb.cache_s);
        const bool valid = jb.kb + tile * 16 + (int)k < jb.ke;
        const unsigned o = gvm_attn_swz(k, ch);
        gvm_cp_async16(dst + o, jb.kbase + (long long)sl * jb.krow + 16 * ch, valid, pol);
        gvm_cp_async16(dst + GVM_ATT_TILE_BYTES / 2 + o, jb.vbase + (long long)sl * jb.vrow + 16 * ch, valid, pol);
    }
}

// The SUB tiles tile, tile + step, ... (slots s0, s0 + s_step, ...) of a
// stage; tiles past the chunk come zero-filled.
template <int SUB>
__device__ __forceinline__ void gvm_attn_fetch_stage(const gvm_attn_job& jb, int tile, int step, int s0, int s_step,
                                                     unsigned dst, unsigned lane, unsigned long long pol) {
#pragma unroll
    for (int u = 0; u < SUB; ++u) {
        gvm_attn_fetch(jb, tile + u * step, s0, dst + u * GVM_ATT_TILE_BYTES, lane, pol);
        s0 = gvm_attn_slot_add(s0, s_step, jb.cache_s);
    }
}

// Running (m [log2 units], l, o) of the MT m-tiles mt0, mt0 + 1, ... over key
// tiles first, first + step, ...: m-tile i's state written to st + i *
// GVM_ATT_STATE_BYTES (the warp's ring until then), its Q fragments staged at
// qf + i * GVM_ATT_Q_BYTES. With two m-tiles a warp, a key tile's loads and
// e4m3 -> f16 conversions serve twice the MMAs, and the two m-tiles' chains
// (scores, softmax, o) are independent work for the scheduler to interleave.
template <int MT, int SUB>
__device__ __forceinline__ void gvm_attn_tile(const gvm_attn_job& jb, int mt0, int first, int step, unsigned lane,
                                              unsigned st, unsigned qf) {
    constexpr int STAGE_BYTES = SUB * GVM_ATT_TILE_BYTES, STAGES = GVM_ATT_RING_BYTES / STAGE_BYTES;
    const unsigned g = lane >> 2, t4 = lane & 3;
    float m0[MT], m1[MT], l0[MT], l1[MT];
    float hx0[MT], hx1[MT];  // this lane's highest raw scores of rows g, g + 8: the true max at the end
    float o[MT][8][4];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        m0[m] = m1[m] = hx0[m] = hx1[m] = GVM_NEG_INF;
        l0[m] = l1[m] = 0.0f;
#pragma unroll
        for (int d = 0; d < 8; ++d) o[m][d][0] = o[m][d][1] = o[m][d][2] = o[m][d][3] = 0.0f;
    }

    const int s_step = (step * 16) % jb.cache_s;              // cache slots between the warp's tiles
    const int s_stage = (SUB * step * 16) % jb.cache_s;  // and between its stages
    const int pos_hi = jb.pos0 + (jb.rows - 1) / jb.g;        // the job's last query position
    int tf = first;                                           // first tile of the next stage to fetch
    int sf = first < jb.nt ? (jb.kb + first * 16) % jb.cache_s : 0;  // cache slot of its first key
    // the next stage into ring stage `into`; a commit group even when past the chunk: the wait counts groups
    const auto fetch_next = [&](int into) {
        if (tf < jb.nt && !(GVM_ATT_PROBE & 8)) gvm_attn_fetch_stage<SUB>(jb, tf, step, sf, s_step, st + into * STAGE_BYTES, lane,
                                                  gvm_policy_evict_first());  // read once a step; made here, not held
        gvm_cp_async_commit();
        tf += SUB * step;
        sf = gvm_attn_slot_add(sf, s_stage, jb.cache_s);
    };
#pragma unroll 1
    for (int d = 0; d < STAGES - 1; ++d) fetch_next(d);
    int stage = 0;
#pragma unroll 1
    for (int tile = first; tile < jb.nt; tile += SUB * step) {
        __syncwarp();  // the stage refilled next was read by every lane in the previous step
        fetch_next(stage == 0 ? STAGES - 1 : stage - 1);
        gvm_cp_async_wait<STAGES - 1>();  // this lane's copies of the stage landed
        __syncwarp();                              // and every other lane's
        const unsigned kt = st + stage * STAGE_BYTES;
        stage = stage == STAGES - 1 ? 0 : stage + 1;

        float sc[MT][SUB][2][4];  // raw scores q.k of sub-tile u, keys 8 nb + 2 t4 + (i & 1)
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int u = 0; u < SUB; ++u)
#pragma unroll
                for (int nb = 0; nb < 2; ++nb) sc[m][u][nb][0] = sc[m][u][nb][1] = sc[m][u][nb][2] = sc[m][u][nb][3] = 0.0f;
        uint4 kr[SUB][2];  // this lane's 16 B of keys 8 nb + g
#pragma unroll
        for (int u = 0; u < SUB && !(GVM_ATT_PROBE & 1); ++u)
#pragma unroll
            for (int nb = 0; nb < 2; ++nb) kr[u][nb] = gvm_lds_u4(kt + u * GVM_ATT_TILE_BYTES + gvm_attn_swz(nb * 8 + g, t4));
#pragma unroll
        for (int s = 0; s < 4 && !(GVM_ATT_PROBE & 1); ++s) {
            uint4 a[MT];
#pragma unroll
            for (int m = 0; m < MT; ++m) a[m] = gvm_lds_u4(qf + m * GVM_ATT_Q_BYTES + (s * 32 + lane) * 16);
#pragma unroll
            for (int u = 0; u < SUB; ++u)
#pragma unroll
                for (int nb = 0; nb < 2; ++nb) {
                    const uint4& k4 = kr[u][nb];
                    const unsigned kw = s == 0 ? k4.x : s == 1 ? k4.y : s == 2 ? k4.z : k4.w;
                    const unsigned b0 = (GVM_ATT_PROBE & 4) ? kw : gvm_e4m3x2_to_f16x2(kw);
                    const unsigned b1 = (GVM_ATT_PROBE & 4) ? kw >> 8 : gvm_e4m3x2_hi_to_f16x2(kw);
#pragma unroll
                    for (int m = 0; m < MT; ++m) gvm_mma_f16(sc[m][u][nb], a[m].x, a[m].y, a[m].z, a[m].w, b0, b1);
                }
        }
#pragma unroll
        for (int u = 0; u < SUB; ++u) {
            const int kp0 = jb.kb + (tile + u * step) * 16;
            // every query row sees every key of the sub-tile: no per-score test (the usual case)
            const bool whole = kp0 + 15 < jb.ke && kp0 + 15 <= jb.pos0 && (jb.window == 0 || kp0 > pos_hi - jb.window);
            if (!whole) {
#pragma unroll
                for (int m = 0; m < MT; ++m) {
                    // query positions of rows g, g + 8 (-1 sees no key): found here, not held through the loop
                    const int r0 = (mt0 + m) * 16 + (int)g, r1 = r0 + 8;
                    const int p0 = r0 < jb.rows ? jb.pos0 + r0 / jb.g : -1, p1 = r1 < jb.rows ? jb.pos0 + r1 / jb.g : -1;
#pragma unroll
                    for (int nb = 0; nb < 2; ++nb)
#pragma unroll
                        for (int i = 0; i < 4; ++i) {
                            const int key = kp0 + nb * 8 + 2 * t4 + (i & 1);
                            if (!gvm_attn_visible(jb, key, i < 2 ? p0 : p1)) sc[m][u][nb][i] = GVM_NEG_INF;
                        }
                }
            }
        }
        unsigned pa[MT][SUB][4];  // P as f16 A fragments
#pragma unroll
        for (int m = 0; m < MT && (GVM_ATT_PROBE & 16); ++m)
#pragma unroll
            for (int u = 0; u < SUB; ++u)
#pragma unroll
                for (int i = 0; i < 4; ++i) pa[m][u][i] = gvm_pack_f16x2(sc[m][u][i >> 1][2 * (i & 1)], sc[m][u][i >> 1][2 * (i & 1) + 1]);
        // The running max moves only when a score passes it by more than 2^GVM_ATT_SLACK:
        // until then p = 2^(s - m) <= 2^GVM_ATT_SLACK (f16 holds it), o and l need no
        // rescale and the rows need no max exchange, only each lane's test and one vote.
        float mx0[MT], mx1[MT];  // this lane's maxima of rows g, g + 8 (raw scores)
        bool grow = false;
#pragma unroll
        for (int m = 0; m < MT && !(GVM_ATT_PROBE & 16); ++m) {
            mx0[m] = mx1[m] = GVM_NEG_INF;
#pragma unroll
            for (int u = 0; u < SUB; ++u)
#pragma unroll
                for (int nb = 0; nb < 2; ++nb) {
                    mx0[m] = fmaxf(mx0[m], fmaxf(sc[m][u][nb][0], sc[m][u][nb][1]));
                    mx1[m] = fmaxf(mx1[m], fmaxf(sc[m][u][nb][2], sc[m][u][nb][3]));
                }
            hx0[m] = fmaxf(hx0[m], mx0[m]);
            hx1[m] = fmaxf(hx1[m], mx1[m]);
            // m in log2 units of the scaled scores (score_scale > 0: the max commutes with it)
            grow |= (mx0[m] * jb.score_scale > m0[m] + GVM_ATT_SLACK) | (mx1[m] * jb.score_scale > m1[m] + GVM_ATT_SLACK);
        }
        const bool move = __any_sync(0xffffffffu, grow);  // warp-uniform
#pragma unroll
        for (int m = 0; m < MT && !(GVM_ATT_PROBE & 16); ++m) {
            if (move) {
                float x0 = fmaxf(mx0[m], __shfl_xor_sync(0xffffffffu, mx0[m], 1));
                x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, 2));
                float x1 = fmaxf(mx1[m], __shfl_xor_sync(0xffffffffu, mx1[m], 1));
                x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, 2));
                const float mn0 = fmaxf(m0[m], x0 * jb.score_scale), mn1 = fmaxf(m1[m], x1 * jb.score_scale);
                // a row with nothing visible yet keeps m = -inf (its al is then 0 * nothing)
                const float al0 = mn0 == GVM_NEG_INF ? 1.0f : gvm_ex2(m0[m] - mn0);
                const float al1 = mn1 == GVM_NEG_INF ? 1.0f : gvm_ex2(m1[m] - mn1);
                m0[m] = mn0;
                m1[m] = mn1;
                l0[m] *= al0;
                l1[m] *= al1;
#pragma unroll
                for (int d = 0; d < 8; ++d) {
                    o[m][d][0] *= al0;
                    o[m][d][1] *= al0;
                    o[m][d][2] *= al1;
                    o[m][d][3] *= al1;
                }
            }
            // a row with nothing visible yet: subtract 0 instead so no inf - inf (its p are 0)
            const float mu0 = m0[m] == GVM_NEG_INF ? 0.0f : m0[m], mu1 = m1[m] == GVM_NEG_INF ? 0.0f : m1[m];
            float ls0 = 0.0f, ls1 = 0.0f;
#pragma unroll
            for (int u = 0; u < SUB; ++u)
#pragma unroll
                for (int nb = 0; nb < 2; ++nb) {
                    sc[m][u][nb][0] = gvm_ex2(fmaf(sc[m][u][nb][0], jb.score_scale, -mu0));
                    sc[m][u][nb][1] = gvm_ex2(fmaf(sc[m][u][nb][1], jb.score_scale, -mu0));
                    sc[m][u][nb][2] = gvm_ex2(fmaf(sc[m][u][nb][2], jb.score_scale, -mu1));
                    sc[m][u][nb][3] = gvm_ex2(fmaf(sc[m][u][nb][3], jb.score_scale, -mu1));
                    ls0 += sc[m][u][nb][0] + sc[m][u][nb][1];
                    ls1 += sc[m][u][nb][2] + sc[m][u][nb][3];
                }
            l0[m] += ls0;
            l1[m] += ls1;
#pragma unroll
            for (int u = 0; u < SUB; ++u) {
                pa[m][u][0] = gvm_pack_f16x2(sc[m][u][0][0], sc[m][u][0][1]);
                pa[m][u][1] = gvm_pack_f16x2(sc[m][u][0][2], sc[m][u][0][3]);
                pa[m][u][2] = gvm_pack_f16x2(sc[m][u][1][0], sc[m][u][1][1]);
                pa[m][u][3] = gvm_pack_f16x2(sc[m][u][1][2], sc[m][u][1][3]);
            }
        }
#pragma unroll
        for (int u = 0; u < SUB && !(GVM_ATT_PROBE & 2); ++u) {
            const unsigned vt = kt + u * GVM_ATT_TILE_BYTES + GVM_ATT_TILE_BYTES / 2;
            uint2 vr[4];
#pragma unroll
            for (int i = 0; i < 4; ++i)
                vr[i] = gvm_lds_u2(vt + gvm_attn_swz((i >> 1) * 8 + 2 * t4 + (i & 1), g >> 1) + 8 * (g & 1));
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const unsigned a0 = half ? vr[0].y : vr[0].x, a1 = half ? vr[1].y : vr[1].x;
                const unsigned c0 = half ? vr[2].y : vr[2].x, c1 = half ? vr[3].y : vr[3].x;
                // byte d of key k0 next to byte d of key k1: (k0, k1) pairs of dims 8g + 4*half + d
                const unsigned lo_a = __byte_perm(a0, a1, 0x5140), hi_a = __byte_perm(a0, a1, 0x7362);
                const unsigned lo_c = __byte_perm(c0, c1, 0x5140), hi_c = __byte_perm(c0, c1, 0x7362);
#pragma unroll
                for (int d = 0; d < 4; ++d) {
                    const unsigned wa = d < 2 ? lo_a : hi_a, wc = d < 2 ? lo_c : hi_c;
                    const unsigned b0 = (GVM_ATT_PROBE & 4) ? wa >> (8 * (d & 1))
                                        : (d & 1) ? gvm_e4m3x2_hi_to_f16x2(wa) : gvm_e4m3x2_to_f16x2(wa);
                    const unsigned b1 = (GVM_ATT_PROBE & 4) ? wc >> (8 * (d & 1))
                                        : (d & 1) ? gvm_e4m3x2_hi_to_f16x2(wc) : gvm_e4m3x2_to_f16x2(wc);
#pragma unroll
                    for (int m = 0; m < MT; ++m)
                        gvm_mma_f16(o[m][4 * half + d], pa[m][u][0], pa[m][u][1], pa[m][u][2], pa[m][u][3], b0, b1);
                }
            }
        }
    }
    __syncwarp();  // the states below overwrite the ring
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        // the state relative to the rows' true max, as written: the running max may lag it by GVM_ATT_SLACK
        float x0 = fmaxf(hx0[m], __shfl_xor_sync(0xffffffffu, hx0[m], 1));
        x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, 2));
        float x1 = fmaxf(hx1[m], __shfl_xor_sync(0xffffffffu, hx1[m], 1));
        x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, 2));
        const float mt0 = fmaxf(m0[m], x0 * jb.score_scale), mt1 = fmaxf(m1[m], x1 * jb.score_scale);
        const float al0 = mt0 == GVM_NEG_INF ? 1.0f : gvm_ex2(m0[m] - mt0);
        const float al1 = mt1 == GVM_NEG_INF ? 1.0f : gvm_ex2(m1[m] - mt1);
        m0[m] = mt0;
        m1[m] = mt1;
#pragma unroll
        for (int d = 0; d < 8; ++d) {
            o[m][d][0] *= al0;
            o[m][d][1] *= al0;
            o[m][d][2] *= al1;
            o[m][d][3] *= al1;
        }
        float la = l0[m] * al0, lb = l1[m] * al1;
        la += __shfl_xor_sync(0xffffffffu, la, 1);
        la += __shfl_xor_sync(0xffffffffu, la, 2);
        lb += __shfl_xor_sync(0xffffffffu, lb, 1);
        lb += __shfl_xor_sync(0xffffffffu, lb, 2);
        // o[d][0] is dim 16*t4 + d of row g, o[d][1] dim 16*t4 + 8 + d; [2], [3] row g + 8
        const unsigned sm = st + m * GVM_ATT_STATE_BYTES, ml = sm + 16 * GVM_ATT_OSTRIDE * 4;
        if (t4 == 0) {
            gvm_sts(ml + g * 4, m0[m]);
            gvm_sts(ml + (g + 8) * 4, m1[m]);
            gvm_sts(ml + 64 + g * 4, la);
            gvm_sts(ml + 64 + (g + 8) * 4, lb);
        }
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const unsigned row = sm + ((g + 8 * hr) * GVM_ATT_OSTRIDE + 16 * t4) * 4;
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const int c = 2 * hr + (q >> 1), d = 4 * (q & 1);
                gvm_sts(row + q * 16, make_float4(o[m][d][c], o[m][d + 1][c], o[m][d + 2][c], o[m][d + 3][c]));
            }
        }
    }
}

// Merge the split warps' states of one round and write part_o / part_ml: the
// round's units (mtw m-tiles each) in turn, unit w's split warps w * split ...
__device__ __forceinline__ void gvm_attn_write(const gvm_ctx& c, const gvm_attn_job& jb, int round, int per_round,
                                               int split, int mtw, unsigned smem) {
    const gvm_tensor& tpo = gvm_t(c, 4);
    const gvm_tensor& tml = gvm_t(c, 5);
    const int tok0 = gvm_ptr<const int>(gvm_t(c, 3), c.ins->arg[0] * gvm_t(c, 3).stride[0], 4)[0];
    const int h = c.ins->arg[1], j = c.ins->arg[2];
    const float v_scale = gvm_argf(c, 6);
    for (int it = c.tid; it < per_round * mtw * 16 * 16; it += 128) {  // 16 float4s of o per row
        const int rr = it >> 4, q4 = it & 15, row = rr & 15, mi = rr >> 4;
        const int r = (round * per_round * mtw + mi) * 16 + row;
        if (r >= jb.rows) continue;
        const int unit = mi / mtw;
        const unsigned w0 = smem + unit * split * GVM_ATT_WARP_BYTES + (mi - unit * mtw) * GVM_ATT_STATE_BYTES;
        const unsigned ml = 16 * GVM_ATT_OSTRIDE * 4 + row * 4;
        float mx = GVM_NEG_INF;
        for (int k = 0; k < split; ++k) mx = fmaxf(mx, gvm_lds_f(w0 + k * GVM_ATT_WARP_BYTES + ml));
        float l = 0.0f;
        float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (mx != GVM_NEG_INF) {
            for (int k = 0; k < split; ++k) {
                const unsigned wk = w0 + k * GVM_ATT_WARP_BYTES;
                const float f = exp2f(gvm_lds_f(wk + ml) - mx);
                const float4 ok = gvm_lds_f4(wk + (row * GVM_ATT_OSTRIDE + 4 * q4) * 4);
                l += f * gvm_lds_f(wk + ml + 64);
                o.x += f * ok.x;
                o.y += f * ok.y;
                o.z += f * ok.z;
                o.w += f * ok.w;
            }
        }
        const int tok = tok0 + r / jb.g, head = h * jb.g + r % jb.g;
        const long long at = tok * tpo.stride[0] + head * tpo.stride[1] + j * tpo.stride[2];
        *gvm_ptr<float4>(tpo, at + 4 * q4, 4) = make_float4(o.x * v_scale, o.y * v_scale, o.z * v_scale, o.w * v_scale);
        if (q4 == 0)
            *gvm_ptr<float2>(tml, tok * tml.stride[0] + head * tml.stride[1] + j * tml.stride[2], 4) =
                make_float2(mx == GVM_NEG_INF ? GVM_NEG_INF : mx * GVM_LN2, l);
    }
}

__device__ __noinline__ bool gvm_attn_chunk_args_ok(const gvm_ctx& c) {
    const gvm_tensor& tq = gvm_t(c, 0);
    const gvm_tensor& tk = gvm_t(c, 1);
    const gvm_tensor& tv = gvm_t(c, 2);
    const gvm_tensor& tc = gvm_t(c, 3);
    const gvm_tensor& tpo = gvm_t(c, 4);
    const gvm_tensor& tml = gvm_t(c, 5);
    const int conv = c.ins->arg[0], h = c.ins->arg[1], j = c.ins->arg[2], len = c.ins->arg[3], window = c.ins->arg[4];
    const int nt = tpo.shape[0], hq = tpo.shape[1], n_conv = tk.shape[0], cache_s = tk.shape[1], hkv = tk.shape[2];
    const int nch = tpo.shape[2];
    // slot 0: q [T, HQ, 64], or qkvg [T, (2 HQ + 2 HKV) 64] with w_qn, w_kn and a7 = rope (fused QK-norm/RoPE)
    const bool fused = tq.ndim == 2;
    const bool q_ok = fused ? gvm_is(tq, GVM_DT_BF16, 2) & gvm_aligned(tq, 2, 16) & tq.shape[1] == (2 * hq + 2 * hkv) * 64 &
                                  gvm_has(c, 6) && gvm_has(c, 7) && gvm_is(gvm_t(c, 6), GVM_DT_F32, 1) &
                                  gvm_t(c, 6).shape[0] == 64 & gvm_is(gvm_t(c, 7), GVM_DT_F32, 1) & gvm_t(c, 7).shape[0] == 64 &
                                  (c.ins->arg[7] == 0 | c.ins->arg[7] == 1)
                            : gvm_is(tq, GVM_DT_BF16, 3) & gvm_aligned(tq, 2, 16) & tq.shape[2] == 64 & tq.shape[1] == hq;
    const bool ok = q_ok & tq.shape[0] == nt &
                    gvm_is(tk, GVM_DT_E4M3, 4) & gvm_is(tv, GVM_DT_E4M3, 4) & gvm_aligned(tk, 1, 16) &
                    gvm_aligned(tv, 1, 16) & tk.shape[3] == 64 & tv.shape[0] == n_conv & tv.shape[1] == cache_s &
                    tv.shape[2] == hkv & tv.shape[3] == 64 & hkv > 0 & hq % max(hkv, 1) == 0 & cache_s >= 16 &
                    tk.stride[1] < (1ll << 31) & tv.stride[1] < (1ll << 31) &
                    gvm_is(tc, GVM_DT_I32, 2) & tc.shape[0] == n_conv & tc.shape[1] >= 3 &
                    gvm_is(tpo, GVM_DT_F32, 4) & gvm_aligned(tpo, 4, 16) & hq > 0 & tpo.shape[3] == 64 & gvm_is(tml, GVM_DT_F32, 4) & gvm_aligned(tml, 4, 8) & tml.shape[0] == nt &
                    tml.shape[1] == hq & tml.shape[2] == nch & tml.shape[3] == 2 & conv >= 0 & conv < n_conv &
                    h >= 0 & h < hkv & j >= 0 & j < nch & len > 0 & window >= 0 &
                    gvm_argf(c, 5) > 0.0f & c.smem_bytes >= 4 * GVM_ATT_WARP_BYTES;  // k scale > 0: the running max commutes with it
    if (!ok) return false;
    const int* cv = gvm_ptr<const int>(tc, conv * tc.stride[0], 4);
    return cv[0] >= 0 & cv[1] >= 0 & cv[0] + cv[1] <= nt & cv[2] >= 0;
}

__device__ int gvm_op_attn_chunk(const gvm_ctx& c) {
    if (!gvm_attn_chunk_args_ok(c)) return GVM_ERR_BAD_ARGS;
    const int conv = c.ins->arg[0], h = c.ins->arg[1], j = c.ins->arg[2], len = c.ins->arg[3];
    gvm_attn_job jb;
    {
        const gvm_tensor& tk = gvm_t(c, 1);
        const gvm_tensor& tv = gvm_t(c, 2);
        const gvm_tensor& tc = gvm_t(c, 3);
        const int* cv = gvm_ptr<const int>(tc, conv * tc.stride[0], 4);
        const int ntok = cv[1];
        jb.pos0 = cv[2];
        jb.g = gvm_t(c, 4).shape[1] / tk.shape[2];
        jb.rows = ntok * jb.g;
        jb.window = c.ins->arg[4];
        jb.cache_s = tk.shape[1];
        jb.kbase = gvm_ptr<const unsigned char>(tk, conv * tk.stride[0] + h * tk.stride[2], 1);
        jb.vbase = gvm_ptr<const unsigned char>(tv, conv * tv.stride[0] + h * tv.stride[2], 1);
        jb.krow = (int)tk.stride[1];
        jb.vrow = (int)tv.stride[1];
        jb.score_scale = gvm_argf(c, 5) * 0.125f * GVM_LOG2E;
        const long long base = jb.window == 0 ? 0 : max(0, jb.pos0 - jb.window + 1);
        const long long first_key = base + (long long)j * len, end = (long long)jb.pos0 + ntok;
        jb.kb = (int)min(first_key, end);
        jb.ke = (int)min(first_key + len, end);
        jb.nt = (jb.ke - jb.kb + 15) / 16;
    }
    const int mtiles = (jb.rows + 15) / 16;
    const int mtw = mtiles >= 2 && GVM_ATT_MTW == 2 ? 2 : 1;                    // m-tiles a warp (a unit)
    const int units = (mtiles + mtw - 1) / mtw;
    const int split = units >= 3 ? 1 : (units == 2 ? 2 : 4);  // warps per unit, splitting its keys
    const int per_round = 4 / split;
    const unsigned warp = c.tid >> 5;
    const unsigned smem = gvm_smem_addr(c.smem), st = smem + warp * GVM_ATT_WARP_BYTES;
    const bool fused = gvm_t(c, 0).ndim == 2;
    if (fused && max(jb.kb, jb.pos0) < jb.ke) {  // this chunk holds new positions: their k and v first
        gvm_attn_new_keys(c, jb, c.ins->arg[7]);
        __threadfence();    // in L2 before the barrier: the ring's copies (.cg) read L2, not L1
        gvm_group_sync(c);  // the ring's copies below read them
    }
    for (int round = 0; round * per_round < units; ++round) {
        const int mt = (round * per_round + (int)warp / split) * mtw;
        if (mt < mtiles) {
            const unsigned qf = st + GVM_ATT_AREA_BYTES;
            for (int i = 0; i < mtw; ++i) {  // a padding m-tile (mtiles odd) stages zeros
                if (fused)
                    gvm_attn_stage_q_fused(c, jb, mt + i, qf + i * GVM_ATT_Q_BYTES, gvm_opaque(c.tid) & 31, c.ins->arg[7]);
                else
                    gvm_attn_stage_q(c, jb, mt + i, qf + i * GVM_ATT_Q_BYTES);
            }
            // lane opaque: its ring offsets are not hoisted out of the persistent loop (168 registers)
            if (mtw == 2)
                gvm_attn_tile<2, GVM_ATT_SUB2>(jb, mt, warp % split, split, gvm_opaque(c.tid) & 31, st, qf);
            else
                gvm_attn_tile<1, GVM_ATT_SUB>(jb, mt, warp % split, split, gvm_opaque(c.tid) & 31, st, qf);
        }
        gvm_group_sync(c);
        gvm_attn_write(c, jb, round, per_round, split, mtw, smem);
        gvm_group_sync(c);
    }
    return GVM_ERR_NONE;
}

// ---- ATTN_MERGE -------------------------------------------------------------------------
// The (token, head) pairs of tokens [a0, a0 + a1) x heads [a2, a2 + n), n = a3,
// or HQ - a2 when a3 is 0, one warp per pair. Lane i owns dims 4(i % 16) .. +3
// of the chunks of parity i / 16 (its u-th chunk is 2u + parity), whose o
// (16 B) it copies by cp.async into its own bytes of shared memory, so that no
// lane reads another's bytes. The scratch is shared out among the warps that
// have a pair: one warp alone holds 96 chunks a lane (192 a head) in flight at
// once, four hold 24 a lane; a head with more chunks than that goes in batches
// of that many, waited one by one. While the first batch flies the warp finds
// the head's max m and l = sum l_j exp(m_j - max) (each lane an online merge
// over chunks lane, lane + 32, ..., then a butterfly). Then the weighted sum
// (m_j read again: the scan just brought it into L1), the two parities added by
// one shuffle, the per-head norm and the gate. Within a lane the chunks add
// in order 0, 1, 2, ...: the numbers are those of one batch of every chunk.

// (m, l) merged with (m2, l2): the larger max, l rescaled to it; -inf m is empty.
__device__ __forceinline__ void gvm_lse_merge(float& m, float& l, float m2, float l2) {
    const float mn = fmaxf(m, m2);
    if (mn != GVM_NEG_INF) l = l * expf(m - mn) + l2 * expf(m2 - mn);
    m = mn;
}

__device__ int gvm_op_attn_merge(const gvm_ctx& c) {
    const gvm_tensor& to = gvm_t(c, 0);
    const gvm_tensor& tpo = gvm_t(c, 1);
    const gvm_tensor& tml = gvm_t(c, 2);
    const gvm_tensor& tx = gvm_t(c, 3);
    const int tok0 = c.ins->arg[0], ntok = c.ins->arg[1], head0 = c.ins->arg[2];
    const int nt = tpo.shape[0], hq = tpo.shape[1], nch = tpo.shape[2], width = tx.shape[1];
    const int nh = c.ins->arg[3] != 0 ? c.ins->arg[3] : hq - max(head0, 0);  // 0: every head from head0 on
    const bool ok = gvm_is(to, GVM_DT_BF16, 2) & gvm_aligned(to, 2, 8) & to.shape[0] == nt & to.shape[1] == hq * 64 &
                    gvm_is(tpo, GVM_DT_F32, 4) & gvm_aligned(tpo, 4, 16) & tpo.shape[3] == 64 &
                    gvm_is(tml, GVM_DT_F32, 4) & gvm_aligned(tml, 4, 8) & tml.shape[0] == nt & tml.shape[1] == hq &
                    tml.shape[2] == nch & tml.shape[3] == 2 & gvm_is(tx, GVM_DT_BF16, 2) & gvm_aligned(tx, 2, 8) &
                    tx.shape[0] == nt & width % 64 == 0 & width > 2 * hq * 64 & tok0 >= 0 & ntok >= 0 &
                    tok0 + ntok <= nt & head0 >= 0 & head0 <= hq & nh >= 0 & nh <= hq - head0 & c.smem_bytes >= 4 * 32 * 16;
    if (!ok) return GVM_ERR_BAD_ARGS;
    const int pairs = ntok * nh;
    if (pairs == 0) return GVM_ERR_NONE;
    const unsigned warp = c.tid >> 5, lane = c.tid & 31, q = lane & 15, par = lane >> 4;
    const int busy = pairs < 4 ? pairs : 4;                        // warps with a pair
    const int cap = (int)(c.smem_bytes / (unsigned)(busy * 32 * 16));  // chunks in flight per lane
    const unsigned so = gvm_smem_addr(c.smem) + (warp * cap * 32 + lane) * 16;  // chunk u of the lane: so + 512 u
    const unsigned long long pol = gvm_policy_evict_first();  // chunk states are read once
    const int gate0 = width - hq * 64;                         // g is the last HQ x 64 columns of qkvg
    const int per = (nch + 1) / 2;                             // chunks of parity 0: batches of the warp
    const int mine = (nch + 1 - (int)par) / 2;                 // chunks of the lane's parity
    for (int pair = warp; pair < pairs; pair += 4) {
        const int t = tok0 + pair / nh, head = head0 + pair % nh;
        const long long po = t * tpo.stride[0] + head * tpo.stride[1] + 4 * q + (long long)par * tpo.stride[2];
        const long long pm = t * tml.stride[0] + head * tml.stride[1];
        const long long pmp = pm + (long long)par * tml.stride[2];
        const uint2 gw = *gvm_ptr<const uint2>(tx, t * tx.stride[0] + gate0 + head * 64 + 4 * q, 2);
        float mx = GVM_NEG_INF, l = 0.0f;
        float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int n0 = 0; n0 < per; n0 += cap) {
            const int nb = min(cap, mine - n0);  // the lane's chunks of this batch (<= 0: none)
#pragma unroll 4
            for (int u = 0; u < nb; ++u)
                gvm_cp_async16(so + 512 * u, gvm_ptr<const float4>(tpo, po + 2ll * (n0 + u) * tpo.stride[2], 4), true, pol);
            gvm_cp_async_commit();
            if (n0 == 0) {
#pragma unroll 4
                for (int ch = lane; ch < nch; ch += 32) {
                    const float2 v = *gvm_ptr<const float2>(tml, pm + ch * tml.stride[2], 4);
                    gvm_lse_merge(mx, l, v.x, v.y);
                }
#pragma unroll
                for (int s = 16; s > 0; s >>= 1) {
                    const float m2 = __shfl_xor_sync(0xffffffffu, mx, s), l2 = __shfl_xor_sync(0xffffffffu, l, s);
                    gvm_lse_merge(mx, l, m2, l2);
                }
            }
            gvm_cp_async_wait<0>();
#pragma unroll 8
            for (int u = 0; u < nb; ++u) {
                const float m = *gvm_ptr<const float>(tml, pmp + 2ll * (n0 + u) * tml.stride[2], 4);
                if (m == GVM_NEG_INF) continue;  // a chunk with no visible key
                const float b = expf(m - mx);
                const float4 v = gvm_lds_f4(so + 512 * u);
                o = make_float4(fmaf(b, v.x, o.x), fmaf(b, v.y, o.y), fmaf(b, v.z, o.z), fmaf(b, v.w, o.w));
            }
        }
        o.x = (o.x + __shfl_xor_sync(0xffffffffu, o.x, 16)) / l;
        o.y = (o.y + __shfl_xor_sync(0xffffffffu, o.y, 16)) / l;
        o.z = (o.z + __shfl_xor_sync(0xffffffffu, o.z, 16)) / l;
        o.w = (o.w + __shfl_xor_sync(0xffffffffu, o.w, 16)) / l;
        float ss = o.x * o.x + o.y * o.y + o.z * o.z + o.w * o.w;
#pragma unroll
        for (int s = 8; s > 0; s >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, s);
        const float inv = 1.0f / sqrtf(ss / 64.0f + GVM_RMS_EPS);
        const float g0 = 1.0f / (1.0f + expf(-gvm_bf16_lo(gw.x))), g1 = 1.0f / (1.0f + expf(-gvm_bf16_hi(gw.x)));
        const float g2 = 1.0f / (1.0f + expf(-gvm_bf16_lo(gw.y))), g3 = 1.0f / (1.0f + expf(-gvm_bf16_hi(gw.y)));
        if (par == 0)
            *gvm_ptr<uint2>(to, t * to.stride[0] + head * 64 + 4 * q, 2) =
                make_uint2(gvm_pack_bf16x2(o.x * inv * g0, o.y * inv * g1), gvm_pack_bf16x2(o.z * inv * g2, o.w * inv * g3));
    }
    return GVM_ERR_NONE;
}
