// A host SIMT machine for one warp group: 128 fibers run round-robin
// and meet at barriers, so that the Muse ops of ops/*.cuh run unchanged on the
// CPU. Warp collectives (shuffles, reductions, mma) rendezvous all 32 lanes of a
// warp; a barrier or collective that not every thread reaches is reported as a
// deadlock, a return code that differs between threads as divergence.
// Single OS thread: the fibers never run at the same time.
#pragma once
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#define __device__
#define __constant__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))

struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

template <class T> inline T min(T a, T b) { return b < a ? b : a; }
template <class T> inline T max(T a, T b) { return a < b ? b : a; }

inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __ffs(unsigned v) { return __builtin_ffs((int)v); }

// PRMT default mode: byte i of the result is byte sel[4i+3:4i] of {y, x}.
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const unsigned long long v = ((unsigned long long)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
}

// sin(pi x), cos(pi x); |x| <= 1 here (RoPE angles, reduced modulo 2 by the op).
inline void sincospif(float x, float* s, float* c) {
    const long double a = (long double)x * 3.141592653589793238462643383279502884L;
    *s = (float)std::sin(a);
    *c = (float)std::cos(a);
}

// Shared-memory atomics of the ops: the fibers never interleave inside one.
inline unsigned atomicAdd(unsigned* p, unsigned v) { const unsigned o = *p; *p = o + v; return o; }
inline unsigned atomicOr(unsigned* p, unsigned v) { const unsigned o = *p; *p = o | v; return o; }

namespace emu {

struct Barrier {
    int expected = 0, count = 0;
    unsigned gen = 0;
};

constexpr int kThreads = 128;
constexpr int kStack = 256 * 1024;

struct WgmmaOp {  // a wgmma issued and not yet retired by a wait (ptx.cuh)
    float* d;
    unsigned long long a, b;
    int group;   // its commit group; 0: not committed yet
    int kind;    // 0: bf16, A and B by descriptor; 1: f16 so; 2: f16, A from registers (ra)
    unsigned ra[2][8];  // kind 2: A rows g and g + 8 of the thread's warp, k pairs 0..7
    int nj = 8;         // N / 8: column groups of 8 (m64n64: 8, m64n72: 9)
};

// Fibers switch by pushing the callee-saved registers on their own stack and
// swapping stack pointers (x86-64, run.cpp): swapcontext also saves and sets the
// signal mask, a system call a switch, which took half the emulator's time.
// Other hosts use ucontext.
#if defined(__x86_64__)
extern "C" void gvm_emu_switch(void** save_sp, void* load_sp);
#endif

struct Bar {  // an mbarrier (ptx.cuh): arrivals still due this phase, bytes announced less bytes landed, phases completed
    unsigned count = 0, pending = 0, phases = 0;
    long long tx = 0;
};

struct AsyncCopy {
    unsigned dst, bytes;
    const void* src;  // nullptr: a zero fill
};

struct Machine {
#if defined(__x86_64__)
    void* main_sp = nullptr;
    void* sp[kThreads]{};  // a suspended fiber's stack pointer
#else
    ucontext_t main{};
    ucontext_t ctx[kThreads]{};
#endif
    char* stacks = nullptr;  // kThreads stacks of kStack bytes (run.cpp keeps them between instructions)
    bool done[kThreads]{};
    int cur = 0;
    unsigned long long progress = 0;      // barrier releases and exits
    Barrier group, warp[4];
    unsigned xch[4][32][12]{};            // per-lane exchange words of each warp
    unsigned char* smem = nullptr;
    unsigned smem_bytes = 0;
    // Race check of the scratch: per byte, who last wrote / read it in which
    // group-barrier epoch (reader -2: several threads). Two threads touching a
    // byte in one epoch, one of them writing, is a race on the GPU, unless both
    // are of one warp and a warp barrier (__syncwarp) came between: each
    // warp counts its own barriers (wepoch), and a byte keeps the warp count
    // of its last write and read, and the readers' warp (-1: several warps).
    unsigned epoch = 1;
    unsigned wepoch[4] = {1, 1, 1, 1};
    std::vector<unsigned> w_epoch, r_epoch, w_wep, r_wep;
    std::vector<short> writer, reader;
    std::vector<signed char> r_warp;
    std::vector<WgmmaOp> wgmma[kThreads];  // each thread's wgmma ops in flight
    // cp.async in flight: each thread's copies not committed yet, then its
    // committed groups (oldest first); they land at the cp.async.wait_group that
    // covers them. cp_pending, per scratch byte: 1 + the thread whose copy into
    // it has not landed (0: none), so that touching those bytes before fails.
    std::vector<AsyncCopy> cp_open[kThreads];
    std::vector<std::vector<AsyncCopy>> cp_groups[kThreads];
    std::vector<short> cp_pending;
    // Bulk copies: per scratch byte, 1 + the mbarrier its copy completes on (0:
    // none) and that phase's index; per thread, the phases of each mbarrier it
    // has waited for. A thread may read a bulk-copied byte only once it has
    // waited for that phase (the ops' lanes each wait before reading).
    std::vector<unsigned> bulk_bar, bulk_phase;
    std::map<unsigned, unsigned> bar_seen[kThreads];
    std::map<unsigned, Bar> bars;  // the instruction's mbarriers by shared address
    std::vector<std::pair<const unsigned char*, size_t>> tensors;  // [base, bytes) of the instruction's tensors
    std::string error;                     // first failure seen by a fiber
};

inline Machine*& machine() {
    static Machine* m = nullptr;
    return m;
}

inline int lane() { return machine()->cur & 31; }
inline int warp() { return machine()->cur >> 5; }

inline void yield() {
    Machine* m = machine();
#if defined(__x86_64__)
    gvm_emu_switch(&m->sp[m->cur], m->main_sp);
#else
    swapcontext(&m->ctx[m->cur], &m->main);
#endif
}

inline void wait(Barrier& b) {
    const unsigned gen = b.gen;
    if (++b.count == b.expected) {
        b.count = 0;
        ++b.gen;
        ++machine()->progress;
        if (&b == &machine()->group) ++machine()->epoch;
        for (int w = 0; w < 4; ++w)
            if (&b == &machine()->warp[w]) ++machine()->wepoch[w];
        return;
    }
    while (b.gen == gen) yield();
}

// Raised inside a fiber: recorded, and the fiber parks until the run is abandoned.
[[noreturn]] inline void fail(const std::string& what) {
    Machine* m = machine();
    if (m->error.empty()) m->error = what;
    for (;;) yield();
}

inline void check_mask(unsigned mask) {
    if (mask != 0xffffffffu) fail("warp collective with a partial mask");
}

// Every lane publishes n words, the warp meets, f reads what it needs, the warp
// meets again before the words are reused.
template <class F>
inline auto exchange(const unsigned* mine, int n, F f) {
    Machine* m = machine();
    const int w = warp(), l = lane();
    for (int i = 0; i < n; ++i) m->xch[w][l][i] = mine[i];
    wait(m->warp[w]);
    const auto r = f(m->xch[w]);
    wait(m->warp[w]);
    return r;
}

inline unsigned shfl_from(unsigned v, int src) {
    return exchange(&v, 1, [src](unsigned (*x)[12]) { return x[src][0]; });
}

}  // namespace emu

