"""Side-stream overlap: work that does not depend on what the main stream computes runs on a second CUDA stream and
joins the main stream before its result is read, eagerly and inside CUDA graphs (the fork and the join become edges
of the captured graph, so a replay overlaps the two branches as the eager step does).

V4SERVE_OVERLAP=name[,name...], "all" or "none"; unset, DEFAULT_OVERLAPS (those a measurement says pay).
  shared_expert: the MoE's shared expert beside the routed experts' sort, gate-up and down; their combine, which adds
                 the shared output, waits for it (models/v4/moe.py).
  attention_query: the query projection `wq_b` (V4-Flash: a 32 MB weight) beside the window KV's finish, the
                 compressors and the indexer, which read only x and the query latent; the attention waits for it
                 (models/v4/attention.py, models/v41/attention.py). V4.1: off unless named until its GPU exactness
                 check has passed (H100, graph replay with all overlaps: batch 1 11.39 -> 11.31 ms, batch 32 28.01 ->
                 27.56; twenty-ninth session, where the check's V4.1 cases ran out of time).
  indexer_query: the indexer's query projection and finish (V4.1: and its head weights) beside the KV finish and the
                 compressors; the indexer's scoring waits for it. Forked before attention_query, so that on the side
                 stream it runs first. V4.1: off unless named, as attention_query.

Kernels that finish in their last program to arrive keep their arrival counters per lane (kernels/split_grid): a
launch on the side stream uses the side lane's, so one family may run on both streams at once (the side wq_b beside
the main stream's compressor projections, both fp8_gemv).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import torch

from .backend import switched_on
from .kernels.split_grid import side_lane

OVERLAPS = ("shared_expert", "attention_query", "indexer_query")
# on by default: the graph replay of the V4 step (v4-flash-e16, 2K context, H200, two interleaved runs each).
# shared_expert (`gpu_session.sh next2`, eleventh session): 9.81/9.82 -> 9.54/9.53 ms at batch 1, 20.19/20.20 ->
# 19.72/19.73 ms at batch 32. attention_query + indexer_query beside it (`fourteenth1`, thirteenth session, one process
# recapturing the graph per variant): 8.97/8.99 -> 8.60/8.59 ms at batch 1, 17.51/17.50 -> 17.10/17.18 ms at batch 32
# (attention_query alone: 9.00/9.02 at batch 1, no gain)
DEFAULT_OVERLAPS = ("shared_expert", "attention_query", "indexer_query")
OVERLAP_ENV = "V4SERVE_OVERLAP"
T = TypeVar("T")


def overlapped(name: str, default: bool | None = None) -> bool:
    """Whether overlap `name` (OVERLAPS) is on: V4SERVE_OVERLAP names it (or says "all"); unset, DEFAULT_OVERLAPS, or
    `default` where a call site gives one (a model whose GPU check of this overlap has not run yet: False)."""
    defaults = DEFAULT_OVERLAPS if default is None else (name,) if default else ()
    return switched_on(name, OVERLAP_ENV, OVERLAPS, "overlap", defaults)


class Fork:
    """A branch off the current stream: `run` puts work on the side stream (which first waits for everything queued
    so far), `join` makes the current stream wait for that work. Tensors made on the side and read on the main stream
    after `join` need no more: their memory is reused only by work ordered after the join."""

    def __init__(self, device: torch.device):
        self.main = torch.cuda.current_stream(device)
        self.side = _side_stream(device)
        self.side.wait_stream(self.main)

    def run(self, fn: Callable[[], T]) -> T:
        with torch.cuda.stream(self.side), side_lane():
            return fn()

    def join(self) -> None:
        self.main.wait_stream(self.side)


def fork(name: str, x: torch.Tensor, default: bool | None = None) -> Fork | None:
    """A Fork on x's device when overlap `name` is on (`default`: as `overlapped`'s) and x is on a GPU; else None
    (run inline)."""
    on = overlapped(name, default)  # (a name not in OVERLAPS is refused off the GPU too)
    return Fork(x.device) if x.is_cuda and on else None


def beside(name: str, x: torch.Tensor, fn: Callable[[], T], default: bool | None = None) -> Callable[[], T]:
    """fn run on the side stream when overlap `name` is on (else now, inline) -> a getter of its result that first
    makes the current stream wait for it. The caller keeps fn's inputs alive until it calls the getter. `default`:
    as `overlapped`'s."""
    side = fork(name, x, default)
    out = fn() if side is None else side.run(fn)
    if side is None:
        return lambda: out

    def joined() -> T:
        side.join()
        return out
    return joined


@functools.lru_cache(maxsize=None)
def _side_stream(device: torch.device) -> torch.cuda.Stream:
    """One side stream per device, made once (outside any capture) and shared by every fork."""
    return torch.cuda.Stream(device)
