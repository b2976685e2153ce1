"""Programmatic dependent launch (Hopper): each decode kernel's launch overlaps the tail of the kernel before it.

A decode step is ~2,500 short kernels replayed from a CUDA graph, and each paid its launch and ramp-up after the one
before had fully drained (about 2 us a kernel on the H200: the graphed 43-layer step took 19.7 ms for 14.9 ms of
kernel time). A kernel launched with the programmatic-stream-serialization attribute may start while its predecessor
still runs; it must not touch memory its predecessor reads or writes until `griddepcontrol.wait`, which returns once
the predecessor has completed and its writes are visible. Every kernel here therefore calls `enter` first thing: the
wait, then `launch_dependents` so that the next kernel's launch can begin in turn. Nothing before the wait reads or
writes global memory, so the order of effects is exactly the stream order; only launch latency overlaps. A kernel
that follows a non-PDL one (a torch op) waits for it to complete, as without PDL.

The decode GEMVs go one step further (`V4SERVE_PDL=2`, being measured): before the wait, each program asks the L2 to
prefetch its own weight rows (`cp.async.bulk.prefetch.L2`: weights are never written by a predecessor), so the weight
stream starts while the kernel before still runs.

A kernel named in `V4SERVE_PDL_EARLY` (comma-separated; `early`) lets its successor launch *before* its own wait:
still nothing touches memory before a wait, and the successor's wait returns only once this kernel has completed,
which is after this kernel's own wait; but the successor's CTAs are resident while this kernel's predecessor still
runs. For the MoE's sort launch (`moe_prologue`): the gate-up is then in place when the router completes, ahead of
the side stream's shared expert, which was released at the same moment and otherwise took the SMs first (the
batch-32 V4.1 trace: router, sort, the shared expert's gate-up GEMV 50 us exposed, then the routed gate-up).

Off under Triton's interpreter (the instructions are PTX) and before Hopper; `V4SERVE_PDL=0` turns it off (A/B runs).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ..env import get as env_get
from . import interpreting

ENV = "V4SERVE_PDL"
EARLY_ENV = "V4SERVE_PDL_EARLY"


@triton.jit
def enter(PDL: tl.constexpr, EARLY: tl.constexpr = False):
    """The first statement of every kernel: wait for the predecessor, then let the successor launch (EARLY: the other
    way round, `early`)."""
    if PDL:
        if EARLY:
            gdc_launch_dependents()
            gdc_wait()
        else:
            gdc_wait()
            gdc_launch_dependents()


@triton.jit
def prefetch_rows(row_ptrs, nbytes, PREFETCH: tl.constexpr):
    """L2 prefetch of `nbytes` (a multiple of 16, 16-byte aligned rows) from each row start in row_ptrs [BN]."""
    if PREFETCH:
        tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0;", "=r,l,r",
                                  [row_ptrs.to(tl.int64, bitcast=True), nbytes], dtype=tl.int32, is_pure=False,
                                  pack=1)


@functools.lru_cache(maxsize=8)
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def enabled(t: torch.Tensor) -> bool:
    """Whether kernels over t's device launch with PDL."""
    if not t.is_cuda or interpreting() or env_get(ENV, "1") == "0":
        return False
    return _capable(t.device.index if t.device.index is not None else torch.cuda.current_device())


def launch(t: torch.Tensor) -> dict:
    """Keyword arguments of a kernel launch over t's device: the kernel's PDL constexpr and Triton's launch option."""
    return {"PDL": True, "launch_pdl": True} if enabled(t) else {"PDL": False}


def early(kernel: str) -> bool:
    """Whether `kernel` (a name the launch site gives) lets its successor launch before its own wait."""
    return kernel in (env_get(EARLY_ENV) or "").split(",")


def prefetch(t: torch.Tensor) -> bool:
    """Whether the decode GEMVs prefetch their weight rows into L2 before the wait (V4SERVE_PDL=2)."""
    return enabled(t) and env_get(ENV, "1") == "2"
