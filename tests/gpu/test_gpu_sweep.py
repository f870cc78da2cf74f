"""`gpuvm sweep`'s GPU case end to end on one small decode case: the three gpuvm
runs checked against the reference and timed, the peer timed, and with --trace
a dynamic and a static trace of the same program that `gpuvm trace --against`
can set side by side."""
from __future__ import annotations

from pathlib import Path

from gpuvm.gpu_sweep import GpuSweep
from gpuvm.muse.cases import DECODE_CASES
from gpuvm.trace.format import Trace
from gpuvm.trace.summary import compare, op_diff
from gpuvm.trace.timeline import build


def test_sweep_case_times_three_ways_and_traces_them(tmp_path: Path) -> None:
    case = next(c for c in DECODE_CASES if c.name == "sliding-c1-t1")
    row = GpuSweep(runs=3, trace_dir=tmp_path).case(case)
    assert row["ok"], {k: v for k, v in row.items() if k.startswith(("err", "routing"))}
    for how in ("dynamic", "static", "fixed", "peer"):
        assert row[f"{how}_us"] > 0
    assert row["fixed_over_dyn"] == row["fixed_us"] / row["dynamic_us"]
    dyn, st = Trace.load(tmp_path / f"trace-{case.name}.npz"), Trace.load(tmp_path / f"trace-{case.name}-static.npz")
    assert (dyn.meta["mode"], st.meta["mode"]) == ("dynamic", "static")
    assert dyn.labels == st.labels and len(dyn) == row["instructions"]
    diffs = op_diff(build(dyn), build(st))
    assert all(d.count[0] == d.count[1] > 0 for d in diffs)  # every instruction ran in both
    assert "static mode, span" in compare(dyn, st)
    fx = Trace.load(tmp_path / f"trace-{case.name}-fixed.npz")  # its own program: items dealt on the host
    assert fx.meta["mode"] == "static" and len(fx) == row["instructions"]
    assert {o for o in fx.labels if "expert_up" in o} == {o for o in dyn.labels if "expert_up" in o}
