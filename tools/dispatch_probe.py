"""Where the per-instruction dispatch time goes (issue 3), on the GPU.

1. How long `nanosleep.u32 t` really sleeps on this GPU (clock64 cycles and
   ns), for the naps the controller and the counter waits take.
2. Empty-instruction dispatch (us per instruction per block) for kernel
   variants built with different nap settings, groups and modes.
3. One traced run of empty instructions: per group, the time between the
   starts of consecutive instructions, and claim -> ready per instruction.

    PYTHONPATH=. python3 tools/dispatch_probe.py --out out/dispatch_probe.json
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch

from gpuvm.device import VM
from gpuvm.device.bench import dispatch_overhead
from gpuvm.device.programs import nop_stream
from gpuvm.isa import Stamp

NAP_SRC = r"""
extern "C" __global__ void nap(unsigned ns, unsigned reps, unsigned long long* out) {
    unsigned long long c0, c1, g0, g1;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(c0));
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g0));
    for (unsigned i = 0; i < reps; ++i) asm volatile("nanosleep.u32 %0;" ::"r"(ns));
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(c1));
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g1));
    if (threadIdx.x == 0) { out[0] = c1 - c0; out[1] = g1 - g0; }
}
"""


def nap_lengths() -> dict[str, dict[str, float]]:
    from cuda.core import Device, LaunchConfig, ObjectCode, launch

    from gpuvm.device.build import compile_source

    dev = Device()
    dev.set_current()
    cubin, _ = compile_source(NAP_SRC, "nap.cu", [], [])
    k = ObjectCode.from_cubin(cubin).get_kernel("nap")
    stream = dev.create_stream()
    out = torch.zeros(2, dtype=torch.int64, device="cuda")
    torch.cuda.synchronize()
    res = {}
    reps = 2000
    for ns in (0, 32, 64, 128, 256, 512, 1000, 2000):
        for _ in range(2):  # the first launch loads the module
            launch(stream, LaunchConfig(grid=1, block=32), k, np.uint32(ns), np.uint32(reps), np.uint64(out.data_ptr()))
        stream.sync()
        cyc, gns = (int(v) for v in out.cpu())
        res[str(ns)] = {"cycles": cyc / reps, "ns": gns / reps}
        print(f"nanosleep {ns:5d} ns: {cyc / reps:8.0f} cycles, {gns / reps:7.0f} ns", flush=True)
    return res


VARIANTS = {
    "nap32": (),  # the default build
    "spin": (("GVM_HANDOFF_NAP_NS", "0"),),
    "spin_wait0": (("GVM_HANDOFF_NAP_NS", "0"), ("GVM_WAIT_NAP_MIN", "0"), ("GVM_WAIT_NAP_MAX", "0")),
}


def trace_legs(vm: VM, n_per_block: int = 200) -> dict[str, float]:
    loaded = vm.load(nop_stream(vm.n_blocks * n_per_block), {})
    loaded.run(0)
    loaded.run(1)
    tr = loaded.trace()
    r = tr.records
    clk = r["clock"].astype(np.int64)
    ready, done, claim = clk[:, int(Stamp.READY)], clk[:, int(Stamp.DONE)], clk[:, int(Stamp.CLAIM)]
    periods, lat, run = [], [], []
    for sm in np.unique(r["sm"]):
        for g in np.unique(r["group"][r["sm"] == sm]):
            m = (r["sm"] == sm) & (r["group"] == g)
            o = np.argsort(ready[m])
            rd, dn = ready[m][o], done[m][o]
            periods.extend(np.diff(rd).tolist())
            run.extend((dn - rd).tolist())
        lat.extend((ready[r["sm"] == sm] - claim[r["sm"] == sm]).tolist())
    out = {
        "group_period_cycles_median": float(np.median(periods)),
        "ready_to_done_cycles_median": float(np.median(run)),
        "claim_to_ready_cycles_median": float(np.median(lat)),
        "claim_to_ready_cycles_p90": float(np.percentile(lat, 90)),
    }
    print("  trace:", {k: round(v) for k, v in out.items()}, flush=True)
    return out


def layer_times(variants: list[str], cases: tuple[str, ...] = ("full-c1-t1", "sliding-c1-t1", "sliding-c32-t8")) -> dict[str, float]:
    """Dynamic and static time of whole layers (L2 flushed) on each variant's full kernel."""
    from gpuvm.device.bench import L2Flush, time_ms, timing_stream
    from gpuvm.gpu_sweep import SEED
    from gpuvm.muse.cases import get_case
    from gpuvm.muse.config import SHARD
    from gpuvm.muse.lowering import bind_layer, lower_layer
    from gpuvm.muse.state import make_inputs, make_state
    from gpuvm.muse.weights import make_layer_weights

    vms = {name: VM(groups=2, defines=VARIANTS[name]) for name in variants}
    flush = L2Flush(torch.device("cuda", 0))
    out = {}
    for kind in ("full", "sliding"):
        w = make_layer_weights(SHARD, 1 if kind == "full" else 0, SEED, device="cuda")
        for cname in cases:
            case = get_case(cname)
            if case.kind != kind:
                continue
            state = make_state(SHARD, kind, case.conversations, case.tokens_each, case.context, SEED + 1, device="cuda")
            s0 = make_inputs(SHARD, state, SEED)
            lp = lower_layer(SHARD, kind, case.conversations, case.tokens_each, state.slots)
            for name, vm in vms.items():
                ld = vm.load(lp.stream, bind_layer(lp, w, state.clone(), s0, device="cuda"))
                ts = timing_stream(vm)
                for mode in ("dynamic", "static"):
                    t = time_ms(lambda r: ld.run(ld.next_step, mode, check=False, stream=ts), ts, 20, before=flush)
                    ld.check(ts)
                    out[f"{name}/{cname}/{mode}"] = float(np.median(t)) * 1e3
                    print(f"{name:12s} {cname:16s} {mode:8s} {out[f'{name}/{cname}/{mode}']:8.1f} us", flush=True)
        del w
        torch.cuda.empty_cache()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out/dispatch_probe.json")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    a = ap.parse_args()
    res: dict[str, object] = {"device": torch.cuda.get_device_name(0)}
    res["nap"] = nap_lengths()
    disp: dict[str, object] = {}
    for name in a.variants.split(","):
        for groups in (1, 2, 4):
            vm = VM(groups=groups, max_groups=4 if groups > 2 else 2, muse_ops=False, defines=VARIANTS[name])
            for mode in ("dynamic", "static"):
                r = dispatch_overhead(vm, mode)
                key = f"{name}/g{groups}/{mode}"
                disp[key] = r
                print(f"{key:24s} {r['us_per_instr_per_block']:.3f} us per instr per block", flush=True)
        tvm = VM(groups=2, trace=True, muse_ops=False, defines=VARIANTS[name])
        disp[f"{name}/trace"] = trace_legs(tvm)
    res["dispatch"] = disp
    res["layer_us"] = layer_times(a.variants.split(","))
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
