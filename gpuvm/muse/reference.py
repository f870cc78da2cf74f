"""The formula-level reference of one Muse layer (MUSE.md "One layer").

Written from the equations alone, with no use of the instruction set: plain
torch in float64 on the quantized weights (NVFP4 experts dequantized, bf16
matrices at their bf16 values), attention one conversation at a time, experts
one at a time. Tensors are rounded where the model stores them:

- always: the new keys and values to FP8 e4m3 (value / scale, saturating) in
  the cache, which attention then reads, the new tokens' own keys included;
  f32 for the residual stream, a, h2, the router scores and the expert
  outputs y;
- with bf16_acts (the default), bf16 for the activations MUSE.md keeps in
  bf16: h, qkvg, q, o, the router input to Wsq (bf16(h2)), x, the expert
  hidden silu(G x) * (U x), and fsq; without it these stay f32 (the pure FP32
  reference of MEASURE.md).

It works on any device; the state passed in is not modified (the updated
caches come back in RefOut).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .config import MuseConfig
from .formats import bf16_round, from_e4m3, to_e4m3
from .state import DecodeState
from .weights import LayerWeights, ModelWeights

if TYPE_CHECKING:  # step imports the lowering, which the reference must not depend on
    from .step import StepState

F64 = torch.float64
ATTN_SCALE = 0.125  # 1 / sqrt(head_dim 64)
SCORE_BUDGET = 1 << 24  # attention scores held at once, per conversation


@dataclass
class RefOut:
    """The layer's result and the intermediates worth comparing, all f32 (indices int64)."""

    s_out: torch.Tensor      # [T, d] residual stream after the layer
    topk_idx: torch.Tensor   # [T, 8] experts, best first (ties: lower index first)
    topk_w: torch.Tensor     # [T, 8] softmax of the 8 chosen scores
    margin: torch.Tensor     # [T] 8th best score minus 9th: near 0 means a near-tie
    local_counts: torch.Tensor  # [E] tokens routed to each local expert
    h: torch.Tensor          # [T, d] attention input rms(s) * (1 + w_attn)
    qkvg: torch.Tensor       # [T, qkvg_width]
    q: torch.Tensor          # [T, HQ, 64] after QK-norm (and RoPE in sliding layers)
    o: torch.Tensor          # [T, HQ*64] after the head norm and the output gate
    a: torch.Tensor          # [T, d] o @ Wo
    s_mid: torch.Tensor      # [T, d] residual stream after attention
    h2: torch.Tensor         # [T, d] router input
    scores: torch.Tensor     # [T, n_experts]
    x: torch.Tensor          # [T, H] squeezed
    fsq: torch.Tensor        # [T, H] combined local experts
    f: torch.Tensor          # [T, d] expanded
    k_cache: torch.Tensor    # the state's caches with the step's keys and values written
    v_cache: torch.Tensor


