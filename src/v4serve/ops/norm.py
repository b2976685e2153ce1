"""RMSNorm variants (computed in float32, as both DeepSeek's reference and transformers do)."""

from __future__ import annotations

import torch

from .precision import acc_dtype
from .profiling import profiled


@profiled("norm/rope/quant")
def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """weight * x / rms(x) in float32, returned in x's dtype (weight None = unweighted)."""
    xf = x.to(acc_dtype(x))
    y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = weight.to(y.dtype) * y
    return y.to(x.dtype)
