"""DeepSeek-V4.1 checkpoints: write the official layout (FP8 32x32, FP4 experts, FP8 Engram tables), load it back,
and refuse checkpoints that do not match their config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from v4serve.cache.pool import KVPools
from v4serve.cache.spec import make_cache_spec
from v4serve.config import load_config
from v4serve.models.checkpoint import write_checkpoint
from v4serve.models.factory import build_model
from v4serve.models.step import RowSpec, build_step
from v4serve.models.weights import CheckpointError
from v4serve.presets import get_preset

SEED = 3


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return write_checkpoint(get_preset("tiny-v41-flash"), tmp_path_factory.mktemp("ck") / "tiny-v41", seed=SEED,
                            dtype="fp8")


def _logits(lm, toks: list[int]) -> torch.Tensor:
    pools = KVPools(make_cache_spec(lm.config, block_size=32), num_blocks=4, num_slots=1)
    with torch.no_grad():
        return lm.model(build_step([RowSpec(toks, 0, 0, [0, 1], logits="all")]), pools).logits


def test_round_trip_equals_the_preset(folder: Path):
    hf = json.loads((folder / "config.json").read_text())
    assert hf["model_type"] == "deepseek_v41" and "text_config" in hf
    assert hf["quantization_config"]["weight_block_size"] == [32, 32]
    assert load_config(folder).to_dict() == {**get_preset("tiny-v41-flash").to_dict(), "name": "tiny-v41"}
    shard = load_file(str(next(folder.glob("*.safetensors"))))
    assert shard["layers.1.engram.embed.weight"].dtype == torch.float8_e4m3fn
    assert shard["layers.1.engram.embed.scale"].shape == (6090, 1)
    assert shard["layers.0.attn.wq_a.scale"].shape == (1, 2)  # [32, 64] in 32 x 32 blocks
    assert shard["layers.0.ffn.experts.0.w1.weight"].dtype == torch.int8  # FP4 packed two per byte
    toks = torch.randint(0, 129280, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    loaded = build_model(str(folder), with_mtp=True)
    preset = build_model("tiny-v41-flash", seed=SEED, with_mtp=True)
    assert torch.equal(_logits(loaded, toks), _logits(preset, toks))
    table = loaded.model.layers[1].engram.embed
    assert table.weight.dtype == torch.float8_e4m3fn  # kept in its stored format


def _edit(folder: Path, tmp: Path, drop: str | None = None, put: dict[str, torch.Tensor] | None = None) -> Path:
    """A copy of the checkpoint with one tensor dropped or replaced/added (shards and index kept consistent)."""
    out = tmp / "edited"
    out.mkdir()
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    for f in folder.iterdir():
        if f.suffix == ".safetensors":
            tensors = load_file(str(f))
            if drop is not None:
                tensors.pop(drop, None)
            if put and f.name == index["weight_map"]["embed.weight"]:
                tensors.update(put)
            save_file(tensors, str(out / f.name))
        elif f.is_file():
            (out / f.name).write_bytes(f.read_bytes())
    (out / "inference").mkdir()
    (out / "inference" / "config.json").write_text((folder / "inference" / "config.json").read_text())
    wm = index["weight_map"]
    if drop is not None:
        wm.pop(drop)
    for name in put or {}:
        wm[name] = wm["embed.weight"]
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    return out


def test_missing_tensor_is_named(folder: Path, tmp_path: Path):
    bad = _edit(folder, tmp_path, drop="layers.6.attn.indexer.wk.weight")
    with pytest.raises(CheckpointError, match=r"missing tensor\(s\) layers\.6\.attn\.indexer\.wk\.weight"):
        build_model(str(bad))


def test_misshaped_tensor_is_named(folder: Path, tmp_path: Path):
    bad = _edit(folder, tmp_path, put={"mtp.2.markov_head.embed.weight": torch.zeros(129280, 8)})
    with pytest.raises(CheckpointError, match=r"mtp\.2\.markov_head\.embed\.weight has shape \[129280, 8\]"):
        build_model(str(bad))


def test_vision_tower_tensors_are_ignored(folder: Path, tmp_path: Path):
    ok = _edit(folder, tmp_path, put={"vision.norm.weight": torch.ones(8), "image_start": torch.ones(64)})
    build_model(str(ok), with_mtp=False)
