"""Decode state of one layer: the conversation table and the FP8 KV caches.

A cached token at position p of conversation c lives in slot p % S of
k_cache[c] / v_cache[c]. Full layers hold every position up to the last step
they were sized for; sliding layers keep a ring of at least window + n slots,
enough that the keys a step can see and the keys it writes never collide.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .config import MuseConfig
from .formats import to_e4m3
from .weights import SKEW_INPUT, generator, skew_direction

KINDS = ("full", "sliding")
SLOT_ALIGN = 64  # cache capacities are rounded up to this many slots


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


@dataclass
class DecodeState:
    """Where each conversation stands before a step, and its KV caches."""

    cfg: MuseConfig
    kind: str
    conversations: int
    tokens_each: int
    context: int             # cached tokens per conversation before the step
    convs: torch.Tensor      # [C, 4] int32: (tok0, tokens, pos0, 0)
    k_cache: torch.Tensor    # [C, S, HKV, 64] float8_e4m3fn
    v_cache: torch.Tensor

    @property
    def tokens(self) -> int:
        """Tokens of one step, T = C * n."""
        return self.conversations * self.tokens_each

    @property
    def slots(self) -> int:
        """Cache capacity S per conversation."""
        return self.k_cache.shape[1]

    @property
    def window(self) -> int:
        """Keys a query may see back, itself included (0: unbounded)."""
        return self.cfg.window if self.kind == "sliding" else 0

    def positions(self) -> torch.Tensor:
        """Position of every token of the step, [T] int64 in token order."""
        j = torch.arange(self.tokens_each)
        return (self.context + j).repeat(self.conversations)

    def advance(self) -> None:
        """Move to the next step: the step's tokens become context."""
        nxt = self.context + self.tokens_each
        if self.kind == "full" and nxt + self.tokens_each > self.slots:
            raise ValueError(f"full-layer cache of {self.slots} slots cannot hold positions up to {nxt + self.tokens_each - 1}: make_state(..., steps=) more")
        self.context = nxt
        self.convs[:, 2] = nxt

    def clone(self, device: str | torch.device | None = None) -> "DecodeState":
        """A copy, on `device` (default: this state's)."""
        def cp(t: torch.Tensor) -> torch.Tensor:
            return t.to(device if device is not None else t.device, copy=True)
        return DecodeState(self.cfg, self.kind, self.conversations, self.tokens_each, self.context,
                           cp(self.convs), cp(self.k_cache), cp(self.v_cache))

    def copy_(self, other: "DecodeState") -> None:
        """Take other's convs and caches in place (bound buffers see them), from any device."""
        if (other.kind, other.context) != (self.kind, self.context) or other.k_cache.shape != self.k_cache.shape or other.convs.shape != self.convs.shape:
            raise ValueError(f"cannot copy a {other.kind} state at context {other.context} with caches {tuple(other.k_cache.shape)} "
                             f"into a {self.kind} one at context {self.context} with caches {tuple(self.k_cache.shape)}")
        self.convs.copy_(other.convs)
        self.k_cache.copy_(other.k_cache)
        self.v_cache.copy_(other.v_cache)


def cache_slots(cfg: MuseConfig, kind: str, tokens_each: int, context: int, steps: int = 1) -> int:
    """Cache capacity S for `steps` steps of tokens_each new tokens after context."""
    if kind == "full":
        return _round_up(max(context + steps * tokens_each, 1), SLOT_ALIGN)
    if kind == "sliding":
        return _round_up(cfg.window + tokens_each, SLOT_ALIGN)
    raise ValueError(f"layer kind must be one of {KINDS}, got {kind!r}")


def make_state(
    cfg: MuseConfig,
    kind: str,
    conversations: int,
    tokens_each: int,
    context: int,
    seed: int,
    device: str | torch.device = "cpu",
    *,
    steps: int = 1,
) -> DecodeState:
    """A state before a step, its caches full of random N(0,1) keys and values in e4m3.

    Every slot is filled, the visible history and the slots attention must not
    read alike, so reading a wrong slot shows. steps: how many steps a full
    layer's cache must hold (sliding rings hold any number).
    """
    if kind not in KINDS:
        raise ValueError(f"layer kind must be one of {KINDS}, got {kind!r}")
    if conversations < 1 or tokens_each < 1 or context < 0 or steps < 1:
        raise ValueError(f"need conversations >= 1, tokens_each >= 1, context >= 0, steps >= 1; got {conversations}, {tokens_each}, {context}, {steps}")
    S = cache_slots(cfg, kind, tokens_each, context, steps)
    shape = (conversations, S, cfg.heads_kv, cfg.head_dim)
    caches = []
    for name in ("k", "v"):
        cache = torch.empty(shape, dtype=torch.float8_e4m3fn, device=device)
        g = generator(seed, 0, f"state.{kind}.{name}", device)
        for c in range(conversations):  # one conversation at a time bounds the f32 temporary
            cache[c] = to_e4m3(torch.randn(shape[1:], generator=g, device=device))
        caches.append(cache)
    c = torch.arange(conversations, dtype=torch.int32)
    convs = torch.stack([c * tokens_each, torch.full_like(c, tokens_each), torch.full_like(c, context), torch.zeros_like(c)], dim=1)
    return DecodeState(cfg, kind, conversations, tokens_each, context, convs.to(device).contiguous(), *caches)


def make_inputs(cfg: MuseConfig, state: DecodeState, seed: int, *, weights_seed: int | None = None) -> torch.Tensor:
    """The residual stream entering the layer, s [T, d] f32: N(0,1) plus SKEW_INPUT * sqrt(d) * u.

    u is the skew direction of the weights made with weights_seed (default:
    seed), so that the router sends this shard its skewed share of tokens.
    """
    device = state.k_cache.device
    u = skew_direction(cfg, seed if weights_seed is None else weights_seed).to(device)
    z = torch.randn((state.tokens, cfg.d), generator=generator(seed, state.context, "inputs", device), device=device)
    return (z + SKEW_INPUT * math.sqrt(cfg.d) * u).contiguous()
