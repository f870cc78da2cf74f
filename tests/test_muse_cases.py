"""Benchmark cases (MUSE.md "Benchmark cases") and their floors."""
from __future__ import annotations

import pytest

from gpuvm.muse.cases import (
    CASES,
    DECODE_CASES,
    PREFILL_CASES,
    Case,
    floor_bytes,
    floor_flops,
    floor_seconds,
    get_case,
    small_case,
)
from gpuvm.muse.config import SHARD, SMALL
from gpuvm.muse.state import make_state


def test_decode_cases_match_muse_md() -> None:
    assert len(DECODE_CASES) == 12
    shapes = {(c.conversations, c.tokens_each) for c in DECODE_CASES}
    assert shapes == {(1, 1), (1, 8), (16, 1), (16, 8), (32, 1), (32, 8)}
    assert sorted({c.tokens for c in DECODE_CASES}) == [1, 8, 16, 32, 128, 256]
    assert all(c.context == 81_920 and not c.prefill for c in DECODE_CASES)
    for kind in ("full", "sliding"):
        assert sum(c.kind == kind for c in DECODE_CASES) == 6
    assert get_case("full-c16-t8") == Case("full-c16-t8", "full", 16, 8, 81_920)
    assert get_case("sliding-c32-t8").tokens == 256


def test_prefill_cases_match_muse_md() -> None:
    got = {(c.kind, c.conversations, c.tokens_each, c.context) for c in PREFILL_CASES}
    want = {(k, c, n, ctx) for k in ("full", "sliding") for c, n, ctx in ((1, 753, 81_920), (4, 753, 81_920), (1, 16_384, 0))}
    assert got == want and all(c.prefill for c in PREFILL_CASES)
    assert get_case("prefill-full-c4-t753").tokens == 3_012
    assert len(CASES) == 18


def test_unknown_case_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="full-c1-t1.*sliding-c32-t8"):
        get_case("full-c2-t1")
    with pytest.raises(ValueError):
        Case("bad", "dense", 1, 1, 0)


def test_small_cases_cover_below_and_above_the_window() -> None:
    W = SMALL.window
    small = [small_case(c, SMALL) for c in DECODE_CASES]
    for big, c in zip(DECODE_CASES, small):
        assert (c.kind, c.conversations, c.tokens_each) == (big.kind, big.conversations, big.tokens_each)
        assert c.name == big.name + "@small"
    ctx = [c.context + c.tokens_each for c in small if c.kind == "sliding"]  # last position + 1
    assert any(x <= W for x in ctx) and any(x > 2 * W for x in ctx)
    assert any(c.context < W < c.context + c.tokens_each for c in small)  # a step across the edge
    pre = {c.name: small_case(c, SMALL) for c in PREFILL_CASES}
    first = pre["prefill-sliding-c1-t16384"]
    assert first.context == 0 and first.tokens_each > W  # the window bites inside one step
    for c in small + list(pre.values()):
        make_state(SMALL, c.kind, c.conversations, c.tokens_each, c.context, seed=0)
    with pytest.raises(ValueError):
        small_case(DECODE_CASES[0], SHARD)


def test_floor_bytes_shard() -> None:
    MB = 1e6
    full = floor_bytes(SHARD, get_case("full-c32-t8"), experts_hit=32)
    assert full["dense"] / MB == pytest.approx(197.3, abs=0.1)
    assert full["experts"] / MB == pytest.approx(32 * 28.31, abs=0.1)
    assert full["kv_read"] == 32 * 81_920 * 256
    assert full["kv_write"] == 256 * 256
    assert full["activations"] == 2 * 256 * 8192 * 4
    assert full["total"] == sum(v for k, v in full.items() if k != "total")
    sliding = floor_bytes(SHARD, get_case("sliding-c32-t8"), experts_hit=32)
    assert sliding["kv_read"] == 32 * 2047 * 256  # window less the token itself
    one = floor_bytes(SHARD, get_case("sliding-c1-t1"), experts_hit=3)
    assert one["experts"] == 3 * full["experts"] // 32
    assert floor_seconds(one["total"], 4.42e12) == pytest.approx(one["total"] / 4.42e12)
    # (197.3 + 3 * 28.3) MB at 4.42 TB/s: about 64 us for one token, 3 experts hit
    assert 62e-6 < floor_seconds(one["total"], 4.42e12) < 66e-6
    with pytest.raises(ValueError):
        floor_bytes(SHARD, get_case("full-c1-t1"), experts_hit=33)
    with pytest.raises(ValueError):
        floor_seconds(1, 0)


def test_floor_flops() -> None:
    c = Case("t", "sliding", 2, 3, 10)
    cfg = SMALL
    dense = 2 * 6 * cfg.d * (cfg.qkvg_width + cfg.q_width + cfg.n_experts + 2 * cfg.squeeze)
    attn = 4 * 64 * cfg.heads_q * 2 * (11 + 12 + 13)  # each new token sees context + j + 1 keys
    assert floor_flops(cfg, c, 0) == dense + attn
    assert floor_flops(cfg, c, 5) - floor_flops(cfg, c, 0) == 5 * 2 * 3 * cfg.squeeze * cfg.expert_inter
    far = Case("t", "sliding", 1, 2, 1000)
    assert floor_flops(cfg, far, 0) == floor_flops(cfg, Case("t", "sliding", 1, 2, 5000), 0)  # capped at the window
    assert floor_flops(cfg, Case("t", "full", 1, 2, 1000), 0) > floor_flops(cfg, far, 0)
    with pytest.raises(ValueError):
        floor_flops(cfg, c, 6 * 8 + 1)
