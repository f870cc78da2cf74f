"""Export a trace as Chrome JSON (traceEvents), the format ui.perfetto.dev opens.

One process per block ("block B (SM S)"), and in it one thread per warp group
plus a "claims" and a "loads" track of instant events. On a group's track each
instruction is a "wait" slice (from its claim, or from when the group became
free, to ready) followed by the op's slice (ready to signal, with a nested
"release" slice from compute end to signal). Instructions whose slices would
overlap on one group go to extra lanes of that group, so every track holds
properly nested slices. Each dependency is a flow arrow from the producer's
signal to the consumer's ready; an op with more than MAX_FLOWS dependencies
(an expert tile waits on every router tile) gets one arrow, from the
dependency that signalled last: the one it actually waited for. All edges of
a full layer would be over a million arrows and hundreds of MB of JSON.

Timestamps are microseconds with nanosecond decimals. Process and thread ids
are integers, thread ids unique across processes (Perfetto keys threads by
tid), and sort-index metadata orders the tracks.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .format import Trace
from .timeline import CLAIM, DONE, LOAD, READY, SIGNAL, Timeline, build

#: an op slice is drawn at least this long (ns) so that its flow points lie
#: strictly inside it; Perfetto binds a flow to the slice open at its time
MIN_SLICE_NS = 2

#: dependencies drawn per op before only the last-signalled one is drawn
MAX_FLOWS = 8


def _drawn_deps(trace: Trace, tl: Timeline, ns: np.ndarray, i: int) -> list[int]:
    deps = tl.gating_deps(i)
    if len(deps) <= MAX_FLOWS:
        return deps
    return [max(deps, key=lambda j: int(ns[j, SIGNAL]))]


def _us(ns: int) -> float:
    return round(ns / 1000.0, 3)


def _lanes(tl: Timeline, ns: np.ndarray) -> dict[int, int]:
    """Lane of each instruction that ran, per (block, group): the first lane
    whose last slice ended by the instruction's ready."""
    lane: dict[int, int] = {}
    by_track: dict[tuple[int, int], list[int]] = {}
    for i in np.flatnonzero(tl.ran):
        by_track.setdefault((int(tl.block[i]), int(tl.group[i])), []).append(int(i))
    for idx in by_track.values():
        idx.sort(key=lambda i: (ns[i, READY], i))
        ends: list[int] = []
        for i in idx:
            k = next((k for k, e in enumerate(ends) if e <= ns[i, READY]), len(ends))
            if k == len(ends):
                ends.append(0)
            lane[i] = k
            ends[k] = _op_end(ns, i)
    return lane


def _op_end(ns: np.ndarray, i: int) -> int:
    return int(max(ns[i, SIGNAL], ns[i, READY] + MIN_SLICE_NS))


