"""`v4serve info`: every figure computed from the config (checked against the published numbers and the formula)."""

from __future__ import annotations

import json

import pytest

from v4serve.cli import main
from v4serve.config import ModelConfig
from v4serve.info import capacity_info, model_info
from v4serve.presets import get_preset


def kv_per_token(c: ModelConfig, entry: float, index: float) -> float:
    """The formula, independently: each compressed layer grows by entry/ratio (+ index/ratio with an indexer)."""
    total = 0.0
    for i in range(c.n_layers):
        r = c.compress_ratios[i]
        if r and c.owns_compressor(i):
            total += entry / r + (index / r if c.owns_index_keys(i) else 0.0)
    return total


def test_v4_flash_published_figures() -> None:
    info = model_info(get_preset("v4-flash"))
    kv = info["kv_cache"]
    assert kv["kv=fp8, index=fp4"]["total_per_token"] == 3514.25
    assert kv["kv=fp8, index=fp8"]["total_per_token"] == 3850.25
    assert kv["kv=bf16, index=bf16"]["total_per_token"] == 6880.0
    assert info["weight_bytes"]["total"] == 159_609_485_896  # the released safetensors index's total_size
    p = info["parameters"]
    assert round(p["total"] / 1e9) == 284 and 13.0e9 < p["active_per_token"] < 13.5e9


def test_v41_flash_figures() -> None:
    info = model_info(get_preset("v41-flash"))
    assert info["kv_cache"]["kv=fp4, index=fp4"]["total_per_token"] == 890.0
    assert info["engram_rows"] == {"1": 384_006_168, "14": 384_016_682}
    p = info["parameters"]
    assert p["active_per_prompt_token"] < p["active_per_generated_token"]
    assert info["kv_cache"]["kv=fp4, index=fp4"]["window_per_sequence"] == 40 * 128 * 528


@pytest.mark.parametrize("layers,ratios", [(7, (0, 4, 64, 4, 64, 4, 0, 0)), (5, (128, 128, 4, 4, 4, 0))])
def test_info_for_a_config_not_in_the_presets_matches_the_formula(layers: int, ratios: tuple[int, ...]) -> None:
    c = get_preset("v4-flash").replace(name="custom", n_layers=layers, compress_ratios=ratios, n_hash_layers=1)
    kv = model_info(c)["kv_cache"]
    assert kv["kv=fp8, index=fp4"]["total_per_token"] == pytest.approx(kv_per_token(c, 584, 68))
    assert kv["kv=fp8, index=fp8"]["total_per_token"] == pytest.approx(kv_per_token(c, 584, 132))
    assert kv["kv=bf16, index=bf16"]["total_per_token"] == pytest.approx(kv_per_token(c, 1024, 256))
    assert kv["kv=fp8, index=fp4"]["window_per_sequence"] == layers * 128 * 584


def test_capacity_counts_tokens_and_sessions() -> None:
    cap = capacity_info(get_preset("v4-flash"), 40 << 30, "fp8", 256, 64)
    assert cap["tokens"] == cap["blocks"] * 256
    assert cap["sessions_of_142000_tokens"] == min(cap["blocks"] // -(-142_000 // 256), cap["slots"])


def test_info_cli_needs_only_a_config(tmp_path, capsys) -> None:
    from v4serve.config import hf_config_dict

    (tmp_path / "config.json").write_text(json.dumps(hf_config_dict(get_preset("v4-pro"), quantized=True)))
    assert main(["info", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kv_cache"]["kv=fp8, index=fp4"]["total_per_token"] == pytest.approx(5031.4375)
    assert main(["info", "no-such-model"]) == 2
    assert "neither a preset nor an existing checkpoint folder" in capsys.readouterr().err


# --- sizing a deployment: per-GPU weight bytes under TP / DP / EP --------------------------------------------------
def _split(name: str) -> str:
    """Independently of models/sharding.py: what TP splits (rows or columns) and what EP moves whole."""
    if ".ffn.experts." in name:
        return "routed"
    if name in ("embed.weight", "head.weight"):  # the vocabulary (DSpark's small markov heads stay whole)
        return "split"
    split = ("attn.wq_b.weight", "attn.wo_a.weight", "attn.attn_sink", "attn.wo_b.weight", ".engram.embed.weight",
             "shared_experts.w1.weight", "shared_experts.w2.weight", "shared_experts.w3.weight")
    return "split" if any(name.endswith(s) for s in split) else "replicated"


def _bytes_by_split(c: ModelConfig) -> dict[str, int]:
    from v4serve.models.footprint import stored_bytes
    from v4serve.models.layout import tensor_specs

    out = {"routed": 0, "split": 0, "replicated": 0}
    for s in tensor_specs(c, include_mtp=True):
        out[_split(s.name)] += sum(stored_bytes(s, c).values())
    return out


@pytest.mark.parametrize("preset", ["v4-flash", "v4-pro", "v41-flash"])
def test_weight_bytes_per_gpu_follow_the_layout(preset: str) -> None:
    from v4serve.info import parallel_info
    from v4serve.models.sharding import Layout

    c = get_preset(preset)
    b = _bytes_by_split(c)
    total = sum(b.values())
    one = parallel_info(c, Layout(1), gpu_memory=1 << 50)
    assert one["weight_bytes_per_gpu"] == total
    tp4 = parallel_info(c, Layout(4), gpu_memory=1 << 50)["weight_bytes_per_gpu"]
    assert tp4 == pytest.approx(b["replicated"] + (b["split"] + b["routed"]) / 4, rel=1e-6)  # an uneven split (V4.1's Engram rows) gives the fullest rank a row more
    dep = parallel_info(c, Layout(2, 4, True), gpu_memory=1 << 50)["weight_bytes_per_gpu"]  # EP over 8 GPUs
    assert dep == pytest.approx(b["replicated"] + b["split"] / 2 + b["routed"] / 8, rel=1e-6)  # an uneven split (V4.1's Engram rows) gives the fullest rank a row more


def test_kv_left_per_gpu_and_sessions_count_dp_ranks() -> None:
    from v4serve.info import H200_BYTES, parallel_info
    from v4serve.models.sharding import Layout

    c = get_preset("v4-flash")
    assert not parallel_info(c, Layout(1))["fits"]  # 160 GB of weights on one H200
    a = parallel_info(c, Layout(8, 1, True))
    b = parallel_info(c, Layout(4, 2, True))
    assert a["fits"] and b["fits"]
    assert a["kv_cache_bytes_per_gpu"] == int(0.9 * H200_BYTES - a["weight_bytes_per_gpu"] - a["activation_reserve_bytes"])
    key = next(k for k in b["capacity_per_dp_rank"] if k.startswith("sessions_of_"))
    assert b["sessions_total"] == 2 * b["capacity_per_dp_rank"][key]


def test_info_cli_sizes_a_deployment_and_refuses_uneven_splits(capsys) -> None:
    assert main(["info", "v4-flash", "-tp", "8", "--enable-expert-parallel"]) == 0
    out = capsys.readouterr().out
    assert "TP=8 EP=8 on 8 GPU(s)" in out and "GB per GPU" in out and "sessions" in out
    assert main(["info", "v4-flash", "--tensor-parallel-size", "3"]) == 2
    assert "64 attention heads" in capsys.readouterr().err
    assert main(["info", "v41-flash", "-tp", "4", "--engram-on-host", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["parallel"]["host_weight_bytes"] > 100e9
