"""Text summary of a trace: per-op times and bandwidth, idle time per block,
dependency waits per counter, the critical path; and two traces of the same
program compared op by op (e.g. dynamic against static).

Definitions (times from the Timeline, ns):
- wait = claim -> ready; run = ready -> done (compute).
- bandwidth of an instruction = (weight + activation bytes) / (done - start),
  start being its weight-load issue if it loaded weights, else its ready;
  "span" bandwidth = an op's bytes over its first start to its last done.
- idle of a block = the trace's span (first claim to last signal) minus the
  union of its groups' run intervals.
- a wait is charged to the counter of the dependency that signalled last
  (of those gating_deps keeps, up to its ready); the rest of claim -> ready, when no dependency was still
  pending, to "(no pending dependency)". Counters are named by the trace's
  meta "signal_counter" (one name per instruction) or else by the op that
  signals them.
- the critical path walks back from the last signal, each time to the
  dependency whose signal was latest among those done by the instruction's
  ready (Timeline.gating_deps: a work list's late workers held nothing back).
- a hop of the critical path = its consumer's ready minus its producer's
  signal stamp (taken just after the signal's release, so a hop can be a
  stamp's error below 0); hops are totalled by the consumer's op kind (its
  op without a layer prefix "L<n>.", so a step's 62 layers add up), with how
  many had their consumer claimed only after that signal (a hop the claim,
  not the hand-off, made long).
- a wake-up = an instruction's ready minus the signal of the dependency that
  released it (the latest of gating_deps), for every instruction claimed
  before that signal (so the claim did not hold it back): how long the
  scheduler took to start what was waiting, totalled by op kind as hops are,
  with how many took more than WAKE_SLOW_NS (on the H200 a claim parked in a
  group wakes in ~0.5 us, one the controller holds in ~2.2: NOTES.md session 14).
- a held claim = claim to ready of an instruction claimed after the signal
  that released it (or with no dependency), the complement of the wake-ups:
  its inputs were there when its block took it, so what it waited for was a
  group of that block (a claim taken ahead while both were busy), totalled
  by op kind, with how many took more than HELD_SLOW_NS (a claim that finds a
  group free starts in ~1-2 us: the claim's atomic, its record, the hand-off).
- a work list's tail = the LIST_TAIL workers of an expert list (EXPERT_UP /
  EXPERT_DOWN instructions of one op) that finished last: their median run,
  and on how many SMs they ran, how many of those SMs ran two of them (an SM's
  two groups that took the list's two slowest items side by side: NOTES.md
  session 50, sliding-c16-t1).
- a layer's expert window = its first expert-list instruction's ready to its
  last one's done (lists of ops with a layer prefix "L<n>." only: the code
  warmer's lead instances, "W.", are not a layer's); how busy every warp group
  of the trace was in it (the union of its runs, any op's, clipped to the
  window) and how much of that the lists took. Busy near 100% says the window
  is the lists' throughput, not their tails or dependencies (a down item's
  wait for its expert's up rows counts as busy: it waits inside the op).
- an op's floor = its bytes over the streaming-read bandwidth (the trace's
  meta "read_bw_TBps", measured in the run that wrote it, else MUSE.md's
  nominal 4.42 TB/s, or what the caller gives); "span / floor" is how far the
  op, from its first start to its last done, is from moving its bytes at that
  bandwidth.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..isa import Op
from .format import Trace
from .timeline import CLAIM, DONE, READY, SIGNAL, Timeline, build, members, op_order

NO_DEP = "(no pending dependency)"
WAKE_SLOW_NS = 1500.0
HELD_SLOW_NS = 3000.0
NOMINAL_BW_TBPS = 4.42  # MUSE.md: streaming read on the H200
LIST_TAIL = 8  # the last workers of a work list that list_tails looks at
LIST_OPCODES = (int(Op.EXPERT_UP), int(Op.EXPERT_DOWN))


@dataclass(frozen=True)
class OpStats:
    name: str
    count: int
    blocks: int
    wait_median: float  # ns
    run_median: float
    run_p90: float
    bytes: int
    gbps_median: float | None  # GB/s per instruction, median; None without bytes
    gbps_span: float | None
    span: float  # ns, first start (of its loads: the loader's prefetch, if any) to last done
    phase: float  # ns, first ready to last done: the op once its inputs were there (overlap with other ops included)


@dataclass(frozen=True)
class OpDiff:
    """One op in two traces (a, b); count 0 and NaN times where it did not run."""

    name: str
    count: tuple[int, int]
    blocks: tuple[int, int]
    busiest: tuple[int, int]  # most of its instructions that one block ran
    first_ready: tuple[float, float]  # ns from the trace's first claim
    last_done: tuple[float, float]
    phase: tuple[float, float]
    run_median: tuple[float, float]


@dataclass(frozen=True)
class BlockIdle:
    block: int
    sm: int
    count: int
    busy: float  # ns
    idle: float


@dataclass(frozen=True)
class CounterWait:
    counter: str
    waits: int  # instructions that waited on it
    total: float  # ns
    longest: float


@dataclass(frozen=True)
class PathHops:
    op: str  # the consumer's op kind
    hops: int
    median: float  # ns
    p90: float
    total: float
    claimed_late: int  # consumers claimed after their producer's signal


@dataclass(frozen=True)
class ListTail:
    op: str
    workers: int  # that ran
    run_median: float  # ns, of all its workers
    tail_run_median: float  # ns, of the LIST_TAIL that finished last
    tail_sms: int  # SMs those ran on
    tail_doubled: int  # of those SMs, how many ran two or more of them
    end_spread: float  # ns from the median worker's end to the last one's: the list's tail itself


@dataclass(frozen=True)
class ListWindow:
    layer: str  # "L3": the lists' layer prefix
    start: float  # ns: first ready of the layer's list instructions
    end: float  # ns: their last done
    groups: int  # warp groups that ran anything in the trace
    busy: float  # share of groups x window in any op's run
    lists: float  # share of groups x window in the lists' runs


@dataclass(frozen=True)
class WakeUps:
    op: str  # op kind
    count: int
    median: float  # ns
    p90: float
    longest: float
    slow: int  # wake-ups over WAKE_SLOW_NS


def op_stats(tl: Timeline) -> list[OpStats]:
    """One entry per op, in order of first start."""
    groups = members(tl)
    out = []
    for name in op_order(tl):
        idx = groups[name]
        t = tl.t[idx]
        run = t[:, DONE] - t[:, READY]
        nbytes = tl.trace.weight_bytes[idx] + tl.trace.act_bytes[idx]
        start = np.array([tl.transfer_start(int(i)) for i in idx])
        moved = t[:, DONE] - start
        ok = (nbytes > 0) & (moved > 0)
        span = float(t[:, DONE].max() - start.min())
        total = int(nbytes.sum())
        out.append(
            OpStats(
                name=name,
                count=len(idx),
                blocks=len(np.unique(tl.block[idx])),
                wait_median=float(np.median(t[:, READY] - t[:, CLAIM])),
                run_median=float(np.median(run)),
                run_p90=float(np.percentile(run, 90)),
                bytes=total,
                gbps_median=float(np.median(nbytes[ok] / moved[ok])) if ok.any() else None,
                gbps_span=total / span if total and span > 0 else None,
                span=span,
                phase=float(t[:, DONE].max() - t[:, READY].min()),
            )
        )
    return out


def op_diff(a: Timeline, b: Timeline) -> list[OpDiff]:
    """The ops of two timelines side by side: a's in order of first start, then
    those only b ran, in b's order."""
    ga, gb = members(a), members(b)
    names = op_order(a) + [n for n in op_order(b) if n not in ga]

    def one(tl: Timeline, idx: np.ndarray | None) -> tuple[int, int, int, float, float, float, float]:
        if idx is None:
            return 0, 0, 0, np.nan, np.nan, np.nan, np.nan
        t = tl.t[idx]
        per_block = np.unique(tl.block[idx], return_counts=True)[1]
        return (len(idx), len(per_block), int(per_block.max()), float(t[:, READY].min()), float(t[:, DONE].max()),
                float(t[:, DONE].max() - t[:, READY].min()), float(np.median(t[:, DONE] - t[:, READY])))

    out = []
    for n in names:
        x, y = one(a, ga.get(n)), one(b, gb.get(n))
        out.append(OpDiff(n, *((x[k], y[k]) for k in range(7))))  # type: ignore[arg-type]
    return out


