// NVFP4 experts (isa/gvm_isa.h): EXPERT_UP, EXPERT_DOWN, EXPERT_COMBINE.
//
// EXPERT_UP / EXPERT_DOWN: out[slot, n] = sum_k x[row, k] * W[n, k] for the slots
// of an expert (row: the slot's token for UP, the slot itself for DOWN), with
// W = e2m1 code * e4m3 block scale * f32 tensor scale.
// Work list: which experts have tokens is known only on the GPU, so the items
// of a step are the experts with tokens (in GVM_EXP_LPT's order) times their row
// tiles, and the W instructions of a list take items one at a time from a
// counter that TOPK zeroed (an atomic increment), until the list runs out. An
// expert with no tokens costs no item; a worker that starts late (queued
// behind a long op in its block) finds the list taken by the running ones.
// Tiles are sized on the GPU from the experts' token counts: each expert hit
// gets its share of the W workers, weighted by its tokens (gvm_exp_weight),
// as tiles (rows rounded up to the grain a2), so that with few experts hit a
// list is one round of items of about equal time (a second round doubled the
// list's time), and at most a3 rows, so that with many hit the workers still
// even out the experts' unequal token counts.
// Tensor cores (mma m16n8k16, f16 in, f32 accumulate): M = 16 tokens, N = 8 weight
// rows, K = 16. code * block scale has at most 5 significant bits, so it is exact
// in f16; the tensor scale is applied to the f32 sums. x goes bf16 -> f16 (exact
// for |x| in [2^-14, 65504]) into a shared tile that all four warps read (many
// tokens: fetched raw by cp.async a K step ahead, converted from shared memory).
//
// Weights are tiled NVFP4 (isa/gvm_isa.h): blocks of 16 rows, K step by K step
// of 128 values, so that a warp's copy of 16 rows of a step reads one contiguous
// run of codes and one of scales (gvm_tile_row). Items start on a block (their
// rows are multiples of the grain, a multiple of 16).
//
// Each thread multiplies 64 consecutive codes (32 bytes, 4 scale blocks) of a weight
// row per 256-wide K step, which its warp's lanes fetched together by cp.async one
// step ahead into shared memory (gvm_exp_fetch), once per token chunk of up to 32
// tokens. The dot product is free to pair any k's, so
// a 32-bit word of 8 codes yields f16 pairs (c0,c2), (c4,c6), (c1,c3), (c5,c7)
// and the x tile is stored in that same order: x0 x2 x1 x3 x4 x6 x5 x7.
#pragma once
#include "common.cuh"
#include "gemm.cuh"  // the weight loads of the register path (gvm_gemm_ld_w16)

#ifndef GVM_EXPERT_REG
#define GVM_EXPERT_REG 1  // experts with few tokens stream weights through registers (0: always the shared tile)
#endif
// DOWN without a weight ring (7-8 tokens at 4,096 wide) runs on the shared tile:
// through registers alone (gvm_expr_unit) its one set streamed at half UP's rate,
// with a second MMA chain too. H200, f26dc8c, 64 KB scratch (no ring from 6), the
// list alone, 8 experts hit x 6 / 7 tokens: 60.5 / 61.6 us through registers,
// 59.2 / 60.4 with two chains, 52.4 / 52.3 on the shared tile.
#ifndef GVM_EXPR_BARE_DOWN
#define GVM_EXPR_BARE_DOWN 0  // 1: DOWN takes the ringless register path too (for A/B runs)
#endif
#ifndef GVM_EXPR_PROBE
#define GVM_EXPR_PROBE 0   // timing probes (tools/expert_bench.py --define), bits: 1 no decode, 2 no MMA, 4 no weight copies (ring),
                           // 8 nothing after staging x, 16 no item (the list's walk alone), 32 no epilogue, 64 nothing at all,
                           // 128 the argument check alone; the shared tile (many tokens): 256 no x staging in the K loop,
                           // 512 no decode nor MMA, 1024 no weight copies; 2048 the item timeline (below);
                           // 4096 x copied straight into a second tile (no staging pass, one barrier a K step),
                           // 4096 + 8192 into three, fetched two K steps ahead; 4096 + 16384 by one bulk copy a tile
#endif

// Timeline probe (GVM_EXPR_PROBE 2048, tools/expert_bench.py --timeline): thread 0 of a
// worker notes %clock64 at points of its first item and of its second call
// (GVM_EXPR_MARK, slots 0..10 of the walk's state) and, as the worker ends, writes
// them with %globaltimer at marks 0 and 10 (the clock's rate) and the item's index over
// the codes of the last local expert, 128 bytes an item: that expert must not be hit.
#if GVM_EXPR_PROBE & 2048
#define GVM_EXP_TL 128
// the marks: the scratch's last GVM_EXP_TL bytes, after the walk's state
#define GVM_EXPR_MARKS(c) reinterpret_cast<unsigned long long*>((c).smem + (c).smem_bytes - GVM_EXP_TL)
#define GVM_EXPR_MARK(c, k)                                                         \
    do {                                                                            \
        if ((c).tid == 0 && (c).again == ((k) >= 9 ? 1u : 0u)) {                    \
            unsigned long long t_;                                                  \
            asm volatile("mov.u64 %0, %%clock64;" : "=l"(t_));                     \
            GVM_EXPR_MARKS(c)[k] = t_;                                              \
            if ((k) == 0 || (k) == 10) {                                            \
                asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_));             \
                GVM_EXPR_MARKS(c)[(k) ? 12 : 11] = t_;                              \
            }                                                                       \
        }                                                                           \
    } while (0)
#else
#define GVM_EXP_TL 0
#define GVM_EXPR_MARK(c, k) \
    do {                    \
    } while (0)
#endif

#define GVM_EXP_KSTEP 256    // K per step: 4 threads x 64 codes of a weight row
#define GVM_EXP_PROW 1088    // bytes per staged pair of x rows (g, g + 8): 2 x 256 f16 + 64 pad
#define GVM_EXP_MTILE (8 * GVM_EXP_PROW)  // an m-tile of 16 token rows
#define GVM_EXP_RAWROW 512   // bytes per raw (bf16) x row of a K step
#define GVM_EXP_MAXMT 2      // m-tiles of 16 tokens per token chunk
#define GVM_EXP_ACC 4        // MMA tiles a thread accumulates: units x m-tiles
#define GVM_EXP_RAW (GVM_EXP_MAXMT * 16 * GVM_EXP_RAWROW)  // the raw x rows, just before the tile
#define GVM_EXP_RAW1 (16 * GVM_EXP_RAWROW)  // the two-unit layout's raw x rows (one m-tile), just before its tile
#define GVM_EXP_HEAD 240     // smem before the weight buffers: x row byte offsets [32], bad-row flag, mbarriers
#define GVM_EXP_BARS 144     // the two-unit layout's mbarriers: [warp][GVM_EXP_WST], 8 B each
// A unit's weights of a K step (one unit a warp, gvm_exp_fetch): for each set
// 1,152 B, its 8 rows' codes of the two tiled K steps [step][row][64 B], then
// their scales [step][row][8 B].
#define GVM_EXP_WUNIT 2304
#define GVM_EXP_WBUF (2 * 4 * GVM_EXP_WUNIT)  // two K steps of the four warps' units
// The two-unit layout (gvm_exp_bulk): a warp's weights of a K step are two
// 16-row blocks' codes and scales as they lie in the tiled layout (one bulk
// copy each): [block][codes: step][row][64 B], then [scales: step][row][8 B].
#define GVM_EXP_WPIECE 2304
#define GVM_EXP_WSTAGE (4 * 2 * GVM_EXP_WPIECE)  // a K step of the four warps
// Weight buffers a warp: H200, cacac56, the lists alone, 3 against 2: up 8 x 16 83.1 /
// 81.1 us, 32 x 16 306.2 / 297.8, 32 x 32 408.4 / 399.2; down 45.9 / 44.7, 158.5 / 157.8.
#ifndef GVM_EXP_WST
#define GVM_EXP_WST 2        // the two-unit layout's weight buffers (K steps in flight + 1), 2 or 3
#endif
#define GVM_EXP_TS 64.0f  // the tensor scale's factor: the 2^6 the decode leaves out (gvm_exp_scales)
#define GVM_TK_CODES 1024    // code bytes of a tiled block's K step: 16 rows x 64
#define GVM_TK_SCALES 128    // scale bytes of it: 16 rows x 8
#define GVM_EXP_STATE (528 + GVM_EXP_TL)  // smem at the end of the scratch: the work list's walk (gvm_expert_matmul)

// The walk's state: the scratch's last GVM_EXP_STATE bytes (gvm_expert_matmul).
__device__ __forceinline__ unsigned gvm_exp_state(const gvm_ctx& c) { return gvm_smem_addr(c.smem) + c.smem_bytes - GVM_EXP_STATE; }

// Offset of row r's first K step in tiled NVFP4 codes (row_bytes 64, block
// stride: the tensor's row-block stride) or scales (8).
__device__ __forceinline__ long long gvm_tile_row(long long r, long long block_stride, int row_bytes) {
    return (r >> 4) * block_stride + (r & 15) * row_bytes;
}

// Thread t4's word w8 (= 4 h + w) of a K step is k = 128 h + 32 t4 + 8 w ..
// + 7: in the tiled layout, 16-byte chunk t4 of a row's tiled step h, so
// that the 8 lanes of a reading phase (rows g, g + 1 64 B apart, 4 t4) hit
// distinct bank groups in the blocks as they lie (gvm_exp_ks).
// The x tile holds each m-tile's rows g and g + 8 together, as the MMA's A
// fragments: in pair row g, for thread t4's word w8, half 0 is (g: x0x2,
// g + 8: x0x2, g: x1x3, g + 8: x1x3), the first MMA's four A registers, and
// half 1 the same of x4x6 and x5x7, the second's: one lds.128 each, no
// register moves (with a row a lds.128, ptxas spent ~12 moves an m-tile and
// w8 assembling them). Byte offset in a pair row, swizzled so that both the
// 8 lanes of a reading phase (g, g + 1 x 4 t4; PROW = 64 mod 128) and of a
// writing one (gvm_exp_stage: t4 = 2j, 2j + 1 x 4 w) hit distinct 16-byte bank groups.
__device__ __forceinline__ unsigned gvm_exp_chunk(unsigned t4, unsigned w8, unsigned half) {
    return w8 * 128 + ((((t4 & 1) ^ half ^ (w8 >> 2)) & 1) << 6) + ((t4 ^ (w8 & 3)) << 4);
}

// 8 bf16 x values x0..x7 as f16 in the decode's pair order: (x0,x2) (x1,x3) (x4,x6) (x5,x7).
__device__ __forceinline__ uint4 gvm_exp_pairs(uint4 v) {
    return make_uint4(gvm_pack_f16x2(gvm_bf16_lo(v.x), gvm_bf16_lo(v.y)), gvm_pack_f16x2(gvm_bf16_hi(v.x), gvm_bf16_hi(v.y)),
                      gvm_pack_f16x2(gvm_bf16_lo(v.z), gvm_bf16_lo(v.w)), gvm_pack_f16x2(gvm_bf16_hi(v.z), gvm_bf16_hi(v.w)));
}

// x[rows of the chunk][ks * 256, + 256) as it is (bf16) into the raw buffer,
// row r at r * 512, zeros past K: cp.async, so that the next K step's x
// crosses from L2 during this step's MMAs without holding registers (x in
// registers a step ahead cost more than it hid: session 17).
__device__ __forceinline__ void gvm_exp_xfetch(const gvm_ctx& c, const unsigned char* x, unsigned s_rows, unsigned s_raw,
                                               int tm, int ks, int kdim, unsigned long long pol) {
    const int k = ks * GVM_EXP_KSTEP + (int)(c.tid & 31) * 8;
#pragma unroll 1
    for (int i = c.tid; i < tm * 32; i += 128) {
        const bool ok = k < kdim;
        gvm_cp_async16(s_raw + 16 * i, ok ? x + gvm_lds_u(s_rows + 4 * (i >> 5)) + 2 * k : x, ok, pol);
    }
    gvm_cp_async_commit();
}

// Probe 4096's x tiles (gvm_exp_mma): two of GVM_EXP_MAXMT m-tiles from the tile's place,
// or with 8192 three from the raw buffer's; gvm_expert_tile checks that they fit.
#define GVM_EXP_XD_NX (GVM_EXPR_PROBE & 8192 ? 3 : 2)
__device__ __forceinline__ unsigned gvm_exp_xd_base(unsigned s_raw, unsigned s_tile) { return GVM_EXP_XD_NX == 3 ? s_raw : s_tile; }

// Probe 4096 (timing only: the values are wrong): x's raw rows of K step ks
// copied straight into the tile at s_tile, 16 bytes where the staging would
// have put them, so that a K step has no staging pass and one group barrier:
// what an x already laid out as the tile (by its producer) would cost.
__device__ __forceinline__ void gvm_exp_xdirect(const gvm_ctx& c, const unsigned char* x, unsigned s_rows, unsigned s_tile,
                                                int tm, int ks, int kdim, unsigned long long pol) {
    const int k = ks * GVM_EXP_KSTEP + (int)(c.tid & 31) * 8;
#pragma unroll 1
    for (int i = c.tid; i < tm * 32; i += 128) {
        const int r = i >> 5, pos = ((r >> 3) & 1) * 32 + (i & 31);
        const bool ok = k < kdim;
        const unsigned dst = s_tile + (unsigned)(r >> 4) * GVM_EXP_MTILE + (unsigned)(r & 7) * GVM_EXP_PROW + 16u * pos;
        gvm_cp_async16(dst, ok ? x + gvm_lds_u(s_rows + 4 * r) + 2 * k : x, ok, pol);
    }
    gvm_cp_async_commit();
}

