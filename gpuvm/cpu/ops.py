"""Reference semantics of every opcode on CPU tensors: the oracle of gpuvm.

One function per opcode, each exactly the comment of its opcode in
isa/gvm_isa.h: torch on CPU, f32 accumulation, bf16 outputs rounded to nearest
even, fp8 through torch.float8_e4m3fn (saturating, like cvt.satfinite), NVFP4
dequantised as code * block scale * tensor scale. An op writes only what the
header says it writes; run-time values it cannot honour (a conversation row
out of range, a key the ring cache no longer holds, NaN scores) raise
CpuOpError, where the device would report GVM_ERR_BAD_ARGS.

Every function takes the instruction's tensor slots (None where unset) and
its int32 arguments, and returns what the instruction adds to its signal
counter: None for one, or a count (a work list's worker: take_items).
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Sequence

import torch

from ..isa import HEAD_DIM, RMS_EPS, TOPK, Op, i2f
from ..muse.formats import dequantize_nvfp4, from_e4m3, to_e4m3, untile_nvfp4
from ..opspec import expert_items

Slots = Sequence["torch.Tensor | None"]
Args = Sequence[int]

ROPE_BASE = 500_000.0
ATTN_SCALE = 1.0 / 8.0  # 1 / sqrt(HEAD_DIM)


class CpuOpError(RuntimeError):
    """An op met run-time data it cannot honour (the device's GVM_ERR_BAD_ARGS)."""


def _arg(a: Args, i: int) -> int:
    """Argument a<i>, 0 where the instruction has fewer (the device reads its zeroed slots)."""
    return a[i] if len(a) > i else 0


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise CpuOpError(msg)


def _rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS)


def _e4m3(t: torch.Tensor) -> torch.Tensor:
    """An e4m3 buffer as float8_e4m3fn (it may be bound as its bytes)."""
    return t.view(torch.float8_e4m3fn) if t.dtype == torch.uint8 else t


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.float().contiguous().view(torch.int32)


def _floats(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.float32)


def _conv(convs: torch.Tensor, c: int, tokens_total: int) -> tuple[int, int, int]:
    tok0, n, pos0, _ = (int(v) for v in convs[c].tolist())
    _need(tok0 >= 0 and n >= 0 and tok0 + n <= tokens_total, f"conversation {c}: tokens [{tok0}, {tok0 + n}) outside [0, {tokens_total})")
    _need(pos0 >= 0, f"conversation {c}: negative position {pos0}")
    return tok0, n, pos0


def rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """RoPE of x [n, heads, 64] at positions pos [n]: pairs (2i, 2i+1), base 500000."""
    inv = ROPE_BASE ** (-torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM)
    ang = pos.to(torch.float64)[:, None] * inv[None, :]  # f64: positions reach 1e5
    cos, sin = ang.cos().float()[:, None, :], ang.sin().float()[:, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)


def visible_keys(qpos: torch.Tensor, kpos: torch.Tensor, window: int) -> torch.Tensor:
    """[n, nk] bool: the query at qpos[i] sees the key at kpos[j] (causal, and
    within the window when window > 0)."""
    seen = kpos[None, :] <= qpos[:, None]
    if window:
        seen &= kpos[None, :] > qpos[:, None] - window
    return seen


# ---- synthetic ops -----------------------------------------------------------
def nop(ts: Slots, a: Args) -> None:
    pass


def sleep(ts: Slots, a: Args) -> None:
    pass  # time is not part of any result


def copy(ts: Slots, a: Args) -> None:
    dst, src = ts[0], ts[1]
    assert dst is not None and src is not None
    dst.view(-1)[a[0] : a[0] + a[1]] = src.reshape(-1)[a[0] : a[0] + a[1]]


def scale_add(ts: Slots, a: Args) -> None:
    dst, x, y = ts[0], ts[1], ts[2]
    assert dst is not None and x is not None and y is not None
    r = slice(a[0], a[0] + a[1])
    dst.view(-1)[r] = i2f(a[2]) * x.reshape(-1)[r] + i2f(a[3]) * y.reshape(-1)[r]


