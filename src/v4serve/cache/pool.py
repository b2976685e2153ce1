"""Device storage for every kind of cache state, addressed by slot (per request) or block (paged).

Each pool has one extra *trash* row (window, state) or block (compressed, index keys) past the end: writes the
model must not make (tokens outside the window, entries already cached) are redirected there instead of being
filtered out, so a step never needs a data-dependent shape or a host synchronisation.
"""

from __future__ import annotations

import torch

from .formats import Codec
from .spec import CacheSpec


class RowPool:
    """Rows of one codec's records, read and written by flat row index (`rows` + 1 rows are allocated)."""

    def __init__(self, codec: Codec, rows: int, device: torch.device | str):
        self.codec = codec
        self.rows = rows
        self.data = torch.zeros(rows + 1, codec.row_width, dtype=codec.storage_dtype, device=device)

    @property
    def trash(self) -> int:
        return self.rows

    def read(self, idx: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        flat = idx.reshape(-1)
        return self.codec.decode(self.data[flat], dtype).view(*idx.shape, self.codec.dim)

    def write(self, idx: torch.Tensor, values: torch.Tensor) -> None:
        self.data[idx.reshape(-1)] = self.codec.encode(values.reshape(-1, self.codec.dim))

    def copy_rows(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        self.data[dst] = self.data[src]

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()


class StatePool:
    """Compressor partial-group state: kv and score [slots + 1, positions, width] in float32."""

    def __init__(self, positions: int, width: int, slots: int, device: torch.device | str,
                 dtype: torch.dtype = torch.float32):
        self.kv = torch.zeros(slots + 1, positions, width, dtype=dtype, device=device)
        self.score = torch.full((slots + 1, positions, width), float("-inf"), dtype=dtype, device=device)

    def reset(self, slots: torch.Tensor) -> None:
        self.kv[slots] = 0.0
        self.score[slots] = float("-inf")

    @property
    def nbytes(self) -> int:
        return 2 * self.kv.numel() * self.kv.element_size()


class KVPools:
    """All cache storage of one model replica: window rings and compressor state per slot, paged entries per block."""

    def __init__(self, spec: CacheSpec, num_blocks: int, num_slots: int, device: torch.device | str = "cpu"):
        self.spec = spec
        self.num_blocks = num_blocks
        self.num_slots = num_slots
        self.block_size = spec.block_size
        self.window_size = spec.config.window_size
        self.device = torch.device(device)
        self.window: dict[int, RowPool] = {}
        self.compressed: dict[int, RowPool] = {}
        self.index_keys: dict[int, RowPool] = {}
        self.state: dict[int, StatePool] = {}
        self.index_state: dict[int, StatePool] = {}
        self.ratio: dict[int, int] = {}
        W = self.window_size
        for lc in spec.layers:
            self.window[lc.layer] = RowPool(lc.window, num_slots * W + W - 1, device)  # + a trash slot
            if lc.compressed is not None:
                self.ratio[lc.layer] = lc.ratio
                epb = self.block_size // lc.ratio
                self.compressed[lc.layer] = RowPool(lc.compressed, num_blocks * epb + epb - 1, device)
                if lc.index_keys is not None:
                    self.index_keys[lc.layer] = RowPool(lc.index_keys, num_blocks * epb + epb - 1, device)
                if lc.state is not None:
                    self.state[lc.layer] = StatePool(lc.state.slots, lc.state.width, num_slots, device, spec.state_dtype)
                if lc.index_state is not None:
                    self.index_state[lc.layer] = StatePool(lc.index_state.slots, lc.index_state.width, num_slots, device,
                                                           spec.state_dtype)

    # --- addressing ----------------------------------------------------------------------------
    @property
    def trash_slot(self) -> int:
        return self.num_slots

    def window_rows(self, slot: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return slot * self.window_size + pos % self.window_size

    def entry_rows(self, layer: int, blocks: torch.Tensor, entry: torch.Tensor) -> torch.Tensor:
        """Flat rows of compressed entries `entry` (index within the request) given the per-entry physical block."""
        epb = self.block_size // self.ratio[layer]
        return blocks * epb + entry % epb

    def reset_slots(self, slots: torch.Tensor) -> None:
        """Forget the compressor partial state of these slots (a new request, or a replay start)."""
        for p in list(self.state.values()) + list(self.index_state.values()):
            p.reset(slots)

    @property
    def nbytes(self) -> int:
        pools = [*self.window.values(), *self.compressed.values(), *self.index_keys.values(),
                 *self.state.values(), *self.index_state.values()]
        return sum(p.nbytes for p in pools)

    def copy_slot(self, dst: int, src: int) -> None:
        """Copy every layer's window ring and compressor state from one slot to another (checkpoints)."""
        W = self.window_size
        for p in self.window.values():
            p.data[dst * W:(dst + 1) * W] = p.data[src * W:(src + 1) * W]
        for s in list(self.state.values()) + list(self.index_state.values()):
            s.kv[dst] = s.kv[src]
            s.score[dst] = s.score[src]
