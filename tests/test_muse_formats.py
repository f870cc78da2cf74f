"""NVFP4, e2m1, e4m3 and bf16 helpers of gpuvm.muse.formats."""
from __future__ import annotations

import pytest
import torch

from gpuvm.muse.formats import (
    E2M1_VALUES,
    bf16_round,
    dequantize_nvfp4,
    e2m1_codes,
    from_e4m3,
    pack_e2m1,
    quantize_nvfp4,
    quantize_nvfp4_batched,
    tile_nvfp4,
    to_e4m3,
    unpack_e2m1,
    untile_nvfp4,
)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_code_table_is_exact() -> None:
    mags = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert E2M1_VALUES.dtype == torch.float32 and E2M1_VALUES.shape == (16,)
    assert E2M1_VALUES.tolist() == mags + [-m for m in mags]
    assert torch.signbit(E2M1_VALUES[8])  # code 8 is -0


def test_every_code_rounds_to_itself() -> None:
    codes = e2m1_codes(E2M1_VALUES).tolist()
    assert codes[:8] + codes[9:] == list(range(8)) + list(range(9, 16))
    assert codes[8] in (0, 8)  # -0


def test_rounding_nearest_ties_even_and_saturation() -> None:
    x = torch.tensor([0.24, 0.25, 0.26, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.1, 6.5, 1e9, -0.75, -5.0, -7.0])
    want = [0.0, 0.0, 0.5, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, 6.0, -1.0, -4.0, -6.0]
    assert E2M1_VALUES[e2m1_codes(x).long()].tolist() == want


def test_packing_even_k_low_nibble() -> None:
    codes = torch.tensor([[1, 2, 15, 8]], dtype=torch.uint8)
    packed = pack_e2m1(codes)
    assert packed.tolist() == [[0x21, 0x8F]]
    assert torch.equal(unpack_e2m1(packed), codes)
    with pytest.raises(ValueError):
        pack_e2m1(torch.zeros(3, dtype=torch.uint8))


def test_dequantize_is_each_code_times_its_block_scale_times_its_tensor_scale() -> None:
    # bit for bit as the per-code lookup (dequantize_nvfp4 looks up a byte's two codes at once)
    g = _gen(3)
    codes = torch.randint(0, 256, (3, 2, 5, 64), dtype=torch.uint8, generator=g)
    scales = (torch.rand(3, 2, 5, 8, generator=g) * 4).to(torch.float8_e4m3fn)
    ts = torch.rand(3, 2, generator=g) + 0.1
    want = E2M1_VALUES[unpack_e2m1(codes).long()] * from_e4m3(scales).repeat_interleave(16, dim=-1) * ts[..., None, None]
    assert torch.equal(dequantize_nvfp4(codes, scales, ts).view(torch.int32), want.view(torch.int32))
    assert torch.equal(dequantize_nvfp4(codes[1, 0], scales[1, 0], 0.5).view(torch.int32),
                       (E2M1_VALUES[unpack_e2m1(codes[1, 0]).long()] * from_e4m3(scales[1, 0]).repeat_interleave(16, dim=-1) * 0.5).view(torch.int32))
    with pytest.raises(TypeError):
        dequantize_nvfp4(codes.int(), scales, ts)


