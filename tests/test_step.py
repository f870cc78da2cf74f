"""The whole decode step as one instruction stream (gpuvm.muse.step), at SMALL dims.

The step program builds and chains its layers; the CPU backend decodes several
consecutive steps, each step's argmax fed back as the next step's input through
the one `tokens` buffer, and agrees with the formula-level reference_step:
same tokens where the top-2 margin is not a tie, the residual stream after every
layer within MEASURE.md's 1e-2. EMBED and ARGMAX semantics and bad input; the
memory estimator and its error. Broken ops must fail the same check.
"""
from __future__ import annotations

import dataclasses

import random

import numpy as np
import pytest
import torch

from gpuvm.cpu import CpuOpError, run_stream
from gpuvm.cpu import ops as cpu_ops
from gpuvm.isa import DType, Op
from gpuvm.muse.config import SHARD, SMALL
from gpuvm.muse.lowering import Tiles
from gpuvm.muse.memory import OutOfDeviceMemory, check_step_fits, step_memory, step_memory_bytes
from gpuvm.muse.reference import StepRef, reference_step
from gpuvm.muse.state import cache_slots
from gpuvm.muse.step import StepProgram, StepState, bind_step, layer_outputs, lower_step, make_step_state
from gpuvm.muse.weights import ModelWeights, layer_nbytes, make_model_weights, model_nbytes
from gpuvm.program import Program, ProgramError

CFG = SMALL
SEED = 5
TOL = 1e-2
ROUTE_TIE = 1e-4  # a top-8 router margin below this may route either way
#: small tiles, so GEMMs, experts, rows and attention chunks all span several ops
TILES = Tiles(gemm_fill=0, gemm_bytes=16 * 1024, rows=3, chunk=29, sliding_chunk=29)


@pytest.fixture(scope="module")
def weights() -> ModelWeights:
    return make_model_weights(CFG, SEED)


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm())


# ---- the program ---------------------------------------------------------------------
def test_step_program_chains_the_layers() -> None:
    sp = lower_step(CFG, 2, 3, 40, tiles=TILES)
    ops = sp.stream.ops
    assert sp.kinds == ["sliding", "full", "sliding", "sliding"]
    assert sp.slots == {"full": cache_slots(CFG, "full", 3, 40), "sliding": cache_slots(CFG, "sliding", 3, 40)}
    by = {op: [o for o in ops if o.opcode == op] for op in (Op.EMBED, Op.ARGMAX, Op.RMSNORM, Op.GEMM, Op.RESIDUAL)}
    assert [o.args[:2] for o in by[Op.EMBED]] == [(0, 3), (3, 3)]
    assert sorted(o.args[:2] for o in by[Op.ARGMAX]) == [(r, 1) for r in range(6)]
    # one RMSNORM in all (layer 0's): every later norm, the final one too, is fused into a RESIDUAL
    assert {o.label.split(".")[0] for o in by[Op.RMSNORM]} == {"L0"}
    last = [o for o in by[Op.RESIDUAL] if o.label.startswith("L3.residual2")]
    assert last and all(o.tensors[4].name == "w_final" and o.tensors[6].name == "L3.next_h" for o in last)
    head = [o for o in by[Op.GEMM] if o.label.startswith("lm_head")]
    assert all(o.tensors[1].name == "L3.next_h" for o in head)
    assert sorted(x for o in head for x in range(o.args[0], o.args[0] + o.args[1])) == list(range(CFG.vocab_shard))
    # tokens: the one buffer EMBED reads and ARGMAX writes
    assert {o.tensors[2].name for o in by[Op.EMBED]} == {o.tensors[1].name for o in by[Op.ARGMAX]} == {"tokens"}
    # each layer starts after the previous one is done: its first ops wait on L{i-1}.done
    for i in range(1, 4):
        first = [o for o in ops if o.label.startswith(f"L{i}.Wqkvg")]
        assert first and all(o.waits[0][0].name == f"L{i - 1}.done" for o in first)
    # ARGMAX comes after every EMBED: stream positions and dependencies
    pos = {o.id: k for k, o in enumerate(ops)}
    assert max(pos[o.id] for o in by[Op.EMBED]) < min(pos[o.id] for o in by[Op.ARGMAX])


