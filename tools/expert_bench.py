"""One expert work list alone on the whole GPU, outside the VM: the ops_check
test kernel of EXPERT_UP / EXPERT_DOWN run by 132 blocks x 2 groups (one
worker instruction each, as a layer's list is), at the shard's shapes and
the lowering's row grains, L2 flushed, for a few counts of experts hit. It
answers how fast the op streams its weights when nothing else runs (issue
6); --define passes a probe switch to the op kernels. A shape is "hit x tokens"
(every expert hit alike) or "skew256": the tokens of each local expert in the
sweep's sliding-c32-t8 layer (MUSE.md's routing skew: the top expert gets 133 of
the 256 tokens' 511 local picks, 17 experts 8 or fewer).

    PYTHONPATH=. python3 tools/expert_bench.py --out out/expert_bench.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

import numpy as np
import torch

from gpuvm.device.bench import L2Flush
from gpuvm.isa import DType, Op
from gpuvm.muse.config import SHARD
from gpuvm.muse.lowering import EXPERT_CAP, EXPERT_GRAIN, Tiles
from gpuvm.opspec import tiled_nvfp4_shapes
from tools.ops_check import GpuRunner, _Build, encode, place, split_rc
from tools.variants import parse_define_flags

H, I, E, WORKERS = SHARD.squeeze, SHARD.expert_inter, SHARD.local_experts, Tiles().expert_workers
GRAIN = {up: EXPERT_GRAIN[Op.EXPERT_UP if up else Op.EXPERT_DOWN] for up in (True, False)}


def weights(up: bool, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random codes and unit scales of the shard's 32 experts (gate|up or down), tiled."""
    n_out, k = (I, H) if up else (H, I)
    cshape, sshape = tiled_nvfp4_shapes((E, 2) if up else (E,), n_out, k)
    codes = torch.randint(0, 256, cshape, generator=gen, dtype=torch.uint8)
    return codes, torch.full(sshape, 0x38, dtype=torch.uint8)  # e4m3 1.0


# Tokens per local expert of the sweep's sliding-c32-t8 layer (the reference's
# local_counts at gpu_sweep.SEED, computed on the CPU in session 20).
SKEW256 = (133, 78, 48, 31, 22, 18, 13, 11, 11, 10, 10, 10, 8, 8, 8, 8, 8, 7, 7, 7, 7, 6, 6, 5, 5, 5, 4, 4, 4, 3, 3, 3)


def parse_shape(sh: str) -> tuple[int, ...]:
    """'hit x tokens' (e.g. '32x16') or 'skew256' -> the tokens of each expert hit."""
    if sh == "skew256":
        return SKEW256
    hit, tokens = (int(v) for v in sh.split("x"))
    if not (1 <= hit <= E and tokens >= 1):
        raise SystemExit(f"shape {sh!r}: 1..{E} experts hit, at least one token each")
    return (tokens,) * hit


