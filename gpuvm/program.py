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
from typing import Iterable, Mapping, Sequence

import numpy as np

from .isa import INSTR_DTYPE, MAX_ARGS, MAX_COUNTERS, MAX_INSTRS, MAX_TABLE, MAX_TENSORS, MAX_WAITS, NONE, TENSOR_DTYPE, DType, Op
from .opspec import SPECS, Cost, ProgramError, TensorSpec

__all__ = ["Program", "Stream", "Counter", "Instr", "ProgramError", "TensorSpec"]


@dataclass(eq=False)
class Counter:
    """A monotonic device counter; each op that signals it adds one per step."""

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

    def wait_count(self, i: int) -> int:
        c, n = self.waits[i]
        return c.per_step if n is None else n


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
        if role not in ("weight", "activation", "state"):
            raise ProgramError(f"tensor '{name}': role {role!r} is not weight, activation or state")
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
    ) -> Instr:
        """Add an op. waits: counters (wait for all their signallers) or (counter, count)."""
        opcode = Op(opcode)
        spec = SPECS[opcode]
        where = f"op #{len(self.instrs)} {opcode.name}" + (f" '{label}'" if label else "")
        if len(tensors) > MAX_TENSORS or len(args) > MAX_ARGS:
            raise ProgramError(f"{where}: at most {MAX_TENSORS} tensors and {MAX_ARGS} args")
        for t in tensors:
            if t is not None and (t.index < 0 or t.index >= len(self.tensors) or self.tensors[t.index] is not t):
                raise ProgramError(f"{where}: tensor '{t.name}' is not declared in this program")
        args_t = tuple(int(a) for a in args) + (0,) * (len(spec.args) - len(args))
        for a in args_t:
            if not -(2**31) <= a < 2**31:
                raise ProgramError(f"{where}: argument {a} does not fit int32")
        try:
            spec.check(tensors, args_t)
        except ProgramError as e:
            raise ProgramError(f"{where}: {e}") from None
        norm_waits: list[tuple[Counter, int | None]] = []
        for w in waits:
            c, n = (w, None) if isinstance(w, Counter) else (w[0], int(w[1]))
            if not isinstance(c, Counter) or c.id >= len(self.counters) or self.counters[c.id] is not c:
                raise ProgramError(f"{where}: waits on a counter not declared in this program")
            if n is not None and n < 1:
                raise ProgramError(f"{where}: wait count {n} on '{c.name}' must be >= 1")
            norm_waits.append((c, n))
        if len(norm_waits) > MAX_WAITS:
            raise ProgramError(f"{where}: at most {MAX_WAITS} waits")
        if signal is not None and (signal.id >= len(self.counters) or self.counters[signal.id] is not signal):
            raise ProgramError(f"{where}: signals a counter not declared in this program")
        pf = None
        if prefetch is not None:
            pt, off, nb = prefetch
            if pt not in tensors:
                raise ProgramError(f"{where}: prefetch tensor '{pt.name}' is not one of the op's tensors")
            if off < 0 or nb < 0 or off + nb > pt.nbytes or nb >= 2**32:
                raise ProgramError(f"{where}: prefetch [{off}, {off + nb}) outside '{pt.name}' ({pt.nbytes} bytes)")
            pf = (list(tensors).index(pt), int(off), int(nb))
        ins = Instr(len(self.instrs), opcode, tuple(tensors), args_t, tuple(norm_waits), signal, pf, label or opcode.name.lower(), spec.cost(tensors, args_t))
        self.instrs.append(ins)
        if signal is not None:
            signal.signallers.append(ins)
        return ins

    # -- build ---------------------------------------------------------------
    def _deps(self) -> list[list[int]]:
        """Creation ids each op depends on: the signallers its waits need."""
        deps: list[list[int]] = []
        for ins in self.instrs:
            d: set[int] = set()
            for i, (c, n) in enumerate(ins.waits):
                need = ins.wait_count(i)
                if c.per_step == 0:
                    raise ProgramError(f"op #{ins.id} '{ins.label}' waits on counter '{c.name}', which nothing signals: it can never be reached")
                if need > c.per_step:
                    raise ProgramError(
                        f"op #{ins.id} '{ins.label}' waits for {need} signals of '{c.name}', but only {c.per_step} ops signal it: the target can never be reached"
                    )
                d.update(s.id for s in c.signallers[:need])
            if ins.id in d:
                raise ProgramError(f"op #{ins.id} '{ins.label}' waits on its own signal ('{ins.signal.name if ins.signal else ''}'): a cycle")
            deps.append(sorted(d))
        return deps

    def build(self, order: str = "priority", capacity: int | None = None) -> "Stream":
        """Validate and encode. order='priority' sorts topologically, longest path
        first; order='given' keeps creation order and rejects a wait on a later op."""
        if not self.instrs:
            raise ProgramError(f"program '{self.name}' has no ops")
        cap = MAX_INSTRS if capacity is None else min(capacity, MAX_INSTRS)
        if len(self.instrs) > cap:
            raise ProgramError(f"program '{self.name}' has {len(self.instrs)} ops; the stream buffer holds {cap}")
        if len(self.counters) > MAX_COUNTERS:
            raise ProgramError(f"program '{self.name}' has {len(self.counters)} counters; at most {MAX_COUNTERS}")
        if len(self.tensors) > MAX_TABLE:
            raise ProgramError(f"program '{self.name}' has {len(self.tensors)} tensors; at most {MAX_TABLE}")
        deps = self._deps()
        n = len(self.instrs)
        users: list[list[int]] = [[] for _ in range(n)]
        for i, d in enumerate(deps):
            for j in d:
                users[j].append(i)
        if order == "given":
            for i, d in enumerate(deps):
                late = [j for j in d if j >= i]
                if late:
                    j = late[0]
                    raise ProgramError(f"op #{i} '{self.instrs[i].label}' waits on op #{j} '{self.instrs[j].label}', which comes later in the stream")
            perm = list(range(n))
        elif order == "priority":
            perm = _priority_order(self.instrs, deps, users)
        else:
            raise ProgramError(f"order must be 'priority' or 'given', not {order!r}")
        return Stream(self, perm, deps)


