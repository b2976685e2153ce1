"""The MoE feed-forward of a DeepSeek-V4 block: router (bias or hash), routed experts, shared expert."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ...config import ModelConfig
from ...dist import parallel
from ...ops import backend as kernels
from ...ops import moe as moe_ops
from ...ops import streams
from ...ops.linear import Linear, logical_shape, scale_bytes, stored_format
from ...ops.peer_sum import PartialSum
from ...ops.shard import EXPERT, SHARED_IN, SHARED_OUT
from ...ops.precision import acc_dtype
from ...ops.router import route
from ..numerics import Numerics
from .modules import param


class Gate(nn.Module):
    def __init__(self, config: ModelConfig, n_experts: int, hash_routed: bool):
        super().__init__()
        self.weight = param(n_experts, config.dim)
        self.bias = None if hash_routed else param(n_experts)
        self.tid2eid = param(config.vocab_size, config.n_activated_experts, dtype=torch.int64) if hash_routed else None


class Experts(nn.Module):
    """Routed experts stacked per projection in their stored format ([E, out, in/2] FP4 + [E, out, in/32] e8m0, or
    FP8 + block scales, or floats); loaded one expert tensor at a time, never dequantized outside a call."""

    def __init__(self, config: ModelConfig, n_experts: int, first: int = 0):
        super().__init__()
        c = config
        self.n = n_experts
        self.first = first  # the global id of local expert 0 (expert parallelism holds a contiguous range)
        self.shapes = {"w1": (c.moe_inter_dim, c.dim), "w2": (c.dim, c.moe_inter_dim), "w3": (c.moe_inter_dim, c.dim)}
        for w in ("w1", "w2", "w3"):
            self.register_buffer(w, None)
            self.register_buffer("s" + w[1], None)
        self.block = c.weight_block
        self.quantized = False

    def set_expert(self, e: int, which: str, weight: torch.Tensor, scale: torch.Tensor | None, block: int) -> None:
        e -= self.first
        if not 0 <= e < self.n:
            raise ValueError(f"expert {e + self.first} is not among this rank's {self.first}..{self.first + self.n - 1}")
        fmt = stored_format(weight)
        if logical_shape(weight) != self.shapes[which]:
            raise ValueError(f"expert {e} {which}: shape {list(logical_shape(weight))} does not fit "
                             f"{list(self.shapes[which])}")
        if fmt != "float" and scale is None:
            raise ValueError(f"expert {e} {which}: a {fmt} weight needs its scales")
        stored = weight.view(torch.uint8) if fmt == "fp4" else weight
        scale = scale_bytes(scale)
        stack = getattr(self, which)
        if stack is None:
            stack = torch.empty(self.n, *stored.shape, dtype=stored.dtype, device=stored.device)
            setattr(self, which, stack)
            if scale is not None:
                setattr(self, "s" + which[1], torch.empty(self.n, *scale.shape, dtype=scale.dtype,
                                                          device=scale.device))
        if stack.dtype != stored.dtype or tuple(stack.shape[1:]) != tuple(stored.shape):
            raise ValueError(f"expert {e} {which} is stored as {stored.dtype} {list(stored.shape)}, unlike expert 0 "
                             f"({stack.dtype} {list(stack.shape[1:])})")
        stack[e] = stored
        if scale is not None:
            getattr(self, "s" + which[1])[e] = scale
        self.quantized = self.quantized or fmt != "float"
        self.block = block

    def stored(self) -> moe_ops.ExpertWeights:
        return moe_ops.ExpertWeights(self.w1, self.w2, self.w3, self.s1, self.s2, self.s3, self.block)


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
        self.tp = tp = parallel.current()
        # expert parallelism: this rank's contiguous range of whole experts, over the TP ranks or (DEP) the
        # data-parallel ranks; the shared expert is sliced over TP either way (without EP, rank_config already
        # sliced every expert's width)
        ep = tp.ep_size > 1
        local = self.n_experts // tp.ep_size if ep else self.n_experts
        self.experts = Experts(c, local, tp.ep_rank * local if ep else 0)
        inter = c.moe_inter_dim // tp.size if ep else c.moe_inter_dim
        self.shared_experts = nn.Module()
        for w, (o, i) in {"w1": (inter, c.dim), "w2": (c.dim, inter), "w3": (inter, c.dim)}.items():
            setattr(self.shared_experts, w, Linear(i, o, shard=SHARED_OUT if w == "w2" else SHARED_IN))
        self.shard_rules = {"experts.": EXPERT}  # whole to their EP owner, or sliced as the shared expert
        self.shared_clamp = numerics.shared_clamp if shared_clamp is None else shared_clamp
        self.backend = kernels.current()

    def forward(self, x: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor | PartialSum:
        c, nm = self.config, self.numerics
        xq = self.simulated_input(x)
        weights, ids = route(x, self.gate.weight, self.gate.bias, self.gate.tid2eid, token_ids, self.topk,
                             c.score_func, c.route_scale, nm.gate_eps, c.norm_topk_prob, self.backend, xq=xq,
                             quant_group=self._act_group())
        return self.combine(x, weights, ids, xq)

    def simulated_input(self, x: torch.Tensor) -> torch.Tensor | None:
        """A buffer for x's FP8 simulation that the router fills for the routed experts (ops.moe
        `router_simulated_input`: at one token the experts then launch nothing before their gate-up); one rank only
        (under TP and DEP the experts read gathered tokens)."""
        if self.tp.size != 1 or self.tp.data_parallel:
            return None
        return moe_ops.router_simulated_input(x, self.experts.stored(), self._act_group(), self.backend)

    def combine(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                xq: torch.Tensor | None = None) -> torch.Tensor | PartialSum:
        """Routed experts of a routing (weights, expert ids [T, k]) plus the shared expert; `xq`: x's FP8 simulation
        from the router (`simulated_input`)."""
        if self.tp.data_parallel:
            return self._combine_dep(x, weights, ids)
        if self.tp.size == 1:  # the shared expert's output added and the sum rounded inside the routed experts' pass
            if not self.config.n_shared_experts:
                return self._routed(x, weights, ids, None, x.dtype, xq=xq)
            side = streams.fork("shared_expert", x)  # (V4SERVE_OVERLAP: on a side stream beside the routed experts)
            if side is None:
                return self._routed(x, weights, ids, self._shared(x, widen=False), x.dtype, xq=xq)
            shared = side.run(lambda: self._shared(x, widen=False))
            return self._routed(x, weights, ids, shared, x.dtype, join=side.join, xq=xq)
        y = self._routed(x, weights, ids)
        if self.config.n_shared_experts:
            y = y + self._shared(x)
        # under TP each rank holds a slice of every expert's width (the sum may be left to the mHC expansion)
        return self.tp.all_reduce(y, defer=True, out_dtype=x.dtype)

    def _routed(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, shared: torch.Tensor | None = None,
                out_dtype: torch.dtype | None = None, join: Callable[[], None] | None = None,
                xq: torch.Tensor | None = None) -> torch.Tensor:
        """This rank's routed experts' share of the output ([T, D] at accumulation precision), + `shared`, rounded to
        `out_dtype` when given (ops.moe.experts_forward; `join` before `shared` is read)."""
        c, nm = self.config, self.numerics
        ex = self.experts
        if ex.n != self.n_experts:  # EP: picks of other ranks' experts weigh zero here (their owners add them)
            local = ids - ex.first
            mine = (local >= 0) & (local < ex.n)
            ids, weights = torch.where(mine, local, torch.zeros_like(local)), weights * mine
        return moe_ops.experts_forward(x, self.experts.stored(), weights, ids, c.swiglu_limit, self._act_group(),
                                       nm.weight_before_w2, self.backend, shared, out_dtype, join, xq)

    def _act_group(self) -> int:
        """The routed experts' activation quantization group (0: none)."""
        return self.config.weight_block if self.numerics.act_quant and self.experts.quantized else 0

    def _shared(self, x: torch.Tensor, widen: bool = True) -> torch.Tensor:
        c, nm = self.config, self.numerics
        se = self.shared_experts
        sact = c.weight_block if nm.act_quant and se.w1.quantized else 0
        return moe_ops.dense_mlp(x, *(_stored(m) for m in (se.w1, se.w2, se.w3)),
                                 c.swiglu_limit if self.shared_clamp else 0.0, sact, self.backend, widen)

    def _combine_dep(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """DEP: x holds this data-parallel group's own tokens. Every group's tokens and routings are all-gathered
        (padded to the step's largest per-group count), each rank runs its experts on all of them, and the partial
        outputs go back to their tokens' group summed (tp.scatter_sum); the shared expert runs on the own tokens.
        Under TP each of the group's ranks then holds its experts' (and its shared-expert slice's) share: summed over
        the group (an idle group has no tokens on any of its ranks, and skips that sum on all of them)."""
        tp = self.tp
        T = x.shape[0]
        n = parallel.step_tokens()
        if n is None:
            n = tp.max_tokens(T, x.device)
        if T > n:
            raise RuntimeError(f"a DEP MoE got {T} tokens, more than the step's announced maximum {n}")
        a = acc_dtype(x)
        # routing packed in float64 (ids exact, float32/float64 weights exact); padding rows pick expert -1:
        # no rank's, so they weigh zero everywhere
        route = torch.full((n, 2 * self.topk), -1.0, dtype=torch.float64, device=x.device)
        route[:T, :self.topk] = weights.to(torch.float64)
        route[:T, self.topk:] = ids.to(torch.float64)
        route[T:, :self.topk] = 0.0
        xs = torch.zeros(n, x.shape[1], dtype=x.dtype, device=x.device)
        xs[:T] = x
        xs, route = tp.gather_tokens(xs), tp.gather_tokens(route)
        y = tp.scatter_sum(self._routed(xs, route[:, :self.topk].to(a), route[:, self.topk:].to(torch.int64)))[:T]
        if self.config.n_shared_experts and T:
            y = y + self._shared(x)
        if tp.size > 1 and T:
            return tp.all_reduce(y, out_dtype=x.dtype)
        return y.to(x.dtype)

    def idle(self, dtype: torch.dtype) -> None:
        """DEP: a rank without tokens this step still joins this layer's exchange (its experts serve the others)."""
        dev = self.gate.weight.device
        x = torch.empty(0, self.config.dim, dtype=dtype, device=dev)
        self._combine_dep(x, torch.empty(0, self.topk, dtype=acc_dtype(x), device=dev),
                          torch.empty(0, self.topk, dtype=torch.int64, device=dev))


def dep_idle(model: nn.Module, tokens: int) -> None:
    """A DEP rank with no requests in a step: every MoE layer's exchange, in forward order, with no tokens of its
    own (`tokens`: the step's largest per-rank count, as the other ranks pad to it)."""
    with parallel.dep_step(tokens):
        idle_layers(model.layers, model.compute_dtype)


def idle_layers(layers, dtype: torch.dtype) -> None:
    """DEP: the MoE exchanges of `layers` that a forward skips on this rank (e.g. V4.1's decoder layers when the trim
    leaves no token), so that the other ranks' exchanges still meet this rank's."""
    for layer in layers:
        if layer.ffn.tp.data_parallel:
            layer.ffn.idle(dtype)


def _stored(m: Linear) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    return m.weight, m.scale, m.block
