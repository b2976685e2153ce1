"""Mixture-of-experts routing and expert computation (plain torch).

Routing (DeepSeek-V4): scores = score_func(x W_gate^T) in float32; the experts are the top-k of scores + bias
(or a fixed per-token table on hash layers); the weights are the *unbiased* scores of those experts,
normalised and multiplied by route_scale. Experts are SwiGLU with the gate clamped from above and the up
projection clamped both ways.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import quant
from .precision import acc_dtype


def route(x: torch.Tensor, gate_w: torch.Tensor, bias: torch.Tensor | None, tid2eid: torch.Tensor | None,
          token_ids: torch.Tensor | None, topk: int, score_func: str, route_scale: float, eps: float,
          norm: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (weights [T, k] float32, expert ids [T, k] int64)."""
    a = acc_dtype(x)
    logits = x.to(a) @ gate_w.to(a).t()
    if score_func == "softmax":
        scores = logits.softmax(-1)
    elif score_func == "sigmoid":
        scores = logits.sigmoid()
    else:
        scores = F.softplus(logits).sqrt()
    if tid2eid is not None:
        ids = tid2eid[token_ids].long()
    else:
        sel = scores + bias.to(a) if bias is not None else scores
        ids = sel.topk(topk, dim=-1).indices
    w = scores.gather(1, ids)
    if norm and score_func != "softmax":
        w = w / (w.sum(-1, keepdim=True) + eps)
    return w * route_scale, ids


def swiglu(g: torch.Tensor, u: torch.Tensor, limit: float) -> torch.Tensor:
    a = acc_dtype(g, u)
    g, u = g.to(a), u.to(a)
    if limit > 0:
        u = u.clamp(-limit, limit)
        g = g.clamp(max=limit)
    return F.silu(g) * u


def _maybe_quant(x: torch.Tensor, group: int) -> torch.Tensor:
    return quant.fp8_simulate(x, group) if group else x


def experts_forward(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor,
                    weights: torch.Tensor, ids: torch.Tensor, limit: float, act_group: int,
                    weight_before_w2: bool, grouped: bool | str) -> torch.Tensor:
    """Routed experts. x [T, D]; w1/w3 [E, I, D], w2 [E, D, I]; weights/ids [T, k]. Returns [T, D] at accumulation
    precision.

    `grouped` (True / "grouped"): sort the (token, expert) pairs by expert and run one grouped GEMM per projection
    (static shapes, no host sync; bf16/fp16 on CUDA). "dense": every expert on every token with zero weight where not
    routed (static shapes for dtypes the grouped GEMM lacks, e.g. float64 graphs of tiny test models). Otherwise
    loop over the experts that received tokens (reference).
    """
    T, k = ids.shape
    E = w1.shape[0]
    xq = _maybe_quant(x, act_group)
    if grouped == "dense":
        out = torch.zeros(T, x.shape[1], dtype=acc_dtype(x), device=x.device)
        for e in range(E):
            we = (weights * (ids == e)).sum(-1, keepdim=True)
            h = swiglu(xq @ w1[e].t(), xq @ w3[e].t(), limit)
            if weight_before_w2:
                h = h * we
            y = (_maybe_quant(h.to(x.dtype), act_group) @ w2[e].t()).to(out.dtype)
            out += y if weight_before_w2 else y * we
        return out
    if grouped:
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        tok = torch.div(order, k, rounding_mode="floor")
        counts = torch.zeros(E, dtype=torch.int64, device=x.device).scatter_add_(0, flat, torch.ones_like(flat))
        offs = torch.cumsum(counts, 0).to(torch.int32)
        xs = xq[tok]
        g = torch._grouped_mm(xs, w1.transpose(1, 2), offs=offs)
        u = torch._grouped_mm(xs, w3.transpose(1, 2), offs=offs)
        h = swiglu(g, u, limit)
        wsort = weights.reshape(-1)[order].unsqueeze(1)
        if weight_before_w2:
            h = h * wsort
        h = _maybe_quant(h.to(x.dtype), act_group)
        y = torch._grouped_mm(h, w2.transpose(1, 2), offs=offs).to(acc_dtype(x))
        if not weight_before_w2:
            y = y * wsort
        # un-sort and sum the k contributions of each token in a fixed order (atomics would make it run-dependent)
        out = torch.empty(T * k, x.shape[1], dtype=acc_dtype(x), device=x.device)
        out[order] = y
        return out.view(T, k, -1).sum(1)
    out = torch.zeros(T, x.shape[1], dtype=acc_dtype(x), device=x.device)
    for e in torch.unique(ids).tolist():
        t_idx, slot = torch.nonzero(ids == e, as_tuple=True)
        xe = xq[t_idx]
        h = swiglu(xe @ w1[e].t(), xe @ w3[e].t(), limit)
        we = weights[t_idx, slot].unsqueeze(1)
        if weight_before_w2:
            h = h * we
        y = (_maybe_quant(h.to(x.dtype), act_group) @ w2[e].t()).to(out.dtype)
        if not weight_before_w2:
            y = y * we
        out.index_add_(0, t_idx, y)
    return out


def dense_mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor, limit: float,
              act_group: int) -> torch.Tensor:
    """The shared expert (SwiGLU, optional clamp). Returns float32."""
    xq = _maybe_quant(x, act_group)
    h = swiglu(xq @ w1.t(), xq @ w3.t(), limit)
    return (_maybe_quant(h.to(x.dtype), act_group) @ w2.t()).to(acc_dtype(x))
