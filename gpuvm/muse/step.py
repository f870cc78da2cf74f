"""A whole decode step of the shard as one instruction stream (MUSE.md "The whole model").

    EMBED tokens -> s
    layer 0 .. n-1 (emit_layer; layer i full when i % 4 == 1, else sliding)
    final norm, LM-head GEMM tiles -> logits [T, vocab_shard] f32
    ARGMAX -> tokens (and the top-2 margin)

Layers chain by their done counters and the fused next norm: layer i's last
RESIDUAL writes rms(s) * (1 + w) as bf16, w being layer i+1's w_attn, which
layer i+1 takes as its h (it has no RMSNORM of its own). The last layer's w
is w_final, so the final norm is that fused RESIDUAL: the same math as an
RMSNORM of s, one op less on the critical path.

Decoding with no host sync inside or between steps:
- Tokens: one i32 tensor `tokens` [T] is both EMBED's input and ARGMAX's
  output. Within a step every ARGMAX op waits (through the layer chain) on
  every EMBED op, so the ids are read before they are overwritten; the next
  launch, queued on the same CUDA stream, embeds this step's choice. N
  launches in a row decode N steps. (To keep every step's ids on the GPU, queue
  a device-to-device copy of `tokens` after each launch: no sync either.)
- Positions: `convs` [C, 4] (tok0, tokens, pos0, 0), shared by every layer, is
  a state buffer. Before launch k the host queues a copy of row k of
  StepState.convs_schedule(steps), a table made once on the device: a
  cudaMemcpyAsync device to device, no sync. On the CPU backend,
  StepState.advance() writes the bound buffer in place.
- Counters are monotonic: run step k with step=k and the counters step k-1 left.

Scratch buffers are poisoned (NaN / POISON_INT) at bind time (tickets too: the
executors zero them with the counters). Layers run one
after the other (every op of layer i+1 waits, through `after`, on every op of
layer i but the late workers of its expert lists, which find their list done
and touch only the list's own tensors, of role "list": never shared), so by
default a scratch role of the same shape and dtype shares one buffer across
layers (share_scratch=True); share_scratch=False gives every layer its own, so
an element a later layer never writes shows as NaN too.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..isa import DType, Op
from ..opspec import ProgramError, TensorSpec
from ..program import Program, Stream
from ..tensors import check_binding
from .config import MuseConfig
from .lowering import LayerHandles, Tiles, _pow2_rows, _tiles, emit_layer, poisoned
from .state import DecodeState, cache_slots, make_state
from .weights import ModelWeights, _n_layers

__all__ = ["StepProgram", "StepState", "lower_step", "emit_step", "bind_step", "make_step_state", "layer_kind", "layer_outputs", "ARGMAX_ROWS"]

#: token rows per ARGMAX op: a row of logits is 101 KB at full size, so one row per op spreads them over SMs
ARGMAX_ROWS = 1


def layer_kind(cfg: MuseConfig, i: int) -> str:
    return "full" if cfg.is_full(i) else "sliding"


@dataclass
class StepProgram:
    """A whole-step program, built."""

    cfg: MuseConfig
    conversations: int
    tokens_each: int
    context_capacity: int  # most cached tokens per conversation before a step
    n_layers: int
    slots: dict[str, int]  # cache slots per layer kind
    capture_layers: bool
    program: Program
    stream: Stream
    layers: list[LayerHandles] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return self.conversations * self.tokens_each

    @property
    def kinds(self) -> list[str]:
        return [layer_kind(self.cfg, i) for i in range(self.n_layers)]


def _check_args(conversations: int, tokens_each: int, context_capacity: int) -> None:
    for name, v, lo in (("conversations", conversations, 1), ("tokens_each", tokens_each, 1), ("context_capacity", context_capacity, 0)):
        if not isinstance(v, int) or v < lo:
            raise ProgramError(f"{name} must be an int >= {lo}, not {v!r}")


def emit_step(
    p: Program,
    cfg: MuseConfig,
    conversations: int,
    tokens_each: int,
    context_capacity: int,
    *,
    layers: int | None = None,
    tiles: Tiles | None = None,
    capture_layers: bool = False,
) -> tuple[dict[str, int], list[LayerHandles]]:
    """Append a whole step to an empty Program; returns (cache slots per kind, layer handles)."""
    _check_args(conversations, tokens_each, context_capacity)
    try:
        n = _n_layers(cfg, layers)
    except ValueError as e:
        raise ProgramError(str(e)) from None
    tl = tiles or Tiles()
    T, d, V = conversations * tokens_each, cfg.d, cfg.vocab_shard
    slots = {
        "full": cache_slots(cfg, "full", tokens_each, context_capacity),
        "sliding": cache_slots(cfg, "sliding", tokens_each, context_capacity),
    }
    s = p.tensor("s", (T, d), DType.F32)
    convs = p.tensor("convs", (conversations, 4), DType.I32, "state")
    tokens = p.tensor("tokens", (T,), DType.I32, "state")
    embed = p.tensor("embed", (V, d), DType.BF16, "weight")
    w_final = p.tensor("w_final", (d,), DType.F32, "weight")
    lm_head = p.tensor("lm_head", (V, d), DType.BF16, "weight")
    logits = p.tensor("logits", (T, V), DType.F32)
    margin = p.tensor("margin", (T,), DType.F32)
    rows = _tiles(0, T, tl.rows)

    after = p.counter("embedded")
    for r0, k in rows:
        p.op(Op.EMBED, [s, embed, tokens], [r0, k], signal=after, label=f"embed[{r0}:{r0 + k}]")
    h: TensorSpec | None = None
    handles: list[LayerHandles] = []
    for i in range(n):
        kind = layer_kind(cfg, i)
        w_next = p.tensor(f"L{i + 1}.w_attn", (d,), DType.F32, "weight") if i + 1 < n else w_final
        hd = emit_layer(p, cfg, kind, conversations, tokens_each, slots[kind], prefix=f"L{i}.", s=s, convs=convs,
                        after=after, next_norm=w_next, tiles=tl, h=h)
        handles.append(hd)
        after, h = hd.done, hd["next_h"]
        if capture_layers:  # s after the layer, before the next one changes it
            out = p.tensor(f"L{i}.s_out", (T, d), DType.F32)
            captured = p.counter(f"L{i}.captured")
            for r0, k in rows:
                p.op(Op.COPY, [out, s], [r0 * d, k * d], waits=[after], signal=captured, label=f"L{i}.capture[{r0}:{r0 + k}]")
            after = captured
    assert h is not None
    head = p.counter("logits")
    per = _pow2_rows(V, lm_head.row_bytes, tl.gemm_bytes)
    for c0, k in _tiles(0, V, per):
        p.op(Op.GEMM, [logits, h, lm_head], [c0, k], waits=[after], signal=head,
             prefetch=(lm_head, c0 * lm_head.row_bytes, k * lm_head.row_bytes), label=f"lm_head[{c0}:{c0 + k}]")
    for r0, k in _tiles(0, T, ARGMAX_ROWS):
        p.op(Op.ARGMAX, [logits, tokens, margin], [r0, k], waits=[head], label=f"argmax[{r0}:{r0 + k}]")
    return slots, handles


def lower_step(
    cfg: MuseConfig,
    conversations: int,
    tokens_each: int,
    context_capacity: int,
    *,
    layers: int | None = None,
    tiles: Tiles | None = None,
    capture_layers: bool = False,
    order: str = "depth",
) -> StepProgram:
    """The whole step (first `layers` layers, default all) as one built program.

    context_capacity: the most tokens a conversation has cached before a step;
    full layers' caches hold positions up to context_capacity + tokens_each - 1
    (StepState.context_capacity gives the value that matches a state).
    capture_layers: after each layer, COPY ops save s into f"L{i}.s_out" (see
    layer_outputs) for the per-layer residual check.
    """
    p = Program(f"{cfg.name} step {conversations}x{tokens_each}")
    slots, handles = emit_step(p, cfg, conversations, tokens_each, context_capacity, layers=layers, tiles=tiles, capture_layers=capture_layers)
    return StepProgram(cfg, conversations, tokens_each, context_capacity, len(handles), slots, capture_layers, p, p.build(order=order), handles)


# ---- state ---------------------------------------------------------------------------
@dataclass
class StepState:
    """Every layer's DecodeState; all of them share one convs tensor."""

    cfg: MuseConfig
    layers: list[DecodeState]
    context_capacity: int  # what lower_step needs for these caches

    @property
    def conversations(self) -> int:
        return self.layers[0].conversations

    @property
    def tokens_each(self) -> int:
        return self.layers[0].tokens_each

    @property
    def tokens(self) -> int:
        return self.layers[0].tokens

    @property
    def context(self) -> int:
        return self.layers[0].context

    @property
    def convs(self) -> torch.Tensor:
        return self.layers[0].convs

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def advance(self) -> None:
        """Move every layer to the next step (writes convs in place)."""
        for st in self.layers:
            st.advance()

    def convs_schedule(self, steps: int) -> torch.Tensor:
        """[steps, C, 4] int32 on the state's device: convs of this step and the
        next steps-1, for the host to queue row k into convs before launch k."""
        if steps < 1:
            raise ValueError(f"steps must be >= 1, not {steps}")
        last = self.context + (steps - 1) * self.tokens_each
        if last > self.context_capacity:
            raise ValueError(f"{steps} steps from context {self.context} pass the caches' capacity of {self.context_capacity} cached tokens")
        table = self.convs.unsqueeze(0).repeat(steps, 1, 1)
        table[:, :, 2] = self.context + self.tokens_each * torch.arange(steps, dtype=torch.int32, device=table.device)[:, None]
        return table

    def write_caches(self, k_caches: list[torch.Tensor], v_caches: list[torch.Tensor]) -> None:
        """Replace every layer's caches (e.g. by a reference step's), in layer order."""
        if len(k_caches) != self.n_layers or len(v_caches) != self.n_layers:
            raise ValueError(f"need {self.n_layers} k and v caches, got {len(k_caches)} and {len(v_caches)}")
        for st, k, v in zip(self.layers, k_caches, v_caches):
            if k.shape != st.k_cache.shape or v.shape != st.v_cache.shape:
                raise ValueError(f"cache shapes {tuple(k.shape)}, {tuple(v.shape)} do not match {tuple(st.k_cache.shape)}")
            st.k_cache, st.v_cache = k, v

    def clone(self, device: str | torch.device | None = None) -> "StepState":
        """A copy, on `device` (default: this state's); its layers share one convs tensor too."""
        layers = [st.clone(device) for st in self.layers]
        for st in layers[1:]:
            st.convs = layers[0].convs
        return StepState(self.cfg, layers, self.context_capacity)

    def copy_(self, other: "StepState") -> None:
        """Take other's convs and caches in place, layer by layer (e.g. back from a host snapshot)."""
        if other.n_layers != self.n_layers:
            raise ValueError(f"cannot copy a state of {other.n_layers} layers into one of {self.n_layers}")
        for st, o in zip(self.layers, other.layers):
            st.copy_(o)