def list_tables(counts: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """route_meta (tokens, first slot of each expert) and route for experts 0..
    len(counts) - 1 with those token counts, an expert's tokens distinct; the
    step's token count (8 picks a token, at least the largest count)."""
    slots = sum(counts)
    meta = torch.zeros(2, E, dtype=torch.int32)
    meta[0, : len(counts)] = torch.tensor(counts, dtype=torch.int32)
    meta[1, :] = torch.cumsum(meta[0], 0) - meta[0]
    t = max(-(-slots // 8), max(counts))
    route = torch.zeros(5, 8 * t, dtype=torch.int32)
    route[0, :slots] = torch.arange(slots, dtype=torch.int32) % t  # consecutive slots of an expert: distinct tokens
    return meta, route, t


def build_list(up: bool, grain: int, counts: tuple[int, ...], w: tuple[torch.Tensor, torch.Tensor], gen: torch.Generator,
               cap: int, heavy: int = 0) -> tuple[object, int]:
    """A work list over experts with `counts` tokens each, items of at most cap
    rows (half for an expert of more than heavy tokens, 0: none); the weight
    bytes it reads."""
    op = Op.EXPERT_UP if up else Op.EXPERT_DOWN
    b = _Build(op.name.lower(), op, gen)
    meta, route, t = list_tables(counts)
    hit = len(counts)
    n_out, k = (I, H) if up else (H, I)
    codes, scales = w
    x = b.add("x", DType.BF16, (torch.randn(t if up else 8 * t, k, generator=gen) * 0.1).bfloat16())
    dst = b.add("out", DType.BF16 if up else DType.F32, torch.zeros(8 * t, n_out, dtype=torch.bfloat16 if up else torch.float32))
    cd = b.add("codes", DType.E2M1X2, codes)
    sc = b.add("scales", DType.E4M3, scales)
    ts = b.add("ts", DType.F32, torch.ones((E, 2) if up else (E,)))
    mt = b.add("meta", DType.I32, meta)
    rt = b.add("route", DType.I32, route)
    wk = b.add("work", DType.I32, torch.zeros(2, 2, dtype=torch.int32))
    for _ in range(WORKERS):
        b.op_([dst, x, cd, sc, ts, mt, rt, wk], [0, WORKERS, grain, cap, 0, 0, heavy])
    per_expert = (2 if up else 1) * n_out * (k // 2 + k // 16)
    return b.case(), hit * per_expert


def pad_blocks(case: object, placed: object, table: np.ndarray, pad: int) -> list[torch.Tensor]:
    """Rebind codes and scales (table rows) to copies whose row blocks are pad
    (codes) and pad / 8 (scales) bytes further apart; the copies, to keep alive."""
    keep = []
    names = [t.name for t in case.stream.tensors]
    for name, extra in (("codes", pad), ("scales", pad // 8)):
        if not extra:
            continue
        v = placed.views[name]
        big = torch.zeros((*v.shape[:-1], v.shape[-1] + extra), dtype=v.dtype, device=v.device)
        big[..., : v.shape[-1]].copy_(v)
        row = table[names.index(name)]
        row["ptr"] = big.data_ptr()
        row["stride"][: v.dim()] = big.stride()
        keep.append(big)
    return keep


# The timeline probe's marks (ops/experts.cuh GVM_EXPR_MARK): the interval ending at each.
MARKS = ("args", "walk", "into item", "x staged", "1st slot", "ring", "partials", "epilogue", "2nd call", "return")


def timeline(codes: torch.Tensor) -> dict[str, float] | None:
    """Median ns of each interval between an item's marks, over the items whose
    stamps the probe wrote over the last expert's codes (128 bytes an item);
    None when no item wrote them (a list with no item)."""
    m = codes[-1].reshape(-1)[: 256 * 128].view(torch.int64).view(256, 16).cpu().numpy()
    rows = [r for i, r in enumerate(m) if r[0] != 0 and r[13] == i and r[10] > r[0] and r[12] > r[11]]
    if not rows:
        return None
    out: dict[str, list[float]] = {k: [] for k in MARKS}
    for r in rows:
        ns = (r[12] - r[11]) / (r[10] - r[0])  # ns a cycle, from %globaltimer over the same span
        prev = r[0]
        for k, name in enumerate(MARKS, start=1):
            if r[k] == 0:  # a mark the item's path does not pass (the register path: no ring)
                continue
            out[name].append((r[k] - prev) * ns)
            prev = r[k]
    return {k: statistics.median(v) if v else float("nan") for k, v in out.items()} | {"items": float(len(rows))}


def time_list(case: object, runner: GpuRunner, flush: L2Flush, ts: torch.cuda.ExternalStream, reps: int, pad: int,
              marks: dict[str, float] | None = None) -> float:
    """Median us of one launch of the list (L2 flushed before each), its weights' blocks pad bytes apart;
    marks: filled with the last launch's item timeline (a GVM_EXPR_PROBE 2048 build)."""
    placed = place(case.tensors, "cuda")
    records, table = encode(case, placed)
    keep = pad_blocks(case, placed, table, pad)
    ins, tab, err = runner._upload(records, table)
    times = []
    for _ in range(reps):
        with torch.cuda.stream(ts):  # on the timed stream: the flush ends before the start event
            placed.views["work"].zero_()
            flush()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        ev[0].record(ts)
        runner._launch(case.op, ins, tab, err, 2, runner.scratch, WORKERS // 2)
        ev[1].record(ts)
        ev[1].synchronize()
        times.append(ev[0].elapsed_time(ev[1]) * 1e3)
    codes = split_rc(err.cpu().numpy())[0]
    if codes.any():
        raise SystemExit(f"error codes {sorted(set(codes.tolist()))}")
    if marks is not None:
        t = timeline(placed.views["codes"])
        if t is None:
            raise SystemExit("--timeline: no item wrote its marks (one-round lists, the last expert not hit)")
        marks.update(t)
    del placed, ins, tab, err, keep
    torch.cuda.empty_cache()
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="out/expert_bench.json")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--define", action="append", default=[], help="MACRO=value for the op kernels (repeatable)")
    ap.add_argument("--quick", action="store_true", help="1 and 3 experts hit only")
    ap.add_argument("--shapes", default="", help="experts hit x tokens each, or skew256, e.g. 32x16,skew256 (default: 1x1,3x1,8x1,32x8)")
    ap.add_argument("--bw", type=float, default=4.3, help="streaming-read TB/s for the floor column")
    ap.add_argument("--heavy", type=int, default=None, help="tokens above which an expert's items are half the cap (the lists' a6; 0: none; "
                    "default: the lowering's Tiles.expert_heavy_up / _down of each list)")
    ap.add_argument("--cap", type=int, default=None, help="rows an item at most (default: the lowering's EXPERT_CAP of each list; 1048576: "
                    "none, as below Tiles.expert_cap_tokens)")
    ap.add_argument("--timeline", action="store_true", help="the probe build that stamps each item's steps (GVM_EXPR_PROBE=2048): "
                    "median ns of each, per list (the last local expert must not be hit)")
    ap.add_argument("--block-pads", default="0", help="bytes of padding after each tiled block of 16 rows' codes (scales: an eighth), "
                    "e.g. 0,256,1024: where a block starts in HBM, with the bytes read unchanged")
    a = ap.parse_args()
    pads = [int(v) for v in a.block_pads.split(",")]
    if any(v < 0 or v % 128 for v in pads):
        raise SystemExit(f"--block-pads: multiples of 128 bytes, not {a.block_pads}")
    gen = torch.Generator().manual_seed(0)
    try:
        defines = list(parse_define_flags(a.define))
    except ValueError as e:
        ap.error(f"--define {e}")
    if a.timeline:
        if any(k == "GVM_EXPR_PROBE" for k, _ in defines):
            raise SystemExit("--timeline is the GVM_EXPR_PROBE=2048 build: no other probe with it")
        defines.append(("GVM_EXPR_PROBE", "2048"))
    runner = GpuRunner(defines=tuple(defines))
    flush = L2Flush(torch.device("cuda", 0))
    ts = torch.cuda.ExternalStream(int(runner.stream.handle))
    res = []
    print(f"{'op':5} {'hit':>3} {'tok':>3} {'us':>8} {'MB':>7} {'GB/s':>7} {'floor us':>8}", flush=True)
    shapes = [parse_shape(sh) for sh in a.shapes.split(",") if sh] or [
        parse_shape(sh) for sh in (("1x1", "3x1") if a.quick else ("1x1", "3x1", "8x1", "32x8"))]
    for up in (True, False):
        w = weights(up, gen)
        cap = EXPERT_CAP[Op.EXPERT_UP if up else Op.EXPERT_DOWN] if a.cap is None else a.cap
        heavy = (Tiles().expert_heavy_up if up else Tiles().expert_heavy_down) if a.heavy is None else a.heavy
        for counts in shapes:
            hit, tokens = len(counts), max(counts)  # (tok: the largest count)
            if a.timeline and hit >= E:
                raise SystemExit(f"--timeline writes over the last expert's weights: at most {E - 1} experts hit, not {hit}")
            case, nbytes = build_list(up, GRAIN[up], counts, w, gen, cap, heavy)
            for pad in pads:
                marks: dict[str, float] | None = {} if a.timeline else None
                us = time_list(case, runner, flush, ts, a.reps, pad, marks)
                r = dict(op="up" if up else "down", grain=GRAIN[up], cap=cap, heavy=heavy, hit=hit, tokens=tokens, counts=list(counts), us=us,
                         bytes=nbytes, block_pad=pad)
                if marks is not None:
                    r["timeline_ns"] = marks
                    print("       " + "  ".join(f"{k} {v:.0f}" for k, v in marks.items()), flush=True)
                res.append(r)
                print(f"{r['op']:5} {hit:3d} {tokens:3d} {us:8.1f} {nbytes / 1e6:7.1f} {nbytes / us / 1e3:7.0f} {nbytes / (a.bw * 1e6):8.1f}"
                      + (f"  pad {pad}" if len(pads) > 1 else ""), flush=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