# ---- Muse ops ------------------------------------------------------------------
def gemm(ts: Slots, a: Args) -> None:
    out, x, w = ts[0], ts[1], ts[2]
    assert out is not None and x is not None and w is not None
    cols = slice(a[0], a[0] + a[1])
    rows = slice(a[2], a[2] + a[3]) if a[3] else slice(None)
    if _arg(a, 5) > 1:  # K part a6 of a5; the tile's last part (by its ticket) sums the parts in part order
        parts, tickets = ts[3], ts[4]
        assert parts is not None and tickets is not None
        n_parts, n, kp = a[5], out.shape[1], x.shape[1] // a[5]
        ks = slice(a[6] * kp, (a[6] + 1) * kp)
        parts[rows, a[6] * n + a[0]:a[6] * n + a[0] + a[1]] = x[rows, ks].float() @ w[cols, ks].float().T
        tickets[a[7]] = ((int(tickets[a[7]]) + 1 + 2**31) % 2**32) - 2**31  # int32 wraps as the device's
        if int(tickets[a[7]]) % n_parts == 0:
            total = parts[rows, a[0]:a[0] + a[1]].clone()
            for j in range(1, n_parts):
                total += parts[rows, j * n + a[0]:j * n + a[0] + a[1]]
            out[rows, cols] = total
        return
    out[rows, cols] = (x[rows].float() @ w[cols].float().T).to(out.dtype)
    if len(ts) > 3 and ts[3] is not None:  # residual statistics of the tile (isa/gvm_isa.h GEMM)
        stats, s, alpha, beta = ts[3:7]
        assert s is not None and alpha is not None and beta is not None
        stats[rows, a[4]] = residual_stats(out[rows, cols].float(), s[rows, cols], alpha[cols], beta[cols])