// The raw buffer -> f16 tile of fragment pairs (see gvm_exp_chunk), zero for
// rows past the chunk. A thread takes a word of rows g and g + 8 at once, two
// tasks at a time.
__device__ __forceinline__ void gvm_exp_stage(const gvm_ctx& c, unsigned s_raw, unsigned s_tile, int tm) {
    const int n = (tm + 15) / 16 * 8 * 32;  // (pair row, 16-byte word) tasks
    const int ch = (int)(c.tid & 31);  // the raw row's 16-byte chunk: k = 8 ch = 128 h + 32 t4 + 8 w
    const unsigned t4 = (ch >> 2) & 3, w8 = 4 * (ch >> 4) + (ch & 3);
    const unsigned o0 = gvm_exp_chunk(t4, w8, 0), o1 = gvm_exp_chunk(t4, w8, 1);
#pragma unroll 1
    for (int i0 = c.tid; i0 < n; i0 += 256) {
        uint4 v[4];  // tasks i0 and i0 + 128: rows g, g + 8 of each
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int pr = (i0 >> 5) + 4 * (u >> 1), r = (pr >> 3) * 16 + (pr & 7) + 8 * (u & 1);
            v[u] = make_uint4(0, 0, 0, 0);
            if (i0 + 128 * (u >> 1) < n && r < tm) v[u] = gvm_lds_u4(s_raw + r * GVM_EXP_RAWROW + 16 * ch);
        }
#pragma unroll
        for (int u = 0; u < 4; u += 2) {
            if (i0 + 64 * u >= n) break;
            const int pr = (i0 >> 5) + 2 * u;
            const uint4 a = gvm_exp_pairs(v[u]), b = gvm_exp_pairs(v[u + 1]);
            const unsigned row = s_tile + (unsigned)(pr >> 3) * GVM_EXP_MTILE + (unsigned)(pr & 7) * GVM_EXP_PROW;
            gvm_sts(row + o0, make_uint4(a.x, b.x, a.y, b.y));
            gvm_sts(row + o1, make_uint4(a.z, b.z, a.w, b.w));
        }
    }
}

// Code word w (8 codes) of one weight row as four scaled f16 pairs:
// p[0] = (c0,c2), p[1] = (c4,c6), p[2] = (c1,c3), p[3] = (c5,c7). The word's
// block scale is half h of the pair sp (gvm_exp_scales); h is known at
// compile time in every caller (unrolled), so the branch folds away.
__device__ __forceinline__ void gvm_exp_decode(unsigned w, unsigned sp, unsigned h, unsigned (&p)[4]) {
    unsigned ev, od;
    gvm_e2m1x8_to_e4m3(w, &ev, &od);
    const auto scaled = [&](unsigned f) { return h ? gvm_hmul2_dup<1>(f, sp) : gvm_hmul2_dup<0>(f, sp); };
    p[0] = scaled(gvm_e4m3x2_to_f16x2(ev));
    p[1] = scaled(gvm_e4m3x2_hi_to_f16x2(ev));
    p[2] = scaled(gvm_e4m3x2_to_f16x2(od));
    p[3] = scaled(gvm_e4m3x2_hi_to_f16x2(od));
}

// Scale bytes 0, 1 of sw (hi: 2, 3) as an f16 pair: two blocks' scales in one
// instruction. The decode leaves codes at 2^-6 of their value; the epilogues
// make it up in the tensor scale (GVM_EXP_TS). Every scaled code is exact in
// f16 (a multiple of 2^-16, subnormal ones included), so the MMA's products
// are exactly 2^-6 of what they were with the scales times 64: one HMUL2
// less a scale pair for the same sums up to that power of two.
__device__ __forceinline__ unsigned gvm_exp_scales(unsigned sw, bool hi) {
    return hi ? gvm_e4m3x2_hi_to_f16x2(sw) : gvm_e4m3x2_to_f16x2(sw);
}

// Expert e's tensor scale of set s (UP: 0 gate, 1 up; DOWN: 0), times the
// GVM_EXP_TS the decode leaves out.
__device__ __forceinline__ float gvm_exp_tscale(const gvm_ctx& c, int e, int s) {
    const gvm_tensor& tts = gvm_t(c, 4);
    return gvm_ptr<const float>(tts, e * tts.stride[0], 4)[s] * GVM_EXP_TS;
}

// A unit's weights of K step ks into its buffer at buf (one unit a warp),
// copied by the warp's lanes together so that each copy reads whole sectors
// and writes 16 contiguous bytes of a row (a thread copying only the 64 codes
// it multiplies read each sector half at a time: ncu, H200, session 20): lane
// l copies 16-byte chunk l & 7 of rows l / 8 and l / 8 + 4 of each set (cpa,
// cpb) and scale word l & 3 of row (l / 4) & 7 (sp), each where the tiled
// layout has it (GVM_EXP_WUNIT). A K step is two tiled ones: the lane's
// pointers hold its chunk's half of the step (see gvm_expert_tile).
// live bits (zeros where a row or K ends): 0, 1 row l / 8 of sets 0, 1; 2, 3
// row l / 8 + 4; 4, 5 the scale row. A zero-fill reads nothing, but still gets
// an address inside the tensors (zc, zs). The caller commits the group.
__device__ __forceinline__ void gvm_exp_fetch(unsigned buf, const unsigned char* cpa, const unsigned char* cpb,
                                              const unsigned char* sp, const unsigned char* zc, const unsigned char* zs,
                                              int cstep, int sstep, unsigned live, unsigned lane, int ks, int kdim,
                                              unsigned long long pol) {
    const unsigned ga = lane >> 3, c = lane & 7, gs = (lane >> 2) & 7, q = lane & 3;
    const bool ck = ks * GVM_EXP_KSTEP + 32 * (int)c < kdim, sk = ks * GVM_EXP_KSTEP + 64 * (int)q < kdim;
    const unsigned co = (c >> 2) * 512 + ga * 64 + ((c & 3) << 4), so = 1024 + (q >> 1) * 64 + gs * 8 + 4 * (q & 1);
#pragma unroll
    for (int s = 0; s < 2; ++s) {
        const bool oka = (live >> s & 1) && ck, okb = (live >> (2 + s) & 1) && ck, oks = (live >> (4 + s) & 1) && sk;
        gvm_cp_async16(buf + s * 1152 + co, oka ? cpa + ks * 2 * GVM_TK_CODES + s * cstep : zc, oka, pol);
        gvm_cp_async16(buf + s * 1152 + 256 + co, okb ? cpb + ks * 2 * GVM_TK_CODES + s * cstep : zc, okb, pol);
        gvm_cp_async4(buf + s * 1152 + so, oks ? sp + ks * 2 * GVM_TK_SCALES + s * sstep : zs, oks, pol);
    }
}

// The two-unit layout's K step ks of a warp's two blocks into its buffer at buf
// (GVM_EXP_WPIECE each), as 4 bulk copies (lanes 0..3: block l / 2, codes or
// scales by l & 1) that complete on the mbarrier bar: 2 KB and 256 B runs, where
// 12 cp.async a lane of 16 and 4 bytes cost issue slots and address registers
// (ncu, H200, session 52: 16% of the up list's stall samples at 32 x 16), and
// 16 bulk copies a warp of 512 / 64 B bound the copy engine (session 52,
// lost/expert-bulk-weights). Block b's codes at wc + b * bc, scales ws + b * bs
// (K step 0); blocks: bit b, block b is copied. A step whose second tiled half
// lies past K copies its first and zeroes the second's scales (stale codes
// times zero stay zero).
__device__ __forceinline__ void gvm_exp_bulk(unsigned buf, unsigned bar, const unsigned char* wc, const unsigned char* ws,
                                             int bc, int bs, unsigned blocks, unsigned lane, int ks, int kdim,
                                             unsigned long long pol) {
    const unsigned tsteps = ks * GVM_EXP_KSTEP + GVM_NVFP4_TILE_K < kdim ? 2u : 1u;  // kdim % 128 == 0 (args)
    if (lane == 0) gvm_bar_expect(bar, (unsigned)__popc(blocks) * tsteps * (GVM_TK_CODES + GVM_TK_SCALES));
    const unsigned b = lane >> 1;
    if (lane < 4 && (blocks >> b & 1)) {
        if (lane & 1)
            gvm_bulk_g2s(buf + b * GVM_EXP_WPIECE + 2 * GVM_TK_CODES, ws + b * bs + ks * 2 * GVM_TK_SCALES,
                         tsteps * GVM_TK_SCALES, bar, pol);
        else
            gvm_bulk_g2s(buf + b * GVM_EXP_WPIECE, wc + b * bc + ks * 2 * GVM_TK_CODES, tsteps * GVM_TK_CODES, bar, pol);
    }
    if (tsteps == 1 && lane < 16) {
        gvm_sts(buf + (lane >> 3) * GVM_EXP_WPIECE + 2 * GVM_TK_CODES + GVM_TK_SCALES + 16 * (lane & 7), make_uint4(0, 0, 0, 0));
        gvm_fence_proxy_async();  // before a later bulk copy into these bytes
    }
}

// Where a warp's weights of a K step lie in its buffer: the byte offsets of
// unit u, set s, tiled step h (codes: rows of 64 B; scales at SC, rows of 8 B).
// One unit a warp (gvm_exp_fetch): sets 1,152 B apart. Two (gvm_exp_bulk):
// UP's blocks are its sets (gate, up) and its units their rows 0-7 and 8-15;
// DOWN's blocks are its units and its sets their rows 0-7 and 8-15.
template <int CU, int CS, int CH, int SU, int SS, int SH, int SC>
struct gvm_exp_layout {
    static constexpr int cu = CU, cs = CS, ch = CH, su = SU, ss = SS, sh = SH, sc = SC;
};
using gvm_exp_one = gvm_exp_layout<0, 1152, 512, 0, 1152, 64, 1024>;
template <bool UP>
using gvm_exp_two = gvm_exp_layout<UP ? 512 : GVM_EXP_WPIECE, UP ? GVM_EXP_WPIECE : 512, 1024, UP ? 64 : GVM_EXP_WPIECE,
                                   UP ? GVM_EXP_WPIECE : 64, 128, 2 * GVM_TK_CODES>;

// One K step of a warp's MMAs: units U0 .. U0 + U - 1's weights (laid out as L)
// times the tile's MT m-tiles, into acc[u * MT + m]. Thread (g, t4) multiplies
// codes 32 t4 .. + 31 of each tiled step h of row g of each set (gvm_exp_chunk).
template <int MT, int U, class L, int U0 = 0>
__device__ __forceinline__ void gvm_exp_ks(float (&acc)[GVM_EXP_ACC][2][4], unsigned wbuf, unsigned s_tile, unsigned g,
                                           unsigned t4) {
    constexpr int A0 = U0 * MT;
    static_assert(A0 + MT * U <= GVM_EXP_ACC, "acc holds two units of two m-tiles");
    unsigned sp[U][2][2];  // the thread's 2 scales of each set and tiled step, as an f16 pair
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
        for (int s = 0; s < 2; ++s)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                sp[u][s][h] = gvm_exp_scales(gvm_lds_u16(wbuf + L::sc + (U0 + u) * L::su + s * L::ss + h * L::sh + g * 8 + 2 * t4), false);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        uint4 cw[U][2];  // chunk t4 of tiled step h of row g of each set
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int s = 0; s < 2; ++s) cw[u][s] = gvm_lds_u4(wbuf + (U0 + u) * L::cu + s * L::cs + h * L::ch + g * 64 + (t4 << 4));
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const int w8 = 4 * h + w;
            unsigned p[U][2][4];
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int s = 0; s < 2; ++s) {
                    const uint4& k4 = cw[u][s];
                    const unsigned b = w8 >> 1;
                    gvm_exp_decode(w == 0 ? k4.x : w == 1 ? k4.y : w == 2 ? k4.z : k4.w, sp[u][s][b >> 1], b & 1, p[u][s]);
                }
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                const unsigned ra = s_tile + m * GVM_EXP_MTILE + g * GVM_EXP_PROW;
                const uint4 a0 = gvm_lds_u4(ra + gvm_exp_chunk(t4, w8, 0)), a1 = gvm_lds_u4(ra + gvm_exp_chunk(t4, w8, 1));
#pragma unroll
                for (int u = 0; u < U; ++u)
#pragma unroll
                    for (int s = 0; s < 2; ++s) {
                        gvm_mma_f16(acc[A0 + u * MT + m][s], a0.x, a0.y, a0.z, a0.w, p[u][s][0], p[u][s][2]);
                        gvm_mma_f16(acc[A0 + u * MT + m][s], a1.x, a1.y, a1.z, a1.w, p[u][s][1], p[u][s][3]);
                    }
            }
        }
    }
}

// The items of an expert start their K loops at different steps (koff: the
// item's index in the expert, n0 / nn, mod the steps; wrapping around), so that its
// workers do not all read the same x lines from L2 at once: every worker of
// an expert re-reads its x each K step, and in step they queued on the same
// lines. H200, the lists alone (tools/expert_bench.py, 72 KB scratch), one
// run, staggered / not: 8 experts hit x 16 tokens up 88.1 / 96.1 us, x 32
// 141.5 / 169.7, down 59.4 / 58.9 and 76.4 / 82.1; capped items, 32 hit x 16
// up 321.6 / 327.9, down 218.8 / 225.5, the skew of 256 tokens up 402.7 /
// 414.5, down 246.1 / 249.6. In the layers, whose workers start the list at
// different times, level (two rounds of the 16- to 256-token layers: within
// 0.4%). The sums' order over K changes with koff, not from run to run.
#ifndef GVM_EXP_STAGGER
#define GVM_EXP_STAGGER 1  // 0: every item from K step 0 (for A/B runs)
#endif

