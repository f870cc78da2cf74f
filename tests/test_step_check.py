"""tools/step_check.py sizes each shape's run before it makes the weights, so
that a shape that cannot fit fails with OutOfDeviceMemory, not partway through."""
from __future__ import annotations

from gpuvm.muse.config import SHARD
from gpuvm.muse.memory import step_memory
from tools.step_check import shape_memory


def shape_need(check: bool) -> int:
    return step_memory(SHARD, 32, 8, 81_920, 101, layers=SHARD.n_layers, **shape_memory(check)).total  # type: ignore[arg-type]


def test_an_unchecked_shape_needs_what_the_step_sweep_holds() -> None:
    assert shape_need(check=False) == step_memory(SHARD, 32, 8, 81_920, 101).total


def test_the_checked_shape_adds_its_layers_scratch_captures_and_a_state_copy() -> None:
    shared = step_memory(SHARD, 32, 8, 81_920, 101)
    own = step_memory(SHARD, 32, 8, 81_920, 101, share_scratch=False, capture_layers=True)
    need = shape_need(check=True)
    assert need == own.total + own.kv
    # 32 x 8 checked does not fit an 80 GB card, unchecked it does (H100, session 67)
    assert need > 85e9 > shared.total
