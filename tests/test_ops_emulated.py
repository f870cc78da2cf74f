"""The Muse ops of ops/*.cuh, unchanged, on the host SIMT emulator
(tools/ops_emu) at small sizes, against the CPU backend: tools/ops_check.py
--emu, one test per op. The emulator also fails a run on a deadlock, on
threads returning different codes and on shared-memory races between barriers;
the last tests break a header on purpose and see the check fail."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

if shutil.which("g++") is None:
    pytest.skip("the emulator needs g++", allow_module_level=True)

from gpuvm.isa import Op  # noqa: E402
from tools.ops_check import (  # noqa: E402
    _EMU_FILES,
    OPS,
    ROOT,
    SMALL,
    EmuError,
    EmuRunner,
    build_cases,
    build_emulator,
    reference,
    run_case,
    scratch_of,
)


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> EmuRunner:
    return EmuRunner(build_emulator(tmp_path_factory.mktemp("emu")))


def _failures(runner: EmuRunner, ops: set[Op], defines: tuple[tuple[str, str], ...] = ()) -> list[str]:
    bad = []
    for case in build_cases(SMALL, seed=1, only=ops):
        expected = reference(case)
        for r in run_case(runner, case, expected, groups=1, scratch=scratch_of(defines)):
            if not r.ok:
                bad.append(f"{r.case} / {r.output}: {r.bad} of {r.total} off, max {r.max_abs:.3g}, rel {r.rel:.3g} {r.note}")
    return bad


@pytest.mark.parametrize("op", list(OPS), ids=list(OPS.values()))
def test_op_matches_cpu_backend(runner: EmuRunner, op: Op) -> None:
    assert _failures(runner, {op}) == []


@pytest.mark.parametrize(("op", "define"), [(Op.EXPERT_UP, "GVM_EXPERT_REG=0"), (Op.EXPERT_DOWN, "GVM_EXPERT_REG=0"), (Op.GEMM, "GVM_GEMM_TT=1"),
                                            (Op.GEMM, "GVM_GEMM_F32_RN=4+GVM_GEMM_F32_TT=4"), (Op.ATTN_CHUNK, "GVM_ATT_WG=0"),
                                            (Op.EXPERT_UP, "GVM_GROUP_SMEM=73728"), (Op.EXPERT_DOWN, "GVM_GROUP_SMEM=73728")],
                         ids=["expert_up-shared-tile-only", "expert_down-shared-tile-only", "gemm-1-token-tile", "gemm-router-4x4",
                              "attn_chunk-per-warp", "expert_up-72k", "expert_down-72k"])
def test_switch_alternatives(tmp_path_factory: pytest.TempPathFactory, op: Op, define: str) -> None:
    """The build switches' other settings, kept for A/B runs on the H200:
    GVM_EXPERT_REG=0 (every expert through the shared tile), GVM_GEMM_TT=1
    (each token tile re-reads the weights), the router's old 4 x 4 tile,
    GVM_ATT_WG=0 (every attention chunk on the per-warp path); and the experts
    in 72 KB of scratch (session 50's default), where the 8-token UP runs on
    the register path without a weight ring and the 7-8-token DOWN on the
    shared tile, paths that 96 KB no longer reaches at K 4096."""
    defines = tuple(tuple(d.split("=")) for d in define.split("+"))
    lib = build_emulator(tmp_path_factory.mktemp("emu_switch"), defines=defines)
    assert _failures(EmuRunner(lib), {op}, defines) == []


@pytest.mark.parametrize("probe", ["12288", "20480"], ids=["x-three-tiles", "x-bulk"])
def test_the_x_path_probes_run_clean(tmp_path_factory: pytest.TempPathFactory, probe: str) -> None:
    """The shared tile's x-path probes (GVM_EXPR_PROBE 4096 + 8192: x into three
    tiles two K steps ahead; 4096 + 16384: a tile by one bulk copy on an
    mbarrier) time a device run and compute wrong values on purpose, but they
    must not race, deadlock or misuse a barrier (the emulator fails a run on
    each), so that a session's timing of them means what it says."""
    defines = (("GVM_EXPR_PROBE", probe),)
    runner = EmuRunner(build_emulator(tmp_path_factory.mktemp(f"emu_probe{probe}"), defines=defines))
    for case in build_cases(SMALL, seed=1, only={Op.EXPERT_UP, Op.EXPERT_DOWN}):
        run_case(runner, case, reference(case), groups=1, scratch=scratch_of(defines))  # raises EmuError on a race or a hang


