"""`gpuvm sweep`: a grid of decode cases, checked and timed, written as a table,
CSV, JSON and a PNG plot.

On a GPU each case runs at the real shard's size, and every figure of a row
comes from the same run: gpuvm dynamic, static (instructions on per-SM lists
made on the host; the expert work items still claimed on the GPU) and fully
static (those lists and the items in a fixed round robin), the peer (the layer
as a chain of PyTorch kernels under a CUDA graph) and the floor (MUSE.md's bytes
over the streaming-read bandwidth measured at the start of the sweep).
Without a GPU the CPU backend runs each case at small dims against the
formula-level reference, and the scheduler model predicts the shard's times;
nothing in that table is a GPU measurement, and the output says so.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, Sequence, TextIO

from .cli import UserError
from .muse.cases import DECODE_CASES, DECODE_CONTEXT, Case, get_case
from .step_sweep import StepShape

LIMITS = {"conversations": (1, 64), "tokens": (1, 16), "context": (0, 131_072)}
MAX_TOKENS_PER_STEP = 256


@dataclass(frozen=True)
class SweepArgs:
    cases: tuple[Case, ...]
    backend: str  # 'gpu' | 'cpu'
    runs: int
    out: Path
    plot: bool
    trace: bool
    steps: tuple["StepShape", ...] = ()  # --step: whole decode steps instead of layers


def _ints(text: str, what: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"--{what} takes comma-separated integers, got {text!r}") from None
    lo, hi = LIMITS[what]
    for v in vals:
        if not lo <= v <= hi:
            raise UserError(f"--{what} {v} is out of range [{lo}, {hi}]")
    if not vals:
        raise UserError(f"--{what} is empty")
    return vals


def parse_args(argv: Sequence[str]) -> SweepArgs:
    ap = argparse.ArgumentParser(prog="gpuvm sweep", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", help="comma-separated case names (default: the 12 decode cases of MUSE.md)")
    ap.add_argument("--kind", default="full,sliding", help="layer kinds: full, sliding (default both)")
    ap.add_argument("--conversations", help="grid instead of --cases: e.g. 1,16,32")
    ap.add_argument("--tokens", help="new tokens per conversation, e.g. 1,8")
    ap.add_argument("--context", type=str, default=str(DECODE_CONTEXT), help=f"cached tokens per conversation (default {DECODE_CONTEXT})")
    ap.add_argument("--backend", choices=("auto", "gpu", "cpu"), default="auto")
    ap.add_argument("--runs", type=int, default=20, help="timed runs per figure, median taken (>= 20 on a GPU)")
    ap.add_argument("--out", default="out/sweep", help="folder for sweep.json, sweep.csv, sweep.png (default ./out/sweep; results/ holds the committed runs)")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--trace", action="store_true", help="also record one traced run per case, dynamic, static and fully static (GPU): trace-<case>.npz, trace-<case>-static.npz, trace-<case>-fixed.npz")
    ap.add_argument("--step", action="store_true", help="whole decode steps (62 layers, LM head, argmax) for the --conversations x --tokens grid")
    try:
        a = ap.parse_args(list(argv))
    except SystemExit as e:  # argparse already printed its one-line error
        raise UserError("bad arguments (see gpuvm sweep --help)") if e.code else e
    kinds = [k.strip() for k in a.kind.split(",") if k.strip()]
    for k in kinds:
        if k not in ("full", "sliding"):
            raise UserError(f"--kind {k!r}: choose full or sliding")
    if a.cases and (a.conversations or a.tokens):
        raise UserError("give either --cases or a --conversations/--tokens grid, not both")
    steps: list[StepShape] = []
    if a.step:
        if a.cases or a.trace:
            raise UserError("--step runs the --conversations x --tokens grid; --cases and --trace are for layers")
        ctx = _ints(a.context, "context")
        if len(ctx) != 1:
            raise UserError("--step takes one --context")
        steps = [StepShape(c, n, ctx[0]) for c in _ints(a.conversations or "1,16,32", "conversations") for n in _ints(a.tokens or "1,8", "tokens")]
    if a.step:
        cases = []
    elif a.cases:
        try:
            cases = [get_case(n.strip()) for n in a.cases.split(",") if n.strip()]
        except ValueError as e:
            raise UserError(str(e).split(";")[0] + " (see the names in MUSE.md's decode cases, e.g. full-c1-t1)") from None
    elif a.conversations or a.tokens:
        convs = _ints(a.conversations or "1,16,32", "conversations")
        toks = _ints(a.tokens or "1,8", "tokens")
        ctx = _ints(a.context, "context")
        cases = [Case(f"{k}-c{c}-t{n}" + (f"-k{x}" if x != DECODE_CONTEXT else ""), k, c, n, x) for k in kinds for c in convs for n in toks for x in ctx]
    else:
        cases = [c for c in DECODE_CASES if c.kind in kinds]
    for c in [*cases, *steps]:
        if c.tokens > MAX_TOKENS_PER_STEP:
            raise UserError(f"case {c.name}: {c.tokens} tokens per step is over the {MAX_TOKENS_PER_STEP} a decode step takes")
    if a.runs < 1 or a.runs > 10_000:
        raise UserError(f"--runs {a.runs} is out of range [1, 10000]")
    from .env import has_gpu

    backend = a.backend
    if backend == "auto":
        backend = "gpu" if has_gpu() else "cpu"
    elif backend == "gpu" and not has_gpu():
        raise UserError("--backend gpu: no CUDA GPU is visible on this machine")
    if backend == "gpu" and a.runs < 20:
        raise UserError("--runs must be >= 20 on a GPU (MEASURE.md: median of >= 20 timed runs)")
    return SweepArgs(tuple(cases), backend, a.runs, Path(a.out), not a.no_plot, a.trace, tuple(steps))


def progress(items: Sequence, stream: TextIO | None = None) -> Iterable:
    """Yield items while drawing a one-line progress bar with the current case
    (on sys.stderr as it is when called: a default bound at import outlives a swapped stream)."""
    stream = stream or sys.stderr
    n = len(items)
    t0 = time.monotonic()
    for i, it in enumerate(items):
        done = int(30 * i / n)
        stream.write(f"\r[{'#' * done}{'.' * (30 - done)}] {i}/{n} {it.name:<22} {time.monotonic() - t0:6.1f}s")
        stream.flush()
        yield it
    stream.write(f"\r[{'#' * 30}] {n}/{n} {'done':<22} {time.monotonic() - t0:6.1f}s\n")
    stream.flush()


# ---- CPU: check at small dims, model at shard size ------------------------------
def cpu_case(case: Case, seed: int = 0) -> dict:
    """CPU backend vs reference at SMALL dims, and the model's shard prediction."""
    import random

    import numpy as np

    from .cpu import run_stream
    from .muse.cases import small_case
    from .muse.config import SHARD, SMALL
    from .muse.lowering import bind_layer, lower_layer
    from .muse.reference import reference_layer
    from .muse.state import make_inputs, make_state
    from .muse.weights import make_layer_weights
    from .sim.fitted import fitted_hardware
    from .sim.hardware import Hardware
    from .sim.predict import predict_layer

    sc = small_case(case, SMALL) if case.context >= SMALL.window * 4 else replace(case, name=case.name + "@small")
    layer = 1 if case.kind == "full" else 0
    w = make_layer_weights(SMALL, layer, seed)
    st = make_state(SMALL, case.kind, sc.conversations, sc.tokens_each, sc.context, seed + 1)
    s = make_inputs(SMALL, st, seed + 2)
    ref = reference_layer(SMALL, w, st.clone(), s.clone(), case.kind)
    lp = lower_layer(SMALL, case.kind, sc.conversations, sc.tokens_each, st.slots)
    b = bind_layer(lp, w, st, s)
    t0 = time.perf_counter()
    run_stream(lp.stream, b, step=0, order="random", rng=random.Random(seed))
    cpu_s = time.perf_counter() - t0
    out = b["s"]
    err = float((out - ref.s_out).norm() / ref.s_out.norm())
    row = {
        "case": case.name,
        "kind": case.kind,
        "conversations": case.conversations,
        "tokens_each": case.tokens_each,
        "tokens": case.tokens,
        "context": case.context,
        "small_context": sc.context,
        "small_err": err,
        "small_ok": bool(err <= 1e-2 and np.isfinite(err)),
        "cpu_backend_s": cpu_s,
        "instructions_small": len(lp.stream),
    }
    hw = fitted_hardware(Hardware().hbm_bytes_per_s)  # fitted to H200 traces, at MUSE.md's nominal read
    for mode in ("dynamic", "static"):
        p = predict_layer(SHARD, case, hw, mode=mode)
        row[f"model_{mode}_us"] = p["time_ns"] / 1e3
        row["model_floor_us"] = p["floor_ns"] / 1e3
        row["instructions_shard"] = p.get("instructions", None)
    row["model_dynamic_over_floor"] = row["model_dynamic_us"] / row["model_floor_us"]
    return row


