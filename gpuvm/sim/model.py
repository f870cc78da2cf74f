"""Discrete-event model of the device scheduler (DESIGN.md "Run-time scheduler").

Each block has a controller and `groups` compute warp groups. The controller
claims the next instruction (dynamic: one atomic on the global head, which
serialises claims; static: the next entry of its own list), reads the record,
has the loader issue the instruction's prefetch (only if it will wait, and
only its first prefetch_max_bytes, as runtime/loader.cuh does), and hands it
to a free group.
Like the device's controller it keeps up to claim_depth instructions claimed
and not yet handed out (runtime/controller.cuh). With hw.ready_first (the
device's default) it hands out the oldest held instruction whose waits were
met at least probe_ns ago; with none such, and hw.park, the oldest goes to a
free group as long as another group of the block is not parked on an unmet
wait (else it stays held). Claim order hands out the oldest. A group waits until every counter
it needs reaches its target (a signal is seen signal_latency_ns after its
release), loads what is left, computes and signals. Loads share HBM (or L2)
in processor sharing, each capped at load_bytes_per_s; math shares its SM's
tensor cores among the busy groups. The workers of an expert work list
(gpuvm.program.work_lists) take its items (one per worker, each costing a
worker's work) as the device's do: a ready worker takes the next item and,
having finished it, the next, until none are left; a worker that finds the
list taken ends at once; the first to find it so adds 1 to the counter and
the one that finishes the last item a1 - 1, the others add nothing
(ops/experts.cuh; a fixed round robin's finisher adds a1, which waiters for
the whole list see the same). A down item of a list that waits for an up
list's rows (EXPERT_DOWN a5) starts once that list's items of its expert are
done (item experts from predict's ItemCost; unknown: the whole up list),
seen signal_latency_ns later, holding its group meanwhile. A worker of a
fixed round robin (a4 > 0) runs its own share, whenever it gets to run.

No deadlock for a valid stream: the earliest unfinished instruction m has all
its dependencies done (they come earlier in the stream). It is claimed or
next to be claimed (claims go in stream order). In claim order: if m waits in
a block's queue, the entries ahead of it and every instruction in that
block's groups are earlier than m, hence finished and handed out, and a group
comes free for m. Ready first: one group of the block only gets instructions
whose waits are met (parking leaves it), which finish, so it comes free and
m (ready) goes to it. The same
holds in static mode because every list is in stream order (gpuvm/static.py).
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from ..isa import TRACE_DTYPE, Op, Stamp
from ..opspec import Cost, ProgramError
from ..program import Stream, work_lists
from ..trace.format import Trace
from .hardware import Hardware
from .share import Share
from .work import OpWork, list_item_work, op_work

MODES = ("dynamic", "static")


class DeadlockError(RuntimeError):
    """The model ran out of events with instructions unfinished."""


@dataclass
class SimResult:
    """Model times (ns from launch) of every instruction, by stream position."""

    stream: Stream
    hw: Hardware
    mode: str
    lists: list[list[int]] | None
    block: np.ndarray  # int
    group: np.ndarray  # int
    claim: np.ndarray  # claim returned to the controller
    load: np.ndarray  # record decoded, prefetch issued
    dispatch: np.ndarray  # handed to its group
    ready: np.ndarray  # every wait met
    done: np.ndarray  # compute finished (loads included)
    signal: np.ndarray  # signal released (= done when the op signals nothing)
    finish_order: list[int] = field(default_factory=list)  # stream positions as they finished

    @property
    def makespan_ns(self) -> float:
        return float(self.signal.max())

    @property
    def visible(self) -> np.ndarray:
        """When each op's signal is seen by pollers."""
        return self.signal + self.hw.signal_latency_ns

    @property
    def trace(self) -> Trace:
        """The run as a gpuvm trace (globaltimer = clock = model ns, sm = block)."""
        rec = np.zeros(len(self.block), dtype=TRACE_DTYPE)
        rec["sm"] = rec["block"] = self.block
        rec["group"] = self.group
        rec["instr"] = np.arange(len(self.block))
        stamps = {Stamp.CLAIM: self.claim, Stamp.LOAD: self.load, Stamp.READY: self.ready, Stamp.DONE: self.done, Stamp.SIGNAL: self.signal}
        for s, t in stamps.items():
            rec["globaltimer"][:, int(s)] = np.rint(t).astype(np.uint64)
        rec["clock"] = rec["globaltimer"]
        meta = {"source": "model", "mode": self.mode, "makespan_ns": self.makespan_ns, **self.hw.as_dict()}
        return Trace.for_stream(self.stream, rec, meta)


