// The persistent kernel: one block per SM, each block a control group
// (warp 0 controller, warp 1 loader, warp 2 warmer, warp 3 spare so that the
// compute groups start at a warp index divisible by 4) and p.groups compute
// groups of 4 warps. It runs one step of the stream and exits; the last block
// out resets the claim head, so launches need no host-side reset and can be
// captured in a CUDA graph.
#include "params.cuh"
#include "shared.cuh"
#include "controller.cuh"
#include "loader.cuh"
#include "warm.cuh"
#include "group.cuh"

extern "C" __global__ void __launch_bounds__(GVM_BLOCK_THREADS, 1) gvm_kernel(const __grid_constant__ gvm_params p) {
    __shared__ gvm_shared sh;
    extern __shared__ __align__(1024) unsigned char gvm_scratch[];  // wgmma's swizzled stages (ops/gemm.cuh)
    if (threadIdx.x == 0) {
        for (unsigned g = 0; g < p.groups; ++g) {
            gvm_mbar_init(&sh.full[g], 1);
            gvm_mbar_init(&sh.empty[g], 1);
        }
        sh.ring_head = 0;
        sh.ring_tail = 0;
        sh.ring_closed = 0;
    }
    __syncthreads();
    const unsigned warp = threadIdx.x >> 5;
    if (warp == 0) {
        gvm_controller(p, sh);
    } else if (warp == 1) {
        gvm_loader(p, sh);
    } else if (warp == 2) {
        gvm_warmer(p, sh);
    } else if (warp >= GVM_CONTROL_THREADS / 32) {
        const unsigned g = (threadIdx.x - GVM_CONTROL_THREADS) / GVM_GROUP_THREADS;
        gvm_group(p, sh, g, gvm_scratch + g * GVM_GROUP_SMEM);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(p.state + GVM_STATE_EXITED, 1u) == gridDim.x - 1) {
            p.state[GVM_STATE_HEAD] = 0;
            p.state[GVM_STATE_EXITED] = 0;
        }
    }
}
