"""Tensor parallelism on torch.distributed: the rank's place in the TP group and the collectives the model needs.

Data-parallel attention with expert parallelism (DEP, `dp_size` > 1): each data-parallel group of `size` TP ranks
runs attention and everything outside the MoE on its own requests' tokens (TP collectives inside the group; the
identity at `size` 1); the MoE exchanges tokens across the groups (`gather_tokens` / `scatter_sum` over `dp_group`,
the ranks of the same TP rank in every group; models/v4/moe.py), then sums over the group's TP ranks, every rank
holding its contiguous share of the routed experts (EP over all dp_size x size ranks).

The model is built under `use(tp)` (as the op backend is, ops/backend.py): the modules that reduce (attention's
`wo_b`, the MoE, the vocab-parallel embedding and head) record `current()` when constructed and call it in forward. At
world size 1 every collective is the identity, so single-GPU code paths are untouched. NCCL on GPUs, gloo on the CPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..ops.peer_sum import PartialSum
from . import allreduce


@dataclass(frozen=True)
class TensorParallel:
    rank: int = 0
    size: int = 1
    group: Any = None  # a torch.distributed process group (None: the default group)
    expert_parallel: bool = False  # routed experts whole on their owner rank instead of sliced (models/sharding.py)
    dp_rank: int = 0  # DEP: this rank's data-parallel group (its own requests; attention over the group's TP ranks)
    dp_size: int = 1  # DEP: data-parallel groups exchanging tokens in the MoE
    dp_group: Any = None  # DEP: the process group of this TP rank in every data-parallel group (None: the default)

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(f"tensor-parallel rank {self.rank} is outside world size {self.size}")
        if self.dp_size < 1 or not 0 <= self.dp_rank < self.dp_size:
            raise ValueError(f"data-parallel rank {self.dp_rank} is outside data-parallel size {self.dp_size}")
        if self.dp_size > 1 and not self.expert_parallel:
            raise ValueError("data-parallel attention runs with expert parallelism")

    @property
    def ep_size(self) -> int:
        """Ranks the routed experts are spread over (1: every rank holds every expert, sliced under TP)."""
        return self.size * self.dp_size if self.expert_parallel else 1

    @property
    def ep_rank(self) -> int:
        return self.dp_rank * self.size + self.rank if self.expert_parallel else 0

    @property
    def data_parallel(self) -> bool:
        return self.dp_size > 1

    def gather_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """DEP: every data-parallel group's x ([n, ...], n equal on all ranks: padded) stacked in group order (over
        `dp_group`: this TP rank's peers)."""
        out = torch.empty(self.dp_size * x.shape[0], *x.shape[1:], dtype=x.dtype, device=x.device)
        _all_gather_single(out, x.contiguous(), group=self.dp_group)
        return out

    def scatter_sum(self, y: torch.Tensor) -> torch.Tensor:
        """DEP: the inverse of `gather_tokens` with a sum: y is [dp_size * n, ...] (every group's partial results for
        every group's tokens); returns this group's n rows summed over `dp_group`, in group order. On gloo an
        all-to-all plus a local sum (faster than gloo's reduce-scatter, docs/parallel.md); NCCL reduce-scatters. Under
        TP the group's ranks still hold partial sums (each its own experts'): the MoE adds them with `all_reduce`."""
        n = y.shape[0] // self.dp_size
        if dist.get_backend(self.dp_group) == "nccl":
            out = torch.empty(n, *y.shape[1:], dtype=y.dtype, device=y.device)
            _reduce_scatter_single(out, y.contiguous(), group=self.dp_group)
            return out
        parts = torch.empty_like(y)
        dist.all_to_all_single(parts, y.contiguous(), group=self.dp_group)
        return parts.view(self.dp_size, n, *y.shape[1:]).sum(0)

    def max_tokens(self, n: int, device: torch.device) -> int:
        """DEP: the largest token count over the data-parallel groups (when the step did not say, `step_tokens`; a
        group's TP ranks hold the same tokens, so this TP rank's peers suffice)."""
        t = torch.tensor([n], dtype=torch.int64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.dp_group)
        return int(t.item())

    def all_reduce(self, x: torch.Tensor, defer: bool = False,
                   out_dtype: torch.dtype | None = None) -> torch.Tensor | PartialSum:
        """Sum of every rank's x, e.g. the partial outputs of a row-parallel projection, cast to `out_dtype` when
        given (in place, or a new tensor: use the result). `defer`: the consumer is an mHC expansion, which may
        finish the sum itself (a PartialSum under V4SERVE_ALLREDUCE=fused; dist/allreduce.py)."""
        if self.size > 1:
            return allreduce.all_reduce(x, self.group, defer, out_dtype)
        return x if out_dtype is None else x.to(out_dtype)

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's x concatenated along the last dim, in rank order (the vocab-parallel head's logits)."""
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)


# torch >= 2.13 names (the older ones warn there); older torch has only the older ones
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

SINGLE = TensorParallel()
_current: ContextVar[TensorParallel] = ContextVar("v4serve_tensor_parallel", default=SINGLE)


_step_tokens: ContextVar[int | None] = ContextVar("v4serve_dep_step_tokens", default=None)


def current() -> TensorParallel:
    return _current.get()


def step_tokens() -> int | None:
    """DEP: the step's largest per-rank token count, as rank 0 broadcast it (None: the MoE asks the ranks)."""
    return _step_tokens.get()


@contextlib.contextmanager
def dep_step(tokens: int) -> Iterator[None]:
    """Run a DEP forward whose largest per-rank token count is `tokens` (every MoE pads its exchange to it)."""
    token = _step_tokens.set(tokens)
    try:
        yield
    finally:
        _step_tokens.reset(token)


@contextlib.contextmanager
def use(tp: TensorParallel) -> Iterator[None]:
    token = _current.set(tp)
    try:
        yield
    finally:
        _current.reset(token)