def test_capture_copies_s_after_every_layer() -> None:
    sp = lower_step(CFG, 1, 2, 10, capture_layers=True, layers=2)
    copies = [o for o in sp.stream.ops if o.opcode == Op.COPY]
    # a copy per row block (Tiles.rows = 1: one token row of d each), together the whole s
    assert sorted((o.tensors[0].name, o.args[:2]) for o in copies) == [(f"L{i}.s_out", (r * CFG.d, CFG.d)) for i in range(2) for r in range(2)]
    l1 = [o for o in sp.stream.ops if o.label.startswith("L1.Wqkvg")]
    assert all(o.waits[0][0].name == "L0.captured" for o in l1), "the next layer must not change s before the copy"


@pytest.mark.parametrize("bad", [dict(conversations=0), dict(tokens_each=-1), dict(context_capacity=-3), dict(layers=5), dict(layers=0)])
def test_bad_step_shapes_are_refused(bad: dict[str, int]) -> None:
    args = dict(conversations=1, tokens_each=1, context_capacity=0) | bad
    layers = args.pop("layers", None)
    with pytest.raises(ProgramError):
        lower_step(CFG, args["conversations"], args["tokens_each"], args["context_capacity"], layers=layers)


def test_bind_refuses_a_mismatched_model(weights: ModelWeights) -> None:
    st = make_step_state(CFG, 1, 1, 0, seed=1, layers=2)
    sp = lower_step(CFG, 1, 1, st.context_capacity, layers=2)
    with pytest.raises(ProgramError, match="2 layers, the weights 4"):
        bind_step(sp, weights, st, torch.zeros(1, dtype=torch.int32))


# ---- decoding against the reference ------------------------------------------------------
def decode(sp: StepProgram, weights: ModelWeights, state: StepState, tokens: torch.Tensor, steps: int, *,
           share_scratch: bool = False, orders: tuple[str, ...] = ("stream",)) -> None:
    """Run `steps` steps on the CPU backend and check each against reference_step
    (AssertionError on a mismatch). tokens is bound as is: the backend feeds each
    step's argmax to the next; the reference is given the ids the backend read."""
    ref_state = state.clone()
    bufs = bind_step(sp, weights, state, tokens, share_scratch=share_scratch)
    assert bufs["tokens"] is tokens
    counters = None
    for step in range(steps):
        ref = reference_step(CFG, weights, ref_state, tokens.clone())
        before = [(st.k_cache.clone(), st.v_cache.clone()) for st in state.layers]
        counters = run_stream(sp.stream, bufs, step=step, order=orders[step % len(orders)], rng=random.Random(step), counters=counters)
        np.testing.assert_array_equal(counters, (step + 1) * sp.stream.per_step)
        check_step(sp, bufs, ref, state, before)
        ref_state.write_caches([o.k_cache for o in ref.layers], [o.v_cache for o in ref.layers])
        if step + 1 < steps:
            state.advance()
            ref_state.advance()


