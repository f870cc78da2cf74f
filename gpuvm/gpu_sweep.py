"""The GPU half of `gpuvm sweep`: one decode case at the shard's full size,
checked against the reference and timed against the floor and the peer, every
figure from the same run."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

import statistics

from .device.bench import L2Flush, StreamRead, time_ms, timing_stream
from .muse.cases import Case, floor_bytes
from .muse.config import SHARD, MuseConfig
from .muse.lowering import Tiles, bind_layer, lower_layer
from .muse.reference import RefOut, reference_layer
from .muse.state import make_inputs, make_state
from .muse.weights import LayerWeights, make_layer_weights
from .peer import PeerLayer
from .program import Stream
from .sim.predict import EXPERT_OPS, layer_costs
from .trace.format import Trace

SEED = 2026
TOL = 1e-2  # MEASURE.md: bf16 activations
_MODE = {"dynamic": "dynamic", "static": "static", "fixed": "static"}  # the VM's scheduling mode of each run


def compare(out: torch.Tensor, route: torch.Tensor, scores: torch.Tensor, ref: "RefOut", t: int) -> dict:
    """MEASURE.md's check of one run against the FP32 reference.

    A token whose top-8 set differs from the reference's is a legitimate flip
    only when its reference margin (8th minus 9th score) is within twice the
    largest deviation between the device's router scores and the reference's
    for that token: the scores' own rounding then suffices to swap the two.
    Any other difference is a routing error. The residual error is taken over
    the tokens routed alike (a flipped token runs other experts by design);
    err_all, over every token, is reported beside it."""
    got = route[2, : 8 * t].view(t, 8).long().sort(1).values.cpu()
    want = ref.topk_idx.sort(1).values.cpu()
    same = (got == want).all(1)
    dev = (scores.float().cpu() - ref.scores.float().cpu()).abs().amax(1)
    margin = ref.margin.float().cpu()
    tie = margin <= 2 * dev
    out, ref_s = out.float().cpu(), ref.s_out.float().cpu()
    err = float((out[same] - ref_s[same]).norm() / ref_s[same].norm()) if bool(same.any()) else float("nan")
    return {
        "err": err,
        "err_all": float((out - ref_s).norm() / ref_s.norm()),
        "flipped": int((~same).sum()),
        "routing_ok": bool((same | tie).all()),
        "max_flip_margin": float(margin[~same].max()) if bool((~same).any()) else 0.0,
        "max_score_dev": float(dev.max()),
    }


def with_routed_bytes(trace: "Trace", stream: "Stream", expert_tokens: list[int]) -> None:
    """The expert instructions' bytes as this run routed them (a stream's
    static costs assume every local expert got a token): each op's total is
    right; how a list's items fell to its workers is dealt round-robin, as
    the model does (gpuvm.sim.predict.layer_costs)."""
    costs = layer_costs(stream, expert_tokens)
    for i, ins in enumerate(stream.ops):
        if ins.opcode in EXPERT_OPS:
            trace.weight_bytes[i], trace.act_bytes[i] = costs[i].weight_bytes, costs[i].act_bytes
    trace.meta["expert_tokens"] = list(expert_tokens)


@dataclass
class GpuSweep:
    runs: int = 20
    trace_dir: Path | None = None
    cfg: MuseConfig = SHARD
    groups: int = 2
    _weights: dict[str, LayerWeights] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from .device import VM

        self.vm = VM(groups=self.groups)
        self.traced_vm = VM(groups=self.groups, trace=True) if self.trace_dir else None
        self.flush = L2Flush(self.vm.torch_device)
        self.stream = timing_stream(self.vm)
        self.bw = StreamRead(self.vm).measure(reps=self.runs)["tb_s"] * 1e12

    def median_us(self, launch: Callable[[], None], s_in: torch.Tensor, s0: torch.Tensor) -> float:
        """Median device time of launch() in µs, each run from input s0 (copied
        into s_in) with the L2 flushed, untimed (L2Flush.restoring): every timed
        run is the checked run's workload."""
        return statistics.median(time_ms(lambda r: launch(), self.stream, self.runs, before=self.flush.restoring(s_in, s0))) * 1e3

    def meta(self) -> dict:
        return {"read_bw_TBps": self.bw / 1e12, "groups": self.groups, "runs": self.runs, "l2_flush_MB": 256}

    def weights(self, kind: str) -> LayerWeights:
        if kind not in self._weights:
            self._weights.clear()  # one layer's weights (1.1 GB) at a time
            torch.cuda.empty_cache()
            self._weights[kind] = make_layer_weights(self.cfg, 1 if kind == "full" else 0, SEED, device="cuda")
        return self._weights[kind]

    def case(self, case: Case) -> dict:
        cfg, kind = self.cfg, case.kind
        w = self.weights(kind)
        state = make_state(cfg, kind, case.conversations, case.tokens_each, case.context, SEED + 1, device="cuda")
        s0 = make_inputs(cfg, state, SEED)
        ref = reference_layer(cfg, w, state.clone(), s0.clone(), kind, bf16_acts=False)
        ref16 = reference_layer(cfg, w, state.clone(), s0.clone(), kind, bf16_acts=True)
        lp = lower_layer(cfg, kind, case.conversations, case.tokens_each, state.slots)
        # "fixed": static lists and the expert items in a fixed round robin, the
        # whole schedule made before launch (static still claims items on the GPU)
        lps = {"dynamic": lp, "static": lp, "fixed": lower_layer(cfg, kind, case.conversations, case.tokens_each, state.slots, tiles=Tiles(expert_fixed=1))}
        row: dict = {
            "case": case.name, "kind": kind, "conversations": case.conversations, "tokens_each": case.tokens_each,
            "tokens": case.tokens, "context": case.context, "instructions": len(lp.stream),
        }
        errs = {}
        bufs = {}
        loaded = {}
        for how in ("dynamic", "static", "fixed"):
            st = state.clone()
            b = bind_layer(lps[how], w, st, s0, device="cuda")  # scratch poisoned with NaN
            ld = self.vm.load(lps[how].stream, b)
            ld.run(step=0, mode=_MODE[how])
            torch.cuda.synchronize()
            out = b["s"]
            cmp = compare(out, b["L0.route"], b["L0.scores"], ref, case.tokens)
            errs[how] = cmp["err"]
            row.update({f"{k}_{how}": v for k, v in cmp.items()})
            # the same run against the reference that rounds where the device does (bf16 activations)
            row[f"err_bf16ref_{how}"] = float((out.float() - ref16.s_out).norm() / ref16.s_out.norm())
            bufs[how], loaded[how] = b, ld
        row["err"] = max(errs.values())
        row["err_dynamic"], row["err_static"], row["err_fixed"] = errs["dynamic"], errs["static"], errs["fixed"]
        hit = int((ref.local_counts > 0).sum())
        row["experts_hit"] = hit
        row["ok"] = bool(row["err"] <= TOL and all(row[f"routing_ok_{how}"] for how in lps))

        for how in ("dynamic", "static", "fixed"):
            ld = loaded[how]
            s_in = bufs[how]["s"]
            row[f"{how}_us"] = self.median_us(lambda: ld.run(ld.next_step, mode=_MODE[how], stream=self.stream, check=False), s_in, s0)
            ld.check(self.stream)  # a device error in any timed run raises here
        del bufs, loaded

        peer = PeerLayer.create(cfg, w, state.clone(), s0.clone(), kind)
        g = peer.graph()
        row["peer_us"] = self.median_us(g.replay, peer.s, s0)
        del peer, g

        fb = floor_bytes(cfg, case, hit)
        row["floor_bytes"] = fb["total"]
        row["floor_us"] = fb["total"] / self.bw * 1e6
        row["dyn_over_floor"] = row["dynamic_us"] / row["floor_us"]
        row["peer_over_dyn"] = row["peer_us"] / row["dynamic_us"]
        row["static_over_dyn"] = row["static_us"] / row["dynamic_us"]
        row["fixed_over_dyn"] = row["fixed_us"] / row["dynamic_us"]
        if self.traced_vm is not None and self.trace_dir is not None:
            self.trace_dir.mkdir(parents=True, exist_ok=True)
            # static's and fully static's too: where the three differ, op by op
            for how, suffix in (("dynamic", ""), ("static", "-static"), ("fixed", "-fixed")):
                mode, prog = _MODE[how], lps[how]
                st = state.clone()
                b = bind_layer(prog, w, st, s0, device="cuda")
                ld = self.traced_vm.load(prog.stream, b)
                ld.run(step=0, mode=mode)
                self.flush.restoring(b["s"], s0)()  # the checked run's input again, the L2 flushed
                ld.run(step=1, mode=mode)  # the second step, weights from HBM, is the one kept
                torch.cuda.synchronize()
                tr = ld.trace()
                tr.meta["read_bw_TBps"] = self.bw / 1e12  # the per-op floors of the summary
                with_routed_bytes(tr, prog.stream, b["L0.route_meta"][0].tolist())
                tr.save(self.trace_dir / f"trace-{case.name}{suffix}.npz")
                del b, st, ld
        torch.cuda.empty_cache()
        return row
