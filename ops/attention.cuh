// Attention ops (isa/gvm_isa.h): QK_ROPE_KV, ATTN_CHUNK, ATTN_MERGE.
#pragma once
#include "common.cuh"

// ---- QK_ROPE_KV ---------------------------------------------------------------------
// One warp per 64-wide head vector of a token, lane i owning the RoPE pair
// (2i, 2i+1): the head norm is one warp sum and the rotation needs no exchange.
// A warp loads all its head vectors of a token (up to GVM_QK_BATCH) before it
// uses any, so a token costs one global round trip, not one per head.
// RoPE angles p * 500000^(-2i/64) reduced in f64 (positions reach 82K: an f32 angle
// there is off by up to 4e-3 rad), sin and cos of the reduced angle in f32.
#define GVM_QK_BATCH 8  // head vectors per warp loaded before any is used (20 at the shard: 5 per warp)
#ifndef GVM_QK_PROBE
#define GVM_QK_PROBE 0  // timing probes (tools/step_trace.py --define): 1 the tokens' loop run twice;
                        // 2 no loads of the token's row (zeros normed and stored: wrong results)
#endif

// pi-scaled angle step of RoPE pair i, 500000^(-i/32) / pi in f64 (Python: 2.0 **
// (-i * 18.931568569324174 / 32) / pi): a table, not an f64 exp2 at every use
__constant__ double gvm_rope_turns_tab[32] = {
    0.3183098861837907, 0.21123083444246454, 0.140173043175597, 0.09301900494295341, 0.061727526809402467,
    0.040962463190637954, 0.027182741272387807, 0.018038500752329104, 0.01197037142542741, 0.007943553293595518,
    0.005271351797334829, 0.0034980755770428916, 0.002321327282480121, 0.0015404356577515066, 0.0010222350090750881,
    0.0006783564172385001, 0.00045015815807855305, 0.0002987255108599194, 0.00019823461873803866, 0.0001315487383487747,
    8.729590558560581e-05, 5.792967099240885e-05, 3.844220136988972e-05, 2.5510292408821096e-05, 1.6928661616482793e-05,
    1.1233880801236252e-05, 7.454817203830705e-06, 4.947025923260151e-06, 3.2828525255900724e-06, 2.1785049991552997e-06,
    1.445658613766572e-06, 9.5934084538151e-07};
__device__ __forceinline__ double gvm_rope_turns(int i) { return gvm_rope_turns_tab[i]; }

