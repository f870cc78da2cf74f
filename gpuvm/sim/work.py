"""What each instruction asks of the machine: bytes to load and time to compute.

The model and the static list builder both read op costs through op_work, so
that the lists are balanced with the same numbers the simulation uses.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, NamedTuple, Sequence

from ..isa import Op
from ..opspec import Cost, ProgramError
from ..program import Stream, work_lists
from .hardware import Hardware

#: opcodes whose activation bytes come from HBM rather than L2: attention reads
#: the KV cache, far larger than the L2 at 80K context
HBM_ACT_OPS = frozenset({Op.ATTN_CHUNK})


class ItemCost(NamedTuple):
    """An expert work list item's Cost (the same fields) and the local expert
    it is of, which the model needs for a down item's wait for its expert's up
    rows (isa/gvm_isa.h EXPERT_DOWN a5); -1: unknown (it then waits for the
    whole up list)."""

    weight_bytes: int = 0
    act_bytes: int = 0
    flops: int = 0
    expert: int = -1


@dataclass(frozen=True)
class OpWork:
    """One instruction's demands on the machine."""

    prefetch_bytes: int  # HBM weight bytes the loader issues at claim time if the op will wait (else the op loads them)
    hbm_bytes: int  # HBM bytes read once the waits are met (weights past the prefetch, KV cache)
    l2_bytes: int  # activation bytes read once the waits are met
    flops: float  # matrix work, shared with the other busy groups of the SM
    fixed_ns: float  # launch cost (+ SLEEP time), or the caller's duration

    def alone_ns(self, hw: Hardware, load_share: float) -> float:
        """Duration of the op with a load bandwidth of load_share bytes/s and its
        SM to itself: loads and math overlap, the fixed cost does not."""
        mem = (self.prefetch_bytes + self.hbm_bytes) / load_share * 1e9 + self.l2_bytes / min(hw.load_bytes_per_s, hw.l2_bytes_per_s) * 1e9
        if self.prefetch_bytes + self.hbm_bytes + self.l2_bytes:
            mem += hw.mem_latency_ns
        return self.fixed_ns + max(mem, self.flops / hw.flops_per_sm * 1e9)


def op_work(stream: Stream, hw: Hardware, durations: Sequence[float] | None = None, costs: Sequence[Cost] | None = None) -> list[OpWork]:
    """Per stream position: its OpWork. costs[i] replaces op i's Cost (e.g. an
    expert with no tokens loads nothing); durations[i] replaces its compute time
    (launch + math) in ns, its loads are still modelled."""
    ops = stream.ops
    n = len(ops)
    if durations is not None and len(durations) != n:
        raise ProgramError(f"durations has {len(durations)} entries for {n} instructions")
    if costs is not None and len(costs) != n:
        raise ProgramError(f"costs has {len(costs)} entries for {n} instructions")
    out: list[OpWork] = []
    for i, ins in enumerate(ops):
        c = ins.cost if costs is None else costs[i]
        if min(c.weight_bytes, c.act_bytes, c.flops) < 0:
            raise ProgramError(f"instruction {i} '{ins.label}': negative cost {c}")
        pf = 0 if ins.prefetch is None else min(ins.prefetch[2], c.weight_bytes, hw.prefetch_max_bytes)
        hbm_act = c.act_bytes if ins.opcode in HBM_ACT_OPS else 0
        if durations is None:
            timing = hw.timing(ins.opcode)
            fixed = timing.fixed_ns + (ins.args[0] if ins.opcode == Op.SLEEP else 0) + (hw.cold_code_ns if ins.lead else 0.0)
            flops = float(c.flops) / timing.math_fraction  # the tensor-rate flops that take as long
        else:
            fixed = float(durations[i])
            if not fixed >= 0:
                raise ProgramError(f"duration of instruction {i} must be >= 0, not {durations[i]!r}")
            flops = 0.0
        out.append(OpWork(pf, c.weight_bytes - pf + hbm_act, c.act_bytes - hbm_act, flops, fixed))
    return out


def list_item_work(stream: Stream, hw: Hardware, item_costs: Mapping[tuple[int, int], Sequence[Cost | ItemCost]]) -> dict[tuple[int, int], list[OpWork]]:
    """Each expert work list's items as OpWork (by work_lists' key): its
    weights and activations loaded once the item starts, its math at the
    opcode's rate, the opcode's fixed cost for every item."""
    lists = work_lists(stream.ops)
    out: dict[tuple[int, int], list[OpWork]] = {}
    for key, items in item_costs.items():
        if key not in lists:
            raise ProgramError(f"item costs for work list {key}, which the stream does not have")
        timing = hw.timing(stream.ops[lists[key][0]].opcode)
        out[key] = [OpWork(0, c.weight_bytes, c.act_bytes, float(c.flops) / timing.math_fraction, timing.fixed_ns) for c in items]
    return out
