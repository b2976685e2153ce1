"""Gated pooling of `ratio` consecutive positions into one compressed entry, for many rows at once.

Each position p contributes kv_p and a score s_p (score includes the APE bias of p mod ratio). Entry j pools
positions [j*m, (j+1)*m) with a per-channel softmax of the scores. With *overlap* (V4 CSA) each position's
vectors are two halves A | B and entry j pools the A halves of group j-1 and the B halves of group j (2m
slots). Positions before this step's rows come from the per-request state: the current partial group and,
with overlap, the previous complete group. All shapes are static given (T, R): groups are padded to
`T // m + R` and the padding writes nowhere (it is routed to the trash row).

`pool_groups` is the entry point: the plain-torch reference composes the pieces below; the Triton body
(ops/kernels/compressor.py) pools every group and builds every row's next state in one launch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from .backend import REFERENCE, TRITON


class StepRows(Protocol):
    """What the compressor reads of a step (models.step.StepInput has these; ops does not import models)."""

    row_start: torch.Tensor  # [R] position of each row's first token in this step
    row_len: torch.Tensor  # [R] tokens of the row in this step
    row_offset: torch.Tensor  # [R] flat index of the row's first token
    row_slot: torch.Tensor  # [R] state slot of each row
    positions: torch.Tensor  # [T]
    block_table: torch.Tensor  # [R, max_blocks] physical block of each logical block (-1 unused)
    cached_len: torch.Tensor  # [R] entries of groups ending at or before this position are already cached

    @property
    def num_tokens(self) -> int: ...

    @property
    def num_rows(self) -> int: ...


@dataclass
class Dest:
    """Where completed entries are stored: paged rows `block * (block_size // ratio) + entry % epb`; padded groups,
    entries already cached and unmapped blocks go to the trash block `num_blocks`."""

    block_size: int
    num_blocks: int


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
        cur0 = torch.div(s, m, rounding_mode="floor") * m
        base = row * self.per_row
        cur_off = m if self.overlap else 0
        idx = torch.full_like(pos, self.sentinel)
        fresh = (pos >= s) & (pos < s + st.row_len[row])
        idx = torch.where(fresh, self.n_state + st.row_offset[row] + (pos - s), idx)
        in_cur = (pos < s) & (pos >= cur0)
        idx = torch.where(in_cur, base + cur_off + pos % m, idx)
        if self.overlap:
            in_prev = (pos < cur0) & (pos >= cur0 - m) & (pos >= 0)
            idx = torch.where(in_prev, base + pos % m, idx)
        return idx

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


def next_state(kv_src: torch.Tensor, score_src: torch.Tensor, src: PositionSource
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The state after this step, per row: [R, slots, width] (partial group; with overlap, the last group first)."""
    st, m = src.step, src.m
    e = st.row_start + st.row_len
    cur0 = torch.div(e, m, rounding_mode="floor") * m
    i = torch.arange(m, device=e.device)
    rows = torch.arange(st.num_rows, device=e.device).unsqueeze(1).expand(-1, m)
    cur_pos = cur0.unsqueeze(1) + i
    cur = src.index(rows, cur_pos)
    cur = torch.where(cur_pos < e.unsqueeze(1), cur, torch.full_like(cur, src.sentinel))
    parts = [cur]
    if src.overlap:
        prev_pos = cur_pos - m
        parts.insert(0, torch.where(prev_pos >= 0, src.index(rows, prev_pos), torch.full_like(cur, src.sentinel)))
    idx = torch.cat(parts, dim=1)
    return kv_src[idx], score_src[idx]


def dest_rows(step: StepRows, groups: Groups, ratio: int, dest: Dest) -> torch.Tensor:
    """The pool row of each group's entry (the trash block's rows for padding, cached entries, unmapped blocks)."""
    cached = (groups.entry + 1) * ratio <= step.cached_len[groups.row]
    bt = step.block_table
    col = (groups.entry * ratio // dest.block_size).clamp(0, bt.shape[1] - 1)
    block = bt[groups.row, col]
    ok = groups.valid & ~cached & (block >= 0)
    block = torch.where(ok, block, torch.full_like(block, dest.num_blocks))
    epb = dest.block_size // ratio
    return block * epb + groups.entry.clamp(min=0) % epb


def pool_groups_reference(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor | None, step: StepRows,
                          state_kv: torch.Tensor, state_score: torch.Tensor, ratio: int, overlap: bool,
                          head_dim: int, dest: Dest, out_dtype: torch.dtype
                          ) -> tuple[torch.Tensor, Groups, torch.Tensor]:
    if ape is not None:
        score = score + ape[step.positions % ratio]
    src = PositionSource(step, ratio, overlap)
    kv_src, score_src = src.table(state_kv, state_score, kv, score)
    groups = completed_groups(step, ratio)
    pooled = pool_entries(kv_src, score_src, src, groups, head_dim)
    new_kv, new_score = next_state(kv_src, score_src, src)
    state_kv[step.row_slot] = new_kv.to(state_kv.dtype)
    state_score[step.row_slot] = new_score.to(state_score.dtype)
    return pooled.to(out_dtype), groups, dest_rows(step, groups, ratio, dest)


def pool_groups(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor | None, step: StepRows,
                state_kv: torch.Tensor, state_score: torch.Tensor, ratio: int, overlap: bool, head_dim: int,
                dest: Dest, out_dtype: torch.dtype, backend: str = REFERENCE
                ) -> tuple[torch.Tensor, Groups, torch.Tensor]:
    """Pool every group completed in this step and carry each row's partial group in the state.

    kv, score [T, C * head_dim] (C = 2 with overlap) are this step's projections (score before the APE bias `ape`
    [ratio, C * head_dim], added here); state_kv / state_score [slots + 1, C * ratio, C * head_dim] are read for the
    positions before this step and then replaced, at each row's slot, by the row's next state. Returns the pooled
    (pre-norm) entries [T // ratio + R, head_dim] in out_dtype, their groups, and the pool row of each (`dest`);
    the values of padded groups (not `valid`) are unspecified, and their rows are the trash block's.
    """
    if backend == TRITON:
        from .kernels import compressor as kernel

        if kernel.supports(kv, state_kv):
            return kernel.pool_groups(kv, score, ape, step, state_kv, state_score, ratio, overlap, head_dim, dest,
                                      out_dtype)
    return pool_groups_reference(kv, score, ape, step, state_kv, state_score, ratio, overlap, head_dim, dest,
                                 out_dtype)
