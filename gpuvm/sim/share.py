"""Processor sharing: a resource that serves all its jobs at once, each at the
same rate, which depends on how many there are (HBM among loads, an SM's
tensor cores among its busy groups).

Since every job gets the same rate, one virtual clock V (work each job has
received so far) orders them all: a job of w units added at V0 ends when V
reaches V0 + w. Adding or ending a job changes the rate from then on, never
the past, so each change costs O(log n).
"""
from __future__ import annotations

import heapq
from typing import Callable


class Share:
    """Jobs served in processor sharing; rate(n) is each job's rate (units/ns)."""

    def __init__(self, rate: Callable[[int], float]) -> None:
        self._rate = rate
        self._v = 0.0
        self._t = 0.0
        self._jobs: list[tuple[float, int, Callable[[float], None]]] = []
        self._seq = 0
        self.version = 0  # bumped on every change: completion times computed before are stale

    def __len__(self) -> int:
        return len(self._jobs)

    def _advance(self, now: float) -> None:
        if self._jobs:
            self._v += (now - self._t) * self._rate(len(self._jobs))
        self._t = now

    def add(self, now: float, work: float, done: Callable[[float], None]) -> None:
        """Start a job of `work` units at `now`; done(t) is called when it ends."""
        self._advance(now)
        heapq.heappush(self._jobs, (self._v + work, self._seq, done))
        self._seq += 1
        self.version += 1

    def next_end(self) -> float | None:
        """When the first job ends at the current rate, or None when idle."""
        if not self._jobs:
            return None
        left = max(0.0, self._jobs[0][0] - self._v)
        return self._t + left / self._rate(len(self._jobs))

    def finish(self, now: float) -> list[Callable[[float], None]]:
        """Remove and return the callbacks of the jobs that end at `now` (at least
        the first one: `now` came from next_end)."""
        self._advance(now)
        out = [heapq.heappop(self._jobs)[2]]
        tol = 1e-9 * max(1.0, abs(self._v))  # float rounding of V
        while self._jobs and self._jobs[0][0] <= self._v + tol:
            out.append(heapq.heappop(self._jobs)[2])
        self.version += 1
        return out