// (sin, cos) of position p's angle: p * turns reduced modulo 2 in f64 (exact), then
// sincospif in f32 (within ~2 f32 ulps of f64 sin and cos rounded to f32)
__device__ __forceinline__ float2 gvm_rope_sincos(int p, double turns) {
    const double t = (double)p * turns;
    float s, c;
    sincospif((float)(t - 2.0 * rint(0.5 * t)), &s, &c);
    return make_float2(s, c);
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
    const int conv = c.ins->arg[0], rope = c.ins->arg[1], j0 = c.ins->arg[4], jn = c.ins->arg[5];
    const float k_scale = gvm_argf(c, 2), v_scale = gvm_argf(c, 3);
    const int nt = tx.shape[0], hq = tq.shape[1], hkv = tk.shape[2], n_conv = tk.shape[0], cache_s = tk.shape[1];
    bool ok = gvm_is(tx, GVM_DT_BF16, 2) & gvm_aligned(tx, 2, 4) & tx.shape[1] == (2 * hq + 2 * hkv) * 64 &
              gvm_is(tq, GVM_DT_BF16, 3) & gvm_aligned(tq, 2, 4) & tq.shape[0] == nt & tq.shape[2] == 64 &
              gvm_is(twq, GVM_DT_F32, 1) & twq.shape[0] == 64 & gvm_is(twk, GVM_DT_F32, 1) & twk.shape[0] == 64 &
              gvm_is(tk, GVM_DT_E4M3, 4) & gvm_is(tv, GVM_DT_E4M3, 4) & gvm_aligned(tk, 1, 2) & gvm_aligned(tv, 1, 2) &
              tk.shape[3] == 64 & hkv > 0 & hq > 0 & tv.shape[0] == n_conv & tv.shape[1] == cache_s &
              tv.shape[2] == hkv & tv.shape[3] == 64 & gvm_is(tc, GVM_DT_I32, 2) & tc.shape[0] == n_conv &
              tc.shape[1] >= 3 & conv >= 0 & conv < n_conv & (rope == 0 || rope == 1) & j0 >= 0 & jn >= 0;
    if (!ok) return GVM_ERR_BAD_ARGS;
    const int* cv = gvm_ptr<const int>(tc, conv * tc.stride[0], 4);
    const int tok0 = cv[0], ntok = cv[1], pos0 = cv[2];
    if (tok0 < 0 || ntok < 0 || tok0 + ntok > nt || pos0 < 0 || cache_s <= 0) return GVM_ERR_BAD_ARGS;

    const unsigned warp = c.tid >> 5, lane = c.tid & 31;
    // views of the loop's tensors: its stores would reload every descriptor field the next head reads
    const gvm_view vx = gvm_view_of(tx), vq = gvm_view_of(tq), vk = gvm_view_of(tk), vv = gvm_view_of(tv);
    const int heads = hq + 2 * hkv;
    const double turns = gvm_rope_turns((int)lane);
    const float* wq = reinterpret_cast<const float*>(twq.ptr);
    const float* wk = reinterpret_cast<const float*>(twk.ptr);
    const float wq0 = 1.0f + wq[2 * lane], wq1 = 1.0f + wq[2 * lane + 1];
    const float wk0 = 1.0f + wk[2 * lane], wk1 = 1.0f + wk[2 * lane + 1];
    unsigned char* kc = gvm_ptr<unsigned char>(vk, conv * vk.s0, 1);
    unsigned char* vc = gvm_ptr<unsigned char>(vv, conv * vv.s0, 1);
    const int jend = jn == 0 ? ntok : min(ntok, j0 + jn);  // the conversation's tokens are run-time data: clamped
#if GVM_QK_PROBE & 1
#pragma unroll 1
    for (int pass = 0; pass < 2; ++pass)
#endif
    for (int j = j0; j < jend; ++j) {
        const int t = tok0 + j, p = pos0 + j, slot = p % cache_s;
        float2 sc = make_float2(0.0f, 1.0f);
        const unsigned* row = gvm_ptr<const unsigned>(vx, t * vx.s0, 2);
        for (int h0 = warp; h0 < heads; h0 += 4 * GVM_QK_BATCH) {
            unsigned xw[GVM_QK_BATCH];  // all of the warp's head vectors in flight at once
#pragma unroll
            for (int u = 0; u < GVM_QK_BATCH; ++u) {
                const int hh = h0 + 4 * u;
                xw[u] = hh < heads && !(GVM_QK_PROBE & 2) ? row[hh * 32 + lane] : 0u;
            }
            if (rope && h0 == (int)warp) sc = gvm_rope_sincos(p, turns);  // the angle, while the first loads fly
#pragma unroll
            for (int u = 0; u < GVM_QK_BATCH; ++u) {
                const int hh = h0 + 4 * u;
                if (hh >= heads) continue;
                float x0 = gvm_bf16_lo(xw[u]), x1 = gvm_bf16_hi(xw[u]);
                if (hh >= hq + hkv) {  // v: straight to the cache
                    const int vh = hh - hq - hkv;
                    *reinterpret_cast<unsigned short*>(vc + slot * vv.s1 + vh * vv.s2 + 2 * lane) =
                        gvm_pack_e4m3x2(x0 / v_scale, x1 / v_scale);
                    continue;
                }
                const bool is_q = hh < hq;
                const float inv = 1.0f / sqrtf(gvm_warp_sum(x0 * x0 + x1 * x1) / 64.0f + GVM_RMS_EPS);
                const float2 r = gvm_qk_pair(x0, x1, inv, is_q ? wq0 : wk0, is_q ? wq1 : wk1, rope, sc);
                x0 = r.x;
                x1 = r.y;
                if (is_q) {
                    *gvm_ptr<unsigned>(vq, t * vq.s0 + hh * vq.s1 + 2 * lane, 2) = gvm_pack_bf16x2(x0, x1);
                } else {
                    const int kh = hh - hq;
                    *reinterpret_cast<unsigned short*>(kc + slot * vk.s1 + kh * vk.s2 + 2 * lane) =
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
// the 32 o accumulators fit the register budget. Warps split the keys of an
// m-tile when there are fewer than three m-tiles and merge (m, l, o) through
// shared memory.
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
#define GVM_ATT_SUB 2
#define GVM_ATT_STAGES 3
#define GVM_ATT_TILE_BYTES 2048                              // 16 keys x 64 B of K, then of V
#define GVM_ATT_STAGE_BYTES (GVM_ATT_SUB * GVM_ATT_TILE_BYTES)
#define GVM_ATT_RING_BYTES (GVM_ATT_STAGES * GVM_ATT_STAGE_BYTES)
#define GVM_ATT_AREA_BYTES (GVM_ATT_RING_BYTES > GVM_ATT_STATE_BYTES ? GVM_ATT_RING_BYTES : GVM_ATT_STATE_BYTES)
#define GVM_ATT_WARP_BYTES (GVM_ATT_AREA_BYTES + 2048)       // + Q fragments [4 k-steps][32 lanes] x 16 B

// Timing probe (GVM_ATT_STOP k > 0, tools/gpu_session.sh attstop): ATTN_CHUNK returns
// early, after stage k of its work (1 the argument check, 2 the conversation's row, 3
// the new keys, 4 Q staged, 5 the keys' loop, before the partials are written), so
// that a traced step's chunk run times say where a chunk's time goes. Wrong numbers.
#ifndef GVM_ATT_STOP
#define GVM_ATT_STOP 0
#endif

// Reschedule probe (GVM_RESCHED_PROBE n > 0, for A/B runs; NOTES.md session 61): a
// block that never runs (behind a conversation index the argument check rejects)
// holding n float4 live at once. It changes nothing a layer does, but it moves
// ptxas's register allocation of the whole kernel (one function), and with it the
// schedule of every op's hot loops (at n 16 none of the kernel's 33 MMA loops kept its
// SASS). Any change's A/B against main carries such a reschedule too; builds with the
// probe measure what one alone is worth (tools/sched_probe.py --draws). Device only.
#ifndef GVM_RESCHED_PROBE
#define GVM_RESCHED_PROBE 0
#endif

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

// Q's f16 pairs w[hr][i] (row g + 8 hr of m-tile mt, dims 16 t4 + 2 i, + 1) into
// this thread's 64 bytes of the warp's fragments at qf (the per-warp path), or
// (TILE) into the round's 64-row tile at qf in wgmma's 128-byte swizzle.
template <bool TILE>
__device__ __forceinline__ void gvm_attn_put_q(const unsigned (&w)[2][8], int mt, unsigned qf, unsigned lane) {
    if (TILE) {
        const unsigned t4 = lane & 3;
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const unsigned r = 16 * (unsigned)(mt & 3) + (lane >> 2) + 8 * hr;
#pragma unroll
            for (int c = 0; c < 2; ++c)
                gvm_sts(gvm_wgmma_at(qf, r, 2 * t4 + c), make_uint4(w[hr][4 * c], w[hr][4 * c + 1], w[hr][4 * c + 2], w[hr][4 * c + 3]));
        }
    } else {
#pragma unroll
        for (int s = 0; s < 4; ++s) gvm_sts(qf + (s * 32 + lane) * 16, make_uint4(w[0][2 * s], w[1][2 * s], w[0][2 * s + 1], w[1][2 * s + 1]));
    }
}

// The A fragments of m-tile mt (rows g, g+8; dims 16*t4 + 4s .. +3 for k-step s)
// as f16 (gvm_attn_put_q). Zero rows past the query rows.
template <bool TILE>
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
    gvm_attn_put_q<TILE>(w, mt, qf, lane);
}

// The same fragments straight from qkvg (fused QK-norm/RoPE, a7 of a fused
// chunk): thread (g, t4) holds dims 16 t4 .. 16 t4 + 15 of a row, so the head's
// sum of squares is its 4 lanes' by two shuffles and RoPE pair i = 8 t4 + k lies
// in its own dims. Rounded to bf16 as QK_ROPE_KV stores q, then to f16.
template <bool TILE>
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
    gvm_attn_put_q<TILE>(w, mt, qf, lane);
}

// A fused chunk holding new positions [max(kb, pos0), ke) writes their k (normed with
// w_kn, rotated) and v of its kv head into the caches first, one warp a position,
// lane i dims (2i, 2i + 1): QK_ROPE_KV's bytes exactly.
__device__ __forceinline__ void gvm_attn_new_keys(const gvm_ctx& c, const gvm_attn_job& jb, int rope) {
    // views: each position's stores would reload every descriptor field the next one reads
    const gvm_view tx = gvm_view_of(gvm_t(c, 0)), tk = gvm_view_of(gvm_t(c, 1)), tv = gvm_view_of(gvm_t(c, 2));
    const int conv = c.ins->arg[0], h = c.ins->arg[1], hkv = gvm_t(c, 1).shape[2], hq = hkv * jb.g;
    const int tok0 = gvm_ptr<const int>(gvm_t(c, 3), conv * gvm_t(c, 3).stride[0], 4)[0];
    const float k_scale = gvm_argf(c, 5), v_scale = gvm_argf(c, 6);
    const unsigned tid = gvm_opaque(c.tid);  // as measured (without it the code differs; the group loop's opaque index covers the persistent loop)
    const unsigned warp = tid >> 5, lane = tid & 31;
    const float* wk = reinterpret_cast<const float*>(gvm_t(c, 7).ptr);
    for (int p = max(jb.kb, jb.pos0) + (int)warp; p < jb.ke; p += 4) {
        const unsigned* row = gvm_ptr<const unsigned>(tx, (tok0 + p - jb.pos0) * tx.s0, 2);
        const unsigned xk = row[(hq + h) * 32 + lane], xv = row[(hq + hkv + h) * 32 + lane];
        const float2 sc = rope ? gvm_rope_sincos(p, gvm_rope_turns((int)lane)) : make_float2(0.0f, 1.0f);
        const float x0 = gvm_bf16_lo(xk), x1 = gvm_bf16_hi(xk);
        const float inv = 1.0f / sqrtf(gvm_warp_sum(x0 * x0 + x1 * x1) / 64.0f + GVM_RMS_EPS);
        const float2 k = gvm_qk_pair(x0, x1, inv, 1.0f + wk[2 * lane], 1.0f + wk[2 * lane + 1], rope, sc);
        const int slot = p % jb.cache_s;
        *gvm_ptr<unsigned short>(tk, conv * tk.s0 + slot * tk.s1 + h * tk.s2 + 2 * lane, 1) =
            gvm_pack_e4m3x2(k.x / k_scale, k.y / k_scale);
        *gvm_ptr<unsigned short>(tv, conv * tv.s0 + slot * tv.s1 + h * tv.s2 + 2 * lane, 1) =
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

// The GVM_ATT_SUB tiles tile, tile + step, ... (slots s0, s0 + s_step, ...) of a
// stage; tiles past the chunk come zero-filled.
__device__ __forceinline__ void gvm_attn_fetch_stage(const gvm_attn_job& jb, int tile, int step, int s0, int s_step,
                                                     unsigned dst, unsigned lane, unsigned long long pol) {
#pragma unroll
    for (int u = 0; u < GVM_ATT_SUB; ++u) {
        gvm_attn_fetch(jb, tile + u * step, s0, dst + u * GVM_ATT_TILE_BYTES, lane, pol);
        s0 = gvm_attn_slot_add(s0, s_step, jb.cache_s);
    }
}

// The max of a row's scores over the 4 lanes of its quad.
__device__ __forceinline__ float gvm_attn_quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

// One step of the online softmax over a thread's scores of rows g and g + 8 (the
// mma D layout; the per-warp path): the quad's max (mx: this thread's), the new running
// max m in log2 units of the scaled scores (score_scale > 0: the max commutes with
// it), mu to subtract (0 while a row has seen nothing: no inf - inf), and the
// factors rescaling o and l.
struct gvm_attn_max {
    float mu0, mu1, al0, al1;
};
__device__ __forceinline__ gvm_attn_max gvm_attn_new_max(float mx0, float mx1, float& m0, float& m1, float scale) {
    mx0 = gvm_attn_quad_max(mx0);
    mx1 = gvm_attn_quad_max(mx1);
    const float mn0 = fmaxf(m0, mx0 * scale), mn1 = fmaxf(m1, mx1 * scale);
    gvm_attn_max x;
    x.mu0 = mn0 == GVM_NEG_INF ? 0.0f : mn0;
    x.mu1 = mn1 == GVM_NEG_INF ? 0.0f : mn1;
    x.al0 = gvm_ex2(m0 - x.mu0);
    x.al1 = gvm_ex2(m1 - x.mu1);
    m0 = mn0;
    m1 = mn1;
    return x;
}

// Scores (a, b) of row g and (c, d) of row g + 8 -> their probabilities (unnormed),
// added to the rows' sums.
__device__ __forceinline__ void gvm_attn_exp4(float& a, float& b, float& c, float& d, const gvm_attn_max& x, float scale,
                                              float& ls0, float& ls1) {
    a = gvm_ex2(fmaf(a, scale, -x.mu0));
    b = gvm_ex2(fmaf(b, scale, -x.mu0));
    c = gvm_ex2(fmaf(c, scale, -x.mu1));
    d = gvm_ex2(fmaf(d, scale, -x.mu1));
    ls0 += a + b;
    ls1 += c + d;
}

// A warp's (m, l) of rows g and g + 8 into its state area st (after
// o[16][GVM_ATT_OSTRIDE]), by the quad's first lane.
__device__ __forceinline__ void gvm_attn_store_ml(unsigned st, unsigned lane, float m0, float m1, float l0, float l1) {
    const unsigned ml = st + 16 * GVM_ATT_OSTRIDE * 4, g = lane >> 2;
    if ((lane & 3) == 0) {
        gvm_sts(ml + g * 4, m0);
        gvm_sts(ml + (g + 8) * 4, m1);
        gvm_sts(ml + 64 + g * 4, l0);
        gvm_sts(ml + 64 + (g + 8) * 4, l1);
    }
}
// The same from the lanes' parts of l (the per-warp path: each lane sums its own keys).
__device__ __forceinline__ void gvm_attn_put_ml(unsigned st, unsigned lane, float m0, float m1, float l0, float l1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    gvm_attn_store_ml(st, lane, m0, m1, l0, l1);
}

// Running (m [log2 units], l, o) of m-tile mt over key tiles first, first+step, ...
// written to the warp's state area st (its ring until then); qf holds the staged
// Q fragments.
__device__ __forceinline__ void gvm_attn_tile(const gvm_attn_job& jb, int mt, int first, int step, unsigned lane,
                                              unsigned st, unsigned qf) {
    const unsigned g = lane >> 2, t4 = lane & 3;
    const int r0 = mt * 16 + g, r1 = r0 + 8;
    const int p0 = r0 < jb.rows ? jb.pos0 + r0 / jb.g : -1;  // -1 sees no key
    const int p1 = r1 < jb.rows ? jb.pos0 + r1 / jb.g : -1;
    float m0 = GVM_NEG_INF, m1 = GVM_NEG_INF, l0 = 0.0f, l1 = 0.0f;
    float o[8][4];
#pragma unroll
    for (int d = 0; d < 8; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;

    const unsigned long long pol = gvm_policy_evict_first();  // the cache is read once a step
    const int s_step = (step * 16) % jb.cache_s;              // cache slots between the warp's tiles
    const int s_stage = (GVM_ATT_SUB * step * 16) % jb.cache_s;  // and between its stages
    const int pos_hi = jb.pos0 + (jb.rows - 1) / jb.g;        // the job's last query position
    int tf = first;                                           // first tile of the next stage to fetch
    int sf = first < jb.nt ? (jb.kb + first * 16) % jb.cache_s : 0;  // cache slot of its first key
    // the next stage into ring stage `into`; a commit group even when past the chunk: the wait counts groups
    const auto fetch_next = [&](int into) {
        if (tf < jb.nt) gvm_attn_fetch_stage(jb, tf, step, sf, s_step, st + into * GVM_ATT_STAGE_BYTES, lane, pol);
        gvm_cp_async_commit();
        tf += GVM_ATT_SUB * step;
        sf = gvm_attn_slot_add(sf, s_stage, jb.cache_s);
    };
#pragma unroll 1
    for (int d = 0; d < GVM_ATT_STAGES - 1; ++d) fetch_next(d);
    int stage = 0;
#pragma unroll 1
    for (int tile = first; tile < jb.nt; tile += GVM_ATT_SUB * step) {
        __syncwarp();  // the stage refilled next was read by every lane in the previous step
        fetch_next(stage == 0 ? GVM_ATT_STAGES - 1 : stage - 1);
        gvm_cp_async_wait<GVM_ATT_STAGES - 1>();  // this lane's copies of the stage landed
        __syncwarp();                              // and every other lane's
        const unsigned kt = st + stage * GVM_ATT_STAGE_BYTES;
        stage = stage == GVM_ATT_STAGES - 1 ? 0 : stage + 1;

        float sc[GVM_ATT_SUB][2][4];  // raw scores q.k of sub-tile u, keys 8 nb + 2 t4 + (i & 1)
#pragma unroll
        for (int u = 0; u < GVM_ATT_SUB; ++u)
#pragma unroll
            for (int nb = 0; nb < 2; ++nb) sc[u][nb][0] = sc[u][nb][1] = sc[u][nb][2] = sc[u][nb][3] = 0.0f;
        uint4 kr[GVM_ATT_SUB][2];  // this lane's 16 B of keys 8 nb + g
#pragma unroll
        for (int u = 0; u < GVM_ATT_SUB; ++u)
#pragma unroll
            for (int nb = 0; nb < 2; ++nb) kr[u][nb] = gvm_lds_u4(kt + u * GVM_ATT_TILE_BYTES + gvm_attn_swz(nb * 8 + g, t4));
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            const uint4 a = gvm_lds_u4(qf + (s * 32 + lane) * 16);
#pragma unroll
            for (int u = 0; u < GVM_ATT_SUB; ++u)
#pragma unroll
                for (int nb = 0; nb < 2; ++nb) {
                    const uint4& k4 = kr[u][nb];
                    const unsigned kw = s == 0 ? k4.x : s == 1 ? k4.y : s == 2 ? k4.z : k4.w;
                    gvm_mma_f16(sc[u][nb], a.x, a.y, a.z, a.w, gvm_e4m3x2_to_f16x2(kw), gvm_e4m3x2_hi_to_f16x2(kw));
                }
        }
#pragma unroll
        for (int u = 0; u < GVM_ATT_SUB; ++u) {
            const int kp0 = jb.kb + (tile + u * step) * 16;
            // every query row sees every key of the sub-tile: no per-score test (the usual case)
            const bool whole = kp0 + 15 < jb.ke && kp0 + 15 <= jb.pos0 && (jb.window == 0 || kp0 > pos_hi - jb.window);
            if (!whole) {
#pragma unroll
                for (int nb = 0; nb < 2; ++nb)
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        const int key = kp0 + nb * 8 + 2 * t4 + (i & 1);
                        if (!gvm_attn_visible(jb, key, i < 2 ? p0 : p1)) sc[u][nb][i] = GVM_NEG_INF;
                    }
            }
        }
        float mx0 = GVM_NEG_INF, mx1 = GVM_NEG_INF;
#pragma unroll
        for (int u = 0; u < GVM_ATT_SUB; ++u)
#pragma unroll
            for (int nb = 0; nb < 2; ++nb) {
                mx0 = fmaxf(mx0, fmaxf(sc[u][nb][0], sc[u][nb][1]));
                mx1 = fmaxf(mx1, fmaxf(sc[u][nb][2], sc[u][nb][3]));
            }
        const gvm_attn_max x = gvm_attn_new_max(mx0, mx1, m0, m1, jb.score_scale);
        float ls0 = 0.0f, ls1 = 0.0f;
#pragma unroll
        for (int u = 0; u < GVM_ATT_SUB; ++u)
#pragma unroll
            for (int nb = 0; nb < 2; ++nb)
                gvm_attn_exp4(sc[u][nb][0], sc[u][nb][1], sc[u][nb][2], sc[u][nb][3], x, jb.score_scale, ls0, ls1);
        l0 = l0 * x.al0 + ls0;
        l1 = l1 * x.al1 + ls1;
#pragma unroll
        for (int d = 0; d < 8; ++d) {
            o[d][0] *= x.al0;
            o[d][1] *= x.al0;
            o[d][2] *= x.al1;
            o[d][3] *= x.al1;
        }
#pragma unroll
        for (int u = 0; u < GVM_ATT_SUB; ++u) {
            const unsigned pa0 = gvm_pack_f16x2(sc[u][0][0], sc[u][0][1]), pa1 = gvm_pack_f16x2(sc[u][0][2], sc[u][0][3]);
            const unsigned pa2 = gvm_pack_f16x2(sc[u][1][0], sc[u][1][1]), pa3 = gvm_pack_f16x2(sc[u][1][2], sc[u][1][3]);
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
                    gvm_mma_f16(o[4 * half + d], pa0, pa1, pa2, pa3,
                                (d & 1) ? gvm_e4m3x2_hi_to_f16x2(wa) : gvm_e4m3x2_to_f16x2(wa),
                                (d & 1) ? gvm_e4m3x2_hi_to_f16x2(wc) : gvm_e4m3x2_to_f16x2(wc));
                }
            }
        }
    }
    __syncwarp();  // the state below overwrites the ring
    gvm_attn_put_ml(st, lane, m0, m1, l0, l1);
    // o[d][0] is dim 16*t4 + d of row g, o[d][1] dim 16*t4 + 8 + d; [2], [3] row g + 8
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const unsigned row = st + ((g + 8 * hr) * GVM_ATT_OSTRIDE + 16 * t4) * 4;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int c = 2 * hr + (q >> 1), d = 4 * (q & 1);
            gvm_sts(row + q * 16, make_float4(o[d][c], o[d + 1][c], o[d + 2][c], o[d + 3][c]));
        }
    }
}