def test_the_4_group_kernels_gemm(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The 4-group kernel's GEMM defaults (one token tile a pass, the 4 x 4
    router tile) give the same answers, but it refuses token ranges and K
    parts (BAD_ARGS: it has no register to spare for them)."""
    lib = build_emulator(tmp_path_factory.mktemp("emu_g4"), defines=(("GVM_MAX_GROUPS", "4"),))
    bad = _failures(EmuRunner(lib), {Op.GEMM})
    assert bad and all("token ranges" in b or "K parts" in b for b in bad), bad
    assert any("K parts /" in b for b in bad), bad


def _mutant(tmp_path: Path, header: str, old: str, new: str) -> EmuRunner:
    src = (ROOT / header).read_text()
    assert src.count(old) == 1, f"{header} no longer has {old!r}"
    changed = tmp_path / Path(header).name
    changed.write_text(src.replace(old, new))
    return EmuRunner(build_emulator(tmp_path / "lib", {**_EMU_FILES, header: changed}))


def test_a_missing_barrier_is_a_race(tmp_path: Path) -> None:
    broken = _mutant(tmp_path, "ops/route.cuh", "        gvm_group_sync(c);  // masks are read above before the next chunk clears them\n", "")
    with pytest.raises(EmuError, match="write after read"):
        _failures(broken, {Op.TOPK})


@pytest.mark.parametrize(("header", "old", "new", "op"), [
    ("ops/attention.cuh", "            gvm_cp_async_wait<0>();\n", "", Op.ATTN_MERGE),
    ("ops/experts.cuh", "gvm_cp_async_wait<(NSL > 2 ? NSL - 2 : 0)>();", "gvm_cp_async_wait<(NSL > 2 ? NSL - 1 : 1)>();", Op.EXPERT_UP)],
    ids=["attn_merge-no-wait", "expert-ring-one-group-short"])
def test_a_missing_cp_async_wait_fails(tmp_path: Path, header: str, old: str, new: str, op: Op) -> None:
    """cp.async copies land only at the cp.async.wait_group that covers their
    group, so reading their bytes with no wait (the merge's chunk states) or a
    wait one group too shallow (the experts' weight ring) is caught, even where
    the GPU would often have the bytes in time."""
    with pytest.raises(EmuError, match="has not landed"):
        _failures(_mutant(tmp_path, header, old, new), {op})


def test_reading_a_bulk_copy_before_its_mbarrier_wait_fails(tmp_path: Path) -> None:
    """The shared tile's weights arrive by bulk copies that complete on an
    mbarrier: a thread that reads them without waiting for that phase may read
    bytes still on their way, which the emulator reports though its copies
    land at once."""
    broken = _mutant(tmp_path, "ops/experts.cuh", "        if (DBL && WCOPY) gvm_bar_wait(bar0 + 8 * buf, phase);\n", "")
    with pytest.raises(EmuError, match="before this thread waited for phase"):
        _failures(broken, {Op.EXPERT_UP})


def test_a_wrong_fragment_fails(tmp_path: Path) -> None:
    broken = _mutant(tmp_path, "ops/experts.cuh", "p[u][s][0], p[u][s][2]);", "p[u][s][2], p[u][s][0]);")
    assert any("hbuf" in f for f in _failures(broken, {Op.EXPERT_UP}))


def test_a_wrong_mbarrier_phase_fails(tmp_path: Path) -> None:
    """The shared tile's weight buffers complete on an mbarrier each, one phase a
    use: waiting on the other parity waits for a phase that no copy completes
    before the wait (on the GPU the wait times out and traps), which the
    emulator's yielding mbarrier wait ends as a deadlock."""
    broken = _mutant(tmp_path, "ops/experts.cuh", "gvm_bar_wait(bar0 + 8 * buf, phase);", "gvm_bar_wait(bar0 + 8 * buf, phase ^ 1u);")
    with pytest.raises(EmuError, match="deadlock"):
        _failures(broken, {Op.EXPERT_UP})


def test_the_x_tile_follows_the_weights_k_order(tmp_path: Path) -> None:
    """A thread multiplies chunk t4 of each tiled K step of its weight rows
    (k = 128 h + 32 t4 + 8 w), so the x tile must hold raw chunk ch at t4 =
    (ch / 4) % 4, w8 = 4 (ch / 16) + ch % 4; the old order (t4 = ch / 8,
    w8 = ch % 8) pairs the wrong x with every weight."""
    broken = _mutant(tmp_path, "ops/experts.cuh", "const unsigned t4 = (ch >> 2) & 3, w8 = 4 * (ch >> 4) + (ch & 3);",
                     "const unsigned t4 = ch >> 3, w8 = ch & 7;")
    assert any("hbuf" in f for f in _failures(broken, {Op.EXPERT_UP}))


def test_a_wrong_fragment_of_the_register_path_fails(tmp_path: Path) -> None:
    broken = _mutant(tmp_path, "ops/experts.cuh", "pa[0], pb[0], pa[2], pb[2], x.x, x.y);", "pa[2], pb[0], pa[0], pb[2], x.x, x.y);")
    assert _failures(broken, {Op.EXPERT_UP}) != []


def test_a_wgmma_left_in_flight_fails(tmp_path: Path) -> None:
    """The emulator computes a wgmma when a wait retires it: without the wait
    the staged GEMM's accumulators are read stale and the op returns with the
    MMAs still queued, which the emulator reports."""
    broken = _mutant(tmp_path, "ops/gemm.cuh", "        gvm_wgmma_wait<0>();\n", "")
    with pytest.raises(EmuError, match="not retired by a wait"):
        _failures(broken, {Op.GEMM})


def test_a_wrong_p_fragment_of_the_attention_rounds_fails(tmp_path: Path) -> None:
    """P feeds the warpgroup's P V MMA from registers in an A fragment (rows g
    and g + 8, keys 2 q and 2 q + 8): registers a1 and a2 swapped put row g + 8's
    probabilities on row g's keys 8 on."""
    broken = _mutant(tmp_path, "ops/attention.cuh", "p[4 * kb], p[4 * kb + 1], p[4 * kb + 2], p[4 * kb + 3]",
                     "p[4 * kb], p[4 * kb + 2], p[4 * kb + 1], p[4 * kb + 3]")
    assert any("rounds" in f or "attn_chunk full" in f for f in _failures(broken, {Op.ATTN_CHUNK}))


def test_a_wrong_wgmma_descriptor_fails(tmp_path: Path) -> None:
    """The k16 steps of a stage advance the descriptors by 32 bytes; by 16 the
    staged GEMM multiplies the wrong k and its answers are off."""
    broken = _mutant(tmp_path, "ops/gemm.cuh", "+ 2 * s, db + 2 * s", "+ s, db + s")
    assert any("staged" in f or "token ranges" in f for f in _failures(broken, {Op.GEMM}))


def test_the_item_walk_agrees_with_opspec(tmp_path: Path) -> None:
    """The device sizes an expert's items by its share of the workers weighted
    by its tokens (gvm_exp_weight), as opspec.expert_items does for the CPU
    backend: with the shares equal again, the cases' lists (experts of 2 to 44
    tokens) count other items than the CPU's in `work`, and some rows go
    unwritten."""
    broken = _mutant(tmp_path, "ops/experts.cuh", "#define GVM_EXP_WEIGHTED 1", "#define GVM_EXP_WEIGHTED 0")
    assert any("work" in f for f in _failures(broken, {Op.EXPERT_UP}))
