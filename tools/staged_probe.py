"""One wave of staged bf16 GEMM tiles alone, by rows a tile and K a part:
what a tile's pass costs per byte as its K range shortens (the 128-row K-part
tiles of session 59 moved fewer bytes than 64-row ones and took longer).

Each shape is a program of about one wave of independent instructions (tiles
of `rows` output rows, each cut into P = K / kpart K parts, their sums added
by the last part, isa/gvm_isa.h GEMM) over a W of K = --k columns, at T
tokens (the staged path: T >= GVM_GEMM_XS_MIN). It is checked against torch,
timed with the L2 flushed before each run (median), and traced once: the
median instruction's ready-to-done time, and the bytes it moves: its W part
once a pass of 64 tokens (the passes run one after the other, and a wave's W
is far past the L2, so each pass reads it from HBM again: `w_hbm_tb_s` is
the wave's rate so counted; session 61 found the waves over K = 8,192 at
85-90% of the streaming read by it), and x once a pass of up to 128 rows
with the two-half passes (from L2: every tile reads the same x).

    python3 tools/staged_probe.py [--tokens 128,256] [--rows 64,128] [--kpart 2048,4096,8192]
        [--variants base:,s4:GVM_GEMM_XS_STAGES=4] [--out F.json]

--variants: name:MACRO=v[+MACRO=v] builds of the kernel, each shape run on
every one in turn.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpuvm.device import VM  # noqa: E402
from gpuvm.device.bench import L2Flush, step_time  # noqa: E402
from gpuvm.device.programs import gemm_bindings  # noqa: E402
from gpuvm.isa import DType, Op, Stamp  # noqa: E402
from gpuvm.program import Program, Stream  # noqa: E402
from tools.variants import parse_variant  # noqa: E402


def wave_stream(tokens: int, rows: int, k: int, kpart: int, instructions: int) -> tuple[Stream, int, int]:
    """About `instructions` K-part tiles of `rows` rows (P = k / kpart parts
    each). Returns the stream, its tiles and P."""
    if k % kpart:
        raise SystemExit(f"--k {k} is not a multiple of the K part {kpart}")
    parts = k // kpart
    tiles = max(1, instructions // parts)
    n = tiles * rows
    p = Program(f"staged T{tokens} rows {rows} K {k} in {parts} parts")
    out = p.tensor("out", (tokens, n), DType.BF16)
    x = p.tensor("x", (tokens, k), DType.BF16)
    w = p.tensor("W", (n, k), DType.BF16, role="weight")
    extra = []
    if parts > 1:
        extra = [p.tensor("parts", (tokens, parts * n), DType.F32), p.tensor("tickets", (tiles,), DType.I32, role="ticket")]
    for m in range(tiles):
        n0 = m * rows
        for j in range(parts):
            args = [n0, rows, 0, 0, 0, parts, j, m] if parts > 1 else [n0, rows]
            p.op(Op.GEMM, [out, x, w, *extra], args, prefetch=(w, n0 * k * 2 + j * kpart * 2, kpart * 2), label=f"tile {m} k{j}")
    return p.build(order="given"), tiles, parts


def bindings(stream: Stream, device: torch.device) -> dict[str, torch.Tensor]:
    """gemm_bindings' x, W and out, and zeroed K-part sums and tickets where the stream has them."""
    out = gemm_bindings(stream, device)
    for t in stream.tensors:
        if t.name not in out:
            out[t.name] = torch.zeros(t.shape, dtype=torch.float32 if t.dtype == DType.F32 else torch.int32, device=device)
    return out


def measure(stream: Stream, vm_plain: VM, vm_trace: VM, flush: L2Flush, reps: int) -> dict[str, float]:
    """Checked against torch, timed with the L2 flushed (median), traced once."""
    bufs = bindings(stream, vm_plain.torch_device)
    ld = vm_plain.load(stream, bufs)
    ld.run(0)
    ref = bufs["x"].float() @ bufs["W"].float().T
    err = ((bufs["out"].float() - ref).norm() / ref.norm()).item()
    wave_us = step_time(ld, reps=reps, before=flush)["median_ms"] * 1e3
    tl = vm_trace.load(stream, bufs)  # the same inputs: its run rewrites out and the part sums
    flush()
    tl.run(0)
    tr = tl.trace()
    ready, done = tr.times(Stamp.READY), tr.times(Stamp.DONE)
    return {"err": err, "wave_us": wave_us, "traced_span_us": (done.max() - ready.min()) / 1e3,
            "instr_us": statistics.median(((done - ready) / 1e3).tolist())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="128,256")
    ap.add_argument("--rows", default="64,128")
    ap.add_argument("--kpart", default="2048,4096,8192")
    ap.add_argument("--k", type=int, default=8192)
    ap.add_argument("--instructions", type=int, default=0, help="a wave's instructions (default: the VM's groups)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--variants", default="base:", help="name:MACRO=v[+MACRO=v],... kernel builds to compare")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    ints = lambda s: [int(v) for v in s.split(",") if v]  # noqa: E731
    variants = {}
    for spec in a.variants.split(","):
        name, defines = parse_variant(spec)
        variants[name] = (VM(0, groups=2, trace=False, defines=defines), VM(0, groups=2, trace=True, defines=defines))
    first = next(iter(variants.values()))[0]
    flush = L2Flush(first.torch_device)
    waves = a.instructions or first.n_blocks * 2
    rows_out = []
    for tokens in ints(a.tokens):
        for rows in ints(a.rows):
            for kpart in ints(a.kpart):
                stream, tiles, parts = wave_stream(tokens, rows, a.k, kpart, waves)
                for name, (vm_plain, vm_trace) in variants.items():
                    row = measure(stream, vm_plain, vm_trace, flush, a.reps)
                    passes = -(-tokens // 64)  # of 64 tokens, each reading the W part again
                    w_mb = rows * kpart * 2 / 1e6
                    x_mb = -(-rows // 128) * tokens * kpart * 2 / 1e6  # x once a pass of up to 128 rows
                    w_tb_s = tiles * rows * a.k * 2 / (row["wave_us"] * 1e-6) / 1e12
                    row.update({"variant": name, "tokens": tokens, "rows": rows, "kpart": kpart, "parts": parts, "tiles": tiles,
                                "instructions": len(stream), "w_mb": w_mb, "x_mb": x_mb,
                                "gb_s_group": (w_mb * passes + x_mb) * 1e3 / row["instr_us"],
                                "w_tb_s": w_tb_s, "w_hbm_tb_s": w_tb_s * passes})
                    rows_out.append(row)
                    print(f"{name:6s} T {tokens:3d} rows {rows:3d} K part {kpart:5d} ({parts} parts, {len(stream)} instr): "
                          f"err {row['err']:.1e}; wave {row['wave_us']:7.1f} us (traced {row['traced_span_us']:6.1f}), "
                          f"W {row['w_tb_s']:.2f} TB/s once, {row['w_hbm_tb_s']:.2f} a pass; "
                          f"instr {row['instr_us']:6.1f} us for {passes} x {w_mb:.2f} + {x_mb:.2f} MB = "
                          f"{row['gb_s_group']:.1f} GB/s a group", flush=True)
                    if row["err"] > 1e-2:
                        print(f"  error {row['err']:.2e} above 1e-2: the staged path computed something else", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(rows_out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