// Merge the split warps' states of one round and write part_o / part_ml.
__device__ __forceinline__ void gvm_attn_write(const gvm_ctx& c, const gvm_attn_job& jb, int round, int per_round,
                                               int split, unsigned smem) {
    const gvm_view tpo = gvm_view_of(gvm_t(c, 4));
    const gvm_view tml = gvm_view_of(gvm_t(c, 5));
    const int tok0 = gvm_ptr<const int>(gvm_t(c, 3), c.ins->arg[0] * gvm_t(c, 3).stride[0], 4)[0];
    const int h = c.ins->arg[1], j = c.ins->arg[2];
    const float v_scale = gvm_argf(c, 6);
    for (int it = c.tid; it < per_round * 16 * 16; it += 128) {  // 16 float4s of o per row
        const int rr = it >> 4, q4 = it & 15, row = rr & 15;
        const int r = (round * per_round + (rr >> 4)) * 16 + row;
        if (r >= jb.rows) continue;
        const unsigned w0 = smem + (rr >> 4) * split * GVM_ATT_WARP_BYTES;
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
        const long long at = tok * tpo.s0 + head * tpo.s1 + j * tpo.s2;
        *gvm_ptr<float4>(tpo, at + 4 * q4, 4) = make_float4(o.x * v_scale, o.y * v_scale, o.z * v_scale, o.w * v_scale);
        if (q4 == 0)
            *gvm_ptr<float2>(tml, tok * tml.s0 + head * tml.s1 + j * tml.s2, 4) =
                make_float2(mx == GVM_NEG_INF ? GVM_NEG_INF : mx * GVM_LN2, l);
    }
}

