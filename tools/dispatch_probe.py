"""Where the per-instruction dispatch time goes (issue 3), on the GPU.

1. How long `nanosleep.u32 t` really sleeps on this GPU (clock64 cycles and
   ns), for the naps the controller and the counter waits take.
2. Empty-instruction dispatch (us per instruction per block) for kernel
   variants built with different nap settings, groups and modes.
3. One traced run of empty instructions: per group, the time between the
   starts of consecutive instructions, and claim -> ready per instruction.
4. The controller's legs (--legs): a build with GVM_CTRL_PROF sums the
   clock64 cycles of each leg of the controller's visits per block
   (runtime/ctrl_prof.cuh); printed per instruction handed out.
5. A dependent chain (--chain): NOPs each waiting on the one before, the
   hand-off a 1-token layer pays at every step of its critical path: us per
   link, per variant, mode and claim depth, and from a traced run the link's
   legs (signal -> ready, ready -> done, done -> signal).

Whole layers and steps on the same build variants: tools/sched_probe.py.

    PYTHONPATH=. python3 tools/dispatch_probe.py --out out/dispatch_probe.json
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch

from gpuvm.device import VM
from gpuvm.device.bench import at_claim_depth, dispatch_overhead, step_time
from gpuvm.device.programs import nop_stream
from gpuvm.isa import Op, Stamp
from gpuvm.program import Program, Stream

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
    "inorder": (("GVM_READY_FIRST", "0"),),  # hand-off in claim order: the group waits on the counters itself
    "nopark": (("GVM_PARK", "0"),),  # ready first without parking (before f945f51)
    "ahead3": (("GVM_CLAIM_AHEAD", "3"),),  # claims finished 3 visits after issue, records 3 visits ahead (the default before e29d1d1)
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


LEGS = ("claim", "record", "decide", "queue", "acquire", "slot", "issue")


def controller_legs(defines: tuple[tuple[str, str], ...] = (), per_block: int = 1000) -> dict[str, dict[str, float]]:
    """Cycles per hand-off in each leg of the controller (median over blocks)."""
    from cuda.bindings import driver

    vm = VM(groups=2, muse_ops=False, defines=(("GVM_CTRL_PROF", "1"),) + tuple(defines))
    out: dict[str, dict[str, float]] = {}
    for mode in ("dynamic", "static"):
        r = dispatch_overhead(vm, mode, per_block=per_block)
        err, ptr, size = driver.cuLibraryGetGlobal(vm._obj.handle, b"gvm_ctrl_prof")
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuLibraryGetGlobal: {err}")
        raw = np.zeros(size // 4, dtype=np.uint32)
        (err,) = driver.cuMemcpyDtoH(raw.ctypes.data, ptr, size)
        acc = raw.reshape(-1, len(LEGS) + 1)[: vm.n_blocks].astype(np.float64)
        per = acc[:, : len(LEGS)] / np.maximum(acc[:, len(LEGS):], 1)
        legs = {name: float(np.median(per[:, k])) for k, name in enumerate(LEGS)}
        legs["total"] = float(np.median(per.sum(axis=1)))
        legs["handoffs_median"] = float(np.median(acc[:, len(LEGS)]))
        legs["us_per_instr_per_block"] = r["us_per_instr_per_block"]
        out[mode] = legs
        print(f"legs {mode:8s} " + " ".join(f"{k}={v:.0f}" for k, v in legs.items() if k != "us_per_instr_per_block")
              + f"  ({r['us_per_instr_per_block']:.3f} us)", flush=True)
    return out


def chain_stream(n: int) -> Stream:
    """n NOPs, each waiting on the one before it (one counter, counts 1..n-1)."""
    p = Program(f"nop chain x{n}")
    c = p.counter("chain")
    p.op(Op.NOP, signal=c)
    for i in range(1, n):
        p.op(Op.NOP, waits=[(c, i)], signal=c)
    return p.build(order="given")


def chain_links(names: list[str], n: int = 2000, trace: bool = True) -> dict[str, object]:
    """us per link of a dependent chain, per variant, mode and claim depth;
    the first variant also traced (unless trace is False)."""
    out: dict[str, object] = {}
    long, short = chain_stream(n), chain_stream(1)
    for name in names:
        vm = VM(groups=2, muse_ops=False, defines=VARIANTS[name])
        for depth in (1, vm.claim_slots):
            with at_claim_depth(vm, depth):
                for mode in ("dynamic", "static"):
                    t_long = step_time(vm.load(long, {}), mode)["median_ms"]
                    t_short = step_time(vm.load(short, {}), mode)["median_ms"]
                    us = (t_long - t_short) * 1e3 / (n - 1)
                    out[f"{name}/d{depth}/{mode}"] = us
                    print(f"chain {name:10s} depth {depth} {mode:8s} {us:.3f} us per link", flush=True)
        if not trace or name != names[0]:
            continue
        tvm = VM(groups=2, trace=True, muse_ops=False, defines=VARIANTS[name])
        loaded = tvm.load(long, {})
        loaded.run(0)
        loaded.run(1)
        gt = loaded.trace().records["globaltimer"].astype(np.int64)
        legs = {
            "signal_to_ready_us": float(np.median(gt[1:, int(Stamp.READY)] - gt[:-1, int(Stamp.SIGNAL)])) / 1e3,
            "ready_to_done_us": float(np.median(gt[:, int(Stamp.DONE)] - gt[:, int(Stamp.READY)])) / 1e3,
            "done_to_signal_us": float(np.median(gt[:, int(Stamp.SIGNAL)] - gt[:, int(Stamp.DONE)])) / 1e3,
            "claim_to_ready_us": float(np.median(gt[:, int(Stamp.READY)] - gt[:, int(Stamp.CLAIM)])) / 1e3,
        }
        out[f"{name}/trace"] = legs
        print(f"chain {name:10s} traced (depth {tvm.claim_depth}): " + " ".join(f"{k}={v:.3f}" for k, v in legs.items()), flush=True)
    return out


def empty_dispatch(names: list[str]) -> dict[str, object]:
    """us per empty instruction per block, per variant, group count and mode,
    and a traced run of each variant."""
    disp: dict[str, object] = {}
    for name in names:
        for groups in (1, 2, 4):
            vm = VM(groups=groups, max_groups=4 if groups > 2 else 2, muse_ops=False, defines=VARIANTS[name])
            for mode in ("dynamic", "static"):
                r = dispatch_overhead(vm, mode)
                key = f"{name}/g{groups}/{mode}"
                disp[key] = r
                print(f"{key:24s} {r['us_per_instr_per_block']:.3f} us per instr per block", flush=True)
        tvm = VM(groups=2, trace=True, muse_ops=False, defines=VARIANTS[name])
        disp[f"{name}/trace"] = trace_legs(tvm)
    return disp


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out/dispatch_probe.json")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--legs", action="store_true", help="only the controller's legs (a GVM_CTRL_PROF build)")
    ap.add_argument("--chain", action="store_true", help="only a dependent chain's links")
    ap.add_argument("--no-trace", action="store_true", help="with --chain: no traced run")
    a = ap.parse_args()
    res: dict[str, object] = {"device": torch.cuda.get_device_name(0)}
    names = a.variants.split(",")
    if a.chain:
        res["chain"] = chain_links(names, trace=not a.no_trace)
    elif a.legs:
        res["legs"] = {name: controller_legs(VARIANTS[name]) for name in names}
    else:
        res["nap"] = nap_lengths()
        res["dispatch"] = empty_dispatch(names)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
