#!/usr/bin/env python3
"""What a traced layer's staged GEMMs (many tokens) move through L2, op by op.

    python3 tools/staged_l2.py trace-full-c32-t8.npz [more.npz ...] [--bf16-pass-rows 128]

A staged instruction (label with a token span, "|t0:64") copies its weight
rows once and its x tokens once a pass (ops/gemm.cuh: bf16 passes of 64 rows,
or 128 with GVM_GEMM_XS_M2; the f32 router's passes of 32 rows), all from L2,
so it moves weight_bytes + passes * x_bytes. Per op: instructions, median
time an instruction (ready to done), that over its bytes (GB/s a group), and
the op's phase with the bytes of all its instructions over it (TB/s for the
whole GPU). The bytes are the trace's own (weight_bytes, act_bytes: x plus
the small output); --bf16-pass-rows must match the build that made the trace.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpuvm.isa import Op, Stamp  # noqa: E402
from gpuvm.trace.format import Trace  # noqa: E402

_LABEL = re.compile(r"^(?P<tag>.+?)\[(?P<c0>\d+):(?P<c1>\d+)\|t\d+:\d+")
_PART = re.compile(r"\|k\d+:\d+")
F32_PASS_ROWS = 32  # ops/gemm.cuh GVM_F32XS_ROWS


def staged_ops(path: str, bf16_pass_rows: int) -> list[dict]:
    """One row per GEMM op of the trace with token-span instructions."""
    trace = Trace.load(path)
    wb, ab = trace.weight_bytes, trace.act_bytes
    ready, done = trace.times(Stamp.READY), trace.times(Stamp.DONE)
    groups: dict[str, list[tuple[int, int]]] = {}
    for i, label in enumerate(trace.labels):
        m = _LABEL.match(label)
        if m and trace.opcodes[i] == Op.GEMM:
            groups.setdefault(m["tag"], []).append((i, int(m["c1"]) - int(m["c0"])))
    out = []
    for tag, items in groups.items():
        idx = np.array([i for i, _ in items])
        rows = np.array([r for _, r in items])
        f32 = tag.endswith("Wr")  # the router: the f32 staged path
        passes = -(-rows // (F32_PASS_ROWS if f32 else bf16_pass_rows))
        moved = wb[idx] + passes * ab[idx]
        dur = (done[idx] - ready[idx]).astype(np.float64)
        phase = float(done[idx].max() - ready[idx].min())
        first, last, extra = _parts_us(trace.labels, idx, ready, done)
        out.append({"op": tag, "n": len(idx), "rows": int(np.median(rows)), "mb": float(np.median(moved)) / 1e6,
                    "us": float(np.median(dur)) / 1e3, "gbps_group": float(np.median(moved / dur)),
                    "phase_us": phase / 1e3, "tbps": float(moved.sum()) / phase / 1e3,
                    "parts_first_us": first, "parts_last_us": last, "parts_extra_us": extra})
    return out


def _parts_us(labels: list[str], idx: np.ndarray, ready: np.ndarray, done: np.ndarray) -> tuple[float, float, float]:
    """Median run (us) of the K parts that end before their tile's last, of the last, and over the tiles of
    the last's run past its own tile's others (their median): the pairing within a tile is blind to how
    runs differ between tiles, which the first two medians mix in. NaN without parts."""
    tiles: dict[str, list[int]] = {}
    for i in idx:
        if _PART.search(labels[i]):
            tiles.setdefault(_PART.sub("", labels[i]), []).append(int(i))
    first, last, extra = [], [], []
    for parts in tiles.values():
        if len(parts) < 2:
            continue
        parts.sort(key=lambda i: done[i])
        others = [float(done[i] - ready[i]) for i in parts[:-1]]
        first += others
        last.append(float(done[parts[-1]] - ready[parts[-1]]))
        extra.append(last[-1] - float(np.median(others)))
    if not first:
        return float("nan"), float("nan"), float("nan")
    return float(np.median(first)) / 1e3, float(np.median(last)) / 1e3, float(np.median(extra)) / 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--bf16-pass-rows", type=int, default=64, choices=(64, 128),
                    help="rows of a staged bf16 pass in the traced build (128: GVM_GEMM_XS_M2)")
    args = ap.parse_args()
    for path in args.traces:
        print(f"== {path}")
        print(f"   {'op':12s} {'instr':>5s} {'rows':>5s} {'MB/instr':>9s} {'us/instr':>9s} {'GB/s a group':>13s} {'phase us':>9s} {'TB/s in all':>12s}"
              f" {'parts: first us':>16s} {'last us':>8s} {'last past its others us':>24s}")
        for r in staged_ops(path, args.bf16_pass_rows):
            print(f"   {r['op']:12s} {r['n']:5d} {r['rows']:5d} {r['mb']:9.2f} {r['us']:9.1f} {r['gbps_group']:13.1f} {r['phase_us']:9.1f} {r['tbps']:12.2f}"
                  f" {r['parts_first_us']:16.1f} {r['parts_last_us']:8.1f} {r['parts_extra_us']:24.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
