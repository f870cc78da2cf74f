"""tools/draws.py (sched_probe --draws): each variant is also built with the
never-run reschedule probe, its rows fold back onto it over draws and
rounds, and each variant is set against the first one's spread."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.draws import draw_spread, main, verdicts, with_draws


def test_every_variant_gets_each_draw_with_its_own_defines() -> None:
    v = with_draws("base:,lag:GVM_GEMM_XS_LAG=1+warm=1", [8, 16])
    assert v.split(",") == [
        "base:", "base~rs8~:GVM_RESCHED_PROBE=8", "base~rs16~:GVM_RESCHED_PROBE=16",
        "lag:GVM_GEMM_XS_LAG=1+warm=1", "lag~rs8~:GVM_GEMM_XS_LAG=1+warm=1+GVM_RESCHED_PROBE=8",
        "lag~rs16~:GVM_GEMM_XS_LAG=1+warm=1+GVM_RESCHED_PROBE=16"]


def test_draws_fold_onto_their_variant_and_tiling() -> None:
    res = {"full-c1-t1/base/dynamic/d1": 1.0, "full-c1-t1/base~rs8~/dynamic/d1": 2.0,
           "full-c1-t1/baset64/dynamic/d1": 3.0, "full-c1-t1/base~rs8~64/dynamic/d1": 6.0, "full-c1-t1/base~rs16~t64/dynamic/d1": 4.0,
           "step1x1/lag~rs8~/static/d1": 5.0}
    assert draw_spread(res) == {"full-c1-t1/base/dynamic/d1": [1.0, 2.0], "full-c1-t1/baset64/dynamic/d1": [3.0, 4.0], "full-c1-t1/base64/dynamic/d1": [6.0],
                                "step1x1/lag/static/d1": [5.0]}


def test_rounds_fold_and_a_variant_outside_the_base_spread_is_apart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r1 = {"c/base/dynamic/d1": 100.0, "c/base~rs8~/dynamic/d1": 101.0, "c/new/dynamic/d1": 104.0, "c/new~rs8~/dynamic/d1": 105.0,
          "d/base/dynamic/d1": 10.0, "d/new/dynamic/d1": 10.05}
    r2 = {"c/base/dynamic/d1": 102.0, "c/new/dynamic/d1": 103.0, "d/base/dynamic/d1": 10.1, "d/new/dynamic/d1": 10.0}
    lines = verdicts(draw_spread(r1, r2))
    assert lines[0].startswith("c/base/dynamic/d1") and "[100.0, 102.0] of 3" in lines[0] and "against" not in lines[0]
    assert "[103.0, 105.0] of 3" in lines[1] and "+3.0% against the first, apart" in lines[1]
    assert lines[3].endswith("against the first")  # d: the ranges overlap
    for i, r in enumerate((r1, r2)):
        (tmp_path / f"r{i}.json").write_text(json.dumps(r))
    assert main([str(tmp_path / "r0.json"), str(tmp_path / "r1.json")]) == 0
    assert capsys.readouterr().out.splitlines() == lines


def test_tree_runs_are_named_by_their_tree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = {"b1": {"c/base/dynamic/d1": 100.0, "c/base~rs8~/dynamic/d1": 101.0},
            "n1": {"c/base/dynamic/d1": 99.0, "c/base~rs8~/dynamic/d1": 99.5}, "n2": {"c/base/dynamic/d1": 99.2}}
    for n, r in runs.items():
        (tmp_path / f"{n}.json").write_text(json.dumps(r))
    assert main([f"base={tmp_path / 'b1.json'}", f"new={tmp_path / 'n1.json'},{tmp_path / 'n2.json'}"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("c/base:base/dynamic/d1") and "of 2" in out[0]
    assert out[1].startswith("c/new:base/dynamic/d1") and "of 3" in out[1] and "against the first, apart" in out[1]