def check_step(sp: StepProgram, bufs: dict[str, torch.Tensor], ref: StepRef, state: StepState, before: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    # a token that routes near a tie in any layer may take another path from there on
    clear = torch.ones(sp.tokens, dtype=torch.bool)
    s_layers = layer_outputs(sp, bufs)
    for i, lr in enumerate(ref.layers):
        clear &= lr.margin > ROUTE_TIE
        assert int(clear.sum()) >= 0.5 * sp.tokens, "too many routing near-ties to judge"
        assert not bool(torch.isnan(s_layers[i]).any()), f"layer {i}: NaN in s, an element never written"
        err = _rel(s_layers[i][clear], ref.s_layers[i][clear])
        assert err <= TOL, f"layer {i}: residual stream off by {err:.2e}"
    logits = bufs["logits"]
    assert not bool(torch.isnan(logits).any())
    assert _rel(logits[clear], ref.logits[clear]) <= TOL
    # a tie: the top-2 margin within the logits' own deviation (twice the largest on that row)
    dev = (logits - ref.logits).abs().amax(1)
    decided = clear & (ref.margin > 2 * dev)
    assert int(decided.sum()) >= 0.5 * sp.tokens, "too many near-ties to judge the tokens"
    got = bufs["tokens"].long()
    assert got[decided].tolist() == ref.tokens[decided].tolist(), "argmax tokens differ"
    assert torch.allclose(bufs["margin"][decided], ref.margin[decided], rtol=0.05, atol=2 * float(dev.max()))
    # the step's keys and values, as the reference wrote them, on the tokens clear of routing ties
    # (a few e4m3 entries round to a neighbouring value: inputs deep in the stack are off by ~1e-3)
    rows = torch.arange(sp.tokens)
    conv, j = rows // sp.tokens_each, rows % sp.tokens_each
    for i, lr in enumerate(ref.layers):
        st = state.layers[i]
        slot = (st.convs[conv, 2].long() + j) % st.slots
        old = torch.ones(st.k_cache.shape[:2], dtype=torch.bool)
        old[conv, slot] = False
        for name, cpu, want, was in (("k", st.k_cache, lr.k_cache, before[i][0]), ("v", st.v_cache, lr.v_cache, before[i][1])):
            err = _rel(cpu[conv, slot][clear].float(), want[conv, slot][clear].float())
            assert err <= 2 * TOL, f"layer {i} {name} cache: new entries off by {err:.2e}"
            assert torch.equal(cpu[old].view(torch.uint8), was[old].view(torch.uint8)), f"layer {i} {name} cache: an old entry changed"


def _tokens(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, CFG.vocab_shard, (n,), generator=torch.Generator().manual_seed(seed), dtype=torch.int32)


@pytest.mark.parametrize("conversations, tokens_each, context, steps", [(2, 4, 58, 4), (3, 1, 0, 3)])
def test_decode_matches_reference(weights: ModelWeights, conversations: int, tokens_each: int, context: int, steps: int) -> None:
    """Four layers (sliding, full, sliding, sliding); the first case crosses the
    sliding window (64) mid-run, so the ring wraps."""
    state = make_step_state(CFG, conversations, tokens_each, context, seed=1, steps=steps)
    sp = lower_step(CFG, conversations, tokens_each, state.context_capacity, tiles=TILES, capture_layers=True)
    tokens = _tokens(sp.tokens, 0)
    decode(sp, weights, state, tokens, steps, orders=("stream", "random"))
    assert state.context == context + (steps - 1) * tokens_each


def test_fused_qk_decodes_and_matches_reference(weights: ModelWeights) -> None:
    """Tiles.fuse_qk: every layer's chunks do QK-norm/RoPE themselves, the ring wraps."""
    state = make_step_state(CFG, 2, 4, 58, seed=1, steps=3)
    sp = lower_step(CFG, 2, 4, state.context_capacity, tiles=dataclasses.replace(TILES, fuse_qk=8), capture_layers=True)
    assert not any(o.opcode == Op.QK_ROPE_KV for o in sp.stream.ops)
    decode(sp, weights, state, _tokens(sp.tokens, 0), 3, orders=("stream", "random"))


def test_shared_scratch_with_late_list_workers_matches_reference(weights: ModelWeights) -> None:
    """Scratch shared across layers, instructions run newest-ready first: an
    expert list's late workers then run after the layers that follow (their
    list's finisher signalled for them). A late worker may also run while the
    next layer's list is under way (no order here makes it: they are rare),
    so what it reads, the list's own tensors (role "list"), is never shared."""
    state = make_step_state(CFG, 2, 3, 5, seed=4, steps=2)
    sp = lower_step(CFG, 2, 3, state.context_capacity, tiles=TILES, capture_layers=True)
    lists = [t.name for t in sp.stream.tensors if t.role == "list"]
    assert {n.split(".", 1)[1] for n in lists} == {"route_meta", "work"}
    tokens = _tokens(sp.tokens, 5)
    bufs = bind_step(sp, weights, state.clone(), tokens.clone(), share_scratch=True)
    assert len({bufs[n].data_ptr() for n in lists}) == len(lists) == 2 * sp.n_layers
    decode(sp, weights, state, tokens, 2, share_scratch=True, orders=("newest", "random"))


def test_shared_scratch_decodes_the_same(weights: ModelWeights) -> None:
    runs = []
    for share in (False, True):
        state = make_step_state(CFG, 2, 2, 10, seed=2, steps=3)
        sp = lower_step(CFG, 2, 2, state.context_capacity, tiles=TILES)
        tokens = _tokens(4, 3)
        bufs = bind_step(sp, weights, state, tokens, share_scratch=share)
        counters, seen = None, []
        for step in range(3):
            counters = run_stream(sp.stream, bufs, step=step, counters=counters)
            seen.append(tokens.tolist())
            if step < 2:
                state.advance()
        runs.append(seen)
    assert runs[0] == runs[1]


def test_a_state_put_back_from_a_snapshot_steps_the_same(weights: ModelWeights) -> None:
    """gpuvm sweep --step runs its four ways on one state, put back from a host snapshot between them."""
    state = make_step_state(CFG, 2, 2, 10, seed=2)
    snap = state.clone("cpu")
    sp = lower_step(CFG, 2, 2, state.context_capacity, tiles=TILES)
    runs = []
    for k in range(2):
        if k:
            assert any(not torch.equal(a.k_cache, b.k_cache) for a, b in zip(state.layers, snap.layers)), "the step wrote no cache slot"
            state.copy_(snap)
            assert all(torch.equal(a.k_cache, b.k_cache) and torch.equal(a.v_cache, b.v_cache) for a, b in zip(state.layers, snap.layers))
        tokens = _tokens(4, 3)
        bufs = bind_step(sp, weights, state, tokens)
        run_stream(sp.stream, bufs, step=0)
        runs.append((tokens.clone(), bufs["s"].clone()))
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
    with pytest.raises(ValueError, match="cannot copy"):
        state.copy_(make_step_state(CFG, 3, 2, 10, seed=2))
    with pytest.raises(ValueError, match="cannot copy"):
        state.layers[0].copy_(state.layers[1] if state.layers[1].kind != state.layers[0].kind else make_step_state(CFG, 2, 2, 11, seed=2).layers[0])


def test_positions_advance_without_rebuild() -> None:
    state = make_step_state(CFG, 2, 3, 5, seed=1, steps=4)
    table = state.convs_schedule(4)
    for k in range(4):
        assert torch.equal(table[k], state.convs), f"step {k}"
        if k < 3:
            state.advance()
    with pytest.raises(ValueError, match="capacity"):
        state.convs_schedule(2)


# ---- broken ops fail the check ---------------------------------------------------------------
def _embed_next_row(ts: list[torch.Tensor | None], a: tuple[int, ...]) -> None:
    tok = ts[2]
    assert tok is not None
    saved = tok.clone()
    tok.copy_((tok + 1) % ts[1].shape[0])  # type: ignore[union-attr]
    try:
        cpu_ops.embed(ts, a)
    finally:
        tok.copy_(saved)


def _argmax_second_best(ts: list[torch.Tensor | None], a: tuple[int, ...]) -> None:
    cpu_ops.argmax(ts, a)
    logits, tok = ts[0], ts[1]
    assert logits is not None and tok is not None
    rows = slice(a[0], a[0] + a[1])
    tok[rows] = torch.sort(logits[rows], dim=1, descending=True, stable=True).indices[:, 1].to(torch.int32)


def _residual_no_next_norm_weight(ts: list[torch.Tensor | None], a: tuple[int, ...]) -> None:
    w = ts[4]
    cpu_ops.residual(list(ts[:4]) + ([torch.zeros_like(w)] + list(ts[5:]) if w is not None else []), a)


@pytest.mark.parametrize("op, broken", [(Op.EMBED, _embed_next_row), (Op.ARGMAX, _argmax_second_best), (Op.RESIDUAL, _residual_no_next_norm_weight)],
                         ids=["embed-wrong-row", "argmax-second-best", "fused-norm-without-w"])
def test_broken_op_fails_the_check(weights: ModelWeights, op: Op, broken: object, monkeypatch: pytest.MonkeyPatch) -> None:
    def run() -> None:
        state = make_step_state(CFG, 2, 2, 20, seed=4)
        sp = lower_step(CFG, 2, 2, state.context_capacity, capture_layers=True)
        decode(sp, weights, state, _tokens(4, 9), 1)

    run()
    monkeypatch.setitem(cpu_ops.OPS, op, broken)
    with pytest.raises(AssertionError):
        run()


# ---- EMBED and ARGMAX --------------------------------------------------------------------------
def _one(op: Op, shapes: dict[str, tuple[tuple[int, ...], DType]], args: list[int], names: list[str | None]) -> None:
    p = Program("one")
    ts = {k: p.tensor(k, s, dt) for k, (s, dt) in shapes.items()}
    p.op(op, [None if n is None else ts[n] for n in names], args)


def test_embed_gathers_rows_and_refuses_bad_ids() -> None:
    table = torch.randn(10, 16).bfloat16()
    s = torch.full((4, 16), float("nan"))
    tok = torch.tensor([3, 9, 0, 3], dtype=torch.int32)
    cpu_ops.embed([s, table, tok], [1, 2])
    assert torch.equal(s[1:3], table[[9, 0]].float()) and bool(torch.isnan(s[[0, 3]]).all())
    for bad in (10, -1):
        tok[2] = bad
        before = s.clone()
        with pytest.raises(CpuOpError, match=r"outside \[0, 10\)"):
            cpu_ops.embed([s, table, tok], [0, 4])
        assert torch.equal(s.isnan(), before.isnan()), "a refused EMBED writes nothing"
    ok = {"s": ((4, 16), DType.F32), "table": ((10, 16), DType.BF16), "tok": ((4,), DType.I32), "tok3": ((3,), DType.I32),
          "t12": ((10, 12), DType.BF16), "s12": ((4, 12), DType.F32), "tf": ((10, 16), DType.F32)}
    _one(Op.EMBED, ok, [0, 4], ["s", "table", "tok"])
    for args, names, msg in (([2, 3], ["s", "table", "tok"], "row range"), ([0, 4], ["s", "table", "tok3"], "tokens"),
                             ([0, 4], ["s", "tf", "tok"], "dtype"), ([0, 4], ["s12", "t12", "tok"], "multiple of 8"),
                             ([0, 4], ["s", "t12", "tok"], "disagree on D")):
        with pytest.raises(ProgramError, match=msg):
            _one(Op.EMBED, ok, args, names)


def test_argmax_picks_the_lower_index_on_ties() -> None:
    logits = torch.tensor([[0.0, 2.0, 1.0, 2.0], [5.0, -1.0, 4.5, 4.75], [-3.0, -3.0, -3.0, -3.0]])
    tok = torch.full((3,), -7, dtype=torch.int32)
    margin = torch.full((3,), float("nan"))
    cpu_ops.argmax([logits, tok, margin], [0, 3])
    assert tok.tolist() == [1, 0, 0]
    assert margin.tolist() == [0.0, 0.25, 0.0]
    one = torch.full((1,), -7, dtype=torch.int32)
    m1 = torch.zeros(1)
    cpu_ops.argmax([torch.tensor([[1.5]]), one, m1], [0, 1])
    assert one.tolist() == [0] and m1.tolist() == [float("inf")]
    cpu_ops.argmax([logits, tok, None], [2, 1])  # the margin is optional
    for bad in (float("nan"), float("inf")):
        x = logits.clone()
        x[1, 2] = bad
        t2 = tok.clone()
        with pytest.raises(CpuOpError, match="NaN or infinite"):
            cpu_ops.argmax([x, t2, margin], [0, 3])
        assert torch.equal(t2, tok), "a refused ARGMAX writes nothing"
    ok = {"x": ((3, 4), DType.F32), "t": ((3,), DType.I32), "m": ((3,), DType.F32), "m2": ((2,), DType.F32), "xb": ((3, 4), DType.BF16)}
    _one(Op.ARGMAX, ok, [0, 3], ["x", "t", "m"])
    _one(Op.ARGMAX, ok, [0, 3], ["x", "t", None])
    for args, names, msg in (([1, 3], ["x", "t", "m"], "row range"), ([0, 3], ["x", "t", "m2"], "margin"), ([0, 3], ["xb", "t", None], "dtype")):
        with pytest.raises(ProgramError, match=msg):
            _one(Op.ARGMAX, ok, args, names)


# ---- weights and memory -------------------------------------------------------------------------
def test_model_weights_are_deterministic_and_sized() -> None:
    a, b = make_model_weights(CFG, 3, layers=2), make_model_weights(CFG, 3, layers=2)
    assert a.n_layers == 2 and torch.equal(a.embed, b.embed) and torch.equal(a.lm_head, b.lm_head)
    assert torch.equal(a.layers[1].Wqkvg, b.layers[1].Wqkvg)
    assert not torch.equal(a.embed, make_model_weights(CFG, 4, layers=1).embed)
    assert a.nbytes() == model_nbytes(CFG, 2)
    assert (a.embed.shape, a.lm_head.shape, a.w_final.shape) == ((CFG.vocab_shard, CFG.d),) * 2 + ((CFG.d,),)
    # MUSE.md: 62 shard layers are 68.4 GB; embedding and LM head add 2 x 25,256 x 8,192 bf16
    assert round(62 * layer_nbytes(SHARD).total / 1e9, 1) == 68.4
    assert model_nbytes(SHARD) == 62 * layer_nbytes(SHARD).total + 2 * 25_256 * 8_192 * 2 + 8_192 * 4
    with pytest.raises(ValueError, match="layers"):
        make_model_weights(CFG, 3, layers=9)


@pytest.mark.parametrize("share, capture", [(True, False), (False, True)])
def test_memory_estimate_is_what_bind_allocates(weights: ModelWeights, share: bool, capture: bool) -> None:
    state = make_step_state(CFG, 2, 3, 20, seed=1, steps=3)
    sp = lower_step(CFG, 2, 3, state.context_capacity, capture_layers=capture)
    bufs = bind_step(sp, weights, state, torch.zeros(6, dtype=torch.int32), share_scratch=share)
    storages = {b.untyped_storage().data_ptr(): b.untyped_storage().nbytes() for b in bufs.values()}
    mem = step_memory(CFG, 2, 3, 20, 3, share_scratch=share, capture_layers=capture)
    assert sum(storages.values()) == mem.weights + mem.kv + mem.scratch
    assert mem.program == len(sp.stream) * 128 + len(sp.stream.tensors) * 64
    assert step_memory_bytes(CFG, 2, 3, 20, 3, share_scratch=share, capture_layers=capture) == mem.total


def test_memory_error_names_the_bytes() -> None:
    h200 = 139 * 2**30
    mem = check_step_fits(SHARD, 32, 8, 81_920, 128, free_bytes=h200)  # the largest decode case fits one H200
    assert mem.weights > 68.4e9 and mem.kv > 16 * 32 * 81_920 * 256
    with pytest.raises(OutOfDeviceMemory, match=r"needs \d+\.\d+ GB \(\d+ bytes\).*only 80\.00 GB \(80000000000 bytes\) are free") as e:
        check_step_fits(SHARD, 32, 8, 81_920, 128, free_bytes=80_000_000_000)
    assert e.value.needed == mem.total and e.value.available == 80_000_000_000
    with pytest.raises(OutOfDeviceMemory):  # 32 conversations of 1M tokens: 16 full layers of 8.6 GB of KV each
        check_step_fits(SHARD, 32, 1, 1_048_576, 1, free_bytes=h200, tiles=Tiles(chunk=1 << 16))


def test_reference_step_refuses_bad_tokens(weights: ModelWeights) -> None:
    state = make_step_state(CFG, 1, 2, 0, seed=1)
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 512\)"):
        reference_step(CFG, weights, state, torch.tensor([0, CFG.vocab_shard]))
    with pytest.raises(ValueError, match="need 2 token ids"):
        reference_step(CFG, weights, state, torch.tensor([0]))
