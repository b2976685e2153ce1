"""RMSNorm variants (computed in float32, as both DeepSeek's reference and transformers do)."""

from __future__ import annotations

import torch

from . import quant
from .backend import REFERENCE, TRITON
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


def rms_norm_fp8(x: torch.Tensor, weight: torch.Tensor | None, eps: float, group: int,
                 backend: str = REFERENCE) -> tuple[torch.Tensor, quant.Quantized]:
    """(rms_norm(x), its FP8 quantization per 1 x group) for a GEMM that quantizes its activations per group (V4's q
    latent into wq_b): the kernels' path does both in the norm's launch."""
    if backend == TRITON:
        from .kernels import norm as kernel

        if kernel.supports_quant(x, group):
            return kernel.rms_norm_fp8(x, weight, eps, group)
    y = rms_norm(x, weight, eps)
    return y, quant.fp8_rows(y, group)
