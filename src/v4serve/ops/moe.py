"""Mixture-of-experts expert computation: one entry point, the plain-torch reference and the Triton kernels.

Experts are SwiGLU with the gate clamped from above and the up projection clamped both ways. The routed experts of a
layer are held as stacks in their stored format (`ExpertWeights`: FP4 e2m1 packed two per byte with per-32 e8m0
scales as released, or FP8 with block scales, or plain floats); the reference dequantizes each expert it needs per
call, the kernels (ops/kernels/moe.py) dequantize tiles in registers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import backend as kernels
from . import quant
from .linear import dequantize, linear, stored_format
from .precision import acc_dtype
from .profiling import family


@dataclass
class ExpertWeights:
    """The routed experts of one layer, stacked per projection in their stored format.

    fp4:   w1/w3 uint8 [E, I, D/2], w2 uint8 [E, D, I/2]; s1/s3 uint8 e8m0 [E, I, D/32], s2 [E, D, I/32]
    fp8:   w* float8_e4m3fn [E, out, in]; s* uint8 e8m0 [E, ceil(out/block), ceil(in/block)]
    float: w* [E, out, in] (bf16/f32/f64); s* None
    """

    w1: torch.Tensor
    w2: torch.Tensor
    w3: torch.Tensor
    s1: torch.Tensor | None
    s2: torch.Tensor | None
    s3: torch.Tensor | None
    block: int  # the FP8 block size (fp4 scales are always per 32)

    @property
    def fmt(self) -> str:
        return stored_format(self.w1)

    @property
    def num_experts(self) -> int:
        return self.w1.shape[0]

    def expert(self, e: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Expert e's (w1, w2, w3) dequantized to `dtype` (a per-call temporary)."""
        def one(w: torch.Tensor, s: torch.Tensor | None) -> torch.Tensor:
            return dequantize(w[e], None if s is None else s[e], self.block, dtype)
        return one(self.w1, self.s1), one(self.w2, self.s2), one(self.w3, self.s3)


def swiglu(g: torch.Tensor, u: torch.Tensor, limit: float) -> torch.Tensor:
    a = acc_dtype(g, u)
    g, u = g.to(a), u.to(a)
    if limit > 0:
        u = u.clamp(-limit, limit)
        g = g.clamp(max=limit)
    return F.silu(g) * u


def _maybe_quant(x: torch.Tensor, group: int) -> torch.Tensor:
    return quant.fp8_simulate(x, group) if group else x


def _expert_out(xe: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor, we: torch.Tensor,
                limit: float, act_group: int, weight_before_w2: bool, dtype: torch.dtype) -> torch.Tensor:
    h = swiglu(xe @ w1.t(), xe @ w3.t(), limit)
    if weight_before_w2:
        h = h * we
    y = (_maybe_quant(h.to(dtype), act_group) @ w2.t()).to(acc_dtype(xe))
    return y if weight_before_w2 else y * we


def experts_reference(x: torch.Tensor, experts: ExpertWeights, weights: torch.Tensor, ids: torch.Tensor,
                      limit: float, act_group: int, weight_before_w2: bool, shared: torch.Tensor | None = None,
                      out_dtype: torch.dtype | None = None, join: Callable[[], None] | None = None,
                      xq: torch.Tensor | None = None) -> torch.Tensor:
    """Routed experts, plain torch. x [T, D]; weights/ids [T, k]. Returns [T, D] at accumulation precision, plus
    `shared` (widened) when given, rounded to `out_dtype` when given. `xq`: x's FP8 simulation per 1 x act_group
    where the caller has it (`router_simulated_input`), read instead of simulating x again (the same values).

    On the CPU it loops over the experts that received tokens. On CUDA it runs every expert on every token with zero
    weight where not routed: static shapes and no host sync, so it can be captured in a CUDA graph (exact: a zero
    weight adds exact zeros, and contributions are added in expert order either way).
    """
    out = _routed_sum(x, experts, weights, ids, limit, act_group, weight_before_w2, xq)
    if join is not None:
        join()
    if shared is not None:
        out = out + shared.to(out.dtype)
    return out if out_dtype is None else out.to(out_dtype)


