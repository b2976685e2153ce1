"""v4serve: a serving engine for the DeepSeek-V4 model family, built for agentic traffic."""

from .engine.llm import LLM
from .engine.request import CompletionOutput, RequestOutput
from .engine.sampling_params import SamplingParams

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "__version__"]
