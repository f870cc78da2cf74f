"""CI without a GPU: the device code compiles for sm_90a through NVRTC with no
spills and no stack, the build reports registers, shared memory and code
size, the disk cache works, and the cubin agrees with the host on layouts."""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

try:
    from cuda.bindings import nvrtc

    _NVRTC = nvrtc.nvrtcVersion()[0] == nvrtc.nvrtcResult.NVRTC_SUCCESS
except Exception:  # no cuda-bindings, or no NVRTC library behind it
    _NVRTC = False

pytestmark = pytest.mark.skipif(not _NVRTC, reason="NVRTC is not available (pip install cuda-bindings nvidia-cuda-nvrtc)")

from gpuvm.device import build as build_mod  # noqa: E402  (the module)
from gpuvm.device.build import Build, BuildOptions, compile_source, device_root, op_report, parse_ptxas  # noqa: E402
from gpuvm.device.errors import CompileError, SpillError  # noqa: E402
from gpuvm.device.layout import CLAIM_SLOTS, PARAMS_DTYPE, LayoutError, check_layout  # noqa: E402
from gpuvm.device.elf import Elf  # noqa: E402
from gpuvm.isa import Op  # noqa: E402
from tests.gpu.test_muse_layer import SWITCHES  # noqa: E402

SYNTHETIC = {Op.NOP, Op.SLEEP, Op.COPY, Op.SCALE_ADD, Op.GEMM}
VARIANTS = {
    "default": BuildOptions(),
    "trace": BuildOptions(trace=True),
    "core-4-groups": BuildOptions(max_groups=4, muse_ops=False),
    "core-4-groups-trace": BuildOptions(max_groups=4, muse_ops=False, trace=True),
    # the switches' other settings, kept for A/B runs on the H200: they must build clean
    "expert-shared-tile-only": BuildOptions(defines=(("GVM_EXPERT_REG", "0"),)),
    "gemm-1-token-tile-router-4x4": BuildOptions(trace=True, defines=(("GVM_GEMM_TT", "1"), ("GVM_GEMM_F32_RN", "4"), ("GVM_GEMM_F32_TT", "4"))),
    "gemm-2-token-tiles": BuildOptions(defines=(("GVM_GEMM_TT", "2"),)),
    # all of them at once, as tests/gpu builds them (a change that left each alone clean
    # spilled there: session 15)
    "switches-together": BuildOptions(defines=tuple(tuple(d.split("=")) for s in SWITCHES for d in s.split("+"))),  # type: ignore[misc]
}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gvm-cache")


@pytest.fixture(scope="module")
def builds(cache: Path) -> dict[str, Build]:
    return {name: build_mod.build(opts, cache=cache) for name, opts in VARIANTS.items()}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_kernel_compiles_without_local_memory(builds: dict[str, Build], variant: str, ci_report: Callable[[str], None]) -> None:
    b = builds[variant]
    ci_report(f"[{variant}] {b.summary()}")  # CI's log shows the resources (tests/conftest.py)
    k = b.kernel
    assert k.reported, "ptxas -v reached the log"
    assert not k.local_memory and all(not f.local_memory for f in b.functions.values())
    threads = b.layout.block_threads(b.options.max_groups)
    assert 0 < k.registers and k.registers * threads <= 65536, "one block per SM must fit the register file"
    smem = k.smem_static + b.layout.dynamic_smem(b.options.max_groups)
    assert smem <= 227 * 1024, f"{smem} B of shared memory per block"
    assert b.code_bytes >= k.code_bytes > 0
    assert SYNTHETIC <= b.compiled_ops


# The SM's unified 256 KB: shared memory is carved out of it in steps (Hopper: ..., 164,
# 196, 228 KB), a block also takes 1 KB that the system reserves, and what is left is
# L1. The Muse kernel sits at the 196 KB step (60 KB of L1); one static KB more moved it
# to 228 (28 KB of L1): one-token layers 4% and steps 5-7% slower on an H100, session 74.
L1_STEP_KB, RESERVED_KB = 196, 1


@pytest.mark.parametrize("variant", ["default", "trace"])
def test_muse_kernel_keeps_its_l1(builds: dict[str, Build], variant: str) -> None:
    b = builds[variant]
    smem = b.kernel.smem_static + b.layout.dynamic_smem(b.options.max_groups) + RESERVED_KB * 1024
    assert smem <= L1_STEP_KB * 1024, (
        f"{smem} B of shared memory a block (static {b.kernel.smem_static}): past {L1_STEP_KB} KB the SM keeps 28 KB of L1, not 60"
    )


