"""Random valid programs of synthetic ops, for property tests.

random_program(rng, n_ops) builds a random DAG of NOP, SLEEP, COPY and
SCALE_ADD on f32 tensors. Ops signal new or shared counters and wait on
counters that earlier ops signal, for all their signallers or for a partial
count. The data flow is race-free, so any valid execution order gives the
same values: op i writes only its own tensor y{i}, and reads only x0, x1 and
the tensors of ops it waits on in full (a partial wait orders, never feeds:
its count may be met by any of the signallers).

    from tests.randprog import random_program, programs
    p = random_program(random.Random(0), 40)
    @given(programs(max_ops=30))
    def test(p): ...
"""
from __future__ import annotations

import random

from hypothesis import strategies as st

from gpuvm.isa import MAX_WAITS, DType, Op, f2i
from gpuvm.program import Counter, Program, TensorSpec

__all__ = ["random_program", "programs", "streams"]


def random_program(
    rng: random.Random,
    n_ops: int,
    *,
    size: int = 64,
    p_signal: float = 0.8,
    p_shared: float = 0.3,
    p_partial: float = 0.3,
    max_waits: int = MAX_WAITS,
    max_sleep_ns: int = 2000,
    name: str = "random",
) -> Program:
    """A random valid program of n_ops synthetic ops on f32 tensors of `size` elements.

    p_signal: chance an op signals; p_shared: chance it signals a counter that
    earlier ops already signal; p_partial: chance a wait is for fewer than all
    signallers; each op waits on up to max_waits counters.
    """
    if n_ops < 1 or size < 1 or not 0 <= max_waits <= MAX_WAITS:
        raise ValueError(f"random_program needs n_ops >= 1, size >= 1 and 0 <= max_waits <= {MAX_WAITS}")
    p = Program(name)
    xs = [p.tensor(f"x{k}", (size,), DType.F32) for k in range(2)]
    signallers: dict[int, list[int]] = {}  # counter id -> ops that signal it
    closed: set[int] = set()  # counters waited on in full: no new signallers
    outs: list[TensorSpec] = []
    for i in range(n_ops):
        live = [c for c in p.counters if signallers.get(c.id)]
        waits: list[Counter | tuple[Counter, int]] = []
        readable = list(xs)
        for c in rng.sample(live, min(len(live), rng.randint(0, max_waits))):
            have = len(signallers[c.id])
            if rng.random() < p_partial:
                waits.append((c, rng.randint(1, have)))
            else:
                waits.append(c)
                closed.add(c.id)
                readable += [outs[j] for j in signallers[c.id] if outs[j] is not None]
        signal = None
        if rng.random() < p_signal:
            open_ = [c for c in live if c.id not in closed]
            signal = rng.choice(open_) if open_ and rng.random() < p_shared else p.counter(f"c{len(p.counters)}")
            signallers.setdefault(signal.id, []).append(i)
        kind = rng.choice([Op.NOP, Op.SLEEP, Op.COPY, Op.SCALE_ADD])
        y = None
        if kind == Op.NOP:
            tensors, args = [], []
        elif kind == Op.SLEEP:
            tensors, args = [], [rng.randint(0, max_sleep_ns)]
        else:
            y = p.tensor(f"y{i}", (size,), DType.F32)
            i0 = rng.randrange(size)
            n = rng.randint(1, size - i0)
            if kind == Op.COPY:
                tensors, args = [y, rng.choice(readable)], [i0, n]
            else:
                a, b = rng.uniform(-2, 2), rng.uniform(-2, 2)
                tensors, args = [y, rng.choice(readable), rng.choice(readable)], [i0, n, f2i(a), f2i(b)]
        outs.append(y)
        p.op(kind, tensors, args, waits=waits, signal=signal, label=f"{kind.name.lower()}{i}")
    return p


@st.composite
def programs(draw: st.DrawFn, max_ops: int = 40, **kw: object) -> Program:
    """Hypothesis strategy: a random_program of 1..max_ops ops from a drawn seed."""
    n = draw(st.integers(1, max_ops))
    seed = draw(st.integers(0, 2**32 - 1))
    return random_program(random.Random(seed), n, **kw)  # type: ignore[arg-type]


@st.composite
def streams(draw: st.DrawFn, max_ops: int = 40, **kw: object) -> object:
    """Hypothesis strategy: a built Stream (priority order) of a random program."""
    return draw(programs(max_ops, **kw)).build()
