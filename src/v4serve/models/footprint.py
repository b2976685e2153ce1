"""Weight bytes: as released (the checkpoint), as the engine holds them (computed from the layout), and as a loaded
model actually holds them (counted). The engine keeps every weight in its stored format, so the three agree within a
few MB: only float32-kind and 1-D tensors (norms, mHC, sinks, biases) are widened to the accumulation dtype.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import nn

from ..config import ModelConfig, ceil_div
from .layout import TensorSpec, tensor_specs

STORAGES = ("fp8", "bfloat16", "float32")  # how a checkpoint stores its weights (make-checkpoint --dtype)


def stored_bytes(spec: TensorSpec, c: ModelConfig, storage: str = "fp8") -> dict[str, int]:
    """Bytes of one tensor in a checkpoint of `storage`, split by format (fp8 = the release's quantized formats)."""
    n = spec.numel
    if spec.kind == "index":
        return {"int64": 8 * n}
    if spec.kind == "f32" or storage == "float32":
        return {"f32": 4 * n}
    if storage == "bfloat16" or spec.kind == "bf16":
        return {"bf16": 2 * n}
    if spec.kind == "expert" and c.expert_dtype == "fp4":
        return {"fp4": n // 2, "e8m0 scales": n // 32}
    if spec.kind == "engram":
        return {"fp8": n, "e8m0 scales": n // 32}
    out_f, in_f = spec.shape[0], spec.shape[-1]
    return {"fp8": n, "e8m0 scales": ceil_div(out_f, c.weight_block) * ceil_div(in_f, c.weight_block)}


def resident_bytes(spec: TensorSpec, c: ModelConfig, storage: str = "fp8",
                   dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes the engine holds for one tensor (models/loading.py `assign`): stored, but f32-kind and 1-D tensors in
    the accumulation dtype."""
    if spec.kind != "index" and (spec.kind == "f32" or len(spec.shape) == 1):
        return spec.numel * torch.promote_types(torch.float32, dtype).itemsize
    return sum(stored_bytes(spec, c, storage).values())


def checkpoint_bytes(c: ModelConfig, include_mtp: bool = True, storage: str = "fp8") -> dict[str, int]:
    acc: Counter[str] = Counter()
    for s in tensor_specs(c, include_mtp):
        acc.update(stored_bytes(s, c, storage))
    return dict(acc)


def engine_bytes(c: ModelConfig, include_mtp: bool = True, storage: str = "fp8",
                 dtype: torch.dtype = torch.bfloat16) -> int:
    return sum(resident_bytes(s, c, storage, dtype) for s in tensor_specs(c, include_mtp))


def held_bytes(model: nn.Module) -> dict[str, int]:
    """What a loaded model holds, counted tensor by tensor: {"device": ..., "host": ...} (host = tables kept in host
    memory while the model runs on a GPU, e.g. V4.1's Engram tables)."""
    out = {"device": 0, "host": 0}
    seen: set[int] = set()
    tensors = [t for _, t in model.named_parameters()] + [t for _, t in model.named_buffers()]
    for m in model.modules():  # tensors kept as plain attributes (Engram tables move between host and device)
        tensors += [v for v in vars(m).values() if isinstance(v, torch.Tensor)]
    dev = next((t.device for t in tensors if t.device.type != "cpu"), torch.device("cpu"))
    for t in tensors:
        if id(t) in seen or t.numel() == 0:
            continue
        seen.add(id(t))
        where = "host" if dev.type != "cpu" and t.device.type == "cpu" else "device"
        out[where] += t.numel() * t.element_size()
    return out


def fp4_routed_experts(model: nn.Module) -> tuple[int, int]:
    """(count, width) of one layer's routed experts as this rank holds them in FP4 (their prefill takes bf16 copies:
    engine/memory.py), or (0, 0) where they are held otherwise."""
    from .v4.moe import Experts

    for m in model.modules():
        if isinstance(m, Experts) and isinstance(m.w1, torch.Tensor) and m.w1.dtype == torch.uint8:
            return m.w1.shape[0], m.w1.shape[1]
    return 0, 0


def describe(model: nn.Module, c: ModelConfig, include_mtp: bool, storage: str = "fp8") -> str:
    held = held_bytes(model)
    ck = sum(checkpoint_bytes(c, include_mtp, storage).values())
    host = f" + {held['host'] / 1e9:.2f} GB in host memory" if held["host"] else ""
    return (f"weights: {held['device'] / 1e9:.2f} GB held on the device{host} "
            f"({(held['device'] + held['host']) / ck:.3f}x the checkpoint's {ck / 1e9:.2f} GB)")