def compare(a: Trace, b: Trace, names: tuple[str, str] = ("a", "b")) -> str:
    """Two traces of one program (e.g. dynamic and static) op by op: when each op
    first got ready and last finished, its phase and median run, and on how many
    blocks it ran; `done b-a` shows where the gap between the two opens. Then
    each layer's expert window in both (list_windows)."""
    if len(a) != len(b) or a.labels != b.labels:
        raise ValueError(f"the traces are of different programs ({len(a)} and {len(b)} instructions)")
    ta, tb = build(a), build(b)
    na, nb = names
    rows = []
    for d in op_diff(ta, tb):
        rows.append([d.name, f"{d.count[0]}/{d.count[1]}", f"{d.blocks[0]}/{d.blocks[1]}", f"{d.busiest[0]}/{d.busiest[1]}",
                     _us(d.first_ready[0]), _us(d.first_ready[1]), _us(d.last_done[0]), _us(d.last_done[1]),
                     _us(d.last_done[1] - d.last_done[0]), _us(d.phase[0]), _us(d.phase[1]), _us(d.run_median[0]), _us(d.run_median[1])])
    table = _table(["op", "count", "blocks", "most on a block", f"ready {na} us", f"ready {nb} us", f"done {na} us", f"done {nb} us",
                    f"done {nb}-{na} us", f"phase {na} us", f"phase {nb} us", f"run med {na} us", f"run med {nb} us"], rows)
    head = [f"{na}: {a.meta.get('mode', '?')} mode, span {_us(ta.span)} us; {nb}: {b.meta.get('mode', '?')} mode, span {_us(tb.span)} us "
            f"({tb.span / ta.span:.3f} of {na}); times from each trace's first claim; count, blocks and most on a block as {na}/{nb}"]
    wb = {w.layer: w for w in list_windows(tb)}
    pairs = [(w, wb[w.layer]) for w in list_windows(ta) if w.layer in wb]
    windows = _table(["layer", f"window {na} us", f"window {nb} us", f"{nb}-{na} us", f"busy {na} %", f"busy {nb} %"],
                     [[x.layer, _us(x.end - x.start), _us(y.end - y.start), _us((y.end - y.start) - (x.end - x.start)),
                       f"{100 * x.busy:.1f}", f"{100 * y.busy:.1f}"] for x, y in pairs])
    return "\n".join(head + [table] + (["", "expert windows (see the summary):", windows] if pairs else [])) + "\n"


