#!/usr/bin/env python3
"""Check every Muse op of ops/*.cuh standalone against the CPU backend.

    python3 tools/ops_check.py            # GPU (sm_90a): real shard sizes
    python3 tools/ops_check.py --emu      # CPU: the same headers on the host SIMT emulator, small sizes
    python3 tools/ops_check.py --time 200 # GPU: us per instruction of each case's first one, alone
    options: --only rmsnorm,topk,...  --seed N  --list

Each case builds random inputs and one or more instructions of one op (a
gpuvm Program, so the host checks of gpuvm/opspec.py pass on them), runs them
with a test kernel of that op alone (one warp group per instruction; once with
one group per block and once with two, which run side by side on named
barriers 1 and 2), runs gpuvm/cpu/ops.py on copies of the same inputs, and
compares every output. Outputs start NaN-poisoned (int32 ones POISON_I32), so
an element written on one side only fails; every tensor sits between guard
bytes of 0xFF (NaN to a read past the end) that must come back untouched.
Negative cases hand the op a broken descriptor, argument or routing table and
expect GVM_ERR_BAD_ARGS with nothing written.
Prints one line per output (max |err|, ||err|| / ||ref||, elements out of
tolerance) and the registers / spills of each op's kernel; exits 1 on any
failure.

compile_ops() and kernel_source() are also what tests/test_ops_compile.py uses.
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import io
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Protocol

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gpuvm.cpu.backend import run_stream  # noqa: E402
from gpuvm.device.build import BuildOptions  # noqa: E402
from gpuvm.cpu.ops import OPS as CPU_OPS, residual_stats  # noqa: E402
from gpuvm.isa import TENSOR_DTYPE, DType, ErrorCode, Op, f2i  # noqa: E402
from gpuvm.muse.formats import from_e4m3, tile_nvfp4, to_e4m3  # noqa: E402
from gpuvm.opspec import WORK_COLUMNS_BY_EXPERT, TensorSpec  # noqa: E402
from gpuvm.program import Program, Stream, work_lists  # noqa: E402
from gpuvm.tensors import descriptor, torch_dtype  # noqa: E402

#: device function gvm_op_<name> of each op under test, and the headers that define them
OPS: dict[Op, str] = {
    Op.RMSNORM: "rmsnorm",
    Op.RESIDUAL: "residual",
    Op.QK_ROPE_KV: "qk_rope_kv",
    Op.ATTN_CHUNK: "attn_chunk",
    Op.ATTN_MERGE: "attn_merge",
    Op.TOPK: "topk",
    Op.EXPERT_UP: "expert_up",
    Op.EXPERT_DOWN: "expert_down",
    Op.EXPERT_COMBINE: "expert_combine",
    Op.GEMM: "gemm",
}
HEADERS = ("ops/norm.cuh", "ops/attention.cuh", "ops/route.cuh", "ops/experts.cuh", "ops/gemm.cuh")
SCRATCH = 98304  # shared scratch of a group (runtime/params.cuh GVM_GROUP_SMEM of the 2-group Muse kernel)
GUARD = 4096     # guard bytes (0xFF: NaN as f32, bf16 and e4m3) on each side of every tensor
POISON_I32 = 0x5A5A5A5A  # an int32 output before the run
CUDA_INCLUDE = Path("/usr/local/cuda/include")


def scratch_of(defines: tuple[tuple[str, str], ...]) -> int:
    """A group's scratch under these build defines: GVM_GROUP_SMEM's value if
    given (the ops size their buffers by it), else the Muse kernel's default."""
    return int(dict(defines).get("GVM_GROUP_SMEM", SCRATCH))


# ---- device source ------------------------------------------------------------------
_KERNEL = r"""
extern "C" __global__ void __launch_bounds__(GVM_BLOCK_THREADS, 1)
gvm_check_{name}(const gvm_instr* ins, const gvm_tensor* tab, int n, int* err, unsigned scratch) {{
    extern __shared__ __align__(1024) unsigned char gvm_check_smem[];  // the groups' scratch (1024-aligned, as the VM's), then their instructions
    __shared__ int gvm_check_i[GVM_MAX_GROUPS];  // the group's instruction index, not held in a register across the op
    __shared__ gvm_descs gvm_check_desc[GVM_MAX_GROUPS];  // its operands' descriptors, as the VM's slot
    const unsigned group = threadIdx.x >> 7, groups = blockDim.x >> 7;
    gvm_instr* mine = reinterpret_cast<gvm_instr*>(gvm_check_smem + groups * scratch) + group;
    gvm_ctx c;
    c.ins = mine;
    c.desc = gvm_check_desc[group].t;
    c.tid = threadIdx.x & 127;
    c.bar_id = 1 + group;
    c.step = 0;
    c.smem = gvm_check_smem + group * scratch;
    c.smem_bytes = scratch;
    if (c.tid == 0) gvm_check_i[group] = blockIdx.x * groups + group;
    gvm_group_sync(c);
    for (;;) {{
        const int i = *reinterpret_cast<volatile int*>(&gvm_check_i[group]);
        if (i >= n) break;
        if (c.tid < 32) reinterpret_cast<unsigned*>(mine)[c.tid] = reinterpret_cast<const unsigned*>(ins + i)[c.tid];
        gvm_group_sync(c);
        if (c.tid >= 32 && c.tid < 64) gvm_copy_desc(*mine, tab, gvm_check_desc[group], c.tid - 32);  // as runtime/group.cuh
        gvm_group_sync(c);
        int e;
        for (c.again = 0;; ++c.again) {{  // GVM_AGAIN: call again, scratch kept
            if (GVM_MAX_GROUPS <= 2) c.tid = gvm_opaque(c.tid);  // as the VM's loop (runtime/group.cuh): derived in the op, not held
            e = gvm_op_{name}(c);
            if (e != GVM_AGAIN) break;
        }}
        gvm_group_sync(c);  // every thread has read the index
        if (c.tid == 0) {{
            const int j = *reinterpret_cast<volatile int*>(&gvm_check_i[group]);
            err[j] = e;
            gvm_check_i[group] = j + gridDim.x * groups;
        }}
        gvm_group_sync(c);
    }}
}}
"""


def kernel_source(ops: list[Op] | None = None) -> str:
    """One test kernel per op, compiled under the persistent kernel's register
    budget (__launch_bounds__(GVM_BLOCK_THREADS, 1) of runtime/params.cuh) at
    the group count the Muse kernel is built for (BuildOptions.max_groups)."""
    lines = [
        f"#define GVM_MAX_GROUPS {BuildOptions().max_groups}",
        '#if __has_include("runtime/params.cuh")',
        '#include "runtime/params.cuh"',
        "#else",
        f"#define GVM_BLOCK_THREADS {128 * (BuildOptions().max_groups + 1)}",
        "#endif",
    ]
    lines += [f'#include "{h}"' for h in HEADERS]
    for op in ops or list(OPS):
        lines.append(_KERNEL.format(name=OPS[op]))
    return "\n".join(lines)


def compile_ops(ops: list[Op] | None = None, arch: str = "sm_90a", defines: tuple[tuple[str, str], ...] = ()) -> tuple[object, str]:
    """NVRTC through cuda.core: (cubin ObjectCode, compile log with ptxas -v);
    defines: (MACRO, value) pairs, e.g. a probe switch."""
    from cuda.core import Program as NvProgram
    from cuda.core import ProgramOptions

    include = [str(ROOT)] + ([str(CUDA_INCLUDE)] if CUDA_INCLUDE.is_dir() else [])
    opts = ProgramOptions(arch=arch, std="c++17", include_path=include, ptxas_options="-v", name="gvm_ops_check",
                          define_macro=list(defines) or None)
    log = io.StringIO()
    obj = NvProgram(kernel_source(ops), "c++", opts).compile("cubin", logs=log)
    return obj, log.getvalue()


@dataclass(frozen=True)
class KernelReport:
    name: str
    registers: int | None
    stack: int
    spill_stores: int
    spill_loads: int


_PTXAS = re.compile(
    r"Function properties for (\S+)\s*\n[^\n]*?(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
    r"(?:\s*\n[^\n]*?Used (\d+) registers)?"
)


def ptxas_report(log: str) -> dict[str, KernelReport]:
    """Registers, stack frame and spills of every function in a ptxas -v log."""
    out = {}
    for m in _PTXAS.finditer(log):
        out[m.group(1)] = KernelReport(m.group(1), int(m.group(5)) if m.group(5) else None, *(int(m.group(i)) for i in (2, 3, 4)))
    return out


# ---- cases ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sizes:
    """Shapes of one run: the real shard (GPU) or a small model of it (emulator)."""

    name: str
    d: int            # residual width
    tokens: int       # T of the row ops, the router and the experts
    rows: int         # rows per RMSNORM / RESIDUAL instruction
    hq: int
    hkv: int
    attn_full: tuple[tuple[int, int], ...]     # (new tokens, cached positions) per conversation
    attn_sliding: tuple[tuple[int, int], ...]
    attn_odd: tuple[tuple[int, int], ...]      # ragged tokens, context 0, chunks not a multiple of 16
    chunk: int        # ATTN chunk length (full; sliding uses half)
    odd_chunk: int
    window: int
    ring: int         # cache slots of the sliding / ring cases
    nch_merge: int    # chunks per head in the ATTN_MERGE case
    experts: int      # router width NE
    local: int        # local experts E
    hidden: int       # expert H = I (a multiple of 128: tiled NVFP4)
    cols: int         # weight rows per expert work item (a multiple of 16)
    big_tokens: int   # T of the second TOPK case (prefill-like)
    nch_deep: int = 53  # chunks per head of the ATTN_MERGE head-split case: past the 24 a lane of four busy warps


