"""NVTX ranges around host phases (compile, upload, launch, read back), for
Nsight timelines. Uses the `nvtx` package when importable, else torch's NVTX
binding when CUDA is up, else nothing."""
from __future__ import annotations

import contextlib
from typing import Iterator

try:
    import nvtx as _nvtx
except ImportError:  # optional dependency
    _nvtx = None


@contextlib.contextmanager
def nvtx_range(name: str) -> Iterator[None]:
    if _nvtx is not None:
        with _nvtx.annotate(name, domain="gpuvm"):
            yield
        return
    torch_nvtx = _torch_nvtx()
    if torch_nvtx is None:
        yield
        return
    torch_nvtx.range_push(name)
    try:
        yield
    finally:
        torch_nvtx.range_pop()


def _torch_nvtx():  # type: ignore[no-untyped-def]
    try:
        import torch

        return torch.cuda.nvtx if torch.cuda.is_available() else None
    except (ImportError, AttributeError, RuntimeError):
        return None
