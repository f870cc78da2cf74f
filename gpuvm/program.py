"""Program builder: tensors, counters and ops in; an ordered, encoded stream out.

    p = Program("axpy")
    x = p.tensor("x", (1024,), DType.F32)
    y = p.tensor("y", (1024,), DType.F32)
    done = p.counter("x ready")
    p.op(Op.COPY, [x, y], [0, 1024], signal=done)
    p.op(Op.SCALE_ADD, [y, x, y], [0, 1024, f2i(2.0), f2i(1.0)], waits=[done])
    stream = p.build()

An op waits on counters (all of a counter's signallers, or a given count of
them) and signals at most one counter. build() checks every op against its
opcode's spec, rejects cycles and unreachable targets, orders the ops
topologically with the longest remaining path first, and encodes the records.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from .isa import FLAG_LAZY, INSTR_DTYPE, MAX_ARGS, MAX_COUNTERS, MAX_INSTRS, MAX_TABLE, MAX_TENSORS, MAX_WAITS, NONE, TENSOR_DTYPE, DType, Op
from .opspec import SPECS, Cost, ProgramError, TensorSpec

__all__ = ["Program", "Stream", "Counter", "Instr", "ProgramError", "TensorSpec", "LIST_OPS", "work_lists"]

#: what a tensor is: weights; scratch (activation); kept across steps (state);
#: a work list's bookkeeping, rewritten every step but read by the list's late
#: workers after its consumers ran, so never shared with another layer (list);
#: tickets that ops count modulo their number of parts (a GEMM's K parts), so
#: zeroed with the counters (when a program is loaded on the VM or reset after
#: an error, and when a CPU run starts from zero counters), each layer its own
#: (ticket)
ROLES = ("weight", "activation", "state", "list", "ticket")

#: ops whose instructions form work lists, signalled by the worker that finishes the list
LIST_OPS = (Op.EXPERT_UP, Op.EXPERT_DOWN)


@dataclass(eq=False)
class Counter:
    """A monotonic device counter; it grows by its signallers per step (each op
    adds one, or a work list adds its workers between two of them: Program._check_lists)."""

    id: int
    name: str
    signallers: list["Instr"] = field(default_factory=list)

    @property
    def per_step(self) -> int:
        return len(self.signallers)

    def __repr__(self) -> str:
        return f"Counter({self.id}, {self.name!r}, per_step={self.per_step})"


@dataclass(eq=False)
class Instr:
    """One op of a program, before encoding."""

    id: int  # creation order
    opcode: Op
    tensors: tuple[TensorSpec | None, ...]
    args: tuple[int, ...]
    waits: tuple[tuple[Counter, int | None], ...]  # None: every signaller
    signal: Counter | None
    prefetch: tuple[int, int, int] | None  # (slot, byte offset, bytes)
    label: str
    cost: Cost
    flags: int = 0  # GVM_FLAG_* bits of the record
    lead: bool = False  # ordered before every other op its waits allow (Program.op)
    order_with: int | None = None  # id of an op whose place in the order this one takes at least (Program.op)
    order_after: int | None = None  # id of an op that this one ranks below (Program.op)

    def wait_count(self, i: int) -> int:
        c, n = self.waits[i]
        return c.per_step if n is None else n


def work_lists(ops: Sequence[Instr]) -> dict[tuple[int, int], list[int]]:
    """The workers of each expert work list, as positions in ops, by (table
    index of its work tensor, list k = a0)."""
    lists: dict[tuple[int, int], list[int]] = {}
    for i, ins in enumerate(ops):
        if ins.opcode in LIST_OPS:
            work = ins.tensors[7]
            assert work is not None  # the op's spec requires it
            lists.setdefault((work.index, ins.args[0]), []).append(i)
    return lists


def _same(a: TensorSpec | None, b: TensorSpec | None) -> bool:
    return a is not None and b is not None and a.index == b.index


class Program:
    """Builds one instruction stream; see the module docstring."""

    def __init__(self, name: str = "program") -> None:
        self.name = name
        self.tensors: list[TensorSpec] = []
        self._by_name: dict[str, TensorSpec] = {}
        self.counters: list[Counter] = []
        self.instrs: list[Instr] = []

    # -- declarations --------------------------------------------------------
    def tensor(self, name: str, shape: Sequence[int], dtype: DType, role: str = "activation") -> TensorSpec:
        """Declare a tensor of the table; bound to a real buffer at run time by name."""
        if name in self._by_name:
            raise ProgramError(f"tensor '{name}' declared twice")
        shape = tuple(int(s) for s in shape)
        if not 1 <= len(shape) <= 4 or any(s <= 0 for s in shape):
            raise ProgramError(f"tensor '{name}': shape {shape} must have 1 to 4 positive dims")
        if role not in ROLES:
            raise ProgramError(f"tensor '{name}': role {role!r} is not one of {', '.join(ROLES)}")
        t = TensorSpec(name, shape, DType(dtype), role, len(self.tensors))
        self.tensors.append(t)
        self._by_name[name] = t
        return t

    def counter(self, name: str) -> Counter:
        """Declare a counter that ops can signal and wait on."""
        c = Counter(len(self.counters), name)
        self.counters.append(c)
        return c

    def op(
        self,
        opcode: Op,
        tensors: Sequence[TensorSpec | None] = (),
        args: Sequence[int] = (),
        waits: Iterable[Counter | tuple[Counter, int]] = (),
        signal: Counter | None = None,
        prefetch: tuple[TensorSpec, int, int] | None = None,
        label: str | None = None,
        lazy: bool = False,
        lead: bool = False,
        order_with: Instr | None = None,
        order_after: Instr | None = None,
    ) -> Instr:
        """Add an op. waits: counters (wait for all their signallers) or (counter, count).
        lazy: once it is handed out, its block claims the next instruction only
        while one of its groups is free (GVM_FLAG_LAZY; dynamic mode only).
        lead: in the 'priority' and 'depth' orders, before every op that is not
        lead, as soon as its waits allow (the code warmer's instances).
        order_with: an op of this program; in those orders this one ranks at
        least as early as it (its path to the end counted as the longer of the
        two), e.g. a GEMM's column tiles that only a late op reads, kept beside
        the tiles that the next op reads instead of behind that op.
        order_after: an op of this program; in those orders this one ranks below
        it (its path to the end counted as just short of the shorter of the two),
        e.g. TOPK's picks, which start a longer chain than the squeeze's tiles
        but are ready only when the router ends: kept behind those tiles, they
        are not claimed early to hold the groups that the tiles need."""
        opcode = Op(opcode)
        spec = SPECS[opcode]

        def where() -> str:  # only on failure: this runs for every op of a 500K-op program
            return f"op #{len(self.instrs)} {opcode.name}" + (f" '{label}'" if label else "")

        if len(tensors) > MAX_TENSORS or len(args) > MAX_ARGS:
            raise ProgramError(f"{where()}: at most {MAX_TENSORS} tensors and {MAX_ARGS} args")
        for t in tensors:
            if t is not None and (t.index < 0 or t.index >= len(self.tensors) or self.tensors[t.index] is not t):
                raise ProgramError(f"{where()}: tensor '{t.name}' is not declared in this program")
        args_t = tuple(int(a) for a in args) + (0,) * (len(spec.args) - len(args))
        for a in args_t:
            if not -(2**31) <= a < 2**31:
                raise ProgramError(f"{where()}: argument {a} does not fit int32")
        try:
            spec.check(tensors, args_t)
        except ProgramError as e:
            raise ProgramError(f"{where()}: {e}") from None
        norm_waits: list[tuple[Counter, int | None]] = []
        for w in waits:
            c, n = (w, None) if isinstance(w, Counter) else (w[0], int(w[1]))
            if not isinstance(c, Counter) or c.id >= len(self.counters) or self.counters[c.id] is not c:
                raise ProgramError(f"{where()}: waits on a counter not declared in this program")
            if n is not None and n < 1:
                raise ProgramError(f"{where()}: wait count {n} on '{c.name}' must be >= 1")
            norm_waits.append((c, n))
        if len(norm_waits) > MAX_WAITS:
            raise ProgramError(f"{where()}: at most {MAX_WAITS} waits")
        if signal is not None and (signal.id >= len(self.counters) or self.counters[signal.id] is not signal):
            raise ProgramError(f"{where()}: signals a counter not declared in this program")
        for name, o in (("order_with", order_with), ("order_after", order_after)):
            if o is not None and (o.id >= len(self.instrs) or self.instrs[o.id] is not o):
                raise ProgramError(f"{where()}: {name} is not an op of this program")
        pf = None
        if prefetch is not None:
            pt, off, nb = prefetch
            if pt not in tensors:
                raise ProgramError(f"{where()}: prefetch tensor '{pt.name}' is not one of the op's tensors")
            if off < 0 or nb < 0 or off + nb > pt.nbytes or nb >= 2**32:
                raise ProgramError(f"{where()}: prefetch [{off}, {off + nb}) outside '{pt.name}' ({pt.nbytes} bytes)")
            pf = (list(tensors).index(pt), int(off), int(nb))
        ins = Instr(len(self.instrs), opcode, tuple(tensors), args_t, tuple(norm_waits), signal, pf, label or opcode.name.lower(), spec.cost(tensors, args_t),
                    FLAG_LAZY if lazy else 0, lead, None if order_with is None else order_with.id,
                    None if order_after is None else order_after.id)
        self.instrs.append(ins)
        if signal is not None:
            signal.signallers.append(ins)
        return ins

    # -- build ---------------------------------------------------------------
    def _graph(self, list_counters: set[int]) -> "_Graph":
        """The dependency graph, by wait group: a group is (counter, count) and
        stands for the first `count` signallers of the counter. Many ops waiting
        on one wide counter then cost one edge each, not one per signaller. A
        wait for part of a work list's counter (its items all taken) stands for
        the whole list: the ops it runs beside are the list's, so the order,
        the static lists and the model keep them after it."""
        key_of: dict[tuple[int, int], int] = {}
        members: list[list[int]] = []
        op_groups: list[list[int]] = []
        sig_index: dict[int, int] = {}
        for c in self.counters:
            for k, s in enumerate(c.signallers):
                sig_index[s.id] = k
        for ins in self.instrs:
            gs: list[int] = []
            for i, (c, _) in enumerate(ins.waits):
                need = ins.wait_count(i)
                if c.per_step == 0:
                    raise ProgramError(f"op #{ins.id} '{ins.label}' waits on counter '{c.name}', which nothing signals: it can never be reached")
                if need > c.per_step:
                    raise ProgramError(
                        f"op #{ins.id} '{ins.label}' waits for {need} signals of '{c.name}', but only {c.per_step} ops signal it: the target can never be reached"
                    )
                if ins.signal is c and sig_index[ins.id] < need:
                    raise ProgramError(f"op #{ins.id} '{ins.label}' waits on its own signal ('{c.name}'): a cycle")
                g = key_of.get((c.id, need))
                if g is None:
                    g = key_of[(c.id, need)] = len(members)
                    members.append([s.id for s in (c.signallers if c.id in list_counters else c.signallers[:need])])
                if g not in gs:
                    gs.append(g)
            op_groups.append(gs)
        return _Graph(op_groups, members)

    def _check_lists(self) -> set[int]:
        """The workers of an expert work list (isa/gvm_isa.h EXPERT_UP) signal a1
        between them (1 as the items are all taken, a1 - 1 as they are done), so they must agree on
        tensors, arguments (but a4) and counter, number a1, and be its only
        signallers; fixed workers (a4 > 0) number 1..a1 once each, or none is
        fixed; and a wait on that counter is for the whole list, or for 1 (its
        items all taken) by an EXPERT_DOWN that waits for the list's rows
        expert by expert (a5 = k + 1) and reads its output."""
        counters: dict[int, str] = {}  # list counter id -> the list's name
        lists: dict[int, list[Instr]] = {}  # list counter id -> its workers
        for (t, k), idx in work_lists(self.instrs).items():
            ws = [self.instrs[i] for i in idx]
            w0 = ws[0]
            name = f"work list '{self.tensors[t].name}'[{k}]"
            for w in ws[1:]:
                if (w.opcode, w.tensors, w.args[:4] + w.args[5:], w.signal) != (w0.opcode, w0.tensors, w0.args[:4] + w0.args[5:], w0.signal):
                    raise ProgramError(f"{name}: op #{w.id} '{w.label}' differs from op #{w0.id} '{w0.label}' in opcode, tensors, arguments or signal")
            if len(ws) != w0.args[1]:
                raise ProgramError(f"{name} has {len(ws)} workers, but its ops say a1 = {w0.args[1]}: the list would signal a wrong count")
            fixed = sorted(w.args[4] for w in ws)
            if fixed[-1] and fixed != list(range(1, len(ws) + 1)):
                raise ProgramError(f"{name}: fixed workers (a4) must number 1..{len(ws)} once each, not {fixed[:8]}{'...' if len(fixed) > 8 else ''}: items would be lost or done twice")
            c = w0.signal
            if c is None:
                continue
            if len(c.signallers) != len(ws):
                other = next(s for s in c.signallers if s not in ws)
                raise ProgramError(f"{name} signals counter '{c.name}', which op #{other.id} '{other.label}' also signals: a list's counter is its own")
            counters[c.id] = name
            lists[c.id] = ws
        for ins in self.instrs:
            for c, n in ins.waits:
                if n is None or n == c.per_step or c.id not in counters:
                    continue
                w0 = lists[c.id][0]
                if n == 1 and ins.opcode == Op.EXPERT_DOWN and w0.opcode == Op.EXPERT_UP and ins.args[5] == w0.args[0] + 1 and _same(ins.tensors[7], w0.tensors[7]) and _same(ins.tensors[1], w0.tensors[0]):
                    if w0.args[4]:
                        raise ProgramError(f"op #{ins.id} '{ins.label}' waits for {counters[c.id]}'s items all taken, but its workers are fixed (a4 > 0): "
                                           "an item may be held by a worker that has not started, behind the waiter: wait for all")
                    continue
                raise ProgramError(f"op #{ins.id} '{ins.label}' waits for {n} of the {c.per_step} signals of '{c.name}', which its {counters[c.id]} gives as 1 (items all taken) "
                                   f"and {c.per_step - 1} (done): wait for all, or for 1 from an EXPERT_DOWN that waits for the list's rows by expert (a5 = list + 1) and reads its output (t1 = its t0)")
        return set(counters)

    def build(self, order: str = "priority", capacity: int | None = None) -> "Stream":
        """Validate and encode. order='priority' sorts topologically, longest path
        (in bytes) first; order='depth' most ops to the end first, bytes breaking
        ties; order='given' keeps creation order and rejects a wait on a later op."""
        if not self.instrs:
            raise ProgramError(f"program '{self.name}' has no ops")
        cap = MAX_INSTRS if capacity is None else min(capacity, MAX_INSTRS)
        if len(self.instrs) > cap:
            raise ProgramError(f"program '{self.name}' has {len(self.instrs)} ops; the stream buffer holds {cap}")
        if len(self.counters) > MAX_COUNTERS:
            raise ProgramError(f"program '{self.name}' has {len(self.counters)} counters; at most {MAX_COUNTERS}")
        if len(self.tensors) > MAX_TABLE:
            raise ProgramError(f"program '{self.name}' has {len(self.tensors)} tensors; at most {MAX_TABLE}")
        graph = self._graph(self._check_lists())
        n = len(self.instrs)
        if order == "given":
            last = [max(m) for m in graph.members]
            for i, gs in enumerate(graph.op_groups):
                late = [last[g] for g in gs if last[g] >= i]
                if late:
                    j = min(late)
                    raise ProgramError(f"op #{i} '{self.instrs[i].label}' waits on op #{j} '{self.instrs[j].label}', which comes later in the stream")
            perm = list(range(n))
        elif order in ("priority", "depth"):
            perm = _priority_order(self.instrs, graph, by_depth=order == "depth")
        else:
            raise ProgramError(f"order must be 'priority', 'depth' or 'given', not {order!r}")
        return Stream(self, perm, graph)


@dataclass
class _Graph:
    """Ops wait on groups (op_groups[i]); a group fires once all its members
    (signaller ids) have run."""

    op_groups: list[list[int]]
    members: list[list[int]]

    def member_of(self, n: int) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in range(n)]
        for g, ms in enumerate(self.members):
            for s in ms:
                out[s].append(g)
        return out

    def group_users(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in self.members]
        for i, gs in enumerate(self.op_groups):
            for g in gs:
                out[g].append(i)
        return out

    def deps(self, i: int) -> list[int]:
        """Creation ids op i depends on."""
        d: set[int] = set()
        for g in self.op_groups[i]:
            d.update(self.members[g])
        return sorted(d)


def _kahn(n: int, graph: "_Graph", member_of: list[list[int]], users: list[list[int]], key: Callable[[int], tuple[float, ...]]) -> list[int]:
    """Ops in a topological order, the ready op with the smallest key first;
    ops on a cycle never become ready and are left out."""
    op_left = [len(gs) for gs in graph.op_groups]
    grp_left = [len(m) for m in graph.members]
    heap = [(key(i), i) for i in range(n) if op_left[i] == 0]
    heapq.heapify(heap)
    out: list[int] = []
    while heap:
        _, i = heapq.heappop(heap)
        out.append(i)
        for g in member_of[i]:
            grp_left[g] -= 1
            if grp_left[g] == 0:
                for u in users[g]:
                    op_left[u] -= 1
                    if op_left[u] == 0:
                        heapq.heappush(heap, (key(u), u))
    return out


def _priority_order(instrs: list[Instr], graph: _Graph, by_depth: bool = False) -> list[int]:
    n = len(instrs)
    member_of = graph.member_of(n)
    users = graph.group_users()
    topo = _kahn(n, graph, member_of, users, key=lambda i: (0.0, 0.0))
    if len(topo) != n:
        done = set(topo)
        stuck = [i for i in range(n) if i not in done]
        names = ", ".join(f"#{i} '{instrs[i].label}'" for i in stuck[:6])
        raise ProgramError(f"the program has a dependency cycle through {len(stuck)} ops: {names}")
    # longest path to the end, in time units of the op costs (bytes + a fixed step),
    # or (by_depth) as (ops, bytes): at decode sizes an op's fixed latency (hand-off
    # and a latency-bound pass, ~10 us on the H200) outweighs its bytes, and a
    # short op that starts a longer chain (the router before its top-k) must not
    # queue behind a wide one (the squeeze's 256 tiles fill every group).
    # In reverse topological order every user of a group is done before its members.
    path: list[tuple[float, float]] = [(0.0, 0.0)] * n
    gpath: list[tuple[float, float] | None] = [None] * len(graph.members)
    for i in reversed(topo):
        c = instrs[i].cost
        tail = (0.0, 0.0)
        for g in member_of[i]:
            gp = gpath[g]
            if gp is None:
                gp = gpath[g] = max(path[u] for u in users[g]) if users[g] else (0.0, 0.0)
            tail = max(tail, gp)
        step = 1.0 + (c.weight_bytes + c.act_bytes) / 4096.0
        path[i] = (tail[0] + 1.0, tail[1] + step) if by_depth else (0.0, tail[1] + step)
    for i, ins in enumerate(instrs):  # after every path: an op's own place does not move its ancestors'
        if ins.order_with is not None:
            path[i] = max(path[i], path[ins.order_with])
        if ins.order_after is not None:
            a = path[ins.order_after]
            path[i] = min(path[i], (a[0], a[1] - 1e-6))
    return _kahn(n, graph, member_of, users, key=lambda i: (not instrs[i].lead, -path[i][0], -path[i][1]))


class Stream:
    """An ordered, validated, encoded program. Immutable once built.

    ops[i] is the Instr at stream position i; records[i] its 128-byte record;
    deps[i] the stream positions it waits for.
    """

    def __init__(self, prog: Program, perm: list[int], graph: _Graph) -> None:
        self.name = prog.name
        self.tensors: tuple[TensorSpec, ...] = tuple(prog.tensors)
        self.counters: tuple[Counter, ...] = tuple(prog.counters)
        self.ops: tuple[Instr, ...] = tuple(prog.instrs[i] for i in perm)
        self._graph = graph
        self.records = self._encode()

    @cached_property
    def deps(self) -> tuple[tuple[int, ...], ...]:
        """Stream positions each op waits for (computed on first use: a wide
        counter makes this list large, and running a stream never needs it)."""
        pos = {ins.id: k for k, ins in enumerate(self.ops)}
        return tuple(tuple(sorted(pos[j] for j in self._graph.deps(ins.id))) for ins in self.ops)

    def __len__(self) -> int:
        return len(self.ops)

    @property
    def labels(self) -> list[str]:
        return [o.label for o in self.ops]

    @property
    def per_step(self) -> np.ndarray:
        """Signals each counter receives per step (uint32)."""
        return np.array([c.per_step for c in self.counters], dtype=np.uint32)

    def _encode(self) -> np.ndarray:
        # columns gathered in lists, then stored at once: per-record stores into
        # a structured array cost more than the whole build at 10k+ ops
        n = len(self.ops)
        head = np.zeros((n, 5), dtype=np.int64)  # opcode, signal, n_waits, pf_slot, flags
        wc = np.full((n, MAX_WAITS), NONE, dtype=np.int64)
        wb = np.zeros((n, MAX_WAITS), dtype=np.int64)
        ws = np.zeros((n, MAX_WAITS), dtype=np.int64)
        tens = np.full((n, MAX_TENSORS), NONE, dtype=np.int64)
        pf = np.zeros((n, 2), dtype=np.int64)
        args = np.zeros((n, MAX_ARGS), dtype=np.int64)
        for k, ins in enumerate(self.ops):
            head[k] = (int(ins.opcode), NONE if ins.signal is None else ins.signal.id, len(ins.waits), NONE if ins.prefetch is None else ins.prefetch[0], ins.flags)
            for i, (c, _) in enumerate(ins.waits):
                wc[k, i], wb[k, i], ws[k, i] = c.id, ins.wait_count(i), c.per_step
            tens[k, : len(ins.tensors)] = [NONE if t is None else t.index for t in ins.tensors]
            if ins.prefetch is not None:
                pf[k] = ins.prefetch[1:]
            args[k, : len(ins.args)] = ins.args
        rec = np.zeros(n, dtype=INSTR_DTYPE)
        rec["opcode"], rec["signal"], rec["n_waits"], rec["pf_slot"], rec["flags"] = head.T
        rec["wait_counter"], rec["wait_base"], rec["wait_step"] = wc, wb, ws
        rec["tensor"], rec["arg"] = tens, args
        rec["pf_offset"], rec["pf_bytes"] = pf.T
        return rec

    def table(self, bindings: Mapping[str, object]) -> np.ndarray:
        """Tensor descriptors for bound buffers (torch tensors by name); checks
        each buffer's shape and dtype against the declaration."""
        from .tensors import descriptor

        tab = np.zeros(len(self.tensors), dtype=TENSOR_DTYPE)
        for t in self.tensors:
            if t.name not in bindings:
                raise ProgramError(f"tensor '{t.name}' of '{self.name}' is not bound")
            tab[t.index] = descriptor(t, bindings[t.name])
        return tab

    def summary(self) -> str:
        by: dict[str, int] = {}
        for o in self.ops:
            by[o.opcode.name] = by.get(o.opcode.name, 0) + 1
        ops = ", ".join(f"{k} {v}" for k, v in sorted(by.items()))
        return f"{self.name}: {len(self)} instructions ({ops}), {len(self.counters)} counters, {len(self.tensors)} tensors"
