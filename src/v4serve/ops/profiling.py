"""Profiler ranges by op family, placed once at each family's entry point or model seam.

`family("linear")` opens a `torch.profiler.record_function` range named `v4serve.linear` while a step profile is
being taken (`benchmarks/profile_step.py` calls `enable()`), and costs nothing otherwise: decode runs from CUDA
graphs, but eager prefill passes through these thousands of times per step. A kernel belongs to the innermost range
around its launch, so an attention range that contains projections leaves those to `linear`.
"""

from __future__ import annotations

import contextlib
import functools

import torch

FAMILIES = ("linear", "moe", "router", "attention", "indexer", "compressor", "mhc", "norm/rope/quant", "sampling",
            "other")

_enabled = False
_null = contextlib.nullcontext()


def enable(on: bool = True) -> None:
    global _enabled
    _enabled = on


def enabled() -> bool:
    return _enabled


def family(name: str):
    """A context manager: the profiler range of op family `name` (one of FAMILIES)."""
    if not _enabled:
        return _null
    return torch.profiler.record_function(f"v4serve.{name}")


def profiled(name: str):
    """Decorator: the whole function is a `family(name)` range (for small ops called from many places)."""
    def wrap(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            if not _enabled:
                return fn(*args, **kwargs)
            with torch.profiler.record_function(f"v4serve.{name}"):
                return fn(*args, **kwargs)
        return inner
    return wrap
