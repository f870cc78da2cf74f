"""The kernel's parameter block, byte for byte (runtime/params.cuh), and the
launch constants the device reports about itself."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..isa import ERROR_BYTES, INSTR_BYTES, TENSOR_BYTES, TRACE_BYTES

PARAMS_DTYPE = np.dtype(
    [
        ("instrs", "<u8"),
        ("table", "<u8"),
        ("counters", "<u8"),
        ("state", "<u8"),
        ("error", "<u8"),
        ("trace", "<u8"),
        ("static_lists", "<u8"),
        ("warm_instrs", "<u8"),
        ("warm_table", "<u8"),
        ("watchdog_ns", "<u8"),
        ("n_instrs", "<u4"),
        ("step", "<u4"),
        ("mode", "<u4"),
        ("groups", "<u4"),
        ("n_warm", "<u4"),
        ("claim_depth", "<u4"),
    ]
)

MODES = {"dynamic": 0, "static": 1}

#: claims a block's controller may hold ahead in the default build (runtime/params.cuh
#: GVM_CLAIM_SLOTS); a build's own number is its layout's claim_slots
CLAIM_SLOTS = 3

_OFFSET_FIELDS = list(PARAMS_DTYPE.names)


class LayoutError(RuntimeError):
    """The host's idea of the parameter block disagrees with the compiled kernel's."""


@dataclass(frozen=True)
class DeviceLayout:
    """Launch constants read from the kernel's gvm_layout array."""

    max_groups: int
    group_smem: int
    control_threads: int
    group_threads: int
    state_words: int
    claim_slots: int = CLAIM_SLOTS

    def block_threads(self, groups: int) -> int:
        return self.control_threads + groups * self.group_threads

    def dynamic_smem(self, groups: int) -> int:
        return groups * self.group_smem


def check_layout(words: np.ndarray) -> DeviceLayout:
    """Compare gvm_layout (u32 words from the cubin) with PARAMS_DTYPE and the
    record sizes of gpuvm.isa; raise LayoutError on any difference."""
    w = [int(x) for x in words]
    n_off = len(_OFFSET_FIELDS)
    if len(w) != 1 + n_off + 10:
        raise LayoutError(f"gvm_layout has {len(w)} words, expected {1 + n_off + 10}")
    if w[0] != PARAMS_DTYPE.itemsize:
        raise LayoutError(f"gvm_params is {w[0]} bytes on the device, {PARAMS_DTYPE.itemsize} on the host")
    for name, off in zip(_OFFSET_FIELDS, w[1 : 1 + n_off]):
        if PARAMS_DTYPE.fields[name][1] != off:
            raise LayoutError(f"gvm_params.{name} at byte {off} on the device, {PARAMS_DTYPE.fields[name][1]} on the host")
    max_groups, group_smem, control, group, state_words, ib, tb, trb, eb, slots = w[1 + n_off :]
    if not 1 <= slots <= 32:
        raise LayoutError(f"the controller holds {slots} claims on the device; the host takes 1 to 32")
    for what, dev, host in (("gvm_instr", ib, INSTR_BYTES), ("gvm_tensor", tb, TENSOR_BYTES), ("gvm_trace", trb, TRACE_BYTES), ("gvm_error", eb, ERROR_BYTES)):
        if dev != host:
            raise LayoutError(f"{what} is {dev} bytes on the device, {host} on the host")
    return DeviceLayout(max_groups, group_smem, control, group, state_words, slots)
