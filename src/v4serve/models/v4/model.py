"""The DeepSeek-V4 model (V4-Flash, V4-Pro, V4-Flash-0731) with an engine-shaped forward.

`model(step, pools)` runs one step: every row's tokens (decode tokens and prefill chunks of any length at any
position) flattened together, reading and writing the per-request cache state in `pools`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ...cache.pool import KVPools
from ...config import ModelConfig
from ...ops import backend as kernels
from ...ops.linear import Linear, linear
from ...dist import parallel
from ...ops.mhc import hc_head
from ...ops.precision import wide
from ...ops.shard import VOCAB
from ..numerics import Numerics
from ..vocab import embed_lookup, gather_logits
from ..step import StepInput
from .block import V4Block
from .context import StepContext
from .modules import Norm, param


@dataclass
class ModelOutput:
    logits: torch.Tensor  # [L, vocab] float32, for step.logits_index
    hidden: torch.Tensor  # [T, hc_mult, dim] final residual streams (input to MTP / draft heads)


class MTPBlock(V4Block):
    """V4's multi-token-prediction block: a window-only block fed by the embedding of the next token and the
    main model's final streams, with its own final collapse and norm (embedding and head are shared)."""

    def __init__(self, config: ModelConfig, layer: int, numerics: Numerics):
        super().__init__(config, layer, numerics)
        c = config
        self.e_proj = Linear(c.dim, c.dim)
        self.h_proj = Linear(c.dim, c.dim)
        self.enorm = Norm(c.dim, c.norm_eps)
        self.hnorm = Norm(c.dim, c.norm_eps)
        self.norm = Norm(c.dim, c.norm_eps)
        self.hc_head_fn, self.hc_head_base, self.hc_head_scale = param(c.hc_mult, c.hc_mult * c.dim), \
            param(c.hc_mult), param(1)


class V4Model(nn.Module):
    def __init__(self, config: ModelConfig, numerics: Numerics, with_mtp: bool = True,
                 dtype: torch.dtype = torch.float32):
        super().__init__()
        c = config
        self.config, self.numerics = c, numerics
        self.compute_dtype = dtype  # activations; the weights keep their stored formats
        self.backend = kernels.current()
        self.tp = parallel.current()
        vocab = c.vocab_size // self.tp.size  # this rank's rows of the embedding and head (models/vocab.py)
        self.embed = nn.Module()
        self.embed.weight = param(vocab, c.dim)
        self.layers = nn.ModuleList(V4Block(c, i, numerics) for i in range(c.n_layers))
        self.norm = Norm(c.dim, c.norm_eps)
        self.head = nn.Module()
        self.head.weight = param(vocab, c.dim)
        self.shard_rules = {"embed.weight": VOCAB, "head.weight": VOCAB}  # this rank's rows of the vocabulary
        self.hc_head_fn, self.hc_head_base, self.hc_head_scale = param(c.hc_mult, c.hc_mult * c.dim), \
            param(c.hc_mult), param(1)
        n_mtp = c.n_mtp_layers if with_mtp else 0
        self.mtp = nn.ModuleList(MTPBlock(c, c.n_layers + j, numerics) for j in range(n_mtp))

    @property
    def dtype(self) -> torch.dtype:
        return self.compute_dtype

    @property
    def logits_dtype(self) -> torch.dtype:
        return torch.float64 if self.compute_dtype == torch.float64 else torch.float32  # the head's accumulation

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        return embed_lookup(self.embed.weight, ids, self.tp, self.compute_dtype)

    def logits(self, x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor,
               norm: Norm) -> torch.Tensor:
        c = self.config
        h = wide(hc_head(x, fn, base, scale, c.norm_eps, c.hc_eps, norm.weight, norm.eps, self.backend))
        local = linear(h, self.head.weight, None, 0, 0, self.backend)  # bf16 head read as stored, float32 math
        return gather_logits(local, self.tp)

    def forward(self, step: StepInput, pools: KVPools) -> ModelOutput:
        c = self.config
        ctx = StepContext(step, c, pools, self.backend)
        h = self.embed_tokens(step.token_ids)
        x = h.unsqueeze(1).expand(-1, c.hc_mult, -1).contiguous()
        pending = None
        for layer in self.layers:  # each block's FFN expansion runs in the next one's first mHC call
            x, pending = layer.seam(x, ctx, pending)
        x = self.layers[-1].expand(x, pending)
        sel = x[step.logits_index]
        return ModelOutput(self.logits(sel, self.hc_head_fn, self.hc_head_base, self.hc_head_scale, self.norm), x)

    def mtp_forward(self, step: StepInput, pools: KVPools, hidden: torch.Tensor, depth: int = 0) -> ModelOutput:
        """One MTP block: step.token_ids are the *next* tokens, `hidden` the main model's streams at the same
        positions; returns logits for the token after next. Its window ring is cache layer n_layers + depth."""
        blk: MTPBlock = self.mtp[depth]
        ctx = StepContext(step, self.config, pools, self.backend)
        e = blk.enorm(self.embed_tokens(step.token_ids))
        x = blk.e_proj(e).unsqueeze(1) + blk.h_proj(blk.hnorm(hidden))
        x = blk(x, ctx)
        sel = x[step.logits_index]
        return ModelOutput(self.logits(sel, blk.hc_head_fn, blk.hc_head_base, blk.hc_head_scale, blk.norm), x)
