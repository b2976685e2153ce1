"""Model configuration for the DeepSeek-V4 family (V4-Flash, V4-Pro, V4-Flash-0731, V4.1-Flash).

`ModelConfig` is what every other part of v4serve reads. It is parsed from a checkpoint's
`config.json` (Hugging Face names, V4.1 nests them under `text_config`) and, when present,
`inference/config.json` (the names DeepSeek's reference code uses). Errors name the bad field.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Family = Literal["v4", "v41"]


class ConfigError(ValueError):
    """A config.json that v4serve cannot serve; the message names the field and what to fix."""


@dataclass(frozen=True)
class ModelConfig:
    # --- identity ---------------------------------------------------------------------------
    family: Family = "v4"
    name: str = "custom"
    # --- trunk ------------------------------------------------------------------------------
    vocab_size: int = 129280
    dim: int = 4096
    n_layers: int = 43
    n_mtp_layers: int = 1  # V4: MTP blocks; V4.1: DSpark draft blocks
    n_heads: int = 64
    head_dim: int = 512
    rope_dim: int = 64
    q_lora_rank: int = 1024
    o_groups: int = 8
    o_lora_rank: int = 1024
    window_size: int = 128
    # one entry per layer plus one per MTP/DSpark block: 0 = window only, m>0 = compressed ratio m
    compress_ratios: tuple[int, ...] = ()
    # --- rope -------------------------------------------------------------------------------
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    rope_factor: float = 16.0
    original_seq_len: int = 65536
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    max_position: int = 1048576
    # --- indexer ----------------------------------------------------------------------------
    index_n_heads: int = 64
    index_head_dim: int = 128
    index_topk: int = 512
    # --- MoE --------------------------------------------------------------------------------
    n_routed_experts: int = 256
    n_shared_experts: int = 1
    n_activated_experts: int = 6
    moe_inter_dim: int = 2048
    n_hash_layers: int = 3
    score_func: str = "sqrtsoftplus"
    route_scale: float = 1.5
    swiglu_limit: float = 10.0
    norm_topk_prob: bool = True
    # --- mHC / norms ------------------------------------------------------------------------
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    norm_eps: float = 1e-6
    # --- tokens -----------------------------------------------------------------------------
    bos_token_id: int = 0
    eos_token_id: int = 1
    # --- released weight formats --------------------------------------------------------------
    weight_dtype: Literal["fp8", "bf16"] = "fp8"  # dense linears
    expert_dtype: Literal["fp4", "fp8", "bf16"] = "fp4"
    weight_block: int = 128  # FP8 block (128x128 V4, 32x32 V4.1); activations quantised 1 x weight_block
    # --- V4.1 -------------------------------------------------------------------------------
    kv_source_layers: tuple[int, ...] = ()
    index_source_layers: tuple[int, ...] = ()
    candidate_source_layer: int = -1
    candidate_topk_blocks: int = 2048
    candidate_block_size: int = 8
    engram_layers: tuple[int, ...] = ()
    engram_num_embeddings: tuple[int, ...] = ()
    engram_max_ngram: int = 4
    engram_vocab_size: int = 16000000
    engram_n_heads: int = 8
    engram_head_dim: int = 256
    engram_pad_id: int = 2
    engram_compressed_vocab: int = 99092
    dspark_block_size: int = 5
    dspark_noise_token_id: int = 128799
    dspark_target_layers: tuple[int, ...] = ()
    dspark_markov_rank: int = 256
    dspark_n_routed_experts: int = 128
    dspark_n_activated_experts: int = 3
    image_token_id: int = 129264
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    # ------------------------------------------------------------------------------------------
    def __post_init__(self) -> None:
        if not self.compress_ratios:
            object.__setattr__(self, "compress_ratios", default_compress_ratios(self.family, self.n_layers))
        validate(self)

    # derived facts ----------------------------------------------------------------------------
    @property
    def is_v41(self) -> bool:
        return self.family == "v41"

    @property
    def nope_dim(self) -> int:
        return self.head_dim - self.rope_dim

    def ratio(self, layer: int) -> int:
        return self.compress_ratios[layer]

    def is_hash_layer(self, layer: int) -> bool:
        return not self.is_v41 and layer < self.n_hash_layers

    def owns_compressor(self, layer: int) -> bool:
        """Whether the layer runs a compressor and owns a compressed-KV cache."""
        if self.ratio(layer) == 0:
            return False
        return layer in self.kv_source_layers if self.is_v41 else True

    def kv_source(self, layer: int) -> int:
        """The layer whose compressed cache this layer reads (itself in V4; -1 for window-only)."""
        if self.ratio(layer) == 0:
            return -1
        if not self.is_v41:
            return layer
        return max(s for s in self.kv_source_layers if s <= layer)

    def has_indexer(self, layer: int) -> bool:
        """Whether the layer selects compressed entries with an indexer (CSA) rather than densely (HCA)."""
        if self.is_v41:
            return self.ratio(layer) > 0
        return self.ratio(layer) == 4

    def runs_indexer(self, layer: int) -> bool:
        """Whether the layer scores with its own index queries (V4.1 readers reuse a source's top-k)."""
        if not self.has_indexer(layer):
            return False
        return layer in self.index_source_layers if self.is_v41 else True

    def index_source(self, layer: int) -> int:
        if not self.is_v41:
            return layer if self.has_indexer(layer) else -1
        if self.ratio(layer) == 0:
            return -1
        return max(s for s in self.index_source_layers if s <= layer)

    def owns_index_keys(self, layer: int) -> bool:
        if self.is_v41:
            return layer in self.kv_source_layers
        return self.ratio(layer) == 4

    @property
    def decoder_start(self) -> int:
        """First decoder layer of V4.1's causal encoder-decoder (layers after the last KV source)."""
        if not self.is_v41:
            return self.n_layers
        return max(self.kv_source_layers) + 1

    @property
    def compressed_layers(self) -> list[int]:
        return [i for i in range(self.n_layers) if self.owns_compressor(i)]

    def replace(self, **kw: Any) -> ModelConfig:
        return dataclasses.replace(self, **kw)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("extra", None)
        return d


def default_compress_ratios(family: Family, n_layers: int) -> tuple[int, ...]:
    if family == "v41":
        return tuple([0, 0] + [2] * 18 + [1] * max(0, n_layers - 20))[:n_layers] + (0, 0, 0)
    ratios = [0 if i < 2 else (4 if i % 2 == 0 else 128) for i in range(n_layers)]
    return tuple(ratios) + (0,)


# config.json names of ModelConfig fields, so errors name what the user wrote
_HF_NAMES = {
    "dim": "hidden_size", "n_layers": "num_hidden_layers", "n_mtp_layers": "num_nextn_predict_layers",
    "n_heads": "num_attention_heads", "window_size": "sliding_window", "n_activated_experts": "num_experts_per_tok",
    "moe_inter_dim": "moe_intermediate_size", "n_hash_layers": "num_hash_layers", "score_func": "scoring_func",
    "route_scale": "routed_scaling_factor", "norm_eps": "rms_norm_eps", "max_position": "max_position_embeddings",
}
_INT_FIELDS = (
    "vocab_size", "hidden_size", "dim", "num_hidden_layers", "n_layers", "num_nextn_predict_layers", "n_mtp_layers",
    "num_attention_heads", "n_heads", "head_dim", "qk_rope_head_dim", "rope_head_dim", "q_lora_rank", "o_groups",
    "o_lora_rank", "sliding_window", "window_size", "max_position_embeddings", "index_n_heads", "index_head_dim",
    "index_topk", "n_routed_experts", "n_shared_experts", "num_experts_per_tok", "n_activated_experts",
    "moe_intermediate_size", "moe_inter_dim", "num_hash_layers", "n_hash_layers", "hc_mult", "hc_sinkhorn_iters",
    "bos_token_id", "original_seq_len", "candidate_source_layer_id", "candidate_topk_blocks", "candidate_block_size",
    "engram_max_ngram_size", "engram_vocab_size", "engram_n_heads", "engram_head_dim", "engram_pad_token_id",
    "engram_compressed_vocab_size", "dspark_block_size", "dspark_noise_token_id", "dspark_markov_rank",
    "dspark_n_routed_experts", "dspark_num_experts_per_tok", "image_token_id",
)
_FLOAT_FIELDS = (
    "rope_theta", "compress_rope_theta", "rope_factor", "beta_fast", "beta_slow", "routed_scaling_factor",
    "route_scale", "swiglu_limit", "hc_eps", "rms_norm_eps", "norm_eps", "partial_rotary_factor",
)


def _check_types(merged: dict[str, Any]) -> None:
    """Wrong JSON types fail with the field's name (not a bare int()/float() error)."""
    for name in _INT_FIELDS:
        v = merged.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise ConfigError(f"config field '{name}': must be an integer, got {v!r}")
    for name in _FLOAT_FIELDS:
        v = merged.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise ConfigError(f"config field '{name}': must be a number, got {v!r}")


def validate(c: ModelConfig) -> None:
    def bad(field_name: str, msg: str) -> None:
        hf = _HF_NAMES.get(field_name)
        raise ConfigError(f"config field '{hf or field_name}'{f' ({field_name})' if hf else ''}: {msg}")

    if c.family not in ("v4", "v41"):
        bad("family", f"unknown model family {c.family!r}; expected 'v4' or 'v41'")
    for name in ("vocab_size", "dim", "n_layers", "n_heads", "head_dim", "q_lora_rank", "o_groups",
                 "o_lora_rank", "window_size", "n_routed_experts", "n_activated_experts", "moe_inter_dim",
                 "hc_mult", "index_n_heads", "index_head_dim", "index_topk"):
        v = getattr(c, name)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            bad(name, f"must be a positive integer, got {v!r}")
    if len(c.compress_ratios) != c.n_layers + c.n_mtp_layers:
        bad("compress_ratios", f"needs n_layers + n_mtp_layers = {c.n_layers + c.n_mtp_layers} entries "
            f"(one per layer plus one per MTP/DSpark block), got {len(c.compress_ratios)}")
    for i, r in enumerate(c.compress_ratios):
        if not isinstance(r, int) or r < 0:
            bad("compress_ratios", f"entry {i} must be a non-negative integer, got {r!r}")
    if c.rope_dim <= 0 or c.rope_dim % 2 or c.rope_dim > c.head_dim:
        bad("qk_rope_head_dim", f"must be even and at most head_dim ({c.head_dim}), got {c.rope_dim}")
    if c.n_heads % c.o_groups:
        bad("o_groups", f"must divide num_attention_heads ({c.n_heads}), got {c.o_groups}")
    if c.n_activated_experts > c.n_routed_experts:
        bad("num_experts_per_tok", f"{c.n_activated_experts} exceeds n_routed_experts {c.n_routed_experts}")
    if c.score_func not in ("sqrtsoftplus", "softmax", "sigmoid"):
        bad("scoring_func", f"unsupported {c.score_func!r}; expected sqrtsoftplus, softmax or sigmoid")
    if c.n_shared_experts not in (0, 1):
        bad("n_shared_experts", f"v4serve supports 0 or 1 shared expert, got {c.n_shared_experts}")
    if c.index_head_dim < c.rope_dim or c.index_head_dim % 32:
        bad("index_head_dim", f"must be a multiple of 32 and at least the rope dim, got {c.index_head_dim}")
    if c.head_dim % 64 and c.family == "v4":
        bad("head_dim", f"V4 stores KV with one FP8 scale per 64 dims; head_dim {c.head_dim} is not a multiple of 64")
    if c.nope_dim % 64 and c.family == "v4":
        bad("qk_rope_head_dim", f"head_dim - rope dim = {c.nope_dim} must be a multiple of 64 (FP8 scale groups)")
    if c.weight_dtype not in ("fp8", "bf16"):
        bad("dtype", f"dense weight dtype must be 'fp8' or 'bf16', got {c.weight_dtype!r}")
    if c.expert_dtype not in ("fp4", "fp8", "bf16"):
        bad("expert_dtype", f"must be 'fp4', 'fp8' or 'bf16', got {c.expert_dtype!r}")
    if c.weight_block not in (32, 64, 128):
        bad("weight_block_size", f"must be 32, 64 or 128, got {c.weight_block}")
    if c.family == "v4":
        for i, r in enumerate(c.compress_ratios[: c.n_layers]):
            if r not in (0, 4) and (r < 8 or r & (r - 1)):
                bad("compress_ratios", f"layer {i}: V4 ratios are 0, 4 (CSA) or a power of two >= 8 (HCA), got {r}")
    else:
        srcs = c.kv_source_layers
        if not srcs:
            bad("kv_source_layer_ids", "V4.1 needs at least one KV source layer")
        for i, r in enumerate(c.compress_ratios[: c.n_layers]):
            if r not in (0, 1, 2):
                bad("compress_ratios", f"layer {i}: V4.1 ratios are 0, 1 or 2, got {r}")
            if r and not any(s <= i for s in srcs):
                bad("kv_source_layer_ids", f"layer {i} reads a compressed cache but no KV source precedes it")
        for s in srcs:
            if not (0 <= s < c.n_layers) or c.compress_ratios[s] == 0:
                bad("kv_source_layer_ids", f"source {s} must be a layer with a nonzero compress ratio")
        for s in srcs:
            if s not in c.index_source_layers:
                bad("index_source_layer_ids", f"KV source {s} must also be an index source (it owns the index keys)")
        for s in c.index_source_layers:
            if not (0 <= s < c.n_layers) or c.compress_ratios[s] == 0:
                bad("index_source_layer_ids", f"index source {s} must be a layer with a nonzero compress ratio")
        for i in range(c.n_layers):
            if c.compress_ratios[i] and not any(s <= i for s in c.index_source_layers):
                bad("index_source_layer_ids", f"layer {i} needs an index source at or before it")
            if c.compress_ratios[i] and c.compress_ratios[i] != c.compress_ratios[c.kv_source(i)]:
                bad("compress_ratios", f"layer {i} reads source {c.kv_source(i)} of another ratio")
        if c.candidate_source_layer >= 0 and c.candidate_source_layer not in c.index_source_layers:
            bad("candidate_source_layer_id", f"{c.candidate_source_layer} is not an index source")
        if len(c.engram_layers) != len(c.engram_num_embeddings):
            bad("engram_num_embeddings", f"needs one entry per engram layer {list(c.engram_layers)}")
        if c.engram_layers and c.engram_head_dim % 32:
            bad("engram_head_dim", f"must be a multiple of 32 (FP8 scales per 32), got {c.engram_head_dim}")
        for t in c.dspark_target_layers:
            if not 0 <= t < c.n_layers:
                bad("dspark_target_layer_ids", f"layer {t} is out of range")


# ------------------------------------------------------------------------------------------------
# Parsing config.json
# ------------------------------------------------------------------------------------------------

def _get(d: dict[str, Any], *names: str, default: Any = None) -> Any:
    for n in names:
        if n in d and d[n] is not None:
            return d[n]
    return default


def _int_list(v: Any, field_name: str) -> tuple[int, ...]:
    if v is None:
        return ()
    if not isinstance(v, (list, tuple)) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise ConfigError(f"config field '{field_name}': must be a list of integers, got {v!r}")
    return tuple(int(x) for x in v)


_LAYER_TYPE_RATIO = {"sliding_attention": 0, "compressed_sparse_attention": 4, "heavily_compressed_attention": 128}


def config_from_dict(hf: dict[str, Any], inference: dict[str, Any] | None = None, name: str = "custom") -> ModelConfig:
    """Build a ModelConfig from a Hugging Face `config.json` dict and an optional `inference/config.json`."""
    if not isinstance(hf, dict):
        raise ConfigError("config.json must hold a JSON object")
    inf = inference or {}
    model_type = hf.get("model_type", inf.get("model_type"))
    text = hf.get("text_config") if isinstance(hf.get("text_config"), dict) else None
    # the release nests the text model under text_config (its model_type reads "deepseek_v41" or "deepseek_v41_text")
    text_type = str(text.get("model_type", "")) if text is not None else ""
    is_v41 = model_type == "deepseek_v41" or text_type.startswith("deepseek_v41")
    if is_v41:
        family: Family = "v41"
        # text_config holds the text model; top-level fields (image_token_id, ...) fill the gaps
        src = {**{k: v for k, v in hf.items() if k != "text_config"}, **(text or {})}
    elif model_type in ("deepseek_v4", None):
        family = "v4"
        src = dict(hf)
    else:
        raise ConfigError(f"config field 'model_type': {model_type!r} is not a DeepSeek-V4 model "
                          "(expected 'deepseek_v4' or 'deepseek_v41')")
    merged = {**src, **inf}  # the reference's names sit beside the HF ones

    _check_types(merged)

    def req(*names: str) -> Any:
        v = _get(merged, *names)
        if v is None:
            raise ConfigError(f"config field '{names[0]}' is missing")
        return v

    n_layers = int(req("num_hidden_layers", "n_layers"))
    n_mtp = int(_get(merged, "num_nextn_predict_layers", "n_mtp_layers", default=1 if family == "v4" else 3))
    ratios = _get(merged, "compress_ratios")
    if ratios is None and isinstance(merged.get("layer_types"), list):
        rates = dict(_LAYER_TYPE_RATIO)
        if isinstance(merged.get("compress_rates"), dict):  # transformers' per-type ratios (e.g. HCA 8, not 128)
            rates.update({k: v for k, v in merged["compress_rates"].items() if k in rates and k != "sliding_attention"})
        try:
            ratios = [rates[t] for t in merged["layer_types"]] + [0] * n_mtp
        except KeyError as e:
            raise ConfigError(f"config field 'layer_types': unknown layer type {e.args[0]!r}") from None
    ratios_t = _int_list(ratios, "compress_ratios") if ratios is not None else default_compress_ratios(family, n_layers)
    if n_layers <= len(ratios_t) < n_layers + n_mtp:
        # draft blocks (MTP / DSpark) attend over their window only; some releases list fewer of them (0731 ships a
        # 3-block draft next to a 44-entry schedule)
        ratios_t = ratios_t + (0,) * (n_layers + n_mtp - len(ratios_t))

    rope = _get(merged, "rope_scaling", default=None) or {}
    rp = merged.get("rope_parameters")
    if isinstance(rp, dict) and isinstance(rp.get("compress"), dict):
        rope = {**rp["compress"], **rope}
    head_dim = int(_get(merged, "head_dim", default=512))
    rope_dim = _get(merged, "qk_rope_head_dim", "rope_head_dim")
    if rope_dim is None and merged.get("partial_rotary_factor"):
        rope_dim = int(round(head_dim * float(merged["partial_rotary_factor"])))
    qc = merged.get("quantization_config") or {}
    # inference/config.json's `dtype` names the weight format; config.json's `dtype` (V4.1 writes "bfloat16") is the
    # torch dtype of the unquantized parts, so a quantization_config outranks it
    wdtype = str(_get(inf, "dtype", default=None) or ("fp8" if qc.get("quant_method") == "fp8" else None)
                 or _get(src, "dtype", default=None) or "bf16")
    if wdtype in ("bfloat16", "float32", "float16"):
        wdtype = "bf16"
    edtype = _get(merged, "expert_dtype", default=None) or qc.get("expert_dtype")
    if edtype is None:
        edtype = "fp8" if wdtype == "fp8" else "bf16"
    block = qc.get("weight_block_size") or [32 if family == "v41" else 128] * 2
    if not (isinstance(block, (list, tuple)) and len(block) == 2 and block[0] == block[1]):
        raise ConfigError(f"config field 'quantization_config.weight_block_size': expected a square block, got {block!r}")
    n_hash = _get(merged, "num_hash_layers", "n_hash_layers")
    if n_hash is None and isinstance(merged.get("mlp_layer_types"), list):
        n_hash = sum(1 for t in merged["mlp_layer_types"] if t == "hash_moe")
    eos = _get(merged, "eos_token_id", default=1)
    if isinstance(eos, list):
        eos = eos[0]

    kw: dict[str, Any] = dict(
        family=family, name=name,
        vocab_size=int(req("vocab_size")),
        dim=int(req("hidden_size", "dim")),
        n_layers=n_layers, n_mtp_layers=n_mtp,
        n_heads=int(req("num_attention_heads", "n_heads")),
        head_dim=head_dim,
        rope_dim=int(rope_dim if rope_dim is not None else 64),
        q_lora_rank=int(req("q_lora_rank")),
        o_groups=int(req("o_groups")),
        o_lora_rank=int(req("o_lora_rank")),
        window_size=int(_get(merged, "sliding_window", "window_size", default=128)),
        compress_ratios=ratios_t,
        rope_theta=float(_get(merged, "rope_theta", default=10000.0)),
        compress_rope_theta=float(_get(merged, "compress_rope_theta", default=160000.0)),
        rope_factor=float(_get(rope, "factor", default=_get(merged, "rope_factor", default=16.0))),
        original_seq_len=int(_get(rope, "original_max_position_embeddings", default=_get(merged, "original_seq_len", default=65536))),
        beta_fast=float(_get(rope, "beta_fast", default=_get(merged, "beta_fast", default=32))),
        beta_slow=float(_get(rope, "beta_slow", default=_get(merged, "beta_slow", default=1))),
        max_position=int(_get(merged, "max_position_embeddings", "max_seq_len", default=1048576)),
        index_n_heads=int(_get(merged, "index_n_heads", default=64)),
        index_head_dim=int(_get(merged, "index_head_dim", default=128)),
        index_topk=int(_get(merged, "index_topk", default=512)),
        n_routed_experts=int(req("n_routed_experts")),
        n_shared_experts=int(_get(merged, "n_shared_experts", default=1)),
        n_activated_experts=int(req("num_experts_per_tok", "n_activated_experts")),
        moe_inter_dim=int(req("moe_intermediate_size", "moe_inter_dim")),
        n_hash_layers=int(n_hash if n_hash is not None else (3 if family == "v4" else 0)),
        score_func=str(_get(merged, "scoring_func", "score_func", default="sqrtsoftplus")),
        route_scale=float(_get(merged, "routed_scaling_factor", "route_scale", default=1.0)),
        swiglu_limit=float(_get(merged, "swiglu_limit", default=0.0)),
        norm_topk_prob=bool(_get(merged, "norm_topk_prob", default=True)),
        hc_mult=int(_get(merged, "hc_mult", default=4)),
        hc_sinkhorn_iters=int(_get(merged, "hc_sinkhorn_iters", default=20)),
        hc_eps=float(_get(merged, "hc_eps", default=1e-6)),
        norm_eps=float(_get(merged, "rms_norm_eps", "norm_eps", default=1e-6)),
        bos_token_id=int(_get(merged, "bos_token_id", default=0)),
        eos_token_id=int(eos),
        weight_dtype=wdtype, expert_dtype=str(edtype), weight_block=int(block[0]),
    )
    if family == "v41":
        kw.update(
            kv_source_layers=_int_list(req("kv_source_layer_ids"), "kv_source_layer_ids"),
            index_source_layers=_int_list(req("index_source_layer_ids"), "index_source_layer_ids"),
            candidate_source_layer=int(_get(merged, "candidate_source_layer_id", default=-1)),
            candidate_topk_blocks=int(_get(merged, "candidate_topk_blocks", default=2048)),
            candidate_block_size=int(_get(merged, "candidate_block_size", default=8)),
            engram_layers=_int_list(_get(merged, "engram_layer_ids", default=[]), "engram_layer_ids"),
            engram_num_embeddings=_int_list(_get(merged, "engram_num_embeddings", default=[]), "engram_num_embeddings"),
            engram_max_ngram=int(_get(merged, "engram_max_ngram_size", default=4)),
            engram_vocab_size=int(_get(merged, "engram_vocab_size", default=16000000)),
            engram_n_heads=int(_get(merged, "engram_n_heads", default=8)),
            engram_head_dim=int(_get(merged, "engram_head_dim", default=256)),
            engram_pad_id=int(_get(merged, "engram_pad_token_id", "engram_pad_id", default=2)),
            engram_compressed_vocab=int(_get(merged, "engram_compressed_vocab_size", default=99092)),
            dspark_block_size=int(_get(merged, "dspark_block_size", default=5)),
            dspark_noise_token_id=int(_get(merged, "dspark_noise_token_id", default=128799)),
            dspark_target_layers=_int_list(_get(merged, "dspark_target_layer_ids", default=[]), "dspark_target_layer_ids"),
            dspark_markov_rank=int(_get(merged, "dspark_markov_rank", default=256)),
            dspark_n_routed_experts=int(_get(merged, "dspark_n_routed_experts", default=128)),
            dspark_n_activated_experts=int(_get(merged, "dspark_num_experts_per_tok", default=3)),
            image_token_id=int(_get(merged, "image_token_id", default=129264)),
        )
    try:
        return ModelConfig(**kw)
    except (TypeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(str(e)) from None


def load_config(folder: str | Path) -> ModelConfig:
    folder = Path(folder)
    path = folder / "config.json"
    if not path.is_file():
        raise ConfigError(f"{folder} has no config.json; pass a checkpoint folder or a preset name")
    try:
        hf = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON: {e}") from None
    inf = None
    ipath = folder / "inference" / "config.json"
    if ipath.is_file():
        try:
            inf = json.loads(ipath.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"{ipath} is not valid JSON: {e}") from None
    return config_from_dict(hf, inf, name=folder.name)


# ------------------------------------------------------------------------------------------------
# Writing config.json (the official layout)
# ------------------------------------------------------------------------------------------------

def hf_config_dict(c: ModelConfig, quantized: bool) -> dict[str, Any]:
    """config.json in the released Hugging Face layout (V4.1 nests the text model under text_config)."""
    text: dict[str, Any] = {
        "vocab_size": c.vocab_size, "hidden_size": c.dim, "num_hidden_layers": c.n_layers,
        "num_nextn_predict_layers": c.n_mtp_layers, "num_attention_heads": c.n_heads,
        "num_key_value_heads": 1, "head_dim": c.head_dim, "qk_rope_head_dim": c.rope_dim,
        "q_lora_rank": c.q_lora_rank, "o_groups": c.o_groups, "o_lora_rank": c.o_lora_rank,
        "sliding_window": c.window_size, "max_position_embeddings": c.max_position,
        "rope_theta": c.rope_theta, "compress_rope_theta": c.compress_rope_theta,
        "rope_scaling": {"type": "yarn", "factor": c.rope_factor,
                         "original_max_position_embeddings": c.original_seq_len,
                         "beta_fast": c.beta_fast, "beta_slow": c.beta_slow},
        "compress_ratios": list(c.compress_ratios),
        "index_n_heads": c.index_n_heads, "index_head_dim": c.index_head_dim, "index_topk": c.index_topk,
        "n_routed_experts": c.n_routed_experts, "n_shared_experts": c.n_shared_experts,
        "num_experts_per_tok": c.n_activated_experts, "moe_intermediate_size": c.moe_inter_dim,
        "scoring_func": c.score_func, "topk_method": "noaux_tc", "norm_topk_prob": c.norm_topk_prob,
        "routed_scaling_factor": c.route_scale, "swiglu_limit": c.swiglu_limit, "hidden_act": "silu",
        "hc_mult": c.hc_mult, "hc_sinkhorn_iters": c.hc_sinkhorn_iters, "hc_eps": c.hc_eps,
        "rms_norm_eps": c.norm_eps, "bos_token_id": c.bos_token_id, "eos_token_id": c.eos_token_id,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }
    if c.family == "v4":
        text["num_hash_layers"] = c.n_hash_layers
    else:
        text.update({
            "model_type": "deepseek_v41",
            "kv_source_layer_ids": list(c.kv_source_layers),
            "index_source_layer_ids": list(c.index_source_layers),
            "candidate_source_layer_id": c.candidate_source_layer,
            "candidate_topk_blocks": c.candidate_topk_blocks,
            "candidate_block_size": c.candidate_block_size,
            "engram_layer_ids": list(c.engram_layers),
            "engram_num_embeddings": list(c.engram_num_embeddings),
            "engram_max_ngram_size": c.engram_max_ngram, "engram_vocab_size": c.engram_vocab_size,
            "engram_n_heads": c.engram_n_heads, "engram_head_dim": c.engram_head_dim,
            "engram_pad_token_id": c.engram_pad_id, "engram_compressed_vocab_size": c.engram_compressed_vocab,
            "dspark_block_size": c.dspark_block_size, "dspark_noise_token_id": c.dspark_noise_token_id,
            "dspark_target_layer_ids": list(c.dspark_target_layers),
            "dspark_markov_rank": c.dspark_markov_rank, "dspark_n_routed_experts": c.dspark_n_routed_experts,
            "dspark_num_experts_per_tok": c.dspark_n_activated_experts, "image_token_id": c.image_token_id,
        })
    qc: dict[str, Any] = {}
    if quantized:
        qc = {"quant_method": "fp8", "activation_scheme": "dynamic", "scale_fmt": "ue8m0",
              "weight_block_size": [c.weight_block, c.weight_block]}
        if c.family == "v4":
            qc["fmt"] = "e4m3"
            text["quantization_config"] = qc
        else:
            qc["expert_dtype"] = c.expert_dtype
    if c.family == "v4":
        return {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", **text}
    # V4.1's release keeps quantization_config at the top level, beside text_config and vision_config
    out: dict[str, Any] = {"architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41",
                           "text_config": text, "image_token_id": c.image_token_id,
                           "bos_token_id": c.bos_token_id, "eos_token_id": c.eos_token_id}
    if qc:
        out["quantization_config"] = qc
    return out


def inference_config_dict(c: ModelConfig, quantized: bool) -> dict[str, Any]:
    """inference/config.json: the names DeepSeek's reference code reads."""
    d: dict[str, Any] = {
        "vocab_size": c.vocab_size, "dim": c.dim, "moe_inter_dim": c.moe_inter_dim, "n_layers": c.n_layers,
        "n_mtp_layers": c.n_mtp_layers, "n_heads": c.n_heads, "n_routed_experts": c.n_routed_experts,
        "n_shared_experts": c.n_shared_experts, "n_activated_experts": c.n_activated_experts,
        "score_func": c.score_func, "route_scale": c.route_scale, "swiglu_limit": c.swiglu_limit,
        "q_lora_rank": c.q_lora_rank, "head_dim": c.head_dim, "rope_head_dim": c.rope_dim,
        "norm_eps": c.norm_eps, "o_groups": c.o_groups, "o_lora_rank": c.o_lora_rank,
        "window_size": c.window_size, "compress_ratios": list(c.compress_ratios),
        "compress_rope_theta": c.compress_rope_theta, "original_seq_len": c.original_seq_len,
        "rope_theta": c.rope_theta, "rope_factor": c.rope_factor, "beta_fast": c.beta_fast,
        "beta_slow": c.beta_slow, "index_n_heads": c.index_n_heads, "index_head_dim": c.index_head_dim,
        "index_topk": c.index_topk, "hc_mult": c.hc_mult, "hc_sinkhorn_iters": c.hc_sinkhorn_iters,
        "hc_eps": c.hc_eps,
        "dtype": "fp8" if quantized else "bf16", "scale_fmt": "ue8m0",
        "expert_dtype": c.expert_dtype if quantized else None,
    }
    if c.family == "v4":
        d["n_hash_layers"] = c.n_hash_layers
    else:
        d["model_type"] = "deepseek_v41"
        for k, v in hf_config_dict(c, quantized)["text_config"].items():
            if k.startswith(("kv_source", "index_source", "candidate", "engram", "dspark")):
                d[k.replace("engram_pad_token_id", "engram_pad_id")] = v
    return d


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def yarn_correction_range(c: ModelConfig) -> tuple[int, int]:
    """YaRN's ramp over rope pair indices, as DeepSeek's reference computes it."""
    dim = c.rope_dim

    def corr(rot: float) -> float:
        return dim * math.log(c.original_seq_len / (rot * 2 * math.pi)) / (2 * math.log(c.compress_rope_theta))

    low = math.floor(corr(c.beta_fast))
    high = math.ceil(corr(c.beta_slow))
    return max(low, 0), min(high, dim - 1)
