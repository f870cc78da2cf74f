"""Run an instruction stream on the CPU, one instruction at a time.

Waits are checked exactly as the device checks them: a wait on counter c with
(wait_base, wait_step) is satisfied at step s when
(int32)(value(c) - (wait_base + s * wait_step)) >= 0, and an instruction adds
one to its signal counter when it finishes (a work list's worker: what its op
returns, see gpuvm.cpu.ops). Counters are never reset: pass the array one
step returns into the next step.

order="stream" runs the stream in its order and fails at the first
instruction whose waits are not met; order="random" runs, at each point, a
random instruction among those whose waits are met, which exercises every
valid interleaving the device scheduler could pick; order="newest" runs the
one whose waits were met last (depth first), so that an instruction ready
early waits as long as any schedule could make it: e.g. the late workers of
an expert list, whose finisher signalled for them, run after the layers
that follow.
"""
from __future__ import annotations

import random
from typing import Callable, Mapping

import numpy as np
import torch

from ..isa import NONE, Op
from ..opspec import ProgramError
from ..program import Stream
from ..tensors import check_binding
from .ops import OPS, CpuOpError

__all__ = ["run_stream", "StuckError", "CpuOpError"]

ORDERS = ("stream", "random", "newest")


class StuckError(RuntimeError):
    """No instruction can run: the device would hit its watchdog here."""


def _target(base: int, step_: int, step: int) -> int:
    return (base + step * step_) & 0xFFFFFFFF


def _reached(value: int, target: int) -> bool:
    """(int32)(value - target) >= 0, the device's wrap-safe comparison."""
    return ((value - target) & 0xFFFFFFFF) < 0x80000000


def run_stream(
    stream: Stream,
    bindings: Mapping[str, torch.Tensor],
    step: int = 0,
    order: str = "stream",
    rng: random.Random | None = None,
    counters: np.ndarray | None = None,
    threads: int = 1,
) -> np.ndarray:
    """Execute one step of stream on CPU tensors bound by name (updated in place).

    counters: the values the previous step left (uint32, one per counter of the
    stream); None starts from zero, and zeroes the tensors of role "ticket" too.
    Returns the counters after the step.
    threads: torch's intra-op threads during the run (restored after): one
    suits thousands of small ops, whose fork/join costs more than it saves and
    stalls badly when other processes share the cores.
    """
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, not {order!r}")
    if step < 0:
        raise ValueError(f"step must be >= 0, not {step}")
    if threads < 1:
        raise ValueError(f"threads must be >= 1, not {threads}")
    bufs: list[torch.Tensor] = []
    for spec in stream.tensors:
        if spec.name not in bindings:
            raise ProgramError(f"tensor '{spec.name}' of '{stream.name}' is not bound")
        buf = check_binding(spec, bindings[spec.name])
        if buf.device.type != "cpu":
            raise ProgramError(f"tensor '{spec.name}' is on {buf.device}; the CPU backend needs CPU tensors")
        bufs.append(buf)
    n_ctr = len(stream.counters)
    if counters is None:
        values = [0] * n_ctr
        for spec, buf in zip(stream.tensors, bufs):
            if spec.role == "ticket":  # counted from zero with the counters (gpuvm.program.ROLES)
                buf.zero_()
    else:
        counters = np.asarray(counters)
        if counters.shape != (n_ctr,):
            raise ValueError(f"counters must have shape ({n_ctr},), not {counters.shape}")
        values = [int(v) & 0xFFFFFFFF for v in counters]

    rec = stream.records
    waits: list[list[tuple[int, int]]] = []  # per instruction: (counter, target)
    for k in range(len(stream)):
        r = rec[k]
        waits.append([(int(r["wait_counter"][i]), _target(int(r["wait_base"][i]), int(r["wait_step"][i]), step)) for i in range(int(r["n_waits"]))])
    slots = [[None if t == NONE else bufs[t] for t in rec[k]["tensor"]] for k in range(len(stream))]
    args = [tuple(int(a) for a in rec[k]["arg"]) for k in range(len(stream))]
    signal = [int(s) for s in rec["signal"]]
    fns = [OPS[Op(int(o))] for o in rec["opcode"]]  # what the records say, as the device decodes them

    def execute(k: int) -> tuple[int, int]:
        """Run instruction k and signal; returns the counter (or NONE) and what it added."""
        try:
            n = fns[k](slots[k], args[k])
        except CpuOpError as e:
            raise CpuOpError(f"instruction {k} '{stream.ops[k].label}' at step {step}: {e}") from None
        n = 1 if n is None else n
        if signal[k] != NONE:
            values[signal[k]] = (values[signal[k]] + n) & 0xFFFFFFFF
        return signal[k], n

    def stuck(k: int) -> StuckError:
        c, t = next((c, t) for c, t in waits[k] if not _reached(values[c], t))
        why = "when its turn came in stream order" if order == "stream" else "and nothing left to run can raise it"
        return StuckError(f"step {step}: instruction {k} '{stream.ops[k].label}' waits on counter {c} '{stream.counters[c].name}' = {values[c]}, target {t}, {why}")

    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        if order == "stream":
            for k in range(len(stream)):
                if not all(_reached(values[c], t) for c, t in waits[k]):
                    raise stuck(k)
                execute(k)
        else:
            _run_random(len(stream), waits, values, execute, stuck, rng or random.Random(0), newest=order == "newest")
    finally:
        torch.set_num_threads(saved)
    return np.array(values, dtype=np.uint32)


def _run_random(
    n: int,
    waits: list[list[tuple[int, int]]],
    values: list[int],
    execute: Callable[[int], tuple[int, int]],
    stuck: Callable[[int], StuckError],
    rng: random.Random,
    newest: bool = False,
) -> None:
    """Pick a random ready instruction (newest: the last one to become ready)
    until none is left.

    An unmet wait is (distance, instruction): the signals its counter still
    needs. Each counter keeps its unmet waits sorted, so a signal wakes exactly
    the waits it completes."""
    unmet = [0] * n
    pending: dict[int, list[tuple[int, int]]] = {}
    for k in range(n):
        for c, t in waits[k]:
            if not _reached(values[c], t):
                unmet[k] += 1
                pending.setdefault(c, []).append(((t - values[c]) & 0xFFFFFFFF, k))
    for lst in pending.values():
        lst.sort(reverse=True)  # nearest target last, popped first
    signals = dict.fromkeys(pending, 0)
    ready = [k for k in range(n) if unmet[k] == 0]
    done = 0
    while ready:
        if not newest:
            i = rng.randrange(len(ready))
            ready[i], ready[-1] = ready[-1], ready[i]
        k = ready.pop()
        c, added = execute(k)
        done += 1
        lst = pending.get(c)
        if lst is None:
            continue
        signals[c] += added
        while lst and lst[-1][0] <= signals[c]:
            u = lst.pop()[1]
            unmet[u] -= 1
            if unmet[u] == 0:
                ready.append(u)
    if done < n:
        raise stuck(next(k for k in range(n) if unmet[k] > 0))
