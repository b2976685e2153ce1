"""Tensor parallelism on torch.distributed: the rank's place in the TP group and the collectives the model needs.

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


@dataclass(frozen=True)
class TensorParallel:
    rank: int = 0
    size: int = 1
    group: Any = None  # a torch.distributed process group (None: the default group)
    expert_parallel: bool = False  # routed experts whole on their owner rank instead of sliced (models/sharding.py)

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(f"tensor-parallel rank {self.rank} is outside world size {self.size}")

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of every rank's x (in place), e.g. the partial outputs of a row-parallel projection."""
        if self.size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's x concatenated along the last dim, in rank order (the vocab-parallel head's logits)."""
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)


SINGLE = TensorParallel()
_current: ContextVar[TensorParallel] = ContextVar("v4serve_tensor_parallel", default=SINGLE)


def current() -> TensorParallel:
    return _current.get()


@contextlib.contextmanager
def use(tp: TensorParallel) -> Iterator[None]:
    token = _current.set(tp)
    try:
        yield
    finally:
        _current.reset(token)