CPU_COLUMNS = [
    ("case", "case", "{}"),
    ("tokens", "T", "{}"),
    ("small_err", "err@small", "{:.1e}"),
    ("model_floor_us", "floor µs*", "{:.1f}"),
    ("model_dynamic_us", "model dyn µs", "{:.1f}"),
    ("model_static_us", "model static µs", "{:.1f}"),
    ("model_dynamic_over_floor", "dyn/floor", "{:.2f}"),
]

GPU_COLUMNS = [
    ("case", "case", "{}"),
    ("tokens", "T", "{}"),
    ("err", "err", "{:.1e}"),
    ("experts_hit", "experts", "{}"),
    ("floor_us", "floor µs", "{:.1f}"),
    ("dynamic_us", "gpuvm dyn µs", "{:.1f}"),
    ("static_us", "gpuvm static µs", "{:.1f}"),
    ("fixed_us", "fully static µs", "{:.1f}"),
    ("peer_us", "peer µs", "{:.1f}"),
    ("dyn_over_floor", "dyn/floor", "{:.2f}"),
    ("peer_over_dyn", "peer/dyn", "{:.2f}"),
    ("static_over_dyn", "static/dyn", "{:.2f}"),
    ("fixed_over_dyn", "fully static/dyn", "{:.2f}"),
]


