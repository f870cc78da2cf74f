"""The peer: one Muse decode layer as a chain of PyTorch kernels.

This is what a kernel-per-op serving engine runs, and what gpuvm is measured
against: cuBLAS GEMMs, attention (SDPA) over the FP8 cache dequantised to
bf16, the router and top-8 in torch, and the local experts as grouped GEMMs
(torch._grouped_mm) over bf16 copies of the NVFP4 experts made once at set-up
(PyTorch has no NVFP4 GEMM on Hopper). Every shape is static and nothing syncs
with the host, so one layer captures into a CUDA graph (`PeerLayer.graph`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .muse.config import MuseConfig
from .muse.formats import dequantize_nvfp4, untile_nvfp4
from .muse.state import DecodeState
from .muse.weights import LayerWeights


def _rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


@dataclass
class PeerLayer:
    """Static buffers and weights of one peer layer; call run() or graph()."""

    cfg: MuseConfig
    w: LayerWeights
    state: DecodeState
    kind: str
    s: torch.Tensor  # [T, d] f32, updated in place
    gate_up: torch.Tensor  # [E, 2I, H] bf16 (dequantised once)
    down: torch.Tensor  # [E, H, I] bf16
    topk_idx: torch.Tensor | None = None

    @classmethod
    def create(cls, cfg: MuseConfig, w: LayerWeights, state: DecodeState, s: torch.Tensor, kind: str) -> "PeerLayer":
        if kind not in ("full", "sliding"):
            raise ValueError(f"kind must be 'full' or 'sliding', not {kind!r}")
        gu = dequantize_nvfp4(*untile_nvfp4(w.gu_codes, w.gu_scales, cfg.expert_inter), w.gu_ts)  # [E,2,I,H]
        e, _, i, h = gu.shape
        gate_up = gu.reshape(e, 2 * i, h).to(torch.bfloat16)
        down = dequantize_nvfp4(*untile_nvfp4(w.d_codes, w.d_scales, cfg.squeeze), w.d_ts).to(torch.bfloat16)
        return cls(cfg, w, state, kind, s, gate_up, down)

    # -- the chain ---------------------------------------------------------------
    def run(self) -> None:
        """One decode step of the layer: s updated, new k/v written to the caches."""
        cfg, w, st = self.cfg, self.w, self.state
        eps = cfg.eps
        t = self.s.shape[0]
        hq, hkv, hd = cfg.heads_q, cfg.heads_kv, cfg.head_dim
        convs = st.convs
        c, n = convs.shape[0], st.tokens_each
        pos = (convs[:, 2:3] + torch.arange(n, device=convs.device)[None, :]).reshape(t)  # [T]

        h = (_rms(self.s, eps) * (1 + w.w_attn)).to(torch.bfloat16)
        qkvg = h @ w.Wqkvg.t()
        q, k, v, g = torch.split(qkvg, [hq * hd, hkv * hd, hkv * hd, hq * hd], dim=1)
        q = _rms(q.float().view(t, hq, hd), eps) * (1 + w.w_qn)
        k = _rms(k.float().view(t, hkv, hd), eps) * (1 + w.w_kn)
        v = v.float().view(t, hkv, hd)
        if self.kind == "sliding":
            q, k = _rope(q, pos, cfg.rope_base), _rope(k, pos, cfg.rope_base)
        q = q.to(torch.bfloat16).float()
        slots = st.k_cache.shape[1]
        conv_of = torch.arange(c, device=pos.device).repeat_interleave(n)
        st.k_cache[conv_of, pos % slots] = (k / w.k_scale).clamp(-448, 448).to(torch.float8_e4m3fn)
        st.v_cache[conv_of, pos % slots] = (v / w.v_scale).clamp(-448, 448).to(torch.float8_e4m3fn)

        kc = (st.k_cache.to(torch.bfloat16) * w.k_scale).transpose(1, 2)  # [C,HKV,S,64]
        vc = (st.v_cache.to(torch.bfloat16) * w.v_scale).transpose(1, 2)
        last = convs[:, 2] + n - 1  # [C] newest position
        slot = torch.arange(slots, device=pos.device)
        slot_pos = last[:, None] - torch.remainder(last[:, None] - slot[None, :], slots)  # [C,S] position held
        qpos = pos.view(c, n)
        vis = (slot_pos[:, None, :] >= 0) & (slot_pos[:, None, :] <= qpos[:, :, None])
        if self.kind == "sliding":
            vis &= slot_pos[:, None, :] > qpos[:, :, None] - cfg.window
        qh = q.view(c, n, hq, hd).permute(0, 2, 1, 3).to(torch.bfloat16)  # [C,HQ,n,64]
        o = F.scaled_dot_product_attention(qh, kc, vc, attn_mask=vis[:, None], scale=1.0 / 8, enable_gqa=True)
        o = o.permute(0, 2, 1, 3).reshape(t, hq, hd).float()
        o = (_rms(o, eps) * torch.sigmoid(g.float().view(t, hq, hd))).reshape(t, hq * hd).to(torch.bfloat16)
        a = (o @ w.Wo.t()).float()
        s1 = w.alpha1 * self.s + w.beta1 * _rms(a, eps)

        h2 = _rms(s1, eps) * (1 + w.w_moe)
        scores = h2 @ w.Wr.t()
        top_s, top_i = torch.topk(scores, cfg.top_k, dim=1)
        top_w = torch.softmax(top_s, dim=1)
        x = h2.to(torch.bfloat16) @ w.Wsq.t()
        fsq = self._experts(x, top_i, top_w)
        f = (fsq @ w.Wex.t()).float()
        self.s.copy_(w.alpha2 * s1 + w.beta2 * _rms(f, eps))
        self.topk_idx = top_i

    def _experts(self, x: torch.Tensor, top_i: torch.Tensor, top_w: torch.Tensor) -> torch.Tensor:
        """Grouped GEMMs over the (token, expert) pairs routed to local experts."""
        e_loc = self.gate_up.shape[0]
        t, k = top_i.shape
        flat_e = top_i.reshape(-1)
        local = flat_e < e_loc  # the shard holds experts 0 .. e_loc-1
        key = torch.where(local, flat_e, torch.full_like(flat_e, e_loc))
        order = torch.argsort(key, stable=True)
        counts = torch.zeros(e_loc + 1, dtype=torch.int64, device=key.device).scatter_add_(0, key, torch.ones_like(key))[:e_loc]  # bincount syncs the host
        offs = torch.cumsum(counts, 0).to(torch.int32)
        tok = order // k
        xs = x[tok]  # [T*k, H], local pairs first, grouped by expert
        gu = torch._grouped_mm(xs, self.gate_up.transpose(1, 2), offs=offs)  # [T*k, 2I]
        i = self.gate_up.shape[1] // 2
        hmid = (F.silu(gu[:, :i].float()) * gu[:, i:].float()).to(torch.bfloat16)
        y = torch._grouped_mm(hmid, self.down.transpose(1, 2), offs=offs).float()  # [T*k, H]
        wts = top_w.reshape(-1)[order] * local[order]
        contrib = _rms(y, self.cfg.eps) * wts[:, None]
        contrib = torch.where(local[order][:, None], contrib, torch.zeros_like(contrib))  # rows past offs are undefined
        fsq = torch.zeros(t, y.shape[1], dtype=torch.float32, device=x.device)
        fsq.index_add_(0, tok, contrib)
        return fsq.to(torch.bfloat16)

    def graph(self) -> "torch.cuda.CUDAGraph":
        """Capture run() into a CUDA graph (after one warm-up run on a side stream)."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.run()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            self.run()
        return g


def _rope(x: torch.Tensor, pos: torch.Tensor, base: float) -> torch.Tensor:
    """RoPE on pairs (2i, 2i+1) of the last dim, angle = pos * base^(-2i/hd)."""
    hd = x.shape[-1]
    inv = base ** (-torch.arange(0, hd, 2, device=x.device, dtype=torch.float64) / hd)
    ang = (pos.to(torch.float64)[:, None] * inv[None, :]).float()  # [T, hd/2]
    cos, sin = torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x0 * cos - x1 * sin
    out[..., 1::2] = x0 * sin + x1 * cos
    return out
