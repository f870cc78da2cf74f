"""tools/expert_bench.py's work-list tables (CPU): the uniform shapes as before,
the skewed one with each expert's tokens distinct."""
import pytest
import torch

from tools.expert_bench import E, MARKS, SKEW256, list_tables, parse_shape, timeline


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


def test_timeline_reads_the_items_marks_over_the_last_expert() -> None:
    """Marks as the probe writes them: cycles at 2 ns a cycle (globaltimer over the span),
    item i's 16 words at 128 i bytes of the last expert's codes; an item without a ring
    (marks 5 and 6 zero) leaves them out; rows of other items (index mismatch) are skipped."""
    codes = torch.zeros(E, 64 * 1024, dtype=torch.uint8)
    assert timeline(codes) is None  # no item wrote its marks (a list with no item)
    words = codes[-1].view(torch.int64).view(-1, 16)
    for i, step in ((0, 100), (3, 300)):
        m = [1000 + k * step for k in range(11)] + [0] * 5
        m[11], m[12], m[13] = 5_000, 5_000 + 2 * (m[10] - m[0]), i
        if i == 3:
            m[5] = m[6] = 0
        words[i] = torch.tensor(m, dtype=torch.int64)
    words[7, 0], words[7, 13] = 5, 2  # a stale row: its index is not its place
    t = timeline(codes)
    assert t["items"] == 2 and len(MARKS) == 10
    assert t["args"] == 400 and t["epilogue"] == 400  # (200 + 600) / 2 ns
    assert t["1st slot"] == 200 and t["ring"] == 200  # only item 0 passes them
    assert t["partials"] == (200 + 1800) / 2  # item 3: from mark 4 to mark 7
