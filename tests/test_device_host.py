"""The GPU backend's host side, without a GPU: record checks before a launch,
device errors turned into exceptions that name instruction and counter, the
parameter block's layout, the ptxas report parser and the helper streams."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from gpuvm.device.build import parse_ptxas
from gpuvm.device.errors import OpError, WatchdogError, error_from_record
from gpuvm.device.layout import CLAIM_SLOTS, PARAMS_DTYPE
from gpuvm.device.programs import gemm_stream, nop_stream, stuck_stream
from gpuvm.device.validate import check_records
from gpuvm.device.warm import warm_bindings, warm_stream
from gpuvm.isa import ERROR_DTYPE, NONE, DType, ErrorCode, Op, f2i
from gpuvm.nvtx import nvtx_range
from gpuvm.opspec import ProgramError
from gpuvm.program import Program, Stream
from gpuvm.tensors import empty

ALL = frozenset(Op)


def _small() -> tuple[Stream, np.ndarray]:
    p = Program("small")
    a = p.tensor("a", (64,), DType.F32)
    b = p.tensor("b", (64,), DType.F32, role="weight")
    c = p.counter("ready")
    p.op(Op.COPY, [a, b], [0, 64], signal=c, prefetch=(b, 0, 256), label="load")
    p.op(Op.SCALE_ADD, [a, a, b], [0, 64, f2i(2.0), f2i(1.0)], waits=[c], label="axpy")
    s = p.build(order="given")
    return s, s.table({t.name: empty(t) for t in s.tensors})


def test_sound_records_pass() -> None:
    s, tab = _small()
    check_records(s.records, tab, len(s.counters), ALL, s.labels)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("opcode", 99, "unknown opcode 99 is not compiled"),
        ("n_waits", 5, "5 waits, at most 4"),
        ("wait_counter", [7, NONE, NONE, NONE], r"waits on counter \[7\], but there are 1 counters"),
        ("signal", 3, "signals counter 3, but there are 1 counters"),
        ("tensor", [0, 2, NONE, NONE, NONE, NONE, NONE, NONE], r"tensor slots \[0, 2, .*\] reach past the table of 2"),
        ("pf_bytes", 4096, "prefetch range ends at byte 4096, past its tensor"),
        ("pf_slot", 5, "prefetch slot 5 holds no tensor"),
    ],
)
def test_bad_records_are_refused_before_launch(field: str, value: object, message: str) -> None:
    s, tab = _small()
    rec = s.records.copy()
    row = 1 if field in ("wait_counter", "n_waits") else 0
    rec[row][field] = value
    with pytest.raises(ProgramError, match=f"instruction {row} '{s.labels[row]}': {message}"):
        check_records(rec, tab, len(s.counters), ALL, s.labels)


def test_ops_missing_from_the_kernel_are_refused() -> None:
    s, tab = _small()
    with pytest.raises(ProgramError, match="instruction 1 'axpy': SCALE_ADD is not compiled into this kernel"):
        check_records(s.records, tab, len(s.counters), {Op.COPY}, s.labels)


def test_gemm_token_ranges_need_a_2_group_kernel() -> None:
    p = Program("router")
    x, w, out = p.tensor("x", (4, 64), DType.F32), p.tensor("w", (8, 64), DType.F32, role="weight"), p.tensor("out", (4, 8), DType.F32)
    p.op(Op.GEMM, [out, x, w], [0, 8, 1, 2], label="wr")
    s = p.build()
    tab = s.table({t.name: empty(t) for t in s.tensors})
    check_records(s.records, tab, len(s.counters), ALL, s.labels, max_groups=2)
    with pytest.raises(ProgramError, match="instruction 0 'wr': a GEMM token range needs a kernel of at most 2 groups"):
        check_records(s.records, tab, len(s.counters), ALL, s.labels, max_groups=4)


def _error(**fields: int) -> np.void:
    rec = np.zeros(1, dtype=ERROR_DTYPE)
    for k, v in fields.items():
        rec[0][k] = v
    return rec[0]


def test_watchdog_record_becomes_a_named_exception() -> None:
    s, _ = _small()
    rec = _error(code=ErrorCode.WATCHDOG, instr=1, counter=0, seen=4, target=5, sm=17, block=17, step=3, waited_ns=1_250_000_000)
    err = error_from_record(rec, s.labels, [int(o.opcode) for o in s.ops], [c.name for c in s.counters])
    assert isinstance(err, WatchdogError)
    msg = str(err)
    for part in ("instruction 1 'axpy' (SCALE_ADD)", "1.250 s", "counter 0 'ready'", "value seen 4", "target 5", "step 3", "SM 17"):
        assert part in msg
    assert err.record["target"] == 5


def test_an_ops_own_watchdog_says_so() -> None:
    """EXPERT_DOWN's bounded wait for its expert's up rows returns WATCHDOG from
    inside the op: the runtime records no counter, and the message says what waited."""
    s, _ = _small()
    rec = _error(code=ErrorCode.WATCHDOG, instr=1, counter=NONE, detail=int(Op.SCALE_ADD))
    err = error_from_record(rec, s.labels, [int(o.opcode) for o in s.ops], [c.name for c in s.counters])
    assert isinstance(err, WatchdogError) and "waited past its bound inside the op" in str(err) and "counter 65535" not in str(err)


def test_op_error_and_no_error() -> None:
    s, _ = _small()
    names = [c.name for c in s.counters]
    ops = [int(o.opcode) for o in s.ops]
    err = error_from_record(_error(code=ErrorCode.BAD_ARGS, instr=0, counter=NONE, detail=int(Op.COPY)), s.labels, ops, names)
    assert isinstance(err, OpError) and "instruction 0 'load' (COPY) failed with BAD_ARGS" in str(err)
    assert error_from_record(_error(), s.labels, ops, names) is None


def test_params_block_is_the_c_struct() -> None:
    """runtime/params.cuh: ten 8-byte fields then six 4-byte ones, 104 bytes
    (the build test checks every offset against the compiled kernel)."""
    assert PARAMS_DTYPE.itemsize == 104 and PARAMS_DTYPE.fields["claim_depth"][1] == 100
    assert PARAMS_DTYPE.fields["watchdog_ns"][1] == 72 and PARAMS_DTYPE.fields["n_instrs"][1] == 80


def test_ptxas_report_parser() -> None:
    log = """ptxas info    : 111 bytes gmem