// ---- ATTN_CHUNK rounds on the warpgroup (3+ m-tiles) ----------------------------------
// A round's 64 query rows are the M of warpgroup MMAs (wgmma m64n64k16): S = Q K^T
// and O += P V for 64 keys a step. The step's K and V come once for the group
// (cp.async, raw e4m3, GVM_ATT_WG_STAGES - 1 steps ahead) and are converted once
// to f16, K as key rows of 64 dims and V transposed to dim rows of 64 keys, so
// that both are K-major operands in the 128-byte swizzle; P stays in registers
// as the second MMA's A (a D fragment is an A fragment). The per-warp path
// converts each key once per m-tile, 4 times a 64-row round, in 16 x 8 MMAs.
#ifndef GVM_ATT_WG
#define GVM_ATT_WG 1  // 0: every chunk on the per-warp path (gvm_attn_tile)
#endif
#define GVM_ATT_WG_STAGES 4
#define GVM_ATT_WG_Q 0                                  // Q f16 [64 rows][64 dims]
#define GVM_ATT_WG_K 8192                               // K f16 [64 keys][64 dims]
#define GVM_ATT_WG_VT 16384                             // V^T f16 [64 dims][64 keys], then 8 rows of ones
#define GVM_ATT_WG_RAW 25600                            // raw stages: K [64 keys][64 B], V (gvm_attn_wg_vraw)
#define GVM_ATT_WG_BYTES (GVM_ATT_WG_RAW + GVM_ATT_WG_STAGES * 8192)  // past the per-warp path's 4 areas: checked apart
// Lazy rescaling: a row's reference max m (log2 units) moves only when a step's
// scores pass it by more than GVM_ATT_WG_LAZY, so o and l are rarely rescaled; the
// probabilities stay below 2^GVM_ATT_WG_LAZY (f16 holds them at full precision) and
// the round ends on the exact max.
#ifndef GVM_ATT_WG_LAZY
#define GVM_ATT_WG_LAZY 8.0f  // 0: the eager update (every step whose max grows)
#endif

