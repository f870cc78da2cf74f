"""tools/expert_bench.py's work-list tables (CPU): the uniform shapes as before,
the skewed one with each expert's tokens distinct."""
import pytest
import torch

from tools.expert_bench import E, SKEW256, list_tables, parse_shape


def test_uniform_shape_tables_match_the_old_construction() -> None:
    meta, route, t = list_tables(parse_shape("32x16"))
    assert t == 64 and meta[0].tolist() == [16] * 32
    assert meta[1].tolist() == [16 * e for e in range(E)]
    assert route[0, :512].tolist() == [s % 64 for s in range(512)]


def test_skewed_shape_gives_each_expert_distinct_tokens() -> None:
    counts = parse_shape("skew256")
    assert counts == SKEW256 and len(counts) == E and sum(counts) == 511
    meta, route, t = list_tables(counts)
    assert t >= max(counts) and 8 * t >= sum(counts)
    for e, n in enumerate(counts):
        first = int(meta[1, e])
        toks = route[0, first : first + n]
        assert len(set(toks.tolist())) == n and int(toks.max()) < t
    assert int(meta[1, -1]) + int(meta[0, -1]) == sum(counts)


@pytest.mark.parametrize("bad", ["0x4", "33x1", "4x0", "skew"])
def test_bad_shapes_are_refused(bad: str) -> None:
    with pytest.raises((SystemExit, ValueError)):
        parse_shape(bad)
