"""Manifold-constrained hyper-connections (mHC): the 4-stream residual of DeepSeek-V4.

Each sub-layer maps its input streams X [T, n, D] to coefficients: `pre` (collapse weights), `post` (where the
sub-layer output goes) and `comb` (an n x n doubly-stochastic stream mixer from Sinkhorn). All in float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .precision import acc_dtype


@dataclass
class HCParams:
    fn: torch.Tensor  # [(2+n)*n, n*D] float32
    base: torch.Tensor  # [(2+n)*n]
    scale: torch.Tensor  # [3]


def hc_mixes(x: torch.Tensor, fn: torch.Tensor, norm_eps: float) -> torch.Tensor:
    """RMS-normalised linear map of the flattened streams: [T, n, D] -> [T, rows(fn)] (float32)."""
    xf = x.flatten(-2).to(acc_dtype(x))
    rs = torch.rsqrt(xf.square().mean(-1, keepdim=True) + norm_eps)
    return (xf * rs) @ fn.to(xf.dtype).t()


def sinkhorn(comb_logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """Row softmax (+eps), then alternate column/row normalisation, starting and ending on columns."""
    c = comb_logits.softmax(-1) + eps
    c = c / (c.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        c = c / (c.sum(-1, keepdim=True) + eps)
        c = c / (c.sum(-2, keepdim=True) + eps)
    return c


def hc_coefficients(mixes: torch.Tensor, p: HCParams, n: int, iters: int, eps: float
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """mixes [T, (2+n)n] -> pre [T, n], post [T, n], comb [T, n, n] (float32)."""
    scale, base = p.scale.to(mixes.dtype), p.base.to(mixes.dtype)
    pre = torch.sigmoid(mixes[:, :n] * scale[0] + base[:n]) + eps
    post = 2 * torch.sigmoid(mixes[:, n:2 * n] * scale[1] + base[n:2 * n])
    logits = mixes[:, 2 * n:].unflatten(-1, (n, n)) * scale[2] + base[2 * n:].view(n, n)
    return pre, post, sinkhorn(logits, iters, eps)


def hc_collapse(x: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """y = sum_i pre_i X_i, computed in float32 and returned in x's dtype."""
    return (pre.unsqueeze(-1) * x.to(pre.dtype)).sum(-2).to(x.dtype)


def hc_expand(f: torch.Tensor, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """X'_k = post_k f + sum_j comb[j, k] X_j  (comb applied transposed)."""
    a = acc_dtype(x, comb)
    mixed = torch.einsum("tjk,tjd->tkd", comb.to(a), x.to(a))
    return (post.to(a).unsqueeze(-1) * f.to(a).unsqueeze(-2) + mixed).to(x.dtype)


def hc_head_collapse(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor,
                     norm_eps: float, eps: float) -> torch.Tensor:
    """Final collapse of the streams before the norm and LM head (pre only, no Sinkhorn)."""
    mixes = hc_mixes(x, fn, norm_eps)
    pre = torch.sigmoid(mixes * scale.to(mixes.dtype) + base.to(mixes.dtype)) + eps
    return hc_collapse(x, pre)
