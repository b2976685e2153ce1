"""V4.1's two-level sparse selection of compressed entries, shared across layers.

* Index sources score every visible entry of their KV source: score(t, j) = sum_h w[t,h] relu(q[t,h] . k[j]),
  with index keys k derived from the source's compressor latent (`wk`, `k_norm`, RoPE at the entry position,
  MXFP4) and queries from the layer's own `wq_b` (RoPE at the query position, MXFP4); w = weights_proj(x) *
  d^-1/2 * H^-1/2.
* The candidate source (layer 20) turns its scores into *blocks* of `candidate_block_size` consecutive entries
  (block score = max), forces the block holding the query's newest visible entry in, keeps the top
  `candidate_topk_blocks` blocks and publishes them per query (as block ids: [T, 2048] rather than a [T, E]
  mask, which at 1M context would be a gigabyte per thousand tokens). Its own selection is the dense top-k.
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

from ...ops.indexer import index_scores, ordered_keys, select_topk

NEG_INF = float("-inf")


ENTRY_CHUNK = 4096  # entries scored at once per token chunk (bounds the [tokens, heads, entries] intermediate)


@dataclass
class Selection:
    """What index sources publish to the layers after them within one step."""

    topk: torch.Tensor | None = None  # [T, k] entry indices (-1 = none) of the last index source
    blocks: torch.Tensor | None = None  # [T, candidate_topk_blocks] candidate block ids (-1 = none)

    def restrict(self, kept: torch.Tensor) -> Selection:
        return Selection(None if self.topk is None else self.topk[kept],
                         None if self.blocks is None else self.blocks[kept])


def mask_invisible(scores: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    j = torch.arange(scores.shape[1], device=scores.device)
    return scores.masked_fill(j.unsqueeze(0) >= visible.unsqueeze(1), NEG_INF)


def tiled_scores(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, token_row: torch.Tensor) -> torch.Tensor:
    """Index scores [t, E] of tokens q [t, h, d] / w [t, h] against their rows' keys [R, E, d], in entry tiles."""
    E = keys.shape[1]
    if E <= ENTRY_CHUNK:
        return index_scores(q, w, keys[token_row])
    return torch.cat([index_scores(q, w, keys[token_row, lo:lo + ENTRY_CHUNK]) for lo in range(0, E, ENTRY_CHUNK)],
                     dim=1)


def candidate_blocks(scores: torch.Tensor, visible: torch.Tensor, topk_blocks: int, block: int) -> torch.Tensor:
    """scores [T, E] (invisible entries -inf), visible [T] -> the kept blocks' ids [T, topk_blocks] (-1 = none).

    Block score = max over its entries; a block with no visible entry scores -inf and is never kept; the block of
    entry visible-1 (the query's newest) is forced in.
    """
    E = scores.shape[1]
    blocks = F.pad(scores.float(), (0, -E % block), value=NEG_INF).unflatten(-1, (-1, block)).amax(-1)  # [T, NB]
    nb = blocks.shape[1]
    newest = torch.div(visible - 1, block, rounding_mode="floor")  # -1 when nothing is visible: no block forced
    forced = torch.arange(nb, device=scores.device).unsqueeze(0) == newest.unsqueeze(1)
    blocks = blocks.masked_fill(forced, float("inf"))
    top = ordered_keys(blocks).topk(min(topk_blocks, nb), dim=-1).indices
    top = torch.where(torch.gather(blocks, 1, top) > NEG_INF, top, torch.full_like(top, -1))
    return F.pad(top, (0, topk_blocks - top.shape[1]), value=-1)


def candidate_mask(blocks: torch.Tensor, n_entries: int, block: int, visible: torch.Tensor) -> torch.Tensor:
    """Block ids [t, K] -> bool [t, E]: the visible entries inside the kept blocks."""
    nb = -(-n_entries // block)
    keep = torch.zeros(blocks.shape[0], nb + 1, dtype=torch.bool, device=blocks.device)
    keep.scatter_(1, torch.where(blocks >= 0, blocks, torch.full_like(blocks, nb)), True)
    j = torch.arange(n_entries, device=blocks.device)
    return keep[:, :nb].repeat_interleave(block, dim=1)[:, :n_entries] & (j.unsqueeze(0) < visible.unsqueeze(1))


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
