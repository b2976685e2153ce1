"""Gated pooling of `ratio` consecutive positions into one compressed entry, for many rows at once.

Each position p contributes kv_p and a score s_p (score includes the APE bias of p mod ratio). Entry j pools
positions [j*m, (j+1)*m) with a per-channel softmax of the scores. With *overlap* (V4 CSA) each position's
vectors are two halves A | B and entry j pools the A halves of group j-1 and the B halves of group j (2m
slots). Positions before this step's rows come from the per-request state: the current partial group and,
with overlap, the previous complete group. All shapes are static given (T, R): groups are padded to
`T // m + R` and the padding writes nowhere (it is routed to the trash row).

The state is indexed by position: position p keeps (kv, score) at `state_index(p)` (p mod m, and with overlap the
group's parity picks one of two halves), so a step writes only its own tokens' positions, never shifting the
partial group; which positions are live follows from the row's start (those in the last one or two groups before
it), so stale slots are never read.

`pool_groups` is the entry point: the plain-torch reference composes the pieces below; the Triton body
(ops/kernels/compressor.py) pools every group in one launch and writes the new positions in a second.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from .backend import REFERENCE, TRITON
from .indexer import Entries


class StepRows(Protocol):
    """What the compressor reads of a step (models.step.StepInput has these; ops does not import models)."""

    row_start: torch.Tensor  # [R] position of each row's first token in this step
    row_len: torch.Tensor  # [R] tokens of the row in this step
    row_offset: torch.Tensor  # [R] flat index of the row's first token
    row_slot: torch.Tensor  # [R] state slot of each row
    positions: torch.Tensor  # [T]
    token_row: torch.Tensor  # [T] the row of each token
    block_table: torch.Tensor  # [R, max_blocks] physical block of each logical block (-1 unused)
    cached_len: torch.Tensor  # [R] entries of groups ending at or before this position are already cached
    one_token_rows: bool  # no row has more than one token this step (the Triton body's one-launch decode form)

    @property
    def num_tokens(self) -> int: ...

    @property
    def num_rows(self) -> int: ...


@dataclass
class Groups:
    row: torch.Tensor  # [G] row of each (padded) group
    entry: torch.Tensor  # [G] entry index j within the request
    valid: torch.Tensor  # [G] bool


def completed_groups(step: StepRows, ratio: int) -> Groups:
    """Every group whose last position falls in this step, padded to a static count."""
    m = ratio
    s = step.row_start
    e = s + step.row_len
    first = torch.div(s, m, rounding_mode="floor")
    count = torch.div(e, m, rounding_mode="floor") - first
    cum = torch.cumsum(count, 0)
    g_max = step.num_tokens // m + step.num_rows
    g = torch.arange(g_max, device=s.device)
    row = torch.searchsorted(cum, g, right=True).clamp(max=step.num_rows - 1)
    before = cum[row] - count[row]
    entry = first[row] + (g - before)
    valid = g < cum[-1]
    return Groups(row, entry, valid)


def state_index(pos: torch.Tensor, m: int, overlap: bool) -> torch.Tensor:
    """Where position pos lives in its row's state ([2m] with overlap: the group's parity picks the half)."""
    if overlap:
        return torch.remainder(torch.div(pos, m, rounding_mode="floor"), 2) * m + torch.remainder(pos, m)
    return torch.remainder(pos, m)


class PositionSource:
    """Maps (row, position) to a row of [state rows of the step's requests | fresh tokens | sentinel]."""

    def __init__(self, step: StepRows, ratio: int, overlap: bool):
        self.step, self.m, self.overlap = step, ratio, overlap
        self.per_row = (2 if overlap else 1) * ratio
        self.n_state = step.num_rows * self.per_row
        self.sentinel = self.n_state + step.num_tokens

    def index(self, row: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        st = self.step
        m = self.m
        s = st.row_start[row]
        live_from = torch.div(s, m, rounding_mode="floor") * m - (m if self.overlap else 0)
        base = row * self.per_row
        idx = torch.full_like(pos, self.sentinel)
        fresh = (pos >= s) & (pos < s + st.row_len[row])
        idx = torch.where(fresh, self.n_state + st.row_offset[row] + (pos - s), idx)
        in_state = (pos < s) & (pos >= live_from) & (pos >= 0)
        return torch.where(in_state, base + state_index(pos.clamp(min=0), m, self.overlap), idx)

    def table(self, state_kv: torch.Tensor, state_score: torch.Tensor, kv: torch.Tensor, score: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Concatenate [state rows | fresh | sentinel] for kv (sentinel 0) and score (sentinel -inf)."""
        slots = self.step.row_slot
        w = kv.shape[-1]
        skv = state_kv[slots].reshape(-1, w)
        ssc = state_score[slots].reshape(-1, w)
        zero = kv.new_zeros(1, w)
        ninf = score.new_full((1, w), float("-inf"))
        return torch.cat([skv, kv, zero]), torch.cat([ssc, score, ninf])


def pool_entries(kv_src: torch.Tensor, score_src: torch.Tensor, src: PositionSource, groups: Groups,
                 head_dim: int) -> torch.Tensor:
    """Pooled (pre-norm) entries [G, head_dim] in float32."""
    m = src.m
    i = torch.arange(m, device=groups.row.device)
    cur_pos = groups.entry.unsqueeze(1) * m + i  # [G, m]
    rows = groups.row.unsqueeze(1).expand_as(cur_pos)
    cur = src.index(rows, cur_pos)
    if src.overlap:
        prev = src.index(rows, cur_pos - m)
        kv = torch.cat([kv_src[prev][..., :head_dim], kv_src[cur][..., head_dim:]], dim=1)
        sc = torch.cat([score_src[prev][..., :head_dim], score_src[cur][..., head_dim:]], dim=1)
    else:
        kv, sc = kv_src[cur], score_src[cur]
    w = torch.softmax(sc, dim=1)
    out = (kv * w).sum(1)
    return torch.nan_to_num(out, nan=0.0)  # padded groups (all slots empty) pool to 0, never NaN


def write_state(kv: torch.Tensor, score: torch.Tensor, step: StepRows, state_kv: torch.Tensor,
                state_score: torch.Tensor, ratio: int, overlap: bool) -> None:
    """Store this step's positions that the next steps read: those from the start of the row's last group (with
    overlap, the one before it as well) to its end. The others go to the trash slot (the state's last row)."""
    m = ratio
    row_end = (step.row_start + step.row_len)[step.token_row]
    keep_from = torch.div(row_end, m, rounding_mode="floor") * m - (m if overlap else 0)
    pos = step.positions
    slot = torch.where(pos >= keep_from, step.row_slot[step.token_row],
                       torch.full_like(pos, state_kv.shape[0] - 1))
    idx = state_index(pos, m, overlap)
    state_kv[slot, idx] = kv.to(state_kv.dtype)
    state_score[slot, idx] = score.to(state_score.dtype)


def dest_rows(step: StepRows, groups: Groups, where: Entries) -> torch.Tensor:
    """The pool row each group's entry is written to: where its row's entries live (`where`, the addressing the
    readers use; an unmapped block is the trash block), or the trash block's row for padding and for entries the
    prefix cache already holds (never rewritten)."""
    j = groups.entry.clamp(min=0)
    fresh = groups.valid & ((groups.entry + 1) * where.ratio > step.cached_len[groups.row])
    rows = where.token_rows(groups.row, j.unsqueeze(1)).squeeze(1)
    return torch.where(fresh, rows, where.num_blocks * where.per_block + j % where.per_block)


def pool_groups_reference(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor | None, step: StepRows,
                          groups: Groups, state_kv: torch.Tensor, state_score: torch.Tensor, ratio: int,
                          overlap: bool, head_dim: int, out_dtype: torch.dtype) -> torch.Tensor:
    if ape is not None:
        score = score + ape[step.positions % ratio]
    src = PositionSource(step, ratio, overlap)
    kv_src, score_src = src.table(state_kv, state_score, kv, score)
    pooled = pool_entries(kv_src, score_src, src, groups, head_dim)
    write_state(kv, score, step, state_kv, state_score, ratio, overlap)
    return pooled.to(out_dtype)


def pool_groups(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor | None, step: StepRows, groups: Groups,
                state_kv: torch.Tensor, state_score: torch.Tensor, ratio: int, overlap: bool, head_dim: int,
                out_dtype: torch.dtype, backend: str = REFERENCE) -> torch.Tensor:
    """Pool every group completed in this step and carry each row's partial group in the state.

    kv, score [T, C * head_dim] (C = 2 with overlap) are this step's projections (score before the APE bias `ape`
    [ratio, C * head_dim], added here); `groups` = completed_groups(step, ratio) (the same for every layer of a
    ratio, so the caller computes it once per step); state_kv / state_score [slots + 1, C * ratio, C * head_dim] hold
    each row's earlier positions (state_index) and receive this step's positions that later steps read. Returns
    the pooled (pre-norm) entries [len(groups), head_dim] in out_dtype; padded groups' values are unspecified (their
    rows, dest_rows, are the trash block's).
    """
    if backend == TRITON:
        from .kernels import compressor as kernel

        if kernel.supports(kv, state_kv):
            return kernel.pool_groups(kv, score, ape, step, groups, state_kv, state_score, ratio, overlap, head_dim,
                                      out_dtype)
    return pool_groups_reference(kv, score, ape, step, groups, state_kv, state_score, ratio, overlap, head_dim,
                                 out_dtype)
