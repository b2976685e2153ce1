"""Building a model and putting weights into it (from a checkpoint folder or deterministic random values)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ..config import ModelConfig
from ..ops.linear import Linear, stored_format
from .checkpoint import iter_random_checkpoint
from .layout import TensorSpec, tensor_specs
from .footprint import checkpoint_bytes
from .numerics import Numerics
from .progress import load_bar, tensor_bytes
from .sharding import Rules, rules_of
from .weights import CheckpointError, CheckpointReader, ParallelRank, check_and_iter, shard_stored


def _resolve(model: nn.Module, name: str) -> tuple[nn.Module, str, list[str]]:
    """Deepest module on the path of `name`, the rest of the path, and the module path walked."""
    parts = name.split(".")
    mod: nn.Module = model
    walked: list[str] = []
    for i, p in enumerate(parts):
        child = getattr(mod, p, None) if not p.isdigit() else (mod[int(p)] if isinstance(mod, nn.ModuleList) else None)
        if isinstance(child, nn.Module) and not isinstance(child, nn.Parameter):
            mod = child
            walked.append(p)
            continue
        return mod, ".".join(parts[i:]), walked
    return mod, "", walked


def assign(model: nn.Module, spec: TensorSpec, tensor: torch.Tensor, scale: torch.Tensor | None,
           config: ModelConfig, dtype: torch.dtype) -> None:
    """Put one checkpoint tensor where its name says, in its stored format (FP8 / FP4 with their e8m0 scales, bf16
    matrices as bf16): no full-precision copy of a weight is ever made. Only float32-kind and 1-D tensors (norms,
    mHC, sinks, biases: a few MB) are widened to the accumulation dtype (float32, or float64 for a float64 model)."""
    from .v4.moe import Experts

    name = spec.name
    mod, rest, walked = _resolve(model, name)
    if isinstance(mod, Experts):  # ffn.experts.{e}.{w1,w2,w3}.weight
        e, which = rest.split(".")[:2]
        mod.set_expert(int(e), which, tensor, scale, config.weight_block)
        return
    if getattr(mod, "keeps_stored_format", False) and rest == "weight":  # V4.1 Engram tables: FP8 rows + scales
        mod.set_stored(tensor, scale, dtype)
        return
    if isinstance(mod, Linear) and rest == "weight":
        mod.set_weight(tensor, scale, config.weight_block)
        return
    if "." in rest or not hasattr(mod, rest):
        raise CheckpointError(f"tensor {name} has no place in the {config.family} model (resolved to "
                              f"{'.'.join(walked) or 'the root'} / {rest})")
    cur = getattr(mod, rest)
    if tensor.dtype in (torch.int32, torch.int64):
        value = tensor.to(torch.int64)
    elif stored_format(tensor) != "float":
        raise CheckpointError(f"tensor {name} is stored {tensor.dtype}, but only linear weights, experts and Engram "
                              f"tables may be quantized")
    elif spec.kind == "f32" or len(spec.shape) == 1:
        value = tensor.to(torch.promote_types(torch.float32, dtype))
    else:
        value = tensor  # a bf16 matrix (embedding, head, gate) stays bf16; its users widen rows or tiles per call
    if cur is not None and tuple(cur.shape) != tuple(value.shape):
        raise CheckpointError(f"tensor {name} has shape {list(value.shape)}; the model needs {list(cur.shape)}")
    setattr(mod, rest, nn.Parameter(value, requires_grad=False))


def apply_numerics(model: nn.Module, numerics: Numerics, config: ModelConfig) -> None:
    """FP8 activation simulation on every quantized GEMM the reference runs in FP8 (not wo_a: BF16 einsum)."""
    for name, m in model.named_modules():
        if isinstance(m, Linear):
            quantized = m.quantized and numerics.act_quant and not name.endswith("wo_a")
            m.act_group = config.weight_block if quantized else 0


CPU_GENERATION_LIMIT = 2_000_000_000  # parameters


def _assign_shard(model: nn.Module, spec: TensorSpec, t: torch.Tensor, scale: torch.Tensor | None,
                  config: ModelConfig, dtype: torch.dtype, device: torch.device, rank: ParallelRank,
                  rules: Rules) -> None:
    """This rank's part of one tensor (weights.shard_stored), placed in the model."""
    part = shard_stored(spec.name, t, scale, rank, config.n_routed_experts, rules.kind(spec.name))
    if part is None:  # another expert-parallel rank's expert
        return
    t, scale = part
    dev = _placement(model, spec, device)
    assign(model, spec, t.to(dev), scale.to(dev) if scale is not None else None, config, dtype)


def load_random(model: nn.Module, config: ModelConfig, seed: int, storage: str, dtype: torch.dtype,
                device: torch.device, include_mtp: bool, rank: ParallelRank | None = None) -> None:
    """Deterministic random weights. Models up to 2B parameters are drawn on the CPU, so a preset is the same model
    on every device (and equals `make-checkpoint` output); larger ones are drawn on the target GPU (fast, but a
    different random model than the CPU would draw)."""
    n_params = sum(s.numel for s in tensor_specs(config, include_mtp))
    gen_device = device if device.type == "cuda" and n_params > CPU_GENERATION_LIMIT else torch.device("cpu")
    total = sum(checkpoint_bytes(config, include_mtp, storage).values())
    rules = rules_of(model)
    with load_bar(total, "Random weights") as bar:
        for spec, tensors in iter_random_checkpoint(config, seed, storage, gen_device, include_mtp):
            t = tensors[spec.name]
            scale = next((v for k, v in tensors.items() if k != spec.name), None)
            _assign_shard(model, spec, t, scale, config, dtype, device, rank or ParallelRank(), rules)
            bar.update(tensor_bytes(t, scale))


def _placement(model: nn.Module, spec: TensorSpec, device: torch.device) -> torch.device:
    """V4.1 Engram tables stay in host memory when the model asks for it (they never transit the GPU)."""
    return torch.device("cpu") if spec.kind == "engram" and getattr(model, "engram_on_host", False) else device


def load_checkpoint(model: nn.Module, folder: str | Path, config: ModelConfig, dtype: torch.dtype,
                    device: torch.device, include_mtp: bool, rank: ParallelRank | None = None) -> None:
    rank = rank or ParallelRank()
    reader = CheckpointReader(folder)
    total = sum(checkpoint_bytes(config, include_mtp).values())
    rules = rules_of(model)
    with load_bar(total, "Loading safetensors checkpoint") as bar:
        for spec, t, scale in check_and_iter(reader, config, include_mtp):
            _assign_shard(model, spec, t, scale, config, dtype, device, rank, rules)
            bar.update(tensor_bytes(t, scale))
