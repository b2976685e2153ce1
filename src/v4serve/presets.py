"""Named model configurations.

* `tiny-*`: CPU scale. Every mechanism fires within ~100 tokens (window 16, CSA ratio 4 with top-4 selection,
  HCA ratio 8, hash-routed and bias-routed MoE, MTP / DSpark, a small SwiGLU clamp so it actually clips).
* `v4-flash`, `v4-pro`, `v41-flash`: the released geometry.
* Reduced single-GPU geometries keep the real per-layer shapes and per-token active work and name what they cut:
  `-e16` = 16 routed experts per layer, `-l8` = 8 layers, `-engram1m` = Engram tables cut to ~1M rows each.
"""

from __future__ import annotations

from .config import ConfigError, ModelConfig

_V4_FLASH = dict(
    family="v4", vocab_size=129280, dim=4096, n_layers=43, n_mtp_layers=1, n_heads=64, head_dim=512, rope_dim=64,
    q_lora_rank=1024, o_groups=8, o_lora_rank=1024, window_size=128, rope_theta=10000.0,
    compress_rope_theta=160000.0, rope_factor=16.0, original_seq_len=65536, beta_fast=32.0, beta_slow=1.0,
    max_position=1048576, index_n_heads=64, index_head_dim=128, index_topk=512, n_routed_experts=256,
    n_shared_experts=1, n_activated_experts=6, moe_inter_dim=2048, n_hash_layers=3, score_func="sqrtsoftplus",
    route_scale=1.5, swiglu_limit=10.0, hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, norm_eps=1e-6,
    weight_dtype="fp8", expert_dtype="fp4", weight_block=128,
)


def _v4_ratios(n_layers: int, first: int) -> tuple[int, ...]:
    return tuple(first if i < 2 else (4 if i % 2 == 0 else 128) for i in range(n_layers)) + (0,)


def _v4_flash(**kw: object) -> ModelConfig:
    d = {**_V4_FLASH, **kw}
    d.setdefault("compress_ratios", _v4_ratios(int(d["n_layers"]), 0))  # type: ignore[arg-type]
    return ModelConfig(**d)  # type: ignore[arg-type]


def _v4_pro(**kw: object) -> ModelConfig:
    d = {**_V4_FLASH, "dim": 7168, "n_layers": 61, "n_heads": 128, "q_lora_rank": 1536, "o_groups": 16,
         "n_routed_experts": 384, "moe_inter_dim": 3072, "route_scale": 2.5, "index_topk": 1024, **kw}
    d.setdefault("compress_ratios", _v4_ratios(int(d["n_layers"]), 128))  # type: ignore[arg-type]
    return ModelConfig(**d)  # type: ignore[arg-type]


_V41_ENGRAM_ROWS = (384006168, 384016682)


def _v41_flash(**kw: object) -> ModelConfig:
    n_layers = int(kw.get("n_layers", 40))  # type: ignore[arg-type]
    d = dict(
        family="v41", vocab_size=129280, dim=5120, n_layers=40, n_mtp_layers=3, n_heads=64, head_dim=512,
        rope_dim=64, q_lora_rank=1280, o_groups=8, o_lora_rank=1024, window_size=128, rope_theta=10000.0,
        compress_rope_theta=160000.0, rope_factor=16.0, original_seq_len=65536, beta_fast=32.0, beta_slow=1.0,
        max_position=1048576, index_n_heads=32, index_head_dim=128, index_topk=512, n_routed_experts=384,
        n_shared_experts=1, n_activated_experts=6, moe_inter_dim=2304, n_hash_layers=0,
        score_func="sqrtsoftplus", route_scale=1.5, swiglu_limit=10.0, hc_mult=4, hc_sinkhorn_iters=20,
        hc_eps=1e-6, norm_eps=1e-20, weight_dtype="fp8", expert_dtype="fp4", weight_block=32,
        compress_ratios=tuple([0, 0] + [2] * 18 + [1] * (n_layers - 20) + [0, 0, 0]),
        kv_source_layers=(2, 8, 14, 20), index_source_layers=(2, 8, 14, 20, 24, 28, 32, 36),
        candidate_source_layer=20, candidate_topk_blocks=2048, candidate_block_size=8,
        engram_layers=(1, 14), engram_num_embeddings=_V41_ENGRAM_ROWS, engram_max_ngram=4,
        engram_vocab_size=16000000, engram_n_heads=8, engram_head_dim=256, engram_pad_id=2,
        engram_compressed_vocab=99092, dspark_block_size=5, dspark_noise_token_id=128799,
        dspark_target_layers=(37, 38, 39), dspark_markov_rank=256, dspark_n_routed_experts=128,
        dspark_n_activated_experts=3,
    )
    d.update(kw)
    return ModelConfig(**d)  # type: ignore[arg-type]


