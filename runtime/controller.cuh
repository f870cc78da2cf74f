// Warp 0: claims instructions in stream order and hands them to free compute
// groups, ready ones first, with the claims' and records' latencies pipelined.
//
// The controller holds up to GVM_CLAIM_SLOTS claims in a ring of register
// slots with fixed positions (the ring loop is unrolled, so every slot is its
// own registers). Visiting slot j, it (1) reads the claim of slot j+A
// (A = GVM_CLAIM_AHEAD) and starts copying that instruction's 128-byte record
// into the slot's staging area (cp.async; one commit group per visit, so a
// record staged A visits ago is complete once at most A groups are pending),
// (2) offers slot j's instruction to a free group (below: only when its waits
// are met, unless GVM_READY_FIRST is 0), (3) issues the next claim into slot j
// when it is empty. At most p.claim_depth slots hold a claim: a claimed
// instruction waits for this block's groups even when another block has a
// free one, so a deep queue costs balance (measured: depth 1 is fastest on the
// Muse layer and step with ready first).
//
// No deadlock, by construction, with a queue of any depth d. Every
// instruction waits only on instructions earlier in the stream, and a block's
// claims come in increasing stream order (one atomic head, or an increasing
// static list). Take the earliest instruction m not finished: everything m
// waits on is finished. If a group has m, it completes. If m is not claimed
// yet, every claimed instruction is earlier than m (claims are in stream
// order), hence finished and no longer held, so some block has room to claim
// m. If m is held by a block: with ready first, one of that block's groups
// only ever gets instructions whose waits were seen met (parking, below,
// leaves one group unparked), which finish, so it comes free and m, being
// ready, goes to it; in claim order (GVM_READY_FIRST 0), the entries
// ahead of m and every instruction in that block's groups are earlier than m,
// hence finished, so m is at the head when a group comes free. In dynamic mode
// this needs no co-residency (an unstarted block holds nothing); static mode
// needs every block resident, which the launch checks.
#pragma once
#include "shared.cuh"
#include "stamps.cuh"
#include "ctrl_prof.cuh"
#include "../scheduler/claim.cuh"
#include "../scheduler/counters.cuh"

// Visits between a slot's record staging and its first offer to a group; the
// claim before it has GVM_CLAIM_SLOTS - GVM_CLAIM_AHEAD visits to come back.
// A visit that hands out an instruction takes ~900 cycles, enough for a
// record's L2 read, while an atomic on the head all blocks contend for can
// take several (H200, efc2077, empty instructions at depth 6: dynamic 0.445
// us per instruction per block at 1, 0.464 at 2, 0.483 at 3; static 0.437 at
// each).
#ifndef GVM_CLAIM_AHEAD
#define GVM_CLAIM_AHEAD 1
#endif

#define GVM_CS_EMPTY 0u    // slot holds nothing
#define GVM_CS_CLAIMED 1u  // claim issued, its index not read yet
#define GVM_CS_LOADED 2u   // index read, record load issued
#define GVM_CS_WAITING 3u  // its waits were not met: a probe of its counters is on its way

// Ready first: a claimed instruction whose waits are not met stays in the
// controller, which probes its counters once a ring turn (cp.async of the
// counters' 16-byte lines into the slot's probe area, read a turn later), and
// goes to a group only when they are met, so that a group never sits on a
// wait while a ready instruction queued behind it could run (H200, 4233027:
// step 1x1 19.5 ms against 22.6 in claim order, both at depth 1). Its weights'
// prefetch is queued for the loader when it first waits. After
// GVM_READY_PATIENCE_NS of waiting a slot goes to a group anyway, whose
// counter wait then enforces the watchdog as before.
#ifndef GVM_READY_FIRST
#define GVM_READY_FIRST 1
#endif
#define GVM_READY_PATIENCE_NS 20000000u  // 20 ms

// Parking: an instruction whose waits are not met still goes to a group when
// one is free and another stays free of such instructions (gvm_can_park): the
// group then waits on the counters itself, which sees a signal sooner than
// the controller's probe a turn later (H200, b8a60d7, a chain of dependent
// empty instructions at depth 1: 1.02 us per link when the groups wait, 2.30
// when the controller probes).
#ifndef GVM_PARK
#define GVM_PARK 1
#endif

// Lazy claims (GVM_FLAG_LAZY, dynamic mode): after handing out an instruction
// with the flag, a block claims only while one of its groups is free, so that
// no claim of a one-wave phase waits behind two busy groups while another
// block's group idles (the squeeze's tail at 128 tokens, README "Issue 6's
// targets"); the claim's latency is then exposed at the hand-offs of a full block.
// GVM_LAZY_CLAIMS 0 compiles the rule out (what it costs a visit).
#ifndef GVM_LAZY_CLAIMS
#define GVM_LAZY_CLAIMS 1
#endif

