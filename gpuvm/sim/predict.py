"""Predicted step time of one Muse layer for a benchmark case.

Expert work depends on routing, known only on the GPU: an expert with no
tokens loads nothing and finishes at once, one with t tokens does t tokens'
math. The model takes the tokens of each local expert as a parameter, by
default the skew the benchmarks use (MUSE.md "Routing skew": the shard gets
about 2x the average load, uneven across its experts).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from ..isa import Op
from ..muse.config import MuseConfig
from ..opspec import Cost, ProgramError, expert_items
from ..program import Stream, work_lists
from .hardware import Hardware
from .model import simulate
from .work import ItemCost, op_work

if TYPE_CHECKING:  # the Muse modules import torch: loaded only when a layer is predicted
    from ..muse.cases import Case
    from ..muse.lowering import Tiles

EXPERT_OPS = frozenset({Op.EXPERT_UP, Op.EXPERT_DOWN})


def skewed_expert_tokens(cfg: MuseConfig, tokens: int, load: float = 2.0, zipf: float = 1.0) -> list[int]:
    """Tokens routed to each local expert of cfg for a step of `tokens` tokens.

    In all, `load` x the average share (tokens * top_k * local / n_experts)
    lands on the shard, spread over its experts in proportion to 1/(e+1)^zipf
    (largest remainders, at most `tokens` per expert: a token picks an expert
    once). Load 2 and zipf 1 give the top expert 126 of 256 tokens.
    """
    if tokens < 1 or load < 0 or zipf < 0:
        raise ProgramError(f"skewed_expert_tokens needs tokens >= 1, load >= 0, zipf >= 0 (got {tokens}, {load}, {zipf})")
    E = cfg.local_experts
    total = min(round(load * tokens * cfg.top_k * E / cfg.n_experts), tokens * min(cfg.top_k, E))
    out = [0] * E
    open_ = list(range(E))
    left = total
    while left and open_:
        weights = [1.0 / (e + 1) ** zipf for e in open_]
        scale = left / sum(weights)
        want = {e: w * scale for e, w in zip(open_, weights)}
        give = {e: min(int(want[e]), tokens - out[e]) for e in open_}
        extra = left - sum(give.values())
        for e in sorted(open_, key=lambda e: (give[e] - want[e], e)):  # largest remainders first
            if extra and give[e] < tokens - out[e]:
                give[e] += 1
                extra -= 1
        for e in open_:
            out[e] += give[e]
            left -= give[e]
        open_ = [e for e in open_ if out[e] < tokens]
    return out


def _chunk_tokens(t: int) -> int:
    """Tokens an expert item's tiles compute for t tokens (ops/experts.cuh):
    the register path (up to 8) multiplies n8 tiles of tokens; the shared tile
    decodes its weights once per chunk of 32 and multiplies the whole chunk."""
    return 0 if t == 0 else 8 if t <= 8 else 32 * -(-t // 32)


def _attn_rows(ins) -> int:
    """Query rows an attention chunk's MMAs compute (ops/attention.cuh): its
    conversation's tokens times the q heads of a kv head, in m-tiles of 16 a
    warp, or 64-row warpgroup rounds from three m-tiles."""
    q, k_cache, convs, part_o = ins.tensors[0], ins.tensors[1], ins.tensors[3], ins.tensors[4]
    rows = q.shape[0] // convs.shape[0] * (part_o.shape[1] // k_cache.shape[2])
    return 16 * -(-rows // 16) if rows <= 32 else 64 * -(-rows // 64)


def _list_items(ins, expert_tokens: Sequence[int], made: dict, longest_first: bool = True) -> list[ItemCost]:  # type: ignore[no-untyped-def]
    """The items of the work list of expert worker ins, in the list's order
    (longest_first: opspec.expert_items), each its Cost and expert: n rows of weights, t
    rows of activations plus one input row per token, the math of t's whole
    token tiles (_chunk_tokens)."""
    dst, x, meta = ins.tensors[0], ins.tensors[1], ins.tensors[5]
    assert dst is not None and x is not None and meta is not None
    if len(expert_tokens) != meta.shape[1]:
        raise ProgramError(f"'{ins.label}' covers {meta.shape[1]} experts; expert_tokens has {len(expert_tokens)} entries")
    k, n_out, mats = x.shape[1], dst.shape[1], 2 if ins.opcode == Op.EXPERT_UP else 1
    key = (ins.opcode, k, n_out, x.row_bytes, ins.args[1], ins.args[2], ins.args[3], ins.args[6], longest_first)  # the items depend on these and the tokens only
    if key not in made:
        items = expert_items(expert_tokens, n_out, ins.args[1], ins.args[2], ins.args[3], heavy=ins.args[6], longest_first=longest_first)
        made[key] = [ItemCost(mats * n * (k // 2 + k // 16), t * (n * 8 + x.row_bytes), _chunk_tokens(t) * 2 * mats * k * n, e)
                     for e, t, n in ((e, int(expert_tokens[e]), n) for e, _, n in items)]
    return made[key]


def layer_costs(stream: Stream, expert_tokens: Sequence[int], made: dict | None = None, longest_first: bool = True) -> list[Cost]:
    """Each op's Cost, an expert worker's the sum of the items it gets when the
    local experts have these tokens, dealt round-robin over the list's workers
    in stream order (the share a worker runs in a fixed round robin; claimed
    lists need list_item_costs' items too). An attention chunk's math is that
    of its query rows' tiles (_attn_rows): its static cost counts none. The
    code warmer's lead instances (gpuvm/muse/code_warm.py) keep their static
    costs: their lists route a small layer's tokens, not these. made: lists'
    items already built (_list_items), shared with list_item_costs;
    longest_first: the lists' order (opspec.expert_items)."""
    out: list[Cost] = []
    seen: dict[tuple[int, int], int] = {}  # workers of each list so far
    made = {} if made is None else made
    for ins in stream.ops:
        c = ins.cost
        if ins.opcode in EXPERT_OPS and not ins.lead:
            key = (ins.tensors[7].index, ins.args[0])  # type: ignore[union-attr]
            wk = seen.get(key, 0)
            seen[key] = wk + 1
            mine = _list_items(ins, expert_tokens, made, longest_first)[wk :: ins.args[1]]
            c = Cost(sum(i.weight_bytes for i in mine), sum(i.act_bytes for i in mine), sum(i.flops for i in mine))
        elif ins.opcode == Op.ATTN_CHUNK and not ins.lead:
            c = Cost(c.weight_bytes, c.act_bytes, _attn_rows(ins) * 4 * ins.args[3] * ins.tensors[1].shape[-1])
        out.append(c)
    return out


def list_item_costs(stream: Stream, expert_tokens: Sequence[int], made: dict | None = None,
                    longest_first: bool = True) -> dict[tuple[int, int], list[ItemCost]]:
    """The items of every expert work list but the code warmer's, by
    work_lists' key, each its own Cost (see _list_items), for simulate's
    item_costs: claimed one at a time by the list's workers, as on the device."""
    made = {} if made is None else made
    return {key: _list_items(stream.ops[members[0]], expert_tokens, made, longest_first)
            for key, members in work_lists(stream.ops).items() if not stream.ops[members[0]].lead}


def model_costs(stream: Stream, expert_tokens: Sequence[int], longest_first: bool = True) -> tuple[list[Cost], dict[tuple[int, int], list[ItemCost]]]:
    """layer_costs and list_item_costs of one routing, its lists' items built
    once, in the order longest_first gives (opspec.expert_items)."""
    made: dict = {}
    return layer_costs(stream, expert_tokens, made, longest_first), list_item_costs(stream, expert_tokens, made, longest_first)


def predict_layer(
    cfg: MuseConfig,
    case: "Case",
    hw: Hardware = Hardware(),
    *,
    expert_tokens: Sequence[int] | None = None,
    mode: str = "dynamic",
    tiles: "Tiles | None" = None,
    longest_first: bool = True,
) -> dict:
    """Model time of one layer step of case against its floor.

    expert_tokens: tokens of each local expert (default skewed_expert_tokens).
    longest_first: the expert lists' order (opspec.expert_items; False for
    traces of code before GVM_EXP_LPT).
    Static mode runs the lists the device's VM would (static_lists with
    Hardware()'s cost estimates and the stream's own costs), timed with hw.
    The floor is MUSE.md's: bytes / hbm_bytes_per_s, and for prefill also
    flops / flops_per_s, whichever is longer.
    """
    from ..muse.cases import floor_bytes, floor_flops
    from ..muse.lowering import lower_layer
    from ..muse.state import cache_slots

    T = case.tokens
    toks = list(expert_tokens) if expert_tokens is not None else skewed_expert_tokens(cfg, T)
    if len(toks) != cfg.local_experts or any(not 0 <= t <= T for t in toks):
        raise ProgramError(f"expert_tokens must give each of the {cfg.local_experts} local experts 0..{T} tokens, got {toks}")
    slots = cache_slots(cfg, case.kind, case.tokens_each, case.context)
    kw = {} if tiles is None else {"tiles": tiles}
    lp = lower_layer(cfg, case.kind, case.conversations, case.tokens_each, slots, **kw)
    costs, items = model_costs(lp.stream, toks, longest_first)
    lists = None
    if mode == "static":  # the lists the device's VM makes (gpuvm/device/vm.py): Hardware()'s costs, the stream's own
        from ..static import static_lists

        lists = static_lists(lp.stream, hw.n_blocks, hw.groups)
    r = simulate(lp.stream, hw, mode, lists, costs=costs, item_costs=items)
    hit = sum(1 for t in toks if t)
    fb = floor_bytes(cfg, case, hit)["total"]
    floor_ns = fb / hw.hbm_bytes_per_s * 1e9
    if case.prefill:
        floor_ns = max(floor_ns, floor_flops(cfg, case, sum(toks)) / hw.flops_per_s * 1e9)
    return {
        "case": case.name,
        "kind": case.kind,
        "tokens": T,
        "mode": mode,
        "instructions": len(lp.stream),
        "time_ns": r.makespan_ns,
        "floor_ns": floor_ns,
        "ratio": r.makespan_ns / floor_ns,
        "floor_bytes": fb,
        "model_hbm_bytes": sum(w.prefetch_bytes + w.hbm_bytes for w in op_work(lp.stream, hw, costs=costs)),
        "experts_hit": hit,
        "expert_tokens": toks,
    }