template <class T> inline T gvm_emu_shfl(T v, int src) {
    static_assert(sizeof(T) == 4, "32-bit shuffles only");
    unsigned u;
    std::memcpy(&u, &v, 4);
    u = emu::shfl_from(u, src);
    std::memcpy(&v, &u, 4);
    return v;
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
    emu::check_mask(mask);
    emu::wait(emu::machine()->warp[emu::warp()]);
}
template <class T> inline T __shfl_xor_sync(unsigned mask, T v, int o) {
    emu::check_mask(mask);
    return gvm_emu_shfl(v, emu::lane() ^ (o & 31));
}
template <class T> inline T __shfl_sync(unsigned mask, T v, int src) {
    emu::check_mask(mask);
    return gvm_emu_shfl(v, src & 31);
}
template <class T> inline T __shfl_up_sync(unsigned mask, T v, unsigned d) {
    emu::check_mask(mask);
    const int src = emu::lane() - (int)d;
    return gvm_emu_shfl(v, src < 0 ? emu::lane() : src);
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
    emu::check_mask(mask);
    const unsigned v = pred != 0;
    return emu::exchange(&v, 1, [](unsigned (*x)[12]) {
        unsigned r = 0;
        for (int i = 0; i < 32; ++i) r |= x[i][0] << i;
        return r;
    });
}
inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0u; }
inline unsigned __reduce_max_sync(unsigned mask, unsigned v) {
    emu::check_mask(mask);
    return emu::exchange(&v, 1, [](unsigned (*x)[12]) {
        unsigned r = 0;
        for (int i = 0; i < 32; ++i) r = x[i][0] > r ? x[i][0] : r;
        return r;
    });
}
inline unsigned __reduce_min_sync(unsigned mask, unsigned v) {
    emu::check_mask(mask);
    return emu::exchange(&v, 1, [](unsigned (*x)[12]) {
        unsigned r = 0xffffffffu;
        for (int i = 0; i < 32; ++i) r = x[i][0] < r ? x[i][0] : r;
        return r;
    });
}
inline void __threadfence() {}  // one host thread runs the lanes in turn: stores are already visible
