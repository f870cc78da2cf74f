/* gpuvm instruction set: the one source of truth for opcodes, instruction
 * records, tensor descriptors, counters, trace and error records.
 *
 * Plain C so that gcc (the layout test), nvcc and NVRTC all read the same
 * file. gpuvm/isa.py parses the enums below and checks its record layouts
 * against a compiled probe of this header (tests/test_isa.py).
 *
 * Conventions
 *  - An instruction is one 128-byte record. It waits on up to GVM_MAX_WAITS
 *    counters, runs its op, then increments its signal counter by one
 *    (release); the W workers of an expert work list instead add 1 when
 *    one of them finds every item taken and W - 1 when one finishes the
 *    list's last item (EXPERT_UP), so a counter still grows by its
 *    signallers per step. A wait on counter c is
 *    satisfied at step s when
 *      (int32)(value(c) - (wait_base + s * wait_step)) >= 0,
 *    wait_step being the number of instructions that signal c per step, so
 *    counters only grow and are never reset between steps.
 *  - Tensors are indices into a tensor table (gvm_tensor) held in device
 *    memory; rebinding buffers rewrites the table, never the stream.
 *  - Shapes written [a, b] are row-major; strides are in elements.
 *  - "bf16(x)" is round-to-nearest-even; "rms(x)" = x / sqrt(mean(x^2) + 1e-6)
 *    over the last dim. Float arguments travel as their IEEE-754 bits.
 */
#ifndef GVM_ISA_H
#define GVM_ISA_H

#if defined(__CUDACC_RTC__)
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef int int32_t;
typedef long long int64_t;
#else
#include <stdint.h>
#endif

#define GVM_ISA_VERSION 1
#define GVM_INSTR_BYTES 128
#define GVM_TENSOR_BYTES 64
#define GVM_TRACE_BYTES 96
#define GVM_ERROR_BYTES 48
#define GVM_MAX_WAITS 4
#define GVM_MAX_TENSORS 8
#define GVM_MAX_ARGS 12
#define GVM_MAX_DIMS 4
#define GVM_NONE 0xFFFF          /* no counter / no tensor slot */
#define GVM_MAX_COUNTERS 65535
#define GVM_MAX_INSTRS (1 << 22)
#define GVM_MAX_TABLE 65535      /* tensor-table entries */
#define GVM_RMS_EPS 1e-6f
#define GVM_TOPK 8
#define GVM_HEAD_DIM 64
#define GVM_GQA 8                /* query heads per kv head */
#define GVM_MAX_WORKLIST_EXPERTS 32 /* local experts an EXPERT_UP/DOWN work list covers */
/* An expert's weight in its work list's shares of the workers (EXPERT_UP
 * below), in quarters: up to GVM_EXPERT_SHARE_T1 tokens W1, up to T2 W2, more
 * W3 (ops/experts.cuh gvm_exp_weight; gpuvm/opspec.py expert_weight reads
 * these lines, so a -D for an A/B run changes the device's items only). */
#ifndef GVM_EXPERT_SHARE_T1
#define GVM_EXPERT_SHARE_T1 4
#endif
#ifndef GVM_EXPERT_SHARE_W1
#define GVM_EXPERT_SHARE_W1 4
#endif
#ifndef GVM_EXPERT_SHARE_T2
#define GVM_EXPERT_SHARE_T2 8
#endif
#ifndef GVM_EXPERT_SHARE_W2
#define GVM_EXPERT_SHARE_W2 7
#endif
#ifndef GVM_EXPERT_SHARE_W3
#define GVM_EXPERT_SHARE_W3 8
#endif
#define GVM_GEMM_MAX_PARTS 16    /* K parts of an f32 GEMM tile (a5) */
/* Tiled NVFP4 (the expert weights): a matrix [N,K] is ceil(N/16) blocks of
 * 16 rows, each K step of 128 values by K step: codes [16 rows][64 B], and
 * in the scales tensor [16 rows][8 B]. Codes [..,ceil(N/16),8K] e2m1x2 (bytes),
 * scales [..,ceil(N/16),K] e4m3; rows past N are zeros. A byte's two codes
 * (even k, odd k) have their bits placed for the decode: even s,e1,e0,m at
 * bits 7,4,3,2, odd at 5,6,1,0 (gvm_e2m1x8_to_e4m3). */
