"""Incremental detokenization: token ids in, text deltas out, one request at a time.

DeepSeek-V4 uses byte-level BPE, so a token is a byte string and one UTF-8 character (CJK, emoji)
can be split across tokens. Rather than re-decoding a window of ids each step (the prefix/read
offset scheme), we keep the exact state a byte-level decoder needs: the bytes of an unfinished
UTF-8 sequence (at most 3), inside Python's incremental UTF-8 decoder. Each step therefore costs
O(new tokens), never emits U+FFFD for a character that is merely incomplete, and emits U+FFFD for
bytes that can never form a character exactly where `Tokenizer.decode` would (same replacement
rule: one U+FFFD per maximal invalid subsequence).

Invariant (tested): "".join(deltas) + finish() == tokenizer.decode(all_ids, skip_special_tokens).
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable

from v4serve.tokenizer import Tokenizer


class IncrementalDetokenizer:
    """Turns one request's generated token ids into streamed text.

    `step(ids)` returns the text completed by those ids; `finish()` flushes bytes left over from
    an incomplete character at the end of generation (as U+FFFD, like a full decode would).
    `skip_special_tokens` drops the tokenizer's special ids (BOS/EOS/pad/placeholders); added
    non-special tokens such as `<think>` are always kept.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._skip = tokenizer.special_ids if skip_special_tokens else frozenset()
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.num_tokens = 0  # ids consumed so far, skipped ones included
        self.num_chars = 0  # characters emitted so far
        self.finished = False

    def step(self, new_ids: Iterable[int]) -> str:
        """Consume newly generated ids; return the newly completed text (possibly "")."""
        if self.finished:
            raise RuntimeError("IncrementalDetokenizer.step called after finish()")
        token_bytes = self.tokenizer.token_bytes
        chunks: list[bytes] = []
        for token_id in new_ids:
            self.num_tokens += 1
            if token_id not in self._skip:
                chunks.append(token_bytes(token_id))
        delta = self._utf8.decode(b"".join(chunks)) if chunks else ""
        self.num_chars += len(delta)
        return delta

    def finish(self) -> str:
        """End of generation: return the replacement for a dangling partial character, or ""."""
        if self.finished:
            return ""
        self.finished = True
        tail = self._utf8.decode(b"", final=True)
        self.num_chars += len(tail)
        return tail

    @property
    def pending_bytes(self) -> int:
        """Bytes of an incomplete UTF-8 character held back from the text so far."""
        return len(self._utf8.getstate()[0])


def detokenize_stream(
    tokenizer: Tokenizer, steps: Iterable[Iterable[int]], skip_special_tokens: bool = True
) -> list[str]:
    """Deltas for a whole sequence of steps, the final flush appended; handy for tests and tools."""
    detok = IncrementalDetokenizer(tokenizer, skip_special_tokens)
    deltas = [detok.step(ids) for ids in steps]
    deltas.append(detok.finish())
    return deltas
