"""Static per-block lists (gpuvm/static.py): a partition of the stream in stream
order, balanced by predicted time, and the packed format the device reads."""
from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuvm.isa import Op
from gpuvm.opspec import ProgramError
from gpuvm.program import Program, Stream
from gpuvm.sim import DeadlockError, Hardware, simulate
from gpuvm.static import pack_static, static_lists, unpack_static
from tests.randprog import random_program, streams


@settings(max_examples=80, deadline=None)
@given(stream=streams(max_ops=60), blocks=st.sampled_from([1, 2, 5, 132]), groups=st.integers(1, 3))
def test_lists_partition_the_stream_in_order(stream: Stream, blocks: int, groups: int) -> None:
    lists = static_lists(stream, blocks, groups)
    assert len(lists) == blocks
    assert sorted(j for lst in lists for j in lst) == list(range(len(stream)))
    for lst in lists:
        assert all(a < b for a, b in zip(lst, lst[1:]))
    packed = pack_static(lists)
    assert packed.dtype == np.int32 and packed.size == blocks + 1 + len(stream)
    off = packed[: blocks + 1]
    assert off[0] == 0 and off[-1] == len(stream)
    for b, lst in enumerate(lists):
        assert packed[blocks + 1 + off[b] : blocks + 1 + off[b + 1]].tolist() == lst
    assert unpack_static(packed, blocks) == lists


def _sleeps(ns: list[int]) -> Stream:
    p = Program("sleeps")
    for t in ns:
        p.op(Op.SLEEP, args=[t])
    return p.build()


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), blocks=st.sampled_from([2, 7, 32]), groups=st.integers(1, 2))
def test_independent_work_is_balanced(seed: int, blocks: int, groups: int) -> None:
    rng = random.Random(seed)
    ns = [rng.choice([1_000, rng.randint(0, 50_000)]) for _ in range(rng.randint(blocks, 8 * blocks))]
    s = _sleeps(ns)
    hw = Hardware(n_blocks=blocks, groups=groups)
    r = simulate(s, hw, "static", lists=static_lists(s, blocks, groups, hw))
    per_op = hw.claim_ns + hw.decode_ns + hw.dispatch_ns + hw.launch_ns + hw.signal_ns
    # list scheduling's bound: the average load plus the longest op
    bound = sum(t + per_op for t in ns) / (blocks * groups) + max(ns) + per_op
    assert r.makespan_ns <= bound


def test_balance_follows_op_costs() -> None:
    """One long op and many short ones: the long op's block gets few others."""
    s = _sleeps([400_000] + [10_000] * 79)
    lists = static_lists(s, 2, 1)
    long_block = next(b for b, lst in enumerate(lists) if 0 in lst)
    assert len(lists[long_block]) < 0.65 * len(lists[1 - long_block])
    r = simulate(s, Hardware(n_blocks=2, groups=1), "static", lists=lists)
    naive = [list(range(0, 80, 2)), list(range(1, 80, 2))]
    worse = simulate(s, Hardware(n_blocks=2, groups=1), "static", lists=naive)
    assert r.makespan_ns < 0.8 * worse.makespan_ns


def test_lists_wait_for_dependencies() -> None:
    """A long op, its short consumer, then independent short ops on two blocks:
    the consumer belongs after the long op, not on the other block, idle."""
    p = Program("fork")
    c = p.counter("long")
    p.op(Op.SLEEP, args=[100_000], signal=c, label="long")
    p.op(Op.SLEEP, args=[10_000], waits=[c], label="consumer")
    for _ in range(10):
        p.op(Op.SLEEP, args=[10_000])
    s = p.build(order="given")
    lists = static_lists(s, 2, 1)
    assert lists[0][:2] == [0, 1]
    r = simulate(s, Hardware(n_blocks=2, groups=1), "static", lists=lists)
    assert r.makespan_ns < 120_000


def test_packing_rejects_bad_lists() -> None:
    with pytest.raises(ProgramError, match="increasing stream order"):
        pack_static([[1, 0], [2]])
    with pytest.raises(ProgramError, match="exactly once"):
        pack_static([[0, 1], [1]])
    with pytest.raises(ProgramError, match="outside"):
        pack_static([[0, 5], [1]])


def test_unpacking_rejects_bad_arrays() -> None:
    good = pack_static([[0, 2], [1]])
    assert unpack_static(good, 2) == [[0, 2], [1]]
    with pytest.raises(ProgramError, match="int32"):
        unpack_static(good.astype(np.int64), 2)
    with pytest.raises(ProgramError, match="offsets"):
        unpack_static(np.array([0, 2, 2, 0, 2, 1], dtype=np.int32), 2)
    with pytest.raises(ProgramError, match="offsets"):
        unpack_static(np.array([1, 2, 3, 0, 2, 1], dtype=np.int32), 2)
    with pytest.raises(ProgramError, match="cannot hold"):
        unpack_static(np.array([0, 0], dtype=np.int32), 2)
    with pytest.raises(ProgramError, match="increasing"):
        unpack_static(np.array([0, 2, 3, 2, 0, 1], dtype=np.int32), 2)


def test_static_lists_run_deadlock_free_where_reversed_ones_hang() -> None:
    s = random_program(random.Random(11), 40, p_signal=1.0).build()
    hw = Hardware(n_blocks=3, groups=1)
    lists = static_lists(s, 3, 1, hw)
    simulate(s, hw, "static", lists=lists)  # finishes
    assert any(s.deps[i] for i in range(len(s)))
    with pytest.raises(DeadlockError):
        simulate(s, Hardware(n_blocks=1, groups=1), "static", lists=[list(range(len(s)))[::-1]])


def test_ties_spread_over_blocks() -> None:
    """Work that could start at once on either block goes to the emptier one,
    so that math does not share one SM's tensor cores while another idles."""
    p = Program("two")
    for _ in range(4):
        p.op(Op.SLEEP, args=[10_000])
    lists = static_lists(p.build(), 4, 2)
    assert [len(lst) for lst in lists] == [1, 1, 1, 1]


def test_the_lists_rule_counts_whole_prefetch_ranges_whatever_the_loaders_bound() -> None:
    """The device's static lists are the ones the H200 measured: the model's
    bound on the loader's prefetch must not move them (gpuvm/static.py)."""
    from gpuvm.muse.cases import get_case
    from gpuvm.muse.config import SHARD
    from gpuvm.muse.lowering import lower_layer
    from gpuvm.muse.state import cache_slots

    case = get_case("full-c1-t1")
    s = lower_layer(SHARD, case.kind, case.conversations, case.tokens_each, cache_slots(SHARD, case.kind, case.tokens_each, case.context)).stream
    assert any(ins.prefetch is not None and ins.prefetch[2] > 8192 for ins in s.ops)
    lists = static_lists(s, 132, 2)
    assert static_lists(s, 132, 2, Hardware(prefetch_max_bytes=0)) == lists
    assert static_lists(s, 132, 2, Hardware(prefetch_max_bytes=1 << 40)) == lists
