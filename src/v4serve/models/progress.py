"""A progress bar while weights load (vLLM prints one per checkpoint; a 160 GB model takes minutes to read).

Counted in bytes of the stored tensors, on stderr; quiet for small models (under `MIN_BYTES`, e.g. the tiny presets in
tests) and when V4SERVE_NO_PROGRESS is set.
"""

from __future__ import annotations

import os
import sys

import torch
from tqdm import tqdm

MIN_BYTES = 1 << 30


def load_bar(total_bytes: int, desc: str) -> tqdm:
    quiet = total_bytes < MIN_BYTES or os.environ.get("V4SERVE_NO_PROGRESS", "") not in ("", "0")
    return tqdm(total=total_bytes, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr,
                disable=quiet, mininterval=1.0, dynamic_ncols=True)


def tensor_bytes(*tensors: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)
