"""The VM: the persistent kernel built, loaded and launched on one GPU.

    vm = VM(device=0, groups=2, trace=True)
    loaded = vm.load(stream, bindings)            # torch CUDA tensors by name
    for step in range(n):
        loaded.run(step)                          # raises on a device error
    trace = loaded.trace()

cuda.core compiles (through build.py) and loads the kernel; the launch goes
through the driver's cuLaunchKernel because the parameter block travels by
value as one struct, which cuda.core's argument packing does not support.
Buffers are torch tensors; a launch goes on the caller's stream (a torch
stream, a cuda.core stream, anything with __cuda_stream__, a raw handle) or
torch's current stream.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from ..isa import ERROR_DTYPE, TRACE_BYTES, TRACE_DTYPE
from ..nvtx import nvtx_range
from ..opspec import ProgramError
from ..program import Stream
from ..trace.format import Trace
from .build import KERNEL, Build, BuildOptions, build
from .errors import LaunchError, SpillError, error_from_record
from .layout import MODES, PARAMS_DTYPE
from .validate import check_records
from .warm import warm_bindings, warm_stream

__all__ = ["VM", "Loaded"]


def _drv(result: Any, what: str) -> Any:
    """Unwrap a cuda.bindings driver call: (CUresult, value...)."""
    from cuda.bindings import driver

    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        raise LaunchError(f"{what} failed: {name.decode() if isinstance(name, bytes) else name}")
    return rest[0] if len(rest) == 1 else rest


def _upload(arr: np.ndarray, device: torch.device) -> torch.Tensor:
    """A structured numpy array as device bytes."""
    return torch.from_numpy(np.ascontiguousarray(arr).view(np.uint8).reshape(-1).copy()).to(device)


class VM:
    """The persistent kernel on one GPU: one block per SM, `groups` compute
    groups per block. trace compiles the self-timestamps in; warm runs the
    instruction-cache warmer at each launch (off by default: on the H200 it
    has never paid, and it cost 4-10 us a Muse layer at one token, 1e0f1bb);
    claim_depth is how many claimed instructions a block holds ahead of its
    groups, 1 to the build's claim slots (claim_slots, from its layout; the
    depth is settable between launches). The default depth 1 measured fastest on the
    Muse layer and step (H200, 4233027: step 1x1 19.5 ms at depth 1 against
    23.5 at 6): a claim held ahead waits for its own block's groups even when
    another block has one free. Empty instructions dispatch fastest with
    every slot held (device.bench.dispatch_overhead)."""

    def __init__(
        self,
        device: int = 0,
        groups: int = 2,
        trace: bool = False,
        warm: bool = False,
        *,
        claim_depth: int = 1,
        max_groups: int | None = None,
        muse_ops: bool = True,
        defines: Sequence[tuple[str, str]] = (),
        cache: Path | None = None,
    ) -> None:
        from cuda.bindings import driver
        from cuda.core import Device, ObjectCode

        max_groups = max_groups or groups
        if not 1 <= groups <= max_groups <= 4:
            raise ValueError(f"need 1 <= groups ({groups}) <= max_groups ({max_groups}) <= 4")
        self.groups = groups
        self.trace = trace
        self.warm = warm
        self.claim_depth = claim_depth
        self.build: Build = build(BuildOptions(trace=trace, max_groups=max_groups, muse_ops=muse_ops, defines=tuple(defines)), cache=cache)
        self.torch_device = torch.device("cuda", device)
        torch.cuda.set_device(self.torch_device)
        torch.zeros(1, device=self.torch_device)  # make torch create the primary context first
        self._dev = Device(device)
        self._dev.set_current()
        major, minor = self._dev.compute_capability
        if (major, minor) != (9, 0):
            raise LaunchError(f"the kernel is built for sm_90a; device {device} is compute capability {major}.{minor}")
        self.device_name = self._dev.name
        layout = self.build.layout
        self.claim_slots = layout.claim_slots
        self.threads = layout.block_threads(groups)
        self.smem = layout.dynamic_smem(groups)
        with nvtx_range("gpuvm load"):
            self._obj = ObjectCode.from_cubin(self.build.cubin)
            self._kernel = self._obj.get_kernel(KERNEL)
            self._func = _drv(driver.cuKernelGetFunction(driver.CUkernel(int(self._kernel.handle))), "cuKernelGetFunction")
            attr = driver.CUfunction_attribute
            _drv(driver.cuFuncSetAttribute(self._func, attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, self.smem), "raising dynamic shared memory")
            local = _drv(driver.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, self._func), "cuFuncGetAttribute")
            if local:
                raise SpillError(f"the loaded kernel uses {local} bytes of local memory per thread")
            self.registers = int(_drv(driver.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_NUM_REGS, self._func), "cuFuncGetAttribute"))
            per_sm = _drv(driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(self._func, self.threads, self.smem), "occupancy query")
        if per_sm < 1:
            raise LaunchError(f"a block of {self.threads} threads, {self.registers} registers and {self.smem} B dynamic shared memory does not fit an SM")
        # one block per SM, all co-resident (static mode relies on it)
        self.n_blocks = int(torch.cuda.get_device_properties(self.torch_device).multi_processor_count)
        self._warm_stream = warm_stream(self.build.compiled_ops)
        self._warm_records: torch.Tensor | None = None
        if self._warm_stream is not None:
            self._warm_bufs = warm_bindings(self._warm_stream, self.torch_device)
            self._warm_records = _upload(self._warm_stream.records, self.torch_device)
            self._warm_table = _upload(self._warm_stream.table(self._warm_bufs), self.torch_device)

    def load(self, stream: Stream, bindings: Mapping[str, torch.Tensor]) -> "Loaded":
        """Check the stream against this kernel and upload it with its tensor table."""
        return Loaded(self, stream, bindings)

    def torch_stream(self, stream: object = None) -> torch.cuda.Stream:
        """The torch view of a caller's stream (None: torch's current stream)."""
        if stream is None:
            return torch.cuda.current_stream(self.torch_device)
        if isinstance(stream, torch.cuda.Stream):
            return stream
        if hasattr(stream, "__cuda_stream__"):
            _, handle = stream.__cuda_stream__()  # type: ignore[operator]
            return torch.cuda.ExternalStream(int(handle), device=self.torch_device)
        if isinstance(stream, int):
            return torch.cuda.ExternalStream(stream, device=self.torch_device)
        raise TypeError(f"cannot launch on a {type(stream).__name__}: pass a torch or cuda.core stream, or a handle")

    def launch(self, params: np.ndarray, stream: torch.cuda.Stream) -> None:
        """One launch of the kernel with this parameter block (PARAMS_DTYPE, shape (1,))."""
        from cuda.bindings import driver

        if params.dtype != PARAMS_DTYPE or params.shape != (1,):
            raise ValueError("params must be a (1,) array of PARAMS_DTYPE")
        args = np.array([params.ctypes.data], dtype=np.uint64)  # void* kernelParams[1]
        with nvtx_range("gpuvm launch"):
            _drv(
                driver.cuLaunchKernel(self._func, self.n_blocks, 1, 1, self.threads, 1, 1, self.smem, driver.CUstream(stream.cuda_stream), args.ctypes.data, 0),
                "cuLaunchKernel",
            )

    def warm_args(self) -> tuple[int, int, int]:
        """(records, table, count) of the warm instructions for this launch."""
        if not self.warm or self._warm_records is None or self._warm_stream is None:
            return 0, 0, 0
        return self._warm_records.data_ptr(), self._warm_table.data_ptr(), len(self._warm_stream)


class Loaded:
    """A stream uploaded to the VM with its buffers, counters and error record."""

    def __init__(self, vm: VM, stream: Stream, bindings: Mapping[str, torch.Tensor]) -> None:
        self.vm = vm
        self.stream = stream
        for spec in stream.tensors:
            buf = bindings.get(spec.name)
            if isinstance(buf, torch.Tensor) and buf.device != vm.torch_device:
                raise ProgramError(f"tensor '{spec.name}' is on {buf.device}; the VM runs on {vm.torch_device}")
        table = stream.table(bindings)  # checks every binding's shape, dtype and layout
        check_records(stream.records, table, len(stream.counters), vm.build.compiled_ops, stream.labels, vm.build.options.max_groups)
        self._bufs = {t.name: bindings[t.name] for t in stream.tensors}  # kept alive while loaded
        self._tickets = [self._bufs[t.name] for t in stream.tensors if t.role == "ticket"]  # counted from zero, as the counters
        for t in self._tickets:
            t.zero_()
        dev = vm.torch_device
        with nvtx_range("gpuvm upload"):
            self._records = _upload(stream.records, dev)
            self._table = _upload(table, dev)
            # whole 16-byte lines: the controller probes a counter by its line (runtime/controller.cuh)
            self._counters = torch.zeros(-(-max(1, len(stream.counters)) // 4) * 4, dtype=torch.int32, device=dev)
            self._state = torch.zeros(vm.build.layout.state_words, dtype=torch.int32, device=dev)
            self._error = torch.zeros(ERROR_DTYPE.itemsize // 4, dtype=torch.int32, device=dev)
            self._trace = torch.zeros(len(stream) * TRACE_BYTES, dtype=torch.uint8, device=dev) if vm.trace else None
        self._static: torch.Tensor | None = None
        self._last: dict[str, object] = {}
        self.next_step = 0  # the step after the last one launched (counters are there)

    # -- running ---------------------------------------------------------------
    def set_static(self, lists: Sequence[Sequence[int]]) -> None:
        """Per-block lists for static mode (default: gpuvm.static.static_lists)."""
        from ..static import pack_static

        if len(lists) != self.vm.n_blocks:
            raise ProgramError(f"static mode needs one list per block: {len(lists)} lists for {self.vm.n_blocks} blocks")
        packed = pack_static(lists)  # checks: a partition, each list in stream order
        if len(packed) - (self.vm.n_blocks + 1) != len(self.stream):
            raise ProgramError(f"static lists hold {len(packed) - self.vm.n_blocks - 1} positions; the stream has {len(self.stream)}")
        self._static = torch.from_numpy(packed).to(self.vm.torch_device)

    def params(self, step: int, mode: str = "dynamic", watchdog_s: float = 1.0) -> np.ndarray:
        """The parameter block of one launch."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {sorted(MODES)}, not {mode!r}")
        if not 0 <= step < 2**32:
            raise ValueError(f"step must be in [0, 2^32), not {step}")
        slots = self.vm.claim_slots
        if not 1 <= self.vm.claim_depth <= slots:
            raise ValueError(f"claim_depth must be 1..{slots} (the controller's claim slots), not {self.vm.claim_depth}")
        if not watchdog_s > 0:
            raise ValueError(f"the watchdog bound must be positive, not {watchdog_s}")
        if mode == "static" and self._static is None:
            from ..static import static_lists

            self.set_static(static_lists(self.stream, self.vm.n_blocks, self.vm.groups))
        warm_rec, warm_tab, n_warm = self.vm.warm_args()
        p = np.zeros(1, dtype=PARAMS_DTYPE)
        p["instrs"] = self._records.data_ptr()
        p["table"] = self._table.data_ptr()
        p["counters"] = self._counters.data_ptr()
        p["state"] = self._state.data_ptr()
        p["error"] = self._error.data_ptr()
        p["trace"] = 0 if self._trace is None else self._trace.data_ptr()
        p["static_lists"] = 0 if mode != "static" or self._static is None else self._static.data_ptr()
        p["warm_instrs"], p["warm_table"], p["n_warm"] = warm_rec, warm_tab, n_warm
        p["watchdog_ns"] = int(watchdog_s * 1e9)
        p["n_instrs"] = len(self.stream)
        p["step"] = step
        p["mode"] = MODES[mode]
        p["groups"] = self.vm.groups
        p["claim_depth"] = self.vm.claim_depth
        return p

    def run(self, step: int, mode: str = "dynamic", watchdog_s: float = 1.0, stream: object = None, check: bool = True) -> None:
        """Launch step `step` (counters carry over from the previous step). With
        check, wait for it and raise the device's error if it stopped on one;
        without (for timing, graph capture), call check() later."""
        params = self.params(step, mode, watchdog_s)
        ts = self.vm.torch_stream(stream)
        self.vm.launch(params, ts)  # every instruction rewrites its whole trace record
        self._last = {"step": step, "mode": mode, "warm": bool(params["n_warm"][0])}
        self.next_step = step + 1
        if check:
            self.check(ts)

    def check(self, stream: object = None) -> None:
        """Wait for the stream and raise the error the last launch recorded, if
        any. After an error the counters, claim state and error record are
        reset: the program starts again at step 0 (a K-part ticket the aborted
        launch left mid-count starts from zero again too)."""
        ts = self.vm.torch_stream(stream)
        with nvtx_range("gpuvm read back"):
            ts.synchronize()
            rec = self._error.cpu().numpy().view(ERROR_DTYPE)[0]
        err = error_from_record(rec, self.stream.labels, [int(o.opcode) for o in self.stream.ops], [c.name for c in self.stream.counters])
        if err is not None:
            self.reset()
            raise err

    def reset(self) -> None:
        """Zero the counters, the tickets, the claim state, the error record and
        the trace (step 0 next)."""
        for t in (self._counters, self._state, self._error, self._trace, *self._tickets):
            if t is not None:
                t.zero_()
        torch.cuda.synchronize(self.vm.torch_device)
        self.next_step = 0

    # -- reading back ----------------------------------------------------------
    def counters(self) -> np.ndarray:
        torch.cuda.synchronize(self.vm.torch_device)
        return self._counters.cpu().numpy().view(np.uint32)[: len(self.stream.counters)].copy()

    def trace(self) -> Trace:
        """The stamps of the last launch."""
        if self._trace is None:
            raise RuntimeError("tracing is off: VM(trace=True) compiles the stamps in")
        with nvtx_range("gpuvm read back"):
            torch.cuda.synchronize(self.vm.torch_device)
            records = self._trace.cpu().numpy().view(TRACE_DTYPE).copy()
        meta = dict(source="gpu", device=self.vm.device_name, groups=self.vm.groups, n_blocks=self.vm.n_blocks, build=self.vm.build.key, **self._last)
        return Trace.for_stream(self.stream, records, meta)
