"""Synthetic, deterministic weights of one Muse layer (MUSE.md "Synthetic weights").

Every tensor has its own random stream, keyed by (seed, layer, name), so one
tensor (the router, one expert) can be made without the rest. Values are drawn
on the requested device: the same seed gives the same weights on the same kind
of device. The one exception is the skew direction, always drawn on the CPU,
because inputs and router must agree on it wherever each was made.

Routing skew (MUSE.md "Routing skew"): every router row is made orthogonal to
a fixed unit direction u, then the local experts' rows get a component along
u. Inputs carry SKEW_INPUT * sqrt(d) * u (gpuvm.muse.state.make_inputs), so
the router itself, on the GPU, sends more tokens to the local experts.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, fields
from typing import NamedTuple

import torch

from .config import MuseConfig
from ..opspec import tiled_nvfp4_shapes
from .formats import dequantize_nvfp4, quantize_nvfp4_batched, tile_nvfp4, untile_nvfp4

#: how much of the skew direction inputs carry, relative to their unit-variance noise
SKEW_INPUT = 1.0
NORM_STD = 0.1          # norm weights w: rms(x) * (1 + w)
ALPHA_STD = 0.02        # residual gates alpha ~ 1 + N(0, ALPHA_STD)
BETA_RANGE = (0.1, 0.5)

E4M3 = torch.float8_e4m3fn


def layer_shapes(cfg: MuseConfig) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """(shape, dtype) of every tensor field of LayerWeights, in field order.
    Expert codes and scales are tiled (gpuvm.muse.formats): gate|up [E, 2, I/16, ...], down [E, H/16, ...]."""
    d, H, I, E = cfg.d, cfg.squeeze, cfg.expert_inter, cfg.local_experts
    hd = cfg.head_dim
    gu_codes, gu_scales = tiled_nvfp4_shapes((E, 2), I, H)
    d_codes, d_scales = tiled_nvfp4_shapes((E,), H, I)
    return {
        "w_attn": ((d,), torch.float32),
        "Wqkvg": ((cfg.qkvg_width, d), torch.bfloat16),
        "w_qn": ((hd,), torch.float32),
        "w_kn": ((hd,), torch.float32),
        "Wo": ((d, cfg.q_width), torch.bfloat16),
        "alpha1": ((d,), torch.float32),
        "beta1": ((d,), torch.float32),
        "w_moe": ((d,), torch.float32),
        "Wr": ((cfg.n_experts, d), torch.float32),
        "Wsq": ((H, d), torch.bfloat16),
        "gu_codes": (gu_codes, torch.uint8),
        "gu_scales": (gu_scales, E4M3),
        "gu_ts": ((E, 2), torch.float32),
        "d_codes": (d_codes, torch.uint8),
        "d_scales": (d_scales, E4M3),
        "d_ts": ((E,), torch.float32),
        "Wex": ((d, H), torch.bfloat16),
        "alpha2": ((d,), torch.float32),
        "beta2": ((d,), torch.float32),
    }


EXPERT_FIELDS = ("gu_codes", "gu_scales", "gu_ts", "d_codes", "d_scales", "d_ts")


@dataclass(frozen=True)
class LayerBytes:
    """Bytes of one layer's weights, from shapes alone (nothing allocated)."""

    dense_matrices: int  # Wqkvg, Wo, Wr, Wsq, Wex
    dense_vectors: int   # norm weights and residual gates
    expert: int          # one local expert: gate, up, down with their scales
    local_experts: int

    @property
    def dense(self) -> int:
        return self.dense_matrices + self.dense_vectors

    @property
    def experts(self) -> int:
        return self.expert * self.local_experts

    @property
    def total(self) -> int:
        return self.dense + self.experts