def test_muse_ops_are_compiled_in_when_their_headers_exist(builds: dict[str, Build]) -> None:
    headers = {"norm": {Op.RMSNORM, Op.RESIDUAL}, "attention": {Op.QK_ROPE_KV, Op.ATTN_CHUNK, Op.ATTN_MERGE}, "route": {Op.TOPK}, "experts": {Op.EXPERT_UP, Op.EXPERT_DOWN, Op.EXPERT_COMBINE}}
    ops = device_root() / "ops"
    present = {op for h, s in headers.items() if (ops / f"{h}.cuh").exists() for op in s}
    assert present <= builds["default"].compiled_ops
    assert builds["core-4-groups"].compiled_ops == SYNTHETIC


def test_stamps_vanish_without_trace(builds: dict[str, Build]) -> None:
    """GVM_TRACE adds code; without it the stamping code is gone."""
    assert builds["trace"].code_bytes > builds["default"].code_bytes
    assert builds["core-4-groups-trace"].code_bytes > builds["core-4-groups"].code_bytes


def test_params_layout_matches_the_host(builds: dict[str, Build]) -> None:
    b = builds["default"]
    words = np.frombuffer(Elf(b.cubin).read("gvm_layout"), dtype="<u4").copy()
    lay = check_layout(words)
    assert lay.group_smem == b.layout.group_smem and lay.max_groups == 2
    assert words[0] == PARAMS_DTYPE.itemsize
    bad = words.copy()
    bad[1 + PARAMS_DTYPE.names.index("step")] += 4
    with pytest.raises(LayoutError, match="step"):
        check_layout(bad)
    bad = words.copy()
    assert lay.claim_slots == CLAIM_SLOTS  # the controller's claim slots, which VM.claim_depth is checked against
    bad[-1] = 0
    with pytest.raises(LayoutError, match="holds 0 claims on the device"):
        check_layout(bad)


def test_op_checks_run_at_the_kernels_scratch(builds: dict[str, Build]) -> None:
    """tools/ops_check.py (and expert_bench, the emulator) give each group the
    Muse kernel's scratch: the ops pick their paths by it (the experts' register
    path, the GEMM's stages), so a stale figure checks and times other paths."""
    from tools.ops_check import SCRATCH

    assert SCRATCH == builds["default"].layout.group_smem


def test_disk_cache_hits_and_misses(cache: Path, builds: dict[str, Build], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    again = build_mod.build(VARIANTS["core-4-groups"], cache=cache)
    assert again.cached and again.cubin == builds["core-4-groups"].cubin and again.key == builds["core-4-groups"].key
    assert again.kernel == builds["core-4-groups"].kernel, "the cached report is the compiled one"
    # an edited source is a new key: copy the device tree, touch a header
    root = tmp_path / "src"
    for d in build_mod.DEVICE_DIRS:
        shutil.copytree(device_root() / d, root / d)
    monkeypatch.setattr(build_mod, "device_root", lambda: root)
    same = build_mod.build(VARIANTS["core-4-groups"], cache=cache)
    assert same.cached and same.key == again.key, "the key depends on contents, not on paths"
    (root / "ops" / "synthetic.cuh").write_text((root / "ops" / "synthetic.cuh").read_text() + "\n// edited\n")
    edited = build_mod.build(VARIANTS["core-4-groups"], cache=cache)
    assert not edited.cached and edited.key != again.key


def test_compile_errors_carry_the_nvrtc_log() -> None:
    with pytest.raises(CompileError) as e:
        compile_source('extern "C" __global__ void k() { undeclared_thing(); }', "broken.cu", [], [])
    assert "undeclared_thing" in str(e.value)


# The GPU machine compiles with the NVRTC of its torch's CUDA 13.0 stack; CI's pip
# resolves a newer one. A construct the newer accepts and 13.0 refuses (session 75:
# __builtin_offsetof) broke every build there, found only after device time was spent.
GPU_MACHINE_NVRTC = "13.0.88"
_NVRTC_13_0 = """
import ctypes, sys
lib = sys.argv[1]
ctypes.CDLL(lib + "/libnvrtc-builtins.so.13.0", mode=ctypes.RTLD_GLOBAL)
ctypes.CDLL(lib + "/libnvrtc.so.13", mode=ctypes.RTLD_GLOBAL)  # cuda.bindings takes the loaded one
from cuda.bindings import nvrtc
assert nvrtc.nvrtcVersion()[1:] == (13, 0), nvrtc.nvrtcVersion()
from pathlib import Path
from gpuvm.device.build import BuildOptions, build
b = build(BuildOptions(), cache=Path(sys.argv[2]), force=True)
print("built with NVRTC 13.0:", b.kernel)
"""


def _nvrtc_13_0(into: Path) -> Path:
    """libnvrtc 13.0 and its builtins from the pinned wheel (pip download), in into."""
    got = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(into),
                          f"nvidia-cuda-nvrtc=={GPU_MACHINE_NVRTC}"], capture_output=True, text=True, timeout=300)
    wheels = list(into.glob("nvidia_cuda_nvrtc-*.whl"))
    if got.returncode or not wheels:
        pytest.skip(f"could not download nvidia-cuda-nvrtc=={GPU_MACHINE_NVRTC}: {got.stderr.strip()[-300:]}")
    with zipfile.ZipFile(wheels[0]) as z:
        for name in z.namelist():
            if name.endswith(("/libnvrtc.so.13", "/libnvrtc-builtins.so.13.0")):
                (into / Path(name).name).write_bytes(z.read(name))
    return into


