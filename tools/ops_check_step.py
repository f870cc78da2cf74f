"""EMBED and ARGMAX (ops/step.cuh) in tools/ops_check.py.

ops_check.py picks these up with extend(), which adds the two ops, their header
and their case builder to its tables and a run.cpp that dispatches them to the
emulator's files. Each function takes the ops_check module itself: run as a
script, ops_check is __main__, and importing it by name would load a second copy.

    python3 tools/ops_check.py --only embed,argmax [--emu]
"""
from __future__ import annotations

import functools
import io
import math
import tempfile
from pathlib import Path
from types import ModuleType

import torch

from gpuvm.isa import DType, ErrorCode, Op

STEP_OPS: dict[Op, str] = {Op.EMBED: "embed", Op.ARGMAX: "argmax"}
HEADER = "ops/step.cuh"
#: vocabulary of the ARGMAX / EMBED cases: the shard's LM-head rows, or an odd size so rows are not 16-byte aligned
VOCAB = {"shard": (25_256, 25_253), "small": (516, 517)}


def cases_step(oc: ModuleType, sz: object, gen: torch.Generator) -> list[object]:
    """EMBED and ARGMAX cases of ops_check (oc) at sizes sz."""
    out = []
    t, d = sz.tokens, sz.d  # type: ignore[attr-defined]
    v_even, v_odd = VOCAB[sz.name]  # type: ignore[attr-defined]
    for vocab in (v_even, 7):
        b = oc._Build(f"embed V={vocab}", Op.EMBED, gen)
        s = b.out("s", DType.F32, (t, d), oc.EXACT)
        ids = torch.randint(0, vocab, (t,), generator=gen, dtype=torch.int32)
        ids[0], ids[-1] = 0, vocab - 1
        table = b.add("table", DType.BF16, b.randn(vocab, d, scale=2.0).bfloat16())
        tok = b.add("tokens", DType.I32, ids)
        for r, n in oc._row_blocks(t - 2, sz.rows):  # type: ignore[attr-defined]
            b.op_([s, table, tok], [r, n])  # the last two rows stay unwritten
        out.append(b.case())
    for bad in (v_even, -1):
        b = oc._Build(f"embed token {bad} -> BAD_ARGS", Op.EMBED, gen)
        ids = torch.randint(0, v_even, (8,), generator=gen, dtype=torch.int32)
        ids[5] = bad
        b.op_([b.out("s", DType.F32, (8, 64), oc.EXACT), b.add("table", DType.BF16, b.randn(v_even, 64).bfloat16()),
               b.add("tokens", DType.I32, ids)], [0, 8])
        out.append(b.case(int(ErrorCode.BAD_ARGS)))
    for vocab in (v_even, v_odd, 1):
        for margin in (True, False):
            b = oc._Build(f"argmax V={vocab}" + (", margin" if margin else ""), Op.ARGMAX, gen)
            x = b.randn(t, vocab, scale=3.0)
            x[: t // 2] = (x[: t // 2] * 2).round() / 2  # half the rows on a coarse grid: ties
            x[1] = 1.25  # a row of one value: the first index wins, margin 0
            x[2, vocab // 3] = 1e30  # a clear winner far above the rest
            lg = b.add("logits", DType.F32, x)
            tok = b.out("tokens", DType.I32, (t,), oc.EXACT)
            m = b.out("margin", DType.F32, (t,), oc.EXACT) if margin else None
            for r, n in [(0, 1), (1, 5)] + [(r + 6, n) for r, n in oc._row_blocks(t - 7, 17)]:
                b.op_([lg, tok, m], [r, n])  # the last row stays unwritten
            out.append(b.case())
    for bad in (math.nan, math.inf, -math.inf):
        b = oc._Build(f"argmax logit {bad} -> BAD_ARGS", Op.ARGMAX, gen)
        x = b.randn(6, v_odd)
        x[4, v_odd - 1] = bad
        b.op_([b.add("logits", DType.F32, x), b.out("tokens", DType.I32, (6,), oc.EXACT),
               b.out("margin", DType.F32, (6,), oc.EXACT)], [0, 6])
        out.append(b.case(int(ErrorCode.BAD_ARGS)))
    b = oc._Build("argmax tokens said f32 -> BAD_ARGS", Op.ARGMAX, gen)
    b.op_([b.add("logits", DType.F32, b.randn(4, 32)), b.out("tokens", DType.I32, (4,), oc.EXACT)], [0, 4])
    out.append(b.case(int(ErrorCode.BAD_ARGS), oc._set_table("tokens", "dtype", int(DType.F32), b)))
    return out


def build_cases(oc: ModuleType, sz: object, seed: int) -> list[object]:
    """The step cases alone, seeded as ops_check.build_cases seeds them."""
    return cases_step(oc, sz, oc.builder_gen(seed, cases_step))


def kernel_source(oc: ModuleType) -> str:
    """One test kernel per step op, under the persistent kernel's register budget."""
    lines = ['#if __has_include("runtime/params.cuh")', '#include "runtime/params.cuh"', "#else", "#define GVM_BLOCK_THREADS 640", "#endif",
             f'#include "{HEADER}"']
    lines += [oc._KERNEL.format(name=name) for name in STEP_OPS.values()]
    return "\n".join(lines)


def compile_step(oc: ModuleType, arch: str = "sm_90a") -> tuple[object, str]:
    """NVRTC through cuda.core, as ops_check.compile_ops: (cubin, log with ptxas -v)."""
    from cuda.core import Program as NvProgram
    from cuda.core import ProgramOptions

    include = [str(oc.ROOT)] + ([str(oc.CUDA_INCLUDE)] if oc.CUDA_INCLUDE.is_dir() else [])
    opts = ProgramOptions(arch=arch, std="c++17", include_path=include, ptxas_options="-v", name="gvm_ops_check_step")
    log = io.StringIO()
    obj = NvProgram(kernel_source(oc), "c++", opts).compile("cubin", logs=log)
    return obj, log.getvalue()


def run_cpp(oc: ModuleType, folder: Path | None = None) -> Path:
    """The emulator's run.cpp with EMBED and ARGMAX dispatched (as is when it already does)."""
    src = (oc.EMU_DIR / "run.cpp").read_text()
    if HEADER not in src:
        anchor_inc, anchor_case = '#include "ops/experts.cuh"\n', "        default: return nullptr;\n"
        if src.count(anchor_inc) != 1 or src.count(anchor_case) != 1:
            raise RuntimeError(f"{oc.EMU_DIR / 'run.cpp'} changed: cannot add the step ops to it")
        cases = "".join(f"        case GVM_OP_{op.name}: return gvm_op_{name};\n" for op, name in STEP_OPS.items())
        src = src.replace(anchor_inc, anchor_inc + f'#include "{HEADER}"\n').replace(anchor_case, cases + anchor_case)
    folder = folder or Path(tempfile.gettempdir()) / "gvm_ops_emu_step"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "run.cpp"
    if not path.exists() or path.read_text() != src:
        path.write_text(src)
    return path


def emu_files(oc: ModuleType, folder: Path | None = None) -> dict[str, Path]:
    """ops_check's emulator files plus ops/step.cuh and a run.cpp that dispatches it."""
    return {**oc._EMU_FILES, HEADER: oc.ROOT / HEADER, "run.cpp": run_cpp(oc, folder)}


def extend(oc: ModuleType) -> None:
    """Add EMBED and ARGMAX to ops_check's ops, headers, emulator files and case builders (idempotent)."""
    if Op.EMBED in oc.OPS:
        return
    oc.OPS.update(STEP_OPS)
    oc.HEADERS = (*oc.HEADERS, HEADER)
    oc._EMU_FILES.update(emu_files(oc))
    oc.BUILDERS = (*oc.BUILDERS, functools.partial(cases_step, oc))
    oc.MAKES[cases_step] = frozenset(STEP_OPS)