def layer_nbytes(cfg: MuseConfig) -> LayerBytes:
    """Weight bytes of one layer of cfg."""
    mats = vecs = experts = 0
    for name, (shape, dt) in layer_shapes(cfg).items():
        n = math.prod(shape) * torch.empty((), dtype=dt).element_size()
        if name in EXPERT_FIELDS:
            experts += n
        elif len(shape) == 2:
            mats += n
        else:
            vecs += n
    return LayerBytes(mats, vecs, experts // cfg.local_experts, cfg.local_experts)


@dataclass
class LayerWeights:
    """One layer of the shard; matrices are [outputs, inputs], the experts'
    NVFP4 codes and scales tiled (gpuvm.muse.formats; expert() gives them back
    row by row)."""

    w_attn: torch.Tensor
    Wqkvg: torch.Tensor
    w_qn: torch.Tensor
    w_kn: torch.Tensor
    Wo: torch.Tensor
    alpha1: torch.Tensor
    beta1: torch.Tensor
    w_moe: torch.Tensor
    Wr: torch.Tensor
    Wsq: torch.Tensor
    gu_codes: torch.Tensor
    gu_scales: torch.Tensor
    gu_ts: torch.Tensor
    d_codes: torch.Tensor
    d_scales: torch.Tensor
    d_ts: torch.Tensor
    Wex: torch.Tensor
    alpha2: torch.Tensor
    beta2: torch.Tensor
    k_scale: float = 1.0
    v_scale: float = 1.0

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor field, by name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), torch.Tensor)}

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    def to(self, device: str | torch.device) -> "LayerWeights":
        return LayerWeights(**{k: v.to(device) for k, v in self.tensors().items()}, k_scale=self.k_scale, v_scale=self.v_scale)

    def expert(self, e: int) -> "ExpertWeights":
        """Local expert e in NVFP4, codes and scales row by row (untiled)."""
        gu_codes, gu_scales = untile_nvfp4(self.gu_codes[e], self.gu_scales[e])
        d_codes, d_scales = untile_nvfp4(self.d_codes[e], self.d_scales[e])
        return ExpertWeights(gu_codes, gu_scales, self.gu_ts[e], d_codes, d_scales, self.d_ts[e])

    def expert_matrices(self, e: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Local expert e dequantised to f32: gate [I,H], up [I,H], down [H,I]."""
        ex = self.expert(e)
        gu = dequantize_nvfp4(ex.gu_codes, ex.gu_scales, ex.gu_ts)
        down = dequantize_nvfp4(ex.d_codes, ex.d_scales, ex.d_ts)
        return gu[0], gu[1], down


class ExpertWeights(NamedTuple):
    """One local expert in NVFP4, row by row (LayerWeights.expert(e) untiles its fields)."""

    gu_codes: torch.Tensor   # [2, I, H/2]
    gu_scales: torch.Tensor  # [2, I, H/16]
    gu_ts: torch.Tensor      # [2]
    d_codes: torch.Tensor    # [H, I/2]
    d_scales: torch.Tensor   # [H, I/16]
    d_ts: torch.Tensor       # []


def generator(seed: int, layer: int, name: str, device: str | torch.device) -> torch.Generator:
    """The random stream of one named tensor, keyed by (seed, layer, name)."""
    # a stable hash: Python's hash() of a str changes from process to process
    key = int.from_bytes(hashlib.blake2b(f"{seed}/{layer}/{name}".encode(), digest_size=8).digest(), "little")
    return torch.Generator(device=torch.device(device)).manual_seed(key & ((1 << 63) - 1))


def _randn(shape: tuple[int, ...], seed: int, layer: int, name: str, device: str | torch.device) -> torch.Tensor:
    return torch.randn(shape, generator=generator(seed, layer, name, device), device=device)


def skew_direction(cfg: MuseConfig, seed: int) -> torch.Tensor:
    """The unit vector u [d] (f32, CPU) that skewed inputs carry and local router rows follow."""
    u = _randn((cfg.d,), seed, -1, "skew_direction", "cpu")
    return u / u.norm()


def skew_ranks(cfg: MuseConfig, layer: int, seed: int) -> torch.Tensor:
    """Local experts from busiest to least busy under skewed inputs ([E] int64)."""
    return torch.randperm(cfg.local_experts, generator=generator(seed, layer, "skew_order", "cpu"))


def make_router(cfg: MuseConfig, layer: int, seed: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """Wr [n_experts, d] f32: N(0, 1/d) rows orthogonal to u, local rows skewed along u.

    With inputs carrying a * sqrt(d) * u (a = SKEW_INPUT), the score of the local
    expert of rank i is lifted by route_skew * route_skew_decay**i standard
    deviations of the other scores.
    """
    d = cfg.d
    u = skew_direction(cfg, seed).to(device)
    w = _randn((cfg.n_experts, d), seed, layer, "Wr", device) / math.sqrt(d)
    w -= torch.outer(w @ u, u)
    ranks = skew_ranks(cfg, layer, seed).to(device)
    lift = cfg.route_skew * cfg.route_skew_decay ** torch.arange(cfg.local_experts, device=device, dtype=torch.float32)
    w[ranks] += torch.outer(lift / SKEW_INPUT, u) / math.sqrt(d)
    return w.contiguous()


def make_dense_tensor(cfg: MuseConfig, name: str, layer: int, seed: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """One non-expert field of LayerWeights, exactly as make_layer_weights makes it."""
    shapes = layer_shapes(cfg)
    if name not in shapes or name in EXPERT_FIELDS:
        raise ValueError(f"no dense weight '{name}'; dense fields: {[n for n in shapes if n not in EXPERT_FIELDS]}")
    shape, dt = shapes[name]
    if name == "Wr":
        return make_router(cfg, layer, seed, device)
    if name.startswith("alpha"):
        x = 1.0 + ALPHA_STD * _randn(shape, seed, layer, name, device)
    elif name.startswith("beta"):
        lo, hi = BETA_RANGE
        x = lo + (hi - lo) * torch.rand(shape, generator=generator(seed, layer, name, device), device=device)
    elif len(shape) == 1:  # norm weights
        x = NORM_STD * _randn(shape, seed, layer, name, device)
    else:  # rows = outputs: N(0, 1/fan_in) keeps every output O(1)
        x = _randn(shape, seed, layer, name, device) / math.sqrt(shape[1])
    return x.to(dt).contiguous()


def make_expert(cfg: MuseConfig, layer: int, e: int, seed: int, device: str | torch.device = "cpu") -> ExpertWeights:
    """Local expert e of a layer: N(0, 1/fan_in) masters quantised to NVFP4."""
    if not 0 <= e < cfg.local_experts:
        raise ValueError(f"expert {e} outside the {cfg.local_experts} local experts")
    H, I = cfg.squeeze, cfg.expert_inter
    gu = _randn((2, I, H), seed, layer, f"expert{e}.gu", device) / math.sqrt(H)
    gu_codes, gu_scales, gu_ts = quantize_nvfp4_batched(gu)
    del gu
    down = _randn((H, I), seed, layer, f"expert{e}.down", device) / math.sqrt(I)
    d_codes, d_scales, d_ts = quantize_nvfp4_batched(down)
    return ExpertWeights(gu_codes, gu_scales, gu_ts, d_codes, d_scales, d_ts)


def make_layer_weights(
    cfg: MuseConfig,
    layer: int,
    seed: int,
    device: str | torch.device = "cpu",
    *,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> LayerWeights:
    """The weights of one layer, deterministic from (seed, layer) on a device type.

    Experts are made one at a time straight into their stacked tensors, so the
    peak extra memory is one expert's f32 masters (about 200 MB at full size).
    """
    if k_scale <= 0 or v_scale <= 0:
        raise ValueError(f"KV scales must be positive, got k_scale={k_scale}, v_scale={v_scale}")
    shapes = layer_shapes(cfg)
    out: dict[str, torch.Tensor] = {}
    for name, (shape, dt) in shapes.items():
        if name in EXPERT_FIELDS:
            out[name] = torch.empty(shape, dtype=dt, device=device)
        else:
            out[name] = make_dense_tensor(cfg, name, layer, seed, device)
    for e in range(cfg.local_experts):
        ex = make_expert(cfg, layer, e, seed, device)
        out["gu_codes"][e], out["gu_scales"][e] = tile_nvfp4(ex.gu_codes, ex.gu_scales)
        out["d_codes"][e], out["d_scales"][e] = tile_nvfp4(ex.d_codes, ex.d_scales)
        out["gu_ts"][e], out["d_ts"][e] = ex.gu_ts, ex.d_ts
    return LayerWeights(**out, k_scale=float(k_scale), v_scale=float(v_scale))


# ---- the whole model ------------------------------------------------------------
#: the "layer" key of the tensors outside the decoder layers (embedding, final norm, LM head)
MODEL_KEY = -2


def model_shapes(cfg: MuseConfig) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """(shape, dtype) of the tensors outside the layers. The embedding has the
    shard's vocab_shard rows: the shard's argmax yields shard-local ids, which
    index it directly."""
    return {
        "embed": ((cfg.vocab_shard, cfg.d), torch.bfloat16),
        "w_final": ((cfg.d,), torch.float32),
        "lm_head": ((cfg.vocab_shard, cfg.d), torch.bfloat16),
    }


def _n_layers(cfg: MuseConfig, layers: int | None) -> int:
    n = cfg.n_layers if layers is None else layers
    if not isinstance(n, int) or not 1 <= n <= cfg.n_layers:
        raise ValueError(f"layers must be an int in [1, {cfg.n_layers}] (the first layers of '{cfg.name}'), not {layers!r}")
    return n


def model_nbytes(cfg: MuseConfig, layers: int | None = None) -> int:
    """Weight bytes of the shard's model: its layers plus embedding, final norm and LM head."""
    outside = sum(math.prod(shape) * torch.empty((), dtype=dt).element_size() for shape, dt in model_shapes(cfg).values())
    return _n_layers(cfg, layers) * layer_nbytes(cfg).total + outside


@dataclass
class ModelWeights:
    """The shard's model: layers 0..n-1 of the model, in order, and the tensors around them."""

    layers: list[LayerWeights]
    embed: torch.Tensor    # [vocab_shard, d] bf16
    w_final: torch.Tensor  # [d] f32: rms(s) * (1 + w_final) before the LM head
    lm_head: torch.Tensor  # [vocab_shard, d] bf16, rows = logits

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def nbytes(self) -> int:
        return sum(w.nbytes() for w in self.layers) + sum(t.numel() * t.element_size() for t in (self.embed, self.w_final, self.lm_head))


def make_model_weights(cfg: MuseConfig, seed: int, device: str | torch.device = "cpu", layers: int | None = None) -> ModelWeights:
    """The first `layers` layers (default all) of the model and the tensors around
    them, deterministic from seed on a device type; layer i is make_layer_weights(cfg, i, seed).

    Embedding rows are N(0, 1) plus SKEW_INPUT * sqrt(d) * u, the same
    distribution as gpuvm.muse.state.make_inputs, so the router skews the
    tokens of a whole step as it does a single layer's. The LM head is
    N(0, 1/d): logits of a normed input are O(1).
    """
    n = _n_layers(cfg, layers)
    shapes = model_shapes(cfg)
    u = skew_direction(cfg, seed).to(device)
    embed = _randn(shapes["embed"][0], seed, MODEL_KEY, "embed", device) + SKEW_INPUT * math.sqrt(cfg.d) * u
    w_final = NORM_STD * _randn(shapes["w_final"][0], seed, MODEL_KEY, "w_final", device)
    lm_head = _randn(shapes["lm_head"][0], seed, MODEL_KEY, "lm_head", device) / math.sqrt(cfg.d)
    return ModelWeights(
        [make_layer_weights(cfg, i, seed, device) for i in range(n)],
        embed.to(torch.bfloat16).contiguous(),
        w_final.contiguous(),
        lm_head.to(torch.bfloat16).contiguous(),
    )
