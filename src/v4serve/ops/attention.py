"""Sparse attention with a learned sink over gathered KV rows (plain-torch reference).

Each query token attends to its own list of KV rows (window positions and selected compressed entries),
given already gathered as kv [T, K, D] with a validity mask [T, K]. K = V (DeepSeek-V4's single shared head).
The per-head sink is a raw logit that enters only the softmax denominator.
"""

from __future__ import annotations

import torch

from .precision import acc_dtype


def sparse_attention(q: torch.Tensor, kv: torch.Tensor, valid: torch.Tensor, sink: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """q [T, H, D], kv [T, K, D], valid [T, K] bool, sink [H] -> out [T, H, D] (q's dtype)."""
    a = acc_dtype(q, kv)
    s = torch.einsum("thd,tkd->thk", q.to(a), kv.to(a)) * scale
    s = s.masked_fill(~valid.unsqueeze(1), float("-inf"))
    sink_l = sink.to(a).view(1, -1, 1).expand(s.shape[0], -1, 1)
    m = torch.maximum(s.amax(-1, keepdim=True), sink_l)
    p = torch.exp(s - m)
    denom = p.sum(-1, keepdim=True) + torch.exp(sink_l - m)
    out = torch.einsum("thk,tkd->thd", p / denom, kv.to(a))
    return out.to(q.dtype)


def sparse_attention_chunked(q: torch.Tensor, gather, sink: torch.Tensor, scale: float, chunk: int) -> torch.Tensor:
    """Bound memory on long prefills: `gather(lo, hi)` returns (kv, valid) for tokens [lo, hi)."""
    T = q.shape[0]
    if T <= chunk:
        kv, valid = gather(0, T)
        return sparse_attention(q, kv, valid, sink, scale)
    outs = []
    for lo in range(0, T, chunk):
        hi = min(T, lo + chunk)
        kv, valid = gather(lo, hi)
        outs.append(sparse_attention(q[lo:hi], kv, valid, sink, scale))
    return torch.cat(outs)