struct gvm_cslot {
    unsigned state;  // GVM_CS_*, the same in every lane
    unsigned idx;    // the stream index (CLAIMED: the claim as issued, gvm_claim_issue)
};

// Lane w < n_waits: wait w of the record (one word per lane) as counter and
// this step's target; other lanes get GVM_NONE.
__device__ __forceinline__ void gvm_wait_of(const gvm_params& p, unsigned word, unsigned n_waits, unsigned lane,
                                            unsigned& ctr, unsigned& target) {
    const unsigned w = lane & 3u;
    const unsigned cword = __shfl_sync(0xffffffffu, word, 2 + (w >> 1));
    const unsigned base = __shfl_sync(0xffffffffu, word, 4 + w), per_step = __shfl_sync(0xffffffffu, word, 8 + w);
    ctr = lane < n_waits && lane < GVM_MAX_WAITS ? (w & 1u ? cword >> 16 : cword & 0xffffu) : GVM_NONE;
    target = base + p.step * per_step;
}

// Starts copying the 16-byte line of this lane's counter into the probe area.
__device__ __forceinline__ void gvm_probe_issue(const gvm_params& p, unsigned* probe, unsigned ctr, unsigned lane) {
    if (ctr != GVM_NONE)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(gvm_smem_u32(probe + 4 * lane)),
                     "l"(p.counters + (ctr & ~3u))
                     : "memory");
}

// True in every lane when each wait's probed counter reached its target.
__device__ __forceinline__ bool gvm_probe_met(const unsigned* probe, unsigned ctr, unsigned target, unsigned lane) {
    const bool ok = ctr == GVM_NONE || gvm_reached(probe[4 * lane + (ctr & 3u)], target);
    return __all_sync(0xffffffffu, ok);
}

// Starts copying the claimed instruction's record into the slot's staging
// area (lanes 0-7, 16 bytes each). A cp.async, not a load into registers: a
// register load shares a scoreboard with the controller's other loads, and
// the compiler then waits for the newest record at every visit (seen in the
// SASS at 3e6785a); cp.async groups are waited for by count, exactly.
// stage: the area's shared-memory address.
__device__ __forceinline__ void gvm_stage_record(const gvm_instr* instrs, unsigned stage, unsigned idx, unsigned lane) {
    if (lane < 8)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(stage + 16u * lane),
                     "l"(reinterpret_cast<const uint4*>(instrs + idx) + lane)
                     : "memory");
}

// One commit group per visit, even an empty one, so that a record staged A
// visits ago is complete once at most A groups are pending.
__device__ __forceinline__ void gvm_stage_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

__device__ __forceinline__ unsigned gvm_lds(unsigned addr) {
    unsigned v;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
    return v;
}

// This lane's word of the record staged A visits ago at shared address
// `stage`, and its n_waits and flags (read at once, not shuffled out of the word).
__device__ __forceinline__ unsigned gvm_staged_word(unsigned stage, unsigned lane, unsigned& n_waits, unsigned& flags) {
    asm volatile("cp.async.wait_group %0;" ::"n"(GVM_CLAIM_AHEAD) : "memory");
    __syncwarp();  // the word was copied by another lane
    n_waits = gvm_lds(stage + 4u) >> 16;
    flags = gvm_lds(stage) >> 16;
    return gvm_lds(stage + 4u * lane);
}

// Queues the weight range and the waits (from gvm_wait_of) of an instruction
// that has waits for the loader, or stamps LOAD = CLAIM if it has nothing to
// prefetch. Never waits for the loader: with the ring full the prefetch is
// skipped (it is only a hint).
__device__ __forceinline__ void gvm_queue_prefetch(const gvm_params& p, gvm_shared& sh, unsigned& ring_head,
                                                   unsigned idx, unsigned word, unsigned lane, unsigned n_waits,
                                                   unsigned ctr, unsigned target) {
    // words: 1 signal | n_waits << 16, 2-3 wait_counter[4], 4-7 wait_base, 8-11 wait_step,
    // 12-15 tensor[8], 16-17 pf_offset, 18 pf_bytes, 19 pf_slot | reserved << 16
    const unsigned pf_slot = __shfl_sync(0xffffffffu, word, 19) & 0xffffu;
    const unsigned pf_bytes = __shfl_sync(0xffffffffu, word, 18);
    const unsigned lo = __shfl_sync(0xffffffffu, word, 16), hi = __shfl_sync(0xffffffffu, word, 17);
    const unsigned tword = __shfl_sync(0xffffffffu, word, 12 + ((pf_slot >> 1) & 3u));
    const unsigned tensor = pf_slot & 1u ? tword >> 16 : tword & 0xffffu;
    bool push = pf_slot < GVM_MAX_TENSORS && pf_bytes != 0 && tensor != GVM_NONE;
    push = __shfl_sync(0xffffffffu, push && ring_head - sh.ring_tail < GVM_PF_RING, 0);
    if (!push) {
        if (lane == 0) GVM_STAMP_COPY(p.trace, idx, GVM_STAMP_LOAD, GVM_STAMP_CLAIM);
        return;
    }
    gvm_pf_entry& e = sh.ring[ring_head % GVM_PF_RING];
    if (lane < GVM_MAX_WAITS) {
        e.counter[lane] = ctr;
        e.target[lane] = target;
    }
    if (lane == 0) {
        e.idx = idx;
        e.tensor = tensor;
        e.offset = (unsigned long long)hi << 32 | lo;
        e.bytes = pf_bytes;
        e.n_waits = n_waits;
    }
    __syncwarp();
    ++ring_head;
    if (lane == 0) {
        __threadfence_block();
        sh.ring_head = ring_head;
    }
}

