#!/usr/bin/env python3
"""Reschedule draws for A/B runs (NOTES.md session 61): the VM kernel is one
function, so any device-code change makes ptxas schedule every op's hot loops
anew, and that alone moved layers by up to ~1% on an H100. GVM_RESCHED_PROBE=n
(ops/attention.cuh) is a never-run block that does the same to a build and
nothing else; a variant run with a few such draws beside it gives its spread,
and a change is judged against the base's spread instead of one build.

    python3 tools/draws.py out/r1.json out/r2.json    # sched_probe JSONs of one A/B (--draws), any rounds
    python3 tools/draws.py base=probe_2_base.json,probe_3_base.json new=probe_1_new.json,probe_4_new.json
                                                      # a tree A/B's (gpu_session.sh trees): NAME=files names each tree

prints, per case, mode and depth, each variant's median [min, max] over its
draws and rounds, and each against the first variant: the medians' ratio, and
"apart" when the two ranges do not overlap.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

DRAW = "~rs"  # a variant's name, DRAW, the probe's n and "~": one reschedule draw of it
_DRAW_TAG = re.compile(re.escape(DRAW) + "[0-9]+~")


def with_draws(variants: str, draws: list[int]) -> str:
    """The sched_probe --variants list with each variant also built at every
    draw (its defines plus GVM_RESCHED_PROBE=n), named name~rs<n>~ (the
    closing ~ keeps it apart from a tiling's name appended to it)."""
    out = []
    for v in variants.split(","):
        name, _, defs = v.partition(":")
        out.append(v)
        out += [f"{name}{DRAW}{n}~:{'+'.join(d for d in (defs, f'GVM_RESCHED_PROBE={n}') if d)}" for n in draws]
    return ",".join(out)


def draw_spread(*runs: dict[str, float]) -> dict[str, list[float]]:
    """Every row of the runs (case/variant/mode/depth: µs) with its variant's
    draws folded together: the times of the build and of its reschedules."""
    out: dict[str, list[float]] = {}
    for res in runs:
        for key, t in res.items():
            case, variant, rest = key.split("/", 2)
            out.setdefault(f"{case}/{_DRAW_TAG.sub('', variant)}/{rest}", []).append(t)
    return out


def verdicts(spread: dict[str, list[float]]) -> list[str]:
    """One line a row: median [min, max] of n, and against the first variant
    seen for the same case, mode and depth (its base)."""
    base: dict[tuple[str, str], list[float]] = {}
    lines = []
    for key, ts in spread.items():
        case, variant, rest = key.split("/", 2)
        line = f"{key:44s} {statistics.median(ts):10.1f} us [{min(ts):.1f}, {max(ts):.1f}] of {len(ts)}"
        ref = base.setdefault((case, rest), ts)
        if ref is not ts:
            apart = min(ts) > max(ref) or max(ts) < min(ref)
            line += f"  {statistics.median(ts) / statistics.median(ref) - 1:+.1%} against the first{', apart' if apart else ''}"
        lines.append(line)
    return lines


def load_runs(args: list[str]) -> list[dict[str, float]]:
    """The runs of the arguments: a JSON path as it is, or NAME=path[,path...]
    with each row's variant v renamed NAME:v (a tree A/B's runs all call their
    build "base")."""
    runs = []
    for arg in args:
        name, _, paths = arg.rpartition("=")
        for p in paths.split(","):
            res = json.loads(Path(p).read_text())
            if name:
                res = {f"{k.split('/', 1)[0]}/{name}:{k.split('/', 1)[1]}": t for k, t in res.items()}
            runs.append(res)
    return runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="sched_probe --out JSONs, or NAME=F.json[,G.json...] (a tree's)")
    a = ap.parse_args(argv)
    for line in verdicts(draw_spread(*load_runs(a.runs))):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
