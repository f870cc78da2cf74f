// Dependencies across SMs: monotonic global counters, and the watchdog.
//
// A producer group signals with one release-increment after a group barrier
// (the barrier orders the other threads' stores before it; release is
// cumulative). A consumer thread acquire-polls until
// (int)(value - target) >= 0, then the group barrier hands the acquired
// view to the rest of the group. Every poll reads %globaltimer: past the
// watchdog bound it records the first failure of the launch and raises the
// abort flag, which every other waiter and the controller also watch, so a
// wait that can never be met ends the kernel instead of hanging it.
#pragma once
#include "../isa/gvm_isa.h"
#include "../runtime/stamps.cuh"
#include "../ops/ptx.cuh"  // the counters' loads and adds, and the polls' naps (GVM_WAIT_NAP_MIN / _MAX)

// Records a failure; only the first one of a launch is kept. Raises abort.
__device__ __noinline__ void gvm_fail(gvm_error* err, unsigned* abort_flag, unsigned code, unsigned instr,
                                      unsigned counter, unsigned seen, unsigned target, unsigned step,
                                      unsigned long long waited_ns, unsigned long long detail) {
    if (atomicCAS(&err->code, 0u, code) == 0u) {
        err->instr = instr;
        err->counter = counter;
        err->seen = seen;
        err->target = target;
        err->sm = gvm_smid();
        err->block = blockIdx.x;
        err->step = step;
        err->waited_ns = waited_ns;
        err->detail = detail;
        __threadfence();
    }
    atomicExch(abort_flag, 1u);
}

// Polls counter until it reaches target. Returns GVM_ERR_NONE, GVM_ERR_WATCHDOG
// (this wait passed the bound; recorded) or GVM_ERR_ABORTED (someone else failed).
__device__ __forceinline__ unsigned gvm_wait_counter(const unsigned* counter_ptr, unsigned counter, unsigned target,
                                                  unsigned instr, unsigned step, unsigned long long bound_ns,
                                                  gvm_error* err, unsigned* abort_flag) {
    unsigned v = gvm_ld_acquire(counter_ptr);
    if (gvm_reached(v, target)) return GVM_ERR_NONE;
    const unsigned long long t0 = gvm_globaltimer();
    unsigned backoff = GVM_WAIT_NAP_MIN;
    for (;;) {
        if (backoff != 0) gvm_nanosleep(backoff);
        backoff = backoff * 2 < GVM_WAIT_NAP_MAX ? backoff * 2 : GVM_WAIT_NAP_MAX;
        // the abort flag's load goes out first, beside the counter's: one round trip a poll, not two
        // in series (the gap between a counter's signal and the poll that sees it is half a poll)
        const unsigned aborted = gvm_ld_relaxed(abort_flag);
        v = gvm_ld_acquire(counter_ptr);
        if (gvm_reached(v, target)) return GVM_ERR_NONE;
        if (aborted != 0u) return GVM_ERR_ABORTED;
        const unsigned long long waited = gvm_globaltimer() - t0;
        if (waited > bound_ns) {
            gvm_fail(err, abort_flag, GVM_ERR_WATCHDOG, instr, counter, v, target, step, waited, 0ull);
            return GVM_ERR_WATCHDOG;
        }
    }
}