def residual_stats(a: torch.Tensor, s: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """GEMM's residual statistics of rows a, s [n, cols] (alpha, beta [cols]):
    [n, 4] = (sum a^2, sum alpha beta s a, sum beta^2 a^2, sum alpha^2 s^2)."""
    ba, as_ = beta * a, alpha * s
    return torch.stack(((a * a).sum(-1), (as_ * ba).sum(-1), (ba * ba).sum(-1), (as_ * as_).sum(-1)), dim=-1)


def rmsnorm(ts: Slots, a: Args) -> None:
    out, x, w = ts[0], ts[1], ts[2]
    assert out is not None and x is not None and w is not None
    rows = slice(a[0], a[0] + a[1])
    out[rows] = (_rms(x[rows]) * (1.0 + w)).to(out.dtype)


def _qk(rows: torch.Tensor, pos: torch.Tensor, hq: int, hkv: int, w_qn: torch.Tensor, w_kn: torch.Tensor,
        use_rope: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k (QK-normed, rotated when use_rope) and v of qkvg rows at positions pos."""
    n = rows.shape[0]
    rows = rows.float()
    q = _rms(rows[:, : hq * HEAD_DIM].reshape(n, hq, HEAD_DIM)) * (1.0 + w_qn)
    k = _rms(rows[:, hq * HEAD_DIM : (hq + hkv) * HEAD_DIM].reshape(n, hkv, HEAD_DIM)) * (1.0 + w_kn)
    v = rows[:, (hq + hkv) * HEAD_DIM : (hq + 2 * hkv) * HEAD_DIM].reshape(n, hkv, HEAD_DIM)
    if use_rope:
        q, k = rope(q, pos), rope(k, pos)
    return q, k, v


def qk_rope_kv(ts: Slots, a: Args) -> None:
    qkvg, q_out, w_qn, w_kn, kc, vc, convs = ts[:7]
    assert qkvg is not None and q_out is not None and w_qn is not None and w_kn is not None
    assert kc is not None and vc is not None and convs is not None
    kc, vc = _e4m3(kc), _e4m3(vc)
    c, use_rope, k_scale, v_scale = a[0], a[1], i2f(a[2]), i2f(a[3])
    tok0, n, pos0 = _conv(convs, c, qkvg.shape[0])
    hq, hkv, slots = q_out.shape[1], kc.shape[2], kc.shape[1]
    _need(n <= slots, f"conversation {c}: {n} new tokens overflow a cache of {slots} slots")
    j0 = _arg(a, 4)
    j1 = min(n, j0 + a[5]) if _arg(a, 5) else n  # clamped, as the device does
    if j0 >= j1:
        return
    pos = pos0 + torch.arange(j0, j1)
    q, k, v = _qk(qkvg[tok0 + j0 : tok0 + j1], pos, hq, hkv, w_qn, w_kn, bool(use_rope))
    kc[c, pos % slots] = to_e4m3(k / k_scale)
    vc[c, pos % slots] = to_e4m3(v / v_scale)
    q_out[tok0 + j0 : tok0 + j1] = q.to(q_out.dtype)


def attn_chunk(ts: Slots, a: Args) -> None:
    q, kc, vc, convs, part_o, part_ml = ts[:6]
    assert q is not None and kc is not None and vc is not None and convs is not None and part_o is not None and part_ml is not None
    kc, vc = _e4m3(kc), _e4m3(vc)
    c, h, j, length, window, k_scale, v_scale = a[0], a[1], a[2], a[3], a[4], i2f(a[5]), i2f(a[6])
    tok0, n, pos0 = _conv(convs, c, q.shape[0])
    hq, hkv = part_o.shape[1], kc.shape[2]
    g = hq // hkv
    slots = kc.shape[1]
    heads = slice(h * g, (h + 1) * g)
    toks = slice(tok0, tok0 + n)
    base = max(0, pos0 - window + 1) if window else 0
    k0 = base + j * length
    k1 = min(k0 + length, pos0 + n)  # no query sees past its own position
    if q.dim() == 2:  # fused: q from qkvg; the chunk holding new positions writes their k and v first
        w_qn, w_kn = ts[6], ts[7]
        assert w_qn is not None and w_kn is not None
        pos = pos0 + torch.arange(n)
        qn, k, v = _qk(q[toks], pos, hq, hkv, w_qn, w_kn, bool(a[7]))
        new = (pos >= k0) & (pos < k1)
        kc[c, pos[new] % slots, h] = to_e4m3(k[new, h] / k_scale)
        vc[c, pos[new] % slots, h] = to_e4m3(v[new, h] / v_scale)
        q = torch.zeros(q.shape[0], hq, HEAD_DIM, dtype=torch.bfloat16)
        q[toks] = qn.to(torch.bfloat16)
    if k1 <= k0 or n == 0:
        part_o[toks, heads, j] = 0.0
        part_ml[toks, heads, j, 0] = -math.inf
        part_ml[toks, heads, j, 1] = 0.0
        return
    # the ring holds positions (last - slots, last]; an older visible key is gone
    _need(k0 > pos0 + n - 1 - slots, f"conversation {c}: key position {k0} is no longer in the {slots}-slot cache (newest {pos0 + n - 1})")
    kpos = torch.arange(k0, k1)
    visible = visible_keys(pos0 + torch.arange(n), kpos, window)
    keys = from_e4m3(kc[c, kpos % slots, h]) * k_scale  # [nk, 64]
    vals = from_e4m3(vc[c, kpos % slots, h]) * v_scale
    score = torch.einsum("tgd,kd->tgk", q[toks, heads].float(), keys) * ATTN_SCALE
    score = score.masked_fill(~visible[:, None, :], -math.inf)
    m = score.amax(-1)
    p = torch.exp(score - torch.where(torch.isinf(m), 0.0, m)[..., None])
    part_o[toks, heads, j] = p @ vals
    part_ml[toks, heads, j, 0] = m
    part_ml[toks, heads, j, 1] = p.sum(-1)


def attn_merge(ts: Slots, a: Args) -> None:
    o, part_o, part_ml, qkvg = ts[:4]
    assert o is not None and part_o is not None and part_ml is not None and qkvg is not None
    toks = slice(a[0], a[0] + a[1])
    n, hq = a[1], part_o.shape[1]
    h0 = _arg(a, 2)
    nh = _arg(a, 3) or hq - h0  # 0: every head from h0 on
    nch = _arg(a, 4) or part_o.shape[2]  # 0: every chunk slot
    heads, cols = slice(h0, h0 + nh), slice(h0 * HEAD_DIM, (h0 + nh) * HEAD_DIM)
    hkv = (qkvg.shape[1] // HEAD_DIM - 2 * hq) // 2
    m, l = part_ml[toks, heads, :nch, 0], part_ml[toks, heads, :nch, 1]  # [n, nh, nch]
    top = m.amax(-1, keepdim=True)
    _need(not bool(torch.isinf(top).any()), f"ATTN_MERGE tokens [{a[0]}, {a[0] + a[1]}) heads [{h0}, {h0 + nh}): a query saw no key at all")
    scale = torch.exp(m - top)
    out = (part_o[toks, heads, :nch] * scale[..., None]).sum(2) / (l * scale).sum(-1)[..., None]
    g0 = (hq + 2 * hkv) * HEAD_DIM
    gate = qkvg[toks, g0 + cols.start : g0 + cols.stop].float().reshape(n, nh, HEAD_DIM)
    o[toks, cols] = (_rms(out) * torch.sigmoid(gate)).reshape(n, nh * HEAD_DIM).to(o.dtype)


def residual(ts: Slots, a: Args) -> None:
    s, x, alpha, beta = ts[:4]
    assert s is not None and x is not None and alpha is not None and beta is not None
    w_next, out32, out16, stats = (list(ts[4:8]) + [None] * 4)[:4]
    rows = slice(a[0], a[0] + a[1])
    if stats is None:
        new = alpha * s[rows] + beta * _rms(x[rows])
        s[rows] = new
        inv_s = torch.rsqrt(new.pow(2).mean(-1, keepdim=True) + RMS_EPS)
    else:  # the sums of GEMM's residual statistics; columns [a2, a2 + a3) only
        d = s.shape[1]
        sums = stats[rows].double().sum(1)  # (A, C, B, S) per row
        inv_a = torch.rsqrt(sums[:, 0] / d + RMS_EPS)
        ss = (sums[:, 3] + inv_a * (2 * sums[:, 1] + inv_a * sums[:, 2])).clamp(min=0)
        inv_s = torch.rsqrt(ss / d + RMS_EPS).float()[:, None]
        cols = slice(a[2], a[2] + a[3]) if a[3] else slice(None)
        new = alpha[cols] * s[rows, cols] + beta[cols] * (x[rows, cols] * inv_a.float()[:, None])
        s[rows, cols] = new
        rows = (rows, cols)
        w_next = w_next[cols] if w_next is not None else None
    if w_next is not None:
        normed = new * inv_s * (1.0 + w_next)
        if out32 is not None:
            out32[rows] = normed
        if out16 is not None:
            out16[rows] = normed.to(out16.dtype)


def topk(ts: Slots, a: Args) -> None:
    scores, meta, route = ts[:3]
    assert scores is not None and meta is not None and route is not None
    first, n_local = a[0], a[1]
    mode = _arg(a, 2)
    t = scores.shape[0]
    if mode != 2:  # the picks (mode 1: of tokens [a3, a3 + a4))
        rows = slice(a[3], a[3] + a[4]) if mode == 1 else slice(None)
        sc = scores[rows]
        _need(bool(torch.isfinite(sc).all()), "TOPK: scores hold NaN or inf (an unwritten or broken router output)")
        # a stable descending sort puts the lower expert index first among equal scores
        val, picked = torch.sort(sc, dim=1, descending=True, stable=True)
        val, picked = val[:, :TOPK], picked[:, :TOPK]
        route[2].view(t, TOPK)[rows] = picked.to(torch.int32)
        route[3].view(t, TOPK)[rows] = _bits(torch.softmax(val, dim=-1))
        if mode == 1:
            return
    idx = route[2].view(t, TOPK).long()
    _need(bool(((idx >= 0) & (idx < scores.shape[1])).all()), "TOPK: a pick outside the experts (unwritten picks)")
    w = route[3].view(torch.float32).view(t, TOPK)
    e = (idx - first).flatten()
    local = (e >= 0) & (e < n_local)
    counts = torch.bincount(e[local], minlength=n_local)
    starts = torch.cumsum(counts, 0) - counts
    # flat index i = token * 8 + k is already in token order; a stable sort by
    # expert keeps it, so each expert's slots list its tokens in order
    picks = torch.nonzero(local).flatten()
    picks = picks[torch.sort(e[picks], stable=True).indices]
    slot = torch.full((TOPK * t,), -1, dtype=torch.int32)
    slot[picks] = torch.arange(len(picks), dtype=torch.int32)
    route[4] = slot
    route[0, : len(picks)] = (picks // TOPK).to(torch.int32)
    route[1, : len(picks)] = _bits(w.flatten()[picks])
    meta[0] = counts.to(torch.int32)
    meta[1] = starts.to(torch.int32)
    if len(ts) > 3 and ts[3] is not None:
        ts[3].zero_()  # the experts' work lists


def _expert_slots(meta: torch.Tensor, route: torch.Tensor, e: int, tokens: int) -> torch.Tensor:
    count, start = int(meta[0, e]), int(meta[1, e])
    _need(count >= 0 and start >= 0 and start + count <= route.shape[1], f"expert {e}: slots [{start}, {start + count}) outside the routing table")
    slots = torch.arange(start, start + count)
    toks = route[0, slots]
    _need(bool(((toks >= 0) & (toks < tokens)).all()), f"expert {e}: a slot names a token outside [0, {tokens})")
    return slots


def list_items(meta: torch.Tensor, n_out: int, workers: int, grain: int, cap: int, heavy: int = 0) -> list[tuple[int, slice]]:
    """A step's work list: (expert, rows) of item i = the experts with tokens,
    the most chunks of 32 tokens first, times their row tiles (opspec.expert_items)."""
    return list(_items(tuple(int(c) for c in meta[0].tolist()), n_out, workers, grain, cap, heavy))


@functools.lru_cache(maxsize=64)
def _items(tokens: tuple[int, ...], n_out: int, workers: int, grain: int, cap: int, heavy: int) -> tuple[tuple[int, slice], ...]:
    """list_items by value: every worker of a list builds the same list (thousands
    of them in ops_check's shard-size lists, where rebuilding it took 70% of the
    reference's time)."""
    return tuple((e, slice(r0, r0 + n)) for e, r0, n in expert_items(tokens, n_out, workers, grain, cap, heavy=heavy))


def take_items(work: torch.Tensor, k: int, items: list[tuple[int, slice]], workers: int, do: Callable[[int, slice], None], fixed: int = 0,
               count_rows: bool = False) -> int:
    """One worker of list k, as ops/experts.cuh runs it: items i = work[k, 0]++
    until one past the end (fixed > 0: items fixed - 1, fixed - 1 + workers,
    ..., work[k, 0] untouched), each done counted in work[k, 1] and (an up
    list, where work has the expert columns) its rows in work[k, 2 + e]. Returns what it
    signals: 1 if it drew i = len(items) (every item taken; with no items,
    `workers`), plus workers - 1 if it finished the list's last item. Claimed
    and run one at a time, the first worker takes the whole list and the
    others none; work[k] ends at (items + workers, items) either way
    ((0, items) when fixed)."""
    amount, call = 0, 0
    while True:
        if fixed:
            i = fixed - 1 + call * workers
            call += 1
        else:
            i = int(work[k, 0])
            work[k, 0] = i + 1
        if i >= len(items):
            return amount + (0 if i != len(items) else 1 if items else workers)
        e, rows = items[i]
        do(e, rows)
        if count_rows and work.shape[1] > 2:
            work[k, 2 + e] += rows.stop - rows.start
        work[k, 1] += 1
        if int(work[k, 1]) == len(items):
            amount = workers - 1


# The last expert dequantized whole: (codes, scales, key, f32 matrix). A work list
# takes an expert's rows in consecutive items, so it is dequantized once a list,
# not once an item (ops_check's shard-size lists: thousands of 16-row items).
_LAST_EXPERT: list[tuple[torch.Tensor, torch.Tensor, tuple, torch.Tensor]] = []


def _expert_rows(codes: torch.Tensor, scales: torch.Tensor, e: int, rows: slice, tensor_scale: float | torch.Tensor) -> torch.Tensor:
    """Rows [rows.start, rows.stop) of expert e of tiled NVFP4 codes [E, ..., NB, 8K] and
    scales [E, ..., NB, K], dequantized (f32 [..., n, K], contiguous). The cache holds
    the tensors themselves (so their memory is not reused under it) and their versions
    (an in-place write since misses it)."""
    key = (e, codes._version, scales._version, tuple(torch.as_tensor(tensor_scale, dtype=torch.float32).flatten().tolist()))
    if not (_LAST_EXPERT and _LAST_EXPERT[0][0] is codes and _LAST_EXPERT[0][1] is scales and _LAST_EXPERT[0][2] == key):
        _LAST_EXPERT[:] = [(codes, scales, key, dequantize_nvfp4(*untile_nvfp4(codes[e], scales[e]), tensor_scale))]
    return _LAST_EXPERT[0][3][..., rows, :].contiguous()


def expert_up(ts: Slots, a: Args) -> int:
    hbuf, x, codes, scales, tscales, meta, route, work = ts[:8]
    assert hbuf is not None and x is not None and codes is not None and scales is not None
    assert tscales is not None and meta is not None and route is not None and work is not None

    def item(e: int, cols: slice) -> None:
        slots = _expert_slots(meta, route, e, x.shape[0])
        xs = x[route[0, slots].long()].float()
        gu = _expert_rows(codes, scales, e, cols, tscales[e])  # [2, n, H]
        gate, up = xs @ gu[0].T, xs @ gu[1].T
        hbuf[slots, cols] = (torch.nn.functional.silu(gate) * up).to(hbuf.dtype)

    return take_items(work, a[0], list_items(meta, hbuf.shape[1], a[1], a[2], a[3], _arg(a, 6)), a[1], item, a[4], count_rows=True)


def expert_down(ts: Slots, a: Args) -> int:
    y, hbuf, codes, scales, tscales, meta, route, work = ts[:8]
    assert y is not None and hbuf is not None and codes is not None and scales is not None
    assert tscales is not None and meta is not None and route is not None and work is not None

    after = _arg(a, 5)

    def item(e: int, cols: slice) -> None:
        # a5 = j + 1: e's rows of list j must be done (the device waits for them;
        # in one-at-a-time order they are, or never will be)
        if after and int(work[after - 1, 2 + e]) < hbuf.shape[1]:
            raise CpuOpError(f"expert {e}: its rows of list {after - 1} are not all done ({int(work[after - 1, 2 + e])} of {hbuf.shape[1]}): the device would wait past its bound")
        slots = _expert_slots(meta, route, e, route.shape[1] // TOPK)
        down = _expert_rows(codes, scales, e, cols, float(tscales[e]))  # [n, I]
        y[slots, cols] = hbuf[slots].float() @ down.T

    return take_items(work, a[0], list_items(meta, y.shape[1], a[1], a[2], a[3], _arg(a, 6)), a[1], item, a[4])


def expert_combine(ts: Slots, a: Args) -> None:
    fsq, y, route = ts[:3]
    assert fsq is not None and y is not None and route is not None
    toks = slice(a[0], a[0] + a[1])
    flat = slice(a[0] * TOPK, (a[0] + a[1]) * TOPK)
    slot = route[4, flat].reshape(a[1], TOPK).long()
    w = _floats(route[3, flat]).reshape(a[1], TOPK)
    here = slot >= 0
    _need(bool((slot[here] < y.shape[0]).all()), "EXPERT_COMBINE: a slot outside y")
    acc = torch.zeros(a[1], TOPK, y.shape[1])
    acc[here] = w[here][:, None] * _rms(y[slot[here]])
    fsq[toks] = acc.sum(1).to(fsq.dtype)


# ---- whole-step ops ------------------------------------------------------------
def embed(ts: Slots, a: Args) -> None:
    s, table, tokens = ts[:3]
    assert s is not None and table is not None and tokens is not None
    rows = slice(a[0], a[0] + a[1])
    ids = tokens[rows].long()
    bad = (ids < 0) | (ids >= table.shape[0])
    _need(not bool(bad.any()), f"EMBED: token ids {ids[bad].tolist()[:8]} outside [0, {table.shape[0]})")
    s[rows] = table[ids].float()


def argmax(ts: Slots, a: Args) -> None:
    logits, tokens = ts[0], ts[1]
    margin = ts[2] if len(ts) > 2 else None
    assert logits is not None and tokens is not None
    rows = slice(a[0], a[0] + a[1])
    x = logits[rows]
    _need(bool(torch.isfinite(x).all()), f"ARGMAX rows [{a[0]}, {a[0] + a[1]}): NaN or infinite logits (an unwritten or broken LM head)")
    # a stable descending sort puts the lower index first among equal logits
    val, idx = torch.sort(x, dim=1, descending=True, stable=True)
    if margin is not None:
        second = val[:, 1] if x.shape[1] > 1 else torch.full_like(val[:, 0], -math.inf)
        margin[rows] = val[:, 0] - second
    tokens[rows] = idx[:, 0].to(torch.int32)


OPS: dict[Op, Callable[[Slots, Args], "int | None"]] = {
    Op.NOP: nop,
    Op.SLEEP: sleep,
    Op.COPY: copy,
    Op.SCALE_ADD: scale_add,
    Op.GEMM: gemm,
    Op.RMSNORM: rmsnorm,
    Op.QK_ROPE_KV: qk_rope_kv,
    Op.ATTN_CHUNK: attn_chunk,
    Op.ATTN_MERGE: attn_merge,
    Op.RESIDUAL: residual,
    Op.TOPK: topk,
    Op.EXPERT_UP: expert_up,
    Op.EXPERT_DOWN: expert_down,
    Op.EXPERT_COMBINE: expert_combine,
    Op.EMBED: embed,
    Op.ARGMAX: argmax,
}

_missing = set(Op) - set(OPS)
if _missing:  # pragma: no cover - an opcode added to the header without an oracle
    raise RuntimeError(f"opcodes without a CPU implementation: {sorted(m.name for m in _missing)}")