def _tiny_v4(first_ratio: int, name: str) -> ModelConfig:
    return ModelConfig(
        family="v4", name=name, vocab_size=129280, dim=64, n_layers=5, n_mtp_layers=1, n_heads=4, head_dim=128,
        rope_dim=64, q_lora_rank=32, o_groups=2, o_lora_rank=16, window_size=16,
        compress_ratios=(first_ratio, first_ratio, 4, 8, 4, 0), rope_theta=10000.0,
        compress_rope_theta=160000.0, rope_factor=16.0, original_seq_len=64, beta_fast=32.0, beta_slow=1.0,
        max_position=65536, index_n_heads=8, index_head_dim=128, index_topk=4, n_routed_experts=8,
        n_shared_experts=1, n_activated_experts=2, moe_inter_dim=32, n_hash_layers=2,
        score_func="sqrtsoftplus", route_scale=1.5, swiglu_limit=1.0, hc_mult=4, hc_sinkhorn_iters=20,
        hc_eps=1e-6, norm_eps=1e-6, weight_dtype="fp8", expert_dtype="fp4", weight_block=32,
    )


def _tiny_v41() -> ModelConfig:
    # 12 layers: 0-1 window only, 2-5 ratio 2 (source 2), 6-11 ratio 1 (source 6); index sources 2, 6, 9;
    # the candidate level at layer 6; Engram at 1 and 4; decoder = layers 7-11; 3 DSpark blocks.
    return ModelConfig(
        family="v41", name="tiny-v41-flash", vocab_size=129280, dim=64, n_layers=12, n_mtp_layers=3, n_heads=4,
        head_dim=128, rope_dim=64, q_lora_rank=32, o_groups=2, o_lora_rank=16, window_size=16,
        compress_ratios=(0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 0, 0, 0), rope_theta=10000.0,
        compress_rope_theta=160000.0, rope_factor=16.0, original_seq_len=64, beta_fast=32.0, beta_slow=1.0,
        max_position=65536, index_n_heads=2, index_head_dim=64, index_topk=8, n_routed_experts=8,
        n_shared_experts=1, n_activated_experts=2, moe_inter_dim=32, n_hash_layers=0,
        score_func="sqrtsoftplus", route_scale=1.5, swiglu_limit=1.0, hc_mult=4, hc_sinkhorn_iters=20,
        hc_eps=1e-6, norm_eps=1e-20, weight_dtype="fp8", expert_dtype="fp4", weight_block=32,
        kv_source_layers=(2, 6), index_source_layers=(2, 6, 9), candidate_source_layer=6,
        candidate_topk_blocks=4, candidate_block_size=4,
        # row counts = sums of the 6 primes above engram_vocab_size - 1 each layer hashes into (models/v41/engram_hash)
        engram_layers=(1, 4), engram_num_embeddings=(6090, 6296), engram_max_ngram=4, engram_vocab_size=997,
        engram_n_heads=2, engram_head_dim=32, engram_pad_id=2, engram_compressed_vocab=99092,
        dspark_block_size=5, dspark_noise_token_id=128799, dspark_target_layers=(9, 10, 11),
        dspark_markov_rank=16, dspark_n_routed_experts=4, dspark_n_activated_experts=2,
    )


def _named(c: ModelConfig, name: str) -> ModelConfig:
    return c.replace(name=name)


PRESETS = {
    "tiny-v4-flash": lambda: _tiny_v4(0, "tiny-v4-flash"),
    "tiny-v4-pro": lambda: _tiny_v4(8, "tiny-v4-pro"),
    "tiny-v41-flash": _tiny_v41,
    "v4-flash": lambda: _named(_v4_flash(), "v4-flash"),
    "v4-pro": lambda: _named(_v4_pro(), "v4-pro"),
    "v41-flash": lambda: _named(_v41_flash(), "v41-flash"),
    # single-GPU reductions: real per-layer shapes and active work, fewer experts and/or layers
    "v4-flash-e16": lambda: _named(_v4_flash(n_routed_experts=16), "v4-flash-e16"),
    "v4-flash-l8-e16": lambda: _named(_v4_flash(n_layers=8, n_routed_experts=16), "v4-flash-l8-e16"),
    "v4-pro-l8-e16": lambda: _named(_v4_pro(n_layers=8, n_routed_experts=16), "v4-pro-l8-e16"),
    # Engram: 24 primes above 41,666 per layer -> ~1M rows (same 24 rows read per token as the release)
    "v41-flash-e16-engram1m": lambda: _named(
        _v41_flash(n_routed_experts=16, dspark_n_routed_experts=16, engram_vocab_size=41667,
                   engram_num_embeddings=(1003416, 1008878)),
        "v41-flash-e16-engram1m"),
}

DEMO_PRESET = "tiny-v4-flash"


def get_preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]()
    except KeyError:
        raise ConfigError(f"unknown model preset {name!r}; known presets: {', '.join(sorted(PRESETS))}, "
                          "or pass a checkpoint folder") from None


def is_preset(name: str) -> bool:
    return name in PRESETS
