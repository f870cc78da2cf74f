"""The scheduler model (gpuvm/sim): invariants on random programs, and sanity
of its timing against simple closed forms."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuvm.cpu.ops import list_items
from gpuvm.isa import DType, Op, Stamp
from gpuvm.muse.cases import DECODE_CASES, Case, floor_bytes, get_case, small_case
from gpuvm.muse.config import SHARD, SMALL, MuseConfig
from gpuvm.muse.lowering import Tiles, lower_layer
from gpuvm.muse.state import cache_slots
from gpuvm.opspec import ProgramError
from gpuvm.program import Program, Stream
from gpuvm.sim import DeadlockError, Hardware, OpTiming, SimResult, layer_costs, predict_layer, simulate, skewed_expert_tokens
from gpuvm.sim import fitted
from gpuvm.sim.fitted import fitted_hardware
from gpuvm.sim.share import Share
from gpuvm.trace.format import Trace
from tests.randprog import random_program, streams
from tests.test_program import _muse_tensors

CONFIGS = [(1, 1), (1, 3), (2, 1), (3, 2), (8, 2), (132, 2)]
#: every fixed cost zero: many events at the same instant, the hardest case for ties
INSTANT = dict(claim_ns=0.0, decode_ns=0.0, dispatch_ns=0.0, launch_ns=0.0, mem_latency_ns=0.0, signal_ns=0.0, signal_latency_ns=0.0)


def check_invariants(r: SimResult, s: Stream) -> None:
    n = len(s)
    hw = r.hw
    assert sorted(r.finish_order) == list(range(n)), "every instruction finishes exactly once"
    stamps = [r.claim, r.load, r.dispatch, r.ready, r.done, r.signal]
    for t in stamps:
        assert np.all(np.isfinite(t))
    for a, b in zip(stamps, stamps[1:]):
        assert np.all(a <= b + 1e-6), "stamps in lifecycle order"
    assert np.all((0 <= r.block) & (r.block < hw.n_blocks)) and np.all((0 <= r.group) & (r.group < hw.groups))
    pos = {ins.id: k for k, ins in enumerate(s.ops)}
    vis = r.visible
    for i, ins in enumerate(s.ops):
        for k, (c, n_wait) in enumerate(ins.waits):
            sig = np.array([vis[pos[x.id]] for x in c.signallers])
            # the counter reached its target before the op was ready
            assert np.sum(sig <= r.ready[i] + 1e-6) >= ins.wait_count(k), f"#{i} ready before '{c.name}' reached {ins.wait_count(k)}"
            if n_wait is None:
                assert all(vis[j] <= r.ready[i] + 1e-6 for j in s.deps[i] if s.ops[j].signal is c)
        if all(nw is None for _, nw in ins.waits):
            assert all(vis[j] <= r.ready[i] + 1e-6 for j in s.deps[i]), f"#{i} ready before a dependency signalled"
    for b in range(hw.n_blocks):
        mine = np.flatnonzero(r.block == b)
        mine = mine[np.argsort(r.claim[mine], kind="stable")]
        # handed out in claim order, and never more than claim_depth claimed and not yet handed out
        assert np.all(np.diff(r.dispatch[mine]) >= -1e-6), "claims handed out in claim order"
        for j in range(len(mine)):
            held = np.sum((r.claim[mine[:j]] <= r.claim[mine[j]] + 1e-6) & (r.dispatch[mine[:j]] > r.claim[mine[j]] + 1e-6))
            assert held < hw.claim_depth, f"block {b} held {held + 1} claims at once (depth {hw.claim_depth})"
        for g in range(hw.groups):
            run = np.flatnonzero((r.block == b) & (r.group == g))
            run = run[np.argsort(r.dispatch[run], kind="stable")]
            assert np.all(r.dispatch[run[1:]] >= r.signal[run[:-1]] - 1e-6), "a group runs one op at a time"
    if r.mode == "dynamic":
        assert np.all(np.diff(r.claim) >= hw.head_gap_ns - 1e-6), "claims in stream order, serialised on the head"
    else:
        assert r.lists is not None
        for b, lst in enumerate(r.lists):
            mine = np.flatnonzero(r.block == b)
            assert mine[np.argsort(r.claim[mine], kind="stable")].tolist() == lst, "each block runs exactly its list, in order"
    assert r.makespan_ns == pytest.approx(r.signal.max())


@settings(max_examples=100, deadline=None)
@given(
    stream=streams(max_ops=60),
    config=st.sampled_from(CONFIGS),
    mode=st.sampled_from(["dynamic", "static"]),
    seed=st.integers(0, 2**31),
    timing=st.sampled_from(["model", "durations", "instant"]),
)
def test_random_programs_run_valid_schedules(stream: Stream, config: tuple[int, int], mode: str, seed: int, timing: str) -> None:
    blocks, groups = config
    rng = random.Random(seed)
    hw = Hardware(n_blocks=blocks, groups=groups, **(INSTANT if timing == "instant" else {}))
    durations = None
    if timing != "model":
        durations = [rng.choice([0.0, rng.uniform(0, 5000)]) for _ in range(len(stream))]
    r = simulate(stream, hw, mode, durations=durations)
    check_invariants(r, stream)


def test_invariants_catch_a_bad_schedule() -> None:
    """The checker itself fails on a result that breaks a dependency."""
    s = random_program(random.Random(3), 30, p_signal=1.0, p_partial=0.0).build()
    r = simulate(s, Hardware(n_blocks=4))
    check_invariants(r, s)
    i = next(k for k, d in enumerate(s.deps) if d)
    r.ready[i] = r.visible[s.deps[i][0]] - 1.0
    with pytest.raises(AssertionError):
        check_invariants(r, s)


def _chain(n: int) -> Stream:
    p = Program("chain")
    prev = None
    for i in range(n):
        c = p.counter(f"c{i}")
        p.op(Op.NOP, waits=[prev] if prev else [], signal=c)
        prev = c
    return p.build()


def test_signal_latency_adds_once_per_link() -> None:
    s = _chain(10)
    base = dict(n_blocks=1, groups=1, dispatch_ns=0.0)
    long_ops = [10_000.0] * len(s)  # hides the claims behind the ops
    t0 = simulate(s, Hardware(signal_latency_ns=0.0, **base), durations=long_ops).makespan_ns
    t1 = simulate(s, Hardware(signal_latency_ns=2000.0, **base), durations=long_ops).makespan_ns
    assert t1 - t0 == pytest.approx(9 * 2000.0)


def _streaming(n_tiles: int, rows: int = 16, k: int = 8192, t: int = 1) -> tuple[Stream, int]:
    """Independent GEMM column tiles of one bf16 matrix, each prefetched at claim."""
    p = Program("stream")
    w = p.tensor("W", (n_tiles * rows, k), DType.BF16, "weight")
    x = p.tensor("x", (t, k), DType.BF16)
    out = p.tensor("out", (t, n_tiles * rows), DType.BF16)
    for j in range(n_tiles):
        p.op(Op.GEMM, [out, x, w], [j * rows, rows], prefetch=(w, j * rows * w.row_bytes, rows * w.row_bytes))
    return p.build(), w.nbytes


@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_weight_streaming_reaches_the_hbm_floor(mode: str) -> None:
    s, nbytes = _streaming(2048)  # 512 MB in 256 KB tiles
    hw = Hardware()
    floor = nbytes / hw.hbm_bytes_per_s * 1e9
    r = simulate(s, hw, mode)
    # ramp-up (claims, latency) and the tail of the last tiles, at the capped rate
    slack = hw.claim_ns + hw.decode_ns + hw.mem_latency_ns + 256 * 1024 / hw.load_bytes_per_s * 1e9
    assert floor <= r.makespan_ns <= 1.03 * floor + slack


def _waiting_gemm(prefetch: bool, wait: bool = True) -> tuple[Stream, int]:
    p = Program("pf")
    w = p.tensor("W", (256, 8192), DType.BF16, "weight")  # 4 MB
    x = p.tensor("x", (1, 8192), DType.BF16)
    out = p.tensor("out", (1, 256), DType.BF16)
    c = p.counter("slept")
    p.op(Op.SLEEP, args=[200_000 if wait else 0], signal=c)
    p.op(Op.GEMM, [out, x, w], [0, 256], waits=[c] if wait else [], prefetch=(w, 0, w.nbytes) if prefetch else None)
    return p.build(), w.nbytes


@pytest.mark.parametrize("prefetch", [True, False])
def test_prefetch_loads_weights_during_the_wait(prefetch: bool) -> None:
    s, nbytes = _waiting_gemm(prefetch)
    hw = Hardware(n_blocks=2, prefetch_max_bytes=nbytes)
    r = simulate(s, hw)
    g = 1 if s.ops[1].opcode == Op.GEMM else 0
    load_ns = nbytes / hw.load_bytes_per_s * 1e9
    assert r.ready[g] > 200_000
    if prefetch:  # weights arrived while the op waited
        assert r.done[g] - r.ready[g] < 0.1 * load_ns
    else:
        assert r.done[g] - r.ready[g] >= load_ns


def test_the_loader_prefetches_only_the_first_bytes_of_an_op_that_will_wait() -> None:
    """As runtime/loader.cuh: GVM_PF_MAX_BYTES of a waiting op, none of a ready one."""
    s, nbytes = _waiting_gemm(True)
    hw = Hardware(n_blocks=2)
    r = simulate(s, hw)
    g = 1 if s.ops[1].opcode == Op.GEMM else 0
    load_ns = (nbytes - hw.prefetch_max_bytes) / hw.load_bytes_per_s * 1e9
    assert r.ready[g] > 200_000 and r.done[g] - r.ready[g] >= load_ns
    ready, _ = _waiting_gemm(True, wait=False)
    g = 1 if ready.ops[1].opcode == Op.GEMM else 0
    sim = simulate(ready, Hardware(n_blocks=1, groups=1, prefetch_max_bytes=nbytes))
    assert sim.done[g] - sim.ready[g] >= nbytes / hw.load_bytes_per_s * 1e9  # no prefetch: it loads all itself


def test_one_block_is_132_times_slower_on_independent_work() -> None:
    p = Program("sleeps")
    for _ in range(132 * 2 * 8):
        p.op(Op.SLEEP, args=[20_000])
    s = p.build()
    wide = simulate(s, Hardware()).makespan_ns
    narrow = simulate(s, Hardware(n_blocks=1)).makespan_ns
    assert 125 < narrow / wide < 135


def test_loads_share_hbm_and_each_is_capped() -> None:
    s, nbytes = _streaming(2, rows=4096)  # two 64 MB tiles
    tile = nbytes / 2
    hw = Hardware(load_bytes_per_s=4.42e12, mem_latency_ns=0.0)
    r = simulate(s, hw)
    both = r.done.max() - r.load.max()
    assert both == pytest.approx(2 * tile / hw.hbm_bytes_per_s * 1e9, rel=0.01)  # shared, not each at full rate
    capped = Hardware(load_bytes_per_s=1e12, mem_latency_ns=0.0)
    one, _ = _streaming(1, rows=4096)
    r = simulate(one, capped)
    assert r.done[0] - r.load[0] == pytest.approx(tile / 1e12 * 1e9, rel=0.01)


def test_groups_of_one_sm_share_its_tensor_cores() -> None:
    s, _ = _streaming(2, rows=64, k=8192, t=4096)
    # compute-bound tiles; one claim per block, so the second block gets the second tile
    fast = dict(load_bytes_per_s=1e14, l2_bytes_per_s=1e14, claim_depth=1)
    hw = Hardware(n_blocks=1, groups=2, **fast)
    r = simulate(s, hw)
    flops = s.ops[0].cost.flops
    alone = flops / hw.flops_per_sm * 1e9
    assert r.done.max() - r.ready.min() >= 2 * alone * 0.99  # two at once take twice as long
    spread = simulate(s, Hardware(n_blocks=2, groups=1, **fast))
    assert spread.makespan_ns < 0.7 * r.makespan_ns


def test_share_serves_jobs_equally() -> None:
    sh = Share(lambda k: 1.0 / k)  # one unit/ns in all
    ends: dict[str, float] = {}
    sh.add(0.0, 10.0, lambda t: ends.__setitem__("a", t))
    sh.add(0.0, 30.0, lambda t: ends.__setitem__("b", t))
    while len(sh):
        now = sh.next_end()
        assert now is not None
        for cb in sh.finish(now):
            cb(now)
    assert ends == {"a": pytest.approx(20.0), "b": pytest.approx(40.0)}


def test_out_of_order_static_lists_deadlock_with_a_clear_error() -> None:
    s = _chain(2)
    with pytest.raises(DeadlockError, match=r"(?s)deadlock.*#0 'nop': queued in block 0, no group ever came free.*#1 'nop': block 0 group 0 waits on 'c0' at 0 of 1"):
        simulate(s, Hardware(n_blocks=1, groups=1, ready_first=False, claim_depth=2), "static", lists=[[1, 0]])
    # ready first, one claim held: #1 stays with the controller and #0 is never claimed
    with pytest.raises(DeadlockError, match=r"(?s)deadlock.*#0 'nop': never claimed.*#1 'nop': held by block 0's controller, waits on 'c0' at 0 of 1"):
        simulate(s, Hardware(n_blocks=1, groups=1), "static", lists=[[1, 0]])


def test_ready_first_lets_a_ready_claim_pass_a_waiting_one() -> None:
    """One block, one group, two claims held: a slow op, a consumer of it, then
    an independent op. In claim order the consumer holds the only group while
    it waits; ready first, the independent op runs meanwhile."""
    p = Program("pass")
    c = p.counter("slow")
    p.op(Op.SLEEP, [], [20_000], signal=c, label="slow")
    p.op(Op.NOP, waits=[c], label="consumer")
    p.op(Op.SLEEP, [], [5_000], label="independent")
    s = p.build(order="given")
    hw = dict(n_blocks=2, groups=1, claim_depth=2)
    inorder = simulate(s, Hardware(ready_first=False, **hw), "static", lists=[[0], [1, 2]])
    ready = simulate(s, Hardware(**hw), "static", lists=[[0], [1, 2]])
    assert inorder.done[2] > inorder.done[1]  # the independent op waited behind the consumer
    assert ready.done[2] < ready.done[1]
    assert ready.makespan_ns < inorder.makespan_ns


def test_a_work_list_signals_when_its_items_are_done() -> None:
    """Four workers of an expert list, one queued behind a slow op on a block of
    one group: the running worker takes every item and, finishing the last,
    adds all four signals, so the list's consumer runs before the late worker,
    which then finds the list taken and ends at once (ops/experts.cuh)."""
    p = Program("list")
    t = _muse_tensors(p)
    done = p.counter("hbuf")
    p.op(Op.SLEEP, [], [50_000], label="slow")
    for k in range(4):
        p.op(Op.EXPERT_UP, [t[n] for n in ("hbuf", "x", "gu", "gus", "guts", "meta", "route", "work")], [0, 4, 16, 64], signal=done, label=f"up{k}")
    p.op(Op.NOP, waits=[done], label="consumer")
    s = p.build(order="given")
    hw = Hardware(n_blocks=2, groups=1, claim_depth=2)
    item_ns = 2_000.0
    r = simulate(s, hw, "static", lists=[[0, 2], [1, 3, 4, 5]], durations=[50_000.0] + [item_ns] * 4 + [0.0])
    runs = r.done - r.ready
    assert runs[1] >= 4 * item_ns, "the running worker took all four items"
    assert runs[2] < item_ns and runs[3] < item_ns and runs[4] < item_ns, "the others found the list taken"
    assert r.ready[5] >= r.signal[1] + hw.signal_latency_ns, "the finisher's signal met the wait"
    assert r.ready[5] < r.done[0] < r.done[2], "the consumer ran before the slow op and its queued worker"


def test_parking_hands_a_waiting_claim_to_an_idle_group() -> None:
    """One block, two groups, one claim held: a slow op and its consumer. With
    parking the consumer goes to the idle group before the slow op ends and is
    ready as soon as the signal is seen; without, it waits in the controller
    for the probe. One group never parks: a third op waiting on the slow one
    stays held while the consumer is parked."""
    p = Program("park")
    c = p.counter("slow")
    p.op(Op.SLEEP, [], [20_000], signal=c, label="slow")
    p.op(Op.NOP, waits=[c], label="consumer")
    p.op(Op.NOP, waits=[c], label="second")
    s = p.build(order="given")
    hw = dict(n_blocks=1, groups=2, claim_depth=2)
    parked = simulate(s, Hardware(**hw), "static", lists=[[0, 1, 2]])
    held = simulate(s, Hardware(park=False, **hw), "static", lists=[[0, 1, 2]])
    assert parked.dispatch[1] < parked.done[0] and held.dispatch[1] > held.done[0]
    assert parked.dispatch[2] > parked.done[0], "the second could only park on the group running the slow op"
    h = Hardware(**hw)
    assert parked.ready[1] == pytest.approx(parked.signal[0] + h.signal_latency_ns)
    assert held.ready[1] >= held.signal[0] + h.signal_latency_ns + h.probe_ns
    assert parked.done[1] < held.done[1]


def test_trace_reads_like_a_gpu_trace(tmp_path) -> None:  # type: ignore[no-untyped-def]
    s = random_program(random.Random(5), 25).build()
    r = simulate(s, Hardware(n_blocks=3), "static")
    tr = r.trace
    tr.save(tmp_path / "m.npz")
    back = Trace.load(tmp_path / "m.npz")
    assert back.meta["source"] == "model" and back.meta["mode"] == "static" and back.meta["n_blocks"] == 3
    assert np.array_equal(back.records["sm"], r.block) and np.array_equal(back.records["group"], r.group)
    assert np.array_equal(back.times(Stamp.READY), np.rint(r.ready).astype(np.int64))
    assert np.array_equal(back.records["clock"], back.records["globaltimer"])
    assert back.deps == [tuple(d) for d in s.deps] and back.labels == s.labels


def test_bad_input_is_refused() -> None:
    s = _chain(3)
    with pytest.raises(ProgramError, match="mode"):
        simulate(s, Hardware(), "greedy")
    with pytest.raises(ProgramError, match="static mode only"):
        simulate(s, Hardware(), "dynamic", lists=[[0, 1, 2]])
    with pytest.raises(ProgramError, match="durations"):
        simulate(s, Hardware(), durations=[1.0])
    with pytest.raises(ProgramError, match=">= 0"):
        simulate(s, Hardware(), durations=[1.0, -1.0, 1.0])
    with pytest.raises(ProgramError, match="exactly once"):
        simulate(s, Hardware(n_blocks=2), "static", lists=[[0, 1], [1]])
    with pytest.raises(ProgramError, match="lists for"):
        simulate(s, Hardware(n_blocks=2), "static", lists=[[0, 1, 2]])
    with pytest.raises(ProgramError, match="n_blocks"):
        Hardware(n_blocks=0)
    with pytest.raises(ProgramError, match="co-resident"):
        Hardware(n_blocks=133)
    with pytest.raises(ProgramError, match="hbm_bytes_per_s"):
        Hardware(hbm_bytes_per_s=0)


# ---- one Muse layer -----------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(tokens=st.integers(1, 300), cfg=st.sampled_from([SHARD, SMALL]))
def test_skewed_expert_tokens(tokens: int, cfg: MuseConfig) -> None:
    toks = skewed_expert_tokens(cfg, tokens)
    assert len(toks) == cfg.local_experts
    want = min(round(2 * tokens * cfg.top_k * cfg.local_experts / cfg.n_experts), tokens * min(cfg.top_k, cfg.local_experts))
    assert sum(toks) == want, "about 2x the average load lands on the shard"
    assert all(0 <= t <= tokens for t in toks) and toks == sorted(toks, reverse=True)


def test_skew_matches_muse_md() -> None:
    toks = skewed_expert_tokens(SHARD, 256)
    assert toks[0] >= 100 and toks[-1] < toks[0] // 10  # "the top expert gets 100+", uneven
    assert skewed_expert_tokens(SHARD, 1) == [1, 1] + [0] * 30
    assert sum(skewed_expert_tokens(SHARD, 16, load=1.0)) == 16
    with pytest.raises(ProgramError):
        skewed_expert_tokens(SHARD, 0)


def _small_layer() -> tuple[Stream, Case]:
    case = small_case(get_case("full-c16-t1"), SMALL)
    lp = lower_layer(SMALL, case.kind, case.conversations, case.tokens_each, cache_slots(SMALL, case.kind, case.tokens_each, case.context))
    return lp.stream, case


def test_layer_costs_follow_expert_tokens() -> None:
    s, case = _small_layer()
    toks = [3, 0, 1, 0]
    costs = layer_costs(s, toks)
    meta = torch.tensor([toks, [0] * 4], dtype=torch.int32)
    seen: dict[int, int] = {}
    for ins, c in zip(s.ops, costs):
        if ins.opcode in (Op.EXPERT_UP, Op.EXPERT_DOWN) and not ins.lead:  # lead: the code warmer's, static costs
            # the model deals the list round-robin over its workers in stream order:
            # weights per row, math per row and token of the tiles the tokens fill (8 up to 8, then chunks of 32)
            j = seen.get(ins.args[0], 0)
            seen[ins.args[0]] = j + 1
            items = list_items(meta, ins.tensors[0].shape[1], ins.args[1], ins.args[2], ins.args[3])[j :: ins.args[1]]
            mats, k = (2 if ins.opcode == Op.EXPERT_UP else 1), ins.tensors[1].shape[1]
            rows = sum(cols.stop - cols.start for _, cols in items)
            assert c.weight_bytes == mats * rows * (k // 2 + k // 16)
            assert c.flops == sum(8 * 2 * mats * k * (cols.stop - cols.start) for e, cols in items if toks[e])
        elif ins.opcode == Op.ATTN_CHUNK and not ins.lead:  # the math of its query rows' tiles
            rows = case.tokens_each * (ins.tensors[4].shape[1] // ins.tensors[1].shape[2])
            assert (c.weight_bytes, c.act_bytes) == (ins.cost.weight_bytes, ins.cost.act_bytes)
            assert c.flops == (16 if rows <= 16 else 64) * 4 * ins.args[3] * 64
        else:
            assert c == ins.cost
    assert any(ins.lead for ins in s.ops)
    assert sum(c.weight_bytes for ins, c in zip(s.ops, costs) if ins.opcode == Op.EXPERT_DOWN and not ins.lead) == 2 * SMALL.squeeze * (SMALL.expert_inter // 2 + SMALL.expert_inter // 16)
    with pytest.raises(ProgramError, match="expert_tokens"):
        layer_costs(s, [1, 1])


def test_model_costs_build_each_lists_items_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """model_costs gives layer_costs' and list_item_costs' results, building a
    list shape's items (opspec.expert_items) once for both."""
    from gpuvm.sim import predict

    s, _ = _small_layer()
    toks = [3, 0, 1, 0]
    calls: list[tuple] = []
    real = predict.expert_items

    def counted(*a, **kw):  # type: ignore[no-untyped-def]
        calls.append(a[1:])
        return real(*a, **kw)

    monkeypatch.setattr(predict, "expert_items", counted)
    costs, items = predict.model_costs(s, toks)
    together = len(calls)
    assert costs == layer_costs(s, toks)
    alone = len(calls) - together
    assert items == predict.list_item_costs(s, toks)
    assert together == alone > 0  # list_item_costs built nothing that layer_costs had built


