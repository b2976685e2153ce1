"""Which body the op-family entry points run: the plain-torch reference or the Triton kernels.

The engine chooses once (`EngineConfig.kernels`: auto = Triton on CUDA, the reference elsewhere) and builds the model
under `use(...)`; every module that dispatches (Linear, the experts, the router) records `current()` when it is
constructed and hands it to its entry point on each call. Model code never branches on it. Tests force either body
(`use("triton")` on the CPU runs the kernels under Triton's interpreter).
"""

from __future__ import annotations

import contextlib
import functools
import os
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
    on_cuda = torch.device(device).type == "cuda"
    if requested == "auto":
        return TRITON if on_cuda else REFERENCE
    if requested == TRITON and not on_cuda and not _interpreting():
        raise ValueError("--kernels triton needs a CUDA device (or TRITON_INTERPRET=1 to run the kernels in Triton's "
                         "CPU interpreter, slowly); use --kernels auto or reference on the CPU")
    return requested


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


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


# Fusions of neighbouring launches, opt-in by name until each is shown not to slow the graphed step: V4SERVE_FUSIONS=
# name[,name...] ("all": every one). Each gives the values of the launches it replaces (tests/ops, tests/models/
# test_fusions.py); only the launches differ. All together they took the V4 step from 1,255 to 1,092 launches but its
# graph replay from 9.84-9.87 to 10.08-10.12 ms (H200, benchmarks/RESULTS.md, ninth session): off by default until
# `gpu_session.sh bisect` finds which of them cost time.
FUSIONS = ("norm_quant", "gemv_quant_out", "early_window", "head_weight_round")
FUSIONS_ENV = "V4SERVE_FUSIONS"


def fused(name: str) -> bool:
    """Whether fusion `name` (FUSIONS) is on: V4SERVE_FUSIONS names it (or says "all")."""
    if name not in FUSIONS:
        raise ValueError(f"unknown fusion {name!r}; expected one of {FUSIONS}")
    on = _fusions_on(os.environ.get(FUSIONS_ENV, ""))
    return name in on or "all" in on


@functools.lru_cache(maxsize=16)
def _fusions_on(value: str) -> frozenset[str]:
    """The names in a V4SERVE_FUSIONS value (parsed once per value: the layers ask on every eager step)."""
    on = frozenset(v.strip() for v in value.split(",") if v.strip())
    unknown = on - set(FUSIONS) - {"all"}
    if unknown:
        raise ValueError(f"{FUSIONS_ENV} names unknown fusions {sorted(unknown)}; expected any of {FUSIONS} or all")
    return on
