"""The trace tools: times from a trace, Perfetto export, HTML timeline data,
text summary and the `gpuvm trace` command, on synthetic traces."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpuvm.isa import TRACE_DTYPE, Op
from gpuvm.trace.cli import trace_main
from gpuvm.trace.format import Trace, TraceError
from gpuvm.trace.html import rows, timeline_html
from gpuvm.trace.perfetto import perfetto_json, write_perfetto
from gpuvm.trace.summary import (NO_DEP, ListTail, ListWindow, PathHops, WakeUps, block_idle, compare, counter_waits, critical_path, held_claims,
                                 list_tails, list_windows, op_diff, op_kind, op_stats, path_hops, summarize, wake_ups)
from gpuvm.trace.timeline import CLAIM, DONE, LOAD, READY, SIGNAL, build, op_name, op_order

from trace_synth import make_trace

ROOT = Path(__file__).resolve().parent.parent


def hand_trace() -> Trace:
    """Four instructions with known answers (see the tests below)."""
    stamps = {  # claim, load, ready, done, signal; block, group
        0: ((0, 10, 100, 1100, 1150), 0, 0),
        1: ((20, 30, 120, 2120, 2150), 1, 0),
        2: ((500, 0, 2300, 3300, 3350), 0, 0),
        3: ((1000, 0, 1200, 1700, 1720), 1, 1),
    }
    rec = np.zeros(4, dtype=TRACE_DTYPE)
    for i, (t, b, g) in stamps.items():
        rec[i]["globaltimer"] = t
        rec[i]["sm"], rec[i]["block"], rec[i]["group"], rec[i]["instr"] = b + 5, b, g, i
    return Trace(
        records=rec,
        labels=["A[0]", "A[1]", "B[0]", "C x1 y2"],
        opcodes=np.full(4, 16, np.uint16),
        deps=[(), (), (0, 1), (0,)],
        weight_bytes=np.array([1000, 2000, 0, 0]),
        act_bytes=np.array([0, 0, 500, 0]),
        meta={"source": "model", "signal_counter": ["a done", "a done", "", "c"]},
    )


# -- timeline -------------------------------------------------------------------


def test_op_name_rule():
    assert op_name("L0.wqkvg[3]") == "L0.wqkvg"
    assert op_name("L0.attn_chunk c2 h1 j5") == "L0.attn_chunk"
    assert op_name("L12.expert_up[e3][1]") == "L12.expert_up"
    assert op_name("rmsnorm") == "rmsnorm"
    assert op_name("[7]") == "[7]"


def test_model_times_are_the_stamps():
    trace, true = make_trace(3)
    tl = build(trace)
    assert tl.clock == "globaltimer"
    for s in (CLAIM, READY, DONE, SIGNAL):
        np.testing.assert_array_equal(tl.t[:, s], true[:, s] - true[:, CLAIM].min())
    assert tl.span == true[:, SIGNAL].max() - true[:, CLAIM].min()
    np.testing.assert_array_equal(tl.has_load, trace.weight_bytes > 0)


def test_gpu_times_come_from_clock64_per_sm():
    trace, true = make_trace(4, n=60, source="gpu", clock_hz=1.755e9)
    tl = build(trace)
    assert tl.clock.startswith("clock64")
    rel = true - true[:, CLAIM].min()
    for a, b in ((CLAIM, READY), (READY, DONE), (DONE, SIGNAL), (CLAIM, SIGNAL)):
        np.testing.assert_allclose(tl.t[:, b] - tl.t[:, a], rel[:, b] - rel[:, a], atol=1.0)
    err = tl.t[:, CLAIM] - rel[:, CLAIM]
    # SMs line up far better than one 256 ns tick: each offset is the tightest
    # bound over the SM's ~75 stamps
    assert np.abs(err).max() < 32
    for s in np.unique(tl.sm):  # one offset per SM: order on an SM is exact
        e = err[tl.sm == s]
        assert e.max() - e.min() < 1.0
    load = tl.has_load
    np.testing.assert_allclose(tl.t[load, LOAD] - tl.t[load, CLAIM], rel[load, LOAD] - rel[load, CLAIM], atol=1.0)


def test_gpu_without_clock_rate_uses_globaltimer():
    trace, true = make_trace(4, n=60, source="gpu")
    tl = build(trace)
    assert tl.clock == "globaltimer"
    assert np.all(tl.t[:, CLAIM] % 256 == tl.t[0, CLAIM] % 256)
    np.testing.assert_allclose(tl.t[:, DONE] - tl.t[:, READY], true[:, DONE] - true[:, READY], atol=256)


def test_records_that_never_ran_are_left_out():
    trace, _ = make_trace(5, n=30, source="gpu", clock_hz=1.5e9)
    rec = trace.records.copy()
    rec[[28, 29]] = np.zeros(2, dtype=TRACE_DTYPE)
    t2 = Trace(rec, trace.labels, trace.opcodes, trace.deps, trace.weight_bytes, trace.act_bytes, trace.meta)
    tl = build(t2)
    assert tl.ran.sum() == 28 and not tl.ran[28:].any()
    assert "28 ran of 30" in summarize(t2)
    ops = [e for e in perfetto_json(t2)["traceEvents"] if e.get("cat") == "op" and e["name"] != "release"]
    assert sorted(e["args"]["instr"] for e in ops) == list(range(28))


def _with(trace: Trace, **kw) -> Trace:
    f = dict(records=trace.records.copy(), labels=trace.labels, opcodes=trace.opcodes, deps=trace.deps, weight_bytes=trace.weight_bytes, act_bytes=trace.act_bytes, meta=trace.meta)
    f.update(kw)
    return Trace(**f)


def test_bad_traces_raise_trace_error():
    t = hand_trace()
    with pytest.raises(TraceError, match="depends on 3, which is not an earlier"):
        build(_with(t, deps=[(), (), (0, 1), (3,)]))
    with pytest.raises(TraceError, match="depends on 9"):
        build(_with(t, deps=[(), (), (9,), ()]))
    rec = t.records.copy()
    rec[2]["globaltimer"][READY] = 400  # before its claim at 500
    with pytest.raises(TraceError, match=r"instruction 2 'B\[0\]': stamps out of order \(ready before claim\)"):
        build(_with(t, records=rec))
    rec = t.records.copy()
    rec[1]["globaltimer"][SIGNAL] = 2000
    with pytest.raises(TraceError, match="signal before done"):
        build(_with(t, records=rec))
    with pytest.raises(TraceError, match="no instruction of the trace ran"):
        build(_with(t, records=np.zeros(4, TRACE_DTYPE), meta={"source": "gpu"}))
    gpu, _ = make_trace(1, source="gpu", clock_hz=1e9)
    for hz in (-5, 0, "fast"):
        with pytest.raises(TraceError, match="clock_hz"):
            build(_with(gpu, meta={"source": "gpu", "clock_hz": hz}))
    with pytest.raises(TraceError, match="meta is not a JSON object"):
        build(_with(gpu, meta=["gpu"]))


def test_op_order_is_first_start():
    assert op_order(build(hand_trace())) == ["A", "C", "B"]


# -- summary --------------------------------------------------------------------


def test_summary_numbers_on_a_known_trace():
    tl = build(hand_trace())
    a, c, b = op_stats(tl)
    assert (a.name, a.count, a.blocks, a.bytes) == ("A", 2, 2, 3000)
    assert a.run_median == 1500 and a.run_p90 == pytest.approx(1900)
    assert a.wait_median == 100
    assert a.gbps_median == pytest.approx((1000 / 1090 + 2000 / 2090) / 2)
    assert a.gbps_span == pytest.approx(3000 / (2120 - 10))
    assert (b.name, b.wait_median, b.gbps_median, b.gbps_span) == ("B", 1800, 0.5, 0.5)
    assert c.gbps_median is None and c.gbps_span is None
    assert (a.phase, b.phase, c.phase) == (2020, 1000, 500)  # first ready to last done

    idle = {x.block: x for x in block_idle(tl)}
    assert tl.span == 3350
    assert (idle[0].busy, idle[0].idle, idle[0].sm) == (2000, 1350, 5)
    assert (idle[1].busy, idle[1].idle, idle[1].count) == (2000, 1350, 2)  # [120,2120] covers C's [1200,1700]

    waits = {w.counter: w for w in counter_waits(tl)}
    assert set(waits) == {"a done", NO_DEP}
    assert (waits["a done"].waits, waits["a done"].total, waits["a done"].longest) == (2, 1800, 1650)
    assert (waits[NO_DEP].waits, waits[NO_DEP].total, waits[NO_DEP].longest) == (4, 400, 150)

    assert critical_path(tl) == [1, 2]
    # A[1] signals at 2150, B[0] (claimed at 500) is ready at 2300
    assert path_hops(tl, [1, 2]) == [PathHops("B", 1, 150.0, 150.0, 150.0, 0)]


def test_hops_count_late_claims_and_add_up_layers():
    t = hand_trace()
    late = _with(t, labels=["L0.A[0]", "L3.A[1]", "L3.B[0]", "L0.C x1 y2"])
    rec = late.records.copy()
    rec[2]["globaltimer"][0] = 2200  # B[0] claimed after A[1]'s signal
    tl = build(_with(late, records=rec))
    assert path_hops(tl, [1, 2]) == [PathHops("B", 1, 150.0, 150.0, 150.0, 1)]
    # largest total first, whatever the path's order
    assert path_hops(tl, [0, 2, 3]) == [PathHops("B", 1, 1150.0, 1150.0, 1150.0, 1), PathHops("C", 1, -2150.0, -2150.0, -2150.0, 0)]
    assert [op_kind(x) for x in ("L12.wqkvg", "L0.attn_chunk", "A", "Lx.a", "L.a", "L3")] == ["wqkvg", "attn_chunk", "A", "Lx.a", "L.a", "L3"]


def test_wake_ups_count_instructions_claimed_before_their_signal():
    t = hand_trace()
    tl = build(t)
    # B[0]: claimed at 500, released by A[1]'s signal at 2150, ready at 2300; C: claimed at
    # 1000, released by A[0]'s signal at 1150, ready at 1200
    assert wake_ups(tl) == [WakeUps("B", 1, 150.0, 150.0, 150.0, 0), WakeUps("C", 1, 50.0, 50.0, 50.0, 0)]
    rec = t.records.copy()
    rec[2]["globaltimer"][0] = 2200  # B[0] claimed after its signal: the claim held it, not the wake-up
    rec[3]["globaltimer"][2:] = (3000, 3500, 3520)  # C woke 1850 ns after its signal: slow
    tl = build(_with(t, labels=["L0.A[0]", "L3.A[1]", "L3.B[0]", "L0.C x1 y2"], records=rec))
    assert wake_ups(tl) == [WakeUps("C", 1, 1850.0, 1850.0, 1850.0, 1)]
    assert "wake-ups by op" in summarize(_with(t, records=rec))


def test_held_claims_count_instructions_claimed_after_their_signal():
    t = hand_trace()
    # A[0], A[1] have no dependency: claimed at 0 / 20, ready at 100 / 120; B[0] and C were
    # claimed before the signals that released them (wake-ups, not held claims)
    assert held_claims(build(t)) == [WakeUps("A", 2, 100.0, 100.0, 100.0, 0)]
    rec = t.records.copy()
    rec[2]["globaltimer"][0] = 2200  # B[0] claimed after A[1]'s signal (2150), ready at 2300
    rec[3]["globaltimer"] = (1160, 0, 5000, 5500, 5520)  # C claimed after A[0]'s (1150), held 3840 ns: slow
    tl = build(_with(t, labels=["L0.A[0]", "L3.A[1]", "L3.B[0]", "L0.C x1 y2"], records=rec))
    assert held_claims(tl) == [WakeUps("C", 1, 3840.0, 3840.0, 3840.0, 1), WakeUps("A", 2, 100.0, 100.0, 100.0, 0),
                               WakeUps("B", 1, 100.0, 100.0, 100.0, 0)]
    assert wake_ups(tl) == []
    text = summarize(_with(t, records=rec)).splitlines()
    held = text[text.index(next(l for l in text if l.startswith("held claims by op"))) + 3 :]
    assert [h.split() for h in held] == [["C", "1", "3.840", "3.840", "3.840", "1"], ["A", "2", "0.100", "0.100", "0.100", "0"],
                                         ["B", "1", "0.100", "0.100", "0.100", "0"]]


def test_list_tails_find_the_last_workers_sharing_an_sm():
    """A work list's last workers to finish and the SMs they ran on: two of
    them side by side on one SM count as a doubled SM; other ops are left out."""
    stamps = [(0, 100, 5), (0, 110, 5), (0, 50, 6), (0, 60, 7), (0, 30, 7)]  # ready, done, sm; the last a GEMM
    rec = np.zeros(len(stamps), dtype=TRACE_DTYPE)
    for i, (r, d, sm) in enumerate(stamps):
        rec[i]["globaltimer"] = (0, 0, r, d, d + 5)
        rec[i]["sm"], rec[i]["block"], rec[i]["group"], rec[i]["instr"] = sm, sm - 5, i % 2, i
    down, gemm = int(Op.EXPERT_DOWN), int(Op.GEMM)
    t = Trace(records=rec, labels=[f"L0.expert_down[{i}/4]" for i in range(4)] + ["L0.Wo[0]"],
              opcodes=np.array([down] * 4 + [gemm], np.uint16), deps=[()] * 5, weight_bytes=np.zeros(5, np.int64),
              act_bytes=np.zeros(5, np.int64), meta={"source": "model"})
    tl = build(t)
    # ends 100, 110, 50, 60: the median 80, the last 30 after it
    assert list_tails(tl, last=2) == [ListTail("L0.expert_down", 4, 80.0, 105.0, 1, 1, 30.0)]
    assert list_tails(tl, last=3) == [ListTail("L0.expert_down", 4, 80.0, 100.0, 2, 1, 30.0)]
    assert "work list tails" in summarize(t) and "work list tails" not in summarize(hand_trace())


def test_list_windows_count_every_groups_runs_in_a_layers_expert_window():
    """A layer's expert window runs from its first list worker's ready to its
    last one's done; busy counts any op's run in it, lists only the lists'; the
    code warmer's lead lists ("W.") belong to no layer."""
    up, down, gemm = int(Op.EXPERT_UP), int(Op.EXPERT_DOWN), int(Op.GEMM)
    rows = [  # label, opcode, ready, done, group (one block)
        ("W.expert_up[0/1]", up, 0, 50, 1),
        ("L0.expert_up[0/2]", up, 100, 300, 0), ("L0.expert_up[1/2]", up, 100, 200, 1),
        ("L0.Wo[0]", gemm, 250, 350, 1), ("L0.expert_down[0/1]", down, 300, 500, 0),
        ("L1.expert_down[0/1]", down, 600, 700, 1),
    ]
    rec = np.zeros(len(rows), dtype=TRACE_DTYPE)
    for i, (_, _, r, d, g) in enumerate(rows):
        rec[i]["globaltimer"] = (0, 0, r, d, d + 5)
        rec[i]["sm"], rec[i]["block"], rec[i]["group"], rec[i]["instr"] = 3, 0, g, i
    n = len(rows)
    t = Trace(records=rec, labels=[r[0] for r in rows], opcodes=np.array([r[1] for r in rows], np.uint16), deps=[()] * n,
              weight_bytes=np.zeros(n, np.int64), act_bytes=np.zeros(n, np.int64), meta={"source": "model"})
    # L0: 400 ns x 2 groups; group 0 runs 400 (lists), group 1 100 of list and 100 of Wo
    assert list_windows(build(t)) == [ListWindow("L0", 100.0, 500.0, 2, 0.75, 0.625), ListWindow("L1", 600.0, 700.0, 2, 0.5, 0.5)]
    text = summarize(t).splitlines()
    rows_out = text[text.index(next(l for l in text if l.startswith("expert windows"))) + 3 :]
    assert [r.split() for r in rows_out] == [["L0", "0.100", "0.500", "0.400", "2", "75.0", "62.5", "0.100"],
                                             ["L1", "0.600", "0.700", "0.100", "2", "50.0", "50.0", "0.050"]]
    assert list_windows(build(hand_trace())) == [] and "expert windows" not in summarize(hand_trace())
    # compared with the same program whose L0 down worker ends 100 ns later: L0's window 500 ns, busy 700 of 1000
    rec_b = rec.copy()
    rec_b[4]["globaltimer"] = (0, 0, 300, 600, 605)
    text = compare(t, _with(t, records=rec_b), ("a", "b")).splitlines()
    rows_out = text[text.index("expert windows (see the summary):") + 3 :]
    assert [r.split() for r in rows_out] == [["L0", "0.400", "0.500", "0.100", "75.0", "70.0"], ["L1", "0.100", "0.100", "0.000", "50.0", "50.0"]]
    assert "expert windows" not in compare(hand_trace(), hand_trace())


