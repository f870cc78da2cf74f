"""What machine a result came from: device, driver, toolchain, commit, date."""
from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
from pathlib import Path

import torch


def has_gpu() -> bool:
    """True when torch sees a CUDA device."""
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def commit() -> str:
    """The checkout's commit (with '+dirty' when it has changes), or 'unknown'.
    GPUVM_COMMIT overrides it, for copies of a checkout that carry no .git."""
    if os.environ.get("GPUVM_COMMIT"):
        return os.environ["GPUVM_COMMIT"]
    root = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _driver() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return "unknown"


def machine() -> dict[str, object]:
    """Metadata stored beside every result."""
    info: dict[str, object] = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "host": platform.node(),
    }
    try:
        import cuda.core

        info["cuda_core"] = getattr(cuda.core, "__version__", "unknown")
    except ImportError:
        info["cuda_core"] = "missing"
    if has_gpu():
        p = torch.cuda.get_device_properties(0)
        info.update(
            device=p.name,
            sms=p.multi_processor_count,
            memory_gib=round(p.total_memory / 2**30, 1),
            capability=f"{p.major}.{p.minor}",
            driver=_driver(),
            cuda_runtime=torch.version.cuda,
        )
    else:
        info["device"] = "cpu (no GPU)"
    return info


def describe() -> str:
    """Human-readable machine summary for `gpuvm info`."""
    return "\n".join(f"{k:>12}: {v}" for k, v in machine().items())
