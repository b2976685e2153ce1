"""Parameter accounting for DeepSeek-V4.1 (what `v4serve info` prints), derived from the tensor layout.

Active parameters per token count what a token's forward touches: the embedding table (counted whole, as the
published "8B / 16B active" figures do), every dense tensor of the layers it runs through, the activated routed
experts only (n_activated / n_routed of each expert stack), and only the Engram rows it reads
((max_ngram-1) * n_heads rows per Engram layer, not the tables). Prefill tokens run the encoder (layers
0 .. decoder_start-1) under SWA bounded replay; decoded tokens run every layer and the LM head. DSpark blocks
are not counted (they are a separate draft forward).
"""

from __future__ import annotations

from ...config import ModelConfig
from ..layout import tensor_specs
from .engram_hash import engram_row_counts

__all__ = ["active_params", "engram_row_counts", "total_params"]


def _layer_of(name: str) -> int:
    return int(name.split(".")[1]) if name.startswith("layers.") else -1


def _active(config: ModelConfig, name: str, numel: int, kind: str) -> float:
    c = config
    if kind == "expert":
        return numel * c.n_activated_experts / c.n_routed_experts
    if kind == "engram":
        return (c.engram_max_ngram - 1) * c.engram_n_heads * c.engram_head_dim
    return float(numel)


def active_params(config: ModelConfig) -> dict[str, int]:
    """{"prefill_per_token": layers 0..decoder_start-1 + embedding, "decode_per_token": all layers + embedding +
    final norm + head}. V4.1-Flash: ~8.5B and ~16.3B."""
    c = config
    prefill = decode = 0.0
    for s in tensor_specs(c, include_mtp=False):
        a = _active(c, s.name, s.numel, s.kind)
        layer = _layer_of(s.name)
        if s.name == "embed.weight":
            prefill += a
            decode += a
        elif layer < 0:  # final norm and head: only tokens whose logits are computed
            decode += a
        else:
            decode += a
            if layer < c.decoder_start:
                prefill += a
    return {"prefill_per_token": round(prefill), "decode_per_token": round(decode)}


def total_params(config: ModelConfig, include_mtp: bool = True) -> dict[str, int]:
    """Stored parameters by part: Engram tables, routed experts, the rest."""
    out = {"engram": 0, "experts": 0, "other": 0}
    for s in tensor_specs(config, include_mtp):
        key = "engram" if s.kind == "engram" else "experts" if s.kind == "expert" else "other"
        out[key] += s.numel
    return out
