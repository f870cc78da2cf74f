"""The program builder (gpuvm/program.py): validation, ordering, counters, encoding."""
from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuvm.isa import FLAG_LAZY, INSTR_DTYPE, MAX_WAITS, NONE, DType, Op, f2i
from gpuvm.opspec import WORK_COLUMNS_BY_EXPERT
from gpuvm.program import Program, ProgramError, Stream, TensorSpec
from tests.randprog import random_program

F32, BF16, I32, E4M3, FP4 = DType.F32, DType.BF16, DType.I32, DType.E4M3, DType.E2M1X2


def _copy_prog(n: int = 16) -> tuple[Program, TensorSpec, TensorSpec]:
    p = Program("t")
    return p, p.tensor("x", (n,), F32), p.tensor("y", (n,), F32)


# ---- graph errors ---------------------------------------------------------------
def test_cycle_is_rejected() -> None:
    p, x, y = _copy_prog()
    a, b = p.counter("a"), p.counter("b")
    p.op(Op.COPY, [x, y], [0, 4], waits=[b], signal=a, label="first")
    p.op(Op.COPY, [y, x], [0, 4], waits=[a], signal=b, label="second")
    p.op(Op.NOP, signal=p.counter("free"))
    with pytest.raises(ProgramError, match="cycle through 2 ops"):
        p.build()


def test_waiting_on_own_signal_is_a_cycle() -> None:
    p, x, y = _copy_prog()
    c = p.counter("c")
    p.op(Op.NOP, signal=c)
    p.op(Op.COPY, [x, y], [0, 4], waits=[c], signal=c, label="selfish")
    with pytest.raises(ProgramError, match="own signal"):
        p.build()


def test_partial_wait_on_a_counter_one_signals_later_is_not_a_cycle() -> None:
    p, x, y = _copy_prog()
    c = p.counter("c")
    p.op(Op.NOP, signal=c)
    p.op(Op.COPY, [x, y], [0, 4], waits=[(c, 1)], signal=c)  # waits for the first signaller only
    assert len(p.build()) == 2


def test_wait_on_a_later_op_rejected_in_given_order() -> None:
    p, x, y = _copy_prog()
    c = p.counter("c")
    p.op(Op.COPY, [y, x], [0, 4], waits=[c], label="reader")
    p.op(Op.COPY, [x, y], [0, 4], signal=c, label="writer")
    with pytest.raises(ProgramError, match="'reader' waits on op #1 'writer', which comes later"):
        p.build(order="given")
    assert p.build().labels == ["writer", "reader"]  # priority order fixes it


def test_unknown_order_rejected() -> None:
    p, _, _ = _copy_prog()
    p.op(Op.NOP)
    with pytest.raises(ProgramError, match="order"):
        p.build(order="fastest")


def test_counter_and_tensor_of_another_program_rejected() -> None:
    p, x, y = _copy_prog()
    q, qx, _ = _copy_prog()
    foreign = q.counter("foreign")
    with pytest.raises(ProgramError, match="not declared"):
        p.op(Op.NOP, waits=[foreign])
    with pytest.raises(ProgramError, match="signals a counter not declared"):
        p.op(Op.NOP, signal=foreign)
    with pytest.raises(ProgramError, match="tensor 'x' is not declared"):
        p.op(Op.COPY, [y, qx], [0, 4])
    look_alike = TensorSpec("x", (16,), F32, "activation", 5)
    with pytest.raises(ProgramError, match="not declared"):
        p.op(Op.COPY, [y, look_alike], [0, 4])


def test_unreachable_targets_rejected() -> None:
    p, x, y = _copy_prog()
    silent = p.counter("silent")
    p.op(Op.NOP, waits=[silent])
    with pytest.raises(ProgramError, match="nothing signals"):
        p.build()
    p2, _, _ = _copy_prog()
    c = p2.counter("two")
    p2.op(Op.NOP, signal=c)
    p2.op(Op.NOP, signal=c)
    p2.op(Op.NOP, waits=[(c, 3)])
    with pytest.raises(ProgramError, match="waits for 3 signals of 'two', but only 2"):
        p2.build()
    with pytest.raises(ProgramError, match="must be >= 1"):
        p2.op(Op.NOP, waits=[(c, 0)])


