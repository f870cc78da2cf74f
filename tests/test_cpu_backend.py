"""The CPU backend: each op against a plain loop of its header semantics, and
run_stream's scheduling (orders, counters across steps, stuck programs)."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuvm.cpu import CpuOpError, StuckError, run_stream
from gpuvm.cpu import ops
from gpuvm.opspec import WORK_COLUMNS_BY_EXPERT, expert_items, expert_weight
from gpuvm.isa import DType, Op, f2i
from gpuvm.muse.formats import E2M1_VALUES, tile_nvfp4, untile_nvfp4
from gpuvm.program import Program, ProgramError
from tests.randprog import random_program

GEN = torch.Generator().manual_seed(1234)


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=GEN)


def nan(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.full(shape, float("nan")).to(dtype)


def rms(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x.double() ** 2).mean(-1, keepdim=True) + 1e-6).float()


def bits(x: float) -> int:
    return f2i(x)


# ---- dense ops ---------------------------------------------------------------------
def test_gemm_k_parts_sum_at_the_last_part_from_zero_tickets() -> None:
    """K parts (a5 P, a6 part, a7 ticket): the out tile appears only when its
    last part counts the ticket to a multiple of P; run_stream from zero
    counters zeroes the tickets, so a ticket left mid-count (an aborted run)
    cannot sum a tile early."""
    p = Program("k parts")
    x, w = p.tensor("x", (3, 64), DType.F32), p.tensor("w", (8, 64), DType.F32, "weight")
    out, parts = p.tensor("out", (3, 8), DType.F32), p.tensor("parts", (3, 32), DType.F32)
    tickets = p.tensor("tickets", (2,), DType.I32, "ticket")
    for j in range(4):
        for m, (c0, t0, tn) in enumerate(((0, 0, 0), (4, 0, 0))):
            p.op(Op.GEMM, [out, x, w, parts, tickets], [c0, 4, t0, tn, 0, 4, j, m])
    s = p.build(order="given")
    xv, wv = randn(3, 64), randn(8, 64)
    b = {"x": xv, "w": wv, "out": nan(3, 8), "parts": nan(3, 32), "tickets": torch.tensor([3, 1], dtype=torch.int32)}
    counters = run_stream(s, b)
    torch.testing.assert_close(b["out"], xv @ wv.T, rtol=1e-5, atol=1e-5)
    assert b["tickets"].tolist() == [4, 4]
    b["out"].fill_(float("nan"))
    run_stream(s, b, step=1, counters=counters)  # the next step counts on
    assert b["tickets"].tolist() == [8, 8] and not b["out"].isnan().any()
    one = nan(3, 8)
    ops.gemm([one, xv, wv, nan(3, 32), torch.zeros(1, dtype=torch.int32)], [0, 8, 0, 0, 0, 4, 1, 0])  # a part, not the last
    assert one.isnan().all()


def test_gemm_writes_its_columns_only() -> None:
    x, w = randn(5, 32).bfloat16(), randn(12, 32).bfloat16()
    out = nan(5, 12, dtype=torch.bfloat16)
    ops.gemm([out, x, w], [4, 5, 0, 0])
    want = torch.tensor([[sum(float(x[t, k]) * float(w[n, k]) for k in range(32)) for n in range(4, 9)] for t in range(5)])
    torch.testing.assert_close(out[:, 4:9].float(), want.bfloat16().float(), atol=0, rtol=8e-3)
    assert out[:, :4].isnan().all() and out[:, 9:].isnan().all()
    out32 = nan(5, 12)
    ops.gemm([out32, x.float(), w.float()], [0, 12, 0, 0])
    torch.testing.assert_close(out32, x.float() @ w.float().T)
    part = nan(5, 12)  # tokens [1, 4) only
    ops.gemm([part, x.float(), w.float()], [0, 12, 1, 3])
    torch.testing.assert_close(part[1:4], (x.float() @ w.float().T)[1:4])
    assert part[0].isnan().all() and part[4].isnan().all()


def test_rmsnorm_rows() -> None:
    x, w = randn(6, 16), randn(16)
    out = nan(6, 16, dtype=torch.bfloat16)
    ops.rmsnorm([out, x, w], [2, 3])
    torch.testing.assert_close(out[2:5], (rms(x[2:5]) * (1 + w)).bfloat16())
    assert out[:2].isnan().all() and out[5:].isnan().all()


def test_residual_and_fused_norm() -> None:
    s, a, al, be, wn = randn(4, 16), randn(4, 16), randn(16), randn(16), randn(16)
    s0 = s.clone()
    o32, o16 = nan(4, 16), nan(4, 16, dtype=torch.bfloat16)
    ops.residual([s, a, al, be, wn, o32, o16], [1, 2])
    new = al * s0[1:3] + be * rms(a[1:3])
    torch.testing.assert_close(s[1:3], new)
    torch.testing.assert_close(s[[0, 3]], s0[[0, 3]])
    torch.testing.assert_close(o32[1:3], rms(new) * (1 + wn))
    torch.testing.assert_close(o16[1:3], (rms(new) * (1 + wn)).bfloat16())
    assert o32[0].isnan().all() and o16[3].isnan().all()
    ops.residual([s, a, al, be], [0, 4])  # no fused norm: nothing else written
    assert o32[0].isnan().all()


def test_residual_over_columns_from_gemm_statistics() -> None:
    """GEMM tiles leave their residual statistics; RESIDUAL cut into column
    ranges then gives what the whole-row op gives, and writes only its columns."""
    t, d, k = 3, 32, 24
    x, w = randn(t, k).bfloat16(), randn(d, k).bfloat16()
    s, al, be, wn = randn(t, d), 1 + 0.1 * randn(d), 0.3 + 0.1 * randn(d), randn(d)
    a, stats = nan(t, d), nan(t, 3, 4)
    for slot, (c0, n) in enumerate(((0, 13), (13, 3), (16, 16))):
        ops.gemm([a, x, w, stats, s, al, be], [c0, n, 0, 0, slot])
    torch.testing.assert_close(stats[0, 0, 0], (a[0, :13] ** 2).sum())
    whole_s, whole_o = s.clone(), nan(t, d)
    ops.residual([whole_s, a, al, be, wn, whole_o], [0, t])
    cut_o, cut_b = nan(t, d), nan(t, d, dtype=torch.bfloat16)
    for c0, n in ((0, 8), (8, 20)):
        ops.residual([s, a, al, be, wn, cut_o, cut_b, stats], [0, t, c0, n])
    assert cut_o[:, 28:].isnan().all()
    torch.testing.assert_close(s[:, :28], whole_s[:, :28])
    torch.testing.assert_close(cut_o[:, :28], whole_o[:, :28])
    torch.testing.assert_close(cut_b[:, :28], whole_o[:, :28].bfloat16(), atol=0, rtol=2**-7)


def test_copy_and_scale_add() -> None:
    x, y, d = randn(4, 8), randn(32), nan(32)
    ops.copy([d, x], [3, 10])
    torch.testing.assert_close(d[3:13], x.flatten()[3:13])
    assert d[:3].isnan().all() and d[13:].isnan().all()
    ops.scale_add([d, x, y], [0, 32, bits(2.0), bits(-0.5)])
    torch.testing.assert_close(d, 2.0 * x.flatten() - 0.5 * y)


# ---- attention ---------------------------------------------------------------------
def test_rope_pairs_and_relative_positions() -> None:
    q, k = randn(1, 3, 64), randn(1, 3, 64)
    torch.testing.assert_close(ops.rope(q, torch.tensor([0])), q)
    p = torch.tensor([1234])
    r = ops.rope(q, p)
    torch.testing.assert_close(r.norm(dim=-1), q.norm(dim=-1))
    ang = 1234 * 500000.0 ** (-2 * 5 / 64)  # pair 5 = dims (10, 11)
    torch.testing.assert_close(r[0, :, 10], q[0, :, 10] * math.cos(ang) - q[0, :, 11] * math.sin(ang))
    torch.testing.assert_close(r[0, :, 11], q[0, :, 10] * math.sin(ang) + q[0, :, 11] * math.cos(ang))
    # q.k depends only on the distance between the positions
    d1 = (ops.rope(q, torch.tensor([70])) * ops.rope(k, torch.tensor([50]))).sum(-1)
    d2 = (ops.rope(q, torch.tensor([90020])) * ops.rope(k, torch.tensor([90000]))).sum(-1)
    torch.testing.assert_close(d1, d2, atol=1e-4, rtol=1e-4)


def _attn_setup(C: int, n: int, S: int, pos0s: list[int], hq: int = 4, hkv: int = 2):
    T = C * n
    hd = 64
    width = (2 * hq + 2 * hkv) * hd
    qkvg = randn(T, width).bfloat16()
    kc = torch.randn(C, S, hkv, hd, generator=GEN).to(torch.float8_e4m3fn)
    vc = torch.randn(C, S, hkv, hd, generator=GEN).to(torch.float8_e4m3fn)
    convs = torch.tensor([[c * n, n, pos0s[c], 0] for c in range(C)], dtype=torch.int32)
    return qkvg, kc, vc, convs


def _naive_attention(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, convs: torch.Tensor, window: int, ks: float, vs: float) -> torch.Tensor:
    """softmax(q.k/8) v for each token and head, one key at a time."""
    T, hq, _ = q.shape
    S, hkv = kc.shape[1], kc.shape[2]
    out = torch.zeros(T, hq, 64, dtype=torch.float64)
    for c, (tok0, n, pos0, _) in enumerate(convs.tolist()):
        for j in range(n):
            p = pos0 + j
            keys = [kp for kp in range(0, p + 1) if not window or kp > p - window]
            for h in range(hq):
                kv = h // (hq // hkv)
                sc = torch.tensor([float(q[tok0 + j, h].double() @ (kc[c, kp % S, kv].double() * ks)) / 8 for kp in keys], dtype=torch.float64)
                pr = torch.softmax(sc, 0)
                out[tok0 + j, h] = sum(pr[i] * vc[c, kp % S, kv].double() * vs for i, kp in enumerate(keys))
    return out


@pytest.mark.parametrize("window, chunk, S, pos0s", [(0, 5, 24, [3, 15]), (0, 64, 24, [0, 16]), (6, 3, 16, [2, 20]), (6, 4, 16, [30, 0]), (0, 1, 12, [4, 1])])
def test_attention_chunks_merge_to_softmax(window: int, chunk: int, S: int, pos0s: list[int]) -> None:
    C, n, hq, hkv = 2, 3, 4, 2
    qkvg, kc, vc, convs = _attn_setup(C, n, S, pos0s, hq, hkv)
    T = C * n
    q = nan(T, hq, 64, dtype=torch.bfloat16)
    ks, vs = 0.75, 1.5
    w_qn, w_kn = randn(64) * 0.1, randn(64) * 0.1
    kc_before = kc.clone()
    for c in range(C):
        ops.qk_rope_kv([qkvg, q, w_qn, w_kn, kc, vc, convs], [c, int(window > 0), bits(ks), bits(vs)])
    # the new keys landed in slots p % S, nothing else moved
    written = torch.zeros(C, S, dtype=torch.bool)
    for c, (tok0, nn, pos0, _) in enumerate(convs.tolist()):
        for j in range(nn):
            written[c, (pos0 + j) % S] = True
            k = rms(qkvg[tok0 + j, hq * 64 : (hq + hkv) * 64].float().view(hkv, 64)) * (1 + w_kn)
            if window:
                k = ops.rope(k[None], torch.tensor([pos0 + j]))[0]
            torch.testing.assert_close(kc[c, (pos0 + j) % S].float(), (k / ks).to(torch.float8_e4m3fn).float())
    assert torch.equal(kc[~written].view(torch.uint8), kc_before[~written].view(torch.uint8))
    keys = S if window == 0 else window + n - 1
    nch = -(-keys // chunk)
    part_o, part_ml = nan(T, hq, nch, 64), nan(T, hq, nch, 2)
    for c in range(C):
        for h in range(hkv):
            for j in range(nch):
                ops.attn_chunk([q, kc, vc, convs, part_o, part_ml], [c, h, j, chunk, window, bits(ks), bits(vs)])
    assert not part_o.isnan().any() and not part_ml.isnan().any()
    o = nan(T, hq * 64, dtype=torch.bfloat16)
    ops.attn_merge([o, part_o, part_ml, qkvg], [0, T])
    att = _naive_attention(q, kc, vc, convs, window, ks, vs)
    gate = qkvg[:, (hq + 2 * hkv) * 64 :].float().view(T, hq, 64)
    want = (rms(att.float()) * torch.sigmoid(gate)).reshape(T, hq * 64)
    torch.testing.assert_close(o.float(), want.bfloat16().float(), atol=2e-2, rtol=2e-2)


def test_chunk_past_the_keys_is_empty() -> None:
    qkvg, kc, vc, convs = _attn_setup(1, 2, 32, [5])
    q = randn(2, 4, 64).bfloat16()
    po, pml = nan(2, 4, 4, 64), nan(2, 4, 4, 2)
    ops.attn_chunk([q, kc, vc, convs, po, pml], [0, 1, 3, 8, 0, bits(1.0), bits(1.0)])  # keys 24..31 > 6
    assert (po[:, 2:4, 3] == 0).all() and (pml[:, 2:4, 3, 0] == -math.inf).all() and (pml[:, 2:4, 3, 1] == 0).all()
    assert po[:, :2].isnan().all() and po[:, :, :3].isnan().all()
    # chunk 0: the first token (position 5) sees keys 0..5, the second 0..6
    ops.attn_chunk([q, kc, vc, convs, po, pml], [0, 0, 0, 8, 0, bits(1.0), bits(1.0)])
    k = kc[0, :7, 0].float()
    sc = q[0, 0].float() @ k[:6].T / 8
    torch.testing.assert_close(pml[0, 0, 0, 0], sc.max())
    torch.testing.assert_close(pml[0, 0, 0, 1], torch.exp(sc - sc.max()).sum())


def test_attention_rejects_keys_the_ring_lost() -> None:
    qkvg, kc, vc, convs = _attn_setup(1, 2, 8, [20])
    q = randn(2, 4, 64).bfloat16()
    po, pml = nan(2, 4, 4, 64), nan(2, 4, 4, 2)
    with pytest.raises(CpuOpError, match="no longer in the 8-slot cache"):
        ops.attn_chunk([q, kc, vc, convs, po, pml], [0, 0, 0, 8, 0, bits(1.0), bits(1.0)])  # full attention from 0
    ops.attn_chunk([q, kc, vc, convs, po, pml], [0, 0, 0, 8, 7, bits(1.0), bits(1.0)])  # window 7 fits in 8 slots
    bad = convs.clone()
    bad[0, 0] = 1  # tokens [1, 3) of a 2-token batch
    with pytest.raises(CpuOpError, match="outside"):
        ops.attn_chunk([q, kc, vc, bad, po, pml], [0, 0, 0, 8, 7, bits(1.0), bits(1.0)])


# ---- routing and experts -------------------------------------------------------------
def test_topk_ties_slots_and_weights() -> None:
    T, NE, E, first = 5, 12, 4, 2
    scores = randn(T, NE)
    scores[1] = 0.0  # all tied: experts 0..7 in index order
    scores[3, 9] = scores[3, 2]  # a tie between a non-local and a local expert
    meta, route = torch.full((2, E), -7, dtype=torch.int32), torch.full((5, 8 * T), -7, dtype=torch.int32)
    ops.topk([scores, meta, route], [first, E])
    assert route[2, 8:16].tolist() == list(range(8))
    picks = route[2].view(T, 8).long()
    w = route[3].view(torch.float32).view(T, 8)
    slots = route[4].view(T, 8)
    for t in range(T):
        order = sorted(range(NE), key=lambda x: (-float(scores[t, x]), x))[:8]
        assert picks[t].tolist() == order
        torch.testing.assert_close(w[t], torch.softmax(scores[t, order], 0))
    # slots: expert by expert, tokens in order, -1 for experts of other shards
    expect, slot = [], 0
    for e in range(E):
        toks = [t for t in range(T) if first + e in picks[t].tolist()]
        assert meta[0, e] == len(toks) and meta[1, e] == slot
        for t in toks:
            k = picks[t].tolist().index(first + e)
            assert slots[t, k] == slot and route[0, slot] == t
            assert route[1, slot].view(torch.float32) == w[t, k]
            slot += 1
        expect += toks
    local = (picks >= first) & (picks < first + E)
    assert (slots[~local] == -1).all()
    assert (route[0, slot:] == -7).all()  # unused slots are left alone


def test_topk_rejects_nan_scores() -> None:
    scores = randn(2, 10)
    scores[1, 3] = float("nan")
    with pytest.raises(CpuOpError, match="NaN"):
        ops.topk([scores, torch.zeros(2, 2, dtype=torch.int32), torch.zeros(5, 16, dtype=torch.int32)], [0, 2])


def _nvfp4(*lead_nk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    *lead, n, k = lead_nk
    codes = torch.randint(0, 256, (*lead, n, k // 2), dtype=torch.uint8, generator=GEN)
    scales = (torch.rand(*lead, n, k // 16, generator=GEN) + 0.5).to(torch.float8_e4m3fn)
    ts = torch.rand(*lead, generator=GEN) + 0.5 if lead else torch.tensor(1.0)
    return codes, scales, ts


def _deq(codes: torch.Tensor, scales: torch.Tensor, ts: float) -> torch.Tensor:
    """code * block scale * tensor scale, element by element (even k in the low nibble)."""
    n, k = codes.shape[0], codes.shape[1] * 2
    out = torch.empty(n, k)
    for r in range(n):
        for i in range(k):
            byte = int(codes[r, i // 2])
            code = byte & 0xF if i % 2 == 0 else byte >> 4
            out[r, i] = float(E2M1_VALUES[code]) * float(scales[r, i // 16].float()) * ts
    return out


def _routing(T: int, E: int, picks: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """TOPK's tables for tokens choosing the given local experts (0 .. E-1); the
    rest of each top-8 goes to experts of other shards."""
    scores = torch.zeros(T, E + 8)
    scores[:, :E] = -10.0
    for t, es in enumerate(picks):
        scores[t, es] = torch.linspace(2.0, 1.0, len(es))
    meta, route = torch.zeros(2, E, dtype=torch.int32), torch.zeros(5, 8 * T, dtype=torch.int32)
    ops.topk([scores, meta, route], [0, E])
    return scores, meta, route


def test_expert_up_down_combine() -> None:
    T, E, H, I = 4, 3, 128, 128
    _, meta, route = _routing(T, E, [[0, 2], [2], [1, 0], []])
    x = randn(T, H).bfloat16()
    gu_c, gu_s, gu_ts = _nvfp4(E, 2, I, H)
    d_c, d_s, d_ts = _nvfp4(E, H, I)
    hbuf, y = nan(8 * T, I, dtype=torch.bfloat16), nan(8 * T, H)
    work = torch.zeros(2, 2, dtype=torch.int32)
    # work lists (the ops take tiled NVFP4): 4 workers over 3 experts hit, one
    # tile of all 128 rows each; the first takes all items and signals for the 4, the others nothing
    assert [ops.expert_up([hbuf, x, *tile_nvfp4(gu_c, gu_s), gu_ts, meta, route, work], [0, 4, 128, 128, 0]) for _ in range(4)] == [4, 0, 0, 0]
    assert [ops.expert_down([y, hbuf, *tile_nvfp4(d_c, d_s), d_ts, meta, route, work], [1, 2, H, H, 0]) for _ in range(2)] == [2, 0]
    assert work.tolist() == [[3 + 4, 3], [3 + 2, 3]]  # (items + workers: each worker's last take is past the end, items done)
    used = int(meta[0].sum())
    assert used == 5 and hbuf[used:].isnan().all() and y[used:].isnan().all()
    mats = [[_deq(gu_c[e, s], gu_s[e, s], float(gu_ts[e, s])) for s in (0, 1)] + [_deq(d_c[e], d_s[e], float(d_ts[e]))] for e in range(E)]
    for slot in range(used):
        e = next(e for e in range(E) if meta[1, e] <= slot < meta[1, e] + meta[0, e])
        t = int(route[0, slot])
        g, u = mats[e][0] @ x[t].float(), mats[e][1] @ x[t].float()
        torch.testing.assert_close(hbuf[slot], (g / (1 + torch.exp(-g)) * u).bfloat16())
        torch.testing.assert_close(y[slot], mats[e][2] @ hbuf[slot].float(), rtol=1e-4, atol=1e-4)
    fsq = nan(T, H, dtype=torch.bfloat16)
    ops.expert_combine([fsq, y, route], [0, T])
    for t in range(T):
        acc = torch.zeros(H)
        for k in range(8):
            s = int(route[4, t * 8 + k])
            if s >= 0:
                acc += route[3, t * 8 + k].view(torch.float32) * rms(y[s])
        torch.testing.assert_close(fsq[t], acc.bfloat16())
    assert (fsq[3] == 0).all()  # a token with no local expert


def test_expert_lists_see_weights_written_between_calls() -> None:
    # the ops dequantize an expert once and keep it for its next items: a write to the
    # codes or scales in place (a new step's weights) must not be served from that copy
    T, E, H, I = 2, 2, 64, 128
    _, meta, route = _routing(T, E, [[0], [0]])
    hbuf = randn(8 * T, I).bfloat16()
    d_c, d_s, d_ts = _nvfp4(E, H, I)
    codes, scales = tile_nvfp4(d_c, d_s)

    def down() -> torch.Tensor:
        y, work = nan(8 * T, H), torch.zeros(1, 2, dtype=torch.int32)
        ops.expert_down([y, hbuf, codes, scales, d_ts, meta, route, work], [0, 4, 16, 16, 0])  # 4 items of expert 0's rows
        return y[:2].clone()

    first = down()
    for write in (lambda: codes.bitwise_xor_(0x11), lambda: scales.copy_((scales.float() * 2).to(scales.dtype))):
        write()
        want = _deq(*(t[0] for t in untile_nvfp4(codes, scales)), float(d_ts[0])) @ hbuf[:2].float().T
        got = down()
        assert not torch.equal(got, first)
        torch.testing.assert_close(got, want.T, rtol=1e-4, atol=1e-4)
        first = got


def test_fixed_workers_do_the_claimed_lists_items() -> None:
    """Fixed workers (a4 = 1..W) take items w - 1, w - 1 + W, ... in any order
    of running: the same rows as claimed workers, bit for bit, the counter
    untouched, and the one that finishes the last item signals for all."""
    T, E, H, I = 4, 3, 128, 64
    _, meta, route = _routing(T, E, [[0, 2], [2], [1, 0], [1]])
    x = randn(T, H).bfloat16()
    codes, scales = tile_nvfp4(*_nvfp4(E, 2, I, H)[:2])
    ts = torch.ones(E, 2)
    assert len(ops.list_items(meta, I, 3, 16, 16)) == 12  # 3 experts hit x 4 tiles of 16 rows: 4 items a worker
    claimed, fixed = nan(8 * T, I, dtype=torch.bfloat16), nan(8 * T, I, dtype=torch.bfloat16)
    work = torch.zeros(2, 2, dtype=torch.int32)
    assert [ops.expert_up([claimed, x, codes, scales, ts, meta, route, work], [0, 3, 16, 16, 0]) for _ in range(3)] == [3, 0, 0]
    got = {w: ops.expert_up([fixed, x, codes, scales, ts, meta, route, work], [1, 3, 16, 16, w]) for w in (2, 3, 1)}
    assert got == {2: 0, 3: 0, 1: 3}  # worker 1 ran last: its last item was the list's last done
    assert work.tolist() == [[12 + 3, 12], [0, 12]]
    used = int(meta[0].sum())
    assert torch.equal(fixed[:used], claimed[:used]) and not fixed[:used].isnan().any() and fixed[used:].isnan().all()


def test_expert_with_no_tokens_touches_nothing() -> None:
    """Only expert 0 has tokens: with 4 workers at a grain of 16 rows its 4
    items of 16 rows are the whole list, and a worker past them does nothing."""
    _, meta, route = _routing(2, 3, [[0], [0]])
    hbuf = nan(16, 64, dtype=torch.bfloat16)
    codes, scales = tile_nvfp4(*_nvfp4(3, 2, 64, 128)[:2])
    ts = torch.ones(3, 2)
    x = randn(2, 128).bfloat16()
    assert ops.list_items(meta, 64, 4, 16, 64) == [(0, slice(r, r + 16)) for r in (0, 16, 32, 48)]
    work = torch.tensor([[4, 4]], dtype=torch.int32)  # the list done, its items taken: this draw is the first past them
    assert ops.expert_up([hbuf, x, codes, scales, ts, meta, route, work], [0, 4, 16, 64, 0]) == 1  # "all taken" (its finisher signalled 3)
    assert ops.expert_up([hbuf, x, codes, scales, ts, meta, route, work], [0, 4, 16, 64, 0]) == 0
    assert hbuf.isnan().all() and work.tolist() == [[6, 4]]
    work.zero_()
    for _ in range(3):
        ops.expert_up([hbuf, x, codes, scales, ts, meta, route, work], [0, 3, 16, 64, 0])
    # 3 workers: 2 items of 32 rows (ceil(64 / 3) rounded up to the grain); a cap of 16: 4 items
    assert ops.list_items(meta, 64, 3, 16, 64) == [(0, slice(0, 32)), (0, slice(32, 64))]
    assert ops.list_items(meta, 64, 3, 16, 16) == [(0, slice(r, r + 16)) for r in (0, 16, 32, 48)]
    assert not hbuf[:2].isnan().any() and hbuf[2:].isnan().all() and work.tolist() == [[2 + 3, 2]]


def test_expert_items_share_the_workers_by_tokens() -> None:
    """An expert's tiles are its share of the workers weighted by its tokens
    (quarters: 4 up to 4 tokens, 7 up to 8, 8 above): one of 13 tokens beside
    one of 1 gets 10 of 16 workers' tiles, half the rows each, so that its
    slower items end with the other's; equal weights split evenly."""
    assert [expert_weight(t) for t in (0, 1, 4, 5, 8, 9, 13)] == [0, 4, 4, 7, 7, 8, 8]
    items = expert_items([1, 0, 13], 160, 16, 16, 1 << 20)
    assert items == [(0, r, 32) for r in range(0, 160, 32)] + [(2, r, 16) for r in range(0, 160, 16)]
    assert expert_items([2, 3, 1], 96, 6, 16, 1 << 20) == [(e, r, 48) for e in range(3) for r in (0, 48)]
    assert expert_items([2, 13], 96, 6, 16, 32) == [(0, 0, 32), (0, 32, 32), (0, 64, 32), (1, 0, 32), (1, 32, 32), (1, 64, 32)]  # the cap rules


