#!/usr/bin/env python3
"""The loops of one op's test kernel in SASS, by instruction mix: what a K
step costs in warp instructions before any GPU time is spent on it.

    python3 tools/sass_loops.py expert_up                  # loops with an MMA or a copy in them
    python3 tools/sass_loops.py expert_up --define GVM_EXPR_RING=4 --all
    python3 tools/sass_loops.py attn_chunk --skip 60       # and each loop's usual path

Compiles the op's kernel as tools/ops_check.py does (NVRTC, sm_90a), takes the
SASS from nvdisasm (the CUDA toolkit's, or the copy that ships with triton),
and lists every loop (a label and the backward branch to it; nested loops
count their inner ones too) with its length and its most frequent opcodes.
An SM issues at most 4 warp instructions a cycle (one a scheduler), so a
loop's length over the bytes it moves sets its throughput ceiling (NOTES.md,
session 24: the experts' ring, 394 instructions a 2 KB slot).

--stalls also sums the stall counts ptxas wrote into each instruction's
control bits (cycles before the warp may issue again: the fixed-latency part
of a loop's time for one warp, before any wait on memory or a scoreboard).

--skip N also counts each loop's usual path: its instructions less those a
forward conditional branch inside the loop jumps over when it jumps more than
N (a mask for the chunk's last keys, a rare rescale): what a warp issues in a
typical pass (session 64: `attn_chunk --skip 60`, the warpgroup round's 64-key
step, 451 of its 743 on main).
"""
from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpuvm.isa import Op  # noqa: E402
from tools.ops_check import OPS, compile_ops  # noqa: E402

_INSN = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")
_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_BACK = re.compile(r"BRA\s+(?:\w+,\s*)?`\((\.L_x_\d+)\)")
_CBRA = re.compile(r"@!?U?P\w+\s+" + _BACK.pattern)  # a conditional branch
_CTRL = re.compile(r"^\s*/\* (0x[0-9a-f]{16}) \*/\s*$")  # nvdisasm -hex: an instruction's second 64-bit word
#: opcodes that mark a loop worth listing without --all: MMAs and memory copies
MARKERS = ("HMMA", "HGMMA", "IMMA", "LDGSTS", "UTMALDG", "LDG", "LDS")


@dataclass
class Loop:
    label: str
    start: int  # SASS line of the label
    length: int  # instructions, the backward branch included
    mix: collections.Counter[str]
    stalls: int | None = None  # sum of the control bits' stall counts (SASS with -hex only)
    path: int | None = None  # instructions less the blocks branched over (loops(skip=N) only)


def stall_count(ctrl_word: int) -> int:
    """The stall count of an sm_70+ instruction: bits 41..44 of its second
    64-bit word (after it, the warp waits that many cycles to issue again)."""
    return (ctrl_word >> 41) & 0xF


def nvdisasm() -> str | None:
    """The nvdisasm binary: on PATH, in the CUDA toolkit, in NVIDIA's pip wheel
    (`pip install nvidia-cuda-nvdisasm`: site-packages/nvidia/cu*/bin), or triton's copy."""
    found = shutil.which("nvdisasm") or next((p for p in ("/usr/local/cuda/bin/nvdisasm",) if Path(p).is_file()), None)
    if found:
        return found
    try:
        import nvidia  # the namespace package of NVIDIA's CUDA wheels
    except ImportError:
        nvidia = None
    for root in getattr(nvidia, "__path__", []):
        for p in sorted(Path(root).glob("cu*/bin/nvdisasm"), reverse=True):
            if p.is_file():
                return str(p)
    try:
        import triton
    except ImportError:
        return None
    p = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    return str(p) if p.is_file() else None


def loops(sass: str, skip: int | None = None) -> list[Loop]:
    """Every label with a backward branch to it, from the label to its last such
    branch; skip: also each loop's path past the blocks that conditional forward
    branches inside it jump over, where a block has more than skip instructions."""
    lines = sass.splitlines()
    at = {m.group(1): i for i, l in enumerate(lines) if (m := _LABEL.match(l))}
    last: dict[str, int] = {}
    for i, l in enumerate(lines):
        m = _BACK.search(l)
        if m and at.get(m.group(1), i) < i:
            last[m.group(1)] = i
    out = []
    for name, end in last.items():
        body = range(at[name], end + 1)
        mix = collections.Counter(m.group(1) for i in body if (m := _INSN.search(lines[i])))
        ctrl = [_CTRL.match(lines[i + 1]) for i in body if _INSN.search(lines[i]) and i + 1 < len(lines)]
        stalls = sum(stall_count(int(c.group(1), 16)) for c in ctrl) if ctrl and all(ctrl) else None
        path = None
        if skip is not None:
            insn = [i for i in body if _INSN.search(lines[i])]
            over: set[int] = set()
            for i in insn:
                m = _CBRA.search(lines[i])
                t = at.get(m.group(1), -1) if m else -1
                block = [k for k in insn if i < k < t] if i < t <= end else []
                if len(block) > skip:
                    over.update(block)
            path = len(insn) - len(over)
        out.append(Loop(name, at[name], sum(mix.values()), mix, stalls, path))
    return sorted(out, key=lambda lp: lp.start)


def op_sass(op: Op, defines: tuple[tuple[str, str], ...] = (), hex_words: bool = False) -> str:
    """SASS of the op's test kernel (tools/ops_check.py's build); hex_words:
    with each instruction's encoding (nvdisasm -hex), for the stall counts."""
    tool = nvdisasm()
    if tool is None:
        raise SystemExit("nvdisasm not found (CUDA toolkit, `pip install nvidia-cuda-nvdisasm`, or triton)")
    obj, _ = compile_ops([op], defines=defines)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(obj.code)
        f.flush()
        return subprocess.run([tool, "-c", *(["-hex"] if hex_words else []), f.name], check=True, capture_output=True, text=True).stdout


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("op", choices=sorted(OPS.values()))
    ap.add_argument("--define", action="append", default=[], metavar="MACRO=VALUE")
    ap.add_argument("--all", action="store_true", help="every loop, not only those with an MMA or a memory op")
    ap.add_argument("--top", type=int, default=10, help="opcodes shown a loop")
    ap.add_argument("--stalls", action="store_true", help="also the stall cycles ptxas scheduled a pass of each loop")
    ap.add_argument("--skip", type=int, default=None, metavar="N",
                    help="also each loop's usual path: less the blocks of more than N instructions that its conditional forward branches skip")
    a = ap.parse_args(argv)
    op = {v: k for k, v in OPS.items()}[a.op]
    defines = tuple((d.partition("=")[0], d.partition("=")[2] or "1") for d in a.define)
    found = [lp for lp in loops(op_sass(op, defines, a.stalls), a.skip) if a.all or any(lp.mix[k] for k in MARKERS)]
    print(f"{a.op}: {len(found)} loops" + (" (with an MMA or a memory op)" if not a.all else ""))
    for lp in found:
        stalls = f", {lp.stalls:5d} stall cycles" if lp.stalls is not None else ""
        path = f", path {lp.path:5d}" if lp.path is not None else ""
        print(f"{lp.label:>10} at line {lp.start:6d}: {lp.length:5d} instructions{path}{stalls}  "
              + " ".join(f"{k} {n}" for k, n in lp.mix.most_common(a.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