def test_static_expert_cost_is_a_workers_share_of_one_token_each() -> None:
    """An expert op's static cost (opspec, before any routing) is the rows of
    the most items a worker gets when every local expert has one token: the
    share the list of expert_items gives, here reckoned without making it (a
    list per worker instruction made a 1 x 1 step's lowering twice as slow)."""
    s, _ = _small_layer()
    E = SMALL.local_experts
    for ins in s.ops:
        if ins.opcode in (Op.EXPERT_UP, Op.EXPERT_DOWN):
            n_out, k, n_w = ins.tensors[0].shape[1], ins.tensors[1].shape[1], ins.args[1]
            items = list_items(torch.tensor([[1] * E, [0] * E], dtype=torch.int32), n_out, n_w, ins.args[2], ins.args[3])
            rows = -(-len(items) // n_w) * (items[0][1].stop - items[0][1].start)
            assert ins.cost.weight_bytes == (2 if ins.opcode == Op.EXPERT_UP else 1) * rows * (k // 2 + k // 16)


def test_more_experts_hit_take_longer() -> None:
    """On two blocks, where experts cannot all run side by side."""
    _, case = _small_layer()
    t = [predict_layer(SMALL, case, Hardware(n_blocks=2, groups=1), expert_tokens=toks)["time_ns"] for toks in ([0] * 4, [2, 1, 0, 0], [4] * 4)]
    assert t[0] < t[1] < t[2]
    with pytest.raises(ProgramError, match="expert_tokens"):
        predict_layer(SMALL, case, expert_tokens=[17, 0, 0, 0])


def test_shard_decode_layer_prediction() -> None:
    case = get_case("full-c1-t1")
    d = predict_layer(SHARD, case)
    fb = floor_bytes(SHARD, case, 2)
    assert d["experts_hit"] == 2 and d["floor_bytes"] == fb["total"]
    # the model moves at least the floor's weights and KV, and cannot beat HBM
    assert d["model_hbm_bytes"] >= fb["dense"] + fb["experts"] + fb["kv_read"]
    assert d["time_ns"] >= d["model_hbm_bytes"] / Hardware().hbm_bytes_per_s * 1e9
    assert 1.0 < d["ratio"] < 3.0 and d["ratio"] == pytest.approx(d["time_ns"] / d["floor_ns"])
    # a quarter of the SMs nearly keeps up (the layer is latency bound), an eighth cannot
    slow = predict_layer(SHARD, case, Hardware(n_blocks=16))
    assert slow["time_ns"] > 1.2 * d["time_ns"]


def test_deep_claim_queues_hold_work_back_from_idle_blocks() -> None:
    """A block claims up to claim_depth instructions ahead, like the device's
    controller: with a deep queue one block can take work a second block could
    have run, the cost gpu_check measures on its mixed stream."""
    s, _ = _streaming(2, rows=64, k=8192, t=4096)
    fast = dict(load_bytes_per_s=1e14, l2_bytes_per_s=1e14)
    shallow = simulate(s, Hardware(n_blocks=2, groups=1, claim_depth=1, **fast))
    deep = simulate(s, Hardware(n_blocks=2, groups=1, claim_depth=6, **fast))
    assert set(shallow.block.tolist()) == {0, 1}
    assert set(deep.block.tolist()) == {0}
    assert deep.makespan_ns > 1.5 * shallow.makespan_ns


def test_an_opcodes_timing_sets_its_fixed_cost_and_matrix_rate() -> None:
    s, _ = _streaming(1, rows=64, k=8192, t=4096)  # compute bound
    fast = dict(load_bytes_per_s=1e14, l2_bytes_per_s=1e14, mem_latency_ns=0.0)
    base = simulate(s, Hardware(**fast))
    slow = simulate(s, Hardware(ops={"GEMM": OpTiming(5_000.0, 0.25)}, **fast))
    math_ns = s.ops[0].cost.flops / Hardware().flops_per_sm * 1e9
    run = lambda r: float(r.done[0] - r.ready[0])  # noqa: E731
    assert run(base) == pytest.approx(Hardware().launch_ns + math_ns, rel=0.01)
    assert run(slow) == pytest.approx(5_000.0 + 4 * math_ns, rel=0.01)
    assert Hardware().timing(Op.GEMM) == OpTiming(Hardware().launch_ns)


@pytest.mark.parametrize("ops", [{"GEMMS": OpTiming(1.0)}, {"GEMM": OpTiming(-1.0)}, {"GEMM": OpTiming(1.0, 0.0)}, {"GEMM": OpTiming(1.0, 1.5)}, {"GEMM": 400.0}])
def test_a_bad_opcode_timing_is_refused(ops: dict) -> None:
    with pytest.raises(ProgramError, match="Hardware.ops"):
        Hardware(ops=ops)


def test_the_stored_fit_reproduces_its_traced_layers() -> None:
    """The fit in gpuvm/sim/h200_fit.json, re-simulated from each traced case's
    routing: the same spans it stored, and within its stated distance of the
    H200's (tools/calibrate_model.py)."""
    fit = fitted.load()
    hw = fitted_hardware()
    assert hw.hbm_bytes_per_s == fit["source"]["read_bytes_per_s"]
    rows = fit["source"]["cases"]
    assert len(rows) == 12 and {r["case"] for r in rows} == {c.name for c in DECODE_CASES}
    traced = Tiles(**fit["source"].get("tiles", {}))  # the traced commit's lowering, where today's defaults differ
    lpt = fit["source"].get("expert_lpt", True)  # and its expert lists' order
    for r in rows:
        p = predict_layer(SHARD, get_case(r["case"]), fitted_hardware(r["read_bytes_per_s"]), expert_tokens=r["expert_tokens"], tiles=traced,
                          longest_first=lpt)
        # the stored span starts at the first claim, as a trace's does; predict_layer's at launch
        assert p["time_ns"] / 1e3 - hw.claim_ns / 1e3 == pytest.approx(r["model_us"], abs=1e-3)
        assert 0.8 <= p["time_ns"] / 1e3 / r["trace_us"] <= 1.25, r["case"]


def test_claimed_items_even_out_a_skew_that_a_fixed_round_robin_does_not() -> None:
    """With each item its own cost (list_item_costs), a list's workers claim
    them one at a time, while the fixed round robin (Tiles.expert_fixed) gives
    each worker its share whenever it starts: on static lists, where the
    workers start at different times, the claimed lists end first, as on the
    H200 (README, the fully static column)."""
    from gpuvm.sim.predict import list_item_costs
    from gpuvm.static import static_lists

    case = get_case("full-c16-t8")
    toks = skewed_expert_tokens(SHARD, case.tokens)
    phase = {}
    for fixed in (0, 1):
        s = lower_layer(SHARD, case.kind, case.conversations, case.tokens_each, cache_slots(SHARD, case.kind, case.tokens_each, case.context),
                        tiles=Tiles(expert_fixed=fixed, down_early=0)).stream  # the up list alone, not beside early down items
        items = list_item_costs(s, toks)
        assert sum(c.weight_bytes for v in items.values() for c in v) == sum(c.weight_bytes for ins, c in zip(s.ops, layer_costs(s, toks)) if ins.opcode in (Op.EXPERT_UP, Op.EXPERT_DOWN) and not ins.lead)
        lists = static_lists(s, 132, 2)  # the device's: its workers start at different times
        r = simulate(s, fitted_hardware(), "static", lists, costs=layer_costs(s, toks), item_costs=items)
        up = [i for i, o in enumerate(s.ops) if o.opcode == Op.EXPERT_UP and not o.lead]
        phase[fixed] = max(r.done[i] for i in up) - min(r.ready[i] for i in up)
    assert phase[1] > 1.1 * phase[0]


def test_an_early_down_list_starts_in_the_up_lists_tail() -> None:
    """Tiles.down_early in the model: the up list's first signal (its items all
    taken) releases the down workers, each down item waiting for its expert's
    up items (ItemCost.expert); without it they wait for the whole list. At
    128 tokens the early list starts before the up list ends and the layer
    ends sooner."""
    from gpuvm.sim.predict import model_costs

    case = get_case("sliding-c16-t8")
    toks = skewed_expert_tokens(SHARD, case.tokens)
    ends = {}
    for early in (0, 1):
        s = lower_layer(SHARD, case.kind, case.conversations, case.tokens_each, cache_slots(SHARD, case.kind, case.tokens_each, case.context),
                        tiles=Tiles(down_early=early, expert_cap_up=64, expert_heavy_up=0)).stream
        costs, items = model_costs(s, toks)
        assert all(c.expert >= 0 for v in items.values() for c in v)
        r = simulate(s, fitted_hardware(), "dynamic", costs=costs, item_costs=items)
        up = [i for i, o in enumerate(s.ops) if o.opcode == Op.EXPERT_UP and not o.lead]
        down = [i for i, o in enumerate(s.ops) if o.opcode == Op.EXPERT_DOWN and not o.lead]
        assert (min(r.ready[i] for i in down) < max(r.done[i] for i in up)) == bool(early)
        ends[early] = r.makespan_ns
    assert ends[1] < ends[0]
