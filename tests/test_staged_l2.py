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


def _trace(path: Path, labels: list[str], times: list[tuple[int, int]], opcodes: list[int] | None = None,
           weight_bytes: list[int] | None = None, act_bytes: list[int] | None = None) -> str:
    """A GPU trace of these instructions, each (ready, done) ns; GEMMs of 1000 weight and 100 x bytes unless told."""
    n = len(labels)
    rec = np.zeros(n, dtype=TRACE_DTYPE)
    for i, (ready, done) in enumerate(times):
        rec[i]["globaltimer"] = (0, 0, ready, done, done)
        rec[i]["instr"] = i
    t = Trace(records=rec, labels=labels, opcodes=np.array(opcodes or [Op.GEMM] * n, np.uint16), deps=[()] * n,
              weight_bytes=np.array(weight_bytes or [1000] * n), act_bytes=np.array(act_bytes or [100] * n),
              meta={"source": "gpu"})
    t.save(path)
    return str(path)


@pytest.fixture
def trace_path(tmp_path: Path) -> str:
    # two Wsq tiles of 128 rows (ready at 1000 ns, 2 and 4 us each), a router tile of 32 rows, a
    # one-token-style GEMM tile (no token span) and a non-GEMM op with a span-like label: both ignored
    labels = ["L0.Wsq[0:128|t0:64]", "L0.Wsq[128:256|t0:64]", "L0.Wr[0:32|t0:64|k0:2048]", "L0.Wex[0:64]", "L0.rms[0:64|t0:64]"]
    times = [(1000, 3000), (1000, 5000), (2000, 3000), (0, 10), (0, 10)]
    return _trace(tmp_path / "t.npz", labels, times, [Op.GEMM, Op.GEMM, Op.GEMM, Op.GEMM, Op.RMSNORM],
                  [4000, 4000, 1000, 7, 0], [100, 100, 300, 7, 0])


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


def test_parts_first_and_last(tmp_path: Path) -> None:
    # two tiles of two K parts: per tile the part that ends last is the one that adds them up
    labels = ["L0.Wqkvg[0:64|t0:64|k0:4096]", "L0.Wqkvg[0:64|t0:64|k4096:8192]",
              "L0.Wqkvg[64:128|t0:64|k0:4096]", "L0.Wqkvg[64:128|t0:64|k4096:8192]", "L0.Wo[0:128|t0:64]"]
    times = [(1000, 3000), (1000, 5000), (2000, 9000), (1000, 4000), (0, 1000)]
    ops = {r["op"]: r for r in staged_ops(_trace(tmp_path / "parts.npz", labels, times), 64)}
    assert ops["L0.Wqkvg"]["parts_first_us"] == pytest.approx(2.5)  # 2 and 3 us
    assert ops["L0.Wqkvg"]["parts_last_us"] == pytest.approx(5.5)  # 4 and 7 us
    assert ops["L0.Wqkvg"]["parts_extra_us"] == pytest.approx(3.0)  # per tile 4 - 2 and 7 - 3
    assert np.isnan(ops["L0.Wo"]["parts_first_us"]) and np.isnan(ops["L0.Wo"]["parts_last_us"])
    assert np.isnan(ops["L0.Wo"]["parts_extra_us"])