def test_waits_fall_back_to_the_producing_op():
    t = hand_trace()
    waits = {w.counter: w.total for w in counter_waits(build(_with(t, meta={"source": "model"})))}
    assert waits == {"A": 1800, NO_DEP: 400}


def test_summary_text():
    text = summarize(hand_trace())
    assert "span: 3.350 us" in text
    lines = text.splitlines()
    per_op = lines[: lines.index(next(l for l in lines if l.startswith("idle per block")))]
    op_rows = [l.split() for l in per_op if l.startswith(("A ", "B ", "C "))]
    assert [r[0] for r in op_rows] == ["A", "C", "B"]
    assert op_rows[0][:6] == ["A", "2", "2", "0.100", "1.500", "1.900"]
    assert any(l.split()[:2] == ["a", "done"] and l.split()[2:] == ["2", "1.800", "1.650"] for l in lines)
    start = lines.index(next(l for l in lines if l.startswith("critical path"))) + 3
    path = lines[start : lines.index("", start)]
    assert [p.split()[0] for p in path] == ["A[1]", "B[0]"]
    assert path[1].split()[-1] == "dependency"
    assert "critical path: 2 instructions; 3.000 us compute" in text
    start = lines.index(next(l for l in lines if l.startswith("hops of the critical path"))) + 3
    hops = lines[start : lines.index("", start)]
    assert [h.split() for h in hops] == [["B", "1", "0.150", "0.150", "0.150", "0"]]
    start = lines.index(next(l for l in lines if l.startswith("wake-ups by op"))) + 3
    wakes = lines[start : lines.index("", start)]
    assert [w.split() for w in wakes] == [["B", "1", "0.150", "0.150", "0.150", "0"], ["C", "1", "0.050", "0.050", "0.050", "0"]]


