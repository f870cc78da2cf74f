// PTX primitives of the Muse ops: rounding conversions, cached loads, shared
// memory by 32-bit address, tensor-core mma. Everything else in ops/ is plain
// C++ over these, and tools/ops_emu/ptx.cuh implements the same functions on
// the host for the CPU tests.
#pragma once
#include "op_ctx.cuh"
#include "../runtime/stamps.cuh"

// ---- conversions ---------------------------------------------------------------
// Round-to-nearest-even bf16 pair; lo lands in the low half.
__device__ __forceinline__ unsigned gvm_pack_bf16x2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ unsigned gvm_pack_f16x2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// Saturating (+-448) round-to-nearest-even e4m3 pair; lo in the low byte.
__device__ __forceinline__ unsigned short gvm_pack_e4m3x2(float lo, float hi) {
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
}

// Two e4m3 (low 16 bits of w) -> f16 pair, exact.
__device__ __forceinline__ unsigned gvm_e4m3x2_to_f16x2(unsigned w) {
    unsigned r;
    asm("{ .reg .b16 l, h; mov.b32 {l, h}, %1; cvt.rn.f16x2.e4m3x2 %0, l; }" : "=r"(r) : "r"(w));
    return r;
}

__device__ __forceinline__ unsigned gvm_e4m3x2_hi_to_f16x2(unsigned w) {
    unsigned r;
    asm("{ .reg .b16 l, h; mov.b32 {l, h}, %1; cvt.rn.f16x2.e4m3x2 %0, h; }" : "=r"(r) : "r"(w));
    return r;
}

__device__ __forceinline__ unsigned gvm_hmul2(unsigned a, unsigned b) {
    unsigned r;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}

// a times half h of b in both halves: one HMUL2 with a .H0_H0 / .H1_H1 operand
// (a byte_perm broadcast before the multiply stayed a PRMT of its own).
template <int H>
__device__ __forceinline__ unsigned gvm_hmul2_dup(unsigned a, unsigned b) {
    unsigned r;
    if (H)
        asm("{ .reg .b16 l, h; .reg .b32 t; mov.b32 {l, h}, %2; mov.b32 t, {h, h}; mul.rn.f16x2 %0, %1, t; }" : "=r"(r) : "r"(a), "r"(b));
    else
        asm("{ .reg .b16 l, h; .reg .b32 t; mov.b32 {l, h}, %2; mov.b32 t, {l, l}; mul.rn.f16x2 %0, %1, t; }" : "=r"(r) : "r"(a), "r"(b));
    return r;
}

// ---- global loads --------------------------------------------------------------------
// Streamed data goes evict-first: expert weights by cp.async (below) with an
// L2 evict-first policy; the KV cache, written during the launch (QK_ROPE_KV),
// through the coherent path, ".cs" (evict-first in L1 and L2).
// The policies are the values createpolicy.fractional.L2::evict_first (and
// ::evict_normal) 1.0 gives, as constants: ptxas keeps a constant in a
// uniform register, where a createpolicy result cost every cp.async an R2UR
// pair (the experts' ring slot: 325 -> 315 instructions).
// tests/gpu/test_policy.py checks them against createpolicy on the device.
#define GVM_L2_EVICT_FIRST 0x12F0000000000000ull
#define GVM_L2_EVICT_NORMAL 0x16F0000000000000ull
__device__ __forceinline__ unsigned long long gvm_policy_evict_first() { return GVM_L2_EVICT_FIRST; }

// Data several readers share (a GEMM's staged activations): kept as usual.
__device__ __forceinline__ unsigned long long gvm_policy_evict_normal() { return GVM_L2_EVICT_NORMAL; }

