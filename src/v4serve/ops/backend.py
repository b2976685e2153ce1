"""Which body the op-family entry points run: the plain-torch reference or the Triton kernels.

The engine chooses once (`EngineConfig.kernels`: auto = Triton on CUDA, the reference elsewhere) and builds the model
under `use(...)`; every module that dispatches (Linear, the experts, the router) records `current()` when it is
constructed and hands it to its entry point on each call. Model code never branches on it. Tests force either body
(`use("triton")` on the CPU runs the kernels under Triton's interpreter).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

import torch

REFERENCE = "reference"
TRITON = "triton"
CHOICES = ("auto", REFERENCE, TRITON)

_current: ContextVar[str] = ContextVar("v4serve_kernels", default=REFERENCE)


def resolve(requested: str, device: torch.device | str) -> str:
    """'auto' -> Triton on CUDA, the reference elsewhere; an explicit choice is kept."""
    if requested not in CHOICES:
        raise ValueError(f"--kernels must be one of {', '.join(CHOICES)}, got {requested!r}")
    if requested == "auto":
        return TRITON if torch.device(device).type == "cuda" else REFERENCE
    return requested


def current() -> str:
    return _current.get()


@contextlib.contextmanager
def use(name: str) -> Iterator[None]:
    if name not in (REFERENCE, TRITON):
        raise ValueError(f"unknown kernel backend {name!r}")
    token = _current.set(name)
    try:
        yield
    finally:
        _current.reset(token)
