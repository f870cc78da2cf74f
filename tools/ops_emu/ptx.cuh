// Host versions of the PTX primitives of ops/ptx.cuh, one function each, with
// the instruction's semantics: round-to-nearest-even conversions (e4m3
// saturating to +-448), plain loads and copies, shared memory checked for bounds,
// alignment and races between barriers, mma computed from the 32 lanes'
// fragments in the PTX layout, and wgmma from its shared-memory descriptors.
#pragma once
#include "op_ctx.cuh"

namespace emu {

inline float e4m3_value(unsigned b) {
    const unsigned e = (b >> 3) & 15, m = b & 7;
    float v = e == 0 ? std::ldexp((float)m, -9) : std::ldexp(1.0f + (float)m / 8.0f, (int)e - 7);
    if (e == 15 && m == 7) v = NAN;
    return (b & 0x80) ? -v : v;
}

// Nearest e4m3 (ties to the even code), |x| >= 448 -> +-448, NaN -> NaN.
inline unsigned e4m3_bits(float x) {
    if (std::isnan(x)) return 0x7f;
    const unsigned s = std::signbit(x) ? 0x80 : 0;
    const float a = std::fabs(x);
    if (a >= 448.0f) return s | 0x7e;
    unsigned lo = 0;  // largest code with value <= a (values grow with the code)
    while (lo < 0x7e && e4m3_value(lo + 1) <= a) ++lo;
    if (e4m3_value(lo) == a) return s | lo;
    const float dl = a - e4m3_value(lo), dh = e4m3_value(lo + 1) - a;
    return s | ((dl < dh || (dl == dh && (lo & 1) == 0)) ? lo : lo + 1);
}

inline unsigned short f16_bits(float x) {
    const _Float16 h = (_Float16)x;
    unsigned short u;
    std::memcpy(&u, &h, 2);
    return u;
}

inline float f16_value(unsigned short u) {
    _Float16 h;
    std::memcpy(&h, &u, 2);
    return (float)h;
}

inline float bf16_value(unsigned short u) { return __uint_as_float((unsigned)u << 16); }  // exact

inline unsigned short bf16_bits(float x) {
    unsigned u = __float_as_uint(x);
    if (std::isnan(x)) return 0x7fff;
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline unsigned char* smem_at(unsigned a, unsigned bytes, bool write) {
    Machine* m = machine();
    if (a % bytes != 0) fail("misaligned shared access at " + std::to_string(a));
    if ((unsigned long long)a + bytes > m->smem_bytes) fail("shared access at " + std::to_string(a) + " past the scratch");
    const short me = (short)m->cur;
    const int wm = m->cur >> 5;
    const unsigned wep = m->wepoch[wm];
    for (unsigned i = a; i < a + bytes; ++i) {
        if (m->cp_pending[i])
            fail(std::string(write ? "write of" : "read of") + " shared byte " + std::to_string(i) + " while thread " +
                 std::to_string(m->cp_pending[i] - 1) + "'s cp.async into it has not landed (no cp.async.wait_group covers it)");
        if (m->bulk_bar[i] && !write) {
            const auto seen = m->bar_seen[m->cur].find(m->bulk_bar[i] - 1);
            if (seen == m->bar_seen[m->cur].end() || seen->second <= m->bulk_phase[i])
                fail("read of shared byte " + std::to_string(i) + " before this thread waited for phase " +
                     std::to_string(m->bulk_phase[i]) + " of the mbarrier at " + std::to_string(m->bulk_bar[i] - 1) +
                     ", which its bulk copy completes");
        }
        if (write) m->bulk_bar[i] = 0;  // a plain store: the byte no longer waits on a copy
        const bool raw = m->w_epoch[i] == m->epoch && m->writer[i] != me &&
                         !(m->writer[i] >> 5 == wm && m->w_wep[i] < wep);  // a warp barrier of this warp between
        const bool war = write && m->r_epoch[i] == m->epoch && m->reader[i] != me && !(m->r_warp[i] == wm && m->r_wep[i] < wep);
        if (raw || war)
            fail(std::string(raw ? (write ? "write after write" : "read after write") : "write after read") +
                 " of shared byte " + std::to_string(i) + " by another thread with no barrier between");
        if (write) {
            m->w_epoch[i] = m->epoch;
            m->writer[i] = me;
            m->w_wep[i] = wep;
        } else {
            const bool again = m->r_epoch[i] == m->epoch;  // read before in this epoch
            m->reader[i] = again && m->reader[i] != me ? (short)-2 : me;
            m->r_warp[i] = again && m->r_warp[i] != wm ? (signed char)-1 : (signed char)wm;
            m->r_epoch[i] = m->epoch;
            m->r_wep[i] = wep;
        }
    }
    return m->smem + a;
}

}  // namespace emu

inline unsigned gvm_pack_bf16x2(float lo, float hi) { return emu::bf16_bits(lo) | ((unsigned)emu::bf16_bits(hi) << 16); }
inline unsigned gvm_pack_f16x2(float lo, float hi) { return emu::f16_bits(lo) | ((unsigned)emu::f16_bits(hi) << 16); }
inline unsigned short gvm_pack_e4m3x2(float lo, float hi) {
    return (unsigned short)(emu::e4m3_bits(lo) | (emu::e4m3_bits(hi) << 8));
}
inline unsigned gvm_e4m3x2_to_f16x2(unsigned w) {
    return emu::f16_bits(emu::e4m3_value(w & 0xff)) | ((unsigned)emu::f16_bits(emu::e4m3_value((w >> 8) & 0xff)) << 16);
}
inline unsigned gvm_e4m3x2_hi_to_f16x2(unsigned w) { return gvm_e4m3x2_to_f16x2(w >> 16); }
inline unsigned gvm_hmul2(unsigned a, unsigned b) {
    return gvm_pack_f16x2(emu::f16_value(a & 0xffff) * emu::f16_value(b & 0xffff),
                          emu::f16_value(a >> 16) * emu::f16_value(b >> 16));
}

template <int H> inline unsigned gvm_hmul2_dup(unsigned a, unsigned b) {
    const unsigned h = H ? b >> 16 : b & 0xffff;
    return gvm_hmul2(a, h | (h << 16));
}

template <class T> inline T gvm_emu_load(const void* p) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
}
inline unsigned long long gvm_policy_evict_first() { return 0; }
inline unsigned long long gvm_policy_evict_normal() { return 0; }
inline uint4 gvm_ld_stream16(const void* p) { return gvm_emu_load<uint4>(p); }
inline uint2 gvm_ld_stream8(const void* p) { return gvm_emu_load<uint2>(p); }

