"""tools/sched_probe.py's reschedule draws (--draws): each variant is also
built with the never-run probe block, and its rows fold back onto it."""
from __future__ import annotations

from tools.sched_probe import draw_spread, with_draws


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
