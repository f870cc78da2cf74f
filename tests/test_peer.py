"""The peer (a PyTorch kernel chain) computes the same layer as the reference."""
from __future__ import annotations

import pytest
import torch

from gpuvm.muse.config import SMALL
from gpuvm.muse.reference import reference_layer
from gpuvm.muse.state import make_inputs, make_state
from gpuvm.muse.weights import make_layer_weights
from gpuvm.peer import PeerLayer


@pytest.mark.parametrize(
    "kind,conversations,tokens_each,context",
    [("full", 1, 1, 40), ("full", 2, 8, 90), ("sliding", 3, 1, 30), ("sliding", 2, 8, 200)],
)
def test_peer_matches_reference(kind: str, conversations: int, tokens_each: int, context: int) -> None:
    w = make_layer_weights(SMALL, 1, seed=11)
    state = make_state(SMALL, kind, conversations, tokens_each, context, seed=12)
    s = make_inputs(SMALL, state, seed=13)
    ref = reference_layer(SMALL, w, state.clone(), s.clone(), kind)
    peer = PeerLayer.create(SMALL, w, state, s.clone(), kind)
    peer.run()
    err = ((peer.s - ref.s_out).norm() / ref.s_out.norm()).item()
    assert err < 1e-2
    clear = ref.margin > 1e-3
    # the chosen set must agree; order inside the top-8 may differ by rounding
    assert torch.equal(peer.topk_idx[clear].sort(1).values, ref.topk_idx[clear].sort(1).values)
    assert torch.equal(state.k_cache.view(torch.uint8), ref.k_cache.view(torch.uint8))


def test_peer_rejects_unknown_kind() -> None:
    w = make_layer_weights(SMALL, 0, seed=1)
    state = make_state(SMALL, "full", 1, 1, 8, seed=2)
    with pytest.raises(ValueError, match="kind"):
        PeerLayer.create(SMALL, w, state, make_inputs(SMALL, state, seed=3), "global")
