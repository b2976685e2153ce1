"""Config parsing: released config.json files (Hugging Face names) and inference/config.json (reference names)
parse to the right ModelConfig; bad fields raise ConfigError naming the field; presets are valid."""

from __future__ import annotations

import copy
import json

import pytest

from v4serve.config import (
    ConfigError,
    ModelConfig,
    config_from_dict,
    hf_config_dict,
    inference_config_dict,
    load_config,
)
from v4serve.models.checkpoint import transformers_layer_fields
from v4serve.presets import PRESETS, get_preset

FLASH_RATIOS = [0, 0] + [4 if i % 2 == 0 else 128 for i in range(2, 43)] + [0]

# DeepSeek-V4-Flash config.json as released (spec §2.1: field names and values)
V4_FLASH_CONFIG = {
    "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
    "vocab_size": 129280, "hidden_size": 4096, "num_hidden_layers": 43, "num_nextn_predict_layers": 1,
    "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512, "qk_rope_head_dim": 64,
    "q_lora_rank": 1024, "o_groups": 8, "o_lora_rank": 1024, "sliding_window": 128,
    "max_position_embeddings": 1048576, "rope_theta": 10000, "compress_rope_theta": 160000,
    "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536, "beta_fast": 32,
                     "beta_slow": 1},
    "compress_ratios": FLASH_RATIOS,
    "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512,
    "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 6, "moe_intermediate_size": 2048,
    "num_hash_layers": 3, "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc", "norm_topk_prob": True,
    "routed_scaling_factor": 1.5, "swiglu_limit": 10.0, "hidden_act": "silu",
    "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-6,
    "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                            "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
}
# the reference's inference/config.json adds the expert dtype (only there) and its own names
V4_FLASH_INFERENCE = {"dtype": "fp8", "expert_dtype": "fp4", "scale_fmt": "ue8m0", "n_hash_layers": 3,
                      "window_size": 128, "original_seq_len": 65536, "rope_factor": 16, "route_scale": 1.5}


def test_v4_flash_config_json_parses_to_the_released_geometry():
    c = config_from_dict(V4_FLASH_CONFIG, V4_FLASH_INFERENCE, name="v4-flash")
    assert c == get_preset("v4-flash")
    assert (c.family, c.dim, c.n_layers, c.n_mtp_layers, c.n_heads, c.head_dim, c.rope_dim) == \
        ("v4", 4096, 43, 1, 64, 512, 64)
    assert c.nope_dim == 448 and c.window_size == 128 and c.weight_block == 128
    assert (c.weight_dtype, c.expert_dtype) == ("fp8", "fp4")
    assert (c.rope_factor, c.original_seq_len, c.beta_fast, c.beta_slow) == (16.0, 65536, 32.0, 1.0)
    assert (c.n_routed_experts, c.n_activated_experts, c.moe_inter_dim, c.route_scale) == (256, 6, 2048, 1.5)
    assert len(c.compress_ratios) == 44 and c.ratio(43) == 0  # the MTP layer is window-only
    assert [i for i in range(43) if c.ratio(i) == 4] == list(range(2, 43, 2))
    assert sum(1 for i in range(43) if c.ratio(i) == 128) == 20
    assert [c.is_hash_layer(i) for i in range(4)] == [True, True, True, False]
    assert c.has_indexer(2) and not c.has_indexer(3) and not c.has_indexer(0)
    assert c.compressed_layers == list(range(2, 43))


def test_v4_flash_config_json_alone_parses():
    """Without inference/config.json (the HF quantization_config does not describe the FP4 experts)."""
    c = config_from_dict(V4_FLASH_CONFIG)
    assert c.replace(name="v4-flash", expert_dtype="fp4") == get_preset("v4-flash")


def test_v4_pro_config_json_parses():
    hf = copy.deepcopy(V4_FLASH_CONFIG)
    hf.update({"hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128, "q_lora_rank": 1536,
               "o_groups": 16, "n_routed_experts": 384, "moe_intermediate_size": 3072, "routed_scaling_factor": 2.5,
               "index_topk": 1024,
               "compress_ratios": [128, 128] + [4 if i % 2 == 0 else 128 for i in range(2, 61)] + [0]})
    inf = {**V4_FLASH_INFERENCE, "route_scale": 2.5}
    c = config_from_dict(hf, inf, name="v4-pro")
    assert c == get_preset("v4-pro")
    assert sum(1 for i in range(61) if c.ratio(i) == 128) == 31 and sum(1 for i in range(61) if c.ratio(i) == 4) == 30


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_validates_and_round_trips_through_its_config_files(name):
    c = get_preset(name)
    assert isinstance(c, ModelConfig) and c.name == name
    assert len(c.compress_ratios) == c.n_layers + c.n_mtp_layers
    for quantized in (True, False):
        back = config_from_dict(json.loads(json.dumps(hf_config_dict(c, quantized))),
                                json.loads(json.dumps(inference_config_dict(c, quantized))), name=name)
        if quantized:
            assert back == c
        else:  # an unquantized checkpoint has unquantized weights; the geometry is the same
            assert back.replace(weight_dtype=c.weight_dtype, expert_dtype=c.expert_dtype,
                                weight_block=c.weight_block) == c