@pytest.mark.parametrize("seed", range(6))
def test_summary_invariants_on_random_traces(seed):
    trace, _ = make_trace(seed, n=50, blocks=5, groups=3)
    tl = build(trace)
    for b in block_idle(tl):
        assert b.busy + b.idle == pytest.approx(tl.span)
        assert 0 <= b.idle <= tl.span
    path = critical_path(tl)
    assert tl.t[path[-1], SIGNAL] == tl.span
    assert not trace.deps[path[0]]
    for p, q in zip(path, path[1:]):
        assert p in trace.deps[q]
        assert tl.t[p, SIGNAL] == max(tl.t[j, SIGNAL] for j in trace.deps[q])
    hops = path_hops(tl, path)
    assert sum(h.hops for h in hops) == len(path) - 1
    assert sum(h.total for h in hops) == pytest.approx(float(sum(tl.t[q, READY] - tl.t[p, SIGNAL] for p, q in zip(path, path[1:]))))
    total_wait = sum(w.total for w in counter_waits(tl))
    assert total_wait == pytest.approx(float(np.sum(tl.t[:, READY] - tl.t[:, CLAIM])))
    stats = op_stats(tl)
    assert sum(s.count for s in stats) == len(trace)


# -- perfetto -------------------------------------------------------------------