// cp.async: a copy counts as this thread's write of its bytes when issued (the
// race check), and lands when a cp.async.wait_group covers its commit group;
// until then any access to those bytes fails (a missing or too-shallow wait).
inline void gvm_emu_cp_async(unsigned dst, const void* src, bool valid, unsigned bytes) {
    emu::Machine* m = emu::machine();
    emu::smem_at(dst, bytes, true);
    for (unsigned i = dst; i < dst + bytes; ++i) m->cp_pending[i] = (short)(m->cur + 1);
    m->cp_open[m->cur].push_back(emu::AsyncCopy{dst, bytes, valid ? src : nullptr});
}
inline void gvm_cp_async16(unsigned dst, const void* src, bool valid, unsigned long long) { gvm_emu_cp_async(dst, src, valid, 16); }
inline void gvm_cp_async4(unsigned dst, const void* src, bool valid, unsigned long long) { gvm_emu_cp_async(dst, src, valid, 4); }
inline void gvm_cp_async_commit() {
    emu::Machine* m = emu::machine();
    m->cp_groups[m->cur].push_back(std::move(m->cp_open[m->cur]));
    m->cp_open[m->cur].clear();
}
// Lands this thread's committed groups but the newest n.
inline void gvm_emu_cp_async_land(unsigned n) {
    emu::Machine* m = emu::machine();
    auto& groups = m->cp_groups[m->cur];
    while (groups.size() > n) {
        for (const emu::AsyncCopy& cp : groups.front()) {
            if (cp.src)
                std::memcpy(m->smem + cp.dst, cp.src, cp.bytes);
            else
                std::memset(m->smem + cp.dst, 0, cp.bytes);
            std::memset(&m->cp_pending[cp.dst], 0, cp.bytes * sizeof(short));
        }
        groups.erase(groups.begin());
    }
}
template <int N> inline void gvm_cp_async_wait() { gvm_emu_cp_async_land(N); }
inline unsigned gvm_opaque(unsigned v) { return v; }
inline unsigned gvm_atom_add_acq_rel(unsigned* p, unsigned v) { return atomicAdd(p, v); }
inline unsigned long long gvm_atom_add_acq_rel_u64(unsigned long long* p, unsigned long long v) { const unsigned long long o = *p; *p = o + v; return o; }
inline unsigned gvm_ld_acquire(const unsigned* p) { return *p; }
inline void gvm_red_release_add(unsigned* p, unsigned v) { *p += v; }
inline unsigned long long gvm_release_add2(unsigned* a, unsigned v, unsigned long long* b, unsigned long long w) {
    *a += v;
    return gvm_atom_add_acq_rel_u64(b, w);
}
inline bool gvm_reached(unsigned value, unsigned target) { return (int)(value - target) >= 0; }
// One fiber at a time: a counter not reached now never is (the op's wait would time out).
inline bool gvm_poll_reached(const unsigned* p, unsigned target, unsigned long long) { return gvm_reached(*p, target); }
// Bulk copies land at once here, but a thread may read their bytes only after
// it has waited for the mbarrier phase they complete. Each mbarrier keeps its
// state beside the scratch (pending arrivals, bytes announced less bytes landed,
// completed phases), so that a wait on a phase that cannot complete (a
// deadlock), a copy into a barrier that was never set up, or a barrier left with
// bytes pending fails.
namespace emu {
inline Bar& bar_at(unsigned a, const char* what) {
    auto& bars = machine()->bars;
    auto it = bars.find(a);
    if (it == bars.end() || it->second.count == 0) fail(std::string(what) + " on shared byte " + std::to_string(a) + ": no mbarrier set up there");
    return it->second;
}
// Does [a, a + bytes) lie inside one of the instruction's tensors?
inline bool in_tensors(const unsigned char* a, unsigned bytes) {
    for (const auto& t : machine()->tensors)
        if (a >= t.first && a + bytes <= t.first + t.second) return true;
    return false;
}
inline void bar_step(Bar& b) {
    if (b.pending == 0 && b.tx == 0) {
        ++b.phases;
        b.pending = b.count;
        ++machine()->progress;  // a waiter may go on (run.cpp: a round without progress is a deadlock)
    }
}
}  // namespace emu
inline void gvm_bar_init(unsigned bar, unsigned count) {
    if (bar % 8) emu::fail("misaligned mbarrier at " + std::to_string(bar));
    emu::smem_at(bar, 8, true);
    emu::machine()->bars[bar] = emu::Bar{count, count, 0, 0};
    for (auto& seen : emu::machine()->bar_seen) seen.erase(bar);  // its phases count from 0 again
}
inline void gvm_bar_inval(unsigned bar) {
    emu::Bar& b = emu::bar_at(bar, "mbarrier.inval");
    if (b.tx != 0 || b.pending != b.count) emu::fail("mbarrier at " + std::to_string(bar) + " invalidated with a phase open");
    emu::machine()->bars.erase(bar);
    for (unsigned& owner : emu::machine()->bulk_bar)  // its copies' bytes stay as they are, readable
        if (owner == bar + 1) owner = 0;
}
inline void gvm_bar_expect(unsigned bar, unsigned bytes) {
    emu::Bar& b = emu::bar_at(bar, "mbarrier.arrive.expect_tx");
    if (b.pending == 0) emu::fail("mbarrier at " + std::to_string(bar) + ": more arrivals than its count");
    b.tx += bytes;
    --b.pending;
    emu::bar_step(b);
}
inline void gvm_bulk_g2s(unsigned dst, const void* src, unsigned bytes, unsigned bar, unsigned long long) {
    if (bytes == 0 || bytes % 16 || dst % 16 || reinterpret_cast<unsigned long long>(src) % 16)
        emu::fail("bulk copy of " + std::to_string(bytes) + " bytes: not a nonzero multiple of 16 between 16-byte aligned addresses");
    const unsigned char* a = static_cast<const unsigned char*>(src);
    if (!emu::in_tensors(a, bytes)) emu::fail("bulk copy of " + std::to_string(bytes) + " bytes from outside every tensor of the instruction");
    emu::Bar& b = emu::bar_at(bar, "bulk copy");
    emu::Machine* m = emu::machine();
    for (unsigned i = 0; i < bytes; i += 16) std::memcpy(emu::smem_at(dst + i, 16, true), a + i, 16);
    for (unsigned i = dst; i < dst + bytes; ++i) {  // readable once the reader has waited for the phase it completes
        m->bulk_bar[i] = bar + 1;
        m->bulk_phase[i] = b.phases;
    }
    b.tx -= bytes;
    emu::bar_step(b);
}
inline void gvm_fence_proxy_async() {}
// Phase k (parity k & 1) is complete once phases > k; the waiter's phase is the
// newest of its parity. A wait yields to the other threads until it completes
// (the arrival or a copy may be another lane's); one that never does ends the
// run as a deadlock, where the GPU's wait would time out and trap.
inline void gvm_bar_wait(unsigned bar, unsigned parity) {
    for (;;) {
        const emu::Bar& b = emu::bar_at(bar, "mbarrier wait");
        if (b.phases > 0 && ((b.phases - 1) & 1u) == parity) {
            unsigned& seen = emu::machine()->bar_seen[emu::machine()->cur][bar];
            seen = std::max(seen, b.phases);
            return;
        }
        emu::yield();
    }
}
// A bulk prefetch on the GPU takes 16-byte aligned ranges of a multiple of 16
// bytes; here it must also lie inside one of the instruction's tensors.
inline void gvm_prefetch_l2(const void* p, unsigned bytes) {
    const unsigned char* a = static_cast<const unsigned char*>(p);
    if (bytes == 0 || bytes % 16 != 0 || reinterpret_cast<unsigned long long>(a) % 16 != 0)
        emu::fail("gvm_prefetch_l2 of " + std::to_string(bytes) + " bytes: not a nonzero multiple of 16 at a 16-byte aligned address");
    if (!emu::in_tensors(a, bytes)) emu::fail("gvm_prefetch_l2 of " + std::to_string(bytes) + " bytes outside every tensor of the instruction");
}

