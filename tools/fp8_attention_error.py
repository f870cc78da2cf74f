#!/usr/bin/env python3
"""What FP8 operands in attention would cost in accuracy, before any kernel: the
reference layer's attention half (MUSE.md) with q, and optionally the softmax
weights P (times 2^8, into e4m3's normal range), rounded to e4m3 as an FP8
`wgmma` would take them (the row sums kept from the unrounded P, f64 elsewhere), or split into two e4m3 terms (x = hi + lo,
lo = e4m3(x - hi): two MMAs, at FP8's doubled rate the time of one f16 MMA),
against the exact one, on the shard's shapes with random 80K-token caches (CPU,
~2 minutes a case).

    python3 tools/fp8_attention_error.py --cases full-c1-t8,sliding-c1-t8,full-c4-t8

Prints ‖Δ‖/‖ref‖ of the attention output o and of the residual stream after
the attention half (s_mid), the part of MEASURE.md's error budget (1e-2 on the
layer's output; the VM's layers run at ~1.2e-3) that the change would take.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpuvm.muse import reference  # noqa: E402
from gpuvm.muse.config import SHARD  # noqa: E402
from gpuvm.muse.formats import from_e4m3, to_e4m3  # noqa: E402
from gpuvm.muse.state import make_state  # noqa: E402
from gpuvm.muse.weights import make_layer_weights  # noqa: E402


def e4m3(x: torch.Tensor) -> torch.Tensor:
    return from_e4m3(to_e4m3(x)).to(x.dtype)


def e4m3x2(x: torch.Tensor) -> torch.Tensor:
    hi = e4m3(x)
    return hi + e4m3(x - hi)


def attend_fp8(round_p: bool, rnd=e4m3):  # type: ignore[no-untyped-def]
    """reference._attend with q (and P) through rnd (e4m3, or e4m3x2)."""
    def attend(q, k, v, qpos, kpos, window):  # type: ignore[no-untyped-def]
        n, hq, dh = q.shape
        hkv = k.shape[1]
        qb = rnd(q).reshape(n, hkv, hq // hkv, dh)
        seen = kpos[None, :] <= qpos[:, None]
        if window:
            seen &= kpos[None, :] > qpos[:, None] - window
        sc = torch.einsum("nhgd,lhd->nhgl", qb, k) * reference.ATTN_SCALE
        sc = sc.masked_fill(~seen[:, None, None, :], float("-inf"))
        p = torch.exp(sc - sc.amax(dim=-1, keepdim=True))
        l = p.sum(dim=-1, keepdim=True)
        pv = rnd(p * 256.0) / 256.0 if round_p else p  # P in (0, 1] scaled into e4m3's normal range (to 448)
        return (torch.einsum("nhgl,lhd->nhgd", pv, v) / l).reshape(n, hq, dh)
    return attend


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="full-c1-t8,sliding-c1-t8,full-c4-t8")
    ap.add_argument("--context", type=int, default=81920)
    a = ap.parse_args()
    torch.manual_seed(0)
    w = make_layer_weights(SHARD, 1, 7)
    rel = lambda x, r: float((x - r).norm() / r.norm())  # noqa: E731
    exact = reference._attend
    ways = {"q": attend_fp8(False), "q, P": attend_fp8(True), "q split": attend_fp8(False, e4m3x2), "q, P split": attend_fp8(True, e4m3x2)}
    print(f"{'case':16s} " + " ".join(f"{k + ': o':>14s} {'s_mid':>9s}" for k in ways))
    for name in a.cases.split(","):
        kind, c, t = name.split("-")
        state = make_state(SHARD, kind, int(c[1:]), int(t[1:]), a.context, seed=3)
        s = torch.randn(state.tokens, SHARD.d, dtype=torch.float32)
        outs = []
        for fn in (exact, *ways.values()):
            reference._attend = fn
            try:
                r = reference.reference_layer(SHARD, w, state, s, kind)
            finally:
                reference._attend = exact
            outs.append((r.o.double(), r.s_mid.double()))
        (o0, m0), rest = outs[0], outs[1:]
        print(f"{name:16s} " + " ".join(f"{rel(o, o0):14.2e} {rel(m, m0):9.2e}" for o, m in rest), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