def rms(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dim."""
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rope(x: torch.Tensor, pos: torch.Tensor, base: float) -> torch.Tensor:
    """Rotate pairs (2i, 2i+1) of x [..., D] by pos * base^(-2i/D), in float64.

    pos broadcasts against x's leading dims. The angles are computed in float64:
    at positions near 80K a float32 angle is off by up to ~0.005 rad.
    """
    dim = x.shape[-1]
    inv = base ** (-torch.arange(0, dim, 2, dtype=F64, device=x.device) / dim)
    ang = pos.to(F64).unsqueeze(-1) * inv
    cos, sin = torch.cos(ang), torch.sin(ang)
    x = x.to(F64)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


def _f32(x: torch.Tensor) -> torch.Tensor:
    return x.float().to(F64)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qpos: torch.Tensor, kpos: torch.Tensor, window: int) -> torch.Tensor:
    """Softmax attention of one conversation: q [n, HQ, 64] at positions qpos
    over k, v [L, HKV, 64] at kpos; causal, and windowed when window > 0."""
    n, hq, dh = q.shape
    hkv = k.shape[1]
    out = torch.empty((n, hq, dh), dtype=F64, device=q.device)
    block = max(1, SCORE_BUDGET // (hq * max(1, k.shape[0])))
    for j0 in range(0, n, block):  # blocks of queries bound the score memory
        qb, pb = q[j0:j0 + block], qpos[j0:j0 + block]
        seen = kpos[None, :] <= pb[:, None]
        if window:
            seen &= kpos[None, :] > pb[:, None] - window
        sc = torch.einsum("nhgd,lhd->nhgl", qb.reshape(len(qb), hkv, hq // hkv, dh), k) * ATTN_SCALE
        sc = sc.masked_fill(~seen[:, None, None, :], float("-inf"))
        out[j0:j0 + block] = torch.einsum("nhgl,lhd->nhgd", torch.softmax(sc, dim=-1), v).reshape(len(qb), hq, dh)
    return out


def reference_layer(
    cfg: MuseConfig,
    w: LayerWeights,
    state: DecodeState,
    s: torch.Tensor,
    kind: str,
    *,
    bf16_acts: bool = True,
) -> RefOut:
    """One layer for the step described by state, on the residual stream s [T, d]."""
    if kind != state.kind:
        raise ValueError(f"reference_layer for a {kind} layer got a {state.kind} state")
    T, d, HQ, HKV, dh = state.tokens, cfg.d, cfg.heads_q, cfg.heads_kv, cfg.head_dim
    if tuple(s.shape) != (T, d):
        raise ValueError(f"s must be [{T}, {d}] for {state.conversations} conversations x {state.tokens_each} tokens, got {tuple(s.shape)}")
    act = (lambda t: bf16_round(t).to(F64)) if bf16_acts else _f32
    dev = s.device

    def wt(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=dev, dtype=F64)

    # attention half
    s0 = s.to(F64)
    h = act(rms(s0, cfg.eps) * (1 + wt(w.w_attn)))
    qkvg = act(h @ wt(w.Wqkvg).T)
    q, k, v, g = torch.split(qkvg, [cfg.q_width, cfg.kv_width, cfg.kv_width, cfg.q_width], dim=1)
    q = rms(q.reshape(T, HQ, dh), cfg.eps) * (1 + wt(w.w_qn))
    k = rms(k.reshape(T, HKV, dh), cfg.eps) * (1 + wt(w.w_kn))
    if kind == "sliding":
        pos = state.positions().to(dev)[:, None]
        q, k = rope(q, pos, cfg.rope_base), rope(k, pos, cfg.rope_base)
    q = act(q)
    k_new = to_e4m3(k / w.k_scale)
    v_new = to_e4m3(v.reshape(T, HKV, dh) / w.v_scale)

    kc, vc = state.k_cache.to(dev).clone(), state.v_cache.to(dev).clone()
    S = state.slots
    o = torch.empty((T, HQ, dh), dtype=F64, device=dev)
    for c, (tok0, n, pos0, _) in enumerate(state.convs.tolist()):
        qpos = torch.arange(pos0, pos0 + n, device=dev)
        kc[c, qpos % S] = k_new[tok0:tok0 + n]
        vc[c, qpos % S] = v_new[tok0:tok0 + n]
        lo = max(0, pos0 - state.window + 1) if state.window else 0
        kpos = torch.arange(lo, pos0 + n, device=dev)
        keys = from_e4m3(kc[c, kpos % S]).to(F64) * w.k_scale
        vals = from_e4m3(vc[c, kpos % S]).to(F64) * w.v_scale
        o[tok0:tok0 + n] = _attend(q[tok0:tok0 + n], keys, vals, qpos, kpos, state.window)
    o = act(rms(o, cfg.eps) * torch.sigmoid(g.reshape(T, HQ, dh))).reshape(T, cfg.q_width)
    a = _f32(o @ wt(w.Wo).T)
    s_mid = _f32(wt(w.alpha1) * s0 + wt(w.beta1) * rms(a, cfg.eps))

    # router
    h2 = _f32(rms(s_mid, cfg.eps) * (1 + wt(w.w_moe)))
    scores = _f32(h2 @ wt(w.Wr).T)
    ranked = torch.sort(scores, dim=1, descending=True, stable=True)  # stable: ties to the lower index
    K = cfg.top_k
    topk_idx = ranked.indices[:, :K]
    topk_w = _f32(torch.softmax(ranked.values[:, :K], dim=1))
    if cfg.n_experts > K:
        margin = ranked.values[:, K - 1] - ranked.values[:, K]
    else:
        margin = torch.full((T,), float("inf"), dtype=F64, device=dev)

    # experts of this shard (global experts 0 .. local_experts-1)
    x = act(act(h2) @ wt(w.Wsq).T)
    fsq = torch.zeros((T, cfg.squeeze), dtype=F64, device=dev)
    counts = torch.zeros(cfg.local_experts, dtype=torch.int64)
    for e in range(cfg.local_experts):
        tok, slot = (topk_idx == e).nonzero(as_tuple=True)
        counts[e] = len(tok)
        if len(tok) == 0:
            continue
        gate, up, down = (wt(m) for m in w.expert_matrices(e))
        xe = x[tok]
        hid = act(torch.nn.functional.silu(xe @ gate.T) * (xe @ up.T))
        y = _f32(hid @ down.T)
        fsq.index_add_(0, tok, topk_w[tok, slot, None] * rms(y, cfg.eps))
    fsq = act(fsq)
    f = _f32(fsq @ wt(w.Wex).T)
    s_out = wt(w.alpha2) * s_mid + wt(w.beta2) * rms(f, cfg.eps)

    return RefOut(
        s_out=s_out.float(), topk_idx=topk_idx, topk_w=topk_w.float(), margin=margin.float(), local_counts=counts,
        h=h.float(), qkvg=qkvg.float(), q=q.float(), o=o.float(), a=a.float(), s_mid=s_mid.float(), h2=h2.float(),
        scores=scores.float(), x=x.float(), fsq=fsq.float(), f=f.float(), k_cache=kc, v_cache=vc,
    )


# ---- the whole step (MUSE.md "The whole model") -------------------------------------
@dataclass
class StepRef:
    """A whole step's result: the chosen tokens and what leads to them."""

    tokens: torch.Tensor    # [T] int64: argmax of each row of logits (ties: lower index first)
    logits: torch.Tensor    # [T, vocab_shard] f32
    margin: torch.Tensor    # [T] best logit minus the second best: near 0 means a near-tie
    s_layers: torch.Tensor  # [n_layers, T, d] the residual stream after each layer
    h_final: torch.Tensor   # [T, d] rms(s) * (1 + w_final), the LM head's input
    layers: list[RefOut]    # each layer's reference (routing margins, updated caches)


def reference_step(cfg: MuseConfig, model_weights: ModelWeights, step_state: "StepState", tokens: torch.Tensor, *, bf16_acts: bool = True) -> StepRef:
    """One decode step of the model's first n layers (n = model_weights.n_layers):
    embedding of tokens [T], the layers in order (reference_layer), the final
    norm, the LM head and its argmax. step_state is not modified: the updated
    caches come back in StepRef.layers (StepState.write_caches takes them)."""
    n = model_weights.n_layers
    if step_state.n_layers != n:
        raise ValueError(f"{n} layers of weights but {step_state.n_layers} layer states")
    T, V = step_state.tokens, cfg.vocab_shard
    ids = torch.as_tensor(tokens).long().flatten()
    if ids.numel() != T:
        raise ValueError(f"need {T} token ids, got {ids.numel()}")
    if bool(((ids < 0) | (ids >= V)).any()):
        raise ValueError(f"token ids must be in [0, {V}), got {ids[(ids < 0) | (ids >= V)].tolist()[:8]}")
    dev = model_weights.embed.device
    act = (lambda t: bf16_round(t).to(F64)) if bf16_acts else _f32
    s = model_weights.embed[ids.to(dev)].float()
    outs: list[RefOut] = []
    for i in range(n):
        kind = "full" if cfg.is_full(i) else "sliding"
        outs.append(reference_layer(cfg, model_weights.layers[i], step_state.layers[i], s, kind, bf16_acts=bf16_acts))
        s = outs[-1].s_out
    h = act(rms(s.to(F64), cfg.eps) * (1 + model_weights.w_final.to(F64)))
    logits = _f32(h @ model_weights.lm_head.to(F64).T)
    ranked = torch.sort(logits, dim=1, descending=True, stable=True)  # stable: ties to the lower index
    second = ranked.values[:, 1] if V > 1 else torch.full((T,), float("inf"), dtype=F64, device=dev)
    return StepRef(
        tokens=ranked.indices[:, 0], logits=logits.float(), margin=(ranked.values[:, 0] - second).float(),
        s_layers=torch.stack([o.s_out for o in outs]), h_final=h.float(), layers=outs,
    )
