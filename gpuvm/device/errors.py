"""What can go wrong on the device side, as exceptions that say what and where."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..isa import NONE, ErrorCode, Op


class CompileError(RuntimeError):
    """NVRTC rejected the device sources; the message carries its log."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message + (f"\n--- NVRTC log ---\n{log}" if log else ""))
        self.log = log


class SpillError(CompileError):
    """The kernel compiled but uses local memory (spills or a stack frame)."""


class LaunchError(RuntimeError):
    """The kernel cannot be launched as the VM needs (resources, co-residency, driver)."""


class DeviceError(RuntimeError):
    """A launch stopped on the device and left an error record."""

    def __init__(self, message: str, record: dict[str, int]) -> None:
        super().__init__(message)
        self.record = record


class WatchdogError(DeviceError):
    """A dependency wait passed the watchdog bound."""


class OpError(DeviceError):
    """An op found its instruction unusable (bad opcode, tensors or arguments)."""


def _where(idx: int, labels: Sequence[str], opcodes: Sequence[int]) -> str:
    if idx >= len(labels):
        return f"instruction {idx} (outside the stream of {len(labels)})"
    try:
        name = Op(int(opcodes[idx])).name
    except ValueError:
        name = f"opcode {int(opcodes[idx])}"
    return f"instruction {idx} '{labels[idx]}' ({name})"


def error_from_record(rec: np.void, labels: Sequence[str], opcodes: Sequence[int], counter_names: Sequence[str]) -> DeviceError | None:
    """The exception for a gvm_error record (None when it records no error)."""
    r = {name: int(rec[name]) for name in rec.dtype.names}
    code = r["code"]
    if code == ErrorCode.NONE:
        return None
    where = f"(step {r['step']}, SM {r['sm']}, block {r['block']})"
    if code == ErrorCode.WATCHDOG and r["counter"] == NONE:  # an op's own wait (isa/gvm_isa.h EXPERT_DOWN a5)
        return WatchdogError(
            f"watchdog: {_where(r['instr'], labels, opcodes)} waited past its bound inside the op, for rows that never came "
            f"(an expert down list's wait for its expert's up rows: a failed or corrupt up list) {where}; the kernel stopped",
            r,
        )
    if code == ErrorCode.WATCHDOG:
        c = r["counter"]
        cname = f"'{counter_names[c]}'" if c < len(counter_names) else "(unknown)"
        return WatchdogError(
            f"watchdog: {_where(r['instr'], labels, opcodes)} waited {r['waited_ns'] / 1e9:.3f} s on counter {c} {cname}: "
            f"value seen {r['seen']}, target {r['target']} {where}; the kernel stopped",
            r,
        )
    try:
        what = ErrorCode(code).name
    except ValueError:
        what = f"error code {code}"
    detail = {ErrorCode.BAD_OPCODE: "its opcode is not compiled into this kernel", ErrorCode.BAD_ARGS: "its tensors or arguments are unusable on the device"}
    msg = f"{_where(r['instr'], labels, opcodes)} failed with {what}"
    if code in detail:
        msg += f": {detail[ErrorCode(code)]}"
    return OpError(f"{msg} {where}; the kernel stopped", r)
