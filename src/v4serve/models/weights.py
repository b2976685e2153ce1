"""Loading checkpoints: the official safetensors layout and transformers' `save_pretrained` output.

Accepted: sharded safetensors with `model.safetensors.index.json` (or a single file), names with or without a
`model.` prefix, FP8 e4m3 weights with e8m0 block scales, FP4 e2m1 experts (int8 or float4 packed two per
byte) with per-32 e8m0 scales, BF16/F32 elsewhere. A missing, extra or mis-shaped tensor is an error that
names it. Loading takes a tensor-parallel and an expert-parallel rank; `shard_for_rank` holds the split rules
(spec §3.9).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from ..config import ModelConfig, ceil_div
from ..ops.linear import logical_shape, stored_format
from . import sharding
from .layout import TensorSpec, tensor_specs


class CheckpointError(ValueError):
    """A checkpoint that does not match its config; the message names the tensor and what is wrong."""


# transformers' save_pretrained writes a few names that differ from the release (its rename rules are anchored
# on names without the `model.` prefix); map them back.
_HF_SAVED = [
    (re.compile(r"^embed_tokens\.weight$"), "embed.weight"),
    (re.compile(r"^lm_head\.weight$"), "head.weight"),
    (re.compile(r"^hc_head\.hc_(fn|base|scale)$"), r"hc_head_\1"),
    (re.compile(r"^(layers\.\d+\.attn)\.norm\.weight$"), r"\1.kv_norm.weight"),
    (re.compile(r"^(mtp\.\d+\.attn)\.norm\.weight$"), r"\1.kv_norm.weight"),
]


def official_name(name: str) -> str:
    if name.startswith("model."):
        name = name[len("model."):]
    for pat, rep in _HF_SAVED:
        if pat.match(name):
            return pat.sub(rep, name)
    return name


@dataclass
class ParallelRank:
    tp_rank: int = 0
    tp_size: int = 1
    ep_rank: int = 0
    ep_size: int = 1

    def __post_init__(self) -> None:
        for r, s, what in ((self.tp_rank, self.tp_size, "tensor"), (self.ep_rank, self.ep_size, "expert")):
            if s < 1 or not 0 <= r < s:
                raise ValueError(f"{what}-parallel rank {r} is outside world size {s}")


# --- splitting a tensor for one rank (the rules: each layer's, models/sharding.py `rules_of`) ---------------------
_EXPERT_ID = re.compile(r"ffn\.experts\.(\d+)\.")


def expert_owner(expert: int, n_experts: int, ep: ParallelRank) -> bool:
    if n_experts % ep.ep_size:
        raise CheckpointError(f"{n_experts} routed experts do not split over {ep.ep_size} expert-parallel ranks")
    per = n_experts // ep.ep_size
    return ep.ep_rank * per <= expert < (ep.ep_rank + 1) * per


def shard_for_rank(name: str, t: torch.Tensor, rank: ParallelRank, n_experts: int, kind: str
                   ) -> torch.Tensor | None:
    """This rank's part of a plain (dequantized) tensor whose split is `kind` (the rule its layer declares:
    models/sharding.py `rules_of`); None when another expert-parallel rank owns it."""
    part = shard_stored(name, t, None, rank, n_experts, kind)
    return None if part is None else part[0]


def _slice_stored(name: str, t: torch.Tensor, scale: torch.Tensor | None, dim: int, lo: int, hi: int
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logical [lo, hi) of dim of a stored tensor (FP8 + block scales, packed FP4 + per-32 scales, floats) with the
    scale rows or columns that cover it. The cut must fall on a scale block (or, for rows, inside one block)."""
    logical = logical_shape(t)
    packed = stored_format(t) == "fp4"
    if dim == 1 and packed and (lo % 2 or hi % 2):
        raise CheckpointError(f"{name}: FP4 columns {lo}:{hi} split a packed byte")
    idx = [slice(None)] * t.dim()
    idx[dim] = slice(lo // 2, hi // 2) if dim == 1 and packed else slice(lo, hi)
    part = t[tuple(idx)].contiguous()
    if scale is None:
        return part, None
    per = -(-logical[dim] // scale.shape[dim])  # values per scale along dim (block, or 1 / 32 for per-row groups)
    if lo % per and lo // per != (hi - 1) // per:
        raise CheckpointError(f"{name}: the tensor-parallel cut {lo}:{hi} of dim {dim} crosses {per}-wide scale "
                              f"blocks; this model cannot be split this many ways")
    if lo % per and dim == 1:
        raise CheckpointError(f"{name}: the tensor-parallel cut at column {lo} is not on a {per}-wide scale block")
    sidx = [slice(None)] * scale.dim()
    sidx[dim] = slice(lo // per, -(-hi // per))
    return part, scale[tuple(sidx)].contiguous()


def shard_stored(name: str, t: torch.Tensor, scale: torch.Tensor | None, rank: ParallelRank, n_experts: int,
                 kind: str) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """`shard_for_rank` for a tensor in its stored format with its scales; None when another EP rank owns it."""
    if kind == sharding.EXPERT:
        if rank.ep_size > 1:
            m = _EXPERT_ID.search(name)
            return (t, scale) if expert_owner(int(m.group(1)), n_experts, rank) else None
        kind = sharding.SHARED_OUT if ".w2." in name else sharding.SHARED_IN
    if rank.tp_size == 1 or kind == sharding.REPLICATED:
        return t, scale
    dim = 1 if kind in (sharding.ROW, sharding.SHARED_OUT) else 0
    n = logical_shape(t)[dim]
    if kind == sharding.VOCAB:  # V4.1's Engram tables split unevenly (embed / head are checked even: rank_config)
        return _slice_stored(name, t, scale, 0, *sharding.row_share(n, rank.tp_size, rank.tp_rank))
    if n % rank.tp_size:
        raise CheckpointError(f"{name}: dim {dim} ({n}) does not split over {rank.tp_size} ranks")
    per = n // rank.tp_size
    return _slice_stored(name, t, scale, dim, rank.tp_rank * per, (rank.tp_rank + 1) * per)


# --- reading ----------------------------------------------------------------------------------------------
class CheckpointReader:
    """Lazy access to the tensors of a checkpoint folder by official name."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        index = self.folder / "model.safetensors.index.json"
        files: dict[str, Path] = {}
        if index.is_file():
            try:
                wm = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError) as e:
                raise CheckpointError(f"{index} is not a safetensors index ({e})") from None
            for name, f in wm.items():
                files[official_name(name)] = self.folder / f
            self._raw = {official_name(n): n for n in wm}
        else:
            shards = sorted(self.folder.glob("*.safetensors"))
            if not shards:
                raise CheckpointError(f"{self.folder} holds no *.safetensors files")
            self._raw = {}
            for f in shards:
                with safe_open(str(f), "pt") as h:
                    for n in h.keys():
                        files[official_name(n)] = f
                        self._raw[official_name(n)] = n
        for f in set(files.values()):
            if not f.is_file():
                raise CheckpointError(f"the index names shard {f.name}, which is missing from {self.folder}")
        self.files = files
        self._handles: dict[Path, object] = {}

    def names(self) -> set[str]:
        return set(self.files)

    def _handle(self, f: Path):
        if f not in self._handles:
            self._handles[f] = safe_open(str(f), "pt")
        return self._handles[f]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handle(self.files[name]).get_slice(self._raw[name]).get_shape())

    def get(self, name: str) -> torch.Tensor:
        return self._handle(self.files[name]).get_tensor(self._raw[name])


def expected_stored_shape(spec: TensorSpec, stored_dtype: torch.dtype) -> tuple[int, ...]:
    if stored_dtype in (torch.int8, torch.uint8) and spec.kind == "expert":
        return (*spec.shape[:-1], spec.shape[-1] // 2)
    return spec.shape


def expected_scale_shape(spec: TensorSpec, stored_dtype: torch.dtype, block: int) -> tuple[int, ...]:
    out_f, in_f = spec.shape[0], spec.shape[-1]
    if spec.kind == "engram":
        return (spec.shape[0], spec.shape[1] // 32)
    if stored_dtype in (torch.int8, torch.uint8, torch.float4_e2m1fn_x2):
        return (out_f, in_f // 32)
    return (ceil_div(out_f, block), ceil_div(in_f, block))


def scale_name(name: str) -> str:
    return name[: -len(".weight")] + ".scale" if name.endswith(".weight") else name + ".scale"


# V4.1's vision tower ships in the same checkpoint; the text model does not read it.
_V41_VISION = ("vision.", "aligner.", "image_start", "image_end", "image_newline")


def check_and_iter(reader: CheckpointReader, config: ModelConfig, include_mtp: bool
                   ) -> Iterator[tuple[TensorSpec, torch.Tensor, torch.Tensor | None]]:
    """Validate names and shapes against the config, then yield (spec, tensor, scale or None)."""
    specs = tensor_specs(config, include_mtp)
    present = reader.names()
    wanted = {s.name for s in specs}
    missing = [s.name for s in specs if s.name not in present]
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise CheckpointError(f"checkpoint {reader.folder} is missing tensor(s) {', '.join(missing[:5])}{more} "
                              f"required by its config ({config.family}, {config.n_layers} layers)")
    allowed = wanted | {scale_name(n) for n in wanted}
    extra = sorted(n for n in present if n not in allowed and not (not include_mtp and n.startswith("mtp."))
                   and not (config.is_v41 and n.startswith(_V41_VISION)))
    if extra:
        more = f" (and {len(extra) - 5} more)" if len(extra) > 5 else ""
        raise CheckpointError(f"checkpoint {reader.folder} has unexpected tensor(s) {', '.join(extra[:5])}{more} "
                              "that its config does not describe")
    for spec in specs:
        t = reader.get(spec.name)
        if t.dtype == torch.float4_e2m1fn_x2:  # logical [out, in] of 4-bit pairs -> bytes [out, in/2]
            t = t.view(torch.uint8)
        exp = expected_stored_shape(spec, t.dtype)
        if tuple(t.shape) != exp and not (spec.kind == "expert" and tuple(t.shape) == spec.shape):
            raise CheckpointError(f"tensor {spec.name} has shape {list(t.shape)} ({t.dtype}); the config needs "
                                  f"{list(exp)}")
        scale = None
        sname = scale_name(spec.name)
        quantized = t.dtype in (torch.float8_e4m3fn, torch.int8, torch.uint8) and spec.kind != "index"
        if quantized:
            if sname not in present:
                raise CheckpointError(f"tensor {spec.name} is quantized ({t.dtype}) but {sname} is missing")
            scale = reader.get(sname)
            es = expected_scale_shape(spec, t.dtype, config.weight_block)
            if tuple(scale.shape) != es:
                raise CheckpointError(f"tensor {sname} has shape {list(scale.shape)}; {spec.name} needs {list(es)}")
        yield spec, t, scale