def make_step_state(
    cfg: MuseConfig,
    conversations: int,
    tokens_each: int,
    context: int,
    seed: int,
    device: str | torch.device = "cpu",
    *,
    steps: int = 1,
    layers: int | None = None,
) -> StepState:
    """Every layer's state before the first of `steps` steps (make_state per layer
    kind, random caches different per layer), sharing one convs tensor."""
    n = _n_layers(cfg, layers)
    states = [make_state(cfg, layer_kind(cfg, i), conversations, tokens_each, context, seed * 100_003 + i, device, steps=steps) for i in range(n)]
    for st in states[1:]:
        st.convs = states[0].convs
    return StepState(cfg, states, context + (steps - 1) * tokens_each)


# ---- binding ---------------------------------------------------------------------------
def _layer_of(name: str) -> tuple[int, str] | None:
    """(i, role) of a name f"L{i}.{role}", else None."""
    head, dot, role = name.partition(".")
    if dot and head[:1] == "L" and head[1:].isdigit():
        return int(head[1:]), role
    return None


def bind_step(
    sp: StepProgram,
    weights: ModelWeights,
    states: StepState,
    tokens: torch.Tensor,
    device: str | torch.device = "cpu",
    *,
    share_scratch: bool = True,
) -> dict[str, torch.Tensor]:
    """Buffers for every tensor of sp.stream, by name.

    tokens [T] int32 (ids in [0, vocab_shard)) is what EMBED reads and ARGMAX
    overwrites: bound as is when it lives on `device`, so the caller's tensor
    carries each step's choice into the next. The states' caches and convs are
    bound the same way. Weights move to `device` when elsewhere. Scratch is
    poisoned; see the module docstring for share_scratch.
    """
    if weights.n_layers != sp.n_layers or states.n_layers != sp.n_layers:
        raise ProgramError(f"the program has {sp.n_layers} layers, the weights {weights.n_layers}, the states {states.n_layers}")
    if (states.conversations, states.tokens_each) != (sp.conversations, sp.tokens_each):
        raise ProgramError(f"states are for {states.conversations}x{states.tokens_each} tokens, the program for {sp.conversations}x{sp.tokens_each}")
    for i, w in enumerate(weights.layers):
        if (w.k_scale, w.v_scale) != (1.0, 1.0):
            raise ProgramError(f"layer {i}: KV scales ({w.k_scale}, {w.v_scale}); the step program is built for 1.0")
    model = {"embed": weights.embed, "w_final": weights.w_final, "lm_head": weights.lm_head, "convs": states.convs, "tokens": tokens}
    captured = None
    if sp.capture_layers:  # one [n_layers, T, d] buffer; layer i's COPY ops fill row i
        captured = torch.full((sp.n_layers, sp.tokens, sp.cfg.d), float("nan"), dtype=torch.float32, device=device)
    scratch: dict[tuple[str, tuple[int, ...], DType], torch.Tensor] = {}
    out: dict[str, torch.Tensor] = {}
    for spec in sp.stream.tensors:
        where = _layer_of(spec.name)
        if spec.name in model:
            buf = model[spec.name].to(device)
        elif where is not None and where[1] == "s_out" and captured is not None:
            buf = captured[where[0]]
        elif where is not None and spec.role == "weight":
            buf = getattr(weights.layers[where[0]], where[1]).to(device)
        elif where is not None and spec.role == "state":
            buf = getattr(states.layers[where[0]], where[1]).to(device)
        elif spec.role in ("list", "ticket"):  # the layer's own: see gpuvm.program.ROLES
            buf = poisoned(spec, device)
        elif share_scratch:
            key = (where[1] if where is not None else spec.name, spec.shape, spec.dtype)
            if key not in scratch:
                scratch[key] = poisoned(spec, device)
            buf = scratch[key]
        else:
            buf = poisoned(spec, device)
        out[spec.name] = check_binding(spec, buf)
    return out


def layer_outputs(sp: StepProgram, bufs: dict[str, torch.Tensor]) -> torch.Tensor:
    """[n_layers, T, d] f32: s after each layer, as the capture COPY ops saved it."""
    if not sp.capture_layers:
        raise ProgramError("the step program was built without capture_layers=True")
    return torch.stack([bufs[f"L{i}.s_out"] for i in range(sp.n_layers)])

