"""Number formats of Muse (MUSE.md "Formats"): NVFP4 experts, FP8 e4m3, bf16.

NVFP4: 4-bit e2m1 codes (bit 3 the sign, bits 0..2 index E2M1_MAGNITUDES), one
e4m3 scale per 16 consecutive values along K, one f32 scale per matrix;
value = code * block_scale * tensor_scale. Two codes per byte, even k in the
low nibble (GVM_DT_E2M1X2). Everything here is vectorised torch and runs on
whatever device its input lives on.

Tiled NVFP4 (the experts' storage, isa/gvm_isa.h): a matrix [N, K] as
ceil(N / 16) blocks of 16 rows, each stored K step by K step of 128 values:
codes [16 rows][64 bytes], scales [16 rows][8 bytes] of a step together. A
warp's copy of one step of a block is then one contiguous run (1,024 + 128
bytes), not 16 rows' 64 bytes each K / 2 bytes apart: ~3.9 TB/s against ~2.2
on the H200 (tools/ring_probe.py). Within a byte the two codes' bits are
placed for the decode (E2M1_TILED_BITS): the device turns 8 codes into e4m3
bytes in 5 instructions, not the 7 that nibbles take (ops/common.cuh).
"""
from __future__ import annotations

import torch

from ..isa import NVFP4_TILE_K as TILE_K
from ..isa import NVFP4_TILE_ROWS as TILE_ROWS
from ..opspec import tiled_nvfp4_shapes

E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
#: value of each e2m1 code 0..15 (code 8 is -0.0)
E2M1_VALUES = torch.tensor(list(E2M1_MAGNITUDES) + [-m for m in E2M1_MAGNITUDES], dtype=torch.float32)
#: the two values of each code byte (low nibble first, as pack_e2m1 packs them): f32 [256, 2]
_E2M1_PAIRS = torch.stack((E2M1_VALUES[torch.arange(256) & 15], E2M1_VALUES[torch.arange(256) >> 4]), dim=-1).contiguous()
E2M1_MAX = 6.0
E4M3_MAX = 448.0
NVFP4_BLOCK = 16
#: the bit of a tiled code byte that holds each bit of the plain byte (even
#: code in the low nibble: sign 3, exponent 2..1, mantissa 0; odd code 7..4)
E2M1_TILED_BITS = (2, 3, 4, 7, 0, 1, 6, 5)
# rounding boundaries between consecutive magnitudes
_MIDPOINTS = torch.tensor([(a + b) / 2 for a, b in zip(E2M1_MAGNITUDES, E2M1_MAGNITUDES[1:])], dtype=torch.float32)


def to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """x as float8_e4m3fn, round-to-nearest-even, saturating at +-448.

    The clamp makes saturation explicit: torch's own cast has not saturated in
    every version and device (out-of-range values became NaN).
    """
    return x.float().clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def from_e4m3(x: torch.Tensor) -> torch.Tensor:
    """An e4m3 tensor (float8_e4m3fn, or its bytes as uint8) as f32."""
    if x.dtype == torch.uint8:
        x = x.view(torch.float8_e4m3fn)
    if x.dtype != torch.float8_e4m3fn:
        raise TypeError(f"from_e4m3 expects float8_e4m3fn or uint8, got {x.dtype}")
    return x.float()


def bf16_round(x: torch.Tensor) -> torch.Tensor:
    """x rounded to bf16 (nearest even) and returned as f32."""
    return x.to(torch.bfloat16).float()