@dataclass
class _List:
    """An expert work list: its workers (the finisher adds their count, the
    list's a1, to the counter; Program.build checks the two agree), its items
    (without item costs: one a worker, each costing that worker's work) and
    what its workers did."""

    workers: int
    items: int
    work: list[OpWork] | None = None  # each item's, in the list's order
    experts: list[int] | None = None  # each item's expert (-1 or None: unknown)
    after: int = -1  # the up list whose rows its items wait for (EXPERT_DOWN a5), by index
    taken: int = 0
    done: int = 0
    drawn: bool = False  # a worker found every item taken (its 1 is signalled)
    signalled: bool = False
    left: dict[int, int] = field(default_factory=dict)  # items not yet done by expert (-1: all), for the lists that wait on it
    parked: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # expert: (worker, item) waiting for it


@dataclass
class _Block:
    free: list[int]  # free groups (heap)
    pending: int = 0  # claims issued, not yet decoded
    queue: list = field(default_factory=list)  # decoded, waiting for a group, in claim order
    handing: bool = False  # the controller is handing one to a group
    parked: set = field(default_factory=set)  # groups handed an instruction whose waits were not seen met
    exhausted: bool = False
    next_in_list: int = 0


class _Sim:
    def __init__(self, stream: Stream, hw: Hardware, mode: str, lists: list[list[int]] | None, work: list[OpWork],
                 item_work: dict[tuple[int, int], list[OpWork]] | None = None,
                 item_experts: dict[tuple[int, int], list[int]] | None = None) -> None:
        self.s, self.hw, self.mode, self.lists, self.work = stream, hw, mode, lists, work
        ops = stream.ops
        n = self.n = len(ops)
        self.ops = ops
        self.waits = [[(c.id, ins.wait_count(k)) for k, (c, _) in enumerate(ins.waits)] for ins in ops]
        self.sig = [None if ins.signal is None else ins.signal.id for ins in ops]
        self.list_of = [-1] * n  # the work list of a worker, by index into self.lists_run
        self.lists_run: list[_List] = []
        keys = work_lists(ops)
        index = {key: k for k, key in enumerate(keys)}
        for key, members in keys.items():
            for i in members:
                self.list_of[i] = len(self.lists_run)
            iw = None if item_work is None else item_work.get(key)
            ie = None if item_experts is None else item_experts.get(key)
            self.lists_run.append(_List(len(members), len(members) if iw is None else len(iw), iw, ie))
        for key, members in keys.items():  # a down list's up list (a5 = its a0 + 1, on the same work tensor)
            a5 = ops[members[0]].args[5] if ops[members[0]].opcode == Op.EXPERT_DOWN else 0
            if a5 and (key[0], a5 - 1) in index:
                lst, up = self.lists_run[index[key]], self.lists_run[index[(key[0], a5 - 1)]]
                lst.after = index[(key[0], a5 - 1)]
                if not up.left:
                    up.left = {-1: up.items}
                    for e in up.experts or []:
                        up.left[e] = up.left.get(e, 0) + 1
        self.item = [-1] * n  # the item a worker runs (-1: it found its list taken)
        # a worker of a fixed round robin (a4 > 0, Tiles.expert_fixed) runs items a4 - 1,
        # a4 - 1 + workers, ... and claims nothing
        self.fixed = [self.list_of[i] >= 0 and ops[i].args[4] > 0 for i in range(n)]
        self.value = [0] * len(stream.counters)
        self.waiters: list[list[tuple[int, int]]] = [[] for _ in self.value]  # heap of (target, instr)
        self.unmet = [0] * n
        self.seen_ready = np.full(n, np.inf)  # ready first: when the controller can see i's waits met
        self.in_group = [False] * n
        self.prefetched = [False] * n  # the loader fetched i's prefetch_bytes while it waited
        self.left = [0] * n
        self.t = {k: np.full(n, np.nan) for k in ("claim", "load", "dispatch", "ready", "done", "signal")}
        self.block = np.full(n, -1, dtype=np.int64)
        self.group = np.full(n, -1, dtype=np.int64)
        self.order: list[int] = []
        self.blocks = [_Block(list(range(hw.groups))) for _ in range(hw.n_blocks)]
        self.head = 0
        self.head_free = 0.0
        self._events: list[tuple[float, int, Callable[..., None], tuple]] = []
        self._seq = 0
        cap = hw.load_bytes_per_s / 1e9
        self.hbm = Share(lambda k: min(cap, hw.hbm_bytes_per_s / 1e9 / k))
        self.l2 = Share(lambda k: min(cap, hw.l2_bytes_per_s / 1e9 / k))
        per_sm = hw.flops_per_sm / 1e9
        self.math = [Share(lambda k: per_sm / k) for _ in range(hw.n_blocks)]

    # -- event queue ----------------------------------------------------------
    def at(self, time: float, fn: Callable[..., None], *args: object) -> None:
        heapq.heappush(self._events, (time, self._seq, fn, args))
        self._seq += 1

    def _watch(self, share: Share) -> None:
        end = share.next_end()
        if end is not None:
            self.at(end, self._share_end, share, share.version)

    def _share_end(self, now: float, share: Share, version: int) -> None:
        if version != share.version:
            return  # the rate changed since this end was computed
        for cb in share.finish(now):
            cb(now)
        self._watch(share)

    def _start(self, share: Share, now: float, work: float, done: Callable[[float], None]) -> None:
        share.add(now, work, done)
        self._watch(share)

    def run(self) -> None:
        for b in range(self.hw.n_blocks):
            self._try_claim(b, 0.0)
        while self._events:
            time, _, fn, args = heapq.heappop(self._events)
            fn(time, *args)
        if len(self.order) != self.n:
            raise DeadlockError(self._deadlock_report())

    # -- controller -----------------------------------------------------------
    def _try_claim(self, b: int, now: float) -> None:
        """Issue claims until claim_depth are held (claimed, not handed out)."""
        blk = self.blocks[b]
        while not blk.exhausted and blk.pending + len(blk.queue) + blk.handing < self.hw.claim_depth:
            blk.pending += 1
            if self.mode == "dynamic":
                serve = max(now, self.head_free)
                self.head_free = serve + self.hw.head_gap_ns
                i = self.head
                self.head += 1
                self.at(serve + self.hw.claim_ns, self._claimed, b, i)
            else:
                lst = self.lists[b]
                i = lst[blk.next_in_list] if blk.next_in_list < len(lst) else self.n
                blk.next_in_list += 1
                if i >= self.n:
                    blk.exhausted = True
                self.at(now, self._claimed, b, i)

    def _claimed(self, now: float, b: int, i: int) -> None:
        blk = self.blocks[b]
        if i >= self.n:  # past the end: so is every later claim
            blk.exhausted = True
            blk.pending -= 1
            return
        self.t["claim"][i] = now
        self.block[i] = b
        self.at(now + self.hw.decode_ns, self._decoded, b, i)

    def _decoded(self, now: float, b: int, i: int) -> None:
        self.t["load"][i] = now
        w = self.work[i]
        blk = self.blocks[b]
        blk.pending -= 1
        blk.queue.append(i)
        for c, target in self.waits[i]:
            if self.value[c] < target:
                self.unmet[i] += 1
                heapq.heappush(self.waiters[c], (target, i))
        if not self.unmet[i]:
            self.seen_ready[i] = now  # the record shows waits already met: no probe needed
        elif w.prefetch_bytes:  # the loader prefetches only for an instruction that will wait (runtime/loader.cuh)
            self.prefetched[i] = True
            self.left[i] += 1
            self._start(self.hbm, now, w.prefetch_bytes, lambda t, i=i: self._loaded(t, i))
        self._hand(b, now)

    def _hand(self, b: int, now: float) -> None:
        """Hand a decoded claim to a free group, one at a time: the oldest, or
        (ready first) the oldest whose waits the controller has seen met."""
        blk = self.blocks[b]
        if blk.handing or not blk.queue or not blk.free:
            return
        k = 0
        park = False
        if self.hw.ready_first:
            k = next((k for k, i in enumerate(blk.queue) if self.seen_ready[i] <= now), -1)
            if k < 0:
                if not (self.hw.park and len(blk.parked) + 2 <= self.hw.groups):
                    return  # _seen calls again when a held one's waits are met
                k, park = 0, True
        blk.handing = True
        g = heapq.heappop(blk.free)
        if park:
            blk.parked.add(g)
        self.at(now + self.hw.dispatch_ns, self._dispatched, b, g, blk.queue.pop(k))

    def _group_free(self, now: float, b: int, g: int) -> None:
        blk = self.blocks[b]
        blk.parked.discard(g)
        heapq.heappush(blk.free, g)
        self._hand(b, now)
        self._try_claim(b, now)

    # -- group ------------------------------------------------------------------
    def _dispatched(self, now: float, b: int, g: int, i: int) -> None:
        self.blocks[b].handing = False
        self.t["dispatch"][i] = now
        self.group[i] = g
        self.in_group[i] = True
        if not self.unmet[i]:
            self._ready(now, i)
        self._hand(b, now)
        self._try_claim(b, now)

    def _ready(self, now: float, i: int) -> None:
        self.t["ready"][i] = now
        self._run(now, i)
        self._try_claim(int(self.block[i]), now)

    def _run(self, now: float, i: int) -> None:
        """Start i's work: a list worker's next item, or its end if none is left."""
        k = self.list_of[i]
        if k >= 0:
            lst = self.lists_run[k]
            if self.fixed[i]:  # its own next item, if any is left
                j = self.ops[i].args[4] - 1 if self.item[i] < 0 else self.item[i] + lst.workers
            else:
                j = lst.taken
            self.item[i] = j if j < lst.items else -1
            if self.item[i] < 0:  # nothing left: the op's launch cost, no item's
                self.left[i] += 1
                self.at(now + self.hw.launch_ns, self._part_done, i)
                return
            lst.taken += 1
            if lst.after >= 0:  # a down item: its expert's up rows first (the whole up list if its expert is unknown)
                up = self.lists_run[lst.after]
                e = lst.experts[j] if lst.experts is not None and up.experts is not None else -1
                if up.left.get(e, 0) > 0:
                    up.parked.setdefault(e, []).append((i, j))
                    return
            self._item(now, i, j)
            return
        self._item(now, i, -1)

    def _item(self, now: float, i: int, j: int) -> None:
        """Start i's work: item j of its list (j < 0: the instruction's own)."""
        w = self.work[i]
        if j >= 0:
            lst = self.lists_run[self.list_of[i]]
            if lst.work is not None:
                w = lst.work[j]
        hbm = w.hbm_bytes + (0 if self.prefetched[i] else w.prefetch_bytes)
        self.left[i] += 1 + bool(hbm) + bool(w.l2_bytes)
        if hbm:
            self._start(self.hbm, now, hbm, lambda t, i=i: self._loaded(t, i))
        if w.l2_bytes:
            self._start(self.l2, now, w.l2_bytes, lambda t, i=i: self._loaded(t, i))
        self.at(now + w.fixed_ns, self._launched, int(self.block[i]), i, w.flops)

    def _launched(self, now: float, b: int, i: int, flops: float) -> None:
        if flops:
            self._start(self.math[b], now, flops, lambda t, i=i: self._part_done(t, i))
        else:
            self._part_done(now, i)

    def _loaded(self, now: float, i: int) -> None:
        self.at(now + self.hw.mem_latency_ns, self._part_done, i)

    def _part_done(self, now: float, i: int) -> None:
        self.left[i] -= 1
        if self.left[i] == 0 and not math.isnan(self.t["ready"][i]):
            self._finish(now, i)

    def _finish(self, now: float, i: int) -> None:
        amount = 1
        k = self.list_of[i]
        if k >= 0:
            lst = self.lists_run[k]
            if self.item[i] >= 0:
                lst.done += 1
                if lst.left:
                    self._up_item_done(now, lst, self.item[i])
                more = self.item[i] + lst.workers < lst.items if self.fixed[i] else lst.taken < lst.items
                if lst.done < lst.items and more:
                    self._run(now, i)  # the next item, on the same group
                    return
            if self.fixed[i]:  # its a1 once its items are all done
                amount = lst.workers if lst.done == lst.items and not lst.signalled else 0
                lst.signalled |= bool(amount)
            else:  # 1 from the first to find every item taken, a1 - 1 from the one that finished the last
                amount = 0 if lst.drawn else 1 if lst.items else lst.workers
                lst.drawn = True
                if lst.items and lst.done == lst.items and not lst.signalled:
                    lst.signalled = True
                    amount += lst.workers - 1
        self.t["done"][i] = now
        self.order.append(i)
        c = self.sig[i]
        end = now if c is None else now + self.hw.signal_ns
        self.t["signal"][i] = end
        self.at(end, self._group_free, int(self.block[i]), int(self.group[i]))
        if c is not None and amount:
            self.at(end + self.hw.signal_latency_ns, self._seen, c, amount)

    def _up_item_done(self, now: float, lst: _List, j: int) -> None:
        """Item j of an up list is done: the down items parked on its expert (or on
        the whole list) start once the last of those is seen."""
        for e in {-1, lst.experts[j] if lst.experts is not None else -1}:
            lst.left[e] -= 1
            if not lst.left[e]:
                for i, jj in lst.parked.pop(e, []):
                    self.at(now + self.hw.signal_latency_ns, self._item, i, jj)

    def _seen(self, now: float, c: int, amount: int) -> None:
        self.value[c] += amount
        q = self.waiters[c]
        while q and q[0][0] <= self.value[c]:
            _, i = heapq.heappop(q)
            self.unmet[i] -= 1
            if self.unmet[i]:
                continue
            if self.in_group[i]:
                self._ready(now, i)
            else:  # still held by its controller, which sees it at its next probe
                self.seen_ready[i] = now + self.hw.probe_ns
                self.at(self.seen_ready[i], self._hand_later, int(self.block[i]))

    def _hand_later(self, now: float, b: int) -> None:
        self._hand(b, now)

    # -- failure ----------------------------------------------------------------
    def _deadlock_report(self) -> str:
        lines = [f"scheduler model deadlock ({self.mode} mode): {self.n - len(self.order)} of {self.n} instructions never finished"]
        counters = self.s.counters
        for i in range(self.n):
            if not math.isnan(self.t["done"][i]):
                continue
            where = f"#{i} '{self.ops[i].label}'"
            if math.isnan(self.t["claim"][i]):
                lines.append(f"  {where}: never claimed")
            else:
                need = ", ".join(f"'{counters[c].name}' at {self.value[c]} of {tg}" for c, tg in self.waits[i] if self.value[c] < tg)
                if not math.isnan(self.t["dispatch"][i]):
                    lines.append(f"  {where}: block {self.block[i]} group {self.group[i]} waits on {need}")
                elif need and self.hw.ready_first:
                    lines.append(f"  {where}: held by block {self.block[i]}'s controller, waits on {need}")
                else:
                    lines.append(f"  {where}: queued in block {self.block[i]}, no group ever came free")
            if len(lines) > 12:
                lines.append("  ...")
                break
        return "\n".join(lines)