def test_expert_items_come_most_chunks_of_32_tokens_first() -> None:
    """The walk's order (ops/experts.cuh GVM_EXP_LPT 2): experts with more
    chunks of 32 tokens first, ties in expert order; longest_first=False is
    expert order throughout."""
    toks = [5, 40, 33, 0, 100, 32]
    order = lambda **kw: list(dict.fromkeys(e for e, _, _ in expert_items(toks, 64, 8, 16, 16, **kw)))  # noqa: E731
    assert order() == [4, 1, 2, 0, 5]
    assert order(longest_first=False) == [0, 1, 2, 4, 5]


def test_heavy_experts_items_are_half_the_cap() -> None:
    """With heavy (a list's a6) at 32 an expert of more than 32 tokens (a pass
    of the shared tile for each 32) has items of half the cap, in whole grains
    and at least one; the others keep the cap; the one-round sizing is
    unchanged below it. The default is 0: no halving."""
    assert expert_items([33], 512, 2, 16, 128) == [(0, r, 128) for r in range(0, 512, 128)]
    items = expert_items([33, 32], 512, 2, 16, 128, heavy=32)
    assert items == [(0, r, 64) for r in range(0, 512, 64)] + [(1, r, 128) for r in range(0, 512, 128)]
    assert expert_items([100], 64, 1, 16, 16, heavy=32) == [(0, r, 16) for r in range(0, 64, 16)]  # half of one grain: a grain
    assert expert_items([100], 96, 1, 16, 96, heavy=32) == [(0, 0, 48), (0, 48, 48)]
    assert expert_items([40, 40], 256, 16, 16, 128, heavy=32) == [(e, r, 32) for e in range(2) for r in range(0, 256, 32)]  # 8 tiles each


