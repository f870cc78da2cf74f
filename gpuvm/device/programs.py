"""Streams that prove and time the VM: empty instructions (dispatch cost),
weight-streaming GEMMs (bandwidth), and a stream whose wait can never be met
(watchdog). Shared by tests/gpu and tools/gpu_check.py."""
from __future__ import annotations

import copy
import functools

import numpy as np
import torch

from ..isa import DTYPE_BYTES, DType, Op
from ..opspec import ProgramError
from ..program import Program, Stream
from ..tensors import empty, torch_dtype

__all__ = ["nop_stream", "gemm_stream", "gemm_bindings", "stuck_stream", "with_records"]


@functools.lru_cache(maxsize=8)
def nop_stream(n: int) -> Stream:
    """n independent empty instructions (cached: streams are immutable)."""
    p = Program(f"nop x{n}")
    for _ in range(n):
        p.op(Op.NOP)
    return p.build(order="given")


def gemm_stream(tokens: int, n: int, k: int, rows: int, dtype: DType = DType.BF16, out_dtype: DType | None = None, prefetch: bool = True) -> Stream:
    """out[T, N] = x[T, K] @ W[N, K]^T as independent GEMMs of `rows` output
    rows each; prefetch: each instruction's weight rows go to the loader."""
    if n % rows:
        raise ProgramError(f"{n} rows do not split into instructions of {rows}")
    out_dtype = out_dtype or dtype
    p = Program(f"gemm T{tokens} {n}x{k} {dtype.name.lower()} by {rows}")
    out = p.tensor("out", (tokens, n), out_dtype)
    x = p.tensor("x", (tokens, k), dtype)
    w = p.tensor("W", (n, k), dtype, role="weight")
    row_bytes = k * DTYPE_BYTES[dtype]
    for n0 in range(0, n, rows):
        pf = (w, n0 * row_bytes, rows * row_bytes) if prefetch else None
        p.op(Op.GEMM, [out, x, w], [n0, rows], prefetch=pf, label=f"gemm {n0}")
    return p.build(order="given")


def gemm_bindings(stream: Stream, device: torch.device, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random x and W (N(0, 1), W scaled by 1/sqrt(K)); out poisoned with NaN."""
    g = torch.Generator(device=device).manual_seed(seed)
    spec = {t.name: t for t in stream.tensors}
    k = spec["x"].shape[1]
    x = torch.randn(spec["x"].shape, generator=g, device=device).to(torch_dtype(spec["x"].dtype))
    w = (torch.randn(spec["W"].shape, generator=g, device=device) / k**0.5).to(torch_dtype(spec["W"].dtype))
    out = empty(spec["out"], device).fill_(float("nan"))
    return {"x": x, "W": w, "out": out}


def with_records(stream: Stream, records: np.ndarray) -> Stream:
    """The same stream with other records (to run what the builder would refuse)."""
    s = copy.copy(stream)
    s.records = records
    return s


def stuck_stream(target: int = 1000) -> tuple[Stream, int]:
    """A stream whose instruction 'stuck' waits for a target its counter never
    reaches (the builder rejects this, so the record is patched). Returns the
    stream and the stuck instruction's position."""
    p = Program("stuck")
    c = p.counter("never enough")
    p.op(Op.NOP, signal=c, label="signaller")
    p.op(Op.NOP, waits=[c], label="stuck")
    p.op(Op.NOP, label="bystander")
    s = p.build(order="given")
    rec = s.records.copy()
    i = s.labels.index("stuck")
    rec[i]["wait_base"][0] = target
    return with_records(s, rec), i
