"""CI without a GPU: the standalone probe kernels of tools/ (copy rings, L2,
proxy fences) still compile for sm_90a through NVRTC, without local memory, so
that a session's device call does not find them broken."""
from __future__ import annotations

import pytest

from tests.test_device_build import _NVRTC

pytestmark = pytest.mark.skipif(not _NVRTC, reason="NVRTC is not available (pip install cuda-bindings nvidia-cuda-nvrtc)")

from gpuvm.device.build import compile_source, parse_ptxas  # noqa: E402
from tools import bulk_probe, fence_probe, l2_probe, ring_probe  # noqa: E402

PROBES = {
    "bulk_probe": (bulk_probe.SRC, {"ring"}),
    "ring_probe": (ring_probe.SRC, None),
    "l2_probe": (l2_probe.SRC, None),
    "fence_probe": (fence_probe.source(), {"probe"}),
}


@pytest.mark.parametrize("name", sorted(PROBES))
def test_probe_kernel_compiles_without_local_memory(name: str) -> None:
    src, entries = PROBES[name]
    cubin, log = compile_source(src, f"{name}.cu", [], [])
    assert cubin[:4] == b"\x7fELF"
    report = parse_ptxas(log)
    if entries:
        assert entries <= set(report), f"{name}: {sorted(report)}"
    assert report, log
    for fn, r in report.items():
        assert r.spill_stores == r.spill_loads == r.stack_frame == 0, f"{name}.{fn}: {r}"
