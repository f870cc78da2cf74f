"""GPU tests need a CUDA device of compute capability 9.0 (the kernel is built
for sm_90a) and cuda.core; without them every test here is skipped."""
from __future__ import annotations

import pytest
import torch


def _why_not() -> str | None:
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return "no CUDA device visible to torch"
    major, minor = torch.cuda.get_device_capability(0)
    if (major, minor) != (9, 0):
        return f"device 0 is compute capability {major}.{minor}; the kernel is built for sm_90a"
    try:
        import cuda.core  # noqa: F401  (the VM needs it)
    except ImportError:
        return "cuda.core is not installed"
    return None


_REASON = _why_not()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _REASON is None:
        return
    skip = pytest.mark.skip(reason=f"GPU tests: {_REASON}")
    for item in items:
        if "tests/gpu/" in item.nodeid.replace("\\", "/"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def vm():  # type: ignore[no-untyped-def]
    """The default VM: 2 compute groups, stamps compiled in, warmer on."""
    from gpuvm.device import VM

    return VM(0, groups=2, trace=True, warm=True)


@pytest.fixture(scope="session")
def vm_plain():  # type: ignore[no-untyped-def]
    """The same without stamps (the timing figures)."""
    from gpuvm.device import VM

    return VM(0, groups=2, trace=False, warm=True)