ptxas info    : Compiling entry function 'gvm_kernel' for 'sm_90a'
ptxas info    : Function properties for gvm_kernel
ptxas         .     16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 164 registers, used 16 barriers, 16 bytes cumulative stack size, 768 bytes smem
ptxas info    : Function properties for _Z8gvm_failv
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
"""
    rep = parse_ptxas(log)
    k = rep["gvm_kernel"]
    assert (k.registers, k.barriers, k.smem_static, k.stack_frame, k.spill_stores, k.spill_loads) == (164, 16, 768, 16, 8, 12)
    assert k.local_memory and not rep["_Z8gvm_failv"].local_memory


def test_helper_streams() -> None:
    g = gemm_stream(8, 64, 256, 16)
    assert len(g) == 4 and [int(r["arg"][0]) for r in g.records] == [0, 16, 32, 48]
    assert int(g.records[1]["pf_offset"]) == 16 * 256 * 2 and int(g.records[1]["pf_bytes"]) == 16 * 256 * 2
    assert all(int(r["pf_bytes"]) == 0 for r in gemm_stream(1, 64, 256, 32, prefetch=False).records)
    with pytest.raises(ProgramError):
        gemm_stream(1, 60, 256, 16)
    assert len(nop_stream(5)) == 5
    s, i = stuck_stream(target=77)
    assert s.labels[i] == "stuck" and int(s.records[i]["wait_base"][0]) == 77
    assert int(s.records[i]["wait_counter"][0]) == 0


def test_warm_stream_is_valid_for_what_is_compiled() -> None:
    ws = warm_stream({Op.NOP, Op.GEMM, Op.RMSNORM})
    assert ws is not None and {o.opcode for o in ws.ops} == {Op.NOP, Op.GEMM}
    tab = ws.table(warm_bindings(ws, torch.device("cpu")))
    check_records(ws.records, tab, 0, {Op.NOP, Op.GEMM}, ws.labels)
    assert all(int(r["n_waits"]) == 0 and int(r["signal"]) == NONE for r in ws.records)
    assert warm_stream({Op.RMSNORM}) is None


def test_nvtx_range_is_harmless() -> None:
    with nvtx_range("gpuvm test"):
        x = 1
    assert x == 1


class _FakeVM:
    """What Loaded.params reads of a VM: a 4-block, 2-group GPU, warmer on."""

    n_blocks, groups, claim_depth, claim_slots = 4, 2, 3, CLAIM_SLOTS
    torch_device = torch.device("cpu")

    def warm_args(self) -> tuple[int, int, int]:
        return 1000, 2000, 6


def _loaded_on_cpu(stream: Stream) -> object:
    from gpuvm.device.vm import Loaded

    ld = Loaded.__new__(Loaded)  # the fields __init__ would upload, as CPU tensors
    ld.vm, ld.stream = _FakeVM(), stream
    ld._records = torch.zeros(len(stream) * 128, dtype=torch.uint8)
    ld._table, ld._counters = torch.zeros(64, dtype=torch.uint8), torch.zeros(4, dtype=torch.int32)
    ld._state, ld._error = torch.zeros(4, dtype=torch.int32), torch.zeros(12, dtype=torch.int32)
    ld._trace, ld._static = None, None
    return ld


def test_launch_parameters() -> None:
    s, _ = _small()
    ld = _loaded_on_cpu(s)
    p = ld.params(7, "dynamic", watchdog_s=0.25)[0]  # type: ignore[attr-defined]
    assert (int(p["step"]), int(p["mode"]), int(p["groups"]), int(p["n_instrs"])) == (7, 0, 2, 2)
    assert int(p["watchdog_ns"]) == 250_000_000 and int(p["static_lists"]) == 0 and int(p["trace"]) == 0
    assert int(p["counters"]) == ld._counters.data_ptr() and int(p["instrs"]) == ld._records.data_ptr()  # type: ignore[attr-defined]
    assert (int(p["warm_instrs"]), int(p["warm_table"]), int(p["n_warm"])) == (1000, 2000, 6)
    assert int(p["claim_depth"]) == 3
    st = ld.params(8, "static")[0]  # type: ignore[attr-defined]  # default lists: gpuvm.static
    assert int(st["mode"]) == 1 and int(st["static_lists"]) == ld._static.data_ptr()  # type: ignore[attr-defined]
    packed = ld._static.numpy()  # type: ignore[attr-defined]
    assert packed[:5].tolist()[0] == 0 and packed[4] == len(s) and sorted(packed[5:].tolist()) == [0, 1]
    for bad in (dict(mode="fast"), dict(watchdog_s=0.0)):
        with pytest.raises(ValueError):
            ld.params(0, **bad)  # type: ignore[attr-defined]
    for depth in (0, CLAIM_SLOTS + 1):
        ld.vm.claim_depth = depth  # type: ignore[attr-defined]
        with pytest.raises(ValueError, match=f"claim_depth must be 1..{CLAIM_SLOTS}"):
            ld.params(0)  # type: ignore[attr-defined]
    with pytest.raises(ProgramError, match="increasing stream order"):
        ld.set_static([[1, 0], [], [], []])  # type: ignore[attr-defined]
    with pytest.raises(ProgramError, match="one list per block"):
        ld.set_static([[0, 1]])  # type: ignore[attr-defined]


def test_rope_step_table_is_the_models_base() -> None:
    """ops/attention.cuh's RoPE steps (a constant table) are SHARD.rope_base^(-i/32) / pi:
    the device and the reference rotate by the same angles. Within 1e-14 relative: the
    table holds what the device's f64 exp2 of a rounded log2(500000) gave before it (up
    to ~8 ulps), far below the 6e-8 of the reduced angle's f32 rounding."""
    import math
    import re

    from gpuvm.device.build import device_root
    from gpuvm.muse.config import SHARD

    src = (device_root() / "ops" / "attention.cuh").read_text()
    body = re.search(r"gvm_rope_turns_tab\[32\] = \{([^}]*)\}", src)
    assert body is not None
    tab = [float(v) for v in body.group(1).split(",")]
    assert len(tab) == SHARD.head_dim // 2 == 32
    for i, t in enumerate(tab):
        want = SHARD.rope_base ** (-2 * i / SHARD.head_dim) / math.pi
        assert abs(t - want) <= 1e-14 * want, (i, t, want)


def test_flush_restoring_puts_the_input_back_then_flushes() -> None:
    """L2Flush.restoring (what the sweeps run before each timed launch): the
    input copied back from its source, then the flush buffer rewritten."""
    from gpuvm.device.bench import L2Flush

    flush = L2Flush(torch.device("cpu"), nbytes=1024)
    src, dst = torch.arange(8, dtype=torch.float32), torch.zeros(8)
    before = flush.restoring(dst, src)
    before()
    assert torch.equal(dst, src) and (flush.buf == 1).all()
    dst.add_(1.0)  # a run updating its input in place
    before()
    assert torch.equal(dst, src) and (flush.buf == 2).all()
