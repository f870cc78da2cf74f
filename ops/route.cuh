// TOPK (isa/gvm_isa.h): per token the top 8 router scores and their softmax
// weights, then the routing table of the local experts, built on the GPU.
// At many tokens the picks (a warp's 8 rounds a token, ~0.8 us) are cut over
// token ranges (mode 1), and one instruction builds the table from them
// (mode 2); mode 0 does both.
// Deterministic: a token's 8 picks are in descending score order, ties to the
// lower expert index; slots of an expert are in token order (a token picks an
// expert at most once, so the slot of (t, e) is offset[e] + #{t' < t chose e}).
#pragma once
#include "common.cuh"

#define GVM_TOPK_MAX_EXPERTS 256  // 8 candidates per lane
// Timing probes (wrong results; tools/ops_check.py --time): 1 no routing table
// (phase 3), 2 no score loads (keys from the lane), 4 no pick rounds.
#ifndef GVM_TOPK_PROBE
#define GVM_TOPK_PROBE 0
#endif

__device__ int gvm_op_topk(const gvm_ctx& c) {
    const gvm_tensor& tsc = gvm_t(c, 0);
    const gvm_tensor& tmeta = gvm_t(c, 1);
    const gvm_tensor& troute = gvm_t(c, 2);
    const int first = c.ins->arg[0], n_local = c.ins->arg[1], mode = c.ins->arg[2];
    const int nt = tsc.shape[0], ne = tsc.shape[1];
    // the picks' tokens (mode 1: a3, a4; mode 2: none)
    const int t_beg = mode == 1 ? c.ins->arg[3] : 0, t_end = mode == 1 ? t_beg + c.ins->arg[4] : mode == 0 ? nt : 0;
    // smem: count[E], next[E] (slot of the chunk's first token per expert), mask[E][4]
    const unsigned need = (unsigned)n_local * 24u;
    const bool ok = gvm_is(tsc, GVM_DT_F32, 2) & ne >= GVM_TOPK & ne <= GVM_TOPK_MAX_EXPERTS &
                    gvm_is(tmeta, GVM_DT_I32, 2) & tmeta.shape[0] == 2 & tmeta.shape[1] == n_local &
                    gvm_is(troute, GVM_DT_I32, 2) & troute.shape[0] == 5 & troute.shape[1] == GVM_TOPK * nt &
                    first >= 0 & n_local >= 0 & first + n_local <= ne & c.smem_bytes >= need &
                    (!gvm_has(c, 3) || (mode != 1 && gvm_is(gvm_t(c, 3), GVM_DT_I32, 2) &&
                                        (gvm_t(c, 3).shape[1] == 2 || gvm_t(c, 3).shape[1] == 2 + GVM_MAX_WORKLIST_EXPERTS))) &
                    mode >= 0 & mode <= 2 & (mode == 1 ? t_beg >= 0 & c.ins->arg[4] > 0 & t_end <= nt
                                                        : c.ins->arg[3] == 0 & c.ins->arg[4] == 0);
    if (!ok) return GVM_ERR_BAD_ARGS;
    if (gvm_has(c, 3)) {  // the experts' work lists (items taken, items done, rows by expert) start this step at 0
        const gvm_tensor& tw = gvm_t(c, 3);
        const int w = tw.shape[1];
        for (int k = c.tid; k < w * tw.shape[0]; k += 128)
            gvm_ptr<int>(tw, k / w * tw.stride[0] + k % w, 4)[0] = 0;
    }
    const unsigned warp = c.tid >> 5, lane = c.tid & 31;
    const unsigned s_count = gvm_smem_addr(c.smem), s_next = s_count + 4 * n_local, s_mask = s_next + 4 * n_local;
    int* route[5];
#pragma unroll
    for (int i = 0; i < 5; ++i) route[i] = gvm_ptr<int>(troute, i * troute.stride[0], 4);
    int* meta_count = gvm_ptr<int>(tmeta, 0, 4);
    int* meta_first = gvm_ptr<int>(tmeta, tmeta.stride[0], 4);

    if (mode != 1) {
        for (int e = c.tid; e < n_local; e += 128) gvm_sts(s_count + 4 * e, 0u);
        gvm_group_sync(c);
    }
    if (mode == 2) {  // the picks are in route[2]: count the local ones
        for (int t = c.tid; t < nt; t += 128) {
            int x[GVM_TOPK];
#pragma unroll
            for (int k = 0; k < GVM_TOPK; ++k) x[k] = route[2][t * GVM_TOPK + k] - first;
#pragma unroll
            for (int k = 0; k < GVM_TOPK; ++k)
                if (x[k] >= 0 && x[k] < n_local) atomicAdd(reinterpret_cast<unsigned*>(c.smem) + x[k], 1u);
        }
    }

    // 1. one warp per token: 8 rounds of (warp max of the keys, lowest index among equals);
    //    the warp's next token's scores are loaded while this one is picked
    const int t_first = t_beg + (int)warp;
    const gvm_view vsc = gvm_view_of(tsc);  // the token loop's route stores would reload tsc before each prefetch
    float nxt[8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
        nxt[i] = t_first < t_end && lane + 32 * i < (unsigned)ne ? gvm_ptr<const float>(vsc, t_first * vsc.s0, 4)[lane + 32 * i] : 0.0f;
    for (int t = t_first; t < t_end; t += 4) {
        unsigned key[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) key[i] = lane + 32 * i < (unsigned)ne ? gvm_sort_key(nxt[i]) : 0u;
        if (!(GVM_TOPK_PROBE & 2) && t + 4 < t_end) {
            const float* sc = gvm_ptr<const float>(vsc, (t + 4) * vsc.s0, 4);
#pragma unroll
            for (int i = 0; i < 8; ++i)
                if (lane + 32 * i < (unsigned)ne) nxt[i] = sc[lane + 32 * i];
        }
        unsigned my_x = 0, my_key = 0;
#pragma unroll 1
        for (int k = 0; k < (GVM_TOPK_PROBE & 4 ? 0 : GVM_TOPK); ++k) {
            unsigned bk = key[0], bi = 0;
#pragma unroll
            for (int i = 1; i < 8; ++i) {
                if (key[i] > bk) {
                    bk = key[i];
                    bi = i;
                }
            }
            const unsigned wk = __reduce_max_sync(0xffffffffu, bk);
            const unsigned wx = __reduce_min_sync(0xffffffffu, bk == wk ? lane + 32 * bi : 0xffffffffu);
#pragma unroll
            for (int i = 0; i < 8; ++i)
                if (wx == lane + 32 * i) key[i] = 0u;
            if (lane == (unsigned)k) {
                my_x = wx;
                my_key = wk;
            }
        }
        // softmax over the 8 picks, held by lanes 0..7 (the first is the largest)
        const float s = gvm_sort_key_value(my_key);
        const float top = __shfl_sync(0xffffffffu, s, 0);
        const float ex = lane < GVM_TOPK ? expf(s - top) : 0.0f;
        float sum = ex;
#pragma unroll
        for (int o = 1; o < GVM_TOPK; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (GVM_TOPK_PROBE & 4) my_x = (lane * 4 + t) % ne, my_key = key[lane & 7];
        if (lane < GVM_TOPK) {
            route[2][t * GVM_TOPK + lane] = (int)my_x;
            route[3][t * GVM_TOPK + lane] = __float_as_int(ex / sum);
            const int e = (int)my_x - first;
            if (mode == 0 && e >= 0 && e < n_local) atomicAdd(reinterpret_cast<unsigned*>(c.smem) + e, 1u);
        }
    }
    if (mode == 1) return GVM_ERR_NONE;
    gvm_group_sync(c);

    // 2. counts -> first slots (exclusive scan, warp 0)
    if (warp == 0) {
        int carry = 0;
        for (int e0 = 0; e0 < n_local; e0 += 32) {
            const int e = e0 + lane;
            const int n = e < n_local ? (int)gvm_lds_u(s_count + 4 * e) : 0;
            int incl = n;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int v = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= (unsigned)o) incl += v;
            }
            if (e < n_local) {
                meta_count[e] = n;
                meta_first[e] = carry + incl - n;
                gvm_sts(s_next + 4 * e, (unsigned)(carry + incl - n));
            }
            carry += __shfl_sync(0xffffffffu, incl, 31);
        }
    }

    if (GVM_TOPK_PROBE & 1) return GVM_ERR_NONE;
    // 3. chunks of 128 tokens, one per thread: each local pick sets the token's
    //    bit in the expert's 128-bit mask; its rank is the count of lower bits.
    for (int t0 = 0; t0 < nt; t0 += 128) {
        for (int i = c.tid; i < 4 * n_local; i += 128) gvm_sts(s_mask + 4 * i, 0u);
        gvm_group_sync(c);
        const int t = t0 + c.tid;
        int x[GVM_TOPK], wt[GVM_TOPK];  // picks and weights, loaded together before any store to route
#pragma unroll
        for (int k = 0; k < GVM_TOPK; ++k) {
            x[k] = t < nt ? route[2][t * GVM_TOPK + k] - first : -1;
            wt[k] = t < nt ? route[3][t * GVM_TOPK + k] : 0;
        }
#pragma unroll
        for (int k = 0; k < GVM_TOPK; ++k)
            if (x[k] >= 0 && x[k] < n_local)
                atomicOr(reinterpret_cast<unsigned*>(c.smem + 8 * n_local) + 4 * x[k] + warp, 1u << lane);
        gvm_group_sync(c);
        if (t < nt) {
#pragma unroll
            for (int k = 0; k < GVM_TOPK; ++k) {
                int slot = -1;
                if (x[k] >= 0 && x[k] < n_local) {
                    const unsigned m = s_mask + 16 * x[k];
                    slot = (int)gvm_lds_u(s_next + 4 * x[k]) + __popc(gvm_lds_u(m + 4 * warp) & ((1u << lane) - 1u));
                    for (unsigned w = 0; w < warp; ++w) slot += __popc(gvm_lds_u(m + 4 * w));
                    route[0][slot] = t;
                    route[1][slot] = wt[k];
                }
                route[4][t * GVM_TOPK + k] = slot;
            }
        }
        gvm_group_sync(c);
        for (int e = c.tid; e < n_local; e += 128) {
            const unsigned m = s_mask + 16 * e;
            const unsigned n = __popc(gvm_lds_u(m)) + __popc(gvm_lds_u(m + 4)) + __popc(gvm_lds_u(m + 8)) +
                               __popc(gvm_lds_u(m + 12));
            gvm_sts(s_next + 4 * e, gvm_lds_u(s_next + 4 * e) + n);
        }
        gvm_group_sync(c);  // masks are read above before the next chunk clears them
    }
    return GVM_ERR_NONE;
}