def test_work_list_counts_rows_by_expert_for_the_down_list() -> None:
    """With the expert columns (work [K, 2 + 32]) an up list counts each item's
    rows in work[k][2 + e]; a down list with a5 = k + 1 takes an expert's items
    only once its up rows are all counted, and fails, as the device's bounded
    wait would, when they are not."""
    T, E, H, I = 4, 3, 128, 128
    _, meta, route = _routing(T, E, [[0, 2], [2], [1, 0], [1]])
    x = randn(T, H).bfloat16()
    gu_c, gu_s, gu_ts = _nvfp4(E, 2, I, H)
    d_c, d_s, d_ts = _nvfp4(E, H, I)
    hbuf, y = nan(8 * T, I, dtype=torch.bfloat16), nan(8 * T, H)
    work = torch.zeros(2, WORK_COLUMNS_BY_EXPERT, dtype=torch.int32)
    down = [y, hbuf, *tile_nvfp4(d_c, d_s), d_ts, meta, route, work]
    with pytest.raises(CpuOpError, match="expert 0: its rows of list 0 are not all done"):
        ops.expert_down(down, [1, 2, 64, 64, 0, 1])
    work.zero_()
    assert [ops.expert_up([hbuf, x, *tile_nvfp4(gu_c, gu_s), gu_ts, meta, route, work], [0, 3, 16, 16, 0]) for _ in range(3)] == [3, 0, 0]
    assert work[0, 2:2 + E].tolist() == [I, I, I] and not work[0, 2 + E:].any()
    assert [ops.expert_down(down, [1, 2, 64, 64, 0, 1]) for _ in range(2)] == [2, 0]
    used = int(meta[0].sum())
    assert not y[:used].isnan().any() and not work[1, 2:].any()  # a down list counts no rows


