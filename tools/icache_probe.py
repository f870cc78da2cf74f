"""What running code for the first time costs on this GPU (issue 6).

The persistent kernel is ~500 KB of SASS, far more than an SM's instruction
cache, and a one-token layer runs a dozen single-instruction ops each on
whichever SM is free: if their code arrives cold, that and not their loads
may be what a 5-8 us row op waits on. This times a straight-line body of n
instructions (4 interleaved dependent IMAD chains: ptxas cannot fold them)
run three times in a row by one warp, per pass in clock64 cycles and ns:
pass 0 is the cold fetch, passes 1-2 run from the instruction cache when the
body fits it. Launched twice on 1 block and on every SM (132 blocks fetching
the same lines), after a module load (code from HBM) and again (from L2, or
whatever instruction cache survives a launch).

Then the same question inside the VM (--vm): a chain of one-token RESIDUAL
instructions, each waiting on the one before (so every group's SM soon holds
the residual's code), alone and alternating with a one-token GEMM tile or an
RMSNORM; the traced ready -> done time per op kind. Against the ~7.6 us a
residual runs for in a traced one-token step, where its code is cold.

With --one-sm the chains run on block 0 alone (static mode): an op after
itself runs from a warm instruction cache, one after four other ops' code from
what is left of it (session 29: the fused one-token attention chunk 6.5 against
8.5 us).

    PYTHONPATH=. python3 tools/icache_probe.py --out out/icache_probe.json
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch

from gpuvm.program import Stream


def source(n: int) -> str:
    body = []
    for i in range(n // 4):
        for r in "abcd":
            body.append(f'asm volatile("mad.lo.u32 %0, %0, %1, {i * 4 + 1};" : "+r"({r}) : "r"(m));')
    return (
        "extern \"C\" __global__ void straight(unsigned long long* out, unsigned m) {\n"
        "  unsigned a = m, b = m + 1, c = m + 2, d = m + 3;\n"
        "  unsigned long long t[4], g[4];\n"
        "#pragma unroll 1\n"
        "  for (int pass = 0; pass < 3; ++pass) {\n"
        "    asm volatile(\"mov.u64 %0, %%clock64;\" : \"=l\"(t[pass]));\n"
        "    asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(g[pass]));\n"
        + "\n".join("    " + s for s in body)
        + "\n  }\n"
        "  asm volatile(\"mov.u64 %0, %%clock64;\" : \"=l\"(t[3]));\n"
        "  asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(g[3]));\n"
        "  if (threadIdx.x == 0) {\n"
        "    unsigned long long* o = out + 8 * blockIdx.x;\n"
        "    for (int i = 0; i < 3; ++i) { o[i] = t[i + 1] - t[i]; o[3 + i] = g[i + 1] - g[i]; }\n"
        "    o[6] = a ^ b ^ c ^ d;\n"
        "  }\n"
        "}\n"
    )


def probe(sizes: list[int]) -> dict[str, object]:
    from cuda.core import Device, LaunchConfig, ObjectCode, launch

    from gpuvm.device.build import compile_source

    dev = Device()
    dev.set_current()
    stream = dev.create_stream()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = torch.zeros(8 * sms, dtype=torch.int64, device="cuda")
    res: dict[str, object] = {}
    for n in sizes:
        cubin, _ = compile_source(source(n), f"straight{n}.cu", [], [])
        code_kb = len(cubin) / 1024
        for grid in (1, sms):
            k = ObjectCode.from_cubin(cubin).get_kernel("straight")  # a fresh module: its code from HBM
            for launch_no in range(2):
                out.zero_()
                torch.cuda.synchronize()
                launch(stream, LaunchConfig(grid=grid, block=32), k, out.data_ptr(), np.uint32(3))
                stream.sync()
                o = out.view(-1, 8)[:grid].cpu().numpy().astype(np.float64)
                cyc = np.median(o[:, 0:3], axis=0)
                ns = np.median(o[:, 3:6], axis=0)
                key = f"n{n}/grid{grid}/launch{launch_no}"
                res[key] = {"instructions": n, "cubin_kb": code_kb, "cycles": cyc.tolist(), "ns": ns.tolist(),
                            "cold_ns_per_kb": float((ns[0] - ns[1]) / (n * 16 / 1024))}
                print(f"{key:24s} cycles/pass {cyc[0]:9.0f} {cyc[1]:9.0f} {cyc[2]:9.0f}  ns/pass {ns[0]:8.0f} {ns[1]:8.0f} "
                      f"{ns[2]:8.0f}  extra ns per KB of code {res[key]['cold_ns_per_kb']:7.1f}", flush=True)
    return res


def chain_stream(kinds: list[str], n: int) -> Stream:
    """n instructions cycling through kinds, each waiting on the one before,
    at one token of the shard: RESIDUAL, RMSNORM, a 32-row GEMM tile and, for
    the one-SM chains, ATTN_CHUNK in its fused form (128 keys of a 2,048-key
    window, RoPE; chunk 3, which writes no new key) and ATTN_MERGE of two heads."""
    from gpuvm.isa import DType, Op, f2i
    from gpuvm.muse.config import SHARD
    from gpuvm.muse.lowering import n_chunks
    from gpuvm.program import Program

    cfg, d, f32, bf16 = SHARD, SHARD.d, DType.F32, DType.BF16
    p = Program("chain " + "+".join(kinds))
    s = p.tensor("s", (1, d), f32, "state")
    a = p.tensor("a", (1, d), f32)
    al, be, w = (p.tensor(nm, (d,), f32, "weight") for nm in ("alpha", "beta", "w"))
    of, ob = p.tensor("of", (1, d), f32), p.tensor("ob", (1, d), bf16)
    x, y = p.tensor("x", (1, d), bf16), p.tensor("y", (1, 4096), f32)
    wm = p.tensor("W", (4096, d), bf16, "weight")
    if {"attn", "merge"} & set(kinds):
        slots, chunk = 2112, 128
        nch = n_chunks(cfg, "sliding", 1, slots, chunk)
        qkvg = p.tensor("qkvg", (1, cfg.qkvg_width), bf16)
        kc, vc = (p.tensor(nm, (1, slots, cfg.heads_kv, 64), DType.E4M3, "state") for nm in ("kc", "vc"))
        convs = p.tensor("convs", (1, 4), DType.I32, "state")
        part_o = p.tensor("part_o", (1, cfg.heads_q, nch, 64), f32)
        part_ml = p.tensor("part_ml", (1, cfg.heads_q, nch, 2), f32)
        wqn, wkn = (p.tensor(nm, (64,), f32, "weight") for nm in ("w_qn", "w_kn"))
        o = p.tensor("o", (1, cfg.heads_q * 64), bf16)
    c = p.counter("chain")
    one = f2i(1.0)
    for i in range(n):
        kind = kinds[i % len(kinds)]
        kw = dict(waits=[(c, i)] if i else [], signal=c)
        if kind == "res":
            p.op(Op.RESIDUAL, [s, a, al, be, w, of, ob], [0, 1], **kw)
        elif kind == "gemm":
            p.op(Op.GEMM, [y, x, wm], [(32 * i) % 4096, 32, 0, 1], **kw)
        elif kind == "rms":
            p.op(Op.RMSNORM, [ob, s, w], [0, 1], **kw)
        elif kind == "attn":
            p.op(Op.ATTN_CHUNK, [qkvg, kc, vc, convs, part_o, part_ml, wqn, wkn], [0, i % cfg.heads_kv, 3, chunk, cfg.window, one, one, 1], **kw)
        elif kind == "merge":
            p.op(Op.ATTN_MERGE, [o, part_o, part_ml, qkvg], [0, 1, 0, 2], **kw)
        else:
            raise ValueError(kind)
    return p.build(order="given")


def chain_buffers(st: Stream, device: str) -> dict[str, torch.Tensor]:
    from gpuvm.tensors import torch_dtype

    bufs = {}
    for t in st.tensors:
        dt = torch_dtype(t.dtype)
        bufs[t.name] = (torch.randn(t.shape, device=device) * 0.1).to(dt) if dt.is_floating_point else torch.zeros(t.shape, dtype=dt, device=device)
    bufs["alpha"].fill_(1.0)
    if "convs" in bufs:
        bufs["convs"][0] = torch.tensor([0, 1, 4000, 0], dtype=torch.int32)  # one token at position 4,000
        bufs["part_ml"][..., 1] = 1.0  # each chunk's (max 0.1 N(0,1), sum 1)
    return bufs


def vm_chains(n: int = 240) -> dict[str, object]:
    """Traced ready -> done (us, median per op kind) of each chain's second launch."""
    from gpuvm.device import VM
    from gpuvm.isa import Stamp

    vm = VM(groups=2, trace=True)
    res: dict[str, object] = {}
    for kinds in (["res"], ["res", "gemm"], ["res", "rms"], ["res", "gemm", "rms"]):
        st = chain_stream(kinds, n)
        bufs = chain_buffers(st, "cuda")
        loaded = vm.load(st, bufs)
        loaded.run(0)
        loaded.run(1)
        gt = loaded.trace().records["globaltimer"].astype(np.int64)
        run = (gt[:, int(Stamp.DONE)] - gt[:, int(Stamp.READY)]) / 1e3
        hop = np.r_[np.nan, (gt[1:, int(Stamp.READY)] - gt[:-1, int(Stamp.SIGNAL)]) / 1e3]
        key = "+".join(kinds)
        row: dict[str, object] = {}
        for j, kind in enumerate(kinds):
            sel = np.arange(len(kinds) + j, n, len(kinds))  # the first round is cold on every SM
            row[kind] = {"run_us": float(np.median(run[sel])), "hop_us": float(np.nanmedian(hop[sel]))}
        res[key] = row
        print(f"chain {key:14s} " + "  ".join(f"{k}: run {v['run_us']:.2f} hop {v['hop_us']:.2f} us" for k, v in row.items()), flush=True)
    return res


