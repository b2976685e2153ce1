"""Host -> device copies that do not stop the host: a synchronous copy waits for every kernel queued before it."""

from __future__ import annotations

import torch


def to_device(host: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`host` (a CPU tensor) on `device`. On a GPU: staged in page-locked memory from torch's caching host allocator
    (which keeps the buffer until the copy ran) and copied without blocking, in stream order."""
    device = torch.device(device)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