def _union_length(intervals: np.ndarray) -> float:
    total, end = 0.0, -np.inf
    for a, b in intervals[np.argsort(intervals[:, 0])]:
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def block_idle(tl: Timeline) -> list[BlockIdle]:
    span = tl.span
    out = []
    for b in np.unique(tl.block[tl.ran]):
        idx = np.flatnonzero(tl.ran & (tl.block == b))
        busy = _union_length(tl.t[idx][:, [READY, DONE]])
        out.append(BlockIdle(int(b), int(tl.sm[idx[0]]), len(idx), busy, span - busy))
    return out


def _counter_names(tl: Timeline) -> list[str]:
    names = tl.trace.meta.get("signal_counter")
    if isinstance(names, list) and len(names) == len(tl):
        return [str(s) or tl.ops[i] for i, s in enumerate(names)]
    return tl.ops


def _latest_dep(tl: Timeline, i: int) -> int | None:
    deps = tl.gating_deps(i)
    return max(deps, key=lambda j: (tl.t[j, SIGNAL], j)) if deps else None


def counter_waits(tl: Timeline) -> list[CounterWait]:
    """Claim -> ready time charged to counters, largest total first."""
    names = _counter_names(tl)
    acc: dict[str, list[float]] = {}
    for i in np.flatnonzero(tl.ran):
        claim, ready = tl.t[i, CLAIM], tl.t[i, READY]
        j = _latest_dep(tl, int(i))
        dep = 0.0 if j is None else float(np.clip(tl.t[j, SIGNAL] - claim, 0.0, ready - claim))
        if dep > 0:
            acc.setdefault(names[j], []).append(dep)
        if ready - claim - dep > 0:
            acc.setdefault(NO_DEP, []).append(float(ready - claim - dep))
    out = [CounterWait(k, len(v), float(sum(v)), float(max(v))) for k, v in acc.items()]
    return sorted(out, key=lambda c: (-c.total, c.counter))


