#!/usr/bin/env python3
"""Fit the scheduler model (gpuvm/sim) to GPU traces of the layer cases.

    python3 tools/calibrate_model.py results/h200-s67/final-7c15528/traces.tgz --write --commit 7c15528 --expert-order index
    python3 tools/calibrate_model.py TRACES --check       # the fit in gpuvm/sim/h200_fit.json against them

The model's defaults are estimates (gpuvm/sim/hardware.py); on the H200 they
predicted the layers 2.2-2.4x faster than they ran. This fits what the traces
can pin down: each opcode's fixed cost and matrix rate (Hardware.ops), and the
per-load bandwidth cap, memory latency, L2 rate, signal latency and cold-code
cost. Each dynamic trace (trace-<case>.npz; the -static and -fixed ones are
held out, run on the lists their blocks ran) gives its case, the expert tokens its run routed and the
read bandwidth measured in that run; the layer is lowered again as the sweep
lowered it (same instruction count, checked) and simulated. The fit minimises,
summed over the cases, twice the squared log ratio of model to trace for the
layer's span plus half the mean over the layer's ops of those of each op's
phase (first ready to last done) and median run (the ops keep the parameters
apart; the span is what a prediction is for): a pattern search in log space,
a few hundred simulations (about 0.2 s each at the shard's size).

--write stores the fit in gpuvm/sim/h200_fit.json (gpuvm.sim.fitted), with
the traces' commit, device and date, and each case's measured and fitted
spans, so that `gpuvm sweep` on a machine without a GPU predicts with it.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpuvm.muse.cases import get_case  # noqa: E402
from gpuvm.muse.config import SHARD  # noqa: E402
from gpuvm.muse.lowering import Tiles, lower_layer  # noqa: E402
from gpuvm.muse.state import cache_slots  # noqa: E402
from gpuvm.sim import fitted  # noqa: E402
from gpuvm.sim.hardware import Hardware  # noqa: E402
from gpuvm.sim.model import simulate  # noqa: E402
from gpuvm.sim.predict import model_costs  # noqa: E402
from gpuvm.trace.format import Trace  # noqa: E402
from gpuvm.trace.summary import op_stats  # noqa: E402
from gpuvm.trace.timeline import build  # noqa: E402

#: opcodes of a layer whose fixed cost is fitted, and those whose matrix rate is
FIXED_OPS = ("GEMM", "RMSNORM", "QK_ROPE_KV", "ATTN_CHUNK", "ATTN_MERGE", "RESIDUAL", "TOPK", "EXPERT_UP", "EXPERT_DOWN", "EXPERT_COMBINE")
MATH_OPS = ("GEMM", "ATTN_CHUNK", "EXPERT_UP", "EXPERT_DOWN")
#: Hardware fields fitted beside them
GLOBALS = ("load_bytes_per_s", "l2_bytes_per_s", "mem_latency_ns", "signal_latency_ns", "cold_code_ns")


@dataclasses.dataclass
class Case:
    name: str
    mode: str
    stream: object
    costs: list
    items: dict  # the expert lists' items, each its Cost (predict.list_item_costs)
    read_bw: float  # bytes/s, measured in the traced run
    span_ns: float
    ops: dict[str, tuple[float, float]]  # op name -> (phase, median run) ns
    expert_tokens: list[int]
    lists: list[list[int]] | None = None  # static runs: the lists the device ran


def _targets(trace: Trace) -> tuple[float, dict[str, tuple[float, float]]]:
    tl = build(trace)
    return tl.span, {s.name: (s.phase, s.run_median) for s in op_stats(tl) if not s.name.startswith("W.")}


def load_cases(paths: list[Path], modes: tuple[str, ...], longest_first: bool = True, tiles: Tiles = Tiles()) -> list[Case]:
    """The traces' cases, lowered again; a mode's suffix: '' dynamic, -static,
    -fixed (fully static: the expert items in a fixed round robin, Tiles.expert_fixed);
    longest_first: the expert lists' order the traced code walked (opspec.expert_items);
    tiles: the traced code's lowering (where today's defaults differ)."""
    out = []
    for p in sorted(paths):
        stem = p.stem.removeprefix("trace-")
        mode = "static" if stem.endswith("-static") else "fixed" if stem.endswith("-fixed") else "dynamic"
        if mode not in modes:
            continue
        name = stem.removesuffix("-static").removesuffix("-fixed")
        tr = Trace.load(p)
        case = get_case(name)
        slots = cache_slots(SHARD, case.kind, case.tokens_each, case.context)
        lp = lower_layer(SHARD, case.kind, case.conversations, case.tokens_each, slots, tiles=dataclasses.replace(tiles, expert_fixed=int(mode == "fixed")))
        if len(lp.stream) != len(tr) or lp.stream.ops[-1].label != tr.labels[-1]:
            raise SystemExit(f"{p}: the lowering gives {len(lp.stream)} instructions, the trace has {len(tr)}: not this code's trace")
        toks = [int(t) for t in tr.meta["expert_tokens"]]
        lists = None
        if mode != "dynamic":  # the lists the device ran: each block's instructions in stream order
            lists = [sorted(np.flatnonzero(tr.records["block"] == b).tolist()) for b in range(int(tr.meta["n_blocks"]))]
        span, ops = _targets(tr)
        out.append(Case(name, mode, lp.stream, *model_costs(lp.stream, toks, longest_first), float(tr.meta["read_bw_TBps"]) * 1e12,
                        span, ops, toks, lists))
    if not out:
        raise SystemExit("no traces of the asked modes")
    return out


def model(case: Case, params: dict[str, float]) -> tuple[float, dict[str, tuple[float, float]]]:
    hw = fitted.hardware(params, case.read_bw)
    mode = "dynamic" if case.mode == "dynamic" else "static"
    r = simulate(case.stream, hw, mode, case.lists, costs=case.costs, item_costs=case.items)
    return _targets(r.trace)


def error(cases: list[Case], params: dict[str, float]) -> float:
    total = 0.0
    for c in cases:
        span, ops = model(c, params)
        op_err = [math.log(ops[n][k] / v[k]) ** 2 for n, v in c.ops.items() if n in ops for k in (0, 1) if v[k] > 0 and ops[n][k] > 0]
        total += 2 * math.log(span / c.span_ns) ** 2 + 0.5 * (sum(op_err) / max(1, len(op_err)))
    return total


def start_params(fresh: bool) -> dict[str, float]:
    """The stored fit's parameters (a refit after a model change), or Hardware()'s
    estimates and round guesses for the per-opcode ones."""
    if not fresh and fitted.FIT_PATH.exists():
        return dict(fitted.load()["params"])
    hw = Hardware()
    p = {k: float(getattr(hw, k)) for k in GLOBALS}
    p.update({f"fixed.{op}": 2000.0 for op in FIXED_OPS})
    p.update({f"math.{op}": 0.3 for op in MATH_OPS})
    return p


def fit(cases: list[Case], params: dict[str, float], max_evals: int, log: Callable[..., None] = print) -> tuple[dict[str, float], float]:
    """Pattern search in log space: each parameter times and over a step,
    kept where the error falls; the step shrinks when a pass keeps nothing."""
    best = error(cases, params)
    evals, step, t0 = 1, 2.0, time.time()
    while step > 1.03 and evals < max_evals:
        moved = False
        for k in list(params):
            for f in (step, 1 / step):
                trial = dict(params)
                trial[k] = params[k] * f
                if k.startswith("math.") and trial[k] > 1.0:
                    continue
                e = error(cases, trial)
                evals += 1
                if e < best:
                    best, params, moved = e, trial, True
                    break
        log(f"  step {step:.3f}: error {best:.4f} after {evals} simulations of {len(cases)} cases ({time.time() - t0:.0f} s)", flush=True)
        if not moved:
            step = math.sqrt(step)
    return params, best


def report(cases: list[Case], params: dict[str, float]) -> list[dict]:
    rows = []
    for c in cases:
        span, ops = model(c, params)
        rows.append({"case": c.name, "mode": c.mode, "trace_us": c.span_ns / 1e3, "model_us": span / 1e3, "ratio": span / c.span_ns,
                     "read_bytes_per_s": c.read_bw, "expert_tokens": c.expert_tokens})
    return rows


def print_rows(rows: list[dict]) -> None:
    print(f"{'case':16s} {'mode':8s} {'trace us':>9s} {'model us':>9s} {'model/trace':>11s}")
    for r in rows:
        print(f"{r['case']:16s} {r['mode']:8s} {r['trace_us']:9.1f} {r['model_us']:9.1f} {r['ratio']:11.3f}")
    worst = max(abs(math.log(r["ratio"])) for r in rows)
    print(f"worst |log ratio| {worst:.3f} (x{math.exp(worst):.3f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", type=Path, help="a traces.tgz of `gpuvm sweep --trace`, or a folder of trace-*.npz")
    ap.add_argument("--check", action="store_true", help="only report the stored fit against the traces, every mode")
    ap.add_argument("--write", action="store_true", help="store the fit in " + str(fitted.FIT_PATH.relative_to(Path(fitted.__file__).parents[2])))
    ap.add_argument("--max-evals", type=int, default=600)
    ap.add_argument("--fresh", action="store_true", help="start from the estimates, not from the stored fit")
    ap.add_argument("--commit", default="", help="the commit the traces ran (for the stored fit's source)")
    ap.add_argument("--tiles", default="", help="field=value[+field=value] of lowering.Tiles where the traced code's lowering differs from "
                    "today's defaults (7c15528's: down_early=0+expert_cap_up=64+expert_heavy_up=0+lazy_gemm_tokens=0), stored in the fit's source")
    ap.add_argument("--expert-order", choices=("longest", "index"), default="longest",
                    help="the expert lists' order the traced code walked: longest first (GVM_EXP_LPT 2, by chunks of 32 tokens, since session 68) or expert index")
    args = ap.parse_args()
    lpt = args.expert_order == "longest"
    tiles = Tiles.parse(args.tiles)
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.traces
        if folder.is_file():
            with tarfile.open(folder) as tf:
                tf.extractall(tmp, filter="data")
            folder = Path(tmp)
        paths = list(folder.glob("trace-*.npz"))
        if args.check:
            stored = fitted.load()
            print_rows(report(load_cases(paths, ("dynamic", "static", "fixed"), lpt, tiles), stored["params"]))
            return
        cases = load_cases(paths, ("dynamic",), lpt, tiles)
        device = Trace.load(paths[0]).meta.get("device", "")
        start = start_params(args.fresh)
        print(f"{len(cases)} dynamic traces of {device}; fitting {len(start)} parameters", flush=True)
        params, err = fit(cases, start, args.max_evals)
        rows = report(cases, params)
        print_rows(rows)
        check = report(load_cases(paths, ("static", "fixed"), lpt, tiles), params)
        print("held out, the static and fully static traces (lists as the device ran them):")
        print_rows(check)
        for k in sorted(params):
            print(f"  {k:24s} {params[k]:.4g}")
        if args.write:
            fitted.save(params, {"traces": str(args.traces), "commit": args.commit, "expert_lpt": lpt, "tiles": {f.name: getattr(tiles, f.name) for f in dataclasses.fields(Tiles) if getattr(tiles, f.name) != getattr(Tiles(), f.name)}, "device": device,
                                 "read_bytes_per_s": float(np.median([c.read_bw for c in cases])),
                                 "date": time.strftime("%Y-%m-%d"), "error": err, "cases": rows, "held_out": check})
            print(f"wrote {fitted.FIT_PATH}")


if __name__ == "__main__":
    main()