def check_chrome_trace(obj: dict, trace: Trace) -> dict[int, dict]:
    """Structural checks of a Chrome JSON trace; returns the op slice of each
    instruction."""
    json.loads(json.dumps(obj))
    evs = obj["traceEvents"]
    names: dict[tuple, str] = {}
    sorts: set[tuple] = set()
    for e in evs:
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int) and e["pid"] > 0
        if e["ph"] == "M":
            if e["name"] in ("process_name", "thread_name"):
                key = (e["pid"],) if e["name"] == "process_name" else (e["pid"], e["tid"])
                assert key not in names
                names[key] = e["args"]["name"]
            else:
                assert e["name"] in ("process_sort_index", "thread_sort_index")
                sorts.add((e["pid"],) if e["name"] == "process_sort_index" else (e["pid"], e["tid"]))
    body = [e for e in evs if e["ph"] != "M"]
    tids: dict[int, int] = {}
    for e in body:
        assert (e["pid"],) in names and (e["pid"], e["tid"]) in names, e
        assert (e["pid"],) in sorts and (e["pid"], e["tid"]) in sorts
        assert tids.setdefault(e["tid"], e["pid"]) == e["pid"], "a tid in two processes"
        assert e["ph"] in ("X", "i", "s", "f")
    # per track: time order in the file, and slices properly nested
    tracks: dict[tuple, list[dict]] = {}
    for e in body:
        tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    slices_of: dict[tuple, list[dict]] = {}
    for key, es in tracks.items():
        ts = [e["ts"] for e in es]
        assert ts == sorted(ts), f"track {key} is not in time order"
        stack: list[float] = []
        for e in es:
            if e["ph"] != "X":
                continue
            assert e["dur"] >= 0
            while stack and stack[-1] <= e["ts"] + 1e-9:
                stack.pop()
            end = e["ts"] + e["dur"]
            assert not stack or end <= stack[-1] + 1e-9, f"slice {e['name']} overlaps its enclosing slice on {key}"
            stack.append(end)
        slices_of[key] = [e for e in es if e["ph"] == "X"]
    # one op slice per instruction, preceded by its wait
    op = {}
    for e in body:
        if e["ph"] == "X" and e["cat"] == "op" and e["name"] != "release":
            i = e["args"]["instr"]
            assert i not in op
            assert e["name"] == trace.labels[i]
            op[i] = e
    # flows: one start and one end per id, each strictly inside a slice of its track
    flows: dict[int, dict[str, dict]] = {}
    for e in body:
        if e["ph"] in ("s", "f"):
            assert e["name"] == "dep" and e["cat"] == "dep"
            assert e["ph"] not in flows.setdefault(e["id"], {})
            flows[e["id"]][e["ph"]] = e
            if e["ph"] == "f":
                assert e["bp"] == "e"
    edges = set()
    for fid, pair in flows.items():
        assert set(pair) == {"s", "f"}, f"flow {fid} lacks a start or an end"
        ends = []
        for ph in ("s", "f"):
            e = pair[ph]
            inside = [s for s in slices_of[(e["pid"], e["tid"])] if s["ts"] < e["ts"] < s["ts"] + s["dur"] and s["cat"] == "op" and s["name"] != "release"]
            assert len(inside) == 1, f"flow {fid} {ph} is not inside one op slice"
            ends.append(inside[0]["args"]["instr"])
        edges.add(tuple(ends))
    return op, edges