__device__ __forceinline__ uint4 gvm_ld_stream16(const void* p) {
    uint4 r;
    asm volatile("ld.global.cs.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}

__device__ __forceinline__ uint2 gvm_ld_stream8(const void* p) {
    uint2 r;
    asm volatile("ld.global.cs.v2.u32 {%0,%1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
    return r;
}

// ---- asynchronous copies global -> shared --------------------------------------------
// 16 bytes (L2 only) or 4 bytes, with an L2 policy; !valid reads nothing and
// zero-fills the destination. Complete after gvm_cp_async_wait<N> once at most
// N later commit groups are still pending.
__device__ __forceinline__ void gvm_cp_async16(unsigned dst, const void* src, bool valid, unsigned long long pol) {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;"
                 :: "r"(dst), "l"(src), "r"(valid ? 16 : 0), "l"(pol) : "memory");
}
__device__ __forceinline__ void gvm_cp_async4(unsigned dst, const void* src, bool valid, unsigned long long pol) {
    asm volatile("cp.async.ca.shared.global.L2::cache_hint [%0], [%1], 4, %2, %3;"
                 :: "r"(dst), "l"(src), "r"(valid ? 4 : 0), "l"(pol) : "memory");
}
__device__ __forceinline__ void gvm_cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void gvm_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}

// ---- bulk copies global -> shared, completed on an mbarrier (sm_90) --------------
// One thread's copy of bytes (a multiple of 16, both ends 16-byte aligned) lands
// through the async proxy and counts its bytes down on the mbarrier at bar (8-byte
// aligned shared memory). A phase of such a barrier (count 1) completes once its
// one arrival (gvm_bar_expect) has announced the bytes and they have all landed.
__device__ __forceinline__ void gvm_bar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void gvm_bar_inval(unsigned bar) {
    asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
// The arrival of a phase that waits for bytes more bytes to land.
__device__ __forceinline__ void gvm_bar_expect(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void gvm_bulk_g2s(unsigned dst, const void* src, unsigned bytes, unsigned bar, unsigned long long pol) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar), "l"(pol) : "memory");
}
// Earlier generic-proxy accesses of shared memory (this thread's, and its warp's
// after a __syncwarp) are ordered before its later bulk copies into it.
__device__ __forceinline__ void gvm_fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// Blocking (the hardware suspends the thread between tries), but bounded: false
// once bound_ns have passed with the phase of this parity still open. The
// scheduler's hand-offs wait here too (scheduler/handoff.cuh).
__device__ __forceinline__ bool gvm_bar_wait_for(unsigned bar, unsigned parity, unsigned long long bound_ns) {
    unsigned long long t0 = 0;
    for (;;) {
        unsigned ok;
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2; selp.b32 %0, 1, 0, p; }"
                     : "=r"(ok) : "r"(bar), "r"(parity) : "memory");
        if (ok) return true;
        const unsigned long long now = gvm_globaltimer();
        if (t0 == 0) t0 = now;
        else if (now - t0 > bound_ns) return false;
    }
}
// A bulk copy's phase: its bytes land within microseconds whatever other
// instructions do, so a phase still open after 1 s never completes (bytes
// announced that no copy delivers): the launch traps instead of hanging.
#define GVM_COPY_BOUND_NS 1000000000ull
__device__ __forceinline__ void gvm_bar_wait(unsigned bar, unsigned parity) {
    if (!gvm_bar_wait_for(bar, parity, GVM_COPY_BOUND_NS)) asm volatile("trap;");
}

// Starts fetching [p, p + bytes) into L2 (16-byte aligned, bytes a multiple of
// 16); completes on its own, costs no register.
__device__ __forceinline__ void gvm_prefetch_l2(const void* p, unsigned bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}