// The weights of a warp's units, for gvm_exp_mma. One unit a warp (gvm_exp_fetch):
// set 0 at a / b / s (this lane's rows and scale row), set 1 cstep / sstep bytes
// on; live bits 0..5 (zeros where a row or K ends). Two (gvm_exp_bulk): block 0
// at a (codes) / s (scales), block 1 cstep / sstep bytes on; live bit b: block b
// is copied.
struct gvm_exp_src {
    const unsigned char *a, *b, *s;
    int cstep, sstep;
    unsigned live;
};

// A warp's units times the staged chunk, K step by K step, into acc. Weights
// stream through shared memory one K step ahead (one unit a warp: cp.async, the
// warp's lanes copying its unit together) or GVM_EXP_WST - 1 ahead (two units: a
// warp's two blocks by bulk copies, each buffer with its mbarrier), and so
// does x (raw, by cp.async one K step ahead: all four warps fetch it, then turn
// it into the tile at the step's start; the raw rows at s_raw). DBL: the two-unit
// layout, the second unit into the acc tiles after the first's, so that the
// staged x serves twice the rows. units: bit u, the warp's unit u has rows
// (warp-uniform).
template <bool DBL, bool UP>
__device__ __forceinline__ void gvm_exp_mma(const gvm_ctx& c, float (&acc)[GVM_EXP_ACC][2][4], const gvm_exp_src& w,
                                            unsigned units, const unsigned char* x, unsigned s_rows, unsigned s_raw,
                                            unsigned s_tile, unsigned s_wbuf, int tm, int kdim, int koff) {
    const unsigned lane = c.tid & 31, warp = c.tid >> 5, g = lane >> 2, t4 = c.tid & 3;
    const int mts = (tm + 15) / 16, steps = (kdim + GVM_EXP_KSTEP - 1) / GVM_EXP_KSTEP;
    constexpr int NST = DBL ? GVM_EXP_WST : 2;
    static_assert(NST == 2 || NST == 3, "two or three weight buffers");
    const unsigned long long pol = gvm_policy_evict_first();
    // the warp's buffer b at slot0 + b * wb; the two-unit layout's mbarrier of buffer b at bar0 + 8 b
    const unsigned slot0 = s_wbuf + warp * (DBL ? 2 * GVM_EXP_WPIECE : GVM_EXP_WUNIT);
    const unsigned wb = DBL ? GVM_EXP_WSTAGE : 4 * GVM_EXP_WUNIT;
    const unsigned bar0 = s_rows + GVM_EXP_BARS + warp * 8 * GVM_EXP_WST;
    // K step ks's weights of the warp's units into buffer b (one unit a warp: one commit group)
    const auto wfetch = [&](int b, int ks) {
        if (DBL)
            gvm_exp_bulk(slot0 + b * wb, bar0 + 8 * b, w.a, w.s, w.cstep, w.sstep, w.live, lane, ks, kdim, pol);
        else {
            gvm_exp_fetch(slot0 + b * wb, w.a, w.b, w.s, w.a, w.s, w.cstep, w.sstep, w.live, lane, ks, kdim, pol);
            gvm_cp_async_commit();
        }
    };
    constexpr bool WCOPY = !(GVM_EXPR_PROBE & 1024);
    if (DBL && WCOPY) {
        if (lane == 0)
#pragma unroll
            for (int b = 0; b < NST; ++b) gvm_bar_init(bar0 + 8 * b, 1);
        gvm_fence_proxy_async();  // the set-up barriers, seen by the copies' async proxy
        __syncwarp();  // the barriers are set up before any lane's copy counts on them
    }
    koff = GVM_EXP_STAGGER ? koff % steps : 0;
    const auto kk = [&](int ks) { return ks + koff < steps ? ks + koff : ks + koff - steps; };  // the ks-th K step taken
    // commit groups in order: (one unit a warp: W(0)), X(0), then per step (W(ks + 1)), X(ks + 1)
#pragma unroll
    for (int b = 0; b + 1 < NST; ++b)
        if (WCOPY && b < steps) wfetch(b, kk(b));
    // probe 4096: x straight into NX tiles of GVM_EXP_MAXMT m-tiles (2 from s_tile; 3 from
    // s_raw with probe 8192, fetched two K steps ahead), used in turn
    // 4096 + 16384: each tile by one bulk copy of its m-tiles from a stand-in region of x
    // (what a producer writing x as the tile, once an expert and K step, would cost), on
    // an mbarrier a tile after the weights' (s_rows + 208). The probes' code is kept out
    // of the default build by the preprocessor: there it would reschedule the kernel.
    constexpr bool XDIRECT = DBL && (GVM_EXPR_PROBE & 4096) && !(GVM_EXPR_PROBE & 256);
    constexpr int NX = GVM_EXP_XD_NX;
    const unsigned xt0 = gvm_exp_xd_base(s_raw, s_tile);
    const auto xtile = [&](int ks) { return xt0 + (unsigned)(ks % NX) * GVM_EXP_MAXMT * GVM_EXP_MTILE; };
#if GVM_EXPR_PROBE & 4096
    constexpr bool XBULK = XDIRECT && (GVM_EXPR_PROBE & 16384);
    static_assert(!XBULK || (NX == 2 && GVM_EXP_WST == 2), "probe 16384: two tiles, the x barriers after two weight buffers");
    const unsigned xbar0 = s_rows + GVM_EXP_BARS + 4 * 8 * GVM_EXP_WST;
    const auto xfill = [&](int j) {
        if constexpr (XBULK) {
            if (c.tid == 0) {
                const unsigned xbytes = (unsigned)mts * GVM_EXP_MTILE;
                const gvm_tensor& tx = gvm_t(c, 1);
                const unsigned span = (unsigned)(tx.shape[0] * tx.stride[0] * 2) - xbytes + 16u;  // x >= two tiles (checked)
                const unsigned off = ((gvm_lds_u(s_rows) + (unsigned)j * 17408u) % span) & ~15u;
                gvm_fence_proxy_async();  // the group's reads of this tile (behind the barrier) before the copy's writes
                gvm_bar_expect(xbar0 + 8u * (j & 1), xbytes);
                gvm_bulk_g2s(xtile(j), x + off, xbytes, xbar0 + 8u * (j & 1), gvm_policy_evict_normal());
            }
        } else {
            gvm_exp_xdirect(c, x, s_rows, xtile(j), tm, kk(j), kdim, gvm_policy_evict_normal());
        }
    };
    if constexpr (XBULK) {
        if (c.tid == 0) {
            gvm_bar_init(xbar0, 1);
            gvm_bar_init(xbar0 + 8, 1);
            gvm_fence_proxy_async();  // the set-up barriers, seen by the copies' async proxy
        }
    }
    if constexpr (XDIRECT) gvm_group_sync(c);  // the tiles are free of the pass before (and the x barriers set up)
#endif
    if (XDIRECT) {
#if GVM_EXPR_PROBE & 4096
        for (int j = 0; j + 1 < NX && j < steps; ++j) xfill(j);
#endif
    } else if (!(GVM_EXPR_PROBE & 256))
        gvm_exp_xfetch(c, x, s_rows, s_raw, tm, kk(0), kdim, gvm_policy_evict_normal());
    int buf = 0;
    unsigned phase = 0;  // the parity of buffer buf's current use (two-unit layout)
#pragma unroll 1
    for (int ks = 0; ks < steps; ++ks) {
        if (ks + NST - 1 < steps && WCOPY) {
            __syncwarp();  // the buffer refilled (the previous step's) was read by every lane of the warp
            wfetch(buf == 0 ? NST - 1 : buf - 1, kk(ks + NST - 1));
        }
        if (XDIRECT && NX == 3 && ks + 1 < steps)
            gvm_cp_async_wait<1>();  // this step's x; the next step's may still fly
        else if (DBL || ks + 1 >= steps)
            gvm_cp_async_wait<0>();  // this step's x (and weights, one unit a warp)
        else
            gvm_cp_async_wait<1>();  // this step's weights and x are in; the next step's weights may still fly
        if (DBL && WCOPY) gvm_bar_wait(bar0 + 8 * buf, phase);
#if GVM_EXPR_PROBE & 4096
        if constexpr (XBULK) gvm_bar_wait(xbar0 + 8u * (ks & 1), (unsigned)(ks >> 1) & 1u);
#endif
        gvm_group_sync(c);  // every thread's x and weights are in, and every warp is done with the previous tile
        const unsigned xt = XDIRECT ? xtile(ks) : s_tile;
        if (XDIRECT) {
#if GVM_EXPR_PROBE & 4096
            if (ks + NX - 1 < steps) xfill(ks + NX - 1);
#endif
        } else {
            if (!(GVM_EXPR_PROBE & 256)) gvm_exp_stage(c, s_raw, s_tile, tm);
            gvm_group_sync(c);  // the tile is whole, the raw buffer free
            if (ks + 1 < steps && !(GVM_EXPR_PROBE & 256))
                gvm_exp_xfetch(c, x, s_rows, s_raw, tm, kk(ks + 1), kdim, gvm_policy_evict_normal());
        }
        const unsigned slot = slot0 + buf * wb;
        if (++buf == NST) {
            buf = 0;
            phase ^= 1u;
        }
        if (!units || (GVM_EXPR_PROBE & 512)) continue;  // no unit of this warp (warp-uniform)
        // one w8 loop per shape: no branch between a w8's MMAs and the next
        // w8's shared loads and decode, which ptxas can then start early
        using L = gvm_exp_two<UP>;
        if (DBL && mts == 2) {  // a unit at a time (both at once spilled); ptxas loads x's fragments once for both (session 69)
            gvm_exp_ks<2, 1, L, 0>(acc, slot, xt, g, t4);
            gvm_exp_ks<2, 1, L, 1>(acc, slot, xt, g, t4);
        } else if (DBL)
            gvm_exp_ks<1, 2, L>(acc, slot, xt, g, t4);
        else if (mts == 2)
            gvm_exp_ks<2, 1, gvm_exp_one>(acc, slot, s_tile, g, t4);
        else
            gvm_exp_ks<1, 1, gvm_exp_one>(acc, slot, s_tile, g, t4);
    }
#if GVM_EXPR_PROBE & 4096
    if constexpr (XBULK) {
        gvm_group_sync(c);  // every thread has waited on the x barriers' last phases
        if (c.tid == 0) {
            gvm_bar_inval(xbar0);
            gvm_bar_inval(xbar0 + 8);
        }
    }
#endif
    if (DBL && WCOPY) {
        __syncwarp();  // every lane has waited on every barrier's last phase
        if (lane == 0)
#pragma unroll
            for (int b = 0; b < NST; ++b) gvm_bar_inval(bar0 + 8 * b);
    }
}

// Kept out of line: checking seven descriptors at once would otherwise hoist
// all their loads into registers at the top of the op.
template <bool UP>
__device__ __noinline__ bool gvm_expert_args_ok(const gvm_ctx& c) {
    const gvm_tensor& to = gvm_t(c, 0);
    const gvm_tensor& tx = gvm_t(c, 1);
    const gvm_tensor& tcd = gvm_t(c, 2);
    const gvm_tensor& tsc = gvm_t(c, 3);
    const gvm_tensor& tts = gvm_t(c, 4);
    const gvm_tensor& tmeta = gvm_t(c, 5);
    const gvm_tensor& troute = gvm_t(c, 6);
    const gvm_tensor& twork = gvm_t(c, 7);
    const int k = c.ins->arg[0], n_w = c.ins->arg[1], grain = c.ins->arg[2], cap = c.ins->arg[3];
    const int n_exp = tmeta.shape[1], kdim = tx.shape[1], nout = to.shape[1], slots = troute.shape[1];
    const int wd = UP ? 4 : 3;  // rank of codes / scales: [E, (2,) row blocks, bytes of a block]
    bool ok = gvm_is(to, UP ? GVM_DT_BF16 : GVM_DT_F32, 2) & to.shape[0] == slots &
              gvm_is(tx, GVM_DT_BF16, 2) & gvm_aligned(tx, 2, 16) &
              (long long)tx.shape[0] * tx.stride[0] * 2 < (1ll << 32) &
              gvm_is(tcd, GVM_DT_E2M1X2, wd) & gvm_aligned(tcd, 1, 16) & gvm_is(tsc, GVM_DT_E4M3, wd) &
              gvm_aligned(tsc, 1, 16) & tcd.shape[0] == n_exp & tsc.shape[0] == n_exp &
              tcd.shape[wd - 2] == (nout + GVM_NVFP4_TILE_ROWS - 1) / GVM_NVFP4_TILE_ROWS & tsc.shape[wd - 2] == tcd.shape[wd - 2] &
              tcd.shape[wd - 1] == 8 * kdim & tsc.shape[wd - 1] == kdim &
              gvm_is(tts, GVM_DT_F32, UP ? 2 : 1) & tts.shape[0] == n_exp & gvm_is(tmeta, GVM_DT_I32, 2) &
              tmeta.shape[0] == 2 & gvm_is(troute, GVM_DT_I32, 2) & troute.shape[0] == 5 &
              kdim % GVM_NVFP4_TILE_K == 0 & n_exp <= GVM_MAX_WORKLIST_EXPERTS & gvm_aligned(tmeta, 4, 4) & n_w >= 1 &
              c.ins->arg[4] >= 0 & c.ins->arg[4] <= n_w &
              grain >= 1 & cap >= 1 & grain % GVM_NVFP4_TILE_ROWS == 0 & cap % GVM_NVFP4_TILE_ROWS == 0 &
              gvm_is(twork, GVM_DT_I32, 2) & (twork.shape[1] == 2 | twork.shape[1] == 2 + GVM_MAX_WORKLIST_EXPERTS) &
              gvm_aligned(twork, 4, 8) & k >= 0 & k < twork.shape[0] &
              (UP ? c.ins->arg[5] == 0 : c.ins->arg[5] == 0 | (c.ins->arg[5] >= 1 & c.ins->arg[5] <= twork.shape[0] &
                                                                 twork.shape[1] == 2 + GVM_MAX_WORKLIST_EXPERTS)) &
              c.smem_bytes >= GVM_EXP_STATE + GVM_EXP_HEAD + GVM_EXP_WBUF + GVM_EXP_RAW + GVM_EXP_MTILE;
    // set 0 -> set 1 (the up matrix) and two row blocks on (the shared tile's second unit) must fit an int of bytes
    ok &= 2 * tcd.stride[wd - 2] < (1ll << 31) & 2 * tsc.stride[wd - 2] < (1ll << 31);
    if (UP) ok &= tcd.stride[1] < (1ll << 31) & tsc.stride[1] < (1ll << 31);
    if (UP) ok &= tcd.shape[1] == 2 & tsc.shape[1] == 2 & tts.shape[1] == 2;
    return ok;
}