SHARD = Sizes(
    "shard", d=8192, tokens=256, rows=8, hq=16, hkv=2,
    attn_full=tuple((8, 81920 + 5 * c) for c in range(32)),
    attn_sliding=tuple((1, 81920 + 7 * c) for c in range(16)),
    attn_odd=((1, 0), (5, 100), (37, 3000)),
    chunk=2048, odd_chunk=640, window=2048, ring=4096, nch_merge=41,
    experts=256, local=32, hidden=4096, cols=256, big_tokens=3012, nch_deep=81,
)
SMALL = Sizes(
    "small", d=256, tokens=48, rows=5, hq=16, hkv=2,
    attn_full=((1, 0), (3, 20), (9, 70)),
    attn_sliding=((2, 150), (5, 40)),
    attn_odd=((1, 0), (5, 7), (4, 30)),
    chunk=32, odd_chunk=24, window=64, ring=96, nch_merge=5,
    experts=64, local=4, hidden=384, cols=80, big_tokens=150,
)
SIZES = {"shard": SHARD, "small": SMALL}


@dataclass(frozen=True)
class Check:
    """How an output is compared: 'exact' bytes, 'float' (|d - r| <= atol +
    atol_max * max|r| + rtol * |r| elementwise and ||d - r|| / ||r|| <= norm),
    'e4m3' (the bytes that differ, decoded, elementwise as float), 'route'
    ([5, 8T]: rows 0, 2, 4 exact, rows 1 and 3 float bits compared as floats)
    or 'counter' (an int that may have advanced by up to atol)."""

    kind: str
    rtol: float = 0.0
    atol: float = 0.0
    atol_max: float = 0.0
    norm: float = math.inf


EXACT = Check("exact")
BF16 = Check("float", rtol=2.0**-7, atol=1e-6, norm=5e-3)   # a bf16 output: one rounding step
F32 = Check("float", rtol=1e-5, atol=1e-6, norm=1e-5)
E4M3 = Check("e4m3", rtol=0.13, atol=2.0**-9)   # one e4m3 step either way; rel: the fraction of bytes that differ
ROUTE = Check("route", rtol=1e-5, atol=1e-7)


@dataclass
class Case:
    name: str
    op: Op
    stream: Stream
    tensors: dict[str, torch.Tensor]   # CPU tensors as the run starts
    checks: dict[str, Check]
    expect: int = int(ErrorCode.NONE)
    corrupt: Callable[[np.ndarray, np.ndarray], None] | None = None  # (records, table), for negative cases