inline unsigned gvm_smem_addr(const void* p) {
    const long long off = (const unsigned char*)p - emu::machine()->smem;
    if (off < 0 || off > (long long)emu::machine()->smem_bytes) emu::fail("gvm_smem_addr of a pointer outside the scratch");
    return (unsigned)off;
}
template <class T> inline void gvm_emu_sts(unsigned a, T v) { std::memcpy(emu::smem_at(a, sizeof(T), true), &v, sizeof(T)); }
template <class T> inline T gvm_emu_lds(unsigned a) {
    T v;
    std::memcpy(&v, emu::smem_at(a, sizeof(T), false), sizeof(T));
    return v;
}
inline void gvm_sts(unsigned a, float v) { gvm_emu_sts(a, v); }
inline void gvm_sts(unsigned a, unsigned v) { gvm_emu_sts(a, v); }
inline void gvm_sts(unsigned a, float4 v) { gvm_emu_sts(a, v); }
inline void gvm_sts(unsigned a, uint4 v) { gvm_emu_sts(a, v); }
inline float gvm_lds_f(unsigned a) { return gvm_emu_lds<float>(a); }
inline unsigned gvm_lds_u(unsigned a) { return gvm_emu_lds<unsigned>(a); }
inline unsigned gvm_lds_u16(unsigned a) { return gvm_emu_lds<unsigned short>(a); }
inline float4 gvm_lds_f4(unsigned a) { return gvm_emu_lds<float4>(a); }
inline uint2 gvm_lds_u2(unsigned a) { return gvm_emu_lds<uint2>(a); }
inline uint4 gvm_lds_u4(unsigned a) { return gvm_emu_lds<uint4>(a); }
inline uint4 gvm_ldsm_x4(unsigned a) {
    if (a & 15u) emu::fail("ldmatrix row address not 16-byte aligned");
    const int l = emu::lane();
    return emu::exchange(&a, 1, [l](unsigned (*x)[12]) {
        unsigned w[4];
        for (int j = 0; j < 4; ++j) w[j] = gvm_emu_lds<unsigned>(x[8 * j + l / 4][0] + 4u * (unsigned)(l % 4));
        return make_uint4(w[0], w[1], w[2], w[3]);
    });
}

