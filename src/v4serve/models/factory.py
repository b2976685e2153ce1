"""One entry point from a model name (preset or checkpoint folder) to a ready model on a device."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..config import ConfigError, ModelConfig, load_config
from ..dist import parallel
from ..dist.parallel import TensorParallel
from ..ops import backend
from ..ops.linear import RowStack
from ..presets import get_preset, is_preset
from .loading import apply_numerics, load_checkpoint, load_random
from .numerics import numerics_for
from .sharding import Layout, check_layout, rank_config
from .weights import ParallelRank


@dataclass
class LoadedModel:
    model: nn.Module
    config: ModelConfig
    source: str  # the preset name or checkpoint folder
    folder: Path | None  # checkpoint folder (None for presets)


def resolve_config(model: str) -> tuple[ModelConfig, Path | None]:
    if is_preset(model):
        return get_preset(model), None
    folder = Path(model)
    if not folder.exists():
        raise ConfigError(f"model {model!r} is neither a preset nor an existing checkpoint folder")
    return load_config(folder), folder


def model_class(config: ModelConfig) -> type[nn.Module]:
    if config.is_v41:
        from .v41.model import V41Model

        return V41Model
    from .v4.model import V4Model

    return V4Model


def default_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def build_model(model: str, *, seed: int = 0, numerics: str = "deepseek", dtype: torch.dtype | None = None,
                device: str | torch.device = "cpu", with_mtp: bool = True, storage: str = "fp8",
                kernels: str = "auto", tp: TensorParallel | None = None) -> LoadedModel:
    """A preset (deterministic random weights from `seed`, stored as `storage`) or a checkpoint folder.

    `kernels` picks the op families' bodies once for the whole model (ops/backend.py): auto = the Triton kernels on
    CUDA, the plain-torch reference elsewhere. `tp` builds this process's tensor-parallel rank (its heads, expert
    slices and vocabulary share; dist/parallel.py), loading only its part of every tensor."""
    device = torch.device(device)
    dtype = dtype or default_dtype(device)
    config, folder = resolve_config(model)
    tp = tp or parallel.SINGLE
    if tp.size > 1 and config.is_v41 and with_mtp and config.n_mtp_layers:
        # the draft reads the whole embedding / head and Markov head; not split yet
        raise NotImplementedError("V4.1's DSpark draft blocks do not run under tensor parallelism yet: build V4.1 "
                                  "with with_mtp=False (the engine's default) for --tensor-parallel-size > 1")
    if tp.data_parallel:
        check_layout(config, Layout(tp.size, tp.dp_size, tp.expert_parallel))
    nm = numerics_for(config, numerics)
    with torch.device(device), backend.use(backend.resolve(kernels, device)), parallel.use(tp):
        net = model_class(config)(rank_config(config, tp.size, tp.expert_parallel), nm, with_mtp=with_mtp,
                                  dtype=dtype)
    # EP: every rank (of the TP group, or of the data-parallel ranks under DEP) owns a contiguous share of the experts
    rank = ParallelRank(tp_rank=tp.rank, tp_size=tp.size, ep_rank=tp.ep_rank, ep_size=tp.ep_size)
    if folder is None:
        load_random(net, config, seed, storage, dtype, device, with_mtp, rank)
    else:
        load_checkpoint(net, folder, config, dtype, device, with_mtp, rank)
        if hasattr(net, "bind_tokenizer"):  # V4.1 Engram hashes with the checkpoint's own tokenizer
            net.bind_tokenizer(folder)
    apply_numerics(net, nm, config)
    for m in net.modules():  # projections of one input as one weight, now that the weights are loaded
        for v in vars(m).values():
            if isinstance(v, RowStack):
                v.stack()
    net.eval()
    return LoadedModel(net, config, model, folder)
