"""Incremental detokenizer: streamed deltas must add up to exactly what a full decode gives."""

from __future__ import annotations

import random

import pytest

from v4serve.engine.detokenizer import IncrementalDetokenizer, detokenize_stream
from v4serve.tokenizer import Tokenizer, default_tokenizer

REPLACEMENT = "\ufffd"
TEXTS = [
    "Streaming 中文字符和日本語のテキスト、한국어도 함께。",
    "emoji: 😀🚀👨‍👩‍👧‍👦🇯🇵 skin tones 👍🏿 done",
    "mixed <think>推理过程 🤔</think> final answer ✅",
    "math ∮ E·da = Q/ε₀, arrows ⇒ ⟹, box-drawing ┌─┐",
]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return default_tokenizer()


def random_chunks(ids: list[int], rng: random.Random) -> list[list[int]]:
    chunks, i = [], 0
    while i < len(ids):
        n = rng.choice([0, 1, 1, 1, 2, 3, 5])
        chunks.append(ids[i : i + n])
        i += n
    return chunks


@pytest.mark.parametrize("text", TEXTS)
def test_token_by_token_stream_of_cjk_and_emoji(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    deltas = detokenize_stream(tok, [[i] for i in ids])
    assert "".join(deltas) == text
    # characters split across byte-level tokens are held back, never sent as U+FFFD
    assert all(REPLACEMENT not in d for d in deltas)


def test_partial_character_is_held_until_complete(tok: Tokenizer) -> None:
    ids = tok.encode(" 😀")
    assert len(ids) >= 2  # the emoji's four bytes are split across tokens
    detok = IncrementalDetokenizer(tok)
    deltas = [detok.step([i]) for i in ids]
    assert "😀" not in "".join(deltas[:-1]) and deltas[-1].endswith("😀")
    assert detok.pending_bytes == 0 and detok.finish() == ""


@pytest.mark.parametrize("skip", [True, False])
def test_random_ids_match_full_decode(tok: Tokenizer, skip: bool) -> None:
    rng = random.Random(1234 + skip)
    special = sorted(tok.special_ids)[:40]
    pieces = [tok.encode(t) for t in TEXTS]
    # single-byte tokens make invalid and incomplete UTF-8 likely
    byte_tokens = [i for i in range(400) if len(tok.token_bytes(i)) == 1]
    for _ in range(300):
        ids: list[int] = []
        for _ in range(rng.randint(1, 20)):
            r = rng.random()
            if r < 0.3:
                ids.append(rng.randrange(tok.vocab_size))
            elif r < 0.55:
                ids.append(rng.choice(byte_tokens))
            elif r < 0.65:
                ids.append(rng.choice([*special, tok.think_start_id, tok.think_end_id]))
            else:
                ids.extend(rng.choice(pieces)[: rng.randint(1, 6)])
        deltas = detokenize_stream(tok, random_chunks(ids, rng), skip_special_tokens=skip)
        assert "".join(deltas) == tok.decode(ids, skip_special_tokens=skip)


def test_invalid_bytes_become_replacement_chars_like_decode(tok: Tokenizer) -> None:
    lone_continuation = next(i for i in range(1000) if tok.token_bytes(i) == b"\x80")
    ids = [*tok.encode("a"), lone_continuation, *tok.encode("b")]
    assert "".join(detokenize_stream(tok, [[i] for i in ids])) == tok.decode(ids) == "a\ufffdb"
    # a character cut off by the end of generation is flushed by finish(), as decode does
    cut = tok.encode(" 😀")[:-1]
    detok = IncrementalDetokenizer(tok)
    assert detok.step(cut) == " " and detok.finish() == REPLACEMENT == tok.decode(cut)[-1]


def test_special_tokens_skipped_or_kept(tok: Tokenizer) -> None:
    ids = [*tok.encode("<think>x</think>hi"), tok.eos_id]
    assert "".join(detokenize_stream(tok, [ids], skip_special_tokens=True)) == "<think>x</think>hi"
    kept = "".join(detokenize_stream(tok, [ids], skip_special_tokens=False))
    assert kept == "<think>x</think>hi<｜end▁of▁sentence｜>"


def test_state_stays_small_over_long_streams(tok: Tokenizer) -> None:
    # O(new tokens) per step: the only carried state is an unfinished character (<= 3 bytes)
    ids = tok.encode("长文本流式输出 🚀 " * 400)
    detok = IncrementalDetokenizer(tok)
    out = []
    for i in ids:
        out.append(detok.step([i]))
        assert detok.pending_bytes <= 3
    assert detok.num_tokens == len(ids) and "".join(out) == tok.decode(ids)
    assert detok.num_chars == len(tok.decode(ids))


def test_step_after_finish_is_an_error(tok: Tokenizer) -> None:
    detok = IncrementalDetokenizer(tok)
    detok.step(tok.encode("x"))
    detok.finish()
    with pytest.raises(RuntimeError):
        detok.step([5])