class _Build:
    """Collects one case's tensors, instructions and checks."""

    def __init__(self, name: str, op: Op, gen: torch.Generator) -> None:
        self.name, self.op, self.gen = name, op, gen
        self.prog = Program(name)
        self.tensors: dict[str, torch.Tensor] = {}
        self.checks: dict[str, Check] = {}

    def add(self, name: str, dtype: DType, value: torch.Tensor, check: Check | None = None) -> TensorSpec:
        self.tensors[name] = value.contiguous()
        if check is not None:
            self.checks[name] = check
        return self.prog.tensor(name, tuple(value.shape), dtype)

    def out(self, name: str, dtype: DType, shape: tuple[int, ...], check: Check) -> TensorSpec:
        """A poisoned output: NaN bytes, or POISON_I32 for int32."""
        t = torch.empty(shape, dtype=torch_dtype(dtype))
        if dtype == DType.I32:
            t.fill_(POISON_I32)
        else:
            t.view(torch.uint8).fill_(0xFF)
        return self.add(name, dtype, t, check)

    def randn(self, *shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(shape, generator=self.gen) * scale

    def e4m3(self, *shape: int, scale: float = 1.0) -> torch.Tensor:
        return to_e4m3(self.randn(*shape, scale=scale)).view(torch.uint8)

    def op_(self, tensors: list[TensorSpec | None], args: list[int]) -> None:
        self.prog.op(self.op, tensors, args)

    def case(self, expect: int = int(ErrorCode.NONE), corrupt: Callable[[np.ndarray, np.ndarray], None] | None = None) -> Case:
        return Case(self.name, self.op, self.prog.build(order="given"), self.tensors, self.checks, expect, corrupt)


def _set_arg(i: int, value: int) -> Callable[[np.ndarray, np.ndarray], None]:
    """Corrupt argument i of every instruction (a negative case)."""

    def corrupt(records: np.ndarray, table: np.ndarray) -> None:
        records["arg"][:, i] = value

    return corrupt


def _set_table(name: str, key: str, value: int, b: "_Build") -> Callable[[np.ndarray, np.ndarray], None]:
    """Corrupt one field of a tensor's descriptor (a negative case)."""
    index = list(b.tensors).index(name)

    def corrupt(records: np.ndarray, table: np.ndarray) -> None:
        table[index][key] = value

    return corrupt


def _tiny_rows(x: torch.Tensor) -> torch.Tensor:
    """Every 7th row scaled by 1e-4: there mean(x^2) is below the rms epsilon,
    so an op that drops or misplaces it fails."""
    x[1::7] *= 1e-4
    return x


def _row_blocks(n: int, per: int) -> list[tuple[int, int]]:
    return [(r, min(per, n - r)) for r in range(0, n, per)]


def cases_norm(sz: Sizes, gen: torch.Generator) -> list[Case]:
    out = []
    t, d = sz.tokens, sz.d
    for dt, chk in ((DType.F32, F32), (DType.BF16, BF16)):
        b = _Build(f"rmsnorm {dt.name.lower()} out", Op.RMSNORM, gen)
        o = b.out("out", dt, (t, d), chk)
        x = b.add("x", DType.F32, _tiny_rows(b.randn(t, d, scale=3.0)))
        w = b.add("w", DType.F32, b.randn(d, scale=0.2))
        for r, n in _row_blocks(t, sz.rows):
            b.op_([o, x, w], [r, n])
        out.append(b.case())
    for variant in ("f32+bf16 out", "bf16 out", "no w_next"):
        b = _Build(f"residual {variant}", Op.RESIDUAL, gen)
        s = b.add("s", DType.F32, b.randn(t, d, scale=2.0), F32)
        a = b.add("a", DType.F32, _tiny_rows(b.randn(t, d, scale=5.0)))
        al = b.add("alpha", DType.F32, 1.0 + b.randn(d, scale=0.1))
        be = b.add("beta", DType.F32, 0.3 + b.randn(d, scale=0.1))
        slots = [s, a, al, be]
        if variant != "no w_next":
            wn = b.add("w_next", DType.F32, b.randn(d, scale=0.2))
            f32 = b.out("n_f32", DType.F32, (t, d), F32) if variant == "f32+bf16 out" else None
            slots += [wn, f32, b.out("n_bf16", DType.BF16, (t, d), BF16)]
        for r, n in _row_blocks(t, sz.rows):
            b.op_(slots, [r, n])
        out.append(b.case())
    # columns of rows whose sums come with them (GEMM residual statistics, P
    # slots over uneven column tiles): column ranges of whole float4s, uneven
    for variant in ("f32+bf16 out", "no w_next"):
        b = _Build(f"residual columns {variant}", Op.RESIDUAL, gen)
        sv, av = b.randn(t, d, scale=2.0), _tiny_rows(b.randn(t, d, scale=5.0))
        alv, bev = 1.0 + b.randn(d, scale=0.1), 0.3 + b.randn(d, scale=0.1)
        s = b.add("s", DType.F32, sv.clone(), F32)
        a = b.add("a", DType.F32, av)
        al, be = b.add("alpha", DType.F32, alv), b.add("beta", DType.F32, bev)
        tiles = _gemm_cols(d, (40, 13, 64, 7))
        stats = torch.stack([residual_stats(av[:, c0:c0 + n], sv[:, c0:c0 + n], alv[c0:c0 + n], bev[c0:c0 + n]) for c0, n in tiles], 1)
        st = b.add("stats", DType.F32, stats)
        slots = [s, a, al, be]
        if variant != "no w_next":
            slots += [b.add("w_next", DType.F32, b.randn(d, scale=0.2)), b.out("n_f32", DType.F32, (t, d), F32),
                      b.out("n_bf16", DType.BF16, (t, d), BF16)]
        else:
            slots += [None, None, None]
        for r, n in _row_blocks(t, sz.rows):
            for c0, cn in _gemm_cols(d, (4 * (d // 20), 8, 4 * (d // 7))):
                b.op_([*slots, st], [r, n, c0, cn])
        out.append(b.case())
    b = _Build("residual columns not of whole float4s -> BAD_ARGS", Op.RESIDUAL, gen)
    b.op_([b.add("s", DType.F32, b.randn(2, 64), EXACT), b.add("a", DType.F32, b.randn(2, 64)), b.add("alpha", DType.F32, b.randn(64)),
           b.add("beta", DType.F32, b.randn(64)), None, None, None, b.add("stats", DType.F32, b.randn(2, 3, 4))], [0, 2, 0, 32])
    out.append(b.case(int(ErrorCode.BAD_ARGS), _set_arg(3, 30)))
    b = _Build("rmsnorm w said bf16 -> BAD_ARGS", Op.RMSNORM, gen)
    b.op_([b.out("out", DType.F32, (4, 64), EXACT), b.add("x", DType.F32, b.randn(4, 64)), b.add("w", DType.F32, b.randn(64))], [0, 4])
    out.append(b.case(int(ErrorCode.BAD_ARGS), _set_table("w", "dtype", int(DType.BF16), b)))
    return out


def _convs(spec: tuple[tuple[int, int], ...]) -> torch.Tensor:
    rows, tok = [], 0
    for n, pos0 in spec:
        rows.append((tok, n, pos0, 0))
        tok += n
    return torch.tensor(rows, dtype=torch.int32)


def cases_qk(sz: Sizes, gen: torch.Generator) -> list[Case]:
    out = []
    spec = sz.attn_full
    width = (2 * sz.hq + 2 * sz.hkv) * 64
    top = max(p + n for n, p in spec)
    # the last: the one-token decode's single instruction (what --time times at one token)
    for rope, slots, name, sp in ((1, top + 16, "rope, linear cache", spec), (0, sz.ring // 2, "no rope, ring cache", spec),
                                  (1, top + 16, "rope, one token", ((1, spec[-1][1]),)),
                                  (1, top + 16, "rope, tokens in ranges (a4, a5)", spec)):
        b = _Build(f"qk_rope_kv {name}", Op.QK_ROPE_KV, gen)
        convs = _convs(sp)
        t = int(convs[:, 1].sum())
        x = b.add("qkvg", DType.BF16, _tiny_rows(b.randn(t, width)).bfloat16())
        q = b.out("q", DType.BF16, (t, sz.hq, 64), BF16)
        wq = b.add("w_qn", DType.F32, b.randn(64, scale=0.2))
        wk = b.add("w_kn", DType.F32, b.randn(64, scale=0.2))
        kc = b.add("k_cache", DType.E4M3, b.e4m3(len(sp), slots, sz.hkv, 64), E4M3)
        vc = b.add("v_cache", DType.E4M3, b.e4m3(len(sp), slots, sz.hkv, 64), E4M3)
        cv = b.add("convs", DType.I32, convs)
        for c in range(len(sp)):
            if name.startswith("rope, tokens in ranges"):  # pairs of tokens, the rest (a5 = 0), and a range past the end (nothing)
                n = int(convs[c, 1])
                for j0, jn in [(j, 2) for j in range(0, n - 1, 2)] + [(n - n % 2 if n % 2 else n, 0), (n + 3, 1)]:
                    b.op_([x, q, wq, wk, kc, vc, cv], [c, rope, f2i(0.5), f2i(2.0), j0, jn])
            else:
                b.op_([x, q, wq, wk, kc, vc, cv], [c, rope, f2i(0.5), f2i(2.0)])
        out.append(b.case())
    return out


def _attn_case(name: str, sz: Sizes, gen: torch.Generator, spec: tuple[tuple[int, int], ...], chunk: int, window: int,
               slots: int, nch: int | None = None, bad: Callable[[np.ndarray, np.ndarray], None] | None = None,
               k_growth: float = 0.0) -> Case:
    """k_growth > 0: key slot s scaled by 2^(k_growth (s % chunk) / chunk), so that a
    chunk's scores keep passing their running max (the rounds' lazy rescaling)."""
    b = _Build(name, Op.ATTN_CHUNK, gen)
    convs = _convs(spec)
    t = int(convs[:, 1].sum())
    need = max(math.ceil((p + n - (max(0, p - window + 1) if window else 0)) / chunk) for n, p in spec)
    nch = nch or need + 1  # one chunk past every conversation's keys: nothing visible there
    q = b.add("q", DType.BF16, b.randn(t, sz.hq, 64).bfloat16())
    if k_growth > 0:
        grow = 2.0 ** (k_growth * (torch.arange(slots) % chunk).float() / chunk)
        k = to_e4m3(b.randn(len(spec), slots, sz.hkv, 64) * grow[None, :, None, None]).view(torch.uint8)
    else:
        k = b.e4m3(len(spec), slots, sz.hkv, 64)
    kc = b.add("k_cache", DType.E4M3, k)
    vc = b.add("v_cache", DType.E4M3, b.e4m3(len(spec), slots, sz.hkv, 64, scale=2.0))
    cv = b.add("convs", DType.I32, convs)
    po = b.out("part_o", DType.F32, (t, sz.hq, nch, 64), Check("float", rtol=1e-2, atol_max=2e-3, norm=2e-3))
    pml = b.out("part_ml", DType.F32, (t, sz.hq, nch, 2), Check("float", rtol=1e-3, atol=1e-4, norm=1e-4))
    for c in range(len(spec)):
        for h in range(sz.hkv):
            for j in range(nch if bad is None else 1):
                b.op_([q, kc, vc, cv, po, pml], [c, h, j, chunk, window, f2i(0.75), f2i(1.5)])
    return b.case(int(ErrorCode.BAD_ARGS), bad) if bad else b.case()


def _attn_fused_case(name: str, sz: Sizes, gen: torch.Generator, spec: tuple[tuple[int, int], ...], chunk: int,
                     window: int, slots: int) -> Case:
    """ATTN_CHUNK's fused form (q from qkvg, the new keys written by the chunk
    holding them): every chunk of every (conversation, kv head), RoPE as in a
    sliding layer when window > 0. slots >= window + new tokens, as state.py
    makes a sliding ring: no new key overwrites one a query still sees."""
    b = _Build(name, Op.ATTN_CHUNK, gen)
    convs = _convs(spec)
    t = int(convs[:, 1].sum())
    nch = max(math.ceil((p + n - (max(0, p - window + 1) if window else 0)) / chunk) for n, p in spec)
    x = b.add("qkvg", DType.BF16, _tiny_rows(b.randn(t, (2 * sz.hq + 2 * sz.hkv) * 64)).bfloat16())
    kc = b.add("k_cache", DType.E4M3, b.e4m3(len(spec), slots, sz.hkv, 64), E4M3)
    vc = b.add("v_cache", DType.E4M3, b.e4m3(len(spec), slots, sz.hkv, 64, scale=2.0), E4M3)
    cv = b.add("convs", DType.I32, convs)
    po = b.out("part_o", DType.F32, (t, sz.hq, nch, 64), Check("float", rtol=1e-2, atol_max=2e-3, norm=2e-3))
    # q is normed here in f32 whose last bit may differ from the reference's: a q
    # element a bf16 step off moves a row's max m, and l by e^dm with it (l e^m is
    # what is fixed); an f64 rms in the reference moves l by up to 1.4e-3
    pml = b.out("part_ml", DType.F32, (t, sz.hq, nch, 2), Check("float", rtol=1e-2, atol=1e-4, norm=1e-4))
    wq = b.add("w_qn", DType.F32, b.randn(64, scale=0.2))
    wk = b.add("w_kn", DType.F32, b.randn(64, scale=0.2))
    for c in range(len(spec)):
        for h in range(sz.hkv):
            for j in range(nch):
                b.op_([x, kc, vc, cv, po, pml, wq, wk], [c, h, j, chunk, window, f2i(0.75), f2i(1.5), int(window > 0)])
    return b.case()


def cases_attn(sz: Sizes, gen: torch.Generator) -> list[Case]:
    top = max(p + n for n, p in sz.attn_full)
    out = [
        _attn_case("attn_chunk full", sz, gen, sz.attn_full, sz.chunk, 0, top + 16),
        _attn_case("attn_chunk sliding, ring cache", sz, gen, sz.attn_sliding, sz.chunk // 2, sz.window, sz.ring),
        _attn_case("attn_chunk ragged tokens, odd chunks", sz, gen, sz.attn_odd, sz.odd_chunk, 0, sz.ring),
        # 64-row rounds over chunks of several 64-key steps (the small sizes' chunks are one step), 1 and 2
        # rounds, a partial last step and round, and a chunk past the keys (no step)
        _attn_case("attn_chunk 64-row rounds, 5-step chunks", sz, gen, ((8, 300), (9, 250), (5, 200)), 320, 0, 336),
        _attn_case("attn_chunk chunk past NCH -> BAD_ARGS", sz, gen, ((1, 3),), 16, 0, 16, nch=2, bad=_set_arg(2, 2)),
        _attn_case("attn_chunk k scale 0 -> BAD_ARGS", sz, gen, ((1, 3),), 16, 0, 16, bad=_set_arg(5, f2i(0.0))),
    ]
    # the fused form, in its own generator: the cases above keep their inputs
    fgen = torch.Generator().manual_seed(gen.initial_seed() + 30)
    out += [
        _attn_fused_case("attn_chunk fused, full", sz, fgen, sz.attn_full, sz.chunk, 0, top + 16),
        _attn_fused_case("attn_chunk fused, sliding ring, rope", sz, fgen, sz.attn_sliding, sz.chunk // 2, sz.window,
                         sz.window + max(n for n, _ in sz.attn_sliding)),
        _attn_fused_case("attn_chunk fused, ragged tokens, odd chunks", sz, fgen, sz.attn_odd, sz.odd_chunk, 0, sz.ring),
    ]
    # keys growing through each chunk: the rounds' maxima pass their reference several times a chunk
    ggen = torch.Generator().manual_seed(gen.initial_seed() + 40)
    out.append(_attn_case("attn_chunk 64-row rounds, keys growing 2^6 a chunk", sz, ggen, ((8, 300), (9, 250), (5, 200)),
                          320, 0, 336, k_growth=6.0))
    # ATTN_MERGE: every head (the two-argument form), then head ranges; outputs of
    # the heads left out stay NaN on both sides, so a stray write fails
    b = _Build("attn_merge", Op.ATTN_MERGE, gen)
    slots = _merge_inputs(b, sz, sz.tokens, sz.nch_merge)
    for r, n in _row_blocks(sz.tokens, 3):
        b.op_(slots, [r, n])
    out.append(b.case())
    mgen = torch.Generator().manual_seed(gen.initial_seed() + 20)  # the other cases' inputs stay as they were
    for name, h0, nh in (("heads 3..7", 3, 5), ("heads 9.. (a3 = 0)", 9, 0)):
        b = _Build(f"attn_merge {name}", Op.ATTN_MERGE, mgen)
        slots = _merge_inputs(b, sz, sz.tokens, sz.nch_merge)
        for r, n in _row_blocks(sz.tokens, 3):
            b.op_(slots, [r, n, h0, nh])
        out.append(b.case())
    # a4: the first chunks only (a conversation cut into fewer chunks than NCH);
    # the slots past them are NaN, so reading one fails
    b = _Build("attn_merge first chunks (a4), NaN past them", Op.ATTN_MERGE, mgen)
    slots = _merge_inputs(b, sz, sz.tokens, sz.nch_merge)
    for name in ("part_o", "part_ml"):
        b.tensors[name][:, :, sz.nch_merge - 2 :] = math.nan
    for r, n in _row_blocks(sz.tokens, 3):
        b.op_(slots, [r, n, 0, 0, sz.nch_merge - 2])
    out.append(b.case())
    # many chunks, one token an instruction, its heads split as a decode step's
    # merges are (--time times the first): four busy warps hold 24 chunks a lane,
    # so past 48 chunks a head goes in batches; fewer busy warps hold more
    for name, ranges in (("16 heads", ((0, sz.hq),)), ("4 heads", tuple((h, 4) for h in range(0, sz.hq, 4))),
                         ("1 head", tuple((h, 1) for h in range(sz.hq))), ("heads 0 | 1..2 | 3..5 | 6..", ((0, 1), (1, 2), (3, 3), (6, 0)))):
        b = _Build(f"attn_merge {sz.nch_deep} chunks, 1 token x {name}", Op.ATTN_MERGE, mgen)
        slots = _merge_inputs(b, sz, 2, sz.nch_deep)
        for t in range(2):
            for h0, nh in ranges:
                b.op_(slots, [t, 1, h0, nh])
        out.append(b.case())
    b = _Build("attn_merge heads past HQ -> BAD_ARGS", Op.ATTN_MERGE, mgen)
    b.op_(_merge_inputs(b, sz, 2, 3, check=EXACT), [0, 2, 3, 5])
    out.append(b.case(int(ErrorCode.BAD_ARGS), _set_arg(3, sz.hq - 2)))
    b = _Build("attn_merge chunks past NCH -> BAD_ARGS", Op.ATTN_MERGE, mgen)
    b.op_(_merge_inputs(b, sz, 2, 3, check=EXACT), [0, 2, 3, 5, 2])
    out.append(b.case(int(ErrorCode.BAD_ARGS), _set_arg(4, 4)))
    return out


def _merge_inputs(b: _Build, sz: Sizes, t: int, nch: int, check: Check = BF16) -> list[TensorSpec]:
    """o, part_o, part_ml, qkvg of an ATTN_MERGE: chunk states with some chunks
    empty (m = -inf, l = 0, o = 0), never the first."""
    width = (2 * sz.hq + 2 * sz.hkv) * 64
    m = b.randn(t, sz.hq, nch, scale=2.0)
    l = torch.rand((t, sz.hq, nch), generator=b.gen) * 50 + 0.5
    empty = torch.rand((t, sz.hq, nch), generator=b.gen) < 0.25
    empty[..., 0] = False
    m[empty], l[empty] = -math.inf, 0.0
    o = b.out("o", DType.BF16, (t, sz.hq * 64), check)
    po = b.add("part_o", DType.F32, _tiny_rows(b.randn(t, sz.hq, nch, 64) * l[..., None]))
    pml = b.add("part_ml", DType.F32, torch.stack((m, l), -1))
    x = b.add("qkvg", DType.BF16, b.randn(t, width, scale=2.0).bfloat16())
    return [o, po, pml, x]


def _router(b: _Build, t: int, sz: Sizes, first: int, ties: bool) -> torch.Tensor:
    """Router scores skewed as the benchmarks are: the first local expert busy,
    the second never picked; ties: scores on a 1/4 grid."""
    s = b.randn(t, sz.experts)
    s[:, first] += 2.5
    s[:, first + 1] -= 20.0
    s[: t // 2, first + 2 : first + sz.local // 2 + 1] += 1.0
    return (s * 4).round() / 4 if ties else s


def _routing(b: _Build, t: int, sz: Sizes) -> tuple[torch.Tensor, torch.Tensor]:
    """route_meta and route of a skewed router, by the CPU backend's TOPK."""
    meta = torch.empty(2, sz.local, dtype=torch.int32)
    route = torch.full((5, 8 * t), -7, dtype=torch.int32)
    CPU_OPS[Op.TOPK]([_router(b, t, sz, 0, False), meta, route], [0, sz.local])
    return meta, route


def cases_route(sz: Sizes, gen: torch.Generator) -> list[Case]:
    out = []
    # T = 1: the one-token decode's (what --time times at one token)
    for t, first, ties in ((sz.tokens, 0, True), (sz.big_tokens, sz.experts - sz.local, False), (1, 0, False)):
        b = _Build(f"topk T={t} local {first}..{first + sz.local - 1}" + (", ties" if ties else ""), Op.TOPK, gen)
        work = [b.out("work", DType.I32, (3, 2), EXACT)] if ties else []  # zeroed (the experts' work lists)
        b.op_([b.add("scores", DType.F32, _router(b, t, sz, first, ties)),
               b.out("route_meta", DType.I32, (2, sz.local), EXACT),
               b.out("route", DType.I32, (5, 8 * t), ROUTE), *work], [first, sz.local])
        out.append(b.case())
    # many tokens: the picks over token ranges (mode 1, one instruction each),
    # then the table from given picks (mode 2)
    t = sz.big_tokens
    b = _Build(f"topk T={t} picks in ranges of 16", Op.TOPK, gen)
    sc, meta, route = b.add("scores", DType.F32, _router(b, t, sz, 0, False)), b.out("route_meta", DType.I32, (2, sz.local), EXACT), \
        b.out("route", DType.I32, (5, 8 * t), ROUTE)
    for t0 in range(0, t, 16):
        b.op_([sc, meta, route], [0, sz.local, 1, t0, min(16, t - t0)])
    out.append(b.case())
    picks = torch.full((5, 8 * t), POISON_I32, dtype=torch.int32)
    CPU_OPS[Op.TOPK]([_router(b, t, sz, 0, False), torch.empty(2, sz.local, dtype=torch.int32), picks], [0, sz.local, 1, 0, t])
    b = _Build(f"topk T={t} table from the picks", Op.TOPK, gen)
    b.op_([b.add("scores", DType.F32, torch.full((t, sz.experts), float("nan"))), b.out("route_meta", DType.I32, (2, sz.local), EXACT),
           b.add("route", DType.I32, picks, ROUTE), b.out("work", DType.I32, (3, 2), EXACT)], [0, sz.local, 2])
    out.append(b.case())
    b = _Build("topk E past the meta -> BAD_ARGS", Op.TOPK, gen)
    b.op_([b.add("scores", DType.F32, b.randn(4, 16)), b.out("route_meta", DType.I32, (2, 4), EXACT),
           b.out("route", DType.I32, (5, 32), EXACT)], [0, 4])
    out.append(b.case(int(ErrorCode.BAD_ARGS), _set_arg(1, 5)))
    return out


def _nvfp4(b: _Build, *lead: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random NVFP4 codes and scales of [*lead, K] (the last of lead: rows), tiled as the ops take them."""
    codes = torch.randint(0, 256, (*lead, k // 2), generator=b.gen, dtype=torch.uint8)
    scales = to_e4m3(2.0 ** (torch.rand((*lead, k // 16), generator=b.gen) * 4 - 3)).view(torch.uint8)
    return tile_nvfp4(codes, scales)


def _top_expert_of(sz: Sizes, seed: int, count: int) -> int:
    """The fewest tokens whose routing (_routing, first from a generator of this
    seed) gives the busy expert `count` of them."""
    for t in range(count, 8 * count):
        meta, _ = _routing(_Build("", Op.TOPK, torch.Generator().manual_seed(seed)), t, sz)
        if int(meta[0].max()) == count:
            return t
    raise AssertionError(f"no token count gives an expert {count} tokens")


def cases_experts(sz: Sizes, gen: torch.Generator) -> list[Case]:
    out = []
    # (name, tokens, rows out, K, own seed): the layer's shapes, then few tokens
    # over a K of 36 steps and a tiled step (half a step of the shared tile),
    # then the shard's K with an expert of 7 tokens (more than one staging of x
    # holds on the register path: the shared tile's) and one of 8 (in 96 KB of
    # scratch both lists on the register path with a 2-slot ring; in 72 KB UP
    # without a ring and DOWN on the shared tile: gvm_expr_fits; its own
    # generator, so that the other cases' inputs stay as they were) and one of
    # 12 (the shared tile's one-m-tile chunk over 16 K steps, both lists); 40
    # and 24 rows end in a part block
    seed8, seed12 = gen.initial_seed() + 40, gen.initial_seed() + 41
    shapes = (("", sz.tokens, sz.hidden, sz.hidden, None), (" long K", 3, 40, 36 * 256 + 128, None), (" K 4096", 8, 24, 4096, None),
              (" K 4096, an expert of 8 tokens", _top_expert_of(sz, seed8, 8), 24, 4096, seed8),
              (" K 4096, an expert of 12 tokens", _top_expert_of(sz, seed12, 12), 24, 4096, seed12))
    for up in (True, False):
        for what, t, h, k, seed in shapes:
            op = Op.EXPERT_UP if up else Op.EXPERT_DOWN
            b = _Build(op.name.lower() + what, op, gen if seed is None else torch.Generator().manual_seed(seed))
            meta, route = _routing(b, t, sz)
            if up:
                x = b.add("x", DType.BF16, b.randn(t, k).bfloat16())
                codes, scales = _nvfp4(b, sz.local, 2, h, k=k)
                ts = b.add("gu_tscale", DType.F32, 0.01 + torch.rand((sz.local, 2), generator=gen) * 0.01)
            else:
                x = b.add("hbuf", DType.BF16, b.randn(8 * t, k).bfloat16())
                codes, scales = _nvfp4(b, sz.local, h, k=k)
                ts = b.add("d_tscale", DType.F32, 0.01 + torch.rand((sz.local,), generator=gen) * 0.01)
            cd = b.add("codes", DType.E2M1X2, codes)
            sc = b.add("scales", DType.E4M3, scales)
            mt = b.add("route_meta", DType.I32, meta)
            rt = b.add("route", DType.I32, route)
            # ends at (items + workers, items); the up lists count their rows by expert after them, and
            # the down lists wait for list 7's (a5 = 8), which are all done (the wait itself: the GPU's tests)
            work = torch.zeros(8, WORK_COLUMNS_BY_EXPERT, dtype=torch.int32)
            if not up:
                work[7, 2:] = k
            wk = b.add("work", DType.I32, work, EXACT)
            # work lists (workers, row grain, row cap: multiples of 16, items
            # start on a tiled block; fixed round robin or claimed), each into
            # its own output: 7 workers at a grain of sz.cols on counter 0, then
            # grains of 32 and 16 rows with more workers than items (items of
            # one and two units: the K split four and two ways); then 7 workers
            # capped at 32 rows; then 7 over items of 48 rows, three units; then
            # 5 fixed workers, several items each; then 7 capped at 32 rows with
            # the experts of more than one token heavy (a6: items of 16 rows)
            many = sz.local * -(-h // 16) + 5
            lists = [(7, sz.cols, 1 << 20, False, 0), (many, 32, 1 << 20, False, 0), (many, 16, 1 << 20, False, 0), (7, 16, 32, False, 0),
                     (7, 48, 1 << 20, False, 0), (5, 16, 32, True, 0), (7, 16, 32, False, 1)]
            for kk, (n_w, grain, cap, fixed, heavy) in enumerate(lists):
                if up:
                    dst = b.out(f"hbuf{kk}", DType.BF16, (8 * t, h), Check("float", rtol=2.0**-7, atol_max=1e-3, norm=5e-3))
                else:
                    dst = b.out(f"y{kk}", DType.F32, (8 * t, h), Check("float", rtol=1e-4, atol_max=1e-5, norm=1e-5))
                for wi in range(n_w):
                    b.op_([dst, x, cd, sc, ts, mt, rt, wk], [kk, n_w, grain, cap, wi + 1 if fixed else 0, 0 if up else 8, heavy])
            out.append(b.case())
    # a down list whose expert 0's up rows never all come (one short): its first item times out
    b = _Build("expert_down waiting for up rows that never come -> WATCHDOG", Op.EXPERT_DOWN, gen)
    meta, route = _routing(b, 8, replace(sz, local=2))
    codes, scales = _nvfp4(b, 2, 64, k=128)
    work = torch.zeros(2, WORK_COLUMNS_BY_EXPERT, dtype=torch.int32)
    work[1, 2:] = 128
    work[1, 2] = 127
    b.op_([b.out("y", DType.F32, (64, 64), EXACT), b.add("hbuf", DType.BF16, b.randn(64, 128).bfloat16()),
           b.add("codes", DType.E2M1X2, codes), b.add("scales", DType.E4M3, scales), b.add("tscale", DType.F32, torch.ones(2)),
           b.add("route_meta", DType.I32, meta), b.add("route", DType.I32, route),
           b.add("work", DType.I32, work, Check("counter", atol=1))], [0, 1, 64, 64, 0, 2])
    out.append(b.case(int(ErrorCode.WATCHDOG)))
    b = _Build("expert_combine", Op.EXPERT_COMBINE, gen)
    meta, route = _routing(b, t, sz)
    y = _tiny_rows(b.randn(8 * t, h) * (0.5 + torch.rand((8 * t, 1), generator=gen) * 1.5))
    fsq, yy, rt = b.out("fsq", DType.BF16, (t, h), BF16), b.add("y", DType.F32, y), b.add("route", DType.I32, route)
    for r, n in _row_blocks(t, 7):
        b.op_([fsq, yy, rt], [r, n])
    out.append(b.case())
    corrupt = {"counter past the work": _set_arg(0, 1), "a slot's token past x": None, "a row grain of 8 (not a tiled block)": _set_arg(2, 8),
               "a fixed worker past the workers": _set_arg(4, 2)}
    for what, bad in corrupt.items():
        b = _Build(f"expert_up {what} -> BAD_ARGS", Op.EXPERT_UP, gen)
        meta, route = _routing(b, 8, replace(sz, local=2))
        if what != "counter past the work":
            route[0, int(meta[1, 0])] = 8  # the first slot of expert 0 (the busy one)
        codes, scales = _nvfp4(b, 2, 2, 64, k=128)
        b.op_([b.out("hbuf", DType.BF16, (64, 64), EXACT), b.add("x", DType.BF16, b.randn(8, 128).bfloat16()),
               b.add("codes", DType.E2M1X2, codes), b.add("scales", DType.E4M3, scales),
               b.add("tscale", DType.F32, torch.ones(2, 2)), b.add("route_meta", DType.I32, meta),
               b.add("route", DType.I32, route),
               b.add("work", DType.I32, torch.zeros(1, 2, dtype=torch.int32), Check("counter", atol=1))], [0, 1, 64, 64])
        out.append(b.case(int(ErrorCode.BAD_ARGS), bad))
    return out


GEMM_F32 = Check("float", rtol=1e-5, atol_max=1e-6, norm=1e-5)  # f32 sums in another order: a few ulp of max|ref|
GEMM_BF16 = Check("float", rtol=2.0**-7, atol_max=2e-3, norm=5e-3)  # bf16 out; f32 out: exact products, sums reordered
GEMM_CNTS = (13, 1, 8, 4, 2, 3, 16, 5, 7)  # rows per instruction, in turn
STATS = Check("float", rtol=1e-4, atol_max=1e-4, norm=1e-4)  # sums of squares of an f32 GEMM output whose K sums are reordered (~1e-5 at K = 8,192), the cross term of both signs


def _gemm_cols(n: int, cnts: tuple[int, ...]) -> list[tuple[int, int]]:
    """Column blocks [n0, n0 + cnt) covering n, cnt taken from cnts in turn (the last one cut)."""
    out, c0, i = [], 0, 0
    while c0 < n:
        k = min(cnts[i % len(cnts)], n - c0)
        out.append((c0, k))
        c0, i = c0 + k, i + 1
    return out


def _ranged_gemm(name: str, gen: torch.Generator, xdt: DType, odt: DType, chk: Check, t: int, k: int, n_out: int,
                 cnts: tuple[int, ...], spans: tuple[tuple[int, int], ...], alternate: bool) -> Case:
    """A GEMM case whose column tiles (cnts in turn) each cover the token
    ranges `spans` ((0, 0): all tokens), or, with alternate, every other one
    all tokens (a3 = 0)."""
    b = _Build(name, Op.GEMM, gen)
    o = b.out("out", odt, (t, n_out), chk)
    x = b.add("x", xdt, b.randn(t, k, scale=2.0).to(torch_dtype(xdt)))
    w = b.add("w", xdt, b.randn(n_out, k, scale=0.05).to(torch_dtype(xdt)))
    for i, (c0, c) in enumerate(_gemm_cols(n_out, cnts)):
        for t0, tn in ((0, 0),) if alternate and i % 2 else spans:
            b.op_([o, x, w], [c0, c, t0, tn])
    return b.case()


def cases_gemm(sz: Sizes, gen: torch.Generator) -> list[Case]:
    """GEMM out[T, n] = x[T, K] W[n, K]^T: the f32 router (W [experts, d]) at
    T = 1 with one cnt per case (--time times a case's first instruction),
    then at T = 1, 3, 20 and sz.tokens with every cnt of GEMM_CNTS, also at a
    K whose 16-byte chunks do not split evenly over the 128 threads; then bf16
    (bf16 and f32 out); then f32 with each column tile over token ranges
    (a3 > 0) that start and end inside tiles of 8, bf16 over token ranges (x
    staged from 64 tokens), and ranges past x (refused)."""
    out = []
    n, d = sz.experts, sz.d
    k_odd = max(d, 1280) + 8
    cases = [(1, d, (cnt,)) for cnt in (1, 2, 4, 8, 16)]
    cases += [(t, k, GEMM_CNTS) for t in (1, 3, 20, sz.tokens) for k in ((d, k_odd) if t in (1, 20) else (d,))]
    for t, k, cnts in cases:
        what = f"cnt={cnts[0]}" if len(cnts) == 1 else "cnt " + ",".join(map(str, sorted(set(cnts))))
        b = _Build(f"gemm f32 T={t} K={k} {what}", Op.GEMM, gen)
        o = b.out("out", DType.F32, (t, n), GEMM_F32)
        x = b.add("x", DType.F32, b.randn(t, k, scale=2.0))
        w = b.add("w", DType.F32, b.randn(n, k, scale=0.05))
        for c0, c in _gemm_cols(n, cnts):
            b.op_([o, x, w], [c0, c])
        out.append(b.case())
    for t in (3, 20):
        for dt in (DType.BF16, DType.F32):
            b = _Build(f"gemm bf16 T={t} {dt.name.lower()} out", Op.GEMM, gen)
            o = b.out("out", dt, (t, 2 * n), GEMM_BF16)
            x = b.add("x", DType.BF16, b.randn(t, d, scale=2.0).bfloat16())
            w = b.add("w", DType.BF16, b.randn(2 * n, d, scale=0.05).bfloat16())
            for c0, c in _gemm_cols(2 * n, (40, 16, 13, 64)):
                b.op_([o, x, w], [c0, c])
            out.append(b.case())
    # one, 8 and 20 tokens at K of d, 8 d and 32 d (the shard's 8,192 at small d),
    # and a K whose rows are not a multiple of 512 bytes, over every tile size
    for t, k in ((1, d), (1, 8 * d), (1, 32 * d), (8, 8 * d), (20, 8 * d), (1, d + 8)):
        out.append(_ranged_gemm(f"gemm bf16 T={t} K={k} cnt 1,3,13,16,40,64 f32 out", gen, DType.BF16, DType.F32, GEMM_BF16,
                                t, k, 2 * n, (40, 1, 16, 13, 64, 3), ((0, 0),), alternate=False))
    spans = ((0, 1), (1, 9), (10, 1), (11, 9))  # token ranges [t0, t0 + t) covering T = 20
    b = _Build("gemm f32 T=20 token ranges", Op.GEMM, gen)
    o = b.out("out", DType.F32, (20, 2 * n), GEMM_F32)
    x = b.add("x", DType.F32, b.randn(20, d, scale=2.0))
    w = b.add("w", DType.F32, b.randn(2 * n, d, scale=0.05))
    for c0, c in _gemm_cols(2 * n, (2, 16, 5)):
        for t0, t in spans:
            b.op_([o, x, w], [c0, c, t0, t])
    out.append(b.case())
    # bf16 token ranges: x staged in shared memory from 64 tokens (ops/gemm.cuh
    # gvm_gemm_xs: 64-token passes, rows in passes of 64, partial ones), token
    # tiles of 8 below 64 tokens or when K is not a multiple of 64
    # (every other column tile of the T=100 case takes all tokens: a3 = 0, two passes)
    for t, k, spans, dt in ((70, d, ((0, 64), (64, 6)), DType.BF16), (100, d, ((0, 36), (36, 64)), DType.F32),
                            (80, d + 8, ((0, 80),), DType.BF16)):
        out.append(_ranged_gemm(f"gemm bf16 T={t} K={k} token ranges {dt.name.lower()} out", gen, DType.BF16, dt, GEMM_BF16,
                                t, k, 2 * n, (64, 13, 40, 128, 16), spans, alternate=t == 100))
    # passes of two 64-row halves on one x stage from more than 64 rows (GVM_GEMM_XS_M2): whole, the
    # second half partial (100), and a remainder of one half (28)
    out.append(_ranged_gemm("gemm bf16 T=70 token ranges in staged passes of 128 rows, f32 out", gen, DType.BF16, DType.F32, GEMM_BF16,
                            70, d, 4 * n, (128, 100, 28), ((0, 64), (64, 6)), alternate=False))
    out.append(_ranged_gemm(f"gemm bf16 T=20 K={8 * d} one-token ranges f32 out", gen, DType.BF16, DType.F32, GEMM_BF16,
                            20, 8 * d, 2 * n, (40, 1, 16, 13, 64, 3), ((0, 1), (7, 1), (1, 6), (8, 12)), alternate=False))
    # at most 8 rows and 4 tokens: the K range folded onto the MMA's rows g + 8 (ops/gemm.cuh, fold), over
    # token ranges of 1 to 4 and 5; K of 8 d folds, d + 8 does not (its units' K ranges are odd)
    for k in (8 * d, d + 8):
        out.append(_ranged_gemm(f"gemm bf16 T=20 K={k} token ranges of 1-5, rows 1-8, bf16 out", gen, DType.BF16, DType.BF16,
                                GEMM_BF16, 20, k, 2 * n, (8, 5, 1, 3, 16, 7, 2), ((0, 4), (4, 3), (7, 2), (9, 5), (14, 1), (15, 5)),
                                alternate=False))
    # f32 from 64 tokens: W and x staged in shared memory (ops/gemm.cuh
    # gvm_gemm_f32_xs: 32 rows x 64 tokens a pass), over a range, all tokens,
    # and a K whose float4s are not a multiple of 8 (the register tiles)
    # (odd column tiles of the first case take all tokens: a3 = 0, passes of 64 and 36)
    for t, k, spans, alternate in ((100, d, ((0, 64), (64, 36)), True), (70, k_odd, ((0, 70),), False)):
        out.append(_ranged_gemm(f"gemm f32 T={t} K={k} token ranges, staged", gen, DType.F32, DType.F32, GEMM_F32,
                                t, k, 2 * n, (32, 13, 40, 64), spans, alternate))
    # residual statistics of each column tile (t3..t6, slot a4), at 1, 8 and 20
    # tokens, over token ranges, and staged from 64 tokens; the 150-row tile
    # takes two passes of the 4-token-tile registers (read back), the others one
    for t, spans in ((1, ((0, 0),)), (8, ((0, 0),)), (20, ((0, 0),)), (20, ((0, 7), (7, 13))), (70, ((0, 64), (64, 6)))):
        b = _Build(f"gemm bf16 T={t} residual statistics" + (" over token ranges" if spans[0][1] else ""), Op.GEMM, gen)
        o = b.out("out", DType.F32, (t, 4 * n), GEMM_BF16)
        x = b.add("x", DType.BF16, b.randn(t, d, scale=2.0).bfloat16())
        w = b.add("w", DType.BF16, b.randn(4 * n, d, scale=0.05).bfloat16())
        cols = _gemm_cols(4 * n, (40, 13, 150, 1, 64))
        st = b.out("stats", DType.F32, (t, len(cols), 4), STATS)
        extra = [b.add("s", DType.F32, b.randn(t, 4 * n, scale=2.0)), b.add("alpha", DType.F32, 1.0 + b.randn(4 * n, scale=0.1)),
                 b.add("beta", DType.F32, 0.3 + b.randn(4 * n, scale=0.1))]
        for i, (c0, c) in enumerate(cols):
            for t0, tn in spans:
                b.op_([o, x, w, st, *extra], [c0, c, t0, tn, i])
        out.append(b.case())
    # K parts (a5 P, a6 part, a7 ticket): the router's tiles cut over K, each
    # tile's last part adding them up. Staged (32 tokens and more: the staged
    # pass's tokens half used at 40), register tiles over token ranges, one
    # token; tickets that start past zero by a multiple of P (later steps)
    for t, n_parts, k, spans, start in ((100, 4, 8 * d, ((0, 64), (64, 36)), 0), (40, 16, 32 * d, ((0, 40),), 32),
                                        (20, 2, 8 * d, ((0, 7), (7, 13)), 2), (1, 8, 8 * d, ((0, 0),), 0)):
        b = _Build(f"gemm f32 T={t} K={k} {n_parts} K parts", Op.GEMM, gen)
        o = b.out("out", DType.F32, (t, 2 * n), GEMM_F32)
        x = b.add("x", DType.F32, b.randn(t, k, scale=2.0))
        w = b.add("w", DType.F32, b.randn(2 * n, k, scale=0.05))
        tiles = [(c0, c, t0, tn) for c0, c in _gemm_cols(2 * n, (32, 13, 40, 64)) for t0, tn in spans]
        parts = b.out("parts", DType.F32, (t, n_parts * 2 * n), GEMM_F32)
        tickets = b.add("tickets", DType.I32, torch.full((len(tiles),), start, dtype=torch.int32), EXACT)
        for j in range(n_parts):  # every tile's part j, then part j + 1: a tile's last part is the last pass's
            for m, (c0, c, t0, tn) in enumerate(tiles):
                b.op_([o, x, w, parts, tickets], [c0, c, t0, tn, 0, n_parts, j, m])
        out.append(b.case())
    # bf16 K parts, on the staged path only (64 tokens and more an instruction,
    # K / P a multiple of 64): Wqkvg's few 64 x 64 tiles spread over the groups;
    # bf16 and f32 out (the last part rounds the sum once)
    for t, n_parts, spans, dt in ((130, 4, ((0, 64), (64, 66)), DType.BF16), (64, 2, ((0, 0),), DType.F32)):
        b = _Build(f"gemm bf16 T={t} K={4 * d} {n_parts} K parts {dt.name.lower()} out", Op.GEMM, gen)
        o = b.out("out", dt, (t, 2 * n), GEMM_BF16)
        x = b.add("x", DType.BF16, b.randn(t, 4 * d, scale=2.0).bfloat16())
        w = b.add("w", DType.BF16, b.randn(2 * n, 4 * d, scale=0.05).bfloat16())
        tiles = [(c0, c, t0, tn) for c0, c in _gemm_cols(2 * n, (64, 13, 40, 128)) for t0, tn in spans]
        parts = b.out("parts", DType.F32, (t, n_parts * 2 * n), GEMM_BF16)
        tickets = b.add("tickets", DType.I32, torch.zeros(len(tiles), dtype=torch.int32), EXACT)
        for j in reversed(range(n_parts)):  # the last part first: whichever finishes last adds them up
            for m, (c0, c, t0, tn) in enumerate(tiles):
                b.op_([o, x, w, parts, tickets], [c0, c, t0, tn, 0, n_parts, j, m])
        out.append(b.case())
    b = _Build("gemm bf16 K parts, under 64 tokens -> BAD_ARGS", Op.GEMM, gen)  # the register tiles have no K parts
    b.op_([b.out("out", DType.BF16, (64, 16), EXACT), b.add("x", DType.BF16, b.randn(64, 256).bfloat16()),
           b.add("w", DType.BF16, b.randn(16, 256).bfloat16()), b.out("parts", DType.F32, (64, 64), EXACT),
           b.add("tickets", DType.I32, torch.zeros(1, dtype=torch.int32))], [0, 16, 0, 64, 0, 4, 0, 0])
    out.append(b.case(int(ErrorCode.BAD_ARGS), _set_arg(3, 32)))
    for what, i, bad in (("3 parts", 5, 3), ("part past P", 6, 4), ("ticket past the tickets", 7, 1)):
        b = _Build(f"gemm f32 K parts, {what} -> BAD_ARGS", Op.GEMM, gen)
        b.op_([b.out("out", DType.F32, (2, 16), EXACT), b.add("x", DType.F32, b.randn(2, 96)), b.add("w", DType.F32, b.randn(16, 96)),
               b.out("parts", DType.F32, (2, 64), EXACT), b.add("tickets", DType.I32, torch.zeros(1, dtype=torch.int32))],
              [0, 16, 0, 0, 0, 4, 0, 0])
        out.append(b.case(int(ErrorCode.BAD_ARGS), _set_arg(i, bad)))
    b = _Build("gemm statistics slot past P -> BAD_ARGS", Op.GEMM, gen)
    b.op_([b.out("out", DType.F32, (2, 16), EXACT), b.add("x", DType.BF16, b.randn(2, 64).bfloat16()), b.add("w", DType.BF16, b.randn(16, 64).bfloat16()),
           b.out("stats", DType.F32, (2, 2, 4), EXACT), b.add("s", DType.F32, b.randn(2, 16)), b.add("alpha", DType.F32, b.randn(16)),
           b.add("beta", DType.F32, b.randn(16))], [0, 16, 0, 0, 1])
    out.append(b.case(int(ErrorCode.BAD_ARGS), _set_arg(4, 2)))
    b = _Build("gemm bf16 token range past x -> BAD_ARGS", Op.GEMM, gen)
    b.op_([b.out("out", DType.F32, (40, 16), EXACT), b.add("x", DType.BF16, b.randn(40, 64).bfloat16()),
           b.add("w", DType.BF16, b.randn(16, 64).bfloat16())], [0, 16, 0, 40])
    out.append(b.case(int(ErrorCode.BAD_ARGS), _set_arg(2, 1)))
    b = _Build("gemm f32 token range past x -> BAD_ARGS", Op.GEMM, gen)
    b.op_([b.out("out", DType.F32, (4, 16), EXACT), b.add("x", DType.F32, b.randn(4, 64)),
           b.add("w", DType.F32, b.randn(16, 64))], [0, 16, 2, 2])
    out.append(b.case(int(ErrorCode.BAD_ARGS), _set_arg(3, 3)))
    b = _Build("gemm f32 cnt past W -> BAD_ARGS", Op.GEMM, gen)
    b.op_([b.out("out", DType.F32, (2, 16), EXACT), b.add("x", DType.F32, b.randn(2, 64)),
           b.add("w", DType.F32, b.randn(16, 64))], [8, 8])
    out.append(b.case(int(ErrorCode.BAD_ARGS), _set_arg(1, 9)))
    return out


BUILDERS = (cases_norm, cases_qk, cases_attn, cases_route, cases_experts, cases_gemm)
#: the ops each builder makes cases of, so that --only builds just those builders' cases (at
#: the shard's sizes attention's and QK's inputs alone take a minute); a builder not named here
#: is always built
MAKES: dict[Callable[..., list[Case]], frozenset[Op]] = {
    cases_norm: frozenset({Op.RMSNORM, Op.RESIDUAL}), cases_qk: frozenset({Op.QK_ROPE_KV}),
    cases_attn: frozenset({Op.ATTN_CHUNK, Op.ATTN_MERGE}), cases_route: frozenset({Op.TOPK}),
    cases_experts: frozenset({Op.EXPERT_UP, Op.EXPERT_DOWN, Op.EXPERT_COMBINE}), cases_gemm: frozenset({Op.GEMM}),
}


def builder_gen(seed: int, fn: Callable[..., list[Case]]) -> torch.Generator:
    """The generator of builder function fn, from the run's seed and fn's name: its cases are
    the same whichever builders run beside it."""
    return torch.Generator().manual_seed(seed * 1_000_003 + int(hashlib.sha256(fn.__name__.encode()).hexdigest()[:6], 16))


def build_cases(sz: Sizes, seed: int, only: set[Op] | None = None) -> list[Case]:
    cases = []
    for build in BUILDERS:
        fn = getattr(build, "func", build)  # ops_check_step's builder is a partial
        made = MAKES.get(fn)
        if only is None or made is None or made & only:
            cases += build(sz, builder_gen(seed, fn))
    return [c for c in cases if only is None or c.op in only]


def reference(case: Case) -> dict[str, torch.Tensor]:
    """The case's tensors after gpuvm/cpu/ops.py ran its instructions; a
    negative case expects them untouched."""
    bufs = {k: v.clone() for k, v in case.tensors.items()}
    if case.expect == ErrorCode.NONE:
        run_stream(case.stream, bufs, threads=os.cpu_count() or 1)
    return bufs


# ---- running -----------------------------------------------------------------------------
class Runner(Protocol):
    device: str

    def run(self, op: Op, records: np.ndarray, table: np.ndarray, groups: int, scratch: int) -> np.ndarray:
        """Error code of each instruction."""
        ...


@dataclass
class Placed:
    """A case's tensors on the runner's device, each between guard bytes."""

    views: dict[str, torch.Tensor]
    raws: dict[str, torch.Tensor] = field(default_factory=dict)

    def guards_hit(self) -> list[str]:
        """Tensors whose guard bytes changed."""
        return [n for n, r in self.raws.items() if bool((r[:GUARD] != 0xFF).any() or (r[-GUARD:] != 0xFF).any())]


def place(tensors: dict[str, torch.Tensor], device: str) -> Placed:
    p = Placed({})
    for name, t in tensors.items():
        nb = t.numel() * t.element_size()
        raw = torch.full((nb + 2 * GUARD,), 0xFF, dtype=torch.uint8, device=device)
        view = raw[GUARD : GUARD + nb].view(t.dtype).view(t.shape)
        view.copy_(t)
        p.views[name], p.raws[name] = view, raw
    return p


def encode(case: Case, placed: Placed) -> tuple[np.ndarray, np.ndarray]:
    table = np.array([descriptor(s, placed.views[s.name]) for s in case.stream.tensors], dtype=TENSOR_DTYPE)
    records = case.stream.records.copy()
    if case.corrupt is not None:
        case.corrupt(records, table)
    return records, table


class GpuRunner:
    """The test kernels on the current CUDA device, through cuda.core."""

    device = "cuda"

    def __init__(self, arch: str = "sm_90a", defines: tuple[tuple[str, str], ...] = ()) -> None:
        from cuda.core import Device

        self.dev = Device()
        self.dev.set_current()
        obj, self.log = compile_ops(arch=arch, defines=defines)
        self.scratch = scratch_of(defines)  # a group's, as the build sizes the ops' buffers
        self.kernels = {op: obj.get_kernel(f"gvm_check_{name}") for op, name in OPS.items()}
        self.stream = self.dev.create_stream()
        self.sms = self.dev.properties.multiprocessor_count
        for k in self.kernels.values():  # two groups of a full scratch each: past the default 48 KB
            self._allow_smem(k, 2 * (128 + self.scratch))

    def _allow_smem(self, kernel: object, nbytes: int) -> None:
        from cuda.bindings import driver

        attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        h = kernel.handle
        if isinstance(h, driver.CUfunction):
            rc = driver.cuFuncSetAttribute(h, attr, nbytes)[0]
        else:  # cuda.core loads through the library API: a CUkernel (or its address)
            h = h if isinstance(h, driver.CUkernel) else driver.CUkernel(int(h))
            rc = driver.cuKernelSetAttribute(attr, nbytes, h, driver.CUdevice(self.dev.device_id))[0]
        if rc != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cannot allow {nbytes} bytes of dynamic shared memory: {rc}")

    def time(self, op: Op, record: np.ndarray, table: np.ndarray, reps: int, scratch: int = SCRATCH) -> float:
        """Microseconds per instruction of one instruction run reps times back to
        back by one warp group of one block (launch overhead amortised; its inputs
        stay warm in L2 as a step's do)."""
        records = np.repeat(record[:1], reps)
        ins, tab, err = self._upload(records, table)
        self._launch(op, ins, tab, err, 1, scratch, 1)  # warm-up: module load, caches
        self.stream.sync()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        ts = torch.cuda.ExternalStream(int(self.stream.handle))
        ev[0].record(ts)
        self._launch(op, ins, tab, err, 1, scratch, 1)
        ev[1].record(ts)
        ev[1].synchronize()
        return ev[0].elapsed_time(ev[1]) * 1e3 / reps

    @staticmethod
    def _upload(records: np.ndarray, table: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ins = torch.from_numpy(records.view(np.uint8).copy()).cuda()
        tab = torch.from_numpy(table.view(np.uint8).copy()).cuda()
        err = torch.full((len(records),), -1, dtype=torch.int32, device="cuda")
        torch.cuda.synchronize()
        return ins, tab, err

    def _launch(self, op: Op, ins: torch.Tensor, tab: torch.Tensor, err: torch.Tensor, groups: int, scratch: int, grid: int) -> None:
        from cuda.core import LaunchConfig, launch

        cfg = LaunchConfig(grid=grid, block=128 * groups, shmem_size=groups * (128 + scratch))
        launch(self.stream, cfg, self.kernels[op], np.uint64(ins.data_ptr()), np.uint64(tab.data_ptr()), np.int32(len(err)),
               np.uint64(err.data_ptr()), np.uint32(scratch))

    def run(self, op: Op, records: np.ndarray, table: np.ndarray, groups: int, scratch: int,
            grid: int | None = None) -> np.ndarray:
        ins, tab, err = self._upload(records, table)
        n = len(records)
        self._launch(op, ins, tab, err, groups, scratch, grid or max(1, min((n + groups - 1) // groups, 4 * self.sms)))
        self.stream.sync()
        return err.cpu().numpy()


EMU_DIR = ROOT / "tools" / "ops_emu"
_EMU_FILES = {  # staged path -> source
    "ops/simt.h": EMU_DIR / "simt.h",
    "ops/op_ctx.cuh": EMU_DIR / "op_ctx.cuh",
    "ops/ptx.cuh": EMU_DIR / "ptx.cuh",
    "ops/common.cuh": ROOT / "ops/common.cuh",
    "isa/gvm_isa.h": ROOT / "isa/gvm_isa.h",
    "run.cpp": EMU_DIR / "run.cpp",
    "runtime/params.cuh": ROOT / "runtime/params.cuh",  # ops/gemm.cuh: GVM_MAX_GROUPS, GVM_GROUP_THREADS
    **{h: ROOT / h for h in HEADERS},
}


def build_emulator(cache: Path | None = None, files: dict[str, Path] | None = None,
                   defines: tuple[tuple[str, str], ...] = ()) -> Path:
    """The op headers compiled for the host against tools/ops_emu (g++), cached
    by the hash of every source and define. files: staged path -> source,
    default _EMU_FILES; defines: (MACRO, value) pairs. The group count is the
    Muse kernel's (BuildOptions.max_groups) unless defines set GVM_MAX_GROUPS:
    the ops' defaults (GEMM tiles) depend on it."""
    files = files or _EMU_FILES
    if not any(k == "GVM_MAX_GROUPS" for k, _ in defines):
        defines = (("GVM_MAX_GROUPS", str(BuildOptions().max_groups)), *defines)
    digest = hashlib.sha256(repr(sorted(defines)).encode())
    for rel, src in sorted(files.items()):
        digest.update(rel.encode() + b"\0" + src.read_bytes())
    cache = cache or Path(tempfile.gettempdir()) / "gvm_ops_emu"
    lib = cache / f"gvm_ops_emu_{digest.hexdigest()[:16]}.so"
    if lib.exists():
        return lib
    stage = Path(tempfile.mkdtemp(prefix="gvm_ops_emu_"))
    try:
        for rel, src in files.items():
            (stage / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, stage / rel)
        cache.mkdir(parents=True, exist_ok=True)
        tmp = lib.with_suffix(f".{os.getpid()}.tmp")
        cmd = ["g++", "-std=c++17", "-O1", "-shared", "-fPIC", "-Wall", "-Wno-unknown-pragmas", "-I", str(stage),
               *(f"-D{k}={v}" for k, v in defines), str(stage / "run.cpp"), "-o", str(tmp)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"emulator build failed:\n{r.stderr}")
        tmp.replace(lib)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return lib


class EmuError(RuntimeError):
    """The emulator stopped a run: deadlock, divergent return codes, a bad shared access."""


class EmuRunner:
    """The same headers on the host SIMT emulator (tools/ops_emu), one group at a time."""

    device = "cpu"

    def __init__(self, lib: Path | None = None) -> None:
        self.lib = ctypes.CDLL(str(lib or build_emulator()))
        f = self.lib.gvm_emu_run
        f.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
        f.restype = ctypes.c_int

    def run(self, op: Op, records: np.ndarray, table: np.ndarray, groups: int, scratch: int) -> np.ndarray:
        n = len(records)
        err = np.full(n, -1, dtype=np.int32)
        msg = ctypes.create_string_buffer(1024)
        rc = self.lib.gvm_emu_run(records.ctypes.data, n, table.ctypes.data, scratch, err.ctypes.data, msg, len(msg))
        if rc != 0:
            raise EmuError(msg.value.decode())
        return err


# ---- comparing ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    case: str
    groups: int
    output: str
    ok: bool
    max_abs: float = 0.0
    rel: float = 0.0
    bad: int = 0
    total: int = 0
    note: str = ""


def _float_compare(d: torch.Tensor, r: torch.Tensor, chk: Check) -> tuple[bool, float, float, int, str]:
    d, r = d.double().flatten(), r.double().flatten()
    nan_d, nan_r = torch.isnan(d), torch.isnan(r)
    mism = int((nan_d != nan_r).sum())
    fin = ~nan_r & ~nan_d
    d, r = d[fin], r[fin]
    if r.numel() == 0:
        return mism == 0, 0.0, 0.0, mism, "nothing written" if mism == 0 else f"{mism} NaN mismatches"
    inf_bad = int(((d != r) & (torch.isinf(d) | torch.isinf(r))).sum())
    fin2 = torch.isfinite(r) & torch.isfinite(d)
    d, r = d[fin2], r[fin2]
    err = (d - r).abs()
    scale = float(r.abs().max()) if r.numel() else 0.0
    bad = int((err > chk.atol + chk.atol_max * scale + chk.rtol * r.abs()).sum()) + inf_bad + mism
    rel = float(err.norm() / r.norm()) if float(r.norm()) > 0 else float(err.norm())
    note = f"{mism} NaN mismatches" if mism else ""
    return bad == 0 and rel <= chk.norm, float(err.max()) if err.numel() else 0.0, rel, bad, note


def compare(dev: torch.Tensor, ref: torch.Tensor, chk: Check) -> tuple[bool, float, float, int, str]:
    """(ok, max |err|, ||err|| / ||ref||, elements out of tolerance, note)."""
    if chk.kind == "exact":
        bad = int((dev.view(torch.uint8) != ref.view(torch.uint8)).sum())
        return bad == 0, 0.0, 0.0, bad, ""
    if chk.kind == "counter":  # may only have advanced, by at most atol
        bad = int(((dev < ref) | (dev > ref + chk.atol)).sum())
        return bad == 0, float((dev - ref).abs().max()), 0.0, bad, ""
    if chk.kind == "e4m3":  # decode only the bytes that differ: a KV cache is large
        diff = dev.view(torch.uint8) != ref.view(torch.uint8)
        if not bool(diff.any()):
            return True, 0.0, 0.0, 0, ""
        ok, mx, _, bad, note = _float_compare(from_e4m3(dev[diff]), from_e4m3(ref[diff]), chk)
        return ok, mx, float(diff.sum()) / max(1, diff.numel()), bad, note
    if chk.kind == "route":
        ints, floats = [0, 2, 4], [1, 3]
        bad = int((dev[ints] != ref[ints]).sum())
        fd, fr = dev[floats], ref[floats]
        unwritten = fr == POISON_I32  # slots past the local picks
        bad += int((fd[unwritten] != POISON_I32).sum())
        ok, mx, rel, fb, note = _float_compare(fd[~unwritten].view(torch.float32), fr[~unwritten].view(torch.float32), chk)
        return ok and bad == 0, mx, rel, bad + fb, note
    return _float_compare(dev, ref, chk)


def _signal_check(stream: Stream, amount: np.ndarray) -> str:
    """What is wrong with the signals the instructions asked for ("" if
    nothing): one each, but a work list's, whose a1 come from the worker that
    took the first draw past the items (1) and the one that finished the list
    (a1 - 1), or one that did both, the others nothing."""
    lists = work_lists(stream.ops)
    workers = {i for idx in lists.values() for i in idx}
    for i in range(len(stream.ops)):
        if i not in workers and amount[i] != 1:
            return f"instruction {i} signals {amount[i]}, not 1"
    for (_, k), idx in lists.items():
        w0 = stream.ops[idx[0]]
        got, n_w = sorted(int(a) for a in amount[idx]), w0.args[1]
        if got != [0] * (len(idx) - 1) + [n_w] and not (n_w > 1 and got == [0] * (len(idx) - 2) + [1, n_w - 1]):
            return f"work list {w0.tensors[7].name}[{k}]: its workers signal {got}, not {n_w} between one or two of them (1 and {n_w - 1}), the others 0"
    return ""


def split_rc(rc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ops' return codes -> (error codes, what each adds to its signal counter):
    0 is done adding one, GVM_SIGNAL_N(n) (rc <= -2) done adding n."""
    return np.where(rc <= -2, 0, rc), np.where(rc == 0, 1, np.where(rc <= -2, -2 - rc, 0))


def run_case(runner: Runner, case: Case, expected: dict[str, torch.Tensor], groups: int, scratch: int = SCRATCH) -> list[Outcome]:
    placed = place(case.tensors, runner.device)
    records, table = encode(case, placed)
    err, amount = split_rc(runner.run(case.op, records, table, groups, scratch))
    out = []
    if not (err == case.expect).all():
        codes = sorted(set(int(e) for e in err))
        out.append(Outcome(case.name, groups, "error codes", False, note=f"got {codes}, expected {case.expect}"))
    elif case.expect == ErrorCode.NONE:
        note = _signal_check(case.stream, amount)
        if note:
            out.append(Outcome(case.name, groups, "signals", False, note=note))
    hit = placed.guards_hit()
    if hit:
        out.append(Outcome(case.name, groups, "guards", False, note=f"written outside: {hit}"))
    names = case.checks if case.expect == ErrorCode.NONE else case.tensors  # a failed op writes nothing
    for name in names:  # (but a work counter: an expert takes an item before it finds the item broken)
        chk = case.checks.get(name, EXACT) if case.expect == ErrorCode.NONE or name == "work" else EXACT
        ok, mx, rel, bad, note = compare(placed.views[name].cpu(), expected[name], chk)
        out.append(Outcome(case.name, groups, name, ok, mx, rel, bad, expected[name].numel(), note))
    return out


def print_report(log: str) -> bool:
    """Registers and spills of each op's kernel; False when one spills."""
    rep = ptxas_report(log)
    ok = True
    print(f"{'kernel':28} {'regs':>5} {'stack':>6} {'spill st/ld':>12}")
    for name, r in sorted(rep.items()):
        spills = r.spill_stores or r.spill_loads or r.stack
        ok = ok and not spills
        print(f"{name:28} {r.registers or '-':>5} {r.stack:>6} {r.spill_stores:>5}/{r.spill_loads:<6}" + ("  SPILLS" if spills else ""))
    return ok


def time_cases(runner: GpuRunner, cases: list[Case], reps: int) -> int:
    """Latency of each positive case's first instruction, alone on one group."""
    print(f"{'case':44} {'us/instr':>9}")
    for case in cases:
        if case.expect != ErrorCode.NONE:
            continue
        bufs = place(case.tensors, runner.device)  # kept alive while the kernel reads them
        records, table = encode(case, bufs)
        print(f"{case.name[:44]:44} {runner.time(case.op, records, table, reps):9.2f}")
        del bufs
    return 0


if (ROOT / "tools" / "ops_check_step.py").exists():  # EMBED and ARGMAX cases (the whole-step ops)
    __import__("tools.ops_check_step", fromlist=["extend"]).extend(sys.modules[__name__])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--emu", action="store_true", help="run on the host SIMT emulator at small sizes")
    ap.add_argument("--sizes", choices=sorted(SIZES), help="default: shard on the GPU, small on the emulator")
    ap.add_argument("--only", default="", help="comma-separated ops, e.g. topk,attn_chunk")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--define", action="append", default=[], metavar="MACRO=VALUE",
                    help="a build switch for the op headers, e.g. GVM_EXPERT_REG=0 (repeatable)")
    ap.add_argument("--time", type=int, default=0, metavar="N",
                    help="GPU: run each case's first instruction N times alone and print us per instruction")
    a = ap.parse_args(argv)
    names = {v: k for k, v in OPS.items()}
    try:
        only = {names[s.strip()] for s in a.only.split(",") if s.strip()} or None
    except KeyError as e:
        ap.error(f"unknown op {e}; one of {sorted(names)}")
    sz = SIZES[a.sizes or ("small" if a.emu else "shard")]
    cases = build_cases(sz, a.seed, only)
    if a.list:
        for c in cases:
            print(f"{OPS[c.op]:15} {c.name}: {len(c.stream)} instructions")
        return 0
    defines = tuple((d.partition("=")[0], d.partition("=")[2] or "1") for d in a.define)
    runner: Runner = EmuRunner(build_emulator(defines=defines)) if a.emu else GpuRunner(defines=defines)
    if a.time:
        if not isinstance(runner, GpuRunner):
            ap.error("--time needs the GPU")
        return time_cases(runner, cases, a.time)
    ok = True
    if isinstance(runner, GpuRunner):
        ok = print_report(runner.log)
        print(f"device: {runner.dev.name}, sizes: {sz.name}")
    print(f"{'case':44} {'g':>1} {'output':12} {'max|err|':>10} {'rel':>9} {'bad':>12}  status")
    for case in cases:
        expected = reference(case)
        for groups in ((1,) if a.emu else (1, 2)):
            try:
                results = run_case(runner, case, expected, groups, scratch_of(defines))
            except EmuError as e:
                results = [Outcome(case.name, groups, "emulator", False, note=str(e))]
            for r in results:
                ok = ok and r.ok
                print(f"{r.case[:44]:44} {r.groups:>1} {r.output[:12]:12} {r.max_abs:10.3g} {r.rel:9.2g} "
                      f"{r.bad:>5}/{r.total:<6}  {'ok' if r.ok else 'FAIL'} {r.note}")
    print("ALL OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
