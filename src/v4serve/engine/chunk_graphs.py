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

V4.1's SWA bounded replay trims the decoder layers to a suffix of each row (positions >= its decoder_floor). Eagerly
the model finds the kept tokens on the device (`StepInput.restrict_to_suffix`: a sync); here the runner's rows say
them on the host, so a trimmed step is packed twice — the whole step for the encoder layers (T tokens) and the decoder
layers' sub-step (K tokens: each row's suffix, then padding) with the kept tokens' flat indices (padding: the whole
step's last token, a padding token: T > the step's tokens) — and replays the graph of bucket (T, K), captured with
`StepInput.decoder_step` / `decoder_kept` set. Untrimmed steps take the buckets (T, 0). A bounded-replay hit turn keeps
about a window of tokens a prompt row (its last 128): the decoder layers run on a small K.

Not graphed (they run eagerly): steps that want every position's logits (prompt logprobs), steps over the largest
bucket; world size 1 only (the tensor-parallel workers replay decode graphs only).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..models.step import RowSpec, StepLayout, pack_step
from .graphs import DecodeGraphs, GraphInput


class ChunkGraphs(DecodeGraphs):
    KIND = "prompt-step"  # buckets: (tokens, decoder tokens)

    def __init__(self, model: torch.nn.Module, pools, sizes: tuple[int, ...], rows: int, max_model_len: int,
                 num_blocks: int, block_size: int, device: torch.device, engram_lookback: int = 0,
                 stand_ins: bool = False, trimmed: bool = False):
        """`sizes`: the token buckets; `rows`: every bucket's rows and logits rows (the engine: max_num_seqs + 1, so
        that a step of every running request still leaves the padding row); `trimmed` (V4.1 with bounded replay):
        also the buckets (T, K) of trimmed steps, K <= T both among `sizes`."""
        self.rows, self.trimmed = rows, trimmed
        super().__init__(model, pools, sizes, max_model_len, num_blocks, block_size, device,
                         engram_lookback=engram_lookback, stand_ins=stand_ins)

    def buckets(self, sizes) -> list[tuple[int, int]]:
        ts = sorted({t for t in sizes if t >= 1})
        return sorted([(t, 0) for t in ts] + ([(t, k) for t in ts for k in ts if k <= t] if self.trimmed else []))

    @staticmethod
    def tokens(bucket: tuple[int, int]) -> int:
        return bucket[0]

    def padding(self, tokens: int, rows: int) -> list[RowSpec]:
        """What follows a step's `rows` rows: the row of `tokens` padding tokens, then empty rows up to `self.rows`."""
        trash = self.pools.trash_slot
        return [RowSpec([0] * tokens, 0, trash, [], logits="none")] + \
            [RowSpec([], 0, trash, [], logits="none")] * (self.rows - rows - 1)

    def static_layout(self, bucket: tuple[int, int]) -> tuple[torch.Tensor, StepLayout]:
        return pack_step(self.padding(bucket[0], 0), width=self.max_blocks, logits=self.rows)

    def add_static(self, bucket: tuple[int, int]) -> None:
        """A trimmed bucket's decoder sub-step and kept indices: one more static buffer (the rows' block table is the
        whole step's)."""
        T, K = bucket
        if not K:
            return
        tail, layout = self.decoder_inputs([], [], T, K)
        self.tails[bucket] = tail.to(self.device)
        step = self.steps[bucket]
        sub = layout.unpack(self.tails[bucket][:layout.size], self.max_model_len)
        step.decoder_step = replace(sub, block_table=step.block_table, decoder_trim=False)
        step.decoder_kept = self.tails[bucket][layout.size:layout.size + K]

    def decoder_inputs(self, sub_rows: list[RowSpec], kept: list[int], T: int, K: int) -> tuple[torch.Tensor,
                                                                                                 StepLayout]:
        """The decoder sub-step of `sub_rows` (no blocks: the whole step's table serves) padded to K tokens, then the
        kept indices padded with T - 1 (a padding token of the whole step), packed as one host tensor."""
        packed, layout = pack_step(sub_rows + self.padding(K - len(kept), len(sub_rows)), width=0, logits=self.rows)
        idx = kept + [T - 1] * (K - len(kept))
        return torch.cat([packed, torch.tensor(idx + [0] * (-len(idx) % 2), dtype=torch.int64)]), layout

    def prepare(self, sched, rows: list[RowSpec], step_hook=None, bucket=None,
                width: dict | None = None) -> GraphInput | None:
        """The host side of a replay (None when the step does not qualify): the smallest bucket that holds the step's
        tokens (and, trimmed, its decoder tokens), the step packed with its padding."""
        R, T = len(rows), sum(len(r.token_ids) for r in rows)
        if any(r.logits == "all" for r in rows) or R >= self.rows \
                or any(r.request.params.prompt_logprobs is not None for r in sched.rows):
            return None
        sub = None
        if any(r.decoder_floor > r.start for r in rows):  # V4.1's decoder trim
            sub = suffixes(rows) if self.trimmed else None
            if sub is None:
                return None
            K = len(sub[1])
            b = next((s for s in self.sizes if s[1] and s[0] > T and s[1] >= K), None)
        else:
            b = next((s for s in self.sizes if not s[1] and s[0] >= T), None)
        widest = max((len(r.blocks) for r in rows), default=0)
        if b is None or widest > self.max_blocks:
            return None
        extras = self.hook_inputs(sched, step_hook, b, True)
        if extras is None:
            return None
        used = max(widest, self.width[b])
        packed, layout = pack_step(rows + self.padding(b[0] - T, R), width=used, logits=self.rows)
        tail = self.decoder_inputs(sub[0], sub[1], *b)[0] if sub is not None else None
        logits = sum(1 for r in rows if r.logits == "last" and r.token_ids)
        return GraphInput(b, logits, packed, layout.flat, used, widest, extras.engram_prev_ids, tail)


def suffixes(rows: list[RowSpec]) -> tuple[list[RowSpec], list[int]] | None:
    """The decoder layers' rows of a trimmed step — each row from max(start, decoder_floor) on, its window floor
    raised to the decoder floor (`StepInput.restrict_to_suffix`'s sub-step, on the host, without blocks) — and the
    kept tokens' flat indices. None when a row wants logits of a token the trim drops (the eager step says why)."""
    sub, kept, base = [], [], 0
    for r in rows:
        n = len(r.token_ids)
        cut = min(max(r.start, r.decoder_floor), r.start + n) - r.start
        if r.logits == "last" and n and cut == n:
            return None
        sub.append(RowSpec(r.token_ids[cut:], r.start + cut, r.slot, [], window_floor=max(r.window_floor,
                           r.decoder_floor), cached_len=r.cached_len, decoder_floor=r.decoder_floor, logits=r.logits))
        kept += range(base + cut, base + n)
        base += n
    return sub, kept
