"""One Muse decode layer on the VM against the formula-level reference:
the 12 decode cases at the shard's full size and every shape at small dims,
dynamic and static modes, three consecutive steps (positions advancing, KV
appended, counters carried), fresh random inputs, scratch poisoned with NaN."""
from __future__ import annotations

import pytest
import torch

from gpuvm.gpu_sweep import TOL, compare
from gpuvm.muse.cases import DECODE_CASES, Case, small_case
from gpuvm.muse.config import SHARD, SMALL, MuseConfig
from gpuvm.muse.lowering import Tiles, bind_layer, lower_layer, poisoned
from gpuvm.muse.reference import reference_layer
from gpuvm.muse.state import make_inputs, make_state
from gpuvm.muse.weights import make_layer_weights

STEPS = 3
_WEIGHTS: dict[tuple[str, str], object] = {}


def _weights(cfg: MuseConfig, kind: str):  # one layer of each kind and size, made once
    key = (cfg.name, kind)
    if key not in _WEIGHTS:
        if cfg is SHARD:
            for k in [k for k in _WEIGHTS if k[0] == cfg.name]:
                del _WEIGHTS[k]  # 1.1 GB each: keep one full-size layer at a time
        _WEIGHTS[key] = make_layer_weights(cfg, 1 if kind == "full" else 0, seed=7, device="cuda")
    return _WEIGHTS[key]


def _run_case(vm, cfg: MuseConfig, case: Case, mode: str, tiles: Tiles | None = None) -> list[dict]:  # type: ignore[no-untyped-def]
    w = _weights(cfg, case.kind)
    state = make_state(cfg, case.kind, case.conversations, case.tokens_each, case.context, seed=8, device="cuda", steps=STEPS)
    lp = lower_layer(cfg, case.kind, case.conversations, case.tokens_each, state.slots, tiles=tiles)
    s = make_inputs(cfg, state, seed=7)
    bufs = bind_layer(lp, w, state, s, device="cuda")  # caches and convs bound in place
    loaded = vm.load(lp.stream, bufs)
    out = []
    for step in range(STEPS):
        if step:
            state.advance()  # convs (bound) move on; the KV written last step stays
            s = make_inputs(cfg, state, seed=7) * (1 + 0.1 * step)  # fresh inputs, same skew direction
            bufs["s"].copy_(s)
            for spec in lp.stream.tensors:  # poison every scratch buffer again
                if spec.role in ("activation", "list") and spec.name != "s":
                    bufs[spec.name].copy_(poisoned(spec, "cuda"))
        ref = reference_layer(cfg, w, state.clone(), bufs["s"].clone(), case.kind, bf16_acts=False)
        loaded.run(step, mode=mode)
        r = compare(bufs["s"], bufs["L0.route"], bufs["L0.scores"], ref, case.tokens)
        r["cache_ok"] = _fp8_close(state.k_cache, ref.k_cache) and _fp8_close(state.v_cache, ref.v_cache)
        out.append(r)
    return out


def _fp8_close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal FP8 caches but for rounding: a value may land one e4m3 step
    (1/8 relative, or 2^-7 near zero where bf16 noise of the inputs
    dominates) away from the FP32 reference's, and only rarely."""
    a, b = got.float(), want.float()
    off = a != b
    step = 0.125 * torch.maximum(a.abs(), b.abs()) + 2.0**-7  # + bf16 noise of O(1) inputs near zero
    return bool(((a - b).abs() <= step).all()) and float(off.float().mean()) < 0.01


def _check(results: list[dict]) -> None:
    for step, r in enumerate(results):
        assert r["err"] <= TOL, f"step {step}: error {r['err']:.3e}"
        assert r["routing_ok"], f"step {step}: a routing difference beyond a near-tie ({r})"
        assert r["flipped"] <= max(2, 0.05 * 256), f"step {step}: {r['flipped']} tokens routed differently"
        assert r["cache_ok"], f"step {step}: the FP8 KV written differs from the reference's"


@pytest.mark.parametrize("mode", ["dynamic", "static"])
@pytest.mark.parametrize("case", DECODE_CASES, ids=lambda c: c.name)
def test_shard_layer_matches_reference(vm_plain, case: Case, mode: str) -> None:  # type: ignore[no-untyped-def]
    _check(_run_case(vm_plain, SHARD, case, mode))


@pytest.mark.parametrize("case", DECODE_CASES, ids=lambda c: c.name)
def test_small_layer_matches_reference(vm_plain, case: Case) -> None:  # type: ignore[no-untyped-def]
    _check(_run_case(vm_plain, SMALL, small_case(case, SMALL), "dynamic"))


#: the build switches' other settings (ops/experts.cuh, ops/gemm.cuh), kept for
#: A/B runs: they must still give the reference's answer
SWITCHES = ("GVM_EXPERT_REG=0", "GVM_GEMM_TT=1", "GVM_GEMM_F32_RN=4+GVM_GEMM_F32_TT=4", "GVM_ATT_WG=0", "GVM_GEMM_FOLD=0")
SWITCH_CASES = [c for c in DECODE_CASES if c.name in ("full-c1-t1", "sliding-c1-t8", "full-c32-t1", "full-c32-t8")]


@pytest.fixture(scope="module")
def vm_switches():  # type: ignore[no-untyped-def]
    from gpuvm.device import VM

    defines = tuple(tuple(d.split("=")) for s in SWITCHES for d in s.split("+"))
    return VM(0, groups=2, trace=False, warm=True, defines=defines)


