"""The code warmer of a one-layer program (lowering.Tiles.code_warm).

The VM kernel is ~720 KB of code, and `gpuvm sweep` flushes the L2 before every
timed launch, so each op's first instance fetches its code from HBM (~80 ns a
KB against 1-4 from L2, session 29): at one token attention, the merge, the
residuals and the expert lists each start several µs late. A layer program
with the warmer also holds one instance of each op of a small layer (SMALL's
widths, one conversation, the real layer's kind and tokens per conversation
and op paths), under its own prefix, tensors and counters: "lead" ops, first
in the stream order and without waits (but the expert lists' and the
combine's on the small top-k, for a valid routing table), so that they run at
launch on groups the first phases leave idle and have every op's code in L2
before the real layer needs it. Their tensors are a few MB (zeros but the
weights, caches and conversation row); their results are thrown away.

H200, 1ca3f88 (tools/code_warm_probe.py): the same layer timed after a flush
alone against after a flush and a separate launch of the small layer, µs:
full-c1-t1 195.4 / 174.3, sliding-c1-t1 170.3 / 145.2, full-c1-t8 270.4 / 243.4,
sliding-c16-t1 467 / 429, full-c16-t8 1025 / 1021: what a warmer could win.
The whole small layer in the launch, with its waits, won nothing (20c6f61:
full-c1-t1 192.0, sliding-c1-t1 175.2 against 194.7, 170.6): its chain ran in
step with the real one, each of its ops as cold. The lead instances claimed lazily
(GVM_FLAG_LAZY, 69a7248, two rounds in swapped order): level on six layers up to 32
tokens (full-c1-t1 181.3, 181.5 against 180.9, 180.8 µs), not kept.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from ..isa import Op
from ..program import Counter, Instr, Program
from ..trace.timeline import op_name
from .config import SMALL, MuseConfig
from .state import DecodeState, cache_slots, make_inputs, make_state
from .weights import LayerWeights, make_layer_weights

PREFIX = "W."
CFG: MuseConfig = SMALL
CONTEXT = 64  # cached tokens of the small conversation: one attention chunk a kv head
SEED = 7


def warm_slots(kind: str, tokens_each: int) -> int:
    """Cache slots of the small layer beside a layer of this kind and tokens per conversation."""
    return cache_slots(CFG, kind, tokens_each, CONTEXT)


@dataclass(frozen=True)
class WarmInputs:
    weights: LayerWeights
    state: DecodeState
    s: torch.Tensor


@lru_cache(maxsize=8)
def warm_inputs(kind: str, tokens_each: int, device: str) -> WarmInputs:
    """Weights, state and input of the small layer, made once per shape and
    device (a few MB) and bound by every program of that shape there: the
    caches its attention instance writes are shared, and what it writes is
    thrown away."""
    state = make_state(CFG, kind, 1, tokens_each, CONTEXT, SEED, device=device)
    return WarmInputs(make_layer_weights(CFG, 1 if kind == "full" else 0, SEED, device=device), state, make_inputs(CFG, state, SEED))


_LISTS = (Op.EXPERT_UP, Op.EXPERT_DOWN, Op.EXPERT_COMBINE)  # read the routing table: wait for the small top-k


def _picks(small: Program) -> list[Instr]:
    """One instance of each op of the small layer (ops by label), in creation
    order: the first expert-list worker, as a list of one; every K part of the
    first tile of a GEMM cut over K (its last part adds the parts)."""
    seen: set[str] = set()
    out: list[Instr] = []
    tile: tuple[str, int] | None = None
    for ins in small.instrs:
        name = op_name(ins.label)
        parts = ins.opcode == Op.GEMM and ins.args[5] > 1
        if name in seen:
            if parts and tile == (name, ins.args[7]):
                out.append(ins)
            continue
        seen.add(name)
        out.append(ins)
        if parts:
            tile = (name, ins.args[7])
    return out


def emit_lead_instances(p: Program, small: Program) -> None:
    """Copy _picks(small), a small layer emitted under PREFIX into a program of
    its own, into p as lead ops: tensors under their names, one counter per op,
    no waits but the lists' on the top-k."""
    tensors = {t.name: t for t in p.tensors}
    counters: dict[str, Counter] = {}
    topk: Counter | None = None
    for ins in _picks(small):
        ts = []
        for t in ins.tensors:
            if t is not None and t.name not in tensors:
                tensors[t.name] = p.tensor(t.name, t.shape, t.dtype, t.role)
            ts.append(None if t is None else tensors[t.name])
        args = list(ins.args)
        if ins.opcode in (Op.EXPERT_UP, Op.EXPERT_DOWN):  # a list of one worker (fixed: worker 1 of 1)
            args[1], args[4] = 1, 1 if args[4] else 0
            if ins.opcode == Op.EXPERT_DOWN:  # it waits for no up rows (it waits for no up list)
                args[5] = 0
        name = op_name(ins.label)
        if name not in counters:  # the K parts of a GEMM tile share their op's counter
            counters[name] = p.counter(name)
        sig = counters[name]
        waits = []
        if ins.opcode in _LISTS:
            if topk is None:
                raise ValueError("the small layer's expert ops come before its top-k")
            waits = [topk]
        p.op(ins.opcode, ts, args, waits=waits, signal=sig, label=ins.label, lead=True)
        if ins.opcode == Op.TOPK:
            topk = sig