// D += A * B with A 16xK, B Kx8, V = K / 8 values a register (K 16: f16 or bf16
// pairs; K 8: tf32): a0 holds row g, k V t .. V t + V - 1; a1 row g+8; a2, a3
// k + 4 V; b0 k V t .., col g; b1 k + 4 V; D (d0, d1: row g, cols 2t, 2t+1;
// d2, d3: row g+8); g = lane / 4, t = lane % 4. value(w, i) is value i of a
// register (the lower half is the lower index).
template <int K, class Value>
inline void gvm_emu_mma(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1, Value value) {
    constexpr int V = K / 8;
    const unsigned mine[6] = {a0, a1, a2, a3, b0, b1};
    const int l = emu::lane(), g = l >> 2, t = l & 3;
    emu::exchange(mine, 6, [&](unsigned (*x)[12]) {
        for (int i = 0; i < 4; ++i) {
            const int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
            double acc = d[i];
            for (int k = 0; k < K; ++k) {
                const int q = (k % (4 * V)) / V, r = k / (4 * V), e = k % V;  // lane t, register, value of k
                acc += value(x[(row & 7) * 4 + q][(row >> 3) + 2 * r], e) * value(x[col * 4 + q][4 + r], e);
            }
            d[i] = (float)acc;
        }
        return 0;
    });
}
// ex2.approx.ftz: subnormal inputs and results flush to zero
inline float gvm_ex2(float x) {
    if (std::fpclassify(x) == FP_SUBNORMAL) x = 0.0f;
    const float y = std::exp2(x);
    return std::fpclassify(y) == FP_SUBNORMAL ? 0.0f : y;
}
inline void gvm_mma_f16(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
    gvm_emu_mma<16>(d, a0, a1, a2, a3, b0, b1,
                    [](unsigned w, int e) { return (double)emu::f16_value((unsigned short)(e ? w >> 16 : w & 0xffff)); });
}
inline void gvm_mma_bf16(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
    gvm_emu_mma<16>(d, a0, a1, a2, a3, b0, b1,
                    [](unsigned w, int e) { return (double)emu::bf16_value((unsigned short)(e ? w >> 16 : w & 0xffff)); });
}
// m16n8k8 tf32 (see ops/ptx.cuh): the inputs' low 13 bits are ignored.
inline void gvm_mma_tf32(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
    gvm_emu_mma<8>(d, a0, a1, a2, a3, b0, b1, [](unsigned w, int) { return (double)__uint_as_float(w & 0xffffe000u); });
}

