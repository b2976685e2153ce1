"""Walsh-Hadamard rotation (Sylvester order, scaled by n^-1/2), used by the V4 indexer before FP4."""

from __future__ import annotations

from functools import lru_cache

import torch

from .precision import acc_dtype


@lru_cache(maxsize=16)
def hadamard_matrix(n: int, device: torch.device = torch.device("cpu"),
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    if n & (n - 1):
        raise ValueError(f"Hadamard size must be a power of two, got {n}")
    h = torch.ones(1, 1, dtype=dtype)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h * n**-0.5).to(device)


def hadamard_rotate(x: torch.Tensor) -> torch.Tensor:
    """x @ H over the last dim in the accumulation dtype (float32; float64 for float64 x), returned in x's dtype."""
    acc = acc_dtype(x)
    h = hadamard_matrix(x.shape[-1], x.device, acc)
    return (x.to(acc) @ h).to(x.dtype)  # symmetric, so x @ H == H x per row