#if GVM_EXPERT_REG
// ---- few tokens: weights streamed through registers (GVM_EXPERT_REG) ----------------
// The shared-memory tile (gvm_expert_tile, below) is bound by its own latency
// (one warp per SM sub-partition and group, two barriers and an x staging per
// K step: tools/expert_bench.py).
// For an expert with few tokens this one works like the bf16 GEMM: weight rows
// are the mma's M (16 per unit), the tokens its N (8), and each thread streams
// its own 16-byte chunks of codes (32 codes of rows g and g + 8) from global
// into registers, several chunks ahead, with no barrier in the K loop.
// x is converted once per item into shared memory (f16, the decode's pair
// order), where the B fragments are read. Units go to the 4 warps; fewer than
// 4 split K, their partial tiles summed in shared memory in a fixed order.
#ifndef GVM_EXPR_LOADS
#define GVM_EXPR_LOADS 6   // chunks of codes held per thread, over the sets
#endif
#define GVM_EXPR_PART 512  // one partial 16 x 8 f32 tile
#ifndef GVM_EXPR_RING
#define GVM_EXPR_RING 3    // most slots of a warp's weight ring (gvm_expr_unit_ring), at most 9 (3 ran 1-3% faster than 4 and 5)
#endif
#ifndef GVM_EXPR_RING_MIN
#define GVM_EXPR_RING_MIN 2  // fewer slots fit (many tokens' x): the weights go through registers
#endif
#define GVM_EXPR_STAGE 1280  // one piece of a ring slot: 16 rows x (64 B of codes + 8 B of scales)
#define GVM_EXPR_SLOT (2 * GVM_EXPR_STAGE)

// Byte offset of word w (8 values) of 32-value chunk ch in an x row: chunk
// pairs share a 128-byte line, words swizzled so that the 4 chunks a quad
// reads at once and 2 rows 16 bytes apart mod 128 fall in distinct banks.
__device__ __forceinline__ unsigned gvm_expr_xoff(unsigned ch, unsigned w) { return ch * 64 + 16 * (w ^ (((ch >> 1) & 1) * 2)); }

// The x row pitch (bytes): 16 mod 128 (see gvm_expr_xoff).
__device__ __forceinline__ unsigned gvm_expr_pitch(int kdim) { return (unsigned)kdim * 2 + 16; }

// Can the register path take an expert with `count` tokens? x for all of them,
// 4 partial tiles per set and a flag must fit beside the work list's state, and
// for DOWN a weight ring too (GVM_EXPR_BARE_DOWN). In 96 KB at 4,096 wide, UP and
// DOWN have 3 ring slots to 7 tokens and 2 at 8 (in 72 KB, until session 51: UP 3
// to 4 tokens, 2 at 5, none at 6-8; DOWN 2 or more to 6, the shared tile at 7-8).
__device__ __forceinline__ bool gvm_expr_fits(const gvm_ctx& c, int count, int kdim, int sets) {
    const unsigned need = (unsigned)count * gvm_expr_pitch(kdim) + 4 * sets * GVM_EXPR_PART + 16 + GVM_EXP_STATE;
    const unsigned ring = GVM_EXPR_BARE_DOWN || sets == 2 ? 0u : GVM_EXPR_RING_MIN * 4 * GVM_EXPR_SLOT;  // as nsl in gvm_expert_tile_reg
    return count <= 8 && need + ring <= c.smem_bytes;
}

// One set's loads of chunk j of this lane (rows a and b, codes and scales): a
// lane's chunks are one tiled K step apart.
__device__ __forceinline__ void gvm_expr_fill(uint4& ca, uint4& cb, unsigned& sc, const unsigned char* pa,
                                              const unsigned char* pb, const unsigned char* sa, const unsigned char* sb,
                                              int j, bool live, unsigned long long pol) {
    if (live) {
        ca = gvm_gemm_ld_w16(pa + GVM_TK_CODES * j, pol);
        cb = gvm_gemm_ld_w16(pb + GVM_TK_CODES * j, pol);
        sc = (unsigned)*reinterpret_cast<const unsigned short*>(sa + GVM_TK_SCALES * j) |
             ((unsigned)*reinterpret_cast<const unsigned short*>(sb + GVM_TK_SCALES * j) << 16);
    } else {
        ca = cb = make_uint4(0, 0, 0, 0);
        sc = 0;
    }
}

// Word w (8 codes) of a chunk (ca, cb: rows g, g + 8; sa, sb: their two
// blocks' scales, gvm_exp_scales) times x, the chunk's x word w: its first MMA
// into acc, its second into acc2 (pass the same array twice for one chain).
__device__ __forceinline__ void gvm_expr_word(float (&acc)[4], float (&acc2)[4], const uint4& ca, const uint4& cb,
                                              unsigned sa, unsigned sb, const uint4& x, int w) {
    unsigned pa[4], pb[4];
    const unsigned wa = w == 0 ? ca.x : w == 1 ? ca.y : w == 2 ? ca.z : ca.w;
    const unsigned wb = w == 0 ? cb.x : w == 1 ? cb.y : w == 2 ? cb.z : cb.w;
    if (GVM_EXPR_PROBE & 1) {  // probe: no decode (wrong sums; times the rest)
        pa[0] = wa ^ sa, pa[1] = wa >> 8, pa[2] = wa >> 16, pa[3] = wa >> 24;
        pb[0] = wb ^ sb, pb[1] = wb >> 8, pb[2] = wb >> 16, pb[3] = wb >> 24;
    } else {  // the word's scale block: half w / 2 of sa, sb
        gvm_exp_decode(wa, sa, w >> 1, pa);
        gvm_exp_decode(wb, sb, w >> 1, pb);
    }
    if (GVM_EXPR_PROBE & 2) {  // probe: no MMA (wrong sums; times the rest)
        acc[0] += __uint_as_float((pa[0] ^ pb[0] ^ pa[2] ^ pb[2] ^ x.x ^ x.y) & 0x3fffffffu);
        acc2[1] += __uint_as_float((pa[1] ^ pb[1] ^ pa[3] ^ pb[3] ^ x.z ^ x.w) & 0x3fffffffu);
    } else {
        gvm_mma_f16(acc, pa[0], pb[0], pa[2], pb[2], x.x, x.y);    // x: (x0,x2) (x1,x3) (x4,x6) (x5,x7)
        gvm_mma_f16(acc2, pa[1], pb[1], pa[3], pb[3], x.z, x.w);
    }
}

// A whole chunk (4 words; sc: its scale bytes a0 a1 b0 b1 of rows g, g + 8)
// times the x words of chunk ch, into acc and acc2 (two chains of dependent
// MMAs, not one: an MMA's latency would otherwise bound the loop).
__device__ __forceinline__ void gvm_expr_chunk(float (&acc)[4], float (&acc2)[4], const uint4& ca, const uint4& cb,
                                               unsigned sc, unsigned xrow, unsigned ch) {
    const unsigned sa = gvm_exp_scales(sc, false), sb = gvm_exp_scales(sc, true);
#pragma unroll
    for (int w = 0; w < 4; ++w) gvm_expr_word(acc, acc2, ca, cb, sa, sb, gvm_lds_u4(xrow + gvm_expr_xoff(ch, w)), w);
}

// x rows of the expert's tokens -> f16 in shared memory (gvm_expr_xoff order);
// a token's row outside x sets the flag at s_flag (zeroed before a barrier).
// A thread takes GVM_EXPR_XB words at a time: their rows (UP: looked up in
// route) first, then all their loads, then the stores, so that a batch costs
// two round trips to L2, not two a word (one token at 4,096 wide: 512 words,
// one batch; a word a pass, as before, was eight round trips in series).
#ifndef GVM_EXPR_XB
#define GVM_EXPR_XB 4
#endif
template <bool UP>
__device__ __forceinline__ void gvm_expr_stage_x(const gvm_ctx& c, unsigned s_x, unsigned char* flag, int count,
                                                 int slot0, int kdim) {
    const gvm_tensor& tx = gvm_t(c, 1);
    const int words = kdim / 8, n = count * words, nrows = tx.shape[0];
    const unsigned pitch = gvm_expr_pitch(kdim);
    const int* route = UP ? gvm_ptr<const int>(gvm_t(c, 6), slot0, 4) : nullptr;  // route[0][slot0 + t]: token t's row
    for (int i0 = c.tid; i0 < n; i0 += 128 * GVM_EXPR_XB) {
        int xr[GVM_EXPR_XB];
        uint4 v[GVM_EXPR_XB];
#pragma unroll
        for (int u = 0; u < GVM_EXPR_XB; ++u) {
            const int t = min(i0 + 128 * u, n - 1) / words;  // past n: the last word again (clamped, not predicated)
            xr[u] = UP ? route[t] : slot0 + t;
        }
#pragma unroll
        for (int u = 0; u < GVM_EXPR_XB; ++u) {
            const int i = min(i0 + 128 * u, n - 1), wd = i - (i / words) * words;
            const int r = xr[u] >= 0 && xr[u] < nrows ? xr[u] : 0;  // a bad row reads row 0 and is flagged below
            v[u] = *gvm_ptr<const uint4>(tx, (long long)r * tx.stride[0] + 8 * wd, 2);
        }
#pragma unroll
        for (int u = 0; u < GVM_EXPR_XB; ++u) {
            const int i = i0 + 128 * u, t = i / words, wd = i - t * words;
            if (i >= n) break;
            if (xr[u] < 0 || xr[u] >= nrows) {
                atomicOr(reinterpret_cast<unsigned*>(flag), 1u);
                continue;
            }
            gvm_sts(s_x + t * pitch + gvm_expr_xoff(wd >> 2, wd & 3), gvm_exp_pairs(v[u]));
        }
    }
}

// One warp's unit: rows [r0, r0 + 16) of the item (clamped to its last row
// rl), K chunks [c_beg, c_end) (c_beg a multiple of 4: a tiled K step), all
// the expert's tokens (at most 8) -> the 16 x 8 partial of each set in acc
// (rows g, g + 8; tokens 2q, 2q + 1).
template <bool UP>
__device__ __forceinline__ void gvm_expr_unit(const gvm_ctx& c, float (&acc)[2][4], int e, long long r0, long long rl,
                                              int c_beg, int c_end, int nch, unsigned xrow) {
    const unsigned long long pol = gvm_policy_evict_first();
    constexpr int SETS = UP ? 2 : 1, STEPS = GVM_EXPR_LOADS / SETS;
    const unsigned lane = c.tid & 31, g = lane >> 2, q = lane & 3;
    const gvm_tensor& tcd = gvm_t(c, 2);
    const gvm_tensor& tsc = gvm_t(c, 3);
    const int rdim = UP ? 2 : 1;
    const long long ra = min(r0 + g, rl), rb = min(r0 + g + 8, rl);
    const unsigned char *pa[SETS], *pb[SETS], *sa[SETS], *sb[SETS];
#pragma unroll
    for (int s = 0; s < SETS; ++s) {
        const long long cs = e * tcd.stride[0] + (UP ? s * tcd.stride[1] : 0) + (c_beg >> 2) * GVM_TK_CODES + 16 * (int)q;
        const long long ss = e * tsc.stride[0] + (UP ? s * tsc.stride[1] : 0) + (c_beg >> 2) * GVM_TK_SCALES + 2 * (int)q;
        pa[s] = gvm_ptr<const unsigned char>(tcd, cs + gvm_tile_row(ra, tcd.stride[rdim], 64), 1);
        pb[s] = gvm_ptr<const unsigned char>(tcd, cs + gvm_tile_row(rb, tcd.stride[rdim], 64), 1);
        sa[s] = gvm_ptr<const unsigned char>(tsc, ss + gvm_tile_row(ra, tsc.stride[rdim], 8), 1);
        sb[s] = gvm_ptr<const unsigned char>(tsc, ss + gvm_tile_row(rb, tsc.stride[rdim], 8), 1);
    }
#pragma unroll
    for (int s = 0; s < SETS; ++s) acc[s][0] = acc[s][1] = acc[s][2] = acc[s][3] = 0.0f;
    // chunk j of this lane is c_beg + q + 4 j; a batch is STEPS of them
    const int mine = (c_end - c_beg - (int)q + 3) / 4;  // chunks of this lane
    const int batches = (c_end - c_beg + 4 * STEPS - 1) / (4 * STEPS);  // uniform: mma.sync needs the warp
    uint4 CA[SETS][STEPS], CB[SETS][STEPS];
    unsigned SC[SETS][STEPS];
#pragma unroll
    for (int u = 0; u < STEPS; ++u)
#pragma unroll
        for (int s = 0; s < SETS; ++s) gvm_expr_fill(CA[s][u], CB[s][u], SC[s][u], pa[s], pb[s], sa[s], sb[s], u, u < mine, pol);
#pragma unroll 1
    for (int bt = 0; bt < batches; ++bt) {
#pragma unroll
        for (int u = 0; u < STEPS; ++u) {
            const int j = bt * STEPS + u, jn = j + STEPS;
            const unsigned ch = (unsigned)min(c_beg + (int)q + 4 * j, nch - 1);  // past the lane's end the codes are zeros
#pragma unroll
            for (int s = 0; s < SETS; ++s) {
                gvm_expr_chunk(acc[s], acc[s], CA[s][u], CB[s][u], SC[s][u], xrow, ch);
                gvm_expr_fill(CA[s][u], CB[s][u], SC[s][u], pa[s], pb[s], sa[s], sb[s], jn, jn < mine, pol);
            }
        }
    }
}

