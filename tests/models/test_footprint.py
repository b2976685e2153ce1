"""Weights stay in their release formats: what a loaded model holds adds up to the checkpoint's weight bytes.

FP8 e4m3 + e8m0 block scales (bytes), FP4 e2m1 packed two per byte + per-32 e8m0 scales, FP8 Engram rows, bf16
matrices as bf16; only float32-kind and 1-D tensors are widened (a few KB here, a few MB at full size).
"""

from __future__ import annotations

import pytest
import torch

from v4serve import LLM
from v4serve.info import format_info, model_info
from v4serve.models.footprint import checkpoint_bytes, engine_bytes, held_bytes
from v4serve.presets import get_preset


@pytest.mark.parametrize("name", ["tiny-v4-flash", "tiny-v41-flash"])
def test_held_weight_bytes_equal_the_checkpoint(name: str) -> None:
    llm = LLM(name, kv_cache_memory=32 << 20, max_model_len=512, block_size=64)
    model, config = llm.engine.loaded.model, llm.engine.loaded.config
    held = held_bytes(model)
    ck = sum(checkpoint_bytes(config, include_mtp=False).values())
    assert held["host"] == 0
    assert abs(held["device"] - ck) / ck < 0.03, (held, ck)
    assert held["device"] == engine_bytes(config, include_mtp=False, dtype=torch.float32)
    # no weight matrix was dequantized: every quantized linear and expert stack is FP8 or packed FP4 bytes
    for m in model.modules():
        w = getattr(m, "weight", None)
        if type(m).__name__ == "Linear" and getattr(m, "quantized", False):
            assert w.dtype in (torch.float8_e4m3fn, torch.uint8) and m.scale.dtype == torch.uint8
        if type(m).__name__ == "Experts":
            assert m.w1.dtype == torch.uint8 and m.s1.dtype == torch.uint8  # FP4 codes and e8m0 bytes
    assert model.embed.weight.dtype == torch.bfloat16 and model.head.weight.dtype == torch.bfloat16


def test_info_prints_checkpoint_and_engine_bytes() -> None:
    info = model_info(get_preset("v4-flash"))
    text = format_info(info)
    assert "weight bytes (released formats)" in text and "weight bytes held by the engine" in text
    assert abs(info["engine_weight_bytes"] - info["weight_bytes"]["total"]) / info["weight_bytes"]["total"] < 0.03