@pytest.mark.parametrize("kind", ["model", "gpu", "gpu-noclock", "crowded"])
def test_perfetto_structure(kind, tmp_path):
    if kind == "model":
        trace, _ = make_trace(11, n=60)
    elif kind == "gpu":
        trace, _ = make_trace(12, n=60, source="gpu", clock_hz=1.98e9)
    elif kind == "gpu-noclock":
        trace, _ = make_trace(13, n=60, source="gpu")
    else:
        trace, _ = make_trace(14, n=80, blocks=2, groups=4)
    obj = perfetto_json(trace)
    op, edges = check_chrome_trace(obj, trace)
    tl = build(trace)
    assert sorted(op) == list(range(len(trace)))
    want = {(j, i) for i, d in enumerate(trace.deps) for j in d}
    assert edges == want
    for i, e in op.items():
        assert e["ts"] == pytest.approx(round(tl.t[i, READY]) / 1000, abs=1e-6)
        assert e["pid"] == tl.block[i] + 1
    waits = [e for e in obj["traceEvents"] if e.get("cat") == "wait"]
    for w in waits:
        i = w["args"]["instr"]
        assert w["ts"] + w["dur"] == pytest.approx(op[i]["ts"], abs=1e-6)
        assert w["ts"] >= round(tl.t[i, CLAIM]) / 1000 - 1e-6
    n = write_perfetto(trace, tmp_path / "t.json")
    assert n == len(obj["traceEvents"])
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"] == obj["traceEvents"]


