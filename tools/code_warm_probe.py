"""What the kernel's code coming from HBM costs a layer of `gpuvm sweep`'s
table, and how much of it the code warmer wins back (issue 6; Tiles.code_warm,
gpuvm/muse/code_warm.py). The sweep flushes the L2 before every timed launch,
and that evicts the VM's code too. Each case, on the same input every run (a
run updates its residual stream in place), timed four ways:

  cold:    L2 flushed, then the layer (the sweep's figure);
  code:    L2 flushed, then a separate launch of the warmer's small layer
           (same kernel, same op paths, a few MB of data) untimed, then the
           layer: its code is in L2, its weights are not;
  hot:     no flush;
  warmer:  L2 flushed, then the layer as lowered by default (the code
           warmer's instances inside the same launch, up to 32 tokens).

cold - code bounds what a warmer can win; cold - warmer is what it wins.

    PYTHONPATH=. python3 tools/code_warm_probe.py --out out/code_warm.json [--trace-dir out/traces]
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from gpuvm.device import VM
from gpuvm.device.bench import L2Flush, time_ms, timing_stream
from gpuvm.gpu_sweep import SEED
from gpuvm.muse import code_warm
from gpuvm.muse.cases import get_case
from gpuvm.muse.config import SHARD
from gpuvm.muse.lowering import Tiles, bind_layer, lower_layer
from gpuvm.muse.state import make_inputs, make_state
from gpuvm.muse.weights import make_layer_weights

BASE, WARM = Tiles(code_warm=0), Tiles()  # without the warmer, and main's default (with it)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="out/code_warm.json")
    ap.add_argument("--cases", default="full-c1-t1,sliding-c1-t1,full-c1-t8,sliding-c1-t8,full-c16-t1,sliding-c16-t1,full-c32-t1,sliding-c32-t1")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--trace-dir", default="", help="also save a traced launch of each case with the warmer (L2 flushed)")
    a = ap.parse_args()
    vm = VM(groups=2)
    tvm = VM(groups=2, trace=True) if a.trace_dir else None
    flush = L2Flush(vm.torch_device)
    stream = timing_stream(vm)
    rows = []
    kind_w: tuple[str, object] | None = None
    for name in a.cases.split(","):
        case = get_case(name)
        if kind_w is None or kind_w[0] != case.kind:
            kind_w = None  # the last kind's 1.1 GB freed before the next is made
            torch.cuda.empty_cache()
            kind_w = (case.kind, make_layer_weights(SHARD, 1 if case.kind == "full" else 0, SEED, device="cuda"))
        w = kind_w[1]
        state = make_state(SHARD, case.kind, case.conversations, case.tokens_each, case.context, SEED + 1, device="cuda")
        s0 = make_inputs(SHARD, state, SEED)
        lps = {t: lower_layer(SHARD, case.kind, case.conversations, case.tokens_each, state.slots, tiles=t) for t in (BASE, WARM)}
        bufs = {t: bind_layer(lp, w, state.clone(), s0, device="cuda") for t, lp in lps.items()}
        lds = {t: vm.load(lps[t].stream, bufs[t]) for t in lps}
        assert lps[WARM].warm, f"{name}: no warmer at {case.tokens} tokens"
        # the small layer alone: its own program of the warmer's tensors
        wi = code_warm.warm_inputs(case.kind, case.tokens_each, "cuda")
        small = lower_layer(code_warm.CFG, case.kind, 1, case.tokens_each, wi.state.slots, tiles=WARM.for_warm(case.tokens, case.tokens_each))
        small_ld = vm.load(small.stream, bind_layer(small, wi.weights, wi.state, wi.s, device="cuda"))
        for ld in (*lds.values(), small_ld):
            ld.run(ld.next_step)

        cold = {t: flush.restoring(bufs[t]["s"], s0) for t in (BASE, WARM)}

        def code() -> None:
            cold[BASE]()
            small_ld.run(small_ld.next_step, stream=stream, check=False)

        ways = (("cold", BASE, cold[BASE]), ("code", BASE, code), ("hot", BASE, lambda: bufs[BASE]["s"].copy_(s0, non_blocking=True)), ("warmer", WARM, cold[WARM]))
        row: dict = {"case": name, "instructions": len(lps[BASE].stream), "warm_instructions": len(lps[WARM].stream) - len(lps[BASE].stream)}
        for _ in range(a.rounds):
            for how, t, before in ways:
                ld = lds[t]
                ts = time_ms(lambda _r: ld.run(ld.next_step, stream=stream, check=False), stream, a.runs, before=before)
                row.setdefault(f"{how}_us", []).append(statistics.median(ts) * 1e3)
        for ld in (*lds.values(), small_ld):
            ld.check(stream)
        print(name, " ".join(f"{k} {' / '.join(f'{x:.1f}' for x in v)}" for k, v in row.items() if k.endswith("_us")), flush=True)
        rows.append(row)
        if tvm is not None:
            b = bind_layer(lps[WARM], w, state.clone(), s0, device="cuda")
            tl = tvm.load(lps[WARM].stream, b)
            tl.run(step=0)
            flush.restoring(b["s"], s0)()
            tl.run(step=1)
            tr = tl.trace()
            Path(a.trace_dir).mkdir(parents=True, exist_ok=True)
            tr.save(Path(a.trace_dir) / f"trace-{name}-warmer.npz")
            del tl, b
        del lds, bufs, small_ld
    with open(a.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
