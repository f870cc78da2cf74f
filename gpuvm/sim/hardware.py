"""The machine the scheduler model simulates: an H200 running the gpuvm kernel.

Every default is either a figure measured on the H200 here (MEASURE.md,
MUSE.md) or an estimate to calibrate against a GPU trace (said so below).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Mapping

from ..isa import Op
from ..opspec import ProgramError


@dataclass(frozen=True)
class OpTiming:
    """How one opcode's instructions run, beyond what their bytes cost: fitted
    to GPU traces by tools/calibrate_model.py (gpuvm/sim/fitted.py)."""

    #: ready to done, less its loads and math: argument checks, set-up,
    #: pipeline fill and drain, and the chains of round trips of latency-bound ops
    fixed_ns: float
    #: the share of its SM's bf16 tensor rate its flops run at (decode, softmax
    #: and conversions on the CUDA cores keep most ops well under 1)
    math_fraction: float = 1.0


@dataclass(frozen=True)
class Hardware:
    """Blocks, warp groups, bandwidths and fixed costs of the device scheduler."""

    #: persistent blocks, one per SM (H200: 132 SMs, MEASURE.md)
    n_blocks: int = 132
    #: compute warp groups per block (DESIGN.md default)
    groups: int = 2
    #: SMs of the device; tensor cores are per SM, so the per-SM matrix rate is
    #: flops_per_s / sms whatever n_blocks is
    sms: int = 132
    #: plain 16-byte streaming read of HBM, measured (MEASURE.md / MUSE.md)
    hbm_bytes_per_s: float = 4.42e12
    #: L2 read bandwidth for activations that stay on chip (60 MB L2); estimate,
    #: about 2.5x HBM as Hopper microbenchmarks show
    l2_bytes_per_s: float = 11e12
    #: one instruction's load stream (one group's pipeline) cannot pull the whole
    #: HBM: cap per concurrent load, estimate 40-60 GB/s (4.42e12 / 132 = 33 GB/s
    #: is the fair share when every SM loads)
    load_bytes_per_s: float = 50e9
    #: bf16 dense matrix rate, measured (MUSE.md); each SM gets 1/sms of it,
    #: shared by the groups of the block that compute at once
    flops_per_s: float = 7.9e14
    #: round trip of one claim on the global head when all 132 SMs contend
    #: ("about 0.3 us per claim per block", MEASURE.md)
    claim_ns: float = 300.0
    #: claims the global head serves per second in all; it serialises claims
    #: (middle of the measured 330-510 M claims/s, MEASURE.md)
    head_claims_per_s: float = 4.4e8
    #: controller reads the claimed 128-byte record (an L2 hit) before the loader
    #: can issue its prefetch; estimate
    decode_ns: float = 250.0
    #: controller hands a decoded instruction to a free group (shared memory +
    #: mbarrier); estimate
    dispatch_ns: float = 50.0
    #: the loader's prefetch of an instruction that will wait: its first bytes
    #: only (runtime/loader.cuh GVM_PF_MAX_BYTES); the group loads the rest
    prefetch_max_bytes: int = 8192
    #: instructions a block holds claimed and not yet handed to a group
    #: (the VM's default claim depth; up to runtime/params.cuh GVM_CLAIM_SLOTS)
    claim_depth: int = 1
    #: hand out the held instructions whose waits are met first, as the
    #: device's controller does (GVM_READY_FIRST); False: in claim order
    ready_first: bool = True
    #: ready first: from a wait met to the controller seeing it (its probe of
    #: the counters runs once a ring turn); estimate
    probe_ns: float = 500.0
    #: ready first: with no held instruction seen ready, the oldest goes to a
    #: free group anyway and waits there, while another group of the block
    #: stays unparked, as the device does (GVM_PARK)
    park: bool = True
    #: fixed cost of an op inside a group (descriptor reads, address set-up,
    #: pipeline fill and drain); estimate
    launch_ns: float = 400.0
    #: extra time of an op whose code comes from HBM: the code warmer's lead
    #: instances (gpuvm/muse/code_warm.py) ran 6-44 us at launch, most 7-15
    #: (H200 traces, d62979b); an estimate, so that static lists do not queue
    #: the first phase's tiles behind them
    cold_code_ns: float = 10_000.0
    #: HBM / L2 latency before the first bytes of a load arrive; estimate
    mem_latency_ns: float = 600.0
    #: producer's fence + release increment of its signal counter; estimate
    signal_ns: float = 100.0
    #: until a release increment is seen by pollers on other SMs
    #: ("about 0.5-1 us", DESIGN.md brief of the scheduler)
    signal_latency_ns: float = 750.0
    #: per opcode name (e.g. "GEMM"): its own fixed cost and matrix rate; an
    #: opcode not named here costs launch_ns at the full tensor rate
    ops: Mapping[str, OpTiming] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.prefetch_max_bytes, int) or self.prefetch_max_bytes < 0:
            raise ProgramError(f"Hardware.prefetch_max_bytes must be an int >= 0, not {self.prefetch_max_bytes!r}")
        for name in ("n_blocks", "groups", "sms", "claim_depth"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ProgramError(f"Hardware.{name} must be a positive int, not {v!r}")
        if self.n_blocks > self.sms:
            raise ProgramError(f"Hardware.n_blocks {self.n_blocks} > sms {self.sms}: persistent blocks must all be co-resident, one per SM")
        for name in ("hbm_bytes_per_s", "l2_bytes_per_s", "load_bytes_per_s", "flops_per_s", "head_claims_per_s"):
            if not getattr(self, name) > 0:
                raise ProgramError(f"Hardware.{name} must be > 0")
        for name in ("claim_ns", "decode_ns", "dispatch_ns", "launch_ns", "cold_code_ns", "mem_latency_ns", "signal_ns", "signal_latency_ns", "probe_ns"):
            if not getattr(self, name) >= 0:
                raise ProgramError(f"Hardware.{name} must be >= 0")

        for name, timing in self.ops.items():
            if name not in Op.__members__:
                raise ProgramError(f"Hardware.ops names {name!r}, which is no opcode")
            if not isinstance(timing, OpTiming) or not timing.fixed_ns >= 0 or not 0 < timing.math_fraction <= 1:
                raise ProgramError(f"Hardware.ops[{name!r}] must be an OpTiming with fixed_ns >= 0 and 0 < math_fraction <= 1, not {timing!r}")

    def timing(self, opcode: Op) -> OpTiming:
        """The opcode's fixed cost and matrix rate (launch_ns and 1 unless named in ops)."""
        return self.ops.get(Op(opcode).name) or OpTiming(self.launch_ns)

    @property
    def flops_per_sm(self) -> float:
        return self.flops_per_s / self.sms

    @property
    def head_gap_ns(self) -> float:
        """Time the global head is busy per claim."""
        return 1e9 / self.head_claims_per_s

    def as_dict(self) -> dict[str, int | float]:
        return asdict(self)
