"""Shared helpers for the DeepSeek-V4 model tests.

Model builds, checkpoint writes and transformers loads are the expensive parts, so they are cached per process
(`functools.cache`): every test module that asks for the same (preset, numerics, seed) or the same checkpoint
gets the same object. Checkpoints go under the session's pytest base temp directory.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

from v4serve.cache.pool import KVPools
from v4serve.cache.spec import make_cache_spec
from v4serve.config import ModelConfig
from v4serve.models.checkpoint import write_checkpoint
from v4serve.models.factory import LoadedModel, build_model
from v4serve.models.step import RowSpec, build_step
from v4serve.presets import get_preset

PRESETS = ("tiny-v4-flash", "tiny-v4-pro")
BLOCK = 64  # a multiple of every compress ratio of the tiny presets (4 and 8)


def tokens(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(10_000 + seed)
    return torch.randint(0, 129280, (n,), generator=g).tolist()


def blocks_for(n_tokens: int) -> int:
    return -(-n_tokens // BLOCK)


@functools.cache
def preset_model(preset: str, numerics: str = "deepseek", seed: int = 0, with_mtp: bool = False,
                 dtype: torch.dtype = torch.float32) -> LoadedModel:
    return build_model(preset, seed=seed, numerics=numerics, with_mtp=with_mtp, dtype=dtype)


def model_dtype(lm: LoadedModel) -> torch.dtype:
    return lm.model.dtype


@functools.cache
def folder_model(folder: str, numerics: str = "deepseek", with_mtp: bool = False) -> LoadedModel:
    return build_model(folder, numerics=numerics, with_mtp=with_mtp)


@functools.cache
def checkpoint(root: str, preset: str, seed: int, dtype: str, **cfg_changes: object) -> Path:
    """write_checkpoint of a preset (optionally with config fields changed) under `root`, written once."""
    config: ModelConfig = get_preset(preset)
    if cfg_changes:
        config = config.replace(**cfg_changes)
    tag = "_".join(f"{k}{v}" for k, v in sorted(cfg_changes.items()))
    return write_checkpoint(config, Path(root) / f"{preset}-s{seed}-{dtype}{'-' + tag if tag else ''}", seed=seed,
                            dtype=dtype)


@functools.cache
def hf_model(folder: str):
    from transformers import DeepseekV4ForCausalLM

    return DeepseekV4ForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def ckpt_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.getbasetemp() / "v4_checkpoints")


def new_pools(config: ModelConfig, kv_dtype: str = "auto", index_dtype: str | None = None, num_blocks: int = 24,
              num_slots: int = 6, with_mtp: bool = False, dtype: torch.dtype = torch.float32) -> KVPools:
    spec = make_cache_spec(config, block_size=BLOCK, kv_dtype=kv_dtype, index_dtype=index_dtype, with_mtp=with_mtp,
                           compute_dtype=dtype)
    return KVPools(spec, num_blocks=num_blocks, num_slots=num_slots)


@torch.no_grad()
def one_shot(lm: LoadedModel, toks: list[int], kv_dtype: str = "auto") -> torch.Tensor:
    """Logits [len(toks), V] of a single prefill over `toks` in a fresh cache."""
    pools = new_pools(lm.config, kv_dtype, dtype=model_dtype(lm))
    step = build_step([RowSpec(toks, 0, 0, list(range(blocks_for(len(toks)))), logits="all")])
    return lm.model(step, pools).logits


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Per position: max |ours - ref| / max |ref|."""
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    return (ours.float() - ref.float()).abs().amax(-1) / ref.float().abs().amax(-1)


def max_rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return rel_err(ours, ref).max().item()
