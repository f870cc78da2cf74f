"""One call on the H200: build, check, time; a short table last and every
figure in JSON.

    PYTHONPATH=. python3 tools/gpu_check.py --out results/gpu_check.json

1. builds: the kernels used below (from the disk cache when unchanged), with
   registers, spills, shared memory, code size, and a per-op report;
2. correctness: pytest tests/gpu (random DAGs vs the CPU backend in dynamic
   and static modes, GEMM at T 1..256 in both dtype paths, watchdog, streams,
   graph capture; also the dispatch and bandwidth targets);
3. timings, each a ratio within this run: the plain streaming-read kernel
   (the floor's bandwidth), the VM's streaming GEMM (T 1 and 8, several
   instruction sizes, loader prefetch on and off, 2 and 4 groups, fewer GEMM
   k-steps in flight), empty instruction dispatch in dynamic and static mode
   at claim depths 1, 2, 4 and 6, stamps on vs off, the warmer on vs off from a
   cold L2, the mixed stream at each claim depth, and the watchdog's time to stop.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuvm.device import VM, WatchdogError, op_report  # noqa: E402
from gpuvm.device.bench import StreamRead, at_claim_depth, dispatch_overhead, gemm_bandwidth, stamp_cost, step_time, warm_effect, weight_rows  # noqa: E402
from gpuvm.device.build import Build  # noqa: E402
from gpuvm.device.programs import gemm_bindings, gemm_stream, nop_stream, stuck_stream  # noqa: E402
from gpuvm.env import machine  # noqa: E402
from gpuvm.isa import DType, Op  # noqa: E402
from gpuvm.program import Stream  # noqa: E402
from gpuvm.tensors import empty  # noqa: E402


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def build_info(b: Build) -> dict[str, object]:
    k = b.kernel
    return {
        "summary": b.summary(),
        "key": b.key,
        "cached": b.cached,
        "registers": k.registers,
        "spill_stores": k.spill_stores,
        "spill_loads": k.spill_loads,
        "stack_frame": k.stack_frame,
        "smem_static": k.smem_static,
        "group_smem": b.layout.group_smem,
        "code_bytes": b.code_bytes,
        "ops": sorted(o.name for o in b.compiled_ops),
    }


def run_pytest(args: list[str]) -> dict[str, object]:
    import pytest

    class Collect:
        def __init__(self) -> None:
            self.outcomes: dict[str, str] = {}

        def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
            if report.when == "call" or report.outcome != "passed":
                self.outcomes[report.nodeid] = report.outcome

    c = Collect()
    rc = pytest.main(["-q", "-p", "no:cacheprovider", *args], plugins=[c])
    counts: dict[str, int] = {}
    for o in c.outcomes.values():
        counts[o] = counts.get(o, 0) + 1
    return {"exit_code": int(rc), "counts": counts, "outcomes": c.outcomes}


def mixed_stream(n_dag: int = 2000) -> tuple[Stream, dict[str, torch.Tensor]]:
    """A random DAG of synthetic ops plus small GEMMs of both paths: every
    op's code is exercised, for the warmer and the stamps."""
    from tests.randprog import random_program

    p = random_program(random.Random(11), n_dag, size=256, max_sleep_ns=500)
    for dt in (DType.BF16, DType.F32):
        tag = dt.name.lower()
        out = p.tensor(f"g_{tag}_out", (8, 512), dt)
        x = p.tensor(f"g_{tag}_x", (8, 1024), dt)
        w = p.tensor(f"g_{tag}_w", (512, 1024), dt, role="weight")
        for n0 in range(0, 512, 32):
            p.op(Op.GEMM, [out, x, w], [n0, 32], label=f"gemm {tag} {n0}")
    s = p.build()
    dev = torch.device("cuda", 0)
    bufs = {t.name: empty(t, dev).normal_() if t.dtype in (DType.F32, DType.BF16) else empty(t, dev) for t in s.tensors}
    return s, bufs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path, help="results JSON")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--skip-tests", action="store_true", help="timings only")
    args = ap.parse_args()
    res: dict[str, object] = {"machine": machine(), "argv": sys.argv}
    table: list[tuple[str, str]] = []
    t_start = time.time()

    log("build: default (2 groups), traced, and the core-ops kernel for 4 groups")
    vm = VM(0, groups=2, trace=False, warm=True)
    vm_t = VM(0, groups=2, trace=True, warm=True)
    vm4 = VM(0, groups=4, trace=False, warm=True, muse_ops=False)
    vm2c = VM(0, groups=2, trace=False, warm=True, muse_ops=False)
    vm2s = VM(0, groups=2, trace=False, warm=True, muse_ops=False, defines=[("GVM_GEMM_STEPS", "5")])
    res["builds"] = {
        "default": build_info(vm.build),
        "trace": build_info(vm_t.build),
        "core_4_groups": build_info(vm4.build),
        "core_2_groups": build_info(vm2c.build),
        "core_2_groups_5_steps": build_info(vm2s.build),
    }
    res["launch"] = {"blocks": vm.n_blocks, "threads": vm.threads, "dynamic_smem": vm.smem, "registers_loaded": vm.registers}
    for name, b in res["builds"].items():  # type: ignore[union-attr]
        log(f"  {name}: {b['summary']}")  # type: ignore[index]
    res["op_report"] = {n: r.__dict__ for n, r in op_report(vm.build.options).items()}

    if not args.skip_tests:
        log("correctness: pytest tests/gpu")
        res["tests"] = run_pytest([str(ROOT / "tests" / "gpu")])
        table.append(("tests/gpu", f"{res['tests']['counts']} (exit {res['tests']['exit_code']})"))  # type: ignore[index]

    log("floor: plain streaming read, 2 GiB")
    floor = StreamRead(vm).measure(args.reps)
    res["stream_read"] = floor
    B = floor["tb_s"]
    table.append(("streaming read (floor B)", f"{B:.3f} TB/s"))

    log("VM streaming GEMM, 1 GiB of bf16 weights")
    gem: list[dict[str, object]] = []
    for tokens in (1, 8):
        bufs = gemm_bindings(gemm_stream(tokens, weight_rows(4096), 4096, 16), vm.torch_device)
        for label, v in (("2 groups", vm), ("2 groups core", vm2c), ("2 groups core, 5 k-steps", vm2s), ("4 groups core", vm4)):
            for rows in (16, 32, 64):
                for pf in (True, False):
                    r = gemm_bandwidth(v, tokens, rows=rows, prefetch=pf, reps=args.reps, bufs=bufs)
                    r.update(kernel=label, ratio=r["tb_s"] / B)
                    gem.append(r)
                    log(f"  T={tokens} {label} rows={rows} prefetch={pf}: {r['tb_s']:.3f} TB/s = {r['ratio']:.1%} of B")
        del bufs
        torch.cuda.empty_cache()
    res["gemm_bandwidth"] = gem
    for tokens in (1, 8):
        best = max((g for g in gem if g["tokens"] == tokens), key=lambda g: g["ratio"])  # type: ignore[arg-type,return-value]
        dflt = next(g for g in gem if g["tokens"] == tokens and g["kernel"] == "2 groups" and g["rows_per_instr"] == 16 and g["prefetch"])
        table.append((f"GEMM T={tokens} (2 groups, 16 rows, prefetch)", f"{dflt['ratio']:.1%} of B; best {best['ratio']:.1%} ({best['kernel']}, {best['rows_per_instr']} rows, prefetch {best['prefetch']})"))

    log("dispatch: empty instructions")
    disp = []
    for label, v in (("2 groups", vm), ("4 groups core", vm4)):
        for depth in sorted({1, 2, v.claim_slots}):
            for mode in ("dynamic", "static"):
                r = dispatch_overhead(v, mode, reps=args.reps, claim_depth=depth)
                r["kernel"] = label
                disp.append(r)
                log(f"  {label} depth {depth} {mode}: {r['us_per_instr_per_block']:.3f} us per instruction per block (raw {r['raw_us_per_instr_per_block']:.3f})")
                table.append((f"dispatch {mode} ({label}, claim depth {depth})", f"{r['us_per_instr_per_block']:.3f} us/instr/block"))
    res["dispatch"] = disp

    log("stamps: the same streams with and without them")
    mixed, mbufs = mixed_stream()
    gs = gemm_stream(8, 32768, 4096, 16)
    gbufs = gemm_bindings(gs, vm.torch_device)
    nops = nop_stream(vm.n_blocks * 200)
    stamps = {}
    for name, (s, b) in {"nops": (nops, {}), "mixed": (mixed, mbufs), "gemm": (gs, gbufs)}.items():
        for mode in ("dynamic", "static"):
            r = stamp_cost(vm.load(s, b), vm_t.load(s, b), mode, args.reps)
            stamps[f"{name}_{mode}"] = r
            log(f"  {name} {mode}: off {r['off_ms']:.3f} ms, on {r['on_ms']:.3f} ms ({r['ratio'] - 1:+.1%})")
            table.append((f"stamps {name} {mode}", f"{r['off_ms'] * 1e3:.1f} -> {r['on_ms'] * 1e3:.1f} us ({r['ratio'] - 1:+.1%})"))
    res["stamps"] = stamps

    log("warmer: cold L2 (256 MB written before each launch) vs warm, warmer off/on")
    res["warm"] = {"traced_mixed": warm_effect(vm_t.load(mixed, mbufs), args.reps), "plain_mixed": warm_effect(vm.load(mixed, mbufs), args.reps)}
    w = res["warm"]["plain_mixed"]  # type: ignore[index]
    table.append(("warmer, cold L2 (off -> on)", f"{w['cold_warm_off_ms'] * 1e3:.1f} -> {w['cold_warm_on_ms'] * 1e3:.1f} us; hot {w['hot_warm_off_ms'] * 1e3:.1f} -> {w['hot_warm_on_ms'] * 1e3:.1f} us"))
    vm.warm = True

    log("static vs dynamic on the mixed stream, at each claim depth (a deep queue can hold work back from idle blocks)")
    lm = vm.load(mixed, mbufs)
    sd: dict[str, float] = {}
    for depth in sorted({1, 2, vm.claim_slots}):
        with at_claim_depth(vm, depth):
            for mode in ("dynamic", "static"):
                sd[f"{mode}_depth{depth}"] = step_time(lm, mode, args.reps)["median_ms"]
        table.append((f"mixed stream dynamic / static, claim depth {depth}", f"{sd[f'dynamic_depth{depth}'] * 1e3:.1f} / {sd[f'static_depth{depth}'] * 1e3:.1f} us"))
    res["mixed_modes"] = sd

    log("watchdog: a wait that can never be met, bound 0.1 s")
    stuck, _ = stuck_stream()
    ls = vm.load(stuck, {})
    t0 = time.perf_counter()
    try:
        ls.run(0, watchdog_s=0.1)
        res["watchdog"] = {"raised": False}
    except WatchdogError as e:
        res["watchdog"] = {"raised": True, "seconds": time.perf_counter() - t0, "message": str(e), "record": e.record}
    vm.load(nop_stream(100), {}).run(0)
    res["watchdog"]["next_launch_ok"] = True  # type: ignore[index]
    table.append(("watchdog (bound 0.1 s)", f"raised after {res['watchdog'].get('seconds', float('nan')):.2f} s" if res["watchdog"]["raised"] else "DID NOT RAISE"))  # type: ignore[union-attr,index]

    res["seconds"] = time.time() - t_start
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1, default=str))
    print("\n" + "=" * 100)
    print(f"{res['machine'].get('device', '?')} | driver {res['machine'].get('driver', '?')} | commit {res['machine'].get('commit', '?')}")  # type: ignore[union-attr]
    for what, figure in table:
        print(f"{what:48s} {figure}")
    print(f"full results: {args.out}")
    return 0 if res.get("tests", {"exit_code": 0})["exit_code"] == 0 else 1  # type: ignore[index]


if __name__ == "__main__":
    sys.exit(main())
