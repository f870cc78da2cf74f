"""gpuvm: a virtual machine on the GPU for Muse Spark Open decode steps.

Build an instruction stream with Program (or the Muse lowering in gpuvm.muse),
run it on the CPU backend (gpuvm.cpu.run_stream) or the persistent kernel
(gpuvm.device.VM), study it with the scheduler model (gpuvm.sim) and the trace
tools (gpuvm.trace).
"""
from .isa import DType, Op, f2i, i2f
from .opspec import ProgramError, TensorSpec
from .program import Counter, Instr, Program, Stream

__all__ = ["DType", "Op", "f2i", "i2f", "ProgramError", "TensorSpec", "Counter", "Instr", "Program", "Stream"]
__version__ = "0.1.0"
