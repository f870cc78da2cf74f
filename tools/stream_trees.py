"""tests/gpu's GEMM-stream bound on several source trees in one call, so that
a change of the figure across commits is the code's and not the machine's:
each tree's Muse kernel (the test's, stamps off) and its kernel without the
Muse ops are compiled in parallel, then every tree is timed in its own
process, the trees in turn, each round in the reverse order of the one
before. A tree is a directory with the package at some commit, e.g.
`git archive <sha> -- gpuvm isa ops runtime scheduler | tar -x -C ab/<sha>`.

    python3 tools/stream_trees.py ab/<sha> ... [--rounds 2] [--out F.json]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

_BUILD = """
from gpuvm.device.build import BuildOptions, build
b = build(BuildOptions(muse_ops={muse}))
print(b.kernel.registers, b.code_bytes)
"""

# Runs inside a tree: only API that every tree since session 5 has.
_MEASURE = """
import json
from gpuvm.device import VM
from gpuvm.device.bench import StreamRead, gemm_bandwidth
rows = {}
for name, muse in (("muse", True), ("plain", False)):
    vm = VM(0, groups=2, trace=False, warm=True, muse_ops=muse)
    read = StreamRead(vm).measure()["tb_s"]
    row = {"read_tb_s": read, "registers": vm.build.kernel.registers, "code_bytes": vm.build.code_bytes}
    for t in (1, 8):
        row[f"gemm_t{t}_tb_s"] = gemm_bandwidth(vm, t, rows=64, claim_depth=2)["tb_s"]
    rows[name] = row
print("JSON " + json.dumps(rows))
"""


def _run(tree: Path, code: str, timeout: int) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    return subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, text=True, capture_output=True, timeout=timeout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trees", nargs="+", type=Path)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    trees = [t.resolve() for t in a.trees]
    jobs = [(t, m) for t in trees for m in (True, False)]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 4) as pool:
        for (t, m), r in zip(jobs, pool.map(lambda j: _run(j[0], _BUILD.format(muse=j[1]), 600), jobs)):
            print(f"build {t.name} {'muse' if m else 'plain'}: rc {r.returncode} {r.stdout.strip() or r.stderr.strip()[-300:]}", flush=True)
    results = []
    for rnd in range(a.rounds):
        for t in trees if rnd % 2 == 0 else trees[::-1]:
            r = _run(t, _MEASURE, 300)
            line = next((x for x in r.stdout.splitlines() if x.startswith("JSON ")), None)
            if line is None:
                print(f"round {rnd} {t.name}: failed rc {r.returncode} {r.stderr.strip()[-400:]}", flush=True)
                continue
            for kernel, row in json.loads(line[5:]).items():
                row = {"round": rnd, "tree": t.name, "kernel": kernel, **row}
                results.append(row)
                rd = row["read_tb_s"]
                print(f"round {rnd} {t.name:10s} {kernel:5s} regs {row['registers']} code {row['code_bytes']:>7d}: read {rd:.2f} TB/s; "
                      f"GEMM T=1 {row['gemm_t1_tb_s']:.2f} ({row['gemm_t1_tb_s'] / rd:.1%}) T=8 {row['gemm_t8_tb_s']:.2f} ({row['gemm_t8_tb_s'] / rd:.1%})",
                      flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
