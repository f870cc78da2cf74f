"""What the kernel's code coming from HBM costs a layer of `gpuvm sweep`'s
table (issue 6: instruction-cache warming). The sweep flushes the L2 before
every timed launch, and that evicts the VM's code too, so each op's first
instance on the GPU fetches its code from HBM. This times each case three
ways on one loaded program:

  cold:  L2 flushed, then the layer (the sweep's figure);
  code:  L2 flushed, then a SMALL-dims layer of the same kind and tokens per
         conversation (same kernel, same op paths, ~MBs of data) untimed,
         then the layer: its code is in L2, its weights are not;
  hot:   no flush (code and whatever else the last launch left in L2).

cold - code is what an in-launch warmer could win at most.

    PYTHONPATH=. python3 tools/code_warm_probe.py --out out/code_warm.json
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch

from gpuvm.device import VM
from gpuvm.device.bench import L2Flush, time_ms, timing_stream
from gpuvm.gpu_sweep import SEED
from gpuvm.muse.cases import get_case, small_case
from gpuvm.muse.config import SHARD, SMALL
from gpuvm.muse.lowering import bind_layer, lower_layer
from gpuvm.muse.state import make_inputs, make_state
from gpuvm.muse.weights import make_layer_weights


def _loaded(vm: VM, cfg, case, weights):
    state = make_state(cfg, case.kind, case.conversations, case.tokens_each, case.context, SEED + 1, device="cuda")
    s0 = make_inputs(cfg, state, SEED)
    lp = lower_layer(cfg, case.kind, case.conversations, case.tokens_each, state.slots)
    b = bind_layer(lp, weights, state, s0, device="cuda")
    ld = vm.load(lp.stream, b)
    ld.run(step=0)
    torch.cuda.synchronize()
    return ld, (state, b, s0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="out/code_warm.json")
    ap.add_argument("--cases", default="full-c1-t1,sliding-c1-t1,full-c1-t8,sliding-c16-t1,full-c16-t8")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    vm = VM(groups=2)
    flush = L2Flush(vm.torch_device)
    stream = timing_stream(vm)
    weights: dict[tuple[str, str], object] = {}
    rows = []
    for name in a.cases.split(","):
        case = get_case(name)
        for key in [k for k in weights if k[0] == "shard"]:
            if key[1] != case.kind:
                del weights[key]
        torch.cuda.empty_cache()
        for cfg in (SHARD, SMALL):
            if (cfg.name, case.kind) not in weights:
                weights[(cfg.name, case.kind)] = make_layer_weights(cfg, 1 if case.kind == "full" else 0, SEED, device="cuda")
        ld, keep = _loaded(vm, SHARD, case, weights[("shard", case.kind)])
        wl, wkeep = _loaded(vm, SMALL, small_case(case, SMALL), weights[("small", case.kind)])

        # every run on the same input: a run updates its residual stream in place
        def reset() -> None:
            keep[1]["s"].copy_(keep[2], non_blocking=True)
            wkeep[1]["s"].copy_(wkeep[2], non_blocking=True)

        def cold() -> None:
            reset()
            flush()

        def warm_code() -> None:
            cold()
            wl.run(wl.next_step, stream=stream, check=False)

        row = {"case": name}
        for r in range(a.rounds):
            for how, before in (("cold", cold), ("code", warm_code), ("hot", reset)):
                t = time_ms(lambda _r: ld.run(ld.next_step, stream=stream, check=False), stream, a.runs, before=before)
                row.setdefault(f"{how}_us", []).append(statistics.median(t) * 1e3)
        ld.check(stream)
        wl.check(stream)
        print(name, " ".join(f"{k} {' / '.join(f'{x:.1f}' for x in v)}" for k, v in row.items() if k != "case"), flush=True)
        rows.append(row)
        del ld, wl, keep, wkeep
    with open(a.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