def critical_path(tl: Timeline) -> list[int]:
    """Instructions of the critical path, first to last."""
    ran = np.flatnonzero(tl.ran)
    i: int | None = int(ran[np.argmax(tl.t[ran, SIGNAL])])
    path = []
    while i is not None:
        path.append(i)
        i = _latest_dep(tl, i)
    return path[::-1]


def op_kind(op: str) -> str:
    """An op without its layer prefix: "L12.wqkvg" -> "wqkvg"."""
    head, dot, rest = op.partition(".")
    return rest if dot and len(head) > 1 and head[0] == "L" and head[1:].isdigit() else op


def path_hops(tl: Timeline, path: list[int]) -> list[PathHops]:
    """The critical path's hops (producer's signal -> consumer's ready) by the
    consumer's op kind, largest total first."""
    acc: dict[str, list[tuple[float, bool]]] = {}
    for a, b in zip(path, path[1:]):
        acc.setdefault(op_kind(tl.ops[b]), []).append((float(tl.t[b, READY] - tl.t[a, SIGNAL]), bool(tl.t[b, CLAIM] > tl.t[a, SIGNAL])))
    out = []
    for op, v in acc.items():
        h = np.array([x for x, _ in v])
        out.append(PathHops(op, len(v), float(np.median(h)), float(np.percentile(h, 90)), float(h.sum()), sum(late for _, late in v)))
    return sorted(out, key=lambda x: (-x.total, x.op))


def wake_ups(tl: Timeline) -> list[WakeUps]:
    """Signal-to-ready of every instruction claimed before the signal that
    released it, by op kind, largest total first."""
    acc: dict[str, list[float]] = {}
    for i in np.flatnonzero(tl.ran):
        j = _latest_dep(tl, int(i))
        if j is not None and tl.t[i, CLAIM] <= tl.t[j, SIGNAL]:
            acc.setdefault(op_kind(tl.ops[i]), []).append(float(tl.t[i, READY] - tl.t[j, SIGNAL]))
    return _by_total(acc, WAKE_SLOW_NS)


def held_claims(tl: Timeline) -> list[WakeUps]:
    """Claim-to-ready of every instruction claimed after the signal that
    released it (or with no dependency), by op kind, largest total first;
    `slow` counts those over HELD_SLOW_NS."""
    acc: dict[str, list[float]] = {}
    for i in np.flatnonzero(tl.ran):
        j = _latest_dep(tl, int(i))
        if j is None or tl.t[i, CLAIM] > tl.t[j, SIGNAL]:
            acc.setdefault(op_kind(tl.ops[i]), []).append(float(tl.t[i, READY] - tl.t[i, CLAIM]))
    return _by_total(acc, HELD_SLOW_NS)


def _by_total(acc: dict[str, list[float]], slow_ns: float) -> list[WakeUps]:
    """Per op kind: count, median, p90, longest and how many over slow_ns, largest total first."""
    out = []
    for op, v in acc.items():
        w = np.array(v)
        out.append((float(w.sum()), WakeUps(op, len(v), float(np.median(w)), float(np.percentile(w, 90)), float(w.max()), int((w > slow_ns).sum()))))
    return [x for _, x in sorted(out, key=lambda x: (-x[0], x[1].op))]


def list_tails(tl: Timeline, last: int = LIST_TAIL) -> list[ListTail]:
    """The work lists' last workers (see the module notes), in op order."""
    groups = members(tl)
    out = []
    for name in op_order(tl):
        idx = groups[name]
        if int(tl.trace.opcodes[idx[0]]) not in LIST_OPCODES:
            continue
        done = tl.t[idx, DONE]
        run = done - tl.t[idx, READY]
        tail = np.argsort(-done, kind="stable")[:last]
        _, per_sm = np.unique(tl.sm[idx[tail]], return_counts=True)
        out.append(ListTail(name, len(idx), float(np.median(run)), float(np.median(run[tail])), len(per_sm), int((per_sm >= 2).sum()),
                            float(done.max() - np.median(done))))
    return out


