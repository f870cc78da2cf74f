// Warp 2: the instruction-cache warmer. Code is not readable as data here (a
// load through a device function pointer faults), so the kernel's code is
// warmed by running it: at launch, group 0 of block b first runs warm
// instruction b % n_warm, a tiny but real instance of one op over the host's
// dummy tensors (no waits, no signal, no trace), so the op's code is in L2
// and in that SM's instruction cache before the stream needs it.
#pragma once
#include "shared.cuh"

__device__ __forceinline__ void gvm_warmer(const gvm_params& p, gvm_shared& sh) {
    if (p.n_warm == 0) return;
    const unsigned lane = threadIdx.x & 31u;
    const unsigned w = blockIdx.x % p.n_warm;
    reinterpret_cast<unsigned*>(&sh.slot[0].ins)[lane] = __ldg(reinterpret_cast<const unsigned*>(p.warm_instrs + w) + lane);
    if (lane == 0) sh.slot[0].idx = GVM_SLOT_WARM | w;
    __syncwarp();
    if (lane == 0) gvm_mbar_arrive(&sh.full[0]);
}
