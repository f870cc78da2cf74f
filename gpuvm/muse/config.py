"""Muse Spark Open shapes: the real TP8 shard and a small model of the same structure."""
from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class MuseConfig:
    """Dimensions of one GPU's shard of Muse Spark Open (MUSE.md)."""

    name: str
    d: int = 8192                # residual width
    n_layers: int = 62
    heads_q: int = 16            # query heads of the shard
    heads_kv: int = 2            # kv heads of the shard
    head_dim: int = 64
    squeeze: int = 4096          # Wsq 8192 -> 4096; experts work at this width
    expert_inter: int = 4096     # expert intermediate width (gate/up out, down in)
    n_experts: int = 256         # experts in all (router width)
    local_experts: int = 32      # experts on this shard: 0 .. local_experts-1
    top_k: int = 8
    window: int = 2048           # sliding-window length
    rope_base: float = 500_000.0
    vocab_shard: int = 25_256    # LM-head rows of the shard
    eps: float = 1e-6
    # routing skew (MUSE.md "Routing skew"): the router row of the local expert
    # of rank i (a seeded order) gains route_skew * route_skew_decay**i along
    # the skew direction, in units of the spread of the router scores; 0: none
    route_skew: float = 2.0
    route_skew_decay: float = 0.72

    @property
    def q_width(self) -> int:
        return self.heads_q * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.heads_kv * self.head_dim

    @property
    def qkvg_width(self) -> int:
        """q | k | v | g columns of Wqkvg."""
        return 2 * self.q_width + 2 * self.kv_width

    @staticmethod
    def is_full(layer: int) -> bool:
        """Layer i is full attention when i % 4 == 1, else sliding."""
        return layer % 4 == 1

    def with_(self, **kw: object) -> "MuseConfig":
        return replace(self, **kw)


#: the real shard (MUSE.md)
SHARD = MuseConfig("shard")

#: the same structure at small widths, for CPU tests and the CPU sweep
SMALL = MuseConfig(
    "small",
    d=256,
    n_layers=4,
    squeeze=128,
    expert_inter=128,
    n_experts=16,
    local_experts=4,
    window=64,
    vocab_shard=512,
)

CONFIGS = {"shard": SHARD, "small": SMALL}
