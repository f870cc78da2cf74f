"""What each opcode accepts and what it costs, on the host.

One entry per opcode of isa/gvm_isa.h: names of its tensor slots and
arguments, a checker that raises ProgramError on a shape, dtype or argument
the device op could not honour, and a cost (bytes of weights, bytes of
activations, flops) used to order the stream and by the scheduler model.
The semantics themselves are written once in the header's comments, once in
gpuvm/cpu (the oracle) and once in ops/ (the device).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

from .isa import DTYPE_BYTES, EXPERT_SHARE_ABOVE, EXPERT_SHARES, GEMM_MAX_PARTS, HEAD_DIM, MAX_WORKLIST_EXPERTS, NVFP4_TILE_K, NVFP4_TILE_ROWS, TOPK, DType, Op, i2f


class ProgramError(ValueError):
    """A program the VM must not run: raised before anything is launched."""


@dataclass(frozen=True)
class TensorSpec:
    """A tensor of the program's table: name, shape, dtype and role."""

    name: str
    shape: tuple[int, ...]
    dtype: DType
    role: str = "activation"  # weight | activation | state | list (gpuvm.program.ROLES)
    index: int = -1  # position in the program's tensor table

    @property
    def nbytes(self) -> int:
        n = DTYPE_BYTES[self.dtype]
        for s in self.shape:
            n *= s
        return n

    @property
    def row_bytes(self) -> int:
        """Bytes of one index of dim 0."""
        return self.nbytes // self.shape[0] if self.shape and self.shape[0] else 0


class Cost(NamedTuple):
    """Bytes of weights and activations an op moves and the flops it does
    (a tuple: built for every op of a 500K-op step program)."""

    weight_bytes: int = 0
    act_bytes: int = 0
    flops: int = 0


Slots = Sequence["TensorSpec | None"]
Args = Sequence[int]


@dataclass(frozen=True)
class OpSpec:
    slots: tuple[str, ...]
    args: tuple[str, ...]
    check: Callable[[Slots, Args], None]
    cost: Callable[[Slots, Args], Cost]



def _t(ts: Slots, i: int, name: str, dtypes: Sequence[DType], ndim: int | None = None) -> TensorSpec:
    # messages are built only on failure: this runs for every slot of every op
    t = ts[i] if i < len(ts) else None
    if t is None:
        raise ProgramError(f"slot t{i} ({name}) is required")
    if t.dtype not in dtypes:
        raise ProgramError(f"t{i} ({name}) '{t.name}' has dtype {t.dtype.name}, expected one of {[d.name for d in dtypes]}")
    if ndim is not None and len(t.shape) != ndim:
        raise ProgramError(f"t{i} ({name}) '{t.name}' has shape {t.shape}, expected {ndim} dims")
    return t


def _opt(ts: Slots, i: int) -> TensorSpec | None:
    return ts[i] if i < len(ts) else None


def _range(a0: int, n: int, size: int, what: str) -> None:
    if not (n >= 0 and a0 >= 0 and a0 + n <= size):
        raise ProgramError(f"{what} range [{a0}, {a0 + n}) outside [0, {size})")


def _numel(t: TensorSpec) -> int:
    n = 1
    for s in t.shape:
        n *= s
    return n


F = (DType.F32,)
BF = (DType.BF16,)
I32 = (DType.I32,)
E4M3 = (DType.E4M3,)


# ---- synthetic ops ----------------------------------------------------------
def _check_nop(ts: Slots, a: Args) -> None:
    pass


def _check_sleep(ts: Slots, a: Args) -> None:
    if not (len(a) >= 1 and 0 <= a[0] <= 1_000_000_000):
        raise ProgramError("SLEEP needs a0 in [0, 1e9] nanoseconds")


def _check_copy(ts: Slots, a: Args) -> None:
    dst, src = _t(ts, 0, "dst", F), _t(ts, 1, "src", F)
    _range(a[0], a[1], min(_numel(dst), _numel(src)), "COPY element")


def _check_scale_add(ts: Slots, a: Args) -> None:
    d, x, y = _t(ts, 0, "dst", F), _t(ts, 1, "x", F), _t(ts, 2, "y", F)
    _range(a[0], a[1], min(_numel(d), _numel(x), _numel(y)), "SCALE_ADD element")


def _cost_elementwise(n_tensors: int) -> Callable[[Slots, Args], Cost]:
    return lambda ts, a: Cost(act_bytes=4 * n_tensors * a[1], flops=3 * a[1])


