"""A step's addressing, shared by every layer: which pool rows each token's window reads and writes, the RoPE
tables, and per compression ratio the step's completed groups, their pool rows, their RoPE and each token's visible
entry count. Computed once per step (models/v4/context.py StepContext asks) from the step's rows.

Two bodies of one signature each, the plain-torch reference and the Triton kernel (`kernels/addressing.py`): the
reference is ~40 small torch ops per ratio and ~40 for the window, each a kernel of its own in a graphed decode step
(~130 launches, ~1.3 us each on the H200); the kernel is one launch for the window and one per ratio. Integers are
the same; the RoPE tables come from the same float32 products.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from .backend import REFERENCE, TRITON
from .compressor import Groups, StepRows, completed_groups, dest_rows
from .indexer import Entries
from .rope import rope_cos_sin


class WindowRows(StepRows, Protocol):
    window_floor: torch.Tensor  # [R] window KV below this position is not visible (replay start)


class WindowRing(Protocol):
    """Where the window rings live (cache.pool.KVPools has these; the kernel writes the same layout)."""

    window_size: int  # W: positions p-W+1 .. p; position p sits in ring slot p mod W
    trash_slot: int  # the slot of rows whose KV is not kept

    def window_rows(self, slot: torch.Tensor, pos: torch.Tensor) -> torch.Tensor: ...


@dataclass
class WindowAddressing:
    """Where each token's window lives: `src` [T, W] indexes [the rows' rings before this step (R*W) | this step's
    fresh rows], `valid` [T, W] the positions it sees, `ring_rows` [R*W] the pool rows of the ring slots, `write` [T]
    the pool row its KV goes to (the trash slot's unless among its row's last W positions); `rope` the (cos, sin)
    tables [T, rope_dim/2] of each frequency vector asked for."""

    src: torch.Tensor
    valid: torch.Tensor
    ring_rows: torch.Tensor
    write: torch.Tensor
    rope: list[tuple[torch.Tensor, torch.Tensor]]


@dataclass
class Compression:
    """A step's compressed entries of one ratio: the completed groups (padded), their pool rows, cos/sin at their
    first positions; and `visible` [T], the entries each token may see (groups complete at or before it)."""

    groups: Groups
    rows: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    visible: torch.Tensor


def window_addressing(step: WindowRows, ring: WindowRing, freqs: Sequence[torch.Tensor],
                      backend: str = REFERENCE) -> WindowAddressing:
    """The window addressing of a step in `ring`'s layout and the RoPE tables of its positions for each of `freqs`."""
    if backend == TRITON:
        from .kernels import addressing as kernel

        if kernel.supports(step):
            return kernel.window_addressing(step, ring.window_size, ring.trash_slot, freqs)
    return window_addressing_reference(step, ring, freqs)


def window_addressing_reference(step: WindowRows, ring: WindowRing,
                                freqs: Sequence[torch.Tensor]) -> WindowAddressing:
    W = ring.window_size
    R = step.num_rows
    pos, row = step.positions, step.token_row
    k = torch.arange(W, device=pos.device)
    p = pos.unsqueeze(1) - (W - 1) + k  # [T, W]
    r = row.unsqueeze(1)
    start = step.row_start[r]
    valid = (p >= 0) & (p >= step.window_floor[r])
    fresh = p >= start
    fresh_idx = (step.row_offset[r] + (p - start)).clamp(min=0)
    ring_idx = r * W + torch.remainder(p, W)
    src = torch.where(fresh, R * W + fresh_idx, ring_idx)
    ring_rows = ring.window_rows(step.row_slot.unsqueeze(1), k.unsqueeze(0)).reshape(-1)  # [R*W]
    # rows each token's KV goes to: the last W positions of its row (others go to the trash slot)
    row_end = (step.row_start + step.row_len)[row]
    keep = (pos >= row_end - W) & (pos >= step.window_floor[row])
    slot = torch.where(keep, step.row_slot[row], torch.full_like(row, ring.trash_slot))
    write = ring.window_rows(slot, pos)
    return WindowAddressing(src, valid, ring_rows, write, [rope_cos_sin(pos, f) for f in freqs])


def compression_addressing(step: StepRows, ratio: int, block_size: int, num_blocks: int, max_entries: int,
                           freqs: torch.Tensor, backend: str = REFERENCE) -> Compression:
    """The step's groups of `ratio` (> 1; ops.compressor.completed_groups), their pool rows in the paged addressing
    of a cache of that ratio (ops.compressor.dest_rows over step.block_table, `block_size` positions a block,
    `num_blocks` blocks before the trash block), the RoPE of their first positions and each token's visible count."""
    if backend == TRITON:
        from .kernels import addressing as kernel

        if kernel.supports(step):
            return kernel.compression_addressing(step, ratio, block_size, num_blocks, freqs)
    return compression_addressing_reference(step, ratio, block_size, num_blocks, max_entries, freqs)


def compression_addressing_reference(step: StepRows, ratio: int, block_size: int, num_blocks: int,
                                     max_entries: int, freqs: torch.Tensor) -> Compression:
    visible = visible_entries(step.positions, ratio)
    where = Entries(step.block_table, step.token_row, visible, ratio, block_size, num_blocks, max_entries)
    groups = completed_groups(step, ratio)
    rows = dest_rows(step, groups, where)
    cos, sin = rope_cos_sin(groups.entry * ratio, freqs)
    return Compression(groups, rows, cos, sin, visible)


def visible_entries(positions: torch.Tensor, ratio: int) -> torch.Tensor:
    """Entries a token at each position may see: the groups of `ratio` complete at or before it."""
    return torch.div(positions + 1, ratio, rounding_mode="floor")
