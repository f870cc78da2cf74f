"""The trace container shared by the GPU runtime, the scheduler model and the tools.

A Trace holds one gvm_trace record per instruction (stream order), the ops'
labels, opcodes, dependencies and byte counts, and free-form metadata
(source: 'gpu' or 'model', device, mode, step, commit, ...). Times are in
nanoseconds of %globaltimer (GPU) or of the model's clock; clock64 cycles are
kept beside them for durations on the GPU, where the globaltimer ticks in
steps of about 256 ns.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..isa import TRACE_DTYPE, Stamp


class TraceError(ValueError):
    """A trace file that cannot be read."""


@dataclass
class Trace:
    records: np.ndarray  # TRACE_DTYPE, len n
    labels: list[str]
    opcodes: np.ndarray  # uint16, len n
    deps: list[tuple[int, ...]]
    weight_bytes: np.ndarray  # int64, len n
    act_bytes: np.ndarray  # int64, len n
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.records)
        if self.records.dtype != TRACE_DTYPE:
            raise TraceError("trace records have the wrong layout")
        if not (len(self.labels) == len(self.opcodes) == len(self.deps) == len(self.weight_bytes) == len(self.act_bytes) == n):
            raise TraceError("trace columns disagree in length")

    def __len__(self) -> int:
        return len(self.records)

    @classmethod
    def for_stream(cls, stream: "object", records: np.ndarray, meta: dict | None = None) -> "Trace":
        """Wrap records of a run of stream (a gpuvm.program.Stream). meta gets
        "signal_counter", the name of the counter each op signals ("" for
        none), unless given: the summary charges waits to counters by it."""
        ops = stream.ops  # type: ignore[attr-defined]
        meta = dict(meta or {})
        meta.setdefault("signal_counter", [o.signal.name if o.signal is not None else "" for o in ops])
        return cls(
            records=np.asarray(records, dtype=TRACE_DTYPE),
            labels=[o.label for o in ops],
            opcodes=np.array([int(o.opcode) for o in ops], dtype=np.uint16),
            deps=[tuple(d) for d in stream.deps],  # type: ignore[attr-defined]
            weight_bytes=np.array([o.cost.weight_bytes for o in ops], dtype=np.int64),
            act_bytes=np.array([o.cost.act_bytes for o in ops], dtype=np.int64),
            meta=meta,
        )

    def times(self, stamp: Stamp) -> np.ndarray:
        """Globaltimer of one stamp for every instruction (ns, int64)."""
        return self.records["globaltimer"][:, int(stamp)].astype(np.int64)

    def save(self, path: str | Path) -> None:
        path = Path(path)
        dep_flat = np.array([j for d in self.deps for j in d], dtype=np.int64)
        dep_len = np.array([len(d) for d in self.deps], dtype=np.int64)
        with open(path, "wb") as f:
            np.savez_compressed(
                f,
                records=self.records.view(np.uint8).reshape(len(self), -1),
                labels=np.array(self.labels, dtype=object).astype(str),
                opcodes=self.opcodes,
                dep_flat=dep_flat,
                dep_len=dep_len,
                weight_bytes=self.weight_bytes,
                act_bytes=self.act_bytes,
                meta=np.array(json.dumps(self.meta)),
            )

    @classmethod
    def load(cls, path: str | Path) -> "Trace":
        path = Path(path)
        if not path.exists():
            raise TraceError(f"no trace file at {path}")
        try:
            z = np.load(path, allow_pickle=False)
            raw = z["records"]
            records = np.ascontiguousarray(raw).view(TRACE_DTYPE).reshape(-1)
            dep_len = z["dep_len"]
            dep_flat = z["dep_flat"]
            ends = np.cumsum(dep_len)
            deps = [tuple(int(j) for j in dep_flat[e - n : e]) for e, n in zip(ends, dep_len)]
            return cls(
                records=records,
                labels=[str(s) for s in z["labels"]],
                opcodes=z["opcodes"].astype(np.uint16),
                deps=deps,
                weight_bytes=z["weight_bytes"].astype(np.int64),
                act_bytes=z["act_bytes"].astype(np.int64),
                meta=json.loads(str(z["meta"])),
            )
        except TraceError:
            raise
        except Exception as e:  # corrupt zip, missing key, bad json, bad layout
            raise TraceError(f"{path} is not a gpuvm trace ({type(e).__name__}: {e})") from None