def table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """A plain text table of rows."""
    cells = [[h for _, h, _ in columns]]
    for r in rows:
        cells.append([fmt.format(r[k]) if r.get(k) is not None else "-" for k, _, fmt in columns])
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_outputs(out: Path, meta: dict, rows: list[dict], columns: list[tuple[str, str, str]], plot: bool) -> list[Path]:
    """sweep.json, sweep.csv and (optionally) sweep.png under out."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "sweep.json", out / "sweep.csv"]
    paths[0].write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(paths[1], "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=keys)
        wr.writeheader()
        wr.writerows(rows)
    if plot:
        paths.append(_plot(out / "sweep.png", meta, rows))
    return paths


def _plot(path: Path, meta: dict, rows: list[dict]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gpu = meta.get("backend") == "gpu"
    series = (
        [("dynamic_us", "gpuvm dynamic", "o-"), ("static_us", "gpuvm static", "s--"), ("fixed_us", "gpuvm fully static", "d:"), ("peer_us", "peer (PyTorch + graph)", "^-"), ("floor_us", "floor (bytes / measured BW)", "kx:")]
        if gpu
        else [("model_dynamic_us", "model: gpuvm dynamic", "o-"), ("model_static_us", "model: gpuvm static", "s--"), ("model_floor_us", "floor at nominal BW", "kx:")]
    )
    kinds = sorted({r["kind"] for r in rows})
    fig, axes = plt.subplots(1, len(kinds), figsize=(6 * len(kinds), 4.2), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        rs = sorted((r for r in rows if r["kind"] == kind), key=lambda r: r["tokens"])
        for key, label, style in series:
            pts = [(r["tokens"], r[key]) for r in rs if r.get(key) is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens per step")
        ax.set_ylabel("µs per layer step")
        ax.set_title(f"{kind} layer")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    src = f"{meta.get('device')} · commit {meta.get('commit')} · {meta.get('date')}"
    if not gpu:
        src = "NO GPU: scheduler-model predictions, not measurements · " + src
    fig.suptitle(src, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def run_rows(items: Sequence, run: Callable[[object], dict], head: Callable[[object], dict],
             save: Callable[[list[dict]], object] | None = None) -> list[dict]:
    """run(item) for each item under a progress bar; an item that raises gets
    a row of head(item) with ok False and the error (the other items still
    run, and the exit code says one failed). save(rows) after each row, so
    that a run stopped part way (a job's time limit) keeps the rows it made."""
    rows: list[dict] = []
    for c in progress(items):
        try:
            rows.append(run(c))
        except Exception as e:
            msg = f"{type(e).__name__}: {e}".splitlines()[0][:400]
            print(f"\ngpuvm sweep: {c.name} failed: {msg}", file=sys.stderr)
            rows.append({**head(c), "ok": False, "error": msg})
        if save is not None and len(rows) < len(items):
            save(rows)
    return rows


def partial_saver(out: Path, meta: dict, columns: list[tuple[str, str, str]], n: int) -> Callable[[list[dict]], object]:
    """save for run_rows: sweep.json and sweep.csv of the rows so far, meta["partial"] saying how many."""
    return lambda rows: write_outputs(out, {**meta, "partial": f"{len(rows)} of {n} rows"}, rows, columns, False)


def _plot_step(path: Path, meta: dict, rows: list[dict]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rs = sorted((r for r in rows if r.get("dynamic_us") is not None), key=lambda r: r["tokens"])
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for key, label, style in (("dynamic_us", "gpuvm dynamic (one launch)", "o-"), ("static_us", "gpuvm static", "s--"), ("fixed_us", "gpuvm fully static", "d:"),
                              ("chain_us", "same ops, one launch each (graph)", "^-"), ("floor_us", "floor (bytes / measured BW)", "kx:")):
        ax.plot([r["tokens"] for r in rs], [r[key] / 1e3 for r in rs], style, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens per step (conversations x tokens each)")
    ax.set_ylabel("ms per decode step")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle(f"whole step · {meta.get('device')} · commit {meta.get('commit')} · {meta.get('date')}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def step_sweep_main(a: SweepArgs, meta: dict) -> int:
    from . import step_sweep as ss

    meta["steps"] = [c.name for c in a.steps]
    if a.backend == "cpu":
        print("gpuvm sweep --step: no GPU on this machine. Running the step at small dims (d=256) on the CPU backend against the "
              "reference, timing the build of the shard's step program, and the scheduler model's time of that program "
              "(fitted to H200 layer traces). No GPU figure: model predictions, not measurements.", file=sys.stderr)
        columns = ss.CPU_COLUMNS
        rows = [ss.cpu_step(c) for c in progress(list(a.steps))]
    else:
        columns = ss.GPU_COLUMNS
        gs = ss.GpuStepSweep(runs=a.runs)
        meta.update(gs.meta())
        rows = run_rows(list(a.steps), gs.case, lambda c: {"case": c.name, "tokens": c.tokens}, partial_saver(a.out, meta, columns, len(a.steps)))
    paths = write_outputs(a.out, meta, rows, columns, False)
    if a.plot and a.backend == "gpu":
        paths.append(_plot_step(a.out / "sweep.png", meta, rows))
    from .sim.fitted import fit_source

    note = ("* floor of the model's routing (the benchmarks' skew in every layer) at the nominal 4.42 TB/s of MUSE.md; model: "
            + fit_source()) if a.backend == "cpu" else f"floor: every layer's bytes (its experts hit) + the LM head / {meta['read_bw_TBps']:.2f} TB/s streaming-read bandwidth measured in this run"
    return report(rows, columns, paths, note, "step(s) failed")


def report(rows: list[dict], columns: list[tuple[str, str, str]], paths: list[Path], note: str | None, failed: str) -> int:
    """Print the table, the note under it and the files written; 1 if a row failed."""
    print(table(rows, columns))
    if note:
        print(note)
    print("wrote " + ", ".join(str(p) for p in paths))
    bad = [r["case"] for r in rows if not r.get("small_ok", r.get("ok", True))]
    if bad:
        print(f"gpuvm sweep: {len(bad)} {failed}: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


def sweep_main(argv: Sequence[str]) -> int:
    a = parse_args(argv)
    from .env import machine

    meta = machine()
    meta["backend"] = a.backend
    if a.steps:
        return step_sweep_main(a, meta)
    meta["cases"] = [c.name for c in a.cases]
    if a.backend == "cpu":
        print(
            "gpuvm sweep: no GPU on this machine. Running the CPU backend at small dims (d=256) against the "
            "reference, and the scheduler model at the shard's size (fitted to H200 traces: gpuvm/sim/h200_fit.json). "
            "These times are model predictions, not measurements.",
            file=sys.stderr,
        )
        columns = CPU_COLUMNS
        rows = [cpu_case(c) for c in progress(list(a.cases))]
    else:
        from .gpu_sweep import GpuSweep

        columns = GPU_COLUMNS
        gs = GpuSweep(runs=a.runs, trace_dir=a.out if a.trace else None)
        meta.update(gs.meta())
        rows = run_rows(list(a.cases), gs.case, lambda c: {"case": c.name, "kind": c.kind, "tokens": c.tokens}, partial_saver(a.out, meta, columns, len(a.cases)))
    paths = write_outputs(a.out, meta, rows, columns, a.plot)
    from .sim.fitted import fit_source

    note = ("* floor at the nominal 4.42 TB/s of MUSE.md; err@small: CPU backend vs reference at d=256; model: "
            + fit_source() if a.backend == "cpu"
            else f"floor: MUSE.md bytes / {meta['read_bw_TBps']:.2f} TB/s streaming-read bandwidth measured in this run")
    return report(rows, columns, paths, note, "case(s) out of tolerance")
