"""Device memory of a whole-step run, before anything is allocated.

weights (gpuvm.muse.weights.model_nbytes) + KV caches (state.cache_slots per
layer kind) + scratch as gpuvm.muse.step.bind_step allocates it + the program
itself (instruction records and tensor table). Scratch and op counts come from
emitting one layer of each kind into a throwaway Program, so they follow the
lowering exactly without building the whole step (which takes seconds at full
size).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..isa import INSTR_BYTES, TENSOR_BYTES, DType, Op
from ..program import Program
from .config import MuseConfig
from .lowering import Tiles, _pow2_rows, emit_layer
from .state import cache_slots
from .step import ARGMAX_ROWS, layer_kind
from .weights import _n_layers, model_nbytes

__all__ = ["StepMemory", "OutOfDeviceMemory", "step_memory", "step_memory_bytes", "check_step_fits"]


class OutOfDeviceMemory(MemoryError):
    """A run that does not fit the device: names the bytes it needs and the bytes free."""

    def __init__(self, needed: int, available: int, what: str) -> None:
        self.needed, self.available = needed, available
        super().__init__(f"{what} needs {needed / 1e9:.2f} GB ({needed} bytes) of device memory, but only {available / 1e9:.2f} GB ({available} bytes) are free")


@dataclass(frozen=True)
class StepMemory:
    weights: int
    kv: int
    scratch: int
    program: int  # instruction records and tensor table

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.scratch + self.program


def _layer_footprint(cfg: MuseConfig, kind: str, conversations: int, tokens_each: int, slots: int, tiles: Tiles) -> tuple[dict[tuple[str, tuple[int, ...], DType], int], int, int, int]:
    """(scratch bytes by (role, shape, dtype), work-list bytes, ops, tensors) of one layer as the step emits it."""
    T = conversations * tokens_each
    p = Program("footprint")
    s = p.tensor("s", (T, cfg.d), DType.F32)
    convs = p.tensor("convs", (conversations, 4), DType.I32, "state")
    h = p.tensor("h_in", (T, cfg.d), DType.BF16)
    w_next = p.tensor("w_next", (cfg.d,), DType.F32, "weight")
    ready = p.counter("ready")
    p.op(Op.NOP, [], [], signal=ready)  # stands for the previous layer
    emit_layer(p, cfg, kind, conversations, tokens_each, slots, prefix="L.", s=s, convs=convs, after=ready, next_norm=w_next, tiles=tiles, h=h)
    scratch = {(t.name[2:], t.shape, t.dtype): t.nbytes for t in p.tensors if t.name.startswith("L.") and t.role == "activation"}
    lists = sum(t.nbytes for t in p.tensors if t.role in ("list", "ticket"))
    return scratch, lists, len(p.instrs) - 1, len(p.tensors) - 4  # less the stand-ins above


def step_memory(
    cfg: MuseConfig,
    conversations: int,
    tokens_each: int,
    context: int,
    steps: int,
    *,
    layers: int | None = None,
    tiles: Tiles | None = None,
    share_scratch: bool = True,
    capture_layers: bool = False,
    state_copies: int = 1,
) -> StepMemory:
    """Bytes of a run of `steps` steps of conversations x tokens_each new tokens
    after `context` cached ones (make_step_state(..., steps=steps) and
    lower_step(..., state.context_capacity)); state_copies: the KV caches held
    that many times (a checked run keeps the reference's input beside them)."""
    for name, v, lo in (("conversations", conversations, 1), ("tokens_each", tokens_each, 1), ("context", context, 0), ("steps", steps, 1),
                        ("state_copies", state_copies, 1)):
        if not isinstance(v, int) or v < lo:
            raise ValueError(f"{name} must be an int >= {lo}, not {v!r}")
    n = _n_layers(cfg, layers)
    tl = tiles or Tiles()
    T, d, V = conversations * tokens_each, cfg.d, cfg.vocab_shard
    capacity = context + (steps - 1) * tokens_each
    kinds = [layer_kind(cfg, i) for i in range(n)]
    kv = 0
    scratch: dict[tuple[str, tuple[int, ...], DType], int] = {}
    per_layer_scratch = lists = ops = tensors = 0
    for kind in sorted(set(kinds)):
        count = kinds.count(kind)
        slots = cache_slots(cfg, kind, tokens_each, capacity)
        kv += count * 2 * conversations * slots * cfg.heads_kv * cfg.head_dim  # k and v, one byte each
        sc, n_list, n_ops, n_t = _layer_footprint(cfg, kind, conversations, tokens_each, slots, tl)
        scratch.update(sc)
        lists += count * n_list  # every layer's own
        per_layer_scratch += count * sum(sc.values())
        ops += count * n_ops
        tensors += count * n_t
    layer_scratch = (sum(scratch.values()) if share_scratch else per_layer_scratch) + lists
    # s, layer 0's h (bf16), logits, margin, tokens, convs
    top = 4 * T * d + 2 * T * d + 4 * T * V + 4 * T + 4 * T + 4 * conversations * 4
    capture = 4 * n * T * d if capture_layers else 0
    rows = -(-T // tl.rows)
    # EMBED and layer 0's RMSNORM, LM head, ARGMAX, captures
    ops += 2 * rows + -(-V // _pow2_rows(V, 2 * d, tl.gemm_bytes)) + -(-T // ARGMAX_ROWS) + (n * rows if capture_layers else 0)
    # s, convs, tokens, embed, w_final, lm_head, logits, margin; every layer's w_attn, layer 0's h; captures
    tensors += 8 + n + 1 + (n if capture_layers else 0)
    return StepMemory(model_nbytes(cfg, n), state_copies * kv, layer_scratch + top + capture, ops * INSTR_BYTES + tensors * TENSOR_BYTES)


def step_memory_bytes(cfg: MuseConfig, conversations: int, tokens_each: int, context: int, steps: int, **kw: object) -> int:
    """Total of step_memory: weights + caches + scratch + program, in bytes."""
    return step_memory(cfg, conversations, tokens_each, context, steps, **kw).total  # type: ignore[arg-type]


def check_step_fits(
    cfg: MuseConfig,
    conversations: int,
    tokens_each: int,
    context: int,
    steps: int,
    *,
    free_bytes: int | None = None,
    device: str | torch.device = "cuda",
    **kw: object,
) -> StepMemory:
    """Raise OutOfDeviceMemory unless the run fits free_bytes (default: the
    device's free memory, torch.cuda.mem_get_info). Returns the estimate."""
    mem = step_memory(cfg, conversations, tokens_each, context, steps, **kw)  # type: ignore[arg-type]
    free = torch.cuda.mem_get_info(torch.device(device))[0] if free_bytes is None else int(free_bytes)
    if mem.total > free:
        what = f"{cfg.name} step {conversations}x{tokens_each} at context {context} for {steps} steps (weights {mem.weights / 1e9:.1f} GB, KV {mem.kv / 1e9:.1f} GB, scratch {mem.scratch / 1e9:.1f} GB)"
        raise OutOfDeviceMemory(mem.total, free, what)
    return mem
