"""Host checks before a launch: a record the device would misread must be
rejected here, with the instruction named, never reach the GPU."""
from __future__ import annotations

from typing import Collection, Sequence

import numpy as np

from ..isa import DTYPE_BYTES, INSTR_DTYPE, MAX_DIMS, MAX_INSTRS, MAX_TENSORS, MAX_WAITS, NONE, TENSOR_DTYPE, Op
from ..opspec import ProgramError

__all__ = ["check_records"]


def _tensor_bytes(tab: np.ndarray) -> np.ndarray:
    """Bytes each descriptor spans (contiguous: product of its shape)."""
    ebytes = np.zeros(256, dtype=np.int64)
    for dt, nb in DTYPE_BYTES.items():
        ebytes[int(dt)] = nb
    dims = np.arange(MAX_DIMS)[None, :] < tab["ndim"].astype(np.int64)[:, None]
    return np.where(dims, tab["shape"].astype(np.int64), 1).prod(axis=1) * ebytes[tab["dtype"]]


def check_records(records: np.ndarray, table: np.ndarray, n_counters: int, compiled: Collection[Op], labels: Sequence[str] | None = None,
                  max_groups: int = 2) -> None:
    """Raise ProgramError at the first record with an opcode the kernel lacks,
    a tensor slot outside the table, a counter outside the counter array, a
    prefetch range outside its tensor, or a GEMM token range that a kernel of
    max_groups groups does not take (ops/gemm.cuh: only up to 2 groups)."""
    if records.dtype != INSTR_DTYPE or table.dtype != TENSOR_DTYPE:
        raise ProgramError("records and table must have the gvm_instr / gvm_tensor layouts of gpuvm.isa")
    n = len(records)
    if not 1 <= n <= MAX_INSTRS:
        raise ProgramError(f"a stream needs 1 to {MAX_INSTRS} instructions, not {n}")

    def name(i: int) -> str:
        return f"instruction {i}" + (f" '{labels[i]}'" if labels is not None and i < len(labels) else "")

    def first(bad: np.ndarray) -> int | None:
        idx = np.flatnonzero(bad)
        return int(idx[0]) if idx.size else None

    ops = records["opcode"].astype(np.int64)
    allowed = np.zeros(64, dtype=bool)
    for known in compiled:
        allowed[int(known)] = True
    if (i := first((ops >= 64) | ~allowed[np.minimum(ops, 63)])) is not None:
        code = int(ops[i])
        what = Op(code).name if code in Op._value2member_map_ else f"unknown opcode {code}"
        raise ProgramError(f"{name(i)}: {what} is not compiled into this kernel")
    if max_groups > 2 and (i := first((ops == int(Op.GEMM)) & (records["arg"][:, 3] != 0))) is not None:
        raise ProgramError(f"{name(i)}: a GEMM token range needs a kernel of at most 2 groups (this one is built for {max_groups}; "
                           "it has no register to spare for one)")
    if max_groups > 2 and (i := first((ops == int(Op.GEMM)) & (records["arg"][:, 5] > 1))) is not None:
        raise ProgramError(f"{name(i)}: GEMM K parts need a kernel of at most 2 groups (this one is built for {max_groups})")
    nw = records["n_waits"].astype(np.int64)
    if (i := first(nw > MAX_WAITS)) is not None:
        raise ProgramError(f"{name(i)}: {int(nw[i])} waits, at most {MAX_WAITS}")
    live = np.arange(MAX_WAITS)[None, :] < nw[:, None]
    if (i := first((live & (records["wait_counter"].astype(np.int64) >= n_counters)).any(axis=1))) is not None:
        raise ProgramError(f"{name(i)}: waits on counter {records['wait_counter'][i][:nw[i]].tolist()}, but there are {n_counters} counters")
    sig = records["signal"].astype(np.int64)
    if (i := first((sig != NONE) & (sig >= n_counters))) is not None:
        raise ProgramError(f"{name(i)}: signals counter {int(sig[i])}, but there are {n_counters} counters")
    ten = records["tensor"].astype(np.int64)
    if (i := first(((ten != NONE) & (ten >= len(table))).any(axis=1))) is not None:
        raise ProgramError(f"{name(i)}: tensor slots {ten[i].tolist()} reach past the table of {len(table)}")
    slot = records["pf_slot"].astype(np.int64)
    has_pf = (slot != NONE) & (records["pf_bytes"] > 0)
    if (i := first(has_pf & (slot >= MAX_TENSORS))) is not None:
        raise ProgramError(f"{name(i)}: prefetch slot {int(slot[i])} is not 0..{MAX_TENSORS - 1}")
    rows = np.flatnonzero(has_pf)
    if rows.size:
        tix = ten[rows, slot[rows]]
        if (k := first(tix == NONE)) is not None:
            raise ProgramError(f"{name(int(rows[k]))}: prefetch slot {int(slot[rows[k]])} holds no tensor")
        end = records["pf_offset"][rows].astype(np.int64) + records["pf_bytes"][rows].astype(np.int64)
        if (k := first(end > _tensor_bytes(table)[tix])) is not None:
            raise ProgramError(f"{name(int(rows[k]))}: prefetch range ends at byte {int(end[k])}, past its tensor")