def test_op_level_limits() -> None:
    p, x, y = _copy_prog()
    cs = [p.counter(f"c{i}") for i in range(MAX_WAITS + 1)]
    with pytest.raises(ProgramError, match=f"at most {MAX_WAITS} waits"):
        p.op(Op.NOP, waits=cs)
    with pytest.raises(ProgramError, match="int32"):
        p.op(Op.SLEEP, [], [2**31])
    with pytest.raises(ProgramError, match="at most"):
        p.op(Op.NOP, [x] * 9)
    with pytest.raises(ProgramError, match="prefetch"):
        p.op(Op.COPY, [x, y], [0, 4], prefetch=(y, 60, 8))
    z = p.tensor("z", (4,), F32)
    with pytest.raises(ProgramError, match="not one of the op's tensors"):
        p.op(Op.COPY, [x, y], [0, 4], prefetch=(z, 0, 4))
    with pytest.raises(ProgramError, match="declared twice"):
        p.tensor("x", (3,), F32)
    with pytest.raises(ProgramError, match="positive dims"):
        p.tensor("w", (3, 0), F32)
    with pytest.raises(ProgramError, match="no ops"):
        Program("empty").build()


def test_capacity() -> None:
    p, x, y = _copy_prog()
    for _ in range(5):
        p.op(Op.NOP)
    assert len(p.build(capacity=5)) == 5
    with pytest.raises(ProgramError, match="has 5 ops; the stream buffer holds 4"):
        p.build(capacity=4)


def test_work_lists_are_checked() -> None:
    """A list's workers signal a1 between them (isa/gvm_isa.h EXPERT_UP): they must
    agree, number a1, own their counter, and be waited for whole (or, by a
    down list that waits for their rows by expert, for their items taken)."""

    def build(n_w: int = 3, a1: int = 3, odd_args: bool = False, intruder: bool = False, partial: bool = False, fixed: tuple[int, ...] = (),
              down: int | None = None, work: str = "work_x") -> Stream:
        p = Program("lists")
        t = _muse_tensors(p)
        done = p.counter("hbuf")
        for k in range(n_w):
            args = [0, a1, 16, 64 if not (odd_args and k == 1) else 32, fixed[k] if fixed else 0]
            p.op(Op.EXPERT_UP, [t[n] for n in ("hbuf", "x", "gu", "gus", "guts", "meta", "route", work)], args, signal=done, label=f"up{k}")
        if intruder:
            p.op(Op.NOP, signal=done, label="intruder")
        if down is None:
            p.op(Op.NOP, waits=[(done, 1) if partial else done])
        else:  # a down list of 2 that waits for the up list's items all taken, and then (a5 = down) its rows by expert
            for k in range(2):
                p.op(Op.EXPERT_DOWN, [t[n] for n in ("y", "hbuf", "dc", "ds", "dts", "meta", "route", work)], [1, 2, 16, 64, 0, down], waits=[(done, 1)], label=f"down{k}")
        return p.build()

    build()
    with pytest.raises(ProgramError, match=r"work list 'work_x'\[0\] has 2 workers, but its ops say a1 = 3"):
        build(n_w=2)
    with pytest.raises(ProgramError, match="'up1' differs from op #0 'up0'"):
        build(odd_args=True)
    with pytest.raises(ProgramError, match="which op #3 'intruder' also signals"):
        build(intruder=True)
    with pytest.raises(ProgramError, match="waits for 1 of the 3 signals of 'hbuf'.*wait for all"):
        build(partial=True)
    s = build(down=1)  # its rows by expert: it may start once the items are taken, and depends on all 3 workers
    assert [len(d) for d in s.deps[3:]] == [3, 3] and [tuple(r["wait_base"][:1]) for r in s.records[3:]] == [(1,), (1,)]
    with pytest.raises(ProgramError, match="waits for 1 of the 3 signals of 'hbuf'.*or for 1 from an EXPERT_DOWN"):
        build(down=0)  # no per-expert waits: it would read rows still being written
    with pytest.raises(ProgramError, match="its workers are fixed"):
        build(down=1, fixed=(3, 1, 2))
    with pytest.raises(ProgramError, match=r"a5 = j \+ 1 names the list j.*not a5 = 1 with work \(2, 2\)"):
        build(down=1, work="work")
    build(fixed=(3, 1, 2))  # a fixed round robin: each worker's number once
    with pytest.raises(ProgramError, match=r"fixed workers \(a4\) must number 1..3 once each, not \[1, 1, 2\]"):
        build(fixed=(1, 2, 1))
    with pytest.raises(ProgramError, match=r"must number 1..3 once each, not \[0, 1, 2\]"):
        build(fixed=(0, 1, 2))
    with pytest.raises(ProgramError, match="a fixed worker's number a4 must be 1..3"):
        build(fixed=(1, 2, 4))


