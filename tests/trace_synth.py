"""Synthetic traces for the trace-tool tests: a random DAG of labelled ops run
by a small list scheduler on blocks x warp groups, with the stamps a device
would record (claims ahead of a free group, load issue after claim, ready
after the last dependency's signal), as a model trace or as a GPU trace
(globaltimer in 256 ns steps, clock64 per SM at clock_hz)."""
from __future__ import annotations

import numpy as np

from gpuvm.isa import TRACE_DTYPE
from gpuvm.trace.format import Trace
from gpuvm.trace.timeline import LOAD, SIGNAL

FAMILIES = ["L0.rms", "L0.wqkvg", "L0.attn_chunk", "L0.merge", "L0.wo", "L0.router", "L0.expert_up", "L0.expert_down", "L0.combine"]


def random_dag(rng: np.random.Generator, n: int) -> tuple[list[str], list[tuple[int, ...]]]:
    """Labels in stream order (families in order, tiles "[k]" or " c.. h.."),
    each instruction depending on up to 3 earlier ones."""
    fams = sorted(rng.choice(len(FAMILIES), size=n))
    labels, deps, tile = [], [], {}
    for i, f in enumerate(fams):
        k = tile[f] = tile.get(f, -1) + 1
        name = FAMILIES[f]
        labels.append(f"{name} c{k % 2} h{k // 2}" if "attn" in name else f"{name}[{k}]")
        cand = [j for j in range(i) if fams[j] < f]
        m = min(len(cand), int(rng.integers(0, 4)))
        deps.append(tuple(sorted(int(j) for j in rng.choice(cand, size=m, replace=False))) if m else ())
    return labels, deps


def schedule(rng: np.random.Generator, deps: list[tuple[int, ...]], weight: np.ndarray, blocks: int, groups: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """True stamps (ns, int64 [n, 5]) and the block and group of each instruction."""
    n = len(deps)
    t = np.zeros((n, 5), dtype=np.int64)
    free = np.zeros((blocks, groups), dtype=np.int64)
    blk = np.zeros(n, dtype=np.int64)
    grp = np.zeros(n, dtype=np.int64)
    last_claim = 0
    for i in range(n):
        b, g = np.unravel_index(int(np.argmin(free)), free.shape)
        claim = max(last_claim + int(rng.integers(1, 30)), int(free[b, g]) - int(rng.integers(0, 400)), 0)
        last_claim = claim
        inputs = max((int(t[j, SIGNAL]) for j in deps[i]), default=0)
        ready = max(claim + int(rng.integers(5, 60)), int(free[b, g]), inputs + int(rng.integers(20, 300)))
        done = ready + int(rng.integers(200, 3000))
        signal = done + int(rng.integers(5, 80))
        load = claim + int(rng.integers(2, 40)) if weight[i] else 0
        t[i] = (claim, load, ready, done, signal)
        free[b, g] = signal
        blk[i], grp[i] = b, g
    return t, blk, grp


def make_trace(
    seed: int,
    n: int = 40,
    blocks: int = 4,
    groups: int = 2,
    source: str = "model",
    clock_hz: float | None = None,
) -> tuple[Trace, np.ndarray]:
    """A random trace and its true stamps (ns from 0; load 0 when none)."""
    rng = np.random.default_rng(seed)
    labels, deps = random_dag(rng, n)
    weight = np.where(rng.random(n) < 0.7, rng.integers(1 << 12, 1 << 20, n), 0).astype(np.int64)
    act = rng.integers(0, 1 << 14, n).astype(np.int64)
    true, blk, grp = schedule(rng, deps, weight, blocks, groups)
    rec = np.zeros(n, dtype=TRACE_DTYPE)
    sm_of_block = rng.permutation(blocks) + 7
    rec["sm"], rec["block"], rec["group"], rec["instr"] = sm_of_block[blk], blk, grp, np.arange(n)
    meta: dict = {"source": source}
    if source == "model":
        rec["globaltimer"] = true
    else:
        base = 1_700_000_000_123_456_789
        gt = (base + true) // 256 * 256
        hz = clock_hz or 1.755e9
        clk0 = rng.integers(10**9, 10**12, blocks + 7)
        clk = clk0[rec["sm"]][:, None] + np.rint(true * (hz / 1e9)).astype(np.int64)
        unset = np.zeros_like(true, dtype=bool)
        unset[:, LOAD] = weight == 0
        rec["globaltimer"] = np.where(unset, 0, gt)
        rec["clock"] = np.where(unset, 0, clk)
        if clock_hz:
            meta["clock_hz"] = clock_hz
    trace = Trace(records=rec, labels=labels, opcodes=np.full(n, 16, np.uint16), deps=deps, weight_bytes=weight, act_bytes=act, meta=meta)
    return trace, true

