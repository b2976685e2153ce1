"""Lightning-indexer scoring and top-k selection of compressed entries (plain-torch reference).

score(t, j) = sum_h w[t, h] * relu(q[t, h] . k[j]); entries a query cannot see yet are -inf; the top-k of the
visible ones are kept and any pick beyond the visible count becomes -1.
"""

from __future__ import annotations

import torch

from .precision import acc_dtype


def index_scores(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """q [T, h, d], w [T, h], keys [T, E, d] (each token's row of keys) -> [T, E] float32."""
    a = acc_dtype(q, keys)
    s = torch.einsum("thd,ted->the", q.to(a), keys.to(a)).relu_()
    return torch.einsum("the,th->te", s, w.to(a))


def ordered_keys(scores: torch.Tensor) -> torch.Tensor:
    """int64 keys that sort like the float32 scores, ties broken toward the lower index.

    Scores tie exactly and often (ReLU zeros, FP4-simulated operands); breaking ties by index makes the
    selection independent of how many entries the tensor holds, so chunked prefill equals one-shot prefill.
    """
    E = scores.shape[-1]
    bits = (scores.float() + 0.0).contiguous().view(torch.int32)  # + 0.0 folds -0.0 into +0.0
    ordered = (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(torch.int64)
    j = torch.arange(E, device=scores.device, dtype=torch.int64)
    return (ordered << 32) | (E - 1 - j)


def select_topk(scores: torch.Tensor, visible: torch.Tensor, k: int) -> torch.Tensor:
    """scores [T, E], visible [T] entry counts -> indices [T, min(k, E)] with -1 for picks beyond `visible`."""
    E = scores.shape[1]
    kk = min(k, E)
    if kk == 0:
        return torch.zeros(scores.shape[0], 0, dtype=torch.long, device=scores.device)
    j = torch.arange(E, device=scores.device)
    masked = scores.masked_fill(j.unsqueeze(0) >= visible.unsqueeze(1), float("-inf"))
    idx = ordered_keys(masked).topk(kk, dim=-1).indices
    return torch.where(idx < visible.unsqueeze(1), idx, torch.full_like(idx, -1))
