"""The code warmer of a one-layer program (lowering.Tiles.code_warm).

The VM kernel is ~720 KB of code, and `gpuvm sweep` flushes the L2 before every
timed launch, so each op's first instance fetches its code from HBM (~80 ns a
KB against 1-4 from L2, session 29): at one token attention, the merge, the
residuals and the expert lists each start several µs late. A layer program
with the warmer also holds a second, small layer (SMALL's widths, one
conversation, the same kind and tokens per conversation, so the same op paths)
under its own prefix and counters. It has no tie to the real layer: its
instructions are claimed beside the real ones, each small phase runs in a few
µs, and the small chain reaches each op well before the real one, whose code
is then in L2. Its tensors are a few MB, its result is thrown away.

H200, 1ca3f88 (tools/code_warm_probe.py): the same layer timed after a flush
alone against after a flush and a separate launch of this small layer, µs:
full-c1-t1 195.4 / 174.3, sliding-c1-t1 170.3 / 145.2, full-c1-t8 270.4 / 243.4,
sliding-c16-t1 467 / 429, full-c16-t8 1025 / 1021: what a warmer could win.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from .config import SMALL, MuseConfig
from .state import DecodeState, cache_slots, make_inputs, make_state
from .weights import LayerWeights, make_layer_weights

PREFIX = "W."
CFG: MuseConfig = SMALL
CONTEXT = 64  # cached tokens of the small conversation: one attention chunk a kv head
SEED = 7


@dataclass(frozen=True)
class WarmShape:
    """The small layer beside a layer of this kind and tokens per conversation."""

    kind: str
    tokens_each: int

    @property
    def slots(self) -> int:
        return cache_slots(CFG, self.kind, self.tokens_each, CONTEXT)


@dataclass(frozen=True)
class WarmInputs:
    weights: LayerWeights
    state: DecodeState
    s: torch.Tensor


@lru_cache(maxsize=8)
def warm_inputs(kind: str, tokens_each: int, device: str) -> WarmInputs:
    """Weights, state and input of the small layer (made once per shape and
    device: a few MB; the state is the caches the small layer writes)."""
    state = make_state(CFG, kind, 1, tokens_each, CONTEXT, SEED, device=device)
    return WarmInputs(make_layer_weights(CFG, 1 if kind == "full" else 0, SEED, device=device), state, make_inputs(CFG, state, SEED))
