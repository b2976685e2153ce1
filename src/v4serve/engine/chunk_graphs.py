"""CUDA graphs for steps with prompt tokens (prefill chunks, alone or beside decode rows): one per token bucket.

An eager step is host bound on the H200: ~40 launches a layer, each ~70-120 us of Python and Triton launch path, so
a 43-layer step spends ~120 ms on the host for 10-50 ms of GPU work (RESULTS.md, eighteenth and twenty-second
sessions). A chunk graph replays the whole forward of a step of up to T tokens for one host copy of its inputs.

Each bucket T is captured over a static packed step of T tokens, `rows` rows and `rows` logits indices (the table
max_model_len / block_size wide). A step of T' <= T tokens in R < rows rows is packed as its own rows first, then one
padding row holding the T - T' padding tokens (positions 0.., the trash slot, no blocks: its window rows, compressed
entries and index keys go to the trash slot and block, which only padding reads), then empty rows; its logits indices
are padded with token 0's and only the first ones are returned. Every row's result is its own (the exactness tests:
batched = solo), so the step's rows get what an eager step of theirs gives over the same kernels. Sampling runs
after the replay, as for the decode graphs (engine/graphs.py, whose capture, replay and CPU stand-ins these share).

Not graphed (they run eagerly): steps that want every position's logits (prompt logprobs), steps more than the
largest bucket, and V4.1 steps that trim the decoder layers to a suffix (SWA bounded replay: the kept tokens are a
data-dependent subset); world size 1 only (the tensor-parallel workers replay decode graphs only).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..models.step import RowSpec, StepLayout, pack_step
from .graphs import DecodeGraphs, GraphInput


class ChunkGraphs(DecodeGraphs):
    def __init__(self, model: torch.nn.Module, pools, sizes: tuple[int, ...], rows: int, max_model_len: int,
                 num_blocks: int, block_size: int, device: torch.device, engram_lookback: int = 0,
                 stand_ins: bool = False):
        """`sizes`: the token buckets; `rows`: every bucket's rows and logits rows (the engine: max_num_seqs + 1, so
        that a step of every running request still leaves the padding row)."""
        self.rows = rows
        super().__init__(model, pools, sizes, max_model_len, num_blocks, block_size, device,
                         engram_lookback=engram_lookback, stand_ins=stand_ins)

    def padding(self, tokens: int, rows: int) -> list[RowSpec]:
        """What follows a step's `rows` rows: the row of `tokens` padding tokens, then empty rows up to `self.rows`."""
        trash = self.pools.trash_slot
        return [RowSpec([0] * tokens, 0, trash, [], logits="none")] + \
            [RowSpec([], 0, trash, [], logits="none")] * (self.rows - rows - 1)

    def static_layout(self, bucket: int) -> tuple[torch.Tensor, StepLayout]:
        return pack_step(self.padding(bucket, 0), width=self.max_blocks, logits=self.rows)

    def prepare(self, sched, rows: list[RowSpec], step_hook=None, bucket: int | None = None,
                width: dict[int, int] | None = None) -> GraphInput | None:
        """The host side of a replay (None when the step does not qualify): the smallest bucket that holds the step's
        tokens, the step packed with its padding."""
        R, T = len(rows), sum(len(r.token_ids) for r in rows)
        if any(r.logits == "all" or r.decoder_floor > r.start for r in rows) \
                or any(r.request.params.prompt_logprobs is not None for r in sched.rows):
            return None
        b, widest = self.bucket(T), max((len(r.blocks) for r in rows), default=0)
        if b is None or R >= self.rows or widest > self.max_blocks:
            return None
        extras = replace(self.steps[b], engram_prev_ids=None)  # what the hook adds, for the step's own tokens
        if step_hook is not None:
            step_hook(sched, extras)
        if extras.engram_rows is not None or (extras.engram_prev_ids is None) != (self.engram is None):
            return None  # inputs the graphs were not captured with
        used = max(widest, self.width[b])
        packed, layout = pack_step(rows + self.padding(b - T, R), width=used, logits=self.rows)
        logits = sum(1 for r in rows if r.logits == "last" and r.token_ids)
        return GraphInput(b, logits, packed, layout.flat, used, widest, extras.engram_prev_ids)
