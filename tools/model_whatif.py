#!/usr/bin/env python3
"""What the fitted scheduler model says a change would be worth, before any
GPU time is spent on it.

    python3 tools/model_whatif.py --set signal_latency_ns=*0.5
    python3 tools/model_whatif.py --set GEMM.fixed_ns=*0.5 --set EXPERT_UP.math_fraction=0.6 --cases full-c1-t1,full-c32-t8
    python3 tools/model_whatif.py --tiles qk_tokens=2 --cases full-c32-t8,sliding-c32-t8

Each layer case is lowered as the sweep lowers it and simulated with the fit of
gpuvm/sim/h200_fit.json (tools/calibrate_model.py), routed as the traced run
of that case routed (the fit's stored expert tokens), then again with the
changes: a Hardware field (`signal_latency_ns=3000`) or an opcode's timing
(`GEMM.fixed_ns=...`, `ATTN_CHUNK.math_fraction=...`), each set to a value or
scaled (`=*0.5`), and/or another tiling (`--tiles qk_tokens=2+router_bytes=131072`:
lowering.Tiles fields, the layer lowered with them). The fit's parameters are
effective ones, and the dynamic schedule moves with op lengths in the model as
on the device (a few % either way on the 256-token layers), so a what-if ranks
ideas; it does not replace the A/B on the H200. On tilings it has been wrong
in sign: the router's tiles at 128 KB it put at -1.5 to -2.9% from 8 to 16
tokens, an H100 measured +1.9 to +3.2% (session 67); it has no terms for claim
order (topk_late: +0.0%).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpuvm.isa import Op  # noqa: E402
from gpuvm.muse.cases import get_case  # noqa: E402
from gpuvm.muse.config import SHARD  # noqa: E402
from gpuvm.muse.lowering import Tiles  # noqa: E402
from gpuvm.opspec import ProgramError  # noqa: E402
from gpuvm.sim.fitted import hardware, load  # noqa: E402
from gpuvm.sim.hardware import Hardware, OpTiming  # noqa: E402
from gpuvm.sim.predict import predict_layer  # noqa: E402


def apply(hw: Hardware, change: str) -> Hardware:
    """hw with one `name=value` or `name=*factor` change."""
    name, sep, value = change.partition("=")
    if not sep or not value:
        raise SystemExit(f"--set {change!r}: expected NAME=VALUE or NAME=*FACTOR")
    scale = value.startswith("*")
    try:
        num = float(value[1:] if scale else value)
    except ValueError:
        raise SystemExit(f"--set {change!r}: {value!r} is not a number") from None
    if "." in name:  # an opcode's timing
        op, field = name.split(".", 1)
        if field not in (f.name for f in dataclasses.fields(OpTiming)):
            raise SystemExit(f"--set {change!r}: OpTiming has no field {field!r}")
        if op not in Op.__members__:
            raise SystemExit(f"--set {change!r}: {op!r} is no opcode")
        cur = hw.timing(Op[op])
        new = getattr(cur, field) * num if scale else num
        return dataclasses.replace(hw, ops={**hw.ops, op: dataclasses.replace(cur, **{field: new})})
    if name not in (f.name for f in dataclasses.fields(Hardware)) or name == "ops":
        raise SystemExit(f"--set {change!r}: Hardware has no number {name!r}")
    cur = getattr(hw, name)
    new = cur * num if scale else num
    return dataclasses.replace(hw, **{name: type(cur)(new)})


def tiling(spec: str) -> Tiles:
    """lowering.Tiles from `field=value[+field=value]`, checked by Tiles itself."""
    try:
        return Tiles.parse(spec)
    except ProgramError as e:
        raise SystemExit(f"--tiles: {e}") from None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a change (repeatable)")
    ap.add_argument("--tiles", default="", metavar="FIELD=VALUE[+...]", help="the changed run's tiling (lowering.Tiles fields)")
    ap.add_argument("--cases", default="", help="layer cases, comma-separated (default: the fit's)")
    args = ap.parse_args()
    if not args.set and not args.tiles:
        raise SystemExit("nothing to change: give --set and/or --tiles")
    tiles = tiling(args.tiles) if args.tiles else None
    fit = load()
    rows = {r["case"]: r for r in fit["source"]["cases"]}
    names = [c for c in args.cases.split(",") if c] or list(rows)
    for n in names:
        if n not in rows:
            raise SystemExit(f"{n!r} is not a case of the fit (its cases: {', '.join(rows)})")
    changes = lambda hw: functools.reduce(apply, args.set, hw)  # noqa: E731
    try:
        changes(hardware(fit["params"], fit["source"]["read_bytes_per_s"]))
    except ProgramError as e:
        raise SystemExit(f"--set: {e}") from None
    print(f"{'case':16s} {'trace us':>9s} {'model us':>9s} {'changed us':>10s} {'change':>7s}")
    for n in names:
        r = rows[n]
        base = hardware(fit["params"], r["read_bytes_per_s"])
        changed = changes(base)
        t0 = predict_layer(SHARD, get_case(n), base, expert_tokens=r["expert_tokens"])["time_ns"] / 1e3
        t1 = predict_layer(SHARD, get_case(n), changed, expert_tokens=r["expert_tokens"], tiles=tiles)["time_ns"] / 1e3
        print(f"{n:16s} {r['trace_us']:9.1f} {t0:9.1f} {t1:10.1f} {t1 / t0 - 1:+7.1%}")


if __name__ == "__main__":
    main()
