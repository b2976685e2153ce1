"""The MoE feed-forward of a DeepSeek-V4 block: router (bias or hash), routed experts, shared expert."""

from __future__ import annotations

import torch
from torch import nn

from ...config import ModelConfig
from ...ops import moe as moe_ops
from ...ops.linear import Linear, dequantize, stored_format
from ..numerics import Numerics
from .modules import param


class Gate(nn.Module):
    def __init__(self, config: ModelConfig, n_experts: int, hash_routed: bool):
        super().__init__()
        self.weight = param(n_experts, config.dim)
        self.bias = None if hash_routed else param(n_experts)
        self.tid2eid = param(config.vocab_size, config.n_activated_experts, dtype=torch.int64) if hash_routed else None


class Experts(nn.Module):
    """Routed experts stacked per projection ([E, out, in]); loaded one expert tensor at a time."""

    def __init__(self, config: ModelConfig, n_experts: int):
        super().__init__()
        c = config
        self.n = n_experts
        self.shapes = {"w1": (c.moe_inter_dim, c.dim), "w2": (c.dim, c.moe_inter_dim), "w3": (c.moe_inter_dim, c.dim)}
        self.w1 = self.w2 = self.w3 = None
        self.quantized = False

    def set_expert(self, e: int, which: str, weight: torch.Tensor, scale: torch.Tensor | None, block: int,
                   dtype: torch.dtype) -> None:
        fmt = stored_format(weight)
        w = dequantize(weight, scale, fmt, block)
        if tuple(w.shape) != self.shapes[which]:
            raise ValueError(f"expert {e} {which}: shape {tuple(w.shape)} does not fit {self.shapes[which]}")
        self.quantized = self.quantized or fmt != "float"
        stack = getattr(self, which)
        if stack is None:
            stack = nn.Parameter(torch.zeros(self.n, *self.shapes[which], dtype=dtype, device=w.device),
                                 requires_grad=False)
            setattr(self, which, stack)
        stack.data[e] = w.to(dtype)


class MoE(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, numerics: Numerics, n_experts: int | None = None,
                 topk: int | None = None, shared_clamp: bool | None = None):
        super().__init__()
        c = config
        self.config, self.numerics = c, numerics
        self.n_experts = n_experts or c.n_routed_experts
        self.topk = topk or c.n_activated_experts
        self.hash_routed = layer < c.n_layers and c.is_hash_layer(layer)
        self.gate = Gate(c, self.n_experts, self.hash_routed)
        self.experts = Experts(c, self.n_experts)
        self.shared_experts = nn.Module()
        for w, (o, i) in {"w1": (c.moe_inter_dim, c.dim), "w2": (c.dim, c.moe_inter_dim),
                          "w3": (c.moe_inter_dim, c.dim)}.items():
            setattr(self.shared_experts, w, Linear(i, o))
        self.shared_clamp = numerics.shared_clamp if shared_clamp is None else shared_clamp
        self.grouped = False  # set by the model for CUDA (sorted grouped GEMMs, graph-safe)

    def forward(self, x: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        c, nm = self.config, self.numerics
        weights, ids = moe_ops.route(x, self.gate.weight, self.gate.bias, self.gate.tid2eid, token_ids, self.topk,
                                     c.score_func, c.route_scale, nm.gate_eps, c.norm_topk_prob)
        return self.combine(x, weights, ids)

    def combine(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Routed experts of a routing (weights, expert ids [T, k]) plus the shared expert."""
        c, nm = self.config, self.numerics
        act = c.weight_block if nm.act_quant and self.experts.quantized else 0
        y = moe_ops.experts_forward(x, self.experts.w1, self.experts.w2, self.experts.w3, weights, ids,
                                    c.swiglu_limit, act, nm.weight_before_w2, self.grouped)
        if c.n_shared_experts:
            se = self.shared_experts
            sact = c.weight_block if nm.act_quant and se.w1.quantized else 0
            y = y + moe_ops.dense_mlp(x, se.w1.weight, se.w2.weight, se.w3.weight,
                                      c.swiglu_limit if self.shared_clamp else 0.0, sact)
        return y.to(x.dtype)