// Global atomic add, acquire and release at GPU scope: counts a finished piece of
// work (release: this thread's and, after a barrier, its group's stores) and
// sees what the pieces counted before it published (acquire).
__device__ __forceinline__ unsigned gvm_atom_add_acq_rel(unsigned* p, unsigned v) {
    unsigned old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

// Two adjacent counters at once (low word, high word): one round trip, not two.
__device__ __forceinline__ unsigned long long gvm_atom_add_acq_rel_u64(unsigned long long* p, unsigned long long v) {
    unsigned long long old;
    asm volatile("atom.acq_rel.gpu.global.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
    return old;
}

// Two counts published behind one fence: the fence then a relaxed add of v to a
// and an acquire add of w to b (each a release pattern of the PTX memory model:
// a fence, then a strong write of the location, in program order). red.release
// then atom.acq_rel compiled to two MEMBAR.ALL.GPU, the second waiting for the
// red's round trip.
__device__ __forceinline__ unsigned long long gvm_release_add2(unsigned* a, unsigned v, unsigned long long* b, unsigned long long w) {
    unsigned long long old;
    asm volatile("fence.acq_rel.gpu;\n\tred.relaxed.gpu.global.add.u32 [%1], %2;\n\tatom.acquire.gpu.global.add.u64 %0, [%3], %4;"
                 : "=l"(old) : "l"(a), "r"(v), "l"(b), "l"(w) : "memory");
    return old;
}

// A global counter's loads and adds (the scheduler's counters, scheduler/counters.cuh,
// and the expert lists' per-expert rows, ops/experts.cuh).
__device__ __forceinline__ unsigned gvm_ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ unsigned gvm_ld_relaxed(const unsigned* p) {
    unsigned v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void gvm_red_release_add(unsigned* p, unsigned v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ bool gvm_reached(unsigned value, unsigned target) {
    return (int)(value - target) >= 0;
}

// Backoff of a counter poll (here and the scheduler's, scheduler/counters.cuh):
// naps from GVM_WAIT_NAP_MIN ns doubling to GVM_WAIT_NAP_MAX (a nap wakes late by
// the hardware's granularity, which the dependency hop then pays; 0 makes the poll spin).
#ifndef GVM_WAIT_NAP_MIN
#define GVM_WAIT_NAP_MIN 32
#endif
#ifndef GVM_WAIT_NAP_MAX
#define GVM_WAIT_NAP_MAX 256
#endif

// Polls a global counter (acquire) until it reaches target, with the backoff
// above; false once bound_ns have passed without.
__device__ __forceinline__ bool gvm_poll_reached(const unsigned* p, unsigned target, unsigned long long bound_ns) {
    unsigned long long t0 = 0;
    for (unsigned nap = GVM_WAIT_NAP_MIN;; nap = nap < GVM_WAIT_NAP_MAX ? 2 * nap : GVM_WAIT_NAP_MAX) {
        if (gvm_reached(gvm_ld_acquire(p), target)) return true;
        const unsigned long long now = gvm_globaltimer();
        if (t0 == 0) t0 = now;
        else if (now - t0 > bound_ns) return false;
        gvm_nanosleep(nap);
    }
}

// v, as a value the compiler cannot see through: what derives from it (from
// the thread index, say) is not hoisted out of the persistent loop into
// registers held through every op.
__device__ __forceinline__ unsigned gvm_opaque(unsigned v) {
    asm volatile("mov.u32 %0, %0;" : "+r"(v));
    return v;
}

// ---- shared memory by 32-bit address ------------------------------------------------
__device__ __forceinline__ unsigned gvm_smem_addr(const void* p) {
    unsigned r;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
    return r;
}

__device__ __forceinline__ void gvm_sts(unsigned a, float v) {
    asm volatile("st.shared.f32 [%0], %1;" :: "r"(a), "f"(v) : "memory");
}
__device__ __forceinline__ void gvm_sts(unsigned a, unsigned v) {
    asm volatile("st.shared.u32 [%0], %1;" :: "r"(a), "r"(v) : "memory");
}
__device__ __forceinline__ void gvm_sts(unsigned a, float4 v) {
    asm volatile("st.shared.v4.f32 [%0], {%1,%2,%3,%4};" :: "r"(a), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
}
__device__ __forceinline__ void gvm_sts(unsigned a, uint4 v) {
    asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};" :: "r"(a), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
__device__ __forceinline__ float gvm_lds_f(unsigned a) {
    float v;
    asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(a) : "memory");
    return v;
}
__device__ __forceinline__ unsigned gvm_lds_u(unsigned a) {
    unsigned v;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(a) : "memory");
    return v;
}
// Two bytes, zero-extended (an f16 or e4m3 pair).
__device__ __forceinline__ unsigned gvm_lds_u16(unsigned a) {
    unsigned short v;
    asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(a) : "memory");
    return v;
}
__device__ __forceinline__ float4 gvm_lds_f4(unsigned a) {
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(a) : "memory");
    return v;
}
__device__ __forceinline__ uint2 gvm_lds_u2(unsigned a) {
    uint2 v;
    asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(a) : "memory");
    return v;
}
__device__ __forceinline__ uint4 gvm_lds_u4(unsigned a) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a) : "memory");
    return v;
}
// Four 8 x 16-byte matrices of shared memory, lane l giving row l % 8 of matrix
// l / 8 (16-byte aligned): word j of the result is word l % 4 of matrix j's row
// l / 4. For 32-bit elements that is an mma.sync fragment (a tf32 A quad, or two
// B pairs) straight from rows as they lie, with no register moves to assemble it.
__device__ __forceinline__ uint4 gvm_ldsm_x4(unsigned a) {
    uint4 v;
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a) : "memory");
    return v;
}

