"""The tensor-parallel all-reduce: NCCL, or a one-shot all-reduce over symmetric memory for decode-sized messages.

One-shot (`torch.ops.symm_mem.one_shot_all_reduce_copy_out`): each rank copies its partial into its slot of a buffer
that every GPU of the group maps (torch.distributed._symmetric_memory), the ranks meet at a barrier of signal pads,
and each rank reads every peer's slot over NVLink and sums them — one hop of latency where NCCL's ring takes
2 (N - 1) steps, which is what decode-sized messages (a [rows, 4096] bf16 partial: 8 KB a row) pay for. Whether
every rank ends with the same bits (NCCL's all-reduce gives them; the replicated KV cache relies on it) is checked on
two GPUs by tests/dist/test_allreduce.py. Larger messages and every other case go to NCCL (gloo on the CPU).

Chosen by `V4SERVE_ALLREDUCE`: `nccl` (the default until a run on two or more GPUs times both:
`benchmarks/allreduce.py`), `symm` (one-shot up to `MAX_ONE_SHOT_BYTES`, NCCL above), read when the first reducer of a
group is made. The buffers are allocated at the first all-reduce of each dtype (every rank makes the same calls in the
same order: the model's forward), so before the decode graphs are captured (their warm-up forwards run first); the
captured graph then holds the one-shot kernel on those buffers.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger("v4serve.dist")

NCCL, SYMM = "nccl", "symm"
MAX_ONE_SHOT_BYTES = 1 << 20  # one-shot up to 1 MB a rank (128 rows of bf16 4096): above it NCCL's bandwidth wins


def mode() -> str:
    m = os.environ.get("V4SERVE_ALLREDUCE", NCCL)
    if m not in (NCCL, SYMM):
        raise ValueError(f"V4SERVE_ALLREDUCE={m!r}: use {NCCL!r} or {SYMM!r}")
    return m


class OneShot:
    """The symmetric buffers of one process group (one per dtype, MAX_ONE_SHOT_BYTES each) and the one-shot call."""

    def __init__(self, group: Any) -> None:
        self.group = group or dist.group.WORLD
        self.name = self.group.group_name
        self.buffers: dict[torch.dtype, torch.Tensor] = {}

    def fits(self, x: torch.Tensor) -> bool:
        return x.is_cuda and x.is_contiguous() and x.numel() * x.element_size() <= MAX_ONE_SHOT_BYTES \
            and x.dtype in (torch.bfloat16, torch.float16, torch.float32)

    def _buffer(self, x: torch.Tensor) -> torch.Tensor:
        buf = self.buffers.get(x.dtype)
        if buf is None:
            from torch.distributed import _symmetric_memory as symm_mem

            buf = symm_mem.empty(MAX_ONE_SHOT_BYTES // x.element_size(), dtype=x.dtype, device=x.device)
            symm_mem.rendezvous(buf, self.name)  # collective: every rank of the group allocates here
            self.buffers[x.dtype] = buf
        return buf

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x summed over the ranks, as a new tensor (x's values are copied into the symmetric buffer first)."""
        buf = self._buffer(x)[:x.numel()].view(x.shape)
        return torch.ops.symm_mem.one_shot_all_reduce_copy_out(buf, x, "sum", self.name, torch.empty_like(x))


_one_shots: dict[str, OneShot] = {}


def all_reduce(x: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Sum of every rank's x over `group`: one-shot over symmetric memory where chosen and x fits (a new tensor),
    else torch.distributed's all-reduce (NCCL / gloo) in place. Use the returned tensor."""
    if mode() == SYMM and x.is_cuda:
        g = group or dist.group.WORLD
        one = _one_shots.get(g.group_name)
        if one is None:
            one = _one_shots[g.group_name] = OneShot(g)
            log.info("all-reduce: one-shot over symmetric memory up to %d bytes (group %s)", MAX_ONE_SHOT_BYTES,
                     g.group_name)
        if one.fits(x):
            return one(x)
    dist.all_reduce(x, group=group)
    return x