def test_perfetto_track_names_and_lanes():
    # two instructions overlapping on one group must go to two lanes
    t = hand_trace()
    rec = t.records.copy()
    rec[3]["block"], rec[3]["group"], rec[3]["sm"] = 1, 0, 6
    obj = perfetto_json(_with(t, records=rec))
    op, _ = check_chrome_trace(obj, t)
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in obj["traceEvents"] if e["name"] == "thread_name"}
    procs = {e["pid"]: e["args"]["name"] for e in obj["traceEvents"] if e["name"] == "process_name"}
    assert procs == {1: "block 0 (SM 5)", 2: "block 1 (SM 6)"}
    assert threads[(op[1]["pid"], op[1]["tid"])] == "wg0"
    assert threads[(op[3]["pid"], op[3]["tid"])] == "wg0 lane 1"
    assert sorted(n for (p, _), n in threads.items() if p == 2) == ["claims", "loads", "wg0", "wg0 lane 1"]
    order = sorted((e["args"]["sort_index"], threads[(e["pid"], e["tid"])]) for e in obj["traceEvents"] if e["name"] == "thread_sort_index" and e["pid"] == 2)
    assert [n for _, n in order] == ["claims", "loads", "wg0", "wg0 lane 1"]


def test_perfetto_from_the_scheduler_model():
    model = pytest.importorskip("gpuvm.sim.model")
    trace = model.simulate(_small_stream(), _hardware(4)).trace
    op, edges = check_chrome_trace(perfetto_json(trace), trace)
    assert len(op) == len(trace)
    assert edges == {(j, i) for i, d in enumerate(trace.deps) for j in d}


# -- html -----------------------------------------------------------------------


def test_html_rows_on_a_known_trace():
    a, c, b = rows(build(hand_trace()))
    assert (a.name, c.name, b.name) == ("A", "C", "B")
    assert (a.start, a.end, a.blocks, a.count) == (110, 1610, 2, 2)
    assert a.start_p10 == pytest.approx(102) and a.end_p90 == pytest.approx(2018)
    assert a.load == 20 and c.load is None
    assert (c.blocks, c.start, c.end) == (1, 1200, 1700)


@pytest.mark.parametrize("seed", range(3))
def test_html_rows_are_medians_over_blocks(seed):
    trace, true = make_trace(seed, n=60, blocks=6, groups=2)
    rel = true - true[:, CLAIM].min()
    got = {r.name: r for r in rows(build(trace))}
    for name, r in got.items():
        per_block: dict[int, list[int]] = {}
        for i, label in enumerate(trace.labels):
            if op_name(label) == name:
                per_block.setdefault(int(trace.records["block"][i]), []).append(i)
        starts = [min(rel[i, READY] for i in ix) for ix in per_block.values()]
        ends = [max(rel[i, DONE] for i in ix) for ix in per_block.values()]
        loads = [min(rel[i, LOAD] for i in ix if trace.weight_bytes[i]) for ix in per_block.values() if any(trace.weight_bytes[i] for i in ix)]
        assert (r.blocks, r.count) == (len(per_block), sum(map(len, per_block.values())))
        assert (r.start, r.end) == (np.median(starts), np.median(ends))
        assert r.load == (np.median(loads) if loads else None)
        assert r.start_p10 <= r.start <= r.end <= r.end_p90


