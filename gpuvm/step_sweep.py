"""`gpuvm sweep --step`: the whole decode step (62 layers, LM head, argmax) for
a grid of conversations x tokens, every figure of a row from the same run.

GPU: the step as one stream, run by one launch (dynamic, static, and fully
static: the stream lowered with its expert items in a fixed round robin, run on
static lists, so that the whole schedule is made on the host), against the
same instructions run as one kernel launch per op under a CUDA graph
(gpuvm.device.chain), and against the step's floor: every layer's weight bytes
once (the local experts that got a token), the KV read, the LM head, at the
streaming-read bandwidth measured at the start. The four runs must agree on
the argmax tokens and the residual stream bit for bit: they compute the same
items, only who runs them differs. tools/step_check.py checks the step
against the reference.
Without a GPU: the step at small dims on the CPU backend against the
formula-level reference (two steps, tokens fed back), and the time to build
the shard's step program; no GPU figure.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from .muse.cases import Case, floor_bytes
from .muse.config import SHARD, SMALL, MuseConfig
from .muse.lowering import Tiles
from .muse.step import bind_step, layer_kind, lower_step, make_step_state

SEED = 2026
ROUTE_TIE = 1e-4  # a top-8 router margin below this may route either way


@dataclass(frozen=True)
class StepShape:
    conversations: int
    tokens_each: int
    context: int

    @property
    def name(self) -> str:
        return f"step-c{self.conversations}-t{self.tokens_each}"

    @property
    def tokens(self) -> int:
        return self.conversations * self.tokens_each


def step_floor_bytes(cfg: MuseConfig, shape: StepShape, experts_hit: list[int]) -> int:
    """Bytes a step must move: each layer's floor (MUSE.md) with its experts hit, plus the LM head."""
    total = 0
    for i, hit in enumerate(experts_hit):
        total += floor_bytes(cfg, Case(f"L{i}", layer_kind(cfg, i), shape.conversations, shape.tokens_each, shape.context), hit)["total"]
    return total + cfg.vocab_shard * cfg.d * 2


def _build(cfg: MuseConfig, shape: StepShape, capacity: int, tiles: Tiles | None = None):  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    sp = lower_step(cfg, shape.conversations, shape.tokens_each, capacity, tiles=tiles)
    return sp, time.perf_counter() - t0


# ---- CPU --------------------------------------------------------------------------
def cpu_step(shape: StepShape) -> dict:
    """Two steps at SMALL dims on the CPU backend against reference_step, and
    the shard program's build time."""
    from .cpu import run_stream
    from .muse.reference import reference_step
    from .muse.weights import make_model_weights

    ctx = min(shape.context, 3 * SMALL.window)
    w = make_model_weights(SMALL, SEED)
    state = make_step_state(SMALL, shape.conversations, shape.tokens_each, ctx, SEED + 1, steps=2)
    sp, _ = _build(SMALL, StepShape(shape.conversations, shape.tokens_each, ctx), state.context_capacity)
    tokens = torch.randint(0, SMALL.vocab_shard, (shape.tokens,), generator=torch.Generator().manual_seed(SEED), dtype=torch.int32)
    ref_state = state.clone()
    bufs = bind_step(sp, w, state, tokens)
    same = decided = 0
    counters = None
    for step in range(2):
        ref = reference_step(SMALL, w, ref_state, tokens.clone())
        counters = run_stream(sp.stream, bufs, step=step, counters=counters)
        # judged where no layer routed near a tie and the top-2 logit margin
        # is over twice the logits' own deviation (tests/test_step.py's rule)
        clear = torch.ones(shape.tokens, dtype=torch.bool)
        for lr in ref.layers:
            clear &= lr.margin > ROUTE_TIE
        clear &= ref.margin > 2 * (bufs["logits"] - ref.logits).abs().amax(1)
        decided += int(clear.sum())
        same += int((tokens.long() == ref.tokens)[clear].sum())
        ref_state.write_caches([o.k_cache for o in ref.layers], [o.v_cache for o in ref.layers])
        state.advance()
        ref_state.advance()  # the reference's positions too: without it its second step re-ran the first's
        tokens.copy_(ref.tokens.to(torch.int32))  # both sides go on from the reference's choice
    big, build_s = _build(SHARD, shape, shape.context + shape.tokens_each)
    model = model_step(big.stream, shape)
    return {
        "case": shape.name, "conversations": shape.conversations, "tokens_each": shape.tokens_each, "tokens": shape.tokens,
        "context": shape.context, "small_context": ctx, "small_tokens_same": same, "small_tokens_decided": decided,
        "small_tokens": 2 * shape.tokens, "small_ok": same == decided and 2 * decided >= 2 * shape.tokens,
        "instructions": len(big.stream), "build_s": build_s, **model,
    }