def perfetto_json(trace: Trace) -> dict:
    """The Chrome JSON trace object ({"traceEvents": [...], ...}) of a trace."""
    tl = build(trace)
    ns = np.where(np.isnan(tl.t), 0, np.rint(tl.t)).astype(np.int64)
    lane = _lanes(tl, ns)
    ran = [int(i) for i in np.flatnonzero(tl.ran)]

    # tracks: per block, claims, loads, then (group, lane) in order
    tracks: dict[int, list[tuple]] = {}
    for i in ran:
        tracks.setdefault(int(tl.block[i]), []).append(("wg", int(tl.group[i]), lane[i]))
    stride = 100
    while stride < 2 + max(len(set(v)) for v in tracks.values()):
        stride *= 10
    tid: dict[tuple, int] = {}
    meta: list[dict] = []
    for b in sorted(tracks):
        pid = b + 1
        sm = int(tl.sm[next(i for i in ran if tl.block[i] == b)])
        # process metadata on the block's first thread: Perfetto makes a thread
        # of every (pid, tid) it sees, and reads tid 0 as tid = pid
        meta.append({"ph": "M", "name": "process_name", "pid": pid, "tid": pid * stride, "args": {"name": f"block {b} (SM {sm})"}})
        meta.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": pid * stride, "args": {"sort_index": b}})
        keys = [("claims",), ("loads",)] + sorted(set(tracks[b]))
        for k, key in enumerate(keys):
            t = pid * stride + k
            tid[(b,) + key] = t
            name = key[0] if len(key) == 1 else f"wg{key[1]}" + (f" lane {key[2]}" if key[2] else "")
            meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": t, "args": {"name": name}})
            meta.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": t, "args": {"sort_index": k}})

    events: list[dict] = []
    lane_end: dict[tuple, int] = {}
    op_track: dict[int, tuple[int, int]] = {}
    for i in sorted(ran, key=lambda i: (ns[i, READY], i)):
        b = int(tl.block[i])
        pid = b + 1
        track = (b, "wg", int(tl.group[i]), lane[i])
        t = tid[track]
        op_track[i] = (pid, t)
        c, r, d, s = (int(ns[i, k]) for k in (CLAIM, READY, DONE, SIGNAL))
        end = _op_end(ns, i)
        label = trace.labels[i]
        args = {
            "instr": i,
            "op": tl.ops[i],
            "claim_us": _us(c),
            "ready_us": _us(r),
            "done_us": _us(d),
            "signal_us": _us(s),
            "bytes": int(trace.weight_bytes[i] + trace.act_bytes[i]),
            "deps": list(trace.deps[i]) if len(trace.deps[i]) <= MAX_FLOWS else f"{len(trace.deps[i])} ops",
        }
        if tl.has_load[i]:
            args["load_us"] = _us(int(ns[i, LOAD]))
        w0 = max(c, lane_end.get(track, c))
        if r > w0:
            events.append({"ph": "X", "name": "wait", "cat": "wait", "pid": pid, "tid": t, "ts": _us(w0), "dur": _us(r - w0), "args": {"instr": i, "for": label, "claim_us": _us(c)}})
        events.append({"ph": "X", "name": label, "cat": "op", "pid": pid, "tid": t, "ts": _us(r), "dur": _us(end - r), "args": args})
        if d > r and s > d:
            events.append({"ph": "X", "name": "release", "cat": "op", "pid": pid, "tid": t, "ts": _us(d), "dur": _us(s - d), "args": {"instr": i}})
        lane_end[track] = end
        events.append({"ph": "i", "s": "t", "name": label, "cat": "claim", "pid": pid, "tid": tid[(b, "claims")], "ts": _us(c), "args": {"instr": i}})
        if tl.has_load[i]:
            events.append({"ph": "i", "s": "t", "name": label, "cat": "load", "pid": pid, "tid": tid[(b, "loads")], "ts": _us(int(ns[i, LOAD])), "args": {"instr": i, "weight_bytes": int(trace.weight_bytes[i])}})

    flow_id = 0
    for i in ran:
        for j in _drawn_deps(trace, tl, ns, i):
            flow_id += 1
            (pj, tj), (pi, ti) = op_track[j], op_track[i]
            events.append({"ph": "s", "name": "dep", "cat": "dep", "id": flow_id, "pid": pj, "tid": tj, "ts": _us(_op_end(ns, j) - 1)})
            events.append({"ph": "f", "bp": "e", "name": "dep", "cat": "dep", "id": flow_id, "pid": pi, "tid": ti, "ts": _us(int(ns[i, READY]) + 1)})

    # per track in time order, an enclosing slice before what it encloses
    events.sort(key=lambda e: (e["pid"], e["tid"], e["ts"], -e.get("dur", 0), e["ph"] != "X"))
    other = {k: v for k, v in trace.meta.items() if isinstance(v, (str, int, float, bool))}
    other.update(clock=tl.clock, instructions=len(trace), ran=len(ran), span_us=_us(int(round(tl.span))))
    return {"traceEvents": meta + events, "otherData": other}


def write_perfetto(trace: Trace, path: str | Path) -> int:
    """Write the JSON trace to path; returns the number of events."""
    obj = perfetto_json(trace)
    with open(path, "w") as f:
        json.dump(obj, f, separators=(",", ":"))
    return len(obj["traceEvents"])