# ---- Muse ops ------------------------------------------------------------------
#: tokens from which a bf16 GEMM instruction stages W and x on the 2-group
#: kernel (ops/gemm.cuh GVM_GEMM_XS_MIN): bf16 K parts run only there, each
#: a whole number of the staged path's 64-k stages (GEMM_BF16_PART_K)
GEMM_STAGED_TOKENS = 64
GEMM_BF16_PART_K = 64


def _check_gemm(ts: Slots, a: Args) -> None:
    out = _t(ts, 0, "out", (DType.BF16, DType.F32), 2)
    x = _t(ts, 1, "x", (DType.BF16, DType.F32), 2)
    w = _t(ts, 2, "W", (DType.BF16, DType.F32), 2)
    if not (x.dtype == w.dtype):
        raise ProgramError(f"GEMM x '{x.name}' and W '{w.name}' must share a dtype")
    if not (x.dtype == DType.BF16 or out.dtype == DType.F32):
        raise ProgramError("an f32 GEMM writes f32")
    if not (x.shape[1] == w.shape[1]):
        raise ProgramError(f"GEMM K mismatch: x {x.shape} vs W {w.shape}")
    if not (out.shape == (x.shape[0], w.shape[0])):
        raise ProgramError(f"GEMM out {out.shape} must be {(x.shape[0], w.shape[0])}")
    if not (x.shape[1] % 8 == 0):
        raise ProgramError("GEMM K must be a multiple of 8")
    _range(a[0], a[1], w.shape[0], "GEMM column")
    if a[3] == 0 and a[2] != 0:
        raise ProgramError(f"GEMM token count 0 means all {x.shape[0]} tokens, so t0 must be 0, not {a[2]}")
    _range(a[2], a[3], x.shape[0], "GEMM token")
    if a[5] > 1:  # K parts, summed by the last part of each tile (isa/gvm_isa.h GEMM)
        n_parts, k = a[5], x.shape[1]
        if not (n_parts <= GEMM_MAX_PARTS and n_parts & (n_parts - 1) == 0 and k % (8 * n_parts) == 0):
            raise ProgramError(f"GEMM K parts: {n_parts} must be a power of two <= {GEMM_MAX_PARTS} that cuts K = {k} into multiples of 8")
        if x.dtype == DType.BF16 and not (gemm_tokens(x.shape[0], a) >= GEMM_STAGED_TOKENS and k % (GEMM_BF16_PART_K * n_parts) == 0):
            raise ProgramError(f"GEMM bf16 K parts run on the staged path only: at least {GEMM_STAGED_TOKENS} tokens an instruction "
                               f"(not {gemm_tokens(x.shape[0], a)}) and K / parts a multiple of {GEMM_BF16_PART_K} (K = {k}, {n_parts} parts)")
        parts = _t(ts, 3, "parts", F, 2)
        tickets = _t(ts, 4, "tickets", I32, 1)
        if not (parts.shape == (out.shape[0], n_parts * out.shape[1])):
            raise ProgramError(f"GEMM parts {parts.shape} must be {(out.shape[0], n_parts * out.shape[1])} (P = {n_parts} blocks of out's columns)")
        _range(a[6], 1, n_parts, "GEMM K part")
        _range(a[7], 1, tickets.shape[0], "GEMM ticket")
        if any(_opt(ts, i) is not None for i in (5, 6, 7)):
            raise ProgramError("GEMM with K parts takes no statistics (t5..t7 must be empty)")
        return
    if a[5] < 0 or a[6] != 0 or a[7] != 0:
        raise ProgramError(f"GEMM without K parts (a5 = {a[5]}: 0 or 1) needs a6 = a7 = 0, not {a[6]}, {a[7]}")
    if _opt(ts, 3) is not None:  # residual statistics of the tile
        stats = _t(ts, 3, "stats", F, 3)
        s = _t(ts, 4, "s", F, 2)
        al, be = _t(ts, 5, "alpha", F, 1), _t(ts, 6, "beta", F, 1)
        if not (out.dtype == DType.F32 and stats.shape[0] == out.shape[0] and stats.shape[2] == 4 and s.shape == out.shape
                and al.shape == be.shape == (out.shape[1],)):
            raise ProgramError(f"GEMM statistics need out f32 {out.shape}, stats [T,P,4], s like out and alpha, beta [N]: got "
                               f"out {out.dtype.name}, stats {stats.shape}, s {s.shape}, alpha {al.shape}, beta {be.shape}")
        _range(a[4], 1, stats.shape[1], "GEMM statistics slot")


def gemm_tokens(x_rows: int, a: Args) -> int:
    """Tokens a GEMM instruction computes: a3, or all of x's rows when a3 is 0."""
    return a[3] or x_rows


