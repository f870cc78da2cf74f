"""tools/sass_loops.py: loops found in SASS text, and in a real op kernel where
nvdisasm is at hand (the CUDA toolkit's or triton's)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpuvm.isa import Op  # noqa: E402
from tools.sass_loops import loops, nvdisasm, op_sass  # noqa: E402

SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
        /*0010*/                   LDS R2, [R3] ;
.L_x_2:
        /*0020*/                   HMMA.16816.F32 R4, R8, R12, R4 ;
        /*0030*/               @P0 BRA `(.L_x_2) ;
        /*0040*/                   IADD3 R3, R3, 0x10, RZ ;
        /*0050*/              @!P1 BRA `(.L_x_1) ;
.L_x_3:
        /*0060*/                   BRA `(.L_x_4) ;
.L_x_4:
        /*0070*/                   EXIT ;
"""


def test_loops_are_labels_with_a_backward_branch() -> None:
    found = {lp.label: lp for lp in loops(SASS)}
    assert sorted(found) == [".L_x_1", ".L_x_2"]  # .L_x_4 is only branched to forward
    assert found[".L_x_2"].length == 2 and found[".L_x_2"].mix == {"HMMA": 1, "BRA": 1}
    assert found[".L_x_1"].length == 5 and found[".L_x_1"].mix["BRA"] == 2  # the inner loop counts too


# a loop with a rare block (3 instructions) and a short one (1) that conditional branches skip
SASS_BLOCKS = """
.L_x_5:
        /*0000*/                   HMMA.16816.F32 R4, R8, R12, R4 ;
        /*0010*/              @!P0 BRA `(.L_x_6) ;
        /*0020*/                   FMUL R4, R4, R2 ;
        /*0030*/                   FMUL R5, R5, R2 ;
        /*0040*/                   FMUL R6, R6, R2 ;
.L_x_6:
        /*0050*/               @P1 BRA `(.L_x_7) ;
        /*0060*/                   IADD3 R3, R3, 0x1, RZ ;
.L_x_7:
        /*0070*/               @P2 BRA `(.L_x_5) ;
        /*0080*/                   EXIT ;
"""


def test_the_usual_path_skips_only_blocks_over_the_bound() -> None:
    (lp,) = loops(SASS_BLOCKS, skip=2)
    assert lp.length == 8 and lp.path == 5  # the 3 FMULs skipped, the 1-instruction block kept
    assert loops(SASS_BLOCKS, skip=0)[0].path == 4 and loops(SASS_BLOCKS, skip=3)[0].path == 8
    assert loops(SASS_BLOCKS)[0].path is None


# nvdisasm -hex: an instruction's second 64-bit word on the next line, stall count in bits 41..44
SASS_HEX = """
.L_x_9:
        /*0000*/                   LDS R2, [R3] ;                 /* 0x0000000003027984 */
                                                                  /* 0x%016x */
        /*0010*/              @P0 BRA `(.L_x_9) ;                 /* 0xfffffffc00f40947 */
                                                                  /* 0x%016x */
""" % (3 << 41 | 1 << 45, 5 << 41 | 0x3F << 52)


def test_stall_counts_are_summed_from_the_control_words() -> None:
    (lp,) = loops(SASS_HEX)
    assert lp.length == 2 and lp.stalls == 8  # the yield bit and the wait mask do not count
    assert all(lp.stalls is None for lp in loops(SASS))  # plain SASS has no control words


@pytest.mark.skipif(nvdisasm() is None, reason="no nvdisasm (CUDA toolkit, NVIDIA's pip wheel or triton)")
def test_the_expert_ring_loop_is_found() -> None:
    # the few-token ring's slot: 16 MMAs (two pieces x 4 words x 2) and 6 copies a lane
    slots = [lp for lp in loops(op_sass(Op.EXPERT_UP)) if lp.mix["HMMA"] == 16 and lp.mix["LDGSTS"] == 6]
    assert slots and all(100 < lp.length < 1000 for lp in slots)
