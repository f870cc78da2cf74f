"""Torch buffers <-> gpuvm dtypes and tensor descriptors."""
from __future__ import annotations

import numpy as np
import torch

from .isa import MAX_DIMS, TENSOR_DTYPE, DType
from .opspec import ProgramError, TensorSpec

#: torch dtypes accepted for each gpuvm dtype (fp8 and fp4 may travel as uint8)
TORCH_DTYPES: dict[DType, tuple[torch.dtype, ...]] = {
    DType.F32: (torch.float32,),
    DType.BF16: (torch.bfloat16,),
    DType.E4M3: (torch.float8_e4m3fn, torch.uint8),
    DType.E2M1X2: (torch.uint8,),
    DType.I32: (torch.int32,),
    DType.U8: (torch.uint8,),
}


def torch_dtype(dt: DType) -> torch.dtype:
    """The torch dtype gpuvm allocates for dt."""
    return TORCH_DTYPES[dt][0]


def empty(spec: TensorSpec, device: str | torch.device = "cpu") -> torch.Tensor:
    """An uninitialised buffer for spec."""
    return torch.empty(spec.shape, dtype=torch_dtype(spec.dtype), device=device)


def check_binding(spec: TensorSpec, buf: object) -> torch.Tensor:
    """Raise ProgramError unless buf is a torch tensor matching spec."""
    if not isinstance(buf, torch.Tensor):
        raise ProgramError(f"tensor '{spec.name}' is bound to {type(buf).__name__}, not a torch.Tensor")
    if buf.dtype not in TORCH_DTYPES[spec.dtype]:
        raise ProgramError(f"tensor '{spec.name}' expects {spec.dtype.name} ({TORCH_DTYPES[spec.dtype]}), bound to {buf.dtype}")
    if tuple(buf.shape) != spec.shape:
        raise ProgramError(f"tensor '{spec.name}' expects shape {spec.shape}, bound to {tuple(buf.shape)}")
    if not buf.is_contiguous():
        raise ProgramError(f"tensor '{spec.name}' must be contiguous")
    return buf


def descriptor(spec: TensorSpec, buf: object) -> np.void:
    """The gvm_tensor record of a checked buffer."""
    t = check_binding(spec, buf)
    rec = np.zeros((), dtype=TENSOR_DTYPE)
    rec["ptr"] = t.data_ptr()
    rec["dtype"] = int(spec.dtype)
    rec["ndim"] = len(spec.shape)
    pad = MAX_DIMS - len(spec.shape)
    rec["shape"] = list(spec.shape) + [1] * pad
    rec["stride"] = list(t.stride()) + [0] * pad
    return rec
