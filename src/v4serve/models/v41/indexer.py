"""V4.1's two-level sparse selection of compressed entries, shared across layers.

* Index sources score every visible entry of their KV source: score(t, j) = sum_h w[t,h] relu(q[t,h] . k[j]),
  with index keys k derived from the source's compressor latent (`wk`, `k_norm`, RoPE at the entry position,
  MXFP4) and queries from the layer's own `wq_b` (RoPE at the query position, MXFP4); w = weights_proj(x) *
  d^-1/2 * H^-1/2.
* The candidate source (layer 20) turns its scores into *blocks* of `candidate_block_size` consecutive entries
  (block score = max), forces the block holding the query's newest visible entry in, keeps the top
  `candidate_topk_blocks` blocks and publishes them as a per-query mask. Its own selection is the dense top-k.
* Later index sources mask their scores to the published blocks before their top-k; layers between index sources
  reuse the last source's selection (`Selection` carries it from layer to layer, restricted with the tokens when
  the decoder layers run on a suffix of the step).
Ties break toward the lower index (ops.indexer.ordered_keys), so the selection does not depend on how many
entries a step's tensors hold: chunked prefill selects exactly what one-shot prefill selects.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ...ops.indexer import ordered_keys, select_topk

NEG_INF = float("-inf")


@dataclass
class Selection:
    """What index sources publish to the layers after them within one step."""

    topk: torch.Tensor | None = None  # [T, k] entry indices (-1 = none) of the last index source
    candidates: torch.Tensor | None = None  # [T, E] bool: entries inside the candidate blocks

    def restrict(self, kept: torch.Tensor) -> Selection:
        return Selection(None if self.topk is None else self.topk[kept],
                         None if self.candidates is None else self.candidates[kept])


def mask_invisible(scores: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    j = torch.arange(scores.shape[1], device=scores.device)
    return scores.masked_fill(j.unsqueeze(0) >= visible.unsqueeze(1), NEG_INF)


def candidate_blocks(scores: torch.Tensor, visible: torch.Tensor, topk_blocks: int, block: int) -> torch.Tensor:
    """scores [T, E] (invisible entries -inf), visible [T] -> bool [T, E] mask of the kept blocks' entries.

    A block that holds no visible entry scores -inf and is never kept; the block of entry visible-1 is forced in.
    The mask covers visible entries only (the newest block's not-yet-complete tail is left out).
    """
    T, E = scores.shape
    blocks = F.pad(scores.float(), (0, -E % block), value=NEG_INF).unflatten(-1, (-1, block)).amax(-1)  # [T, NB]
    nb = blocks.shape[1]
    newest = torch.div(visible - 1, block, rounding_mode="floor")  # -1 when nothing is visible: no block forced
    forced = torch.arange(nb, device=scores.device).unsqueeze(0) == newest.unsqueeze(1)
    blocks = blocks.masked_fill(forced, float("inf"))
    top = ordered_keys(blocks).topk(min(topk_blocks, nb), dim=-1).indices
    keep = torch.zeros(T, nb, dtype=torch.bool, device=scores.device)
    keep.scatter_(1, top, torch.gather(blocks, 1, top) > NEG_INF)
    j = torch.arange(E, device=scores.device)
    return keep.repeat_interleave(block, dim=1)[:, :E] & (j.unsqueeze(0) < visible.unsqueeze(1))


def select_entries(scores: torch.Tensor, visible: torch.Tensor, k: int,
                   candidates: torch.Tensor | None) -> torch.Tensor:
    """Top-k visible entries (inside the candidate blocks when given) -> [T, min(k, E)], -1 for empty picks."""
    masked = mask_invisible(scores, visible)
    if candidates is not None:
        masked = masked.masked_fill(~candidates, NEG_INF)
    idx = select_topk(masked, visible, k)
    if candidates is not None:  # fewer candidates than k: picks outside the blocks are empty, not entries
        ok = torch.gather(masked, 1, idx.clamp(min=0)) > NEG_INF
        idx = torch.where(ok, idx, torch.full_like(idx, -1))
    return idx
