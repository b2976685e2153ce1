"""Triton kernels of the op families (each beside its plain-torch reference in ops/<family>.py)."""

import os

from ..env import interpreting  # noqa: F401 - re-exported: kernels pass it as a constexpr (see below)


def cdiv(x: int, y: int) -> int:
    """`triton.cdiv` for host code: Triton's is a constexpr function whose call from Python costs ~2.7 us (its
    dispatch), and an eager V4 step made ~2,000 such calls (eighteenth session's host profile: ~17 ms of 120)."""
    return (x + y - 1) // y


def next_pow2(n: int) -> int:
    """`triton.next_power_of_2` for host code (the same bit smearing: 0 -> 0, 1 -> 1, 5 -> 8)."""
    n -= 1
    n |= n >> 1
    n |= n >> 2
    n |= n >> 4
    n |= n >> 8
    n |= n >> 16
    n |= n >> 32
    return n + 1


# `interpreting()` (ops/env.py): under Triton's CPU interpreter its bf16 `tl.dot` multiplies the raw uint16 bit
# patterns (triton 3.6), so kernels take it as a constexpr and run bf16 dots through fp32 there.


# Integer arguments whose values change with a step's composition: token, row, group, pick, column and block counts,
# and the block table's width. Triton compiles a variant of a kernel for each class (== 1, divisible by 16, neither)
# of each integer argument, so a server meets new combinations of these (and compiles, stalling every running request
# for seconds) long after its warm-up: 18 launched kernels saw 2-3 classes of up to 5 such arguments each in a short
# mixed workload on the CPU (fifteenth session). None of them addresses vectorised memory (they bound masks and loops,
# or index gathers of single elements), so compiling them as plain integers costs at most a compare where the class
# made a mask constant. They compile so by default (one variant for every step); V4SERVE_STEP_SPECIALIZE=1 restores
# Triton's specialisation. H200, seventeenth session: the graphed v4-flash-e16 replay 8.58 -> 8.61 ms at batch 1 and
# 17.05 -> 17.17 ms at batch 32 (gpu_session.sh spec_ab), while the AgentX-style run (agentx15, with the step's other
# size-keyed compile keys removed) compiled in 1 step while serving against 28 specialised (TTFT p90 at 4 sessions
# 0.16 s against 6.65 s).
STEP_ARGS = ("T", "M", "R", "L", "NT", "n_picks", "n_cols", "n_groups", "n_pairs", "G", "bt_cols", "bt_stride",
             "stride_btr", "NB", "n_blocks")


def specialize_step_args() -> bool:
    return os.environ.get("V4SERVE_STEP_SPECIALIZE", "0") not in ("0", "")


def step_jit(fn):
    """`triton.jit` for a launched kernel: its runtime STEP_ARGS unspecialised unless specialize_step_args(). A kernel
    may take one of these names as a constexpr (the compressor's ratio M, the prologue's group G): compile-time by
    design, and Triton's GPU compiler rejects a constexpr listed in do_not_specialize (its interpreter never looks),
    so the names come from Triton's own reading of the parameters."""
    import triton
    from triton.runtime.jit import JITFunction

    if specialize_step_args():
        return triton.jit(fn)
    params = JITFunction(fn).params  # (triton.jit gives an InterpretedFunction, without them, under the interpreter)
    return triton.jit(fn, do_not_specialize=[p.name for p in params if p.name in STEP_ARGS and not p.is_constexpr])
