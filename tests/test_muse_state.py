"""Decode state (conversation table, FP8 caches) and layer inputs."""
from __future__ import annotations

import math

import pytest
import torch

from gpuvm.muse.config import SMALL
from gpuvm.muse.state import cache_slots, make_inputs, make_state
from gpuvm.muse.weights import SKEW_INPUT, skew_direction


def test_convs_and_cache_layout() -> None:
    st = make_state(SMALL, "full", 3, 4, 100, seed=0)
    assert st.convs.dtype == torch.int32 and st.convs.tolist() == [[0, 4, 100, 0], [4, 4, 100, 0], [8, 4, 100, 0]]
    assert st.k_cache.dtype == torch.float8_e4m3fn and st.v_cache.dtype == torch.float8_e4m3fn
    assert st.k_cache.shape == (3, st.slots, SMALL.heads_kv, 64) and st.k_cache.is_contiguous()
    assert st.slots >= 104 and st.slots % 64 == 0
    assert st.tokens == 12 and st.window == 0
    assert st.positions().tolist() == [100, 101, 102, 103] * 3
    k = st.k_cache.float()
    assert bool(torch.isfinite(k).all()) and k.std().item() == pytest.approx(1.0, rel=0.1)
    assert not torch.equal(st.k_cache.view(torch.uint8), st.v_cache.view(torch.uint8))


def test_sliding_ring_capacity() -> None:
    st = make_state(SMALL, "sliding", 2, 8, 5000, seed=0)
    assert st.window == SMALL.window
    assert st.slots == 128 >= SMALL.window + 8  # a ring, independent of the context
    assert cache_slots(SMALL, "sliding", 1, 10**6) == 128
    assert cache_slots(SMALL, "full", 8, 100, steps=3) == 128


def test_deterministic() -> None:
    a = make_state(SMALL, "full", 2, 2, 10, seed=4)
    b = make_state(SMALL, "full", 2, 2, 10, seed=4)
    c = make_state(SMALL, "full", 2, 2, 10, seed=5)
    assert torch.equal(a.k_cache.view(torch.uint8), b.k_cache.view(torch.uint8))
    assert not torch.equal(a.k_cache.view(torch.uint8), c.k_cache.view(torch.uint8))
    assert torch.equal(make_inputs(SMALL, a, 1), make_inputs(SMALL, b, 1))
    assert not torch.equal(make_inputs(SMALL, a, 1), make_inputs(SMALL, a, 2))


def test_advance() -> None:
    st = make_state(SMALL, "full", 2, 8, 40, seed=0, steps=3)
    assert st.slots == 64
    st.advance()
    assert st.context == 48 and st.convs[:, 2].tolist() == [48, 48] and st.convs[:, 0].tolist() == [0, 8]
    st.advance()
    assert st.context == 56
    with pytest.raises(ValueError, match="cannot hold"):
        st.advance()
    ring = make_state(SMALL, "sliding", 1, 8, 40, seed=0)
    for _ in range(100):
        ring.advance()
    assert ring.context == 840 and ring.positions().tolist()[0] == 840


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="kind"):
        make_state(SMALL, "local", 1, 1, 0, seed=0)
    with pytest.raises(ValueError):
        make_state(SMALL, "full", 0, 1, 0, seed=0)
    with pytest.raises(ValueError):
        make_state(SMALL, "full", 1, 1, -1, seed=0)


def test_inputs_carry_the_skew_direction() -> None:
    st = make_state(SMALL, "sliding", 4, 8, 10, seed=0)
    s = make_inputs(SMALL, st, seed=2)
    assert s.shape == (32, SMALL.d) and s.dtype == torch.float32
    u = skew_direction(SMALL, 2)
    along = (s @ u) / math.sqrt(SMALL.d)
    assert along.mean().item() == pytest.approx(SKEW_INPUT, abs=0.15)
    assert s.pow(2).mean().sqrt().item() == pytest.approx(math.sqrt(1 + SKEW_INPUT**2), rel=0.05)
    other = make_inputs(SMALL, st, seed=2, weights_seed=9)
    assert ((other @ u) / math.sqrt(SMALL.d)).abs().mean().item() < 0.3