@pytest.mark.parametrize("case", SWITCH_CASES, ids=lambda c: c.name)
def test_shard_layer_with_switches_matches_reference(vm_switches, case: Case) -> None:  # type: ignore[no-untyped-def]
    _check(_run_case(vm_switches, SHARD, case, "dynamic"))


#: ATTN_CHUNK's fused QK-norm/RoPE (Tiles.fuse_qk), at one token and at 128 in both kinds
FUSED_CASES = [c for c in DECODE_CASES if c.name in ("full-c1-t1", "sliding-c1-t1", "full-c16-t8", "sliding-c16-t8")]


@pytest.mark.parametrize("case", FUSED_CASES, ids=lambda c: c.name)
def test_shard_layer_with_fused_qk_matches_reference(vm_plain, case: Case) -> None:  # type: ignore[no-untyped-def]
    _check(_run_case(vm_plain, SHARD, case, "dynamic", Tiles(fuse_qk=1 << 20)))


#: expert work items in a fixed round robin (Tiles.expert_fixed): with static
#: instruction lists, the whole layer scheduled on the host
FIXED_CASES = [c for c in DECODE_CASES if c.name in ("full-c1-t1", "sliding-c32-t8")]


@pytest.mark.parametrize("case", FIXED_CASES, ids=lambda c: c.name)
def test_shard_layer_with_fixed_expert_workers_matches_reference(vm_plain, case: Case) -> None:  # type: ignore[no-untyped-def]
    _check(_run_case(vm_plain, SHARD, case, "static", Tiles(expert_fixed=1)))


@pytest.mark.parametrize("mode", ["dynamic", "static"])
@pytest.mark.parametrize("name", ["full-c1-t1", "sliding-c1-t8", "sliding-c16-t1"])
def test_code_warmer_leaves_the_layer_bit_identical(vm_plain, name: str, mode: str) -> None:  # type: ignore[no-untyped-def]
    """Tiles.code_warm's lead instances run beside the layer and touch none of
    its tensors: the residual stream and the KV it writes are the same bits."""
    case = next(c for c in DECODE_CASES if c.name == name)
    w = _weights(SHARD, case.kind)
    outs = []
    for tiles in (Tiles(code_warm=0), Tiles()):
        state = make_state(SHARD, case.kind, case.conversations, case.tokens_each, case.context, seed=8, device="cuda")
        lp = lower_layer(SHARD, case.kind, case.conversations, case.tokens_each, state.slots, tiles=tiles)
        assert lp.warm == bool(tiles.code_warm)
        bufs = bind_layer(lp, w, state, make_inputs(SHARD, state, seed=7), device="cuda")
        vm_plain.load(lp.stream, bufs).run(0, mode=mode)
        outs.append((bufs["s"], state.k_cache.view(torch.uint8), state.v_cache.view(torch.uint8)))
    for a, b in zip(*outs):
        assert torch.equal(a, b)


#: the down list started once the up list's items are all taken (Tiles.down_early)
EARLY_CASES = [c for c in DECODE_CASES if c.name in ("full-c1-t1", "sliding-c16-t8", "full-c32-t8")]


@pytest.mark.parametrize("mode", ["dynamic", "static"])
@pytest.mark.parametrize("case", EARLY_CASES, ids=lambda c: c.name)
def test_shard_layer_with_early_down_list_matches_reference(vm_plain, case: Case, mode: str) -> None:  # type: ignore[no-untyped-def]
    """Tiles.down_early: the down list's workers start on the up list's first
    signal (its items all taken) and each item waits for its expert's up rows:
    three steps (the lists' counters carried) against the reference, and the
    first step's residual stream and KV bit for bit what the waiting list gives."""
    _check(_run_case(vm_plain, SHARD, case, mode, Tiles(down_early=1)))
    w = _weights(SHARD, case.kind)
    outs = []
    for tiles in (Tiles(down_early=0), Tiles(down_early=1)):
        state = make_state(SHARD, case.kind, case.conversations, case.tokens_each, case.context, seed=8, device="cuda")
        lp = lower_layer(SHARD, case.kind, case.conversations, case.tokens_each, state.slots, tiles=tiles)
        bufs = bind_layer(lp, w, state, make_inputs(SHARD, state, seed=7), device="cuda")
        vm_plain.load(lp.stream, bufs).run(0, mode=mode)
        outs.append((bufs["s"], state.k_cache.view(torch.uint8), state.v_cache.view(torch.uint8)))
    for a, b in zip(*outs):
        assert torch.equal(a, b)


#: the skewed layers of 128 and 256 tokens, whose heaviest experts have more than 32 tokens (MUSE.md)
HEAVY_CASES = [c for c in DECODE_CASES if c.name in ("sliding-c16-t8", "full-c32-t8")]


@pytest.mark.parametrize("mode", ["dynamic", "static"])
@pytest.mark.parametrize("case", HEAVY_CASES, ids=lambda c: c.name)
def test_shard_layer_with_heavy_experts_halved_matches_reference(vm_plain, case: Case, mode: str) -> None:  # type: ignore[no-untyped-def]
    """Tiles.expert_heavy_up / _down (EXPERT_UP / DOWN a6): the items of the
    experts of more than 32 tokens at half the cap in both lists, against the
    reference over three steps (not bit for bit against whole-cap items: an
    item's K loop starts at an offset by its number, GVM_EXP_STAGGER, so the
    sums' order follows the items)."""
    _check(_run_case(vm_plain, SHARD, case, mode, Tiles(expert_heavy_up=32, expert_heavy_down=32)))