def _cost_gemm(ts: Slots, a: Args) -> Cost:
    out, x, w = ts[0], ts[1], ts[2]
    assert out and x and w
    k = x.shape[1]
    t = gemm_tokens(x.shape[0], a)
    if a[5] > 1:  # one K part: its share of W and x, its part's sums, and its share of the last part's sum
        n_parts = a[5]
        return Cost(weight_bytes=a[1] * w.row_bytes // n_parts, act_bytes=t * x.row_bytes // n_parts + 2 * t * a[1] * 4,
                    flops=2 * t * k * a[1] // n_parts)
    stats = 3 * t * a[1] * 4 + 2 * a[1] * 4 if _opt(ts, 3) is not None else 0  # out and s read back, alpha, beta
    return Cost(weight_bytes=a[1] * w.row_bytes, act_bytes=t * x.row_bytes + t * a[1] * DTYPE_BYTES[out.dtype] + stats, flops=2 * t * k * a[1])


def _check_rmsnorm(ts: Slots, a: Args) -> None:
    out = _t(ts, 0, "out", (DType.BF16, DType.F32), 2)
    x = _t(ts, 1, "in", F, 2)
    w = _t(ts, 2, "w", F, 1)
    if not (out.shape == x.shape and w.shape == (x.shape[1],)):
        raise ProgramError(f"RMSNORM shapes out {out.shape} in {x.shape} w {w.shape}")
    _range(a[0], a[1], x.shape[0], "RMSNORM row")


def _cost_rows(ts: Slots, a: Args) -> Cost:
    x = ts[1]
    assert x
    return Cost(act_bytes=3 * a[1] * x.row_bytes, flops=4 * a[1] * x.shape[-1])


def _heads(qkvg: TensorSpec, q: TensorSpec) -> tuple[int, int]:
    hq = q.shape[1]
    width = qkvg.shape[1]
    if not (width % HEAD_DIM == 0):
        raise ProgramError(f"qkvg width {width} is not a multiple of {HEAD_DIM}")
    hkv2 = width // HEAD_DIM - 2 * hq
    if not (hkv2 > 0 and hkv2 % 2 == 0 and hq % (hkv2 // 2) == 0):
        raise ProgramError(f"qkvg width {width} does not split into q|k|v|g for {hq} query heads")
    return hq, hkv2 // 2


def _check_cache(c: TensorSpec, hkv: int, name: str) -> None:
    if not (len(c.shape) == 4 and c.shape[2] == hkv and c.shape[3] == HEAD_DIM):
        raise ProgramError(f"{name} cache {c.shape} must be [C,S,{hkv},{HEAD_DIM}]")


def _check_qk_rope_kv(ts: Slots, a: Args) -> None:
    qkvg = _t(ts, 0, "qkvg", BF, 2)
    q = _t(ts, 1, "q", BF, 3)
    _t(ts, 2, "w_qn", F, 1)
    _t(ts, 3, "w_kn", F, 1)
    k, v = _t(ts, 4, "k cache", E4M3), _t(ts, 5, "v cache", E4M3)
    convs = _t(ts, 6, "convs", I32, 2)
    hq, hkv = _heads(qkvg, q)
    if not (q.shape == (qkvg.shape[0], hq, HEAD_DIM)):
        raise ProgramError(f"q {q.shape} must be [T,{hq},{HEAD_DIM}]")
    _check_cache(k, hkv, "k")
    _check_cache(v, hkv, "v")
    if not (k.shape == v.shape and k.shape[0] == convs.shape[0] and convs.shape[1] == 4):
        raise ProgramError("caches and convs disagree on conversations")
    _range(a[0], 1, convs.shape[0], "conversation")
    if not (a[1] in (0, 1)):
        raise ProgramError("QK_ROPE_KV a1 (rope) must be 0 or 1")
    if not (a[4] >= 0 and a[5] >= 0):
        raise ProgramError(f"QK_ROPE_KV tokens [{a[4]}, +{a[5]}) must not be negative")


def _cost_qk(ts: Slots, a: Args) -> Cost:
    qkvg = ts[0]
    assert qkvg
    return Cost(act_bytes=qkvg.row_bytes * 2, flops=qkvg.shape[1] * 8)


def _check_attn_chunk(ts: Slots, a: Args) -> None:
    q = _t(ts, 0, "q or qkvg", BF)
    k, v = _t(ts, 1, "k cache", E4M3), _t(ts, 2, "v cache", E4M3)
    convs = _t(ts, 3, "convs", I32, 2)
    po = _t(ts, 4, "part_o", F, 4)
    pml = _t(ts, 5, "part_ml", F, 4)
    hq = po.shape[1]
    if not (len(k.shape) == 4 and k.shape == v.shape):
        raise ProgramError("k and v caches must match")
    hkv = k.shape[2]
    _check_cache(k, hkv, "k")
    if not (hq % hkv == 0):
        raise ProgramError(f"{hq} query heads do not group over {hkv} kv heads")
    if len(q.shape) == 2:  # fused QK-norm/RoPE: qkvg, w_qn, w_kn, a7 = rope
        if q.shape[1] != (2 * hq + 2 * hkv) * HEAD_DIM:
            raise ProgramError(f"qkvg {q.shape} must be [T, {(2 * hq + 2 * hkv) * HEAD_DIM}] for {hq} q and {hkv} kv heads")
        for i, name in ((6, "w_qn"), (7, "w_kn")):
            if _t(ts, i, name, F, 1).shape != (HEAD_DIM,):
                raise ProgramError(f"{name} must be [{HEAD_DIM}]")
        if a[7] not in (0, 1):
            raise ProgramError(f"rope (a7) must be 0 or 1, not {a[7]}")
    elif not (len(q.shape) == 3 and q.shape[1:] == (hq, HEAD_DIM)):
        raise ProgramError(f"q {q.shape} must be [T, {hq}, {HEAD_DIM}] (or qkvg [T, W] with w_qn and w_kn: fused)")
    nch = po.shape[2]
    if not (po.shape == (q.shape[0], hq, nch, HEAD_DIM)):
        raise ProgramError(f"part_o {po.shape} must be [T,{hq},NCH,{HEAD_DIM}]")
    if not (pml.shape == (q.shape[0], hq, nch, 2)):
        raise ProgramError(f"part_ml {pml.shape} must be [T,{hq},{nch},2]")
    _range(a[0], 1, convs.shape[0], "conversation")
    _range(a[1], 1, hkv, "kv head")
    _range(a[2], 1, nch, "chunk")
    if not (a[3] > 0):
        raise ProgramError("chunk length must be positive")
    if not (a[4] >= 0):
        raise ProgramError("window must be >= 0")
    if not (i2f(a[5]) > 0.0):  # NaN fails too; the device's running max assumes it
        raise ProgramError(f"k scale must be positive, got {i2f(a[5])}")


def _cost_attn_chunk(ts: Slots, a: Args) -> Cost:
    po = ts[4]
    assert po
    keys = a[3]
    g = po.shape[1] // (ts[1].shape[2] if ts[1] else 1)
    return Cost(act_bytes=keys * 2 * HEAD_DIM, flops=4 * keys * HEAD_DIM * g)


def _check_attn_merge(ts: Slots, a: Args) -> None:
    o = _t(ts, 0, "o", BF, 2)
    po = _t(ts, 1, "part_o", F, 4)
    _t(ts, 2, "part_ml", F, 4)
    qkvg = _t(ts, 3, "qkvg", BF, 2)
    if not (o.shape == (po.shape[0], po.shape[1] * HEAD_DIM)):
        raise ProgramError(f"o {o.shape} must be [T,{po.shape[1] * HEAD_DIM}]")
    if not (qkvg.shape[0] == o.shape[0]):
        raise ProgramError("qkvg and o disagree on T")
    _range(a[0], a[1], o.shape[0], "ATTN_MERGE token")
    hq = po.shape[1]
    if not (0 <= a[2] <= hq and a[3] >= 0):
        raise ProgramError(f"ATTN_MERGE head0 {a[2]} outside [0, {hq}] or heads {a[3]} < 0")
    _range(a[2], _merge_heads(a, hq), hq, "ATTN_MERGE head")
    if not 0 <= a[4] <= po.shape[2]:
        raise ProgramError(f"ATTN_MERGE chunks {a[4]} outside [0, {po.shape[2]}] (0: all)")


def _merge_heads(a: Args, hq: int) -> int:
    """Heads of an ATTN_MERGE: a3, or every head from a2 on when a3 is 0."""
    return a[3] or hq - a[2]


def _cost_merge(ts: Slots, a: Args) -> Cost:
    po = ts[1]
    assert po
    pairs = a[1] * _merge_heads(a, po.shape[1])
    head_bytes = po.row_bytes // po.shape[1] if po.shape[1] else 0
    return Cost(act_bytes=pairs * head_bytes, flops=pairs * (a[4] or po.shape[2]) * HEAD_DIM * 3)


def _check_residual(ts: Slots, a: Args) -> None:
    s = _t(ts, 0, "s", F, 2)
    x = _t(ts, 1, "a", F, 2)
    al = _t(ts, 2, "alpha", F, 1)
    be = _t(ts, 3, "beta", F, 1)
    d = s.shape[1]
    if not (x.shape == s.shape and al.shape == (d,) and be.shape == (d,)):
        raise ProgramError("RESIDUAL shapes disagree")
    w = _opt(ts, 4)
    if w is not None:
        _t(ts, 4, "w_next", F, 1)
        if not (w.shape == (d,)):
            raise ProgramError("RESIDUAL w_next must be [D]")
        outs = [_opt(ts, 5), _opt(ts, 6)]
        if not (any(o is not None for o in outs)):
            raise ProgramError("RESIDUAL with w_next needs an output in t5 or t6")
        if outs[0] is not None:
            if not (_t(ts, 5, "out f32", F, 2).shape == s.shape):
                raise ProgramError("RESIDUAL t5 shape")
        if outs[1] is not None:
            if not (_t(ts, 6, "out bf16", BF, 2).shape == s.shape):
                raise ProgramError("RESIDUAL t6 shape")
    _range(a[0], a[1], s.shape[0], "RESIDUAL row")
    stats = _opt(ts, 7)
    if stats is None:
        if a[2] or a[3]:
            raise ProgramError(f"RESIDUAL columns [{a[2]}, {a[2] + a[3]}) need the rows' statistics in t7")
        return
    _t(ts, 7, "stats", F, 3)
    if not (stats.shape[0] == s.shape[0] and stats.shape[1] >= 1 and stats.shape[2] == 4):
        raise ProgramError(f"RESIDUAL stats {stats.shape} must be [{s.shape[0]},P,4]")
    if a[2] % 4 or a[3] % 4 or (a[3] == 0 and a[2] != 0):
        raise ProgramError(f"RESIDUAL columns [{a[2]}, {a[2] + a[3]}) must start and end at multiples of 4 (a3 = 0: all, from 0)")
    _range(a[2], a[3], d, "RESIDUAL column")


def _cost_residual(ts: Slots, a: Args) -> Cost:
    s = ts[0]
    assert s
    stats = _opt(ts, 7)
    cols = (a[3] or s.shape[1]) if stats is not None else s.shape[1]
    return Cost(act_bytes=a[1] * (5 * cols * 4 + (stats.row_bytes if stats is not None else 0)), flops=10 * a[1] * cols)


#: columns of a work list's row with its rows done by expert (isa/gvm_isa.h EXPERT_UP)
WORK_COLUMNS_BY_EXPERT = 2 + MAX_WORKLIST_EXPERTS


def _work(ts: Slots, i: int) -> TensorSpec:
    """The experts' work lists: [K, 2] i32, list k's items taken and items done,
    or [K, 2 + MAX_WORKLIST_EXPERTS] with each expert's rows done after them."""
    work = _t(ts, i, "work", I32, 2)
    if work.shape[1] not in (2, WORK_COLUMNS_BY_EXPERT):
        raise ProgramError(f"work {work.shape} must be [K,2] (items taken, items done per list) or [K,{WORK_COLUMNS_BY_EXPERT}] (and rows done by expert)")
    return work


def _check_topk(ts: Slots, a: Args) -> None:
    sc = _t(ts, 0, "scores", F, 2)
    meta = _t(ts, 1, "route_meta", I32, 2)
    route = _t(ts, 2, "route", I32, 2)
    t, ne = sc.shape
    if not (ne >= TOPK):
        raise ProgramError(f"{ne} experts cannot give a top-{TOPK}")
    if not (route.shape == (5, TOPK * t)):
        raise ProgramError(f"route {route.shape} must be [5,{TOPK * t}]")
    if not (meta.shape[0] == 2 and meta.shape[1] == a[1]):
        raise ProgramError(f"route_meta {meta.shape} must be [2,{a[1]}]")
    _range(a[0], a[1], ne, "local expert")
    if a[2] not in (0, 1, 2):
        raise ProgramError(f"TOPK mode a2 must be 0 (picks and table), 1 (picks of tokens a3.., a4 of them) or 2 (table), not {a[2]}")
    if a[2] == 1:
        if not a[4] > 0:
            raise ProgramError(f"TOPK picks (mode 1) of {a[4]} tokens: a4 must be > 0")
        _range(a[3], a[4], t, "TOPK token")
        if _opt(ts, 3) is not None:
            raise ProgramError("TOPK picks (mode 1) take no work lists (t3): the table (mode 2) resets them")
    elif a[3] or a[4]:
        raise ProgramError(f"TOPK mode {a[2]} takes a3 = a4 = 0, not {a[3]}, {a[4]}")
    if _opt(ts, 3) is not None:
        _work(ts, 3)


def _cost_topk(ts: Slots, a: Args) -> Cost:
    sc, route = ts[0], ts[2]
    assert sc and route
    if a[2] == 1:  # the picks of a4 tokens
        return Cost(act_bytes=a[4] * (sc.row_bytes + 2 * TOPK * 4), flops=a[4] * sc.shape[1] * 8)
    if a[2] == 2:  # the table from the picks
        return Cost(act_bytes=4 * route.nbytes // 5 + 8 * a[1], flops=sc.shape[0] * TOPK * 4)
    return Cost(act_bytes=sc.nbytes, flops=sc.shape[0] * sc.shape[1] * 8)


def tiled_nvfp4_shapes(lead: tuple[int, ...], n: int, k: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shapes of the tiled NVFP4 codes and scales (isa/gvm_isa.h) of [..., N, K]
    matrices: [..., ceil(N/16), 8K] bytes and [..., ceil(N/16), K]."""
    if n < 1 or k < 1 or k % NVFP4_TILE_K:
        raise ProgramError(f"tiled NVFP4 needs N >= 1 rows and K a multiple of {NVFP4_TILE_K}, got N={n}, K={k}")
    nb = -(-n // NVFP4_TILE_ROWS)
    return (*lead, nb, 8 * k), (*lead, nb, k)


def _check_expert(ts: Slots, a: Args, up: bool) -> None:
    out = _t(ts, 0, "hbuf" if up else "y", BF if up else F, 2)
    x = _t(ts, 1, "x" if up else "hbuf", BF, 2)
    codes = _t(ts, 2, "codes", (DType.E2M1X2,))
    scales = _t(ts, 3, "scales", E4M3)
    tsc = _t(ts, 4, "tensor scales", F)
    meta = _t(ts, 5, "route_meta", I32, 2)
    route = _t(ts, 6, "route", I32, 2)
    e, k, n_out = meta.shape[1], x.shape[1], out.shape[1]
    want_c, want_s = tiled_nvfp4_shapes((e, 2) if up else (e,), n_out, k)
    if not (codes.shape == want_c):
        raise ProgramError(f"codes {codes.shape} must be {want_c} (tiled NVFP4 of {n_out} rows x {k})")
    if not (scales.shape == want_s):
        raise ProgramError(f"scales {scales.shape} must be {want_s} (tiled NVFP4 of {n_out} rows x {k})")
    if not (tsc.shape == ((e, 2) if up else (e,))):
        raise ProgramError(f"tensor scales {tsc.shape} wrong")
    if not (out.shape == (route.shape[1], n_out)):
        raise ProgramError(f"expert out {out.shape} must be [{route.shape[1]},{n_out}]")
    if not (x.shape[0] in (route.shape[1] // TOPK, route.shape[1])):
        raise ProgramError("expert input rows disagree with the routing table")
    if not (e <= MAX_WORKLIST_EXPERTS):
        raise ProgramError(f"an expert work list covers at most {MAX_WORKLIST_EXPERTS} local experts, not {e}")
    work = _work(ts, 7)
    _range(a[0], 1, work.shape[0], "expert work list")
    if not (a[1] >= 1):
        raise ProgramError(f"an expert work list needs >= 1 workers, not {a[1]}")
    if not (a[2] >= 1 and a[3] >= 1 and a[2] % NVFP4_TILE_ROWS == 0 and a[3] % NVFP4_TILE_ROWS == 0):
        raise ProgramError(f"expert row grain and cap must be positive multiples of {NVFP4_TILE_ROWS} (items start on a tiled block), not {a[2]} and {a[3]}")
    if not (0 <= a[4] <= a[1]):
        raise ProgramError(f"a fixed worker's number a4 must be 1..{a[1]} (0: items claimed), not {a[4]}")
    if not (a[6] >= 0):
        raise ProgramError(f"an expert list's heavy tokens a6 must be >= 0 (0: none), not {a[6]}")
    after = a[5]
    if up and after:
        raise ProgramError(f"EXPERT_UP's a5 must be 0, not {after}")
    if after and not (1 <= after <= work.shape[0] and work.shape[1] == WORK_COLUMNS_BY_EXPERT):
        raise ProgramError(f"EXPERT_DOWN's a5 = j + 1 names the list j whose rows it waits for: 1..{work.shape[0]}, "
                           f"with work [K,{WORK_COLUMNS_BY_EXPERT}] (rows done by expert), not a5 = {after} with work {work.shape}")


def expert_weight(tokens: int) -> int:
    """An expert's share of a work list's workers, in quarters, by its token
    count (the ISA's GVM_EXPERT_SHARE_*, as ops/experts.cuh gvm_exp_weight):
    an item's time for the same rows grows with its tokens (the register
    path's weight ring gets fewer slots, then none, as x grows; more tokens
    take the shared tile: ops/experts.cuh gvm_expr_fits)."""
    if tokens <= 0:
        return 0
    return next((w for t, w in EXPERT_SHARES if tokens <= t), EXPERT_SHARE_ABOVE)


def expert_items(tokens: Sequence[int], n_out: int, workers: int, grain: int, cap: int,
                 heavy: int = 0, longest_first: bool = True) -> list[tuple[int, int, int]]:
    """The items (expert, first row, rows) of an expert work list, in the order
    ops/experts.cuh numbers them (GVM_EXP_LPT 2): expert by expert, those with
    the most chunks of 32 tokens first (ties, e.g. every expert of up to 32, in
    expert order), so that the last items claimed are short (longest_first
    False: expert order, the walk before session 68 and at GVM_EXP_LPT 0);
    each expert with tokens
    cut into at most q tiles, q its weighted share of the workers
    (expert_weight), rows rounded up to a multiple of grain and at most cap
    (half of it, in whole grains, for an expert of more than heavy tokens, the
    instruction's a6, 0: none; its items take a pass of the shared tile per 32).
    With few experts hit every worker then takes at most one item (a second
    round doubled the list's time), and the items of an expert with many
    tokens are shorter, so that they end with the others; with many hit, the
    cap keeps items small enough for the workers to even out the experts'
    unequal token counts."""
    wsum = max(1, sum(expert_weight(t) for t in tokens))
    items: list[tuple[int, int, int]] = []
    for e in sorted(range(len(tokens)), key=lambda e: -((tokens[e] + 31) // 32) if longest_first else 0):  # stable: ties in expert order
        t = tokens[e]
        w = expert_weight(t)
        if w:
            halve = heavy and t > heavy
            rows = _tile_rows(n_out, max(1, workers * w // wsum), grain, max(grain, cap // (2 * grain) * grain) if halve else cap)
            items += [(e, r0, min(rows, n_out - r0)) for r0 in range(0, n_out, rows)]
    return items


def _tile_rows(n_out: int, tiles: int, grain: int, cap: int) -> int:
    """Rows of an expert's items cut into at most `tiles` (expert_items)."""
    rows = -(-n_out // tiles)  # ceil
    return min(cap, -(-rows // grain) * grain)  # up to whole grains


def _cost_expert(ts: Slots, a: Args, mats: int) -> Cost:
    """A worker's even share of the items when every local expert has one
    token (the model rescales it to the tokens it assumes: gpuvm.sim.predict)."""
    out, x, meta = ts[0], ts[1], ts[5]
    assert out and x and meta
    k, n_out = x.shape[1], out.shape[1]
    e = meta.shape[1]  # equal weights: each expert's share is a1 // e (expert_items, without building the list)
    item = min(n_out, _tile_rows(n_out, max(1, a[1] // e), a[2], a[3]))
    rows = -(-e * -(-n_out // item) // a[1]) * item
    return Cost(weight_bytes=mats * rows * (k // 2 + k // 16), act_bytes=rows * 8, flops=2 * mats * k * rows)


def _check_combine(ts: Slots, a: Args) -> None:
    f = _t(ts, 0, "fsq", BF, 2)
    y = _t(ts, 1, "y", F, 2)
    route = _t(ts, 2, "route", I32, 2)
    if not (y.shape == (route.shape[1], f.shape[1]) and route.shape[1] == TOPK * f.shape[0]):
        raise ProgramError("EXPERT_COMBINE shapes disagree")
    _range(a[0], a[1], f.shape[0], "EXPERT_COMBINE token")


def _cost_combine(ts: Slots, a: Args) -> Cost:
    f = ts[0]
    assert f
    return Cost(act_bytes=a[1] * TOPK * f.shape[1] * 4, flops=a[1] * TOPK * f.shape[1] * 4)


# ---- whole-step ops ------------------------------------------------------------
def _check_embed(ts: Slots, a: Args) -> None:
    s = _t(ts, 0, "s", F, 2)
    table = _t(ts, 1, "table", BF, 2)
    tok = _t(ts, 2, "tokens", I32, 1)
    if not (table.shape[1] == s.shape[1]):
        raise ProgramError(f"EMBED table {table.shape} and s {s.shape} disagree on D")
    if not (tok.shape == (s.shape[0],)):
        raise ProgramError(f"EMBED tokens {tok.shape} must be [{s.shape[0]}]")
    if not (s.shape[1] % 8 == 0):
        raise ProgramError("EMBED D must be a multiple of 8")
    _range(a[0], a[1], s.shape[0], "EMBED row")


def _cost_embed(ts: Slots, a: Args) -> Cost:
    s, table = ts[0], ts[1]
    assert s and table
    return Cost(act_bytes=a[1] * (s.row_bytes + table.row_bytes + 4))


def _check_argmax(ts: Slots, a: Args) -> None:
    logits = _t(ts, 0, "logits", F, 2)
    tok = _t(ts, 1, "tokens", I32, 1)
    if not (tok.shape == (logits.shape[0],)):
        raise ProgramError(f"ARGMAX tokens {tok.shape} must be [{logits.shape[0]}]")
    if _opt(ts, 2) is not None:
        if not (_t(ts, 2, "margin", F, 1).shape == tok.shape):
            raise ProgramError(f"ARGMAX margin must be [{logits.shape[0]}]")
    _range(a[0], a[1], logits.shape[0], "ARGMAX row")


def _cost_argmax(ts: Slots, a: Args) -> Cost:
    logits = ts[0]
    assert logits
    return Cost(act_bytes=a[1] * (logits.row_bytes + 8), flops=2 * a[1] * logits.shape[1])


SPECS: dict[Op, OpSpec] = {
    Op.NOP: OpSpec((), (), _check_nop, lambda ts, a: Cost()),
    Op.SLEEP: OpSpec((), ("ns",), _check_sleep, lambda ts, a: Cost()),
    Op.COPY: OpSpec(("dst", "src"), ("i0", "n"), _check_copy, _cost_elementwise(2)),
    Op.SCALE_ADD: OpSpec(("dst", "x", "y"), ("i0", "n", "f_a", "f_b"), _check_scale_add, _cost_elementwise(3)),
    Op.GEMM: OpSpec(("out", "x", "W", "stats|parts", "s|tickets", "alpha", "beta"), ("n0", "n", "t0", "t", "slot", "parts", "part", "ticket"), _check_gemm, _cost_gemm),
    Op.RMSNORM: OpSpec(("out", "in", "w"), ("row0", "rows"), _check_rmsnorm, _cost_rows),
    Op.QK_ROPE_KV: OpSpec(("qkvg", "q", "w_qn", "w_kn", "k_cache", "v_cache", "convs"), ("conv", "rope", "f_kscale", "f_vscale", "j0", "tokens"), _check_qk_rope_kv, _cost_qk),
    Op.ATTN_CHUNK: OpSpec(("q", "k_cache", "v_cache", "convs", "part_o", "part_ml", "w_qn", "w_kn"), ("conv", "kv_head", "chunk", "chunk_len", "window", "f_kscale", "f_vscale", "rope"), _check_attn_chunk, _cost_attn_chunk),
    Op.ATTN_MERGE: OpSpec(("o", "part_o", "part_ml", "qkvg"), ("tok0", "tokens", "head0", "heads", "chunks"), _check_attn_merge, _cost_merge),
    Op.RESIDUAL: OpSpec(("s", "a", "alpha", "beta", "w_next", "out_f32", "out_bf16", "stats"), ("row0", "rows", "col0", "cols"), _check_residual, _cost_residual),
    Op.TOPK: OpSpec(("scores", "route_meta", "route", "work"), ("first_local", "n_local", "mode", "t0", "tokens"), _check_topk, _cost_topk),
    Op.EXPERT_UP: OpSpec(("hbuf", "x", "codes", "scales", "tscales", "route_meta", "route", "work"), ("list", "workers", "grain", "cap", "fixed", "after", "heavy"), lambda ts, a: _check_expert(ts, a, True), lambda ts, a: _cost_expert(ts, a, 2)),
    Op.EXPERT_DOWN: OpSpec(("y", "hbuf", "codes", "scales", "tscales", "route_meta", "route", "work"), ("list", "workers", "grain", "cap", "fixed", "after", "heavy"), lambda ts, a: _check_expert(ts, a, False), lambda ts, a: _cost_expert(ts, a, 1)),
    Op.EXPERT_COMBINE: OpSpec(("fsq", "y", "route"), ("tok0", "tokens"), _check_combine, _cost_combine),
    Op.EMBED: OpSpec(("s", "table", "tokens"), ("row0", "rows"), _check_embed, _cost_embed),
    Op.ARGMAX: OpSpec(("logits", "tokens", "margin"), ("row0", "rows"), _check_argmax, _cost_argmax),
}

missing = set(Op) - set(SPECS)
if missing:  # pragma: no cover - an opcode added to the header without a spec
    raise RuntimeError(f"opcodes without a host spec: {sorted(m.name for m in missing)}")
