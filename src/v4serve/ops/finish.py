"""Finishing rows for the cache: RMS norm, RoPE, Hadamard rotation, the format's quant-dequant, the store.

Every row the model caches, and the indexer's queries, pass through the same chain: the window KV row
(norm, RoPE, the window format), a pooled compressed entry (norm, RoPE at the group's position, the entry format,
stored in its paged row), a V4 index key (norm, RoPE, Hadamard, FP4, stored), an index query (RoPE, Hadamard, FP4).
`finish_rows` runs any subset of the chain, in that order, in one call: the reference composes the plain-torch ops;
the Triton body (ops/kernels/finish.py) does it in one launch, writing the stored record directly.

The simulation formats are those of `models/v4/attention.py` `simulate` and the index-key formats:
`v4_fp8` (FP8 e4m3 per 64 on the nope dims, the rope dims rounded to bf16), `fp8_b32` (FP8 per 32),
`nvfp4` (FP4 e2m1 with an e4m3 scale per 16), `mxfp4` (FP4 e2m1 with a ue8m0 scale per 32).
"""

from __future__ import annotations

from typing import Any

import torch

from . import quant
from .backend import REFERENCE, TRITON
from .hadamard import hadamard_rotate
from .norm import rms_norm
from .rope import apply_rope

FORMATS = ("v4_fp8", "fp8_b32", "nvfp4", "mxfp4")


def simulate(x: torch.Tensor, fmt: str | None, rope_dim: int = 0) -> torch.Tensor:
    """The reference's quant-dequant of a cached row (None: unchanged)."""
    if fmt is None:
        return x
    if fmt == "v4_fp8":
        # the rope dims stay BF16 (the reference's KV dtype, and what the 584-B record stores)
        nope = x.shape[-1] - rope_dim
        rope = x[..., nope:].to(torch.bfloat16).to(x.dtype)
        return torch.cat([quant.fp8_simulate(x[..., :nope], 64), rope], dim=-1)
    if fmt == "fp8_b32":
        return quant.fp8_simulate(x, 32)
    if fmt == "nvfp4":
        return quant.fp4_simulate(x, 16, "e4m3")
    if fmt == "mxfp4":
        return quant.fp4_simulate(x, 32)
    raise ValueError(f"unknown simulation format {fmt!r}; expected one of {FORMATS}")


def finish_rows_reference(x: torch.Tensor, norm: torch.Tensor | None, eps: float, cos: torch.Tensor | None,
                          sin: torch.Tensor | None, rotate: bool, fmt: str | None, rope_dim: int,
                          pool: Any = None, rows: torch.Tensor | None = None) -> torch.Tensor:
    if norm is not None:
        x = rms_norm(x, norm, eps)
    if cos is not None:
        if x.dim() == 3:
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        x = apply_rope(x, cos, sin)
    if rotate:
        x = hadamard_rotate(x)
    x = simulate(x, fmt, rope_dim)
    if pool is not None:
        pool.write(rows, x)
    return x


def finish_rows(x: torch.Tensor, norm: torch.Tensor | None, eps: float, cos: torch.Tensor | None,
                sin: torch.Tensor | None, rotate: bool, fmt: str | None, rope_dim: int,
                pool: Any = None, rows: torch.Tensor | None = None, backend: str = REFERENCE) -> torch.Tensor:
    """x [N, D] or [N, H, D] -> finished rows, same shape and dtype; optionally stored at `rows` [N] of `pool`.

    norm: RMS-norm weight [D] (None: no norm); cos/sin [N, rope/2] float32 (None: no RoPE) rotate the last
    2 * cos.shape[-1] dims in interleaved pairs; rotate: the Walsh-Hadamard rotation over D; fmt: the quant-dequant
    (FORMATS, None: none; `rope_dim` tells v4_fp8 which dims stay bf16). pool (a cache.pool.RowPool: .data, .codec,
    .write) with rows stores the finished rows in the pool's record format (only for x [N, D]).
    """
    if backend == TRITON:
        from .kernels import finish as kernel

        if kernel.supports(x, fmt, pool, rotate):
            return kernel.finish_rows(x, norm, eps, cos, sin, rotate, fmt, rope_dim, pool, rows)
        if cos is None and not rotate and fmt is None and pool is None:  # a norm only, of wider rows
            from .kernels import norm as norm_kernel

            if norm_kernel.supports(x):
                return norm_kernel.rms_norm(x, norm, eps) if norm is not None else x
    return finish_rows_reference(x, norm, eps, cos, sin, rotate, fmt, rope_dim, pool, rows)
