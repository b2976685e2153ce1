"""DeepSeek-V4.1 Engram hashing: layout facts of the release, hand-computed row ids, determinism, row counts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from v4serve.config import ConfigError
from v4serve.models.v41.engine_hooks import engram_history
from v4serve.models.v41.engram_hash import (
    EngramHasher,
    engram_layout,
    engram_row_counts,
    prev_ids_for_rows,
    token_map_from_file,
)
from v4serve.presets import get_preset

REAL = get_preset("v41-flash")


def sieve_primes_above(lo: int, count: int) -> list[int]:
    """Independent of the implementation: a plain sieve over a generous range."""
    hi = lo + 64 * count + 1000
    is_p = np.ones(hi + 1, dtype=bool)
    is_p[:2] = False
    for i in range(2, int(hi ** 0.5) + 1):
        if is_p[i]:
            is_p[i * i::i] = False
    return [int(p) for p in np.nonzero(is_p)[0] if p > lo][:count]


def test_release_layout_facts():
    """Row counts of the released config, and the public pins of its primes and multipliers."""
    assert engram_row_counts(REAL) == [384006168, 384016682]
    lay = engram_layout(REAL)
    assert lay.columns == 24
    assert lay.primes[0][:3] == (16000057, 16000079, 16000081)
    assert lay.primes[1][-3:] == (16000877, 16000879, 16000889)
    assert lay.offsets[1][0] == 0 and lay.offsets[1][-1] + lay.primes[1][-1] == 384016682
    assert lay.multipliers == ((76632096046245, 4839876093313, 35959672319349, 73987337458391),
                               (67716810739261, 51510806800915, 30921347202721, 82619226485591))


def test_row_counts_of_other_sizes_match_an_independent_computation():
    cfg = REAL.replace(engram_layers=(1, 3, 5), engram_vocab_size=5000, engram_n_heads=3, engram_max_ngram=3,
                       engram_num_embeddings=(0, 0, 0))
    per_layer = (cfg.engram_max_ngram - 1) * cfg.engram_n_heads
    primes = sieve_primes_above(cfg.engram_vocab_size - 1, per_layer * 3)
    want = [sum(primes[i * per_layer:(i + 1) * per_layer]) for i in range(3)]
    assert engram_row_counts(cfg) == want


def test_presets_carry_the_computed_row_counts():
    for name in ("tiny-v41-flash", "v41-flash", "v41-flash-e16-engram1m"):
        c = get_preset(name)
        assert list(c.engram_num_embeddings) == engram_row_counts(c), name


def test_wrong_row_counts_fail_at_build_naming_the_field():
    from v4serve.models.numerics import numerics_for
    from v4serve.models.v41.model import V41Model

    c = get_preset("tiny-v41-flash")
    bad = c.replace(engram_num_embeddings=(997, 1009))
    with pytest.raises(ConfigError, match="engram_num_embeddings"):
        V41Model(bad, numerics_for(bad))


def test_compressed_vocabulary_of_the_deepseek_tokenizer():
    tmap, n = token_map_from_file()
    assert n == 99092
    assert len(tmap) == 129280 and tmap.max() == n - 1
    assert tmap[2] == 2  # the pad token keeps its own class (specials are never merged)


def _hand_rows(layout, tmap: np.ndarray, pad_class: int, dead: int, seq: list[int], li: int) -> list[list[int]]:
    """Row ids of every position of `seq` for Engram layer li, with Python integers only."""
    n = layout.max_ngram
    mult, primes, offs = layout.multipliers[li], layout.primes[li], layout.offsets[li]
    out = []
    for p in range(len(seq)):
        toks, stopped = [], False
        for k in range(n):
            stopped = stopped or p - k < 0 or seq[p - k] == dead
            toks.append(pad_class if stopped else int(tmap[seq[p - k]]))
        rows, h = [], toks[0] * mult[0]
        for k in range(1, n):
            h ^= toks[k] * mult[k]
            for head in range(layout.n_heads):
                col = (k - 1) * layout.n_heads + head
                rows.append(h % primes[col] + offs[col])
        out.append(rows)
    return out


@pytest.fixture(scope="module")
def real_hasher() -> EngramHasher:
    return EngramHasher.from_tokenizer_file(REAL)


@pytest.mark.parametrize("seq", [
    [0, 100, 2000, 30000, 129279, 5, 5, 5],
    [17, 42, 129264, 7, 8, 9, 10],  # an image placeholder stops the look-back
    [2, 2, 2, 1],
])
def test_row_ids_match_hand_computation(real_hasher: EngramHasher, seq: list[int]):
    ids = torch.tensor(seq)
    prev = prev_ids_for_rows([seq], [0], [len(seq)], 3)
    got = real_hasher.row_ids(ids, prev)
    tmap, _ = token_map_from_file()
    for li in range(2):
        want = _hand_rows(real_hasher.layout, tmap, real_hasher.pad_class, REAL.image_token_id, seq, li)
        assert got[:, li].tolist() == want
        assert bool((got[:, li] < REAL.engram_num_embeddings[li]).all())
    assert real_hasher.live(ids).tolist() == [t != REAL.image_token_id for t in seq]


def test_hashing_is_deterministic_and_chunk_independent(real_hasher: EngramHasher):
    g = torch.Generator().manual_seed(3)
    seq = torch.randint(0, REAL.vocab_size, (50,), generator=g).tolist()
    again = EngramHasher.from_tokenizer_file(REAL)
    one = real_hasher.row_ids(torch.tensor(seq), prev_ids_for_rows([seq], [0], [50], 3))
    assert torch.equal(one, again.row_ids(torch.tensor(seq), prev_ids_for_rows([seq], [0], [50], 3)))
    # the same positions hashed as three chunks of one request (histories reach into earlier chunks)
    cuts = [(0, 7), (7, 1), (8, 42)]
    prev = engram_history(REAL, [seq] * 3, [s for s, _ in cuts], [n for _, n in cuts])
    parts = real_hasher.row_ids(torch.tensor(seq), prev)
    assert torch.equal(one, parts)
