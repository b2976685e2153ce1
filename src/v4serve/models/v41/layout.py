"""The tensors of a DeepSeek-V4.1 checkpoint (text model): names, logical shapes and storage kinds.

Per trunk layer: the V4 block tensors (norms, mHC, attention with its own q path / window KV / sink / output),
then by role:
* KV sources (2, 8, 14, 20): `attn.compressor.{wkv, norm}` (+ `wgate` at ratio 2; no APE, no overlap) and the
  index-key projection `attn.indexer.{wk, k_norm}`;
* index sources (2, 8, 14, 20, 24, 28, 32, 36): `attn.indexer.{wq_b, weights_proj}`;
* Engram layers (1, 14): `engram.embed.weight` [rows, head_dim] (FP8 + per-32 e8m0 `.scale`), `engram.wkv`
  (FP8 dense), `engram.{q_weight, k_weight}` [hc, dim];
* every MoE gate: `bias` and `bias_vl` (image-span routing), never a hash table.
No `hc_head_*` anywhere (V4.1's final collapse reuses the last sub-layer's `pre`). DSpark blocks `mtp.0..2` are
window-only blocks with a 128-expert MoE; `mtp.0` adds `main_proj` (FP8, 3*dim -> dim) and `main_norm`, the last
adds `norm`, `markov_head.{embed, head}` [vocab, rank] and `confidence_head.proj` [1, dim + rank]. Embedding and
head are shared with the trunk. Vision tower tensors (`vision.*`, `aligner.*`, `image_*`) are not described
(the loader skips them).

Provenance: names, dtypes and shapes are confirmed against a public checkpoint schema that validates every name,
shape and dtype of the released safetensors headers (ROCm/ATOM `deepseek_v41/weights.py`, 96,085 tensors
with 266 vision ones) and public ports of the reference `inference/model.py` (transformers' DeepseekV41, ATOM,
a one-box port reading the real shards). Confirmed: every name above, `bias_vl`, the absence of `hc_head_*`,
ratio-1 sources without `wgate`, `wk` [128, 512] BF16, FP8 `main_proj` / `engram.wkv`, BF16 markov and
confidence weights, FP4 DSpark experts. Inferred (storage only): `engram.{q,k}_weight` stored BF16 (loaded as
float32 here either way).
"""

from __future__ import annotations

from ...config import ModelConfig
from ..layout import TensorSpec, _hc, attention_specs, expert_specs


def moe_specs(prefix: str, c: ModelConfig, n_experts: int) -> list[TensorSpec]:
    p = f"{prefix}ffn."
    out = [TensorSpec(f"{p}gate.weight", (n_experts, c.dim), "bf16"),
           TensorSpec(f"{p}gate.bias", (n_experts,), "f32", "gate_bias"),
           TensorSpec(f"{p}gate.bias_vl", (n_experts,), "f32", "gate_bias")]
    return out + expert_specs(p, c, n_experts)


def engram_specs(prefix: str, c: ModelConfig, rows: int) -> list[TensorSpec]:
    p = f"{prefix}engram."
    width = (c.engram_max_ngram - 1) * c.engram_n_heads * c.engram_head_dim
    return [TensorSpec(f"{p}embed.weight", (rows, c.engram_head_dim), "engram", "engram_table"),
            TensorSpec(f"{p}wkv.weight", ((c.hc_mult + 1) * c.dim, width), "dense"),
            TensorSpec(f"{p}q_weight", (c.hc_mult, c.dim), "bf16", "norm"),
            TensorSpec(f"{p}k_weight", (c.hc_mult, c.dim), "bf16", "norm")]


def block_specs(prefix: str, c: ModelConfig, layer: int, n_experts: int) -> list[TensorSpec]:
    out = [TensorSpec(f"{prefix}attn_norm.weight", (c.dim,), "bf16", "norm"),
           TensorSpec(f"{prefix}ffn_norm.weight", (c.dim,), "bf16", "norm")]
    out += _hc(prefix, c, "attn") + _hc(prefix, c, "ffn")
    out += attention_specs(prefix, c, layer)
    out += moe_specs(prefix, c, n_experts)
    if layer < c.n_layers and layer in c.engram_layers:
        out += engram_specs(prefix, c, c.engram_num_embeddings[c.engram_layers.index(layer)])
    return out


def dspark_specs(c: ModelConfig, stage: int) -> list[TensorSpec]:
    p = f"mtp.{stage}."
    out = block_specs(p, c, c.n_layers + stage, c.dspark_n_routed_experts)
    if stage == 0:
        out += [TensorSpec(f"{p}main_proj.weight", (c.dim, c.dim * len(c.dspark_target_layers)), "dense"),
                TensorSpec(f"{p}main_norm.weight", (c.dim,), "bf16", "norm")]
    if stage == c.n_mtp_layers - 1:
        r = c.dspark_markov_rank
        out += [TensorSpec(f"{p}norm.weight", (c.dim,), "bf16", "norm"),
                TensorSpec(f"{p}markov_head.embed.weight", (c.vocab_size, r), "bf16"),
                TensorSpec(f"{p}markov_head.head.weight", (c.vocab_size, r), "bf16"),
                TensorSpec(f"{p}confidence_head.proj.weight", (1, c.dim + r), "bf16")]
    return out


def v41_tensor_specs(c: ModelConfig, include_mtp: bool = True) -> list[TensorSpec]:
    out = [TensorSpec("embed.weight", (c.vocab_size, c.dim), "bf16", "embed"),
           TensorSpec("norm.weight", (c.dim,), "bf16", "norm"),
           TensorSpec("head.weight", (c.vocab_size, c.dim), "bf16", "head")]
    for i in range(c.n_layers):
        out += block_specs(f"layers.{i}.", c, i, c.n_routed_experts)
    if include_mtp:
        for j in range(c.n_mtp_layers):
            out += dspark_specs(c, j)
    return out