#define GVM_NVFP4_TILE_ROWS 16
#define GVM_NVFP4_TILE_K 128

/* ---- dtypes ------------------------------------------------------------ */
enum gvm_dtype {
    GVM_DT_F32 = 1,
    GVM_DT_BF16 = 2,
    GVM_DT_E4M3 = 3,     /* fp8 e4m3fn, one byte */
    GVM_DT_E2M1X2 = 4,   /* two fp4 e2m1 codes per byte, even index in the low nibble */
    GVM_DT_I32 = 5,
    GVM_DT_U8 = 6
};

/* ---- opcodes ------------------------------------------------------------
 * t0..t7: the instruction's tensor slots; a0..a11: its int32 arguments.
 * T is the token count, shape[0] of the activation tensors. Head counts come
 * from shapes: HQ query heads (q shape[1]), HKV kv heads (cache shape[2]),
 * head dim 64, HQ/HKV query heads per kv head; E local experts, NE in all.
 */
enum gvm_opcode {
    /* synthetic ops (prove the VM) */
    GVM_OP_NOP = 0,        /* nothing */
    GVM_OP_SLEEP = 1,      /* spin a0 nanoseconds (globaltimer) */
    GVM_OP_COPY = 2,       /* t0[i] = t1[i], i in [a0, a0+a1) of the flat f32 tensors */
    GVM_OP_SCALE_ADD = 3,  /* t0[i] = f(a2)*t1[i] + f(a3)*t2[i], i in [a0, a0+a1), f32 */