// Hands one instruction to a free group (waits for one; traps if the
// hand-off is broken, see gvm_mbar_wait).
__device__ __forceinline__ void gvm_hand_off(const gvm_params& p, gvm_shared& sh, gvm_groups_view& view,
                                             unsigned& ring_head, const gvm_cslot& s, unsigned word, unsigned n_waits,
                                             unsigned groups, bool parked, unsigned lane, gvm_prof& pr) {
    // A waiting or parked instruction's prefetch was queued by the caller.
    // Ready first hands out any other only when it has no waits: the loader
    // would not prefetch for it, so nothing is queued.
    if (s.state != GVM_CS_WAITING && !parked) {
        if (GVM_READY_FIRST) {
            if (lane == 0) GVM_STAMP_COPY(p.trace, s.idx, GVM_STAMP_LOAD, GVM_STAMP_CLAIM);
        } else {
            unsigned ctr, target;
            gvm_wait_of(p, word, n_waits, lane, ctr, target);
            gvm_queue_prefetch(p, sh, ring_head, s.idx, word, lane, n_waits, ctr, target);
        }
    }
    gvm_prof_mark(pr, GVM_LEG_QUEUE);
    const unsigned g = gvm_acquire_group(view, sh.empty, groups, gvm_handoff_bound(p.watchdog_ns));
    if (g == GVM_NONE) gvm_handoff_trap();
    gvm_prof_mark(pr, GVM_LEG_ACQUIRE);
    reinterpret_cast<unsigned*>(&sh.slot[g].ins)[lane] = word;
    if (lane == 0) sh.slot[g].idx = s.idx;
    __syncwarp();
    if (lane == 0) gvm_mbar_arrive(&sh.full[g]);
    gvm_mark_busy(view, g, parked);
    gvm_prof_mark(pr, GVM_LEG_SLOT);
    gvm_prof_count(pr);
}

