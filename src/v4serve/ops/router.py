"""MoE routing (DeepSeek-V4): one entry point, the plain-torch reference and the fused Triton kernel.

scores = score_func(x W_gate^T) in float32 (float64 for a float64 x); the experts are the top-k of scores + bias (or a
fixed per-token table `tid2eid` on hash-routed layers); the weights are the *unbiased* scores of those experts,
normalised (unless softmax) and multiplied by route_scale. The gate weight is held as stored (bf16 in the release).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import backend as kernels
from . import quant
from .precision import acc_dtype
from .profiling import family


def route_reference(x: torch.Tensor, gate_w: torch.Tensor, bias: torch.Tensor | None, tid2eid: torch.Tensor | None,
                    token_ids: torch.Tensor | None, topk: int, score_func: str, route_scale: float, eps: float,
                    norm: bool = True, alt_bias: torch.Tensor | None = None,
                    alt: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (weights [T, k] float32/float64, expert ids [T, k] int64). `bias` is [E] or per token [T, E]; with `alt`
    ([T] bool), the tokens it flags take `alt_bias` [E] instead of `bias` [E] (V4.1's image tokens)."""
    if alt is not None:
        bias = torch.where(alt.bool().unsqueeze(1), alt_bias.unsqueeze(0), bias.unsqueeze(0))
    a = acc_dtype(x)
    logits = x.to(a) @ gate_w.to(a).t()
    if score_func == "softmax":
        scores = logits.softmax(-1)
    elif score_func == "sigmoid":
        scores = logits.sigmoid()
    else:
        scores = F.softplus(logits).sqrt()
    if tid2eid is not None:
        ids = tid2eid[token_ids].long()
    else:
        sel = scores + bias.to(a) if bias is not None else scores
        ids = sel.topk(topk, dim=-1).indices
    w = scores.gather(1, ids)
    if norm and score_func != "softmax":
        w = w / (w.sum(-1, keepdim=True) + eps)
    return w * route_scale, ids


def route(x: torch.Tensor, gate_w: torch.Tensor, bias: torch.Tensor | None, tid2eid: torch.Tensor | None,
          token_ids: torch.Tensor | None, topk: int, score_func: str, route_scale: float, eps: float,
          norm: bool = True, backend: str = kernels.REFERENCE, alt_bias: torch.Tensor | None = None,
          alt: torch.Tensor | None = None, xq: torch.Tensor | None = None,
          quant_group: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (weights [T, k], expert ids [T, k] int64); see the module docstring and route_reference (alt_bias, alt:
    chosen per token inside the kernel, no launch of its own). `xq` ([T, D], x's dtype), when given, is filled with
    x's FP8 quant-dequant per 1 x quant_group (quant.fp8_simulate): the routed experts' input (ops.moe's
    `router_simulated_input`), in the router's own launch where the kernel runs."""
    with family("router"):
        out, filled = None, False
        if backend == kernels.TRITON:
            from .kernels import router as router_kernels

            if router_kernels.supports(x, gate_w, bias, alt_bias, alt):
                filled = xq is not None and router_kernels.simulates(x, gate_w, quant_group)
                out = router_kernels.route(x, gate_w, bias, tid2eid, token_ids, topk, score_func, route_scale, eps,
                                           norm, alt_bias=alt_bias, alt=alt, xq=xq if filled else None,
                                           quant_group=quant_group)
        if out is None:
            out = route_reference(x, gate_w, bias, tid2eid, token_ids, topk, score_func, route_scale, eps, norm,
                                  alt_bias, alt)
        if xq is not None and not filled:  # the reference, or a group the kernel's D chunks do not tile
            xq.copy_(quant.fp8_simulate(x, quant_group))
        return out
