"""tools/calibrate_model.py and tools/model_whatif.py, without traces or a GPU."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import calibrate_model  # noqa: E402
import model_whatif  # noqa: E402

from gpuvm.isa import Op  # noqa: E402
from gpuvm.sim import Hardware, OpTiming  # noqa: E402
from gpuvm.sim import fitted  # noqa: E402
from gpuvm.sim.fitted import fitted_hardware, load  # noqa: E402


def test_a_what_if_sets_or_scales_a_field_or_an_opcodes_timing() -> None:
    hw = Hardware(ops={"GEMM": OpTiming(2000.0, 0.5)})
    assert model_whatif.apply(hw, "signal_latency_ns=*0.5").signal_latency_ns == hw.signal_latency_ns / 2
    assert model_whatif.apply(hw, "claim_depth=2").claim_depth == 2 and isinstance(model_whatif.apply(hw, "claim_depth=2").claim_depth, int)
    assert model_whatif.apply(hw, "GEMM.fixed_ns=*0.25").timing(Op.GEMM) == OpTiming(500.0, 0.5)
    assert model_whatif.apply(hw, "TOPK.math_fraction=0.5").timing(Op.TOPK) == OpTiming(hw.launch_ns, 0.5)  # unnamed: from launch_ns
    for bad in ("signal_latency_ns", "bogus=1", "ops=1", "FOO.fixed_ns=1", "GEMM.speed=1", "GEMM.fixed_ns=x"):
        with pytest.raises(SystemExit):
            model_whatif.apply(hw, bad)


def test_a_what_if_tiling_is_a_checked_tiles() -> None:
    from gpuvm.muse.lowering import Tiles
    assert model_whatif.tiling("qk_tokens=2+router_bytes=131072") == Tiles(qk_tokens=2, router_bytes=131072)
    for bad in ("bogus=1", "qk_tokens", "qk_tokens=x", "gemm_parts=3", "router_bytes=0"):
        with pytest.raises(SystemExit):
            model_whatif.tiling(bad)


def test_the_calibrations_parameters_make_the_stored_hardware() -> None:
    """The fit's parameter names are the ones calibrate_model fits, and both
    sides build the same Hardware from them."""
    params = load()["params"]
    assert set(params) == set(calibrate_model.start_params(fresh=True))
    assert fitted.hardware(params, 4.0e12) == fitted_hardware(4.0e12)
