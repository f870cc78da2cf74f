"""The warmer's instructions: one tiny, real instance of each compiled op the
warmer knows, over dummy tensors, run by group 0 of each block at launch
(runtime/warm.cuh) so that the op's code is in L2 and the SM's instruction
cache before the stream needs it."""
from __future__ import annotations

from typing import Callable, Collection

import torch

from ..isa import DType, Op, f2i
from ..program import Program, Stream
from ..tensors import empty

_F = DType.F32
_B = DType.BF16


def _nop(p: Program) -> None:
    p.op(Op.NOP, label="warm nop")


def _sleep(p: Program) -> None:
    p.op(Op.SLEEP, [], [0], label="warm sleep")


def _elementwise(p: Program, op: Op) -> None:
    a, b, c = (p.tensor(f"{op.name.lower()}_{k}", (256,), _F) for k in "abc")
    if op == Op.COPY:
        p.op(op, [a, b], [0, 256], label="warm copy")
    else:
        p.op(op, [a, b, c], [0, 256, f2i(1.0), f2i(1.0)], label="warm scale_add")


def _gemm(p: Program) -> None:
    for dtype in (_B, _F):  # both paths of the op
        tag = dtype.name.lower()
        out = p.tensor(f"gemm_{tag}_out", (8, 32), dtype)
        x = p.tensor(f"gemm_{tag}_x", (8, 256), dtype)
        w = p.tensor(f"gemm_{tag}_w", (32, 256), dtype, role="weight")
        p.op(Op.GEMM, [out, x, w], [0, 32], label=f"warm gemm {tag}")


#: one builder per op the warmer knows: adds tiny, valid instances of the op
WARMERS: dict[Op, Callable[[Program], None]] = {
    Op.NOP: _nop,
    Op.SLEEP: _sleep,
    Op.COPY: lambda p: _elementwise(p, Op.COPY),
    Op.SCALE_ADD: lambda p: _elementwise(p, Op.SCALE_ADD),
    Op.GEMM: _gemm,
}


def warm_stream(compiled: Collection[Op]) -> Stream | None:
    """The warm instructions for the ops compiled in (None if there are none)."""
    p = Program("warm")
    for op in sorted(compiled):
        if op in WARMERS:
            WARMERS[op](p)
    return p.build(order="given") if p.instrs else None


def warm_bindings(stream: Stream, device: torch.device) -> dict[str, torch.Tensor]:
    """Zeroed dummies for every tensor of the warm stream."""
    return {t.name: empty(t, device).zero_() for t in stream.tensors}
