"""Python mirror of isa/gvm_isa.h.

Opcodes, dtypes, stamps, error codes and #define constants are parsed from the
header itself, so they cannot drift; the record layouts are numpy structured
dtypes whose sizes and offsets tests/test_isa.py checks against a compiled
probe of the header.
"""
from __future__ import annotations

import enum
import re
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
HEADER = ROOT / "isa" / "gvm_isa.h"
if not HEADER.exists():  # installed wheel: device sources ship inside the package
    ROOT = Path(__file__).resolve().parent / "_device"
    HEADER = ROOT / "isa" / "gvm_isa.h"

_TEXT = re.sub(r"/\*.*?\*/", "", HEADER.read_text(), flags=re.S)


def _defines() -> dict[str, int | float]:
    out: dict[str, int | float] = {}
    for name, value in re.findall(r"#define\s+(GVM_\w+)\s+([^\n]+)", _TEXT):
        value = value.strip()
        try:
            out[name] = float(value.rstrip("f")) if "e" in value and "0x" not in value else int(eval(value, {}, {}))
        except Exception:  # pragma: no cover - non-numeric macro
            continue
    return out


def _enum(name: str) -> dict[str, int]:
    m = re.search(r"enum\s+" + name + r"\s*\{(.*?)\};", _TEXT, flags=re.S)
    if not m:
        raise RuntimeError(f"enum {name} missing from {HEADER}")
    out = {}
    for key, val in re.findall(r"(\w+)\s*=\s*(\w+)", m.group(1)):
        out[key] = int(val, 0)
    return out


DEFINES = _defines()
INSTR_BYTES = int(DEFINES["GVM_INSTR_BYTES"])
TENSOR_BYTES = int(DEFINES["GVM_TENSOR_BYTES"])
TRACE_BYTES = int(DEFINES["GVM_TRACE_BYTES"])
ERROR_BYTES = int(DEFINES["GVM_ERROR_BYTES"])
MAX_WAITS = int(DEFINES["GVM_MAX_WAITS"])
MAX_TENSORS = int(DEFINES["GVM_MAX_TENSORS"])
MAX_ARGS = int(DEFINES["GVM_MAX_ARGS"])
MAX_DIMS = int(DEFINES["GVM_MAX_DIMS"])
NONE = int(DEFINES["GVM_NONE"])
MAX_COUNTERS = int(DEFINES["GVM_MAX_COUNTERS"])
MAX_INSTRS = int(DEFINES["GVM_MAX_INSTRS"])
MAX_TABLE = int(DEFINES["GVM_MAX_TABLE"])
RMS_EPS = float(DEFINES["GVM_RMS_EPS"])
TOPK = int(DEFINES["GVM_TOPK"])
GEMM_MAX_PARTS = int(DEFINES["GVM_GEMM_MAX_PARTS"])
HEAD_DIM = int(DEFINES["GVM_HEAD_DIM"])
MAX_WORKLIST_EXPERTS = int(DEFINES["GVM_MAX_WORKLIST_EXPERTS"])
#: an expert's share weight in its work list (tokens up to, quarters), then the weight above
EXPERT_SHARES = ((int(DEFINES["GVM_EXPERT_SHARE_T1"]), int(DEFINES["GVM_EXPERT_SHARE_W1"])),
                 (int(DEFINES["GVM_EXPERT_SHARE_T2"]), int(DEFINES["GVM_EXPERT_SHARE_W2"])))
EXPERT_SHARE_ABOVE = int(DEFINES["GVM_EXPERT_SHARE_W3"])
NVFP4_TILE_ROWS = int(DEFINES["GVM_NVFP4_TILE_ROWS"])
NVFP4_TILE_K = int(DEFINES["GVM_NVFP4_TILE_K"])

Op = enum.IntEnum("Op", {k[len("GVM_OP_"):]: v for k, v in _enum("gvm_opcode").items() if not k.endswith("_")})
DType = enum.IntEnum("DType", {k[len("GVM_DT_"):]: v for k, v in _enum("gvm_dtype").items()})
Stamp = enum.IntEnum("Stamp", {k[len("GVM_STAMP_"):]: v for k, v in _enum("gvm_stamp").items() if k != "GVM_N_STAMPS"})
ErrorCode = enum.IntEnum("ErrorCode", {k[len("GVM_ERR_"):]: v for k, v in _enum("gvm_error_code").items()})
N_STAMPS = _enum("gvm_stamp")["GVM_N_STAMPS"]
FLAG_LAZY = _enum("gvm_flag")["GVM_FLAG_LAZY"]

#: bytes per element (E2M1X2 counts one byte per two codes)
DTYPE_BYTES = {DType.F32: 4, DType.BF16: 2, DType.E4M3: 1, DType.E2M1X2: 1, DType.I32: 4, DType.U8: 1}

INSTR_DTYPE = np.dtype(
    [
        ("opcode", "<u2"),
        ("flags", "<u2"),
        ("signal", "<u2"),
        ("n_waits", "<u2"),
        ("wait_counter", "<u2", (MAX_WAITS,)),
        ("wait_base", "<u4", (MAX_WAITS,)),
        ("wait_step", "<u4", (MAX_WAITS,)),
        ("tensor", "<u2", (MAX_TENSORS,)),
        ("pf_offset", "<u8"),
        ("pf_bytes", "<u4"),
        ("pf_slot", "<u2"),
        ("reserved", "<u2"),
        ("arg", "<i4", (MAX_ARGS,)),
    ]
)

TENSOR_DTYPE = np.dtype(
    [
        ("ptr", "<u8"),
        ("dtype", "u1"),
        ("ndim", "u1"),
        ("flags", "<u2"),
        ("reserved", "<u4"),
        ("shape", "<i4", (MAX_DIMS,)),
        ("stride", "<i8", (MAX_DIMS,)),
    ]
)

TRACE_DTYPE = np.dtype(
    [
        ("sm", "<u4"),
        ("block", "<u4"),
        ("group", "<u4"),
        ("instr", "<u4"),
        ("globaltimer", "<u8", (N_STAMPS,)),
        ("clock", "<u8", (N_STAMPS,)),
    ]
)

ERROR_DTYPE = np.dtype(
    [
        ("code", "<u4"),
        ("instr", "<u4"),
        ("counter", "<u4"),
        ("seen", "<u4"),
        ("target", "<u4"),
        ("sm", "<u4"),
        ("block", "<u4"),
        ("step", "<u4"),
        ("waited_ns", "<u8"),
        ("detail", "<u8"),
    ]
)

#: record name in the header -> numpy dtype, for the layout test
RECORDS = {"gvm_instr": INSTR_DTYPE, "gvm_tensor": TENSOR_DTYPE, "gvm_trace": TRACE_DTYPE, "gvm_error": ERROR_DTYPE}


def f2i(x: float) -> int:
    """The int32 argument that carries float x by its IEEE-754 bits."""
    return int(np.array([x], dtype=np.float32).view(np.int32)[0])


def i2f(i: int) -> float:
    """Inverse of f2i."""
    return float(np.array([i], dtype=np.int32).view(np.float32)[0])


for _name, _dt in RECORDS.items():
    _want = {"gvm_instr": INSTR_BYTES, "gvm_tensor": TENSOR_BYTES, "gvm_trace": TRACE_BYTES, "gvm_error": ERROR_BYTES}[_name]
    if _dt.itemsize != _want:  # pragma: no cover - caught at import, before any launch
        raise RuntimeError(f"{_name}: numpy layout has {_dt.itemsize} bytes, header says {_want}")
