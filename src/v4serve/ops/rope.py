"""Rotary position embedding as DeepSeek-V4 uses it: interleaved pairs (2i, 2i+1) on the *last* rope dims.

Window-only layers use theta=rope_theta without YaRN; compressed layers (and their compressors and indexer)
use compress_rope_theta with YaRN frequency interpolation and no mscale.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

from ..config import ModelConfig, yarn_correction_range
from .profiling import profiled


@lru_cache(maxsize=32)
def _inv_freq_cached(dim: int, theta: float, yarn: tuple[float, int, int] | None,
                     device: torch.device = torch.device("cpu")) -> torch.Tensor:
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    if yarn is not None:
        factor, low, high = yarn
        hi = high + 0.001 if low == high else high
        ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (hi - low)).clamp(0, 1)
        smooth = 1 - ramp
        freqs = freqs / factor * (1 - smooth) + freqs * smooth
    return freqs.to(device)


def inv_freq(config: ModelConfig, compressed: bool, device: torch.device | str = "cpu") -> torch.Tensor:
    """Per-pair inverse frequencies [rope_dim/2] for a window-only (False) or compressed (True) layer."""
    device = torch.device(device)
    if not compressed:
        return _inv_freq_cached(config.rope_dim, float(config.rope_theta), None, device)
    low, high = yarn_correction_range(config)
    yarn = (float(config.rope_factor), low, high) if config.original_seq_len > 0 else None
    return _inv_freq_cached(config.rope_dim, float(config.compress_rope_theta), yarn, device)


def rope_cos_sin(positions: torch.Tensor, freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [..., rope_dim/2] (float32) for integer positions."""
    ang = positions.to(torch.float32).unsqueeze(-1) * freqs
    return ang.cos(), ang.sin()


@profiled("norm/rope/quant")
def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """Rotate the trailing 2*cos.shape[-1] dims of x in interleaved pairs (out of place).

    cos/sin broadcast against x's leading dims with a head axis inserted as needed by the caller.
    """
    rd = cos.shape[-1] * 2
    nope, rope = x[..., :-rd], x[..., -rd:]
    r = rope.to(torch.float64 if rope.dtype == torch.float64 else torch.float32).unflatten(-1, (-1, 2))
    a, b = r[..., 0], r[..., 1]
    s = -sin if inverse else sin
    out = torch.stack((a * cos - b * s, a * s + b * cos), dim=-1).flatten(-2).to(x.dtype)
    return torch.cat([nope, out], dim=-1)


def heads_view(t: torch.Tensor) -> torch.Tensor:
    """Insert a head axis before the last dim of cos/sin so they broadcast over [T, H, D]."""
    return t.unsqueeze(-2)


def yarn_is_identity(config: ModelConfig) -> bool:
    return config.original_seq_len <= 0 or math.isclose(config.rope_factor, 1.0)
