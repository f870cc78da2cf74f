// Small device helpers shared by the Muse ops: tensor descriptors, bit-level
// number formats, sortable keys, warp and group reductions. Plain C++ over the
// primitives of ptx.cuh (conversions, loads, shared memory, mma), so that
// tools/ops_emu can run these same lines on the host with its own ptx.cuh.
// Free of toolkit headers: NVRTC needs no include path beyond the repository.
#pragma once
#include "op_ctx.cuh"
#include "ptx.cuh"

#define GVM_NEG_INF __int_as_float(0xff800000u)
#define GVM_LOG2E 1.4426950408889634f
#define GVM_LN2 0.6931471805599453f

// ---- tensor table ------------------------------------------------------------
__device__ __forceinline__ bool gvm_has(const gvm_ctx& c, int slot) {
    return c.ins->tensor[slot] != GVM_NONE;
}

// Base address plus an element offset (bytes per element given).
template <typename T>
__device__ __forceinline__ T* gvm_ptr(const gvm_tensor& t, long long elem_off, int elem_bytes) {
    return reinterpret_cast<T*>(t.ptr + (unsigned long long)(elem_off * elem_bytes));
}

// A tensor's base, outer strides and dtype, read out of the table once, for
// the loops that store. Through the descriptor itself (a reference into the
// table in global memory, which a store might alias) each store made the next
// access reload the fields it uses: dependent loads before every store of a
// loop (three an element in the staged GEMM pass's 64 stores a thread, session
// 62), and the loop's reads of other tensors reloaded too.
struct gvm_view {
    char* ptr;
    long long s0, s1, s2;  // elements (fields past the tensor's rank are never used)
    int dtype;
};
__device__ __forceinline__ gvm_view gvm_view_of(const gvm_tensor& t) {
    return {reinterpret_cast<char*>(t.ptr), t.stride[0], t.stride[1], t.stride[2], t.dtype};
}
template <typename T>
__device__ __forceinline__ T* gvm_ptr(const gvm_view& o, long long elem_off, int elem_bytes) {
    return reinterpret_cast<T*>(o.ptr + elem_off * elem_bytes);
}

// The ops' argument checks combine their conditions with & (and these helpers
// too), not &&: every descriptor field is then read unconditionally, so the
// reads go out together. As a chain of && each read was a branch's condition,
// one round trip after another (~100 for an expert op: 5 us from L2, H200,
// tools/expert_bench.py GVM_EXPR_PROBE=128). Only a read that is not safe
// without an earlier condition (an optional tensor, a divisor) keeps a guard.

// Dtype, rank and a unit innermost stride: the checks every op makes first.
__device__ __forceinline__ bool gvm_is(const gvm_tensor& t, int dtype, int ndim) {
    return (t.dtype == dtype) & (t.ndim == ndim) & (t.stride[ndim - 1] == 1);
}

// Base and every outer stride aligned to `bytes` (elements of elem_bytes each),
// so that vector accesses of that width are legal anywhere in the tensor.
__device__ __forceinline__ bool gvm_aligned(const gvm_tensor& t, int elem_bytes, int bytes) {
    bool ok = (t.ptr % (unsigned long long)bytes) == 0;
#pragma unroll
    for (int d = 0; d + 1 < GVM_MAX_DIMS; ++d) ok &= (d + 1 >= t.ndim) | ((t.stride[d] * elem_bytes) % bytes == 0);
    return ok;
}

// ---- bf16 / f16 / fp8 / fp4 ------------------------------------------------------
__device__ __forceinline__ float gvm_bf16_lo(unsigned w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float gvm_bf16_hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }

// bf16 pair -> f16 pair (exact for |x| in [2^-14, 65504]).
__device__ __forceinline__ unsigned gvm_bf16x2_to_f16x2(unsigned w) {
    return gvm_pack_f16x2(gvm_bf16_lo(w), gvm_bf16_hi(w));
}

// Eight e2m1 codes of a word of tiled NVFP4 -> eight e4m3 bytes of value
// code * 2^-6: even codes (0,2,4,6) in *even_b, odd codes (1,3,5,7) in *odd_b.
// The tiling stores each byte's pair of codes with its bits placed for this
// (gpuvm/muse/formats.py, E2M1_TILED_BITS): the even code at bits 7 (sign),
// 4, 3 (exponent), 2 (mantissa), which is its e4m3 byte s|00ee|m00 already,
// the odd code's at 5, 6, 1, 0, two shifts from there: 5 instructions for 8
// codes (7 from nibbles). s|00ee|m00 is exactly the code times 2^-6, for the
// subnormal code (0.5) too, so the hardware e4m3 -> f16 conversion finishes it.
__device__ __forceinline__ void gvm_e2m1x8_to_e4m3(unsigned w, unsigned* even_b, unsigned* odd_b) {
    *even_b = w & 0x9c9c9c9cu;
    *odd_b = ((w << 2) & 0x8c8c8c8cu) | ((w >> 2) & 0x10101010u);
}

