"""v4serve: a serving engine for the DeepSeek-V4 model family, built for agentic traffic."""

__version__ = "0.1.0"
