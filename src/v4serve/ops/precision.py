"""The accumulation precision of the plain-torch references: float32, or float64 when the model runs in float64.

DeepSeek's reference accumulates norms, mHC, attention, routing and compression in float32. A float64 model (used by
the exactness tests: the reference's FP8/FP4 simulations are discontinuous, so float32 rounding that differs between
GEMM shapes could flip a quantization step) keeps every reduction in float64 instead.
"""

from __future__ import annotations

import struct

import torch


def acc_dtype(*tensors: torch.Tensor) -> torch.dtype:
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def wide(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """x in the accumulation dtype (float32 unless x, or the given dtype, is float64)."""
    return x.to(dtype or acc_dtype(x))


def hi_lo(v: float) -> tuple[float, float]:
    """v as the sum of two float32 values, as a kernel receives them (Triton passes float scalars as float32): summed
    in float32 they are float32(v), in float64 ~48 bits of v. A reference that sums the same two parts matches the
    kernel bit for bit in either precision."""
    hi = struct.unpack("f", struct.pack("f", v))[0]
    return hi, struct.unpack("f", struct.pack("f", v - hi))[0]
