"""A whole decode step of the small model on the GPU, four ways: the VM in
dynamic and static mode (one launch each) and the same instructions as one
launch per op (gpuvm.device.chain), plain and under a CUDA graph. The same
instructions round alike, so tokens and residual stream must agree bit for
bit (the step against the reference: tests/gpu/test_muse_layer.py per layer,
tools/step_check.py whole)."""
from __future__ import annotations

import pytest
import torch

from gpuvm.device.chain import OpChain
from gpuvm.muse.config import SMALL
from gpuvm.muse.lowering import Tiles
from gpuvm.muse.step import bind_step, lower_step, make_step_state
from gpuvm.muse.weights import make_model_weights

DEV = torch.device("cuda", 0)


def _setup():  # type: ignore[no-untyped-def]
    """The same step, state and tokens each call (seeded), on the GPU."""
    weights = make_model_weights(SMALL, 3)
    state = make_step_state(SMALL, 3, 2, 40, seed=4, steps=2, device=DEV)
    sp = lower_step(SMALL, 3, 2, state.context_capacity)
    tokens = torch.tensor([5, 9, 100, 7, 300, 2], dtype=torch.int32, device=DEV)
    return sp, bind_step(sp, weights, state, tokens, device=DEV), tokens


@pytest.mark.parametrize("how", ["dynamic", "static", "chain", "chain graph"])
def test_step_runs_alike_every_way(vm_plain, how: str) -> None:  # type: ignore[no-untyped-def]
    results = {}
    for way in ("dynamic", how):
        sp_g, bufs, tokens = _setup()
        if way in ("dynamic", "static"):
            vm_plain.load(sp_g.stream, bufs).run(0, way)
        else:
            chain = OpChain(vm_plain, sp_g.stream, bufs)
            # fused QK: 13 ops a layer; Wqkvg's late g tiles an op of their own
            per_layer = (13 if len(tokens) <= Tiles().fuse_qk else 14) + (len(tokens) <= Tiles().g_late)
            assert len(chain) == 2 + per_layer * SMALL.n_layers + 2
            if way == "chain":
                chain.run(0)
            else:
                first = tokens.clone()
                g = chain.graph()  # its warm-up runs the step once: ARGMAX overwrote the tokens
                tokens.copy_(first)  # the replay writes the same new keys again
                g.replay()
                chain.check()
        torch.cuda.synchronize()
        results[way] = (tokens.cpu(), bufs["s"].cpu())
    tok, s = results[how]
    assert ((tok >= 0) & (tok < SMALL.vocab_shard)).all() and not bool(torch.isnan(s).any())
    assert torch.equal(tok, results["dynamic"][0]) and torch.equal(s, results["dynamic"][1])
