"""Synthetic layer weights: shapes, determinism, sizes and the routing skew."""
from __future__ import annotations

import math

import pytest
import torch

from gpuvm.muse.config import SHARD, SMALL, MuseConfig
from gpuvm.muse.formats import dequantize_nvfp4
from gpuvm.muse.reference import rms
from gpuvm.muse.state import make_inputs, make_state
from gpuvm.muse.weights import (
    EXPERT_FIELDS,
    LayerWeights,
    layer_nbytes,
    layer_shapes,
    make_dense_tensor,
    make_expert,
    make_layer_weights,
    make_router,
    skew_direction,
    skew_ranks,
)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype == torch.float8_e4m3fn:
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    return a.dtype == b.dtype and torch.equal(a, b)


@pytest.fixture(scope="module")
def small() -> LayerWeights:
    return make_layer_weights(SMALL, 1, seed=7)


def test_fields_shapes_dtypes(small: LayerWeights) -> None:
    shapes = layer_shapes(SMALL)
    got = small.tensors()
    assert list(got) == list(shapes)
    for name, (shape, dt) in shapes.items():
        t = got[name]
        assert tuple(t.shape) == shape and t.dtype == dt and t.is_contiguous(), name
    # the interface the lowering binds to, spelled out
    d, H, I, E = SMALL.d, SMALL.squeeze, SMALL.expert_inter, SMALL.local_experts
    assert small.Wqkvg.shape == (2 * 16 * 64 + 2 * 2 * 64, d) and small.Wo.shape == (d, 16 * 64)
    assert small.Wr.shape == (SMALL.n_experts, d) and small.Wr.dtype == torch.float32
    assert small.Wsq.shape == (H, d) and small.Wex.shape == (d, H) and small.Wex.dtype == torch.bfloat16
    # experts tiled: blocks of 16 rows, 8 code bytes and 1 scale byte a value of K per block
    assert small.gu_codes.shape == (E, 2, I // 16, 8 * H) and small.gu_scales.shape == (E, 2, I // 16, H)
    assert small.d_codes.shape == (E, H // 16, 8 * I) and small.d_scales.dtype == torch.float8_e4m3fn
    assert small.gu_ts.shape == (E, 2) and small.d_ts.shape == (E,)
    assert small.w_qn.shape == (64,) and small.alpha2.shape == (d,)
    assert small.k_scale == 1.0 and small.v_scale == 1.0
    assert small.nbytes() == layer_nbytes(SMALL).total


def test_deterministic_and_distinct(small: LayerWeights) -> None:
    again = make_layer_weights(SMALL, 1, seed=7)
    other_layer = make_layer_weights(SMALL, 2, seed=7)
    other_seed = make_layer_weights(SMALL, 1, seed=8)
    for name, t in small.tensors().items():
        assert _same(t, again.tensors()[name]), name
        if t.numel() > 8:
            assert not _same(t, other_layer.tensors()[name]), name
            assert not _same(t, other_seed.tensors()[name]), name
    # every expert, and gate and up within one, has its own values
    codes = small.gu_codes.flatten(2)
    for e in range(SMALL.local_experts):
        assert not torch.equal(codes[e, 0], codes[e, 1])
        for f in range(e):
            assert not torch.equal(codes[e], codes[f]) and not torch.equal(small.d_codes[e], small.d_codes[f])


def test_parts_match_the_whole(small: LayerWeights) -> None:
    assert _same(make_dense_tensor(SMALL, "Wsq", 1, 7), small.Wsq)
    assert _same(make_router(SMALL, 1, 7), small.Wr)
    ex = make_expert(SMALL, 1, 2, 7)
    for name, t, stored in zip(EXPERT_FIELDS, ex, small.expert(2)):
        assert _same(t, stored), name
    with pytest.raises(ValueError, match="dense fields"):
        make_dense_tensor(SMALL, "gu_codes", 1, 7)
    with pytest.raises(ValueError):
        make_expert(SMALL, 1, SMALL.local_experts, 7)


def test_layer_nbytes_shard_matches_muse_md() -> None:
    b = layer_nbytes(SHARD)
    assert b.dense_matrices / 1e6 == pytest.approx(197.1, abs=0.05)
    assert b.dense / 1e6 == pytest.approx(197.3, abs=0.05)  # plus norm weights and gates
    assert b.expert / 1e6 == pytest.approx(28.3, abs=0.05)
    assert b.total / 1e9 == pytest.approx(1.10, abs=0.01)
    assert 62 * b.total / 1e9 == pytest.approx(68.4, abs=0.1)


def test_value_ranges(small: LayerWeights) -> None:
    assert 0.9 < small.alpha1.min() and small.alpha2.max() < 1.1
    assert 0.1 <= small.beta1.min() and small.beta2.max() <= 0.5
    assert small.w_attn.std() == pytest.approx(0.1, rel=0.3)
    # N(0, 1/fan_in): a unit-rms input gives unit-rms outputs
    for name in ("Wqkvg", "Wo", "Wsq", "Wex"):
        m = getattr(small, name).float()
        assert (m.pow(2).sum(1).mean() ** 0.5).item() == pytest.approx(1.0, rel=0.1), name
    gate, up, down = small.expert_matrices(0)
    for m in (gate, up, down):
        assert (m.pow(2).sum(1).mean() ** 0.5).item() == pytest.approx(1.0, rel=0.1)
    ex = make_expert(SMALL, 1, 0, 7)
    assert torch.equal(down, dequantize_nvfp4(ex.d_codes, ex.d_scales, ex.d_ts.item()))


def test_to_device_roundtrip(small: LayerWeights) -> None:
    moved = small.to("cpu")
    assert all(_same(a, b) for a, b in zip(small.tensors().values(), moved.tensors().values()))
    with pytest.raises(ValueError):
        make_layer_weights(SMALL, 0, 0, k_scale=0.0)


def _local_load(cfg: MuseConfig, layer: int, seed: int, s: torch.Tensor) -> torch.Tensor:
    """Tokens per local expert when the router sees s after an attention-like
    residual: alpha1 * s + beta1 * (unit-rms noise standing in for rms(a))."""
    a1, b1 = (make_dense_tensor(cfg, n, layer, seed) for n in ("alpha1", "beta1"))
    noise = torch.randn(s.shape, generator=torch.Generator().manual_seed(99))
    h2 = rms(a1 * s + b1 * rms(noise)) * (1 + make_dense_tensor(cfg, "w_moe", layer, seed))
    top = (h2 @ make_router(cfg, layer, seed).T).topk(cfg.top_k, dim=1).indices
    return torch.bincount(top.flatten(), minlength=cfg.n_experts)[: cfg.local_experts]


def _even_share(cfg: MuseConfig, tokens: int) -> float:
    return tokens * cfg.top_k * cfg.local_experts / cfg.n_experts


def test_skew_full_width_router() -> None:
    """MUSE.md: at 256 tokens this shard gets ~2x its even share, the top expert 100+."""
    for seed, layer in ((0, 0), (1, 5)):
        state = make_state(SHARD, "full", 32, 8, 0, seed=1)
        s = make_inputs(SHARD, state, seed=seed + 10, weights_seed=seed)
        load = _local_load(SHARD, layer, seed, s)
        ratio = load.sum().item() / _even_share(SHARD, 256)
        assert 1.6 < ratio < 2.5, ratio
        assert load.max().item() >= 100
        assert load.max().item() > 3 * load.float().median().item()  # uneven
        assert skew_ranks(SHARD, layer, seed)[0].item() == load.argmax().item()


def test_skew_comes_from_router_and_direction() -> None:
    cfg, seed = SMALL, 3
    state = make_state(cfg, "full", 32, 8, 0, seed=1)
    s = make_inputs(cfg, state, seed=5, weights_seed=seed)
    skewed = _local_load(cfg, 0, seed, s).sum().item() / _even_share(cfg, 256)
    assert skewed > 1.4
    u = skew_direction(cfg, seed)
    plain = s - torch.outer(s @ u, u)  # the same inputs without the skew direction
    even = _local_load(cfg, 0, seed, plain).sum().item() / _even_share(cfg, 256)
    assert 0.7 < even < 1.3
    # other seeds' inputs carry another direction: no skew
    s_other = make_inputs(cfg, state, seed=5, weights_seed=seed + 1)
    assert _local_load(cfg, 0, seed, s_other).sum().item() / _even_share(cfg, 256) < 1.3
    # non-local router rows ignore the direction; local ones follow it
    wr = make_router(cfg, 0, seed)
    along = wr @ u * math.sqrt(cfg.d)
    assert along[cfg.local_experts:].abs().max() < 1e-4
    assert bool((along[: cfg.local_experts] > 0.5).all())
    # route_skew = 0 turns it off
    flat = make_router(cfg.with_(route_skew=0.0), 0, seed)
    assert (flat @ u).abs().max() < 1e-5