def test_empty_work_list_is_signalled_by_its_first_worker() -> None:
    """No local expert has tokens: the worker that takes the first (past the
    end) draw completes the list, so its consumers are not left waiting."""
    _, meta, route = _routing(2, 3, [[], []])
    hbuf = nan(16, 32, dtype=torch.bfloat16)
    codes, scales = tile_nvfp4(*_nvfp4(3, 2, 32, 128)[:2])
    work = torch.zeros(1, 2, dtype=torch.int32)
    got = [ops.expert_up([hbuf, nan(2, 128, dtype=torch.bfloat16), codes, scales, torch.ones(3, 2), meta, route, work], [0, 3, 16, 64, 0]) for _ in range(3)]
    assert got == [3, 0, 0] and work.tolist() == [[3, 0]] and hbuf.isnan().all()


# ---- run_stream -------------------------------------------------------------------------
def _bind(stream, rng: random.Random) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    return {t.name: torch.randn(t.shape, generator=g) for t in stream.tensors}


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 40))
def test_any_valid_order_gives_the_stream_order_result(seed: int, n: int) -> None:
    s = random_program(random.Random(seed), n).build()
    base = _bind(s, random.Random(seed))
    want = {k: v.clone() for k, v in base.items()}
    ctr = run_stream(s, want)
    np.testing.assert_array_equal(ctr, s.per_step)
    got = {k: v.clone() for k, v in base.items()}
    ctr2 = run_stream(s, got, order="random", rng=random.Random(seed + 1))
    np.testing.assert_array_equal(ctr2, s.per_step)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=0, equal_nan=True)


