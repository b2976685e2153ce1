"""The tensor-parallel all-reduce: NCCL, or a one-shot all-reduce over symmetric memory for decode-sized messages.

One-shot (`torch.ops.symm_mem.one_shot_all_reduce_copy_out`): each rank copies its partial into its slot of a buffer
that every GPU of the group maps (torch.distributed._symmetric_memory), the ranks meet at a barrier of signal pads,
and each rank reads every peer's slot over NVLink and sums them — one hop of latency where NCCL's ring takes
2 (N - 1) steps, which is what decode-sized messages (a [rows, 4096] bf16 partial: 8 KB a row) pay for. Whether
every rank ends with the same bits (NCCL's all-reduce gives them; the replicated KV cache relies on it) is checked on
two GPUs by tests/dist/test_allreduce.py. Larger messages and every other case go to NCCL (gloo on the CPU).

Fused (`fused`): the sums that an mHC expansion consumes (attention's `wo_b`, the MoE; the call sites pass
`defer=True`) are not reduced here at all: each rank copies its partial into one of two symmetric buffers (used in
turn), the ranks meet at a barrier, and the expansion's kernel reads every rank's partial as it loads its input
(ops/peer_sum.py `PartialSum`, ops/kernels/mhc.py `_load_f`). Why two buffers: a rank writes buffer k again two sums
later, after the barrier of the sum in between, which every peer reaches only after its expansion of the first sum
has read buffer k. (Across steps the order of the buffers restarts, in a CUDA graph's replay too; the head's
all-gather at each step's end is the barrier that keeps a step's first copies after the last reads of the step
before.) Other sums (the embedding's, Engram's) and anything that does not fit go the `symm` way.

Chosen by `V4SERVE_ALLREDUCE`: `nccl` (the default until a run on two or more GPUs times them:
`benchmarks/allreduce.py`), `symm` (one-shot up to `MAX_ONE_SHOT_BYTES`, NCCL above) or `fused`, read at each call.
The buffers are allocated at the first all-reduce of each dtype (every rank makes the same calls in the same order:
the model's forward), so before the decode graphs are captured (their warm-up forwards run first); the captured graph
then holds the one-shot kernel (or the copy and barrier) on those buffers.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
import torch.distributed as dist

from ..ops.peer_sum import PartialSum

log = logging.getLogger("v4serve.dist")

NCCL, SYMM, FUSED = "nccl", "symm", "fused"
MAX_ONE_SHOT_BYTES = 1 << 20  # one-shot up to 1 MB a rank (128 rows of bf16 4096): above it NCCL's bandwidth wins


def mode() -> str:
    m = os.environ.get("V4SERVE_ALLREDUCE", NCCL)
    if m not in (NCCL, SYMM, FUSED):
        raise ValueError(f"V4SERVE_ALLREDUCE={m!r}: use {NCCL!r}, {SYMM!r} or {FUSED!r}")
    return m


# symmetric buffers, MAX_ONE_SHOT_BYTES each, by (group name, dtype, use): the one-shot's, and the two the fused
# sums take in turn; each with its rendezvous handle and the device table of the ranks' addresses (made once: a step
# never copies it from the host)
_buffers: dict[tuple[str, torch.dtype, str], tuple[torch.Tensor, Any, torch.Tensor]] = {}
_turns: dict[tuple[str, torch.dtype], int] = {}  # fused: the buffer (0 / 1) the next sum of that dtype takes


def _symmetric(group: str, x: torch.Tensor, use: str) -> tuple[torch.Tensor, Any, torch.Tensor]:
    key = (group, x.dtype, use)
    if key not in _buffers:
        from torch.distributed import _symmetric_memory as symm_mem

        buf = symm_mem.empty(MAX_ONE_SHOT_BYTES // x.element_size(), dtype=x.dtype, device=x.device)
        handle = symm_mem.rendezvous(buf, group)  # collective: every rank of the group allocates here
        table = torch.tensor(list(handle.buffer_ptrs), dtype=torch.int64, device=x.device)
        _buffers[key] = (buf, handle, table)
        log.info("all-reduce: a symmetric buffer of %d bytes for %s sums (%s, group %s)", MAX_ONE_SHOT_BYTES, use,
                 x.dtype, group)
    return _buffers[key]


def _one_shot(x: torch.Tensor, group: str) -> torch.Tensor:
    """x summed over the ranks, as a new tensor (x's values are copied into the symmetric buffer first)."""
    buf = _symmetric(group, x, "one-shot")[0][:x.numel()].view(x.shape)
    return torch.ops.symm_mem.one_shot_all_reduce_copy_out(buf, x, "sum", group, torch.empty_like(x))


def _stage(x: torch.Tensor, group: str, out_dtype: torch.dtype) -> PartialSum:
    """Fused: x's values into this turn's buffer, the ranks' barrier, and the sum left to its consumer."""
    k = _turns.get((group, x.dtype), 0)
    _turns[(group, x.dtype)] = 1 - k
    buf, handle, table = _symmetric(group, x, f"fused-{k}")
    buf[:x.numel()].view(x.shape).copy_(x)
    handle.barrier(channel=k)
    parts = [handle.get_buffer(r, tuple(x.shape), x.dtype, 0) for r in range(handle.world_size)]
    return PartialSum(parts, out_dtype, table)


def forget() -> None:
    """Drop the symmetric buffers (the process group is being destroyed; a later group may reuse its name)."""
    _buffers.clear()
    _turns.clear()


def all_reduce(x: torch.Tensor, group: Any = None, defer: bool = False,
               out_dtype: torch.dtype | None = None) -> torch.Tensor | PartialSum:
    """Sum of every rank's x over `group`, cast to `out_dtype` when given. `defer` (the sums an mHC expansion
    consumes) under `fused`: a PartialSum for that consumer to finish. Otherwise one-shot over symmetric memory where
    chosen and x fits (a new tensor), else torch.distributed's all-reduce (NCCL / gloo) in place. Use the result."""
    m = mode()
    if m != NCCL and x.is_cuda and x.is_contiguous() and x.numel() * x.element_size() <= MAX_ONE_SHOT_BYTES \
            and x.dtype in (torch.bfloat16, torch.float16, torch.float32):
        name = (group or dist.group.WORLD).group_name
        if m == FUSED and defer and x.dim() == 2:
            return _stage(x, name, out_dtype or x.dtype)
        y = _one_shot(x, name)
    else:
        dist.all_reduce(x, group=group)
        y = x
    return y if out_dtype is None else y.to(out_dtype)
