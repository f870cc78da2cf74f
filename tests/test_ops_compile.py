"""The Muse op headers compile for sm_90a through NVRTC (cuda.core), each op in
a test kernel of its own under the persistent kernel's register budget, with no
spills and no local memory. No GPU needed: NVRTC and ptxas run on the CPU."""
from __future__ import annotations

import pytest

pytest.importorskip("cuda.core")

from tools.ops_check import OPS, compile_ops, kernel_source, ptxas_report  # noqa: E402


@pytest.fixture(scope="module")
def compiled() -> tuple[object, str]:
    return compile_ops()


def test_every_op_has_a_kernel(compiled: tuple[object, str]) -> None:
    report = ptxas_report(compiled[1])
    for name in OPS.values():
        assert f"gvm_check_{name}" in report, f"no ptxas report for {name}: {sorted(report)}"


@pytest.mark.parametrize("name", sorted(OPS.values()))
def test_no_spills(compiled: tuple[object, str], name: str) -> None:
    report = ptxas_report(compiled[1])
    k = report[f"gvm_check_{name}"]
    assert k.registers is not None and k.registers <= 255
    assert (k.spill_stores, k.spill_loads, k.stack) == (0, 0, 0), f"{name}: {k}"


def test_helpers_out_of_line_do_not_spill(compiled: tuple[object, str]) -> None:
    """The argument checks kept out of line (__noinline__) are functions of their own."""
    helpers = {n: k for n, k in ptxas_report(compiled[1]).items() if not n.startswith("gvm_check_")}
    assert helpers, "expected the out-of-line argument checks in the report"
    for k in helpers.values():
        assert (k.spill_stores, k.spill_loads) == (0, 0), k


def test_source_has_one_kernel_per_op() -> None:
    src = kernel_source()
    assert src.count("__global__") == len(OPS)
    assert "__launch_bounds__(GVM_BLOCK_THREADS, 1)" in src


def test_report_parser_reads_spills() -> None:
    log = (
        "ptxas info    : Function properties for gvm_check_x\n"
        "ptxas         .     16 bytes stack frame, 24 bytes spill stores, 20 bytes spill loads\n"
        "ptxas info    : Used 96 registers, used 16 barriers\n"
    )
    k = ptxas_report(log)["gvm_check_x"]
    assert (k.registers, k.stack, k.spill_stores, k.spill_loads) == (96, 16, 24, 20)


@pytest.mark.parametrize("define", ["GVM_EXPERT_REG=0", "GVM_EXP_STAGGER=0", "GVM_GEMM_TT=1", "GVM_GEMM_TT=2",
                                    "GVM_RESCHED_PROBE=16", "GVM_GEMM_PARTS_PROBE=1", "GVM_GEMM_PARTS_PROBE=2"])
def test_switch_alternatives_do_not_spill(define: str) -> None:
    """The build switches' other settings, kept for A/B runs on the H200 (the
    experts' shared tile alone, its items not staggered over K, one or two
    GEMM token tiles per pass), the
    reschedule probe's never-run block (tools/sched_probe.py --draws) and the
    K parts' timing probes, compile spill-free too."""
    from gpuvm.isa import Op

    ops = ([Op.GEMM] if define.startswith("GVM_GEMM") else [Op.ATTN_CHUNK] if define.startswith("GVM_RESCHED")
           else [Op.EXPERT_UP, Op.EXPERT_DOWN])
    _, log = compile_ops(ops, defines=(tuple(define.split("=")),))
    for op in ops:
        k = ptxas_report(log)[f"gvm_check_{OPS[op]}"]
        assert (k.spill_stores, k.spill_loads, k.stack) == (0, 0, 0), f"{define}: {k}"
