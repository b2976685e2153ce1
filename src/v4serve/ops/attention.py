"""Sparse attention with a learned sink over gathered KV rows (plain-torch reference).

Each query token attends to its own list of KV rows (window positions and selected compressed entries),
given already gathered as kv [T, K, D] with a validity mask [T, K]. K = V (DeepSeek-V4's single shared head).
The per-head sink is a raw logit that enters only the softmax denominator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .backend import REFERENCE, TRITON
from .indexer import Entries
from .norm import rms_norm
from .precision import acc_dtype
from .rope import apply_rope


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


# --- the index-based entry point: pools, window-ring addressing, entry picks; reference and Triton bodies ----------

@dataclass
class WindowRefs:
    """Each token's window: `src` [T, W] indexes [the rows' rings before this step (R*W) | this step's fresh rows (T)];
    `ring_rows` [R*W] are the pool rows of the ring slots; `valid` [T, W] marks positions the token sees."""

    pool: Any  # cache.pool.RowPool (ops does not import cache): .data, .codec, .read(rows, dtype)
    src: torch.Tensor
    valid: torch.Tensor
    ring_rows: torch.Tensor


@dataclass
class EntryRefs:
    """Each token's compressed entries in a paged pool: the CSA `picks` [T, K] (entry indices, -1 = none), or, with
    picks None, every entry below `where.visible` (HCA). `where` addresses them as the indexer does (block table, token
    rows, visible counts, the static bound E_max that sizes the reference's dense gather)."""

    pool: Any
    where: Entries
    picks: torch.Tensor | None = None
    # values a backend derives from these entries alone (the kernels' staged picks: attention_stage.stage_picks),
    # kept for the other layers of the step that the caller hands this same object (V4.1's layers that read one KV
    # source with one index source's picks); None keeps nothing
    derived: dict | None = field(default=None, compare=False, repr=False)


TOKEN_CHUNK = 1024  # tokens whose KV rows the reference gathers at once (bounds long-prefill memory)


def attend_reference(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, fresh: torch.Tensor, sink: torch.Tensor,
                     scale: float, q_norm_eps: float | None, window: WindowRefs,
                     entries: EntryRefs | None) -> torch.Tensor:
    """Plain torch: (normalise,) rotate the queries, gather and decode each token's KV rows, attend with the sink,
    rotate the output back. q [T, H, D] before RoPE, fresh [T, D] this step's KV rows -> [T, H, D] in q's dtype."""
    if q_norm_eps is not None:
        q = rms_norm(q, None, q_norm_eps)
    q = apply_rope(q, cos.unsqueeze(1), sin.unsqueeze(1))
    src = torch.cat([window.pool.read(window.ring_rows, fresh.dtype), fresh])
    outs = []
    for lo in range(0, q.shape[0], TOKEN_CHUNK):
        hi = min(q.shape[0], lo + TOKEN_CHUNK)
        kv, valid = src[window.src[lo:hi]], window.valid[lo:hi]
        if entries is not None:
            if entries.picks is not None:
                j = entries.picks[lo:hi]
                ok = j >= 0
            else:
                j = torch.arange(entries.where.max_entries, device=q.device).expand(hi - lo, -1)
                ok = j < entries.where.visible[lo:hi].unsqueeze(1)
            rows = entries.where.token_rows(entries.where.token_row[lo:hi], j.clamp(min=0))
            kv = torch.cat([kv, entries.pool.read(rows, fresh.dtype)], 1)
            valid = torch.cat([valid, ok], 1)
        outs.append(sparse_attention(q[lo:hi], kv, valid, sink, scale))
    o = torch.cat(outs) if len(outs) > 1 else outs[0]
    return apply_rope(o, cos.unsqueeze(1), sin.unsqueeze(1), inverse=True)


def attend(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, fresh: torch.Tensor, sink: torch.Tensor,
           scale: float, q_norm_eps: float | None, window: WindowRefs, entries: EntryRefs | None,
           backend: str = REFERENCE) -> torch.Tensor:
    """The attention of one layer and step (see attend_reference); `backend` picks the body (ops.backend)."""
    if backend == TRITON:
        from .kernels import attention as kernel

        kinds = (window.pool.codec.kind,) + ((entries.pool.codec.kind,) if entries is not None else ())
        if kernel.supports(q, kinds):
            return kernel.attend(q, cos, sin, fresh, sink, scale, q_norm_eps, window, entries)
    return attend_reference(q, cos, sin, fresh, sink, scale, q_norm_eps, window, entries)
