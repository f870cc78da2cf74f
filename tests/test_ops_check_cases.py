"""tools/ops_check.py's cases: each builder draws from a generator of its own, so that
--only builds exactly the cases, inputs included, that a run of every op checks."""
from __future__ import annotations

import pytest
import torch

from gpuvm.isa import Op
from tools.ops_check import BUILDERS, MAKES, SMALL, build_cases


def test_every_builder_says_which_ops_it_makes() -> None:
    every = build_cases(SMALL, seed=1)
    made = set().union(*(MAKES[getattr(b, "func", b)] for b in BUILDERS))
    assert {c.op for c in every} == made


@pytest.mark.parametrize("op", [Op.RESIDUAL, Op.TOPK, Op.EXPERT_DOWN, Op.GEMM, Op.EMBED])
def test_only_builds_the_cases_of_a_whole_run(op: Op) -> None:
    want = [c for c in build_cases(SMALL, seed=1) if c.op == op]
    alone = build_cases(SMALL, seed=1, only={op})
    assert want and [c.name for c in alone] == [c.name for c in want]
    for a, b in zip(alone, want):
        assert a.tensors.keys() == b.tensors.keys()
        assert all(torch.equal(a.tensors[k].view(torch.uint8), b.tensors[k].view(torch.uint8)) for k in a.tensors), a.name


def test_the_seed_changes_the_inputs() -> None:
    a, b = build_cases(SMALL, seed=1, only={Op.TOPK}), build_cases(SMALL, seed=2, only={Op.TOPK})
    assert any(not torch.equal(x.tensors[k], y.tensors[k]) for x, y in zip(a, b) for k in x.tensors if x.tensors[k].dtype == torch.float32)


def test_a_builders_cases_do_not_depend_on_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    import tools.ops_check as oc

    want = {c.name: c for c in build_cases(SMALL, seed=1)}
    monkeypatch.setattr(oc, "BUILDERS", tuple(reversed(oc.BUILDERS)))
    got = oc.build_cases(SMALL, seed=1)
    assert sorted(c.name for c in got) == sorted(want)
    for c in got:
        assert all(torch.equal(c.tensors[k].view(torch.uint8), want[c.name].tensors[k].view(torch.uint8)) for k in c.tensors), c.name


def test_only_skips_the_builders_of_other_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    import tools.ops_check as oc

    def refuses(sz: object, gen: torch.Generator) -> list[object]:
        raise AssertionError("built")

    monkeypatch.setattr(oc, "BUILDERS", (*oc.BUILDERS, refuses))
    monkeypatch.setitem(oc.MAKES, refuses, frozenset({Op.GEMM}))
    assert oc.build_cases(SMALL, seed=1, only={Op.TOPK})
    with pytest.raises(AssertionError, match="built"):
        oc.build_cases(SMALL, seed=1, only={Op.GEMM})
