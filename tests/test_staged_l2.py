"""tools/staged_l2.py: the L2 bytes and rates of a trace's staged GEMMs, on a hand-made trace."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from gpuvm.isa import TRACE_DTYPE, Op
from gpuvm.trace.format import Trace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tools.staged_l2 import staged_ops  # noqa: E402


@pytest.fixture
def trace_path(tmp_path: Path) -> str:
    # two Wsq tiles of 128 rows (ready at 1000 ns, 2 and 4 us each), a router tile of 32 rows, a
    # one-token-style GEMM tile (no token span) and a non-GEMM op with a span-like label: both ignored
    labels = ["L0.Wsq[0:128|t0:64]", "L0.Wsq[128:256|t0:64]", "L0.Wr[0:32|t0:64|k0:2048]", "L0.Wex[0:64]", "L0.rms[0:64|t0:64]"]
    times = [(1000, 3000), (1000, 5000), (2000, 3000), (0, 10), (0, 10)]
    rec = np.zeros(len(labels), dtype=TRACE_DTYPE)
    for i, (ready, done) in enumerate(times):
        rec[i]["globaltimer"] = (0, 0, ready, done, done)
        rec[i]["instr"] = i
    opcodes = np.array([Op.GEMM, Op.GEMM, Op.GEMM, Op.GEMM, Op.RMSNORM], np.uint16)
    t = Trace(records=rec, labels=labels, opcodes=opcodes, deps=[()] * len(labels),
              weight_bytes=np.array([4000, 4000, 1000, 7, 0]), act_bytes=np.array([100, 100, 300, 7, 0]),
              meta={"source": "gpu"})
    path = tmp_path / "t.npz"
    t.save(path)
    return str(path)


def test_bytes_and_rates(trace_path: str) -> None:
    ops = {r["op"]: r for r in staged_ops(trace_path, 64)}
    assert set(ops) == {"L0.Wsq", "L0.Wr"}
    wsq, wr = ops["L0.Wsq"], ops["L0.Wr"]
    # 128 rows in passes of 64: the weights once, x twice
    assert wsq["n"] == 2 and wsq["rows"] == 128 and wsq["mb"] == pytest.approx(4200 / 1e6)
    assert wsq["us"] == pytest.approx(3.0)  # median of 2 and 4 us
    assert wsq["gbps_group"] == pytest.approx(np.median([4200 / 2000, 4200 / 4000]))
    assert wsq["phase_us"] == pytest.approx(4.0) and wsq["tbps"] == pytest.approx(8400 / 4000 / 1e3)
    # the router's 32-row passes: one pass
    assert wr["mb"] == pytest.approx(1300 / 1e6) and wr["gbps_group"] == pytest.approx(1.3)


def test_two_half_passes(trace_path: str) -> None:
    ops = {r["op"]: r for r in staged_ops(trace_path, 128)}
    assert ops["L0.Wsq"]["mb"] == pytest.approx(4100 / 1e6)  # one pass of 128 rows: x once
    assert ops["L0.Wr"]["mb"] == pytest.approx(1300 / 1e6)  # the f32 path's passes do not change
