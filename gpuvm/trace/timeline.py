"""A trace turned into checked, comparable times: what every trace tool reads.

Times are float nanoseconds from the first claim. On a GPU trace whose meta
has "clock_hz", every stamp comes from clock64: per SM, cycles are mapped to
ns by the clock rate and shifted by the SM's offset to %globaltimer. That
offset is the largest (globaltimer - clock ns) over the SM's stamps, since the
globaltimer (which ticks in ~256 ns steps) never runs ahead of the true time.
Durations are then exact to the cycle and start times good to one tick.
Without "clock_hz", or on a model trace, the globaltimer stamps are used as is.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from ..isa import Stamp
from .format import Trace, TraceError

CLAIM, LOAD, READY, DONE, SIGNAL = (int(s) for s in (Stamp.CLAIM, Stamp.LOAD, Stamp.READY, Stamp.DONE, Stamp.SIGNAL))


def op_name(label: str) -> str:
    """The op an instruction belongs to: its label up to the first '[' or
    whitespace ("L0.wqkvg[3]" -> "L0.wqkvg", "L0.attn_chunk c2 h1 j5" ->
    "L0.attn_chunk"); a label that starts with one is kept whole."""
    for k, ch in enumerate(label):
        if ch == "[" or ch.isspace():
            return label[:k] if k else label
    return label


@dataclass(frozen=True)
class Timeline:
    trace: Trace
    t: np.ndarray  # float64 [n, N_STAMPS], ns from the first claim; NaN where not run
    ran: np.ndarray  # bool [n]
    has_load: np.ndarray  # bool [n]: a weight load was issued (LOAD stamp valid)
    sm: np.ndarray  # int64 [n]
    block: np.ndarray  # int64 [n]
    group: np.ndarray  # int64 [n]
    ops: list[str]  # op_name of every label
    clock: str  # how times were derived, for headers

    def __len__(self) -> int:
        return len(self.ran)

    @property
    def span(self) -> float:
        """First claim to last signal, ns."""
        return float(np.nanmax(self.t[:, SIGNAL]))

    def gating_deps(self, i: int) -> list[int]:
        """The dependencies of instruction i that ran and were done by its ready:
        those that can have held it back. A work list signals for all its
        workers when one finishes its last item, so a late worker (done after
        i started) did not (the others, done before, all count; if none is,
        as in a trace of another kind, every dependency that ran)."""
        deps = [j for j in self.trace.deps[i] if self.ran[j]]
        done = [j for j in deps if self.t[j, DONE] <= self.t[i, READY]]
        return done or deps

    def transfer_start(self, i: int) -> float:
        """When instruction i's bytes started to move: its load issue, else its ready."""
        return float(self.t[i, LOAD] if self.has_load[i] else self.t[i, READY])


def _ran(trace: Trace) -> np.ndarray:
    """A model trace ran everything; on the GPU an all-zero record never ran."""
    if trace.meta.get("source") == "model":
        return np.ones(len(trace), dtype=bool)
    r = trace.records
    return (r["globaltimer"].any(axis=1)) | (r["clock"].any(axis=1))


def _rel(x: np.ndarray, base: np.uint64) -> np.ndarray:
    """uint64 stamps minus base as float64 ns, exact for spans under 2**53
    (absolute globaltimer values are too large for float64 to keep ns)."""
    return (x.astype(np.uint64) - base).view(np.int64).astype(np.float64)


def _clock_times(trace: Trace, ran: np.ndarray, hz: float) -> np.ndarray:
    r = trace.records
    gt = _rel(r["globaltimer"], r["globaltimer"][ran, CLAIM].min())
    out = np.full(gt.shape, np.nan)
    for s in np.unique(r["sm"][ran]):
        rows = np.flatnonzero(ran & (r["sm"] == s))
        c = r["clock"][rows]
        valid = c != 0
        both = valid & (r["globaltimer"][rows] != 0)
        if not both.any():
            raise TraceError(f"SM {s}: no stamp has both clock64 and globaltimer")
        ns = _rel(c, c[valid].min()) * (1e9 / hz)
        off = np.max((gt[rows] - ns)[both])
        out[rows] = np.where(valid, ns + off, np.nan)
    return out


def build(trace: Trace) -> Timeline:
    """Check a trace and derive its times; TraceError on anything the tools
    could not draw truthfully."""
    n = len(trace)
    if n == 0:
        raise TraceError("the trace has no instructions")
    for i, d in enumerate(trace.deps):
        for j in d:
            if not 0 <= j < i:
                raise TraceError(f"instruction {i} '{trace.labels[i]}' depends on {j}, which is not an earlier instruction")
    if not isinstance(trace.meta, dict):
        raise TraceError("the trace's meta is not a JSON object")
    ran = _ran(trace)
    if not ran.any():
        raise TraceError("no instruction of the trace ran (every record is empty)")
    hz = trace.meta.get("clock_hz")
    if trace.meta.get("source") == "gpu" and hz is not None:
        if not isinstance(hz, numbers.Real) or not hz > 0:
            raise TraceError(f"meta clock_hz {hz!r} is not a positive rate")
        t = _clock_times(trace, ran, float(hz))
        clock = f"clock64 at {float(hz) / 1e9:.3f} GHz, aligned to globaltimer per SM"
    else:
        gt = trace.records["globaltimer"]
        t = _rel(gt, gt[ran, CLAIM].min())
        t[~ran] = np.nan
        clock = "globaltimer"
    missing = ran & np.isnan(t[:, [CLAIM, READY, DONE, SIGNAL]]).any(axis=1)
    if missing.any():
        i = int(np.flatnonzero(missing)[0])
        raise TraceError(f"instruction {i} '{trace.labels[i]}' ran but lacks a claim, ready, done or signal stamp")
    for a, b, what in ((CLAIM, READY, "ready before claim"), (READY, DONE, "done before ready"), (DONE, SIGNAL, "signal before done")):
        bad = np.flatnonzero(ran & ~(t[:, a] <= t[:, b]))
        if len(bad):
            i = int(bad[0])
            raise TraceError(f"instruction {i} '{trace.labels[i]}': stamps out of order ({what}); {len(bad)} such instructions")
    t0 = np.nanmin(t[:, CLAIM])
    t = t - t0
    has_load = ran & (trace.weight_bytes > 0) & (t[:, LOAD] >= t[:, CLAIM])
    r = trace.records
    return Timeline(
        trace=trace,
        t=t,
        ran=ran,
        has_load=has_load,
        sm=r["sm"].astype(np.int64),
        block=r["block"].astype(np.int64),
        group=r["group"].astype(np.int64),
        ops=[op_name(s) for s in trace.labels],
        clock=clock,
    )


def op_order(tl: Timeline) -> list[str]:
    """Op names in order of their first start (earliest ready of any of their
    instructions); ops that never ran are left out."""
    first: dict[str, float] = {}
    for i in np.flatnonzero(tl.ran):
        name = tl.ops[i]
        s = float(tl.t[i, READY])
        if name not in first or s < first[name]:
            first[name] = s
    return sorted(first, key=lambda k: (first[k], k))


def members(tl: Timeline) -> dict[str, np.ndarray]:
    """Instruction indices that ran, by op name."""
    out: dict[str, list[int]] = {}
    for i in np.flatnonzero(tl.ran):
        out.setdefault(tl.ops[i], []).append(int(i))
    return {k: np.array(v, dtype=np.int64) for k, v in out.items()}
