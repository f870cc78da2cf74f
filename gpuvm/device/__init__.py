"""The GPU backend: build, load and run the persistent kernel (needs cuda.core;
a GPU for anything past compiling). gpuvm.device.build is the build module
(its build() compiles or fetches the cubin)."""
from .build import Build, BuildOptions, Resources, op_report
from .errors import CompileError, DeviceError, LaunchError, OpError, SpillError, WatchdogError
from .vm import VM, Loaded

__all__ = [
    "VM",
    "Loaded",
    "op_report",
    "Build",
    "BuildOptions",
    "Resources",
    "CompileError",
    "SpillError",
    "LaunchError",
    "DeviceError",
    "WatchdogError",
    "OpError",
]
