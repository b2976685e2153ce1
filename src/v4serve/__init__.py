"""v4serve: a serving engine for the DeepSeek-V4 model family, built for agentic traffic.

`LLM`, `SamplingParams` and the output types are imported lazily, so processes that only need a small part of the
package (the API server) do not import torch at start-up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "__version__"]

_LAZY = {
    "LLM": ("v4serve.engine.llm", "LLM"),
    "SamplingParams": ("v4serve.engine.sampling_params", "SamplingParams"),
    "RequestOutput": ("v4serve.engine.request", "RequestOutput"),
    "CompletionOutput": ("v4serve.engine.request", "CompletionOutput"),
}

if TYPE_CHECKING:
    from .engine.llm import LLM
    from .engine.request import CompletionOutput, RequestOutput
    from .engine.sampling_params import SamplingParams


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'v4serve' has no attribute {name!r}")
