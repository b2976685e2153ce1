"""Quantization formats of the DeepSeek-V4 family, as plain-torch references.

Two uses: (1) the quant-dequant *simulations* that DeepSeek's reference applies to activations and caches
(QAT formats), and (2) the *stored* formats of released checkpoints (FP8 e4m3 with e8m0 block scales, FP4
e2m1 packed two per byte with per-32 e8m0 scales).

e8m0 scales are powers of two stored as a biased exponent byte (value = 2**(b - 127)); they are reinterpreted,
never numerically cast. FP4 e2m1 codes: bit 3 = sign, magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6; the low nibble of
a byte holds the even element.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .profiling import profiled

FP8_MAX = 448.0
FP4_MAX = 6.0
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Midpoints between consecutive FP4 magnitudes, and whether a tie rounds up (to an even code).
_FP4_MIDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_FP4_TIE_UP = (False, True, False, True, False, True, False)


@functools.lru_cache(maxsize=8)
def _fp4_table(device: torch.device) -> torch.Tensor:
    """The e2m1 magnitudes as a device tensor (cached: no host-to-device copy inside a CUDA graph)."""
    return torch.tensor(FP4_VALUES, dtype=torch.float32, device=device)


def _pow2_ceil(x: torch.Tensor) -> torch.Tensor:
    """2**ceil(log2(x)) exactly, via the float32 bit pattern (as the reference kernels do)."""
    bits = x.float().contiguous().view(torch.int32)
    exp = ((bits >> 23) & 0xFF) - 127
    exp = exp + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return torch.ldexp(torch.ones_like(x, dtype=torch.float32), exp.float())


def e8m0_from_pow2(scale: torch.Tensor) -> torch.Tensor:
    """Power-of-two float scales -> e8m0 exponent bytes (uint8)."""
    exp = torch.frexp(scale.float()).exponent - 1  # scale = 0.5 * 2**e  ->  2**(e-1)
    return (exp + 127).clamp(0, 254).to(torch.uint8)


def e8m0_to_float(b: torch.Tensor) -> torch.Tensor:
    """e8m0 bytes (uint8 or float8_e8m0fnu) -> float32 powers of two, by reinterpreting the exponent."""
    if b.dtype == torch.float8_e8m0fnu:
        b = b.view(torch.uint8)
    return torch.ldexp(torch.ones(b.shape, dtype=torch.float32, device=b.device), b.to(torch.int32).float() - 127)


def _grouped(x: torch.Tensor, group: int) -> torch.Tensor:
    if x.shape[-1] % group:
        raise ValueError(f"last dim {x.shape[-1]} is not a multiple of the quantization group {group}")
    return x.float().unflatten(-1, (-1, group))


# ------------------------------------------------------------------------------------------------
# FP8 e4m3
# ------------------------------------------------------------------------------------------------

def fp8_group_scale(x: torch.Tensor, group: int, pow2: bool = True) -> torch.Tensor:
    """Per-group scale amax/448, rounded up to a power of two (ue8m0) when pow2; amax floored at 1e-4."""
    amax = _grouped(x, group).abs().amax(-1).clamp_min(1e-4)
    s = amax / FP8_MAX
    return _pow2_ceil(s) if pow2 else s


def fp8_quantize(x: torch.Tensor, group: int, pow2: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """x -> (float8_e4m3fn values, float32 scales [..., n/group])."""
    s = fp8_group_scale(x, group, pow2)
    q = (_grouped(x, group) / s.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.flatten(-2), s


def fp8_dequantize(q: torch.Tensor, s: torch.Tensor, group: int) -> torch.Tensor:
    return (q.float().unflatten(-1, (-1, group)) * s.float().unsqueeze(-1)).flatten(-2)


@profiled("norm/rope/quant")
def fp8_simulate(x: torch.Tensor, group: int, pow2: bool = True) -> torch.Tensor:
    """Quant-dequant round trip in x's dtype: what DeepSeek's reference applies to KV and activations."""
    q, s = fp8_quantize(x, group, pow2)
    return fp8_dequantize(q, s, group).to(x.dtype)


@dataclass(frozen=True)
class Quantized:
    """Activations already quantized to FP8 per 1 x `group` for the GEMM that consumes them (a producer kernel wrote
    them, sparing that GEMM its quantization launch): e4m3 `values` [..., K], float32 power-of-two `scales`
    [..., K / group], and `dtype`, the activations' own dtype. The dequantized values equal fp8_simulate of the
    activations, and quantizing them again gives the same values and scales (a fixed point: every e4m3 value times
    2^j below 448 is an e4m3 value), so a consumer that cannot read them may take `dequantize()` instead, exactly."""
    values: torch.Tensor
    scales: torch.Tensor
    group: int
    dtype: torch.dtype

    @property
    def shape(self) -> torch.Size:
        return self.values.shape

    def flatten(self, start_dim: int) -> Quantized:
        """Both tensors flattened from start_dim (a leading dim, < values.dim() - 1: groups stay whole)."""
        return Quantized(self.values.flatten(start_dim), self.scales.flatten(start_dim), self.group, self.dtype)

    def dequantize(self) -> torch.Tensor:
        return fp8_dequantize(self.values, self.scales, self.group).to(self.dtype)


def fp8_rows(x: torch.Tensor, group: int) -> Quantized:
    """x quantized per 1 x group as a Quantized (the reference of the producers that fuse it: ops/norm.py)."""
    q, s = fp8_quantize(x, group)
    return Quantized(q, s, group, x.dtype)


# ------------------------------------------------------------------------------------------------
# FP4 e2m1
# ------------------------------------------------------------------------------------------------

def fp4_round(v: torch.Tensor) -> torch.Tensor:
    """Round float32 values (already scaled into [-6, 6]) to the nearest e2m1 value, ties to the even code."""
    a = v.abs().clamp(max=FP4_MAX)
    idx = torch.zeros_like(a, dtype=torch.int64)
    for mid, tie_up in zip(_FP4_MIDS, _FP4_TIE_UP):
        idx += (a > mid) | ((a == mid) & tie_up)
    table = _fp4_table(v.device)
    return table[idx].copysign(v) * (v != 0)


def fp4_codes(v: torch.Tensor) -> torch.Tensor:
    """e2m1 values -> 4-bit codes (uint8, 0..15)."""
    a = v.abs()
    table = _fp4_table(v.device)
    mag = (a.unsqueeze(-1) == table).float().argmax(-1).to(torch.uint8)
    return mag | ((v < 0) & (a > 0)).to(torch.uint8) << 3


def fp4_from_codes(codes: torch.Tensor) -> torch.Tensor:
    table = _fp4_table(codes.device)
    mag = table[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -mag, mag)


def fp4_pack(codes: torch.Tensor) -> torch.Tensor:
    """[..., 2n] codes -> [..., n] bytes; the low nibble holds the even element."""
    c = codes.to(torch.uint8).unflatten(-1, (-1, 2))
    return c[..., 0] | (c[..., 1] << 4)


def fp4_unpack(packed: torch.Tensor) -> torch.Tensor:
    if packed.dtype != torch.uint8:
        packed = packed.view(torch.uint8)
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2)


def fp4_group_scale(x: torch.Tensor, group: int, scale_fmt: str = "ue8m0") -> torch.Tensor:
    """Per-group scale amax/6: a power of two (ue8m0, amax floored at 6*2^-126) or an e4m3 value (NVFP4)."""
    amax = _grouped(x, group).abs().amax(-1)
    if scale_fmt == "ue8m0":
        return _pow2_ceil(amax.clamp_min(FP4_MAX * 2.0**-126) / FP4_MAX)
    if scale_fmt == "e4m3":
        # NVFP4-style (V4.1 compressed KV): amax/6 rounded to nearest e4m3, amax floored at 6 * 2^-9 so the scale
        # is at least e4m3's smallest subnormal and a near-zero group keeps its values (as public ports of the
        # V4.1 reference do; the release's exact rule is not verified)
        return (amax.clamp_min(FP4_MAX * 2.0**-9) / FP4_MAX).clamp(max=FP8_MAX).to(torch.float8_e4m3fn).float()
    raise ValueError(f"unknown FP4 scale format {scale_fmt!r}")


def fp4_quantize(x: torch.Tensor, group: int, scale_fmt: str = "ue8m0") -> tuple[torch.Tensor, torch.Tensor]:
    """x -> (e2m1 values as float32, float32 scales)."""
    s = fp4_group_scale(x, group, scale_fmt)
    v = fp4_round(_grouped(x, group) / s.unsqueeze(-1))
    return v.flatten(-2), s


@profiled("norm/rope/quant")
def fp4_simulate(x: torch.Tensor, group: int, scale_fmt: str = "ue8m0") -> torch.Tensor:
    v, s = fp4_quantize(x, group, scale_fmt)
    return (v.unflatten(-1, (-1, group)) * s.unsqueeze(-1)).flatten(-2).to(x.dtype)


# ------------------------------------------------------------------------------------------------
# Weight formats of the released checkpoints
# ------------------------------------------------------------------------------------------------

def fp8_block_quantize_weight(w: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] weight -> (float8_e4m3fn [out, in], e8m0 scales [ceil(out/b), ceil(in/b)])."""
    out_f, in_f = w.shape
    po, pi = -out_f % block, -in_f % block
    wp = torch.nn.functional.pad(w.float(), (0, pi, 0, po))
    blocks = wp.unflatten(0, (-1, block)).unflatten(2, (-1, block))  # [ob, b, ib, b]
    amax = blocks.abs().amax(dim=(1, 3)).clamp_min(1e-4)
    s = _pow2_ceil(amax / FP8_MAX)
    q = (blocks / s[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    q = q.flatten(2).flatten(0, 1)[:out_f, :in_f].contiguous()
    return q, e8m0_from_pow2(s).view(torch.float8_e8m0fnu)


def fp8_block_dequantize_weight(q: torch.Tensor, scale: torch.Tensor, block: int) -> torch.Tensor:
    out_f, in_f = q.shape
    s = e8m0_to_float(scale) if scale.dtype in (torch.uint8, torch.float8_e8m0fnu) else scale.float()
    s = s.repeat_interleave(block, 0)[:out_f].repeat_interleave(block, 1)[:, :in_f]
    return q.float() * s


def fp4_quantize_weight(w: torch.Tensor, group: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] weight -> (packed int8 [out, in/2], e8m0 scales [out, in/group])."""
    v, s = fp4_quantize(w, group, "ue8m0")
    return fp4_pack(fp4_codes(v)).view(torch.int8), e8m0_from_pow2(s).view(torch.float8_e8m0fnu)


def fp4_dequantize_weight(packed: torch.Tensor, scale: torch.Tensor, group: int = 32) -> torch.Tensor:
    v = fp4_from_codes(fp4_unpack(packed))
    s = e8m0_to_float(scale) if scale.dtype in (torch.uint8, torch.float8_e8m0fnu) else scale.float()
    return (v.unflatten(-1, (-1, group)) * s.unsqueeze(-1)).flatten(-2)
