// Inside an SM: the controller hands instructions to compute groups through a
// shared-memory slot per group and two mbarriers per group.
//
//   full[g]  (count 1): the controller wrote slot[g] and arrived (release);
//                       the group's threads wait on it (acquire).
//   empty[g] (count 1): the group finished the slot's instruction; one thread
//                       arrived after a group barrier; the controller polls it.
//
// Phases alternate, so each side only tracks the parity of the phase it waits
// for next. A fresh mbarrier is in phase 0: waiting on parity 0 blocks until
// the first arrival completes it.
#pragma once
#include "../isa/gvm_isa.h"
#include "../runtime/stamps.cuh"
#include "../ops/ptx.cuh"
#include "../ops/op_ctx.cuh"  // gvm_descs

// How long the controller naps between polls of busy groups (0: it spins).
#ifndef GVM_HANDOFF_NAP_NS
#define GVM_HANDOFF_NAP_NS 32
#endif

#define GVM_SLOT_EXIT 0xFFFFFFFFu   // slot.idx: leave the group loop
#define GVM_SLOT_WARM 0x80000000u   // slot.idx bit: a warm instruction, index below the bit

struct __align__(16) gvm_slot {
    gvm_instr ins;   // the record being run
    unsigned idx;    // its stream index, or GVM_SLOT_WARM | w, or GVM_SLOT_EXIT
    unsigned pad[3];
    // its operands' descriptors by slot (zeros for an absent one): copied in by
    // the group while its waits run (runtime/group.cuh), read by the ops (gvm_t)
    gvm_descs desc;
};

