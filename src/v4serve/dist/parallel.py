"""Tensor parallelism on torch.distributed: the rank's place in the TP group and the collectives the model needs.

The model is built under `use(tp)` (as the op backend is, ops/backend.py): the modules that reduce (attention's
`wo_b`, the MoE, the vocab-parallel embedding and head) record `current()` when constructed and call it in forward. At
world size 1 every collective is the identity, so single-GPU code paths are untouched. NCCL on GPUs, gloo on the CPU.
"""

from __future__ import annotations

import contextlib
import os
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

    @property
    def rank_layout(self) -> Any:
        """The loader's view (models.weights.ParallelRank): TP slices, and with EP the experts' owner ranks."""
        from ..models.weights import ParallelRank

        ep = self.size if self.expert_parallel else 1
        return ParallelRank(tp_rank=self.rank, tp_size=self.size, ep_rank=self.rank if ep > 1 else 0, ep_size=ep)

    def shard(self, n: int) -> tuple[int, int]:
        """[lo, hi) of this rank's even share of n (the caller checks divisibility)."""
        per = n // self.size
        return self.rank * per, (self.rank + 1) * per


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


def init_from_env(backend: str | None = None) -> TensorParallel:
    """Join the process group described by torch.distributed's standard launch environment (torchrun, or RANK,
    WORLD_SIZE, MASTER_ADDR, MASTER_PORT): the whole world is one tensor-parallel group."""
    if not dist.is_initialized():
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        dist.init_process_group(backend)
    return TensorParallel(dist.get_rank(), dist.get_world_size(), None)


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))
