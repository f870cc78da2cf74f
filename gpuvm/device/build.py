"""Compile the persistent kernel for sm_90a with NVRTC (cuda.core), cache the
cubin on disk, and report its resources.

The cache key hashes every device source (isa/, ops/, scheduler/, runtime/),
the options and the compiler's version, so a warm start never recompiles and
an edit always does. The ptxas report (-v) is parsed for registers, spills,
stack frame and shared memory; spills or a stack frame raise SpillError.
The cubin itself tells the rest: code size (ELF sections), the parameter
layout (gvm_layout) and the opcodes compiled in (gvm_compiled_ops).
"""
from __future__ import annotations

import hashlib
import inspect
import io
import json
import os
import re
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from ..isa import ROOT, Op
from ..nvtx import nvtx_range
from .elf import Elf
from .errors import CompileError, SpillError
from .layout import DeviceLayout, check_layout

__all__ = ["BuildOptions", "Build", "Resources", "build", "compile_source", "op_report", "parse_ptxas", "cache_dir", "device_sources"]

KERNEL = "gvm_kernel"
ARCH = "sm_90a"
DEVICE_DIRS = ("isa", "ops", "scheduler", "runtime")
SOURCE_SUFFIXES = (".h", ".cuh", ".cu")
_KEY_VERSION = "gvm-build-1"


@dataclass(frozen=True)
class BuildOptions:
    """What changes the compiled kernel. max_groups bounds the launch's groups
    (and sets __launch_bounds__, hence the register budget: 65536 / (128 * (1 +
    max_groups)) per thread)."""

    trace: bool = False
    max_groups: int = 2
    muse_ops: bool = True
    arch: str = ARCH
    defines: tuple[tuple[str, str], ...] = ()

    def macros(self) -> list[tuple[str, str]]:
        m = [("GVM_MAX_GROUPS", str(self.max_groups))]
        if self.trace:
            m.append(("GVM_TRACE", "1"))
        if not self.muse_ops:
            m.append(("GVM_NO_MUSE_OPS", "1"))
        return m + [tuple(d) for d in self.defines]  # type: ignore[misc]


@dataclass(frozen=True)
class Resources:
    """One function's ptxas report, plus code bytes from the cubin."""

    registers: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    stack_frame: int = 0
    smem_static: int = 0
    barriers: int = 0
    code_bytes: int = 0

    @property
    def reported(self) -> bool:
        """False when the compiler gave no -v report (registers = -1)."""
        return self.registers >= 0

    @property
    def local_memory(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0 or self.stack_frame > 0


@dataclass(frozen=True)
class Build:
    cubin: bytes
    log: str
    options: BuildOptions
    key: str
    cached: bool
    kernel: Resources
    functions: dict[str, Resources]  # every function ptxas reported (the kernel and its callees)
    code_bytes: int  # all code of the cubin
    layout: DeviceLayout
    compiled_ops: frozenset[Op] = field(default_factory=frozenset)

    def summary(self) -> str:
        k = self.kernel
        ops = ", ".join(sorted(o.name.lower() for o in self.compiled_ops))
        return (
            f"{KERNEL} ({self.options.arch}, max_groups {self.options.max_groups}, trace {'on' if self.options.trace else 'off'}): "
            f"{k.registers} registers, {k.spill_stores}/{k.spill_loads} bytes spill stores/loads, {k.stack_frame} bytes stack, "
            f"{k.smem_static} bytes static smem (+{self.layout.group_smem} per group), {self.code_bytes} bytes of code; ops: {ops}"
        )


def device_root() -> Path:
    """Where the device folders are: the checkout, or gpuvm/_device in a wheel."""
    return ROOT


def device_sources(root: Path | None = None) -> list[Path]:
    root = root or device_root()
    out: list[Path] = []
    for d in DEVICE_DIRS:
        out += sorted(p for p in (root / d).rglob("*") if p.suffix in SOURCE_SUFFIXES and p.is_file())
    return out


def cache_dir() -> Path:
    return Path(os.environ.get("GPUVM_CACHE") or Path.home() / ".cache" / "gpuvm")


def _compiler_versions() -> str:
    import cuda.core
    from cuda.bindings import nvrtc

    res = nvrtc.nvrtcVersion()
    return f"nvrtc {res[1]}.{res[2]}, cuda.core {getattr(cuda.core, '__version__', '?')}"


def _toolkit_include() -> str | None:
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env) and (Path(os.environ[env]) / "include" / "cuda_runtime.h").exists():
            return str(Path(os.environ[env]) / "include")
    p = Path("/usr/local/cuda/include")
    return str(p) if (p / "cuda_runtime.h").exists() else None


