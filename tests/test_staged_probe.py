"""tools/staged_probe.py's program, on the CPU backend: a wave of K-part tiles
computes x @ W^T whatever the parts, and the kernel's host checks take it."""
from __future__ import annotations

import pytest
import torch

from gpuvm.cpu.backend import run_stream
from gpuvm.device.validate import check_records
from gpuvm.isa import Op
from tools.staged_probe import bindings, wave_stream


@pytest.mark.parametrize("rows,kpart", [(64, 256), (128, 512), (64, 1024)])
def test_a_wave_of_k_part_tiles_computes_x_times_w(rows: int, kpart: int) -> None:
    stream, tiles, parts = wave_stream(64, rows, 1024, kpart, 8)
    assert parts == 1024 // kpart and tiles * parts == len(stream) == 8
    b = bindings(stream, torch.device("cpu"))
    check_records(stream.records, stream.table(b), len(stream.counters), set(Op), stream.labels)
    run_stream(stream, b)
    ref = b["x"].float() @ b["W"].float().T
    assert ((b["out"].float() - ref).norm() / ref.norm()).item() < 5e-3


def test_a_k_part_that_does_not_divide_k_is_refused() -> None:
    with pytest.raises(SystemExit, match="not a multiple"):
        wave_stream(64, 64, 1024, 384, 8)