// Chunk c (dims 16 c ..) of key k's V in a raw stage's V half: in every other
// block of 8 keys the two keys of a 128-byte line swap halves, and chunks rotate
// with k / 16, so that the transposing reads (8 key blocks x 4 words of one
// chunk) hit 32 different banks.
__device__ __forceinline__ unsigned gvm_attn_wg_vraw(unsigned k, unsigned c) {
    return ((k ^ ((k >> 3) & 1)) << 6) | ((c ^ ((k >> 4) & 3)) << 4);
}

// cp.async of a step's 64 keys (first in cache slot s0, `left` of them in the
// chunk) into the raw stage at dst: thread tid copies chunks tid and tid + 128 of
// K and of V (key = chunk / 4); keys past the chunk come zero-filled. cache_s >= 64.
// The offsets are 32-bit (a cache row's bytes < 2^32, gvm_attn_chunk_args_ok): one
// wide multiply-add an address, not a 64-bit product (the fetch was 60 of a
// step's ~450 instructions).
__device__ __forceinline__ void gvm_attn_wg_fetch(const gvm_attn_job& jb, int left, int s0, unsigned dst, unsigned tid,
                                                  unsigned long long pol) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const unsigned k = (tid >> 2) + 32 * h, ch = tid & 3;
        const unsigned sl = (unsigned)gvm_attn_slot_add(s0, (int)k, jb.cache_s);
        const bool valid = (int)k < left;
        gvm_cp_async16(dst + k * 64 + ch * 16, jb.kbase + (sl * (unsigned)jb.krow + 16 * ch), valid, pol);
        gvm_cp_async16(dst + 4096 + gvm_attn_wg_vraw(k, ch), jb.vbase + (sl * (unsigned)jb.vrow + 16 * ch), valid, pol);
    }
}