def compile_source(source: str, name: str, include_dirs: list[str], macros: list[tuple[str, str]], arch: str = ARCH) -> tuple[bytes, str]:
    """NVRTC source -> (cubin, log). Toolkit headers come from the toolkit if
    one is installed, else from NVRTC's bundled copy where cuda.core has it
    (the device sources themselves need neither)."""
    from cuda.core import Program, ProgramOptions

    accepted = inspect.signature(ProgramOptions).parameters
    incs = list(include_dirs)
    kw: dict[str, object] = dict(arch=arch, std="c++17", name=name, ptxas_options=["-v", "-O3"], define_macro=macros or None)
    tk = _toolkit_include()
    if tk:
        incs.append(tk)
    elif "use_bundled_headers" in accepted:
        kw["use_bundled_headers"] = True
    kw["include_path"] = incs
    # NVRTC's own cache would skip ptxas and its -v report; an NVRTC that
    # predates the option refuses it, and then has no cache to skip.
    tries = [dict(kw, no_cache=True), kw] if "no_cache" in accepted else [kw]
    for i, opts in enumerate(tries):
        log = io.StringIO()
        try:
            obj = Program(source, "c++", ProgramOptions(**opts)).compile("cubin", logs=log)
            return bytes(obj.code), log.getvalue()
        except Exception as e:  # cuda.core raises its own NVRTCError with the log in the message
            if i + 1 < len(tries) and "INVALID_OPTION" in str(e):
                continue
            raise CompileError(f"NVRTC failed to compile {name} for {arch}: {e}", log.getvalue()) from None
    raise AssertionError("unreachable")


_FN = re.compile(r"Function properties for (\S+)")
_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_USED = re.compile(r"Used (\d+) registers(?:, used (\d+) barriers)?(?:.*?, (\d+) bytes smem)?")