// Waits until at most n (0..7: a ring of at most 9 slots waits with nsl - 2) commit groups of this thread are pending.
__device__ __forceinline__ void gvm_cp_async_wait_n(int n) {
    switch (n) {
        case 0: gvm_cp_async_wait<0>(); break;
        case 1: gvm_cp_async_wait<1>(); break;
        case 2: gvm_cp_async_wait<2>(); break;
        case 3: gvm_cp_async_wait<3>(); break;
        case 4: gvm_cp_async_wait<4>(); break;
        case 5: gvm_cp_async_wait<5>(); break;
        case 6: gvm_cp_async_wait<6>(); break;
        default: gvm_cp_async_wait<7>(); break;
    }
}

// The unit of gvm_expr_unit with the weights streamed through a ring of nsl
// slots in this warp's shared memory (ring: its address) by cp.async, one
// commit group per slot, instead of registers: the wait for a slot is exact by
// count. In the register version ptxas gave the weight loads, the scale loads
// and the x reads of shared memory common scoreboards, so a chunk's MMAs
// waited for loads issued just before them (the SASS at 2555614: the whole
// memory latency once per chunk). A slot holds two pieces, UP the gate and up
// sets of one K step (4 chunks), DOWN two K steps; a piece is codes [16 rows]
// [64 B], then scales [16 rows][8 B]: a tiled K step as it is stored, so a
// warp's copy of a piece reads 1,024 + 128 contiguous bytes. Lane l copies row
// l / 2's half l % 2 (two 16-byte pieces of codes, one 4-byte word of scales),
// so that a lane holds two pointers; the lanes then read the fragments of rows
// g and g + 8.
// The two pieces' MMAs go to four accumulators, a piece's words alternating
// between two, word by word of both pieces: four independent chains in one
// stream. A piece at a time (one chain per piece, or two for DOWN) ran ~600
// cycles a piece with neither copies nor decode (expert_bench probe 5: the
// warp issues in order, so each MMA waited for the one before it).
// c_beg and c_end are multiples of 4 (whole tiled K steps; gvm_expert_tile_reg).
// PART: 0 the whole unit; 1 only its first nsl - 1 slots' copies, 2 the rest
// (the caller stages x between the two, so that the copies' round trip
// overlaps the staging's; each part derives its pointers itself: held
// across the staging they spilled).
// NSL: nsl as a constant (the wait a single instruction, not a branch tree on
// nsl: 8 instructions a slot), or 0 for any nsl.
template <bool UP, int PART, int NSL>
__device__ __forceinline__ void gvm_expr_unit_ring(const gvm_ctx& c, float (&acc)[2][4], int e, long long r0, long long rl,
                                                   int c_beg, int c_end, unsigned xrow, unsigned ring, int nsl_any) {
    const int nsl = NSL ? NSL : nsl_any;
    // opaque: not hoisted out of the list's item loop (spilled)
    const unsigned lane = gvm_opaque(c.tid) & 31, g = lane >> 2, q = lane & 3, half = lane & 1;
    const unsigned long long pol = gvm_policy_evict_first();
    const gvm_tensor& tcd = gvm_t(c, 2);
    const gvm_tensor& tsc = gvm_t(c, 3);
    const int rdim = UP ? 2 : 1;
    const long long row = min(r0 + (lane >> 1), rl);  // the row this lane copies
    const int first = c_beg + 2 * (int)half;          // its first chunk of a K step
    const long long kb = c_beg >> 2;                  // the unit's first tiled K step
    const unsigned char* cp = gvm_ptr<const unsigned char>(
        tcd, e * tcd.stride[0] + gvm_tile_row(row, tcd.stride[rdim], 64) + kb * GVM_TK_CODES + 32 * half, 1);
    const unsigned char* sp = gvm_ptr<const unsigned char>(
        tsc, e * tsc.stride[0] + gvm_tile_row(row, tsc.stride[rdim], 8) + kb * GVM_TK_SCALES + 4 * half, 1);
    const int cset = UP ? (int)tcd.stride[1] : 0, sset = UP ? (int)tsc.stride[1] : 0;  // set 1 (up) from set 0 (gate)
    const unsigned wofs = (lane >> 1) * 64 + 32 * half;  // this lane's codes in a piece (its scale word: 1024 + 4 lane)
    const unsigned rofs = g * 64 + 16 * q, rsofs = 1024 + g * 8 + 4 * (q >> 1);  // its fragments (row g; g + 8 is +512, +64)
    const unsigned h = 2 * (q & 1), sel = h | (h + 1) << 4 | (h + 4) << 8 | (h + 5) << 12;  // its two scale bytes each
    // x of its chunk c_beg + q + 4 j at xq + 256 j (gvm_expr_xoff): word w at + 16 w + sx (w < 2) or - sx (w >= 2),
    // the swizzle sx the same for all of them (c_beg a multiple of 4)
    const unsigned xq = xrow + (unsigned)(c_beg + (int)q) * 64, sx = 32 * ((q >> 1) & 1);
    float a[2][4], b[2][4];  // piece p: a[p] takes the first MMA of each word, b[p] the second
#pragma unroll
    for (int p = 0; p < 2; ++p)
#pragma unroll
        for (int i = 0; i < 4; ++i) a[p][i] = b[p][i] = 0.0f;
    const int steps = (c_end - c_beg + 3) / 4, slots = UP ? steps : (steps + 1) / 2;
    const unsigned size = (unsigned)nsl * GVM_EXPR_SLOT;
    // offset of the slot written next; the one read next is nsl - 1 slots behind
    unsigned wsl = PART == 2 ? (unsigned)(nsl - 1) * GVM_EXPR_SLOT : 0u;
    // slot i: K step UP ? i : 2 i + p of set UP ? p : 0 in piece p (a step past the unit's end is
    // zero-filled; past the last slot: an empty group)
    auto issue = [&](int i) {
        if (i < slots && !(GVM_EXPR_PROBE & 4)) {  // probe 4: the ring is never filled (wrong sums; times the rest)
#pragma unroll
            for (int p = 0; p < 2; ++p) {
                const int j = UP ? i : 2 * i + p, s = UP ? p : 0;
                // chunks first + 4 j and the next (c_end a multiple of 4: both live or both dead; dead ones are
                // zero-filled). A slot i < slots is live but for DOWN's second piece of an odd last step:
                // UP's is step i < steps, DOWN's first 2 i < steps. Selects and predicates on copies that are
                // always live cost a slot 394 -> 373 instructions (UP), 418 -> 407 (DOWN); the lists alone
                // ran 1.5-3.8% faster without them (H200, 9246c8b: up 15 hits x 2 tokens 123.8 -> 120.2 us)
                const bool live = UP || p == 0 || first + 4 * j < c_end;
                const unsigned char* cj = live ? cp + s * cset + GVM_TK_CODES * j : cp;
                const unsigned st = ring + wsl + p * GVM_EXPR_STAGE;
                gvm_cp_async16(st + wofs, cj, live, pol);
                gvm_cp_async16(st + wofs + 16, live ? cj + 16 : cp, live, pol);
                gvm_cp_async4(st + 1024 + 4 * lane, live ? sp + s * sset + GVM_TK_SCALES * j : sp, live, pol);
            }
        }
        gvm_cp_async_commit();
        wsl = wsl + GVM_EXPR_SLOT == size ? 0 : wsl + GVM_EXPR_SLOT;
    };
    if (PART != 2) {
#pragma unroll 1
        for (int i = 0; i < nsl - 1; ++i) issue(i);
    }
    if (PART == 1) return;
#pragma unroll 1  // 2 (ptxas then starts a slot's wait among the last one's MMAs) ran 1.7% slower at 1 x 1 (session 30)
    for (int i = 0; i < slots; ++i) {
        if (NSL)  // this lane's copies of slot i are in
            gvm_cp_async_wait<(NSL > 2 ? NSL - 2 : 0)>();
        else
            gvm_cp_async_wait_n(nsl - 2);
        __syncwarp();  // so are the other lanes', and every lane is done with the slot refilled next
        if (i == 0) GVM_EXPR_MARK(c, 5);
        const unsigned rsl = ring + (wsl + GVM_EXPR_SLOT == size ? 0 : wsl + GVM_EXPR_SLOT);  // the oldest slot
        issue(i + nsl - 1);
        uint4 ca[2], cb[2];
        unsigned sa[2], sb[2], xs[2];
#pragma unroll
        for (int p = 0; p < 2; ++p) {
            const unsigned st = rsl + p * GVM_EXPR_STAGE;
            ca[p] = gvm_lds_u4(st + rofs);
            cb[p] = gvm_lds_u4(st + rofs + 512);
            const unsigned sc = __byte_perm(gvm_lds_u(st + rsofs), gvm_lds_u(st + rsofs + 64), sel);
            sa[p] = gvm_exp_scales(sc, false);
            sb[p] = gvm_exp_scales(sc, true);
        }
        // x of the pieces' K steps (UP: one step); DOWN's second piece past the unit's end has zero codes
        // and reads the first's x (finite) rather than past the row
        xs[0] = xq + (UP ? 256u : 512u) * (unsigned)i;
        xs[1] = UP || 2 * i + 1 < steps ? xs[0] + 256u : xs[0];
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const unsigned xw = w < 2 ? 16 * w + sx : 16 * w - sx;
            const uint4 x0 = gvm_lds_u4(xs[0] + xw);
            const uint4 x1 = UP ? x0 : gvm_lds_u4(xs[1] + xw);  // UP: one K step, one x
            gvm_expr_word(a[0], b[0], ca[0], cb[0], sa[0], sb[0], x0, w);
            gvm_expr_word(a[1], b[1], ca[1], cb[1], sa[1], sb[1], x1, w);
        }
    }
    gvm_cp_async_wait<0>();  // nothing lands in the ring after the unit
    __syncwarp();
    GVM_EXPR_MARK(c, 6);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if (UP) {
            acc[0][i] = a[0][i] + b[0][i];
            acc[1][i] = a[1][i] + b[1][i];
        } else {
            acc[0][i] = (a[0][i] + b[0][i]) + (a[1][i] + b[1][i]);
        }
    }
}