# ---- per-opcode shape and dtype checks -----------------------------------------
T, D, HQ, HKV, C, S, NCH, NE, E, H, I = 4, 128, 4, 2, 3, 8, 3, 16, 4, 256, 128  # sizes that differ, so a swap shows
QKVG = (2 * HQ + 2 * HKV) * 64


def _muse_tensors(p: Program) -> dict[str, TensorSpec]:
    shapes = {
        "s": ((T, D), F32), "a": ((T, D), F32), "wD": ((D,), F32), "h": ((T, D), BF16), "W": ((QKVG, D), BF16),
        "qkvg": ((T, QKVG), BF16), "q": ((T, HQ, 64), BF16), "w64": ((64,), F32), "kc": ((C, S, HKV, 64), E4M3),
        "vc": ((C, S, HKV, 64), E4M3), "convs": ((C, 4), I32), "po": ((T, HQ, NCH, 64), F32), "pml": ((T, HQ, NCH, 2), F32),
        "o": ((T, HQ * 64), BF16), "sc": ((T, NE), F32), "Wr": ((NE, D), F32), "meta": ((2, E), I32), "route": ((5, 8 * T), I32), "work": ((2, 2), I32),
        "work_x": ((2, WORK_COLUMNS_BY_EXPERT), I32),
        "x": ((T, H), BF16), "gu": ((E, 2, I // 16, 8 * H), FP4), "gus": ((E, 2, I // 16, H), E4M3), "guts": ((E, 2), F32),
        "hbuf": ((8 * T, I), BF16), "dc": ((E, H // 16, 8 * I), FP4), "ds": ((E, H // 16, I), E4M3), "dts": ((E,), F32),
        "y": ((8 * T, H), F32), "fsq": ((T, H), BF16), "Wbad": ((QKVG, D + 8), BF16), "s_bf": ((T, D), BF16),
        "kc_bad": ((C, S, HKV + 1, 64), E4M3), "po_bad": ((T + 1, HQ, NCH, 64), F32), "route_bad": ((5, 8 * T + 1), I32),
        "sc4": ((T, 4 * NE), F32), "tk": ((3,), I32), "tk2": ((3, 1), I32),
    }
    return {k: p.tensor(k, shape, dt) for k, (shape, dt) in shapes.items()}


# opcode, valid tensor names, valid args, then broken variants: (slot index, replacement name) or args
MUSE_CASES = [
    (Op.GEMM, ["qkvg", "h", "W"], [0, 16], [(1, "s"), (2, "Wbad"), (0, "s_bf"), [QKVG - 8, 16]]),
    (Op.GEMM, ["sc", "s", "Wr"], [0, NE], [(0, "q"), (2, "W"), [1, NE]]),
    (Op.GEMM, ["sc", "s", "Wr"], [0, NE, 1, T - 1], [[0, NE, 1, 0], [0, NE, 0, T + 1], [0, NE, T - 1, 2], [0, NE, -1, 1], [0, NE, 0, -1]]),
    # K parts: P a power of two cutting K into multiples of 8 (D = 128: at most 16), part < P, ticket < 3; no parts: a6 = a7 = 0
    (Op.GEMM, ["sc", "s", "Wr", "sc4", "tk"], [0, NE, 0, 0, 0, 4, 3, 2],
     [[0, NE, 0, 0, 0, 3, 0, 0], [0, NE, 0, 0, 0, 4, 4, 0], [0, NE, 0, 0, 0, 4, 0, 3], [0, NE, 0, 0, 0, 32, 0, 0], [0, NE, 0, 0, 0, 4, -1, 0],
      [0, NE, 0, 0, 0, 1, 1, 0], [0, NE, 0, 0, 0, 0, 0, 1], [0, NE, 0, 0, 0, -2, 0, 0], (3, "sc"), (4, "tk2"), (4, "meta"), (1, "h")]),
    (Op.RMSNORM, ["h", "s", "wD"], [0, T], [(1, "h"), (2, "w64"), (0, "q"), [1, T]]),
    (Op.QK_ROPE_KV, ["qkvg", "q", "w64", "w64", "kc", "vc", "convs"], [0, 1, f2i(1.0), f2i(1.0)], [(1, "o"), (4, "kc_bad"), (6, "meta"), (0, "s"), [C, 1], [0, 2]]),
    (Op.ATTN_CHUNK, ["q", "kc", "vc", "convs", "po", "pml"], [0, 1, 2, 16, 0, f2i(1.0), f2i(1.0)], [(4, "po_bad"), (1, "s"), (5, "po"), [0, HKV, 0, 16, 0], [0, 0, NCH, 16, 0], [0, 0, 0, 0, 0], [0, 0, 0, 16, -1], [0, 1, 2, 16, 0, f2i(0.0), f2i(1.0)], [0, 1, 2, 16, 0, f2i(float("nan")), f2i(1.0)]]),
    # the fused form: qkvg with w_qn, w_kn and a7 = rope
    (Op.ATTN_CHUNK, ["qkvg", "kc", "vc", "convs", "po", "pml", "w64", "w64"], [0, 1, 2, 16, 0, f2i(1.0), f2i(1.0), 1],
     [(0, "s_bf"), (6, "wD"), (7, "s"), [0, 1, 2, 16, 0, f2i(1.0), f2i(1.0), 2]]),
    (Op.ATTN_MERGE, ["o", "po", "pml", "qkvg"], [0, T], [(0, "h"), (1, "po_bad"), [2, T]]),
    (Op.RESIDUAL, ["s", "a", "wD", "wD", "wD", "a", "h"], [0, T], [(0, "h"), (2, "w64"), (5, "h"), (6, "s"), [T, 1]]),
    (Op.TOPK, ["sc", "meta", "route", "work"], [0, E], [(2, "route_bad"), (0, "h"), (1, "convs"), (3, "sc"), [NE - 1, E], [0, E + 1], [0, E, 3], [0, E, 0, 1, 1]]),
    # the picks of tokens [1, T) (mode 1), then the table from them (mode 2)
    (Op.TOPK, ["sc", "meta", "route"], [0, E, 1, 1, T - 1], [[0, E, 1, 0, 0], [0, E, 1, T - 1, 2], [0, E, 1, -1, 1], (2, "route_bad")]),
    (Op.TOPK, ["sc", "meta", "route", "work"], [0, E, 2], [[0, E, 2, 1, 0], [0, E, 2, 0, 1], (3, "sc")]),
    (Op.EXPERT_UP, ["hbuf", "x", "gu", "gus", "guts", "meta", "route", "work"], [0, 1, I, I], [(2, "dc"), (3, "ds"), (4, "dts"), (0, "y"), (6, "route_bad"), (7, "meta"), [2, 1, 16, 16], [0, 0, 16, 16], [0, 2, 0, 16], [0, 2, 16, 0], [-1, 2, 16, 16], [0, 2, 8, 16], [0, 2, 16, 24]]),
    (Op.EXPERT_DOWN, ["y", "hbuf", "dc", "ds", "dts", "meta", "route", "work"], [1, 4, 16, 64], [(2, "gu"), (0, "hbuf"), (4, "guts"), (7, "sc"), [1, 0, H, H]]),
    (Op.EXPERT_COMBINE, ["fsq", "y", "route"], [0, T], [(0, "h"), (2, "route_bad"), (1, "hbuf"), [1, T]]),
    (Op.COPY, ["s", "a"], [0, T * D], [(1, "h"), [1, T * D]]),
    (Op.SCALE_ADD, ["s", "a", "s"], [0, T * D, 0, 0], [(2, "h"), [-1, 1]]),
    (Op.SLEEP, [], [100], [[-1], [2_000_000_000]]),
]


@pytest.mark.parametrize("case", MUSE_CASES, ids=lambda c: c[0].name)
def test_opcode_checks(case: tuple) -> None:
    opcode, names, args, broken = case
    p = Program("shapes")
    t = _muse_tensors(p)
    p.op(opcode, [t[n] for n in names], args)  # the valid form passes
    for b in broken:
        slots, a = [t[n] for n in names], list(args)
        if isinstance(b, tuple):
            slots[b[0]] = t[b[1]]
        else:
            a = b
        with pytest.raises(ProgramError, match=opcode.name):
            p.op(opcode, slots, a)


def test_required_slot_missing() -> None:
    p = Program("shapes")
    t = _muse_tensors(p)
    with pytest.raises(ProgramError, match="slot t2 .W. is required"):
        p.op(Op.GEMM, [t["qkvg"], t["h"], None], [0, 8])
    with pytest.raises(ProgramError, match="needs an output"):
        p.op(Op.RESIDUAL, [t["s"], t["a"], t["wD"], t["wD"], t["wD"]], [0, T])


# ---- ordering ----------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 60))
def test_priority_order_is_topological(seed: int, n: int) -> None:
    s = random_program(random.Random(seed), n).build()
    pos = {ins.id: k for k, ins in enumerate(s.ops)}
    assert sorted(pos) == list(range(n))
    for k, ins in enumerate(s.ops):
        for i, (c, _) in enumerate(ins.waits):
            for sig in c.signallers[: ins.wait_count(i)]:
                assert pos[sig.id] < k
                assert pos[sig.id] in s.deps[k]


def test_longest_path_first() -> None:
    p, x, y = _copy_prog(1 << 16)
    short = p.op(Op.COPY, [x, y], [0, 8], label="short")
    prev = p.counter("chain0")
    p.op(Op.COPY, [y, x], [0, 8], signal=prev, label="long head")
    for i in range(3):
        nxt = p.counter(f"chain{i + 1}")
        p.op(Op.COPY, [y, x], [0, 8], waits=[prev], signal=nxt, label=f"long {i}")
        prev = nxt
    big = p.op(Op.COPY, [x, y], [0, 1 << 16], label="big")  # costs more than the chain
    labels = p.build().labels
    assert labels[:4] == ["big", "long head", "long 0", "long 1"]  # the short op waits its turn
    assert labels.index(short.label) > labels.index("long 1") and big.label == labels[0]


def test_depth_order_puts_the_longer_chain_first() -> None:
    p, x, y = _copy_prog(1 << 16)
    done = p.counter("done")
    big = p.op(Op.COPY, [x, y], [0, 1 << 16], signal=done, label="big")  # one op, many bytes
    head = p.counter("head")
    p.op(Op.COPY, [y, x], [0, 8], signal=head, label="head")  # two small ops before the same end
    p.op(Op.COPY, [y, x], [0, 8], waits=[head], signal=done, label="tail")
    p.op(Op.NOP, waits=[done], label="end")
    assert p.build().labels[0] == big.label  # by bytes the big op is the longer path
    assert p.build(order="depth").labels[:2] == ["head", "big"]  # by ops the chain is
    s = random_program(random.Random(3), 60).build(order="depth")  # still topological
    pos = {ins.id: k for k, ins in enumerate(s.ops)}
    assert all(pos[sig.id] < k for k, ins in enumerate(s.ops) for i, (c, _) in enumerate(ins.waits) for sig in c.signallers[: ins.wait_count(i)])


def test_order_with_ranks_an_op_beside_another() -> None:
    """order_with: in the depth order an op with a short path to the end ranks
    with the op it names (a Wqkvg g tile beside the q|k|v tiles, ahead of the
    QK_ROPE_KV ops that wait for those); not an op of the program: refused."""
    p, x, y = _copy_prog(1 << 16)
    h, qkv, kv, done = p.counter("h"), p.counter("qkv"), p.counter("kv"), p.counter("done")
    p.op(Op.COPY, [x, y], [0, 8], signal=h, label="norm")
    first = p.op(Op.COPY, [y, x], [0, 8], waits=[h], signal=qkv, label="qkv")
    p.op(Op.COPY, [y, x], [8, 8], waits=[qkv], signal=kv, label="rope")
    p.op(Op.COPY, [y, x], [16, 8], waits=[kv], signal=done, label="attn")
    p.op(Op.COPY, [y, x], [24, 8], waits=[h], signal=done, label="g", order_with=first)
    p.op(Op.NOP, waits=[done], label="end")
    assert p.build(order="depth").labels == ["norm", "qkv", "g", "rope", "attn", "end"]
    p.instrs[4].order_with = None  # without it, g's path (one op to the end) ranks it after rope's
    labels = p.build(order="depth").labels
    assert labels.index("g") > labels.index("rope")
    other, _, _ = _copy_prog(1 << 16)
    with pytest.raises(ProgramError, match="order_with"):
        p.op(Op.NOP, order_with=other.op(Op.NOP))


def test_order_after_ranks_an_op_below_another() -> None:
    """order_after: an op on a longer chain ranks below the op it names (TOPK's
    picks behind the squeeze's tiles); without it, above; not an op of the
    program: refused."""
    p, x, y = _copy_prog(1 << 16)
    h, scored, x2, picked, done = p.counter("h"), p.counter("scored"), p.counter("x"), p.counter("picked"), p.counter("done")
    p.op(Op.COPY, [x, y], [0, 8], signal=h, label="norm")
    p.op(Op.COPY, [y, x], [0, 8], waits=[h], signal=scored, label="router")
    wide = [p.op(Op.COPY, [y, x], [8 + 8 * i, 8], waits=[h], signal=x2, label=f"squeeze{i}") for i in range(3)]
    pick = p.op(Op.COPY, [y, x], [40, 8], waits=[scored], signal=picked, label="pick", order_after=wide[-1])
    p.op(Op.COPY, [y, x], [48, 8], waits=[picked], signal=done, label="table")
    p.op(Op.NOP, waits=[x2, done], label="end")
    for order in ("depth", "priority"):
        labels = p.build(order=order).labels
        assert labels.index("pick") > max(labels.index(f"squeeze{i}") for i in range(3)), order
    pick.order_after = None  # without it, the pick's longer chain ranks it before the squeeze
    labels = p.build(order="depth").labels
    assert labels.index("pick") < labels.index("squeeze0")
    other, _, _ = _copy_prog(1 << 16)
    with pytest.raises(ProgramError, match="order_after"):
        p.op(Op.NOP, order_after=other.op(Op.NOP))


def test_given_order_keeps_creation_order() -> None:
    prog = random_program(random.Random(7), 40)
    s = prog.build(order="given")
    assert [o.id for o in s.ops] == list(range(40))


# ---- counters and encoding ----------------------------------------------------------
def test_per_step_counts_signallers() -> None:
    p, x, y = _copy_prog()
    a, b, unused = p.counter("a"), p.counter("b"), p.counter("unused")
    for _ in range(3):
        p.op(Op.NOP, signal=a)
    p.op(Op.NOP, waits=[a], signal=b)
    assert (a.per_step, b.per_step, unused.per_step) == (3, 1, 0)
    s = p.build()
    np.testing.assert_array_equal(s.per_step, [3, 1, 0])
    assert s.per_step.dtype == np.uint32


def test_records_match_the_ops() -> None:
    p, x, y = _copy_prog(64)
    a, b = p.counter("a"), p.counter("b")
    p.op(Op.COPY, [y, x], [8, 8], signal=a, prefetch=(x, 32, 32), label="w0")
    p.op(Op.COPY, [y, x], [16, 8], signal=a, label="w1")
    p.op(Op.SCALE_ADD, [x, y, y], [0, 8, f2i(2.0), f2i(-1.5)], waits=[a, (a, 1)], signal=b, label="sum")
    p.op(Op.SLEEP, [], [500], waits=[b], label="nap", lazy=True)
    s = p.build()
    rec = s.records
    assert rec.dtype == INSTR_DTYPE and len(rec) == 4 and rec.nbytes == 4 * 128
    by_label = {o.label: k for k, o in enumerate(s.ops)}
    r = rec[by_label["sum"]]
    assert r["opcode"] == Op.SCALE_ADD and r["signal"] == b.id and r["n_waits"] == 2
    assert list(r["wait_counter"]) == [a.id, a.id, NONE, NONE]
    assert list(r["wait_base"]) == [2, 1, 0, 0] and list(r["wait_step"]) == [2, 2, 0, 0]
    assert list(r["tensor"]) == [x.index, y.index, y.index] + [NONE] * 5
    assert list(r["arg"][:4]) == [0, 8, f2i(2.0), f2i(-1.5)] and not r["arg"][4:].any()
    assert r["pf_slot"] == NONE
    w0 = rec[by_label["w0"]]
    assert (w0["pf_slot"], w0["pf_offset"], w0["pf_bytes"]) == (1, 32, 32)
    assert w0["n_waits"] == 0 and list(w0["wait_counter"]) == [NONE] * MAX_WAITS
    nap = rec[by_label["nap"]]
    assert nap["signal"] == NONE and nap["arg"][0] == 500 and list(nap["tensor"]) == [NONE] * 8
    assert nap["flags"] == FLAG_LAZY and not rec["flags"][[by_label[k] for k in ("w0", "w1", "sum")]].any()


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_records_of_random_programs(seed: int) -> None:
    s = random_program(random.Random(seed), 30).build()
    for r, ins in zip(s.records, s.ops):
        assert r["opcode"] == ins.opcode
        assert r["signal"] == (NONE if ins.signal is None else ins.signal.id)
        waits = [(int(r["wait_counter"][i]), int(r["wait_base"][i]), int(r["wait_step"][i])) for i in range(r["n_waits"])]
        assert waits == [(c.id, ins.wait_count(i), c.per_step) for i, (c, _) in enumerate(ins.waits)]
        assert list(r["arg"][: len(ins.args)]) == list(ins.args)