def _priority_order(instrs: list[Instr], deps: list[list[int]], users: list[list[int]]) -> list[int]:
    n = len(instrs)
    indeg = [len(d) for d in deps]
    # longest path to the end, in time units of the op costs (bytes + a fixed step)
    topo: list[int] = []
    ready = [i for i in range(n) if indeg[i] == 0]
    left = list(indeg)
    while ready:
        i = ready.pop()
        topo.append(i)
        for u in users[i]:
            left[u] -= 1
            if left[u] == 0:
                ready.append(u)
    if len(topo) != n:
        stuck = [i for i in range(n) if left[i] > 0]
        names = ", ".join(f"#{i} '{instrs[i].label}'" for i in stuck[:6])
        raise ProgramError(f"the program has a dependency cycle through {len(stuck)} ops: {names}")
    path = [0.0] * n
    for i in reversed(topo):
        c = instrs[i].cost
        own = 1.0 + (c.weight_bytes + c.act_bytes) / 4096.0
        path[i] = own + max((path[u] for u in users[i]), default=0.0)
    heap = [(-path[i], i) for i in range(n) if indeg[i] == 0]
    heapq.heapify(heap)
    out: list[int] = []
    while heap:
        _, i = heapq.heappop(heap)
        out.append(i)
        for u in users[i]:
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(heap, (-path[u], u))
    return out


class Stream:
    """An ordered, validated, encoded program. Immutable once built.

    ops[i] is the Instr at stream position i; records[i] its 128-byte record;
    deps[i] the stream positions it waits for.
    """

    def __init__(self, prog: Program, perm: list[int], deps_by_id: list[list[int]]) -> None:
        self.name = prog.name
        self.tensors: tuple[TensorSpec, ...] = tuple(prog.tensors)
        self.counters: tuple[Counter, ...] = tuple(prog.counters)
        self.ops: tuple[Instr, ...] = tuple(prog.instrs[i] for i in perm)
        pos = {ins.id: k for k, ins in enumerate(self.ops)}
        self.deps: tuple[tuple[int, ...], ...] = tuple(tuple(sorted(pos[j] for j in deps_by_id[ins.id])) for ins in self.ops)
        self.records = self._encode()

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
        rec = np.zeros(len(self.ops), dtype=INSTR_DTYPE)
        for k, ins in enumerate(self.ops):
            r = rec[k]
            r["opcode"] = int(ins.opcode)
            r["signal"] = NONE if ins.signal is None else ins.signal.id
            r["n_waits"] = len(ins.waits)
            wc = [NONE] * MAX_WAITS
            wb = [0] * MAX_WAITS
            ws = [0] * MAX_WAITS
            for i, (c, _) in enumerate(ins.waits):
                wc[i], wb[i], ws[i] = c.id, ins.wait_count(i), c.per_step
            r["wait_counter"], r["wait_base"], r["wait_step"] = wc, wb, ws
            r["tensor"] = [NONE if t is None else t.index for t in ins.tensors] + [NONE] * (MAX_TENSORS - len(ins.tensors))
            if ins.prefetch is None:
                r["pf_slot"] = NONE
            else:
                r["pf_slot"], r["pf_offset"], r["pf_bytes"] = ins.prefetch
            r["arg"] = list(ins.args) + [0] * (MAX_ARGS - len(ins.args))
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