def _copy_dag(n: int, seed: int) -> Program:
    """n COPY ops; op i copies element i and signals counter i // 2 (two
    signallers each), waiting on up to 3 counters of earlier pairs."""
    rng = random.Random(seed)
    p = Program("dag")
    x, y = p.tensor("x", (n,), DType.F32), p.tensor("y", (n,), DType.F32)
    done = [p.counter(f"c{i}") for i in range(-(-n // 2))]
    for i in range(n):
        waits = [done[j] for j in rng.sample(range(i // 2), min(i // 2, rng.randrange(4)))]
        p.op(Op.COPY, [y, x], [i, 1], waits=waits, signal=done[i // 2], label=f"copy{i}")
    return p


def _run_recorded(p: Program, monkeypatch: pytest.MonkeyPatch, seed: int, step: int = 0, counters: np.ndarray | None = None) -> tuple[tuple[int, ...], np.ndarray]:
    """Run a _copy_dag program in random order; check every op ran after all
    the signallers of the counters it waits on; return the order and counters."""
    ran: list[int] = []
    monkeypatch.setitem(ops.OPS, Op.COPY, lambda ts, a: (ran.append(a[0]), ops.copy(ts, a))[1])
    n = len(p.instrs)
    bufs = {"x": torch.arange(float(n)), "y": nan(n)}
    ctr = run_stream(p.build(), bufs, step=step, order="random", rng=random.Random(seed), counters=counters)
    assert torch.equal(bufs["y"], bufs["x"])
    at = {i: k for k, i in enumerate(ran)}
    for ins in p.instrs:
        for c, _ in ins.waits:
            assert all(at[sig.args[0]] < at[ins.args[0]] for sig in c.signallers), f"{ins.label} ran before a signaller of {c.name}"
    return tuple(ran), ctr


def test_random_order_respects_waits_and_varies(monkeypatch: pytest.MonkeyPatch) -> None:
    p = _copy_dag(30, 5)
    assert len({_run_recorded(p, monkeypatch, seed)[0] for seed in range(4)}) > 1


def test_counters_carry_across_steps_and_wrap(monkeypatch: pytest.MonkeyPatch) -> None:
    p = _copy_dag(12, 1)
    s = p.build()
    bufs = {"x": torch.arange(12.0), "y": nan(12)}
    ctr = run_stream(s, bufs)
    ctr = run_stream(s, bufs, step=1, order="random", counters=ctr)
    np.testing.assert_array_equal(ctr, 2 * s.per_step)
    with pytest.raises(StuckError, match=r"step 2: instruction \d+ 'copy\d+' waits on counter \d+ 'c\d+' = 2, target 6"):
        run_stream(s, bufs, step=2)  # counters not carried: the step-2 targets are out of reach
    # near 2^32 targets wrap past zero before the counters do: the device's
    # int32 difference still orders them, a plain comparison would not
    per = s.per_step.astype(np.int64)
    for step in (2**31 - 1, 2**31 + 5):
        start = (step * per) % 2**32
        _, ctr = _run_recorded(p, monkeypatch, seed=step, step=step, counters=start.astype(np.uint32))
        np.testing.assert_array_equal(ctr, ((step + 1) * per) % 2**32)


def test_stuck_in_random_order_names_the_wait() -> None:
    p = _copy_dag(6, 2)
    s = p.build()
    assert any(ins.waits for ins in p.instrs)
    ctr = np.zeros(len(s.counters), dtype=np.uint32)  # as if step 0 never ran
    with pytest.raises(StuckError, match="step 1: instruction 3 'copy3' waits on counter 0 'c0' = 2, target 4"):
        run_stream(s, {"x": torch.zeros(6), "y": torch.zeros(6)}, step=1, order="random", counters=ctr)


def test_bad_bindings_and_arguments() -> None:
    p = _copy_dag(4, 0)
    s = p.build()
    with pytest.raises(ProgramError, match="'y' .* not bound"):
        run_stream(s, {"x": torch.zeros(4)})
    with pytest.raises(ProgramError, match="expects F32"):
        run_stream(s, {"x": torch.zeros(4), "y": torch.zeros(4, dtype=torch.float64)})
    with pytest.raises(ProgramError, match="CPU backend needs CPU tensors"):
        run_stream(s, {"x": torch.zeros(4), "y": torch.zeros(4, device="meta")})
    with pytest.raises(ValueError, match="order"):
        run_stream(s, {"x": torch.zeros(4), "y": torch.zeros(4)}, order="reverse")
    with pytest.raises(ValueError, match="counters must have shape"):
        run_stream(s, {"x": torch.zeros(4), "y": torch.zeros(4)}, counters=np.zeros(1, dtype=np.uint32))


def test_op_errors_name_the_instruction() -> None:
    p = Program("bad convs")
    T, hq, hkv = 2, 4, 2
    qkvg = p.tensor("qkvg", (T, (2 * hq + 2 * hkv) * 64), DType.BF16)
    q = p.tensor("q", (T, hq, 64), DType.BF16)
    w = p.tensor("w", (64,), DType.F32)
    kc, vc = p.tensor("kc", (1, 8, hkv, 64), DType.E4M3), p.tensor("vc", (1, 8, hkv, 64), DType.E4M3)
    convs = p.tensor("convs", (1, 4), DType.I32)
    p.op(Op.QK_ROPE_KV, [qkvg, q, w, w, kc, vc, convs], [0, 1, f2i(1.0), f2i(1.0)], label="qk of conv 0")
    s = p.build()
    bufs = {"qkvg": randn(T, 768).bfloat16(), "q": nan(T, hq, 64, dtype=torch.bfloat16), "w": randn(64),
            "kc": torch.zeros(1, 8, hkv, 64, dtype=torch.uint8), "vc": torch.zeros(1, 8, hkv, 64, dtype=torch.float8_e4m3fn),
            "convs": torch.tensor([[1, 2, 0, 0]], dtype=torch.int32)}
    with pytest.raises(CpuOpError, match="instruction 0 'qk of conv 0' at step 0: conversation 0: tokens \\[1, 3\\) outside"):
        run_stream(s, bufs)
    bufs["convs"][0, 0] = 0  # fixed: a cache bound as its bytes works too
    run_stream(s, bufs)
    assert bufs["kc"].any() and not bufs["q"].isnan().any()