def list_windows(tl: Timeline) -> list[ListWindow]:
    """Each layer's expert window (see the module notes), in order of start."""
    ran = np.flatnonzero(tl.ran)
    by_layer: dict[str, list[int]] = {}
    for i in ran[np.isin(tl.trace.opcodes[ran], LIST_OPCODES)]:
        if op_kind(tl.ops[i]) != tl.ops[i]:  # a layer's list ("L<n>."), not the code warmer's ("W.")
            by_layer.setdefault(tl.ops[i].partition(".")[0], []).append(int(i))
    if not by_layer:
        return []
    key = tl.block * (int(tl.group[ran].max()) + 1) + tl.group  # one number a warp group
    n_groups = len(np.unique(key[ran]))

    def share(idx: np.ndarray, a: float, b: float) -> float:
        """Of n_groups x [a, b], the share in the runs of instructions idx."""
        idx = idx[(tl.t[idx, DONE] > a) & (tl.t[idx, READY] < b)]
        iv, k = np.clip(tl.t[idx][:, [READY, DONE]], a, b), key[idx]
        return float(sum(_union_length(iv[k == g]) for g in np.unique(k)) / (n_groups * (b - a))) if b > a else 0.0

    out = []
    for name, idx in by_layer.items():
        mine = np.array(idx)
        a, b = float(tl.t[mine, READY].min()), float(tl.t[mine, DONE].max())
        out.append(ListWindow(name, a, b, n_groups, share(ran, a, b), share(mine, a, b)))
    return sorted(out, key=lambda w: (w.start, w.layer))


def _table(headers: list[str], rows: list[list[str]]) -> str:
    w = [max(len(h), *(len(r[k]) for r in rows)) if rows else len(h) for k, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.ljust(w[0]) if k == 0 else c.rjust(w[k]) for k, c in enumerate(cells)).rstrip()
    return "\n".join([line(headers), line(["-" * x for x in w])] + [line(r) for r in rows])


def _us(ns: float) -> str:
    return f"{ns / 1000:.3f}"


