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


class OneShot:
    """The symmetric buffers of one process group (one per dtype, MAX_ONE_SHOT_BYTES each) and the one-shot call."""

    def __init__(self, group: Any) -> None:
        self.group = group or dist.group.WORLD
        self.name = self.group.group_name
        self.buffers: dict[torch.dtype, torch.Tensor] = {}

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


class PeerBuffers:
    """The `fused` mode's two symmetric buffers per dtype (MAX_ONE_SHOT_BYTES each) of one process group, used in
    turn, with each one's table of the ranks' addresses on the device (made once: never copied during a step)."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.name = group.group_name
        self.buffers: dict[torch.dtype, list[tuple[torch.Tensor, Any, torch.Tensor]]] = {}
        self.turn: dict[torch.dtype, int] = {}

    def _pair(self, x: torch.Tensor) -> list[tuple[torch.Tensor, Any, torch.Tensor]]:
        pair = self.buffers.get(x.dtype)
        if pair is None:
            from torch.distributed import _symmetric_memory as symm_mem

            pair = []
            for _ in range(2):
                buf = symm_mem.empty(MAX_ONE_SHOT_BYTES // x.element_size(), dtype=x.dtype, device=x.device)
                handle = symm_mem.rendezvous(buf, self.name)  # collective: every rank allocates here
                table = torch.tensor(list(handle.buffer_ptrs), dtype=torch.int64, device=x.device)
                pair.append((buf, handle, table))
            self.buffers[x.dtype] = pair
            self.turn[x.dtype] = 0
        return pair

    def stage(self, x: torch.Tensor, out_dtype: torch.dtype) -> PartialSum:
        """x's values into this turn's buffer, the ranks' barrier, and the sum left to its consumer."""
        k = self.turn.get(x.dtype, 0)
        buf, handle, table = self._pair(x)[k]
        self.turn[x.dtype] = 1 - k
        buf[:x.numel()].view(x.shape).copy_(x)
        handle.barrier(channel=k)
        parts = [handle.get_buffer(r, tuple(x.shape), x.dtype, 0) for r in range(handle.world_size)]
        return PartialSum(parts, out_dtype, table)


_one_shots: dict[str, OneShot] = {}
_peer_buffers: dict[str, PeerBuffers] = {}


def forget() -> None:
    """Drop the symmetric buffers (the process group is being destroyed; a later group may reuse its name)."""
    _one_shots.clear()
    _peer_buffers.clear()


def all_reduce(x: torch.Tensor, group: Any = None, defer: bool = False,
               out_dtype: torch.dtype | None = None) -> torch.Tensor | PartialSum:
    """Sum of every rank's x over `group`, cast to `out_dtype` when given. `defer` (the sums an mHC expansion
    consumes) under `fused`: a PartialSum for that consumer to finish. Otherwise one-shot over symmetric memory where
    chosen and x fits (a new tensor), else torch.distributed's all-reduce (NCCL / gloo) in place. Use the result."""
    m = mode()
    fits = x.is_cuda and x.is_contiguous() and x.numel() * x.element_size() <= MAX_ONE_SHOT_BYTES \
        and x.dtype in (torch.bfloat16, torch.float16, torch.float32)
    if m != NCCL and fits:
        g = group or dist.group.WORLD
        if m == FUSED and defer and x.dim() == 2:
            peers = _peer_buffers.get(g.group_name)
            if peers is None:
                peers = _peer_buffers[g.group_name] = PeerBuffers(g)
                log.info("all-reduce: the mHC expansion sums the ranks' partials (symmetric memory, group %s)",
                         g.group_name)
            return peers.stage(x, out_dtype or x.dtype)
        one = _one_shots.get(g.group_name)
        if one is None:
            one = _one_shots[g.group_name] = OneShot(g)
            log.info("all-reduce: one-shot over symmetric memory up to %d bytes (group %s)", MAX_ONE_SHOT_BYTES,
                     g.group_name)
        y = one(x)
    else:
        dist.all_reduce(x, group=group)
        y = x
    return y if out_dtype is None else y.to(out_dtype)