// 2^x by the SFU alone: -inf -> 0, subnormal results flushed to 0 (exp2f adds
// three instructions to scale those back, which softmax weights never need).
__device__ __forceinline__ float gvm_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// ---- tensor cores ---------------------------------------------------------------------
// D += A(16x16, row) * B(16x8, col), f16 or bf16 in, f32 accumulate (PTX fragment layout).
__device__ __forceinline__ void gvm_mma_f16(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                            unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// m16n8k8, tf32 in (an f32's top 19 bits: the MMA ignores the low 13), f32 accumulate:
// a0 row g k t, a1 row g + 8, a2 / a3 k t + 4; b0 k t col g, b1 k t + 4.
__device__ __forceinline__ void gvm_mma_tf32(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                             unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void gvm_mma_bf16(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                            unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// ---- warpgroup mma (sm_90a) -------------------------------------------------------------
// wgmma reads shared memory through the async proxy: a thread's earlier
// generic writes (st.shared, cp.async) are visible to it after this fence.
__device__ __forceinline__ void gvm_fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
__device__ __forceinline__ void gvm_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
// r is written here as far as the compiler knows: its producers stay before this point.
__device__ __forceinline__ void gvm_reg_fence(unsigned& r) { asm volatile("" : "+r"(r)::"memory"); }
__device__ __forceinline__ void gvm_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void gvm_wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
}
// The 32 f32 accumulators of an m64n64 wgmma, as asm operands 0..31.
#define GVM_WG_D32(d)                                                                                         \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),   \
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),  \
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define GVM_WG_D32_REGS "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
#define GVM_WG_D32_LIST "{" GVM_WG_D32_REGS "}"
// D(64 x 64, f32) += A(64 rows x 16 k) B(64 rows x 16 k)^T, bf16 or f16, both
// from shared memory (by descriptor: common.cuh, gvm_wgmma_desc), by the 4 warps
// of a warpgroup. Warp w, lane (g, q) holds d[4 j + i]: row 16 w + g + 8 (i >> 1),
// column 8 j + 2 q + (i & 1).
__device__ __forceinline__ void gvm_wgmma_bf16_n64(float (&d)[32], unsigned long long a, unsigned long long b) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " GVM_WG_D32_LIST ", %32, %33, 1, 1, 1, 0, 0;"
                 : GVM_WG_D32(d) : "l"(a), "l"(b));
}
__device__ __forceinline__ void gvm_wgmma_f16_n64(float (&d)[32], unsigned long long a, unsigned long long b) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " GVM_WG_D32_LIST ", %32, %33, 1, 1, 1, 0, 0;"
                 : GVM_WG_D32(d) : "l"(a), "l"(b));
}
// The same, f16, 72 columns (B: 72 rows), with A from registers: warp w's rows
// 16 w .. 16 w + 15 in mma.sync's A fragment (a0: row g, k 2q, 2q + 1; a1: row
// g + 8; a2, a3: k + 8), which is a D fragment's layout, so that an m64n64
// result (P) feeds the next MMA's A without leaving registers. d[32 + i] are
// columns 64 + 2 q + (i & 1).
__device__ __forceinline__ void gvm_wgmma_f16_rs_n72(float (&d)[36], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                                     unsigned long long b) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n72k16.f32.f16.f16 {" GVM_WG_D32_REGS ",%32,%33,%34,%35}, {%36, %37, %38, %39}, %40, 1, 1, 1, 0;"
                 : GVM_WG_D32(d), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b));
}
