"""Benchmark cases of one shard layer (MUSE.md "Benchmark cases") and their floors.

A case is a layer kind and a step shape: conversations x new tokens each, on a
context of cached tokens per conversation. floor_bytes counts what a case must
move at least (MUSE.md "Bytes a case must move"); floor_flops the matrix work
that bounds prefill.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .config import SHARD, MuseConfig
from .state import KINDS
from .weights import layer_nbytes

DECODE_CONTEXT = 81_920
DECODE_SHAPES = ((1, 1), (1, 8), (16, 1), (16, 8), (32, 1), (32, 8))  # (conversations, tokens each)
PREFILL_SHAPES = ((1, 753, DECODE_CONTEXT), (4, 753, DECODE_CONTEXT), (1, 16_384, 0))  # (+ context)


@dataclass(frozen=True)
class Case:
    name: str
    kind: str           # 'full' | 'sliding'
    conversations: int
    tokens_each: int
    context: int        # cached tokens per conversation before the step
    prefill: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"case {self.name}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.conversations < 1 or self.tokens_each < 1 or self.context < 0:
            raise ValueError(f"case {self.name}: bad shape {self.conversations}x{self.tokens_each} on context {self.context}")

    @property
    def tokens(self) -> int:
        """Tokens per step, T = conversations * tokens_each."""
        return self.conversations * self.tokens_each


DECODE_CASES: tuple[Case, ...] = tuple(
    Case(f"{kind}-c{c}-t{n}", kind, c, n, DECODE_CONTEXT) for kind in KINDS for c, n in DECODE_SHAPES
)
PREFILL_CASES: tuple[Case, ...] = tuple(
    Case(f"prefill-{kind}-c{c}-t{n}", kind, c, n, ctx, prefill=True) for kind in KINDS for c, n, ctx in PREFILL_SHAPES
)
CASES: dict[str, Case] = {c.name: c for c in DECODE_CASES + PREFILL_CASES}


def get_case(name: str) -> Case:
    """The case called name; ValueError naming the valid ones otherwise."""
    try:
        return CASES[name]
    except KeyError:
        raise ValueError(f"unknown case {name!r}; valid cases: {', '.join(CASES)}") from None


def small_case(case: Case, cfg: MuseConfig) -> Case:
    """case mapped to a config with a smaller window (e.g. SMALL), for CPU runs.

    Prefill token counts and every context shrink by cfg.window / SHARD.window.
    Decode cases keep their shape; their contexts cycle, in DECODE_SHAPES order,
    through three regimes relative to the window W: below it (W/2 + 1), at its
    edge (the step's tokens straddle W), and far above it (the scaled context,
    plus an offset so the sliding ring does not wrap at slot 0).
    """
    if cfg.window >= SHARD.window:
        raise ValueError(f"small_case maps to a window below {SHARD.window}, {cfg.name} has {cfg.window}")
    W, n = cfg.window, case.tokens_each
    scaled = case.context * W // SHARD.window
    if case.prefill:
        n = max(1, round(case.tokens_each * W / SHARD.window))
        context = scaled
    else:
        regime = DECODE_SHAPES.index((case.conversations, case.tokens_each)) % 3
        context = (W // 2 + 1, W - n // 2, scaled + W // 2 + 5)[regime]
    return replace(case, name=f"{case.name}@{cfg.name}", tokens_each=n, context=context)


def kv_token_bytes(cfg: MuseConfig) -> int:
    """Cache bytes of one token in one layer: (k, v) x kv heads x head dim, e4m3."""
    return 2 * cfg.heads_kv * cfg.head_dim


def visible_cached(cfg: MuseConfig, case: Case) -> int:
    """Cached tokens per conversation that some new token sees: all of them in
    a full layer; in a sliding one, the first new token's window less itself."""
    return min(case.context, cfg.window - 1) if case.kind == "sliding" else case.context


def floor_bytes(cfg: MuseConfig, case: Case, experts_hit: int) -> dict[str, int]:
    """Bytes one step of the case must move at least.

    dense: every non-expert weight byte once; experts: each local expert with
    at least one token once; kv_read: the cached keys and values attention can
    see; kv_write: the new tokens' k and v; activations: the residual stream
    read in and written out (f32), intermediates assumed to stay on chip.
    """
    if not 0 <= experts_hit <= cfg.local_experts:
        raise ValueError(f"experts_hit must be in [0, {cfg.local_experts}], got {experts_hit}")
    wb = layer_nbytes(cfg)
    kv = kv_token_bytes(cfg)
    out = {
        "dense": wb.dense,
        "experts": experts_hit * wb.expert,
        "kv_read": case.conversations * visible_cached(cfg, case) * kv,
        "kv_write": case.tokens * kv,
        "activations": 2 * case.tokens * cfg.d * 4,
    }
    out["total"] = sum(out.values())
    return out


def floor_flops(cfg: MuseConfig, case: Case, local_picks: int) -> int:
    """Multiply-add work (2 flops each) of one step: dense matrices, the
    local_picks (token, local expert) pairs, and attention over the keys each
    new token sees (cached and new, causal, windowed in sliding layers)."""
    if local_picks < 0 or local_picks > case.tokens * cfg.top_k:
        raise ValueError(f"local_picks must be in [0, {case.tokens * cfg.top_k}], got {local_picks}")
    d, H, I = cfg.d, cfg.squeeze, cfg.expert_inter
    dense = 2 * case.tokens * d * (cfg.qkvg_width + cfg.q_width + cfg.n_experts + 2 * H)
    experts = 2 * local_picks * 3 * H * I
    seen = 0
    for j in range(case.tokens_each):
        keys = case.context + j + 1
        seen += min(keys, cfg.window) if case.kind == "sliding" else keys
    attention = 2 * 2 * cfg.head_dim * cfg.heads_q * case.conversations * seen  # q.k and p.v
    return dense + experts + attention


def floor_seconds(nbytes: int | float, bandwidth: float) -> float:
    """Time to stream nbytes at bandwidth (bytes/s) measured in the same run."""
    if bandwidth <= 0:
        raise ValueError(f"bandwidth must be positive, got {bandwidth}")
    return nbytes / bandwidth