    /* Muse ops */
    GVM_OP_GEMM = 16,
    /* t0 out [T,N], t1 x [T,K], t2 W [N,K] (rows = outputs); a0 n0, a1 n count,
     * a2 t0, a3 t count (0: all T tokens, and a2 must be 0; f32 only: a bf16
     * GEMM takes all its tokens).
     * out[t, n] = sum_k x[t,k] * W[n,k] for n in [n0, n0+a1), t in [a2, a2+a3),
     * f32 accumulate.
     * dtypes (x, W, out): (bf16, bf16, bf16|f32) or (f32, f32, f32). The weight
     * rows [n0, n0+a1) are what the loader prefetches.
     * Residual statistics (optional, out f32): t3 stats [T,P,4] f32, t4 s [T,N]
     * f32, t5 alpha [N] f32, t6 beta [N] f32, a4 slot p < P. For each token t
     * of the range, stats[t, p] = (sum a^2, sum alpha*beta*s*a, sum beta^2*a^2,
     * sum alpha^2*s^2) over n in [n0, n0+a1), a = out[t, n] as stored (the
     * sums RESIDUAL needs for s = alpha*s + beta*rms(a) and rms of the new s).
     * K parts (instead of statistics; f32, or bf16 from GVM_GEMM_XS_MIN tokens
     * an instruction, the staged path, with K/P a multiple of 64): a5 P > 1, a
     * power of two, cuts K into P equal parts (multiples of 8), a6 j < P the instruction's,
     * t3 parts [T,P*N] f32, t4 tickets [M] i32, a7 m < M. The instruction
     * writes part j's sums to parts[t, j*N + n], then adds one to tickets[m];
     * the one that brings it to a multiple of P (the last of the P parts of
     * its tile: tickets start at 0, and every step adds P) writes out[t, n] =
     * parts[t, n] + parts[t, N + n] + ... in part order (rounded to out's
     * dtype once). Without parts a5 is
     * 0 or 1, a6 and a7 0. */
    GVM_OP_RMSNORM = 17,
    /* t0 out [T,D] bf16|f32, t1 in [T,D] f32, t2 w [D] f32; a0 row0, a1 rows.
     * out = rms(in) * (1 + w). */
    GVM_OP_QK_ROPE_KV = 18,
    /* t0 qkvg [T,(2HQ+2HKV)*64] bf16 (q HQx64 | k HKVx64 | v HKVx64 | g HQx64),
     * t1 q out [T,HQ,64] bf16, t2 w_qn [64] f32, t3 w_kn [64] f32,
     * t4 k cache [C,S,HKV,64] e4m3, t5 v cache [C,S,HKV,64] e4m3,
     * t6 convs [C,4] i32: (tok0, tokens, pos0, 0) of each conversation;
     * a0 conv c, a1 rope (1 sliding, 0 full), a2 f(k_scale), a3 f(v_scale),
     * a4 j0, a5 n (0: to the conversation's last new token).
     * For each new token j in [j0, j0 + n) of conversation c (token t = tok0 + j, position
     * p = pos0 + j): q = rms_head(q)*(1+w_qn), k = rms_head(k)*(1+w_kn),
     * RoPE(p, base 500000, pairs (2i,2i+1)) on q and k if a1, then
     * cache[c, p % S] = e4m3(k / k_scale), e4m3(v / v_scale); q out = bf16(q). */
    GVM_OP_ATTN_CHUNK = 19,
    /* t0 q [T,HQ,64] bf16, t1 k cache, t2 v cache, t3 convs [C,4] i32,
     * t4 part_o [T,HQ,NCH,64] f32, t5 part_ml [T,HQ,NCH,2] f32;
     * a0 conv c, a1 kv head h, a2 chunk j, a3 chunk length L, a4 window W
     * (0: full attention), a5 f(k_scale), a6 f(v_scale).
     * Keys of chunk j are positions [b + j*L, b + (j+1)*L) where b = 0 for full
     * attention and b = max(0, pos0 - W + 1) for sliding. A query at position p
     * sees key q' when q' <= p and (W == 0 or q' > p - W). For each new token of
     * c and each query head of kv head h (heads h*G .. h*G+G-1, G = HQ/HKV): score = q.k / 8 over the visible
     * keys of the chunk, m = max score, l = sum exp(score - m),
     * o = sum exp(score - m) * v (unnormalised); none visible: m = -inf, l = 0, o = 0.
     * Fused (t0 qkvg [T,(2HQ+2HKV)*64] bf16 as QK_ROPE_KV's t0, t6 w_qn, t7 w_kn
     * [64] f32, a7 rope 0/1): the chunk's q rows are QK_ROPE_KV's, computed from
     * qkvg; a chunk whose keys hold new positions first writes their k and v of
     * head h into the caches as QK_ROPE_KV would. No QK_ROPE_KV op is needed. */
    GVM_OP_ATTN_MERGE = 20,
    /* t0 o out [T,HQ*64] bf16, t1 part_o, t2 part_ml, t3 qkvg bf16;
     * a0 token0, a1 tokens, a2 head0, a3 heads (0: every head from a2 on),
     * a4 chunks (0: all NCH; the first a4 otherwise, the rest not read).
     * Log-sum-exp merge of those chunks of each of those heads,
     * then o = rms_head(o) * sigmoid(g). */
    GVM_OP_RESIDUAL = 21,
    /* t0 s [T,D] f32 (in place), t1 a [T,D] f32, t2 alpha [D] f32, t3 beta [D] f32,
     * t4 w_next [D] f32 or none, t5 out f32 [T,D] or none, t6 out bf16 [T,D] or none;
     * a0 row0, a1 rows. s = alpha*s + beta*rms(a); then, if t4 is set,
     * n = rms(s)*(1 + w_next) is written to t5 and/or t6.
     * t7 stats [T,P,4] f32 or none (GEMM's residual statistics of a, summed
     * over the P slots, instead of the op's own sums over the row); with t7,
     * only columns [a2, a2+a3) (a3 = 0: all; multiples of 4) are read and
     * written; without it a2 = a3 = 0. */
    GVM_OP_TOPK = 22,
    /* t0 scores [T,NE] f32, t1 route_meta [2,E] i32, t2 route [5,8T] i32,
     * t3 work [K,2] or [K,2+GVM_MAX_WORKLIST_EXPERTS] i32 or none (the experts' work lists: set to 0);
     * a0 first local expert, a1 E (local experts). Per token: top-8 scores
     * (ties: lower expert index first), w = softmax of the 8 scores.
     * Expert x is local when a0 <= x < a0 + a1, local index e = x - a0.
     * route[2][t*8+k] expert, route[3][t*8+k] f(w), route[4][t*8+k] slot or -1.
     * Local expert e gets route_meta[0][e] tokens in slots
     * [route_meta[1][e], + count), in token order; route[0][slot] token,
     * route[1][slot] f(w). Slots of expert e follow those of e-1.
     * a2 mode: 0 all of the above; 1 only route[2] and route[3] of tokens
     * [a3, a3+a4) (a4 > 0; t3 none); 2 the rest, from route[2] and route[3]
     * as mode 1 instructions left them (scores unread). Modes 0 and 2 take
     * a3 = a4 = 0. */
    GVM_OP_EXPERT_UP = 23,
    /* t0 hbuf [8T,I] bf16, t1 x [T,H] bf16, t2 gu codes [E,2,I/16,8H] e2m1x2,
     * t3 gu scales [E,2,I/16,H] e4m3 (both tiled NVFP4, above; H a multiple
     * of 128), t4 gu tensor scales [E,2] f32, t5 route_meta, t6 route, t7 work
     * [K,2] or [K,2+GVM_MAX_WORKLIST_EXPERTS] i32; a0 list k, a1 workers W, a2 row grain G, a3 row cap C (G and
     * C multiples of 16), a4 fixed F (0: items claimed, below; else this worker
     * is number F - 1 of the W, numbered 1..W: it takes items F - 1, F - 1 + W,
     * F - 1 + 2W, ... and leaves work[k][0] alone: a fixed round robin, the
     * static schedule the claims are measured against). Work list (E <= GVM_MAX_WORKLIST_EXPERTS):
     * expert e with n_e > 0 tokens has weight w_e (GVM_EXPERT_SHARE_*: 4 up
     * to 4 tokens, 7 up to 8, 8 above; S their sum) and tiles of
     * R_e = min(C_e, G * ceil(ceil(I / max(1, W * w_e / S)) / G)) rows (C_e = C,
     * or max(G, G * floor(C / 2G)) for n_e > H > 0: the items of an expert
     * of several token chunks, each a pass of the shared tile, end with the others'), P_e =
     * ceil(I / R_e) of them; the items are the experts' tiles, expert by expert
     * in the order of ceil(n_e / 32), the most first (ties in expert order;
     * ops/experts.cuh GVM_EXP_LPT),
     * each expert's in row order (rows [R_e*j, +R_e) of I).
     * The W instructions of a list take items
     * i = work[k][0]++ (atomic) until i is past the last item (so work[k][0]
     * ends at items + W) and count each one finished in work[k][1] (and,
     * where work has the expert columns, its rows in work[k][2+e], e its
     * expert: release, after the item's stores). The worker that takes
     * i = items (every item taken) signals 1, the one that finishes the last
     * item W - 1 (one worker may do both; with no items, the first draw
     * signals W), the others 0: waiters of all W see the list done without
     * waiting for its last worker, and a wait for 1 sees every item held by
     * a running worker. All W share tensors, arguments but a4 and signal
     * counter, and are that counter's only signallers (checked at build);
     * a5 is 0; a6 heavy H >= 0 (tokens; 0: no expert is heavy, below).
     * For an item's expert e and each slot of e (token t):
     * hbuf[slot, n] = bf16(silu(G x_t) * (U x_t)) with G = gu[e,0],
     * U = gu[e,1] dequantised: code * scale * tensor_scale. */
    GVM_OP_EXPERT_DOWN = 24,
    /* t0 y [8T,H] f32, t1 hbuf [8T,I] bf16, t2 d codes [E,H/16,8I], t3 d scales
     * [E,H/16,I] (tiled), t4 d tensor scales [E] f32, t5 route_meta, t6 route,
     * t7 work; a0 list k, a1 workers W, a2 row grain G, a3 cap C, a4 fixed F, a6 heavy: the work list of
     * EXPERT_UP over the H rows (its rows not counted by expert). y[slot, n] = sum_i D[n,i] hbuf[slot,i].
     * a5 after: 0, or j + 1: an item of expert e first waits (in the op,
     * bounded by GVM_LIST_WAIT_NS) until work[j][2+e] reaches I, i.e. list j
     * (the EXPERT_UP that writes hbuf) has done all of e's rows; work then
     * has the expert columns. Such a list may start once list j's items are
     * all taken (a wait for 1 of its W signals, which needs list j's items
     * claimed, a4 = 0): they are then held by running workers that wait for
     * nothing, so the wait ends. */
    GVM_OP_EXPERT_COMBINE = 25,
    /* t0 fsq [T,H] bf16, t1 y [8T,H] f32, t2 route [5,8T] i32; a0 token0,
     * a1 tokens. fsq[t] = bf16(sum over local k of w_k * rms(y[slot_k])). */
    GVM_OP_EMBED = 26,
    /* t0 s [T,D] f32 out, t1 table [V,D] bf16, t2 tokens [T] i32; a0 row0,
     * a1 rows. s[t] = f32(table[tokens[t]]) for t in [a0, a0+a1). A token id
     * outside [0, V) in the range is GVM_ERR_BAD_ARGS, and nothing is written. */
    GVM_OP_ARGMAX = 27,
    /* t0 logits [T,V] f32, t1 tokens out [T] i32, t2 margin [T] f32 or none;
     * a0 row0, a1 rows. For t in [a0, a0+a1): tokens[t] = the index of the
     * largest logit of row t (ties: lower index first); margin[t] = that
     * logit minus the largest of the other V-1 (0 on a tie, +inf when V = 1).
     * A NaN or infinite logit in the range is GVM_ERR_BAD_ARGS, and nothing
     * is written. */
    GVM_OP_COUNT_ = 28
};

