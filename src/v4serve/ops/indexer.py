"""The lightning indexer: score every compressed entry a query can see and keep the top-k (one entry point, two bodies).

score(t, j) = sum_h w[t, h] * relu(q[t, h] . k[j]) for the entries j < visible[t] of the token's row; the top-k are
returned in descending score order, ties broken toward the lower index, and any pick beyond the visible count is -1.

`index_topk` reads the index keys where they live: the paged pool of one compressor layer, in its stored record
format (cache/formats.py), addressed through each row's block table. The plain-torch reference decodes every entry up
to the static bound E_max (as the model did before); the Triton body (ops/kernels/indexer.py) reads, scores and
selects only each token's visible entries, in two launches with no host synchronisation. The body is chosen once per
module (ops.backend) and handed in as `backend`.

V4.1's candidate level (models/v41/indexer.py) rides on the same entry point: `publish` also returns the top blocks
of `block` consecutive entries (block score = max, the query's newest block forced in), and `candidates` restricts
a later source's selection to the published blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F

from . import backend as kernels
from .precision import acc_dtype, hi_lo

if TYPE_CHECKING:  # ops does not import cache at run time (cache imports ops.quant)
    from ..cache.formats import Codec

NEG_INF = float("-inf")
TOKEN_CHUNK = 1024  # reference: tokens scored at once (bounds long-prefill memory)
ENTRY_CHUNK = 4096  # reference: entries scored at once per token chunk (bounds the [tokens, heads, entries] product)


class KeyPool(Protocol):
    """A pool of index-key records (cache.pool.RowPool): rows of `codec`'s stored format."""

    data: torch.Tensor
    codec: Codec


@dataclass(frozen=True)
class Entries:
    """Where each token's compressed entries live. Entry j of row r sits in block block_table[r, j*ratio // block_size]
    (-1 = unallocated: the trash block `num_blocks`), at row block * (block_size // ratio) + j % (block_size // ratio)
    of the pool, as KVPools.entry_rows addresses them. The attention reads its entries through the same object
    (ops.attention.EntryRefs)."""

    block_table: torch.Tensor  # [R, nb] int
    token_row: torch.Tensor  # [T] int64
    visible: torch.Tensor  # [T] int64: entries the token may see (groups complete at or before its position)
    ratio: int
    block_size: int
    num_blocks: int
    max_entries: int  # E_max, a static bound on `visible`: sizes outputs (CUDA graphs), never the kernels' work

    @property
    def per_block(self) -> int:
        return self.block_size // self.ratio

    def token_rows(self, token_row: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """Pool rows of entries j [t, n] (>= 0) of the rows token_row [t]."""
        bt = self.block_table
        col = (j * self.ratio // self.block_size).clamp(0, bt.shape[1] - 1)
        blocks = bt[token_row.unsqueeze(1), col].long()
        blocks = torch.where(blocks < 0, torch.full_like(blocks, self.num_blocks), blocks)
        return blocks * self.per_block + j % self.per_block

    def rows(self) -> torch.Tensor:
        """Pool rows [R, E_max] of every row's entries 0..E_max-1 (the reference's dense addressing)."""
        R = self.block_table.shape[0]
        j = torch.arange(self.max_entries, device=self.block_table.device)
        return self.token_rows(torch.arange(R, device=j.device), j.unsqueeze(0).expand(R, -1))


# --- the reference pieces ------------------------------------------------------------------------------------------

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


# --- the entry point -----------------------------------------------------------------------------------------------

def weighted_heads(w: torch.Tensor, w_scale: float) -> torch.Tensor:
    """The head weights the scores use: w as given, or widened to the accumulation dtype and times w_scale."""
    if w_scale == 1.0:
        return w
    hi, lo = hi_lo(w_scale)  # the two float32 parts the kernel gets
    return w.to(acc_dtype(w)) * (hi + lo)


def index_topk_reference(q: torch.Tensor, w: torch.Tensor, keys: KeyPool, entries: Entries, k: int,
                         candidates: torch.Tensor | None = None, publish: int = 0, block: int = 1,
                         q_scale: torch.Tensor | None = None, w_scale: float = 1.0,
                         w_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Plain torch: decode the keys of every entry up to E_max, score them a chunk of tokens at a time, select."""
    w = weighted_heads(w if w_dtype is None else w.to(w_dtype), w_scale)
    if q_scale is not None:  # FP8 queries with one scale per (token, head)
        q = q.float() * q_scale.float().unsqueeze(-1)
    T, E = q.shape[0], entries.max_entries
    rows = entries.rows()
    kv = keys.codec.decode(keys.data[rows.reshape(-1)], q.dtype).view(*rows.shape, keys.codec.dim)  # [R, E, d]
    picks = [torch.empty(0, min(k, E), dtype=torch.long, device=q.device)]
    blocks = [torch.empty(0, publish, dtype=torch.long, device=q.device)]
    for lo in range(0, T, TOKEN_CHUNK):
        hi = min(T, lo + TOKEN_CHUNK)
        scores, vis = tiled_scores(q[lo:hi], w[lo:hi], kv, entries.token_row[lo:hi]), entries.visible[lo:hi]
        if publish:
            blocks.append(candidate_blocks(mask_invisible(scores, vis), vis, publish, block))
        cands = None if candidates is None else candidate_mask(candidates[lo:hi], E, block, vis)
        picks.append(select_entries(scores, vis, k, cands))
    return torch.cat(picks), (torch.cat(blocks) if publish else None)


def index_topk(q: torch.Tensor, w: torch.Tensor, keys: KeyPool, entries: Entries, k: int, *,
               candidates: torch.Tensor | None = None, publish: int = 0, block: int = 1,
               q_scale: torch.Tensor | None = None, w_scale: float = 1.0, w_dtype: torch.dtype | None = None,
               backend: str = kernels.REFERENCE) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The top-k of each token's visible entries -> (idx [T, min(k, E_max)] int64, -1 = none; blocks or None).

    q [T, h, d] ready to score (RoPE'd, rotated / FP4-simulated as the model's numerics say), or FP8 e4m3 with
    `q_scale` [T, h] (one scale per query row); w [T, h] head weights, times `w_scale` in the accumulation dtype
    (`weighted_heads`: the kernels apply it as they load w, no launch of its own); w_dtype: w is rounded to it first
    (float32 sums of a stacked GEMM whose own output dtype this is: the kernels round as they load, no copy);
    `keys` the source layer's index-key pool.
    candidates [T, Kc]: distinct ids of blocks of `block` entries (-1 = none) outside which nothing is selected.
    publish > 0: also the top `publish` blocks of `block` entries [T, publish] (candidate_blocks; -1 = none).
    """
    if backend == kernels.TRITON:
        from .kernels import indexer as kernel

        if w_dtype is not None and w_dtype != w.dtype and not kernels.fused("head_weight_round"):  # A/B: a copy
            w, w_dtype = w.to(w_dtype), None
        if kernel.supports(q, w, keys, entries, candidates, publish, block, q_scale):
            return kernel.index_topk(q, w, keys, entries, k, candidates=candidates, publish=publish, block=block,
                                     q_scale=q_scale, w_scale=w_scale, w_dtype=w_dtype)
    return index_topk_reference(q, w, keys, entries, k, candidates, publish, block, q_scale, w_scale, w_dtype)
