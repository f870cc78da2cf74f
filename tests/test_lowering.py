"""The Muse lowering: which ops a layer becomes, how they depend on each other,
what they bind, how fast a full-size program builds, and how layers chain."""
from __future__ import annotations

import dataclasses

import random
import time
from collections import Counter as Tally

import numpy as np
import pytest
import torch

from gpuvm.cpu import run_stream
from gpuvm.cpu.ops import list_items
from gpuvm.isa import FLAG_LAZY, NONE, DType, Op, i2f
from gpuvm.muse.config import SHARD, SMALL
from gpuvm.muse import lowering
from gpuvm.muse.lowering import EXPERT_CAP, POISON_INT, LayerProgram, Tiles, _fill_rows, _span_rows, _split_tail, bind_layer, emit_layer, n_chunks
from gpuvm.muse.state import make_inputs, make_state
from gpuvm.muse.weights import layer_shapes, make_layer_weights
from gpuvm.program import Program, ProgramError
from gpuvm.tensors import TORCH_DTYPES

FULL_CASE_SLOTS = -(-(81_920 + 8) // 64) * 64  # the largest decode case, rounded


def lower_layer(*args, tiles: Tiles | None = None, **kw) -> LayerProgram:  # type: ignore[no-untyped-def]
    """The layer's own ops: lowered without the code warmer, whose instances
    tests/test_code_warm.py covers."""
    return lowering.lower_layer(*args, tiles=dataclasses.replace(tiles or Tiles(), code_warm=0), **kw)


def _ops(stream, opcode: Op) -> list:  # type: ignore[no-untyped-def]
    return [o for o in stream.ops if o.opcode == opcode]


def _cover(spans: list[tuple[int, int]], n: int) -> None:
    """spans (start, count) tile [0, n) exactly once."""
    assert sorted(spans) == sorted(set(spans))
    cells = sorted(x for a, k in spans for x in range(a, a + k))
    assert cells == list(range(n))


def test_largest_case_builds_fast_at_full_size() -> None:
    best = min(_timed_build() for _ in range(2))
    assert best < 0.5, f"building the 32x8 full layer took {best:.2f} s"


def _timed_build() -> float:
    t = time.perf_counter()
    lp = lower_layer(SHARD, "full", 32, 8, FULL_CASE_SLOTS)
    dt = time.perf_counter() - t
    assert len(lp.stream) > 4_000  # 4,520 instructions (1,504 of them attention chunks)
    return dt


@pytest.mark.parametrize("kind", ["full", "sliding"])
def test_full_size_op_counts_and_tiles(kind: str) -> None:
    C, n, S = 32, 8, FULL_CASE_SLOTS
    lp = lower_layer(SHARD, kind, C, n, S)
    s = lp.stream
    count = Tally(o.opcode for o in s.ops)
    # full: 32 x 2 x 81 chunks of 1,024 and 41 of 2,048 pass Tiles.full_ops (2,048), so 4,096; a sliding window in shorter chunks: 32 x 2 x 5 ops
    chunk = 4096 if kind == "full" else 512
    nch = -(-S // chunk) if kind == "full" else -(-(2048 + 8 - 1) // chunk)
    assert nch == n_chunks(SHARD, kind, n, S, chunk)
    # two waves of chunks or more (full): the last 4 conversations' chunks at 2,048 keys,
    # 4 x 42 >= Tiles.attn_tail (132) cut; the sliding layer's 320 chunks stay whole
    tail, tail_nch = (4, -(-S // (chunk // 2))) if kind == "full" else (0, nch)
    chunks = (C - tail) * 2 * nch + tail * 2 * tail_nch
    # QK-norm/RoPE one new token an op (Tiles.qk_tokens), all signalling their conversation's counter
    assert [o.args[4:6] for o in _ops(s, Op.QK_ROPE_KV)] == [(j, 1) for _ in range(C) for j in range(n)]
    attn = _ops(s, Op.ATTN_CHUNK)
    assert [o.args[3] for o in attn] == [chunk] * (C - tail) * 2 * nch + [chunk // 2] * tail * 2 * tail_nch
    assert [o.args[4] for o in _ops(s, Op.ATTN_MERGE)] == [nch] * (C - tail) * 16 + [tail_nch] * tail * 16
    # one wave of 264 groups (Tiles.gemm_fill); at 256 tokens the GEMMs go in
    # 4 spans of 64 tokens (Tiles.gemm_span) x tiles of 64+ bf16 rows: Wqkvg's
    # q|k|v 64 rows (80 tiles, each in 2 K parts: Tiles.gemm_parts, 160 + the
    # g tiles' 64 fill 224 groups), its g beside them 64 rows (64), Wo 128 rows
    # (256), Wsq beside the router's 128 instructions 128 rows (128), Wex 128
    # rows (256); the f32 router in tiles of 32 rows, each cut into 4 K parts
    # (Tiles.router_ops 128); experts: 264 workers each for up and down
    gemm_tiles = 4 * (2 * 1280 // 64 + 1024 // 64 + 8192 // 128 + 4 * 256 // 32 + 4096 // 128 + 8192 // 128)
    assert count == {
        Op.RMSNORM: C * n, Op.GEMM: gemm_tiles, Op.QK_ROPE_KV: C * n, Op.ATTN_CHUNK: chunks, Op.ATTN_MERGE: C * 16,
        Op.RESIDUAL: 2 * C * n, Op.TOPK: 33, Op.EXPERT_UP: 264, Op.EXPERT_DOWN: 264, Op.EXPERT_COMBINE: C * n,  # a row each
    }
    # the top-8 picks 8 tokens each (Tiles.topk_late; the first 6 in the groups
    # the router's 128 and the squeeze's 128 instructions leave, the rest behind
    # the squeeze's), then the routing table
    topk = _ops(s, Op.TOPK)
    assert [o.args[2:5] for o in topk] == [(1, t0, 8) for t0 in range(0, 256, 8)] + [(2, 0, 0)]
    assert [len(o.tensors) for o in topk] == [3] * 32 + [4]  # the table resets the work lists
    tickets: dict[tuple[str, int], list[int]] = {}
    for o in _ops(s, Op.GEMM):
        w = o.tensors[2]
        assert o.args[1] in ((64, 128) if w.dtype == DType.BF16 else (32,)) and o.args[2] % 64 == 0 and o.args[3] == 64
        if w.dtype == DType.BF16 and o.args[5] == 0:
            assert o.prefetch == (2, o.args[0] * w.row_bytes, o.args[1] * w.row_bytes) and o.args[5:8] == (0, 0, 0)
        else:  # K part j of its tile (ticket m): the part's bytes of the tile's first row
            (n_parts, j, m), es = o.args[5:8], w.row_bytes // SHARD.d
            kp = SHARD.d // n_parts
            assert (n_parts, es) == ((2, 2) if w.dtype == DType.BF16 else (4, 4))
            assert o.prefetch == (2, o.args[0] * w.row_bytes + j * kp * es, kp * es)
            tickets.setdefault((w.name, m), []).append(j)
    assert sorted(m for name, m in tickets if name.endswith("Wr")) == list(range(32))
    assert sorted(m for name, m in tickets if name.endswith("Wqkvg")) == list(range(80))
    assert all(sorted(js) == list(range(len(js))) and len(js) in (2, 4) for js in tickets.values())
    assert all(o.prefetch is None for o in s.ops if o.opcode in (Op.EXPERT_UP, Op.EXPERT_DOWN))
    # item rows in multiples of a tiled block of 16 rows (sized on the GPU), at most 128 (half for the up
    # list's experts of more than 64 tokens)
    assert {o.args[2:4] + o.args[6:7] for o in _ops(s, Op.EXPERT_UP)} == {(16, 128, 64)}
    assert {o.args[2:4] + o.args[6:7] for o in _ops(s, Op.EXPERT_DOWN)} == {(16, 128, 0)}
    assert len(s.counters) < 200 and len(s.tensors) < 50


def _small(kind: str, C: int = 3, n: int = 5, S: int = 100, tiles: Tiles | None = None):  # type: ignore[no-untyped-def]
    tiles = tiles or Tiles(gemm_fill=0, gemm_bytes=8192, rows=4, chunk=23, sliding_chunk=23)
    return lower_layer(SMALL, kind, C, n, S, tiles=tiles), tiles


#: fixed 8 KB GEMM tiles, or tiles sized to fill 12 groups (within 1-16 KB)
COVER_TILES = {
    "fixed": Tiles(gemm_fill=0, gemm_bytes=8192, rows=4, chunk=23, router_splits=2, sliding_chunk=23),
    "fill": Tiles(gemm_fill=12, gemm_min_bytes=1024, gemm_max_bytes=16384, rows=4, chunk=23, router_splits=2, sliding_chunk=23),
    "parts": Tiles(gemm_fill=0, gemm_bytes=8192, rows=4, chunk=23, router_splits=2, sliding_chunk=23, router_span=8, router_ops=4),
    # the squeeze (128 rows of 512 B, 8 a tile) beside the router's two token halves: 16 tiles
    # for 10 groups, its last 6 cut in two (Tiles.gemm_tail); Wo and Wex carry statistics: not cut
    "tail": Tiles(gemm_fill=12, gemm_min_bytes=1024, gemm_max_bytes=4096, gemm_tail=2, rows=4, chunk=23, router_splits=2, sliding_chunk=23),
    # the 15 tokens' picks 4 a TOPK (4, 4, 4, 3), ranked behind the squeeze (no groups are left: gemm_fill 0)
    "topklate": Tiles(gemm_fill=0, gemm_bytes=8192, rows=4, chunk=23, router_splits=2, sliding_chunk=23, topk_span=8, topk_tokens=4, topk_late=1),
    # a conversation's 5 tokens merged 2 at a time (2, 2, 1)
    "merge2": Tiles(gemm_fill=0, gemm_bytes=8192, rows=4, chunk=23, router_splits=2, sliding_chunk=23, merge_tokens=2),
}


@pytest.mark.parametrize("kind", ["full", "sliding"])
@pytest.mark.parametrize("tiling", sorted(COVER_TILES))
def test_tiles_cover_every_output_once(kind: str, tiling: str) -> None:
    lp, tl = _small(kind, tiles=COVER_TILES[tiling])
    s, cfg, T = lp.stream, SMALL, 15
    by_row: dict[tuple[str, int], list[tuple[int, int]]] = {}  # (out, token): column ranges
    parts: dict[int, list[int]] = {}  # K parts: ticket -> parts
    for o in _ops(s, Op.GEMM):
        t0, tn = (o.args[2], o.args[3]) if o.args[3] else (0, T)  # a token count of 0: all T
        if o.args[5] > 1:
            parts.setdefault(o.args[7], []).append(o.args[6])
            if o.args[6]:
                continue  # a tile's out is written once, by whichever part is last: counted at part 0
        for t in range(t0, t0 + tn):
            by_row.setdefault((o.tensors[0].name, t), []).append((o.args[0], o.args[1]))
    # the router's 16 rows in one tile over two token halves, in 2 K parts (router_ops 4)
    assert parts == ({0: [0, 1], 1: [0, 1]} if tiling == "parts" else {})
    widths = {"qkvg": cfg.qkvg_width, "a": cfg.d, "scores": cfg.n_experts, "x": cfg.squeeze, "f": cfg.d}
    assert sorted(by_row) == sorted(("L0." + k, t) for k in widths for t in range(T))
    for (name, _), cols in by_row.items():
        _cover(cols, widths[name[len("L0."):]])
    assert {(o.args[2], o.args[3]) for o in _ops(s, Op.GEMM) if o.tensors[0].name == "L0.scores"} == {(0, 8), (8, 7)}  # the router: two token halves
    for opcode in (Op.RMSNORM, Op.EXPERT_COMBINE):
        _cover([(o.args[0], o.args[1]) for o in _ops(s, opcode)], T)
    if tiling == "tail":
        assert [o.args[1] for o in _ops(s, Op.GEMM) if o.tensors[0].name == "L0.x"] == [8] * 10 + [4] * 12
    res = _ops(s, Op.RESIDUAL)
    for src in ("L0.a", "L0.f"):  # every column range (args 2, 3; 0, 0: whole rows) over every row once
        ranges = {(o.args[2], o.args[3]) for o in res if o.tensors[1].name == src}
        if ranges != {(0, 0)}:
            _cover(sorted(ranges), cfg.d)
        for c0, cn in ranges:
            _cover([(o.args[0], o.args[1]) for o in res if o.tensors[1].name == src and (o.args[2], o.args[3]) == (c0, cn)], T)
    merges = _ops(s, Op.ATTN_MERGE)
    pairs = sorted((t, h) for o in merges for t in range(o.args[0], o.args[0] + o.args[1]) for h in range(o.args[2], o.args[2] + o.args[3]))
    assert pairs == [(t, h) for t in range(T) for h in range(cfg.heads_q)]
    assert sorted({o.args[1] for o in merges}) == ([1, 2] if tiling == "merge2" else [5])
    # expert work lists: W workers share one counter per list (up 0, down 1),
    # and with every expert hit the items (expert, row tile) cover each
    # expert's rows once
    for k, (opcode, n_out) in enumerate(((Op.EXPERT_UP, cfg.expert_inter), (Op.EXPERT_DOWN, cfg.squeeze))):
        ws = _ops(s, opcode)
        n_w, grain, cap = len(ws), ws[0].args[2], ws[0].args[3]
        assert all(o.args[:4] == (k, n_w, grain, cap) and o.tensors[7].name == "L0.work" for o in ws)
        for hit in (1, 2, cfg.local_experts):  # however many experts have tokens, one item per worker at most
            meta = torch.tensor([[1] * hit + [0] * (cfg.local_experts - hit), [0] * cfg.local_experts], dtype=torch.int32)
            items = list_items(meta, n_out, n_w, grain, cap)
            assert len(items) <= n_w or len(items) == hit * -(-n_out // cap)
            for e in range(hit):
                _cover([(c.start, c.stop - c.start) for x, c in items if x == e], n_out)
    # TOPK: one op (mode 0), or picks over token ranges (mode 1) that cover the tokens once, then the table (mode 2)
    table = [o for o in _ops(s, Op.TOPK) if o.args[2] != 1]
    assert len(table) == 1 and table[0].tensors[3].name == "L0.work"
    picks = [tuple(o.args[3:5]) for o in _ops(s, Op.TOPK) if o.args[2] == 1]
    assert len(picks) == (-(-T // tl.topk_tokens) if tl.topk_late and T >= tl.topk_span else 0)
    if picks:
        _cover(picks, T)
    chunk = tl.chunk_of(cfg, kind, 3, 5, 100)
    assert chunk == 23  # few ops: the shortest
    nch = n_chunks(cfg, kind, 5, 100, chunk)
    chunks = sorted(tuple(o.args[:3]) for o in _ops(s, Op.ATTN_CHUNK))
    assert chunks == [(c, h, j) for c in range(3) for h in range(cfg.heads_kv) for j in range(nch)]
    window = cfg.window if kind == "sliding" else 0
    assert all(o.args[3] == chunk and o.args[4] == window and i2f(o.args[5]) == 1.0 for o in _ops(s, Op.ATTN_CHUNK))
    qk = _ops(s, Op.QK_ROPE_KV)  # one new token each (Tiles.qk_tokens): every token of every conversation once
    assert [o.args[1] for o in qk] == [int(kind == "sliding")] * T
    assert [(o.args[0], o.args[4], o.args[5]) for o in qk] == [(c, j, 1) for c in range(3) for j in range(T // 3)]
    assert all(o.args[:2] == (0, cfg.local_experts) for o in _ops(s, Op.TOPK))


def _waits_on(s, ins) -> set[str]:  # type: ignore[no-untyped-def]
    """Labels of the ops an instruction waits for."""
    k = s.ops.index(ins)
    return {s.ops[j].label for j in s.deps[k]}


def test_dependencies_are_fine_grained() -> None:
    lp, tl = _small("sliding")
    s = lp.stream
    qkv_cols = (SMALL.heads_q + 2 * SMALL.heads_kv) * 64
    gemm_qkvg = [o for o in _ops(s, Op.GEMM) if o.tensors[0].name == "L0.qkvg"]
    qkv_tiles = {o.label for o in gemm_qkvg if o.args[0] < qkv_cols}
    g_tiles = {o.label for o in gemm_qkvg if o.args[0] >= qkv_cols}
    assert all(o.args[0] + o.args[1] <= qkv_cols for o in gemm_qkvg if o.label in qkv_tiles)
    for o in _ops(s, Op.QK_ROPE_KV):
        assert _waits_on(s, o) == qkv_tiles
    for o in _ops(s, Op.ATTN_CHUNK):
        assert _waits_on(s, o) == {q.label for q in _ops(s, Op.QK_ROPE_KV) if q.args[0] == o.args[0]}  # its conversation's tokens
    for c, o in enumerate(_ops(s, Op.ATTN_MERGE)):
        chunks = {x.label for x in _ops(s, Op.ATTN_CHUNK) if x.args[0] == o.args[0] // 5}
        assert _waits_on(s, o) == chunks | g_tiles
    up = _ops(s, Op.EXPERT_UP)
    squeeze = {o.label for o in _ops(s, Op.GEMM) if o.tensors[0].name == "L0.x"}
    for o in up:
        assert _waits_on(s, o) == squeeze | {"L0.topk"}
    for o in _ops(s, Op.EXPERT_DOWN):
        assert _waits_on(s, o) == {x.label for x in up}
    # nothing waits on the router's input before the residual that writes it
    res1 = {o.label for o in _ops(s, Op.RESIDUAL) if o.tensors[1].name == "L0.a"}
    for o in _ops(s, Op.GEMM):
        if o.tensors[1].name in ("L0.h2", "L0.h2_bf16"):
            assert _waits_on(s, o) == res1


def test_residuals_cut_over_columns_take_the_gemm_statistics() -> None:
    """Each RESIDUAL row block is cut into Tiles.residual_slices column ranges
    (whole rows when the cuts would pass residual_max_ops) that read the sums
    Wo's or Wex's column tiles leave, one slot each; residual_slices 1 keeps
    whole rows."""
    d = SMALL.d
    for tl, rows, want in ((Tiles(rows=1), 3, 8), (Tiles(rows=1, residual_slices=2, residual_max_ops=6), 3, 2),
                           (Tiles(rows=1, residual_max_ops=23), 3, 1), (Tiles(rows=3, residual_slices=1), 1, 1)):
        s = lower_layer(SMALL, "sliding", 3, 1, 100, tiles=tl).stream
        for res, gemm_out in (("residual1", "L0.a"), ("residual2", "L0.f")):
            ops = [o for o in _ops(s, Op.RESIDUAL) if res in o.label]
            assert len(ops) == rows * want
            tiles = [o for o in _ops(s, Op.GEMM) if o.tensors[0].name == gemm_out]
            if want == 1:
                assert all(len(o.tensors) <= 7 or o.tensors[7] is None for o in ops) and all(o.args[2:4] == (0, 0) for o in ops)
                assert all(len(o.tensors) == 3 for o in tiles)
                continue
            stats = ops[0].tensors[7]
            assert stats.shape == (3, len(tiles), 4) and all(o.tensors[7] is stats for o in ops)
            assert sorted(o.args[4] for o in tiles) == list(range(len(tiles))) and all(o.tensors[3] is stats for o in tiles)
            for r in range(rows):
                _cover([(o.args[2], o.args[3]) for o in ops if o.args[0] == r], d)
            assert all(o.args[2] % 4 == 0 and o.args[3] % 4 == 0 for o in ops)


def test_weights_and_tensors_are_named_after_layer_weights() -> None:
    lp, _ = _small("full")
    specs = {t.name: t for t in lp.stream.tensors}
    for name, (shape, dt) in layer_shapes(SMALL).items():
        spec = specs["L0." + name]
        assert spec.shape == shape and dt in TORCH_DTYPES[spec.dtype] and spec.role == "weight"
    assert specs["s"].shape == (15, SMALL.d) and specs["convs"].shape == (3, 4)
    assert specs["L0.k_cache"].shape == (3, 100, SMALL.heads_kv, 64) and specs["L0.k_cache"].role == "state"
    assert all(n in ("s", "convs") or n.startswith("L0.") for n in specs)


def test_attention_chunks_per_layer_kind() -> None:
    """A sliding layer's window goes in shorter chunks than a full layer's
    cache (Tiles.sliding_chunk), doubled while its ops pass Tiles.sliding_ops."""
    tl = Tiles(chunk=64, sliding_chunk=16, sliding_ops=40)
    # SMALL: window 64, 2 kv heads; (conversations, chunk): 1 x 2 x 4 = 8 ops; 8 x 2 x 4 = 64 > 40 -> 32: 32 ops
    for kind, convs, want in (("full", 1, 64), ("sliding", 1, 16), ("sliding", 8, 32), ("sliding", 40, 64)):
        assert tl.chunk_of(SMALL, kind, convs, 1, 200) == want
        s = lower_layer(SMALL, kind, convs, 1, 200, tiles=tl).stream
        assert {o.args[3] for o in _ops(s, Op.ATTN_CHUNK)} == {want}
        assert len(_ops(s, Op.ATTN_CHUNK)) == convs * SMALL.heads_kv * n_chunks(SMALL, kind, 1, 200, want)
    # the shard at one token (2,048-key window, 2 kv heads, at most 512 ops): 1 and 16 conversations 128 keys, 32: 256
    assert [Tiles().chunk_of(SHARD, "sliding", c, 1, 2048) for c in (1, 16, 32)] == [128, 128, 256]
    assert [Tiles().chunk_of(SHARD, "sliding", c, 8, 2048) for c in (1, 16, 32)] == [128, 256, 512]  # 2,055 keys
    # a full layer's chunk doubles past Tiles.full_ops (2,048): 16 conversations x 2 kv heads x 81 chunks of 1,024
    assert [Tiles().chunk_of(SHARD, "full", c, 8, 81_928) for c in (1, 16, 32)] == [1024, 2048, 4096]
    assert Tiles(chunk=64, full_ops=5).chunk_of(SMALL, "full", 1, 1, 200) == 128  # 2 kv heads x 2 chunks of 128 <= 5
    assert Tiles(chunk=64, full_ops=1).chunk_of(SMALL, "full", 3, 1, 200) == 256  # one chunk: no further


@pytest.mark.parametrize("kind", ["full", "sliding"])
def test_fused_qk_puts_qk_norm_and_rope_into_the_chunks(kind: str) -> None:
    """Up to Tiles.fuse_qk tokens a step there is no QK_ROPE_KV and no q
    buffer: each ATTN_CHUNK takes qkvg, w_qn and w_kn, rope = sliding, and
    waits only for the q|k|v columns."""
    base = Tiles(gemm_fill=0, gemm_bytes=8192, rows=4, chunk=23, sliding_chunk=23)
    for fuse, fused in ((15, True), (14, False)):  # 3 conversations x 5 tokens
        s = lower_layer(SMALL, kind, 3, 5, 100, tiles=dataclasses.replace(base, fuse_qk=fuse)).stream
        assert (not _ops(s, Op.QK_ROPE_KV)) == fused and ("L0.q" not in {t.name for t in s.tensors}) == fused
        chunks = _ops(s, Op.ATTN_CHUNK)
        if fused:
            assert all([t.name for t in o.tensors] == ["L0.qkvg", "L0.k_cache", "L0.v_cache", "convs", "L0.part_o", "L0.part_ml", "L0.w_qn", "L0.w_kn"]
                       and o.args[7] == (kind == "sliding") for o in chunks)
            qkv = {o.signal for o in _ops(s, Op.GEMM) if o.tensors[0].name == "L0.qkvg" and o.args[0] == 0}
            assert all({w[0] for w in o.waits} == qkv for o in chunks)


def test_gemm_spans_cut_many_tokens_into_64_row_tiles() -> None:
    assert _span_rows(1280, 4, 264) == 64 and _span_rows(8192, 4, 264) == 128  # Wqkvg's q|k|v, Wo at 256 tokens
    assert _span_rows(4096, 4, 264 - 128) == 128 and _span_rows(1280, 2, 264) == 64  # Wsq beside the router; 128 tokens
    assert _span_rows(40, 4, 1) == 40  # never more rows than there are
    lp = lower_layer(SHARD, "sliding", 16, 8, 4096)
    spans = {tuple(o.args[2:4]) for o in _ops(lp.stream, Op.GEMM) if o.tensors[2].dtype == DType.BF16}  # 128 tokens
    assert spans == {(0, 64), (64, 64)}
    def router(lp: LayerProgram) -> set[tuple[int, ...]]:
        """(rows, t0, tokens, K parts) of the router's instructions."""
        return {tuple(o.args[1:4]) + (o.args[5],) for o in _ops(lp.stream, Op.GEMM) if o.tensors[2].dtype == DType.F32}

    # from Tiles.router_span (32) tokens: 32 rows x spans of 64 tokens, cut into
    # the K parts that keep it within router_ops (128): 8 parts of 16 tiles at
    # 128 tokens, 4 of 32 at 256, 16 of 8 at 32 tokens
    assert router(lp) == {(32, t0, 64, 8) for t0 in (0, 64)}
    assert router(lower_layer(SHARD, "sliding", 32, 8, 4096)) == {(32, t0, 64, 4) for t0 in (0, 64, 128, 192)}
    assert router(lower_layer(SHARD, "sliding", 32, 8, 4096, tiles=Tiles(router_span=0))) == {(2, 0, 0, 0)}
    assert router(lower_layer(SHARD, "sliding", 32, 1, 4096)) == {(32, 0, 32, 16)}
    topk = {T: [o.args[2:5] for o in _ops(lower_layer(SHARD, "sliding", C, n, 4096).stream, Op.TOPK)] for T, (C, n) in ((32, (32, 1)), (64, (8, 8)))}
    assert topk == {32: [(0, 0, 0)], 64: [(1, t0, 8) for t0 in range(0, 64, 8)] + [(2, 0, 0)]}  # TOPK split from Tiles.topk_span (64)
    # Tiles.topk_late (the default): topk_tokens a pick however few groups are left (264 - 128 router
    # - 128 squeeze tiles - the table: 7), those past the first 6 ranked behind the squeeze's tiles
    late = lower_layer(SHARD, "full", 32, 8, 4096)
    picks = [k for k, o in enumerate(late.stream.ops) if o.opcode == Op.TOPK and o.args[2] == 1]
    squeeze = [k for k, o in enumerate(late.stream.ops) if o.label.startswith("L0.Wsq")]
    assert len(squeeze) == 128 and len(picks) == 32 and {late.stream.ops[k].args[4] for k in picks} == {8}
    assert max(picks[:6]) < min(squeeze) and min(picks[6:]) > max(squeeze)
    early = lower_layer(SHARD, "full", 32, 8, 4096, tiles=Tiles(topk_late=0, topk_tokens=16))
    assert min(k for k, o in enumerate(early.stream.ops) if o.opcode == Op.TOPK) < min(k for k, o in enumerate(early.stream.ops) if o.label.startswith("L0.Wsq"))
    one = lower_layer(SHARD, "sliding", 16, 1, 4096)  # 16 tokens: below the span, all tokens a tile, no parts
    assert {tuple(o.args[2:4]) for o in _ops(one.stream, Op.GEMM)} == {(0, 0)}
    assert router(one) == {(2, 0, 0, 0)}


def test_gemm_tail_cuts_the_last_partial_wave() -> None:
    tiles = [(16 * i, 16) for i in range(10)]
    assert _split_tail(tiles, 4, 2) == tiles[:8] + [(128, 8), (136, 8), (144, 8), (152, 8)]
    assert _split_tail(tiles, 5, 2) == tiles and _split_tail(tiles, 12, 2) == tiles  # no partial wave
    assert _split_tail([(0, 5)] * 3, 2, 2) == [(0, 5)] * 2 + [(0, 3), (3, 2)]  # an odd tile: the first part the larger
    assert _split_tail(tiles, 4, 1) == tiles
    # the shard at one token: the squeeze's 256 tiles of 16 rows beside the router's 128 tiles;
    # the 136 groups the router leaves take the first wave, the other 120 tiles go in halves
    lp = lower_layer(SHARD, "sliding", 1, 1, 4096, tiles=Tiles(gemm_tail=2))
    rows = [o.args[1] for o in _ops(lp.stream, Op.GEMM) if o.tensors[0].name == "L0.x"]
    assert rows == [16] * 136 + [8] * 240
    base = lower_layer(SHARD, "sliding", 1, 1, 4096)
    others = lambda l: Tally(o.tensors[0].name for o in _ops(l.stream, Op.GEMM) if o.tensors[0].name != "L0.x")  # noqa: E731
    assert others(lp) == others(base)  # Wqkvg, Wo, Wex and the router unchanged
    with pytest.raises(ProgramError, match="gemm_tail"):
        Tiles(gemm_tail=0)
    for name in ("qk_tokens", "attn_tail"):  # 0 is a setting (all tokens / no tail), below it an error
        with pytest.raises(ProgramError, match=name):
            Tiles(**{name: -1})


def test_heavy_experts_halve_their_items_and_leave_the_numbers_alone() -> None:
    """Tiles.expert_heavy_up / _down reach each list's a6; on the CPU backend
    the items of experts of more tokens are half the cap (more of them), and
    the layer's residual stream is the same as without."""
    kw = dict(gemm_fill=0, gemm_bytes=8192, rows=4, chunk=23, sliding_chunk=23, expert_cap_tokens=0,
              expert_cap_up=64, expert_cap_down=64)
    w = make_layer_weights(SMALL, 0, 5)
    out, items = [], []
    for heavy in (0, 2):
        state = make_state(SMALL, "sliding", 3, 5, 40, seed=1)
        lp = lower_layer(SMALL, "sliding", 3, 5, state.slots, tiles=Tiles(expert_heavy_up=heavy, expert_heavy_down=heavy and heavy + 1, **kw))
        assert {o.args[6] for o in _ops(lp.stream, Op.EXPERT_UP)} == {heavy}
        assert {o.args[6] for o in _ops(lp.stream, Op.EXPERT_DOWN)} == {heavy and heavy + 1}
        bufs = bind_layer(lp, w, state, make_inputs(SMALL, state, seed=2, weights_seed=5))
        run_stream(lp.stream, bufs)
        meta = bufs["L0.route_meta"]
        assert int(meta[0].max()) > 3  # some expert is heavy at either threshold
        items.append([len(list_items(meta, n_out, 1, 16, 64, o.args[6])) for o, n_out in
                      ((_ops(lp.stream, Op.EXPERT_UP)[0], SMALL.expert_inter), (_ops(lp.stream, Op.EXPERT_DOWN)[0], SMALL.squeeze))])
        out.append(bufs["s"].clone())
    assert items[1][0] > items[0][0] and items[1][1] > items[0][1]
    assert torch.equal(out[0], out[1])
    with pytest.raises(ProgramError, match="expert_heavy_up"):
        Tiles(expert_heavy_up=-1)


def test_gemm_tail_leaves_the_layer_s_numbers_alone() -> None:
    """The same squeeze and residual stream on the CPU backend with the tail cut as without."""
    kw = dict(gemm_fill=12, gemm_min_bytes=1024, gemm_max_bytes=4096, rows=4, chunk=23, sliding_chunk=23)
    w = make_layer_weights(SMALL, 0, 5)
    out = []
    for tail in (1, 2):
        state = make_state(SMALL, "sliding", 2, 1, 40, seed=1)
        lp = lower_layer(SMALL, "sliding", 2, 1, state.slots, tiles=Tiles(gemm_tail=tail, **kw))
        s = make_inputs(SMALL, state, seed=2, weights_seed=5)
        bufs = bind_layer(lp, w, state, s)
        run_stream(lp.stream, bufs)
        out.append((bufs["L0.x"].clone(), bufs["s"].clone()))
    assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])


def test_gemm_fill_sizes_tiles_to_one_wave() -> None:
    assert _fill_rows(8192, 2048, 264, 65536, 524288) == 32  # Wo: 256 tiles of 64 KB
    assert _fill_rows(4096, 16384, 264 - 128, 65536, 524288) == 32  # Wsq beside the router: 128 of 512 KB
    assert _fill_rows(8192, 2048, 1000, 65536, 524288) == 32  # never below gemm_min_bytes
    assert _fill_rows(25256, 16384, 8, 65536, 524288) == 32  # nor above gemm_max_bytes
    assert _fill_rows(5, 100, 264, 64, 1 << 20) == 1 and _fill_rows(5, 100, 1, 64, 1 << 20) == 5  # one tile of all 5 rows
    small = Tiles(gemm_fill=12, gemm_min_bytes=1024, gemm_max_bytes=16384)
    lp = lower_layer(SMALL, "full", 1, 1, 64, tiles=small)
    per_out = Tally(o.tensors[0].name for o in _ops(lp.stream, Op.GEMM))
    # Wsq (128 rows of 512 B) beside the router's one tile: 16 rows, 8 tiles <= 11;
    # Wex (256 rows of 256 B): 32 rows, 8 tiles; Wo (256 rows of 2 KB) and
    # q|k|v|g (2304 rows of 512 B) are held to 16 KB tiles: 32 and 72 of them
    assert per_out == {"L0.qkvg": 72, "L0.a": 32, "L0.scores": 1, "L0.x": 8, "L0.f": 8}
    with pytest.raises(ProgramError, match="gemm_fill"):
        Tiles(gemm_fill=-1)
    with pytest.raises(ProgramError, match="router_span"):
        Tiles(router_span=-1)
    with pytest.raises(ProgramError, match="topk_span"):
        Tiles(topk_span=-1)
    with pytest.raises(ProgramError, match="exceeds gemm_max_bytes"):
        Tiles(gemm_min_bytes=1 << 20, gemm_max_bytes=1 << 19)


def test_expert_items_are_capped_only_from_expert_cap_tokens() -> None:
    """Below Tiles.expert_cap_tokens tokens a step the lists' items are sized
    for one round of the workers whatever the experts hit; from it on they are
    at most EXPERT_CAP rows (four rounds with all 32 hit; with 64-row up items,
    two or more once 5 are hit)."""
    tl = Tiles(expert_cap_tokens=9)
    for (C, n), capped in (((1, 8), False), ((16, 1), True), ((1, 1), False), ((32, 1), True)):
        s = lower_layer(SHARD, "sliding", C, n, 4096, tiles=tl).stream
        for opcode, n_out in ((Op.EXPERT_UP, SHARD.expert_inter), (Op.EXPERT_DOWN, SHARD.squeeze)):
            ws = _ops(s, opcode)
            n_w, grain, cap = len(ws), ws[0].args[2], ws[0].args[3]
            assert (cap == EXPERT_CAP[opcode]) == capped
            rounds = []
            for hit in range(1, SHARD.local_experts + 1):
                meta = torch.tensor([[1] * hit + [0] * (SHARD.local_experts - hit), [0] * SHARD.local_experts], dtype=torch.int32)
                items = list_items(meta, n_out, n_w, grain, cap)
                rounds.append(-(-len(items) // n_w))
                for e in range(hit):
                    _cover([(c.start, c.stop - c.start) for x, c in items if x == e], n_out)
            most, five = (4, 1) if capped else (1, 1)
            assert max(rounds) == most and rounds[4] == five
            if capped and opcode == Op.EXPERT_UP:
                items = list_items(torch.tensor([[1] * 5 + [0] * 27, [0] * 32], dtype=torch.int32), n_out, n_w, grain, 64)
                assert -(-len(items) // n_w) == 2
    for opcode, n_out in ((Op.EXPERT_UP, SHARD.expert_inter), (Op.EXPERT_DOWN, SHARD.squeeze)):
        default = {(C, n): _ops(lower_layer(SHARD, "sliding", C, n, 4096).stream, opcode)[0].args[3] for C, n in ((16, 1), (32, 1))}
        assert default == {(16, 1): n_out, (32, 1): EXPERT_CAP[opcode]}  # Tiles(): uncapped up to 16 tokens
    with pytest.raises(ProgramError, match="expert_cap_tokens"):
        Tiles(expert_cap_tokens=-1)
    with pytest.raises(ProgramError, match="expert_cap_up"):
        Tiles(expert_cap_up=0)
    with pytest.raises(ProgramError, match="expert_cap_down must be a multiple of 16"):
        Tiles(expert_cap_down=24)


def test_bad_shapes_are_rejected() -> None:
    with pytest.raises(ProgramError, match="kind"):
        lower_layer(SMALL, "local", 1, 1, 64)
    with pytest.raises(ProgramError, match="conversations"):
        lower_layer(SMALL, "full", 0, 1, 64)
    with pytest.raises(ProgramError, match="cache_slots 4 cannot hold"):
        lower_layer(SMALL, "full", 1, 8, 4)
    with pytest.raises(ProgramError, match="Tiles.chunk"):
        Tiles(chunk=0)
    with pytest.raises(ProgramError, match="Tiles.sliding_chunk"):
        Tiles(sliding_chunk=-1)
    p = Program("x")
    s = p.tensor("s", (4, SMALL.d), DType.F32)
    convs = p.tensor("convs", (2, 4), DType.I32)
    with pytest.raises(ProgramError, match="the layer needs \\(6, 256\\)"):
        emit_layer(p, SMALL, "full", 2, 3, 64, prefix="A.", s=s, convs=convs)
    h = p.tensor("h", (4, SMALL.d), DType.BF16)
    with pytest.raises(ProgramError, match="`after`"):
        emit_layer(p, SMALL, "full", 2, 2, 64, prefix="A.", s=s, convs=convs, h=h)


# ---- binding and running ----------------------------------------------------------------
@pytest.fixture(scope="module")
def small_weights():  # type: ignore[no-untyped-def]
    return [make_layer_weights(SMALL, layer, 21) for layer in (0, 1)]


def test_bind_poisons_scratch_and_binds_state_in_place(small_weights) -> None:  # type: ignore[no-untyped-def]
    state = make_state(SMALL, "full", 2, 3, 10, seed=1)
    lp = lower_layer(SMALL, "full", 2, 3, state.slots)
    s = make_inputs(SMALL, state, seed=2, weights_seed=21)
    b = bind_layer(lp, small_weights[1], state, s)
    assert set(b) == {t.name for t in lp.stream.tensors}
    assert b["L0.k_cache"].data_ptr() == state.k_cache.data_ptr()
    assert b["s"].data_ptr() != s.data_ptr() and torch.equal(b["s"], s)
    assert b["L0.qkvg"].isnan().all() and b["L0.part_ml"].isnan().all()
    assert (b["L0.route"] == POISON_INT).all() and (b["L0.route_meta"] == POISON_INT).all()
    assert b["L0.Wqkvg"].data_ptr() == small_weights[1].Wqkvg.data_ptr()
    w = make_layer_weights(SMALL, 1, 21, k_scale=0.5)
    with pytest.raises(ProgramError, match="k_scale = 0.5 but the program was built with 1.0"):
        bind_layer(lp, w, state, s)


@pytest.mark.parametrize("kind", ["full", "sliding"])
def test_every_read_element_is_written(kind: str, small_weights) -> None:  # type: ignore[no-untyped-def]
    state = make_state(SMALL, kind, 3, 4, 70, seed=4)
    lp, _ = _small(kind, 3, 4, state.slots)
    b = bind_layer(lp, small_weights[kind == "full"], state, make_inputs(SMALL, state, seed=5, weights_seed=21))
    run_stream(lp.stream, b, order="random", rng=random.Random(1))
    for name in ("h", "qkvg", "q", "part_o", "part_ml", "o", "a", "h2", "h2_bf16", "scores", "x", "fsq", "f"):
        t = b["L0." + name]
        assert not t.isnan().any(), name
    used = int(b["L0.route_meta"][0].sum())
    assert not b["L0.hbuf"][:used].isnan().any() and not b["L0.y"][:used].isnan().any()
    assert b["L0.hbuf"][used:].isnan().all()  # slots nobody was routed to stay poisoned
    assert (b["L0.route"][2:] != POISON_INT).all() and not b["s"].isnan().any()


def test_a_missing_tile_shows_as_nan(small_weights, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    from gpuvm.cpu import ops

    state = make_state(SMALL, "full", 2, 2, 20, seed=4)
    lp, _ = _small("full", 2, 2, state.slots)
    b = bind_layer(lp, small_weights[1], state, make_inputs(SMALL, state, seed=5, weights_seed=21))
    real = ops.OPS[Op.GEMM]
    monkeypatch.setitem(ops.OPS, Op.GEMM, lambda ts, a: None if ts[0].shape[1] == SMALL.d and a[0] == 0 else real(ts, a))
    with pytest.raises(Exception, match="NaN"):  # the router's scores, then TOPK, see the unwritten rows
        run_stream(lp.stream, b)


def test_two_chained_layers_equal_two_single_layers(small_weights) -> None:  # type: ignore[no-untyped-def]
    """Layer 0 (sliding) fuses layer 1's input norm into its last residual;
    layer 1 (full) takes that h and waits on layer 0's done counter."""
    C, n, ctx = 2, 3, 9
    st = {k: make_state(SMALL, k, C, n, ctx, seed=6) for k in ("sliding", "full")}
    s0 = make_inputs(SMALL, st["sliding"], seed=7, weights_seed=21)
    tiles = Tiles(gemm_fill=0, gemm_bytes=8192, rows=4, chunk=16, sliding_chunk=16)

    p = Program("two layers")
    s = p.tensor("s", (C * n, SMALL.d), DType.F32)
    convs = p.tensor("convs", (C, 4), DType.I32, "state")
    w1_attn = p.tensor("L1.w_attn", (SMALL.d,), DType.F32, "weight")
    l0 = emit_layer(p, SMALL, "sliding", C, n, st["sliding"].slots, prefix="L0.", s=s, convs=convs, next_norm=w1_attn, tiles=tiles)
    l1 = emit_layer(p, SMALL, "full", C, n, st["full"].slots, prefix="L1.", s=s, convs=convs, after=l0.done, h=l0["next_h"], tiles=tiles)
    assert "L1.h" not in {t.name for t in p.tensors} and not any(o.opcode == Op.RMSNORM and o.label.startswith("L1.") for o in p.instrs)
    stream = p.build()
    two_st = {k: v.clone() for k, v in st.items()}
    bufs = {"s": s0.clone(), "convs": st["sliding"].convs.clone(), "L1.w_attn": small_weights[1].w_attn}
    for prefix, w, state in (("L0.", small_weights[0], two_st["sliding"]), ("L1.", small_weights[1], two_st["full"])):
        for name in layer_shapes(SMALL):
            if prefix + name in {t.name for t in stream.tensors}:
                bufs[prefix + name] = getattr(w, name)
        bufs[prefix + "k_cache"], bufs[prefix + "v_cache"] = state.k_cache, state.v_cache
    for t in stream.tensors:
        bufs.setdefault(t.name, torch.full(t.shape, -7, dtype=torch.int32) if t.dtype == DType.I32 else torch.full(t.shape, float("nan")).to(TORCH_DTYPES[t.dtype][0]))
    run_stream(stream, bufs, order="random", rng=random.Random(3))

    s_seq = s0
    for kind, w in (("sliding", small_weights[0]), ("full", small_weights[1])):
        lp = lower_layer(SMALL, kind, C, n, st[kind].slots, tiles=tiles)
        b = bind_layer(lp, w, st[kind], s_seq)
        run_stream(lp.stream, b)
        s_seq = b["s"]
    torch.testing.assert_close(bufs["s"], s_seq, rtol=0, atol=0)
    for kind in ("sliding", "full"):
        assert torch.equal(two_st[kind].k_cache.view(torch.uint8), st[kind].k_cache.view(torch.uint8))
    assert l1.done.per_step == len(_ops(stream, Op.RESIDUAL)) // 4
    assert all(r["wait_counter"][0] != NONE for r in stream.records[[k for k, o in enumerate(stream.ops) if o.label.startswith("L1.Wqkvg")]])


def _layer_out(weights, kind: str, state, tl: Tiles, input_seed: int, rng_seed: int) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """The residual stream after one small layer of `state` lowered with tl, run
    on the CPU backend in a random order of ready ops."""
    st = state.clone()
    lp = lower_layer(SMALL, kind, st.conversations, st.tokens_each, st.slots, tiles=tl)
    b = bind_layer(lp, weights, st, make_inputs(SMALL, st, seed=input_seed, weights_seed=21))
    run_stream(lp.stream, b, order="random", rng=random.Random(rng_seed))
    return b["s"].clone()


def test_fixed_expert_workers_compute_what_claimed_ones_do(small_weights) -> None:  # type: ignore[no-untyped-def]
    """Tiles.expert_fixed: the expert lists' workers numbered 1..W in a4 (a
    fixed round robin, the static schedule the claims are measured against);
    at small dims the layer computes what the claimed lists do, bit for bit."""
    lp = lower_layer(SHARD, "sliding", 32, 8, 4096, tiles=Tiles(expert_fixed=1))
    for op in (Op.EXPERT_UP, Op.EXPERT_DOWN):
        assert sorted(o.args[4] for o in lp.stream.ops if o.opcode == op) == list(range(1, 265))
    state = make_state(SMALL, "sliding", 3, 2, 70, seed=4)
    outs = [_layer_out(small_weights[False], "sliding", state, tl, 5, 3) for tl in (Tiles(), Tiles(expert_fixed=1))]
    assert torch.equal(outs[0], outs[1])
    with pytest.raises(ProgramError, match="Tiles.expert_fixed must be 0 or 1"):
        Tiles(expert_fixed=2)
    with pytest.raises(ProgramError, match="Tiles.topk_late must be 0 or 1"):
        Tiles(topk_late=2)


def test_early_down_list_computes_what_the_waiting_one_does(small_weights) -> None:  # type: ignore[no-untyped-def]
    """Tiles.down_early: the down list waits for 1 signal of the up list's
    counter (its items all taken) and each item for its expert's up rows
    (a5 = 1); its ops still depend on every up worker (order, static lists),
    and with fixed up workers it waits for the whole list. At small dims the
    layer computes what the waiting list does, bit for bit."""
    lp = lower_layer(SHARD, "sliding", 32, 8, 4096, tiles=Tiles(down_early=1))
    ups = [k for k, o in enumerate(lp.stream.ops) if o.opcode == Op.EXPERT_UP]
    downs = [k for k, o in enumerate(lp.stream.ops) if o.opcode == Op.EXPERT_DOWN]
    assert {(o.waits[0][1], o.args[5]) for o in (lp.stream.ops[k] for k in downs)} == {(1, 1)}
    assert all(set(ups) <= set(lp.stream.deps[k]) for k in downs) and max(ups) < min(downs)
    assert lp.stream.ops[downs[0]].waits[0][0].name == "L0.hbuf"
    fixed = lower_layer(SHARD, "sliding", 32, 8, 4096, tiles=Tiles(down_early=1, expert_fixed=1))
    assert {(o.waits[0][1], o.args[5]) for o in fixed.stream.ops if o.opcode == Op.EXPERT_DOWN} == {(None, 0)}
    state = make_state(SMALL, "sliding", 3, 2, 70, seed=4)
    outs = [_layer_out(small_weights[False], "sliding", state, Tiles(down_early=e), 5, 3) for e in (0, 1)]
    assert torch.equal(outs[0], outs[1])
    with pytest.raises(ProgramError, match="Tiles.down_early must be 0 or 1"):
        Tiles(down_early=2)


def test_merges_cut_over_tokens_compute_what_whole_ones_do(small_weights) -> None:  # type: ignore[no-untyped-def]
    """Tiles.merge_tokens: a conversation's merges cut into token ranges (2 of
    its 3 tokens, then 1); at small dims the layer computes what the uncut
    merges do, bit for bit."""
    state = make_state(SMALL, "full", 2, 3, 70, seed=6)
    outs, counts = [], []
    for tl in (Tiles(), Tiles(merge_tokens=2)):
        st = state.clone()
        lp = lower_layer(SMALL, "full", 2, 3, st.slots, tiles=tl)
        counts.append(sorted(o.args[1] for o in lp.stream.ops if o.opcode == Op.ATTN_MERGE))
        b = bind_layer(lp, small_weights[False], st, make_inputs(SMALL, st, seed=7, weights_seed=21))
        run_stream(lp.stream, b, order="random", rng=random.Random(4))
        outs.append(b["s"].clone())
    assert counts[0] == [3] * (2 * SMALL.heads_q) and counts[1] == sorted([2, 1] * (2 * SMALL.heads_q))
    assert torch.equal(outs[0], outs[1])
    with pytest.raises(ProgramError, match="Tiles.merge_tokens must be an int >= 0"):
        Tiles(merge_tokens=-1)


def test_late_picks_compute_what_one_topk_does(small_weights) -> None:  # type: ignore[no-untyped-def]
    """Tiles.topk_late: the 6 tokens' picks 2 a TOPK, ranked behind the
    squeeze's tiles, then the table; at small dims the layer computes what one
    TOPK does, bit for bit, in a random order of ready ops."""
    state = make_state(SMALL, "full", 2, 3, 70, seed=6)
    outs, picks = [], []
    for tl in (Tiles(), Tiles(topk_span=4, topk_tokens=2, topk_late=1)):
        st = state.clone()
        lp = lower_layer(SMALL, "full", 2, 3, st.slots, tiles=tl)
        picks.append(sorted(tuple(o.args[3:5]) for o in lp.stream.ops if o.opcode == Op.TOPK and o.args[2] == 1))
        b = bind_layer(lp, small_weights[False], st, make_inputs(SMALL, st, seed=7, weights_seed=21))
        run_stream(lp.stream, b, order="random", rng=random.Random(4))
        outs.append(b["s"].clone())
    assert picks == [[], [(0, 2), (2, 2), (4, 2)]]
    assert torch.equal(outs[0], outs[1])


def _g_tiles(lp: LayerProgram) -> list:  # type: ignore[type-arg]
    """Wqkvg's g tiles: the GEMM ops that signal the layer's g counter."""
    return [o for o in lp.stream.ops if o.opcode == Op.GEMM and o.signal.name == "L0.g"]


@pytest.mark.parametrize("kind", ["full", "sliding"])
def test_late_g_tiles_wait_for_the_qkv_tiles(kind: str, small_weights) -> None:  # type: ignore[no-untyped-def]
    """Tiles.g_late: up to that many tokens Wqkvg's g tiles wait for the q|k|v
    tiles too; at small dims the layer computes what the other tiling does."""
    lp = lower_layer(SHARD, kind, 1, 8, 4096)
    assert _g_tiles(lp) and all(any(c.name == "L0.qkv" for c, _ in o.waits) for o in _g_tiles(lp))
    assert all(o.label.startswith("L0.Wg[") for o in _g_tiles(lp))  # its own op (gpuvm.device.chain: one launch each)
    lp = lower_layer(SHARD, kind, 2, 8, 4096)  # 16 tokens: beside them
    assert not any(any(c.name == "L0.qkv" for c, _ in o.waits) for o in _g_tiles(lp))
    state = make_state(SMALL, kind, 1, 2, 70, seed=4)
    outs = []
    for tl in (Tiles(), Tiles(g_late=0)):
        st = state.clone()
        lp = lower_layer(SMALL, kind, 1, 2, st.slots, tiles=tl)
        b = bind_layer(lp, small_weights[kind == "full"], st, make_inputs(SMALL, st, seed=5, weights_seed=21))
        run_stream(lp.stream, b, order="random", rng=random.Random(2))
        outs.append(b["s"].clone())
    assert torch.equal(outs[0], outs[1])


def test_late_g_tiles_fill_at_most_g_late_groups() -> None:
    """Tiles.g_late_groups: the late g tiles are cut to fill that many groups
    (a sliding one-token layer's 1,024 g rows: 64 tiles of 16 rows, not the
    128 of 8 that fill the groups its 32 chunks leave); 0 takes those."""
    def g_rows(tl: Tiles) -> list[int]:
        return [o.args[1] for o in _g_tiles(lower_layer(SHARD, "sliding", 1, 1, 4096, tiles=tl))]

    assert g_rows(Tiles()) == [16] * 64
    assert g_rows(Tiles(g_late_groups=0)) == [8] * 128
    with pytest.raises(ProgramError, match="g_late_groups"):
        Tiles(g_late_groups=-1)


def test_lazy_gemm_flags_the_dense_gemm_tiles_only() -> None:
    """Tiles.lazy_gemm sets GVM_FLAG_LAZY on every dense GEMM tile's record and
    on nothing else (1), on the router's and the squeeze's (2, the default; on
    every one up to Tiles.lazy_gemm_tokens tokens a step), or on none (0)."""
    base = lower_layer(SHARD, "sliding", 16, 8, 4096, tiles=Tiles(lazy_gemm=0, lazy_experts=0))
    lazy = lower_layer(SHARD, "sliding", 16, 8, 4096, tiles=Tiles(lazy_gemm=1, lazy_experts=0))
    rb, rl = base.stream.records, lazy.stream.records
    assert len(rb) == len(rl) and not rb["flags"].any()
    gemm = rl["opcode"] == int(Op.GEMM)
    assert gemm.sum() > 0 and (rl["flags"][gemm] == FLAG_LAZY).all() and not rl["flags"][~gemm].any()
    for f in ("opcode", "signal", "arg", "tensor", "wait_counter"):  # otherwise the same program
        assert np.array_equal(rb[f], rl[f])
    # 2: the router's and the squeeze's tiles only
    sq = lower_layer(SHARD, "sliding", 16, 8, 4096, tiles=Tiles(lazy_experts=0))
    flagged = {o.label.split("[")[0] for o, r in zip(sq.stream.ops, sq.stream.records) if r["flags"] == FLAG_LAZY}
    assert flagged == {"L0.Wr", "L0.Wsq"}
    for (C, n), tiles in (((2, 8), Tiles(lazy_experts=0)), ((16, 1), Tiles(lazy_experts=0)), ((16, 1), Tiles(lazy_experts=0, lazy_gemm_tokens=15))):
        lp = lower_layer(SHARD, "sliding", C, n, 4096, tiles=tiles)
        every = all(r["flags"] == FLAG_LAZY for o, r in zip(lp.stream.ops, lp.stream.records) if o.opcode == Op.GEMM)
        assert every == (C * n <= tiles.lazy_gemm_tokens)
    with pytest.raises(ProgramError, match="lazy_gemm"):
        Tiles(lazy_gemm=3)
    with pytest.raises(ProgramError, match="lazy_gemm_tokens"):
        Tiles(lazy_gemm_tokens=-1)


def test_lazy_attn_flags_the_last_attention_chunks() -> None:
    """Tiles.lazy_attn sets GVM_FLAG_LAZY on the layer's last lazy_attn
    ATTN_CHUNK ops in emission order (their last wave) and on no other op."""
    base = lower_layer(SHARD, "full", 16, 8, 81_984, tiles=Tiles(lazy_gemm=0, lazy_experts=0))
    lazy = lower_layer(SHARD, "full", 16, 8, 81_984, tiles=Tiles(lazy_gemm=0, lazy_experts=0, lazy_attn=132))
    chunks = [o.label for o in base.stream.ops if o.label.startswith("L0.attn[")]
    flagged = [o.label for o, r in zip(lazy.stream.ops, lazy.stream.records) if r["flags"] == FLAG_LAZY]
    assert len(chunks) > 264 and sorted(flagged) == sorted(chunks[-132:])  # chunks[-132:]: the last emitted
    every = lower_layer(SHARD, "full", 16, 8, 81_984, tiles=Tiles(lazy_gemm=0, lazy_experts=0, lazy_attn=10**6))
    assert sum(r["flags"] == FLAG_LAZY for r in every.stream.records) == len(chunks)
    with pytest.raises(ProgramError, match="lazy_attn"):
        Tiles(lazy_attn=-1)


def test_lazy_attn_wave_flags_every_chunk_of_a_one_wave_layer() -> None:
    """Tiles.lazy_attn_wave (1, the default) flags every ATTN_CHUNK op of a
    layer whose chunks fit one wave of the groups (expert_workers), and none of
    a layer with more; 0 flags none."""
    def flagged(conversations: int, **kw: int) -> tuple[int, int]:
        lp = lower_layer(SHARD, "full", conversations, 1, 81_984, tiles=Tiles(lazy_gemm=0, lazy_experts=0, **kw))
        chunks = [r["flags"] for o, r in zip(lp.stream.ops, lp.stream.records) if o.label.startswith("L0.attn[")]
        assert sum(r["flags"] == FLAG_LAZY for r in lp.stream.records) == sum(f == FLAG_LAZY for f in chunks)  # chunks only
        return sum(f == FLAG_LAZY for f in chunks), len(chunks)

    lazy, n = flagged(1)
    assert 0 < n <= 264 and lazy == n
    assert flagged(1, lazy_attn_wave=0) == (0, n)
    assert flagged(1, expert_workers=n - 1)[0] == 0  # one group short of a wave
    lazy16, n16 = flagged(16)
    assert n16 > 264 and lazy16 == 0
    with pytest.raises(ProgramError, match="lazy_attn_wave"):
        Tiles(lazy_attn_wave=2)


def test_g_early_orders_the_g_tiles_before_qk_rope_kv() -> None:
    """Tiles.g_early (1, the default): above g_late tokens Wqkvg's g tiles
    (columns from the q|k|v width on) come right after its q|k|v tiles in the
    stream, before the QK_ROPE_KV ops; 0: after them (the depth order alone).
    At one token (the g tiles an op of their own, Wg) nothing moves."""
    qkv_cols = (SHARD.heads_q + 2 * SHARD.heads_kv) * 64

    def places(conversations: int, tokens_each: int, g_early: int) -> tuple[list[int], list[int], list[str]]:
        lp = lower_layer(SHARD, "sliding", conversations, tokens_each, 4096, tiles=Tiles(g_early=g_early))
        labels = [o.label for o in lp.stream.ops]
        g = [k for k, lab in enumerate(labels) if lab.startswith("L0.Wqkvg[") and int(lab[9:].split(":")[0]) >= qkv_cols]
        qk = [k for k, lab in enumerate(labels) if lab.startswith("L0.qk_rope_kv")]
        return g, qk, labels

    g, qk, _ = places(32, 8, 1)
    assert len(g) == 64 and max(g) < min(qk)
    g0, qk0, _ = places(32, 8, 0)
    assert len(g0) == 64 and min(g0) > max(qk0)
    one, _, labels1 = places(1, 1, 1)
    assert one == [] and labels1 == places(1, 1, 0)[2]
    with pytest.raises(ProgramError, match="g_early"):
        Tiles(g_early=2)


def test_gemm_parts_cut_wqkvg_over_k_to_fill_the_groups() -> None:
    """Tiles.gemm_parts (4, the default): Wqkvg's staged tiles (from 64 tokens)
    cut into the most K parts that fit the groups beside its other tiles: at
    128 tokens q|k|v 40 tiles x 4 and g 32 x 2, at 256 tokens q|k|v 80 x 2 and
    g 64 whole; every tile's parts share a ticket; 1: no parts; no other GEMM
    (the squeeze's tiles fill what the router leaves) and nothing below 64 tokens."""
    def parts(conversations: int, tokens_each: int, gemm_parts: int = 4) -> dict[tuple[str, int], int]:
        lp = lower_layer(SHARD, "sliding", conversations, tokens_each, 4096, tiles=Tiles(gemm_parts=gemm_parts))
        out: dict[tuple[str, int], int] = {}
        for o in lp.stream.ops:
            if o.opcode == Op.GEMM and o.args[5] > 1 and not o.label.startswith("L0.Wr["):
                assert o.label.startswith("L0.Wqkvg[") and o.tensors[0].dtype == DType.BF16
                g = "g" if o.args[0] >= (SHARD.heads_q + 2 * SHARD.heads_kv) * 64 else "qkv"
                out[(g, o.args[5])] = out.get((g, o.args[5]), 0) + 1
                assert o.tensors[4].role == "ticket" and 0 <= o.args[7] < o.tensors[4].shape[0]
        return out

    assert parts(16, 8) == {("qkv", 4): 160, ("g", 2): 64}
    assert parts(32, 8) == {("qkv", 2): 160}
    assert parts(16, 8, 1) == {} and parts(32, 1) == {} and parts(1, 8) == {}
    with pytest.raises(ProgramError, match="gemm_parts"):
        Tiles(gemm_parts=3)


def test_bf16_k_parts_only_on_the_staged_path() -> None:
    """A bf16 GEMM in K parts needs 64 tokens an instruction and K / parts a
    multiple of 64 (the device's staged path): refused before launch otherwise."""
    def gemm(tokens: int, t_count: int, k: int, n_parts: int) -> None:
        p = Program("parts")
        out, x = p.tensor("out", (tokens, 16), DType.BF16), p.tensor("x", (tokens, k), DType.BF16)
        w, parts = p.tensor("w", (16, k), DType.BF16, "weight"), p.tensor("parts", (tokens, 16 * n_parts), DType.F32)
        tickets = p.tensor("tickets", (1,), DType.I32, "ticket")
        p.op(Op.GEMM, [out, x, w, parts, tickets], [0, 16, 0, t_count, 0, n_parts, 0, 0])

    gemm(64, 0, 256, 4)
    gemm(130, 66, 256, 2)
    with pytest.raises(ProgramError, match="staged path"):
        gemm(64, 32, 256, 4)
    with pytest.raises(ProgramError, match="staged path"):
        gemm(64, 0, 128, 4)


def test_lazy_experts_flags_the_list_workers_only() -> None:
    """Tiles.lazy_experts (1, the default) sets GVM_FLAG_LAZY on every
    EXPERT_UP and EXPERT_DOWN worker and on no other op; 0 on none."""
    eager = lower_layer(SHARD, "sliding", 16, 8, 4096, tiles=Tiles(lazy_gemm=0, lazy_experts=0))
    lazy = lower_layer(SHARD, "sliding", 16, 8, 4096, tiles=Tiles(lazy_gemm=0))
    re_, rl = eager.stream.records, lazy.stream.records
    assert not re_["flags"].any()
    workers = np.isin(rl["opcode"], [int(Op.EXPERT_UP), int(Op.EXPERT_DOWN)])
    assert workers.sum() == 2 * 264 and (rl["flags"][workers] == FLAG_LAZY).all() and not rl["flags"][~workers].any()
    for f in ("opcode", "signal", "arg", "tensor", "wait_counter"):
        assert np.array_equal(re_[f], rl[f])
    with pytest.raises(ProgramError, match="lazy_experts"):
        Tiles(lazy_experts=2)


def test_a_tiling_parses_from_the_tools_command_line_form() -> None:
    assert Tiles.parse("") == Tiles()
    assert Tiles.parse("qk_tokens=2+topk_late=0") == Tiles(qk_tokens=2, topk_late=0)
    for bad in ("bogus=1", "qk_tokens", "qk_tokens=x", "gemm_parts=3"):
        with pytest.raises(ProgramError):
            Tiles.parse(bad)
