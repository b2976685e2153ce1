"""Per-step addressing shared by every layer: RoPE tables, window gathers and compressed-entry rows.

Computed once per step (per sub-step for V4.1's trimmed decoder layers) from the StepInput, with static
shapes only, so a decode step can be captured in a CUDA graph; with the Triton backend in one launch for the window
addressing and both RoPE tables and one per compression ratio (ops/addressing.py).
"""

from __future__ import annotations

import torch

from ...cache.pool import KVPools, RowPool
from ...config import ModelConfig
from ...ops.addressing import Compression, compression_addressing, visible_entries, window_addressing
from ...ops.attention import EntryRefs, WindowRefs
from ...ops.backend import REFERENCE, TRITON, fused
from ...ops.compressor import Groups, dest_rows
from ...ops.finish import finish_rows
from ...ops.indexer import Entries
from ...ops.rope import inv_freq, rope_cos_sin
from ..step import StepInput


class StepContext:
    def __init__(self, step: StepInput, config: ModelConfig, pools: KVPools, backend: str = REFERENCE):
        self.step, self.config, self.pools, self.backend = step, config, pools, backend
        self._rope: dict[bool, tuple[torch.Tensor, torch.Tensor]] = {}
        self._compression: dict[int, Compression] = {}
        self._visible: dict[int, torch.Tensor] = {}
        self._shared_entries: tuple[int, EntryRefs] | None = None  # (source, refs) of the last entry_refs call
        # the Triton body writes both RoPE tables in the window's launch; the reference makes each when first asked
        freqs = [inv_freq(config, c, step.device) for c in (False, True)] if backend == TRITON else []
        win = window_addressing(step, pools, freqs, backend)
        self.win_src, self.win_valid, self.ring_rows, self.win_write = win.src, win.valid, win.ring_rows, win.write
        self._rope.update(zip((False, True), win.rope))

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
            self._visible[ratio] = (self.compression(ratio).visible if ratio > 1 and self.backend == TRITON
                                    else visible_entries(self.step.positions, ratio))  # (the kernel writes both)
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
        """The compressed entries of `source`'s cache each token attends to: its picks (CSA) or all visible (HCA).
        One object per (source, picks) and step: V4.1's layers that read one KV source with one index source's picks
        share it, and with it what a backend derives from it once (EntryRefs.derived: the staged picks). Sources
        write their cache before their own attention and no later layer of the step writes it. Such layers are
        consecutive, so only the last pair is kept: a group's staged rows are freed when the next group starts, as
        a layer's own were before (T x 512 rows of D a group)."""
        last = self._shared_entries
        if last is not None and last[0] == source and last[1].picks is picks:
            return last[1]
        where = self.index_entries(source, self.visible(self.pools.ratio[source]))
        refs = EntryRefs(self.pools.compressed[source], where, picks, derived={})
        self._shared_entries = (source, refs)
        return refs

    def compression(self, ratio: int) -> Compression:
        """This step's completed groups of a compression ratio, their pool rows and RoPE: the same for every layer of
        that ratio, so computed once per step (ratio 1, V4.1's ungated source: every token is its own entry)."""
        if ratio not in self._compression:
            st = self.step
            if ratio == 1:  # the entries sit at the tokens' own positions
                groups = Groups(st.token_row, st.positions, torch.ones_like(st.positions, dtype=torch.bool))
                rows = dest_rows(st, groups, self.entries(ratio, self.visible(ratio)))
                cos, sin = self.rope(True)
                self._compression[ratio] = Compression(groups, rows, cos, sin, self.visible(ratio))
            else:
                self._compression[ratio] = compression_addressing(
                    st, ratio, self.pools.block_size, self.pools.num_blocks, self.max_entries(ratio),
                    inv_freq(self.config, True, st.device), self.backend)
        return self._compression[ratio]
