"""Human-readable sizes on the command line, parsed one way everywhere.

* bytes (`--kv-cache-memory`, `--kv-cache-memory-bytes`, `--max-request-bytes`): 8GiB, 8G, 512MiB, 64k, 1000000;
  k/m/g/t are binary (1024-based) with or without "iB"/"B", as memory sizes are.
* token counts (`--max-model-len`, as vLLM takes it): 131072, 128k = 128,000, 128K = 131,072; lowercase k/m/g are
  decimal and uppercase binary.
"""

from __future__ import annotations

import argparse

_BINARY = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_bytes(text: str) -> int:
    """"32MiB", "8G", "64k", "1000000" -> a positive number of bytes."""
    t = str(text).strip().lower().removesuffix("ib").removesuffix("b")
    try:
        value = int(float(t[:-1]) * _BINARY[t[-1]]) if t and t[-1] in _BINARY else int(float(t))
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"not a byte size: {text!r} (examples: 8GiB, 512MiB, 64k, 1000000)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def parse_tokens(text: str) -> int:
    """"131072", "128k" (128,000), "128K" (131,072), "1m", "1M" -> a positive token count."""
    t = str(text).strip()
    units = {"k": 1000, "m": 1000**2, "g": 1000**3, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    try:
        value = int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"not a token count: {text!r} (examples: 131072, 128k, 128K)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value
