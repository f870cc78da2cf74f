"""The CPU backend: runs an instruction stream with each op's reference semantics."""
from .backend import StuckError, run_stream
from .ops import OPS, CpuOpError

__all__ = ["run_stream", "StuckError", "CpuOpError", "OPS"]