def _gbps(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def summarize(trace: Trace, read_bw_tbps: float | None = None) -> str:
    """The whole text summary of a trace; read_bw_tbps: the bandwidth of the
    ops' floors (default: the trace's own measurement, else nominal)."""
    tl = build(trace)
    n_ran = int(tl.ran.sum())
    blocks = block_idle(tl)
    meta = trace.meta
    bw, bw_from = read_bw_tbps, "given"
    if bw is None:
        bw, bw_from = (float(meta["read_bw_TBps"]), "measured in the run") if "read_bw_TBps" in meta else (NOMINAL_BW_TBPS, "nominal, MUSE.md")
    if not bw > 0:
        raise ValueError(f"the read bandwidth must be > 0 TB/s, not {bw}")
    head = [
        f"trace: {meta.get('source', 'unknown')} source" + "".join(f", {k} {meta[k]}" for k in ("device", "mode", "step") if k in meta),
        f"times: {tl.clock}",
        f"instructions: {n_ran} ran of {len(trace)}, {len(blocks)} blocks, {len(np.unique(tl.group[tl.ran]))} warp groups",
        f"span: {_us(tl.span)} us (first claim to last signal)",
    ]

    ops = op_stats(tl)
    op_rows = []
    for o in ops:
        floor = o.bytes / (bw * 1e3)  # ns: bytes / (TB/s) = 1e-12 s per byte
        op_rows.append([o.name, str(o.count), str(o.blocks), _us(o.wait_median), _us(o.run_median), _us(o.run_p90), f"{o.bytes / 1e6:.3f}",
                        _gbps(o.gbps_median), _gbps(o.gbps_span), _us(o.span), _us(o.phase), _us(floor),
                        f"{o.span / floor:.1f}" if floor > 0 else "-", f"{o.phase / floor:.1f}" if floor > 0 else "-"])
    op_table = _table(["op", "count", "blocks", "wait med us", "run med us", "run p90 us", "MB", "GB/s med", "GB/s span", "span us",
                       "phase us", "floor us", "span/floor", "phase/floor"], op_rows)

    idle_rows = [[str(b.block), str(b.sm), str(b.count), _us(b.busy), _us(b.idle), f"{100 * b.idle / tl.span:.1f}" if tl.span > 0 else "-"] for b in blocks]
    mean_idle = sum(b.idle for b in blocks) / len(blocks)
    idle_table = _table(["block", "sm", "instrs", "busy us", "idle us", "idle %"], idle_rows)

    waits = counter_waits(tl)
    wait_table = _table(["counter", "waits", "total us", "longest us"], [[c.counter, str(c.waits), _us(c.total), _us(c.longest)] for c in waits])

    path = critical_path(tl)
    t = tl.t
    path_rows = []
    for k, i in enumerate(path):
        p = path[k - 1] if k else None
        bound = "start" if p is None else ("dependency" if t[p, SIGNAL] > t[i, CLAIM] else "claim")
        path_rows.append(
            [trace.labels[i], f"{tl.block[i]}/{tl.group[i]}", _us(t[i, CLAIM]), _us(t[i, READY]), _us(t[i, DONE]), _us(t[i, SIGNAL]), bound]
        )
    run = sum(t[i, DONE] - t[i, READY] for i in path)
    release = sum(t[i, SIGNAL] - t[i, DONE] for i in path)
    hops = path_hops(tl, path)
    handoff = sum(h.total for h in hops)
    path_table = _table(["instruction", "block/wg", "claim us", "ready us", "done us", "signal us", "bound by"], path_rows)
    hop_table = _table(["into op", "hops", "median us", "p90 us", "total us", "claimed after the signal"],
                       [[h.op, str(h.hops), _us(h.median), _us(h.p90), _us(h.total), str(h.claimed_late)] for h in hops])
    wake_table = _table(["op", "wake-ups", "median us", "p90 us", "longest us", f"over {_us(WAKE_SLOW_NS)} us"],
                        [[w.op, str(w.count), _us(w.median), _us(w.p90), _us(w.longest), str(w.slow)] for w in wake_ups(tl)])
    held_table = _table(["op", "held", "median us", "p90 us", "longest us", f"over {_us(HELD_SLOW_NS)} us"],
                        [[w.op, str(w.count), _us(w.median), _us(w.p90), _us(w.longest), str(w.slow)] for w in held_claims(tl)])
    tails = list_tails(tl)
    tail_table = _table(["op", "workers", "run med us", "tail run med us", "tail SMs", "SMs with two", "last end after median us"],
                        [[x.op, str(x.workers), _us(x.run_median), _us(x.tail_run_median), str(x.tail_sms), str(x.tail_doubled),
                          _us(x.end_spread)] for x in tails])
    windows = list_windows(tl)
    window_table = _table(["layer", "start us", "end us", "window us", "groups", "busy %", "lists %", "idle us a group"],
                          [[w.layer, _us(w.start), _us(w.end), _us(w.end - w.start), str(w.groups), f"{100 * w.busy:.1f}",
                            f"{100 * w.lists:.1f}", _us((1 - w.busy) * (w.end - w.start))] for w in windows])

    return "\n".join(
        head
        + ["", f"per op (in order of first start; floor at {bw:.2f} TB/s, {bw_from}):", op_table]
        + ["", f"idle per block (mean {_us(mean_idle)} us):", idle_table]
        + ["", "waiting per counter (claim to ready):", wait_table]
        + [
            "",
            f"critical path: {len(path)} instructions; {_us(run)} us compute, {_us(release)} us compute end to signal, "
            f"{_us(handoff)} us from a producer's signal to its consumer's ready, {_us(t[path[0], READY])} us before the first ready",
            path_table,
            "",
            "hops of the critical path by the op they lead into (producer's signal to consumer's ready):",
            hop_table,
            "",
            "wake-ups by op (the releasing signal to ready, of every instruction claimed before it):",
            wake_table,
            "",
            "held claims by op (claim to ready, of every instruction claimed after its releasing signal):",
            held_table,
        ]
        + (["", f"work list tails (the {LIST_TAIL} workers of each expert list to finish last, and the SMs they ran on):", tail_table]
           if tails else [])
        + (["", "expert windows (a layer's first list instruction ready to its last done; its warp groups' runs in it):", window_table]
           if windows else [])
    ) + "\n"
