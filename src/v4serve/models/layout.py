"""The tensors of a released checkpoint: names, logical shapes and storage kinds.

This is the single description of the official layout. The checkpoint writer, the loader (with its
missing / extra / mis-shaped checks), the random-weight presets and `v4serve info` all read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..config import ModelConfig

# dense  = a linear weight stored FP8 with block scales in a quantized checkpoint (else bf16/f32)
# expert = a routed-expert weight stored FP4 (or FP8) in a quantized checkpoint
# bf16   = always high precision (bf16 in the release; f32 in an unquantized float32 checkpoint)
# f32    = always float32 (mHC parameters, sinks, APE, gate bias)
# index  = integer table (hash routing)
# engram = V4.1 Engram table (FP8 rows with per-32 e8m0 scales in a quantized checkpoint)
Kind = Literal["dense", "expert", "bf16", "f32", "index", "engram"]


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]  # logical (dequantized) shape
    kind: Kind
    # init: std of the random normal; None = "norm weight" (around 1); "scale" and friends handled by kind
    init: str = "linear"

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


def _hc(prefix: str, c: ModelConfig, which: str) -> list[TensorSpec]:
    n, mix = c.hc_mult, (2 + c.hc_mult) * c.hc_mult
    return [
        TensorSpec(f"{prefix}hc_{which}_fn", (mix, n * c.dim), "f32", "hc_fn"),
        TensorSpec(f"{prefix}hc_{which}_base", (mix,), "f32", "hc_base"),
        TensorSpec(f"{prefix}hc_{which}_scale", (3,), "f32", "hc_scale"),
    ]


def _compressor(prefix: str, c: ModelConfig, ratio: int, head_dim: int, overlap: bool, gated: bool, ape: bool,
                wkv_kind: Kind = "bf16") -> list[TensorSpec]:
    coff = 2 if overlap else 1
    out = [TensorSpec(f"{prefix}wkv.weight", (coff * head_dim, c.dim), wkv_kind)]
    if gated:
        out.append(TensorSpec(f"{prefix}wgate.weight", (coff * head_dim, c.dim), "bf16"))
    if ape:
        out.append(TensorSpec(f"{prefix}ape", (ratio, coff * head_dim), "f32", "ape"))
    out.append(TensorSpec(f"{prefix}norm.weight", (head_dim,), "bf16", "norm"))
    return out


def attention_specs(prefix: str, c: ModelConfig, layer: int) -> list[TensorSpec]:
    """Attention tensors of one block (`layer` indexes compress_ratios; MTP/DSpark blocks come after the trunk)."""
    H, hd = c.n_heads, c.head_dim
    p = f"{prefix}attn."
    out = [
        TensorSpec(f"{p}wq_a.weight", (c.q_lora_rank, c.dim), "dense"),
        TensorSpec(f"{p}q_norm.weight", (c.q_lora_rank,), "bf16", "norm"),
        TensorSpec(f"{p}wq_b.weight", (H * hd, c.q_lora_rank), "dense"),
        TensorSpec(f"{p}wkv.weight", (hd, c.dim), "dense"),
        TensorSpec(f"{p}kv_norm.weight", (hd,), "bf16", "norm"),
        TensorSpec(f"{p}wo_a.weight", (c.o_groups * c.o_lora_rank, H * hd // c.o_groups), "dense"),
        TensorSpec(f"{p}wo_b.weight", (c.dim, c.o_groups * c.o_lora_rank), "dense"),
        TensorSpec(f"{p}attn_sink", (H,), "f32", "sink"),
    ]
    ratio = c.compress_ratios[layer]
    is_trunk = layer < c.n_layers
    if not ratio or (is_trunk and not c.owns_compressor(layer)) or not is_trunk:
        # window-only layers, V4.1 readers, and MTP/DSpark blocks own no compressor
        if c.is_v41 and is_trunk and ratio and c.runs_indexer(layer):
            out += _v41_index_query(p, c)
        return out
    if c.is_v41:
        # CSA2: no overlap, no APE; ratio 1 has no gate (and a plain projection)
        out += _compressor(f"{p}compressor.", c, ratio, hd, overlap=False, gated=ratio > 1, ape=False)
        out += _v41_index_query(p, c)
        out += [TensorSpec(f"{p}indexer.wk.weight", (c.index_head_dim, hd), "bf16"),
                TensorSpec(f"{p}indexer.k_norm.weight", (c.index_head_dim,), "bf16", "norm")]
        return out
    out += _compressor(f"{p}compressor.", c, ratio, hd, overlap=ratio == 4, gated=True, ape=True)
    if ratio == 4:
        out += [
            TensorSpec(f"{p}indexer.wq_b.weight", (c.index_n_heads * c.index_head_dim, c.q_lora_rank), "dense"),
            TensorSpec(f"{p}indexer.weights_proj.weight", (c.index_n_heads, c.dim), "bf16"),
        ]
        out += _compressor(f"{p}indexer.compressor.", c, ratio, c.index_head_dim, overlap=True, gated=True, ape=True)
    return out


def _v41_index_query(p: str, c: ModelConfig) -> list[TensorSpec]:
    return [
        TensorSpec(f"{p}indexer.wq_b.weight", (c.index_n_heads * c.index_head_dim, c.q_lora_rank), "dense"),
        TensorSpec(f"{p}indexer.weights_proj.weight", (c.index_n_heads, c.dim), "bf16"),
    ]


def moe_specs(prefix: str, c: ModelConfig, hash_routed: bool, n_experts: int | None = None) -> list[TensorSpec]:
    E = n_experts or c.n_routed_experts
    p = f"{prefix}ffn."
    out = [TensorSpec(f"{p}gate.weight", (E, c.dim), "bf16")]
    if hash_routed:
        out.append(TensorSpec(f"{p}gate.tid2eid", (c.vocab_size, c.n_activated_experts), "index", "tid2eid"))
    else:
        out.append(TensorSpec(f"{p}gate.bias", (E,), "f32", "gate_bias"))
    return out + expert_specs(p, c, E)


def expert_specs(p: str, c: ModelConfig, n_experts: int) -> list[TensorSpec]:
    """Routed experts (FP4 in the release) and the shared expert (FP8) under `p` = '<block>.ffn.'."""
    out = []
    for e in range(n_experts):
        out += [TensorSpec(f"{p}experts.{e}.w1.weight", (c.moe_inter_dim, c.dim), "expert"),
                TensorSpec(f"{p}experts.{e}.w2.weight", (c.dim, c.moe_inter_dim), "expert"),
                TensorSpec(f"{p}experts.{e}.w3.weight", (c.moe_inter_dim, c.dim), "expert")]
    if c.n_shared_experts:
        out += [TensorSpec(f"{p}shared_experts.w1.weight", (c.moe_inter_dim, c.dim), "dense"),
                TensorSpec(f"{p}shared_experts.w2.weight", (c.dim, c.moe_inter_dim), "dense"),
                TensorSpec(f"{p}shared_experts.w3.weight", (c.moe_inter_dim, c.dim), "dense")]
    return out


def block_specs(prefix: str, c: ModelConfig, layer: int, n_experts: int | None = None) -> list[TensorSpec]:
    out = [TensorSpec(f"{prefix}attn_norm.weight", (c.dim,), "bf16", "norm"),
           TensorSpec(f"{prefix}ffn_norm.weight", (c.dim,), "bf16", "norm")]
    out += _hc(prefix, c, "attn") + _hc(prefix, c, "ffn")
    out += attention_specs(prefix, c, layer)
    out += moe_specs(prefix, c, hash_routed=layer < c.n_layers and c.is_hash_layer(layer), n_experts=n_experts)
    return out


def v4_tensor_specs(c: ModelConfig, include_mtp: bool = True) -> list[TensorSpec]:
    n = c.hc_mult
    out = [
        TensorSpec("embed.weight", (c.vocab_size, c.dim), "bf16", "embed"),
        TensorSpec("norm.weight", (c.dim,), "bf16", "norm"),
        TensorSpec("head.weight", (c.vocab_size, c.dim), "bf16", "head"),
        TensorSpec("hc_head_fn", (n, n * c.dim), "f32", "hc_fn"),
        TensorSpec("hc_head_base", (n,), "f32", "hc_base"),
        TensorSpec("hc_head_scale", (1,), "f32", "hc_scale"),
    ]
    for i in range(c.n_layers):
        out += block_specs(f"layers.{i}.", c, i)
    if include_mtp:
        for j in range(c.n_mtp_layers):
            p = f"mtp.{j}."
            out += block_specs(p, c, c.n_layers + j)
            out += [TensorSpec(f"{p}e_proj.weight", (c.dim, c.dim), "dense"),
                    TensorSpec(f"{p}h_proj.weight", (c.dim, c.dim), "dense"),
                    TensorSpec(f"{p}enorm.weight", (c.dim,), "bf16", "norm"),
                    TensorSpec(f"{p}hnorm.weight", (c.dim,), "bf16", "norm"),
                    TensorSpec(f"{p}norm.weight", (c.dim,), "bf16", "norm"),
                    TensorSpec(f"{p}hc_head_fn", (n, n * c.dim), "f32", "hc_fn"),
                    TensorSpec(f"{p}hc_head_base", (n,), "f32", "hc_base"),
                    TensorSpec(f"{p}hc_head_scale", (1,), "f32", "hc_scale")]
    return out


def tensor_specs(c: ModelConfig, include_mtp: bool = True) -> list[TensorSpec]:
    """Every tensor of the official checkpoint of this config, in a stable order."""
    if c.is_v41:
        from .v41.layout import v41_tensor_specs  # V4.1 adds Engram, DSpark and CSA2 tensors

        return v41_tensor_specs(c, include_mtp)
    return v4_tensor_specs(c, include_mtp)
