// Synthetic ops: they prove the VM (scheduling, dependencies, timing) with
// semantics simple enough to check bit for bit against the CPU backend.
//
// Sources may have been written earlier in the same launch by another SM, so
// they are read with plain (coherent) loads, never the non-coherent path.
#pragma once
#include "op_ctx.cuh"
#include "../runtime/params.cuh"
#include "../runtime/stamps.cuh"

__device__ __forceinline__ long long gvm_syn_numel(const gvm_tensor& t) {
    long long n = 1;
#pragma unroll
    for (int d = 0; d < GVM_MAX_DIMS; ++d) n *= d < t.ndim ? t.shape[d] : 1;
    return n;
}

// [a0, a0 + a1) must lie inside every listed f32 tensor.
__device__ __forceinline__ bool gvm_syn_range_ok(const gvm_ctx& c, int n_tensors) {
    const long long i0 = c.ins->arg[0], n = c.ins->arg[1];
    if (i0 < 0 || n < 0) return false;
    for (int s = 0; s < n_tensors; ++s) {
        if (c.ins->tensor[s] == GVM_NONE) return false;
        const gvm_tensor& t = gvm_t(c, s);
        if (t.dtype != GVM_DT_F32 || i0 + n > gvm_syn_numel(t)) return false;
    }
    return true;
}

__device__ __forceinline__ int gvm_op_nop(const gvm_ctx&) { return GVM_ERR_NONE; }

// One thread spins on %globaltimer; the rest of the group waits at the
// runtime's barrier after the op.
__device__ __forceinline__ int gvm_op_sleep(const gvm_ctx& c) {
    const int ns = c.ins->arg[0];
    if (ns < 0) return GVM_ERR_BAD_ARGS;
    if (c.tid == 0 && ns > 0) {
        const unsigned long long end = gvm_globaltimer() + (unsigned long long)ns;
        for (unsigned long long now = gvm_globaltimer(); now < end; now = gvm_globaltimer()) {
            const unsigned long long left = end - now;
            gvm_nanosleep(left < 1000ull ? (unsigned)left : 1000u);
        }
    }
    return GVM_ERR_NONE;
}

// dst[i] = f(x[i], y[i]) over [a0, a0 + a1) of flat f32 tensors (y unused
// when Y is false): a float4 body when every pointer is 16-byte aligned at
// a0, scalar otherwise and for the tail.
template <bool Y, class F>
__device__ __forceinline__ void gvm_syn_elementwise(const gvm_ctx& c, F f) {
    const long long i0 = c.ins->arg[0], n = c.ins->arg[1];
    float* dst = reinterpret_cast<float*>(gvm_t(c, 0).ptr) + i0;
    const float* x = reinterpret_cast<const float*>(gvm_t(c, 1).ptr) + i0;
    const float* y = Y ? reinterpret_cast<const float*>(gvm_t(c, 2).ptr) + i0 : x;
    long long done = 0;
    if (((reinterpret_cast<unsigned long long>(dst) | reinterpret_cast<unsigned long long>(x) |
          reinterpret_cast<unsigned long long>(y)) & 15ull) == 0) {
        const long long n4 = n >> 2;
#pragma unroll 1
        for (long long i = c.tid; i < n4; i += GVM_GROUP_THREADS) {
            const float4 a = reinterpret_cast<const float4*>(x)[i];
            const float4 b = Y ? reinterpret_cast<const float4*>(y)[i] : a;
            reinterpret_cast<float4*>(dst)[i] = make_float4(f(a.x, b.x), f(a.y, b.y), f(a.z, b.z), f(a.w, b.w));
        }
        done = n4 << 2;
    }
#pragma unroll 1
    for (long long i = done + c.tid; i < n; i += GVM_GROUP_THREADS) dst[i] = f(x[i], Y ? y[i] : 0.0f);
}

struct gvm_syn_copy {
    __device__ float operator()(float x, float) const { return x; }
};

// a*x + b*y with two products and a sum, each rounded: no contraction into an
// FMA, so the result is the CPU backend's bit for bit.
struct gvm_syn_scale_add {
    float a, b;
    __device__ float operator()(float x, float y) const { return __fadd_rn(__fmul_rn(a, x), __fmul_rn(b, y)); }
};

__device__ __forceinline__ int gvm_op_copy(const gvm_ctx& c) {
    if (!gvm_syn_range_ok(c, 2)) return GVM_ERR_BAD_ARGS;
    gvm_syn_elementwise<false>(c, gvm_syn_copy{});
    return GVM_ERR_NONE;
}

__device__ __forceinline__ int gvm_op_scale_add(const gvm_ctx& c) {
    if (!gvm_syn_range_ok(c, 3)) return GVM_ERR_BAD_ARGS;
    gvm_syn_elementwise<true>(c, gvm_syn_scale_add{gvm_argf(c, 2), gvm_argf(c, 3)});
    return GVM_ERR_NONE;
}