// Rows [n0, n0 + nn) of expert e (count tokens at slots slot0...) through
// registers; gvm_expr_fits holds.
template <bool UP>
__device__ int gvm_expert_tile_reg(const gvm_ctx& c, int e, int n0, int nn, int count, int slot0) {
    constexpr int SETS = UP ? 2 : 1;
    const unsigned warp = c.tid >> 5, lane = c.tid & 31, g = lane >> 2, q = lane & 3;
    const int kdim = gvm_t(c, 1).shape[1], nch = kdim / 32;
    const unsigned s_x = gvm_smem_addr(c.smem), pitch = gvm_expr_pitch(kdim);
    const unsigned s_part = s_x + (unsigned)count * pitch, s_flag = s_part + 4 * SETS * GVM_EXPR_PART;
    unsigned char* flag = c.smem + (s_flag - s_x);
    // the 4 warps' weight rings after the flag, as many slots as fit before the walk's state
    const unsigned s_ring = (s_flag + 16 + 15) & ~15u;
    const int room = (int)c.smem_bytes - GVM_EXP_STATE - (int)(s_ring - s_x);
    const int nsl = min(GVM_EXPR_RING, max(0, room) / (4 * GVM_EXPR_SLOT));
    // the tensor scales (flag + 4, + 8): read now, stored once x is staged
    float ts[2] = {0.0f, 0.0f};
    if (c.tid == 0) {
        ts[0] = gvm_exp_tscale(c, e, 0);
        ts[1] = gvm_exp_tscale(c, e, UP ? 1 : 0);
        gvm_sts(s_flag, 0u);
    }
    gvm_group_sync(c);
    GVM_EXPR_MARK(c, 3);
    // x of the expert's tokens, staged once (the first pass); false if a row was bad
    const auto stage = [&](bool first) {
        if (first) {
            gvm_expr_stage_x<UP>(c, s_x, flag, count, slot0, kdim);
            if (c.tid == 0) {
                gvm_sts(s_flag + 4, ts[0]);
                gvm_sts(s_flag + 8, ts[1]);
            }
            gvm_group_sync(c);
            GVM_EXPR_MARK(c, 4);
        }
        return gvm_lds_u(s_flag) == 0u;
    };
    if (GVM_EXPR_PROBE & 8) return stage(true) ? GVM_ERR_NONE : GVM_ERR_BAD_ARGS;  // probe: the item ends once x is staged
    const unsigned xrow = s_x + (unsigned)min((int)g, count - 1) * pitch;  // the B column of token g (a valid row past count)
    const int units = (nn + 15) / 16;
    // the output of token tk, row `row` of the item, from its sums v (UP: gate, up) into to (read once); ts: the tensor scales
    const auto put = [&](const gvm_view& to, int tk, int row, const float (&v)[SETS], float ts0, float ts1) {
        const long long o = (long long)(slot0 + tk) * to.s0 + n0 + row;
        if (UP) {
            const float gv = v[0] * ts0, uv = v[SETS - 1] * ts1;
            *gvm_ptr<unsigned short>(to, o, 2) = (unsigned short)gvm_pack_bf16x2(gv / (1.0f + expf(-gv)) * uv, 0.0f);
        } else {
            *gvm_ptr<float>(to, o, 4) = v[0] * ts0;
        }
    };
#pragma unroll 1
    for (int u0 = 0; u0 < units; u0 += 4) {
        const int nu = min(4, units - u0), S = nu == 1 ? 4 : nu == 2 ? 2 : 1;  // K splits: nu * S <= 4 pieces
        const int cps = ((nch + S - 1) / S + 3) & ~3;  // whole tiled K steps of 4 chunks
        const int piece = (int)warp, pu = piece / S, ps = piece - pu * S;
        const int c_beg = ps * cps, c_end = min(nch, c_beg + cps);
        const bool ring = nsl >= GVM_EXPR_RING_MIN;
        float acc[2][4];
        if (pu < nu && ring)
            gvm_expr_unit_ring<UP, 1, 0>(c, acc, e, n0 + (u0 + pu) * 16, n0 + nn - 1, c_beg, c_end, xrow,
                                         s_ring + warp * (unsigned)nsl * GVM_EXPR_SLOT, nsl);
        if (!stage(u0 == 0)) {  // the same in every thread: read after the staging's barrier
            gvm_cp_async_wait<0>();  // nothing lands in the ring after the op
            return GVM_ERR_BAD_ARGS;
        }
        if (pu < nu) {
            if (ring && nsl == GVM_EXPR_RING)
                gvm_expr_unit_ring<UP, 2, GVM_EXPR_RING>(c, acc, e, n0 + (u0 + pu) * 16, n0 + nn - 1, c_beg, c_end, xrow,
                                                         s_ring + warp * (unsigned)nsl * GVM_EXPR_SLOT, nsl);
            else if (ring)
                gvm_expr_unit_ring<UP, 2, 0>(c, acc, e, n0 + (u0 + pu) * 16, n0 + nn - 1, c_beg, c_end, xrow,
                                             s_ring + warp * (unsigned)nsl * GVM_EXPR_SLOT, nsl);
            else
                gvm_expr_unit<UP>(c, acc, e, n0 + (u0 + pu) * 16, n0 + nn - 1, c_beg, c_end, nch, xrow);
            if (S == 1) {  // whole rows a warp: its lanes store them, no group sync (the op's next call syncs first)
                if (!(GVM_EXPR_PROBE & 32)) {  // probe: no epilogue (nothing stored; times the rest)
                    const float ts0 = gvm_lds_f(s_flag + 4), ts1 = gvm_lds_f(s_flag + 8);
                    const gvm_view to = gvm_view_of(gvm_t(c, 0));
#pragma unroll
                    for (int k = 0; k < 4; ++k) {  // acc[s][k]: row g + 8 (k / 2), token 2 q + k % 2
                        const int tk = 2 * (int)q + (k & 1), row = (u0 + pu) * 16 + (int)g + 8 * (k >> 1);
                        float v[SETS];
#pragma unroll
                        for (int s = 0; s < SETS; ++s) v[s] = 0.0f + acc[s][k];  // as the split sums below (-0 -> +0)
                        if (row < nn && tk < count) put(to, tk, row, v, ts0, ts1);
                    }
                }
            } else {
#pragma unroll
                for (int s = 0; s < SETS; ++s) {  // [16 rows][8 tokens]
                    const unsigned t = s_part + (piece * SETS + s) * GVM_EXPR_PART;
                    gvm_sts(t + (g * 8 + 2 * q) * 4, acc[s][0]);
                    gvm_sts(t + (g * 8 + 2 * q + 1) * 4, acc[s][1]);
                    gvm_sts(t + ((g + 8) * 8 + 2 * q) * 4, acc[s][2]);
                    gvm_sts(t + ((g + 8) * 8 + 2 * q + 1) * 4, acc[s][3]);
                }
            }
        }
        if (S == 1) continue;  // each warp stored its own rows (a warp with no unit in a 3-unit pass: none)
        gvm_group_sync(c);
        GVM_EXPR_MARK(c, 7);
        if (GVM_EXPR_PROBE & 32) continue;  // probe: no epilogue (nothing stored; times the rest)
        // sum the K splits in order and store; consecutive threads take consecutive rows
        const float ts0 = gvm_lds_f(s_flag + 4), ts1 = gvm_lds_f(s_flag + 8);
        const gvm_view to = gvm_view_of(gvm_t(c, 0));
        for (int i = c.tid; i < nu * 128; i += 128) {
            const int uu = i >> 7, tk = (i >> 4) & 7, r = i & 15, row = (u0 + uu) * 16 + r;
            if (row >= nn || tk >= count) continue;
            float v[SETS];
#pragma unroll
            for (int s = 0; s < SETS; ++s) {
                v[s] = 0.0f;
                for (int k = 0; k < S; ++k) v[s] += gvm_lds_f(s_part + ((uu * S + k) * SETS + s) * GVM_EXPR_PART + (r * 8 + tk) * 4);
            }
            put(to, tk, row, v, ts0, ts1);
        }
        gvm_group_sync(c);
        GVM_EXPR_MARK(c, 8);
    }
    return GVM_ERR_NONE;
}
#endif