def test_the_gpu_machines_nvrtc_builds_the_kernel(tmp_path: Path) -> None:
    lib = _nvrtc_13_0(tmp_path)
    run = subprocess.run([sys.executable, "-c", _NVRTC_13_0, str(lib), str(tmp_path / "cache")],
                         capture_output=True, text=True, timeout=900, cwd=build_mod.device_root())
    assert run.returncode == 0, run.stderr[-4000:]
    assert "built with NVRTC 13.0" in run.stdout


def test_offsetof_is_used_only_where_the_compiler_has_it() -> None:
    """The GPU machine's NVRTC (13.0) has no __builtin_offsetof, CI's (13.5) has: a use
    outside `#if __has_builtin(__builtin_offsetof)` compiles here and fails there."""
    bare = []
    for path in build_mod.device_sources():
        guards: list[bool] = []  # one per open #if: whether it is the builtin's guard
        for n, line in enumerate(path.read_text().splitlines(), 1):
            s = line.strip()
            if s.startswith("#if"):
                guards.append("__has_builtin(__builtin_offsetof)" in s)
            elif s.startswith("#endif"):
                guards.pop()
            elif "__builtin_offsetof(" in s and not s.startswith("//") and not any(guards):
                bare.append(f"{path.name}:{n}")
    assert not bare, f"__builtin_offsetof outside its __has_builtin guard: {bare}"


def test_spills_are_detected() -> None:
    """A kernel that must keep a dynamically indexed array in local memory."""
    src = 'extern "C" __global__ void k(float* o, int i) { float a[256]; for (int j = 0; j < 256; ++j) a[j] = o[j * i]; o[0] = a[i & 255]; }'
    _, log = compile_source(src, "spill.cu", [], [])
    rep = parse_ptxas(log)
    assert rep["k"].stack_frame > 0 and rep["k"].local_memory
    with pytest.raises(SpillError, match="k: "):
        build_mod._check_local_memory(rep, log)


def test_per_op_report(ci_report: Callable[[str], None]) -> None:
    rep = op_report(BuildOptions())
    ci_report("per op, alone under the kernel's launch bounds:")
    for name, r in rep.items():
        ci_report(f"  {name:16s} {r.registers:4d} registers  {r.code_bytes:7d} B code  "
                  f"spill {r.spill_stores}/{r.spill_loads} B  stack {r.stack_frame} B")
    assert {o.name.lower() for o in SYNTHETIC} <= set(rep)
    assert rep["gemm"].code_bytes > rep["nop"].code_bytes > 0


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc for the cross-check")
def test_nvcc_agrees_no_spills(tmp_path: Path) -> None:
    """The same kernel through nvcc (the GPU machine's NVRTC is 13.0 like this nvcc)."""
    root = device_root()
    cmd = ["nvcc", "-arch=sm_90a", "-cubin", "-std=c++17", "-O3", "-Xptxas", "-v", "-DGVM_MAX_GROUPS=2", f"-I{root / 'runtime'}", "-o", str(tmp_path / "k.cubin"), str(root / "runtime" / "gvm_kernel.cu")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rep = parse_ptxas(out.stderr + out.stdout)
    assert not rep["gvm_kernel"].local_memory