def _routed_sum(x: torch.Tensor, experts: ExpertWeights, weights: torch.Tensor, ids: torch.Tensor, limit: float,
                act_group: int, weight_before_w2: bool, xq: torch.Tensor | None = None) -> torch.Tensor:
    T = x.shape[0]
    xq = _maybe_quant(x, act_group) if xq is None or not act_group else xq
    out = torch.zeros(T, x.shape[1], dtype=acc_dtype(x), device=x.device)
    if x.is_cuda:
        for e in range(experts.num_experts):
            we = (weights * (ids == e)).sum(-1, keepdim=True)
            w1, w2, w3 = experts.expert(e, x.dtype)
            out += _expert_out(xq, w1, w2, w3, we, limit, act_group, weight_before_w2, x.dtype)
        return out
    for e in torch.unique(ids).tolist():
        t_idx, slot = torch.nonzero(ids == e, as_tuple=True)
        w1, w2, w3 = experts.expert(e, x.dtype)
        we = weights[t_idx, slot].unsqueeze(1).to(out.dtype)
        out.index_add_(0, t_idx, _expert_out(xq[t_idx], w1, w2, w3, we, limit, act_group, weight_before_w2,
                                             x.dtype))
    return out


def experts_forward(x: torch.Tensor, experts: ExpertWeights, weights: torch.Tensor, ids: torch.Tensor,
                    limit: float, act_group: int, weight_before_w2: bool,
                    backend: str = kernels.REFERENCE, shared: torch.Tensor | None = None,
                    out_dtype: torch.dtype | None = None, join: Callable[[], None] | None = None,
                    xq: torch.Tensor | None = None) -> torch.Tensor:
    """The routed experts of a routing (weights [T, k] float32, expert ids [T, k] int64) -> [T, D] at accumulation
    precision (float32, or float64 for a float64 x). `shared` [T, D] (the shared expert's output) is added to the
    sum, and `out_dtype` rounds the result once: the layer's output in one pass (the kernels add it in their combine).
    `join` is called before `shared` is read (ops/streams.py: it may still be computing on a side stream). `xq`: x's
    FP8 simulation, filled by the router (`router_simulated_input`)."""
    with family("moe"):
        if backend == kernels.TRITON:
            from .kernels import moe as moe_kernels

            if moe_kernels.supports(x, experts):
                return moe_kernels.experts_forward(x, experts, weights, ids, limit, act_group, weight_before_w2,
                                                   shared=shared, out_dtype=out_dtype, join=join, xq=xq)
        return experts_reference(x, experts, weights, ids, limit, act_group, weight_before_w2, shared, out_dtype, join,
                                 xq)


def router_simulated_input(x: torch.Tensor, experts: ExpertWeights, act_group: int,
                           backend: str = kernels.REFERENCE) -> torch.Tensor | None:
    """An empty buffer for x's FP8 simulation per 1 x act_group where the routed experts' kernels would take it made
    elsewhere: the router fills it in its own launch (ops.router.route's `xq`), `experts_forward` reads it (`xq`),
    and at one token the experts then launch nothing before their gate-up (no sort, no simulation). None elsewhere:
    the experts simulate x themselves."""
    if backend != kernels.TRITON or not act_group:
        return None
    from .kernels import moe as moe_kernels

    if not moe_kernels.takes_simulated_input(x, experts, act_group):
        return None
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def dense_mlp(x: torch.Tensor, w1: tuple, w2: tuple, w3: tuple, limit: float, act_group: int,
              backend: str = kernels.REFERENCE, widen: bool = True) -> torch.Tensor:
    """The shared expert (SwiGLU, optional clamp); each w is (weight, scale, block) in its stored format.
    Returns x's accumulation dtype (`widen`), or w2's output as it is: x's dtype (experts_forward's `shared` widens it
    inside the routed experts' combine, without a copy of its own).

    Triton at decode (kernels/fp8_swiglu.py): gate, up and the SwiGLU in one launch, then w2's linear. g and u are
    rounded to x's dtype before the SwiGLU, as here; only exp/division rounding in the float32 SwiGLU may differ."""
    with family("moe"):
        if backend == kernels.TRITON:
            from .kernels import fp8_swiglu

            x2 = x.reshape(-1, x.shape[-1])
            if fp8_swiglu.supports(x2, w1, w3, act_group):
                h = fp8_swiglu.run(x2, w1[0], w1[1], w3[0], w3[1], w1[2], act_group, limit)
                y = linear(h.view(*x.shape[:-1], -1), *w2, act_group, backend)
                return y.to(acc_dtype(x)) if widen else y
        g = linear(x, *w1, act_group, backend)
        u = linear(x, *w3, act_group, backend)
        h = swiglu(g, u, limit).to(x.dtype)
        y = linear(h, *w2, act_group, backend)
        return y.to(acc_dtype(x)) if widen else y