// Rows [n0, n0 + nn) of expert e for all its tokens. UP: sets 0/1 are the gate
// and up rows of one 8-row block; DOWN: two 8-row blocks. Descriptors are
// re-read where they are used (gvm_t), not held across the K loop.
template <bool UP>
__device__ int gvm_expert_tile(const gvm_ctx& c, int e, int n0, int nn) {
    const int slots = gvm_t(c, 6).shape[1];
    const unsigned st = gvm_exp_state(c);  // its copy of route_meta
    const int count = (int)gvm_lds_u(st + 16 + 4 * e), slot0 = (int)gvm_lds_u(st + 144 + 4 * e);
    if (count == 0 || nn == 0) return GVM_ERR_NONE;  // nothing routed here: load nothing
    if (count < 0 || slot0 < 0 || slot0 + count > slots) return GVM_ERR_BAD_ARGS;
#if GVM_EXPERT_REG
    if (gvm_expr_fits(c, count, gvm_t(c, 1).shape[1], UP ? 2 : 1)) return gvm_expert_tile_reg<UP>(c, e, n0, nn, count, slot0);
#endif

    const unsigned warp = c.tid >> 5, g = (c.tid & 31) >> 2, t4 = c.tid & 3;
    const int room = c.smem_bytes - GVM_EXP_STATE - GVM_EXP_HEAD;
    const int max_tok = 16 * min(GVM_EXP_MAXMT, (room - GVM_EXP_WBUF - GVM_EXP_RAW) / GVM_EXP_MTILE);
    // Two units a warp a pass (dbl), in the two-unit layout, so that x staged once
    // serves twice the rows (up 64, down 128): up to 16 tokens in one m-tile, and
    // in chunks of 32 where two m-tiles fit (72 KB or more). H200, the lists alone
    // (tools/expert_bench.py), two units / one for chunks of 17-32 tokens: up 32
    // experts hit x 24 tokens 441 / 502 us, x 32 454 / 531, skew256 379 / 406, one
    // round 8 x 32 119 / 142; down (items of 128 rows, Tiles.expert_cap_down,
    // against one unit on 64) 32 x 16 170 / 218, x 32 219 / 286, skew256 244 / 247.
    // A warp without a second unit runs its MMAs on zeros: the warps past an
    // item's units (an item of 5-7 units), and every warp of an item of four
    // units or fewer (a down item of 64 rows, an up one of 32). 3403ea3 skipped
    // them with a branch a K step and took one unit a warp for items of four
    // units: the lists and layers ran 3-6% slower (down 32 x 32 232.5 against
    // 217.5 us, full-c32-t8 1475 against 1421); keeping the one-unit condition
    // without the branch spilled the VM kernel (8 B, the heavy cap then on). The
    // default caps (64 up, 128 down rows) make whole passes of 8 units.
    const bool dbl1 = count <= 16 && room >= GVM_EXP_WST * GVM_EXP_WSTAGE + GVM_EXP_RAW1 + GVM_EXP_MTILE;
    const bool dbl2 = max_tok == 32 && room >= GVM_EXP_WST * GVM_EXP_WSTAGE + GVM_EXP_RAW + 2 * GVM_EXP_MTILE;
    const bool dbl = dbl1 || dbl2;
    const int raw = dbl && count <= 16 ? GVM_EXP_RAW1 : GVM_EXP_RAW;
    // smem: x row offsets [32], flag, mbarriers | weight buffers | raw x rows | x tile
    const unsigned s_rows = gvm_smem_addr(c.smem), s_flag = s_rows + 128, s_wbuf = s_rows + GVM_EXP_HEAD;
    const unsigned s_tile = s_wbuf + (dbl ? GVM_EXP_WST * GVM_EXP_WSTAGE : GVM_EXP_WBUF) + raw, s_raw = s_tile - raw;
    const int unit_rows = UP ? 8 : 16, units = (nn + unit_rows - 1) / unit_rows, upp = dbl ? 8 : 4;
#if GVM_EXPR_PROBE & 16384  // the bulk probe's stand-in region: x holds two tiles
    if (dbl && gvm_t(c, 1).shape[0] * gvm_t(c, 1).stride[0] * 2 < 2 * GVM_EXP_MAXMT * GVM_EXP_MTILE) return GVM_ERR_BAD_ARGS;
#endif
#if GVM_EXPR_PROBE & 4096  // the probe's tiles fit before the walk's state
    if (dbl && (int)(gvm_exp_xd_base(s_raw, s_tile) - s_rows) + GVM_EXP_XD_NX * GVM_EXP_MAXMT * GVM_EXP_MTILE >
                   (int)c.smem_bytes - GVM_EXP_STATE)
        return GVM_ERR_BAD_ARGS;
#endif

    if (c.tid == 0) gvm_sts(s_flag, 0u);
#if GVM_EXPERT_REG
    for (int tc0 = 0; tc0 < count; tc0 += max_tok) {
        const int tm = min(max_tok, count - tc0);
#else
    // Without the register path the token chunks and the passes are one loop
    // (the same order: chunk by chunk, each chunk's passes in turn, the row
    // offsets staged at a chunk's first pass): under NVRTC 13.0 the two nested
    // loops around gvm_exp_mma's K loop spilled the kernel's own state (4 B
    // stored, 56 B loaded, an 8 B frame; the default build, which has both
    // paths, does not spill and keeps the nested loops above).
    const int passes = (units + upp - 1) / upp, chunks = (count + max_tok - 1) / max_tok;
    for (int it = 0; it < chunks * passes; ++it) {
        const int chunk = it / passes, pass = it - chunk * passes, tc0 = chunk * max_tok;
        const int tm = min(max_tok, count - tc0);
        if (pass == 0) {
#endif
        gvm_group_sync(c);  // the previous chunk is done with the row offsets and the tile
        if ((int)c.tid < tm) {
            const gvm_tensor& tx = gvm_t(c, 1);
            const int slot = slot0 + tc0 + c.tid;
            const int xr = UP ? gvm_ptr<const int>(gvm_t(c, 6), slot, 4)[0] : slot;  // x_t, or hbuf[slot]
            if (xr < 0 || xr >= tx.shape[0]) atomicOr(reinterpret_cast<unsigned*>(c.smem + 128), 1u);  // = s_flag
            gvm_sts(s_rows + 4 * c.tid, (unsigned)(xr * tx.stride[0] * 2));
        }
        gvm_fence_proxy_async();  // this thread's earlier writes of the scratch before the bulk copies into it
        gvm_group_sync(c);
        if (gvm_lds_u(s_flag)) return GVM_ERR_BAD_ARGS;
#if GVM_EXPERT_REG

        for (int pass = 0; pass * upp < units; ++pass) {
#else
        }
        {
#endif
            // the warp's units: unit (and with dbl unit + 1: UP the other half of its
            // block, DOWN the next block)
            const int unit = pass * upp + (dbl ? 2 * (int)warp : (int)warp), r0 = unit * unit_rows;
            const unsigned wunits = (unsigned)(unit < units) | (unsigned)(dbl && unit + 1 < units) << 1;
            float acc[GVM_EXP_ACC][2][4];  // [unit * m-tiles + m-tile][set] (gvm_exp_ks)
#pragma unroll
            for (int a = 0; a < GVM_EXP_ACC; ++a)
#pragma unroll
                for (int s = 0; s < 2; ++s) acc[a][s][0] = acc[a][s][1] = acc[a][s][2] = acc[a][s][3] = 0.0f;
            {
                const gvm_tensor& tcd = gvm_t(c, 2);
                const gvm_tensor& tsc = gvm_t(c, 3);
                const int r = UP ? 2 : 1;  // the row dim of codes / scales; UP's dim 1 is gate | up
                const unsigned char* x = reinterpret_cast<const unsigned char*>(gvm_t(c, 1).ptr);
                gvm_exp_src w;
                if (dbl) {
                    // the warp's blocks: UP the gate and up blocks of its rows, DOWN its units'
                    // (a warp without a unit copies nothing: any row of the item)
                    const long long ru = n0 + (unit < units ? r0 : 0);
                    w.a = gvm_ptr<const unsigned char>(tcd, e * tcd.stride[0] + gvm_tile_row(ru, tcd.stride[r], 64), 1);
                    w.s = gvm_ptr<const unsigned char>(tsc, e * tsc.stride[0] + gvm_tile_row(ru, tsc.stride[r], 8), 1);
                    w.b = w.a;
                    w.cstep = (int)tcd.stride[1];  // UP: the up matrix; DOWN: the next block
                    w.sstep = (int)tsc.stride[1];
                    w.live = UP ? (wunits & 1u) * 3u : wunits;
                    gvm_exp_mma<true, UP>(c, acc, w, wunits, x, s_rows, s_raw, s_tile, s_wbuf, tm, gvm_t(c, 1).shape[1], n0 / nn);
                } else {
                    // this lane's copy rows (gvm_exp_fetch): codes ga, ga + 4, scales gs of each set
                    const int lane = (int)(c.tid & 31), ga = lane >> 3, gs = (lane >> 2) & 7, s1 = UP ? 0 : 8;
                    // rows past the instruction point at its last (zero-filled: live)
                    const long long ra = n0 + min(r0 + ga, nn - 1), rb = n0 + min(r0 + ga + 4, nn - 1), rs = n0 + min(r0 + gs, nn - 1);
                    // chunk lane & 7 of a 256-wide K step: tiled step (lane & 7) / 4; scale word lane & 3: step (lane & 3) / 2
                    const long long ce = e * tcd.stride[0] + ((lane & 7) >> 2) * GVM_TK_CODES + 16 * (lane & 3);
                    const long long se = e * tsc.stride[0] + ((lane & 3) >> 1) * GVM_TK_SCALES + 4 * (lane & 1);
                    w.a = gvm_ptr<const unsigned char>(tcd, ce + gvm_tile_row(ra, tcd.stride[r], 64), 1);
                    w.b = gvm_ptr<const unsigned char>(tcd, ce + gvm_tile_row(rb, tcd.stride[r], 64), 1);
                    w.s = gvm_ptr<const unsigned char>(tsc, se + gvm_tile_row(rs, tsc.stride[r], 8), 1);
                    // set 1: UP the up matrix, DOWN 8 rows on in the same block (units start on a block)
                    w.cstep = (int)(UP ? tcd.stride[1] : 8 * 64);
                    w.sstep = (int)(UP ? tsc.stride[1] : 8 * 8);
                    w.live = unit < units ? (unsigned)(r0 + ga < nn) | (unsigned)(r0 + ga + s1 < nn) << 1 |
                                                (unsigned)(r0 + ga + 4 < nn) << 2 | (unsigned)(r0 + ga + 4 + s1 < nn) << 3 |
                                                (unsigned)(r0 + gs < nn) << 4 | (unsigned)(r0 + gs + s1 < nn) << 5
                                          : 0u;
                    gvm_exp_mma<false, UP>(c, acc, w, wunits, x, s_rows, s_raw, s_tile, s_wbuf, tm, gvm_t(c, 1).shape[1], n0 / nn);
                }
            }
            if (unit >= units) continue;
            // acc[a][s][i]: unit + u, token 16m + g (+8 for i >= 2), weight row 2*t4 + (i & 1)
            // of block s, a = u * (the m-tiles) + m (gvm_exp_ks; u = 1: dbl only)
            const gvm_view to = gvm_view_of(gvm_t(c, 0));
            const float ts0 = gvm_exp_tscale(c, e, 0), ts1 = gvm_exp_tscale(c, e, UP ? 1 : 0);
            const int mts = (tm + 15) / 16;
#pragma unroll
            for (int a = 0; a < GVM_EXP_ACC; ++a) {
                if (a >= (dbl ? 2 : 1) * mts) continue;
                const int u = dbl && mts == 2 ? a >> 1 : dbl ? a : 0, m = a - u * mts, un = unit + u;
                if (un >= units) continue;
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int tok = m * 16 + g + 8 * (i >> 1), col = 2 * t4 + (i & 1);
                    if (tok >= tm) continue;
                    const long long orow = (long long)(slot0 + tc0 + tok) * to.s0 + n0;
                    if (UP) {
                        const int lc = un * 8 + col;
                        if (lc >= nn) continue;
                        const float gv = acc[a][0][i] * ts0, uv = acc[a][1][i] * ts1;
                        *gvm_ptr<unsigned short>(to, orow + lc, 2) = (unsigned short)gvm_pack_bf16x2(gv / (1.0f + expf(-gv)) * uv, 0.0f);
                    } else {
#pragma unroll
                        for (int s = 0; s < 2; ++s) {
                            const int lc = un * 16 + 8 * s + col;
                            if (lc < nn) *gvm_ptr<float>(to, orow + lc, 4) = acc[a][s][i] * ts0;
                        }
                    }
                }
            }
        }
    }
    return GVM_ERR_NONE;
}

// An expert's share of a list's workers, in quarters, by its token count: an
// item's time for the same rows grows with its tokens (the register path's
// weight ring gets fewer slots, then none, as x grows; more tokens take the
// shared tile: gvm_expr_fits). With equal shares the heaviest expert's items
// set the list's end (~1.5-2x the others'). The weights are the ISA's
// (GVM_EXPERT_SHARE_*), which gpuvm/opspec.py expert_weight reads too. They
// were fitted to a model of the one-round lists over the sweep's route_meta:
// an item's time a + b * rows by its tokens, from the lists alone
// (tools/expert_bench.py, 0caa460: b against that at 1-4 tokens, UP 1.1x at
// 5-8, 1.7x at 9-16; DOWN 1.0x at 5-6, 1.9x at 7-8, 2.1x at 9-16; a 10-26 us).
// The rounding of rows to whole tiles makes the best weights coarser than
// those ratios. H200, bac33a3, two rounds against 4 / 5 / 7
// to 3 / 5 tokens: full-c16-t1 447, 449 against 485, 489 us; sliding-c1-t8
// 245, 246 against 254, 255; full-c1-t8 233, 234 against 240, 240; steps level.
#ifndef GVM_EXP_WEIGHTED
#define GVM_EXP_WEIGHTED 1  // 0: every expert hit an equal share (for A/B runs; the CPU backend then sizes other items)
#endif
__device__ __forceinline__ unsigned gvm_exp_weight(int count) {
    if (!GVM_EXP_WEIGHTED) return count > 0 ? 4u : 0u;
    return count <= 0 ? 0u
         : count <= GVM_EXPERT_SHARE_T1 ? GVM_EXPERT_SHARE_W1
         : count <= GVM_EXPERT_SHARE_T2 ? GVM_EXPERT_SHARE_W2 : GVM_EXPERT_SHARE_W3;
}

// One item per call (GVM_AGAIN for the next). The items are each expert's
// rows in tiles, expert by expert (GVM_EXP_LPT's order): an expert with tokens gets q tiles at most,
// its weighted share of the a1 workers (gvm_exp_weight), of rows rounded up to
// the grain a2 and at most a3 (gpuvm/opspec.py expert_items): with few
// experts hit the list is one round of the workers and its items take about
// the same time. Thread 0 takes item i from the list's counter work[a0][0]
// and passes it through the scratch's last GVM_EXP_STATE bytes: two slots used
// in turn (call k writes and reads slot k & 1, whose last readers, of call
// k - 2, are behind the barriers of call k - 1; DOWN's wait below passes its
// verdict through the other), a word (st + 8: UP the last item's expert and
// rows, DOWN the experts seen done), the items done before this
// worker's last one, then each expert's token count and first slot
// (route_meta, read once by the first call while its claim is in flight, so
// that an item starts without a round trip for them), the end of its run of
// items and its tiles' rows.
// With a4 > 0 the worker takes items a4 - 1, a4 - 1 + W, ... instead (a
// fixed round robin, the static schedule that the claims are measured against)
// and counts them the same way.
// Completion: a worker counts each finished item in work[a0][1] (acq_rel,
// after a group barrier) with the same 64-bit atomic that claims its next
// item in work[a0][0] (one round trip between items, not two); UP also adds
// the item's rows to its expert's count work[a0][2 + e] (release, fire and
// forget) where work has those columns. The one that draws i = items (every
// item taken) returns GVM_SIGNAL_N(1), the one that finishes the last item
// GVM_SIGNAL_N(a1 - 1) (or a1 if it did both): the list's consumers wait for
// its items, not for its slowest worker, which may still be queued behind
// another op of its block (H200 trace at 18420e1: 31 us of a one-token
// layer). The others signal nothing; an empty list is completed by its first
// worker. A down list that waits for just the 1 (a5 = j + 1, Tiles.down_early)
// starts while the up list's last items run: each of its items first waits,
// thread 0 polling, for its expert's count of list j to reach hbuf's width
// (the first call reads all 32 counts, so an expert done by then costs
// nothing). Those rows belong to items already taken by running workers that
// wait for nothing, so the wait ends; GVM_LIST_WAIT_NS bounds it anyway.
#ifndef GVM_LIST_SIGNAL
#define GVM_LIST_SIGNAL 1  // 0: every worker signals one when it finds the list taken (for A/B runs)
#endif

// The walk's order of the experts' runs of items, the longest items first so that the
// last ones claimed are short (an item's time grows with its expert's tokens: the
// shared tile repeats its K loop for each chunk of 32): 2 (the default) by chunks of
// 32 tokens, the most first, ties (every expert of up to 32 tokens among them) in
// expert order; 1 by tokens; 0 expert order. Item i maps to other rows of the same
// experts; every output element still comes from one item, in one order.
// H100, 2 and 1 against 0, two rounds of three reschedule draws each at c2fab76 (in
// parentheses: two rounds of two at d627264): step 32x8 -1.1% (-1.2%) and -1.4% (-1.7%), 16x8 -0.0% (+0.1%)
// and +0.5% (+0.6%); sliding-c32-t8 +1.0% (+0.8%) and -0.6% (-0.8%), sliding-c16-t8
// -1.3% (-1.2%) and -2.1% (-2.1%), full-c16-t8 -0.6% (-0.2%) and +1.4% (+1.3%),
// full-c32-t8 +0.2% and +0.3%, full-c32-t1 -0.2% and +0.5%. By chunks: no change to a
// list without an expert of more than 32 tokens, and the steps' best sum.
#ifndef GVM_EXP_LPT
#define GVM_EXP_LPT 2
#endif

// DOWN's wait for an expert's rows (a5 > 0): a wait this long means a failed
// up list (its error is then the launch's first) or a corrupt work table.
#define GVM_LIST_WAIT_NS 1000000000ull

template <bool UP>
__device__ int gvm_expert_matmul(const gvm_ctx& c) {
    if (GVM_EXPR_PROBE & 64) return GVM_ERR_NONE;  // probe: the op does nothing (times the launch and the runtime)
    const unsigned st = gvm_exp_state(c);
    GVM_EXPR_MARK(c, 0);
    if (c.again == 0) {
        if (!gvm_expert_args_ok<UP>(c)) return GVM_ERR_BAD_ARGS;
        GVM_EXPR_MARK(c, 1);
        if (GVM_EXPR_PROBE & 128) return GVM_ERR_NONE;  // probe: the argument check alone
        if (c.tid < 32) {  // the claim and the meta reads go out together
            const gvm_tensor& tw = gvm_t(c, 7);
            const gvm_tensor& tm = gvm_t(c, 5);
            const unsigned lane = c.tid;
            unsigned claim = 0;
            const int fixed = c.ins->arg[4];  // > 0: worker fixed - 1 of a fixed round robin, nothing claimed
            if (lane == 0) claim = fixed > 0 ? (unsigned)(fixed - 1) : atomicAdd(gvm_ptr<unsigned>(tw, c.ins->arg[0] * tw.stride[0], 4), 1u);
            const bool live = (int)lane < tm.shape[1];
            const int count = live ? gvm_ptr<const int>(tm, lane, 4)[0] : 0;
            const int first = live ? gvm_ptr<const int>(tm, tm.stride[0] + lane, 4)[0] : 0;
            const unsigned wt = gvm_exp_weight(count);
            unsigned wsum = wt;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) wsum += __shfl_xor_sync(0xffffffffu, wsum, o);
            const int nout = gvm_t(c, 0).shape[1], grain = c.ins->arg[2];
            const int q = max(1, c.ins->arg[1] * (int)wt / max(1, (int)wsum));
            const int heavy_t = c.ins->arg[6];
            const bool heavy = heavy_t > 0 && count > heavy_t;  // half the cap (isa/gvm_isa.h, a6)
            const int cap = heavy ? max(grain, c.ins->arg[3] / (2 * grain) * grain) : c.ins->arg[3];
            const int rows = wt ? min(cap, ((nout + q - 1) / q + grain - 1) / grain * grain) : 0;
            const int n_items = wt ? (nout + rows - 1) / rows : 0;
            // the experts' runs in walk order (GVM_EXP_LPT): lane r takes the run of expert
            // er, ranked r (passed through the ends' words before they are written)
            int er = (int)lane;
            if (GVM_EXP_LPT) {
                const int key = GVM_EXP_LPT == 2 ? (count + 31) >> 5 : count;
                // keys of 0 and 1 alone (no expert of more than 32 tokens, by chunks): the ones, then the
                // zeros, each in lane order, from two ballots instead of 32 shuffles
                int rank = 0;
                if (__ballot_sync(0xffffffffu, key > 1) == 0u) {
                    const unsigned ones = __ballot_sync(0xffffffffu, key == 1), below = (1u << lane) - 1u;
                    rank = key == 1 ? __popc(ones & below) : __popc(ones) + __popc(~ones & below);
                } else {
#pragma unroll 4
                    for (int j = 0; j < 32; ++j) {
                        const int kj = __shfl_sync(0xffffffffu, key, j);
                        rank += (kj > key) | ((kj == key) & (j < (int)lane));
                    }
                }
                gvm_sts(st + 272 + 4 * rank, lane);
                __syncwarp();
                er = (int)gvm_lds_u(st + 272 + 4 * lane);
                __syncwarp();  // every lane has read its word before the ends overwrite them
            }
            int end = __shfl_sync(0xffffffffu, n_items, er);
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int v = __shfl_up_sync(0xffffffffu, end, o);
                if ((int)lane >= o) end += v;
            }
            gvm_sts(st + 16 + 4 * lane, (unsigned)count);
            gvm_sts(st + 144 + 4 * lane, (unsigned)first);
            gvm_sts(st + 272 + 4 * lane, (unsigned)end | (unsigned)er << 24);  // at most 32 x 8,192 items
            gvm_sts(st + 400 + 4 * lane, (unsigned)rows);
            if (!UP) {  // the experts whose rows of list a5 - 1 are all done (a5 = 0: hbuf is whole already)
                const int after = c.ins->arg[5];
                unsigned ready = 0xffffffffu;
                if (after > 0) {
                    const unsigned v = gvm_ld_acquire(gvm_ptr<const unsigned>(tw, (after - 1) * tw.stride[0] + 2 + lane, 4));
                    ready = __ballot_sync(0xffffffffu, gvm_reached(v, (unsigned)gvm_t(c, 1).shape[1]));
                }
                if (lane == 0) gvm_sts(st + 8, ready);
            }
            if (lane == 0) gvm_sts(st, claim);
        }
    } else {
        gvm_group_sync(c);  // the last item's stores, before thread 0 counts it done
        if (c.tid == 0) {  // items done (high word) and the next claim (low word)
            const gvm_tensor& tw = gvm_t(c, 7);
            unsigned long long* w = gvm_ptr<unsigned long long>(tw, c.ins->arg[0] * tw.stride[0], 4);
            const int fixed = c.ins->arg[4];
            const unsigned long long add = (fixed > 0 ? 0ull : 1ull) | 1ull << 32;
            unsigned long long old;
            if (UP && tw.shape[1] != 2) {  // and the last item's rows of its expert (st + 8: expert | rows << 8)
                const unsigned last = gvm_lds_u(st + 8);
                old = gvm_release_add2(gvm_ptr<unsigned>(tw, c.ins->arg[0] * tw.stride[0] + 2 + (last & 255u), 4), last >> 8, w, add);
            } else {
                old = gvm_atom_add_acq_rel_u64(w, add);
            }
            gvm_sts(st + 4 * (c.again & 1), fixed > 0 ? (unsigned)(fixed - 1) + c.again * (unsigned)c.ins->arg[1] : (unsigned)old);
            gvm_sts(st + 12, (unsigned)(old >> 32));
        }
    }
    gvm_group_sync(c);
    const int i = (int)gvm_lds_u(st + 4 * (c.again & 1));
    // item i's run: the runs that end at or before i come before it (each warp finds it itself)
    const unsigned run = gvm_lds_u(st + 272 + 4 * (c.tid & 31));  // lane r: run r's end | its expert << 24
    const int end = (int)(run & 0xffffffu);
    const int items = __shfl_sync(0xffffffffu, end, 31), r = __popc(__ballot_sync(0xffffffffu, end <= i));
    const int start = __shfl_sync(0xffffffffu, end, max(r - 1, 0));
    GVM_EXPR_MARK(c, 2);
    GVM_EXPR_MARK(c, 9);