def model_step(stream: "object", shape: StepShape) -> dict:
    """The scheduler model's time of the shard's step (fitted to H200 layer
    traces, gpuvm/sim/fitted.py) at MUSE.md's nominal read, every layer routed
    with the benchmarks' skew, against the floor of that routing."""
    from .sim.fitted import fitted_hardware
    from .sim.hardware import Hardware
    from .sim.model import simulate
    from .sim.predict import model_costs, skewed_expert_tokens

    hw = fitted_hardware(Hardware().hbm_bytes_per_s)
    toks = skewed_expert_tokens(SHARD, shape.tokens)
    costs, items = model_costs(stream, toks)  # type: ignore[arg-type]
    r = simulate(stream, hw, "dynamic", costs=costs, item_costs=items)
    hit = sum(1 for t in toks if t)
    floor_ms = step_floor_bytes(SHARD, shape, [hit] * SHARD.n_layers) / hw.hbm_bytes_per_s * 1e3
    return {"model_hit": hit, "model_floor_ms": floor_ms, "model_dynamic_ms": r.makespan_ns / 1e6,
            "model_dynamic_over_floor": r.makespan_ns / 1e6 / floor_ms}


# ---- GPU --------------------------------------------------------------------------
class GpuStepSweep:
    """One model's weights on the GPU, then each shape timed three ways."""

    def __init__(self, runs: int = 20) -> None:
        from .device import VM
        from .device.bench import StreamRead
        from .muse.weights import make_model_weights

        self.runs = runs
        self.vm = VM(groups=2)
        self.bw = StreamRead(self.vm).measure(reps=runs)["tb_s"] * 1e12
        t0 = time.perf_counter()
        self.weights = make_model_weights(SHARD, SEED, device="cuda")
        torch.cuda.synchronize()
        self.weights_s = time.perf_counter() - t0

    def meta(self) -> dict:
        return {"read_bw_TBps": self.bw / 1e12, "runs": self.runs, "weights_GB": self.weights.nbytes() / 1e9, "weights_s": self.weights_s}

    def _median_us(self, launch, stream: torch.cuda.Stream) -> float:  # type: ignore[no-untyped-def]
        """Median µs of launch() over runs steps enqueued back to back, as a
        decode loop runs them (not device.bench.time_ms, which waits for each
        launch and starts the next from an idle GPU); the first two are warm-up."""
        times = []
        with torch.cuda.stream(stream):
            for r in range(self.runs + 2):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record(stream)
                launch()
                e1.record(stream)
                times.append((e0, e1))
        stream.synchronize()
        return statistics.median(e0.elapsed_time(e1) for e0, e1 in times[2:]) * 1e3

    def case(self, shape: StepShape) -> dict:
        from .device.bench import timing_stream
        from .device.chain import OpChain
        from .muse.memory import OutOfDeviceMemory, step_memory

        cfg = SHARD
        torch.cuda.empty_cache()  # the last row's blocks, cached by torch, count as taken in mem_get_info
        # the weights are resident; a row holds one copy of the state on the GPU
        # (every way binds it), a snapshot of it in host memory to put it back
        # before each checked way, three ways' scratch and two programs
        mem = step_memory(cfg, shape.conversations, shape.tokens_each, shape.context, 1)
        need, free = mem.kv + 3 * mem.scratch + 2 * mem.program, torch.cuda.mem_get_info()[0]
        if need > free:
            raise OutOfDeviceMemory(need, free, f"{shape.name}: the KV caches ({mem.kv / 1e9:.1f} GB), three ways' scratch ({mem.scratch / 1e9:.2f} GB each) and two programs")
        state = make_step_state(cfg, shape.conversations, shape.tokens_each, shape.context, SEED + 1, device="cuda")
        host = state.clone("cpu")
        sp, build_s = _build(cfg, shape, state.context_capacity)
        tokens0 = torch.randint(0, cfg.vocab_shard, (shape.tokens,), generator=torch.Generator().manual_seed(SEED), dtype=torch.int32).cuda()
        row: dict = {"case": shape.name, "conversations": shape.conversations, "tokens_each": shape.tokens_each, "tokens": shape.tokens,
                     "context": shape.context, "instructions": len(sp.stream), "build_s": build_s}
        ts = timing_stream(self.vm)
        # the same first step four ways, each from the snapshot: tokens and
        # residual must agree bit for bit. Fully static is the stream lowered
        # with the expert items in a fixed round robin, run on static lists.
        # The timed steps need no snapshot: a step writes only its own tokens'
        # cache slots (at the same positions every step, as the state does not
        # advance), and writes each before it reads it.
        outs = {}
        sp_fixed, _ = _build(cfg, shape, state.context_capacity, Tiles(expert_fixed=1))
        loaded, hit, dyn_bufs = {}, [], {}
        for how in ("static", "dynamic", "fixed", "chain"):
            if outs:  # the first way runs on the state as made
                state.copy_(host)
            tok = tokens0.clone()
            prog = sp_fixed if how == "fixed" else sp
            bufs = bind_step(prog, self.weights, state, tok, device="cuda")
            if how == "chain":
                t0 = time.perf_counter()
                chain = OpChain(self.vm, sp.stream, bufs)
                row["chain_launches"], row["chain_load_s"] = len(chain), time.perf_counter() - t0
                chain.run(0)
            else:
                ld = self.vm.load(prog.stream, bufs)
                ld.run(0, "static" if how == "fixed" else how)
            torch.cuda.synchronize()
            outs[how] = (tok.clone(), bufs["s"].clone())
            if how == "dynamic":
                hit = _experts_hit(bufs, sp.n_layers)
                dyn_bufs = bufs  # the loaded program's: its timed steps' routing is read from them
            if how in ("dynamic", "fixed"):
                loaded[how] = ld  # kept, with its scratch, for the timed steps
            del bufs
        del host
        row["experts_hit_mean"] = sum(hit) / len(hit)
        row["same_tokens"] = all(torch.equal(outs[h][0], outs["dynamic"][0]) for h in outs)
        row["same_residual"] = all(torch.equal(outs[h][1], outs["dynamic"][1]) for h in outs)
        row["ok"] = row["same_tokens"] and row["same_residual"] and bool(((outs["dynamic"][0] >= 0) & (outs["dynamic"][0] < cfg.vocab_shard)).all())
        # steps running on: dynamic and static on the same loaded program
        for how, ld, mode in (("dynamic", loaded["dynamic"], "dynamic"), ("static", loaded["dynamic"], "static"), ("fixed", loaded["fixed"], "static")):
            row[f"{how}_us"] = self._median_us(lambda: ld.run(ld.next_step, mode, check=False, stream=ts), ts)
            ld.check(ts)
            if how == "dynamic":  # each timed step decodes the last one's argmax: its routing is not the checked step's
                hit_timed = _experts_hit(dyn_bufs, sp.n_layers)
        del loaded, ld, dyn_bufs
        g = chain.graph(1)
        row["chain_us"] = self._median_us(g.replay, ts)
        chain.check(ts)
        fb = step_floor_bytes(cfg, shape, hit)
        row["floor_bytes"] = fb
        row["floor_us"] = fb / self.bw * 1e6
        row["dyn_over_floor"] = row["dynamic_us"] / row["floor_us"]
        # the floor of the last timed step's routing (the median step's is not known)
        row["experts_hit_mean_timed"] = sum(hit_timed) / len(hit_timed)
        row["floor_us_timed"] = step_floor_bytes(cfg, shape, hit_timed) / self.bw * 1e6
        row["dyn_over_floor_timed"] = row["dynamic_us"] / row["floor_us_timed"]
        row["chain_over_dyn"] = row["chain_us"] / row["dynamic_us"]
        row["static_over_dyn"] = row["static_us"] / row["dynamic_us"]
        row["fixed_over_dyn"] = row["fixed_us"] / row["dynamic_us"]
        row["tok_per_s_per_conv"] = shape.tokens_each / (row["dynamic_us"] * 1e-6)
        row["tok_per_s"] = shape.tokens / (row["dynamic_us"] * 1e-6)
        del outs, g, chain
        torch.cuda.empty_cache()
        return row