// A raw stage -> the f16 K and V^T tiles (exact). Thread tid: K of key tid / 2,
// dims 32 (tid & 1) .. + 31; V of keys 8 (tid & 7) .. + 7, dims 4 (tid >> 3) .. + 3,
// the bytes of key pairs side by side (one conversion makes a V^T word).
__device__ __forceinline__ void gvm_attn_wg_convert(unsigned raw, unsigned kt, unsigned vt, unsigned tid) {
    const unsigned k = tid >> 1, h = tid & 1;
#pragma unroll
    for (int c = 0; c < 2; ++c) {
        const uint4 r = gvm_lds_u4(raw + k * 64 + (2 * h + c) * 16);
        gvm_sts(gvm_wgmma_at(kt, k, 4 * h + 2 * c), make_uint4(gvm_e4m3x2_to_f16x2(r.x), gvm_e4m3x2_hi_to_f16x2(r.x),
                                                                 gvm_e4m3x2_to_f16x2(r.y), gvm_e4m3x2_hi_to_f16x2(r.y)));
        gvm_sts(gvm_wgmma_at(kt, k, 4 * h + 2 * c + 1), make_uint4(gvm_e4m3x2_to_f16x2(r.z), gvm_e4m3x2_hi_to_f16x2(r.z),
                                                                     gvm_e4m3x2_to_f16x2(r.w), gvm_e4m3x2_hi_to_f16x2(r.w)));
    }
    const unsigned kb = tid & 7, m = tid >> 3;
    unsigned w[8];  // dims 4 m .. + 3 of key 8 kb + i
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = gvm_lds_u(raw + 4096 + gvm_attn_wg_vraw(8 * kb + i, m >> 2) + 4 * (m & 3));
    unsigned o[4][4];  // o[d][p]: dim 4 m + d of keys 8 kb + 2 p, + 1
#pragma unroll
    for (int p = 0; p < 4; ++p) {
        const unsigned lo = __byte_perm(w[2 * p], w[2 * p + 1], 0x5140), hi = __byte_perm(w[2 * p], w[2 * p + 1], 0x7362);
        o[0][p] = gvm_e4m3x2_to_f16x2(lo);
        o[1][p] = gvm_e4m3x2_hi_to_f16x2(lo);
        o[2][p] = gvm_e4m3x2_to_f16x2(hi);
        o[3][p] = gvm_e4m3x2_hi_to_f16x2(hi);
    }
#pragma unroll
    for (int d = 0; d < 4; ++d) gvm_sts(gvm_wgmma_at(vt, 4 * m + d, kb), make_uint4(o[d][0], o[d][1], o[d][2], o[d][3]));
}

// The rows' reference maxima m0, m1 moved to their exact maxima mt0, mt1 (>= m),
// o and the sums l (o[32 ..]) rescaled by 2^(m - mt). A row with no visible key
// yet (mt -inf) keeps o = 0 (its factor 2^(-inf - 0)).
__device__ __forceinline__ void gvm_attn_wg_rebase(float (&o)[36], float& m0, float& m1, float mt0, float mt1) {
    const float al0 = gvm_ex2(m0 - (mt0 == GVM_NEG_INF ? 0.0f : mt0));
    const float al1 = gvm_ex2(m1 - (mt1 == GVM_NEG_INF ? 0.0f : mt1));
    m0 = mt0;
    m1 = mt1;
#pragma unroll
    for (int j = 0; j < 9; ++j) {
        o[4 * j] *= al0;
        o[4 * j + 1] *= al0;
        o[4 * j + 2] *= al1;
        o[4 * j + 3] *= al1;
    }
}

// Rows [64 round, + 64) of the chunk over all its keys: warp w's (m, l, o) of its
// 16 rows into its state area (smem + w GVM_ATT_WARP_BYTES), as gvm_attn_write
// reads them. smem 1024-byte aligned, cache_s >= 64.
__device__ __forceinline__ void gvm_attn_wg_round(const gvm_ctx& c, const gvm_attn_job& jb, int round, bool fused,
                                                  unsigned smem) {
    const unsigned tid = gvm_opaque(c.tid), warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
    const int mt = round * 4 + (int)warp;
    if (fused)
        gvm_attn_stage_q_fused<true>(c, jb, mt, smem + GVM_ATT_WG_Q, lane, c.ins->arg[7]);
    else
        gvm_attn_stage_q<true>(c, jb, mt, smem + GVM_ATT_WG_Q);
    const int r0 = mt * 16 + (int)g, r1 = r0 + 8;
    const int p0 = r0 < jb.rows ? jb.pos0 + r0 / jb.g : -1;  // -1 sees no key
    const int p1 = r1 < jb.rows ? jb.pos0 + r1 / jb.g : -1;
    const int pos_hi = jb.pos0 + (jb.rows - 1) / jb.g;
    // m: the rows' reference maxima (lazy, log2 units); x: the thread's running maxima of its
    // raw scores (the rows' maxima are their quads' maxima); t: the raw scores past which a
    // row's reference moves
    float m0 = GVM_NEG_INF, m1 = GVM_NEG_INF, x0 = GVM_NEG_INF, x1 = GVM_NEG_INF, t0 = GVM_NEG_INF, t1 = GVM_NEG_INF;
    const float inv_scale = 1.0f / jb.score_scale;  // the thresholds in raw units (not exact: they only bound P)
    float o[36];  // o[32 + i]: the rows' sums l (P times V^T's rows of ones), in every lane of the quad
#pragma unroll
    for (int i = 0; i < 36; ++i) o[i] = 0.0f;
    // V^T's rows 64..71: ones (f16), written before the first step's barriers make them visible to the MMAs
    gvm_sts(smem + GVM_ATT_WG_VT + 8192 + tid * 8, 0x3c003c00u);
    gvm_sts(smem + GVM_ATT_WG_VT + 8192 + tid * 8 + 4, 0x3c003c00u);
    const unsigned long long pol = gvm_policy_evict_first();  // the cache is read once a step
    const unsigned long long dq = gvm_wgmma_desc(smem + GVM_ATT_WG_Q), dk = gvm_wgmma_desc(smem + GVM_ATT_WG_K),
                             dv = gvm_wgmma_desc(smem + GVM_ATT_WG_VT);
    const int steps = (jb.ke - jb.kb + 63) / 64;
    int fs = 0, sf = jb.kb % jb.cache_s;  // the next step to fetch, its first key's cache slot
    // one commit group a step, empty past the last: the wait counts groups
    const auto fetch_next = [&]() {
        if (fs < steps)
            gvm_attn_wg_fetch(jb, jb.ke - jb.kb - 64 * fs, sf, smem + GVM_ATT_WG_RAW + (fs % GVM_ATT_WG_STAGES) * 8192, tid, pol);
        gvm_cp_async_commit();
        ++fs;
        sf = gvm_attn_slot_add(sf, 64, jb.cache_s);
    };
#pragma unroll 1
    for (int d = 0; d < GVM_ATT_WG_STAGES - 1; ++d) fetch_next();
#pragma unroll 1
    for (int st = 0; st < steps; ++st) {
        fetch_next();  // into the stage converted last step: every thread passed that step's second barrier
        gvm_cp_async_wait<GVM_ATT_WG_STAGES - 1>();
        gvm_group_sync(c);  // this step's copies are in, and last step's MMAs (every warp waited) are done with the tiles
        gvm_attn_wg_convert(smem + GVM_ATT_WG_RAW + (st % GVM_ATT_WG_STAGES) * 8192, smem + GVM_ATT_WG_K,
                            smem + GVM_ATT_WG_VT, tid);
        gvm_fence_async_smem();
        gvm_group_sync(c);  // the tiles (and Q) are whole, for the MMAs' async proxy too
        float s[32];        // raw scores q.k: s[4 j + i] row g + 8 (i >> 1), key 8 j + 2 q + (i & 1)
#pragma unroll
        for (int i = 0; i < 32; ++i) s[i] = 0.0f;
        gvm_wgmma_fence();
#pragma unroll
        for (int k = 0; k < 4; ++k) gvm_wgmma_f16_n64(s, gvm_wgmma_desc_add(dq, 2 * k), gvm_wgmma_desc_add(dk, 2 * k));  // + 32 bytes a k16 step
        gvm_wgmma_commit();
        gvm_wgmma_wait<0>();
        const int kp0 = jb.kb + st * 64;
        // every query row sees every key of the step: no per-score test (the usual case)
        const bool whole = kp0 + 63 < jb.ke && kp0 + 63 <= jb.pos0 && (jb.window == 0 || kp0 > pos_hi - jb.window);
        if (!whole) {
#pragma unroll
            for (int i = 0; i < 32; ++i)
                if (!gvm_attn_visible(jb, kp0 + 8 * (i >> 2) + 2 * (int)q + (i & 1), (i & 2) ? p1 : p0)) s[i] = GVM_NEG_INF;
        }
        float mx0 = GVM_NEG_INF, mx1 = GVM_NEG_INF;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            mx0 = fmaxf(mx0, fmaxf(s[4 * j], s[4 * j + 1]));
            mx1 = fmaxf(mx1, fmaxf(s[4 * j + 2], s[4 * j + 3]));
        }
        x0 = fmaxf(x0, mx0);
        x1 = fmaxf(x1, mx1);
        // a row past its reference by more than the bound (seen by any of its lanes): every row
        // of the warp moves to its exact max and o (with l) is rescaled, as the eager update did
        // every step (with its quad's exchange of maxima, now only here and at the end)
        if (__any_sync(0xffffffffu, (mx0 > t0) | (mx1 > t1))) {
            gvm_attn_wg_rebase(o, m0, m1, gvm_attn_quad_max(x0) * jb.score_scale, gvm_attn_quad_max(x1) * jb.score_scale);
            t0 = (m0 + GVM_ATT_WG_LAZY) * inv_scale;  // -inf while the row has seen no key
            t1 = (m1 + GVM_ATT_WG_LAZY) * inv_scale;
        }
        const float mu0 = m0 == GVM_NEG_INF ? 0.0f : m0, mu1 = m1 == GVM_NEG_INF ? 0.0f : m1;  // no inf - inf
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            s[4 * j] = gvm_ex2(fmaf(s[4 * j], jb.score_scale, -mu0));
            s[4 * j + 1] = gvm_ex2(fmaf(s[4 * j + 1], jb.score_scale, -mu0));
            s[4 * j + 2] = gvm_ex2(fmaf(s[4 * j + 2], jb.score_scale, -mu1));
            s[4 * j + 3] = gvm_ex2(fmaf(s[4 * j + 3], jb.score_scale, -mu1));
        }
        unsigned p[16];  // keys 16 kb .. + 15 in p[4 kb ..]: D columns 8 (2 kb) .. and 8 (2 kb + 1) ..
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            p[i] = gvm_pack_f16x2(s[2 * i], s[2 * i + 1]);
            gvm_reg_fence(p[i]);  // packed before the fence: none written between the MMAs (ptxas would add waits)
        }
        gvm_wgmma_fence();  // o was rescaled in registers
