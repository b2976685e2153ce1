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
The scoring, the candidate blocks and the masked selection are ops.indexer.index_topk (`publish=` on the candidate
source, `candidates=` on later sources; the Triton body walks only the published blocks); this module keeps what
the layers hand to each other.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...ops.indexer import candidate_blocks, candidate_mask

__all__ = ["Selection", "candidate_blocks", "candidate_mask"]  # the block-level pieces live in ops.indexer


@dataclass
class Selection:
    """What index sources publish to the layers after them within one step."""

    topk: torch.Tensor | None = None  # [T, k] entry indices (-1 = none) of the last index source
    blocks: torch.Tensor | None = None  # [T, candidate_topk_blocks] candidate block ids (-1 = none)

    def restrict(self, kept: torch.Tensor) -> Selection:
        return Selection(None if self.topk is None else self.topk[kept],
                         None if self.blocks is None else self.blocks[kept])