def test_tiny_presets_exercise_every_mechanism_within_a_short_prompt():
    for name, first in (("tiny-v4-flash", 0), ("tiny-v4-pro", 8)):
        c = get_preset(name)
        ratios = c.compress_ratios[: c.n_layers]
        assert ratios[:2] == (first, first)  # like the real models: window-only (Flash) / HCA (Pro) first layers
        assert set(ratios) == ({0, 4, 8} if first == 0 else {4, 8})  # window-only, CSA (ratio 4), HCA (ratio 8)
        assert c.compress_ratios[c.n_layers:] == (0,)  # the MTP block attends over its window only
        assert c.window_size <= 16 and c.index_topk < 100 // 4  # top-k selection really selects
        assert 0 < c.n_hash_layers < c.n_layers  # hash- and bias-routed MoE layers
        assert c.swiglu_limit > 0 and c.n_mtp_layers == 1


def test_transformers_layer_types_and_compress_rates_parse():
    """transformers' save_pretrained writes layer_types + compress_rates instead of compress_ratios."""
    c = get_preset("tiny-v4-pro")  # HCA ratio 8, not transformers' default 128
    hf = hf_config_dict(c, quantized=False)
    del hf["compress_ratios"]
    hf.update(transformers_layer_fields(c))
    assert hf["compress_rates"]["heavily_compressed_attention"] == 8
    assert config_from_dict(hf).compress_ratios == c.compress_ratios
    # without compress_rates the type names imply the released ratios (4 and 128)
    del hf["compress_rates"]
    assert config_from_dict(hf).compress_ratios == (128, 128, 4, 128, 4, 0)


def _set(**kw):
    def f(d):
        d.update(kw)
    return f


def _del(key):
    def f(d):
        del d[key]
    return f


# mutation of V4_FLASH_CONFIG -> the names (HF or reference) of which at least one the error must mention
BAD = {
    "model_type": (_set(model_type="llama"), ["model_type"]),
    "missing_hidden_size": (_del("hidden_size"), ["hidden_size"]),
    "zero_heads": (_set(num_attention_heads=0), ["num_attention_heads", "n_heads"]),
    "o_groups": (_set(o_groups=7), ["o_groups"]),
    "ratios_length": (_set(compress_ratios=FLASH_RATIOS[:40]), ["compress_ratios"]),  # fewer than the layers
    "ratio_value": (_set(compress_ratios=[0, 0, 3] + FLASH_RATIOS[3:]), ["compress_ratios"]),
    "ratio_type": (_set(compress_ratios=["4"] * 44), ["compress_ratios"]),
    "topk_experts": (_set(num_experts_per_tok=300), ["num_experts_per_tok"]),
    "scoring": (_set(scoring_func="relu"), ["scoring_func"]),
    "rope_dim": (_set(qk_rope_head_dim=63), ["qk_rope_head_dim"]),
    "nope_dim": (_set(qk_rope_head_dim=96), ["qk_rope_head_dim"]),
    "shared_experts": (_set(n_shared_experts=2), ["n_shared_experts"]),
    "block": (_set(quantization_config={"quant_method": "fp8", "weight_block_size": [128, 64]}),
              ["weight_block_size", "quantization_config.weight_block_size"]),
    "block_size": (_set(quantization_config={"quant_method": "fp8", "weight_block_size": [96, 96]}),
                   ["weight_block_size"]),
    "hidden_type": (_set(hidden_size="big"), ["hidden_size"]),
    "theta_type": (_set(rope_theta=[1]), ["rope_theta"]),
    "layers_bool": (_set(num_hidden_layers=True), ["num_hidden_layers"]),
    "layer_types": (lambda d: (d.pop("compress_ratios"), d.update(layer_types=["sliding_attention", "mystery"]
                                                                    + ["sliding_attention"] * 41)),
                    ["layer_types"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_field_raises_config_error_naming_it(case):
    mutate, names = BAD[case]
    d = copy.deepcopy(V4_FLASH_CONFIG)
    mutate(d)
    with pytest.raises(ConfigError) as e:
        config_from_dict(d)
    assert any(f"'{n}'" in str(e.value) for n in names), str(e.value)


def test_bad_inference_config_field_is_reported():
    with pytest.raises(ConfigError, match="expert_dtype"):
        config_from_dict(V4_FLASH_CONFIG, {**V4_FLASH_INFERENCE, "expert_dtype": "int3"})


def test_direct_construction_validates():
    with pytest.raises(ConfigError, match="o_groups"):
        ModelConfig(n_heads=64, o_groups=5)
    with pytest.raises(ConfigError, match="compress_ratios"):
        get_preset("tiny-v4-flash").replace(compress_ratios=(0, 0, 4))


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ConfigError) as e:
        get_preset("v5-flash")
    assert "tiny-v4-flash" in str(e.value) and "v4-flash" in str(e.value)


def test_load_config_folder_errors(tmp_path):
    with pytest.raises(ConfigError, match="config.json"):
        load_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(V4_FLASH_CONFIG))
    (tmp_path / "inference").mkdir()
    (tmp_path / "inference" / "config.json").write_text(json.dumps(V4_FLASH_INFERENCE))
    assert load_config(tmp_path) == get_preset("v4-flash").replace(name=tmp_path.name)


def test_v4_flash_0731_config_parses_as_v4_flash_geometry():
    """V4-Flash-0731: the V4-Flash architecture with new weights and a 3-block DSpark draft (block size 5)."""
    d = copy.deepcopy(V4_FLASH_CONFIG)
    d.update(num_nextn_predict_layers=3, dspark_block_size=5)
    c = config_from_dict(d)
    flash = get_preset("v4-flash")
    assert c.family == "v4" and c.n_mtp_layers == 3
    assert c.compress_ratios[: c.n_layers] == flash.compress_ratios[: flash.n_layers]
    assert c.compress_ratios[c.n_layers:] == (0, 0, 0)
    assert (c.dim, c.n_layers, c.n_routed_experts, c.index_topk) == (flash.dim, flash.n_layers, 256, 512)