// ---- warpgroup mma operands -------------------------------------------------------
// A K-major operand in wgmma's 128-byte swizzle: row r of 64 b16 values (128
// bytes) at base + 128 r, its 16-byte chunk c at c ^ (r & 7) (gvm_wgmma_at),
// base 1024-byte aligned, 8-row groups 1024 bytes apart. gvm_wgmma_desc is its
// descriptor; that of the 16 k from value 16 s of every row is that of base + 32 s.
__device__ __forceinline__ unsigned gvm_wgmma_at(unsigned base, unsigned r, unsigned c) {
    return base + r * 128u + ((c ^ (r & 7u)) << 4);
}
__device__ __forceinline__ unsigned long long gvm_wgmma_desc(unsigned base) {
    return (unsigned long long)((base & 0x3ffffu) >> 4) | (1ull << 16) | ((unsigned long long)(1024 >> 4) << 32) |
           (1ull << 62);
}
// The descriptor n 16-byte units on (+2 a k16 step of f16 / bf16): an add to the
// low word's start address (14 bits of a shared address >> 4, never carried out),
// not a 64-bit add (ptxas spent 3 instructions on each of a step's descriptors).
__device__ __forceinline__ unsigned long long gvm_wgmma_desc_add(unsigned long long d, unsigned n) {
    return (d & 0xffffffff00000000ull) | (unsigned)((unsigned)d + n);
}

// ---- sortable keys -------------------------------------------------------------
// Monotone map f32 -> u32 (-0 == +0), never 0, so 0 can mark "no candidate".
__device__ __forceinline__ unsigned gvm_sort_key(float v) {
    unsigned u = v == 0.0f ? 0u : __float_as_uint(v);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return u ? u : 1u;
}

__device__ __forceinline__ float gvm_sort_key_value(unsigned k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// ---- reductions ---------------------------------------------------------------------
__device__ __forceinline__ float gvm_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over the 128 threads of the group. Uses 8 floats of shared scratch as two
// alternating halves: a thread can only rewrite a half after the next call's
// barrier, which every thread reaches after reading it, so one barrier per call.
struct gvm_group_sum {
    unsigned buf;   // shared address of 8 floats
    unsigned phase;
    __device__ __forceinline__ gvm_group_sum(unsigned addr) : buf(addr), phase(0) {}
    __device__ __forceinline__ float operator()(const gvm_ctx& c, float v) {
        v = gvm_warp_sum(v);
        if ((c.tid & 31) == 0) gvm_sts(buf + (phase * 4 + (c.tid >> 5)) * 4, v);
        gvm_group_sync(c);
        const float4 r = gvm_lds_f4(buf + phase * 16);
        phase ^= 1u;
        return (r.x + r.y) + (r.z + r.w);
    }
};

// Four sums over the group at once (gvm_group_sum for float4s), in the same
// fixed order, with 32 floats of scratch as two alternating halves.
struct gvm_group_sum4 {
    unsigned buf;   // shared address of 32 floats, 16-byte aligned
    unsigned phase;
    __device__ __forceinline__ gvm_group_sum4(unsigned addr) : buf(addr), phase(0) {}
    __device__ __forceinline__ float4 operator()(const gvm_ctx& c, float4 v) {
        v = make_float4(gvm_warp_sum(v.x), gvm_warp_sum(v.y), gvm_warp_sum(v.z), gvm_warp_sum(v.w));
        if ((c.tid & 31) == 0) gvm_sts(buf + (phase * 4 + (c.tid >> 5)) * 16, v);
        gvm_group_sync(c);
        const unsigned h = buf + phase * 64;
        const float4 a = gvm_lds_f4(h), b = gvm_lds_f4(h + 16), d = gvm_lds_f4(h + 32), e = gvm_lds_f4(h + 48);
        phase ^= 1u;
        return make_float4((a.x + b.x) + (d.x + e.x), (a.y + b.y) + (d.y + e.y), (a.z + b.z) + (d.z + e.z),
                           (a.w + b.w) + (d.w + e.w));
    }
};
