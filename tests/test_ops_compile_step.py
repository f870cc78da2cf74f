"""EMBED and ARGMAX of ops/step.cuh: compiled for sm_90a through NVRTC (no
spills, no local memory) and run on the host SIMT emulator against the CPU
backend (tools/ops_check_step.py through tools/ops_check.py's machinery).
Broken copies of the header must fail the same check."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpuvm.isa import Op
from tools import ops_check as oc
from tools import ops_check_step as ocs


@pytest.fixture(scope="module")
def compiled() -> tuple[object, str]:
    pytest.importorskip("cuda.core")
    return ocs.compile_step(oc)


@pytest.mark.parametrize("name", sorted(ocs.STEP_OPS.values()))
def test_compiles_without_spills(compiled: tuple[object, str], name: str) -> None:
    report = oc.ptxas_report(compiled[1])
    k = report[f"gvm_check_{name}"]
    assert k.registers is not None and k.registers <= 255
    assert (k.spill_stores, k.spill_loads, k.stack) == (0, 0, 0), f"{name}: {k}"


def _emu(tmp: Path, header: Path | None = None) -> object:
    if shutil.which("g++") is None:
        pytest.skip("the emulator needs g++")
    files = ocs.emu_files(oc, tmp / "stage")
    if header is not None:
        files[ocs.HEADER] = header
    return oc.EmuRunner(oc.build_emulator(tmp / "lib", files))


def _failures(runner: object, ops: set[Op]) -> list[str]:
    bad = []
    for case in ocs.build_cases(oc, oc.SMALL, seed=1):
        if case.op not in ops:
            continue
        expected = oc.reference(case)
        for r in oc.run_case(runner, case, expected, groups=1):
            if not r.ok:
                bad.append(f"{r.case} / {r.output}: {r.bad} of {r.total} off, max {r.max_abs:.3g} {r.note}")
    return bad


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> object:
    return _emu(tmp_path_factory.mktemp("emu_step"))


@pytest.mark.parametrize("op", list(ocs.STEP_OPS), ids=list(ocs.STEP_OPS.values()))
def test_op_matches_cpu_backend(runner: object, op: Op) -> None:
    assert _failures(runner, {op}) == []


@pytest.mark.parametrize(
    "op, old, new, output",
    [
        (Op.ARGMAX, "(b.v1 == a.v1 && b.i1 < a.i1)", "(b.v1 == a.v1 && b.i1 > a.i1)", "tokens"),  # ties to the higher index
        (Op.ARGMAX, "if (v > t.v1) {", "if (v >= t.v1) {", "tokens"),
        (Op.ARGMAX, "if (gsum(c, bad) != 0.0f) return GVM_ERR_BAD_ARGS;  // its barrier", "if (gsum(c, 0.0f) != 0.0f) return GVM_ERR_BAD_ARGS;  // its barrier", "error codes"),
        (Op.EMBED, "if (id < 0 || id >= vocab) bad = 1.0f;", "if (id < 0) bad = 1.0f;", "error codes"),
        (Op.EMBED, "dst[2 * i + 1] = gvm_bf16x4_to_f32(w.z, w.w);", "dst[2 * i + 1] = gvm_bf16x4_to_f32(w.w, w.z);", "s"),
    ],
    ids=["tie-to-higher", "last-of-equals", "no-finite-check", "no-upper-bound", "swapped-pair"],
)
def test_a_broken_op_fails(tmp_path: Path, op: Op, old: str, new: str, output: str) -> None:
    src = (oc.ROOT / ocs.HEADER).read_text()
    assert src.count(old) == 1, f"{ocs.HEADER} no longer has {old!r}"
    broken = tmp_path / "step.cuh"
    broken.write_text(src.replace(old, new))
    fails = _failures(_emu(tmp_path, broken), {op})
    assert any(f" / {output}:" in f for f in fails), fails


def test_extend_adds_the_step_ops_once() -> None:
    ns = type(oc)("ops_check_copy")
    ns.__dict__.update({k: (dict(v) if isinstance(v, dict) else v) for k, v in vars(oc).items() if not k.startswith("__")})
    ocs.extend(ns)
    ocs.extend(ns)
    assert {Op.EMBED, Op.ARGMAX} <= set(ns.OPS) and ns.HEADERS.count(ocs.HEADER) == 1
    # ops_check already extends itself on import: extending again adds nothing
    assert sum(getattr(b, "func", b) is ocs.cases_step for b in ns.BUILDERS) == 1 and ocs.HEADER in ns._EMU_FILES
