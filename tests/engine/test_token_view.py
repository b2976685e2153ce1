"""Request.tokens: prompt + output read as one list without concatenating them on every step."""

from __future__ import annotations

import itertools

from v4serve.cache.prefix import block_hashes
from v4serve.engine.request import TokenView


def test_slices_and_items_equal_the_concatenation() -> None:
    head, tail = list(range(10)), list(range(100, 105))
    view, full = TokenView(head, tail), head + tail
    for a, b in itertools.product(range(-17, 18), repeat=2):
        assert view[a:b] == full[a:b], (a, b)
    for i in range(-15, 15):
        assert view[i] == full[i]
    assert view[::2] == full[::2] and len(view) == 15 and list(view) == full


def test_block_hashes_extend_only_new_blocks_and_equal_a_full_recompute() -> None:
    toks = list(range(1000))
    view = TokenView(toks[:700], toks[700:])
    whole = block_hashes(toks, 64, "salt")
    part = block_hashes(view, 64, "salt", limit=5)
    assert part == whole[:5]
    assert block_hashes(view, 64, "salt", part) == whole  # extended from the first five
