"""tests/gpu's two timing bounds (the GEMM stream against the streaming read,
and the cost of an empty instruction) on the Muse kernel against the kernel
built without the Muse ops, alternating rounds in one process, so that a
difference between them is the Muse ops' code and not the run.

    PYTHONPATH=. python3 tools/bounds_ab.py [--rounds 2] [--out F.json]
"""
from __future__ import annotations

import argparse
import json

from gpuvm.device import VM
from gpuvm.device.bench import StreamRead, dispatch_overhead, gemm_bandwidth


def _measure(vm: VM) -> dict[str, float]:
    floor = StreamRead(vm).measure()
    row: dict[str, float] = {"read_tb_s": floor["tb_s"]}
    for tokens in (1, 8):
        r = gemm_bandwidth(vm, tokens, rows=64, claim_depth=2)
        row[f"gemm_t{tokens}"] = r["tb_s"] / floor["tb_s"]
    for mode in ("dynamic", "static"):
        row[f"empty_{mode}_us"] = dispatch_overhead(vm, mode)["us_per_instr_per_block"]
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    vms = {"muse": VM(0, groups=2, trace=False, warm=True), "plain": VM(0, groups=2, trace=False, warm=True, muse_ops=False)}
    rows = []
    for r in range(a.rounds):
        for name in (list(vms) if r % 2 == 0 else list(reversed(vms))):
            row = {"round": r, "kernel": name, "registers": vms[name].build.kernel.registers, **_measure(vms[name])}
            rows.append(row)
            print(f"round {r} {name:5s} regs {row['registers']}: GEMM T=1 {row['gemm_t1']:.1%} T=8 {row['gemm_t8']:.1%} "
                  f"of {row['read_tb_s']:.2f} TB/s; empty dynamic {row['empty_dynamic_us']:.3f} static {row['empty_static_us']:.3f} us",
                  flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
