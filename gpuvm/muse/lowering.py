"""Muse decode layer -> gpuvm program (MUSE.md "One layer", isa/gvm_isa.h).

emit_layer appends one layer's ops to a Program so that a whole-step program
can chain layers: the residual stream `s` and the conversation table `convs`
are shared, every other tensor is named with the layer's prefix (weights as
f"{prefix}{LayerWeights field}"). The program is built for a fixed
(conversations, tokens_each, cache_slots); positions live in `convs` and move
every step without a rebuild. Conversation c owns token rows
[c * tokens_each, (c + 1) * tokens_each).

Dependencies are as fine as is cheap: attention per conversation, the q|k|v
columns of Wqkvg apart from the g columns (only the merge needs g). The
experts run as work lists (one instruction per worker, not per expert tile),
so an expert with no tokens costs no instruction; down waits for all of up.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field, fields as dataclass_fields, replace
from typing import Callable

import torch

from ..isa import GEMM_MAX_PARTS, HEAD_DIM, NVFP4_TILE_ROWS, DType, Op, f2i
from ..opspec import GEMM_BF16_PART_K, GEMM_STAGED_TOKENS, WORK_COLUMNS_BY_EXPERT, ProgramError, TensorSpec
from ..program import Counter, Instr, Program, Stream
from ..tensors import check_binding, torch_dtype
from . import code_warm
from .config import MuseConfig
from .state import DecodeState
from .weights import LayerWeights, layer_shapes

__all__ = ["Tiles", "LayerHandles", "LayerProgram", "emit_layer", "lower_layer", "bind_layer", "poisoned", "n_chunks", "POISON_INT", "EXPERT_GRAIN", "EXPERT_CAP"]

#: what an int32 scratch buffer holds before a run, so an unwritten element shows
POISON_INT = -7
#: expert work items (sized on the GPU, opspec.expert_items): rows in
#: multiples of a tiled NVFP4 block of 16 rows (a warp's unit of the register
#: path; the shared tile's is 8 gate|up rows or 16 down rows), and at most
#: Tiles.expert_cap_up / expert_cap_down (EXPERT_CAP) rows from Tiles.expert_cap_tokens
#: tokens a step on (half for an expert of more tokens than Tiles.expert_heavy_up / _down)
EXPERT_GRAIN = {Op.EXPERT_UP: NVFP4_TILE_ROWS, Op.EXPERT_DOWN: NVFP4_TILE_ROWS}
EXPERT_CAP = {Op.EXPERT_UP: 128, Op.EXPERT_DOWN: 128}
KINDS = ("full", "sliding")


@dataclass(frozen=True)
class Tiles:
    """How a layer is cut into instructions."""

    gemm_bytes: int = 256 * 1024  # weight bytes per GEMM column tile (rounded down to 2^k rows), without gemm_fill
    # gemm_fill > 0: a layer's bf16 GEMM is cut into the largest tiles (2^k rows,
    # within gemm_min_bytes..gemm_max_bytes) that still number at most the
    # groups it has to itself: gemm_fill less the tiles that run beside it (the
    # router's beside the squeeze's, q|k|v's beside g's), so that one wave
    # covers it and no group waits for a second one (H200, 1e0f1bb, 264 against
    # fixed 256 KB tiles: step 1x1 11.62 / 12.19 ms, 1x8 21.18 / 21.68, 32x8
    # 158.3 / 168.3; Wo goes from 64 tiles to 256, Wsq from 256 to 128)
    gemm_fill: int = 264
    gemm_min_bytes: int = 64 * 1024
    # At most 256 KB: the squeeze's 128 tiles of 512 KB beside the router's 128
    # (one group of an SM streaming, the other done early) became 256 of 256 KB,
    # claimed as the router's groups free. H200, 6536bd0 and b898d7d, two runs,
    # 512 / 256 KB: step 1 x 1 9.10 / 9.01 and 9.06 / 8.97 ms, full-c1-t8 272 / 262
    # and 270 / 264 us; 32 x 8 71.9 / 71.9 ms, 16 x 8 54.2 / 53.9.
    gemm_max_bytes: int = 256 * 1024
    # gemm_tail > 1 (with gemm_fill): a one-token-style GEMM (no token spans, no
    # statistics) with more tiles than the groups it has to itself has the tiles
    # of its last, partial wave cut into gemm_tail parts each: longest first, so
    # that the wave claimed as other groups free (the squeeze's 120 tiles past
    # the 136 groups the router's 128 tiles leave) ends sooner. At one token the
    # tile that ends the squeeze's phase waits ~10 us for a group of its block
    # (H200, 16-layer step trace at 8a795e5, NOTES.md session 27). Off (1): it
    # lost (H200, 867917b, one run, 2 / 1: step 1x1 9108 / 8727 us, 1x8 14939 /
    # 14357, 16x1 23500 / 22814; the router's groups still take the last tiles).
    gemm_tail: int = 1
    # From gemm_span tokens on (with gemm_fill > 0) a bf16 GEMM is also cut
    # over tokens, in spans of gemm_span, into tiles of at least 64 rows. The
    # device stages W and x in shared memory for such tiles, 64 rows x 64
    # tokens (bf16) or 32 x 64 (f32) a pass (ops/gemm.cuh, GVM_GEMM_XS_MIN and
    # GVM_GEMM_F32_XS_MIN = 64 tokens an instruction).
    gemm_span: int = 64
    # From router_span tokens (0: never) the f32 router too is cut over tokens,
    # in spans of gemm_span, into tiles of 32 rows (one pass of the device's
    # staged f32 path); below it, tiles of router_bytes over all tokens (or
    # router_splits ranges). H200, a7cea4d, staged / register tiles: 256-token
    # layer sliding-c32-t8 1644 / 1782 us, step 32 x 8 129.2 / 136.1 ms; but
    # at 128 tokens its 16 tiles lost (full-c16-t8 1955 / 1838 us) until they
    # were cut over K as well (router_ops).
    router_span: int = 32
    # The staged router has few tiles (32 rows x 64 tokens: 32 at 256 tokens,
    # each ~250 us of FMAs on one group while the squeeze beside it took 172),
    # so its tiles are cut over K too, into the most parts (a power of two) that
    # keep it within router_ops instructions; the last part of a tile to finish
    # adds the parts up (isa/gvm_isa.h GEMM, K parts).
    router_ops: int = 128
    router_bytes: int = 64 * 1024  # the f32 router's tiles: latency bound, so smaller (2 rows of 32 KB)
    # From topk_span tokens a step (0: never) the top-8 picks (a warp's 8
    # rounds of warp reductions a token, ~0.8 us; one instruction took 104 us
    # at 256 tokens) go in TOPK instructions of topk_tokens tokens each (more
    # where the groups the router and the squeeze leave are fewer: the picks,
    # waiting for the router, held groups that 8 squeeze tiles then waited for
    # at 256 tokens), and one more builds the routing table from their picks
    # (isa/gvm_isa.h TOPK modes). H200, f5aa5f1, 16 tokens an instruction
    # against one: full-c16-t8 1214 / 1245 us, sliding-c16-t8 899 / 930, step
    # 16 x 8 64.1 / 66.0 ms, 32 x 8 97.8 / 98.8; but at 32 tokens the hop lost
    # (step 32 x 1 36.1 / 35.6 ms).
    topk_span: int = 64
    topk_tokens: int = 8
    # 1: the picks cut topk_tokens each however few groups the router and the
    # squeeze leave; the first free - 1 (free: the groups left, table's one out)
    # keep their place, the rest rank behind the squeeze's tiles (Program.op
    # order_after): claimed after the squeeze, they take the router's groups as
    # its tiles end. Without it, full-c32-t8's 7 picks of ~37 tokens end with
    # the squeeze (cf3b1c2, H100 trace), and the table's 11 us come after both.
    # (All picks behind the squeeze would put two squeeze tiles on each of the 4
    # blocks without a router tile: the model then ends the squeeze 70 us later.)
    # H100, 330686d, 4 draws each, against 0 with 16 tokens: full-c32-t8 -0.8%,
    # sliding-c32-t8 -1.3%, full-c16-t8 -0.4%, sliding-c16-t8 -0.8%, step 32 x 8
    # -1.4%; 16 tokens a pick gained about half that.
    topk_late: int = 1
    router_splits: int = 1  # token ranges per router tile at T > 1 (2 measured no faster on the H200: NOTES.md session 5)
    expert_workers: int = 264  # EXPERT_UP / EXPERT_DOWN instructions per layer (H200: 132 SMs x 2 groups)
    # From expert_cap_tokens tokens a step (0: always) expert work items are at
    # most expert_cap_up / _down rows, so that the workers even out experts' unequal token
    # counts; below, items are sized so that the list is one round of the
    # workers (opspec.expert_items): capped, 5 experts hit made 320 items of
    # 64 rows for 264 workers, two rounds. H200, b898d7d, one run, capped / not:
    # expert_bench 5 hits x 1 token up 75.3 / 60.1 us, down 45.2 / 33.8; step
    # 1 x 8 16.65 / 15.64 ms, 16 x 1 26.09 / 25.48; but 32 x 1 34.48 / 35.55
    # (more experts a token's picks share: their unequal counts matter again).
    # The down list's cap is a pass of its shared tile, whose 128 rows take x
    # once (the up list's pass is 64 rows: two sets). H200, 57b00e9, two dynamic
    # rounds, down items of 128 / 64 rows: full-c32-t8 1422, 1430 / 1444, 1441
    # us; sliding-c32-t8 1020, 1023 / 1056, 1056; full-c16-t8 947, 957 / 970,
    # 959; sliding-c16-t8 751, 751 / 771, 771 (128 rows taken as two passes of
    # 64: full-c32-t8 1466, 1462, the others level with 64). The up list's at
    # 128 (de3ce21, before the early down list, two rounds, against 64): full-c32-t8 1481, 1476 / 1426,
    # 1425; sliding-c32-t8 1067, 1061 / 1030, 1038; sliding-c16-t8 767, 766 /
    # 756, 754; but full-c16-t8 949, 947 / 956, 962 and full-c32-t1 621, 621 /
    # 631, 631 (sliding-c32-t1 level).
    # Expert work items in a fixed round robin (worker w takes items w, w + W,
    # ...) when 1, instead of claimed from the list's counter: the static
    # schedule that the run-time claims are measured against (issue 6).
    expert_fixed: int = 0
    # The down list starts once the up list's items are all taken (a wait for 1
    # of its signals), each item first waiting for its own expert's up rows
    # (EXPERT_DOWN a5), so that the groups the up list's tail leaves idle take
    # down items of the experts already done; 0: it waits for the whole up list.
    down_early: int = 1
    expert_cap_tokens: int = 17
    expert_cap_up: int = EXPERT_CAP[Op.EXPERT_UP]
    expert_cap_down: int = EXPERT_CAP[Op.EXPERT_DOWN]
    # An expert of more than expert_heavy_up / _down tokens (0: none) gets items
    # of half its list's cap (EXPERT_UP / DOWN a6): an item takes a pass of the
    # shared tile per 32 tokens, so a heavy expert's items would end last.
    # With the early down list taking the groups the up list's tail leaves,
    # fewer, longer up items pay (x staged once for 128 rows): H100, cd28f14,
    # four rounds of one kernel, up items of 128 rows against 64: full-c16-t8
    # -2.4 to -3.5%, sliding-c16-t8 -3.1 to -4.1%, sliding-c32-t1 -0.9 to -2.0%,
    # full-c32-t1 -0.8%; steps 16x8 -2.9 to -3.3%, 32x1 -1.1 to -1.4%; but
    # full-c32-t8 +0.8 to +2.7%, sliding-c32-t8 +0.5 to +2.2%, where the
    # heaviest expert (126 tokens) had the longest items. Halving the items of
    # experts of more than 64 tokens took that back (H100, d618c49, two rounds
    # of one kernel against 128 rows up to 128 tokens and 64 above): full-c32-t8
    # -0.5%, sliding-c32-t8 -2.3%, step 32x8 -2.1%, the 128-token layers and
    # step 16x8 level (at 32 alike); heavy down lists too: full-c32-t8 +1.6%,
    # sliding-c32-t8 +0.9% (at 32 on both lists, H200, 3403ea3, then a build
    # switch: the skewed 256-token lists alone 17-27% faster, the layers level).
    expert_heavy_up: int = 64
    expert_heavy_down: int = 0
    rows: int = 1  # token rows per RMSNORM / RESIDUAL / EXPERT_COMBINE op (latency bound: one row each ran fastest)
    # A RESIDUAL row block is cut into residual_slices column ranges when all
    # the cuts of a layer point fit in residual_max_ops ops (else whole rows),
    # its norms taken from the sums that the GEMM producing a (Wo, Wex) leaves
    # per column tile (isa/gvm_isa.h, GEMM statistics); 1: whole rows, each op
    # taking both sums over the row itself (one group, a chain of round trips
    # at one token). H200, 7335486, 8 against 1: step 1x1 9.06 / 9.60 ms, 1x8
    # 17.71 / 18.12, 16x1 27.60 / 27.64, 32x1 39.56 / 39.77; RESIDUAL 3.3 us
    # against 8.0, Wo tiles 6.3 against 5.8 (their statistics).
    residual_slices: int = 8
    residual_max_ops: int = 264
    chunk: int = 1024  # cached keys per ATTN_CHUNK op of a full layer
    # A sliding layer's window goes in the shortest chunk of sliding_chunk x 2^k
    # (at most `chunk`) that keeps its ATTN_CHUNK ops within sliding_ops, so
    # that a few conversations spread their window over more SMs and many do
    # not pay for more merges (H200, 2b17060 and afe90f6, 128 keys against
    # 1024: sliding-c1-t8 295 / 343 us, c1-t1 232 / 244, c16-t1 497 / 500, but
    # c32-t1 663 / 619 with 1,088 ops). A full layer's 80K keys already fill
    # the SMs, and shorter chunks there only lengthen the merge (full-c32-t8
    # 3929 us at 512).
    sliding_chunk: int = 128
    sliding_ops: int = 512
    # A full layer's chunk doubles while it has more than full_ops ATTN_CHUNK ops:
    # with the ring-fed chunks a merge input costs more than a longer chunk.
    # H200, 046a761's device code, 2048 against 1024 keys: full-c32-t1 746 / 788
    # us, full-c32-t8 2183 / 2252, step 32 x 8 113.6 / 114.8 ms; but full-c1-t8
    # 296 / 287 and full-c16-t1 513 / 518 (so 32 conversations' 5,184 ops only).
    # With the warpgroup rounds (session 23, 28c12ae, one run), 2048 against 4096:
    # full-c16-t8 1007 / 1035 us (2,048-key chunks), full-c32-t8 1421 / 1440 and
    # full-c32-t1 724 / 731 (4,096), full-c16-t1 level; step 16 x 8 54.07 / 54.50 ms,
    # 32 x 8 71.52 / 71.88. One conversation (162 ops) keeps 1,024 keys: 2,048 there
    # ran full-c1-t8 273 against 268 us.
    full_ops: int = 2048
    # A layer with two waves of ATTN_CHUNK ops or more (expert_workers, one per
    # group) cuts the chunks of its last conversations in half, as many
    # conversations as it takes to cut attn_tail chunks (0: never). A block
    # claims its next instruction as it hands one out, and that claim waits
    # for its own groups while others idle: at the op's end such claims wait a
    # whole chunk (full-c16-t8, H200 trace, session 39: 27 of the last 30
    # chunks waited 42-47 us after their claim, 45 groups ran six chunks where
    # the host's lists ran five). Half chunks at the end halve that wait. H200,
    # b2ac5ed, sched_probe, 132 against 0, two rounds: full-c16-t8 930.9 / 946.0
    # and 928.5 / 939.0 us, full-c32-t8 1337.0 / 1383.4 and 1325.0 / 1384.5; one
    # round: step 32 x 8 68.88 / 69.60 ms, 16 x 8 50.15 / 50.26.
    attn_tail: int = 132
    # New tokens per QK_ROPE_KV op (0: a conversation's all). Its tokens run in
    # series, one global round trip each: at full-c16-t8 the 16 ops of 8 tokens
    # were a 22 us phase between Wqkvg and attention (H200 trace, session 39).
    qk_tokens: int = 1
    # Tokens of a conversation an ATTN_MERGE op takes (0: all of them). A merge
    # runs one warp a (token, head) pair, a warp's pairs in series, and the
    # merges of the conversation whose chunks end last are the layer's tail
    # after attention: 9.8 / 18.4 / 14.9 us at full-c32-t8 / full-c16-t8 /
    # full-c1-t8 in the H200 8dfffa7 traces, 8 pairs an op on 4 warps. 4 (one
    # pair a warp, twice the ops) measured level on an H100 (session 65: full-c32-t8
    # -0.4 / +0.1%, full-c1-t8 +0.5 / +1.1%, two rounds).
    merge_tokens: int = 0
    # Up to fuse_qk tokens a step (0: never) the attention chunks do QK-norm/RoPE
    # themselves (ATTN_CHUNK's fused form: q from qkvg, the chunk holding the new
    # positions writes their k and v) and the layer has no QK_ROPE_KV op: one
    # latency-bound instruction and a hop less on the one-token critical path.
    # H200, ecb28bb, 8 against 0: full-c1-t1 196.5 / 202.8 us, full-c1-t8 271.5 /
    # 289.8, step 1 x 1 8.91 / 9.11 ms, 1 x 8 16.83 / 17.26; at 16 tokens it lost
    # (full-c16-t1 545 / 535 us, step 16 x 1 27.7 / 27.4 ms): each of the more
    # chunks norms its rows again, and QK_ROPE_KV is no longer alone on the path.
    fuse_qk: int = 8
    # Up to g_late tokens a step (0: never) Wqkvg's g tiles (only the merges read
    # g) wait for the q|k|v tiles as well, so that those stream alone, and are
    # cut to fit beside the attention chunks instead of beside them. H200,
    # 4a9f33e, one build, two rounds, 8 / 0: full-c1-t1 174.6, 175.7 / 176.1, 175.8
    # us, sliding-c1-t1 175.6, 176.0 / 178.0, 175.4, full-c1-t8 234.7, 236.3 /
    # 237.0, 238.3; step 1x1 8360, 8386 / 8457, 8400, 1x8 13776, 13839 / 13843, 13852.
    g_late: int = 8
    # Late g tiles fill at most g_late_groups groups (0: every group the
    # attention chunks leave). They stream while the chunks run, and the
    # chunks' round trips slow down as HBM fills (a sliding one-token chunk
    # runs ~6 us alone, 13-15 in a step beside 128 g tiles: H200 step trace,
    # session 36): fewer, longer g tiles leave HBM less loaded. At sliding
    # one-conversation layers 64 groups (64 tiles of 256 KB) against the 232
    # the chunks leave (128 of 128 KB); full layers had 64 already. H200,
    # 583fe6b + this, four rounds, 64 / 0, us: sliding-c1-t8 273.2, 271.8,
    # 273.6, 274.4 / 279.3, 281.5, 279.6, 278.9; two rounds: sliding-c1-t1
    # 149.4, 151.2 / 152.0, 152.8; step 1x1 8322, 8409, 8228, 8208 / 8468,
    # 8402, 8288, 8322; 1x8 level (13.70 / 13.68 ms mean); g with q|k|v
    # (g_late 0) in between: sliding-c1-t8 274.9 mean, 1x1 8287, 1x8 13.70.
    # In a 16-layer 1x1 step trace (f6f3cff) the sliding chunks run 9.9-10.4
    # us (13.2-14.5 beside 128 tiles) and the g tiles now end ~2 us after
    # them; g not waiting for q|k|v (on the groups q|k|v leave) was level.
    g_late_groups: int = 64
    # 1: above g_late tokens, where Wqkvg's g tiles wait only for h, they are
    # ordered with its q|k|v tiles ("depth" order ranks ops by their path to the
    # layer's end, and g's, to the merges only, is two ops shorter than
    # QK_ROPE_KV's): at 256 tokens the 256 QK_ROPE_KV ops came first, were
    # claimed and parked, and the 64 g tiles started ~55 us late, in attention's
    # phase, ending just before the merges that wait for them (H200 traces of
    # sliding-c32-t8 and full-c32-t8, session 45). 0: depth order alone.
    g_early: int = 1
    # A staged bf16 GEMM without statistics (Wqkvg from gemm_span tokens: its
    # 64-row x 64-token tiles are few, 72 at 128 tokens, each ~49 us at ~21 GB/s
    # a group while the other groups idle) is cut over K into the most parts,
    # up to gemm_parts (a power of two), whose instructions fit the groups it
    # has beside the GEMMs running with it; the last part of a tile adds the
    # parts (isa/gvm_isa.h GEMM, K parts). 1: never.
    gemm_parts: int = 4
    # 1: the dense GEMM tiles carry GVM_FLAG_LAZY (a block that hands one out
    # claims its next instruction only while one of its groups is free); 2: the
    # router's and the squeeze's only (the phase the traces show late). A GEMM
    # phase is one wave of long tiles (gemm_fill), and a claim held behind two
    # busy groups starts a second tile on one block while another block's group
    # idles: the squeeze's tail, 29-35 us later than on the host's lists at
    # sliding-c16-t8 and full-c16-t8 (H200 traces, session 40). Every claim made
    # lazy (GVM_CLAIM_LAZY, branch lost/claim-lazy): sliding-c16-t8 723.2 /
    # 724.0 -> 703.6 / 701.8 us, but full-c32-t8 1328.1 / 1326.5 -> 1371.2 / 1366.0.
    # Session 41 (branch lost/lazy-gemm, a rule that cost the controller 0.087 us
    # a visit), 0 / 2: sliding-c16-t8 738.9, 728.7 / 714.7, 709.6; full-c16-t8
    # 937.0, 934.4 / 919.8, 918.8; full-c32-t8 1351.1, 1344.1 / 1352.7, 1351.2;
    # step 16x8 50.26, 50.48 / 49.46, 49.77 ms, 32x8 69.00, 69.09 / 69.82, 69.52.
    # Session 42 (f93b44f, the rule at 0.027 us a dispatch), two rounds, 0 / 2:
    # sliding-c16-t8 726.6, 729.5 / 708.7, 705.1; full-c16-t8 937.0, 931.3 / 911.7,
    # 914.6; full-c32-t8 1337.0, 1340.5 / 1348.2, 1347.2; sliding-c32-t8 938.0, 935.1
    # / 939.0, 955.0; full-c16-t1, sliding-c1-t1 level; step 16x8 49.82, 49.70 /
    # 49.11, 49.21 ms, 32x8 68.79, 68.95 / 69.23, 69.39: 2.3-2.9% at 128 tokens
    # (static: 699, 909 us in the README's table), 0.6-1% at 256, where dynamic
    # still leads static by 3%.
    lazy_gemm: int = 2
    # With lazy_gemm 2, up to lazy_gemm_tokens tokens a step (0: never) every
    # dense GEMM tile is lazy: traced 8-layer steps (H100, d618c49) showed one
    # block holding a claim on a one-wave phase's last tile behind its two busy
    # groups while other blocks ran one (1 x 8: Wo in two layers of eight, ~7 us
    # late each; 16 x 1: Wqkvg once, 26 us). H100, 182e8dc, one
    # kernel, two rounds, 2 / every GEMM lazy: step 1x8 14898, 14869 / 14818,
    # 14706 us; 16x1 23920, 23992 / 23615, 23698; 1x1 9492, 9351 / 9319, 9421;
    # 32x1 31450, 31783 / 31753, 31390; full-c1-t1, sliding-c1-t8, full-c16-t1
    # within 0.4% (session 45, H200, at one conversation: 1x8 -1.3%, 1x1 +0.7%).
    lazy_gemm_tokens: int = 16
    # The last lazy_attn ATTN_CHUNK ops of a layer carry GVM_FLAG_LAZY (0: none):
    # attention's last wave, whose claims otherwise wait behind two busy groups
    # while other blocks' groups idle (the held claims of `gpuvm trace`). H200,
    # 43c869c, two rounds, 0 / 264: full-c32-t8 1350.6, 1350.4 / 1329.3, 1333.7 us,
    # full-c16-t8 908.3, 913.3 / 915.0, 913.4, sliding-c16-t8 and -c32-t8 level,
    # steps 16x8 and 32x8 level; every chunk lazy: full-c16-t8 932-935, full-c32-t8
    # 1373-1390 (each hand-off of a full block waits for its claim). Off.
    lazy_attn: int = 0
    # 1: a layer whose ATTN_CHUNK ops are one wave (at most expert_workers, one
    # per group: one conversation) has every chunk lazy, so that no block holds
    # a chunk claimed behind two busy groups: the code warmer's attention
    # instance runs ~30 us cold, and a chunk its block claimed ran 14 us after
    # the others (full-c1-t1 trace, session 45). H200, 591f88c, two rounds,
    # none / all, us: full-c1-t1 181.3, 180.5 / 180.5, 178.5; full-c1-t8 253.0,
    # 248.4 / 247.1, 245.3; sliding-c1-t1 and -c1-t8 level; step 1x1 8389, 8426
    # / 8356, 8338; 1x8 13852, 13683 / 13894, 13744.
    lazy_attn_wave: int = 1
    # 1: the expert lists' workers carry GVM_FLAG_LAZY, so that a block running
    # two claims no third worker to hold while another block's group idles
    # through the list (the sliding-c16-t8 trace: the up list 9 us longer than on
    # the host's lists). H200, 7a34871, two rounds in swapped order, 0 / 1, us:
    # sliding-c16-t8 847.9, 841.0 / 834.4, 834.2; full-c16-t8 1020.6, 1019.0 /
    # 1015.4, 1019.0; full-c32-t8 1532.8, 1525.3 / 1513.1, 1517.7; sliding-c32-t8
    # 1183.8, 1183.9 / 1162.0, 1166.3; full-c1-t8 251.3, 247.6 / 247.9, 247.2;
    # full-c32-t1 658.6, 657.2 / 656.1, 654.7; step 16x8 49.22, 49.28 / 48.95,
    # 49.10 ms, 32x8 69.38, 69.29 / 68.65, 68.62.
    lazy_experts: int = 1
    # Up to code_warm tokens a step (0: never) a one-layer program also holds
    # the code warmer: one lead instance of each op of a small layer on the same
    # paths, which fetch every op's code into L2 at launch, ahead of the real
    # layer (gpuvm/muse/code_warm.py); under gemm_span (the small layer takes
    # the real one's paths only below it). Steps: no effect (a step's later
    # layers find the code in L2). H200, d62979b, L2 flushed, dynamic, 0 / 32:
    # full-c1-t1 193.5 / 180.3 us, sliding-c1-t1 168.3 / 150.2, full-c1-t8 267.7
    # / 251.3, sliding-c1-t8 297.0 / 274.1, full-c16-t1 587.4 / 549.6,
    # sliding-c16-t1 466.3 / 440.2, full-c32-t1 674.5 / 657.0, sliding-c32-t1
    # 507.5 / 495.3 (tools/code_warm_probe.py, two rounds each).
    code_warm: int = 32

    def __post_init__(self) -> None:
        if not isinstance(self.gemm_fill, int) or self.gemm_fill < 0:
            raise ProgramError(f"Tiles.gemm_fill must be an int >= 0, not {self.gemm_fill!r}")
        if self.gemm_min_bytes > self.gemm_max_bytes:
            raise ProgramError(f"Tiles.gemm_min_bytes {self.gemm_min_bytes} exceeds gemm_max_bytes {self.gemm_max_bytes}")
        for name in ("lazy_experts", "lazy_attn_wave", "g_early", "topk_late", "down_early"):
            if getattr(self, name) not in (0, 1):
                raise ProgramError(f"Tiles.{name} must be 0 or 1, not {getattr(self, name)!r}")
        if self.expert_fixed not in (0, 1):
            raise ProgramError(f"Tiles.expert_fixed must be 0 or 1, not {self.expert_fixed!r}")
        if self.lazy_gemm not in (0, 1, 2):
            raise ProgramError(f"Tiles.lazy_gemm must be 0, 1 or 2, not {self.lazy_gemm!r}")
        for name in ("router_span", "topk_span", "expert_cap_tokens", "expert_heavy_up", "expert_heavy_down", "lazy_gemm_tokens", "g_late", "g_late_groups", "attn_tail", "qk_tokens", "merge_tokens", "lazy_attn", "code_warm"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0:
                raise ProgramError(f"Tiles.{name} must be an int >= 0, not {v!r}")
        if not isinstance(self.fuse_qk, int) or self.fuse_qk < 0:
            raise ProgramError(f"Tiles.fuse_qk must be an int >= 0, not {self.fuse_qk!r}")
        if self.gemm_parts < 1 or self.gemm_parts > GEMM_MAX_PARTS or self.gemm_parts & (self.gemm_parts - 1):
            raise ProgramError(f"Tiles.gemm_parts must be a power of two from 1 to {GEMM_MAX_PARTS}, not {self.gemm_parts!r}")
        for name in ("gemm_bytes", "gemm_min_bytes", "gemm_max_bytes", "gemm_tail", "gemm_span", "router_ops", "router_bytes", "topk_tokens", "router_splits", "expert_workers", "expert_cap_up", "expert_cap_down", "rows", "residual_slices", "residual_max_ops", "chunk", "sliding_chunk", "sliding_ops", "full_ops"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise ProgramError(f"Tiles.{name} must be a positive int, not {v!r}")
        if self.code_warm >= self.gemm_span:
            raise ProgramError(f"Tiles.code_warm ({self.code_warm}) must be under gemm_span ({self.gemm_span}): the small layer takes the real one's GEMM paths only below it")
        for name in ("expert_cap_up", "expert_cap_down"):
            if getattr(self, name) % NVFP4_TILE_ROWS:
                raise ProgramError(f"Tiles.{name} must be a multiple of {NVFP4_TILE_ROWS} (items start on a tiled block), not {getattr(self, name)}")

    @classmethod
    def parse(cls, spec: str) -> "Tiles":
        """Tiles from `field=value[+field=value]` (integers; '' gives the
        defaults), as the tools take them on their command lines."""
        names = {f.name for f in dataclass_fields(cls)}
        kw: dict[str, int] = {}
        for part in (p for p in spec.split("+") if p):
            name, sep, value = part.partition("=")
            if not sep or name not in names:
                raise ProgramError(f"tiling {spec!r}: {part!r} is not FIELD=VALUE of a Tiles field")
            try:
                kw[name] = int(value)
            except ValueError:
                raise ProgramError(f"tiling {spec!r}: {value!r} is not an integer") from None
        return cls(**kw)

    def for_warm(self, tokens: int, warm_tokens: int) -> "Tiles":
        """The small warm layer's tiling (code_warm.py): every token threshold set
        so that warm_tokens take the op paths that `tokens` take here, with few
        row ops and list workers (its phases are short either way)."""
        def from_(x: int) -> int:  # on for T >= x (0: never)
            return 1 if x and tokens >= x else 0

        def upto(x: int) -> int:  # on for T <= x (0: never)
            return warm_tokens if x and tokens <= x else 0

        cap = 0 if not self.expert_cap_tokens or tokens >= self.expert_cap_tokens else warm_tokens + 1
        return replace(self, router_span=from_(self.router_span), topk_span=from_(self.topk_span), expert_cap_tokens=cap,
                       fuse_qk=upto(self.fuse_qk), g_late=upto(self.g_late), lazy_gemm_tokens=upto(self.lazy_gemm_tokens), expert_workers=8, residual_slices=1,
                       lazy_attn=0, attn_tail=0, code_warm=0)

    def residual_cols(self, d: int, row_blocks: int) -> list[tuple[int, int]]:
        """Column ranges [c0, c0 + n) of a RESIDUAL row (multiples of 4); one
        range (0, 0), the whole row, when it is not cut."""
        k = min(self.residual_slices, max(1, d // 4))
        if k <= 1 or k * row_blocks > self.residual_max_ops:
            return [(0, 0)]
        return _tiles(0, d, -(-d // (4 * k)) * 4)

    def chunk_of(self, cfg: MuseConfig, kind: str, conversations: int, tokens_each: int, cache_slots: int) -> int:
        """Cached keys per ATTN_CHUNK op of a layer of this kind and shape (see sliding_chunk)."""
        if kind != "sliding":
            chunk = self.chunk
            while (n := n_chunks(cfg, kind, tokens_each, cache_slots, chunk)) > 1 and conversations * cfg.heads_kv * n > self.full_ops:
                chunk *= 2
            return chunk
        chunk = min(self.sliding_chunk, self.chunk)
        while chunk < self.chunk and conversations * cfg.heads_kv * n_chunks(cfg, kind, tokens_each, cache_slots, chunk) > self.sliding_ops:
            chunk *= 2
        return min(chunk, self.chunk)

    def tail_convs(self, conversations: int, heads_kv: int, chunks: int, chunk: int) -> int:
        """How many of the last conversations get chunks of chunk // 2 keys (see attn_tail)."""
        if self.attn_tail <= 0 or chunk < 2 or conversations * heads_kv * chunks < 2 * self.expert_workers:
            return 0
        return min(conversations - 1, -(-self.attn_tail // (heads_kv * chunks)))


@dataclass
class LayerHandles:
    """What a caller needs from an emitted layer: its done counter and tensors by role."""

    done: Counter
    tensors: dict[str, TensorSpec] = field(default_factory=dict)

    def __getitem__(self, role: str) -> TensorSpec:
        return self.tensors[role]


@dataclass
class LayerProgram:
    """A one-layer program, built."""

    cfg: MuseConfig
    kind: str
    conversations: int
    tokens_each: int
    cache_slots: int
    k_scale: float
    v_scale: float
    program: Program
    stream: Stream
    handles: LayerHandles
    prefix: str = "L0."
    warm: bool = False  # the program starts with the code warmer's lead instances (Tiles.code_warm)

    @property
    def tokens(self) -> int:
        return self.conversations * self.tokens_each


def n_chunks(cfg: MuseConfig, kind: str, tokens_each: int, cache_slots: int, chunk: int) -> int:
    """Attention chunks per (conversation, kv head): full layers cover the whole
    cache, sliding layers the window plus the new tokens."""
    keys = cache_slots if kind == "full" else cfg.window + tokens_each - 1
    return -(-keys // chunk)


F32_SPAN_ROWS = 32  # rows of an f32 GEMM tile cut over tokens: one pass of the device's staged f32 path
F32_PART_K = 32  # a K part of the staged f32 path: whole stages of 32 k


def _pow2_rows(n_rows: int, row_bytes: int, target: int) -> int:
    """Rows per column tile: the largest power of two whose weights fit target."""
    fit = max(1, target // max(1, row_bytes))
    return min(n_rows, 1 << (fit.bit_length() - 1))


def _fewest_rows(n_rows: int, groups: int, rows: int = 1, spans: int = 1) -> int:
    """The fewest rows, rows x 2^k, whose tiles (times spans) number at most
    groups, or rows x 2^k past n_rows: one tile."""
    while rows < n_rows and -(-n_rows // rows) * spans > groups:
        rows *= 2
    return rows


def _fill_rows(n_rows: int, row_bytes: int, groups: int, lo_bytes: int, hi_bytes: int) -> int:
    """Rows per column tile: the fewest 2^k rows whose tiles number at most
    groups, kept within [lo_bytes, hi_bytes] of weights (Tiles.gemm_fill)."""
    rows = _fewest_rows(n_rows, groups)
    return min(max(rows, _pow2_rows(n_rows, row_bytes, lo_bytes)), _pow2_rows(n_rows, row_bytes, hi_bytes))


def _span_rows(n_rows: int, spans: int, groups: int, lo_rows: int = 64) -> int:
    """Rows per tile of a GEMM cut over tokens too: the fewest 2^k rows, at
    least lo_rows (a pass of the staged-x path), whose tiles times spans number
    at most groups."""
    return min(_fewest_rows(n_rows, groups, lo_rows, spans), n_rows)


def _tiles(n0: int, n1: int, width: int) -> list[tuple[int, int]]:
    return [(a, min(width, n1 - a)) for a in range(n0, n1, width)]


def _split_tail(tiles: list[tuple[int, int]], groups: int, parts: int) -> list[tuple[int, int]]:
    """The tiles of the last, partial wave over `groups` cut into `parts` each
    (in order, after the full waves'); with no partial wave, unchanged."""
    full = groups * (len(tiles) // groups)
    if parts <= 1 or full in (0, len(tiles)):
        return tiles
    cut = [piece for c0, n in tiles[full:] for piece in _tiles(c0, c0 + n, -(-n // parts))]
    return tiles[:full] + cut


def _check_shape(cfg: MuseConfig, kind: str, conversations: int, tokens_each: int, cache_slots: int) -> None:
    if kind not in KINDS:
        raise ProgramError(f"layer kind must be one of {KINDS}, not {kind!r}")
    for name, v in (("conversations", conversations), ("tokens_each", tokens_each), ("cache_slots", cache_slots)):
        if not isinstance(v, int) or v <= 0:
            raise ProgramError(f"{name} must be a positive int, not {v!r}")
    if cache_slots < tokens_each:
        raise ProgramError(f"cache_slots {cache_slots} cannot hold the {tokens_each} new tokens of a step")
    if cfg.head_dim != HEAD_DIM or cfg.heads_q % cfg.heads_kv:
        raise ProgramError(f"config '{cfg.name}': head dim must be {HEAD_DIM} and heads_q a multiple of heads_kv")
    if cfg.local_experts > cfg.n_experts or cfg.squeeze % 32 or cfg.expert_inter % 32:
        raise ProgramError(f"config '{cfg.name}': local experts and expert widths (multiples of 32) do not fit")


#: gpuvm dtype of each torch dtype of LayerWeights (its uint8 fields hold packed e2m1 codes)
_WEIGHT_DTYPES = {torch.float32: DType.F32, torch.bfloat16: DType.BF16, torch.float8_e4m3fn: DType.E4M3, torch.uint8: DType.E2M1X2}


def _weight_specs(cfg: MuseConfig) -> dict[str, tuple[tuple[int, ...], DType]]:
    """LayerWeights fields that are tensors: shape and gpuvm dtype (from weights.layer_shapes)."""
    return {name: (shape, _WEIGHT_DTYPES[dt]) for name, (shape, dt) in layer_shapes(cfg).items()}


def emit_layer(
    p: Program,
    cfg: MuseConfig,
    kind: str,
    conversations: int,
    tokens_each: int,
    cache_slots: int,
    *,
    prefix: str,
    s: TensorSpec,
    convs: TensorSpec,
    after: Counter | None = None,
    next_norm: TensorSpec | None = None,
    tiles: Tiles | None = None,
    h: TensorSpec | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> LayerHandles:
    """Append one decode layer to p; see the module docstring.

    after: counter whose every signaller must finish before the layer starts.
    next_norm: the next layer's norm weight [d]; the layer's last RESIDUAL then
      also writes rms(s) * (1 + next_norm) as bf16 to f"{prefix}next_h"
      (handles["next_h"]), which the next layer takes as `h`.
    h: the layer's normed input [T, d] bf16, already written by `after`'s
      signallers; the layer then has no RMSNORM of its own (nor w_attn).
    """
    _check_shape(cfg, kind, conversations, tokens_each, cache_slots)
    tl = tiles or Tiles()
    C, T, S = conversations, conversations * tokens_each, cache_slots
    d, hq, hkv, H, I, E = cfg.d, cfg.heads_q, cfg.heads_kv, cfg.squeeze, cfg.expert_inter, cfg.local_experts
    if s.shape != (T, d) or s.dtype != DType.F32:
        raise ProgramError(f"s '{s.name}' is {s.shape} {s.dtype.name}, the layer needs ({T}, {d}) F32")
    if convs.shape != (C, 4) or convs.dtype != DType.I32:
        raise ProgramError(f"convs '{convs.name}' is {convs.shape} {convs.dtype.name}, the layer needs ({C}, 4) I32")
    if h is not None and (h.shape != (T, d) or h.dtype != DType.BF16):
        raise ProgramError(f"h '{h.name}' is {h.shape} {h.dtype.name}, the layer needs ({T}, {d}) BF16")
    own_norm = h is None
    if not own_norm and after is None:
        raise ProgramError("a layer given h must also be given `after`, the counter of the ops that write it")
    sliding = kind == "sliding"
    chunk = tl.chunk_of(cfg, kind, C, tokens_each, S)
    nch = n_chunks(cfg, kind, tokens_each, cache_slots, chunk)
    tail = tl.tail_convs(C, hkv, nch, chunk)
    conv_chunks = [(chunk, nch)] * (C - tail) + [(chunk // 2, n_chunks(cfg, kind, tokens_each, cache_slots, chunk // 2))] * tail
    nch = max(n for _, n in conv_chunks)  # chunk slots of the partials
    fk, fv = f2i(k_scale), f2i(v_scale)

    ts: dict[str, TensorSpec] = {}

    def act(role: str, shape: tuple[int, ...], dt: DType, r: str = "activation") -> TensorSpec:
        ts[role] = p.tensor(prefix + role, shape, dt, r)
        return ts[role]

    for name, (shape, dt) in _weight_specs(cfg).items():
        if name == "w_attn" and not own_norm:
            continue
        ts[name] = p.tensor(prefix + name, shape, dt, "weight")
    ts["s"], ts["convs"] = s, convs
    if h is None:
        h = act("h", (T, d), DType.BF16)
    ts["h"] = h
    qkvg = act("qkvg", (T, cfg.qkvg_width), DType.BF16)
    fuse_qk = T <= tl.fuse_qk
    q = None if fuse_qk else act("q", (T, hq, HEAD_DIM), DType.BF16)
    kc = act("k_cache", (C, S, hkv, HEAD_DIM), DType.E4M3, "state")
    vc = act("v_cache", (C, S, hkv, HEAD_DIM), DType.E4M3, "state")
    part_o = act("part_o", (T, hq, nch, HEAD_DIM), DType.F32)
    part_ml = act("part_ml", (T, hq, nch, 2), DType.F32)
    o = act("o", (T, hq * HEAD_DIM), DType.BF16)
    a = act("a", (T, d), DType.F32)
    h2 = act("h2", (T, d), DType.F32)
    h2b = act("h2_bf16", (T, d), DType.BF16)
    scores = act("scores", (T, cfg.n_experts), DType.F32)
    # the lists' state: a worker that finds its list done reads meta and takes from work after the list's consumers ran
    meta = act("route_meta", (2, E), DType.I32, "list")
    route = act("route", (5, cfg.top_k * T), DType.I32)
    x = act("x", (T, H), DType.BF16)
    hbuf = act("hbuf", (cfg.top_k * T, I), DType.BF16)
    y = act("y", (cfg.top_k * T, H), DType.F32)
    fsq = act("fsq", (T, H), DType.BF16)
    f = act("f", (T, d), DType.F32)
    next_h = act("next_h", (T, d), DType.BF16) if next_norm is not None else None
    w = ts  # weights by field name

    def ctr(name: str) -> Counter:
        return p.counter(prefix + name)

    def gemm_plan(wt: TensorSpec, n0: int, n1: int, tile_bytes: int = 0, token_splits: int = 1, beside: int = 0) -> tuple[int, list[tuple[int, int]]]:
        """Rows per column tile of wt over [n0, n1) and the token spans of each
        (tile_bytes: a fixed size; beside: tiles of another GEMM that run at the same time)."""
        spans = [(0, 0)] if token_splits == 1 or T == 1 else _tiles(0, T, -(-T // token_splits))
        start = tl.router_span if wt.dtype == DType.F32 else tl.gemm_span
        if tl.gemm_fill and start and T >= start:  # staged on the device: spans x 64+ bf16 rows, or 32 f32 rows (a pass)
            spans = _tiles(0, T, tl.gemm_span)
            rows = min(n1 - n0, F32_SPAN_ROWS) if wt.dtype == DType.F32 else _span_rows(n1 - n0, len(spans), max(1, tl.gemm_fill - beside))
        elif tile_bytes:
            rows = _pow2_rows(n1 - n0, wt.row_bytes, tile_bytes)
        elif tl.gemm_fill:
            rows = _fill_rows(n1 - n0, wt.row_bytes, max(1, tl.gemm_fill - beside), tl.gemm_min_bytes, tl.gemm_max_bytes)
        else:
            rows = _pow2_rows(n1 - n0, wt.row_bytes, tl.gemm_bytes)
        return rows, spans

    all_lazy = tl.lazy_gemm == 1 or (tl.lazy_gemm == 2 and 0 < T <= tl.lazy_gemm_tokens)

    def gemm(out: TensorSpec, xin: TensorSpec, wt: TensorSpec, n0: int, n1: int, waits: list[Counter], sig: Counter, tag: str,
             tile_bytes: int = 0, token_splits: int = 1, beside: int = 0, stats: list[TensorSpec] | None = None,
             parts: tuple[TensorSpec, TensorSpec, int] | None = None, order_with: Instr | None = None, parts_beside: int = 0) -> int:
        """Column tiles of wt over [n0, n1) (see gemm_plan), each over all T
        tokens (args t0 = t = 0) or over token ranges; with stats ([stats, s,
        alpha, beta]) column tile i also leaves its residual statistics in
        slot i; with parts ((parts, tickets, P): the router's) tile m is cut
        into P K parts, counted on ticket m (a staged bf16 GEMM without stats
        gets its own, Tiles.gemm_parts: fitted to the groups less beside and
        parts_beside); order_with: Program.op's, for every tile. Returns how
        many instructions."""
        rows, spans = gemm_plan(wt, n0, n1, tile_bytes, token_splits, beside)
        tiles = _tiles(n0, n1, rows)
        if (parts is None and not stats and wt.dtype == DType.BF16 and spans != [(0, 0)] and tl.gemm_parts > 1
                and min(tn for _, tn in spans) >= GEMM_STAGED_TOKENS):
            n_tiles, k, P = len(tiles) * len(spans), wt.shape[1], 1
            while P * 2 <= tl.gemm_parts and n_tiles * P * 2 <= tl.gemm_fill - beside - parts_beside and k % (P * 2 * GEMM_BF16_PART_K) == 0:
                P *= 2
            if P > 1:
                parts = (act(f"{tag}_parts_{n0}", (T, P * wt.shape[0]), DType.F32), act(f"{tag}_tickets_{n0}", (n_tiles,), DType.I32, "ticket"), P)
        n_parts = parts[2] if parts else 1
        kp = wt.shape[1] // n_parts
        es = wt.row_bytes // wt.shape[1]
        if tl.gemm_fill and not tile_bytes and spans == [(0, 0)] and not stats and not parts:
            tiles = _split_tail(tiles, max(1, tl.gemm_fill - beside), tl.gemm_tail)
        for m, ((c0, n), (t0, tn)) in enumerate(itertools.product(tiles, spans)):
            for j in range(n_parts):
                where = f"{c0}:{c0 + n}" + (f"|t{t0}:{t0 + tn}" if tn else "") + (f"|k{j * kp}:{(j + 1) * kp}" if parts else "")
                if parts:  # the part's bytes of the tile's first row (its rows are not contiguous)
                    tensors, args, fetch = [out, xin, wt, *parts[:2]], [c0, n, t0, tn, 0, n_parts, j, m], (wt, c0 * wt.row_bytes + j * kp * es, kp * es)
                else:
                    tensors, args, fetch = [out, xin, wt, *(stats or [])], [c0, n, t0, tn] + ([m // len(spans)] if stats else []), (wt, c0 * wt.row_bytes, n * wt.row_bytes)
                p.op(Op.GEMM, tensors, args, waits=waits, signal=sig, prefetch=fetch, label=f"{prefix}{tag}[{where}]",
                     lazy=all_lazy or (tl.lazy_gemm == 2 and tag in ("Wr", "Wsq")), order_with=order_with)
        return len(tiles) * len(spans) * n_parts

    row_blocks = _tiles(0, T, tl.rows)
    res_cols = tl.residual_cols(d, len(row_blocks))

    def residual_stats(role: str, wt: TensorSpec, alpha: TensorSpec, beta: TensorSpec) -> list[TensorSpec] | None:
        """The GEMM statistics tensors of a RESIDUAL cut over columns (None: whole rows)."""
        if res_cols == [(0, 0)]:
            return None
        rows, _ = gemm_plan(wt, 0, d)
        return [act(role, (T, -(-d // rows), 4), DType.F32), s, alpha, beta]

    def residual(slots: list[TensorSpec | None], stats: list[TensorSpec] | None, waits: list[Counter], sig: Counter, tag: str) -> None:
        """RESIDUAL ops of every row block, each cut into the column ranges when stats come with them."""
        for (r0, n), (c0, cn) in itertools.product(row_blocks, res_cols):
            where = f"{r0}:{r0 + n}" + (f"|c{c0}:{c0 + cn}" if cn else "")
            tail = [None] * (7 - len(slots)) + [stats[0]] if stats else []
            p.op(Op.RESIDUAL, [*slots, *tail], [r0, n, c0, cn], waits=waits, signal=sig, label=f"{prefix}{tag}[{where}]")

    start = [after] if after is not None else []

    # attention
    if own_norm:
        normed = ctr("h")
        for r0, n in row_blocks:
            p.op(Op.RMSNORM, [h, s, w["w_attn"]], [r0, n], waits=start, signal=normed, label=f"{prefix}rmsnorm[{r0}:{r0 + n}]")
        h_ready = [normed]
    else:
        h_ready = start
    qkv_done, g_done = ctr("qkv"), ctr("g")
    qkv_cols = (hq + 2 * hkv) * HEAD_DIM
    late = T <= tl.g_late  # g after the q|k|v tiles, beside the attention chunks (an op of its own: it waits on Wqkvg's)
    g_rows, g_spans = gemm_plan(w["Wqkvg"], qkv_cols, cfg.qkvg_width)
    n_g = 0 if late else len(_tiles(qkv_cols, cfg.qkvg_width, g_rows)) * len(g_spans)  # g's tiles beside q|k|v's, before K parts
    n_qkv = gemm(qkvg, h, w["Wqkvg"], 0, qkv_cols, h_ready, qkv_done, "Wqkvg", parts_beside=n_g)
    n_chunk_ops = hkv * sum(n for _, n in conv_chunks)  # the layer's ATTN_CHUNK ops
    first_qkv = p.instrs[-n_qkv]
    # late g fills the groups the chunks leave, at most g_late_groups of them
    g_groups = min(tl.gemm_fill - n_chunk_ops, tl.g_late_groups or tl.gemm_fill)
    gemm(qkvg, h, w["Wqkvg"], qkv_cols, cfg.qkvg_width, h_ready + [qkv_done] if late else h_ready, g_done, "Wg" if late else "Wqkvg",
         beside=tl.gemm_fill - g_groups if late else n_qkv, order_with=first_qkv if tl.g_early and not late else None)
    merged = ctr("o")
    # a merge is latency bound, one warp per (token, head): few pairs per
    # instruction, spread over SMs (two heads keep a one-token merge to one batch)
    merge_heads = 2 if tokens_each == 1 and hq % 2 == 0 else 1
    window = cfg.window if sliding else 0
    one_wave = tl.lazy_attn_wave and n_chunk_ops <= tl.expert_workers
    lazy_from = 0 if one_wave else n_chunk_ops - tl.lazy_attn  # the first chunk (in emission order) that is lazy
    k = 0
    for c, (clen, cn) in enumerate(conv_chunks):
        attn_c = ctr(f"attn{c}")
        if fuse_qk:
            chunk_in, chunk_args, chunk_waits = [qkvg, kc, vc, convs, part_o, part_ml, w["w_qn"], w["w_kn"]], [int(sliding)], [qkv_done]
        else:
            kv_c = ctr(f"kv{c}")
            for j0, jn in _tiles(0, tokens_each, tl.qk_tokens or tokens_each):
                p.op(Op.QK_ROPE_KV, [qkvg, q, w["w_qn"], w["w_kn"], kc, vc, convs], [c, int(sliding), fk, fv, j0, jn], waits=[qkv_done],
                     signal=kv_c, label=f"{prefix}qk_rope_kv[{c},{j0}]")
            chunk_in, chunk_args, chunk_waits = [q, kc, vc, convs, part_o, part_ml], [], [kv_c]
        for hh in range(hkv):
            for j in range(cn):
                p.op(Op.ATTN_CHUNK, chunk_in, [c, hh, j, clen, window, fk, fv, *chunk_args], waits=chunk_waits, signal=attn_c, label=f"{prefix}attn[{c},{hh},{j}]",
                     lazy=k >= lazy_from)
                k += 1
        for h0 in range(0, hq, merge_heads):
            for j0, jn in _tiles(0, tokens_each, tl.merge_tokens or tokens_each):
                where = f"{c},{h0}" + (f"|t{j0}" if jn < tokens_each else "")
                p.op(Op.ATTN_MERGE, [o, part_o, part_ml, qkvg], [c * tokens_each + j0, jn, h0, merge_heads, cn], waits=[attn_c, g_done], signal=merged, label=f"{prefix}attn_merge[{where}]")
    wo_done = ctr("a")
    a_stats = residual_stats("a_stats", w["Wo"], w["alpha1"], w["beta1"])
    gemm(a, o, w["Wo"], 0, d, [merged], wo_done, "Wo", stats=a_stats)
    res1 = ctr("h2")
    residual([s, a, w["alpha1"], w["beta1"], w["w_moe"], h2, h2b], a_stats, [wo_done], res1, "residual1")

    def router(waits: list[Counter], sig: Counter) -> int:
        """The f32 router's GEMM; its staged tiles cut over K (Tiles.router_ops).
        Returns how many instructions."""
        wr, ne, k = w["Wr"], cfg.n_experts, d
        rows, spans = gemm_plan(wr, 0, ne, tl.router_bytes, tl.router_splits)
        n_tiles = -(-ne // rows) * len(spans)
        n_parts = 1
        if tl.router_span and T >= tl.router_span:
            while (n_parts * 2 <= GEMM_MAX_PARTS and n_tiles * n_parts * 2 <= tl.router_ops
                   and k % (n_parts * 2 * F32_PART_K) == 0):
                n_parts *= 2
        parts = None
        if n_parts > 1:
            parts = (act("score_parts", (T, n_parts * ne), DType.F32), act("score_tickets", (n_tiles,), DType.I32, "ticket"), n_parts)
        return gemm(scores, h2, wr, 0, ne, waits, sig, "Wr", tl.router_bytes, tl.router_splits, parts=parts)

    # mixture of experts
    scored, routed, squeezed = ctr("scores"), ctr("route"), ctr("x")
    n_router = router([res1], scored)
    n_squeeze = gemm(x, h2b, w["Wsq"], 0, H, [res1], squeezed, "Wsq", beside=n_router)
    last_squeeze = p.instrs[-1]
    work = act("work", (2, WORK_COLUMNS_BY_EXPERT), DType.I32, "list")  # the expert lists' (taken, done, rows by expert) counters (TOPK zeroes them)
    # the picks wait for the whole router; claimed before the squeeze's tiles
    # (Program.build's order), they hold groups those tiles need. With
    # Tiles.topk_late (the default) topk_tokens each, all but the first free - 1
    # ranked behind the squeeze; without it, as few as fit the groups the two leave
    free = tl.gemm_fill - n_router - n_squeeze - 1
    if tl.topk_span and T >= tl.topk_span and (free > 1 or tl.topk_late):  # the picks over token ranges, then the table
        picked = ctr("picks")
        span = tl.topk_tokens if tl.topk_late else max(tl.topk_tokens, -(-T // (4 * free)) * 4)
        for k, (t0, tn) in enumerate(_tiles(0, T, span)):
            p.op(Op.TOPK, [scores, meta, route], [0, E, 1, t0, tn], waits=[scored], signal=picked, label=f"{prefix}topk_pick[{t0}:{t0 + tn}]",
                 order_after=last_squeeze if tl.topk_late and k >= free - 1 else None)
        p.op(Op.TOPK, [scores, meta, route, work], [0, E, 2], waits=[picked], signal=routed, label=f"{prefix}topk")
    else:
        p.op(Op.TOPK, [scores, meta, route, work], [0, E], waits=[scored], signal=routed, label=f"{prefix}topk")
    # work lists: which experts have tokens is known only on the GPU; workers
    # take items from a counter (ops/experts.cuh)
    up_grain, down_grain = EXPERT_GRAIN[Op.EXPERT_UP], EXPERT_GRAIN[Op.EXPERT_DOWN]
    capped = not tl.expert_cap_tokens or T >= tl.expert_cap_tokens
    up_cap, down_cap = (tl.expert_cap_up, tl.expert_cap_down) if capped else (I, H)
    up_done, down_done = ctr("hbuf"), ctr("y")
    up_workers = min(tl.expert_workers, E * -(-I // up_grain))
    for wk in range(up_workers):
        p.op(Op.EXPERT_UP, [hbuf, x, w["gu_codes"], w["gu_scales"], w["gu_ts"], meta, route, work], [0, up_workers, up_grain, up_cap, wk + 1 if tl.expert_fixed else 0, 0, tl.expert_heavy_up], waits=[routed, squeezed], signal=up_done, label=f"{prefix}expert_up[{wk}/{up_workers}]", lazy=bool(tl.lazy_experts))
    down_workers = min(tl.expert_workers, E * -(-H // down_grain))
    early = bool(tl.down_early and not tl.expert_fixed)  # fixed up workers may not have started: their items are not held
    for wk in range(down_workers):
        p.op(Op.EXPERT_DOWN, [y, hbuf, w["d_codes"], w["d_scales"], w["d_ts"], meta, route, work], [1, down_workers, down_grain, down_cap, wk + 1 if tl.expert_fixed else 0, 1 if early else 0, tl.expert_heavy_down],
             waits=[(up_done, 1) if early else up_done], signal=down_done, label=f"{prefix}expert_down[{wk}/{down_workers}]", lazy=bool(tl.lazy_experts))
    combined = ctr("fsq")
    for r0, n in _tiles(0, T, tl.rows):
        p.op(Op.EXPERT_COMBINE, [fsq, y, route], [r0, n], waits=[down_done], signal=combined, label=f"{prefix}expert_combine[{r0}:{r0 + n}]")
    ex_done = ctr("f")
    f_stats = residual_stats("f_stats", w["Wex"], w["alpha2"], w["beta2"])
    gemm(f, fsq, w["Wex"], 0, d, [combined], ex_done, "Wex", stats=f_stats)
    done = ctr("done")
    fused = [next_norm, None, next_h] if next_norm is not None else []
    residual([s, f, w["alpha2"], w["beta2"], *fused], f_stats, [ex_done], done, "residual2")
    return LayerHandles(done, ts)


def lower_layer(
    cfg: MuseConfig,
    kind: str,
    conversations: int,
    tokens_each: int,
    cache_slots: int,
    *,
    tiles: Tiles | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    order: str = "depth",
) -> LayerProgram:
    """A program of one layer (prefix "L0."), built; s is "s", convs is "convs"."""
    _check_shape(cfg, kind, conversations, tokens_each, cache_slots)
    p = Program(f"{cfg.name} {kind} layer {conversations}x{tokens_each}")
    s = p.tensor("s", (conversations * tokens_each, cfg.d), DType.F32)
    convs = p.tensor("convs", (conversations, 4), DType.I32, "state")
    prefix = "L0."
    tl = tiles or Tiles()
    warm = bool(tl.code_warm) and conversations * tokens_each <= tl.code_warm
    if warm:  # the small layer in a program of its own; one instance of each of its ops into p
        small = Program("code warmer")
        emit_layer(small, code_warm.CFG, kind, 1, tokens_each, code_warm.warm_slots(kind, tokens_each), prefix=code_warm.PREFIX,
                   s=small.tensor(code_warm.PREFIX + "s", (tokens_each, code_warm.CFG.d), DType.F32),
                   convs=small.tensor(code_warm.PREFIX + "convs", (1, 4), DType.I32, "state"),
                   tiles=tl.for_warm(conversations * tokens_each, tokens_each))
        code_warm.emit_lead_instances(p, small)
    hd = emit_layer(p, cfg, kind, conversations, tokens_each, cache_slots, prefix=prefix, s=s, convs=convs, tiles=tl, k_scale=k_scale, v_scale=v_scale)
    return LayerProgram(cfg, kind, conversations, tokens_each, cache_slots, k_scale, v_scale, p, p.build(order=order), hd, prefix, warm)


def poisoned(spec: TensorSpec, device: str | torch.device = "cpu") -> torch.Tensor:
    """A scratch buffer for spec filled with NaN (floats) or POISON_INT (ints)."""
    dt = torch_dtype(spec.dtype)
    if dt in (torch.int32, torch.uint8):
        fill = POISON_INT if dt == torch.int32 else 0xFF
        return torch.full(spec.shape, fill, dtype=dt, device=device)
    return torch.full(spec.shape, float("nan"), dtype=torch.float32, device=device).to(dt)


def bind_layer(lp: LayerProgram, weights: LayerWeights, state: DecodeState, s: torch.Tensor, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Buffers for every tensor of lp.stream, by name.

    The state's caches and convs are bound as they are when they live on
    `device` (else copied there), so on the state's own device the KV a run
    writes stays in the state. s, the input residual stream, is copied: the run
    updates the copy in place. Every other buffer is scratch, poisoned so that
    an unwritten element shows.
    """
    for name, want in (("k_scale", lp.k_scale), ("v_scale", lp.v_scale)):
        got = float(getattr(weights, name))
        if got != want:
            raise ProgramError(f"weights.{name} = {got} but the program was built with {want}: rebuild it with lower_layer(..., {name}={got})")
    out = _bind_prefix(lp.stream, lp.prefix, lp.cfg, weights, state, device)
    out["convs"] = check_binding(lp.handles["convs"], state.convs.to(device))
    out["s"] = check_binding(lp.handles["s"], s.to(device=device, dtype=torch.float32, copy=True))
    if lp.warm:  # the warmer's instances: the small layer's weights, caches and conversation row, zeros elsewhere
        wi = code_warm.warm_inputs(lp.kind, lp.tokens_each, str(torch.device(device)))
        warm = _bind_prefix(lp.stream, code_warm.PREFIX, code_warm.CFG, wi.weights, wi.state, device, scratch=torch.zeros)
        specs = {t.name: t for t in lp.stream.tensors}
        for name, buf in ((code_warm.PREFIX + "s", wi.s), (code_warm.PREFIX + "convs", wi.state.convs)):
            if name in specs:
                warm[name] = check_binding(specs[name], buf.clone())
        out.update(warm)
    return out


def _bind_prefix(stream: Stream, prefix: str, cfg: MuseConfig, weights: LayerWeights, state: DecodeState,
                 device: str | torch.device, scratch: Callable[..., torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Buffers of the layer tensors named prefix + role: weights and caches
    bound, every other one poisoned scratch, or made by scratch(shape, dtype=,
    device=) (s and convs are the caller's)."""
    fields = _weight_specs(cfg)
    out: dict[str, torch.Tensor] = {}
    for spec in stream.tensors:
        if not spec.name.startswith(prefix):
            continue
        role = spec.name[len(prefix):]
        if role in fields:
            buf = getattr(weights, role)
        elif role in ("k_cache", "v_cache"):
            buf = getattr(state, role)
        elif role in ("s", "convs"):
            continue
        else:
            out[spec.name] = poisoned(spec, device) if scratch is None else scratch(spec.shape, dtype=torch_dtype(spec.dtype), device=device)
            continue
        out[spec.name] = check_binding(spec, buf.to(device))
    return out
