"""Vocabulary-parallel embedding lookup and head: each tensor-parallel rank holds a contiguous share of the rows."""

from __future__ import annotations

import torch

from ..dist.parallel import TensorParallel


def embed_lookup(weight: torch.Tensor, ids: torch.Tensor, tp: TensorParallel, dtype: torch.dtype) -> torch.Tensor:
    """Rows of `ids` from a table whose local rows are tokens [lo, lo + rows); other ranks fill the rest (zeros
    here, then one all-reduce: exact, one term is nonzero per token)."""
    if tp.size == 1:
        return weight[ids].to(dtype)
    lo = tp.rank * weight.shape[0]
    local = ids - lo
    mine = (local >= 0) & (local < weight.shape[0])
    rows = weight[local.clamp(0, weight.shape[0] - 1)].to(dtype) * mine.unsqueeze(-1).to(dtype)
    return tp.all_reduce(rows)


def gather_logits(local: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    """Every rank's share of the logits, concatenated in vocabulary order."""
    return tp.all_gather_last(local)