def _experts_hit(bufs: dict, n_layers: int) -> list[int]:
    """Experts each layer's last TOPK routed tokens to (its routing table's counts)."""
    return [int((bufs[f"L{i}.route_meta"][0] > 0).sum()) for i in range(n_layers)]


CPU_COLUMNS = [
    ("case", "case", "{}"),
    ("tokens", "T", "{}"),
    ("small_tokens_same", "argmax = ref @small", "{}"),
    ("small_tokens_decided", "of (not ties)", "{}"),
    ("small_tokens", "of all", "{}"),
    ("instructions", "instructions (shard)", "{}"),
    ("build_s", "build s", "{:.2f}"),
    ("model_hit", "model hit/layer", "{}"),
    ("model_floor_ms", "floor ms*", "{:.2f}"),
    ("model_dynamic_ms", "model dyn ms", "{:.2f}"),
    ("model_dynamic_over_floor", "dyn/floor", "{:.2f}"),
]

GPU_COLUMNS = [
    ("case", "case", "{}"),
    ("tokens", "T", "{}"),
    ("ok", "4 ways agree", "{}"),
    ("floor_us", "floor µs", "{:.0f}"),
    ("dynamic_us", "gpuvm dyn µs", "{:.0f}"),
    ("static_us", "gpuvm static µs", "{:.0f}"),
    ("fixed_us", "fully static µs", "{:.0f}"),
    ("chain_us", "per-op launches µs", "{:.0f}"),
    ("dyn_over_floor", "dyn/floor", "{:.2f}"),
    ("experts_hit_mean", "hit/layer", "{:.1f}"),
    ("experts_hit_mean_timed", "hit/layer timed", "{:.1f}"),
    ("chain_over_dyn", "chain/dyn", "{:.2f}"),
    ("static_over_dyn", "static/dyn", "{:.2f}"),
    ("fixed_over_dyn", "fully static/dyn", "{:.2f}"),
    ("tok_per_s", "tok/s", "{:.0f}"),
    ("build_s", "build s", "{:.2f}"),
]
