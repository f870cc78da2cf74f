"""The code warmer's instances (Tiles.code_warm, gpuvm/muse/code_warm.py):
apart from the real layer, first in the stream, on the real layer's op paths,
and no change to what the real layer computes."""
from __future__ import annotations

import random

import pytest
import torch

from gpuvm.cpu import run_stream
from gpuvm.isa import Op
from gpuvm.muse import code_warm
from gpuvm.muse.cases import get_case, small_case
from gpuvm.muse.config import SHARD, SMALL
from gpuvm.muse.lowering import LayerProgram, Tiles, bind_layer, lower_layer
from gpuvm.muse.state import make_inputs, make_state
from gpuvm.muse.weights import make_layer_weights
from gpuvm.opspec import ProgramError
from gpuvm.trace.timeline import op_name


def _split(lp: LayerProgram) -> tuple[list[int], list[int]]:
    warm = [i for i, label in enumerate(lp.stream.labels) if label.startswith(code_warm.PREFIX)]
    real = [i for i, label in enumerate(lp.stream.labels) if not label.startswith(code_warm.PREFIX)]
    return warm, real


@pytest.mark.parametrize("name", ["full-c1-t1", "sliding-c1-t8", "sliding-c16-t1", "full-c32-t1"])
def test_warm_layer_is_apart_and_on_the_real_paths(name: str) -> None:
    case = get_case(name)
    slots = 2048 + case.tokens_each if case.kind == "sliding" else 4096
    plain = lower_layer(SHARD, case.kind, case.conversations, case.tokens_each, slots, tiles=Tiles(code_warm=0))
    lp = lower_layer(SHARD, case.kind, case.conversations, case.tokens_each, slots)  # on by default up to 32 tokens
    assert lp.warm and not plain.warm
    warm, real = _split(lp)
    assert warm and len(real) == len(plain.stream)
    ops = lp.stream.ops
    assert warm == list(range(len(warm)))  # lead ops: first in the stream, claimed at launch
    for i in warm:  # only its own tensors and counters; no waits but the lists' on the small top-k
        assert all(t.name.startswith(code_warm.PREFIX) for t in ops[i].tensors if t is not None)
        lists = ops[i].opcode in (Op.EXPERT_UP, Op.EXPERT_DOWN, Op.EXPERT_COMBINE)
        assert [c.name for c, _ in ops[i].waits] == ([code_warm.PREFIX + "topk"] if lists else [])
        assert ops[i].signal is not None and ops[i].signal.name.startswith(code_warm.PREFIX)
    # one instance of each op (a GEMM cut over K: every part of one tile)
    names = [op_name(lp.stream.labels[i]) for i in warm if not (ops[i].opcode == Op.GEMM and ops[i].args[5] > 1)]
    assert len(names) == len(set(names))
    for i in real:
        assert not any(t.name.startswith(code_warm.PREFIX) for t in ops[i].tensors if t is not None)
        assert not any(c.name.startswith(code_warm.PREFIX) for c, _ in ops[i].waits)
    # the real layer's instructions as without the warmer, in the same relative order
    assert [(ops[i].opcode, ops[i].args, lp.stream.labels[i]) for i in real] == \
        [(o.opcode, o.args, lbl) for o, lbl in zip(plain.stream.ops, plain.stream.labels)]
    # every op kind the real layer runs, the small one runs too (fused QK-norm or not alike)
    assert {ops[i].opcode for i in warm} == {o.opcode for o in plain.stream.ops}
    chunk_q = {len(o.tensors[0].shape) for o in plain.stream.ops if o.opcode == Op.ATTN_CHUNK}  # 2: fused QK-norm
    assert {len(ops[i].tensors[0].shape) for i in warm if ops[i].opcode == Op.ATTN_CHUNK} == chunk_q


def test_no_warmer_above_the_token_bound() -> None:
    case = get_case("full-c16-t8")
    lp = lower_layer(SHARD, case.kind, case.conversations, case.tokens_each, 4096, tiles=Tiles(code_warm=32))
    assert not lp.warm and not any(label.startswith(code_warm.PREFIX) for label in lp.stream.labels)


def test_code_warm_must_stay_under_gemm_span() -> None:
    with pytest.raises(ProgramError, match="code_warm"):
        Tiles(code_warm=64)
    with pytest.raises(ProgramError, match="code_warm"):
        Tiles(code_warm=-1)


@pytest.mark.parametrize("name", ["sliding-c1-t1", "full-c1-t8"])
def test_cpu_run_with_the_warmer_computes_the_same_layer(name: str) -> None:
    """The real layer's output and KV, bit for bit, with the small layer run
    beside it in a random valid order over two steps."""
    case = small_case(get_case(name), SMALL)
    w = make_layer_weights(SMALL, 1 if case.kind == "full" else 0, 3)
    outs = []
    for tiles in (Tiles(code_warm=0), Tiles()):
        state = make_state(SMALL, case.kind, case.conversations, case.tokens_each, case.context, 5)
        s = make_inputs(SMALL, state, 5)
        lp = lower_layer(SMALL, case.kind, case.conversations, case.tokens_each, state.slots, tiles=tiles)
        assert lp.warm == bool(tiles.code_warm)
        bufs = bind_layer(lp, w, state, s)
        counters = None
        for step in range(2):
            counters = run_stream(lp.stream, bufs, step=step, order="random", rng=random.Random(step), counters=counters)
        if lp.warm:  # the small layer ran: its residual stream moved
            assert not torch.equal(bufs[code_warm.PREFIX + "s"], code_warm.warm_inputs(case.kind, case.tokens_each, "cpu").s)
        outs.append((bufs["s"].clone(), state.k_cache.clone(), state.v_cache.clone()))
    for a, b in zip(*outs):
        assert torch.equal(a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a, b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b)