/* ---- instruction flags ---- */
enum gvm_flag {
    GVM_FLAG_TRACE = 1,     /* reserved: per-instruction trace opt-in */
    GVM_FLAG_LAZY = 2       /* dynamic mode: once this instruction is handed out, its
                             * block claims the next one only while one of its groups is
                             * free, so that no claim waits behind two busy groups while
                             * another block's group idles (runtime/controller.cuh) */
};

/* ---- records ------------------------------------------------------------ */
typedef struct gvm_instr {
    uint16_t opcode;
    uint16_t flags;
    uint16_t signal;                     /* counter incremented at the end, or GVM_NONE */
    uint16_t n_waits;
    uint16_t wait_counter[GVM_MAX_WAITS];
    uint32_t wait_base[GVM_MAX_WAITS];   /* target at step 0 */
    uint32_t wait_step[GVM_MAX_WAITS];   /* added to the target per step */
    uint16_t tensor[GVM_MAX_TENSORS];    /* tensor-table index, or GVM_NONE */
    uint64_t pf_offset;                  /* weight bytes the loader prefetches at claim: */
    uint32_t pf_bytes;                   /*   [pf_offset, +pf_bytes) of tensor slot pf_slot */
    uint16_t pf_slot;                    /*   (0..7) or GVM_NONE */
    uint16_t reserved;
    int32_t arg[GVM_MAX_ARGS];
} gvm_instr;