ONE_SM_CHAINS = (["attn"], ["res"], ["merge"], ["attn", "gemm", "res", "rms", "merge"])


def vm_one_sm(n: int = 60) -> dict[str, object]:
    """Traced ready -> done (us, median per op kind past the first round) of
    chains run by block 0 alone (static mode, the other blocks idle): an op
    that follows itself runs from a warm instruction cache, one that follows
    four other ops' code from what is left of it."""
    from gpuvm.device import VM
    from gpuvm.isa import Stamp

    vm = VM(groups=2, trace=True)
    res: dict[str, object] = {}
    for kinds in ONE_SM_CHAINS:
        st = chain_stream(kinds, n)
        loaded = vm.load(st, chain_buffers(st, "cuda"))
        loaded.set_static([list(range(len(st)))] + [[] for _ in range(vm.n_blocks - 1)])
        loaded.run(0, mode="static")
        loaded.run(1, mode="static")
        gt = loaded.trace().records["globaltimer"].astype(np.int64)
        run = (gt[:, int(Stamp.DONE)] - gt[:, int(Stamp.READY)]) / 1e3
        key = "+".join(kinds)
        row = {kind: float(np.median(run[np.arange(len(kinds) + j, n, len(kinds))])) for j, kind in enumerate(kinds)}
        res[key] = row
        print(f"one SM {key:26s} " + "  ".join(f"{k}: run {v:.2f} us" for k, v in row.items()), flush=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out/icache_probe.json")
    ap.add_argument("--sizes", default="1024,4096,8192,16384", help="instructions in the body")
    ap.add_argument("--vm", action="store_true", help="also the VM's op chains")
    ap.add_argument("--one-sm", action="store_true", help="also chains on one SM: an op after itself against after other ops")
    a = ap.parse_args()
    res = probe([int(s) for s in a.sizes.split(",")])
    if a.vm:
        res["vm"] = vm_chains()
    if a.one_sm:
        res["one_sm"] = vm_one_sm()
    from pathlib import Path

    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
