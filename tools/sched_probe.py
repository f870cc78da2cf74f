"""How the run-time scheduler's knobs move a latency-bound layer and the
whole step on the GPU (issue 6): claim depth (claims a block holds ahead,
a launch parameter), build variants (e.g. GVM_READY_FIRST, the loader's
GVM_PF_MAX_BYTES) and tilings (lowering.Tiles fields), dynamic against
static, and stream orders (Program.build), in one run.

    PYTHONPATH=. python3 tools/sched_probe.py --out out/sched_probe.json

--draws 8,16 also runs every variant rebuilt with GVM_RESCHED_PROBE=n and
ends with each variant's spread over its draws (tools/draws.py: why, and how
to fold several rounds).
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys

import torch

from gpuvm.device import VM
from gpuvm.device.bench import L2Flush, at_claim_depth, time_ms, timing_stream
from gpuvm.gpu_sweep import SEED
from gpuvm.muse.cases import get_case
from gpuvm.muse.config import SHARD
from gpuvm.muse.lowering import Tiles, bind_layer, lower_layer
from gpuvm.muse.state import make_inputs, make_state
from gpuvm.muse.step import bind_step, lower_step, make_step_state
from gpuvm.muse.weights import make_layer_weights, make_model_weights
from tools.draws import draw_spread, verdicts, with_draws
from tools.variants import parse_variant


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="out/sched_probe.json")
    ap.add_argument("--depths", default="1,2,3", help="claim depths (at most the build's claim slots)")
    ap.add_argument("--variants", default="ready:GVM_READY_FIRST=1,inorder:GVM_READY_FIRST=0",
                    help="name:MACRO=value[+MACRO=value],... (one build each; warm=1: the VM with its instruction-cache warmer, "
                    "off by default as in `gpuvm sweep`, whose tables these runs should match; "
                    "groups=N: N compute groups a block, of a kernel built for max_groups=M (default N); tiles=a/b: only the --tiles named a and b)")
    ap.add_argument("--cases", default="full-c1-t1,sliding-c32-t8")
    ap.add_argument("--step", default="1x1", help="step shapes, e.g. 1x1,1x8 ('' for none)")
    ap.add_argument("--tiles", default="", help="name:field=value[+field=value],... of lowering.Tiles (default: Tiles())")
    ap.add_argument("--static-depths", action="store_true", help="static mode at every --depths too (default: at the VM's own claim depth, 1, as the sweep's tables)")
    ap.add_argument("--modes", default="dynamic,static", help="scheduling modes to time (static: at the VM's claim depth unless --static-depths)")
    ap.add_argument("--orders", default="depth", help="stream orders to compare (Program.build: depth, the lowering's default, or priority)")
    ap.add_argument("--draws", default="", help="GVM_RESCHED_PROBE sizes: every variant also rebuilt with each (reschedule draws)")
    a = ap.parse_args()
    draws = [int(n) for n in a.draws.split(",") if n]
    if draws:
        a.variants = with_draws(a.variants, draws)
    depths = [int(d) for d in a.depths.split(",")]
    vms = {}
    only: dict[str, set[str]] = {}  # variant -> the tilings it runs (absent: all)
    for v in a.variants.split(","):
        name, defines = parse_variant(v)
        kv = dict(defines)
        # the warmer off unless asked for: on, it holds group 0 of every block at launch and
        # the layers ran ~10 us slower than in `gpuvm sweep` (H200, session 28)
        warm, groups = kv.pop("warm", "0") != "0", int(kv.pop("groups", "2"))
        max_groups = int(kv.pop("max_groups", str(groups)))
        if "tiles" in kv:
            only[name] = set(kv.pop("tiles").split("/"))
        vms[name] = VM(groups=groups, max_groups=max_groups, warm=warm, defines=tuple(kv.items()))
    tilings = {"": Tiles()}
    if a.tiles:
        tilings = {}
        for v in a.tiles.split(","):
            name, _, defs = v.partition(":")
            tilings[name] = Tiles.parse(defs)
    orders = a.orders.split(",")
    otag = {o: "" if o == "depth" else f"@{o}" for o in orders}  # the lowering's order adds nothing to a row's name
    flush = L2Flush(torch.device("cuda", 0))
    res: dict[str, float] = {}

    def timed(tag: str, ld, reps: int, before) -> None:  # type: ignore[no-untyped-def]
        ts = timing_stream(ld.vm)
        for mode in a.modes.split(","):
            for d in depths if mode == "dynamic" or a.static_depths else [ld.vm.claim_depth]:  # all slots held: 16-24% slower (session 43)
                with at_claim_depth(ld.vm, d):
                    t = statistics.median(time_ms(lambda r: ld.run(ld.next_step, mode, check=False, stream=ts), ts, reps, before=before)) * 1e3
                    ld.check(ts)
                key = f"{tag}/{mode}/d{d}"
                res[key] = t
                print(f"{key:44s} {t:10.1f} us", flush=True)

    for cname in a.cases.split(","):
        case = get_case(cname)
        w = make_layer_weights(SHARD, 1 if case.kind == "full" else 0, SEED, device="cuda")
        state = make_state(SHARD, case.kind, case.conversations, case.tokens_each, case.context, SEED + 1, device="cuda")
        s0 = make_inputs(SHARD, state, SEED)
        for (tname, tl), order in itertools.product(tilings.items(), orders):
            lp = lower_layer(SHARD, case.kind, case.conversations, case.tokens_each, state.slots, tiles=tl, order=order)
            for name, vm in vms.items():
                if name in only and tname not in only[name]:
                    continue
                b = bind_layer(lp, w, state.clone(), s0, device="cuda")
                ld = vm.load(lp.stream, b)

                timed(f"{cname}/{name}{tname}{otag[order]}", ld, 20, flush.restoring(b["s"], s0))
                del ld, b
        del w, state
        torch.cuda.empty_cache()
    if a.step:
        mw = make_model_weights(SHARD, SEED, device="cuda")
        for shp in a.step.split(","):
            C, n = (int(v) for v in shp.split("x"))
            state = make_step_state(SHARD, C, n, 81_920, SEED + 1, device="cuda")
            tokens = torch.randint(0, SHARD.vocab_shard, (C * n,), dtype=torch.int32, device="cuda")
            for (tname, tl), order in itertools.product(tilings.items(), orders):
                sp = lower_step(SHARD, C, n, state.context_capacity, tiles=tl, order=order)
                bufs = bind_step(sp, mw, state, tokens, device="cuda")
                for name, vm in vms.items():
                    if name in only and tname not in only[name]:
                        continue
                    ld = vm.load(sp.stream, bufs)
                    timed(f"step{shp}/{name}{tname}{otag[order]}", ld, 10, None)
                    del ld
                del sp, bufs
            del state, tokens  # before the next shape's state: an 80 GB card holds one 32 x 8 state beside the weights
            torch.cuda.empty_cache()
    if draws:
        print("over each variant's draws (its build and its reschedules): median [min, max] (tools/draws.py folds rounds)")
        print("\n".join(verdicts(draw_spread(res))), flush=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
