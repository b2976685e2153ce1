"""Which body the op-family entry points run: the plain-torch reference or the Triton kernels.

The engine chooses once (`EngineConfig.kernels`: auto = Triton on CUDA, the reference elsewhere) and builds the model
under `use(...)`; every module that dispatches (Linear, the experts, the router) records `current()` when it is
constructed and hands it to its entry point on each call. Model code never branches on it. Tests force either body
(`use("triton")` on the CPU runs the kernels under Triton's interpreter).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from contextvars import ContextVar

import torch

from .env import get as env_get
from .env import interpreting

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
    if requested == TRITON and not on_cuda and not interpreting():
        raise ValueError("--kernels triton needs a CUDA device (or TRITON_INTERPRET=1 to run the kernels in Triton's "
                         "CPU interpreter, slowly); use --kernels auto or reference on the CPU")
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


# Fusions of neighbouring launches, by name: V4SERVE_FUSIONS=name[,name...] ("all": every one, "none": none); unset,
# the ones that the bisect found not to slow the graphed step (DEFAULT_FUSIONS). Each gives the values of the launches
# it replaces (tests/ops, tests/models/test_fusions.py); only the launches differ. The graph replay of the V4 step at
# batch 1 (H200, `gpu_session.sh bisect`, benchmarks/RESULTS.md, tenth session), 9.82 ms with none: norm_quant 9.80,
# head_weight_round 9.81, gemv_quant_out 9.88, early_window 10.05 (the GEMM launches after the KV finish lose ~6 us a
# layer, more than the window store's launch saves), all 10.07.
# moe_combine (the routed experts' combine run by the down kernel's last program of each column tile, one launch
# fewer a layer). The V4 step's graph replay (H200, fourteenth session, `profile_step.py v4-flash-e16 --env-variant`,
# two interleaved rounds): batch 1 8.59 / 8.58 -> 8.43 / 8.41 ms, but batch 4 12.31 / 12.36 -> 12.45 / 12.45, batch 8
# 13.41 / 13.39 -> 13.51 / 13.53 and batch 32 17.04 / 17.17 -> 17.60 / 17.48 (the tiles' last programs then sum many
# rows serially). Its GPU check passed (thirty-fourth session: the tiny models' graph = eager with it on), but with one
# token's MoE launching nothing before its gate-up (kernels/moe.py DIRECT) it lengthens the V4.1 step at batch 1 / 64K
# (H100, replay 9.92 -> 10.26 ms: the down launch waits for the side stream's shared expert, joined before it): off.
FUSIONS = ("norm_quant", "gemv_quant_out", "early_window", "head_weight_round", "moe_combine")
DEFAULT_FUSIONS = ("norm_quant", "head_weight_round")
SMALL_STEP_FUSIONS: dict[str, int] = {}  # fusion -> on by default (V4SERVE_FUSIONS unset) up to this many tokens
FUSIONS_ENV = "V4SERVE_FUSIONS"


def fused(name: str, tokens: int | None = None) -> bool:
    """Whether fusion `name` (FUSIONS) is on: V4SERVE_FUSIONS names it (or says "all"); unset, DEFAULT_FUSIONS, and
    the SMALL_STEP_FUSIONS for a call over at most their number of `tokens` (when the caller says how many)."""
    limit = SMALL_STEP_FUSIONS.get(name)
    if limit is not None and tokens is not None and tokens <= limit and env_get(FUSIONS_ENV) is None:
        return True
    return switched_on(name, FUSIONS_ENV, FUSIONS, "fusion", DEFAULT_FUSIONS)


def switched_on(name: str, env: str, known: tuple[str, ...], kind: str, default: tuple[str, ...] = ()) -> bool:
    """Whether `name` (one of `known`) is on in the named switches of environment variable `env`: a comma-separated
    list of names, "all" or "none"; unset, `default` (V4SERVE_FUSIONS here, V4SERVE_OVERLAP in ops/streams.py)."""
    if name not in known:
        raise ValueError(f"unknown {kind} {name!r}; expected one of {known}")
    return name in _names_on(env, env_get(env), known, kind, default)


@functools.lru_cache(maxsize=32)
def _names_on(env: str, value: str | None, known: tuple[str, ...], kind: str,
              default: tuple[str, ...]) -> frozenset[str]:
    """The names a switch variable's value turns on (parsed once per value: the layers ask on every eager step)."""
    if value is None:
        return frozenset(default)
    names = frozenset(v.strip() for v in value.split(",") if v.strip())
    unknown = names - set(known) - {"all", "none"}
    if unknown:
        raise ValueError(f"{env} names unknown {kind}s {sorted(unknown)}; expected any of {known}, all or none")
    return frozenset(known) if "all" in names else names - {"none"}