def test_html_page_is_self_contained():
    t = hand_trace()
    page = timeline_html(_with(t, labels=["A[0]", "A[1]", "</script><b>x", "C x1 y2"]))
    assert page.count("</script>") == 1
    low = page.lower()
    assert "<link" not in low and "src=" not in low and "@import" not in low and "url(http" not in low
    assert re.findall(r"https?://[^\"' ]+", page) == ["http://www.w3.org/2000/svg"] * 2
    data = json.loads(page.split("var DATA = ", 1)[1].split(";\n", 1)[0])
    assert [r["name"] for r in data["rows"]] == ["A", "C", "</script><b>x"]
    assert data["blocks"] == 2 and data["span"] == 3350


# -- cli ------------------------------------------------------------------------


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuvm: error: ") and "Traceback" not in err, err
    return lines[0]


def test_cli_writes_everything(tmp_path, capsys):
    trace, _ = make_trace(21, source="gpu", clock_hz=1.6e9)
    trace.save(tmp_path / "t.npz")
    rc = trace_main([str(tmp_path / "t.npz"), "--perfetto", str(tmp_path / "p.json"), "--html", str(tmp_path / "t.html"), "--summary"])
    out, err = capsys.readouterr()
    assert rc == 0
    assert out == summarize(Trace.load(tmp_path / "t.npz"))
    check_chrome_trace(json.loads((tmp_path / "p.json").read_text()), trace)
    assert (tmp_path / "t.html").read_text() == timeline_html(trace)
    assert "wrote" in err


def test_cli_prints_the_summary_by_default(tmp_path, capsys):
    trace, _ = make_trace(22)
    trace.save(tmp_path / "t.npz")
    assert trace_main([str(tmp_path / "t.npz")]) == 0
    assert capsys.readouterr().out == summarize(trace)


def test_cli_bad_input(tmp_path, capsys):
    trace, _ = make_trace(23)
    good = tmp_path / "t.npz"
    trace.save(good)
    (tmp_path / "noise.npz").write_bytes(np.random.default_rng(0).bytes(5000))
    (tmp_path / "half.npz").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    np.savez(tmp_path / "other.npz", x=np.arange(3))
    cases = {
        "missing": [str(tmp_path / "nope.npz")],
        "noise": [str(tmp_path / "noise.npz")],
        "truncated": [str(tmp_path / "half.npz")],
        "other": [str(tmp_path / "other.npz")],
        "directory": [str(tmp_path)],
        "usage": [str(good), "--bogus"],
        "no file": [],
        "unwritable": [str(good), "--perfetto", str(tmp_path / "no" / "dir" / "p.json")],
        "against another program": [str(good), "--against", str(tmp_path / "small.npz")],
    }
    make_trace(24, n=12)[0].save(tmp_path / "small.npz")
    for name, argv in cases.items():
        rc = trace_main(argv)
        line = _one_error_line(capsys.readouterr().err)
        assert rc == 2, name
        if name == "missing":
            assert "no trace file at" in line


def test_op_diff_on_a_known_pair():
    """b: A[1] finishes 400 ns later on block 0, so B[0] (which waits on it) runs 400 later."""
    a = hand_trace()
    rec = a.records.copy()
    rec[1]["block"] = 0
    for i, d in ((1, 400), (2, 400)):
        gt = rec[i]["globaltimer"].astype(np.int64)
        gt[[DONE, SIGNAL] if i == 1 else [READY, DONE, SIGNAL]] += d
        rec[i]["globaltimer"] = gt
    b = Trace(records=rec, labels=a.labels, opcodes=a.opcodes, deps=a.deps, weight_bytes=a.weight_bytes, act_bytes=a.act_bytes, meta=dict(a.meta))
    da, dc, db = op_diff(build(a), build(b))
    assert (da.name, da.count, da.blocks, da.busiest) == ("A", (2, 2), (2, 1), (1, 2))
    assert da.last_done == (2120, 2520) and da.phase == (2020, 2420) and da.run_median == (1500, 1700)
    assert db.first_ready == (2300, 2700) and db.last_done == (3300, 3700) and db.phase == (1000, 1000)
    assert dc.last_done == (1700, 1700) and dc.blocks == (1, 1)
    text = compare(a, b, ("dyn", "static"))
    assert "span 3.350 us" in text and "span 3.750 us" in text and "(1.119 of dyn)" in text
    assert re.search(r"^B\s+1/1\s+1/1\s+1/1\s+2\.300\s+2\.700\s+3\.300\s+3\.700\s+0\.400\s", text, re.M)