def check_lists(lists: Sequence[Sequence[int]], n_instrs: int, n_blocks: int, ordered: bool = True) -> None:
    """Raise ProgramError unless lists give every stream position to exactly one
    of n_blocks blocks (and, if ordered, each list is in increasing stream order)."""
    if len(lists) != n_blocks:
        raise ProgramError(f"{len(lists)} static lists for {n_blocks} blocks")
    seen = np.zeros(n_instrs, dtype=np.int64)
    for b, lst in enumerate(lists):
        a = np.asarray(lst, dtype=np.int64)
        if a.size and (a.min() < 0 or a.max() >= n_instrs):
            raise ProgramError(f"static list of block {b} names an instruction outside [0, {n_instrs})")
        if ordered and a.size > 1 and not np.all(np.diff(a) > 0):
            raise ProgramError(f"static list of block {b} is not in increasing stream order: the kernel could deadlock")
        np.add.at(seen, a, 1)
    if np.any(seen != 1):
        bad = int(np.flatnonzero(seen != 1)[0])
        raise ProgramError(f"static lists give instruction {bad} to {int(seen[bad])} blocks; each must run exactly once")


def simulate(
    stream: Stream,
    hw: Hardware = Hardware(),
    mode: str = "dynamic",
    lists: list[list[int]] | None = None,
    durations: Sequence[float] | None = None,
    *,
    costs: Sequence[Cost] | None = None,
    item_costs: Mapping[tuple[int, int], Sequence[Cost]] | None = None,
) -> SimResult:
    """Run the model over one step of stream.

    mode 'dynamic' claims on the global head; 'static' runs lists (default:
    gpuvm.static.static_lists for hw). durations[i] replaces op i's compute
    time in ns; costs[i] replaces its Cost (see work.op_work). item_costs
    gives the items of expert work lists, by work_lists' key, each its own
    Cost (predict.list_item_costs): workers then take them one at a time as
    the device's do (or their own, in a fixed round robin); without them a
    list has an item a worker, costing that worker's Cost. Raises
    DeadlockError if the run cannot finish (never for a valid stream and
    lists in stream order).
    """
    if mode not in MODES:
        raise ProgramError(f"mode must be one of {MODES}, not {mode!r}")
    n = len(stream.ops)
    work = op_work(stream, hw, durations, costs)
    if mode == "dynamic":
        if lists is not None:
            raise ProgramError("lists are for static mode only")
    else:
        if lists is None:
            from ..static import static_lists  # static builds on this model's costs

            lists = static_lists(stream, hw.n_blocks, hw.groups, hw, durations=durations, costs=costs)
        # order is not checked: a list out of stream order is allowed to show its deadlock
        check_lists(lists, n, hw.n_blocks, ordered=False)
        lists = [list(map(int, lst)) for lst in lists]
    experts = None if item_costs is None else {k: [int(getattr(c, "expert", -1)) for c in v] for k, v in item_costs.items()}
    sim = _Sim(stream, hw, mode, lists, work, None if item_costs is None else list_item_work(stream, hw, item_costs), experts)
    sim.run()
    return SimResult(stream, hw, mode, lists, sim.block, sim.group, finish_order=sim.order, **sim.t)
