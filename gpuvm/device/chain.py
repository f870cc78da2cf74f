"""The same instructions as a chain of kernel launches, one per op: what the
VM saves over the kernel-per-op chains that serving engines run.

An op is the set of instructions sharing a label stem ("L3.Wqkvg[0:16]" and
"L3.Wqkvg[16:32]" are op "L3.Wqkvg"). Each op becomes a stream of its own, with
its waits and signals dropped (the launch boundary orders it after the ops it
read from), run by the same persistent kernel; the launches go in a
topological order of the ops, and a CUDA graph holds the whole chain so that
host launch cost stays out of the figure, as a serving engine's graphs do.
"""
from __future__ import annotations

from typing import Mapping

import torch

from ..opspec import ProgramError
from ..program import Program, Stream
from .vm import VM, Loaded

__all__ = ["op_stem", "op_groups", "split_by_op", "OpChain"]


def op_stem(label: str) -> str:
    """The op an instruction belongs to: its label up to the first '['."""
    return label.split("[", 1)[0]


def op_groups(stream: Stream) -> list[tuple[str, list[int]]]:
    """(op, stream positions) in an order where every op comes after the ops it
    waits on. Raises ProgramError if an op waits on itself (it could not run
    as one launch) or the ops form a cycle."""
    groups: dict[str, list[int]] = {}
    for k, o in enumerate(stream.ops):
        groups.setdefault(op_stem(o.label), []).append(k)
    of = {k: g for g, ks in groups.items() for k in ks}
    needs: dict[str, set[str]] = {g: set() for g in groups}
    for k, deps in enumerate(stream.deps):
        for d in deps:
            if of[d] == of[k]:
                raise ProgramError(f"op '{of[k]}' waits on itself ('{stream.ops[k].label}' on '{stream.ops[d].label}'): it cannot be one launch")
            needs[of[k]].add(of[d])
    order, done = [], set()
    while len(order) < len(groups):  # stream order is topological per instruction: first-appearance order mostly works
        ready = [g for g in groups if g not in done and needs[g] <= done]
        if not ready:
            raise ProgramError("the ops of the stream form a cycle")
        for g in ready:
            order.append(g)
            done.add(g)
    return [(g, groups[g]) for g in order]


def split_by_op(stream: Stream) -> list[Stream]:
    """One stream per op (op_groups order), same tensors by name, no waits or signals."""
    out = []
    for name, ks in op_groups(stream):
        p = Program(f"{stream.name}: {name}")
        specs: dict[str, object] = {}
        for k in ks:
            ins = stream.ops[k]
            ts = []
            for t in ins.tensors:
                if t is not None and t.name not in specs:
                    specs[t.name] = p.tensor(t.name, t.shape, t.dtype, t.role)
                ts.append(None if t is None else specs[t.name])
            pf = None
            if ins.prefetch is not None:
                slot, off, nbytes = ins.prefetch
                pf = (ts[slot], off, nbytes)
            p.op(ins.opcode, ts, ins.args, prefetch=pf, label=ins.label)  # type: ignore[arg-type]
        out.append(p.build(order="given"))
    return out


class OpChain:
    """A stream run as one launch per op, on the VM's kernel."""

    def __init__(self, vm: VM, stream: Stream, bindings: Mapping[str, torch.Tensor]) -> None:
        self.vm = vm
        self.parts: list[Loaded] = [vm.load(s, {t.name: bindings[t.name] for t in s.tensors}) for s in split_by_op(stream)]

    def __len__(self) -> int:
        return len(self.parts)

    def run(self, step: int, stream: torch.cuda.Stream | None = None, check: bool = True) -> None:
        """The chain once (dynamic mode), on stream; check: wait and raise a device error."""
        ts = self.vm.torch_stream(stream)
        for ld in self.parts:
            ld.run(step, "dynamic", check=False, stream=ts)
        if check:
            for ld in self.parts:
                ld.check(ts)

    def graph(self, step: int = 0) -> torch.cuda.CUDAGraph:
        """The chain captured in a CUDA graph (replay() runs it once)."""
        ts = torch.cuda.Stream(self.vm.torch_device)
        ts.wait_stream(torch.cuda.current_stream(self.vm.torch_device))
        self.run(step, ts)  # warm-up outside the capture
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=ts):
            self.run(step, ts, check=False)
        return g

    def check(self, stream: torch.cuda.Stream | None = None) -> None:
        """Raise the error any part's last launch recorded."""
        for ld in self.parts:
            ld.check(stream)