typedef struct gvm_tensor {
    uint64_t ptr;
    uint8_t dtype;
    uint8_t ndim;
    uint16_t flags;
    uint32_t reserved;
    int32_t shape[GVM_MAX_DIMS];
    int64_t stride[GVM_MAX_DIMS];        /* elements (for e2m1x2: bytes) */
} gvm_tensor;

/* Trace stamps, one record per instruction per launch, at its stream index. */
enum gvm_stamp {
    GVM_STAMP_CLAIM = 0,      /* claimed by a block */
    GVM_STAMP_LOAD = 1,       /* weight prefetch issued */
    GVM_STAMP_READY = 2,      /* dependency waits satisfied */
    GVM_STAMP_DONE = 3,       /* compute finished */
    GVM_STAMP_SIGNAL = 4,     /* signal counter released */
    GVM_N_STAMPS = 5
};

typedef struct gvm_trace {
    uint32_t sm;
    uint32_t block;
    uint32_t group;          /* warp group inside the block */
    uint32_t instr;
    uint64_t globaltimer[GVM_N_STAMPS];
    uint64_t clock[GVM_N_STAMPS];
} gvm_trace;

enum gvm_error_code {
    GVM_ERR_NONE = 0,
    GVM_ERR_WATCHDOG = 1,     /* a wait passed the bound */
    GVM_ERR_BAD_OPCODE = 2,
    GVM_ERR_BAD_ARGS = 3,     /* an op found its tensors or arguments unusable */
    GVM_ERR_ABORTED = 4       /* stopped because another block failed */
};

typedef struct gvm_error {
    uint32_t code;
    uint32_t instr;
    uint32_t counter;
    uint32_t seen;            /* counter value at the timeout */
    uint32_t target;
    uint32_t sm;
    uint32_t block;
    uint32_t step;
    uint64_t waited_ns;
    uint64_t detail;
} gvm_error;

#endif /* GVM_ISA_H */