#pragma unroll
        for (int kb = 0; kb < 4; ++kb) gvm_wgmma_f16_rs_n72(o, p[4 * kb], p[4 * kb + 1], p[4 * kb + 2], p[4 * kb + 3], gvm_wgmma_desc_add(dv, 2 * kb));
        gvm_wgmma_commit();
        gvm_wgmma_wait<0>();
    }
    gvm_cp_async_wait<0>();  // the empty groups past the last step
    gvm_group_sync(c);  // every warp is done with the tiles: the state areas overlap them
    const unsigned sa = smem + warp * GVM_ATT_WARP_BYTES;
    gvm_attn_wg_rebase(o, m0, m1, gvm_attn_quad_max(x0) * jb.score_scale, gvm_attn_quad_max(x1) * jb.score_scale);  // on the exact maxima
    gvm_attn_store_ml(sa, lane, m0, m1, o[32], o[34]);
#pragma unroll
    for (int j = 0; j < 8; ++j) {  // o[4 j + i]: row g + 8 (i >> 1), dim 8 j + 2 q + (i & 1)
        gvm_sts(sa + (g * GVM_ATT_OSTRIDE + 8 * j + 2 * q) * 4, o[4 * j]);
        gvm_sts(sa + (g * GVM_ATT_OSTRIDE + 8 * j + 2 * q + 1) * 4, o[4 * j + 1]);
        gvm_sts(sa + ((g + 8) * GVM_ATT_OSTRIDE + 8 * j + 2 * q) * 4, o[4 * j + 2]);
        gvm_sts(sa + ((g + 8) * GVM_ATT_OSTRIDE + 8 * j + 2 * q + 1) * 4, o[4 * j + 3]);
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
                    tk.stride[1] * cache_s < (1ll << 32) & tv.stride[1] * cache_s < (1ll << 32) &  // a row's offsets in 32 bits
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
#if GVM_RESCHED_PROBE > 0 && defined(__CUDA_ARCH__)
    if (c.ins->arg[0] < 0) {  // never (see GVM_RESCHED_PROBE)
        const float4* p = reinterpret_cast<const float4*>(gvm_t(c, 0).ptr);
        float4 v[GVM_RESCHED_PROBE];
#pragma unroll
        for (int i = 0; i < GVM_RESCHED_PROBE; ++i) v[i] = p[i * 64 + threadIdx.x];
        float acc = 0.f;
#pragma unroll
        for (int i = 0; i < GVM_RESCHED_PROBE; ++i) acc += v[i].x * v[i].y + v[i].z * v[i].w;
        asm volatile("st.volatile.shared.f32 [%0], %1;" ::"r"(gvm_smem_addr(c.smem)), "f"(acc) : "memory");
    }
#endif
    if (!gvm_attn_chunk_args_ok(c)) return GVM_ERR_BAD_ARGS;
    if (GVM_ATT_STOP == 1) return GVM_ERR_NONE;
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
    if (GVM_ATT_STOP == 2) return jb.nt < 0 ? GVM_ERR_BAD_ARGS : GVM_ERR_NONE;  // the row's loads kept
    const int mtiles = (jb.rows + 15) / 16;
    const int split = mtiles >= 3 ? 1 : (mtiles == 2 ? 2 : 4);  // warps per m-tile
    const int per_round = 4 / split;
    const unsigned warp = c.tid >> 5;
    const unsigned smem = gvm_smem_addr(c.smem), st = smem + warp * GVM_ATT_WARP_BYTES;
    const bool fused = gvm_t(c, 0).ndim == 2;
    if (fused && max(jb.kb, jb.pos0) < jb.ke) {  // this chunk holds new positions: their k and v first
        gvm_attn_new_keys(c, jb, c.ins->arg[7]);
        __threadfence();    // in L2 before the barrier: the ring's copies (.cg) read L2, not L1
        gvm_group_sync(c);  // the ring's copies below read them
    }
    if (GVM_ATT_STOP == 3) return jb.nt < 0 ? GVM_ERR_BAD_ARGS : GVM_ERR_NONE;
    if (GVM_ATT_WG && split == 1 && jb.cache_s >= 64 && (smem & 1023u) == 0 && c.smem_bytes >= GVM_ATT_WG_BYTES) {  // 64-row rounds on the warpgroup
        for (int round = 0; round * 4 < mtiles; ++round) {
            gvm_attn_wg_round(c, jb, round, fused, smem);
            gvm_group_sync(c);
            gvm_attn_write(c, jb, round, 4, 1, smem);
            gvm_group_sync(c);
        }
        return GVM_ERR_NONE;
    }
    for (int round = 0; round * per_round < mtiles; ++round) {
        const int mt = round * per_round + warp / split;
        if (mt < mtiles) {
            if (fused)
                gvm_attn_stage_q_fused<false>(c, jb, mt, st + GVM_ATT_AREA_BYTES, gvm_opaque(c.tid) & 31, c.ins->arg[7]);
            else
                gvm_attn_stage_q<false>(c, jb, mt, st + GVM_ATT_AREA_BYTES);
            // lane opaque: its ring offsets are not hoisted out of the persistent loop (168 registers)
            if (GVM_ATT_STOP != 4)
                gvm_attn_tile(jb, mt, warp % split, split, gvm_opaque(c.tid) & 31, st, st + GVM_ATT_AREA_BYTES);
        }
        gvm_group_sync(c);
        if (GVM_ATT_STOP == 4 || GVM_ATT_STOP == 5) return GVM_ERR_NONE;
        gvm_attn_write(c, jb, round, per_round, split, smem);
        gvm_group_sync(c);
    }
    return GVM_ERR_NONE;
}