def test_quantize_layout_and_dtypes() -> None:
    w = torch.randn(8, 64, generator=_gen())
    codes, scales, ts = quantize_nvfp4(w)
    assert codes.dtype == torch.uint8 and codes.shape == (8, 32)
    assert scales.dtype == torch.float8_e4m3fn and scales.shape == (8, 4)
    assert isinstance(ts, float) and ts == pytest.approx(w.abs().max().item() / (6 * 448))
    # the largest block scale uses the top of the e4m3 range
    assert from_e4m3(scales).max().item() == 448.0
    # element k of row n sits in byte k // 2, low nibble when k is even
    n, k = 3, 21
    code = (codes[n, k // 2] >> (4 * (k % 2))) & 0xF
    value = E2M1_VALUES[code.long()] * from_e4m3(scales[n, k // 16]) * ts
    assert value.item() == pytest.approx(dequantize_nvfp4(codes, scales, ts)[n, k].item())
    assert abs(value.item() - w[n, k].item()) <= from_e4m3(scales[n, k // 16]).item() * ts


def test_representable_matrices_round_trip_exactly() -> None:
    g = _gen(1)
    n, k = 16, 128
    mags = torch.randint(1, 8, (n, k), generator=g)
    sign = torch.randint(0, 2, (n, k), generator=g) * 8
    codes = (mags + sign).to(torch.uint8)
    codes[:, ::16] = 7  # every block holds a 6, so its amax fixes its scale
    scales = to_e4m3(torch.rand(n, k // 16, generator=g) * 400 + 16)
    scales[0, 0] = to_e4m3(torch.tensor(448.0))
    w = dequantize_nvfp4(pack_e2m1(codes), scales, 0.01)
    c2, s2, ts2 = quantize_nvfp4(w)
    assert torch.equal(dequantize_nvfp4(c2, s2, ts2), w)
    assert torch.equal(c2, pack_e2m1(codes))


def test_error_bounds_on_gaussian() -> None:
    w = torch.randn(64, 512, generator=_gen(2))
    codes, scales, ts = quantize_nvfp4(w)
    deq = dequantize_nvfp4(codes, scales, ts)
    err = (deq - w).abs()
    # each element is within one block-scale unit (half the widest e2m1 gap, 4..6)
    unit = from_e4m3(scales).repeat_interleave(16, dim=1) * ts
    assert bool((err <= unit * 1.0001).all())
    # and NVFP4 keeps about 3 bits of a Gaussian: relative error near 0.09
    rel = (err.norm() / w.norm()).item()
    assert 0.05 < rel < 0.12


def test_batched_equals_per_matrix() -> None:
    w = torch.randn(3, 2, 16, 64, generator=_gen(3)) * torch.tensor([1.0, 5.0, 0.1]).reshape(3, 1, 1, 1)
    codes, scales, ts = quantize_nvfp4_batched(w)
    assert codes.shape == (3, 2, 16, 32) and scales.shape == (3, 2, 16, 4) and ts.shape == (3, 2)
    for i in range(3):
        for j in range(2):
            c, s, t = quantize_nvfp4(w[i, j])
            assert torch.equal(codes[i, j], c) and torch.equal(scales[i, j].view(torch.uint8), s.view(torch.uint8))
            assert ts[i, j].item() == t
    assert torch.equal(dequantize_nvfp4(codes, scales, ts)[2, 1], dequantize_nvfp4(codes[2, 1], scales[2, 1], ts[2, 1].item()))


def test_zero_matrix_and_bad_input() -> None:
    codes, scales, ts = quantize_nvfp4(torch.zeros(4, 32))
    assert ts == 1.0 and torch.equal(dequantize_nvfp4(codes, scales, ts), torch.zeros(4, 32))
    with pytest.raises(ValueError, match="multiple of 16"):
        quantize_nvfp4(torch.ones(4, 24))
    with pytest.raises(ValueError, match="NaN"):
        quantize_nvfp4(torch.full((4, 32), float("nan")))
    with pytest.raises(ValueError):
        quantize_nvfp4(torch.ones(2, 4, 32))
    c, s, t = quantize_nvfp4_batched(torch.ones(2, 4, 32))
    with pytest.raises(ValueError):
        dequantize_nvfp4(c, s[..., :1], t)
    with pytest.raises(ValueError):
        dequantize_nvfp4(c, s, torch.ones(3))


def test_e4m3_saturates() -> None:
    x = torch.tensor([1000.0, -1000.0, float("inf"), 448.0, 464.0, 0.3])
    y = from_e4m3(to_e4m3(x))
    assert y[:5].tolist() == [448.0, -448.0, 448.0, 448.0, 448.0]
    assert y[5].item() == pytest.approx(0.3, rel=2 ** -4)
    assert torch.equal(from_e4m3(to_e4m3(x).view(torch.uint8)), y)
    with pytest.raises(TypeError):
        from_e4m3(torch.ones(2))


def test_bf16_round() -> None:
    x = torch.tensor([1.0 + 2 ** -9, 1.0 + 3 * 2 ** -9, 3.0])
    assert bf16_round(x).tolist() == [1.0, 1.0 + 2 ** -7, 3.0]
    assert bf16_round(x).dtype == torch.float32


def _placed(b: int) -> int:
    """A plain code byte (even code low nibble: sign 3, exponent 2..1, mantissa 0)
    as the tiling stores it: even code at bits 7, 4, 3, 2; odd at 5, 6, 1, 0."""
    e, o = b & 15, b >> 4
    return ((e >> 3 & 1) << 7 | (e >> 2 & 1) << 4 | (e >> 1 & 1) << 3 | (e & 1) << 2
            | (o >> 3 & 1) << 5 | (o >> 2 & 1) << 6 | (o >> 1 & 1) << 1 | (o & 1))


def test_tiled_code_bytes_decode_in_five_ops() -> None:
    """The device's decode of a tiled byte (ops/common.cuh gvm_e2m1x8_to_e4m3:
    even = w & 0x9c, odd = (w << 2 & 0x8c) | (w >> 2 & 0x10)) gives each code
    as an e4m3 byte of its value times 2^-6, for all 256 bytes."""
    plain = torch.arange(256, dtype=torch.uint8).reshape(4, 64)  # rows 0..3 of one K step
    tiled, _ = tile_nvfp4(plain, to_e4m3(torch.ones(4, 8)))
    assert tiled[0, :256].tolist() == [_placed(b) for b in range(256)]
    for b in range(256):
        t = _placed(b)
        even, odd = t & 0x9C, ((t << 2) & 0x8C) | ((t >> 2) & 0x10)
        got = from_e4m3(torch.tensor([even, odd], dtype=torch.uint8)) * 64
        assert torch.equal(got, E2M1_VALUES[[b & 15, b >> 4]]), b


def test_tiled_nvfp4_layout_and_roundtrip() -> None:
    """Tiled NVFP4 (isa/gvm_isa.h): blocks of 16 rows, K step of 128 values by
    step; rows past N are zeros; untiling gives the rows back."""
    gen = torch.Generator().manual_seed(3)
    codes = torch.randint(0, 256, (3, 40, 128), generator=gen, dtype=torch.uint8)
    scales = to_e4m3(torch.rand(3, 40, 16, generator=gen) + 0.5)
    tc, ts = tile_nvfp4(codes, scales)
    assert tc.shape == (3, 3, 2048) and ts.shape == (3, 3, 256) and ts.dtype == torch.float8_e4m3fn
    # row 21 = block 1, row 5; code byte 70 = K step 1, byte 6; scale byte 11 = step 1, byte 3
    assert tc[2, 1, 1024 + 5 * 64 + 6] == _placed(int(codes[2, 21, 70]))
    assert ts.view(torch.uint8)[2, 1, 128 + 5 * 8 + 3] == scales.view(torch.uint8)[2, 21, 11]
    assert not tc[:, 2].reshape(3, 2, 16, 64)[:, :, 8:].any() and not ts.view(torch.uint8)[:, 2].reshape(3, 2, 16, 8)[:, :, 8:].any()
    c2, s2 = untile_nvfp4(tc, ts, 40)
    assert torch.equal(c2, codes) and torch.equal(s2.view(torch.uint8), scales.view(torch.uint8))
    assert untile_nvfp4(tc, ts)[0].shape == (3, 48, 128)
    with pytest.raises(ValueError, match="multiple of 128"):
        tile_nvfp4(codes[..., :32], scales[..., :4])
    with pytest.raises(ValueError, match="do not hold 30 rows"):
        untile_nvfp4(tc, ts, 30)