def e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """Nearest e2m1 code (uint8 0..15) of each element; ties to the even code,
    magnitudes above 6 saturate to 6, as cvt.rn.satfinite.e2m1 does."""
    mids = _MIDPOINTS.to(x.device)
    a = x.abs().float()
    lo = torch.bucketize(a, mids, right=False)  # a on a midpoint: the lower code
    hi = torch.bucketize(a, mids, right=True)   # ... the upper one
    mag = torch.where((lo != hi) & (lo % 2 == 1), hi, lo)
    return (mag + 8 * (x < 0)).to(torch.uint8)


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """[..., K] codes -> [..., K/2] bytes, even k in the low nibble."""
    if codes.shape[-1] % 2:
        raise ValueError(f"cannot pack an odd number of e2m1 codes ({codes.shape[-1]})")
    pairs = codes.reshape(*codes.shape[:-1], -1, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).contiguous()


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """[..., K/2] bytes -> [..., K] codes (uint8 0..15)."""
    if packed.dtype != torch.uint8:
        raise TypeError(f"e2m1 codes travel as uint8, got {packed.dtype}")
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(*packed.shape[:-1], -1)


def quantize_nvfp4_batched(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """NVFP4 of every [N, K] matrix of w [..., N, K].

    Returns codes uint8 [..., N, K/2], block scales float8_e4m3fn [..., N, K/16]
    and tensor scales f32 [...] (amax / (6 * 448), so block scales use the whole
    e4m3 range; 1.0 for an all-zero matrix).
    """
    if w.dim() < 2 or w.shape[-1] % NVFP4_BLOCK or w.numel() == 0:
        raise ValueError(f"NVFP4 needs a non-empty [..., N, K] with K a multiple of {NVFP4_BLOCK}, got {tuple(w.shape)}")
    w = w.float()
    if not bool(torch.isfinite(w).all()):
        raise ValueError("NVFP4 quantisation of a matrix with inf or NaN")
    lead = w.shape[:-2]
    blocks = w.reshape(*w.shape[:-1], -1, NVFP4_BLOCK)
    amax = w.abs().flatten(-2).amax(-1)
    ts = torch.where(amax > 0, amax / (E2M1_MAX * E4M3_MAX), torch.ones_like(amax))
    ts_b = ts.reshape(*lead, 1, 1, 1)
    scales = to_e4m3(blocks.abs().amax(-1) / (E2M1_MAX * ts_b[..., 0]))
    denom = scales.float().unsqueeze(-1) * ts_b
    # a block whose scale is 0 (all zeros, or below e4m3's range) gets code 0
    ratio = torch.where(denom > 0, blocks / torch.where(denom > 0, denom, 1.0), 0.0)
    codes = pack_e2m1(e2m1_codes(ratio).reshape(w.shape))
    return codes, scales.contiguous(), ts.contiguous()


def quantize_nvfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
    """NVFP4 of one matrix w [N, K]: (codes [N, K/2], scales [N, K/16], tensor_scale)."""
    if w.dim() != 2:
        raise ValueError(f"quantize_nvfp4 takes one [N, K] matrix, got {tuple(w.shape)}; use quantize_nvfp4_batched")
    codes, scales, ts = quantize_nvfp4_batched(w)
    return codes, scales, float(ts)


def dequantize_nvfp4(codes: torch.Tensor, scales: torch.Tensor, tensor_scale: float | torch.Tensor) -> torch.Tensor:
    """f32 [..., N, K] of NVFP4 matrices: code * block scale * tensor scale.

    tensor_scale: a float, or one per matrix (shape [...] of the leading dims).
    """
    if codes.dtype != torch.uint8:
        raise TypeError(f"e2m1 codes travel as uint8, got {codes.dtype}")
    k = codes.shape[-1] * 2
    if scales.shape != codes.shape[:-1] + (k // NVFP4_BLOCK,):
        raise ValueError(f"NVFP4 scales {tuple(scales.shape)} do not match codes {tuple(codes.shape)}")
    ts = torch.as_tensor(tensor_scale, dtype=torch.float32, device=codes.device)
    if ts.dim():
        if ts.shape != codes.shape[:-2]:
            raise ValueError(f"tensor scales {tuple(ts.shape)} must be one per matrix {tuple(codes.shape[:-2])}")
        ts = ts.reshape(*ts.shape, 1, 1, 1)
    # each byte's two values at once, by an int32 index ([..., K/16 blocks, 16]; half the
    # gathers of a per-code lookup and no repeated scales: 2x faster, the same bits)
    vals = torch.index_select(_E2M1_PAIRS.to(codes.device), 0, codes.flatten().int())
    vals = vals.reshape(*codes.shape[:-1], k // NVFP4_BLOCK, NVFP4_BLOCK)
    return (vals * from_e4m3(scales).unsqueeze(-1) * ts).reshape(*codes.shape[:-1], k)


def _byte_table(bits: tuple[int, ...], inverse: bool) -> torch.Tensor:
    """uint8 [256]: each byte with its bit i moved to bits[i] (inverse: back)."""
    table = torch.zeros(256, dtype=torch.uint8)
    for b in range(256):
        moved = sum(((b >> i) & 1) << bits[i] for i in range(8))
        if inverse:
            table[moved] = b
        else:
            table[b] = moved
    return table


_TILE_BYTES = _byte_table(E2M1_TILED_BITS, inverse=False)
_UNTILE_BYTES = _byte_table(E2M1_TILED_BITS, inverse=True)


def tile_nvfp4(codes: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4 codes [..., N, K/2] and scales [..., N, K/16] -> the tiled layout
    (module docstring); rows past N up to a multiple of 16 are zeros."""
    n, k = codes.shape[-2], codes.shape[-1] * 2
    if scales.shape != codes.shape[:-1] + (k // NVFP4_BLOCK,):
        raise ValueError(f"NVFP4 scales {tuple(scales.shape)} do not match codes {tuple(codes.shape)}")
    cshape, sshape = tiled_nvfp4_shapes(tuple(codes.shape[:-2]), n, k)
    nb, kb, lead = cshape[-2], k // TILE_K, codes.shape[:-2]

    def tile(t: torch.Tensor, row_bytes: int) -> torch.Tensor:
        t = torch.nn.functional.pad(t, (0, 0, 0, nb * TILE_ROWS - n))  # [..., nb * 16, kb * row_bytes]
        t = t.reshape(*lead, nb, TILE_ROWS, kb, row_bytes).transpose(-3, -2)
        return t.reshape(*lead, nb, kb * TILE_ROWS * row_bytes).contiguous()

    sbytes = scales.view(torch.uint8) if scales.dtype == torch.float8_e4m3fn else scales
    placed = _TILE_BYTES.to(codes.device)[codes.long()]
    return tile(placed, TILE_K // 2), tile(sbytes, TILE_K // NVFP4_BLOCK).view(scales.dtype).reshape(sshape)


def untile_nvfp4(codes: torch.Tensor, scales: torch.Tensor, n: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Tiled codes [..., NB, 8K] and scales [..., NB, K] -> codes [..., N, K/2],
    scales [..., N, K/16] (N: n, default all 16 NB rows)."""
    nb, k = codes.shape[-2], codes.shape[-1] // 8
    n = nb * TILE_ROWS if n is None else n
    if codes.shape[-1] % (8 * TILE_K) or not (nb - 1) * TILE_ROWS < n <= nb * TILE_ROWS or scales.shape != codes.shape[:-1] + (k,):
        raise ValueError(f"tiled NVFP4 codes {tuple(codes.shape)}, scales {tuple(scales.shape)} do not hold {n} rows")
    kb, lead = k // TILE_K, codes.shape[:-2]

    def untile(t: torch.Tensor, row_bytes: int) -> torch.Tensor:
        t = t.reshape(*lead, nb, kb, TILE_ROWS, row_bytes).transpose(-3, -2)
        return t.reshape(*lead, nb * TILE_ROWS, kb * row_bytes)[..., :n, :].contiguous()

    sbytes = scales.view(torch.uint8) if scales.dtype == torch.float8_e4m3fn else scales
    plain = _UNTILE_BYTES.to(codes.device)[untile(codes, TILE_K // 2).long()]
    return plain, untile(sbytes, TILE_K // NVFP4_BLOCK).view(scales.dtype)