// ---- ATTN_MERGE -------------------------------------------------------------------------
// The (token, head) pairs of tokens [a0, a0 + a1) x heads [a2, a2 + n), n = a3, or
// HQ - a2 when a3 is 0, one warp per pair, over their first a4 chunk slots (0: all
// NCH; a conversation cut into shorter chunks has more than the rest). Lane i owns
// dims 4(i % 16) .. +3 of the chunks of parity i / 16 (its u-th chunk is 2u +
// parity), whose o (16 B) it copies by cp.async into its own bytes of shared
// memory, so that no lane reads another's bytes. The scratch is shared out among
// the warps that have a pair: one warp alone holds 96 chunks a lane (192 a head)
// in flight at once, four hold 24 a lane; a head with more chunks than that goes
// in batches of that many, waited one by one. While the first batch flies the warp
// finds the head's max m and l = sum l_j exp(m_j - max) (each lane an online merge
// over chunks lane, lane + 32, ..., then a butterfly). Then the weighted sum (m_j
// read again: the scan just brought it into L1), the two parities added by one
// shuffle, the per-head norm and the gate. Within a lane the chunks add in order
// 0, 1, 2, ...: the numbers are those of one batch of every chunk.

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
    const int nt = tpo.shape[0], hq = tpo.shape[1], width = tx.shape[1];
    const int nh = c.ins->arg[3] != 0 ? c.ins->arg[3] : hq - max(head0, 0);  // 0: every head from head0 on
    const int nch = c.ins->arg[4] != 0 ? c.ins->arg[4] : tpo.shape[2];
    const bool ok = gvm_is(to, GVM_DT_BF16, 2) & gvm_aligned(to, 2, 8) & to.shape[0] == nt & to.shape[1] == hq * 64 &
                    gvm_is(tpo, GVM_DT_F32, 4) & gvm_aligned(tpo, 4, 16) & tpo.shape[3] == 64 &
                    gvm_is(tml, GVM_DT_F32, 4) & gvm_aligned(tml, 4, 8) & tml.shape[0] == nt & tml.shape[1] == hq &
                    tml.shape[2] == tpo.shape[2] & nch > 0 & nch <= tpo.shape[2] & tml.shape[3] == 2 & gvm_is(tx, GVM_DT_BF16, 2) & gvm_aligned(tx, 2, 8) &
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
    // views of the pair loop's tensors: its stores would reload every descriptor field the next pair reads
    const gvm_view vo = gvm_view_of(to), vpo = gvm_view_of(tpo), vml = gvm_view_of(tml), vx = gvm_view_of(tx);
    for (int pair = warp; pair < pairs; pair += 4) {
        const int t = tok0 + pair / nh, head = head0 + pair % nh;
        const long long po = t * vpo.s0 + head * vpo.s1 + 4 * q + (long long)par * vpo.s2;
        const long long pm = t * vml.s0 + head * vml.s1;
        const long long pmp = pm + (long long)par * vml.s2;
        const uint2 gw = *gvm_ptr<const uint2>(vx, t * vx.s0 + gate0 + head * 64 + 4 * q, 2);
        float mx = GVM_NEG_INF, l = 0.0f;
        float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int n0 = 0; n0 < per; n0 += cap) {
            const int nb = min(cap, mine - n0);  // the lane's chunks of this batch (<= 0: none)
#pragma unroll 4
            for (int u = 0; u < nb; ++u)
                gvm_cp_async16(so + 512 * u, gvm_ptr<const float4>(vpo, po + 2ll * (n0 + u) * vpo.s2, 4), true, pol);
            gvm_cp_async_commit();
            if (n0 == 0) {
#pragma unroll 4
                for (int ch = lane; ch < nch; ch += 32) {
                    const float2 v = *gvm_ptr<const float2>(vml, pm + ch * vml.s2, 4);
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
                const float m = *gvm_ptr<const float>(vml, pmp + 2ll * (n0 + u) * vml.s2, 4);
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
            *gvm_ptr<uint2>(vo, t * vo.s0 + head * 64 + 4 * q, 2) =
                make_uint2(gvm_pack_bf16x2(o.x * inv * g0, o.y * inv * g1), gvm_pack_bf16x2(o.z * inv * g2, o.w * inv * g3));
    }
    return GVM_ERR_NONE;
}
