"""The lowered layer on the CPU backend against the formula-level reference.

Every decode case shape of MUSE.md at SMALL dims (contexts below, at and far
above the sliding window, gpuvm.muse.cases.small_case), full and sliding, for
several consecutive steps on one state: fresh random inputs each step, the KV
the step writes kept for the next, counters carried across steps, steps run
in stream order and then in random valid orders. Then mutated ops (a wrong
RoPE pairing, no causal mask, a wrong cache slot) must fail the same check.
"""
from __future__ import annotations

import dataclasses

import random

import numpy as np
import pytest
import torch

from gpuvm.cpu import ops as cpu_ops
from gpuvm.cpu import run_stream
from gpuvm.isa import Op
from gpuvm.muse.cases import DECODE_CASES, Case, small_case
from gpuvm.muse.config import SMALL
from gpuvm.muse.lowering import LayerProgram, Tiles, bind_layer, lower_layer
from gpuvm.muse.reference import RefOut, reference_layer
from gpuvm.muse.state import make_inputs, make_state
from gpuvm.muse.weights import LayerWeights, make_layer_weights

CFG = SMALL
WEIGHT_SEED = 11
STEPS = 3
TOL = 1e-2
TIE = 1e-4  # a top-8 margin below this may route either way (scores differ by ~1e-6)


@pytest.fixture(scope="module")
def weights() -> dict[str, LayerWeights]:
    # layer 1 is full attention, layer 0 sliding (MUSE.md)
    return {"full": make_layer_weights(CFG, 1, WEIGHT_SEED), "sliding": make_layer_weights(CFG, 0, WEIGHT_SEED)}