__device__ __forceinline__ void gvm_controller(const gvm_params& p, gvm_shared& sh) {
    const unsigned lane = threadIdx.x & 31u;
    // launch constants and shared addresses the visits use, in registers
    const unsigned n = gvm_reg(p.n_instrs), groups = gvm_reg(p.groups);
    const gvm_instr* instrs = reinterpret_cast<const gvm_instr*>(gvm_reg(reinterpret_cast<unsigned long long>(p.instrs)));
    const unsigned stage0 = gvm_reg(gvm_smem_u32(&sh.stage[0][0]));
    const unsigned depth = p.claim_depth == 0u || p.claim_depth > GVM_CLAIM_SLOTS ? GVM_CLAIM_SLOTS : p.claim_depth;
    const unsigned* abort_flag = p.state + GVM_STATE_ABORT;
    gvm_groups_view view{0u, 0u, 0u, 0u};
    if (p.n_warm != 0) gvm_mark_busy(view, 0);  // the warmer handed group 0 its warm instruction
    gvm_claimer claimer = gvm_claimer_init(p);
    gvm_cslot s[GVM_CLAIM_SLOTS];
#pragma unroll
    for (unsigned j = 0; j < GVM_CLAIM_SLOTS; ++j) s[j] = gvm_cslot{GVM_CS_EMPTY, 0u};
    unsigned held = 0;         // slots not empty
    bool lazy = false;         // the last instruction handed out had GVM_FLAG_LAZY (dynamic mode)
    const unsigned lazy_flag = GVM_LAZY_CLAIMS && claimer.mode != GVM_MODE_STATIC ? GVM_FLAG_LAZY : 0u;
    bool exhausted = false;    // a claim came back past the end: every later one will too
    bool aborted = false;      // a block failed: hand out nothing more
    unsigned ring_head = 0;
    gvm_prof pr;
    gvm_prof_init(pr);
    for (unsigned turn = 0;; ++turn) {
        // Another block failed: read rarely (the groups watch it too, and a
        // load here would stall the visits that follow it).
        const bool check_abort = (turn & 15u) == 15u;
        const unsigned abort_word = lane == 0 && check_abort ? gvm_ld_relaxed(abort_flag) : 0u;
#pragma unroll
        for (unsigned j = 0; j < GVM_CLAIM_SLOTS; ++j) {
            const unsigned fj = (j + GVM_CLAIM_AHEAD) % GVM_CLAIM_SLOTS;
            // the groups' state, tested now and taken in when a held instruction is decided below
            const bool group_done = gvm_test_group(view, sh.empty, groups);
            gvm_cslot& f = s[fj];
            if (f.state == GVM_CS_CLAIMED) {
                f.idx = gvm_claim_finish(claimer, f.idx, n);
                if (f.idx >= n || aborted) {
                    exhausted = exhausted || f.idx >= n;
                    f.state = GVM_CS_EMPTY;
                    --held;
                } else {
                    if (lane == 0) GVM_STAMP(p.trace, f.idx, GVM_STAMP_CLAIM);
                    gvm_stage_record(instrs, stage0 + fj * 128u, f.idx, lane);
                    f.state = GVM_CS_LOADED;
                }
            }
            gvm_stage_commit();
            gvm_prof_mark(pr, GVM_LEG_CLAIM);
            gvm_cslot& h = s[j];
            // taken into the view at most once a visit (a group handed out below is busy, though it tested done)
            const unsigned done_mask = __ballot_sync(0xffffffffu, group_done);
            bool retired = false;
            if (h.state == GVM_CS_LOADED || h.state == GVM_CS_WAITING) {
                retired = true;
                unsigned n_waits, flags;
                const unsigned word = gvm_staged_word(stage0 + j * 128u, lane, n_waits, flags);  // also completes the probe of a turn ago
                gvm_retire_mask(view, done_mask);
                gvm_prof_mark(pr, GVM_LEG_RECORD);
                bool go = !GVM_READY_FIRST || aborted || n_waits == 0;
                bool park = false;
                if (!go) {
                    unsigned ctr, target;
                    gvm_wait_of(p, word, n_waits, lane, ctr, target);
                    const unsigned now = (unsigned)__shfl_sync(0xffffffffu, lane == 0 ? gvm_globaltimer() : 0ull, 0);
                    go = h.state == GVM_CS_WAITING &&
                         (gvm_probe_met(sh.probe[j], ctr, target, lane) || now - sh.since[j] > GVM_READY_PATIENCE_NS);
                    if (!go && GVM_PARK && gvm_can_park(view, groups)) {
                        if (h.state == GVM_CS_LOADED)  // its weights start loading now, as it waits in the group
                            gvm_queue_prefetch(p, sh, ring_head, h.idx, word, lane, n_waits, ctr, target);
                        go = park = true;
                    }
                    if (!go) {
                        gvm_probe_issue(p, sh.probe[j], ctr, lane);  // in the next visit's commit group
                        if (h.state == GVM_CS_LOADED) {  // its weights start loading now, before its waits are met
                            gvm_queue_prefetch(p, sh, ring_head, h.idx, word, lane, n_waits, ctr, target);
                            sh.since[j] = now;  // the same in every lane
                        }
                        h.state = GVM_CS_WAITING;
                    }
                }
                gvm_prof_mark(pr, GVM_LEG_DECIDE);
                if (go) {
                    lazy = (flags & lazy_flag) != 0u;
                    if (!aborted) gvm_hand_off(p, sh, view, ring_head, h, word, n_waits, groups, park, lane, pr);
                    h.state = GVM_CS_EMPTY;
                    --held;
                }
            }
            if (h.state == GVM_CS_EMPTY && !exhausted && !aborted && held < depth) {
                if (lazy && !retired) gvm_retire_mask(view, done_mask);  // no collective in the branch
                if (!lazy || gvm_has_free_group(view, groups)) {
                    h.idx = gvm_claim_issue(claimer);
                    h.state = GVM_CS_CLAIMED;
                    ++held;
                }
            }
            gvm_prof_mark(pr, GVM_LEG_ISSUE);
        }
        if (check_abort) aborted = aborted || __shfl_sync(0xffffffffu, abort_word, 0) != 0u;
        if ((exhausted || aborted) && held == 0) break;
    }
    gvm_prof_flush(pr, lane);
    const unsigned long long bound = gvm_handoff_bound(p.watchdog_ns);
    for (unsigned g = 0; g < p.groups; ++g) {
        if (!gvm_drain_group(view, sh.empty, p.groups, g, bound)) gvm_handoff_trap();
        if (lane == 0) {
            sh.slot[g].idx = GVM_SLOT_EXIT;
            gvm_mbar_arrive(&sh.full[g]);
        }
        gvm_mark_busy(view, g);
    }
    if (lane == 0) {
        __threadfence_block();
        sh.ring_closed = 1u;
    }
    __syncwarp();
}