// wgmma: an op is queued when issued and computed when a wait retires its
// commit group, reading shared memory then: a buffer overwritten, or an
// accumulator read, before the wait gives a wrong result here as on the GPU.
namespace emu {
inline std::vector<WgmmaOp>& wgmma_queue() { return machine()->wgmma[machine()->cur]; }
// Shared address of value k of row r of a K-major, 128-byte-swizzled operand.
inline unsigned wgmma_at(unsigned long long desc, int r, int k) {
    const unsigned start = (unsigned)(desc & 0x3fffu) << 4, sbo = (unsigned)((desc >> 32) & 0x3fffu) << 4;
    if ((desc >> 62) != 1) fail("wgmma descriptor without the 128-byte swizzle");
    if (start & 0x380u) fail("wgmma operand not 1024-byte aligned");
    const unsigned a = start + (unsigned)(r >> 3) * sbo + (unsigned)(r & 7) * 128u + 2u * (unsigned)k;
    return a ^ (((a >> 7) & 7u) << 4);
}
inline double wgmma_value(unsigned short v, bool f16) { return f16 ? (double)f16_value(v) : (double)bf16_value(v); }
inline double wgmma_operand(unsigned long long desc, int r, int k, bool f16) {
    return wgmma_value(gvm_emu_lds<unsigned short>(wgmma_at(desc, r, k)), f16);
}
inline void wgmma_run(const WgmmaOp& op) {
    const int w = warp(), g = lane() >> 2, q = lane() & 3;
    const bool f16 = op.kind != 0;
    double a[2][16], b[18][16];  // the thread's rows g, g + 8 and columns 8 j + 2 q + e (index 2 j + e), each read once
    for (int h = 0; h < 2; ++h)
        for (int k = 0; k < 16; ++k) {
            const unsigned ak = op.ra[h][k >> 1];
            a[h][k] = op.kind == 2 ? wgmma_value((unsigned short)(k & 1 ? ak >> 16 : ak & 0xffff), true)
                                   : wgmma_operand(op.a, 16 * w + g + 8 * h, k, f16);
        }
    for (int c = 0; c < 2 * op.nj; ++c)
        for (int k = 0; k < 16; ++k) b[c][k] = wgmma_operand(op.b, 8 * (c >> 1) + 2 * q + (c & 1), k, f16);
    for (int j = 0; j < op.nj; ++j)
        for (int i = 0; i < 4; ++i) {
            double acc = op.d[4 * j + i];
            for (int k = 0; k < 16; ++k) acc += a[i >> 1][k] * b[2 * j + (i & 1)][k];
            op.d[4 * j + i] = (float)acc;
        }
}
}  // namespace emu
inline void gvm_fence_async_smem() {}
inline void gvm_wgmma_fence() {}
inline void gvm_reg_fence(unsigned&) {}
inline void gvm_wgmma_bf16_n64(float (&d)[32], unsigned long long a, unsigned long long b) {
    emu::wgmma_queue().push_back({d, a, b, 0, 0, {}});
}
inline void gvm_wgmma_f16_n64(float (&d)[32], unsigned long long a, unsigned long long b) {
    emu::wgmma_queue().push_back({d, a, b, 0, 1, {}});
}
// A from registers: the warp's lanes trade their fragments when the MMA is
// issued (the registers are read then), each keeping its two rows' 16 k.
inline void gvm_wgmma_f16_rs_n72(float (&d)[36], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned long long b) {
    emu::WgmmaOp op{d, 0, b, 0, 2, {}, 9};
    const unsigned mine[4] = {a0, a1, a2, a3};
    const int g = emu::lane() >> 2;
    emu::exchange(mine, 4, [&](unsigned (*x)[12]) {
        for (int p = 0; p < 8; ++p)  // k pair p of rows g (a0, a2) and g + 8 (a1, a3): lane 4 g + p % 4
            for (int h = 0; h < 2; ++h) op.ra[h][p] = x[4 * g + (p & 3)][h + 2 * (p >> 2)];
        return 0;
    });
    emu::wgmma_queue().push_back(op);
}
inline void gvm_wgmma_commit() {
    auto& q = emu::wgmma_queue();
    int g = 1;  // after every group still in flight
    for (const auto& op : q) g = op.group >= g ? op.group + 1 : g;
    for (auto& op : q)
        if (op.group == 0) op.group = g;
}
template <int N> inline void gvm_wgmma_wait() {
    auto& q = emu::wgmma_queue();
    int newest = 0;
    for (const auto& op : q) {
        if (op.group == 0) emu::fail("wgmma_wait with an uncommitted wgmma");
        newest = op.group > newest ? op.group : newest;
    }
    std::vector<emu::WgmmaOp> left;
    for (const auto& op : q)
        if (op.group > newest - N) left.push_back(op);
        else emu::wgmma_run(op);
    q = left;
}
