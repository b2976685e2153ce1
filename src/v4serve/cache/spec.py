"""What each layer keeps in the KV cache, in which record format, and what it costs.

Kinds of state (V4 and V4.1):
* window: the last `window` positions' KV rows of every layer (a per-request ring, in a slot);
* compressed: one entry per `ratio` positions, owned by compressor layers (V4.1: the KV-source layers only),
  paged in blocks of `block_size` positions, position-exact and therefore prefix-cacheable;
* index keys: one per compressed entry for layers that own an indexer key cache (V4 CSA, V4.1 KV sources);
* compressor state: the partial group not yet compressed (and V4 CSA's previous group for the overlap), float32,
  per request.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..config import ModelConfig
from .formats import Codec, compressed_codec, index_codec, window_codec


@dataclass(frozen=True)
class CompressorStateSpec:
    slots: int  # positions held: (2 if overlap else 1) * ratio
    width: int  # float32 values per position: (2 if overlap else 1) * head_dim

    @property
    def bytes(self) -> int:
        return 2 * self.slots * self.width * 4  # kv and score, float32 (float64 models: twice; see state_dtype)


@dataclass(frozen=True)
class LayerCache:
    layer: int
    window: Codec
    ratio: int = 0  # > 0: owns a compressed cache of this ratio
    compressed: Codec | None = None
    index_keys: Codec | None = None
    state: CompressorStateSpec | None = None
    index_state: CompressorStateSpec | None = None


@dataclass(frozen=True)
class CacheSpec:
    config: ModelConfig
    block_size: int
    kv_dtype: str
    index_dtype: str
    layers: tuple[LayerCache, ...] = field(default_factory=tuple)
    compute_dtype: torch.dtype = torch.float32

    @property
    def state_dtype(self) -> torch.dtype:
        """Compressor state is kept at accumulation precision: float32, or float64 for a float64 model."""
        return torch.float64 if self.compute_dtype == torch.float64 else torch.float32

    # --- per-token (growing) and per-sequence (constant) bytes -----------------------------------
    def compressed_bytes_per_token(self) -> float:
        return sum(lc.compressed.record_bytes / lc.ratio for lc in self.layers if lc.compressed)

    def index_bytes_per_token(self) -> float:
        return sum(lc.index_keys.record_bytes / lc.ratio for lc in self.layers if lc.index_keys)

    def bytes_per_token(self) -> float:
        return self.compressed_bytes_per_token() + self.index_bytes_per_token()

    def block_bytes(self) -> int:
        """Bytes of one logical block (block_size positions) across every layer's compressed kinds."""
        total = 0
        for lc in self.layers:
            if lc.compressed:
                total += (self.block_size // lc.ratio) * lc.compressed.record_bytes
            if lc.index_keys:
                total += (self.block_size // lc.ratio) * lc.index_keys.record_bytes
        return total

    def window_bytes_per_seq(self) -> int:
        return sum(self.config.window_size * lc.window.record_bytes for lc in self.layers)

    def state_bytes_per_seq(self) -> int:
        scale = 2 if self.state_dtype == torch.float64 else 1
        return scale * sum((lc.state.bytes if lc.state else 0) + (lc.index_state.bytes if lc.index_state else 0)
                           for lc in self.layers)

    def slot_bytes(self) -> int:
        return self.window_bytes_per_seq() + self.state_bytes_per_seq()

    def by_kind(self) -> dict[str, float]:
        return {
            "compressed_entries_per_token": self.compressed_bytes_per_token(),
            "index_keys_per_token": self.index_bytes_per_token(),
            "total_per_token": self.bytes_per_token(),
            "window_per_sequence": float(self.window_bytes_per_seq()),
            "compressor_state_per_sequence": float(self.state_bytes_per_seq()),
        }


def default_index_dtype(config: ModelConfig, kv_dtype: str) -> str:
    """FP4 index keys are what both V4 (Hadamard + FP4 simulation) and V4.1 compute: storing them is lossless."""
    return "fp4" if kv_dtype in ("fp8", "fp4") else kv_dtype


def make_cache_spec(config: ModelConfig, block_size: int = 256, kv_dtype: str = "auto",
                    index_dtype: str | None = None, compute_dtype: torch.dtype = torch.float32,
                    with_mtp: bool = False) -> CacheSpec:
    c = config
    index_dtype = index_dtype or default_index_dtype(c, kv_dtype)
    layers = []
    n = c.n_layers + (c.n_mtp_layers if with_mtp else 0)
    for i in range(n):
        win = window_codec(c.family, kv_dtype, c.head_dim, c.rope_dim, compute_dtype)
        ratio = c.compress_ratios[i] if i < c.n_layers and c.owns_compressor(i) else 0
        if not ratio:
            layers.append(LayerCache(i, win))
            continue
        if block_size % ratio:
            raise ValueError(f"--block-size {block_size} must be a multiple of every compress ratio (layer {i}: {ratio})")
        comp = compressed_codec(c.family, kv_dtype, c.head_dim, c.rope_dim, compute_dtype)
        overlap = c.family == "v4" and ratio == 4
        coff = 2 if overlap else 1
        state = CompressorStateSpec(coff * ratio, coff * c.head_dim) if ratio > 1 else None
        keys = idx_state = None
        if c.owns_index_keys(i):
            keys = index_codec(index_dtype, c.index_head_dim, compute_dtype)
            if c.family == "v4":  # V4's indexer has its own overlapped compressor
                idx_state = CompressorStateSpec(2 * ratio, 2 * c.index_head_dim)
        layers.append(LayerCache(i, win, ratio, comp, keys, state, idx_state))
    return CacheSpec(c, block_size, kv_dtype, index_dtype, tuple(layers), compute_dtype)
