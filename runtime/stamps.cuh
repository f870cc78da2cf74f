// Clocks and self-timestamping.
//
// With GVM_TRACE defined, each instruction fills its gvm_trace record (at its
// stream index) with %globaltimer and clock64 at claim, load issue, ready,
// done and signal. Without it every GVM_STAMP* macro expands to nothing, so
// the untraced kernel carries no stamping code at all.
#pragma once
#include "../isa/gvm_isa.h"

__device__ __forceinline__ unsigned long long gvm_globaltimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ unsigned long long gvm_clock64() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(t));
    return t;
}

__device__ __forceinline__ unsigned gvm_smid() {
    unsigned s;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    return s;
}

__device__ __forceinline__ void gvm_nanosleep(unsigned ns) {
    asm volatile("nanosleep.u32 %0;" ::"r"(ns));
}

#ifdef GVM_TRACE
__device__ __forceinline__ void gvm_stamp(gvm_trace* tr, unsigned idx, int which) {
    if (tr == nullptr) return;
    tr[idx].globaltimer[which] = gvm_globaltimer();
    tr[idx].clock[which] = gvm_clock64();
}

__device__ __forceinline__ void gvm_stamp_where(gvm_trace* tr, unsigned idx, unsigned group) {
    if (tr == nullptr) return;
    tr[idx].sm = gvm_smid();
    tr[idx].block = blockIdx.x;
    tr[idx].group = group;
    tr[idx].instr = idx;
}

// Copies one stamp onto another (an instruction with nothing to prefetch
// "issues its loads" when it is claimed).
__device__ __forceinline__ void gvm_stamp_copy(gvm_trace* tr, unsigned idx, int to, int from) {
    if (tr == nullptr) return;
    tr[idx].globaltimer[to] = tr[idx].globaltimer[from];
    tr[idx].clock[to] = tr[idx].clock[from];
}
#define GVM_STAMP(tr, idx, which) gvm_stamp((tr), (idx), (which))
#define GVM_STAMP_WHERE(tr, idx, group) gvm_stamp_where((tr), (idx), (group))
#define GVM_STAMP_COPY(tr, idx, to, from) gvm_stamp_copy((tr), (idx), (to), (from))
#else
#define GVM_STAMP(tr, idx, which) ((void)0)
#define GVM_STAMP_WHERE(tr, idx, group) ((void)0)
#define GVM_STAMP_COPY(tr, idx, to, from) ((void)0)
#endif
