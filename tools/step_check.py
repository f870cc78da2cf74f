"""The whole decode step on the H200: 62 layers, final norm, LM head, argmax,
as one instruction stream, one launch per step.

    PYTHONPATH=. python3 tools/step_check.py --out out/step.json [--shapes 1x1,16x1,32x8] [--steps 128]

1. checks one step against the PyTorch reference (gpuvm.muse.reference.reference_step):
   the residual stream after every layer and the argmax tokens;
2. decodes --steps steps back to back: each step's argmax tokens are the next
   step's input (one buffer), positions advance through queued device copies,
   counters carry over, no host synchronisation inside the loop;
3. times a step against its floor (all layers' weight bytes read once, each local
   expert that got a token, the KV read, the LM head) at the streaming-read
   bandwidth measured in the same run.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuvm.device import VM  # noqa: E402
from gpuvm.device.bench import StreamRead, timing_stream  # noqa: E402
from gpuvm.env import machine  # noqa: E402
from gpuvm.muse.config import SHARD  # noqa: E402
from gpuvm.muse.memory import check_step_fits  # noqa: E402
from gpuvm.gpu_sweep import compare  # noqa: E402
from gpuvm.muse.reference import reference_layer, reference_step  # noqa: E402
from gpuvm.muse.step import bind_step, layer_kind, layer_outputs, lower_step, make_step_state  # noqa: E402
from gpuvm.muse.weights import make_model_weights  # noqa: E402
from gpuvm.step_sweep import StepShape, step_floor_bytes  # noqa: E402

SEED = 2026


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="1x1,16x1,32x8", help="conversations x tokens each; the first is also checked against the reference")
    ap.add_argument("--context", type=int, default=81_920)
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--layers", type=int, default=SHARD.n_layers)
    a = ap.parse_args()
    cfg = SHARD
    shapes = [tuple(int(v) for v in x.split("x")) for x in a.shapes.split(",")]
    out: dict = {"machine": machine(), "context": a.context, "steps": a.steps, "layers": a.layers, "runs": []}
    vm = VM(groups=2)
    out["read_bw_TBps"] = StreamRead(vm).measure()["tb_s"]
    for k, (C, n) in enumerate(shapes):  # every shape sized before the weights are made
        check_step_fits(cfg, C, n, a.context, a.steps + 1, layers=a.layers, **shape_memory(check=k == 0))
    t0 = time.time()
    mw = make_model_weights(cfg, SEED, device="cuda", layers=a.layers)
    torch.cuda.synchronize()
    log(f"weights: {mw.nbytes() / 1e9:.2f} GB made on the GPU in {time.time() - t0:.1f} s")
    for k, (C, n) in enumerate(shapes):
        res = run_shape(vm, mw, C, n, a, out["read_bw_TBps"], check=k == 0)
        out["runs"].append(res)
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(out, indent=1))
        del res
        torch.cuda.empty_cache()
    return 0


def shape_memory(check: bool) -> dict[str, object]:
    """step_memory's options for one shape's run: the checked shape keeps every
    layer's scratch (its routing read back per layer), the captured layer
    outputs and a second copy of the state (the reference's input); the others
    share scratch across layers as the step sweep does."""
    return {"share_scratch": not check, "capture_layers": check, "state_copies": 2 if check else 1}


def run_shape(vm: VM, mw, C: int, n: int, a: argparse.Namespace, bw_tbps: float, check: bool) -> dict:  # type: ignore[no-untyped-def]
    cfg = SHARD
    ts = timing_stream(vm)
    res: dict = {"conversations": C, "tokens_each": n, "read_bw_TBps": bw_tbps}
    state = make_step_state(cfg, C, n, a.context, SEED + 1, device="cuda", steps=a.steps + 1, layers=a.layers)
    t0 = time.time()
    sp = lower_step(cfg, C, n, state.context_capacity, layers=a.layers, capture_layers=check)
    res["build_s"] = time.time() - t0
    res["instructions"] = len(sp.stream)
    log(f"step program: {sp.stream.summary()[:160]} built in {res['build_s']:.1f} s")
    gen = torch.Generator(device="cpu").manual_seed(SEED)
    tokens = torch.randint(0, cfg.vocab_shard, (C * n,), generator=gen, dtype=torch.int32).cuda()

    # 1. one step against the reference, layer by layer: each layer's reference
    # is fed the device's own input to that layer (so a layer's error is its own),
    # and routing is compared with the near-tie rule of gpuvm.gpu_sweep.compare
    bufs = bind_step(sp, mw, state, tokens, device="cuda", share_scratch=not check)  # checked: per-layer routing stays readable
    pre = state.clone() if check else None
    tokens_in = tokens.clone()
    loaded = vm.load(sp.stream, bufs)
    loaded.run(0)
    if check:
        got = layer_outputs(sp, bufs).float()
        s_in = mw.embed[tokens_in.long()].float()
        errs, flips, routing_ok = [], [], True
        for i in range(sp.n_layers):
            r = reference_layer(cfg, mw.layers[i], pre.layers[i], s_in, layer_kind(cfg, i), bf16_acts=False)
            c = compare(got[i], bufs[f"L{i}.route"], bufs[f"L{i}.scores"], r, C * n)
            errs.append(c["err"])
            flips.append(c["flipped"])
            routing_ok &= c["routing_ok"]
            s_in = got[i]
        res["layer_err"] = errs
        res["layer_err_max"] = max(errs)
        res["layer_flips"] = flips
        res["routing_ok"] = bool(routing_ok)
        # the LM head and argmax on the device's own last residual (teacher-forced):
        # a token may differ only where the reference's top-2 margin is within
        # twice the device's own logit deviation
        last = got[-1].double()
        h_fin = last * torch.rsqrt(last.pow(2).mean(-1, keepdim=True) + cfg.eps) * (1 + mw.w_final.double())
        logits_ref = h_fin @ mw.lm_head.double().T
        top2 = logits_ref.topk(2, dim=1)
        tf_tokens = top2.indices[:, 0].cpu()
        tf_margin = (top2.values[:, 0] - top2.values[:, 1]).cpu()
        dev_logit = (bufs["logits"].double() - logits_ref).abs().amax(1).cpu()
        tf_same = tokens.long().cpu() == tf_tokens
        res["argmax_same_tf"] = int(tf_same.sum())
        res["argmax_ok_tf"] = bool((tf_same | (tf_margin <= 2 * dev_logit)).all())
        res["argmax_tf_margin_of_differing"] = tf_margin[~tf_same].tolist()
        res["max_logit_dev"] = float(dev_logit.max())
        ref = reference_step(cfg, mw, pre, tokens_in, bf16_acts=False)  # the free-running chain, for the argmax
        margin = ref.margin.float().cpu()
        same = tokens.long().cpu() == ref.tokens.cpu()
        res["chain_layer_err"] = [float((got[i] - ref.s_layers[i].float()).norm() / ref.s_layers[i].float().norm()) for i in range(sp.n_layers)]
        res["tokens_same"] = int(same.sum())
        res["top2_margin_of_differing"] = margin[~same].tolist()
        log(f"step 0: worst layer error {max(errs):.2e} (teacher-forced), {sum(flips)} near-tie flips, routing ok {routing_ok}; "
            f"argmax equal {res['argmax_same_tf']}/{len(same)} teacher-forced (ok {res['argmax_ok_tf']}), {int(same.sum())}/{len(same)} against the free-running chain")
    # local experts that got a token, per layer, as the device routed step 0
    hit = [int((bufs[f"L{i}.route_meta"][0] > 0).sum()) for i in range(sp.n_layers)]
    res["experts_hit"] = hit

    # floor of a step: every layer's bytes (its experts hit at step 0), plus the LM head
    floor = step_floor_bytes(cfg, StepShape(C, n, a.context), hit)
    res["floor_bytes"] = floor
    res["floor_us"] = floor / (bw_tbps * 1e12) * 1e6

    # 2. decode steps back to back, tokens fed back, positions from a queued table
    sched = state.convs_schedule(a.steps + 1)
    hist = torch.empty((a.steps, C * n), dtype=torch.int32, device="cuda")
    times = []
    with torch.cuda.stream(ts):
        for k in range(1, a.steps + 1):
            state.convs.copy_(sched[k], non_blocking=True)
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record(ts)
            loaded.run(k, stream=ts, check=False)
            e1.record(ts)
            hist[k - 1].copy_(tokens, non_blocking=True)
            times.append((e0, e1))
    loaded.check(ts)
    step_us = [e0.elapsed_time(e1) * 1e3 for e0, e1 in times]
    res["step_us_median"] = statistics.median(step_us[1:])
    res["step_us_all"] = step_us
    res["steps_decoded"] = a.steps
    res["next_step"] = loaded.next_step
    h = hist.cpu()
    res["token_history_head"] = h[:8].tolist()
    res["tokens_in_range"] = bool(((h >= 0) & (h < cfg.vocab_shard)).all())
    res["dyn_over_floor"] = res["step_us_median"] / res["floor_us"]
    res["tok_per_s_per_conv"] = n / (res["step_us_median"] * 1e-6)
    res["tok_per_s"] = C * n / (res["step_us_median"] * 1e-6)
    log(f"{C}x{n}: decoded {a.steps} steps: median {res['step_us_median']:.0f} µs per step, floor {res['floor_us']:.0f} µs ({res['dyn_over_floor']:.2f}x), {res['tok_per_s']:.0f} tok/s")
    del loaded, bufs
    return res


if __name__ == "__main__":
    sys.exit(main())
