"""The DeepSeek-V4 tokenizer wrapper: ids the engine relies on, round trips, loading and saving."""

from __future__ import annotations

import json

import pytest

from v4serve.tokenizer import Tokenizer, default_tokenizer

TEXTS = [
    "Hello, world! The quick brown fox jumps over 1234567 lazy dogs.",
    "你好，世界。DeepSeek 的分词器 handles mixed 文本 and ｶﾀｶﾅ.",
    "emoji 😀👍🏽🇯🇵 and combining é + ü, math ∑∫√, tabs\tand\n\nnewlines  ",
    "def f(x):\n    return {'a': [1, 2, 3]}  # code\n",
]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return default_tokenizer()


def test_deepseek_v4_token_ids(tok: Tokenizer) -> None:
    assert tok.vocab_size == 129280
    assert (tok.bos_id, tok.eos_id) == (0, 1)
    assert tok.id_to_token(tok.think_start_id) == "<think>"
    assert tok.id_to_token(tok.think_end_id) == "</think>"
    assert {0, 1, 2} <= tok.special_ids
    # chat-role and think tokens are added but not special: skip_special_tokens keeps them
    assert tok.think_start_id not in tok.special_ids
    assert tok.token_to_id("<｜User｜>") not in tok.special_ids


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_round_trip(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert ids and all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text


def test_special_token_strings_are_recognised_in_text(tok: Tokenizer) -> None:
    user, assistant = tok.token_to_id("<｜User｜>"), tok.token_to_id("<｜Assistant｜>")
    ids = tok.encode("<｜User｜>Hi<｜Assistant｜><think>ok</think>Hello<｜end▁of▁sentence｜>")
    assert ids[0] == user and assistant in ids and ids[-1] == tok.eos_id
    assert tok.think_start_id in ids and tok.think_end_id in ids


def test_add_bos_prepends_bos_only_when_asked(tok: Tokenizer) -> None:
    plain = tok.encode("hello")
    assert tok.encode("hello", add_bos=True) == [tok.bos_id, *plain]
    assert plain[0] != tok.bos_id
    assert tok.encode_batch(["hello", "你好"], add_bos=True) == [
        tok.encode("hello", add_bos=True),
        tok.encode("你好", add_bos=True),
    ]


def test_skip_special_tokens_drops_bos_eos_keeps_think(tok: Tokenizer) -> None:
    ids = [tok.bos_id, *tok.encode("<think>plan</think>answer"), tok.eos_id]
    assert tok.decode(ids, skip_special_tokens=True) == "<think>plan</think>answer"
    full = tok.decode(ids)
    assert full.startswith("<｜begin▁of▁sentence｜>") and full.endswith("<｜end▁of▁sentence｜>")


def test_token_lookup(tok: Tokenizer) -> None:
    assert tok.token_to_id("<｜end▁of▁sentence｜>") == 1
    assert tok.token_to_id("definitely-not-a-token-☃☃☃") is None
    for token_id in (0, 1, 100, 5000, 128821):
        assert tok.token_to_id(tok.id_to_token(token_id)) == token_id


def test_token_bytes_agree_with_decode(tok: Tokenizer) -> None:
    # the detokenizer streams from token_bytes; each token must decode as the tokenizer does
    for token_id in [*range(0, tok.vocab_size, 61), *sorted(tok.special_ids)[:50], 128821, 128803]:
        assert tok.token_bytes(token_id).decode("utf-8", errors="replace") == tok.decode([token_id])
    emoji = tok.encode(" 😀")
    assert b"".join(tok.token_bytes(i) for i in emoji) == " 😀".encode()


def test_folder_without_tokenizer_json_falls_back_to_package(tmp_path) -> None:
    loaded = Tokenizer.from_pretrained(tmp_path)
    assert loaded.vocab_size == 129280 and loaded.encode("hi") == default_tokenizer().encode("hi")


def test_package_tokenizer_is_loaded_once() -> None:
    assert default_tokenizer() is default_tokenizer()
    assert Tokenizer.from_pretrained().backend is Tokenizer.from_pretrained().backend


def test_save_writes_a_loadable_checkpoint_tokenizer(tok: Tokenizer, tmp_path) -> None:
    tok.save(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "tokenizer.json").is_file()
    config = json.loads((tmp_path / "ckpt" / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert "end▁of▁sentence" in json.dumps(config["eos_token"], ensure_ascii=False)
    loaded = Tokenizer.from_pretrained(tmp_path / "ckpt")
    assert loaded.backend is not tok.backend  # read from the checkpoint, not the package
    assert (loaded.bos_id, loaded.eos_id, loaded.vocab_size) == (tok.bos_id, tok.eos_id, tok.vocab_size)
    for text in TEXTS:
        assert loaded.encode(text) == tok.encode(text)