def _tiles(kind: str, tokens_each: int, slots: int) -> Tiles:
    """Small tiles, so every GEMM, expert and row range spans several ops.
    Attention: about five chunks of an odd length in full layers, the last one
    partial; in sliding layers with several new tokens, 16 keys, so the window's
    chunks alone fall one chunk short of the keys a step sees. The router's
    tiles split over two token ranges (a GEMM token range, f32 path)."""
    if kind == "full":
        chunk = max(7, -(-slots // 5)) | 1
    else:
        chunk = 16 if tokens_each > 1 else 13
    return Tiles(gemm_fill=0, gemm_bytes=16 * 1024, rows=8, chunk=chunk, router_splits=2, sliding_chunk=chunk)


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def check_step(lp: LayerProgram, bufs: dict[str, torch.Tensor], ref: RefOut, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """Raise AssertionError unless the program's step matches the reference."""
    px = lp.prefix
    clear = ref.margin > TIE
    assert int(clear.sum()) >= 0.75 * len(clear), "too many near-ties to judge routing"
    chosen = bufs[px + "route"][2].view(-1, CFG.top_k).long()
    same = (chosen.sort(1).values == ref.topk_idx.sort(1).values).all(1)
    assert bool(same[clear].all()), f"routing differs on tokens {torch.nonzero(~same & clear).flatten().tolist()}"
    if bool(clear.all()):
        assert bufs[px + "route_meta"][0].tolist() == ref.local_counts.tolist()
    rows = torch.nonzero(clear).flatten()
    s = bufs["s"]
    assert not bool(torch.isnan(s).any()), "NaN in the output: an element was never written"
    errs = {
        "s": _rel(s[rows], ref.s_out[rows]),
        **({"q": _rel(bufs[px + "q"], ref.q)} if px + "q" in bufs else {}),  # fused QK-norm/RoPE: no q tensor
        "o": _rel(bufs[px + "o"], ref.o),
        "h2": _rel(bufs[px + "h2"], ref.h2),
        "fsq": _rel(bufs[px + "fsq"][rows], ref.fsq[rows]),
    }
    bad = {k: v for k, v in errs.items() if not v <= TOL}
    assert not bad, f"relative errors above {TOL}: {bad}"
    for name, cpu, want in (("k", k_cache, ref.k_cache), ("v", v_cache, ref.v_cache)):
        # new entries may round to a neighbouring e4m3 value; anything else is a bug
        differ = cpu.view(torch.uint8) != want.view(torch.uint8)
        n_new = lp.tokens * CFG.heads_kv * CFG.head_dim
        assert int(differ.sum()) <= max(2, n_new // 500), f"{name} cache: {int(differ.sum())} bytes differ"
        a, b = cpu[differ].float(), want[differ].float()
        assert bool((a - b).abs().le(0.13 * torch.maximum(a.abs(), b.abs()) + 2.0**-9).all()), f"{name} cache: values off by more than one e4m3 step"


def run_case(case: Case, weights: dict[str, LayerWeights], steps: int = STEPS, orders: tuple[str, ...] = ("stream", "random", "random"),
             fuse_qk: bool = False, router_parts: bool = False, attn_tail: bool = False, wqkvg_parts: bool = False) -> None:
    w = weights[case.kind]
    state = make_state(CFG, case.kind, case.conversations, case.tokens_each, case.context, seed=3, steps=steps)
    tiles = dataclasses.replace(_tiles(case.kind, case.tokens_each, state.slots), fuse_qk=1 << 20 if fuse_qk else 0,
                                router_span=1 if router_parts else 0)
    if wqkvg_parts:  # the groups' fill on: Wqkvg's staged 64 x 64 tiles, cut over K (Tiles.gemm_parts)
        tiles = dataclasses.replace(tiles, gemm_fill=264, gemm_parts=4)
    if attn_tail:  # "two waves" of 8 groups; the last conversations' chunks (about a third of them) halved
        tiles = dataclasses.replace(tiles, expert_workers=8, attn_tail=case.conversations * CFG.heads_kv)
    lp = lower_layer(CFG, case.kind, case.conversations, case.tokens_each, state.slots, tiles=tiles)
    lens = {o.args[3] for o in lp.stream.ops if o.opcode == Op.ATTN_CHUNK}
    assert len(lens) == 1 + attn_tail, f"chunk lengths {sorted(lens)}"
    if attn_tail:
        assert any(o.args[4] != o.tensors[1].shape[2] for o in lp.stream.ops if o.opcode == Op.ATTN_MERGE)
    assert any(o.opcode == Op.QK_ROPE_KV for o in lp.stream.ops) != fuse_qk
    assert any(o.opcode == Op.GEMM and o.args[5] > 1 and o.label.startswith(lp.prefix + "Wr[") for o in lp.stream.ops) == router_parts
    assert any(o.opcode == Op.GEMM and o.args[5] > 1 and o.label.startswith(lp.prefix + "Wqkvg[") for o in lp.stream.ops) == wqkvg_parts
    counters = None
    tickets = [t.name for t in lp.stream.tensors if t.role == "ticket"]
    carried: dict[str, torch.Tensor] = {}
    for step in range(steps):
        s = make_inputs(CFG, state, seed=100 + step, weights_seed=WEIGHT_SEED)
        ref = reference_layer(CFG, w, state, s, case.kind)  # leaves state untouched
        bufs = bind_layer(lp, w, state, s)  # the run writes its KV into state
        bufs.update(carried)  # tickets count on from the step before, as the counters do
        counters = run_stream(lp.stream, bufs, step=step, order=orders[step % len(orders)], rng=random.Random(step), counters=counters)
        np.testing.assert_array_equal(counters, (step + 1) * lp.stream.per_step)
        carried = {name: bufs[name] for name in tickets}
        for o in lp.stream.ops:  # each K part of a tile counted its ticket once a step
            if o.opcode == Op.GEMM and o.args[5] > 1:
                assert int(bufs[o.tensors[4].name][o.args[7]]) == (step + 1) * o.args[5]
        check_step(lp, bufs, ref, state.k_cache, state.v_cache)
        if step + 1 < steps:
            state.advance()


@pytest.mark.parametrize("case", [small_case(c, CFG) for c in DECODE_CASES], ids=lambda c: f"{c.name}-ctx{c.context}")
def test_layer_matches_reference(case: Case, weights: dict[str, LayerWeights]) -> None:
    run_case(case, weights)


@pytest.mark.parametrize("case", [small_case(c, CFG) for c in DECODE_CASES if c.name.endswith(("c1-t1", "c16-t8"))], ids=lambda c: f"{c.name}-ctx{c.context}")
def test_fused_qk_layer_matches_reference(case: Case, weights: dict[str, LayerWeights]) -> None:
    """Tiles.fuse_qk: the chunks norm and rotate q themselves and write the new keys."""
    run_case(case, weights, fuse_qk=True)


@pytest.mark.parametrize("case", [small_case(c, CFG) for c in DECODE_CASES if c.name.endswith(("c1-t1", "c32-t8"))], ids=lambda c: f"{c.name}-ctx{c.context}")
def test_router_in_k_parts_matches_reference(case: Case, weights: dict[str, LayerWeights]) -> None:
    """Tiles.router_span: the router's tiles cut over K, each tile's last part
    (whichever it is in a random order) adding the parts up, tickets counted
    on across steps."""
    run_case(case, weights, router_parts=True)


@pytest.mark.parametrize("case", [small_case(c, CFG) for c in DECODE_CASES if c.name.endswith(("c16-t8", "c32-t8"))], ids=lambda c: f"{c.name}-ctx{c.context}")
def test_wqkvg_in_k_parts_matches_reference(case: Case, weights: dict[str, LayerWeights]) -> None:
    """Tiles.gemm_parts: Wqkvg's staged bf16 tiles cut over K, each tile's last
    part (in a random order) adding the parts and rounding to bf16 once."""
    run_case(case, weights, wqkvg_parts=True)


@pytest.mark.parametrize("case", [small_case(c, CFG) for c in DECODE_CASES if c.name.endswith(("c16-t8", "c32-t1"))], ids=lambda c: f"{c.name}-ctx{c.context}")
def test_attention_tail_in_half_chunks_matches_reference(case: Case, weights: dict[str, LayerWeights]) -> None:
    """Tiles.attn_tail: the last conversations' chunks at half length, their
    merges over their own (larger) chunk count, the others' slots past theirs
    never read (left poisoned)."""
    run_case(case, weights, attn_tail=True)


def _case(kind: str, conversations: int, tokens_each: int, context: int) -> Case:
    return Case(f"{kind}-c{conversations}-t{tokens_each}", kind, conversations, tokens_each, context)


_REAL_ROPE = cpu_ops.rope
_HALVES = torch.arange(64).view(2, 32).T.flatten()  # 0, 32, 1, 33, ...


def _wrong_pairs_rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """RoPE over pairs (i, i + 32) instead of (2i, 2i + 1)."""
    out = torch.empty_like(x)
    out[..., _HALVES] = _REAL_ROPE(x[..., _HALVES], pos)
    return out


def _no_causal(qpos: torch.Tensor, kpos: torch.Tensor, window: int) -> torch.Tensor:
    return torch.ones(len(qpos), len(kpos), dtype=torch.bool)


def _slot_off_by_one(ts: list[torch.Tensor | None], a: tuple[int, ...]) -> None:
    convs = ts[6]
    assert convs is not None
    saved = convs.clone()
    convs[a[0], 2] += 1  # writes position p + 1's slot, and ropes at p + 1
    try:
        cpu_ops.qk_rope_kv(ts, a)
    finally:
        convs.copy_(saved)


@pytest.mark.parametrize(
    "mutation, case",
    [
        ("rope pairs", _case("sliding", 2, 8, 40)),
        ("no causal mask", _case("full", 2, 8, 40)),
        ("cache slot", _case("full", 2, 1, 40)),
    ],
)
def test_broken_op_fails_the_check(mutation: str, case: Case, weights: dict[str, LayerWeights], monkeypatch: pytest.MonkeyPatch) -> None:
    run_case(case, weights, steps=1)  # the unbroken op passes
    if mutation == "rope pairs":
        monkeypatch.setattr(cpu_ops, "rope", _wrong_pairs_rope)
    elif mutation == "no causal mask":
        monkeypatch.setattr(cpu_ops, "visible_keys", _no_causal)
    else:
        monkeypatch.setitem(cpu_ops.OPS, Op.QK_ROPE_KV, _slot_off_by_one)
    with pytest.raises(AssertionError):
        run_case(case, weights, steps=1)