__device__ __forceinline__ unsigned gvm_smem_u32(const void* p) {
    return (unsigned)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void gvm_mbar_init(unsigned long long* bar, unsigned count) {
    gvm_bar_init(gvm_smem_u32(bar), count);
}

__device__ __forceinline__ void gvm_mbar_arrive(unsigned long long* bar) {
    asm volatile("{ .reg .b64 st; mbarrier.arrive.release.cta.shared::cta.b64 st, [%0]; }" ::"r"(gvm_smem_u32(bar))
                 : "memory");
}

// Non-blocking: has the phase of this parity completed?
__device__ __forceinline__ bool gvm_mbar_test(unsigned long long* bar, unsigned parity) {
    unsigned ok;
    asm volatile(
        "{ .reg .pred p; mbarrier.test_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2; selp.b32 %0, 1, 0, p; }"
        : "=r"(ok)
        : "r"(gvm_smem_u32(bar)), "r"(parity)
        : "memory");
    return ok != 0;
}

// Bounded (gvm_bar_wait_for): false once bound_ns have passed with the phase
// still open. Neither side of a hand-off ever waits that long in a sound kernel
// (a group's longest stay is its op plus a watchdog-bounded counter wait), so a
// timeout means the hand-off itself is broken, and the caller stops the kernel
// instead of hanging.
__device__ __forceinline__ bool gvm_mbar_wait(unsigned long long* bar, unsigned parity, unsigned long long bound_ns) {
    return gvm_bar_wait_for(gvm_smem_u32(bar), parity, bound_ns);
}

// How long a hand-off may take at most: twice the launch's watchdog bound
// plus 100 ms (an op's own run time is far below that).
__device__ __forceinline__ unsigned long long gvm_handoff_bound(unsigned long long watchdog_ns) {
    return 2ull * watchdog_ns + 100000000ull;
}

// A hand-off timed out: nothing can finish this launch cleanly any more (a
// group or the controller would wait forever at the block's final barrier),
// so the kernel traps: the host sees a failed launch, not a hang.
__device__ __noinline__ void gvm_handoff_trap() {
    asm volatile("trap;");
}

// The controller's view of its groups: which are busy, and the parity of the
// empty-phase each busy group will complete next. Kept identical in every
// lane of the controller warp.
struct gvm_groups_view {
    unsigned busy;           // bit g: group g holds an instruction
    unsigned empty_parity;   // bit g: parity to wait for on empty[g]
    unsigned next;           // where the search for a free group starts
    unsigned parked;         // bit g: group g holds an instruction whose waits were not seen met
};

__device__ __forceinline__ void gvm_mark_busy(gvm_groups_view& v, unsigned g, bool parked = false) {
    v.busy |= 1u << g;
    v.parked = parked ? v.parked | 1u << g : v.parked & ~(1u << g);
}

// Is one of the block's groups free?
__device__ __forceinline__ bool gvm_has_free_group(const gvm_groups_view& v, unsigned groups) {
    return (~v.busy & ((1u << groups) - 1u)) != 0u;
}

// May an instruction whose waits are not met yet go to a free group, to wait
// on its counters there? Only while another group stays free of such waits
// (the deadlock argument in runtime/controller.cuh needs one per block).
__device__ __forceinline__ bool gvm_can_park(const gvm_groups_view& v, unsigned groups) {
    return gvm_has_free_group(v, groups) && (unsigned)__popc(v.parked) + 2u <= groups;
}

// Lane g < groups: has busy group g finished (its empty phase completed)?
// One test per lane, all groups at once. The answer is only consumed by
// gvm_retire_groups, so a test issued early overlaps whatever comes between.
__device__ __forceinline__ bool gvm_test_group(const gvm_groups_view& v, unsigned long long* empty, unsigned groups) {
    const unsigned lane = threadIdx.x & 31u;
    return lane < groups && ((v.busy >> lane) & 1u) && gvm_mbar_test(&empty[lane], (v.empty_parity >> lane) & 1u);
}

// Marks the groups in done_mask (a ballot of gvm_test_group) as free: plain
// register logic, the same in every lane.
__device__ __forceinline__ void gvm_retire_mask(gvm_groups_view& v, unsigned done_mask) {
    const unsigned m = done_mask & v.busy;
    v.busy &= ~m;
    v.parked &= ~m;
    v.empty_parity ^= m;
}

// Marks the groups whose lanes saw them finished as free (the view stays the
// same in every lane: it changes only by the ballot).
__device__ __forceinline__ void gvm_retire_groups(gvm_groups_view& v, bool done) {
    gvm_retire_mask(v, __ballot_sync(0xffffffffu, done));
}

// Returns a free group, the first at or after v.next (round-robin, so that
// consecutive instructions go to different groups); polls while none is free.
// Past bound_ns it returns GVM_NONE (see gvm_mbar_wait: a broken hand-off).
__device__ __forceinline__ unsigned gvm_acquire_group(gvm_groups_view& v, unsigned long long* empty, unsigned groups,
                                                      unsigned long long bound_ns) {
    const unsigned all = (1u << groups) - 1u;
    unsigned long long t0 = 0;
    for (;;) {
        const unsigned f = ~v.busy & all;
        if (f != 0u) {
            unsigned g = v.next;
            if (!((f >> g) & 1u)) {
                const unsigned r = ((f >> g) | (f << (groups - g))) & all;  // free groups from v.next on
                g += __ffs(r) - 1u;
                g = g >= groups ? g - groups : g;
            }
            v.next = g + 1 >= groups ? 0 : g + 1;
            return g;
        }
        const unsigned long long now = __shfl_sync(0xffffffffu, gvm_globaltimer(), 0);  // one clock for the warp
        if (t0 == 0) t0 = now;
        else if (now - t0 > bound_ns) return GVM_NONE;
        if (GVM_HANDOFF_NAP_NS != 0) gvm_nanosleep(GVM_HANDOFF_NAP_NS);  // spare the groups' issue slots
        gvm_retire_groups(v, gvm_test_group(v, empty, groups));
    }
}

// Blocks until group g is free (before it is told to exit); false past bound_ns.
__device__ __forceinline__ bool gvm_drain_group(gvm_groups_view& v, unsigned long long* empty, unsigned groups,
                                                unsigned g, unsigned long long bound_ns) {
    unsigned long long t0 = 0;
    for (;;) {
        gvm_retire_groups(v, gvm_test_group(v, empty, groups));
        if (!((v.busy >> g) & 1u)) return true;
        const unsigned long long now = __shfl_sync(0xffffffffu, gvm_globaltimer(), 0);
        if (t0 == 0) t0 = now;
        else if (now - t0 > bound_ns) return false;
    }
}
