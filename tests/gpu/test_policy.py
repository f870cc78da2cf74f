"""The L2 cache policies ops/ptx.cuh writes as constants (GVM_L2_EVICT_FIRST,
GVM_L2_EVICT_NORMAL) are the values createpolicy gives on this device."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from gpuvm.device.build import compile_source

OPS = Path(__file__).resolve().parents[2] / "ops"

SOURCE = r"""
#include "ptx.cuh"
extern "C" __global__ void gvm_policy_probe(unsigned long long* out) {
    unsigned long long first, normal;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(first));
    asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(normal));
    out[0] = first;
    out[1] = gvm_policy_evict_first();
    out[2] = normal;
    out[3] = gvm_policy_evict_normal();
}
"""


def test_policy_constants_match_createpolicy() -> None:
    from cuda.core import Device, LaunchConfig, ObjectCode, launch

    cubin, _ = compile_source(SOURCE, "policy_probe.cu", [str(OPS)], [])
    dev = Device(0)
    dev.set_current()
    kernel = ObjectCode.from_cubin(cubin).get_kernel("gvm_policy_probe")
    out = torch.zeros(4, dtype=torch.int64, device="cuda")
    stream = dev.create_stream()
    launch(stream, LaunchConfig(grid=1, block=1), kernel, np.uint64(out.data_ptr()))
    stream.sync()
    got = [v & (2**64 - 1) for v in out.tolist()]
    assert got[1] == got[0], f"GVM_L2_EVICT_FIRST {got[1]:#x}, createpolicy gives {got[0]:#x}"
    assert got[3] == got[2], f"GVM_L2_EVICT_NORMAL {got[3]:#x}, createpolicy gives {got[2]:#x}"