#if GVM_EXPR_PROBE & 2048
    if (c.tid == 0 && c.again == 0) GVM_EXPR_MARKS(c)[13] = (unsigned)i;
    if (c.again == 1) {
        GVM_EXPR_MARK(c, 10);
        const unsigned long long* m = GVM_EXPR_MARKS(c);
        if (c.tid == 0 && m[13] < (unsigned long long)items) {  // the worker's first call had an item
            const gvm_tensor& tcd = gvm_t(c, 2);
            unsigned long long* o = gvm_ptr<unsigned long long>(tcd, (tcd.shape[0] - 1) * tcd.stride[0] + 128ll * (long long)m[13], 1);
            for (int k = 0; k < 16; ++k) o[k] = m[k];
        }
    }
#endif
    if (!GVM_LIST_SIGNAL && i >= items) return GVM_ERR_NONE;
    // 1 for the draw of i = items (every item taken), W - 1 for finishing the last item
    if (c.again != 0 && (int)gvm_lds_u(st + 12) + 1 == items) return GVM_SIGNAL_N(c.ins->arg[1] - 1 + (i == items));
    if (i >= items) return GVM_SIGNAL_N(i != items ? 0 : items == 0 ? c.ins->arg[1] : 1);
    const int e = (int)((unsigned)__shfl_sync(0xffffffffu, run, r) >> 24);  // the run's expert
    const int rows = (int)gvm_lds_u(st + 400 + 4 * e), row0 = (i - (r > 0 ? start : 0)) * rows;
    const int nn = min(rows, gvm_t(c, 0).shape[1] - row0);
    if (UP && c.tid == 0) gvm_sts(st + 8, (unsigned)e | (unsigned)nn << 8);  // counted in the next call
    if (GVM_EXPR_PROBE & 16) return GVM_AGAIN;  // probe: items taken, none computed (times the list's walk)
    if (!UP) {
        const unsigned ready = gvm_lds_u(st + 8);  // read by every thread after the walk's barrier
        if (!(ready >> e & 1u)) {  // e's rows of list a5 - 1 not yet seen done: wait for them (thread 0)
            const unsigned ok = st + 4 * ((c.again + 1) & 1);  // the claim slot this call does not use
            if (c.tid == 0) {
                const gvm_tensor& tw = gvm_t(c, 7);
                const unsigned* n = gvm_ptr<const unsigned>(tw, (c.ins->arg[5] - 1) * tw.stride[0] + 2 + e, 4);
                gvm_sts(ok, gvm_poll_reached(n, (unsigned)gvm_t(c, 1).shape[1], GVM_LIST_WAIT_NS) ? 1u : 0u);
            }
            gvm_group_sync(c);
            if (!gvm_lds_u(ok)) return GVM_ERR_WATCHDOG;
            if (c.tid == 0) gvm_sts(st + 8, ready | 1u << e);  // past the barrier: every thread has read the mask
        }
    }
    const int rc = gvm_expert_tile<UP>(c, e, row0, nn);
    return rc != GVM_ERR_NONE ? rc : GVM_AGAIN;
}

__device__ int gvm_op_expert_up(const gvm_ctx& c) { return gvm_expert_matmul<true>(c); }
__device__ int gvm_op_expert_down(const gvm_ctx& c) { return gvm_expert_matmul<false>(c); }

// EXPERT_COMBINE: fsq[t] = bf16(sum over local picks k of w_k * rms(y[slot_k])).
// Per token: one pass for the sums of squares of the live picks' rows (a single
// group reduction of 8 values), one pass for the weighted sum. Picks of other
// shards (slot -1) cost nothing: a token's slots and weights sit in lanes 0..7
// of every warp and reach the loop by shuffle, and each live row is read
// GVM_COMB_BATCH float4s per thread at a time, all in flight together.
#define GVM_COMB_BATCH 8  // float4 loads in flight per thread for the sums of squares
#define GVM_COMB_ACC 4    // float4 sums per thread in the weighted pass (accumulators + loads fit)

// w / rms of pick k's row, from the four warps' sums of squares at buf.
__device__ __forceinline__ float gvm_comb_coef(unsigned buf, int k, float w, int hdim) {
    const float s = (gvm_lds_f(buf + k * 4) + gvm_lds_f(buf + 32 + k * 4)) + (gvm_lds_f(buf + 64 + k * 4) + gvm_lds_f(buf + 96 + k * 4));
    return w / sqrtf(s / (float)hdim + GVM_RMS_EPS);
}

// a += coef * v over this thread's float4s i0 + 128 u below n4.
__device__ __forceinline__ void gvm_comb_add(float4 (&a)[GVM_COMB_ACC], const float4 (&v)[GVM_COMB_ACC], float coef, int i0, int n4) {
#pragma unroll
    for (int u = 0; u < GVM_COMB_ACC; ++u) {
        if (i0 + 128 * u >= n4) continue;
        a[u].x = fmaf(coef, v[u].x, a[u].x);
        a[u].y = fmaf(coef, v[u].y, a[u].y);
        a[u].z = fmaf(coef, v[u].z, a[u].z);
        a[u].w = fmaf(coef, v[u].w, a[u].w);
    }
}

// Takes the first live pick off left and returns it (none if left is empty).
__device__ __forceinline__ int gvm_comb_next(unsigned& left, int none) {
    const int k = left != 0 ? __ffs(left) - 1 : none;
    left &= left - 1;
    return k;
}

__device__ int gvm_op_expert_combine(const gvm_ctx& c) {
    const gvm_tensor& tf = gvm_t(c, 0);
    const gvm_tensor& ty = gvm_t(c, 1);
    const gvm_tensor& troute = gvm_t(c, 2);
    const int tok0 = c.ins->arg[0], ntok = c.ins->arg[1];
    const int nt = tf.shape[0], hdim = tf.shape[1];
    const bool ok = gvm_is(tf, GVM_DT_BF16, 2) & gvm_aligned(tf, 2, 8) & gvm_is(ty, GVM_DT_F32, 2) &
                    gvm_aligned(ty, 4, 16) & ty.shape[0] == GVM_TOPK * nt & ty.shape[1] == hdim & hdim % 4 == 0 &
                    (long long)ty.shape[0] * ty.stride[0] < (1ll << 31) & gvm_is(troute, GVM_DT_I32, 2) &
                    troute.shape[0] == 5 & troute.shape[1] == GVM_TOPK * nt & tok0 >= 0 & ntok >= 0 &
                    tok0 + ntok <= nt & c.smem_bytes >= 256;
    if (!ok) return GVM_ERR_BAD_ARGS;
    const unsigned warp = c.tid >> 5, lane = c.tid & 31;
    const unsigned red = gvm_smem_addr(c.smem);  // [2 phases][4 warps][8] f32
    const float4* y = reinterpret_cast<const float4*>(ty.ptr);
    const int ystride4 = (int)(ty.stride[0] / 4), ny = ty.shape[0], n4 = hdim / 4;
    const int* wts = gvm_ptr<const int>(troute, 3 * troute.stride[0], 4);
    const int* slots = gvm_ptr<const int>(troute, 4 * troute.stride[0], 4);
    uint2* out = gvm_ptr<uint2>(tf, tok0 * tf.stride[0], 2);
    const int ostride2 = (int)(tf.stride[0] / 4);
    for (int t = tok0; t < tok0 + ntok; ++t, out += ostride2) {
        // lane k < 8: float4 offset of y[slot_k] (-1: a pick of another shard) and w_k
        int my_row = -1;
        float my_w = 0.0f;
        if (lane < GVM_TOPK) {
            const int s = slots[t * GVM_TOPK + lane];
            my_w = __int_as_float(wts[t * GVM_TOPK + lane]);
            my_row = s >= 0 && s < ny ? s * ystride4 : -1;
        }
        const unsigned buf = red + (t & 1) * 128;  // alternate halves: one barrier per token
        // the live picks, two at a time in pick order: both rows' loads go out before either is used
        const unsigned live = __ballot_sync(0xffffffffu, my_row >= 0) & ((1u << GVM_TOPK) - 1u);
#pragma unroll 1
        for (unsigned left = live; left != 0;) {
            const int ka = gvm_comb_next(left, -1);
            const int kb = gvm_comb_next(left, ka);  // ka again: loaded twice, stored once
            const int ra = __shfl_sync(0xffffffffu, my_row, ka), rb = __shfl_sync(0xffffffffu, my_row, kb);
            float sa = 0.0f, sb = 0.0f;
            for (int i0 = c.tid; i0 < n4; i0 += 128 * GVM_COMB_BATCH) {
                float4 va[GVM_COMB_BATCH], vb[GVM_COMB_BATCH];
#pragma unroll
                for (int u = 0; u < GVM_COMB_BATCH; ++u) {  // clamped: predicated vector loads cost registers
                    va[u] = y[ra + min(i0 + 128 * u, n4 - 1)];
                    vb[u] = y[rb + min(i0 + 128 * u, n4 - 1)];
                }
#pragma unroll
                for (int u = 0; u < GVM_COMB_BATCH; ++u)
                    if (i0 + 128 * u < n4) {
                        sa = fmaf(va[u].w, va[u].w, fmaf(va[u].z, va[u].z, fmaf(va[u].y, va[u].y, fmaf(va[u].x, va[u].x, sa))));
                        sb = fmaf(vb[u].w, vb[u].w, fmaf(vb[u].z, vb[u].z, fmaf(vb[u].y, vb[u].y, fmaf(vb[u].x, vb[u].x, sb))));
                    }
            }
            sa = gvm_warp_sum(sa);
            sb = gvm_warp_sum(sb);
            if (lane == 0) {
                gvm_sts(buf + (warp * 8 + ka) * 4, sa);
                gvm_sts(buf + (warp * 8 + kb) * 4, sb);
            }
        }
        gvm_group_sync(c);
        for (int b0 = 0; b0 < n4; b0 += 128 * GVM_COMB_ACC) {  // uniform: the shuffles need every lane
            const int i0 = b0 + (int)c.tid;
            float4 a[GVM_COMB_ACC];
#pragma unroll
            for (int u = 0; u < GVM_COMB_ACC; ++u) a[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 1
            for (unsigned left = live; left != 0;) {  // pick order, two picks' loads at a time
                const int ka = gvm_comb_next(left, -1);
                const int kb = gvm_comb_next(left, -1);
                const int ra = __shfl_sync(0xffffffffu, my_row, ka), rb = __shfl_sync(0xffffffffu, my_row, max(kb, ka));
                float4 va[GVM_COMB_ACC], vb[GVM_COMB_ACC];
#pragma unroll
                for (int u = 0; u < GVM_COMB_ACC; ++u) {  // clamped: predicated vector loads cost registers
                    va[u] = y[ra + min(i0 + 128 * u, n4 - 1)];
                    vb[u] = y[rb + min(i0 + 128 * u, n4 - 1)];
                }
                gvm_comb_add(a, va, gvm_comb_coef(buf, ka, __shfl_sync(0xffffffffu, my_w, ka), hdim), i0, n4);
                if (kb >= 0) gvm_comb_add(a, vb, gvm_comb_coef(buf, kb, __shfl_sync(0xffffffffu, my_w, kb), hdim), i0, n4);
            }
#pragma unroll
            for (int u = 0; u < GVM_COMB_ACC; ++u) {
                const int i = i0 + 128 * u;
                if (i >= n4) continue;
                out[i] = make_uint2(gvm_pack_bf16x2(a[u].x, a[u].y), gvm_pack_bf16x2(a[u].z, a[u].w));
            }
        }
    }
    return GVM_ERR_NONE;
}