def parse_ptxas(log: str) -> dict[str, Resources]:
    """Per function: the ptxas -v report of the log."""
    out: dict[str, dict[str, int]] = {}
    fn = entry = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            entry = m.group(1)
            out.setdefault(entry, {})
        elif m := _FN.search(line):
            fn = m.group(1)
            out.setdefault(fn, {})
        elif (m := _STACK.search(line)) and fn:
            out[fn].update(stack_frame=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        elif (m := _USED.search(line)) and entry:
            out[entry].update(registers=int(m.group(1)), barriers=int(m.group(2) or 0), smem_static=int(m.group(3) or 0))
    return {k: Resources(**v) for k, v in out.items()}


def _key(options: BuildOptions, sources: list[Path], root: Path) -> str:
    h = hashlib.sha256()
    h.update(_KEY_VERSION.encode())
    h.update(_compiler_versions().encode())
    h.update(json.dumps(asdict(options), sort_keys=True).encode())
    for p in sources:
        h.update(str(p.relative_to(root)).encode() + b"\0")
        h.update(p.read_bytes() + b"\0")
    return h.hexdigest()[:32]


def _check_local_memory(functions: dict[str, Resources], log: str) -> None:
    bad = {n: r for n, r in functions.items() if r.local_memory}
    if bad:
        what = "; ".join(f"{n}: {r.spill_stores} B spill stores, {r.spill_loads} B spill loads, {r.stack_frame} B stack" for n, r in bad.items())
        raise SpillError(f"the kernel uses local memory ({what})", log)


def _read_build(cubin: bytes, log: str, options: BuildOptions, key: str, cached: bool) -> Build:
    elf = Elf(cubin)
    sizes = {name.rsplit("$", 1)[-1]: size for name, size in elf.functions().items()}  # callees are "$kernel$name"
    functions = {n: replace(r, code_bytes=sizes.get(n, 0)) for n, r in parse_ptxas(log).items()}
    if KERNEL not in functions:  # no -v report: the VM still checks local memory on the loaded kernel
        warnings.warn(f"the compile log has no ptxas report for '{KERNEL}'; registers and spills are unknown until load")
        functions[KERNEL] = Resources(registers=-1, code_bytes=sizes.get(KERNEL, 0))
    layout = check_layout(np.frombuffer(elf.read("gvm_layout"), dtype="<u4"))
    mask = int(np.frombuffer(elf.read("gvm_compiled_ops"), dtype="<u8")[0])
    ops = frozenset(op for op in Op if mask >> int(op) & 1)
    return Build(cubin, log, options, key, cached, functions[KERNEL], functions, elf.code_bytes(), layout, ops)


def build(options: BuildOptions | None = None, *, cache: Path | None = None, force: bool = False) -> Build:
    """The kernel for these options: from the disk cache when its key matches,
    else compiled (and cached). Raises CompileError, SpillError, LayoutError."""
    options = options or BuildOptions()
    if not 1 <= options.max_groups <= 4:
        raise ValueError(f"max_groups must be 1..4, not {options.max_groups}")
    root = device_root()
    sources = device_sources(root)
    key = _key(options, sources, root)
    cdir = cache or cache_dir()
    cubin_path, meta_path = cdir / f"{key}.cubin", cdir / f"{key}.json"
    if not force and cubin_path.exists() and meta_path.exists():
        meta = json.loads(meta_path.read_text())
        return _read_build(cubin_path.read_bytes(), meta["log"], options, key, cached=True)
    with nvtx_range("gpuvm compile"):
        src_path = root / "runtime" / "gvm_kernel.cu"
        cubin, log = compile_source(src_path.read_text(), str(src_path), [str(root / "runtime")], options.macros(), options.arch)
    result = _read_build(cubin, log, options, key, cached=False)
    _check_local_memory(result.functions, log)
    try:
        cdir.mkdir(parents=True, exist_ok=True)
        for path, data in ((cubin_path, cubin), (meta_path, json.dumps({"log": log, "options": asdict(options)}).encode())):
            tmp = path.with_suffix(path.suffix + f".{os.getpid()}.tmp")
            tmp.write_bytes(data)
            tmp.replace(path)  # atomic: a concurrent reader sees the old file or the whole new one
    except OSError as e:  # a read-only home still builds, it just recompiles next time
        warnings.warn(f"cannot cache the kernel in {cdir}: {e}")
    return result


def op_report(options: BuildOptions | None = None) -> dict[str, Resources]:
    """Per compiled op: registers, local memory and code bytes of the op alone,
    each in a probe kernel under the real kernel's launch bounds (one compile).
    Never raises on spills: it is how one finds the op that spills."""
    options = options or BuildOptions()
    root = device_root()
    lines = ['#include "params.cuh"', '#include "dispatch.cuh"']
    names = [op.name.lower() for op in Op]
    for n in names:
        lines.append(
            f'extern "C" __global__ void __launch_bounds__(GVM_BLOCK_THREADS, 1) gvm_probe_{n}(const __grid_constant__ gvm_ctx c) {{ (void)gvm_op_{n}(c); }}'
        )
    cubin, log = compile_source("\n".join(lines) + "\n", str(root / "runtime" / "gvm_op_probe.cu"), [str(root / "runtime")], options.macros(), options.arch)
    elf = Elf(cubin)
    mask = int(np.frombuffer(elf.read("gvm_compiled_ops"), dtype="<u8")[0])
    sizes = elf.functions()
    reps = parse_ptxas(log)
    return {
        op.name.lower(): replace(reps.get(f"gvm_probe_{op.name.lower()}", Resources()), code_bytes=sizes.get(f"gvm_probe_{op.name.lower()}", 0))
        for op in Op
        if mask >> int(op) & 1
    }
