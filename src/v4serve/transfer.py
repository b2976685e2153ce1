"""Host -> device copies that do not stop the host: a synchronous copy waits for every kernel queued before it."""

from __future__ import annotations

import torch


def staged(host: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`host` ready for a non-blocking copy to `device`: on a GPU, in page-locked memory from torch's caching host
    allocator (which keeps the buffer until the copy ran); elsewhere as it is."""
    return host.pin_memory() if torch.device(device).type == "cuda" else host


def to_device(host: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`host` (a CPU tensor) on `device`, copied without blocking, in stream order."""
    return staged(host, device).to(device, non_blocking=True)
