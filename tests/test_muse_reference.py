"""The formula-level layer reference: masking, window, caches, RoPE, routing, experts."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from gpuvm.muse.config import SMALL
from gpuvm.muse.formats import bf16_round, from_e4m3, to_e4m3
from gpuvm.muse.reference import RefOut, reference_layer, rms, rope
from gpuvm.muse.state import DecodeState, make_inputs, make_state
from gpuvm.muse.weights import LayerWeights, make_layer_weights, skew_direction

CFG = SMALL
W = CFG.window


@pytest.fixture(scope="module")
def weights() -> LayerWeights:
    return make_layer_weights(CFG, 1, seed=0)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


def _run(w: LayerWeights, st: DecodeState, s: torch.Tensor, **kw: bool) -> RefOut:
    return reference_layer(CFG, w, st, s, st.kind, **kw)


def test_deterministic_finite_order_one_and_state_untouched(weights: LayerWeights) -> None:
    st = make_state(CFG, "sliding", 3, 8, 100, seed=1)
    k_before = st.k_cache.clone()
    s = make_inputs(CFG, st, seed=0)
    a, b = _run(weights, st, s), _run(weights, st, s)
    assert torch.equal(a.s_out, b.s_out) and torch.equal(a.topk_idx, b.topk_idx)
    assert bool(torch.isfinite(a.s_out).all())
    assert 0.5 < a.s_out.pow(2).mean().sqrt().item() < 3.0
    assert a.s_out.shape == (24, CFG.d) and a.s_out.dtype == torch.float32
    assert torch.equal(_bytes(st.k_cache), _bytes(k_before))


def test_cache_writes_fp8_of_new_keys(weights: LayerWeights) -> None:
    st = make_state(CFG, "full", 2, 4, 30, seed=1)
    r = _run(weights, st, make_inputs(CFG, st, seed=0))
    new = torch.arange(30, 34)
    k = r.qkvg[:, CFG.q_width:CFG.q_width + CFG.kv_width].double().reshape(8, CFG.heads_kv, 64)
    k = rms(k) * (1 + weights.w_kn.double())
    v = r.qkvg[:, CFG.q_width + CFG.kv_width:CFG.q_width + 2 * CFG.kv_width].reshape(8, CFG.heads_kv, 64)
    for c in range(2):
        assert torch.equal(_bytes(r.k_cache[c, new]), _bytes(to_e4m3(k[4 * c:4 * c + 4])))
        assert torch.equal(_bytes(r.v_cache[c, new]), _bytes(to_e4m3(v[4 * c:4 * c + 4])))
    others = torch.ones(st.slots, dtype=torch.bool)
    others[new] = False
    assert torch.equal(_bytes(r.k_cache[:, others]), _bytes(st.k_cache[:, others]))


def test_causal_and_conversations_independent(weights: LayerWeights) -> None:
    st = make_state(CFG, "full", 3, 8, 20, seed=2)
    s = make_inputs(CFG, st, seed=0)
    base = _run(weights, st, s)
    s2 = s.clone()
    s2[8 + 5] += torch.randn(CFG.d, generator=torch.Generator().manual_seed(0))  # conversation 1, token 5
    moved = _run(weights, st, s2)
    diff = (moved.s_out - base.s_out).abs().amax(1)
    assert diff[8:13].max() < 1e-6  # earlier tokens of conversation 1
    assert bool((diff[13:16] > 1e-3).all())  # the token itself and later ones
    assert diff[:8].max() < 1e-6 and diff[16:].max() < 1e-6  # other conversations


def test_sliding_window_boundary(weights: LayerWeights) -> None:
    st = make_state(CFG, "sliding", 1, 8, 100, seed=3)  # new positions 100..107
    s = make_inputs(CFG, st, seed=0)
    base = _run(weights, st, s)
    S = st.slots
    visible = torch.zeros(S, dtype=torch.bool)
    visible[torch.arange(100 - W + 1, 100) % S] = True  # what the first new token sees in the cache
    junk = st.clone()
    junk.k_cache[:, ~visible] = to_e4m3(torch.full_like(junk.k_cache[:, ~visible].float(), 300.0))
    junk.v_cache[:, ~visible] = to_e4m3(torch.full_like(junk.v_cache[:, ~visible].float(), -300.0))
    assert torch.equal(_run(weights, junk, s).s_out, base.s_out)
    # position 37 = 100 - W + 1 is seen by the first new token only
    edge = st.clone()
    edge.v_cache[0, 37 % S] = to_e4m3(torch.full((CFG.heads_kv, 64), 200.0))
    diff = (_run(weights, edge, s).s_out - base.s_out).abs().amax(1)
    assert diff[0] > 1e-3 and diff[1:].max() < 1e-6


def test_full_layer_sees_the_whole_context(weights: LayerWeights) -> None:
    st = make_state(CFG, "full", 1, 2, 300, seed=3)
    s = make_inputs(CFG, st, seed=0)
    base = _run(weights, st, s)
    old = st.clone()
    old.v_cache[0, 0] = to_e4m3(torch.full((CFG.heads_kv, 64), 200.0))
    assert bool(((_run(weights, old, s).s_out - base.s_out).abs().amax(1) > 1e-4).all())
    future = st.clone()  # slots past the step are never read
    future.k_cache[0, 302:] = to_e4m3(torch.full_like(future.k_cache[0, 302:].float(), 300.0))
    assert torch.equal(_run(weights, future, s).s_out, base.s_out)


@pytest.mark.parametrize("kind,conversations,tokens,context", [("sliding", 2, 80, 0), ("sliding", 2, 8, 100), ("full", 2, 8, 100)])
def test_attention_matches_sdpa(weights: LayerWeights, kind: str, conversations: int, tokens: int, context: int) -> None:
    st = make_state(CFG, kind, conversations, tokens, context, seed=4)
    r = _run(weights, st, make_inputs(CFG, st, seed=0), bf16_acts=False)
    G = CFG.heads_q // CFG.heads_kv
    g = r.qkvg[:, -CFG.q_width:].reshape(-1, CFG.heads_q, 64).double()
    for c in range(conversations):
        rows = slice(c * tokens, (c + 1) * tokens)
        kpos = torch.arange(0, context + tokens)
        qpos = torch.arange(context, context + tokens)
        mask = kpos[None, :] <= qpos[:, None]
        if kind == "sliding":
            mask &= kpos[None, :] > qpos[:, None] - W
        k = from_e4m3(r.k_cache[c, kpos % st.slots]).double().repeat_interleave(G, dim=1).transpose(0, 1)
        v = from_e4m3(r.v_cache[c, kpos % st.slots]).double().repeat_interleave(G, dim=1).transpose(0, 1)
        q = r.q[rows].double().transpose(0, 1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(0, 1)
        want = rms(o) * torch.sigmoid(g[rows])
        assert torch.allclose(r.o[rows].double(), want.reshape(tokens, -1), atol=1e-5)


def test_rope_formula_and_properties() -> None:
    base, D = CFG.rope_base, 64
    e = torch.zeros(D, dtype=torch.float64)
    e[2] = 1.0  # pair i = 1 rotates by p * base^(-2/64)
    p = torch.tensor(81_919.0, dtype=torch.float64)
    ang = 81_919.0 * base ** (-2 / 64)
    r = rope(e, p, base)
    assert r[2].item() == pytest.approx(math.cos(ang), abs=1e-12) and r[3].item() == pytest.approx(math.sin(ang), abs=1e-12)
    assert torch.equal(rope(e, torch.tensor(0.0), base), e)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(D, generator=g, dtype=torch.float64), torch.randn(D, generator=g, dtype=torch.float64)
    assert rope(q, p, base).norm().item() == pytest.approx(q.norm().item(), rel=1e-12)
    for shift in (1.0, 777.0):  # scores depend on relative position only
        a = rope(q, torch.tensor(500.0), base) @ rope(k, torch.tensor(480.0), base)
        b = rope(q, torch.tensor(500.0 + shift), base) @ rope(k, torch.tensor(480.0 + shift), base)
        assert a.item() == pytest.approx(b.item(), abs=1e-9)


def test_rope_only_in_sliding_layers(weights: LayerWeights) -> None:
    full = make_state(CFG, "full", 1, 3, 0, seed=5)
    sliding = make_state(CFG, "sliding", 1, 3, 0, seed=5)
    s = make_inputs(CFG, full, seed=0)
    qf, qs = _run(weights, full, s).q, _run(weights, sliding, s).q
    assert torch.equal(qf[0], qs[0])  # position 0: no rotation
    assert not torch.allclose(qf[1:], qs[1:], atol=1e-2)
    assert torch.allclose(qf.norm(dim=-1), qs.norm(dim=-1), rtol=2e-2)


def test_routing(weights: LayerWeights) -> None:
    st = make_state(CFG, "sliding", 4, 8, 10, seed=6)
    r = _run(weights, st, make_inputs(CFG, st, seed=0))
    order = torch.argsort(r.scores, dim=1, descending=True, stable=True)
    assert torch.equal(r.topk_idx, order[:, :8])
    chosen = r.scores.gather(1, r.topk_idx)
    assert torch.allclose(r.topk_w, torch.softmax(chosen.double(), 1).float())
    assert torch.allclose(r.topk_w.sum(1), torch.ones(32))
    assert torch.equal(r.margin, chosen[:, 7] - r.scores.gather(1, order[:, 8:9])[:, 0])
    assert bool((r.margin >= 0).all())
    assert r.local_counts.tolist() == [(r.topk_idx == e).sum().item() for e in range(CFG.local_experts)]


def test_experts_combine(weights: LayerWeights) -> None:
    st = make_state(CFG, "full", 2, 8, 10, seed=7)
    u = skew_direction(CFG, 0)
    s = make_inputs(CFG, st, seed=0)
    s[8:] -= 3 * math.sqrt(CFG.d) * u  # push conversation 1 away from this shard's experts
    r = _run(weights, st, s, bf16_acts=False)
    hit = (r.topk_idx < CFG.local_experts).any(1)
    assert hit.any() and (~hit).any()
    assert bool((r.fsq[~hit] == 0).all())
    assert torch.equal(r.s_out[~hit], (weights.alpha2.double() * r.s_mid[~hit].double()).float())
    for t in torch.nonzero(hit)[:3, 0].tolist():  # one token at a time, straight from the formula
        x = r.x[t].double()
        want = torch.zeros(CFG.squeeze, dtype=torch.float64)
        for k, e in enumerate(r.topk_idx[t].tolist()):
            if e < CFG.local_experts:
                gate, up, down = (m.double() for m in weights.expert_matrices(e))
                want += r.topk_w[t, k].double() * rms((down @ (F.silu(gate @ x) * (up @ x))).float().double())
        assert torch.allclose(r.fsq[t].double(), want, atol=1e-5)
    f = r.fsq.double() @ weights.Wex.double().T
    assert torch.allclose(r.s_out.double(), weights.alpha2 * r.s_mid.double() + weights.beta2 * rms(f), atol=1e-5)


def test_kv_scales_apply_on_write_and_read(weights: LayerWeights) -> None:
    st = make_state(CFG, "sliding", 2, 8, 100, seed=8)
    s = make_inputs(CFG, st, seed=0)
    base = _run(weights, st, s, bf16_acts=False)
    scaled_w = make_layer_weights(CFG, 1, seed=0, k_scale=0.5, v_scale=0.25)
    scaled = st.clone()  # the same keys and values, stored against the new scales
    scaled.k_cache = to_e4m3(from_e4m3(st.k_cache) * 2.0)
    scaled.v_cache = to_e4m3(from_e4m3(st.v_cache) * 4.0)
    r = _run(scaled_w, scaled, s, bf16_acts=False)
    # equal but for e4m3 subnormals, which gain precision when scaled up
    assert torch.allclose(r.s_out, base.s_out, atol=2e-4)
    assert not torch.equal(_bytes(r.k_cache), _bytes(base.k_cache))
    assert not torch.allclose(_run(scaled_w, st, s, bf16_acts=False).s_out, base.s_out, atol=0.1)


def test_bf16_activations(weights: LayerWeights) -> None:
    st = make_state(CFG, "full", 2, 8, 50, seed=9)
    s = make_inputs(CFG, st, seed=0)
    r16, r32 = _run(weights, st, s), _run(weights, st, s, bf16_acts=False)
    for name in ("h", "qkvg", "q", "o", "x", "fsq"):
        t = getattr(r16, name)
        assert torch.equal(t, bf16_round(t)), name
    assert not torch.equal(r32.h, bf16_round(r32.h))
    # the squeeze reads bf16(h2), not h2
    assert torch.equal(r16.x, bf16_round(bf16_round(r16.h2).double() @ weights.Wsq.double().T))
    same = (r16.topk_idx == r32.topk_idx).all(1)
    rel = (r16.s_out[same] - r32.s_out[same]).norm() / r32.s_out[same].norm()
    assert 1e-5 < rel.item() < 1e-2


def test_bad_arguments(weights: LayerWeights) -> None:
    st = make_state(CFG, "full", 1, 2, 5, seed=0)
    s = make_inputs(CFG, st, seed=0)
    with pytest.raises(ValueError, match="sliding"):
        reference_layer(CFG, weights, st, s, "sliding")
    with pytest.raises(ValueError, match="s must be"):
        reference_layer(CFG, weights, st, s[:1], "full")
