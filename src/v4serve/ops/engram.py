"""Engram's gated update of the residual streams (DeepSeek-V4.1, models/v41/engram.py), after its table rows are
gathered and projected to one key per stream and one shared value. Per (token t, stream k), in the accumulation dtype
(ops/precision.py: float32, float64 for float64 inputs):

    rstd_k = rsqrt(mean(x_k^2) + eps) * rsqrt(mean(key_k^2) + eps)
    dot_k  = sum_d x_k,d * w_k,d * key_k,d * rstd_k * D^-0.5                    (w = q_weight * k_weight)
    gate_k = sigmoid(copysign(sqrt(max(|dot_k|, GATE_FLOOR)), dot_k))           (0 for dead tokens)
    x_k   <- x_k + gate_k * value                                               (rounded to x's dtype)

The reference is ~25 small torch ops (~29 launches on the GPU, ~50 us a layer in a graphed decode step); the Triton
body (ops/kernels/engram.py) is one launch, the weights' product included.
"""

from __future__ import annotations

import torch

from .backend import REFERENCE, TRITON
from .precision import wide

GATE_FLOOR = 1e-6  # |dot| floor under the signed square root (the reference's clamp value)


def engram_mix_reference(x: torch.Tensor, key: torch.Tensor, value: torch.Tensor, q_weight: torch.Tensor,
                         k_weight: torch.Tensor, live: torch.Tensor, eps: float) -> torch.Tensor:
    D = x.shape[-1]
    h = wide(x)
    rstd = torch.rsqrt(h.square().mean(-1) + eps) * torch.rsqrt(key.square().mean(-1) + eps)
    w = q_weight.float() * k_weight.float()  # only ever used as a product
    dot = (h * w * key).sum(-1) * rstd * D ** -0.5  # [T, hc]
    gate = torch.sigmoid(torch.copysign(dot.abs().clamp_min(GATE_FLOOR).sqrt(), dot))
    gate = gate * live.unsqueeze(1).to(gate.dtype)
    return (h + gate.unsqueeze(-1) * value.unsqueeze(1)).to(x.dtype)


def engram_mix(x: torch.Tensor, key: torch.Tensor, value: torch.Tensor, q_weight: torch.Tensor,
               k_weight: torch.Tensor, live: torch.Tensor, eps: float, backend: str = REFERENCE) -> torch.Tensor:
    """x [T, hc, D] streams; key [T, hc, D] and value [T, D] (float32, or float64; views of one projection are fine);
    q_weight, k_weight [hc, D] (multiplied in float32: by the kernel itself on the Triton path, no launches of their
    own); live [T] bool (False: the token's gate is 0); eps: the RMS epsilon -> the updated streams [T, hc, D] in x's
    dtype (a new tensor)."""
    if backend == TRITON:
        from .kernels import engram as kernel

        if kernel.supports(x, key, value, q_weight, k_weight, live):
            return kernel.engram_mix(x, key, value, q_weight, k_weight, live, eps)
    return engram_mix_reference(x, key, value, q_weight, k_weight, live, eps)