def test_compare_with_itself_is_level_and_refuses_other_programs():
    t, _ = make_trace(25)
    assert all(d.last_done[0] == d.last_done[1] and d.count[0] == d.count[1] for d in op_diff(build(t), build(t)))
    assert "(1.000 of a)" in compare(t, t)
    with pytest.raises(ValueError, match="different programs"):
        compare(t, make_trace(26, n=12)[0])


def test_cli_against(tmp_path, capsys):
    t, _ = make_trace(27)
    t.save(tmp_path / "a.npz")
    t.save(tmp_path / "b.npz")
    assert trace_main([str(tmp_path / "a.npz"), "--against", str(tmp_path / "b.npz")]) == 0
    assert capsys.readouterr().out == compare(t, Trace.load(tmp_path / "b.npz"), ("this", "other"))


def test_cli_as_a_process_never_dumps_a_traceback(tmp_path):
    (tmp_path / "bad.npz").write_bytes(b"PK\x03\x04 not really a zip")
    r = subprocess.run([sys.executable, "-m", "gpuvm.trace.cli", str(tmp_path / "bad.npz")], capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2
    _one_error_line(r.stderr)


# -- the trace file round trip and for_stream ----------------------------------------


def test_saved_trace_gives_the_same_tools_output(tmp_path):
    trace, _ = make_trace(31, source="gpu", clock_hz=1.7e9)
    trace.save(tmp_path / "t.npz")
    back = Trace.load(tmp_path / "t.npz")
    assert summarize(back) == summarize(trace)
    assert perfetto_json(back) == perfetto_json(trace)


def _small_stream():
    from gpuvm.isa import DType, Op
    from gpuvm.program import Program

    p = Program("trace-tools")
    x = p.tensor("x", (4, 256), DType.BF16)
    w = p.tensor("w", (512, 256), DType.BF16, role="weight")
    h = p.tensor("h", (4, 512), DType.BF16)
    w2 = p.tensor("w2", (256, 512), DType.BF16, role="weight")
    y = p.tensor("y", (4, 256), DType.F32)
    up = p.counter("h ready")
    for k in range(8):
        p.op(Op.GEMM, [h, x, w], [k * 64, 64], signal=up, prefetch=(w, k * 64 * 512, 64 * 512), label=f"up[{k}]")
    for k in range(4):
        p.op(Op.GEMM, [y, h, w2], [k * 64, 64], waits=[up], prefetch=(w2, k * 64 * 1024, 64 * 1024), label=f"down[{k}]")
    return p.build()


def _hardware(blocks: int):
    from gpuvm.sim.hardware import Hardware

    return Hardware(n_blocks=blocks)


def test_for_stream_names_the_signal_counters():
    stream = _small_stream()
    rec = np.zeros(len(stream), dtype=TRACE_DTYPE)
    trace = Trace.for_stream(stream, rec, {"source": "gpu"})
    assert trace.meta["signal_counter"] == ["h ready" if o.signal is not None else "" for o in stream.ops]
    assert sorted(set(trace.meta["signal_counter"])) == ["", "h ready"]
    assert Trace.for_stream(stream, rec, {"signal_counter": ["x"] * len(stream)}).meta["signal_counter"] == ["x"] * len(stream)


def test_perfetto_draws_one_arrow_for_wide_fan_in() -> None:
    """An op waiting on more than MAX_FLOWS ops gets one arrow, from the
    dependency that signalled last; narrow ops keep an arrow per edge."""
    from gpuvm import DType, Op, Program
    from gpuvm.sim import simulate
    from gpuvm.trace.perfetto import MAX_FLOWS, SIGNAL, perfetto_json

    p = Program("fan-in")
    x = p.tensor("x", (64,), DType.F32)
    wide, narrow = p.counter("wide"), p.counter("narrow")
    for i in range(MAX_FLOWS + 5):
        p.op(Op.SLEEP, [], [100 * (i + 1)], signal=wide, label=f"w[{i}]")
    p.op(Op.NOP, [], [], waits=[wide], signal=narrow, label="join")
    p.op(Op.COPY, [x, x], [0, 64], waits=[narrow], label="after")
    stream = p.build()
    tr = simulate(stream, durations=[float(100 * (i + 1)) for i in range(len(stream))]).trace
    flows = [e for e in perfetto_json(tr)["traceEvents"] if e["ph"] == "s"]
    join = stream.labels.index("join")
    last = max(stream.deps[join], key=lambda j: int(tr.records["globaltimer"][j, SIGNAL]))
    assert len(flows) == 2  # join <- its last signaller, after <- join
    assert any(e["args"]["instr"] == join and e["args"]["deps"] == f"{MAX_FLOWS + 5} ops" for e in perfetto_json(tr)["traceEvents"] if e.get("cat") == "op" and e["name"] == "join")
    assert last in stream.deps[join]
