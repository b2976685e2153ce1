"""Token log-probabilities in the two OpenAI shapes.

The engine sends, per generated token, a dict {token id: logprob} holding the chosen token and the
requested number of most likely alternatives (engine/runner.py). Chat completions want
`logprobs.content = [{token, logprob, bytes, top_logprobs: [...]}]`; completions want the legacy
`{tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..tokenizer import Tokenizer


class TokenText:
    """Token id -> text as the API shows it (a token may be part of a UTF-8 character), cached."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token_id: int) -> tuple[str, list[int]]:
        hit = self._cache.get(token_id)
        if hit is None:
            try:
                raw = self.tokenizer.token_bytes(token_id)
            except Exception:  # noqa: BLE001 - not a byte-level vocabulary: fall back to decode
                raw = self.tokenizer.decode([token_id]).encode()
            hit = (raw.decode("utf-8", errors="replace"), list(raw))
            if len(self._cache) < 200_000:
                self._cache[token_id] = hit
        return hit


def _top(entry: dict[int, float], k: int) -> list[tuple[int, float]]:
    return sorted(entry.items(), key=lambda kv: -kv[1])[:k]


def chat_logprobs(text_of: TokenText, token_ids: Sequence[int], entries: Sequence[dict[int, float] | None],
                  top_k: int) -> list[dict[str, Any]]:
    """`choices[i].logprobs.content` entries for these tokens."""
    out = []
    for tid, entry in zip(token_ids, entries):
        if entry is None:
            continue
        text, raw = text_of(tid)
        out.append({
            "token": text, "logprob": max(entry.get(tid, -9999.0), -9999.0), "bytes": raw,
            "top_logprobs": [{"token": text_of(t)[0], "logprob": max(lp, -9999.0), "bytes": text_of(t)[1]}
                             for t, lp in _top(entry, top_k)],
        })
    return out


class CompletionLogprobs:
    """Accumulates the legacy completions shape; `text_offset` counts characters of the choice's text."""

    def __init__(self, text_of: TokenText, top_k: int, offset: int = 0) -> None:
        self.text_of, self.top_k, self.offset = text_of, top_k, offset
        self.tokens: list[str] = []
        self.token_logprobs: list[float] = []
        self.top_logprobs: list[dict[str, float]] = []
        self.text_offset: list[int] = []

    def add(self, token_ids: Sequence[int], entries: Sequence[dict[int, float] | None]) -> dict[str, Any]:
        """Record tokens; returns just their part (for a stream chunk)."""
        part: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for tid, entry in zip(token_ids, entries):
            if entry is None:
                continue
            text = self.text_of(tid)[0]
            top = {self.text_of(t)[0]: max(lp, -9999.0) for t, lp in _top(entry, self.top_k)}
            values = (text, max(entry.get(tid, -9999.0), -9999.0), top, self.offset)
            for key, value in zip(part, values):
                part[key].append(value)
            self.offset += len(text)
        self.tokens += part["tokens"]
        self.token_logprobs += part["token_logprobs"]
        self.top_logprobs += part["top_logprobs"]
        self.text_offset += part["text_offset"]
        return part

    def result(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "token_logprobs": self.token_logprobs, "top_logprobs": self.top_logprobs,
                "text_offset": self.text_offset}
