"""Static mode: per-block instruction lists made on the host.

Every stream position goes to exactly one block, and each block's list is in
increasing stream order. That order is what makes static mode deadlock-free:
an instruction waits only on earlier stream positions; the earliest
unfinished instruction m therefore has all its inputs done, and everything
before m in m's own list is earlier than m, hence finished, so m's block has
a group free for it and runs it. A list out of stream order can deadlock: a
block stuck on a later instruction would never reach the earlier one another
block waits for.

Lists are built by list scheduling in stream order with the scheduler model's
op costs (gpuvm.sim.work): each instruction goes to a block that can finish it
first; among those that would sit idle until its inputs are ready, to the one
that idles least (best fit), then to the one with the least predicted work,
so that blocks end at about the same time.
"""
from __future__ import annotations

import dataclasses
import sys
from typing import Sequence

import numpy as np

from .opspec import Cost, ProgramError
from .program import Stream
from .sim.hardware import Hardware
from .sim.model import check_lists
from .sim.work import op_work

__all__ = ["static_lists", "pack_static", "unpack_static"]


def static_lists(
    stream: Stream,
    n_blocks: int,
    groups: int,
    hw: Hardware | None = None,
    *,
    durations: Sequence[float] | None = None,
    costs: Sequence[Cost] | None = None,
) -> list[list[int]]:
    """Assign every stream position of stream  to one of
    n_blocks blocks of `groups` warp groups; each list in increasing stream order.
    hw gives the costs (its n_blocks and groups are overridden by the arguments);
    durations and costs override op costs as in gpuvm.sim.simulate."""
    # The lists' rule, as the H200 measured it (README, the layer table's static
    # column), counts an op's whole prefetch range as hidden by its wait, though
    # the loader fetches only its first bytes (Hardware.prefetch_max_bytes): lists
    # made with the loader's bound would be new lists, for a GPU to measure first.
    hw = dataclasses.replace(hw or Hardware(), n_blocks=n_blocks, groups=groups, prefetch_max_bytes=sys.maxsize)
    work = op_work(stream, hw, durations, costs)
    deps = stream.deps
    # each load's bandwidth when every group of every block streams at once
    share = min(hw.load_bytes_per_s, hw.hbm_bytes_per_s / (n_blocks * groups))
    per_op = hw.dispatch_ns + hw.signal_ns  # a group's time per op outside the op itself
    seen = np.zeros(len(work))  # when each op's signal is visible to others
    free = np.zeros((n_blocks, groups))  # when each group comes free
    load = np.zeros(n_blocks)  # predicted busy time so far
    lists: list[list[int]] = [[] for _ in range(n_blocks)]
    for i, w in enumerate(work):
        deps_seen = max((seen[j] for j in deps[i]), default=0.0)
        first = free.min(axis=1)
        idle = np.flatnonzero(first <= deps_seen)
        if idle.size:  # best fit: the block that idles least before the op can start
            b = int(idle[np.lexsort((load[idle], -first[idle]))[0]])
        else:
            b = int(np.lexsort((load, first))[0])
        g = int(np.argmin(free[b]))
        dur = w.alone_ns(hw, share) + per_op
        # the prefetch runs from the claim, before the waits end
        hidden = min(w.prefetch_bytes / share * 1e9, max(0.0, deps_seen - free[b, g]))
        end = max(free[b, g], deps_seen) + dur - hidden
        free[b, g] = end
        load[b] += dur
        seen[i] = end + hw.signal_latency_ns
        lists[b].append(i)
    return lists


def pack_static(lists: Sequence[Sequence[int]]) -> np.ndarray:
    """The device format of static lists, one int32 array:

        [offsets[0] .. offsets[n_blocks]] [indices ...]

    offsets has n_blocks + 1 entries, offsets[0] = 0, and block b runs the
    stream positions indices[offsets[b]:offsets[b+1]] (that is, packed[n_blocks
    + 1 + offsets[b] : n_blocks + 1 + offsets[b+1]]) in that order. Every
    position appears once; each list is increasing (see the module docstring).
    """
    n = sum(len(lst) for lst in lists)
    check_lists(lists, n, len(lists), ordered=True)
    if n >= 2**31:
        raise ProgramError(f"{n} instructions do not fit int32 static lists")
    offsets = np.zeros(len(lists) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(lst) for lst in lists])
    flat = np.array([j for lst in lists for j in lst], dtype=np.int64)
    return np.concatenate([offsets, flat]).astype(np.int32)


def unpack_static(packed: np.ndarray, n_blocks: int) -> list[list[int]]:
    """Inverse of pack_static; checks the array as the device would need it."""
    a = np.asarray(packed)
    if a.ndim != 1 or a.dtype != np.int32:
        raise ProgramError(f"packed static lists must be a 1-d int32 array, not {a.dtype} {a.shape}")
    if n_blocks < 1 or a.size < n_blocks + 1:
        raise ProgramError(f"packed static lists of {a.size} entries cannot hold {n_blocks} blocks' offsets")
    off = a[: n_blocks + 1].astype(np.int64)
    flat = a[n_blocks + 1 :]
    if off[0] != 0 or np.any(np.diff(off) < 0) or off[-1] != flat.size:
        raise ProgramError(f"packed static lists: offsets {off.tolist()[:8]}... must rise from 0 to the {flat.size} indices")
    lists = [flat[off[b] : off[b + 1]].tolist() for b in range(n_blocks)]
    check_lists(lists, flat.size, n_blocks, ordered=True)
    return lists
