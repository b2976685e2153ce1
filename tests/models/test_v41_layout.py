"""DeepSeek-V4.1 checkpoint layout, config parsing and accounting (no model is built)."""

from __future__ import annotations

import re
from collections import Counter

from v4serve.cache.spec import make_cache_spec
from v4serve.config import config_from_dict, hf_config_dict, inference_config_dict
from v4serve.models.layout import tensor_specs
from v4serve.models.v41.accounting import active_params, engram_row_counts
from v4serve.presets import get_preset

REAL = get_preset("v41-flash")


def _pattern_counts(specs) -> Counter:
    return Counter(re.sub(r"\.\d+\.", ".N.", s.name) for s in specs)


def test_tensor_inventory_of_the_release():
    specs = tensor_specs(REAL)
    names = {s.name for s in specs}
    stored = len(specs) + sum(s.kind in ("dense", "expert", "engram") for s in specs)
    assert stored == 96085 - 266  # the released safetensors minus its 266 vision tensors
    n = _pattern_counts(specs)
    assert n["layers.N.attn.compressor.wkv.weight"] == 4
    assert n["layers.N.attn.compressor.wgate.weight"] == 3  # ratio-1 source (layer 20) has no gate
    assert n["layers.N.attn.indexer.wq_b.weight"] == 8
    assert n["layers.N.attn.indexer.wk.weight"] == 4
    assert n["layers.N.attn.indexer.k_norm.weight"] == 4
    assert n["layers.N.ffn.gate.bias"] == n["layers.N.ffn.gate.bias_vl"] == 40
    assert "layers.20.attn.compressor.wkv.weight" in names and "layers.20.attn.compressor.wgate.weight" not in names
    assert "layers.3.attn.compressor.wkv.weight" not in names and "layers.24.attn.indexer.wk.weight" not in names
    assert not any("hc_head" in s or "tid2eid" in s or ".ape" in s for s in names)
    shapes = {s.name: s.shape for s in specs}
    assert shapes["layers.1.engram.embed.weight"] == (384006168, 256)
    assert shapes["layers.14.engram.wkv.weight"] == (5 * 5120, 24 * 256)
    assert shapes["layers.2.attn.indexer.wk.weight"] == (128, 512)
    assert shapes["mtp.0.main_proj.weight"] == (5120, 3 * 5120)
    assert shapes["mtp.2.markov_head.head.weight"] == (129280, 256)
    assert shapes["mtp.2.confidence_head.proj.weight"] == (1, 5120 + 256)
    assert shapes["mtp.1.ffn.gate.weight"] == (128, 5120)
    assert "mtp.0.markov_head.embed.weight" not in names and "mtp.2.main_proj.weight" not in names


def test_release_style_config_parses():
    """The released config.json: text model nested, quantization_config at the top, `dtype` the torch dtype."""
    hf = hf_config_dict(REAL, quantized=True)
    hf["dtype"] = "bfloat16"
    hf["text_config"]["model_type"] = "deepseek_v41_text"
    c = config_from_dict(hf, None, name="v41-flash")
    assert c.is_v41 and c.weight_dtype == "fp8" and c.weight_block == 32 and c.expert_dtype == "fp4"
    assert c.to_dict() == REAL.to_dict()
    c2 = config_from_dict(hf_config_dict(REAL, True), inference_config_dict(REAL, True), name="v41-flash")
    assert c2.to_dict() == REAL.to_dict()
    assert (c.decoder_start, c.kv_source(39), c.index_source(23)) == (21, 20, 20)


def test_info_numbers():
    assert make_cache_spec(REAL, kv_dtype="fp4").bytes_per_token() == 890.0
    assert engram_row_counts(REAL) == [384006168, 384016682]
    a = active_params(REAL)
    # spec estimate 8.5B / 16.3B without Engram's wkv (2 x 157M) and the small per-layer extras
    assert 8.4e9 < a["prefill_per_token"] < 9.1e9
    assert 16.2e9 < a["decode_per_token"] < 17.0e9
    # the reduced preset does the same per-token work except for its smaller routers (16 instead of 384 rows)
    reduced = active_params(get_preset("v41-flash-e16-engram1m"))
    router = (384 - 16) * (5120 + 2)  # gate weight, bias, bias_vl
    assert a["decode_per_token"] - reduced["decode_per_token"] == 40 * router
    assert a["prefill_per_token"] - reduced["prefill_per_token"] == 21 * router
