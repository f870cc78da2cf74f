"""The per-op launch chain (gpuvm.device.chain): a whole step split into one
stream per op, run op after op on the CPU backend, gives the same bits as the
step's own stream."""
from __future__ import annotations

import pytest
import torch

from gpuvm.cpu import run_stream
from gpuvm.device.chain import op_groups, op_stem, split_by_op
from gpuvm.isa import Op
from gpuvm.muse.config import SMALL
from gpuvm.muse.lowering import Tiles
from gpuvm.muse.step import bind_step, lower_step, make_step_state
from gpuvm.muse.weights import make_model_weights
from gpuvm.program import Program, ProgramError

TILES = Tiles(gemm_fill=0, gemm_bytes=16 * 1024, expert_workers=5, rows=3, chunk=29, sliding_chunk=29)


def test_op_stem() -> None:
    assert op_stem("L3.Wqkvg[0:16]") == "L3.Wqkvg" and op_stem("argmax") == "argmax"


def test_split_step_runs_like_the_step() -> None:
    weights = make_model_weights(SMALL, 5)
    sp = lower_step(SMALL, 2, 2, 12, tiles=TILES)
    parts = split_by_op(sp.stream)
    groups = op_groups(sp.stream)
    # QK-norm/RoPE in the attention chunks at few tokens; Wqkvg's late g tiles their own op
    per_layer = (13 if 2 * 2 <= TILES.fuse_qk else 14) + (2 * 2 <= TILES.g_late)
    assert len(parts) == len(groups) == 2 + per_layer * SMALL.n_layers + 2  # embed, rmsnorm of layer 0, the layers, lm_head, argmax
    assert sorted(k for _, ks in groups for k in ks) == list(range(len(sp.stream)))
    assert all(o.waits == () and o.signal is None for s in parts for o in s.ops)
    # every op after the ops it reads from
    at = {name: i for i, (name, _) in enumerate(groups)}
    for name, ks in groups:
        for k in ks:
            assert all(at[op_stem(sp.stream.ops[d].label)] < at[name] for d in sp.stream.deps[k])
    bufs = []
    for _ in range(2):
        state = make_step_state(SMALL, 2, 2, 12, seed=1, steps=2)
        tokens = torch.tensor([3, 7, 11, 2], dtype=torch.int32)
        bufs.append(bind_step(sp, weights, state, tokens))
    run_stream(sp.stream, bufs[0])
    for s in parts:
        run_stream(s, {t.name: bufs[1][t.name] for t in s.tensors})
    for name, t in bufs[0].items():  # bit for bit (NaN poison left alike)
        assert torch.equal(t.view(torch.uint8), bufs[1][name].view(torch.uint8)), name


def test_an_op_that_waits_on_itself_cannot_be_one_launch() -> None:
    p = Program("self")
    c = p.counter("c")
    p.op(Op.NOP, signal=c, label="a[0]")
    p.op(Op.NOP, waits=[c], label="a[1]")
    with pytest.raises(ProgramError, match="waits on itself"):
        op_groups(p.build())
