"""Shared pieces of the kernels that split one launch over many programs and finish in the last one to arrive
(router, mHC, attention, the decode GEMMs): the per-device arrival counters and the arrival itself (float scalars in
two float32 parts: ops/precision.hi_lo)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import triton
import triton.language as tl

from . import interpreting

FLOATS = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32,
             torch.float64: tl.float64}
N_COUNTERS = 16384  # token blocks of a split grid (64 KiB of int32 per kernel family and device)


_lane = 0  # 0: the main stream's launches; 1: a side stream's (ops/streams.Fork.run)


@contextlib.contextmanager
def side_lane() -> Iterator[None]:
    """Launches made inside take each kernel family's side-lane counters: a family's launch on a side stream may run
    beside one of the same family on the main stream, and their arrivals must not meet in one counter."""
    global _lane
    _lane += 1
    try:
        yield
    finally:
        _lane -= 1


def current_lane() -> int:
    return _lane


class ArrivalCounters:
    """One zeroed int32 buffer per device and lane (side_lane) for one kernel family; the kernels leave it zeroed after
    each launch, so it can be captured in CUDA graphs. The first call on a device and lane allocates it and must run
    eagerly (the graph runner's warm-up steps do); two launches of the same family on one lane must not run
    concurrently."""

    def __init__(self, size: int = N_COUNTERS) -> None:
        self._buffers: dict[tuple[int, int], torch.Tensor] = {}
        self.size = size

    def get(self, device: torch.device) -> torch.Tensor:
        if device.type != "cuda":
            return torch.zeros(self.size, dtype=torch.int32, device=device)  # interpreter: fresh each call
        key = (device.index if device.index is not None else torch.cuda.current_device(), _lane)
        buf = self._buffers.get(key)
        if buf is None:
            buf = self._buffers[key] = torch.zeros(self.size, dtype=torch.int32, device=device)
        return buf


@triton.jit
def last_to_arrive(counter_ptr, n):
    """After this program's partial stores: count its arrival at `counter_ptr` (acq_rel, gpu scope). True for the last
    of the `n` programs sharing the counter, which then sees every other program's stores; it re-zeroes the counter
    once done, for the next launch or graph replay."""
    tl.debug_barrier()  # every thread's stores precede the release
    return tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu") == n - 1


def runs_here(x: torch.Tensor) -> bool:
    """Whether the kernels take x: CUDA without float64 (fp64 exists only for the CPU interpreter), or the CPU under
    Triton's interpreter (TRITON_INTERPRET)."""
    if x.is_cuda:
        return x.dtype != torch.float64
    return x.device.type == "cpu" and interpreting()
