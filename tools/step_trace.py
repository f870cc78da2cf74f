"""One traced decode step of the shard's first layers on the GPU, and how each
op's run time changes from layer to layer (code and data warm in L2 after the
first layer; an op's first run on an SM also fetches its code).

    python3 tools/step_trace.py --layers 8 --shape 1x1 --out out/step-trace-1x1.npz

Writes the trace (`python3 -m gpuvm trace <npz>` reads it) and prints, per op
kind, the median run time (ready to done) in layer 0, layer 1 and the rest.

--timeline builds the experts' timeline probe (GVM_EXPR_PROBE=2048, ops/experts.cuh:
each worker stamps its first item's steps over the last local expert's codes,
so that expert's numbers are garbage) and prints, for the up and the down
list, the median of each interval over layers 2.. (per layer the median over
its items): where an item's time goes in the step, not in a list run alone
(tools/expert_bench.py --timeline). Meaningful where items are one pass
(one token: later passes overwrite the ring's marks).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpuvm.device import VM  # noqa: E402
from gpuvm.device.bench import L2Flush  # noqa: E402
from gpuvm.muse.cases import DECODE_CONTEXT  # noqa: E402
from gpuvm.muse.config import SHARD  # noqa: E402
from gpuvm.muse.lowering import Tiles  # noqa: E402
from gpuvm.muse.step import bind_step, lower_step, make_step_state  # noqa: E402
from gpuvm.muse.weights import LayerWeights, make_model_weights  # noqa: E402
from gpuvm.trace.format import Trace  # noqa: E402
from gpuvm.trace.timeline import DONE, READY, build, op_name  # noqa: E402
from tools.expert_bench import MARKS, timeline  # noqa: E402
from tools.variants import parse_define_flags  # noqa: E402


def per_layer_runs(npz: Path) -> dict[str, dict[str, float]]:
    """{op kind: {"L0": us, "L1": us, "rest": us}}: median run (ready -> done) of each op kind's instructions."""
    tl = build(Trace.load(npz))
    acc: dict[str, dict[str, list[float]]] = {}
    for i in np.flatnonzero(tl.ran):
        name = op_name(tl.trace.labels[i])
        layer, _, kind = name.partition(".")
        if not kind or not layer.startswith("L"):
            continue
        where = layer if layer in ("L0", "L1") else "rest"
        acc.setdefault(kind, {}).setdefault(where, []).append((tl.t[i, DONE] - tl.t[i, READY]) / 1e3)
    return {k: {w: statistics.median(v) for w, v in d.items()} for k, d in acc.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--shape", default="1x1", help="conversations x tokens each")
    ap.add_argument("--out", default="out/step-trace.npz")
    ap.add_argument("--define", action="append", default=[], help="MACRO=value[+MACRO=value] of a build variant (repeatable)")
    ap.add_argument("--tiles", default="", help="field=value[+field=value] of lowering.Tiles (default: Tiles())")
    ap.add_argument("--mode", default="dynamic", choices=("dynamic", "static"), help="scheduling mode of both runs (static: per-SM lists made on the host)")
    ap.add_argument("--timeline", action="store_true", help="the experts' item timeline probe build (GVM_EXPR_PROBE=2048, see above)")
    a = ap.parse_args()
    if a.timeline:
        a.define.append("GVM_EXPR_PROBE=2048")
    tiles = Tiles.parse(a.tiles)
    conv, each = (int(v) for v in a.shape.split("x"))
    try:
        defines = parse_define_flags(a.define)
    except ValueError as e:
        ap.error(f"--define {e}")
    vm = VM(groups=2, trace=True, defines=defines)
    weights = make_model_weights(SHARD, 2026, device="cuda", layers=a.layers)
    state = make_step_state(SHARD, conv, each, DECODE_CONTEXT, 2027, device="cuda", layers=a.layers)
    sp = lower_step(SHARD, conv, each, state.context_capacity, layers=a.layers, tiles=tiles)
    tokens = torch.randint(0, SHARD.vocab_shard, (sp.tokens,), generator=torch.Generator().manual_seed(1), dtype=torch.int32).cuda()
    ld = vm.load(sp.stream, bind_step(sp, weights, state, tokens, device="cuda"))
    ld.run(0, a.mode)
    L2Flush(vm.torch_device)()
    ld.run(1, a.mode)  # the second step, weights from HBM, is the one kept
    torch.cuda.synchronize()
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    ld.trace().save(out)
    print(f"{a.layers} layers {a.shape} {a.mode}: trace {out}")
    print(f"{'op':18} {'L0 us':>8} {'L1 us':>8} {'rest us':>8}")
    for kind, d in per_layer_runs(out).items():
        print(f"{kind:18} " + " ".join(f"{d.get(w, float('nan')):8.2f}" for w in ("L0", "L1", "rest")))
    if a.timeline:
        print_timelines(weights.layers[2:])
    return 0


def print_timelines(layers: list[LayerWeights]) -> None:
    """The median over layers of each list's per-layer item timeline (ns)."""
    print(f"expert items, median ns over layers 2..{len(layers) + 1} (each layer: the median over its items)")
    print(f"{'list':6} {'items':>6} " + " ".join(f"{m[:9]:>9}" for m in MARKS))
    for name, field in (("up", "gu_codes"), ("down", "d_codes")):
        # a layer whose list had no item (no local expert hit) wrote no marks
        per = [t for w in layers if (t := timeline(getattr(w, field))) is not None]
        if not per:
            print(f"{name:6} no layer's items wrote their marks")
            continue
        cols = [statistics.median(p[m] for p in per) for m in (*MARKS, "items")]
        print(f"{name:6} {cols[-1]:6.0f} " + " ".join(f"{v:9.0f}" for v in cols[:-1]) + f"  ({len(per)} layers)")


if __name__ == "__main__":
    raise SystemExit(main())
