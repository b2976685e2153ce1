"""Per-step addressing shared by every layer: RoPE tables, window gathers and compressed-entry rows.

Computed once per step (per sub-step for V4.1's trimmed decoder layers) from the StepInput, with static
shapes only, so a decode step can be captured in a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...cache.pool import KVPools, RowPool
from ...config import ModelConfig
from ...ops.attention import EntryRefs, WindowRefs
from ...ops.backend import fused
from ...ops.compressor import Groups, completed_groups, dest_rows
from ...ops.finish import finish_rows
from ...ops.indexer import Entries
from ...ops.rope import inv_freq, rope_cos_sin
from ..step import StepInput


@dataclass
class Compression:
    """A step's compressed entries of one ratio: the completed groups (padded), their pool rows, cos/sin at their
    first positions."""

    groups: Groups
    rows: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor


class StepContext:
    def __init__(self, step: StepInput, config: ModelConfig, pools: KVPools):
        self.step, self.config, self.pools = step, config, pools
        dev = step.device
        self._rope: dict[bool, tuple[torch.Tensor, torch.Tensor]] = {}
        self._compression: dict[int, Compression] = {}
        self._visible: dict[int, torch.Tensor] = {}
        W = config.window_size
        R = step.num_rows
        pos, row = step.positions, step.token_row
        # --- window: positions p-W+1 .. p, from the row's ring (before this step) or this step's fresh rows
        k = torch.arange(W, device=dev)
        p = pos.unsqueeze(1) - (W - 1) + k  # [T, W]
        r = row.unsqueeze(1)
        start = step.row_start[r]
        self.win_valid = (p >= 0) & (p >= step.window_floor[r])
        fresh = p >= start
        fresh_idx = (step.row_offset[r] + (p - start)).clamp(min=0)
        ring_idx = r * W + torch.remainder(p, W)
        self.win_src = torch.where(fresh, R * W + fresh_idx, ring_idx)
        self.ring_rows = pools.window_rows(step.row_slot.unsqueeze(1), k.unsqueeze(0)).reshape(-1)  # [R*W]
        # rows each token's KV goes to: the last W positions of its row (others go to the trash slot)
        row_end = (step.row_start + step.row_len)[row]
        keep = (pos >= row_end - W) & (pos >= step.window_floor[row])
        slot = torch.where(keep, step.row_slot[row], torch.full_like(row, pools.trash_slot))
        self.win_write = pools.window_rows(slot, pos)

    # --- RoPE ---------------------------------------------------------------------------------------
    def rope(self, compressed: bool) -> tuple[torch.Tensor, torch.Tensor]:
        if compressed not in self._rope:
            self._rope[compressed] = rope_cos_sin(self.step.positions, inv_freq(self.config, compressed, self.step.device))
        return self._rope[compressed]

    # --- window ---------------------------------------------------------------------------------------
    def window_refs(self, layer: int) -> WindowRefs:
        """The window addressing the attention entry point reads (ops.attention.attend)."""
        return WindowRefs(self.pools.window[layer], self.win_src, self.win_valid, self.ring_rows)

    def write_window(self, layer: int, kv: torch.Tensor, backend: str) -> None:
        finish_rows(kv, None, 0.0, None, None, False, None, 0, self.pools.window[layer], self.win_write, backend)

    def early_window_store(self, layer: int) -> tuple[RowPool | None, torch.Tensor | None]:
        """(pool, rows) to store this step's window rows as they are finished, before the attention reads the ring,
        when every row has one token (decode steps): the slot a row's token takes held position p - W, outside the
        window p - W + 1 .. p, so no read of the step needs it (the finish writes them, one launch fewer than
        write_window). (None, None) otherwise: a row's later tokens would overwrite slots its earlier tokens read."""
        if self.step.one_token_rows and fused("early_window"):
            return self.pools.window[layer], self.win_write
        return None, None

    # --- compressed entries -----------------------------------------------------------------------
    def max_entries(self, ratio: int) -> int:
        return max(1, -(-self.step.max_context // ratio))

    def visible(self, ratio: int) -> torch.Tensor:
        """Entries each token may see: groups complete at or before its position (once per step and ratio: every
        compressed layer asks, twice)."""
        if ratio not in self._visible:
            self._visible[ratio] = torch.div(self.step.positions + 1, ratio, rounding_mode="floor")
        return self._visible[ratio]

    def entries(self, ratio: int, visible: torch.Tensor) -> Entries:
        """Where the compressed entries (and index keys) of a cache of this ratio live (every layer of a ratio uses
        the same block table and entries-per-block)."""
        pools = self.pools
        return Entries(self.step.block_table, self.step.token_row, visible, ratio, pools.block_size, pools.num_blocks,
                       self.max_entries(ratio))

    def index_entries(self, source: int, visible: torch.Tensor) -> Entries:
        """Where the index keys of `source`'s cache live, for ops.indexer.index_topk."""
        return self.entries(self.pools.ratio[source], visible)

    def entry_refs(self, source: int, picks: torch.Tensor | None = None) -> EntryRefs:
        """The compressed entries of `source`'s cache each token attends to: its picks (CSA) or all visible (HCA)."""
        where = self.index_entries(source, self.visible(self.pools.ratio[source]))
        return EntryRefs(self.pools.compressed[source], where, picks)

    def compression(self, ratio: int) -> Compression:
        """This step's completed groups of a compression ratio, their pool rows and RoPE: the same for every layer of
        that ratio, so computed once per step (ratio 1, V4.1's ungated source: every token is its own entry)."""
        if ratio not in self._compression:
            st = self.step
            if ratio == 1:
                groups = Groups(st.token_row, st.positions, torch.ones_like(st.positions, dtype=torch.bool))
            else:
                groups = completed_groups(st, ratio)
            rows = dest_rows(st, groups, self.entries(ratio, self.visible(ratio)))
            if ratio == 1:  # the entries sit at the tokens' own positions
                cos, sin = self.rope(True)
            else:
                cos, sin = rope_cos_sin(groups.entry * ratio, inv_freq(self.config, True, st.device))
            self._compression[ratio] = Compression(groups, rows, cos, sin)
        return self._compression[ratio]
